/* Clocks. Header-only so every library can use them, libsw_proto and
 * libsw_sdk included (programs may link those without libsw_llm).
 *
 * sw_clock_*: CLOCK_MONOTONIC, for durations and deadlines.
 * sw_wall_ms: Unix time in ms, for timestamps that leave the process. */
#ifndef SW_CLOCK_H
#define SW_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t sw_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t sw_clock_ms(void) { return sw_clock_ns() / 1000000; }

static inline double sw_clock_s(void) { return (double)sw_clock_ns() * 1e-9; }

static inline uint64_t sw_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
