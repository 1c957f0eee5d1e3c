// Dense Linear y[m, n] (+)= sum_k W[n, k] x[m, k] on CUDA cores: BF16 (any K) or NVFP4
// (K % 16 == 0) weights, f32 activations, f32 accumulation (`linear_{bf16,fp4}_{1,m8,m16}`). A
// row's result never depends on how many rows are in the batch: every form runs row_dot's
// arithmetic (common.cuh) per (output row, activation row).
// Single-row forms (M == 1): x is staged once per block in shared memory (dynamic, K floats) and
// each warp computes rows 2w, 2w+1 with both weight streams in flight (row_dot2: the same lane
// split, the same order).
template <int FMT>
__device__ void linear1_impl(const void* w, const u8* s, float inv_gs, const float* x, float* y, int N, int K, int accumulate) {
    extern __shared__ float xs[];
    for (int i = threadIdx.x; i < K; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    int n = 2 * (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    if (n >= N) return;
    const float* xr[1] = {xs};
    float a[1], b[1];
    if (n + 1 < N) {
        const void* w2 = FMT == 0 ? (const void*)(reinterpret_cast<const bf16_t*>(w) + K) : (const void*)(reinterpret_cast<const u8*>(w) + (K >> 1));
        const u8* s2 = FMT == 1 ? s + (K >> 4) : s;
        row_dot2<FMT, 1>(w, s, inv_gs, w2, s2, inv_gs, n, K, xr, 1, a, b);
    } else {
        row_dot<FMT, 1>(w, s, inv_gs, n, K, xr, 1, a);
    }
    int lane = threadIdx.x & 31;
    if (lane == 0) y[n] = accumulate ? y[n] + a[0] : a[0];
    if (lane == 1 && n + 1 < N) y[n + 1] = accumulate ? y[n + 1] + b[0] : b[0];
}
extern "C" __global__ void linear_bf16_1(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear1_impl<0>(w, s, inv_gs, x, y, N, K, acc);
}
extern "C" __global__ void linear_fp4_1(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear1_impl<1>(w, s, inv_gs, x, y, N, K, acc);
}
// Small-M forms (verify passes of 2..16 rows): one warp per NR output rows, MR activation rows per
// pass, so each activation fragment loaded serves NR weight rows and each weight byte MR rows.
// Per (output row, activation row) the arithmetic is exactly row_dot's (same lane blocks, same
// 16-term fmaf order, same block accumulation and warp_sum), so a row verified with k others is
// bit-identical to the row decoded alone by the _1 kernels. NR * MR == 32: lane j*MR+r writes.
template <int FMT, int NR, int MR>
__device__ void linear_m_impl(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy,
                              int M, int N, int K, int accumulate) {
    // A one-dimensional grid, a block's row tiles neighbours (row tile fastest), as
    // linear_tc_bf16_t's: the weights come from DRAM once a pass whatever its rows.
    int mt = (M + MR - 1) / MR;
    int n0 = ((int)(blockIdx.x / mt) * (blockDim.x >> 5) + (threadIdx.x >> 5)) * NR;
    if (n0 >= N) return;
    int m0 = (int)(blockIdx.x % mt) * MR;
    int nr = min(MR, M - m0);
    if (nr <= 0) return;
    int lane = threadIdx.x & 31;
    int nblk = K >> 4;
    float acc[NR][MR];
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int r = 0; r < MR; r++) acc[j][r] = 0.f;
    const float* x0 = x + (size_t)m0 * ldx;
    // Weights stay packed in registers (few registers, high occupancy), unpacked per use; the
    // next block's weights are loaded before this block's arithmetic (software pipelining).
    uint4 pa[NR], pb[NR];
    float sc[NR];
    auto load = [&](int b, uint4* qa, uint4* qb, float* qs) {
#pragma unroll
        for (int j = 0; j < NR; j++) {
            int n = min(n0 + j, N - 1);
            if (FMT == 0) {
                const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const bf16_t*>(w) + (size_t)n * K + (size_t)b * 16);
                qa[j] = __ldg(p);
                qb[j] = __ldg(p + 1);
                qs[j] = 1.f;
            } else {
                const u8* prow = reinterpret_cast<const u8*>(w) + (size_t)n * (K >> 1);
                uint2 c = __ldg(reinterpret_cast<const uint2*>(prow + (size_t)b * 8));
                qa[j] = make_uint4(c.x, c.y, 0u, 0u);
                qb[j] = make_uint4(0u, 0u, 0u, 0u);
                qs[j] = e4m3u(__ldg(s + (size_t)n * nblk + b));
            }
        }
    };
    if (FMT == 0 && (K & 15)) {
        // A width K % 16 != 0: rows are not 16-byte aligned; element loads, zeros past K, each
        // block's products in the order of the aligned loop below (= row_dot's tail).
        for (int b = lane; b < (K + 15) >> 4; b += 32) {
#pragma unroll
            for (int j = 0; j < NR; j++) {
                float wv[16];
                w16_bf16_tail(reinterpret_cast<const bf16_t*>(w) + (size_t)min(n0 + j, N - 1) * K, b, K, wv);
#pragma unroll
                for (int r = 0; r < MR; r++)
                    if (r < nr) acc[j][r] += dot16_tail(wv, x0 + (size_t)r * ldx, b, K);
            }
        }
        nblk = 0;  // the aligned loop below does nothing
    }
    if (lane < nblk) load(lane, pa, pb, sc);
    for (int b = lane; b < nblk; b += 32) {
        uint4 na[NR], nb[NR];
        float ns[NR];
        if (b + 32 < nblk) load(b + 32, na, nb, ns);
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < nr) {
                const float4* xp = reinterpret_cast<const float4*>(x0 + (size_t)r * ldx + b * 16);
                float4 v0 = __ldg(xp), v1 = __ldg(xp + 1), v2 = __ldg(xp + 2), v3 = __ldg(xp + 3);
                float xv[16] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
#pragma unroll
                for (int j = 0; j < NR; j++) {
                    float t = 0.f;
                    if (FMT == 0) {
                        u32 q[8] = {pa[j].x, pa[j].y, pa[j].z, pa[j].w, pb[j].x, pb[j].y, pb[j].z, pb[j].w};
#pragma unroll
                        for (int e = 0; e < 8; e++) {
                            t = fmaf(bflo(q[e]), xv[2 * e], t);
                            t = fmaf(bfhi(q[e]), xv[2 * e + 1], t);
                        }
                        acc[j][r] += t;
                    } else {
                        u32 c2[2] = {pa[j].x, pa[j].y};
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                u32 q = (c2[h] >> (8 * i)) & 0xffu;
                                t = fmaf(e2m1(q & 15u), xv[8 * h + 2 * i], t);
                                t = fmaf(e2m1(q >> 4), xv[8 * h + 2 * i + 1], t);
                            }
                        acc[j][r] = fmaf(t, sc[j], acc[j][r]);
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NR; j++) {
            pa[j] = na[j];
            pb[j] = nb[j];
            sc[j] = ns[j];
        }
    }
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int r = 0; r < MR; r++) {
            float v = warp_sum(acc[j][r]);
            if (FMT == 1) v *= inv_gs;
            if (lane == j * MR + r && r < nr && n0 + j < N) {
                float* o = y + (size_t)(m0 + r) * ldy + n0 + j;
                *o = accumulate ? *o + v : v;
            }
        }
}
extern "C" __global__ void linear_bf16_m8(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear_m_impl<0, 2, 8>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
extern "C" __global__ void linear_fp4_m8(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear_m_impl<1, 2, 8>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
extern "C" __global__ void linear_bf16_m16(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear_m_impl<0, 2, 16>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
extern "C" __global__ void linear_fp4_m16(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) { PDL_ENTRY();
    linear_m_impl<1, 2, 16>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
// y[m, i] = silu(g[m, i]) * u[m, i]  (gate and up side by side: gu[m, 0..I) gate, gu[m, I..2I) up)
// grid (ceil(I / blockDim), min(M, 65535)): rows beyond gridDim.y loop (expert slots of a long
// prefill pass exceed the grid's y limit).
extern "C" __global__ void silu_mul(const float* gu, float* y, int M, int I) { PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        float g = gu[(size_t)m * 2 * I + i], u = gu[(size_t)m * 2 * I + I + i];
        y[(size_t)m * I + i] = silu_f(g) * u;
    }
}
// silu_mul for a GEMM consumer: writes only the BF16 hi / lo split of y (xs [M, I] hi, then lo at
// xs + M * I; lo skipped when lo == 0), the values split_bf16 would make of y.
extern "C" __global__ void silu_mul_split(const float* gu, bf16_t* xs, int M, int I, int lo) { PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        float g = gu[(size_t)m * 2 * I + i], u = gu[(size_t)m * 2 * I + I + i];
        float v = silu_f(g) * u;
        bf16_t h = f2bf(v);
        xs[(size_t)m * I + i] = h;
        if (lo) xs[(size_t)M * I + (size_t)m * I + i] = f2bf(v - bf2f(h));
    }
}
