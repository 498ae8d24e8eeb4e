/* Embeddings from a BERT-family encoder (sw_model_is_encoder: bert,
 * nomic-bert), computed on the CPU:
 *
 *   x = LayerNorm(token_embd[t] + token_types[0] + position_embd[p])
 *   per block:  x = LayerNorm(x + Wo * attention(Wq x + bq, Wk x + bk, Wv x + bv) + bo)
 *               x = LayerNorm(x + Wdown * act(x) + b_down)
 *   vector = L2-normalized pooling of x (mean, first row, last row: the file's)
 *
 * bert: act(x) = gelu(Wup x + b_up), GELU's exact (erf) form, as BERT
 * defines it. nomic-bert: no positions, q and k rotated instead (RoPE, NEOX
 * pairs), act(x) = silu(Wgate x) * Wup x, and no biases. Attention is
 * bidirectional (every token sees every token of its input) and never
 * crosses inputs.
 *
 * An input is computed whole, in one pass (there is no KV cache: nothing
 * is generated after it). The inputs of one call are packed into batches
 * of up to max_batch tokens, so the weights are read once a batch however
 * many inputs there are. No protobuf here: the engine (engine.c) turns the
 * wire's request into sw_embed_input.
 */
#ifndef SW_CPU_ENCODER_H
#define SW_CPU_ENCODER_H

#include <stddef.h>
#include "llm/model.h"
#include "worker-cpu/embed.h"

typedef struct sw_enc sw_enc;

/* Scratch for batches of max_batch tokens and for inputs of up to n_ctx
 * tokens: 1 <= n_ctx <= max_batch, and n_ctx at most the file's
 * context_length (BERT has no position past it). NULL + err when m is
 * not an encoder, a size is out of range, or memory runs out. */
sw_enc *sw_enc_new(const sw_model *m, int n_ctx, int max_batch, char *err, size_t errlen);
void sw_enc_free(sw_enc *e);
int sw_enc_n_ctx(const sw_enc *e);

/* Embeds in[0..n_in) into out (n_in x n_embd floats, input order). Returns
 * 0, or -1 with err filled: an input empty or longer than n_ctx, a token
 * out of the vocabulary. */
int sw_enc_embed(sw_enc *e, const sw_embed_input *in, int n_in, float *out, char *err, size_t errlen);

#endif
