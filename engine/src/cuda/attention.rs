//! A layer's attention after its q|k|v|g projections: the q/k norm + RoPE + K/V write, then the
//! flash prefill attention (long or staged passes) or the split-KV decode attention and its merge.
//! Kernels from `select::attention`, launched through `launch::attention`.
use super::launch::attention::{self as la, Attn, Cache, FusedQk, Merge, Prefill, QkStore, Rope};
use super::launch::Geom;
use super::select::attention::{self as sel, Form};
use super::{cerr, device, split_grid, CudaModel, KvArgs, LayerW, ATT_CHUNK, SPLIT_ROWS, TC_CHUNK};
use crate::config::Gating;
use crate::error::Result;

/// Where a layer's projections left q, k, v and the gate (row strides in floats).
pub(super) struct Proj {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub g: u64,
    pub ldq: usize,
    pub ldkv: usize,
    pub ldg: usize,
}

impl CudaModel {
    /// The attention of layer `l` over the pass's `m` rows into sc.attn (and, in a GEMM pass, its
    /// BF16 split into sc.xs for the o_proj GEMM).
    pub(super) fn attention(
        &self,
        prof: &mut Option<device::Prof>,
        l: &LayerW,
        m: usize,
        p: &Proj,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let sc = &self.sc;
        let d = &self.dev;
        let (hd, nkv, nh) = (cfg.head_dim, cfg.num_kv_heads, l.nh);
        let eps = cfg.rms_norm_eps as f32;
        let kv = self.kv_args(l);
        let staged = l.ring && self.pass.staged.get();
        let (ks, vs) = if staged {
            (sc.kstage, sc.vstage)
        } else {
            (0, 0)
        };
        let shape = sel::Shape {
            m,
            nh,
            nkv,
            hd,
            window: l.window,
            half: l.half,
            fp8: self.kv.elt == 1,
            // `solo` is never set for a non-causal model.
            solo: self.pass.solo.get(),
            staged,
        };
        let flash = sel::flash_takes(&shape)
            && (staged || (m >= self.opts.gemm_min_rows && !self.fwd.noncausal));
        let dec = sel::select_decode(&shape);
        let rope = Rope {
            q_norm: l.q_norm,
            k_norm: l.k_norm,
            inv_freq: l.inv_freq,
            half: l.half as i32,
            attn_factor: l.attn_factor,
            eps,
        };
        let cache = Cache {
            pos: sc.pos,
            seqrow: sc.seqrow,
            bt: kv.bt,
            max_pages: kv.max_pages as i32,
            page_size: kv.page_size as i32,
            kc: l.kc,
            vc: l.vc,
        };
        if flash || !dec.fused_qk {
            let a = QkStore {
                q: p.q,
                ldq: p.ldq as i32,
                k: p.k,
                v: p.v,
                ldkv: p.ldkv as i32,
                rope,
                cache,
                nh: nh as i32,
                nkv: nkv as i32,
                hd: hd as i32,
                ks,
                vs,
                kinv: 1.0 / l.kscale,
                vinv: 1.0 / l.vscale,
            };
            let grid = (m as u32, (nh + nkv).div_ceil(4) as u32, 1);
            la::qk_norm_rope_store(d, prof, shape.fp8, Geom::new(grid, 128, 0), &a)
                .map_err(cerr)?;
        }
        let gate_mode = match (l.g.is_some(), cfg.gating) {
            (false, _) | (_, Gating::None) => 0,
            (true, Gating::PerHead) => 1,
            (true, Gating::PerElement) => 2,
        };
        let qw = nh * hd;
        let attn = Attn {
            q: p.q,
            ldq: p.ldq as i32,
            out: sc.attn,
            ldo: qw as i32,
            cache,
            nh: nh as i32,
            nkv: nkv as i32,
            hd: hd as i32,
            window: l.window as i32,
            sink: l.sink,
            g: p.g,
            ldg: p.ldg as i32,
            gate_mode,
            // The K scale folds into the softmax scale; the V scale multiplies the output.
            scale: ((1.0 / (hd as f64).sqrt()) * l.kscale as f64) as f32,
            vscale: l.vscale,
        };
        if flash {
            return self.prefill_attention(prof, l, m, &attn, staged.then_some((ks, vs)), &kv);
        }
        // Split-KV (flash-decoding) for small batches: a row's splits depend on its own length
        // only (at least ATT_CHUNK keys each; the tensor-core form's from tc_splits).
        let tc = dec.form == Form::Tc;
        let nsplit = if m > SPLIT_ROWS {
            1
        } else if tc {
            split_grid(
                self.pass.tc_cap.get(),
                TC_CHUNK,
                l.window,
                self.fwd.noncausal,
            )
        } else {
            split_grid(self.shape.nsplit, ATT_CHUNK, l.window, self.fwd.noncausal)
        };
        let heads = if dec.form == Form::Head { nh } else { nkv };
        let grid = (m as u32, heads as u32, nsplit as u32);
        let blocks = m * heads * nsplit;
        let (name, block) = sel::decode_kernel(&shape, dec, blocks, &self.props());
        // One block an SM for a grid within one wave (see select::attention::SPREAD).
        let smem = sel::decode_smem(name, blocks, &self.props(), d.spread_pad(name));
        let fused = FusedQk {
            k: p.k,
            v: p.v,
            ldkv: p.ldkv as i32,
            rope,
            kinv: 1.0 / l.kscale,
            vinv: 1.0 / l.vscale,
        };
        let kend = if self.fwd.noncausal { sc.kend } else { 0 };
        let stage = if staged { [ks, vs, sc.sspan] } else { [0; 3] };
        la::decode(
            d,
            prof,
            name,
            Geom::new(grid, block, smem),
            &attn,
            nsplit as i32,
            sc.part,
            dec.fused_qk.then_some(&fused),
            kend,
            stage,
        )
        .map_err(cerr)?;
        if nsplit > 1 {
            let merge = Merge {
                part: sc.part,
                nsplit: nsplit as i32,
                out: sc.attn,
                ldo: qw as i32,
                nh: nh as i32,
                hd: hd as i32,
                sink: l.sink,
                g: p.g,
                ldg: p.ldg as i32,
                gate_mode,
                pos: sc.pos,
                window: l.window as i32,
                kend,
                vscale: l.vscale,
            };
            let g = Geom::new((m as u32, nh as u32, 1), sel::merge_block(hd), 0);
            la::merge(d, prof, sel::merge_kernel(dec.form, nsplit), g, &merge).map_err(cerr)?;
        }
        if staged {
            self.ring_commit(prof, l, m, (ks, vs), &kv)?;
        }
        Ok(())
    }

    /// The flash prefill attention of a long (or staged) pass, then the staged rows' ring commit.
    fn prefill_attention(
        &self,
        prof: &mut Option<device::Prof>,
        l: &LayerW,
        m: usize,
        attn: &Attn,
        stage: Option<(u64, u64)>,
        kv: &KvArgs,
    ) -> Result<()> {
        let sc = &self.sc;
        let d = &self.dev;
        let name = sel::prefill_kernel(self.kv.elt == 1, &self.props());
        // In a GEMM pass the output goes straight to the BF16 split (hi and lo) the o_proj GEMM
        // reads.
        let to_xs = m >= self.opts.gemm_min_rows;
        let (ks, vs) = stage.unwrap_or((0, 0));
        let p = Prefill {
            tiles: sc.atiles,
            ks,
            vs,
            sfirst: sc.sspan,
            xs: if to_xs { sc.xs } else { 0 },
            m: m as i32,
        };
        let grid = (self.pass.natiles.get() as u32, l.nh as u32, 1);
        let g = Geom::new(grid, 128, sel::big_smem(name));
        la::prefill(d, prof, name, g, attn, &p).map_err(cerr)?;
        self.pass
            .xs_holds
            .set(if to_xs { (sc.attn, true) } else { (0, false) });
        if let Some(st) = stage {
            self.ring_commit(prof, l, m, st, kv)?;
        }
        Ok(())
    }

    /// A staged pass's rows (K / V in the stage `st`) into the layer's ring, after its attention.
    fn ring_commit(
        &self,
        prof: &mut Option<device::Prof>,
        l: &LayerW,
        m: usize,
        st: (u64, u64),
        kv: &KvArgs,
    ) -> Result<()> {
        let sc = &self.sc;
        let a = la::RingCommit {
            ks: st.0,
            vs: st.1,
            pos: sc.pos,
            seqrow: sc.seqrow,
            slast: sc.sspan + 4 * sc.rows as u64,
            bt: kv.bt,
            ring: kv.max_pages as i32,
            kc: l.kc,
            vc: l.vc,
            rowb: (self.cfg.num_kv_heads * self.cfg.head_dim * self.kv.elt) as i32,
        };
        la::ring_commit(&self.dev, prof, m as u32, &a).map_err(cerr)
    }
}
