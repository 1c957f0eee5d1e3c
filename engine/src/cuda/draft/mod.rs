//! CUDA DFlash draft: the draft's decoder stack is a [`CudaModel`] built from the draft checkpoint
//! (dense Laguna layers, fused `qkv_proj` + `g_proj` as one GEMV) on the target's device and
//! stream, sharing the target's `embed_tokens` and `lm_head` on the device. It implements the same
//! [`DraftModel`] seam as the CPU reference ([`crate::spec::CpuDraft`]), so the backend-agnostic
//! driver ([`crate::spec::step`]) runs it unchanged; [`fused_step`] adds a device-resident greedy
//! loop (taps, proposals and verification never leave the GPU) for batch-1 decoding.
//!
//! Context write (per committed token): `rmsnorm_taps` (aux_hidden_norms) → `fc` → `hidden_norm`,
//! then per layer `input_layernorm` → the k|v rows of `qkv_proj` (a view into the fused weight,
//! no q work) → `qk_norm_rope_kv` with no query heads (k_norm, RoPE at the absolute position,
//! written into the draft's paged BF16 cache).
//!
//! Propose: an ordinary forward of `[last, mask x k]` at positions `start..start+k` (its K/V go to
//! the cache at those positions, then the length is set back, so the context is unchanged and the
//! next context write overwrites them). Causal drafts see keys up to their own position, which is
//! the target's rule; non-causal drafts see the whole block (`kend`, [`CudaModel::noncausal`]).
pub mod fused_step;

use super::launch::attention as la;
use super::launch::Geom;
use super::{
    as_bytes, cerr, device, launch, load, ring, CudaModel, CudaOptions, LayerW, Lin, MlpW, Parts,
};
use crate::config::LagunaConfig;
use crate::config::{AttnKind, LayerSpec, MlpKind};
use crate::error::{EngineError, Result};
use crate::generate::GenerateRequest;
use crate::model::device::{DeviceDraft, FusedRun, LoopTiming};
use crate::model::{LogitRows, Model, SeqId, StepInput, StepOutput};
use crate::spec::config::DraftConfig;
use crate::spec::draft::{BlockInput, ContextInput, DraftModel};
use crate::spec::driver::{SpecState, StepResult};
use crate::spec::verify::Verdict;
use crate::weights::linear::kv_scale_pair;
use crate::weights::store::WeightStore;
use fused_step::{FusedStep, SeqStep};
use load::Loader;
use std::path::Path;

pub struct CudaDraft {
    cfg: DraftConfig,
    /// The draft stack (embed and lm_head are the target's device tensors).
    pub(super) m: CudaModel,
    target_hidden: usize,
    fc: Lin,
    /// aux_hidden_norms concatenated, [num_taps * target_hidden] f32.
    aux: u64,
    hidden_norm: u64,
    /// k|v rows of each layer's fused projection.
    kv: Vec<Lin>,
    /// Host-uploaded taps [rows, num_taps * target_hidden] (generic path).
    tbuf: u64,
    tnorm: u64,
    c: u64,
    c2: u64,
    kvbuf: u64,
    /// Context pass metadata (positions, seqrow 0), separate from the propose pass's.
    pub(super) cpos: u64,
    pub(super) cseq: u64,
    /// Bytes one propose reads from weights (layers, fc, lm_head once).
    step_weight_bytes: usize,
    /// The device-resident greedy step (graphs per (k, batch, grid)) used by `fused_greedy_step`.
    fused: FusedStep,
    /// The device loop over whole requests (`generate_on_device`), apart from `fused` so each
    /// path captures its own steps.
    request_loop: FusedStep,
    /// Whether `fused_greedy_step` may run (true; the device check turns it off to run the
    /// generic driver on the same batches).
    fused_steps: bool,
}

/// The draft's decoder stack as a Laguna config (dense layers, the draft's window and rope).
fn stack_config(d: &DraftConfig, t: &LagunaConfig) -> LagunaConfig {
    let mut c = t.clone();
    c.hidden_size = d.hidden_size;
    c.intermediate_size = d.intermediate_size;
    c.num_layers = d.num_layers;
    c.num_kv_heads = d.num_kv_heads;
    c.head_dim = d.head_dim;
    c.rms_norm_eps = d.rms_norm_eps;
    c.num_experts = 0;
    c.top_k = 0;
    c.moe_intermediate_size = 0;
    c.shared_expert_intermediate_size = 0;
    c.sliding_window = d.window;
    c.gating = d.gating;
    c.layers = (0..d.num_layers)
        .map(|l| LayerSpec {
            attn: if d.window.is_some() {
                AttnKind::Sliding
            } else {
                AttnKind::Full
            },
            num_heads: d.num_heads[l],
            mlp: MlpKind::Dense,
            rope: d.rope.clone(),
            sinks: d.sinks,
        })
        .collect();
    c
}

impl CudaDraft {
    /// Bytes of the sliding-window rings a draft at `dir` takes next to a target loaded with
    /// `opts` (the part of a K/V budget to keep for it); 0 for a draft without a window.
    pub fn ring_bytes(dir: &Path, opts: &CudaOptions) -> Result<usize> {
        let cfg = DraftConfig::from_file(&dir.join("config.json"))?;
        let windows = vec![cfg.window.unwrap_or(0); cfg.num_layers];
        let elt = if opts.kv_fp8 { 1 } else { 2 };
        let kvw = cfg.num_kv_heads * cfg.head_dim;
        let l = ring::kv_layout(
            &windows,
            opts.rings,
            opts.spec_k,
            opts.max_seqs,
            kvw,
            elt,
            opts.page_size,
            usize::MAX,
        )
        .map_err(EngineError::Other)?;
        // A draft whose layers all keep a window snapshots its rings into buffers of its own.
        let snaps = if cfg.window.is_some() {
            opts.own_snapshots
        } else {
            0
        };
        Ok(l.ring_bytes * (1 + snaps))
    }

    /// Load a draft folder onto the target's GPU: rings for the target's `max_seqs` sequences
    /// (window + spec_k slots), or as many positions as the target's pool for a draft without a
    /// window.
    pub fn load(dir: &Path, target: &CudaModel) -> Result<CudaDraft> {
        let t0 = std::time::Instant::now();
        let cfg = DraftConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(dir)?;
        cfg.validate_target(&target.cfg)?;
        load::refuse_unless_fits(&target.dev, store.data_bytes(), dir)?;
        let tcfg = &target.cfg;
        let h = cfg.hidden_size;
        let th = tcfg.hidden_size;
        if h != th {
            return Err(EngineError::Other(format!("draft hidden_size {h} differs from the target's {th}: the draft shares the target's embeddings")));
        }
        let hd = cfg.head_dim;
        load::check_head_dim(hd, "draft ")?;
        let kvw = cfg.num_kv_heads * hd;
        let ntaps = cfg.num_taps();
        let scfg = stack_config(&cfg, tcfg);
        for name in [
            "embed_tokens.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
        ] {
            if store.contains(name) {
                tracing::warn!("draft checkpoint carries `{name}`; Laguna DFlash ignores it and uses the target's");
            }
        }
        let dev = target.dev.clone();
        let mut ld = Loader {
            dev: &dev,
            store: &store,
            pb: None,
            bytes: 0,
            drop_pages: dev.integrated(),
        };
        let lin_bytes = |l: &Lin| {
            if l.fp4 {
                l.n * l.k / 2 + l.n * l.k / 16
            } else {
                l.n * l.k * 2
            }
        };
        let fc = ld.lin("fc", h, ntaps * th)?;
        let mut auxv: Vec<u8> = vec![];
        for i in 0..ntaps {
            let v = store.vector(&format!("aux_hidden_norms.{i}.weight"), th)?;
            auxv.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        }
        let aux = ld.upload(&auxv)?;
        let hidden_norm = ld.vec_f32("hidden_norm.weight", h)?;
        let final_norm = ld.vec_f32("norm.weight", h)?;
        let mut step_bytes = lin_bytes(&target.w.lm_head);
        let mut layers = vec![];
        let mut kv = vec![];
        for l in 0..cfg.num_layers {
            let p = format!("layers.{l}");
            let kvs = kv_scale_pair(&store, &p)?;
            let nh = cfg.num_heads[l];
            let qw = nh * hd;
            let gw = cfg.gate_width(l);
            let mut parts = vec![(format!("{p}.self_attn.qkv_proj"), qw + 2 * kvw)];
            if gw > 0 {
                parts.push((format!("{p}.self_attn.g_proj"), gw));
            }
            let qkvg = ld.lin_cat(&parts, h)?.ok_or_else(|| {
                EngineError::Other(format!("{p}.self_attn: the CUDA draft needs BF16/F16/F32 attention projections (NVFP4 found)"))
            })?;
            kv.push(Lin::bf16(qkvg.w + (qw * h * 2) as u64, 2 * kvw, h));
            let dummy = |n: usize| Lin::bf16(0, n, h);
            let o = ld.lin(&format!("{p}.self_attn.o_proj"), h, qw)?;
            let mlp = ld.dense_mlp(&p, cfg.intermediate_size, h)?;
            step_bytes += lin_bytes(&qkvg) + lin_bytes(&o);
            if let MlpW::Dense { gate, up, down, .. } = &mlp {
                step_bytes += lin_bytes(gate) + lin_bytes(up) + lin_bytes(down);
            }
            let inv_freq = cfg.rope.inv_freq();
            let ifb: Vec<u8> = inv_freq.iter().flat_map(|x| x.to_le_bytes()).collect();
            layers.push(LayerW {
                input_norm: ld.vec_f32(&format!("{p}.input_layernorm.weight"), h)?,
                post_norm: ld.vec_f32(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q: dummy(qw),
                k: dummy(kvw),
                v: dummy(kvw),
                o,
                g: if gw > 0 { Some(dummy(gw)) } else { None },
                qkvg: Some(qkvg),
                q_norm: ld.vec_f32(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                k_norm: ld.vec_f32(&format!("{p}.self_attn.k_norm.weight"), hd)?,
                sink: if cfg.sinks {
                    ld.vec_f32(&format!("{p}.self_attn.sink"), nh)?
                } else {
                    0
                },
                inv_freq: ld.upload(&ifb)?,
                half: inv_freq.len(),
                attn_factor: cfg.rope.attention_factor as f32,
                window: cfg.window.unwrap_or(0),
                nh,
                mlp,
                kc: 0,
                vc: 0,
                ring: false,
                kscale: kvs.0,
                vscale: kvs.1,
            });
        }
        let weight_bytes = ld.bytes;
        drop(ld);
        load::log_load_peak(&dev, &store, "draft");
        // K/V: rings for as many sequences as the target (all draft layers share one window), or
        // as many pages as the target's pool when the draft has no window.
        let (tpages, tps, _) = target.kv_pool();
        let elt = if target.kv_fp8() { 1 } else { 2 };
        let topts = &target.opts;
        let pool = match cfg.window {
            Some(w) if w > 0 && topts.rings => {
                cfg.num_layers * topts.max_seqs.max(1) * (w + topts.spec_k) * kvw * 2 * elt
            }
            _ => tpages * tps * kvw * 2 * elt * cfg.num_layers,
        };
        let opts = CudaOptions {
            kv_pool_bytes: Some(pool),
            page_size: tps,
            progress: false,
            graphs: false,
            ..target.opts.clone()
        };
        let parts = Parts {
            embed: target.w.embed,
            final_norm,
            lm_head: target.w.lm_head,
            layers,
            weight_bytes,
            decode_bytes: step_bytes,
            min_in: ntaps * th,
        };
        let mut m = CudaModel::finish(scfg, dev.clone(), opts, t0, parts)?;
        m.fwd.noncausal = !cfg.causal;
        let r = m.sc.rows;
        let a = |n: usize| dev.alloc(n.max(16)).map_err(cerr);
        let d = CudaDraft {
            target_hidden: th,
            fc,
            aux,
            hidden_norm,
            kv,
            tbuf: a(4 * r * ntaps * th)?,
            tnorm: a(4 * r * ntaps * th)?,
            c: a(4 * r * h)?,
            c2: a(4 * r * h)?,
            kvbuf: a(4 * r * 2 * kvw)?,
            cpos: a(4 * r)?,
            cseq: a(4 * r)?,
            step_weight_bytes: step_bytes + lin_bytes(&fc),
            fused: Default::default(),
            request_loop: Default::default(),
            fused_steps: true,
            cfg,
            m,
        };
        dev.htod(d.cseq, &vec![0u8; 4 * r]).map_err(cerr)?;
        dev.sync().map_err(cerr)?;
        Ok(d)
    }

    /// Rows per context pass: the pass size, at most the ring's slots (rows of one context write
    /// land in distinct ring slots; a newer row's slot is never written by an older row after it).
    pub fn max_rows(&self) -> usize {
        if self.m.kv.ring > 0 {
            self.m.sc.rows.min(self.m.kv.ring)
        } else {
            self.m.sc.rows
        }
    }

    /// Context K/V for `n` rows whose taps are on the device at `taps` ([n, num_taps * target
    /// hidden], row stride `ldt` floats), at the positions already in `cpos`, for the sequence whose
    /// block-table row is already in the draft's `bt` (row 0). No host work: graph-capturable.
    pub(super) fn context_pass(
        &self,
        prof: &mut Option<device::Prof>,
        taps: u64,
        ldt: usize,
        n: usize,
    ) -> Result<()> {
        let m = &self.m;
        let cfg = &self.cfg;
        let th = self.target_hidden;
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let nkv = cfg.num_kv_heads;
        let kvw = nkv * hd;
        let ntaps = cfg.num_taps();
        let eps = cfg.rms_norm_eps as f32;
        let w = ntaps * th;
        let src = if ldt == w {
            taps
        } else {
            m.dev
                .launch_p(prof, "copy_rows", (n as u32, 1, 1), (256, 1, 1), 0, |b| {
                    b.u64(taps)
                        .i32(ldt as i32)
                        .u64(self.tbuf)
                        .i32(w as i32)
                        .i32(w as i32);
                })
                .map_err(cerr)?;
            self.tbuf
        };
        let blk = launch::norm::norm_block(th);
        m.dev
            .launch_p(
                prof,
                "rmsnorm_taps",
                ((n * ntaps) as u32, 1, 1),
                (blk, 1, 1),
                0,
                |b| {
                    b.u64(src)
                        .u64(self.aux)
                        .u64(self.tnorm)
                        .i32(th as i32)
                        .i32(ntaps as i32)
                        .f32(eps);
                },
            )
            .map_err(cerr)?;
        m.linear(prof, "fc", &self.fc, self.tnorm, w, self.c, h, n, false)?;
        m.rmsnorm(prof, self.c, 0, self.hidden_norm, self.c2, n, h, eps)?;
        for (l, kv) in self.m.w.layers.iter().zip(&self.kv) {
            m.rmsnorm(prof, self.c2, 0, l.input_norm, m.sc.hn, n, h, eps)?;
            m.linear(
                prof,
                "attn_proj",
                kv,
                m.sc.hn,
                h,
                self.kvbuf,
                2 * kvw,
                n,
                false,
            )?;
            // The context rows' K/V: k normed and rotated, written with v (no query heads).
            let ka = m.kv_args(l);
            let a = la::QkStore {
                q: self.kvbuf,
                ldq: (2 * kvw) as i32,
                k: self.kvbuf,
                v: self.kvbuf + (4 * kvw) as u64,
                ldkv: (2 * kvw) as i32,
                rope: la::Rope {
                    q_norm: l.k_norm,
                    k_norm: l.k_norm,
                    inv_freq: l.inv_freq,
                    half: l.half as i32,
                    attn_factor: l.attn_factor,
                    eps,
                },
                cache: la::Cache {
                    pos: self.cpos,
                    seqrow: self.cseq,
                    bt: ka.bt,
                    max_pages: ka.max_pages as i32,
                    page_size: ka.page_size as i32,
                    kc: l.kc,
                    vc: l.vc,
                },
                nh: 0,
                nkv: nkv as i32,
                hd: hd as i32,
                ks: 0,
                vs: 0,
                kinv: 1.0 / l.kscale,
                vinv: 1.0 / l.vscale,
            };
            let grid = (n as u32, nkv.div_ceil(4) as u32, 1);
            let fp8 = m.kv.elt == 1;
            la::qk_norm_rope_store(&m.dev, prof, fp8, Geom::new(grid, 128, 0), &a).map_err(cerr)?;
        }
        Ok(())
    }

    /// Context length bookkeeping after a device-side context write of rows `start..start+n`.
    pub(super) fn set_context_len(&mut self, seq: SeqId, len: usize) {
        if let Some(s) = self.m.kv.seqs.get_mut(&seq) {
            s.len = len;
        }
    }
}

impl DraftModel for CudaDraft {
    fn config(&self) -> &DraftConfig {
        &self.cfg
    }
    fn device(&self) -> &str {
        "cuda"
    }
    fn new_seq(&mut self) -> Result<SeqId> {
        self.m.new_seq()
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.m.free_seq(seq)
    }
    fn context_len(&self, seq: SeqId) -> usize {
        self.m.seq_len(seq)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        self.m.truncate(seq, len)
    }
    fn prefix_store(&mut self) -> Option<&mut dyn crate::model::prefix::PrefixStore> {
        Some(&mut self.m)
    }
    fn write_context(&mut self, batch: &[ContextInput]) -> Result<()> {
        let width = self.cfg.num_taps() * self.target_hidden;
        for item in batch {
            let n = item.rows(width, self.m.kv.seqs.get(&item.seq).map(|s| s.len))?;
            self.m.truncate(item.seq, item.start_pos);
            self.m.kv.check_ring(item.seq, item.start_pos)?;
            self.m.ensure_pages(item.seq, item.start_pos + n)?;
            self.m.upload_tables(&[item.seq])?;
            let mut prof = self.m.fwd.prof.take();
            let rows = self.max_rows();
            let mut r0 = 0;
            while r0 < n {
                let cnt = (n - r0).min(rows);
                let pos: Vec<i32> = (0..cnt).map(|i| (item.start_pos + r0 + i) as i32).collect();
                self.m.dev.htod(self.cpos, as_bytes(&pos)).map_err(cerr)?;
                self.m
                    .dev
                    .htod(self.cseq, as_bytes(&vec![0i32; cnt]))
                    .map_err(cerr)?;
                self.m
                    .dev
                    .htod(
                        self.tbuf,
                        as_bytes(&item.taps[r0 * width..(r0 + cnt) * width]),
                    )
                    .map_err(cerr)?;
                // Stream-ordered: the next chunk's uploads (which synchronise) follow this pass.
                self.context_pass(&mut prof, self.tbuf, width, cnt)?;
                r0 += cnt;
            }
            self.m.fwd.prof = prof;
            self.m.kv.note_written(item.seq, item.start_pos + n);
            self.set_context_len(item.seq, item.start_pos + n);
        }
        Ok(())
    }
    /// Greedy batches of a CUDA target run as one device step (`FusedStep::step_batch`: proposals,
    /// verification, acceptance and context on the GPU, one CUDA graph per (k, batch), one
    /// read-back) when all rows fit one weight-streaming pass; the driver's generic step otherwise.
    fn fused_greedy_step(
        &mut self,
        target: &mut dyn Model,
        states: &mut [&mut SpecState],
    ) -> Option<Result<Vec<StepResult>>> {
        let t = target.as_any_mut()?.downcast_mut::<CudaModel>()?;
        let k = states.first()?.k;
        if !self.fused_steps || !FusedStep::fits(t, self, k, states.len()) {
            return None;
        }
        let mut fused = std::mem::take(&mut self.fused);
        let r = (|| -> Result<Vec<StepResult>> {
            fused.prepare(t, self)?;
            let seqs: Vec<SeqStep> = states
                .iter()
                .map(|s| SeqStep {
                    tseq: s.target_seq,
                    dseq: s.draft_seq,
                    t: *s.tokens.last().expect("prefilled"),
                    tlen: s.tokens.len(),
                })
                .collect();
            // The bench's acceptance oracle (all states have one, or none: `spec::step`).
            let mut planned = vec![];
            for s in states.iter_mut() {
                if let Some(o) = s.oracle.as_mut() {
                    planned.extend(o.proposals(&s.tokens, k)?);
                }
            }
            let oracle = (!planned.is_empty()).then_some(planned.as_slice());
            let outs = fused.step_batch(t, self, &seqs, k, oracle, &mut Default::default());
            // Later prefill or sampling steps run the generic driver, which takes taps on the host.
            t.set_taps_on_device(false)?;
            let mut res = Vec::with_capacity(states.len());
            for (s, (a, emitted, d)) in states.iter_mut().zip(outs?) {
                let v = s.oracle_verdict(
                    k,
                    Verdict {
                        accepted: a,
                        tokens: emitted,
                    },
                )?;
                res.push(s.commit(d, v));
            }
            Ok(res)
        })();
        self.fused = fused;
        Some(r)
    }
    fn propose(&mut self, batch: &[BlockInput]) -> Result<Vec<StepOutput>> {
        let inputs: Vec<StepInput> = batch
            .iter()
            .map(|b| StepInput {
                seq: b.seq,
                tokens: b.tokens,
                start_pos: b.start_pos,
                logits: LogitRows::All,
            })
            .collect();
        // Blocks write K/V at start_pos.. and are rolled back below: they must fit the rings'
        // spare slots, or later context writes would find keys overwritten.
        if let Some(spare) = self.m.ring_spare() {
            if let Some(b) = batch.iter().find(|b| b.tokens.len() > spare + 1) {
                return Err(EngineError::Other(format!(
                    "a draft block of {} rows exceeds the sliding-window ring's {spare} spare slots; load the draft with spec_k >= {}",
                    b.tokens.len(),
                    b.tokens.len() - 1
                )));
            }
        }
        let outs = self.m.forward(&inputs)?;
        for b in batch {
            self.m
                .kv
                .seqs
                .get_mut(&b.seq)
                .expect("forward checked it")
                .len = b.start_pos;
        }
        Ok(outs)
    }
}

impl DeviceDraft for CudaDraft {
    fn step_weight_bytes(&self) -> usize {
        self.step_weight_bytes
    }
    fn set_fused_steps(&mut self, on: bool) {
        self.fused_steps = on;
    }
    fn generate_on_device(
        &mut self,
        target: &mut dyn Model,
        req: &GenerateRequest,
        k: usize,
        keep_history: bool,
        timing: LoopTiming,
    ) -> Result<FusedRun> {
        let t = target
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<CudaModel>())
            .ok_or_else(|| {
                EngineError::Other("the CUDA draft's device loop needs a CUDA target".into())
            })?;
        let mut lp = std::mem::take(&mut self.request_loop);
        // A failed graph capture turns the loop's graphs off for good; an eager profile only
        // for its own run.
        let graphs = lp.use_graphs;
        lp.timing = timing == LoopTiming::Segments;
        if timing == LoopTiming::Kernels {
            lp.use_graphs = false;
            lp.prof = Some(Default::default());
        }
        let r = lp.generate(t, self, req, k, keep_history);
        let kernels = lp.prof.take().map(|ps| ps.map(|mut p| p.summary()));
        if timing == LoopTiming::Kernels {
            lp.use_graphs = graphs;
        }
        self.request_loop = lp;
        r.map(|r| FusedRun { kernels, ..r })
    }
}
