// Batch invariance of the weight-streaming kernels, in the CPU emulation (cuda_emu.h): what makes
// a DFlash verify pass (k + 1 rows) give the same bits as decoding each row alone, so greedy
// output with the draft is token-identical to greedy output without it. For random inputs:
//   * linear_{bf16,fp4}_m8 over 7 rows = linear_{bf16,fp4}_1 on each row alone;
//   * passes of several row tiles (29 rows: linear_*_m16, linear_tc_bf16[_tiled]) = each row alone;
//   * moe_{gate_up,down}_fp4_warp over 7 rows (57-ish experts, grouped, an expert shared by
//     several rows read once) = the same kernels on each row alone (direct grouping);
//   * moe_*_fp4_warp = moe_*_fp4_grouped on the same 7 rows;
//   * linear_tc_bf16 (4, 5 and 16 warps a block) over 7 rows = each row alone (and =
//     linear_tc_bf16_tiled and _tiled_row on tile_bf16's tile-interleaved copy);
//   * gate | up as one GEMV over the stacked matrix = the two launches;
//   * linear_tc_bf16_tiled_row_silu = silu_mul + linear_tc_bf16_tiled_row;
//   * linear_tc_bf16_tiled_argmax + argmax_fin (lm_head with the argmax folded in) = _tiled +
//     argmax_rows_split;
// each bit for bit; and the tensor-core GEMV and the prefill GEMMs (gemm_bf16, gemm_fp4: ldmatrix,
// cp.async, NVFP4 decode) against float64 within 1e-4 of the largest output. Built and run by
// kernels/emu/run.sh; exit status 0 = pass.
#include "cuda_emu.h"


#include "kernels.inc"

#include "emu_test.h"

#include <map>
#include <string>

// Grouping of M rows x KK slots by expert, as moe_group / router_topk's direct form describe it:
// groups in expert order, perm = slots of each group.
struct Groups {
    int *ge, *gs, *gc, *perm, *meta;
};
static Groups group(const std::vector<int>& ids) {
    std::map<int, std::vector<int>> by;
    for (size_t s = 0; s < ids.size(); s++) by[ids[s]].push_back((int)s);
    Groups g{emu_alloc<int>(ids.size()), emu_alloc<int>(ids.size()), emu_alloc<int>(ids.size()), emu_alloc<int>(ids.size()),
             emu_alloc<int>(4)};
    int gi = 0, at = 0;
    for (auto& [e, ss] : by) {
        g.ge[gi] = e;
        g.gs[gi] = at;
        g.gc[gi] = (int)ss.size();
        for (int s : ss) g.perm[at++] = s;
        gi++;
    }
    g.meta[0] = gi;
    return g;
}

int main() {
    emu_init(size_t(512) << 20);
    std::mt19937 rng(77);
    std::normal_distribution<float> nd(0.f, 1.f);
    bool ok = true;
    const int M = 7;

    // ---- dense Linears: N rows of K inputs ----
    {
        const int N = 96, K = 512;
        float* x = emu_alloc<float>((size_t)M * K);
        for (int i = 0; i < M * K; i++) x[i] = nd(rng);
        unsigned short* wb = emu_alloc<unsigned short>((size_t)N * K);
        for (int i = 0; i < N * K; i++) wb[i] = f2bf(0.05f * nd(rng));
        Fp4Stack wf = make_fp4_stack(rng, 1, N, K);
        for (int fmt = 0; fmt < 2; fmt++) {
            const void* w = fmt ? (const void*)wf.w : (const void*)wb;
            const unsigned char* s = fmt ? wf.s : nullptr;
            float inv = fmt ? wf.inv[0] : 1.f;
            float* ym = emu_alloc<float>((size_t)M * N);
            float* y1 = emu_alloc<float>((size_t)M * N);
            ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 256, [&] {
                if (fmt) linear_fp4_m8(w, s, inv, x, K, ym, N, M, N, K, 0);
                else linear_bf16_m8(w, s, inv, x, K, ym, N, M, N, K, 0);
            });
            for (int r = 0; r < M; r++)
                ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 256, [&] {
                    if (fmt) linear_fp4_1(w, s, inv, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0);
                    else linear_bf16_1(w, s, inv, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0);
                });
            bool eq = same_bits(fmt ? "linear_fp4_m8 vs _1" : "linear_bf16_m8 vs _1", ym, y1, (size_t)M * N);
            std::printf("linear_%s_m8 over %d rows = linear_%s_1 on each row: %s\n", fmt ? "fp4" : "bf16", M, fmt ? "fp4" : "bf16",
                        eq ? "yes" : "NO");
            ok &= eq;
        }
    }

    // ---- passes of several row tiles (batched decode, a verify at k >= 8 or of several sequences) ----
    // The GEMVs' one-dimensional grids (a weight tile's row tiles neighbours): linear_{bf16,fp4}_m16
    // over 29 rows (2 row tiles) = _1 on each row; linear_tc_bf16 and _tiled over 29 rows (4 row
    // tiles of 8) = each row alone.
    {
        const int N = 40, K = 256, MT = 29;
        float* x = emu_alloc<float>((size_t)MT * K);
        for (int i = 0; i < MT * K; i++) x[i] = nd(rng);
        unsigned short* wb = emu_alloc<unsigned short>((size_t)N * K);
        for (int i = 0; i < N * K; i++) wb[i] = f2bf(0.05f * nd(rng));
        Fp4Stack wf = make_fp4_stack(rng, 1, N, K);
        const unsigned n16 = (unsigned)ceil_div(N, 16);
        bool eq = true;
        for (int fmt = 0; fmt < 2; fmt++) {
            const void* w = fmt ? (const void*)wf.w : (const void*)wb;
            const unsigned char* s = fmt ? wf.s : nullptr;
            float inv = fmt ? wf.inv[0] : 1.f;
            float* ym = emu_alloc<float>((size_t)MT * N);
            float* y1 = emu_alloc<float>((size_t)MT * N);
            ok &= emu_launch({n16 * (unsigned)ceil_div(MT, 16), 1, 1}, 256, [&] {
                if (fmt) linear_fp4_m16(w, s, inv, x, K, ym, N, MT, N, K, 0);
                else linear_bf16_m16(w, s, inv, x, K, ym, N, MT, N, K, 0);
            });
            for (int r = 0; r < MT; r++)
                ok &= emu_launch({n16, 1, 1}, 256, [&] {
                    if (fmt) linear_fp4_1(w, s, inv, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0);
                    else linear_bf16_1(w, s, inv, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0);
                });
            eq &= same_bits(fmt ? "linear_fp4_m16 (2 row tiles) vs _1" : "linear_bf16_m16 (2 row tiles) vs _1", ym, y1,
                            (size_t)MT * N);
        }
        unsigned short* wt = emu_alloc<unsigned short>((size_t)n16 * 16 * K);
        ok &= emu_launch({n16, (unsigned)(K / 32), 1}, 32, [&] { tile_bf16(wb, wt, N, K); });
        for (int S : {4, 16})
            for (int tl = 0; tl < 2; tl++) {
                auto gemv = [&](const float* xa, float* y, int rows) {
                    return emu_launch({n16 * (unsigned)ceil_div(rows, 8), 1, 1}, 32 * S, [&] {
                        if (tl) linear_tc_bf16_tiled(wt, nullptr, 1.f, xa, K, y, N, rows, N, K, 0);
                        else linear_tc_bf16(wb, nullptr, 1.f, xa, K, y, N, rows, N, K, 0);
                    });
                };
                float* ym = emu_alloc<float>((size_t)MT * N);
                float* y1 = emu_alloc<float>((size_t)MT * N);
                ok &= gemv(x, ym, MT);
                for (int r = 0; r < MT; r++) ok &= gemv(x + (size_t)r * K, y1 + (size_t)r * N, 1);
                eq &= same_bits(tl ? "linear_tc_bf16_tiled (4 row tiles) vs 1 row" : "linear_tc_bf16 (4 row tiles) vs 1 row", ym, y1,
                                (size_t)MT * N);
            }
        std::printf("%d rows in one grid of row tiles (linear_{bf16,fp4}_m16, linear_tc_bf16[_tiled] at 4 and 16 warps) = each "
                    "row alone: %s\n",
                    MT, eq ? "yes" : "NO");
        ok &= eq;
    }

    // ---- tensor-core GEMV (decode / verify BF16 Linears) and the prefill GEMMs ----
    {
        const int N = 72, K = 512, MG = 100;
        float* x = emu_alloc<float>((size_t)MG * K);
        for (int i = 0; i < MG * K; i++) x[i] = nd(rng);
        unsigned short* wb = emu_alloc<unsigned short>((size_t)N * K);
        for (int i = 0; i < N * K; i++) wb[i] = f2bf(0.05f * nd(rng));
        Fp4Stack wf = make_fp4_stack(rng, 1, N, K);
        auto wval = [&](int fmt, int n, int k) -> double { return fmt ? wf.at(0, n, k) : bf2f(wb[(size_t)n * K + k]); };
        // Worst |y - float64| over the rows, relative to the largest |y|.
        auto ref_err = [&](int fmt, const float* y, int rows) {
            double err = 0, mag = 0;
            for (int r = 0; r < rows; r++)
                for (int n = 0; n < N; n++) {
                    double a = 0;
                    for (int k = 0; k < K; k++) a += wval(fmt, n, k) * x[(size_t)r * K + k];
                    err = std::max(err, std::fabs(a - y[(size_t)r * N + n]));
                    mag = std::max(mag, std::fabs(a));
                }
            return err / mag;
        };
        // (5 warps: K's 16 tiles fall unevenly on the warps; 16: slots 1-3 of every warp past K.)
        for (int S : {4, 5, 16}) {
            float* ym = emu_alloc<float>((size_t)M * N);
            float* y1 = emu_alloc<float>((size_t)M * N);
            ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 32 * S,
                             [&] { linear_tc_bf16(wb, nullptr, 1.f, x, K, ym, N, M, N, K, 0); });
            for (int r = 0; r < M; r++)
                ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 32 * S,
                                 [&] { linear_tc_bf16(wb, nullptr, 1.f, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0); });
            bool eq = same_bits("linear_tc_bf16 7 rows vs 1", ym, y1, (size_t)M * N);
            {
                // linear_tc_bf16_tiled on tile_bf16's copy: the same bits, 7 rows, storing and
                // accumulating.
                unsigned short* wt = emu_alloc<unsigned short>((size_t)ceil_div(N, 16) * 16 * K);
                ok &= emu_launch({(unsigned)ceil_div(N, 16), (unsigned)(K / 32), 1}, 32,
                                 [&] { tile_bf16(wb, wt, N, K); });
                float* yb = emu_alloc<float>((size_t)M * N);
                ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 32 * S,
                                 [&] { linear_tc_bf16_tiled(wt, nullptr, 1.f, x, K, yb, N, M, N, K, 0); });
                bool et = same_bits("linear_tc_bf16_tiled vs linear_tc_bf16", yb, ym, (size_t)M * N);
                float* ya = emu_alloc<float>((size_t)M * N);
                float* yc = emu_alloc<float>((size_t)M * N);
                for (int i = 0; i < M * N; i++) ya[i] = yc[i] = nd(rng);
                ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 32 * S,
                                 [&] { linear_tc_bf16(wb, nullptr, 1.f, x, K, ya, N, M, N, K, 1); });
                ok &= emu_launch({(unsigned)ceil_div(N, 16), 1, 1}, 32 * S,
                                 [&] { linear_tc_bf16_tiled(wt, nullptr, 1.f, x, K, yc, N, M, N, K, 1); });
                et &= same_bits("linear_tc_bf16_tiled vs linear_tc_bf16, accumulating", yc, ya, (size_t)M * N);
                std::printf("linear_tc_bf16_tiled (storing and accumulating) on tile_bf16's copy (%d warps a block) = linear_tc_bf16: %s\n", S,
                            et ? "yes" : "NO");
                eq &= et;
            }
            double e = ref_err(0, ym, M);
            std::printf("linear_tc_bf16 (%d warps a block) over %d rows = each row alone: %s; vs float64 %.1e %s\n", S, M,
                        eq ? "yes" : "NO", e, e < 1e-4 ? "ok" : "TOO LARGE");
            ok &= eq && e < 1e-4;
        }
        // Random BF16 weights [ND, KD] (wd) and tile_bf16's copy of them (wdt).
        const int ND = 40;
        auto tiled = [&](int KD, unsigned short*& wd, unsigned short*& wdt) {
            wd = emu_alloc<unsigned short>((size_t)ND * KD);
            for (int i = 0; i < ND * KD; i++) wd[i] = f2bf(0.05f * nd(rng));
            wdt = emu_alloc<unsigned short>((size_t)ceil_div(ND, 16) * 16 * KD);
            ok &= emu_launch({(unsigned)ceil_div(ND, 16), (unsigned)(KD / 32), 1}, 32, [&] { tile_bf16(wd, wdt, ND, KD); });
        };
        const EmuDim grid{(unsigned)ceil_div(ND, 16), 1, 1};
        // One row through `kern` at S warps a block and K = KD on tile_bf16's copy: the same bits
        // as linear_tc_bf16 storing and as linear_tc_bf16_tiled accumulating.
        auto one_row = [&](const char* name, auto kern, int S, int KD) {
            float* xd = emu_alloc<float>((size_t)KD);
            for (int i = 0; i < KD; i++) xd[i] = nd(rng);
            unsigned short *wd, *wdt;
            tiled(KD, wd, wdt);
            float* y0 = emu_alloc<float>(ND);
            float* y1 = emu_alloc<float>(ND);
            ok &= emu_launch(grid, 32 * S, [&] { linear_tc_bf16(wd, nullptr, 1.f, xd, KD, y0, ND, 1, ND, KD, 0); });
            ok &= emu_launch(grid, 32 * S, [&] { kern(wdt, nullptr, 1.f, xd, KD, y1, ND, 1, ND, KD, 0); });
            bool ed = same_bits((std::string(name) + " vs linear_tc_bf16").c_str(), y1, y0, ND);
            float* ya = emu_alloc<float>(ND);
            float* yc = emu_alloc<float>(ND);
            for (int i = 0; i < ND; i++) ya[i] = yc[i] = nd(rng);
            ok &= emu_launch(grid, 32 * S, [&] { linear_tc_bf16_tiled(wdt, nullptr, 1.f, xd, KD, ya, ND, 1, ND, KD, 1); });
            ok &= emu_launch(grid, 32 * S, [&] { kern(wdt, nullptr, 1.f, xd, KD, yc, ND, 1, ND, KD, 1); });
            ed &= same_bits((std::string(name) + " vs linear_tc_bf16_tiled, accumulating").c_str(), yc, ya, ND);
            std::printf("%s (%d warps, K %d, storing and accumulating) = linear_tc_bf16 / linear_tc_bf16_tiled: %s\n", name, S, KD,
                        ed ? "yes" : "NO");
            ok &= ed;
        };
        // linear_tc_bf16_tiled_row (one row, 16 warps a block, two rounds of weight
        // loads in flight a warp, the row staged in shared memory), at the K of the XS-2.1 o_proj
        // (8192: two loop turns of two rounds), the 48-head o_proj (6144: three rounds, the last
        // turn's second round absent) and 4096 + 32 x 5 (a round partly past K).
        for (int KD : {8192, 6144, 4256}) one_row("linear_tc_bf16_tiled_row", linear_tc_bf16_tiled_row, 16, KD);
        // linear_tc_bf16_tiled_row_silu (linear_tc_bf16_tiled_row staging SiLU(gate) * up from a gate | up
        // row) against silu_mul + linear_tc_bf16_tiled_row, at the XS-2.1 dense MLP's K (8192) and 4256.
        for (int KD : {8192, 4256}) {
            float* gu = emu_alloc<float>((size_t)2 * KD);
            for (int i = 0; i < 2 * KD; i++) gu[i] = 2.f * nd(rng);
            float* act = emu_alloc<float>((size_t)KD);
            ok &= emu_launch({(unsigned)ceil_div(KD, 256), 1, 1}, 256, [&] { silu_mul(gu, act, 1, KD); });
            unsigned short *wd, *wdt;
            tiled(KD, wd, wdt);
            float* y0 = emu_alloc<float>(ND);
            float* y1 = emu_alloc<float>(ND);
            for (int i = 0; i < ND; i++) y0[i] = y1[i] = nd(rng);
            ok &= emu_launch(grid, 512, [&] { linear_tc_bf16_tiled_row(wdt, nullptr, 1.f, act, KD, y0, ND, 1, ND, KD, 1); });
            ok &= emu_launch(grid, 512, [&] { linear_tc_bf16_tiled_row_silu(wdt, nullptr, 1.f, gu, 2 * KD, y1, ND, 1, ND, KD, 1); });
            bool es = same_bits("linear_tc_bf16_tiled_row_silu vs silu_mul + linear_tc_bf16_tiled_row", y1, y0, ND);
            std::printf("linear_tc_bf16_tiled_row_silu (K %d, accumulating) = silu_mul + linear_tc_bf16_tiled_row: %s\n", KD, es ? "yes" : "NO");
            ok &= es;
        }
        // a dense MLP's gate and up stacked by rows (2 x 32 rows, K 512) and
        // run as one launch of 2 x 32 outputs with the gate launch's warps a block, against the
        // two launches on each half writing the same [M, 64] rows (ldy 64, up at column 32): the
        // same bits, 1 and 7 rows, on tile_bf16's copy of the stack (linear_tc_bf16_tiled; its second half is
        // tile_bf16's copy of up alone, byte for byte: the loader's view) and row-major
        // (linear_tc_bf16: the DFlash draft's Linears, which have no tiled copy).
        {
            const int IG = 32, KG = 512, NG = 2 * IG;
            unsigned short* wg = emu_alloc<unsigned short>((size_t)NG * KG);
            for (int i = 0; i < NG * KG; i++) wg[i] = f2bf(0.05f * nd(rng));
            unsigned short* wgt = emu_alloc<unsigned short>((size_t)NG * KG);
            ok &= emu_launch({(unsigned)(NG / 16), (unsigned)(KG / 32), 1}, 32, [&] { tile_bf16(wg, wgt, NG, KG); });
            unsigned short* wut = emu_alloc<unsigned short>((size_t)IG * KG);
            ok &= emu_launch({(unsigned)(IG / 16), (unsigned)(KG / 32), 1}, 32,
                             [&] { tile_bf16(wg + (size_t)IG * KG, wut, IG, KG); });
            bool eg = std::memcmp(wut, wgt + (size_t)IG * KG, (size_t)IG * KG * 2) == 0;
            if (!eg) std::printf("gu_fuse: tile_bf16 of the stack's second half != tile_bf16 of up alone\n");
            float* xg = emu_alloc<float>((size_t)M * KG);
            for (int i = 0; i < M * KG; i++) xg[i] = nd(rng);
            for (int S : {4, 5, 16})
                for (int rows : {1, M})
                    for (int tl = 0; tl < 2; tl++) {
                        auto gemv = [&](const unsigned short* w, float* y, int n) {
                            unsigned gy = (unsigned)ceil_div(rows, 8);
                            return emu_launch({(unsigned)ceil_div(n, 16), gy, 1}, 32 * S, [&] {
                                if (tl) linear_tc_bf16_tiled(w, nullptr, 1.f, xg, KG, y, NG, rows, n, KG, 0);
                                else linear_tc_bf16(w, nullptr, 1.f, xg, KG, y, NG, rows, n, KG, 0);
                            });
                        };
                        const unsigned short* w = tl ? wgt : wg;
                        float* y2 = emu_alloc<float>((size_t)rows * NG);
                        float* y1 = emu_alloc<float>((size_t)rows * NG);
                        ok &= gemv(w, y2, IG);
                        ok &= gemv(w + (size_t)IG * KG, y2 + IG, IG);
                        ok &= gemv(w, y1, NG);
                        eg &= same_bits("gu_fuse: one launch vs gate + up", y1, y2, (size_t)rows * NG);
                    }
            std::printf("gate | up as one GEMV (linear_tc_bf16 and linear_tc_bf16_tiled, 4 / 5 / 16 warps, 1 and %d rows) = gate + up: %s\n", M,
                        eg ? "yes" : "NO");
            ok &= eg;
        }
        // Prefill GEMMs (64 x 64 tiles, ldmatrix, cp.async double buffering, NVFP4 decoded by byte
        // permutes) on activations split into BF16 hi + lo, against float64.
        unsigned short* xs2 = emu_alloc<unsigned short>((size_t)2 * MG * K);
        ok &= emu_launch({(unsigned)ceil_div(K, 256), (unsigned)MG, 1}, 256, [&] { split_bf16(x, K, MG, K, xs2, 1); });
        for (int fmt = 0; fmt < 2; fmt++) {
            float* y = emu_alloc<float>((size_t)MG * N);
            ok &= emu_launch({(unsigned)ceil_div(N, 64), (unsigned)ceil_div(MG, 64), 1}, 128, [&] {
                if (fmt) gemm_fp4(wf.w, wf.s, wf.inv[0], xs2, K, y, N, MG, N, K, 0);
                else gemm_bf16(wb, nullptr, 1.f, xs2, K, y, N, MG, N, K, 0);
            });
            double e = ref_err(fmt, y, MG);
            std::printf("gemm_%s (%d rows, hi + lo activations) vs float64: %.1e %s\n", fmt ? "fp4" : "bf16", MG, e,
                        e < 1e-4 ? "ok" : "TOO LARGE");
            ok &= e < 1e-4;
        }
    }

    // ---- linear_tc_bf16_tiled_argmax: the lm_head GEMV folding its outputs into
    // the rows' argmax slots, then argmax_fin, against linear_tc_bf16_tiled + argmax_rows_split and argmax_rows over
    // the stored logits: the same logits, the same tokens. N = 1000 (the last block's rows past
    // N), rows: 0 plain; 1 with three equal maxima, two in one block and one in another (W rows
    // 70, 71 and 900 the same: the lowest index wins); 2 with a NaN input (every logit NaN: no
    // winner, 0x7fffffff); 3 all zero (+-0 logits: index 0); 4 with the winner in the last,
    // partial block.
    {
        const int N = 1000, K = 256, MR = 5, S = 4;
        unsigned short* wl = emu_alloc<unsigned short>((size_t)N * K);
        for (int i = 0; i < N * K; i++) wl[i] = f2bf(0.05f * nd(rng));
        float* xl = emu_alloc<float>((size_t)MR * K);
        for (int i = 0; i < MR * K; i++) xl[i] = nd(rng);
        // Row 1's winners: W rows 70, 71 and 900 the same, 30 x x[1] (so their logit is the
        // largest by far); row 4's: W row 995 = 30 x x[4].
        for (int k = 0; k < K; k++) {
            unsigned short v = f2bf(30.f * xl[K + k]);
            wl[(size_t)70 * K + k] = wl[(size_t)71 * K + k] = wl[(size_t)900 * K + k] = v;
            wl[(size_t)995 * K + k] = f2bf(30.f * xl[4 * K + k]);
        }
        xl[2 * K + 17] = NAN;
        for (int k = 0; k < K; k++) xl[3 * K + k] = 0.f;
        unsigned short* wlt = emu_alloc<unsigned short>((size_t)ceil_div(N, 16) * 16 * K);
        ok &= emu_launch({(unsigned)ceil_div(N, 16), (unsigned)(K / 32), 1}, 32, [&] { tile_bf16(wl, wlt, N, K); });
        float* y0 = emu_alloc<float>((size_t)MR * N);
        float* y1 = emu_alloc<float>((size_t)MR * N);
        unsigned long long* slot = emu_alloc<unsigned long long>(MR);
        unsigned long long* slot0 = emu_alloc<unsigned long long>(MR);
        unsigned* cnt = emu_alloc<unsigned>(MR);
        int *t0 = emu_alloc<int>(MR), *t1 = emu_alloc<int>(MR), *t2 = emu_alloc<int>(MR);
        const EmuDim lg{(unsigned)ceil_div(N, 16), 1, 1};
        ok &= emu_launch(lg, 32 * S, [&] { linear_tc_bf16_tiled(wlt, nullptr, 1.f, xl, K, y0, N, MR, N, K, 0); });
        ok &= emu_launch(lg, 32 * S, [&] { linear_tc_bf16_tiled_argmax(wlt, nullptr, 1.f, xl, K, y1, N, MR, N, K, 0, slot); });
        ok &= emu_launch({1, 1, 1}, 32, [&] { argmax_fin(slot, MR, t1); });
        ok &= emu_launch({(unsigned)MR, 4, 1}, 256, [&] { argmax_rows_split(y0, N, t0, slot0, cnt); });
        ok &= emu_launch({(unsigned)MR, 1, 1}, 1024, [&] { argmax_rows(y0, N, t2); });
        bool el = same_bits("linear_tc_bf16_tiled_argmax vs linear_tc_bf16_tiled logits", y1, y0, (size_t)MR * N);
        bool et = true;
        for (int r = 0; r < MR; r++) {
            std::printf("  row %d: argmax_fin %d, argmax_rows_split %d, argmax_rows %d\n", r, t1[r], t0[r], t2[r]);
            et &= t1[r] == t0[r] && t1[r] == t2[r] && slot[r] == 0ull && slot0[r] == 0ull && cnt[r] == 0u;
        }
        // The cases meant what they say: the ties, the NaN row, the zero row, the last block.
        et &= t2[1] == 70 && t2[2] == 0x7fffffff && t2[3] == 0 && t2[4] == 995;
        std::printf("linear_tc_bf16_tiled_argmax + argmax_fin (%d rows, N %d) = linear_tc_bf16_tiled + argmax_rows_split / argmax_rows: logits %s, tokens %s\n",
                    MR, N, el ? "yes" : "NO", et ? "yes" : "NO");
        ok &= el && et;
    }

    // ---- experts: E routed + 1 shared, KK = K + 1 slots a row ----
    {
        const int H = 256, I = 64, E = 64, K = 8, KK = K + 1, NE = E + 1;
        Fp4Stack gate = make_fp4_stack(rng, NE, I, H), up = make_fp4_stack(rng, NE, I, H), down = make_fp4_stack(rng, NE, H, I);
        float* x = emu_alloc<float>((size_t)M * H);
        for (int i = 0; i < M * H; i++) x[i] = nd(rng);
        // Rows pick 8 distinct experts each, some shared between rows; slot K is the shared expert.
        std::vector<int> ids(M * KK);
        for (int r = 0; r < M; r++) {
            for (int k = 0; k < K; k++) ids[r * KK + k] = (8 * k + 37 * r) % E;
            ids[r * KK + K] = E;
        }
        Groups all = group(ids);
        auto run = [&](bool sp, const Groups& g, const float* xr, int rows, float* act, float* out) {
            int s = rows * KK, groups = std::min(s, NE);
            if (sp) {
                ok &= emu_launch({(unsigned)ceil_div(groups * I / 2, 4), 1, 1}, 128, [&] {
                    moe_gate_up_fp4_warp(gate.w, gate.s, gate.inv, up.w, up.s, up.inv, xr, H, I, KK, g.ge, g.gs, g.gc, g.perm, g.meta, act);
                });
                ok &= emu_launch({(unsigned)ceil_div(groups * H / 8, 4), 1, 1}, 128, [&] {
                    moe_down_fp4_warp(down.w, down.s, down.inv, act, H, I, g.ge, g.gs, g.gc, g.perm, g.meta, out);
                });
            } else {
                unsigned gb = (unsigned)std::min(8, ceil_div(s * I / 2, 8)), db = (unsigned)std::min(8, ceil_div(s * H / 4, 8));
                ok &= emu_launch({gb, 1, 1}, 256, [&] {
                    moe_gate_up_fp4_grouped(gate.w, gate.s, gate.inv, up.w, up.s, up.inv, xr, H, I, KK, g.ge, g.gs, g.gc, g.perm, g.meta, act);
                });
                ok &= emu_launch({db, 1, 1}, 256, [&] {
                    moe_down_fp4_grouped(down.w, down.s, down.inv, act, H, I, g.ge, g.gs, g.gc, g.perm, g.meta, out);
                });
            }
        };
        float* act7 = emu_alloc<float>((size_t)M * KK * I);
        float* out7 = emu_alloc<float>((size_t)M * KK * H);
        run(true, all, x, M, act7, out7);
        float* act1 = emu_alloc<float>((size_t)M * KK * I);
        float* out1 = emu_alloc<float>((size_t)M * KK * H);
        for (int r = 0; r < M; r++) {
            Groups one = group(std::vector<int>(ids.begin() + r * KK, ids.begin() + (r + 1) * KK));
            // A one-row pass's slots are 0..KK-1; its outputs land in row r's slots here.
            run(true, one, x + (size_t)r * H, 1, act1 + (size_t)r * KK * I, out1 + (size_t)r * KK * H);
        }
        bool eq = same_bits("moe_*_warp activations, 7 rows vs 1", act7, act1, (size_t)M * KK * I) &&
                  same_bits("moe_*_warp outputs, 7 rows vs 1", out7, out1, (size_t)M * KK * H);
        std::printf("moe_*_fp4_warp over %d rows (%d groups) = each row alone: %s\n", M, all.meta[0], eq ? "yes" : "NO");
        ok &= eq;
        float* acts = emu_alloc<float>((size_t)M * KK * I);
        float* outs = emu_alloc<float>((size_t)M * KK * H);
        run(false, all, x, M, acts, outs);
        bool eq2 = same_bits("moe_*_grouped vs _warp activations", acts, act7, (size_t)M * KK * I) &&
                   same_bits("moe_*_grouped vs _warp outputs", outs, out7, (size_t)M * KK * H);
        std::printf("moe_*_fp4_warp = moe_*_fp4_grouped over %d rows: %s\n", M, eq2 ? "yes" : "NO");
        ok &= eq2;
    }
    std::printf(ok ? "weight-streaming invariance emulation: PASS\n" : "weight-streaming invariance emulation: FAIL\n");
    return ok ? 0 : 1;
}
