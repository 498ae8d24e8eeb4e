/* Loading a BERT-family encoder: "bert" (BERT, bge, all-MiniLM, ...) and
 * "nomic-bert" (nomic-embed-text v1, v1.5), with the tensor and metadata
 * names llama.cpp's converter gives them:
 *
 *   token_embd, token_types (row 0 used), position_embd (bert only),
 *   token_embd_norm (+ bias)
 *   per block: attn_q/k/v (bert) or attn_qkv (nomic-bert), each with an
 *   optional bias; attn_output (+ optional bias); attn_output_norm (+ bias);
 *   ffn_up, ffn_gate (nomic-bert only), ffn_down, each but the gate with an
 *   optional bias; layer_output_norm (+ bias)
 *
 *   <arch>.attention.layer_norm_epsilon (required), <arch>.attention.causal
 *   (false if present), <arch>.pooling_type (mean, cls or last: required),
 *   tokenizer.ggml.token_type_count (if present, the rows of token_types)
 *
 * As in model.c, every tensor is checked here, and a file with one the
 * graph does not read (a classifier head, a reranker's) is refused.
 */
#include "llm/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include "llm/util.h"

bool sw_encoder_hparams(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.causal", arch);
    bool causal = false;
    if (gguf_find(f, key) && !gguf_get_bool(f, key, &causal))
        return sw_errf(err, errlen, "metadata '%s': not a boolean", key), false;
    if (causal) return sw_errf(err, errlen, "metadata '%s' = true: only bidirectional encoders are supported", key), false;
    snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", arch);
    if (!gguf_find(f, key)) return sw_errf(err, errlen, "metadata '%s' missing", key), false;
    if (!sw_hp_f32(f, arch, "attention.layer_norm_epsilon", &hp->norm_eps, err, errlen)) return false;
    if (!(hp->norm_eps > 0.0f && hp->norm_eps < 1.0f))
        return sw_errf(err, errlen, "metadata '%s' = %g out of range", key, hp->norm_eps), false;
    if (hp->pooling == SW_POOLING_NONE)
        return sw_errf(err, errlen, "metadata '%s.pooling_type' missing or none: an encoder is served for embeddings, "
                       "pooled as its file says (mean, cls or last)", arch), false;
    if (hp->n_head_kv != hp->n_head)
        return sw_errf(err, errlen, "metadata '%s.attention.head_count_kv' = %u: an encoder's must be head_count %u",
                       arch, hp->n_head_kv, hp->n_head), false;
    return true;
}

/* A LayerNorm's gain and bias ([n_embd] each), both required. */
static bool bind_norm(sw_loader *ld, const char *fmt_w, const char *fmt_b, uint32_t l, const gguf_tensor **w,
                      const gguf_tensor **b)
{
    const uint64_t E = ld->m->hp.n_embd;
    return (*w = sw_ld_bindf(ld, E, 0, false, fmt_w, l)) && (*b = sw_ld_bindf(ld, E, 0, false, fmt_b, l));
}

/* An optional bias; false only when it is there but invalid. */
static bool bind_bias(sw_loader *ld, uint64_t n, const char *fmt, uint32_t l, const gguf_tensor **b)
{
    *b = sw_ld_bindf(ld, n, 0, true, fmt, l);
    return !ld->err[0];
}

static bool bind_block(sw_loader *ld, uint32_t l, sw_layer *L)
{
    const sw_hparams *hp = &ld->m->hp;
    const uint64_t E = hp->n_embd, F = hp->n_ff, QD = (uint64_t)hp->n_head * hp->head_dim;
    const bool nomic = ld->m->graph->encoder == SW_ENC_NOMIC;
    if (!sw_ld_bind_qkv(ld, l, L) || !(L->wo = sw_ld_bindf(ld, QD, E, false, "blk.%u.attn_output.weight", l)) ||
        !bind_bias(ld, E, "blk.%u.attn_output.bias", l, &L->bo) ||
        !bind_norm(ld, "blk.%u.attn_output_norm.weight", "blk.%u.attn_output_norm.bias", l, &L->attn_out_norm,
                   &L->attn_out_norm_b))
        return false;
    if (!(L->w_up = sw_ld_bindf(ld, E, F, false, "blk.%u.ffn_up.weight", l)) ||
        !bind_bias(ld, F, "blk.%u.ffn_up.bias", l, &L->b_up) ||
        (nomic && !(L->w_gate = sw_ld_bindf(ld, E, F, false, "blk.%u.ffn_gate.weight", l))) ||
        !(L->w_down = sw_ld_bindf(ld, F, E, false, "blk.%u.ffn_down.weight", l)) ||
        !bind_bias(ld, E, "blk.%u.ffn_down.bias", l, &L->b_down))
        return false;
    return bind_norm(ld, "blk.%u.layer_output_norm.weight", "blk.%u.layer_output_norm.bias", l, &L->out_norm,
                     &L->out_norm_b);
}

/* Bytes of a block's weights (one token reads them all). */
static uint64_t block_bytes(const sw_layer *L)
{
    const gguf_tensor *ts[] = {L->wq, L->wk, L->wv, L->bq, L->bk, L->bv, L->wo, L->bo, L->attn_out_norm,
                               L->attn_out_norm_b, L->w_up, L->b_up, L->w_gate, L->w_down, L->b_down, L->out_norm,
                               L->out_norm_b};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) n += ts[i] ? ts[i]->nbytes : 0;
    return n;
}

/* The matrices [E, rows] whose row count the file gives: the vocabulary
 * (token_embd), the token types, the positions. Checks rows against
 * 1..max; NULL when absent (and optional) or invalid, err filled. */
static const gguf_tensor *bind_table(sw_loader *ld, const char *name, uint64_t max, bool optional)
{
    const gguf_tensor *t = gguf_find_tensor(ld->m->file, name);
    if (!t) return optional ? NULL : (sw_errf(ld->err, ld->errlen, "missing tensor '%s'", name), NULL);
    if (t->ne[1] == 0 || t->ne[1] > max) {
        sw_errf(ld->err, ld->errlen, "tensor '%s': %llu rows, expected 1..%llu", name, (unsigned long long)t->ne[1],
                (unsigned long long)max);
        return NULL;
    }
    return sw_ld_bind(ld, name, ld->m->hp.n_embd, t->ne[1], false);
}

/* The embeddings: tokens, type 0, positions (bert), their norm. */
static bool bind_embeddings(sw_loader *ld)
{
    sw_model *m = ld->m;
    sw_hparams *hp = &m->hp;
    if (!(m->token_embd = bind_table(ld, "token_embd.weight", 1u << 24, false))) return false;
    hp->n_vocab = (uint32_t)m->token_embd->ne[1];
    m->token_types = bind_table(ld, "token_types.weight", 64, true);
    if (ld->err[0]) return false;
    uint32_t types = 0;
    if (m->token_types && gguf_get_u32(m->file, "tokenizer.ggml.token_type_count", &types) &&
        types != m->token_types->ne[1])
        return sw_errf(ld->err, ld->errlen, "tensor 'token_types.weight': %llu rows, but token_type_count is %u",
                       (unsigned long long)m->token_types->ne[1], types), false;
    if (m->graph->encoder == SW_ENC_BERT) {
        if (!(m->pos_embd = bind_table(ld, "position_embd.weight", 1u << 24, false))) return false;
        if (m->pos_embd->ne[1] < hp->n_ctx_train)
            return sw_errf(ld->err, ld->errlen, "tensor 'position_embd.weight': %llu positions, fewer than the "
                           "context_length %u", (unsigned long long)m->pos_embd->ne[1], hp->n_ctx_train), false;
    }
    return bind_norm(ld, "token_embd_norm.weight", "token_embd_norm.bias", 0, &m->embd_norm, &m->embd_norm_b);
}

bool sw_encoder_bind(sw_loader *ld)
{
    sw_model *m = ld->m;
    const sw_hparams *hp = &m->hp;
    if (!bind_embeddings(ld)) return false;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    m->views = calloc((size_t)hp->n_layer * 6, sizeof *m->views);   /* q k v of attn_qkv and of its bias */
    if (!m->layers || !m->views) return sw_errf(ld->err, ld->errlen, "out of memory"), false;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (!bind_block(ld, l, &m->layers[l])) return false;
        m->weight_bytes += block_bytes(&m->layers[l]);
    }
    const uint64_t row = sw_row_size(m->token_embd->type, hp->n_embd);
    m->weight_bytes += row + m->embd_norm->nbytes + m->embd_norm_b->nbytes +
                       (m->token_types ? sw_row_size(m->token_types->type, hp->n_embd) : 0) +
                       (m->pos_embd ? sw_row_size(m->pos_embd->type, hp->n_embd) : 0);
    return true;
}
