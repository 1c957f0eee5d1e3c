//! The engine ↔ backend seam: a Laguna target model that runs batches of token rows for
//! sequences whose KV it owns. The CPU backend is the reference; the CUDA backend must agree.
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
    /// The concrete backend, for drafts that fuse whole speculative steps with their own target
    /// type (the CUDA draft); None by default.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}
