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
 *   MT_DEVICE                 before a helper: `MT_DEVICE float g(...)`
 *   MT_DYN_SHARED(T, name)    declares the dynamic shared array `T name[]`
 *   MT_WARP_SIZE              warp/wave size (a run-time value on emu)
 *   mt_shfl_{xor,up,down,idx}_{f32,i32}(v, lane_arg)   full-warp shuffles
 *   mt_ballot(pred) -> unsigned long long, mt_any(pred), mt_all(pred)
 *   mt_bf16 (unsigned short), mt_bf16_to_f32, mt_f32_to_bf16 (RNE)
 *   mt_e2m1_to_f32(code4), mt_e8m0_to_f32(code8), mt_fp8e4m3_to_f32(code8)
 *   mt_f32_to_e2m1(v) -> code4 (RNE, saturating; kernels/mxfp4.h's rule)
 *   mt_float_as_uint, mt_uint_as_float, mt_expf, mt_sqrtf, mt_rsqrtf, mt_fmaxf
 *
 * No vendor #ifdef may appear in a kernel source: only here. */
#ifndef MT_PRELUDE_GPU_H
#define MT_PRELUDE_GPU_H

#if defined(MT_EMU)
/* ---- the CPU emulator (device/emu*.c); the text is pasted in by the emu
 * backend ahead of this file. ---------------------------------------------- */
/* prelude_emu.h is pasted ahead of this file by the emu backend. */

#elif defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
/* ---- AMD, through hipRTC ---------------------------------------------- */
#define MT_KERNEL extern "C" __global__
#define MT_DEVICE static __device__ inline
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

#elif defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* ---- NVIDIA, through NVRTC --------------------------------------------- */
#define MT_KERNEL extern "C" __global__
#define MT_DEVICE static __device__ inline
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

#endif
