/* AVX-512 kernels (F, BW, VL, DQ; VNNI vpdpbusd/vpdpwssd where present).
 *
 * The file is compiled for a generic x86-64; the kernels are compiled for
 * AVX-512 by the target pragma below and only run after kernels.c checked
 * cpuid. The K-quant bodies live in kernels_avx512_body.h, included twice:
 * once with VNNI, once with plain AVX512BW (vpmaddubsw + vpmaddwd).
 *
 * How a Q4_K block (256 weights) is computed, per token:
 *   - the 128 nibble bytes are split into 4 zmm of unsigned bytes, each
 *     holding two 32-weight sub-blocks in the order the Q8_K bytes have;
 *   - vpdpbusd gives 16 dword partial sums per zmm (8 per sub-block), each
 *     below 2^15, so two zmm pack (vpackssdw) into one of int16 without loss;
 *   - one vpdpwssd per packed pair multiplies by the 6-bit sub-block scales
 *     (laid out to match the packed words) and accumulates;
 *   - the dmin*min term uses the activations' bsums: one vpmaddwd per block.
 * The weight side (unpacking, scales) is shared by up to SW_DOTN_MAX tokens.
 *
 * Many tokens (prefill): pack16 interleaves 16 rows (sw_kpack16) and gemm16
 * runs one vpdpbusd per 4 weights x 16 rows x token, applying sub-block
 * scales as float vectors over the 16 rows.
 *
 * The 32-weight formats (Q4_0..Q8_0) use kernels_q32_body.h with ymm VNNI;
 * without VNNI the AVX2 versions stay in the table.
 */
#include "worker-cpu/kernels_impl.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")

/* ---- shared helpers --------------------------------------------------------- */

static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

#include "worker-cpu/kernels_x86_common.h"

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

/* ---- activation quantization ---------------------------------------------- */

/* Q8_K: the same float operations as the reference, so the same bytes. */
static void quant_q8_k_avx512(const float *x, void *dst, int64_t n)
{
    block_q8_k *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 vmax = _mm512_set1_ps(-INFINITY), vmin = _mm512_set1_ps(INFINITY);
        for (int j = 0; j < 16; j++) {
            __m512 v = _mm512_loadu_ps(x + 16 * j);
            vmax = _mm512_max_ps(vmax, v);
            vmin = _mm512_min_ps(vmin, v);
        }
        float mx = _mm512_reduce_max_ps(vmax), mn = _mm512_reduce_min_ps(vmin);
        float pick = sw_q8k_pick(x, mx, mn);
        if (pick == 0) { memset(&y[i], 0, sizeof y[i]); continue; }
        float iscale = -128.0f / pick;
        __m512 vs = _mm512_set1_ps(iscale);
        for (int j = 0; j < 16; j++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), vs));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtsepi32_epi8(q));
        }
        /* bsums from the saturated bytes, as stored: vpsadbw sums 8 bytes at
         * a time (made unsigned by +128), pairs of those make the 16-sums.
         * One horizontal sum per 16 quants cost a visible share of a batch-16
 * step (docs/perf/cpu.md, session 3's log). */
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        for (int c = 0; c < 4; c++) {
            __m512i v = _mm512_loadu_si512(y[i].qs + 64 * c);
            __m512i s8 = _mm512_sad_epu8(_mm512_xor_si512(v, bias), _mm512_setzero_si512());
            /* qwords 2k + 2k+1 -> the sum of 16 bytes, less the 16 * 128 bias */
            __m512i s16 = _mm512_add_epi64(s8, _mm512_shuffle_epi32(s8, _MM_PERM_BADC));
            __m128i w = _mm512_cvtepi64_epi16(s16);   /* words: b0 b0 b1 b1 b2 b2 b3 b3 */
            w = _mm_sub_epi16(_mm_shuffle_epi8(w, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1)),
                              _mm_set1_epi16(16 * 128));
            _mm_storel_epi64((__m128i *)(y[i].bsums + 4 * c), w);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* Q8_0: d = amax/127, q = rne(x/d) like the reference. */
static void quant_q8_0_avx512(const float *x, void *dst, int64_t n)
{
    block_q8_0 *y = dst;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, a), _mm512_andnot_ps(sign, b));
        float amax = _mm512_reduce_max_ps(m);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        y[i].d = sw_f32_to_f16(d);
        __m512 vid = _mm512_set1_ps(id);
        __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(qb));
    }
}

/* ---- float dots ------------------------------------------------------------- */

static float dot_f32_avx512(int64_t n, const void *w, const void *act)
{
    const float *a = w, *b = act;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc0);
    }
    return hsum512(_mm512_add_ps(acc0, acc1));
}

static float dot_f16_avx512(int64_t n, const void *w, const void *act)
{
    const uint16_t *a = w;
    const float *b = act;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i + 16))),
                               _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, a + i));
        acc0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, b + i), acc0);
    }
    return hsum512(_mm512_add_ps(acc0, acc1));
}

static float dot_bf16_avx512(int64_t n, const void *w, const void *act)
{
    const uint16_t *a = w;
    const float *b = act;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + i));
        __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
        acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(k, b + i), acc);
    }
    return hsum512(acc);
}

/* ---- K-quant bodies, with and without VNNI ------------------------------------ */

#define SW_VNNI 0
#define SW_SFX(name) name##_bw
#include "worker-cpu/kernels_avx512_body.h"
#undef SW_VNNI
#undef SW_SFX

#pragma GCC push_options
#pragma GCC target("avx512vnni")

/* 32-weight blocks with ymm vpdpbusd: one instruction per 32 products and no
 * int16 saturation. s8 x s8 moves the weight's sign onto the activation. */
static inline __m256i dot_s8s8(__m256i w, __m256i a)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}
static inline __m256i dot_u8s8(__m256i w, __m256i a)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a);
}
#define Q32_SFX(name) name##_vnni
#include "worker-cpu/kernels_q32_body.h"
#undef Q32_SFX

#define SW_VNNI 1
#define SW_SFX(name) name##_vnni
#include "worker-cpu/kernels_avx512_body.h"
#undef SW_VNNI
#undef SW_SFX

/* acc += w . broadcast(4 activation bytes at a), with the broadcast folded
 * into the instruction ({1to16} memory operand). GCC emits a separate
 * vpbroadcastd for _mm512_set1_epi32 here; folding it saves one
 * instruction per 64 MACs (measured: docs/perf/cpu.md, "What the kernels
 * can reach"). */
typedef int32_t __attribute__((may_alias, aligned(1))) i32_any;
static inline __attribute__((always_inline)) __m512i dpbusd_bcst(__m512i acc, __m512i w, const int8_t *a)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const i32_any *)a));
    return acc;
}

/* ---- prepacked Q4_K x tokens (sw_q4k16) -------------------------------------
 * Per 64 bytes of packed quants: one and, one shift + and, then per token two
 * vpdpbusd against broadcast activation dwords. Per sub-block and token the
 * int32 sums become floats times the rows' integer scales (blk); per block
 * the mins go through vpdpwssd with the token's paired 32-sums, and one
 * multiply-add applies d, dmin and the token's scale. Lanes are rows. */
/* Software prefetch ~37 KB ahead into L2 (T1), not L1: a core has few L1
 * miss buffers but many L2 ones, and a single core streaming packed weights
 * needs dozens of lines in flight to cover DRAM latency: T1 at 16 blocks
 * reached the streaming-read figure where T0 at 4 fell short of it.
 * Q4_K at one token prefetches only where sw_prefetch_one_token says so:
 * on AMD Zen 4 the kernel needed so little work per line that the hardware
 * prefetcher alone kept ahead, and the software prefetches only took miss
 * buffers from it; on the Intel host they took the stream from 22 to 31
 * GB/s. Q6_K at one token and Q4_K at 2-4 tokens, with more work per line,
 * lost much of their speed without them, so they keep them. The figures:
 * docs/perf/cpu.md, "Side by side with ik_llama.cpp", sessions 5-6 and
 * "Software prefetch at one token".
 * -DSW_Q16_PREFETCH / -DSW_Q16_HINT override both for such experiments. */
#ifndef SW_Q16_HINT
#define SW_Q16_HINT _MM_HINT_T1
#endif
#ifndef SW_Q16_PREFETCH
#define SW_Q16_PREFETCH (16 * (int)sizeof(sw_q4k16))
#endif
/* h shifted left by s (right by -s) in 16-bit lanes: with s in -3..4 and the
 * result masked to bit 4 of each byte, no bit crosses a byte. */
static inline __attribute__((always_inline)) __m512i shift_bits(__m512i h, int s)
{
    return s >= 0 ? _mm512_slli_epi16(h, (unsigned)s) : _mm512_srli_epi16(h, (unsigned)-s);
}

/* Q4_K (q5 false) and Q5_K (q5 true: a sw_q5k16 is a sw_q4k16 plus the
 * fifth bits, which go into bit 4 of the nibbles with one shift and one
 * ternary-logic OR each). The rest is one code. */
static inline __attribute__((always_inline)) void
qk16_rows(const uint8_t *blocks, int64_t nb, const void *act, size_t stride, const int32_t *bsp, size_t bsp_stride,
          const int NT, float *out, size_t ostride, const bool q5, const bool pf1)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    const bool pf = NT > 1 || q5 || pf1;
    const size_t bb = q5 ? sizeof(sw_q5k16) : sizeof(sw_q4k16);
    __m512 total[SW_DOTN_MAX];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, blocks += bb) {
        const sw_q4k16 *p = (const sw_q4k16 *)blocks;
        __m512 blk[SW_DOTN_MAX];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) blk[t] = _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) {
            __m512i acc[SW_DOTN_MAX];
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_si512();
            __m512i h = _mm512_setzero_si512();
            if (q5) {
                h = _mm512_load_si512(((const sw_q5k16 *)blocks)->qh[j]);
                _mm_prefetch((const char *)((const sw_q5k16 *)blocks)->qh[j] + SW_Q16_PREFETCH, SW_Q16_HINT);
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_load_si512(p->qs[j][c]);
                /* SW_Q16_PREFETCH ahead: the hardware prefetcher alone
                 * falls behind once each line feeds several tokens */
                if (pf) _mm_prefetch((const char *)p->qs[j][c] + SW_Q16_PREFETCH, SW_Q16_HINT);
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) {   /* bits 2c and 2c + 1 of h to bit 4: lo | (h' & 0x10) */
                    lo = _mm512_ternarylogic_epi32(lo, shift_bits(h, 4 - 2 * c), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, shift_bits(h, 3 - 2 * c), m10, 0xF8);
                }
                _Pragma("GCC unroll 8")
                for (int t = 0; t < NT; t++) {
                    const int8_t *a = sw_act_block(act, stride, t, i)->qs + 32 * j + 8 * c;
                    acc[t] = dpbusd_bcst(acc[t], lo, a);
                    acc[t] = dpbusd_bcst(acc[t], hi, a + 4);
                }
            }
            __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)p->sc[j])));
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++) blk[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), sc, blk[t]);
        }
        /* the 5 lines of scales, mins and d/dmin */
        for (int k = 0; pf && k < 5; k++) _mm_prefetch((const char *)p->sc + 64 * k + SW_Q16_PREFETCH, SW_Q16_HINT);
        __m512i mn[4];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) mn[q] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)p->mn[q]));
        __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->d));
        __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->dmin));
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) {
            const int32_t *bs = bsp + (size_t)t * bsp_stride + 4 * i;
            __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn[0], _mm512_set1_epi32(bs[0]));
            m = _mm512_dpwssd_epi32(m, mn[1], _mm512_set1_epi32(bs[1]));
            m = _mm512_dpwssd_epi32(m, mn[2], _mm512_set1_epi32(bs[2]));
            m = _mm512_dpwssd_epi32(m, mn[3], _mm512_set1_epi32(bs[3]));
            __m512 r = _mm512_fmsub_ps(d, blk[t], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m)));
            total[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(sw_act_block(act, stride, t, i)->d), total[t]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}

static inline __attribute__((always_inline)) void
q4k16_rows(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp, size_t bsp_stride,
           const int NT, float *out, size_t ostride)
{
    qk16_rows((const uint8_t *)p, nb, act, stride, bsp, bsp_stride, NT, out, ostride, false, false);
}

static inline __attribute__((always_inline)) void
q4k16_pf1_rows(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
               size_t bsp_stride, const int NT, float *out, size_t ostride)
{
    qk16_rows((const uint8_t *)p, nb, act, stride, bsp, bsp_stride, NT, out, ostride, false, true);
}

static inline __attribute__((always_inline)) void
q5k16_rows(const sw_q5k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp, size_t bsp_stride,
           const int NT, float *out, size_t ostride)
{
    qk16_rows((const uint8_t *)p, nb, act, stride, bsp, bsp_stride, NT, out, ostride, true, false);
}

/* Prepacked Q6_K: two 64-byte quant loads and one high-bit load give four
 * vectors of 6-bit quants (one ternarylogic each), the +32 offset is the
 * sums' starting value (bsp), and the int8 sub-block scales are applied per
 * 16 weights as float vectors over the rows. */
static inline __attribute__((always_inline)) void
q6k16_rows(const sw_q6k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp, size_t bsp_stride,
           const int NT, float *out, size_t ostride)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512 total[SW_DOTN_MAX];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        __m512 blk[SW_DOTN_MAX];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) blk[t] = _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) {
            __m512i scw = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)p->sc[j]));
            _Pragma("GCC unroll 2")
            for (int h = 0; h < 2; h++) {
                __m512i hb = _mm512_load_si512(p->qh[j][h]);
                _mm_prefetch((const char *)p->qh[j][h] + SW_Q16_PREFETCH, SW_Q16_HINT);
                __m512i acc[SW_DOTN_MAX];
                _Pragma("GCC unroll 8")
                for (int t = 0; t < NT; t++) acc[t] = _mm512_set1_epi32(bsp[(size_t)t * bsp_stride + 16 * i + 2 * j + h]);
                _Pragma("GCC unroll 2")
                for (int e = 0; e < 2; e++) {
                    const int c = 2 * h + e;
                    __m512i v = _mm512_load_si512(p->ql[j][c]);
                    _mm_prefetch((const char *)p->ql[j][c] + SW_Q16_PREFETCH, SW_Q16_HINT);
                    __m512i hlo = e ? hb : _mm512_slli_epi16(hb, 4);
                    __m512i hhi = e ? _mm512_srli_epi16(hb, 2) : _mm512_slli_epi16(hb, 2);
                    __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), hlo, m30, 0xF8);
                    __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hhi, m30, 0xF8);
                    _Pragma("GCC unroll 8")
                    for (int t = 0; t < NT; t++) {
                        const int8_t *a = sw_act_block(act, stride, t, i)->qs + 32 * j + 8 * c;
                        acc[t] = dpbusd_bcst(acc[t], lo, a);
                        acc[t] = dpbusd_bcst(acc[t], hi, a + 4);
                    }
                }
                /* scale of sub-block 2j + h: word h of each row's dword, sign-extended */
                __m512i s32 = h ? _mm512_srai_epi32(scw, 16) : _mm512_srai_epi32(_mm512_slli_epi32(scw, 16), 16);
                __m512 sc = _mm512_cvtepi32_ps(s32);
                _Pragma("GCC unroll 8")
                for (int t = 0; t < NT; t++) blk[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), sc, blk[t]);
            }
        }
        _mm_prefetch((const char *)p->sc + SW_Q16_PREFETCH, SW_Q16_HINT);
        _mm_prefetch((const char *)p->sc + 64 + SW_Q16_PREFETCH, SW_Q16_HINT);
        _mm_prefetch((const char *)p->sc + 128 + SW_Q16_PREFETCH, SW_Q16_HINT);
        _mm_prefetch((const char *)p->sc + 192 + SW_Q16_PREFETCH, SW_Q16_HINT);
        _mm_prefetch((const char *)p->d + SW_Q16_PREFETCH, SW_Q16_HINT);
        __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->d));
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++)
            total[t] = _mm512_fmadd_ps(blk[t], _mm512_mul_ps(d, _mm512_set1_ps(sw_act_block(act, stride, t, i)->d)), total[t]);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}

/* 16 E8M0 exponents (bytes) as the floats 2^(e - 128), sw_e8m0_half's
 * values: e - 1 in the exponent field, and for e = 0, 1 the denormals. */
static inline __m512 e8m0_half16(const void *e8)
{
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)e8));
    __m512i bits = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    bits = _mm512_mask_sllv_epi32(bits, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)),
                                  _mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(bits);
}

/* Prepacked 32-weight types (the sw_q32x16 form, kernels_impl.h). Per block:
 * eight 64-byte vectors of unsigned quants (Q8_0: loaded as they are; Q4_x
 * and Q5_x: four loads split into nibbles, Q5_x with its fifth bits put in
 * by a shift and a ternary-logic OR), then per token eight vpdpbusd that
 * start from the quants' offset times minus the token's block sum (a
 * broadcast and a shift), one multiply for d x the token's scale and one
 * multiply-add (Q4_1 / Q5_1: one more for m x the token's scaled sum). So
 * 8 of 10 vector-pipe slots are products, as for Q4_K's 64 of 79. */
static inline __attribute__((always_inline)) void
q32x16_rows(const uint8_t *q, const uint16_t *s, int64_t nb, const void *act, size_t stride, const sw_q32_aux *aux,
            size_t aux_stride, const int NT, float *out, size_t ostride, const sw_type type)
{
    const bool q8 = type == SW_TYPE_Q8_0, q5 = type == SW_TYPE_Q5_0 || type == SW_TYPE_Q5_1;
    const bool has_m = type == SW_TYPE_Q4_1 || type == SW_TYPE_Q5_1, mx = type == SW_TYPE_MXFP4;
    const int off = sw_q32_offset(type);   /* the unsigned quants' offset (Q4_1 / Q5_1: none) */
    const size_t qb = sw_q32x16_qbytes(type), sw = sw_q32x16_sbytes(type) / 2;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(SW_MXFP4_LUT_U8));
    /* the scale stream moves sw * 2 bytes per block against qb: the same lead in blocks */
    const int s_ahead = (int)(SW_Q16_PREFETCH / qb * sw * 2);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    __m512 total[SW_DOTN_MAX];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, q += qb, s += sw) {
        __m512i w[8];
        if (q8) {
            _Pragma("GCC unroll 8")
            for (int k = 0; k < 8; k++) w[k] = _mm512_load_si512(q + 64 * k);
        } else {
            const __m512i h = q5 ? _mm512_load_si512(q + 256) : _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_load_si512(q + 64 * c);
                w[c] = _mm512_and_si512(v, m4);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (mx) {   /* E2M1 values + 12 */
                    w[c] = _mm512_shuffle_epi8(lut, w[c]);
                    w[c + 4] = _mm512_shuffle_epi8(lut, w[c + 4]);
                }
                if (q5) {   /* bits c and c + 4 of h to bit 4 */
                    w[c] = _mm512_ternarylogic_epi32(w[c], shift_bits(h, 4 - c), m10, 0xF8);
                    w[c + 4] = _mm512_ternarylogic_epi32(w[c + 4], shift_bits(h, -c), m10, 0xF8);
                }
            }
        }
        /* Software prefetch at every token count. Unlike Q4_K's kernel,
         * batch 1 needs it here: Q4_0 read well short of the bandwidth
         * without it, and Q8_0 was the same either way (docs/perf/cpu.md,
         * "The 32-weight types"). */
        for (size_t l = 0; l < qb; l += 64) _mm_prefetch((const char *)q + l + SW_Q16_PREFETCH, SW_Q16_HINT);
        _mm_prefetch((const char *)s + s_ahead, SW_Q16_HINT);
        const __m512 d = mx ? e8m0_half16(s) : _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)s));
        const __m512 m = has_m ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + 16))) : _mm512_setzero_ps();
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) {
            const int8_t *a = ((const block_q8_0 *)((const uint8_t *)act + (size_t)t * stride) + i)->qs;
            const sw_q32_aux *x = aux + (size_t)t * aux_stride + i;
            __m512i acc0 = _mm512_set1_epi32(x->neg_sum * off);
            if (NT <= 2) {   /* two chains: one token alone would wait on the instruction's latency */
                __m512i acc1 = _mm512_setzero_si512();
                _Pragma("GCC unroll 4")
                for (int k = 0; k < 8; k += 2) {
                    acc0 = dpbusd_bcst(acc0, w[k], a + 4 * k);
                    acc1 = dpbusd_bcst(acc1, w[k + 1], a + 4 * k + 4);
                }
                acc0 = _mm512_add_epi32(acc0, acc1);
            } else {
                _Pragma("GCC unroll 8")
                for (int k = 0; k < 8; k++) acc0 = dpbusd_bcst(acc0, w[k], a + 4 * k);
            }
            total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc0), _mm512_mul_ps(d, _mm512_set1_ps(x->d)), total[t]);
            if (has_m) total[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x->d_sum), total[t]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}

/* Every token count gets its own unrolled instance; `type` is a constant in
 * each entry point below. */
#define SW_Q32_CALL(k) q32x16_rows(q, s, nb, act, stride, aux, aux_stride, k, out, ostride, type)
static inline __attribute__((always_inline)) void
q32x16_entry(const sw_type type, const uint8_t *q, const uint16_t *s, int64_t nb, const void *act, size_t stride,
             const sw_q32_aux *aux, size_t aux_stride, int ntok, float *out, size_t ostride)
{
    SW_FOR_NT(ntok, SW_Q32_CALL)
}
#undef SW_Q32_CALL
#define SW_Q32_ENTRY(name, type) SW_Q32_ENTRY_POINT(vnni, q32x16_entry, name, type)
SW_Q32_TYPES(SW_Q32_ENTRY)
#undef SW_Q32_ENTRY

/* Entry points of the packed kernels: every token count gets its own
 * unrolled instance of the rows function SW_Q16_ROWS. */
#define SW_Q16_CALL(k) SW_Q16_ROWS(p, nb, act, stride, bsp, bsp_stride, k, out, ostride)
#define SW_Q16_ENTRY(name, blk_t)                                                                          \
    static void name(const blk_t *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,       \
                     size_t bsp_stride, int ntok, float *out, size_t ostride) {                            \
        SW_FOR_NT(ntok, SW_Q16_CALL)                                                                       \
    }
#define SW_Q16_ROWS q4k16_rows
SW_Q16_ENTRY(q4k16_vnni, sw_q4k16)
#undef SW_Q16_ROWS
/* Q4_K with software prefetch at one token too (sw_prefetch_one_token) */
static void q4k16_pf1_vnni(const sw_q4k16 *p, int64_t nb, const void *act, size_t stride, const int32_t *bsp,
                           size_t bsp_stride, int ntok, float *out, size_t ostride)
{
    if (ntok == 1) q4k16_pf1_rows(p, nb, act, stride, bsp, bsp_stride, 1, out, ostride);
    else q4k16_vnni(p, nb, act, stride, bsp, bsp_stride, ntok, out, ostride);
}
#define SW_Q16_ROWS q5k16_rows
SW_Q16_ENTRY(q5k16_vnni, sw_q5k16)
#undef SW_Q16_ROWS
#define SW_Q16_ROWS q6k16_rows
SW_Q16_ENTRY(q6k16_vnni, sw_q6k16)
#undef SW_Q16_ROWS
#undef SW_Q16_ENTRY
#undef SW_Q16_CALL

/* ---- the int8 form (sw_i8x16) ------------------------------------------------
 * Expanding a packed row-block: the rows' sub-block factors a and b as float
 * vectors over the rows, the scale from the quant range's ends, the factors
 * in 1/128ths as words, then per 64 bytes of quants (16 rows x 4 weights,
 * lanes 4r + e) two unpacks to words, a multiply, an add and a shift each,
 * and one pack: 10 instructions per 64 weights, once per tile, against one
 * vpdpbusd per 64 weights and token for every token the tile then serves.
 * (Float, with its widening to dwords and back, took 22 and made the form
 * pay only at about twice the tokens: docs/perf/cpu.md, "The int8 form".) */

/* 64 unsigned quants q (lanes 4r + e) to the int8 form's 64 bytes,
 * v = (q A - B + 64) >> 7 in words: unpacklo widens 128-bit lane L's rows
 * 4L and 4L + 1, unpackhi rows 4L + 2 and 4L + 3, A and C = 64 - B come
 * spread to match (i8_spread), and the pack undoes the unpacks' order. */
static inline __attribute__((always_inline)) __m512i i8_bytes(__m512i q, const __m512i *A, const __m512i *C)
{
    const __m512i z = _mm512_setzero_si512();
    const __m512i lo = _mm512_srai_epi16(_mm512_add_epi16(_mm512_mullo_epi16(_mm512_unpacklo_epi8(q, z), A[0]), C[0]), 7);
    const __m512i hi = _mm512_srai_epi16(_mm512_add_epi16(_mm512_mullo_epi16(_mm512_unpackhi_epi8(q, z), A[1]), C[1]), 7);
    return _mm512_xor_si512(_mm512_packs_epi16(lo, hi), _mm512_set1_epi8((char)0x80));
}

/* The row-block's scale from its nsub sub-blocks' factors (stored to d);
 * returns 127 / amax (0 where amax is 0). */
static inline __m512 i8_scale(const __m512 *a, const __m512 *b, int nsub, float qmax, float *d)
{
    const __m512 qm = _mm512_set1_ps(qmax), k127 = _mm512_set1_ps(127.0f);
    __m512 amax = _mm512_setzero_ps();
    for (int s = 0; s < nsub; s++)
        amax = _mm512_max_ps(amax, _mm512_max_ps(_mm512_abs_ps(b[s]), _mm512_abs_ps(_mm512_fmsub_ps(qm, a[s], b[s]))));
    _mm512_store_ps(d, _mm512_div_ps(amax, k127));
    return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), k127, amax);
}

/* Word w of each 128-bit lane in i8_bytes' halves h = 0, 1 takes row
 * 4 (w / 8) + 2h + (w % 8) / 4. */
static const uint16_t i8_rows_of_word[2][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5, 5, 8, 8, 8, 8, 9, 9, 9, 9, 12, 12, 12, 12, 13, 13, 13, 13},
    {2, 2, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 7, 7, 7, 7, 10, 10, 10, 10, 11, 11, 11, 11, 14, 14, 14, 14, 15, 15, 15, 15},
};

/* One sub-block's factors (float lanes over the rows) as i8_bytes wants
 * them: A = rint(128 a id) and C = 64 - rint(128 b id), words spread by
 * i8_rows_of_word. */
static inline __attribute__((always_inline)) void i8_spread(__m512 a, __m512 b, __m512 id, __m512i *A, __m512i *C)
{
    const __m512 k128 = _mm512_set1_ps(128.0f);
    const __m512i a7 = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(a, id), k128))));
    const __m512i c7 = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(
        _mm512_sub_epi32(_mm512_set1_epi32(64), _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(b, id), k128)))));
    for (int h = 0; h < 2; h++) {
        const __m512i rows = _mm512_load_si512(i8_rows_of_word[h]);
        A[h] = _mm512_permutexvar_epi16(rows, a7);
        C[h] = _mm512_permutexvar_epi16(rows, c7);
    }
}

/* Q4_K and Q5_K (q5): a_j = d sc_j, b_j = dmin m_j per 32-weight sub-block. */
static inline __attribute__((always_inline)) void i8_expand_qk(const uint8_t *blocks, int64_t nb, sw_i8x16 *out,
                                                               const bool q5)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    const __m512i lo8 = _mm512_set1_epi32(0xff);
    const size_t bb = q5 ? sizeof(sw_q5k16) : sizeof(sw_q4k16);
    for (int64_t i = 0; i < nb; i++, blocks += bb, out++) {
        const sw_q4k16 *p = (const sw_q4k16 *)blocks;
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->d));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->dmin));
        __m512 a[8], b[8];
        for (int q = 0; q < 4; q++) {
            __m512i mw = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p->mn[q]));
            b[2 * q] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_and_si512(mw, lo8)));
            b[2 * q + 1] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(mw, 8)));
        }
        for (int j = 0; j < 8; j++)
            a[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)p->sc[j]))));
        const __m512 id = i8_scale(a, b, 8, q5 ? 31.0f : 15.0f, out->d);
        for (int j = 0; j < 8; j++) {
            __m512i A[2], C[2];
            i8_spread(a[j], b[j], id, A, C);
            const __m512i h = q5 ? _mm512_load_si512(((const sw_q5k16 *)blocks)->qh[j]) : _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_load_si512(p->qs[j][c]);
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) {
                    lo = _mm512_ternarylogic_epi32(lo, shift_bits(h, 4 - 2 * c), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, shift_bits(h, 3 - 2 * c), m10, 0xF8);
                }
                _mm512_store_si512(out->q[8 * j + 2 * c], i8_bytes(lo, A, C));
                _mm512_store_si512(out->q[8 * j + 2 * c + 1], i8_bytes(hi, A, C));
            }
        }
    }
}

static void i8_q4k_vnni(const void *blocks, int64_t nb, sw_i8x16 *out) { i8_expand_qk(blocks, nb, out, false); }
static void i8_q5k_vnni(const void *blocks, int64_t nb, sw_i8x16 *out) { i8_expand_qk(blocks, nb, out, true); }

/* Q6_K: a_s = d sc_s, b_s = 32 a_s per 16-weight sub-block; the quants
 * rebuilt from ql and qh as in q6k16_rows. */
static void i8_q6k_vnni(const void *blocks, int64_t nb, sw_i8x16 *out)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const sw_q6k16 *p = blocks;
    for (int64_t i = 0; i < nb; i++, p++, out++) {
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->d)), k32 = _mm512_set1_ps(32.0f);
        __m512 a[16], b[16];
        for (int j = 0; j < 8; j++) {
            __m512i scw = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)p->sc[j]));
            a[2 * j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(scw, 16), 16)));
            a[2 * j + 1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(scw, 16)));
            b[2 * j] = _mm512_mul_ps(k32, a[2 * j]);
            b[2 * j + 1] = _mm512_mul_ps(k32, a[2 * j + 1]);
        }
        const __m512 id = i8_scale(a, b, 16, 63.0f, out->d);
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++) {
                __m512i A[2], C[2];
                i8_spread(a[2 * j + h], b[2 * j + h], id, A, C);
                const __m512i hb = _mm512_load_si512(p->qh[j][h]);
                for (int e = 0; e < 2; e++) {
                    const int c = 2 * h + e;
                    __m512i v = _mm512_load_si512(p->ql[j][c]);
                    __m512i hlo = e ? hb : _mm512_slli_epi16(hb, 4);
                    __m512i hhi = e ? _mm512_srli_epi16(hb, 2) : _mm512_slli_epi16(hb, 2);
                    __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), hlo, m30, 0xF8);
                    __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hhi, m30, 0xF8);
                    _mm512_store_si512(out->q[8 * j + 2 * c], i8_bytes(lo, A, C));
                    _mm512_store_si512(out->q[8 * j + 2 * c + 1], i8_bytes(hi, A, C));
                }
            }
    }
}

/* The int8 form x NT tokens: per block and token 64 vpdpbusd from the
 * offset's starting value, then one multiply (d x the token's scale) and
 * one multiply-add. Each token's sums run in two chains (even and odd
 * activation dwords), as vpdpbusd's latency (5 cycles) at two issues a
 * cycle wants 10 in flight: at 128 tokens, one chain a token ran 5-10%
 * slower, and the pair loop unrolled 16 times slower again than 4
 * (docs/perf/cpu.md, "The int8 form: two chains, its own peak, and AMX"). */
static inline __attribute__((always_inline)) void
i8x16_rows(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int32_t *nsum, size_t nsum_stride,
           const int NT, float *out, size_t ostride)
{
    __m512 total[SW_DOTN_MAX];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        __m512i acc[SW_DOTN_MAX], acc2[SW_DOTN_MAX];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) {
            acc[t] = _mm512_set1_epi32(nsum[(size_t)t * nsum_stride + i]);
            acc2[t] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 64; k += 2) {
            const __m512i w0 = _mm512_load_si512(p->q[k]), w1 = _mm512_load_si512(p->q[k + 1]);
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++) {
                acc[t] = dpbusd_bcst(acc[t], w0, sw_act_block(act, stride, t, i)->qs + 4 * k);
                acc2[t] = dpbusd_bcst(acc2[t], w1, sw_act_block(act, stride, t, i)->qs + 4 * k + 4);
            }
        }
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) acc[t] = _mm512_add_epi32(acc[t], acc2[t]);
        const __m512 d = _mm512_load_ps(p->d);
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++)
            total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(d, _mm512_set1_ps(sw_act_block(act, stride, t, i)->d)),
                                       total[t]);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}

#define SW_I8_CALL(k) i8x16_rows(p, nb, act, stride, nsum, nsum_stride, k, out, ostride)
static void i8x16_vnni(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int32_t *nsum,
                       size_t nsum_stride, int ntok, float *out, size_t ostride)
{
    SW_FOR_NT(ntok, SW_I8_CALL)
}
#undef SW_I8_CALL

/* The vpdpbusd peak: 12 independent accumulator chains, enough to cover the
 * instruction's latency (4-5 cycles) at up to two issues a cycle. asm, so
 * the compiler keeps every instruction. */
static int64_t int8_peak_vnni(int64_t iters)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x01020304);
    for (int64_t i = 0; i < iters; i++)
        __asm__ volatile("vpdpbusd %[x], %[w], %[a0]\n\tvpdpbusd %[x], %[w], %[a1]\n\t"
                         "vpdpbusd %[x], %[w], %[a2]\n\tvpdpbusd %[x], %[w], %[a3]\n\t"
                         "vpdpbusd %[x], %[w], %[a4]\n\tvpdpbusd %[x], %[w], %[a5]\n\t"
                         "vpdpbusd %[x], %[w], %[a6]\n\tvpdpbusd %[x], %[w], %[a7]\n\t"
                         "vpdpbusd %[x], %[w], %[a8]\n\tvpdpbusd %[x], %[w], %[a9]\n\t"
                         "vpdpbusd %[x], %[w], %[a10]\n\tvpdpbusd %[x], %[w], %[a11]"
                         : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4),
                           [a5] "+v"(a5), [a6] "+v"(a6), [a7] "+v"(a7), [a8] "+v"(a8), [a9] "+v"(a9),
                           [a10] "+v"(a10), [a11] "+v"(a11)
                         : [w] "v"(w), [x] "v"(x));
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    return _mm512_reduce_add_epi32(s);
}
#pragma GCC pop_options

#pragma GCC pop_options

void sw_kernels_fill_avx512(sw_kernel_table *t, bool vnni)
{
    t->quant_q8_k = quant_q8_k_avx512;
    t->quant_q8_0 = quant_q8_0_avx512;
    t->dot[SW_TYPE_F32] = dot_f32_avx512;
    t->dot[SW_TYPE_F16] = dot_f16_avx512;
    t->dot[SW_TYPE_BF16] = dot_bf16_avx512;
    if (vnni) {
        t->dot[SW_TYPE_Q4_0] = dot_q4_0_vnni;
        t->dot[SW_TYPE_Q4_1] = dot_q4_1_vnni;
        t->dot[SW_TYPE_Q5_0] = dot_q5_0_vnni;
        t->dot[SW_TYPE_Q5_1] = dot_q5_1_vnni;
        t->dot[SW_TYPE_Q8_0] = dot_q8_0_vnni;
        t->dot[SW_TYPE_MXFP4] = dot_mxfp4_vnni;
        t->dot[SW_TYPE_Q4_K] = dot_q4_k_vnni;
        t->dotn[SW_TYPE_Q4_K] = dotn_q4_k_vnni;
        t->dot[SW_TYPE_Q5_K] = dot_q5_k_vnni;
        t->dotn[SW_TYPE_Q5_K] = dotn_q5_k_vnni;
        t->dot[SW_TYPE_Q6_K] = dot_q6_k_vnni;
        t->dotn[SW_TYPE_Q6_K] = dotn_q6_k_vnni;
        t->gemm16 = gemm16_vnni;
        t->pack16 = pack16_vnni;
        t->q4k16 = q4k16_vnni;
        t->q4k16_pf1 = q4k16_pf1_vnni;
        t->q5k16 = q5k16_vnni;
        t->q6k16 = q6k16_vnni;
#define SW_Q32_FILL(name, type) t->q32x16[type] = name##x16_vnni;
        SW_Q32_TYPES(SW_Q32_FILL)
#undef SW_Q32_FILL
        t->int8_peak = int8_peak_vnni;
        t->int8_peak_mix = "vpdpbusd";
        t->i8x16 = i8x16_vnni;
        t->i8x16_ntok = SW_DOTN_MAX;
        t->i8x16_min_tokens = 128;
        t->i8x16_peak = int8_peak_vnni;   /* the form runs the packed kernels' vpdpbusd */
        t->i8x16_peak_mix = t->int8_peak_mix;
        t->i8x16_peak_macs = SW_INT8_PEAK_MACS;
        t->i8x16_expand[SW_TYPE_Q4_K] = i8_q4k_vnni;
        t->i8x16_expand[SW_TYPE_Q5_K] = i8_q5k_vnni;
        t->i8x16_expand[SW_TYPE_Q6_K] = i8_q6k_vnni;
    } else {
        t->dot[SW_TYPE_Q4_K] = dot_q4_k_bw;
        t->dotn[SW_TYPE_Q4_K] = dotn_q4_k_bw;
        t->dot[SW_TYPE_Q5_K] = dot_q5_k_bw;
        t->dotn[SW_TYPE_Q5_K] = dotn_q5_k_bw;
        t->dot[SW_TYPE_Q6_K] = dot_q6_k_bw;
        t->dotn[SW_TYPE_Q6_K] = dotn_q6_k_bw;
        t->gemm16 = gemm16_bw;
        t->pack16 = pack16_bw;
    }
}
