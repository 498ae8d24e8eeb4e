/* Small helpers every layer needs: error messages, a seedable generator, a
 * growing string. (Text checks are in llm/text.h.) */
#ifndef SW_UTIL_H
#define SW_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* printf into a caller's error buffer; a NULL or empty buffer is fine. */
void sw_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* splitmix64: a small, fast, seedable generator (advances *state). Inline:
 * random weight generation calls it once per element. */
static inline uint64_t sw_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The one growable buffer: a NUL-terminated string of n bytes (s is NULL
 * until the first write). Out of memory sets oom and drops what follows, so
 * a writer checks once at the end. Zero-initialise to start. Inline, so the
 * SDK's programs use it without linking libsw_llm (as llm/clock.h and
 * llm/text.h promise). */
typedef struct { char *s; size_t n, cap; bool oom; } sw_sbuf;

/* Room for `more` bytes after the n held, and the NUL; false once oom. */
static inline bool sw_sbuf_reserve(sw_sbuf *b, size_t more)
{
    if (b->oom) return false;
    if (b->n + more + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = (char *)realloc(b->s, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->s = p;
    b->cap = cap;
    return true;
}

static inline void sw_sbuf_put_n(sw_sbuf *b, const char *s, size_t n)
{
    if (!sw_sbuf_reserve(b, n)) return;
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static inline void sw_sbuf_put(sw_sbuf *b, const char *s) { sw_sbuf_put_n(b, s, strlen(s)); }

/* Frees the bytes and zeroes b, ready for reuse. */
static inline void sw_sbuf_free(sw_sbuf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

#endif
