// A CPU emulation of the CUDA features laguna's kernels use, so that kernels/cu sources build
// with g++ and run in tests on machines without a GPU (CI). It checks logic — indices, the
// order of every floating-point operation, barriers — not speed and not the GPU's math library:
// expf / rsqrtf / tanhf are the host's, so compare emulated kernels with each other (same
// source expressions give the same bits on both sides) and with an independent reference at a
// tolerance, never with GPU output.
//
// Model: each block of a launch is a forked process (its `static` = __shared__ memory is its own;
// "device" buffers live in one MAP_SHARED mapping made before the fork), each thread an OS
// thread. __syncthreads / __syncwarp are std::barrier waits (threads that return drop out, as
// exited CUDA threads do); warp shuffles and votes exchange through a per-warp slot array.
// All blocks of a launch run at once, so grid-wide barriers work. 1-D blocks only.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct EmuDim {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuDim threadIdx;
inline EmuDim blockIdx, blockDim, gridDim;  // per process (block) after the fork

struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline long long __double_as_longlong(double d) { long long u; std::memcpy(&u, &d, 8); return u; }
inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return v ? __builtin_ctz((unsigned)v) + 1 : 0; }
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y:x} (x = bytes 0..3).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// cosf, expf, fmaf, log1pf, sinf, tanhf: the C library's (<cmath> declares them globally).

template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}
[[noreturn]] inline void __trap() { std::fprintf(stderr, "emu: __trap()\n"); std::abort(); }
template <class T> inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicMax(T* p, T v) {
    T o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return o;
}
template <class T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicMin(T* p, T v) {
    T o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (o > v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return o;
}
// The GPU timer as kernels see it: 64 times slower than real time, so a kernel's 2 s barrier
// timeout is ~2 minutes here (emulated blocks share a few CPU cores).
inline unsigned long long emu_host_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
               .count() /
           64;
}
inline void emu_host_yield() { std::this_thread::yield(); }

// ---- block and warp state (per process) ----
struct EmuWarp {
    std::barrier<> bar;
    unsigned long long slot[32];
    unsigned frag[32][10];  // mma operands of every lane
    explicit EmuWarp(int n) : bar(n) {}
};
struct EmuBlock {
    std::barrier<> bar;
    std::vector<std::unique_ptr<EmuWarp>> warps;
    explicit EmuBlock(int n) : bar(n) {
        for (int w = 0; w < (n + 31) / 32; w++) warps.emplace_back(new EmuWarp(std::min(32, n - 32 * w)));
    }
};
inline EmuBlock* emu_block = nullptr;
inline EmuWarp& emu_warp() { return *emu_block->warps[threadIdx.x / 32]; }
inline void __syncthreads() { emu_block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar.arrive_and_wait(); }
template <class T> inline T emu_exchange(T v, int src) {
    EmuWarp& w = emu_warp();
    int l = threadIdx.x & 31;
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    w.slot[l] = b;
    w.bar.arrive_and_wait();
    unsigned long long r = w.slot[src & 31];
    w.bar.arrive_and_wait();
    T out;
    std::memcpy(&out, &r, sizeof(T));
    return out;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_exchange(v, (threadIdx.x & 31) ^ o); }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_exchange(v, src); }
template <class T> inline T __shfl_up_sync(unsigned, T v, int d) {
    int l = threadIdx.x & 31;
    T r = emu_exchange(v, l >= d ? l - d : l);
    return r;
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int d) {
    int l = threadIdx.x & 31;
    return emu_exchange(v, l + d < 32 ? l + d : l);
}
// ldmatrix .x4 (.trans): lanes 8i..8i+7 give the row addresses of 8x8 b16 matrix i; lane L gets
// in r_i the pair (row L/4, columns 2(L%4), 2(L%4)+1) of matrix i, or of its transpose.
inline void emu_ldsm_x4(const unsigned short* p, bool trans, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    EmuWarp& w = emu_warp();
    int l = threadIdx.x & 31;
    w.slot[l] = (unsigned long long)(uintptr_t)p;
    w.bar.arrive_and_wait();
    unsigned r[4];
    for (int i = 0; i < 4; i++) {
        const unsigned short* a;
        const unsigned short* b;
        unsigned lo, hi;
        if (!trans) {
            a = (const unsigned short*)(uintptr_t)w.slot[8 * i + l / 4];
            lo = a[2 * (l % 4)];
            hi = a[2 * (l % 4) + 1];
        } else {
            a = (const unsigned short*)(uintptr_t)w.slot[8 * i + 2 * (l % 4)];
            b = (const unsigned short*)(uintptr_t)w.slot[8 * i + 2 * (l % 4) + 1];
            lo = a[l / 4];
            hi = b[l / 4];
        }
        r[i] = lo | (hi << 16);
    }
    w.bar.arrive_and_wait();
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
// mma.sync m16n8k16 row.col with f32 accumulation and PTX's fragment layout (g = lane / 4,
// t = lane % 4): A a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t.., n g),
// b1 (k 2t+8.., n g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). Each output is
// C + the 16 products added by f32 fmas in k order (the tensor core's own order and precision
// are not modelled: compare emulated kernels with each other). `half` turns a 16-bit operand
// into its value (BF16 or f16).
template <class Half>
inline void emu_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1, Half half) {
    EmuWarp& w = emu_warp();
    int l = threadIdx.x & 31;
    unsigned* f = w.frag[l];
    f[0] = a0; f[1] = a1; f[2] = a2; f[3] = a3; f[4] = b0; f[5] = b1;
    w.bar.arrive_and_wait();
    auto hv = [&](unsigned v, int hi) { return half((unsigned short)(hi ? v >> 16 : v & 0xffffu)); };
    auto A = [&](int row, int k) {
        int lane = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return hv(w.frag[lane][reg], k % 2);
    };
    auto B = [&](int k, int col) {
        int lane = col * 4 + (k % 8) / 2, reg = 4 + (k >= 8 ? 1 : 0);
        return hv(w.frag[lane][reg], k % 2);
    };
    int g = l / 4, t = l % 4;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc = fmaf(A(row, k), B(k, col), acc);
        out[i] = acc;
    }
    w.bar.arrive_and_wait();
    for (int i = 0; i < 4; i++) c[i] = out[i];
}
// f32.bf16.bf16.f32
inline void emu_mma_bf16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    emu_mma(c, a0, a1, a2, a3, b0, b1, [](unsigned short h) {
        unsigned u = (unsigned)h << 16;
        float x;
        std::memcpy(&x, &u, 4);
        return x;
    });
}
// IEEE half <-> f32 on the host (round to nearest even, subnormals kept), for the f16 forms of
// moe/experts_tc.cu's tensor-core expert dot (moe_tc): cvt.rn.f16.f32, cvt.f32.f16, mul.rn.f16x2.
inline float emu_h2f(unsigned short h) {
    unsigned s = h >> 15, e = (h >> 10) & 31u, m = h & 1023u;
    float v = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m + 1024), (int)e - 25);
    return s ? -v : v;
}
inline unsigned short emu_f2h(float f) {
    unsigned short sign = std::signbit(f) ? 0x8000 : 0;
    if (std::isnan(f)) return sign | 0x7e00;
    float a = std::fabs(f);
    if (a >= 65520.f) return sign | 0x7c00;
    if (a < 0x1p-14f) return sign | (unsigned short)std::nearbyint(a * 0x1p24f);  // 1024 -> the least normal
    int e;
    std::frexp(a, &e);
    unsigned mi = (unsigned)std::nearbyint(std::ldexp(a, 11 - e));
    int E = e + 14;
    if (mi == 2048) {
        mi = 1024;
        E++;
    }
    return sign | (unsigned short)(E << 10) | (unsigned short)(mi - 1024);
}
// f32.f16.f16.f32 (moe/experts_tc.cu's moe_tc forms).
inline void emu_mma_f16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    emu_mma(c, a0, a1, a2, a3, b0, b1, emu_h2f);
}
// f32 -> OCP E4M3FN, round to nearest even, saturated to +-448 (cvt.rn.satfinite; NaN -> 0x7f).
inline unsigned char emu_f2e4m3(float x) {
    if (std::isnan(x)) return 0x7f;
    unsigned char sign = std::signbit(x) ? 0x80 : 0;
    double a = std::fabs((double)x);
    int best = 0;
    double bd = 1e300;
    for (int c = 0; c < 0x7f; c++) {  // 0x7f is NaN
        int e = c >> 3, m = c & 7;
        double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
        double d = std::fabs(v - a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return (unsigned char)(sign | best);
}
// Intrinsics with explicit rounding: with -ffp-contract=off every host operation already rounds.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __ballot_sync(unsigned, int p) {
    EmuWarp& w = emu_warp();
    int l = threadIdx.x & 31;
    w.slot[l] = p ? 1 : 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)(w.slot[i] & 1) << i;
    w.bar.arrive_and_wait();
    return r;
}
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, p) == 0xffffffffu; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    unsigned r = v;
    for (int o = 1; o < 32; o <<= 1) r = std::max(r, __shfl_xor_sync(0xffffffffu, r, o));
    return r;
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    unsigned r = v;
    for (int o = 1; o < 32; o <<= 1) r = std::min(r, __shfl_xor_sync(0xffffffffu, r, o));
    return r;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0u; }
// The emulation runs a warp's lanes converged (every lane of a full warp reaches each warp
// operation, as the shuffles need), so the active mask is the whole warp.
inline unsigned __activemask() { return 0xffffffffu; }
inline unsigned __match_any_sync(unsigned, unsigned v) {
    EmuWarp& w = emu_warp();
    int l = threadIdx.x & 31;
    w.slot[l] = v;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)(w.slot[i] == v) << i;
    w.bar.arrive_and_wait();
    return r;
}

// ---- dynamic shared memory: the kernels' `extern __shared__ T name[]` (run.sh drops __shared__
// from those lines, so they name these arrays; one copy per emulated block = process) ----
alignas(16) inline float xs[1 << 16];
alignas(16) inline int shm[1 << 16];
alignas(16) inline float xsh[1 << 16];
alignas(16) inline float smem[1 << 16];
alignas(16) inline unsigned short fa_q[1 << 16];
alignas(16) inline unsigned short atc_s[1 << 16];

// ---- "device" memory: one shared mapping, bump-allocated before any launch ----
struct EmuHeap {
    char* base = nullptr;
    size_t cap = 0, used = 0;
};
inline EmuHeap emu_heap;
inline void emu_init(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { std::perror("mmap"); std::exit(2); }
    emu_heap.base = (char*)p;
    emu_heap.cap = bytes;
}
template <class T> inline T* emu_alloc(size_t n) {
    size_t b = (n * sizeof(T) + 255) & ~size_t(255);
    if (emu_heap.used + b > emu_heap.cap) { std::fprintf(stderr, "emu heap exhausted\n"); std::exit(2); }
    T* p = (T*)(emu_heap.base + emu_heap.used);
    emu_heap.used += b;
    std::memset((void*)p, 0, b);
    return p;
}

// Run `kernel` over grid x block, every block a process; returns false if any block failed
// (trap, abort, crash). `at_once`: how many blocks run at the same time (a kernel with grid-wide
// barriers needs the whole grid: pass 0 for all).
inline bool emu_launch(EmuDim grid, unsigned block, const std::function<void()>& kernel, unsigned at_once = 4) {
    std::vector<pid_t> kids;
    bool ok = true;
    auto reap = [&](size_t keep) {
        while (kids.size() > keep) {
            int st = 0;
            waitpid(kids.front(), &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
            kids.erase(kids.begin());
        }
    };
    unsigned gy = grid.y ? grid.y : 1, gz = grid.z ? grid.z : 1;
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                if (at_once) reap(at_once - 1);
                std::fflush(nullptr);
                pid_t pid = fork();
                if (pid < 0) { std::perror("fork"); std::exit(2); }
                if (pid == 0) {
                    blockIdx = {x, y, z};
                    gridDim = {grid.x, gy, gz};
                    blockDim = {block, 1, 1};
                    emu_block = new EmuBlock((int)block);
                    std::vector<std::thread> ts;
                    for (unsigned t = 0; t < block; t++)
                        ts.emplace_back([t, &kernel] {
                            threadIdx = {t, 0, 0};
                            kernel();
                            // An exited thread no longer takes part in barriers.
                            emu_warp().bar.arrive_and_drop();
                            emu_block->bar.arrive_and_drop();
                        });
                    for (auto& th : ts) th.join();
                    std::fflush(nullptr);
                    _exit(0);
                }
                kids.push_back(pid);
            }
    reap(0);
    return ok;
}
