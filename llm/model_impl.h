/* What llm/model.c shares with llm/model_encoder.c, its encoder half: the
 * metadata readers and the tensor binder. Internal to those two files. */
#ifndef SW_MODEL_IMPL_H
#define SW_MODEL_IMPL_H

#include "llm/model.h"

/* Reads "<arch>.<key>": an integer, required or not (absent and optional:
 * *out keeps its default), or an optional float. False with err filled. */
bool sw_hp_u32(const gguf_file *f, const char *arch, const char *key, uint32_t *out, bool required, char *err,
               size_t errlen);
bool sw_hp_f32(const gguf_file *f, const char *arch, const char *key, float *out, char *err, size_t errlen);

/* Binds the file's tensors to the model, remembering which were used: a
 * tensor no graph step reads (a bias, a norm, a scaling table of some
 * variant this loader does not know) would change the result if it were
 * silently skipped, so load refuses files that have one. */
typedef struct {
    sw_model *m;
    bool *used;      /* per file tensor */
    char *err;
    size_t errlen;
} sw_loader;

/* The tensor `name` of shape [ne0] (ne1 = 0) or [ne0, ne1], checked (type,
 * size) and marked used; NULL when absent (err filled unless optional) or
 * invalid (err filled). bindf names it by fmt with layer l. */
const gguf_tensor *sw_ld_bind(sw_loader *ld, const char *name, uint64_t ne0, uint64_t ne1, bool optional);
const gguf_tensor *sw_ld_bindf(sw_loader *ld, uint64_t ne0, uint64_t ne1, bool optional, const char *fmt, uint32_t l);
/* Layer l's q, k and v (separate, or one attn_qkv split), and their optional biases. */
bool sw_ld_bind_qkv(sw_loader *ld, uint32_t l, sw_layer *L);

/* model_encoder.c: an encoder's own hyperparameters (after the shared
 * ones: LayerNorm epsilon, non-causal attention, a pooling type), and its
 * tensors (sw_model's and sw_layer's encoder fields). */
bool sw_encoder_hparams(const gguf_file *f, const char *arch, sw_hparams *hp, char *err, size_t errlen);
bool sw_encoder_bind(sw_loader *ld);

#endif
