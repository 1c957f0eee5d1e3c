// Mixture of experts: router (f32 sigmoid, softcap, biased top-k, renormalise), grouping of
// (row, slot) pairs by expert on the device, gate+up+SiLU and down projections over expert
// stacks (BF16 or NVFP4), and the weighted combine with the shared expert and the residual.
// kernels/src/lib.rs builds the family as one NVRTC program from router.cu, experts.cu,
// experts_warp.cu, experts_tc.cu and decode_fused.cu, in that order. This file: the router's
// top-k (`router_topk`) and the grouping of (row, slot) pairs by expert (`moe_group`).

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
// POLL (moe_decode_fused[_tc]): the logits are read until none holds MK_UNSET (the launch's other blocks
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
// MAXPER: E <= 32 MAXPER (moe_decode_fused takes 8, so its registers hold no 32-expert form).
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
