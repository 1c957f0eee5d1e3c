//! Loading a checkpoint onto the device: weights streamed tensor by tensor from the mmap (BF16
//! as stored, NVFP4 packed), K/V pool and rings sized, scratch allocated.
use super::select::moe::{mk_geom, mk_smem, MK_BLOCK};
use super::{
    ceil_div, cerr, nsplit_tc, ring, CudaModel, CudaOptions, Dev, Experts, ForwardMode, KvPool,
    LaunchShape, LayerW, Lin, MlpW, Parts, PassState, Scratch, Stack, Weights, DECODE_ROWS, NSPLIT,
    SAMP_G_STRIDE, SPLIT_ROWS,
};
use crate::config::{AttnKind, LagunaConfig, MlpKind};
use crate::error::{EngineError, Result};
use crate::model::schema::layer_prefix;
use crate::weights::linear::{kv_scale_pair, LinearSource};
use crate::weights::store::{TensorView, WeightStore};
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

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

pub(super) struct Loader<'a> {
    pub(super) dev: &'a Dev,
    pub(super) store: &'a WeightStore,
    pub(super) pb: Option<indicatif::ProgressBar>,
    pub(super) bytes: usize,
    /// Unified memory: drop the file pages of what was read once it is uploaded.
    pub(super) drop_pages: bool,
}

impl<'a> Loader<'a> {
    pub(super) fn tick(&mut self, n: usize) {
        self.bytes += n;
        if let Some(pb) = &self.pb {
            pb.inc(n as u64);
        }
        // Every upload ticks: what was read before it is on the device now.
        if self.drop_pages {
            if let Err(e) = self.store.drop_read_pages() {
                tracing::warn!("cannot drop the checkpoint's file pages after an upload ({e}); the page cache may hold a second copy of the weights");
                self.drop_pages = false;
            }
        }
    }
    pub(super) fn upload(&mut self, data: &[u8]) -> Result<u64> {
        let p = self.dev.alloc(data.len().max(16)).map_err(cerr)?;
        self.dev.htod(p, data).map_err(cerr)?;
        self.tick(data.len());
        Ok(p)
    }
    pub(super) fn vec_f32(&mut self, name: &str, n: usize) -> Result<u64> {
        let v = self.store.vector(name, n)?;
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.upload(&b)
    }
    pub(super) fn lin(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Lin> {
        // Any width for BF16 (the kernels take K and N tails); NVFP4's 16-wide groups are checked
        // by `linear` ("NVFP4 needs an input width divisible by 16").
        match self.store.linear(prefix, out, inp)? {
            LinearSource::Dense(t) => {
                let b = bf16_bytes_of(&t)?;
                Ok(Lin::bf16(self.upload(&b)?, out, inp))
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
                    t: 0,
                })
            }
        }
    }
    /// A dense MLP `{p}.mlp.{gate,up,down}_proj` (intermediate width `im`): gate and up stacked
    /// in one buffer when both are BF16 and `im % 16 == 0` (MlpW::Dense's `gu`, gate and up views
    /// of its halves), else loaded apart.
    pub(super) fn dense_mlp(&mut self, p: &str, im: usize, h: usize) -> Result<MlpW> {
        let gu = if im % 16 == 0 && h % 16 == 0 {
            self.lin_cat(
                &[
                    (format!("{p}.mlp.gate_proj"), im),
                    (format!("{p}.mlp.up_proj"), im),
                ],
                h,
            )?
        } else {
            None
        };
        let (gate, up) = match &gu {
            Some(f) => (
                Lin { n: im, ..*f },
                Lin {
                    n: im,
                    w: f.w + (im * h * 2) as u64,
                    ..*f
                },
            ),
            None => (
                self.lin(&format!("{p}.mlp.gate_proj"), im, h)?,
                self.lin(&format!("{p}.mlp.up_proj"), im, h)?,
            ),
        };
        let down = self.lin(&format!("{p}.mlp.down_proj"), h, im)?;
        Ok(MlpW::Dense { gate, up, down, gu })
    }

    /// Several BF16 Linears with the same input width stacked by rows into one matrix; None when
    /// any of them is not dense.
    pub(super) fn lin_cat(&mut self, parts: &[(String, usize)], inp: usize) -> Result<Option<Lin>> {
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
        Ok(Some(Lin::bf16(w, total, inp)))
    }

    /// Experts `{prefix}.{e}.{proj}` stacked into one buffer per part.
    pub(super) fn stack(
        &mut self,
        prefixes: &[String],
        proj: &str,
        out: usize,
        inp: usize,
    ) -> Result<Stack> {
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

/// A head_dim the CUDA attention kernels take: even (RoPE pairs; the decode kernels read two dims
/// a thread where hd % 8 != 0), at most 256.
pub fn check_head_dim(hd: usize, what: &str) -> Result<()> {
    if hd == 0 || hd % 2 != 0 || hd > 256 {
        return Err(EngineError::Other(format!(
            "{what}head_dim {hd} is not supported by the CUDA attention kernels (an even number up to 256)"
        )));
    }
    Ok(())
}

/// The model shapes the CUDA backend runs, checked from the config before any upload (a pure
/// function: the random-config sweep's generator is tested against it). BF16 Linears and experts
/// of any width run (the kernels take K and N tails). NVFP4 experts need hidden_size and the
/// expert widths in the format's 16-wide groups (each NVFP4 tensor is checked again, by name, in
/// `WeightStore::linear`).
pub fn check_shapes(cfg: &LagunaConfig) -> Result<()> {
    check_head_dim(cfg.head_dim, "")?;
    if cfg.num_experts > 1024 || cfg.top_k > 32 {
        return Err(EngineError::Other(format!(
            "the CUDA router supports up to 1024 experts and top-k 32 (this model: {} experts, \
             top-k {}); run it with --device cpu",
            cfg.num_experts, cfg.top_k
        )));
    }
    let sparse = cfg.layers.iter().any(|l| l.mlp == MlpKind::Sparse);
    if sparse && cfg.quantization.is_some() {
        let widths = [
            ("hidden_size", cfg.hidden_size),
            ("moe_intermediate_size", cfg.moe_intermediate_size),
            (
                "shared_expert_intermediate_size",
                cfg.shared_expert_intermediate_size,
            ),
        ];
        if let Some((name, w)) = widths.iter().find(|(_, w)| w % 16 != 0) {
            return Err(EngineError::Other(format!(
                "{name} {w} is not a multiple of 16: NVFP4 experts (quantization_config) need \
                 16-wide groups along their inputs; store the experts as BF16 for this width"
            )));
        }
    }
    Ok(())
}

impl CudaModel {
    /// Load a model folder onto GPU `opts.device`. Kernels come from the cubin cache (compiled
    /// with NVRTC on a miss: run `laguna warmup` ahead to make this instant).
    pub fn load(dir: &Path, opts: CudaOptions) -> Result<CudaModel> {
        let t0 = std::time::Instant::now();
        let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(dir)?;
        let dev = Dev::new(opts.device).map_err(cerr)?;
        refuse_unless_fits(&dev, store.data_bytes(), dir)?;
        Self::build(cfg, &store, dev, opts, t0)
    }

    pub(super) fn build(
        cfg: LagunaConfig,
        store: &WeightStore,
        dev: Dev,
        opts: CudaOptions,
        t0: std::time::Instant,
    ) -> Result<CudaModel> {
        let h = cfg.hidden_size;
        check_shapes(&cfg)?;
        if !opts.page_size.max(1).is_power_of_two() {
            return Err(EngineError::Other(format!(
                "K/V page size {} must be a power of two for the CUDA attention kernels",
                opts.page_size
            )));
        }
        let mut ld = Loader {
            dev: &dev,
            store,
            pb: progress_bar(store, opts.progress),
            bytes: 0,
            drop_pages: dev.integrated(),
        };
        let et = store.expect("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let eb = bf16_bytes_of(&et)?;
        let embed = ld.upload(&eb)?;
        drop(eb);
        let mut decode_bytes = 0usize;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.layers.len() {
            layers.push(load_layer(&mut ld, &cfg, i, &mut decode_bytes)?);
        }
        let final_norm = ld.vec_f32("model.norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            Lin::bf16(embed, cfg.vocab_size, h)
        } else {
            ld.lin("lm_head", cfg.vocab_size, h)?
        };
        decode_bytes += lin_bytes(&lm_head);
        let weight_bytes = ld.bytes;
        if let Some(pb) = ld.pb.take() {
            pb.finish_and_clear();
        }
        drop(ld);
        log_load_peak(&dev, store, "target");
        let parts = Parts {
            embed,
            final_norm,
            lm_head,
            layers,
            weight_bytes,
            decode_bytes,
            min_in: 0,
        };
        Self::finish(cfg, Arc::new(dev), opts, t0, parts)
    }

    /// Scratch, K/V pool and the model around loaded weights (target or draft stack).
    pub(super) fn finish(
        cfg: LagunaConfig,
        dev: Arc<Dev>,
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
        let nsplit = NSPLIT;
        let kvw = cfg.num_kv_heads * cfg.head_dim;
        let dims = ScratchDims::of(&cfg, &opts, min_in);
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
        // Before the K/V pool is sized: the tiled weight copies take device memory.
        let mut lm_head = lm_head;
        tile_copies(&dev, &mut layers, &mut lm_head)?;
        let max_seqs = opts.max_seqs.max(1);
        let (free, _total) = dev.mem_info().map_err(cerr)?;
        let scratch_est = dims.estimate(&cfg);
        let windows: Vec<usize> = layers.iter().map(|l| l.window).collect();
        let pool = match opts.kv_pool_bytes {
            Some(b) => b,
            None => ring::default_pool_bytes(
                &windows,
                opts.rings,
                opts.spec_k,
                max_seqs,
                kvw,
                elt,
                page_size,
                opts.max_model_len.unwrap_or(cfg.max_position_embeddings),
                (free.saturating_sub(scratch_est) / 2).min(16 << 30),
            )
            .map_err(EngineError::Other)?,
        };
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
        let sc = dims.alloc(&dev, &cfg, max_pages, ring, elt, nsplit)?;
        let page_elems = num_pages * page_size * kvw;
        let ring_elems = max_seqs * ring * kvw;
        alloc_kv(
            &dev,
            &mut layers,
            num_pages,
            page_elems,
            ring_elems,
            full_layers,
            elt,
        )?;
        dev.sync().map_err(cerr)?;
        let free_pages = (0..num_pages as u32).rev().collect();
        let (mk_grid, mk_smem) = mk_launch(&cfg, &dev);
        let mk_stag = mk_stagger(&cfg, &dev, mk_grid);
        let use_cublas = opts.cublas;
        Ok(CudaModel {
            cfg,
            dev,
            opts,
            w: Weights {
                embed,
                final_norm,
                lm_head,
                layers,
            },
            sc,
            kv: KvPool {
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
                elt,
                seqs: HashMap::new(),
                next_id: 1,
            },
            dec: Default::default(),
            shape: LaunchShape {
                nsplit,
                nsplit_tc: nsplit_tc(nsplit),
                mk_grid,
                mk_smem,
                mk_stag,
                use_cublas,
            },
            fwd: ForwardMode {
                taps: vec![],
                taps_on_device: false,
                taps_dev: 0,
                noncausal: false,
                prof: None,
            },
            pass: PassState::new(nsplit_tc(nsplit)),
            prefix: Default::default(),
            weight_bytes,
            decode_weight_bytes: decode_bytes,
            load_secs: t0.elapsed().as_secs_f64(),
        })
    }
}

/// The load's progress bar (`opts.progress`), over the checkpoint's data bytes.
fn progress_bar(store: &WeightStore, on: bool) -> Option<indicatif::ProgressBar> {
    if !on {
        return None;
    }
    let pb = indicatif::ProgressBar::new(store.data_bytes());
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "loading weights to the GPU [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    Some(pb)
}

/// Bytes a decode step reads of a Linear's weights (and NVFP4 block scales).
fn lin_bytes(l: &Lin) -> usize {
    if l.fp4 {
        l.n * l.k / 2 + l.n * l.k / 16
    } else {
        l.n * l.k * 2
    }
}

/// Layer `i`'s weights onto the device: attention (q|k|v|g fused where they can be), o_proj,
/// the dense MLP or MoE, norms, sinks and RoPE frequencies. Adds what a decode step reads of
/// them to `decode_bytes`.
fn load_layer(
    ld: &mut Loader<'_>,
    cfg: &LagunaConfig,
    i: usize,
    decode_bytes: &mut usize,
) -> Result<LayerW> {
    let spec = &cfg.layers[i];
    let h = cfg.hidden_size;
    let hd = cfg.head_dim;
    let kvw = cfg.num_kv_heads * hd;
    let p = layer_prefix(i);
    let kvs = kv_scale_pair(ld.store, &p)?;
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
    let dummy = |n: usize| Lin::bf16(0, n, h);
    let (q, k, v, g) = if let Some(f) = &qkvg {
        *decode_bytes += lin_bytes(f);
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
            *decode_bytes += lin_bytes(l);
        }
        (q, k, v, g)
    };
    let o = ld.lin(&format!("{p}.self_attn.o_proj"), h, qw)?;
    *decode_bytes += lin_bytes(&o);
    let mlp = match spec.mlp {
        MlpKind::Dense => {
            let mlp = ld.dense_mlp(&p, cfg.intermediate_size, h)?;
            if let MlpW::Dense { gate, up, down, .. } = &mlp {
                *decode_bytes += lin_bytes(gate) + lin_bytes(up) + lin_bytes(down);
            }
            mlp
        }
        MlpKind::Sparse => load_moe(ld, cfg, &p, decode_bytes)?,
    };
    let inv_freq = spec.rope.inv_freq();
    let half = inv_freq.len();
    let ifb: Vec<u8> = inv_freq.iter().flat_map(|x| x.to_le_bytes()).collect();
    let window = match (spec.attn, cfg.sliding_window) {
        (AttnKind::Sliding, Some(w)) => w,
        _ => 0,
    };
    Ok(LayerW {
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
    })
}

/// A MoE layer's weights (prefix `p`): router and correction bias, the routed experts stacked,
/// and the shared expert, folded in as expert E when it has their shape and storage.
fn load_moe(
    ld: &mut Loader<'_>,
    cfg: &LagunaConfig,
    p: &str,
    decode_bytes: &mut usize,
) -> Result<MlpW> {
    let store = ld.store;
    let h = cfg.hidden_size;
    let router = ld.lin(&format!("{p}.mlp.gate"), cfg.num_experts, h)?;
    let bias = ld.vec_f32(
        &format!("{p}.mlp.experts.e_score_correction_bias"),
        cfg.num_experts,
    )?;
    let im = cfg.moe_intermediate_size;
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
        && is_fp4(format!("{ep}.0.gate_proj"), im, h)? == is_fp4(format!("{sp}.gate_proj"), im, h)?
        && is_fp4(format!("{ep}.0.up_proj"), im, h)? == is_fp4(format!("{sp}.up_proj"), im, h)?
        && is_fp4(format!("{ep}.0.down_proj"), h, im)? == is_fp4(format!("{sp}.down_proj"), h, im)?;
    let mut prefixes: Vec<String> = (0..cfg.num_experts).map(|e| format!("{ep}.{e}")).collect();
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
    *decode_bytes += lin_bytes(&router)
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
        *decode_bytes += lin_bytes(&a) + lin_bytes(&b) + lin_bytes(&c);
        Some((a, b, c))
    } else {
        None
    };
    Ok(MlpW::Moe {
        router,
        bias,
        experts: Experts { gate, up, down },
        shared,
        folded,
    })
}

/// Tile-interleaved copies of the BF16 Linears the tensor-core GEMV reads (the row-major
/// matrices stay for the prefill GEMMs). A copy that does not fit is skipped (that Linear's GEMV
/// reads the row-major matrix: the same results, a little slower).
fn tile_copies(dev: &Dev, layers: &mut [LayerW], lm_head: &mut Lin) -> Result<()> {
    let short = std::cell::Cell::new(0usize);
    let tile = |l: &mut Lin| -> Result<()> {
        if l.fp4 || l.w == 0 || l.k % 32 != 0 || l.t != 0 {
            return Ok(());
        }
        let rg = l.n.div_ceil(16);
        let bytes = rg * 16 * l.k * 2;
        let Ok(t) = dev.alloc(bytes) else {
            short.set(short.get() + bytes);
            return Ok(());
        };
        super::launch::linear::tile_bf16(dev, &mut None, l.w, t, l.n, l.k).map_err(cerr)?;
        l.t = t;
        Ok(())
    };
    for l in layers.iter_mut() {
        if let Some(f) = l.qkvg.as_mut() {
            tile(f)?;
        } else {
            tile(&mut l.q)?;
            tile(&mut l.k)?;
            tile(&mut l.v)?;
            if let Some(g) = l.g.as_mut() {
                tile(g)?;
            }
        }
        tile(&mut l.o)?;
        if let MlpW::Dense { gate, up, down, gu } = &mut l.mlp {
            match gu {
                // One copy of the stacked matrix: with n % 16 == 0 its row groups are
                // gate's then up's, so the halves' copies are views of it (the same
                // bytes tile_bf16 writes for each alone).
                Some(f) => {
                    tile(f)?;
                    if f.t != 0 {
                        gate.t = f.t;
                        up.t = f.t + (gate.n * gate.k * 2) as u64;
                    }
                }
                None => {
                    tile(gate)?;
                    tile(up)?;
                }
            }
            tile(down)?;
        }
    }
    tile(lm_head)?;
    dev.sync().map_err(cerr)?;
    if short.get() > 0 {
        tracing::warn!(
            "{} MB of tile-interleaved GEMV weight copies did not fit in device memory; \
             those Linears decode from the row-major weights (same results, slower)",
            short.get() >> 20
        );
    }
    Ok(())
}

/// The K and V caches of every layer: a ring per sequence for ring layers, the paged pool for
/// the full-attention ones. Refuses a pool too large for the kernels' 31-bit offsets.
fn alloc_kv(
    dev: &Dev,
    layers: &mut [LayerW],
    num_pages: usize,
    page_elems: usize,
    ring_elems: usize,
    full_layers: usize,
    elt: usize,
) -> Result<()> {
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
    Ok(())
}

/// The widths the scratch buffers are sized by, from the config and the options.
#[derive(Clone, Copy)]
struct ScratchDims {
    /// Rows a pass holds (`max_rows`).
    r: usize,
    h: usize,
    hd: usize,
    kvw: usize,
    max_qw: usize,
    max_gw: usize,
    inter: usize,
    e: usize,
    /// Experts a row touches: top-k and the folded shared expert.
    kk: usize,
    im: usize,
    /// Bytes of an f32 element.
    f: usize,
    /// Rows of logits a pass returns.
    lrows: usize,
    /// Sequences a pass's block table holds.
    bt_seqs: usize,
    /// Widest GEMM input beyond the model's own (the draft's fc).
    min_in: usize,
}

impl ScratchDims {
    fn of(cfg: &LagunaConfig, opts: &CudaOptions, min_in: usize) -> ScratchDims {
        let hd = cfg.head_dim;
        let r = opts.max_rows.max(1);
        ScratchDims {
            r,
            h: cfg.hidden_size,
            hd,
            kvw: cfg.num_kv_heads * hd,
            max_qw: cfg
                .layers
                .iter()
                .map(|l| l.num_heads * hd)
                .max()
                .unwrap_or(0),
            max_gw: (0..cfg.num_layers)
                .map(|i| cfg.gate_width(i))
                .max()
                .unwrap_or(0)
                .max(1),
            inter: cfg
                .intermediate_size
                .max(cfg.shared_expert_intermediate_size)
                .max(16),
            e: cfg.num_experts.max(1),
            kk: cfg.top_k.max(1) + 1,
            im: cfg.moe_intermediate_size.max(16),
            f: 4usize,
            lrows: r.min(256),
            bt_seqs: r.min(64),
            min_in,
        }
    }

    /// The scratch's device bytes, roughly (what the default K/V pool leaves room for).
    fn estimate(&self, cfg: &LagunaConfig) -> usize {
        let ScratchDims {
            r,
            h,
            kvw,
            max_qw,
            max_gw,
            inter,
            e,
            kk,
            im,
            f,
            lrows,
            ..
        } = *self;
        f * r * (4 * h + 2 * max_qw + 2 * kvw + max_gw + 3 * inter + e + kk * (3 * im + h) + 8)
            + lrows * (h + cfg.vocab_size) * 4
            + DECODE_ROWS * cfg.vocab_size * 8
    }

    /// The scratch buffers, allocated and the ones kernels expect initialised set.
    fn alloc(
        &self,
        dev: &Dev,
        cfg: &LagunaConfig,
        max_pages: usize,
        ring: usize,
        elt: usize,
        nsplit: usize,
    ) -> Result<Scratch> {
        let ScratchDims {
            r,
            h,
            hd,
            kvw,
            max_qw,
            max_gw,
            inter,
            e,
            kk,
            im,
            f,
            lrows,
            bt_seqs,
            min_in,
        } = *self;
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
            gbar: a(16)?,
            rlog_mk: a(4 * e.max(1))?,
            atiles: a(8 * (r / 64 + r.min(64) + 2))?,
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
            lrows,
            sel: a(4 * lrows)?,
            hsel: a(f * lrows * h)?,
            logits: a(f * lrows * cfg.vocab_size)?,
            amax: a(4 * lrows)?,
            amax_slot: a(8 * lrows)?,
            amax_cnt: a(4 * lrows)?,
            adv_ctr: a(4)?,
            sparams: a(8 * 4 * lrows)?,
            samp_e: a(8 * DECODE_ROWS * cfg.vocab_size)?,
            samp_g: a(8 * SAMP_G_STRIDE * DECODE_ROWS)?,
            part: a(f
                * SPLIT_ROWS.min(r)
                * cfg.layers.iter().map(|l| l.num_heads).max().unwrap_or(1)
                * nsplit
                * (hd + 2))?,
        };
        dev.htod(sc.gbar, &[0u8; 16]).map_err(cerr)?;
        // moe_decode_fused's logits start unset (MK_UNSET in moe/router.cu); each launch leaves them so.
        dev.memset_d32(sc.rlog_mk, 0xFFFF_FFFF, e.max(1))
            .map_err(cerr)?;
        dev.htod(sc.amax_slot, &vec![0u8; 8 * lrows])
            .map_err(cerr)?;
        dev.htod(sc.amax_cnt, &vec![0u8; 4 * lrows]).map_err(cerr)?;
        dev.htod(sc.adv_ctr, &[0u8; 4]).map_err(cerr)?;
        dev.htod(sc.samp_g, &vec![0u8; 8 * SAMP_G_STRIDE * DECODE_ROWS])
            .map_err(cerr)?;
        Ok(sc)
    }
}

/// Refuse a load whose weights alone exceed the device's free memory (on unified memory, the
/// smaller of the driver's and the host's MemAvailable), before anything is uploaded. The full
/// plan (copies, K/V, activations) is `laguna plan`'s, which `serve` checks before loading.
pub(super) fn refuse_unless_fits(dev: &Dev, weights: u64, dir: &Path) -> Result<()> {
    let (free, _) = dev.mem_info().map_err(cerr)?;
    if weights > free as u64 {
        return Err(EngineError::Other(format!(
            "{}: the checkpoint's {:.2} GB of weights need more than the {:.2} GB free on the device{}; nothing was loaded (free memory, or use a smaller checkpoint)",
            dir.display(),
            weights as f64 / 1e9,
            free as f64 / 1e9,
            if dev.integrated() { " (unified memory: capped by the host's MemAvailable)" } else { "" }
        )));
    }
    Ok(())
}

/// After a load: on unified memory drop what is left of the checkpoint's file pages, then log
/// the peak of the load (the process's peak resident set, VmHWM, the device memory in use, and
/// the checkpoint bytes still in the page cache) for the serve log.
pub(super) fn log_load_peak(dev: &Dev, store: &WeightStore, what: &str) {
    if dev.integrated() {
        if let Err(e) = store.drop_all_pages() {
            tracing::warn!("cannot drop the checkpoint's file pages ({e})");
        }
    }
    let gb = |b: u64| b as f64 / 1e9;
    let hwm = crate::memory::vm_hwm().map_or("?".into(), |b| format!("{:.2} GB", gb(b)));
    let used = dev.mem_info().map_or("?".into(), |(f, t)| {
        format!("{:.2} of {:.2} GB", gb((t - f.min(t)) as u64), gb(t as u64))
    });
    tracing::info!(
        "{what} loaded: peak resident set of the process (VmHWM) {hwm}; device memory in use {used}; checkpoint pages in the page cache {:.2} GB of {:.2} GB{}",
        gb(store.cached_bytes()),
        gb(store.data_bytes()),
        if dev.integrated() { " (unified memory: each tensor's file pages dropped after its upload)" } else { "" }
    );
}

/// `moe_decode_fused`'s gate/up issue stagger (ns between consecutive warps of a block; kernel comment
/// in moe/decode_fused.cu): 0.6 x the time the DRAM takes to deliver one item a block (four rows of codes and
/// their scale bytes, grid blocks) at its peak bandwidth, 76 ns on the H200 (PERF.md run 185: 0 ->
/// 60-120 ns took the step from 2.456 to 2.423-2.426 ms; 200 ns 2.440). 0 when the driver reports
/// no memory clock.
fn mk_stagger(cfg: &LagunaConfig, dev: &Dev, grid: u32) -> i32 {
    if dev.mem_bw <= 0.0 || grid == 0 {
        return 0;
    }
    let h = cfg.hidden_size as f64;
    let item = 4.0 * (h / 2.0 + h / 16.0);
    (0.6 * grid as f64 * item / dev.mem_bw * 1e9)
        .round()
        .clamp(0.0, 5000.0) as i32
}

/// Grid and dynamic shared memory of `moe_decode_fused` for this model, or (0, 0) when it cannot run:
/// the shapes are outside what the kernel holds (H <= 2048, I <= 512, at most 32 slots a row and
/// 256 experts, 16-multiples) or the occupancy query gives no block. The grid is one block an
/// SM, all resident at once, since its grid-wide barriers spin. Whether it runs is the
/// choice of `select::moe::fused_decode`.
pub(super) fn mk_launch(cfg: &LagunaConfig, dev: &Dev) -> (u32, u32) {
    let per_sm = |name| dev.occupancy(name, MK_BLOCK, mk_smem(cfg).unwrap_or(0) as usize);
    let per_sm = per_sm("moe_decode_fused").min(per_sm("moe_decode_fused_tc"));
    match mk_geom(cfg, dev.sms, per_sm) {
        Some((grid, smem)) => (grid, smem),
        None if mk_smem(cfg).is_some() => {
            tracing::warn!(
                "moe_decode_fused: no block fits an SM; the MoE runs as separate launches"
            );
            (0, 0)
        }
        None => (0, 0),
    }
}
