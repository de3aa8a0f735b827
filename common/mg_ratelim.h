/*
 * mg_ratelim: a rate limit with bursts, as a generic cell rate algorithm: `rate` events a second
 * on average and up to `burst` at once. The state is one theoretical arrival time; time is passed
 * in (monotonic nanoseconds), so the limiter reads no clock and a test can drive it through any
 * sequence of instants. Integer arithmetic only. Not thread-safe: one owner.
 */
#ifndef MG_RATELIM_H
#define MG_RATELIM_H

#include <stdint.h>

typedef struct mg_ratelim {
    uint64_t interval_ns;  /* 1e9 / rate: the time one event costs */
    uint64_t tolerance_ns; /* (burst - 1) * interval_ns: how far ahead the limiter may run */
    uint64_t tat_ns;       /* theoretical arrival time of the next event */
} mg_ratelim;

/* A limiter of `rate` events a second (1 .. 1e9) and bursts of `burst` (>= 1), full at `now_ns`:
 * `burst` events may come at once. */
void mg_ratelim_init(mg_ratelim *rl, uint64_t rate, uint64_t burst, uint64_t now_ns);

/* Takes one event at now_ns: 0 when it is within the limit (counted), -1 when it is over
 * (nothing counted: a refused event does not use up the allowance). */
int mg_ratelim_take(mg_ratelim *rl, uint64_t now_ns);

#endif
