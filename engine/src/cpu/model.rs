//! CPU reference backend: f32 weights (BF16 upcast, NVFP4 dequantized exactly) and f32/f64
//! arithmetic, one row at a time. Slow and simple on purpose: it is the definition the CUDA
//! backend is tested against.
use super::ops::*;
use super::prefix::CpuKv;
use crate::config::{AttnKind, LagunaConfig, MlpKind};
use crate::error::{EngineError, Result};
use crate::model::prefix::PrefixStore;
use crate::model::schema::layer_prefix;
use crate::model::{LogitRows, Model, SeqId, StepInput, StepOutput};
use crate::weights::linear::{fp8_kv_round, kv_scales, to_f32};
use crate::weights::store::WeightStore;
use std::path::Path;

/// A dense f32 matrix `[out, inp]`.
pub struct Mat {
    pub w: Vec<f32>,
    pub out: usize,
    pub inp: usize,
}

impl Mat {
    pub fn load(store: &WeightStore, prefix: &str, out: usize, inp: usize) -> Result<Mat> {
        Ok(Mat {
            w: store.linear(prefix, out, inp)?.to_f32()?,
            out,
            inp,
        })
    }
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        linear(&self.w, x, self.out)
    }
}

pub struct Ffn {
    pub gate: Mat,
    pub up: Mat,
    pub down: Mat,
}

impl Ffn {
    pub fn load(store: &WeightStore, prefix: &str, inter: usize, h: usize) -> Result<Ffn> {
        Ok(Ffn {
            gate: Mat::load(store, &format!("{prefix}.gate_proj"), inter, h)?,
            up: Mat::load(store, &format!("{prefix}.up_proj"), inter, h)?,
            down: Mat::load(store, &format!("{prefix}.down_proj"), h, inter)?,
        })
    }
    /// down(silu(gate(x)) * up(x))
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let g = self.gate.apply(x);
        let u = self.up.apply(x);
        let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        self.down.apply(&a)
    }
}

pub struct Moe {
    pub router: Mat,
    pub bias: Vec<f32>,
    pub experts: Vec<Ffn>,
    pub shared: Option<Ffn>,
}

pub enum Mlp {
    Dense(Ffn),
    Moe(Moe),
}

pub struct Layer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub q: Mat,
    pub k: Mat,
    pub v: Mat,
    pub o: Mat,
    pub g: Option<Mat>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub sink: Option<Vec<f32>>,
    pub mlp: Mlp,
    /// Per position: cos/sin tables are built on demand from these.
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

/// Per-sequence K/V: for each layer, rows of `kv_heads * head_dim` per position.
#[derive(Default, Clone, Debug)]
pub struct SeqKv {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub len: usize,
}

impl SeqKv {
    pub fn with_layers(layers: usize) -> SeqKv {
        SeqKv {
            k: vec![vec![]; layers],
            v: vec![vec![]; layers],
            len: 0,
        }
    }

    /// Keep positions `[0, len)`; `row` is the width of one position's K (or V) row.
    pub fn truncate(&mut self, len: usize, row: usize) {
        if len < self.len {
            for l in self.k.iter_mut().chain(self.v.iter_mut()) {
                l.truncate(len * row);
            }
            self.len = len;
        }
    }
}

pub struct CpuModel {
    pub cfg: LagunaConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// None when tied to the embedding.
    pub lm_head: Option<Mat>,
    /// Per-sequence K/V and the prefix cache's blocks and snapshots.
    kv: CpuKv,
    next_id: SeqId,
    taps: Vec<usize>,
    /// Per layer (k_scale, v_scale) from the checkpoint (1.0 when absent).
    kv_scales: Vec<(f32, f32)>,
    /// Round K/V as an FP8 E4M3 cache stores them (the reference for the GPU's FP8 K/V).
    kv_fp8: bool,
}

impl CpuModel {
    pub fn load(dir: &Path) -> Result<CpuModel> {
        let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(dir)?;
        Self::from_store(cfg, &store)
    }

    pub fn from_store(cfg: LagunaConfig, store: &WeightStore) -> Result<CpuModel> {
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let kvw = cfg.num_kv_heads * hd;
        let embed = to_f32(&store.expect("model.embed_tokens.weight", &[cfg.vocab_size, h])?)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, spec) in cfg.layers.iter().enumerate() {
            let p = layer_prefix(i);
            let qw = spec.num_heads * hd;
            let mlp = match spec.mlp {
                MlpKind::Dense => Mlp::Dense(Ffn::load(
                    store,
                    &format!("{p}.mlp"),
                    cfg.intermediate_size,
                    h,
                )?),
                MlpKind::Sparse => {
                    let router = Mat::load(store, &format!("{p}.mlp.gate"), cfg.num_experts, h)?;
                    let bias = store.vector(
                        &format!("{p}.mlp.experts.e_score_correction_bias"),
                        cfg.num_experts,
                    )?;
                    let experts = (0..cfg.num_experts)
                        .map(|e| {
                            Ffn::load(
                                store,
                                &format!("{p}.mlp.experts.{e}"),
                                cfg.moe_intermediate_size,
                                h,
                            )
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let shared = if cfg.shared_expert_intermediate_size > 0 {
                        Some(Ffn::load(
                            store,
                            &format!("{p}.mlp.shared_expert"),
                            cfg.shared_expert_intermediate_size,
                            h,
                        )?)
                    } else {
                        None
                    };
                    Mlp::Moe(Moe {
                        router,
                        bias,
                        experts,
                        shared,
                    })
                }
            };
            let gw = cfg.gate_width(i);
            layers.push(Layer {
                input_norm: store.vector(&format!("{p}.input_layernorm.weight"), h)?,
                post_norm: store.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q: Mat::load(store, &format!("{p}.self_attn.q_proj"), qw, h)?,
                k: Mat::load(store, &format!("{p}.self_attn.k_proj"), kvw, h)?,
                v: Mat::load(store, &format!("{p}.self_attn.v_proj"), kvw, h)?,
                o: Mat::load(store, &format!("{p}.self_attn.o_proj"), h, qw)?,
                g: if gw > 0 {
                    Some(Mat::load(store, &format!("{p}.self_attn.g_proj"), gw, h)?)
                } else {
                    None
                },
                q_norm: store.vector(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                k_norm: store.vector(&format!("{p}.self_attn.k_norm.weight"), hd)?,
                sink: if spec.sinks {
                    Some(store.vector(&format!("{p}.self_attn.sink"), spec.num_heads)?)
                } else {
                    None
                },
                mlp,
                inv_freq: spec.rope.inv_freq(),
                attention_factor: spec.rope.attention_factor as f32,
            });
        }
        let norm = store.vector("model.norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(Mat::load(store, "lm_head", cfg.vocab_size, h)?)
        };
        let kv_scales = kv_scales(store, cfg.num_layers)?;
        let windows = (0..cfg.num_layers)
            .map(|i| match (cfg.layers[i].attn, cfg.sliding_window) {
                (AttnKind::Sliding, Some(w)) => Some(w),
                _ => None,
            })
            .collect();
        let kv = CpuKv::new(windows, kvw);
        Ok(CpuModel {
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            kv,
            next_id: 1,
            taps: vec![],
            kv_scales,
            kv_fp8: false,
        })
    }

    /// The prefix cache's block size and budget (blocks its exports may hold).
    pub fn set_prefix_cache(&mut self, block: usize, budget: usize) {
        self.kv.set_block_size(block);
        self.kv.set_budget(budget);
    }

    /// The prefix cache's budget in bytes of K/V it may hold.
    pub fn set_prefix_budget_bytes(&mut self, bytes: usize) {
        self.kv.set_budget_bytes(bytes);
    }

    /// Keep K/V as an FP8 E4M3 cache would (value / scale rounded to E4M3, times scale).
    pub fn set_kv_fp8(&mut self, on: bool) {
        self.kv_fp8 = on;
    }

    pub fn embed_row(&self, tok: u32) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let t = tok as usize;
        if t >= self.cfg.vocab_size {
            return Err(EngineError::Request(format!(
                "token id {tok} is outside the vocabulary (size {})",
                self.cfg.vocab_size
            )));
        }
        Ok(self.embed[t * h..(t + 1) * h].to_vec())
    }

    /// Final norm + lm_head (tied or not).
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let y = rmsnorm(x, &self.norm, self.cfg.rms_norm_eps);
        self.lm_head_apply(&y)
    }

    /// lm_head on an already normalised row (DFlash reuses it after the draft's own norm).
    pub fn lm_head_apply(&self, y: &[f32]) -> Vec<f32> {
        match &self.lm_head {
            Some(m) => m.apply(y),
            None => linear(&self.embed, y, self.cfg.vocab_size),
        }
    }

    fn rope_tables(layer: &Layer, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        let cos = layer
            .inv_freq
            .iter()
            .map(|&f| (p * f).cos() * layer.attention_factor)
            .collect();
        let sin = layer
            .inv_freq
            .iter()
            .map(|&f| (p * f).sin() * layer.attention_factor)
            .collect();
        (cos, sin)
    }

    fn moe(&self, moe: &Moe, x: &[f32]) -> Vec<f32> {
        let cfg = &self.cfg;
        let mut logits = moe.router.apply(x);
        if cfg.router_softcap > 0.0 {
            let c = cfg.router_softcap as f32;
            for l in logits.iter_mut() {
                *l = (*l / c).tanh() * c;
            }
        }
        let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let sel_scores: Vec<f32> = scores.iter().zip(&moe.bias).map(|(s, b)| s + b).collect();
        // top-k by biased score; ties go to the lower expert index.
        let mut idx: Vec<usize> = (0..cfg.num_experts).collect();
        idx.sort_by(|&a, &b| {
            sel_scores[b]
                .partial_cmp(&sel_scores[a])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        let chosen = &idx[..cfg.top_k];
        let mut w: Vec<f64> = chosen.iter().map(|&e| scores[e] as f64).collect();
        if cfg.norm_topk_prob {
            let s: f64 = w.iter().sum();
            for v in w.iter_mut() {
                *v /= s;
            }
        }
        let h = cfg.hidden_size;
        let mut acc = vec![0f64; h];
        for (k, &e) in chosen.iter().enumerate() {
            let y = moe.experts[e].apply(x);
            for i in 0..h {
                acc[i] += w[k] * y[i] as f64;
            }
        }
        let scale = cfg.routed_scaling_factor;
        let shared = moe.shared.as_ref().map(|s| s.apply(x));
        (0..h)
            .map(|i| (acc[i] * scale + shared.as_ref().map_or(0.0, |s| s[i] as f64)) as f32)
            .collect()
    }

    /// Run `tokens` of one sequence at positions start..start+n; returns (final residual rows, taps).
    fn run_seq(
        &self,
        kv: &mut SeqKv,
        tokens: &[u32],
        start: usize,
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
        let cfg = &self.cfg;
        let (h, hd, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_kv_heads);
        let eps = cfg.rms_norm_eps;
        if start != kv.len {
            return Err(EngineError::Other(format!(
                "forward at position {start} but the sequence holds {} positions",
                kv.len
            )));
        }
        if kv.k.is_empty() {
            kv.k = vec![vec![]; cfg.num_layers];
            kv.v = vec![vec![]; cfg.num_layers];
        }
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| self.embed_row(t))
            .collect::<Result<_>>()?;
        let n = tokens.len();
        let ntaps = self.taps.len();
        let mut taps = vec![0f32; if ntaps > 0 { n * ntaps * h } else { 0 }];
        let scale = 1.0 / (hd as f64).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            let spec = &cfg.layers[li];
            let nh = spec.num_heads;
            let group = nh / nkv;
            // Projections, norms and rope for every row first, so all rows' K/V are in the cache.
            let mut hs = Vec::with_capacity(n);
            let mut qs = Vec::with_capacity(n);
            for (r, x) in xs.iter().enumerate() {
                let hn = rmsnorm(x, &layer.input_norm, eps);
                let mut q = layer.q.apply(&hn);
                let mut k = layer.k.apply(&hn);
                let v = layer.v.apply(&hn);
                rmsnorm_heads(&mut q, &layer.q_norm, hd, eps);
                rmsnorm_heads(&mut k, &layer.k_norm, hd, eps);
                let (cos, sin) = Self::rope_tables(layer, start + r);
                rope_heads(&mut q, hd, &cos, &sin);
                rope_heads(&mut k, hd, &cos, &sin);
                kv.k[li].truncate((start + r) * nkv * hd);
                kv.v[li].truncate((start + r) * nkv * hd);
                if self.kv_fp8 {
                    let (ks, vs) = self.kv_scales[li];
                    kv.k[li].extend(k.iter().map(|&x| fp8_kv_round(x, ks)));
                    kv.v[li].extend(v.iter().map(|&x| fp8_kv_round(x, vs)));
                } else {
                    kv.k[li].extend_from_slice(&k);
                    kv.v[li].extend_from_slice(&v);
                }
                hs.push(hn);
                qs.push(q);
            }
            for r in 0..n {
                let pos = start + r;
                let lo = match (spec.attn, cfg.sliding_window) {
                    (AttnKind::Sliding, Some(w)) => (pos + 1).saturating_sub(w),
                    _ => 0,
                };
                let mut attn = vec![0f32; nh * hd];
                for head in 0..nh {
                    let kvh = head / group;
                    let q = &qs[r][head * hd..(head + 1) * hd];
                    let row = |j: usize| (j * nkv + kvh) * hd..(j * nkv + kvh + 1) * hd;
                    let (ks, vs) = (&kv.k[li], &kv.v[li]);
                    let sink = layer.sink.as_ref().map(|s| s[head] as f64);
                    attend(
                        q,
                        pos + 1 - lo,
                        |j| &ks[row(lo + j)],
                        |j| &vs[row(lo + j)],
                        scale,
                        sink,
                        &mut attn[head * hd..(head + 1) * hd],
                    );
                }
                if let Some(g) = &layer.g {
                    apply_gate(&mut attn, g.apply(&hs[r]), cfg.gating, hd);
                }
                let o = layer.o.apply(&attn);
                for (xi, oi) in xs[r].iter_mut().zip(&o) {
                    *xi += oi;
                }
                let h2 = rmsnorm(&xs[r], &layer.post_norm, eps);
                let m = match &layer.mlp {
                    Mlp::Dense(f) => f.apply(&h2),
                    Mlp::Moe(moe) => self.moe(moe, &h2),
                };
                for (xi, mi) in xs[r].iter_mut().zip(&m) {
                    *xi += mi;
                }
                if let Some(t) = self.taps.iter().position(|&l| l == li) {
                    let off = (r * ntaps + t) * h;
                    taps[off..off + h].copy_from_slice(&xs[r]);
                }
            }
        }
        kv.len = start + n;
        Ok((xs, taps))
    }
}

impl Model for CpuModel {
    fn config(&self) -> &LagunaConfig {
        &self.cfg
    }
    fn device(&self) -> &str {
        "cpu"
    }
    fn new_seq(&mut self) -> Result<SeqId> {
        let id = self.next_id;
        self.next_id += 1;
        self.kv.seqs.insert(id, SeqKv::default());
        Ok(id)
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.kv.seqs.remove(&seq);
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        self.kv.seqs.get(&seq).map_or(0, |s| s.len)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        let row = self.cfg.num_kv_heads * self.cfg.head_dim;
        if let Some(s) = self.kv.seqs.get_mut(&seq) {
            s.truncate(len, row);
        }
    }
    fn set_taps(&mut self, layers: &[usize]) {
        self.taps = layers.to_vec();
    }
    fn prefix_store(&mut self) -> Option<&mut dyn PrefixStore> {
        Some(&mut self.kv)
    }
    fn forward(&mut self, batch: &[StepInput]) -> Result<Vec<StepOutput>> {
        let mut outs = Vec::with_capacity(batch.len());
        for item in batch {
            let mut kv = self
                .kv
                .seqs
                .remove(&item.seq)
                .ok_or_else(|| EngineError::Other(format!("unknown sequence {}", item.seq)))?;
            let res = self.run_seq(&mut kv, item.tokens, item.start_pos);
            self.kv.seqs.insert(item.seq, kv);
            let (xs, taps) = res?;
            let rows: Vec<&Vec<f32>> = match item.logits {
                LogitRows::None => vec![],
                LogitRows::Last => xs.last().into_iter().collect(),
                LogitRows::All => xs.iter().collect(),
            };
            let mut logits = Vec::with_capacity(rows.len() * self.cfg.vocab_size);
            for x in &rows {
                logits.extend(self.logits(x));
            }
            outs.push(StepOutput {
                logits,
                rows: rows.len(),
                taps,
            });
        }
        Ok(outs)
    }
}
