//! The host side of the K/V cache: the paged pool of the full-attention layers, the
//! sliding-window rings, and which pages and ring each live sequence holds (the device buffers
//! are the layers' `kc` / `vc`; their layout is `ring`'s arithmetic, docs/design/kv-cache.md).
use super::ring;
use crate::error::{EngineError, Result};
use crate::model::SeqId;
use std::collections::HashMap;

pub(super) struct SeqState {
    pub(super) len: usize,
    pub(super) pages: Vec<u32>,
    /// Ring slot block (rings on).
    pub(super) ring: Option<u32>,
    /// End of the highest position ever written: the ring holds [ring_hi - R, ring_hi).
    pub(super) ring_hi: usize,
}

/// The K/V pool and the sequences that hold parts of it.
pub(super) struct KvPool {
    /// Positions per page.
    pub(super) page_size: usize,
    pub(super) num_pages: usize,
    /// Pages one sequence may hold (its block-table row).
    pub(super) max_pages: usize,
    pub(super) free_pages: Vec<u32>,
    /// Ring slots per sequence (window + spec_k; 0 when no layer has a ring) and the window.
    pub(super) ring: usize,
    pub(super) ring_window: usize,
    pub(super) free_rings: Vec<u32>,
    /// Layers on the paged pool.
    pub(super) full_layers: usize,
    /// Bytes per cached K (or V) element: 2 (BF16) or 1 (FP8).
    pub(super) elt: usize,
    pub(super) seqs: HashMap<SeqId, SeqState>,
    pub(super) next_id: SeqId,
}

impl KvPool {
    /// A sequence may continue at `start` only if its ring still holds every key the row at
    /// `start` sees: rewinding further than the ring's spare slots loses them.
    pub(super) fn check_ring(&self, seq: SeqId, start: usize) -> Result<()> {
        let Some(s) = self.seqs.get(&seq) else {
            return Err(EngineError::Other(format!("unknown sequence {seq}")));
        };
        if self.ring == 0 {
            return Ok(());
        }
        if !ring::ring_can_continue(start, s.ring_hi, self.ring, self.ring_window) {
            return Err(EngineError::Request(format!(
                "sequence {seq} continues at position {start} after writing up to {}: a sliding-window ring keeps only {} positions beyond the window, so it cannot be rewound this far; prefill it again",
                s.ring_hi,
                self.ring - self.ring_window
            )));
        }
        Ok(())
    }

    /// Record that positions up to `end` were written (ring bookkeeping).
    pub(super) fn note_written(&mut self, seq: SeqId, end: usize) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.ring_hi = s.ring_hi.max(end);
        }
    }

    /// A sequence's block-table row: its pages, 0 past them.
    pub(super) fn bt_row(&self, seq: SeqId) -> Vec<i32> {
        let mut row = vec![0i32; self.max_pages];
        if let Some(s) = self.seqs.get(&seq) {
            for (i, &p) in s.pages.iter().enumerate() {
                row[i] = p as i32;
            }
        }
        row
    }

    /// Slot ids of a sequence's ring, in position order (position p uses entry p % R).
    pub(super) fn ring_row(&self, seq: SeqId) -> Vec<i32> {
        let base = self.seqs.get(&seq).and_then(|s| s.ring).unwrap_or(0) as usize * self.ring;
        (0..self.ring).map(|i| (base + i) as i32).collect()
    }

    /// `n` free pages off the free list (for a snapshot), or an error when fewer are free.
    pub(super) fn take_pages(&mut self, n: usize) -> Result<Vec<u32>> {
        if self.free_pages.len() < n {
            return Err(EngineError::Request(format!(
                "the K/V pool has {} free pages, a snapshot needs {n}",
                self.free_pages.len()
            )));
        }
        let at = self.free_pages.len() - n;
        Ok(self.free_pages.split_off(at))
    }
}
