// MoE: NVFP4 expert items on tensor cores (`moe_*_fp4_tc`, `moe_tc_bfrag_rows`).

// ---- an item's expert dot products on tensor cores (H 2048, I 512) ---------------------------
// The f32 items above spend ~4 instructions a code (decode to f32, FMA: the gate/up and down
// phases issue-bound). Here mma.sync m16n8k16 (f16 in, f32 accumulate) takes the
// products. A's 16 rows are (weight row, K segment) pairs: every code decoded to f16 by the E4M3
// trick (e2m1 * 2^-6, exact) and multiplied by its block's E4M3 scale as f16 (mul.rn.f16x2: the
// product has at most 6 significant bits and lies in [2^-16, 42], so it is exact). B's columns
// are the activation row's segments as f16 hi and lo of x * 2^-4 (TC_XS; ~22 significant bits;
// |x| must stay below 2^20, f16's range times 2^4), so one mma gives both halves; of D only the
// diagonal (row (r, s), columns hi s and lo s) is used. A lane's codes of a segment are a
// contiguous run (one 16-byte load per 32 codes); the k order inside a step is the same
// permutation in A and B (codes 0, 2 | 1, 3 of a step's four: the pairs cvt.rn.f16x2.e4m3x2
// gives), so the sum is the segment's dot product. A row's value: its segments' (hi + lo) in a
// fixed tree, times TC_UNSCALE and the expert's global inverse scale. B fragments are stored as
// mma wants them: step j, lane l at uint2 index (lanes a step) j + l.
#define TC_XS 0.0625f
// What an item's sums are multiplied by before the global inverse scale: 2^6 (the codes as
// e2m1 * 2^-6) times 2^4 (1 / TC_XS). Exact.
#define TC_UNSCALE 1024.f
typedef unsigned short u16;
__device__ __forceinline__ u16 tc_f2h(float f) {
#if defined(__CUDA_ARCH__)
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return emu_f2h(f);
#endif
}
__device__ __forceinline__ float tc_h2f(u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return emu_h2f(h);
#endif
}
// a * b, f16x2 (round to nearest; subnormals kept).
__device__ __forceinline__ u32 tc_hmul2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    auto m = [](u32 x, u32 y) { return (u32)emu_f2h(emu_h2f((u16)x) * emu_h2f((u16)y)); };
    return m(a & 0xffffu, b & 0xffffu) | (m(a >> 16, b >> 16) << 16);
#endif
}
// w's E4M3 bytes 0, 1 -> lo (byte 0 in the low half), bytes 2, 3 -> hi, as f16 (exact).
__device__ __forceinline__ void tc_e4m3x4(u32 w, u32& lo, u32& hi) {
#if defined(__CUDA_ARCH__)
    asm("{.reg .b16 a0, a1;\n\t"
        "mov.b32 {a0, a1}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, a0;\n\t"
        "cvt.rn.f16x2.e4m3x2 %1, a1;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    auto h = [](u32 b) {
        float v = e4m3u((u8)(b & 0x7fu));
        return (u32)emu_f2h((b & 0x80u) ? -v : v);
    };
    lo = h(w & 0xffu) | (h((w >> 8) & 0xffu) << 16);
    hi = h((w >> 16) & 0xffu) | (h(w >> 24) << 16);
#endif
}
__device__ __forceinline__ void mma_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    emu_mma_f16(c, a0, a1, a2, a3, b0, b1);
#endif
}
// x as B's hi and lo halves (of x * TC_XS).
__device__ __forceinline__ void tc_split(float x, u16& h, u16& l) {
    float v = x * TC_XS;
    h = tc_f2h(v);
    l = tc_f2h(v - tc_h2f(h));
}
// A step's slot of an input k (its four inputs k & ~3 .. stored as 0, 2, 1, 3).
__device__ __forceinline__ int tc_pos(int k) { return ((k >> 1) & 1) | ((k & 1) << 1); }
// Input k of a gate/up activation row (H 2048: segment k >> 9, lane chunk (k >> 7) & 3, step
// (k >> 2) & 31) into its B fragments fr (32 steps x 32 lanes x 4 halves; lo 16 lanes after hi).
__device__ __forceinline__ void tcg_put(u16* fr, int k, float x) {
    u16 h, l;
    tc_split(x, h, l);
    int b = ((((k >> 2) & 31) * 32 + (k >> 9) * 4 + ((k >> 7) & 3)) << 2) + tc_pos(k);
    fr[b] = h;
    fr[b + 64] = l;
}
// Input k of a down activation row (I 512: segment k >> 8, lane chunk (k >> 6) & 3, step
// (k >> 2) & 15) into its B fragments fr (16 steps x 16 lanes x 4 halves; lo 8 lanes after hi).
__device__ __forceinline__ void tcd_put(u16* fr, int k, float x) {
    u16 h, l;
    tc_split(x, h, l);
    int b = ((((k >> 2) & 15) * 16 + (k >> 8) * 4 + ((k >> 6) & 3)) << 2) + tc_pos(k);
    fr[b] = h;
    fr[b + 32] = l;
}
// Two k steps: 8 codes each of A rows g (word wa, its block's scale pair sa) and g + 8 (wb, sb)
// against B fragments b0 (codes 0..3) and b1 (codes 4..7).
__device__ __forceinline__ void tc_word(float* c, u32 wa, u32 wb, u32 sa, u32 sb, uint2 b0, uint2 b1) {
    u32 ae0, ae1, ao0, ao1, be0, be1, bo0, bo1;
    tc_e4m3x4(((wa << 4) & 0x80808080u) | ((wa << 2) & 0x1c1c1c1cu), ae0, ae1);  // codes (0, 2), (4, 6)
    tc_e4m3x4((wa & 0x80808080u) | ((wa >> 2) & 0x1c1c1c1cu), ao0, ao1);        // codes (1, 3), (5, 7)
    tc_e4m3x4(((wb << 4) & 0x80808080u) | ((wb << 2) & 0x1c1c1c1cu), be0, be1);
    tc_e4m3x4((wb & 0x80808080u) | ((wb >> 2) & 0x1c1c1c1cu), bo0, bo1);
    mma_f16(c, tc_hmul2(ae0, sa), tc_hmul2(be0, sb), tc_hmul2(ao0, sa), tc_hmul2(bo0, sb), b0.x, b0.y);
    mma_f16(c, tc_hmul2(ae1, sa), tc_hmul2(be1, sb), tc_hmul2(ao1, sa), tc_hmul2(bo1, sb), b1.x, b1.y);
}
// A gate/up item (expert e; rows gate i, i + 1, up i, i + 1): lane (g = lane / 4, t = lane % 4)
// holds, of row i + (g & 1) in segment g >> 1 (512 inputs), inputs 128 t .. 128 t + 127: gate
// codes cw[0..4), up cw[4..8), scale bytes sc[0] (gate) and sc[1] (up). The loads skip L1.
__device__ __forceinline__ void tcg_load(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i,
                                         int lane, uint4 (&cw)[8], uint2 (&sc)[2]) {
    const int H = 2048, I = 512;
    int g = lane >> 2, t = lane & 3, r = i + (g & 1), s = g >> 1;
    size_t wo = (size_t)e * I * H / 2 + (size_t)r * (H / 2) + 256 * s + 64 * t;
    size_t so = (size_t)e * I * (H / 16) + (size_t)r * (H / 16) + 32 * s + 8 * t;
    const uint4* pg = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(gw) + wo);
    const uint4* pu = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(uw) + wo);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        cw[q] = ldg_na(pg + q);
        cw[4 + q] = ldg_na(pu + q);
    }
    sc[0] = ldg_na(reinterpret_cast<const uint2*>(gs + so));
    sc[1] = ldg_na(reinterpret_cast<const uint2*>(us + so));
}
// f16 pairs (s, s) of the block scales in E4M3 bytes 0..3 of w: d[b] for byte b. The sign bit
// is ignored, as e4m3u (the f32 items' decode) ignores it.
__device__ __forceinline__ void tc_scales4(u32 w, u32 (&d)[4]) {
    u32 lo, hi;
    tc_e4m3x4(w & 0x7f7f7f7fu, lo, hi);
    d[0] = __byte_perm(lo, 0u, 0x1010);
    d[1] = __byte_perm(lo, 0u, 0x3232);
    d[2] = __byte_perm(hi, 0u, 0x1010);
    d[3] = __byte_perm(hi, 0u, 0x3232);
}
// A gate/up item's D fragment against B fragments bf (the activation row's, tcg_put's layout).
__device__ __forceinline__ void tcg_dot(const uint4 (&cw)[8], const uint2 (&sc)[2], const uint2* bf, int lane, float* c) {
    c[0] = c[1] = c[2] = c[3] = 0.f;
    u32 sg[2][4], su[2][4];
    tc_scales4(sc[0].x, sg[0]);
    tc_scales4(sc[0].y, sg[1]);
    tc_scales4(sc[1].x, su[0]);
    tc_scales4(sc[1].y, su[1]);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        u32 wg[4] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
        u32 wu[4] = {cw[4 + u].x, cw[4 + u].y, cw[4 + u].z, cw[4 + u].w};
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            int j = 8 * u + 2 * wi, b = 2 * u + (wi >> 1);
            tc_word(c, wg[wi], wu[wi], sg[b >> 2][b & 3], su[b >> 2][b & 3], bf[32 * j + lane], bf[32 * (j + 1) + lane]);
        }
    }
}
// The item's outputs from its D fragment: vg / vu = gate / up of row i in lane 0 and of row
// i + 1 in lane 4 (before TC_UNSCALE and the global inverse scales): a segment's hi + lo, then
// (s0 + s1) + (s2 + s3).
__device__ __forceinline__ void tcg_sum(const float* c, int lane, float& vg, float& vu) {
    bool odd = (lane >> 3) & 1;
    vg = odd ? c[1] : c[0];
    vu = odd ? c[3] : c[2];
    vg += __shfl_sync(0xffffffffu, vg, (lane + 2) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 2) & 31);
    vg += __shfl_sync(0xffffffffu, vg, (lane + 8) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 8) & 31);
    vg += __shfl_sync(0xffffffffu, vg, (lane + 17) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 17) & 31);
}
// SiLU(gate) * up of rows i (lane 0) and i + 1 (lane 4) of a gate/up item into the slot's down B
// fragments af (tcd_put's layout); also f32 into o when set.
__device__ __forceinline__ void tcg_out(const float* c, int lane, float gi, float ui, u16* af, float* o, int i) {
    float vg, vu;
    tcg_sum(c, lane, vg, vu);
    if ((lane & ~4) == 0) {
        float v = silu_f(vg * TC_UNSCALE * gi) * (vu * TC_UNSCALE * ui);
        tcd_put(af, i + (lane >> 2), v);
        if (o) o[i + (lane >> 2)] = v;
    }
}
// A down item (expert e, output rows n .. n + 7): lane (g, t) holds, of row n + g, inputs 64 t ..
// 64 t + 63 of segment 0 (cw[0..2)) and of segment 1 (cw[2..4)) and their scale bytes (sc[0],
// sc[1]). The loads skip L1.
__device__ __forceinline__ void tcd_load(const void* dw, const u8* ds, int e, int n, int lane, uint4 (&cw)[4], u32 (&sc)[2]) {
    const int H = 2048, I = 512;
    int g = lane >> 2, t = lane & 3, r = n + g;
    const u8* wb = reinterpret_cast<const u8*>(dw) + (size_t)e * H * I / 2 + (size_t)r * (I / 2) + 32 * t;
    const u8* sb = ds + (size_t)e * H * (I / 16) + (size_t)r * (I / 16) + 4 * t;
    cw[0] = ldg_na(reinterpret_cast<const uint4*>(wb));
    cw[1] = ldg_na(reinterpret_cast<const uint4*>(wb + 16));
    cw[2] = ldg_na(reinterpret_cast<const uint4*>(wb + 128));
    cw[3] = ldg_na(reinterpret_cast<const uint4*>(wb + 144));
    sc[0] = ldg_na(reinterpret_cast<const u32*>(sb));
    sc[1] = ldg_na(reinterpret_cast<const u32*>(sb + 16));
}
// A down item's D fragment against B fragments bf (tcd_put's layout; lanes 16..31 hold zeros).
__device__ __forceinline__ void tcd_dot(const uint4 (&cw)[4], const u32 (&sc)[2], const uint2* bf, int lane, float* c) {
    c[0] = c[1] = c[2] = c[3] = 0.f;
    u32 sa[4], sb[4];
    tc_scales4(sc[0], sa);
    tc_scales4(sc[1], sb);
    bool bl = lane < 16;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        u32 wa[4] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
        u32 wb[4] = {cw[2 + u].x, cw[2 + u].y, cw[2 + u].z, cw[2 + u].w};
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            int j = 8 * u + 2 * wi, b = 2 * u + (wi >> 1);
            uint2 b0 = make_uint2(0u, 0u), b1 = b0;
            if (bl) {
                b0 = bf[16 * j + lane];
                b1 = bf[16 * (j + 1) + lane];
            }
            tc_word(c, wa[wi], wb[wi], sa[b], sb[b], b0, b1);
        }
    }
}
// Row n + g of a down item in lane 4 g (before TC_UNSCALE and the global inverse scale): (segment 0
// hi + lo) + (segment 1 hi + lo), D's columns 0 / 2 (c0 of t = 0 / 1) and 1 / 3 (c3).
__device__ __forceinline__ float tcd_sum(const float* c, int lane) {
    float v0 = c[0] + __shfl_sync(0xffffffffu, c[0], (lane + 1) & 31);
    float v1 = c[3] + __shfl_sync(0xffffffffu, c[3], (lane + 1) & 31);
    return v0 + v1;
}

// moe_tc for the multi-row passes (DFlash verify, decode of several sequences): the rows' B
// fragments first (moe_tc_bfrag_rows: row r of x -> tcg_put's layout at xf + 4096 r halves), then
// moe_*_fp4_warp's items (a warp a gate/up item of 2 intermediate rows, a down item of 8 output
// rows, every slot of the group in turn) with moe_decode_fused_tc's per-slot arithmetic (tcg_dot /
// tcd_dot against the slot's own fragments, the same sums and scales), so a row verified with k
// others is bit-identical to the row decoded alone. The gate/up items leave SiLU(gate) * up as
// the down's B fragments in `act` (the f32 rows' bytes). H 2048, I 512.
extern "C" __global__ void moe_tc_bfrag_rows(const float* x, u16* xf) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * 2048;
    u16* fr = xf + (size_t)blockIdx.x * 4096;
    for (int k = threadIdx.x; k < 2048; k += blockDim.x) tcg_put(fr, k, xr[k]);
}
__device__ void moe_gu_tc_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                               const float* uinv, const u16* xf, int KK, const int* grp_expert, const int* grp_start,
                               const int* grp_count, const int* perm, const int* meta, float* act) {
    const int I = 512;
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float gi = ginv[e], ui = uinv[e];
        uint4 tw[8];
        uint2 ts[2];
        tcg_load(gw, gs, uw, us, e, i, lane, tw, ts);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            float c[4];
            tcg_dot(tw, ts, reinterpret_cast<const uint2*>(xf + (size_t)(slot / KK) * 4096), lane, c);
            tcg_out(c, lane, gi, ui, reinterpret_cast<u16*>(act + (size_t)slot * I), nullptr, i);
        }
    }
}
__device__ void moe_dn_tc_impl(const void* dw, const u8* ds, const float* dinv, const float* act, const int* grp_expert,
                               const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* out) {
    const int H = 2048, I = 512;
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 3;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 8;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float di = dinv[e];
        uint4 tw[4];
        u32 ts[2];
        tcd_load(dw, ds, e, n, lane, tw, ts);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            float c[4];
            tcd_dot(tw, ts, reinterpret_cast<const uint2*>(act + (size_t)slot * I), lane, c);
            float y = tcd_sum(c, lane);
            if ((lane & 3) == 0) out[(size_t)slot * H + n + (lane >> 2)] = y * TC_UNSCALE * di;
        }
    }
}
// moe_*_fp4_warp's arguments, x being moe_tc_bfrag_rows' fragments of the rows (H 2048, I 512).
extern "C" __global__ __launch_bounds__(128) void moe_gate_up_fp4_tc(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const void* xf, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_tc_impl(gw, gs, ginv, uw, us, uinv, reinterpret_cast<const u16*>(xf), K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ __launch_bounds__(128) void moe_down_fp4_tc(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_tc_impl(dw, ds, dinv, act, ge, gst, gc, perm, meta, out);
}
