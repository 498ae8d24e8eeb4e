/* Small helpers every layer needs: error messages, a seedable generator, a
 * growing string. (Text checks are in llm/text.h.) */
#ifndef SW_UTIL_H
#define SW_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
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
 * a writer checks once at the end. Zero-initialise to start. */
typedef struct { char *s; size_t n, cap; bool oom; } sw_sbuf;
/* Room for `more` bytes after the n held, and the NUL; false once oom. */
bool sw_sbuf_reserve(sw_sbuf *b, size_t more);
void sw_sbuf_put_n(sw_sbuf *b, const char *s, size_t n);
static inline void sw_sbuf_put(sw_sbuf *b, const char *s) { sw_sbuf_put_n(b, s, strlen(s)); }
/* Frees the bytes and zeroes b, ready for reuse. */
void sw_sbuf_free(sw_sbuf *b);

#endif
