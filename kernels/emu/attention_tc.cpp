// attention_decode_tc (the split-KV decode attention on tensor cores) and its merges in the CPU
// emulation (cuda_emu.h): against a float64 evaluation of the attention on the values the cache
// holds, and rows of one pass against the same rows each alone (bit for bit: a DFlash verify row
// attends like the decoded row). Cases: BF16 and FP8 (scaled) caches, head dims 16 and 128,
// groups of 1 to 16 query heads, a paged pool and a sliding-window ring, a sink logit, the
// per-head and per-element gates, non-causal block ends (kend), one split (the output written by
// the attention) and grids of 16 and 64 splits (rows of up to 9,003 keys, 18 splits); and
// attention_decode_tc_qk (the q/k norm, RoPE and K/V write inside the
// launch) bit for bit against qk_norm_rope_store + attention_decode_tc. Built and run by
// kernels/emu/run.sh; exit status 0 = pass.
#include "cuda_emu.h"

#include "kernels.inc"

#include "emu_test.h"

struct Case {
    bool fp8;
    int hd, G, window, P, nsplit;
    bool sink, kend, ring;
    int gate_mode;
    unsigned seed;
};

template <typename KV>
static bool run(const Case& c) {
    std::mt19937 rng(c.seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int nkv = 2, nh = c.G * nkv, hd = c.hd, R = 3;
    const int qw = nh * hd, kvw = nkv * hd;
    // Keys 0 .. P + R - 1 are in the cache (the rows' own keys written before the attention);
    // with kend the rows see up to the block's end P + R - 1 (non-causal draft block).
    const int keys = c.P + R;
    const int ps = c.ring ? 1 : 16;
    const int max_pages = c.ring ? c.window + 5 : (keys + ps - 1) / ps + 3;
    const int slots = max_pages * ps;
    const float kscale = c.fp8 ? 0.5f : 1.f, vscale = c.fp8 ? 0.25f : 1.f;
    KV* kc = emu_alloc<KV>((size_t)slots * kvw);
    KV* vc = emu_alloc<KV>((size_t)slots * kvw);
    int* bt = emu_alloc<int>(max_pages);
    for (int i = 0; i < max_pages; i++) bt[i] = (i * 37 + 5) % max_pages;  // scattered (37 is prime to the sizes used)
    // A ring keeps only the last max_pages positions: fill those (a pool: all).
    for (int t = std::max(0, keys - slots); t < keys; t++) {
        size_t base = ((size_t)bt[(t / ps) % max_pages] * ps + t % ps) * kvw;
        for (int i = 0; i < kvw; i++) {
            float kv = nd(rng), vv = nd(rng);
            if (c.fp8) {
                kc[base + i] = (KV)emu_f2e4m3(kv);
                vc[base + i] = (KV)emu_f2e4m3(vv);
            } else {
                kc[base + i] = (KV)f2bf(kv);
                vc[base + i] = (KV)f2bf(vv);
            }
        }
    }
    // R rows at positions P .. P + R - 1: q (already normed and rotated) and the gate inputs.
    const int ldq = qw + 3;  // odd: rows of q are not 8-byte aligned
    const int ldg = c.gate_mode == 2 ? qw : nh;
    float* q = emu_alloc<float>((size_t)R * ldq);
    float* gin = emu_alloc<float>((size_t)R * ldg);
    for (int i = 0; i < R * ldq; i++) q[i] = nd(rng);
    for (int i = 0; i < R * ldg; i++) gin[i] = nd(rng);
    float* sink = c.sink ? emu_alloc<float>(nh) : nullptr;
    if (sink)
        for (int h = 0; h < nh; h++) sink[h] = 0.5f * nd(rng);
    int* pos = emu_alloc<int>(R);
    int* seqrow = emu_alloc<int>(R);
    int* kend = c.kend ? emu_alloc<int>(R) : nullptr;
    for (int r = 0; r < R; r++) {
        pos[r] = c.P + r;
        if (kend) kend[r] = keys;
    }
    const float scale = (float)((1.0 / std::sqrt((double)hd)) * kscale);
    const int nsplit = c.nsplit;
    float* part = emu_alloc<float>((size_t)R * nh * nsplit * (hd + 2));
    bool ok = true;
    // One pass over rows r0 .. r0 + rows - 1.
    auto pass = [&](int r0, int rows, float* out) {
        const float* qq = q + (size_t)r0 * ldq;
        const float* gg = gin + (size_t)r0 * ldg;
        const int* pp = pos + r0;
        const int* sr = seqrow + r0;
        const int* ke = kend ? kend + r0 : nullptr;
        float* o = out + (size_t)r0 * qw;
        ok &= emu_launch({(unsigned)rows, (unsigned)nkv, (unsigned)nsplit}, 128, [&] {
            if constexpr (sizeof(KV) == 1)
                attention_decode_tc_fp8(qq, ldq, o, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, c.window, sink, gg, ldg, c.gate_mode,
                                 scale, vscale, nsplit, part, ke);
            else
                attention_decode_tc(qq, ldq, o, qw, kc, vc, pp, sr, bt, max_pages, ps, nh, nkv, hd, c.window, sink, gg, ldg, c.gate_mode, scale,
                             vscale, nsplit, part, ke);
        }, 8);
        if (nsplit > 1) {
            ok &= emu_launch({(unsigned)rows, (unsigned)nh, 1}, (unsigned)std::max(32, hd), [&] {
                if (nsplit > 16)
                    attention_decode_tc_merge64(part, nsplit, o, qw, nh, hd, sink, gg, ldg, c.gate_mode, pp, c.window, ke, vscale);
                else
                    attention_decode_tc_merge16(part, nsplit, o, qw, nh, hd, sink, gg, ldg, c.gate_mode, pp, c.window, ke, vscale);
            });
        }
    };
    float* o3 = emu_alloc<float>((size_t)R * qw);
    float* o1 = emu_alloc<float>((size_t)R * qw);
    for (size_t i = 0; i < (size_t)R * qw; i++) o3[i] = o1[i] = NAN;  // every element must be written
    pass(0, R, o3);
    for (int r = 0; r < R; r++) pass(r, 1, o1);
    bool same = same_bits("3 rows vs each alone", o3, o1, (size_t)R * qw);
    double err = 0, mag = 0;
    for (int r = 0; r < R; r++) {
        int p = c.P + r;
        int lo = c.window > 0 ? std::max(0, p + 1 - c.window) : 0;
        int last = p;
        if (kend) {
            last = kend[r] - 1;
            if (c.window > 0) last = std::min(last, p + c.window - 1);
        }
        for (int h = 0; h < nh; h++) {
            std::vector<double> o(hd);
            const float* gr = gin + (size_t)r * ldg;
            double gh = std::log1p(std::exp((double)gr[h]));
            ref_attention(q + (size_t)r * ldq + h * hd, kc, vc, bt, ps, kvw, h / c.G, hd, lo, last, scale,
                          sink ? (double)sink[h] : -INFINITY, c.gate_mode == 1 ? gh : 1.0, vscale, o.data(), max_pages);
            for (int d = 0; d < hd; d++) {
                double ref = o[d];
                if (c.gate_mode == 2) ref *= std::log1p(std::exp((double)gr[h * hd + d]));
                double got = o3[(size_t)r * qw + h * hd + d];
                err = std::isnan(got) ? INFINITY : std::max(err, std::fabs(ref - got));
                mag = std::max(mag, std::fabs(ref));
            }
        }
    }
    // attention_decode_tc_qk (decode steps: every row alone in its sequence, causal): from the raw
    // q | k | v | gate rows, each row alone in order, against qk_norm_rope_store + attention_decode_tc on
    // the same rows: the same output, normed q and cache bits.
    bool same_qk = true;
    if (!c.kend) {
        const int half = hd / 4, ldr = qw + 2 * kvw + nh;
        const float eps = 1e-6f, attn_factor = 1.1f;
        float* raw = emu_alloc<float>((size_t)R * ldr);
        for (int i = 0; i < R * ldr; i++) raw[i] = nd(rng);
        const QkNorm nrm = make_qk_norm(rng, hd, half);
        const float *qn_w = nrm.qn_w, *kn_w = nrm.kn_w, *inv_freq = nrm.inv_freq;
        const size_t cn = (size_t)slots * kvw;
        std::vector<KV> k0(kc, kc + cn), v0(vc, vc + cn);
        float* qa = emu_alloc<float>((size_t)R * ldr);
        float* oa = emu_alloc<float>((size_t)R * qw);
        float* ob = emu_alloc<float>((size_t)R * qw);
        for (size_t i = 0; i < (size_t)R * qw; i++) oa[i] = ob[i] = NAN;
        std::memcpy(qa, raw, 4 * (size_t)R * ldr);
        for (int r = 0; r < R; r++) {
            float* x = qa + (size_t)r * ldr;
            ok &= emu_launch({1, (unsigned)ceil_div(nh + nkv, 4), 1}, 128, [&] {
                if constexpr (sizeof(KV) == 1)
                    qk_norm_rope_store_fp8(x, ldr, x + qw, x + qw + kvw, ldr, qn_w, kn_w, inv_freq, half, attn_factor, eps, pos + r,
                                          seqrow + r, bt, max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale,
                                          1.f / vscale);
                else
                    qk_norm_rope_store(x, ldr, x + qw, x + qw + kvw, ldr, qn_w, kn_w, inv_freq, half, attn_factor, eps, pos + r,
                                      seqrow + r, bt, max_pages, ps, kc, vc, nh, nkv, hd, nullptr, nullptr, 1.f / kscale, 1.f / vscale);
            });
            ok &= emu_launch({1, (unsigned)nkv, (unsigned)nsplit}, 128, [&] {
                if constexpr (sizeof(KV) == 1)
                    attention_decode_tc_fp8(x, ldr, oa + (size_t)r * qw, qw, kc, vc, pos + r, seqrow + r, bt, max_pages, ps, nh, nkv, hd,
                                     c.window, sink, x + qw + 2 * kvw, ldr, 1, scale, vscale, nsplit, part, nullptr);
                else
                    attention_decode_tc(x, ldr, oa + (size_t)r * qw, qw, kc, vc, pos + r, seqrow + r, bt, max_pages, ps, nh, nkv, hd, c.window,
                                 sink, x + qw + 2 * kvw, ldr, 1, scale, vscale, nsplit, part, nullptr);
            }, 8);
            if (nsplit > 1)
                ok &= emu_launch({1, (unsigned)nh, 1}, (unsigned)std::max(32, hd), [&] {
                    attention_decode_tc_merge16(part, nsplit, oa + (size_t)r * qw, qw, nh, hd, sink, x + qw + 2 * kvw, ldr, 1, pos + r, c.window,
                                       nullptr, vscale);
                });
        }
        std::vector<KV> ka(kc, kc + cn), va(vc, vc + cn);
        std::memcpy((void*)kc, k0.data(), sizeof(KV) * cn);
        std::memcpy((void*)vc, v0.data(), sizeof(KV) * cn);
        // The _qk kernels' arguments for row r of raw, output rows at o.
#define TCQK_ARGS(o) x, ldr, o + (size_t)r * qw, qw, kc, vc, pos + r, seqrow + r, bt, max_pages, ps, nh, nkv, hd, c.window, sink, \
    x + qw + 2 * kvw, ldr, 1, scale, vscale, nsplit, part, x + qw, x + qw + kvw, ldr, qn_w, kn_w, inv_freq, half, attn_factor, eps, \
    1.f / kscale, 1.f / vscale
        for (int r = 0; r < R; r++) {
            const float* x = raw + (size_t)r * ldr;
            ok &= emu_launch({1, (unsigned)nkv, (unsigned)nsplit}, 128, [&] {
                if constexpr (sizeof(KV) == 1)
                    attention_decode_tc_qk_fp8(TCQK_ARGS(ob));
                else
                    attention_decode_tc_qk(TCQK_ARGS(ob));
            }, 8);
            if (nsplit > 1)
                ok &= emu_launch({1, (unsigned)nh, 1}, (unsigned)std::max(32, hd), [&] {
                    attention_decode_tc_merge16(part, nsplit, ob + (size_t)r * qw, qw, nh, hd, sink, x + qw + 2 * kvw, ldr, 1, pos + r, c.window,
                                       nullptr, vscale);
                });
        }
        same_qk = same_bits("attention_decode_tc_qk vs qk_norm_rope_store + attention_decode_tc", oa, ob, (size_t)R * qw) &&
                  std::memcmp(ka.data(), kc, sizeof(KV) * cn) == 0 && std::memcmp(va.data(), vc, sizeof(KV) * cn) == 0;
        if constexpr (sizeof(KV) == 2) {
            // attention_decode_tc_qk_3stage (three K/V steps a warp in flight): the same bits as
            // attention_decode_tc_qk, output and cache.
            const char* n3 = "attention_decode_tc_qk_3stage";
            std::memcpy((void*)kc, k0.data(), sizeof(KV) * cn);
            std::memcpy((void*)vc, v0.data(), sizeof(KV) * cn);
            float* o3 = emu_alloc<float>((size_t)R * qw);
            for (size_t i = 0; i < (size_t)R * qw; i++) o3[i] = NAN;
            for (int r = 0; r < R; r++) {
                const float* x = raw + (size_t)r * ldr;
                ok &= emu_launch({1, (unsigned)nkv, (unsigned)nsplit}, 128,
                                 [&] { attention_decode_tc_qk_3stage(TCQK_ARGS(o3)); }, 8);
                if (nsplit > 1)
                    ok &= emu_launch({1, (unsigned)nh, 1}, (unsigned)std::max(32, hd), [&] {
                        attention_decode_tc_merge16(part, nsplit, o3 + (size_t)r * qw, qw, nh, hd, sink, x + qw + 2 * kvw, ldr, 1,
                                                    pos + r, c.window, nullptr, vscale);
                    });
            }
            bool same3 = same_bits("attention_decode_tc_qk_3stage vs attention_decode_tc_qk", o3, ob, (size_t)R * qw) &&
                         std::memcmp(ka.data(), kc, sizeof(KV) * cn) == 0 && std::memcmp(va.data(), vc, sizeof(KV) * cn) == 0;
            std::printf("%s = attention_decode_tc_qk (output, K and V cache): %s\n", n3, same3 ? "yes" : "NO");
            same_qk &= same3;
        }
#undef TCQK_ARGS
        // Leave the cache as the reference below read it.
        std::memcpy((void*)kc, k0.data(), sizeof(KV) * cn);
        std::memcpy((void*)vc, v0.data(), sizeof(KV) * cn);
    }
    double rel = err / mag;
    bool close = rel < 2e-5;
    std::printf("attention_decode_tc (%s, hd %d, %d heads a KV head, %s%s, %d + 3 keys%s%s, %d splits, gate %d): 3 rows = each alone: %s; "
                "_qk = qk_norm_rope_store + attention_decode_tc: %s; vs float64 %.1e %s\n",
                c.fp8 ? "FP8" : "BF16", hd, c.G, c.window ? "window " : "full", c.window ? std::to_string(c.window).c_str() : "",
                c.P, c.ring ? ", ring" : "", c.kend ? ", kend" : "", nsplit, c.gate_mode, same ? "yes" : "NO",
                c.kend ? "-" : same_qk ? "yes" : "NO", rel, close ? "ok" : "TOO LARGE");
    return ok && same && same_qk && close;
}

int main() {
    emu_init(size_t(64) << 20);
    const Case cases[] = {
        // fp8, hd, G, window, P, nsplit, sink, kend, ring, gate, seed
        {false, 128, 8, 0, 300, 16, false, false, false, 1, 1},   // XS-2.1 sliding-layer group, full attention
        {false, 128, 6, 0, 700, 16, true, false, false, 1, 2},    // XS-2.1 full-layer group, sink
        {false, 128, 8, 0, 2050, 64, false, false, false, 1, 3},  // a grid of 64 splits (attention_decode_tc_merge64), 16 used
        {false, 128, 8, 0, 9000, 64, true, false, false, 1, 13},  // 18 splits of ~500 keys (8 steps a warp)
        {false, 128, 8, 200, 700, 16, true, false, true, 1, 4},   // sliding window on a ring (wraps)
        {true, 128, 8, 0, 300, 16, true, false, false, 1, 5},     // FP8 cache
        {true, 128, 6, 200, 500, 16, false, false, true, 2, 6},   // FP8, window, ring, per-element gate
        {false, 16, 2, 0, 150, 16, false, false, false, 1, 7},    // the fixtures' head dim
        {false, 16, 16, 8, 40, 16, true, false, true, 0, 8},      // 16 heads a KV head, tiny window, no gate
        {false, 64, 4, 0, 5, 16, true, false, false, 1, 9},       // fewer keys than one split
        {false, 128, 8, 0, 300, 1, true, false, false, 1, 10},    // one split: the output written directly
        {false, 128, 8, 64, 200, 16, false, true, true, 1, 11},   // non-causal block (kend) with a window
        {false, 32, 1, 0, 90, 16, false, true, false, 1, 12},     // kend, one head a KV head
    };
    bool ok = true;
    for (const Case& c : cases) ok &= c.fp8 ? run<unsigned char>(c) : run<unsigned short>(c);
    std::printf(ok ? "attention_decode_tc emulation: PASS\n" : "attention_decode_tc emulation: FAIL\n");
    return ok ? 0 : 1;
}
