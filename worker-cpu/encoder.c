/* The BERT-family encoder, batched: read top to bottom, one block at a
 * time, for all tokens of the batch together (see encoder.h for the math).
 *
 *   x = embed(token, type 0, position), LayerNorm
 *   per block:  q, k, v = W x + b  (nomic-bert: rope(q), rope(k))
 *               x = LayerNorm(x + Wo * softmax(q k^T / sqrt(d)) v + bo)    within each input
 *               x = LayerNorm(x + Wdown * act(x) + b_down)
 *   pool each input's rows, L2-normalize
 *
 * Matrices go through the kernels with all tokens of the batch at once
 * (packed where the CPU has a faster form, as forward.c does); attention is
 * parallel over (token, head) with OpenMP, each token over the rows of its
 * own input only.
 */
#include "worker-cpu/encoder.h"
#include "worker-cpu/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "llm/util.h"

/* A block's matrices, in the order pk[] holds their packed copies. */
enum { M_Q, M_K, M_V, M_O, M_UP, M_GATE, M_DOWN, N_MAT };

/* A block's vectors as floats (NULL where the file has none). */
typedef struct {
    float *bq, *bk, *bv, *bo, *b_up, *b_down;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;   /* attn_output_norm, layer_output_norm */
} enc_vecs;

struct sw_enc {
    const sw_model *m;
    int n_ctx, max_batch, q_dim, threads;
    bool nomic;
    enc_vecs *vec;                 /* [n_layer] */
    sw_packed **pk;                /* [n_layer][N_MAT], NULL where not packed */
    float *type0;                  /* token type 0's embedding [n_embd], or NULL */
    float *embd_w, *embd_b;        /* the embeddings' LayerNorm */
    float *inv_freq;               /* nomic-bert: [n_rot/2] RoPE frequencies */
    /* scratch, sized for max_batch tokens */
    float *x;                      /* [B][n_embd] residual stream */
    float *xb;                     /* [B][max(n_embd, q_dim)] attention output */
    float *xb2;                    /* [B][n_embd] a block's output */
    float *q, *k, *v;              /* [B][q_dim] */
    float *hb, *hb2;               /* [B][n_ff] */
    float *att;                    /* [threads][n_ctx] scores */
    int32_t *toks;                 /* [B] the batch's tokens */
    int *pos, *row_start, *row_len;  /* [B]: each row's position, its input's first row and length */
};

/* ---- row helpers ---- */

/* out = (x - mean) / sqrt(var + eps) * w + b over n values. */
SW_CLONES static void layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps)
{
    double s = 0.0, ss = 0.0;
    for (int i = 0; i < n; i++) s += x[i];
    const double mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    const float inv = (float)(1.0 / sqrt(ss / n + eps)), mf = (float)mean;
#pragma omp simd
    for (int i = 0; i < n; i++) out[i] = (x[i] - mf) * inv * w[i] + b[i];
}

/* x = LayerNorm(x + d) for n rows: a block's output into the stream. */
static void add_norm_rows(float *x, const float *d, int n, int dim, const float *w, const float *b, float eps)
{
#pragma omp parallel for if (n > 8)
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * dim;
        const float *dr = d + (size_t)t * dim;
        for (int i = 0; i < dim; i++) xr[i] += dr[i];
        layernorm(xr, xr, w, b, dim, eps);
    }
}

/* x[t] += b for each of n rows (b may be NULL: no bias). */
static void add_bias(float *x, const float *b, int n, int dim)
{
    for (int t = 0; b && t < n; t++) {
        float *xr = x + (size_t)t * dim;
        for (int i = 0; i < dim; i++) xr[i] += b[i];
    }
}

/* GELU, exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). */
static void gelu_rows(float *h, size_t n)
{
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) h[i] = 0.5f * h[i] * (1.0f + erff(h[i] * 0.70710678f));
}

/* g = silu(g) * u: the SwiGLU gate. */
static void swiglu_rows(float *g, const float *u, size_t n)
{
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* NEOX RoPE of one row's heads at position pos: pairs (i, i + n_rot/2). */
static void rope_row(float *x, int n_heads, int head_dim, int n_rot, int pos, const float *inv_freq)
{
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const float th = (float)pos * inv_freq[i], c = cosf(th), s = sinf(th);
        for (int h = 0; h < n_heads; h++) {
            float *p = x + (size_t)h * head_dim, a = p[i], b = p[i + half];
            p[i] = a * c - b * s;
            p[i + half] = a * s + b * c;
        }
    }
}

/* ---- context ---- */

static float *falloc(size_t n)
{
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* A 1-D tensor (or row 0 of a matrix) as floats; NULL for NULL. *ok
 * turns false when memory runs out. */
static float *floats(const gguf_tensor *t, bool *ok)
{
    if (!t) return NULL;
    float *f = falloc(t->ne[0]);
    if (!f || !sw_dequantize_row(t->type, t->data, f, (int64_t)t->ne[0])) {
        free(f);
        *ok = false;
        return NULL;
    }
    return f;
}

static const gguf_tensor *matrix(const sw_layer *L, int k)
{
    const gguf_tensor *const ms[N_MAT] = {L->wq, L->wk, L->wv, L->wo, L->w_up, L->w_gate, L->w_down};
    return ms[k];
}

/* The float vectors and the packed matrices of every block. */
static bool load_layers(sw_enc *e)
{
    const sw_model *m = e->m;
    const uint32_t nl = m->hp.n_layer;
    bool ok = (e->vec = calloc(nl, sizeof *e->vec)) && (e->pk = calloc((size_t)nl * N_MAT, sizeof *e->pk));
    for (uint32_t l = 0; ok && l < nl; l++) {
        const sw_layer *L = &m->layers[l];
        enc_vecs *v = &e->vec[l];
        v->bq = floats(L->bq, &ok), v->bk = floats(L->bk, &ok), v->bv = floats(L->bv, &ok);
        v->bo = floats(L->bo, &ok), v->b_up = floats(L->b_up, &ok), v->b_down = floats(L->b_down, &ok);
        v->ln1_w = floats(L->attn_out_norm, &ok), v->ln1_b = floats(L->attn_out_norm_b, &ok);
        v->ln2_w = floats(L->out_norm, &ok), v->ln2_b = floats(L->out_norm_b, &ok);
        for (int k = 0; k < N_MAT; k++)
            if (matrix(L, k)) e->pk[l * N_MAT + k] = sw_pack_tensor(matrix(L, k));   /* NULL: unpacked */
    }
    return ok;
}

static bool alloc_scratch(sw_enc *e)
{
    const sw_hparams *hp = &e->m->hp;
    const size_t B = (size_t)e->max_batch, E = hp->n_embd, Q = (size_t)e->q_dim, F = hp->n_ff;
    e->threads = omp_get_max_threads();
    e->x = falloc(B * E);
    e->xb = falloc(B * (E > Q ? E : Q));
    e->xb2 = falloc(B * E);
    e->q = falloc(B * Q), e->k = falloc(B * Q), e->v = falloc(B * Q);
    e->hb = falloc(B * F);
    e->hb2 = e->nomic ? falloc(B * F) : NULL;
    e->att = falloc((size_t)e->threads * e->n_ctx);
    e->toks = malloc(B * sizeof *e->toks);
    e->pos = malloc(B * sizeof *e->pos);
    e->row_start = malloc(B * sizeof *e->row_start);
    e->row_len = malloc(B * sizeof *e->row_len);
    return e->x && e->xb && e->xb2 && e->q && e->k && e->v && e->hb && (e->hb2 || !e->nomic) && e->att &&
           e->toks && e->pos && e->row_start && e->row_len;
}

static bool check_sizes(const sw_model *m, int n_ctx, int max_batch, char *err, size_t errlen)
{
    if (!sw_model_is_encoder(m)) return sw_errf(err, errlen, "%s is not an encoder", m->arch), false;
    if (n_ctx < 1 || (uint32_t)n_ctx > m->hp.n_ctx_train)
        return sw_errf(err, errlen, "context %d out of range: the encoder has %u positions", n_ctx,
                       m->hp.n_ctx_train), false;
    if (max_batch < n_ctx || max_batch > (1 << 16))
        return sw_errf(err, errlen, "batch of %d tokens out of range (%d..65536: an input is computed whole)",
                       max_batch, n_ctx), false;
    return true;
}

sw_enc *sw_enc_new(const sw_model *m, int n_ctx, int max_batch, char *err, size_t errlen)
{
    if (!check_sizes(m, n_ctx, max_batch, err, errlen)) return NULL;
    const sw_hparams *hp = &m->hp;
    sw_enc *e = calloc(1, sizeof *e);
    if (!e) return sw_errf(err, errlen, "out of memory"), NULL;
    e->m = m;
    e->n_ctx = n_ctx;
    e->max_batch = max_batch;
    e->q_dim = (int)(hp->n_head * hp->head_dim);
    e->nomic = m->graph->encoder == SW_ENC_NOMIC;
    bool ok = true;
    e->type0 = floats(m->token_types, &ok);
    e->embd_w = floats(m->embd_norm, &ok);
    e->embd_b = floats(m->embd_norm_b, &ok);
    if (ok && e->nomic && (ok = (e->inv_freq = falloc(hp->n_rot / 2)) != NULL))
        sw_rope_freqs(hp, NULL, false, e->inv_freq);
    if (!ok || !load_layers(e) || !alloc_scratch(e)) {
        sw_errf(err, errlen, "out of memory for batches of %d tokens", max_batch);
        sw_enc_free(e);
        return NULL;
    }
    return e;
}

void sw_enc_free(sw_enc *e)
{
    if (!e) return;
    for (uint32_t l = 0; e->vec && l < e->m->hp.n_layer; l++) {
        enc_vecs *v = &e->vec[l];
        float *const fs[] = {v->bq, v->bk, v->bv, v->bo, v->b_up, v->b_down, v->ln1_w, v->ln1_b, v->ln2_w, v->ln2_b};
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
    }
    for (size_t i = 0; e->pk && i < (size_t)e->m->hp.n_layer * N_MAT; i++) sw_packed_free(e->pk[i]);
    free(e->vec);
    free(e->pk);
    float *const fs[] = {e->type0, e->embd_w, e->embd_b, e->inv_freq, e->x, e->xb, e->xb2,
                         e->q, e->k, e->v, e->hb, e->hb2, e->att};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
    free(e->toks);
    free(e->pos);
    free(e->row_start);
    free(e->row_len);
    free(e);
}

int sw_enc_n_ctx(const sw_enc *e) { return e->n_ctx; }

/* ---- the pass ---- */

static void matmul(const sw_enc *e, uint32_t l, int k, const float *x, int n, float *y)
{
    const sw_packed *p = e->pk[l * N_MAT + k];
    if (p) sw_matmul_packed(p, x, n, y);
    else sw_matmul_tensor(matrix(&e->m->layers[l], k), x, n, y);
}

/* x = the batch's n rows embedded: token, type 0 and position (bert),
 * LayerNorm'ed. pos[t]: row t's position in its input. */
static void embed_rows(sw_enc *e, const int32_t *toks, const int *pos, int n)
{
    const sw_model *m = e->m;
    const int E = (int)m->hp.n_embd;
#pragma omp parallel for if (n > 8)
    for (int t = 0; t < n; t++) {
        float *x = e->x + (size_t)t * E, *row = e->xb + (size_t)t * E;   /* xb: free until attention */
        sw_get_row(m->token_embd, toks[t], x);
        if (e->type0) for (int i = 0; i < E; i++) x[i] += e->type0[i];
        if (m->pos_embd) {
            sw_get_row(m->pos_embd, pos[t], row);
            for (int i = 0; i < E; i++) x[i] += row[i];
        }
        layernorm(x, x, e->embd_w, e->embd_b, E, m->hp.norm_eps);
    }
}

/* One query row's head h: softmax(q k^T * scale) v over the rows of its
 * input (those from row_start, row_len of them) into out[head_dim]. */
static void attend_one(const sw_enc *e, int t, int h, float *s, float *out)
{
    const int D = (int)e->m->hp.head_dim, QD = e->q_dim, r0 = e->row_start[t], n = e->row_len[t];
    const float *q = e->q + (size_t)t * QD + (size_t)h * D, scale = e->m->hp.attn_scale;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *k = e->k + (size_t)(r0 + j) * QD + (size_t)h * D;
        float d = 0.0f;
#pragma omp simd reduction(+:d)
        for (int i = 0; i < D; i++) d += q[i] * k[i];
        s[j] = d * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += (s[j] = expf(s[j] - mx));
    const float inv = (float)(1.0 / sum);
    memset(out, 0, (size_t)D * sizeof *out);
    for (int j = 0; j < n; j++) {
        const float *v = e->v + (size_t)(r0 + j) * QD + (size_t)h * D, p = s[j] * inv;
#pragma omp simd
        for (int i = 0; i < D; i++) out[i] += p * v[i];
    }
}

/* xb = attention of every row and head of the batch. */
static void attention(sw_enc *e, int n)
{
    const int H = (int)e->m->hp.n_head, D = (int)e->m->hp.head_dim;
#pragma omp parallel for schedule(dynamic, 4) num_threads(e->threads)   /* att has a row per thread */
    for (int w = 0; w < n * H; w++) {
        const int t = w / H, h = w % H;
        float *s = e->att + (size_t)omp_get_thread_num() * e->n_ctx;
        attend_one(e, t, h, s, e->xb + (size_t)t * e->q_dim + (size_t)h * D);
    }
}

static void attention_block(sw_enc *e, uint32_t l, const int *pos, int n)
{
    const sw_hparams *hp = &e->m->hp;
    const enc_vecs *v = &e->vec[l];
    const int E = (int)hp->n_embd, QD = e->q_dim;
    matmul(e, l, M_Q, e->x, n, e->q);
    matmul(e, l, M_K, e->x, n, e->k);
    matmul(e, l, M_V, e->x, n, e->v);
    add_bias(e->q, v->bq, n, QD);
    add_bias(e->k, v->bk, n, QD);
    add_bias(e->v, v->bv, n, QD);
    for (int t = 0; e->nomic && t < n; t++) {
        rope_row(e->q + (size_t)t * QD, (int)hp->n_head, (int)hp->head_dim, (int)hp->n_rot, pos[t], e->inv_freq);
        rope_row(e->k + (size_t)t * QD, (int)hp->n_head, (int)hp->head_dim, (int)hp->n_rot, pos[t], e->inv_freq);
    }
    attention(e, n);
    matmul(e, l, M_O, e->xb, n, e->xb2);
    add_bias(e->xb2, v->bo, n, E);
    add_norm_rows(e->x, e->xb2, n, E, v->ln1_w, v->ln1_b, hp->norm_eps);
}

static void ffn_block(sw_enc *e, uint32_t l, int n)
{
    const sw_hparams *hp = &e->m->hp;
    const enc_vecs *v = &e->vec[l];
    const int E = (int)hp->n_embd, F = (int)hp->n_ff;
    matmul(e, l, M_UP, e->x, n, e->hb);
    add_bias(e->hb, v->b_up, n, F);
    float *act = e->hb;
    if (e->nomic) {
        matmul(e, l, M_GATE, e->x, n, e->hb2);
        swiglu_rows(e->hb2, e->hb, (size_t)n * F);
        act = e->hb2;
    } else {
        gelu_rows(e->hb, (size_t)n * F);
    }
    matmul(e, l, M_DOWN, act, n, e->xb2);
    add_bias(e->xb2, v->b_down, n, E);
    add_norm_rows(e->x, e->xb2, n, E, v->ln2_w, v->ln2_b, hp->norm_eps);
}

/* The inputs' tokens laid out as rows (toks, pos, and each row's input's
 * first row and length), then the pass, then each input's pooled vector. */
static void run_batch(sw_enc *e, const sw_embed_input *in, int n_in, float *out)
{
    const int E = (int)e->m->hp.n_embd;
    const uint32_t pooling = e->m->hp.pooling;
    int32_t *toks = e->toks;
    int *pos = e->pos, n = 0;
    for (int i = 0; i < n_in; i++)
        for (int p = 0, r0 = n; p < in[i].n; p++, n++) {
            toks[n] = in[i].toks[p];
            pos[n] = p;
            e->row_start[n] = r0;
            e->row_len[n] = in[i].n;
        }
    embed_rows(e, toks, pos, n);
    for (uint32_t l = 0; l < e->m->hp.n_layer; l++) {
        attention_block(e, l, pos, n);
        ffn_block(e, l, n);
    }
    memset(out, 0, (size_t)n_in * E * sizeof *out);
    for (int t = 0, i = -1; t < n; t++) {
        i += pos[t] == 0;
        sw_embed_pool_row(out + (size_t)i * E, e->x + (size_t)t * E, E, pooling, pos[t], in[i].n);
    }
    for (int i = 0; i < n_in; i++) sw_embed_pool_finish(out + (size_t)i * E, E, pooling, in[i].n);
}

static int check_inputs(const sw_enc *e, const sw_embed_input *in, int n_in, char *err, size_t errlen)
{
    const int32_t V = (int32_t)e->m->hp.n_vocab;
    for (int i = 0; i < n_in; i++) {
        if (in[i].n < 1) return sw_errf(err, errlen, "input %d is empty", i), -1;
        if (in[i].n > e->n_ctx)
            return sw_errf(err, errlen, "input %d has %d tokens, more than the encoder's context of %d", i, in[i].n,
                           e->n_ctx), -1;
        for (int p = 0; p < in[i].n; p++)
            if (in[i].toks[p] < 0 || in[i].toks[p] >= V)
                return sw_errf(err, errlen, "input %d: token id %d is not in the vocabulary (%d)", i, in[i].toks[p],
                               V), -1;
    }
    return 0;
}

int sw_enc_embed(sw_enc *e, const sw_embed_input *in, int n_in, float *out, char *err, size_t errlen)
{
    if (check_inputs(e, in, n_in, err, errlen)) return -1;
    const size_t E = e->m->hp.n_embd;
    for (int i = 0; i < n_in;) {
        int j = i, rows = 0;
        while (j < n_in && rows + in[j].n <= e->max_batch) rows += in[j++].n;
        run_batch(e, in + i, j - i, out + (size_t)i * E);
        i = j;
    }
    return 0;
}
