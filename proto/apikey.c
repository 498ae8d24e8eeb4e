/* Client API key text and its stored form (see apikey.h for the format and
 * why a keyed BLAKE2b). */
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include "proto/apikey.h"

#define SALT_BYTES 16
#define DIGEST_BYTES 32
#define SECRET_BYTES 32
#define B64 sodium_base64_VARIANT_URLSAFE_NO_PADDING
#define HASH_TAG "blake2b$"

/* sodium_init is idempotent and thread-safe; < 0 only without entropy. */
static bool sodium_ready(void) { return sodium_init() >= 0; }

static bool id_char(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); }

static bool b64_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

bool sw_apikey_id_ok(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++)
        if (!id_char(id[n]) || n >= SW_APIKEY_ID_MAX) return false;
    return n > 0;
}

bool sw_apikey_split(const char *key, char id[SW_APIKEY_ID_MAX + 1])
{
    id[0] = '\0';
    size_t pre = sizeof SW_APIKEY_PREFIX - 1;
    if (!key || strncmp(key, SW_APIKEY_PREFIX, pre) != 0) return false;
    const char *p = key + pre;
    size_t n = 0;
    while (n <= SW_APIKEY_ID_MAX && id_char(p[n])) n++;
    if (n == 0 || n > SW_APIKEY_ID_MAX || p[n] != '-') return false;
    const char *s = p + n + 1;
    size_t sn = 0;
    while (sn <= SW_APIKEY_SECRET_MAX && b64_char(s[sn])) sn++;
    if (s[sn] != '\0' || sn < SW_APIKEY_SECRET_MIN || sn > SW_APIKEY_SECRET_MAX) return false;
    memcpy(id, p, n);
    id[n] = '\0';
    return true;
}

int sw_apikey_generate(char key[SW_APIKEY_MAX + 1], char id[SW_APIKEY_ID_MAX + 1])
{
    if (!sodium_ready()) return -1;
    unsigned char idb[6], sec[SECRET_BYTES];
    randombytes_buf(idb, sizeof idb);
    randombytes_buf(sec, sizeof sec);
    sodium_bin2hex(id, SW_APIKEY_ID_MAX + 1, idb, sizeof idb);
    char s64[sodium_base64_ENCODED_LEN(SECRET_BYTES, B64)];
    sodium_bin2base64(s64, sizeof s64, sec, sizeof sec, B64);
    sodium_memzero(sec, sizeof sec);
    snprintf(key, SW_APIKEY_MAX + 1, SW_APIKEY_PREFIX "%s-%s", id, s64);
    sodium_memzero(s64, sizeof s64);
    return 0;
}

static void digest_of(const char *key, const unsigned char salt[SALT_BYTES],
                      unsigned char out[DIGEST_BYTES])
{
    crypto_generichash(out, DIGEST_BYTES, (const unsigned char *)key, strlen(key), salt, SALT_BYTES);
}

int sw_apikey_hash(const char *key, char out[SW_APIKEY_HASH_MAX])
{
    char id[SW_APIKEY_ID_MAX + 1];
    if (!sw_apikey_split(key, id) || !sodium_ready()) return -1;
    unsigned char salt[SALT_BYTES], dig[DIGEST_BYTES];
    randombytes_buf(salt, sizeof salt);
    digest_of(key, salt, dig);
    char s64[sodium_base64_ENCODED_LEN(SALT_BYTES, B64)];
    char d64[sodium_base64_ENCODED_LEN(DIGEST_BYTES, B64)];
    sodium_bin2base64(s64, sizeof s64, salt, sizeof salt, B64);
    sodium_bin2base64(d64, sizeof d64, dig, sizeof dig, B64);
    snprintf(out, SW_APIKEY_HASH_MAX, HASH_TAG "%s$%s", s64, d64);
    return 0;
}

/* Decodes exactly `want` bytes of base64url from s[0..n). */
static bool unb64(const char *s, size_t n, unsigned char *out, size_t want)
{
    size_t got = 0;
    const char *end = NULL;
    if (sodium_base642bin(out, want, s, n, NULL, &got, &end, B64) != 0) return false;
    return got == want && end == s + n;
}

/* Splits a stored form into its salt and digest; false when malformed. */
static bool parse_stored(const char *stored, unsigned char salt[SALT_BYTES],
                         unsigned char dig[DIGEST_BYTES])
{
    size_t tag = sizeof HASH_TAG - 1;
    if (!stored || strncmp(stored, HASH_TAG, tag) != 0) return false;
    const char *s = stored + tag, *d = strchr(s, '$');
    if (!d || !sodium_ready()) return false;
    return unb64(s, (size_t)(d - s), salt, SALT_BYTES) &&
           unb64(d + 1, strlen(d + 1), dig, DIGEST_BYTES);
}

bool sw_apikey_hash_ok(const char *stored)
{
    unsigned char salt[SALT_BYTES], dig[DIGEST_BYTES];
    return parse_stored(stored, salt, dig);
}

bool sw_apikey_verify(const char *stored, const char *key)
{
    char id[SW_APIKEY_ID_MAX + 1];
    unsigned char salt[SALT_BYTES], want[DIGEST_BYTES], got[DIGEST_BYTES];
    if (!sw_apikey_split(key, id) || !parse_stored(stored, salt, want)) return false;
    digest_of(key, salt, got);
    bool ok = sodium_memcmp(got, want, DIGEST_BYTES) == 0;
    sodium_memzero(got, sizeof got);
    return ok;
}
