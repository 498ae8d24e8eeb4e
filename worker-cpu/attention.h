/* Attention tile kernels over the KV cache, one set per ISA.
 *
 * The cache keeps K transposed in blocks of SW_ATTN_KBLOCK positions
 * ([blocks][head_dim][32], so scores vectorize over positions and read
 * each block's lines in order) and V as [positions][head_dim], in one of
 * two element types (sw_kv_type):
 *   f16   IEEE half: half the bytes of float, which is what long-context
 *         decode and wide batches read most (llama.cpp's default too);
 *   q8_0  int8 with one half-precision scale per 32 dimensions of a
 *         position (llama.cpp's q8_0 K and V caches: the same values,
 *         quantized the same way): 1.06 bytes an element, for contexts
 *         where the cache's stream outweighs the weights'. Its scales sit
 *         in arrays of their own, both laid out as K with 32 dimensions as
 *         one: the scale of group g at position j is at
 *         sw_attn_k_at(head_dim / 32, g, j), so a block's 32 positions'
 *         scales for a group are one run of 64 bytes.
 * Arithmetic is float. */
#ifndef SW_ATTENTION_H
#define SW_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/quant.h"
#include "worker-cpu/kernels.h"

/* K^T's blocks: element (d, j) of a head's K^T at sw_attn_k_at(hd, d, j).
 * A row of d's 32 positions is one 64-byte line; a block, a head's K for
 * 32 positions, is contiguous. (Rows [head_dim][slots] were 64 separate
 * streams a few lines long, which the prefetchers did not follow: the
 * scores kernel streamed at 3.4-4.8 GB/s a core; docs/perf/cpu.md,
 * "Attention at batch 16".) */
#define SW_ATTN_KBLOCK 32
static inline size_t sw_attn_k_at(int hd, int d, int j)
{
    return (size_t)(j / SW_ATTN_KBLOCK) * SW_ATTN_KBLOCK * (size_t)hd + (size_t)d * SW_ATTN_KBLOCK +
           (size_t)(j % SW_ATTN_KBLOCK);
}

typedef enum { SW_KV_F16, SW_KV_Q8_0 } sw_kv_type;
#define SW_KV_GROUP 32   /* q8_0: dimensions per scale */

/* "f16" / "q8_0"; sw_kv_type_parse returns false for any other name. */
const char *sw_kv_type_name(sw_kv_type t);
bool sw_kv_type_parse(const char *name, sw_kv_type *t);

typedef struct {
    /* S[r*ss + j] = Q[r] . K[:, j] for r < M (query rows hd apart) and j < N
     * rounded up to the tile (16 or 32 positions: KT and S must have that
     * many, so both are padded to whole blocks); KT in blocks, from
     * position 0 (sw_attn_k_at). `zero` (>= hd floats of 0) stands in for
     * missing query rows of the last tile of 4. */
    void (*scores)(const float *Q, int M, int hd, const sw_f16 *KT, int N, float *S, size_t ss,
                   const float *zero);
    /* O[r*hd + d] = sum_{j<N} P[r*ps + j] * V[j*hd + d] for r < M; `zero`
     * (>= N floats of 0) stands in for missing rows of P. */
    void (*pv)(const float *P, size_t ps, int M, const sw_f16 *V, int hd, int N, float *O, const float *zero);
    /* The same over a q8_0 cache: KT's and V's elements times their
     * scales, KS and VS (from block 0 of KT, V's first row); hd a multiple
     * of SW_KV_GROUP. pv_q8 reads P's rows (and `zero`) to N rounded up to
     * the block. */
    void (*scores_q8)(const float *Q, int M, int hd, const int8_t *KT, const sw_f16 *KS, int N, float *S,
                      size_t ss, const float *zero);
    void (*pv_q8)(const float *P, size_t ps, int M, const int8_t *V, const sw_f16 *VS, int hd, int N, float *O,
                  const float *zero);
    /* y[i] = sw_attn_to_f16(x[i]) for i < n: filing K and V into the cache */
    void (*to_f16)(const float *x, sw_f16 *y, int n);
} sw_attn_kernels;

/* The kernels for an ISA (each ISA's own, tested against the scalar set). */
const sw_attn_kernels *sw_attn_kernels_for(sw_isa isa);

/* Half with round-to-nearest-even, saturated to +-65504 so that an outlier
 * never becomes infinity in the cache (NaN stays NaN). */
sw_f16 sw_attn_to_f16(float f);

#endif
