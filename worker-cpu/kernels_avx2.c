/* AVX2 + FMA + F16C kernels.
 *
 * Compiled for a generic x86-64 with the target pragma below; kernels.c only
 * installs them after cpuid confirmed AVX2/FMA/F16C. The integer core is
 * vpmaddubsw (unsigned weight x signed activation byte pairs -> int16) then
 * vpmaddwd against the sub-block scale (-> int32), so a block's scales cost
 * nothing extra. These 32-byte-block kernels (Q4_0..Q8_0) are also what the
 * AVX-512 table uses for those types.
 */
#include "worker-cpu/kernels_impl.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "worker-cpu/kernels_x86_common.h"

/* 8 int32 -> 8 int8 with saturation, as the reference clamps. */
static inline void store_q8x32(int8_t *dst, __m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i q = _mm256_packs_epi16(ab, cd);
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)dst, q);
}

/* ---- activation quantization (bit-identical to the reference) ------------------ */

static void quant_q8_k_avx2(const float *x, void *dst, int64_t n)
{
    block_q8_k *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 vmax = _mm256_set1_ps(-INFINITY), vmin = _mm256_set1_ps(INFINITY);
        for (int j = 0; j < 32; j++) {
            __m256 v = _mm256_loadu_ps(x + 8 * j);
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        float mx = -INFINITY, mn = INFINITY, tmp[8];
        _mm256_storeu_ps(tmp, vmax);
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, tmp[j]);
        _mm256_storeu_ps(tmp, vmin);
        for (int j = 0; j < 8; j++) mn = fminf(mn, tmp[j]);
        float pick = sw_q8k_pick(x, mx, mn);
        if (pick == 0) { memset(&y[i], 0, sizeof y[i]); continue; }
        float iscale = -128.0f / pick;
        __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < 8; j++) {
            const float *p = x + 32 * j;
            store_q8x32(y[i].qs + 32 * j,
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vs)),
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 8), vs)),
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 16), vs)),
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + 24), vs)));
        }
        /* bsums: pairs of bytes, then pairs of words -> 16 sums of 16 */
        const __m256i ones8 = _mm256_set1_epi8(1);
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * j));
            __m256i s16 = _mm256_maddubs_epi16(ones8, q);           /* 16 sums of 2 */
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); /* 8 sums of 4 */
            int32_t v[8];
            _mm256_storeu_si256((__m256i *)v, s32);
            y[i].bsums[2 * j] = (int16_t)(v[0] + v[1] + v[2] + v[3]);
            y[i].bsums[2 * j + 1] = (int16_t)(v[4] + v[5] + v[6] + v[7]);
        }
        y[i].d = 1.0f / iscale;
    }
}

static void quant_q8_0_avx2(const float *x, void *dst, int64_t n)
{
    block_q8_0 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        float tmp[8], amax = 0;
        _mm256_storeu_ps(tmp, m);
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, tmp[j]);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        y[i].d = sw_f32_to_f16(d);
        __m256 vid = _mm256_set1_ps(id);
        store_q8x32(y[i].qs, _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid)), _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid)),
                    _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid)), _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid)));
    }
}

/* ---- float dots ------------------------------------------------------------------- */

static float dot_f32_avx2(int64_t n, const void *w, const void *act)
{
    const float *a = w, *b = act;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static float dot_f16_avx2(int64_t n, const void *w, const void *act)
{
    const uint16_t *a = w;
    const float *b = act;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                               _mm256_loadu_ps(b + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

static float dot_bf16_avx2(int64_t n, const void *w, const void *act)
{
    const uint16_t *a = w;
    const float *b = act;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + i)));
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(b + i), acc);
    }
    float s = hsum256(acc);
    for (; i < n; i++) s += sw_bf16_to_f32(a[i]) * b[i];
    return s;
}

/* ---- 32-weight blocks x Q8_0 ---------------------------------------------------------- */

/* 8 int32 partial sums of s8 w x s8 a (|a| <= 127; w = -128 is fine). */
static inline __m256i dot_s8s8(__m256i w, __m256i a)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 8 int32 partial sums of u8 w (<= 31) x s8 a. */
static inline __m256i dot_u8s8(__m256i w, __m256i a)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

#define Q32_SFX(name) name##_avx2
#include "worker-cpu/kernels_q32_body.h"
#undef Q32_SFX

/* ---- K-quants x Q8_K -------------------------------------------------------------------- */

/* Q4_K / Q5_K 6-bit scales and mins as 16 words: 0..7 scales, 8..15 mins. */
static inline __m256i k_scales_words(const uint8_t *s)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4); memcpy(&w1, s + 4, 4); memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3f, m_lo = w1 & 0x3f3f3f3f;
    uint32_t sc_hi = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo));
}

/* shuffle_epi8 patterns broadcasting word j (0..7) of each lane */
static inline __m256i word_bcast(__m256i v, int j)
{
    __m256i pat = _mm256_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8)));
    return _mm256_shuffle_epi8(v, pat);
}

/* Q4_K (qh == NULL) and Q5_K. */
static inline __attribute__((always_inline)) void
k45_rows(int64_t n, const uint8_t *wbase, size_t bsize, bool five, const void *act, size_t stride, const int NT,
         float *out, size_t ostride)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                            8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
    __m256 facc[SW_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *blk = wbase + i * bsize;
        /* Q4_K: d dmin scales[12] qs[128]; Q5_K: d dmin scales[12] qh[32] qs[128] */
        const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = five ? blk + 48 : blk + 16;
        __m256i sw = k_scales_words(scales);
        __m256i scb = _mm256_permute2x128_si256(sw, sw, 0x00);   /* scales in both lanes */
        __m256i mb = _mm256_permute2x128_si256(sw, sw, 0x11);    /* mins in both lanes */
        /* mins per bsum pair: low lane m0..m3 doubled, high lane m4..m7 doubled */
        __m256i mins = _mm256_shuffle_epi8(mb, dup_lo);
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        __m256i isum[SW_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                __m256i hb = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c));
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            }
            __m256i s_lo = word_bcast(scb, 2 * c), s_hi = word_bcast(scb, 2 * c + 1);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++) {
                const block_q8_k *y = sw_act_block(act, stride, t, i);
                __m256i a_lo = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
                __m256i a_hi = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
                __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), s_lo),
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), s_hi));
                isum[t] = _mm256_add_epi32(isum[t], p);
            }
        }
        __m128 dd = load_2h(blk);
        float d = _mm_cvtss_f32(dd), dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            const block_q8_k *y = sw_act_block(act, stride, t, i);
            __m256i mm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins);
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * y->d), facc[t]);
            facc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dmin * y->d), facc[t]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) out[t * ostride] = hsum256(facc[t]);
}

static inline __attribute__((always_inline)) void
q4_k_rows(int64_t n, const void *w, const void *act, size_t stride, const int NT, float *out, size_t ostride)
{
    k45_rows(n, w, sizeof(block_q4_k), false, act, stride, NT, out, ostride);
}

static inline __attribute__((always_inline)) void
q5_k_rows(int64_t n, const void *w, const void *act, size_t stride, const int NT, float *out, size_t ostride)
{
    k45_rows(n, w, sizeof(block_q5_k), true, act, stride, NT, out, ostride);
}

static inline __attribute__((always_inline)) void
q6_k_rows(int64_t n, const void *wv, const void *act, size_t stride, const int NT, float *out, size_t ostride)
{
    const block_q6_k *b = wv;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 facc[SW_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m256i isum[SW_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)),
            };
            /* scales of sub-blocks 8h..8h+7 in both lanes; for k, low lane takes 2k, high lane 2k+1 */
            __m256i sch = h ? _mm256_permute2x128_si256(sc, sc, 0x11) : _mm256_permute2x128_si256(sc, sc, 0x00);
            _Pragma("GCC unroll 4")
            for (int k = 0; k < 4; k++) {
                __m256i pat = _mm256_setr_epi8(4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,
                                               4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,
                                               4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3,
                                               4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3);
                __m256i s = _mm256_shuffle_epi8(sch, pat);
                _Pragma("GCC unroll 4")
                for (int t = 0; t < NT; t++) {
                    const block_q8_k *y = sw_act_block(act, stride, t, i);
                    __m256i a = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], a), s));
                }
            }
        }
        float d = _cvtsh_ss(b->d);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            const block_q8_k *y = sw_act_block(act, stride, t, i);
            /* quants are stored +32: subtract 32 * sum_j sc_j * bsum_j */
            __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc), 5);
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], off)), _mm256_set1_ps(d * y->d), facc[t]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) out[t * ostride] = hsum256(facc[t]);
}

/* AVX2 has 16 registers: at most 4 tokens per pass; aux is not used (the
 * bsums go through vpmaddwd against the mins instead). */
#define KQ_ENTRY(kind)                                                                                   \
    static float dot_##kind##_avx2(int64_t n, const void *w, const void *act) {                         \
        float r;                                                                                         \
        kind##_rows(n, w, act, 0, 1, &r, 0);                                                             \
        return r;                                                                                        \
    }                                                                                                    \
    static void dotn_##kind##_avx2(int64_t n, const void *w, const void *act, size_t stride,            \
                                   const float *aux, size_t aux_stride, int ntok, float *out,            \
                                   size_t ostride) {                                                     \
        (void)aux; (void)aux_stride;                                                                     \
        while (ntok > 0) {                                                                               \
            switch (ntok) {                                                                              \
            case 1: kind##_rows(n, w, act, stride, 1, out, ostride); break;                              \
            case 2: kind##_rows(n, w, act, stride, 2, out, ostride); break;                              \
            case 3: kind##_rows(n, w, act, stride, 3, out, ostride); break;                              \
            default: kind##_rows(n, w, act, stride, 4, out, ostride); break;                             \
            }                                                                                            \
            int done = ntok < 4 ? ntok : 4;                                                              \
            ntok -= done;                                                                                \
            act = (const uint8_t *)act + (size_t)done * stride;                                          \
            out += (size_t)done * ostride;                                                               \
        }                                                                                                \
    }
KQ_ENTRY(q4_k)
KQ_ENTRY(q5_k)
KQ_ENTRY(q6_k)
#undef KQ_ENTRY

/* Software prefetch distance (into L2) of the packed kernels below: the
 * VNNI kernels'. Q4_K's kernel prefetches at one token only where
 * sw_prefetch_one_token says so; the others need it at batch 1 to reach the
 * bandwidth everywhere (docs/perf/cpu.md, "The 32-weight types"). */
#ifndef SW_AVX2_PF
#define SW_AVX2_PF (16 * (int)sizeof(sw_q4k16))
#endif

/* Prefetches the n bytes at p's place SW_AVX2_PF ahead into L2, a line at a time. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *p, size_t n)
{
    _Pragma("GCC unroll 8")   /* straight-line: as a loop it cost Q4_K at 4 tokens 12-15% */
    for (size_t l = 0; l < n; l += 64) _mm_prefetch((const char *)p + l + SW_AVX2_PF, _MM_HINT_T1);
}

/* Part j of 8 of the same for a K-quant block (n bytes), called once per
 * sub-block: the lines spread over the block's work instead of asked all
 * at its start. For Q6_K's 53 lines that took the streamed kernel from
 * 8.7-8.9 to 10.5 GB/s a core at one token and from 57-58 to 60-63
 * GMAC/s at 16 tokens (Intel host; docs/perf/cpu.md, "AVX2 packed Q6_K, 8
 * tokens a pass"). */
static inline __attribute__((always_inline)) void prefetch_ahead_part(const void *p, size_t n, int j)
{
    const size_t part = (n + 8 * 64 - 1) / (8 * 64) * 64;   /* whole lines: a few of the next block too */
    prefetch_ahead((const char *)p + part * (size_t)j, part);
}

/* s16 + the word products (vpmaddubsw) of w against activation bytes
 * a[0..3], broadcast to the 8 rows' dwords. */
static inline __attribute__((always_inline)) __m256i add_products(__m256i s16, __m256i w, const int8_t *a)
{
    int32_t x;
    memcpy(&x, a, 4);
    return _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, _mm256_set1_epi32(x)));
}

/* s16 + the products of lo against a[0..3] and of hi against a[4..7]. */
static inline __attribute__((always_inline)) __m256i add_pair_products(__m256i s16, __m256i lo, __m256i hi,
                                                                       const int8_t *a)
{
    return add_products(add_products(s16, lo, a), hi, a + 4);
}

/* A packed Q4_K / Q5_K block's per-row factors for 8 rows from r0: the
 * mins as words, d and dmin. */
typedef struct {
    __m256i mn[4];
    __m256 d, dmin;
} k_block_rows;

static inline __attribute__((always_inline)) k_block_rows k_block_load(const sw_q4k16 *p, int r0)
{
    k_block_rows kb;
    _Pragma("GCC unroll 4")
    for (int q = 0; q < 4; q++) kb.mn[q] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p->mn[q][r0]));
    kb.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + r0)));
    kb.dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->dmin + r0)));
    return kb;
}

/* total + da * (d * acc - dmin * mins . bs): the block's end for one token,
 * acc its scaled sums, bs its 4 dwords of paired 32-sums, da its scale. */
static inline __attribute__((always_inline)) __m256 k_block_add(const k_block_rows *kb, __m256i acc, const int32_t *bs,
                                                                 float da, __m256 total)
{
    __m256i m = _mm256_madd_epi16(kb->mn[0], _mm256_set1_epi32(bs[0]));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(kb->mn[1], _mm256_set1_epi32(bs[1])));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(kb->mn[2], _mm256_set1_epi32(bs[2])));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(kb->mn[3], _mm256_set1_epi32(bs[3])));
    __m256 r = _mm256_fmsub_ps(kb->d, _mm256_cvtepi32_ps(acc), _mm256_mul_ps(kb->dmin, _mm256_cvtepi32_ps(m)));
    return _mm256_fmadd_ps(r, _mm256_set1_ps(da), total);
}

/* ---- prepacked Q4_K x tokens (sw_q4k16), without VNNI ----
 * The same packed blocks as the AVX-512 VNNI kernel, 8 rows per ymm.
 * vpmaddubsw multiplies byte pairs into words; a sub-block's 8 of them per
 * row pair (16 products of at most 15 x 128, so |sum| <= 30720) are summed
 * as words and widened once, by vpmaddwd against the rows' sub-block scale.
 * So per 32 multiply-adds there is one vpmaddubsw and (7 in 8) one word
 * add, and per 256 one vpmaddwd. A pass takes both 8-row halves of the
 * group for up to 4 tokens: each unpacked vector (an and, or a shift and
 * an and) serves 4 tokens and each broadcast activation dword both halves.
 * The 8 word sums, the 4 unpacked vectors, the mask and a broadcast fill
 * 15 of the 16 ymm; the widened sums live in memory (one load and store
 * per sub-block, half, token). Software prefetch into L2, spread over the
 * sub-blocks: at 8 tokens it took the streamed figure from 50 to 84 GMAC/s
 * a core; at one token only where pf1 (sw_prefetch_one_token: on the Intel
 * host it took the stream from 16 to 30 GB/s, on AMD it was slower).
 * (docs/perf/cpu.md, "CPUs without AVX-512", "AVX2 packed Q4_K, 4 tokens
 * a pass" and "Software prefetch at one token".) */

/* v for the compiler, which may neither move its computation nor
 * reassociate the sums through it (GCC otherwise computed all the products
 * of a sub-block first and spilled them). */
static inline __attribute__((always_inline)) __m256i kept(__m256i v)
{
    __asm__("" : "+x"(v));
    return v;
}

/* Sub-block j of block p for both halves and NT tokens (a[t]: their Q8_K
 * quants): acc[h][t] += the rows' scale j x their word sums. */
static inline __attribute__((always_inline)) void
q4k16_sub_avx2(const sw_q4k16 *p, int j, const int8_t *const *a, const int NT, __m256i acc[2][4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i s16[2][4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < 4; c++) {
        const __m256i v0 = _mm256_load_si256((const __m256i *)p->qs[j][c]);
        const __m256i v1 = _mm256_load_si256((const __m256i *)(p->qs[j][c] + 32));
        const __m256i lo[2] = {_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4)};
        const __m256i hi[2] = {_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4)};
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            int32_t x;
            memcpy(&x, a[t] + 32 * j + 8 * c, 4);
            __m256i b = _mm256_set1_epi32(x);
            _Pragma("GCC unroll 2")
            for (int h = 0; h < 2; h++) {
                const __m256i m = _mm256_maddubs_epi16(lo[h], b);
                s16[h][t] = kept(c ? _mm256_add_epi16(s16[h][t], m) : m);
            }
            memcpy(&x, a[t] + 32 * j + 8 * c + 4, 4);
            b = _mm256_set1_epi32(x);
            _Pragma("GCC unroll 2")
            for (int h = 0; h < 2; h++)
                s16[h][t] = kept(_mm256_add_epi16(s16[h][t], _mm256_maddubs_epi16(hi[h], b)));
        }
    }
    /* each row's scale in both words of its dword: rows 8h..8h+3 in the low lane, 8h+4.. the high */
    const __m256i scb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p->sc[j]));
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        const char z = (char)0x80, r = (char)(8 * h);
        const __m256i sc = _mm256_shuffle_epi8(scb, _mm256_setr_epi8(
            r, z, r, z, r + 1, z, r + 1, z, r + 2, z, r + 2, z, r + 3, z, r + 3, z,
            r + 4, z, r + 4, z, r + 5, z, r + 5, z, r + 6, z, r + 6, z, r + 7, z, r + 7, z));
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) acc[h][t] = _mm256_add_epi32(acc[h][t], _mm256_madd_epi16(s16[h][t], sc));
    }
}

static inline __attribute__((always_inline)) void
q4k16_rows_avx2(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                size_t bsp_stride, const int NT, float *out, size_t ostride, const bool pf1)
{
    __m256 total[2][4];
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) total[h][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        const int8_t *a[4];
        __m256i acc[2][4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            a[t] = sw_act_block(act, stride, t, i)->qs;
            acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 1")
        for (int j = 0; j < 8; j++) {
            if (NT > 1 || pf1)
                prefetch_ahead_part(p, sizeof *p, j);
            q4k16_sub_avx2(p, j, a, NT, acc);
        }
        /* mins: word pairs (m_2q, m_2q+1) per row against the token's paired 32-sums */
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            k_block_rows kb = k_block_load(p, 8 * h);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++)
                total[h][t] = k_block_add(&kb, acc[h][t], bsp + (size_t)t * bsp_stride + 4 * i,
                                          sw_act_block(act, stride, t, i)->d, total[h][t]);
        }
    }
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + t * ostride + 8 * h, total[h][t]);
}

static void q4k16_avx2(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                       size_t bsp_stride, int ntok, float *out, size_t ostride)
{
    for (int t0 = 0; t0 < ntok; t0 += 4) {
        const uint8_t *a = (const uint8_t *)act + (size_t)t0 * stride;
        const int32_t *b = bsp + (size_t)t0 * bsp_stride;
        float *o = out + (size_t)t0 * ostride;
        switch (ntok - t0) {
        case 1: q4k16_rows_avx2(p, nb, a, stride, b, bsp_stride, 1, o, ostride, false); break;
        case 2: q4k16_rows_avx2(p, nb, a, stride, b, bsp_stride, 2, o, ostride, false); break;
        case 3: q4k16_rows_avx2(p, nb, a, stride, b, bsp_stride, 3, o, ostride, false); break;
        default: q4k16_rows_avx2(p, nb, a, stride, b, bsp_stride, 4, o, ostride, false); break;
        }
    }
}

/* The same with software prefetch at one token too (sw_prefetch_one_token) */
static void q4k16_pf1_avx2(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                           size_t bsp_stride, int ntok, float *out, size_t ostride)
{
    if (ntok == 1) q4k16_rows_avx2(p, nb, act, stride, bsp, bsp_stride, 1, out, ostride, true);
    else q4k16_avx2(p, nb, act, stride, bsp, bsp_stride, ntok, out, ostride);
}


/* ---- prepacked Q5_K x tokens (sw_q5k16), without VNNI ----
 * Q4_K's kernel shares each unpacked vector between 2 tokens; with Q5_K's
 * fifth bits (a shift, an and and an or per vector) that was too few: it
 * lost to the raw rows (docs/perf/cpu.md, "CPUs without AVX-512"). So: one 8-row
 * half per pass, up to 4 tokens, the second half's pass finding the lines
 * in L1/L2. Quants reach 31, so a sub-block's word sums are widened by the
 * scale every 8 products (two vectors). Mins as in Q4_K's kernel. */
static inline __attribute__((always_inline)) void
q5k16_half_avx2(const sw_q5k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                size_t bsp_stride, const int NT, float *out, size_t ostride, const int h)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    const int r0 = 8 * h;
    __m256 total[4];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) total[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        __m256i acc[4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            if (h == 0)   /* the pass that reads the lines from memory */
                prefetch_ahead_part(p, sizeof *p, j);
            /* each row's scale in both words of its dword */
            __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p->q4.sc[j] + r0)));
            sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
            const __m256i hb = _mm256_load_si256((const __m256i *)(p->qh[j] + 32 * h));
            __m256i s16[4];
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++) s16[t] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_load_si256((const __m256i *)(p->q4.qs[j][c] + 32 * h));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                /* bits 2c and 2c + 1 of hb to bit 4 (no bit crosses a byte: masked to bit 4) */
                __m256i blo = 4 - 2 * c >= 0 ? _mm256_slli_epi16(hb, 4 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 4);
                __m256i bhi = 3 - 2 * c >= 0 ? _mm256_slli_epi16(hb, 3 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 3);
                lo = _mm256_or_si256(lo, _mm256_and_si256(blo, m10));
                hi = _mm256_or_si256(hi, _mm256_and_si256(bhi, m10));
                _Pragma("GCC unroll 4")
                for (int t = 0; t < NT; t++)
                    s16[t] = add_pair_products(s16[t], lo, hi, sw_act_block(act, stride, t, i)->qs + 32 * j + 8 * c);
                if (c % 2)   /* 8 products of up to 31 x 128 a word: widen before a ninth */
                    _Pragma("GCC unroll 4")
                    for (int t = 0; t < NT; t++) {
                        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s16[t], sc));
                        s16[t] = _mm256_setzero_si256();
                    }
            }
        }
        k_block_rows kb = k_block_load(&p->q4, r0);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++)
            total[t] = k_block_add(&kb, acc[t], bsp + (size_t)t * bsp_stride + 4 * i, sw_act_block(act, stride, t, i)->d,
                                   total[t]);
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + t * ostride + r0, total[t]);
}

/* The entry point of a kernel written one 8-row half at a time, HALF_ROWS:
 * tokens HALF_W (4 or 8) at a time, both halves, the constant token count
 * picked per pass by SW_FOR_NT (a count above HALF_W is never asked, nor
 * compiled), as kernels_avx512.c's SW_Q16_ENTRY does. */
#define HALF_CALL(k)                                                                                   \
    if ((k) <= HALF_W) HALF_ROWS(p, nb, a, stride, b, bsp_stride, (k) <= HALF_W ? (k) : 1, o, ostride, h)
#define HALF_ENTRY(name, block)                                                                         \
    static void name(const block *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,    \
                     size_t bsp_stride, int ntok, float *out, size_t ostride)                            \
    {                                                                                                    \
        for (int t0 = 0; t0 < ntok; t0 += HALF_W) {                                                      \
            const uint8_t *a = (const uint8_t *)act + (size_t)t0 * stride;                               \
            const int32_t *b = bsp + (size_t)t0 * bsp_stride;                                            \
            float *o = out + (size_t)t0 * ostride;                                                       \
            const int n = ntok - t0 < HALF_W ? ntok - t0 : HALF_W;                                       \
            for (int h = 0; h < 2; h++) SW_FOR_NT(n, HALF_CALL)                                          \
        }                                                                                                \
    }

#define HALF_ROWS q5k16_half_avx2
#define HALF_W 4
HALF_ENTRY(q5k16_avx2, sw_q5k16)
#undef HALF_ROWS
#undef HALF_W

/* ---- prepacked Q6_K x tokens (sw_q6k16), without VNNI ----
 * Q5_K's structure: one 8-row half per pass, but up to 8 tokens sharing
 * each unpacked vector (a 6-bit quant is a nibble and two high bits: two
 * shifts, two ands and an or per vector, as Q5_K's fifth bit). Its sums are
 * widened every vector, so the 8 tokens need only their 8 int32 sums in
 * registers: at 8 tokens a pass it ran 14% faster than at 4 (Q5_K, whose
 * word sums live across two vectors, would spill them). Quants reach 63, so
 * a 16-weight sub-block's word sums are widened by its int8 scale every 4
 * products a word (two vpmaddubsw: at most 4 x 63 x 128 = 32256), against
 * Q4_K's 16 and Q5_K's 8. The scale multiplies in that vpmaddwd, so the
 * +32 offset must be scaled too: per sub-block pair one more vpmaddwd of
 * the rows' (32 sc_2j, 32 sc_2j+1) words against the token's
 * (-bsum_2j, -bsum_2j+1) (bsp / 32, exact), starting the sums. */

/* Token t's (-bsum_2j, -bsum_2j+1) int16 pairs for one block as dwords
 * j = 0..7, from its 16 dwords of -32 bsums (sw_q6k16_fn's bsp). */
static inline __attribute__((always_inline)) void q6k_bsum_pairs(const int32_t *bs, int32_t *pairs)
{
    __m256i b0 = _mm256_srai_epi32(_mm256_loadu_si256((const __m256i *)bs), 5);
    __m256i b1 = _mm256_srai_epi32(_mm256_loadu_si256((const __m256i *)(bs + 8)), 5);
    /* packs interleaves the lanes: b0[0..3] b1[0..3] | b0[4..7] b1[4..7] */
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(b0, b1), 0xD8);
    _mm256_store_si256((__m256i *)pairs, w);
}

static inline __attribute__((always_inline)) void
q6k16_half_avx2(const sw_q6k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                size_t bsp_stride, const int NT, float *out, size_t ostride, const int h)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    /* word 0 / word 1 of each dword into both of its words */
    const __m256i dup0 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                          0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup1 = _mm256_add_epi8(dup0, _mm256_set1_epi8(2));
    const int r0 = 8 * h;
    __m256 total[8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        int32_t pairs[8][8] __attribute__((aligned(32)));
        __m256i acc[8];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) {
            q6k_bsum_pairs(bsp + (size_t)t * bsp_stride + 16 * i, pairs[t]);
            acc[t] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 1")
        for (int j = 0; j < 8; j++) {
            if (h == 0)   /* the pass that reads the lines from memory */
                prefetch_ahead_part(p, sizeof *p, j);
            /* row r's dword: (sc_2j, sc_2j+1) as words */
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p->sc[j][r0]));
            const __m256i sc32 = _mm256_slli_epi16(scw, 5);   /* |32 sc| <= 4096 */
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++)
                acc[t] = kept(_mm256_add_epi32(acc[t], _mm256_madd_epi16(sc32, _mm256_set1_epi32(pairs[t][j]))));
            _Pragma("GCC unroll 2")
            for (int hh = 0; hh < 2; hh++) {   /* sub-block 2j + hh */
                const __m256i hb = _mm256_load_si256((const __m256i *)(p->qh[j][hh] + 32 * h));
                const __m256i s = _mm256_shuffle_epi8(scw, hh ? dup1 : dup0);
                _Pragma("GCC unroll 2")
                for (int e = 0; e < 2; e++) {
                    const int c = 2 * hh + e;
                    __m256i v = _mm256_load_si256((const __m256i *)(p->ql[j][c] + 32 * h));
                    /* pieces 2e and 2e + 1 of hb (bits 4e.., 4e + 2..) to bits 4, 5 */
                    __m256i hlo = e ? hb : _mm256_slli_epi16(hb, 4);
                    __m256i hhi = e ? _mm256_srli_epi16(hb, 2) : _mm256_slli_epi16(hb, 2);
                    __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hlo, m30));
                    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                 _mm256_and_si256(hhi, m30));
                    _Pragma("GCC unroll 8")
                    for (int t = 0; t < NT; t++) {
                        __m256i s16 = add_pair_products(_mm256_setzero_si256(), lo, hi,
                                                        sw_act_block(act, stride, t, i)->qs + 32 * j + 8 * c);
                        acc[t] = kept(_mm256_add_epi32(acc[t], _mm256_madd_epi16(s16, s)));
                    }
                }
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + r0)));
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++)
            total[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]),
                                       _mm256_mul_ps(d, _mm256_set1_ps(sw_act_block(act, stride, t, i)->d)), total[t]);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + t * ostride + r0, total[t]);
}

#define HALF_ROWS q6k16_half_avx2
#define HALF_W 8
HALF_ENTRY(q6k16_avx2, sw_q6k16)
#undef HALF_ROWS
#undef HALF_W

/* 8 E8M0 exponents (bytes) as the floats 2^(e - 128), sw_e8m0_half's
 * values: e - 1 in the exponent field, and for e = 0, 1 the denormals. */
static inline __m256 e8m0_half8(const uint8_t *e8)
{
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e8));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, denormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* ---- prepacked 32-weight types (the sw_q32x16 form), without VNNI ----
 * 8 rows per ymm (32 bytes of each 64-byte quant vector). Up to 2 tokens
 * take both 8-row halves of the group in one pass; 3 or 4 take one half
 * per pass (registers), the second pass finding the lines in L1/L2.
 * vpmaddubsw sums byte pairs into words, widened by vpmaddwd against ones:
 *   Q4_x (quants <= 15): a block's 8 vectors summed as words first (16
 *     products of at most 15 x 127 a word), one widening per block;
 *   Q5_x (<= 31): two word sums (4 vectors each, 8 products), two widenings;
 *   Q8_0 (signed): vpmaddubsw of |w| against a's bytes signed by w (pairs of
 *     at most 128 x 127), widened per vector, since two would overflow.
 * The offset and the scales are applied as in the VNNI kernel. */
/* One 8-row half of a Q8_0 block against NT tokens, into acc: vpmaddubsw
 * of |w| against a's bytes signed by w, widened per vector. */
static inline __attribute__((always_inline)) void
q8_products(const uint8_t *qh, const int8_t *const *a, const int NT, __m256i *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    _Pragma("GCC unroll 1")
    for (int k = 0; k < 8; k++) {
        __m256i w = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(qh + 64 * k)),
                                     _mm256_set1_epi8((char)0x80));
        __m256i aw = _mm256_abs_epi8(w);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            int32_t x;
            memcpy(&x, a[t] + 4 * k, 4);
            __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(x), w));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
        }
    }
}

/* The same for the nibble types (Q4_x, Q5_x with their fifth bits, MXFP4
 * through its table): word sums first, widened once or twice a block. */
static inline __attribute__((always_inline)) void
nibble_products(const uint8_t *qh, const int8_t *const *a, const int NT, __m256i *acc, const bool q5, const bool mx)
{
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(SW_MXFP4_LUT_U8));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    __m256i s16[4][2];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
    const __m256i hb = q5 ? _mm256_load_si256((const __m256i *)(qh + 256)) : _mm256_setzero_si256();
    _Pragma("GCC unroll 1")
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_load_si256((const __m256i *)(qh + 64 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (mx) {   /* E2M1 values + 12 */
            lo = _mm256_shuffle_epi8(lut, lo);
            hi = _mm256_shuffle_epi8(lut, hi);
        }
        if (q5) {   /* bits c and c + 4 of hb to bit 4 of each byte */
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hb, c), 4), m10));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16(hb, c), m10));
        }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) {
            s16[t][0] = add_products(s16[t][0], lo, a[t] + 4 * c);
            /* Q5_x and MXFP4 (quants up to 31, 24): the high half its own sum */
            s16[t][q5 || mx] = add_products(s16[t][q5 || mx], hi, a[t] + 16 + 4 * c);
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NT; t++) {
        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s16[t][0], ones));
        if (q5 || mx) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s16[t][1], ones));
    }
}

static inline __attribute__((always_inline)) void
q32x16_rows_avx2(const uint8_t *q, const uint16_t *s, int64_t nb, const void *act, size_t stride,
                 const sw_q32_aux *aux, size_t aux_stride, const int NT, float *out, size_t ostride, const int h0,
                 const int NH, const sw_type type)
{
    const bool q8 = type == SW_TYPE_Q8_0, q5 = type == SW_TYPE_Q5_0 || type == SW_TYPE_Q5_1;
    const bool has_m = type == SW_TYPE_Q4_1 || type == SW_TYPE_Q5_1, mx = type == SW_TYPE_MXFP4;
    /* the unsigned quants' offset; Q8_0 is multiplied signed, the _1 types have m instead */
    const int off = q8 ? 0 : sw_q32_offset(type);
    const size_t qb = sw_q32x16_qbytes(type), sw = sw_q32x16_sbytes(type) / 2;
    __m256 total[2][4];
    for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) total[h][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, q += qb, s += sw) {
        const int8_t *a[4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) a[t] = ((const block_q8_0 *)((const uint8_t *)act + (size_t)t * stride) + i)->qs;
        if (h0 == 0) {   /* the pass that reads the lines from memory */
            prefetch_ahead(q, qb);
            _mm_prefetch((const char *)s + SW_AVX2_PF / qb * sw * 2, _MM_HINT_T1);
        }
        for (int h = 0; h < NH; h++) {
            const uint8_t *qh = q + 32 * (h0 + h);
            __m256i acc[4];
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++)
                acc[t] = _mm256_set1_epi32(aux[(size_t)t * aux_stride + i].neg_sum * off);
            if (q8) q8_products(qh, a, NT, acc);
            else nibble_products(qh, a, NT, acc, q5, mx);
            const int r0 = 8 * (h0 + h);
            const __m256 d = mx ? e8m0_half8((const uint8_t *)s + r0)
                                : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + r0)));
            const __m256 m = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 + r0))) : _mm256_setzero_ps();
            _Pragma("GCC unroll 4")
            for (int t = 0; t < NT; t++) {
                const sw_q32_aux *x = aux + (size_t)t * aux_stride + i;
                total[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]), _mm256_mul_ps(d, _mm256_set1_ps(x->d)), total[h][t]);
                if (has_m) total[h][t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x->d_sum), total[h][t]);
            }
        }
    }
    for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(out + t * ostride + 8 * (h0 + h), total[h][t]);
}

/* Tokens 4 at a time: up to 2 in one pass over both halves, 3 or 4 in a
 * pass per half; `type` is a constant in each entry point below. */
static inline __attribute__((always_inline)) void
q32x16_entry_avx2(const sw_type type, const uint8_t *q, const uint16_t *s, int64_t nb, const void *act,
                  size_t stride, const sw_q32_aux *aux, size_t aux_stride, int ntok, float *out, size_t ostride)
{
    for (int t0 = 0; t0 < ntok; t0 += 4) {
        const uint8_t *a = (const uint8_t *)act + (size_t)t0 * stride;
        const sw_q32_aux *x = aux + (size_t)t0 * aux_stride;
        float *o = out + (size_t)t0 * ostride;
        switch (ntok - t0) {
        case 1: q32x16_rows_avx2(q, s, nb, a, stride, x, aux_stride, 1, o, ostride, 0, 2, type); break;
        case 2: q32x16_rows_avx2(q, s, nb, a, stride, x, aux_stride, 2, o, ostride, 0, 2, type); break;
        case 3:
            for (int h = 0; h < 2; h++) q32x16_rows_avx2(q, s, nb, a, stride, x, aux_stride, 3, o, ostride, h, 1, type);
            break;
        default:
            for (int h = 0; h < 2; h++) q32x16_rows_avx2(q, s, nb, a, stride, x, aux_stride, 4, o, ostride, h, 1, type);
            break;
        }
    }
}
#define SW_Q32_ENTRY(name, type) SW_Q32_ENTRY_POINT(avx2, q32x16_entry_avx2, name, type)
SW_Q32_TYPES(SW_Q32_ENTRY)
#undef SW_Q32_ENTRY


/* ---- the int8 form (sw_i8x16) on 256-bit registers -------------------------
 * The expanders: the AVX-512 ones' steps, one 8-row half at a time, to the
 * same bytes (sw_i8x16_ref_block). */

/* 8 rows' factors of one sub-block (a, b) as the expander's word vectors:
 * A = rint(128 a id), C = 64 - rint(128 b id), each row's word twice in
 * its dword, then spread as unpacklo (rows 4L, 4L + 1 of lane L: idx lo)
 * and unpackhi (rows 4L + 2, 4L + 3) lay them out. */
static inline __attribute__((always_inline)) void i8_spread_avx2(__m256 a, __m256 b, __m256 id, __m256i *A, __m256i *C)
{
    const __m256 k128 = _mm256_set1_ps(128.0f);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    __m256i a7 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(a, id), k128));
    __m256i c7 = _mm256_sub_epi32(_mm256_set1_epi32(64), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(b, id), k128)));
    a7 = _mm256_or_si256(_mm256_and_si256(a7, lo16), _mm256_slli_epi32(a7, 16));
    c7 = _mm256_or_si256(_mm256_and_si256(c7, lo16), _mm256_slli_epi32(c7, 16));
    const __m256i ilo = _mm256_setr_epi32(0, 0, 1, 1, 4, 4, 5, 5), ihi = _mm256_setr_epi32(2, 2, 3, 3, 6, 6, 7, 7);
    A[0] = _mm256_permutevar8x32_epi32(a7, ilo);
    A[1] = _mm256_permutevar8x32_epi32(a7, ihi);
    C[0] = _mm256_permutevar8x32_epi32(c7, ilo);
    C[1] = _mm256_permutevar8x32_epi32(c7, ihi);
}

/* 32 unsigned quants of 8 rows (lanes 4r + e) to the form's bytes,
 * v = (q A - B + 64) >> 7 in words, as the VNNI expander. */
static inline __attribute__((always_inline)) __m256i i8_bytes_avx2(__m256i q, const __m256i *A, const __m256i *C)
{
    const __m256i z = _mm256_setzero_si256();
    const __m256i lo = _mm256_srai_epi16(_mm256_add_epi16(_mm256_mullo_epi16(_mm256_unpacklo_epi8(q, z), A[0]), C[0]), 7);
    const __m256i hi = _mm256_srai_epi16(_mm256_add_epi16(_mm256_mullo_epi16(_mm256_unpackhi_epi8(q, z), A[1]), C[1]), 7);
    return _mm256_xor_si256(_mm256_packs_epi16(lo, hi), _mm256_set1_epi8((char)0x80));
}

/* 8 rows' scale from nsub sub-blocks' factors (stored to d); returns
 * 127 / amax (0 where amax is 0), as sw_i8x16_ref_block. */
static inline __m256 i8_scale_avx2(const __m256 *a, const __m256 *b, int nsub, float qmax, float *d)
{
    const __m256 qm = _mm256_set1_ps(qmax), k127 = _mm256_set1_ps(127.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int s = 0; s < nsub; s++)
        amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_andnot_ps(sign, b[s]),
                                                 _mm256_andnot_ps(sign, _mm256_fmsub_ps(qm, a[s], b[s]))));
    _mm256_storeu_ps(d, _mm256_div_ps(amax, k127));
    return _mm256_and_ps(_mm256_div_ps(k127, amax), _mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_GT_OQ));
}

static inline __attribute__((always_inline)) __m256i shift_bits_avx2(__m256i h, int s)
{
    return s >= 0 ? _mm256_slli_epi16(h, s) : _mm256_srli_epi16(h, -s);
}

/* Q4_K and Q5_K (q5): a_j = d sc_j, b_j = dmin m_j per 32-weight
 * sub-block; one 8-row half (hh) at a time. */
static inline __attribute__((always_inline)) void i8_expand_qk_avx2(const uint8_t *blocks, int64_t nb, sw_i8x16 *out,
                                                                    const bool q5)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10), lo8 = _mm256_set1_epi32(0xff);
    const size_t bb = q5 ? sizeof(sw_q5k16) : sizeof(sw_q4k16);
    for (int64_t i = 0; i < nb; i++, blocks += bb, out++) {
        const sw_q4k16 *p = (const sw_q4k16 *)blocks;
        for (int hh = 0; hh < 2; hh++) {
            const int r0 = 8 * hh;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + r0)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->dmin + r0)));
            __m256 a[8], b[8];
            for (int q = 0; q < 4; q++) {
                __m256i mw = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p->mn[q][r0]));
                b[2 * q] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_and_si256(mw, lo8)));
                b[2 * q + 1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(mw, 8)));
            }
            for (int j = 0; j < 8; j++)
                a[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p->sc[j] + r0)))));
            const __m256 id = i8_scale_avx2(a, b, 8, q5 ? 31.0f : 15.0f, out->d + r0);
            for (int j = 0; j < 8; j++) {
                __m256i A[2], C[2];
                i8_spread_avx2(a[j], b[j], id, A, C);
                const __m256i h = q5 ? _mm256_load_si256((const __m256i *)(((const sw_q5k16 *)blocks)->qh[j] + 32 * hh))
                                     : _mm256_setzero_si256();
                for (int c = 0; c < 4; c++) {
                    __m256i v = _mm256_load_si256((const __m256i *)(p->qs[j][c] + 32 * hh));
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (q5) {
                        lo = _mm256_or_si256(lo, _mm256_and_si256(shift_bits_avx2(h, 4 - 2 * c), m10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(shift_bits_avx2(h, 3 - 2 * c), m10));
                    }
                    _mm256_storeu_si256((__m256i *)(out->q[8 * j + 2 * c] + 32 * hh), i8_bytes_avx2(lo, A, C));
                    _mm256_storeu_si256((__m256i *)(out->q[8 * j + 2 * c + 1] + 32 * hh), i8_bytes_avx2(hi, A, C));
                }
            }
        }
    }
}

static void i8_q4k_avx2(const void *blocks, int64_t nb, sw_i8x16 *out) { i8_expand_qk_avx2(blocks, nb, out, false); }
static void i8_q5k_avx2(const void *blocks, int64_t nb, sw_i8x16 *out) { i8_expand_qk_avx2(blocks, nb, out, true); }

/* Q6_K: a_s = d sc_s, b_s = 32 a_s per 16-weight sub-block; the quants
 * rebuilt from ql and qh as in q6k16_half_avx2. */
static void i8_q6k_avx2(const void *blocks, int64_t nb, sw_i8x16 *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const sw_q6k16 *p = blocks;
    for (int64_t i = 0; i < nb; i++, p++, out++)
        for (int hh = 0; hh < 2; hh++) {
            const int r0 = 8 * hh;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p->d + r0))), k32 = _mm256_set1_ps(32.0f);
            __m256 a[16], b[16];
            for (int j = 0; j < 8; j++) {
                __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p->sc[j][r0]));
                a[2 * j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(scw, 16), 16)));
                a[2 * j + 1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(scw, 16)));
                b[2 * j] = _mm256_mul_ps(k32, a[2 * j]);
                b[2 * j + 1] = _mm256_mul_ps(k32, a[2 * j + 1]);
            }
            const __m256 id = i8_scale_avx2(a, b, 16, 63.0f, out->d + r0);
            for (int j = 0; j < 8; j++)
                for (int h = 0; h < 2; h++) {
                    __m256i A[2], C[2];
                    i8_spread_avx2(a[2 * j + h], b[2 * j + h], id, A, C);
                    const __m256i hb = _mm256_load_si256((const __m256i *)(p->qh[j][h] + 32 * hh));
                    for (int e = 0; e < 2; e++) {
                        const int c = 2 * h + e;
                        __m256i v = _mm256_load_si256((const __m256i *)(p->ql[j][c] + 32 * hh));
                        __m256i hlo = e ? hb : _mm256_slli_epi16(hb, 4);
                        __m256i hhi = e ? _mm256_srli_epi16(hb, 2) : _mm256_slli_epi16(hb, 2);
                        __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hlo, m30));
                        __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(hhi, m30));
                        _mm256_storeu_si256((__m256i *)(out->q[8 * j + 2 * c] + 32 * hh), i8_bytes_avx2(lo, A, C));
                        _mm256_storeu_si256((__m256i *)(out->q[8 * j + 2 * c + 1] + 32 * hh), i8_bytes_avx2(hi, A, C));
                    }
                }
        }
}

/* The int8 form's kernel needs AVX-VNNI (vpdpbusd on ymm: Intel Alder
 * Lake and later, AMD Zen 5): only there is it installed. Without it,
 * vpmaddubsw cannot take the form's unsigned bytes (its word pairs would
 * saturate at 2 x 255 x 128), and multiplying |a| by v signed by a,
 * widened every vector (vpsignb, vpmaddubsw, vpmaddwd, vpaddd per 32
 * multiply-adds), lost to the packed kernels at 128 tokens: 112 against
 * 164 GMAC/s (Q4_K), 107 / 135 (Q5_K), 102 / 117 (Q6_K) (docs/perf/cpu.md,
 * "AVX2 int8"). */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")

/* A block's sums (lo: rows 0-7, hi: 8-15, one pair a token) into the
 * totals: the exact int32 sums to float, times d x the token's scale, in
 * the AVX-512 kernel's order. */
static inline __attribute__((always_inline)) void
i8x16_block_totals_avx2(const sw_i8x16 *p, const void *act, size_t stride, int64_t i, const int NT, const __m256i *lo,
                        const __m256i *hi, float (*total)[16])
{
    const __m256 d0 = _mm256_load_ps(p->d), d1 = _mm256_load_ps(p->d + 8);
    _Pragma("GCC unroll 6")
    for (int t = 0; t < NT; t++) {
        const __m256 s = _mm256_set1_ps(sw_act_block(act, stride, t, i)->d);
        _mm256_store_ps(total[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[t]), _mm256_mul_ps(d0, s), _mm256_load_ps(total[t])));
        _mm256_store_ps(total[t] + 8,
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[t]), _mm256_mul_ps(d1, s), _mm256_load_ps(total[t] + 8)));
    }
}

/* The int8 form x NT (1..5) tokens, both 8-row halves: per block and
 * token 64 vpdpbusd a half (ymm) from the +128 offset's starting value,
 * then d x the token's scale, as the AVX-512 kernel. The halves are a
 * token's two chains. The totals live in memory, added to once a block.
 * Tokens past the six-token passes of i8x16_six_avxvnni take this. */
static inline __attribute__((always_inline)) void
i8x16_few_avxvnni(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int32_t *nsum,
                  size_t nsum_stride, const int NT, float *out, size_t ostride)
{
    float total[5][16] __attribute__((aligned(32))) = {{0}};
    for (int64_t i = 0; i < nb; i++, p++) {
        __m256i lo[5], hi[5];
        _Pragma("GCC unroll 5")
        for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm256_set1_epi32(nsum[(size_t)t * nsum_stride + i]);
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 64; k++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)p->q[k]);
            const __m256i w1 = _mm256_load_si256((const __m256i *)(p->q[k] + 32));
            _Pragma("GCC unroll 5")
            for (int t = 0; t < NT; t++) {
                int32_t x;
                memcpy(&x, sw_act_block(act, stride, t, i)->qs + 4 * k, 4);
                lo[t] = _mm256_dpbusd_avx_epi32(lo[t], w0, _mm256_set1_epi32(x));
                hi[t] = _mm256_dpbusd_avx_epi32(hi[t], w1, _mm256_set1_epi32(x));
            }
        }
        i8x16_block_totals_avx2(p, act, stride, i, NT, lo, hi, total);
    }
    _Pragma("GCC unroll 5")
    for (int t = 0; t < NT; t++) memcpy(out + t * ostride, total[t], sizeof total[t]);
}

/* Six tokens x 16 rows: 12 chains, enough to cover vpdpbusd's latency (5
 * cycles at two a cycle), with the two weight vectors and a broadcast 15
 * of the 16 ymm registers. Intrinsics spilled at six tokens (12 chains
 * were 129-134 GMAC/s a core, four tokens' 8 chains 172-182); in asm, with
 * the chains pinned to ymm0-11, 207-225, 87-94% of the instruction's own
 * peak (docs/perf/cpu.md, "The ymm int8 form at six tokens"). One pass of
 * the loop is 4 activation dwords: 8 loads and 12 vpdpbusd each. */
#define I8_TOK(Q, LO, HI, OFF) "vpbroadcastd " OFF "(%[" Q "],%[k]), %%ymm14\n\t" \
    "%{vex%} vpdpbusd %%ymm14, %%ymm12, %%ymm" LO "\n\t%{vex%} vpdpbusd %%ymm14, %%ymm13, %%ymm" HI "\n\t"
#define I8_DWORD(OFF, W0, W1) "vmovdqa " W0 "(%[w]), %%ymm12\n\tvmovdqa " W1 "(%[w]), %%ymm13\n\t" \
    I8_TOK("q0", "0", "6", OFF) I8_TOK("q1", "1", "7", OFF) I8_TOK("q2", "2", "8", OFF) \
    I8_TOK("q3", "3", "9", OFF) I8_TOK("q4", "4", "10", OFF) I8_TOK("q5", "5", "11", OFF)
static void i8x16_six_avxvnni(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int32_t *nsum,
                              size_t nsum_stride, float *out, size_t ostride)
{
    float total[6][16] __attribute__((aligned(32))) = {{0}};
    for (int64_t i = 0; i < nb; i++, p++) {
        __m256i c[12];   /* lo 0-5, hi 6-11: the chains' starting values in, their sums out */
        for (int t = 0; t < 6; t++) c[t] = c[6 + t] = _mm256_set1_epi32(nsum[(size_t)t * nsum_stride + i]);
        const uint8_t *w = p->q[0];
        int64_t k = 0;
        __asm__ volatile(
            "vmovdqa 0(%[c]), %%ymm0\n\tvmovdqa 32(%[c]), %%ymm1\n\tvmovdqa 64(%[c]), %%ymm2\n\t"
            "vmovdqa 96(%[c]), %%ymm3\n\tvmovdqa 128(%[c]), %%ymm4\n\tvmovdqa 160(%[c]), %%ymm5\n\t"
            "vmovdqa 192(%[c]), %%ymm6\n\tvmovdqa 224(%[c]), %%ymm7\n\tvmovdqa 256(%[c]), %%ymm8\n\t"
            "vmovdqa 288(%[c]), %%ymm9\n\tvmovdqa 320(%[c]), %%ymm10\n\tvmovdqa 352(%[c]), %%ymm11\n\t"
            "1:\n\t"
            I8_DWORD("0", "0", "32") I8_DWORD("4", "64", "96") I8_DWORD("8", "128", "160") I8_DWORD("12", "192", "224")
            "add $256, %[w]\n\tadd $16, %[k]\n\tcmp $256, %[k]\n\tjne 1b\n\t"
            "vmovdqa %%ymm0, 0(%[c])\n\tvmovdqa %%ymm1, 32(%[c])\n\tvmovdqa %%ymm2, 64(%[c])\n\t"
            "vmovdqa %%ymm3, 96(%[c])\n\tvmovdqa %%ymm4, 128(%[c])\n\tvmovdqa %%ymm5, 160(%[c])\n\t"
            "vmovdqa %%ymm6, 192(%[c])\n\tvmovdqa %%ymm7, 224(%[c])\n\tvmovdqa %%ymm8, 256(%[c])\n\t"
            "vmovdqa %%ymm9, 288(%[c])\n\tvmovdqa %%ymm10, 320(%[c])\n\tvmovdqa %%ymm11, 352(%[c])"
            : [w] "+r"(w), [k] "+r"(k)
            : [c] "r"(c), [q0] "r"(sw_act_block(act, stride, 0, i)->qs), [q1] "r"(sw_act_block(act, stride, 1, i)->qs),
              [q2] "r"(sw_act_block(act, stride, 2, i)->qs), [q3] "r"(sw_act_block(act, stride, 3, i)->qs),
              [q4] "r"(sw_act_block(act, stride, 4, i)->qs), [q5] "r"(sw_act_block(act, stride, 5, i)->qs)
            : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
              "xmm11", "xmm12", "xmm13", "xmm14");
        i8x16_block_totals_avx2(p, act, stride, i, 6, c, c + 6, total);
    }
    for (int t = 0; t < 6; t++) memcpy(out + t * ostride, total[t], sizeof total[t]);
}
#undef I8_TOK
#undef I8_DWORD

/* Tokens six at a time, the rest (1..5) in one pass of the few-token kernel. */
static void i8x16_avxvnni(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int32_t *nsum,
                          size_t nsum_stride, int ntok, float *out, size_t ostride)
{
    int t0 = 0;
    for (; ntok - t0 >= 6; t0 += 6)
        i8x16_six_avxvnni(p, nb, (const uint8_t *)act + (size_t)t0 * stride, stride, nsum + (size_t)t0 * nsum_stride,
                          nsum_stride, out + (size_t)t0 * ostride, ostride);
    const uint8_t *a = (const uint8_t *)act + (size_t)t0 * stride;
    const int32_t *ns = nsum + (size_t)t0 * nsum_stride;
    float *o = out + (size_t)t0 * ostride;
    switch (ntok - t0) {
    case 1: i8x16_few_avxvnni(p, nb, a, stride, ns, nsum_stride, 1, o, ostride); break;
    case 2: i8x16_few_avxvnni(p, nb, a, stride, ns, nsum_stride, 2, o, ostride); break;
    case 3: i8x16_few_avxvnni(p, nb, a, stride, ns, nsum_stride, 3, o, ostride); break;
    case 4: i8x16_few_avxvnni(p, nb, a, stride, ns, nsum_stride, 4, o, ostride); break;
    case 5: i8x16_few_avxvnni(p, nb, a, stride, ns, nsum_stride, 5, o, ostride); break;
    }
}
#pragma GCC pop_options

/* The int8 multiply-add peak without VNNI, in the instruction mix the
 * kernels here are built on: vpmaddubsw (32 byte products into word pairs),
 * vpmaddwd widening them to dwords, vpaddd into the accumulator. The first
 * two share the multiply pipes, so this is one pair per 32 MACs, not one
 * vpmaddubsw. 8 accumulator chains, 4 temporaries rotated (16 ymm in all);
 * 24 triples an iteration = SW_INT8_PEAK_MACS (768). asm, so the compiler
 * keeps every instruction. */
/* One vpmaddubsw + vpmaddwd + vpaddd into accumulator A through temporary
 * T; a round is 8 of them, one per accumulator. */
#define PEAK_TRIPLE(T, A) "vpmaddubsw %[x], %[w], %[" T "]\n\tvpmaddwd %[one], %[" T "], %[" T "]\n\t" \
                          "vpaddd %[" T "], %[" A "], %[" A "]\n\t"
#define PEAK_ROUND PEAK_TRIPLE("t0", "a0") PEAK_TRIPLE("t1", "a1") PEAK_TRIPLE("t2", "a2") PEAK_TRIPLE("t3", "a3") \
                   PEAK_TRIPLE("t0", "a4") PEAK_TRIPLE("t1", "a5") PEAK_TRIPLE("t2", "a6") PEAK_TRIPLE("t3", "a7")
static int64_t int8_peak_avx2(int64_t iters)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256i t0, t1, t2, t3;
    const __m256i w = _mm256_set1_epi8(1), x = _mm256_set1_epi32(0x01020304), one = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < iters; i++)
        __asm__ volatile(PEAK_ROUND PEAK_ROUND PEAK_ROUND
                         : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                           [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7), [t0] "=&x"(t0), [t1] "=&x"(t1),
                           [t2] "=&x"(t2), [t3] "=&x"(t3)
                         : [w] "x"(w), [x] "x"(x), [one] "x"(one));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, s);
    int64_t sum = 0;
    for (int k = 0; k < 8; k++) sum += v[k];
    return sum;
}
#undef PEAK_ROUND
#undef PEAK_TRIPLE
_Static_assert(SW_INT8_PEAK_MACS == 24 * 32, "int8_peak_avx2: 24 vpmaddubsw of 32 products an iteration");

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
/* The int8 form's instruction on AVX-VNNI: vpdpbusd on ymm, 32 MACs, in
 * 12 independent chains (latency 5 at two a cycle wants 10), twice an
 * iteration = SW_INT8_PEAK_MACS. */
#define PEAK_DP(A) "%{vex%} vpdpbusd %[x], %[w], %[" A "]\n\t"
#define PEAK_DP12 PEAK_DP("a0") PEAK_DP("a1") PEAK_DP("a2") PEAK_DP("a3") PEAK_DP("a4") PEAK_DP("a5") \
                  PEAK_DP("a6") PEAK_DP("a7") PEAK_DP("a8") PEAK_DP("a9") PEAK_DP("a10") PEAK_DP("a11")
static int64_t int8_peak_avxvnni(int64_t iters)
{
    /* named, not an array: at -O1 (the sanitizer build) an array stayed in
     * memory around each asm and the loop timed its stores */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m256i w = _mm256_set1_epi8(1), x = _mm256_set1_epi32(0x01020304);
    for (int64_t i = 0; i < iters; i++)
        __asm__ volatile(PEAK_DP12 PEAK_DP12
                         : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                           [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9), [a10] "+x"(a10), [a11] "+x"(a11)
                         : [w] "x"(w), [x] "x"(x));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(a8, a9), _mm256_add_epi32(a10, a11)));
    return _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
}
#undef PEAK_DP12
#undef PEAK_DP
#pragma GCC pop_options

#pragma GCC pop_options

void sw_kernels_fill_avx2(sw_kernel_table *t)
{
    t->quant_q8_k = quant_q8_k_avx2;
    t->quant_q8_0 = quant_q8_0_avx2;
    t->dot[SW_TYPE_F32] = dot_f32_avx2;
    t->dot[SW_TYPE_F16] = dot_f16_avx2;
    t->dot[SW_TYPE_BF16] = dot_bf16_avx2;
    t->dot[SW_TYPE_Q4_0] = dot_q4_0_avx2;
    t->dot[SW_TYPE_Q4_1] = dot_q4_1_avx2;
    t->dot[SW_TYPE_Q5_0] = dot_q5_0_avx2;
    t->dot[SW_TYPE_Q5_1] = dot_q5_1_avx2;
    t->dot[SW_TYPE_Q8_0] = dot_q8_0_avx2;
    t->dot[SW_TYPE_MXFP4] = dot_mxfp4_avx2;
    t->dot[SW_TYPE_Q4_K] = dot_q4_k_avx2;
    t->dotn[SW_TYPE_Q4_K] = dotn_q4_k_avx2;
    t->dot[SW_TYPE_Q5_K] = dot_q5_k_avx2;
    t->dotn[SW_TYPE_Q5_K] = dotn_q5_k_avx2;
    t->dot[SW_TYPE_Q6_K] = dot_q6_k_avx2;
    t->dotn[SW_TYPE_Q6_K] = dotn_q6_k_avx2;
    t->q4k16 = q4k16_avx2;
    t->q4k16_pf1 = q4k16_pf1_avx2;
    t->q5k16 = q5k16_avx2;
    t->q6k16 = q6k16_avx2;
    t->int8_peak = int8_peak_avx2;
    t->int8_peak_mix = "vpmaddubsw+vpmaddwd pairs, 32 MACs each";
    if (__builtin_cpu_supports("avxvnni")) {   /* the int8 form: see i8x16_avxvnni */
        t->i8x16 = i8x16_avxvnni;
        t->i8x16_ntok = 12;   /* two six-token passes */
        t->i8x16_min_tokens = 48;
        t->i8x16_peak = int8_peak_avxvnni;
        t->i8x16_peak_mix = "vpdpbusd ymm, 32 MACs each";
        t->i8x16_peak_macs = SW_INT8_PEAK_MACS;
        t->i8x16_expand[SW_TYPE_Q4_K] = i8_q4k_avx2;
        t->i8x16_expand[SW_TYPE_Q5_K] = i8_q5k_avx2;
        t->i8x16_expand[SW_TYPE_Q6_K] = i8_q6k_avx2;
    }
#define SW_Q32_FILL(name, type) t->q32x16[type] = name##x16_avx2;
    SW_Q32_TYPES(SW_Q32_FILL)
#undef SW_Q32_FILL
}
