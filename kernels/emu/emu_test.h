// Helpers shared by the emulated kernel tests (include after kernels.inc): launch arithmetic,
// bit comparison, the model's FP8 / E2M1 values, and random NVFP4 expert stacks with a float64
// decode of every weight.
#pragma once
#include <random>

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Whether a[0..n) and b[0..n) are the same bits; prints the first difference.
static bool same_bits(const char* what, const float* a, const float* b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (std::memcmp(&a[i], &b[i], 4) != 0) {
            std::printf("  %s differs at %zu: %.9g vs %.9g\n", what, i, a[i], b[i]);
            return false;
        }
    return true;
}

// OCP FP8 E4M3FN (0x7f / 0xff are NaN and never stored) and E2M1 values, as the model defines them.
static double e4m3_val(unsigned char b) {
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    return b & 0x80 ? -v : v;
}
static double e2m1_val(unsigned c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * mag[c & 7];
}

// [n, rows, cols] NVFP4 weights in "device" memory: codes (2 a byte, element 2i in the low
// nibble), E4M3 block scales (one per 16 columns), an f32 global scale per matrix.
struct Fp4Stack {
    unsigned char* w;
    unsigned char* s;
    float* inv;
    int rows, cols, n;
    double at(int e, int r, int c) const {
        unsigned char b = w[((size_t)e * rows + r) * (cols / 2) + c / 2];
        unsigned code = c % 2 ? b >> 4 : b & 15;
        return e2m1_val(code) * e4m3_val(s[((size_t)e * rows + r) * (cols / 16) + c / 16]) * inv[e];
    }
};
// Random codes, scales 0x30..0x3f (0.5..1.875) and global scales in [0.02, 0.05); 8 bytes a
// xorshift step (XS-sized stacks are hundreds of MB).
static Fp4Stack make_fp4_stack(std::mt19937& rng, int n, int rows, int cols) {
    Fp4Stack st{emu_alloc<unsigned char>((size_t)n * rows * cols / 2), emu_alloc<unsigned char>((size_t)n * rows * cols / 16),
                emu_alloc<float>(n), rows, cols, n};
    unsigned long long r = rng() | 1ull;
    auto next = [&] {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        return r;
    };
    for (size_t i = 0; i < (size_t)n * rows * cols / 2; i += 8) {
        unsigned long long v = next();
        std::memcpy(st.w + i, &v, 8);
    }
    for (size_t i = 0; i < (size_t)n * rows * cols / 16; i += 8) {
        unsigned long long v = (next() & 0x0f0f0f0f0f0f0f0full) | 0x3030303030303030ull;
        std::memcpy(st.s + i, &v, 8);
    }
    std::uniform_real_distribution<float> g(0.02f, 0.05f);
    for (int e = 0; e < n; e++) st.inv[e] = g(rng);
    return st;
}

// Attention of one query head in float64: q (hd values) over keys lo..p (the last key it sees) of KV head kh in the
// paged cache (the stored values: BF16, or E4M3 with FP8), softmax with the sink logit, then
// times the V scale and the gate. o: hd outputs. max_pages: the block table's length (a ring:
// position t in page (t / ps) % max_pages).
template <typename KV>
static void ref_attention(const float* q, const KV* kc, const KV* vc, const int* bt, int ps, int kvw, int kh, int hd, int lo, int p,
                          double scale, double sink, double gate, double vscale, double* o, int max_pages = 1 << 30) {
    auto val = [](const KV* c, size_t i) {
        if constexpr (sizeof(KV) == 1) return e4m3_val((unsigned char)c[i]);
        else return (double)bf2f((bf16_t)c[i]);
    };
    auto row = [&](int t) { return ((size_t)bt[(t / ps) % max_pages] * ps + t % ps) * kvw + kh * hd; };
    std::vector<double> sc;
    double mx = sink;
    for (int t = lo; t <= p; t++) {
        double a = 0;
        for (int d = 0; d < hd; d++) a += (double)q[d] * val(kc, row(t) + d);
        sc.push_back(a * scale);
        mx = std::max(mx, a * scale);
    }
    double den = std::exp(sink - mx);
    for (double& v : sc) den += (v = std::exp(v - mx));
    for (int d = 0; d < hd; d++) {
        double a = 0;
        for (int t = lo; t <= p; t++) a += sc[t - lo] * val(vc, row(t) + d);
        o[d] = a / den * vscale * gate;
    }
}

// q/k RMSNorm weights (1 + N(0, 0.1)) and the rotary inverse frequencies of `half` pairs (theta
// 10000) of a head of hd dims, in "device" memory.
struct QkNorm {
    float* qn_w;
    float* kn_w;
    float* inv_freq;
};
static QkNorm make_qk_norm(std::mt19937& rng, int hd, int half) {
    std::normal_distribution<float> nd(0.f, 1.f);
    QkNorm n{emu_alloc<float>(hd), emu_alloc<float>(hd), emu_alloc<float>(half)};
    for (int i = 0; i < hd; i++) {
        n.qn_w[i] = 1.f + 0.1f * nd(rng);
        n.kn_w[i] = 1.f + 0.1f * nd(rng);
    }
    for (int i = 0; i < half; i++) n.inv_freq[i] = std::pow(10000.f, -(float)i / half);
    return n;
}
