/* The compute backend behind the GPU worker's scheduler. Two implementations
 * share this interface and the scheduler above it:
 *   - "cuda"    (cuda_backend.cu): FP8 weights on the device, paged KV cache;
 *   - "emulate" (emu_backend.c):   the same numerics on the CPU, so the whole
 *                                  worker is testable without a GPU.
 *
 * Numerics both follow (so emulation predicts what the GPU computes):
 *   - weights FP8 E4M3 with a per-output-row scale (weights.h);
 *   - the residual stream is float32; every other activation is rounded to
 *     bf16 at each kernel boundary (norm, matmul, rope, attention, swiglu);
 *   - a matmul over at most SW_GEMV_MAX_TOKENS tokens takes bf16 activations
 *     (the GPU's GEMV kernel); over more tokens the activations are quantized
 *     to FP8 with one scale per token (the GPU's cuBLASLt path, whose scalar
 *     scales cannot express per-row weight scales, so both per-row weight and
 *     per-token activation scales are applied in an epilogue);
 *   - logits are float32 (not rounded);
 *   - the KV cache holds bf16 (or FP8 E4M3 with unit scale: --kv-dtype fp8)
 *     in blocks of SW_KV_BLOCK positions; attention math is float32.
 */
#ifndef SW_GPU_BACKEND_H
#define SW_GPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "worker-gpu/weights.h"

#define SW_KV_BLOCK 16
#define SW_GEMV_MAX_TOKENS 16

typedef enum { SW_KV_BF16 = 0, SW_KV_FP8 = 1 } sw_kv_dtype;

/* One forward step over tokens of several sequences. Token i belongs to
 * sequence seq[i], sits at position pos[i] and attends to positions 0..pos[i]
 * of that sequence, reading the KV blocks listed in the sequence's row of
 * block_table (position p lives in block_table[seq*max_blocks + p/16], slot
 * p%16). The step writes K/V for every token before any attention reads, so
 * a chunk of consecutive positions of one sequence is causal as expected. */
typedef struct {
    int n_tokens;
    const int32_t *tokens, *pos, *seq;
    int n_seqs, max_blocks;
    const int32_t *block_table;       /* n_seqs x max_blocks */
    int n_logits;
    const int32_t *logits_idx;        /* token indices whose logits are wanted, in output order */
} sw_batch;

/* Sampling parameters for device-side sampling, one per logits row.
 * uniform: a number in [0,1) drawn by the caller's seeded generator, so the
 * choice is reproducible. temperature <= 0 is greedy. */
typedef struct {
    float temperature, top_p, uniform;
    int32_t top_k;
} sw_dev_sample;

typedef struct {
    const char *name;
    /* Writes n_logits x n_vocab float32 logits. Returns 0, or -1 with err. */
    int (*forward)(void *impl, const sw_batch *b, float *logits, char *err, size_t errlen);
    /* Optional (NULL if absent): forward, then sample on the device; writes
     * one token id per logits row. */
    int (*forward_sample)(void *impl, const sw_batch *b, const sw_dev_sample *sp, int32_t *out,
                          char *err, size_t errlen);
    void (*destroy)(void *impl);
} sw_backend_ops;

typedef struct {
    const sw_backend_ops *ops;
    void *impl;
    sw_hparams hp;
    uint32_t n_kv_blocks;
    sw_kv_dtype kv_dtype;
    int max_tokens_per_step;          /* most tokens one forward accepts */
} sw_backend;

/* Both take ownership of w (freed with the backend). n_kv_blocks = 0 picks a
 * default (emulate: enough for 8 sequences of the model's context, capped). */
sw_backend *sw_emu_backend_new(sw_fp8_weights *w, uint32_t n_kv_blocks, sw_kv_dtype kv,
                               int max_tokens_per_step, char *err, size_t errlen);
#ifdef SW_HAVE_CUDA
/* n_kv_blocks = 0: use most of the memory left after the weights. */
sw_backend *sw_cuda_backend_new(sw_fp8_weights *w, uint32_t n_kv_blocks, sw_kv_dtype kv,
                                int max_tokens_per_step, char *err, size_t errlen);
#endif
void sw_backend_free(sw_backend *b);

/* Checks a batch against the backend's limits (token ids, positions, block
 * ids, sequence indices). Returns 0 or -1 with err; both backends call it. */
int sw_batch_validate(const sw_backend *be, const sw_batch *b, char *err, size_t errlen);

#endif
