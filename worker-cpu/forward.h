/* The Llama forward pass over a batch of tokens.
 *
 * One call evaluates any mix of tokens, each with its own sequence (KV cache)
 * and position. The same code therefore does prefill (many tokens of one
 * sequence) and batched decode (one token of many sequences): every weight
 * matrix is multiplied with all tokens of the batch at once, so a step reads
 * the weights once whatever the batch size.
 */
#ifndef SW_FORWARD_H
#define SW_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/model.h"
#include "worker-cpu/attention.h"

typedef struct {
    int32_t token;
    int32_t pos;      /* position in its sequence; KV entries 0..pos-1 must already be filled */
    int seq;          /* which KV cache, 0..n_seq-1 */
    bool logits;      /* produce this token's logits */
} sw_tok_in;

typedef struct sw_ctx sw_ctx;

/* n_seq KV caches of n_ctx positions each (IEEE half until
 * sw_ctx_set_kv_type; see attention.h),
 * scratch for batches of up to max_batch tokens. KV memory is only touched
 * as positions are used. */
sw_ctx *sw_ctx_new(const sw_model *m, int n_seq, int n_ctx, int max_batch, char *err, size_t errlen);
void sw_ctx_free(sw_ctx *c);
int sw_ctx_n_ctx(const sw_ctx *c);
const sw_model *sw_ctx_model(const sw_ctx *c);
/* The context length the model is run at, where it is not the one the
 * context was sized with (spillway-run sizes it to what one prompt needs):
 * LongRoPE files rotate with other frequencies past their original context.
 * sw_ctx_new sets it to its n_ctx. */
void sw_ctx_set_rope_context(sw_ctx *c, int n_ctx);
int sw_ctx_max_batch(const sw_ctx *c);

/* Precise mode: each quantized matmul also multiplies the activations'
 * quantization residual, giving float-activation accuracy at up to twice the
 * compute (weights are still read once). Off by default: serving uses the
 * single-quantization fast path. Returns -1 if scratch cannot be allocated. */
int sw_ctx_set_precise(sw_ctx *c, bool precise);

/* The KV cache's element type (attention.h): the cache is made anew, its
 * entries gone, so this is for a context not yet used. Returns -1 with err
 * filled, the context as it was, when the model's head size does not
 * allow q8_0 (a multiple of 32) or memory cannot be had. */
int sw_ctx_set_kv_type(sw_ctx *c, sw_kv_type t, char *err, size_t errlen);
sw_kv_type sw_ctx_kv_type(const sw_ctx *c);

/* Copies the KV entries of positions from..to-1 of sequence src to sequence
 * dst (all layers): a prompt prefix that another sequence already computed
 * costs a memory copy instead of a prefill. Sliding-window layers keep only
 * a ring of recent positions: of those, the window before `to` is copied,
 * which src must still hold (sw_ctx_can_resume). */
void sw_ctx_copy_kv(sw_ctx *c, int src, int dst, int from, int to);
/* Whether a sequence that has filed positions 0..held-1 can continue at
 * position `at` <= held from its cache: false when a sliding layer's ring
 * has already overwritten part of the window before `at` (then it must be
 * computed again from an earlier point, or from 0). Always true for models
 * without sliding layers. */
bool sw_ctx_can_resume(const sw_ctx *c, int held, int at);
/* Evaluates n tokens (n <= max_batch). For each token with .logits set, in
 * batch order, writes one row of n_vocab floats to logits_out. Returns 0, or
 * -1 with err filled when the batch is invalid (token/pos/seq out of range). */
int sw_forward(sw_ctx *c, const sw_tok_in *toks, int n, float *logits_out, char *err, size_t errlen);

/* The same batch, but for each token with .logits set, in batch order, one
 * row of n_embd floats: its final hidden state after the output norm (what
 * the output projection would multiply), for embeddings. */
int sw_forward_hidden(sw_ctx *c, const sw_tok_in *toks, int n, float *hidden_out, char *err, size_t errlen);

/* Bytes of weights the last sw_forward call read: every matrix, but of a
 * mixture of experts only the experts some token of the batch used. */
uint64_t sw_ctx_weight_bytes_read(const sw_ctx *c);
/* Bytes of the KV cache the last sw_forward call's attention read: each
 * token its own attended positions' K and V, in whole tiles of 32 slots. */
uint64_t sw_ctx_kv_bytes_read(const sw_ctx *c);

/* Weight multiply-adds of one sw_forward call over n tokens of which
 * n_logits want logits (the last layer and the output run only those; see
 * sw_forward). Attention, which is float work over the cache, not counted. */
double sw_forward_weight_macs(const sw_model *m, int n, int n_logits);

#endif
