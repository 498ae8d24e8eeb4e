/* Llama forward pass, batched: read top to bottom, one transformer block at a
 * time, for all tokens of the batch together.
 *
 *   x = embed(token)
 *   per layer:  x += Wo * attention(rope(Wq*norm(x)), rope(Wk*norm(x)), Wv*norm(x))
 *               x += Wdown * (silu(Wgate*norm(x)) * Wup*norm(x))
 *   logits = Wout * norm(x)
 *
 * The other architectures' differences (llm/model.h, sw_arch) are switches
 * along the way: biases, q/k norms, GELU, scaled embeddings, Gemma 2/3's
 * post-norms, soft-caps and sliding-window layers, and a mixture of experts
 * in place of the FFN (each token through the few experts its router picks).
 *
 * Matrices go through sw_matmul_tensor with all tokens at once (weights read
 * once per step); attention is parallel over (token, head) with OpenMP. The
 * last layer runs past K and V only for the tokens that want logits.
 */
#include "worker-cpu/forward.h"
#include "worker-cpu/attention.h"
#include "llm/util.h"
#include "worker-cpu/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

struct sw_ctx {
    const sw_model *m;
    int n_seq, n_ctx, max_batch;
    int kv_dim, q_dim;
    /* KV cache per sequence, layer and KV head, in halves or q8_0
     * (kv_type): K transposed in blocks of 32 slots (sw_attn_k_at), V as
     * [slots][head_dim]. See attention.h. A layer holds ctx_pad slots, one
     * per position, except a sliding layer, which only ever reads its
     * window: it keeps a ring of `ring` slots, position p in slot p % ring,
     * enough for the window and one batch of new positions (see
     * sw_ctx_new). */
    int ctx_pad;              /* n_ctx rounded up to the score tile (32) */
    int ring;                 /* slots of a sliding layer (a multiple of 32; ctx_pad when no ring pays) */
    int *kv_slots;            /* [n_layer]: ctx_pad or ring */
    size_t *layer_off;        /* [n_layer]: where a layer's entries start in a sequence's */
    size_t seq_stride;        /* elements per sequence: all layers' n_head_kv * head_dim * slots */
    sw_kv_type kv_type;
    uint8_t *kv_k, *kv_v;     /* seq_stride elements a sequence: halves, or q8_0's int8 */
    sw_f16 *kv_ks, *kv_vs;    /* q8_0: the elements' scales, one per 32 (attention.h); else NULL */
    uint8_t *kv_in;           /* [B][kv_in_row]: a token's k (and v) on their way into the cache */
    size_t kv_in_row;
    float *zeros;             /* max(head_dim, ctx_pad) zeros: padding rows for the tiles */
    /* norm weights as float (files may store them as f16) */
    float *attn_norm, *ffn_norm, *out_norm;   /* [n_layer][n_embd], ..., [n_embd] */
    float *inv_freq;          /* [n_rot/2] RoPE frequencies */
    float *inv_freq_swa;      /* [n_rot/2] those of the sliding layers (Gemma 3), else NULL */
    /* what some architectures add (NULL when the model has none): q, k and v
     * biases [n_layer][q_dim + 2 kv_dim] (zeros where a layer has none), the
     * per-head q and k norms [n_layer][2][head_dim], the output bias [n_vocab],
     * the post-attention and post-FFN norms [n_layer][2][n_embd], Qwen2-MoE's
     * shared-expert gates [n_layer][n_embd] */
    float *bias, *qk_norm, *out_bias, *post_norm, *shexp_gate;
    /* gpt-oss's (NULL when the file has none): the attention output's bias
     * [n_layer][n_embd], sink logits [n_layer][n_head], the router's bias
     * [n_layer][n_expert], and each expert's gate, up and down biases
     * [n_layer][n_expert][2 n_ff_exp + n_embd] */
    float *attn_out_b, *sinks, *router_b, *exp_b;
    /* scratch, sized for max_batch tokens */
    float *x;                 /* [B][n_embd] residual stream */
    float *xb;                /* [B][max(n_embd, q_dim)] normed input / attention output */
    float *xb2;               /* [B][n_embd] matmul output */
    float *q, *k, *v;         /* [B][q_dim], [B][kv_dim], [B][kv_dim] */
    float *hb, *hb2;          /* [B][n_ff] */
    float *att;               /* [threads][group][ctx_pad] attention scores */
    int att_threads;
    /* the batch's tokens that want logits, in batch order, and their indexes */
    sw_tok_in *out_toks;      /* [B] */
    int *out_idx;             /* [B] */
    /* precise mode: activations are quantized twice (value + residual) */
    bool precise;
    /* prepacked copies of the layer matrices ([layer][NPACK], NULL where the
     * kernels have no packed form) and of the experts ([layer][3][n_expert]:
     * gate, up, down); see pack_weights */
    sw_packed **pk, *pk_out, **pk_exp;
    /* a mixture of experts: router scores [B][n_expert], each token's experts
     * and their weights [B][n_used]; the B * n_used (token, expert) pairs
     * sorted by expert: each pair's slot [B][n_used], each slot's batch row
     * [B * n_used], each expert's first slot [n_expert + 1], and the slots'
     * input and output rows [B * n_used][n_embd] (their FFN rows in hb, hb2) */
    float *router, *sel_w, *exp_in, *exp_out;
    int *sel, *slot, *rows, *exp_first;
    sw_packed_job *jobs;      /* [2 * n_expert] */
    /* weight bytes the last sw_forward read: the dense part (all of it but
     * the experts), plus each expert used */
    uint64_t dense_bytes, bytes_read;
    uint64_t kv_bytes_read;   /* of the KV cache, by the last sw_forward's attention */
    float *px, *py;           /* [2*B][max cols], [2*B*max rows] (see matmul) */
    size_t py_cap;
};

/* ---- small vector helpers ----
 * Cloned per ISA (SW_CLONES, kernels.h): softmax, SwiGLU and the norms run
 * over every token of a prefill, and these loops only vectorize with the
 * wider targets enabled. */

SW_CLONES static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;   /* double: the sum over thousands of squares loses bits in float */
#pragma omp simd reduction(+:ss)
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
#pragma omp simd
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Rotates pairs of each head's dims by pos * inv_freq[i]: (2i, 2i+1) in the
 * "normal" (interleaved) RoPE that Llama files use (GGUF converters permute
 * Llama's q/k rows so that this layout is correct for them), (i, i + n_rot/2)
 * in the NEOX form of the other architectures, and scales them by mscale
 * (1 but for YaRN). Dims past n_rot stay. */
static void rope(float *x, int n_heads, int head_dim, int n_rot, int pos, const float *inv_freq, bool neox,
                 float mscale)
{
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float theta = (float)pos * inv_freq[i];
        float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_heads; h++) {
            float *p = x + (size_t)h * head_dim;
            float a = p[i0], b = p[i1];
            p[i0] = a * c - b * s;
            p[i1] = a * s + b * c;
        }
    }
}

/* e^x in straight-line float code, so that loops over it vectorize (libm's
 * expf is a call per element: SwiGLU and softmax were a tenth of a prefill).
 * x = n ln2 + r, |r| <= ln2/2; e^r by its degree-6 Taylor polynomial
 * (truncation under 2e-7 relative), 2^n built in the exponent bits. n comes
 * from the 1.5 * 2^23 rounding trick, so no float-to-int conversion. */
static inline float exp_fast(float x)
{
    const float magic = 12582912.0f;   /* 1.5 * 2^23 */
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float t = xc * 1.44269504f + magic;
    float n = t - magic;
    float r = xc - n * 0.693145752f;   /* ln2 split in two: exact n * hi */
    r -= n * 1.42860677e-6f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* n + 127 in the exponent field; unsigned, so that a NaN's bits (a NaN
     * weight in a file) shift without undefined behaviour */
    uint32_t ti, bits;
    __builtin_memcpy(&ti, &t, 4);
    bits = (ti - 0x4B400000u + 127u) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, 4);
    float y = p * scale;
    /* outside the clamp: the limits (and NaN stays NaN through r) */
    y = x < -87.0f ? 0.0f : y;
    y = x > 88.0f ? INFINITY : y;
    return y;
}

/* tanh(y) = 1 - 2 / (e^2y + 1), which saturates correctly at both ends
 * with exp_fast's clamps. */
static inline float tanh_fast(float y)
{
    return 1.0f - 2.0f / (exp_fast(2.0f * y) + 1.0f);
}

/* g[i] = silu(g[i]) * u[i], the SwiGLU gate. */
SW_CLONES static void swiglu(float *g, const float *u, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + exp_fast(-g[i])) * u[i];
}

/* gpt-oss's clamped SwiGLU: x = min(g, 7), u clamped to +-7, then
 * x * sigmoid(1.702 x) * (u + 1). */
SW_CLONES static void swiglu_oai(float *g, const float *u, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float x = g[i] < 7.0f ? g[i] : 7.0f, y = u[i] < -7.0f ? -7.0f : (u[i] > 7.0f ? 7.0f : u[i]);
        g[i] = x / (1.0f + exp_fast(-1.702f * x)) * (y + 1.0f);
    }
}

/* g[i] = gelu(g[i]) * u[i], GELU in its tanh form (as Gemma and llama.cpp
 * compute it). */
SW_CLONES static void geglu(float *g, const float *u, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float x = g[i], y = 0.7978845608f * (x + 0.044715f * x * x * x);
        g[i] = 0.5f * x * (1.0f + tanh_fast(y)) * u[i];
    }
}

/* x[i] = cap * tanh(x[i] * scale / cap): Gemma 2's soft-capping of scores
 * and logits. */
SW_CLONES static void softcap(float *x, int n, float scale, float cap)
{
    const float k = scale / cap;
#pragma omp simd
    for (int i = 0; i < n; i++) x[i] = cap * tanh_fast(x[i] * k);
}

/* Row-wise helpers over the batch; parallel only when there are many rows. */
static void norm_rows(float *out, const float *x, const float *w, int n, int dim, float eps)
{
#pragma omp parallel for if (n > 8)
    for (int t = 0; t < n; t++) rmsnorm(out + (size_t)t * dim, x + (size_t)t * dim, w, dim, eps);
}

/* xb = the n rows of x as a block takes them: RMS-normed with gains w, or
 * as they are (OLMo 2, which norms the blocks' outputs instead). */
static void input_rows(sw_ctx *c, const float *w, int n)
{
    const int E = (int)c->m->hp.n_embd;
    if (c->m->graph->olmo2) memcpy(c->xb, c->x, (size_t)n * E * sizeof(float));
    else norm_rows(c->xb, c->x, w, n, E, c->m->hp.rms_eps);
}

/* x[t] += b for each of n rows: biases */
static void add_bias(float *x, const float *b, int n, int dim)
{
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * dim;
        for (int i = 0; i < dim; i++) xr[i] += b[i];
    }
}

/* x += scale * d: a block's output into the residual stream (scale is
 * Granite's residual_scale, else 1). */
static void add_rows(float *x, const float *d, int n, int dim, float scale)
{
#pragma omp parallel for if (n > 8)
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * dim;
        const float *dr = d + (size_t)t * dim;
        for (int i = 0; i < dim; i++) xr[i] += scale * dr[i];
    }
}

/* ---- context ---- */

/* 64-byte aligned and zeroed: matmul splits output rows in 64-byte units, so
 * aligned outputs mean no two threads ever share a cache line. */
static float *falloc(size_t n)
{
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static bool norm_to_float(const gguf_tensor *t, float *dst)
{
    return sw_dequantize_row(t->type, t->data, dst, (int64_t)t->ne[0]);
}

/* Each layer's tensor of one kind (at byte offset `field` in sw_layer) as
 * float, `per` values a layer, into a fresh array; NULL in *out when no
 * layer has one, false when memory runs out or a layer lacks it. */
static bool layer_floats(const sw_model *m, size_t field, size_t per, float **out)
{
    const gguf_tensor *first = *(const gguf_tensor *const *)((const char *)&m->layers[0] + field);
    *out = NULL;
    if (!first) return true;
    if (!(*out = falloc(m->hp.n_layer * per))) return false;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const gguf_tensor *t = *(const gguf_tensor *const *)((const char *)&m->layers[l] + field);
        if (!t || !sw_dequantize_row(t->type, t->data, *out + l * per, (int64_t)per)) return false;
    }
    return true;
}

/* gpt-oss's extras. The experts' biases are stored per kind ([n_expert]
 * rows each); here each expert's three sit together. */
static bool load_oai_extras(sw_ctx *c)
{
    const sw_model *m = c->m;
    const sw_hparams *hp = &m->hp;
    const size_t E = hp->n_embd, NE = hp->n_expert, FE = hp->n_ff_exp, W = 2 * FE + E;
    if (!layer_floats(m, offsetof(sw_layer, bo), E, &c->attn_out_b) ||
        !layer_floats(m, offsetof(sw_layer, sinks), hp->n_head, &c->sinks) ||
        (NE && !layer_floats(m, offsetof(sw_layer, gate_inp_b), NE, &c->router_b)))
        return false;
    if (!NE || !m->layers[0].gate_exps_b) return true;
    float *tmp = malloc(NE * W * sizeof *tmp);
    bool ok = tmp && (c->exp_b = falloc(hp->n_layer * NE * W));
    for (uint32_t l = 0; ok && l < hp->n_layer; l++) {
        const sw_layer *L = &m->layers[l];
        const gguf_tensor *kinds[3] = {L->gate_exps_b, L->up_exps_b, L->down_exps_b};
        const size_t width[3] = {FE, FE, E}, at[3] = {0, FE, 2 * FE};
        for (int k = 0; ok && k < 3; k++) {
            ok = kinds[k] && sw_dequantize_row(kinds[k]->type, kinds[k]->data, tmp, (int64_t)(width[k] * NE));
            for (size_t e = 0; ok && e < NE; e++)
                memcpy(c->exp_b + (l * NE + e) * W + at[k], tmp + e * width[k], width[k] * sizeof(float));
        }
    }
    free(tmp);
    return ok;
}

/* Biases and per-head norms as float, for the architectures that have them. */
static bool load_extras(sw_ctx *c)
{
    const sw_model *m = c->m;
    const sw_hparams *hp = &m->hp;
    const size_t QD = (size_t)c->q_dim, KVD = (size_t)c->kv_dim, hd = hp->head_dim;
    bool any_bias = false;
    for (uint32_t l = 0; l < hp->n_layer; l++) any_bias |= m->layers[l].bq || m->layers[l].bk || m->layers[l].bv;
    if (any_bias && !(c->bias = falloc(hp->n_layer * (QD + 2 * KVD)))) return false;
    /* per layer: q's then k's, over one head (Qwen3, Gemma 3) or all heads (OLMo 2) */
    const size_t qn = m->graph->olmo2 ? QD : hd, kn = m->graph->olmo2 ? KVD : hd;
    if ((m->graph->qk_norm || m->graph->olmo2) && !(c->qk_norm = falloc(hp->n_layer * (qn + kn)))) return false;
    if (m->graph->post_norms && !(c->post_norm = falloc(hp->n_layer * 2 * (size_t)hp->n_embd))) return false;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const sw_layer *L = &m->layers[l];
        float *b = c->bias ? c->bias + l * (QD + 2 * KVD) : NULL;
        if ((L->bq && !norm_to_float(L->bq, b)) || (L->bk && !norm_to_float(L->bk, b + QD)) ||
            (L->bv && !norm_to_float(L->bv, b + QD + KVD)))
            return false;
        if (c->qk_norm && (!norm_to_float(L->q_norm, c->qk_norm + l * (qn + kn)) ||
                           !norm_to_float(L->k_norm, c->qk_norm + l * (qn + kn) + qn)))
            return false;
        float *pn = c->post_norm ? c->post_norm + (size_t)l * 2 * hp->n_embd : NULL;
        if (pn && (!norm_to_float(L->post_attn_norm, pn) || !norm_to_float(L->post_ffn_norm, pn + hp->n_embd)))
            return false;
    }
    if (!layer_floats(m, offsetof(sw_layer, gate_inp_shexp), hp->n_embd, &c->shexp_gate)) return false;
    if (m->output_bias && (!(c->out_bias = falloc(hp->n_vocab)) || !norm_to_float(m->output_bias, c->out_bias)))
        return false;
    return load_oai_extras(c);
}

/* The layer matrices in a fixed order, for the pack table. */
enum { PK_Q, PK_K, PK_V, PK_O, PK_GATE, PK_UP, PK_DOWN, NPACK };

static const gguf_tensor *layer_matrix(const sw_layer *L, int k)
{
    switch (k) {
    case PK_Q: return L->wq;
    case PK_K: return L->wk;
    case PK_V: return L->wv;
    case PK_O: return L->wo;
    case PK_GATE: return L->w_gate;
    case PK_UP: return L->w_up;
    default: return L->w_down;
    }
}

/* Repacks the layer matrices (and experts) once for the kernels' packed form
 * (kernels.h: the K-quants and the 32-weight types), which serves every batch size from one layout. The
 * packs take about the original's size; the mmap'd originals are then only
 * read for the rare leftovers, so their pages can be evicted. A pack that
 * fails (memory) just leaves that matrix on the raw-row path.
 * SPILLWAY_PACK=0 turns this off (comparisons, memory-tight hosts). */
static void pack_weights(sw_ctx *c)
{
    const char *env = getenv("SPILLWAY_PACK");
    if (env && !strcmp(env, "0")) return;
    const uint32_t nl = c->m->hp.n_layer, ne = c->m->hp.n_expert;
    c->pk = calloc((size_t)nl * NPACK, sizeof *c->pk);
    if (!c->pk) return;
    for (uint32_t l = 0; l < nl; l++)
        for (int k = 0; k < NPACK; k++) c->pk[(size_t)l * NPACK + k] = sw_pack_tensor(layer_matrix(&c->m->layers[l], k));
    c->pk_out = sw_pack_tensor(c->m->output);
    if (ne && (c->pk_exp = calloc((size_t)nl * 3 * ne, sizeof *c->pk_exp)))
        for (uint32_t l = 0; l < nl; l++) {
            const sw_layer *L = &c->m->layers[l];
            const gguf_tensor *stacks[3] = {L->gate_exps, L->up_exps, L->down_exps};
            for (int k = 0; k < 3; k++)
                for (uint32_t e = 0; e < ne; e++) c->pk_exp[((size_t)l * 3 + k) * ne + e] = sw_pack_tensor(&stacks[k][e]);
        }
}

static const sw_packed *packed(const sw_ctx *c, uint32_t l, int k)
{
    return c->pk ? c->pk[(size_t)l * NPACK + k] : NULL;
}

/* Expert e's packed gate (k 0), up (1) or down (2) matrix of layer l, or NULL. */
static const sw_packed *packed_expert(const sw_ctx *c, uint32_t l, int k, uint32_t e)
{
    return c->pk_exp ? c->pk_exp[((size_t)l * 3 + k) * c->m->hp.n_expert + e] : NULL;
}

/* Slots per layer. A query at p in a sliding layer reads p - n_swa + 1..p,
 * and a batch files up to max_batch positions of one sequence before any
 * of its queries reads: with n_swa + max_batch - 1 slots or more, no
 * position a query needs has been overwritten by a later one of its batch. */
static bool kv_layout(sw_ctx *c)
{
    const sw_hparams *hp = &c->m->hp;
    const uint32_t nl = hp->n_layer;
    c->kv_slots = malloc(nl * sizeof *c->kv_slots);
    c->layer_off = malloc(nl * sizeof *c->layer_off);
    if (!c->kv_slots || !c->layer_off) return false;
    const long ring = ((long)hp->n_swa + c->max_batch + 31) & ~31L;
    c->ring = hp->n_swa && ring < c->ctx_pad ? (int)ring : c->ctx_pad;
    c->seq_stride = 0;
    for (uint32_t l = 0; l < nl; l++) {
        c->kv_slots[l] = c->m->layers[l].sliding ? c->ring : c->ctx_pad;
        c->layer_off[l] = c->seq_stride;
        c->seq_stride += (size_t)hp->n_head_kv * hp->head_dim * c->kv_slots[l];
    }
    return true;
}

/* The mixture's routing and expert buffers for KB = batch x experts used
 * rows; false when one could not be had. */
static bool alloc_moe(sw_ctx *c, size_t KB)
{
    const sw_hparams *hp = &c->m->hp;
    const size_t E = hp->n_embd, B = (size_t)c->max_batch;
    c->router = falloc(B * hp->n_expert);
    c->sel_w = falloc(KB);
    c->sel = malloc(KB * sizeof *c->sel);
    c->slot = malloc(KB * sizeof *c->slot);
    c->rows = malloc(KB * sizeof *c->rows);
    c->exp_first = malloc((hp->n_expert + 1) * sizeof *c->exp_first);
    c->jobs = malloc(2 * (size_t)hp->n_expert * sizeof *c->jobs);
    c->exp_in = falloc(KB * E);
    c->exp_out = falloc(KB * E);
    return c->router && c->sel_w && c->sel && c->slot && c->rows && c->exp_first && c->jobs && c->exp_in &&
           c->exp_out;
}

/* Bytes a cache element takes (its share of q8_0's scales apart). */
static size_t kv_elem(const sw_ctx *c) { return c->kv_type == SW_KV_Q8_0 ? 1 : sizeof(sw_f16); }

/* Bytes of K and V a KV head keeps per slot (q8_0: with its scales). */
static size_t kv_slot_bytes(const sw_ctx *c)
{
    const size_t hd = c->m->hp.head_dim;
    return 2 * (hd * kv_elem(c) + (c->kv_type == SW_KV_Q8_0 ? hd / SW_KV_GROUP * sizeof(sw_f16) : 0));
}

static double kv_mib(const sw_ctx *c)
{
    /* seq_stride counts a sequence's K elements, every layer and KV head */
    const double slots = (double)c->seq_stride * c->n_seq / (double)c->m->hp.head_dim;
    return slots * (double)kv_slot_bytes(c) / 1048576.0;
}

/* The KV cache of kv_type for every sequence, and the buffer its new
 * entries pass through; false when one could not be had (free_kv frees
 * what was). calloc of a large block maps fresh zero pages: KV memory is
 * committed only as positions are written. */
static bool alloc_kv(sw_ctx *c)
{
    const size_t n = c->seq_stride * (size_t)c->n_seq, KVD = (size_t)c->kv_dim;
    c->kv_k = calloc(n, kv_elem(c));
    c->kv_v = calloc(n, kv_elem(c));
    if (c->kv_type == SW_KV_Q8_0) {
        c->kv_ks = calloc(n / SW_KV_GROUP, sizeof(sw_f16));
        c->kv_vs = calloc(n / SW_KV_GROUP, sizeof(sw_f16));
        c->kv_in_row = 2 * (KVD / QK8_0) * sizeof(block_q8_0);   /* k's blocks, then v's */
    } else {
        c->kv_in_row = KVD * sizeof(sw_f16);   /* k's halves (v goes straight in) */
    }
    c->kv_in = malloc((size_t)c->max_batch * c->kv_in_row);
    return c->kv_k && c->kv_v && c->kv_in && (c->kv_type != SW_KV_Q8_0 || (c->kv_ks && c->kv_vs));
}

static void free_kv(sw_ctx *c)
{
    free(c->kv_k); free(c->kv_v); free(c->kv_ks); free(c->kv_vs); free(c->kv_in);
    c->kv_k = c->kv_v = c->kv_in = NULL;
    c->kv_ks = c->kv_vs = NULL;
}

/* The KV cache and every per-step buffer, sized for max_batch tokens and
 * kv_layout's stride; false when one could not be had (sw_ctx_free frees
 * what was). */
static bool alloc_buffers(sw_ctx *c)
{
    const sw_hparams *hp = &c->m->hp;
    const bool kv_ok = alloc_kv(c);
    size_t E = hp->n_embd, B = (size_t)c->max_batch;
    size_t wide = E > (size_t)c->q_dim ? E : (size_t)c->q_dim;
    c->attn_norm = falloc(hp->n_layer * E);
    c->ffn_norm = falloc(hp->n_layer * E);
    c->out_norm = falloc(E);
    c->inv_freq = falloc(hp->n_rot / 2);
    c->x = falloc(B * E);
    c->xb = falloc(B * wide);
    c->xb2 = falloc(B * E);
    c->q = falloc(B * c->q_dim);
    c->k = falloc(B * c->kv_dim);
    c->v = falloc(B * c->kv_dim);
    const size_t KB = B * (hp->n_expert ? hp->n_expert_used : 1);   /* rows of an FFN step */
    size_t F = B * hp->n_ff > KB * hp->n_ff_exp ? B * hp->n_ff : KB * hp->n_ff_exp;
    F = F > B * hp->n_ff_shexp ? F : B * hp->n_ff_shexp;
    c->hb = falloc(F);
    c->hb2 = falloc(F);
    c->att_threads = omp_get_max_threads();
    c->att = falloc((size_t)c->att_threads * (hp->n_head / hp->n_head_kv) * c->ctx_pad);
    c->zeros = falloc(hp->head_dim > (uint32_t)c->ctx_pad ? hp->head_dim : (size_t)c->ctx_pad);
    c->out_toks = malloc(B * sizeof *c->out_toks);
    c->out_idx = malloc(B * sizeof *c->out_idx);
    const bool moe_ok = hp->n_expert ? alloc_moe(c, KB) : true;
    return kv_ok && c->attn_norm && c->ffn_norm && c->out_norm && c->inv_freq &&
           c->x && c->xb && c->xb2 && c->q && c->k && c->v && c->hb && c->hb2 && c->att &&
           c->zeros && c->out_toks && c->out_idx && moe_ok;
}

/* The norm weights as floats, the biases and q/k norms (load_extras);
 * false with the reason in err. */
static bool load_norms(sw_ctx *c, char *err, size_t errlen)
{
    const sw_model *m = c->m;
    const size_t E = m->hp.n_embd;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        if (m->layers[l].attn_norm && (!norm_to_float(m->layers[l].attn_norm, c->attn_norm + l * E) ||
                                       !norm_to_float(m->layers[l].ffn_norm, c->ffn_norm + l * E))) {
            sw_errf(err, errlen, "layer %u: cannot convert norm weights", l);
            return false;
        }
    }
    if (!norm_to_float(m->output_norm, c->out_norm) || !load_extras(c)) {
        sw_errf(err, errlen, "cannot convert output_norm weights, biases or q/k norms");
        return false;
    }
    return true;
}

sw_ctx *sw_ctx_new(const sw_model *m, int n_seq, int n_ctx, int max_batch, char *err, size_t errlen)
{
    const sw_hparams *hp = &m->hp;
    if (sw_model_is_encoder(m)) {   /* its tensors are another graph's (worker-cpu/encoder.h) */
        sw_errf(err, errlen, "this %s model is an encoder: it computes embeddings only (spillway-worker-cpu serves "
                "them at /v1/embeddings)", m->arch);
        return NULL;
    }
    if (n_seq < 1 || n_seq > 4096) { sw_errf(err, errlen, "number of sequences %d out of range", n_seq); return NULL; }
    if (n_ctx < 1 || n_ctx > (1 << 24)) { sw_errf(err, errlen, "context length %d out of range", n_ctx); return NULL; }
    if (max_batch < 1 || max_batch > (1 << 16)) { sw_errf(err, errlen, "batch size %d out of range", max_batch); return NULL; }
    sw_ctx *c = calloc(1, sizeof *c);
    if (!c) { sw_errf(err, errlen, "out of memory"); return NULL; }
    c->m = m;
    c->n_seq = n_seq;
    c->n_ctx = n_ctx;
    c->max_batch = max_batch;
    c->kv_dim = (int)(hp->n_head_kv * hp->head_dim);
    c->q_dim = (int)(hp->n_head * hp->head_dim);
    c->ctx_pad = (n_ctx + 31) & ~31;
    if (!kv_layout(c)) {
        sw_errf(err, errlen, "out of memory");
        sw_ctx_free(c);
        return NULL;
    }

    if (!alloc_buffers(c)) {
        sw_errf(err, errlen, "out of memory for %d sequences x %d positions (KV %.1f MiB)", n_seq, n_ctx,
               kv_mib(c));
        sw_ctx_free(c);
        return NULL;
    }
    if (!load_norms(c, err, errlen)) {
        sw_ctx_free(c);
        return NULL;
    }
    /* RoPE frequencies (llm/model.c): sliding layers may have their own. */
    if ((hp->rope_theta_swa != hp->rope_theta || hp->rope_scale_swa != hp->rope_scale) &&
        !(c->inv_freq_swa = falloc(hp->n_rot / 2))) {
        sw_errf(err, errlen, "out of memory");
        sw_ctx_free(c);
        return NULL;
    }
    sw_ctx_set_rope_context(c, n_ctx);
    pack_weights(c);
    c->dense_bytes = m->weight_bytes - m->expert_bytes;
    return c;
}

uint64_t sw_ctx_weight_bytes_read(const sw_ctx *c) { return c->bytes_read; }
uint64_t sw_ctx_kv_bytes_read(const sw_ctx *c) { return c->kv_bytes_read; }

void sw_ctx_free(sw_ctx *c)
{
    if (!c) return;
    if (c->pk)
        for (size_t i = 0; i < (size_t)c->m->hp.n_layer * NPACK; i++) sw_packed_free(c->pk[i]);
    free(c->pk);
    sw_packed_free(c->pk_out);
    if (c->pk_exp)
        for (size_t i = 0; i < (size_t)c->m->hp.n_layer * 3 * c->m->hp.n_expert; i++) sw_packed_free(c->pk_exp[i]);
    free(c->pk_exp);
    free(c->router); free(c->sel_w); free(c->sel); free(c->slot); free(c->rows); free(c->exp_first); free(c->jobs);
    free(c->exp_in); free(c->exp_out);
    free_kv(c);
    free(c->kv_slots); free(c->layer_off);
    free(c->attn_norm); free(c->ffn_norm); free(c->out_norm); free(c->inv_freq); free(c->inv_freq_swa);
    free(c->bias); free(c->qk_norm); free(c->out_bias); free(c->post_norm); free(c->shexp_gate);
    free(c->attn_out_b); free(c->sinks); free(c->router_b); free(c->exp_b);
    free(c->x); free(c->xb); free(c->xb2);
    free(c->q); free(c->k); free(c->v);
    free(c->hb); free(c->hb2); free(c->att); free(c->zeros); free(c->px); free(c->py);
    free(c->out_toks); free(c->out_idx);
    free(c);
}

int sw_ctx_n_ctx(const sw_ctx *c) { return c->n_ctx; }
const sw_model *sw_ctx_model(const sw_ctx *c) { return c->m; }

void sw_ctx_set_rope_context(sw_ctx *c, int n_ctx)
{
    const gguf_tensor *factors = sw_rope_factors(c->m, (uint32_t)n_ctx);
    sw_rope_freqs(&c->m->hp, factors, false, c->inv_freq);
    if (c->inv_freq_swa) sw_rope_freqs(&c->m->hp, factors, true, c->inv_freq_swa);
}

/* ---- matrix products ----
 * Fast mode multiplies with activations quantized once (Q8_K / Q8_0), as the
 * kernels do. Precise mode removes most of that rounding error by also
 * multiplying the quantization residual: x = deq(q(x)) + r, so
 * W*x = W*q(x) + W*q(r), with q(r)'s error ~1/128 of q(x)'s. Both halves go
 * through ONE matmul call (2n activation rows), so weights are still read once. */

#define PRECISE_MAX_TOK_ROWS 64   /* bounds the scratch for the vocab-sized output */

static size_t max_cols(const sw_ctx *c)
{
    const sw_hparams *hp = &c->m->hp;
    size_t m = hp->n_embd;
    if ((size_t)c->q_dim > m) m = (size_t)c->q_dim;
    if (hp->n_ff > m) m = hp->n_ff;
    if (hp->n_ff_exp > m) m = hp->n_ff_exp;
    if (hp->n_ff_shexp > m) m = hp->n_ff_shexp;
    if (hp->n_expert > m) m = hp->n_expert;
    return m;
}

int sw_ctx_set_kv_type(sw_ctx *c, sw_kv_type t, char *err, size_t errlen)
{
    if (t == c->kv_type) return 0;
    const uint32_t hd = c->m->hp.head_dim;
    if (t == SW_KV_Q8_0 && hd % SW_KV_GROUP) {
        sw_errf(err, errlen, "a q8_0 KV cache needs a head size that is a multiple of %d (this model's is %u)",
                SW_KV_GROUP, hd);
        return -1;
    }
    sw_ctx old = *c;   /* the cache it has, kept until the new one is had */
    c->kv_type = t;
    if (!alloc_kv(c)) {
        sw_errf(err, errlen, "out of memory for a %s KV cache of %d sequences x %d positions (%.1f MiB)",
                sw_kv_type_name(t), c->n_seq, c->n_ctx, kv_mib(c));
        free_kv(c);
        *c = old;
        return -1;
    }
    free_kv(&old);
    return 0;
}

sw_kv_type sw_ctx_kv_type(const sw_ctx *c) { return c->kv_type; }

int sw_ctx_set_precise(sw_ctx *c, bool precise)
{
    if (precise && !c->px) {
        const sw_hparams *hp = &c->m->hp;
        size_t B = (size_t)c->max_batch, mc = max_cols(c);
        size_t rows_body = B * mc;   /* every matrix but the output has <= mc rows */
        size_t tb = B < PRECISE_MAX_TOK_ROWS ? B : PRECISE_MAX_TOK_ROWS;
        size_t rows_out = tb * hp->n_vocab;
        c->py_cap = 2 * (rows_body > rows_out ? rows_body : rows_out);
        c->px = falloc(2 * B * mc);
        c->py = falloc(c->py_cap);
        if (!c->px || !c->py) {
            free(c->px); free(c->py);
            c->px = c->py = NULL;
            return -1;
        }
    }
    c->precise = precise;
    return 0;
}

static void matmul(sw_ctx *c, const gguf_tensor *w, const sw_packed *pk, const float *x, int n, float *y)
{
    sw_type at = sw_type_info(w->type)->vec_dot_type;
    if (!c->precise || at == SW_TYPE_F32 || at == SW_TYPE_F16 || at == SW_TYPE_BF16) {
        if (pk) sw_matmul_packed(pk, x, n, y);
        else sw_matmul_tensor(w, x, n, y);
        return;
    }
    const int64_t cols = (int64_t)w->ne[0], rows = (int64_t)w->ne[1];
    int chunk = (int)(c->py_cap / (2 * (size_t)rows));
    if (chunk > n) chunk = n;
    size_t qbytes = sw_act_row_size(w->type, cols);
    for (int t0 = 0; t0 < n; t0 += chunk) {
        int nc = n - t0 < chunk ? n - t0 : chunk;
        /* rows 0..nc-1: x itself; rows nc..2nc-1: x minus its quantized value */
        memcpy(c->px, x + (size_t)t0 * cols, (size_t)nc * cols * sizeof(float));
#pragma omp parallel
        {
            void *q = malloc(qbytes);
            float *dq = malloc((size_t)cols * sizeof(float));
#pragma omp for
            for (int t = 0; t < nc; t++) {
                const float *xr = x + (size_t)(t0 + t) * cols;
                float *r = c->px + (size_t)(nc + t) * cols;
                if (q && dq) {
                    sw_quantize_act(w->type, xr, q, cols);
                    sw_dequantize_row(at, q, dq, cols);
                    for (int64_t i = 0; i < cols; i++) r[i] = xr[i] - dq[i];
                } else {
                    memset(r, 0, (size_t)cols * sizeof(float));
                }
            }
            free(q);
            free(dq);
        }
        sw_matmul_tensor(w, c->px, 2 * nc, c->py);
        float *yc = y + (size_t)t0 * rows;
        const float *y1 = c->py, *y2 = c->py + (size_t)nc * rows;
        for (size_t i = 0; i < (size_t)nc * rows; i++) yc[i] = y1[i] + y2[i];
    }
}
/* Matrices that share an input (q/k/v, gate/up) as one product when all of
 * them are packed: one activation quantization and one parallel region
 * instead of one each. Returns false (nothing done) otherwise. */
static bool fused_packed(sw_ctx *c, uint32_t l, int first, int np, const float *x, int n, float *const *y)
{
    const sw_packed *p[SW_PACKED_FUSE_MAX];
    if (c->precise || np > SW_PACKED_FUSE_MAX) return false;
    for (int k = 0; k < np; k++)
        if (!(p[k] = packed(c, l, first + k))) return false;
    sw_matmul_packed_n(p, np, x, n, y);
    return true;
}

int sw_ctx_max_batch(const sw_ctx *c) { return c->max_batch; }

/* ---- attention ----
 * For each (token, KV head) the `group` query heads that share the KV head
 * are done together, with the tile kernels of attention.c over the
 * half-precision cache. */

/* a[j] = a[j] * scale for n entries, or soft-capped: cap * tanh(a[j] * scale / cap). */
static void scale_scores(float *a, int n, float scale, float cap)
{
    if (cap > 0.0f) {
        softcap(a, n, scale, cap);
        return;
    }
#pragma omp simd
    for (int j = 0; j < n; j++) a[j] *= scale;
}

/* In-place softmax of the first n entries of one row; a sink logit (gpt-oss;
 * -INFINITY for none) joins the denominator as a position without a value. */
SW_CLONES static void softmax_row(float *a, int n, float sink)
{
    float mx = sink;
#pragma omp simd reduction(max:mx)
    for (int j = 0; j < n; j++) mx = a[j] > mx ? a[j] : mx;
    float sum = sink > -INFINITY ? exp_fast(sink - mx) : 0.0f;
#pragma omp simd reduction(+:sum)
    for (int j = 0; j < n; j++) { a[j] = exp_fast(a[j] - mx); sum += a[j]; }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++) a[j] *= inv;
}

/* The attention weights of M rows of n scores, scaled (or soft-capped);
 * entries m0..m1-1 (positions outside a sliding window) get weight 0.
 * sinks: the M heads' sink logits, or NULL. */
static void softmax_rows(float *S, size_t ss, int M, int n, int m0, int m1, float scale, float cap,
                         const float *sinks)
{
    for (int r = 0; r < M; r++) {
        float *a = S + (size_t)r * ss;
        scale_scores(a, m0, scale, cap);
        scale_scores(a + m1, n - m1, scale, cap);
        for (int j = m0; j < m1; j++) a[j] = -INFINITY;
        softmax_row(a, n, sinks ? sinks[r] : -INFINITY);
    }
}

static inline size_t kv_base(const sw_ctx *c, int seq, int layer, int g)
{
    return (size_t)seq * c->seq_stride + c->layer_off[layer] + (size_t)g * c->m->hp.head_dim * c->kv_slots[layer];
}

bool sw_ctx_can_resume(const sw_ctx *c, int held, int at)
{
    if (c->ring == c->ctx_pad || held <= c->ring) return true;
    /* the rings hold held - ring..held-1; resuming at `at` needs the window before it */
    const int need = at - (int)c->m->hp.n_swa + 1;
    return need >= held - c->ring;
}

/* Slots [s0, s0 + n) of one K-shaped array (rows of w elements of es
 * bytes, in blocks of 32 slots: sw_attn_k_at), from element offset bs to
 * bd: a run within each block, a row per dimension. */
static void copy_kt(uint8_t *a, size_t es, int w, size_t bs, size_t bd, int s0, int n)
{
    for (int s = s0; s < s0 + n;) {
        const int room = SW_ATTN_KBLOCK - s % SW_ATTN_KBLOCK, left = s0 + n - s;
        const int run = room < left ? room : left;
        for (int d = 0; d < w; d++) {
            const size_t off = sw_attn_k_at(w, d, s);
            memcpy(a + (bd + off) * es, a + (bs + off) * es, (size_t)run * es);
        }
        s += run;
    }
}

/* The same for a V-shaped array: a row of w elements a slot. */
static void copy_rows(uint8_t *a, size_t es, int w, size_t bs, size_t bd, int s0, int n)
{
    memcpy(a + (bd + (size_t)s0 * w) * es, a + (bs + (size_t)s0 * w) * es, (size_t)n * w * es);
}

/* Copies slots [s0, s0 + n) of one (layer, KV head) from src to dst. */
static void copy_slots(sw_ctx *c, size_t bs, size_t bd, int s0, int n)
{
    const int hd = (int)c->m->hp.head_dim;
    copy_kt(c->kv_k, kv_elem(c), hd, bs, bd, s0, n);
    copy_rows(c->kv_v, kv_elem(c), hd, bs, bd, s0, n);
    if (c->kv_type == SW_KV_Q8_0) {   /* the scales: both laid out as K, 32 dimensions as one */
        const int ng = hd / SW_KV_GROUP;
        copy_kt((uint8_t *)c->kv_ks, sizeof(sw_f16), ng, bs / SW_KV_GROUP, bd / SW_KV_GROUP, s0, n);
        copy_kt((uint8_t *)c->kv_vs, sizeof(sw_f16), ng, bs / SW_KV_GROUP, bd / SW_KV_GROUP, s0, n);
    }
}

void sw_ctx_copy_kv(sw_ctx *c, int src, int dst, int from, int to)
{
    if (src == dst || src < 0 || dst < 0 || src >= c->n_seq || dst >= c->n_seq) return;
    if (from < 0) from = 0;
    if (to > c->n_ctx) to = c->n_ctx;
    if (from >= to) return;
    const int n_kv = (int)c->m->hp.n_head_kv;
    #pragma omp parallel for schedule(static)
    for (int lg = 0; lg < (int)c->m->hp.n_layer * n_kv; lg++) {
        const int l = lg / n_kv, slots = c->kv_slots[l];
        size_t bs = kv_base(c, src, l, lg % n_kv), bd = kv_base(c, dst, l, lg % n_kv);
        if (slots == c->ctx_pad) {
            copy_slots(c, bs, bd, from, to - from);
            continue;
        }
        /* a ring: the window before `to`, whatever dst held (the caller
         * checked with sw_ctx_can_resume that src still holds it) */
        int p0 = to - (int)c->m->hp.n_swa + 1;
        p0 = p0 > 0 ? p0 : 0;
        const int a = p0 % slots, n = to - p0;
        const int n1 = a + n <= slots ? n : slots - a;
        copy_slots(c, bs, bd, a, n1);
        if (n1 < n) copy_slots(c, bs, bd, 0, n - n1);
    }
}

/* q8_0: k and v as llama.cpp's q8_0 blocks (the activations' quantizer),
 * their elements and scales then filed one by one into the K and V
 * layouts. */
static void kv_store_q8(sw_ctx *c, int layer, int seq, int slot, const float *k, const float *v, block_q8_0 *qk)
{
    const int hd = (int)c->m->hp.head_dim, ng = hd / SW_KV_GROUP;
    block_q8_0 *qv = qk + c->kv_dim / QK8_0;
    sw_quantize_act(SW_TYPE_Q8_0, k, qk, c->kv_dim);
    sw_quantize_act(SW_TYPE_Q8_0, v, qv, c->kv_dim);
    for (int g = 0; g < (int)c->m->hp.n_head_kv; g++) {
        const size_t b = kv_base(c, seq, layer, g);
        int8_t *KT = (int8_t *)c->kv_k + b, *V = (int8_t *)c->kv_v + b + (size_t)slot * hd;
        sw_f16 *KS = c->kv_ks + b / SW_KV_GROUP, *VS = c->kv_vs + b / SW_KV_GROUP;
        for (int i = 0; i < ng; i++) {
            const block_q8_0 *bk = qk + g * ng + i, *bv = qv + g * ng + i;
            KS[sw_attn_k_at(ng, i, slot)] = bk->d;
            VS[sw_attn_k_at(ng, i, slot)] = bv->d;
            for (int d = 0; d < SW_KV_GROUP; d++) KT[sw_attn_k_at(hd, i * SW_KV_GROUP + d, slot)] = bk->qs[d];
            memcpy(V + i * SW_KV_GROUP, bv->qs, SW_KV_GROUP);
        }
    }
}

/* Files k and v of token (seq, pos) into the cache of one layer, by way
 * of its row of kv_in. */
static void kv_store(sw_ctx *c, const sw_attn_kernels *ak, int layer, int seq, int pos, const float *k,
                     const float *v, void *in)
{
    const int hd = (int)c->m->hp.head_dim, slots = c->kv_slots[layer], slot = pos % slots;
    if (c->kv_type == SW_KV_Q8_0) {
        kv_store_q8(c, layer, seq, slot, k, v, in);
        return;
    }
    sw_f16 *kh = in;
    ak->to_f16(k, kh, c->kv_dim);
    for (int g = 0; g < (int)c->m->hp.n_head_kv; g++) {
        size_t b = kv_base(c, seq, layer, g);
        sw_f16 *KT = (sw_f16 *)c->kv_k + b;
        for (int d = 0; d < hd; d++) KT[sw_attn_k_at(hd, d, slot)] = kh[g * hd + d];
        ak->to_f16(v + (size_t)g * hd, (sw_f16 *)c->kv_v + b + (size_t)slot * hd, hd);
    }
}

/* The cache slots a token at position pos reads in `layer`: the positions
 * it attends to, lo..pos, are slots a..b-1 of the layer's cache, or in a
 * ring that has wrapped, a..R-1 and 0..b-1 (then all R slots are scored
 * and the gap b..a-1 gets weight 0). The tiles start at the 32-slot
 * boundary j0 below a, which keeps their alignment, and the slots j0..a-1
 * get weight 0 too: slots j0..b-1 are read, m0..m1-1 weigh 0. */
typedef struct { int j0, b, m0, m1; } kv_span;
static kv_span attended(const sw_ctx *c, int layer, int pos)
{
    const int window = c->m->layers[layer].sliding ? (int)c->m->hp.n_swa : 0;
    const int N = pos + 1, R = c->kv_slots[layer];
    const int lo = window && N > window ? N - window : 0;
    const int a = lo % R, b = (N - 1) % R + 1;
    if (N > R && a >= b) return (kv_span){ 0, R, b, a };
    return (kv_span){ a & ~31, b, 0, a - (a & ~31) };
}

/* Causal attention: token t of sequence s at position p attends to that
 * sequence's cached positions 0..p, which this step has already filled up
 * to p (in a sliding layer, to the last n_swa of them). Query heads share
 * KV heads in groups (grouped-query attention). Writes [n][q_dim] into out.
 * Parallel over (token, KV head). */
static void attention(sw_ctx *c, int layer, const sw_tok_in *toks, int n, float *out)
{
    const sw_hparams *hp = &c->m->hp;
    const int hd = (int)hp->head_dim, n_kv = (int)hp->n_head_kv;
    const int group = (int)(hp->n_head / hp->n_head_kv);
    const float scale = hp->attn_scale, cap = hp->attn_softcap;
    const sw_attn_kernels *ak = sw_attn_kernels_for(sw_isa_active());
    const bool q8 = c->kv_type == SW_KV_Q8_0;

    /* Small work runs on one thread: waking the pool costs more than it saves. */
    long work = 0;
    uint64_t slots = 0;   /* read, in whole tiles of 32 */
    for (int t = 0; t < n; t++) {
        kv_span sp = attended(c, layer, toks[t].pos);
        work += (long)(toks[t].pos + 1);
        slots += (uint64_t)(sp.b - sp.j0 + 31) & ~(uint64_t)31;
    }
    work *= (long)hp->n_head * hd;
    c->kv_bytes_read += slots * (uint64_t)n_kv * kv_slot_bytes(c);
#pragma omp parallel for schedule(dynamic, 1) if (work > 65536)
    for (int tg = 0; tg < n * n_kv; tg++) {
        int t = tg / n_kv, g = tg % n_kv;
        int tid = omp_get_thread_num();
        size_t ss = (size_t)c->ctx_pad;
        /* The pool may have grown since the context was made: use a private
         * buffer then. */
        float *S = tid < c->att_threads ? c->att + (size_t)tid * group * ss : NULL;
        float *tmp = NULL;
        if (!S) S = tmp = aligned_alloc(64, (size_t)group * ss * sizeof(float));
        if (!S) continue;

        const kv_span sp = attended(c, layer, toks[t].pos);
        const int j0 = sp.j0, b = sp.b;
        const size_t base = kv_base(c, toks[t].seq, layer, g);
        const float *Q = c->q + (size_t)t * c->q_dim + (size_t)g * group * hd;
        float *O = out + (size_t)t * c->q_dim + (size_t)g * group * hd;
        const size_t k0 = base + sw_attn_k_at(hd, 0, j0), v0 = base + (size_t)j0 * hd;   /* elements */
        if (q8)
            ak->scores_q8(Q, group, hd, (const int8_t *)c->kv_k + k0, c->kv_ks + k0 / SW_KV_GROUP, b - j0, S, ss,
                          c->zeros);
        else
            ak->scores(Q, group, hd, (const sw_f16 *)c->kv_k + k0, b - j0, S, ss, c->zeros);
        softmax_rows(S, ss, group, b - j0, sp.m0, sp.m1, scale, cap,
                     c->sinks ? c->sinks + (size_t)layer * hp->n_head + (size_t)g * group : NULL);
        if (q8)
            ak->pv_q8(S, ss, group, (const int8_t *)c->kv_v + v0, c->kv_vs + v0 / SW_KV_GROUP, hd, b - j0, O,
                      c->zeros);
        else
            ak->pv(S, ss, group, (const sw_f16 *)c->kv_v + v0, hd, b - j0, O, c->zeros);
        free(tmp);
    }
}

/* ---- the forward pass ---- */

static int check_batch(const sw_ctx *c, const sw_tok_in *toks, int n, char *err, size_t errlen)
{
    if (n < 1 || n > c->max_batch) { sw_errf(err, errlen, "batch of %d tokens (max %d)", n, c->max_batch); return -1; }
    for (int i = 0; i < n; i++) {
        if (toks[i].token < 0 || (uint32_t)toks[i].token >= c->m->hp.n_vocab) {
            sw_errf(err, errlen, "token %d at batch index %d out of range (vocabulary %u)", toks[i].token, i, c->m->hp.n_vocab);
            return -1;
        }
        if (toks[i].pos < 0 || toks[i].pos >= c->n_ctx) {
            sw_errf(err, errlen, "position %d at batch index %d out of range (context %d)", toks[i].pos, i, c->n_ctx);
            return -1;
        }
        if (toks[i].seq < 0 || toks[i].seq >= c->n_seq) {
            sw_errf(err, errlen, "sequence %d at batch index %d out of range (%d sequences)", toks[i].seq, i, c->n_seq);
            return -1;
        }
    }
    return 0;
}

/* Moves rows idx[0..n-1] (increasing) of a [][width] array to rows 0..n-1. */
static void compact_rows(float *a, size_t width, const int *idx, int n)
{
    for (int i = 0; i < n; i++)
        if (idx[i] != i) memcpy(a + (size_t)i * width, a + (size_t)idx[i] * width, width * sizeof(float));
}

/* x += Wo * attention(...) for the nq query tokens qtoks, after filing all n
 * tokens' K and V into the cache. nq < n only in the last layer (see
 * sw_forward): there qtoks are the tokens that want logits, at batch
 * indexes qidx, and x and xb are compacted to them once K and V are made. */
static void attention_block(sw_ctx *c, uint32_t l, const sw_tok_in *toks, int n, const sw_tok_in *qtoks,
                            const int *qidx, int nq)
{
    const sw_hparams *hp = &c->m->hp;
    const sw_layer *L = &c->m->layers[l];
    const int E = (int)hp->n_embd, QD = c->q_dim, KVD = c->kv_dim;
    const sw_attn_kernels *ak = sw_attn_kernels_for(sw_isa_active());

    input_rows(c, c->attn_norm + (size_t)l * E, n);
    if (nq == n) {
        if (!fused_packed(c, l, PK_Q, 3, c->xb, n, (float *const[]){c->q, c->k, c->v})) {
            matmul(c, L->wq, packed(c, l, PK_Q), c->xb, n, c->q);
            matmul(c, L->wk, packed(c, l, PK_K), c->xb, n, c->k);
            matmul(c, L->wv, packed(c, l, PK_V), c->xb, n, c->v);
        }
    } else {
        if (!fused_packed(c, l, PK_K, 2, c->xb, n, (float *const[]){c->k, c->v})) {
            matmul(c, L->wk, packed(c, l, PK_K), c->xb, n, c->k);
            matmul(c, L->wv, packed(c, l, PK_V), c->xb, n, c->v);
        }
        compact_rows(c->xb, (size_t)E, qidx, nq);
        compact_rows(c->x, (size_t)E, qidx, nq);
        if (nq) matmul(c, L->wq, packed(c, l, PK_Q), c->xb, nq, c->q);
    }
    if (c->bias) {
        const float *b = c->bias + (size_t)l * (QD + 2 * KVD);
        add_bias(c->q, b, nq, QD);
        add_bias(c->k, b + QD, n, KVD);
        add_bias(c->v, b + QD + KVD, n, KVD);
    }

    /* Rotate q and k by position (after their per-head norms, where the
     * architecture has them), then file k and v into each token's sequence
     * cache before any attention reads it (tokens of the same sequence in
     * this batch see each other, causally). */
    const int hd = (int)hp->head_dim;
    const bool full = c->m->graph->olmo2;   /* OLMo 2: q and k normed over all heads */
    const float *qn = c->qk_norm ? c->qk_norm + (size_t)l * (size_t)(full ? QD + KVD : 2 * hd) : NULL;
    const float *inv_freq = L->sliding && c->inv_freq_swa ? c->inv_freq_swa : c->inv_freq;
    const float mscale = sw_rope_mscale(hp, L->sliding);
#pragma omp parallel for if (n > 4)
    for (int t = 0; t < n; t++) {
        float *k = c->k + (size_t)t * KVD, *q = c->q + (size_t)t * QD;
        if (qn && full) {
            if (t < nq) rmsnorm(q, q, qn, QD, hp->rms_eps);
            rmsnorm(k, k, qn + QD, KVD, hp->rms_eps);
        } else if (qn) {
            for (int h = 0; t < nq && h < (int)hp->n_head; h++) rmsnorm(q + h * hd, q + h * hd, qn, hd, hp->rms_eps);
            for (int h = 0; h < (int)hp->n_head_kv; h++) rmsnorm(k + h * hd, k + h * hd, qn + hd, hd, hp->rms_eps);
        }
        if (t < nq && !L->no_rope) rope(q, (int)hp->n_head, hd, (int)hp->n_rot, qtoks[t].pos, inv_freq, hp->rope_neox, mscale);
        if (!L->no_rope) rope(k, (int)hp->n_head_kv, hd, (int)hp->n_rot, toks[t].pos, inv_freq, hp->rope_neox, mscale);
        kv_store(c, ak, (int)l, toks[t].seq, toks[t].pos, k, c->v + (size_t)t * KVD, c->kv_in + (size_t)t * c->kv_in_row);
    }
    if (!nq) return;
    attention(c, (int)l, qtoks, nq, c->xb);
    matmul(c, L->wo, packed(c, l, PK_O), c->xb, nq, c->xb2);
    if (c->attn_out_b) add_bias(c->xb2, c->attn_out_b + (size_t)l * E, nq, E);
    if (c->post_norm) norm_rows(c->xb2, c->xb2, c->post_norm + (size_t)l * 2 * E, nq, E, hp->rms_eps);
    add_rows(c->x, c->xb2, nq, E, hp->residual_scale);
}

/* hb = act(hb) * hb2 for n rows of width F. */
static void gate_rows(sw_ctx *c, int n, int F)
{
#pragma omp parallel for if (n > 4)
    for (int t = 0; t < n; t++) {
        if (c->m->graph->gelu) geglu(c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
        else if (c->m->graph->oai_moe) swiglu_oai(c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
        else swiglu(c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
    }
}

/* Each token's n_used experts: the largest router scores, weighted by their
 * softmax over all experts, renormalized over the chosen ones (the sum
 * clamped as llama.cpp does; not in Qwen2-MoE) and scaled. Ties go to the
 * lower index. */
static void route_tokens(sw_ctx *c, int n)
{
    const sw_hparams *hp = &c->m->hp;
    const int ne = (int)hp->n_expert, k = (int)hp->n_expert_used;
    for (int t = 0; t < n; t++) {
        const float *r = c->router + (size_t)t * ne;
        int *sel = c->sel + (size_t)t * k;
        float *w = c->sel_w + (size_t)t * k;
        float mx = -INFINITY;
        for (int e = 0; e < ne; e++) mx = r[e] > mx ? r[e] : mx;
        /* insertion into a sorted top-k: k is small (2-8) */
        int got = 0;
        for (int e = 0; e < ne; e++) {
            int at = got < k ? got++ : k;
            while (at > 0 && r[sel[at - 1]] < r[e]) {
                if (at < k) sel[at] = sel[at - 1];
                at--;
            }
            if (at < k) sel[at] = e;
        }
        /* p_i = e^(r_i - max) / all; w_i = p_i / max(sum of the chosen p, 2^-14) */
        float sum = 0.0f;
        for (int i = 0; i < k; i++) sum += w[i] = expf(r[sel[i]] - mx);
        float all = 0.0f;
        for (int e = 0; e < ne; e++) all += expf(r[e] - mx);
        float norm = sum / all;   /* the chosen's share of the softmax */
        if (!c->m->graph->oai_moe) norm = norm < 6.103515625e-5f ? 6.103515625e-5f : norm;   /* gpt-oss: unclamped */
        if (!hp->expert_renorm) norm = 1.0f;   /* Qwen2-MoE: the softmax probabilities themselves */
        for (int i = 0; i < k; i++) w[i] = w[i] / all / norm * hp->expert_weights_scale;
    }
}

/* Sorts the n * n_used (token, expert) pairs by expert (stable, so each
 * expert's rows stay in batch order) and gathers each pair's input row into
 * its slot of exp_in. */
static void gather_expert_rows(sw_ctx *c, int n)
{
    const sw_hparams *hp = &c->m->hp;
    const int ne = (int)hp->n_expert, k = (int)hp->n_expert_used, E = (int)hp->n_embd;
    int *first = c->exp_first;
    memset(first, 0, (size_t)(ne + 1) * sizeof *first);
    for (int i = 0; i < n * k; i++) first[c->sel[i] + 1]++;
    for (int e = 0; e < ne; e++) first[e + 1] += first[e];
    for (int i = 0; i < n * k; i++) {
        /* first[e] walks through expert e's slots here and is restored below */
        int s = first[c->sel[i]]++;
        c->slot[i] = s;
        c->rows[s] = i / k;
    }
    for (int e = ne; e > 0; e--) first[e] = first[e - 1];
    first[0] = 0;
#pragma omp parallel for if (n * k > 8)
    for (int s = 0; s < n * k; s++)
        memcpy(c->exp_in + (size_t)s * E, c->xb + (size_t)c->rows[s] * E, (size_t)E * sizeof(float));
}

/* gpt-oss: each slot's expert biases, added to its gate and up products, or
 * to its down product. */
static void add_expert_biases(sw_ctx *c, uint32_t l, bool down)
{
    const sw_hparams *hp = &c->m->hp;
    if (!c->exp_b) return;
    const size_t E = hp->n_embd, FE = hp->n_ff_exp, W = 2 * FE + E;
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        const int s0 = c->exp_first[e], m = c->exp_first[e + 1] - s0;
        const float *b = c->exp_b + ((size_t)l * hp->n_expert + e) * W;
        if (!m) continue;
        if (down) {
            add_bias(c->exp_out + (size_t)s0 * E, b + 2 * FE, m, (int)E);
        } else {
            add_bias(c->hb + (size_t)s0 * FE, b, m, (int)FE);
            add_bias(c->hb2 + (size_t)s0 * FE, b + FE, m, (int)FE);
        }
    }
}

/* The experts' products over their slots: all of one kind (gate and up,
 * then down) in one parallel region when every expert used is packed,
 * else one matmul each. */
static void expert_products(sw_ctx *c, uint32_t l, bool down)
{
    const sw_hparams *hp = &c->m->hp;
    const sw_layer *L = &c->m->layers[l];
    const int E = (int)hp->n_embd, FE = (int)hp->n_ff_exp;
    const int *first = c->exp_first;
    int nj = 0;
    bool packed_all = !c->precise;
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        const int m = first[e + 1] - first[e];
        if (!m) continue;
        const size_t s0 = (size_t)first[e];
        if (down) {
            c->jobs[nj++] = (sw_packed_job){ packed_expert(c, l, 2, e), c->hb + s0 * FE, m, c->exp_out + s0 * E };
        } else {
            c->jobs[nj++] = (sw_packed_job){ packed_expert(c, l, 0, e), c->exp_in + s0 * E, m, c->hb + s0 * FE };
            c->jobs[nj++] = (sw_packed_job){ packed_expert(c, l, 1, e), c->exp_in + s0 * E, m, c->hb2 + s0 * FE };
        }
        packed_all &= c->jobs[nj - 1].p && c->jobs[nj - (down ? 1 : 2)].p;
    }
    if (packed_all) {
        sw_matmul_packed_jobs(c->jobs, nj);
        add_expert_biases(c, l, down);
        return;
    }
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        const int m = first[e + 1] - first[e];
        const size_t s0 = (size_t)first[e];
        if (!m) continue;
        if (down) {
            matmul(c, &L->down_exps[e], packed_expert(c, l, 2, e), c->hb + s0 * FE, m, c->exp_out + s0 * E);
        } else {
            matmul(c, &L->gate_exps[e], packed_expert(c, l, 0, e), c->exp_in + s0 * E, m, c->hb + s0 * FE);
            matmul(c, &L->up_exps[e], packed_expert(c, l, 1, e), c->exp_in + s0 * E, m, c->hb2 + s0 * FE);
        }
    }
    add_expert_biases(c, l, down);
}

/* xb2 = the mixture of experts over the n normed rows in xb. The pairs
 * (token, chosen expert) are sorted by expert, so each expert used runs
 * once over all its rows; experts nobody picked are not read. Each token
 * then sums its experts' outputs, weighted, in its ranking's order. */
static void moe_rows(sw_ctx *c, uint32_t l, int n)
{
    const sw_hparams *hp = &c->m->hp;
    const sw_layer *L = &c->m->layers[l];
    const int E = (int)hp->n_embd, k = (int)hp->n_expert_used;
    matmul(c, L->gate_inp, NULL, c->xb, n, c->router);
    if (c->router_b) add_bias(c->router, c->router_b + (size_t)l * hp->n_expert, n, (int)hp->n_expert);
    route_tokens(c, n);
    gather_expert_rows(c, n);
    for (uint32_t e = 0; e < hp->n_expert; e++)
        if (c->exp_first[e + 1] > c->exp_first[e]) c->bytes_read += sw_expert_bytes(L, e);
    expert_products(c, l, false);
    gate_rows(c, n * k, (int)hp->n_ff_exp);
    expert_products(c, l, true);
#pragma omp parallel for if (n > 4)
    for (int t = 0; t < n; t++) {
        float *dst = c->xb2 + (size_t)t * E;
        memset(dst, 0, (size_t)E * sizeof(float));
        for (int i = 0; i < k; i++) {
            const float *src = c->exp_out + (size_t)c->slot[t * k + i] * E, w = c->sel_w[t * k + i];
#pragma omp simd
            for (int d = 0; d < E; d++) dst[d] += w * src[d];
        }
    }
}

/* out = W_down * (act(W_gate * xb) * (W_up * xb)) for n rows of the layer's
 * dense FFN (F wide), act SiLU or GELU (Gemma). */
static void dense_ffn(sw_ctx *c, uint32_t l, int n, int F, float *out)
{
    const sw_layer *L = &c->m->layers[l];
    if (!fused_packed(c, l, PK_GATE, 2, c->xb, n, (float *const[]){c->hb, c->hb2})) {
        matmul(c, L->w_gate, packed(c, l, PK_GATE), c->xb, n, c->hb);
        matmul(c, L->w_up, packed(c, l, PK_UP), c->xb, n, c->hb2);
    }
    gate_rows(c, n, F);
    matmul(c, L->w_down, packed(c, l, PK_DOWN), c->hb, n, out);
}

/* Qwen2-MoE's shared expert, added to the mixture in xb2: each row gets
 * sigmoid(gate . x) times the dense FFN of x (x: the normed rows in xb).
 * exp_out is free again once moe_rows has summed it. */
static void shared_expert(sw_ctx *c, uint32_t l, int n)
{
    const sw_hparams *hp = &c->m->hp;
    const int E = (int)hp->n_embd;
    const float *g = c->shexp_gate + (size_t)l * E;
    dense_ffn(c, l, n, (int)hp->n_ff_shexp, c->exp_out);
#pragma omp parallel for if (n > 4)
    for (int t = 0; t < n; t++) {
        const float *x = c->xb + (size_t)t * E, *f = c->exp_out + (size_t)t * E;
        float *dst = c->xb2 + (size_t)t * E, dot = 0.0f;
        for (int d = 0; d < E; d++) dot += g[d] * x[d];
        const float w = 1.0f / (1.0f + expf(-dot));
        for (int d = 0; d < E; d++) dst[d] += w * f[d];
    }
}

/* x += FFN(norm(x)) for n rows: the dense FFN, or a mixture of experts (with
 * Qwen2-MoE's shared expert beside it); Gemma 2 and 3 normalize the result
 * before adding it, as they do attention's. */
static void ffn_block(sw_ctx *c, uint32_t l, int n)
{
    const sw_hparams *hp = &c->m->hp;
    const int E = (int)hp->n_embd;
    if (!n) return;
    input_rows(c, c->ffn_norm + (size_t)l * E, n);
    if (hp->n_expert) {
        moe_rows(c, l, n);
        if (c->shexp_gate) shared_expert(c, l, n);
    } else {
        dense_ffn(c, l, n, (int)hp->n_ff, c->xb2);
    }
    if (c->post_norm) norm_rows(c->xb2, c->xb2, c->post_norm + ((size_t)l * 2 + 1) * E, n, E, hp->rms_eps);
    add_rows(c->x, c->xb2, n, E, hp->residual_scale);
}

/* The layers and the final norm over a batch: the rows of the tokens that
 * want an output, normalized, are then rows 0..nl-1 of c->xb. Returns nl,
 * or -1 with err filled for an invalid batch. */
static int forward_hidden(sw_ctx *c, const sw_tok_in *toks, int n, char *err, size_t errlen)
{
    if (check_batch(c, toks, n, err, errlen)) return -1;
    const sw_model *m = c->m;
    c->bytes_read = c->dense_bytes;
    c->kv_bytes_read = 0;
    const sw_hparams *hp = &m->hp;
    const int E = (int)hp->n_embd;

    /* The tokens that want logits (in prefill usually only the last one). */
    int nl = 0;
    for (int t = 0; t < n; t++)
        if (toks[t].logits) { c->out_toks[nl] = toks[t]; c->out_idx[nl++] = t; }

    /* Embedding lookup. */
    for (int t = 0; t < n; t++) sw_get_row(m->token_embd, toks[t].token, c->x + (size_t)t * E);
    if (hp->embd_scale != 1.0f)
        for (size_t i = 0; i < (size_t)n * E; i++) c->x[i] *= hp->embd_scale;

    /* Every layer but the last runs all n tokens. The last one only feeds
     * the logits and its own K/V cache entries, so past K and V it runs
     * just the tokens that want logits: a 512-token prefill skips wq, wo,
     * attention and the FFN of one layer for 511 of them (1/n_layer of its
     * work; llama.cpp does the same). */
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        bool last = l + 1 == hp->n_layer && nl < n;
        attention_block(c, l, toks, n, last ? c->out_toks : toks, c->out_idx, last ? nl : n);
        ffn_block(c, l, last ? nl : n);
    }

    /* Final norm of the rows that want logits: after the last layer they
     * are rows 0..nl-1 (compacted, or all n). */
    for (int i = 0; i < nl; i++) rmsnorm(c->xb + (size_t)i * E, c->x + (size_t)i * E, c->out_norm, E, hp->rms_eps);
    return nl;
}

int sw_forward(sw_ctx *c, const sw_tok_in *toks, int n, float *logits_out, char *err, size_t errlen)
{
    int nl = forward_hidden(c, toks, n, err, errlen);
    if (nl < 0) return -1;
    const sw_model *m = c->m;
    const sw_hparams *hp = &m->hp;
    if (nl) matmul(c, m->output, c->pk_out, c->xb, nl, logits_out);
    if (c->out_bias) add_bias(logits_out, c->out_bias, nl, (int)hp->n_vocab);
    if (hp->logit_scale != 1.0f)
        for (size_t i = 0; i < (size_t)nl * hp->n_vocab; i++) logits_out[i] /= hp->logit_scale;
    for (int i = 0; hp->final_softcap > 0.0f && i < nl; i++)
        softcap(logits_out + (size_t)i * hp->n_vocab, (int)hp->n_vocab, 1.0f, hp->final_softcap);
    return 0;
}

int sw_forward_hidden(sw_ctx *c, const sw_tok_in *toks, int n, float *hidden_out, char *err, size_t errlen)
{
    int nl = forward_hidden(c, toks, n, err, errlen);
    if (nl < 0) return -1;
    memcpy(hidden_out, c->xb, (size_t)nl * c->m->hp.n_embd * sizeof *hidden_out);
    return 0;
}

double sw_forward_weight_macs(const sw_model *m, int n, int n_logits)
{
    const sw_hparams *hp = &m->hp;
    const double E = hp->n_embd, QD = (double)hp->n_head * hp->head_dim, KVD = (double)hp->n_head_kv * hp->head_dim;
    /* a mixture: the router, the experts a token uses and a shared one's gate and matrices */
    const double ffn = hp->n_expert ? E * hp->n_expert + 3.0 * E * hp->n_ff_exp * hp->n_expert_used +
                                          (hp->n_ff_shexp ? E + 3.0 * E * hp->n_ff_shexp : 0.0)
                                    : 3 * E * hp->n_ff;
    const double kv = E * 2 * KVD, rest = E * QD + QD * E + ffn;   /* wk+wv; wq, wo, FFN */
    const double out = (double)n_logits * E * hp->n_vocab;
    if (!hp->n_layer) return out;
    int nq = n_logits < n ? n_logits : n;
    return (hp->n_layer - 1.0) * n * (kv + rest) + n * kv + nq * rest + out;
}
