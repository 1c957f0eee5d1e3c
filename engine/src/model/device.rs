//! What the benches (`laguna bench`) and the device checks (`laguna-dev device-test`) ask of a
//! device backend beyond [`Model`] and [`DraftModel`]: what it loaded and how, graph replay,
//! per-kernel profiles, the device sampler on given logits, a DFlash draft on the same device and
//! the device-resident greedy DFlash loop over whole requests. The CUDA backend implements both
//! traits; [`crate::backend::Loaded::device`] hands out the target's (None on the CPU reference,
//! which has none of this), so the tools never name a backend type.
use crate::error::Result;
use crate::generate::{FinishReason, GenerateRequest};
use crate::model::{Model, SeqId};
use crate::sample::SamplingParams;
use crate::spec::{DraftModel, SpecStats};
use std::path::Path;

/// One kernel's line of a profile: (name, total ms, launches).
pub type KernelTime = (String, f64, usize);

/// What a device model is and holds, fixed at load.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The device's name and kernel architecture (e.g. `sm_90a`).
    pub name: String,
    pub arch: String,
    /// Bytes of weights on the device.
    pub weight_bytes: usize,
    /// Bytes one single-row decode step reads from weights (active experts only).
    pub decode_weight_bytes: usize,
    /// Seconds the load took.
    pub load_secs: f64,
    /// K/V stored as FP8 E4M3.
    pub kv_fp8: bool,
    /// Positions one sequence can hold.
    pub kv_capacity: usize,
    /// The full-attention layers' paged pool: (pages, positions a page, bytes).
    pub kv_pool: (usize, usize, usize),
    /// Sliding-window rings: (slots a sequence, sequences, bytes); slots 0 when none.
    pub kv_rings: (usize, usize, usize),
    /// Rows a sequence may write beyond what it keeps without losing a visible key (the rings'
    /// spare slots), None when no layer has a ring (any rewind is safe).
    pub ring_spare: Option<usize>,
    /// The fused single-row MoE kernel's gate/up issue stagger (ns a warp index) and the peak
    /// DRAM bandwidth it was sized from (bytes/s; 0 when the driver reports none).
    pub moe_stagger: (i32, f64),
}

/// A target model on a device, as the benches and device checks drive it.
pub trait DeviceModel: Model {
    fn info(&self) -> DeviceInfo;
    /// Device copy bandwidth (bytes read + written per second) over a `bytes`-sized buffer.
    fn copy_bandwidth(&self, bytes: usize) -> Result<f64>;
    /// One greedy decode step of one sequence entirely on the device: the argmax token. Replays
    /// the captured step when decode graphs are on and profiling is off, else runs it eagerly.
    fn decode_greedy(&mut self, seq: SeqId, token: u32) -> Result<u32>;
    /// The captured greedy decode step replayed `n` times back to back with the last step's
    /// inputs (nothing read back in between): ms a replay, None before a step was captured.
    fn replay_decode_graph(&self, n: usize) -> Result<Option<f64>>;
    /// Under a `LAGUNA_STAMP` build: the replayed decode step's launches as a table (None
    /// otherwise, or before a step was captured).
    fn decode_timeline(&self) -> Result<Option<String>>;
    /// Time every kernel of later `forward` passes and `decode_greedy` steps (eagerly).
    fn set_profiling(&mut self, on: bool);
    /// The kernels timed since `set_profiling(true)`, largest first.
    fn take_profile(&mut self) -> Vec<KernelTime>;
    /// The device sampler's draw from each of these logits rows with its parameters and uniform
    /// (the rows are uploaded first): what `Model::decode_step` would draw from them.
    fn sample_logits(&self, rows: &[&[f32]], items: &[(SamplingParams, f64)]) -> Result<Vec<u32>>;
    /// Keep the DFlash taps of `forward` on the device (the device loop's setting) or return them
    /// to the host (the generic driver's).
    fn set_taps_on_device(&mut self, on: bool) -> Result<()>;
    /// A DFlash draft from `dir` on this model's device, sharing its embeddings and lm_head.
    fn load_draft(&self, dir: &Path) -> Result<Box<dyn DeviceDraft>>;
}

/// A DFlash draft on a device, as the benches and device checks drive it.
pub trait DeviceDraft: DraftModel {
    /// Bytes one propose reads from weights (layers, fc, lm_head once).
    fn step_weight_bytes(&self) -> usize;
    /// Let greedy batches run as one device step (`DraftModel::fused_greedy_step`; on by
    /// default) or make every step take the generic driver's path, for checks.
    fn set_fused_steps(&mut self, on: bool);
    /// One request through the device-resident greedy loop (docs/design/dflash.md), the target
    /// being this draft's own: token-identical to greedy decoding without the draft. The loop's
    /// captured steps are kept for the next request. `req.sampling` is ignored (greedy).
    fn generate_on_device(
        &mut self,
        target: &mut dyn Model,
        req: &GenerateRequest,
        k: usize,
        keep_history: bool,
        timing: LoopTiming,
    ) -> Result<FusedRun>;
}

/// What a device loop run measures beside its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopTiming {
    /// Wall time only: each step one replayed graph.
    Wall,
    /// Device time of each step's propose, verify and context (events between three graphs).
    Segments,
    /// Eager steps with every kernel timed ([`FusedRun::kernels`]).
    Kernels,
}

/// Device time per step segment (events), summed over `steps` (`LoopTiming::Segments`).
#[derive(Debug, Default, Clone)]
pub struct FusedTimes {
    pub steps: usize,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub ctx_ms: f64,
    /// Wall time of whole steps (uploads, graphs, read-back, host bookkeeping).
    pub wall_ms: f64,
}

/// A request run through the device loop.
pub struct FusedRun {
    pub completion: Vec<u32>,
    pub finish: FinishReason,
    pub stats: SpecStats,
    pub times: FusedTimes,
    /// Wall time of the prefill (prompt through the target + draft context), ms.
    pub prefill_ms: f64,
    /// `LoopTiming::Kernels`: the kernels of propose, verify and context over the run.
    pub kernels: Option<[Vec<KernelTime>; 3]>,
}
