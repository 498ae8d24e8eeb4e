/* See cli.h. */
#include "llm/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sw_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool sw_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool sw_parse_on_off(const char *s, bool *on)
{
    if (strcmp(s, "on") && strcmp(s, "off")) return false;
    *on = !strcmp(s, "on");
    return true;
}

bool sw_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon) return false;
    size_t n = (size_t)(colon - s);
    if (n >= hostlen) return false;
    memcpy(host, s, n);
    host[n] = 0;
    if (host[0] == '[' && n >= 2 && host[n - 1] == ']') {   /* [::1]:8080 */
        memmove(host, host + 1, n - 2);
        host[n - 2] = 0;
    }
    long p;
    if (!sw_parse_long(colon + 1, 1, 65535, &p)) return false;
    *port = (int)p;
    return true;
}

void sw_cli_die(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

long sw_cli_long(const char *prog, const char *flag, const char *s, long lo, long hi)
{
    long v;
    if (!sw_parse_long(s, lo, hi, &v))
        sw_cli_die(prog, "%s: invalid value '%s' (integer %ld..%ld)", flag, s, lo, hi);
    return v;
}

double sw_cli_double(const char *prog, const char *flag, const char *s, double lo, double hi)
{
    double v;
    if (!sw_parse_double(s, lo, hi, &v))
        sw_cli_die(prog, "%s: invalid value '%s' (number %g..%g)", flag, s, lo, hi);
    return v;
}

uint64_t sw_cli_u64(const char *prog, const char *flag, const char *s)
{
    if (*s != '-') {   /* strtoull would wrap "-3" around to a huge value */
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (!errno && end != s && !*end) return v;
    }
    sw_cli_die(prog, "%s: invalid value '%s' (non-negative integer)", flag, s);
}

int32_t *sw_cli_ids(const char *prog, const char *flag, const char *s, long max, int *n_out)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = s;
    if (!ids) goto oom;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > max) {
            free(ids);
            sw_cli_die(prog, "%s: invalid value at offset %zu in '%s'", flag, (size_t)(p - s), s);
        }
        if (n == cap) {
            int32_t *q = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!q) { free(ids); goto oom; }
            ids = q;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') {
            free(ids);
            sw_cli_die(prog, "%s: expected ',' at offset %zu in '%s'", flag, (size_t)(p - s), s);
        }
        p++;
    }
    *n_out = (int)n;
    return ids;
oom:
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
}
