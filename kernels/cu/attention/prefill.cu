// Attention: the flash prefill on tensor cores (`attention_prefill_flash[_qsmem][_fp8]`).

// Prefill attention on tensor cores (flash-attention style, BF16 mma.sync, f32 softmax state).
// One block (4 warps, 16 query rows each) per (query tile, head); a tile is up to 64 consecutive
// rows of one sequence at consecutive positions (tiles[2i] = first row, tiles[2i+1] = rows), so K/V
// blocks of 64 keys are read once per tile instead of once per row. Keys are masked per row
// (causal, sliding window); the sink starts the softmax state; the output gate is applied last.
// Any even hd <= 128. Q and P are split into BF16 hi + lo (two mma each) so the
// result stays within f32-kernel error (K/V are BF16 or FP8 in the cache): with P rounded to BF16
// alone (FlashAttention's choice) the fixtures' near-tied router picks flip (nvfp4-experts, FP8
// K/V: 0.15 relative). K and V fragments come from shared memory by ldmatrix (.trans for V), in
// the same mma order as element-wise fragment loads (bit-identical results).
// hd % 16 != 0: K/V rows (not 16-byte aligned where hd % 8 != 0) are staged by pairs of elements,
// with zeros up to the next multiple of 16, and Q's dims past hd are zero, so the last k-step
// adds exact zeros; output dims past hd are not stored. Aligned head dims run the same loads and
// arithmetic as before.
#define FA_HD 128
#define FA_LD (FA_HD + 8)
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
// Softmax exponentials as 2^(log2(e) s - m) with log2(e) folded into the score scale and the
// state kept in base-2 units (FlashAttention's and vLLM's form: one multiply and ex2.approx per
// score instead of expf's ~8 instructions).
// QS: the Q fragments (hi, lo) wait in dynamic shared memory (FA_QS_SMEM bytes: [64][FA_LD] hi
// then lo; each warp its own 16 rows) and come back by ldmatrix per k-step instead of holding 64
// registers, so 3 blocks fit an SM (168 registers); the same values in the same mma order.
#define FA_QS_SMEM (2 * 64 * FA_LD * 2)
template <typename KV, int QS = 0>
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
            bool qlo = d0 < hd, qhi = d0 + 8 < hd;  // always, where hd % 16 == 0
            float2 x0 = va && qlo ? make_float2(qa[d0], qa[d0 + 1]) : make_float2(0.f, 0.f);
            float2 x1 = vb && qlo ? make_float2(qb[d0], qb[d0 + 1]) : make_float2(0.f, 0.f);
            float2 x2 = va && qhi ? make_float2(qa[d0 + 8], qa[d0 + 9]) : make_float2(0.f, 0.f);
            float2 x3 = vb && qhi ? make_float2(qb[d0 + 8], qb[d0 + 9]) : make_float2(0.f, 0.f);
            qf[kk][0] = fa_pack(x0.x, x0.y);
            qf[kk][1] = fa_pack(x1.x, x1.y);
            qf[kk][2] = fa_pack(x2.x, x2.y);
            qf[kk][3] = fa_pack(x3.x, x3.y);
            ql[kk][0] = fa_pack(x0.x - bflo(qf[kk][0]), x0.y - bfhi(qf[kk][0]));
            ql[kk][1] = fa_pack(x1.x - bflo(qf[kk][1]), x1.y - bfhi(qf[kk][1]));
            ql[kk][2] = fa_pack(x2.x - bflo(qf[kk][2]), x2.y - bfhi(qf[kk][2]));
            ql[kk][3] = fa_pack(x3.x - bflo(qf[kk][3]), x3.y - bfhi(qf[kk][3]));
            if constexpr (QS) {
                // A-fragment element (row, dims d0, d0 + 1) and (row, d0 + 8, d0 + 9) as stored pairs.
                u32* ha = reinterpret_cast<u32*>(fa_q + ra * FA_LD + d0);
                u32* hb = reinterpret_cast<u32*>(fa_q + rb * FA_LD + d0);
                ha[0] = qf[kk][0];
                hb[0] = qf[kk][1];
                ha[4] = qf[kk][2];
                hb[4] = qf[kk][3];
                u32* la_ = reinterpret_cast<u32*>(fa_q + (64 + ra) * FA_LD + d0);
                u32* lb_ = reinterpret_cast<u32*>(fa_q + (64 + rb) * FA_LD + d0);
                la_[0] = ql[kk][0];
                lb_[0] = ql[kk][1];
                la_[4] = ql[kk][2];
                lb_[4] = ql[kk][3];
            }
        }
    }
    if constexpr (QS) __syncwarp();
    float o[FA_HD / 8][4];
#pragma unroll
    for (int i = 0; i < FA_HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const float L2E = 1.4426950408889634f;
    scale *= L2E;
    float ma = sink ? sink[h] * L2E : -INFINITY, mb = ma;
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
        if (hd & 15) {
            // Pairs of elements (hd is even), the pairs past hd zero up to the k-steps' end.
            const int np = ((hd + 15) & ~15) >> 1;
            for (int i = tid; i < 64 * np; i += 128) {
                int key = i / np, d = 2 * (i - key * np);
                unsigned ko = koff[key];
                u32 kw = 0u, vw = 0u;
                if (ko != 0xffffffffu && d < hd) {
                    bool st = (ko & 0x80000000u) != 0u;
                    size_t eo = (size_t)(ko & 0x7fffffffu) + d;
                    const KV* kp = (st ? ks : kc) + eo;
                    const KV* vp = (st ? vs : vc) + eo;
                    kw = (u32)Kv<KV>::to_bf16(kp[0]) | ((u32)Kv<KV>::to_bf16(kp[1]) << 16);
                    vw = (u32)Kv<KV>::to_bf16(vp[0]) | ((u32)Kv<KV>::to_bf16(vp[1]) << 16);
                }
                *reinterpret_cast<u32*>(&Ks[key * FA_LD + d]) = kw;
                *reinterpret_cast<u32*>(&Vs[key * FA_LD + d]) = vw;
            }
        } else if constexpr (sizeof(KV) == 2) {
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
                    ldsm_x4(a0, a1, a2, a3, qp + 64 * FA_LD);
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], a0, a1, a2, a3, kb_[ni][0], kb_[ni][1]);
                } else {
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kb_[ni][0], kb_[ni][1]);
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) fa_mma(s[ni], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], kb_[ni][0], kb_[ni][1]);
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
        float ca = ex2_approx(ma - sa_), cb = ex2_approx(mb - sb_);
        ma = nma;
        mb = nmb;
        float suma = 0.f, sumb = 0.f;
#pragma unroll
        for (int ni = 0; ni < 8; ni++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[ni][e] - (e < 2 ? sa_ : sb_);
                s[ni][e] = ex2_approx(x);
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
            u32 l0 = fa_pack(s[2 * j][0] - bflo(a0), s[2 * j][1] - bfhi(a0));
            u32 l1 = fa_pack(s[2 * j][2] - bflo(a1), s[2 * j][3] - bfhi(a1));
            u32 l2 = fa_pack(s[2 * j + 1][0] - bflo(a2), s[2 * j + 1][1] - bfhi(a2));
            u32 l3 = fa_pack(s[2 * j + 1][2] - bflo(a3), s[2 * j + 1][3] - bfhi(a3));
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
#pragma unroll
                    for (int u = 0; u < 8; u++) fa_mma(o[2 * dq + u], l0, l1, l2, l3, vb_[u][0], vb_[u][1]);
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
        if (dn * 8 + 2 * t4 < hd) {
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
extern "C" __global__ __launch_bounds__(128) void attention_prefill_flash(ATT_PARAMS(bf16_t), const int* tiles, const bf16_t* ks,
                                                                      const bf16_t* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<bf16_t>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
extern "C" __global__ __launch_bounds__(128) void attention_prefill_flash_fp8(ATT_PARAMS(u8), const int* tiles, const u8* ks,
                                                                          const u8* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<u8>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
// _qsmem: Q in shared memory at 3 blocks / SM (QS above; dynamic shared memory FA_QS_SMEM).
extern "C" __global__ __launch_bounds__(128, 3) void attention_prefill_flash_qsmem(ATT_PARAMS(bf16_t), const int* tiles, const bf16_t* ks,
                                                                         const bf16_t* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<bf16_t, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
extern "C" __global__ __launch_bounds__(128, 3) void attention_prefill_flash_qsmem_fp8(ATT_PARAMS(u8), const int* tiles, const u8* ks,
                                                                             const u8* vs, const int* sfirst, bf16_t* xs, int M) { PDL_ENTRY();
    attention_prefill_t<u8, 1>(ATT_ARGS, tiles, ks, vs, sfirst, xs, M);
}
