//! The CUDA side of the prefix cache ([`PrefixStore`], docs/design/prefix-cache.md).
//!
//! * Blocks are the sequence's own pages of the full-attention pool, shared read-only: an export
//!   adds a holder to the page (`refs`), a restore puts the same page in the new sequence's block
//!   table, and a page returns to the free list when its last holder (sequence or handle) lets go
//!   (`release_page`, which `free_seq` and `truncate` call). No copy; block cost 0.
//! * A snapshot at `p` copies, device to device on the model's stream, the sequence's partial page
//!   `p / B` (every full layer's K and V) into a fresh pool page, and its ring slots (every ring
//!   layer's K and V, `R` = window + spec_k slots) into further pool pages, cut in page-sized
//!   pieces: snapshots live inside the K/V pool and its budget, and eviction frees them when the
//!   pool runs short. A model without full layers (a draft whose layers all have a window) has no
//!   pool: its snapshots get their own device buffers, at most `CudaOptions::own_snapshots` a
//!   sequence slot, reserved inside the K/V budget (`CudaDraft::ring_bytes`).
//! * Restore: the blocks' pages, a fresh page with the partial page's copy, the ring copied back
//!   into the new sequence's ring slots, and the length and ring bookkeeping of the snapshot.
use super::{cerr, ring, CudaModel};
use crate::error::{EngineError, Result};
use crate::model::prefix::{CacheHandle, PrefixStore};
use crate::model::SeqId;
use std::collections::HashMap;

enum Held {
    Block(u32),
    Snap {
        pos: usize,
        ring_hi: usize,
        /// Copy of the partial page (None when `pos` is a block boundary).
        tail: Option<u32>,
        /// Pool pages holding the ring's pieces, in `ring_pieces` order.
        ring_pages: Vec<u32>,
        /// Own buffer holding the ring (models without a pool).
        ring_buf: Option<u64>,
    },
}

#[derive(Default)]
pub(super) struct CudaPrefix {
    /// Holders of pages that were ever exported (pages not here have their sequence only).
    refs: HashMap<u32, u32>,
    held: HashMap<CacheHandle, Held>,
    next: CacheHandle,
    /// Own ring buffers allocated (models without a pool).
    bufs: usize,
}

impl CudaModel {
    /// One holder lets go of `page`; it is free once nobody holds it.
    pub(super) fn release_page(&mut self, page: u32) {
        match self.prefix.refs.get_mut(&page) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.prefix.refs.remove(&page);
                self.kv.free_pages.push(page);
            }
            None => self.kv.free_pages.push(page),
        }
    }

    fn hold_page(&mut self, page: u32) {
        *self.prefix.refs.entry(page).or_insert(1) += 1;
    }

    /// Bytes of one page of one layer's K (or V).
    fn piece(&self) -> usize {
        self.kv.page_size * self.cfg.num_kv_heads * self.cfg.head_dim * self.kv.elt
    }

    /// (address, bytes) of ring slot block `slot`'s K and V, layer by layer, cut in pieces of at
    /// most one page of one layer.
    fn ring_pieces(&self, slot: u32) -> Vec<(u64, usize)> {
        let per = self.kv.ring * self.cfg.num_kv_heads * self.cfg.head_dim * self.kv.elt;
        let piece = self.piece().max(1);
        let mut out = vec![];
        for l in self.w.layers.iter().filter(|l| l.ring) {
            for base in [l.kc, l.vc] {
                let start = base + (slot as usize * per) as u64;
                let mut off = 0;
                while off < per {
                    let n = piece.min(per - off);
                    out.push((start + off as u64, n));
                    off += n;
                }
            }
        }
        out
    }

    /// Addresses of the page-sized pieces of these pool pages, in the order `ring_pieces` fills.
    fn page_pieces(&self, pages: &[u32]) -> Vec<u64> {
        let piece = self.piece() as u64;
        let mut out = vec![];
        for &p in pages {
            for l in self.w.layers.iter().filter(|l| !l.ring) {
                out.push(l.kc + p as u64 * piece);
                out.push(l.vc + p as u64 * piece);
            }
        }
        out
    }

    /// Pool pages one ring copy takes.
    fn ring_page_count(&self) -> usize {
        if self.kv.ring == 0 || self.kv.full_layers == 0 {
            return 0;
        }
        let per_page = 2 * self.kv.full_layers;
        self.ring_pieces(0).len().div_ceil(per_page)
    }

    /// Copy every full layer's K and V of page `from` into page `to`.
    fn copy_page(&self, from: u32, to: u32) -> Result<()> {
        let piece = self.piece() as u64;
        for l in self.w.layers.iter().filter(|l| !l.ring) {
            for base in [l.kc, l.vc] {
                self.dev
                    .dtod(
                        base + to as u64 * piece,
                        base + from as u64 * piece,
                        piece as usize,
                    )
                    .map_err(cerr)?;
            }
        }
        Ok(())
    }

    fn snap_ring(&mut self, slot: u32) -> Result<(Vec<u32>, Option<u64>)> {
        let src = self.ring_pieces(slot);
        if self.kv.full_layers == 0 {
            if self.prefix.bufs >= self.opts.own_snapshots * self.opts.max_seqs.max(1) {
                return Err(EngineError::Request(
                    "no room for another ring snapshot".into(),
                ));
            }
            let bytes: usize = src.iter().map(|p| p.1).sum();
            let buf = self.dev.alloc(bytes.max(16)).map_err(cerr)?;
            self.prefix.bufs += 1;
            let mut off = 0u64;
            for (a, n) in src {
                self.dev.dtod(buf + off, a, n).map_err(cerr)?;
                off += n as u64;
            }
            return Ok((vec![], Some(buf)));
        }
        let pages = self.kv.take_pages(self.ring_page_count())?;
        for ((a, n), d) in src.into_iter().zip(self.page_pieces(&pages)) {
            self.dev.dtod(d, a, n).map_err(cerr)?;
        }
        Ok((pages, None))
    }

    fn unsnap_ring(&self, slot: u32, pages: &[u32], buf: Option<u64>) -> Result<()> {
        let dst = self.ring_pieces(slot);
        match buf {
            Some(b) => {
                let mut off = 0u64;
                for (a, n) in dst {
                    self.dev.dtod(a, b + off, n).map_err(cerr)?;
                    off += n as u64;
                }
            }
            None => {
                for ((a, n), s) in dst.into_iter().zip(self.page_pieces(pages)) {
                    self.dev.dtod(a, s, n).map_err(cerr)?;
                }
            }
        }
        Ok(())
    }

    fn hold(&mut self, h: Held) -> CacheHandle {
        self.prefix.next += 1;
        self.prefix.held.insert(self.prefix.next, h);
        self.prefix.next
    }
}

impl PrefixStore for CudaModel {
    fn block_size(&self) -> usize {
        self.kv.page_size
    }
    fn needs_snapshot(&self) -> bool {
        self.kv.ring > 0
    }
    fn export_block(&mut self, seq: SeqId, index: usize) -> Result<CacheHandle> {
        let s = self
            .kv
            .seqs
            .get(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))?;
        if self.kv.full_layers == 0 {
            // Nothing is paged: the block is empty (its positions live in rings only).
            return Ok(self.hold(Held::Block(u32::MAX)));
        }
        if (index + 1) * self.kv.page_size > s.len || index >= s.pages.len() {
            return Err(EngineError::Other(format!(
                "block {index} of sequence {seq} is not written yet ({} positions)",
                s.len
            )));
        }
        let page = s.pages[index];
        self.hold_page(page);
        Ok(self.hold(Held::Block(page)))
    }
    fn export_snapshot(&mut self, seq: SeqId) -> Result<CacheHandle> {
        let s = self
            .kv
            .seqs
            .get(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))?;
        let (pos, ring_hi, slot) = (s.len, s.ring_hi, s.ring);
        let partial = (self.kv.full_layers > 0 && pos % self.kv.page_size != 0)
            .then(|| s.pages.get(pos / self.kv.page_size).copied())
            .flatten();
        if self.kv.ring > 0
            && !ring::ring_can_continue(pos, ring_hi, self.kv.ring, self.kv.ring_window)
        {
            return Err(EngineError::Other(format!(
                "sequence {seq}'s ring no longer holds the keys of position {pos}"
            )));
        }
        let tail = match partial {
            Some(from) => {
                let to = self.kv.take_pages(1)?[0];
                if let Err(e) = self.copy_page(from, to) {
                    self.kv.free_pages.push(to);
                    return Err(e);
                }
                Some(to)
            }
            None => None,
        };
        let (ring_pages, ring_buf) = match slot {
            Some(r) if self.kv.ring > 0 => match self.snap_ring(r) {
                Ok(x) => x,
                Err(e) => {
                    self.kv.free_pages.extend(tail);
                    return Err(e);
                }
            },
            _ => (vec![], None),
        };
        Ok(self.hold(Held::Snap {
            pos,
            ring_hi,
            tail,
            ring_pages,
            ring_buf,
        }))
    }
    fn restore(
        &mut self,
        seq: SeqId,
        blocks: &[CacheHandle],
        snapshot: Option<CacheHandle>,
        pos: usize,
    ) -> Result<()> {
        let ps = self.kv.page_size;
        let mut pages = vec![];
        for h in blocks {
            match self.prefix.held.get(h) {
                Some(Held::Block(p)) => pages.push(*p),
                _ => return Err(EngineError::Other(format!("no cached block {h}"))),
            }
        }
        if blocks.len() != pos / ps
            || (snapshot.is_none() && (!pos.is_multiple_of(ps) || self.kv.ring > 0))
        {
            return Err(EngineError::Other(format!(
                "restore at {pos}: {} blocks of {ps} do not rebuild it",
                blocks.len()
            )));
        }
        let (ring_hi, tail, ring) = match snapshot {
            Some(h) => match self.prefix.held.get(&h) {
                Some(Held::Snap {
                    pos: at,
                    ring_hi,
                    tail,
                    ring_pages,
                    ring_buf,
                }) if *at == pos => (*ring_hi, *tail, Some((ring_pages.clone(), *ring_buf))),
                _ => return Err(EngineError::Other(format!("no snapshot {h} at {pos}"))),
            },
            None => (pos, None, None),
        };
        let slot = match self.kv.seqs.get(&seq) {
            Some(s) if s.len == 0 && s.pages.is_empty() => s.ring,
            _ => return Err(EngineError::Other(format!("sequence {seq} is not empty"))),
        };
        if self.kv.full_layers > 0 {
            if pages.len() > self.kv.max_pages {
                return Err(EngineError::Request(
                    "the prefix exceeds the K/V plan".into(),
                ));
            }
            let own = match tail {
                Some(t) => {
                    let p = self.kv.take_pages(1)?[0];
                    if let Err(e) = self.copy_page(t, p) {
                        self.kv.free_pages.push(p);
                        return Err(e);
                    }
                    Some(p)
                }
                None => None,
            };
            for &p in &pages {
                self.hold_page(p);
            }
            pages.extend(own);
        } else {
            pages.clear();
        }
        if let (Some((rp, rb)), Some(r)) = (&ring, slot) {
            self.unsnap_ring(r, rp, *rb)?;
        }
        let s = self.kv.seqs.get_mut(&seq).expect("checked");
        s.pages = pages;
        s.len = pos;
        s.ring_hi = ring_hi;
        *self.dec.fed.borrow_mut() = None;
        Ok(())
    }
    fn release(&mut self, handle: CacheHandle) {
        match self.prefix.held.remove(&handle) {
            Some(Held::Block(p)) if p != u32::MAX => self.release_page(p),
            Some(Held::Snap {
                tail,
                ring_pages,
                ring_buf,
                ..
            }) => {
                self.kv.free_pages.extend(tail);
                self.kv.free_pages.extend(ring_pages);
                if let Some(b) = ring_buf {
                    self.dev.free(b);
                    self.prefix.bufs -= 1;
                }
            }
            _ => {}
        }
    }
    fn free_blocks(&self) -> usize {
        if self.kv.full_layers == 0 {
            self.opts.own_snapshots * self.opts.max_seqs.max(1) - self.prefix.bufs
        } else {
            self.kv.free_pages.len()
        }
    }
    fn block_cost(&self) -> usize {
        0
    }
    fn snapshot_cost(&self) -> usize {
        if self.kv.full_layers == 0 {
            1
        } else {
            self.ring_page_count() + 1
        }
    }
    fn blocks_for(&self, seq: SeqId, upto: usize) -> usize {
        if self.kv.full_layers == 0 {
            return 0;
        }
        let have = self.kv.seqs.get(&seq).map_or(0, |s| s.pages.len());
        upto.div_ceil(self.kv.page_size).saturating_sub(have)
    }
}
