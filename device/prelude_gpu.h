/* prelude_gpu.h: the one place where GPU kernel sources meet the platform.
 * Prepended to every HIP kernel source by the hip, cuda and emu backends
 * (embedded in the binary; see dev_prelude_get).
 * Kernel sources are written in the subset of HIP that is also C and use
 * only what is listed here (plus threadIdx/blockIdx/blockDim/gridDim,
 * __syncthreads(), __shared__, __launch_bounds__, __restrict__, and the
 * int/float atomicAdd/atomicMin/atomicMax/atomicExch/atomicCAS):
 *
 *   MT_KERNEL                 before a kernel: `MT_KERNEL void f(...)`, with
 *                             launch bounds after it: `MT_KERNEL __launch_bounds__(256) void f`
 *                             (NVRTC rejects them before extern "C")
 *   MT_DEVICE                 before a helper: `MT_DEVICE float g(...)`; forced inline
 *                             on hip/cuda, so code objects hold no calls (s_swappc)
 *   MT_DYN_SHARED(T, name)    declares the dynamic shared array `T name[]`
 *   MT_WARP_SIZE              warp/wave size (a run-time value on emu)
 *   mt_shfl_{xor,up,down,idx}_{f32,i32}(v, lane_arg)   full-warp shuffles
 *   mt_ballot(pred) -> unsigned long long, mt_any(pred), mt_all(pred)
 *   mt_bf16 (unsigned short), mt_bf16_to_f32, mt_f32_to_bf16 (RNE)
 *   mt_e2m1_to_f32(code4), mt_e8m0_to_f32(code8), mt_fp8e4m3_to_f32(code8)
 *   mt_f32_to_e2m1(v) -> code4 (RNE, saturating; kernels/mxfp4.h's rule)
 *   mt_float_as_uint, mt_uint_as_float, mt_expf, mt_sqrtf, mt_rsqrtf, mt_fmaxf
 *   mt_lane_id(), and the matrix fragments mt_mma_* (see their section below)
 *   MT_LAUNCH_OCC(t, w)       in place of __launch_bounds__(t): at most t
 *                             threads per block, and registers kept to what
 *                             lets w waves share a SIMD (AMD waves per EU;
 *                             NVIDIA the blocks per SM that fill its 4
 *                             schedulers with w warps each); nothing on emu
 *   MT_UNROLL                 before a loop of constant trip count: unroll it
 *                             fully (a register array indexed in a rolled
 *                             loop lives in scratch); nothing on emu
 *   MT_NOUNROLL               before a loop: keep it rolled (a stream whose
 *                             body is already unrolled by hand); nothing on
 *                             emu
 *   mt_opaque_u32(x)          x, as a value the compiler cannot see through:
 *                             work on it stays where it is written (e.g. is
 *                             not hoisted out of a loop to hold more
 *                             registers); no instruction
 *   mt_nib_lut4(lo, hi, w, h) -> 4 bytes: byte k is entry m of the 8-byte
 *                             table hi:lo (lo holds entries 0..3), m the low
 *                             3 bits of nibble MT_NIB_OF(h, k) of w (h 0 or
 *                             1): one byte permute (v_perm_b32, prmt)
 *   MT_NIB_OF(h, k)           that nibble (0..7): 2k + h on AMD and emu,
 *                             4h + k on NVIDIA (each platform's selector
 *                             layout, so the selectors cost one mask)
 *   mt_f32_to_fp8e4m3(v) -> code8 (RNE, saturating to 448; NaN 0x7f)
 *   mt_ldexpf(x, e)           x * 2^e, exactly (subnormal and overflow results
 *                             rounded once)
 *   mt_async16_begin(lds, g, &hold), mt_async16_end(lds, hold), mt_async_wait()
 *                             a 16-byte copy from global to shared memory in
 *                             two halves, so a kernel can issue the next
 *                             slice's copies before it computes on this one:
 *                             NVIDIA cp.async (begin copies, wait waits, end
 *                             does nothing), elsewhere a load into hold
 *                             (begin) and a store from it (end); both
 *                             addresses 16-byte aligned. Call, per thread:
 *                             begin for each copy, other work, wait, end for
 *                             each copy, then __syncthreads()
 *   mt_u32x4                  four 32-bit words (.x .y .z .w), 16 bytes
 *   mt_load16(p), mt_load16_nt(p) -> mt_u32x4: one 16-byte global load from
 *                             p (16-byte aligned; emu traps otherwise); _nt
 *                             marks data read once (weights streamed past
 *                             the caches): non-temporal on AMD, the
 *                             read-only path (ld.global.nc) on NVIDIA,
 *                             plain on emu
 *
 * No vendor #ifdef may appear in a kernel source: only here. */
#ifndef MT_PRELUDE_GPU_H
#define MT_PRELUDE_GPU_H

#if defined(MT_EMU)
/* ---- the CPU emulator (device/emu*.c); the text is pasted in by the emu
 * backend ahead of this file. ---------------------------------------------- */
/* prelude_emu.h is pasted ahead of this file by the emu backend. */
#define MT_LAUNCH_OCC(t, w)

#elif defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
/* ---- AMD, through hipRTC ---------------------------------------------- */
#define MT_KERNEL extern "C" __global__
#define MT_DEVICE MT__FN /* forced inline: no calls, no scratch for the call frame */
#define MT_DYN_SHARED(T, name) extern __shared__ T name[]
#define MT_WARP_SIZE warpSize
#define mt_shfl_xor_f32(v, m) __shfl_xor((float)(v), (m))
#define mt_shfl_xor_i32(v, m) __shfl_xor((int)(v), (m))
#define mt_shfl_up_f32(v, d) __shfl_up((float)(v), (unsigned)(d))
#define mt_shfl_up_i32(v, d) __shfl_up((int)(v), (unsigned)(d))
#define mt_shfl_down_f32(v, d) __shfl_down((float)(v), (unsigned)(d))
#define mt_shfl_down_i32(v, d) __shfl_down((int)(v), (unsigned)(d))
#define mt_shfl_idx_f32(v, l) __shfl((float)(v), (l))
#define mt_shfl_idx_i32(v, l) __shfl((int)(v), (l))
#define mt_ballot(p) ((unsigned long long)__ballot(p))
#define mt_any(p) __any(p)
#define mt_all(p) __all(p)
#define mt_float_as_uint(f) __float_as_uint(f)
#define mt_uint_as_float(u) __uint_as_float(u)
#define mt_expf(x) __expf(x)
#define mt_sqrtf(x) sqrtf(x)
#define mt_rsqrtf(x) rsqrtf(x)
#define mt_fmaxf(a, b) fmaxf(a, b)
#define MT__FN static __device__ __forceinline__
#define MT__ALIGNED8(p) __builtin_assume_aligned((p), 8)
#define MT__MMA_CHECK(p, ld, what, file, line) ((void)0)
MT__FN int mt_lane_id(void)
{
    return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}
#define MT_LAUNCH_OCC(t, w) __launch_bounds__(t, w)
#define MT_UNROLL _Pragma("unroll")
#define MT_NOUNROLL _Pragma("unroll 1")
MT__FN unsigned mt_opaque_u32(unsigned x)
{
    __asm__ volatile("" : "+v"(x));
    return x;
}
#define MT_NIB_OF(h, k) (2 * (k) + (h))
MT__FN unsigned mt_nib_lut4(unsigned lo, unsigned hi, unsigned w, int h)
{
    return __builtin_amdgcn_perm(hi, lo, (w >> (4 * h)) & 0x07070707u);
}
typedef unsigned mt_u32x4 __attribute__((ext_vector_type(4)));
MT__FN mt_u32x4 mt_load16(const void *p) { return *(const mt_u32x4 *)p; }
MT__FN mt_u32x4 mt_load16_nt(const void *p)
{
    return __builtin_nontemporal_load((const mt_u32x4 *)p);
}
#define mt_ldexpf(x, e) __builtin_amdgcn_ldexpf((x), (e))
/* v_perm_b32: byte n of the result is byte sel[n] of hi:lo (0..3 lo) */
MT__FN unsigned mt__perm(unsigned hi, unsigned lo, unsigned sel)
{
    return __builtin_amdgcn_perm(hi, lo, sel);
}
/* The staged copy: a global load into registers, then a store to LDS. */
MT__FN void mt_async16_begin(void *lds, const void *g, mt_u32x4 *hold)
{
    (void)lds;
    *hold = mt_load16(g);
}
MT__FN void mt_async16_end(void *lds, mt_u32x4 hold) { *(mt_u32x4 *)lds = hold; }
MT__FN void mt_async_wait(void) {}
/* fp8 (e4m3) MFMA: CDNA3 and CDNA4. */
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__)
#define MT__MMA8 1
#endif
/* MFMA with bf16_1k operands: gfx90a (CDNA2) and CDNA3/CDNA4. */
#if defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) ||                 \
    defined(__gfx942__) || defined(__gfx950__)
#define MT__MMA_LAYOUT 1
typedef short mt__mma_v4 __attribute__((ext_vector_type(4)));
typedef float mt__mma_f4 __attribute__((ext_vector_type(4)));
typedef float mt__mma_f16 __attribute__((ext_vector_type(16)));
#endif

#elif defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* ---- NVIDIA, through NVRTC --------------------------------------------- */
#define MT_KERNEL extern "C" __global__
#define MT_DEVICE MT__FN /* forced inline: no calls, no scratch for the call frame */
#define MT_DYN_SHARED(T, name) extern __shared__ T name[]
#define MT_WARP_SIZE 32
#define MT_FULL_MASK 0xffffffffu
#define mt_shfl_xor_f32(v, m) __shfl_xor_sync(MT_FULL_MASK, (float)(v), (m))
#define mt_shfl_xor_i32(v, m) __shfl_xor_sync(MT_FULL_MASK, (int)(v), (m))
#define mt_shfl_up_f32(v, d) __shfl_up_sync(MT_FULL_MASK, (float)(v), (unsigned)(d))
#define mt_shfl_up_i32(v, d) __shfl_up_sync(MT_FULL_MASK, (int)(v), (unsigned)(d))
#define mt_shfl_down_f32(v, d) __shfl_down_sync(MT_FULL_MASK, (float)(v), (unsigned)(d))
#define mt_shfl_down_i32(v, d) __shfl_down_sync(MT_FULL_MASK, (int)(v), (unsigned)(d))
#define mt_shfl_idx_f32(v, l) __shfl_sync(MT_FULL_MASK, (float)(v), (l))
#define mt_shfl_idx_i32(v, l) __shfl_sync(MT_FULL_MASK, (int)(v), (l))
#define mt_ballot(p) ((unsigned long long)__ballot_sync(MT_FULL_MASK, (p)))
#define mt_any(p) __any_sync(MT_FULL_MASK, (p))
#define mt_all(p) __all_sync(MT_FULL_MASK, (p))
#define mt_float_as_uint(f) __float_as_uint(f)
#define mt_uint_as_float(u) __uint_as_float(u)
#define mt_expf(x) __expf(x)
#define mt_sqrtf(x) sqrtf(x)
#define mt_rsqrtf(x) rsqrtf(x)
#define mt_fmaxf(a, b) fmaxf(a, b)
#define MT__FN static __device__ __forceinline__
#define MT__ALIGNED8(p) (p)
#define MT__MMA_CHECK(p, ld, what, file, line) ((void)0)
MT__FN int mt_lane_id(void)
{
    unsigned l;
    asm("mov.u32 %0, %%laneid;" : "=r"(l));
    return (int)l;
}
#define MT_LAUNCH_OCC(t, w) __launch_bounds__(t, ((w) * 128 + (t) - 1) / (t))
#define MT_UNROLL _Pragma("unroll")
#define MT_NOUNROLL _Pragma("unroll 1")
MT__FN unsigned mt_opaque_u32(unsigned x)
{
    asm volatile("" : "+r"(x));
    return x;
}
#define MT_NIB_OF(h, k) (4 * (h) + (k))
MT__FN unsigned mt_nib_lut4(unsigned lo, unsigned hi, unsigned w, int h)
{
    return __byte_perm(lo, hi, (w >> (16 * h)) & 0x7777u);
}
typedef uint4 mt_u32x4;
MT__FN mt_u32x4 mt_load16(const void *p) { return *(const uint4 *)p; }
MT__FN mt_u32x4 mt_load16_nt(const void *p) { return __ldg((const uint4 *)p); }
#define mt_ldexpf(x, e) ldexpf((x), (e))
/* prmt.b32 (default mode): byte n of the result is byte sel[n] & 7 of b:a
 * (0..3 a), or that byte's sign bit replicated when sel[n] & 8. */
MT__FN unsigned mt__prmt(unsigned a, unsigned b, unsigned sel)
{
    unsigned d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
#if __CUDA_ARCH__ >= 800
/* cp.async: the copy runs in the background, straight to shared memory;
 * mt_async_wait waits for all of this thread's. */
MT__FN void mt_async16_begin(void *lds, const void *g, mt_u32x4 *hold)
{
    (void)hold;
    unsigned a = (unsigned)__cvta_generic_to_shared(lds);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
MT__FN void mt_async16_end(void *lds, mt_u32x4 hold)
{
    (void)lds;
    (void)hold;
}
MT__FN void mt_async_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
#else
MT__FN void mt_async16_begin(void *lds, const void *g, mt_u32x4 *hold)
{
    (void)lds;
    *hold = mt_load16(g);
}
MT__FN void mt_async16_end(void *lds, mt_u32x4 hold) { *(mt_u32x4 *)lds = hold; }
MT__FN void mt_async_wait(void) {}
#endif
/* mma.sync with bf16 operands: sm_80 and later; with e4m3: sm_89 on. */
#if __CUDA_ARCH__ >= 800
#define MT__MMA_LAYOUT 2
#endif
#if __CUDA_ARCH__ >= 890
#define MT__MMA8 2
#endif

#else
#error "prelude_gpu.h: unknown platform (expected hipRTC, NVRTC or MT_EMU)"
#endif

/* ---- common to every platform ------------------------------------------ */
typedef unsigned short mt_bf16;

MT_DEVICE float mt_bf16_to_f32(mt_bf16 h)
{
    return mt_uint_as_float(((unsigned)h) << 16);
}

MT_DEVICE mt_bf16 mt_f32_to_bf16(float f)
{
    unsigned u = mt_float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (mt_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mt_bf16)(u >> 16);
}

/* FP4 E2M1: [sign | exp(2) | mantissa(1)], 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
MT_DEVICE float mt_e2m1_to_f32(unsigned c)
{
    unsigned e = (c >> 1) & 3u, mbit = c & 1u;
    unsigned bits = e ? (((e + 126u) << 23) | (mbit << 22)) : (mbit ? 0x3f000000u : 0u);
    return mt_uint_as_float(bits | ((c & 8u) << 28));
}

/* Nearest E2M1 code of v (v already divided by its block scale): ties to
 * the even code, |v| > 6 saturates to +-6, sign in bit 3; a magnitude that
 * rounds to zero and NaN give code 0 (never -0: the block's scale carries a
 * NaN). Bit for bit kernels/mxfp4.h's mxfp4_e2m1_encode; the thresholds are
 * the midpoints of the grid, exact in float, so no arithmetic can round. */
MT_DEVICE unsigned mt_f32_to_e2m1(float v)
{
    float a = v < 0.0f ? -v : v;
    unsigned c;
    if (!(a > 0.25f)) /* also NaN */
        return 0u;
    else if (a < 0.75f) c = 1u;
    else if (a <= 1.25f) c = 2u;
    else if (a < 1.75f) c = 3u;
    else if (a <= 2.5f) c = 4u;
    else if (a < 3.5f) c = 5u;
    else if (a <= 5.0f) c = 6u;
    else c = 7u;
    return c | ((mt_float_as_uint(v) >> 28) & 8u);
}

/* E8M0 block scale: 2^(c-127); 0xFF is NaN; 0 is 2^-127 (subnormal). */
MT_DEVICE float mt_e8m0_to_f32(unsigned c)
{
    c &= 0xffu;
    if (c == 0xffu)
        return mt_uint_as_float(0x7fc00000u);
    return mt_uint_as_float(c ? (c << 23) : 0x00400000u);
}

/* OCP fp8 e4m3fn: bias 7, 0x7f/0xff NaN, no infinities. */
MT_DEVICE float mt_fp8e4m3_to_f32(unsigned c)
{
    unsigned s = (c & 0x80u) << 24, e = (c >> 3) & 15u, mm = c & 7u;
    if (e == 15u && mm == 7u)
        return mt_uint_as_float(0x7fc00000u);
    if (e == 0u) /* subnormal: mm * 2^-9 */
        return mt_uint_as_float(s | mt_float_as_uint((float)mm * 0.001953125f));
    return mt_uint_as_float(s | ((e + 120u) << 23) | (mm << 20));
}

/* The e4m3fn code of v: round to nearest, ties to even; a magnitude past
 * 448 (infinity too) saturates to 448, as the vendors' .satfinite
 * conversions; NaN gives 0x7f. Exact for every value e4m3 holds. */
MT_DEVICE unsigned mt_f32_to_fp8e4m3(float v)
{
    const unsigned u = mt_float_as_uint(v), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7fu;
    if (a >= 0x43e00000u) /* 448 */
        return s | 0x7eu;
    const int e = (int)(a >> 23) - 127;
    if (e < -6) { /* subnormal: a multiple of 2^-9, rounded to even */
        const float f = mt_uint_as_float(a) * 512.0f;
        unsigned m = (unsigned)f;
        const float r = f - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1u)))
            m++;
        return s | m; /* 8 is 2^-6, the smallest normal: the same code */
    }
    const unsigned keep = (a >> 20) & 7u, rest = a & 0xfffffu;
    unsigned code = ((unsigned)(e + 7) << 3) | keep;
    if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u)))
        code++;
    return s | (code > 0x7eu ? 0x7eu : code);
}

/* ---- matrix fragments (MFMA on AMD, mma.sync on NVIDIA, emulated on emu) --
 * One MMA multiplies an M x K tile of A by a K x N tile of B (bf16) and adds
 * an M x N tile of C (f32), with the tiles spread over the registers of one
 * whole wave (AMD, 64 lanes) or warp (NVIDIA, 32 lanes) as the vendor's
 * instruction lays them out. Every lane of the wave must make the same
 * mt_mma_bf16 call together (no lane may have exited, the block's waves
 * must be full); the loads and stores are per lane.
 *
 * MT_MMA_SHAPE (16 unless defined before use; a kernel may #undef and
 * #define it) picks the tile; MT_MMA_M/N/K are its compile-time size:
 *   16: AMD v_mfma_f32_16x16x16bf16_1k (16x16x16), NVIDIA m16n8k16 (16x8x16)
 *   32: AMD v_mfma_f32_32x32x8bf16_1k (32x32x8); none on NVIDIA
 * The emu backend uses AMD's layouts in wave64 modules, NVIDIA's in wave32.
 * Layouts (lane l): AMD A[m][k] in lane m + M*(k/4), element k%4; B[k][n]
 * in lane n + N*(k/4), element k%4; D[m][n] of 16x16 in lane n + 16*(m/4),
 * register m%4; of 32x32 in lane n + 32*((m/4)%2), register m%4 + 4*(m/8)
 * (AMD Matrix Instruction Calculator). NVIDIA: PTX ISA, "Matrix Fragments
 * for mma.m16n8k16 with floating point type".
 *
 *   MT_MMA_HAVE            1 where the target has these instructions (AMD
 *                          gfx90a/gfx94x/gfx950, NVIDIA sm_80+, emu); the
 *                          names below exist only then
 *   MT_MMA_HAVE_32         1 where MT_MMA_SHAPE 32 exists (AMD, emu wave64)
 *   MT_MMA_WAVE            lanes taking part in one MMA (64 AMD, 32 NVIDIA),
 *                          a compile-time constant (MT_WARP_SIZE may not be)
 *   mt_mma_a, mt_mma_b     A and B fragments (opaque)
 *   mt_mma_acc             the f32 accumulator: acc.x[i], i < MT_MMA_ACC_REGS,
 *                          is element (mt_mma_acc_row(i), mt_mma_acc_col(i))
 *                          of the tile for the calling lane
 *   mt_mma_acc_zero()
 *   mt_mma_load_a(p, ld)   A from a row-major M x K tile: A[m][k] = p[m*ld + k]
 *   mt_mma_load_b(p, ld)   B from a row-major K x N tile: B[k][n] = p[k*ld + n]
 *   mt_mma_load_bt(p, ld)  B from its transpose, row-major N x K:
 *                          B[k][n] = p[n*ld + k] (a weight stored [N][K])
 *                          load_a and load_bt need p 8-byte aligned and ld a
 *                          multiple of 4 (emu traps otherwise; declare LDS
 *                          tiles __attribute__((aligned(16)))); load_b has no
 *                          such need but makes narrow reads
 *   mt_mma_bf16(a, b, acc) -> acc + a x b: products exact, f32 accumulation
 *   mt_mma_store_acc(p, ld, acc)   p[row*ld + col] = acc.x[i] for every i
 *   mt_lane_id()           the calling thread's lane in its wave */
#define MT__CAT_(a, b) a##b
#define MT__CAT(a, b) MT__CAT_(a, b)
#ifndef MT_MMA_SHAPE
#define MT_MMA_SHAPE 16
#endif

#if defined(MT__MMA_LAYOUT)
#define MT_MMA_HAVE 1
#define MT_MMA_M MT__CAT(MT__MMA_M_, MT_MMA_SHAPE)
#define MT_MMA_N MT__CAT(MT__MMA_N_, MT_MMA_SHAPE)
#define MT_MMA_K MT__CAT(MT__MMA_K_, MT_MMA_SHAPE)
#define MT_MMA_ACC_REGS MT__CAT(MT__MMA_ACC_REGS_, MT_MMA_SHAPE)
#define mt_mma_a MT__CAT(mt__mma_a_, MT_MMA_SHAPE)
#define mt_mma_b MT__CAT(mt__mma_b_, MT_MMA_SHAPE)
#define mt_mma_acc MT__CAT(mt__mma_acc_, MT_MMA_SHAPE)
#define mt_mma_acc_zero() MT__CAT(mt__mma_acc_zero_, MT_MMA_SHAPE)()
#define mt_mma_acc_row(i) MT__CAT(mt__mma_acc_row_, MT_MMA_SHAPE)(i)
#define mt_mma_acc_col(i) MT__CAT(mt__mma_acc_col_, MT_MMA_SHAPE)(i)
#define mt_mma_load_a(p, ld)                                                   \
    MT__CAT(mt__mma_load_a_, MT_MMA_SHAPE)((p), (ld), __FILE__, __LINE__)
#define mt_mma_load_b(p, ld) MT__CAT(mt__mma_load_b_, MT_MMA_SHAPE)((p), (ld))
#define mt_mma_load_bt(p, ld)                                                  \
    MT__CAT(mt__mma_load_bt_, MT_MMA_SHAPE)((p), (ld), __FILE__, __LINE__)
#define mt_mma_bf16(a, b, acc)                                                 \
    MT__CAT(mt__mma_bf16_, MT_MMA_SHAPE)((a), (b), (acc), __FILE__, __LINE__)
#define mt_mma_store_acc(p, ld, acc)                                           \
    MT__CAT(mt__mma_store_acc_, MT_MMA_SHAPE)((p), (ld), (acc))
#else
#define MT_MMA_HAVE 0
#endif

#if defined(MT__MMA_LAYOUT) && MT__MMA_LAYOUT == 1
/* AMD wave64 (and emu wave64): A and B hold 4 consecutive k of one row
 * (A) or column (B) per lane. */
#define MT_MMA_HAVE_32 1
#define MT_MMA_WAVE 64
#define MT__MMA_M_16 16
#define MT__MMA_N_16 16
#define MT__MMA_K_16 16
#define MT__MMA_ACC_REGS_16 4
#define MT__MMA_M_32 32
#define MT__MMA_N_32 32
#define MT__MMA_K_32 8
#define MT__MMA_ACC_REGS_32 16
typedef struct mt__mma_a_16 { mt__mma_v4 x; } mt__mma_a_16;
typedef struct mt__mma_b_16 { mt__mma_v4 x; } mt__mma_b_16;
typedef struct mt__mma_acc_16 { mt__mma_f4 x; } mt__mma_acc_16;
typedef struct mt__mma_a_32 { mt__mma_v4 x; } mt__mma_a_32;
typedef struct mt__mma_b_32 { mt__mma_v4 x; } mt__mma_b_32;
typedef struct mt__mma_acc_32 { mt__mma_f16 x; } mt__mma_acc_32;

/* The lane's run of 4 k: row (A) or column (B) lane % w, from k = 4*(lane/w). */
#define MT__MMA_AMD_LOADS(S, W)                                                \
    MT__FN mt__mma_a_##S mt__mma_load_a_##S(const mt_bf16 *p, int ld, const char *f, \
                                             int l)                            \
    {                                                                          \
        mt__mma_a_##S r;                                                       \
        int lane = mt_lane_id();                                               \
        MT__MMA_CHECK(p, ld, "mt_mma_load_a: the tile must start 8-byte aligned and ld " \
                      "be a multiple of 4", f, l);                             \
        __builtin_memcpy(&r.x, MT__ALIGNED8(p + (lane % W) * ld + 4 * (lane / W)), 8); \
        return r;                                                              \
    }                                                                          \
    MT__FN mt__mma_b_##S mt__mma_load_bt_##S(const mt_bf16 *p, int ld, const char *f, \
                                              int l)                           \
    {                                                                          \
        mt__mma_b_##S r;                                                       \
        int lane = mt_lane_id();                                               \
        MT__MMA_CHECK(p, ld, "mt_mma_load_bt: the tile must start 8-byte aligned and " \
                      "ld be a multiple of 4", f, l);                          \
        __builtin_memcpy(&r.x, MT__ALIGNED8(p + (lane % W) * ld + 4 * (lane / W)), 8); \
        return r;                                                              \
    }                                                                          \
    MT__FN mt__mma_b_##S mt__mma_load_b_##S(const mt_bf16 *p, int ld)          \
    {                                                                          \
        mt__mma_b_##S r;                                                       \
        int lane = mt_lane_id();                                               \
        const mt_bf16 *q = p + 4 * (lane / W) * ld + lane % W;                 \
        for (int e = 0; e < 4; e++)                                            \
            r.x[e] = q[e * ld];                                                \
        return r;                                                              \
    }
MT__MMA_AMD_LOADS(16, 16)
MT__MMA_AMD_LOADS(32, 32)

MT__FN int mt__mma_acc_row_16(int i) { return 4 * (mt_lane_id() / 16) + i; }
MT__FN int mt__mma_acc_col_16(int i) { (void)i; return mt_lane_id() % 16; }
MT__FN int mt__mma_acc_row_32(int i)
{
    return (i % 4) + 4 * (mt_lane_id() / 32) + 8 * (i / 4);
}
MT__FN int mt__mma_acc_col_32(int i) { (void)i; return mt_lane_id() % 32; }

#if defined(MT_EMU)
#define MT__MMA_RUN(shape, a, b, c, d, f, l) mt__emu_mma((shape), &(a), &(b), (c).x, (d).x, (f), (l))
#define MT__MMA_SHAPE_16 MT_EMU_MMA_BF16_16X16X16
#define MT__MMA_SHAPE_32 MT_EMU_MMA_BF16_32X32X8
#else
#define MT__MMA_RUN(shape, a, b, c, d, f, l) ((d).x = shape((a).x, (b).x, (c).x, 0, 0, 0))
#define MT__MMA_SHAPE_16 __builtin_amdgcn_mfma_f32_16x16x16bf16_1k
#define MT__MMA_SHAPE_32 __builtin_amdgcn_mfma_f32_32x32x8bf16_1k
#endif
MT__FN mt__mma_acc_16 mt__mma_bf16_16(mt__mma_a_16 a, mt__mma_b_16 b, mt__mma_acc_16 c,
                                      const char *f, int l)
{
    mt__mma_acc_16 d;
    MT__MMA_RUN(MT__MMA_SHAPE_16, a, b, c, d, f, l);
    return d;
}
MT__FN mt__mma_acc_32 mt__mma_bf16_32(mt__mma_a_32 a, mt__mma_b_32 b, mt__mma_acc_32 c,
                                      const char *f, int l)
{
    mt__mma_acc_32 d;
    MT__MMA_RUN(MT__MMA_SHAPE_32, a, b, c, d, f, l);
    return d;
}

#elif defined(MT__MMA_LAYOUT) && MT__MMA_LAYOUT == 2
/* NVIDIA warp32 (and emu wave32): registers hold pairs of consecutive k,
 * the lower k in the low half; g = lane / 4, t = lane % 4. */
#define MT_MMA_HAVE_32 0
#define MT_MMA_WAVE 32
#define MT__MMA_M_16 16
#define MT__MMA_N_16 8
#define MT__MMA_K_16 16
#define MT__MMA_ACC_REGS_16 4
#define MT__MMA_M_32 mt_mma_shape_32_needs_an_amd_wave64_target
#define MT__MMA_N_32 mt_mma_shape_32_needs_an_amd_wave64_target
#define MT__MMA_K_32 mt_mma_shape_32_needs_an_amd_wave64_target
#define MT__MMA_ACC_REGS_32 mt_mma_shape_32_needs_an_amd_wave64_target
typedef struct mt__mma_a_16 { unsigned x[4]; } mt__mma_a_16;   /* a0..a7 */
typedef struct mt__mma_b_16 { unsigned x[2]; } mt__mma_b_16;   /* b0..b3 */
typedef struct mt__mma_acc_16 { float x[4]; } mt__mma_acc_16;  /* c0..c3 */

MT__FN unsigned mt__mma_pair(const mt_bf16 *p) { return *(const unsigned *)p; }

/* a0,a1: (g, 2t..2t+1); a2,a3: row g+8; a4..a7: the same 8 columns on. */
MT__FN mt__mma_a_16 mt__mma_load_a_16(const mt_bf16 *p, int ld, const char *f, int l)
{
    mt__mma_a_16 r;
    int lane = mt_lane_id(), g = lane / 4, t = lane % 4;
    MT__MMA_CHECK(p, ld, "mt_mma_load_a: the tile must start 8-byte aligned and ld be a "
                  "multiple of 4", f, l);
    r.x[0] = mt__mma_pair(p + g * ld + 2 * t);
    r.x[1] = mt__mma_pair(p + (g + 8) * ld + 2 * t);
    r.x[2] = mt__mma_pair(p + g * ld + 2 * t + 8);
    r.x[3] = mt__mma_pair(p + (g + 8) * ld + 2 * t + 8);
    return r;
}

/* b0,b1: k = 2t..2t+1 of column g; b2,b3: k + 8. */
MT__FN mt__mma_b_16 mt__mma_load_bt_16(const mt_bf16 *p, int ld, const char *f, int l)
{
    mt__mma_b_16 r;
    int lane = mt_lane_id(), g = lane / 4, t = lane % 4;
    MT__MMA_CHECK(p, ld, "mt_mma_load_bt: the tile must start 8-byte aligned and ld be a "
                  "multiple of 4", f, l);
    r.x[0] = mt__mma_pair(p + g * ld + 2 * t);
    r.x[1] = mt__mma_pair(p + g * ld + 2 * t + 8);
    return r;
}

MT__FN mt__mma_b_16 mt__mma_load_b_16(const mt_bf16 *p, int ld)
{
    mt__mma_b_16 r;
    int lane = mt_lane_id(), g = lane / 4, t = lane % 4;
    const mt_bf16 *q = p + 2 * t * ld + g;
    r.x[0] = (unsigned)q[0] | (unsigned)q[ld] << 16;
    r.x[1] = (unsigned)q[8 * ld] | (unsigned)q[9 * ld] << 16;
    return r;
}

MT__FN int mt__mma_acc_row_16(int i) { return mt_lane_id() / 4 + 8 * (i / 2); }
MT__FN int mt__mma_acc_col_16(int i) { return 2 * (mt_lane_id() % 4) + (i & 1); }

MT__FN mt__mma_acc_16 mt__mma_bf16_16(mt__mma_a_16 a, mt__mma_b_16 b, mt__mma_acc_16 c,
                                      const char *f, int l)
{
    mt__mma_acc_16 d;
#if defined(MT_EMU)
    mt__emu_mma(MT_EMU_MMA_BF16_16X8X16, &a, &b, c.x, d.x, f, l);
#else
    (void)f;
    (void)l;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),
          "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
#endif
    return d;
}
#endif

/* What every layout shares, per shape: zero and store. */
#define MT__MMA_COMMON(S)                                                      \
    MT__FN mt__mma_acc_##S mt__mma_acc_zero_##S(void)                          \
    {                                                                          \
        mt__mma_acc_##S r;                                                     \
        for (int i = 0; i < MT__MMA_ACC_REGS_##S; i++)                         \
            r.x[i] = 0.0f;                                                     \
        return r;                                                              \
    }                                                                          \
    MT__FN void mt__mma_store_acc_##S(float *p, int ld, mt__mma_acc_##S acc)   \
    {                                                                          \
        for (int i = 0; i < MT__MMA_ACC_REGS_##S; i++)                         \
            p[mt__mma_acc_row_##S(i) * ld + mt__mma_acc_col_##S(i)] = acc.x[i]; \
    }
#if defined(MT__MMA_LAYOUT)
MT__MMA_COMMON(16)
#endif
#if defined(MT__MMA_LAYOUT) && MT__MMA_LAYOUT == 1
MT__MMA_COMMON(32)
#endif

/* ---- 8-bit matrix fragments: fp8 e4m3 operands, f32 accumulator ---------
 * One MMA multiplies a 16 x 32 tile of A by a 32 x MT_MMA8_N tile of B:
 * AMD v_mfma_f32_16x16x32_fp8_fp8 (CDNA3 on; N 16), NVIDIA
 * mma.sync.m16n8k32.e4m3 (sm_89 on; N 8), emu: the vendor's by wave size.
 * K = 32 is one MXFP4 block: the kernels fill each operand from 8-element
 * groups of K, "pairs" of two 32-bit words, and never need to know where a
 * pair's bytes sit in the instruction: A and B filled from the same group
 * with the same slot order multiply element by element.
 *
 *   MT_MMA8_HAVE           1 where the instruction exists; the names below
 *                          exist only then
 *   MT_MMA8_M, _N, _K      16, 16 (AMD) or 8 (NVIDIA), 32
 *   MT_MMA8_WAVE           lanes taking part (64 AMD, 32 NVIDIA), a constant
 *   MT_MMA8_A_PAIRS        pairs a lane holds of A (1 AMD, 2 NVIDIA); of B
 *                          it holds one
 *   mt_mma8_kgroup()       the 8-element group of K (0..3) of all of this
 *                          lane's pairs
 *   mt_mma8_row_a(i)       the row of A (0..15) of this lane's pair i
 *   mt_mma8_col_b()        the column of B (0..N-1) of this lane's pair
 *   MT_MMA8_SLOT(e)        the byte (0..7; 0..3 in the first word) that
 *                          element e of a group takes in a pair: AMD puts
 *                          the even elements first (the low nibbles of
 *                          packed MXFP4), NVIDIA keeps the order
 *   mt_mma8_set_a(&a, i, w0, w1), mt_mma8_set_b(&b, w0, w1)
 *   mt_mma8_expand(w, lo, hi, &w0, &w1)  the pair of the 8 E2M1 codes of w
 *                          (element e in nibble e): each code's magnitude
 *                          (its low 3 bits) looked up in the 8-byte table
 *                          hi:lo (lo: magnitudes 0..3), its bit 3 as the
 *                          e4m3 sign; about 8 instructions on either vendor
 *   mt_mma8_load_a(p, ld)  A from a row-major 16 x 32 byte tile whose every
 *                          8-byte group is in slot order (p 8-byte aligned,
 *                          ld a multiple of 8)
 *   mt_mma8_load_b_packed4(p, ld, bstride, out)  out[j] = this lane's word
 *                          of packed MXFP4 (8 nibbles: group kgroup) of
 *                          column col_b's 16-byte block j, where column n's
 *                          block j is at p + n*ld + j*bstride: one ldmatrix
 *                          .x4 on NVIDIA (16-byte aligned rows), four
 *                          LDS reads on AMD
 *   mt_mma8_load_a_tile(p, ld), mt_mma8_load_bt_tile(p, ld)  A and B as
 *                          plain matrices of e4m3 bytes: A[m][k] = p[m*ld +
 *                          k] (16 x 32), B[k][n] = p[n*ld + k] (a [N][K]
 *                          tile, e.g. cache rows); element k of K is
 *                          instruction position k (no slot order); p
 *                          16-byte aligned, ld a multiple of 16 (ldmatrix
 *                          on NVIDIA, 8-byte LDS reads on AMD)
 *   MT_MMA8_A_BYTES, mt_mma8_a_cell(lane, e, &row, &k),
 *   mt_mma8_load_a_frag(p) A kept in fragment order (a buffer another
 *                          kernel wrote): the lane's MT_MMA8_A_BYTES bytes
 *                          (8 AMD, 16 NVIDIA) at p + lane * that, 16-byte
 *                          aligned; byte e of lane's A is element (row, k)
 *                          of the 16 x 32 tile, k its plain position
 *   mt_mma8_acc            the accumulator (as mt_mma_acc of shape 16):
 *                          acc.x[i] is element (mt_mma8_acc_row(i),
 *                          mt_mma8_acc_col(i)); mt_mma8_acc_zero()
 *   mt_mma8_fp8(a, b, acc) -> acc + a x b: products exact, f32 sums (the
 *                          vendors do not document the order) */
#if defined(MT__MMA8)
#define MT_MMA8_HAVE 1
#define MT_MMA8_M 16
#define MT_MMA8_K 32
typedef mt__mma_acc_16 mt_mma8_acc;
#define mt_mma8_acc_zero() mt__mma_acc_zero_16()
#define mt_mma8_acc_row(i) mt__mma_acc_row_16(i)
#define mt_mma8_acc_col(i) mt__mma_acc_col_16(i)
#define mt_mma8_fp8(a, b, acc) mt__mma8_fp8((a), (b), (acc), __FILE__, __LINE__)
#define mt_mma8_load_a(p, ld) mt__mma8_load_a((p), (ld), __FILE__, __LINE__)
#if MT__MMA8 == 1
/* AMD: a lane holds elements 8*(lane/16) .. +7 of K of row (A) or column
 * (B) lane % 16, in its two registers in order. */
#define MT_MMA8_N 16
#define MT_MMA8_WAVE 64
#define MT_MMA8_A_PAIRS 1
#define MT_MMA8_SLOT(e) (((e) & 1) * 4 + ((e) >> 1))
#define MT_MMA8_A_BYTES 8
typedef struct mt_mma8_a { unsigned x[2]; } mt_mma8_a;
typedef struct mt_mma8_b { unsigned x[2]; } mt_mma8_b;
MT__FN void mt_mma8_a_cell(int lane, int e, int *row, int *k)
{
    *row = lane % 16;
    *k = 8 * (lane / 16) + e;
}
MT__FN mt_mma8_a mt_mma8_load_a_frag(const unsigned char *p)
{
    const unsigned *w = (const unsigned *)MT__ALIGNED8(p + 8 * mt_lane_id());
    mt_mma8_a a;
    a.x[0] = w[0];
    a.x[1] = w[1];
    return a;
}
MT__FN int mt_mma8_kgroup(void) { return mt_lane_id() / 16; }
MT__FN int mt_mma8_row_a(int i) { return mt_lane_id() % 16 + 0 * i; }
MT__FN int mt_mma8_col_b(void) { return mt_lane_id() % 16; }
MT__FN void mt_mma8_set_a(mt_mma8_a *a, int i, unsigned w0, unsigned w1)
{
    (void)i;
    a->x[0] = w0;
    a->x[1] = w1;
}
MT__FN void mt_mma8_expand(unsigned w, unsigned lo, unsigned hi, unsigned *w0, unsigned *w1)
{
    *w0 = mt__perm(hi, lo, w & 0x07070707u) | ((w << 4) & 0x80808080u);
    *w1 = mt__perm(hi, lo, (w >> 4) & 0x07070707u) | (w & 0x80808080u);
}
MT__FN void mt_mma8_load_b_packed4(const unsigned char *p, int ld, int bstride, unsigned *out)
{
    const unsigned char *q = p + mt_mma8_col_b() * ld + 4 * mt_mma8_kgroup();
    for (int j = 0; j < 4; j++)
        out[j] = *(const unsigned *)(q + j * bstride);
}
/* The lane's 8 bytes of K (8*kgroup ..) of row (A) or column (B). */
#define mt_mma8_load_a_tile(p, ld) mt__mma8_tile_a((p), (ld), __FILE__, __LINE__)
#define mt_mma8_load_bt_tile(p, ld) mt__mma8_tile_bt((p), (ld), __FILE__, __LINE__)
MT__FN mt_mma8_a mt__mma8_tile_a(const unsigned char *p, int ld, const char *f, int l)
{
    MT__MMA_CHECK(p, (ld) & 15 ? 1 : 0, "mt_mma8_load_a_tile: the tile must start 16-byte "
                  "aligned and ld be a multiple of 16", f, l);
    const unsigned *w = (const unsigned *)MT__ALIGNED8(p + (mt_lane_id() % 16) * ld +
                                                       8 * mt_mma8_kgroup());
    mt_mma8_a a;
    a.x[0] = w[0];
    a.x[1] = w[1];
    return a;
}
MT__FN mt_mma8_b mt__mma8_tile_bt(const unsigned char *p, int ld, const char *f, int l)
{
    MT__MMA_CHECK(p, (ld) & 15 ? 1 : 0, "mt_mma8_load_bt_tile: the tile must start 16-byte "
                  "aligned and ld be a multiple of 16", f, l);
    const unsigned *w = (const unsigned *)MT__ALIGNED8(p + mt_mma8_col_b() * ld +
                                                       8 * mt_mma8_kgroup());
    mt_mma8_b b;
    b.x[0] = w[0];
    b.x[1] = w[1];
    return b;
}
MT__FN mt_mma8_acc mt__mma8_fp8(mt_mma8_a a, mt_mma8_b b, mt_mma8_acc c, const char *f, int l)
{
    mt_mma8_acc d;
#if defined(MT_EMU)
    mt__emu_mma(MT_EMU_MMA_FP8_16X16X32, &a, &b, c.x, d.x, f, l);
#else
    (void)f;
    (void)l;
    long av = (long)((unsigned long)a.x[0] | (unsigned long)a.x[1] << 32);
    long bv = (long)((unsigned long)b.x[0] | (unsigned long)b.x[1] << 32);
    d.x = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(av, bv, c.x, 0, 0, 0);
#endif
    return d;
}
#else
/* NVIDIA: g = lane / 4 and t = lane % 4; A's registers a0..a3 hold rows g,
 * g+8, g, g+8 at K 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3); B's b0, b1 K
 * 4t.. and 16+4t.. of column g. A pair's first word goes to the first
 * range, its second to the second. */
#define MT_MMA8_N 8
#define MT_MMA8_WAVE 32
#define MT_MMA8_A_PAIRS 2
#define MT_MMA8_SLOT(e) (e)
#define MT_MMA8_A_BYTES 16
typedef struct mt_mma8_a { unsigned x[4]; } mt_mma8_a;
typedef struct mt_mma8_b { unsigned x[2]; } mt_mma8_b;
MT__FN void mt_mma8_a_cell(int lane, int e, int *row, int *k)
{
    *row = lane / 4 + 8 * (e / 4 % 2);
    *k = 4 * (lane % 4) + e % 4 + 16 * (e / 8);
}
MT__FN mt_mma8_a mt_mma8_load_a_frag(const unsigned char *p)
{
    const mt_u32x4 v = mt_load16(p + 16 * mt_lane_id());
    mt_mma8_a a;
    a.x[0] = v.x;
    a.x[1] = v.y;
    a.x[2] = v.z;
    a.x[3] = v.w;
    return a;
}
MT__FN int mt_mma8_kgroup(void) { return mt_lane_id() % 4; }
MT__FN int mt_mma8_row_a(int i) { return mt_lane_id() / 4 + 8 * i; }
MT__FN int mt_mma8_col_b(void) { return mt_lane_id() / 4; }
MT__FN void mt_mma8_set_a(mt_mma8_a *a, int i, unsigned w0, unsigned w1)
{
    a->x[i] = w0;
    a->x[2 + i] = w1;
}
MT__FN void mt_mma8_expand(unsigned w, unsigned lo, unsigned hi, unsigned *w0, unsigned *w1)
{
    /* prmt takes four 4-bit selectors from the low half of its third
     * operand: the magnitudes, then each sign bit as selector 0 or 1 of
     * the bytes 0x00, 0x80 */
    const unsigned v = w >> 16;
    *w0 = mt__prmt(lo, hi, w & 0x7777u) | mt__prmt(0x8000u, 0u, (w >> 3) & 0x1111u);
    *w1 = mt__prmt(lo, hi, v & 0x7777u) | mt__prmt(0x8000u, 0u, (v >> 3) & 0x1111u);
}
/* A: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31) by ldmatrix .x4,
 * which hands lane (g, t) bytes 4t.. of row g of each: a0..a3 exactly.
 * B: (bytes 0-15 | 16-31) of the 8 columns by .x2: b0, b1. */
#define mt_mma8_load_a_tile(p, ld)                                             \
    mt__mma8_tile_a((p) + ((mt_lane_id() / 8) % 2 * 8 + mt_lane_id() % 8) * (ld) + \
                        (mt_lane_id() / 16) * 16, __FILE__, __LINE__)
#define mt_mma8_load_bt_tile(p, ld)                                            \
    mt__mma8_tile_bt((p) + (mt_lane_id() % 8) * (ld) + (mt_lane_id() / 8) % 2 * 16, __FILE__, \
                     __LINE__)
#if defined(MT_EMU)
#define mt_mma8_load_b_packed4(p, ld, bs, out)                                 \
    mt__ldsm4((p) + (mt_lane_id() % 8) * (ld) + (mt_lane_id() / 8) * (bs), (out), __FILE__, \
              __LINE__)
MT__FN mt_mma8_a mt__mma8_tile_a(const unsigned char *row, const char *f, int l)
{
    mt_mma8_a a;
    mt__ldsm4(row, a.x, f, l);
    return a;
}
MT__FN mt_mma8_b mt__mma8_tile_bt(const unsigned char *row, const char *f, int l)
{
    unsigned x[4];
    mt__ldsm4(row, x, f, l); /* .x2 reads the first two matrices */
    mt_mma8_b b;
    b.x[0] = x[0];
    b.x[1] = x[1];
    return b;
}
#else
MT__FN mt_mma8_a mt__mma8_tile_a(const unsigned char *row, const char *f, int l)
{
    (void)f;
    (void)l;
    mt_mma8_a a;
    unsigned ad = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a.x[0]), "=r"(a.x[1]), "=r"(a.x[2]), "=r"(a.x[3])
                 : "r"(ad));
    return a;
}
MT__FN mt_mma8_b mt__mma8_tile_bt(const unsigned char *row, const char *f, int l)
{
    (void)f;
    (void)l;
    mt_mma8_b b;
    unsigned ad = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(b.x[0]), "=r"(b.x[1])
                 : "r"(ad));
    return b;
}
MT__FN void mt_mma8_load_b_packed4(const unsigned char *p, int ld, int bstride, unsigned *out)
{
    const int l = mt_lane_id();
    unsigned a = (unsigned)__cvta_generic_to_shared(p + (l % 8) * ld + (l / 8) * bstride);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(a));
}
#endif
MT__FN mt_mma8_acc mt__mma8_fp8(mt_mma8_a a, mt_mma8_b b, mt_mma8_acc c, const char *f, int l)
{
    mt_mma8_acc d;
#if defined(MT_EMU)
    mt__emu_mma(MT_EMU_MMA_E4M3_16X8X32, &a, &b, c.x, d.x, f, l);
#else
    (void)f;
    (void)l;
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),
          "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
#endif
    return d;
}
#endif
MT__FN void mt_mma8_set_b(mt_mma8_b *b, unsigned w0, unsigned w1)
{
    b->x[0] = w0;
    b->x[1] = w1;
}
MT__FN mt_mma8_a mt__mma8_load_a(const unsigned char *p, int ld, const char *f, int l)
{
    mt_mma8_a a;
    MT__MMA_CHECK(p, (ld) & 7 ? 1 : 0, "mt_mma8_load_a: the tile must start 8-byte aligned and "
                  "ld be a multiple of 8", f, l);
    const int q = 8 * mt_mma8_kgroup();
    for (int i = 0; i < MT_MMA8_A_PAIRS; i++) {
        const unsigned *w = (const unsigned *)MT__ALIGNED8(p + mt_mma8_row_a(i) * ld + q);
        mt_mma8_set_a(&a, i, w[0], w[1]);
    }
    return a;
}
#else
#define MT_MMA8_HAVE 0
#endif

#endif
