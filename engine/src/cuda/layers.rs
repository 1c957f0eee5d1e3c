//! One forward pass over every layer for the rows whose metadata is on the device: attention
//! (q/k norm + RoPE + K/V write, split-KV decode or flash prefill), then the dense MLP or the
//! MoE (router, top-k, grouped experts in the weight-streaming or the GEMM regime, combine).
use super::attention::Proj;
use super::{cerr, device, launch, CudaModel, KvArgs, LayerW, MlpW};
use crate::error::Result;

impl CudaModel {
    /// Launch every layer for the `m` rows whose metadata is already on the device.
    pub(super) fn run_layers(&self, m: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        self.run_layers_hooked(m, prof, None)
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn run_layers_hooked(
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
        self.pass.xs_holds.set((0, false));
        self.pass.final_normed.set(false);
        // The previous layer's MoE launch already wrote this layer's input norm into hn (and
        // embed_norm the first layer's).
        let mut normed = false;
        if let Some(l0) = self.w.layers.first() {
            // The embedding gather and the first layer's input norm in one launch (in a GEMM
            // pass with the norm's BF16 hi / lo split, as norm_rows writes it).
            let split = m >= self.opts.gemm_min_rows;
            let xs = if split { sc.xs } else { 0 };
            d.launch_p(
                prof,
                "embed_norm",
                (m as u32, 1, 1),
                (launch::norm::norm_block(h), 1, 1),
                0,
                |b| {
                    b.u64(self.w.embed)
                        .u64(sc.tokens)
                        .u64(sc.amax)
                        .u64(sc.x)
                        .i32(h as i32)
                        .u64(l0.input_norm)
                        .u64(sc.hn)
                        .f32(eps)
                        .u64(xs);
                },
            )
            .map_err(cerr)?;
            if split {
                self.pass.xs_holds.set((sc.hn, true));
            }
            normed = true;
        }
        for (li, l) in self.w.layers.iter().enumerate() {
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
            self.attention(
                prof,
                l,
                m,
                &Proj {
                    q: qp,
                    k: kp,
                    v: vp,
                    g: gp,
                    ldq,
                    ldkv,
                    ldg,
                },
            )?;
            self.linear(prof, "attn_proj", &l.o, sc.attn, qw, sc.x, h, m, true)?;
            match &l.mlp {
                MlpW::Dense { gate, up, down, gu } => {
                    // ffn makes the norm (norm_rows).
                    let norm = Some(l.post_norm);
                    self.ffn(prof, gate, up, down, gu.as_ref(), norm, m, sc.x, true)?;
                }
                MlpW::Moe { .. } => {
                    // (It may also write the next layer's input norm into sc.hn.)
                    normed = self.moe_layer(prof, l, self.w.layers.get(li + 1), m)?;
                }
            }
            if let Some(f) = after.as_mut() {
                f(li)?;
            }
        }
        Ok(())
    }

    /// Cache addressing of a layer: its ring (page size 1, R slots per table row) or the paged
    /// pool.
    pub(super) fn kv_args(&self, l: &LayerW) -> KvArgs {
        let (bt, max_pages, page_size) = if l.ring {
            (self.sc.bt_ring, self.kv.ring, 1)
        } else {
            (self.sc.bt, self.kv.max_pages, self.kv.page_size)
        };
        KvArgs {
            bt,
            max_pages,
            page_size,
        }
    }
}
