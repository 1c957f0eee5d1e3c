// Shared helpers for every laguna kernel. Header-free on purpose: NVRTC is the only dependency
// (no cuda_bf16.h); BF16 is handled as raw 16-bit patterns.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
typedef unsigned short bf16_t;
typedef unsigned char u8;
typedef unsigned int u32;

// Programmatic dependent launch (sm_90+; no-ops elsewhere and for launches without the PDL
// attribute). Every kernel starts with PDL_ENTRY: wait until the previous kernel in the stream has
// finished and its writes are visible, then let the next kernel be scheduled. The only work allowed
// before the wait is reading weights, which no kernel ever writes (the GEMVs issue their first
// weight loads there, so they stream while the previous kernel drains).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#ifdef LAGUNA_STAMP
__device__ __forceinline__ unsigned long long emu_ns();  // below
// Kernel timeline (`laguna bench` with LAGUNA_STAMP=1, which compiles every module with this
// defined, into their own cubins): thread 0 of every block of a kernel with PDL_ENTRY records the
// launch (%gridid), the time its wait returned, the time it left, its SM and block, and the name
// of the function PDL_ENTRY is in, as one 64-byte record of laguna_stamps. Never in a normal build.
#define STAMP_CAP (1u << 17)
__device__ unsigned long long laguna_stamps[STAMP_CAP * 8];
__device__ unsigned laguna_stamp_n;
struct StampGuard {
    unsigned long long tw;
    const char* fn;
    __device__ StampGuard(const char* f) : fn(f) { tw = emu_ns(); }
    __device__ ~StampGuard() {
        if (threadIdx.x | threadIdx.y | threadIdx.z) return;
        unsigned long long te = emu_ns(), gid;
        unsigned smid;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        unsigned i = atomicAdd(&laguna_stamp_n, 1u);
        if (i >= STAMP_CAP) return;
        unsigned long long* r = laguna_stamps + (size_t)i * 8;
        unsigned long long b = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
        r[0] = gid;
        r[1] = tw;
        r[2] = te;
        r[3] = ((unsigned long long)smid << 32) | (b & 0xffffffffull);
        unsigned long long w[4] = {0, 0, 0, 0};
        for (int k = 0; k < 32 && fn[k]; k++) w[k >> 3] |= (unsigned long long)(unsigned char)fn[k] << (8 * (k & 7));
        r[4] = w[0]; r[5] = w[1]; r[6] = w[2]; r[7] = w[3];
    }
};
#define STAMP() StampGuard laguna_stamp_guard_(__func__)
// The record's wait time taken again here (a wait later than the STAMP in the same scope).
#define STAMP_MARK() (laguna_stamp_guard_.tw = emu_ns())
// (Here PDL_ENTRY is three statements, the record living to the end of its scope: write it as a
// statement of the function's own scope, never as the body of an unbraced if.)
#define PDL_ENTRY() pdl_wait(); pdl_launch(); STAMP()
#else
#define STAMP() do {} while (0)
#define STAMP_MARK() do {} while (0)
#define PDL_ENTRY() do { pdl_wait(); pdl_launch(); } while (0)
#endif
// Ask for the 128-byte line at p to be brought into L2 (no register result, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// Weight loads that do not allocate in L1 (`ld.global.nc.L1::no_allocate`): streamed weights
// leave the L1 to the activations the blocks of an SM share. The same values as __ldg.
__device__ __forceinline__ uint4 ldg_na(const uint4* p) {
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
__device__ __forceinline__ uint2 ldg_na(const uint2* p) {
#if defined(__CUDA_ARCH__)
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
__device__ __forceinline__ u32 ldg_na(const u32* p) {
#if defined(__CUDA_ARCH__)
    u32 v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
__device__ __forceinline__ u8 ldg_na(const u8* p) {
#if defined(__CUDA_ARCH__)
    u32 v;
    asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return (u8)v;
#else
    return __ldg(p);
#endif
}
// __ldg as a volatile asm: kept in program order with the other volatile asms (mma.sync), where
// the compiler may issue an invariant load after an mma that waits on DRAM.
__device__ __forceinline__ float4 ldg_v(const float4* p) {
#if defined(__CUDA_ARCH__)
    float4 v;
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
// __ldg, or ldg_na when NA.
template <bool NA, typename T> __device__ __forceinline__ T ldg_w(const T* p) {
    if constexpr (NA) return ldg_na(p);
    else return __ldg(p);
}

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40); // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                     // round to nearest even
    return (bf16_t)(u >> 16);
}
// Two floats to a BF16 pair (lo in the low half), round to nearest even: one cvt on sm_80+ (the
// same bits as two f2bf for every non-NaN input).
__device__ __forceinline__ u32 bf2_pack(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16);
#endif
}
// Unpack 2 bf16 held in a 32-bit word (element 0 in the low half).
__device__ __forceinline__ float bflo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bfhi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// OCP FP8 E4M3FN as an unsigned NVFP4 block scale (sign bit ignored; 0x7f is NaN in the format
// and is rejected at load).
__device__ __forceinline__ float e4m3u(u8 b) {
    u32 e = (b >> 3) & 15u, m = b & 7u;
    if (e == 0) return (float)m * 0.001953125f; // m * 2^-9
    return __uint_as_float(((e + 120u) << 23) | (m << 20));
}
// E2M1 code (4 bits, sign in bit 3). The 3 magnitude bits placed at f32 bits 22..24 read as
// e2m1(c) * 2^-126 (codes 0/1 land in the subnormal range, which is exactly E2M1's own
// subnormal step), so one exact multiply by 2^126 gives the value: 5 instructions instead of ~9,
// same results (NVRTC keeps subnormals: no -ftz).
__device__ __forceinline__ float e2m1(u32 c) {
    return __uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)) * 0x1p126f;
}

// Shared-memory address of a generic pointer, and ldmatrix: four 8x8 BF16 tiles from shared
// memory (lanes 8i..8i+7 give the row addresses of tile i, 16-byte aligned) as mma fragments;
// .trans gives each lane a column pair instead of a row pair.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a = 0;
#if defined(__CUDA_ARCH__)
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
#endif
    return a;
}
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const bf16_t* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
#else
    emu_ldsm_x4(p, false, r0, r1, r2, r3);  // kernels/emu (NVRTC always defines __CUDA_ARCH__)
#endif
}
__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, const bf16_t* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
#else
    emu_ldsm_x4(p, true, r0, r1, r2, r3);
#endif
}

// 16 bytes global -> shared without registers; n = 0 zero-fills (nothing is read). Groups:
// commit closes the copies issued since the last commit; wait_group<N> waits until at most N
// groups are pending (then __syncthreads makes them visible to the block).
// (Host forms, for kernels/emu: a synchronous 16-byte copy, nothing to wait for.)
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
#else
__device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 n) {
    if (n) memcpy(dst, src, 16);
    else memset(dst, 0, 16);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait_group() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#endif

// The GPU's nanosecond timer and a GPU-scope acquire load (host forms for kernels/emu).
__device__ __forceinline__ unsigned long long emu_ns() {
    unsigned long long t;
#if defined(__CUDA_ARCH__)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#else
    t = emu_host_ns();
#endif
    return t;
}
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
    unsigned v;
#if defined(__CUDA_ARCH__)
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    emu_host_yield();  // spinning emulated blocks leave the CPU to the ones still working
#endif
    return v;
}
// A relaxed GPU-scope load (not hoisted out of a polling loop; several may be in flight).
__device__ __forceinline__ unsigned ld_relaxed_u32(const unsigned* p) {
    unsigned v;
#if defined(__CUDA_ARCH__)
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = __atomic_load_n(p, __ATOMIC_RELAXED);
    emu_host_yield();
#endif
    return v;
}
// A float store, relaxed at GPU scope when R (a value other blocks poll for), else plain.
template <bool R>
__device__ __forceinline__ void st_w(float* p, float v) {
#if defined(__CUDA_ARCH__)
    if (R) {
        asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(__float_as_uint(v)) : "memory");
        return;
    }
    *p = v;
#else
    if (R) __atomic_store_n(reinterpret_cast<unsigned*>(p), __float_as_uint(v), __ATOMIC_RELAXED);
    else *p = v;
#endif
}
__device__ __forceinline__ void red_release_add_u32(unsigned* p, unsigned v) {
#if defined(__CUDA_ARCH__)
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#endif
}
// How long grid_sync waits before it traps: 2 s on the GPU; 60 emulated seconds in kernels/emu,
// whose blocks share two CPU cores.
#if defined(__CUDA_ARCH__)
#define GRID_SYNC_TIMEOUT_NS 2000000000ull
#else
#define GRID_SYNC_TIMEOUT_NS 60000000000ull
#endif
// Grid-wide barrier for a grid whose blocks are all resident. The first block (0, 0, 0) adds 2^31 -
// (n - 1), the others 1: the word's bit 31 flips when the last block arrives and its low bits come
// back to where they were (cooperative groups' scheme), so it never needs a reset. Arrival is a
// release reduction (no value comes back, so no round trip to wait for) and the wait an acquire
// load: thread 0 keeps the bit it waits to see change in `phase` (read once at the kernel's start,
// it cannot flip before every block has arrived), then flips its copy.
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned& phase) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned nb = gridDim.x * gridDim.y * gridDim.z;
        bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;  // one block of any grid shape
        unsigned add = first ? 0x80000000u - (nb - 1u) : 1u;
        red_release_add_u32(bar, add);
        unsigned long long t0 = emu_ns(), t;
        while ((ld_acquire_u32(bar) & 0x80000000u) == phase) {
            // A block that never arrives (the grid was not all resident) ends the launch with an
            // error instead of hanging the GPU.
            t = emu_ns();
            if (t - t0 > GRID_SYNC_TIMEOUT_NS) __trap();
        }
        phase ^= 0x80000000u;
    }
    __syncthreads();
}
// grid_sync's arrival without its wait, for a block with nothing to do after the barrier: it may
// exit at once (the word ends as if it had waited), so its SM is free for the next launch sooner.
__device__ __forceinline__ void grid_arrive(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned nb = gridDim.x * gridDim.y * gridDim.z;
        bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
        red_release_add_u32(bar, first ? 0x80000000u - (nb - 1u) : 1u);
    }
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum for blockDim.x <= 1024 (multiple of 32); `sh` holds >= 32 floats. Every thread
// gets the result. The order of additions is fixed by blockDim, never by the data.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = 0.f;
    if (w == 0) {
        t = lane < nw ? sh[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    t = sh[0];
    return t;
}
// rmsnorm_t's 1 / rms of x[0..H) as a block of NB threads computes it (NB a multiple of 32, at
// most 1024, NB >= H / 8): virtual thread v sums x[v + j NB]^2 over j < 8, virtual warps are
// summed with warp_sum, then their sums with one more warp_sum, as block_sum does. Any blockDim
// that is a multiple of 32 runs it (each thread plays virtual threads t, t + blockDim, ...).
// sh: >= 33 floats. Every thread gets the result.
// L2: read x through L2 (__ldcg), for a row other blocks of this grid wrote.
template <bool L2>
__device__ float rms_inv_nb(const float* x, int H, int NB, float eps, float* sh) {
    int lane = threadIdx.x & 31;
    for (int v0 = threadIdx.x; v0 - lane < NB; v0 += blockDim.x) {
        float ss = 0.f;
        if (v0 < NB) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int i = v0 + j * NB;
                float a = i < H ? (L2 ? __ldcg(x + i) : x[i]) : 0.f;
                ss += a * a;
            }
        }
        ss = warp_sum(ss);
        if (lane == 0) sh[v0 >> 5] = ss;
    }
    __syncthreads();
    float t = 0.f;
    int nw = NB >> 5;
    if (threadIdx.x < 32) {
        t = lane < nw ? sh[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    t = sh[32];
    __syncthreads();
    return rsqrtf(t / (float)H + eps);
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Greedy argmax folded by a 64-bit atomicMax (argmax_rows_split, linear_tc_bf16_tiled_argmax): logit v at
// index idx as (order-preserving key of v) << 32 | ~idx, so the largest key is the largest value
// and, among equal values, the lowest index, whatever the order the folds arrive in (+0 and -0
// get one key, as they compare equal). A value that never wins (NaN; -inf, which no scan's
// `v > best` from -inf takes) gets 0, below every other key; a slot still 0 decodes to
// 0x7fffffff, argmax_rows' index for a row with no winner.
__device__ __forceinline__ unsigned long long amax_key(float v, int idx) {
    u32 f = v == 0.f ? 0u : __float_as_uint(v);
    u32 key = (f & 0x80000000u) ? ~f : (f | 0x80000000u);
    return v > -INFINITY ? ((unsigned long long)key << 32) | (unsigned long long)(0xffffffffu - (u32)idx) : 0ull;
}
__device__ __forceinline__ int amax_index(unsigned long long sv) {
    return sv == 0ull ? 0x7fffffff : (int)(0xffffffffu - (u32)(sv & 0xffffffffull));
}
__device__ __forceinline__ unsigned long long u64_max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- one 16-element block of a weight row, dotted with MR activation rows -------------------
// BF16 weights: row-major [N, K], any K (K % 16 != 0: dot16_bf16_tail). NVFP4: packed [N, K/2]
// (element 2i low nibble), scales [N, K/16]; K % 16 == 0 (the format's groups).
// Both accumulate sum_k w[k] * x[r][k] for the 16 columns of block `blk` into acc[r].
// The 16 BF16 weights held in a, b dotted with x16[0..16) (dot16_bf16's products and sum).
__device__ __forceinline__ float dot16_bf16_w(uint4 a, uint4 b, const float* x16) {
    float w[16] = {bflo(a.x), bfhi(a.x), bflo(a.y), bfhi(a.y), bflo(a.z), bfhi(a.z), bflo(a.w), bfhi(a.w),
                   bflo(b.x), bfhi(b.x), bflo(b.y), bfhi(b.y), bflo(b.z), bfhi(b.z), bflo(b.w), bfhi(b.w)};
    const float4* x = reinterpret_cast<const float4*>(x16);
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 v = x[q];
        s = fmaf(w[4 * q], v.x, s);
        s = fmaf(w[4 * q + 1], v.y, s);
        s = fmaf(w[4 * q + 2], v.z, s);
        s = fmaf(w[4 * q + 3], v.w, s);
    }
    return s;
}
// A BF16 row of width K % 16 != 0 (rows not 16-byte aligned, a last block past K): block `blk`'s
// 16 weights by element loads, zeros past K. With x16_tail, the products in dot16_bf16_w's order
// (x zero past K too), so a tail block sums as an aligned block of the same values would.
__device__ __forceinline__ void w16_bf16_tail(const bf16_t* __restrict__ wrow, int blk, int K, float* w) {
#pragma unroll
    for (int q = 0; q < 16; q++) {
        int k = blk * 16 + q;
        w[q] = k < K ? bf2f(wrow[k]) : 0.f;
    }
}
__device__ __forceinline__ float dot16_tail(const float* w, const float* __restrict__ x, int blk, int K) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 16; q++) {
        int k = blk * 16 + q;
        s = fmaf(w[q], k < K ? x[k] : 0.f, s);
    }
    return s;
}
template <int MR>
__device__ __forceinline__ void dot16_bf16_tail(const bf16_t* __restrict__ wrow, int blk, int K, const float* const* xr, int nr, float* acc) {
    float w[16];
    w16_bf16_tail(wrow, blk, K, w);
#pragma unroll
    for (int r = 0; r < MR; r++)
        if (r < nr) acc[r] += dot16_tail(w, xr[r], blk, K);
}
template <int MR>
__device__ __forceinline__ void dot16_bf16(const bf16_t* __restrict__ wrow, int blk, const float* const* xr, int nr, float* acc) {
    const uint4* p = reinterpret_cast<const uint4*>(wrow + (size_t)blk * 16);
    uint4 a = __ldg(p), b = __ldg(p + 1);
#pragma unroll
    for (int r = 0; r < MR; r++)
        if (r < nr) acc[r] += dot16_bf16_w(a, b, xr[r] + blk * 16);
}
template <int MR>
__device__ __forceinline__ void dot16_fp4(const u8* __restrict__ prow, const u8* __restrict__ srow, int blk, const float* const* xr, int nr, float* acc) {
    uint2 c = __ldg(reinterpret_cast<const uint2*>(prow + (size_t)blk * 8));
    float sc = e4m3u(__ldg(srow + blk));
    float w[16];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 b = (c.x >> (8 * i)) & 0xffu;
        w[2 * i] = e2m1(b & 15u);
        w[2 * i + 1] = e2m1(b >> 4);
        u32 d = (c.y >> (8 * i)) & 0xffu;
        w[8 + 2 * i] = e2m1(d & 15u);
        w[8 + 2 * i + 1] = e2m1(d >> 4);
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < nr) {
            const float4* x = reinterpret_cast<const float4*>(xr[r] + blk * 16);
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float4 v = x[q];
                s = fmaf(w[4 * q], v.x, s);
                s = fmaf(w[4 * q + 1], v.y, s);
                s = fmaf(w[4 * q + 2], v.z, s);
                s = fmaf(w[4 * q + 3], v.w, s);
            }
            acc[r] = fmaf(s, sc, acc[r]);
        }
    }
}

// A weight matrix reference: fmt 0 = BF16 (w), 1 = NVFP4 (w = packed codes, s = block scales,
// inv_gs = 1/weight_global_scale per matrix). For expert stacks, `stride_*` step between experts.
struct WRef {
    const void* w;
    const u8* s;
    const float* inv_gs;
};

// Dot of weight row `n` (of a [N, K] matrix) with MR activation rows; returns through acc (after
// the warp reduction every lane holds the totals). Per-row arithmetic never depends on nr or MR.
template <int FMT, int MR>
__device__ __forceinline__ void row_dot(const void* w, const u8* s, float inv_gs, int n, int K, const float* const* xr, int nr, float* acc) {
    int lane = threadIdx.x & 31;
    int nblk = K >> 4;
#pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.f;
    if (FMT == 0) {
        const bf16_t* wrow = reinterpret_cast<const bf16_t*>(w) + (size_t)n * K;
        if (K & 15) {
            for (int b = lane; b < (K + 15) >> 4; b += 32) dot16_bf16_tail<MR>(wrow, b, K, xr, nr, acc);
        } else {
#pragma unroll 4
            for (int b = lane; b < nblk; b += 32) dot16_bf16<MR>(wrow, b, xr, nr, acc);
        }
    } else {
        const u8* prow = reinterpret_cast<const u8*>(w) + (size_t)n * (K >> 1);
        const u8* srow = s + (size_t)n * nblk;
#pragma unroll 4
        for (int b = lane; b < nblk; b += 32) dot16_fp4<MR>(prow, srow, b, xr, nr, acc);
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        acc[r] = warp_sum(acc[r]);
        if (FMT == 1) acc[r] *= inv_gs;
    }
}

// Rows `n` of two [N, K] matrices (same format) dotted with the same MR activation rows in one
// loop, so both weight streams are in flight together (gate and up of an expert).
template <int FMT, int MR>
__device__ __forceinline__ void row_dot2(const void* wa, const u8* sa, float inva, const void* wb, const u8* sb, float invb,
                                         int n, int K, const float* const* xr, int nr, float* acca, float* accb) {
    int lane = threadIdx.x & 31;
    int nblk = K >> 4;
#pragma unroll
    for (int r = 0; r < MR; r++) { acca[r] = 0.f; accb[r] = 0.f; }
    if (FMT == 0) {
        const bf16_t* ra = reinterpret_cast<const bf16_t*>(wa) + (size_t)n * K;
        const bf16_t* rb = reinterpret_cast<const bf16_t*>(wb) + (size_t)n * K;
        if (K & 15) {
            for (int b = lane; b < (K + 15) >> 4; b += 32) {
                dot16_bf16_tail<MR>(ra, b, K, xr, nr, acca);
                dot16_bf16_tail<MR>(rb, b, K, xr, nr, accb);
            }
        } else {
#pragma unroll 4
            for (int b = lane; b < nblk; b += 32) {
                dot16_bf16<MR>(ra, b, xr, nr, acca);
                dot16_bf16<MR>(rb, b, xr, nr, accb);
            }
        }
    } else {
        const u8* pa = reinterpret_cast<const u8*>(wa) + (size_t)n * (K >> 1);
        const u8* pb = reinterpret_cast<const u8*>(wb) + (size_t)n * (K >> 1);
        const u8* qa = sa + (size_t)n * nblk;
        const u8* qb = sb + (size_t)n * nblk;
#pragma unroll 4
        for (int b = lane; b < nblk; b += 32) {
            dot16_fp4<MR>(pa, qa, b, xr, nr, acca);
            dot16_fp4<MR>(pb, qb, b, xr, nr, accb);
        }
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        acca[r] = warp_sum(acca[r]);
        accb[r] = warp_sum(accb[r]);
        if (FMT == 1) { acca[r] *= inva; accb[r] *= invb; }
    }
}
// y[r, i] = v and, with xs set, its BF16 hi / lo split (hi at xs [M, H], lo at xs + M * H): what
// rmsnorm_split and moe_combine_norm write for the GEMMs of a long pass.
__device__ __forceinline__ void rms_store(float* y, bf16_t* xs, size_t M, int r, int H, int i, float v) {
    y[(size_t)r * H + i] = v;
    if (xs) {
        bf16_t h = f2bf(v);
        xs[(size_t)r * H + i] = h;
        xs[M * H + (size_t)r * H + i] = f2bf(v - bf2f(h));
    }
}
