/* 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) x Q8_0, 256-bit.
 * Included by kernels_avx2.c (vpmaddubsw + vpmaddwd) and kernels_avx512.c
 * (AVX512-VL VNNI vpdpbusd on ymm). The includer defines
 *   Q32_SFX(name)      the instantiation's name
 *   dot_s8s8(w, a)     8 int32 partial sums of s8 x s8 (activations within +-127)
 *   dot_u8s8(w, a)     8 int32 partial sums of u8 (<= 31) x s8
 * and the helpers hsum256 and load_2h (kernels_x86_common.h). Not a standalone header. */

/* 32 nibbles of a Q4_0/Q4_1 block as bytes: weights 0..15 low nibbles, 16..31 high. */
static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m128i m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4));
}

/* Bit j of qh (32 bits) -> 0x10 in byte j. */
static inline __m256i qh_bits32(const uint8_t *qh4)
{
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m256i v = _mm256_set1_epi32((int)qh);
    v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static float Q32_SFX(dot_q8_0)(int64_t n, const void *w, const void *act)
{
    const block_q8_0 *x = w, *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        __m256i p = dot_s8s8(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        float d = _cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    return hsum256(acc);
}

static float Q32_SFX(dot_q4_0)(int64_t n, const void *w, const void *act)
{
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK4_0; i++) {
        __m256i q = _mm256_sub_epi8(nibbles32(x[i].qs), _mm256_set1_epi8(8));
        __m256i p = dot_s8s8(q, _mm256_loadu_si256((const __m256i *)y[i].qs));
        float d = _cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    return hsum256(acc);
}

/* MXFP4: each nibble looked up (vpshufb) as its doubled E2M1 value, an
 * integer within +-12; the block scale is a power of two. */
static float Q32_SFX(dot_mxfp4)(int64_t n, const void *w, const void *act)
{
    const block_mxfp4 *x = w;
    const block_q8_0 *y = act;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)sw_fp4_values));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        __m256i q = _mm256_shuffle_epi8(lut, nibbles32(x[i].qs));
        __m256i p = dot_s8s8(q, _mm256_loadu_si256((const __m256i *)y[i].qs));
        float d = sw_e8m0_half(x[i].e) * _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    return hsum256(acc);
}

static float Q32_SFX(dot_q5_0)(int64_t n, const void *w, const void *act)
{
    const block_q5_0 *x = w;
    const block_q8_0 *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK5_0; i++) {
        __m256i q = _mm256_or_si256(nibbles32(x[i].qs), qh_bits32(x[i].qh));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        __m256i p = dot_s8s8(q, _mm256_loadu_si256((const __m256i *)y[i].qs));
        float d = _cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc);
    }
    return hsum256(acc);
}

/* Q4_1 / Q5_1: d*q + m, so sum = d*da*sum(q*a) + m*da*sum(a). */
static float Q32_SFX(dot_q4_1)(int64_t n, const void *w, const void *act)
{
    const block_q4_1 *x = w;
    const block_q8_0 *y = act;
    const __m256i ones8 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK4_1; i++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p = dot_u8s8(nibbles32(x[i].qs), a), s = dot_u8s8(ones8, a);
        __m128 dm = load_2h(&x[i].d);
        float da = _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_mm_cvtss_f32(dm) * da), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dm)) * da), acc);
    }
    return hsum256(acc);
}

static float Q32_SFX(dot_q5_1)(int64_t n, const void *w, const void *act)
{
    const block_q5_1 *x = w;
    const block_q8_0 *y = act;
    const __m256i ones8 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK5_1; i++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i q = _mm256_or_si256(nibbles32(x[i].qs), qh_bits32(x[i].qh));
        __m256i p = dot_u8s8(q, a), s = dot_u8s8(ones8, a);
        __m128 dm = load_2h(&x[i].d);
        float da = _cvtsh_ss(y[i].d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_mm_cvtss_f32(dm) * da), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dm)) * da), acc);
    }
    return hsum256(acc);
}

