/* Embeddings over the forward pass (see embed.h). */
#include "worker-cpu/embed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llm/util.h"

bool sw_embed_wants_row(uint32_t pooling, int pos, int n)
{
    switch (pooling) {
    case SW_POOLING_CLS: return pos == 0;
    case SW_POOLING_LAST: return pos == n - 1;
    default: return true;   /* mean */
    }
}

void sw_embed_pool_row(float *acc, const float *row, int dim, uint32_t pooling, int pos, int n)
{
    if (pooling != SW_POOLING_MEAN) {
        if (sw_embed_wants_row(pooling, pos, n)) memcpy(acc, row, (size_t)dim * sizeof *acc);
        return;
    }
    for (int i = 0; i < dim; i++) acc[i] += row[i];
}

void sw_embed_pool_finish(float *acc, int dim, uint32_t pooling, int n)
{
    /* The mean's 1/n cancels in the normalization, but the division keeps
     * the sum's magnitude bounded before the squares are taken. */
    if (pooling == SW_POOLING_MEAN && n > 0)
        for (int i = 0; i < dim; i++) acc[i] /= (float)n;
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)acc[i] * acc[i];
    if (ss <= 0) return;
    float inv = (float)(1.0 / sqrt(ss));
    for (int i = 0; i < dim; i++) acc[i] *= inv;
}

/* Where each input of the group in flight stands. */
typedef struct {
    int input;     /* index into in[], or -1: the sequence is free */
    int next;      /* its next position to evaluate */
} seq_state;

/* One batch: tokens from the sequences in flight, in sequence order, up to
 * max tokens. Records each output row's input and position. Returns the
 * batch's size. */
static int fill_batch(const seq_state *st, int n_seq, const int *seqs, const sw_embed_input *in, uint32_t pooling,
                      sw_tok_in *batch, int max, int *row_in, int *row_pos)
{
    int nb = 0, nr = 0;
    for (int s = 0; s < n_seq && nb < max; s++) {
        if (st[s].input < 0) continue;
        const sw_embed_input *x = &in[st[s].input];
        for (int p = st[s].next; p < x->n && nb < max; p++) {
            bool want = sw_embed_wants_row(pooling, p, x->n);
            batch[nb++] = (sw_tok_in){ .token = x->toks[p], .pos = p, .seq = seqs[s], .logits = want };
            if (want) { row_in[nr] = st[s].input; row_pos[nr++] = p; }
        }
    }
    return nb;
}

/* Gives free sequences the next inputs; advances the others past the
 * tokens the last batch took (nb of them, in fill_batch's order). */
static void advance(seq_state *st, int n_seq, const sw_embed_input *in, int n_in, int *next_input, int nb)
{
    for (int s = 0; s < n_seq; s++) {
        if (st[s].input < 0) continue;
        int left = in[st[s].input].n - st[s].next, took = nb < left ? nb : left;
        st[s].next += took;
        nb -= took;
        if (st[s].next == in[st[s].input].n) st[s].input = -1;
    }
    for (int s = 0; s < n_seq && *next_input < n_in; s++)
        if (st[s].input < 0) st[s] = (seq_state){ .input = (*next_input)++, .next = 0 };
}

static int check_inputs(const sw_ctx *c, const sw_embed_input *in, int n_in, char *err, size_t errlen)
{
    for (int i = 0; i < n_in; i++) {
        if (in[i].n < 1) return sw_errf(err, errlen, "input %d is empty", i), -1;
        if (in[i].n > sw_ctx_n_ctx(c))
            return sw_errf(err, errlen, "input %d has %d tokens, more than the context of %d", i, in[i].n,
                           sw_ctx_n_ctx(c)), -1;
    }
    return 0;
}

typedef struct {
    sw_tok_in *batch;
    int *row_in, *row_pos;
    float *hidden;
    seq_state *st;
} embed_scratch;

static void scratch_free(embed_scratch *s)
{
    free(s->batch);
    free(s->row_in);
    free(s->row_pos);
    free(s->hidden);
    free(s->st);
}

static bool scratch_alloc(embed_scratch *s, int max, int dim, int n_seq)
{
    s->batch = malloc((size_t)max * sizeof *s->batch);
    s->row_in = malloc((size_t)max * sizeof *s->row_in);
    s->row_pos = malloc((size_t)max * sizeof *s->row_pos);
    s->hidden = malloc((size_t)max * dim * sizeof *s->hidden);
    s->st = malloc((size_t)n_seq * sizeof *s->st);
    return s->batch && s->row_in && s->row_pos && s->hidden && s->st;
}

int sw_embed_batch(sw_ctx *c, const int *seqs, int n_seq, const sw_embed_input *in, int n_in, float *out,
                   char *err, size_t errlen)
{
    const sw_model *m = sw_ctx_model(c);
    const int dim = (int)m->hp.n_embd, max = sw_ctx_max_batch(c);
    const uint32_t pooling = m->hp.pooling;
    if (check_inputs(c, in, n_in, err, errlen)) return -1;
    embed_scratch s = { 0 };
    if (n_seq < 1 || !scratch_alloc(&s, max, dim, n_seq)) {
        scratch_free(&s);
        return sw_errf(err, errlen, n_seq < 1 ? "no sequence to embed in" : "out of memory"), -1;
    }
    memset(out, 0, (size_t)n_in * dim * sizeof *out);
    for (int k = 0; k < n_seq; k++) s.st[k].input = -1;
    int next_input = 0, rc = 0;
    advance(s.st, n_seq, in, n_in, &next_input, 0);
    for (;;) {
        int nb = fill_batch(s.st, n_seq, seqs, in, pooling, s.batch, max, s.row_in, s.row_pos);
        if (nb == 0) break;
        if (sw_forward_hidden(c, s.batch, nb, s.hidden, err, errlen)) { rc = -1; break; }
        for (int t = 0, r = 0; t < nb; t++) {
            if (!s.batch[t].logits) continue;
            const sw_embed_input *x = &in[s.row_in[r]];
            sw_embed_pool_row(out + (size_t)s.row_in[r] * dim, s.hidden + (size_t)r * dim, dim, pooling,
                              s.row_pos[r], x->n);
            r++;
        }
        advance(s.st, n_seq, in, n_in, &next_input, nb);
    }
    for (int i = 0; rc == 0 && i < n_in; i++) sw_embed_pool_finish(out + (size_t)i * dim, dim, pooling, in[i].n);
    scratch_free(&s);
    return rc;
}

int sw_embed_tokenize(const sw_model *m, const char *text, int32_t **out, char *err, size_t errlen)
{
    size_t len = strlen(text);
    bool bos = sw_tok_add_bos(m->tok);
    int cap = (int)(len < (1u << 24) ? len + 8 : (1u << 24));
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? sw_tok_encode(m->tok, text, len, bos, false, ids, cap) : -1;
    if (ids && n < 0 && n != -1) {   /* the tokenizer says how many it needs */
        cap = -n;
        int32_t *p = realloc(ids, (size_t)cap * sizeof *ids);
        if (p) ids = p;
        n = p ? sw_tok_encode(m->tok, text, len, bos, false, ids, cap) : -1;
    }
    /* A file that asks for EOS after its inputs (Qwen3-Embedding: its last
     * pooling reads the EOS row) gets it, as llama.cpp's embedding does. */
    int32_t *p = n >= 0 && sw_tok_add_eos(m->tok) ? realloc(ids, ((size_t)n + 1) * sizeof *ids) : ids;
    if (n < 0 || !p) {
        free(ids);
        return sw_errf(err, errlen, "cannot tokenize the input (out of memory)"), -1;
    }
    ids = p;
    if (sw_tok_add_eos(m->tok)) ids[n++] = sw_tok_eos(m->tok);
    *out = ids;
    return n;
}
