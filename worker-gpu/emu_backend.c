/* The CPU emulation of the CUDA backend: same FP8 weights, same bf16
 * rounding points, same paged KV cache, same choice between the GEMV path
 * (bf16 activations) and the cuBLASLt path (per-token FP8 activations).
 * See backend.h for the numerics contract. Parallel with OpenMP. */
#include "worker-gpu/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/quant.h"

typedef struct {
    sw_fp8_weights *w;
    sw_backend *be;
    void *k_cache, *v_cache;  /* [layer][block][16][kv_dim], bf16 (uint16) or fp8 (uint8) */
    size_t elt;               /* bytes per cached element */
    /* scratch, sized for max_tokens_per_step */
    float *x, *h, *qkv, *att, *gu, *act, *tmp, *qact, *qscale, *wrow;
} emu;

static float bf(float x) { return sw_round_bf16(x); }

/* y[t][r] = sum_c W[r][c] x[t][c], with the GPU's activation handling. */
static void matmul(const sw_fp8_matrix *M, const float *x, int T, float *y, bool round_out,
                   float *qact, float *qscale)
{
    const float *lut = sw_fp8_table();
    const uint32_t R = M->rows, C = M->cols;
    const float *in = x;
    bool fp8_act = T > SW_GEMV_MAX_TOKENS;
    if (fp8_act) {
        /* per-token FP8: q = fp8(x / s_t), s_t = amax_t/448, stored decoded */
        for (int t = 0; t < T; t++)
            qscale[t] = sw_fp8_quantize_row(x + (size_t)t * C, C, (sw_fp8 *)(qact + (size_t)t * C));
        /* decode in place, back to front (bytes sit at the start of each row) */
        for (int t = 0; t < T; t++) {
            float *row = qact + (size_t)t * C;
            const sw_fp8 *qb = (const sw_fp8 *)row;
            for (int64_t c = (int64_t)C - 1; c >= 0; c--) row[c] = lut[qb[c]];
        }
        in = qact;
    }
#pragma omp parallel
    {
        float *wr = malloc(C * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)R; r++) {
            const sw_fp8 *q = M->q + (size_t)r * C;
            for (uint32_t c = 0; c < C; c++) wr[c] = lut[q[c]];
            for (int t = 0; t < T; t++) {
                const float *xt = in + (size_t)t * C;
                float acc = 0.0f;
                for (uint32_t c = 0; c < C; c++) acc += wr[c] * xt[c];
                float v = acc * M->scale[r];
                if (fp8_act) v *= qscale[t];
                y[(size_t)t * R + r] = round_out ? bf(v) : v;
            }
        }
        free(wr);
    }
}

static void rmsnorm(const float *x, const float *w, int T, uint32_t E, float eps, float *out)
{
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * E;
        float ss = 0.0f;
        for (uint32_t i = 0; i < E; i++) ss += xt[i] * xt[i];
        float inv = 1.0f / sqrtf(ss / (float)E + eps);
        for (uint32_t i = 0; i < E; i++) out[(size_t)t * E + i] = bf(xt[i] * inv * w[i]);
    }
}

/* Rotates pairs of the first n_rot dims of each head: adjacent (x[2i],
 * x[2i+1]) in Llama's layout, (x[i], x[i + n_rot/2]) in NEOX order. */
static void rope(float *v, int n_heads, uint32_t hd, uint32_t n_rot, int pos, const float *inv_freq, bool neox)
{
    const uint32_t half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float th = (float)pos * inv_freq[i];
            float c = cosf(th), s = sinf(th);
            uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            float a = x[i0], b = x[i1];
            x[i0] = bf(a * c - b * s);
            x[i1] = bf(a * s + b * c);
        }
    }
}

/* The q/k/v biases and per-head q/k norms of the architectures that have
 * them, on one token's q|k|v row, rounded to bf16 as the CUDA kernel
 * stores them. */
static void qkv_extras(const sw_fp8_layer *L, const sw_hparams *hp, float *qkv, uint32_t QKV)
{
    if (L->bqkv)
        for (uint32_t i = 0; i < QKV; i++) qkv[i] = bf(qkv[i] + L->bqkv[i]);
    if (L->qk_norm)   /* q heads, then k heads, are contiguous */
        for (uint32_t h = 0; h < hp->n_head + hp->n_head_kv; h++)
            rmsnorm(qkv + (size_t)h * hp->head_dim, L->qk_norm + (h < hp->n_head ? 0 : hp->head_dim), 1,
                    hp->head_dim, hp->rms_eps, qkv + (size_t)h * hp->head_dim);
}

static void kv_store(emu *e, void *cache, size_t off, const float *src, uint32_t n)
{
    if (e->be->kv_dtype == SW_KV_FP8) {
        sw_fp8 *d = (sw_fp8 *)cache + off;
        for (uint32_t i = 0; i < n; i++) d[i] = sw_fp8_from_f32(src[i]);
    } else {
        uint16_t *d = (uint16_t *)cache + off;
        for (uint32_t i = 0; i < n; i++) d[i] = sw_f32_to_bf16(src[i]);
    }
}

static float kv_load(const emu *e, const void *cache, size_t off)
{
    if (e->be->kv_dtype == SW_KV_FP8) return sw_fp8_table()[((const sw_fp8 *)cache)[off]];
    return sw_bf16_to_f32(((const uint16_t *)cache)[off]);
}

/* Offset of (layer, position slot) in a cache array. */
static size_t kv_off(const emu *e, uint32_t layer, int32_t block, int slot)
{
    size_t kvd = e->w->kv_dim;
    return (((size_t)layer * e->be->n_kv_blocks + (size_t)block) * SW_KV_BLOCK + slot) * kvd;
}

static void attention(emu *e, uint32_t layer, const sw_batch *b)
{
    const sw_hparams *hp = &e->w->hp;
    const uint32_t hd = hp->head_dim, QD = e->w->q_dim, KVD = e->w->kv_dim;
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const float inv_sqrt = 1.0f / sqrtf((float)hd);
    const int T = b->n_tokens;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < (int)hp->n_head; h++) {
            const float *q = e->qkv + (size_t)t * (QD + 2 * KVD) + (size_t)h * hd;
            const int32_t *table = b->block_table + (size_t)b->seq[t] * b->max_blocks;
            int n = b->pos[t] + 1;
            uint32_t kvh = (uint32_t)h / group;
            float *sc = malloc((size_t)n * sizeof(float));
            float mx = -INFINITY;
            for (int p = 0; p < n; p++) {
                size_t off = kv_off(e, layer, table[p / SW_KV_BLOCK], p % SW_KV_BLOCK) + (size_t)kvh * hd;
                float s = 0.0f;
                for (uint32_t i = 0; i < hd; i++) s += q[i] * kv_load(e, e->k_cache, off + i);
                sc[p] = s * inv_sqrt;
                if (sc[p] > mx) mx = sc[p];
            }
            float sum = 0.0f;
            for (int p = 0; p < n; p++) { sc[p] = expf(sc[p] - mx); sum += sc[p]; }
            float *o = e->att + (size_t)t * QD + (size_t)h * hd;
            for (uint32_t i = 0; i < hd; i++) o[i] = 0.0f;
            for (int p = 0; p < n; p++) {
                size_t off = kv_off(e, layer, table[p / SW_KV_BLOCK], p % SW_KV_BLOCK) + (size_t)kvh * hd;
                float wgt = sc[p] / sum;
                for (uint32_t i = 0; i < hd; i++) o[i] += wgt * kv_load(e, e->v_cache, off + i);
            }
            for (uint32_t i = 0; i < hd; i++) o[i] = bf(o[i]);
            free(sc);
        }
    }
}

static int emu_forward(void *impl, const sw_batch *b, float *logits, char *err, size_t errlen)
{
    emu *e = impl;
    if (sw_batch_validate(e->be, b, err, errlen)) return -1;
    const sw_fp8_weights *w = e->w;
    const sw_hparams *hp = &w->hp;
    const int T = b->n_tokens;
    const uint32_t E = hp->n_embd, QD = w->q_dim, KVD = w->kv_dim, F = hp->n_ff, QKV = QD + 2 * KVD;

    for (int t = 0; t < T; t++)
        for (uint32_t i = 0; i < E; i++)
            e->x[(size_t)t * E + i] = sw_bf16_to_f32(w->tok_embd[(size_t)b->tokens[t] * E + i]) * w->embd_scale;

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const sw_fp8_layer *L = &w->layers[l];
        rmsnorm(e->x, L->attn_norm, T, E, hp->rms_eps, e->h);
        matmul(&L->wqkv, e->h, T, e->qkv, true, e->qact, e->qscale);
        for (int t = 0; t < T; t++) {
            float *q = e->qkv + (size_t)t * QKV, *k = q + QD, *v = k + KVD;
            qkv_extras(L, hp, q, QKV);
            rope(q, (int)hp->n_head, hp->head_dim, hp->n_rot, b->pos[t], w->rope_inv_freq, hp->rope_neox);
            rope(k, (int)hp->n_head_kv, hp->head_dim, hp->n_rot, b->pos[t], w->rope_inv_freq, hp->rope_neox);
            int32_t blk = b->block_table[(size_t)b->seq[t] * b->max_blocks + b->pos[t] / SW_KV_BLOCK];
            size_t off = kv_off(e, l, blk, b->pos[t] % SW_KV_BLOCK);
            kv_store(e, e->k_cache, off, k, KVD);
            kv_store(e, e->v_cache, off, v, KVD);
        }
        attention(e, l, b);
        matmul(&L->wo, e->att, T, e->tmp, true, e->qact, e->qscale);
        for (size_t i = 0; i < (size_t)T * E; i++) e->x[i] += e->tmp[i];

        rmsnorm(e->x, L->ffn_norm, T, E, hp->rms_eps, e->h);
        matmul(&L->wgu, e->h, T, e->gu, true, e->qact, e->qscale);
        for (int t = 0; t < T; t++) {
            const float *g = e->gu + (size_t)t * 2 * F, *u = g + F;
            for (uint32_t i = 0; i < F; i++)
                e->act[(size_t)t * F + i] = bf(sw_gate_act(g[i], w->gelu) * u[i]);
        }
        matmul(&L->wdown, e->act, T, e->tmp, true, e->qact, e->qscale);
        for (size_t i = 0; i < (size_t)T * E; i++) e->x[i] += e->tmp[i];
    }
    if (b->n_logits == 0) return 0;
    /* final norm and output projection only for the rows that want logits */
    for (int i = 0; i < b->n_logits; i++)
        memcpy(e->tmp + (size_t)i * E, e->x + (size_t)b->logits_idx[i] * E, E * sizeof(float));
    rmsnorm(e->tmp, w->output_norm, b->n_logits, E, hp->rms_eps, e->h);
    matmul(&w->output, e->h, b->n_logits, logits, false, e->qact, e->qscale);
    if (w->output_bias)
        for (int i = 0; i < b->n_logits; i++)
            for (uint32_t v = 0; v < hp->n_vocab; v++) logits[(size_t)i * hp->n_vocab + v] += w->output_bias[v];
    return 0;
}

static void emu_destroy(void *impl)
{
    emu *e = impl;
    if (!e) return;
    sw_fp8_weights_free(e->w);
    free(e->k_cache); free(e->v_cache);
    free(e->x); free(e->h); free(e->qkv); free(e->att); free(e->gu); free(e->act);
    free(e->tmp); free(e->qact); free(e->qscale); free(e->wrow);
    free(e);
}

static const sw_backend_ops emu_ops = {
    .name = "emulate",
    .forward = emu_forward,
    .forward_sample = NULL,
    .destroy = emu_destroy,
};

sw_backend *sw_emu_backend_new(sw_fp8_weights *w, uint32_t n_kv_blocks, sw_kv_dtype kv,
                               int max_tokens_per_step, char *err, size_t errlen)
{
    const sw_hparams *hp = &w->hp;
    if (max_tokens_per_step <= 0) max_tokens_per_step = 256;
    if (n_kv_blocks == 0) {
        uint32_t ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
        n_kv_blocks = 8 * ((ctx + SW_KV_BLOCK - 1) / SW_KV_BLOCK);
    }
    sw_backend *be = calloc(1, sizeof *be);
    emu *e = calloc(1, sizeof *e);
    if (!be || !e) { free(be); free(e); snprintf(err, errlen, "out of memory"); sw_fp8_weights_free(w); return NULL; }
    be->ops = &emu_ops;
    be->impl = e;
    be->hp = *hp;
    be->n_kv_blocks = n_kv_blocks;
    be->kv_dtype = kv;
    be->max_tokens_per_step = max_tokens_per_step;
    e->w = w;
    e->be = be;
    e->elt = kv == SW_KV_FP8 ? 1 : 2;
    size_t cache = (size_t)hp->n_layer * n_kv_blocks * SW_KV_BLOCK * w->kv_dim * e->elt;
    size_t T = (size_t)max_tokens_per_step;
    uint32_t E = hp->n_embd, QKV = w->q_dim + 2 * w->kv_dim, F = hp->n_ff;
    size_t widest = E > w->q_dim ? E : w->q_dim;
    if (F > widest) widest = F;
    e->k_cache = calloc(1, cache);
    e->v_cache = calloc(1, cache);
    e->x = malloc(T * E * sizeof(float));
    e->h = malloc(T * E * sizeof(float));
    e->qkv = malloc(T * QKV * sizeof(float));
    e->att = malloc(T * w->q_dim * sizeof(float));
    e->gu = malloc(T * 2 * F * sizeof(float));
    e->act = malloc(T * F * sizeof(float));
    e->tmp = malloc(T * widest * sizeof(float));
    e->qact = malloc(T * widest * sizeof(float));
    e->qscale = malloc(T * sizeof(float));
    if (!e->k_cache || !e->v_cache || !e->x || !e->h || !e->qkv || !e->att || !e->gu || !e->act ||
        !e->tmp || !e->qact || !e->qscale) {
        snprintf(err, errlen, "out of memory for the KV cache (%u blocks, %zu MiB) or scratch",
                 n_kv_blocks, 2 * cache >> 20);
        sw_backend_free(be);
        return NULL;
    }
    return be;
}
