//! `laguna plan` (also printed by `serve` at start-up): how the device memory is spent — weights,
//! the paged KV pool of the full-attention layers, the sliding-window rings, the activation
//! workspace — and whether it fits, decided before anything is loaded.
//!
//! Formulas (b = bytes per KV element: 2 for bf16/auto, 1 for fp8; k = num_speculative_tokens,
//! with `auto` the largest k it may choose, the draft's block_size - 1):
//! * KV per token per full-attention layer = 2 (K and V) · kv_heads · head_dim · b.
//! * Sliding-window ring per sequence = sliding layers · (window + k) · 2 · kv_heads · head_dim · b
//!   (the window plus the speculative slots of one verify step); the draft's layers likewise.
//! * Pool tokens = ⌊(kv_cache_memory_bytes − max_num_seqs · rings) / (full layers · per-layer
//!   bytes)⌋, rounded down to a multiple of [`KV_BLOCK`]; concurrency = pool / max_model_len.
//! * Activations = T · (4H + QKVG + Q + 2·M) · 2  +  T · E · 4  +  S · (k+1) · V · 4  +  T · taps · H · 2,
//!   with T = max_num_batched_tokens, H hidden, QKVG/Q the widest fused-projection/query widths,
//!   M = max(dense intermediate, top_k · moe_intermediate + shared intermediate), E experts,
//!   S = max_num_seqs, V vocab, taps = draft tap layers (0 without a draft).
//! * Total = weights + KV budget + activations + runtime reserve ([`CUDA_RESERVE`] on CUDA, 0 on CPU);
//!   cap = min(memory_cap_bytes, gpu_memory_utilization · device total).
//! * Peak during load = weights + GEMV copies + reserve, and on unified memory (an integrated GPU
//!   such as GB10, where the page cache and the device copy share one memory) + 2 x the largest
//!   tensor: its file pages and the loader's host copy of it in flight (the loader drops each
//!   tensor's file pages once it is uploaded, so the checkpoint is never held twice).
pub mod memory;
pub mod weights;

use crate::fetch::progress::{commas, human};
use crate::hub::HubEnv;
use crate::recipe::{Device, KvCacheDtype, ModelSource, Recipe, SpecK};
use laguna_engine::config::{AttnKind, LagunaConfig, MlpKind};
pub use memory::DeviceMemory;
use std::fmt;
use std::path::{Path, PathBuf};
pub use weights::WeightsSource;

/// Tokens per KV page of the full-attention pool.
pub const KV_BLOCK: u64 = 16;
/// CUDA context, cuBLAS workspaces and kernel images (an estimate; 0 on CPU).
pub const CUDA_RESERVE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    DoesNotFit(String),
    #[error("config.json of {what} is not available ({why}); run `laguna fetch`, or pass --config FILE (and --draft-config FILE)")]
    NoConfig { what: String, why: String },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{0}")]
    Memory(String),
}

/// Weight bytes and where they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightBytes {
    pub target: u64,
    pub draft: u64,
    pub source: WeightsSource,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KvPlan {
    pub device: Device,
    pub kv_dtype: KvCacheDtype,
    pub weights: WeightBytes,
    /// CUDA: the GEMV's tile-interleaved copies of the BF16 Linears (0 on CPU).
    pub gemv_copies: u64,
    pub full_layers: usize,
    pub sliding_layers: usize,
    pub kv_bytes_per_token_layer: u64,
    /// All full-attention layers (target and draft) together.
    pub kv_bytes_per_token: u64,
    pub window: usize,
    /// k the rings and activations are planned for: the fixed k, or with `auto` the largest
    /// it may choose (the draft's block_size - 1).
    pub speculative_tokens: usize,
    /// `num_speculative_tokens = "auto"` (adaptive k) with a draft config.
    pub speculative_auto: bool,
    pub ring_slots: usize,
    pub ring_bytes_per_seq: u64,
    pub draft_ring_bytes_per_seq: u64,
    pub max_num_seqs: usize,
    pub kv_budget: u64,
    /// Whether the KV budget was given (`kv_cache_memory_bytes`) or derived from the cap.
    pub kv_budget_given: bool,
    /// `None` when there are no full-attention layers (the KV does not grow with context).
    pub pool_tokens: Option<u64>,
    pub max_model_len: usize,
    pub max_position_embeddings: usize,
    /// The draft's `dflash_config.block_size` (speculative tokens must be fewer).
    pub draft_block_size: Option<usize>,
    pub activations: u64,
    pub reserve: u64,
    /// The largest tensor's bytes (config), and the projected peak during load (module docs).
    pub largest_tensor: u64,
    pub load_peak: u64,
    pub total: u64,
    pub cap: u64,
    pub memory: DeviceMemory,
    pub gpu_memory_utilization: f64,
    pub memory_cap_bytes: Option<u64>,
    pub max_num_batched_tokens: usize,
}

/// Activation workspace estimate (see the module docs for the formula).
pub fn activation_bytes(
    cfg: &LagunaConfig,
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    spec_tokens: usize,
    taps: usize,
) -> u64 {
    let t = max_num_batched_tokens as u64;
    let h = cfg.hidden_size as u64;
    let hd = cfg.head_dim as u64;
    let kv = cfg.num_kv_heads as u64;
    let (mut qkvg, mut q) = (0u64, 0u64);
    for (i, l) in cfg.layers.iter().enumerate() {
        let qw = l.num_heads as u64 * hd;
        q = q.max(qw);
        qkvg = qkvg.max(qw + 2 * kv * hd + cfg.gate_width(i) as u64);
    }
    let has_dense = cfg.layers.iter().any(|l| l.mlp == MlpKind::Dense);
    let has_sparse = cfg.layers.iter().any(|l| l.mlp == MlpKind::Sparse);
    let dense_m = if has_dense {
        cfg.intermediate_size as u64
    } else {
        0
    };
    let moe_m = if has_sparse {
        (cfg.top_k * cfg.moe_intermediate_size + cfg.shared_expert_intermediate_size) as u64
    } else {
        0
    };
    let m = dense_m.max(moe_m);
    let router = if has_sparse {
        t * cfg.num_experts as u64 * 4
    } else {
        0
    };
    let logits = (max_num_seqs * (spec_tokens + 1)) as u64 * cfg.vocab_size as u64 * 4;
    t * (4 * h + qkvg + q + 2 * m) * 2 + router + logits + t * taps as u64 * h * 2
}

/// A draft's rings count this many times on a GPU with the prefix cache on: a draft whose layers
/// all keep a window snapshots its rings into buffers of its own, reserved in the K/V budget.
fn own_snapshot_copies(recipe: &Recipe, draft: &LagunaConfig) -> u64 {
    let windowed_only = draft.layers.iter().all(|l| l.attn == AttnKind::Sliding);
    if recipe.device != Device::Cpu && recipe.enable_prefix_caching && windowed_only {
        1 + laguna_engine::model::prefix::OWN_SNAPSHOTS_PER_SEQ as u64
    } else {
        1
    }
}

fn round_down(x: u64, to: u64) -> u64 {
    x / to * to
}

/// The draft's trained block length: `dflash_config.block_size`, else a top-level `block_size`
/// (as `laguna_engine::spec::DraftConfig` reads it).
fn draft_block_size(d: &LagunaConfig) -> Option<usize> {
    let raw = &d.raw;
    raw.get("dflash_config")
        .and_then(|c| c.get("block_size"))
        .or_else(|| raw.get("block_size"))
        .and_then(|b| b.as_u64())
        .map(|b| b as usize)
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

impl KvPlan {
    /// Every number of the plan. Nothing here reads files or devices: `weights` and `memory` come in.
    pub fn compute(
        cfg: &LagunaConfig,
        draft: Option<&LagunaConfig>,
        recipe: &Recipe,
        weights: WeightBytes,
        memory: DeviceMemory,
    ) -> KvPlan {
        let b = recipe.kv_cache_dtype.bytes();
        let draft_block_size = draft.and_then(draft_block_size);
        // Auto plans the rings and activations for the largest k it may choose.
        let k = match recipe.spec_k() {
            None => 0,
            Some(sk) => sk.max_k(draft_block_size.unwrap_or(0)),
        };
        let per_layer = |c: &LagunaConfig| 2 * c.num_kv_heads as u64 * c.head_dim as u64 * b;
        let count =
            |c: &LagunaConfig, kind: AttnKind| c.layers.iter().filter(|l| l.attn == kind).count();
        let full_layers = count(cfg, AttnKind::Full);
        let sliding_layers = count(cfg, AttnKind::Sliding);
        let kv_bytes_per_token_layer = per_layer(cfg);
        let window = cfg.sliding_window.unwrap_or(0);
        let ring_slots = window + k;
        let ring_bytes_per_seq =
            sliding_layers as u64 * ring_slots as u64 * kv_bytes_per_token_layer;
        let (draft_full, draft_ring) = match draft {
            Some(d) => {
                let w = d.sliding_window.unwrap_or(0);
                (
                    count(d, AttnKind::Full) as u64 * per_layer(d),
                    count(d, AttnKind::Sliding) as u64
                        * (w + k) as u64
                        * per_layer(d)
                        * own_snapshot_copies(recipe, d),
                )
            }
            None => (0, 0),
        };
        let kv_bytes_per_token = full_layers as u64 * kv_bytes_per_token_layer + draft_full;
        let taps = draft.map_or(0, |d| crate::verify::draft::target_layer_ids(d).len());
        let activations = activation_bytes(
            cfg,
            recipe.max_num_batched_tokens,
            recipe.max_num_seqs,
            k,
            taps,
        );
        let reserve = if recipe.device == Device::Cpu {
            0
        } else {
            CUDA_RESERVE
        };
        let util_cap = (recipe.gpu_memory_utilization * memory.total as f64) as u64;
        let cap = recipe
            .memory_cap_bytes
            .map_or(util_cap, |c| c.min(util_cap));
        let gemv_copies = if recipe.device == Device::Cpu {
            0
        } else {
            weights::gemv_copy_bytes(cfg, draft)
        };
        let fixed = weights.target + weights.draft + gemv_copies + activations + reserve;
        let largest_tensor = weights::largest_tensor_from_config(cfg);
        let in_flight = if memory.unified {
            2 * largest_tensor
        } else {
            0
        };
        let load_peak = weights.target + weights.draft + gemv_copies + reserve + in_flight;
        let rings = recipe.max_num_seqs as u64 * (ring_bytes_per_seq + draft_ring);
        let max_model_len = recipe.max_model_len.unwrap_or(cfg.max_position_embeddings);
        // A pool never needs more than max_num_seqs sequences of max_model_len tokens.
        let kv_needed = rings
            + recipe.max_num_seqs as u64
                * round_up(max_model_len as u64, KV_BLOCK)
                * kv_bytes_per_token;
        let (kv_budget, kv_budget_given) = match recipe.kv_cache_memory_bytes {
            Some(kv) => (kv, true),
            None => (cap.saturating_sub(fixed).min(kv_needed), false),
        };
        let pool_tokens = (kv_bytes_per_token > 0).then(|| {
            round_down(
                kv_budget.saturating_sub(rings) / kv_bytes_per_token,
                KV_BLOCK,
            )
        });
        KvPlan {
            device: recipe.device,
            kv_dtype: recipe.kv_cache_dtype,
            weights,
            gemv_copies,
            full_layers,
            sliding_layers,
            kv_bytes_per_token_layer,
            kv_bytes_per_token,
            window,
            speculative_tokens: k,
            ring_slots,
            ring_bytes_per_seq,
            draft_ring_bytes_per_seq: draft_ring,
            max_num_seqs: recipe.max_num_seqs,
            kv_budget,
            kv_budget_given,
            pool_tokens,
            max_model_len,
            max_position_embeddings: cfg.max_position_embeddings,
            speculative_auto: draft.is_some() && recipe.spec_k() == Some(SpecK::Auto),
            draft_block_size,
            activations,
            reserve,
            largest_tensor,
            load_peak,
            total: fixed + kv_budget,
            cap,
            memory,
            gpu_memory_utilization: recipe.gpu_memory_utilization,
            memory_cap_bytes: recipe.memory_cap_bytes,
            max_num_batched_tokens: recipe.max_num_batched_tokens,
        }
    }

    /// Rings of all sequences (target + draft).
    pub fn ring_bytes(&self) -> u64 {
        self.max_num_seqs as u64 * (self.ring_bytes_per_seq + self.draft_ring_bytes_per_seq)
    }

    /// Pool tokens / max_model_len (`None` without full-attention layers).
    pub fn concurrency(&self) -> Option<f64> {
        self.pool_tokens
            .map(|p| p as f64 / self.max_model_len as f64)
    }

    /// `Err` naming the number that is too big and what to change.
    pub fn check(&self) -> Result<(), PlanError> {
        let cap_desc = match self.memory_cap_bytes {
            Some(c) if c < (self.gpu_memory_utilization * self.memory.total as f64) as u64 => {
                format!("memory_cap_bytes {}", human(c))
            }
            _ => format!(
                "gpu_memory_utilization {} x {} device memory",
                self.gpu_memory_utilization,
                human(self.memory.total)
            ),
        };
        let fixed = self.weights.target
            + self.weights.draft
            + self.gemv_copies
            + self.activations
            + self.reserve;
        if self.max_model_len > self.max_position_embeddings {
            return Err(PlanError::DoesNotFit(format!(
                "max_model_len {} exceeds the model's max_position_embeddings {}; lower max_model_len",
                commas(self.max_model_len as u64),
                commas(self.max_position_embeddings as u64)
            )));
        }
        if self.speculative_auto && self.draft_block_size.is_none() {
            return Err(PlanError::DoesNotFit(
                "num_speculative_tokens = auto needs the draft's dflash_config.block_size (auto chooses k up to block_size - 1); give a fixed k or a DFlash draft config".into(),
            ));
        }
        if let Some(b) = self.draft_block_size {
            if self.speculative_tokens >= b {
                return Err(PlanError::DoesNotFit(format!(
                    "num_speculative_tokens {} must be below the draft's dflash_config.block_size {b}; lower num_speculative_tokens to at most {}",
                    self.speculative_tokens,
                    b - 1
                )));
            }
        }
        if !self.kv_budget_given && self.kv_budget == 0 {
            return Err(PlanError::DoesNotFit(format!(
                "{} = {} leave no room for the KV cache under the cap {} ({cap_desc}); raise gpu_memory_utilization or memory_cap_bytes, or lower max_num_batched_tokens",
                self.fixed_parts(), human(fixed), human(self.cap)
            )));
        }
        if self.kv_budget < self.ring_bytes() {
            return Err(PlanError::DoesNotFit(format!(
                "kv_cache_memory_bytes {} does not even hold the sliding-window rings of {} sequences ({}); raise kv_cache_memory_bytes or lower max_num_seqs",
                commas(self.kv_budget), self.max_num_seqs, commas(self.ring_bytes())
            )));
        }
        if let Some(pool) = self.pool_tokens {
            if pool < self.max_model_len as u64 {
                let need = self.ring_bytes() + self.max_model_len as u64 * self.kv_bytes_per_token;
                return Err(PlanError::DoesNotFit(format!(
                    "the KV pool holds {} tokens, fewer than max_model_len {}: raise kv_cache_memory_bytes to at least {} ({}), use kv_cache_dtype = \"fp8\", or lower max_model_len to {}",
                    commas(pool), commas(self.max_model_len as u64), commas(need), human(need), commas(pool)
                )));
            }
        }
        if self.memory.unified && self.load_peak > self.cap.min(self.memory.free) {
            return Err(PlanError::DoesNotFit(format!(
                "loading needs a peak of {} (weights {} + GEMV copies {} + reserve {} + the largest tensor's file pages and host copy {}) but the unified memory has {} ({}: free {}, cap {}); nothing was loaded: free memory (stop other processes) or raise gpu_memory_utilization / memory_cap_bytes",
                human(self.load_peak), human(self.weights.target + self.weights.draft), human(self.gemv_copies), human(self.reserve),
                human(2 * self.largest_tensor), human(self.cap.min(self.memory.free)), self.memory.source, human(self.memory.free), human(self.cap)
            )));
        }
        if self.total > self.cap && fixed >= self.cap {
            return Err(PlanError::DoesNotFit(format!(
                "{} = {} alone exceed the cap {} ({cap_desc}), before any KV cache; raise gpu_memory_utilization or memory_cap_bytes, lower max_num_batched_tokens, or plan for the real device with --device-memory",
                self.fixed_parts(), human(fixed), human(self.cap)
            )));
        }
        if self.total > self.cap {
            let room = self.cap.saturating_sub(fixed);
            return Err(PlanError::DoesNotFit(format!(
                "total {} ({} + KV {}) exceeds the cap {} ({cap_desc}); lower kv_cache_memory_bytes to at most {} or raise gpu_memory_utilization / memory_cap_bytes",
                human(self.total), self.fixed_parts(), human(self.kv_budget), human(self.cap), commas(room)
            )));
        }
        if self.total > self.memory.free {
            return Err(PlanError::DoesNotFit(format!(
                "total {} exceeds the memory free right now, {} ({}); free memory (stop other processes) or lower kv_cache_memory_bytes / max_num_batched_tokens",
                human(self.total), human(self.memory.free), self.memory.source
            )));
        }
        Ok(())
    }
}

impl KvPlan {
    /// What the plan holds besides the K/V, named part by part for the refusals.
    fn fixed_parts(&self) -> String {
        let copies = if self.gemv_copies > 0 {
            format!(" + GEMV weight copies {}", human(self.gemv_copies))
        } else {
            String::new()
        };
        format!(
            "weights {}{copies} + activations {} + reserve {}",
            human(self.weights.target + self.weights.draft),
            human(self.activations),
            human(self.reserve)
        )
    }
}

impl fmt::Display for KvPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = match self.weights.source {
            WeightsSource::Headers => "from safetensors headers",
            WeightsSource::Config => "computed from config.json",
        };
        writeln!(
            f,
            "plan for device {} (kv cache dtype {})",
            self.device, self.kv_dtype
        )?;
        writeln!(
            f,
            "  weights:            {} target + {} draft = {} ({src})",
            commas(self.weights.target),
            commas(self.weights.draft),
            human(self.weights.target + self.weights.draft)
        )?;
        if self.gemv_copies > 0 {
            writeln!(
                f,
                "  GEMV copies:        {} (tile-interleaved BF16 Linears for the decode GEMV)",
                human(self.gemv_copies)
            )?;
        }
        writeln!(
            f,
            "  KV per token:       {} B per full-attention layer x {} layers = {} B/token",
            commas(self.kv_bytes_per_token_layer),
            self.full_layers,
            commas(self.kv_bytes_per_token)
        )?;
        writeln!(
            f,
            "  sliding rings:      {} layers x ({} window + {} speculative{}) slots = {} per sequence (+ draft {}), {} for {} sequences",
            self.sliding_layers,
            self.window,
            self.speculative_tokens,
            if self.speculative_auto { ", auto's largest k" } else { "" },
            commas(self.ring_bytes_per_seq),
            commas(self.draft_ring_bytes_per_seq),
            commas(self.ring_bytes()),
            self.max_num_seqs
        )?;
        let budget_src = if self.kv_budget_given {
            "kv_cache_memory_bytes"
        } else {
            "what the cap leaves"
        };
        writeln!(
            f,
            "  KV budget:          {} ({}, {budget_src})",
            commas(self.kv_budget),
            human(self.kv_budget)
        )?;
        match (self.pool_tokens, self.concurrency()) {
            (Some(p), Some(c)) => writeln!(f, "  KV pool: {} tokens, {:.2}x of {}", commas(p), c, commas(self.max_model_len as u64))?,
            _ => writeln!(
                f,
                "  KV pool: no full-attention layers; KV does not grow with context (max_model_len {})",
                commas(self.max_model_len as u64)
            )?,
        }
        writeln!(
            f,
            "  activations:        {} ({} batched tokens)",
            human(self.activations),
            commas(self.max_num_batched_tokens as u64)
        )?;
        if self.reserve > 0 {
            writeln!(f, "  runtime reserve:    {}", human(self.reserve))?;
        }
        let peak_how = if self.memory.unified {
            format!(
                "weights + copies + reserve + 2 x the largest tensor {} in flight; unified memory: each tensor's file pages are dropped after its upload",
                human(self.largest_tensor)
            )
        } else {
            "weights + copies + reserve; the K/V and activations come after".to_string()
        };
        writeln!(
            f,
            "  peak during load:   {} ({peak_how})",
            human(self.load_peak)
        )?;
        writeln!(
            f,
            "  total:              {} ({})",
            human(self.total),
            commas(self.total)
        )?;
        writeln!(
            f,
            "  cap:                {} (gpu_memory_utilization {} of {}{})",
            human(self.cap),
            self.gpu_memory_utilization,
            human(self.memory.total),
            self.memory_cap_bytes.map_or(String::new(), |c| format!(
                ", memory_cap_bytes {}",
                human(c)
            ))
        )?;
        write!(
            f,
            "  free now:           {} ({})",
            human(self.memory.free),
            self.memory.source
        )
    }
}

/// Built-in copies of the published configs, for planning before `fetch`.
fn builtin_config(repo: &str) -> Option<&'static str> {
    match repo {
        "poolside/Laguna-XS-2.1-NVFP4" => Some(include_str!(
            "../../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
        )),
        "poolside/Laguna-XS-2.1-DFlash" => Some(include_str!(
            "../../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json"
        )),
        _ => None,
    }
}

/// Where the plan's inputs came from (printed above the plan).
#[derive(Debug, Clone)]
pub struct PlanSources {
    pub model_config: String,
    pub draft_config: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Use this config.json instead of the checkpoint's.
    pub config: Option<PathBuf>,
    pub draft_config: Option<PathBuf>,
    /// Plan for a device of this many bytes (total = free) instead of probing.
    pub device_memory: Option<u64>,
    /// With `device_memory`: the device's memory is the host's (an integrated GPU such as GB10).
    pub unified: bool,
}

fn load_config(p: &Path) -> Result<LagunaConfig, PlanError> {
    LagunaConfig::from_file(p).map_err(|e| PlanError::Config {
        path: p.to_path_buf(),
        msg: e.to_string(),
    })
}

/// Config (and checkpoint folder, when present) of one recipe source.
fn resolve_config(
    env: &HubEnv,
    src: &ModelSource,
    given: Option<&Path>,
) -> Result<(LagunaConfig, Option<PathBuf>, String), PlanError> {
    let dir = crate::hub::local_dir(env, src)
        .ok()
        .filter(|d| d.join("config.json").is_file());
    if let Some(p) = given {
        return Ok((load_config(p)?, dir, p.display().to_string()));
    }
    if let Some(d) = &dir {
        let p = d.join("config.json");
        return Ok((load_config(&p)?, dir.clone(), p.display().to_string()));
    }
    if let ModelSource::Hub { repo, .. } = src {
        if let Some(text) = builtin_config(repo) {
            let cfg = LagunaConfig::from_json_str(text).map_err(|e| PlanError::Config {
                path: repo.into(),
                msg: e.to_string(),
            })?;
            return Ok((
                cfg,
                None,
                format!("built-in copy of {repo} config.json (not fetched yet)"),
            ));
        }
    }
    let why = match crate::hub::local_dir(env, src) {
        Err(e) => e.to_string(),
        Ok(d) => format!("{} has no config.json", d.display()),
    };
    Err(PlanError::NoConfig {
        what: src.label(),
        why,
    })
}

/// Build the plan of a recipe: configs from the checkpoints (or `--config`, or built-in copies),
/// weights from headers when the checkpoint is present, memory from the probe (or `--device-memory`).
pub fn plan_recipe(
    recipe: &Recipe,
    env: &HubEnv,
    opts: &PlanOptions,
) -> Result<(KvPlan, PlanSources), PlanError> {
    let (cfg, dir, model_src) = resolve_config(env, &recipe.model, opts.config.as_deref())?;
    let draft = match &recipe.draft {
        Some(d) => Some(resolve_config(env, d, opts.draft_config.as_deref())?),
        None => None,
    };
    let from_headers = |d: &Option<PathBuf>| d.as_ref().and_then(|d| weights::from_headers(d).ok());
    let target_h = from_headers(&dir);
    let draft_h = draft.as_ref().map(|(_, d, _)| from_headers(d));
    let weights = match (target_h, &draft_h) {
        (Some(t), None) => WeightBytes {
            target: t,
            draft: 0,
            source: WeightsSource::Headers,
        },
        (Some(t), Some(Some(d))) => WeightBytes {
            target: t,
            draft: *d,
            source: WeightsSource::Headers,
        },
        _ => WeightBytes {
            target: target_h.unwrap_or_else(|| weights::target_from_config(&cfg)),
            draft: draft
                .as_ref()
                .map_or(0, |(dc, _, _)| weights::draft_from_config(dc, &cfg)),
            source: WeightsSource::Config,
        },
    };
    let memory = match opts.device_memory {
        Some(b) => DeviceMemory {
            total: b,
            free: b,
            source: "--device-memory".into(),
            unified: opts.unified,
        },
        None => memory::probe(recipe.device).map_err(PlanError::Memory)?,
    };
    let plan = KvPlan::compute(
        &cfg,
        draft.as_ref().map(|(c, _, _)| c),
        recipe,
        weights,
        memory,
    );
    Ok((
        plan,
        PlanSources {
            model_config: model_src,
            draft_config: draft.map(|(_, _, s)| s),
        },
    ))
}
