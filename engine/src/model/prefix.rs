//! The backend side of the prefix cache (`crate::sched::prefix_cache`): a target or draft model
//! exports a sequence's K/V as shareable read-only blocks and snapshots, and starts a new sequence
//! from them. The scheduler owns the index (hash chain, reference counts, LRU); the backend only
//! owns the bytes, addressed by opaque [`CacheHandle`]s.
//!
//! Block `i` of a sequence is positions `i*B..(i+1)*B` (B = [`PrefixStore::block_size`]) of the
//! layers the backend pages (full attention). Everything else a sequence needs to continue at a
//! position `p` — the last `window - 1` keys of every sliding-window layer (a ring), the part of
//! block `p / B` already written — is a snapshot taken when the sequence holds exactly `p`
//! positions. `restore(seq, blocks[..p / B], snapshot, p)` rebuilds what the sequence held at `p`,
//! bit for bit, so a forward from `p` computes what it computed the first time.
use crate::error::Result;
use crate::model::SeqId;

/// Snapshots a store without a paged pool (a DFlash draft whose layers all keep a window) holds per
/// sequence slot in buffers of its own; they are reserved inside the K/V budget when the prefix
/// cache is on (`backend::LoadOptions::prefix_cache`, `laguna plan`).
pub const OWN_SNAPSHOTS_PER_SEQ: usize = 4;

/// A backend's handle to one exported block or snapshot (unique per store, never reused).
pub type CacheHandle = u64;

pub trait PrefixStore {
    /// Positions per block (the page size of the paged layers); the scheduler hashes prompts in
    /// blocks of this size. The target's and the draft's must agree.
    fn block_size(&self) -> usize;
    /// Whether continuing at a position needs a snapshot (some layer keeps a window, or the
    /// backend cannot rebuild a block-aligned state from blocks alone). When false, any block
    /// boundary is a resume point.
    fn needs_snapshot(&self) -> bool;
    /// Share block `index` of `seq` (all of its positions written and committed) read-only: the
    /// sequence keeps using it; the handle keeps it alive after the sequence is freed.
    fn export_block(&mut self, seq: SeqId, index: usize) -> Result<CacheHandle>;
    /// Snapshot what `seq` needs beyond its whole blocks to continue at its current length.
    fn export_snapshot(&mut self, seq: SeqId) -> Result<CacheHandle>;
    /// Make the empty sequence `seq` hold positions `0..pos`: `blocks` are its first `pos / B`
    /// blocks, `snapshot` (taken at `pos`, None only when `needs_snapshot` is false and `pos` is a
    /// block boundary) the rest.
    fn restore(
        &mut self,
        seq: SeqId,
        blocks: &[CacheHandle],
        snapshot: Option<CacheHandle>,
        pos: usize,
    ) -> Result<()>;
    /// Drop the store's hold on an exported block or snapshot.
    fn release(&mut self, handle: CacheHandle);
    /// Blocks of K/V memory free for new exports and writes (the pool's free pages).
    fn free_blocks(&self) -> usize;
    /// Pool blocks one export takes (0 when it shares the sequence's own page).
    fn block_cost(&self) -> usize;
    /// Pool blocks one snapshot takes.
    fn snapshot_cost(&self) -> usize;
    /// New pool blocks `seq` needs to hold `upto` positions (0 when writes do not draw on the
    /// pool the cache shares).
    fn blocks_for(&self, seq: SeqId, upto: usize) -> usize;
}
