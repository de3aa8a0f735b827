/*
 * Fuzz target: the gRPC length-prefixed message deframer. The first byte picks where the input
 * is split in two DATA "frames" and the message limit; every delivered message must lie inside
 * the input and respect the limit, and feeding the same bytes in one piece must give the same
 * messages.
 */
#include "mg_grpc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t count;
    size_t total;
    uint32_t max;
} tally;

static int count(void *arg, const uint8_t *msg, size_t len)
{
    tally *t = arg;
    if (len > t->max)
        abort();
    if (len)
        (void)(msg[len - 1] + msg[0]); /* touch both ends: ASan checks the bounds */
    t->count++;
    t->total += len;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_deframer a, b;
    tally ta = {0, 0, 0}, tb = {0, 0, 0};
    size_t cut;
    int ra, rb1, rb2 = 0;

    if (size < 1)
        return 0;
    ta.max = tb.max = 16u + (uint32_t)data[0] * 64u;
    data++;
    size--;
    cut = size ? (size_t)data[0] % (size + 1) : 0;

    mg_deframer_init(&a, ta.max);
    ra = mg_deframer_feed(&a, data, size, count, &ta);
    mg_deframer_init(&b, tb.max);
    rb1 = mg_deframer_feed(&b, data, cut, count, &tb);
    if (rb1 == 0)
        rb2 = mg_deframer_feed(&b, data + cut, size - cut, count, &tb);
    if (ra != (rb1 ? rb1 : rb2) || ta.count != tb.count || ta.total != tb.total)
        abort();
    if (ra == 0 && mg_deframer_partial(&a) != mg_deframer_partial(&b))
        abort();
    mg_deframer_free(&a);
    mg_deframer_free(&b);
    return 0;
}
