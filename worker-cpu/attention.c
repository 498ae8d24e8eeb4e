/* Attention tile kernels over the KV cache (half or q8_0): the same body
 * (attn_body.h) compiled for AVX-512, AVX2+F16C and plain C, differing only
 * in how halves and int8 become floats and back (one vcvtph2ps /
 * vcvtps2ph / vpmovsxbd + vcvtdq2ps, or a loop) and in the register width
 * the tiles are sized for. The ISA follows
 * the matmul kernels' choice (cpuid, or SPILLWAY_ISA). */
#include "worker-cpu/attention.h"
#include "llm/model.h"   /* SW_MAX_HEAD_DIM */

#include <immintrin.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));

const char *sw_kv_type_name(sw_kv_type t) { return t == SW_KV_Q8_0 ? "q8_0" : "f16"; }

bool sw_kv_type_parse(const char *name, sw_kv_type *t)
{
    if (!strcmp(name, "f16")) *t = SW_KV_F16;
    else if (!strcmp(name, "q8_0")) *t = SW_KV_Q8_0;
    else return false;
    return true;
}

sw_f16 sw_attn_to_f16(float f)
{
    if (f > 65504.0f) f = 65504.0f;
    if (f < -65504.0f) f = -65504.0f;
    return sw_f32_to_f16(f);
}

/* Software prefetch distances: K blocks and V rows ahead. The caches'
 * own prefetchers left both kernels at about 5 GB/s a core, streamed. */
#ifndef ATTN_PF_BLOCKS
#define ATTN_PF_BLOCKS 1
#endif
#ifndef ATTN_PF_ROWS
#define ATTN_PF_ROWS 32
#endif
#ifndef ATTN_PF_LOC
#define ATTN_PF_LOC 3   /* into L1 (prefetcht0); into L2 measured the same */
#endif
#define ATTN_LINE_HALVES (64 / (int)sizeof(sw_f16))   /* halves in a cache line */

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
#define ATTN_SFX(name) name##_scalar
#define VEC v16
#define VEC_W 16
#define PV_VECS 4
#define TO_F16_16(x, y) do { for (int i_ = 0; i_ < 16; i_++) (y)[i_] = sw_attn_to_f16((x)[i_]); } while (0)
#define LOADV(p) ({ const sw_f16 *p_ = (p); v16 r_; for (int i_ = 0; i_ < 16; i_++) r_[i_] = sw_f16_to_f32(p_[i_]); r_; })
#define LOADQ(p) ({ const int8_t *p_ = (p); v16 r_; for (int i_ = 0; i_ < 16; i_++) r_[i_] = (float)p_[i_]; r_; })
#define HALF1(p) sw_f16_to_f32(*(p))
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef VEC
#undef VEC_W
#undef PV_VECS
#undef LOADV
#undef LOADQ
#undef HALF1
#undef TO_F16_16

/* ---- AVX2 + F16C ----
 * Halves are stored clamped, min(C, x) then max(-C, .) with x second: a NaN
 * comes through as NaN, as in sw_attn_to_f16, and vcvtps2ph rounds to
 * nearest even like it. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define CVT8(x, y) _mm_storeu_si128((__m128i *)(y), _mm256_cvtps_ph(_mm256_max_ps(_mm256_set1_ps(-65504.0f), \
    _mm256_min_ps(_mm256_set1_ps(65504.0f), _mm256_loadu_ps(x))), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define TO_F16_16(x, y) do { CVT8((x), (y)); CVT8((x) + 8, (y) + 8); } while (0)
#define ATTN_SFX(name) name##_avx2
#define VEC v8
#define VEC_W 8
#define PV_VECS 2
#define LOADV(p) ((v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define LOADQ(p) ((v8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))))
#define HALF1(p) _cvtsh_ss(*(p))
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef VEC
#undef VEC_W
#undef PV_VECS
#undef LOADV
#undef LOADQ
#undef HALF1
#undef TO_F16_16
#undef CVT8
#pragma GCC pop_options

/* ---- AVX-512 (the same clamp as AVX2) ---- */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")
#define TO_F16_16(x, y) _mm256_storeu_si256((__m256i *)(y), _mm512_cvtps_ph(_mm512_max_ps(_mm512_set1_ps(-65504.0f), \
    _mm512_min_ps(_mm512_set1_ps(65504.0f), _mm512_loadu_ps(x))), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define ATTN_SFX(name) name##_avx512
#define VEC v16
#define VEC_W 16
#define PV_VECS 4
#define LOADV(p) ((v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#define LOADQ(p) ((v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))))
#define HALF1(p) _cvtsh_ss(*(p))
#include "worker-cpu/attn_body.h"
#undef ATTN_SFX
#undef VEC
#undef VEC_W
#undef PV_VECS
#undef LOADV
#undef LOADQ
#undef HALF1
#undef TO_F16_16
#pragma GCC pop_options

const sw_attn_kernels *sw_attn_kernels_for(sw_isa isa)
{
    switch (isa) {
    case SW_ISA_AVX512: return &kernels_avx512;
    case SW_ISA_AVX2: return &kernels_avx2;
    default: return &kernels_scalar;
    }
}
