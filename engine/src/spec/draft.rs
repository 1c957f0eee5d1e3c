//! The draft ↔ backend seam. A DFlash draft owns a per-sequence KV cache holding *context* K/V
//! (projected from target taps) for committed positions only; the query block's own K/V are
//! transient. The CPU implementation ([`super::cpu_draft::CpuDraft`]) is the reference; a CUDA draft
//! implements the same trait and is driven by the same [`super::driver`].
use super::config::DraftConfig;
use super::driver::{SpecState, StepResult};
use crate::error::{EngineError, Result};
use crate::model::{Model, SeqId, StepOutput};

/// Context rows of one sequence: target taps for committed tokens at positions
/// `start_pos..start_pos+n`, row-major `[n, num_taps * target_hidden]` (the layout of
/// [`StepOutput::taps`]). `start_pos` must be <= the sequence's context length; rows at and above
/// `start_pos` are replaced (that is how rejected rows never leave a trace).
#[derive(Debug, Clone)]
pub struct ContextInput<'a> {
    pub seq: SeqId,
    pub start_pos: usize,
    pub taps: &'a [f32],
}

impl ContextInput<'_> {
    /// Rows this write carries (`taps` / `width`, `width` = num_taps x target hidden), checked
    /// against the draft sequence's context length `len` (None: the sequence is unknown): the
    /// taps must be whole rows and the write must not leave a gap. Shared by every backend.
    pub fn rows(&self, width: usize, len: Option<usize>) -> Result<usize> {
        if self.taps.len() % width != 0 {
            return Err(EngineError::Other(format!(
                "draft context: taps have {} values, not a multiple of num_taps x target hidden = {width} (did the target run with set_taps?)",
                self.taps.len()
            )));
        }
        let len =
            len.ok_or_else(|| EngineError::Other(format!("unknown draft sequence {}", self.seq)))?;
        if self.start_pos > len {
            return Err(EngineError::Other(format!(
                "draft context write at position {} leaves a gap (the context holds {len} positions)",
                self.start_pos
            )));
        }
        Ok(self.taps.len() / width)
    }
}

/// One query block: `tokens = [last committed token, mask x k]` at positions
/// `start_pos..start_pos+1+k`; `start_pos` must equal the sequence's context length.
#[derive(Debug, Clone)]
pub struct BlockInput<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub start_pos: usize,
}

pub trait DraftModel: Send {
    fn config(&self) -> &DraftConfig;
    fn device(&self) -> &str;
    fn new_seq(&mut self) -> Result<SeqId>;
    fn free_seq(&mut self, seq: SeqId);
    /// Number of positions whose context K/V the sequence holds.
    fn context_len(&self, seq: SeqId) -> usize;
    /// Drop context K/V at positions >= len.
    fn truncate(&mut self, seq: SeqId, len: usize);
    /// Fuse taps (aux norms, fc, hidden_norm) and write every layer's context K/V
    /// (input_layernorm, k/v rows of qkv_proj, k_norm, RoPE at the absolute position).
    fn write_context(&mut self, batch: &[ContextInput]) -> Result<()>;
    /// One draft forward per block; returns logits for every block row (`rows = 1 + k`);
    /// row j (j >= 1) proposes the token at position `start_pos + j`. Leaves the cache unchanged.
    fn propose(&mut self, batch: &[BlockInput]) -> Result<Vec<StepOutput>>;
    /// Run one whole greedy step (propose, verify, accept, context) for these prefilled states
    /// on the backend's own device, with the same semantics as [`super::driver::step`]: commit the
    /// emitted tokens into each state and return what `step` would. None when this draft cannot
    /// for this target or batch (the driver then runs the generic step). Default: None.
    fn fused_greedy_step(
        &mut self,
        _target: &mut dyn Model,
        _states: &mut [&mut SpecState],
    ) -> Option<Result<Vec<StepResult>>> {
        None
    }
    /// The draft's side of the prefix cache: its context K/V as blocks and snapshots, like the
    /// target's ([`crate::model::Model::prefix_store`]). None: no prefix cache with this draft.
    fn prefix_store(&mut self) -> Option<&mut dyn crate::model::prefix::PrefixStore> {
        None
    }
}
