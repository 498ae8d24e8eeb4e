/* BERT's WordPiece tokenizer (tokenizer.ggml.model "bert"), over a
 * vocabulary the caller looks up (llm/tokenizer.c's):
 *
 *   1. normalization: control and format characters (and U+0000, U+FFFD)
 *      removed, white space made a space, CJK ideographs set apart by
 *      spaces; for an uncased vocabulary, accents stripped (canonical
 *      decomposition, then nonspacing marks dropped) and lower case;
 *   2. words: split on white space, each punctuation character a word of
 *      its own;
 *   3. each word, greedily: the longest vocabulary piece that starts it,
 *      then the longest continuation piece after that, and so on; a word
 *      some part of which no piece matches, or longer than
 *      SW_WPM_MAX_WORD_CHARS characters, is one [UNK].
 *
 * Pieces are spelled one of two ways. llama.cpp's converter writes a word's
 * first piece with a U+2581 in front and its continuations bare ("▁play",
 * "ing"); the tokenizer.json it comes from has them bare and "##"-prefixed
 * ("play", "##ing"). Both are read.
 */
#ifndef SW_WORDPIECE_H
#define SW_WORDPIECE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* BERT's max_input_chars_per_word: a longer word is [UNK] whole. */
#define SW_WPM_MAX_WORD_CHARS 100

typedef struct {
    int32_t (*lookup)(const void *vocab, const char *s, size_t n);   /* a piece's id, -1 if none */
    const void *vocab;
    bool uncased;      /* lower-case and strip accents (the vocabulary has no upper case) */
    bool phantom;      /* llama.cpp's spelling ("▁" + first piece), not "##" + continuation */
    int32_t unk;       /* [UNK]'s id; -1: a word without pieces gives nothing */
} sw_wpm;

/* Calls push with each id of text[0..len), in order. False: out of memory
 * (push may have been called for part of the text). */
bool sw_wpm_encode(const sw_wpm *w, const char *text, size_t len, void (*push)(void *ctx, int32_t id), void *ctx);

#endif
