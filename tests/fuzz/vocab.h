/* Tiny tokenizers built by the fuzz programs themselves, so that they need
 * no model file (CI has none): a SentencePiece vocabulary (byte fallback,
 * scores, a user-defined and control tokens), byte-level BPE ones (the
 * 256 byte tokens, a few merges, control tokens) for each pre-tokenizer
 * family of llm/pretok.c, and two WordPiece ones. Header-only, like driver.h. */
#ifndef SW_FUZZ_VOCAB_H
#define SW_FUZZ_VOCAB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm/gguf.h"
#include "llm/pretok.h"
#include "llm/tokenizer.h"

/* Writes w to a temporary file and loads its tokenizer. The file stays
 * open (the tokenizer may point into it) for the life of the program, held
 * here so that LeakSanitizer sees it reachable. */
static gguf_file *vocab_files[64];
static int vocab_n_files;

static sw_tokenizer *vocab_load(gguf_writer *w)
{
    char path[] = "/tmp/sw_fuzz_vocab_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); gguf_writer_free(w); return NULL; }
    close(fd);
    bool ok = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    gguf_file *f = ok ? gguf_open(path, err, sizeof err) : NULL;
    unlink(path);
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    if (!t) fprintf(stderr, "fuzz vocab: %s\n", err);
    if (f && vocab_n_files < 64) vocab_files[vocab_n_files++] = f;
    else if (f) { sw_tok_free(t); gguf_close(f); t = NULL; }
    return t;
}

static sw_tokenizer *vocab_spm(void)
{
    static const char *const words[] = { "\xE2\x96\x81", "\xE2\x96\x81t", "\xE2\x96\x81the", "he", "h", "e", "t",
                                         "a", "\xE2\x96\x81" "a", "\xC3\xA9", "<tag>", "<|im_start|>" };
    enum { NW = sizeof words / sizeof words[0], NT = 3 + 256 + NW };
    static char bytes[256][8];
    const char *toks[NT] = { "<unk>", "<s>", "</s>" };
    float scores[NT] = { 0 };
    int32_t types[NT] = { 2, 3, 3 };
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (int i = 0; i < NW; i++) {
        toks[3 + 256 + i] = words[i];
        scores[3 + 256 + i] = -(float)i;
        types[3 + 256 + i] = !strcmp(words[i], "<tag>") ? 4 : words[i][0] == '<' ? 3 : 1;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, NT);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, NT);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, NT);
    return vocab_load(w);
}

/* GPT-2's byte-level alphabet: byte b as UTF-8 of its code point. */
static void vocab_byte(int b, char out[3])
{
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        cp = 256;
        for (int x = 0; x < b; x++)
            cp += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

static sw_tokenizer *vocab_bpe(const char *pre)
{
    /* "Ġ" is the byte-level space */
    static const char *const words[] = { "th", "the", "\xC4\xA0t", "\xC4\xA0th", "\xC4\xA0the", "<|endoftext|>",
                                         "<|im_start|>", "<|im_end|>" };
    static const char *const merges[] = { "t h", "th e", "\xC4\xA0 t", "\xC4\xA0t h", "\xC4\xA0th e" };
    enum { NW = sizeof words / sizeof words[0], NT = 256 + NW };
    static char bytes[256][3];
    const char *toks[NT];
    int32_t types[NT];
    for (int b = 0; b < 256; b++) {
        vocab_byte(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < NW; i++) {
        toks[256 + i] = words[i];
        types[256 + i] = words[i][0] == '<' ? 3 : 1;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, NT);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, NT);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 256 + 5);
    return vocab_load(w);
}

/* WordPiece: llama.cpp's spelling ("▁" starts a word) of an uncased
 * vocabulary, or tokenizer.json's ("##" continues one) of a cased one. */
static sw_tokenizer *vocab_wpm(bool phantom)
{
    static const char *const llama[] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "\xE2\x96\x81the", "\xE2\x96\x81t", "he",
                                         "h", "e", "t", "\xE2\x96\x81" "a", "\xE2\x96\x81,", "\xE2\x96\x81!",
                                         "\xE2\x96\x81\xE6\x9D\xB1", "\xE2\x96\x81" "e" };
    static const char *const hf[] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "The", "t", "##he", "##h", "##e",
                                      "a", ",", "!", "\xE6\x9D\xB1", "caf", "##\xC3\xA9" };
    const char *const *toks = phantom ? llama : hf;
    const int32_t nt = phantom ? (int32_t)(sizeof llama / sizeof *llama) : (int32_t)(sizeof hf / sizeof *hf);
    int32_t types[16];
    for (int32_t i = 0; i < nt; i++) types[i] = i < 4 ? 3 : 1;
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "bert");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)nt);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)nt);
    return vocab_load(w);
}

/* The SPM tokenizer first, then one BPE tokenizer per pre-tokenizer family
 * (each family's first name), then the two WordPiece ones; returns how
 * many were built. */
static int vocab_all(sw_tokenizer **out, int max)
{
    int n = 0;
    if (n < max && (out[n] = vocab_spm())) n++;
    for (int i = 0; sw_pretok_family(i) && n < max; i++) {
        char name[64];
        const char *names = sw_pretok_family(i);
        snprintf(name, sizeof name, "%.*s", (int)strcspn(names, " "), names);
        if ((out[n] = vocab_bpe(name))) n++;
    }
    for (int k = 0; k < 2 && n < max; k++)
        if ((out[n] = vocab_wpm(k == 0))) n++;
    return n;
}

#endif
