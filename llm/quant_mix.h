/* Which tensor type each weight gets for a whole-model file type
 * (shared by spillway-synth and spillway-quantize, so both make the same mix).
 *
 * File types are numbered as llama.cpp's general.file_type enum:
 *   0 ALL_F32, 1 MOSTLY_F16, 7 MOSTLY_Q8_0, 15 MOSTLY_Q4_K_M.
 *
 * Rules:
 *  - Tensors with fewer than 2 dimensions (norms, biases) and a mixture's
 *    router (ffn_gate_inp) stay F32.
 *  - f32 / f16 / q8_0: every other weight gets that type.
 *  - q4_k_m: Q6_K for output.weight (or token_embd when the output is tied
 *    to it) and for "more bits" layers of attn_v (a fused attn_qkv too) and
 *    ffn_down (the experts' ffn_down_exps too); Q4_K for everything else.
 *    Models of 8 experts (Mixtral) take Q8_0 for attn_k and attn_v and Q5_K
 *    for attn_output, as llama.cpp gives them. The "more
 *    bits" layers are llama.cpp's published choice: the first n/8 layers, the
 *    last n/8, and every third layer in between ((i - n/8) % 3 == 2), i.e.
 *    about half of them.
 *  - Fallbacks, when a row (ne[0]) is not a multiple of the chosen type's
 *    block: Q4_K -> Q5_0, Q6_K -> Q8_0 (both 32-element blocks; Q5_0 keeps
 *    Q4_K's ~5 bits/weight budget, Q8_0 keeps Q6_K's "more bits"); Q8_0 -> F16
 *    when the row is not even a multiple of 32.
 */
#ifndef SW_QUANT_MIX_H
#define SW_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>
#include "llm/quant.h"

typedef enum {
    SW_FTYPE_ALL_F32 = 0,
    SW_FTYPE_MOSTLY_F16 = 1,
    SW_FTYPE_MOSTLY_Q8_0 = 7,
    SW_FTYPE_MOSTLY_Q4_K_M = 15,
} sw_ftype;

/* "f32", "f16", "q8_0", "q4_k_m" (case-insensitive). False if unknown. */
bool sw_ftype_parse(const char *s, sw_ftype *out);
const char *sw_ftype_name(sw_ftype ft);

/* True for llama.cpp's "use more bits" layers (see above). */
bool sw_mix_more_bits(uint32_t layer, uint32_t n_layers);

/* What the mix needs to know of the whole model. */
typedef struct {
    uint32_t n_layers;
    uint32_t n_expert;     /* experts per layer (0: a dense FFN) */
    bool tied_output;      /* no output.weight: token_embd is the output matrix too */
} sw_mix_model;

/* The type tensor `name` (shape ne[0..n_dims-1]) gets in model mm. Layer
 * numbers come from the "blk.N." name prefix. */
sw_type sw_mix_type(sw_ftype ft, const char *name, uint32_t n_dims, const uint64_t *ne, const sw_mix_model *mm);

/* Writes `rows` rows of ne0 elements of `type` to dst, rows in parallel:
 * row(ctx, r, x) puts row r's ne0 floats in x, which are then quantized.
 * Memory: one float row per thread. False if a row fails (row() returns
 * false or the type cannot hold ne0) or memory runs out. */
bool sw_quantize_rows(sw_type type, uint64_t ne0, uint64_t rows, void *dst,
                      bool (*row)(void *ctx, uint64_t r, float *x), void *ctx);

#endif
