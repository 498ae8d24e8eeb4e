/* Mutation fuzz of the BPE pre-tokenizers (llm/pretok.c, PCRE2).
 *
 * An input is one byte choosing the family, then the text (any bytes,
 * ill-formed UTF-8 included). Invariant: the words cover the text exactly,
 * in order, none empty; every family's regexes accept whatever comes.
 *   fuzz_pretok                      (loop settings: tests/fuzz/driver.h)
 */
#include "llm/pretok.h"

#include "tests/fuzz/driver.h"

enum { MAX_FAMILIES = 64 };
static sw_pretok *families[MAX_FAMILIES];
static int n_families;

static void open_families(void)
{
    char err[200];
    for (int i = 0; sw_pretok_family(i) && n_families < MAX_FAMILIES; i++) {
        const char *names = sw_pretok_family(i);
        families[n_families] = sw_pretok_new(names, strcspn(names, " "), err, sizeof err);
        if (families[n_families]) n_families++;
        else fprintf(stderr, "fuzz_pretok: %s\n", err);
    }
}

static bool check(const uint8_t *data, size_t n)
{
    if (n == 0 || n_families == 0) return false;
    sw_pretok *p = families[data[0] % n_families];
    const char *text = (const char *)data + 1;
    size_t len = n - 1;
    sw_span *w = NULL;
    size_t nw = sw_pretok_split(p, text, len, &w);
    INVARIANT(nw != SIZE_MAX, "out of memory on %zu bytes", len);
    size_t at = 0;
    for (size_t i = 0; nw != SIZE_MAX && i < nw; i++) {
        INVARIANT(w[i].off == at && w[i].len > 0, "word %zu at %u (+%u), expected at %zu", i, w[i].off, w[i].len, at);
        at = (size_t)w[i].off + w[i].len;
    }
    INVARIANT(nw == SIZE_MAX || at == len, "words cover %zu of %zu bytes", at, len);
    free(w);
    return true;
}

#ifndef SW_LIBFUZZER
int main(void)
{
    open_families();
    static const char *texts[] = {
        "Hello  world's 42!\n\n  x", "HelloWorld ПриветМир iPhone's", "def f(x):\n  return x+12 # 東京",
        "1234567 東京ひらがな x.y!Go", "I'M McDonald's 12345 a/b\r\n", "naïve café e\xcc\x81 \xf0\x9f\x98\x80 \xc2\xa0",
        "bad \xff\xfe utf8 \xc3", "   \t\t\n\n\n   ",
    };
    enum { N = sizeof texts / sizeof texts[0] };
    static uint8_t buf[N][64];
    fuzz_seed seeds[N];
    for (int i = 0; i < N; i++) {
        size_t l = strlen(texts[i]);
        buf[i][0] = (uint8_t)(i * 3);   /* spread over the families */
        memcpy(buf[i] + 1, texts[i], l);
        seeds[i] = (fuzz_seed){ buf[i], l + 1 };
    }
    int rc = fuzz_main("fuzz_pretok", seeds, N, check);
    for (int i = 0; i < n_families; i++) sw_pretok_free(families[i]);
    return rc;
}
#else
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    open_families();
    return 0;
}
#endif
