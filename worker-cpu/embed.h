/* Embeddings from an embedding model (a decoder whose GGUF declares a
 * pooling type, sw_model_is_embedding): each input's final hidden states,
 * after the output norm, pooled the way the file says (mean, first token,
 * last token) and L2-normalized.
 *
 * Beside generation, on the same forward pass (sw_forward_hidden): the
 * inputs of one call run as batches of many inputs' tokens at once, each
 * input in its own KV sequence, so the weights are read once a batch
 * however many inputs there are. No protobuf here: the engine (engine.c)
 * turns the wire's request into sw_embed_input.
 *
 * A BERT-family encoder is another graph (encoder.h, sw_enc_embed); it
 * shares the pooling below and sw_embed_tokenize.
 */
#ifndef SW_CPU_EMBED_H
#define SW_CPU_EMBED_H

#include <stdint.h>
#include <stddef.h>
#include "worker-cpu/forward.h"

typedef struct {
    const int32_t *toks;
    int n;                 /* at least 1 */
} sw_embed_input;

/* Pooling, one hidden row at a time (so a long input never needs all its
 * rows at once). acc is the input's n_embd floats, zeroed before its first
 * row; row is its hidden state at position pos of an input of n tokens. */
void sw_embed_pool_row(float *acc, const float *row, int dim, uint32_t pooling, int pos, int n);
/* After the last row: the mean's division, then L2 normalization (a zero
 * vector stays zero). */
void sw_embed_pool_finish(float *acc, int dim, uint32_t pooling, int n);

/* Which tokens of an input the pooling reads: all of them (mean) or one. */
bool sw_embed_wants_row(uint32_t pooling, int pos, int n);

/* Embeds in[0..n_in) into out (n_in x n_embd floats, input order), using
 * the KV sequences seqs[0..n_seq) of c (their contents are overwritten).
 * Inputs are packed into batches of up to sw_ctx_max_batch tokens, at most
 * n_seq inputs in flight; an input longer than a batch continues in the
 * next. Returns 0, or -1 with err filled: a token out of the vocabulary,
 * an input longer than c's context, out of memory. */
int sw_embed_batch(sw_ctx *c, const int *seqs, int n_seq, const sw_embed_input *in, int n_in, float *out,
                   char *err, size_t errlen);

/* Tokenizes text as the model's prompts are (its BOS when it adds one,
 * special tokens not parsed: user text), with its EOS after when the file
 * says to add one. Returns the count, with *out
 * malloc'd; -1 with err filled. */
int sw_embed_tokenize(const sw_model *m, const char *text, int32_t **out, char *err, size_t errlen);

#endif
