// MoE: a one-row layer's whole MoE half in one launch (`moe_decode_fused[_tc]`). It runs the
// items of router.cu, experts_warp.cu and experts_tc.cu, which come before it in the program.

// ---- moe_decode_fused[_tc] (one row, decode): a layer's whole MoE half in one launch ----------
// Post-attention RMSNorm, router GEMV, top-k, expert gate/up + SiLU, down, the combine into the
// residual and (next_w set) the next layer's input RMSNorm, as one persistent grid with one
// grid-wide barrier (two with next_w) instead of six (seven) launches (rmsnorm, linear_bf16_1,
// router_topk, moe_gate_up_fp4_warp, moe_down_fp4_warp, moe_combine, rmsnorm). Every value is
// computed with the arithmetic of those kernels, in the same order, so the results are the same
// bits: the norm reproduces rmsnorm's reduction over NB = norm_block(H) threads whatever this
// block's size, the router GEMV is linear_bf16_1's row_dot2, top-k is router_topk_row (run by
// every block on the shared logits), and gate/up / down are moe_*_fp4_warp's items (the same
// sp_*_load / sp_*_slot helpers; _tc: moe_*_fp4_tc's).
// The host launches one block of 640 threads an SM so that every block is resident (grid_sync
// spins; a barrier that waits over 2 s traps instead of hanging), and
// launches it only for one row with NVFP4 experts, a BF16 router, no unfolded shared expert,
// H <= 2048, I <= 512, KK <= 32 and E <= 256. Dynamic shared memory: (H + KK * I) floats.
// `bar` is one word, 0 before the first launch; grid_sync leaves its low 31 bits unchanged.

// (emu_ns, ld_acquire_u32 and grid_sync: common.cuh.)
// grid_sync, with tp: the last arrival at and the last departure from barrier i recorded.
// mk_arrive: that arrival stamp alone (the logits' poll has no barrier).
__device__ __forceinline__ void mk_arrive(unsigned long long* tp, int i) {
    if (tp) {
        __syncthreads();
        if (threadIdx.x == 0) atomicMax(tp + 2 * i + 1, emu_ns());
    }
}
__device__ __forceinline__ void mk_sync(unsigned* bar, unsigned& phase, unsigned long long* tp, int i) {
    mk_arrive(tp, i);
    grid_sync(bar, phase);
    if (tp && threadIdx.x == 0) atomicMax(tp + 2 * i + 2, emu_ns());
}
// Block-strided: p[0..n) = MK_UNSET (the polled logits back to unset for the next launch).
__device__ __forceinline__ void mk_unset(float* p, int n) {
    for (int q = threadIdx.x; q < n; q += blockDim.x) p[q] = __uint_as_float(MK_UNSET);
}
// (rms_inv_nb: common.cuh.)
#define MOE_BLOCK_PARAMS                                                                                             \
    float *x, const float *post_w, float eps, int NB, const void *rw, float *rlog, const float *bias, int E, int K, \
        float softcap, int norm_topk, int shared_slot, float inv_scale, const void *gw, const u8 *gs,               \
        const float *ginv, const void *uw, const u8 *us, const float *uinv, const void *dw, const u8 *ds,           \
        const float *dinv, int H, int I, float *act, float *out, int *ids_out, float *wts_out, float scale,         \
        unsigned *bar, const float *next_w, float *hn_out, unsigned long long *tp, int stag
#define MOE_BLOCK_ARGS                                                                                                 \
    x, post_w, eps, NB, rw, rlog, bias, E, K, softcap, norm_topk, shared_slot, inv_scale, gw, gs, ginv, uw, us, uinv, \
        dw, ds, dinv, H, I, act, out, ids_out, wts_out, scale, bar, next_w, hn_out, tp, stag
// No grid barrier between the router GEMV and the top-k: every block reads the logits until none
// holds MK_UNSET (router_topk_regs<POLL>), so the logits' read is the wait. `rlog` is the launch's
// own buffer, MK_UNSET everywhere before the launch (the host sets it once): block 0 puts
// MK_UNSET back after the gate/up barrier, which every block reaches after its top-k, so the next
// launch finds it unset.
// A router warp's two rows are loaded into registers before the PDL wait, so phase 1 is the
// residual's round trip and the norm, then the dot products on registers. The same products and
// sums in the same order as row_dot2 / row_dot (the host launches it only with E <= 2 x the
// grid's warps, so a warp has at most one pair, and H <= 2048).
// TC (moe_decode_fused_tc; H 2048, I 512): the gate/up and down items' dot products on tensor
// cores (tcg_* / tcd_*): phase 1 also writes the normed row's B fragments into sact (free until
// phase 3), the gate/up items write SiLU(gate) * up as the down's B fragments into `act` (the
// same bytes as its f32 rows), which phase 3 stages as before. The same per-row arithmetic as
// moe_tc_bfrag_rows + moe_gate_up_fp4_tc + moe_down_fp4_tc, so the same bits as those launches
// (kernels/emu, laguna-dev kbench).
// PW (moe_decode_fused_tc): the small weights of the prologue (post-attention norm, router bias,
// next input norm) loaded together into registers and kept there across the PDL wait, instead of
// each a load and then a shared store in a loop (a thread's up to six dependent round trips
// before its wait, which a block that only becomes resident when the o_proj GEMV's last blocks
// leave runs after that GEMV has ended). The norm weights multiply from the registers (the same
// product as from hn) and the bias and next-norm weight are stored after the residual's loads,
// so their round trip overlaps the residual's. The same values, the same arithmetic: the same
// bits (kernels/emu, the XS-2.1 DFlash pair).
// SPF (moe_decode_fused_tc): the folded shared expert (expert E, slot K of every row) is the one
// expert whose weights do not depend on the routing, yet its gate/up and down items are loaded
// from DRAM in the same phases as the routed ones, where the DRAM is the bound, while during
// phase 1 and the logits' poll it carries little more than the residual's round trip. So every
// block asks L2 for a share of the shared expert's six ranges (gate / up / down codes, their
// scale bytes: 1.7 MB for XS-2.1), one 128-byte line a thread, the last warps first, right after
// the PDL wait. Its items then read L2, and the DRAM delivers eight slots in the critical phases
// instead of nine. Timing only: the same loads and arithmetic, so the same bits (prefetch_l2 is
// no instruction in kernels/emu).
__device__ __forceinline__ void mk_shared_prefetch(const void* gw, const u8* gs, const void* uw, const u8* us,
                                                   const void* dw, const u8* ds, int e, int H, int I) {
    size_t cb = (size_t)I * H / 2, sb = (size_t)I * H / 16;  // one matrix's code and scale bytes
    int nc = (int)((cb + 127) >> 7), ns = (int)((sb + 127) >> 7), total = 3 * nc + 3 * ns;
    int n = gridDim.x * blockDim.x;
    for (int l = (blockDim.x - 1 - threadIdx.x) * gridDim.x + blockIdx.x; l < total; l += n) {
        const void* b;
        size_t o;
        if (l < 3 * nc) {
            int r = l / nc;
            b = r == 0 ? gw : r == 1 ? uw : dw;
            o = (size_t)e * cb + ((size_t)(l - r * nc) << 7);
        } else {
            int q = l - 3 * nc, r = q / ns;
            b = r == 0 ? (const void*)gs : r == 1 ? (const void*)us : (const void*)ds;
            o = (size_t)e * sb + ((size_t)(q - r * ns) << 7);
        }
        prefetch_l2(reinterpret_cast<const u8*>(b) + o);
    }
}
template <bool TC, bool PW, bool SPF>
__device__ __forceinline__ void moe_decode_fused_t(MOE_BLOCK_PARAMS) {
    int lane = threadIdx.x & 31;
    int nwarps = gridDim.x * (blockDim.x >> 5);
    // Work is dealt to warps in the order that takes one warp from every block before a second
    // from any (swarp), so it spreads over all SMs. Router rows: pair n / 2 goes to warp n / 2.
    // The weights do not depend on the previous launch, so their lines are asked into L2 before
    // waiting for it.
    int swarp = (threadIdx.x >> 5) * gridDim.x + blockIdx.x;
    // Lane l's 16-column blocks l + 32 j (j < 4: H <= 2048) of rows 2 swarp and 2 swarp + 1.
    uint4 rpa[4][2], rpb[4][2];
    if (2 * swarp < E) {
        const bf16_t* ra = reinterpret_cast<const bf16_t*>(rw) + (size_t)2 * swarp * H;
        const bf16_t* rb = 2 * swarp + 1 < E ? ra + H : ra;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int b = min(lane + 32 * j, (H >> 4) - 1);
            const uint4* pa = reinterpret_cast<const uint4*>(ra + (size_t)b * 16);
            const uint4* pb = reinterpret_cast<const uint4*>(rb + (size_t)b * 16);
            rpa[j][0] = __ldg(pa);
            rpa[j][1] = __ldg(pa + 1);
            rpb[j][0] = __ldg(pb);
            rpb[j][1] = __ldg(pb + 1);
        }
    }
    // The layer's small weights (post-attention norm, router bias, next input norm) are evicted
    // from L2 by the step's weight stream, so each would be a DRAM round trip inside a phase's
    // chain: they are read here, before the wait, into shared memory (the norm weight into hn,
    // which phase 1 then scales in place by the same thread: the same product).
    extern __shared__ float smem[];
    float* hn = smem;      // [H] the normed row
    float* sact = smem + H;  // [KK * I] SiLU(gate) * up of every slot (phase 3)
    __shared__ float s_bias[256];
    __shared__ float s_nw[1024];
    // PW: a thread's norm weights i = threadIdx.x + j * blockDim.x, j < PWN (the host's 640
    // threads and H <= 2048 need 4; any further ones, and biases past blockDim.x, by the loops).
    constexpr int PWN = 4;
    float pw[PWN], pb = 0.f, pn = 0.f;
    int pi0 = blockIdx.x * blockDim.x + threadIdx.x;
    if (PW) {
#pragma unroll
        for (int j = 0; j < PWN; j++) {
            int i = threadIdx.x + j * blockDim.x;
            pw[j] = i < H ? post_w[i] : 0.f;
        }
        if ((int)threadIdx.x < E) pb = bias[threadIdx.x];
        if (next_w && pi0 < H) pn = next_w[pi0];
    }
    // (PW: only the values past those in registers.)
    for (int i = threadIdx.x + (PW ? PWN * blockDim.x : 0); i < H; i += blockDim.x) hn[i] = post_w[i];
    for (int e = threadIdx.x + (PW ? blockDim.x : 0); e < E; e += blockDim.x) s_bias[e] = bias[e];
    if (!PW && next_w && pi0 < H) s_nw[threadIdx.x] = next_w[pi0];
    pdl_wait();
    // Every block is resident once all have passed this point (the launch needs all of them to
    // trigger), so a dependent launch cannot take the resources of a block still to start.
    pdl_launch();
    STAMP();
    // tp (laguna-dev kbench; 0 in the engine): [0] earliest block start, [2i+1] last arrival at
    // barrier i, [2i+2] last departure from it, [9] last block end, [10] top-k done in every
    // block (globaltimer ns).
    if (tp && threadIdx.x == 0) atomicMin(tp, emu_ns());
    if (SPF && shared_slot) mk_shared_prefetch(gw, gs, uw, us, dw, ds, E, H, I);
    // The barrier word's phase bit (thread 0's, in shared memory to spare a register; the load
    // overlaps the norm below).
    __shared__ unsigned gphase;
    if (threadIdx.x == 0) gphase = ld_acquire_u32(bar) & 0x80000000u;
    __shared__ float sh[33];
    __shared__ int s_ids[32];
    __shared__ float s_wts[32];
    int KK = K + shared_slot;
    // 1. RMSNorm of the residual row (every block), router logits (2 rows a warp, linear_bf16_1).
    float inv = rms_inv_nb<false>(x, H, NB, eps, sh);
    if (PW) {
        // (s_nw is read by this thread only, s_bias by top-k after the barrier below.)
        if ((int)threadIdx.x < E) s_bias[threadIdx.x] = pb;
        if (next_w && pi0 < H) s_nw[threadIdx.x] = pn;
#pragma unroll
        for (int j = 0; j < PWN; j++) {
            int i = threadIdx.x + j * blockDim.x;
            if (i < H) {
                float v = pw[j] * (x[i] * inv);
                hn[i] = v;
                if (TC) tcg_put(reinterpret_cast<u16*>(sact), i, v);
            }
        }
    }
    for (int i = threadIdx.x + (PW ? PWN * blockDim.x : 0); i < H; i += blockDim.x) {
        float v = hn[i] * (x[i] * inv);
        hn[i] = v;
        if (TC) tcg_put(reinterpret_cast<u16*>(sact), i, v);
    }
    __syncthreads();
    {
        int n = 2 * swarp;
        if (n < E) {
            // dot16_bf16's products and sums on the registers, blocks in row_dot2's order.
            float a = 0.f, b2 = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int b = lane + 32 * j;
                if (b < (H >> 4)) {
                    a += dot16_bf16_w(rpa[j][0], rpa[j][1], hn + b * 16);
                    b2 += dot16_bf16_w(rpb[j][0], rpb[j][1], hn + b * 16);
                }
            }
            a = warp_sum(a);
            b2 = warp_sum(b2);
            // Relaxed GPU-scope stores, which the other blocks' relaxed loads may observe.
            if (lane == 0) st_w<true>(rlog + n, a);
            if (lane == 1 && n + 1 < E) st_w<true>(rlog + n + 1, b2);
        }
    }
    // (kbench's barrier 0 stamps are this block's arrival and its logits complete.)
    mk_arrive(tp, 0);
    // 2. Top-k (every block, on the logits in L2), then gate/up items: (slot, 2 rows), one a warp.
    if (threadIdx.x < 32)
        router_topk_row<8, true>(0, rlog, s_bias, E, K, softcap, norm_topk, s_ids, s_wts, shared_slot, inv_scale, nullptr,
                        nullptr, nullptr, nullptr, nullptr);
    if (tp && threadIdx.x == 0) atomicMax(tp + 2, emu_ns());
    __syncthreads();
    if (tp && threadIdx.x == 0) atomicMax(tp + 10, emu_ns());
    if (blockIdx.x == 0 && threadIdx.x < KK) {
        ids_out[threadIdx.x] = s_ids[threadIdx.x];
        wts_out[threadIdx.x] = s_wts[threadIdx.x];
    }
    // (By swarp: the XS shape's 2,304 items spread over all 132 SMs, 17-18 each, instead of
    // filling 116 SMs' 20 warps and leaving 16 idle.)
    // stag > 0: warp w of a block issues its item's loads w * stag ns after warp 0 (items are
    // dealt in warp order, so in item order), so that the DRAM returns whole items in turn and
    // their dot products run while later items' bytes arrive, instead of every item's last bytes
    // arriving at the end of the phase (timing only: the same loads and arithmetic).
    if (stag > 0 && (threadIdx.x >> 5) > 0) __nanosleep((unsigned)stag * (threadIdx.x >> 5));
    {
        int per = I >> 1;
        for (int it = swarp; it < KK * per; it += nwarps) {
            int g = it / per, i = (it - g * per) * 2;
            int e = s_ids[g];
            float gi = ginv[e], ui = uinv[e];
            if (TC) {
                uint4 tw[8];
                uint2 ts[2];
                tcg_load(gw, gs, uw, us, e, i, lane, tw, ts);
                float c[4];
                tcg_dot(tw, ts, reinterpret_cast<const uint2*>(sact), lane, c);
                tcg_out(c, lane, gi, ui, reinterpret_cast<u16*>(act + (size_t)g * I), nullptr, i);
            } else {
                uint2 cw[4][4];
                u32 sc[4][4];
                sp_gu_load(gw, gs, uw, us, e, i, H, I, lane, cw, sc);
                sp_gu_slot<false>(hn, cw, sc, H, lane, gi, ui, act + (size_t)g * I, i);
            }
        }
    }
    // Down items (slot, 8 output rows): block b owns the row groups [gb0, gb1) (H / 8 groups dealt
    // gpb a block) and computes every slot's items of them, chunks of at most cg groups whose
    // outputs fit s_dn, so it combines its rows itself after a block barrier instead of a grid
    // barrier (item i of a chunk: slot i % KK, group i / KK; a warp takes i = its index, + warps a
    // block).
    // The down weights of this warp's first item depend only on the routing: loaded before the
    // barrier, so their latency overlaps it and the staging of the activations.
    __shared__ float s_dn[1024];
    int wib = threadIdx.x >> 5, nwb = blockDim.x >> 5;
    int ngr = H >> 3, gpb = (ngr + (int)gridDim.x - 1) / (int)gridDim.x;
    int gb0 = min((int)blockIdx.x * gpb, ngr), gb1 = min(gb0 + gpb, ngr);
    int cg = 1024 / (8 * KK);
    uint2 dcw[2][4];
    u32 dsc[2][4];
    uint4 tdw[4];
    u32 tds[2];
    float ddi = 0.f;
    if (wib < KK * min(cg, gb1 - gb0)) {
        int g = wib % KK, n = (gb0 + wib / KK) * 8;
        ddi = dinv[s_ids[g]];
        if (TC)
            tcd_load(dw, ds, s_ids[g], n, lane, tdw, tds);
        else
            sp_dn_load(dw, ds, s_ids[g], n, H, I, lane, dcw, dsc);
    }
    mk_sync(bar, gphase, tp, 1);
    if (blockIdx.x == 0) mk_unset(rlog, E);
    // 3. Down items on the activations staged in shared memory.
    // (KK * I is a multiple of 16: float4 loads, two a thread in flight.)
    {
        const float4* a4 = reinterpret_cast<const float4*>(act);
        float4* s4 = reinterpret_cast<float4*>(sact);
        int n4 = (KK * I) >> 2;
        for (int i0 = threadIdx.x; i0 < n4; i0 += 2 * blockDim.x) {
            int i1 = i0 + blockDim.x;
            float4 v0 = __ldcg(a4 + i0);
            float4 v1 = i1 < n4 ? __ldcg(a4 + i1) : make_float4(0.f, 0.f, 0.f, 0.f);
            s4[i0] = v0;
            if (i1 < n4) s4[i1] = v1;
        }
    }
    // The residual of this thread's first combine row, loaded with the activations.
    float xr0 = (int)threadIdx.x < min(cg, gb1 - gb0) * 8 ? x[gb0 * 8 + threadIdx.x] : 0.f;
    __syncthreads();
    for (int c0 = gb0; c0 < gb1; c0 += cg) {
        int nc = min(cg, gb1 - c0), rows = nc * 8;
        for (int it = wib; it < KK * nc; it += nwb) {
            int g = it % KK, nl = (it / KK) * 8;
            if (!(c0 == gb0 && it == wib)) {
                ddi = dinv[s_ids[g]];
                if (TC)
                    tcd_load(dw, ds, s_ids[g], c0 * 8 + nl, lane, tdw, tds);
                else
                    sp_dn_load(dw, ds, s_ids[g], c0 * 8 + nl, H, I, lane, dcw, dsc);
            }
            if (TC) {
                float c[4];
                tcd_dot(tdw, tds, reinterpret_cast<const uint2*>(sact + (size_t)g * I), lane, c);
                float y = tcd_sum(c, lane);
                if ((lane & 3) == 0) s_dn[g * rows + nl + (lane >> 2)] = y * TC_UNSCALE * ddi;
            } else {
                sp_dn_slot<false>(sact + (size_t)g * I, dcw, dsc, I, lane, ddi, s_dn + g * rows, nl);
            }
        }
        __syncthreads();
        if (tp && c0 == gb0 && threadIdx.x == 0) {
            unsigned long long t = emu_ns();
            atomicMax(tp + 5, t);
            atomicMax(tp + 6, t);
        }
        // 4. Combine into the residual (moe_combine's arithmetic; the shared expert is slot
        // K), and the per-slot outputs to `out` as moe_down_fp4_warp leaves them.
        for (int r = threadIdx.x; r < rows; r += blockDim.x) {
            int n = c0 * 8 + r;
            float a = 0.f;
            for (int k = 0; k < KK; k++) a = fmaf(s_wts[k], s_dn[k * rows + r], a);
            // __fmul_rn: not contracted into an FMA with the add (moe_combine's PTX has the
            // mul and the add apart, so the same bits).
            a = __fmul_rn(a, scale);
            x[n] = (c0 == gb0 && r == (int)threadIdx.x ? xr0 : x[n]) + a;
        }
        for (int q = threadIdx.x; q < KK * rows; q += blockDim.x) {
            int k = q / rows, r = q - k * rows;
            out[(size_t)k * H + c0 * 8 + r] = s_dn[q];
        }
        __syncthreads();
    }
    if (tp && gb0 >= gb1 && threadIdx.x == 0) {
        unsigned long long t = emu_ns();
        atomicMax(tp + 5, t);
        atomicMax(tp + 6, t);
    }
    // 5. With next_w: the next layer's input RMSNorm of the updated row into hn_out (rmsnorm's
    // arithmetic again), so that layer starts with its projections.
    if (next_w) {
        // Only the blocks holding output elements wait for the last barrier; the others arrive
        // and exit, so the next launch's blocks (the q|k|v|g GEMV, whose first weight loads come
        // before its PDL wait) take their SMs while the norm runs.
        if ((int)(blockIdx.x * blockDim.x) >= H) {
            if (tp) {
                __syncthreads();
                if (threadIdx.x == 0) atomicMax(tp + 7, emu_ns());
            }
            grid_arrive(bar);
            return;
        }
        mk_sync(bar, gphase, tp, 3);
        // This thread's first output element: its residual loaded with the norm's (one L2 round
        // trip, not two), its weight from s_nw.
        int i0 = blockIdx.x * blockDim.x + threadIdx.x;
        float xo = i0 < H ? __ldcg(x + i0) : 0.f;
        float inv2 = rms_inv_nb<true>(x, H, NB, eps, sh);
        for (int i = i0; i < H; i += gridDim.x * blockDim.x)
            hn_out[i] = (i == i0 ? s_nw[threadIdx.x] : next_w[i]) * ((i == i0 ? xo : __ldcg(x + i)) * inv2);
    }
    if (tp) {
        __syncthreads();
        if (threadIdx.x == 0) atomicMax(tp + 9, emu_ns());
    }
}
extern "C" __global__ __launch_bounds__(640, 1) void moe_decode_fused(MOE_BLOCK_PARAMS) {
    moe_decode_fused_t<false, false, false>(MOE_BLOCK_ARGS);
}
extern "C" __global__ __launch_bounds__(640, 1) void moe_decode_fused_tc(MOE_BLOCK_PARAMS) {
    moe_decode_fused_t<true, true, true>(MOE_BLOCK_ARGS);
}
