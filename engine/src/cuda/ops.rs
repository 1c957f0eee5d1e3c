//! The building blocks the layers launch: activation split, RMSNorm (with the GEMM split),
//! Linear (GEMM / cuBLAS for long passes, tensor-core or SIMT GEMV below), the dense MLP and the
//! final norm + lm_head.
use super::*;

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
        let xs = self.sc.xs;
        self.xs_holds.set((0, false));
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
            self.xs_holds.set((sc.hn, true));
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
        self.xs_holds.set((0, false));
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
    /// GEMVs (the fused gate | up, `_tlnds`, the folded lm_head argmax) must repeat.
    pub(super) fn tc_takes(&self, l: &Lin, m: usize) -> bool {
        m < self.opts.gemm_min_rows && !l.fp4 && l.k % 32 == 0 && self.kset.tc_gemv
    }

    /// norm_fold: where the GEMV `linear` would launch for `l` over an m-row pass is
    /// `linear_tc_bf16_tlnb` on one row of K = the hidden size <= 2048, the weights and warps a
    /// block of the `linear_tc_bf16_tlnbr` launch (`launch_tlnbr`) that stands in for the
    /// RMSNorm of sc.x into sc.hn + that GEMV on hn. None where it does not apply.
    pub(super) fn norm_fold(&self, l: &Lin, m: usize) -> Option<(u64, u32)> {
        let h = self.cfg.hidden_size;
        if !(self.kset.norm_fold && m == 1 && l.k == h && h <= 2048 && self.tc_takes(l, m)) {
            return None;
        }
        let (name, w, sw) = self.tc_gemv(l, m);
        (name == "linear_tc_bf16_tlnb").then_some((w, sw))
    }

    /// One `linear_tc_bf16_tlnbr` launch (`norm_fold`'s w and sw): the GEMV of `l`'s shape on
    /// the RMSNorm (weights `norm_w`) of the residual row sc.x, into y (row stride ldy). sc.hn
    /// is not written: the GEMV was its only reader.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_tlnbr(
        &self,
        prof: &mut Option<device::Prof>,
        l: &Lin,
        w: u64,
        sw: u32,
        norm_w: u64,
        y: u64,
        ldy: usize,
    ) -> Result<()> {
        let h = self.cfg.hidden_size;
        let eps = self.cfg.rms_norm_eps as f32;
        self.xs_holds.set((0, false));
        self.dev
            .launch_p(
                prof,
                "linear_tc_bf16_tlnbr",
                (ceil_div(l.n, 16) as u32, 1, 1),
                (32 * sw, 1, 1),
                0,
                |b| {
                    lin_args(b, l, w, self.sc.x, h, y, ldy, 1, false);
                    b.u64(norm_w).f32(eps).i32(norm_block(h) as i32);
                },
            )
            .map_err(cerr)
    }

    /// The tensor-core GEMV `linear` launches for `l` over `m` rows (non-NVFP4, K % 32 == 0,
    /// KernelSet tc_gemv): the kernel, the weights it reads and its warps a block.
    pub(super) fn tc_gemv(&self, l: &Lin, m: usize) -> (&'static str, u64, u32) {
        // Tensor-core GEMV: one weight read for up to 8 rows per column tile, identical
        // per-row arithmetic for 1 row and for k+1 (batch-invariant decode vs verify).
        // Warps per block (they split K): enough blocks x warps to fill the GPU for narrow
        // outputs (o_proj: N = 2048 is 128 blocks). Fixed per (N, K) on a device (never by
        // the pass's rows): batch-invariant.
        // tc_s5: 5 warps a block where the 16-row groups number at most 4 an SM (the 48-head
        // layers' q|k|v|g, 515 blocks): at 4 warps an SM holds 5 of its blocks and ~20 SMs
        // got none; at 5 it holds 4 (82 registers: 23 warps an SM), so every SM streams.
        let sw = if l.n <= 2048 {
            16u32
        } else if l.n <= 4096 {
            8
        } else if self.kset.tc_s5 && ceil_div(l.n, 16) <= 4 * self.dev.sms as usize {
            5
        } else {
            4
        };
        // The tile-interleaved copy when there is one (`tc_tl`): same arguments, same bits.
        let (name, w) = if l.t != 0 && self.kset.tc_na && self.kset.tc_bf {
            // tc_db / tc_dbq: one row, two rounds of weight loads in flight a warp.
            let one = m == 1;
            if one && self.kset.tc_db && sw == 16 && l.k <= 8192 {
                ("linear_tc_bf16_tlnd", l.t)
            } else if one
                && self.kset.tc_dbq
                && (sw == 4 || sw == 5)
                && l.k <= 2048
                && l.n > 4096
                && l.n <= 16384
            {
                ("linear_tc_bf16_tlndq", l.t)
            } else {
                ("linear_tc_bf16_tlnb", l.t)
            }
        } else if l.t != 0 && self.kset.tc_na {
            ("linear_tc_bf16_tln", l.t)
        } else if l.t != 0 {
            ("linear_tc_bf16_tl", l.t)
        } else {
            ("linear_tc_bf16", l.w)
        };
        (name, w, sw)
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
        let args_w =
            |b: &mut device::Args, w: u64, x: u64| lin_args(b, l, w, x, ldx, y, ldy, m, acc);
        let args = |b: &mut device::Args, x: u64| args_w(b, l.w, x);
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
        if tag != "router" && self.tc_takes(l, m) {
            let (name, w, sw) = self.tc_gemv(l, m);
            return self
                .dev
                .launch_p(
                    prof,
                    name,
                    (ceil_div(l.n, 16) as u32, ceil_div(m, 8) as u32, 1),
                    (32 * sw, 1, 1),
                    0,
                    |b| args_w(b, w, x),
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

    /// down(silu(gate(hn)) * up(hn)) into `out` (added when `acc`). `gu`: gate and up stacked
    /// in one buffer, gate and up views of its halves (MlpW::Dense). `norm`: hn is still to be
    /// made, the RMSNorm of the residual sc.x with these weights (norm_rows, or folded into
    /// the gate | up launch: `norm_fold`).
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
        // gu_fuse: a GEMV pass runs gate and up as one launch over the stacked matrix (2i
        // outputs a row, written where the two launches write them), with gate's kernel and
        // warps a block: each output's arithmetic is the one its half's launch does (the warps
        // split K the same way), so the same bits (kernels/emu invariance).
        // (dense_mlp builds gu only for BF16 halves of a width i % 16 == 0: no row group of
        // the stack mixes gate and up rows.)
        let fused = gu.filter(|_| self.kset.gu_fuse && self.tc_takes(gate, m));
        // norm_fold: the norm in the fused launch's prologue (its kernel and warps the gate's).
        let fold = fused
            .zip(norm)
            .and_then(|(f, nw)| self.norm_fold(gate, m).map(|(w, sw)| (f, nw, w, sw)));
        if let (Some(nw), None) = (norm, fold) {
            let split = m >= self.opts.gemm_min_rows;
            self.norm_rows(prof, nw, m, self.cfg.rms_norm_eps as f32, split)?;
        }
        if let Some((f, nw, w, sw)) = fold {
            self.launch_tlnbr(prof, f, w, sw, nw, sc.gu, 2 * i)?;
        } else if let Some(f) = fused {
            let (name, w, sw) = self.tc_gemv(gate, m);
            self.dev
                .launch_p(
                    prof,
                    name,
                    (ceil_div(f.n, 16) as u32, ceil_div(m, 8) as u32, 1),
                    (32 * sw, 1, 1),
                    0,
                    |b| lin_args(b, f, w, sc.hn, h, sc.gu, 2 * i, m, false),
                )
                .map_err(cerr)?;
        } else {
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
        }
        // silu_fold: one row whose down projection `linear` would launch as
        // `linear_tc_bf16_tlnd` reads the gate | up row itself (`_tlnds`: the same bits as
        // silu_mul + `_tlnd`, with the same grid and arguments but the row).
        let tc_down = m == 1 && down.k == i && self.tc_takes(down, m);
        if tc_down && self.kset.silu_fold {
            let (name, w, sw) = self.tc_gemv(down, m);
            if name == "linear_tc_bf16_tlnd" {
                return self
                    .dev
                    .launch_p(
                        prof,
                        "linear_tc_bf16_tlnds",
                        (ceil_div(down.n, 16) as u32, 1, 1),
                        (32 * sw, 1, 1),
                        0,
                        |b| lin_args(b, down, w, sc.gu, 2 * i, out, h, m, acc),
                    )
                    .map_err(cerr);
            }
        }
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

    /// `final_logits`; with `fold` (a greedy pass, KernelSet lm_argmax) the lm_head GEMV is
    /// `linear_tc_bf16_tlnba` where `linear` would launch `linear_tc_bf16_tlnb` for it, folding
    /// the logits into `sc.amax_slot`'s rows for `argmax_fin`. Returns whether it did.
    pub(super) fn final_logits_am(
        &self,
        prof: &mut Option<device::Prof>,
        n: usize,
        fold: bool,
    ) -> Result<bool> {
        let sc = &self.sc;
        let h = self.cfg.hidden_size;
        // A one-row pass whose last moe_block_1 wrote the final norm of row 0 into hsel.
        if !(n == 1 && self.final_normed.get()) {
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
        }
        let l = &self.lm_head;
        // Where `linear` would launch linear_tc_bf16_tlnb for the lm_head (its tests, in order).
        let tc = (fold && self.tc_takes(l, n))
            .then(|| self.tc_gemv(l, n))
            .filter(|&(name, _, _)| name == "linear_tc_bf16_tlnb");
        if let Some((_, w, sw)) = tc {
            let v = self.cfg.vocab_size;
            self.dev
                .launch_p(
                    prof,
                    "linear_tc_bf16_tlnba",
                    (ceil_div(l.n, 16) as u32, ceil_div(n, 8) as u32, 1),
                    (32 * sw, 1, 1),
                    0,
                    |b| {
                        lin_args(b, l, w, sc.hsel, h, sc.logits, v, n, false);
                        b.u64(sc.amax_slot);
                    },
                )
                .map_err(cerr)?;
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

/// Threads of a row-norm block over `h` values: up to 8 per thread, whole warps, at most 1024.
pub(super) fn norm_block(h: usize) -> u32 {
    (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// The arguments every Linear kernel takes (x: the activations it reads, w: the weights).
#[allow(clippy::too_many_arguments)]
pub(super) fn lin_args(
    b: &mut device::Args,
    l: &Lin,
    w: u64,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    m: usize,
    acc: bool,
) {
    b.u64(w)
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
}
