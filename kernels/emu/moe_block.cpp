// moe_decode_fused and moe_decode_fused_tc (one launch, grid-wide barriers) against the launches
// they stand for
// (rmsnorm, linear_bf16_1, router_topk, moe_gate_up_fp4_warp, moe_down_fp4_warp, moe_combine,
// rmsnorm), both run by the CPU emulation of kernels/emu/cuda_emu.h on the same inputs, with the
// launch shapes engine/src/cuda/layers.rs uses. Every output must be the same bits; the result is
// also checked against a float64 evaluation of the MoE layer written here from the model's math
// (not from the kernels). Also: router_topk against the host rule, the NVFP4 decode, and
// embed_norm against the gather + rmsnorm. Built and run by kernels/emu/run.sh; exit status 0 = pass.
#include <string>

#include "cuda_emu.h"

#include "kernels.inc"

#include "emu_test.h"

struct Shape {
    const char* name;
    int H, I, E, K, shared;  // shared: a folded shared expert (stacked as expert E, slot K)
    float softcap;
    int norm_topk;
    unsigned grid, block;  // the fused launch's
};

static unsigned norm_block(int h) {  // ops.rs norm_block
    unsigned b = ((h + 7) / 8 + 31) / 32 * 32;
    return std::min(1024u, std::max(32u, b));
}
static bool run(const Shape& sh, unsigned seed) {
    std::mt19937 rng(seed);
    const int H = sh.H, I = sh.I, E = sh.E, K = sh.K, KK = K + sh.shared, NE = E + sh.shared;
    const float eps = 1e-6f, scale = 2.5f;
    std::normal_distribution<float> nd(0.f, 1.f);
    float* x0 = emu_alloc<float>(H);
    float* post_w = emu_alloc<float>(H);
    float* next_w = emu_alloc<float>(H);
    unsigned short* rw = emu_alloc<unsigned short>((size_t)E * H);
    float* bias = emu_alloc<float>(E);
    for (int i = 0; i < H; i++) {
        x0[i] = 3.f * nd(rng);
        post_w[i] = 1.f + 0.1f * nd(rng);
        next_w[i] = 1.f + 0.1f * nd(rng);
    }
    for (size_t i = 0; i < (size_t)E * H; i++) rw[i] = f2bf(0.05f * nd(rng));
    for (int e = 0; e < E; e++) bias[e] = 0.05f * nd(rng);
    Fp4Stack gate = make_fp4_stack(rng, NE, I, H), up = make_fp4_stack(rng, NE, I, H), down = make_fp4_stack(rng, NE, H, I);

    // ---- the seven launches (layers.rs, one row, moe_*_fp4_warp) ----
    float* xa = emu_alloc<float>(H);
    std::memcpy(xa, x0, 4 * H);
    float* hn_a = emu_alloc<float>(H);
    float* hn2_a = emu_alloc<float>(H);
    float* rlog_a = emu_alloc<float>(E);
    int* ids_a = emu_alloc<int>(32);
    float* wts_a = emu_alloc<float>(32);
    int *ge = emu_alloc<int>(32), *gs = emu_alloc<int>(32), *gc = emu_alloc<int>(32), *perm = emu_alloc<int>(32), *meta = emu_alloc<int>(4);
    float* act_a = emu_alloc<float>((size_t)KK * I);
    float* out_a = emu_alloc<float>((size_t)KK * H);
    bool ok = true;
    auto step = [&](const char* what, bool done) {
        if (!done) std::printf("  %s: %s launch failed\n", sh.name, what);
        ok &= done;
    };
    unsigned nb = norm_block(H);
    step("rmsnorm", emu_launch({1, 1, 1}, nb, [&] { rmsnorm(xa, nullptr, post_w, hn_a, H, eps); }));
    step("linear_bf16_1", emu_launch({(unsigned)ceil_div(E, 16), 1, 1}, 256,
                     [&] { linear_bf16_1(rw, nullptr, 1.f, hn_a, H, rlog_a, E, 1, E, H, 0); }));
    step("router_topk", emu_launch({1, 1, 1}, 32, [&] {
        router_topk(rlog_a, bias, E, K, sh.softcap, sh.norm_topk, ids_a, wts_a, sh.shared, 1.f / scale, ge, gs, gc, perm, meta);
    }));
    unsigned gb = (unsigned)ceil_div(KK * I / 2, 4), db = (unsigned)ceil_div(KK * H / 8, 4);
    step("moe_gate_up_fp4_warp", emu_launch({gb, 1, 1}, 128, [&] {
        moe_gate_up_fp4_warp(gate.w, gate.s, gate.inv, up.w, up.s, up.inv, hn_a, H, I, KK, ge, gs, gc, perm, meta, act_a);
    }));
    step("moe_down_fp4_warp", emu_launch({db, 1, 1}, 128,
                     [&] { moe_down_fp4_warp(down.w, down.s, down.inv, act_a, H, I, ge, gs, gc, perm, meta, out_a); }));
    step("moe_combine", emu_launch({(unsigned)ceil_div(H, 256), 1, 1}, 256, [&] { moe_combine(xa, out_a, wts_a, nullptr, H, KK, scale); }));
    step("rmsnorm (next)", emu_launch({1, 1, 1}, nb, [&] { rmsnorm(xa, nullptr, next_w, hn2_a, H, eps); }));

    // ---- the fused launch from x0 with its own outputs ----
    struct Fused {
        float *x, *hn2, *rlog, *wts, *act, *out;
        int* ids;
    };
    unsigned* bar = emu_alloc<unsigned>(4);
    // Phase timestamps (what laguna-dev kbench reads): start, barrier 0 in / out, top-k done,
    // barriers 1..3 in / out, end: in that order.
    const int stamp[] = {0, 1, 2, 10, 3, 4, 5, 6, 7, 8, 9};
    // The fused launch needs a router row pair a warp at most (the host's condition).
    if (E > 2 * (int)(sh.grid * sh.block / 32)) {
        std::printf("%s: the grid has too few warps for the router rows (E %d)\n", sh.name, E);
        return false;
    }
    // tc: moe_decode_fused_tc (the expert dot products on tensor cores; H 2048, I 512).
    auto fused = [&](bool tc) {
        Fused f{emu_alloc<float>(H),      emu_alloc<float>(H),           emu_alloc<float>(E),
                emu_alloc<float>(32),     emu_alloc<float>((size_t)KK * I), emu_alloc<float>((size_t)KK * H),
                emu_alloc<int>(32)};
        std::memcpy(f.x, x0, 4 * H);
        // It polls its logits instead of waiting at a barrier: they start unset.
        std::memset(f.rlog, 0xff, 4 * E);
        unsigned long long* tp = emu_alloc<unsigned long long>(11);
        tp[0] = ~0ull;
        const char* name = tc ? "moe_decode_fused_tc" : "moe_decode_fused";
        step(name, emu_launch({sh.grid, 1, 1}, sh.block, [&] {
            (tc ? moe_decode_fused_tc : moe_decode_fused)(f.x, post_w, eps, (int)nb, rw, f.rlog, bias, E, K, sh.softcap,
              sh.norm_topk, sh.shared, 1.f / scale, gate.w, gate.s, gate.inv, up.w, up.s, up.inv, down.w, down.s, down.inv,
              H, I, f.act, f.out, f.ids, f.wts, scale, bar, next_w, f.hn2, tp, tc ? 0 : 120);
        }, 0));
        for (int i = 0; i + 1 < 11; i++)
            if (tp[stamp[i]] > tp[stamp[i + 1]] || tp[stamp[i + 1]] == 0) {
                std::printf("%s: %s phase timestamps out of order at %d\n", sh.name, name, stamp[i + 1]);
                ok = false;
            }
        if ((bar[0] & 0x7fffffffu) != 0) {
            std::printf("  %s: barrier word's low bits not back to 0: %08x\n", name, bar[0]);
            ok = false;
        }
        return f;
    };
    Fused fb = fused(false);
    float *xb = fb.x, *hn2_b = fb.hn2, *wts_b = fb.wts, *act_b = fb.act, *out_b = fb.out;
    int* ids_b = fb.ids;
    if (!ok) {
        std::printf("%s: a launch failed\n", sh.name);
        return false;
    }
    bool same = same_bits("routing weights", wts_a, wts_b, KK) && same_bits("expert activations", act_a, act_b, KK * I) &&
                same_bits("expert outputs", out_a, out_b, KK * H) && same_bits("residual", xa, xb, H) &&
                same_bits("next input norm", hn2_a, hn2_b, H);
    // Its logits buffer after the launch: every value back to unset (all bits 1).
    auto unset = [&](const char* what, const float* p, int n) {
        for (int q = 0; q < n; q++)
            if (__float_as_uint(p[q]) != 0xFFFFFFFFu) {
                std::printf("  %s %d not unset after the launch\n", what, q);
                return false;
            }
        return true;
    };
    same = same && unset("moe_decode_fused: logit", fb.rlog, E);
    for (int k = 0; k < KK; k++)
        if (ids_a[k] != ids_b[k]) {
            std::printf("  expert id of slot %d: %d vs %d\n", k, ids_a[k], ids_b[k]);
            same = false;
        }


    // ---- float64 reference of the layer (model math: RMSNorm, sigmoid router with softcap and
    // biased top-k selection, renormalised weights, SwiGLU experts, routed scale, shared expert).
    std::vector<double> hn(H), lg(E), sc(E), xr(H);
    double ss = 0;
    for (int i = 0; i < H; i++) ss += (double)x0[i] * x0[i];
    double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int i = 0; i < H; i++) hn[i] = post_w[i] * (x0[i] * inv);
    for (int e = 0; e < E; e++) {
        double a = 0;
        for (int i = 0; i < H; i++) a += bf2f(rw[(size_t)e * H + i]) * hn[i];
        if (sh.softcap > 0) a = std::tanh(a / sh.softcap) * sh.softcap;
        lg[e] = a;
        sc[e] = 1.0 / (1.0 + std::exp(-a));
    }
    std::vector<int> order(E);
    for (int e = 0; e < E; e++) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] + bias[a] > sc[b] + bias[b]; });
    double tot = 0;
    for (int k = 0; k < K; k++) tot += sc[order[k]];
    std::vector<std::pair<int, double>> slots;
    for (int k = 0; k < K; k++) slots.push_back({order[k], sh.norm_topk ? sc[order[k]] / tot : sc[order[k]]});
    for (int k = 0; k < K; k++)
        if (ids_b[k] != order[k]) {
            std::printf("  float64 reference picks expert %d for slot %d, the kernels %d\n", order[k], k, ids_b[k]);
            same = false;
        }
    for (int i = 0; i < H; i++) xr[i] = x0[i];
    auto expert = [&](int e, double w) {
        std::vector<double> a(I);
        for (int j = 0; j < I; j++) {
            double g = 0, u = 0;
            for (int i = 0; i < H; i++) {
                g += gate.at(e, j, i) * hn[i];
                u += up.at(e, j, i) * hn[i];
            }
            a[j] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int n = 0; n < H; n++) {
            double d = 0;
            for (int j = 0; j < I; j++) d += down.at(e, n, j) * a[j];
            xr[n] += w * d;
        }
    };
    for (auto& [e, w] : slots) expert(e, w * scale);
    if (sh.shared) expert(E, 1.0);
    double err = 0, mag = 0;
    for (int n = 0; n < H; n++) {
        err = std::max(err, std::fabs(xr[n] - xb[n]));
        mag = std::max(mag, std::fabs(xr[n] - x0[n]));
    }
    double rel = err / std::max(mag, 1e-30);
    bool close = rel < 1e-4;
    // moe_tc (H 2048, I 512): the same routing bit for bit (the router is unchanged), the layer
    // within the same bound of the float64 reference (mma emulated as f32 FMAs in k order).
    if (H == 2048 && I == 512) {
        Fused ft = fused(true);
        bool tsame = same_bits("moe_decode_fused_tc routing weights", wts_a, ft.wts, KK) && unset("moe_decode_fused_tc: logit", ft.rlog, E);
        for (int k = 0; k < KK; k++) tsame &= ids_a[k] == ft.ids[k];
        // The multi-row form (DFlash verify, batched decode) on the same routing: the row's B
        // fragments, moe_gate_up_fp4_tc, moe_down_fp4_tc, the combine and the next norm give
        // moe_decode_fused_tc's bits.
        float *xt = emu_alloc<float>(H), *hn2_t = emu_alloc<float>(H), *act_t = emu_alloc<float>((size_t)KK * I);
        float* out_t = emu_alloc<float>((size_t)KK * H);
        unsigned short* xf = emu_alloc<unsigned short>(2 * (size_t)H);
        std::memcpy(xt, x0, 4 * H);
        step("moe_tc_bfrag_rows", emu_launch({1, 1, 1}, 256, [&] { moe_tc_bfrag_rows(hn_a, xf); }));
        step("moe_gate_up_fp4_tc", emu_launch({gb, 1, 1}, 128, [&] {
            moe_gate_up_fp4_tc(gate.w, gate.s, gate.inv, up.w, up.s, up.inv, xf, H, I, KK, ge, gs, gc, perm, meta, act_t);
        }));
        step("moe_down_fp4_tc", emu_launch({db, 1, 1}, 128,
                                           [&] { moe_down_fp4_tc(down.w, down.s, down.inv, act_t, H, I, ge, gs, gc, perm, meta, out_t); }));
        step("moe_combine (tc)", emu_launch({(unsigned)ceil_div(H, 256), 1, 1}, 256, [&] { moe_combine(xt, out_t, wts_a, nullptr, H, KK, scale); }));
        step("rmsnorm (next, tc)", emu_launch({1, 1, 1}, nb, [&] { rmsnorm(xt, nullptr, next_w, hn2_t, H, eps); }));
        bool chain = same_bits("tc launches vs moe_decode_fused_tc: residual", xt, ft.x, H) &&
                     same_bits("tc launches vs moe_decode_fused_tc: next input norm", hn2_t, ft.hn2, H) &&
                     same_bits("tc launches vs moe_decode_fused_tc: expert outputs", out_t, ft.out, KK * H);
        std::printf("%s: moe_gate_up_fp4_tc + moe_down_fp4_tc launches = moe_decode_fused_tc bit for bit: %s\n", sh.name, chain ? "yes" : "NO");
        tsame &= chain;
        double terr = 0;
        for (int n = 0; n < H; n++) terr = std::max(terr, std::fabs(xr[n] - ft.x[n]));
        double trel = terr / std::max(mag, 1e-30);
        bool tclose = trel < 1e-4;
        std::printf("%s: moe_decode_fused_tc (tensor-core expert dots): routing = seven launches: %s; vs float64: max |err| / max |update| = %.2e %s\n",
                    sh.name, tsame ? "yes" : "NO", trel, tclose ? "ok" : "TOO LARGE");
        same = same && tsame;
        close = close && tclose;
    }
    std::printf("%s (H %d, I %d, E %d, top-%d%s, grid %u x %u): fused = seven launches bit for bit: %s; vs float64: max |err| / max |update| = %.2e %s\n",
                sh.name, H, I, E, K, sh.shared ? " + shared" : "", sh.grid, sh.block, same ? "yes" : "NO", rel,
                close ? "ok" : "TOO LARGE");
    return same && close;
}

// router_topk against the rule written out on the host: the K largest sigmoid(logit) + bias
// (ties to the lower expert index, a NaN never picked), weights sigmoid / their sum in pick order
// (or the sigmoids), then the shared slot. Logits drawn from a few values, so ties are common.
static bool topk_cases() {
    std::mt19937 rng(77);
    bool ok = true;
    int cases = 0;
    const int Es[] = {8, 40, 256, 1000};
    for (int E : Es)
        for (int K : {1, 3, 8})
            for (int levels : {2, 5, 1000})
                for (int nan : {0, 1, 3}) {
                    if (K > E || (nan && K == E) || (nan == 3 && E < 3)) continue;
                    float* lg = emu_alloc<float>(E);
                    float* bias = emu_alloc<float>(E);
                    int* ids = emu_alloc<int>(64);
                    float* wts = emu_alloc<float>(64);
                    std::uniform_int_distribution<int> lv(0, levels - 1);
                    for (int e = 0; e < E; e++) {
                        lg[e] = (float)lv(rng) * 0.25f - 1.f;
                        bias[e] = levels == 1000 ? 0.01f * (float)lv(rng) / 1000.f : 0.f;
                    }
                    if (nan == 1) lg[E / 2] = NAN;
                    // nan 3: logits whose 1 + exp(-l) is infinite (-100) or past 2^126 (-87.5), where
                    // the sigmoid's division leaves its fast path.
                    if (nan == 3) lg[1] = -100.f, lg[E - 1] = -87.5f;
                    int norm = (E + K) & 1, shared = K & 1;
                    bool launched = emu_launch({1, 1, 1}, 32, [&] {
                        router_topk(lg, bias, E, K, 0.f, norm, ids, wts, shared, 0.4f, nullptr, nullptr, nullptr, nullptr,
                                    nullptr);
                    });
                    std::vector<float> s(E), sel(E);
                    for (int e = 0; e < E; e++) {
                        s[e] = 1.0f / (1.0f + std::exp(-lg[e]));
                        sel[e] = s[e] + bias[e];
                    }
                    std::vector<int> order;
                    for (int e = 0; e < E; e++)
                        if (!std::isnan(sel[e])) order.push_back(e);
                    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
                    float total = 0.f;
                    for (int k = 0; k < K; k++) total += s[order[k]];
                    bool same = launched;
                    for (int k = 0; k < K; k++) {
                        float w = norm ? s[order[k]] / total : s[order[k]];
                        same &= ids[k] == order[k] && same_bits("weight", &wts[k], &w, 1);
                    }
                    if (shared) same &= ids[K] == E && wts[K] == 0.4f;
                    if (!same) std::printf("  router_topk E %d K %d levels %d nan %d: DIFFERS from the host rule\n", E, K, levels, nan);
                    ok &= same;
                    cases++;
                }
    std::printf("router_topk vs the host rule (ties, NaN, logits whose sigmoid leaves the division's fast path, E 8..1000): %d cases, %s\n",
                cases, ok ? "all equal" : "SOME DIFFER");
    return ok;
}

// blk16_dot's NVFP4 decode (codes as E4M3 bytes = e2m1 * 2^-6, e2m1x8_f32) against the form it
// replaced, written out here: each code's magnitude bits at f32 bits 22..24 and its sign at bit
// 31 (e2m1 * 2^-126, subnormal for codes 1 and 9) times the activation scaled by 2^100, so that
// form's sums are the new ones times 2^-20. Every one of the 16 positions takes every code, with
// activations over many magnitudes: the same bits wherever neither form leaves the normal range.
static bool decode_cases() {
    std::mt19937 rng(77);
    std::uniform_int_distribution<unsigned> word(0, 0xffffffffu);
    std::uniform_real_distribution<float> mant(-1.f, 1.f);
    std::uniform_int_distribution<int> ex(-40, 20);
    auto old_code = [](unsigned w, int p) {
        unsigned mag = (p * 4 <= 22 ? (w << (22 - 4 * p)) : (w >> (4 * p - 22))) & 0x01c00000u;
        unsigned sgn = (w << (28 - 4 * p)) & 0x80000000u;
        return __uint_as_float(mag | sgn);
    };
    int cases = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        unsigned w0 = word(rng), w1 = word(rng);
        if (it < 16 * 16) {  // code it % 16 at position it / 16, the rest random
            int pos = it / 16, code = it % 16;
            unsigned& w = pos < 8 ? w0 : w1;
            int sh = 4 * (pos & 7);
            w = (w & ~(15u << sh)) | ((unsigned)code << sh);
        }
        float xv[16], xs[16];
        for (int i = 0; i < 16; i++) {
            xv[i] = std::ldexp(mant(rng), ex(rng));
            xs[i] = xv[i] * 0x1p100f;
        }
        float t_new = blk16_dot<1>(w0, w1, 0, 0, 0, 0, 0, 0, xv);
        float t_old = 0.f;
        for (int i = 0; i < 16; i++) t_old = std::fma(old_code(i < 8 ? w0 : w1, i & 7), xs[i], t_old);
        float want = std::ldexp(t_old, 20);
        cases++;
        if (__float_as_uint(t_new) != __float_as_uint(want)) {
            if (bad++ < 5) std::printf("  decode %08x %08x: %a vs %a\n", w0, w1, t_new, want);
        }
    }
    std::printf("NVFP4 block decode (E4M3 bytes) vs the e2m1_at form: %d cases, %s\n", cases, bad ? "SOME DIFFER" : "all the same bits");
    return bad == 0;
}

// embed_norm (the first layer's input norm in the embedding launch) against the gather then rmsnorm /
// rmsnorm_split: the residual rows, the normed rows and their BF16 hi / lo split, bit for bit, for
// rows given by token ids and by the previous step's drawn tokens (negative ids read `feed`).
static bool embed_norm_cases() {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    bool ok = true;
    int cases = 0;
    for (int H : {64, 2048, 3000})
        for (int split : {0, 1}) {
            const int V = 50, M = 3;
            unsigned short* table = emu_alloc<unsigned short>((size_t)V * H);
            for (size_t i = 0; i < (size_t)V * H; i++) table[i] = f2bf(2.f * nd(rng));
            float* w = emu_alloc<float>(H);
            for (int i = 0; i < H; i++) w[i] = 1.f + 0.1f * nd(rng);
            int* tokens = emu_alloc<int>(M);
            int* feed = emu_alloc<int>(M);
            tokens[0] = 7, tokens[1] = -2, tokens[2] = 49;  // row 1: row 1 of feed
            feed[0] = 3, feed[1] = 31, feed[2] = 0;
            float *xa = emu_alloc<float>((size_t)M * H), *ya = emu_alloc<float>((size_t)M * H);
            float *xb = emu_alloc<float>((size_t)M * H), *yb = emu_alloc<float>((size_t)M * H);
            unsigned short *sa = emu_alloc<unsigned short>((size_t)2 * M * H), *sb = emu_alloc<unsigned short>((size_t)2 * M * H);
            unsigned nb = norm_block(H);
            // The gather on the host: row m = the BF16 row of its token (a negative token: row -1 - t of feed).
            for (unsigned m = 0; m < M; m++) {
                int t = tokens[m] < 0 ? feed[-1 - tokens[m]] : tokens[m];
                for (int i = 0; i < H; i++) xa[(size_t)m * H + i] = bf2f(table[(size_t)t * H + i]);
            }
            bool launched = true;
            launched &= emu_launch({M, 1, 1}, nb, [&] {
                if (split)
                    rmsnorm_split(xa, nullptr, w, ya, H, 1e-6f, sa);
                else
                    rmsnorm(xa, nullptr, w, ya, H, 1e-6f);
            });
            launched &= emu_launch({M, 1, 1}, nb, [&] { embed_norm(table, tokens, feed, xb, H, w, yb, 1e-6f, split ? sb : nullptr); });
            bool same = launched && same_bits("embedded rows", xa, xb, M * H) && same_bits("normed rows", ya, yb, M * H);
            if (split)
                for (int i = 0; i < 2 * M * H; i++) same &= sa[i] == sb[i];
            if (!same) std::printf("  embed_norm H %d split %d: DIFFERS from the gather + rmsnorm\n", H, split);
            ok &= same;
            cases++;
        }
    std::printf("embed_norm vs the gather + rmsnorm (+ split): %d cases, %s\n", cases, ok ? "all the same bits" : "SOME DIFFER");
    return ok;
}

int main() {
    emu_init(size_t(1) << 30);
    const Shape shapes[] = {
        // the nvfp4-experts fixture's shape, blocks smaller than a warp's multiple of items
        {"fixture", 64, 32, 8, 3, 1, 0.f, 1, 2, 64},
        // XS-2.1's hidden size (norm over 256 virtual threads with 96 real ones), softcap
        {"wide", 2048, 64, 16, 4, 1, 30.f, 1, 3, 96},
        // no shared expert, weights not renormalised, one block of XS's 640 threads
        {"single-block", 512, 128, 32, 8, 0, 0.f, 0, 1, 640},
        // Laguna-XS 2.1's MoE layer (256 experts, top-8 + shared, I 512), 7 blocks of 640 (the fewest
        // whose warps hold a router row pair each)
        {"xs-2.1", 2048, 512, 256, 8, 1, 0.f, 1, 7, 640},
    };
    bool ok = true;
    unsigned seed = 1234;
    for (const Shape& s : shapes) ok &= run(s, seed++);
    ok &= topk_cases();
    ok &= decode_cases();
    ok &= embed_norm_cases();
    std::printf(ok ? "moe_decode_fused emulation: PASS\n" : "moe_decode_fused emulation: FAIL\n");
    return ok ? 0 : 1;
}
