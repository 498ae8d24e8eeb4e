/* Minimal check macros for the C unit-test programs (run by tests/test_unit_c.py).
 * A program exits 0 if every CHECK held, 1 otherwise, 77 if its data is missing. */
#ifndef SW_CHECK_H
#define SW_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sw_checks_failed, sw_checks_run;
#define CHECK(cond, ...) do { sw_checks_run++; if (!(cond)) { sw_checks_failed++; \
    fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, " " __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_DONE() do { printf("%d checks, %d failed\n", sw_checks_run, sw_checks_failed); \
    return sw_checks_failed ? 1 : 0; } while (0)
#define SKIP_TEST(...) do { printf("skipped: " __VA_ARGS__); printf("\n"); exit(77); } while (0)

/* $SPILLWAY_SHARED/rel into buf; defaults to ../shared relative to the project root. */
static inline const char *shared_path(char *buf, size_t n, const char *rel)
{
    const char *s = getenv("SPILLWAY_SHARED");
    snprintf(buf, n, "%s/%s", s && *s ? s : "../shared", rel);
    return buf;
}
#endif
