// Attention: the merges of a decode row's key splits (`attention_decode_merge16/64`; decode_tc.cu
// instantiates them for its own splits).

// grid (M, nh), block >= hd (and >= 32). Merges the row's splits (in split order) with the sink:
// merge_head (attention/common.cuh) with U = 16 (a sliding layer's 16 splits in one L2 round trip) or
// U = 64 (a full layer's up to 64): a thread's first U split values and its gate asked for
// together with the block's split maxima and sums, the split factors exp(m_z - max) once a split
// into shared memory, then the sum in split order. The row's position, its split count and the
// sink come before the PDL wait (nothing in the pass writes them).
// CH: which attention kernel wrote `part`, so the same split count: ATT_CHUNK
// (attention_decode_head / _gqa*: splits of at least 32 keys) or TC_CHUNK (attention_decode_tc*:
// tc_splits).
template <int U, int CH = ATT_CHUNK>
__device__ __forceinline__ void attention_merge_t(const float* part, int nsplit, float* out, int ldo, int nh, int hd,
                                                  const float* sink, const float* g, int ldg, int gate_mode,
                                                  const int* pos, int window, const int* kend, float vscale) {
    int m = blockIdx.x, h = blockIdx.y;
    int ns = merge_nsplit(m, nsplit, pos, window, kend, CH);
    float sk = sink ? sink[h] : -INFINITY;
    PDL_ENTRY();
    merge_head<U>(part, nsplit, out, ldo, nh, hd, sink, g, ldg, gate_mode, vscale, m, h, ns, sk);
}
#define MERGE_PARAMS const float *part, int nsplit, float *out, int ldo, int nh, int hd, const float *sink, const float *g, \
    int ldg, int gate_mode, const int *pos, int window, const int *kend, float vscale
#define MERGE_ARGS part, nsplit, out, ldo, nh, hd, sink, g, ldg, gate_mode, pos, window, kend, vscale
extern "C" __global__ void attention_decode_merge16(MERGE_PARAMS) { attention_merge_t<16>(MERGE_ARGS); }
extern "C" __global__ void attention_decode_merge64(MERGE_PARAMS) { attention_merge_t<64>(MERGE_ARGS); }

