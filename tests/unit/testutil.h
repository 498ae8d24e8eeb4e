/* Helpers several unit-test programs share (include after check.h).
 *
 * rng_*: a deterministic splitmix64 stream, so failures reproduce. A program
 * picks its own stream by defining TEST_RNG_SEED before the include. */
#ifndef SW_TESTUTIL_H
#define SW_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "llm/gguf.h"
#include "llm/util.h"

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif
static uint64_t rng_state = TEST_RNG_SEED;
static inline uint64_t rng_u64(void) { return sw_splitmix64(&rng_state); }
/* Uniform in (0, 1). */
static inline double rng_unit(void) { return ((rng_u64() >> 11) + 0.5) * 0x1p-53; }
/* Standard normal (Box-Muller). */
static inline float rng_normal(void) { return (float)(sqrt(-2 * log(rng_unit())) * cos(6.283185307179586 * rng_unit())); }

/* The whole file in a malloc'd buffer with a NUL after it; *len gets its size.
 * NULL if it cannot be read. */
static inline char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    if (s) *len = (size_t)n;
    return s;
}

/* GPT-2's byte-level BPE alphabet: the code point byte b is written as
 * (printable Latin-1 bytes stand for themselves, the rest map to 256..). */
static inline int gpt2_byte_cp(int b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256 + n;
}

/* Writes w to path, frees it and opens the result; NULL (after a failed
 * CHECK) if either step fails. */
static inline gguf_file *write_and_open(gguf_writer *w, const char *path)
{
    char err[256] = "";
    bool ok = gguf_writer_write(w, path, err, sizeof err);
    CHECK(ok, "writing %s: %s", path, err);
    gguf_writer_free(w);
    gguf_file *f = ok ? gguf_open(path, err, sizeof err) : NULL;
    CHECK(!ok || f != NULL, "opening %s: %s", path, err);
    return f;
}

#endif
