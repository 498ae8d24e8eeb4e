/* Fuzz of the tokenizers (llm/tokenizer.c) on arbitrary bytes, with the
 * tiny vocabularies of vocab.h: SentencePiece, byte-level BPE under
 * every pre-tokenizer family, and WordPiece.
 *
 * An input is one flag byte, then the text. Flag bits 0-4 pick the
 * tokenizer, bit 5 strips the streaming detokenizer's leading space, bit 6
 * adds BOS, bit 7 parses special tokens. Invariants:
 *   - encoding never needs more than len + 4 ids (byte fallback and the
 *     byte alphabet give at most one id per byte), all inside the vocab, and
 *     one slot too few reports -(needed);
 *   - without special tokens, the ids' raw pieces give the text back (SPM:
 *     after its dummy-prefix space, with U+2581 read as a space; a
 *     user-defined token, matched even so, starts a new prefix as in
 *     llama.cpp, so a text that has one is left out; WordPiece is left out
 *     too: its normalization and [UNK] give other text back);
 *   - the streaming detokenizer always NUL-terminates within its buffer.
 *   fuzz_tokenizer                   (loop settings: tests/fuzz/driver.h)
 */
#include "tests/fuzz/vocab.h"

#include "tests/fuzz/driver.h"

enum { MAX_TOKS = 32 };
static sw_tokenizer *toks[MAX_TOKS];
static int n_toks;

/* What the pieces of text's ids spell: text itself for BPE; for SPM a
 * space, then text with each "▁" as a space. */
static size_t expected(const sw_tokenizer *t, const char *text, size_t len, char *out)
{
    if (sw_tok_kind_of(t) != SW_TOK_SPM) { memcpy(out, text, len); return len; }
    size_t o = 0;
    out[o++] = ' ';
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && !memcmp(text + i, "\xE2\x96\x81", 3)) { out[o++] = ' '; i += 2; }
        else out[o++] = text[i];
    }
    return o;
}

static void check_detok(const sw_tokenizer *t, const int32_t *ids, int n, bool strip)
{
    sw_detok d;
    char buf[64];
    sw_detok_init(&d, t, strip);
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? sw_detok_push(&d, ids[i], buf, sizeof buf) : sw_detok_flush(&d, buf, sizeof buf);
        INVARIANT(k < sizeof buf && buf[k] == 0, "detokenizer wrote %zu bytes without its NUL", k);
    }
}

static bool check(const uint8_t *data, size_t n)
{
    if (n == 0 || n_toks == 0) return false;
    const sw_tokenizer *t = toks[(data[0] & 31) % n_toks];
    bool strip = data[0] & 32, bos = data[0] & 64, special = data[0] & 128;
    const char *text = (const char *)data + 1;
    size_t len = n - 1;
    int cap = (int)len + 4;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    int k = sw_tok_encode(t, text, len, bos, special, ids, cap);
    INVARIANT(k >= 0, "%zu bytes needed %d ids", len, -k);
    for (int i = 0; i < k; i++) INVARIANT(ids[i] >= 0 && ids[i] < sw_tok_n_vocab(t), "id %d", ids[i]);
    if (k > 1) INVARIANT(sw_tok_encode(t, text, len, bos, special, ids + 1, k - 1) == -k, "-(needed) not reported");
    bool user_defined = false;
    for (int i = 0; i < k; i++) user_defined |= ids[i] == sw_tok_lookup(t, "<tag>");
    if (k > 0 && !special && !user_defined && sw_tok_kind_of(t) != SW_TOK_WPM) {
        char *want = malloc(len + 2), *got = malloc(len + 2);
        size_t nw = len ? expected(t, text, len, want) : 0, ng = 0;
        for (int i = 0; i < k; i++) {
            size_t pn;
            const char *p = sw_tok_piece_ref(t, ids[i], &pn);
            INVARIANT(ng + pn <= len + 1, "the pieces outgrow the text");
            if (ng + pn > len + 1) break;
            memcpy(got + ng, p, pn);
            ng += pn;
        }
        INVARIANT(ng == nw && !memcmp(got, want, ng), "pieces give %zu bytes back for %zu", ng, nw);
        free(want);
        free(got);
    }
    if (k >= 0) check_detok(t, ids, k, strip);
    free(ids);
    return k >= 0;
}

static void setup(void)
{
    n_toks = vocab_all(toks, MAX_TOKS);
}

#ifdef SW_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    setup();
    return n_toks ? 0 : 1;
}
#else
int main(void)
{
    setup();
    if (!n_toks) return 2;
    static const char *texts[] = {
        "the theme \xE2\x96\x81the", "<s>a<tag>b</s> <|im_start|>x", "Hello  world's 42!\n\n  x",
        "\xE6\x9D\xB1\xE4\xBA\xAC caf\xC3\xA9 e\xCC\x81 \xF0\x9F\x98\x80", "bad \xff\xfe utf8 \xc3",
        "a<|endoftext|>b<|im_end|>", "\t\t\n 12345 x.y!Go",
    };
    enum { N = sizeof texts / sizeof texts[0], VARIANTS = 4 };
    static uint8_t buf[N * VARIANTS][64];
    fuzz_seed seeds[N * VARIANTS];
    for (int i = 0; i < N * VARIANTS; i++) {
        size_t l = strlen(texts[i % N]);
        buf[i][0] = (uint8_t)(i * 5 % n_toks) | (uint8_t)((i / N) << 5 & 0xE0);   /* spread tokenizers and flags */
        memcpy(buf[i] + 1, texts[i % N], l);
        seeds[i] = (fuzz_seed){ buf[i], l + 1 };
    }
    int rc = fuzz_main("fuzz_tokenizer", seeds, N * VARIANTS, check);
    for (int i = 0; i < n_toks; i++) sw_tok_free(toks[i]);
    return rc;
}
#endif
