// MoE: the expert kernels of a block row a group (`moe_{gate_up,down}_{bf16,fp4}[_1]`) and the
// combine (`moe_combine[_norm]`).

// grid (ceil(I / warps), G), block 256. act[slot, i] = silu(gate_e[i] . x[row]) * (up_e[i] . x[row]),
// row = slot / K. Expert stacks: BF16 [E, I, H]; NVFP4 packed [E, I, H/2], scales [E, I, H/16], inv_gs[E].
template <int FMT, int MOE_MR>
__device__ void moe_gate_up_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                 const float* uinv, const float* x, int H, int I, int K, const int* grp_expert,
                                 const int* grp_start, const int* grp_count, const int* perm, const int* meta,
                                 float* act) {
    int g = blockIdx.y;
    if (g >= meta[0]) return;
    int i0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = i0 < I;
    int i = valid ? i0 : I - 1;
    int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
    size_t wstride = FMT == 0 ? (size_t)I * H * 2 : (size_t)I * H / 2;
    size_t sstride = (size_t)I * (H / 16);
    const u8* gwe = reinterpret_cast<const u8*>(gw) + e * wstride;
    const u8* uwe = reinterpret_cast<const u8*>(uw) + e * wstride;
    float gi = FMT == 1 ? ginv[e] : 1.f, ui = FMT == 1 ? uinv[e] : 1.f;
    const u8* gse = FMT == 1 ? gs + e * sstride : nullptr;
    const u8* use = FMT == 1 ? us + e * sstride : nullptr;
    int lane = threadIdx.x & 31;
    extern __shared__ float xsh[];
    for (int c = 0; c < cn; c += MOE_MR) {
        int nr = min(MOE_MR, cn - c);
        const float* xr[MOE_MR];
        int slot[MOE_MR];
#pragma unroll
        for (int r = 0; r < MOE_MR; r++) {
            slot[r] = perm[st + c + (r < nr ? r : 0)];
            xr[r] = x + (size_t)(slot[r] / K) * H;
        }
        if (MOE_MR == 1) {  // one slot: stage its activation row in shared memory (H floats)
            __syncthreads();
            for (int j = threadIdx.x; j < H; j += blockDim.x) xsh[j] = xr[0][j];
            __syncthreads();
            xr[0] = xsh;
        }
        float ag[MOE_MR], au[MOE_MR];
        row_dot2<FMT, MOE_MR>(gwe, gse, gi, uwe, use, ui, i, H, xr, nr, ag, au);
#pragma unroll
        for (int r = 0; r < MOE_MR; r++)
            if (valid && r < nr && lane == r) act[(size_t)slot[r] * I + i] = silu_f(ag[r]) * au[r];
    }
}
// grid (ceil(H / warps), G), block 256. out[slot, n] = down_e[n] . act[slot]; down [E, H, I].
template <int FMT, int MOE_MR>
__device__ void moe_down_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                              const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                              const int* meta, float* out) {
    int g = blockIdx.y;
    if (g >= meta[0]) return;
    int n0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = n0 < H;
    int n = valid ? n0 : H - 1;
    int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
    size_t wstride = FMT == 0 ? (size_t)H * I * 2 : (size_t)H * I / 2;
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = FMT == 1 ? ds + e * (size_t)H * (I / 16) : nullptr;
    float di = FMT == 1 ? dinv[e] : 1.f;
    int lane = threadIdx.x & 31;
    extern __shared__ float xsh[];
    for (int c = 0; c < cn; c += MOE_MR) {
        int nr = min(MOE_MR, cn - c);
        const float* xr[MOE_MR];
        int slot[MOE_MR];
#pragma unroll
        for (int r = 0; r < MOE_MR; r++) {
            slot[r] = perm[st + c + (r < nr ? r : 0)];
            xr[r] = act + (size_t)slot[r] * I;
        }
        if (MOE_MR == 1) {
            __syncthreads();
            for (int j = threadIdx.x; j < I; j += blockDim.x) xsh[j] = xr[0][j];
            __syncthreads();
            xr[0] = xsh;
        }
        float a[MOE_MR];
        row_dot<FMT, MOE_MR>(dwe, dse, di, n, I, xr, nr, a);
#pragma unroll
        for (int r = 0; r < MOE_MR; r++)
            if (valid && r < nr && lane == r) out[(size_t)slot[r] * H + n] = a[r];
    }
}
extern "C" __global__ void moe_gate_up_bf16(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<0, 4>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_gate_up_fp4(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                           const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                           const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<1, 4>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_bf16(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<0, 4>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_down_fp4(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                        const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                        float* out) { PDL_ENTRY();
    moe_down_impl<1, 4>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
// Single-slot-per-group forms (decode of one row): same per-slot arithmetic, fewer registers.
extern "C" __global__ void moe_gate_up_bf16_1(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<0, 1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_bf16_1(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<0, 1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_gate_up_fp4_1(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<1, 1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_fp4_1(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<1, 1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
// grid (ceil(H/256), M), block 256. x[m, n] += scale * sum_k w[m,k] out[m*K+k, n] + shared[m, n]
extern "C" __global__ void moe_combine(float* x, const float* out, const float* wts, const float* shared, int H, int K,
                                       float scale) { PDL_ENTRY();
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= H) return;
    float a = 0.f;
    for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
    a *= scale;
    if (shared) a += shared[(size_t)m * H + n];
    x[(size_t)m * H + n] += a;
}
// moe_combine for row blockIdx.x followed by the next layer's input RMSNorm of the updated row
// (one launch instead of two). Same arithmetic as moe_combine then rmsnorm with the same block
// size, so results are bit-identical to the two-kernel form. Block as rmsnorm's. With xs set (long
// passes) y's BF16 hi / lo split is written too, as rmsnorm_split writes it (hi [M, H], lo at
// + M * H; M = gridDim.x).
extern "C" __global__ void moe_combine_norm(float* x, const float* out, const float* wts, const float* shared, int H,
                                            int K, float scale, const float* w, float* y, float eps, bf16_t* xs) { PDL_ENTRY();
    __shared__ float sh[32];
    int m = blockIdx.x;
    float* xr = x + (size_t)m * H;
    float v[8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int n = threadIdx.x + j * blockDim.x;
        v[j] = 0.f;
        if (n < H) {
            float a = 0.f;
            for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
            a *= scale;
            if (shared) a += shared[(size_t)m * H + n];
            float nv = xr[n] + a;
            xr[n] = nv;
            v[j] = nv;
        }
        ss += v[j] * v[j];
    }
    for (int n = threadIdx.x + 8 * blockDim.x; n < H; n += blockDim.x) {
        float a = 0.f;
        for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
        a *= scale;
        if (shared) a += shared[(size_t)m * H + n];
        float nv = xr[n] + a;
        xr[n] = nv;
        ss += nv * nv;
    }
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int n = threadIdx.x + j * blockDim.x;
        if (n < H) rms_store(y, xs, gridDim.x, m, H, n, w[n] * (v[j] * inv));
    }
    for (int n = threadIdx.x + 8 * blockDim.x; n < H; n += blockDim.x) rms_store(y, xs, gridDim.x, m, H, n, w[n] * (xr[n] * inv));
}
