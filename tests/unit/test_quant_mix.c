/* The Q4_K_M type mix (llm/quant_mix.c): the layer rule, the fallbacks, and
 * agreement with the mix llama.cpp chose for a real Q4_K_M file. */
#include "llm/gguf.h"
#include "llm/quant_mix.h"
#include "tests/unit/check.h"

#include <unistd.h>

#pragma GCC diagnostic ignored "-Wformat-zero-length"

static sw_type mix_in(sw_ftype ft, const char *name, uint64_t ne0, sw_mix_model mm)
{
    uint64_t ne[2] = { ne0, 64 };
    return sw_mix_type(ft, name, 2, ne, &mm);
}

static sw_type mix(sw_ftype ft, const char *name, uint64_t ne0, uint32_t n_layers)
{
    return mix_in(ft, name, ne0, (sw_mix_model){ n_layers, 0, false });
}

int main(void)
{
    sw_ftype ft;
    CHECK(sw_ftype_parse("q4_k_m", &ft) && ft == SW_FTYPE_MOSTLY_Q4_K_M);
    CHECK(sw_ftype_parse("Q8_0", &ft) && ft == SW_FTYPE_MOSTLY_Q8_0);
    CHECK(sw_ftype_parse("f16", &ft) && ft == 1);
    CHECK(sw_ftype_parse("f32", &ft) && ft == 0);
    CHECK(!sw_ftype_parse("q4_k", &ft) && !sw_ftype_parse("", &ft) && !sw_ftype_parse(NULL, &ft));
    CHECK(!strcmp(sw_ftype_name(SW_FTYPE_MOSTLY_Q4_K_M), "q4_k_m"));

    /* "About half" of the layers get more bits, first and last eighth included. */
    uint32_t sizes[] = { 2, 4, 16, 32 }, want[] = { 1, 2, 8, 16 };
    for (int s = 0; s < 4; s++) {
        uint32_t n = sizes[s], count = 0;
        for (uint32_t l = 0; l < n; l++) count += sw_mix_more_bits(l, n);
        CHECK(count == want[s], "n_layers %u: %u more-bits layers", n, count);
    }
    CHECK(sw_mix_more_bits(0, 32) && sw_mix_more_bits(3, 32) && !sw_mix_more_bits(4, 32));
    CHECK(sw_mix_more_bits(6, 32) && sw_mix_more_bits(28, 32) && sw_mix_more_bits(31, 32));

    sw_ftype q = SW_FTYPE_MOSTLY_Q4_K_M;
    CHECK(mix(q, "output.weight", 4096, 32) == SW_TYPE_Q6_K);
    CHECK(mix(q, "token_embd.weight", 4096, 32) == SW_TYPE_Q4_K);
    CHECK(mix(q, "blk.0.attn_v.weight", 4096, 32) == SW_TYPE_Q6_K);
    CHECK(mix(q, "blk.4.attn_v.weight", 4096, 32) == SW_TYPE_Q4_K);
    CHECK(mix(q, "blk.6.ffn_down.weight", 14336, 32) == SW_TYPE_Q6_K);
    CHECK(mix(q, "blk.6.ffn_up.weight", 4096, 32) == SW_TYPE_Q4_K);
    CHECK(mix(q, "blk.12.attn_q.weight", 4096, 32) == SW_TYPE_Q4_K);
    /* Fallbacks for rows that are not a multiple of 256 / 32. */
    CHECK(mix(q, "blk.4.attn_q.weight", 128, 32) == SW_TYPE_Q5_0);
    CHECK(mix(q, "output.weight", 64, 32) == SW_TYPE_Q8_0);
    CHECK(mix(q, "blk.0.ffn_down.weight", 172, 5) == SW_TYPE_F16);
    CHECK(mix(SW_FTYPE_MOSTLY_Q8_0, "blk.0.ffn_down.weight", 172, 5) == SW_TYPE_F16);
    CHECK(mix(SW_FTYPE_MOSTLY_Q8_0, "blk.0.ffn_up.weight", 64, 5) == SW_TYPE_Q8_0);
    CHECK(mix(SW_FTYPE_MOSTLY_F16, "blk.0.ffn_up.weight", 3, 5) == SW_TYPE_F16);
    CHECK(mix(SW_FTYPE_ALL_F32, "output.weight", 4096, 5) == SW_TYPE_F32);
    uint64_t ne1[1] = { 4096 };
    const sw_mix_model dense32 = { 32, 0, false };
    CHECK(sw_mix_type(q, "blk.0.attn_norm.weight", 1, ne1, &dense32) == SW_TYPE_F32);
    /* a fused attn_qkv takes attn_v's rule */
    CHECK(mix(q, "blk.0.attn_qkv.weight", 3072, 32) == SW_TYPE_Q6_K);
    CHECK(mix(q, "blk.4.attn_qkv.weight", 3072, 32) == SW_TYPE_Q4_K);
    /* tied output: token_embd is the output matrix, and gets its type */
    const sw_mix_model tied = { 26, 0, true };
    CHECK(mix_in(q, "token_embd.weight", 2304, tied) == SW_TYPE_Q6_K);
    CHECK(mix_in(q, "token_embd.weight", 2016, tied) == SW_TYPE_Q8_0);   /* rows not of 256 */
    CHECK(mix_in(q, "blk.3.ffn_up.weight", 2304, tied) == SW_TYPE_Q4_K);
    /* mixtures: the router stays float, ffn_down_exps follows ffn_down, and
     * 8-expert models (Mixtral) raise attn_k/v to Q8_0 and attn_output to Q5_K */
    const sw_mix_model moe8 = { 32, 8, false }, moe64 = { 48, 64, false };
    uint64_t ne3[3] = { 4096, 14336, 8 };
    CHECK(sw_mix_type(q, "blk.0.ffn_gate_inp.weight", 2, ne3, &moe8) == SW_TYPE_F32);
    /* gpt-oss's expert biases are 2-D but not weights: kept */
    CHECK(sw_mix_type(q, "blk.0.ffn_down_exps.bias", 2, ne3, &moe8) == SW_TYPE_F32);
    CHECK(sw_mix_type(q, "blk.0.ffn_up_exps.bias", 2, ne3, &moe8) == SW_TYPE_F32);
    CHECK(sw_mix_type(q, "blk.0.ffn_down_exps.weight", 3, ne3, &moe8) == SW_TYPE_Q6_K);
    CHECK(sw_mix_type(q, "blk.4.ffn_down_exps.weight", 3, ne3, &moe8) == SW_TYPE_Q4_K);
    CHECK(sw_mix_type(q, "blk.4.ffn_gate_exps.weight", 3, ne3, &moe8) == SW_TYPE_Q4_K);
    /* Qwen2-MoE's shared expert: its down matrix follows ffn_down too (as
     * llama.cpp's "ffn_down" substring rule has it), its gate vector is float */
    const sw_mix_model moe60 = { 24, 60, false };
    CHECK(mix_in(q, "blk.0.ffn_down_shexp.weight", 5632, moe60) == SW_TYPE_Q6_K);
    CHECK(mix_in(q, "blk.4.ffn_down_shexp.weight", 5632, moe60) == SW_TYPE_Q4_K);
    CHECK(mix_in(q, "blk.0.ffn_up_shexp.weight", 2048, moe60) == SW_TYPE_Q4_K);
    CHECK(sw_mix_type(q, "blk.0.ffn_gate_inp_shexp.weight", 1, ne3, &moe60) == SW_TYPE_F32);
    CHECK(mix_in(q, "blk.4.attn_k.weight", 4096, moe8) == SW_TYPE_Q8_0);
    CHECK(mix_in(q, "blk.4.attn_v.weight", 4096, moe8) == SW_TYPE_Q8_0);
    CHECK(mix_in(q, "blk.4.attn_output.weight", 4096, moe8) == SW_TYPE_Q5_K);
    CHECK(mix_in(q, "blk.10.attn_v.weight", 4096, moe64) == SW_TYPE_Q4_K);
    CHECK(mix_in(q, "blk.10.attn_output.weight", 4096, moe64) == SW_TYPE_Q4_K);

    /* llama.cpp's own Q4_K_M choice for a real file (MHA-style 8/4 heads). */
    char p[512], err[512];
    shared_path(p, sizeof p, "golden/synth-spm-d256-q4km.gguf");
    if (access(p, R_OK) != 0) {
        if (sw_checks_failed) CHECK_DONE();
        SKIP_TEST("missing %s", p);
    }
    gguf_file *f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    sw_mix_model mm = { 0, 0, false };
    if (f) {
        CHECK(gguf_get_u32(f, "llama.block_count", &mm.n_layers));
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            sw_type got = sw_mix_type(q, t->name, t->n_dims, t->ne, &mm);
            CHECK(got == t->type, "%s: mix says %s, llama.cpp wrote %s", t->name,
                  sw_type_info(got)->name, sw_type_info(t->type)->name);
        }
        gguf_close(f);
    }
    CHECK_DONE();
}
