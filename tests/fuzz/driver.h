/* The loop the in-memory fuzz programs share: mutated copies of a few seed
 * inputs, fed one at a time to the program's check function, which counts
 * broken invariants with INVARIANT. Header-only, like mutate.h.
 *
 *   SPILLWAY_FUZZ_SECONDS=N   stop after N seconds (the test suite sets it)
 *   SPILLWAY_FUZZ_ITERS=N     at most N inputs (default 100000)
 *   SPILLWAY_FUZZ_SEED=S      the generator's seed (default 1)
 *   SPILLWAY_FUZZ_REPLAY=DIR  instead of mutating, feed each file of DIR
 *                             once (tests/fuzz/corpus/NAME: the libFuzzer
 *                             corpus and the crashes it found, kept as
 *                             regression cases that make test replays)
 *   SPILLWAY_FUZZ_DUMP=DIR    write the seeds into DIR as seed-NN and stop
 *                             (how the corpus was started)
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
#include <dirent.h>

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

static inline bool fuzz_read_file(const char *path, fuzz_seed *s);

/* SPILLWAY_FUZZ_REPLAY: every regular file of dir through check, once. */
static inline int fuzz_replay(const char *name, const char *dir, fuzz_check_fn check)
{
    DIR *d = opendir(dir);
    if (!d) { perror(dir); return 2; }
    long done = 0, accepted = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char path[4096];
        fuzz_seed s;
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (!fuzz_read_file(path, &s)) { broken++; continue; }
        int before = broken;
        accepted += fuzz_one(check, s.bytes, s.size);
        if (broken > before) fprintf(stderr, "%s: invariant broken by %s\n", name, path);
        free((void *)s.bytes);
        done++;
    }
    closedir(d);
    printf("%s: %ld inputs replayed, %ld accepted, %d invariant failures\n", name, done, accepted, broken);
    return broken ? 1 : 0;
}

/* SPILLWAY_FUZZ_DUMP: the seeds as files seed-NN of dir. */
static inline int fuzz_dump(const char *dir, const fuzz_seed *seeds, int n_seeds)
{
    for (int i = 0; i < n_seeds; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-%02d", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(seeds[i].bytes, 1, seeds[i].size, f) != seeds[i].size) { perror(path); return 2; }
        fclose(f);
    }
    return 0;
}

/* Runs the whole program; returns its exit status (0: nothing broke). */
static inline int fuzz_main(const char *name, const fuzz_seed *seeds, int n_seeds, fuzz_check_fn check)
{
    if (getenv("SPILLWAY_FUZZ_DUMP")) return fuzz_dump(getenv("SPILLWAY_FUZZ_DUMP"), seeds, n_seeds);
    if (getenv("SPILLWAY_FUZZ_REPLAY")) return fuzz_replay(name, getenv("SPILLWAY_FUZZ_REPLAY"), check);
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
