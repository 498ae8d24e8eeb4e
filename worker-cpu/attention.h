/* Attention tile kernels over a half-precision KV cache, one set per ISA.
 *
 * The cache keeps K transposed ([head_dim][positions], so scores vectorize
 * over positions) and V as [positions][head_dim], both as IEEE half: half
 * the bytes of float, which is what long-context decode and wide batches
 * read most (llama.cpp's default cache type too). Arithmetic is float. */
#ifndef SW_ATTENTION_H
#define SW_ATTENTION_H

#include <stddef.h>
#include "llm/quant.h"
#include "worker-cpu/kernels.h"

typedef struct {
    /* S[r*ss + j] = Q[r] . K[:, j] for r < M (query rows hd apart) and j < N
     * rounded up to the tile (16 or 32 positions: K^T and S must have that
     * many, so rows are padded to 32); K^T rows are kts apart. `zero` (>= hd floats of 0)
     * stands in for missing query rows of the last tile of 4. */
    void (*scores)(const float *Q, int M, int hd, const sw_f16 *KT, size_t kts, int N, float *S, size_t ss,
                   const float *zero);
    /* O[r*hd + d] = sum_{j<N} P[r*ps + j] * V[j*hd + d] for r < M; `zero`
     * (>= N floats of 0) stands in for missing rows of P. */
    void (*pv)(const float *P, size_t ps, int M, const sw_f16 *V, int hd, int N, float *O, const float *zero);
    /* y[i] = sw_attn_to_f16(x[i]) for i < n: filing K and V into the cache */
    void (*to_f16)(const float *x, sw_f16 *y, int n);
} sw_attn_kernels;

/* The kernels for an ISA (each ISA's own, tested against the scalar set). */
const sw_attn_kernels *sw_attn_kernels_for(sw_isa isa);

/* Half with round-to-nearest-even, saturated to +-65504 so that an outlier
 * never becomes infinity in the cache (NaN stays NaN). */
sw_f16 sw_attn_to_f16(float f);

#endif
