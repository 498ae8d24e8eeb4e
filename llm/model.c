/* Loading a GGUF model: Llama's graph and its Qwen2/Qwen3/Phi-3/Gemma
 * variants (the BERT-family encoders' tensors: model_encoder.c).
 *
 * Nothing is copied: tensors stay in the reader's mmap. Everything the forward
 * pass will touch is validated here (presence, dimensions, element type,
 * consistency with the hyperparameters), with an error that names the tensor
 * or key, so a bad file fails at load and never inside compute.
 */
#include "llm/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include "llm/util.h"
#include "llm/model_impl.h"

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
    case SW_TYPE_Q8_0: case SW_TYPE_Q4_K: case SW_TYPE_Q5_K: case SW_TYPE_Q6_K: case SW_TYPE_MXFP4:
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

/* Finds a tensor and checks its shape (ne1 = 0 means 1-D, ne2 > 0 a stack
 * of ne2 matrices: the experts of a mixture) and that its type is usable:
 * matrices by the kernels, vectors (norms) as float. */
static const gguf_tensor *need(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                               bool optional, char *err, size_t errlen)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        if (!optional) sw_errf(err, errlen, "missing tensor '%s'", name);
        return NULL;
    }
    uint32_t want_dims = ne2 ? 3 : ne1 ? 2 : 1;
    /* Trailing dimensions of 1 are harmless (some writers store n_dims 2 for vectors). */
    for (uint32_t d = want_dims; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != 1) {
            sw_errf(err, errlen, "tensor '%s': expected %u dimension(s), dimension %u is %llu",
                   name, want_dims, d, (unsigned long long)t->ne[d]);
            return NULL;
        }
    }
    if (ne2 && t->ne[2] != ne2) {
        sw_errf(err, errlen, "tensor '%s': %llu experts, expected %llu", name, (unsigned long long)t->ne[2],
                (unsigned long long)ne2);
        return NULL;
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
        sw_errf(err, errlen, "tensor '%s': vectors (norms, biases) must be f32/f16/bf16, not %s", name, tr->name);
        return NULL;
    }
    if (t->ne[0] % tr->block_size) {
        sw_errf(err, errlen, "tensor '%s': row length %llu is not a multiple of the %s block size %u",
               name, (unsigned long long)t->ne[0], tr->name, tr->block_size);
        return NULL;
    }
    uint64_t rows = (ne1 ? ne1 : 1) * (ne2 ? ne2 : 1);
    uint64_t rs = sw_row_size(t->type, t->ne[0]);
    if (rs == 0 || t->nbytes < rs * rows) {
        sw_errf(err, errlen, "tensor '%s': data size %llu too small for its shape", name,
               (unsigned long long)t->nbytes);
        return NULL;
    }
    return t;
}

/* Reads an integer hyperparameter "<arch>.<key>". */
bool sw_hp_u32(const gguf_file *f, const char *arch, const char *key, uint32_t *out,
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

/* Reads an optional float hyperparameter "<arch>.<key>" (absent: keeps *out). */
bool sw_hp_f32(const gguf_file *f, const char *arch, const char *key, float *out, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_find(f, full) || gguf_get_f32(f, full, out)) return true;
    sw_errf(err, errlen, "metadata '%s': not a number", full);
    return false;
}

/* RoPE scaling. Linear scaling divides positions by its factor (also
 * llama.cpp's reading of a factor without a type). YaRN (Qwen's long-context
 * files) interpolates the low frequencies by the factor, keeps the high
 * ones, ramps between them, and scales the rotated dims up by
 * 1 + 0.1 ln(factor): the YaRN paper's definition, with llama.cpp's keys
 * and defaults (the original context, beta_fast 32, beta_slow 1). LongRoPE
 * and YaRN's DeepSeek log-multiplier variant compute otherwise: refused. */
static bool read_rope_scaling(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen)
{
    char key[128], type[16] = "linear";
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_find(f, key) && !gguf_get_cstr(f, key, type, sizeof type)) {
        sw_errf(err, errlen, "metadata '%s': not a short string", key);
        return false;
    }
    const bool yarn = !strcmp(type, "yarn");
    if (strcmp(type, "none") && strcmp(type, "linear") && !yarn) {
        sw_errf(err, errlen, "metadata '%s' = '%s': only linear and YaRN RoPE scaling are supported", key, type);
        return false;
    }
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    if (!gguf_find(f, key)) snprintf(key, sizeof key, "%s.rope.scale_linear", arch);   /* the older name */
    if (gguf_find(f, key) && !gguf_get_f32(f, key, &factor)) {
        sw_errf(err, errlen, "metadata '%s': not a number", key);
        return false;
    }
    if (!(factor >= 0.0f && factor <= 1024.0f) || (yarn && factor < 1.0f)) {
        sw_errf(err, errlen, "metadata '%s' = %g out of range", key, factor);
        return false;
    }
    hp->rope_scale = strcmp(type, "none") ? factor : 0.0f;
    /* The rotated dims' magnitude and the original context apply to any
     * scaling (LongRoPE files carry them without a type); YaRN adds to the
     * first below. */
    float attn = 1.0f;
    hp->rope_orig_ctx = hp->n_ctx_train;
    if (!sw_hp_f32(f, arch, "rope.scaling.attn_factor", &attn, err, errlen) ||
        !sw_hp_u32(f, arch, "rope.scaling.original_context_length", &hp->rope_orig_ctx, false, err, errlen))
        return false;
    if (!(attn > 0.0f && attn < 100.0f) || hp->rope_orig_ctx == 0) {
        sw_errf(err, errlen, "metadata '%s.rope.scaling.attn_factor' = %g / 'original_context_length' = %u out of range",
                arch, attn, hp->rope_orig_ctx);
        return false;
    }
    hp->rope_mscale = attn;
    if (!yarn) return true;
    float log_mul = 0.0f, ext = 1.0f;
    hp->rope_yarn = true;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    if (!sw_hp_f32(f, arch, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, err, errlen) ||
        !sw_hp_f32(f, arch, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, err, errlen) ||
        !sw_hp_f32(f, arch, "rope.scaling.yarn_ext_factor", &ext, err, errlen) ||
        !sw_hp_f32(f, arch, "rope.scaling.yarn_log_multiplier", &log_mul, err, errlen))
        return false;
    if (log_mul != 0.0f) {
        sw_errf(err, errlen, "metadata '%s.rope.scaling.yarn_log_multiplier': YaRN with a log multiplier is not supported", arch);
        return false;
    }
    if (!(hp->yarn_beta_fast > 0.0f) || !(hp->yarn_beta_slow > 0.0f) || !(ext >= 0.0f && ext <= 1.0f)) {
        sw_errf(err, errlen, "metadata '%s.rope.scaling.*': YaRN parameters out of range", arch);
        return false;
    }
    hp->yarn_ext_factor = ext;
    /* the rotated dims' magnitude (llama.cpp folds the same into its rope) */
    hp->rope_mscale = attn * (ext > 0.0f && factor > 1.0f ? 1.0f + 0.1f * logf(factor) : 1.0f);
    return true;
}

/* The YaRN correction dim for `rotations` full turns over the original
 * context: the pair index whose wavelength fits them. */
static float yarn_corr_dim(uint32_t n_rot, uint32_t orig_ctx, float rotations, float base)
{
    return (float)n_rot * logf((float)orig_ctx / (rotations * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void sw_rope_freqs(const sw_hparams *hp, const gguf_tensor *freq_factors, bool sliding, float *inv)
{
    const uint32_t half = hp->n_rot / 2;
    const float theta = sliding ? hp->rope_theta_swa : hp->rope_theta;
    const float scale = sliding ? hp->rope_scale_swa : hp->rope_scale;
    const bool yarn = hp->rope_yarn && (!sliding || scale == hp->rope_scale);
    float *factors = freq_factors ? malloc(half * sizeof(float)) : NULL;
    if (factors && !sw_dequantize_row(freq_factors->type, freq_factors->data, factors, half)) {
        free(factors);
        factors = NULL;
    }
    float low = 0.0f, high = 0.0f;
    if (yarn) {
        low = floorf(yarn_corr_dim(hp->n_rot, hp->rope_orig_ctx, hp->yarn_beta_fast, theta));
        high = ceilf(yarn_corr_dim(hp->n_rot, hp->rope_orig_ctx, hp->yarn_beta_slow, theta));
        low = low > 0.0f ? low : 0.0f;
        high = high < (float)(hp->n_rot - 1) ? high : (float)(hp->n_rot - 1);
    }
    for (uint32_t i = 0; i < half; i++) {
        float f = powf(theta, -2.0f * (float)i / (float)hp->n_rot);
        if (factors && factors[i] > 0.0f) f /= factors[i];
        if (yarn) {
            /* 1 keeps pair i's frequency (extrapolates), 0 divides it by the factor */
            float y = ((float)i - low) / (high - low > 0.001f ? high - low : 0.001f);
            float keep = (1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y)) * hp->yarn_ext_factor;
            f *= (1.0f - keep) / scale + keep;
        } else if (scale > 0.0f) {
            f /= scale;
        }
        inv[i] = f;
    }
    free(factors);
}

const gguf_tensor *sw_rope_factors(const sw_model *m, uint32_t n_ctx)
{
    if (m->rope_freqs || !m->rope_long) return m->rope_freqs;
    return n_ctx > m->hp.rope_orig_ctx ? m->rope_long : m->rope_short;
}

float sw_rope_mscale(const sw_hparams *hp, bool sliding)
{
    return !sliding || hp->rope_scale_swa == hp->rope_scale ? hp->rope_mscale : 1.0f;
}

static bool read_hparams(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    if (!sw_hp_u32(f, arch, "embedding_length", &hp->n_embd, true, err, errlen) ||
        !sw_hp_u32(f, arch, "block_count", &hp->n_layer, true, err, errlen) ||
        !sw_hp_u32(f, arch, "attention.head_count", &hp->n_head, true, err, errlen) ||
        !sw_hp_u32(f, arch, "feed_forward_length", &hp->n_ff, true, err, errlen))
        return false;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if (!sw_hp_u32(f, arch, "attention.head_count_kv", &hp->n_head_kv, false, err, errlen) ||
        !sw_hp_u32(f, arch, "context_length", &hp->n_ctx_train, false, err, errlen))
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

    /* llama.cpp's enum: 4 (rank) scores pairs and is not an embedding. */
    if (!sw_hp_u32(f, arch, "pooling_type", &hp->pooling, false, err, errlen)) return false;
    if (hp->pooling > SW_POOLING_LAST) {
        sw_errf(err, errlen, "metadata '%s.pooling_type' = %u: only none (0), mean (1), cls (2) and last (3) are supported",
                arch, hp->pooling);
        return false;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    uint32_t key_len = 0;
    if (!sw_hp_u32(f, arch, "attention.key_length", &key_len, false, err, errlen)) return false;
    if (key_len) hp->head_dim = key_len;
    if (!key_len && hp->n_embd % hp->n_head) {
        sw_errf(err, errlen, "embedding_length %u is not a multiple of head_count %u", hp->n_embd, hp->n_head);
        return false;
    }
    uint32_t val_len = hp->head_dim;
    if (!sw_hp_u32(f, arch, "attention.value_length", &val_len, false, err, errlen)) return false;
    if (val_len != hp->head_dim) {
        sw_errf(err, errlen, "metadata '%s.attention.value_length' %u != key_length %u (unsupported)", arch, val_len, hp->head_dim);
        return false;
    }
    if (hp->head_dim == 0 || hp->head_dim > SW_MAX_HEAD_DIM || hp->head_dim % 2) {
        sw_errf(err, errlen, "head dimension %u out of range", hp->head_dim);
        return false;
    }
    hp->n_rot = hp->head_dim;
    if (!sw_hp_u32(f, arch, "rope.dimension_count", &hp->n_rot, false, err, errlen)) return false;
    if (hp->n_rot == 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        sw_errf(err, errlen, "metadata '%s.rope.dimension_count' = %u: must be even and <= head dim %u", arch, hp->n_rot, hp->head_dim);
        return false;
    }

    hp->rope_theta = 10000.0f;
    if (!sw_hp_f32(f, arch, "rope.freq_base", &hp->rope_theta, err, errlen)) return false;
    if (!(hp->rope_theta > 0.0f)) { sw_errf(err, errlen, "metadata '%s.rope.freq_base' = %g must be positive", arch, hp->rope_theta); return false; }
    if (!read_rope_scaling(f, arch, hp, err, errlen)) return false;
    hp->rms_eps = 1e-5f;
    if (!sw_hp_f32(f, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, errlen)) return false;
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f)) {
        sw_errf(err, errlen, "metadata '%s.attention.layer_norm_rms_epsilon' = %g out of range", arch, hp->rms_eps);
        return false;
    }
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

/* The graphs this loader knows, and how each differs from Llama's. Facts
 * from the architectures' published definitions, as llama.cpp's GGUF
 * converters lay them out (Gemma's norm weights are stored with its +1
 * already added, so every graph uses the plain RMSNorm). Gemma 2 and 3 keep
 * their 27B models' query scale out of the file: llama.cpp tells those
 * models by their depth (depth_27b), and so does this loader. */
static const sw_arch ARCHS[] = {
    /* name      neox   qk_norm fused_gate_up gelu  scale_embd post_norms softcaps    swa: period width own_rope depth_27b experts        granite nope shexp  oai   olmo2  enc */
    {"llama",    false, false,  false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_ALLOWED, false, 0, false, false, false, 0},
    {"qwen2",    true,  false,  false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_NO,      false, 0, false, false, false, 0},
    {"qwen3",    true,  true,   false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_NO,      false, 0, false, false, false, 0},
    {"qwen2moe", true,  false,  false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_ALWAYS,  false, 0, true, false, false, 0},
    {"qwen3moe", true,  true,   false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_ALWAYS,  false, 0, false, false, false, 0},
    {"phi3",     true,  false,  true,         false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_NO,      false, 0, false, false, false, 0},
    {"gemma",    true,  false,  false,        true,  true,     false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_NO,      false, 0, false, false, false, 0},
    {"gemma2",   true,  false,  false,        true,  true,     true,      50.f, 30.f, 2, 4096, false, 46, SW_MOE_NO,      false, 0, false, false, false, 0},
    {"gemma3",   true,  true,   false,        true,  true,     true,      0.f, 0.f,   6, 0,    true,  62, SW_MOE_NO,      false, 0, false, false, false, 0},
    {"granite",  false, false,  false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_ALLOWED, true,  0, false, false, false, 0},
    {"granitemoe", false, false, false,       false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_ALLOWED, true,  0, false, false, false, 0},
    {"smollm3",  false, false,  false,        false, false,    false,     0.f, 0.f,   0, 0,    false, 0,  SW_MOE_NO,      false, 4, false, false, false, 0},
    {"gpt-oss",  true,  false,  false,        false, false,    false,     0.f, 0.f,   2, 0,    false, 0,  SW_MOE_ALWAYS,  false, 0, false, true, false, 0},
    {"olmo2",    true,  false,  false,        false, false,    true,      0.f, 0.f,   4, 0,    true,  0,  SW_MOE_NO,      false, 0, false, false, true, 0},
    /* the encoders (model_encoder.c): none of the columns above applies but RoPE's pairs */
    {.name = "bert", .encoder = SW_ENC_BERT},
    {.name = "nomic-bert", .rope_neox = true, .encoder = SW_ENC_NOMIC},
};
enum { N_ARCHS = sizeof ARCHS / sizeof ARCHS[0] };

static const sw_arch *find_arch(const char *name)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (!strcmp(ARCHS[i].name, name)) return &ARCHS[i];
    return NULL;
}

/* "llama, qwen2, ..." for the refusal of any other. */
static void arch_list(char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_ARCHS && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", ARCHS[i].name);
}

/* A mixture of experts (Mixtral, whose files say "llama", Qwen2-MoE, Qwen3-MoE
 * and Granite's): how many experts, how many each token uses, their FFN
 * width, and Qwen2-MoE's shared expert. */
static bool read_expert_hparams(const gguf_file *f, const char *arch, const sw_arch *g, sw_hparams *hp, char *err,
                                size_t errlen)
{
    if (!sw_hp_u32(f, arch, "expert_count", &hp->n_expert, false, err, errlen) ||
        !sw_hp_u32(f, arch, "expert_used_count", &hp->n_expert_used, false, err, errlen))
        return false;
    if (hp->n_expert <= 1) {
        hp->n_expert = hp->n_expert_used = 0;
        if (g->experts != SW_MOE_ALWAYS) return true;
        sw_errf(err, errlen, "metadata '%s.expert_count' missing or below 2", arch);
        return false;
    }
    if (g->experts == SW_MOE_NO) {
        sw_errf(err, errlen, "metadata '%s.expert_count' = %u: mixture-of-experts %s models are not supported", arch,
                hp->n_expert, arch);
        return false;
    }
    if (hp->n_expert > 1024 || hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert) {
        sw_errf(err, errlen, "metadata '%s.expert_count' = %u / 'expert_used_count' = %u out of range", arch,
                hp->n_expert, hp->n_expert_used);
        return false;
    }
    /* Qwen3-MoE's experts are n_ff / n_used wide unless the file says (llama.cpp's default too) */
    hp->n_ff_exp = g->experts == SW_MOE_ALWAYS ? hp->n_ff / hp->n_expert_used : hp->n_ff;
    if (!sw_hp_u32(f, arch, "expert_feed_forward_length", &hp->n_ff_exp, false, err, errlen)) return false;
    if (hp->n_ff_exp == 0 || hp->n_ff_exp > 1u << 20) {
        sw_errf(err, errlen, "metadata '%s.expert_feed_forward_length' = %u out of range", arch, hp->n_ff_exp);
        return false;
    }
    hp->expert_renorm = !g->shared_expert;
    if (g->shared_expert) {
        hp->n_ff_shexp = hp->n_ff;   /* llama.cpp's default too */
        if (!sw_hp_u32(f, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, false, err, errlen)) return false;
        if (hp->n_ff_shexp == 0 || hp->n_ff_shexp > 1u << 20) {
            sw_errf(err, errlen, "metadata '%s.expert_shared_feed_forward_length' = %u out of range", arch, hp->n_ff_shexp);
            return false;
        }
    }
    hp->expert_weights_scale = 1.0f;
    if (!sw_hp_f32(f, arch, "expert_weights_scale", &hp->expert_weights_scale, err, errlen)) return false;
    if (hp->expert_weights_scale == 0.0f) hp->expert_weights_scale = 1.0f;   /* 0: unset */
    if (!(hp->expert_weights_scale > 0.0f && hp->expert_weights_scale < 1e6f)) {
        sw_errf(err, errlen, "metadata '%s.expert_weights_scale' = %g out of range", arch, hp->expert_weights_scale);
        return false;
    }
    return true;
}

/* Granite's four multipliers. Each is optional, and 0 means unset (as
 * llama.cpp reads them): the default then stays. */
static bool read_granite_scales(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen)
{
    static const char *const keys[] = {"embedding_scale", "residual_scale", "attention.scale", "logit_scale"};
    float *const dst[] = {&hp->embd_scale, &hp->residual_scale, &hp->attn_scale, &hp->logit_scale};
    for (int i = 0; i < 4; i++) {
        float v = 0.0f;
        if (!sw_hp_f32(f, arch, keys[i], &v, err, errlen)) return false;
        if (v == 0.0f) continue;
        if (!(v > 0.0f && v < 1e6f)) {
            sw_errf(err, errlen, "metadata '%s.%s' = %g out of range (0, 1e6)", arch, keys[i], v);
            return false;
        }
        *dst[i] = v;
    }
    return true;
}

/* What the Gemma 2/3 graphs add to the hyperparameters: the query scale,
 * soft-caps, and RoPE of the sliding layers. Keys that a file carries apply
 * to any architecture; the table gives the defaults. */
static bool read_graph_hparams(const gguf_file *f, const char *arch, const sw_arch *g, sw_hparams *hp, char *err,
                               size_t errlen)
{
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (g->depth_27b && hp->n_layer == g->depth_27b) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->embd_scale = g->scale_embd ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->residual_scale = hp->logit_scale = 1.0f;
    if (g->granite_scales && !read_granite_scales(f, arch, hp, err, errlen)) return false;
    hp->attn_softcap = g->attn_softcap;
    hp->final_softcap = g->final_softcap;
    if (!sw_hp_f32(f, arch, "attn_logit_softcapping", &hp->attn_softcap, err, errlen) ||
        !sw_hp_f32(f, arch, "final_logit_softcapping", &hp->final_softcap, err, errlen))
        return false;
    if (!(hp->attn_softcap >= 0.0f && hp->attn_softcap < 1e6f) || !(hp->final_softcap >= 0.0f && hp->final_softcap < 1e6f)) {
        sw_errf(err, errlen, "metadata '%s.attn_logit_softcapping' / 'final_logit_softcapping' = %g / %g out of range",
                arch, hp->attn_softcap, hp->final_softcap);
        return false;
    }
    /* sliding layers with their own RoPE: base 10000 by default in Gemma 3, the
     * global layers' in OLMo 3 (whose files say olmo2) */
    hp->rope_theta_swa = g->swa_own_rope && !g->olmo2 ? 10000.0f : hp->rope_theta;
    hp->rope_scale_swa = g->swa_own_rope ? 0.0f : hp->rope_scale;
    if (g->swa_own_rope && !sw_hp_f32(f, arch, "rope.freq_base_swa", &hp->rope_theta_swa, err, errlen)) return false;
    if (!(hp->rope_theta_swa > 0.0f)) {
        sw_errf(err, errlen, "metadata '%s.rope.freq_base_swa' = %g must be positive", arch, hp->rope_theta_swa);
        return false;
    }
    return read_expert_hparams(f, arch, g, hp, err, errlen);
}

/* Which layers attend through a sliding window, and how wide it is. Gemma 2
 * has one every other layer (4096 wide unless the file says otherwise),
 * Gemma 3 five in six and OLMo 3 three in four when the file names a
 * window (OLMo 2's files name none). A file's
 * sliding_window_pattern (a period, or one flag per layer) overrides the
 * table. Other architectures' windows are ignored, as llama.cpp does. */
static bool mark_sliding_layers(sw_model *m, char *err, size_t errlen)
{
    const sw_arch *g = m->graph;
    sw_hparams *hp = &m->hp;
    uint32_t period = g->swa_pattern;
    hp->n_swa = g->swa_window;
    if (!period) return true;
    if (!sw_hp_u32(m->file, m->arch, "attention.sliding_window", &hp->n_swa, false, err, errlen)) return false;
    if (!hp->n_swa) return true;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch);
    const gguf_kv *kv = gguf_find(m->file, key);
    if (kv && kv->type == GGUF_VT_ARRAY) {
        if (kv->v.arr.n != hp->n_layer || kv->v.arr.type == GGUF_VT_STRING || kv->v.arr.type == GGUF_VT_FLOAT32 ||
            kv->v.arr.type == GGUF_VT_FLOAT64) {
            sw_errf(err, errlen, "metadata '%s': expected %u integer or boolean flags", key, hp->n_layer);
            return false;
        }
        for (uint32_t l = 0; l < hp->n_layer; l++) m->layers[l].sliding = gguf_arr_int(kv, l) != 0;
        return true;
    }
    if (!sw_hp_u32(m->file, m->arch, "attention.sliding_window_pattern", &period, false, err, errlen)) return false;
    /* of each `period` layers the last one is global; 0 makes them all sliding */
    for (uint32_t l = 0; l < hp->n_layer; l++) m->layers[l].sliding = period == 0 || l % period < period - 1;
    return true;
}

/* SmolLM3 leaves RoPE out of every 4th layer (1-based), on q and k both. */
static void mark_nope_layers(sw_model *m)
{
    const uint32_t period = m->graph->nope_period;
    for (uint32_t l = 0; period && l < m->hp.n_layer; l++) m->layers[l].no_rope = (l + 1) % period == 0;
}

const gguf_tensor *sw_ld_bind(sw_loader *ld, const char *name, uint64_t ne0, uint64_t ne1, bool optional)
{
    const gguf_tensor *t = need(ld->m->file, name, ne0, ne1, 0, optional, ld->err, ld->errlen);
    if (t) ld->used[t - ld->m->file->tensors] = true;
    return t;
}

const gguf_tensor *sw_ld_bindf(sw_loader *ld, uint64_t ne0, uint64_t ne1, bool optional, const char *fmt, uint32_t l)
{
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return sw_ld_bind(ld, name, ne0, ne1, optional);
}

/* A stack of n_expert matrices [ne0, ne1] of layer l, as n_expert views. */
static const gguf_tensor *bind_experts(sw_loader *ld, uint64_t ne0, uint64_t ne1, const char *fmt, uint32_t l)
{
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    sw_model *m = ld->m;
    const uint32_t ne = m->hp.n_expert;
    const gguf_tensor *t = need(m->file, name, ne0, ne1, ne, false, ld->err, ld->errlen);
    if (!t) return NULL;
    ld->used[t - m->file->tensors] = true;
    const size_t bytes = ne1 * sw_row_size(t->type, ne0);
    gguf_tensor *v = &m->views[m->n_views];
    m->n_views += ne;
    for (uint32_t e = 0; e < ne; e++) {
        v[e] = *t;
        snprintf(v[e].name, sizeof v[e].name, "%.100s[%u]", t->name, e);
        v[e].data = (const uint8_t *)t->data + e * bytes;
        v[e].ne[2] = 1;
        v[e].n_dims = 2;
        v[e].nbytes = bytes;
    }
    return v;
}

/* Rows [r0, r0 + n) of matrix t, or elements [r0, r0 + n) of vector t, as a
 * tensor of their own: how fused tensors are split. */
const gguf_tensor *sw_ld_split(sw_model *m, const gguf_tensor *t, uint64_t r0, uint64_t n, const char *part)
{
    gguf_tensor *v = &m->views[m->n_views++];
    *v = *t;
    snprintf(v->name, sizeof v->name, "%.100s[%s]", t->name, part);
    if (t->ne[1] > 1) {
        size_t rs = sw_row_size(t->type, t->ne[0]);
        v->data = (const uint8_t *)t->data + r0 * rs;
        v->ne[1] = n;
        v->nbytes = n * rs;
    } else {
        v->data = (const uint8_t *)t->data + sw_row_size(t->type, r0);
        v->ne[0] = n;
        v->nbytes = sw_row_size(t->type, n);
    }
    return v;
}

/* q, k and v of layer l: three tensors, or one fused attn_qkv; biases
 * likewise, each optional. */
bool sw_ld_bind_qkv(sw_loader *ld, uint32_t l, sw_layer *L)
{
    const sw_hparams *hp = &ld->m->hp;
    const uint64_t E = hp->n_embd, QD = (uint64_t)hp->n_head * hp->head_dim, KVD = (uint64_t)hp->n_head_kv * hp->head_dim;
    sw_model *m = ld->m;
    const gguf_tensor *qkv = sw_ld_bindf(ld, E, QD + 2 * KVD, true, "blk.%u.attn_qkv.weight", l);
    if (ld->err[0]) return false;
    if (qkv) {
        L->wq = sw_ld_split(m, qkv, 0, QD, "q");
        L->wk = sw_ld_split(m, qkv, QD, KVD, "k");
        L->wv = sw_ld_split(m, qkv, QD + KVD, KVD, "v");
    } else if (!(L->wq = sw_ld_bindf(ld, E, QD, false, "blk.%u.attn_q.weight", l)) ||
               !(L->wk = sw_ld_bindf(ld, E, KVD, false, "blk.%u.attn_k.weight", l)) ||
               !(L->wv = sw_ld_bindf(ld, E, KVD, false, "blk.%u.attn_v.weight", l))) {
        return false;
    }
    const gguf_tensor *b = sw_ld_bindf(ld, QD + 2 * KVD, 0, true, "blk.%u.attn_qkv.bias", l);
    if (ld->err[0]) return false;
    if (b) {
        L->bq = sw_ld_split(m, b, 0, QD, "q");
        L->bk = sw_ld_split(m, b, QD, KVD, "k");
        L->bv = sw_ld_split(m, b, QD + KVD, KVD, "v");
        return true;
    }
    L->bq = sw_ld_bindf(ld, QD, 0, true, "blk.%u.attn_q.bias", l);
    if (!ld->err[0]) L->bk = sw_ld_bindf(ld, KVD, 0, true, "blk.%u.attn_k.bias", l);
    if (!ld->err[0]) L->bv = sw_ld_bindf(ld, KVD, 0, true, "blk.%u.attn_v.bias", l);
    return !ld->err[0];
}

static bool bind_layer(sw_loader *ld, uint32_t l, sw_layer *L)
{
    const sw_hparams *hp = &ld->m->hp;
    const sw_arch *a = ld->m->graph;
    const uint64_t E = hp->n_embd, F = hp->n_ff, QD = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t KVD = (uint64_t)hp->n_head_kv * hp->head_dim;
    /* OLMo 2 has no input norms: its q and k norms span all heads */
    if (a->olmo2 ? !(L->q_norm = sw_ld_bindf(ld, QD, 0, false, "blk.%u.attn_q_norm.weight", l)) ||
                       !(L->k_norm = sw_ld_bindf(ld, KVD, 0, false, "blk.%u.attn_k_norm.weight", l))
                 : !(L->attn_norm = sw_ld_bindf(ld, E, 0, false, "blk.%u.attn_norm.weight", l)) ||
                       !(L->ffn_norm = sw_ld_bindf(ld, E, 0, false, a->oai_moe ? "blk.%u.post_attention_norm.weight"
                                                                          : "blk.%u.ffn_norm.weight", l)))
        return false;
    if (!sw_ld_bind_qkv(ld, l, L) || !(L->wo = sw_ld_bindf(ld, QD, E, false, "blk.%u.attn_output.weight", l)) ||
        (!hp->n_expert && !(L->w_down = sw_ld_bindf(ld, F, E, false, "blk.%u.ffn_down.weight", l))))
        return false;
    L->bo = sw_ld_bindf(ld, E, 0, true, "blk.%u.attn_output.bias", l);
    if (!ld->err[0]) L->sinks = sw_ld_bindf(ld, hp->n_head, 0, true, "blk.%u.attn_sinks.weight", l);
    if (ld->err[0]) return false;
    if (a->qk_norm && (!(L->q_norm = sw_ld_bindf(ld, hp->head_dim, 0, false, "blk.%u.attn_q_norm.weight", l)) ||
                       !(L->k_norm = sw_ld_bindf(ld, hp->head_dim, 0, false, "blk.%u.attn_k_norm.weight", l))))
        return false;
    if (a->post_norms && (!(L->post_attn_norm = sw_ld_bindf(ld, E, 0, false, "blk.%u.post_attention_norm.weight", l)) ||
                          !(L->post_ffn_norm = sw_ld_bindf(ld, E, 0, false, "blk.%u.post_ffw_norm.weight", l))))
        return false;
    if (hp->n_expert) {
        const uint64_t FE = hp->n_ff_exp, FS = hp->n_ff_shexp;
        if (FS && (!(L->gate_inp_shexp = sw_ld_bindf(ld, E, 0, false, "blk.%u.ffn_gate_inp_shexp.weight", l)) ||
                   !(L->w_gate = sw_ld_bindf(ld, E, FS, false, "blk.%u.ffn_gate_shexp.weight", l)) ||
                   !(L->w_up = sw_ld_bindf(ld, E, FS, false, "blk.%u.ffn_up_shexp.weight", l)) ||
                   !(L->w_down = sw_ld_bindf(ld, FS, E, false, "blk.%u.ffn_down_shexp.weight", l))))
            return false;
        const uint64_t NE = hp->n_expert;
        L->gate_inp_b = sw_ld_bindf(ld, NE, 0, true, "blk.%u.ffn_gate_inp.bias", l);
        if (!ld->err[0]) L->gate_exps_b = sw_ld_bindf(ld, FE, NE, true, "blk.%u.ffn_gate_exps.bias", l);
        if (!ld->err[0]) L->up_exps_b = sw_ld_bindf(ld, FE, NE, true, "blk.%u.ffn_up_exps.bias", l);
        if (!ld->err[0]) L->down_exps_b = sw_ld_bindf(ld, E, NE, true, "blk.%u.ffn_down_exps.bias", l);
        if (ld->err[0]) return false;
        return (L->gate_inp = sw_ld_bindf(ld, E, NE, false, "blk.%u.ffn_gate_inp.weight", l)) &&
               (L->gate_exps = bind_experts(ld, E, FE, "blk.%u.ffn_gate_exps.weight", l)) &&
               (L->up_exps = bind_experts(ld, E, FE, "blk.%u.ffn_up_exps.weight", l)) &&
               (L->down_exps = bind_experts(ld, FE, E, "blk.%u.ffn_down_exps.weight", l));
    }
    if (a->fused_gate_up) {
        const gguf_tensor *gu = sw_ld_bindf(ld, E, 2 * F, false, "blk.%u.ffn_up.weight", l);
        if (!gu) return false;
        L->w_gate = sw_ld_split(ld->m, gu, 0, F, "gate");
        L->w_up = sw_ld_split(ld->m, gu, F, F, "up");
        return true;
    }
    return (L->w_gate = sw_ld_bindf(ld, E, F, false, "blk.%u.ffn_gate.weight", l)) &&
           (L->w_up = sw_ld_bindf(ld, E, F, false, "blk.%u.ffn_up.weight", l));
}

uint64_t sw_expert_bytes(const sw_layer *L, uint32_t e)
{
    return L->gate_exps[e].nbytes + L->up_exps[e].nbytes + L->down_exps[e].nbytes;
}

/* Bytes of the layer one token reads but the experts (its router included). */
static uint64_t layer_bytes(const sw_layer *L)
{
    const gguf_tensor *ts[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up,
                               L->w_down, L->bq, L->bk, L->bv, L->q_norm, L->k_norm, L->post_attn_norm,
                               L->post_ffn_norm, L->gate_inp, L->gate_inp_shexp, L->bo, L->sinks, L->gate_inp_b};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) n += ts[i] ? ts[i]->nbytes : 0;
    return n;
}

/* The optional per-layer tensors the graph reads as "the model has them"
 * (from layer 0) must be in every layer or in none; the experts' three
 * biases come together, as gate's (entry `with`) does. */
static bool same_in_every_layer(sw_loader *ld)
{
    static const struct { size_t at; const char *name; int with; } opt[] = {
        {offsetof(sw_layer, bo), "attn_output.bias", 0},          {offsetof(sw_layer, sinks), "attn_sinks.weight", 1},
        {offsetof(sw_layer, gate_inp_b), "ffn_gate_inp.bias", 2}, {offsetof(sw_layer, gate_exps_b), "ffn_gate_exps.bias", 3},
        {offsetof(sw_layer, up_exps_b), "ffn_up_exps.bias", 3},   {offsetof(sw_layer, down_exps_b), "ffn_down_exps.bias", 3},
    };
    const sw_model *m = ld->m;
#define HAS(l, k) (*(const gguf_tensor *const *)((const char *)&m->layers[l] + opt[k].at) != NULL)
    for (size_t k = 0; k < sizeof opt / sizeof opt[0]; k++) {
        const bool want = HAS(0, opt[k].with);
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            if (HAS(l, k) != want) {
                sw_errf(ld->err, ld->errlen, "tensor 'blk.%u.%s' %s, but 'blk.0.%s' is %s", l, opt[k].name,
                        want ? "missing" : "present", opt[opt[k].with].name, want ? "present" : "missing");
                return false;
            }
    }
#undef HAS
    return true;
}

static bool bind_tensors(sw_loader *ld)
{
    sw_model *m = ld->m;
    const gguf_file *f = m->file;
    sw_hparams *hp = &m->hp;
    const gguf_tensor *e = gguf_find_tensor(f, "token_embd.weight");
    if (!e) { sw_errf(ld->err, ld->errlen, "missing tensor 'token_embd.weight'"); return false; }
    if (e->ne[1] == 0 || e->ne[1] > (1u << 24)) {
        sw_errf(ld->err, ld->errlen, "tensor 'token_embd.weight': vocabulary size %llu out of range",
                (unsigned long long)e->ne[1]);
        return false;
    }
    hp->n_vocab = (uint32_t)e->ne[1];
    const uint64_t E = hp->n_embd, V = hp->n_vocab;

    if (!(m->token_embd = sw_ld_bind(ld, "token_embd.weight", E, V, false))) return false;
    if (!(m->output_norm = sw_ld_bind(ld, "output_norm.weight", E, 0, false))) return false;
    m->output = sw_ld_bind(ld, "output.weight", E, V, true);
    if (ld->err[0]) return false;            /* present but invalid */
    if (!m->output) {
        m->output = m->token_embd;           /* tied embeddings */
        m->tied_output = true;
    }
    m->output_bias = sw_ld_bind(ld, "output.bias", V, 0, true);
    m->rope_freqs = sw_ld_bind(ld, "rope_freqs.weight", hp->n_rot / 2, 0, true);
    if (!ld->err[0]) m->rope_long = sw_ld_bind(ld, "rope_factors_long.weight", hp->n_rot / 2, 0, true);
    if (!ld->err[0]) m->rope_short = sw_ld_bind(ld, "rope_factors_short.weight", hp->n_rot / 2, 0, true);
    if (!ld->err[0] && !m->rope_long != !m->rope_short) {
        sw_errf(ld->err, ld->errlen, "tensor 'rope_factors_%s.weight' without 'rope_factors_%s.weight'",
                m->rope_long ? "long" : "short", m->rope_long ? "short" : "long");
        return false;
    }
    if (ld->err[0]) return false;

    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    /* q k v, their biases, gate up; the experts */
    m->views = calloc((size_t)hp->n_layer * (8 + 3 * (size_t)hp->n_expert), sizeof *m->views);
    if (!m->layers || !m->views) { sw_errf(ld->err, ld->errlen, "out of memory"); return false; }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (!bind_layer(ld, l, &m->layers[l])) return false;
        m->weight_bytes += layer_bytes(&m->layers[l]);
        if (hp->n_expert) m->expert_bytes += hp->n_expert_used * sw_expert_bytes(&m->layers[l], 0);
    }
    if (!same_in_every_layer(ld)) return false;
    m->weight_bytes += m->expert_bytes + m->output->nbytes + m->output_norm->nbytes +
                       sw_row_size(m->token_embd->type, E) + (m->output_bias ? m->output_bias->nbytes : 0);
    return true;
}

/* Whether the graph reads every tensor of the file (see sw_loader). */
static bool all_used(const sw_loader *ld)
{
    const gguf_file *f = ld->m->file;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (!ld->used[i]) {
            sw_errf(ld->err, ld->errlen, "tensor '%s' is not part of the '%s' graph as implemented here; "
                    "refusing to compute without it", f->tensors[i].name, ld->m->arch);
            return false;
        }
    }
    return true;
}

static bool load_tensors(sw_model *m, char *err, size_t errlen)
{
    m->hp.rope_neox = m->graph->rope_neox;
    sw_loader ld = {m, calloc(m->file->n_tensors + 1, sizeof(bool)), err, errlen};
    if (!ld.used) { sw_errf(err, errlen, "out of memory"); return false; }
    err[0] = 0;
    bool ok = (sw_model_is_encoder(m) ? sw_encoder_bind(&ld) : bind_tensors(&ld)) && all_used(&ld);
    free(ld.used);
    return ok;
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
    /* Other architectures differ in ways (norms, attention, activations)
     * that would compute silently wrong logits: refuse them by name. */
    if (!(m->graph = find_arch(m->arch))) {
        char names[256];
        arch_list(names, sizeof names);
        sw_errf(err, errlen, "%s: architecture '%s' is not supported (supported: %s)", path, m->arch, names);
        goto fail;
    }
    if (!read_hparams(m->file, m->arch, &m->hp, ebuf, sizeof ebuf) ||
        !read_graph_hparams(m->file, m->arch, m->graph, &m->hp, ebuf, sizeof ebuf) ||
        (sw_model_is_encoder(m) && !sw_encoder_hparams(m->file, m->arch, &m->hp, ebuf, sizeof ebuf)) ||
        !load_tensors(m, ebuf, sizeof ebuf) || !mark_sliding_layers(m, ebuf, sizeof ebuf)) {
        sw_errf(err, errlen, "%s: %s", path, ebuf);
        goto fail;
    }
    mark_nope_layers(m);
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

void sw_model_describe(const sw_model *m, char *buf, size_t len)
{
    const sw_hparams *hp = &m->hp;
    char ffn[64];
    if (hp->n_expert) snprintf(ffn, sizeof ffn, "%u experts of %u, %u used", hp->n_expert, hp->n_ff_exp, hp->n_expert_used);
    else snprintf(ffn, sizeof ffn, "%u", hp->n_ff);
    snprintf(buf, len, "%s, %u layers, dim %u, %u/%u heads, ffn %s, vocab %u, %s", m->arch, hp->n_layer, hp->n_embd,
             hp->n_head, hp->n_head_kv, ffn, hp->n_vocab, m->quant_name);
}

void sw_model_free(sw_model *m)
{
    if (!m) return;
    if (m->tok) sw_tok_free(m->tok);
    free(m->layers);
    free(m->views);
    if (m->file) gguf_close(m->file);
    free(m);
}

const char *sw_pooling_name(uint32_t pooling)
{
    static const char *const names[] = { "none", "mean", "cls", "last" };
    return pooling <= SW_POOLING_LAST ? names[pooling] : "none";
}
