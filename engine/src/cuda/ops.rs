//! The building blocks the layers launch: activation split, RMSNorm (with the GEMM split),
//! Linear (GEMM / cuBLAS for long passes, tensor-core or SIMT GEMV below), the dense MLP and the
//! final norm + lm_head.
use super::launch::linear as ll;
use super::launch::norm::norm_block;
use super::launch::Geom;
use super::{as_bytes, ceil_div, cerr, device, select, CudaModel, Lin};
use crate::error::Result;

impl CudaModel {
    /// x (f32 [m, k], row stride ldx) -> sc.xs as BF16 hi [m, k] then lo [m, k] (lo only when `lo`).
    pub(super) fn split(
        &self,
        prof: &mut Option<device::Prof>,
        x: u64,
        ldx: usize,
        m: usize,
        k: usize,
        lo: bool,
    ) -> Result<()> {
        self.pass.xs_holds.set((0, false));
        ll::split_bf16(&self.dev, prof, x, ldx, m, k, self.sc.xs, lo).map_err(cerr)
    }

    /// SiLU(gate) * up of `s` rows of `gu` (f32 [s, 2i], gate | up) -> sc.xs as BF16 hi [s, i]
    /// then lo [s, i] (the grouped down GEMM's input). sc.xs then holds no buffer's split: a GEMM
    /// on hn after it (the unfolded shared expert's gate and up) splits hn again.
    pub(super) fn silu_split(
        &self,
        prof: &mut Option<device::Prof>,
        gu: u64,
        s: usize,
        i: usize,
    ) -> Result<()> {
        self.pass.xs_holds.set((0, false));
        ll::silu_mul_split(&self.dev, prof, gu, self.sc.xs, s, i, true).map_err(cerr)
    }

    /// The layer norm of the residual sc.x into sc.hn; in a GEMM pass also its BF16 split into
    /// sc.xs (rmsnorm_split), which the next GEMMs on hn then read without a split_bf16.
    pub(super) fn norm_rows(
        &self,
        prof: &mut Option<device::Prof>,
        w: u64,
        m: usize,
        eps: f32,
        split: bool,
    ) -> Result<()> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        let xs = split.then_some(sc.xs);
        self.launch_rmsnorm(prof, sc.x, 0, w, sc.hn, m, h, eps, xs)?;
        if split {
            self.pass.xs_holds.set((sc.hn, true));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rmsnorm(
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
        self.launch_rmsnorm(prof, x, rows, w, y, m, h, eps, None)
    }

    /// `rmsnorm`, or with `xs` `rmsnorm_split` (y's BF16 hi / lo written to xs as well). Either
    /// way y is rewritten, so no split held in sc.xs is trusted afterwards (norm_rows sets it).
    #[allow(clippy::too_many_arguments)]
    fn launch_rmsnorm(
        &self,
        prof: &mut Option<device::Prof>,
        x: u64,
        rows: u64,
        w: u64,
        y: u64,
        m: usize,
        h: usize,
        eps: f32,
        xs: Option<u64>,
    ) -> Result<()> {
        self.pass.xs_holds.set((0, false));
        let name = if xs.is_some() {
            "rmsnorm_split"
        } else {
            "rmsnorm"
        };
        self.dev
            .launch_p(
                prof,
                name,
                (m as u32, 1, 1),
                (norm_block(h), 1, 1),
                0,
                |b| {
                    b.u64(x).u64(rows).u64(w).u64(y).i32(h as i32).f32(eps);
                    if let Some(xs) = xs {
                        b.u64(xs);
                    }
                },
            )
            .map_err(cerr)
    }

    /// Whether `linear` runs a non-router Linear `l` of an m-row pass as the tensor-core GEMV
    /// (`tc_gemv` then names the kernel): the test every launch that stands in for one of its
    /// GEMVs (the fused gate | up, the SiLU-staging down, the folded lm_head argmax) must repeat.
    pub(super) fn tc_takes(&self, l: &Lin, m: usize) -> bool {
        m < self.opts.gemm_min_rows && select::linear::tc_takes(&lin_shape(l, m))
    }

    /// The tensor-core GEMV `linear` launches for `l` over `m` rows: the kernel, the weights it
    /// reads (the tile-interleaved copy when there is one) and its warps a block.
    pub(super) fn tc_gemv(&self, l: &Lin, m: usize) -> (&'static str, u64, u32) {
        let (name, warps) = select::linear::tc_kernel(&lin_shape(l, m), &self.props());
        let w = if l.t != 0 { l.t } else { l.w };
        (name, w, warps)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear(
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
        let d = &self.dev;
        if m >= self.opts.gemm_min_rows {
            // The router keeps ~f32 precision too (hi + lo BF16 split) so top-k picks match the
            // reference.
            let held = self.pass.xs_holds.get();
            if !(held.0 == x && ldx == l.k && held.1) {
                self.split(prof, x, ldx, m, l.k, true)?;
            }
            let cublas = !l.fp4 && self.shape.use_cublas && self.dev.blas().is_some();
            let name = match select::linear::gemm(l.fp4, cublas) {
                select::linear::Gemm::Kernel(name) => name,
                select::linear::Gemm::Cublas => {
                    let blas = self.dev.blas().expect("cuBLAS loaded");
                    let xs = self.sc.xs;
                    let beta = if acc { 1.0 } else { 0.0 };
                    // hi, then lo accumulated.
                    for (xpart, beta) in [(xs, beta), (xs + 2 * (m * l.k) as u64, 1.0)] {
                        self.dev
                            .blas_gemm_bf16(
                                blas,
                                prof,
                                "cublas_bf16",
                                l.w,
                                xpart,
                                y,
                                m,
                                l.n,
                                l.k,
                                ldy,
                                beta,
                            )
                            .map_err(cerr)?;
                    }
                    return Ok(());
                }
            };
            let grid = (ceil_div(l.n, 64) as u32, ceil_div(m, 64) as u32, 1);
            let a = lin_args(l, l.w, self.sc.xs, ldx, y, ldy, m, acc);
            return ll::linear(d, prof, name, Geom::new(grid, 128, 0), &a).map_err(cerr);
        }
        if tag != "router" && self.tc_takes(l, m) {
            let (name, w, warps) = self.tc_gemv(l, m);
            let grid = select::linear::gemv_grid(l.n, m);
            let a = lin_args(l, w, x, ldx, y, ldy, m, acc);
            return ll::linear(d, prof, name, Geom::new(grid, 32 * warps, 0), &a).map_err(cerr);
        }
        // SIMT: one row with the activation staged; 2+ rows (DFlash verify / propose) with 2
        // weight rows a warp and up to 16 activation rows a weight read, the same per-row
        // arithmetic as one row.
        let (name, grid, shm) = select::linear::simt_kernel(&lin_shape(l, m));
        let a = lin_args(l, l.w, x, ldx, y, ldy, m, acc);
        ll::linear(d, prof, name, Geom::new(grid, 256, shm), &a).map_err(cerr)
    }

    /// down(silu(gate(hn)) * up(hn)) into `out` (added when `acc`). `gu`: gate and up stacked
    /// in one buffer, gate and up views of its halves (MlpW::Dense). `norm`: hn is still to be
    /// made, the RMSNorm of the residual sc.x with these weights.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ffn(
        &self,
        prof: &mut Option<device::Prof>,
        gate: &Lin,
        up: &Lin,
        down: &Lin,
        gu: Option<&Lin>,
        norm: Option<u64>,
        m: usize,
        out: u64,
        acc: bool,
    ) -> Result<()> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        let i = gate.n;
        // A GEMV pass runs gate and up as one launch over the stacked matrix (2i outputs a
        // row, written where the two launches write them), with gate's kernel and warps a
        // block: each output's arithmetic is the one its half's launch does (the warps split K
        // the same way), so the same bits (kernels/emu invariance). (dense_mlp builds gu only
        // for BF16 halves of a width i % 16 == 0: no row group of the stack mixes gate and up
        // rows.)
        let fused = gu.filter(|_| self.tc_takes(gate, m));
        if let Some(nw) = norm {
            let split = m >= self.opts.gemm_min_rows;
            self.norm_rows(prof, nw, m, self.cfg.rms_norm_eps as f32, split)?;
        }
        if let Some(f) = fused {
            let (name, w, warps) = self.tc_gemv(gate, m);
            let grid = select::linear::gemv_grid(f.n, m);
            let a = lin_args(f, w, sc.hn, h, sc.gu, 2 * i, m, false);
            ll::linear(&self.dev, prof, name, Geom::new(grid, 32 * warps, 0), &a).map_err(cerr)?;
        } else {
            self.linear(prof, "mlp", gate, sc.hn, h, sc.gu, 2 * i, m, false)?;
            let up_out = sc.gu + (4 * i) as u64;
            self.linear(prof, "mlp", up, sc.hn, h, up_out, 2 * i, m, false)?;
        }
        // One row whose down projection `linear` would launch as `linear_tc_bf16_tiled_row`:
        // `_row_silu` stages SiLU(gate) * up from the gate | up row itself (the same bits as
        // silu_mul + `_row`, with the same grid and arguments but the row), no silu_mul launch.
        if m == 1 && down.k == i && self.tc_takes(down, m) {
            let (name, w, warps) = self.tc_gemv(down, m);
            if name == "linear_tc_bf16_tiled_row" {
                let grid = (ceil_div(down.n, 16) as u32, 1, 1);
                let a = lin_args(down, w, sc.gu, 2 * i, out, h, m, acc);
                let g = Geom::new(grid, 32 * warps, 0);
                return ll::linear(&self.dev, prof, "linear_tc_bf16_tiled_row_silu", g, &a)
                    .map_err(cerr);
            }
        }
        ll::silu_mul(&self.dev, prof, sc.gu, sc.act, m, i).map_err(cerr)?;
        self.linear(prof, "mlp", down, sc.act, i, out, h, m, acc)
    }

    /// Final norm + lm_head for `rows` (indices into the current pass), logits left in sc.logits.
    pub(super) fn logits_rows(&self, prof: &mut Option<device::Prof>, rows: &[i32]) -> Result<()> {
        self.dev
            .htod_staged(self.sc.sel, as_bytes(rows))
            .map_err(cerr)?;
        self.final_logits(prof, rows.len())
    }

    /// Final norm + lm_head over the n rows of the residual listed in sc.sel, into sc.logits.
    pub(super) fn final_logits(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        self.final_logits_am(prof, n, false).map(|_| ())
    }

    /// `final_logits`; with `fold` (a greedy pass) the lm_head GEMV is
    /// `linear_tc_bf16_tiled_argmax` where `linear` would launch `linear_tc_bf16_tiled` for it, folding
    /// the logits into `sc.amax_slot`'s rows for `argmax_fin`. Returns whether it did.
    pub(super) fn final_logits_am(
        &self,
        prof: &mut Option<device::Prof>,
        n: usize,
        fold: bool,
    ) -> Result<bool> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        // A one-row pass whose last fused MoE launch wrote the final norm of row 0 into hsel.
        if !(n == 1 && self.pass.final_normed.get()) {
            self.rmsnorm(
                prof,
                sc.x,
                sc.sel,
                self.w.final_norm,
                sc.hsel,
                n,
                h,
                self.cfg.rms_norm_eps as f32,
            )?;
        }
        let l = &self.w.lm_head;
        // Where `linear` would launch linear_tc_bf16_tiled for the lm_head (its tests, in order).
        let tc = (fold && self.tc_takes(l, n))
            .then(|| self.tc_gemv(l, n))
            .filter(|&(name, _, _)| name == "linear_tc_bf16_tiled");
        if let Some((_, w, warps)) = tc {
            let v = self.cfg.vocab_size;
            let grid = select::linear::gemv_grid(l.n, n);
            let a = lin_args(l, w, sc.hsel, h, sc.logits, v, n, false);
            let g = Geom::new(grid, 32 * warps, 0);
            ll::linear_argmax(&self.dev, prof, g, &a, sc.amax_slot).map_err(cerr)?;
            return Ok(true);
        }
        self.linear(
            prof,
            "lm_head",
            l,
            sc.hsel,
            h,
            sc.logits,
            self.cfg.vocab_size,
            n,
            false,
        )?;
        Ok(false)
    }
}

/// The arguments every Linear kernel takes (x: the activations it reads, w: the weights).
#[allow(clippy::too_many_arguments)]
pub(super) fn lin_args(
    l: &Lin,
    w: u64,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    m: usize,
    acc: bool,
) -> ll::Linear {
    ll::Linear {
        w,
        s: l.s,
        inv_gs: l.inv_gs,
        x,
        ldx: ldx as i32,
        y,
        ldy: ldy as i32,
        m: m as i32,
        n: l.n as i32,
        k: l.k as i32,
        acc,
    }
}

/// A Linear job's shape for `select::linear`.
pub(super) fn lin_shape(l: &Lin, m: usize) -> select::linear::Shape {
    select::linear::Shape {
        m,
        n: l.n,
        k: l.k,
        fp4: l.fp4,
        tiled: l.t != 0,
    }
}
