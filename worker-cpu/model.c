/* Loading a Llama-architecture GGUF model.
 *
 * Nothing is copied: tensors stay in the reader's mmap. Everything the forward
 * pass will touch is validated here (presence, dimensions, element type,
 * consistency with the hyperparameters), with an error that names the tensor
 * or key, so a bad file fails at load and never inside compute.
 */
#include "worker-cpu/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/util.h"

const char *sw_file_type_name(uint32_t ftype)
{
    /* llama.cpp's LLAMA_FTYPE numbering, which general.file_type stores. */
    switch (ftype) {
    case 0: return "f32";
    case 1: return "f16";
    case 2: return "q4_0";
    case 3: return "q4_1";
    case 7: return "q8_0";
    case 8: return "q5_0";
    case 9: return "q5_1";
    case 10: return "q2_k";
    case 11: return "q3_k_s";
    case 12: return "q3_k_m";
    case 13: return "q3_k_l";
    case 14: return "q4_k_s";
    case 15: return "q4_k_m";
    case 16: return "q5_k_s";
    case 17: return "q5_k_m";
    case 18: return "q6_k";
    case 32: return "bf16";
    default: return NULL;
    }
}

/* Types the matmul kernels take as weights. */
static bool matmul_type_ok(sw_type t)
{
    switch (t) {
    case SW_TYPE_F32: case SW_TYPE_F16: case SW_TYPE_BF16:
    case SW_TYPE_Q4_0: case SW_TYPE_Q4_1: case SW_TYPE_Q5_0: case SW_TYPE_Q5_1:
    case SW_TYPE_Q8_0: case SW_TYPE_Q4_K: case SW_TYPE_Q5_K: case SW_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

static const char *type_name(sw_type t)
{
    const sw_type_traits *tr = sw_type_info(t);
    return tr ? tr->name : "unknown";
}

/* Finds a tensor and checks its shape (ne1 = 0 means 1-D) and that its type
 * is usable: matrices by the kernels, vectors (norms) as float. */
static const gguf_tensor *need(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
                               bool optional, char *err, size_t errlen)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        if (!optional) sw_errf(err, errlen, "missing tensor '%s'", name);
        return NULL;
    }
    uint32_t want_dims = ne1 ? 2 : 1;
    /* Trailing dimensions of 1 are harmless (some writers store n_dims 2 for vectors). */
    for (uint32_t d = want_dims; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != 1) {
            sw_errf(err, errlen, "tensor '%s': expected %u dimension(s), dimension %u is %llu",
                   name, want_dims, d, (unsigned long long)t->ne[d]);
            return NULL;
        }
    }
    if (t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
        if (ne1)
            sw_errf(err, errlen, "tensor '%s': shape [%llu, %llu], expected [%llu, %llu]", name,
                   (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                   (unsigned long long)ne0, (unsigned long long)ne1);
        else
            sw_errf(err, errlen, "tensor '%s': length %llu, expected %llu", name,
                   (unsigned long long)t->ne[0], (unsigned long long)ne0);
        return NULL;
    }
    const sw_type_traits *tr = sw_type_info(t->type);
    if (!tr) {
        sw_errf(err, errlen, "tensor '%s': unsupported type id %u", name, (unsigned)t->type);
        return NULL;
    }
    if (ne1) {
        if (!matmul_type_ok(t->type)) {
            sw_errf(err, errlen, "tensor '%s': type %s is not supported for matrices", name, tr->name);
            return NULL;
        }
    } else if (t->type != SW_TYPE_F32 && t->type != SW_TYPE_F16 && t->type != SW_TYPE_BF16) {
        sw_errf(err, errlen, "tensor '%s': norm weights must be f32/f16/bf16, not %s", name, tr->name);
        return NULL;
    }
    if (t->ne[0] % tr->block_size) {
        sw_errf(err, errlen, "tensor '%s': row length %llu is not a multiple of the %s block size %u",
               name, (unsigned long long)t->ne[0], tr->name, tr->block_size);
        return NULL;
    }
    uint64_t rows = ne1 ? ne1 : 1;
    uint64_t rs = sw_row_size(t->type, t->ne[0]);
    if (rs == 0 || t->nbytes < rs * rows) {
        sw_errf(err, errlen, "tensor '%s': data size %llu too small for its shape", name,
               (unsigned long long)t->nbytes);
        return NULL;
    }
    return t;
}

/* Reads an integer hyperparameter "<arch>.<key>". */
static bool hp_u32(const gguf_file *f, const char *arch, const char *key, uint32_t *out,
                   bool required, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (gguf_get_u32(f, full, out)) return true;
    if (gguf_find(f, full))
        sw_errf(err, errlen, "metadata '%s': not an unsigned 32-bit integer", full);
    else if (required)
        sw_errf(err, errlen, "metadata '%s' missing", full);
    else
        return true;   /* optional and absent: keep the default */
    return false;
}

static bool read_hparams(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    if (!hp_u32(f, arch, "embedding_length", &hp->n_embd, true, err, errlen) ||
        !hp_u32(f, arch, "block_count", &hp->n_layer, true, err, errlen) ||
        !hp_u32(f, arch, "attention.head_count", &hp->n_head, true, err, errlen) ||
        !hp_u32(f, arch, "feed_forward_length", &hp->n_ff, true, err, errlen))
        return false;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if (!hp_u32(f, arch, "attention.head_count_kv", &hp->n_head_kv, false, err, errlen) ||
        !hp_u32(f, arch, "context_length", &hp->n_ctx_train, false, err, errlen))
        return false;

    /* Sanity limits: far beyond any real model, small enough that size
     * arithmetic below cannot overflow. */
    if (hp->n_embd == 0 || hp->n_embd > 65536) { sw_errf(err, errlen, "metadata '%s.embedding_length' = %u out of range", arch, hp->n_embd); return false; }
    if (hp->n_layer == 0 || hp->n_layer > 1024) { sw_errf(err, errlen, "metadata '%s.block_count' = %u out of range", arch, hp->n_layer); return false; }
    if (hp->n_head == 0 || hp->n_head > 1024) { sw_errf(err, errlen, "metadata '%s.attention.head_count' = %u out of range", arch, hp->n_head); return false; }
    if (hp->n_head_kv == 0 || hp->n_head_kv > hp->n_head || hp->n_head % hp->n_head_kv) {
        sw_errf(err, errlen, "metadata '%s.attention.head_count_kv' = %u: must divide head_count %u", arch, hp->n_head_kv, hp->n_head);
        return false;
    }
    if (hp->n_ff == 0 || hp->n_ff > 1u << 20) { sw_errf(err, errlen, "metadata '%s.feed_forward_length' = %u out of range", arch, hp->n_ff); return false; }
    if (hp->n_ctx_train == 0 || hp->n_ctx_train > 1u << 24) { sw_errf(err, errlen, "metadata '%s.context_length' = %u out of range", arch, hp->n_ctx_train); return false; }

    hp->head_dim = hp->n_embd / hp->n_head;
    uint32_t key_len = 0;
    if (!hp_u32(f, arch, "attention.key_length", &key_len, false, err, errlen)) return false;
    if (key_len) hp->head_dim = key_len;
    if (!key_len && hp->n_embd % hp->n_head) {
        sw_errf(err, errlen, "embedding_length %u is not a multiple of head_count %u", hp->n_embd, hp->n_head);
        return false;
    }
    uint32_t val_len = hp->head_dim;
    if (!hp_u32(f, arch, "attention.value_length", &val_len, false, err, errlen)) return false;
    if (val_len != hp->head_dim) {
        sw_errf(err, errlen, "metadata '%s.attention.value_length' %u != key_length %u (unsupported)", arch, val_len, hp->head_dim);
        return false;
    }
    if (hp->head_dim == 0 || hp->head_dim > 1024 || hp->head_dim % 2) {
        sw_errf(err, errlen, "head dimension %u out of range", hp->head_dim);
        return false;
    }
    hp->n_rot = hp->head_dim;
    if (!hp_u32(f, arch, "rope.dimension_count", &hp->n_rot, false, err, errlen)) return false;
    if (hp->n_rot == 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        sw_errf(err, errlen, "metadata '%s.rope.dimension_count' = %u: must be even and <= head dim %u", arch, hp->n_rot, hp->head_dim);
        return false;
    }

    char key[128];
    hp->rope_theta = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (gguf_find(f, key) && !gguf_get_f32(f, key, &hp->rope_theta)) {
        sw_errf(err, errlen, "metadata '%s': not a number", key);
        return false;
    }
    if (!(hp->rope_theta > 0.0f)) { sw_errf(err, errlen, "metadata '%s' = %g must be positive", key, hp->rope_theta); return false; }
    hp->rms_eps = 1e-5f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if (gguf_find(f, key) && !gguf_get_f32(f, key, &hp->rms_eps)) {
        sw_errf(err, errlen, "metadata '%s': not a number", key);
        return false;
    }
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f)) { sw_errf(err, errlen, "metadata '%s' = %g out of range", key, hp->rms_eps); return false; }
    return true;
}

static void pick_quant_name(sw_model *m)
{
    uint32_t ft;
    const char *n = NULL;
    if (gguf_get_u32(m->file, "general.file_type", &ft)) n = sw_file_type_name(ft);
    if (!n) {
        /* No (known) file type: name it after the type holding most weight bytes. */
        uint64_t bytes[SW_TYPE_COUNT] = {0};
        for (uint64_t i = 0; i < m->file->n_tensors; i++) {
            const gguf_tensor *t = &m->file->tensors[i];
            if ((unsigned)t->type < SW_TYPE_COUNT && t->ne[1] > 1) bytes[t->type] += t->nbytes;
        }
        int best = 0;
        for (int t = 1; t < SW_TYPE_COUNT; t++) if (bytes[t] > bytes[best]) best = t;
        n = type_name((sw_type)best);
    }
    snprintf(m->quant_name, sizeof m->quant_name, "%s", n);
    for (char *p = m->quant_name; *p; p++) if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
}

static bool load_tensors(sw_model *m, char *err, size_t errlen)
{
    const gguf_file *f = m->file;
    sw_hparams *hp = &m->hp;
    const gguf_tensor *e = gguf_find_tensor(f, "token_embd.weight");
    if (!e) { sw_errf(err, errlen, "missing tensor 'token_embd.weight'"); return false; }
    if (e->ne[1] == 0 || e->ne[1] > (1u << 24)) {
        sw_errf(err, errlen, "tensor 'token_embd.weight': vocabulary size %llu out of range", (unsigned long long)e->ne[1]);
        return false;
    }
    hp->n_vocab = (uint32_t)e->ne[1];
    uint64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
    uint64_t QD = (uint64_t)hp->n_head * hp->head_dim, KVD = (uint64_t)hp->n_head_kv * hp->head_dim;

    if (!(m->token_embd = need(f, "token_embd.weight", E, V, false, err, errlen))) return false;
    if (!(m->output_norm = need(f, "output_norm.weight", E, 0, false, err, errlen))) return false;
    err[0] = 0;
    m->output = need(f, "output.weight", E, V, true, err, errlen);
    if (!m->output) {
        if (err[0]) return false;      /* present but invalid */
        m->output = m->token_embd;     /* tied embeddings */
        m->tied_output = true;
    }
    err[0] = 0;
    m->rope_freqs = need(f, "rope_freqs.weight", hp->n_rot / 2, 0, true, err, errlen);
    if (!m->rope_freqs && err[0]) return false;

    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers) { sw_errf(err, errlen, "out of memory"); return false; }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        sw_layer *L = &m->layers[l];
        char name[96];
#define NEED(field, suffix, a, b) \
        snprintf(name, sizeof name, "blk.%u." suffix ".weight", l); \
        if (!(L->field = need(f, name, a, b, false, err, errlen))) return false;
        NEED(attn_norm, "attn_norm", E, 0);
        NEED(wq, "attn_q", E, QD);
        NEED(wk, "attn_k", E, KVD);
        NEED(wv, "attn_v", E, KVD);
        NEED(wo, "attn_output", QD, E);
        NEED(ffn_norm, "ffn_norm", E, 0);
        NEED(w_gate, "ffn_gate", E, F);
        NEED(w_up, "ffn_up", E, F);
        NEED(w_down, "ffn_down", F, E);
#undef NEED
        m->weight_bytes += L->wq->nbytes + L->wk->nbytes + L->wv->nbytes + L->wo->nbytes +
                           L->w_gate->nbytes + L->w_up->nbytes + L->w_down->nbytes +
                           L->attn_norm->nbytes + L->ffn_norm->nbytes;
    }
    m->weight_bytes += m->output->nbytes + m->output_norm->nbytes + sw_row_size(m->token_embd->type, E);
    return true;
}

sw_model *sw_model_load(const char *path, char *err, size_t errlen)
{
    char ebuf[512];
    ebuf[0] = 0;
    sw_model *m = calloc(1, sizeof *m);
    if (!m) { sw_errf(err, errlen, "out of memory"); return NULL; }
    m->file = gguf_open(path, ebuf, sizeof ebuf);
    if (!m->file) {
        sw_errf(err, errlen, "%s", ebuf);   /* the reader's message names the file */
        free(m);
        return NULL;
    }
    if (!gguf_get_cstr(m->file, "general.architecture", m->arch, sizeof m->arch)) {
        sw_errf(err, errlen, "%s: metadata 'general.architecture' missing or not a short string", path);
        goto fail;
    }
    /* Only Llama's graph is implemented; other architectures differ in ways
     * (biases, norms, rope layout) that would compute silently wrong logits. */
    if (strcmp(m->arch, "llama") != 0) {
        sw_errf(err, errlen, "%s: architecture '%s' is not supported (only 'llama')", path, m->arch);
        goto fail;
    }
    if (!read_hparams(m->file, m->arch, &m->hp, ebuf, sizeof ebuf) ||
        !load_tensors(m, ebuf, sizeof ebuf)) {
        sw_errf(err, errlen, "%s: %s", path, ebuf);
        goto fail;
    }
    m->tok = sw_tok_load(m->file, ebuf, sizeof ebuf);
    if (!m->tok) {
        sw_errf(err, errlen, "%s: tokenizer: %s", path, ebuf);
        goto fail;
    }
    int32_t tv = sw_tok_n_vocab(m->tok);
    if (tv > (int32_t)m->hp.n_vocab) {
        sw_errf(err, errlen, "%s: tokenizer has %d tokens but 'token_embd.weight' only %u rows",
               path, tv, m->hp.n_vocab);
        goto fail;
    }
    m->chat = sw_chat_detect_gguf(m->file);
    pick_quant_name(m);
    return m;
fail:
    sw_model_free(m);
    return NULL;
}

void sw_model_free(sw_model *m)
{
    if (!m) return;
    if (m->tok) sw_tok_free(m->tok);
    free(m->layers);
    if (m->file) gguf_close(m->file);
    free(m);
}
