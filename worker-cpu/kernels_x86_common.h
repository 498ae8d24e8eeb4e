/* Small x86 helpers shared by the AVX2 and AVX-512 kernel files. Include it
 * inside the file's `#pragma GCC target` region: the helpers take that ISA. */
#ifndef SW_KERNELS_X86_COMMON_H
#define SW_KERNELS_X86_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Horizontal sum of 8 floats. */
static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Two fp16 values at p (e.g. a K-block's d, dmin) as floats. */
static inline __m128 load_2h(const void *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
}

#endif
