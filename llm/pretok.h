/* BPE pre-tokenizers: the regular expressions that cut text into words
 * before byte-level BPE merges each word on its own.
 *
 * A GGUF file names its pre-tokenizer in tokenizer.ggml.pre ("gpt-2",
 * "llama-bpe", "qwen2", "deepseek-coder", "tekken", ...). Each name stands
 * for a sequence of regexes taken from the model's tokenizer.json: the first
 * cuts the text, each next one cuts every piece again, and both the matches
 * and the text between them stay pieces (the "Isolated" split of Hugging
 * Face's tokenizers). The regexes run on PCRE2 in UTF mode with Unicode
 * properties, so \p{L}, \p{Lu}, \p{N}, \p{P}, \p{S}, \p{M} and \s mean what
 * the model's own tokenizer means by them.
 */
#ifndef SW_PRETOK_H
#define SW_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sw_pretok sw_pretok;

/* A word: text[off, off + len). */
typedef struct { uint32_t off, len; } sw_span;

/* The pre-tokenizer that tokenizer.ggml.pre names (name[0..len)), or, with
 * name NULL, GPT-2's (what a file without the key gets). An unknown name
 * gives NULL with the reason in err. */
sw_pretok *sw_pretok_new(const char *name, size_t len, char *err, size_t errlen);
void sw_pretok_free(sw_pretok *p);

/* The names of family i (space-separated: all stand for one split), or NULL
 * past the last family. */
const char *sw_pretok_family(int i);

/* Whether a word that is itself a vocabulary entry is taken whole, before
 * any merge (Llama 3's and Tekken's "ignore_merges"). */
bool sw_pretok_whole_words(const sw_pretok *p);
/* Whether these models expect BOS first when the file does not say. */
bool sw_pretok_default_bos(const sw_pretok *p);

/* Cuts text[0..len) into words, in order, covering every byte. *out gets a
 * malloc'd array (the caller frees it). Returns the word count, or
 * SIZE_MAX when memory runs out. Safe to call from several threads. */
size_t sw_pretok_split(const sw_pretok *p, const char *text, size_t len, sw_span **out);

#endif
