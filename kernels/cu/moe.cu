// Mixture of experts: router (f32 sigmoid, softcap, biased top-k, renormalise), grouping of
// (row, slot) pairs by expert on the device, gate+up+SiLU and down projections over expert
// stacks (BF16 or NVFP4), and the weighted combine with the shared expert and the residual.

// grid M, block 32 (one warp per row). logits [M, E] (router output, f32). Writes ids[m*K + k],
// wts[m*K + k]. Ties go to the lower expert index.
// With shared_slot, slot K of each row is the shared expert (stacked as expert E) with weight
// 1/routed_scale, so the combine's scale brings it back to 1.
// Order-preserving key of a top-k candidate: larger float -> larger key, -0 as +0; NaN gets 0,
// below every number, as do padding and picked entries.
__device__ __forceinline__ unsigned topk_key(float v) {
    if (!(v == v)) return 0u;
    unsigned u = __float_as_uint(v + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// One warp: lane l owns experts l + 32 j, j < PER (E <= 32 PER), all in registers. Every logit
// and bias is loaded before any is used (one memory round trip, not PER), then K rounds of: the
// largest key by one warp reduction, the lowest expert index holding it by another, and the owner
// dropping it. Same picks, weights and order of the weight sum as a scan in expert order.
// POLL (moe_block_1np): the logits are read until none holds MK_UNSET (the launch's other blocks
// write them; no grid barrier before), all of a lane's in flight at once each round.
#define MK_UNSET 0xFFFFFFFFu
// A lane's sigmoid scores 1 / (1 + ex[j]) into sc and their top-k keys (padding experts, e >= E:
// key 0). ALL (E = 32 PER, e.g. XS's 256 = 32 x 8): every expert exists, so no per-expert test
// and the values' steps interleave instead of each waiting in its own branch.
template <int PER, bool ALL>
__device__ __forceinline__ void topk_keys(const float (&ex)[PER], const float (&bs)[PER], int E, int lane, float* sc,
                                          unsigned (&key)[PER]) {
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int e = lane + 32 * j;
        float s = 1.0f / (1.0f + ex[j]);
        if (ALL || e < E) sc[e] = s;
        key[j] = ALL || e < E ? topk_key(s + bs[j]) : 0u;
    }
}
template <int PER, bool POLL = false>
__device__ __forceinline__ void router_topk_regs(int m, const float* logits, const float* bias, int E, int K,
                                                 float softcap, int norm_topk, int* ids, float* wts, int KK, float* sc) {
    int lane = threadIdx.x & 31;
    float lg[PER], bs[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int e = lane + 32 * j;
        lg[j] = e < E && !POLL ? __ldcg(logits + (size_t)m * E + e) : 0.f;
        bs[j] = e < E ? bias[e] : 0.f;
    }
    if (POLL) {
        unsigned long long t0 = emu_ns();
        for (;;) {
            unsigned u[PER];
#pragma unroll
            for (int j = 0; j < PER; j++) {
                int e = lane + 32 * j;
                u[j] = e < E ? ld_relaxed_u32(reinterpret_cast<const unsigned*>(logits + (size_t)m * E + e)) : 0u;
            }
            bool ok = true;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                ok = ok && u[j] != MK_UNSET;
                lg[j] = __uint_as_float(u[j]);
            }
            if (__all_sync(0xffffffffu, ok)) break;
            if (emu_ns() - t0 > GRID_SYNC_TIMEOUT_NS) __trap();
        }
    }
    // The softcap, the exponentials and the divisions each over all PER values in turn, so the
    // exponentials (no branch) are issued together and no division waits for the next value's
    // exponential; the sigmoid is 1 / (1 + expf(-l)).
    if (softcap > 0.f) {
#pragma unroll
        for (int j = 0; j < PER; j++) lg[j] = tanhf(lg[j] / softcap) * softcap;
    }
    float ex[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) ex[j] = expf(-lg[j]);
    unsigned key[PER];
    if (E == 32 * PER)
        topk_keys<PER, true>(ex, bs, E, lane, sc, key);
    else
        topk_keys<PER, false>(ex, bs, E, lane, sc, key);
    __syncwarp();
    float total = 0.f;
    int my_id = 0;
    float my_s = 0.f;
    for (int k = 0; k < K; k++) {
        unsigned best = key[0];
#pragma unroll
        for (int j = 1; j < PER; j++) best = max(best, key[j]);
        unsigned kmax = __reduce_max_sync(0xffffffffu, best);
        // The lane's lowest expert index holding kmax: a tree of minima over the candidates
        // (none: all ones), not a chain of PER selects.
        unsigned cs[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) cs[j] = key[j] == kmax ? (unsigned)(lane + 32 * j) : 0xffffffffu;
#pragma unroll
        for (int w = 1; w < PER; w *= 2)
#pragma unroll
            for (int j = 0; j + w < PER; j += 2 * w) cs[j] = min(cs[j], cs[j + w]);
        unsigned cand = cs[0];
        int bidx = (int)__reduce_min_sync(0xffffffffu, cand);
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (bidx == lane + 32 * j) key[j] = 0u;
        float s = sc[bidx];
        total += s;
        if (lane == k) {
            my_id = bidx;
            my_s = s;
        }
    }
    if (lane < K) {
        ids[m * KK + lane] = my_id;
        wts[m * KK + lane] = norm_topk ? my_s / total : my_s;
    }
}
// MAXPER: E <= 32 MAXPER (moe_block_1 takes 8, so its registers hold no 32-expert form).
template <int MAXPER = 32, bool POLL = false>
__device__ void router_topk_row(int m, const float* logits, const float* bias, int E, int K, float softcap,
                                int norm_topk, int* ids, float* wts, int shared_slot, float inv_scale,
                                int* grp_expert, int* grp_start, int* grp_count, int* perm, int* meta) {
    int KK = K + shared_slot;
    __shared__ float sc[1024];
    int lane = threadIdx.x & 31;
    if (POLL)
        router_topk_regs<8, true>(m, logits, bias, E, K, softcap, norm_topk, ids, wts, KK, sc);
    else if (MAXPER <= 8 || E <= 256)
        router_topk_regs<8>(m, logits, bias, E, K, softcap, norm_topk, ids, wts, KK, sc);
    else
        router_topk_regs<32>(m, logits, bias, E, K, softcap, norm_topk, ids, wts, KK, sc);
    if (shared_slot && lane == 0) {
        ids[m * KK + K] = E;
        wts[m * KK + K] = inv_scale;
    }
    // Single-row batches (grp_expert != nullptr, grid of 1): the slots are distinct experts, so each
    // slot is its own group; this replaces the moe_group launch.
    if (grp_expert) {
        __syncwarp();
        if (lane < KK) {
            grp_expert[lane] = ids[lane];
            grp_start[lane] = lane;
            grp_count[lane] = 1;
            perm[lane] = lane;
        }
        if (lane == 0) meta[0] = KK;
    }
}
extern "C" __global__ void router_topk(const float* logits, const float* bias, int E, int K, float softcap,
                                       int norm_topk, int* ids, float* wts, int shared_slot, float inv_scale,
                                       int* grp_expert, int* grp_start, int* grp_count, int* perm, int* meta) { PDL_ENTRY();
    router_topk_row(blockIdx.x, logits, bias, E, K, softcap, norm_topk, ids, wts, shared_slot, inv_scale, grp_expert,
                    grp_start, grp_count, perm, meta);
}

// One block (1024 threads). Groups the S = M*K slots by expert: groups are the experts that got at
// least one slot, in expert order; perm lists the slots of group g at grp_start[g]..+grp_count[g].
// meta[0] = number of groups. Order inside a group is not fixed, but every slot's arithmetic is.
// With tiles != nullptr it also lists 64-slot tiles of the groups for the grouped GEMMs:
// tiles[2i] = group, tiles[2i+1] = first slot inside the group; meta[1] = number of tiles.
// shared_e >= 0: that expert (the folded shared expert) holds slot KK - 1 of every row: it is
// counted and placed by position (slot s at s / KK of its group) instead of by one shared-memory
// atomic per row on a single counter (2,048 serialised atomics for a 2K prompt).
extern "C" __global__ void moe_group(const int* ids, int S, int E, int* grp_expert, int* grp_start, int* grp_count,
                                     int* perm, int* meta, int* tiles, int KK, int shared_e) { PDL_ENTRY();
    extern __shared__ int shm[];
    int* cnt = shm;       // E
    int* off = shm + E;   // E
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    // Ids are read 8 at a time (independent loads in flight) before their atomics: one dependent
    // global load per slot serialised the loop (~29 us for a 2K prompt's 18,432 slots).
    for (int s0 = threadIdx.x; s0 < S; s0 += 8 * blockDim.x) {
        int e[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int s = s0 + j * blockDim.x;
            e[j] = s < S ? ids[s] : shared_e;
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (e[j] != shared_e) atomicAdd(&cnt[e[j]], 1);
    }
    __syncthreads();
    if (shared_e >= 0 && threadIdx.x == 0) cnt[shared_e] = S / KK;
    __syncthreads();
    if (threadIdx.x < 32) {
        // Warp 0: exclusive scan of counts and compaction of non-empty experts, 32 at a time.
        int lane = threadIdx.x, base = 0, gbase = 0, tbase = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            int e = e0 + lane;
            int c = e < E ? cnt[e] : 0;
            int x = c;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            int excl = base + x - c;
            if (e < E) off[e] = excl;
            unsigned bal = __ballot_sync(0xffffffffu, c > 0);
            int gi = gbase + __popc(bal & ((1u << lane) - 1u));
            if (c > 0) {
                grp_expert[gi] = e;
                grp_start[gi] = excl;
                grp_count[gi] = c;
            }
            int nt = (c + 63) >> 6, tx = nt;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, tx, o);
                if (lane >= o) tx += y;
            }
            if (tiles) {
                int t0 = tbase + tx - nt;
                for (int j = 0; j < nt; j++) {
                    tiles[2 * (t0 + j)] = gi;
                    tiles[2 * (t0 + j) + 1] = 64 * j;
                }
            }
            base += __shfl_sync(0xffffffffu, x, 31);
            gbase += __popc(bal);
            tbase += __shfl_sync(0xffffffffu, tx, 31);
        }
        if (lane == 0) {
            meta[0] = gbase;
            meta[1] = tbase;
        }
    }
    __syncthreads();
    for (int s0 = threadIdx.x; s0 < S; s0 += 8 * blockDim.x) {
        int e[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int s = s0 + j * blockDim.x;
            e[j] = s < S ? ids[s] : -1;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int s = s0 + j * blockDim.x;
            if (e[j] < 0) continue;
            int at = e[j] == shared_e ? off[e[j]] + s / KK : atomicAdd(&off[e[j]], 1);
            perm[at] = s;
        }
    }
}

// grid (ceil(I / warps), G), block 256. act[slot, i] = silu(gate_e[i] . x[row]) * (up_e[i] . x[row]),
// row = slot / K. Expert stacks: BF16 [E, I, H]; NVFP4 packed [E, I, H/2], scales [E, I, H/16], inv_gs[E].
template <int FMT, int MOE_MR>
__device__ void moe_gate_up_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                 const float* uinv, const float* x, int H, int I, int K, const int* grp_expert,
                                 const int* grp_start, const int* grp_count, const int* perm, const int* meta,
                                 float* act) {
    int g = blockIdx.y;
    if (g >= meta[0]) return;
    int i0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = i0 < I;
    int i = valid ? i0 : I - 1;
    int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
    size_t wstride = FMT == 0 ? (size_t)I * H * 2 : (size_t)I * H / 2;
    size_t sstride = (size_t)I * (H / 16);
    const u8* gwe = reinterpret_cast<const u8*>(gw) + e * wstride;
    const u8* uwe = reinterpret_cast<const u8*>(uw) + e * wstride;
    float gi = FMT == 1 ? ginv[e] : 1.f, ui = FMT == 1 ? uinv[e] : 1.f;
    const u8* gse = FMT == 1 ? gs + e * sstride : nullptr;
    const u8* use = FMT == 1 ? us + e * sstride : nullptr;
    int lane = threadIdx.x & 31;
    extern __shared__ float xsh[];
    for (int c = 0; c < cn; c += MOE_MR) {
        int nr = min(MOE_MR, cn - c);
        const float* xr[MOE_MR];
        int slot[MOE_MR];
#pragma unroll
        for (int r = 0; r < MOE_MR; r++) {
            slot[r] = perm[st + c + (r < nr ? r : 0)];
            xr[r] = x + (size_t)(slot[r] / K) * H;
        }
        if (MOE_MR == 1) {  // one slot: stage its activation row in shared memory (H floats)
            __syncthreads();
            for (int j = threadIdx.x; j < H; j += blockDim.x) xsh[j] = xr[0][j];
            __syncthreads();
            xr[0] = xsh;
        }
        float ag[MOE_MR], au[MOE_MR];
        row_dot2<FMT, MOE_MR>(gwe, gse, gi, uwe, use, ui, i, H, xr, nr, ag, au);
#pragma unroll
        for (int r = 0; r < MOE_MR; r++)
            if (valid && r < nr && lane == r) act[(size_t)slot[r] * I + i] = silu_f(ag[r]) * au[r];
    }
}
// grid (ceil(H / warps), G), block 256. out[slot, n] = down_e[n] . act[slot]; down [E, H, I].
template <int FMT, int MOE_MR>
__device__ void moe_down_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                              const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                              const int* meta, float* out) {
    int g = blockIdx.y;
    if (g >= meta[0]) return;
    int n0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    bool valid = n0 < H;
    int n = valid ? n0 : H - 1;
    int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
    size_t wstride = FMT == 0 ? (size_t)H * I * 2 : (size_t)H * I / 2;
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = FMT == 1 ? ds + e * (size_t)H * (I / 16) : nullptr;
    float di = FMT == 1 ? dinv[e] : 1.f;
    int lane = threadIdx.x & 31;
    extern __shared__ float xsh[];
    for (int c = 0; c < cn; c += MOE_MR) {
        int nr = min(MOE_MR, cn - c);
        const float* xr[MOE_MR];
        int slot[MOE_MR];
#pragma unroll
        for (int r = 0; r < MOE_MR; r++) {
            slot[r] = perm[st + c + (r < nr ? r : 0)];
            xr[r] = act + (size_t)slot[r] * I;
        }
        if (MOE_MR == 1) {
            __syncthreads();
            for (int j = threadIdx.x; j < I; j += blockDim.x) xsh[j] = xr[0][j];
            __syncthreads();
            xr[0] = xsh;
        }
        float a[MOE_MR];
        row_dot<FMT, MOE_MR>(dwe, dse, di, n, I, xr, nr, a);
#pragma unroll
        for (int r = 0; r < MOE_MR; r++)
            if (valid && r < nr && lane == r) out[(size_t)slot[r] * H + n] = a[r];
    }
}
extern "C" __global__ void moe_gate_up_bf16(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<0, 4>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_gate_up_fp4(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                           const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                           const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<1, 4>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_bf16(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<0, 4>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_down_fp4(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                        const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                        float* out) { PDL_ENTRY();
    moe_down_impl<1, 4>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
// Single-slot-per-group forms (decode of one row): same per-slot arithmetic, fewer registers.
extern "C" __global__ void moe_gate_up_bf16_1(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<0, 1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_bf16_1(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<0, 1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_gate_up_fp4_1(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                            const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                            const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gate_up_impl<1, 1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_fp4_1(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                         const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                         float* out) { PDL_ENTRY();
    moe_down_impl<1, 1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
// grid (ceil(H/256), M), block 256. x[m, n] += scale * sum_k w[m,k] out[m*K+k, n] + shared[m, n]
extern "C" __global__ void moe_combine(float* x, const float* out, const float* wts, const float* shared, int H, int K,
                                       float scale) { PDL_ENTRY();
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= H) return;
    float a = 0.f;
    for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
    a *= scale;
    if (shared) a += shared[(size_t)m * H + n];
    x[(size_t)m * H + n] += a;
}
// moe_combine for row blockIdx.x followed by the next layer's input RMSNorm of the updated row
// (one launch instead of two). Same arithmetic as moe_combine then rmsnorm with the same block
// size, so results are bit-identical to the two-kernel form. Block as rmsnorm's. With xs set (long
// passes) y's BF16 hi / lo split is written too, as rmsnorm_split writes it (hi [M, H], lo at
// + M * H; M = gridDim.x).
extern "C" __global__ void moe_combine_norm(float* x, const float* out, const float* wts, const float* shared, int H,
                                            int K, float scale, const float* w, float* y, float eps, bf16_t* xs) { PDL_ENTRY();
    __shared__ float sh[32];
    int m = blockIdx.x;
    float* xr = x + (size_t)m * H;
    float v[8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int n = threadIdx.x + j * blockDim.x;
        v[j] = 0.f;
        if (n < H) {
            float a = 0.f;
            for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
            a *= scale;
            if (shared) a += shared[(size_t)m * H + n];
            float nv = xr[n] + a;
            xr[n] = nv;
            v[j] = nv;
        }
        ss += v[j] * v[j];
    }
    for (int n = threadIdx.x + 8 * blockDim.x; n < H; n += blockDim.x) {
        float a = 0.f;
        for (int k = 0; k < K; k++) a = fmaf(wts[m * K + k], out[((size_t)m * K + k) * H + n], a);
        a *= scale;
        if (shared) a += shared[(size_t)m * H + n];
        float nv = xr[n] + a;
        xr[n] = nv;
        ss += nv * nv;
    }
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int n = threadIdx.x + j * blockDim.x;
        if (n < H) rms_store(y, xs, gridDim.x, m, H, n, w[n] * (v[j] * inv));
    }
    for (int n = threadIdx.x + 8 * blockDim.x; n < H; n += blockDim.x) rms_store(y, xs, gridDim.x, m, H, n, w[n] * (xr[n] * inv));
}

// ---- small-batch MoE (passes of 1..16 rows: decode steps and DFlash verify) -------------------
// Persistent warps (grid-stride over work items) so a whole layer's experts are in flight at once
// and the group/slot lookups are paid once per item. An item is (group, outputs): the weights are
// loaded once per item and applied to every slot of the group (an expert chosen by several rows
// is read once). Per (slot, output) the arithmetic is fixed: lane-strided chunks of 32 (gate/up)
// or 16 (down) inputs, 16-term fmaf blocks scaled per block, then warp_sum; it never depends on
// the grouping or the batch, so a row verified with k others is bit-identical to the row decoded
// alone. Slots of a group are taken SB at a time (weights re-read from L1 for the next SB).
#define MOE_SB 2
// Four E4M3 bytes (byte i -> o[i]) as floats, exact: on sm_89+ two cvt.rn.f16x2.e4m3x2 and four
// f16 -> f32 conversions (every value blk16_dot builds is a normal f16).
__device__ __forceinline__ void e4m3x4_f32(u32 w, float& o0, float& o1, float& o2, float& o3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{.reg .b16 a0, a1, f0, f1, f2, f3;\n\t"
        ".reg .b32 h0, h1;\n\t"
        "mov.b32 {a0, a1}, %4;\n\t"
        "cvt.rn.f16x2.e4m3x2 h0, a0;\n\t"
        "cvt.rn.f16x2.e4m3x2 h1, a1;\n\t"
        "mov.b32 {f0, f1}, h0;\n\t"
        "mov.b32 {f2, f3}, h1;\n\t"
        "cvt.f32.f16 %0, f0;\n\t"
        "cvt.f32.f16 %1, f1;\n\t"
        "cvt.f32.f16 %2, f2;\n\t"
        "cvt.f32.f16 %3, f3;\n\t}"
        : "=f"(o0), "=f"(o1), "=f"(o2), "=f"(o3)
        : "r"(w));
#else
    auto sg = [](u32 b, float v) { return (b & 0x80u) ? -v : v; };
    o0 = sg(w & 0xffu, e4m3u(w & 0x7fu));
    o1 = sg((w >> 8) & 0xffu, e4m3u((w >> 8) & 0x7fu));
    o2 = sg((w >> 16) & 0xffu, e4m3u((w >> 16) & 0x7fu));
    o3 = sg(w >> 24, e4m3u((w >> 24) & 0x7fu));
#endif
}
// The 8 E2M1 codes of w (element 2i in the low nibble of byte i) as floats equal to their values
// times 2^-6: code s.e1e0.m becomes the E4M3 byte s.00e1e0.m00, which is exactly e2m1 * 2^-6 (for
// e > 0: 2^(e-7) (1 + m/2) against 2^(e-1) (1 + m/2); for e = 0: 2^-6 m/2 against m/2). Even
// elements from the low nibbles, odd ones from the high nibbles: 7 integer ops, 4 conversions of
// two and 8 f16 -> f32 conversions for 8 codes.
__device__ __forceinline__ void e2m1x8_f32(u32 w, float* c) {
    u32 ev = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
    u32 od = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
    e4m3x4_f32(ev, c[0], c[2], c[4], c[6]);
    e4m3x4_f32(od, c[1], c[3], c[5], c[7]);
}
template <int FMT>
__device__ __forceinline__ float blk16_dot(u32 w0, u32 w1, u32 w2, u32 w3, u32 w4, u32 w5, u32 w6, u32 w7, const float* xv) {
    // FMT 0: 8 words = 16 bf16; FMT 1: w0, w1 = 16 e2m1 codes (element 2i low nibble).
    float t = 0.f;
    if (FMT == 0) {
        u32 q[8] = {w0, w1, w2, w3, w4, w5, w6, w7};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            t = fmaf(bflo(q[e]), xv[2 * e], t);
            t = fmaf(bfhi(q[e]), xv[2 * e + 1], t);
        }
    } else {
        // Codes read as e2m1 * 2^-6 (e2m1x8_f32), so every product and partial sum is the unscaled
        // one times 2^-6 exactly (no f32 subnormal or overflow at activation magnitudes): the
        // caller folds 2^6 into the block scale (load_blk). The same bits as decoding to the
        // codes' values, and as the e2m1_at * 2^100-activation form it replaced.
        float c[8];
        e2m1x8_f32(w0, c);
#pragma unroll
        for (int i = 0; i < 8; i++) t = fmaf(c[i], xv[i], t);
        e2m1x8_f32(w1, c);
#pragma unroll
        for (int i = 0; i < 8; i++) t = fmaf(c[i], xv[8 + i], t);
    }
    return t;
}
// The 16 activations at x16 dotted with the current block of four weight rows (words wa/wc, block scales sc), added into acc[0..4).
// LDG: activations through the read-only path (global memory written before the launch); off,
// through a generic pointer (shared memory, or data this launch wrote).
template <int FMT, bool LDG = true>
__device__ __forceinline__ void blk16_rows4(const float* x16, const uint4* wa, const uint4* wc, const float* sc, float* acc) {
    const float4* xp = reinterpret_cast<const float4*>(x16);
    float4 v0, v1, v2, v3;
    if (LDG) {
        v0 = __ldg(xp), v1 = __ldg(xp + 1), v2 = __ldg(xp + 2), v3 = __ldg(xp + 3);
    } else {
        v0 = xp[0], v1 = xp[1], v2 = xp[2], v3 = xp[3];
    }
    float xv[16] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float t = blk16_dot<FMT>(wa[j].x, wa[j].y, wa[j].z, wa[j].w, wc[j].x, wc[j].y, wc[j].z, wc[j].w, xv);
        acc[j] = FMT == 0 ? acc[j] + t : fmaf(t, sc[j], acc[j]);
    }
}
// One 16-input block of weight row `n` of expert matrix base (rows of K inputs): packed words and
// the block scale (1 for BF16). NA: the loads skip L1 (ldg_na).
template <int FMT, bool NA = false>
__device__ __forceinline__ void load_blk(const u8* base, const u8* sbase, int n, int K, int b, uint4& a, uint4& c, float& sc) {
    if (FMT == 0) {
        const uint4* p = reinterpret_cast<const uint4*>(base + ((size_t)n * K + (size_t)b * 16) * 2);
        a = ldg_w<NA>(p);
        c = ldg_w<NA>(p + 1);
        sc = 1.f;
    } else {
        uint2 u = ldg_w<NA>(reinterpret_cast<const uint2*>(base + (size_t)n * (K >> 1) + (size_t)b * 8));
        a = make_uint4(u.x, u.y, 0u, 0u);
        c = make_uint4(0u, 0u, 0u, 0u);
        sc = e4m3u(ldg_w<NA>(sbase + (size_t)n * (K >> 4) + b)) * 64.f;  // 2^6: see blk16_dot
    }
}
// gate/up: item = (group, 2 consecutive intermediate rows). act[slot, i] = silu(g) * u.
template <int FMT>
__device__ void moe_gu_s_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                              const float* uinv, const float* x, int H, int I, int KK, const int* grp_expert,
                              const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* act) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    int nblk = H >> 4;
    size_t wstride = FMT == 0 ? (size_t)I * H * 2 : (size_t)I * H / 2;
    size_t sstride = (size_t)I * (H >> 4);
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        const u8* gwe = reinterpret_cast<const u8*>(gw) + e * wstride;
        const u8* uwe = reinterpret_cast<const u8*>(uw) + e * wstride;
        const u8* gse = FMT == 1 ? gs + e * sstride : nullptr;
        const u8* use = FMT == 1 ? us + e * sstride : nullptr;
        float gi = FMT == 1 ? ginv[e] : 1.f, ui = FMT == 1 ? uinv[e] : 1.f;
        for (int s0 = 0; s0 < cn; s0 += MOE_SB) {
            int ns = min(MOE_SB, cn - s0);
            int slot[MOE_SB];
            const float* xr[MOE_SB];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
                slot[r] = perm[st + s0 + (r < ns ? r : 0)];
                xr[r] = x + (size_t)(slot[r] / KK) * H;
            }
            float acc[MOE_SB][4];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[r][j] = 0.f;
            uint4 wa[4], wc[4];
            float sc[4];
            auto ld4 = [&](int b, uint4* qa, uint4* qc, float* qs) {
                load_blk<FMT>(gwe, gse, i, H, b, qa[0], qc[0], qs[0]);
                load_blk<FMT>(gwe, gse, i + 1, H, b, qa[1], qc[1], qs[1]);
                load_blk<FMT>(uwe, use, i, H, b, qa[2], qc[2], qs[2]);
                load_blk<FMT>(uwe, use, i + 1, H, b, qa[3], qc[3], qs[3]);
            };
            if (lane < nblk) ld4(lane, wa, wc, sc);
            for (int b = lane; b < nblk; b += 32) {
                uint4 na[4], nc[4];
                float nsc[4];
                if (b + 32 < nblk) ld4(b + 32, na, nc, nsc);
#pragma unroll
                for (int r = 0; r < MOE_SB; r++) {
                    if (r < ns) {
                        blk16_rows4<FMT>(xr[r] + b * 16, wa, wc, sc, acc[r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wa[j] = na[j];
                    wc[j] = nc[j];
                    sc[j] = nsc[j];
                }
            }
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
                float g0 = warp_sum(acc[r][0]) * gi, g1 = warp_sum(acc[r][1]) * gi;
                float u0 = warp_sum(acc[r][2]) * ui, u1 = warp_sum(acc[r][3]) * ui;
                if (r < ns) {
                    if (lane == 0) act[(size_t)slot[r] * I + i] = silu_f(g0) * u0;
                    if (lane == 1) act[(size_t)slot[r] * I + i + 1] = silu_f(g1) * u1;
                }
            }
        }
    }
}
// down: item = (group, 4 consecutive output rows). out[slot, n] = down_e[n] . act[slot].
template <int FMT>
__device__ void moe_dn_s_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                              const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                              const int* meta, float* out) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 2;
    int total = meta[0] * per;
    int nblk = I >> 4;
    size_t wstride = FMT == 0 ? (size_t)H * I * 2 : (size_t)H * I / 2;
    size_t sstride = (size_t)H * (I >> 4);
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 4;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
        const u8* dse = FMT == 1 ? ds + e * sstride : nullptr;
        float di = FMT == 1 ? dinv[e] : 1.f;
        for (int s0 = 0; s0 < cn; s0 += MOE_SB) {
            int ns = min(MOE_SB, cn - s0);
            int slot[MOE_SB];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) slot[r] = perm[st + s0 + (r < ns ? r : 0)];
            float acc[MOE_SB][4];
#pragma unroll
            for (int r = 0; r < MOE_SB; r++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[r][j] = 0.f;
            uint4 wa[4], wc[4];
            float sc[4];
            if (lane < nblk)
#pragma unroll
                for (int j = 0; j < 4; j++) load_blk<FMT>(dwe, dse, n + j, I, lane, wa[j], wc[j], sc[j]);
            for (int b = lane; b < nblk; b += 32) {
                uint4 na[4], nc[4];
                float nsc[4];
                if (b + 32 < nblk)
#pragma unroll
                    for (int j = 0; j < 4; j++) load_blk<FMT>(dwe, dse, n + j, I, b + 32, na[j], nc[j], nsc[j]);
#pragma unroll
                for (int r = 0; r < MOE_SB; r++) {
                    if (r < ns) {
                        blk16_rows4<FMT>(act + (size_t)slot[r] * I + b * 16, wa, wc, sc, acc[r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wa[j] = na[j];
                    wc[j] = nc[j];
                    sc[j] = nsc[j];
                }
            }
#pragma unroll
            for (int r = 0; r < MOE_SB; r++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float v = warp_sum(acc[r][j]) * di;
                    if (r < ns && lane == j) out[(size_t)slot[r] * H + n + j] = v;
                }
            }
        }
    }
}
// _sp (KernelSet moe_sp; NVFP4, decode and verify): the same per-slot arithmetic as moe_*_s
// (lane l takes blocks l, l + 32, ... of every row, 16-term blocks scaled per block, warp_sum),
// but a warp loads all blocks of its item's rows at once (up to 4 blocks per lane, H <= 2048)
// before any arithmetic, keeps them in registers for every slot of the group, and the host
// sizes the grid to one item per warp (blocks of 128 threads). down: items of 8 rows.
// Bit-identical to moe_*_s on the H200 (kbench and device-test, run 78).
// Slots one at a time: the weights stay in registers, the activations do not.
// blk16_rows4 over four rows' NVFP4 codes held as (word, word) pairs (load_blk's values).
template <bool LDG = true>
__device__ __forceinline__ void blk16_rows4_fp4(const float* x16, const uint2* cw, const float* sc, float* acc) {
    uint4 wa[4], wc[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        wa[q] = make_uint4(cw[q].x, cw[q].y, 0u, 0u);
        wc[q] = make_uint4(0u, 0u, 0u, 0u);
    }
    blk16_rows4<1, LDG>(x16, wa, wc, sc, acc);
}
// A gate/up item of expert e: cw[j][r] / sc[j][r] = block lane + 32 j of rows gate i, gate i + 1,
// up i, up i + 1 (H <= 2048), all loaded before any arithmetic (sc: the raw E4M3 scale bytes).
// NA: the loads skip L1 (ldg_na).
template <bool NA = false>
__device__ __forceinline__ void sp_gu_load(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i, int H,
                                           int I, int lane, uint2 (&cw)[4][4], u32 (&sc)[4][4]) {
    size_t wstride = (size_t)I * H / 2, sstride = (size_t)I * (H >> 4);
    const u8* wr[4] = {reinterpret_cast<const u8*>(gw) + e * wstride, reinterpret_cast<const u8*>(gw) + e * wstride,
                       reinterpret_cast<const u8*>(uw) + e * wstride, reinterpret_cast<const u8*>(uw) + e * wstride};
    const u8* sr[4] = {gs + e * sstride, gs + e * sstride, us + e * sstride, us + e * sstride};
    int nblk = H >> 4;
    // Every load, nothing else (blocks past the row clamped to its last one: loaded, never used):
    // the scale bytes stay raw until sp_gu_slot uses them. A decode next to its load inside a
    // per-j branch made the warp wait for each j's loads before issuing the next j's (four round
    // trips instead of one).
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = min(lane + 32 * j, nblk - 1);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int n = i + (r & 1);
            cw[j][r] = ldg_w<NA>(reinterpret_cast<const uint2*>(wr[r] + (size_t)n * (H >> 1) + (size_t)b * 8));
            sc[j][r] = ldg_w<NA>(sr[r] + (size_t)n * nblk + b);
        }
    }
}
// A block scale as the slot's dot takes it: a raw E4M3 byte (sp_*_load) decoded as load_blk
// does, e4m3u(b) * 2^6, or a scale sp_*_load_m already decoded.
__device__ __forceinline__ float sp_scale(u32 b) { return e4m3u((u8)b) * 64.f; }
__device__ __forceinline__ float sp_scale(float s) { return s; }
// One slot of a gate/up item: o[i], o[i + 1] = SiLU(gate) * up for the activation row xr.
template <bool LDG, typename S>
__device__ __forceinline__ void sp_gu_slot(const float* xr, const uint2 (&cw)[4][4], const S (&sc)[4][4], int H, int lane,
                                           float gi, float ui, float* o, int i) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = lane + 32 * j;
        if (b < (H >> 4)) {
            float f[4];
#pragma unroll
            for (int r = 0; r < 4; r++) f[r] = sp_scale(sc[j][r]);
            blk16_rows4_fp4<LDG>(xr + b * 16, cw[j], f, acc);
        }
    }
    float g0 = warp_sum(acc[0]) * gi, g1 = warp_sum(acc[1]) * gi;
    float u0 = warp_sum(acc[2]) * ui, u1 = warp_sum(acc[3]) * ui;
    if (lane == 0) o[i] = silu_f(g0) * u0;
    if (lane == 1) o[i + 1] = silu_f(g1) * u1;
}
// A down item of expert e: cw[hh][j] / sc[hh][j] = block `lane` of row n + 4 hh + j (I <= 512;
// sc: the raw E4M3 scale bytes; NA: the loads skip L1).
template <bool NA = false>
__device__ __forceinline__ void sp_dn_load(const void* dw, const u8* ds, int e, int n, int H, int I, int lane,
                                           uint2 (&cw)[2][4], u32 (&sc)[2][4]) {
    size_t wstride = (size_t)H * I / 2, sstride = (size_t)H * (I >> 4);
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = ds + e * sstride;
    // As sp_gu_load: every load, nothing else (lanes past the row's blocks clamped to its last
    // one); the scale bytes stay raw until sp_dn_slot.
    int b = min(lane, (I >> 4) - 1);
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = n + 4 * hh + j;
            cw[hh][j] = ldg_w<NA>(reinterpret_cast<const uint2*>(dwe + (size_t)r * (I >> 1) + (size_t)b * 8));
            sc[hh][j] = ldg_w<NA>(dse + (size_t)r * (I >> 4) + b);
        }
}
// One slot of a down item: o[n .. n + 8) = di * (rows n .. n + 8 of the expert) . a.
template <bool LDG, typename S>
__device__ __forceinline__ void sp_dn_slot(const float* a, const uint2 (&cw)[2][4], const S (&sc)[2][4], int I, int lane,
                                           float di, float* o, int n) {
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (lane < (I >> 4))
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) f[j] = sp_scale(sc[hh][j]);
            blk16_rows4_fp4<LDG>(a + lane * 16, cw[hh], f, acc[hh]);
        }
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v = warp_sum(acc[hh][j]) * di;
            if (lane == j) o[n + 4 * hh + j] = v;
        }
}
// The multi-slot kernels (moe_*_fp4_sp: DFlash verify, and decode without moe_mk) keep the
// helpers' earlier load order (sp_*_load_m: each j block's scale bytes decoded next to their loads): the
// all-loads-first form above spills there (168 bytes of stack at 96 registers) and made the
// DFlash k=6 verify pass slower on the H200 (7.17 vs 6.53 ms, PERF.md run 148). The same
// arithmetic in the same order, so the same bits as moe_block_1's items. NA: the loads skip L1.
template <bool NA = false>
__device__ __forceinline__ void sp_gu_load_m(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i, int H,
                                           int I, int lane, uint2 (&cw)[4][4], float (&sc)[4][4]) {
    size_t wstride = (size_t)I * H / 2, sstride = (size_t)I * (H >> 4);
    const u8* wr[4] = {reinterpret_cast<const u8*>(gw) + e * wstride, reinterpret_cast<const u8*>(gw) + e * wstride,
                       reinterpret_cast<const u8*>(uw) + e * wstride, reinterpret_cast<const u8*>(uw) + e * wstride};
    const u8* sr[4] = {gs + e * sstride, gs + e * sstride, us + e * sstride, us + e * sstride};
    int nblk = H >> 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int b = lane + 32 * j;
        if (b < nblk) {
#pragma unroll
            for (int r = 0; r < 4; r++) {
                uint4 a4, c4;
                load_blk<1, NA>(wr[r], sr[r], i + (r & 1), H, b, a4, c4, sc[j][r]);
                cw[j][r] = make_uint2(a4.x, a4.y);
            }
        }
    }
}
// A down item of expert e: cw[hh][j] / sc[hh][j] = block `lane` of row n + 4 hh + j (I <= 512).
template <bool NA = false>
__device__ __forceinline__ void sp_dn_load_m(const void* dw, const u8* ds, int e, int n, int H, int I, int lane,
                                           uint2 (&cw)[2][4], float (&sc)[2][4]) {
    size_t wstride = (size_t)H * I / 2, sstride = (size_t)H * (I >> 4);
    const u8* dwe = reinterpret_cast<const u8*>(dw) + e * wstride;
    const u8* dse = ds + e * sstride;
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (lane < (I >> 4)) {
                uint4 a4, c4;
                load_blk<1, NA>(dwe, dse, n + 4 * hh + j, I, lane, a4, c4, sc[hh][j]);
                cw[hh][j] = make_uint2(a4.x, a4.y);
            }
}
template <bool NA = false>
__device__ void moe_gu_sp_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                               const float* uinv, const float* x, int H, int I, int KK, const int* grp_expert,
                               const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* act) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float gi = ginv[e], ui = uinv[e];
        uint2 cw[4][4];
        float sc[4][4];
        sp_gu_load_m<NA>(gw, gs, uw, us, e, i, H, I, lane, cw, sc);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            sp_gu_slot<true>(x + (size_t)(slot / KK) * H, cw, sc, H, lane, gi, ui, act + (size_t)slot * I, i);
        }
    }
}
// down, items of 8 output rows (two groups of 4, each moe_dn_s_impl's arithmetic); I <= 512.
template <bool NA = false>
__device__ void moe_dn_sp_impl(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                               const int* grp_expert, const int* grp_start, const int* grp_count, const int* perm,
                               const int* meta, float* out) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 3;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 8;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float di = dinv[e];
        uint2 cw[2][4];
        float sc[2][4];
        sp_dn_load_m<NA>(dw, ds, e, n, H, I, lane, cw, sc);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            sp_dn_slot<true>(act + (size_t)slot * I, cw, sc, I, lane, di, out + (size_t)slot * H, n);
        }
    }
}
// _spn (KernelSet sp_na, on since session 26): the expert weight and scale loads skip L1, as moe_block_1n's do,
// leaving it to the activation rows every item of a slot reads. The same bits.
extern "C" __global__ __launch_bounds__(128, 5) void moe_gate_up_fp4_warp(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_sp_impl<true>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ __launch_bounds__(128) void moe_down_fp4_warp(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_sp_impl<true>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_gate_up_fp4_grouped(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                             const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                             const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_s_impl<1>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_gate_up_bf16_grouped(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const float* x, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_s_impl<0>(gw, gs, ginv, uw, us, uinv, x, H, I, K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ void moe_down_fp4_grouped(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                          const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                          float* out) { PDL_ENTRY();
    moe_dn_s_impl<1>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}
extern "C" __global__ void moe_down_bf16_grouped(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_s_impl<0>(dw, ds, dinv, act, H, I, ge, gst, gc, perm, meta, out);
}


// ---- moe_tc: an item's expert dot products on tensor cores (KernelSet moe_tc; H 2048, I 512) ----
// The f32 items above spend ~4 instructions a code (decode to f32, FMA; PERF.md run 188: the
// gate/up and down phases issue-bound). Here mma.sync m16n8k16 (f16 in, f32 accumulate) takes the
// products. A's 16 rows are (weight row, K segment) pairs: every code decoded to f16 by the E4M3
// trick (e2m1 * 2^-6, exact) and multiplied by its block's E4M3 scale as f16 (mul.rn.f16x2: the
// product has at most 6 significant bits and lies in [2^-16, 42], so it is exact). B's columns
// are the activation row's segments as f16 hi and lo of x * 2^-4 (TC_XS; ~22 significant bits;
// |x| must stay below 2^20, f16's range times 2^4), so one mma gives both halves; of D only the
// diagonal (row (r, s), columns hi s and lo s) is used. A lane's codes of a segment are a
// contiguous run (one 16-byte load per 32 codes); the k order inside a step is the same
// permutation in A and B (codes 0, 2 | 1, 3 of a step's four: the pairs cvt.rn.f16x2.e4m3x2
// gives), so the sum is the segment's dot product. A row's value: its segments' (hi + lo) in a
// fixed tree, times TC_UNSCALE and the expert's global inverse scale. B fragments are stored as
// mma wants them: step j, lane l at uint2 index (lanes a step) j + l.
#define TC_XS 0.0625f
// What an item's sums are multiplied by before the global inverse scale: 2^6 (the codes as
// e2m1 * 2^-6) times 2^4 (1 / TC_XS). Exact.
#define TC_UNSCALE 1024.f
typedef unsigned short u16;
__device__ __forceinline__ u16 tc_f2h(float f) {
#if defined(__CUDA_ARCH__)
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return emu_f2h(f);
#endif
}
__device__ __forceinline__ float tc_h2f(u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return emu_h2f(h);
#endif
}
// a * b, f16x2 (round to nearest; subnormals kept).
__device__ __forceinline__ u32 tc_hmul2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    auto m = [](u32 x, u32 y) { return (u32)emu_f2h(emu_h2f((u16)x) * emu_h2f((u16)y)); };
    return m(a & 0xffffu, b & 0xffffu) | (m(a >> 16, b >> 16) << 16);
#endif
}
// w's E4M3 bytes 0, 1 -> lo (byte 0 in the low half), bytes 2, 3 -> hi, as f16 (exact).
__device__ __forceinline__ void tc_e4m3x4(u32 w, u32& lo, u32& hi) {
#if defined(__CUDA_ARCH__)
    asm("{.reg .b16 a0, a1;\n\t"
        "mov.b32 {a0, a1}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, a0;\n\t"
        "cvt.rn.f16x2.e4m3x2 %1, a1;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    auto h = [](u32 b) {
        float v = e4m3u((u8)(b & 0x7fu));
        return (u32)emu_f2h((b & 0x80u) ? -v : v);
    };
    lo = h(w & 0xffu) | (h((w >> 8) & 0xffu) << 16);
    hi = h((w >> 16) & 0xffu) | (h(w >> 24) << 16);
#endif
}
__device__ __forceinline__ void mma_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    emu_mma_f16(c, a0, a1, a2, a3, b0, b1);
#endif
}
// x as B's hi and lo halves (of x * TC_XS).
__device__ __forceinline__ void tc_split(float x, u16& h, u16& l) {
    float v = x * TC_XS;
    h = tc_f2h(v);
    l = tc_f2h(v - tc_h2f(h));
}
// A step's slot of an input k (its four inputs k & ~3 .. stored as 0, 2, 1, 3).
__device__ __forceinline__ int tc_pos(int k) { return ((k >> 1) & 1) | ((k & 1) << 1); }
// Input k of a gate/up activation row (H 2048: segment k >> 9, lane chunk (k >> 7) & 3, step
// (k >> 2) & 31) into its B fragments fr (32 steps x 32 lanes x 4 halves; lo 16 lanes after hi).
__device__ __forceinline__ void tcg_put(u16* fr, int k, float x) {
    u16 h, l;
    tc_split(x, h, l);
    int b = ((((k >> 2) & 31) * 32 + (k >> 9) * 4 + ((k >> 7) & 3)) << 2) + tc_pos(k);
    fr[b] = h;
    fr[b + 64] = l;
}
// Input k of a down activation row (I 512: segment k >> 8, lane chunk (k >> 6) & 3, step
// (k >> 2) & 15) into its B fragments fr (16 steps x 16 lanes x 4 halves; lo 8 lanes after hi).
__device__ __forceinline__ void tcd_put(u16* fr, int k, float x) {
    u16 h, l;
    tc_split(x, h, l);
    int b = ((((k >> 2) & 15) * 16 + (k >> 8) * 4 + ((k >> 6) & 3)) << 2) + tc_pos(k);
    fr[b] = h;
    fr[b + 32] = l;
}
// Two k steps: 8 codes each of A rows g (word wa, its block's scale pair sa) and g + 8 (wb, sb)
// against B fragments b0 (codes 0..3) and b1 (codes 4..7).
__device__ __forceinline__ void tc_word(float* c, u32 wa, u32 wb, u32 sa, u32 sb, uint2 b0, uint2 b1) {
    u32 ae0, ae1, ao0, ao1, be0, be1, bo0, bo1;
    tc_e4m3x4(((wa << 4) & 0x80808080u) | ((wa << 2) & 0x1c1c1c1cu), ae0, ae1);  // codes (0, 2), (4, 6)
    tc_e4m3x4((wa & 0x80808080u) | ((wa >> 2) & 0x1c1c1c1cu), ao0, ao1);        // codes (1, 3), (5, 7)
    tc_e4m3x4(((wb << 4) & 0x80808080u) | ((wb << 2) & 0x1c1c1c1cu), be0, be1);
    tc_e4m3x4((wb & 0x80808080u) | ((wb >> 2) & 0x1c1c1c1cu), bo0, bo1);
    mma_f16(c, tc_hmul2(ae0, sa), tc_hmul2(be0, sb), tc_hmul2(ao0, sa), tc_hmul2(bo0, sb), b0.x, b0.y);
    mma_f16(c, tc_hmul2(ae1, sa), tc_hmul2(be1, sb), tc_hmul2(ao1, sa), tc_hmul2(bo1, sb), b1.x, b1.y);
}
// A gate/up item (expert e; rows gate i, i + 1, up i, i + 1): lane (g = lane / 4, t = lane % 4)
// holds, of row i + (g & 1) in segment g >> 1 (512 inputs), inputs 128 t .. 128 t + 127: gate
// codes cw[0..4), up cw[4..8), scale bytes sc[0] (gate) and sc[1] (up). NA: loads skip L1.
template <bool NA>
__device__ __forceinline__ void tcg_load(const void* gw, const u8* gs, const void* uw, const u8* us, int e, int i,
                                         int lane, uint4 (&cw)[8], uint2 (&sc)[2]) {
    const int H = 2048, I = 512;
    int g = lane >> 2, t = lane & 3, r = i + (g & 1), s = g >> 1;
    size_t wo = (size_t)e * I * H / 2 + (size_t)r * (H / 2) + 256 * s + 64 * t;
    size_t so = (size_t)e * I * (H / 16) + (size_t)r * (H / 16) + 32 * s + 8 * t;
    const uint4* pg = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(gw) + wo);
    const uint4* pu = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(uw) + wo);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        cw[q] = ldg_w<NA>(pg + q);
        cw[4 + q] = ldg_w<NA>(pu + q);
    }
    sc[0] = ldg_w<NA>(reinterpret_cast<const uint2*>(gs + so));
    sc[1] = ldg_w<NA>(reinterpret_cast<const uint2*>(us + so));
}
// f16 pairs (s, s) of the block scales in E4M3 bytes 0..3 of w: d[b] for byte b. The sign bit
// is ignored, as e4m3u (the f32 items' decode) ignores it.
__device__ __forceinline__ void tc_scales4(u32 w, u32 (&d)[4]) {
    u32 lo, hi;
    tc_e4m3x4(w & 0x7f7f7f7fu, lo, hi);
    d[0] = __byte_perm(lo, 0u, 0x1010);
    d[1] = __byte_perm(lo, 0u, 0x3232);
    d[2] = __byte_perm(hi, 0u, 0x1010);
    d[3] = __byte_perm(hi, 0u, 0x3232);
}
// A gate/up item's D fragment against B fragments bf (the activation row's, tcg_put's layout).
__device__ __forceinline__ void tcg_dot(const uint4 (&cw)[8], const uint2 (&sc)[2], const uint2* bf, int lane, float* c) {
    c[0] = c[1] = c[2] = c[3] = 0.f;
    u32 sg[2][4], su[2][4];
    tc_scales4(sc[0].x, sg[0]);
    tc_scales4(sc[0].y, sg[1]);
    tc_scales4(sc[1].x, su[0]);
    tc_scales4(sc[1].y, su[1]);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        u32 wg[4] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
        u32 wu[4] = {cw[4 + u].x, cw[4 + u].y, cw[4 + u].z, cw[4 + u].w};
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            int j = 8 * u + 2 * wi, b = 2 * u + (wi >> 1);
            tc_word(c, wg[wi], wu[wi], sg[b >> 2][b & 3], su[b >> 2][b & 3], bf[32 * j + lane], bf[32 * (j + 1) + lane]);
        }
    }
}
// The item's outputs from its D fragment: vg / vu = gate / up of row i in lane 0 and of row
// i + 1 in lane 4 (before TC_UNSCALE and the global inverse scales): a segment's hi + lo, then
// (s0 + s1) + (s2 + s3).
__device__ __forceinline__ void tcg_sum(const float* c, int lane, float& vg, float& vu) {
    bool odd = (lane >> 3) & 1;
    vg = odd ? c[1] : c[0];
    vu = odd ? c[3] : c[2];
    vg += __shfl_sync(0xffffffffu, vg, (lane + 2) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 2) & 31);
    vg += __shfl_sync(0xffffffffu, vg, (lane + 8) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 8) & 31);
    vg += __shfl_sync(0xffffffffu, vg, (lane + 17) & 31);
    vu += __shfl_sync(0xffffffffu, vu, (lane + 17) & 31);
}
// SiLU(gate) * up of rows i (lane 0) and i + 1 (lane 4) of a gate/up item into the slot's down B
// fragments af (tcd_put's layout); also f32 into o when set.
__device__ __forceinline__ void tcg_out(const float* c, int lane, float gi, float ui, u16* af, float* o, int i) {
    float vg, vu;
    tcg_sum(c, lane, vg, vu);
    if ((lane & ~4) == 0) {
        float v = silu_f(vg * TC_UNSCALE * gi) * (vu * TC_UNSCALE * ui);
        tcd_put(af, i + (lane >> 2), v);
        if (o) o[i + (lane >> 2)] = v;
    }
}
// A down item (expert e, output rows n .. n + 7): lane (g, t) holds, of row n + g, inputs 64 t ..
// 64 t + 63 of segment 0 (cw[0..2)) and of segment 1 (cw[2..4)) and their scale bytes (sc[0],
// sc[1]). NA: loads skip L1.
template <bool NA>
__device__ __forceinline__ void tcd_load(const void* dw, const u8* ds, int e, int n, int lane, uint4 (&cw)[4], u32 (&sc)[2]) {
    const int H = 2048, I = 512;
    int g = lane >> 2, t = lane & 3, r = n + g;
    const u8* wb = reinterpret_cast<const u8*>(dw) + (size_t)e * H * I / 2 + (size_t)r * (I / 2) + 32 * t;
    const u8* sb = ds + (size_t)e * H * (I / 16) + (size_t)r * (I / 16) + 4 * t;
    cw[0] = ldg_w<NA>(reinterpret_cast<const uint4*>(wb));
    cw[1] = ldg_w<NA>(reinterpret_cast<const uint4*>(wb + 16));
    cw[2] = ldg_w<NA>(reinterpret_cast<const uint4*>(wb + 128));
    cw[3] = ldg_w<NA>(reinterpret_cast<const uint4*>(wb + 144));
    sc[0] = ldg_w<NA>(reinterpret_cast<const u32*>(sb));
    sc[1] = ldg_w<NA>(reinterpret_cast<const u32*>(sb + 16));
}
// A down item's D fragment against B fragments bf (tcd_put's layout; lanes 16..31 hold zeros).
__device__ __forceinline__ void tcd_dot(const uint4 (&cw)[4], const u32 (&sc)[2], const uint2* bf, int lane, float* c) {
    c[0] = c[1] = c[2] = c[3] = 0.f;
    u32 sa[4], sb[4];
    tc_scales4(sc[0], sa);
    tc_scales4(sc[1], sb);
    bool bl = lane < 16;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        u32 wa[4] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
        u32 wb[4] = {cw[2 + u].x, cw[2 + u].y, cw[2 + u].z, cw[2 + u].w};
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            int j = 8 * u + 2 * wi, b = 2 * u + (wi >> 1);
            uint2 b0 = make_uint2(0u, 0u), b1 = b0;
            if (bl) {
                b0 = bf[16 * j + lane];
                b1 = bf[16 * (j + 1) + lane];
            }
            tc_word(c, wa[wi], wb[wi], sa[b], sb[b], b0, b1);
        }
    }
}
// Row n + g of a down item in lane 4 g (before TC_UNSCALE and the global inverse scale): (segment 0
// hi + lo) + (segment 1 hi + lo), D's columns 0 / 2 (c0 of t = 0 / 1) and 1 / 3 (c3).
__device__ __forceinline__ float tcd_sum(const float* c, int lane) {
    float v0 = c[0] + __shfl_sync(0xffffffffu, c[0], (lane + 1) & 31);
    float v1 = c[3] + __shfl_sync(0xffffffffu, c[3], (lane + 1) & 31);
    return v0 + v1;
}

// moe_tc for the multi-row passes (DFlash verify, decode of several sequences): the rows' B
// fragments first (moe_tc_bfrag_rows: row r of x -> tcg_put's layout at xf + 4096 r halves), then
// moe_*_fp4_sp's items (a warp a gate/up item of 2 intermediate rows, a down item of 8 output
// rows, every slot of the group in turn) with moe_block_1nprt's per-slot arithmetic (tcg_dot /
// tcd_dot against the slot's own fragments, the same sums and scales), so a row verified with k
// others is bit-identical to the row decoded alone. The gate/up items leave SiLU(gate) * up as
// the down's B fragments in `act` (the f32 rows' bytes). H 2048, I 512.
extern "C" __global__ void moe_tc_bfrag_rows(const float* x, u16* xf) {
    PDL_ENTRY();
    const float* xr = x + (size_t)blockIdx.x * 2048;
    u16* fr = xf + (size_t)blockIdx.x * 4096;
    for (int k = threadIdx.x; k < 2048; k += blockDim.x) tcg_put(fr, k, xr[k]);
}
template <bool NA>
__device__ void moe_gu_tc_impl(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                               const float* uinv, const u16* xf, int KK, const int* grp_expert, const int* grp_start,
                               const int* grp_count, const int* perm, const int* meta, float* act) {
    const int I = 512;
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = I >> 1;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, i = (it - g * per) * 2;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float gi = ginv[e], ui = uinv[e];
        uint4 tw[8];
        uint2 ts[2];
        tcg_load<NA>(gw, gs, uw, us, e, i, lane, tw, ts);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            float c[4];
            tcg_dot(tw, ts, reinterpret_cast<const uint2*>(xf + (size_t)(slot / KK) * 4096), lane, c);
            tcg_out(c, lane, gi, ui, reinterpret_cast<u16*>(act + (size_t)slot * I), nullptr, i);
        }
    }
}
template <bool NA>
__device__ void moe_dn_tc_impl(const void* dw, const u8* ds, const float* dinv, const float* act, const int* grp_expert,
                               const int* grp_start, const int* grp_count, const int* perm, const int* meta, float* out) {
    const int H = 2048, I = 512;
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nwarps = gridDim.x * (blockDim.x >> 5);
    int per = H >> 3;
    int total = meta[0] * per;
    for (int it = warp; it < total; it += nwarps) {
        int g = it / per, n = (it - g * per) * 8;
        int e = grp_expert[g], st = grp_start[g], cn = grp_count[g];
        float di = dinv[e];
        uint4 tw[4];
        u32 ts[2];
        tcd_load<NA>(dw, ds, e, n, lane, tw, ts);
        for (int si = 0; si < cn; si++) {
            int slot = perm[st + si];
            float c[4];
            tcd_dot(tw, ts, reinterpret_cast<const uint2*>(act + (size_t)slot * I), lane, c);
            float y = tcd_sum(c, lane);
            if ((lane & 3) == 0) out[(size_t)slot * H + n + (lane >> 2)] = y * TC_UNSCALE * di;
        }
    }
}
// moe_*_fp4_spn's arguments, x being moe_tc_bfrag_rows' fragments of the rows (H 2048, I 512).
extern "C" __global__ __launch_bounds__(128) void moe_gate_up_fp4_tc(const void* gw, const u8* gs, const float* ginv, const void* uw, const u8* us,
                                              const float* uinv, const void* xf, int H, int I, int K, const int* ge,
                                              const int* gst, const int* gc, const int* perm, const int* meta, float* act) { PDL_ENTRY();
    moe_gu_tc_impl<true>(gw, gs, ginv, uw, us, uinv, reinterpret_cast<const u16*>(xf), K, ge, gst, gc, perm, meta, act);
}
extern "C" __global__ __launch_bounds__(128) void moe_down_fp4_tc(const void* dw, const u8* ds, const float* dinv, const float* act, int H, int I,
                                           const int* ge, const int* gst, const int* gc, const int* perm, const int* meta,
                                           float* out) { PDL_ENTRY();
    moe_dn_tc_impl<true>(dw, ds, dinv, act, ge, gst, gc, perm, meta, out);
}

// ---- moe_block_1 (KernelSet moe_mk; one row, decode): a layer's whole MoE half in one launch ----
// Post-attention RMSNorm, router GEMV, top-k, expert gate/up + SiLU, down, the combine into the
// residual and (next_w set) the next layer's input RMSNorm, as one persistent grid with three (or
// four) grid-wide barriers instead of six (seven) launches (rmsnorm, linear_bf16_1, router_topk,
// moe_gate_up_fp4_sp, moe_down_fp4_sp, moe_combine, rmsnorm). Every
// value is computed with the arithmetic of those kernels, in the same order, so the results are
// the same bits: the norm reproduces rmsnorm's reduction over NB = norm_block(H) threads whatever
// this block's size, the router GEMV is linear_bf16_1's row_dot2, top-k is router_topk_row (run by
// every block on the shared logits), and gate/up / down are moe_*_sp's items (the same sp_*_load / sp_*_slot helpers).
// The host launches one block of 640 threads an SM so that every block is resident (grid_sync
// spins; a barrier that waits over 2 s traps instead of hanging), and
// launches it only for one row with NVFP4 experts, a BF16 router, no unfolded shared expert,
// H <= 2048, I <= 512, KK <= 32 and E <= 256. Dynamic shared memory: (H + KK * I) floats.
// `bar` is one word, 0 before the first launch; grid_sync leaves its low 31 bits unchanged.

// (emu_ns, ld_acquire_u32 and grid_sync: common.cuh.)
// grid_sync, with tp: the last arrival at and the last departure from barrier i recorded.
// mk_arrive: that arrival stamp alone (the polling form's wait has no barrier).
__device__ __forceinline__ void mk_arrive(unsigned long long* tp, int i) {
    if (tp) {
        __syncthreads();
        if (threadIdx.x == 0) atomicMax(tp + 2 * i + 1, emu_ns());
    }
}
__device__ __forceinline__ void mk_sync(unsigned* bar, unsigned& phase, unsigned long long* tp, int i) {
    mk_arrive(tp, i);
    grid_sync(bar, phase);
    if (tp && threadIdx.x == 0) atomicMax(tp + 2 * i + 2, emu_ns());
}
// Block-strided: p[0..n) = MK_UNSET (the polling form's buffer back to unset for the next launch).
__device__ __forceinline__ void mk_unset(float* p, int n) {
    for (int q = threadIdx.x; q < n; q += blockDim.x) p[q] = __uint_as_float(MK_UNSET);
}
// (rms_inv_nb: common.cuh.)
#define MOE_BLOCK_PARAMS                                                                                             \
    float *x, const float *post_w, float eps, int NB, const void *rw, float *rlog, const float *bias, int E, int K, \
        float softcap, int norm_topk, int shared_slot, float inv_scale, const void *gw, const u8 *gs,               \
        const float *ginv, const void *uw, const u8 *us, const float *uinv, const void *dw, const u8 *ds,           \
        const float *dinv, int H, int I, float *act, float *out, int *ids_out, float *wts_out, float scale,         \
        unsigned *bar, const float *next_w, float *hn_out, unsigned long long *tp, int stag
#define MOE_BLOCK_ARGS                                                                                                 \
    x, post_w, eps, NB, rw, rlog, bias, E, K, softcap, norm_topk, shared_slot, inv_scale, gw, gs, ginv, uw, us, uinv, \
        dw, ds, dinv, H, I, act, out, ids_out, wts_out, scale, bar, next_w, hn_out, tp, stag
// POLL (moe_block_1np, KernelSet moe_poll, on since session 26): no grid barrier between the router GEMV and the top-k:
// every block reads the logits until none holds MK_UNSET (router_topk_regs<POLL>), so the logits'
// read is the wait. `rlog` is then moe_block_1's own buffer, MK_UNSET everywhere before the launch
// (the host sets it once): block 0 puts MK_UNSET back after the gate/up barrier, which every block
// reaches after its top-k, so the next launch finds it unset.
// RP (moe_decode_fused, KernelSet moe_rp; with POLL): a router warp's two rows are loaded into
// registers before the wait (not only asked into L2), so phase 1 is the residual's round trip
// and the norm, then the dot products on registers: one L2 round trip fewer in the chain. The
// same products and sums in the same order as row_dot2 / row_dot (the host launches it only
// with E <= 2 x the grid's warps, so a warp has at most one pair, and H <= 2048).
// TC (moe_block_1nprt / _1npt, KernelSet moe_tc; H 2048, I 512): the gate/up and down items'
// dot products on tensor cores (tcg_* / tcd_*): phase 1 also writes the normed row's B fragments
// into sact (free until phase 3), the gate/up items write SiLU(gate) * up as the down's B
// fragments into `act` (the same bytes as its f32 rows), which phase 3 stages as before. The
// same per-row arithmetic as moe_tc_bfrag_rows + moe_gate_up_fp4_tc + moe_down_fp4_tc, so the same
// bits as those launches (kernels/emu, laguna kbench).
// DEP (moe_block_1nprtd, KernelSet moe_dep, off: within the noise in PERF.md run 219): a gate/up item's
// first code word is XORed with (a zero the compilers cannot see: E >> 16, E <= 256) AND
// (every other code and scale word of the item), so its first mma needs all of the item's loads
// and all ten go out before it. Without it ptxas issues four code and both scale loads, then the
// first mma (which waits on DRAM), then the other four: two DRAM round trips an item (the SASS
// of moe_block_1nprt, session 32). The same values, so the same bits.
// GI (moe_block_1nprtg / _1nprtdg, KernelSet moe_gi, off: within the noise in PERF.md run 219): the experts'
// global inverse scales (gate and up, E + shared_slot each) read into shared memory before the
// PDL wait, as the bias is. Without it a gate/up item reads ginv[e] / uinv[e] from global memory
// where they are used: ptxas puts both loads after the item's mma chain and its shuffles (inside
// the two lanes' output branch), so every item ends with one more memory round trip (DRAM or L2:
// the step's weight stream evicts them) before its output store, which the barrier after the
// phase waits for (SASS of moe_block_1nprt, session 33). The same values, so the same bits.
// PW (moe_block_1nprtx, KernelSet moe_pwr, on since session 40: PERF.md run 238): the small
// weights of the prologue (post-attention norm, router bias, next input norm) loaded together into
// registers and kept there across the PDL wait. Before, each was a load and then a shared store in
// a loop, so a thread's (up to four) norm weights, its bias and its next-norm weight were six
// dependent round trips before its wait (the SASS of moe_block_1nprt), which a block that only
// becomes resident when the o_proj GEMV's last blocks leave runs after that GEMV has ended. Now
// the norm weights multiply from the registers (the same product as from hn) and the bias and
// next-norm weight are stored after the residual's loads, so their round trip overlaps the
// residual's. The same values, the same arithmetic: the same bits (kernels/emu, the XS-2.1 DFlash
// pair). On an H100 2.406 -> 2.375 ms a step (run 238), its launches' wait spread 1.22 -> 0.28 us
// (run 239).
// SPF (moe_decode_fused_tc, KernelSet moe_shpf, on since session 41: PERF.md run 245):
// the folded shared expert (expert E, slot K of every row) is the one expert whose weights do not
// depend on the routing, yet its gate/up and down items are loaded from DRAM in the same phases
// as the routed ones, where the DRAM is the bound (PERF.md run 237's kbench: the gate/up phase
// 7.5 us for ~16 MB of gate/up and down weights), while during phase 1 and the logits' poll
// (~5 us) it carries little more than the residual's round trip. So every block asks L2 for a
// share of the shared expert's six ranges (gate / up / down codes, their scale bytes: 1.7 MB for
// XS-2.1), one 128-byte line a thread, the last warps first, right after the PDL wait. Its items
// then read L2, and the DRAM delivers eight slots in the critical phases instead of nine. Timing
// only: the same loads and arithmetic, so the same bits (prefetch_l2 is no instruction in
// kernels/emu). On an H100 2.405-2.409 -> 2.387 ms a step; the same lines asked for after the
// router's dot products instead, 2.391 (run 245: removed).
__device__ __forceinline__ void mk_shared_prefetch(const void* gw, const u8* gs, const void* uw, const u8* us,
                                                   const void* dw, const u8* ds, int e, int H, int I) {
    size_t cb = (size_t)I * H / 2, sb = (size_t)I * H / 16;  // one matrix's code and scale bytes
    int nc = (int)((cb + 127) >> 7), ns = (int)((sb + 127) >> 7), total = 3 * nc + 3 * ns;
    int n = gridDim.x * blockDim.x;
    for (int l = (blockDim.x - 1 - threadIdx.x) * gridDim.x + blockIdx.x; l < total; l += n) {
        const void* b;
        size_t o;
        if (l < 3 * nc) {
            int r = l / nc;
            b = r == 0 ? gw : r == 1 ? uw : dw;
            o = (size_t)e * cb + ((size_t)(l - r * nc) << 7);
        } else {
            int q = l - 3 * nc, r = q / ns;
            b = r == 0 ? (const void*)gs : r == 1 ? (const void*)us : (const void*)ds;
            o = (size_t)e * sb + ((size_t)(q - r * ns) << 7);
        }
        prefetch_l2(reinterpret_cast<const u8*>(b) + o);
    }
}
template <bool LOCAL, bool EXIT = true, bool NA = false, bool POLL = false, bool RP = false, bool TC = false,
          bool DEP = false, bool GI = false, bool PW = false, bool SPF = false>
__device__ __forceinline__ void moe_block_1_t(MOE_BLOCK_PARAMS) {
    static_assert(!TC || LOCAL, "moe_tc: block-local down items only");
    int lane = threadIdx.x & 31;
    int nwarps = gridDim.x * (blockDim.x >> 5);
    // Work is dealt to warps in the order that takes one warp from every block before a second
    // from any (swarp), so it spreads over all SMs. Router rows: pair n / 2 goes to warp n / 2.
    // The weights do not depend on the previous launch, so their lines are asked into L2 before
    // waiting for it.
    int swarp = (threadIdx.x >> 5) * gridDim.x + blockIdx.x;
    // RP: lane l's 16-column blocks l + 32 j (j < 4: H <= 2048) of rows 2 swarp and 2 swarp + 1.
    uint4 rpa[4][2], rpb[4][2];
    if (RP && 2 * swarp < E) {
        const bf16_t* ra = reinterpret_cast<const bf16_t*>(rw) + (size_t)2 * swarp * H;
        const bf16_t* rb = 2 * swarp + 1 < E ? ra + H : ra;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int b = min(lane + 32 * j, (H >> 4) - 1);
            const uint4* pa = reinterpret_cast<const uint4*>(ra + (size_t)b * 16);
            const uint4* pb = reinterpret_cast<const uint4*>(rb + (size_t)b * 16);
            rpa[j][0] = __ldg(pa);
            rpa[j][1] = __ldg(pa + 1);
            rpb[j][0] = __ldg(pb);
            rpb[j][1] = __ldg(pb + 1);
        }
    } else if (!RP && 2 * swarp < E) {
        const char* r0 = reinterpret_cast<const char*>(rw) + (size_t)2 * swarp * H * 2;
        int lines = (min(2, E - 2 * swarp) * H * 2 + 127) >> 7;
        for (int l = lane; l < lines; l += 32) prefetch_l2(r0 + ((size_t)l << 7));
    }
    // The layer's small weights (post-attention norm, router bias, next input norm) are evicted
    // from L2 by the step's weight stream, so each would be a DRAM round trip inside a phase's
    // chain: they are read here, before the wait, into shared memory (the norm weight into hn,
    // which phase 1 then scales in place by the same thread: the same product).
    extern __shared__ float smem[];
    float* hn = smem;      // [H] the normed row
    float* sact = smem + H;  // [KK * I] SiLU(gate) * up of every slot (phase 3)
    __shared__ float s_bias[256];
    __shared__ float s_nw[1024];
    // GI: E + shared_slot <= 257 (E <= 256: s_bias).
    __shared__ float s_gi[GI ? 260 : 1], s_ui[GI ? 260 : 1];
    // PW: a thread's norm weights i = threadIdx.x + j * blockDim.x, j < PWN (the host's 640
    // threads and H <= 2048 need 4; any further ones, and biases past blockDim.x, by the loops).
    constexpr int PWN = 4;
    float pw[PWN], pb = 0.f, pn = 0.f;
    int pi0 = blockIdx.x * blockDim.x + threadIdx.x;
    if (PW) {
#pragma unroll
        for (int j = 0; j < PWN; j++) {
            int i = threadIdx.x + j * blockDim.x;
            pw[j] = i < H ? post_w[i] : 0.f;
        }
        if ((int)threadIdx.x < E) pb = bias[threadIdx.x];
        if (next_w && pi0 < H) pn = next_w[pi0];
    }
    // (PW: only the values past those in registers.)
    for (int i = threadIdx.x + (PW ? PWN * blockDim.x : 0); i < H; i += blockDim.x) hn[i] = post_w[i];
    for (int e = threadIdx.x + (PW ? blockDim.x : 0); e < E; e += blockDim.x) s_bias[e] = bias[e];
    if (GI)
        for (int e = threadIdx.x; e < E + shared_slot; e += blockDim.x) {
            s_gi[e] = ginv[e];
            s_ui[e] = uinv[e];
        }
    if (!PW && next_w && pi0 < H) s_nw[threadIdx.x] = next_w[pi0];
    pdl_wait();
    // Every block is resident once all have passed this point (the launch needs all of them to
    // trigger), so a dependent launch cannot take the resources of a block still to start.
    pdl_launch();
    STAMP();
    // tp (laguna kbench; 0 in the engine): [0] earliest block start, [2i+1] last arrival at
    // barrier i, [2i+2] last departure from it, [9] last block end, [10] top-k done in every
    // block (globaltimer ns).
    if (tp && threadIdx.x == 0) atomicMin(tp, emu_ns());
    if (SPF && shared_slot) mk_shared_prefetch(gw, gs, uw, us, dw, ds, E, H, I);
    // The barrier word's phase bit (thread 0's, in shared memory to spare a register; the load
    // overlaps the norm below).
    __shared__ unsigned gphase;
    if (threadIdx.x == 0) gphase = ld_acquire_u32(bar) & 0x80000000u;
    __shared__ float sh[33];
    __shared__ int s_ids[32];
    __shared__ float s_wts[32];
    int KK = K + shared_slot;
    // 1. RMSNorm of the residual row (every block), router logits (2 rows a warp, linear_bf16_1).
    float inv = rms_inv_nb<false>(x, H, NB, eps, sh);
    if (PW) {
        // (s_nw is read by this thread only, s_bias by top-k after the barrier below.)
        if ((int)threadIdx.x < E) s_bias[threadIdx.x] = pb;
        if (next_w && pi0 < H) s_nw[threadIdx.x] = pn;
#pragma unroll
        for (int j = 0; j < PWN; j++) {
            int i = threadIdx.x + j * blockDim.x;
            if (i < H) {
                float v = pw[j] * (x[i] * inv);
                hn[i] = v;
                if (TC) tcg_put(reinterpret_cast<u16*>(sact), i, v);
            }
        }
    }
    for (int i = threadIdx.x + (PW ? PWN * blockDim.x : 0); i < H; i += blockDim.x) {
        float v = hn[i] * (x[i] * inv);
        hn[i] = v;
        if (TC) tcg_put(reinterpret_cast<u16*>(sact), i, v);
    }
    __syncthreads();
    if (RP) {
        int n = 2 * swarp;
        if (n < E) {
            // dot16_bf16's products and sums on the registers, blocks in row_dot2's order.
            float a = 0.f, b2 = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int b = lane + 32 * j;
                if (b < (H >> 4)) {
                    a += dot16_bf16_w(rpa[j][0], rpa[j][1], hn + b * 16);
                    b2 += dot16_bf16_w(rpb[j][0], rpb[j][1], hn + b * 16);
                }
            }
            a = warp_sum(a);
            b2 = warp_sum(b2);
            if (lane == 0) st_w<POLL>(rlog + n, a);
            if (lane == 1 && n + 1 < E) st_w<POLL>(rlog + n + 1, b2);
        }
    } else {
        const float* xr[1] = {hn};
        for (int n = 2 * swarp; n < E; n += 2 * nwarps) {
            float a[1], b[1];
            if (n + 1 < E) {
                const void* w2 = (const void*)(reinterpret_cast<const bf16_t*>(rw) + H);
                row_dot2<0, 1>(rw, nullptr, 1.f, w2, nullptr, 1.f, n, H, xr, 1, a, b);
            } else {
                row_dot<0, 1>(rw, nullptr, 1.f, n, H, xr, 1, a);
            }
            // (POLL: relaxed GPU-scope stores, which the other blocks' relaxed loads may observe.)
            if (lane == 0) st_w<POLL>(rlog + n, a[0]);
            if (lane == 1 && n + 1 < E) st_w<POLL>(rlog + n + 1, b[0]);
        }
    }
    // (POLL: kbench's barrier 0 stamps are this block's arrival and its logits complete.)
    if (POLL)
        mk_arrive(tp, 0);
    else
        mk_sync(bar, gphase, tp, 0);
    // 2. Top-k (every block, on the logits in L2), then gate/up items: (slot, 2 rows), one a warp.
    if (threadIdx.x < 32)
        router_topk_row<8, POLL>(0, rlog, s_bias, E, K, softcap, norm_topk, s_ids, s_wts, shared_slot, inv_scale, nullptr,
                        nullptr, nullptr, nullptr, nullptr);
    if (POLL && tp && threadIdx.x == 0) atomicMax(tp + 2, emu_ns());
    __syncthreads();
    if (tp && threadIdx.x == 0) atomicMax(tp + 10, emu_ns());
    if (blockIdx.x == 0 && threadIdx.x < KK) {
        ids_out[threadIdx.x] = s_ids[threadIdx.x];
        wts_out[threadIdx.x] = s_wts[threadIdx.x];
    }
    // (By swarp: the XS shape's 2,304 items spread over all 132 SMs, 17-18 each, instead of
    // filling 116 SMs' 20 warps and leaving 16 idle.)
    // stag > 0: warp w of a block issues its item's loads w * stag ns after warp 0 (items are
    // dealt in warp order, so in item order), so that the DRAM returns whole items in turn and
    // their dot products run while later items' bytes arrive, instead of every item's last bytes
    // arriving at the end of the phase (timing only: the same loads and arithmetic).
    if (stag > 0 && (threadIdx.x >> 5) > 0) __nanosleep((unsigned)stag * (threadIdx.x >> 5));
    {
        int per = I >> 1;
        for (int it = swarp; it < KK * per; it += nwarps) {
            int g = it / per, i = (it - g * per) * 2;
            int e = s_ids[g];
            float gi = GI ? s_gi[e] : ginv[e], ui = GI ? s_ui[e] : uinv[e];
            if (TC) {
                uint4 tw[8];
                uint2 ts[2];
                tcg_load<NA>(gw, gs, uw, us, e, i, lane, tw, ts);
                if (DEP) {
                    u32 d = tw[0].y ^ tw[0].z ^ tw[0].w ^ ts[0].x ^ ts[0].y ^ ts[1].x ^ ts[1].y;
#pragma unroll
                    for (int q = 1; q < 8; q++) d ^= tw[q].x ^ tw[q].y ^ tw[q].z ^ tw[q].w;
                    tw[0].x ^= ((unsigned)E >> 16) & d;  // E <= 256: a zero the compilers cannot see
                }
                float c[4];
                tcg_dot(tw, ts, reinterpret_cast<const uint2*>(sact), lane, c);
                tcg_out(c, lane, gi, ui, reinterpret_cast<u16*>(act + (size_t)g * I), nullptr, i);
            } else {
                uint2 cw[4][4];
                u32 sc[4][4];
                sp_gu_load<NA>(gw, gs, uw, us, e, i, H, I, lane, cw, sc);
                sp_gu_slot<false>(hn, cw, sc, H, lane, gi, ui, act + (size_t)g * I, i);
            }
        }
    }
    // Down items (slot, 8 output rows). LOCAL: block b owns the row groups [gb0, gb1) (H / 8
    // groups dealt gpb a block) and computes every slot's items of them, chunks of at most cg
    // groups whose outputs fit s_dn, so it combines its rows itself after a block barrier instead
    // of a grid barrier (item i of a chunk: slot i % KK, group i / KK; a warp takes i = its
    // index, + warps a block). Else every warp of the grid takes items in swarp order.
    // The down weights of this warp's first item depend only on the routing: loaded before the
    // barrier, so their latency overlaps it and the staging of the activations.
    __shared__ float s_dn[1024];
    int wib = threadIdx.x >> 5, nwb = blockDim.x >> 5;
    int ngr = H >> 3, gpb = (ngr + (int)gridDim.x - 1) / (int)gridDim.x;
    int gb0 = min((int)blockIdx.x * gpb, ngr), gb1 = min(gb0 + gpb, ngr);
    int cg = 1024 / (8 * KK);
    int dper = H >> 3, ditems = KK * dper;
    uint2 dcw[2][4];
    u32 dsc[2][4];
    uint4 tdw[4];
    u32 tds[2];
    float ddi = 0.f;
    if (LOCAL) {
        if (wib < KK * min(cg, gb1 - gb0)) {
            int g = wib % KK, n = (gb0 + wib / KK) * 8;
            ddi = dinv[s_ids[g]];
            if (TC)
                tcd_load<NA>(dw, ds, s_ids[g], n, lane, tdw, tds);
            else
                sp_dn_load<NA>(dw, ds, s_ids[g], n, H, I, lane, dcw, dsc);
        }
    } else if (swarp < ditems) {
        int g = swarp / dper, n = (swarp - g * dper) * 8;
        ddi = dinv[s_ids[g]];
        sp_dn_load<NA>(dw, ds, s_ids[g], n, H, I, lane, dcw, dsc);
    }
    mk_sync(bar, gphase, tp, 1);
    if (POLL && blockIdx.x == 0) mk_unset(rlog, E);
    // 3. Down items on the activations staged in shared memory.
    // (KK * I is a multiple of 16: float4 loads, two a thread in flight.)
    {
        const float4* a4 = reinterpret_cast<const float4*>(act);
        float4* s4 = reinterpret_cast<float4*>(sact);
        int n4 = (KK * I) >> 2;
        for (int i0 = threadIdx.x; i0 < n4; i0 += 2 * blockDim.x) {
            int i1 = i0 + blockDim.x;
            float4 v0 = __ldcg(a4 + i0);
            float4 v1 = i1 < n4 ? __ldcg(a4 + i1) : make_float4(0.f, 0.f, 0.f, 0.f);
            s4[i0] = v0;
            if (i1 < n4) s4[i1] = v1;
        }
    }
    if (LOCAL) {
        // The residual of this thread's first combine row, loaded with the activations.
        float xr0 = (int)threadIdx.x < min(cg, gb1 - gb0) * 8 ? x[gb0 * 8 + threadIdx.x] : 0.f;
        __syncthreads();
        for (int c0 = gb0; c0 < gb1; c0 += cg) {
            int nc = min(cg, gb1 - c0), rows = nc * 8;
            for (int it = wib; it < KK * nc; it += nwb) {
                int g = it % KK, nl = (it / KK) * 8;
                if (!(c0 == gb0 && it == wib)) {
                    ddi = dinv[s_ids[g]];
                    if (TC)
                        tcd_load<NA>(dw, ds, s_ids[g], c0 * 8 + nl, lane, tdw, tds);
                    else
                        sp_dn_load<NA>(dw, ds, s_ids[g], c0 * 8 + nl, H, I, lane, dcw, dsc);
                }
                if (TC) {
                    float c[4];
                    tcd_dot(tdw, tds, reinterpret_cast<const uint2*>(sact + (size_t)g * I), lane, c);
                    float y = tcd_sum(c, lane);
                    if ((lane & 3) == 0) s_dn[g * rows + nl + (lane >> 2)] = y * TC_UNSCALE * ddi;
                } else {
                    sp_dn_slot<false>(sact + (size_t)g * I, dcw, dsc, I, lane, ddi, s_dn + g * rows, nl);
                }
            }
            __syncthreads();
            if (tp && c0 == gb0 && threadIdx.x == 0) {
                unsigned long long t = emu_ns();
                atomicMax(tp + 5, t);
                atomicMax(tp + 6, t);
            }
            // 4. Combine into the residual (moe_combine's arithmetic; the shared expert is slot
            // K), and the per-slot outputs to `out` as moe_down_fp4_sp leaves them.
            for (int r = threadIdx.x; r < rows; r += blockDim.x) {
                int n = c0 * 8 + r;
                float a = 0.f;
                for (int k = 0; k < KK; k++) a = fmaf(s_wts[k], s_dn[k * rows + r], a);
                // __fmul_rn: not contracted into an FMA with the add (moe_combine's PTX has the
                // mul and the add apart, so the same bits).
                a = __fmul_rn(a, scale);
                x[n] = (c0 == gb0 && r == (int)threadIdx.x ? xr0 : x[n]) + a;
            }
            for (int q = threadIdx.x; q < KK * rows; q += blockDim.x) {
                int k = q / rows, r = q - k * rows;
                out[(size_t)k * H + c0 * 8 + r] = s_dn[q];
            }
            __syncthreads();
        }
        if (tp && gb0 >= gb1 && threadIdx.x == 0) {
            unsigned long long t = emu_ns();
            atomicMax(tp + 5, t);
            atomicMax(tp + 6, t);
        }
    } else {
        __syncthreads();
        for (int it = swarp; it < ditems; it += nwarps) {
            int g = it / dper, n = (it - g * dper) * 8;
            if (it != swarp) {
                ddi = dinv[s_ids[g]];
                sp_dn_load<NA>(dw, ds, s_ids[g], n, H, I, lane, dcw, dsc);
            }
            sp_dn_slot<false>(sact + (size_t)g * I, dcw, dsc, I, lane, ddi, out + (size_t)g * H, n);
        }
        mk_sync(bar, gphase, tp, 2);
        // 4. Combine into the residual (moe_combine's arithmetic; the shared expert is slot K).
        for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < H; n += gridDim.x * blockDim.x) {
            float a = 0.f;
            for (int k = 0; k < KK; k++) a = fmaf(s_wts[k], __ldcg(out + (size_t)k * H + n), a);
            // __fmul_rn: not contracted into an FMA with the add (moe_combine's PTX has the mul and
            // the add apart, so the same bits).
            a = __fmul_rn(a, scale);
            x[n] = x[n] + a;
        }
    }
    // 5. With next_w: the next layer's input RMSNorm of the updated row into hn_out (rmsnorm's
    // arithmetic again), so that layer starts with its projections.
    if (next_w) {
        // Only the blocks holding output elements wait for the last barrier; the others arrive
        // and exit, so the next launch's blocks (the q|k|v|g GEMV, whose first weight loads come
        // before its PDL wait) take their SMs while the norm runs.
        if (EXIT && (int)(blockIdx.x * blockDim.x) >= H) {
            if (tp) {
                __syncthreads();
                if (threadIdx.x == 0) atomicMax(tp + 7, emu_ns());
            }
            grid_arrive(bar);
            return;
        }
        mk_sync(bar, gphase, tp, 3);
        // This thread's first output element: its residual loaded with the norm's (one L2 round
        // trip, not two), its weight from s_nw.
        int i0 = blockIdx.x * blockDim.x + threadIdx.x;
        float xo = i0 < H ? __ldcg(x + i0) : 0.f;
        float inv2 = rms_inv_nb<true>(x, H, NB, eps, sh);
        for (int i = i0; i < H; i += gridDim.x * blockDim.x)
            hn_out[i] = (i == i0 ? s_nw[threadIdx.x] : next_w[i]) * ((i == i0 ? xo : __ldcg(x + i)) * inv2);
    }
    if (tp) {
        __syncthreads();
        if (threadIdx.x == 0) atomicMax(tp + 9, emu_ns());
    }
}
// moe_block_1np with the router rows loaded into registers before the wait (KernelSet moe_rp).
extern "C" __global__ __launch_bounds__(640, 1) void moe_decode_fused(MOE_BLOCK_PARAMS) { moe_block_1_t<true, true, true, true, true>(MOE_BLOCK_ARGS); }
// SPF on moe_block_1nprtx (KernelSet moe_shpf).
extern "C" __global__ __launch_bounds__(640, 1) void moe_decode_fused_tc(MOE_BLOCK_PARAMS) {
    moe_block_1_t<true, true, true, true, true, true, false, false, true, true>(MOE_BLOCK_ARGS);
}
