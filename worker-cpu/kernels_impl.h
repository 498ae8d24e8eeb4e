/* Internal to the kernels: the per-ISA function table that kernels.c
 * dispatches through. kernels_avx2.c / kernels_avx512.c fill in what they
 * implement; anything left NULL falls back to the next ISA down (scalar last).
 */
#ifndef SW_KERNELS_IMPL_H
#define SW_KERNELS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/quant.h"

/* Dot of one weight row (n elements) with one activation row. */
typedef float (*sw_dot_fn)(int64_t n, const void *w, const void *act);
/* Dot of one weight row with ntok (1..SW_DOTN_MAX) activation rows that are
 * act_stride bytes apart; result t goes to out[t * out_stride]. The point is
 * to decode each weight block once and use it for every token.
 * aux (may be NULL): for Q8_K activations, 16 floats per block per token,
 * d * bsums[k], token rows aux_stride floats apart (see sw_q8k_aux); it turns
 * the K-quants' min / offset term into one multiply-add per block. */
typedef void (*sw_dotn_fn)(int64_t n, const void *w, const void *act, size_t act_stride,
                           const float *aux, size_t aux_stride, int ntok, float *out, size_t out_stride);
/* Quantizes one activation row of n floats (n a multiple of the block size). */
typedef void (*sw_qact_fn)(const float *x, void *dst, int64_t n);

#define SW_DOTN_MAX 8

/* Runs CALL(k) for k = ntok (1..SW_DOTN_MAX) as a compile-time constant, so
 * that every token count gets its own fully unrolled kernel instance. */
#define SW_FOR_NT(ntok, CALL)                                                          \
    switch (ntok) {                                                                    \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break;            \
    case 4: CALL(4); break; case 5: CALL(5); break; case 6: CALL(6); break;            \
    case 7: CALL(7); break; case 8: CALL(8); break;                                    \
    default: break;                                                                    \
    }

/* 16 weight rows x one 256-weight K-quant block, row-interleaved for the
 * many-token kernel: for sub-block j and step s, the 64 bytes
 * q[(j*steps + s)*64 ..] hold 4 consecutive quants of each of the 16 rows, so
 * one vpdpbusd against a broadcast dword of activations gives 16 rows' partial
 * sums at once, and the sub-block scales become one float vector per
 * sub-block instead of per-token integer work. (sw_kblock_unpack's form.) */
typedef struct {
    uint8_t q[QK_K * 16];
    float scale[16][16];   /* [sub-block][row] */
    float offs[16][16];    /* [bsum group][row] */
} sw_kpack16;

/* Packs 16 rows (row_size bytes apart) of nb blocks of a K-quant type;
 * returns nsub (0 for other types). */
int sw_kpack16_rows(sw_type type, const uint8_t *w, size_t row_size, int64_t nb, sw_kpack16 *pk);

/* Y for 16 packed rows x ntok (1..SW_DOTN_MAX) tokens: out[t*out_stride + r].
 * aux is required (see sw_dotn_fn). nsub = 8 (Q4_K, Q5_K) or 16 (Q6_K). */
typedef void (*sw_gemm16_fn)(const sw_kpack16 *p, int64_t nb, int nsub, const void *act, size_t act_stride,
                             const float *aux, size_t aux_stride, int ntok, float *out, size_t out_stride);

/* 16 Q4_K rows x one 256-weight block, prepacked once at model load
 * (sw_pack_tensor) in a row-interleaved form that keeps 4-bit quants, so it
 * is as small as the original (148 bytes per row-block against 144) and
 * every batch size, 1 included, runs one vpdpbusd per 4 weights x 16 rows:
 *   qs[j][c][4r + k] = q(r, 32j + 8c + k) | q(r, 32j + 8c + 4 + k) << 4
 * so for row r one 64-byte load masked with 0x0f gives quants matching
 * activation dword 8j + 2c, and shifted right by 4 the dword 8j + 2c + 1;
 * sc[j][r] / mn[p][r][e] are the 6-bit sub-block scales / mins (mins paired
 * 2p, 2p+1 so one vpmovzxbw + vpdpwssd handles two sub-blocks), d / dmin
 * the rows' fp16 block scales. */
typedef struct {
    uint8_t qs[8][4][64];
    uint8_t sc[8][16];
    uint8_t mn[4][16][2];
    uint16_t d[16], dmin[16];
} sw_q4k16;
_Static_assert(sizeof(sw_q4k16) == 2368, "sw_q4k16: 148 bytes per row-block");

/* 16 Q5_K rows x one block: Q4_K's form for the low 4 bits, scales and mins
 * (Q5_K has the same), then the fifth bits: qh[j][4r + k] holds, for
 * c = 0..3, the fifth bit of weight 32j + 8c + k at bit 2c and of weight
 * 32j + 8c + 4 + k at bit 2c + 1, so one load per sub-block serves its four
 * 64-byte nibble loads (a shift and a masked OR each). 180 bytes per
 * row-block against 176. */
typedef struct {
    sw_q4k16 q4;
    uint8_t qh[8][64];
} sw_q5k16;
_Static_assert(sizeof(sw_q5k16) == 2880, "sw_q5k16: 180 bytes per row-block");

/* Y for 16 packed Q4_K rows (nb consecutive sw_q4k16) x ntok (1..SW_DOTN_MAX)
 * Q8_K tokens: out[t*out_stride + r]. bsp: per token bsp_stride int32, per
 * block 4 dwords; dword p holds the int16 pair (bsum32_{2p}, bsum32_{2p+1}),
 * bsum32_j the sum of the token's 32 quants of sub-block j. */
typedef void (*sw_q4k16_fn)(const sw_q4k16 *p, int64_t nb, const void *act, size_t act_stride,
                            const int32_t *bsp, size_t bsp_stride, int ntok, float *out, size_t out_stride);

/* 16 Q6_K rows x one block, the same idea: ql as sw_q4k16.qs (low 4 bits of
 * the stored 0..63 quants), qh[j][h][4r + k] the top 2 bits of weights
 * 32j + 16h + 4m + k at bits 2m, 2m+1 (m = 0..3: the four 4-weight pieces of
 * chunks 2h and 2h+1), sc[j][r][e] the int8 scale of 16-weight sub-block
 * 2j + e, d the fp16 block scales. 212 bytes per row-block against 210. */
typedef struct {
    uint8_t ql[8][4][64];
    uint8_t qh[8][2][64];
    int8_t sc[8][16][2];
    uint16_t d[16];
    uint8_t pad[32];
} sw_q6k16;
_Static_assert(sizeof(sw_q6k16) == 3392, "sw_q6k16: 212 bytes per row-block");

/* As sw_q4k16_fn for sw_q5k16 (the same bsp form). */
typedef void (*sw_q5k16_fn)(const sw_q5k16 *p, int64_t nb, const void *act, size_t act_stride,
                            const int32_t *bsp, size_t bsp_stride, int ntok, float *out, size_t out_stride);

/* As sw_q4k16_fn for sw_q6k16; bsp here: per block 16 int32, -32 * bsums[k]
 * (the stored quants' +32 offset, applied as the sums' starting value). */
typedef void (*sw_q6k16_fn)(const sw_q6k16 *p, int64_t nb, const void *act, size_t act_stride,
                            const int32_t *bsp, size_t bsp_stride, int ntok, float *out, size_t out_stride);

/* 16 rows of a 32-weight type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4), prepacked at
 * load like the K-quants. A group of 16 rows is its nb quant blocks, then
 * its nb scale blocks, so that the 64-byte quant loads stay aligned whatever
 * the type's size (34 bytes a row-block for Q8_0 would not be). Per block:
 *   Q8_0       q[k][4r + e] = qs(r, 4k + e) ^ 0x80: unsigned, 128 too high;
 *   Q4_x, Q5_x q[c][4r + e] = q(r, 4c + e) | q(r, 16 + 4c + e) << 4 (c < 4),
 *              so the low nibbles match activation dword c and the high
 *              ones dword c + 4; Q5_x then 64 bytes of fifth bits, byte
 *              4r + e holding at bit g that of weight 4g + e (g < 8);
 *   MXFP4      as Q4_x; the kernels look each nibble up as its doubled
 *              E2M1 value plus 12 (0..24, unsigned);
 *   scales     d[16] (fp16), and for Q4_1 / Q5_1 then m[16]; MXFP4: the
 *              16 E8M0 exponents as they are.
 * Row-block sizes equal the originals': 34, 18, 20, 22, 24, 17 bytes. */
static inline bool sw_is_q32(sw_type t)
{
    return t == SW_TYPE_Q4_0 || t == SW_TYPE_Q4_1 || t == SW_TYPE_Q5_0 || t == SW_TYPE_Q5_1 || t == SW_TYPE_Q8_0 ||
           t == SW_TYPE_MXFP4;
}
static inline size_t sw_q32x16_qbytes(sw_type t)
{
    return t == SW_TYPE_Q8_0 ? 512 : t == SW_TYPE_Q5_0 || t == SW_TYPE_Q5_1 ? 320 : 256;
}
static inline size_t sw_q32x16_sbytes(sw_type t)
{
    return t == SW_TYPE_Q4_1 || t == SW_TYPE_Q5_1 ? 64 : t == SW_TYPE_MXFP4 ? 16 : 32;
}
/* The offset a type's unsigned packed quants carry: 128 (Q8_0), 8, 16,
 * 12 (MXFP4's looked-up values), none for Q4_1 / Q5_1 (m instead). */
static inline int sw_q32_offset(sw_type t)
{
    return t == SW_TYPE_Q8_0 ? 128 : t == SW_TYPE_Q4_0 ? 8 : t == SW_TYPE_Q5_0 ? 16 : t == SW_TYPE_MXFP4 ? 12 : 0;
}
/* MXFP4's nibble -> its doubled E2M1 value + 12, for vpshufb. */
#define SW_MXFP4_LUT_U8 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0
_Static_assert(512 + 32 == 16 * sizeof(block_q8_0), "sw_q32x16: Q8_0 keeps its size");
_Static_assert(256 + 32 == 16 * sizeof(block_q4_0), "sw_q32x16: Q4_0 keeps its size");
_Static_assert(256 + 64 == 16 * sizeof(block_q4_1), "sw_q32x16: Q4_1 keeps its size");
_Static_assert(320 + 32 == 16 * sizeof(block_q5_0), "sw_q32x16: Q5_0 keeps its size");
_Static_assert(320 + 64 == 16 * sizeof(block_q5_1), "sw_q32x16: Q5_1 keeps its size");
_Static_assert(256 + 16 == 16 * sizeof(block_mxfp4), "sw_q32x16: MXFP4 keeps its size");

/* Per token and 32-weight block of its Q8_0 activations: the scale as a
 * float, minus the sum of the 32 quants (the unsigned weights' offset,
 * 128, 8 or 16, times it is the sums' starting value), and d times the sum
 * (Q4_1 / Q5_1's m term). */
typedef struct {
    float d;
    int32_t neg_sum;
    float d_sum;
} sw_q32_aux;

/* Y for 16 packed rows (q: nb quant blocks, s: their scale blocks) x ntok
 * (1..SW_DOTN_MAX) Q8_0 tokens act_stride bytes apart, aux aux_stride
 * entries apart: out[t*out_stride + r]. */
typedef void (*sw_q32x16_fn)(const uint8_t *q, const uint16_t *s, int64_t nb, const void *act, size_t act_stride,
                             const sw_q32_aux *aux, size_t aux_stride, int ntok, float *out, size_t out_stride);

/* The 32-weight types as X(name, type), for the kernel files' per-type
 * entry points and table entries. */
#define SW_Q32_TYPES(X) X(q4_0, SW_TYPE_Q4_0) X(q4_1, SW_TYPE_Q4_1) X(q5_0, SW_TYPE_Q5_0) \
                        X(q5_1, SW_TYPE_Q5_1) X(q8_0, SW_TYPE_Q8_0) X(mxfp4, SW_TYPE_MXFP4)
/* The entry point name##x16_##sfx (an sw_q32x16_fn) of a 32-weight type:
 * entry(type, ...), an always-inline kernel specialized on the constant. */
#define SW_Q32_ENTRY_POINT(sfx, entry, name, type)                                                             \
    static void name##x16_##sfx(const uint8_t *q, const uint16_t *s, int64_t nb, const void *act, size_t stride, \
                                const sw_q32_aux *aux, size_t aux_stride, int ntok, float *out, size_t ostride) { \
        entry(type, q, s, nb, act, stride, aux, aux_stride, ntok, out, ostride);                                 \
    }

/* Block i of token t's Q8_K row in an activation matrix whose rows are
 * stride bytes apart (the kernels' act / act_stride). */
static inline const block_q8_k *sw_act_block(const void *act, size_t stride, int t, int64_t i)
{
    return (const block_q8_k *)((const uint8_t *)act + (size_t)t * stride) + i;
}

/* The int8 form: 16 rows x one 256-weight block as int8 with one float
 * scale per row, into which packed Q4_K, Q5_K and Q6_K groups are expanded
 * tile by tile for products of many tokens (sw_set_i8_min_tokens). It drops
 * the per-sub-block scale and min work that holds the K-quant kernels at
 * 79-82 vector slots per 64 products: here a block costs 64 vpdpbusd and
 * two float operations per token. The price is one more rounding of each
 * weight, to 255 levels over its row-block (sw_i8x16_ref_block).
 *   q[k][4r + e] = v(r, 4k + e) + 128, v in -127..127 (one vpdpbusd per
 *                  activation dword k, like sw_q4k16's nibbles), and
 *   d[r]         = the row-block's scale: the weight is about v * d[r]. */
typedef struct {
    uint8_t q[64][64];
    float d[16];
} sw_i8x16;
_Static_assert(sizeof(sw_i8x16) == 4160, "sw_i8x16: 260 bytes per row-block");

/* Block i of the 16 rows of `type` starting at w (row_size bytes apart) in
 * the int8 form: the reference every SIMD expander must match byte for
 * byte. Per row and sub-block s (32 weights for Q4_K / Q5_K, 16 for Q6_K)
 * the weight is q * a_s - b_s (sw_kblock_unpack's scale and offset; Q6_K's
 * b_s = 32 a_s). The row-block's largest magnitude amax is taken at the
 * quant range's ends, d = amax / 127, id = 127 / amax (0 for an all-zero
 * row-block), and with the factors in 1/128ths, A = rint(128 a_s id) and
 * B = rint(128 b_s id), v = (q A - B + 64) >> 7: int16 arithmetic in the
 * SIMD expanders (|q A| and |q A - B| stay below 2^15 for every type's
 * quant range, as |b_s id| <= 127), half the instructions of float. The
 * factors' rounding moves v by at most (q_max + 1) / 256 of a step: 0.06
 * (Q4_K) to 0.25 (Q6_K), next to the 0.5 of v's own rounding. False for
 * types without an int8 form. */
bool sw_i8x16_ref_block(sw_type type, const uint8_t *w, size_t row_size, int64_t i, sw_i8x16 *dst);

/* The packed bytes of 16-row group g of p (for tests). */
struct sw_packed;
const uint8_t *sw_packed_group(const struct sw_packed *p, int64_t g);

/* nb packed row-blocks of one group (sw_q4k16, sw_q5k16 or sw_q6k16) into
 * nb sw_i8x16. */
typedef void (*sw_i8x16_expand_fn)(const void *blocks, int64_t nb, sw_i8x16 *out);

/* Y for 16 rows in the int8 form (nb consecutive sw_i8x16) x ntok
 * (1..the table's i8x16_ntok) Q8_K tokens: out[t*out_stride + r]. nsum: per token
 * nsum_stride int32, per block -128 times the sum of its 256 quants (the
 * +128 offset, applied as the sums' starting value). */
typedef void (*sw_i8x16_fn)(const sw_i8x16 *p, int64_t nb, const void *act, size_t act_stride, const int32_t *nsum,
                            size_t nsum_stride, int ntok, float *out, size_t out_stride);

/* The same for 16 tokens at once, their quants also in qa: per token
 * qa_stride bytes (a multiple of 64), block i's 256 at 256 i, 64-byte
 * aligned, as a tile unit loads them best (Q8_K's sit 4 bytes past a line). */
typedef void (*sw_i8x16_tiles_fn)(const sw_i8x16 *p, int64_t nb, const void *act, size_t act_stride,
                                  const int8_t *qa, size_t qa_stride, const int32_t *nsum, size_t nsum_stride,
                                  float *out, size_t out_stride);

typedef struct {
    sw_dot_fn dot[SW_TYPE_COUNT];
    sw_dotn_fn dotn[SW_TYPE_COUNT];
    sw_qact_fn quant_q8_k, quant_q8_0;
    sw_gemm16_fn gemm16;   /* K-quants x many tokens over sw_kpack16; NULL: dotn only */
    int (*pack16)(sw_type type, const uint8_t *w, size_t row_size, int64_t nb, sw_kpack16 *pk); /* as sw_kpack16_rows */
    sw_q4k16_fn q4k16;     /* prepacked Q4_K (sw_pack_tensor); NULL: the raw-row paths */
    sw_q4k16_fn q4k16_pf1; /* the same, with software prefetch at one token too (sw_prefetch_one_token) */
    sw_q5k16_fn q5k16;     /* prepacked Q5_K */
    sw_q6k16_fn q6k16;     /* prepacked Q6_K */
    sw_q32x16_fn q32x16[SW_TYPE_COUNT];   /* prepacked Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 */
    sw_i8x16_expand_fn i8x16_expand[SW_TYPE_COUNT];   /* packed Q4_K / Q5_K / Q6_K groups to the int8 form */
    sw_i8x16_fn i8x16;     /* the int8 form x many tokens */
    int i8x16_ntok;        /* the most tokens i8x16 takes a call (a multiple of its pass): a slice of i8_part */
    int i8x16_min_tokens;  /* products from this many tokens run on the form (sw_i8_min_tokens) */
    sw_i8x16_tiles_fn i8x16_tiles;   /* 16 tokens at once (AMX: kernels_amx.c); NULL: i8x16 serves */
    /* iters x SW_INT8_PEAK_MACS int8 multiply-adds in independent chains of
     * the instruction the packed kernels are built on (sw_int8_peak_gmac_s);
     * returns a value that depends on all of them. NULL: no such path. */
    int64_t (*int8_peak)(int64_t iters);
    const char *int8_peak_mix;   /* the instructions int8_peak times, as the bench names them */
    /* The same for the instruction the int8 form runs on, set with i8x16:
     * AVX-512 VNNI's int8_peak itself (mix the same pointer), vpdpbusd on
     * ymm (AVX-VNNI), tdpbsud (AMX). */
    int64_t (*i8x16_peak)(int64_t iters);
    const char *i8x16_peak_mix;
    int64_t i8x16_peak_macs;   /* multiply-adds an iteration of i8x16_peak */
} sw_kernel_table;

/* int8 multiply-adds per iteration of int8_peak, and of i8x16_peak but on
 * AMX: 12 vpdpbusd x 64 (VNNI), 24 vpmaddubsw x 32 (AVX2), 24 vpdpbusd
 * ymm x 32 (AVX-VNNI). */
#define SW_INT8_PEAK_MACS (12 * 64)

/* aux for one Q8_K row of n values (n/256 blocks): out[16*b + k] = d_b * bsums_b[k]. */
static inline void sw_q8k_aux(const block_q8_k *y, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int k = 0; k < QK_K / 16; k++) out[16 * b + k] = y[b].d * (float)y[b].bsums[k];
}

/* Overwrite the entries each ISA implements (these only run on CPUs that
 * have the ISA; kernels.c checks cpuid before calling them). */
void sw_kernels_fill_avx2(sw_kernel_table *t);
void sw_kernels_fill_avx512(sw_kernel_table *t, bool vnni);
/* Adds the AMX int8 form to an AVX-512 VNNI table where this CPU, the OS
 * and SPILLWAY_AMX (0: off) allow; true when it did. */
bool sw_kernels_fill_amx(sw_kernel_table *t);

/* Q8_K scale choice shared by the SIMD quantizers: given the block's max and
 * min (from vector reductions), the signed value of largest magnitude. On a
 * magnitude tie (or NaN) the scalar reference takes the first such value in
 * order, so we rescan to match it bit for bit. */
static inline float sw_q8k_pick(const float *x, float mx, float mn)
{
    if (mx == -mn || mx != mx || mn != mn) {
        float amax = 0, pick = 0;
        for (int j = 0; j < 256; j++)
            if (__builtin_fabsf(x[j]) > amax) { amax = __builtin_fabsf(x[j]); pick = x[j]; }
        return pick;
    }
    return mx > -mn ? mx : mn;
}

#endif
