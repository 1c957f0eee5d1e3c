// The attention family's shared helpers: the FP8 E4M3 conversions, the K/V element loads (`Kv`),
// RoPE's per-dim expression, the kernels' common parameter lists, the key tiles' page arithmetic
// (`TilePages`) and the BF16 mma. kernels/src/lib.rs builds the family as one NVRTC program: this
// header, then qk_rope.cu, decode.cu, merge.cu, prefill.cu and decode_tc.cu.
//
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

// The parameters of the attention kernels (decode, prefill, tensor-core decode); GQK_: those of the
// decode forms with the q/k norm + RoPE + K/V write inside (attention_decode_gqa_qk, _tc_qk).
#define ATT_PARAMS(KV)                                                                                             \
    const float *q, int ldq, float *out, int ldo, const KV *kc, const KV *vc, const int *pos, const int *seqrow,   \
        const int *bt, int max_pages, int page_size, int nh, int nkv, int hd, int window, const float *sink,       \
        const float *g, int ldg, int gate_mode, float scale, float vscale
#define ATT_ARGS q, ldq, out, ldo, kc, vc, pos, seqrow, bt, max_pages, page_size, nh, nkv, hd, window, sink, g, ldg, gate_mode, scale, vscale
#define GQK_PARAMS(KV)                                                                                             \
    const float *q, int ldq, float *out, int ldo, KV *kc, KV *vc, const int *pos, const int *seqrow, const int *bt, \
        int max_pages, int page_size, int nh, int nkv, int hd, int window, const float *sink, const float *g,       \
        int ldg, int gate_mode, float scale, float vscale, int nsplit, float *part, const float *k, const float *v,  \
        int ldkv, const float *qn_w, const float *kn_w, const float *inv_freq, int half, float attn_factor,          \
        float eps, float kinv, float vinv
#define GQK_ARGS q, ldq, out, ldo, kc, vc, pos, seqrow, bt, max_pages, page_size, nh, nkv, hd, window, sink, g, ldg, \
    gate_mode, scale, vscale, nsplit, part, k, v, ldkv, qn_w, kn_w, inv_freq, half, attn_factor, eps, kinv, vinv

// Where the keys t0 + j (j < the tile's keys) of a tile live: page-table index (t / page_size) % max_pages
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

// c += a . b: mma.sync m16n8k16, BF16 in, f32 accumulate (the flash prefill and the tensor-core decode).
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

// ---- a decode row's keys and splits, and the split merge (decode.cu, merge.cu, decode_tc.cu) ----
// Last key a row at position p sees: p (causal), or for a non-causal draft block the block's
// last position kend[m] - 1, limited by the window to keys with |p - key| < window.
__device__ __forceinline__ int key_last(int p, const int* kend, int m, int window) {
    if (!kend) return p;
    int last = kend[m] - 1;
    return window > 0 ? min(last, p + window - 1) : last;
}
// Decode attention splits of at least ATT_CHUNK keys (attention_decode_head, attention_decode_gqa*).
#define ATT_CHUNK 32
// attention_decode_tc's splits of a row with `len` keys (its merges use the same): at least TC_SPLITS
// (16) where the row has TC_CHUNK (64) keys a split for them, more as the row grows so that no
// split has more than TC_SPAN (512) keys, at most nsplit (the grid's).
#define TC_CHUNK 64
#define TC_SPAN 512
#define TC_SPLITS 16
__device__ __forceinline__ int tc_splits(int len, int nsplit) {
    if (nsplit == 1) return 1;
    int want = max(TC_SPLITS, (len + TC_SPAN - 1) / TC_SPAN);
    return min(min(nsplit, want), (len + TC_CHUNK - 1) / TC_CHUNK);
}
// A thread's sum over the splits, U split values loaded at once (the first U already in v):
// l += sl[z] c_z, a += v_z c_z in split order, c_z = cz[z] (a split with c_z = 0 adds 0). Every
// split below ns wrote its partial (an empty one: sum 0, so c_z = 0).
template <int U>
__device__ __forceinline__ void merge_splits(const float* pp, int ns, int hd, int tid, const float* cz, const float* sl,
                                             float (&v)[U], float& l, float& a) {
    if (ns <= U) {
        // Every split's values already in v: the U steps without a branch, a
        // step past ns keeping l and a by a select (the same expressions as below, so the same
        // contraction into an FMA), so the shared loads of later splits are
        // issued ahead of earlier splits' sums (with a branch a split, each step waited for its
        // two loads in turn). The same operations on the same values, so the same bits.
#pragma unroll
        for (int u = 0; u < U; u++) {
            float c = cz[u], s = sl[u];
            float lf = l + s * c, af = a + (c == 0.f ? 0.f : v[u] * c);
            bool in = u < ns;
            l = in ? lf : l;
            a = in ? af : a;
        }
        return;
    }
    for (int z0 = 0; z0 < ns; z0 += U) {
        if (z0 > 0) {
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = z0 + u < ns ? pp[(z0 + u) * (hd + 2) + 2 + tid] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int z = z0 + u;
            if (z < ns) {
                float c = cz[z];
                l += sl[z] * c;
                a += (c == 0.f ? 0.f : v[u] * c);
            }
        }
    }
}

// attention_merge_t's halves: the row's split count (ch: the
// chunk of the attention kernel that wrote the partials, ATT_CHUNK or TC_CHUNK), read before the
// PDL wait, and after it head h of row m merged from its partials (block >= hd threads, every
// thread of the block calling): the thread's first U split values and its gate asked for with
// the block's split maxima and sums, then the sum in split order (merge_splits), out = a / l.
__device__ __forceinline__ int merge_nsplit(int m, int nsplit, const int* pos, int window, const int* kend, int ch) {
    int p = pos[m];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int len = key_last(p, kend, m, window) + 1 - lo;
    return ch == TC_CHUNK ? tc_splits(len, nsplit) : min(nsplit, (len + ch - 1) / ch);
}
template <int U>
__device__ __forceinline__ void merge_head(const float* part, int nsplit, float* out, int ldo, int nh, int hd,
                                             const float* sink, const float* g, int ldg, int gate_mode, float vscale,
                                             int m, int h, int ns, float sk) {
    __shared__ float sm[128], sl[128], cz[128];
    int tid = threadIdx.x;
    const float* pp = part + ((size_t)m * nh + h) * nsplit * (hd + 2);
    bool own = tid < hd;
    float v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = own && u < ns ? pp[u * (hd + 2) + 2 + tid] : 0.f;
    float gv = 0.f;
    if (own && gate_mode == 1) gv = g[(size_t)m * ldg + h];
    else if (own && gate_mode == 2) gv = g[(size_t)m * ldg + h * hd + tid];
    for (int z = tid; z < ns; z += blockDim.x) {
        sm[z] = pp[z * (hd + 2)];
        sl[z] = pp[z * (hd + 2) + 1];
    }
    __syncthreads();
    float mx = sk;
    for (int z = 0; z < ns; z++) mx = fmaxf(mx, sm[z]);
    for (int z = tid; z < ns; z += blockDim.x) cz[z] = sl[z] == 0.f ? 0.f : expf(sm[z] - mx);
    __syncthreads();
    if (!own) return;
    float l = sink ? expf(sk - mx) : 0.f;
    float a = 0.f;
    merge_splits<U>(pp, ns, hd, tid, cz, sl, v, l, a);
    float o = (a / l) * vscale;
    if (gate_mode == 1 || gate_mode == 2) o *= softplus_f(gv);
    out[(size_t)m * ldo + h * hd + tid] = o;
}
