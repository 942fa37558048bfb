/* prelude_emu.h: maps the HIP kernel language onto the emu backend's CPU
 * runtime (device/emu*.c). The emu backend compiles one C translation unit:
 * this text, then prelude_gpu.h (with MT_EMU defined), then the kernel
 * source, into a self-contained shared object. The object reaches the
 * runtime only through the table that mt__emu_bind() receives at load time,
 * never through symbols of the host program.
 *
 * How HIP maps onto the CPU:
 *   threads of a block   fibers on one OS thread; threadIdx & co. read the
 *                        current fiber's record (mt__self(), const per fiber)
 *   __shared__           `static __thread`: one OS thread runs one block at a
 *                        time, so thread-local storage is block-private; the
 *                        runtime fills it with 0xFF bytes before every block
 *   MT_DYN_SHARED(T, n)  `T *const n`, the block's dynamic shared area, which
 *                        ends flush against a guard page (use in a function)
 *   __syncthreads()      a fiber barrier; warp ops are warp rendezvous
 *   atomics              GCC __atomic builtins (relaxed, like device scope)
 *
 * The first part (the ABI structs) is also included by the runtime with
 * MT_EMU_ABI_ONLY defined, so both sides share one definition. */
#ifndef MT_PRELUDE_EMU_H
#define MT_PRELUDE_EMU_H

#include <stdint.h>

/* Bumped whenever the structs or the table below change. */
#define MT_EMU_ABI 3

typedef struct uint3 { unsigned x, y, z; } uint3;

/* What a thread of the kernel can see of its block. */
struct mt_emu_block {
    uint3 idx;        /* blockIdx */
    uint3 dim;        /* blockDim */
    uint3 grid;       /* gridDim */
    int warp_size;
    void *dyn_shared; /* the block's dynamic shared memory */
};

/* One emulated GPU thread (a fiber). The runtime's record starts with it. */
struct mt_emu_thread {
    uint3 idx; /* threadIdx */
    const struct mt_emu_block *block;
};

enum {
    MT_EMU_SHFL_IDX = 0,
    MT_EMU_SHFL_UP = 1,
    MT_EMU_SHFL_DOWN = 2,
    MT_EMU_SHFL_XOR = 3,
    MT_EMU_VOTE_BALLOT = 4,
    MT_EMU_VOTE_ANY = 5,
    MT_EMU_VOTE_ALL = 6,
    MT_EMU_MMA = 7,
};

/* Matrix instructions the emulator executes (device/emu/emu_mma.c), each
 * with its vendor's lane/register layout: the wave64 ones are AMD MFMA, the
 * wave32 ones NVIDIA mma.sync. Append only. */
enum {
    MT_EMU_MMA_BF16_16X16X16 = 1, /* v_mfma_f32_16x16x16bf16_1k */
    MT_EMU_MMA_BF16_32X32X8 = 2,  /* v_mfma_f32_32x32x8bf16_1k */
    MT_EMU_MMA_BF16_16X8X16 = 3,  /* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 */
    MT_EMU_MMA_FP8_16X16X32 = 4,  /* v_mfma_f32_16x16x32_fp8_fp8 (gfx940+) */
    MT_EMU_MMA_I8_16X16X32 = 5,   /* v_mfma_i32_16x16x32_i8 (gfx940+) */
    MT_EMU_MMA_E4M3_16X8X32 = 6,  /* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 */
    MT_EMU_MMA_S8_16X8X32 = 7,    /* mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 */
};

/* What one lane hands in to a wave-collective MMA: its A and B registers
 * (elements of 16 or 8 bits in register order, low bits first), its C
 * registers (f32, or int32 for the integer shapes), and where its D
 * registers go. */
struct mt_emu_mma_lane {
    int shape;
    const void *a, *b;
    const void *c;
    void *d;
};

/* Outcomes of rt->mma. */
enum {
    MT_EMU_MMA_OK = 0,
    MT_EMU_MMA_E_LANES = 1, /* a lane of the wave exited or does not exist */
    MT_EMU_MMA_E_SHAPE = 2, /* the lanes asked for different instructions */
    MT_EMU_MMA_E_WAVE = 3,  /* the instruction is not one of this wave size */
};

/* The runtime as the kernel object sees it. */
struct mt_emu_rt {
    int abi;
    const struct mt_emu_thread *(*self)(void);
    void (*sync)(void);
    /* Exchanges a 64-bit payload across the lanes of the caller's warp. */
    uint64_t (*shfl)(int op, uint64_t v, int arg, int width);
    uint64_t (*vote)(int op, int pred);
    /* Stops the launch with MT_E_FAULT and the message (assert, __trap). */
    void (*trap)(const char *what, const char *file, int line);
    /* One MMA, collective over the caller's warp: every lane passes its own
     * operands; returns MT_EMU_MMA_OK once every lane's d is written. */
    int (*mma)(const struct mt_emu_mma_lane *lane);
};

#ifndef MT_EMU_ABI_ONLY

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const struct mt_emu_rt *mt__rt;

__attribute__((visibility("default"))) int mt__emu_bind(const struct mt_emu_rt *rt)
{
    mt__rt = rt;
    return MT_EMU_ABI;
}

/* Makes sure the calling OS thread has this object's thread-local block
 * (where __shared__ lives) and returns an address inside it. */
static __thread __attribute__((aligned(16))) char mt__tls_anchor[16];
__attribute__((visibility("default"))) void *mt__emu_tls_anchor(void)
{
    return mt__tls_anchor;
}

/* A fiber's record never changes while it runs, so `const` lets the compiler
 * keep it across calls; noinline keeps the attribute meaningful. */
__attribute__((const, noinline)) static const struct mt_emu_thread *mt__self(void)
{
    return mt__rt->self();
}

#define MT__FENCE() __asm__ __volatile__("" ::: "memory")

/* ---- HIP keywords -------------------------------------------------------- */
#define __global__ __attribute__((visibility("default")))
#define __device__
#define __host__
#define __shared__ static __thread __attribute__((aligned(16)))
#define __constant__ static
#define __restrict__ __restrict
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)

#define threadIdx (mt__self()->idx)
#define blockIdx (mt__self()->block->idx)
#define blockDim (mt__self()->block->dim)
#define gridDim (mt__self()->block->grid)
#define warpSize (mt__self()->block->warp_size)

/* ---- what prelude_gpu.h expects from a platform ------------------------- */
#define MT_KERNEL __attribute__((visibility("default")))
#define MT_DEVICE static inline
#define MT_DYN_SHARED(T, name) T *const name = (T *)mt__self()->block->dyn_shared
#define MT_WARP_SIZE warpSize

static inline void __syncthreads(void)
{
    MT__FENCE();
    mt__rt->sync();
    MT__FENCE();
}

static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline uint32_t mt__f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float mt__u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t mt__d2u(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
static inline double mt__u2d(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }

#define mt_float_as_uint(f) mt__f2u((float)(f))
#define mt_uint_as_float(u) mt__u2f((uint32_t)(u))
#define __float_as_uint(f) mt__f2u((float)(f))
#define __uint_as_float(u) mt__u2f((uint32_t)(u))
#define __float_as_int(f) ((int)mt__f2u((float)(f)))
#define __int_as_float(i) mt__u2f((uint32_t)(i))

/* ---- warp operations ----------------------------------------------------- */
static inline uint64_t mt__warp(int op, uint64_t v, int arg, int width)
{
    MT__FENCE();
    uint64_t r = mt__rt->shfl(op, v, arg, width);
    MT__FENCE();
    return r;
}

static inline float mt__shfl_f32(int op, float v, int a, int w)
{
    return mt__u2f((uint32_t)mt__warp(op, mt__f2u(v), a, w));
}
static inline int mt__shfl_i32(int op, int v, int a, int w)
{
    return (int)(uint32_t)mt__warp(op, (uint32_t)v, a, w);
}
static inline unsigned mt__shfl_u32(int op, unsigned v, int a, int w)
{
    return (uint32_t)mt__warp(op, v, a, w);
}
static inline double mt__shfl_f64(int op, double v, int a, int w)
{
    return mt__u2d(mt__warp(op, mt__d2u(v), a, w));
}
static inline long long mt__shfl_i64(int op, long long v, int a, int w)
{
    return (long long)mt__warp(op, (uint64_t)v, a, w);
}
static inline unsigned long long mt__shfl_u64(int op, unsigned long long v, int a, int w)
{
    return mt__warp(op, v, a, w);
}

#define mt_shfl_xor_f32(v, m) mt__shfl_f32(MT_EMU_SHFL_XOR, (float)(v), (int)(m), warpSize)
#define mt_shfl_xor_i32(v, m) mt__shfl_i32(MT_EMU_SHFL_XOR, (int)(v), (int)(m), warpSize)
#define mt_shfl_up_f32(v, d) mt__shfl_f32(MT_EMU_SHFL_UP, (float)(v), (int)(d), warpSize)
#define mt_shfl_up_i32(v, d) mt__shfl_i32(MT_EMU_SHFL_UP, (int)(v), (int)(d), warpSize)
#define mt_shfl_down_f32(v, d) mt__shfl_f32(MT_EMU_SHFL_DOWN, (float)(v), (int)(d), warpSize)
#define mt_shfl_down_i32(v, d) mt__shfl_i32(MT_EMU_SHFL_DOWN, (int)(v), (int)(d), warpSize)
#define mt_shfl_idx_f32(v, l) mt__shfl_f32(MT_EMU_SHFL_IDX, (float)(v), (int)(l), warpSize)
#define mt_shfl_idx_i32(v, l) mt__shfl_i32(MT_EMU_SHFL_IDX, (int)(v), (int)(l), warpSize)

/* HIP's own names, overloaded by value type, with HIP's optional width. */
#define MT__SHFL_G(op, v, a, w)                                                \
    _Generic((v), float: mt__shfl_f32, double: mt__shfl_f64,                   \
             unsigned: mt__shfl_u32, long long: mt__shfl_i64,                  \
             unsigned long long: mt__shfl_u64, long: mt__shfl_i64,             \
             unsigned long: mt__shfl_u64, default: mt__shfl_i32)(op, v, a, w)
#define MT__FIRST(a, ...) a
#define MT__WIDTH(...) MT__WIDTH_(__VA_ARGS__, warpSize, )
#define MT__WIDTH_(a, w, ...) (w)
#define __shfl(v, ...) MT__SHFL_G(MT_EMU_SHFL_IDX, (v), MT__FIRST(__VA_ARGS__, ), MT__WIDTH(__VA_ARGS__))
#define __shfl_up(v, ...) MT__SHFL_G(MT_EMU_SHFL_UP, (v), MT__FIRST(__VA_ARGS__, ), MT__WIDTH(__VA_ARGS__))
#define __shfl_down(v, ...) MT__SHFL_G(MT_EMU_SHFL_DOWN, (v), MT__FIRST(__VA_ARGS__, ), MT__WIDTH(__VA_ARGS__))
#define __shfl_xor(v, ...) MT__SHFL_G(MT_EMU_SHFL_XOR, (v), MT__FIRST(__VA_ARGS__, ), MT__WIDTH(__VA_ARGS__))

static inline uint64_t mt__vote(int op, int pred)
{
    MT__FENCE();
    uint64_t r = mt__rt->vote(op, pred != 0);
    MT__FENCE();
    return r;
}
#define mt_ballot(p) ((unsigned long long)mt__vote(MT_EMU_VOTE_BALLOT, (p) != 0))
#define mt_any(p) ((int)mt__vote(MT_EMU_VOTE_ANY, (p) != 0))
#define mt_all(p) ((int)mt__vote(MT_EMU_VOTE_ALL, (p) != 0))
#define __ballot(p) mt_ballot(p)
#define __any(p) mt_any(p)
#define __all(p) mt_all(p)

/* ---- matrix fragments: the emulator's half (the API is in prelude_gpu.h) --
 * The emu backend defines MT_EMU_WAVE, the wave size the module is built
 * for: wave64 modules get AMD's MFMA layouts, wave32 ones NVIDIA's
 * mma.sync layout. Every MMA is a rendezvous of the whole wave, computed
 * once by the runtime (device/emu_mma.c). */
static inline int mt_lane_id(void)
{
    const struct mt_emu_thread *t = mt__self();
    const struct mt_emu_block *b = t->block;
    unsigned lin = t->idx.x + b->dim.x * (t->idx.y + b->dim.y * t->idx.z);
    return (int)(lin % (unsigned)b->warp_size);
}

#if defined(MT_EMU_WAVE) && MT_EMU_WAVE == 64
#define MT__MMA_LAYOUT 1
#define MT__MMA8 1
typedef unsigned short mt__mma_v4[4];
typedef float mt__mma_f4[4];
typedef float mt__mma_f16[16];
#elif defined(MT_EMU_WAVE) && MT_EMU_WAVE == 32
#define MT__MMA_LAYOUT 2
#define MT__MMA8 2
#endif
#define MT__FN static inline
#define MT__ALIGNED8(p) (p)

static inline void mt__emu_mma(int shape, const void *a, const void *b, const void *c,
                               void *d, const char *file, int line)
{
    struct mt_emu_mma_lane ln = {shape, a, b, c, d};
    MT__FENCE();
    int r = mt__rt->mma(&ln);
    MT__FENCE();
    if (r == MT_EMU_MMA_E_LANES)
        mt__rt->trap("mt_mma: not every lane of the wave took part (a lane exited, or the "
                     "block's last wave is partial); an MMA needs the whole wave",
                     file, line);
    else if (r == MT_EMU_MMA_E_SHAPE)
        mt__rt->trap("mt_mma: the lanes of the wave asked for different MMA shapes",
                     file, line);
    else if (r != MT_EMU_MMA_OK)
        mt__rt->trap("mt_mma: this MMA shape is not one of this wave size (the module "
                     "was built for another wave size)", file, line);
}

/* The fragment loads' alignment contract, which a GPU would not check (its
 * wide LDS reads need it): the tile starts 8-byte aligned, ld % 4 == 0. */
static inline void mt__mma_check(const void *p, int ld, const char *what, const char *file,
                                 int line)
{
    if (((uintptr_t)p & 7u) || (ld & 3))
        mt__rt->trap(what, file, line);
}
#define MT__MMA_CHECK(p, ld, what, file, line) mt__mma_check((p), (ld), (what), (file), (line))

/* ---- code-shape hints (prelude_gpu.h's MT_UNROLL, mt_opaque_u32): no
 * meaning on the CPU. ------------------------------------------------------ */
#define MT_UNROLL
#define MT_NOUNROLL
static inline unsigned mt_opaque_u32(unsigned x) { return x; }

/* ---- byte permute (prelude_gpu.h's mt_nib_lut4), AMD's nibble order --- */
#define MT_NIB_OF(h, k) (2 * (k) + (h))
static inline unsigned mt_nib_lut4(unsigned lo, unsigned hi, unsigned w, int h)
{
    uint64_t tab = (uint64_t)hi << 32 | lo;
    unsigned r = 0;
    for (int k = 0; k < 4; k++) {
        unsigned m = (w >> (4 * MT_NIB_OF(h, k))) & 7u;
        r |= (unsigned)((tab >> (8 * m)) & 0xffu) << (8 * k);
    }
    return r;
}

/* ---- 16-byte loads (prelude_gpu.h's mt_load16): a GPU's 16-byte load
 * needs a 16-byte aligned address; emu traps where one would fault. ------ */
typedef struct __attribute__((aligned(16))) mt_u32x4 { unsigned x, y, z, w; } mt_u32x4;
static inline mt_u32x4 mt__load16(const void *p, const char *file, int line)
{
    mt_u32x4 r;
    if ((uintptr_t)p & 15u)
        mt__rt->trap("mt_load16: the address must be 16-byte aligned", file, line);
    memcpy(&r, p, 16);
    return r;
}
#define mt_load16(p) mt__load16((p), __FILE__, __LINE__)
#define mt_load16_nt(p) mt__load16((p), __FILE__, __LINE__)

/* ---- the byte permutes the 8-bit fragments' expansion runs through
 * (prelude_gpu.h's mt__perm, AMD v_perm_b32, and mt__prmt, NVIDIA
 * prmt.b32 in its default mode), executed with the instructions' own
 * semantics so that the expansion's arithmetic is what the GPU runs. ---- */
static inline unsigned mt__perm(unsigned hi, unsigned lo, unsigned sel)
{
    uint64_t v = (uint64_t)hi << 32 | lo;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) {
        unsigned s = (sel >> (8 * n)) & 0xffu, b;
        if (s < 8)
            b = (unsigned)(v >> (8 * s)) & 0xffu;
        else if (s < 12) /* the sign of byte 1, 3, 5 or 7 of hi:lo, replicated */
            b = (unsigned)((v >> (16 * (s - 8) + 15)) & 1u) * 0xffu;
        else
            b = s == 12 ? 0x00u : 0xffu;
        r |= b << (8 * n);
    }
    return r;
}
static inline unsigned mt__prmt(unsigned a, unsigned b, unsigned sel)
{
    uint64_t v = (uint64_t)b << 32 | a;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) {
        unsigned s = (sel >> (4 * n)) & 0xfu;
        unsigned byte = (unsigned)(v >> (8 * (s & 7u))) & 0xffu;
        if (s & 8u)
            byte = (byte & 0x80u) ? 0xffu : 0x00u;
        r |= byte << (8 * n);
    }
    return r;
}
#define mt_ldexpf(x, e) ldexpf((x), (e))

/* ---- staged copies (prelude_gpu.h's mt_async16_*): a 16-byte load into
 * registers, then a 16-byte store; both addresses must be 16-byte
 * aligned, as a GPU's 16-byte accesses and cp.async need. ----------------- */
static inline void mt__async16_begin(void *lds, const void *g, mt_u32x4 *hold,
                                     const char *file, int line)
{
    if ((uintptr_t)lds & 15u)
        mt__rt->trap("mt_async16: the shared-memory address must be 16-byte aligned", file,
                     line);
    *hold = mt__load16(g, file, line);
}
#define mt_async16_begin(l, g, h) mt__async16_begin((l), (g), (h), __FILE__, __LINE__)
static inline void mt_async16_end(void *lds, mt_u32x4 hold) { memcpy(lds, &hold, 16); }
static inline void mt_async_wait(void) {}

/* ---- ldmatrix (.x4, 16-bit elements) for wave32: lane l hands in the
 * address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned) and
 * receives, in word j, bytes 4 (l % 4) .. + 3 of row l / 4 of matrix j:
 * the rows travel between the lanes by shuffles, as they do on the GPU. */
static inline void mt__ldsm4(const void *row, unsigned out[4], const char *file, int line)
{
    if ((uintptr_t)row & 15u)
        mt__rt->trap("ldmatrix (mt_mma8_load_*): every row address must be 16-byte aligned",
                     file, line);
    int l = mt_lane_id();
    for (int j = 0; j < 4; j++) {
        uint64_t a = mt__warp(MT_EMU_SHFL_IDX, (uint64_t)(uintptr_t)row, 8 * j + l / 4, 32);
        memcpy(&out[j], (const unsigned char *)(uintptr_t)a + 4 * (l % 4), 4);
    }
}

/* ---- math ---------------------------------------------------------------- */
#define mt_expf(x) expf(x)
#define mt_sqrtf(x) sqrtf(x)
#define mt_rsqrtf(x) (1.0f / sqrtf(x))
#define mt_fmaxf(a, b) fmaxf(a, b)
#define rsqrtf(x) (1.0f / sqrtf(x))
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
#define __fdividef(a, b) ((a) / (b))
#define __saturatef(x) fminf(fmaxf((x), 0.0f), 1.0f)
#define __popc(x) __builtin_popcount((unsigned)(x))
#define __popcll(x) __builtin_popcountll((unsigned long long)(x))
#define __clz(x) ((unsigned)(x) ? __builtin_clz((unsigned)(x)) : 32)
#define __clzll(x) ((unsigned long long)(x) ? __builtin_clzll((unsigned long long)(x)) : 64)
#define __ffs(x) __builtin_ffs((int)(x))
#define __ffsll(x) __builtin_ffsll((long long)(x))

/* ---- atomics (device scope is relaxed) ----------------------------------- */
#define MT__RLX __ATOMIC_RELAXED
#define MT__ATOMIC_INT(T, sfx)                                                 \
    static inline T mt__atomic_add_##sfx(T *p, T v) { return __atomic_fetch_add(p, v, MT__RLX); } \
    static inline T mt__atomic_sub_##sfx(T *p, T v) { return __atomic_fetch_sub(p, v, MT__RLX); } \
    static inline T mt__atomic_and_##sfx(T *p, T v) { return __atomic_fetch_and(p, v, MT__RLX); } \
    static inline T mt__atomic_or_##sfx(T *p, T v) { return __atomic_fetch_or(p, v, MT__RLX); }   \
    static inline T mt__atomic_xor_##sfx(T *p, T v) { return __atomic_fetch_xor(p, v, MT__RLX); } \
    static inline T mt__atomic_exch_##sfx(T *p, T v) { return __atomic_exchange_n(p, v, MT__RLX); } \
    static inline T mt__atomic_cas_##sfx(T *p, T cmp, T v)                     \
    {                                                                          \
        __atomic_compare_exchange_n(p, &cmp, v, 0, MT__RLX, MT__RLX);          \
        return cmp;                                                            \
    }                                                                          \
    static inline T mt__atomic_min_##sfx(T *p, T v)                            \
    {                                                                          \
        T old = __atomic_load_n(p, MT__RLX);                                   \
        while (v < old &&                                                      \
               !__atomic_compare_exchange_n(p, &old, v, 1, MT__RLX, MT__RLX))  \
            ;                                                                  \
        return old;                                                            \
    }                                                                          \
    static inline T mt__atomic_max_##sfx(T *p, T v)                            \
    {                                                                          \
        T old = __atomic_load_n(p, MT__RLX);                                   \
        while (v > old &&                                                      \
               !__atomic_compare_exchange_n(p, &old, v, 1, MT__RLX, MT__RLX))  \
            ;                                                                  \
        return old;                                                            \
    }
MT__ATOMIC_INT(int, i32)
MT__ATOMIC_INT(unsigned, u32)
MT__ATOMIC_INT(long long, i64)
MT__ATOMIC_INT(unsigned long long, u64)

/* Floating point atomics: a compare-and-swap loop on the bits. */
#define MT__ATOMIC_FLT(T, U, sfx, to_u, from_u)                                \
    static inline T mt__atomic_rmw_##sfx(T *p, T v, int op)                    \
    {                                                                          \
        U old = __atomic_load_n((U *)p, MT__RLX), nu;                          \
        do {                                                                   \
            T o = from_u(old);                                                 \
            T n = op == 0 ? o + v : op == 1 ? fmin(o, v) : op == 2 ? fmax(o, v) : v; \
            nu = to_u(n);                                                      \
        } while (!__atomic_compare_exchange_n((U *)p, &old, nu, 1, MT__RLX, MT__RLX)); \
        return from_u(old);                                                    \
    }                                                                          \
    static inline T mt__atomic_add_##sfx(T *p, T v) { return mt__atomic_rmw_##sfx(p, v, 0); } \
    static inline T mt__atomic_min_##sfx(T *p, T v) { return mt__atomic_rmw_##sfx(p, v, 1); } \
    static inline T mt__atomic_max_##sfx(T *p, T v) { return mt__atomic_rmw_##sfx(p, v, 2); } \
    static inline T mt__atomic_exch_##sfx(T *p, T v)                           \
    {                                                                          \
        return from_u(__atomic_exchange_n((U *)p, to_u(v), MT__RLX));          \
    }                                                                          \
    static inline T mt__atomic_cas_##sfx(T *p, T cmp, T v)                     \
    {                                                                          \
        U c = to_u(cmp);                                                       \
        __atomic_compare_exchange_n((U *)p, &c, to_u(v), 0, MT__RLX, MT__RLX); \
        return from_u(c);                                                      \
    }
MT__ATOMIC_FLT(float, uint32_t, f32, mt__f2u, mt__u2f)
MT__ATOMIC_FLT(double, uint64_t, f64, mt__d2u, mt__u2d)

#define MT__ATOMIC_G(op, p)                                                    \
    _Generic((p), int *: mt__atomic_##op##_i32, unsigned *: mt__atomic_##op##_u32, \
             long long *: mt__atomic_##op##_i64,                               \
             unsigned long long *: mt__atomic_##op##_u64,                      \
             float *: mt__atomic_##op##_f32, double *: mt__atomic_##op##_f64)
#define MT__ATOMIC_GI(op, p)                                                   \
    _Generic((p), int *: mt__atomic_##op##_i32, unsigned *: mt__atomic_##op##_u32, \
             long long *: mt__atomic_##op##_i64,                               \
             unsigned long long *: mt__atomic_##op##_u64)
#define atomicAdd(p, v) MT__ATOMIC_G(add, p)((p), (v))
#define atomicMin(p, v) MT__ATOMIC_G(min, p)((p), (v))
#define atomicMax(p, v) MT__ATOMIC_G(max, p)((p), (v))
#define atomicExch(p, v) MT__ATOMIC_G(exch, p)((p), (v))
#define atomicCAS(p, c, v) MT__ATOMIC_G(cas, p)((p), (c), (v))
#define atomicSub(p, v) MT__ATOMIC_GI(sub, p)((p), (v))
#define atomicAnd(p, v) MT__ATOMIC_GI(and, p)((p), (v))
#define atomicOr(p, v) MT__ATOMIC_GI(or, p)((p), (v))
#define atomicXor(p, v) MT__ATOMIC_GI(xor, p)((p), (v))

/* ---- vector types -------------------------------------------------------- */
#define MT__VEC2(T, name, al)                                                  \
    typedef struct __attribute__((aligned(al))) name { T x, y; } name;         \
    static inline name make_##name(T x, T y) { name r = {x, y}; return r; }
#define MT__VEC4(T, name, al)                                                  \
    typedef struct __attribute__((aligned(al))) name { T x, y, z, w; } name;   \
    static inline name make_##name(T x, T y, T z, T w)                         \
    {                                                                          \
        name r = {x, y, z, w};                                                 \
        return r;                                                              \
    }
MT__VEC2(float, float2, 8)
MT__VEC4(float, float4, 16)
MT__VEC2(int, int2, 8)
MT__VEC4(int, int4, 16)
MT__VEC2(unsigned, uint2, 8)
MT__VEC4(unsigned, uint4, 16)
MT__VEC2(unsigned char, uchar2, 2)
MT__VEC4(unsigned char, uchar4, 4)
MT__VEC2(unsigned short, ushort2, 4)
MT__VEC4(unsigned short, ushort4, 8)
typedef struct float3 { float x, y, z; } float3;
typedef struct int3 { int x, y, z; } int3;
static inline float3 make_float3(float x, float y, float z) { float3 r = {x, y, z}; return r; }
static inline int3 make_int3(int x, int y, int z) { int3 r = {x, y, z}; return r; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 r = {x, y, z}; return r; }

/* ---- traps: a failed assert stops the launch with MT_E_FAULT ------------- */
#undef assert
#define assert(e) ((e) ? (void)0 : mt__rt->trap("assertion failed: " #e, __FILE__, __LINE__))
#define __trap() mt__rt->trap("__trap()", __FILE__, __LINE__)
#define abort() mt__rt->trap("abort()", __FILE__, __LINE__)

#endif /* MT_EMU_ABI_ONLY */
#endif
