// Attention: the merges of a decode row's key splits (`attention_decode_merge16/64`; decode_tc.cu
// instantiates them for its own splits).

// grid (M, nh), block >= hd (and >= 32). Merges the row's splits (in split order) with the sink.
// U = 0 (attention_merge): one loop over the splits, unrolled by 8. U > 0 (attention_merge_16,
// KernelSet merge16, U = 16; attention_merge_64, merge64, U = 64): a thread's U next split values
// loaded at once (a sliding layer's 16 splits in one L2 round trip, a full layer's 64 in four, or
// in one with U = 64), then the same arithmetic in the same order, so the same bits; their
// split factors exp(m_z - max) are computed once a split into shared memory (the same values).
// CH: which attention kernel wrote `part`, so the same split count: ATT_CHUNK (attention /
// attention_gqa*: splits of at least 32 keys) or TC_CHUNK (attention_decode_tc: tc_splits).
template <int U, int CH = ATT_CHUNK>
__device__ __forceinline__ void attention_merge_t(const float* part, int nsplit, float* out, int ldo, int nh, int hd,
                                                  const float* sink, const float* g, int ldg, int gate_mode,
                                                  const int* pos, int window, const int* kend, float vscale) {
    __shared__ float sm[128], sl[128], cz[128];
    int m = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int ns = merge_nsplit(m, nsplit, pos, window, kend, CH);
    const float* pp = part + ((size_t)m * nh + h) * nsplit * (hd + 2);
    for (int z = tid; z < ns; z += blockDim.x) {
        sm[z] = pp[z * (hd + 2)];
        sl[z] = pp[z * (hd + 2) + 1];
    }
    __syncthreads();
    float mx = sink ? sink[h] : -INFINITY;
    for (int z = 0; z < ns; z++) mx = fmaxf(mx, sm[z]);
    if constexpr (U > 0) {
        // Each split's factor once (the same expf of the same values every thread computed before).
        for (int z = tid; z < ns; z += blockDim.x) cz[z] = sl[z] == 0.f ? 0.f : expf(sm[z] - mx);
        __syncthreads();
    }
    if (tid >= hd) return;
    float l = sink ? expf(sink[h] - mx) : 0.f;
    float a = 0.f;
    if constexpr (U == 0) {
#pragma unroll 8
        for (int z = 0; z < ns; z++) {
            float c = sl[z] == 0.f ? 0.f : expf(sm[z] - mx);
            l += sl[z] * c;
            a += (c == 0.f ? 0.f : pp[z * (hd + 2) + 2 + tid] * c);
        }
    } else {
        float v[U > 0 ? U : 1];
        merge_splits<(U > 0 ? U : 1)>(pp, ns, hd, tid, cz, sl, v, false, l, a);
    }
    float o = (a / l) * vscale;
    if (gate_mode == 1) o *= softplus_f(g[(size_t)m * ldg + h]);
    else if (gate_mode == 2) o *= softplus_f(g[(size_t)m * ldg + h * hd + tid]);
    out[(size_t)m * ldo + h * hd + tid] = o;
}
// R (attention_decode_merge16 / _64r / _tcr / _tc64r, KernelSet merge_r): attention_merge_t<U, CH>'s
// arithmetic in the same order, its loads in one round trip. The row's position, its split count
// and the sink come before the PDL wait (nothing in the pass writes them); after it a thread asks
// for its first U split values and its gate together with the block's split maxima and sums
// (those into shared memory), before the barrier that the maxima need. The plain form reads the
// maxima, then (after two barriers) the values, then the gate: three round trips after its wait.
template <int U, int CH = ATT_CHUNK>
__device__ __forceinline__ void attention_merge_r(const float* part, int nsplit, float* out, int ldo, int nh, int hd,
                                                  const float* sink, const float* g, int ldg, int gate_mode,
                                                  const int* pos, int window, const int* kend, float vscale) {
    int m = blockIdx.x, h = blockIdx.y;
    int ns = merge_nsplit(m, nsplit, pos, window, kend, CH);
    float sk = sink ? sink[h] : -INFINITY;
    PDL_ENTRY();
    merge_head_r<U>(part, nsplit, out, ldo, nh, hd, sink, g, ldg, gate_mode, vscale, m, h, ns, sk);
}
#define MERGE_PARAMS const float *part, int nsplit, float *out, int ldo, int nh, int hd, const float *sink, const float *g, \
    int ldg, int gate_mode, const int *pos, int window, const int *kend, float vscale
#define MERGE_ARGS part, nsplit, out, ldo, nh, hd, sink, g, ldg, gate_mode, pos, window, kend, vscale
// KernelSet merge_r: the same merges in one round trip after the wait (PDL_ENTRY inside).
extern "C" __global__ void attention_decode_merge16(MERGE_PARAMS) { attention_merge_r<16>(MERGE_ARGS); }
extern "C" __global__ void attention_decode_merge64(MERGE_PARAMS) { attention_merge_r<64>(MERGE_ARGS); }

