// Embedding gather, RMSNorm (optionally over selected rows), residual helpers.
// The last launch of a decode step (`decode_step_body`): each row's token (amax[r], as greedy_rows /
// sample_rows left it) stored into slot (*ctr % slots) of a ring in mapped pinned host memory,
// which the host reads after the step's event without a copy in the stream; then the step's
// metadata advanced for the same rows stepping once more, fed on the device: pos[r] + 1 and token
// id -1 - r (embed reads row r of amax). The host uploads tokens and positions itself whenever the
// next step is not that. *ctr counts the steps (the host keeps the same count). One block, n <=
// blockDim.x.
extern "C" __global__ void decode_advance(int n, const int* amax, int* ring, unsigned* ctr, int slots, int stride,
                                          int* tokens, int* pos) { PDL_ENTRY();
    __shared__ unsigned c;
    if (threadIdx.x == 0) c = *ctr;
    __syncthreads();
    int r = threadIdx.x;
    if (r < n) {
        ring[(size_t)(c % (unsigned)slots) * stride + r] = amax[r];
        pos[r] += 1;
        tokens[r] = -1 - r;
    }
    __syncthreads();
    if (threadIdx.x == 0) *ctr = c + 1;
}
// A token id -1 - j stands for the token row j of the previous decode step drew, still in `feed`
// (sc.amax): a pipelined step is queued before the host has read that token back.
// The token of row m.
__device__ __forceinline__ size_t embed_token(const int* tokens, const int* feed, int m) {
    int tm = tokens[m];
    return (size_t)(tm < 0 ? feed[-1 - tm] : tm);
}
// y[r] = w * x[rows[r]] / sqrt(mean(x^2) + eps); rows == nullptr means r itself. One pass: each
// thread keeps its (up to 8) elements in registers; blockDim 1024 (or less for small H).
// With xs set (rmsnorm_split, long passes), y's BF16 hi / lo split is written too (xs [M, H] hi,
// then lo at xs + M * H; M = gridDim.x), as split_bf16 would write it, for the GEMMs that read y.
// A thread's norm weights w[i] (i = threadIdx.x + j blockDim.x, j < 8) are loaded into wv by
// rms_weights before the launch's PDL wait (weights: no kernel writes them; the step's weight
// stream evicts them from L2, so loaded after the sum they were a DRAM round trip of their own).
__device__ __forceinline__ void rms_weights(const float* w, int H, float (&wv)[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < H ? w[i] : 0.f;
    }
}
// The norm of a thread's elements v[j] (i = threadIdx.x + j blockDim.x; 0 past H) whose squares
// ss already holds, in j order: the sum over the block, then y (and xs) = wv[j] * (v[j] * inv).
// Elements past 8 blockDim are read again from xr (and their weights from w).
__device__ __forceinline__ void rms_finish(const float* xr, const float* w, const float (&wv)[8], const float (&v)[8],
                                           float ss, float* y, int H, float eps, bf16_t* xs, float* sh) {
    int r = blockIdx.x;
    size_t M = gridDim.x;
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) rms_store(y, xs, M, r, H, i, wv[j] * (v[j] * inv));
    }
    for (int i = threadIdx.x + 8 * blockDim.x; i < H; i += blockDim.x) rms_store(y, xs, M, r, H, i, w[i] * (xr[i] * inv));
}
__device__ __forceinline__ void rmsnorm_t(const float* x, const int* rows, const float* w, const float (&wv)[8], float* y,
                                          int H, float eps, bf16_t* xs) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    int src = rows ? rows[r] : r;
    const float* xr = x + (size_t)src * H;
    float v[8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < H ? xr[i] : 0.f;
        ss += v[j] * v[j];
    }
    for (int i = threadIdx.x + 8 * blockDim.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
    rms_finish(xr, w, wv, v, ss, y, H, eps, xs, sh);
}
extern "C" __global__ void rmsnorm(const float* x, const int* rows, const float* w, float* y, int H, float eps) {
    float wv[8];
    rms_weights(w, H, wv);
    PDL_ENTRY();
    rmsnorm_t(x, rows, w, wv, y, H, eps, nullptr);
}
extern "C" __global__ void rmsnorm_split(const float* x, const int* rows, const float* w, float* y, int H, float eps, bf16_t* xs) {
    float wv[8];
    rms_weights(w, H, wv);
    PDL_ENTRY();
    rmsnorm_t(x, rows, w, wv, y, H, eps, xs);
}

// embed, then the first layer's input RMSNorm of the rows (rmsnorm / rmsnorm_split, xs set) in
// the same launch: grid (M), block as rmsnorm's. A thread norms the residual elements it wrote
// (rmsnorm_t's thread-element mapping), from registers instead of reading them back, with the
// same squares summed in the same order: the same values and bits as embed + rmsnorm, one launch
// and one dependent-launch gap fewer a pass, and no round trip between the gather and the norm.
extern "C" __global__ void embed_norm(const bf16_t* table, const int* tokens, const int* feed, float* x, int H,
                                      const float* w, float* y, float eps, bf16_t* xs) {
    __shared__ float sh[32];
    float wv[8];
    rms_weights(w, H, wv);
    PDL_ENTRY();
    int m = blockIdx.x;
    const bf16_t* er = table + embed_token(tokens, feed, m) * H;
    float* xr = x + (size_t)m * H;
    float v[8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < H ? bf2f(er[i]) : 0.f;
        if (i < H) xr[i] = v[j];
        ss += v[j] * v[j];
    }
    for (int i = threadIdx.x + 8 * blockDim.x; i < H; i += blockDim.x) {
        float u = bf2f(er[i]);
        xr[i] = u;
        ss += u * u;
    }
    rms_finish(xr, w, wv, v, ss, y, H, eps, xs, sh);
}
// Draft tap fusion: x is [M, nw * H] (nw taps of width H per row); each H-wide piece j is
// normalised with its own weight w[j * H ..]. grid (M * nw), blockDim as for rmsnorm.
extern "C" __global__ void rmsnorm_taps(const float* x, const float* w, float* y, int H, int nw, float eps) { PDL_ENTRY();
    __shared__ float sh[32];
    int r = blockIdx.x;
    const float* xr = x + (size_t)r * H;
    const float* wr = w + (size_t)(r % nw) * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) y[(size_t)r * H + i] = wr[i] * (xr[i] * inv);
}
// dst[r * ldd + i] = src[r * lds + i], i < n. grid (M), block 256.
extern "C" __global__ void copy_rows(const float* src, int lds, float* dst, int ldd, int n) { PDL_ENTRY();
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[(size_t)r * ldd + i] = src[(size_t)r * lds + i];
}
