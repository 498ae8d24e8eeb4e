/* Tensor element types and quantized block formats.
 *
 * Type ids are GGML's, because GGUF files store them. Each block format is a
 * plain struct whose size is asserted at compile time (quant.c). Each format
 * has ONE scalar reference implementation (dequantize, quantize, dot product
 * against the activation format) here in llm/; every SIMD kernel in
 * worker-cpu/ is tested against these.
 */
#ifndef SW_QUANT_H
#define SW_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum {
    SW_TYPE_F32 = 0, SW_TYPE_F16 = 1, SW_TYPE_Q4_0 = 2, SW_TYPE_Q4_1 = 3,
    SW_TYPE_Q5_0 = 6, SW_TYPE_Q5_1 = 7, SW_TYPE_Q8_0 = 8, SW_TYPE_Q8_1 = 9,
    SW_TYPE_Q2_K = 10, SW_TYPE_Q3_K = 11, SW_TYPE_Q4_K = 12, SW_TYPE_Q5_K = 13,
    SW_TYPE_Q6_K = 14, SW_TYPE_Q8_K = 15, SW_TYPE_BF16 = 30, SW_TYPE_MXFP4 = 39,
    SW_TYPE_COUNT = 40
} sw_type;

typedef uint16_t sw_f16;   /* IEEE half, raw bits */
typedef uint16_t sw_bf16;  /* bfloat16, raw bits */

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_MXFP4 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { sw_f16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;            /* 18 B */
typedef struct { sw_f16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;         /* 20 B */
typedef struct { sw_f16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0; /* 22 B */
typedef struct { sw_f16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1; /* 24 B */
typedef struct { sw_f16 d; int8_t qs[QK8_0]; } block_q8_0;                 /* 34 B */

/* MXFP4 (OCP microscaling, gpt-oss's experts): 32 E2M1 values sharing a
 * power-of-two scale. Element j is sw_fp4_values[q] * 2^(e - 128), q the
 * low nibble of qs[j] (j < 16) or the high nibble of qs[j - 16]: the table
 * holds twice each E2M1 value, so all sixteen are integers. */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;       /* 17 B */
extern const int8_t sw_fp4_values[16];
/* 2^(e - 128): the block scale for the doubled table above. */
float sw_e8m0_half(uint8_t e);

/* Q4_K: 8 sub-blocks of 32; weight = d*scale_j*q - dmin*min_j, 6-bit scales/mins packed in 12 bytes. */
typedef struct {
    sw_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_k;                                                              /* 144 B */

/* Q5_K: as Q4_K plus one high bit per weight. */
typedef struct {
    sw_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_k;                                                              /* 176 B */

/* Q6_K: 16 sub-blocks of 16; weight = d*scale_j*(q-32). */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    sw_f16 d;
} block_q6_k;                                                              /* 210 B */

/* Q8_K: activation format. bsums[j] = sum of qs[16j..16j+15]. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_k;                                                              /* 292 B */

typedef struct {
    const char *name;     /* "q4_K", "f32", ... as GGML spells them */
    uint32_t block_size;  /* elements per block (1 for float types) */
    uint32_t type_size;   /* bytes per block */
    bool quantized;
    sw_type vec_dot_type; /* activation format its dot product takes */
} sw_type_traits;

/* NULL for unknown or unsupported ids: callers must check. */
const sw_type_traits *sw_type_info(uint32_t type);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or the type is unknown. */
size_t sw_row_size(sw_type type, uint64_t n);

/* fp16 / bf16 conversions (exact round-to-nearest-even). */
float sw_f16_to_f32(sw_f16 h);
sw_f16 sw_f32_to_f16(float f);
float sw_bf16_to_f32(sw_bf16 h);
sw_bf16 sw_f32_to_bf16(float f);

/* Reference (scalar) row routines; n is a multiple of the block size.
 * dequantize: any supported type (float types too) -> float.
 * quantize:   float -> type, for every type we write (F16, BF16, Q8_0, Q4_0,
 *             Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K, Q8_K); false for others.
 * vec_dot:    dot of a row of `type` with a row of sw_type_info(type)->vec_dot_type. */
bool sw_dequantize_row(sw_type type, const void *src, float *dst, int64_t n);
bool sw_quantize_row(sw_type type, const float *src, void *dst, int64_t n);
float sw_vec_dot_ref(sw_type type, int64_t n, const void *w, const void *act);

/* Stored 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's
 * 12-byte scales field. */
static inline void sw_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Integer form of one K-quant block (Q4_K, Q5_K, Q6_K), for kernels that
 * repack weights: weight i = scale[i / (256/nsub)] * q[i] - offs[i / 16],
 * with q the stored unsigned quant (Q6_K's includes its +32), so a dot with
 * Q8_K activations is d_y * (sum_j scale_j * sum q*a - sum_k offs_k * bsums_k).
 * Returns nsub (8 or 16), or 0 for other types. */
int sw_kblock_unpack(sw_type type, const void *block, uint8_t q[QK_K], float scale[16], float offs[16]);

#endif
