/* A Llama-architecture model read in place from a GGUF file, and its forward
 * pass. (Owned by the CPU engine work; fields below are the stable part other
 * code relies on.)
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

typedef struct {
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    uint32_t head_dim, n_rot;
    float rope_theta, rms_eps;
} sw_hparams;

/* One transformer block. Matrices follow GGUF's convention: ne[0] = input
 * width (contiguous), ne[1] = output width. Norm weights are 1-D. */
typedef struct {
    const gguf_tensor *attn_norm;   /* [n_embd] */
    const gguf_tensor *wq;          /* [n_embd, n_head*head_dim] */
    const gguf_tensor *wk;          /* [n_embd, n_head_kv*head_dim] */
    const gguf_tensor *wv;          /* [n_embd, n_head_kv*head_dim] */
    const gguf_tensor *wo;          /* [n_head*head_dim, n_embd] */
    const gguf_tensor *ffn_norm;    /* [n_embd] */
    const gguf_tensor *w_gate;      /* [n_embd, n_ff] */
    const gguf_tensor *w_up;        /* [n_embd, n_ff] */
    const gguf_tensor *w_down;      /* [n_ff, n_embd] */
} sw_layer;

typedef struct sw_model {
    gguf_file *file;
    sw_hparams hp;
    sw_tokenizer *tok;
    sw_chat_template chat;
    char arch[32];
    char quant_name[16];   /* what it computes in, e.g. "q4_k_m", "f32", "q8_0" */
    void *priv;            /* reserved */

    /* Tensors, all pointing into `file` (valid until sw_model_free). */
    const gguf_tensor *token_embd;   /* [n_embd, n_vocab] */
    const gguf_tensor *output_norm;  /* [n_embd] */
    const gguf_tensor *output;       /* [n_embd, n_vocab]; == token_embd when tied */
    const gguf_tensor *rope_freqs;   /* optional [n_rot/2] frequency divisors (Llama 3.1), else NULL */
    sw_layer *layers;                /* n_layer entries */
    bool tied_output;
    /* Bytes of weights one decode step reads (all matrices + the output
     * projection + one embedding row), for the bandwidth figures. */
    uint64_t weight_bytes;
} sw_model;

/* Loads and validates (architecture, shapes, tensor types). NULL + err on failure. */
sw_model *sw_model_load(const char *path, char *err, size_t errlen);
void sw_model_free(sw_model *m);

/* "q4_k_m" etc. for a general.file_type value; NULL if unknown. */
const char *sw_file_type_name(uint32_t ftype);

#endif
