/* The mutation engine the deterministic fuzz programs share: a seedable
 * generator and byte-level mutations of a file image (bit flips, random
 * bytes, interesting u32/u64 values where counts and lengths live,
 * truncation, insertions, deletions, copied chunks). Header-only: each
 * fuzz program is one translation unit. */
#ifndef SW_FUZZ_MUTATE_H
#define SW_FUZZ_MUTATE_H

#include <stdint.h>
#include <string.h>

/* xorshift64*: deterministic, seedable. */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

static const uint64_t interesting[] = {
    0, 1, 2, 3, 4, 5, 8, 12, 16, 24, 31, 32, 33, 63, 64, 127, 128, 255, 256, 0x7fffffff,
    0x80000000ull, 0xffffffffull, 0x100000000ull, 0x7fffffffffffffffull, 0x8000000000000000ull,
    0xffffffffffffffffull, 0xfffffffffffffff0ull,
};
#define N_INTERESTING (sizeof interesting / sizeof interesting[0])

/* The most mutate() can grow an input: 4 insertions of at most 16 bytes. */
#define MUTATE_MAX_GROWTH (4 * 16)

/* Applies 1-4 random mutations to buf (capacity cap), returns the new length. */
static size_t mutate(uint8_t *buf, size_t n, size_t cap)
{
    int rounds = 1 + (int)rnd_below(4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd_below(7)) {
        case 0:   /* flip a bit */
            if (n) buf[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
            break;
        case 1:   /* random byte */
            if (n) buf[rnd_below(n)] = (uint8_t)rnd();
            break;
        case 2: { /* interesting 4- or 8-byte value, where counts and lengths live */
            size_t w = rnd_below(2) ? 8 : 4;
            if (n >= w) {
                uint64_t v = interesting[rnd_below(N_INTERESTING)];
                memcpy(buf + rnd_below(n - w + 1), &v, w);
            }
            break;
        }
        case 3:   /* truncate */
            n = rnd_below(n + 1);
            break;
        case 4: { /* insert random bytes */
            size_t k = 1 + rnd_below(16);
            if (n + k <= cap) {
                size_t at = rnd_below(n + 1);
                memmove(buf + at + k, buf + at, n - at);
                for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
                n += k;
            }
            break;
        }
        case 5: { /* delete a range */
            if (n) {
                size_t at = rnd_below(n), k = 1 + rnd_below(16);
                if (k > n - at) k = n - at;
                memmove(buf + at, buf + at + k, n - at - k);
                n -= k;
            }
            break;
        }
        default: { /* copy a chunk over another place (duplicates keys/names) */
            if (n > 8) {
                size_t k = 1 + rnd_below(32), from = rnd_below(n), to = rnd_below(n);
                if (k > n - from) k = n - from;
                if (k > n - to) k = n - to;
                memmove(buf + to, buf + from, k);
            }
            break;
        }
        }
    }
    return n;
}

#endif
