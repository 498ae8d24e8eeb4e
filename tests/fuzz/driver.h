/* The loop the in-memory fuzz programs share: mutated copies of a few seed
 * inputs, fed one at a time to the program's check function, which counts
 * broken invariants with INVARIANT. Header-only, like mutate.h.
 *
 *   SPILLWAY_FUZZ_SECONDS=N   stop after N seconds (the test suite sets it)
 *   SPILLWAY_FUZZ_ITERS=N     at most N inputs (default 100000)
 *   SPILLWAY_FUZZ_SEED=S      the generator's seed (default 1)
 *
 * Every seed must pass its check unmutated first: a seed the program itself
 * rejects would make the whole run test nothing. Each input is copied into a
 * buffer of its exact size, so ASan sees any read past its end.
 *
 * Built with -DSW_LIBFUZZER, the program's check() is libFuzzer's entry
 * instead (abort() on a broken invariant), and its main() is left out.
 * A program that needs set-up defines LLVMFuzzerInitialize for that build. */
#ifndef SW_FUZZ_DRIVER_H
#define SW_FUZZ_DRIVER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/fuzz/mutate.h"

static int broken;   /* invariant violations seen */

#define INVARIANT(cond, ...) do { if (!(cond)) { broken++; \
    fprintf(stderr, "invariant failed: %s: ", #cond); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

typedef struct { const uint8_t *bytes; size_t size; } fuzz_seed;

/* check(data, n) -> whether the input was accepted (for the summary line). */
typedef bool (*fuzz_check_fn)(const uint8_t *data, size_t n);

static inline bool fuzz_one(fuzz_check_fn check, const uint8_t *data, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, data, n);
    bool ok = check(copy, n);
    free(copy);
    return ok;
}

/* Runs the whole program; returns its exit status (0: nothing broke). */
static inline int fuzz_main(const char *name, const fuzz_seed *seeds, int n_seeds, fuzz_check_fn check)
{
    const char *e = getenv("SPILLWAY_FUZZ_SECONDS");
    double max_secs = e ? atof(e) : 0;
    e = getenv("SPILLWAY_FUZZ_ITERS");
    long iters = e ? atol(e) : 100000;
    e = getenv("SPILLWAY_FUZZ_SEED");
    rng_state = e ? strtoull(e, NULL, 0) : 1;
    if (!rng_state) rng_state = 1;
    size_t cap = 0;
    for (int i = 0; i < n_seeds; i++) {
        INVARIANT(fuzz_one(check, seeds[i].bytes, seeds[i].size), "%s: seed %d is rejected unmutated", name, i);
        if (seeds[i].size > cap) cap = seeds[i].size;
    }
    cap += MUTATE_MAX_GROWTH + 1;
    uint8_t *buf = malloc(cap);
    time_t t0 = time(NULL);
    long done = 0, accepted = 0;
    for (long it = 0; it < iters && !broken; it++, done++) {
        const fuzz_seed *s = &seeds[it % n_seeds];
        memcpy(buf, s->bytes, s->size);
        size_t n = mutate(buf, s->size, cap);
        accepted += fuzz_one(check, buf, n);
        if (broken) fprintf(stderr, "%s: invariant broken at iteration %ld (seed %ld)\n", name, it, it % n_seeds);
        if (max_secs > 0 && (it & 255) == 0 && difftime(time(NULL), t0) > max_secs) break;
    }
    printf("%s: %ld inputs, %ld accepted, %d invariant failures\n", name, done, accepted, broken);
    free(buf);
    return broken ? 1 : 0;
}

#ifdef SW_LIBFUZZER
static bool check(const uint8_t *data, size_t n);   /* each program's */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    check(data, n);
    if (broken) abort();
    return 0;
}
#endif

/* A whole file as a seed (for seeds given on the command line). */
static inline bool fuzz_read_file(const char *path, fuzz_seed *s)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return false; }
    uint8_t *b = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(b, cap);
            if (!nb) { free(b); fclose(f); return false; }
            b = nb;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    s->bytes = b;
    s->size = n;
    return true;
}

#endif
