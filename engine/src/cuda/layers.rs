//! One forward pass over every layer for the rows whose metadata is on the device: attention
//! (q/k norm + RoPE + K/V write, split-KV decode or flash prefill), then the dense MLP or the
//! MoE (router, top-k, grouped experts in the weight-streaming or the GEMM regime, combine).
use super::*;

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
        self.xs_holds.set((0, false));
        self.final_normed.set(false);
        // The previous layer's MoE combine already wrote this layer's input norm into hn (and
        // embed_norm the first layer's).
        let mut normed = false;
        match self.layers.first() {
            Some(l0) if self.kset.embed_norm => {
                let split = m >= self.opts.gemm_min_rows;
                // rmsnorm_split's BF16 hi / lo of hn too in a GEMM pass, as norm_rows writes it.
                let xs = if split { sc.xs } else { 0 };
                d.launch_p(
                    prof,
                    "embed_norm",
                    (m as u32, 1, 1),
                    (ops::norm_block(h), 1, 1),
                    0,
                    |b| {
                        b.u64(self.embed)
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
                    self.xs_holds.set((sc.hn, true));
                }
                normed = true;
            }
            _ => {
                d.launch_p(prof, "embed", (m as u32, 1, 1), (256, 1, 1), 0, |b| {
                    b.u64(self.embed)
                        .u64(sc.tokens)
                        .u64(sc.amax)
                        .u64(sc.x)
                        .i32(h as i32);
                })
                .map_err(cerr)?;
            }
        }
        for (li, l) in self.layers.iter().enumerate() {
            let nh = l.nh;
            let qw = nh * hd;
            let gemm_pass = m >= self.opts.gemm_min_rows;
            // norm_fold: the input norm in the q|k|v|g GEMV's prologue (XS-2.1's layer 1, after
            // the dense layer 0: the one input norm no other launch makes).
            let fold = l
                .qkvg
                .as_ref()
                .filter(|_| !normed)
                .and_then(|f| self.norm_fold(f, m));
            if !normed && fold.is_none() {
                self.norm_rows(prof, l.input_norm, m, eps, gemm_pass)?;
            }
            normed = false;
            let gw = l.g.map_or(0, |g| g.n);
            let (qp, kp, vp, gp, ldq, ldkv, ldg) = if let Some(f) = &l.qkvg {
                if let Some((w, sw)) = fold {
                    self.launch_tlnbr(prof, f, w, sw, l.input_norm, sc.q, f.n)?;
                } else {
                    self.linear(prof, "attn_proj", f, sc.hn, h, sc.q, f.n, m, false)?;
                }
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
            let blk = (hd as u32).div_ceil(32) * 32;
            let kv = self.kv_args(l);
            let staged = l.ring && sc.staged.get();
            let (ks, vs) = if staged {
                (sc.kstage, sc.vstage)
            } else {
                (0, 0)
            };
            let ablk = if hd <= 128 { 128 } else { 256 };
            let flash = staged
                || (m >= self.opts.gemm_min_rows
                    && hd % 16 == 0
                    && hd <= 128
                    && nh % nkv == 0
                    && !self.noncausal);
            let group = if nh % nkv == 0 { nh / nkv } else { 0 };
            let gqa = !flash
                && self.kset.attn_gqa
                && hd % 8 == 0
                && hd <= 128
                && (1..=16).contains(&group);
            // The tensor-core split-KV attention (`attention_tc`, KernelSet attn_tc / attn_tc_swa).
            let tc = gqa
                && hd % 16 == 0
                && if l.window > 0 {
                    self.kset.attn_tc_swa
                } else {
                    self.kset.attn_tc
                };
            // Split-KV (flash-decoding) for small batches: a row's splits depend on its own
            // length only (attention_gqa: at least ATT_CHUNK keys each; attention_tc: tc_splits).
            let nsplit = if m > SPLIT_ROWS {
                1
            } else if tc {
                split_grid(
                    self.tc_cap.get(),
                    TC_CHUNK,
                    l.window,
                    self.noncausal,
                    self.kset.swa_ns,
                )
            } else {
                split_grid(
                    self.nsplit,
                    ATT_CHUNK,
                    l.window,
                    self.noncausal,
                    self.kset.swa_ns,
                )
            };
            // q/k norm + RoPE + K/V write inside the decode attention (`attention_gqa_qk`, or
            // `attention_tc_qk` with attn_tc) when every row of the pass is alone in its sequence
            // (no row reads another's new key; `solo` is never set for a non-causal model).
            let tc_qk = tc && self.kset.attn_qk && sc.solo.get() && l.half <= 64;
            let fuse_qk = gqa
                && !tc
                && self.kset.attn_qk
                && (l.window > 0 || self.kset.qk_full)
                && sc.solo.get()
                && group <= 8;
            // The q/k norm + RoPE arguments both kernels take (after the K/V row pointers).
            let rope = |b: &mut device::Args| {
                b.u64(l.q_norm)
                    .u64(l.k_norm)
                    .u64(l.inv_freq)
                    .i32(l.half as i32)
                    .f32(l.attn_factor)
                    .f32(eps);
            };
            if !fuse_qk && !tc_qk {
                d.launch_p(
                    prof,
                    kv.qk_name,
                    (m as u32, (nh + nkv).div_ceil(4) as u32, 1),
                    (128, 1, 1),
                    0,
                    |b| {
                        b.u64(qp).i32(ldq as i32).u64(kp).u64(vp).i32(ldkv as i32);
                        rope(b);
                        b.u64(sc.pos)
                            .u64(sc.seqrow)
                            .u64(kv.bt)
                            .i32(kv.max_pages as i32)
                            .i32(kv.page_size as i32)
                            .u64(l.kc)
                            .u64(l.vc)
                            .i32(nh as i32)
                            .i32(nkv as i32)
                            .i32(hd as i32)
                            .u64(ks)
                            .u64(vs)
                            .f32(1.0 / l.kscale)
                            .f32(1.0 / l.vscale);
                    },
                )
                .map_err(cerr)?;
            }
            let gate_mode = match (l.g.is_some(), cfg.gating) {
                (false, _) | (_, Gating::None) => 0,
                (true, Gating::PerHead) => 1,
                (true, Gating::PerElement) => 2,
            };
            // Arguments shared by the prefill and the decode attention kernels.
            let common = |b: &mut device::Args| {
                b.u64(qp)
                    .i32(ldq as i32)
                    .u64(sc.attn)
                    .i32(qw as i32)
                    .u64(l.kc)
                    .u64(l.vc)
                    .u64(sc.pos)
                    .u64(sc.seqrow)
                    .u64(kv.bt)
                    .i32(kv.max_pages as i32)
                    .i32(kv.page_size as i32)
                    .i32(nh as i32)
                    .i32(nkv as i32)
                    .i32(hd as i32)
                    .i32(l.window as i32)
                    .u64(l.sink)
                    .u64(gp)
                    .i32(ldg as i32)
                    .i32(gate_mode)
                    // The K scale folds into the softmax scale; the V scale multiplies the output.
                    .f32(((1.0 / (hd as f64).sqrt()) * l.kscale as f64) as f32)
                    .f32(l.vscale);
            };
            // merge_o: the o_proj GEMV already ran (with the merge, linear_tc_bf16_tlndm).
            let mut o_done = false;
            if flash {
                let pname = match (kv.prefill_name, self.kset.bf16_attn, self.kset.attn_ex2) {
                    ("attention_prefill", true, _) => "attention_prefill_h",
                    ("attention_prefill_fp8", true, _) => "attention_prefill_fp8_h",
                    ("attention_prefill", false, true) if self.kset.attn_q => "attention_prefill_q",
                    ("attention_prefill_fp8", false, true) if self.kset.attn_q => {
                        "attention_prefill_fp8_q"
                    }
                    ("attention_prefill", false, true) => "attention_prefill_x",
                    ("attention_prefill_fp8", false, true) => "attention_prefill_fp8_x",
                    (n, _, _) => n,
                };
                // In a GEMM pass the output goes straight to the BF16 split the o_proj GEMM reads
                // (its lo half unless the dense GEMMs take BF16 alone).
                let to_xs = gemm_pass;
                let xs_lo = !self.kset.bf16_dense;
                d.launch_p(
                    prof,
                    pname,
                    (sc.natiles.get() as u32, nh as u32, 1),
                    (128, 1, 1),
                    big_smem(pname),
                    |b| {
                        common(b);
                        b.u64(sc.atiles)
                            .u64(ks)
                            .u64(vs)
                            .u64(sc.sspan)
                            .u64(if to_xs { sc.xs } else { 0 })
                            .i32(m as i32);
                    },
                )
                .map_err(cerr)?;
                self.xs_holds
                    .set(if to_xs { (sc.attn, xs_lo) } else { (0, false) });
                if staged {
                    let rowb = kvw * self.kv_elt;
                    d.launch_p(prof, "ring_commit", (m as u32, 1, 1), (64, 1, 1), 0, |b| {
                        b.u64(ks)
                            .u64(vs)
                            .u64(sc.pos)
                            .u64(sc.seqrow)
                            .u64(sc.sspan + 4 * sc.rows as u64)
                            .u64(kv.bt)
                            .i32(kv.max_pages as i32)
                            .u64(l.kc)
                            .u64(l.vc)
                            .i32(rowb as i32);
                    })
                    .map_err(cerr)?;
                }
            } else {
                let (aname, agrid, ablk) = if tc {
                    // tc_nst3: a grid of at most one block an SM (the decode step's full layers)
                    // takes attention_tc_qk3 (three K/V steps a warp before the wait; the same
                    // bits, so a verify pass on the two-stage kernel still matches).
                    let one_wave = (m * nkv * nsplit) as u32 <= d.sms;
                    let qk_name = match kv.tc_qk3_name {
                        Some(n) if self.kset.tc_nst3 && one_wave => n,
                        _ => kv.tc_qk_name,
                    };
                    (
                        if tc_qk { qk_name } else { kv.tc_name },
                        (m as u32, nkv as u32, nsplit as u32),
                        128,
                    )
                } else if fuse_qk {
                    (
                        kv.gqa_qk_name,
                        (m as u32, nkv as u32, nsplit as u32),
                        (32 * (group + 1)) as u32,
                    )
                } else if gqa {
                    (
                        kv.gqa_name,
                        (m as u32, nkv as u32, nsplit as u32),
                        (32 * group) as u32,
                    )
                } else {
                    (kv.attn_name, (m as u32, nh as u32, nsplit as u32), ablk)
                };
                // gqa_cl: the sliding layers' decode attention merging its own splits in clusters
                // of a KV head's split blocks (attention_gqa_qkc; BF16 cache, at most 16 splits
                // and 8 query heads a KV head), when the device holds every cluster at once:
                // padded to one block an SM if that fits, else unpadded.
                let cl_shape = fuse_qk
                    && self.kset.gqa_cl
                    && kv.gqa_qk_name != "attention_gqa_qk_fp8"
                    && (2..=16).contains(&nsplit)
                    && group <= 8
                    && hd <= 128
                    && (group * hd).div_ceil(nsplit) <= 32 * (group + 1)
                    // (a block's outputs span at most 8 heads: the kernel's split tables)
                    && (group * hd).div_ceil(nsplit).div_ceil(hd.max(1)) < 8;
                // One block an SM for a grid within one wave (see device::SPREAD).
                let nblk = agrid.0 as u64 * agrid.1 as u64 * agrid.2 as u64;
                let spread = |name: &str| {
                    if nblk <= d.sms as u64 {
                        d.spread_pad(name)
                    } else {
                        0
                    }
                };
                let cl_name = "attention_gqa_qkc";
                let cl_smem = if cl_shape {
                    let pad = spread(cl_name);
                    let choices: &[u32] = if pad > 0 { &[pad, 0] } else { &[0] };
                    d.cluster_fit(cl_name, agrid, ablk, nsplit as u32, choices)
                } else {
                    None
                };
                let cluster = cl_smem.is_some();
                // gqa_lm: the last split block of each (row, KV head) merges the group's heads
                // (attention_gqa_qkl; BF16 cache, at most 16 splits, counters for SPLIT_ROWS rows).
                let last_merge = !cluster
                    && self.kset.gqa_lm
                    && aname == "attention_gqa_qk"
                    && (2..=16).contains(&nsplit)
                    && group <= 16
                    && hd <= 128
                    && m <= SPLIT_ROWS;
                // tc_lm: the same for the full layers' attention_tc_qk3 (16 splits, the group's
                // partials in 16-byte pieces within its shared memory).
                let tc_last = tc_qk
                    && self.kset.tc_lm
                    && aname == "attention_tc_qk3"
                    && nsplit == 16
                    && group <= 16
                    && (nsplit * (hd + 2)) % 4 == 0
                    && 4 * group * nsplit * (hd + 2) <= ATC_QK3_SMEM as usize
                    && m <= SPLIT_ROWS;
                let (aname, cz) = if cluster {
                    (cl_name, nsplit as u32)
                } else if last_merge {
                    ("attention_gqa_qkl", 0)
                } else if tc_last {
                    ("attention_tc_qk3l", 0)
                } else {
                    (aname, 0)
                };
                let ashm = cl_smem.unwrap_or_else(|| big_smem(aname).max(spread(aname)));
                d.launch_pc(prof, aname, agrid, (ablk, 1, 1), ashm, cz, |b| {
                    common(b);
                    b.i32(nsplit as i32).u64(sc.part);
                    if fuse_qk || tc_qk {
                        b.u64(kp).u64(vp).i32(ldkv as i32);
                        rope(b);
                        b.f32(1.0 / l.kscale).f32(1.0 / l.vscale);
                        if last_merge || tc_last {
                            b.u64(sc.att_cnt);
                        }
                    } else {
                        b.u64(if self.noncausal { sc.kend } else { 0 });
                    }
                })
                .map_err(cerr)?;
                if nsplit > 1 && !cluster && !last_merge && !tc_last {
                    let (k16, k64) = (self.kset.merge16, self.kset.merge64);
                    let mname = match (tc, nsplit > 16, self.kset.merge_r) {
                        (true, true, false) => "attention_merge_tc64",
                        (true, true, true) => "attention_merge_tc64r",
                        (true, false, false) => "attention_merge_tc",
                        (true, false, true) => "attention_merge_tcr",
                        (false, true, false) if k16 && k64 => "attention_merge_64",
                        (false, true, true) if k16 && k64 => "attention_merge_64r",
                        (false, _, false) if k16 => "attention_merge_16",
                        (false, _, true) if k16 => "attention_merge_16r",
                        _ => "attention_merge",
                    };
                    // The arguments both launches take after their first ones.
                    let merge_tail = |b: &mut device::Args| {
                        b.u64(l.sink)
                            .u64(gp)
                            .i32(ldg as i32)
                            .i32(gate_mode)
                            .u64(sc.pos)
                            .i32(l.window as i32)
                            .u64(if self.noncausal { sc.kend } else { 0 })
                            .f32(l.vscale);
                    };
                    // merge_o: the merge inside the o_proj GEMV's launch (linear_tc_bf16_tlndm,
                    // attention_merge_16r's / _tcr's code): one row, the GEMV `linear` would
                    // launch as linear_tc_bf16_tlnd, its grid one block an SM at most and at
                    // least a block a head (block h merges head h).
                    let oblocks = l.o.n.div_ceil(16);
                    let fused = if self.kset.merge_o
                        && m == 1
                        && matches!(mname, "attention_merge_16r" | "attention_merge_tcr")
                        && oblocks <= d.sms as usize
                        && nh <= oblocks
                        && nsplit <= 128
                        && l.o.k == qw
                    {
                        match self.tc_gemv(&l.o, m) {
                            ("linear_tc_bf16_tlnd", ow, osw) if hd <= 32 * osw as usize => {
                                Some((ow, osw))
                            }
                            _ => None,
                        }
                    } else {
                        None
                    };
                    if let Some((ow, osw)) = fused {
                        let ch = if tc { TC_CHUNK } else { ATT_CHUNK };
                        d.launch_p(
                            prof,
                            "linear_tc_bf16_tlndm",
                            (oblocks as u32, 1, 1),
                            (32 * osw, 1, 1),
                            0,
                            |b| {
                                ops::lin_args(b, &l.o, ow, sc.attn, qw, sc.x, h, m, true);
                                b.u64(sc.part)
                                    .i32(nsplit as i32)
                                    .i32(nh as i32)
                                    .i32(hd as i32);
                                merge_tail(b);
                                // gbar's second word (moe_block_1 uses the first).
                                b.u64(sc.gbar + 4).i32(ch as i32);
                            },
                        )
                        .map_err(cerr)?;
                        o_done = true;
                    } else {
                        d.launch_p(prof, mname, (m as u32, nh as u32, 1), (blk, 1, 1), 0, |b| {
                            b.u64(sc.part)
                                .i32(nsplit as i32)
                                .u64(sc.attn)
                                .i32(qw as i32)
                                .i32(nh as i32)
                                .i32(hd as i32);
                            merge_tail(b);
                        })
                        .map_err(cerr)?;
                    }
                }
            }
            if !o_done {
                self.linear(prof, "attn_proj", &l.o, sc.attn, qw, sc.x, h, m, true)?;
            }
            let next = self.layers.get(li + 1);
            if self.moe_block(prof, l, next, m, gemm_pass)? {
                // It also wrote the next layer's input norm into sc.hn.
                normed = next.is_some();
                if let Some(f) = after.as_mut() {
                    f(li)?;
                }
                continue;
            }
            match &l.mlp {
                MlpW::Dense { gate, up, down, gu } => {
                    // ffn makes the norm (norm_rows, or norm_fold's GEMV prologue).
                    let norm = Some(l.post_norm);
                    self.ffn(prof, gate, up, down, gu.as_ref(), norm, m, sc.x, true)?;
                }
                MlpW::Moe {
                    router,
                    bias,
                    experts,
                    shared,
                    folded,
                } => {
                    self.norm_rows(prof, l.post_norm, m, eps, gemm_pass)?;
                    let e = cfg.num_experts;
                    let k = cfg.top_k;
                    let kk = k + *folded as usize;
                    let ne = e + *folded as usize;
                    // One row: the router writes the expert groups itself (no moe_group launch).
                    let gemm = m >= self.opts.gemm_min_rows;
                    let direct = m == 1 && kk <= 32 && !gemm;
                    if self.fuse && direct && !router.fp4 && h * 4 <= 48 * 1024 {
                        // One launch: router GEMV + top-k + grouping (same arithmetic as the pair).
                        d.launch_p(
                            prof,
                            "router_fused_1",
                            (ceil_div(e, 16) as u32, 1, 1),
                            (256, 1, 1),
                            (h * 4) as u32,
                            |b| {
                                b.u64(router.w)
                                    .u64(sc.hn)
                                    .u64(sc.rlog)
                                    .i32(h as i32)
                                    .i32(e as i32)
                                    .u64(sc.rcount)
                                    .u64(*bias)
                                    .i32(k as i32)
                                    .f32(cfg.router_softcap as f32)
                                    .i32(cfg.norm_topk_prob as i32)
                                    .u64(sc.ids)
                                    .u64(sc.wts)
                                    .i32(*folded as i32)
                                    .f32((1.0 / cfg.routed_scaling_factor) as f32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta);
                            },
                        )
                        .map_err(cerr)?;
                    } else {
                        self.linear(prof, "router", router, sc.hn, h, sc.rlog, e, m, false)?;
                        d.launch_p(prof, "router_topk", (m as u32, 1, 1), (32, 1, 1), 0, |b| {
                            b.u64(sc.rlog)
                                .u64(*bias)
                                .i32(e as i32)
                                .i32(k as i32)
                                .f32(cfg.router_softcap as f32)
                                .i32(cfg.norm_topk_prob as i32)
                                .u64(sc.ids)
                                .u64(sc.wts)
                                .i32(*folded as i32)
                                .f32((1.0 / cfg.routed_scaling_factor) as f32);
                            if direct {
                                b.u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta);
                            } else {
                                b.u64(0).u64(0).u64(0).u64(0).u64(0);
                            }
                        })
                        .map_err(cerr)?;
                    }
                    let s = m * kk;
                    if !direct {
                        d.launch_p(
                            prof,
                            "moe_group",
                            (1, 1, 1),
                            (s.div_ceil(32).clamp(1, 32) as u32 * 32, 1, 1),
                            (8 * ne) as u32,
                            |b| {
                                b.u64(sc.ids)
                                    .i32(s as i32)
                                    .i32(ne as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(if gemm { sc.tiles } else { 0 })
                                    .i32(kk as i32)
                                    .i32(if *folded { e as i32 } else { -1 });
                            },
                        )
                        .map_err(cerr)?;
                    }
                    let groups = s.min(ne) as u32;
                    let im = cfg.moe_intermediate_size;
                    if gemm {
                        let max_tiles = (s / 64 + s.min(ne) + 1) as u32;
                        let wide = experts.down.fp4 && self.kset.moe_wide && !self.kset.bf16_moe;
                        let tn = if wide { 128 } else { 64 };
                        let skip = self.kset.moe_skip;
                        let skip16 = skip && self.kset.moe_skip16;
                        // SiLU fused into the gate/up epilogue: it writes the down GEMM's input
                        // split into sc.moe_gu (bf16 [s, im], lo at + s * im), not f32 gate | up.
                        let fused = experts.gate.fp4 && !self.kset.bf16_moe && self.kset.moe_silu;
                        let gu_name = match (experts.gate.fp4, self.kset.bf16_moe) {
                            (true, false) if fused && skip16 => "moe_gemm_gate_up_fp4_ks16",
                            (true, false) if fused => "moe_gemm_gate_up_fp4_ks",
                            (true, false) if skip => "moe_gemm_gate_up_fp4_k",
                            (true, false) => "moe_gemm_gate_up_fp4",
                            (false, false) => "moe_gemm_gate_up_bf16",
                            (true, true) => "moe_gemm_gate_up_fp4_h",
                            (false, true) => "moe_gemm_gate_up_bf16_h",
                        };
                        // sc.xs holds hn's hi/lo split: rmsnorm_split wrote it (or the router
                        // GEMM's split did) and nothing wrote xs since.
                        d.launch_p(
                            prof,
                            gu_name,
                            (ceil_div(2 * im, 64) as u32, max_tiles, 1),
                            (128, 1, 1),
                            0,
                            |b| {
                                b.u64(experts.gate.w)
                                    .u64(experts.gate.s)
                                    .u64(experts.gate.inv)
                                    .u64(experts.up.w)
                                    .u64(experts.up.s)
                                    .u64(experts.up.inv)
                                    .u64(sc.xs)
                                    .u64((m * h) as u64)
                                    .i32(h as i32)
                                    .i32(im as i32)
                                    .i32(kk as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(sc.tiles)
                                    .u64(sc.moe_gu);
                                if fused {
                                    b.u64((s * im) as u64);
                                }
                            },
                        )
                        .map_err(cerr)?;
                        let act = if fused {
                            sc.moe_gu
                        } else {
                            // SiLU(gate) * up straight into the BF16 split the down GEMM reads.
                            let lo = !self.kset.bf16_moe;
                            d.launch_p(
                                prof,
                                "silu_mul_split",
                                (ceil_div(im, 256) as u32, s.min(65535) as u32, 1),
                                (256, 1, 1),
                                0,
                                |b| {
                                    b.u64(sc.moe_gu)
                                        .u64(sc.xs)
                                        .i32(s as i32)
                                        .i32(im as i32)
                                        .i32(lo as i32);
                                },
                            )
                            .map_err(cerr)?;
                            sc.xs
                        };
                        let dn_name = match (experts.down.fp4, self.kset.bf16_moe) {
                            (true, false) if wide && skip16 => "moe_gemm_down_fp4_wk16",
                            (true, false) if wide && skip => "moe_gemm_down_fp4_wk",
                            (true, false) if wide => "moe_gemm_down_fp4_w",
                            (true, false) => "moe_gemm_down_fp4",
                            (false, false) => "moe_gemm_down_bf16",
                            (true, true) => "moe_gemm_down_fp4_h",
                            (false, true) => "moe_gemm_down_bf16_h",
                        };
                        d.launch_p(
                            prof,
                            dn_name,
                            (ceil_div(h, tn) as u32, max_tiles, 1),
                            (128, 1, 1),
                            0,
                            |b| {
                                b.u64(experts.down.w)
                                    .u64(experts.down.s)
                                    .u64(experts.down.inv)
                                    .u64(act)
                                    .u64((s * im) as u64)
                                    .i32(h as i32)
                                    .i32(im as i32)
                                    .u64(sc.grp_e)
                                    .u64(sc.grp_s)
                                    .u64(sc.grp_c)
                                    .u64(sc.perm)
                                    .u64(sc.meta)
                                    .u64(sc.tiles)
                                    .u64(sc.moe_out);
                            },
                        )
                        .map_err(cerr)?;
                    } else {
                        // Weight-streaming regime (decode, DFlash verify, any pass below
                        // gemm_min_rows). `moe_*_s`: persistent grouped kernels with the same
                        // per-slot arithmetic whatever the number of rows; otherwise one block row
                        // per group (`_1`: single-slot groups of a 1-row pass, activation staged).
                        // Both families take the same arguments.
                        let sp = self.kset.moe_sp
                            && experts.gate.fp4
                            && experts.down.fp4
                            && h % 16 == 0
                            && im % 16 == 0
                            && h <= 2048
                            && im <= 512;
                        let mut blk = 256;
                        // moe_tc: the rows' B fragments into sc.xs (free here: the router has
                        // run), then the tensor-core items (moe_block_1nprt's arithmetic).
                        let tc = sp && self.moe_tc_on(experts);
                        if tc {
                            d.launch_p(
                                prof,
                                "tc_bfrag_rows",
                                (m as u32, 1, 1),
                                (256, 1, 1),
                                0,
                                |b| {
                                    b.u64(sc.hn).u64(sc.xs);
                                },
                            )
                            .map_err(cerr)?;
                            self.xs_holds.set((0, false));
                        }
                        let (gu_name, gu_grid, gu_shm, dn_name, dn_grid, dn_shm) = if sp {
                            // One item per warp (4 warps a block): gate/up items are 2
                            // intermediate rows of a group, down items 8 output rows.
                            blk = 128;
                            let gb = ceil_div(groups as usize * im / 2, 4) as u32;
                            let db = ceil_div(groups as usize * h / 8, 4) as u32;
                            let (gu, dn) = if tc {
                                ("moe_gate_up_fp4_tc", "moe_down_fp4_tc")
                            } else if self.kset.sp_na {
                                ("moe_gate_up_fp4_spn", "moe_down_fp4_spn")
                            } else {
                                ("moe_gate_up_fp4_sp", "moe_down_fp4_sp")
                            };
                            (gu, (gb.max(1), 1, 1), 0, dn, (db.max(1), 1, 1), 0)
                        } else if self.kset.moe_s && h % 16 == 0 && im % 16 == 0 {
                            let gb = (d.sms * 2).min(ceil_div(s * im / 2, 8) as u32).max(1);
                            let db = (d.sms * 2).min(ceil_div(s * h / 4, 8) as u32).max(1);
                            let (g, dn) = if experts.gate.fp4 {
                                ("moe_gate_up_fp4_s", "moe_down_fp4_s")
                            } else {
                                ("moe_gate_up_bf16_s", "moe_down_bf16_s")
                            };
                            (g, (gb, 1, 1), 0, dn, (db, 1, 1), 0)
                        } else {
                            let one = m == 1 && h * 4 <= 48 * 1024 && im * 4 <= 48 * 1024;
                            let g = match (experts.gate.fp4, one) {
                                (true, false) => "moe_gate_up_fp4",
                                (false, false) => "moe_gate_up_bf16",
                                (true, true) => "moe_gate_up_fp4_1",
                                (false, true) => "moe_gate_up_bf16_1",
                            };
                            let dn = match (experts.down.fp4, one) {
                                (true, false) => "moe_down_fp4",
                                (false, false) => "moe_down_bf16",
                                (true, true) => "moe_down_fp4_1",
                                (false, true) => "moe_down_bf16_1",
                            };
                            let (gs, ds) = if one {
                                ((h * 4) as u32, (im * 4) as u32)
                            } else {
                                (0, 0)
                            };
                            (
                                g,
                                (ceil_div(im, 8) as u32, groups, 1),
                                gs,
                                dn,
                                (ceil_div(h, 8) as u32, groups, 1),
                                ds,
                            )
                        };
                        d.launch_p(prof, gu_name, gu_grid, (blk, 1, 1), gu_shm, |b| {
                            b.u64(experts.gate.w)
                                .u64(experts.gate.s)
                                .u64(experts.gate.inv)
                                .u64(experts.up.w)
                                .u64(experts.up.s)
                                .u64(experts.up.inv)
                                .u64(if tc { sc.xs } else { sc.hn })
                                .i32(h as i32)
                                .i32(im as i32)
                                .i32(kk as i32)
                                .u64(sc.grp_e)
                                .u64(sc.grp_s)
                                .u64(sc.grp_c)
                                .u64(sc.perm)
                                .u64(sc.meta)
                                .u64(sc.moe_act);
                        })
                        .map_err(cerr)?;
                        d.launch_p(prof, dn_name, dn_grid, (blk, 1, 1), dn_shm, |b| {
                            b.u64(experts.down.w)
                                .u64(experts.down.s)
                                .u64(experts.down.inv)
                                .u64(sc.moe_act)
                                .i32(h as i32)
                                .i32(im as i32)
                                .u64(sc.grp_e)
                                .u64(sc.grp_s)
                                .u64(sc.grp_c)
                                .u64(sc.perm)
                                .u64(sc.meta)
                                .u64(sc.moe_out);
                        })
                        .map_err(cerr)?;
                    }
                    let sh = if let Some((a, b2, c)) = shared {
                        self.ffn(prof, a, b2, c, None, None, m, sc.shared_out, false)?;
                        sc.shared_out
                    } else {
                        0
                    };
                    // Combine + the next layer's input norm in one launch: opt-in for decode
                    // (slower there: one block does a row's whole norm), always in long passes,
                    // where it also writes the split the next projection GEMM reads.
                    let fuse_norm = self.fuse || (gemm && self.kset.comb_norm);
                    if let Some(next) = self.layers.get(li + 1).filter(|_| fuse_norm) {
                        let blk = ops::norm_block(h);
                        d.launch_p(
                            prof,
                            "moe_combine_norm",
                            (m as u32, 1, 1),
                            (blk, 1, 1),
                            0,
                            |b| {
                                b.u64(sc.x)
                                    .u64(sc.moe_out)
                                    .u64(sc.wts)
                                    .u64(sh)
                                    .i32(h as i32)
                                    .i32(kk as i32)
                                    .f32(cfg.routed_scaling_factor as f32)
                                    .u64(next.input_norm)
                                    .u64(sc.hn)
                                    .f32(eps)
                                    .u64(if gemm { sc.xs } else { 0 });
                            },
                        )
                        .map_err(cerr)?;
                        self.xs_holds
                            .set(if gemm { (sc.hn, true) } else { (0, false) });
                        normed = true;
                    } else {
                        d.launch_p(
                            prof,
                            "moe_combine",
                            (ceil_div(h, 256) as u32, m as u32, 1),
                            (256, 1, 1),
                            0,
                            |b| {
                                b.u64(sc.x)
                                    .u64(sc.moe_out)
                                    .u64(sc.wts)
                                    .u64(sh)
                                    .i32(h as i32)
                                    .i32(kk as i32)
                                    .f32(cfg.routed_scaling_factor as f32);
                            },
                        )
                        .map_err(cerr)?;
                    }
                }
            }
            if let Some(f) = after.as_mut() {
                f(li)?;
            }
        }
        Ok(())
    }

    /// Whether the MoE expert dot products take the tensor-core form (KernelSet `moe_tc`): in the
    /// one-row launch (`moe_block_1npt` / `_1nprt`) and in the multi-row items
    /// (`moe_*_fp4_tc`) together or in neither, so that a row verified or decoded with others
    /// keeps the bits it has decoded alone. Needs NVFP4 experts at H 2048 and I 512 and the
    /// families both forms build on.
    pub(super) fn moe_tc_on(&self, experts: &Experts) -> bool {
        let k = &self.kset;
        k.moe_tc
            && k.moe_mk
            && k.moe_dl
            && k.moe_x
            && k.moe_na
            && k.moe_poll
            && k.moe_sp
            && experts.gate.fp4
            && experts.up.fp4
            && experts.down.fp4
            && self.cfg.hidden_size == 2048
            && self.cfg.moe_intermediate_size == 512
    }

    /// The MoE half of a one-row pass (post-attention norm, router, top-k, experts, combine into
    /// sc.x, then `next`'s input norm into sc.hn) as one `moe_block_1` launch when the family is
    /// on and the layer fits it: NVFP4 experts, a BF16 router, the shared expert folded into the
    /// stacks or absent. Returns whether it ran; the caller then skips the norm and the MoE
    /// launches of the layer, and the input norm of the next.
    fn moe_block(
        &self,
        prof: &mut Option<device::Prof>,
        l: &LayerW,
        next: Option<&LayerW>,
        m: usize,
        gemm: bool,
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
        let fp4 = experts.gate.fp4 && experts.up.fp4 && experts.down.fp4;
        if !self.kset.moe_mk
            || self.mk_grid == 0
            || m != 1
            || gemm
            || self.fuse
            || router.fp4
            || shared.is_some()
            || !fp4
        {
            return Ok(false);
        }
        let cfg = &self.cfg;
        let sc = &self.sc;
        let h = cfg.hidden_size;
        self.xs_holds.set((0, false));
        // The norm it ends with: the next layer's input norm into hn, or after the last layer
        // (mk_final) the final norm of row 0 (the only row, so sc.sel's) into hsel, where
        // final_logits would write it (rmsnorm's arithmetic either way).
        let (norm_w, norm_out) = match next {
            Some(n) => (n.input_norm, sc.hn),
            None if self.kset.mk_final => {
                self.final_normed.set(true);
                (self.final_norm, sc.hsel)
            }
            None => (0, sc.hn),
        };
        let poll = self.kset.moe_dl && self.kset.moe_x && self.kset.moe_na && self.kset.moe_poll;
        self.dev
            .launch_p(
                prof,
                match (self.kset.moe_dl, self.kset.moe_x) {
                    // (A warp holds one router row pair: E <= 2 x the grid's warps.)
                    _ if poll
                        && self.kset.moe_rp
                        && cfg.num_experts <= 2 * (self.mk_grid * load::MK_BLOCK / 32) as usize =>
                    {
                        if self.moe_tc_on(experts) {
                            match (self.kset.moe_dep, self.kset.moe_gi) {
                                (false, false) if self.kset.moe_pwr && self.kset.moe_shpf => {
                                    "moe_block_1nprtxs"
                                }
                                (false, false) if self.kset.moe_pwr => "moe_block_1nprtx",
                                (true, true) => "moe_block_1nprtdg",
                                (true, false) => "moe_block_1nprtd",
                                (false, true) => "moe_block_1nprtg",
                                (false, false) => "moe_block_1nprt",
                            }
                        } else {
                            "moe_block_1npr"
                        }
                    }
                    _ if poll && self.moe_tc_on(experts) => "moe_block_1npt",
                    _ if poll => "moe_block_1np",
                    (true, true) if self.kset.moe_na => "moe_block_1n",
                    (true, true) => "moe_block_1",
                    (true, false) => "moe_block_1w",
                    _ => "moe_block_1g",
                },
                (self.mk_grid, 1, 1),
                (load::MK_BLOCK, 1, 1),
                self.mk_smem,
                |b| {
                    b.u64(sc.x)
                        .u64(l.post_norm)
                        .f32(cfg.rms_norm_eps as f32)
                        .i32(ops::norm_block(h) as i32)
                        .u64(router.w)
                        .u64(if poll { sc.rlog_mk } else { sc.rlog })
                        .u64(*bias)
                        .i32(cfg.num_experts as i32)
                        .i32(cfg.top_k as i32)
                        .f32(cfg.router_softcap as f32)
                        .i32(cfg.norm_topk_prob as i32)
                        .i32(*folded as i32)
                        .f32((1.0 / cfg.routed_scaling_factor) as f32)
                        .u64(experts.gate.w)
                        .u64(experts.gate.s)
                        .u64(experts.gate.inv)
                        .u64(experts.up.w)
                        .u64(experts.up.s)
                        .u64(experts.up.inv)
                        .u64(experts.down.w)
                        .u64(experts.down.s)
                        .u64(experts.down.inv)
                        .i32(h as i32)
                        .i32(cfg.moe_intermediate_size as i32)
                        .u64(sc.moe_act)
                        .u64(sc.moe_out)
                        .u64(sc.ids)
                        .u64(sc.wts)
                        .f32(cfg.routed_scaling_factor as f32)
                        .u64(sc.gbar)
                        .u64(norm_w)
                        .u64(norm_out)
                        .u64(0)
                        .i32(self.mk_stag);
                },
            )
            .map_err(cerr)?;
        Ok(true)
    }

    /// Cache addressing and kernel names of a layer: its ring (page size 1, R slots per table
    /// row) or the paged pool; BF16 or FP8 kernels.
    pub(super) fn kv_args(&self, l: &LayerW) -> KvArgs {
        let fp8 = self.kv_elt == 1;
        let (bt, max_pages, page_size) = if l.ring {
            (self.sc.bt_ring, self.ring, 1)
        } else {
            (self.sc.bt, self.max_pages, self.page_size)
        };
        KvArgs {
            bt,
            max_pages,
            page_size,
            qk_name: match (fp8, self.kset.qk_ld) {
                (true, false) => "qk_norm_rope_kv_fp8",
                (false, false) => "qk_norm_rope_kv",
                (true, true) => "qk_norm_rope_kv_fp8_l",
                (false, true) => "qk_norm_rope_kv_l",
            },
            attn_name: if fp8 { "attention_fp8" } else { "attention" },
            tc_name: if fp8 {
                "attention_tc_fp8"
            } else {
                "attention_tc"
            },
            tc_qk_name: if fp8 {
                "attention_tc_qk_fp8"
            } else {
                "attention_tc_qk"
            },
            // tc_pre / gqa_pre: the forms with the shorter chain before the wait (BF16 cache).
            tc_qk3_name: (!fp8).then_some(if self.kset.tc_pre {
                "attention_tc_qk3p"
            } else {
                "attention_tc_qk3"
            }),
            gqa_qk_name: match (fp8, self.kset.gqa_pre) {
                (true, _) => "attention_gqa_qk_fp8",
                (false, true) => "attention_gqa_qkp",
                (false, false) => "attention_gqa_qk",
            },

            gqa_name: match (fp8, self.kset.gqa_ld) {
                (true, false) => "attention_gqa_fp8",
                (false, false) => "attention_gqa",
                (true, true) => "attention_gqa_fp8_l",
                (false, true) => "attention_gqa_l",
            },
            prefill_name: if fp8 {
                "attention_prefill_fp8"
            } else {
                "attention_prefill"
            },
        }
    }
}
