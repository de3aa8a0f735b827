/*
 * mg_metrics: the histograms of seconds that services keep for their own /metrics blocks
 * (registrations, waits in a pool's line, transfers): twelve buckets from 1 ms to 10 s, filled
 * and written as Prometheus text on the loop thread. The core's own call latency histogram is
 * counted where calls end (mg_call.c); the ops pages write the rest of /metrics.
 */
#include "mg_gateway.h"

#include <event2/buffer.h>

static const double reg_le[12] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,   0.25,   0.5,   1.0,  2.5,   10.0};

void mg_metrics_observe_seconds(uint64_t buckets[12], double *sum, double seconds)
{
    *sum += seconds;
    for (int b = 0; b < 12; b++) {
        if (seconds <= reg_le[b])
            buckets[b]++;
    }
}

void mg_metrics_render_seconds(struct evbuffer *out, const char *name, const char *help,
                               const uint64_t buckets[12], uint64_t count, double sum)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int b = 0; b < 12; b++)
        evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, reg_le[b],
                            (unsigned long long)buckets[b]);
    evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                        (unsigned long long)count, name, sum, name, (unsigned long long)count);
}
