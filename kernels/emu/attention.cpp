// The attention kernels in the CPU emulation (cuda_emu.h). Decode: qk_norm_rope_store (q/k
// RMSNorm, partial NeoX RoPE, K/V into a paged cache), attention_decode_gqa over 64 key splits and
// attention_decode_merge16 / 64, and the fused attention_decode_gqa_qk, with BF16 and FP8 (scaled) caches, full and sliding-window layers, a sink
// logit and the per-head softplus gate; against a float64 evaluation of the same attention (from
// the model's formulas, on the values the cache holds), and a 3-row pass against each row alone
// (bit for bit: a DFlash verify row attends like the decoded row). Prefill: the flash attention
// variants against float64 (run_prefill below). Built and run by kernels/emu/run.sh; exit
// status 0 = pass.
#include "cuda_emu.h"

#include "kernels.inc"

#include "emu_test.h"

static int merge16_cases = 0, merge16_bad = 0;

template <typename KV>
static bool run(bool fp8, int window, unsigned seed, int P = 300) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    // P = 2050: 64 splits of 33 keys, the last one empty (the row's own key is in split 62).
    const int nh = 8, nkv = 2, G = nh / nkv, hd = 128, half = 32, ps = 16, max_pages = P > 900 ? 160 : 64, R = 3;
    const int qw = nh * hd, kvw = nkv * hd, nsplit = 64;
    const float eps = 1e-6f, attn_factor = 1.1f, kscale = fp8 ? 0.5f : 1.f, vscale = fp8 ? 0.25f : 1.f;
    const int slots = max_pages * ps;
    KV* kc = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc = emu_alloc<KV>((size_t)slots * kvw);
    int* bt = emu_alloc<int>(max_pages);
    for (int i = 0; i < max_pages; i++) bt[i] = (i * 37 + 5) % max_pages;  // a scattered page table
    // Keys 0..P-1 already in the cache (as stored values).
    for (int t = 0; t < P; t++) {
        size_t base = ((size_t)bt[t / ps] * ps + t % ps) * kvw;
        for (int i = 0; i < kvw; i++) {
            float kv = nd(rng), vv = nd(rng);
            if (fp8) {
                kc[base + i] = (KV)emu_f2e4m3(kv);
                vc[base + i] = (KV)emu_f2e4m3(vv);
            } else {
                kc[base + i] = (KV)f2bf(kv);
                vc[base + i] = (KV)f2bf(vv);
            }
        }
    }
    // R new rows at positions P .. P+R-1: raw q | k | v | g (one fused projection row), weights.
    const int ld = qw + 2 * kvw + nh;
    float* raw = emu_alloc<float>((size_t)R * ld);
    for (int i = 0; i < R * ld; i++) raw[i] = nd(rng);
    const QkNorm nrm = make_qk_norm(rng, hd, half);
    const float *qn_w = nrm.qn_w, *kn_w = nrm.kn_w, *inv_freq = nrm.inv_freq;
    float* sink = emu_alloc<float>(nh);
    for (int h = 0; h < nh; h++) sink[h] = 0.5f * nd(rng);
    const float scale = (float)((1.0 / std::sqrt((double)hd)) * kscale);
    int* pos = emu_alloc<int>(R);
    int* seqrow = emu_alloc<int>(R);
    for (int r = 0; r < R; r++) pos[r] = P + r;
    float* part = emu_alloc<float>((size_t)R * nh * nsplit * (hd + 2));
    KV* kc0 = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc0 = emu_alloc<KV>((size_t)slots * kvw);
    std::memcpy((void*)kc0, (void*)kc, sizeof(KV) * (size_t)slots * kvw);
    std::memcpy((void*)vc0, (void*)vc, sizeof(KV) * (size_t)slots * kvw);
    bool ok = true;
    // One pass of `rows` rows starting at row r0 (rows of `raw` copied, so q is normed in place).
    // ns: key splits (0: nsplit; 1: the attention writes the output itself, no merge).
    auto pass = [&](int r0, int rows, float* q, float* out, int ns = 0) {
        if (ns == 0) ns = nsplit;
        std::memcpy(q, raw + (size_t)r0 * ld, 4 * (size_t)rows * ld);
        const int* pp = pos + r0;
        const int* sr = seqrow + r0;
        ok &= emu_launch({(unsigned)rows, (unsigned)ceil_div(nh + nkv, 4), 1}, 128, [&] {
            if constexpr (sizeof(KV) == 1)
                qk_norm_rope_store_fp8(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, attn_factor, eps, pp, sr, bt,
                                       max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
            else
                qk_norm_rope_store(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, attn_factor, eps, pp, sr, bt,
                                   max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
        });
        ok &= emu_launch({(unsigned)rows, (unsigned)nkv, (unsigned)ns}, 32 * G, [&] {
            if constexpr (sizeof(KV) == 1)
                attention_decode_gqa_fp8(q, ld, out, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, window, sink,
                                         q + qw + 2 * kvw, ld, 1, scale, vscale, ns, part, nullptr);
            else
                attention_decode_gqa(q, ld, out, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw + 2 * kvw,
                                     ld, 1, scale, vscale, ns, part, nullptr);
        }, 8);
        if (ns > 1) {
            ok &= emu_launch({(unsigned)rows, (unsigned)nh, 1}, 128, [&] {
                attention_decode_merge16(part, ns, out, qw, nh, hd, sink, q + qw + 2 * kvw, ld, 1, pp, window, nullptr, vscale);
            });
            // attention_decode_merge64 (64 split values a thread at once) on the same partials:
            // the same bits.
            float* o64 = emu_alloc<float>((size_t)rows * qw);
            ok &= emu_launch({(unsigned)rows, (unsigned)nh, 1}, 128, [&] {
                attention_decode_merge64(part, ns, o64, qw, nh, hd, sink, q + qw + 2 * kvw, ld, 1, pp, window, nullptr, vscale);
            });
            merge16_cases++;
            if (std::memcmp(o64, out, 4 * (size_t)rows * qw) != 0) merge16_bad++;
        }
    };
    // The three rows in one pass, then (fresh cache) each row alone, in order.
    float* q3 = emu_alloc<float>((size_t)R * ld);
    float* o3 = emu_alloc<float>((size_t)R * qw);
    pass(0, R, q3, o3);
    std::vector<KV> kc3(kc, kc + (size_t)slots * kvw), vc3(vc, vc + (size_t)slots * kvw);
    std::memcpy((void*)kc, (void*)kc0, sizeof(KV) * (size_t)slots * kvw);
    std::memcpy((void*)vc, (void*)vc0, sizeof(KV) * (size_t)slots * kvw);
    float* q1 = emu_alloc<float>((size_t)R * ld);
    float* o1 = emu_alloc<float>((size_t)R * qw);
    for (int r = 0; r < R; r++) pass(r, 1, q1 + (size_t)r * ld, o1 + (size_t)r * qw);
    bool same = std::memcmp(o3, o1, 4 * (size_t)R * qw) == 0 && std::memcmp(kc3.data(), kc, sizeof(KV) * kc3.size()) == 0 &&
                std::memcmp(vc3.data(), vc, sizeof(KV) * vc3.size()) == 0;

    // attention_decode_gqa_qk (q/k norm, RoPE, K/V write and attention in one launch, for passes
    // whose rows are each alone in their sequence): each row alone, in order, fresh cache, with 64
    // splits and with one (the output written directly): the same cache and output bits as
    // qk_norm_rope_store + attention_decode_gqa (+ attention_decode_merge16) on that row.
    auto fused = [&](int r, int ns, float* out) {
        const float* x = raw + (size_t)r * ld;
        ok &= emu_launch({1, (unsigned)nkv, (unsigned)ns}, 32 * (G + 1), [&] {
#define QK_F_ARGS x, ld, out, qw, kc, vc, pos + r, seqrow + r, bt, max_pages, ps, nh, nkv, hd, window, sink, x + qw + 2 * kvw, ld, 1, \
    scale, vscale, ns, part, x + qw, x + qw + kvw, ld, qn_w, kn_w, inv_freq, half, attn_factor, eps, 1.f / kscale, 1.f / vscale
            if constexpr (sizeof(KV) == 1)
                attention_decode_gqa_qk_fp8(QK_F_ARGS);
            else
                attention_decode_gqa_qk(QK_F_ARGS);
#undef QK_F_ARGS
        }, 8);
        if (ns > 1)
            ok &= emu_launch({1, (unsigned)nh, 1}, 128, [&] {
                attention_decode_merge16(part, ns, out, qw, nh, hd, sink, x + qw + 2 * kvw, ld, 1, pos + r, window, nullptr, vscale);
            });
    };
    std::memcpy((void*)kc, (void*)kc0, sizeof(KV) * (size_t)slots * kvw);
    std::memcpy((void*)vc, (void*)vc0, sizeof(KV) * (size_t)slots * kvw);
    float* oF = emu_alloc<float>((size_t)R * qw);
    for (int r = 0; r < R; r++) fused(r, nsplit, oF + (size_t)r * qw);
    bool same_f = std::memcmp(o1, oF, 4 * (size_t)R * qw) == 0 && std::memcmp(kc3.data(), kc, sizeof(KV) * kc3.size()) == 0 &&
                  std::memcmp(vc3.data(), vc, sizeof(KV) * vc3.size()) == 0;
    // A sliding layer's grid of ceil(window / 32) splits (4 here) instead of 64,
    // the same splits, so the same bits.
    if (window > 0) {
        std::memcpy((void*)kc, (void*)kc0, sizeof(KV) * (size_t)slots * kvw);
        std::memcpy((void*)vc, (void*)vc0, sizeof(KV) * (size_t)slots * kvw);
        float* oW = emu_alloc<float>((size_t)R * qw);
        for (int r = 0; r < R; r++) fused(r, ceil_div(window, 32), oW + (size_t)r * qw);
        same_f &= std::memcmp(oF, oW, 4 * (size_t)R * qw) == 0;
    }
    // One split: the standard kernels on each row alone (nsplit 1), then the fused kernel.
    std::memcpy((void*)kc, (void*)kc0, sizeof(KV) * (size_t)slots * kvw);
    std::memcpy((void*)vc, (void*)vc0, sizeof(KV) * (size_t)slots * kvw);
    float* oS = emu_alloc<float>((size_t)R * qw);
    float* qS = emu_alloc<float>((size_t)R * ld);
    for (int r = 0; r < R; r++) pass(r, 1, qS + (size_t)r * ld, oS + (size_t)r * qw, 1);
    std::vector<KV> kcS(kc, kc + (size_t)slots * kvw), vcS(vc, vc + (size_t)slots * kvw);
    std::memcpy((void*)kc, (void*)kc0, sizeof(KV) * (size_t)slots * kvw);
    std::memcpy((void*)vc, (void*)vc0, sizeof(KV) * (size_t)slots * kvw);
    float* oF1 = emu_alloc<float>((size_t)R * qw);
    for (int r = 0; r < R; r++) fused(r, 1, oF1 + (size_t)r * qw);
    same_f &= std::memcmp(oS, oF1, 4 * (size_t)R * qw) == 0 && std::memcmp(kcS.data(), kc, sizeof(KV) * kcS.size()) == 0 &&
              std::memcmp(vcS.data(), vc, sizeof(KV) * vcS.size()) == 0 && std::memcmp(kc3.data(), kc, sizeof(KV) * kc3.size()) == 0;

    // ---- float64 reference (on the cache the kernels wrote) ----
    double qerr = 0, err = 0, mag = 0;
    for (int r = 0; r < R; r++) {
        int p = P + r;
        const float* x = raw + (size_t)r * ld;
        // RoPE of one normed head (f32 angles, as transformers and vLLM compute them).
        auto rope = [&](std::vector<double>& y) {
            std::vector<double> o = y;
            for (int i = 0; i < half; i++) {
                float ang = (float)p * inv_freq[i];
                double c = std::cos((double)ang) * attn_factor, s = std::sin((double)ang) * attn_factor;
                o[i] = y[i] * c - y[i + half] * s;
                o[i + half] = y[i + half] * c + y[i] * s;
            }
            y = o;
        };
        auto norm = [&](const float* v, const float* w) {
            double ss = 0;
            for (int d = 0; d < hd; d++) ss += (double)v[d] * v[d];
            double inv = 1.0 / std::sqrt(ss / hd + eps);
            std::vector<double> y(hd);
            for (int d = 0; d < hd; d++) y[d] = w[d] * (v[d] * inv);
            return y;
        };
        int lo = window > 0 ? std::max(0, p + 1 - window) : 0;
        for (int h = 0; h < nh; h++) {
            std::vector<double> qh = norm(x + h * hd, qn_w);
            rope(qh);
            for (int d = 0; d < hd; d++) qerr = std::max(qerr, std::fabs(qh[d] - q3[(size_t)r * ld + h * hd + d]));
            double gate = std::log1p(std::exp((double)x[qw + 2 * kvw + h]));
            std::vector<double> o(hd);
            ref_attention(q3 + (size_t)r * ld + h * hd, kc, vc, bt, ps, kvw, h / G, hd, lo, p, scale, sink[h], gate, vscale, o.data());
            for (int d = 0; d < hd; d++) {
                err = std::max(err, std::fabs(o[d] - o3[(size_t)r * qw + h * hd + d]));
                mag = std::max(mag, std::fabs(o[d]));
            }
        }
    }
    double rel = err / mag;
    bool close = rel < 2e-5 && qerr < 1e-4;
    std::printf("decode attention (%s cache, %s, %d cached keys, 8 heads on 2 KV heads, 64 splits): 3 rows = each row alone: %s; "
                "fused attention_decode_gqa_qk = standard (64 splits, 1 split, window / 32 splits): %s; q after norm + RoPE vs "
                "float64 %.1e, output vs float64 %.1e %s\n",
                fp8 ? "FP8" : "BF16", window ? "window 128" : "full", P, same ? "yes" : "NO", same_f ? "yes" : "NO",
                qerr, rel, close ? "ok" : "TOO LARGE");
    return ok && same && same_f && close;
}

// The prefill flash attention (tensor-core tiles of 64 queries x 64 keys, Q and P split into
// BF16 hi + lo) on a 100-row prompt in query tiles of 64 and 36 rows: every variant against
// float64, and `_q` (Q fragments in shared memory) bit for bit against `_x`.
template <typename KV>
static bool run_prefill(bool fp8, int window, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int nh = 8, nkv = 2, G = nh / nkv, hd = 128, half = 32, ps = 16, max_pages = 16, M = 100;
    const int qw = nh * hd, kvw = nkv * hd, ld = qw + 2 * kvw + nh;
    const float eps = 1e-6f, kscale = fp8 ? 0.5f : 1.f, vscale = fp8 ? 0.25f : 1.f;
    const int slots = max_pages * ps;
    KV* kc = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc = emu_alloc<KV>((size_t)slots * kvw);
    int* bt = emu_alloc<int>(max_pages);
    for (int i = 0; i < max_pages; i++) bt[i] = (i * 7 + 3) % max_pages;
    float* q = emu_alloc<float>((size_t)M * ld);
    for (int i = 0; i < M * ld; i++) q[i] = nd(rng);
    float* qn_w = emu_alloc<float>(hd);
    float* kn_w = emu_alloc<float>(hd);
    float* inv_freq = emu_alloc<float>(half);
    float* sink = emu_alloc<float>(nh);
    for (int i = 0; i < hd; i++) qn_w[i] = kn_w[i] = 1.f;
    for (int i = 0; i < half; i++) inv_freq[i] = std::pow(10000.f, -(float)i / half);
    for (int h = 0; h < nh; h++) sink[h] = 0.5f * nd(rng);
    int* pos = emu_alloc<int>(M);
    int* seqrow = emu_alloc<int>(M);
    for (int r = 0; r < M; r++) pos[r] = r;
    int* tiles = emu_alloc<int>(4);
    int tl[4] = {0, 64, 64, 36};
    std::memcpy(tiles, tl, sizeof tl);
    const float scale = (float)((1.0 / std::sqrt((double)hd)) * kscale);
    bool ok = emu_launch({(unsigned)M, (unsigned)ceil_div(nh + nkv, 4), 1}, 128, [&] {
        if constexpr (sizeof(KV) == 1)
            qk_norm_rope_store_fp8(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, 1.f, eps, pos, seqrow, bt, max_pages,
                                ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
        else
            qk_norm_rope_store(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, 1.f, eps, pos, seqrow, bt, max_pages, ps,
                            kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
    });
    const float* g = q + qw + 2 * kvw;
    // float64 reference.
    std::vector<double> ref((size_t)M * qw);
    double mag = 0;
    for (int r = 0; r < M; r++)
        for (int h = 0; h < nh; h++) {
            int lo = window > 0 ? std::max(0, r + 1 - window) : 0;
            double gate = std::log1p(std::exp((double)g[(size_t)r * ld + h]));
            double* o = ref.data() + (size_t)r * qw + h * hd;
            ref_attention(q + (size_t)r * ld + h * hd, kc, vc, bt, ps, kvw, h / G, hd, lo, r, scale, sink[h], gate, vscale, o);
            for (int d = 0; d < hd; d++) mag = std::max(mag, std::fabs(o[d]));
        }
    std::vector<std::vector<float>> outs;
    const char* names[2] = {"attention_prefill_flash", "attention_prefill_flash_qsmem (Q in shared memory)"};
    for (int v = 0; v < 2; v++) {
        float* out = emu_alloc<float>((size_t)M * qw);
        ok &= emu_launch({2, (unsigned)nh, 1}, 128, [&] {
#define PF_ARGS q, ld, out, qw, kc, vc, pos, seqrow, bt, max_pages, ps, nh, nkv, hd, window, sink, g, ld, 1, scale, vscale, tiles, nullptr, nullptr, nullptr, nullptr, M
            if constexpr (sizeof(KV) == 1) {
                if (v == 0) attention_prefill_flash_fp8(PF_ARGS);
                else attention_prefill_flash_qsmem_fp8(PF_ARGS);
            } else {
                if (v == 0) attention_prefill_flash(PF_ARGS);
                else attention_prefill_flash_qsmem(PF_ARGS);
            }
#undef PF_ARGS
        });
        double err = 0;
        for (size_t i = 0; i < (size_t)M * qw; i++) err = std::max(err, std::fabs(ref[i] - out[i]));
        bool close = err / mag < 2e-5;
        std::printf("prefill %s (%s cache, %s, 100 rows in tiles of 64 and 36) vs float64: %.1e %s\n", names[v], fp8 ? "FP8" : "BF16",
                    window ? "window 40" : "causal", err / mag, close ? "ok" : "TOO LARGE");
        ok &= close;
        outs.emplace_back(out, out + (size_t)M * qw);
    }
    bool same = std::memcmp(outs[0].data(), outs[1].data(), 4 * outs[0].size()) == 0;
    std::printf("prefill _qsmem = registers' form bit for bit: %s\n", same ? "yes" : "NO");
    return ok && same;
}

int main() {
    emu_init(size_t(64) << 20);
    bool ok = run<unsigned short>(false, 0, 11);
    ok &= run<unsigned short>(false, 128, 12);
    ok &= run<unsigned char>(true, 0, 13);
    ok &= run<unsigned char>(true, 128, 14);
    ok &= run<unsigned short>(false, 0, 15, 2050);
    std::printf("attention_decode_merge64 vs attention_decode_merge16 on the same partials: %d passes, %s\n", merge16_cases,
                merge16_bad ? "SOME DIFFER" : "the same bits");
    ok &= merge16_bad == 0 && merge16_cases > 0;
    ok &= run_prefill<unsigned short>(false, 0, 21);
    ok &= run_prefill<unsigned short>(false, 40, 22);
    ok &= run_prefill<unsigned char>(true, 0, 23);
    std::printf(ok ? "attention emulation: PASS\n" : "attention emulation: FAIL\n");
    return ok ? 0 : 1;
}
