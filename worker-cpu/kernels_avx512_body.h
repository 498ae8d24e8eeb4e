/* K-quant x Q8_K kernels for AVX-512, included twice by kernels_avx512.c:
 * SW_VNNI 1 uses vpdpbusd / vpdpwssd, SW_VNNI 0 the AVX512BW equivalents.
 * SW_SFX(name) names the instantiation. Not a standalone header. */

#if SW_VNNI
#define DP_U8S8(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#define DP_S16(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define DP_U8S8(acc, u, s) _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((u), (s)), _mm512_set1_epi16(1)))
#define DP_S16(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

/* Word permutations that line the sub-block scales up with the packed
 * partial sums (see the file comment in kernels_avx512.c). */
#ifndef SW_AVX512_IDX_DEFINED
#define SW_AVX512_IDX_DEFINED
/* Q4_K/Q5_K: packed pair (x_{2p}, x_{2p+1}); lane L words 0-3 <- sub 4p + (L>>1), words 4-7 <- sub 4p + 2 + (L>>1) */
static const int16_t IDX_K4_0[32] = {0,0,0,0,2,2,2,2, 0,0,0,0,2,2,2,2, 1,1,1,1,3,3,3,3, 1,1,1,1,3,3,3,3};
static const int16_t IDX_K4_1[32] = {4,4,4,4,6,6,6,6, 4,4,4,4,6,6,6,6, 5,5,5,5,7,7,7,7, 5,5,5,5,7,7,7,7};
/* mins (words 8..15 of the scale vector) duplicated per bsum pair */
static const int16_t IDX_KMIN[16] = {8,8,9,9,10,10,11,11,12,12,13,13,14,14,15,15};
/* Q6_K half h: lane L words 0-3 <- sub 8h + L, words 4-7 <- sub 8h + 4 + L */
static const int16_t IDX_K6_0[32] = {0,0,0,0,4,4,4,4, 1,1,1,1,5,5,5,5, 2,2,2,2,6,6,6,6, 3,3,3,3,7,7,7,7};
static const int16_t IDX_K6_1[32] = {8,8,8,8,12,12,12,12, 9,9,9,9,13,13,13,13, 10,10,10,10,14,14,14,14, 11,11,11,11,15,15,15,15};
#endif

/* ---- per-token work, shared by Q4_K, Q5_K and Q6_K ------------------------------
 * w[0..3]: unsigned quants of act bytes 0-63, 64-127, 128-191, 192-255;
 * s01/s23: scale words matching the packed partial sums; d: block scale.
 * The offset term is factor * d_y * sum_k words[k] * bsums[k], subtracted:
 * words = min_{k/2}, factor = dmin for Q4_K/Q5_K; words = scale_k, factor =
 * 32*d for Q6_K (its quants are stored +32).
 * One token: that term in integers (vpmaddwd) into the ymm macc, and d*d_y
 * as one scalar. Several tokens: per-block weight-side float vectors (d,
 * g16 = factor*words) so each token only adds one multiply-add with aux. */
static inline __attribute__((always_inline)) void
SW_SFX(k_tokens)(const __m512i w[4], __m512i s01, __m512i s23, float d, __m256i words, float factor,
                 const void *act, size_t stride, const float *aux, size_t aux_stride, int64_t i,
                 const int NT, const bool has_aux, __m512 *facc, __m256 *macc)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512 dvec = _mm512_setzero_ps(), g16 = _mm512_setzero_ps();
    if (NT > 1) {
        dvec = _mm512_set1_ps(d);
        g16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(words)), _mm512_set1_ps(factor));
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) {
        const block_q8_k *y = sw_act_block(act, stride, t, i);
        __m512i x0 = DP_U8S8(zero, w[0], _mm512_loadu_si512(y->qs));
        __m512i x1 = DP_U8S8(zero, w[1], _mm512_loadu_si512(y->qs + 64));
        __m512i x2 = DP_U8S8(zero, w[2], _mm512_loadu_si512(y->qs + 128));
        __m512i x3 = DP_U8S8(zero, w[3], _mm512_loadu_si512(y->qs + 192));
        __m512i s = DP_S16(zero, _mm512_packs_epi32(x0, x1), s01);
        s = DP_S16(s, _mm512_packs_epi32(x2, x3), s23);
        if (NT == 1) {
            __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), words);
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d * y->d), facc[t]);
            macc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(factor * y->d), macc[t]);
            continue;
        }
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(y->d));
        facc[t] = _mm512_fmadd_ps(f, dvec, facc[t]);
        __m512 bs;
        if (has_aux) {
            bs = _mm512_loadu_ps(aux + (size_t)t * aux_stride + 16 * i);
        } else {
            __m512i b16 = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y->bsums));
            bs = _mm512_mul_ps(_mm512_cvtepi32_ps(b16), _mm512_set1_ps(y->d));
        }
        facc[t] = _mm512_fnmadd_ps(bs, g16, facc[t]);
    }
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

static inline __attribute__((always_inline)) void
SW_SFX(kq_scales)(const uint8_t *scales, __m512i *s01, __m512i *s23, __m256i *mins)
{
    __m256i sw = k_scales_words(scales);
    __m512i swz = _mm512_castsi256_si512(sw);
    *s01 = _mm512_permutexvar_epi16(_mm512_loadu_si512(IDX_K4_0), swz);
    *s23 = _mm512_permutexvar_epi16(_mm512_loadu_si512(IDX_K4_1), swz);
    *mins = _mm256_permutexvar_epi16(_mm256_loadu_si256((const __m256i *)IDX_KMIN), sw);
}

/* The 256 unsigned quants of a Q4_K block (qh NULL) or Q5_K block (qh its
 * high bits) as w[0..3]: the quants that meet activation bytes 0-63,
 * 64-127, 128-191 and 192-255. Shared by the dot kernels and pack16. */
static inline __attribute__((always_inline)) void
SW_SFX(kq_unpack)(const uint8_t *qs, const uint8_t *qh, __m512i w[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
    __m512i lo0 = _mm512_and_si512(q0, m4), hi0 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    __m512i lo1 = _mm512_and_si512(q1, m4), hi1 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
    w[0] = _mm512_shuffle_i64x2(lo0, hi0, 0x44);
    w[1] = _mm512_shuffle_i64x2(lo0, hi0, 0xEE);
    w[2] = _mm512_shuffle_i64x2(lo1, hi1, 0x44);
    w[3] = _mm512_shuffle_i64x2(lo1, hi1, 0xEE);
    if (qh) {
        /* high bits: [qh | qh>>1], so bit 2c lands on the low half and bit
         * 2c+1 on the high half; A | (B & C) = 0xF8 */
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 1), 1);
        w[0] = _mm512_ternarylogic_epi32(w[0], _mm512_slli_epi16(hz, 4), bit4, 0xF8);
        w[1] = _mm512_ternarylogic_epi32(w[1], _mm512_slli_epi16(hz, 2), bit4, 0xF8);
        w[2] = _mm512_ternarylogic_epi32(w[2], hz, bit4, 0xF8);
        w[3] = _mm512_ternarylogic_epi32(w[3], _mm512_srli_epi16(hz, 2), bit4, 0xF8);
    }
}

/* The 256 quants of a Q6_K block, stored +32 (0..63), in the same order. */
static inline __attribute__((always_inline)) void
SW_SFX(k6_unpack)(const block_q6_k *b, __m512i q[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        __m512i l = _mm512_loadu_si512(b->ql + 64 * h);
        __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
        /* weights 128h + 0..63 and 128h + 64..127 */
        q[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), _mm512_slli_epi16(hz, 4), m30, 0xF8);
        q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hz, m30, 0xF8);
    }
}

/* Q4_K and Q5_K rows: the same block layout but for Q5_K's high bits. */
static inline __attribute__((always_inline)) void
SW_SFX(kq_rows)(int64_t n, const void *wv, const void *act, size_t stride, const float *aux, size_t aux_stride,
                const int NT, const bool has_aux, float *out, size_t ostride, const bool q5)
{
    const uint8_t *blk = wv;
    const size_t bsize = q5 ? sizeof(block_q5_k) : sizeof(block_q4_k);
    __m512 facc[SW_DOTN_MAX];
    __m256 macc[1] = {_mm256_setzero_ps()};
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, blk += bsize) {
        const block_q4_k *b = (const block_q4_k *)blk;   /* d, dmin, scales: same place in both */
        __m512i w[4];
        if (q5) SW_SFX(kq_unpack)(((const block_q5_k *)blk)->qs, ((const block_q5_k *)blk)->qh, w);
        else SW_SFX(kq_unpack)(b->qs, NULL, w);
        __m128 dd = load_2h(&b->d);
        __m512i s01, s23;
        __m256i mins;
        SW_SFX(kq_scales)(b->scales, &s01, &s23, &mins);
        SW_SFX(k_tokens)(w, s01, s23, _mm_cvtss_f32(dd), mins, _mm_cvtss_f32(_mm_movehdup_ps(dd)), act, stride,
                         aux, aux_stride, i, NT, has_aux, facc, macc);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) out[t * ostride] = hsum512(facc[t]) - (NT == 1 ? hsum256(macc[0]) : 0.0f);
}

static inline __attribute__((always_inline)) void
SW_SFX(q4_k_rows)(int64_t n, const void *wv, const void *act, size_t stride, const float *aux, size_t aux_stride,
                  const int NT, const bool has_aux, float *out, size_t ostride)
{
    SW_SFX(kq_rows)(n, wv, act, stride, aux, aux_stride, NT, has_aux, out, ostride, false);
}

static inline __attribute__((always_inline)) void
SW_SFX(q5_k_rows)(int64_t n, const void *wv, const void *act, size_t stride, const float *aux, size_t aux_stride,
                  const int NT, const bool has_aux, float *out, size_t ostride)
{
    SW_SFX(kq_rows)(n, wv, act, stride, aux, aux_stride, NT, has_aux, out, ostride, true);
}

/* ---- Q6_K ------------------------------------------------------------------------ */

static inline __attribute__((always_inline)) void
SW_SFX(q6_k_rows)(int64_t n, const void *wv, const void *act, size_t stride, const float *aux, size_t aux_stride,
                  const int NT, const bool has_aux, float *out, size_t ostride)
{
    const block_q6_k *b = wv;
    const __m512i idx0 = _mm512_loadu_si512(IDX_K6_0), idx1 = _mm512_loadu_si512(IDX_K6_1);
    __m512 facc[SW_DOTN_MAX];
    __m256 macc[1] = {_mm256_setzero_ps()};
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        __m512i q[4];
        SW_SFX(k6_unpack)(b, q);
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m512i scz = _mm512_castsi256_si512(sc);
        __m512i s0 = _mm512_permutexvar_epi16(idx0, scz), s1 = _mm512_permutexvar_epi16(idx1, scz);
        float d = _cvtsh_ss(b->d);
        /* the +32 of every stored quant goes through bsums: 32 * d * sc_k per 16 */
        SW_SFX(k_tokens)(q, s0, s1, d, sc, 32.0f * d, act, stride, aux, aux_stride, i, NT, has_aux, facc, macc);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) out[t * ostride] = hsum512(facc[t]) - (NT == 1 ? hsum256(macc[0]) : 0.0f);
}

/* ---- 16 packed rows x many tokens (sw_kpack16) ---------------------------------
 * Per sub-block: steps x (one 64-byte load, then per token one vpdpbusd
 * against a broadcast activation dword); then per token one cvt and one
 * multiply-add by the 16 rows' float scales. Lanes are rows throughout, so
 * the 16 results per token are stored with one instruction. */
static inline __attribute__((always_inline)) void
SW_SFX(gemm16_rows)(const sw_kpack16 *p, int64_t nb, const int nsub, const void *act, size_t stride,
                    const float *aux, size_t aux_stride, const int NT, float *out, size_t ostride)
{
    const int steps = QK_K / nsub / 4, sublen = QK_K / nsub;
    __m512 total[SW_DOTN_MAX];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) total[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p++) {
        __m512 ydv[SW_DOTN_MAX];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < NT; t++) ydv[t] = _mm512_set1_ps(sw_act_block(act, stride, t, i)->d);
        for (int j = 0; j < nsub; j++) {
            __m512i acc[SW_DOTN_MAX];
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8")
            for (int st = 0; st < steps; st++) {
                __m512i wv = _mm512_load_si512(p->q + (size_t)(j * steps + st) * 64);
                _Pragma("GCC unroll 8")
                for (int t = 0; t < NT; t++) {
                    int32_t a4;
                    memcpy(&a4, sw_act_block(act, stride, t, i)->qs + j * sublen + 4 * st, 4);
                    acc[t] = DP_U8S8(acc[t], wv, _mm512_set1_epi32(a4));
                }
            }
            __m512 sc = _mm512_load_ps(p->scale[j]);
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++)
                total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(sc, ydv[t]), total[t]);
        }
        for (int k = 0; k < 16; k++) {
            __m512 ov = _mm512_load_ps(p->offs[k]);
            _Pragma("GCC unroll 8")
            for (int t = 0; t < NT; t++)
                total[t] = _mm512_fnmadd_ps(ov, _mm512_set1_ps(aux[(size_t)t * aux_stride + 16 * i + k]), total[t]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}

/* sw_kpack16_rows with the unpacking of the dot kernels and scatters for
 * the row interleave: row r's dword m goes to dword 16m + r. */
static int SW_SFX(pack16)(sw_type type, const uint8_t *w, size_t row_size, int64_t nb, sw_kpack16 *pk)
{
    if (type != SW_TYPE_Q4_K && type != SW_TYPE_Q5_K && type != SW_TYPE_Q6_K) return 0;
    const __m512i lane16 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(16));
    const size_t bsize = type == SW_TYPE_Q4_K ? sizeof(block_q4_k) : type == SW_TYPE_Q5_K ? sizeof(block_q5_k)
                                                                                         : sizeof(block_q6_k);
    for (int64_t i = 0; i < nb; i++)
        for (int r = 0; r < 16; r++) {
            const uint8_t *blk = w + (size_t)r * row_size + (size_t)i * bsize;
            __m512i q[4];
            __m512 scale, offs;
            if (type == SW_TYPE_Q6_K) {
                const block_q6_k *b = (const block_q6_k *)blk;
                SW_SFX(k6_unpack)(b, q);
                float d = _cvtsh_ss(b->d);
                scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->scales))),
                                      _mm512_set1_ps(d));
                offs = _mm512_mul_ps(scale, _mm512_set1_ps(32.0f));
            } else {
                const block_q4_k *b = (const block_q4_k *)blk;
                if (type == SW_TYPE_Q5_K) SW_SFX(kq_unpack)(((const block_q5_k *)blk)->qs, ((const block_q5_k *)blk)->qh, q);
                else SW_SFX(kq_unpack)(b->qs, NULL, q);
                __m128 dd = load_2h(blk);
                /* words 0..7 scales, 8..15 mins -> lanes 0..7 d*sc_j (8..15 unused), offs[k] = dmin*m_{k/2} */
                __m256i sw = k_scales_words(b->scales);
                __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(sw));
                scale = _mm512_mul_ps(f, _mm512_set1_ps(_mm_cvtss_f32(dd)));
                __m256i mins = _mm256_permutexvar_epi16(_mm256_loadu_si256((const __m256i *)IDX_KMIN), sw);
                offs = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(mins)),
                                     _mm512_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dd))));
            }
            int32_t *dst = (int32_t *)pk[i].q + r;
            for (int c = 0; c < 4; c++)
                _mm512_i32scatter_epi32(dst + 256 * c, lane16, q[c], 4);
            _mm512_i32scatter_ps(&pk[i].scale[0][r], lane16, scale, 4);
            _mm512_i32scatter_ps(&pk[i].offs[0][r], lane16, offs, 4);
        }
    return type == SW_TYPE_Q6_K ? 16 : 8;
}

#define SW_G16_CALL(k)                                                                            \
    (nsub == 8 ? SW_SFX(gemm16_rows)(p, nb, 8, act, stride, aux, aux_stride, k, out, ostride)      \
               : SW_SFX(gemm16_rows)(p, nb, 16, act, stride, aux, aux_stride, k, out, ostride))
static void SW_SFX(gemm16)(const sw_kpack16 *p, int64_t nb, int nsub, const void *act, size_t stride,
                           const float *aux, size_t aux_stride, int ntok, float *out, size_t ostride)
{
    SW_FOR_NT(ntok, SW_G16_CALL)
}
#undef SW_G16_CALL

/* ---- entry points: one token, and 1..SW_DOTN_MAX tokens ----------------------------- */

#define SW_KQ_CALL(k)                                                                                     \
    (aux ? SW_KQ_ROWS(n, w, act, stride, aux, aux_stride, k, true, out, ostride)                           \
         : SW_KQ_ROWS(n, w, act, stride, NULL, 0, k, false, out, ostride))
#define SW_KQ_ENTRY(kind)                                                                                   \
    static float SW_SFX(dot_##kind)(int64_t n, const void *w, const void *act) {                            \
        float r;                                                                                            \
        SW_SFX(kind##_rows)(n, w, act, 0, NULL, 0, 1, false, &r, 0);                                        \
        return r;                                                                                           \
    }                                                                                                       \
    static void SW_SFX(dotn_##kind)(int64_t n, const void *w, const void *act, size_t stride,               \
                                    const float *aux, size_t aux_stride, int ntok, float *out, size_t ostride) { \
        SW_FOR_NT(ntok, SW_KQ_CALL)                                                                         \
    }

#define SW_KQ_ROWS SW_SFX(q4_k_rows)
SW_KQ_ENTRY(q4_k)
#undef SW_KQ_ROWS
#define SW_KQ_ROWS SW_SFX(q5_k_rows)
SW_KQ_ENTRY(q5_k)
#undef SW_KQ_ROWS
#define SW_KQ_ROWS SW_SFX(q6_k_rows)
SW_KQ_ENTRY(q6_k)
#undef SW_KQ_ROWS
#undef SW_KQ_ENTRY
#undef SW_KQ_CALL
#undef DP_U8S8
#undef DP_S16
