// Attention: the per-head q/k RMSNorm + partial NeoX RoPE + K/V cache write
// (`qk_norm_rope_store[_fp8]`), and the staged ring layers' commit (`ring_commit`).

// grid (M, ceil((nh + nkv) / 4)), block 128: one warp per head (query heads, then KV heads), lane
// l holds dims l, l + 32, ... (hd <= 256). RMSNorm over the head (lane sums in dim order, then the
// warp), partial NeoX RoPE through a per-warp buffer, then q in place or K/V into the cache.
// K/V go to the cache, or with `ks` set to the pass's stage ([rows, nkv, hd], for a ring layer
// whose pass is longer than the ring's spare slots; ring_commit copies them after the attention).
// kinv / vinv = 1 / scale (1 for BF16).
// The head's values, its norm weights, the V row and the row's sequence index are loaded before
// the rotary table is built, and the page-table entry as soon as the position is known, not each
// after the step before it.
template <typename KV>
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
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        bool in = live && d < hd;
        xv[j] = in ? src[d] : 0.f;
        nwv[j] = in ? nw[d] : 0.f;
        vv[j] = in && !isq ? v[(size_t)m * ldkv + kh * hd + d] : 0.f;
    }
    int srow = 0;
    if (live && !isq && !ks) srow = seqrow[m];
    int p = pos[m];
    int page = 0;
    if (live && !isq && !ks) page = bt[(size_t)srow * max_pages + (p / page_size) % max_pages];
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
    for (int j = 0; j < 8; j++) ss = fmaf(xv[j], xv[j], ss);
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / (float)hd + eps);
    float* bw = buf[w];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d < hd) bw[d] = nwv[j] * (xv[j] * inv);
    }
    __syncwarp();
    size_t off = 0;
    if (!isq && !ks) off = (((size_t)page * page_size + p % page_size) * nkv + kh) * hd;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d >= hd) break;
        float y = rope_at(bw, rc, rs, d, half);
        if (isq) {
            q[(size_t)m * ldq + h * hd + d] = y;
        } else {
            KV kq = Kv<KV>::cvt(y * kinv), vq = Kv<KV>::cvt(vv[j] * vinv);
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
extern "C" __global__ void qk_norm_rope_store(QK_PARAMS(bf16_t)) { PDL_ENTRY(); qk_norm_rope_kv_t<bf16_t>(QK_ARGS); }
extern "C" __global__ void qk_norm_rope_store_fp8(QK_PARAMS(u8)) { PDL_ENTRY(); qk_norm_rope_kv_t<u8>(QK_ARGS); }

// grid (M), block 64. After a staged pass: rows among the last R positions of their sequence in
// the pass go from the stage into their ring slots (older rows would share a slot with a newer
// one). rowb = bytes of one K (or V) row (nkv * hd * element size): 8-byte pieces where it is a
// multiple of 8, else (rows not 8-byte aligned, e.g. one KV head of 50 dims) bytes.
extern "C" __global__ void ring_commit(const u8* ks, const u8* vs, const int* pos, const int* seqrow, const int* slast,
                                       const int* bt, int ring, u8* kc, u8* vc, int rowb) { PDL_ENTRY();
    int m = blockIdx.x, p = pos[m];
    if (p <= pos[slast[m]] - ring) return;
    size_t slot = (size_t)bt[(size_t)seqrow[m] * ring + p % ring];
    if (rowb & 7) {
        for (int i = threadIdx.x; i < rowb; i += blockDim.x) {
            kc[slot * rowb + i] = ks[(size_t)m * rowb + i];
            vc[slot * rowb + i] = vs[(size_t)m * rowb + i];
        }
        return;
    }
    const uint2* sk = reinterpret_cast<const uint2*>(ks + (size_t)m * rowb);
    const uint2* sv = reinterpret_cast<const uint2*>(vs + (size_t)m * rowb);
    uint2* dk = reinterpret_cast<uint2*>(kc + slot * rowb);
    uint2* dv = reinterpret_cast<uint2*>(vc + slot * rowb);
    for (int i = threadIdx.x; i < rowb / 8; i += blockDim.x) {
        dk[i] = sk[i];
        dv[i] = sv[i];
    }
}
