// Embedding gather, RMSNorm (optionally over selected rows), residual helpers.
extern "C" __global__ void embed(const bf16_t* table, const int* tokens, float* x, int H) { PDL_ENTRY();
    int m = blockIdx.x;
    size_t t = (size_t)tokens[m];
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)m * H + i] = bf2f(table[t * H + i]);
}
// y[r] = w * x[rows[r]] / sqrt(mean(x^2) + eps); rows == nullptr means r itself. One pass: each
// thread keeps its (up to 8) elements in registers; blockDim 1024 (or less for small H).
// With xs set (rmsnorm_split, long passes), y's BF16 hi / lo split is written too (xs [M, H] hi,
// then lo at xs + M * H; M = gridDim.x), as split_bf16 would write it, for the GEMMs that read y.
__device__ __forceinline__ void rmsnorm_t(const float* x, const int* rows, const float* w, float* y, int H, float eps,
                                          bf16_t* xs) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    size_t M = gridDim.x;
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
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) rms_store(y, xs, M, r, H, i, w[i] * (v[j] * inv));
    }
    for (int i = threadIdx.x + 8 * blockDim.x; i < H; i += blockDim.x) rms_store(y, xs, M, r, H, i, w[i] * (xr[i] * inv));
}
extern "C" __global__ void rmsnorm(const float* x, const int* rows, const float* w, float* y, int H, float eps) { PDL_ENTRY();
    rmsnorm_t(x, rows, w, y, H, eps, nullptr);
}
extern "C" __global__ void rmsnorm_split(const float* x, const int* rows, const float* w, float* y, int H, float eps, bf16_t* xs) { PDL_ENTRY();
    rmsnorm_t(x, rows, w, y, H, eps, xs);
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
