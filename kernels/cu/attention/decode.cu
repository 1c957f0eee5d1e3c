// Attention: the split-KV decode kernels on CUDA cores: one block a query head
// (`attention_decode_head[_fp8]`) and one block a query group (`attention_decode_gqa[_qk][_fp8]`,
// `_qk` with the q/k norm + RoPE + K/V write inside).

// One block per (row, query head, split). Keys lo..pos[m] (lo from the window) are cut into
// `nsplit` equal ranges (by the row's own length only: a row's result never depends on the batch);
// each block runs tiles of ATT_T keys: scores by warps (lanes over dims), online softmax, V
// accumulation by threads over dims. nsplit == 1 writes the output (sink, gate applied);
// otherwise (max, sum, acc[hd]) partials go to `part` for attention_decode_merge16 / 64.
// gate_mode: 0 none, 1 per head (g[m, h]), 2 per element (g[m, h*hd + d]); softplus applied here.
// Tiles of blockDim keys: every thread scores one key (16-byte K loads, q from shared memory),
// block-wide online softmax, then V accumulated by (key group, dim) threads. Any even hd <=
// blockDim <= 256 (hd % 8 != 0: element loads, 2 dims a V thread).
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
// 4l..4l+3 over the tile's keys in order. Key ranges and splits follow attention_decode_head (by the row's
// own length only), so a row's result is the same in any batch. Needs hd % 8 == 0, hd <= 128,
// nh / nkv <= 16. Partials feed the same merges.
#define GQ_T 32
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
// A thread's share of q, and of a key tile three items at a time (page-table entries first, then
// their K/V rows; one batch for groups of 6+ heads), is loaded before any of it is used, not one
// round trip a loop iteration.
template <typename KV>
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
    attention_gqa_t<bf16_t>(ATT_ARGS, nsplit, part, kend);
}
extern "C" __global__ void attention_decode_gqa_fp8(ATT_PARAMS(u8), int nsplit, float* part, const int* kend) { PDL_ENTRY();
    attention_gqa_t<u8>(ATT_ARGS, nsplit, part, kend);
}

// attention_decode_gqa_qk: qk_norm_rope_store and attention_decode_gqa as one launch, for
// passes in which every row is the only row of its sequence (decode steps; not DFlash, whose rows
// see each other's keys). Block (m, kvh, z) norms and rotates its G query heads itself, into
// shared memory (the same expressions as qk_norm_rope_kv_t, so the same values the two-kernel path
// reads back from q); the block whose split holds the row's own key (the split's last key)
// also norms and rotates the KV head's new key in warp G, writes K and V into the cache and keeps
// the stored values in shared memory (kp, vp), from which its last tile takes that key (nothing
// reads the slot from memory in this launch; only the writer block's split reaches position p). The first tile's page-table entries and K/V rows are loaded
// before the norms. grid (M, nkv, nsplit), block 32 * (G + 1). Same bits as the two kernels.
template <typename KV>
__device__ __forceinline__ void attention_gqa_qk_t(const float* q, int ldq, float* out, int ldo, KV* kc, KV* vc,
                                                   const int* pos, const int* seqrow, const int* bt, int max_pages,
                                                   int page_size, int nh, int nkv, int hd, int window, const float* sink,
                                                   const float* g, int ldg, int gate_mode, float scale, float vscale,
                                                   int nsplit, float* part, const float* k, const float* v, int ldkv,
                                                   const float* qn_w, const float* kn_w, const float* inv_freq, int half,
                                                   float attn_factor, float eps, float kinv, float vinv) {
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
    if (z >= ns) return;
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
    if (w >= G || d >= hd) return;
    if (!final_) {
        float* pp = part + (((size_t)m * nh + h) * nsplit + z) * (hd + 2);
        pp[2 + d] = a0; pp[3 + d] = a1; pp[4 + d] = a2; pp[5 + d] = a3;
        if (lane == 0) { pp[0] = run_max; pp[1] = run_sum; }
        return;
    }
    gqa_store(out, ldo, g, ldg, gate_mode, vscale, m, h, hd, d, run_sum, a0, a1, a2, a3);
}
// (PDL_ENTRY inside, after the loads that do not depend on the previous launch.)
extern "C" __global__ __launch_bounds__(288, 3) void attention_decode_gqa_qk(GQK_PARAMS(bf16_t)) { attention_gqa_qk_t<bf16_t>(GQK_ARGS); }
extern "C" __global__ __launch_bounds__(288, 3) void attention_decode_gqa_qk_fp8(GQK_PARAMS(u8)) { attention_gqa_qk_t<u8>(GQK_ARGS); }
