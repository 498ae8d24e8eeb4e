/* A model converted for the GPU worker (Llama's graph and the Qwen2, Qwen3,
 * Phi-3 and Gemma variants the loader knows): every 2-D weight in FP8 E4M3
 * with one float scale per output row (per output channel), the embedding in
 * bf16 and the norms in float32. Both backends (CUDA and the CPU emulation)
 * start from this host copy, so they compute from identical bytes.
 *
 * Q, K and V are stacked into one [QD+2*KVD] x E matrix and gate/up into one
 * [2F] x E matrix: one pass over the activations for each (per-row scales make
 * stacking exact). */
#ifndef SW_GPU_WEIGHTS_H
#define SW_GPU_WEIGHTS_H

#include <stddef.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include "llm/model.h"
#include "worker-gpu/fp8.h"

typedef struct {
    uint32_t rows, cols;      /* y[rows] = W[rows x cols] * x[cols] */
    sw_fp8 *q;                /* rows*cols, row-major */
    float *scale;             /* rows: W[r][c] ~= scale[r] * decode(q[r*cols+c]) */
} sw_fp8_matrix;

typedef struct {
    float *attn_norm, *ffn_norm;   /* n_embd each */
    sw_fp8_matrix wqkv;            /* rows: Q (n_head*hd), K (n_head_kv*hd), V (n_head_kv*hd) */
    sw_fp8_matrix wo;              /* n_embd x n_head*hd */
    sw_fp8_matrix wgu;             /* rows: gate (n_ff), up (n_ff) */
    sw_fp8_matrix wdown;           /* n_embd x n_ff */
    /* what some architectures add, NULL when absent: the q/k/v biases as one
     * [q_dim + 2 kv_dim] vector (zeros where a part has none), and the
     * per-head q and k norms, [2][head_dim] */
    float *bqkv, *qk_norm;
} sw_fp8_layer;

typedef struct {
    sw_hparams hp;
    uint32_t q_dim, kv_dim;        /* n_head*head_dim, n_head_kv*head_dim */
    uint16_t *tok_embd;            /* bf16, n_vocab x n_embd */
    float *output_norm;            /* n_embd */
    sw_fp8_matrix output;          /* n_vocab x n_embd */
    sw_fp8_layer *layers;
    float *rope_inv_freq;          /* n_rot/2: theta^(-2i/n_rot), divided by rope_freqs if present */
    /* the graph's other differences from Llama's (hp.rope_neox is one) */
    bool gelu;                     /* GELU (tanh form) gate instead of SiLU */
    float embd_scale;              /* embeddings are multiplied by this: 1, or sqrt(n_embd) */
    float *output_bias;            /* n_vocab, or NULL */
    uint64_t fp8_bytes;            /* weight bytes as stored (fp8 + scales + bf16 embd + norms) */
} sw_fp8_weights;

#ifdef __CUDACC__
#define SW_HOST_DEVICE __host__ __device__
#else
#define SW_HOST_DEVICE
#endif

/* The FFN gate's activation, one definition for the CUDA kernels and the
 * emulation: SiLU, or GELU in its tanh form. */
static inline SW_HOST_DEVICE float sw_gate_act(float g, bool gelu)
{
    return gelu ? 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) : g / (1.0f + expf(-g));
}

/* Converts a loaded model (dequantize each row with sw_dequantize_row, then
 * quantize to FP8 with a per-row scale). Uses OpenMP over rows. */
sw_fp8_weights *sw_fp8_weights_from_model(const sw_model *m, char *err, size_t errlen);

/* Random weights of a given shape, no file (benchmarks of large shapes where
 * the numbers do not matter): each row N(0, 1/cols)-like, then FP8. */
sw_fp8_weights *sw_fp8_weights_random(const sw_hparams *hp, uint64_t seed, char *err, size_t errlen);

/* Frees the big host arrays (after a backend has uploaded them) but keeps the
 * shapes: hp, dims, rope table. */
void sw_fp8_weights_drop_data(sw_fp8_weights *w);
void sw_fp8_weights_free(sw_fp8_weights *w);

/* Standard Llama 3 8B per-layer shape, with n_layer given (0 = 32). */
void sw_hparams_8b(sw_hparams *hp, uint32_t n_layer);

#endif
