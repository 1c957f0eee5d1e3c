// Attention: per-head q/k RMSNorm + partial NeoX RoPE (YaRN folded into inv_freq/attention_factor)
// + K/V write into the paged BF16 cache, and the attention itself (GQA, causal, sliding window,
// optional sink logit, softplus output gate).
//
// Cache layout per layer: [num_pages, page_size, nkv, hd] BF16 for K and for V. Each row m has a
// position pos[m] and a block-table row bt + seqrow[m] * max_pages.

// grid (M, nh + nkv), block = round_up(hd, 32) threads.
extern "C" __global__ void qk_norm_rope_kv(float* q, int ldq, const float* k, const float* v, int ldkv,
                                           const float* qn_w, const float* kn_w, const float* inv_freq, int half,
                                           float attn_factor, float eps, const int* pos, const int* seqrow,
                                           const int* bt, int max_pages, int page_size, bf16_t* kc, bf16_t* vc,
                                           int nh, int nkv, int hd) {
    __shared__ float sh[32];
    __shared__ float buf[512];
    int m = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    bool isq = h < nh;
    int kh = h - nh;
    const float* src = isq ? q + (size_t)m * ldq + h * hd : k + (size_t)m * ldkv + kh * hd;
    float xv = d < hd ? src[d] : 0.f;
    float ss = block_sum(xv * xv, sh);
    float inv = rsqrtf(ss / (float)hd + eps);
    const float* nw = isq ? qn_w : kn_w;
    float y = d < hd ? nw[d] * (xv * inv) : 0.f;
    if (d < hd) buf[d] = y;
    __syncthreads();
    int p = pos[m];
    if (d < half) {
        float ang = (float)p * inv_freq[d];
        float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
        float a = buf[d], b = buf[d + half];
        y = a * c - b * s;
    } else if (d < 2 * half) {
        int i = d - half;
        float ang = (float)p * inv_freq[i];
        float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
        float a = buf[i], b = buf[d];
        y = b * c + a * s;
    }
    if (d >= hd) return;
    if (isq) {
        q[(size_t)m * ldq + h * hd + d] = y;
    } else {
        int page = bt[(size_t)seqrow[m] * max_pages + p / page_size];
        size_t off = (((size_t)page * page_size + p % page_size) * nkv + kh) * hd + d;
        kc[off] = f2bf(y);
        vc[off] = f2bf(v[(size_t)m * ldkv + kh * hd + d]);
    }
}

// One block per (row, query head, split). Keys lo..pos[m] (lo from the window) are cut into
// `nsplit` equal ranges (by the row's own length only: a row's result never depends on the batch);
// each block runs tiles of ATT_T keys: scores by warps (lanes over dims), online softmax, V
// accumulation by threads over dims. nsplit == 1 writes the output (sink, gate applied);
// otherwise (max, sum, acc[hd]) partials go to `part` for attention_merge.
// gate_mode: 0 none, 1 per head (g[m, h]), 2 per element (g[m, h*hd + d]); softplus applied here.
// Tiles of blockDim keys: every thread scores one key (16-byte K loads, q from shared memory),
// block-wide online softmax, then V accumulated by (key group, dim) threads. Needs hd % 8 == 0,
// hd <= blockDim <= 256.
#define ATT_CHUNK 128
extern "C" __global__ void attention(const float* q, int ldq, float* out, int ldo, const bf16_t* kc, const bf16_t* vc,
                                     const int* pos, const int* seqrow, const int* bt, int max_pages, int page_size,
                                     int nh, int nkv, int hd, int window, const float* sink, const float* g, int ldg,
                                     int gate_mode, float scale, int nsplit, float* part) {
    __shared__ float qs[256];
    __shared__ float ps[256];
    __shared__ float red[1024];
    __shared__ unsigned koff[256];
    __shared__ float rmax[8], rsum[8];
    int m = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
    int kvh = h / (nh / nkv);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    int T = blockDim.x;
    int DV = hd >> 2;                    // threads per key in the V pass (4 dims each)
    int G = T / DV, gi = tid / DV, dq = tid % DV;
    bool vact = gi < G;
    for (int d = tid; d < hd; d += blockDim.x) qs[d] = q[(size_t)m * ldq + h * hd + d];
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int len = p + 1 - lo;
    // Splits actually used by this row: from its own length only (batch invariance).
    int ns = nsplit == 1 ? 1 : min(nsplit, (len + ATT_CHUNK - 1) / ATT_CHUNK);
    if (z >= ns) return;
    int chunk = (len + ns - 1) / ns;
    int k0 = lo + z * chunk, k1 = min(p + 1, k0 + chunk);
    const int* btr = bt + (size_t)seqrow[m] * max_pages;
    bool final_ = nsplit == 1;
    float run_max = (final_ && sink) ? sink[h] : -INFINITY;
    float run_sum = (final_ && sink) ? 1.f : 0.f;
    float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
    __syncthreads();
    for (int t0 = k0; t0 < k1; t0 += T) {
        int tn = min(T, k1 - t0);
        float s = -INFINITY;
        if (tid < tn) {
            int t = t0 + tid;
            int page = btr[t / page_size];
            unsigned ko = (unsigned)((((size_t)page * page_size + t % page_size) * nkv + kvh) * hd);
            koff[tid] = ko;
            const uint4* kr = reinterpret_cast<const uint4*>(kc + ko);
            float a = 0.f;
            int nc = hd >> 3;
            for (int c0 = 0; c0 < nc; c0 += 8) {
                uint4 ku[8];
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (c0 + c < nc) ku[c] = __ldg(kr + c0 + c);
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    if (c0 + c < nc) {
                        uint4 u = ku[c];
                        const float* qq = qs + (c0 + c) * 8;
                        a = fmaf(qq[0], bflo(u.x), a);
                        a = fmaf(qq[1], bfhi(u.x), a);
                        a = fmaf(qq[2], bflo(u.y), a);
                        a = fmaf(qq[3], bfhi(u.y), a);
                        a = fmaf(qq[4], bflo(u.z), a);
                        a = fmaf(qq[5], bfhi(u.z), a);
                        a = fmaf(qq[6], bflo(u.w), a);
                        a = fmaf(qq[7], bfhi(u.w), a);
                    }
                }
            }
            s = a * scale;
        }
        float mx = warp_max(s);
        if (lane == 0) rmax[w] = mx;
        __syncthreads();
        mx = rmax[0];
        for (int i = 1; i < nw; i++) mx = fmaxf(mx, rmax[i]);
        float nm = fmaxf(run_max, mx);
        float e = tid < tn ? expf(s - nm) : 0.f;
        ps[tid] = e;
        float sm = warp_sum(e);
        if (lane == 0) rsum[w] = sm;
        __syncthreads();
        sm = 0.f;
        for (int i = 0; i < nw; i++) sm += rsum[i];
        float corr = expf(run_max - nm);
        run_max = nm;
        run_sum = run_sum * corr + sm;
        acc0 *= corr; acc1 *= corr; acc2 *= corr; acc3 *= corr;
        if (vact) {
#pragma unroll 8
            for (int j = gi; j < tn; j += G) {
                uint2 u = __ldg(reinterpret_cast<const uint2*>(vc + (size_t)koff[j] + dq * 4));
                float pj = ps[j];
                acc0 = fmaf(pj, bflo(u.x), acc0);
                acc1 = fmaf(pj, bfhi(u.x), acc1);
                acc2 = fmaf(pj, bflo(u.y), acc2);
                acc3 = fmaf(pj, bfhi(u.y), acc3);
            }
        }
        __syncthreads();
    }
    if (vact) {
        float* rr = red + gi * hd + dq * 4;
        rr[0] = acc0; rr[1] = acc1; rr[2] = acc2; rr[3] = acc3;
    }
    __syncthreads();
    if (tid >= hd) return;
    float a = 0.f;
    for (int i = 0; i < G; i++) a += red[i * hd + tid];
    if (!final_) {
        float* pp = part + (((size_t)m * nh + h) * nsplit + z) * (hd + 2);  // slot z of nsplit
        pp[2 + tid] = a;
        if (tid == 0) { pp[0] = run_max; pp[1] = run_sum; }
        return;
    }
    float o = a / run_sum;
    if (gate_mode == 1) o *= softplus_f(g[(size_t)m * ldg + h]);
    else if (gate_mode == 2) o *= softplus_f(g[(size_t)m * ldg + h * hd + tid]);
    out[(size_t)m * ldo + h * hd + tid] = o;
}

// grid (M, nh), block >= hd (and >= 32). Merges the row's splits (in split order) with the sink.
extern "C" __global__ void attention_merge(const float* part, int nsplit, float* out, int ldo, int nh, int hd,
                                           const float* sink, const float* g, int ldg, int gate_mode,
                                           const int* pos, int window) {
    __shared__ float sm[128], sl[128];
    int m = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int len = p + 1 - lo;
    int ns = min(nsplit, (len + ATT_CHUNK - 1) / ATT_CHUNK);
    const float* pp = part + ((size_t)m * nh + h) * nsplit * (hd + 2);
    for (int z = tid; z < ns; z += blockDim.x) {
        sm[z] = pp[z * (hd + 2)];
        sl[z] = pp[z * (hd + 2) + 1];
    }
    __syncthreads();
    if (tid >= hd) return;
    float mx = sink ? sink[h] : -INFINITY;
    for (int z = 0; z < ns; z++) mx = fmaxf(mx, sm[z]);
    float l = sink ? expf(sink[h] - mx) : 0.f;
    float a = 0.f;
#pragma unroll 8
    for (int z = 0; z < ns; z++) {
        float c = sl[z] == 0.f ? 0.f : expf(sm[z] - mx);
        l += sl[z] * c;
        a += (c == 0.f ? 0.f : pp[z * (hd + 2) + 2 + tid] * c);
    }
    float o = a / l;
    if (gate_mode == 1) o *= softplus_f(g[(size_t)m * ldg + h]);
    else if (gate_mode == 2) o *= softplus_f(g[(size_t)m * ldg + h * hd + tid]);
    out[(size_t)m * ldo + h * hd + tid] = o;
}
