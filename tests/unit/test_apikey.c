/* proto/apikey.c: key text, the stored form, and verification. */
#include <string.h>
#include "proto/apikey.h"
#include "tests/unit/check.h"

static void test_split(void)
{
    char id[SW_APIKEY_ID_MAX + 1];
    CHECK(sw_apikey_split("sk-sw-abc123-" "0123456789abcdefXYZ_-", id) && !strcmp(id, "abc123"));
    const char *bad[] = { "", "sk-sw-", "sk-sw--0123456789abcdef", "sk-sw-ABC-0123456789abcdef",
                          "sk-sw-abc-short", "sk-sw-abc-0123456789abcdef!", "sk-xx-abc-0123456789abcdef",
                          "sk-sw-abc0123456789abcdef", "sk-sw-0123456789abcdef0123456789abcdefX-0123456789abcdef" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!sw_apikey_split(bad[i], id) && id[0] == '\0', "%s", bad[i]);
    CHECK(!sw_apikey_split(NULL, id));
    char longest[SW_APIKEY_MAX + 2];
    snprintf(longest, sizeof longest, "sk-sw-%.*s-%.*s", 32, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 128,
             "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
             "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB");
    CHECK(strlen(longest) == SW_APIKEY_MAX && sw_apikey_split(longest, id));
    CHECK(sw_apikey_id_ok("a1") && !sw_apikey_id_ok("") && !sw_apikey_id_ok("A"));
    CHECK(!sw_apikey_id_ok("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));   /* 33 */
}

static void test_hash_verify(void)
{
    char key[SW_APIKEY_MAX + 1], id[SW_APIKEY_ID_MAX + 1], h1[SW_APIKEY_HASH_MAX], h2[SW_APIKEY_HASH_MAX];
    CHECK(sw_apikey_generate(key, id) == 0);
    char got[SW_APIKEY_ID_MAX + 1];
    CHECK(sw_apikey_split(key, got) && !strcmp(got, id) && strlen(id) == 12, "%s", key);
    CHECK(sw_apikey_hash(key, h1) == 0 && sw_apikey_hash(key, h2) == 0);
    CHECK(strcmp(h1, h2) != 0, "salted: two hashes differ");
    CHECK(sw_apikey_hash_ok(h1) && strlen(h1) < SW_APIKEY_HASH_MAX && !strstr(h1, key + 6));
    CHECK(sw_apikey_verify(h1, key) && sw_apikey_verify(h2, key));
    char other[sizeof key];
    memcpy(other, key, sizeof key);
    other[strlen(other) - 1] ^= 1;
    CHECK(!sw_apikey_verify(h1, other));
    CHECK(!sw_apikey_verify(h1, "nope") && !sw_apikey_verify("nope", key) && !sw_apikey_verify(NULL, key));
    CHECK(sw_apikey_hash("not a key", h2) == -1);
    char bad[SW_APIKEY_HASH_MAX];
    memcpy(bad, h1, sizeof bad);
    bad[strlen(bad) - 1] = '\0';                          /* digest one char short */
    CHECK(!sw_apikey_hash_ok(bad));
    CHECK(!sw_apikey_hash_ok("blake2b$x$y") && !sw_apikey_hash_ok("") && !sw_apikey_hash_ok("argon2$a$b"));
}

int main(void)
{
    test_split();
    test_hash_verify();
    CHECK_DONE();
}
