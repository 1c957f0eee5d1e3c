// Dense Linear y[m, n] (+)= sum_k W[n, k] x[m, k]: BF16 or NVFP4 weights, f32 activations,
// f32 accumulation. One warp per output row n, MR activation rows per pass (weights are read once
// per pass). A row's result never depends on how many rows are in the batch.
template <int FMT, int LIN_MR>
__device__ void linear_impl(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy,
                            int M, int N, int K, int accumulate) {
    int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    int m0 = blockIdx.y * LIN_MR;  // grid.y = ceil(M / LIN_MR)
    int nr = min(LIN_MR, M - m0);
    if (nr <= 0) return;
    const float* xr[LIN_MR];
#pragma unroll
    for (int r = 0; r < LIN_MR; r++) xr[r] = x + (size_t)(m0 + (r < nr ? r : 0)) * ldx;
    float acc[LIN_MR];
    row_dot<FMT, LIN_MR>(w, s, inv_gs, n, K, xr, nr, acc);
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < LIN_MR; r++) {
        if (r < nr && lane == r) {
            float* o = y + (size_t)(m0 + r) * ldy + n;
            *o = accumulate ? *o + acc[r] : acc[r];
        }
    }
}
extern "C" __global__ void linear_bf16(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) {
    linear_impl<0, 8>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
extern "C" __global__ void linear_fp4(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) {
    linear_impl<1, 8>(w, s, inv_gs, x, ldx, y, ldy, M, N, K, acc);
}
// Single-row forms (M == 1): x is staged once per block in shared memory (dynamic, K floats) and
// each warp computes rows 2w, 2w+1 with both weight streams in flight. Per-row arithmetic is the
// same as the batched form (same lane split, same order), so results are identical.
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
extern "C" __global__ void linear_bf16_1(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) {
    linear1_impl<0>(w, s, inv_gs, x, y, N, K, acc);
}
extern "C" __global__ void linear_fp4_1(const void* w, const u8* s, float inv_gs, const float* x, int ldx, float* y, int ldy, int M, int N, int K, int acc) {
    linear1_impl<1>(w, s, inv_gs, x, y, N, K, acc);
}
// y[m, i] = silu(g[m, i]) * u[m, i]  (gate and up side by side: gu[m, 0..I) gate, gu[m, I..2I) up)
extern "C" __global__ void silu_mul(const float* gu, float* y, int M, int I) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int m = blockIdx.y;
    if (i >= I) return;
    float g = gu[(size_t)m * 2 * I + i], u = gu[(size_t)m * 2 * I + I + i];
    y[(size_t)m * I + i] = silu_f(g) * u;
}
