//! A MoE layer's half after the attention: the post-attention norm, the router and its top-k,
//! the experts (the fused one-row decode launch, the weight-streaming kernels or the grouped
//! GEMMs), the shared expert and the combine. Kernels from `select::moe`, launched through
//! `launch::moe`.
use super::launch::moe::{self as lm, Groups, Stack as LStack, TopK};
use super::launch::Geom;
use super::select::moe as sel;
use super::{cerr, device, launch, CudaModel, Experts, LayerW, MlpW, Stack};
use crate::error::Result;

impl CudaModel {
    fn moe_shape(&self, experts: &Experts) -> sel::Shape {
        let fp4 = experts.gate.fp4 && experts.up.fp4 && experts.down.fp4;
        sel::Shape {
            h: self.cfg.hidden_size,
            im: self.cfg.moe_intermediate_size,
            experts: self.cfg.num_experts,
            fp4,
            gate_fp4: experts.gate.fp4,
            down_fp4: experts.down.fp4,
        }
    }

    fn groups(&self) -> Groups {
        let sc = &self.sc;
        Groups {
            expert: sc.grp_e,
            start: sc.grp_s,
            count: sc.grp_c,
            perm: sc.perm,
            meta: sc.meta,
        }
    }

    fn topk(&self, bias: u64, folded: bool) -> TopK {
        let cfg = &self.cfg;
        TopK {
            bias,
            experts: cfg.num_experts as i32,
            k: cfg.top_k as i32,
            softcap: cfg.router_softcap as f32,
            norm_topk: cfg.norm_topk_prob as i32,
            shared_slot: folded as i32,
            inv_scale: (1.0 / cfg.routed_scaling_factor) as f32,
        }
    }

    /// Layer `l`'s MoE over the pass's `m` rows, added into the residual sc.x. Returns whether
    /// it also wrote `next`'s input norm into sc.hn.
    pub(super) fn moe_layer(
        &self,
        prof: &mut Option<device::Prof>,
        l: &LayerW,
        next: Option<&LayerW>,
        m: usize,
    ) -> Result<bool> {
        let MlpW::Moe {
            router,
            bias,
            experts,
            shared,
            folded,
        } = &l.mlp
        else {
            return Ok(false);
        };
        let (cfg, sc, d) = (&self.cfg, &self.sc, &self.dev);
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        let gemm = m >= self.opts.gemm_min_rows;
        if !gemm {
            if let Some(name) = self.fused_decode_kernel(l, m) {
                self.moe_decode_fused(prof, name, l, next)?;
                return Ok(next.is_some());
            }
        }
        self.norm_rows(prof, l.post_norm, m, eps, gemm)?;
        let e = cfg.num_experts;
        let kk = cfg.top_k + *folded as usize;
        let ne = e + *folded as usize;
        // One row: the router writes the expert groups itself (no moe_group launch).
        let direct = m == 1 && kk <= 32 && !gemm;
        self.linear(prof, "router", router, sc.hn, h, sc.rlog, e, m, false)?;
        let groups = self.groups();
        let topk = self.topk(*bias, *folded);
        lm::router_topk(
            d,
            prof,
            m as u32,
            sc.rlog,
            &topk,
            sc.ids,
            sc.wts,
            direct.then_some(&groups),
        )
        .map_err(cerr)?;
        let s = m * kk;
        if !direct {
            let tiles = if gemm { sc.tiles } else { 0 };
            let shared_expert = if *folded { e as i32 } else { -1 };
            lm::moe_group(
                d,
                prof,
                sc.ids,
                s as i32,
                ne as i32,
                &groups,
                tiles,
                kk as i32,
                shared_expert,
            )
            .map_err(cerr)?;
        }
        if gemm {
            self.moe_experts_gemm(prof, experts, m, kk)?;
        } else {
            self.moe_experts_stream(prof, experts, m, kk, s.min(ne))?;
        }
        let sh = if let Some((a, b2, c)) = shared {
            self.ffn(prof, a, b2, c, None, None, m, sc.shared_out, false)?;
            sc.shared_out
        } else {
            0
        };
        let comb = lm::Combine {
            x: sc.x,
            out: sc.moe_out,
            wts: sc.wts,
            shared: sh,
            h: h as i32,
            kk: kk as i32,
            scale: cfg.routed_scaling_factor as f32,
        };
        // Long passes: the combine and the next layer's input norm (with the split the next
        // projection GEMM reads) in one launch; decode passes keep the wide combine (one block
        // a row would do a row's whole norm).
        if let Some(next) = next.filter(|_| gemm) {
            let n = lm::NextNorm {
                w: next.input_norm,
                hn: sc.hn,
                eps,
                xs: sc.xs,
                block: launch::norm::norm_block(h),
            };
            lm::combine(d, prof, m as u32, &comb, Some(&n)).map_err(cerr)?;
            self.pass.xs_holds.set((sc.hn, true));
            return Ok(true);
        }
        lm::combine(d, prof, m as u32, &comb, None).map_err(cerr)?;
        Ok(false)
    }

    /// The grouped expert GEMMs of a long pass (sc.xs holds hn's hi / lo split: rmsnorm_split
    /// or the router GEMM's split wrote it and nothing wrote xs since).
    fn moe_experts_gemm(
        &self,
        prof: &mut Option<device::Prof>,
        experts: &Experts,
        m: usize,
        kk: usize,
    ) -> Result<()> {
        let (cfg, sc, d) = (&self.cfg, &self.sc, &self.dev);
        let (h, im) = (cfg.hidden_size, cfg.moe_intermediate_size);
        let s = m * kk;
        let ne = cfg.num_experts + (kk - cfg.top_k);
        let max_tiles = (s / 64 + s.min(ne) + 1) as u32;
        let k = sel::gemm(&self.moe_shape(experts));
        let a = lm::GemmGateUp {
            gate: stack(&experts.gate),
            up: stack(&experts.up),
            xs: sc.xs,
            xlo: (m * h) as u64,
            h: h as i32,
            im: im as i32,
            kk: kk as i32,
            groups: self.groups(),
            tiles: sc.tiles,
            out: sc.moe_gu,
            // SiLU(gate) * up in the epilogue: the down GEMM's input split into sc.moe_gu
            // (bf16 [s, im], lo at + s * im), not f32 gate | up.
            silu_lo: k.silu.then_some((s * im) as u64),
        };
        let grid = ((2 * im).div_ceil(64) as u32, max_tiles, 1);
        lm::gemm_gate_up(d, prof, k.gate_up, Geom::new(grid, 128, 0), &a).map_err(cerr)?;
        let act = if k.silu {
            sc.moe_gu
        } else {
            // SiLU(gate) * up straight into the BF16 split (hi and lo) the down GEMM reads.
            self.silu_split(prof, sc.moe_gu, s, im)?;
            sc.xs
        };
        let a = lm::GemmDown {
            down: stack(&experts.down),
            act,
            xlo: (s * im) as u64,
            h: h as i32,
            im: im as i32,
            groups: self.groups(),
            tiles: sc.tiles,
            out: sc.moe_out,
        };
        let grid = (h.div_ceil(k.down_tile) as u32, max_tiles, 1);
        lm::gemm_down(d, prof, k.down, Geom::new(grid, 128, 0), &a).map_err(cerr)
    }

    /// The weight-streaming expert kernels (decode, DFlash verify, any pass below
    /// gemm_min_rows): the same per-slot arithmetic whatever the number of rows.
    fn moe_experts_stream(
        &self,
        prof: &mut Option<device::Prof>,
        experts: &Experts,
        m: usize,
        kk: usize,
        groups: usize,
    ) -> Result<()> {
        let (cfg, sc, d) = (&self.cfg, &self.sc, &self.dev);
        let (h, im) = (cfg.hidden_size, cfg.moe_intermediate_size);
        let k = sel::stream(&self.moe_shape(experts), m, m * kk, groups, &self.props());
        if k.tc {
            // The rows' B fragments into sc.xs (free here: the router has run), then the
            // tensor-core items (the fused decode launch's arithmetic).
            lm::tc_bfrag_rows(d, prof, m as u32, sc.hn, sc.xs).map_err(cerr)?;
            self.pass.xs_holds.set((0, false));
        }
        let a = lm::GateUp {
            gate: stack(&experts.gate),
            up: stack(&experts.up),
            x: if k.tc { sc.xs } else { sc.hn },
            h: h as i32,
            im: im as i32,
            kk: kk as i32,
            groups: self.groups(),
            act: sc.moe_act,
        };
        let g = Geom::new(k.gu_grid, k.block, k.gu_smem);
        lm::gate_up(d, prof, k.gate_up, g, &a).map_err(cerr)?;
        let a = lm::Down {
            down: stack(&experts.down),
            act: sc.moe_act,
            h: h as i32,
            im: im as i32,
            groups: self.groups(),
            out: sc.moe_out,
        };
        let g = Geom::new(k.dn_grid, k.block, k.dn_smem);
        lm::down(d, prof, k.down, g, &a).map_err(cerr)
    }

    /// The fused one-row decode kernel when layer `l` fits it in an m-row pass.
    fn fused_decode_kernel(&self, l: &LayerW, m: usize) -> Option<&'static str> {
        let MlpW::Moe {
            router,
            experts,
            shared,
            ..
        } = &l.mlp
        else {
            return None;
        };
        sel::fused_decode(
            &self.moe_shape(experts),
            m,
            router.fp4,
            shared.is_some(),
            self.shape.mk_grid,
            sel::MK_BLOCK,
        )
    }

    /// The MoE half of a one-row pass as one launch (post-attention norm, router, top-k,
    /// experts, combine into sc.x), ending with `next`'s input norm into sc.hn, or after the last
    /// layer with the final norm of the row into sc.hsel, where final_logits would write it
    /// (rmsnorm's arithmetic either way).
    fn moe_decode_fused(
        &self,
        prof: &mut Option<device::Prof>,
        name: &'static str,
        l: &LayerW,
        next: Option<&LayerW>,
    ) -> Result<()> {
        let MlpW::Moe {
            router,
            bias,
            experts,
            folded,
            ..
        } = &l.mlp
        else {
            return Ok(());
        };
        let (cfg, sc) = (&self.cfg, &self.sc);
        let h = cfg.hidden_size;
        self.pass.xs_holds.set((0, false));
        let (next_w, hn_out) = match next {
            Some(n) => (n.input_norm, sc.hn),
            None => {
                self.pass.final_normed.set(true);
                (self.w.final_norm, sc.hsel)
            }
        };
        let a = lm::DecodeFused {
            x: sc.x,
            post_w: l.post_norm,
            eps: cfg.rms_norm_eps as f32,
            nb: launch::norm::norm_block(h) as i32,
            router: router.w,
            rlog: sc.rlog_mk,
            topk: self.topk(*bias, *folded),
            gate: stack(&experts.gate),
            up: stack(&experts.up),
            down: stack(&experts.down),
            h: h as i32,
            im: cfg.moe_intermediate_size as i32,
            act: sc.moe_act,
            out: sc.moe_out,
            ids: sc.ids,
            wts: sc.wts,
            scale: cfg.routed_scaling_factor as f32,
            bar: sc.gbar,
            next_w,
            hn_out,
            tp: 0,
            stag: self.shape.mk_stag,
        };
        let g = Geom::new(
            (self.shape.mk_grid, 1, 1),
            sel::MK_BLOCK,
            self.shape.mk_smem,
        );
        lm::decode_fused(&self.dev, prof, name, g, &a).map_err(cerr)
    }
}

fn stack(s: &Stack) -> LStack {
    LStack {
        w: s.w,
        s: s.s,
        inv: s.inv,
    }
}
