/* mxfp4.h: host utilities for OCP MXFP4 in AMD Quark's checkpoint layout.
 *
 * An MXFP4 tensor [rows, K] (K a multiple of 32) is two arrays:
 *   packed  uint8 [rows, K/2]: element 2i in the LOW nibble of byte i,
 *           element 2i+1 in the HIGH nibble (packed along K);
 *   scales  uint8 [rows, K/32]: one E8M0 code per 32-element block.
 * Element codes are FP4 E2M1 [sign | exp(2) | mantissa(1)]: magnitudes
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0-7, codes 8-15 negated (8 is -0).
 * An E8M0 code c is the scale 2^(c-127); 0xFF is NaN; 0 is 2^-127.
 *
 * Quantization rule ("even", Quark's default and vLLM/aiter's dynamic
 * rule): amax = max |x| over the block as float bits; bits are rounded up at
 * the mantissa's top, (bits + 0x200000) & 0xFF800000; the shared exponent is
 * floor(log2(rounded)) - 2, clamped to [-127, 127]; each element is
 * multiplied by 2^-exponent (exact, a power of two), rounded to the nearest
 * E2M1 magnitude with ties to the even code and saturated at 6. A zero
 * magnitude is always stored as code 0 (never -0). A block holding a NaN
 * gets scale code 0xFF and element codes 0. Every kernel that quantizes
 * (mxfp4_quant, the a4w4 GEMM paths) follows exactly this rule, so their
 * output is compared bit for bit with these functions.
 *
 * All functions are pure and thread-safe; arrays are caller-owned. */
#ifndef MT_KERN_MXFP4_H
#define MT_KERN_MXFP4_H

#include <stdbool.h>
#include <stdint.h>

#define MXFP4_BLOCK 32

/* Value of an E2M1 code (low 4 bits used). */
float mxfp4_e2m1_decode(unsigned code);
/* Nearest E2M1 code of v (already divided by the block scale): ties to the
 * even code, |v| > 6 saturates to +-6, zero magnitude gives code 0. NaN
 * gives code 0 (the block's scale carries the NaN). */
unsigned mxfp4_e2m1_encode(float v);

/* 2^(code-127); 0xFF is NaN, 0 is 2^-127 (a subnormal float). */
float mxfp4_e8m0_decode(unsigned code);
/* Block scale code from a block's amax by the "even" rule (amax >= 0;
 * NaN gives 0xFF, +inf gives 253). */
unsigned mxfp4_e8m0_from_amax(float amax);
/* The shared exponent of a scale code (code - 127). */
static inline int mxfp4_e8m0_exponent(unsigned code) { return (int)(code & 0xffu) - 127; }

/* Packs n codes (one per byte, low 4 bits; n even) into n/2 bytes, code 2i
 * in the low nibble. */
void mxfp4_pack(const uint8_t *codes, int64_t n, uint8_t *packed);
/* Unpacks n codes (n even) from n/2 bytes into one code per byte. */
void mxfp4_unpack(const uint8_t *packed, int64_t n, uint8_t *codes);

/* Quantizes one row of k floats (k % 32 == 0) into packed[k/2] and
 * scales[k/32] by the rule above. */
void mxfp4_quantize_row(const float *x, int64_t k, uint8_t *packed, uint8_t *scales);
/* Same for a bf16 row (values as raw bf16 bits). */
void mxfp4_quantize_row_bf16(const uint16_t *x, int64_t k, uint8_t *packed,
                             uint8_t *scales);
/* Quantizes a row-major float matrix [rows, k]: packed [rows, k/2],
 * scales [rows, k/32]. */
void mxfp4_quantize_matrix(const float *x, int64_t rows, int64_t k, uint8_t *packed,
                           uint8_t *scales);
/* Dequantizes one row of k elements into out[k]. */
void mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t k,
                          float *out);
/* Quantize-then-dequantize of one row (what an a4w4 kernel computes with). */
void mxfp4_roundtrip_row(const float *x, int64_t k, float *out);

#endif
