/* A decoder-only transformer read in place from a GGUF file: Llama's graph,
 * and the variants of it that Qwen2, Qwen3, Qwen3-MoE, Phi-3, Gemma 1-3 and
 * Mixtral use. Shared by both workers and the tools: the CPU engine computes
 * on it, the GPU worker uploads from it.
 *
 * Or a BERT-family encoder (sw_model_is_encoder: archs "bert" and
 * "nomic-bert", llm/model_encoder.c), an embedding model the CPU worker
 * alone computes (worker-cpu/encoder.h): bidirectional attention, LayerNorms
 * after the residual adds, absolute positions (bert) or RoPE (nomic-bert).
 *
 * sw_model_load only reads and validates: every tensor the forward pass uses
 * is checked for presence, shape and type, so compute code can trust it. The
 * tensor pointers are public because the GPU worker uploads the same tensors.
 */
#ifndef SW_MODEL_H
#define SW_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "llm/gguf.h"
#include "llm/tokenizer.h"
#include "llm/chat.h"

/* The largest head size a file may have (the attention kernels keep a
 * head's sums for 4 queries on the stack). */
#define SW_MAX_HEAD_DIM 1024

typedef struct {
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    uint32_t head_dim, n_rot;
    float rope_theta, rms_eps;
    float rope_scale;  /* RoPE scaling factor: linear (positions are divided by it) or YaRN (0: none) */
    bool rope_yarn;    /* YaRN: sw_rope_freqs blends each pair between scaled and not */
    uint32_t rope_orig_ctx;   /* the context the model was trained at before scaling (YaRN, LongRoPE) */
    float yarn_beta_fast, yarn_beta_slow, yarn_ext_factor;
    float rope_mscale; /* magnitude of the rotated dims after RoPE: the file's rope.scaling.attn_factor
                        * (1 if absent; LongRoPE's sqrt(1 + ln(s) / ln(orig))), times YaRN's
                        * 1 + 0.1 ln(factor) */
    bool rope_neox;    /* RoPE rotates (i, i + n_rot/2), not (2i, 2i+1): every
                        * supported architecture but llama */
    float attn_scale;     /* queries are scaled by it before q.k: 1/sqrt(head_dim) but for Gemma's 27B
                           * and Granite (the file's attention.scale) */
    float embd_scale;     /* embeddings are multiplied by it: 1, sqrt(n_embd) (Gemma) or the file's (Granite) */
    float residual_scale; /* attention and FFN outputs are multiplied by it before their residual adds
                           * (Granite); 1 elsewhere */
    float logit_scale;    /* logits are divided by it (Granite); 1 elsewhere */
    float attn_softcap;   /* scores become cap * tanh(score / cap) before the softmax; 0: none */
    float final_softcap;  /* the same on the logits; 0: none */
    uint32_t n_swa;       /* window of the sliding layers (sw_layer.sliding): a query at p sees p - n_swa + 1..p */
    float rope_theta_swa, rope_scale_swa;   /* RoPE base and linear scaling of the sliding layers */
    /* A mixture of experts (0 experts: a dense FFN): each token's FFN is the
     * sum of its n_expert_used best experts' (softmax over all n_expert
     * router logits, renormalized over the chosen, times
     * expert_weights_scale); experts are n_ff_exp wide. */
    uint32_t n_expert, n_expert_used, n_ff_exp;
    float expert_weights_scale;
    bool expert_renorm;   /* the chosen experts' weights renormalized to sum 1 (all but Qwen2-MoE) */
    uint32_t n_ff_shexp;  /* Qwen2-MoE's shared expert: a dense FFN this wide beside the mixture, its output
                           * times sigmoid(ffn_gate_inp_shexp . x); 0: none */
    /* An embedding model: the file's <arch>.pooling_type (llama.cpp's enum,
     * SW_POOLING_*) says how its final hidden states are pooled into one
     * vector. NONE (absent): a generation model. */
    uint32_t pooling;
    float norm_eps;       /* an encoder's LayerNorm epsilon (attention.layer_norm_epsilon); 0 in a decoder */
} sw_hparams;

enum { SW_POOLING_NONE = 0, SW_POOLING_MEAN = 1, SW_POOLING_CLS = 2, SW_POOLING_LAST = 3 };

enum { SW_MOE_NO, SW_MOE_ALLOWED, SW_MOE_ALWAYS };   /* sw_arch.experts */

/* sw_arch.encoder: a decoder, or which BERT-family encoder. BERT (bge,
 * all-MiniLM, ...): learned absolute positions, a GELU FFN (the exact, erf
 * form) with biases. nomic-bert (nomic-embed-text): RoPE (NEOX pairs) in
 * place of positions, a SwiGLU FFN, q/k/v fused, no biases. */
enum { SW_ENC_NONE = 0, SW_ENC_BERT, SW_ENC_NOMIC };

/* How an architecture's graph differs from Llama's (model.c has the table). */
typedef struct {
    const char *name;     /* general.architecture */
    bool rope_neox;       /* see sw_hparams.rope_neox */
    bool qk_norm;         /* q and k RMS-normalized per head before RoPE (Qwen3) */
    bool fused_gate_up;   /* ffn_up holds the gate rows, then the up rows (Phi-3) */
    bool gelu;            /* gate activation GELU (tanh form), not SiLU (Gemma) */
    bool scale_embd;      /* embeddings times sqrt(n_embd) (Gemma) */
    bool post_norms;      /* the attention and FFN outputs are RMS-normalized before
                           * their residual adds (Gemma 2, 3) */
    float attn_softcap, final_softcap;   /* defaults when the file names none (Gemma 2: 50, 30) */
    uint32_t swa_pattern; /* with a sliding window, all but every swa_pattern-th layer
                           * use it (Gemma 2: 2, Gemma 3: 6); 0: no layer does */
    uint32_t swa_window;  /* its width when the file names none (Gemma 2: 4096; 0: no window) */
    bool swa_own_rope;    /* sliding layers rotate with rope.freq_base_swa (default
                           * 10000; OLMo 3: the global base) and no scaling (Gemma 3, OLMo 3) */
    uint32_t depth_27b;   /* a model this deep scales queries by 1/sqrt(n_embd/n_head) */
    int experts;          /* SW_MOE_*: whether its FFN may be (or always is) a mixture */
    bool granite_scales;  /* embedding, residual, attention and logit scales from the file (Granite) */
    uint32_t nope_period; /* every nope_period-th layer has no RoPE (SmolLM3: 4; not in its files,
                           * as llama.cpp has it too); 0: every layer rotates */
    bool shared_expert;   /* a mixture with a gated shared expert, its chosen experts' weights
                           * not renormalized (Qwen2-MoE) */
    bool oai_moe;         /* gpt-oss: its FFN norm is named post_attention_norm, the chosen experts'
                           * weights are the softmax of their router logits alone, and the expert
                           * gate is SwiGLU clamped (x = min(g, 7), u clamped to +-7,
                           * x * sigmoid(1.702 x) * (u + 1)) */
    bool olmo2;           /* no norms before attention and the FFN (their outputs are normed instead:
                           * post_norms), and q and k RMS-normalized over all heads at once (OLMo 2) */
    int encoder;          /* SW_ENC_*: a BERT-family encoder (none of the fields above apply but rope_neox) */
} sw_arch;

/* One transformer block. Matrices follow GGUF's convention: ne[0] = input
 * width (contiguous), ne[1] = output width. Norm weights are 1-D. */
typedef struct {
    const gguf_tensor *attn_norm;   /* [n_embd]; NULL in OLMo 2 (as ffn_norm) */
    const gguf_tensor *wq;          /* [n_embd, n_head*head_dim] */
    const gguf_tensor *wk;          /* [n_embd, n_head_kv*head_dim] */
    const gguf_tensor *wv;          /* [n_embd, n_head_kv*head_dim] */
    const gguf_tensor *wo;          /* [n_head*head_dim, n_embd] */
    const gguf_tensor *ffn_norm;    /* [n_embd] */
    const gguf_tensor *w_gate;      /* [n_embd, n_ff] */
    const gguf_tensor *w_up;        /* [n_embd, n_ff] */
    const gguf_tensor *w_down;      /* [n_ff, n_embd] */
    /* Optional, NULL when absent: q/k/v biases ([n_head*head_dim],
     * [n_head_kv*head_dim] x 2) and the per-head q/k norms ([head_dim];
     * OLMo 2's span all heads: [n_head*head_dim], [n_head_kv*head_dim]). */
    const gguf_tensor *bq, *bk, *bv;
    const gguf_tensor *q_norm, *k_norm;
    /* Optional, NULL when absent: the attention output's bias [n_embd], and
     * attention sinks [n_head] (gpt-oss): a logit per head that joins each
     * softmax's denominator without a value. */
    const gguf_tensor *bo, *sinks;
    /* A mixture's router [n_embd, n_expert] and its experts' matrices, each
     * n_expert consecutive views (gate and up [n_embd, n_ff_exp], down
     * [n_ff_exp, n_embd]) into the file's stacked tensors; w_gate, w_up and
     * w_down are then NULL. */
    const gguf_tensor *gate_inp;
    const gguf_tensor *gate_exps, *up_exps, *down_exps;
    /* Optional (gpt-oss): the router's bias [n_expert] and the experts'
     * biases, [n_ff_exp, n_expert] for gate and up, [n_embd, n_expert] for down. */
    const gguf_tensor *gate_inp_b, *gate_exps_b, *up_exps_b, *down_exps_b;
    /* Qwen2-MoE: the shared expert's gate [n_embd]; its matrices are w_gate,
     * w_up and w_down (n_ff_shexp wide). NULL elsewhere. */
    const gguf_tensor *gate_inp_shexp;
    /* Gemma 2/3: norms of the attention and FFN outputs ([n_embd]), else NULL */
    const gguf_tensor *post_attn_norm, *post_ffn_norm;
    /* An encoder's (NULL in a decoder, whose attn_norm and ffn_norm an
     * encoder has not): the LayerNorms (gain and bias, [n_embd]) of the
     * residual stream after attention is added (attn_output_norm) and after
     * the FFN is (layer_output_norm), and the FFN's optional biases ([n_ff],
     * [n_embd]). Its wq, wk, wv, wo, w_up, w_down (and nomic-bert's w_gate)
     * and optional bq, bk, bv, bo are the fields above. */
    const gguf_tensor *attn_out_norm, *attn_out_norm_b, *out_norm, *out_norm_b;
    const gguf_tensor *b_up, *b_down;
    bool sliding;                   /* attends to the last hp.n_swa positions only */
    bool no_rope;                   /* q and k are not rotated (sw_arch.nope_period) */
} sw_layer;

typedef struct sw_model {
    gguf_file *file;
    sw_hparams hp;
    sw_tokenizer *tok;
    sw_chat_template chat;
    char arch[32];
    const sw_arch *graph;            /* the architecture's differences from Llama */
    char quant_name[16];   /* what it computes in, e.g. "q4_k_m", "f32", "q8_0" */
    void *priv;            /* reserved */

    /* Tensors, all pointing into `file` (valid until sw_model_free). */
    const gguf_tensor *token_embd;   /* [n_embd, n_vocab] */
    const gguf_tensor *output_norm;  /* [n_embd] */
    const gguf_tensor *output;       /* [n_embd, n_vocab]; == token_embd when tied */
    const gguf_tensor *rope_freqs;   /* optional [n_rot/2] frequency divisors (Llama 3.1), else NULL */
    /* LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): [n_rot/2] divisors for a
     * context beyond rope_orig_ctx, and for one within it; else NULL */
    const gguf_tensor *rope_long, *rope_short;
    const gguf_tensor *output_bias;  /* optional [n_vocab] */
    /* An encoder's (NULL in a decoder; an encoder's output_norm and output
     * are NULL): token type 0's embedding (row 0 of [n_embd, types],
     * optional), the learned positions [n_embd, >= n_ctx_train] (bert; NULL:
     * RoPE), and the LayerNorm of the summed embeddings (gain and bias). */
    const gguf_tensor *token_types, *pos_embd, *embd_norm, *embd_norm_b;
    sw_layer *layers;                /* n_layer entries */
    /* Fused tensors (attn_qkv, Phi-3's ffn_up) split into row ranges that
     * the fields above point to; owned by the model. */
    gguf_tensor *views;
    size_t n_views;
    bool tied_output;
    /* Bytes of weights one decode step reads (all matrices + the output
     * projection + one embedding row), for the bandwidth figures. */
    uint64_t weight_bytes;
    uint64_t expert_bytes;           /* of those, the n_used experts per layer of a mixture */
} sw_model;

/* Loads and validates (architecture, shapes, tensor types). NULL + err on failure. */
sw_model *sw_model_load(const char *path, char *err, size_t errlen);
void sw_model_free(sw_model *m);

/* "llama, 16 layers, dim 2048, 32/8 heads, ffn 8192, vocab 32000, q4_k_m"
 * (a mixture: "ffn 64 experts of 768, 8 used"), for the tools' banners. */
void sw_model_describe(const sw_model *m, char *buf, size_t len);

/* RoPE's per-pair frequencies inv[0..n_rot/2) for the global layers, or
 * the sliding ones (which may have their own base and scaling): base^(-2i/n_rot),
 * divided by the file's freq_factors (rope_freqs, may be NULL) and by linear
 * scaling, or blended by YaRN. Both workers build their tables with it. */
void sw_rope_freqs(const sw_hparams *hp, const gguf_tensor *freq_factors, bool sliding, float *inv);
/* The frequency divisors a context of n_ctx positions per sequence rotates
 * with: rope_freqs, or LongRoPE's long ones past the original context and
 * its short ones within it (llama.cpp's choice, by the context size rather
 * than by each sequence's length), or NULL. */
const gguf_tensor *sw_rope_factors(const sw_model *m, uint32_t n_ctx);
/* The factor the rotated dims are multiplied by after RoPE (YaRN's magnitude correction). */
float sw_rope_mscale(const sw_hparams *hp, bool sliding);

/* Bytes of expert e's gate, up and down matrices in layer L (a mixture). */
uint64_t sw_expert_bytes(const sw_layer *L, uint32_t e);

/* Whether m is an embedding model (a pooling type in its metadata): it is
 * served for embeddings only, never for generation. */
static inline bool sw_model_is_embedding(const sw_model *m) { return m->hp.pooling != SW_POOLING_NONE; }
/* Whether m is a BERT-family encoder (always an embedding model): only
 * worker-cpu/encoder.h computes it; sw_ctx_new refuses it. */
static inline bool sw_model_is_encoder(const sw_model *m) { return m->graph->encoder != SW_ENC_NONE; }
/* "mean", "cls", "last" or "none". */
const char *sw_pooling_name(uint32_t pooling);

/* "q4_k_m" etc. for a general.file_type value; NULL if unknown. */
const char *sw_file_type_name(uint32_t ftype);

#endif
