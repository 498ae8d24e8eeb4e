/* Chat templates. We do not run Jinja: we recognise the well-known template
 * families from tokenizer.chat_template (or the architecture when it is absent)
 * and format the conversation with our own code for that family. */
#ifndef SW_CHAT_H
#define SW_CHAT_H

#include <stddef.h>
#include "gguf.h"

typedef enum {
    SW_CHAT_PLAIN = 0,  /* "role: content\n" lines, then "assistant:" - for models without a template */
    SW_CHAT_LLAMA2, SW_CHAT_LLAMA3, SW_CHAT_CHATML, SW_CHAT_MISTRAL, SW_CHAT_PHI3, SW_CHAT_GEMMA,
    SW_CHAT_GRANITE
} sw_chat_template;

typedef struct { const char *role; const char *content; } sw_chat_msg;

/* Detects the family from a Jinja template string (NULL -> PLAIN). */
sw_chat_template sw_chat_detect(const char *jinja);
/* Detects from a model file's metadata. */
sw_chat_template sw_chat_detect_gguf(const gguf_file *f);
const char *sw_chat_name(sw_chat_template t);
/* Parses "llama3", "chatml", ... ; returns -1 if unknown. */
int sw_chat_from_name(const char *name);

/* Formats the conversation and the assistant-turn opener. Returns a malloc'd
 * NUL-terminated string (caller frees). The text includes special-token text
 * such as "<|im_start|>" that must be encoded with parse_special = true.
 * BOS is not included in the text: the caller adds it per the tokenizer. */
char *sw_chat_format(sw_chat_template t, const sw_chat_msg *msgs, size_t n);

#endif
