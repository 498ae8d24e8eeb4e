/* BPE pre-tokenizers (llm/pretok.c): every family's regexes compile, known
 * texts split as Hugging Face's tokenizers split them (the expected pieces
 * below were printed by tokenizers 0.23's Split pre-tokenizer with each
 * family's tokenizer.json regexes), and any bytes at all, however long or
 * ill-formed, come back as pieces that cover them exactly. */
#include "check.h"
#include "llm/pretok.h"

#include <stdint.h>

static sw_pretok *open_pretok(const char *name)
{
    char err[200] = "";
    sw_pretok *p = sw_pretok_new(name, strlen(name), err, sizeof err);
    CHECK(p != NULL, "%s: %s", name, err);
    return p;
}

/* Pieces are non-empty, in order, and cover text[0..len) exactly. */
static bool covers(const sw_span *w, size_t n, size_t len)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i].off != at || w[i].len == 0) return false;
        at += w[i].len;
    }
    return at == len;
}

static void test_every_family_compiles(void)
{
    int families = 0, names = 0;
    for (int i = 0; sw_pretok_family(i); i++, families++) {
        const char *s = sw_pretok_family(i);
        while (*s) {
            size_t n = strcspn(s, " ");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)n, s);
            sw_pretok_free(open_pretok(name));
            names++;
            s += n + (s[n] == ' ');
        }
    }
    CHECK(families >= 15 && names >= 60, "%d families, %d names", families, names);
    char err[200] = "";
    CHECK(sw_pretok_new("no-such-split", 13, err, sizeof err) == NULL && strstr(err, "no-such-split"), "%s", err);
    /* A prefix of a known name is not that name. */
    CHECK(sw_pretok_new("llama", 5, err, sizeof err) == NULL, "'llama' taken for a family");
    sw_pretok *gpt2 = sw_pretok_new(NULL, 0, err, sizeof err);
    CHECK(gpt2 && !sw_pretok_whole_words(gpt2) && !sw_pretok_default_bos(gpt2), "no name: GPT-2's split");
    sw_pretok_free(gpt2);
    sw_pretok *l3 = open_pretok("llama-bpe"), *tk = open_pretok("tekken"), *ds = open_pretok("deepseek-v3");
    CHECK(l3 && sw_pretok_whole_words(l3) && sw_pretok_default_bos(l3), "llama-bpe: whole words, BOS");
    CHECK(tk && sw_pretok_whole_words(tk) && sw_pretok_default_bos(tk), "tekken: whole words, BOS");
    CHECK(ds && !sw_pretok_whole_words(ds) && !sw_pretok_default_bos(ds), "deepseek-v3: merges, no BOS");
    sw_pretok_free(l3); sw_pretok_free(tk); sw_pretok_free(ds);
}

static void test_known_splits(void)
{
    static const struct { const char *pre, *text, *pieces[16]; } cases[] = {
        { "tekken", "HelloWorld ПриветМир iPhone's\n\n  x",
          { "Hello", "World", " Привет", "Мир", " i", "Phone", "'s", "\n\n", " ", " x" } },
        { "gpt-4o", "I'M McDonald's 12345 a/b\n",
          { "I'M", " Mc", "Donald's", " ", "123", "45", " a", "/b", "\n" } },
        { "deepseek-coder", "def f(x):\n  return x+12 # 東京",
          { "def", " f", "(", "x", "):", "\n", " ", " return", " x", "+", "1", "2", " #", " ", "東京" } },
        { "deepseek-v3", "1234567 東京ひらがな x.y!Go", { "123", "456", "7", " ", "東京ひらがな", " x", ".y", "!Go" } },
        { "llama-bpe", "  Hello 12345 don't\n\n world",
          { " ", " Hello", " ", "123", "45", " don", "'t", "\n\n", " world" } },
        { "qwen2", "abc 123", { "abc", " ", "1", "2", "3" } },
        { "gpt-2", "Hello  world's 42!", { "Hello", " ", " world", "'s", " 42", "!" } },
        { "falcon", "a=1000, b+2", { "a", "=", "100", "0", ",", " b", "+", "2" } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sw_pretok *p = open_pretok(cases[c].pre);
        if (!p) continue;
        const char *text = cases[c].text;
        sw_span *w;
        size_t n = sw_pretok_split(p, text, strlen(text), &w), want = 0;
        while (cases[c].pieces[want]) want++;
        CHECK(n == want, "%s: %zu pieces, want %zu", cases[c].pre, n, want);
        for (size_t i = 0; i < n && i < want; i++) {
            const char *e = cases[c].pieces[i];
            CHECK(w[i].len == strlen(e) && !memcmp(text + w[i].off, e, w[i].len), "%s: piece %zu is '%.*s', want '%s'",
                  cases[c].pre, i, (int)w[i].len, text + w[i].off, e);
        }
        free(w);
        sw_pretok_free(p);
    }
}

/* Random bytes (ill-formed UTF-8 included) and long runs that make the
 * regexes backtrack: every family still covers its input exactly. */
static void test_any_bytes(void)
{
    uint64_t rng = 0x9E3779B97F4A7C15u;
    size_t big = 1 << 20;
    char *buf = malloc(big);
    for (int i = 0; sw_pretok_family(i); i++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(sw_pretok_family(i), " "), sw_pretok_family(i));
        sw_pretok *p = open_pretok(name);
        if (!p) continue;
        for (int round = 0; round < 200; round++) {
            size_t len = (size_t)(rng >> 40) % 300;
            for (size_t k = 0; k < len; k++) {
                rng = rng * 6364136223846793005u + 1442695040888963407u;
                /* Mostly ASCII letters, digits, spaces; some high bytes. */
                static const char pick[] = "aZ9 \n\t'.,!\xd0\xb0\xe6\x9d\xb1\x80\xff";
                buf[k] = pick[(rng >> 33) % (sizeof pick - 1)];
            }
            sw_span *w;
            size_t n = sw_pretok_split(p, buf, len, &w);
            CHECK(n != SIZE_MAX && covers(w, n, len), "%s: round %d (%zu bytes) not covered", name, round, len);
            free(w);
        }
        /* 1 MiB runs: spaces then a letter; capitals (Tekken's upper-then-
         * lower backtracks over them); digits. */
        static const char *fill[] = { " ", "A", "7", "\xd0\x96" /* Ж */ };
        for (size_t f = 0; f < sizeof fill / sizeof fill[0]; f++) {
            size_t fl = strlen(fill[f]), len = big - big % fl;
            for (size_t k = 0; k < len; k += fl) memcpy(buf + k, fill[f], fl);
            buf[len - 1] = 'x';
            sw_span *w;
            size_t n = sw_pretok_split(p, buf, len, &w);
            CHECK(n != SIZE_MAX && covers(w, n, len), "%s: 1 MiB of '%s' not covered", name, fill[f]);
            free(w);
        }
        sw_pretok_free(p);
    }
    free(buf);
}

int main(void)
{
    test_every_family_compiles();
    test_known_splits();
    test_any_bytes();
    CHECK_DONE();
}
