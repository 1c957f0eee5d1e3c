// Tensor-core GEMMs for multi-row passes (prefill, long verification): Y[r, n] (+)= scale_n *
// sum_k W[n, k] X[r, k], BF16 mma.sync m16n8k16 with f32 accumulation. Weights are read once per
// tile of 64 rows (not once per row). X (f32) is split into BF16 hi + lo in shared memory; NVFP4 weights
// are dequantised exactly to BF16 (E2M1 x E4M3 fits in 8 significant bits); the per-matrix
// 1/global-scale is applied to the f32 result.
//
// Batch invariance: an output element's arithmetic is the K loop in fixed 32-wide steps through
// the same mma fragments whatever the tile it sits in, so a row's result does not depend on which
// other rows share its pass or tile.
//
// Block 128 threads (4 warps, 2 x 2, each 32 x 32), tile 64 rows x 64 outputs x 64 K; the next K
// step's global loads are in flight (registers) while the current one computes.
#define GM 64
#define GN 64
#define GK 64
#define GLD 72  // shared row stride in bf16 (144 bytes: 16-byte aligned, conflict-free fragments)

// x (f32 [M, K], row stride ldx) -> hi = bf16(x), lo = bf16(x - hi), both [M, K] (lo at hi + M*K;
// not written when lo == 0: the consumer reads the hi half alone). grid (ceil(K/256), M), block 256.
extern "C" __global__ void split_bf16(const float* x, int ldx, int M, int K, bf16_t* hi, int lo) { PDL_ENTRY();
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K) return;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {  // grid.y = min(M, 65535)
        float v = x[(size_t)m * ldx + k];
        bf16_t h = f2bf(v);
        hi[(size_t)m * K + k] = h;
        if (lo) hi[(size_t)M * K + (size_t)m * K + k] = f2bf(v - bf2f(h));
    }
}

// 8 E2M1 codes (code i in bits 4i..4i+3 of w, sign in bit 3) times an E4M3 block scale held as a
// BF16 pair (s2) -> 4 BF16 pairs, out[p] = (code 2p, code 2p+1) * scale, exact (a code has <= 2
// significant bits, a scale <= 4; the product is normal in BF16). Magnitudes by byte permutes from
// two 8-entry tables (high and low byte of |e2m1| as BF16), signs moved to bits 15 / 31, one
// bf16x2 multiply (an fma adding -0, which keeps every product, zeros included, unchanged).
// Same values as e2m1(c) * scale rounded to BF16, without a shared-memory table.
__device__ __forceinline__ void e2m1x8_bf16(u32 w, u32 s2, u32* out) {
    const u32 HB0 = 0x3F3F3F00u, HB1 = 0x40404040u;  // high bytes of 0, .5, 1, 1.5 | 2, 3, 4, 6
    const u32 LB0 = 0xC0800000u, LB1 = 0xC0804000u;  // low bytes
    u32 m = w & 0x77777777u;
    u32 h0 = __byte_perm(HB0, HB1, m & 0xffffu), l0 = __byte_perm(LB0, LB1, m & 0xffffu);
    u32 h1 = __byte_perm(HB0, HB1, m >> 16), l1 = __byte_perm(LB0, LB1, m >> 16);
    u32 p[4];
    p[0] = __byte_perm(l0, h0, 0x5140) | ((w << 12) & 0x8000u) | ((w << 24) & 0x80000000u);
    p[1] = __byte_perm(l0, h0, 0x7362) | ((w << 4) & 0x8000u) | ((w << 16) & 0x80000000u);
    p[2] = __byte_perm(l1, h1, 0x5140) | ((w >> 4) & 0x8000u) | ((w << 8) & 0x80000000u);
    p[3] = __byte_perm(l1, h1, 0x7362) | ((w >> 12) & 0x8000u) | (w & 0x80000000u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
#if defined(__CUDA_ARCH__)
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out[i]) : "r"(p[i]), "r"(s2), "r"(0x80008000u));
#else
        // kernels/emu: the product of two BF16 is exact in f32, then rounded to BF16 (+ -0).
        out[i] = (u32)f2bf(bflo(p[i]) * bflo(s2)) | ((u32)f2bf(bfhi(p[i]) * bfhi(s2)) << 16);
#endif
    }
}

__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    emu_mma_bf16(c, a0, a1, a2, a3, b0, b1);  // kernels/emu: PTX's fragment layout, f32 fmas in k order
#endif
}

// Rows of the tile: arow[r] (row of X, -1 = none) and yrow[r] (row of Y) are set by the caller in
// shared memory. Outputs n < N1 come from (w1, s1, sc1), n >= N1 from (w2, s2, sc2) at n - N1.
// X is carried as hi + lo BF16 pairs (two mma per fragment), ~16 significant bits, so results
// stay within f32-kernel error of the reference: with X rounded to BF16 alone the residual stream
// drifts enough to flip near-tied router top-k picks on the fixtures.
// TN: outputs per tile (64, or 128 for NVFP4 weights: each warp 32 x 64, so an A fragment pair
// feeds twice the mma and the block decodes each weight once per 64 rows with half the A traffic).
// SKIP: a warp whose 32 tile rows are all padding (rows fill a tile from the top: the short last
// tile of an expert group) skips its fragments and mma, leaving the issue slots to other blocks,
// and a warp whose second 16-row block is all padding runs the mma of its first alone.
// SILU (gate/up): a tile's TN columns are TN / 2 intermediate indices i0 = n0 / 2 .., each warp's
// TN / 2 columns gate of TN / 4 of them then up of the same TN / 4, so the epilogue has gate and up of
// (row, i) in one thread: it writes silu(gate) * up as the BF16 hi / lo split the down GEMM reads
// (Y as bf16 [rows, N1], lo at + olo elements), the values silu_mul_split would write.
// One K step of a warp's fragments and mma over its first MI 16-row blocks (a macro: NVRTC 13.0
// treats generic lambdas as host code). Uses gemm_tile's locals. Fragments by ldmatrix (the same
// values as element-wise loads): A tiles (rows +0/+8, cols +0/+8) per 16-row block; B tiles (n
// rows +0..7 at k +0/+8, then n +8..15).
#define GEMM_KSTEP(MI)                                                                                                  \
    _Pragma("unroll") for (int kk = 0; kk < GK; kk += 16) {                                                           \
        u32 a[2][4], bb[NI][2];                                                                                       \
        const int arow_l = lane & 15, acol_l = (lane >> 4) * 8;                                                       \
        const int brow_l = (lane & 7) + ((lane >> 4) << 3), bcol_l = ((lane >> 3) & 1) * 8;                           \
        _Pragma("unroll") for (int mi = 0; mi < MI; mi++)                                                             \
            ldsm_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], &Ab[(wm * 32 + mi * 16 + arow_l) * GLD + kk + acol_l]); \
        _Pragma("unroll") for (int ni = 0; ni < NI; ni += 2)                                                          \
            ldsm_x4(bb[ni][0], bb[ni][1], bb[ni + 1][0], bb[ni + 1][1],                                               \
                    &Bs[(wn * (TN / 2) + ni * 8 + brow_l) * GLD + kk + bcol_l]);                                      \
        _Pragma("unroll") for (int mi = 0; mi < MI; mi++)                                                             \
            _Pragma("unroll") for (int ni = 0; ni < NI; ni++)                                                         \
                mma_bf16(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], bb[ni][0], bb[ni][1]);                  \
        _Pragma("unroll") for (int mi = 0; mi < MI; mi++)                                                             \
            ldsm_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], &Alb[(wm * 32 + mi * 16 + arow_l) * GLD + kk + acol_l]);  \
        _Pragma("unroll") for (int mi = 0; mi < MI; mi++)                                                             \
            _Pragma("unroll") for (int ni = 0; ni < NI; ni++)                                                         \
                mma_bf16(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], bb[ni][0], bb[ni][1]);                  \
    }
template <int FMT, int TN = GN, bool SKIP = false, bool SILU = false>
__device__ void gemm_tile(const u8* w1, const u8* s1, float sc1, const u8* w2, const u8* s2, float sc2, int N1, int N,
                          int K, const bf16_t* X, size_t xlo, int ldx, const int* arow, const int* yrow, float* Y, int ldy,
                          int accumulate, int n0, size_t olo = 0) {
    static_assert(!SILU || TN == 64, "gate/up interleave: 64-wide tiles (128 measured no faster)");
    static_assert(TN == 64 || (TN == 128 && FMT == 1), "tile width");
    constexpr int NI = TN / 16;  // n8 blocks per warp (a warp covers TN / 2 outputs)
    // X tiles arrive by cp.async (no registers): two buffers, so step k+1's copies fly while step
    // k computes, when they fit the 48 KB of static shared memory with B (TN 64); else one.
    constexpr int NB = TN == 64 ? 2 : 1;
    __shared__ __align__(16) bf16_t As_s[NB][GM * GLD];
    __shared__ __align__(16) bf16_t Al_s[NB][GM * GLD];
    __shared__ __align__(16) bf16_t Bs[TN * GLD];
    bf16_t* const As = &As_s[0][0];
    bf16_t* const Al = &Al_s[0][0];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t = lane & 3;
    float acc[2][NI][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
    constexpr int AV = GM * GK / 8 / 128;                  // uint4 of X (hi, and lo) per thread (4)
    const bf16_t* XL = X + xlo;
    constexpr int TPR = 128 / TN;                          // NVFP4: threads per weight row (2 or 1)
    constexpr int BV = FMT == 0 ? TN * GK / 8 / 128 : 4 / TPR;  // uint4 (BF16) or 16-code blocks (NVFP4)
    constexpr int BR = FMT == 0 ? BV : 1;                  // weight rows this thread loads
    // B row pointers of this thread (fixed over K).
    const u8* brow[BR];
    const u8* srow[BR];
    bool bval[BR];
#pragma unroll
    for (int j = 0; j < BR; j++) {
        int row = FMT == 0 ? ((tid + 128 * j) / (GK / 8)) : (tid / TPR);
        int n = n0 + row;
        bval[j] = n < N;
        int nn = n < N1 ? n : n - N1;
        const u8* wb = n < N1 ? w1 : w2;
        const u8* sb = n < N1 ? s1 : s2;
        if (SILU) {
            constexpr int CW = TN / 2, HW = CW / 2;  // a warp's columns: HW gate rows, then HW up rows
            int q = row % CW, i = (n0 >> 1) + (row / CW) * HW + (q % HW);
            bval[j] = i < N1;
            nn = i;
            wb = q < HW ? w1 : w2;
            sb = q < HW ? s1 : s2;
        }
        if (!bval[j]) { nn = 0; wb = w1; sb = s1; }
        brow[j] = wb + (size_t)nn * (FMT == 0 ? (size_t)K * 2 : (size_t)K / 2);
        srow[j] = FMT == 1 ? sb + (size_t)nn * (K / 16) : nullptr;
    }
    // X rows of step k0 into A buffer `buf` (zero-filled for padding rows and past K), one group.
    // K % 8 != 0 comes with BF16 weights alone (NVFP4 widths are multiples of 16), so the element
    // copies are compiled out of the NVFP4 GEMMs: never taken there, their code still made the
    // prefill's expert GEMMs ~4 % slower (kernels/src/lib.rs tests the PTX).
    auto aload = [&](int k0, int buf) {
#pragma unroll
        for (int j = 0; j < AV; j++) {
            int idx = tid + 128 * j;
            int r = idx / (GK / 8), c = (idx % (GK / 8)) * 8;
            int ar = arow[r];
            bool ok = ar >= 0 && k0 + c < K;
            size_t off = ok ? (size_t)ar * ldx + k0 + c : 0;
            if (FMT == 0 && (K & 7)) {  // BF16 rows not 16-byte aligned: element copies, zeros past K
                bf16_t* ah = &As[buf * GM * GLD + r * GLD + c];
                bf16_t* al = &Al[buf * GM * GLD + r * GLD + c];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    bool in = ok && k0 + c + e < K;
                    ah[e] = in ? X[off + e] : (bf16_t)0;
                    al[e] = in ? XL[off + e] : (bf16_t)0;
                }
                continue;
            }
            cp_async16(&As[buf * GM * GLD + r * GLD + c], X + off, ok ? 16u : 0u);
            cp_async16(&Al[buf * GM * GLD + r * GLD + c], XL + off, ok ? 16u : 0u);
        }
        cp_async_commit();
    };
    // Weight loads of the next K step go to registers while the current step computes.
    uint4 rb4[FMT == 0 ? BV : 1];
    uint2 rbc[FMT == 1 ? BV : 1];
    u8 rbs[FMT == 1 ? BV : 1];
    auto gload = [&](int k0) {
        if (FMT == 0) {
#pragma unroll
            for (int j = 0; j < BV; j++) {
                int idx = tid + 128 * j;
                int c = (idx % (GK / 8)) * 8;
                rb4[j] = make_uint4(0, 0, 0, 0);
                if (K & 7) {  // element loads, zeros past K
                    const bf16_t* wr = reinterpret_cast<const bf16_t*>(brow[j]);
                    u32 q[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int k = k0 + c + 2 * e;
                        u32 lo = bval[j] && k < K ? wr[k] : 0u, hi = bval[j] && k + 1 < K ? wr[k + 1] : 0u;
                        q[e] = lo | (hi << 16);
                    }
                    rb4[j] = make_uint4(q[0], q[1], q[2], q[3]);
                } else if (bval[j] && k0 + c < K) {
                    rb4[j] = __ldg(reinterpret_cast<const uint4*>(brow[j] + (size_t)(k0 + c) * 2));
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < BV; j++) {
                int kb = k0 + 16 * ((tid % TPR) + TPR * j);
                rbc[j] = make_uint2(0, 0);
                rbs[j] = 0;
                if (bval[0] && kb < K) {
                    rbc[j] = __ldg(reinterpret_cast<const uint2*>(brow[0] + (kb >> 1)));
                    rbs[j] = srow[0][kb >> 4];
                }
            }
        }
    };
    auto sstore = [&]() {
        if (FMT == 0) {
#pragma unroll
            for (int j = 0; j < BV; j++) {
                int idx = tid + 128 * j;
                int r = idx / (GK / 8), c = (idx % (GK / 8)) * 8;
                *reinterpret_cast<uint4*>(&Bs[r * GLD + c]) = rb4[j];
            }
        } else {
            int r = tid / TPR;
#pragma unroll
            for (int j = 0; j < BV; j++) {
                int b = (tid % TPR) + TPR * j;
                u32 q[8];
                u32 sb = __float_as_uint(e4m3u(rbs[j])) >> 16;  // the scale as BF16 (exact)
                uint2 codes = rbc[j];
                e2m1x8_bf16(codes.x, sb | (sb << 16), q);
                e2m1x8_bf16(codes.y, sb | (sb << 16), q + 4);
                uint4* dst = reinterpret_cast<uint4*>(&Bs[r * GLD + 16 * b]);
                dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
                dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            }
        }
    };
    const bool wact = !SKIP || arow[wm * 32] >= 0;
    const bool wact1 = !SKIP || arow[wm * 32 + 16] >= 0;
    aload(0, 0);
    gload(0);
    for (int k0 = 0, it = 0; k0 < K; k0 += GK, it++) {
        const int buf = NB == 2 ? (it & 1) : 0;
        sstore();
        if (NB == 2) {
            if (k0 + GK < K) aload(k0 + GK, buf ^ 1);
            else cp_async_commit();
            cp_async_wait_group<1>();
        } else {
            cp_async_wait_group<0>();
        }
        if (k0 + GK < K) gload(k0 + GK);
        __syncthreads();
        const bf16_t* Ab = As + buf * GM * GLD;
        const bf16_t* Alb = Al + buf * GM * GLD;
        if (wact) {
            if (SKIP && !wact1) { GEMM_KSTEP(1) }
            else { GEMM_KSTEP(2) }
        }
        __syncthreads();
        if (NB == 1 && k0 + GK < K) aload(k0 + GK, 0);
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = wm * 32 + mi * 16 + g + 8 * h;
            int yr = yrow[r];
            if (yr < 0) continue;
            if (SILU) {
                bf16_t* op = reinterpret_cast<bf16_t*>(Y) + (size_t)yr * N1;
#pragma unroll
                for (int ni = 0; ni < NI / 2; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int i = (n0 >> 1) + wn * (TN / 4) + ni * 8 + 2 * t + e;
                        if (i >= N1) continue;
                        float gv = acc[mi][ni][2 * h + e] * sc1, uv = acc[mi][ni + NI / 2][2 * h + e] * sc2;
                        float v = silu_f(gv) * uv;
                        bf16_t hv = f2bf(v);
                        op[i] = hv;
                        op[olo + i] = f2bf(v - bf2f(hv));
                    }
                continue;
            }
            float* yp = Y + (size_t)yr * ldy;
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int n = n0 + wn * (TN / 2) + ni * 8 + 2 * t + e;
                    if (n >= N) continue;
                    float v = acc[mi][ni][2 * h + e] * (n < N1 ? sc1 : sc2);
                    yp[n] = accumulate ? yp[n] + v : v;
                }
        }
}

// Dense Linear over M rows. grid (ceil(N/64), ceil(M/64)), block 128.
template <int FMT>
__device__ void gemm_dense(const void* w, const u8* s, float inv_gs, const bf16_t* x, int ldx, float* y, int ldy, int M,
                           int N, int K, int accumulate) {
    __shared__ int arow[GM], yrow[GM];
    int m0 = blockIdx.y * GM;
    if (threadIdx.x < GM) {
        int r = m0 + threadIdx.x;
        arow[threadIdx.x] = r < M ? r : -1;
        yrow[threadIdx.x] = r < M ? r : -1;
    }
    __syncthreads();
    const u8* wb = reinterpret_cast<const u8*>(w);
    gemm_tile<FMT>(wb, s, inv_gs, wb, s, inv_gs, N, N, K, x, (size_t)M * K, K, arow, yrow, y, ldy, accumulate, blockIdx.x * GN);
}
extern "C" __global__ __launch_bounds__(128) void gemm_bf16(const void* w, const u8* s, float inv_gs, const bf16_t* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    gemm_dense<0>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
extern "C" __global__ __launch_bounds__(128) void gemm_fp4(const void* w, const u8* s, float inv_gs, const bf16_t* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    gemm_dense<1>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}

// Grouped experts. tiles[2*i] = group, tiles[2*i+1] = first slot of the tile inside the group;
// meta[1] = number of tiles (written by moe_group). grid (ceil(N/64), upper bound of tiles).
// gate_up: N = 2I (gate then up), gu[slot, 0..2I); down: N = H, out[slot, 0..H).
template <int FMT>
__device__ bool moe_tile_rows(const int* grp_start, const int* grp_count, const int* perm, const int* meta,
                              const int* tiles, int adiv, int* arow, int* yrow, int* g_out) {
    int ti = blockIdx.y;
    if (ti >= meta[1]) return false;
    int g = tiles[2 * ti], off = tiles[2 * ti + 1];
    int st = grp_start[g], cn = grp_count[g];
    if (threadIdx.x < GM) {
        int r = off + threadIdx.x;
        int slot = r < cn ? perm[st + r] : -1;
        arow[threadIdx.x] = slot >= 0 ? slot / adiv : -1;
        yrow[threadIdx.x] = slot;
    }
    __syncthreads();
    *g_out = g;
    return true;
}
template <int FMT, int TN = GN, bool SKIP = false, bool SILU = false>
__device__ void moe_gemm_gate_up(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                 const float* uinv, const bf16_t* x, size_t xlo, int H, int I, int KK, const int* grp_expert,
                                 const int* grp_start, const int* grp_count, const int* perm, const int* meta,
                                 const int* tiles, float* gu, size_t olo = 0) {
    __shared__ int arow[GM], yrow[GM];
    int g;
    if (!moe_tile_rows<FMT>(grp_start, grp_count, perm, meta, tiles, KK, arow, yrow, &g)) return;
    int e = grp_expert[g];
    size_t wstride = FMT == 0 ? (size_t)I * H * 2 : (size_t)I * H / 2;
    size_t sstride = (size_t)I * (H / 16);
    const u8* gwe = reinterpret_cast<const u8*>(gw) + e * wstride;
    const u8* uwe = reinterpret_cast<const u8*>(uw) + e * wstride;
    const u8* gse = FMT == 1 ? gs + e * sstride : nullptr;
    const u8* use = FMT == 1 ? us + e * sstride : nullptr;
    float gi = FMT == 1 ? ginv[e] : 1.f, ui = FMT == 1 ? uinv[e] : 1.f;
    gemm_tile<FMT, TN, SKIP, SILU>(gwe, gse, gi, uwe, use, ui, I, 2 * I, H, x, xlo, H, arow, yrow, gu, 2 * I, 0, blockIdx.x * TN, olo);
}
template <int FMT, int TN = GN, bool SKIP = false>
__device__ void moe_gemm_down(const void* dw, const u8* ds, const float* dinv, const bf16_t* act, size_t xlo, int H, int I,
                              const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                              const int* meta, const int* tiles, float* out) {
    __shared__ int arow[GM], yrow[GM];
    int g;
    if (!moe_tile_rows<FMT>(grp_start, grp_count, perm, meta, tiles, 1, arow, yrow, &g)) return;
    int e = grp_expert[g];
    size_t wstride = FMT == 0 ? (size_t)H * I * 2 : (size_t)H * I / 2;
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = FMT == 1 ? ds + e * (size_t)H * (I / 16) : nullptr;
    float di = FMT == 1 ? dinv[e] : 1.f;
    gemm_tile<FMT, TN, SKIP>(dwe, dse, di, dwe, dse, di, H, H, I, act, xlo, I, arow, yrow, out, H, 0, blockIdx.x * TN);
}
extern "C" __global__ __launch_bounds__(128) void moe_gemm_gate_up_bf16(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                                 const float* uinv, const bf16_t* x, size_t xlo, int H, int I, int KK, const int* ge,
                                                 const int* gst, const int* gc, const int* perm, const int* meta,
                                                 const int* tiles, float* gu) { PDL_ENTRY();
    moe_gemm_gate_up<0>(gw, gs, ginv, uw, us, uinv, x, xlo, H, I, KK, ge, gst, gc, perm, meta, tiles, gu);
}
extern "C" __global__ __launch_bounds__(128) void moe_gemm_down_bf16(const void* dw, const u8* ds, const float* dinv, const bf16_t* act, size_t xlo, int H, int I,
                                              const int* ge, const int* gst, const int* gc, const int* perm,
                                              const int* meta, const int* tiles, float* out) { PDL_ENTRY();
    moe_gemm_down<0>(dw, ds, dinv, act, xlo, H, I, ge, gst, gc, perm, meta, tiles, out);
}
#define MOE_GU_PARAMS const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us, const float* uinv, \
    const bf16_t* x, size_t xlo, int H, int I, int KK, const int* ge, const int* gst, const int* gc, const int* perm, \
    const int* meta, const int* tiles, float* gu
#define MOE_GU_ARGS gw, gs, ginv, uw, us, uinv, x, xlo, H, I, KK, ge, gst, gc, perm, meta, tiles, gu
#define MOE_DN_PARAMS const void* dw, const u8* ds, const float* dinv, const bf16_t* act, size_t xlo, int H, int I, \
    const int* ge, const int* gst, const int* gc, const int* perm, const int* meta, const int* tiles, float* out
#define MOE_DN_ARGS dw, ds, dinv, act, xlo, H, I, ge, gst, gc, perm, meta, tiles, out
// The NVFP4 expert GEMMs: padding skipped (SKIP), gate/up with the SiLU epilogue, down with
// 128-wide tiles.
extern "C" __global__ __launch_bounds__(128, 4) void moe_gemm_gate_up_fp4_silu(MOE_GU_PARAMS, size_t olo) { PDL_ENTRY();
    moe_gemm_gate_up<1, 64, true, true>(MOE_GU_ARGS, olo);
}
extern "C" __global__ __launch_bounds__(128) void moe_gemm_down_fp4_wide(MOE_DN_PARAMS) { PDL_ENTRY(); moe_gemm_down<1, 128, true>(MOE_DN_ARGS); }

// Tensor-core GEMV for the weight-streaming regime (decode steps and DFlash propose/verify, any
// pass below gemm_min_rows): y[m, n] (+)= sum_k W[n, k] x[m, k], W BF16 [N, K], x f32 split into
// BF16 hi + lo on the fly. A warp owns 16 output rows and one 8-column tile of activation rows
// (mma m16n8k16: W is the A operand, x^T the B operand); lane (g, t) loads 8 consecutive weights
// of rows g and g+8 and the same 8 inputs of activation row g per 32-wide K tile (the k order
// inside a tile is permuted identically for A and B, so the sum is unchanged). The block's S
// warps split the K tiles round-robin and their partial tiles are added in warp order. Every
// output element's arithmetic depends only on (N, K), never on M or on the other rows: a row
// decoded alone and the same row verified with k others are bit-identical.
// grid ceil(N / 16) x ceil(M / 8) (one dimension, the row tile fastest), block 32 * S (S = 2 .. 16). Needs K % 32 == 0.
// A lane's weight fragments of linear_tc_bf16 for weight tile nb (16 rows from 16 nb):
// the 16 bytes of rows g and g + 8 (g = lane / 4) at K 32 kt + 8 (lane % 4) of K tile kt, read
// from the row-major matrix or (tl) from tile_bf16's tile-interleaved copy of it.
struct TcTile {
    const bf16_t *wa, *wb, *wt;
    __device__ __forceinline__ TcTile(const bf16_t* w, int N, int K, int lane, int nb) {
        int n0 = nb * 16, g = lane >> 2, t = lane & 3;
        wa = w + (size_t)min(n0 + g, N - 1) * K + 8 * t;
        wb = w + (size_t)min(n0 + g + 8, N - 1) * K + 8 * t;
        wt = w + (size_t)nb * (K >> 5) * 512 + 8 * lane;
    }
    // NA: the tile-interleaved loads skip L1 (ldg_na; read_tc_pattern's do not).
    template <bool NA = false>
    __device__ __forceinline__ void ld(bool tl, int kt, uint4& a0, uint4& a1) const {
        if (tl) {
            a0 = ldg_w<NA>(reinterpret_cast<const uint4*>(wt + (size_t)kt * 512));
            a1 = ldg_w<NA>(reinterpret_cast<const uint4*>(wt + (size_t)kt * 512 + 256));
        } else {
            a0 = __ldg(reinterpret_cast<const uint4*>(wa + (size_t)kt * 32));
            a1 = __ldg(reinterpret_cast<const uint4*>(wb + (size_t)kt * 32));
        }
    }
};
// One 32-wide K tile of linear_tc_bf16: a lane's 8 inputs split into BF16 hi + lo, four mma on
// its weight fragments a0 (row g) and a1 (row g + 8). Step 0: actual k 8t+0..3; step 1: 8t+4..7
// (slots 2t,2t+1 <- +0,+1; 2t+8,2t+9 <- +2,+3).
__device__ __forceinline__ void tc_tile_mma(float* c, uint4 a0, uint4 a1, float4 x0, float4 x1) {
    float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    u32 hi[4], lo[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        hi[i] = bf2_pack(xs[2 * i], xs[2 * i + 1]);
        lo[i] = bf2_pack(xs[2 * i] - bflo(hi[i]), xs[2 * i + 1] - bfhi(hi[i]));
    }
    mma_bf16(c, a0.x, a1.x, a0.y, a1.y, hi[0], hi[1]);
    mma_bf16(c, a0.x, a1.x, a0.y, a1.y, lo[0], lo[1]);
    mma_bf16(c, a0.z, a1.z, a0.w, a1.w, hi[2], hi[3]);
    mma_bf16(c, a0.z, a1.z, a0.w, a1.w, lo[2], lo[3]);
}
// TILED (linear_tc_bf16_tiled[_argmax], _tiled_row[_silu]): linear_tc_bf16 reading its weight
// fragments from the tile-interleaved copy tile_bf16 writes (each 16-row x 32-K tile one
// contiguous 1 KB piece, lane l's 16 bytes at 16 l and 512 + 16 l: a warp's load is 512
// contiguous bytes instead of 64 bytes of 8 rows), by loads that do not allocate in L1 (ldg_na:
// the weights are read once, the activations by every block of an SM, so the L1 is theirs), and
// with no branch inside a round: every slot's activations are loaded (a clamped K tile) by
// volatile loads, zeroed where the slot is past K or the row past M, and a slot past K
// multiplies zero weights (adds +0), so a round's weight and activation loads all go out before
// its first mma (which waits on the round's weights from DRAM). The same values in the same
// fragments, the same products and sums in the same order, so the same bits (kernels/emu).
// ROW 1 (linear_tc_bf16_tiled_row): one activation row (M == 1, K <= 16 x blockDim) at 16 warps a
// block (N <= 2048: o_proj and the MLP down, one block an SM, so up to 128 registers a thread cost
// no occupancy), with two rounds of weight loads in flight a warp: round r + 2's loads go out as
// soon as round r's mma have read its registers, so the DRAM holds a warp's next round while the
// warp computes this one (the multi-row form: round r + 1's loads after round r's mma, one round
// in flight and a bubble a round). The row is staged in shared memory once, while the first two
// rounds' weights (asked for before the PDL wait) arrive. The same tiles in the same order, the
// same products and sums: the same bits.
// ROW 2 (linear_tc_bf16_tiled_row_silu): ROW 1 for a dense MLP's one-row down projection reading
// the gate | up row (x: gate at [0, K), up at [K, 2K)) and staging silu_mul's SiLU(gate) * up (the
// same expression) as its row, so no silu_mul launch precedes it. The same bits as silu_mul +
// linear_tc_bf16_tiled_row.
// AM (linear_tc_bf16_tiled_argmax): linear_tc_bf16_tiled for the lm_head of a greedy pass, each
// block also folding its 16 outputs of every row into the row's argmax slot (amax_key: the largest
// value, among equal ones the lowest index) by one 64-bit atomicMax a row, whose result nobody
// waits for; argmax_fin then decodes the slots. The same logits (the same arithmetic and stores)
// and the same token as argmax_rows_split over them, one launch and its read of the logits fewer.
template <bool TILED, int ROW = 0, bool AM = false>
__device__ __forceinline__ void linear_tc_bf16_t(const void* wv, const float* x, int ldx, float* y, int ldy, int M, int N,
                                                 int K, int accumulate, unsigned long long* amax = nullptr) {
    __shared__ __align__(16) float red[16][32][4];
    const bf16_t* w = reinterpret_cast<const bf16_t*>(wv);
    int S = blockDim.x >> 5;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // A one-dimensional grid of ceil(N / 16) x ceil(M / 8) blocks, a weight tile's row tiles
    // neighbours (row tile fastest): they run at the same time and the weights come from DRAM
    // once, the other row tiles' loads hitting L2 (with the row tiles in grid.y a pass of more
    // than 8 rows streamed a matrix larger than L2 from DRAM once per 8 rows).
    int mt = (M + 7) >> 3, nb = (int)(blockIdx.x / mt);
    int n0 = nb * 16, m0 = (int)(blockIdx.x % mt) * 8;
    TcTile wtile(w, N, K, lane, nb);
    bool xv = m0 + g < M;
    const float* xr = x + (size_t)(xv ? m0 + g : 0) * ldx + 8 * t;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    int nk = K >> 5;
    // Four K tiles of loads in flight per lane before their mma (tiles kt0, kt0+S, ...: the same
    // order as one tile at a time). The first four tiles' weights are loaded before the PDL wait
    // (ROW: the first eight, two rounds).
    uint4 A0[4], A1[4], B0[4], B1[4];
    auto ldw = [&](uint4* P0, uint4* P1, int kt0) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int kt = kt0 + u * S;
            if (kt < nk) wtile.ld<TILED>(TILED, kt, P0[u], P1[u]);
        }
    };
    ldw(A0, A1, warp);
    if (ROW && warp + 4 * S < nk) ldw(B0, B1, warp + 4 * S);
    PDL_ENTRY();
    if constexpr (ROW != 0) {
        __shared__ __align__(16) float xsh[8192];
        // The activation row (M == 1) into shared memory: one L2 round trip for the block (all of
        // a thread's loads before its stores; K <= 16 x blockDim, the host's 512 threads).
        {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int i = 4 * ((int)threadIdx.x + j * (int)blockDim.x);
                v[j] = i >= K ? make_float4(0.f, 0.f, 0.f, 0.f) : ldg_v(reinterpret_cast<const float4*>(x + i));
            }
            if constexpr (ROW == 2) {
                // x is a gate | up row (K each); the row is silu_mul's SiLU(gate) * up.
                float4 u[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int i = 4 * ((int)threadIdx.x + j * (int)blockDim.x);
                    u[j] = i < K ? ldg_v(reinterpret_cast<const float4*>(x + K + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int j = 0; j < 4; j++)
                    v[j] = make_float4(silu_f(v[j].x) * u[j].x, silu_f(v[j].y) * u[j].y, silu_f(v[j].z) * u[j].z,
                                       silu_f(v[j].w) * u[j].w);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int i = 4 * ((int)threadIdx.x + j * (int)blockDim.x);
                if (i < K) *reinterpret_cast<float4*>(xsh + i) = v[j];
            }
        }
        __syncthreads();
        const float* xq = xsh + 8 * t;
        // One round (tiles kt0 + u S, u < 4) on the weights in P: TILED's arithmetic (slots past K
        // multiply zeros, lanes of rows past M zeros).
        auto round = [&](uint4* P0, uint4* P1, int kt0) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int kt = kt0 + u * S;
                bool on = kt < nk;
                int kc = min(kt, nk - 1) * 32;
                float4 a = *reinterpret_cast<const float4*>(xq + kc);
                float4 b = *reinterpret_cast<const float4*>(xq + kc + 4);
                float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
                a = on && xv ? a : z;
                b = on && xv ? b : z;
                uint4 zu = make_uint4(0u, 0u, 0u, 0u);
                uint4 p0 = on ? P0[u] : zu, p1 = on ? P1[u] : zu;
                tc_tile_mma(c, p0, p1, a, b);
            }
        };
        for (int kt0 = warp; kt0 < nk; kt0 += 8 * S) {
            round(A0, A1, kt0);
            if (kt0 + 8 * S < nk) ldw(A0, A1, kt0 + 8 * S);
            if (kt0 + 4 * S < nk) {
                round(B0, B1, kt0 + 4 * S);
                if (kt0 + 12 * S < nk) ldw(B0, B1, kt0 + 12 * S);
            }
        }
    } else {
        for (int kt0 = warp; kt0 < nk; kt0 += 4 * S) {
            if (kt0 != warp) ldw(A0, A1, kt0);
            float4 X0[4], X1[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int kt = kt0 + u * S;
                size_t k = (size_t)kt * 32;
                X0[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                X1[u] = X0[u];
                if (TILED) {
                    size_t kc = (size_t)min(kt, nk - 1) * 32;
                    float4 a = ldg_v(reinterpret_cast<const float4*>(xr + kc));
                    float4 b = ldg_v(reinterpret_cast<const float4*>(xr + kc + 4));
                    bool on = kt < nk && xv;
                    X0[u] = on ? a : X0[u];
                    X1[u] = on ? b : X1[u];
                    if (kt >= nk) {
                        A0[u] = make_uint4(0u, 0u, 0u, 0u);
                        A1[u] = A0[u];
                    }
                } else if (kt < nk) {
                    if (xv) {
                        X0[u] = __ldg(reinterpret_cast<const float4*>(xr + k));
                        X1[u] = __ldg(reinterpret_cast<const float4*>(xr + k + 4));
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (!TILED && kt0 + u * S >= nk) break;
                tc_tile_mma(c, A0[u], A1[u], X0[u], X1[u]);
            }
        }
    }
    *reinterpret_cast<float4*>(red[warp][lane]) = make_float4(c[0], c[1], c[2], c[3]);
    __syncthreads();
    if (warp != 0) return;
    // The four sums side by side (a warp's four values one 16-byte load), each in warp order as
    // before: four independent add chains instead of one after the other.
    {
        float4 v = *reinterpret_cast<const float4*>(red[0][lane]);
        for (int ww = 1; ww < S; ww++) {
            float4 r = *reinterpret_cast<const float4*>(red[ww][lane]);
            v.x += r.x;
            v.y += r.y;
            v.z += r.z;
            v.w += r.w;
        }
        c[0] = v.x;
        c[1] = v.y;
        c[2] = v.z;
        c[3] = v.w;
    }
    // c0: (row g, col 2t), c1: (g, 2t+1), c2: (g+8, 2t), c3: (g+8, 2t+1).
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int n = n0 + g + (i >= 2 ? 8 : 0), m = m0 + 2 * t + (i & 1);
        if (n < N && m < M) {
            float* o = y + (size_t)m * ldy + n;
            float v = accumulate ? *o + c[i] : c[i];
            *o = v;
            if (AM) c[i] = v;
        }
    }
    if constexpr (AM) {
        // Row m0 + 2t + j: this lane's outputs g and g + 8 (c[j], c[2 + j]), then the largest
        // key over the 8 lanes of the same t (lane bits 2-4), folded by lane t.
#pragma unroll
        for (int j = 0; j < 2; j++) {
            unsigned long long kb = 0ull;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int n = n0 + g + 8 * hh;
                kb = u64_max(kb, n < N ? amax_key(c[2 * hh + j], n) : 0ull);
            }
            kb = u64_max(kb, __shfl_xor_sync(0xffffffffu, kb, 4));
            kb = u64_max(kb, __shfl_xor_sync(0xffffffffu, kb, 8));
            kb = u64_max(kb, __shfl_xor_sync(0xffffffffu, kb, 16));
            int m = m0 + 2 * t + j;
            if (g == 0 && m < M && kb != 0ull) atomicMax(amax + m, kb);
        }
    }
}
extern "C" __global__ void linear_tc_bf16(const void* wv, const u8* s_unused, float inv_gs, const float* x, int ldx,
                                          float* y, int ldy, int M, int N, int K, int accumulate) {
    linear_tc_bf16_t<false>(wv, x, ldx, y, ldy, M, N, K, accumulate);
}
extern "C" __global__ __maxnreg__(88) void linear_tc_bf16_tiled(const void* wv, const u8* s_unused, float inv_gs, const float* x,
                                                               int ldx, float* y, int ldy, int M, int N, int K, int accumulate) {
    linear_tc_bf16_t<true>(wv, x, ldx, y, ldy, M, N, K, accumulate);
}
// amax: a zeroed slot a row (argmax_fin zeroes them again).
extern "C" __global__ __maxnreg__(88) void linear_tc_bf16_tiled_argmax(const void* wv, const u8* s_unused, float inv_gs,
                                                                const float* x, int ldx, float* y, int ldy, int M, int N,
                                                                int K, int accumulate, unsigned long long* amax) {
    linear_tc_bf16_t<true, 0, true>(wv, x, ldx, y, ldy, M, N, K, accumulate, amax);
}
extern "C" __global__ __launch_bounds__(512, 1) void linear_tc_bf16_tiled_row(const void* wv, const u8* s_unused, float inv_gs,
                                                                        const float* x, int ldx, float* y, int ldy, int M,
                                                                        int N, int K, int accumulate) {
    linear_tc_bf16_t<true, 1>(wv, x, ldx, y, ldy, M, N, K, accumulate);
}
extern "C" __global__ __launch_bounds__(512, 1) void linear_tc_bf16_tiled_row_silu(const void* wv, const u8* s_unused, float inv_gs,
                                                                         const float* x, int ldx, float* y, int ldy, int M,
                                                                         int N, int K, int accumulate) {
    linear_tc_bf16_t<true, 2>(wv, x, ldx, y, ldy, M, N, K, accumulate);
}
// W [N, K] BF16 row-major -> the tile-interleaved copy linear_tc_bf16_tiled* read: tile (row group
// rg, K tile kt) at ((rg * K / 32) + kt) * 512 elements, lane l's 8 elements (row 16 rg + l / 4,
// K 32 kt + 8 (l % 4) ..) at 8 l and those of row + 8 at 256 + 8 l; rows past N repeat row N - 1
// (what linear_tc_bf16 loads for them). grid (ceil(N / 16), K / 32), block 32. K % 32 == 0.
extern "C" __global__ void tile_bf16(const bf16_t* w, bf16_t* dst, int N, int K) {
    PDL_ENTRY();
    int rg = blockIdx.x, kt = blockIdx.y, lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    int nk = K >> 5;
    const bf16_t* a = w + (size_t)min(rg * 16 + g, N - 1) * K + kt * 32 + 8 * t;
    const bf16_t* b = w + (size_t)min(rg * 16 + g + 8, N - 1) * K + kt * 32 + 8 * t;
    bf16_t* o = dst + ((size_t)rg * nk + kt) * 512 + 8 * lane;
    *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(a);
    *reinterpret_cast<uint4*>(o + 256) = *reinterpret_cast<const uint4*>(b);
}
// Diagnostic (laguna-dev kbench): linear_tc_bf16's weight loads alone, the same grid, block, rounds
// of four K tiles a lane and (tiled 0) addresses: 64 bytes of each of 16 rows a warp load; with
// tiled 1 each (16-row group, K tile) is read as one contiguous 1 KB piece (512 bytes a load), the
// order a tile-interleaved weight layout would give. Words folded by XOR, nothing computed.
extern "C" __global__ void read_tc_pattern(const void* wv, int N, int K, unsigned* out, int tiled) {
    PDL_ENTRY();
    const bf16_t* w = reinterpret_cast<const bf16_t*>(wv);
    int S = blockDim.x >> 5;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nk = K >> 5;
    TcTile wtile(w, N, K, lane, blockIdx.x);
    unsigned acc = 0;
    for (int kt0 = warp; kt0 < nk; kt0 += 4 * S) {
        uint4 A0[4], A1[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int kt = kt0 + u * S;
            A0[u] = make_uint4(0u, 0u, 0u, 0u);
            A1[u] = A0[u];
            if (kt < nk) wtile.ld(tiled, kt, A0[u], A1[u]);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= A0[u].x ^ A0[u].y ^ A0[u].z ^ A0[u].w ^ A1[u].x ^ A1[u].y ^ A1[u].z ^ A1[u].w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
// Read-only streaming of n uint4 (the practical read roofline for a kernel of the same size):
// each thread sums its words, one value per block is written. grid-stride, 4 loads in flight.
extern "C" __global__ void read_u4(const uint4* src, size_t n, unsigned* out) {
    PDL_ENTRY();
    unsigned acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * st < n; i += 4 * st) {
        uint4 a = __ldg(src + i), b = __ldg(src + i + st), c = __ldg(src + i + 2 * st), d = __ldg(src + i + 3 * st);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += st) {
        uint4 a = __ldg(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
