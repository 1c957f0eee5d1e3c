//! Backend choice in one place: `load` reads a model (and a DFlash draft) onto the CPU reference
//! backend or a CUDA GPU and hands them back behind the engine's traits, so nothing above the engine
//! names a backend type. `generate`, `serve`, the benches and the device checks all load through
//! here; the tools reach what only a device backend has through [`Loaded::device`].
use crate::cpu::CpuModel;
use crate::cuda::draft::CudaDraft;
use crate::cuda::{self, CudaModel, CudaOptions};
use crate::generate::{generate, GenerateRequest, GenerateResult};
use crate::model::device::{DeviceDraft, DeviceModel, LoopTiming};
use crate::model::Model;
use crate::sched::{Dflash, Loaded as SchedLoaded};
use crate::spec::{generate_spec, CpuDraft, DraftModel, SpecStats};
use crate::{EngineError, Result};
use std::path::Path;
use std::sync::Arc;

/// [`Loaded::step_costs`]: untimed (graph capture) and timed steps per batch size and k.
pub const STEP_COSTS_WARM: usize = 2;
pub const STEP_COSTS_STEPS: usize = 6;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(usize),
}

impl Device {
    /// `cpu`, `cuda` or `cuda:N`.
    pub fn parse(s: &str) -> std::result::Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!("unknown device `{s}` (use cpu, cuda or cuda:N)")),
            },
        }
    }

    /// Ok when the device can be used here (CUDA: a driver and the GPU are present).
    pub fn check(self) -> std::result::Result<(), String> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(_) => cuda::gpu_available(),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Passes of at least this many rows take the long-pass regime (tensor-core GEMMs, flash prefill
/// attention) unless [`LoadOptions::gemm_min_rows`] says otherwise (docs/design/numerics.md).
pub use crate::cuda::GEMM_MIN_ROWS;

/// The largest DFlash k (a block of 16 tokens): the spare rows of a model loaded for any draft's
/// k ([`LoadOptions::spare_rows`]), as the benches and device checks load it.
pub const MAX_SPEC_K: usize = 15;

/// What the CPU's prefix cache may hold when no K/V budget is given.
pub const CPU_PREFIX_CACHE_BYTES: usize = 2 << 30;

/// How to load: the knobs `serve` and `generate` set, then how a device backend runs its passes
/// (the benches and device checks set those; the CPU reference ignores them).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// K/V budget in bytes, covering the draft's rings too (None: the backend sizes it).
    pub kv_cache_bytes: Option<usize>,
    /// K/V stored as FP8 E4M3.
    pub kv_fp8: bool,
    /// Sequences live at once.
    pub max_seqs: usize,
    /// Longest sequence (None: the model's max_position_embeddings).
    pub max_model_len: Option<usize>,
    /// Draft tokens per step (DFlash k); None: the draft's block_size - 1.
    pub num_speculative_tokens: Option<usize>,
    /// Show a progress bar while weights stream to the device.
    pub progress: bool,
    /// The prefix cache will run: reserve what its stores keep outside the pool (the draft's
    /// own snapshot buffers) inside the K/V budget.
    pub prefix_cache: bool,
    /// Rows per device pass (a prefill chunk; longer batches run in several); None: the
    /// backend's default.
    pub pass_rows: Option<usize>,
    /// Positions per K/V page; None: the backend's default.
    pub page_size: Option<usize>,
    /// Passes of at least this many rows take the long-pass regime; None: [`GEMM_MIN_ROWS`].
    pub gemm_min_rows: Option<usize>,
    /// Rows a sequence may write past what the next step keeps: a sliding-window ring's spare
    /// slots, at least the DFlash k it serves. None: the draft's k (0 without a draft).
    pub spare_rows: Option<usize>,
    /// Replay single-row decode steps from captured graphs (off: every step eager).
    pub decode_graphs: bool,
    /// Sliding-window layers keep a ring per sequence (off: they store every position, like
    /// full-attention layers; for A/B checks).
    pub sliding_rings: bool,
    /// Long passes' dense BF16 GEMMs through the vendor's BLAS when it loads (off: laguna's own).
    pub vendor_blas: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            kv_cache_bytes: None,
            kv_fp8: false,
            max_seqs: 8,
            max_model_len: None,
            num_speculative_tokens: None,
            progress: false,
            prefix_cache: false,
            pass_rows: None,
            page_size: None,
            gemm_min_rows: None,
            spare_rows: None,
            decode_graphs: true,
            sliding_rings: true,
            vendor_blas: true,
        }
    }
}

/// A loaded model and optional draft. The variants stay inside the engine; callers use the methods.
pub enum Loaded {
    Cpu {
        model: CpuModel,
        draft: Option<(CpuDraft, usize)>,
    },
    Cuda {
        model: CudaModel,
        draft: Option<(CudaDraft, usize)>,
    },
}

/// Run as the named device would (`--device-profile`, e.g. `gb10`: its SM count and shared-memory
/// limits for every kernel choice); see `cuda::profile`.
pub fn set_device_profile(name: &str) -> Result<()> {
    cuda::profile::set(cuda::profile::Profile::parse(name).map_err(EngineError::Other)?);
    Ok(())
}

/// Load `model_dir` (and `draft_dir`) onto `device`.
pub fn load(
    device: Device,
    opts: &LoadOptions,
    model_dir: &Path,
    draft_dir: Option<&Path>,
) -> Result<Loaded> {
    device.check().map_err(EngineError::Other)?;
    match device {
        Device::Cpu => {
            let mut model = CpuModel::load(model_dir)?;
            model.set_kv_fp8(opts.kv_fp8);
            // The CPU's live K/V grows with its sequences; the budget bounds what the prefix
            // cache keeps (each model its own).
            let cache_bytes = opts.kv_cache_bytes.unwrap_or(CPU_PREFIX_CACHE_BYTES);
            model.set_prefix_budget_bytes(cache_bytes);
            let draft = match draft_dir {
                Some(d) => {
                    let mut dm = CpuDraft::load(d, &model)?;
                    dm.set_prefix_budget_bytes(cache_bytes);
                    let k = spec_k(&dm, opts)?;
                    Some((dm, k))
                }
                None => None,
            };
            Ok(Loaded::Cpu { model, draft })
        }
        Device::Cuda(ordinal) => {
            let k = match draft_dir {
                Some(d) => {
                    let cfg = crate::spec::DraftConfig::from_file(&d.join("config.json"))?;
                    let k = opts.num_speculative_tokens.unwrap_or(cfg.block_size - 1);
                    cfg.check_k(k)?;
                    k
                }
                None => 0,
            };
            let mut copts = cuda_options(ordinal, opts, k);
            // The budget covers the draft's rings too (as `laguna plan` counts them).
            if let (Some(d), Some(b)) = (draft_dir, opts.kv_cache_bytes) {
                copts.kv_pool_bytes = Some(b.saturating_sub(CudaDraft::ring_bytes(d, &copts)?));
            }
            let model = CudaModel::load(model_dir, copts)?;
            let draft = match draft_dir {
                // The CUDA draft shares the target's device tensors (embed, lm_head) and stream.
                Some(d) => Some((CudaDraft::load(d, &model)?, k)),
                None => None,
            };
            Ok(Loaded::Cuda { model, draft })
        }
    }
}

/// The CUDA backend's options for `opts` with a draft of k (0: none).
fn cuda_options(ordinal: usize, opts: &LoadOptions, k: usize) -> CudaOptions {
    let d = CudaOptions::default();
    CudaOptions {
        device: ordinal,
        kv_pool_bytes: opts.kv_cache_bytes,
        max_model_len: opts.max_model_len,
        page_size: opts.page_size.unwrap_or(d.page_size),
        max_rows: opts.pass_rows.unwrap_or(d.max_rows),
        progress: opts.progress,
        graphs: opts.decode_graphs,
        gemm_min_rows: opts.gemm_min_rows.unwrap_or(GEMM_MIN_ROWS),
        cublas: opts.vendor_blas,
        max_seqs: opts.max_seqs,
        spec_k: opts.spare_rows.unwrap_or(k),
        kv_fp8: opts.kv_fp8,
        rings: opts.sliding_rings,
        own_snapshots: if opts.prefix_cache {
            crate::model::prefix::OWN_SNAPSHOTS_PER_SEQ
        } else {
            0
        },
    }
}

fn spec_k(draft: &dyn DraftModel, opts: &LoadOptions) -> Result<usize> {
    let k = opts
        .num_speculative_tokens
        .unwrap_or(draft.config().block_size - 1);
    draft.config().check_k(k)?;
    Ok(k)
}

impl Loaded {
    /// Adaptive k's step-time table for this pair (`spec::StepCosts::measure_within`): k = 0..=the
    /// loaded k, batch sizes 1, 2, 4, .. up to `max_seqs`, on throwaway sequences of a prompt of
    /// up to `prompt_len` tokens ([`STEP_COSTS_WARM`] + [`STEP_COSTS_STEPS`] steps per k), all
    /// within `max_len` positions (the context the model was loaded for): the prompt shrinks,
    /// then k (`StepCosts::fit`, returned beside the table). None without a draft.
    pub fn step_costs(
        &mut self,
        max_seqs: usize,
        prompt_len: usize,
        max_len: usize,
    ) -> Result<Option<(crate::spec::StepCosts, crate::spec::CostsFit)>> {
        let batches: Vec<usize> = (0..)
            .map(|i| 1usize << i)
            .take_while(|&b| b <= max_seqs.max(1))
            .collect();
        let m = |t: &mut dyn Model, d: &mut dyn DraftModel, k: usize| {
            crate::spec::StepCosts::measure_within(
                t,
                d,
                k,
                &batches,
                prompt_len,
                max_len,
                STEP_COSTS_WARM,
                STEP_COSTS_STEPS,
            )
        };
        match self {
            Loaded::Cpu {
                model,
                draft: Some((d, k)),
            } => m(model, d, *k).map(Some),
            Loaded::Cuda {
                model,
                draft: Some((d, k)),
            } => m(model, d, *k).map(Some),
            _ => Ok(None),
        }
    }

    /// The target model behind its trait.
    pub fn model(&mut self) -> &mut dyn Model {
        match self {
            Loaded::Cpu { model, .. } => model,
            Loaded::Cuda { model, .. } => model,
        }
    }

    /// The target's device capabilities (the benches and device checks); None on the CPU
    /// reference.
    pub fn device(&mut self) -> Option<&mut dyn DeviceModel> {
        match self {
            Loaded::Cpu { .. } => None,
            Loaded::Cuda { model, .. } => Some(model),
        }
    }

    /// The draft's k, when a draft is loaded.
    pub fn spec_k(&self) -> Option<usize> {
        match self {
            Loaded::Cpu { draft, .. } => draft.as_ref().map(|d| d.1),
            Loaded::Cuda { draft, .. } => draft.as_ref().map(|d| d.1),
        }
    }

    /// One request start to finish. With a draft: DFlash (greedy on CUDA runs the device-resident
    /// loop, whose tokens equal the plain greedy ones), with its acceptance statistics. With
    /// `costs` (a table from [`Loaded::step_costs`]) k is adaptive up to the loaded k, through
    /// `spec::step` (the fused device step where the backend has one).
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        keep_logits: bool,
        costs: Option<Arc<crate::spec::StepCosts>>,
    ) -> Result<(GenerateResult, Option<SpecStats>)> {
        match self {
            Loaded::Cpu { model, draft: None } => Ok((generate(model, req, keep_logits)?, None)),
            Loaded::Cuda { model, draft: None } => Ok((generate(model, req, keep_logits)?, None)),
            Loaded::Cpu {
                model,
                draft: Some((d, k)),
            } => {
                let (r, s) = generate_spec(model, d, req, *k, true, costs)?;
                Ok((r, Some(s)))
            }
            Loaded::Cuda {
                model,
                draft: Some((d, k)),
            } if req.sampling.is_greedy() && costs.is_none() => {
                let r = d.generate_on_device(model, req, *k, true, LoopTiming::Wall)?;
                let res = GenerateResult {
                    completion: r.completion,
                    finish_reason: r.finish,
                    step_logits: vec![],
                };
                Ok((res, Some(r.stats)))
            }
            Loaded::Cuda {
                model,
                draft: Some((d, k)),
            } => {
                let (r, s) = generate_spec(model, d, req, *k, true, costs)?;
                Ok((r, Some(s)))
            }
        }
    }

    /// What the scheduler runs: the model and the draft behind their traits.
    pub fn into_scheduler(self) -> SchedLoaded {
        let (model, dflash): (Box<dyn Model>, _) = match self {
            Loaded::Cpu { model, draft } => (
                Box::new(model),
                draft.map(|(d, k)| Dflash {
                    draft: Box::new(d),
                    k,
                    costs: None,
                }),
            ),
            Loaded::Cuda { model, draft } => (
                Box::new(model),
                draft.map(|(d, k)| Dflash {
                    draft: Box::new(d),
                    k,
                    costs: None,
                }),
            ),
        };
        SchedLoaded {
            model,
            spec: None,
            dflash,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names() {
        assert_eq!(Device::parse("cpu"), Ok(Device::Cpu));
        assert_eq!(Device::parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(Device::parse("cuda:3"), Ok(Device::Cuda(3)));
        assert!(Device::parse("cuda:x").unwrap_err().contains("cuda:N"));
        assert!(Device::parse("tpu").is_err());
    }
}
