/* Tokenizers built from GGUF metadata (tokenizer.ggml.*):
 *   "llama" -> SentencePiece-style (scores, byte fallback, dummy prefix)
 *   "gpt2"  -> byte-level BPE (merges, pre-tokenizer by tokenizer.ggml.pre)
 *   "bert"  -> WordPiece (BERT's normalization and words, llm/wordpiece.h);
 *              its BOS is [CLS] and its EOS [SEP], both added by default
 * Works on vocab-only GGUF files.
 */
#ifndef SW_TOKENIZER_H
#define SW_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "gguf.h"

typedef enum { SW_TOK_SPM = 1, SW_TOK_BPE = 2, SW_TOK_WPM = 3 } sw_tok_kind;

typedef struct sw_tokenizer sw_tokenizer;

sw_tokenizer *sw_tok_load(const gguf_file *f, char *err, size_t errlen);
void sw_tok_free(sw_tokenizer *t);

sw_tok_kind sw_tok_kind_of(const sw_tokenizer *t);
int32_t sw_tok_n_vocab(const sw_tokenizer *t);
int32_t sw_tok_bos(const sw_tokenizer *t);   /* -1 if none */
int32_t sw_tok_eos(const sw_tokenizer *t);   /* -1 if none */
bool sw_tok_add_bos(const sw_tokenizer *t);  /* tokenizer.ggml.add_bos_token; default: yes for SPM and Llama 3 BPE, no for GPT-2 BPE */
/* tokenizer.ggml.add_eos_token (default no; WordPiece: [SEP], default
 * yes, or add_sep_token): only embeddings append it (worker-cpu/embed.c); a
 * generation prompt never ends in EOS. */
bool sw_tok_add_eos(const sw_tokenizer *t);
/* True for tokens that end generation (EOS, EOT, <|im_end|> and the like). */
bool sw_tok_is_eog(const sw_tokenizer *t, int32_t id);
/* Looks up a token by its exact text (e.g. "<|im_end|>"); -1 if absent. */
int32_t sw_tok_lookup(const sw_tokenizer *t, const char *text);

/* Encodes text. add_bos: prepend BOS (if the vocab has one). parse_special:
 * text matching control tokens (e.g. "<s>", "<|im_start|>") becomes those tokens.
 * Returns the number of tokens written (at most max); if the result needs more
 * than max, returns -(needed). */
int sw_tok_encode(const sw_tokenizer *t, const char *text, size_t len,
                  bool add_bos, bool parse_special, int32_t *out, int max);

/* The raw bytes a token stands for when detokenized (SPM: "▁" -> " ", byte
 * tokens <0xNN> -> that byte; BPE: byte-level mapping undone). Control tokens
 * give "" . Returns the byte count written to buf (at most buflen). */
size_t sw_tok_piece(const sw_tokenizer *t, int32_t id, char *buf, size_t buflen);
/* The same without a copy: n bytes inside the tokenizer (decoded at load). */
const char *sw_tok_piece_ref(const sw_tokenizer *t, int32_t id, size_t *n);
/* The ids whose pieces start with byte b (control tokens, with no piece,
 * are in no list). */
const int32_t *sw_tok_ids_by_first_byte(const sw_tokenizer *t, uint8_t b, size_t *n);

/* Streaming detokenizer: feeds tokens, emits only complete UTF-8 sequences,
 * holding back a partial code point until the next token completes it.
 * SPM: the leading space of the first generated piece is kept unless
 * strip_leading_space was set (used when the text starts a new document). */
typedef struct {
    const sw_tokenizer *tok;
    char pending[8];
    int n_pending;
    bool strip_leading_space;
    bool at_start;
} sw_detok;

void sw_detok_init(sw_detok *d, const sw_tokenizer *t, bool strip_leading_space);
/* Appends the decodable text for `id` to out (capacity outcap, always
 * NUL-terminated); returns bytes appended. */
size_t sw_detok_push(sw_detok *d, int32_t id, char *out, size_t outcap);
/* Flushes any held-back bytes as U+FFFD replacement characters. */
size_t sw_detok_flush(sw_detok *d, char *out, size_t outcap);

#endif
