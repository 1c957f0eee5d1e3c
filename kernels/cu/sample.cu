// On-device greedy sampling: argmax over each logits row (lowest index wins ties).
extern "C" __global__ void argmax_rows(const float* logits, int V, int* out) { PDL_ENTRY();
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
extern "C" __global__ void copy_u4(const uint4* src, uint4* dst, size_t n) { PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
// Greedy DFlash acceptance on the device for nb sequences whose verify rows are b*(k+1) ..
// b*(k+1)+k: `tokens` holds [t, d_1..d_k] per sequence and g the target's argmaxes of those rows.
// a_b = the longest prefix with d_{i+1} == g_i; out + b*(2k+2) = [a_b, d_1..d_a, g_a, then (at
// k + 2) the k drafts]. One thread per sequence; one read-back of nb*(2k+2) ints per step.
extern "C" __global__ void spec_accept(const int* tokens, const int* g, int k, int nb, int* out) { PDL_ENTRY();
    int b = threadIdx.x;
    if (blockIdx.x != 0 || b >= nb) return;
    const int* d = tokens + b * (k + 1) + 1;
    const int* gb = g + b * (k + 1);
    int* o = out + b * (2 * k + 2);
    int a = 0;
    while (a < k && d[a] == gb[a]) a++;
    o[0] = a;
    for (int i = 0; i < a; i++) o[1 + i] = d[i];
    o[1 + a] = gb[a];
    for (int i = 0; i < k; i++) o[2 + k + i] = d[i];
}
// The draft's argmaxes of its mask rows (nb*k, in sequence order) into the target's verify token
// slots b*(k+1)+1 .. b*(k+1)+k. One block.
extern "C" __global__ void scatter_drafts(const int* am, int* tokens, int nb, int k) { PDL_ENTRY();
    for (int i = threadIdx.x; i < nb * k; i += blockDim.x) {
        int b = i / k, j = i - b * k;
        tokens[b * (k + 1) + 1 + j] = am[i];
    }
}
