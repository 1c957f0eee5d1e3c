// Block-wide argmax: each thread brings its (best, idx); every thread gets the largest value and,
// among equal maxima, the lowest index. bv / bi: 32 shared slots each.
__device__ __forceinline__ void block_argmax(float& best, int& idx, float* bv, int* bi) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    best = bv[0];
    idx = bi[0];
    for (int j = 1; j < nw; j++)
        if (bv[j] > best || (bv[j] == best && bi[j] < idx)) { best = bv[j]; idx = bi[j]; }
}
// On-device greedy sampling: argmax over each logits row (lowest index wins ties).
// The largest of l[lo..hi) and, among equal maxima, its lowest index, over the block (every
// thread gets them; NaN never wins; idx stays 0x7fffffff when nothing does). bv / bi: 32 slots.
__device__ __forceinline__ int range_argmax(const float* l, int lo, int hi, float& best_out, float* bv, int* bi) {
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = l[i];
        if (v > best || (v == best && i < idx)) { best = v; idx = i; }
    }
    block_argmax(best, idx, bv, bi);
    best_out = best;
    return idx;
}
extern "C" __global__ void argmax_rows(const float* logits, int V, int* out) { PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int bi[32];
    float best;
    int idx = range_argmax(logits + (size_t)blockIdx.x * V, 0, V, best, bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = idx;
}
// argmax_rows_split: the same argmax with gridDim.y blocks a row. Each block
// reduces its chunk as argmax_rows does, then folds (value, index) into the row's 64-bit slot by
// atomicMax on (order-preserving key of the value << 32 | ~index): the largest value, among equal
// ones the lowest index, whatever the order of arrival (+0 and -0 fold to the same key, as they
// compare equal). The row's last block (counter) writes the index and zeroes slot and counter for
// the next launch (both zero at allocation). A chunk of NaN alone adds nothing; a row of NaN
// alone gives 0x7fffffff, as argmax_rows.
extern "C" __global__ void argmax_rows_split(const float* logits, int V, int* out, unsigned long long* slot,
                                         unsigned* cnt) { PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int bi[32];
    int row = blockIdx.x;
    int chunk = (V + gridDim.y - 1) / gridDim.y;
    int lo = blockIdx.y * chunk;
    float best;
    int idx = range_argmax(logits + (size_t)row * V, lo, min(V, lo + chunk), best, bv, bi);
    if (threadIdx.x == 0) {
        // (amax_key: common.cuh; a chunk's winner is above -inf, so its key is not 0.)
        if (idx != 0x7fffffff) atomicMax(slot + row, amax_key(best, idx));
        __threadfence();
        if (atomicAdd(cnt + row, 1u) == gridDim.y - 1) {
            __threadfence();
            unsigned long long sv = atomicExch(slot + row, 0ull);
            out[row] = amax_index(sv);
            cnt[row] = 0u;
        }
    }
}
// argmax_fin: the greedy tokens of rows 0..M-1 from the slots that
// linear_tc_bf16_tiled_argmax (the lm_head GEMV) folded every logit into, decoded as argmax_rows_split
// decodes its own, and the slots back to zero for the next launch (zero at allocation). The
// same index as argmax_rows_split over the stored logits: the largest key over the same values.
// grid 1, block >= M.
extern "C" __global__ void argmax_fin(unsigned long long* slot, int M, int* out) { PDL_ENTRY();
    int r = threadIdx.x;
    if (r < M) {
        unsigned long long sv = slot[r];
        slot[r] = 0ull;
        out[r] = amax_index(sv);
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

// ---- Sampling on the device: temperature, top-k, top-p, the host's uniform draw -------------------
// Same distribution and the same choice as the host sampler (`laguna_engine::sample`: softmax of
// logits / T in f64, top-k keeping ties, top-p dropping the smallest tokens (ties: higher index
// first) while their cumulative mass stays <= 1 - p and at least one remains, then the first index
// whose cumulative probability exceeds u). Probabilities are carried as fixed point
// E = e * 2^46 (e = exp(z - max z) <= 1, so a row sums below 2^63 for V < 2^17) and summed as
// integers: every sum is exact and independent of thread order (reproducible), and a choice can
// differ from the host's f64 one only when u or the top-p cut falls within ~V * 2^-46 of a
// boundary.

// Order-preserving u32 key of a float (larger float, larger key; -0 counts as +0).
__device__ __forceinline__ u32 fkey(float v) {
    if (v == 0.f) v = 0.f;
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v, unsigned long long* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    unsigned long long t = 0;
    for (int j = 0; j < nw; j++) t += sh[j];
    return t;
}
// Exclusive prefix (in thread order) of v over the block, and the total.
__device__ __forceinline__ unsigned long long block_excl_u64(unsigned long long v, unsigned long long* sh,
                                                             unsigned long long* total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned long long x = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[w] = x;
    __syncthreads();
    unsigned long long before = 0, t = 0;
    for (int j = 0; j < nw; j++) {
        if (j < w) before += sh[j];
        t += sh[j];
    }
    *total = t;
    return before + x - v;
}

// Add (one key, mass q) to bucket b of the shared histograms with one atomic per distinct bucket
// of the warp: lanes with the same bucket hand their mass to the lowest of them (wq: 32 slots of
// this warp). Integer sums, so the result does not depend on the grouping.
__device__ __forceinline__ void hist_add(unsigned long long* hm, unsigned* hc, unsigned b, unsigned long long q,
                                         unsigned long long* wq) {
    unsigned act = __activemask();
    unsigned peers = __match_any_sync(act, b);
    int lane = threadIdx.x & 31;
    wq[lane] = q;
    __syncwarp(act);
    if (lane == __ffs(peers) - 1) {
        unsigned long long sum = 0;
        for (unsigned m = peers; m; m &= m - 1) sum += wq[__ffs(m) - 1];
        if (hm && sum) atomicAdd(&hm[b], sum);
        atomicAdd(&hc[b], (unsigned)__popc(peers));
    }
    __syncwarp(act);
}

// top-p's 64-bit key of element i: its logit's key, then V - 1 - i (ascending order puts higher
// indices first among ties, as the host).
__device__ __forceinline__ unsigned long long tkey(const float* l, int i, int V) {
    return ((unsigned long long)fkey(l[i]) << 32) | (unsigned)(V - 1 - i);
}
// Thread 0's decisions of sample_rows and sample_rows_split, from one radix pass's buckets (the
// block's own, or the row's summed over its blocks). top-k: from bucket 255 down, the one where
// the count reaches `want`; s_pre gets the prefix with that digit, s_all what is left to take.
__device__ __forceinline__ void topk_digit(const unsigned* hc, u32 pre, int want, int shift,
                                           unsigned long long& s_pre, int& s_all) {
    int cum = 0, b = 255;
    for (; b > 0; b--) {
        if (cum + (int)hc[b] >= want) break;
        cum += hc[b];
    }
    s_pre = pre | ((u32)b << shift);
    s_all = want - cum;
}
// top-p: the first non-empty bucket (ascending) whose cumulative mass from `below` exceeds L.
// s_all: 1 none (every key stays), 2 a bucket holding one key (it fixes the remaining digits),
// else 0; s_pre the prefix with that digit, s_below the mass below it.
__device__ __forceinline__ void topp_digit(const unsigned long long* hm, const unsigned* hc,
                                           unsigned long long pre, unsigned long long below, double L,
                                           int shift, unsigned long long& s_pre,
                                           unsigned long long& s_below, int& s_all) {
    unsigned long long run = below;
    int b = 0, found = 0;
    for (; b < 256; b++) {
        if (hc[b] == 0) continue;
        if ((double)(run + hm[b]) > L) { found = 1; break; }
        run += hm[b];
    }
    s_all = !found ? 1 : (hc[b] == 1 ? 2 : 0);
    s_pre = found ? (pre | ((unsigned long long)b << shift)) : pre;
    s_below = run;
}
// The draw's segment (a tile, or a chunk) from the n segments' kept masses in index order: the
// first whose cumulative mass exceeds u * total (s_below: the mass before it), else, past the
// total by rounding, the last with mass (s_below = ~0), -1 when none has any; s_pre the target
// as f64 bits.
__device__ __forceinline__ void draw_segment(const unsigned long long* sums, int n, double u, int& s_seg,
                                             unsigned long long& s_below, unsigned long long& s_pre) {
    unsigned long long S2 = 0;
    for (int t = 0; t < n; t++) S2 += sums[t];
    double target = u * (double)S2;
    unsigned long long c = 0;
    int seg = -1, last = -1;
    for (int t = 0; t < n; t++) {
        if (sums[t] == 0) continue;
        last = t;
        if ((double)(c + sums[t]) > target) { seg = t; break; }
        c += sums[t];
    }
    s_seg = seg >= 0 ? seg : last;
    s_below = seg >= 0 ? c : ~0ull;
    s_pre = __double_as_longlong(target);
}
// Element i (kept mass q, `before` the kept mass ahead of it) in the draw's segment: the
// element where the cumulative mass crosses the target (s_all, by atomicMin), or, past the
// total, the last kept one (s_last, by atomicMax).
__device__ __forceinline__ void draw_mark(int i, unsigned long long q, unsigned long long before, double target,
                                          bool past, int* s_all, int* s_last) {
    if (q > 0) {
        if (past) atomicMax(s_last, i);
        else if ((double)(before + q) > target && (double)before <= target) atomicMin(s_all, i);
    }
}

// grid = rows, block 1024. params[4r..4r+4) = (temperature, top_k, top_p, u) of row r (T <= 0:
// greedy, the lowest index among the maxima as argmax_rows). scratch: V u64 per row. Passes over
// the row are coalesced (element i on thread i mod 1024); the draw finds its 1024-wide tile from
// per-tile sums, then scans that tile once.
#define SAMPLE_FOR(i) for (int i = threadIdx.x; i < V; i += blockDim.x)
extern "C" __global__ __launch_bounds__(1024) void sample_rows(const float* logits, int V, const double* params,
                                                               unsigned long long* scratch, int* out) {
    PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ unsigned long long ush[32];
    __shared__ unsigned long long hm[256];
    __shared__ unsigned int hc[256];
    __shared__ unsigned long long tsum[128];
    __shared__ unsigned long long wqs[32][32];
    __shared__ unsigned long long s_pre, s_below;
    __shared__ int s_all, s_tile, s_last;
    int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    const float* l = logits + (size_t)r * V;
    unsigned long long* E = scratch + (size_t)r * V;
    double T = params[4 * r], pk = params[4 * r + 1], pp = params[4 * r + 2], u = params[4 * r + 3];
    // Argmax (lowest index among equal maxima): the greedy pick and the softmax's max.
    float best = -INFINITY;
    int idx = 0x7fffffff;
#pragma unroll 4
    SAMPLE_FOR(i) {
        float v = l[i];
        if (v > best || (v == best && i < idx)) { best = v; idx = i; }
    }
    block_argmax(best, idx, bv, bi);
    if (!(T > 0.0)) {
        if (tid == 0) out[r] = idx;
        return;
    }
    // top-k: the k-th largest key by MSB-first radix select on counts (ties at the threshold kept).
    u32 kthr = 0;
    int k = (int)pk;
    if (k > 0 && k < V) {
        u32 pre = 0;
        int want = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            if (tid < 256) hc[tid] = 0;
            __syncthreads();
            u32 hmask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
#pragma unroll 4
            SAMPLE_FOR(i) {
                u32 key = fkey(l[i]);
                if ((key & hmask) == pre) hist_add(nullptr, hc, (key >> shift) & 255u, 0, wqs[w]);
            }
            __syncthreads();
            if (tid == 0) topk_digit(hc, pre, want, shift, s_pre, s_all);
            __syncthreads();
            pre = (u32)s_pre;
            want = s_all;
            __syncthreads();
        }
        kthr = pre;
    }
    // Fixed-point probabilities of the kept tokens (f64 like the host: z = l / T, e = exp(z - max z)).
    double mz = (double)best / T;
    unsigned long long mine = 0;
#pragma unroll 4
    SAMPLE_FOR(i) {
        float v = l[i];
        unsigned long long q = 0;
        if (fkey(v) >= kthr) q = (unsigned long long)(exp((double)v / T - mz) * 0x1p46);
        E[i] = q;
        mine += q;
    }
    unsigned long long S = block_sum_u64(mine, ush);
    // top-p: the smallest 64-bit key (logit key, then V-1-index: ascending order puts higher indices
    // first among ties, as the host) whose inclusive ascending cumulative mass exceeds (1-p) S; the
    // keys below it are dropped. If none exceeds it, only the largest key (the argmax) stays.
    unsigned long long kap = 0;
    if (pp < 1.0) {
        double L = (1.0 - pp) * (double)S;
        unsigned long long pre = 0, below = 0;
        bool all = false;
        for (int shift = 56; shift >= 0; shift -= 8) {
            if (tid < 256) { hm[tid] = 0; hc[tid] = 0; }
            __syncthreads();
            unsigned long long hmask = shift == 56 ? 0ull : (~0ull << (shift + 8));
#pragma unroll 4
            SAMPLE_FOR(i) {
                unsigned long long key = tkey(l, i, V);
                if ((key & hmask) == pre) hist_add(hm, hc, (unsigned)(key >> shift) & 255u, E[i], wqs[w]);
            }
            __syncthreads();
            // A bucket holding one key fixes the rest of the digits: stop after this pass
            // (s_all = 2) with that key found below.
            if (tid == 0) topp_digit(hm, hc, pre, below, L, shift, s_pre, s_below, s_all);
            __syncthreads();
            int st = s_all;
            pre = s_pre;
            below = s_below;
            __syncthreads();
            if (st == 1) { all = true; break; }
            if (st == 2) {
                // The unique key with these leading digits.
                unsigned long long hm2 = shift == 0 ? ~0ull : (~0ull << shift);
                if (tid == 0) s_pre = 0;
                __syncthreads();
                SAMPLE_FOR(i) {
                    unsigned long long key = tkey(l, i, V);
                    if ((key & hm2) == pre) s_pre = key;
                }
                __syncthreads();
                pre = s_pre;
                break;
            }
        }
        kap = all ? (((unsigned long long)fkey(best) << 32) | (unsigned)(V - 1 - idx)) : pre;
    }
    // The draw: the first index (natural order) whose cumulative kept mass exceeds u * S'. Warp w
    // sums the kept mass of tiles w, w + 32, ... (1024 indices each).
    int ntile = (V + 1023) >> 10;
    for (int t0 = 0; t0 < ntile; t0 += nw) {
        int t = t0 + w;
        unsigned long long a = 0;
        if (t < ntile) {
#pragma unroll 4
            for (int j = 0; j < 32; j++) {
                int i = t * 1024 + j * 32 + lane;
                if (i < V) {
                    unsigned long long key = tkey(l, i, V);
                    if (key >= kap) a += E[i];
                }
            }
            for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0 && t < 128) tsum[t] = a;
        }
    }
    __syncthreads();
    // Past the total (rounding): the last kept index, i.e. in the last tile with mass.
    if (tid == 0) draw_segment(tsum, ntile, u, s_tile, s_below, s_pre);
    __syncthreads();
    int tile = s_tile;
    if (tile < 0) {
        if (tid == 0) out[r] = idx;
        return;
    }
    bool past = s_below == ~0ull;
    double target = __longlong_as_double(s_pre);
    int i = tile * 1024 + tid;
    unsigned long long q = 0;
    if (i < V) {
        unsigned long long key = tkey(l, i, V);
        if (key >= kap) q = E[i];
    }
    unsigned long long tot;
    unsigned long long ex = block_excl_u64(q, ush, &tot);
    if (tid == 0) { s_all = 0x7fffffff; s_last = -1; }
    __syncthreads();
    unsigned long long before = past ? 0ull : s_below + ex;
    draw_mark(i, q, before, target, past, &s_all, &s_last);
    __syncthreads();
    if (tid == 0) out[r] = past ? s_last : (s_all != 0x7fffffff ? s_all : idx);
}

// ---- sample_rows_split: sample_rows with gridDim.x blocks a row -------------------------------
// The same choice as sample_rows (the same fixed-point masses, the same integer sums, the same
// comparisons in f64), by B = gridDim.x blocks per row (grid (B, rows), every block resident),
// block b owning the contiguous chunk [b c, (b + 1) c) of the row (c = ceil(V / B)), the blocks
// of a row meeting at per-row barriers (`row_sync`): the argmax folds by a 64-bit atomicMax on
// (order-preserving value key, ~index); each radix-select pass adds the block's histogram into
// the row's global buckets by integer atomics (sums that do not depend on the order) and, after
// the barrier, every block scans those buckets itself, so all take the same decision; the draw
// finds the chunk holding it from per-chunk kept masses (the first whose cumulative mass, in f64,
// exceeds u S' is the chunk of the first such element: the cumulative mass only grows), and that
// block scans its chunk in element order as sample_rows scans its tile. One sample_rows pass over
// 100K logits is a chain of ~14 block-wide passes on one SM; here each pass is spread over B SMs.
// st: SG_STRIDE u64 a row, zero at load and left zero: [SG_AM] argmax key, [SG_S] kept mass,
// [SG_UQ] top-p's unique key, [SG_KS + b] chunk b's kept mass (B <= 64), [SG_HM + 256 j] /
// u32 [2 SG_HC + 256 j] three rotating histograms (pass p adds into j = p % 3; after its barrier
// block 0 zeroes j = (p + 2) % 3, which no block reads any more and none adds to before the next
// barrier), u32 [2 SG_BAR] the row's barrier word.
#define SG_STRIDE 2048
#define SG_AM 0
#define SG_S 1
#define SG_UQ 2
#define SG_KS 8
#define SG_HM 128
#define SG_HC 896
#define SG_BAR 1280
// grid_sync for the gridDim.x blocks of this blockIdx.y (block x = 0 adds 2^31 - (n - 1)).
__device__ __forceinline__ void row_sync(unsigned* bar, unsigned& phase) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned nb = gridDim.x;
        red_release_add_u32(bar, blockIdx.x == 0 ? 0x80000000u - (nb - 1u) : 1u);
        unsigned long long t0 = emu_ns();
        while ((ld_acquire_u32(bar) & 0x80000000u) == phase) {
            if (emu_ns() - t0 > GRID_SYNC_TIMEOUT_NS) __trap();
        }
        phase ^= 0x80000000u;
    }
    __syncthreads();
}
__device__ __forceinline__ float fkey_inv(u32 k) {
    return (k & 0x80000000u) ? __uint_as_float(k & 0x7fffffffu) : __uint_as_float(~k);
}
#define SG_FOR(i) for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
extern "C" __global__ __launch_bounds__(512) void sample_rows_split(const float* logits, int V, const double* params,
                                                                unsigned long long* scratch, int* out,
                                                                unsigned long long* st) {
    PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ unsigned long long ush[32];
    __shared__ unsigned long long hm[256];
    __shared__ unsigned int hc[256];
    __shared__ unsigned long long ks[64];
    __shared__ unsigned long long wqs[16][32];
    __shared__ unsigned long long s_pre, s_below;
    __shared__ int s_all, s_chunk, s_last;
    int r = blockIdx.y, b = blockIdx.x, B = gridDim.x, tid = threadIdx.x, w = tid >> 5;
    const float* l = logits + (size_t)r * V;
    unsigned long long* E = scratch + (size_t)r * V;
    unsigned long long* g = st + (size_t)r * SG_STRIDE;
    unsigned long long* ghm = g + SG_HM;
    unsigned* ghc = reinterpret_cast<unsigned*>(g + SG_HC);
    unsigned* gbar = reinterpret_cast<unsigned*>(g + SG_BAR);
    // The barrier word's phase (it cannot flip before this block has arrived).
    unsigned phase = 0;
    if (tid == 0) phase = ld_acquire_u32(gbar) & 0x80000000u;
    int c = (V + B - 1) / B, lo = min(V, b * c), hi = min(V, lo + c);
    double T = params[4 * r], pk = params[4 * r + 1], pp = params[4 * r + 2], u = params[4 * r + 3];
    // Argmax (lowest index among equal maxima), folded over the row's blocks.
    float best = -INFINITY;
    int idx = 0x7fffffff;
#pragma unroll 4
    SG_FOR(i) {
        float v = l[i];
        if (v > best || (v == best && i < idx)) { best = v; idx = i; }
    }
    block_argmax(best, idx, bv, bi);
    if (tid == 0) atomicMax(g + SG_AM, ((unsigned long long)fkey(best) << 32) | (unsigned)~(unsigned)idx);
    row_sync(gbar, phase);
    if (!(T > 0.0)) {
        if (b == 0 && tid == 0) {
            out[r] = (int)~(unsigned)__ldcg(g + SG_AM);
            g[SG_AM] = 0;
        }
        return;
    }
    {
        unsigned long long k = __ldcg(g + SG_AM);
        best = fkey_inv((u32)(k >> 32));
        idx = (int)~(unsigned)k;
    }
    int pass = 0;
    // After pass p's barrier: block 0 zeroes the histogram pass p + 2 will add into.
    auto rotate = [&](int p) {
        if (b == 0 && tid < 256) {
            int j = (p + 2) % 3;
            ghm[256 * j + tid] = 0;
            ghc[256 * j + tid] = 0;
        }
    };
    // top-k: as sample_rows (MSB-first radix select on counts, ties at the threshold kept).
    u32 kthr = 0;
    int k = (int)pk;
    if (k > 0 && k < V) {
        u32 pre = 0;
        int want = k;
        for (int shift = 24; shift >= 0; shift -= 8, pass++) {
            unsigned* H = ghc + 256 * (pass % 3);
            if (tid < 256) hc[tid] = 0;
            __syncthreads();
            u32 hmask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
#pragma unroll 4
            SG_FOR(i) {
                u32 key = fkey(l[i]);
                if ((key & hmask) == pre) hist_add(nullptr, hc, (key >> shift) & 255u, 0, wqs[w]);
            }
            __syncthreads();
            if (tid < 256 && hc[tid]) atomicAdd(H + tid, hc[tid]);
            row_sync(gbar, phase);
            rotate(pass);
            if (tid < 256) hc[tid] = __ldcg(H + tid);
            __syncthreads();
            if (tid == 0) topk_digit(hc, pre, want, shift, s_pre, s_all);
            __syncthreads();
            pre = (u32)s_pre;
            want = s_all;
            __syncthreads();
        }
        kthr = pre;
    }
    // Fixed-point probabilities of the kept tokens and their integer sum over the row.
    double mz = (double)best / T;
    unsigned long long mine = 0;
#pragma unroll 4
    SG_FOR(i) {
        float v = l[i];
        unsigned long long q = 0;
        if (fkey(v) >= kthr) q = (unsigned long long)(exp((double)v / T - mz) * 0x1p46);
        E[i] = q;
        mine += q;
    }
    mine = block_sum_u64(mine, ush);
    if (tid == 0 && mine) atomicAdd(g + SG_S, mine);
    row_sync(gbar, phase);
    if (b == 0 && tid == 0) g[SG_AM] = 0;  // every block read it before this barrier
    unsigned long long S = __ldcg(g + SG_S);
    // top-p: as sample_rows, the histograms of the 64-bit keys summed over the row's blocks.
    unsigned long long kap = 0;
    if (pp < 1.0) {
        double L = (1.0 - pp) * (double)S;
        unsigned long long pre = 0, below = 0;
        bool all = false;
        for (int shift = 56; shift >= 0; shift -= 8) {
            unsigned long long* Hm = ghm + 256 * (pass % 3);
            unsigned* Hc = ghc + 256 * (pass % 3);
            if (tid < 256) { hm[tid] = 0; hc[tid] = 0; }
            __syncthreads();
            unsigned long long hmask = shift == 56 ? 0ull : (~0ull << (shift + 8));
#pragma unroll 4
            SG_FOR(i) {
                unsigned long long key = tkey(l, i, V);
                if ((key & hmask) == pre) hist_add(hm, hc, (unsigned)(key >> shift) & 255u, E[i], wqs[w]);
            }
            __syncthreads();
            if (tid < 256 && hc[tid]) {
                atomicAdd(Hc + tid, hc[tid]);
                if (hm[tid]) atomicAdd(Hm + tid, hm[tid]);
            }
            row_sync(gbar, phase);
            rotate(pass);
            pass++;
            if (tid < 256) { hm[tid] = __ldcg(Hm + tid); hc[tid] = __ldcg(Hc + tid); }
            __syncthreads();
            if (tid == 0) topp_digit(hm, hc, pre, below, L, shift, s_pre, s_below, s_all);
            __syncthreads();
            int stt = s_all;
            pre = s_pre;
            below = s_below;
            __syncthreads();
            if (stt == 1) { all = true; break; }
            if (stt == 2) {
                // The unique key with these leading digits: its block publishes it.
                unsigned long long hm2 = shift == 0 ? ~0ull : (~0ull << shift);
                SG_FOR(i) {
                    unsigned long long key = tkey(l, i, V);
                    if ((key & hm2) == pre) g[SG_UQ] = key;
                }
                row_sync(gbar, phase);
                pre = __ldcg(g + SG_UQ);
                break;
            }
        }
        kap = all ? (((unsigned long long)fkey(best) << 32) | (unsigned)(V - 1 - idx)) : pre;
    }
    // The draw: each chunk's kept mass, then the chunk holding the first index whose cumulative
    // kept mass exceeds u * S' (past the total by rounding: the last chunk with mass).
    unsigned long long a = 0;
#pragma unroll 4
    SG_FOR(i) {
        unsigned long long key = tkey(l, i, V);
        if (key >= kap) a += E[i];
    }
    a = block_sum_u64(a, ush);
    if (tid == 0) g[SG_KS + b] = a;
    row_sync(gbar, phase);
    // No block reads the kept mass or a histogram after this barrier.
    if (b == 0) {
        if (tid == 0) g[SG_S] = 0;
        for (int j = tid; j < 768; j += blockDim.x) {
            ghm[j] = 0;
            ghc[j] = 0;
        }
    }
    if (tid < B) ks[tid] = __ldcg(g + SG_KS + tid);
    __syncthreads();
    if (tid == 0) {
        draw_segment(ks, B, u, s_chunk, s_below, s_pre);
        s_all = 0x7fffffff;
        s_last = -1;
    }
    __syncthreads();
    int chunk = s_chunk;
    if (chunk < 0) {
        if (b == 0 && tid == 0) out[r] = idx;
        return;
    }
    if (chunk != b) return;
    bool past = s_below == ~0ull;
    double target = __longlong_as_double(s_pre);
    unsigned long long carry = past ? 0ull : s_below;
    for (int base = lo; base < hi; base += blockDim.x) {
        int i = base + tid;
        unsigned long long q = 0;
        if (i < hi) {
            unsigned long long key = tkey(l, i, V);
            if (key >= kap) q = E[i];
        }
        unsigned long long tot;
        unsigned long long before = carry + block_excl_u64(q, ush, &tot);
        draw_mark(i, q, before, target, past, &s_all, &s_last);
        carry += tot;
    }
    __syncthreads();
    if (tid == 0) out[r] = past ? s_last : (s_all != 0x7fffffff ? s_all : idx);
}
