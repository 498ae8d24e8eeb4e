/* Attention tile kernels over the half-precision KV cache: the same body
 * (attn_body.h) compiled for AVX-512, AVX2+F16C and plain C, differing only
 * in how 16 halves become 16 floats (one vcvtph2ps, two, or a loop). The
 * ISA follows the matmul kernels' choice (cpuid, or SPILLWAY_ISA). */
#include "worker-cpu/attention.h"

#include <immintrin.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));

sw_f16 sw_attn_to_f16(float f)
{
    if (f > 65504.0f) f = 65504.0f;
    if (f < -65504.0f) f = -65504.0f;
    return sw_f32_to_f16(f);
}

/* Rows r0..r0+3 of a tile of 4 (stride apart); rows at or past M read the
 * zero row instead, so the kernels need no tail cases. */
static inline void tile_rows(const float *base, size_t stride, int M, int r0, const float *zero,
                             const float *rows[4])
{
    for (int i = 0; i < 4; i++) rows[i] = r0 + i < M ? base + (size_t)(r0 + i) * stride : zero;
}

/* ---- plain C ----
 * (The loaders are statement expressions: a function returning a 64-byte
 * vector has a different ABI with and without AVX-512, which GCC warns of.) */
static void to_f16_scalar(const float *x, sw_f16 *y, int n)
{
    for (int i = 0; i < n; i++) y[i] = sw_attn_to_f16(x[i]);
}
#define ATTN_SFX(name) name##_scalar
#define LOAD16(p) ({ const sw_f16 *p_ = (p); v16 r_; for (int i_ = 0; i_ < 16; i_++) r_[i_] = sw_f16_to_f32(p_[i_]); r_; })
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef LOAD16

/* ---- AVX2 + F16C ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* min(C, x) then max(-C, .) with x second: a NaN comes through as NaN, as in
 * sw_attn_to_f16; vcvtps2ph rounds to nearest even like it. */
static void to_f16_avx2(const float *x, sw_f16 *y, int n)
{
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(x + i)));
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) y[i] = sw_attn_to_f16(x[i]);
}
#define ATTN_SFX(name) name##_avx2
#define LOAD16(p) ({ const sw_f16 *p_ = (p); \
    __builtin_shufflevector((v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p_)), \
                            (v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p_ + 8))), \
                            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); })
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef LOAD16
#pragma GCC pop_options

/* ---- AVX-512 ---- */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")
static void to_f16_avx512(const float *x, sw_f16 *y, int n)
{
    const __m512 hi = _mm512_set1_ps(65504.0f), lo = _mm512_set1_ps(-65504.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_max_ps(lo, _mm512_min_ps(hi, _mm512_loadu_ps(x + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) y[i] = sw_attn_to_f16(x[i]);
}
#define ATTN_SFX(name) name##_avx512
#define LOAD16(p) ((v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef LOAD16
#pragma GCC pop_options

const sw_attn_kernels *sw_attn_kernels_for(sw_isa isa)
{
    switch (isa) {
    case SW_ISA_AVX512: return &kernels_avx512;
    case SW_ISA_AVX2: return &kernels_avx2;
    default: return &kernels_scalar;
    }
}
