//! CUDA backend: the Laguna forward pass on an NVIDIA GPU through cudarc (driver API, loaded at
//! run time) and our own kernels (`laguna-kernels`, NVRTC → cubin, cached on disk).
//!
//! Weights live on the device as stored: BF16 dense tensors, NVFP4 Linears packed (codes + E4M3
//! block scales + 1/global scale folded into one f32 per matrix / per expert). Activations are f32
//! (tiny at batch sizes that matter and they keep routing decisions identical to the reference),
//! accumulation f32. K/V (BF16 or FP8): full-attention layers page a pool, sliding-window layers keep
//! a ring per sequence (`ring`).
//!
//! Every kernel computes one output row's value with an arithmetic order that does not depend on
//! how many rows are in the batch (batch invariance).
mod blas;
mod device;
pub mod draft;
pub mod ring;
pub mod spec;

pub use device::{Dev, DevError, Prof};

use crate::config::{AttnKind, Gating, LagunaConfig, MlpKind};
use crate::error::{EngineError, Result};
use crate::model::schema::layer_prefix;
use crate::model::{DecodeItem, LogitRows, Model, SeqId, StepInput, StepOutput};
use crate::sample::SamplingParams;
use crate::weights::linear::{kv_scale_pair, LinearSource};
use crate::weights::store::{TensorView, WeightStore};
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Options for [`CudaModel::load`].
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// GPU ordinal.
    pub device: usize,
    /// Bytes for the paged K/V pool; None: half of the free memory after weights, at most 16 GiB.
    pub kv_pool_bytes: Option<usize>,
    /// Positions per K/V page.
    pub page_size: usize,
    /// Rows per device pass (prefill chunk); longer batches run in several passes.
    pub max_rows: usize,
    /// Show a progress bar while weights stream to the device.
    pub progress: bool,
    /// Replay single-row decode steps from a captured CUDA graph.
    pub graphs: bool,
    /// Passes of at least this many rows run the dense and expert projections as tensor-core
    /// GEMMs (weights read once per tile, activations split into BF16 hi + lo; dense BF16 Linears
    /// through cuBLAS when it loads); smaller passes use
    /// the f32 weight-streaming kernels. Rows are bitwise batch-invariant within each regime.
    pub gemm_min_rows: usize,
    /// Sequences live at once: each owns a sliding-window ring per sliding layer (recipe
    /// `max_num_seqs`; the draft's sequences are counted by the draft).
    pub max_seqs: usize,
    /// Rows a sequence may write past what the next step keeps (DFlash k): a ring has
    /// window + spec_k slots, so rejected rows never overwrite a key that is still visible.
    pub spec_k: usize,
    /// K/V stored as FP8 E4M3 (value / scale, with the checkpoint's k_scale / v_scale, else 1.0).
    pub kv_fp8: bool,
    /// Sliding-window layers keep a ring per sequence (off: they store every position, like
    /// full-attention layers; for A/B checks).
    pub rings: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            kv_pool_bytes: None,
            page_size: 64,
            max_rows: 2048,
            progress: true,
            graphs: true,
            gemm_min_rows: 32,
            max_seqs: 8,
            spec_k: 15,
            kv_fp8: false,
            rings: true,
        }
    }
}

/// Whether a CUDA driver and at least one GPU are present (never panics).
pub fn gpu_available() -> std::result::Result<(), String> {
    device::probe()
}

fn cerr<E: std::fmt::Display>(e: E) -> EngineError {
    EngineError::Other(format!("CUDA: {e}"))
}

/// A Linear on the device.
#[derive(Debug, Clone, Copy)]
struct Lin {
    fp4: bool,
    w: u64,
    s: u64,
    inv_gs: f32,
    n: usize,
    k: usize,
}

/// A stack of per-expert matrices [E, n, k].
#[derive(Debug, Clone, Copy)]
struct Stack {
    fp4: bool,
    w: u64,
    s: u64,
    inv: u64,
}

struct Experts {
    gate: Stack,
    up: Stack,
    down: Stack,
}

enum MlpW {
    Dense {
        gate: Lin,
        up: Lin,
        down: Lin,
    },
    Moe {
        router: Lin,
        bias: u64,
        experts: Experts,
        shared: Option<(Lin, Lin, Lin)>,
        folded: bool,
    },
}

struct LayerW {
    input_norm: u64,
    post_norm: u64,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    g: Option<Lin>,
    /// q|k|v|g concatenated (one GEMV) when all four are BF16.
    qkvg: Option<Lin>,
    q_norm: u64,
    k_norm: u64,
    sink: u64,
    inv_freq: u64,
    half: usize,
    attn_factor: f32,
    window: usize,
    nh: usize,
    mlp: MlpW,
    kc: u64,
    vc: u64,
    /// K/V in a per-sequence ring (sliding-window layer with rings on; set by `finish`).
    ring: bool,
    /// FP8 K/V scales (1.0 for BF16 or when the checkpoint has none).
    kscale: f32,
    vscale: f32,
}

/// Device scratch for up to `rows` rows.
struct Scratch {
    rows: usize,
    x: u64,
    hn: u64,
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    attn: u64,
    gu: u64,
    act: u64,
    shared_out: u64,
    rlog: u64,
    ids: u64,
    wts: u64,
    grp_e: u64,
    grp_s: u64,
    grp_c: u64,
    perm: u64,
    meta: u64,
    tiles: u64,
    /// Block counter of router_fused_1 (0 between launches).
    rcount: u64,
    moe_gu: u64,
    /// GEMM inputs split into BF16 hi + lo ([rows, K] each, lo after hi).
    xs: u64,
    /// Query tiles of the pass for attention_prefill: (first row, rows) pairs, and their count.
    atiles: u64,
    natiles: std::cell::Cell<usize>,
    moe_act: u64,
    moe_out: u64,
    tokens: u64,
    pos: u64,
    /// Per-row key end (exclusive) for non-causal draft blocks.
    kend: u64,
    seqrow: u64,
    bt: u64,
    bt_seqs: usize,
    /// Ring tables ([bt_seqs, ring] slot ids) for the sliding-window layers.
    bt_ring: u64,
    /// K and V of a staged pass's rows ([rows, nkv, hd] each, cache element type).
    kstage: u64,
    vstage: u64,
    /// Per row: first row of its sequence in the pass, then (after `rows` ints) its last row.
    sspan: u64,
    /// This pass writes ring layers through the stage (some sequence has more rows than the
    /// ring's spare slots + 1): ring layers run attention_prefill, then ring_commit.
    staged: std::cell::Cell<bool>,
    // logits path
    lrows: usize,
    sel: u64,
    hsel: u64,
    logits: u64,
    amax: u64,
    /// Sampling parameters per sampled row: (temperature, top_k, top_p, u) as f64.
    sparams: u64,
    /// Fixed-point probabilities of sample_rows, DECODE_ROWS rows of vocab.
    samp_e: u64,
    part: u64,
}

/// See [`CudaModel::kv_args`].
struct KvArgs {
    bt: u64,
    max_pages: usize,
    page_size: usize,
    qk_name: &'static str,
    attn_name: &'static str,
    gqa_name: &'static str,
    prefill_name: &'static str,
}

struct SeqState {
    len: usize,
    pages: Vec<u32>,
    /// Ring slot block (rings on).
    ring: Option<u32>,
    /// End of the highest position ever written: the ring holds [ring_hi - R, ring_hi).
    ring_hi: usize,
}

/// Per-kernel-name timing, filled when profiling is on.
#[derive(Debug, Default, Clone)]
pub struct KernelTimes {
    pub by_name: Vec<(String, f64, usize)>,
}

/// Kernel families. The weight-streaming regime (passes below `gemm_min_rows`: decode steps,
/// DFlash propose/verify): each family computes a row with arithmetic that does not depend on
/// the pass size, so decode and verify stay bit-identical whichever set is chosen; `laguna bench`
/// compares each family against the original f32 kernels (`KernelSet::original`) at the real
/// shapes. The long-pass (prefill) regime: `cublas` .. `cublas_router` below (A/B switches; all
/// but the BF16-only ones keep the hi + lo precision). `laguna device-test` compares the default
/// set against the CPU on every fixture. Environment: LAGUNA_KERNELS=original, or a comma list of
/// families to turn on or off (e.g. `-tc_gemv,-attn_gqa`, `+bf16_attn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSet {
    /// BF16 Linears as tensor-core GEMV (`linear_tc_bf16`) instead of f32 SIMT.
    pub tc_gemv: bool,
    /// Multi-row SIMT GEMV with 2 weight rows per warp (`linear_*_m8/_m16`) instead of 8-row `linear_*`.
    pub small_m: bool,
    /// Persistent grouped MoE (`moe_*_s`) instead of one block row per group (`moe_*`, `moe_*_1`).
    pub moe_s: bool,
    /// GQA-packed decode attention (`attention_gqa`) instead of one block per query head.
    pub attn_gqa: bool,
    /// Long passes (prefill): dense BF16 Linears through cuBLAS (hi and lo halves of the
    /// activations as two accumulating GEMMs) when libcublas loads, instead of `gemm_bf16`.
    pub cublas: bool,
    /// Long passes: activations rounded to BF16 alone (vLLM's numerics, one mma per fragment
    /// instead of hi + lo) for the dense Linears (`bf16_dense`), the expert GEMMs (`bf16_moe`) and
    /// Q and P in the prefill attention (`bf16_attn`).
    pub bf16_dense: bool,
    pub bf16_moe: bool,
    pub bf16_attn: bool,
    /// Long passes: the NVFP4 expert down GEMM with 128-output tiles (`moe_gemm_down_fp4_w`: the
    /// same arithmetic per element as the 64-wide tiles; faster for down, K = 512, and slower
    /// for gate/up, K = 2048, which keeps 64: run 63).
    pub moe_wide: bool,
    /// Long passes: in the NVFP4 expert GEMMs a warp whose tile rows are all padding skips its
    /// mma (`moe_gemm_*_k`; the other rows' arithmetic is unchanged; run 65: 107.7 -> 105.1 ms).
    pub moe_skip: bool,
    /// Long passes: SiLU(gate) * up in the NVFP4 gate/up GEMM's epilogue (`moe_gemm_gate_up_fp4_ks`,
    /// interleaved gate / up columns; no f32 gate | up round trip, no `silu_mul_split`).
    pub moe_silu: bool,
    /// Long passes: the router GEMM on cuBLAS too (hi and lo, like the dense Linears).
    pub cublas_router: bool,
}

impl KernelSet {
    pub fn original() -> KernelSet {
        KernelSet {
            tc_gemv: false,
            small_m: false,
            moe_s: false,
            attn_gqa: false,
            cublas: false,
            bf16_dense: false,
            bf16_moe: false,
            bf16_attn: false,
            moe_wide: false,
            moe_skip: false,
            moe_silu: false,
            cublas_router: false,
        }
    }
    pub fn default_set() -> KernelSet {
        KernelSet {
            tc_gemv: true,
            small_m: true,
            moe_s: true,
            attn_gqa: true,
            cublas: true,
            bf16_dense: false,
            bf16_moe: false,
            bf16_attn: false,
            moe_wide: true,
            moe_skip: true,
            moe_silu: true,
            cublas_router: true,
        }
    }
    /// The default set changed by a LAGUNA_KERNELS value: `original`, or a comma list of
    /// families prefixed with `-` (off) or `+`/nothing (on). Err names an unknown family.
    pub fn parse(spec: &str) -> std::result::Result<KernelSet, String> {
        let mut k = KernelSet::default_set();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match item.strip_prefix('-') {
                Some(n) => (false, n),
                None => (true, item.strip_prefix('+').unwrap_or(item)),
            };
            match name {
                "original" => k = KernelSet::original(),
                "default" => k = KernelSet::default_set(),
                "tc_gemv" => k.tc_gemv = on,
                "small_m" => k.small_m = on,
                "moe_s" => k.moe_s = on,
                "attn_gqa" => k.attn_gqa = on,
                "cublas" => k.cublas = on,
                "bf16_dense" => k.bf16_dense = on,
                "bf16_moe" => k.bf16_moe = on,
                "bf16_attn" => k.bf16_attn = on,
                "moe_wide" => k.moe_wide = on,
                "moe_skip" => k.moe_skip = on,
                "moe_silu" => k.moe_silu = on,
                "cublas_router" => k.cublas_router = on,
                _ => return Err(format!("unknown kernel family `{name}` (known: original, default, tc_gemv, small_m, moe_s, attn_gqa, cublas, bf16_dense, bf16_moe, bf16_attn, moe_wide, moe_skip, moe_silu, cublas_router)")),
            }
        }
        Ok(k)
    }
    pub fn from_env() -> KernelSet {
        match std::env::var("LAGUNA_KERNELS") {
            Ok(v) => KernelSet::parse(&v).unwrap_or_else(|e| {
                tracing::warn!("LAGUNA_KERNELS: {e}; using the default kernels");
                KernelSet::default_set()
            }),
            Err(_) => KernelSet::default_set(),
        }
    }
}

/// Loaded weights handed to [`CudaModel::finish`].
struct Parts {
    embed: u64,
    final_norm: u64,
    lm_head: Lin,
    layers: Vec<LayerW>,
    weight_bytes: usize,
    decode_bytes: usize,
    /// Widest GEMM input beyond the model's own (the draft's fc).
    min_in: usize,
}

pub struct CudaModel {
    cfg: LagunaConfig,
    /// Shared with a CUDA draft (same context and stream, so ordering is implicit).
    dev: Arc<Dev>,
    arch: String,
    embed: u64,
    final_norm: u64,
    lm_head: Lin,
    layers: Vec<LayerW>,
    sc: Scratch,
    page_size: usize,
    num_pages: usize,
    max_pages: usize,
    free_pages: Vec<u32>,
    /// Ring slots per sequence (window + spec_k; 0 when no layer has a ring) and the window.
    ring: usize,
    ring_window: usize,
    free_rings: Vec<u32>,
    /// Layers on the paged pool.
    full_layers: usize,
    /// Bytes per cached K (or V) element: 2 (BF16) or 1 (FP8).
    kv_elt: usize,
    seqs: HashMap<SeqId, SeqState>,
    next_id: SeqId,
    taps: Vec<usize>,
    opts: CudaOptions,
    /// Bytes of weights on the device.
    pub weight_bytes: usize,
    /// Bytes one single-row decode step reads from weights (active experts only).
    pub decode_weight_bytes: usize,
    pub load_secs: f64,
    graph: Option<device::Graph>,
    graph_failed: bool,
    /// Captured `decode_step` bodies by batch size.
    step_graphs: HashMap<usize, device::Graph>,
    /// Fused single-row launches (router_fused_1, moe_combine_norm): opt-in with env LAGUNA_FUSE.
    /// Off by default: fewer launches but single-block kernels, 194 vs 202.5 tok/s on the H200
    /// (docs/PERF.md, run 13).
    fuse: bool,
    /// Per-kernel event timing of `forward` passes when set (see `set_profiling`).
    fprof: Option<device::Prof>,
    /// Draft stacks with `dflash_config.causal = false`: a block row sees every key of its block
    /// (per-row key end in `sc.kend`), not only keys up to its position.
    noncausal: bool,
    /// With `taps_on_device`, `forward` leaves the taps of its (single) pass in `taps_dev`
    /// ([rows, taps * hidden] f32) instead of copying them to the host.
    taps_on_device: bool,
    taps_dev: u64,
    /// Which weight-streaming kernel families run (see [`KernelSet`]).
    kset: KernelSet,
    /// (f32 buffer, lo written) whose BF16 split of the current pass sits in `sc.xs`, so a GEMM on
    /// that buffer skips `split_bf16`: only ever sc.hn, set by `norm_rows` in a GEMM pass; reset at
    /// the start of every pass, by `rmsnorm`, by the fused combine + norm and by any split.
    xs_holds: std::cell::Cell<(u64, bool)>,
}

fn bf16_bytes_of(t: &TensorView) -> Result<Vec<u8>> {
    Ok(match t.dtype {
        Dtype::BF16 => t.data.to_vec(),
        Dtype::F16 => t
            .data
            .chunks_exact(2)
            .flat_map(|c| {
                half::bf16::from_f32(half::f16::from_le_bytes([c[0], c[1]]).to_f32()).to_le_bytes()
            })
            .collect(),
        Dtype::F32 => t
            .data
            .chunks_exact(4)
            .flat_map(|c| {
                half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
            })
            .collect(),
        other => {
            return Err(EngineError::Other(format!(
                "{}: cannot put a {other:?} tensor on the device as BF16",
                t.name
            )))
        }
    })
}

fn check_scales(name: &str, s: &[u8]) -> Result<()> {
    if let Some(p) = s.iter().position(|&b| b & 0x7f == 0x7f) {
        return Err(EngineError::Other(format!(
            "{name}: block scale #{p} is NaN (0x{:02x})",
            s[p]
        )));
    }
    if s.iter().any(|&b| b & 0x80 != 0) {
        return Err(EngineError::Other(format!(
            "{name}: negative E4M3 block scales are not valid NVFP4"
        )));
    }
    Ok(())
}

struct Loader<'a> {
    dev: &'a Dev,
    store: &'a WeightStore,
    pb: Option<indicatif::ProgressBar>,
    bytes: usize,
}

impl<'a> Loader<'a> {
    fn tick(&mut self, n: usize) {
        self.bytes += n;
        if let Some(pb) = &self.pb {
            pb.inc(n as u64);
        }
    }
    fn upload(&mut self, data: &[u8]) -> Result<u64> {
        let p = self.dev.alloc(data.len().max(16)).map_err(cerr)?;
        self.dev.htod(p, data).map_err(cerr)?;
        self.tick(data.len());
        Ok(p)
    }
    fn vec_f32(&mut self, name: &str, n: usize) -> Result<u64> {
        let v = self.store.vector(name, n)?;
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.upload(&b)
    }
    fn lin(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Lin> {
        if inp % 16 != 0 {
            return Err(EngineError::Other(format!(
                "{prefix}: input width {inp} is not a multiple of 16 (CUDA kernels need it)"
            )));
        }
        match self.store.linear(prefix, out, inp)? {
            LinearSource::Dense(t) => {
                let b = bf16_bytes_of(&t)?;
                Ok(Lin {
                    fp4: false,
                    w: self.upload(&b)?,
                    s: 0,
                    inv_gs: 1.0,
                    n: out,
                    k: inp,
                })
            }
            LinearSource::Nvfp4 {
                packed,
                scale,
                global_scale,
                ..
            } => {
                check_scales(prefix, scale.data)?;
                let w = self.upload(packed.data)?;
                let s = self.upload(scale.data)?;
                Ok(Lin {
                    fp4: true,
                    w,
                    s,
                    inv_gs: (1.0f64 / global_scale as f64) as f32,
                    n: out,
                    k: inp,
                })
            }
        }
    }
    /// Several BF16 Linears with the same input width stacked by rows into one matrix; None when
    /// any of them is not dense.
    fn lin_cat(&mut self, parts: &[(String, usize)], inp: usize) -> Result<Option<Lin>> {
        let mut srcs = vec![];
        for (p, out) in parts {
            match self.store.linear(p, *out, inp)? {
                LinearSource::Dense(t) => srcs.push(t),
                _ => return Ok(None),
            }
        }
        let total: usize = parts.iter().map(|p| p.1).sum();
        let w = self.dev.alloc(total * inp * 2).map_err(cerr)?;
        let mut off = 0usize;
        for t in srcs {
            let b = bf16_bytes_of(&t)?;
            self.dev.htod(w + off as u64, &b).map_err(cerr)?;
            self.tick(b.len());
            off += b.len();
        }
        Ok(Some(Lin {
            fp4: false,
            w,
            s: 0,
            inv_gs: 1.0,
            n: total,
            k: inp,
        }))
    }

    /// Experts `{prefix}.{e}.{proj}` stacked into one buffer per part.
    fn stack(&mut self, prefixes: &[String], proj: &str, out: usize, inp: usize) -> Result<Stack> {
        let ne = prefixes.len();
        let first = self
            .store
            .linear(&format!("{}.{proj}", prefixes[0]), out, inp)?;
        let fp4 = matches!(first, LinearSource::Nvfp4 { .. });
        let wsz = if fp4 { out * inp / 2 } else { out * inp * 2 };
        let ssz = if fp4 { out * inp / 16 } else { 0 };
        let w = self.dev.alloc(wsz * ne).map_err(cerr)?;
        let s = if fp4 {
            self.dev.alloc(ssz * ne).map_err(cerr)?
        } else {
            0
        };
        let mut inv = vec![1f32; ne];
        for (e, iv) in inv.iter_mut().enumerate() {
            let name = format!("{}.{proj}", prefixes[e]);
            match self.store.linear(&name, out, inp)? {
                LinearSource::Dense(t) if !fp4 => {
                    let b = bf16_bytes_of(&t)?;
                    self.dev.htod(w + (e * wsz) as u64, &b).map_err(cerr)?;
                    self.tick(b.len());
                }
                LinearSource::Nvfp4 {
                    packed,
                    scale,
                    global_scale,
                    ..
                } if fp4 => {
                    check_scales(&name, scale.data)?;
                    self.dev
                        .htod(w + (e * wsz) as u64, packed.data)
                        .map_err(cerr)?;
                    self.dev
                        .htod(s + (e * ssz) as u64, scale.data)
                        .map_err(cerr)?;
                    self.tick(packed.data.len() + scale.data.len());
                    *iv = (1.0f64 / global_scale as f64) as f32;
                }
                _ => {
                    return Err(EngineError::Other(format!(
                        "{name}: experts of one layer mix BF16 and NVFP4 storage"
                    )))
                }
            }
        }
        let ib: Vec<u8> = inv.iter().flat_map(|x| x.to_le_bytes()).collect();
        let inv = self.upload(&ib)?;
        Ok(Stack { fp4, w, s, inv })
    }
}

const NSPLIT: usize = 64;
/// Most sequences one `decode_step` carries (its graphs are kept per batch size).
const DECODE_ROWS: usize = 16;
const SPLIT_ROWS: usize = 64;

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl CudaModel {
    /// Load a model folder onto GPU `opts.device`. Kernels come from the cubin cache (compiled
    /// with NVRTC on a miss: run `laguna warmup` ahead to make this instant).
    pub fn load(dir: &Path, opts: CudaOptions) -> Result<CudaModel> {
        let t0 = std::time::Instant::now();
        let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(dir)?;
        let dev = Dev::new(opts.device).map_err(cerr)?;
        let arch = dev.arch.clone();
        Self::build(cfg, &store, dev, arch, opts, t0)
    }

    fn build(
        cfg: LagunaConfig,
        store: &WeightStore,
        dev: Dev,
        arch: String,
        opts: CudaOptions,
        t0: std::time::Instant,
    ) -> Result<CudaModel> {
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let nkv = cfg.num_kv_heads;
        let kvw = nkv * hd;
        if hd % 8 != 0 {
            return Err(EngineError::Other(format!(
                "head_dim {hd} must be a multiple of 8 for the CUDA attention kernel"
            )));
        }
        if hd > 256 {
            return Err(EngineError::Other(format!(
                "head_dim {hd} > 256 is not supported by the CUDA attention kernel"
            )));
        }
        if h % 16 != 0 {
            return Err(EngineError::Other(format!(
                "hidden_size {h} must be a multiple of 16 for the CUDA backend"
            )));
        }
        if cfg.num_experts > 1024 {
            return Err(EngineError::Other(
                "more than 1024 experts is not supported by the CUDA router".into(),
            ));
        }
        let pb = if opts.progress {
            let pb = indicatif::ProgressBar::new(store.data_bytes());
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "loading weights to the GPU [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .unwrap()
                .progress_chars("=> "),
            );
            Some(pb)
        } else {
            None
        };
        let mut ld = Loader {
            dev: &dev,
            store,
            pb,
            bytes: 0,
        };
        let et = store.expect("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let eb = bf16_bytes_of(&et)?;
        let embed = ld.upload(&eb)?;
        drop(eb);
        let mut decode_bytes = 0usize;
        let lin_bytes = |l: &Lin| {
            if l.fp4 {
                l.n * l.k / 2 + l.n * l.k / 16
            } else {
                l.n * l.k * 2
            }
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, spec) in cfg.layers.iter().enumerate() {
            let p = layer_prefix(i);
            let kvs = kv_scale_pair(store, &p)?;
            let nh = spec.num_heads;
            let qw = nh * hd;
            let gw = cfg.gate_width(i);
            let mut parts = vec![
                (format!("{p}.self_attn.q_proj"), qw),
                (format!("{p}.self_attn.k_proj"), kvw),
                (format!("{p}.self_attn.v_proj"), kvw),
            ];
            if gw > 0 {
                parts.push((format!("{p}.self_attn.g_proj"), gw));
            }
            let qkvg = ld.lin_cat(&parts, h)?;
            let dummy = |n: usize| Lin {
                fp4: false,
                w: 0,
                s: 0,
                inv_gs: 1.0,
                n,
                k: h,
            };
            let (q, k, v, g) = if let Some(f) = &qkvg {
                decode_bytes += lin_bytes(f);
                (
                    dummy(qw),
                    dummy(kvw),
                    dummy(kvw),
                    if gw > 0 { Some(dummy(gw)) } else { None },
                )
            } else {
                let q = ld.lin(&format!("{p}.self_attn.q_proj"), qw, h)?;
                let k = ld.lin(&format!("{p}.self_attn.k_proj"), kvw, h)?;
                let v = ld.lin(&format!("{p}.self_attn.v_proj"), kvw, h)?;
                let g = if gw > 0 {
                    Some(ld.lin(&format!("{p}.self_attn.g_proj"), gw, h)?)
                } else {
                    None
                };
                for l in [&q, &k, &v].into_iter().chain(g.iter()) {
                    decode_bytes += lin_bytes(l);
                }
                (q, k, v, g)
            };
            let o = ld.lin(&format!("{p}.self_attn.o_proj"), h, qw)?;
            decode_bytes += lin_bytes(&o);
            let mlp = match spec.mlp {
                MlpKind::Dense => {
                    let gate = ld.lin(&format!("{p}.mlp.gate_proj"), cfg.intermediate_size, h)?;
                    let up = ld.lin(&format!("{p}.mlp.up_proj"), cfg.intermediate_size, h)?;
                    let down = ld.lin(&format!("{p}.mlp.down_proj"), h, cfg.intermediate_size)?;
                    decode_bytes += lin_bytes(&gate) + lin_bytes(&up) + lin_bytes(&down);
                    MlpW::Dense { gate, up, down }
                }
                MlpKind::Sparse => {
                    let router = ld.lin(&format!("{p}.mlp.gate"), cfg.num_experts, h)?;
                    let bias = ld.vec_f32(
                        &format!("{p}.mlp.experts.e_score_correction_bias"),
                        cfg.num_experts,
                    )?;
                    let im = cfg.moe_intermediate_size;
                    if im % 16 != 0 {
                        return Err(EngineError::Other(format!(
                            "moe_intermediate_size {im} must be a multiple of 16"
                        )));
                    }
                    let ep = format!("{p}.mlp.experts");
                    let sp = format!("{p}.mlp.shared_expert");
                    // The shared expert rides along as expert E (one fixed extra slot per row) when
                    // it has the routed experts' shape and storage: 4 fewer launches per layer.
                    let is_fp4 = |name: String, o: usize, i: usize| -> Result<bool> {
                        Ok(matches!(
                            store.linear(&name, o, i)?,
                            LinearSource::Nvfp4 { .. }
                        ))
                    };
                    let folded = cfg.shared_expert_intermediate_size == im
                        && std::env::var_os("LAGUNA_NO_FOLD_SHARED").is_none()
                        && is_fp4(format!("{ep}.0.gate_proj"), im, h)?
                            == is_fp4(format!("{sp}.gate_proj"), im, h)?
                        && is_fp4(format!("{ep}.0.up_proj"), im, h)?
                            == is_fp4(format!("{sp}.up_proj"), im, h)?
                        && is_fp4(format!("{ep}.0.down_proj"), h, im)?
                            == is_fp4(format!("{sp}.down_proj"), h, im)?;
                    let mut prefixes: Vec<String> =
                        (0..cfg.num_experts).map(|e| format!("{ep}.{e}")).collect();
                    if folded {
                        prefixes.push(sp.clone());
                    }
                    let gate = ld.stack(&prefixes, "gate_proj", im, h)?;
                    let up = ld.stack(&prefixes, "up_proj", im, h)?;
                    let down = ld.stack(&prefixes, "down_proj", h, im)?;
                    let per = |fp4: bool, n: usize, k: usize| {
                        if fp4 {
                            n * k / 2 + n * k / 16
                        } else {
                            n * k * 2
                        }
                    };
                    decode_bytes += lin_bytes(&router)
                        + (cfg.top_k + folded as usize)
                            * (per(gate.fp4, im, h) + per(up.fp4, im, h) + per(down.fp4, h, im));
                    let shared = if folded {
                        None
                    } else if cfg.shared_expert_intermediate_size > 0 {
                        let si = cfg.shared_expert_intermediate_size;
                        let sp = format!("{p}.mlp.shared_expert");
                        let a = ld.lin(&format!("{sp}.gate_proj"), si, h)?;
                        let b = ld.lin(&format!("{sp}.up_proj"), si, h)?;
                        let c = ld.lin(&format!("{sp}.down_proj"), h, si)?;
                        decode_bytes += lin_bytes(&a) + lin_bytes(&b) + lin_bytes(&c);
                        Some((a, b, c))
                    } else {
                        None
                    };
                    MlpW::Moe {
                        router,
                        bias,
                        experts: Experts { gate, up, down },
                        shared,
                        folded,
                    }
                }
            };
            let inv_freq = spec.rope.inv_freq();
            let half = inv_freq.len();
            let ifb: Vec<u8> = inv_freq.iter().flat_map(|x| x.to_le_bytes()).collect();
            let window = match (spec.attn, cfg.sliding_window) {
                (AttnKind::Sliding, Some(w)) => w,
                _ => 0,
            };
            layers.push(LayerW {
                input_norm: ld.vec_f32(&format!("{p}.input_layernorm.weight"), h)?,
                post_norm: ld.vec_f32(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q,
                k,
                v,
                o,
                g,
                qkvg,
                q_norm: ld.vec_f32(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                k_norm: ld.vec_f32(&format!("{p}.self_attn.k_norm.weight"), hd)?,
                sink: if spec.sinks {
                    ld.vec_f32(&format!("{p}.self_attn.sink"), nh)?
                } else {
                    0
                },
                inv_freq: ld.upload(&ifb)?,
                half,
                attn_factor: spec.rope.attention_factor as f32,
                window,
                nh,
                mlp,
                kc: 0,
                vc: 0,
                ring: false,
                kscale: kvs.0,
                vscale: kvs.1,
            });
        }
        let final_norm = ld.vec_f32("model.norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            Lin {
                fp4: false,
                w: embed,
                s: 0,
                inv_gs: 1.0,
                n: cfg.vocab_size,
                k: h,
            }
        } else {
            ld.lin("lm_head", cfg.vocab_size, h)?
        };
        decode_bytes += lin_bytes(&lm_head);
        let weight_bytes = ld.bytes;
        if let Some(pb) = ld.pb.take() {
            pb.finish_and_clear();
        }
        drop(ld);
        let parts = Parts {
            embed,
            final_norm,
            lm_head,
            layers,
            weight_bytes,
            decode_bytes,
            min_in: 0,
        };
        Self::finish(cfg, Arc::new(dev), arch, opts, t0, parts)
    }

    /// Scratch, K/V pool and the model around loaded weights (target or draft stack).
    fn finish(
        cfg: LagunaConfig,
        dev: Arc<Dev>,
        arch: String,
        opts: CudaOptions,
        t0: std::time::Instant,
        parts: Parts,
    ) -> Result<CudaModel> {
        let Parts {
            embed,
            final_norm,
            lm_head,
            layers,
            weight_bytes,
            decode_bytes,
            min_in,
        } = parts;
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let nkv = cfg.num_kv_heads;
        let kvw = nkv * hd;
        // Scratch.
        let r = opts.max_rows.max(1);
        let max_qw = cfg
            .layers
            .iter()
            .map(|l| l.num_heads * hd)
            .max()
            .unwrap_or(0);
        let max_gw = (0..cfg.num_layers)
            .map(|i| cfg.gate_width(i))
            .max()
            .unwrap_or(0)
            .max(1);
        let inter = cfg
            .intermediate_size
            .max(cfg.shared_expert_intermediate_size)
            .max(16);
        let e = cfg.num_experts.max(1);
        let kk = cfg.top_k.max(1) + 1;
        let im = cfg.moe_intermediate_size.max(16);
        let f = 4usize;
        let lrows = r.min(256);
        let bt_seqs = r.min(64);
        let page_size = opts.page_size.max(1);
        let max_pages_pos = ceil_div(cfg.max_position_embeddings.max(1), page_size);
        // K/V: rings for the sliding-window layers (window + spec_k slots per sequence, max_seqs
        // sequences) come out of the budget first; the rest is pages for the full-attention layers.
        let elt = if opts.kv_fp8 { 1 } else { 2 };
        let mut layers = layers;
        for l in layers.iter_mut() {
            l.ring = opts.rings && l.window > 0;
            if !opts.kv_fp8 {
                (l.kscale, l.vscale) = (1.0, 1.0);
            }
        }
        let max_seqs = opts.max_seqs.max(1);
        let (free, _total) = dev.mem_info().map_err(cerr)?;
        let scratch_est =
            f * r * (4 * h + 2 * max_qw + 2 * kvw + max_gw + 3 * inter + e + kk * (3 * im + h) + 8)
                + lrows * (h + cfg.vocab_size) * 4
                + DECODE_ROWS * cfg.vocab_size * 8;
        let pool = opts
            .kv_pool_bytes
            .unwrap_or_else(|| (free.saturating_sub(scratch_est) / 2).min(16 << 30));
        let windows: Vec<usize> = layers.iter().map(|l| l.window).collect();
        let lay = ring::kv_layout(
            &windows,
            opts.rings,
            opts.spec_k,
            max_seqs,
            kvw,
            elt,
            page_size,
            pool,
        )
        .map_err(EngineError::Other)?;
        let (ring, ring_window, full_layers, num_pages) =
            (lay.ring, lay.window, lay.full_layers, lay.pages);
        let max_pages = max_pages_pos.min(num_pages).max(1);
        let a = |n: usize| dev.alloc(n.max(16)).map_err(cerr);
        let sc = Scratch {
            rows: r,
            x: a(f * r * h)?,
            hn: a(f * r * h)?,
            q: a(f * r * (max_qw + 2 * kvw + max_gw))?,
            k: a(f * r * kvw)?,
            v: a(f * r * kvw)?,
            g: a(f * r * max_gw)?,
            attn: a(f * r * max_qw)?,
            gu: a(f * r * 2 * inter)?,
            act: a(f * r * inter)?,
            shared_out: a(f * r * h)?,
            rlog: a(f * r * e)?,
            ids: a(4 * r * kk)?,
            wts: a(4 * r * kk)?,
            grp_e: a(4 * r * kk)?,
            grp_s: a(4 * r * kk)?,
            grp_c: a(4 * r * kk)?,
            perm: a(4 * r * kk)?,
            meta: a(16)?,
            tiles: a(8 * (r * kk / 64 + e + 2))?,
            rcount: a(16)?,
            atiles: a(8 * (r / 64 + r.min(64) + 2))?,
            natiles: std::cell::Cell::new(0),
            moe_gu: a(f * r * kk * 2 * im)?,
            xs: a(4 * r * h.max(max_qw).max(inter).max(kk * im).max(min_in))?,
            kend: a(4 * r)?,
            moe_act: a(f * r * kk * im)?,
            moe_out: a(f * r * kk * h)?,
            tokens: a(4 * r)?,
            pos: a(4 * r)?,
            seqrow: a(4 * r)?,
            bt: a(4 * bt_seqs * max_pages)?,
            bt_seqs,
            bt_ring: a(4 * bt_seqs * ring)?,
            kstage: a(if ring > 0 { r * kvw * elt } else { 0 })?,
            vstage: a(if ring > 0 { r * kvw * elt } else { 0 })?,
            sspan: a(8 * r)?,
            staged: std::cell::Cell::new(false),
            lrows,
            sel: a(4 * lrows)?,
            hsel: a(f * lrows * h)?,
            logits: a(f * lrows * cfg.vocab_size)?,
            amax: a(4 * lrows)?,
            sparams: a(8 * 4 * lrows)?,
            samp_e: a(8 * DECODE_ROWS * cfg.vocab_size)?,
            part: a(f
                * SPLIT_ROWS.min(r)
                * cfg.layers.iter().map(|l| l.num_heads).max().unwrap_or(1)
                * NSPLIT
                * (hd + 2))?,
        };
        dev.htod(sc.rcount, &[0u8; 16]).map_err(cerr)?;
        let page_elems = num_pages * page_size * kvw;
        let ring_elems = max_seqs * ring * kvw;
        if page_elems.max(ring_elems) >= 1 << 31 {
            return Err(EngineError::Other(format!(
                "K/V pool of {num_pages} pages is too large for 31-bit offsets; give a smaller pool"
            )));
        }
        for l in layers.iter_mut() {
            let n = if l.ring {
                ring_elems
            } else if full_layers > 0 {
                page_elems
            } else {
                0
            };
            l.kc = dev.alloc((n * elt).max(16)).map_err(cerr)?;
            l.vc = dev.alloc((n * elt).max(16)).map_err(cerr)?;
        }
        dev.sync().map_err(cerr)?;
        let free_pages = (0..num_pages as u32).rev().collect();
        Ok(CudaModel {
            cfg,
            dev,
            arch,
            embed,
            final_norm,
            lm_head,
            layers,
            sc,
            page_size,
            num_pages,
            max_pages,
            free_pages,
            ring,
            ring_window,
            free_rings: (0..if ring > 0 { max_seqs as u32 } else { 0 })
                .rev()
                .collect(),
            full_layers,
            kv_elt: elt,
            seqs: HashMap::new(),
            next_id: 1,
            taps: vec![],
            opts,
            weight_bytes,
            decode_weight_bytes: decode_bytes,
            load_secs: t0.elapsed().as_secs_f64(),
            graph: None,
            graph_failed: false,
            step_graphs: HashMap::new(),
            fuse: std::env::var_os("LAGUNA_FUSE").is_some(),
            fprof: None,
            noncausal: false,
            taps_on_device: false,
            taps_dev: 0,
            kset: KernelSet::from_env(),
            xs_holds: std::cell::Cell::new((0, false)),
        })
    }

    /// Time every kernel of later `forward` calls with CUDA events (slows them down a little).
    pub fn set_profiling(&mut self, on: bool) {
        self.fprof = if on {
            Some(device::Prof::default())
        } else {
            None
        };
    }
    /// (kernel, total ms, launches) accumulated since `set_profiling(true)`, largest first.
    pub fn take_profile(&mut self) -> Vec<(String, f64, usize)> {
        self.fprof.as_mut().map(|p| p.summary()).unwrap_or_default()
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn device_name(&self) -> String {
        self.dev.name.clone()
    }
    /// K/V pool of the full-attention layers: (pages, positions per page, bytes).
    pub fn kv_pool(&self) -> (usize, usize, usize) {
        let kvw = self.cfg.num_kv_heads * self.cfg.head_dim;
        (
            self.num_pages,
            self.page_size,
            self.num_pages * self.page_size * kvw * 2 * self.kv_elt * self.full_layers,
        )
    }
    /// Sliding-window rings: (slots per sequence, sequences, bytes); slots 0 when none.
    pub fn kv_rings(&self) -> (usize, usize, usize) {
        let kvw = self.cfg.num_kv_heads * self.cfg.head_dim;
        let n = self.layers.iter().filter(|l| l.ring).count();
        let seqs = if self.ring > 0 {
            self.opts.max_seqs.max(1)
        } else {
            0
        };
        (
            self.ring,
            seqs,
            n * seqs * self.ring * kvw * 2 * self.kv_elt,
        )
    }
    /// Positions one sequence can hold (the paged pool's, or the model's limit with no full layer).
    pub fn kv_capacity(&self) -> usize {
        if self.full_layers == 0 {
            self.cfg.max_position_embeddings
        } else {
            self.max_pages * self.page_size
        }
    }
    /// Rows a sequence may write beyond what it keeps without losing a visible key (rings), or
    /// None when no layer has a ring (any rewind is safe).
    pub fn ring_spare(&self) -> Option<usize> {
        (self.ring > 0).then(|| self.ring - self.ring_window)
    }
    /// Whether K/V are stored as FP8 E4M3.
    pub fn kv_fp8(&self) -> bool {
        self.kv_elt == 1
    }
    pub fn dev(&self) -> &Dev {
        &self.dev
    }

    fn ensure_pages(&mut self, seq: SeqId, upto: usize) -> Result<()> {
        if self.full_layers == 0 {
            if upto > self.cfg.max_position_embeddings {
                return Err(EngineError::Request(format!(
                    "sequence needs {upto} positions but the model allows {}",
                    self.cfg.max_position_embeddings
                )));
            }
            return Ok(());
        }
        let need = ceil_div(upto, self.page_size);
        if need > self.max_pages {
            return Err(EngineError::Request(format!(
                "sequence needs {upto} positions but the K/V plan allows {} ({} pages of {})",
                self.max_pages * self.page_size,
                self.max_pages,
                self.page_size
            )));
        }
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))?;
        while s.pages.len() < need {
            match self.free_pages.pop() {
                Some(p) => s.pages.push(p),
                None => {
                    return Err(EngineError::Request(format!(
                        "the K/V pool is full ({} pages of {} positions); free sequences or give a larger pool",
                        self.num_pages, self.page_size
                    )))
                }
            }
        }
        Ok(())
    }

    /// Launch every layer for the `m` rows whose metadata is already on the device.
    fn run_layers(&self, m: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        self.run_layers_hooked(m, prof, None)
    }

    #[allow(clippy::type_complexity)]
    fn run_layers_hooked(
        &self,
        m: usize,
        prof: &mut Option<device::Prof>,
        mut after: Option<&mut dyn FnMut(usize) -> Result<()>>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let sc = &self.sc;
        let d = &self.dev;
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let nkv = cfg.num_kv_heads;
        let kvw = nkv * hd;
        let eps = cfg.rms_norm_eps as f32;
        self.xs_holds.set((0, false));
        d.launch_p(prof, "embed", (m as u32, 1, 1), (256, 1, 1), 0, |b| {
            b.u64(self.embed).u64(sc.tokens).u64(sc.x).i32(h as i32);
        })
        .map_err(cerr)?;
        // The previous layer's MoE combine already wrote this layer's input norm into hn.
        let mut normed = false;
        for (li, l) in self.layers.iter().enumerate() {
            let nh = l.nh;
            let qw = nh * hd;
            let gemm_pass = m >= self.opts.gemm_min_rows;
            if !normed {
                self.norm_rows(prof, l.input_norm, m, eps, gemm_pass)?;
            }
            normed = false;
            let gw = l.g.map_or(0, |g| g.n);
            let (qp, kp, vp, gp, ldq, ldkv, ldg) = if let Some(f) = &l.qkvg {
                self.linear(prof, "attn_proj", f, sc.hn, h, sc.q, f.n, m, false)?;
                let q = sc.q;
                (
                    q,
                    q + 4 * qw as u64,
                    q + 4 * (qw + kvw) as u64,
                    q + 4 * (qw + 2 * kvw) as u64,
                    f.n,
                    f.n,
                    f.n,
                )
            } else {
                self.linear(prof, "attn_proj", &l.q, sc.hn, h, sc.q, qw, m, false)?;
                self.linear(prof, "attn_proj", &l.k, sc.hn, h, sc.k, kvw, m, false)?;
                self.linear(prof, "attn_proj", &l.v, sc.hn, h, sc.v, kvw, m, false)?;
                if let Some(g) = &l.g {
                    self.linear(prof, "attn_proj", g, sc.hn, h, sc.g, gw, m, false)?;
                }
                (sc.q, sc.k, sc.v, sc.g, qw, kvw, gw.max(1))
            };
            let blk = (hd as u32).div_ceil(32) * 32;
            let kv = self.kv_args(l);
            let staged = l.ring && sc.staged.get();
            let (ks, vs) = if staged {
                (sc.kstage, sc.vstage)
            } else {
                (0, 0)
            };
            d.launch_p(
                prof,
                kv.qk_name,
                (m as u32, (nh + nkv).div_ceil(4) as u32, 1),
                (128, 1, 1),
                0,
                |b| {
                    b.u64(qp)
                        .i32(ldq as i32)
                        .u64(kp)
                        .u64(vp)
                        .i32(ldkv as i32)
                        .u64(l.q_norm)
                        .u64(l.k_norm)
                        .u64(l.inv_freq)
                        .i32(l.half as i32)
                        .f32(l.attn_factor)
                        .f32(eps)
                        .u64(sc.pos)
                        .u64(sc.seqrow)
                        .u64(kv.bt)
                        .i32(kv.max_pages as i32)
                        .i32(kv.page_size as i32)
                        .u64(l.kc)
                        .u64(l.vc)
                        .i32(nh as i32)
                        .i32(nkv as i32)
                        .i32(hd as i32)
                        .u64(ks)
                        .u64(vs)
                        .f32(1.0 / l.kscale)
                        .f32(1.0 / l.vscale);
                },
            )
            .map_err(cerr)?;
            let gate_mode = match (l.g.is_some(), cfg.gating) {
                (false, _) | (_, Gating::None) => 0,
                (true, Gating::PerHead) => 1,
                (true, Gating::PerElement) => 2,
            };
            let ablk = if hd <= 128 { 128 } else { 256 };
            // Split-KV (flash-decoding) for small batches: fixed split count, so a row's result
            // depends on its own length only.
            let nsplit = if m <= SPLIT_ROWS { NSPLIT } else { 1 };
            let flash = staged
                || (m >= self.opts.gemm_min_rows
                    && hd % 16 == 0
                    && hd <= 128
                    && nh % nkv == 0
                    && !self.noncausal);
            // Arguments shared by the prefill and the decode attention kernels.
            let common = |b: &mut device::Args| {
                b.u64(qp)
                    .i32(ldq as i32)
                    .u64(sc.attn)
                    .i32(qw as i32)
                    .u64(l.kc)
                    .u64(l.vc)
                    .u64(sc.pos)
                    .u64(sc.seqrow)
                    .u64(kv.bt)
                    .i32(kv.max_pages as i32)
                    .i32(kv.page_size as i32)
                    .i32(nh as i32)
                    .i32(nkv as i32)
                    .i32(hd as i32)
                    .i32(l.window as i32)
                    .u64(l.sink)
                    .u64(gp)
                    .i32(ldg as i32)
                    .i32(gate_mode)
                    // The K scale folds into the softmax scale; the V scale multiplies the output.
                    .f32(((1.0 / (hd as f64).sqrt()) * l.kscale as f64) as f32)
                    .f32(l.vscale);
            };
            if flash {
                let pname = match (kv.prefill_name, self.kset.bf16_attn) {
                    ("attention_prefill", true) => "attention_prefill_h",
                    ("attention_prefill_fp8", true) => "attention_prefill_fp8_h",
                    (n, _) => n,
                };
                // In a GEMM pass the output goes straight to the BF16 split the o_proj GEMM reads
                // (its lo half unless the dense GEMMs take BF16 alone).
                let to_xs = gemm_pass;
                let xs_lo = !self.kset.bf16_dense;
                d.launch_p(
                    prof,
                    pname,
                    (sc.natiles.get() as u32, nh as u32, 1),
                    (128, 1, 1),
                    0,
                    |b| {
                        common(b);
                        b.u64(sc.atiles)
                            .u64(ks)
                            .u64(vs)
                            .u64(sc.sspan)
                            .u64(if to_xs { sc.xs } else { 0 })
                            .i32(m as i32);
                    },
                )
                .map_err(cerr)?;
                self.xs_holds
                    .set(if to_xs { (sc.attn, xs_lo) } else { (0, false) });
                if staged {
                    let rowb = kvw * self.kv_elt;
                    d.launch_p(prof, "ring_commit", (m as u32, 1, 1), (64, 1, 1), 0, |b| {
                        b.u64(ks)
                            .u64(vs)
                            .u64(sc.pos)
                            .u64(sc.seqrow)
                            .u64(sc.sspan + 4 * sc.rows as u64)
                            .u64(kv.bt)
                            .i32(kv.max_pages as i32)
                            .u64(l.kc)
                            .u64(l.vc)
                            .i32(rowb as i32);
                    })
                    .map_err(cerr)?;
                }
            } else {
                let group = if nh % nkv == 0 { nh / nkv } else { 0 };
                let gqa =
                    self.kset.attn_gqa && hd % 8 == 0 && hd <= 128 && (1..=16).contains(&group);
                let (aname, agrid, ablk) = if gqa {
                    (
                        kv.gqa_name,
                        (m as u32, nkv as u32, nsplit as u32),
                        (32 * group) as u32,
                    )
                } else {
                    (kv.attn_name, (m as u32, nh as u32, nsplit as u32), ablk)
                };
                d.launch_p(prof, aname, agrid, (ablk, 1, 1), 0, |b| {
                    common(b);
                    b.i32(nsplit as i32)
                        .u64(sc.part)
                        .u64(if self.noncausal { sc.kend } else { 0 });
                })
                .map_err(cerr)?;
                if nsplit > 1 {
                    d.launch_p(
                        prof,
                        "attention_merge",
                        (m as u32, nh as u32, 1),
                        (blk, 1, 1),
                        0,
                        |b| {
                            b.u64(sc.part)
                                .i32(nsplit as i32)
                                .u64(sc.attn)
                                .i32(qw as i32)
                                .i32(nh as i32)
                                .i32(hd as i32)
                                .u64(l.sink)
                                .u64(gp)
                                .i32(ldg as i32)
                                .i32(gate_mode)
                                .u64(sc.pos)
                                .i32(l.window as i32)
                                .u64(if self.noncausal { sc.kend } else { 0 })
                                .f32(l.vscale);
                        },
                    )
                    .map_err(cerr)?;
                }
            }
            self.linear(prof, "attn_proj", &l.o, sc.attn, qw, sc.x, h, m, true)?;
            self.norm_rows(prof, l.post_norm, m, eps, gemm_pass)?;
            match &l.mlp {
                MlpW::Dense { gate, up, down } => {
                    self.ffn(prof, gate, up, down, m, sc.x, true)?;
                }
                MlpW::Moe {
                    router,
                    bias,
                    experts,
                    shared,
                    folded,
                } => {
                    let e = cfg.num_experts;
                    let k = cfg.top_k;
                    let kk = k + *folded as usize;
                    let ne = e + *folded as usize;
                    // One row: the router writes the expert groups itself (no moe_group launch).
                    let gemm = m >= self.opts.gemm_min_rows;
                    let direct = m == 1 && kk <= 32 && !gemm;
                    if self.fuse && direct && !router.fp4 && h * 4 <= 48 * 1024 {
                        // One launch: router GEMV + top-k + grouping (same arithmetic as the pair).
                        d.launch_p(
                            prof,
                            "router_fused_1",
                            (ceil_div(e, 16) as u32, 1, 1),
                            (256, 1, 1),
                            (h * 4) as u32,
                            |b| {
                                b.u64(router.w)
                                    .u64(sc.hn)
                                    .u64(sc.rlog)
                                    .i32(h as i32)
                                    .i32(e as i32)
                                    .u64(sc.rcount)
                                    .u64(*bias)
                                    .i32(k as i32)
                                    .f32(cfg.router_softcap as f32)
                                    .i32(cfg.norm_topk_prob as i32)
                                    .u64(sc.ids)
                                    .u64(sc.wts)
                                    .i32(*folded as i32)
                                    .f32((1.0 / cfg.routed_scaling_factor) as f32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta);
                            },
                        )
                        .map_err(cerr)?;
                    } else {
                        self.linear(prof, "router", router, sc.hn, h, sc.rlog, e, m, false)?;
                        d.launch_p(prof, "router_topk", (m as u32, 1, 1), (32, 1, 1), 0, |b| {
                            b.u64(sc.rlog)
                                .u64(*bias)
                                .i32(e as i32)
                                .i32(k as i32)
                                .f32(cfg.router_softcap as f32)
                                .i32(cfg.norm_topk_prob as i32)
                                .u64(sc.ids)
                                .u64(sc.wts)
                                .i32(*folded as i32)
                                .f32((1.0 / cfg.routed_scaling_factor) as f32);
                            if direct {
                                b.u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta);
                            } else {
                                b.u64(0).u64(0).u64(0).u64(0).u64(0);
                            }
                        })
                        .map_err(cerr)?;
                    }
                    let s = m * kk;
                    if !direct {
                        d.launch_p(
                            prof,
                            "moe_group",
                            (1, 1, 1),
                            (s.div_ceil(32).clamp(1, 32) as u32 * 32, 1, 1),
                            (8 * ne) as u32,
                            |b| {
                                b.u64(sc.ids)
                                    .i32(s as i32)
                                    .i32(ne as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(if gemm { sc.tiles } else { 0 });
                            },
                        )
                        .map_err(cerr)?;
                    }
                    let groups = s.min(ne) as u32;
                    let im = cfg.moe_intermediate_size;
                    if gemm {
                        let max_tiles = (s / 64 + s.min(ne) + 1) as u32;
                        let wide = experts.down.fp4 && self.kset.moe_wide && !self.kset.bf16_moe;
                        let tn = if wide { 128 } else { 64 };
                        let skip = self.kset.moe_skip;
                        // SiLU fused into the gate/up epilogue: it writes the down GEMM's input
                        // split into sc.moe_gu (bf16 [s, im], lo at + s * im), not f32 gate | up.
                        let fused = experts.gate.fp4 && !self.kset.bf16_moe && self.kset.moe_silu;
                        let gu_name = match (experts.gate.fp4, self.kset.bf16_moe) {
                            (true, false) if fused => "moe_gemm_gate_up_fp4_ks",
                            (true, false) if skip => "moe_gemm_gate_up_fp4_k",
                            (true, false) => "moe_gemm_gate_up_fp4",
                            (false, false) => "moe_gemm_gate_up_bf16",
                            (true, true) => "moe_gemm_gate_up_fp4_h",
                            (false, true) => "moe_gemm_gate_up_bf16_h",
                        };
                        // sc.xs already holds hn split to hi/lo: the router GEMM of this pass
                        // (same rows, same K) split it and nothing wrote xs since.
                        d.launch_p(
                            prof,
                            gu_name,
                            (ceil_div(2 * im, 64) as u32, max_tiles, 1),
                            (128, 1, 1),
                            0,
                            |b| {
                                b.u64(experts.gate.w)
                                    .u64(experts.gate.s)
                                    .u64(experts.gate.inv)
                                    .u64(experts.up.w)
                                    .u64(experts.up.s)
                                    .u64(experts.up.inv)
                                    .u64(sc.xs)
                                    .u64((m * h) as u64)
                                    .i32(h as i32)
                                    .i32(im as i32)
                                    .i32(kk as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(sc.tiles)
                                    .u64(sc.moe_gu);
                                if fused {
                                    b.u64((s * im) as u64);
                                }
                            },
                        )
                        .map_err(cerr)?;
                        let act = if fused {
                            sc.moe_gu
                        } else {
                            // SiLU(gate) * up straight into the BF16 split the down GEMM reads.
                            let lo = !self.kset.bf16_moe;
                            d.launch_p(
                                prof,
                                "silu_mul_split",
                                (ceil_div(im, 256) as u32, s.min(65535) as u32, 1),
                                (256, 1, 1),
                                0,
                                |b| {
                                    b.u64(sc.moe_gu)
                                        .u64(sc.xs)
                                        .i32(s as i32)
                                        .i32(im as i32)
                                        .i32(lo as i32);
                                },
                            )
                            .map_err(cerr)?;
                            sc.xs
                        };
                        let dn_name = match (experts.down.fp4, self.kset.bf16_moe) {
                            (true, false) if wide && skip => "moe_gemm_down_fp4_wk",
                            (true, false) if wide => "moe_gemm_down_fp4_w",
                            (true, false) => "moe_gemm_down_fp4",
                            (false, false) => "moe_gemm_down_bf16",
                            (true, true) => "moe_gemm_down_fp4_h",
                            (false, true) => "moe_gemm_down_bf16_h",
                        };
                        d.launch_p(
                            prof,
                            dn_name,
                            (ceil_div(h, tn) as u32, max_tiles, 1),
                            (128, 1, 1),
                            0,
                            |b| {
                                b.u64(experts.down.w)
                                    .u64(experts.down.s)
                                    .u64(experts.down.inv)
                                    .u64(act)
                                    .u64((s * im) as u64)
                                    .i32(h as i32)
                                    .i32(im as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(sc.tiles)
                                    .u64(sc.moe_out);
                            },
                        )
                        .map_err(cerr)?;
                    } else {
                        // Weight-streaming regime (decode, DFlash verify, any pass below
                        // gemm_min_rows). `moe_*_s`: persistent grouped kernels with the same
                        // per-slot arithmetic whatever the number of rows; otherwise one block row
                        // per group (`_1`: single-slot groups of a 1-row pass, activation staged).
                        // Both families take the same arguments.
                        let (gu_name, gu_grid, gu_shm, dn_name, dn_grid, dn_shm) =
                            if self.kset.moe_s && h % 16 == 0 && im % 16 == 0 {
                                let gb = (d.sms * 2).min(ceil_div(s * im / 2, 8) as u32).max(1);
                                let db = (d.sms * 2).min(ceil_div(s * h / 4, 8) as u32).max(1);
                                let (g, dn) = if experts.gate.fp4 {
                                    ("moe_gate_up_fp4_s", "moe_down_fp4_s")
                                } else {
                                    ("moe_gate_up_bf16_s", "moe_down_bf16_s")
                                };
                                (g, (gb, 1, 1), 0, dn, (db, 1, 1), 0)
                            } else {
                                let one = m == 1 && h * 4 <= 48 * 1024 && im * 4 <= 48 * 1024;
                                let g = match (experts.gate.fp4, one) {
                                    (true, false) => "moe_gate_up_fp4",
                                    (false, false) => "moe_gate_up_bf16",
                                    (true, true) => "moe_gate_up_fp4_1",
                                    (false, true) => "moe_gate_up_bf16_1",
                                };
                                let dn = match (experts.down.fp4, one) {
                                    (true, false) => "moe_down_fp4",
                                    (false, false) => "moe_down_bf16",
                                    (true, true) => "moe_down_fp4_1",
                                    (false, true) => "moe_down_bf16_1",
                                };
                                let (gs, ds) = if one {
                                    ((h * 4) as u32, (im * 4) as u32)
                                } else {
                                    (0, 0)
                                };
                                (
                                    g,
                                    (ceil_div(im, 8) as u32, groups, 1),
                                    gs,
                                    dn,
                                    (ceil_div(h, 8) as u32, groups, 1),
                                    ds,
                                )
                            };
                        d.launch_p(prof, gu_name, gu_grid, (256, 1, 1), gu_shm, |b| {
                            b.u64(experts.gate.w)
                                .u64(experts.gate.s)
                                .u64(experts.gate.inv)
                                .u64(experts.up.w)
                                .u64(experts.up.s)
                                .u64(experts.up.inv)
                                .u64(sc.hn)
                                .i32(h as i32)
                                .i32(im as i32)
                                .i32(kk as i32)
                                .u64(sc.grp_e)
                                .u64(sc.grp_s)
                                .u64(sc.grp_c)
                                .u64(sc.perm)
                                .u64(sc.meta)
                                .u64(sc.moe_act);
                        })
                        .map_err(cerr)?;
                        d.launch_p(prof, dn_name, dn_grid, (256, 1, 1), dn_shm, |b| {
                            b.u64(experts.down.w)
                                .u64(experts.down.s)
                                .u64(experts.down.inv)
                                .u64(sc.moe_act)
                                .i32(h as i32)
                                .i32(im as i32)
                                .u64(sc.grp_e)
                                .u64(sc.grp_s)
                                .u64(sc.grp_c)
                                .u64(sc.perm)
                                .u64(sc.meta)
                                .u64(sc.moe_out);
                        })
                        .map_err(cerr)?;
                    }
                    let sh = if let Some((a, b2, c)) = shared {
                        self.ffn(prof, a, b2, c, m, sc.shared_out, false)?;
                        sc.shared_out
                    } else {
                        0
                    };
                    if let Some(next) = self.layers.get(li + 1).filter(|_| self.fuse) {
                        let blk = (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32;
                        d.launch_p(
                            prof,
                            "moe_combine_norm",
                            (m as u32, 1, 1),
                            (blk, 1, 1),
                            0,
                            |b| {
                                b.u64(sc.x)
                                    .u64(sc.moe_out)
                                    .u64(sc.wts)
                                    .u64(sh)
                                    .i32(h as i32)
                                    .i32(kk as i32)
                                    .f32(cfg.routed_scaling_factor as f32)
                                    .u64(next.input_norm)
                                    .u64(sc.hn)
                                    .f32(eps);
                            },
                        )
                        .map_err(cerr)?;
                        self.xs_holds.set((0, false));
                        normed = true;
                    } else {
                        d.launch_p(
                            prof,
                            "moe_combine",
                            (ceil_div(h, 256) as u32, m as u32, 1),
                            (256, 1, 1),
                            0,
                            |b| {
                                b.u64(sc.x)
                                    .u64(sc.moe_out)
                                    .u64(sc.wts)
                                    .u64(sh)
                                    .i32(h as i32)
                                    .i32(kk as i32)
                                    .f32(cfg.routed_scaling_factor as f32);
                            },
                        )
                        .map_err(cerr)?;
                    }
                }
            }
            if let Some(f) = after.as_mut() {
                f(li)?;
            }
        }
        Ok(())
    }

    /// x (f32 [m, k], row stride ldx) -> sc.xs as BF16 hi [m, k] then lo [m, k].
    /// Cache addressing and kernel names of a layer: its ring (page size 1, R slots per table
    /// row) or the paged pool; BF16 or FP8 kernels.
    fn kv_args(&self, l: &LayerW) -> KvArgs {
        let fp8 = self.kv_elt == 1;
        let (bt, max_pages, page_size) = if l.ring {
            (self.sc.bt_ring, self.ring, 1)
        } else {
            (self.sc.bt, self.max_pages, self.page_size)
        };
        KvArgs {
            bt,
            max_pages,
            page_size,
            qk_name: if fp8 {
                "qk_norm_rope_kv_fp8"
            } else {
                "qk_norm_rope_kv"
            },
            attn_name: if fp8 { "attention_fp8" } else { "attention" },
            gqa_name: if fp8 {
                "attention_gqa_fp8"
            } else {
                "attention_gqa"
            },
            prefill_name: if fp8 {
                "attention_prefill_fp8"
            } else {
                "attention_prefill"
            },
        }
    }

    fn split(
        &self,
        prof: &mut Option<device::Prof>,
        x: u64,
        ldx: usize,
        m: usize,
        k: usize,
        lo: bool,
    ) -> Result<()> {
        let xs = self.sc.xs;
        self.dev
            .launch_p(
                prof,
                "split_bf16",
                (ceil_div(k, 256) as u32, m.min(65535) as u32, 1),
                (256, 1, 1),
                0,
                |b| {
                    b.u64(x)
                        .i32(ldx as i32)
                        .i32(m as i32)
                        .i32(k as i32)
                        .u64(xs)
                        .i32(lo as i32);
                },
            )
            .map_err(cerr)
    }

    /// The layer norm of the residual sc.x into sc.hn; in a GEMM pass also its BF16 split into
    /// sc.xs (rmsnorm_split), which the next GEMMs on hn then read without a split_bf16.
    fn norm_rows(
        &self,
        prof: &mut Option<device::Prof>,
        w: u64,
        m: usize,
        eps: f32,
        split: bool,
    ) -> Result<()> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        if !split {
            return self.rmsnorm(prof, sc.x, 0, w, sc.hn, m, h, eps);
        }
        self.dev
            .launch_p(
                prof,
                "rmsnorm_split",
                (m as u32, 1, 1),
                (
                    (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32,
                    1,
                    1,
                ),
                0,
                |b| {
                    b.u64(sc.x)
                        .u64(0)
                        .u64(w)
                        .u64(sc.hn)
                        .i32(h as i32)
                        .f32(eps)
                        .u64(sc.xs);
                },
            )
            .map_err(cerr)?;
        self.xs_holds.set((sc.hn, true));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        prof: &mut Option<device::Prof>,
        x: u64,
        rows: u64,
        w: u64,
        y: u64,
        m: usize,
        h: usize,
        eps: f32,
    ) -> Result<()> {
        self.xs_holds.set((0, false));
        self.dev
            .launch_p(
                prof,
                "rmsnorm",
                (m as u32, 1, 1),
                (
                    (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32,
                    1,
                    1,
                ),
                0,
                |b| {
                    b.u64(x).u64(rows).u64(w).u64(y).i32(h as i32).f32(eps);
                },
            )
            .map_err(cerr)
    }

    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        prof: &mut Option<device::Prof>,
        tag: &str,
        l: &Lin,
        x: u64,
        ldx: usize,
        y: u64,
        ldy: usize,
        m: usize,
        acc: bool,
    ) -> Result<()> {
        // Every Linear kernel takes the same arguments (x: the activations it reads).
        let args = |b: &mut device::Args, x: u64| {
            b.u64(l.w)
                .u64(l.s)
                .f32(l.inv_gs)
                .u64(x)
                .i32(ldx as i32)
                .u64(y)
                .i32(ldy as i32)
                .i32(m as i32)
                .i32(l.n as i32)
                .i32(l.k as i32)
                .i32(acc as i32);
        };
        if m >= self.opts.gemm_min_rows {
            // The router keeps ~f32 precision (hi + lo BF16 split) so top-k picks match the reference.
            let name = match (l.fp4, tag == "router") {
                (false, false) => "gemm_bf16",
                (true, false) => "gemm_fp4",
                (false, true) => "gemm_bf16_x2",
                (true, true) => "gemm_fp4_x2",
            };
            let grid = (ceil_div(l.n, 64) as u32, ceil_div(m, 64) as u32, 1);
            let hi_only = self.kset.bf16_dense && tag != "router";
            let held = self.xs_holds.get();
            if !(held.0 == x && ldx == l.k && (held.1 || hi_only)) {
                self.split(prof, x, ldx, m, l.k, !hi_only)?;
                self.xs_holds.set((0, false));
            }
            if !l.fp4 && (tag != "router" || self.kset.cublas_router) && self.kset.cublas {
                if let Some(blas) = self.dev.blas() {
                    let xs = self.sc.xs;
                    let beta = if acc { 1.0 } else { 0.0 };
                    blas.gemm_bf16(
                        &self.dev,
                        prof,
                        "cublas_bf16",
                        l.w,
                        xs,
                        y,
                        m,
                        l.n,
                        l.k,
                        ldy,
                        beta,
                    )
                    .map_err(cerr)?;
                    if !hi_only {
                        let lo = xs + 2 * (m * l.k) as u64;
                        blas.gemm_bf16(
                            &self.dev,
                            prof,
                            "cublas_bf16",
                            l.w,
                            lo,
                            y,
                            m,
                            l.n,
                            l.k,
                            ldy,
                            1.0,
                        )
                        .map_err(cerr)?;
                    }
                    return Ok(());
                }
            }
            let name = match (name, hi_only) {
                ("gemm_bf16", true) => "gemm_bf16_h",
                ("gemm_fp4", true) => "gemm_fp4_h",
                (n, _) => n,
            };
            return self
                .dev
                .launch_p(prof, name, grid, (128, 1, 1), 0, |b| args(b, self.sc.xs))
                .map_err(cerr);
        }
        if !l.fp4 && l.k % 32 == 0 && tag != "router" && self.kset.tc_gemv {
            // Tensor-core GEMV: one weight read for up to 8 rows per column tile, identical
            // per-row arithmetic for 1 row and for k+1 (batch-invariant decode vs verify).
            // Warps per block (they split K): enough blocks x warps to fill the GPU for narrow
            // outputs (o_proj: N = 2048 is 128 blocks). Fixed per (N, K): batch-invariant.
            let sw = if l.n <= 2048 {
                16u32
            } else if l.n <= 4096 {
                8
            } else {
                4
            };
            return self
                .dev
                .launch_p(
                    prof,
                    "linear_tc_bf16",
                    (ceil_div(l.n, 16) as u32, ceil_div(m, 8) as u32, 1),
                    (32 * sw, 1, 1),
                    0,
                    |b| args(b, x),
                )
                .map_err(cerr);
        }
        let one = m == 1 && l.k * 4 <= 48 * 1024;
        // 2+ rows (DFlash verify/propose): 2 weight rows per warp, up to 16 activation rows per
        // weight read; same per-row arithmetic as the 1-row kernels.
        let small = !one && self.kset.small_m;
        let name = match (l.fp4, one, small, m <= 8) {
            (false, true, _, _) => "linear_bf16_1",
            (true, true, _, _) => "linear_fp4_1",
            (false, false, true, true) => "linear_bf16_m8",
            (true, false, true, true) => "linear_fp4_m8",
            (false, false, true, false) => "linear_bf16_m16",
            (true, false, true, false) => "linear_fp4_m16",
            (false, false, false, _) => "linear_bf16",
            (true, false, false, _) => "linear_fp4",
        };
        let (grid, shm) = if one {
            ((ceil_div(l.n, 16) as u32, 1, 1), (l.k * 4) as u32)
        } else if small {
            (
                (
                    ceil_div(l.n, 16) as u32,
                    if m <= 8 { 1 } else { ceil_div(m, 16) as u32 },
                    1,
                ),
                0,
            )
        } else {
            ((ceil_div(l.n, 8) as u32, ceil_div(m, 8) as u32, 1), 0)
        };
        self.dev
            .launch_p(prof, name, grid, (256, 1, 1), shm, |b| args(b, x))
            .map_err(cerr)
    }

    /// down(silu(gate(hn)) * up(hn)) into `out` (added when `acc`).
    #[allow(clippy::too_many_arguments)]
    fn ffn(
        &self,
        prof: &mut Option<device::Prof>,
        gate: &Lin,
        up: &Lin,
        down: &Lin,
        m: usize,
        out: u64,
        acc: bool,
    ) -> Result<()> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        let i = gate.n;
        self.linear(prof, "mlp", gate, sc.hn, h, sc.gu, 2 * i, m, false)?;
        self.linear(
            prof,
            "mlp",
            up,
            sc.hn,
            h,
            sc.gu + (4 * i) as u64,
            2 * i,
            m,
            false,
        )?;
        self.dev
            .launch_p(
                prof,
                "silu_mul",
                (ceil_div(i, 256) as u32, m.min(65535) as u32, 1),
                (256, 1, 1),
                0,
                |b| {
                    b.u64(sc.gu).u64(sc.act).i32(m as i32).i32(i as i32);
                },
            )
            .map_err(cerr)?;
        self.linear(prof, "mlp", down, sc.act, i, out, h, m, acc)
    }

    /// Final norm + lm_head for `rows` (indices into the current pass), logits left in sc.logits.
    fn logits_rows(&self, prof: &mut Option<device::Prof>, rows: &[i32]) -> Result<()> {
        self.dev.htod(self.sc.sel, as_bytes(rows)).map_err(cerr)?;
        self.final_logits(prof, rows.len())
    }

    /// Final norm + lm_head over the n rows of the residual listed in sc.sel, into sc.logits.
    fn final_logits(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        self.rmsnorm(
            prof,
            sc.x,
            sc.sel,
            self.final_norm,
            sc.hsel,
            n,
            h,
            self.cfg.rms_norm_eps as f32,
        )?;
        self.linear(
            prof,
            "lm_head",
            &self.lm_head,
            sc.hsel,
            h,
            sc.logits,
            self.cfg.vocab_size,
            n,
            false,
        )
    }

    /// A sequence may continue at `start` only if its ring still holds every key the row at
    /// `start` sees: rewinding further than the ring's spare slots loses them.
    fn check_ring(&self, seq: SeqId, start: usize) -> Result<()> {
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

    /// Block tables (paged pool) and ring tables of the pass's sequences, in pass order.
    fn upload_tables(&self, seqs: &[SeqId]) -> Result<()> {
        let mut bt = Vec::with_capacity(seqs.len() * self.max_pages);
        let mut rt = Vec::with_capacity(seqs.len() * self.ring);
        for &s in seqs {
            bt.extend(self.bt_row(s));
            rt.extend(self.ring_row(s));
        }
        self.dev.htod(self.sc.bt, as_bytes(&bt)).map_err(cerr)?;
        if self.ring > 0 {
            self.dev
                .htod(self.sc.bt_ring, as_bytes(&rt))
                .map_err(cerr)?;
        }
        Ok(())
    }

    /// Slot ids of a sequence's ring, in position order (position p uses entry p % R).
    fn ring_row(&self, seq: SeqId) -> Vec<i32> {
        let base = self.seqs.get(&seq).and_then(|s| s.ring).unwrap_or(0) as usize * self.ring;
        (0..self.ring).map(|i| (base + i) as i32).collect()
    }

    /// Upload one pass's row metadata (rows of one sequence are contiguous, at consecutive
    /// positions) and the tables of `seqs` (seqrow indexes them).
    fn upload_meta(
        &self,
        tokens: &[i32],
        pos: &[i32],
        seqrow: &[i32],
        seqs: &[SeqId],
    ) -> Result<()> {
        let sc = &self.sc;
        // Per row: first and last row of its sequence in the pass; staged when some sequence has
        // more rows than the ring's spare slots + 1 (its later rows would overwrite keys its
        // earlier rows still see).
        let m = tokens.len();
        let (first, last, longest) = ring::seq_spans(seqrow);
        // [first row per row | last row per row], the second half at offset sc.rows.
        let mut span = vec![0i32; sc.rows + m];
        for r in 0..m {
            span[r] = first[r] as i32;
            span[sc.rows + r] = last[r] as i32;
        }
        let staged = ring::needs_stage(longest, self.ring, self.ring_window);
        if staged {
            if self.noncausal {
                return Err(EngineError::Other(format!(
                    "a non-causal block of {longest} rows exceeds the sliding-window ring's {} spare slots (raise spec_k)",
                    self.ring - self.ring_window
                )));
            }
            let hd = self.cfg.head_dim;
            if hd % 16 != 0
                || hd > 128
                || self
                    .layers
                    .iter()
                    .any(|l| l.ring && l.nh % self.cfg.num_kv_heads != 0)
            {
                return Err(EngineError::Other(format!(
                    "{longest} rows of one sequence in a pass need the staged ring path (attention_prefill: head_dim % 16 == 0, <= 128); use passes of at most {} rows",
                    self.ring - self.ring_window + 1
                )));
            }
            self.dev.htod(sc.sspan, as_bytes(&span)).map_err(cerr)?;
        }
        sc.staged.set(staged);
        self.dev.htod(sc.tokens, as_bytes(tokens)).map_err(cerr)?;
        self.dev.htod(sc.pos, as_bytes(pos)).map_err(cerr)?;
        self.dev.htod(sc.seqrow, as_bytes(seqrow)).map_err(cerr)?;
        // Query tiles: runs of consecutive positions of one sequence, at most 64 rows each.
        let mut tl: Vec<i32> = vec![];
        for i in 0..tokens.len() {
            let n = tl.len();
            let cont = n >= 2 && {
                let (r0, c) = (tl[n - 2] as usize, tl[n - 1] as usize);
                c < 64 && r0 + c == i && seqrow[r0] == seqrow[i] && pos[r0] + c as i32 == pos[i]
            };
            if cont {
                tl[n - 1] += 1;
            } else {
                tl.push(i as i32);
                tl.push(1);
            }
        }
        self.dev.htod(sc.atiles, as_bytes(&tl)).map_err(cerr)?;
        sc.natiles.set(tl.len() / 2);
        self.upload_tables(seqs)
    }

    fn bt_row(&self, seq: SeqId) -> Vec<i32> {
        let mut row = vec![0i32; self.max_pages];
        if let Some(s) = self.seqs.get(&seq) {
            for (i, &p) in s.pages.iter().enumerate() {
                row[i] = p as i32;
            }
        }
        row
    }

    /// One greedy decode step for one sequence entirely on the device: returns the argmax token.
    /// Replays a CUDA graph of the whole step when graphs are on (the step's only host syncs are
    /// the metadata upload and reading the sampled token).
    pub fn decode_greedy(
        &mut self,
        seq: SeqId,
        token: u32,
        prof: &mut Option<device::Prof>,
    ) -> Result<u32> {
        let pos = self.seq_len(seq);
        self.check_ring(seq, pos)?;
        self.ensure_pages(seq, pos + 1)?;
        if token as usize >= self.cfg.vocab_size {
            return Err(EngineError::Request(format!(
                "token id {token} is outside the vocabulary"
            )));
        }
        self.upload_meta(&[token as i32], &[pos as i32], &[0], &[seq])?;
        self.dev
            .htod(self.sc.sel, as_bytes(&[0i32]))
            .map_err(cerr)?;
        let use_graph =
            self.opts.graphs && prof.is_none() && self.taps.is_empty() && !self.graph_failed;
        if use_graph && self.graph.is_none() {
            match self.capture_decode() {
                Ok(g) => self.graph = Some(g),
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.graph_failed = true;
                }
            }
        }
        if use_graph && self.graph.is_some() {
            self.graph.as_ref().unwrap().launch().map_err(cerr)?;
        } else {
            self.decode_body(prof)?;
        }
        let mut out = [0i32];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        self.note_written(seq, pos + 1);
        self.seqs.get_mut(&seq).unwrap().len = pos + 1;
        Ok(out[0] as u32)
    }

    /// `Model::decode_step` on the device: one pass of n rows (one per sequence), the final norm
    /// and lm_head over all of them, `sample_rows`; replayed from a CUDA graph per n when graphs
    /// are on. Host syncs: the metadata/parameter uploads and reading the n tokens.
    fn decode_step_dev(&mut self, items: &[DecodeItem]) -> Result<Vec<u32>> {
        let n = items.len();
        if n == 0 {
            return Ok(vec![]);
        }
        if n > self.device_sampling() {
            return Err(EngineError::Other(format!(
                "decode_step takes at most {} sequences here, got {n}",
                self.device_sampling()
            )));
        }
        let v = self.cfg.vocab_size;
        let mut tokens = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut seqs = Vec::with_capacity(n);
        let mut params = Vec::with_capacity(4 * n);
        for (i, it) in items.iter().enumerate() {
            if it.token as usize >= v {
                return Err(EngineError::Request(format!(
                    "token id {} is outside the vocabulary (size {v})",
                    it.token
                )));
            }
            if items[..i].iter().any(|o| o.seq == it.seq) {
                return Err(EngineError::Other(format!(
                    "sequence {} appears twice in one decode step",
                    it.seq
                )));
            }
            if !self.seqs.contains_key(&it.seq) {
                return Err(EngineError::Other(format!("unknown sequence {}", it.seq)));
            }
            let p = self.seq_len(it.seq);
            self.check_ring(it.seq, p)?;
            self.ensure_pages(it.seq, p + 1)?;
            tokens.push(it.token as i32);
            pos.push(p as i32);
            seqs.push(it.seq);
            params.extend_from_slice(&sample_params(it.params, it.u));
        }
        let seqrow: Vec<i32> = (0..n as i32).collect();
        self.upload_meta(&tokens, &pos, &seqrow, &seqs)?;
        self.dev
            .htod(self.sc.sel, as_bytes(&seqrow))
            .map_err(cerr)?;
        self.dev
            .htod(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        let use_graph = self.opts.graphs && self.taps.is_empty() && !self.graph_failed;
        if use_graph && !self.step_graphs.contains_key(&n) {
            match self.capture(|m| m.decode_step_body(&mut None, n)) {
                Ok(g) => {
                    self.step_graphs.insert(n, g);
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.graph_failed = true;
                }
            }
        }
        match self.step_graphs.get(&n).filter(|_| use_graph) {
            Some(g) => g.launch().map_err(cerr)?,
            None => self.decode_step_body(&mut None, n)?,
        }
        let mut out = vec![0i32; n];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        for (it, &p) in items.iter().zip(&pos) {
            self.note_written(it.seq, p as usize + 1);
            self.seqs.get_mut(&it.seq).unwrap().len = p as usize + 1;
        }
        Ok(out.into_iter().map(|t| t as u32).collect())
    }

    fn decode_step_body(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        self.run_layers(n, prof)?;
        self.sample_rows(prof, n)
    }

    /// Final norm + lm_head over the rows listed in sc.sel (n of them), then one token per row
    /// drawn by `sample_rows` with the parameters in sc.sparams, into sc.amax.
    fn sample_rows(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        self.final_logits(prof, n)?;
        self.launch_sample(prof, n)
    }

    /// `sample_rows` over the first n rows of sc.logits with the parameters in sc.sparams.
    fn launch_sample(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        let sc = &self.sc;
        self.dev
            .launch_p(
                prof,
                "sample_rows",
                (n as u32, 1, 1),
                (1024, 1, 1),
                0,
                |b| {
                    b.u64(sc.logits)
                        .i32(self.cfg.vocab_size as i32)
                        .u64(sc.sparams)
                        .u64(sc.samp_e)
                        .u64(sc.amax);
                },
            )
            .map_err(cerr)
    }

    /// Draw one token from each of the given logits rows with `sample_rows` (device sampling
    /// checks: the rows are uploaded to the logits buffer).
    pub fn sample_logits(
        &self,
        rows: &[&[f32]],
        items: &[(SamplingParams, f64)],
    ) -> Result<Vec<u32>> {
        let n = rows.len();
        let v = self.cfg.vocab_size;
        if n > DECODE_ROWS || v > 1 << 17 || items.len() != n || rows.iter().any(|r| r.len() != v) {
            return Err(EngineError::Other(format!(
                "sample_logits: at most {DECODE_ROWS} rows of {v} logits, one parameter set each"
            )));
        }
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        self.dev
            .htod(self.sc.logits, as_bytes(&flat))
            .map_err(cerr)?;
        let params: Vec<f64> = items
            .iter()
            .flat_map(|(sp, u)| sample_params(sp, *u))
            .collect();
        self.dev
            .htod(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        self.launch_sample(&mut None, n)?;
        let mut out = vec![0i32; n];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        Ok(out.into_iter().map(|t| t as u32).collect())
    }

    fn decode_body(&self, prof: &mut Option<device::Prof>) -> Result<()> {
        self.run_layers(1, prof)?;
        self.greedy_rows(prof, 1, self.sc.amax)
    }

    fn capture_decode(&self) -> std::result::Result<device::Graph, String> {
        self.capture(|m| m.decode_body(&mut None))
    }

    /// The launches of `body` captured as one CUDA graph.
    fn capture(
        &self,
        body: impl FnOnce(&Self) -> Result<()>,
    ) -> std::result::Result<device::Graph, String> {
        self.dev.begin_capture()?;
        let r = body(self);
        let g = self.dev.end_capture();
        r.map_err(|e| e.to_string())?;
        g
    }

    /// Device copy bandwidth (bytes read + written per second) over a `bytes`-sized buffer.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        self.dev.copy_bandwidth(bytes).map_err(cerr)
    }
}

/// One row's parameters for `sample_rows`: (temperature, 0 = greedy; top_k; top_p; u).
fn sample_params(sp: &SamplingParams, u: f64) -> [f64; 4] {
    let t = if sp.is_greedy() {
        0.0
    } else {
        sp.temperature as f64
    };
    [t, sp.top_k as f64, sp.top_p as f64, u]
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
fn as_bytes_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

struct Row {
    item: usize,
    seq: SeqId,
    token: u32,
    pos: usize,
    want: bool,
    idx_in_item: usize,
}

impl Model for CudaModel {
    fn config(&self) -> &LagunaConfig {
        &self.cfg
    }
    fn device(&self) -> &str {
        "cuda"
    }
    fn new_seq(&mut self) -> Result<SeqId> {
        let ring = if self.ring > 0 {
            Some(self.free_rings.pop().ok_or_else(|| {
                EngineError::Request(format!(
                    "all {} sequence slots are in use (each holds a sliding-window ring); finish or free a sequence, or raise max_num_seqs",
                    self.opts.max_seqs.max(1)
                ))
            })?)
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(
            id,
            SeqState {
                len: 0,
                pages: vec![],
                ring,
                ring_hi: 0,
            },
        );
        Ok(id)
    }
    fn free_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.free_pages.extend(s.pages);
            self.free_rings.extend(s.ring);
        }
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        let ps = self.page_size;
        if let Some(s) = self.seqs.get_mut(&seq) {
            if len < s.len {
                s.len = len;
                let keep = ceil_div(len, ps);
                while s.pages.len() > keep {
                    self.free_pages.push(s.pages.pop().unwrap());
                }
            }
        }
    }
    fn set_taps(&mut self, layers: &[usize]) {
        self.taps = layers.to_vec();
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn device_sampling(&self) -> usize {
        // sample_rows keeps fixed-point sums below 2^63 and per-tile sums for up to 2^17 tokens.
        if self.noncausal || !self.taps.is_empty() || self.cfg.vocab_size > 1 << 17 {
            0
        } else {
            DECODE_ROWS
                .min(self.sc.rows)
                .min(self.sc.lrows)
                .min(self.sc.bt_seqs)
        }
    }
    fn decode_step(&mut self, items: &[DecodeItem]) -> Result<Vec<u32>> {
        self.decode_step_dev(items)
    }
    fn forward(&mut self, batch: &[StepInput]) -> Result<Vec<StepOutput>> {
        let v = self.cfg.vocab_size;
        let h = self.cfg.hidden_size;
        let ntaps = self.taps.len();
        let mut rows = vec![];
        for (ii, it) in batch.iter().enumerate() {
            let cur = self
                .seqs
                .get(&it.seq)
                .ok_or_else(|| EngineError::Other(format!("unknown sequence {}", it.seq)))?
                .len;
            if it.start_pos != cur {
                return Err(EngineError::Other(format!(
                    "forward at position {} but the sequence holds {cur} positions",
                    it.start_pos
                )));
            }
            if batch[..ii].iter().any(|o| o.seq == it.seq) {
                return Err(EngineError::Other(format!(
                    "sequence {} appears twice in one batch",
                    it.seq
                )));
            }
            for (r, &t) in it.tokens.iter().enumerate() {
                if t as usize >= v {
                    return Err(EngineError::Request(format!(
                        "token id {t} is outside the vocabulary (size {v})"
                    )));
                }
                let want = match it.logits {
                    LogitRows::None => false,
                    LogitRows::Last => r + 1 == it.tokens.len(),
                    LogitRows::All => true,
                };
                rows.push(Row {
                    item: ii,
                    seq: it.seq,
                    token: t,
                    pos: it.start_pos + r,
                    want,
                    idx_in_item: r,
                });
            }
        }
        for it in batch {
            self.check_ring(it.seq, it.start_pos)?;
            self.ensure_pages(it.seq, it.start_pos + it.tokens.len())?;
        }
        let mut outs: Vec<StepOutput> = batch
            .iter()
            .map(|it| StepOutput {
                logits: vec![],
                rows: 0,
                taps: if ntaps > 0 && !self.taps_on_device {
                    vec![0f32; it.tokens.len() * ntaps * h]
                } else {
                    vec![]
                },
            })
            .collect();
        let mut start = 0;
        let mut prof = self.fprof.take();
        while start < rows.len() {
            // A pass: at most max_rows rows and bt_seqs distinct sequences.
            let mut end = start;
            let mut seqs: Vec<SeqId> = vec![];
            while end < rows.len() && end - start < self.sc.rows {
                let s = rows[end].seq;
                if !seqs.contains(&s) {
                    if seqs.len() == self.sc.bt_seqs {
                        break;
                    }
                    seqs.push(s);
                }
                end += 1;
            }
            let pass = &rows[start..end];
            let m = pass.len();
            let tokens: Vec<i32> = pass.iter().map(|r| r.token as i32).collect();
            let pos: Vec<i32> = pass.iter().map(|r| r.pos as i32).collect();
            let seqrow: Vec<i32> = pass
                .iter()
                .map(|r| seqs.iter().position(|&s| s == r.seq).unwrap() as i32)
                .collect();
            self.upload_meta(&tokens, &pos, &seqrow, &seqs)?;
            if self.noncausal {
                let ke: Vec<i32> = pass
                    .iter()
                    .map(|r| (batch[r.item].start_pos + batch[r.item].tokens.len()) as i32)
                    .collect();
                self.dev.htod(self.sc.kend, as_bytes(&ke)).map_err(cerr)?;
            }
            if ntaps == 0 {
                self.run_layers(m, &mut prof)?;
            } else if self.taps_on_device {
                if end < rows.len() {
                    return Err(EngineError::Other(format!(
                        "device taps need one pass: {} rows exceed the pass size {}",
                        rows.len(),
                        self.sc.rows
                    )));
                }
                self.run_layers_taps_dev(m, &mut prof)?;
            } else {
                self.run_layers_with_taps(m, pass, &mut outs)?;
            }
            let want: Vec<usize> = (0..m).filter(|&i| pass[i].want).collect();
            for chunk in want.chunks(self.sc.lrows) {
                let idx: Vec<i32> = chunk.iter().map(|&i| i as i32).collect();
                self.logits_rows(&mut prof, &idx)?;
                let mut buf = vec![0f32; chunk.len() * v];
                self.dev
                    .dtoh(as_bytes_mut(&mut buf), self.sc.logits)
                    .map_err(cerr)?;
                for (j, &i) in chunk.iter().enumerate() {
                    let o = &mut outs[pass[i].item];
                    o.logits.extend_from_slice(&buf[j * v..(j + 1) * v]);
                    o.rows += 1;
                }
            }
            start = end;
        }
        self.fprof = prof;
        self.dev.sync().map_err(cerr)?;
        for it in batch {
            self.note_written(it.seq, it.start_pos + it.tokens.len());
            self.seqs.get_mut(&it.seq).unwrap().len = it.start_pos + it.tokens.len();
        }
        Ok(outs)
    }
}

impl CudaModel {
    /// Choose the weight-streaming kernel families (A/B checks and timing; see [`KernelSet`]).
    pub fn set_kernels(&mut self, k: KernelSet) {
        self.kset = k;
        self.graph = None;
        self.step_graphs.clear();
    }
    pub fn kernels(&self) -> KernelSet {
        self.kset
    }

    /// Keep the taps of `forward` on the device (`taps_dev`) instead of returning them; forwards
    /// must then fit one pass. Allocates the buffer on first use.
    pub fn set_taps_on_device(&mut self, on: bool) -> Result<()> {
        if on && self.taps_dev == 0 {
            let n = self.sc.rows * self.taps.len().max(1) * self.cfg.hidden_size * 4;
            self.taps_dev = self.dev.alloc(n).map_err(cerr)?;
        }
        self.taps_on_device = on;
        Ok(())
    }

    /// run_layers, copying the residual after each tap layer into `taps_dev` (graph-capturable).
    fn run_layers_taps_dev(&self, m: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        let h = self.cfg.hidden_size;
        let ntaps = self.taps.len();
        let (dev, x, td) = (&self.dev, self.sc.x, self.taps_dev);
        let taps = self.taps.clone();
        let mut inner: Option<device::Prof> = prof.take();
        let mut hook = |li: usize| -> Result<()> {
            if let Some(t) = taps.iter().position(|&l| l == li) {
                dev.launch_p(
                    &mut None,
                    "copy_rows",
                    (m as u32, 1, 1),
                    (256, 1, 1),
                    0,
                    |b| {
                        b.u64(x)
                            .i32(h as i32)
                            .u64(td + (4 * t * h) as u64)
                            .i32((ntaps * h) as i32)
                            .i32(h as i32);
                    },
                )
                .map_err(cerr)?;
            }
            Ok(())
        };
        let r = self.run_layers_hooked(m, &mut inner, Some(&mut hook));
        *prof = inner;
        r
    }

    /// Final norm + lm_head + argmax for the first `n` rows listed in `sc.sel` (already uploaded),
    /// argmax ids written to `out` (device, n ints). No host work: graph-capturable.
    fn greedy_rows(&self, prof: &mut Option<device::Prof>, n: usize, out: u64) -> Result<()> {
        let sc = &self.sc;
        self.final_logits(prof, n)?;
        self.dev
            .launch_p(
                prof,
                "argmax_rows",
                (n as u32, 1, 1),
                (1024, 1, 1),
                0,
                |b| {
                    b.u64(sc.logits).i32(self.cfg.vocab_size as i32).u64(out);
                },
            )
            .map_err(cerr)
    }

    /// Same as run_layers, but copies the residual after each tap layer to the host.
    fn run_layers_with_taps(&self, m: usize, pass: &[Row], outs: &mut [StepOutput]) -> Result<()> {
        let h = self.cfg.hidden_size;
        let ntaps = self.taps.len();
        let mut prof = None;
        let mut hook = |li: usize| -> Result<()> {
            if let Some(t) = self.taps.iter().position(|&l| l == li) {
                let mut buf = vec![0f32; m * h];
                self.dev
                    .dtoh(as_bytes_mut(&mut buf), self.sc.x)
                    .map_err(cerr)?;
                for (r, row) in pass.iter().enumerate() {
                    let off = (row.idx_in_item * ntaps + t) * h;
                    outs[row.item].taps[off..off + h].copy_from_slice(&buf[r * h..(r + 1) * h]);
                }
            }
            Ok(())
        };
        self.run_layers_hooked(m, &mut prof, Some(&mut hook))
    }
}

/// Kernel architectures of the GPUs on this machine (e.g. ["sm_90a"]).
pub fn detect_archs() -> std::result::Result<Vec<String>, String> {
    device::probe()?;
    let n = cudarc::driver::CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
    let mut v = vec![];
    for i in 0..n as usize {
        let c = cudarc::driver::CudaContext::new(i).map_err(|e| format!("{e:?}"))?;
        let (a, b) = c.compute_capability().map_err(|e| format!("{e:?}"))?;
        let s = laguna_kernels::arch_for_capability(a, b);
        if !v.contains(&s) {
            v.push(s);
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_set_parses() {
        assert_eq!(KernelSet::parse("").unwrap(), KernelSet::default_set());
        assert_eq!(KernelSet::parse("original").unwrap(), KernelSet::original());
        let k = KernelSet::parse("-tc_gemv, -attn_gqa").unwrap();
        assert!(!k.tc_gemv && !k.attn_gqa && k.small_m && k.moe_s);
        let k = KernelSet::parse("original,+moe_s").unwrap();
        assert_eq!(
            k,
            KernelSet {
                moe_s: true,
                ..KernelSet::original()
            }
        );
        let k = KernelSet::parse("-cublas,+bf16_moe").unwrap();
        assert!(!k.cublas && k.bf16_moe && !k.bf16_dense && !k.bf16_attn && k.tc_gemv);
        assert!(KernelSet::default_set().cublas && !KernelSet::original().cublas);
        let k = KernelSet::parse("-moe_silu,-moe_skip").unwrap();
        assert!(!k.moe_silu && !k.moe_skip && k.moe_wide);
        assert!(KernelSet::parse("-fast")
            .unwrap_err()
            .contains("unknown kernel family `fast`"));
    }

    /// Without a GPU this must report a reason, never panic; with one, a fixture must load and
    /// agree with the CPU on its prompt (the full device checks live in `laguna device-test`).
    #[test]
    fn cuda_matches_cpu_on_a_fixture_or_skips() {
        if let Err(e) = gpu_available() {
            eprintln!("SKIP cuda_matches_cpu_on_a_fixture_or_skips: {e}");
            return;
        }
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/swa-yarn-perhead"
        ));
        if !dir.join("config.json").exists() {
            eprintln!("SKIP: fixture {} missing", dir.display());
            return;
        }
        let opts = CudaOptions {
            progress: false,
            max_rows: 64,
            kv_pool_bytes: Some(32 << 20),
            page_size: 16,
            ..Default::default()
        };
        let mut cu = match CudaModel::load(dir, opts) {
            Ok(m) => m,
            Err(e) if e.to_string().contains("NVRTC") => {
                eprintln!("SKIP: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut cpu = crate::cpu::CpuModel::load(dir).unwrap();
        let toks: Vec<u32> = (3..19).collect();
        let a = cu.new_seq().unwrap();
        let b = cpu.new_seq().unwrap();
        let x = cu
            .forward(&[StepInput {
                seq: a,
                tokens: &toks,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap();
        let y = cpu
            .forward(&[StepInput {
                seq: b,
                tokens: &toks,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap();
        let v = cpu.config().vocab_size;
        for (ra, rb) in x[0].logits.chunks(v).zip(y[0].logits.chunks(v)) {
            let mx = rb.iter().fold(0f32, |m, &t| m.max(t.abs()));
            let d = ra
                .iter()
                .zip(rb)
                .fold(0f32, |m, (&p, &q)| m.max((p - q).abs()));
            assert!(d <= 2e-2 * mx, "max diff {d} vs max logit {mx}");
        }
    }
}
