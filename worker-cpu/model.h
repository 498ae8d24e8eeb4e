/* A Llama-architecture model read in place from a GGUF file, and its forward
 * pass. (Owned by the CPU engine work; fields below are the stable part other
 * code relies on.) */
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

typedef struct sw_model {
    gguf_file *file;
    sw_hparams hp;
    sw_tokenizer *tok;
    sw_chat_template chat;
    char arch[32];
    char quant_name[16];   /* what it computes in, e.g. "q4_k_m", "f32", "q8_0" */
    void *priv;            /* tensor pointers and the rest, see model.c */
} sw_model;

/* Loads and validates (architecture, shapes, tensor types). NULL + err on failure. */
sw_model *sw_model_load(const char *path, char *err, size_t errlen);
void sw_model_free(sw_model *m);

#endif
