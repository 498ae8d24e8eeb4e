/* See util.h. */
#include "llm/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sw_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

bool sw_sbuf_reserve(sw_sbuf *b, size_t more)
{
    if (b->oom) return false;
    if (b->n + more + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->s = p;
    b->cap = cap;
    return true;
}

void sw_sbuf_put_n(sw_sbuf *b, const char *s, size_t n)
{
    if (!sw_sbuf_reserve(b, n)) return;
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void sw_sbuf_free(sw_sbuf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}
