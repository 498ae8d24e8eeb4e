/* Per-tensor type choice for whole-model file types. See quant_mix.h. */
#include "llm/quant_mix.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name; sw_ftype ft; } FTYPES[] = {
    { "f32", SW_FTYPE_ALL_F32 },
    { "f16", SW_FTYPE_MOSTLY_F16 },
    { "q8_0", SW_FTYPE_MOSTLY_Q8_0 },
    { "q4_k_m", SW_FTYPE_MOSTLY_Q4_K_M },
};

bool sw_ftype_parse(const char *s, sw_ftype *out)
{
    for (size_t i = 0; s && i < sizeof FTYPES / sizeof FTYPES[0]; i++)
        if (!strcasecmp(s, FTYPES[i].name)) { *out = FTYPES[i].ft; return true; }
    return false;
}

const char *sw_ftype_name(sw_ftype ft)
{
    for (size_t i = 0; i < sizeof FTYPES / sizeof FTYPES[0]; i++)
        if (FTYPES[i].ft == ft) return FTYPES[i].name;
    return "unknown";
}

bool sw_mix_more_bits(uint32_t layer, uint32_t n_layers)
{
    uint32_t eighth = n_layers / 8;
    return layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2;
}

/* Layer number from "blk.N.", or -1. */
static long layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4)) return -1;
    char *end;
    long n = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && n >= 0 ? n : -1;
}

static bool has_suffix_part(const char *name, const char *part)
{
    return strstr(name, part) != NULL;
}

/* Walks the fallback chain until the row length fits the block size. */
static sw_type fit_row(sw_type t, uint64_t ne0)
{
    for (;;) {
        const sw_type_traits *tr = sw_type_info(t);
        if (tr && ne0 % tr->block_size == 0) return t;
        switch (t) {
        case SW_TYPE_Q4_K: t = SW_TYPE_Q5_0; break;
        case SW_TYPE_Q6_K: t = SW_TYPE_Q8_0; break;
        case SW_TYPE_Q8_0: case SW_TYPE_Q5_0: t = SW_TYPE_F16; break;
        default: return SW_TYPE_F32;
        }
    }
}

sw_type sw_mix_type(sw_ftype ft, const char *name, uint32_t n_dims, const uint64_t *ne, const sw_mix_model *mm)
{
    /* vectors, tensors that are not weights (gpt-oss's 2-D expert biases:
     * llama.cpp quantizes only names ending in "weight"), and a mixture's
     * router (small, and it picks the experts: llama.cpp keeps it in float too) */
    size_t len = strlen(name);
    if (n_dims < 2 || len < 6 || strcmp(name + len - 6, "weight") != 0 || has_suffix_part(name, ".ffn_gate_inp."))
        return SW_TYPE_F32;
    sw_type t;
    switch (ft) {
    case SW_FTYPE_ALL_F32: return SW_TYPE_F32;
    case SW_FTYPE_MOSTLY_F16: return SW_TYPE_F16;
    case SW_FTYPE_MOSTLY_Q8_0: t = SW_TYPE_Q8_0; break;
    case SW_FTYPE_MOSTLY_Q4_K_M: {
        long layer = layer_of(name);
        bool attn_v = has_suffix_part(name, ".attn_v.") || has_suffix_part(name, ".attn_qkv.");
        bool more = layer >= 0 && (attn_v || has_suffix_part(name, ".ffn_down.") ||
                                   has_suffix_part(name, ".ffn_down_exps.") || has_suffix_part(name, ".ffn_down_shexp."))
                    && sw_mix_more_bits((uint32_t)layer, mm->n_layers);
        bool output = !strcmp(name, "output.weight") || (mm->tied_output && !strcmp(name, "token_embd.weight"));
        t = more || output ? SW_TYPE_Q6_K : SW_TYPE_Q4_K;
        if (mm->n_expert == 8 && (attn_v || has_suffix_part(name, ".attn_k."))) t = SW_TYPE_Q8_0;
        if (mm->n_expert == 8 && has_suffix_part(name, ".attn_output.")) t = SW_TYPE_Q5_K;
        break;
    }
    default: return SW_TYPE_F32;
    }
    return fit_row(t, ne[0]);
}

bool sw_quantize_rows(sw_type type, uint64_t ne0, uint64_t rows, void *dst,
                      bool (*row)(void *ctx, uint64_t r, float *x), void *ctx)
{
    size_t row_bytes = sw_row_size(type, ne0);
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *x = malloc(ne0 * sizeof *x);
        if (!x) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)rows; r++) {
            if (!x || failed) continue;
            if (!row(ctx, (uint64_t)r, x) ||
                !sw_quantize_row(type, x, (uint8_t *)dst + (uint64_t)r * row_bytes, (int64_t)ne0))
                failed = 1;
        }
        free(x);
    }
    return !failed;
}
