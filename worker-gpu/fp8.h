/* FP8 E4M3 (the "fn" variant: no infinities, S.1111.111 is NaN, max ±448,
 * subnormals down to 2^-9) and the bf16 rounding the GPU applies to
 * activations.
 *
 * Encoding matches CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
 * bit for bit: round to nearest, ties to even; |x| > 448 (infinities too)
 * saturates to ±448 (0x7E/0xFE); NaN becomes 0x7F with the input's sign bit
 * ORed in (so -NaN -> 0xFF, as cuda_fp8.hpp does); magnitudes <= 2^-10 flush
 * to a zero that keeps the sign. The emulation backend and the CUDA kernels
 * therefore produce the same weight bytes. */
#ifndef SW_FP8_H
#define SW_FP8_H

#include <stdint.h>
#include <stddef.h>

#define SW_FP8_MAX 448.0f

typedef uint8_t sw_fp8;

sw_fp8 sw_fp8_from_f32(float x);
float sw_fp8_to_f32(sw_fp8 c);
/* All 256 decoded values (NaN codes give NaN), for table-driven loops. */
const float *sw_fp8_table(void);

/* Quantizes one row with a per-row scale: q[i] = fp8(x[i] / scale) where
 * scale = amax/448 (1 for an all-zero row), so the row's largest magnitude
 * maps to ±448. Returns the scale; x[i] ~= scale * decode(q[i]). */
float sw_fp8_quantize_row(const float *x, size_t n, sw_fp8 *q);

/* Rounds a float to the nearest bf16 value (ties to even), returned as float:
 * the value a bf16 activation buffer would hold. */
float sw_round_bf16(float x);

#endif
