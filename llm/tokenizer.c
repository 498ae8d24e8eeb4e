/* Tokenizers built from GGUF metadata.
 *
 * SPM ("llama"): spaces become U+2581 "▁", a dummy "▁" is put in front, the
 * text is split into UTF-8 characters, and adjacent symbols are merged,
 * always taking the pair whose merged text is the vocabulary piece with the
 * highest score (ties: leftmost). Characters that end up outside the vocab
 * fall back to <0xNN> byte tokens.
 *
 * BPE ("gpt2"): the text is split into words by the pre-tokenizer that
 * tokenizer.ggml.pre names (pretok.c: the model's own regexes), each word's
 * bytes are mapped to printable code points (GPT-2's byte<->unicode table), and
 * adjacent symbols are merged by merge rank (lowest first, ties: leftmost).
 *
 * WordPiece ("bert"): BERT's normalization, words split at spaces and
 * punctuation, and each word cut greedily into the longest pieces
 * (wordpiece.c, over this file's vocabulary map).
 *
 * Both merge loops share one engine: symbols in a linked list over a buffer,
 * candidate pairs in a binary heap, stale pairs discarded when popped. That
 * keeps long inputs at O(n log n).
 */
#include "llm/tokenizer.h"
#include "llm/pretok.h"
#include "llm/text.h"
#include "llm/util.h"
#include "llm/wordpiece.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token types as GGUF stores them (tokenizer.ggml.token_type). */
enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3,
       TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define MAX_VOCAB (1 << 24)
#define MAX_TEXT_LEN ((size_t)1 << 28)   /* keeps symbol indices within int */

/* ---- string -> int map (open addressing, keys point into an arena) ---- */

typedef struct { const char *s; uint32_t len, hash; int32_t val; } map_slot;
typedef struct { map_slot *slot; uint32_t cap; } strmap;

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u;                       /* FNV-1a */
    for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 16777619u; }
    return h;
}

static bool map_init(strmap *m, uint64_t n)
{
    uint32_t cap = 16;
    while (cap < n * 2) cap <<= 1;                  /* load factor <= 0.5 */
    m->slot = calloc(cap, sizeof *m->slot);
    m->cap = cap;
    return m->slot != NULL;
}

/* Inserts unless present (the first occurrence of a duplicate text wins). */
static void map_put(strmap *m, const char *s, uint32_t len, int32_t val)
{
    uint32_t h = hash_bytes(s, len), i = h & (m->cap - 1);
    while (m->slot[i].s) {
        if (m->slot[i].hash == h && m->slot[i].len == len && memcmp(m->slot[i].s, s, len) == 0) return;
        i = (i + 1) & (m->cap - 1);
    }
    m->slot[i] = (map_slot){ s, len, h, val };
}

static int32_t map_get(const strmap *m, const char *s, size_t len)
{
    if (!m->slot) return -1;
    uint32_t h = hash_bytes(s, len), i = h & (m->cap - 1);
    while (m->slot[i].s) {
        if (m->slot[i].hash == h && m->slot[i].len == len && memcmp(m->slot[i].s, s, len) == 0)
            return m->slot[i].val;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

/* ---- the tokenizer ---- */

struct sw_tokenizer {
    sw_tok_kind kind;
    int32_t n_vocab;
    char *arena;             /* every token text, NUL-terminated */
    uint32_t *off, *len;     /* token i's text is arena + off[i], len[i] bytes */
    float *score;
    uint8_t *type;
    uint8_t *eog;            /* per id: ends generation */
    strmap vocab;            /* text -> id */
    strmap merges;           /* "left right" -> rank (BPE) */
    char *merge_arena;
    int32_t byte_tok[256];   /* SPM: <0xNN>; BPE: the token of that byte's mapped char */
    int32_t bos, eos, unk;
    bool add_bos, add_eos, add_space_prefix, has_byte_tokens;
    sw_pretok *pretok;       /* BPE: the pre-tokenizer */
    sw_wpm wpm;              /* WordPiece: its settings (lookup: this vocabulary) */
    uint32_t max_len;        /* longest token text */
    int32_t *special;        /* control / user-defined ids, longest text first */
    int n_special, n_user;     /* n_user: how many of them are user-defined */
    uint8_t special_first[32]; /* bitmap of the first bytes of special texts */
    /* Every token's piece (sw_tok_piece) decoded once at load: constrained
     * decoding asks for all of them at every step it masks. */
    char *piece_arena;
    uint32_t *piece_off;       /* n_vocab + 1: piece i is [piece_off[i], piece_off[i + 1]) */
    int32_t *by_first;         /* ids with a piece, grouped by its first byte */
    uint32_t first_off[257];
};

/* An id from metadata, or -1 when absent or out of range (files use
 * 0xFFFFFFFF and negative values for "none"). */
static int32_t meta_id(const gguf_file *f, const char *key, int32_t dflt, int32_t n_vocab)
{
    int64_t v;
    if (!gguf_get_i64(f, key, &v)) v = dflt;
    return v >= 0 && v < n_vocab ? (int32_t)v : -1;
}

static bool gguf_str_eq(gguf_str s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1. */
static int byte_token_value(const char *s, uint32_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* GPT-2's byte -> code point table: printable Latin-1 bytes map to
 * themselves, the rest to 256, 257, ... in byte order. */
static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[512];  /* -1 for code points that are no byte's image */

static void build_byte_map(void)
{
    int n = 0;
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = keep ? (uint32_t)b : 256u + (uint32_t)n++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static void init_byte_map(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;   /* tokenizers may load on several threads */
    pthread_once(&once, build_byte_map);
}

/* Decodes one code point at s[0..n); *cp gets it. Invalid or truncated
 * sequences consume one byte and give SW_INVALID_CP + byte, a value no
 * character has, so the byte still reaches the tokenizer. */
#define SW_INVALID_CP 0x110000u
static int utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    int k = sw_utf8_decode(s, n, cp);
    if (k == 0) { *cp = SW_INVALID_CP + s[0]; return 1; }
    return k;
}

/* ---- loading ---- */

static int cmp_special_len(const void *a, const void *b, void *ctx)
{
    const sw_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static bool load_tokens(sw_tokenizer *t, const gguf_kv *kv, char *err, size_t errlen)
{
    uint64_t n = kv->v.arr.n, total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(kv, i);
        if (s.len > UINT32_MAX / 2) { sw_errf(err, errlen, "tokenizer.ggml.tokens: %s", "token text too long"); return false; }
        total += s.len + 1;
    }
    if (total > UINT32_MAX) { sw_errf(err, errlen, "tokenizer.ggml.tokens: %s", "texts too large"); return false; }
    t->arena = malloc(total ? total : 1);
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    if (!t->arena || !t->off || !t->len || !map_init(&t->vocab, n)) {
        sw_errf(err, errlen, "%s", "out of memory loading the vocabulary");
        return false;
    }
    uint64_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(kv, i);
        if (s.len) memcpy(t->arena + pos, s.ptr, s.len);
        t->arena[pos + s.len] = 0;
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)s.len;
        if (s.len > t->max_len) t->max_len = (uint32_t)s.len;
        pos += s.len + 1;
    }
    for (uint64_t i = 0; i < n; i++)
        map_put(&t->vocab, t->arena + t->off[i], t->len[i], (int32_t)i);
    return true;
}

static bool load_merges(sw_tokenizer *t, const gguf_file *f, char *err, size_t errlen)
{
    const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.merges");
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING) {
        sw_errf(err, errlen, "%s", "tokenizer.ggml.merges: missing or not a string array (needed by gpt2 tokenizers)");
        return false;
    }
    uint64_t n = kv->v.arr.n, total = 0;
    if (n > MAX_VOCAB * 4ull) { sw_errf(err, errlen, "%s", "tokenizer.ggml.merges: too many merges"); return false; }
    for (uint64_t i = 0; i < n; i++) total += gguf_arr_str(kv, i).len + 1;
    if (total > UINT32_MAX) { sw_errf(err, errlen, "%s", "tokenizer.ggml.merges: texts too large"); return false; }
    t->merge_arena = malloc(total ? total : 1);
    if (!t->merge_arena || !map_init(&t->merges, n)) {
        sw_errf(err, errlen, "%s", "out of memory loading merges");
        return false;
    }
    uint64_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(kv, i);
        if (s.len > UINT32_MAX / 2) { sw_errf(err, errlen, "%s", "tokenizer.ggml.merges: entry too long"); return false; }
        if (s.len) memcpy(t->merge_arena + pos, s.ptr, s.len);
        t->merge_arena[pos + s.len] = 0;
        /* A merge is "left right"; entries without the separator can never match. */
        map_put(&t->merges, t->merge_arena + pos, (uint32_t)s.len, (int32_t)i);
        pos += s.len + 1;
    }
    return true;
}

/* Texts of control tokens that end a turn in the common chat formats. */
static const char *const eog_texts[] = {
    "</s>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|return|>", "<|call|>", NULL
};

/* The id of control token `text`, or -1. */
static int32_t control_id(const sw_tokenizer *t, const char *text)
{
    int32_t id = map_get(&t->vocab, text, strlen(text));
    return id >= 0 && t->type[id] == TT_CONTROL ? id : -1;
}

static bool finish_load(sw_tokenizer *t, const gguf_file *f, char *err, size_t errlen)
{
    int32_t n = t->n_vocab;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    if (t->kind == SW_TOK_SPM) {
        for (int32_t i = 0; i < n; i++) {
            if (t->type[i] != TT_BYTE && t->type[i] != TT_UNDEFINED) continue;
            int v = byte_token_value(t->arena + t->off[i], t->len[i]);
            if (v >= 0 && t->byte_tok[v] < 0) { t->byte_tok[v] = i; t->has_byte_tokens = true; }
        }
    } else if (t->kind == SW_TOK_BPE) {
        init_byte_map();
        for (int b = 0; b < 256; b++) {
            char u[4];
            int k = sw_utf8_encode(byte_to_cp[b], u);
            t->byte_tok[b] = map_get(&t->vocab, u, (size_t)k);
        }
    }

    t->special = malloc((size_t)n * sizeof *t->special);
    t->eog = calloc((size_t)n, 1);
    if (!t->special || !t->eog) { sw_errf(err, errlen, "%s", "out of memory"); return false; }
    for (int32_t i = 0; i < n; i++) {
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) {
            t->special[t->n_special++] = i;
            t->n_user += t->type[i] == TT_USER;
            uint8_t c = (uint8_t)t->arena[t->off[i]];
            t->special_first[c >> 3] |= (uint8_t)(1u << (c & 7));
        }
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special_len, t);

    if (t->eos >= 0) t->eog[t->eos] = 1;
    const char *eog_keys[] = { "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id" };
    for (int k = 0; k < 2; k++) {
        int32_t id = meta_id(f, eog_keys[k], -1, n);
        if (id >= 0) t->eog[id] = 1;
    }
    for (int k = 0; eog_texts[k]; k++) {
        int32_t id = control_id(t, eog_texts[k]);
        if (id >= 0) t->eog[id] = 1;
    }
    /* Harmony (gpt-oss): <|end|> closes a message, and the answer follows
     * the reasoning in a message of its own; the turn ends at <|return|> or
     * at a tool <|call|>. */
    int32_t end = control_id(t, "<|end|>");
    if (end >= 0 && control_id(t, "<|return|>") >= 0 && control_id(t, "<|call|>") >= 0) t->eog[end] = 0;
    return true;
}

static size_t piece_raw(const sw_tokenizer *t, int32_t id, char *buf);

/* Decodes every piece once, and groups the ids by their pieces' first bytes. */
static bool build_pieces(sw_tokenizer *t)
{
    size_t total = 0;
    char *tmp = malloc((size_t)t->max_len + 8);
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    t->by_first = malloc(((size_t)t->n_vocab + 1) * sizeof *t->by_first);
    if (!tmp || !t->piece_off || !t->by_first) { free(tmp); return false; }
    for (int32_t i = 0; i < t->n_vocab; i++) total += piece_raw(t, i, tmp);
    if (total > UINT32_MAX || !(t->piece_arena = malloc(total + 1))) { free(tmp); return false; }
    uint32_t count[256] = {0};
    size_t at = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = (uint32_t)at;
        size_t n = piece_raw(t, i, t->piece_arena + at);
        if (n) count[(uint8_t)t->piece_arena[at]]++;
        at += n;
    }
    t->piece_off[t->n_vocab] = (uint32_t)at;
    free(tmp);
    t->first_off[0] = 0;
    for (int b = 0; b < 256; b++) t->first_off[b + 1] = t->first_off[b] + count[b];
    uint32_t fill[256];
    memcpy(fill, t->first_off, sizeof fill);
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->piece_off[i + 1] > t->piece_off[i]) t->by_first[fill[(uint8_t)t->piece_arena[t->piece_off[i]]]++] = i;
    return true;
}

/* The vocabulary arrays of f, checked: tokens (required), scores and
 * token types (optional, NULL when absent, as long as tokens). */
typedef struct {
    const gguf_kv *tokens, *scores, *types;
    uint64_t n;
} vocab_arrays;

/* The tokenizer kind and vocabulary arrays of f; false with the reason in err. */
static bool check_vocab(const gguf_file *f, sw_tok_kind *kind, vocab_arrays *va, char *err, size_t errlen)
{
    gguf_str model;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model)) {
        sw_errf(err, errlen, "%s", "tokenizer.ggml.model: missing (the file has no tokenizer)");
        return false;
    }
    if (gguf_str_eq(model, "llama")) *kind = SW_TOK_SPM;
    else if (gguf_str_eq(model, "gpt2")) *kind = SW_TOK_BPE;
    else if (gguf_str_eq(model, "bert")) *kind = SW_TOK_WPM;
    else {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(model.len < 60 ? model.len : 60), model.ptr);
        sw_errf(err, errlen, "tokenizer.ggml.model: unsupported tokenizer '%s' (want llama, gpt2 or bert)", name);
        return false;
    }
    const gguf_kv *tokens = gguf_find(f, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_VT_ARRAY || tokens->v.arr.type != GGUF_VT_STRING) {
        sw_errf(err, errlen, "%s", "tokenizer.ggml.tokens: missing or not a string array");
        return false;
    }
    uint64_t n = tokens->v.arr.n;
    if (n == 0 || n > MAX_VOCAB) {
        sw_errf(err, errlen, "%s", "tokenizer.ggml.tokens: vocabulary size out of range");
        return false;
    }
    const gguf_kv *scores = gguf_find(f, "tokenizer.ggml.scores");
    if (scores && (scores->type != GGUF_VT_ARRAY || scores->v.arr.type != GGUF_VT_FLOAT32 || scores->v.arr.n != n)) {
        sw_errf(err, errlen, "%s", "tokenizer.ggml.scores: not a float32 array as long as tokenizer.ggml.tokens");
        return false;
    }
    const gguf_kv *types = gguf_find(f, "tokenizer.ggml.token_type");
    if (types) {
        bool int_arr = types->type == GGUF_VT_ARRAY && types->v.arr.type != GGUF_VT_STRING &&
                       types->v.arr.type != GGUF_VT_FLOAT32 && types->v.arr.type != GGUF_VT_FLOAT64 &&
                       types->v.arr.type != GGUF_VT_BOOL;
        if (!int_arr || types->v.arr.n != n) {
            sw_errf(err, errlen, "%s", "tokenizer.ggml.token_type: not an integer array as long as tokenizer.ggml.tokens");
            return false;
        }
    }
    *va = (vocab_arrays){ tokens, scores, types, n };
    return true;
}

/* Each token's score and type, from the arrays or their defaults. */
static void load_scores_types(sw_tokenizer *t, const vocab_arrays *va)
{
    for (uint64_t i = 0; i < va->n; i++) {
        if (va->scores) t->score[i] = gguf_arr_f32(va->scores, i);
        if (isnan(t->score[i])) t->score[i] = -INFINITY;   /* keeps the heap order total */
        int64_t ty = va->types ? gguf_arr_int(va->types, i) : TT_NORMAL;
        t->type[i] = (uint8_t)(ty >= 0 && ty <= TT_BYTE ? ty : TT_UNDEFINED);
        /* Without a type array, SPM byte tokens are known by their text. */
        if (!va->types && t->kind == SW_TOK_SPM && byte_token_value(t->arena + t->off[i], t->len[i]) >= 0)
            t->type[i] = TT_BYTE;
    }
}

/* Without a type array, BOS, EOS and UNK are known by their ids. */
static void mark_specials(sw_tokenizer *t, bool has_types)
{
    if (has_types) return;
    if (t->bos >= 0) t->type[t->bos] = TT_CONTROL;
    if (t->eos >= 0) t->type[t->eos] = TT_CONTROL;
    if (t->unk >= 0) t->type[t->unk] = TT_UNKNOWN;
}

/* A WordPiece special: the file's id under key (else key2), else the
 * token of that text, else -1. */
static int32_t wpm_id(const sw_tokenizer *t, const gguf_file *f, const char *key, const char *key2, const char *text)
{
    int32_t id = meta_id(f, key, -1, t->n_vocab);
    if (id < 0 && key2) id = meta_id(f, key2, -1, t->n_vocab);
    return id >= 0 ? id : map_get(&t->vocab, text, strlen(text));
}

static int32_t wpm_lookup(const void *vocab, const char *s, size_t n) { return map_get(vocab, s, n); }

/* WordPiece: [CLS] is its BOS and [SEP] its EOS (cls_token_id, else
 * bos_token_id; seperator_token_id, as llama.cpp spells the key, else
 * eos_token_id; else the tokens of those texts), and both go around every
 * input, as BERT was trained, unless the file says not: add_bos_token
 * false leaves [CLS] out, add_eos_token false (gguf-py writes true, with
 * add_sep_token, which it means for pairs, false) [SEP] unless
 * add_sep_token is true. The vocabulary tells the rest: uncased when no token but
 * the bracketed specials has an upper-case letter, llama.cpp's spelling
 * when a piece starts with U+2581. */
static void load_wpm(sw_tokenizer *t, const gguf_file *f)
{
    t->bos = wpm_id(t, f, "tokenizer.ggml.cls_token_id", "tokenizer.ggml.bos_token_id", "[CLS]");
    t->eos = wpm_id(t, f, "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.eos_token_id", "[SEP]");
    t->unk = wpm_id(t, f, "tokenizer.ggml.unknown_token_id", NULL, "[UNK]");
    if (!gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos)) t->add_bos = true;
    bool sep = false;
    if (!gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos)) t->add_eos = true;
    if (gguf_get_bool(f, "tokenizer.ggml.add_sep_token", &sep)) t->add_eos = t->add_eos || sep;
    bool upper = false, phantom = false;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->arena + t->off[i];
        uint32_t n = t->len[i];
        if (t->type[i] == TT_CONTROL || (n >= 2 && s[0] == '[' && s[n - 1] == ']')) continue;
        phantom = phantom || (n >= 3 && !memcmp(s, "\xE2\x96\x81", 3));
        for (uint32_t k = 0; k < n && !upper; k++) upper = s[k] >= 'A' && s[k] <= 'Z';
    }
    t->wpm = (sw_wpm){ wpm_lookup, &t->vocab, !upper, phantom, t->unk };
}

/* The special ids, the space-prefix and BOS rules and (BPE) the
 * pre-tokenizer; has_types: f gave token types. False with err set. */
static bool load_specials(sw_tokenizer *t, const gguf_file *f, bool has_types, char *err, size_t errlen)
{
    const sw_tok_kind kind = t->kind;
    int32_t nv = t->n_vocab;
    if (kind == SW_TOK_WPM) {
        load_wpm(t, f);
        mark_specials(t, has_types);
        return true;
    }
    t->bos = meta_id(f, "tokenizer.ggml.bos_token_id", kind == SW_TOK_SPM ? 1 : -1, nv);
    t->eos = meta_id(f, "tokenizer.ggml.eos_token_id", kind == SW_TOK_SPM ? 2 : -1, nv);
    t->unk = meta_id(f, "tokenizer.ggml.unknown_token_id", kind == SW_TOK_SPM ? 0 : -1, nv);
    if (!gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix))
        t->add_space_prefix = kind == SW_TOK_SPM;

    if (kind == SW_TOK_BPE) {
        gguf_str pre;
        bool named = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        char why[200];
        t->pretok = sw_pretok_new(named ? pre.ptr : NULL, named ? pre.len : 0, why, sizeof why);
        if (!t->pretok && named) {
            /* Not fatal: GPT-2's split is the closest general rule, but the
             * ids may differ from the model's own tokenizer. */
            fprintf(stderr, "tokenizer: %s, using gpt2's split\n", why);
            t->pretok = sw_pretok_new(NULL, 0, why, sizeof why);
        }
        if (!t->pretok) { sw_errf(err, errlen, "tokenizer: %s", why); return false; }
    }
    /* Without the key, BOS goes first for SentencePiece and for the BPE
     * families trained with it first (Llama 3's <|begin_of_text|>, Tekken's
     * <s>), as llama.cpp also defaults. */
    if (!gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos))
        t->add_bos = kind == SW_TOK_SPM || sw_pretok_default_bos(t->pretok);
    if (!gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos)) t->add_eos = false;
    mark_specials(t, has_types);
    return true;
}

sw_tokenizer *sw_tok_load(const gguf_file *f, char *err, size_t errlen)
{
    if (!f) { sw_errf(err, errlen, "%s", "no file"); return NULL; }
    sw_tok_kind kind;
    vocab_arrays va;
    if (!check_vocab(f, &kind, &va, err, errlen)) return NULL;

    sw_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { sw_errf(err, errlen, "%s", "out of memory"); return NULL; }
    t->kind = kind;
    t->n_vocab = (int32_t)va.n;
    t->score = calloc(va.n, sizeof *t->score);
    t->type = malloc(va.n);
    if (!t->score || !t->type) { sw_errf(err, errlen, "%s", "out of memory"); goto fail; }
    if (!load_tokens(t, va.tokens, err, errlen)) goto fail;
    load_scores_types(t, &va);
    if (kind == SW_TOK_BPE && !load_merges(t, f, err, errlen)) goto fail;
    if (!load_specials(t, f, va.types != NULL, err, errlen)) goto fail;
    if (!finish_load(t, f, err, errlen)) goto fail;
    if (!build_pieces(t)) { sw_errf(err, errlen, "%s", "tokenizer: out of memory"); goto fail; }
    return t;
fail:
    sw_tok_free(t);
    return NULL;
}

void sw_tok_free(sw_tokenizer *t)
{
    if (!t) return;
    free(t->arena); free(t->off); free(t->len); free(t->score); free(t->type);
    free(t->eog); free(t->vocab.slot); free(t->merges.slot); free(t->merge_arena);
    free(t->special);
    free(t->piece_arena); free(t->piece_off); free(t->by_first);
    sw_pretok_free(t->pretok);
    free(t);
}

sw_tok_kind sw_tok_kind_of(const sw_tokenizer *t) { return t->kind; }
int32_t sw_tok_n_vocab(const sw_tokenizer *t) { return t->n_vocab; }
int32_t sw_tok_bos(const sw_tokenizer *t) { return t->bos; }
int32_t sw_tok_eos(const sw_tokenizer *t) { return t->eos; }
bool sw_tok_add_bos(const sw_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool sw_tok_add_eos(const sw_tokenizer *t) { return t->add_eos && t->eos >= 0; }

bool sw_tok_is_eog(const sw_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int32_t sw_tok_lookup(const sw_tokenizer *t, const char *text)
{
    return text ? map_get(&t->vocab, text, strlen(text)) : -1;
}

/* ---- growable outputs ---- */

typedef struct { int32_t *v; size_t n, cap; bool oom; } idvec;

static void idvec_push(idvec *a, int32_t id)
{
    if (a->oom) return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) { a->oom = true; return; }
        a->v = v; a->cap = cap;
    }
    a->v[a->n++] = id;
}

/* ---- the shared merge engine ---- */

typedef struct { int prev, next; uint32_t off, len; } sym;
typedef struct { float prio; int left, right; uint32_t len; } pair;

typedef struct {
    const sw_tokenizer *t;
    const char *buf;         /* the text the symbols cover */
    sym *syms;
    pair *heap;
    size_t n_heap, cap_heap;
    char *scratch;           /* BPE: "left right" key */
    size_t cap_scratch;
    bool oom;
} merger;

/* Higher priority first; equal priority: leftmost first. */
static bool pair_before(const pair *a, const pair *b)
{
    if (a->prio != b->prio) return a->prio > b->prio;
    return a->left < b->left;
}

static void heap_push(merger *m, pair p)
{
    if (m->n_heap == m->cap_heap) {
        size_t cap = m->cap_heap ? m->cap_heap * 2 : 64;
        pair *h = realloc(m->heap, cap * sizeof *h);
        if (!h) { m->oom = true; return; }
        m->heap = h; m->cap_heap = cap;
    }
    size_t i = m->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &m->heap[parent])) break;
        m->heap[i] = m->heap[parent];
        i = parent;
    }
    m->heap[i] = p;
}

static pair heap_pop(merger *m)
{
    pair top = m->heap[0], last = m->heap[--m->n_heap];
    size_t i = 0, n = m->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&m->heap[c + 1], &m->heap[c])) c++;
        if (!pair_before(&m->heap[c], &last)) break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    if (n) m->heap[i] = last;
    return top;
}

/* SPM pieces that the merge may produce: not control, byte, unknown or unused. */
static int32_t spm_piece(const sw_tokenizer *t, const char *s, size_t n)
{
    int32_t id = map_get(&t->vocab, s, n);
    if (id < 0) return -1;
    uint8_t ty = t->type[id];
    return ty == TT_NORMAL || ty == TT_USER || ty == TT_UNDEFINED ? id : -1;
}

static void try_pair(merger *m, int l, int r)
{
    if (l < 0 || r < 0) return;
    const sym *a = &m->syms[l], *b = &m->syms[r];
    uint32_t len = a->len + b->len;
    pair p = { 0, l, r, len };
    if (m->t->kind == SW_TOK_SPM) {
        int32_t id = spm_piece(m->t, m->buf + a->off, len);   /* symbols are adjacent in buf */
        if (id < 0) return;
        p.prio = m->t->score[id];
    } else {
        size_t need = (size_t)len + 1;
        if (need > m->cap_scratch) {
            char *s = realloc(m->scratch, need * 2);
            if (!s) { m->oom = true; return; }
            m->scratch = s; m->cap_scratch = need * 2;
        }
        memcpy(m->scratch, m->buf + a->off, a->len);
        m->scratch[a->len] = ' ';
        memcpy(m->scratch + a->len + 1, m->buf + b->off, b->len);
        int32_t rank = map_get(&m->t->merges, m->scratch, need);
        if (rank < 0) return;
        p.prio = -(float)rank;
    }
    heap_push(m, p);
}

/* Merges the n symbols (already linked) until no candidate pair remains. */
static void run_merges(merger *m, int n)
{
    m->n_heap = 0;
    for (int i = 0; i + 1 < n; i++) try_pair(m, i, i + 1);
    while (m->n_heap > 0 && !m->oom) {
        pair p = heap_pop(m);
        sym *a = &m->syms[p.left], *b = &m->syms[p.right];
        /* Stale: a side was merged away or grew since the pair was queued. */
        if (a->len == 0 || b->len == 0 || a->next != p.right || a->len + b->len != p.len) continue;
        a->len += b->len;
        a->next = b->next;
        if (b->next >= 0) m->syms[b->next].prev = p.left;
        b->len = 0;
        try_pair(m, a->prev, p.left);
        try_pair(m, p.left, a->next);
    }
}

static bool ensure_syms(merger *m, size_t n)
{
    sym *s = realloc(m->syms, (n ? n : 1) * sizeof *s);
    if (!s) { m->oom = true; return false; }
    m->syms = s;
    return true;
}

/* ---- SPM ---- */

static void spm_encode(const sw_tokenizer *t, merger *m, const char *text, size_t len,
                       bool dummy_prefix, idvec *out)
{
    if (len == 0) return;
    /* Escape: each ' ' becomes "▁" (3 bytes), plus the optional prefix. */
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t blen = len + spaces * 2 + (dummy_prefix ? 3 : 0);
    char *buf = malloc(blen);
    if (!buf) { m->oom = true; return; }
    size_t p = 0;
    if (dummy_prefix) { memcpy(buf, "\xE2\x96\x81", 3); p = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(buf + p, "\xE2\x96\x81", 3); p += 3; }
        else buf[p++] = text[i];
    }
    if (!ensure_syms(m, blen)) { free(buf); return; }
    int n = 0;
    for (size_t i = 0; i < blen; n++) {
        /* Invalid UTF-8 bytes stay single symbols (and become byte tokens). */
        uint32_t c;
        size_t cl = (size_t)utf8_next((const uint8_t *)buf + i, blen - i, &c);
        m->syms[n] = (sym){ n - 1, -1, (uint32_t)i, (uint32_t)cl };
        if (n > 0) m->syms[n - 1].next = n;
        i += cl;
    }
    m->buf = buf;
    run_merges(m, n);
    for (int i = 0; i >= 0 && n > 0; i = m->syms[i].next) {
        const sym *s = &m->syms[i];
        int32_t id = spm_piece(t, buf + s->off, s->len);
        if (id >= 0) { idvec_push(out, id); continue; }
        if (!t->has_byte_tokens) {            /* no byte fallback: one <unk> per piece */
            if (t->unk >= 0) idvec_push(out, t->unk);
            continue;
        }
        for (uint32_t k = 0; k < s->len; k++) {
            int32_t b = t->byte_tok[(uint8_t)buf[s->off + k]];
            if (b < 0) b = t->unk;
            if (b >= 0) idvec_push(out, b);
        }
    }
    free(buf);
    m->buf = NULL;
}

/* Encodes one pre-token (bytes) with byte-level BPE. */
static void bpe_word(const sw_tokenizer *t, merger *m, const uint8_t *w, size_t len, idvec *out)
{
    char small[256];
    size_t blen = len * 2;                  /* mapped code points are < 0x800: <= 2 bytes each */
    char *buf = blen <= sizeof small ? small : malloc(blen);
    if (!buf) { m->oom = true; return; }
    if (!ensure_syms(m, len)) { if (buf != small) free(buf); return; }
    size_t p = 0;
    for (size_t i = 0; i < len; i++) {
        int k = sw_utf8_encode(byte_to_cp[w[i]], buf + p);
        m->syms[i] = (sym){ (int)i - 1, i + 1 < len ? (int)i + 1 : -1, (uint32_t)p, (uint32_t)k };
        p += (size_t)k;
    }
    /* Llama 3's and Tekken's tokenizers take a word that is itself a token as is. */
    int32_t whole = sw_pretok_whole_words(t->pretok) ? map_get(&t->vocab, buf, p) : -1;
    if (whole >= 0) {
        idvec_push(out, whole);
    } else {
        m->buf = buf;
        run_merges(m, (int)len);
        for (int i = 0; i >= 0; i = m->syms[i].next) {
            const sym *s = &m->syms[i];
            int32_t id = map_get(&t->vocab, buf + s->off, s->len);
            if (id >= 0) { idvec_push(out, id); continue; }
            /* Merges made a piece the vocab lacks: fall back to one token per byte. */
            for (uint32_t k = 0; k < s->len; ) {
                uint32_t c;
                int cl = utf8_next((const uint8_t *)buf + s->off + k, s->len - k, &c);
                int32_t b = c < 512 && cp_to_byte[c] >= 0 ? t->byte_tok[cp_to_byte[c]] : -1;
                if (b < 0) b = t->unk;
                if (b >= 0) idvec_push(out, b);
                k += (uint32_t)cl;
            }
        }
        m->buf = NULL;
    }
    if (buf != small) free(buf);
}

static void bpe_encode(const sw_tokenizer *t, merger *m, const char *text, size_t len, idvec *out)
{
    if (len == 0) return;
    sw_span *w;
    size_t n = sw_pretok_split(t->pretok, text, len, &w);
    if (n == SIZE_MAX) { m->oom = true; return; }
    for (size_t i = 0; i < n && !m->oom; i++) bpe_word(t, m, (const uint8_t *)text + w[i].off, w[i].len, out);
    free(w);
}

/* ---- encode ---- */

/* The special token whose text starts at s (longest first), or -1.
 * Control tokens only count when parse_special is set. */
static int32_t match_special(const sw_tokenizer *t, const char *s, size_t n, bool parse_special)
{
    uint8_t c = (uint8_t)s[0];
    if (!(t->special_first[c >> 3] & (1u << (c & 7)))) return -1;
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != TT_USER) continue;
        if (t->len[id] <= n && memcmp(t->arena + t->off[id], s, t->len[id]) == 0) return id;
    }
    return -1;
}

/* Every plain-text fragment starts the text or follows a special token; like
 * SentencePiece encoding each segment separately, each gets the dummy prefix. */
static void push_id(void *out, int32_t id) { idvec_push(out, id); }

static void encode_text(const sw_tokenizer *t, merger *m, const char *s, size_t n, idvec *out)
{
    if (t->kind == SW_TOK_SPM) spm_encode(t, m, s, n, t->add_space_prefix, out);
    else if (t->kind == SW_TOK_WPM) m->oom |= !sw_wpm_encode(&t->wpm, s, n, push_id, out);
    else bpe_encode(t, m, s, n, out);
}

int sw_tok_encode(const sw_tokenizer *t, const char *text, size_t len,
                  bool add_bos, bool parse_special, int32_t *out, int max)
{
    if (!t || (!text && len) || len > MAX_TEXT_LEN) return 0;
    idvec v = { 0 };
    merger m = { .t = t };
    if (add_bos && t->bos >= 0) idvec_push(&v, t->bos);
    size_t start = 0;
    /* User-defined tokens are always matched whole (as SentencePiece does);
     * control tokens only on request. */
    if ((parse_special && t->n_special > 0) || t->n_user > 0) {
        for (size_t i = 0; i < len; ) {
            int32_t id = match_special(t, text + i, len - i, parse_special);
            if (id < 0) { i++; continue; }
            encode_text(t, &m, text + start, i - start, &v);
            idvec_push(&v, id);
            i += t->len[id];
            start = i;
        }
    }
    encode_text(t, &m, text + start, len - start, &v);

    free(m.syms); free(m.heap); free(m.scratch);
    if (v.oom || m.oom) {
        fprintf(stderr, "tokenizer: out of memory encoding %zu bytes\n", len);
        free(v.v);
        return 0;
    }
    int needed = v.n > INT_MAX ? INT_MAX : (int)v.n;
    if (needed > max) { free(v.v); return -needed; }
    if (needed) memcpy(out, v.v, (size_t)needed * sizeof *out);
    free(v.v);
    return needed;
}

/* ---- decode ---- */

/* Writes the piece into buf, which must hold at least max_len + 8 bytes. */
static size_t piece_raw(const sw_tokenizer *t, int32_t id, char *buf)
{
    if (id < 0 || id >= t->n_vocab) return 0;
    const char *s = t->arena + t->off[id];
    uint32_t n = t->len[id];
    switch (t->type[id]) {
    case TT_CONTROL: case TT_UNUSED: return 0;
    case TT_UNKNOWN: memcpy(buf, " \xE2\x81\x87 ", 5); return 5;   /* " ⁇ " as SentencePiece shows <unk> */
    case TT_USER: memcpy(buf, s, n); return n;
    case TT_BYTE: {
        int v = byte_token_value(s, n);
        if (v >= 0) { buf[0] = (char)v; return 1; }
        break;
    }
    default: break;
    }
    size_t p = 0;
    if (t->kind == SW_TOK_WPM && !t->wpm.phantom) {   /* "##ing" -> "ing", "play" -> " play" */
        if (n >= 2 && s[0] == '#' && s[1] == '#') { memcpy(buf, s + 2, n - 2); return n - 2; }
        buf[0] = ' ';
        memcpy(buf + 1, s, n);
        return n + 1;
    }
    if (t->kind != SW_TOK_BPE) {   /* SPM, and WordPiece as llama.cpp spells it */
        for (uint32_t i = 0; i < n; ) {
            if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) { buf[p++] = ' '; i += 3; }
            else buf[p++] = s[i++];
        }
        return p;
    }
    for (uint32_t i = 0; i < n; ) {           /* undo the byte -> code point mapping */
        uint32_t c;
        int k = utf8_next((const uint8_t *)s + i, n - i, &c);
        if (c < 512 && cp_to_byte[c] >= 0) buf[p++] = (char)cp_to_byte[c];
        else { memcpy(buf + p, s + i, (size_t)k); p += (size_t)k; }
        i += (uint32_t)k;
    }
    return p;
}

size_t sw_tok_piece(const sw_tokenizer *t, int32_t id, char *buf, size_t buflen)
{
    size_t n;
    const char *p = sw_tok_piece_ref(t, id, &n);
    if (n > buflen) n = buflen;
    if (n) memcpy(buf, p, n);
    return n;
}

const char *sw_tok_piece_ref(const sw_tokenizer *t, int32_t id, size_t *n)
{
    if (id < 0 || id >= t->n_vocab) { *n = 0; return ""; }
    *n = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece_arena + t->piece_off[id];
}

const int32_t *sw_tok_ids_by_first_byte(const sw_tokenizer *t, uint8_t b, size_t *n)
{
    *n = t->first_off[b + 1] - t->first_off[b];
    return t->by_first + t->first_off[b];
}

void sw_detok_init(sw_detok *d, const sw_tokenizer *t, bool strip_leading_space)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->strip_leading_space = strip_leading_space;
    d->at_start = true;
}

typedef struct { char *out; size_t cap, n; } sink;  /* cap excludes the NUL */

static void sink_put(sink *k, const char *s, size_t n)
{
    if (n > k->cap - k->n) return;            /* never split a character: drop what does not fit */
    memcpy(k->out + k->n, s, n);
    k->n += n;
}

static void put_replacement(sink *k) { sink_put(k, "\xEF\xBF\xBD", 3); }

/* Feeds bytes through the UTF-8 state in d: complete characters go to the
 * sink, an incomplete tail stays pending, invalid bytes become U+FFFD. */
static void utf8_feed(sw_detok *d, const uint8_t *in, size_t n, sink *k)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = in[i];
        if (d->n_pending == 0) {
            int need = sw_utf8_seq_len(b);
            if (b < 0x80) sink_put(k, (const char *)&in[i], 1);
            else if (need == 0) put_replacement(k);
            else d->pending[d->n_pending++] = (char)b;
            i++;
            continue;
        }
        uint8_t lead = (uint8_t)d->pending[0];
        if (!sw_utf8_cont_ok(lead, d->n_pending, b)) {
            /* The pending prefix can never complete: replace it, then look at b afresh. */
            put_replacement(k);
            d->n_pending = 0;
            continue;
        }
        d->pending[d->n_pending++] = (char)b;
        i++;
        if (d->n_pending == sw_utf8_seq_len(lead)) {
            sink_put(k, d->pending, (size_t)d->n_pending);
            d->n_pending = 0;
        }
    }
}

size_t sw_detok_push(sw_detok *d, int32_t id, char *out, size_t outcap)
{
    if (!out || outcap == 0) return 0;
    sink k = { out, outcap - 1, 0 };
    const sw_tokenizer *t = d->tok;
    char small[256];
    size_t need = (size_t)t->max_len + 8;
    char *buf = need <= sizeof small ? small : malloc(need);
    if (buf) {
        size_t n = piece_raw(t, id, buf);
        const char *p = buf;
        if (n > 0 && d->at_start) {
            d->at_start = false;
            /* SentencePiece drops the dummy-prefix space when decoding from the start. */
            if (d->strip_leading_space && t->kind == SW_TOK_SPM && t->add_space_prefix && p[0] == ' ') { p++; n--; }
        }
        utf8_feed(d, (const uint8_t *)p, n, &k);
        if (buf != small) free(buf);
    }
    out[k.n] = 0;
    return k.n;
}

size_t sw_detok_flush(sw_detok *d, char *out, size_t outcap)
{
    if (!out || outcap == 0) { d->n_pending = 0; return 0; }
    sink k = { out, outcap - 1, 0 };
    if (d->n_pending > 0) put_replacement(&k);
    d->n_pending = 0;
    out[k.n] = 0;
    return k.n;
}
