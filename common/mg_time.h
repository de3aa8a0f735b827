/*
 * mg_time: the one clock of the daemon and its libraries.
 *
 * Monotonic time for deadlines, timeouts and rates (never goes back, not affected by the wall
 * clock being set); real time only for what is shown to people (start time, expiry as a Unix
 * time). Code whose decisions depend on time takes `now` as an argument, so that tests can
 * pass any time they like (mg_ratelim.h).
 */
#ifndef MG_TIME_H
#define MG_TIME_H

#include <stdint.h>
#include <time.h>

static inline uint64_t mg_now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mg_now_mono_ms(void)
{
    return mg_now_mono_ns() / 1000000ULL;
}

static inline uint64_t mg_now_unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mg_now_unix_ms(void)
{
    return mg_now_unix_ns() / 1000000ULL;
}

#endif
