// The decode attention path in the CPU emulation (cuda_emu.h): qk_norm_rope_kv (q/k RMSNorm,
// partial NeoX RoPE, K/V into a paged cache), attention_gqa over 64 key splits and
// attention_merge, with BF16 and FP8 (scaled) caches, full and sliding-window layers, a sink
// logit and the per-head softplus gate; against a float64 evaluation of the same attention (from
// the model's formulas, on the values the cache holds), and a 3-row pass against each row alone
// (bit for bit: a DFlash verify row attends like the decoded row). Built and run by
// kernels/emu/run.sh; exit status 0 = pass.
#include "cuda_emu.h"

#include "kernels.inc"

#include <random>

static int ceil_div(int a, int b) { return (a + b - 1) / b; }
static double e4m3_val(unsigned char b) {
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    return b & 0x80 ? -v : v;
}

template <typename KV>
static bool run(bool fp8, int window, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int nh = 8, nkv = 2, G = nh / nkv, hd = 128, half = 32, ps = 16, max_pages = 64, P = 300, R = 3;
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
    float* qn_w = emu_alloc<float>(hd);
    float* kn_w = emu_alloc<float>(hd);
    float* inv_freq = emu_alloc<float>(half);
    float* sink = emu_alloc<float>(nh);
    for (int i = 0; i < hd; i++) {
        qn_w[i] = 1.f + 0.1f * nd(rng);
        kn_w[i] = 1.f + 0.1f * nd(rng);
    }
    for (int i = 0; i < half; i++) inv_freq[i] = std::pow(10000.f, -(float)i / half);
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
    auto pass = [&](int r0, int rows, float* q, float* out) {
        std::memcpy(q, raw + (size_t)r0 * ld, 4 * (size_t)rows * ld);
        const int* pp = pos + r0;
        const int* sr = seqrow + r0;
        ok &= emu_launch({(unsigned)rows, (unsigned)ceil_div(nh + nkv, 4), 1}, 128, [&] {
            if constexpr (sizeof(KV) == 1)
                qk_norm_rope_kv_fp8(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, attn_factor, eps, pp, sr, bt,
                                    max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
            else
                qk_norm_rope_kv(q, ld, q + qw, q + qw + kvw, ld, qn_w, kn_w, inv_freq, half, attn_factor, eps, pp, sr, bt,
                                max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
        });
        ok &= emu_launch({(unsigned)rows, (unsigned)nkv, (unsigned)nsplit}, 32 * G, [&] {
            if constexpr (sizeof(KV) == 1)
                attention_gqa_fp8(q, ld, out, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw + 2 * kvw,
                                  ld, 1, scale, vscale, nsplit, part, nullptr);
            else
                attention_gqa(q, ld, out, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, window, sink, q + qw + 2 * kvw, ld, 1,
                              scale, vscale, nsplit, part, nullptr);
        }, 8);
        ok &= emu_launch({(unsigned)rows, (unsigned)nh, 1}, 128, [&] {
            attention_merge(part, nsplit, out, qw, nh, hd, sink, q + qw + 2 * kvw, ld, 1, pp, window, nullptr, vscale);
        });
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

    // ---- float64 reference (on the cache the kernels wrote) ----
    auto kval = [&](const KV* c, size_t i) { return fp8 ? e4m3_val((unsigned char)c[i]) : (double)bf2f((bf16_t)c[i]); };
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
            int kh = h / G;
            std::vector<double> sc;
            double mx = sink[h];
            for (int t = lo; t <= p; t++) {
                size_t base = ((size_t)bt[t / ps] * ps + t % ps) * kvw + kh * hd;
                double a = 0;
                for (int d = 0; d < hd; d++) a += (double)q3[(size_t)r * ld + h * hd + d] * kval(kc, base + d);
                sc.push_back(a * scale);
                mx = std::max(mx, a * scale);
            }
            double den = std::exp(sink[h] - mx);
            for (double& v : sc) den += (v = std::exp(v - mx));
            double gate = std::log1p(std::exp((double)x[qw + 2 * kvw + h]));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int t = lo; t <= p; t++) {
                    size_t base = ((size_t)bt[t / ps] * ps + t % ps) * kvw + kh * hd;
                    o += sc[t - lo] * kval(vc, base + d);
                }
                o = o / den * vscale * gate;
                err = std::max(err, std::fabs(o - o3[(size_t)r * qw + h * hd + d]));
                mag = std::max(mag, std::fabs(o));
            }
        }
    }
    double rel = err / mag;
    bool close = rel < 2e-5 && qerr < 1e-4;
    std::printf("decode attention (%s cache, %s, 8 heads on 2 KV heads, 64 splits): 3 rows = each row alone: %s; "
                "q after norm + RoPE vs float64 %.1e, output vs float64 %.1e %s\n",
                fp8 ? "FP8" : "BF16", window ? "window 128" : "full", same ? "yes" : "NO", qerr, rel, close ? "ok" : "TOO LARGE");
    return ok && same && close;
}

int main() {
    emu_init(size_t(64) << 20);
    bool ok = run<unsigned short>(false, 0, 11);
    ok &= run<unsigned short>(false, 128, 12);
    ok &= run<unsigned char>(true, 0, 13);
    ok &= run<unsigned char>(true, 128, 14);
    std::printf(ok ? "decode attention emulation: PASS\n" : "decode attention emulation: FAIL\n");
    return ok ? 0 : 1;
}
