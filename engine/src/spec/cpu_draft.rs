//! CPU reference DFlash draft (`DFlashLagunaForCausalLM`, vLLM 0.25.1 semantics), f32 weights with
//! f64 accumulation like [`crate::cpu::CpuModel`]. The definition the CUDA draft is tested against.
//!
//! Context (per committed token, `combine_hidden_states` + `precompute_and_store_context_kv`):
//!   c = RMSNorm(fc(concat_i RMSNorm(tap_i; aux_hidden_norms.i)); hidden_norm)
//!   per layer l: x = RMSNorm(c; input_layernorm_l); [k, v] = kv rows of qkv_proj_l · x;
//!   k = RoPE(RMSNorm_head(k; k_norm_l), pos)  → the layer's cache at `pos`.
//! Block (`[last, mask x k]` at positions p0..p0+k): a Laguna decoder stack (pre-norm, fused qkv,
//! q/k norm, NeoX RoPE, softplus gate, dense SwiGLU) whose attention sees the cached context plus
//! the block's own K/V; causal (row j sees block rows <= j) or not per `dflash_config.causal`;
//! the window (sliding layers) keeps keys with |p - key| < window (and key <= p when causal).
//! Logits: target lm_head(RMSNorm(x; norm)).
use super::config::DraftConfig;
use super::draft::{BlockInput, ContextInput, DraftModel};
use crate::config::LagunaConfig;
use crate::cpu::model::{CpuModel, Ffn, Mat};
use crate::cpu::ops::*;
use crate::error::{EngineError, Result};
use crate::model::{SeqId, StepOutput};
use crate::weights::store::WeightStore;
use std::path::Path;

pub struct DraftLayer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    /// The q, k and v row blocks of the fused `qkv_proj`.
    pub q: Mat,
    pub k: Mat,
    pub v: Mat,
    pub o: Mat,
    pub g: Option<Mat>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub sink: Option<Vec<f32>>,
    pub mlp: Ffn,
    pub num_heads: usize,
}

/// Context K/V of one sequence (per layer, rows of `kv_heads * head_dim` per position): the same
/// store as the CPU target's.
pub type DraftKv = crate::cpu::model::SeqKv;

pub struct CpuDraft {
    pub cfg: DraftConfig,
    pub target_hidden: usize,
    /// The target's `embed_tokens` (shared; copied here) `[vocab, hidden]`.
    pub embed: Vec<f32>,
    /// The target's `lm_head` `[vocab, hidden]`; None when the target ties it to `embed`.
    pub lm_head: Option<Mat>,
    pub fc: Mat,
    pub aux_norms: Vec<Vec<f32>>,
    pub hidden_norm: Vec<f32>,
    pub norm: Vec<f32>,
    pub layers: Vec<DraftLayer>,
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
    /// Per-sequence context K/V and the prefix cache's blocks and snapshots.
    kv: crate::cpu::prefix::CpuKv,
    next_id: SeqId,
}

fn clone_mat(m: &Mat) -> Mat {
    Mat {
        w: m.w.clone(),
        out: m.out,
        inp: m.inp,
    }
}

impl CpuDraft {
    /// Load a draft folder (config.json + *.safetensors) to run with `target`, sharing (copying) the
    /// target's embed_tokens and lm_head.
    pub fn load(dir: &Path, target: &CpuModel) -> Result<CpuDraft> {
        let cfg = DraftConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(dir)?;
        Self::from_store(
            cfg,
            &store,
            &target.cfg,
            target.embed.clone(),
            target.lm_head.as_ref().map(clone_mat),
        )
    }

    /// Build from a draft checkpoint and the target's shared embedding and (untied) lm_head.
    pub fn from_store(
        cfg: DraftConfig,
        store: &WeightStore,
        target_cfg: &LagunaConfig,
        embed: Vec<f32>,
        lm_head: Option<Mat>,
    ) -> Result<CpuDraft> {
        cfg.validate_target(target_cfg)?;
        let h = cfg.hidden_size;
        let th = target_cfg.hidden_size;
        let hd = cfg.head_dim;
        let nkv = cfg.num_kv_heads;
        if embed.len() != cfg.vocab_size * h {
            return Err(EngineError::Other(format!(
                "shared embed_tokens has {} values, expected {}x{}",
                embed.len(),
                cfg.vocab_size,
                h
            )));
        }
        for name in [
            "embed_tokens.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
        ] {
            if store.contains(name) {
                tracing::warn!("draft checkpoint carries `{name}`; Laguna DFlash ignores it and uses the target's");
            }
        }
        let ntaps = cfg.num_taps();
        let fc = Mat::load(store, "fc", h, ntaps * th)?;
        let aux_norms = (0..ntaps)
            .map(|i| store.vector(&format!("aux_hidden_norms.{i}.weight"), th))
            .collect::<Result<Vec<_>>>()?;
        let hidden_norm = store.vector("hidden_norm.weight", h)?;
        let norm = store.vector("norm.weight", h)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("layers.{l}");
            let nh = cfg.num_heads[l];
            let qw = nh * hd;
            let kvw = nkv * hd;
            let qkv = store
                .linear(&format!("{p}.self_attn.qkv_proj"), qw + 2 * kvw, h)?
                .to_f32()?;
            let split = |a: usize, b: usize| Mat {
                w: qkv[a * h..b * h].to_vec(),
                out: b - a,
                inp: h,
            };
            let gw = cfg.gate_width(l);
            layers.push(DraftLayer {
                input_norm: store.vector(&format!("{p}.input_layernorm.weight"), h)?,
                post_norm: store.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                q: split(0, qw),
                k: split(qw, qw + kvw),
                v: split(qw + kvw, qw + 2 * kvw),
                o: Mat::load(store, &format!("{p}.self_attn.o_proj"), h, qw)?,
                g: if gw > 0 {
                    Some(Mat::load(store, &format!("{p}.self_attn.g_proj"), gw, h)?)
                } else {
                    None
                },
                q_norm: store.vector(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                k_norm: store.vector(&format!("{p}.self_attn.k_norm.weight"), hd)?,
                sink: if cfg.sinks {
                    Some(store.vector(&format!("{p}.self_attn.sink"), nh)?)
                } else {
                    None
                },
                mlp: Ffn::load(store, &format!("{p}.mlp"), cfg.intermediate_size, h)?,
                num_heads: nh,
            });
        }
        if let Some(m) = &lm_head {
            if m.out != cfg.vocab_size || m.inp != h {
                return Err(EngineError::Other(format!(
                    "shared lm_head is [{}, {}], expected [{}, {h}]",
                    m.out, m.inp, cfg.vocab_size
                )));
            }
        }
        let kv = crate::cpu::prefix::CpuKv::new(vec![cfg.window; cfg.num_layers], nkv * hd);
        Ok(CpuDraft {
            kv,
            inv_freq: cfg.rope.inv_freq(),
            attention_factor: cfg.rope.attention_factor as f32,
            cfg,
            target_hidden: th,
            embed,
            lm_head,
            fc,
            aux_norms,
            hidden_norm,
            norm,
            layers,
            next_id: 1,
        })
    }

    fn rope_tables(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        let cos = self
            .inv_freq
            .iter()
            .map(|&f| (p * f).cos() * self.attention_factor)
            .collect();
        let sin = self
            .inv_freq
            .iter()
            .map(|&f| (p * f).sin() * self.attention_factor)
            .collect();
        (cos, sin)
    }

    /// The fused context feature c of one committed token (`combine_hidden_states`).
    pub fn fuse_taps(&self, taps: &[f32]) -> Vec<f32> {
        let th = self.target_hidden;
        let eps = self.cfg.rms_norm_eps;
        let mut cat = Vec::with_capacity(taps.len());
        for (i, w) in self.aux_norms.iter().enumerate() {
            cat.extend(rmsnorm(&taps[i * th..(i + 1) * th], w, eps));
        }
        rmsnorm(&self.fc.apply(&cat), &self.hidden_norm, eps)
    }

    /// Context (K, V) rows of every layer for one token with fused feature `c` at `pos`.
    pub fn context_kv_row(&self, c: &[f32], pos: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        let eps = self.cfg.rms_norm_eps;
        let hd = self.cfg.head_dim;
        let (cos, sin) = self.rope_tables(pos);
        self.layers
            .iter()
            .map(|layer| {
                let x = rmsnorm(c, &layer.input_norm, eps);
                let mut k = layer.k.apply(&x);
                let v = layer.v.apply(&x);
                rmsnorm_heads(&mut k, &layer.k_norm, hd, eps);
                rope_heads(&mut k, hd, &cos, &sin);
                (k, v)
            })
            .collect()
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

    /// The cached context K/V of a sequence (tests compare incremental against recomputed).
    pub fn context_kv(&self, seq: SeqId) -> Option<&DraftKv> {
        self.kv.seqs.get(&seq)
    }

    fn lm_head_apply(&self, y: &[f32]) -> Vec<f32> {
        match &self.lm_head {
            Some(m) => m.apply(y),
            None => linear(&self.embed, y, self.cfg.vocab_size),
        }
    }

    fn embed_row(&self, tok: u32) -> Result<Vec<f32>> {
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

    /// The block forward against a sequence's context cache; returns logits rows.
    pub fn block_forward(
        &self,
        kv: &DraftKv,
        tokens: &[u32],
        start: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        let (hd, nkv, eps) = (cfg.head_dim, cfg.num_kv_heads, cfg.rms_norm_eps);
        if start != kv.len {
            return Err(EngineError::Other(format!(
                "draft block at position {start} but the draft context holds {} positions",
                kv.len
            )));
        }
        let n = tokens.len();
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| self.embed_row(t))
            .collect::<Result<_>>()?;
        let scale = 1.0 / (hd as f64).sqrt();
        let tables: Vec<(Vec<f32>, Vec<f32>)> =
            (0..n).map(|r| self.rope_tables(start + r)).collect();
        for (li, layer) in self.layers.iter().enumerate() {
            let nh = layer.num_heads;
            let group = nh / nkv;
            let mut hs = Vec::with_capacity(n);
            let mut qs = Vec::with_capacity(n);
            let mut bk = Vec::with_capacity(n);
            let mut bv = Vec::with_capacity(n);
            for (r, x) in xs.iter().enumerate() {
                let hn = rmsnorm(x, &layer.input_norm, eps);
                let mut q = layer.q.apply(&hn);
                let mut k = layer.k.apply(&hn);
                let v = layer.v.apply(&hn);
                rmsnorm_heads(&mut q, &layer.q_norm, hd, eps);
                rmsnorm_heads(&mut k, &layer.k_norm, hd, eps);
                rope_heads(&mut q, hd, &tables[r].0, &tables[r].1);
                rope_heads(&mut k, hd, &tables[r].0, &tables[r].1);
                hs.push(hn);
                qs.push(q);
                bk.push(k);
                bv.push(v);
            }
            let ck = kv.k.get(li).map(|v| v.as_slice()).unwrap_or(&[]);
            let cv = kv.v.get(li).map(|v| v.as_slice()).unwrap_or(&[]);
            for r in 0..n {
                let pos = start + r;
                // Keys: context positions 0..start, then block rows 0..n at start+j.
                let visible = |kp: usize| -> bool {
                    if cfg.causal && kp > pos {
                        return false;
                    }
                    match cfg.window {
                        Some(w) => kp + w > pos && (cfg.causal || kp < pos + w),
                        None => true,
                    }
                };
                let keys: Vec<usize> = (0..start + n).filter(|&kp| visible(kp)).collect();
                let mut attn = vec![0f32; nh * hd];
                for head in 0..nh {
                    let kvh = head / group;
                    let q = &qs[r][head * hd..(head + 1) * hd];
                    let krow = |kp: usize| -> &[f32] {
                        if kp < start {
                            &ck[(kp * nkv + kvh) * hd..(kp * nkv + kvh + 1) * hd]
                        } else {
                            &bk[kp - start][kvh * hd..(kvh + 1) * hd]
                        }
                    };
                    let vrow = |kp: usize| -> &[f32] {
                        if kp < start {
                            &cv[(kp * nkv + kvh) * hd..(kp * nkv + kvh + 1) * hd]
                        } else {
                            &bv[kp - start][kvh * hd..(kvh + 1) * hd]
                        }
                    };
                    let sink = layer.sink.as_ref().map(|s| s[head] as f64);
                    attend(
                        q,
                        keys.len(),
                        |j| krow(keys[j]),
                        |j| vrow(keys[j]),
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
                let m = layer.mlp.apply(&h2);
                for (xi, mi) in xs[r].iter_mut().zip(&m) {
                    *xi += mi;
                }
            }
        }
        Ok(xs
            .iter()
            .map(|x| self.lm_head_apply(&rmsnorm(x, &self.norm, eps)))
            .collect())
    }
}

impl DraftModel for CpuDraft {
    fn config(&self) -> &DraftConfig {
        &self.cfg
    }
    fn device(&self) -> &str {
        "cpu"
    }
    fn new_seq(&mut self) -> Result<SeqId> {
        let id = self.next_id;
        self.next_id += 1;
        let l = self.cfg.num_layers;
        self.kv.seqs.insert(id, DraftKv::with_layers(l));
        Ok(id)
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.kv.seqs.remove(&seq);
    }
    fn context_len(&self, seq: SeqId) -> usize {
        self.kv.seqs.get(&seq).map_or(0, |s| s.len)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        let row = self.cfg.num_kv_heads * self.cfg.head_dim;
        if let Some(s) = self.kv.seqs.get_mut(&seq) {
            s.truncate(len, row);
        }
    }
    fn write_context(&mut self, batch: &[ContextInput]) -> Result<()> {
        let width = self.cfg.num_taps() * self.target_hidden;
        let row = self.cfg.num_kv_heads * self.cfg.head_dim;
        for item in batch {
            let n = item.rows(width, self.kv.seqs.get(&item.seq).map(|s| s.len))?;
            let rows: Vec<Vec<(Vec<f32>, Vec<f32>)>> = (0..n)
                .map(|r| {
                    let c = self.fuse_taps(&item.taps[r * width..(r + 1) * width]);
                    self.context_kv_row(&c, item.start_pos + r)
                })
                .collect();
            let kv = self.kv.seqs.get_mut(&item.seq).expect("checked above");
            for l in 0..kv.k.len() {
                kv.k[l].truncate(item.start_pos * row);
                kv.v[l].truncate(item.start_pos * row);
                for r in &rows {
                    kv.k[l].extend_from_slice(&r[l].0);
                    kv.v[l].extend_from_slice(&r[l].1);
                }
            }
            kv.len = item.start_pos + n;
        }
        Ok(())
    }
    fn prefix_store(&mut self) -> Option<&mut dyn crate::model::prefix::PrefixStore> {
        Some(&mut self.kv)
    }
    fn propose(&mut self, batch: &[BlockInput]) -> Result<Vec<StepOutput>> {
        let mut outs = Vec::with_capacity(batch.len());
        for item in batch {
            let kv = self.kv.seqs.get(&item.seq).ok_or_else(|| {
                EngineError::Other(format!("unknown draft sequence {}", item.seq))
            })?;
            let rows = self.block_forward(kv, item.tokens, item.start_pos)?;
            outs.push(StepOutput {
                rows: rows.len(),
                logits: rows.concat(),
                taps: vec![],
            });
        }
        Ok(outs)
    }
}
