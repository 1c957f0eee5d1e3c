// Attention: per-head q/k RMSNorm + partial NeoX RoPE (YaRN folded into inv_freq/attention_factor)
// + K/V write into the cache, and the attention itself (GQA, causal, sliding window, optional sink
// logit, softplus output gate).
//
// Cache layout per layer: [slots, nkv, hd] of BF16 or FP8 E4M3 (stored = value / scale; the K
// scale is folded into the softmax scale, the V scale applied to the output). Row m at position
// p reads its slot through a block-table row bt + seqrow[m] * max_pages: page
// btr[(p / page_size) % max_pages], slot page * page_size + p % page_size. Full-attention layers
// use the paged pool (positions never reach max_pages * page_size, so the modulo is a no-op);
// sliding-window layers use a per-sequence ring of R = max_pages slots (page_size 1): position p
// lives in slot p % R, so R >= window + speculative rows keeps every key a query can still see.

// FP8 E4M3FN <-> BF16. Every E4M3 value is exact in BF16; stores round to nearest even and
// saturate to +-448 (the cache never holds NaN).
__device__ __forceinline__ u32 e4m3_bf16(u32 b) {
    u32 em = b & 0x7fu;
    u32 r = em >= 8u ? (em << 4) + (120u << 7) : (__float_as_uint((float)em * 0.001953125f) >> 16);
    return ((b & 0x80u) << 8) | r;
}
__device__ __forceinline__ u32 e4m3x2_bf16x2(u32 w) { return e4m3_bf16(w & 0xffu) | (e4m3_bf16((w >> 8) & 0xffu) << 16); }
__device__ __forceinline__ u8 f2e4m3(float x) {
#if defined(__CUDA_ARCH__)
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(x));
    return (u8)(r & 0xffu);
#else
    return emu_f2e4m3(x);  // kernels/emu (NVRTC always defines __CUDA_ARCH__)
#endif
}
// a + q[0..8) . k, k = 8 BF16 (element 0 in the low half of u.x), fused multiply-adds in order.
__device__ __forceinline__ float dot8_acc(const float* q, uint4 u, float a) {
    a = fmaf(q[0], bflo(u.x), a);
    a = fmaf(q[1], bfhi(u.x), a);
    a = fmaf(q[2], bflo(u.y), a);
    a = fmaf(q[3], bfhi(u.y), a);
    a = fmaf(q[4], bflo(u.z), a);
    a = fmaf(q[5], bfhi(u.z), a);
    a = fmaf(q[6], bflo(u.w), a);
    return fmaf(q[7], bfhi(u.w), a);
}
template <typename KV> struct Kv;
template <> struct Kv<bf16_t> {
    // 8 / 4 consecutive elements as BF16 pairs (p aligned to 16 / 8 bytes).
    static __device__ __forceinline__ uint4 ld8(const bf16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
    static __device__ __forceinline__ uint2 ld4(const bf16_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
    static __device__ __forceinline__ bf16_t cvt(float x) { return f2bf(x); }
    static __device__ __forceinline__ bf16_t to_bf16(bf16_t x) { return x; }
};
template <> struct Kv<u8> {
    static __device__ __forceinline__ uint4 ld8(const u8* p) {
        uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
        return make_uint4(e4m3x2_bf16x2(r.x), e4m3x2_bf16x2(r.x >> 16), e4m3x2_bf16x2(r.y), e4m3x2_bf16x2(r.y >> 16));
    }
    static __device__ __forceinline__ uint2 ld4(const u8* p) {
        u32 r = __ldg(reinterpret_cast<const unsigned*>(p));
        return make_uint2(e4m3x2_bf16x2(r), e4m3x2_bf16x2(r >> 16));
    }
    static __device__ __forceinline__ u8 cvt(float x) { return f2e4m3(x); }
    static __device__ __forceinline__ bf16_t to_bf16(u8 x) { return (bf16_t)e4m3_bf16(x); }
};

// grid (M, ceil((nh + nkv) / 4)), block 128: one warp per head (query heads, then KV heads), lane
// l holds dims l, l + 32, ... (hd <= 256). RMSNorm over the head (lane sums in dim order, then the
// warp), partial NeoX RoPE through a per-warp buffer, then q in place or K/V into the cache.
// K/V go to the cache, or with `ks` set to the pass's stage ([rows, nkv, hd], for a ring layer
// whose pass is longer than the ring's spare slots; ring_commit copies them after the attention).
// kinv / vinv = 1 / scale (1 for BF16).
// LAT (qk_norm_rope_store, KernelSet qk_ld): the head's values, its norm weights, the V row and the
// row's sequence index are loaded before the rotary table is built, and the page-table entry as
// soon as the position is known, instead of each after the step before it; the same arithmetic
// on the same values, so the same bits.
// Dim d of a normed head in bw after partial NeoX RoPE (rc / rs: cos / sin times attn_factor of
// the half rotary angles; dims past 2 * half unrotated). One expression for every kernel that
// rotates, so they round alike.
__device__ __forceinline__ float rope_at(const float* bw, const float* rc, const float* rs, int d, int half) {
    float y = bw[d];
    if (d < half) {
        y = bw[d] * rc[d] - bw[d + half] * rs[d];
    } else if (d < 2 * half) {
        int i = d - half;
        y = bw[d] * rc[i] + bw[i] * rs[i];
    }
    return y;
}
template <typename KV, int LAT = 0>
__device__ __forceinline__ void qk_norm_rope_kv_t(float* q, int ldq, const float* k, const float* v, int ldkv,
                                                  const float* qn_w, const float* kn_w, const float* inv_freq, int half,
                                                  float attn_factor, float eps, const int* pos, const int* seqrow,
                                                  const int* bt, int max_pages, int page_size, KV* kc, KV* vc,
                                                  int nh, int nkv, int hd, KV* ks, KV* vs, float kinv, float vinv) {
    __shared__ float buf[4][256];
    __shared__ float rc[128], rs[128];
    int m = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y * 4 + w;
    bool live = h < nh + nkv;
    bool isq = h < nh;
    int kh = h - nh;
    const float* src = isq ? q + (size_t)m * ldq + h * hd : k + (size_t)m * ldkv + kh * hd;
    const float* nw = isq ? qn_w : kn_w;
    float xv[8], nwv[8], vv[8];
    int srow = 0;
    if (LAT) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int d = lane + 32 * j;
            bool in = live && d < hd;
            xv[j] = in ? src[d] : 0.f;
            nwv[j] = in ? nw[d] : 0.f;
            vv[j] = in && !isq ? v[(size_t)m * ldkv + kh * hd + d] : 0.f;
        }
        if (live && !isq && !ks) srow = seqrow[m];
    }
    int p = pos[m];
    int page = 0;
    if (LAT && live && !isq && !ks) page = bt[(size_t)srow * max_pages + (p / page_size) % max_pages];
    // cos / sin (times attn_factor) of this row's rotary angles, once per block for its 4 heads.
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)p * inv_freq[i];
        rc[i] = cosf(ang) * attn_factor;
        rs[i] = sinf(ang) * attn_factor;
    }
    __syncthreads();
    if (!live) return;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (!LAT) xv[j] = d < hd ? src[d] : 0.f;
        ss = fmaf(xv[j], xv[j], ss);
    }
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / (float)hd + eps);
    float* bw = buf[w];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d < hd) bw[d] = (LAT ? nwv[j] : nw[d]) * (xv[j] * inv);
    }
    __syncwarp();
    size_t off = 0;
    if (!isq && !ks) {
        if (!LAT) page = bt[(size_t)seqrow[m] * max_pages + (p / page_size) % max_pages];
        off = (((size_t)page * page_size + p % page_size) * nkv + kh) * hd;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d >= hd) break;
        float y = rope_at(bw, rc, rs, d, half);
        if (isq) {
            q[(size_t)m * ldq + h * hd + d] = y;
        } else {
            KV kq = Kv<KV>::cvt(y * kinv), vq = Kv<KV>::cvt((LAT ? vv[j] : v[(size_t)m * ldkv + kh * hd + d]) * vinv);
            if (ks) {
                size_t so = ((size_t)m * nkv + kh) * hd + d;
                ks[so] = kq;
                vs[so] = vq;
            } else {
                kc[off + d] = kq;
                vc[off + d] = vq;
            }
        }
    }
}
#define QK_PARAMS(KV)                                                                                              \
    float *q, int ldq, const float *k, const float *v, int ldkv, const float *qn_w, const float *kn_w,            \
        const float *inv_freq, int half, float attn_factor, float eps, const int *pos, const int *seqrow,         \
        const int *bt, int max_pages, int page_size, KV *kc, KV *vc, int nh, int nkv, int hd, KV *ks, KV *vs,     \
        float kinv, float vinv
#define QK_ARGS q, ldq, k, v, ldkv, qn_w, kn_w, inv_freq, half, attn_factor, eps, pos, seqrow, bt, max_pages, page_size, kc, vc, nh, nkv, hd, ks, vs, kinv, vinv
extern "C" __global__ void qk_norm_rope_store(QK_PARAMS(bf16_t)) { PDL_ENTRY(); qk_norm_rope_kv_t<bf16_t, 1>(QK_ARGS); }
extern "C" __global__ void qk_norm_rope_store_fp8(QK_PARAMS(u8)) { PDL_ENTRY(); qk_norm_rope_kv_t<u8, 1>(QK_ARGS); }

// grid (M), block 64. After a staged pass: rows among the last R positions of their sequence in
// the pass go from the stage into their ring slots (older rows would share a slot with a newer
// one). rowb = bytes of one K (or V) row (nkv * hd * element size, a multiple of 8).
extern "C" __global__ void ring_commit(const u8* ks, const u8* vs, const int* pos, const int* seqrow, const int* slast,
                                       const int* bt, int ring, u8* kc, u8* vc, int rowb) { PDL_ENTRY();
    int m = blockIdx.x, p = pos[m];
    if (p <= pos[slast[m]] - ring) return;
    size_t slot = (size_t)bt[(size_t)seqrow[m] * ring + p % ring];
    const uint2* sk = reinterpret_cast<const uint2*>(ks + (size_t)m * rowb);
    const uint2* sv = reinterpret_cast<const uint2*>(vs + (size_t)m * rowb);
    uint2* dk = reinterpret_cast<uint2*>(kc + slot * rowb);
    uint2* dv = reinterpret_cast<uint2*>(vc + slot * rowb);
    for (int i = threadIdx.x; i < rowb / 8; i += blockDim.x) {
        dk[i] = sk[i];
        dv[i] = sv[i];
    }
}


// One block per (row, query head, split). Keys lo..pos[m] (lo from the window) are cut into
// `nsplit` equal ranges (by the row's own length only: a row's result never depends on the batch);
// each block runs tiles of ATT_T keys: scores by warps (lanes over dims), online softmax, V
// accumulation by threads over dims. nsplit == 1 writes the output (sink, gate applied);
// otherwise (max, sum, acc[hd]) partials go to `part` for attention_merge.
// gate_mode: 0 none, 1 per head (g[m, h]), 2 per element (g[m, h*hd + d]); softplus applied here.
// Tiles of blockDim keys: every thread scores one key (16-byte K loads, q from shared memory),
// block-wide online softmax, then V accumulated by (key group, dim) threads. Any even hd <=
// blockDim <= 256 (hd % 8 != 0: element loads, 2 dims a V thread).
#define ATT_PARAMS(KV)                                                                                             \
    const float *q, int ldq, float *out, int ldo, const KV *kc, const KV *vc, const int *pos, const int *seqrow,   \
        const int *bt, int max_pages, int page_size, int nh, int nkv, int hd, int window, const float *sink,       \
        const float *g, int ldg, int gate_mode, float scale, float vscale
#define ATT_ARGS q, ldq, out, ldo, kc, vc, pos, seqrow, bt, max_pages, page_size, nh, nkv, hd, window, sink, g, ldg, gate_mode, scale, vscale
// Staged ring layers (ks set; a pass whose flash kernel cannot take the head_dim): keys at or
// after the first position of the row's sequence in this pass come from the stage (row
// sfirst[m] + key - s0; offset tagged with bit 31), older ones from the ring, as in
// attention_prefill_t.
template <typename KV>
__device__ __forceinline__ void attention_t(ATT_PARAMS(KV), int nsplit, float* part, const int* kend, const KV* ks,
                                            const KV* vs, const int* sfirst) {
    __shared__ float qs[256];
    __shared__ float ps[256];
    __shared__ float red[1024];
    __shared__ unsigned koff[256];
    __shared__ float rmax[8], rsum[8];
    int m = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
    int kvh = h / (nh / nkv);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    int T = blockDim.x;
    // Threads per key in the V pass: 4 dims each, 2 (element loads) where hd % 8 != 0.
    const int VW = hd & 7 ? 2 : 4;
    int DV = hd / VW;
    int G = T / DV, gi = tid / DV, dq = tid % DV;
    bool vact = gi < G;
    for (int d = tid; d < hd; d += blockDim.x) qs[d] = q[(size_t)m * ldq + h * hd + d];
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int last = key_last(p, kend, m, window);
    int len = last + 1 - lo;
    // Splits actually used by this row: from its own length only (batch invariance).
    int ns = nsplit == 1 ? 1 : min(nsplit, (len + ATT_CHUNK - 1) / ATT_CHUNK);
    if (z >= ns) return;
    int chunk = (len + ns - 1) / ns;
    int k0 = lo + z * chunk, k1 = min(last + 1, k0 + chunk);
    const int* btr = bt + (size_t)seqrow[m] * max_pages;
    int srow = ks ? sfirst[m] : 0;
    int s0 = ks ? pos[srow] : 0x7fffffff;
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
            unsigned ko;
            if (t >= s0) {
                ko = 0x80000000u | (unsigned)(((size_t)(srow + t - s0) * nkv + kvh) * hd);
            } else {
                int page = btr[(t / page_size) % max_pages];
                ko = (unsigned)((((size_t)page * page_size + t % page_size) * nkv + kvh) * hd);
            }
            koff[tid] = ko;
            const KV* kr = (ko & 0x80000000u ? ks : kc) + (ko & 0x7fffffffu);
            float a = 0.f;
            int nc = hd >> 3;
            if (hd & 7) {  // rows not 16-byte aligned: element loads, dot8_acc's order
                for (int d = 0; d < hd; d++) a = fmaf(qs[d], bf2f(Kv<KV>::to_bf16(kr[d])), a);
                nc = 0;
            }
            for (int c0 = 0; c0 < nc; c0 += 8) {
                uint4 ku[8];
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (c0 + c < nc) ku[c] = Kv<KV>::ld8(kr + (c0 + c) * 8);
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    if (c0 + c < nc) {
                        a = dot8_acc(qs + (c0 + c) * 8, ku[c], a);
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
                const KV* vb = (koff[j] & 0x80000000u ? vs : vc) + (koff[j] & 0x7fffffffu);
                if (VW == 2) {
                    const KV* vr = vb + dq * 2;
                    float pj = ps[j];
                    acc0 = fmaf(pj, bf2f(Kv<KV>::to_bf16(vr[0])), acc0);
                    acc1 = fmaf(pj, bf2f(Kv<KV>::to_bf16(vr[1])), acc1);
                    continue;
                }
                uint2 u = Kv<KV>::ld4(vb + dq * 4);
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
        float* rr = red + gi * hd + dq * VW;
        rr[0] = acc0; rr[1] = acc1;
        if (VW == 4) { rr[2] = acc2; rr[3] = acc3; }
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
    float o = (a / run_sum) * vscale;
    if (gate_mode == 1) o *= softplus_f(g[(size_t)m * ldg + h]);
    else if (gate_mode == 2) o *= softplus_f(g[(size_t)m * ldg + h * hd + tid]);
    out[(size_t)m * ldo + h * hd + tid] = o;
}
extern "C" __global__ void attention_decode_head(ATT_PARAMS(bf16_t), int nsplit, float* part, const int* kend, const bf16_t* ks,
                                                 const bf16_t* vs, const int* sfirst) { PDL_ENTRY();
    attention_t<bf16_t>(ATT_ARGS, nsplit, part, kend, ks, vs, sfirst);
}
extern "C" __global__ void attention_decode_head_fp8(ATT_PARAMS(u8), int nsplit, float* part, const int* kend, const u8* ks,
                                                     const u8* vs, const int* sfirst) { PDL_ENTRY();
    attention_t<u8>(ATT_ARGS, nsplit, part, kend, ks, vs, sfirst);
}

// GQA-packed decode attention: one block per (row, KV head, split), one warp per query head of
// the group (blockDim = 32 * nh/nkv), so each K/V tile is read from memory once for the whole
// group. Tiles of 32 keys are staged in shared memory; lane j scores key j of the tile against
// its warp's query (dims in order), warp-level online softmax, then lane l accumulates dims
// 4l..4l+3 over the tile's keys in order. Key ranges and splits follow `attention` (by the row's
// own length only), so a row's result is the same in any batch. Needs hd % 8 == 0, hd <= 128,
// nh / nkv <= 16. Partials feed attention_merge unchanged.
#define GQ_T 32
// Where the keys t0 + j (j < GQ_T) of a tile live: page-table index (t / page_size) % max_pages
// and in-page position t % page_size, for a power-of-two page_size (the pool's, checked at load;
// the rings' 1): one division a tile, then per key an add, a shift, a mask and a wrap, instead of
// three divisions a key. The same integers.
struct TilePages {
    int b0, r0, lg, msk, mp;
    __device__ __forceinline__ TilePages(int t0, int page_size, int max_pages) {
        lg = __ffs(page_size) - 1;
        msk = page_size - 1;
        mp = max_pages;
        b0 = (t0 >> lg) % max_pages;
        r0 = t0 & msk;
    }
    __device__ __forceinline__ int index(int j, int& in) const {
        int q = r0 + j;
        int pi = b0 + (q >> lg);
        while (pi >= mp) pi -= mp;
        in = q & msk;
        return pi;
    }
};
// i / nc without a division: (i * ceil(2^20 / nc)) >> 20 equals it for i < 1024 and nc <= 32
// (nc = hd / 8; ceil(2^20 / nc) * nc exceeds 2^20 by e < nc, and i * e < 2^20).
__device__ __forceinline__ int nc_mul(int nc) { return ((1 << 20) + nc - 1) / nc; }
__device__ __forceinline__ int div_nc(int i, int m) { return (i * m) >> 20; }
// One tile of tn keys (K rows at stride ldk, V rows at stride hd, BF16 in shared memory) for
// warp w's query qq: lane j scores key j (dims in order), warp-level online softmax, then lane l
// accumulates dims 4l..4l+3 over the keys in order.
// pw: the warp's 32 floats of shared memory (a whole tile's probabilities, read back four at a time).
__device__ __forceinline__ void gqa_tile(const bf16_t* Ks, const bf16_t* Vs, int ldk, const float* qq, int tn,
                                         int nc, int hd, int lane, float scale, float& run_max, float& run_sum,
                                         float& a0, float& a1, float& a2, float& a3, float* pw) {
    int d = lane * 4;
    float s = -INFINITY;
    if (lane < tn) {
        const uint4* kr = reinterpret_cast<const uint4*>(Ks + lane * ldk);
        float acc = 0.f;
        // (q's 8 values of chunk c as two 16-byte shared loads: qq is 16-byte aligned, hd % 8 == 0.)
        const float4* q4 = reinterpret_cast<const float4*>(qq);
        for (int c = 0; c < nc; c++) {
            float4 qa = q4[2 * c], qb = q4[2 * c + 1];
            float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
            acc = dot8_acc(qv, kr[c], acc);
        }
        s = acc * scale;
    }
    float mx = warp_max(s);
    float nm = fmaxf(run_max, mx);
    float e = lane < tn ? expf(s - nm) : 0.f;
    float sm = warp_sum(e);
    float corr = expf(run_max - nm);
    run_max = nm;
    run_sum = run_sum * corr + sm;
    a0 *= corr; a1 *= corr; a2 *= corr; a3 *= corr;
    if (tn == GQ_T) {
        // A whole tile: the probabilities through shared memory (four a broadcast load) instead of
        // one shuffle a key, and no branch inside the loop, so later keys' loads are issued ahead
        // of earlier keys' FMAs (with a shuffle and a branch a key, every iteration waited for its
        // shuffle and load in turn). Lanes past the head's dims (d >= hd) read another dim of the
        // same row, in range, and their sums are never stored. The same FMAs in the same order,
        // so the same bits.
        pw[lane] = e;
        __syncwarp();
        const bf16_t* vr = Vs + min(d, hd - 4);
#pragma unroll 4
        for (int j0 = 0; j0 < GQ_T; j0 += 4) {
            float4 p4 = *reinterpret_cast<const float4*>(pw + j0);
            float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint2 u = *reinterpret_cast<const uint2*>(vr + (j0 + q) * hd);
                a0 = fmaf(pj[q], bflo(u.x), a0);
                a1 = fmaf(pj[q], bfhi(u.x), a1);
                a2 = fmaf(pj[q], bflo(u.y), a2);
                a3 = fmaf(pj[q], bfhi(u.y), a3);
            }
        }
        __syncwarp();
        return;
    }
    for (int j = 0; j < tn; j++) {
        float pj = __shfl_sync(0xffffffffu, e, j);
        if (d < hd) {
            uint2 u = *reinterpret_cast<const uint2*>(Vs + j * hd + d);
            a0 = fmaf(pj, bflo(u.x), a0);
            a1 = fmaf(pj, bfhi(u.x), a1);
            a2 = fmaf(pj, bflo(u.y), a2);
            a3 = fmaf(pj, bfhi(u.y), a3);
        }
    }
}
// Output dims d..d+3 of head h, row m: (acc / sum) * vscale, then the softplus gate.
__device__ __forceinline__ void gqa_store(float* out, int ldo, const float* g, int ldg, int gate_mode, float vscale,
                                          int m, int h, int hd, int d, float sum, float a0, float a1, float a2,
                                          float a3) {
    float o[4] = {(a0 / sum) * vscale, (a1 / sum) * vscale, (a2 / sum) * vscale, (a3 / sum) * vscale};
    for (int i = 0; i < 4; i++) {
        if (gate_mode == 1) o[i] *= softplus_f(g[(size_t)m * ldg + h]);
        else if (gate_mode == 2) o[i] *= softplus_f(g[(size_t)m * ldg + h * hd + d + i]);
        out[(size_t)m * ldo + h * hd + d + i] = o[i];
    }
}
// LAT (attention_decode_gqa, KernelSet gqa_ld): a thread's share of q, and of a key tile three items
// at a time (page-table entries first, then their K/V rows; one batch for groups of 6+ heads), is
// loaded before any of it is used, instead of one round trip per loop iteration; the same values
// land in the same shared arrays, so the same bits.
template <typename KV, int LAT = 0>
__device__ __forceinline__ void attention_gqa_t(ATT_PARAMS(KV), int nsplit, float* part, const int* kend) {
    __shared__ __align__(16) bf16_t Ks[GQ_T * 136];
    __shared__ __align__(16) bf16_t Vs[GQ_T * 128];
    __shared__ __align__(16) float qs[16 * 128];
    __shared__ __align__(16) float pws[16][32];  // gqa_tile's probabilities, a warp's row
    int m = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
    int G = nh / nkv;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = kvh * G + w;
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int last = key_last(p, kend, m, window);
    int len = last + 1 - lo;
    int ns = nsplit == 1 ? 1 : min(nsplit, (len + ATT_CHUNK - 1) / ATT_CHUNK);
    if (z >= ns) return;
    if (!LAT) {
        for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(size_t)m * ldq + (size_t)kvh * G * hd + i];
    } else {
        // G * hd / blockDim = hd / 32 <= 4 elements a thread.
        float qv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = threadIdx.x + u * blockDim.x;
            qv[u] = i < G * hd ? q[(size_t)m * ldq + (size_t)kvh * G * hd + i] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = threadIdx.x + u * blockDim.x;
            if (i < G * hd) qs[i] = qv[u];
        }
    }
    int chunk = (len + ns - 1) / ns;
    int k0 = lo + z * chunk, k1 = min(last + 1, k0 + chunk);
    const int* btr = bt + (size_t)seqrow[m] * max_pages;
    bool final_ = nsplit == 1;
    float run_max = (final_ && sink && w < G) ? sink[h] : -INFINITY;
    float run_sum = (final_ && sink) ? 1.f : 0.f;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    const int ldk = hd + 8;
    const int nc = hd >> 3, ncm = nc_mul(nc);
    int d = lane * 4;
    for (int t0 = k0; t0 < k1; t0 += GQ_T) {
        int tn = min(GQ_T, k1 - t0);
        __syncthreads();
        if (!LAT) {
            for (int i = threadIdx.x; i < tn * nc; i += blockDim.x) {
                int j = i / nc, c = i - j * nc;
                int t = t0 + j;
                int page = btr[(t / page_size) % max_pages];
                size_t off = (((size_t)page * page_size + t % page_size) * nkv + kvh) * hd + c * 8;
                *reinterpret_cast<uint4*>(Ks + j * ldk + c * 8) = Kv<KV>::ld8(kc + off);
                *reinterpret_cast<uint4*>(Vs + j * hd + c * 8) = Kv<KV>::ld8(vc + off);
            }
        } else {
            TilePages tp(t0, page_size, max_pages);
            for (int i0 = threadIdx.x; i0 < tn * nc; i0 += 3 * blockDim.x) {
                int page[3], in[3];
#pragma unroll
                for (int u = 0; u < 3; u++) {
                    int i = i0 + u * blockDim.x;
                    int pi = tp.index(div_nc(i, ncm), in[u]);
                    page[u] = i < tn * nc ? btr[pi] : 0;
                }
                uint4 kv4[3], vv4[3];
#pragma unroll
                for (int u = 0; u < 3; u++) {
                    int i = i0 + u * blockDim.x;
                    if (i < tn * nc) {
                        int j = div_nc(i, ncm), c = i - j * nc;
                        size_t off = (((size_t)page[u] * page_size + in[u]) * nkv + kvh) * hd + c * 8;
                        kv4[u] = Kv<KV>::ld8(kc + off);
                        vv4[u] = Kv<KV>::ld8(vc + off);
                    }
                }
#pragma unroll
                for (int u = 0; u < 3; u++) {
                    int i = i0 + u * blockDim.x;
                    if (i < tn * nc) {
                        int j = div_nc(i, ncm), c = i - j * nc;
                        *reinterpret_cast<uint4*>(Ks + j * ldk + c * 8) = kv4[u];
                        *reinterpret_cast<uint4*>(Vs + j * hd + c * 8) = vv4[u];
                    }
                }
            }
        }
        __syncthreads();
        if (w < G) gqa_tile(Ks, Vs, ldk, qs + w * hd, tn, nc, hd, lane, scale, run_max, run_sum, a0, a1, a2, a3, pws[w]);
    }
    if (w >= G || d >= hd) return;
    if (!final_) {
        float* pp = part + (((size_t)m * nh + h) * nsplit + z) * (hd + 2);
        pp[2 + d] = a0; pp[3 + d] = a1; pp[4 + d] = a2; pp[5 + d] = a3;
        if (lane == 0) { pp[0] = run_max; pp[1] = run_sum; }
        return;
    }
    gqa_store(out, ldo, g, ldg, gate_mode, vscale, m, h, hd, d, run_sum, a0, a1, a2, a3);
}
extern "C" __global__ void attention_decode_gqa(ATT_PARAMS(bf16_t), int nsplit, float* part, const int* kend) { PDL_ENTRY();
    attention_gqa_t<bf16_t, 1>(ATT_ARGS, nsplit, part, kend);
}
extern "C" __global__ void attention_decode_gqa_fp8(ATT_PARAMS(u8), int nsplit, float* part, const int* kend) { PDL_ENTRY();
    attention_gqa_t<u8, 1>(ATT_ARGS, nsplit, part, kend);
}

// attention_gqa_qkc's merge (see attention_gqa_qk_t, CL): block z of a cluster of the KV head's
// gridDim.z <= 16 split blocks, warp w < G holding head kvh * G + w's partial (run_max, run_sum,
// a0..a3 at dims d..d + 3), every thread of the block calling. The partials go to this block's
// shared memory in the layout of attention_gqa's `part` (max, sum, hd values a head); after the
// cluster barrier, thread t < per of block z merges output o = z * per + t (head o / hd, dim
// o % hd) from the ns blocks' partials: attention_merge_r<16>'s expressions (the same maximum, the
// same split factors, merge_splits' steps in split order), so the same bits. The split maxima and
// sums of the block's heads (at most 8) go to `scr` (256 floats of this block's shared memory,
// free by then), asked for with the values, before one block barrier.
__device__ __forceinline__ void gqa_cluster_merge(float* out, int ldo, int m, int kvh, int z, int G, int hd, int ns, int w,
                                                  int lane, int d, float run_max, float run_sum, float a0, float a1,
                                                  float a2, float a3, const float* sink, const float* g, int ldg,
                                                  int gate_mode, float vscale, float* scr) {
    CLUSTER_SHARED(float, pm, 8 * 130);
    if (w < G && d < hd) {
        float* pw = pm + w * (hd + 2);
        pw[2 + d] = a0; pw[3 + d] = a1; pw[4 + d] = a2; pw[5 + d] = a3;
        if (lane == 0) { pw[0] = run_max; pw[1] = run_sum; }
    }
    cluster_sync();
    int nz = gridDim.z, per = (G * hd + nz - 1) / nz;
    int t = threadIdx.x, o0 = z * per, o = o0 + t;
    int h0 = o0 / hd, nhs = min(G * hd, o0 + per) > o0 ? (min(G * hd, o0 + per) - 1) / hd - h0 + 1 : 0;
    bool own = t < per && o < G * hd;
    int hh = own ? o / hd : h0, dd = o - hh * hd, h = kvh * G + hh;
    float v[16];
#pragma unroll
    for (int u = 0; u < 16; u++) v[u] = own && u < ns ? ld_cluster(pm + hh * (hd + 2) + 2 + dd, u) : 0.f;
    float* msm = scr;
    float* msl = scr + 128;
    for (int i = t; i < nhs * ns; i += blockDim.x) {
        int hs = i / ns, u = i - hs * ns;
        msm[hs * 16 + u] = ld_cluster(pm + (h0 + hs) * (hd + 2), u);
        msl[hs * 16 + u] = ld_cluster(pm + (h0 + hs) * (hd + 2) + 1, u);
    }
    float gv = 0.f;
    if (own && gate_mode == 1) gv = g[(size_t)m * ldg + h];
    else if (own && gate_mode == 2) gv = g[(size_t)m * ldg + h * hd + dd];
    float sk = sink ? sink[h] : -INFINITY;
    __syncthreads();
    if (own) {
        const float* sm = msm + (hh - h0) * 16;
        const float* sl = msl + (hh - h0) * 16;
        float mx = sk;
        for (int u = 0; u < ns; u++) mx = fmaxf(mx, sm[u]);
        float cz[16];
#pragma unroll
        for (int u = 0; u < 16; u++) cz[u] = u < ns && sl[u] != 0.f ? expf(sm[u] - mx) : 0.f;
        float l = sink ? expf(sk - mx) : 0.f;
        float a = 0.f;
        // ns <= 16 (the grid's splits): only merge_splits' unrolled form remains, cz in registers.
        if (ns > 16) __builtin_unreachable();
        merge_splits<16>(nullptr, ns, hd, dd, cz, sl, v, true, l, a);
        float r = (a / l) * vscale;
        if (gate_mode == 1 || gate_mode == 2) r *= softplus_f(gv);
        out[(size_t)m * ldo + h * hd + dd] = r;
    }
    // No block leaves (its shared memory) while another may still read it.
    cluster_sync();
}
// attention_gqa_qkl's merge (see attention_gqa_qk_t, LM): every thread of a split block calls it
// after its partial stores. The block takes a ticket on its (row, KV head) counter
// (last_block_ticket); the block that draws the last of the row's ns tickets merges the
// group's G heads, warp w head kvh * G + w, lane l dims l + 32 j: attention_merge_r<16>'s
// expressions in the same order on the same values (the maximum over the sink and the split
// maxima in split order, the split factors, merge_splits' steps), so the same bits as
// attention_decode_merge16 after the launch. The partials come through L2 (__ldcg: other blocks wrote
// them in this launch), all 64 of a lane's split values (4 dims) in flight at once, one round
// trip. ns <= 16 (the host uses it with 16 splits at most). scr: 128 floats a warp of this
// block's shared memory, free by then.
__device__ __forceinline__ void gqa_last_merge(const float* part, unsigned* cnt, int m, int kvh, int nkv, int nh, int G,
                                               int hd, int nsplit, int ns, float* out, int ldo, const float* sink,
                                               const float* g, int ldg, int gate_mode, float vscale, float* scr) {
    if (!last_block_ticket(cnt + (size_t)m * nkv + kvh, ns)) return;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (w >= G) return;
    ns = min(ns, 16);  // (the host's bound; known to the compiler, merge_splits' loop form goes)
    int h = kvh * G + w;
    const float* pp = part + ((size_t)m * nh + h) * nsplit * (hd + 2);
    float* sm = scr + w * 128;  // the split maxima [0, 16), sums [16, 32), factors [32, 48)
    float* sl = sm + 16;
    float* cz = sm + 32;
    // Every load at once: the lane's 4 dims' split values (lanes past hd: zeros, nothing
    // stored), the gates, the split maxima and sums.
    float v[4][16];
    if (nsplit == 16 && hd == 128) {
        // (The decode step's shape: every load in the head's 16 partials, at constant offsets,
        // no test a load; splits past ns are read and left out by merge_splits' selects.)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int u = 0; u < 16; u++) v[j][u] = __ldcg(pp + u * 130 + 2 + lane + 32 * j);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int dd = lane + 32 * j;
#pragma unroll
            for (int u = 0; u < 16; u++) v[j][u] = u < ns && dd < hd ? __ldcg(pp + u * (hd + 2) + 2 + dd) : 0.f;
        }
    }
    float gv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int dd = lane + 32 * j;
        if (gate_mode == 1) gv[j] = g[(size_t)m * ldg + h];
        else if (gate_mode == 2 && dd < hd) gv[j] = g[(size_t)m * ldg + h * hd + dd];
    }
    if (lane < ns) {
        sm[lane] = __ldcg(pp + lane * (hd + 2));
        sl[lane] = __ldcg(pp + lane * (hd + 2) + 1);
    }
    __syncwarp();
    float sk = sink ? sink[h] : -INFINITY;
    float mx = sk;
    for (int z = 0; z < ns; z++) mx = fmaxf(mx, sm[z]);
    if (lane < ns) cz[lane] = sl[lane] == 0.f ? 0.f : expf(sm[lane] - mx);
    __syncwarp();
    float l0 = sink ? expf(sk - mx) : 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int dd = lane + 32 * j;
        float l = l0, a = 0.f;
        merge_splits<16>(pp, ns, hd, dd, cz, sl, v[j], true, l, a);
        float o = (a / l) * vscale;
        if (gate_mode == 1 || gate_mode == 2) o *= softplus_f(gv[j]);
        if (dd < hd) out[(size_t)m * ldo + h * hd + dd] = o;
    }
}
// attention_decode_gqa_qk (KernelSet attn_qk): qk_norm_rope_store and attention_decode_gqa as one launch, for
// passes in which every row is the only row of its sequence (decode steps; not DFlash, whose rows
// see each other's keys). Block (m, kvh, z) norms and rotates its G query heads itself, into
// shared memory (the same expressions as qk_norm_rope_kv_t, so the same values the two-kernel path
// reads back from q); the block whose split holds the row's own key (the split's last key)
// also norms and rotates the KV head's new key in warp G, writes K and V into the cache and keeps
// the stored values in shared memory (kp, vp), from which its last tile takes that key (nothing
// reads the slot from memory in this launch; only the writer block's split reaches position p). The first tile's page-table entries and K/V rows are loaded
// before the norms. grid (M, nkv, nsplit), block 32 * (G + 1). Same bits as the two kernels.
// PRE (attention_gqa_qkp, KernelSet gqa_pre, off: within the noise in PERF.md run 219): the exit test also
// reads the sequence row (never negative), so ptxas issues its load with the position's instead
// of after the exit that needs the position (the SASS of attention_decode_gqa_qk: position, exit,
// sequence row, page entries, K/V rows, four dependent round trips before the wait; three with
// it). The same values, so the same bits.
// CL (attention_gqa_qkc, KernelSet gqa_cl, off: slower in PERF.md runs 222 and 223): launched in clusters
// of the row's nsplit (<= 16) split blocks of a KV head (cluster dims (1, 1, nsplit)), which merge
// their splits themselves instead of an attention_decode_merge16 launch: each block keeps its G
// partials in shared memory, and after a cluster barrier block z merges its slice of the G x hd
// outputs from the ns blocks' partials (distributed shared memory), with attention_merge_r<16>'s
// arithmetic in the same order on the same values (merge_splits), so the same bits. Blocks past
// the row's split count (z >= ns) stay for the two barriers and their slice of the merge.
// LM (attention_gqa_qkl, KernelSet gqa_lm, off: slower, PERF.md run 228): the split merge in this launch
// without clusters or a grid barrier: each split block takes a ticket on its (row, KV head)
// counter after its partial stores, and the last of the row's ns blocks merges the group's heads
// (gqa_last_merge), so no attention_decode_merge16 launch follows and no block waits for another.
template <typename KV, bool PRE = false, bool CL = false, bool LM = false>
__device__ __forceinline__ void attention_gqa_qk_t(const float* q, int ldq, float* out, int ldo, KV* kc, KV* vc,
                                                   const int* pos, const int* seqrow, const int* bt, int max_pages,
                                                   int page_size, int nh, int nkv, int hd, int window, const float* sink,
                                                   const float* g, int ldg, int gate_mode, float scale, float vscale,
                                                   int nsplit, float* part, const float* k, const float* v, int ldkv,
                                                   const float* qn_w, const float* kn_w, const float* inv_freq, int half,
                                                   float attn_factor, float eps, float kinv, float vinv,
                                                   unsigned* cnt = nullptr) {
    __shared__ __align__(16) bf16_t Ks[GQ_T * 136];
    __shared__ __align__(16) bf16_t Vs[GQ_T * 128];
    __shared__ __align__(16) float qs[16 * 128];
    // A warp's row: its head's normed values (head below), then gqa_tile's probabilities.
    __shared__ __align__(16) float buf[17][128];
    __shared__ float rc[64], rs[64];
    __shared__ __align__(16) bf16_t kp[128], vp[128];
    int m = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
    int G = nh / nkv;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = kvh * G + w;
    int srow = seqrow[m];
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int last = p;
    int len = last + 1 - lo;
    int ns = nsplit == 1 ? 1 : min(nsplit, (len + ATT_CHUNK - 1) / ATT_CHUNK);
    // (CL: a block past ns has k0 >= k1 below, so no tile and no key of its own.)
    if ((!CL && z >= ns) || (PRE && srow < 0)) return;
    int chunk = (len + ns - 1) / ns;
    // The split holding the row's own key (not always the last: with 64 splits of a long row
    // the last ones can be empty).
    bool writer = z == (last - lo) / chunk;
    bool isq = w < G, isk = w == G && writer;
    // This warp's head (query head h, or the new key in warp G of the writer block), its norm
    // weights and, for the key, the V row: lane l holds dims l, l + 32, ... (hd <= 128).
    const float* src = isq ? q + (size_t)m * ldq + h * hd : k + (size_t)m * ldkv + kvh * hd;
    const float* nw = isq ? qn_w : kn_w;
    float xv[4], nwv[4], vv[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int d = lane + 32 * j;
        nwv[j] = (isq || isk) && d < hd ? nw[d] : 0.f;
    }
    const int* btr = bt + (size_t)srow * max_pages;
    int kpage = isk ? btr[(p / page_size) % max_pages] : 0;
    float fr = threadIdx.x < half ? inv_freq[threadIdx.x] : 0.f;
    int k0 = lo + z * chunk, k1 = min(last + 1, k0 + chunk);
    const int ldk = hd + 8;
    const int nc = hd >> 3, ncm = nc_mul(nc);
    // One batch of a tile's loads (three items a thread: page-table entries, then K/V rows) and
    // its stores into shared memory; in the writer block the row's own key comes from kp / vp.
    uint4 kv4[3], vv4[3];
    auto load3 = [&](int t0, int tn, int i0) {
        TilePages tp(t0, page_size, max_pages);
        int page[3], in[3];
#pragma unroll
        for (int u = 0; u < 3; u++) {
            int i = i0 + u * blockDim.x;
            int pi = tp.index(div_nc(i, ncm), in[u]);
            page[u] = i < tn * nc ? btr[pi] : 0;
        }
#pragma unroll
        for (int u = 0; u < 3; u++) {
            int i = i0 + u * blockDim.x;
            if (i < tn * nc) {
                int j = div_nc(i, ncm), c = i - j * nc;
                int t = t0 + j;
                size_t off = (((size_t)page[u] * page_size + in[u]) * nkv + kvh) * hd + c * 8;
                if (t != p) {
                    kv4[u] = Kv<KV>::ld8(kc + off);
                    vv4[u] = Kv<KV>::ld8(vc + off);
                }
            }
        }
    };
    auto store3 = [&](int t0, int tn, int i0) {
#pragma unroll
        for (int u = 0; u < 3; u++) {
            int i = i0 + u * blockDim.x;
            if (i < tn * nc) {
                int j = div_nc(i, ncm), c = i - j * nc;
                bool own = t0 + j == p;
                *reinterpret_cast<uint4*>(Ks + j * ldk + c * 8) = own ? *reinterpret_cast<const uint4*>(kp + c * 8) : kv4[u];
                *reinterpret_cast<uint4*>(Vs + j * hd + c * 8) = own ? *reinterpret_cast<const uint4*>(vp + c * 8) : vv4[u];
            }
        }
    };
    if (k0 < k1) load3(k0, min(GQ_T, k1 - k0), threadIdx.x);
    // Everything above reads what no kernel of this pass writes (positions, tables, weights, the
    // cache's older keys); q, k, v come from the projection launched before this one: with PDL
    // (the launch attribute; a no-op without it) they are read after its completion.
    PDL_ENTRY();
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int d = lane + 32 * j;
        xv[j] = (isq || isk) && d < hd ? src[d] : 0.f;
        vv[j] = isk && d < hd ? v[(size_t)m * ldkv + kvh * hd + d] : 0.f;
    }
    // cos / sin (times attn_factor) of the row's rotary angles (half <= 64).
    if (threadIdx.x < half) {
        float ang = (float)p * fr;
        rc[threadIdx.x] = cosf(ang) * attn_factor;
        rs[threadIdx.x] = sinf(ang) * attn_factor;
    }
    __syncthreads();
    // RMSNorm + RoPE of one head (values x4, norm weights w4) in buffer bw: to qs (a query head)
    // or, as stored values, to the cache and kp / vp (the new key, with vv its V row).
    auto head = [&](const float* x4, const float* w4, float* bw, bool toq) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) ss = fmaf(x4[j], x4[j], ss);
        ss = warp_sum(ss);
        float inv = rsqrtf(ss / (float)hd + eps);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int d = lane + 32 * j;
            if (d < hd) bw[d] = w4[j] * (x4[j] * inv);
        }
        __syncwarp();
        if (toq && hd == 128 && half == 64) {
            // A query head of the sliding layers' shape (128 dims, all rotated): rope_at's
            // expressions with the branch for each dim known per j, so the four dims' shared
            // loads issue together instead of one dim's after another's branch.
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int d = lane + 32 * j;
                float y;
                if (j < 2) {
                    y = bw[d] * rc[d] - bw[d + 64] * rs[d];
                } else {
                    int i = d - 64;
                    y = bw[d] * rc[i] + bw[i] * rs[i];
                }
                qs[w * 128 + d] = y;
            }
            return;
        }
        size_t off = toq ? 0 : (((size_t)kpage * page_size + p % page_size) * nkv + kvh) * hd;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int d = lane + 32 * j;
            if (d >= hd) break;
            float y = rope_at(bw, rc, rs, d, half);
            if (toq) {
                qs[w * hd + d] = y;
            } else {
                KV kq = Kv<KV>::cvt(y * kinv), vq = Kv<KV>::cvt(vv[j] * vinv);
                kc[off + d] = kq;
                vc[off + d] = vq;
                kp[d] = Kv<KV>::to_bf16(kq);
                vp[d] = Kv<KV>::to_bf16(vq);
            }
        }
    };
    if (isq || isk) head(xv, nwv, buf[w], isq);
    bool final_ = nsplit == 1;
    float run_max = (final_ && sink && w < G) ? sink[h] : -INFINITY;
    float run_sum = (final_ && sink) ? 1.f : 0.f;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    int d = lane * 4;
    for (int t0 = k0; t0 < k1; t0 += GQ_T) {
        int tn = min(GQ_T, k1 - t0);
        __syncthreads();
        for (int i0 = threadIdx.x; i0 < tn * nc; i0 += 3 * blockDim.x) {
            if (t0 != k0 || i0 != (int)threadIdx.x) load3(t0, tn, i0);
            store3(t0, tn, i0);
        }
        __syncthreads();
        if (w < G) gqa_tile(Ks, Vs, ldk, qs + w * hd, tn, nc, hd, lane, scale, run_max, run_sum, a0, a1, a2, a3, buf[w]);
    }
    if constexpr (CL) {
        if (!final_) {
            gqa_cluster_merge(out, ldo, m, kvh, z, G, hd, ns, w, lane, d, run_max, run_sum, a0, a1, a2, a3, sink, g, ldg,
                              gate_mode, vscale, &buf[0][0]);
            return;
        }
    }
    if constexpr (LM) {
        if (!final_) {
            if (w < G && d < hd) {
                float* pp = part + (((size_t)m * nh + h) * nsplit + z) * (hd + 2);
                pp[2 + d] = a0; pp[3 + d] = a1; pp[4 + d] = a2; pp[5 + d] = a3;
                if (lane == 0) { pp[0] = run_max; pp[1] = run_sum; }
            }
            gqa_last_merge(part, cnt, m, kvh, nkv, nh, G, hd, nsplit, ns, out, ldo, sink, g, ldg, gate_mode, vscale,
                           &buf[0][0]);
            return;
        }
    }
    if (w >= G || d >= hd) return;
    if (!final_) {
        float* pp = part + (((size_t)m * nh + h) * nsplit + z) * (hd + 2);
        pp[2 + d] = a0; pp[3 + d] = a1; pp[4 + d] = a2; pp[5 + d] = a3;
        if (lane == 0) { pp[0] = run_max; pp[1] = run_sum; }
        return;
    }
    gqa_store(out, ldo, g, ldg, gate_mode, vscale, m, h, hd, d, run_sum, a0, a1, a2, a3);
}
#define GQK_PARAMS(KV)                                                                                             \
    const float *q, int ldq, float *out, int ldo, KV *kc, KV *vc, const int *pos, const int *seqrow, const int *bt, \
        int max_pages, int page_size, int nh, int nkv, int hd, int window, const float *sink, const float *g,       \
        int ldg, int gate_mode, float scale, float vscale, int nsplit, float *part, const float *k, const float *v,  \
        int ldkv, const float *qn_w, const float *kn_w, const float *inv_freq, int half, float attn_factor,          \
        float eps, float kinv, float vinv
#define GQK_ARGS q, ldq, out, ldo, kc, vc, pos, seqrow, bt, max_pages, page_size, nh, nkv, hd, window, sink, g, ldg, \
    gate_mode, scale, vscale, nsplit, part, k, v, ldkv, qn_w, kn_w, inv_freq, half, attn_factor, eps, kinv, vinv
// (PDL_ENTRY inside, after the loads that do not depend on the previous launch.)
extern "C" __global__ __launch_bounds__(288, 3) void attention_decode_gqa_qk(GQK_PARAMS(bf16_t)) { attention_gqa_qk_t<bf16_t>(GQK_ARGS); }
extern "C" __global__ __launch_bounds__(288, 3) void attention_decode_gqa_qk_fp8(GQK_PARAMS(u8)) { attention_gqa_qk_t<u8>(GQK_ARGS); }

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

// Prefill attention on tensor cores (flash-attention style, BF16 mma.sync, f32 softmax state).
// One block (4 warps, 16 query rows each) per (query tile, head); a tile is up to 64 consecutive
// rows of one sequence at consecutive positions (tiles[2i] = first row, tiles[2i+1] = rows), so K/V
// blocks of 64 keys are read once per tile instead of once per row. Keys are masked per row
// (causal, sliding window); the sink starts the softmax state; the output gate is applied last.
// Needs hd % 16 == 0 and hd <= 128. Q and P are split into BF16 hi + lo (two mma each) so the
// result stays within f32-kernel error (K/V are BF16 or FP8 in the cache): with P rounded to BF16
// alone (FlashAttention's choice) the fixtures' near-tied router picks flip (nvfp4-experts, FP8
// K/V: 0.15 relative). K and V fragments come from shared memory by ldmatrix (.trans for V), in
// the same mma order as element-wise fragment loads (bit-identical results).
#define FA_HD 128
#define FA_LD (FA_HD + 8)
__device__ __forceinline__ void fa_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    emu_mma_bf16(c, a0, a1, a2, a3, b0, b1);
#endif
}
__device__ __forceinline__ u32 fa_pack(float lo, float hi) { return bf2_pack(lo, hi); }
// Staged ring layers (ks set): keys at or after the first position s0 of the tile's sequence in
// this pass come from the stage (row sfirst + key - s0), older ones from the ring.
// 2^x by the SFU (ex2.approx.ftz: ~2 ulp, subnormal results flushed to 0; 2^-inf = 0).
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
#else
    y = exp2f(x);
    if (y < 0x1p-126f) y = 0.f;  // ftz
#endif
    return y;
}
// EX2: softmax exponentials as 2^(log2(e) s - m) with log2(e) folded into the score scale and the
// state kept in base-2 units (FlashAttention's and vLLM's form: one multiply and ex2.approx per
// score instead of expf's ~8 instructions); off: expf of the natural-unit scores.
// QS: the Q fragments (hi, lo) wait in dynamic shared memory (FA_QS_SMEM bytes: [64][FA_LD] hi
// then lo; each warp its own 16 rows) and come back by ldmatrix per k-step instead of holding 64
// registers, so 3 blocks fit an SM (168 registers); the same values in the same mma order.
#define FA_QS_SMEM (2 * 64 * FA_LD * 2)
template <typename KV, int SPLIT = 1, int EX2 = 0, int QS = 0>
__device__ __forceinline__ void attention_prefill_t(ATT_PARAMS(KV), const int* tiles, const KV* ks, const KV* vs,
                                                    const int* sfirst, bf16_t* xs, int M) {
    extern __shared__ __align__(16) bf16_t fa_q[];
    __shared__ __align__(16) bf16_t Ks[64 * FA_LD];
    __shared__ __align__(16) bf16_t Vs[64 * FA_LD];
    __shared__ unsigned koff[64];
    int r0 = tiles[2 * blockIdx.x], n = tiles[2 * blockIdx.x + 1];
    int h = blockIdx.y;
    int kvh = h / (nh / nkv);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, t4 = lane & 3;
    int p0 = pos[r0];
    int plast = p0 + n - 1;
    const int* btr = bt + (size_t)seqrow[r0] * max_pages;
    int srow = ks ? sfirst[r0] : 0;
    int s0 = ks ? pos[srow] : 0x7fffffff;
    // Key blocks start at multiples of 64 (not at the tile's first key), so every row sees the same
    // blocks whatever tile it is in; blocks fully masked for a row leave its state bit-identical.
    int klo = (window > 0 ? max(0, p0 + 1 - window) : 0) & ~63;
    // This thread's two rows.
    int ra = w * 16 + gq, rb = ra + 8;
    bool va = ra < n, vb = rb < n;
    int pa = p0 + ra, pb = p0 + rb;
    int loa = window > 0 ? pa + 1 - window : 0, lob = window > 0 ? pb + 1 - window : 0;
    // Q fragments (rows ra, rb; 8 k-steps of 16 dims).
    u32 qf[FA_HD / 16][4], ql[FA_HD / 16][4];
    const float* qa = q + (size_t)(r0 + (va ? ra : 0)) * ldq + h * hd;
    const float* qb = q + (size_t)(r0 + (vb ? rb : 0)) * ldq + h * hd;
#pragma unroll
    for (int kk = 0; kk < FA_HD / 16; kk++) {
        if (kk * 16 < hd) {
            int d0 = kk * 16 + 2 * t4;
            float2 x0 = va ? make_float2(qa[d0], qa[d0 + 1]) : make_float2(0.f, 0.f);
            float2 x1 = vb ? make_float2(qb[d0], qb[d0 + 1]) : make_float2(0.f, 0.f);
            float2 x2 = va ? make_float2(qa[d0 + 8], qa[d0 + 9]) : make_float2(0.f, 0.f);
            float2 x3 = vb ? make_float2(qb[d0 + 8], qb[d0 + 9]) : make_float2(0.f, 0.f);
            qf[kk][0] = fa_pack(x0.x, x0.y);
            qf[kk][1] = fa_pack(x1.x, x1.y);
            qf[kk][2] = fa_pack(x2.x, x2.y);
            qf[kk][3] = fa_pack(x3.x, x3.y);
            if (SPLIT) {
                ql[kk][0] = fa_pack(x0.x - bflo(qf[kk][0]), x0.y - bfhi(qf[kk][0]));
                ql[kk][1] = fa_pack(x1.x - bflo(qf[kk][1]), x1.y - bfhi(qf[kk][1]));
                ql[kk][2] = fa_pack(x2.x - bflo(qf[kk][2]), x2.y - bfhi(qf[kk][2]));
                ql[kk][3] = fa_pack(x3.x - bflo(qf[kk][3]), x3.y - bfhi(qf[kk][3]));
            }
            if constexpr (QS) {
                // A-fragment element (row, dims d0, d0 + 1) and (row, d0 + 8, d0 + 9) as stored pairs.
                u32* ha = reinterpret_cast<u32*>(fa_q + ra * FA_LD + d0);
                u32* hb = reinterpret_cast<u32*>(fa_q + rb * FA_LD + d0);
                ha[0] = qf[kk][0];
                hb[0] = qf[kk][1];
                ha[4] = qf[kk][2];
                hb[4] = qf[kk][3];
                if (SPLIT) {
                    u32* la_ = reinterpret_cast<u32*>(fa_q + (64 + ra) * FA_LD + d0);
                    u32* lb_ = reinterpret_cast<u32*>(fa_q + (64 + rb) * FA_LD + d0);
                    la_[0] = ql[kk][0];
                    lb_[0] = ql[kk][1];
                    la_[4] = ql[kk][2];
                    lb_[4] = ql[kk][3];
                }
            }
        }
    }
    if constexpr (QS) __syncwarp();
    float o[FA_HD / 8][4];
#pragma unroll
    for (int i = 0; i < FA_HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const float L2E = 1.4426950408889634f;
    if (EX2) scale *= L2E;
    float ma = sink ? (EX2 ? sink[h] * L2E : sink[h]) : -INFINITY, mb = ma;
    float la = sink ? 1.f : 0.f, lb = la;
    int nch = hd >> 3;  // 16-byte chunks per key
    for (int kb = klo; kb <= plast; kb += 64) {
        if (tid < 64) {
            int t = kb + tid;
            unsigned ko = 0xffffffffu;
            if (t <= plast) {
                if (t >= s0) {
                    ko = 0x80000000u | (unsigned)(((size_t)(srow + t - s0) * nkv + kvh) * hd);
                } else {
                    int page = btr[(t / page_size) % max_pages];
                    ko = (unsigned)((((size_t)page * page_size + t % page_size) * nkv + kvh) * hd);
                }
            }
            koff[tid] = ko;
        }
        __syncthreads();
        if constexpr (sizeof(KV) == 2) {
            // BF16 cache: every 16-byte chunk of the tile in flight at once (cp.async, zero-filled
            // for keys past the end), no registers held.
            for (int i = tid; i < 64 * nch; i += 128) {
                int key = i / nch, c = i % nch;
                unsigned ko = koff[key];
                const KV* kp = kc;
                const KV* vp = vc;
                u32 n = 0;
                if (ko != 0xffffffffu) {
                    bool st = (ko & 0x80000000u) != 0u;
                    size_t eo = (size_t)(ko & 0x7fffffffu) + c * 8;
                    kp = (st ? ks : kc) + eo;
                    vp = (st ? vs : vc) + eo;
                    n = 16;
                }
                cp_async16(&Ks[key * FA_LD + c * 8], kp, n);
                cp_async16(&Vs[key * FA_LD + c * 8], vp, n);
            }
            cp_async_wait_all();
        } else {
            for (int i = tid; i < 64 * nch; i += 128) {
                int key = i / nch, c = i % nch;
                unsigned ko = koff[key];
                uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
                if (ko != 0xffffffffu) {
                    bool st = (ko & 0x80000000u) != 0u;
                    size_t eo = (size_t)(ko & 0x7fffffffu) + c * 8;
                    kv = Kv<KV>::ld8((st ? ks : kc) + eo);
                    vv = Kv<KV>::ld8((st ? vs : vc) + eo);
                }
                *reinterpret_cast<uint4*>(&Ks[key * FA_LD + c * 8]) = kv;
                *reinterpret_cast<uint4*>(&Vs[key * FA_LD + c * 8]) = vv;
            }
        }
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int ni = 0; ni < 8; ni++) s[ni][0] = s[ni][1] = s[ni][2] = s[ni][3] = 0.f;
        // K fragments by ldmatrix: tiles (keys ni*8.., dims kk*16..), (+8 dims), then the same
        // for keys (ni+1)*8.. . Each s[ni] sums over kk in order, hi then lo; the mma of the 8
        // key groups are issued hi for all, then lo for all, so no mma waits on the one before.
#pragma unroll
        for (int kk = 0; kk < FA_HD / 16; kk++) {
            if (kk * 16 < hd) {
                u32 kb_[8][2];
#pragma unroll
                for (int ni = 0; ni < 8; ni += 2)
                    ldsm_x4(kb_[ni][0], kb_[ni][1], kb_[ni + 1][0], kb_[ni + 1][1],
                            &Ks[(ni * 8 + (lane & 7) + ((lane >> 4) << 3)) * FA_LD + kk * 16 + ((lane >> 3) & 1) * 8]);
                if constexpr (QS) {
                    // This warp's rows w*16.. of Q hi (then lo) at dims kk*16..: the fragments held
                    // in qf / ql otherwise.
                    const bf16_t* qp = fa_q + (w * 16 + (lane & 15)) * FA_LD + kk * 16 + (lane >> 4) * 8;
                    u32 a0, a1, a2, a3;
                    ldsm_x4(a0, a1, a2, a3, qp);
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], a0, a1, a2, a3, kb_[ni][0], kb_[ni][1]);
                    if (SPLIT) {
                        ldsm_x4(a0, a1, a2, a3, qp + 64 * FA_LD);
#pragma unroll
                        for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], a0, a1, a2, a3, kb_[ni][0], kb_[ni][1]);
                    }
                } else {
#pragma unroll
                for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kb_[ni][0], kb_[ni][1]);
                if (SPLIT) {
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], kb_[ni][0], kb_[ni][1]);
                }
                }
            }
        }
        float mxa = -INFINITY, mxb = -INFINITY;
        // Keys visible to every row of this warp (below the diagonal, inside the window) need no
        // mask; rows past the tile's end (va / vb false) are never written, so only their
        // (finite) values differ there.
        const int wp0 = p0 + w * 16;
        const bool full = kb + 63 <= wp0 && (window <= 0 || kb >= wp0 + 16 - window);
        if (full) {
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    s[ni][e] *= scale;
                    s[ni][2 + e] *= scale;
                }
        } else {
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = kb + ni * 8 + 2 * t4 + e;
                    bool oka = va && key <= pa && key >= loa;
                    bool okb = vb && key <= pb && key >= lob;
                    s[ni][e] = oka ? s[ni][e] * scale : -INFINITY;
                    s[ni][2 + e] = okb ? s[ni][2 + e] * scale : -INFINITY;
                }
        }
        {
            // Row maxima as a tree (max is exact: any order gives the same value).
            float ta[8], tb[8];
#pragma unroll
            for (int ni = 0; ni < 8; ni++) {
                ta[ni] = fmaxf(s[ni][0], s[ni][1]);
                tb[ni] = fmaxf(s[ni][2], s[ni][3]);
            }
#pragma unroll
            for (int st = 4; st >= 1; st >>= 1)
#pragma unroll
                for (int i = 0; i < st; i++) {
                    ta[i] = fmaxf(ta[i], ta[i + st]);
                    tb[i] = fmaxf(tb[i], tb[i + st]);
                }
            mxa = fmaxf(mxa, ta[0]);
            mxb = fmaxf(mxb, tb[0]);
        }
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
        float nma = fmaxf(ma, mxa), nmb = fmaxf(mb, mxb);
        float sa_ = nma == -INFINITY ? 0.f : nma, sb_ = nmb == -INFINITY ? 0.f : nmb;
        float ca = EX2 ? ex2_approx(ma - sa_) : expf(ma - sa_), cb = EX2 ? ex2_approx(mb - sb_) : expf(mb - sb_);
        ma = nma;
        mb = nmb;
        float suma = 0.f, sumb = 0.f;
#pragma unroll
        for (int ni = 0; ni < 8; ni++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[ni][e] - (e < 2 ? sa_ : sb_);
                s[ni][e] = EX2 ? ex2_approx(x) : expf(x);
            }
            suma += s[ni][0] + s[ni][1];
            sumb += s[ni][2] + s[ni][3];
        }
        suma += __shfl_xor_sync(0xffffffffu, suma, 1);
        suma += __shfl_xor_sync(0xffffffffu, suma, 2);
        sumb += __shfl_xor_sync(0xffffffffu, sumb, 1);
        sumb += __shfl_xor_sync(0xffffffffu, sumb, 2);
        la = __fmul_rn(la, ca) + suma;  // a product then a sum (never contracted to an fma)
        lb = __fmul_rn(lb, cb) + sumb;
        // Rescale only when some row's maximum moved (a factor of exactly 1 changes nothing).
        if (!__all_sync(0xffffffffu, ca == 1.f && cb == 1.f)) {
#pragma unroll
            for (int i = 0; i < FA_HD / 8; i++) {
                o[i][0] *= ca;
                o[i][1] *= ca;
                o[i][2] *= cb;
                o[i][3] *= cb;
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 a0 = fa_pack(s[2 * j][0], s[2 * j][1]), a1 = fa_pack(s[2 * j][2], s[2 * j][3]);
            u32 a2 = fa_pack(s[2 * j + 1][0], s[2 * j + 1][1]), a3 = fa_pack(s[2 * j + 1][2], s[2 * j + 1][3]);
            u32 l0 = 0, l1 = 0, l2 = 0, l3 = 0;
            if (SPLIT) {
                l0 = fa_pack(s[2 * j][0] - bflo(a0), s[2 * j][1] - bfhi(a0));
                l1 = fa_pack(s[2 * j][2] - bflo(a1), s[2 * j][3] - bfhi(a1));
                l2 = fa_pack(s[2 * j + 1][0] - bflo(a2), s[2 * j + 1][1] - bfhi(a2));
                l3 = fa_pack(s[2 * j + 1][2] - bflo(a3), s[2 * j + 1][3] - bfhi(a3));
            }
            // V fragments by ldmatrix.trans: tiles (keys j*16.., dims dp*16..), (keys +8), then the
            // same at dims +8: B fragments of o[2dp] and o[2dp+1]. Four dim blocks at a time: the
            // hi mma of all eight accumulators, then the lo mma (same order per accumulator).
#pragma unroll
            for (int dq = 0; dq < FA_HD / 16; dq += 4) {
                if (dq * 16 < hd) {
                    u32 vb_[8][2];
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        ldsm_x4_t(vb_[2 * u][0], vb_[2 * u][1], vb_[2 * u + 1][0], vb_[2 * u + 1][1],
                                  &Vs[(j * 16 + (lane & 15)) * FA_LD + (dq + u) * 16 + (lane >> 4) * 8]);
#pragma unroll
                    for (int u = 0; u < 8; u++) fa_mma(o[2 * dq + u], a0, a1, a2, a3, vb_[u][0], vb_[u][1]);
                    if (SPLIT) {
#pragma unroll
                        for (int u = 0; u < 8; u++) fa_mma(o[2 * dq + u], l0, l1, l2, l3, vb_[u][0], vb_[u][1]);
                    }
                }
            }
        }
        __syncthreads();
    }
    float ia = la > 0.f ? 1.f / la : 0.f, ib = lb > 0.f ? 1.f / lb : 0.f;
    // Output: f32 rows of `out`, or (xs set: the o_proj GEMM's input) their BF16 hi / lo split,
    // xs [M, ldo] hi then lo at xs + M * ldo, the values split_bf16 would make of them (one
    // 32-bit store per adjacent pair of dims).
#pragma unroll
    for (int dn = 0; dn < FA_HD / 8; dn++) {
        if (dn * 8 < hd) {
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                if (!(rr ? vb : va)) continue;
                int m = r0 + (rr ? rb : ra);
                float iv = rr ? ib : ia;
                int d = dn * 8 + 2 * t4;
                float v0 = (o[dn][2 * rr] * iv) * vscale, v1 = (o[dn][2 * rr + 1] * iv) * vscale;
                if (gate_mode == 1) {
                    float gg = softplus_f(g[(size_t)m * ldg + h]);
                    v0 *= gg;
                    v1 *= gg;
                } else if (gate_mode == 2) {
                    v0 *= softplus_f(g[(size_t)m * ldg + h * hd + d]);
                    v1 *= softplus_f(g[(size_t)m * ldg + h * hd + d + 1]);
                }
                size_t at = (size_t)m * ldo + h * hd + d;
                if (xs) {
                    u32 hp = bf2_pack(v0, v1);
                    *reinterpret_cast<u32*>(xs + at) = hp;
                    *reinterpret_cast<u32*>(xs + (size_t)M * ldo + at) = bf2_pack(v0 - bflo(hp), v1 - bfhi(hp));
                } else {
                    *reinterpret_cast<float2*>(out + at) = make_float2(v0, v1);
                }
            }
        }
    }
}
// _x: base-2 exponentials (EX2 above; KernelSet attn_ex2).
extern "C" __global__ __launch_bounds__(128) void attention_prefill_flash(ATT_PARAMS(bf16_t), const int* tiles, const bf16_t* ks,
                                                                      const bf16_t* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<bf16_t, 1, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
extern "C" __global__ __launch_bounds__(128) void attention_prefill_flash_fp8(ATT_PARAMS(u8), const int* tiles, const u8* ks,
                                                                          const u8* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<u8, 1, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
// _q: _x with Q in shared memory at 3 blocks / SM (QS above; KernelSet attn_q; dynamic shared
// memory FA_QS_SMEM).
extern "C" __global__ __launch_bounds__(128, 3) void attention_prefill_flash_qsmem(ATT_PARAMS(bf16_t), const int* tiles, const bf16_t* ks,
                                                                         const bf16_t* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<bf16_t, 1, 1, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
extern "C" __global__ __launch_bounds__(128, 3) void attention_prefill_flash_qsmem_fp8(ATT_PARAMS(u8), const int* tiles, const u8* ks,
                                                                             const u8* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<u8, 1, 1, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}

// attention_tc_qk3l's merge (see attention_tc_t, LM): every thread of a split block calls it after
// its partial stores. The ticket (last_block_ticket) as gqa_last_merge's; the block that draws
// the row's last one copies the group's partials (G heads x nsplit splits x (hd + 2) floats, contiguous; the host
// keeps nsplit (hd + 2) a multiple of 4, so 16-byte pieces) from L2 into its shared memory at
// `sp` (the stages, free by then) in one round trip, then merges output e = (head, dim) a thread
// at a time with attention_merge_r<16, TC_CHUNK>'s expressions in the same order (the maximum
// over the sink and the split maxima in split order, the split factors, merge_splits), so the
// same bits as attention_decode_tc_merge16 after the launch. ns <= 16, G <= 16.
__device__ __forceinline__ void tc_last_merge(const float* part, unsigned* cnt, int m, int kvh, int nkv, int nh, int G,
                                              int hd, int nsplit, int ns, float* out, int ldo, const float* sink,
                                              const float* g, int ldg, int gate_mode, float vscale, float* sp) {
    __shared__ float tmx[16], tcz[16 * 16], tsl[16 * 16];
    if (!last_block_ticket(cnt + (size_t)m * nkv + kvh, ns)) return;
    ns = min(ns, 16);
    const int ld = hd + 2;
    const float* src = part + ((size_t)m * nh + (size_t)kvh * G) * nsplit * ld;
    int n4 = (G * nsplit * ld) >> 2;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) cp_async16(sp + 4 * i, src + 4 * i, 16u);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    for (int t = threadIdx.x; t < G * 16; t += blockDim.x) {
        int r = t >> 4, z = t & 15;
        const float* ph = sp + (size_t)r * nsplit * ld;
        float mx = sink ? sink[kvh * G + r] : -INFINITY;
        for (int u = 0; u < ns; u++) mx = fmaxf(mx, ph[u * ld]);
        if (z == 0) tmx[r] = mx;
        if (z < ns) {
            float sl = ph[z * ld + 1];
            tsl[t] = sl;
            tcz[t] = sl == 0.f ? 0.f : expf(ph[z * ld] - mx);
        }
    }
    __syncthreads();
#pragma unroll 1
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x) {
        int r = e / hd, dd = e - r * hd, h = kvh * G + r;
        float mx = tmx[r], sk = sink ? sink[h] : -INFINITY;
        float l = sink ? expf(sk - mx) : 0.f, a = 0.f;
        float v[16];
        merge_splits<16>(sp + (size_t)r * nsplit * ld, ns, hd, dd, tcz + r * 16, tsl + r * 16, v, false, l, a);
        float o = (a / l) * vscale;
        if (gate_mode == 1) o *= softplus_f(g[(size_t)m * ldg + h]);
        else if (gate_mode == 2) o *= softplus_f(g[(size_t)m * ldg + h * hd + dd]);
        out[(size_t)m * ldo + h * hd + dd] = o;
    }
}

// ---- attention_decode_tc (KernelSet attn_tc): the split-KV decode attention on tensor cores ----------
// The weight-streaming regime's decode attention (decode steps, DFlash propose / verify) for GQA
// groups of G <= 16 query heads, hd % 16 == 0, hd <= 128. One block of 4 warps per (row, KV
// head, split); a row's splits follow tc_splits (at least 64 keys each, 16 splits for a 2K row,
// more past 8K keys), fewer and longer than attention_gqa's 32-key ones, and each 16 keys cost
// a few mma instead of a serial chain per 32 keys.
// The split's keys go in steps of 16, step j to warp j % 4, which stages the step's K and V rows
// (BF16; an FP8 cache is converted on the way) in its own shared memory, TC_NST steps in flight
// (cp.async for a BF16 cache), and, FlashAttention-2 style with the G heads as the mma's rows
// (padded to 16):
//   S (heads x 16 keys) = Q . K^T, Q split into BF16 hi + lo (two mma per 16 dims), times scale;
//   online softmax per head (running max per warp, partial sums per lane);
//   O (heads x hd) = O * corr + P . V, P split into hi + lo, taken from S's fragments.
// Q's hi and lo halves wait in shared memory (written once by the block, read by ldmatrix). The
// four warps' states are combined in warp order and the split's partial (max, sum, acc[hd] per
// head) written for attention_merge_tc / _tc64, or with nsplit == 1 the output (sink, V scale,
// gate). A row's arithmetic depends only on its own keys and length, never on the pass, so a
// DFlash verify row is bit-identical to the same row decoded alone. K and V come from the cache
// for every key (the row's own key included): the q/k norm + K/V write runs before it.
// QK (attention_decode_tc_qk, KernelSet attn_tc with attn_qk, for passes whose rows are each alone in
// their sequence): the q/k norm + RoPE + K/V write of qk_norm_rope_kv_t inside the launch, as
// attention_decode_gqa_qk does for attention_gqa: every block norms and rotates its G query heads (the
// same expressions, so the same q bits), the block whose split holds the row's own key p (its last
// key) also the new key, writes K and V to the cache and stages key p from the stored values it
// keeps in shared memory (nothing reads that slot from memory in this launch). Every other key
// was written by an earlier pass, so the first steps' K/V loads are issued before the PDL wait.
// Same bits as qk_norm_rope_store + attention_decode_tc.
// grid (M, nkv, nsplit), block 128, dynamic shared memory ATC_SMEM bytes (ATC_QK_SMEM for _qk).
#define TC_NST 2
#define TC_LD 136                                // staged row stride in BF16 (272 bytes)
#define TC_STAGE (2 * 16 * TC_LD)                // K then V rows of one 16-key step
#define TC_WSMEM (NST * TC_STAGE)                // one warp's stages (BF16 elements; NST: the kernel's stages)
#define TC_QOFF (4 * TC_WSMEM)                   // Q hi then lo rows ([16][TC_LD] each)
#define TC_CL 136                                // the warps' O rows in the combine (floats)
#define ATC_SMEM ((TC_QOFF + 2 * 16 * TC_LD) * 2)   // 78,336 bytes (NST 2)
#define ATC_QK_SMEM (ATC_SMEM + 4 * 128 * 4)        // + the warps' norm buffers: 80,384 (NST 3: 115,200)
// Every fragment loop runs over 128 dims (8 steps of 16) whatever hd is, so it unrolls into
// independent mma chains: with hd < 128 the staged rows' dims past hd are zero (the block clears
// its shared memory first), and so are Q's.
// NST: K/V steps a warp has in flight (TC_NST; attention_decode_tc_qk_3stage: 3, so a 2K row's 9-step split
// has every step of warp 0 asked for before the PDL wait too; 115 KB of shared memory).
// PRE (attention_tc_qk3p, KernelSet tc_pre, off: within the noise in PERF.md run 219; QK, half <= 64): the
// chain before the wait shortened, the same values, so the same bits. Without it the SASS has
// the position's load, the exit test, then the sequence row's load, then stage 0's page entry,
// its copies (which wait on it), stage 1's page entry, ...: five dependent round trips, and the
// blocks of this launch only get an SM as the q|k|v|g GEMV before it ends. With it the sequence
// row is loaded with the position and every stage's page entry before any copy: two. Also the
// q/k norm weights, the rotary frequencies and the new key's page entry, which no launch of the
// pass writes, are loaded before the PDL wait (as attention_decode_gqa_qk does) instead of with q after
// it (the step's weight stream evicts them from L2: DRAM round trips beside q's L2 one).
// LM (attention_tc_qk3l, KernelSet tc_lm, off: slower, PERF.md run 228; with QK): the split merge in the
// launch, as attention_gqa_qkl does it: a ticket on the (row, KV head) counter after the partial
// stores, and the row's last split block merges the group's heads (tc_last_merge), so no
// attention_decode_tc_merge16 launch follows.
template <typename KV, bool QK = false, int NST = TC_NST, bool PRE = false, bool LM = false>
__device__ __forceinline__ void attention_tc_t(ATT_PARAMS(KV), int nsplit, float* part, const int* kend, const float* k = nullptr,
                                               const float* v = nullptr, int ldkv = 0, const float* qn_w = nullptr,
                                               const float* kn_w = nullptr, const float* inv_freq = nullptr, int half = 0,
                                               float attn_factor = 1.f, float eps = 0.f, float kinv = 1.f, float vinv = 1.f,
                                               unsigned* cnt = nullptr) {
    extern __shared__ __align__(16) bf16_t atc_s[];
    __shared__ float rc[64], rs[64];
    __shared__ __align__(16) bf16_t kp[128], vp[128];
    __shared__ float smx[4][16], ssm[4][16], cf[4][16], rl[16], rmx[16];
    if (!QK) {
        pdl_wait();
        pdl_launch();
    }
    int m = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
    int G = nh / nkv;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, lg = lane >> 2, lt = lane & 3;
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int last = key_last(p, kend, m, window);
    int len = last + 1 - lo;
    int ns = tc_splits(len, nsplit);
    // PRE: the sequence row read with the position (the test makes ptxas issue its load before
    // the exit; a row is never negative), not after the exit that needs the position: one
    // round trip fewer before the first page entry.
    int srow = PRE ? seqrow[m] : 0;
    if (z >= ns || (PRE && srow < 0)) return;
    STAMP();  // (LAGUNA_STAMP builds: the timeline's record of this block, its wait time set below)
    int chunk = (len + ns - 1) / ns;
    int k0 = lo + z * chunk, k1 = min(last + 1, k0 + chunk);
    int nsteps = k1 > k0 ? (k1 - k0 + 15) >> 4 : 0;
    int mine = nsteps > w ? (nsteps - w + 3) >> 2 : 0;  // this warp's steps: w, w + 4, ...
    const int* btr = bt + (size_t)(PRE ? srow : seqrow[m]) * max_pages;
    const int nc = hd >> 3;
    bf16_t* ws = atc_s + (size_t)w * TC_WSMEM;
    bf16_t* qhi = atc_s + TC_QOFF;
    bf16_t* qlo = qhi + 16 * TC_LD;
    if (hd < 128) {
        // Dims past hd: zero in every staged row and in Q (nothing below writes them).
        uint4* s4 = reinterpret_cast<uint4*>(atc_s);
        for (int i = threadIdx.x; i < (TC_QOFF + 2 * 16 * TC_LD) / 8; i += blockDim.x) s4[i] = make_uint4(0u, 0u, 0u, 0u);
        __syncthreads();
    }
    // QK: this block's split holds key p (the last key of a causal row).
    const bool writer = QK && (p - lo) / chunk == z;
    // Stage step j (keys k0 + 16 j ..) into stage st: lane l takes key l % 16 (its cache row by the
    // TilePages rule) and its 16-byte pieces l / 16, + 2, ...; keys past the split are zero-filled
    // (P is 0 there, and 0 x garbage could be NaN). QK: key p comes from kp / vp once the norms
    // are done (`after`), else it is left for the patch below.
    const int kr = lane & 15, kc0 = lane >> 4;
    // QK: key p's K and V row (this lane's pieces) into a stage row from the stored values.
    auto put_key_p = [&](bf16_t* Kd) {
        for (int c = kc0; c < nc; c += 2) {
            *reinterpret_cast<uint4*>(Kd + c * 8) = *reinterpret_cast<const uint4*>(kp + c * 8);
            *reinterpret_cast<uint4*>(Kd + 16 * TC_LD + c * 8) = *reinterpret_cast<const uint4*>(vp + c * 8);
        }
    };
    // Stage j's cache offset for this lane's key (0 past the split).
    auto stage_off = [&](int j) -> size_t {
        size_t off = 0;
        if (k0 + 16 * j + kr < k1) {
            TilePages tp(k0 + 16 * j, page_size, max_pages);
            int in;
            int pi = tp.index(kr, in);
            off = (((size_t)btr[pi] * page_size + in) * nkv + kvh) * hd;
        }
        return off;
    };
    // PRE: the same offset with the page entry loaded whether or not the key is in the split (its
    // index is in the row's table either way), so no branch keeps one stage's load behind another
    // stage's copies.
    auto stage_off_pre = [&](int j) -> size_t {
        TilePages tp(k0 + 16 * j, page_size, max_pages);
        int in;
        int pi = tp.index(kr, in);
        int pg = btr[pi];
        return k0 + 16 * j + kr < k1 ? (((size_t)pg * page_size + in) * nkv + kvh) * hd : 0;
    };
    // Stage j's copies at cache offset off.
    auto stage_at = [&](int j, int st, bool after, size_t off) {
        int key = k0 + 16 * j + kr;
        bf16_t* Kd = ws + st * TC_STAGE + kr * TC_LD;
        bf16_t* Vd = Kd + 16 * TC_LD;
        bool ok = key < k1;
        if (writer && key == p) {
            if (after) put_key_p(Kd);
        } else {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int c = kc0 + 2 * u;
                if (hd == 128 || c < nc) {
                    if constexpr (sizeof(KV) == 2) {
                        cp_async16(Kd + c * 8, kc + off + c * 8, ok ? 16u : 0u);
                        cp_async16(Vd + c * 8, vc + off + c * 8, ok ? 16u : 0u);
                    } else {
                        uint4 kk = make_uint4(0u, 0u, 0u, 0u), vv = kk;
                        if (ok) {
                            kk = Kv<KV>::ld8(kc + off + c * 8);
                            vv = Kv<KV>::ld8(vc + off + c * 8);
                        }
                        *reinterpret_cast<uint4*>(Kd + c * 8) = kk;
                        *reinterpret_cast<uint4*>(Vd + c * 8) = vv;
                    }
                }
            }
        }
        cp_async_commit();
    };
    auto stage = [&](int j, int st, bool after) { stage_at(j, st, after, stage_off(j)); };
    // Q row r, dims c, c + 1 as BF16 hi / lo pairs into shared memory.
    auto put_q = [&](int r, int c, float x0, float x1) {
        u32 h = bf2_pack(x0, x1);
        *reinterpret_cast<u32*>(qhi + r * TC_LD + c) = h;
        *reinterpret_cast<u32*>(qlo + r * TC_LD + c) = bf2_pack(x0 - bflo(h), x1 - bfhi(h));
    };
    // Pair e of Q's dims: row r, dims c and c + 1 (hd / 2 pairs a row).
    auto q_pair = [&](int e, int& r, int& c) {
        int pr = hd >> 1;
        r = hd == 128 ? e >> 6 : e / pr;
        c = 2 * (e - r * pr);
    };
    if (!QK) {
        // q rows of the group (written by qk_norm_rope_kv*), rows past G zero: coalesced pairs.
        const float* qr = q + (size_t)m * ldq + (size_t)kvh * G * hd;
        for (int e = threadIdx.x; e < 8 * hd; e += blockDim.x) {
            int r, c;
            q_pair(e, r, c);
            float x0 = 0.f, x1 = 0.f;
            if (r < G) {
                x0 = qr[(size_t)r * hd + c];
                x1 = qr[(size_t)r * hd + c + 1];
            }
            put_q(r, c, x0, x1);
        }
    }
    if (PRE) {
        // Every stage's page entry asked for before the first stage's copies (which wait on it).
        size_t offs[NST];
#pragma unroll
        for (int i = 0; i < NST; i++) offs[i] = stage_off_pre(w + 4 * i);
#pragma unroll
        for (int i = 0; i < NST; i++)
            if (i < mine) stage_at(w + 4 * i, i, false, offs[i]);
            else cp_async_commit();
    } else {
#pragma unroll
        for (int i = 0; i < NST; i++)
            if (i < mine) stage(w + 4 * i, i, false);
            else cp_async_commit();
    }
    // QK: the norms' items: 0..G-1 the query heads, item G the new key (writer block only); item
    // w + 4 u to warp w. PRE: their norm weights, this thread's rotary frequency (half <= 64 <
    // blockDim) and the new key's page entry, before the wait.
    float nwv[5][4];
    float fr = 0.f;
    int kpage = 0;
    if (QK && PRE) {
        int items = G + (writer ? 1 : 0);
#pragma unroll
        for (int u = 0; u < 5; u++) {
            int it = w + 4 * u;
            const float* nw = it < G ? qn_w : kn_w;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                int dd = lane + 32 * jj;
                nwv[u][jj] = it < items && dd < hd ? nw[dd] : 0.f;
            }
        }
        fr = (int)threadIdx.x < half ? inv_freq[threadIdx.x] : 0.f;
        kpage = writer ? btr[(p / page_size) % max_pages] : 0;
    }
    if (QK) {
        // Everything above read only what earlier passes and the host wrote.
        pdl_wait();
        pdl_launch();
        STAMP_MARK();
        // q/k norm + RoPE (qk_norm_rope_kv_t's expressions), each item's values loaded first.
        int items = G + (writer ? 1 : 0);
        float xv[5][4], vv[4];
#pragma unroll
        for (int u = 0; u < 5; u++) {
            int it = w + 4 * u;
            bool isq = it < G, live = it < items;
            const float* src = isq ? q + (size_t)m * ldq + (size_t)(kvh * G + it) * hd : k + (size_t)m * ldkv + (size_t)kvh * hd;
            const float* nw = isq ? qn_w : kn_w;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                int dd = lane + 32 * jj;
                bool in = live && dd < hd;
                xv[u][jj] = in ? src[dd] : 0.f;
                if (!PRE) nwv[u][jj] = in ? nw[dd] : 0.f;
            }
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            int dd = lane + 32 * jj;
            vv[jj] = writer && w == G % 4 && dd < hd ? v[(size_t)m * ldkv + (size_t)kvh * hd + dd] : 0.f;
        }
        if (!PRE) kpage = writer ? btr[(p / page_size) % max_pages] : 0;
        if (PRE) {
            if ((int)threadIdx.x < half) {
                float ang = (float)p * fr;
                rc[threadIdx.x] = cosf(ang) * attn_factor;
                rs[threadIdx.x] = sinf(ang) * attn_factor;
            }
        } else {
            for (int i = threadIdx.x; i < half; i += blockDim.x) {
                float ang = (float)p * inv_freq[i];
                rc[i] = cosf(ang) * attn_factor;
                rs[i] = sinf(ang) * attn_factor;
            }
        }
        // Q rows past the group are zero.
        for (int e = threadIdx.x; e < (16 - G) * 64; e += blockDim.x) put_q(G + (e >> 6), 2 * (e & 63), 0.f, 0.f);
        __syncthreads();
        float* bw = reinterpret_cast<float*>(atc_s + TC_QOFF + 2 * 16 * TC_LD) + w * 128;  // this warp's norm buffer
        size_t koff = (((size_t)kpage * page_size + p % page_size) * nkv + kvh) * hd;
#pragma unroll
        for (int u = 0; u < 5; u++) {
            int it = w + 4 * u;
            if (it < items) {
                bool isq = it < G;
                float ss = 0.f;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) ss = fmaf(xv[u][jj], xv[u][jj], ss);
                ss = warp_sum(ss);
                float inv = rsqrtf(ss / (float)hd + eps);
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    int dd = lane + 32 * jj;
                    if (dd < hd) bw[dd] = nwv[u][jj] * (xv[u][jj] * inv);
                }
                __syncwarp();
                if (isq) {
                    // Lane l: dims 2 l, 2 l + 1 (and + 64).
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) {
                        int dd = 2 * lane + 64 * jj;
                        if (dd < hd) put_q(it, dd, rope_at(bw, rc, rs, dd, half), rope_at(bw, rc, rs, dd + 1, half));
                    }
                } else {
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        int dd = lane + 32 * jj;
                        if (dd < hd) {
                            float y = rope_at(bw, rc, rs, dd, half);
                            KV kq = Kv<KV>::cvt(y * kinv), vq = Kv<KV>::cvt(vv[jj] * vinv);
                            const_cast<KV*>(kc)[koff + dd] = kq;
                            const_cast<KV*>(vc)[koff + dd] = vq;
                            kp[dd] = Kv<KV>::to_bf16(kq);
                            vp[dd] = Kv<KV>::to_bf16(vq);
                        }
                    }
                }
                __syncwarp();
            }
        }
    }
    __syncthreads();
    if (QK && writer) {
        // Key p's row if its step was staged above (before the norms): the writer's last step.
        int jl = nsteps - 1;
        if ((jl & 3) == w && (jl >> 2) < NST && (p - k0 - 16 * jl) == kr)
            put_key_p(ws + ((jl >> 2) % NST) * TC_STAGE + kr * TC_LD);
    }
    // Rows lg (a) and lg + 8 (b): running max, this lane's partial sum; O fragments (n-tile i:
    // dims 8 i + 2 lt, + 1 of rows lg / lg + 8).
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
    float o[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    // ldmatrix row addresses: A (Q) rows lane & 7 (+ 8 for lanes 8..15 / 24..31), dims + 8 for
    // lanes 16..31; B (K) keys lane & 7 (+ 8 for lanes 16..31), dims + 8 for lanes 8..15 / 24..31;
    // V (.trans) keys lane & 7 (+ 8 for lanes 8..15 / 24..31), dims + 8 for lanes 16..31.
    const int qrow = ((lane & 7) + ((lane >> 3) & 1) * 8) * TC_LD + (lane >> 4) * 8;
    const int krow = ((lane & 7) + ((lane >> 4) << 3)) * TC_LD + ((lane >> 3) & 1) * 8;
    const int vrow = qrow;
    for (int i = 0; i < mine; i++) {
        int st = i % NST;
        cp_async_wait_group<NST - 1>();
        __syncwarp();
        const bf16_t* Ks = ws + st * TC_STAGE;
        const bf16_t* Vs = Ks + 16 * TC_LD;
        int base = k0 + 16 * (w + 4 * i);
        // S = Q K^T: two n-tiles of 8 keys (c: keys 2 lt, + 1; d: 8 + 2 lt, + 1; [0, 1] row lg,
        // [2, 3] lg + 8), four accumulators each (Q hi / lo x even / odd 16 dims) added in a fixed
        // order, so the chains of dependent mma are 4 long instead of 16.
        float cs[4][4], ds[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) cs[a][b] = ds[a][b] = 0.f;
#pragma unroll
        for (int s = 0; s < 8; s++) {
            u32 a0, a1, a2, a3, l0, l1, l2, l3, b0, b1, b2, b3;
            ldsm_x4(a0, a1, a2, a3, qhi + qrow + 16 * s);
            ldsm_x4(l0, l1, l2, l3, qlo + qrow + 16 * s);
            ldsm_x4(b0, b1, b2, b3, Ks + krow + 16 * s);  // keys 0-7 dims lo | hi; keys 8-15 dims lo | hi
            fa_mma(cs[s & 1], a0, a1, a2, a3, b0, b1);
            fa_mma(cs[2 + (s & 1)], l0, l1, l2, l3, b0, b1);
            fa_mma(ds[s & 1], a0, a1, a2, a3, b2, b3);
            fa_mma(ds[2 + (s & 1)], l0, l1, l2, l3, b2, b3);
        }
        float c[4], d[4];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            c[b] = (cs[0][b] + cs[1][b]) + (cs[2][b] + cs[3][b]);
            d[b] = (ds[0][b] + ds[1][b]) + (ds[2][b] + ds[3][b]);
        }
        bool v0 = base + 2 * lt < k1, v1 = base + 2 * lt + 1 < k1, v8 = base + 8 + 2 * lt < k1, v9 = base + 9 + 2 * lt < k1;
        c[0] = v0 ? c[0] * scale : -INFINITY;
        c[1] = v1 ? c[1] * scale : -INFINITY;
        c[2] = v0 ? c[2] * scale : -INFINITY;
        c[3] = v1 ? c[3] * scale : -INFINITY;
        d[0] = v8 ? d[0] * scale : -INFINITY;
        d[1] = v9 ? d[1] * scale : -INFINITY;
        d[2] = v8 ? d[2] * scale : -INFINITY;
        d[3] = v9 ? d[3] * scale : -INFINITY;
        // Key base (lt = 0, c[0]) is always in the split, so every row's step maximum is finite.
        float xa = fmaxf(fmaxf(c[0], c[1]), fmaxf(d[0], d[1]));
        float xb = fmaxf(fmaxf(c[2], c[3]), fmaxf(d[2], d[3]));
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
        float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
        float ca = expf(ma - na), cb = expf(mb - nb);
        ma = na;
        mb = nb;
        float pc0 = expf(c[0] - na), pc1 = expf(c[1] - na), pd0 = expf(d[0] - na), pd1 = expf(d[1] - na);
        float pc2 = expf(c[2] - nb), pc3 = expf(c[3] - nb), pd2 = expf(d[2] - nb), pd3 = expf(d[3] - nb);
        la = la * ca + ((pc0 + pc1) + (pd0 + pd1));
        lb = lb * cb + ((pc2 + pc3) + (pd2 + pd3));
        // P as the A operand of P . V (k = the step's 16 keys), hi + lo.
        u32 ph[4], pl[4];
        ph[0] = bf2_pack(pc0, pc1);
        ph[1] = bf2_pack(pc2, pc3);
        ph[2] = bf2_pack(pd0, pd1);
        ph[3] = bf2_pack(pd2, pd3);
        pl[0] = bf2_pack(pc0 - bflo(ph[0]), pc1 - bfhi(ph[0]));
        pl[1] = bf2_pack(pc2 - bflo(ph[1]), pc3 - bfhi(ph[1]));
        pl[2] = bf2_pack(pd0 - bflo(ph[2]), pd1 - bfhi(ph[2]));
        pl[3] = bf2_pack(pd2 - bflo(ph[3]), pd3 - bfhi(ph[3]));
#pragma unroll
        for (int s = 0; s < 8; s++) {
            // V rows (keys) by ldmatrix.trans: keys 0-7 | 8-15 of dims 16 s .. + 7, then of + 8 .. 15.
            u32 b0, b1, b2, b3;
            ldsm_x4_t(b0, b1, b2, b3, Vs + vrow + 16 * s);
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                float* oo = o[2 * s + h2];
                oo[0] *= ca;
                oo[1] *= ca;
                oo[2] *= cb;
                oo[3] *= cb;
                u32 e0 = h2 ? b2 : b0, e1 = h2 ? b3 : b1;
                fa_mma(oo, ph[0], ph[1], ph[2], ph[3], e0, e1);
                fa_mma(oo, pl[0], pl[1], pl[2], pl[3], e0, e1);
            }
        }
        __syncwarp();
        if (i + NST < mine) stage(w + 4 * (i + NST), st, true);
        else cp_async_commit();
    }
    cp_async_wait_all();
    // Row sums over the four lanes of a row (lt = 0..3, in a fixed order).
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    // The warps' states to shared memory (reusing the stages): per warp 16 rows of O at a stride
    // of TC_CL floats (pairs of a row's lanes on distinct banks), max and sum apart.
    __syncthreads();
    float* sacc = reinterpret_cast<float*>(atc_s);
    float* sw = sacc + (size_t)w * 16 * TC_CL;
    if (lt == 0) {
        smx[w][lg] = ma;
        ssm[w][lg] = la;
        smx[w][lg + 8] = mb;
        ssm[w][lg + 8] = lb;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int col = 8 * i + 2 * lt;
        *reinterpret_cast<float2*>(sw + lg * TC_CL + col) = make_float2(o[i][0], o[i][1]);
        *reinterpret_cast<float2*>(sw + (lg + 8) * TC_CL + col) = make_float2(o[i][2], o[i][3]);
    }
    __syncthreads();
    // Per head r: the block's max, each warp's factor exp(m_w - max) (0 for an empty warp) and
    // the sum, warps in order.
    if (threadIdx.x < G) {
        int r = threadIdx.x;
        float mx = fmaxf(fmaxf(smx[0][r], smx[1][r]), fmaxf(smx[2][r], smx[3][r]));
        float l = 0.f;
#pragma unroll
        for (int ww = 0; ww < 4; ww++) {
            float cw = ssm[ww][r] == 0.f ? 0.f : expf(smx[ww][r] - mx);
            cf[ww][r] = cw;
            l += ssm[ww][r] * cw;
        }
        rl[r] = l;
        rmx[r] = mx;
        if (nsplit > 1) {
            float* pp = part + (((size_t)m * nh + kvh * G + r) * nsplit + z) * (hd + 2);
            pp[0] = mx;
            pp[1] = l;
        }
    }
    __syncthreads();
    bool final_ = nsplit == 1;
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x) {
        int r = hd == 128 ? e >> 7 : e / hd;
        int dd = e - r * hd;
        int h = kvh * G + r;
        float a = 0.f;
#pragma unroll
        for (int ww = 0; ww < 4; ww++) {
            float cw = cf[ww][r];
            a += (cw == 0.f ? 0.f : sacc[((size_t)ww * 16 + r) * TC_CL + dd] * cw);
        }
        if (!final_) {
            part[(((size_t)m * nh + h) * nsplit + z) * (hd + 2) + 2 + dd] = a;
            continue;
        }
        float l = rl[r], mx = rmx[r];
        if (sink) {
            float nm = fmaxf(mx, sink[h]);
            float cs = l == 0.f ? 0.f : expf(mx - nm);
            a *= cs;
            l = l * cs + expf(sink[h] - nm);
        }
        float ov = (a / l) * vscale;
        if (gate_mode == 1) ov *= softplus_f(g[(size_t)m * ldg + h]);
        else if (gate_mode == 2) ov *= softplus_f(g[(size_t)m * ldg + h * hd + dd]);
        out[(size_t)m * ldo + h * hd + dd] = ov;
    }
    if constexpr (LM) {
        if (!final_)
            tc_last_merge(part, cnt, m, kvh, nkv, nh, G, hd, nsplit, ns, out, ldo, sink, g, ldg, gate_mode, vscale,
                          reinterpret_cast<float*>(atc_s));
    }
}
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc(ATT_PARAMS(bf16_t), int nsplit, float* part, const int* kend) {
    attention_tc_t<bf16_t>(ATT_ARGS, nsplit, part, kend);
}
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc_fp8(ATT_PARAMS(u8), int nsplit, float* part, const int* kend) {
    attention_tc_t<u8>(ATT_ARGS, nsplit, part, kend);
}
// attention_decode_tc_qk's PDL wait comes after its first K/V loads (inside attention_tc_t).
#define TC_QK_ARGS                                                                                                      \
    q, ldq, out, ldo, kc, vc, pos, seqrow, bt, max_pages, page_size, nh, nkv, hd, window, sink, g, ldg, gate_mode, scale, \
        vscale, nsplit, part, nullptr, k, v, ldkv, qn_w, kn_w, inv_freq, half, attn_factor, eps, kinv, vinv
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc_qk(GQK_PARAMS(bf16_t)) { attention_tc_t<bf16_t, true>(TC_QK_ARGS); }
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc_qk_fp8(GQK_PARAMS(u8)) { attention_tc_t<u8, true>(TC_QK_ARGS); }
// The decode step's one-wave grids with three K/V steps a warp in flight (KernelSet tc_nst3).
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc_qk_3stage(GQK_PARAMS(bf16_t)) { attention_tc_t<bf16_t, true, 3>(TC_QK_ARGS); }
extern "C" __global__ void attention_decode_tc_merge16(MERGE_PARAMS) { attention_merge_r<16, TC_CHUNK>(MERGE_ARGS); }
extern "C" __global__ void attention_decode_tc_merge64(MERGE_PARAMS) { attention_merge_r<64, TC_CHUNK>(MERGE_ARGS); }
