// Attention: the split-KV decode on tensor cores (`attention_decode_tc[_qk[_3stage]][_fp8]`) and its
// merges (`attention_decode_tc_merge16/64`: merge.cu's with the tensor-core split count).

// ---- attention_decode_tc: the split-KV decode attention on tensor cores ----------------------------
// The weight-streaming regime's decode attention (decode steps, DFlash propose / verify) for GQA
// groups of G <= 16 query heads, hd % 16 == 0, hd <= 128. One block of 4 warps per (row, KV
// head, split); a row's splits follow tc_splits (at least 64 keys each, 16 splits for a 2K row,
// more past 8K keys), fewer and longer than attention_decode_gqa's 32-key ones, and each 16 keys cost
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
// head) written for attention_decode_tc_merge16 / 64, or with nsplit == 1 the output (sink, V scale,
// gate). A row's arithmetic depends only on its own keys and length, never on the pass, so a
// DFlash verify row is bit-identical to the same row decoded alone. K and V come from the cache
// for every key (the row's own key included): the q/k norm + K/V write runs before it.
// QK (attention_decode_tc_qk[_fp8], _qk_3stage; for passes whose rows are each alone in their
// sequence): the q/k norm + RoPE + K/V write of qk_norm_rope_kv_t inside the launch, as
// attention_decode_gqa_qk does for attention_decode_gqa: every block norms and rotates its G query heads (the
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
template <typename KV, bool QK = false, int NST = TC_NST>
__device__ __forceinline__ void attention_tc_t(ATT_PARAMS(KV), int nsplit, float* part, const int* kend, const float* k = nullptr,
                                               const float* v = nullptr, int ldkv = 0, const float* qn_w = nullptr,
                                               const float* kn_w = nullptr, const float* inv_freq = nullptr, int half = 0,
                                               float attn_factor = 1.f, float eps = 0.f, float kinv = 1.f, float vinv = 1.f) {
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
    if (z >= ns) return;
    STAMP();  // (LAGUNA_STAMP builds: the timeline's record of this block, its wait time set below)
    int chunk = (len + ns - 1) / ns;
    int k0 = lo + z * chunk, k1 = min(last + 1, k0 + chunk);
    int nsteps = k1 > k0 ? (k1 - k0 + 15) >> 4 : 0;
    int mine = nsteps > w ? (nsteps - w + 3) >> 2 : 0;  // this warp's steps: w, w + 4, ...
    const int* btr = bt + (size_t)seqrow[m] * max_pages;
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
    // Stage j's copies.
    auto stage = [&](int j, int st, bool after) {
        size_t off = stage_off(j);
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
        // q rows of the group (written by qk_norm_rope_store*), rows past G zero: coalesced pairs.
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
#pragma unroll
    for (int i = 0; i < NST; i++)
        if (i < mine) stage(w + 4 * i, i, false);
        else cp_async_commit();
    // QK: the norms' items: 0..G-1 the query heads, item G the new key (writer block only); item
    // w + 4 u to warp w.
    float nwv[5][4];
    int kpage = 0;
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
                nwv[u][jj] = in ? nw[dd] : 0.f;
            }
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            int dd = lane + 32 * jj;
            vv[jj] = writer && w == G % 4 && dd < hd ? v[(size_t)m * ldkv + (size_t)kvh * hd + dd] : 0.f;
        }
        kpage = writer ? btr[(p / page_size) % max_pages] : 0;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float ang = (float)p * inv_freq[i];
            rc[i] = cosf(ang) * attn_factor;
            rs[i] = sinf(ang) * attn_factor;
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
// The decode step's one-wave grids: three K/V steps a warp in flight (NST above).
extern "C" __global__ __launch_bounds__(128) void attention_decode_tc_qk_3stage(GQK_PARAMS(bf16_t)) { attention_tc_t<bf16_t, true, 3>(TC_QK_ARGS); }
extern "C" __global__ void attention_decode_tc_merge16(MERGE_PARAMS) { attention_merge_t<16, TC_CHUNK>(MERGE_ARGS); }
extern "C" __global__ void attention_decode_tc_merge64(MERGE_PARAMS) { attention_merge_t<64, TC_CHUNK>(MERGE_ARGS); }
