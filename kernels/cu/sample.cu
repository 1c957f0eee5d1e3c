// On-device greedy sampling: argmax over each logits row (lowest index wins ties).
extern "C" __global__ void argmax_rows(const float* logits, int V, int* out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    int m = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    const float* l = logits + (size_t)m * V;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = tid; i < V; i += blockDim.x) {
        float v = l[i];
        if (v > best || (v == best && i < idx)) { best = v; idx = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    if (tid == 0) {
        for (int j = 1; j < nw; j++)
            if (bv[j] > best || (bv[j] == best && bi[j] < idx)) { best = bv[j]; idx = bi[j]; }
        best = bv[0]; idx = bi[0];
        for (int j = 1; j < nw; j++)
            if (bv[j] > best || (bv[j] == best && bi[j] < idx)) { best = bv[j]; idx = bi[j]; }
        out[m] = idx;
    }
}
// Device copy bandwidth probe: dst[i] = src[i] (uint4), grid-stride.
extern "C" __global__ void copy_u4(const uint4* src, uint4* dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
// Greedy DFlash acceptance on the device. The target verified [t, d_1..d_k] (`tokens`) and its
// argmaxes are g_0..g_k: a = the longest prefix with d_{i+1} == g_i; out = [a, d_1..d_a, g_a,
// then (at k + 2) the k drafts]. One thread; one read-back of 2k + 2 ints per step.
extern "C" __global__ void spec_accept(const int* tokens, const int* g, int k, int* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const int* d = tokens + 1;
    int a = 0;
    while (a < k && d[a] == g[a]) a++;
    out[0] = a;
    for (int i = 0; i < a; i++) out[1 + i] = d[i];
    out[1 + a] = g[a];
    for (int i = 0; i < k; i++) out[2 + k + i] = d[i];
}
