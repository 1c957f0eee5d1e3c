// MoE: the weight-streaming expert kernels of small passes, one item a warp
// (`moe_*_fp4_warp`, `moe_*_{fp4,bf16}_grouped`).

// ---- small-batch MoE (passes of 1..16 rows: decode steps and DFlash verify) -------------------
// Persistent warps (grid-stride over work items) so a whole layer's experts are in flight at once
// and the group/slot lookups are paid once per item. An item is (group, outputs): the weights are
// loaded once per item and applied to every slot of the group (an expert chosen by several rows
// is read once). Per (slot, output) the arithmetic is fixed: lane-strided chunks of 32 (gate/up)
// or 16 (down) inputs, 16-term fmaf blocks scaled per block, then warp_sum; it never depends on
// the grouping or the batch, so a row verified with k others is bit-identical to the row decoded
// alone. Slots of a group are taken SB at a time (weights re-read from L1 for the next SB).
#define MOE_SB 2
// Four E4M3 bytes (byte i -> o[i]) as floats, exact: on sm_89+ two cvt.rn.f16x2.e4m3x2 and four
// f16 -> f32 conversions (every value blk16_dot builds is a normal f16).
__device__ __forceinline__ void e4m3x4_f32(u32 w, float& o0, float& o1, float& o2, float& o3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{.reg .b16 a0, a1, f0, f1, f2, f3;\n\t"
        ".reg .b32 h0, h1;\n\t"
        "mov.b32 {a0, a1}, %4;\n\t"
        "cvt.rn.f16x2.e4m3x2 h0, a0;\n\t"
        "cvt.rn.f16x2.e4m3x2 h1, a1;\n\t"
        "mov.b32 {f0, f1}, h0;\n\t"
        "mov.b32 {f2, f3}, h1;\n\t"
        "cvt.f32.f16 %0, f0;\n\t"
        "cvt.f32.f16 %1, f1;\n\t"
        "cvt.f32.f16 %2, f2;\n\t"
        "cvt.f32.f16 %3, f3;\n\t}"
        : "=f"(o0), "=f"(o1), "=f"(o2), "=f"(o3)
        : "r"(w));
#else
    auto sg = [](u32 b, float v) { return (b & 0x80u) ? -v : v; };
    o0 = sg(w & 0xffu, e4m3u(w & 0x7fu));
    o1 = sg((w >> 8) & 0xffu, e4m3u((w >> 8) & 0x7fu));
    o2 = sg((w >> 16) & 0xffu, e4m3u((w >> 16) & 0x7fu));
    o3 = sg(w >> 24, e4m3u((w >> 24) & 0x7fu));
#endif
}
// The 8 E2M1 codes of w (element 2i in the low nibble of byte i) as floats equal to their values
// times 2^-6: code s.e1e0.m becomes the E4M3 byte s.00e1e0.m00, which is exactly e2m1 * 2^-6 (for
// e > 0: 2^(e-7) (1 + m/2) against 2^(e-1) (1 + m/2); for e = 0: 2^-6 m/2 against m/2). Even
// elements from the low nibbles, odd ones from the high nibbles: 7 integer ops, 4 conversions of
// two and 8 f16 -> f32 conversions for 8 codes.
__device__ __forceinline__ void e2m1x8_f32(u32 w, float* c) {
    u32 ev = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
    u32 od = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
    e4m3x4_f32(ev, c[0], c[2], c[4], c[6]);
    e4m3x4_f32(od, c[1], c[3], c[5], c[7]);
}
template <int FMT>
__device__ __forceinline__ float blk16_dot(u32 w0, u32 w1, u32 w2, u32 w3, u32 w4, u32 w5, u32 w6, u32 w7, const float* xv) {
    // FMT 0: 8 words = 16 bf16; FMT 1: w0, w1 = 16 e2m1 codes (element 2i low nibble).
    float t = 0.f;
    if (FMT == 0) {
        u32 q[8] = {w0, w1, w2, w3, w4, w5, w6, w7};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            t = fmaf(bflo(q[e]), xv[2 * e], t);
            t = fmaf(bfhi(q[e]), xv[2 * e + 1], t);
        }
    } else {
        // Codes read as e2m1 * 2^-6 (e2m1x8_f32), so every product and partial sum is the unscaled
        // one times 2^-6 exactly (no f32 subnormal or overflow at activation magnitudes): the
        // caller folds 2^6 into the block scale (load_blk). The same bits as decoding to the
        // codes' values, and as the e2m1_at * 2^100-activation form it replaced.
        float c[8];
        e2m1x8_f32(w0, c);
#pragma unroll
        for (int i = 0; i < 8; i++) t = fmaf(c[i], xv[i], t);
        e2m1x8_f32(w1, c);
#pragma unroll
        for (int i = 0; i < 8; i++) t = fmaf(c[i], xv[8 + i], t);
    }
    return t;
}
// The 16 activations at x16 dotted with the current block of four weight rows (words wa/wc, block scales sc), added into acc[0..4).
// LDG: activations through the read-only path (global memory written before the launch); off,
// through a generic pointer (shared memory, or data this launch wrote).
template <int FMT, bool LDG = true>
__device__ __forceinline__ void blk16_rows4(const float* x16, const uint4* wa, const uint4* wc, const float* sc, float* acc) {
    const float4* xp = reinterpret_cast<const float4*>(x16);
    float4 v0, v1, v2, v3;
    if (LDG) {
        v0 = __ldg(xp), v1 = __ldg(xp + 1), v2 = __ldg(xp + 2), v3 = __ldg(xp + 3);
    } else {
        v0 = xp[0], v1 = xp[1], v2 = xp[2], v3 = xp[3];
    }
    float xv[16] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float t = blk16_dot<FMT>(wa[j].x, wa[j].y, wa[j].z, wa[j].w, wc[j].x, wc[j].y, wc[j].z, wc[j].w, xv);
        acc[j] = FMT == 0 ? acc[j] + t : fmaf(t, sc[j], acc[j]);
    }
}
// One 16-input block of weight row `n` of expert matrix base (rows of K inputs): packed words and
// the block scale (1 for BF16). NA: the loads skip L1 (ldg_na).
template <int FMT, bool NA = false>
__device__ __forceinline__ void load_blk(const u8* base, const u8* sbase, int n, int K, int b, uint4& a, uint4& c, float& sc) {
    if (FMT == 0) {
        const uint4* p = reinterpret_cast<const uint4*>(base + ((size_t)n * K + (size_t)b * 16) * 2);
        a = ldg_w<NA>(p);
        c = ldg_w<NA>(p + 1);
        sc = 1.f;
    } else {
        uint2 u = ldg_w<NA>(reinterpret_cast<const uint2*>(base + (size_t)n * (K >> 1) + (size_t)b * 8));
        a = make_uint4(u.x, u.y, 0u, 0u);
        c = make_uint4(0u, 0u, 0u, 0u);
        sc = e4m3u(ldg_w<NA>(sbase + (size_t)n * (K >> 4) + b)) * 64.f;  // 2^6: see blk16_dot
    }
}
// gate/up: item = (group, 2 consecutive intermediate rows). act[slot, i] = silu(g) * u.
template <int FMT>
__device__ void moe_gu_s_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                              const float* uinv, const float* x, int H, int I, int KK, const int* grp_expert,
                              const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* act) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    int nblk = H >> 4;
    size_t wstride = FMT == 0 ? (size_t)I * H * 2 : (size_t)I * H / 2;
    size_t sstride = (size_t)I * (H >> 4);
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        const u8* gwe = reinterpret_cast<const u8*>(gw) + e * wstride;
        const u8* uwe = reinterpret_cast<const u8*>(uw) + e * wstride;
        const u8* gse = FMT == 1 ? gs + e * sstride : nullptr;
        const u8* use = FMT == 1 ? us + e * sstride : nullptr;
        float gi = FMT == 1 ? ginv[e] : 1.f, ui = FMT == 1 ? uinv[e] : 1.f;
        for (int s0 = 0; s0 < cn; s0 += MOE_SB) {
            int ns = min(MOE_SB, cn - s0);
            int slot[MOE_SB];
            const float* xr[MOE_SB];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
                slot[r] = perm[st + s0 + (r < ns ? r : 0)];
                xr[r] = x + (size_t)(slot[r] / KK) * H;
            }
            float acc[MOE_SB][4];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[r][j] = 0.f;
            uint4 wa[4], wc[4];
            float sc[4];
            auto ld4 = [&](int b, uint4* qa, uint4* qc, float* qs) {
                load_blk<FMT>(gwe, gse, i, H, b, qa[0], qc[0], qs[0]);
                load_blk<FMT>(gwe, gse, i + 1, H, b, qa[1], qc[1], qs[1]);
                load_blk<FMT>(uwe, use, i, H, b, qa[2], qc[2], qs[2]);
                load_blk<FMT>(uwe, use, i + 1, H, b, qa[3], qc[3], qs[3]);
            };
            if (lane < nblk) ld4(lane, wa, wc, sc);
            for (int b = lane; b < nblk; b += 32) {
                uint4 na[4], nc[4];
                float nsc[4];
                if (b + 32 < nblk) ld4(b + 32, na, nc, nsc);
#pragma unroll
                for (int r = 0; r < MOE_SB; r++) {
                    if (r < ns) {
                        blk16_rows4<FMT>(xr[r] + b * 16, wa, wc, sc, acc[r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wa[j] = na[j];
                    wc[j] = nc[j];
                    sc[j] = nsc[j];
                }
            }
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
                float g0 = warp_sum(acc[r][0]) * gi, g1 = warp_sum(acc[r][1]) * gi;
                float u0 = warp_sum(acc[r][2]) * ui, u1 = warp_sum(acc[r][3]) * ui;
                if (r < ns) {
                    if (lane == 0) act[(size_t)slot[r] * I + i] = silu_f(g0) * u0;
                    if (lane == 1) act[(size_t)slot[r] * I + i + 1] = silu_f(g1) * u1;
                }
            }
        }
    }
}
// down: item = (group, 4 consecutive output rows). out[slot, n] = down_e[n] . act[slot].
template <int FMT>
__device__ void moe_dn_s_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                              const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                              const int* meta, float* out) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 2;
    int total = meta[0] * per;
    int nblk = I >> 4;
    size_t wstride = FMT == 0 ? (size_t)H * I * 2 : (size_t)H * I / 2;
    size_t sstride = (size_t)H * (I >> 4);
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 4;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
        const u8* dse = FMT == 1 ? ds + e * sstride : nullptr;
        float di = FMT == 1 ? dinv[e] : 1.f;
        for (int s0 = 0; s0 < cn; s0 += MOE_SB) {
            int ns = min(MOE_SB, cn - s0);
            int slot[MOE_SB];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) slot[r] = perm[st + s0 + (r < ns ? r : 0)];
            float acc[MOE_SB][4];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[r][j] = 0.f;
            uint4 wa[4], wc[4];
            float sc[4];
            if (lane < nblk)
#pragma unroll
                for (int j = 0; j < 4; j++) load_blk<FMT>(dwe, dse, n + j, I, lane, wa[j], wc[j], sc[j]);
            for (int b = lane; b < nblk; b += 32) {
                uint4 na[4], nc[4];
                float nsc[4];
                if (b + 32 < nblk)
#pragma unroll
                    for (int j = 0; j < 4; j++) load_blk<FMT>(dwe, dse, n + j, I, b + 32, na[j], nc[j], nsc[j]);
#pragma unroll
                for (int r = 0; r < MOE_SB; r++) {
                    if (r < ns) {
                        blk16_rows4<FMT>(act + (size_t)slot[r] * I + b * 16, wa, wc, sc, acc[r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wa[j] = na[j];
                    wc[j] = nc[j];
                    sc[j] = nsc[j];
                }
            }
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float v = warp_sum(acc[r][j]) * di;
                    if (r < ns && lane == j) out[(size_t)slot[r] * H + n + j] = v;
                }
            }
        }
    }
}
// moe_*_fp4_warp (NVFP4, decode and verify), and the items of moe_decode_fused: the same per-slot
// arithmetic as moe_*_grouped (lane l takes blocks l, l + 32, ... of every row, 16-term blocks
// scaled per block, warp_sum), but a warp loads all blocks of its item's rows at once (up to 4
// blocks per lane, H <= 2048) before any arithmetic, keeps them in registers for every slot of
// the group, and the host sizes the grid to one item per warp (blocks of 128 threads). down:
// items of 8 rows. Slots one at a time: the weights stay in registers, the activations do not.
// The weight and scale loads skip L1 (ldg_na), leaving it to the activation rows every item of
// a slot reads.
// blk16_rows4 over four rows' NVFP4 codes held as (word, word) pairs (load_blk's values).
template <bool LDG = true>
__device__ __forceinline__ void blk16_rows4_fp4(const float* x16, const uint2* cw, const float* sc, float* acc) {
    uint4 wa[4], wc[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        wa[q] = make_uint4(cw[q].x, cw[q].y, 0u, 0u);
        wc[q] = make_uint4(0u, 0u, 0u, 0u);
    }
    blk16_rows4<1, LDG>(x16, wa, wc, sc, acc);
}
// A gate/up item of expert e: cw[j][r] / sc[j][r] = block lane + 32 j of rows gate i, gate i + 1,
// up i, up i + 1 (H <= 2048), all loaded before any arithmetic (sc: the raw E4M3 scale bytes).
// The loads skip L1 (ldg_na).
__device__ __forceinline__ void sp_gu_load(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i, int H,
                                           int I, int lane, uint2 (&cw)[4][4], u32 (&sc)[4][4]) {
    size_t wstride = (size_t)I * H / 2, sstride = (size_t)I * (H >> 4);
    const u8* wr[4] = {reinterpret_cast<const u8*>(gw) + e * wstride, reinterpret_cast<const u8*>(gw) + e * wstride,
                       reinterpret_cast<const u8*>(uw) + e * wstride, reinterpret_cast<const u8*>(uw) + e * wstride};
    const u8* sr[4] = {gs + e * sstride, gs + e * sstride, us + e * sstride, us + e * sstride};
    int nblk = H >> 4;
    // Every load, nothing else (blocks past the row clamped to its last one: loaded, never used):
    // the scale bytes stay raw until sp_gu_slot uses them. A decode next to its load inside a
    // per-j branch made the warp wait for each j's loads before issuing the next j's (four round
    // trips instead of one).
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = min(lane + 32 * j, nblk - 1);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int n = i + (r & 1);
            cw[j][r] = ldg_na(reinterpret_cast<const uint2*>(wr[r] + (size_t)n * (H >> 1) + (size_t)b * 8));
            sc[j][r] = ldg_na(sr[r] + (size_t)n * nblk + b);
        }
    }
}
// A block scale as the slot's dot takes it: a raw E4M3 byte (sp_*_load) decoded as load_blk
// does, e4m3u(b) * 2^6, or a scale sp_*_load_m already decoded.
__device__ __forceinline__ float sp_scale(u32 b) { return e4m3u((u8)b) * 64.f; }
__device__ __forceinline__ float sp_scale(float s) { return s; }
// One slot of a gate/up item: o[i], o[i + 1] = SiLU(gate) * up for the activation row xr.
template <bool LDG, typename S>
__device__ __forceinline__ void sp_gu_slot(const float* xr, const uint2 (&cw)[4][4], const S (&sc)[4][4], int H, int lane,
                                           float gi, float ui, float* o, int i) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = lane + 32 * j;
        if (b < (H >> 4)) {
            float f[4];
#pragma unroll
            for (int r = 0; r < 4; r++) f[r] = sp_scale(sc[j][r]);
            blk16_rows4_fp4<LDG>(xr + b * 16, cw[j], f, acc);
        }
    }
    float g0 = warp_sum(acc[0]) * gi, g1 = warp_sum(acc[1]) * gi;
    float u0 = warp_sum(acc[2]) * ui, u1 = warp_sum(acc[3]) * ui;
    if (lane == 0) o[i] = silu_f(g0) * u0;
    if (lane == 1) o[i + 1] = silu_f(g1) * u1;
}
// A down item of expert e: cw[hh][j] / sc[hh][j] = block `lane` of row n + 4 hh + j (I <= 512;
// sc: the raw E4M3 scale bytes; the loads skip L1).
__device__ __forceinline__ void sp_dn_load(const void* dw, const u8* ds, int e, int n, int H, int I, int lane,
                                           uint2 (&cw)[2][4], u32 (&sc)[2][4]) {
    size_t wstride = (size_t)H * I / 2, sstride = (size_t)H * (I >> 4);
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = ds + e * sstride;
    // As sp_gu_load: every load, nothing else (lanes past the row's blocks clamped to its last
    // one); the scale bytes stay raw until sp_dn_slot.
    int b = min(lane, (I >> 4) - 1);
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = n + 4 * hh + j;
            cw[hh][j] = ldg_na(reinterpret_cast<const uint2*>(dwe + (size_t)r * (I >> 1) + (size_t)b * 8));
            sc[hh][j] = ldg_na(dse + (size_t)r * (I >> 4) + b);
        }
}
// One slot of a down item: o[n .. n + 8) = di * (rows n .. n + 8 of the expert) . a.
template <bool LDG, typename S>
__device__ __forceinline__ void sp_dn_slot(const float* a, const uint2 (&cw)[2][4], const S (&sc)[2][4], int I, int lane,
                                           float di, float* o, int n) {
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (lane < (I >> 4))
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) f[j] = sp_scale(sc[hh][j]);
            blk16_rows4_fp4<LDG>(a + lane * 16, cw[hh], f, acc[hh]);
        }
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v = warp_sum(acc[hh][j]) * di;
            if (lane == j) o[n + 4 * hh + j] = v;
        }
}
// The multi-slot kernels (moe_*_fp4_warp: DFlash verify, and decode of several rows) load in the
// order of sp_*_load_m (each j block's scale bytes decoded next to their loads): the
// all-loads-first form above spills there (168 bytes of stack at 96 registers). The same
// arithmetic in the same order, so the same bits as moe_decode_fused's items.
__device__ __forceinline__ void sp_gu_load_m(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i, int H,
                                           int I, int lane, uint2 (&cw)[4][4], float (&sc)[4][4]) {
    size_t wstride = (size_t)I * H / 2, sstride = (size_t)I * (H >> 4);
    const u8* wr[4] = {reinterpret_cast<const u8*>(gw) + e * wstride, reinterpret_cast<const u8*>(gw) + e * wstride,
                       reinterpret_cast<const u8*>(uw) + e * wstride, reinterpret_cast<const u8*>(uw) + e * wstride};
    const u8* sr[4] = {gs + e * sstride, gs + e * sstride, us + e * sstride, us + e * sstride};
    int nblk = H >> 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = lane + 32 * j;
        if (b < nblk) {
#pragma unroll
            for (int r = 0; r < 4; r++) {
                uint4 a4, c4;
                load_blk<1, true>(wr[r], sr[r], i + (r & 1), H, b, a4, c4, sc[j][r]);
                cw[j][r] = make_uint2(a4.x, a4.y);
            }
        }
    }
}
// A down item of expert e: cw[hh][j] / sc[hh][j] = block `lane` of row n + 4 hh + j (I <= 512).
__device__ __forceinline__ void sp_dn_load_m(const void* dw, const u8* ds, int e, int n, int H, int I, int lane,
                                           uint2 (&cw)[2][4], float (&sc)[2][4]) {
    size_t wstride = (size_t)H * I / 2, sstride = (size_t)H * (I >> 4);
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = ds + e * sstride;
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (lane < (I >> 4)) {
                uint4 a4, c4;
                load_blk<1, true>(dwe, dse, n + 4 * hh + j, I, lane, a4, c4, sc[hh][j]);
                cw[hh][j] = make_uint2(a4.x, a4.y);
            }
}
__device__ void moe_gu_sp_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                               const float* uinv, const float* x, int H, int I, int KK, const int* grp_expert,
                               const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* act) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float gi = ginv[e], ui = uinv[e];
        uint2 cw[4][4];
        float sc[4][4];
        sp_gu_load_m(gw, gs, uw, us, e, i, H, I, lane, cw, sc);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            sp_gu_slot<true>(x + (size_t)(slot / KK) * H, cw, sc, H, lane, gi, ui, act + (size_t)slot * I, i);
        }
    }
}
// down, items of 8 output rows (two groups of 4, each moe_dn_s_impl's arithmetic); I <= 512.
__device__ void moe_dn_sp_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                               const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                               const int* meta, float* out) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 3;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 8;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float di = dinv[e];
        uint2 cw[2][4];
        float sc[2][4];
        sp_dn_load_m(dw, ds, e, n, H, I, lane, cw, sc);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            sp_dn_slot<true>(act + (size_t)slot * I, cw, sc, I, lane, di, out + (size_t)slot * H, n);
        }
    }
}
extern "C" __global__ __launch_bounds__(128, 5) void moe_gate_up_fp4_warp(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_sp_impl(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ __launch_bounds__(128) void moe_down_fp4_warp(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_sp_impl(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_gate_up_fp4_grouped(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                             const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                             const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_s_impl<1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_gate_up_bf16_grouped(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_s_impl<0>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_fp4_grouped(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                          const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                          float* out) { PDL_ENTRY();
    moe_dn_s_impl<1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_down_bf16_grouped(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_s_impl<0>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
