// The prefill MoE in the CPU emulation (cuda_emu.h): moe_group (slots grouped by expert, 64-slot
// tiles, the folded shared expert placed by position), then the NVFP4 grouped expert GEMMs
// (gate/up with SiLU in the epilogue and padding skipped per 16 rows, down 128 wide); every
// slot's output against float64. Built and run by kernels/emu/run.sh; exit status 0 = pass.
#include "cuda_emu.h"

#include "kernels.inc"

#include "emu_test.h"

int main() {
    emu_init(size_t(256) << 20);
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int M = 40, H = 256, I = 128, E = 16, K = 4, KK = K + 1, NE = E + 1, S = M * KK;
    Fp4Stack gate = make_fp4_stack(rng, NE, I, H), up = make_fp4_stack(rng, NE, I, H), down = make_fp4_stack(rng, NE, H, I);
    float* x = emu_alloc<float>((size_t)M * H);
    for (int i = 0; i < M * H; i++) x[i] = nd(rng);
    int* ids = emu_alloc<int>(S);
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) ids[m * KK + k] = (3 * m + 4 * k + (m % 3)) % E;  // distinct in a row
        ids[m * KK + K] = E;                                                          // the shared expert
    }
    int *ge = emu_alloc<int>(S), *gs = emu_alloc<int>(S), *gc = emu_alloc<int>(S), *perm = emu_alloc<int>(S),
        *meta = emu_alloc<int>(4);
    const int max_tiles = S / 64 + std::min(S, NE) + 1;
    int* tiles = emu_alloc<int>(2 * (max_tiles + 1));
    bool ok = emu_launch({1, 1, 1}, (unsigned)std::min(32, std::max(1, ceil_div(S, 32))) * 32,
                         [&] { moe_group(ids, S, NE, ge, gs, gc, perm, meta, tiles, KK, E); });
    unsigned short* xs2 = emu_alloc<unsigned short>((size_t)2 * M * H);
    ok &= emu_launch({(unsigned)ceil_div(H, 256), (unsigned)M, 1}, 256, [&] { split_bf16(x, H, M, H, xs2, 1); });

    // The NVFP4 expert GEMMs (SiLU(gate) * up in the gate/up epilogue, 128-wide down tiles,
    // padding warps skipping their mma).
    std::vector<std::vector<float>> outs;
    {
        unsigned short* act = emu_alloc<unsigned short>((size_t)2 * S * I);
        float* out = emu_alloc<float>((size_t)S * H);
        ok &= emu_launch({(unsigned)ceil_div(2 * I, 64), (unsigned)max_tiles, 1}, 128, [&] {
            moe_gemm_gate_up_fp4_silu(gate.w, gate.s, gate.inv, up.w, up.s, up.inv, xs2, (size_t)M * H, H, I, KK, ge, gs, gc, perm,
                                      meta, tiles, (float*)act, (size_t)S * I);
        });
        ok &= emu_launch({(unsigned)ceil_div(H, 128), (unsigned)max_tiles, 1}, 128, [&] {
            moe_gemm_down_fp4_wide(down.w, down.s, down.inv, act, (size_t)S * I, H, I, ge, gs, gc, perm, meta, tiles, out);
        });
        outs.emplace_back(out, out + (size_t)S * H);
    }
    // float64: every slot's expert on its row.
    std::vector<double> ref((size_t)S * H);
    double mag = 0;
    for (int s = 0; s < S; s++) {
        int e = ids[s], m = s / KK;
        std::vector<double> a(I);
        for (int j = 0; j < I; j++) {
            double g = 0, u = 0;
            for (int i = 0; i < H; i++) {
                g += gate.at(e, j, i) * x[(size_t)m * H + i];
                u += up.at(e, j, i) * x[(size_t)m * H + i];
            }
            a[j] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int n = 0; n < H; n++) {
            double d = 0;
            for (int j = 0; j < I; j++) d += down.at(e, n, j) * a[j];
            ref[(size_t)s * H + n] = d;
            mag = std::max(mag, std::fabs(d));
        }
    }
    const char* names[1] = {"moe_gemm_gate_up_fp4_silu + moe_gemm_down_fp4_wide"};
    for (int v = 0; v < 1; v++) {
        double err = 0;
        for (size_t i = 0; i < ref.size(); i++) err = std::max(err, std::fabs(ref[i] - outs[v][i]));
        bool close = err / mag < 1e-4;
        std::printf("prefill MoE %s, %d rows x %d slots in %d groups: vs float64 %.1e %s\n", names[v], M, KK, meta[0], err / mag,
                    close ? "ok" : "TOO LARGE");
        ok &= close;
    }
    std::printf(ok ? "prefill MoE emulation: PASS\n" : "prefill MoE emulation: FAIL\n");
    return ok ? 0 : 1;
}
