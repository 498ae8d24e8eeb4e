/* Converting a GGUF model (any type llm/quant.c dequantizes) into the GPU
 * worker's FP8 layout. See weights.h. */
#include "worker-gpu/weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/quant.h"
#include "llm/util.h"

static bool matrix_alloc(sw_fp8_matrix *M, uint32_t rows, uint32_t cols)
{
    M->rows = rows;
    M->cols = cols;
    M->q = malloc((size_t)rows * cols);
    M->scale = malloc((size_t)rows * sizeof(float));
    return M->q && M->scale;
}

static void matrix_free(sw_fp8_matrix *M)
{
    free(M->q);
    free(M->scale);
    M->q = NULL;
    M->scale = NULL;
}

/* Quantizes the rows of a GGUF matrix into M starting at row `row0`. */
static bool convert_rows(const gguf_tensor *t, sw_fp8_matrix *M, uint32_t row0, char *err, size_t errlen)
{
    uint64_t cols = t->ne[0], rows = t->ne[1];
    size_t rs = sw_row_size(t->type, cols);
    if (cols != M->cols || row0 + rows > M->rows || rs == 0 || t->nbytes < rs * rows) {
        sw_errf(err, errlen, "tensor '%s': shape [%llu, %llu] does not fit the FP8 layout", t->name,
               (unsigned long long)cols, (unsigned long long)rows);
        return false;
    }
    int bad = 0;
#pragma omp parallel
    {
        float *buf = malloc(cols * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)rows; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rs;
            if (!buf || !sw_dequantize_row(t->type, src, buf, (int64_t)cols)) {
                bad = 1;
                continue;
            }
            size_t dr = row0 + (size_t)r;
            M->scale[dr] = sw_fp8_quantize_row(buf, cols, M->q + dr * cols);
        }
        free(buf);
    }
    if (bad) {
        sw_errf(err, errlen, "tensor '%s': cannot dequantize type %u", t->name, (unsigned)t->type);
        return false;
    }
    return true;
}

/* Vector t, n floats, into dst (which may be part of a stacked vector). */
static bool vector_into(const gguf_tensor *t, float *dst, uint32_t n, char *err, size_t errlen)
{
    if (t->ne[0] != n || !sw_dequantize_row(t->type, t->data, dst, n)) {
        sw_errf(err, errlen, "tensor '%s': cannot read as a float vector of %u", t->name, n);
        return false;
    }
    return true;
}

static float *vector_f32(const gguf_tensor *t, uint32_t n, char *err, size_t errlen)
{
    float *v = malloc(n * sizeof(float));
    if (!v) { sw_errf(err, errlen, "out of memory"); return NULL; }
    if (!vector_into(t, v, n, err, errlen)) { free(v); return NULL; }
    return v;
}

static const gguf_tensor *tensor(const sw_model *m, char *err, size_t errlen, const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t) sw_errf(err, errlen, "missing tensor '%s'", name);
    return t;
}

/* The biases and q/k norms of layer l, where the model has them. */
static bool layer_extras(const sw_model *m, const sw_layer *ML, sw_fp8_layer *L, const sw_fp8_weights *w, char *err,
                         size_t errlen)
{
    const uint32_t QD = w->q_dim, KVD = w->kv_dim, hd = m->hp.head_dim;
    if (ML->bq || ML->bk || ML->bv) {
        if (!(L->bqkv = calloc(QD + 2 * KVD, sizeof(float)))) { sw_errf(err, errlen, "out of memory"); return false; }
        if ((ML->bq && !vector_into(ML->bq, L->bqkv, QD, err, errlen)) ||
            (ML->bk && !vector_into(ML->bk, L->bqkv + QD, KVD, err, errlen)) ||
            (ML->bv && !vector_into(ML->bv, L->bqkv + QD + KVD, KVD, err, errlen)))
            return false;
    }
    if (ML->q_norm) {
        if (!(L->qk_norm = malloc(2 * hd * sizeof(float)))) { sw_errf(err, errlen, "out of memory"); return false; }
        if (!vector_into(ML->q_norm, L->qk_norm, hd, err, errlen) ||
            !vector_into(ML->k_norm, L->qk_norm + hd, hd, err, errlen))
            return false;
    }
    return true;
}

/* The CPU worker's table (sw_rope_freqs), so that both rotate alike. */
static void rope_table(sw_fp8_weights *w, const sw_model *m)
{
    sw_rope_freqs(&w->hp, m ? m->rope_freqs : NULL, false, w->rope_inv_freq);
}

static sw_fp8_weights *alloc_shapes(const sw_hparams *hp, char *err, size_t errlen)
{
    sw_fp8_weights *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->hp = *hp;
    w->embd_scale = 1.0f;
    w->q_dim = hp->n_head * hp->head_dim;
    w->kv_dim = hp->n_head_kv * hp->head_dim;
    uint32_t E = hp->n_embd, F = hp->n_ff;
    w->layers = calloc(hp->n_layer, sizeof *w->layers);
    w->rope_inv_freq = calloc(hp->n_rot / 2 + 1, sizeof(float));
    w->tok_embd = malloc((size_t)hp->n_vocab * E * sizeof(uint16_t));
    w->output_norm = malloc(E * sizeof(float));
    bool ok = w->layers && w->rope_inv_freq && w->tok_embd && w->output_norm &&
              matrix_alloc(&w->output, hp->n_vocab, E);
    for (uint32_t l = 0; ok && l < hp->n_layer; l++) {
        sw_fp8_layer *L = &w->layers[l];
        L->attn_norm = malloc(E * sizeof(float));
        L->ffn_norm = malloc(E * sizeof(float));
        ok = L->attn_norm && L->ffn_norm &&
             matrix_alloc(&L->wqkv, w->q_dim + 2 * w->kv_dim, E) &&
             matrix_alloc(&L->wo, E, w->q_dim) &&
             matrix_alloc(&L->wgu, 2 * F, E) &&
             matrix_alloc(&L->wdown, E, F);
    }
    if (!ok) {
        sw_errf(err, errlen, "out of host memory for the FP8 weights");
        sw_fp8_weights_free(w);
        return NULL;
    }
    uint64_t per_layer = (uint64_t)(w->q_dim + 2 * w->kv_dim) * E + (uint64_t)E * w->q_dim +
                         2ull * F * E + (uint64_t)E * F;
    w->fp8_bytes = per_layer * hp->n_layer + (uint64_t)hp->n_vocab * E * 3;
    return w;
}

/* Granite's multipliers other than the embedding's (which the kernels take):
 * the residual adds, the query scale and the logits' divisor. */
static bool granite_scales(const sw_hparams *hp)
{
    return hp->residual_scale != 1.0f || hp->logit_scale != 1.0f || hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim);
}

static bool nope_layers(const sw_model *m)
{
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        if (m->layers[l].no_rope) return true;
    return false;
}

/* What m uses that the GPU worker has no kernels for yet (Gemma 2 and 3's
 * additions, Granite's and SmolLM3's, mixtures of experts), or NULL. */
static const char *missing_feature(const sw_model *m)
{
    return m->hp.n_expert             ? "a mixture of experts"
           : m->hp.rope_yarn            ? "YaRN RoPE scaling"
           : m->rope_long               ? "LongRoPE scaling"
           : m->hp.rope_mscale != 1.0f  ? "a RoPE attention factor"
           : m->graph->post_norms       ? "post-attention and post-FFN norms"
           : m->hp.attn_softcap > 0.0f  ? "attention soft-capping"
           : m->hp.final_softcap > 0.0f ? "logit soft-capping"
           : m->hp.n_swa                ? "sliding-window attention"
           : granite_scales(&m->hp)     ? "residual, attention or logit scales (Granite)"
           : nope_layers(m)             ? "layers without RoPE (SmolLM3)"
           : m->layers[0].bo            ? "an attention output bias"
           : m->layers[0].sinks         ? "attention sinks"
                                        : NULL;
}

/* The embedding rows as BF16, dequantized a row at a time across threads. */
static bool convert_embedding(const sw_model *m, sw_fp8_weights *w, char *err, size_t errlen)
{
    const uint32_t E = m->hp.n_embd;
    const gguf_tensor *t = tensor(m, err, errlen, "token_embd.weight");
    if (!t) return false;
    size_t rs = sw_row_size(t->type, E);
    int bad = 0;
#pragma omp parallel
    {
        float *buf = malloc(E * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)m->hp.n_vocab; r++) {
            if (!buf || !sw_dequantize_row(t->type, (const uint8_t *)t->data + r * rs, buf, E)) {
                bad = 1;
                continue;
            }
            for (uint32_t c = 0; c < E; c++) w->tok_embd[(size_t)r * E + c] = sw_f32_to_bf16(buf[c]);
        }
        free(buf);
    }
    if (bad) { sw_errf(err, errlen, "token_embd.weight: cannot dequantize"); return false; }
    return true;
}

/* Layer l's matrices (q, k and v into one, gate and up into one), norms
 * and extras. */
static bool convert_layer(const sw_model *m, sw_fp8_weights *w, uint32_t l, char *err, size_t errlen)
{
    const uint32_t E = m->hp.n_embd;
    sw_fp8_layer *L = &w->layers[l];
    /* the model's own bindings, so fused files (attn_qkv) load too */
    const sw_layer *ML = &m->layers[l];
    const gguf_tensor *q = ML->wq, *k = ML->wk, *v = ML->wv, *o = ML->wo, *g = ML->w_gate, *u = ML->w_up,
                      *d = ML->w_down, *an = ML->attn_norm, *fn = ML->ffn_norm;
    if (!convert_rows(q, &L->wqkv, 0, err, errlen) ||
        !convert_rows(k, &L->wqkv, w->q_dim, err, errlen) ||
        !convert_rows(v, &L->wqkv, w->q_dim + w->kv_dim, err, errlen) ||
        !convert_rows(o, &L->wo, 0, err, errlen) ||
        !convert_rows(g, &L->wgu, 0, err, errlen) ||
        !convert_rows(u, &L->wgu, m->hp.n_ff, err, errlen) ||
        !convert_rows(d, &L->wdown, 0, err, errlen))
        return false;
    free(L->attn_norm);
    free(L->ffn_norm);
    L->attn_norm = L->ffn_norm = NULL;
    return (L->attn_norm = vector_f32(an, E, err, errlen)) && (L->ffn_norm = vector_f32(fn, E, err, errlen)) &&
           layer_extras(m, ML, L, w, err, errlen);
}

sw_fp8_weights *sw_fp8_weights_from_model(const sw_model *m, char *err, size_t errlen)
{
    /* The kernels pair NEOX dims (i, i + head_dim/2): rotary over all of each head. */
    if (m->hp.rope_neox && m->hp.n_rot != m->hp.head_dim) {
        sw_errf(err, errlen, "architecture '%s' rotates %u of %u head dims in NEOX order, which the GPU worker "
                "does not implement: serve it with spillway-worker-cpu", m->arch, m->hp.n_rot, m->hp.head_dim);
        return NULL;
    }
    const char *missing = missing_feature(m);
    if (missing) {
        sw_errf(err, errlen, "architecture '%s' uses %s, which the GPU worker does not implement: serve it with "
                "spillway-worker-cpu", m->arch, missing);
        return NULL;
    }
    sw_fp8_weights *w = alloc_shapes(&m->hp, err, errlen);
    if (!w) return NULL;
    const sw_hparams *hp = &m->hp;
    uint32_t E = hp->n_embd;
    const gguf_tensor *t;

    if (!convert_embedding(m, w, err, errlen)) goto fail;
    /* output.weight, or the embedding when the output is tied to it */
    if (!convert_rows(m->output, &w->output, 0, err, errlen)) goto fail;
    w->gelu = m->graph->gelu;
    w->embd_scale = m->hp.embd_scale;
    if (m->output_bias && !(w->output_bias = vector_f32(m->output_bias, hp->n_vocab, err, errlen))) goto fail;
    if (!(t = tensor(m, err, errlen, "output_norm.weight"))) goto fail;
    free(w->output_norm);
    if (!(w->output_norm = vector_f32(t, E, err, errlen))) goto fail;

    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (!convert_layer(m, w, l, err, errlen)) goto fail;
    rope_table(w, m);
    return w;
fail:
    sw_fp8_weights_free(w);
    return NULL;
}

static void random_matrix(sw_fp8_matrix *M, uint64_t seed)
{
    /* Random codes of magnitude < 2 with scale 1/sqrt(cols): outputs of
     * order one for a normalized input (the norms keep depth in check), so
     * logits are spread enough for top-1 comparisons between backends. The
     * values do not matter for timing, only that every byte is read. */
    float sc = 1.0f / sqrtf((float)M->cols);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)M->rows; r++) {
        uint64_t s = seed ^ ((uint64_t)r * 0x100000001B3ull);
        sw_fp8 *row = M->q + (size_t)r * M->cols;
        for (uint32_t c = 0; c < M->cols; c += 8) {
            uint64_t x = sw_splitmix64(&s);
            for (int b = 0; b < 8 && c + b < M->cols; b++) {
                uint8_t code = (uint8_t)(x >> (8 * b));
                row[c + b] = (sw_fp8)((code & 0x80) | (code & 0x3F)); /* |v| < 2: never NaN */
            }
        }
        M->scale[r] = sc;
    }
}

sw_fp8_weights *sw_fp8_weights_random(const sw_hparams *hp, uint64_t seed, char *err, size_t errlen)
{
    sw_fp8_weights *w = alloc_shapes(hp, err, errlen);
    if (!w) return NULL;
    uint32_t E = hp->n_embd;
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)hp->n_vocab * E; i++)
        w->tok_embd[i] = sw_f32_to_bf16(((int)(sw_splitmix64(&s) & 1023) - 512) / 512.0f);
    for (uint32_t c = 0; c < E; c++) w->output_norm[c] = 1.0f;
    random_matrix(&w->output, seed + 1);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        sw_fp8_layer *L = &w->layers[l];
        for (uint32_t c = 0; c < E; c++) L->attn_norm[c] = L->ffn_norm[c] = 1.0f;
        random_matrix(&L->wqkv, seed + 10 * l + 2);
        random_matrix(&L->wo, seed + 10 * l + 3);
        random_matrix(&L->wgu, seed + 10 * l + 4);
        random_matrix(&L->wdown, seed + 10 * l + 5);
    }
    rope_table(w, NULL);
    return w;
}

void sw_fp8_weights_drop_data(sw_fp8_weights *w)
{
    if (!w) return;
    free(w->tok_embd);
    w->tok_embd = NULL;
    matrix_free(&w->output);
    for (uint32_t l = 0; w->layers && l < w->hp.n_layer; l++) {
        sw_fp8_layer *L = &w->layers[l];
        matrix_free(&L->wqkv);
        matrix_free(&L->wo);
        matrix_free(&L->wgu);
        matrix_free(&L->wdown);
    }
}

void sw_fp8_weights_free(sw_fp8_weights *w)
{
    if (!w) return;
    sw_fp8_weights_drop_data(w);
    for (uint32_t l = 0; w->layers && l < w->hp.n_layer; l++) {
        free(w->layers[l].attn_norm);
        free(w->layers[l].ffn_norm);
        free(w->layers[l].bqkv);
        free(w->layers[l].qk_norm);
    }
    free(w->output_bias);
    free(w->layers);
    free(w->output_norm);
    free(w->rope_inv_freq);
    free(w);
}

void sw_hparams_8b(sw_hparams *hp, uint32_t n_layer)
{
    memset(hp, 0, sizeof *hp);
    hp->n_vocab = 128256;
    hp->n_embd = 4096;
    hp->n_layer = n_layer ? n_layer : 32;
    hp->n_head = 32;
    hp->n_head_kv = 8;
    hp->n_ff = 14336;
    hp->n_ctx_train = 8192;
    hp->head_dim = 128;
    hp->n_rot = 128;
    hp->rope_theta = 500000.0f;
    hp->rms_eps = 1e-5f;
}
