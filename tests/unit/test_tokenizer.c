/* Tokenizer tests: llama.cpp's vocab test vectors (SPM and GPT-2 BPE), the
 * stories260K prompt, round trips through the streaming detokenizer, UTF-8
 * hold-back and replacement, special-token parsing, and the Llama-3
 * pre-tokenizer split on a vocabulary built here. */
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"
#include "llm/gguf.h"
#include "llm/tokenizer.h"

#include <cjson/cJSON.h>

#include <stdint.h>
#include <unistd.h>

/* Decodes ids with the streaming detokenizer into a malloc'd string. */
static char *detok_all(const sw_tokenizer *t, const int32_t *ids, int n, bool strip)
{
    size_t cap = 64, len = 0;
    char *s = malloc(cap), buf[1024];
    sw_detok d;
    sw_detok_init(&d, t, strip);
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? sw_detok_push(&d, ids[i], buf, sizeof buf) : sw_detok_flush(&d, buf, sizeof buf);
        CHECK(buf[k] == 0, "output not NUL-terminated");
        while (len + k + 1 > cap) s = realloc(s, cap *= 2);
        memcpy(s + len, buf, k);
        len += k;
    }
    s[len] = 0;
    return s;
}

/* Runs every case of NAME.inp against NAME.out; returns the case count. */
static int run_vocab_file(const char *name, bool check_roundtrip)
{
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "vocab/%s", name);
    shared_path(path, sizeof path, rel);
    if (access(path, R_OK) != 0) SKIP_TEST("%s missing", path);
    char err[256];
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL, "%s: %s", path, err);
    if (!f) return 0;
    sw_tokenizer *t = sw_tok_load(f, err, sizeof err);
    CHECK(t != NULL, "%s: %s", path, err);
    if (!t) { gguf_close(f); return 0; }

    char inp_path[600], out_path[600];
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    size_t inp_len, out_len;
    char *inp = read_file(inp_path, &inp_len), *outs = read_file(out_path, &out_len);
    CHECK(inp && outs, "cannot read %s / %s", inp_path, out_path);
    if (!inp || !outs) { free(inp); free(outs); sw_tok_free(t); gguf_close(f); return 0; }

    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep);
    char *p = inp, *line = outs;
    int cases = 0;
    for (;;) {
        char *end = strstr(p, sep);
        if (!end) break;                         /* the piece after the last separator is empty */
        size_t len = (size_t)(end - p);
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL, "%s: fewer output lines than inputs", name);
        if (!nl) break;
        *nl = 0;
        int32_t want[4096];
        int n_want = 0;
        for (char *q = line; *q; ) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q) break;
            want[n_want++] = (int32_t)v;
            q = e;
        }
        int32_t got[4096];
        int n = sw_tok_encode(t, p, len, false, false, got, 4096);
        bool same = n == n_want && memcmp(got, want, (size_t)n * sizeof *got) == 0;
        CHECK(same, "%s case %d (%.40s...): got %d tokens, want %d (first diff shown below)", name, cases, p, n, n_want);
        if (!same) {
            for (int i = 0; i < n || i < n_want; i++)
                if (i >= n || i >= n_want || got[i] != want[i]) {
                    fprintf(stderr, "  at %d: got %d want %d\n", i, i < n ? got[i] : -1, i < n_want ? want[i] : -1);
                    break;
                }
        }
        /* Too small an output buffer reports the size needed. */
        if (n > 1) CHECK(sw_tok_encode(t, p, len, false, false, got, n - 1) == -n, "%s case %d: -(needed)", name, cases);
        if (check_roundtrip && n > 0) {
            char *text = detok_all(t, got, n, true);
            CHECK(strlen(text) == len && memcmp(text, p, len) == 0, "%s case %d: round trip gave '%s'", name, cases, text);
            free(text);
        }
        cases++;
        p = end + seplen;
        line = nl + 1;
    }
    free(inp); free(outs);
    sw_tok_free(t);
    gguf_close(f);
    return cases;
}

/* Arbitrary bytes (invalid UTF-8 included) encode without trouble and the
 * raw pieces give the bytes back: byte fallback (SPM) and the byte-level
 * mapping (BPE) lose nothing. SPM adds its dummy-prefix space. */
static void test_random_bytes(const char *rel)
{
    gguf_file *f;
    char path[512], err[256];
    shared_path(path, sizeof path, rel);
    f = gguf_open(path, err, sizeof err);
    if (!f) return;
    sw_tokenizer *t = sw_tok_load(f, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (!t) { gguf_close(f); return; }
    uint32_t seed = 12345;
    int bad = 0;
    for (int r = 0; r < 300; r++) {
        unsigned char text[200];
        size_t len = (size_t)(r % 199) + 1;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            /* Mostly ASCII, some high bytes, some spaces. */
            unsigned v = (seed >> 16) & 0xFF;
            text[i] = (unsigned char)(v < 100 ? 'a' + v % 26 : v < 130 ? ' ' : v);
        }
        int32_t ids[1024];
        int n = sw_tok_encode(t, (const char *)text, len, false, false, ids, 1024);
        char back[4096];
        size_t pos = 0;
        for (int i = 0; i < n; i++) pos += sw_tok_piece(t, ids[i], back + pos, sizeof back - pos);
        const char *want = (const char *)text;
        size_t want_len = len;
        char spm[256];
        if (sw_tok_kind_of(t) == SW_TOK_SPM) { spm[0] = ' '; memcpy(spm + 1, text, len); want = spm; want_len = len + 1; }
        bad += !(n > 0 && pos == want_len && memcmp(back, want, pos) == 0);
    }
    CHECK(bad == 0, "%s: %d random byte strings did not survive encode + pieces", rel, bad);
    if (sw_tok_kind_of(t) == SW_TOK_BPE) {
        int32_t ids[16];
        const char *s = "a<|endoftext|>b";
        int n = sw_tok_encode(t, s, strlen(s), false, true, ids, 16);
        CHECK(n == 3 && ids[1] == 50256 && sw_tok_is_eog(t, 50256), "gpt-2 special: %d tokens", n);
        n = sw_tok_encode(t, s, strlen(s), false, false, ids, 16);
        CHECK(n > 3, "gpt-2 without parse_special: %d tokens", n);
    }
    sw_tok_free(t);
    gguf_close(f);
}

/* The golden models' token files are llama.cpp's tokenization of the text
 * in NAME.json (with BOS where the vocab adds one): ours must agree. */
static void test_golden_tokens(const char *name)
{
    char rel[256], path[512], err[256];
    snprintf(rel, sizeof rel, "golden/%s.json", name);
    shared_path(path, sizeof path, rel);
    size_t len;
    char *json = read_file(path, &len);
    if (!json) { printf("%s missing: its test is skipped\n", path); return; }
    cJSON *root = cJSON_Parse(json);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    CHECK(cJSON_IsString(text), "%s: no text", path);
    snprintf(rel, sizeof rel, "golden/%s.tokens", name);
    shared_path(path, sizeof path, rel);
    char *want_s = read_file(path, &len);
    snprintf(rel, sizeof rel, "golden/%s.gguf", name);
    shared_path(path, sizeof path, rel);
    gguf_file *f = want_s && cJSON_IsString(text) ? gguf_open(path, err, sizeof err) : NULL;
    CHECK(f != NULL, "%s: cannot open model or tokens", name);
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    if (t) {
        int32_t want[4096], got[4096];
        int n_want = 0;
        for (char *q = want_s, *e; n_want < 4096; q = e) {
            long v = strtol(q, &e, 10);
            if (e == q) break;
            want[n_want++] = (int32_t)v;
        }
        const char *s = text->valuestring;
        int n = sw_tok_encode(t, s, strlen(s), sw_tok_add_bos(t), false, got, 4096);
        CHECK(n == n_want && n > 0 && memcmp(got, want, (size_t)n * sizeof *got) == 0,
              "%s: tokens differ from llama.cpp's (%d vs %d)", name, n, n_want);
        sw_tok_free(t);
    }
    if (f) gguf_close(f);
    cJSON_Delete(root);
    free(json);
    free(want_s);
}

static void test_stories(void)
{
    char path[512], err[256];
    shared_path(path, sizeof path, "models/stories260K.gguf");
    if (access(path, R_OK) != 0) { printf("stories260K.gguf missing: its test is skipped\n"); return; }
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL, "%s", err);
    if (!f) return;
    sw_tokenizer *t = sw_tok_load(f, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (!t) { gguf_close(f); return; }
    CHECK(sw_tok_kind_of(t) == SW_TOK_SPM, "%s", "failed");
    CHECK(sw_tok_n_vocab(t) == 512, "%s", "failed");
    CHECK(sw_tok_add_bos(t), "%s", "failed");
    int32_t ids[32];
    const char *s = "Once upon a time";
    int n = sw_tok_encode(t, s, strlen(s), sw_tok_add_bos(t), false, ids, 32);
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    CHECK(n == 5 && memcmp(ids, want, sizeof want) == 0, "got %d tokens: %d %d %d %d %d", n, ids[0], ids[1], ids[2], ids[3], ids[4]);
    CHECK(sw_tok_is_eog(t, 2) && !sw_tok_is_eog(t, 403), "%s", "failed");
    /* BOS decodes to nothing; the first piece's dummy space goes when strip is set. */
    char *text = detok_all(t, ids, n, true);
    CHECK(strcmp(text, "Once upon a time") == 0, "'%s'", text);
    free(text);
    text = detok_all(t, ids, n, false);
    CHECK(strcmp(text, " Once upon a time") == 0, "'%s'", text);
    free(text);
    sw_tok_free(t);
    gguf_close(f);
}

static sw_tokenizer *load_shared(const char *rel, gguf_file **fp)
{
    char path[512], err[256];
    shared_path(path, sizeof path, rel);
    *fp = gguf_open(path, err, sizeof err);
    if (!*fp) return NULL;
    sw_tokenizer *t = sw_tok_load(*fp, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    return t;
}

/* UTF-8 hold-back, U+FFFD for invalid bytes, special tokens, lookups. */
static void test_spm_details(void)
{
    gguf_file *f;
    sw_tokenizer *t = load_shared("vocab/ggml-vocab-llama-spm.gguf", &f);
    if (!t) { if (f) gguf_close(f); return; }
    char buf[64];
    sw_detok d;
    /* "🦙" is F0 9F A6 99: byte tokens 3 + value. Nothing comes out until the last byte. */
    sw_detok_init(&d, t, false);
    const uint8_t llama[4] = { 0xF0, 0x9F, 0xA6, 0x99 };
    for (int i = 0; i < 3; i++)
        CHECK(sw_detok_push(&d, 3 + llama[i], buf, sizeof buf) == 0 && buf[0] == 0, "byte %d emitted early", i);
    size_t k = sw_detok_push(&d, 3 + llama[3], buf, sizeof buf);
    CHECK(k == 4 && memcmp(buf, llama, 4) == 0, "emoji not emitted whole (%zu bytes)", k);
    /* A stray 0xFF is replaced; a partial sequence cut by ASCII is replaced and the ASCII kept. */
    k = sw_detok_push(&d, 3 + 0xFF, buf, sizeof buf);
    CHECK(k == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0, "0xFF -> U+FFFD (%zu)", k);
    CHECK(sw_detok_push(&d, 3 + 0xE2, buf, sizeof buf) == 0, "%s", "failed");
    k = sw_detok_push(&d, 3 + 'A', buf, sizeof buf);
    CHECK(k == 4 && memcmp(buf, "\xEF\xBF\xBD" "A", 4) == 0, "cut sequence (%zu)", k);
    /* An overlong lead (E0 80) is invalid at its second byte. */
    CHECK(sw_detok_push(&d, 3 + 0xE0, buf, sizeof buf) == 0, "%s", "failed");
    k = sw_detok_push(&d, 3 + 0x80, buf, sizeof buf);
    CHECK(k == 6 && memcmp(buf, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0, "E0 80 (%zu)", k);
    /* Held bytes at the end are flushed as one U+FFFD. */
    CHECK(sw_detok_push(&d, 3 + 0xF0, buf, sizeof buf) == 0, "%s", "failed");
    CHECK(sw_detok_push(&d, 3 + 0x9F, buf, sizeof buf) == 0, "%s", "failed");
    k = sw_detok_flush(&d, buf, sizeof buf);
    CHECK(k == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0, "flush (%zu)", k);
    CHECK(sw_detok_flush(&d, buf, sizeof buf) == 0, "%s", "failed");
    /* Control tokens decode to nothing; pieces map ▁ to a space. */
    CHECK(sw_tok_piece(t, 1, buf, sizeof buf) == 0, "%s", "failed");
    k = sw_tok_piece(t, 15043, buf, sizeof buf);
    CHECK(k == 6 && memcmp(buf, " Hello", 6) == 0, "piece 15043");
    CHECK(sw_tok_piece(t, 3 + 'z', buf, sizeof buf) == 1 && buf[0] == 'z', "%s", "failed");
    CHECK(sw_tok_piece(t, -5, buf, sizeof buf) == 0 && sw_tok_piece(t, 1 << 20, buf, sizeof buf) == 0, "%s", "failed");
    /* A tiny output buffer truncates, never overflows. */
    sw_detok_init(&d, t, false);
    CHECK(sw_detok_push(&d, 15043, buf, 4) <= 3 && strlen(buf) <= 3, "%s", "failed");

    CHECK(sw_tok_lookup(t, "<s>") == 1 && sw_tok_lookup(t, "▁Hello") == 15043 && sw_tok_lookup(t, "no such") == -1, "%s", "failed");
    CHECK(sw_tok_bos(t) == 1 && sw_tok_eos(t) == 2 && sw_tok_add_bos(t), "%s", "failed");
    /* parse_special turns "<s>"/"</s>" text into the control tokens; otherwise they are plain text. */
    int32_t ids[64];
    const char *s = "<s>Hello</s>";
    int n = sw_tok_encode(t, s, strlen(s), false, true, ids, 64);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 2, "special: n=%d %d %d %d", n, ids[0], ids[1], ids[2]);
    n = sw_tok_encode(t, s, strlen(s), false, false, ids, 64);
    bool has_control = false;
    for (int i = 0; i < n; i++) has_control |= ids[i] == 1 || ids[i] == 2;
    CHECK(n > 3 && !has_control, "no parse_special: %d tokens", n);
    n = sw_tok_encode(t, "Hello", 5, true, false, ids, 64);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 15043, "%s", "failed");
    CHECK(sw_tok_encode(t, "", 0, true, false, ids, 64) == 1, "%s", "failed");
    CHECK(sw_tok_encode(t, "", 0, true, false, ids, 0) == -1, "%s", "failed");

    /* A long input stays fast (heap merge) and round-trips. */
    size_t len = 200000;
    char *big = malloc(len + 1);
    for (size_t i = 0; i < len; i++) big[i] = "the quick brown fox jumps over a lazy dog\n"[i % 42];
    big[len] = 0;
    int32_t *many = malloc(len * sizeof *many);
    n = sw_tok_encode(t, big, len, false, false, many, (int)len);
    CHECK(n > 1000 && n < (int)len / 2, "long input: %d tokens", n);
    char *text = detok_all(t, many, n, true);
    CHECK(strcmp(text, big) == 0, "long round trip");
    free(text); free(many); free(big);
    sw_tok_free(t);
    gguf_close(f);
}

/* ---- a byte-level BPE vocab built here, to test the Llama-3 split ---- */

/* The byte-level form of raw text (what the vocab stores). */
static char *mapped(const char *s)
{
    char *o = malloc(strlen(s) * 2 + 1), *p = o;
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        int c = gpt2_byte_cp(*q);
        if (c < 0x80) *p++ = (char)c;
        else { *p++ = (char)(0xC0 | (c >> 6)); *p++ = (char)(0x80 | (c & 0x3F)); }
    }
    *p = 0;
    return o;
}

static void test_llama3_split(void)
{
    /* The Llama-3 tokenizer emits a pre-token that is itself in the vocab
     * whole, so with all 256 byte tokens plus the expected pre-tokens, each
     * correctly split word comes out as one token and a wrong split shows up
     * as byte tokens. */
    const char *words[] = {
        "Hello", " world", "'S", " ", "123", "456", "\n\n", " x", "!!!\n", " (", "tab", "\tword",
        "  \n", "end", " é", ",日本", " 語", ",", "٣٤", "'ll", NULL };
    const char *text = "Hello world'S  123456\n\n  x!!!\n (tab\tword  \nend  \xC3\xA9,\xE6\x97\xA5\xE6\x9C\xAC \xE8\xAA\x9E,\xD9\xA3\xD9\xA4'll";
    const char *expect[] = {
        "Hello", " world", "'S", " ", " ", "123", "456", "\n\n", " ", " x", "!!!\n", " (", "tab", "\tword",
        "  \n", "end", " ", " é", ",日本", " 語", ",", "٣٤", "'ll", NULL };
    int n_words = 0;
    while (words[n_words]) n_words++;
    const char *toks[256 + 32];
    char *own[256 + 32];
    int nt = 0;
    for (int b = 0; b < 256; b++) {
        char raw[2] = { (char)b, 0 };
        own[nt] = b ? mapped(raw) : strdup("\xC4\x80");  /* byte 0 maps to U+0100 */
        toks[nt] = own[nt]; nt++;
    }
    for (int i = 0; i < n_words; i++) {
        own[nt] = mapped(words[i]);
        toks[nt] = own[nt];
        nt++;
    }
    const char *merges[] = { "a b" };
    char path[] = "/tmp/sw_test_llama3_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "%s", "failed");
    if (fd < 0) return;
    close(fd);
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "llama-bpe");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)nt);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    char err[256];
    bool ok = gguf_writer_write(w, path, err, sizeof err);
    CHECK(ok, "%s", err);
    gguf_writer_free(w);
    gguf_file *f = ok ? gguf_open(path, err, sizeof err) : NULL;
    CHECK(f != NULL, "%s", err);
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(sw_tok_kind_of(t) == SW_TOK_BPE, "%s", "failed");
        int32_t ids[256];
        int n = sw_tok_encode(t, text, strlen(text), false, false, ids, 256);
        int k = 0;
        for (; expect[k]; k++) {
            char *m = mapped(expect[k]);
            int want = sw_tok_lookup(t, m);   /* single bytes keep their byte token's id */
            free(m);
            CHECK(k < n && ids[k] == want, "pre-token %d ('%s'): got id %d, want %d", k, expect[k], k < n ? ids[k] : -1, want);
        }
        CHECK(n == k, "%d tokens, want %d", n, k);
        char *back = detok_all(t, ids, n, true);
        CHECK(strcmp(back, text) == 0, "BPE round trip: '%s'", back);
        free(back);
        sw_tok_free(t);
    }
    if (f) gguf_close(f);
    unlink(path);
    for (int i = 0; i < nt; i++) free(own[i]);
}

/* A small SPM vocab built here: merge order by score, a user-defined token
 * matched even without parse_special, no byte tokens (unknown chars -> <unk>). */
static void test_constructed_spm(void)
{
    const char *toks[] = { "<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "<tag>" };
    const float scores[] = { 0, 0, 0, -1.0f, -2.0f, -2.0f, -0.5f, -0.1f, 0 };
    const int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 4 };
    char path[] = "/tmp/sw_test_spm_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 9);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, 9);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 9);
    gguf_file *f = write_and_open(w, path);
    char err[256] = "";
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    CHECK(t != NULL, "%s", err);
    if (t) {
        int32_t ids[16];
        /* "▁ab": "ab" (-0.1) beats "▁a" (-0.5); "▁ab" is not a piece. */
        int n = sw_tok_encode(t, "ab", 2, false, false, ids, 16);
        CHECK(n == 2 && ids[0] == 3 && ids[1] == 7, "score order: n=%d %d %d", n, ids[0], ids[1]);
        n = sw_tok_encode(t, "a<tag>b", 7, false, false, ids, 16);
        CHECK(n == 4 && ids[0] == 6 && ids[1] == 8 && ids[2] == 3 && ids[3] == 5,
              "user-defined: n=%d %d %d %d %d", n, ids[0], ids[1], ids[2], ids[3]);
        n = sw_tok_encode(t, "<s>", 3, false, false, ids, 16);
        CHECK(n == 4 && ids[0] == 3 && ids[1] == 0 && ids[2] == 0 && ids[3] == 0, "unknown chars: n=%d", n);
        n = sw_tok_encode(t, "<s>", 3, true, true, ids, 16);
        CHECK(n == 2 && ids[0] == 1 && ids[1] == 1, "parse_special + BOS: n=%d", n);
        char buf[16];
        size_t k = sw_tok_piece(t, 0, buf, sizeof buf);
        CHECK(k == 5 && memcmp(buf, " \xE2\x81\x87 ", 5) == 0, "<unk> piece");
        CHECK(sw_tok_piece(t, 8, buf, sizeof buf) == 5 && memcmp(buf, "<tag>", 5) == 0, "user piece");
        CHECK(sw_tok_is_eog(t, 2) && !sw_tok_is_eog(t, 1), "eog");
        sw_tok_free(t);
    }
    if (f) gguf_close(f);
    unlink(path);
}

static void test_bad_metadata(void)
{
    char path[] = "/tmp/sw_test_badtok_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    const char *toks[] = { "a", "b" };
    const float scores[] = { 0.0f };
    const char *cases[][2] = { { "llama", "scores" }, { "t5", "model" }, { NULL, "model" }, { "gpt2", "merges" } };
    for (int c = 0; c < 4; c++) {
        gguf_writer *w = gguf_writer_new();
        if (cases[c][0]) gguf_w_str(w, "tokenizer.ggml.model", cases[c][0]);
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
        if (c == 0) gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, 1);   /* wrong length */
        gguf_file *f = write_and_open(w, path);
        if (!f) continue;
        char err[256] = "";
        sw_tokenizer *t = sw_tok_load(f, err, sizeof err);
        CHECK(t == NULL && strstr(err, cases[c][1]) != NULL, "case %d: error '%s' should name %s", c, err, cases[c][1]);
        sw_tok_free(t);
        gguf_close(f);
    }
    unlink(path);
}

/* A writer holding a byte-level BPE vocabulary: its tokens, merges and
 * pre-tokenizer. */
static gguf_writer *bpe_vocab(const char *pre, const char **toks, int nt, const char **merges, int nm)
{
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)nt);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)nm);
    return w;
}

/* Whether BOS goes first when the file has no tokenizer.ggml.add_bos_token:
 * yes for Llama 3's and Tekken's BPE, no for GPT-2's or DeepSeek's (as llama.cpp decides it); the key,
 * when present, wins. */
/* WordPiece over a vocabulary in llama.cpp's spelling: BERT's normalization
 * (uncased: lower case, accents stripped), punctuation split off, the
 * longest pieces, [UNK] for a word without them; [CLS] is BOS and [SEP]
 * EOS, both added by default. (tests/test_encoders.py checks many more
 * texts against the tokenizers package.) */
static void test_wordpiece(void)
{
    char path[] = "/tmp/sw_test_wpm_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    const char *toks[] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "\xE2\x96\x81hello", "\xE2\x96\x81he", "llo", ",", "\xE2\x96\x81,",
                           "\xE2\x96\x81!", "\xE2\x96\x81\xE6\x9D\xB1", "\xE2\x96\x81x" };
    const int32_t types[] = { 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "bert");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 12);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 12);
    gguf_file *f = write_and_open(w, path);
    char err[256] = "";
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    CHECK(t != NULL, "bert vocabulary: %s", err);
    if (t) {
        CHECK(sw_tok_kind_of(t) == SW_TOK_WPM && sw_tok_bos(t) == 2 && sw_tok_eos(t) == 3, "kind and specials");
        CHECK(sw_tok_add_bos(t) && sw_tok_add_eos(t), "[CLS] and [SEP] added by default");
        int32_t ids[32];
        const char *text = "H\xC3\xA9LLO, he\tqq!\xE6\x9D\xB1x";   /* HéLLO, he<tab>qq!東x */
        int n = sw_tok_encode(t, text, strlen(text), true, false, ids, 32);
        const int32_t want[] = { 2, 4, 8, 5, 1, 9, 10, 11 };
        CHECK(n == 8 && !memcmp(ids, want, sizeof want), "wordpiece: n=%d", n);
        char buf[16];
        CHECK(sw_tok_piece(t, 4, buf, sizeof buf) == 6 && !memcmp(buf, " hello", 6), "a word's first piece");
        CHECK(sw_tok_piece(t, 6, buf, sizeof buf) == 3 && !memcmp(buf, "llo", 3), "a continuation");
        n = sw_tok_encode(t, "hehello", 7, false, false, ids, 32);
        CHECK(n == 1 && ids[0] == 1, "no pieces: [UNK], n=%d", n);
        sw_tok_free(t);
    }
    if (f) gguf_close(f);
    unlink(path);
}

static void test_add_bos_default(void)
{
    char path[] = "/tmp/sw_test_addbos_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    const char *toks[] = { "a", "b", "ab", "<|begin_of_text|>" }, *merges[] = { "a b" };
    const struct { const char *pre; int key; bool want; } cases[] = {
        { "gpt2", -1, false }, { "llama-bpe", -1, true }, { "llama-bpe", 0, false }, { "gpt2", 1, true },
        { "tekken", -1, true }, { "deepseek-v3", -1, false } };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        gguf_writer *w = bpe_vocab(cases[c].pre, toks, 4, merges, 1);
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 3);
        if (cases[c].key >= 0) gguf_w_bool(w, "tokenizer.ggml.add_bos_token", cases[c].key);
        gguf_file *f = write_and_open(w, path);
        if (!f) continue;
        char err[256] = "";
        sw_tokenizer *t = sw_tok_load(f, err, sizeof err);
        CHECK(t != NULL, "case %d: %s", c, err);
        if (t) {
            CHECK(sw_tok_add_bos(t) == cases[c].want, "case %d (pre %s, key %d): add_bos %d", c, cases[c].pre,
                  cases[c].key, sw_tok_add_bos(t));
            int32_t ids[8];
            int n = sw_tok_encode(t, "ab", 2, sw_tok_add_bos(t), false, ids, 8);
            CHECK(n == 1 + cases[c].want && ids[0] == (cases[c].want ? 3 : 2), "case %d: %d tokens, first %d", c, n,
                  n > 0 ? ids[0] : -1);
        }
        sw_tok_free(t);
        gguf_close(f);
    }
    unlink(path);
}

/* Qwen2's split is Llama 3's with single digits (\p{N}, not \p{N}{1,3}):
 * with a merge "1 2", llama-bpe makes "123" -> "12" "3", qwen2 keeps every
 * digit apart, and so does refact (StarCoder's digits-first split, Granite
 * 3's files), where gpt2 takes the digits as one word. */
static void test_qwen2_digits(void)
{
    char path[] = "/tmp/sw_test_qwen2_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    const char *toks[] = { "1", "2", "3", "4", "5", "12" }, *merges[] = { "1 2" };
    const struct { const char *pre; int n; int32_t ids[5]; } cases[] = {
        { "llama-bpe", 4, { 5, 2, 3, 4 } }, { "qwen2", 5, { 0, 1, 2, 3, 4 } },
        { "refact", 5, { 0, 1, 2, 3, 4 } }, { "gpt2", 4, { 5, 2, 3, 4 } },
        /* names llama.cpp gives the same splits */
        { "falcon3", 4, { 5, 2, 3, 4 } }, { "kormo", 5, { 0, 1, 2, 3, 4 } }, { "minerva-7b", 5, { 0, 1, 2, 3, 4 } } };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        gguf_file *f = write_and_open(bpe_vocab(cases[c].pre, toks, 6, merges, 1), path);
        char err[256] = "";
        sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
        CHECK(t != NULL, "%s: %s", cases[c].pre, err);
        if (t) {
            int32_t ids[8];
            int n = sw_tok_encode(t, "12345", 5, false, false, ids, 8);
            bool same = n == cases[c].n;
            for (int i = 0; same && i < n; i++) same = ids[i] == cases[c].ids[i];
            CHECK(same, "%s: \"12345\" gave %d tokens (first %d)", cases[c].pre, n, n > 0 ? ids[0] : -1);
            sw_tok_free(t);
        }
        if (f) gguf_close(f);
    }
    unlink(path);
}

int main(void)
{
    char path[512];
    if (access(shared_path(path, sizeof path, "vocab/ggml-vocab-llama-spm.gguf"), R_OK) != 0)
        SKIP_TEST("%s missing", path);
    int n = run_vocab_file("ggml-vocab-llama-spm.gguf", true);
    CHECK(n == 46, "llama-spm: %d cases", n);
    if (access(shared_path(path, sizeof path, "vocab/ggml-vocab-gpt-2.gguf"), R_OK) == 0) {
        n = run_vocab_file("ggml-vocab-gpt-2.gguf", true);
        CHECK(n > 40, "gpt-2: %d cases", n);
    }
    test_random_bytes("vocab/ggml-vocab-llama-spm.gguf");
    test_random_bytes("vocab/ggml-vocab-gpt-2.gguf");
    test_golden_tokens("synth-spm-d256-q4km");
    test_golden_tokens("synth-gpt2-d512-q4km");
    test_stories();
    test_spm_details();
    test_llama3_split();
    test_add_bos_default();
    test_qwen2_digits();
    test_constructed_spm();
    test_bad_metadata();
    test_wordpiece();
    CHECK_DONE();
}
