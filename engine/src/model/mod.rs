//! The engine ↔ backend seam: a Laguna target model that runs batches of token rows for
//! sequences whose KV it owns. The CPU backend is the reference; the CUDA backend must agree.
pub mod device;
pub mod prefix;
pub mod schema;

use crate::config::LagunaConfig;
use crate::error::Result;

pub type SeqId = u64;

/// Which rows' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
}

/// One sequence's rows in a batch: `tokens` at positions `start_pos..start_pos+len`.
/// `start_pos` must equal the sequence's current KV length.
#[derive(Debug, Clone)]
pub struct StepInput<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub logits: LogitRows,
}

/// One sequence of a `Model::decode_step`.
#[derive(Debug, Clone)]
pub struct DecodeItem<'a> {
    pub seq: SeqId,
    pub token: u32,
    pub params: &'a crate::sample::SamplingParams,
    /// `Rng::uniform()` drawn by the caller (only consumed for non-greedy params).
    pub u: f64,
    /// `decode_launch` only: feed the token that row `j` of the previously launched step drew
    /// (still on the device, not yet collected) instead of `token`.
    pub prev: Option<usize>,
}

#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Row-major `[rows, vocab]` for the rows asked for.
    pub logits: Vec<f32>,
    pub rows: usize,
    /// Residual stream (pre final norm) after each tap layer, row-major `[len, taps * hidden]`,
    /// for every input row; empty when no taps are set.
    pub taps: Vec<f32>,
}

impl StepOutput {
    pub fn row(&self, i: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.max(1);
        &self.logits[i * v..(i + 1) * v]
    }
}

pub trait Model: Send {
    fn config(&self) -> &LagunaConfig;
    /// Short name of the backend ("cpu", "cuda").
    fn device(&self) -> &str;
    fn new_seq(&mut self) -> Result<SeqId>;
    fn free_seq(&mut self, seq: SeqId);
    /// Number of positions whose K/V the sequence holds.
    fn seq_len(&self, seq: SeqId) -> usize;
    /// Drop K/V at positions >= len (rejected speculative rows).
    fn truncate(&mut self, seq: SeqId, len: usize);
    /// Capture the residual after these 0-based target layers (ascending), for DFlash.
    fn set_taps(&mut self, layers: &[usize]);
    fn forward(&mut self, batch: &[StepInput]) -> Result<Vec<StepOutput>>;
    /// How many sequences one `decode_step` may carry (0: this backend samples on the host only,
    /// through `forward` and `crate::sample::sample`).
    fn device_sampling(&self) -> usize {
        0
    }
    /// One decode step for sequences that each feed one token at their current length, the next
    /// token of each drawn on the backend from the step's logits with the item's parameters and
    /// the uniform `u` the host's `Rng` drew for it (greedy items ignore `u`): the same choice
    /// `crate::sample::sample` makes on those logits. Only when `device_sampling()` >= items.
    fn decode_step(&mut self, items: &[DecodeItem]) -> Result<Vec<u32>> {
        let _ = items;
        Err(crate::error::EngineError::Other(
            "this backend does not sample on the device".into(),
        ))
    }
    /// Whether `decode_launch` / `decode_collect` run decode steps ahead of the host: a step is
    /// queued before the previous one's tokens are read back, its items taking those tokens on
    /// the device (`DecodeItem::prev`), so the device does not wait on the host between steps.
    fn decode_pipelined(&self) -> bool {
        false
    }
    /// Queue a `decode_step` (same items, same choices) without waiting for its tokens; items
    /// with `prev = Some(j)` feed the token of row j of the step launched just before this one.
    /// Only when `decode_pipelined()`.
    fn decode_launch(&mut self, items: &[DecodeItem]) -> Result<()> {
        let _ = items;
        Err(crate::error::EngineError::Other(
            "this backend does not pipeline decode steps".into(),
        ))
    }
    /// The tokens of the oldest launched step not yet collected (one per item, in order).
    fn decode_collect(&mut self) -> Result<Vec<u32>> {
        Err(crate::error::EngineError::Other(
            "this backend does not pipeline decode steps".into(),
        ))
    }
    /// The concrete backend, for drafts that fuse whole speculative steps with their own target
    /// type (the CUDA draft); None by default.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
    /// The backend's side of the prefix cache (export / restore K/V blocks and snapshots); None
    /// when this backend does not support it (the scheduler then runs without the cache).
    fn prefix_store(&mut self) -> Option<&mut dyn prefix::PrefixStore> {
        None
    }
}
