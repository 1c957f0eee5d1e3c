// Widths that are not multiples of 16 (BF16 weights), in the CPU emulation (cuda_emu.h): the
// tails of the kernels a Laguna config of any hidden, MLP, expert or attention width reaches.
//   * linear_bf16_1, linear_bf16_m8, linear_bf16_m16 at K = 178, 50, 24, 31 (rows not 16-byte
//     aligned, a last block past K) and N not a multiple of 16: against float64, and the rows of
//     a 7- and a 13-row pass = each row alone (_1), bit for bit (DFlash's token identity);
//   * gemm_bf16 (the long-pass GEMM without cuBLAS) at the same K: against float64;
//   * the BF16 experts of any width: moe_gate_up_bf16 / moe_down_bf16 (several rows) = their _1
//     forms on each row alone, bit for bit, and against float64; moe_gemm_gate_up_bf16 +
//     silu_mul_split + moe_gemm_down_bf16 (long passes) against float64;
//   * attention_decode_head at head_dim % 8 != 0 (BF16 and FP8 caches), and reading a staged
//     pass's keys from the stage, against float64;
//   * attention_prefill_flash[_qsmem] at head_dim % 16 != 0 (BF16 and FP8 caches, full and
//     sliding window, staged), against float64, the two forms bit for bit;
//   * ring_commit of K/V rows that are not a multiple of 8 bytes.
// Aligned widths keep their own (unchanged) code paths: invariance.cpp and moe_gemm.cpp.
// Built and run by kernels/emu/run.sh; exit status 0 = pass.
#include "cuda_emu.h"

#include "kernels.inc"

#include "emu_test.h"

#include <map>

static double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}
// Largest |y - ref| over the largest |ref|.
static double rel_err(const float* y, const std::vector<double>& ref) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); i++) e = std::max(e, std::fabs((double)y[i] - ref[i]));
    return e / std::max(max_abs(ref), 1e-30);
}

struct Groups {
    int *ge, *gs, *gc, *perm, *meta;
};
// Slots grouped by expert (expert order), as router_topk's direct form lays them out.
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

static unsigned short* bf16_mat(std::mt19937& rng, size_t n, float scale) {
    std::normal_distribution<float> nd(0.f, 1.f);
    unsigned short* w = emu_alloc<unsigned short>(n);
    for (size_t i = 0; i < n; i++) w[i] = f2bf(scale * nd(rng));
    return w;
}

// Dense Linears and the GEMM at width K (N outputs).
static bool dense(std::mt19937& rng, int K, int N) {
    std::normal_distribution<float> nd(0.f, 1.f);
    bool ok = true;
    const int M = 13, MG = 70;
    unsigned short* w = bf16_mat(rng, (size_t)N * K, 0.05f);
    float* x = emu_alloc<float>((size_t)MG * K);
    for (int i = 0; i < MG * K; i++) x[i] = nd(rng);
    std::vector<double> ref((size_t)MG * N);
    for (int m = 0; m < MG; m++)
        for (int n = 0; n < N; n++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)bf2f(w[(size_t)n * K + k]) * x[(size_t)m * K + k];
            ref[(size_t)m * N + n] = a;
        }
    std::vector<double> ref_m(ref.begin(), ref.begin() + (size_t)M * N);
    unsigned n16 = ceil_div(N, 16);
    float* y1 = emu_alloc<float>((size_t)M * N);
    for (int r = 0; r < M; r++)
        ok &= emu_launch({n16, 1, 1}, 256, [&] { linear_bf16_1(w, nullptr, 1.f, x + (size_t)r * K, K, y1 + (size_t)r * N, N, 1, N, K, 0); });
    double e1 = rel_err(y1, ref_m);
    float* y8 = emu_alloc<float>((size_t)7 * N);
    ok &= emu_launch({n16, 1, 1}, 256, [&] { linear_bf16_m8(w, nullptr, 1.f, x, K, y8, N, 7, N, K, 0); });
    float* y16 = emu_alloc<float>((size_t)M * N);
    ok &= emu_launch({n16, 1, 1}, 256, [&] { linear_bf16_m16(w, nullptr, 1.f, x, K, y16, N, M, N, K, 0); });
    bool eq = same_bits("linear_bf16_m8 vs _1", y8, y1, (size_t)7 * N) & same_bits("linear_bf16_m16 vs _1", y16, y1, (size_t)M * N);
    std::printf("K %d, N %d: linear_bf16_1 vs float64 %.1e %s; _m8 (7 rows), _m16 (%d rows) = _1 on each row: %s\n", K, N, e1,
                e1 < 1e-5 ? "ok" : "TOO LARGE", M, eq ? "yes" : "NO");
    ok &= e1 < 1e-5 && eq;
    unsigned short* xs2 = emu_alloc<unsigned short>((size_t)2 * MG * K);
    ok &= emu_launch({(unsigned)ceil_div(K, 256), (unsigned)MG, 1}, 256, [&] { split_bf16(x, K, MG, K, xs2, 1); });
    float* yg = emu_alloc<float>((size_t)MG * N);
    ok &= emu_launch({(unsigned)ceil_div(N, 64), (unsigned)ceil_div(MG, 64), 1}, 128,
                     [&] { gemm_bf16(w, nullptr, 1.f, xs2, K, yg, N, MG, N, K, 0); });
    double eg = rel_err(yg, ref);
    std::printf("K %d, N %d: gemm_bf16 (%d rows, hi + lo) vs float64 %.1e %s\n", K, N, MG, eg, eg < 1e-4 ? "ok" : "TOO LARGE");
    return ok && eg < 1e-4;
}

// BF16 experts [E, I, H] (gate, up) and [E, H, I] (down) at hidden H and width I.
static bool experts(std::mt19937& rng, int H, int I) {
    std::normal_distribution<float> nd(0.f, 1.f);
    bool ok = true;
    const int E = 6, KK = 3, M = 5, MG = 40;
    unsigned short *gw = bf16_mat(rng, (size_t)E * I * H, 0.1f), *uw = bf16_mat(rng, (size_t)E * I * H, 0.1f),
                   *dw = bf16_mat(rng, (size_t)E * H * I, 0.1f);
    auto at = [](const unsigned short* w, int e, int rows, int cols, int r, int c) {
        return (double)bf2f(w[((size_t)e * rows + r) * cols + c]);
    };
    float* x = emu_alloc<float>((size_t)MG * H);
    for (int i = 0; i < MG * H; i++) x[i] = nd(rng);
    std::vector<int> ids((size_t)MG * KK);
    for (int m = 0; m < MG; m++)
        for (int k = 0; k < KK; k++) ids[(size_t)m * KK + k] = (2 * m + 3 * k + m / 4) % E;
    const int S = MG * KK;
    std::vector<double> ref((size_t)S * H);
    for (int s = 0; s < S; s++) {
        int e = ids[s], m = s / KK;
        std::vector<double> a(I);
        for (int j = 0; j < I; j++) {
            double g = 0, u = 0;
            for (int i = 0; i < H; i++) {
                g += at(gw, e, I, H, j, i) * x[(size_t)m * H + i];
                u += at(uw, e, I, H, j, i) * x[(size_t)m * H + i];
            }
            a[j] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int n = 0; n < H; n++) {
            double d = 0;
            for (int j = 0; j < I; j++) d += at(dw, e, H, I, n, j) * a[j];
            ref[(size_t)s * H + n] = d;
        }
    }
    // Weight streaming: M rows at once, then each row alone with the _1 forms.
    const int SM = M * KK;
    std::vector<double> ref_m(ref.begin(), ref.begin() + (size_t)SM * H);
    float* act = emu_alloc<float>((size_t)SM * I);
    float* out = emu_alloc<float>((size_t)SM * H);
    {
        Groups g = group(std::vector<int>(ids.begin(), ids.begin() + SM));
        ok &= emu_launch({(unsigned)ceil_div(I, 8), (unsigned)g.meta[0], 1}, 256, [&] {
            moe_gate_up_bf16(gw, nullptr, nullptr, uw, nullptr, nullptr, x, H, I, KK, g.ge, g.gs, g.gc, g.perm, g.meta, act);
        });
        ok &= emu_launch({(unsigned)ceil_div(H, 8), (unsigned)g.meta[0], 1}, 256, [&] {
            moe_down_bf16(dw, nullptr, nullptr, act, H, I, g.ge, g.gs, g.gc, g.perm, g.meta, out);
        });
    }
    float* out1 = emu_alloc<float>((size_t)SM * H);
    for (int m = 0; m < M; m++) {
        Groups g = group(std::vector<int>(ids.begin() + m * KK, ids.begin() + (m + 1) * KK));
        float* a1 = emu_alloc<float>((size_t)KK * I);
        ok &= emu_launch({(unsigned)ceil_div(I, 8), (unsigned)g.meta[0], 1}, 256, [&] {
            moe_gate_up_bf16_1(gw, nullptr, nullptr, uw, nullptr, nullptr, x + (size_t)m * H, H, I, KK, g.ge, g.gs, g.gc, g.perm,
                               g.meta, a1);
        });
        ok &= emu_launch({(unsigned)ceil_div(H, 8), (unsigned)g.meta[0], 1}, 256, [&] {
            moe_down_bf16_1(dw, nullptr, nullptr, a1, H, I, g.ge, g.gs, g.gc, g.perm, g.meta, out1 + (size_t)m * KK * H);
        });
    }
    double es = rel_err(out, ref_m);
    bool eq = same_bits("moe_*_bf16 vs _1", out, out1, (size_t)SM * H);
    std::printf("H %d, I %d: moe_{gate_up,down}_bf16 (%d rows) vs float64 %.1e %s; = _1 on each row: %s\n", H, I, M, es,
                es < 1e-5 ? "ok" : "TOO LARGE", eq ? "yes" : "NO");
    ok &= es < 1e-5 && eq;
    // Long passes: grouped GEMMs on the hi / lo split.
    int *ge = emu_alloc<int>(S), *gs = emu_alloc<int>(S), *gc = emu_alloc<int>(S), *perm = emu_alloc<int>(S), *meta = emu_alloc<int>(4);
    int* idd = emu_alloc<int>(S);
    for (int s = 0; s < S; s++) idd[s] = ids[s];
    const int max_tiles = S / 64 + std::min(S, E) + 1;
    int* tiles = emu_alloc<int>(2 * (max_tiles + 1));
    ok &= emu_launch({1, 1, 1}, 128, [&] { moe_group(idd, S, E, ge, gs, gc, perm, meta, tiles, KK, -1); });
    unsigned short* xs2 = emu_alloc<unsigned short>((size_t)2 * MG * H);
    ok &= emu_launch({(unsigned)ceil_div(H, 256), (unsigned)MG, 1}, 256, [&] { split_bf16(x, H, MG, H, xs2, 1); });
    float* gu = emu_alloc<float>((size_t)S * 2 * I);
    ok &= emu_launch({(unsigned)ceil_div(2 * I, 64), (unsigned)max_tiles, 1}, 128, [&] {
        moe_gemm_gate_up_bf16(gw, nullptr, nullptr, uw, nullptr, nullptr, xs2, (size_t)MG * H, H, I, KK, ge, gs, gc, perm, meta, tiles,
                              gu);
    });
    unsigned short* as2 = emu_alloc<unsigned short>((size_t)2 * S * I);
    ok &= emu_launch({(unsigned)ceil_div(I, 256), (unsigned)S, 1}, 256, [&] { silu_mul_split(gu, as2, S, I, 1); });
    float* og = emu_alloc<float>((size_t)S * H);
    ok &= emu_launch({(unsigned)ceil_div(H, 64), (unsigned)max_tiles, 1}, 128, [&] {
        moe_gemm_down_bf16(dw, nullptr, nullptr, as2, (size_t)S * I, H, I, ge, gs, gc, perm, meta, tiles, og);
    });
    double eg = rel_err(og, ref);
    std::printf("H %d, I %d: moe_gemm_{gate_up,down}_bf16 (%d rows x %d slots) vs float64 %.1e %s\n", H, I, MG, KK, eg,
                eg < 1e-4 ? "ok" : "TOO LARGE");
    return ok && eg < 1e-4;
}

// attention_decode_head (the decode attention of any head_dim the GQA / tensor-core forms do not
// take) at hd % 8 != 0: one split, and 8 splits + attention_decode_merge16, against float64 on the
// values the cache holds (BF16 or FP8 scaled), full and sliding window, a sink, the per-head gate.
// Staged: the pass's two rows (one sequence) have their keys in the stage, not in the ring (whose
// slots for them hold other values), as a staged ring pass the flash kernel cannot take runs it.
template <typename KV>
static bool head_attention(std::mt19937& rng, int hd, int window, bool staged) {
    std::normal_distribution<float> nd(0.f, 1.f);
    constexpr bool fp8 = sizeof(KV) == 1;
    const int nh = 6, nkv = 2, G = nh / nkv, ps = 16, max_pages = 16, P = 150, R = 2;
    const int qw = nh * hd, kvw = nkv * hd, slots = max_pages * ps, nsplit = 8;
    const float kscale = fp8 ? 0.5f : 1.f, vscale = fp8 ? 0.25f : 1.f;
    KV* kc = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc = emu_alloc<KV>((size_t)slots * kvw);
    int* bt = emu_alloc<int>(max_pages);
    for (int i = 0; i < max_pages; i++) bt[i] = (i * 5 + 3) % max_pages;
    auto slot = [&](int t) { return ((size_t)bt[t / ps] * ps + t % ps) * kvw; };
    for (int t = 0; t < P + R; t++)
        for (int i = 0; i < kvw; i++) {
            float kv = nd(rng), vv = nd(rng);
            kc[slot(t) + i] = fp8 ? (KV)emu_f2e4m3(kv) : (KV)f2bf(kv);
            vc[slot(t) + i] = fp8 ? (KV)emu_f2e4m3(vv) : (KV)f2bf(vv);
        }
    const int ld = qw + nh;  // q | per-head gate
    float* q = emu_alloc<float>((size_t)R * ld);
    for (int i = 0; i < R * ld; i++) q[i] = nd(rng);
    float* sink = emu_alloc<float>(nh);
    for (int h = 0; h < nh; h++) sink[h] = 0.5f * nd(rng);
    int *pos = emu_alloc<int>(R), *seqrow = emu_alloc<int>(R), *sfirst = emu_alloc<int>(R);
    for (int r = 0; r < R; r++) pos[r] = P + r;
    const float scale = (float)((1.0 / std::sqrt((double)hd)) * kscale);
    std::vector<double> ref((size_t)R * qw);
    for (int r = 0; r < R; r++) {
        int p = pos[r], lo = window > 0 ? std::max(0, p + 1 - window) : 0;
        for (int h = 0; h < nh; h++) {
            double gate = std::log1p(std::exp((double)q[(size_t)r * ld + qw + h]));
            ref_attention(q + (size_t)r * ld + h * hd, kc, vc, bt, ps, kvw, h / G, hd, lo, p, scale, sink[h], gate, vscale,
                          ref.data() + (size_t)r * qw + h * hd);
        }
    }
    KV *ks = nullptr, *vs = nullptr;
    if (staged) {  // the rows' keys to the stage [R, nkv, hd]; their ring slots overwritten
        ks = emu_alloc<KV>((size_t)R * kvw);
        vs = emu_alloc<KV>((size_t)R * kvw);
        for (int r = 0; r < R; r++)
            for (int i = 0; i < kvw; i++) {
                ks[(size_t)r * kvw + i] = kc[slot(P + r) + i];
                vs[(size_t)r * kvw + i] = vc[slot(P + r) + i];
                kc[slot(P + r) + i] = fp8 ? (KV)emu_f2e4m3(3.f) : (KV)f2bf(3.f);
                vc[slot(P + r) + i] = fp8 ? (KV)emu_f2e4m3(-2.f) : (KV)f2bf(-2.f);
            }
    }
    float* part = emu_alloc<float>((size_t)R * nh * nsplit * (hd + 2));
    bool ok = true;
    double worst = 0;
    for (int ns : {1, nsplit}) {
        float* out = emu_alloc<float>((size_t)R * qw);
        ok &= emu_launch({(unsigned)R, (unsigned)nh, (unsigned)ns}, 128, [&] {
            if constexpr (fp8)
                attention_decode_head_fp8(q, ld, out, qw, kc, vc, pos, seqrow, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw,
                                          ld, 1, scale, vscale, ns, part, nullptr, ks, vs, sfirst);
            else
                attention_decode_head(q, ld, out, qw, kc, vc, pos, seqrow, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw, ld,
                                      1, scale, vscale, ns, part, nullptr, ks, vs, sfirst);
        }, 8);
        if (ns > 1)
            ok &= emu_launch({(unsigned)R, (unsigned)nh, 1}, (unsigned)ceil_div(hd, 32) * 32, [&] {
                attention_decode_merge16(part, ns, out, qw, nh, hd, sink, q + qw, ld, 1, pos, window, nullptr, vscale);
            });
        worst = std::max(worst, rel_err(out, ref));
    }
    bool close = worst < 2e-5;
    std::printf("attention_decode_head%s, head_dim %d, window %d%s: 1 and %d splits vs float64 %.1e %s\n", fp8 ? "_fp8" : "", hd,
                window, staged ? ", staged" : "", nsplit, worst, close ? "ok" : "TOO LARGE");
    return ok && close;
}

// attention_prefill_flash (Q in registers) and attention_prefill_flash_qsmem (Q in shared memory)
// at head_dim % 16 != 0: a 100-row pass (query tiles of 64 and 36 rows) after 30 cached keys,
// against float64 on the values the cache holds (BF16 or FP8 scaled), with a sink and the
// per-head gate; the two forms bit for bit, and the o_proj input form (xs: BF16 hi / lo) the
// split of the f32 output. Staged: the pass's keys are in the stage, their ring slots hold other
// values.
template <typename KV>
static bool flash_prefill(std::mt19937& rng, int hd, int window, bool staged) {
    std::normal_distribution<float> nd(0.f, 1.f);
    constexpr bool fp8 = sizeof(KV) == 1;
    const int nh = 6, nkv = 2, G = nh / nkv, ps = 16, max_pages = 16, P = 30, M = 100;
    const int qw = nh * hd, kvw = nkv * hd, slots = max_pages * ps;
    const float kscale = fp8 ? 0.5f : 1.f, vscale = fp8 ? 0.25f : 1.f;
    KV* kc = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc = emu_alloc<KV>((size_t)slots * kvw);
    int* bt = emu_alloc<int>(max_pages);
    for (int i = 0; i < max_pages; i++) bt[i] = (i * 5 + 3) % max_pages;
    auto slot = [&](int t) { return ((size_t)bt[t / ps] * ps + t % ps) * kvw; };
    for (int t = 0; t < P + M; t++)
        for (int i = 0; i < kvw; i++) {
            float kv = nd(rng), vv = nd(rng);
            kc[slot(t) + i] = fp8 ? (KV)emu_f2e4m3(kv) : (KV)f2bf(kv);
            vc[slot(t) + i] = fp8 ? (KV)emu_f2e4m3(vv) : (KV)f2bf(vv);
        }
    const int ld = qw + nh;  // q | per-head gate
    float* q = emu_alloc<float>((size_t)M * ld);
    for (int i = 0; i < M * ld; i++) q[i] = nd(rng);
    float* sink = emu_alloc<float>(nh);
    for (int h = 0; h < nh; h++) sink[h] = 0.5f * nd(rng);
    int *pos = emu_alloc<int>(M), *seqrow = emu_alloc<int>(M), *sfirst = emu_alloc<int>(M);
    for (int r = 0; r < M; r++) pos[r] = P + r;
    int* tiles = emu_alloc<int>(4);
    const int tl[4] = {0, 64, 64, 36};
    std::memcpy(tiles, tl, sizeof tl);
    const float scale = (float)((1.0 / std::sqrt((double)hd)) * kscale);
    std::vector<double> ref((size_t)M * qw);
    for (int r = 0; r < M; r++) {
        int p = pos[r], lo = window > 0 ? std::max(0, p + 1 - window) : 0;
        for (int h = 0; h < nh; h++) {
            double gate = std::log1p(std::exp((double)q[(size_t)r * ld + qw + h]));
            ref_attention(q + (size_t)r * ld + h * hd, kc, vc, bt, ps, kvw, h / G, hd, lo, p, scale, sink[h], gate, vscale,
                          ref.data() + (size_t)r * qw + h * hd);
        }
    }
    KV *ks = nullptr, *vs = nullptr;
    if (staged) {  // the pass's keys to the stage [M, nkv, hd]; their ring slots overwritten
        ks = emu_alloc<KV>((size_t)M * kvw);
        vs = emu_alloc<KV>((size_t)M * kvw);
        for (int r = 0; r < M; r++)
            for (int i = 0; i < kvw; i++) {
                ks[(size_t)r * kvw + i] = kc[slot(P + r) + i];
                vs[(size_t)r * kvw + i] = vc[slot(P + r) + i];
                kc[slot(P + r) + i] = fp8 ? (KV)emu_f2e4m3(3.f) : (KV)f2bf(3.f);
                vc[slot(P + r) + i] = fp8 ? (KV)emu_f2e4m3(-2.f) : (KV)f2bf(-2.f);
            }
    }
    // v: 0 registers, 1 Q in shared memory, 2 registers with the BF16 hi / lo output.
    std::vector<float*> outs;
    bf16_t* xs = emu_alloc<bf16_t>((size_t)2 * M * qw);
    bool ok = true;
    for (int v = 0; v < 3; v++) {
        float* out = emu_alloc<float>((size_t)M * qw);
        bf16_t* x = v == 2 ? xs : nullptr;
        ok &= emu_launch({2, (unsigned)nh, 1}, 128, [&] {
#define PF_ARGS q, ld, out, qw, kc, vc, pos, seqrow, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw, ld, 1, scale, vscale, \
                tiles, ks, vs, sfirst, x, M
            if constexpr (fp8) {
                if (v == 1) attention_prefill_flash_qsmem_fp8(PF_ARGS);
                else attention_prefill_flash_fp8(PF_ARGS);
            } else {
                if (v == 1) attention_prefill_flash_qsmem(PF_ARGS);
                else attention_prefill_flash(PF_ARGS);
            }
#undef PF_ARGS
        });
        outs.push_back(out);
    }
    double err = std::max(rel_err(outs[0], ref), rel_err(outs[1], ref));
    bool same = std::memcmp(outs[0], outs[1], sizeof(float) * (size_t)M * qw) == 0;
    bool split = true;
    for (size_t i = 0; i < (size_t)M * qw; i++) {
        float o = outs[0][i];
        bf16_t hi = f2bf(o), lo = f2bf(o - bf2f(hi));
        split &= xs[i] == hi && xs[(size_t)M * qw + i] == lo;
    }
    bool close = err < 2e-5;
    std::printf("attention_prefill_flash[_qsmem]%s, head_dim %d, window %d%s: vs float64 %.1e %s; _qsmem = registers' form: "
                "%s; BF16 hi / lo output = split of the f32 one: %s\n",
                fp8 ? "_fp8" : "", hd, window, staged ? ", staged" : "", err, close ? "ok" : "TOO LARGE", same ? "yes" : "NO",
                split ? "yes" : "NO");
    return ok && close && same && split;
}

// ring_commit after a staged pass: a 20-row pass (positions 0..19) of one sequence into a ring of
// 8 slots: the last 8 rows' K and V rows land in their slots (bt[p % 8]) byte for byte, the other
// slots keep their bytes. rowb = nkv * hd * element size: 100 (BF16, one KV head of 50), 50 (FP8),
// 36 (BF16, 18) and 96 (BF16, 2 x 24: the 8-byte form).
static bool ring_commit_rows(std::mt19937& rng, int rowb) {
    const int M = 20, ring = 8, slots = 16;
    unsigned char *ks = emu_alloc<unsigned char>((size_t)M * rowb), *vs = emu_alloc<unsigned char>((size_t)M * rowb);
    unsigned char *kc = emu_alloc<unsigned char>((size_t)slots * rowb), *vc = emu_alloc<unsigned char>((size_t)slots * rowb);
    for (int i = 0; i < M * rowb; i++) ks[i] = (unsigned char)rng(), vs[i] = (unsigned char)rng();
    for (int i = 0; i < slots * rowb; i++) kc[i] = vc[i] = 0xa5;
    int *pos = emu_alloc<int>(M), *seqrow = emu_alloc<int>(M), *slast = emu_alloc<int>(M), *bt = emu_alloc<int>(ring);
    for (int r = 0; r < M; r++) pos[r] = r, slast[r] = M - 1;
    for (int i = 0; i < ring; i++) bt[i] = 8 + (i * 3) % ring;  // slots 8..15, scattered; 0..7 untouched
    bool ok = emu_launch({(unsigned)M, 1, 1}, 64, [&] { ring_commit(ks, vs, pos, seqrow, slast, bt, ring, kc, vc, rowb); });
    bool right = true;
    for (int s = 0; s < slots; s++) {
        int r = -1;  // the row whose K/V slot s must hold
        for (int p = M - ring; p < M; p++)
            if (bt[p % ring] == s) r = p;
        for (int i = 0; i < rowb; i++) {
            unsigned char ek = r < 0 ? 0xa5 : ks[(size_t)r * rowb + i], ev = r < 0 ? 0xa5 : vs[(size_t)r * rowb + i];
            right &= kc[(size_t)s * rowb + i] == ek && vc[(size_t)s * rowb + i] == ev;
        }
    }
    std::printf("ring_commit, %d-byte rows: the last %d of %d rows in their ring slots, the rest untouched: %s\n", rowb, ring, M,
                right ? "yes" : "NO");
    return ok && right;
}

int main() {
    emu_init(size_t(256) << 20);
    std::mt19937 rng(49);
    bool ok = true;
    for (auto [k, n] : {std::pair{178, 37}, {50, 90}, {24, 16}, {31, 21}}) ok &= dense(rng, k, n);
    for (auto [h, i] : {std::pair{50, 22}, {178, 24}, {24, 40}}) ok &= experts(rng, h, i);
    ok &= head_attention<unsigned short>(rng, 50, 0, false);
    ok &= head_attention<unsigned short>(rng, 20, 40, false);
    ok &= head_attention<unsigned char>(rng, 18, 0, false);
    ok &= head_attention<unsigned short>(rng, 50, 40, true);
    ok &= head_attention<unsigned char>(rng, 24, 0, true);
    ok &= flash_prefill<unsigned short>(rng, 50, 0, false);
    ok &= flash_prefill<unsigned short>(rng, 20, 40, false);
    ok &= flash_prefill<unsigned char>(rng, 18, 0, false);
    ok &= flash_prefill<unsigned char>(rng, 50, 40, false);
    ok &= flash_prefill<unsigned short>(rng, 24, 0, true);
    ok &= flash_prefill<unsigned char>(rng, 50, 40, true);
    for (int rowb : {100, 50, 36, 96}) ok &= ring_commit_rows(rng, rowb);
    std::printf(ok ? "width tails emulation: PASS\n" : "width tails emulation: FAIL\n");
    return ok ? 0 : 1;
}
