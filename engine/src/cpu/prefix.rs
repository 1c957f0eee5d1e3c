//! CPU storage of the prefix cache: the per-sequence K/V of a CPU model (target or DFlash draft)
//! and the blocks and snapshots exported from it ([`PrefixStore`]).
//!
//! The CPU keeps every position of every layer in flat per-sequence vectors, so it could rebuild
//! any prefix from blocks alone. It does not: it mirrors the CUDA layout so the scheduler's logic
//! is tested against the reference. Blocks hold only the full-attention layers (the CUDA paged
//! pool); a snapshot at `p` holds the keys a windowed layer still sees from `p` on (positions
//! `p + 1 - window .. p`, the CUDA ring) and the full layers' partial block `p / B * B .. p`.
//! `restore` fills every other windowed position with NaN, so a wrong resume point shows up as
//! NaN logits instead of passing unnoticed. Exports are copies (the CPU does not share memory
//! between sequences). The budget counts blocks of the full layers' bytes: a block export costs
//! one, a snapshot what its largest form takes in such blocks (`snapshot_cost`), so a byte budget
//! (`set_budget_bytes`, from `--kv-cache-memory-bytes`) bounds what the cache holds.
use super::model::SeqKv;
use crate::error::{EngineError, Result};
use crate::model::prefix::{CacheHandle, PrefixStore};
use crate::model::SeqId;
use std::collections::HashMap;

/// Default positions per block (vLLM's default block size).
pub const DEFAULT_BLOCK: usize = 16;

enum Held {
    /// Per full layer, `block * row` K and V values.
    Block { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
    /// Taken at `pos`: per layer, positions `from[l]..pos`.
    Snap {
        pos: usize,
        from: Vec<usize>,
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    },
}

/// Per-sequence K/V of a CPU model plus its exported blocks and snapshots.
pub struct CpuKv {
    pub seqs: HashMap<SeqId, SeqKv>,
    /// Per layer: the sliding window, None for full attention.
    windows: Vec<Option<usize>>,
    /// Values per position of one layer's K (or V): kv_heads x head_dim.
    row: usize,
    block: usize,
    /// Blocks the exports may hold in all.
    budget: usize,
    held_blocks: usize,
    /// Each handle with the blocks it counts.
    held: HashMap<CacheHandle, (Held, usize)>,
    next_handle: CacheHandle,
}

impl CpuKv {
    pub fn new(windows: Vec<Option<usize>>, row: usize) -> CpuKv {
        CpuKv {
            seqs: HashMap::new(),
            windows,
            row,
            block: DEFAULT_BLOCK,
            budget: 1 << 20,
            held_blocks: 0,
            held: HashMap::new(),
            next_handle: 1,
        }
    }

    /// Positions per block (before any export).
    pub fn set_block_size(&mut self, block: usize) {
        self.block = block.max(1);
    }

    /// Most blocks the exported blocks and snapshots may hold (see `snapshot_cost`).
    pub fn set_budget(&mut self, blocks: usize) {
        self.budget = blocks;
    }

    /// The budget as bytes of exported K/V (f32 K and V).
    pub fn set_budget_bytes(&mut self, bytes: usize) {
        self.budget = bytes / self.unit_bytes();
    }

    /// Bytes one budget block stands for: a block of every full layer's K and V (a block of one
    /// layer's when every layer keeps a window).
    fn unit_bytes(&self) -> usize {
        let full = self.windows.iter().filter(|w| w.is_none()).count();
        (full.max(1) * self.block * self.row * 2 * 4).max(1)
    }

    /// First position a windowed layer still sees from `pos` on (None: full attention).
    fn window_from(w: Option<usize>, pos: usize) -> Option<usize> {
        w.map(|w| (pos + 1).saturating_sub(w))
    }

    fn seq(&self, seq: SeqId) -> Result<&SeqKv> {
        self.seqs
            .get(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))
    }

    fn hold(&mut self, h: Held, cost: usize) -> CacheHandle {
        let id = self.next_handle;
        self.next_handle += 1;
        self.held.insert(id, (h, cost));
        self.held_blocks += cost;
        id
    }
}

impl PrefixStore for CpuKv {
    fn block_size(&self) -> usize {
        self.block
    }
    fn needs_snapshot(&self) -> bool {
        self.windows.iter().any(|w| w.is_some())
    }
    fn export_block(&mut self, seq: SeqId, index: usize) -> Result<CacheHandle> {
        let (b, row) = (self.block, self.row);
        let s = self.seq(seq)?;
        if (index + 1) * b > s.len {
            return Err(EngineError::Other(format!(
                "block {index} of sequence {seq} is not written yet ({} positions)",
                s.len
            )));
        }
        let r = index * b * row..(index + 1) * b * row;
        let full = self.windows.iter().enumerate().filter(|(_, w)| w.is_none());
        let (k, v) = full
            .map(|(l, _)| (s.k[l][r.clone()].to_vec(), s.v[l][r.clone()].to_vec()))
            .unzip();
        let cost = self.block_cost();
        Ok(self.hold(Held::Block { k, v }, cost))
    }
    fn export_snapshot(&mut self, seq: SeqId) -> Result<CacheHandle> {
        let (b, row) = (self.block, self.row);
        let s = self.seq(seq)?;
        let pos = s.len;
        let from: Vec<usize> = self
            .windows
            .iter()
            .map(|&w| Self::window_from(w, pos).unwrap_or(pos / b * b))
            .collect();
        let mut k = Vec::with_capacity(from.len());
        let mut v = Vec::with_capacity(from.len());
        for (l, &f) in from.iter().enumerate() {
            let (kl, vl) = match (s.k.get(l), s.v.get(l)) {
                (Some(kl), Some(vl)) => (&kl[f * row..pos * row], &vl[f * row..pos * row]),
                _ => (&[][..], &[][..]),
            };
            k.push(kl.to_vec());
            v.push(vl.to_vec());
        }
        let cost = self.snapshot_cost();
        Ok(self.hold(Held::Snap { pos, from, k, v }, cost))
    }
    fn restore(
        &mut self,
        seq: SeqId,
        blocks: &[CacheHandle],
        snapshot: Option<CacheHandle>,
        pos: usize,
    ) -> Result<()> {
        let (b, row, nl) = (self.block, self.row, self.windows.len());
        if blocks.len() != pos / b
            || (snapshot.is_none() && (!pos.is_multiple_of(b) || self.needs_snapshot()))
        {
            return Err(EngineError::Other(format!(
                "restore at {pos}: {} blocks of {b} and {} snapshot do not rebuild it",
                blocks.len(),
                if snapshot.is_some() { "a" } else { "no" }
            )));
        }
        let mut kv = SeqKv::with_layers(nl);
        // Windowed layers: NaN where no later row looks.
        for (l, w) in self.windows.iter().enumerate() {
            if w.is_some() {
                kv.k[l] = vec![f32::NAN; pos * row];
                kv.v[l] = vec![f32::NAN; pos * row];
            }
        }
        let full: Vec<usize> = (0..nl).filter(|&l| self.windows[l].is_none()).collect();
        for h in blocks {
            let Some((Held::Block { k, v }, _)) = self.held.get(h) else {
                return Err(EngineError::Other(format!("no cached block {h}")));
            };
            for (i, &l) in full.iter().enumerate() {
                kv.k[l].extend_from_slice(&k[i]);
                kv.v[l].extend_from_slice(&v[i]);
            }
        }
        if let Some(h) = snapshot {
            let Some((
                Held::Snap {
                    pos: at,
                    from,
                    k,
                    v,
                },
                _,
            )) = self.held.get(&h)
            else {
                return Err(EngineError::Other(format!("no cached snapshot {h}")));
            };
            if *at != pos {
                return Err(EngineError::Other(format!(
                    "snapshot taken at {at} restored at {pos}"
                )));
            }
            for l in 0..nl {
                let f = from[l] * row;
                if self.windows[l].is_some() {
                    kv.k[l][f..].copy_from_slice(&k[l]);
                    kv.v[l][f..].copy_from_slice(&v[l]);
                } else {
                    kv.k[l].extend_from_slice(&k[l]);
                    kv.v[l].extend_from_slice(&v[l]);
                }
            }
        }
        kv.len = pos;
        let slot = self
            .seqs
            .get_mut(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))?;
        if slot.len != 0 {
            return Err(EngineError::Other(format!(
                "restore into sequence {seq}, which already holds {} positions",
                slot.len
            )));
        }
        *slot = kv;
        Ok(())
    }
    fn release(&mut self, handle: CacheHandle) {
        if let Some((_, cost)) = self.held.remove(&handle) {
            self.held_blocks -= cost;
        }
    }
    fn free_blocks(&self) -> usize {
        self.budget.saturating_sub(self.held_blocks)
    }
    fn block_cost(&self) -> usize {
        usize::from(self.windows.iter().any(|w| w.is_none()))
    }
    /// The largest snapshot (every window's last `window - 1` keys, every full layer's partial
    /// block) in budget blocks, at least one.
    fn snapshot_cost(&self) -> usize {
        let rows: usize = self
            .windows
            .iter()
            .map(|w| w.map_or(self.block - 1, |w| w.saturating_sub(1)))
            .sum();
        (rows * self.row * 2 * 4).div_ceil(self.unit_bytes()).max(1)
    }
    fn blocks_for(&self, _seq: SeqId, _upto: usize) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two full layers and two with a window of 8, rows of 32 values, blocks of 4 positions.
    fn kv_with_seq(len: usize) -> CpuKv {
        let mut kv = CpuKv::new(vec![None, Some(8), None, Some(8)], 32);
        kv.set_block_size(4);
        let mut s = SeqKv::with_layers(4);
        for l in 0..4 {
            s.k[l] = (0..len * 32).map(|i| i as f32).collect();
            s.v[l] = s.k[l].clone();
        }
        s.len = len;
        kv.seqs.insert(1, s);
        kv
    }

    #[test]
    fn the_budget_counts_bytes() {
        let mut kv = kv_with_seq(13);
        // A budget block: 2 full layers x 4 positions x 32 values x K,V x 4 bytes = 2048 bytes.
        kv.set_budget_bytes(10_000);
        assert_eq!(kv.free_blocks(), 4);
        assert_eq!(kv.block_cost(), 1);
        // The largest snapshot: 3 + 7 + 3 + 7 positions x 32 x 2 x 4 = 5120 bytes: 3 blocks.
        assert_eq!(kv.snapshot_cost(), 3);
        let s = kv.export_snapshot(1).unwrap();
        assert_eq!(kv.free_blocks(), 1);
        let b = kv.export_block(1, 0).unwrap();
        assert_eq!(kv.free_blocks(), 0);
        kv.release(s);
        kv.release(b);
        assert_eq!(kv.free_blocks(), 4);
    }

    #[test]
    fn windowed_only_blocks_are_free() {
        let mut kv = CpuKv::new(vec![Some(8), Some(8)], 32);
        kv.set_block_size(4);
        // A budget block is then one layer's block: 4 x 32 x 2 x 4 = 1024 bytes.
        kv.set_budget_bytes(4096);
        assert_eq!(kv.block_cost(), 0);
        // 7 + 7 positions x 32 x 2 x 4 = 3584 bytes: 4 blocks.
        assert_eq!(kv.snapshot_cost(), 4);
    }
}
