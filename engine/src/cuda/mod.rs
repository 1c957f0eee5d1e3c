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
mod attention;
mod blas;
mod decode;
pub(crate) mod device;
pub mod draft;
mod kv;
pub mod launch;
mod layers;
mod load;
mod moe;
mod ops;
mod prefix;
pub mod profile;
pub mod ring;
pub mod select;
pub mod stamp;
mod tools;

pub use device::{Args, Dev, DevError, Prof};
pub use load::{check_head_dim, check_shapes};

use kv::{KvPool, SeqState};

use crate::config::LagunaConfig;
use crate::error::{EngineError, Result};
use crate::model::{DecodeItem, LogitRows, Model, SeqId, StepInput, StepOutput};
use std::cell::Cell;
use std::sync::Arc;

/// Options for [`CudaModel::load`].
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// GPU ordinal.
    pub device: usize,
    /// Bytes for the paged K/V pool; None: half of the free memory after weights, at most 16 GiB,
    /// and never more than `max_seqs` sequences of `max_model_len` positions need.
    pub kv_pool_bytes: Option<usize>,
    /// Longest sequence the pool must hold (None: the model's max_position_embeddings).
    pub max_model_len: Option<usize>,
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
    /// Dense BF16 GEMMs of long passes through cuBLAS when it loads (off: laguna's own GEMMs,
    /// which `laguna-dev device-test` checks too).
    pub cublas: bool,
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
    /// Ring snapshots a model without a paged pool may keep per sequence slot for the prefix
    /// cache (`model::prefix::OWN_SNAPSHOTS_PER_SEQ` when the cache is on, else 0).
    pub own_snapshots: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            kv_pool_bytes: None,
            max_model_len: None,
            page_size: 64,
            max_rows: 2048,
            progress: true,
            graphs: true,
            gemm_min_rows: GEMM_MIN_ROWS,
            cublas: true,
            max_seqs: 8,
            spec_k: 15,
            kv_fp8: false,
            rings: true,
            own_snapshots: 0,
        }
    }
}

/// Passes of at least this many rows take the long-pass regime by default
/// ([`CudaOptions::gemm_min_rows`]).
pub const GEMM_MIN_ROWS: usize = 32;

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
    /// BF16 only: a tile-interleaved copy of w for the tensor-core GEMV
    /// (`tile_bf16`; each 16-row x 32-K tile one contiguous 1 KB piece in fragment order), 0 if none.
    t: u64,
}

impl Lin {
    /// A BF16 [n, k] matrix at `w` (0: a placeholder for a part of a concatenated projection),
    /// without a tiled copy.
    fn bf16(w: u64, n: usize, k: usize) -> Lin {
        Lin {
            fp4: false,
            w,
            s: 0,
            inv_gs: 1.0,
            n,
            k,
            t: 0,
        }
    }
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
        /// gate and up stacked by rows in one buffer (`Loader::dense_mlp`, when both are BF16 and
        /// the width a multiple of 16): gate and up are views of its halves (their row-major
        /// matrices and tile-interleaved copies), so a one-row pass can run both as one GEMV
        /// (`ops::ffn`). None when they are separate buffers.
        gu: Option<Lin>,
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
    /// Grid barrier word of moe_decode_fused (0 at allocation; grid_sync keeps its low bits).
    gbar: u64,
    /// Router logits of `moe_decode_fused` (it polls them): unset (all bits 1) between launches.
    rlog_mk: u64,
    moe_gu: u64,
    /// GEMM inputs split into BF16 hi + lo ([rows, K] each, lo after hi).
    xs: u64,
    /// Query tiles of the pass for attention_prefill: (first row, rows) pairs
    /// (`PassState::natiles` of them).
    atiles: u64,
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
    // logits path
    lrows: usize,
    sel: u64,
    hsel: u64,
    logits: u64,
    amax: u64,
    /// `argmax_rows_split`'s per-row (key, index) slots and block counters (zero between launches).
    amax_slot: u64,
    amax_cnt: u64,
    /// `decode_advance`'s step counter (u32, 0 at load).
    adv_ctr: u64,
    /// Sampling parameters per sampled row: (temperature, top_k, top_p, u) as f64.
    sparams: u64,
    /// Fixed-point probabilities of sample_rows, DECODE_ROWS rows of vocab.
    samp_e: u64,
    /// `sample_rows_split`'s per-row state (SAMP_G_STRIDE u64 a row, DECODE_ROWS rows; zero at load,
    /// left zero by every launch).
    samp_g: u64,
    part: u64,
}

/// See [`CudaModel::kv_args`].
struct KvArgs {
    bt: u64,
    max_pages: usize,
    page_size: usize,
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

/// A CUDA model: the target, or a draft's decoder stack (`draft::CudaDraft`). Its state is in
/// groups, each with one owner: the weights (`load`), the scratch buffers (`load`), the K/V
/// pool and the sequences in it (`kv`, `prefix`), the decode graphs and pipeline (`decode`), the
/// launch shapes fixed at load, how `forward` runs (its caller's settings) and what the current
/// pass's launches track (`layers` and the launch code, through `&self`).
pub struct CudaModel {
    cfg: LagunaConfig,
    /// Shared with a CUDA draft (same context and stream, so ordering is implicit).
    dev: Arc<Dev>,
    opts: CudaOptions,
    w: Weights,
    sc: Scratch,
    kv: KvPool,
    dec: decode::DecodeState,
    shape: LaunchShape,
    fwd: ForwardMode,
    pass: PassState,
    /// Prefix cache: shared pages and exported snapshots (`prefix.rs`).
    prefix: prefix::CudaPrefix,
    /// Bytes of weights on the device.
    pub weight_bytes: usize,
    /// Bytes one single-row decode step reads from weights (active experts only).
    pub decode_weight_bytes: usize,
    pub load_secs: f64,
}

/// The model's weights on the device (a draft stack shares the target's `embed` and `lm_head`).
struct Weights {
    embed: u64,
    final_norm: u64,
    lm_head: Lin,
    layers: Vec<LayerW>,
}

/// Launch shapes chosen at load from the device and the model's shapes.
struct LaunchShape {
    /// Key splits of the decode attention (NSPLIT; `sc.part` is sized for it).
    nsplit: usize,
    /// Most key splits of `attention_decode_tc` (NSPLIT_TC; at most `nsplit`).
    nsplit_tc: usize,
    /// `moe_decode_fused`: its grid (one block an SM, all resident) and dynamic
    /// shared memory; grid 0 when the model's shapes do not fit it.
    mk_grid: u32,
    mk_smem: u32,
    /// `moe_decode_fused`'s gate/up issue stagger, ns a warp index (`mk_stagger`; 0: none).
    mk_stag: i32,
    /// Dense BF16 GEMMs of long passes on cuBLAS when it loads (else laguna's own GEMMs;
    /// `CudaOptions::cublas`).
    use_cublas: bool,
}

/// How `forward` runs beyond its batch: set by its caller (`set_taps`, `set_taps_on_device`,
/// `set_profiling`) or, for `noncausal`, by the draft's load.
struct ForwardMode {
    /// Layers whose residual `forward` returns (DFlash taps).
    taps: Vec<usize>,
    /// With `taps_on_device`, `forward` leaves the taps of its (single) pass in `taps_dev`
    /// ([rows, taps * hidden] f32) instead of copying them to the host.
    taps_on_device: bool,
    taps_dev: u64,
    /// Draft stacks with `dflash_config.causal = false`: a block row sees every key of its block
    /// (per-row key end in `sc.kend`), not only keys up to its position.
    noncausal: bool,
    /// Per-kernel event timing of `forward` passes when set (see `set_profiling`).
    prof: Option<device::Prof>,
}

/// What the current pass's launches track as they go: set by `upload_meta` (and the DFlash
/// step's own uploads) and by the layer code, which runs through `&self`, hence the cells.
struct PassState {
    /// The pass's `attention_decode_tc` grid of splits (`tc_grid` of its longest row; set with
    /// the pass's positions, `nsplit_tc` until then).
    tc_cap: Cell<usize>,
    /// Query tiles of the pass for attention_prefill (`sc.atiles`): their count.
    natiles: Cell<usize>,
    /// This pass writes ring layers through the stage (some sequence has more rows than the
    /// ring's spare slots + 1): ring layers run attention_prefill, then ring_commit.
    staged: Cell<bool>,
    /// Every row of the pass is the only row of its sequence (a decode step of a causal model):
    /// the decode attention may write a row's new key itself (`select::attention`).
    solo: Cell<bool>,
    /// (f32 buffer, lo written) whose BF16 split of the current pass sits in `sc.xs`, so a GEMM on
    /// that buffer skips `split_bf16`: sc.hn (set by `norm_rows` in a GEMM pass, `embed_norm` and
    /// the fused combine + norm) or sc.attn (the flash prefill attention); reset at the start of
    /// every pass, by `rmsnorm` and by every other launch that writes sc.xs (`split`,
    /// `silu_split`, `tc_bfrag_rows`, the fused decode MoE).
    xs_holds: Cell<(u64, bool)>,
    /// The current pass is one row and its last `moe_decode_fused` wrote the final norm of that
    /// row into `sc.hsel`, so `final_logits` of one row skips its `rmsnorm`.
    /// Reset at the start of every pass.
    final_normed: Cell<bool>,
}

impl PassState {
    fn new(tc_cap: usize) -> PassState {
        PassState {
            tc_cap: Cell::new(tc_cap),
            natiles: Cell::new(0),
            staged: Cell::new(false),
            solo: Cell::new(false),
            xs_holds: Cell::new((0, false)),
            final_normed: Cell::new(false),
        }
    }
}

/// Most key splits of the split-KV decode attention (a row uses min(this, its keys / 32); the
/// merge holds at most 128).
const NSPLIT: usize = 64;
/// Most key splits of `attention_decode_tc` (its grid; a row uses `tc_splits` in
/// kernels/cu/attention/common.cuh: 16 for a 2K row, one per 512 keys past 8K, at least 64 keys
/// each), at most `nsplit`, which sizes `sc.part`.
const NSPLIT_TC: usize = 64;
pub fn nsplit_tc(nsplit: usize) -> usize {
    NSPLIT_TC.clamp(1, nsplit)
}
/// Keys an `attention_decode_tc` split covers at least (`TC_CHUNK` in kernels/cu/attention/common.cuh).
pub const TC_CHUNK: usize = 64;
/// `TC_SPLITS` and `TC_SPAN` in attention/common.cuh: a row's `attention_decode_tc` splits are
/// min(grid, max(TC_SPLITS, ceil(keys / TC_SPAN)), ceil(keys / TC_CHUNK)) (`tc_splits`).
const TC_SPLITS: usize = 16;
const TC_SPAN: usize = 512;
/// The `attention_decode_tc` grid of a pass whose longest row has `keys` keys, for a most of `cap`
/// splits: the smallest of 16, 32 and `cap` that holds every split such a row (or a shorter one)
/// takes with a grid of `cap`, so each row gets the splits, and so the bits, of the full grid,
/// without the blocks past its splits that return at once (at 2K keys 128 live blocks of 512:
/// PERF.md run 198, 2.264 -> 2.251 ms a step). The decode graphs are kept per grid.
pub fn tc_grid(keys: usize, cap: usize) -> usize {
    let need = cap
        .min(TC_SPLITS.max(keys.div_ceil(TC_SPAN)))
        .min(keys.div_ceil(TC_CHUNK));
    let g = if need <= 16 {
        16
    } else if need <= 32 {
        32
    } else {
        cap
    };
    g.min(cap).max(1)
}
/// The grid of key splits of a decode attention launch, from the most it takes (`cap`) and the
/// fewest keys a split covers (`chunk`). A sliding-window layer's grid is sized by its window: a
/// row never sees more than window keys (2 x window - 1 for a non-causal draft block), so it
/// never has more than ceil(keys / chunk) splits; the same splits without the blocks that would
/// return at once (at least 2, so the merge path and its bits stay).
pub fn split_grid(cap: usize, chunk: usize, window: usize, noncausal: bool) -> usize {
    if cap > 1 && window > 0 {
        let keys = if noncausal { 2 * window } else { window };
        cap.min(keys.div_ceil(chunk)).max(2)
    } else {
        cap
    }
}
/// Dynamic shared memory of `attention_decode_tc` / `_fp8` (ATC_SMEM in attention/decode_tc.cu: 4 warps x 2
/// stages x K and V rows of 16 keys, then Q's hi and lo rows, 16 each, at a stride of 136 BF16).
pub(crate) const ATC_SMEM: u32 = atc_smem(2);
/// `attention_decode_tc_qk` / `_fp8` (ATC_QK_SMEM): + the 4 warps' norm buffers.
pub(crate) const ATC_QK_SMEM: u32 = ATC_SMEM + 4 * 128 * 4;
/// `attention_decode_tc_qk_3stage`: three stages a warp instead of two, + the norm buffers.
pub(crate) const ATC_QK3_SMEM: u32 = atc_smem(3) + 4 * 128 * 4;
/// attention_tc's stages (4 warps x `nst` x K and V rows of 16 keys) and Q's hi and lo rows.
const fn atc_smem(nst: u32) -> u32 {
    (4 * nst * 2 * 16 + 2 * 16) * 136 * 2
}
/// Dynamic shared memory of `attention_prefill_flash_qsmem` / `_fp8_q` (FA_QS_SMEM in attention/prefill.cu: Q hi
/// and lo, 64 rows of 136 BF16), on top of their 35 KB of static K / V tiles.
pub(crate) const ATT_QS_SMEM: u32 = 2 * 64 * 136 * 2;
/// Dynamic shared memory a kernel is launched with where it passes 48 KB (it opts in to it at
/// load); 0 for every other kernel.
pub fn big_smem(name: &str) -> u32 {
    select::attention::big_smem(name)
}
/// Most sequences one `decode_step` carries (its graphs are kept per batch size).
const DECODE_ROWS: usize = 16;
/// u64 a row of `sample_rows_split`'s state (SG_STRIDE in sample.cu; its most blocks a row:
/// `select::sample::SPLIT_MAX_BLOCKS`).
const SAMP_G_STRIDE: usize = 2048;
const SPLIT_ROWS: usize = 64;
/// Keys a split-KV decode attention split covers at least (`ATT_CHUNK` in
/// kernels/cu/attention/common.cuh).
pub const ATT_CHUNK: usize = 32;

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl CudaModel {
    /// K/V pool of the full-attention layers: (pages, positions per page, bytes).
    pub(crate) fn kv_pool(&self) -> (usize, usize, usize) {
        let kvw = self.cfg.num_kv_heads * self.cfg.head_dim;
        (
            self.kv.num_pages,
            self.kv.page_size,
            self.kv.num_pages * self.kv.page_size * kvw * 2 * self.kv.elt * self.kv.full_layers,
        )
    }
    /// Rows a sequence may write beyond what it keeps without losing a visible key (rings), or
    /// None when no layer has a ring (any rewind is safe).
    pub(crate) fn ring_spare(&self) -> Option<usize> {
        (self.kv.ring > 0).then(|| self.kv.ring - self.kv.ring_window)
    }
    /// Whether K/V are stored as FP8 E4M3.
    pub(crate) fn kv_fp8(&self) -> bool {
        self.kv.elt == 1
    }
    pub fn dev(&self) -> &Dev {
        &self.dev
    }

    fn ensure_pages(&mut self, seq: SeqId, upto: usize) -> Result<()> {
        if self.kv.full_layers == 0 {
            if upto > self.cfg.max_position_embeddings {
                return Err(EngineError::Request(format!(
                    "sequence needs {upto} positions but the model allows {}",
                    self.cfg.max_position_embeddings
                )));
            }
            return Ok(());
        }
        let need = ceil_div(upto, self.kv.page_size);
        if need > self.kv.max_pages {
            return Err(EngineError::Request(format!(
                "sequence needs {upto} positions but the K/V plan allows {} ({} pages of {})",
                self.kv.max_pages * self.kv.page_size,
                self.kv.max_pages,
                self.kv.page_size
            )));
        }
        let s = self
            .kv
            .seqs
            .get_mut(&seq)
            .ok_or_else(|| EngineError::Other(format!("unknown sequence {seq}")))?;
        while s.pages.len() < need {
            match self.kv.free_pages.pop() {
                Some(p) => s.pages.push(p),
                None => {
                    return Err(EngineError::Request(format!(
                        "the K/V pool is full ({} pages of {} positions); free sequences or give a larger pool",
                        self.kv.num_pages, self.kv.page_size
                    )))
                }
            }
        }
        Ok(())
    }

    /// Block tables (paged pool) and ring tables of the pass's sequences, in pass order.
    fn upload_tables(&self, seqs: &[SeqId]) -> Result<()> {
        let mut bt = Vec::with_capacity(seqs.len() * self.kv.max_pages);
        let mut rt = Vec::with_capacity(seqs.len() * self.kv.ring);
        for &s in seqs {
            bt.extend(self.kv.bt_row(s));
            rt.extend(self.kv.ring_row(s));
        }
        self.dev
            .htod_cached(self.sc.bt, as_bytes(&bt))
            .map_err(cerr)?;
        if self.kv.ring > 0 {
            self.dev
                .htod_cached(self.sc.bt_ring, as_bytes(&rt))
                .map_err(cerr)?;
        }
        Ok(())
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
        self.upload_meta_fed(tokens, pos, seqrow, seqs, false)
    }

    /// `upload_meta`; with `fed`, `sc.tokens` and `sc.pos` already hold these values (the
    /// previous decode step's `decode_advance` left them) and are not uploaded.
    fn upload_meta_fed(
        &self,
        tokens: &[i32],
        pos: &[i32],
        seqrow: &[i32],
        seqs: &[SeqId],
        fed: bool,
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
        let staged = ring::needs_stage(longest, self.kv.ring, self.kv.ring_window);
        if staged {
            if self.fwd.noncausal {
                return Err(EngineError::Other(format!(
                    "a non-causal block of {longest} rows exceeds the sliding-window ring's {} spare slots (raise spec_k)",
                    self.kv.ring - self.kv.ring_window
                )));
            }
            if self
                .w
                .layers
                .iter()
                .any(|l| l.ring && l.nh % self.cfg.num_kv_heads != 0)
            {
                return Err(EngineError::Other(format!(
                    "{longest} rows of one sequence in a pass need the staged ring path (query heads a multiple of the KV heads); use passes of at most {} rows",
                    self.kv.ring - self.kv.ring_window + 1
                )));
            }
            self.dev
                .htod_staged(sc.sspan, as_bytes(&span))
                .map_err(cerr)?;
        }
        self.pass.staged.set(staged);
        self.pass.solo.set(longest == 1 && !self.fwd.noncausal);
        self.set_tc_cap(pos);
        if !fed {
            self.dev
                .htod_staged(sc.tokens, as_bytes(tokens))
                .map_err(cerr)?;
            self.dev.htod_staged(sc.pos, as_bytes(pos)).map_err(cerr)?;
        }
        self.dev
            .htod_cached(sc.seqrow, as_bytes(seqrow))
            .map_err(cerr)?;
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
        self.dev
            .htod_cached(sc.atiles, as_bytes(&tl))
            .map_err(cerr)?;
        self.pass.natiles.set(tl.len() / 2);
        self.upload_tables(seqs)
    }
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
        let ring = if self.kv.ring > 0 {
            Some(self.kv.free_rings.pop().ok_or_else(|| {
                EngineError::Request(format!(
                    "all {} sequence slots are in use (each holds a sliding-window ring); finish or free a sequence, or raise max_num_seqs",
                    self.opts.max_seqs.max(1)
                ))
            })?)
        } else {
            None
        };
        let id = self.kv.next_id;
        self.kv.next_id += 1;
        self.kv.seqs.insert(
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
        if let Some(s) = self.kv.seqs.remove(&seq) {
            for p in s.pages {
                self.release_page(p);
            }
            self.kv.free_rings.extend(s.ring);
        }
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        self.kv.seqs.get(&seq).map_or(0, |s| s.len)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        let ps = self.kv.page_size;
        if let Some(s) = self.kv.seqs.get_mut(&seq) {
            if len < s.len {
                s.len = len;
                let keep = ceil_div(len, ps).min(s.pages.len());
                let gone = s.pages.split_off(keep);
                for p in gone {
                    self.release_page(p);
                }
            }
        }
    }
    fn set_taps(&mut self, layers: &[usize]) {
        self.fwd.taps = layers.to_vec();
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn prefix_store(&mut self) -> Option<&mut dyn crate::model::prefix::PrefixStore> {
        Some(self)
    }
    fn device_sampling(&self) -> usize {
        // sample_rows keeps fixed-point sums below 2^63 and per-tile sums for up to 2^17 tokens.
        if self.fwd.noncausal || !self.fwd.taps.is_empty() || self.cfg.vocab_size > 1 << 17 {
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
    fn decode_pipelined(&self) -> bool {
        self.dev.readback_ring().is_some()
    }
    fn decode_launch(&mut self, items: &[DecodeItem]) -> Result<()> {
        self.decode_launch_dev(items)
    }
    fn decode_collect(&mut self) -> Result<Vec<u32>> {
        self.decode_collect_dev()
    }
    fn forward(&mut self, batch: &[StepInput]) -> Result<Vec<StepOutput>> {
        self.dec.fed.replace(None);
        let v = self.cfg.vocab_size;
        let h = self.cfg.hidden_size;
        let ntaps = self.fwd.taps.len();
        let mut rows = vec![];
        for (ii, it) in batch.iter().enumerate() {
            let cur = self
                .kv
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
            self.kv.check_ring(it.seq, it.start_pos)?;
            self.ensure_pages(it.seq, it.start_pos + it.tokens.len())?;
        }
        let mut outs: Vec<StepOutput> = batch
            .iter()
            .map(|it| StepOutput {
                logits: vec![],
                rows: 0,
                taps: if ntaps > 0 && !self.fwd.taps_on_device {
                    vec![0f32; it.tokens.len() * ntaps * h]
                } else {
                    vec![]
                },
            })
            .collect();
        let mut start = 0;
        let mut prof = self.fwd.prof.take();
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
            if self.fwd.noncausal {
                let ke: Vec<i32> = pass
                    .iter()
                    .map(|r| (batch[r.item].start_pos + batch[r.item].tokens.len()) as i32)
                    .collect();
                self.dev
                    .htod_staged(self.sc.kend, as_bytes(&ke))
                    .map_err(cerr)?;
            }
            if ntaps == 0 {
                self.run_layers(m, &mut prof)?;
            } else if self.fwd.taps_on_device {
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
        self.fwd.prof = prof;
        self.dev.sync().map_err(cerr)?;
        for it in batch {
            self.kv.note_written(it.seq, it.start_pos + it.tokens.len());
            self.kv.seqs.get_mut(&it.seq).unwrap().len = it.start_pos + it.tokens.len();
        }
        Ok(outs)
    }
}

impl CudaModel {
    /// The `attention_decode_tc` grid of a pass with these positions (causal rows: position + 1 keys; a
    /// non-causal draft keeps the full grid).
    pub(super) fn set_tc_cap(&self, pos: &[i32]) {
        let keys = pos
            .iter()
            .map(|&p| p.max(0) as usize + 1)
            .max()
            .unwrap_or(1);
        self.pass.tc_cap.set(if self.fwd.noncausal {
            self.shape.nsplit_tc
        } else {
            tc_grid(keys, self.shape.nsplit_tc)
        });
    }
    /// What the kernel selects read of this device.
    pub(super) fn props(&self) -> select::DevProps {
        select::DevProps {
            sms: self.dev.sms,
            smem_per_sm: self.dev.smem_per_sm,
            smem_per_block: self.dev.smem_per_block,
        }
    }

    /// Keep the taps of `forward` on the device (`taps_dev`) instead of returning them; forwards
    /// must then fit one pass. Allocates the buffer on first use.
    pub fn set_taps_on_device(&mut self, on: bool) -> Result<()> {
        if on && self.fwd.taps_dev == 0 {
            let n = self.sc.rows * self.fwd.taps.len().max(1) * self.cfg.hidden_size * 4;
            self.fwd.taps_dev = self.dev.alloc(n).map_err(cerr)?;
        }
        self.fwd.taps_on_device = on;
        Ok(())
    }

    /// run_layers, copying the residual after each tap layer into `taps_dev` (graph-capturable).
    fn run_layers_taps_dev(&self, m: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        let h = self.cfg.hidden_size;
        let ntaps = self.fwd.taps.len();
        let (dev, x, td) = (&self.dev, self.sc.x, self.fwd.taps_dev);
        let taps = self.fwd.taps.clone();
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
        // The lm_head folds the rows' argmax into their slots; one block reads them.
        let split = n <= sc.lrows;
        let (d, v) = (&self.dev, self.cfg.vocab_size);
        if self.final_logits_am(prof, n, split)? {
            return launch::sample::argmax_fin(d, prof, sc.amax_slot, n as i32, out).map_err(cerr);
        }
        if split {
            let nb = select::sample::argmax_split_blocks(v);
            return launch::sample::argmax_rows_split(
                d,
                prof,
                n as u32,
                nb,
                sc.logits,
                v as i32,
                out,
                sc.amax_slot,
                sc.amax_cnt,
            )
            .map_err(cerr);
        }
        launch::sample::argmax_rows(d, prof, n as u32, sc.logits, v as i32, out).map_err(cerr)
    }

    /// Same as run_layers, but copies the residual after each tap layer to the host.
    fn run_layers_with_taps(&self, m: usize, pass: &[Row], outs: &mut [StepOutput]) -> Result<()> {
        let h = self.cfg.hidden_size;
        let ntaps = self.fwd.taps.len();
        let mut prof = None;
        let mut hook = |li: usize| -> Result<()> {
            if let Some(t) = self.fwd.taps.iter().position(|&l| l == li) {
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
    use std::path::Path;

    /// `tc_grid` may shrink `attention_decode_tc`'s grid only where no row of the pass loses a split:
    /// every row up to the pass's longest gets from the smaller grid the splits
    /// attention/common.cuh's `tc_splits` gives it with the full one (the constants read from
    /// that file itself).
    #[test]
    fn tc_grid_keeps_every_rows_splits() {
        let src = include_str!("../../../kernels/cu/attention/common.cuh");
        let def = |name: &str| -> usize {
            let line = src
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not in attention/common.cuh"));
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        assert_eq!(
            (def("TC_CHUNK"), def("TC_SPAN"), def("TC_SPLITS")),
            (TC_CHUNK, TC_SPAN, TC_SPLITS)
        );
        // attention/common.cuh's tc_splits(len, nsplit).
        let splits = |len: usize, nsplit: usize| -> usize {
            if nsplit == 1 {
                return 1;
            }
            let want = TC_SPLITS.max(len.div_ceil(TC_SPAN));
            nsplit.min(want).min(len.div_ceil(TC_CHUNK))
        };
        for cap in [64usize, 48, 32, 20, 16, 8, 2, 1] {
            for keys in (1..=300_000usize)
                .step_by(7)
                .chain([8192, 8193, 16384, 16385, 262_144])
            {
                let g = tc_grid(keys, cap);
                assert!(
                    g <= cap && (g == cap || g == 16 || g == 32),
                    "cap {cap} keys {keys}: {g}"
                );
                for len in [1, keys / 3 + 1, keys.saturating_sub(64).max(1), keys] {
                    assert_eq!(
                        splits(len, g),
                        splits(len, cap),
                        "cap {cap} keys {keys} len {len}"
                    );
                }
            }
        }
        assert_eq!(tc_grid(2049, 64), 16);
        assert_eq!(tc_grid(8192, 64), 16);
        assert_eq!(tc_grid(8193, 64), 32);
        assert_eq!(tc_grid(16385, 64), 64);
        assert_eq!(tc_grid(131_072, 64), 64);
    }

    /// moe_decode_fused is sized for the XS-2.1 shape (H 2048, I 512, 8 + 1 slots: 26.6 KB of
    /// dynamic shared memory); wider shapes keep the separate launches.
    #[test]
    fn moe_block_fits_the_xs_shape() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
        ));
        let mut cfg = LagunaConfig::from_file(path).unwrap();
        assert_eq!(select::moe::mk_smem(&cfg), Some(4 * (2048 + 9 * 512)));
        cfg.moe_intermediate_size = 1024;
        assert_eq!(select::moe::mk_smem(&cfg), None);
        cfg.moe_intermediate_size = 512;
        cfg.hidden_size = 4096;
        assert_eq!(select::moe::mk_smem(&cfg), None);
    }

    /// Without a GPU this must report a reason, never panic; with one, a fixture must load and
    /// agree with the CPU on its prompt (the full device checks live in `laguna-dev device-test`).
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
