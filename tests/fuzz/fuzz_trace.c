/*
 * Fuzz target: W3C traceparents (mg_trace.h). Any bytes either parse — and then the ids are
 * not all zero, and a step from them formats back into a traceparent of the same trace that
 * parses again — or are refused. Nothing reads past what it was given.
 */
#include "mg_trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1), out[MG_TRACEPARENT_LEN + 1];
    uint8_t trace[16], parent[8], flags, t2[16], p2[8], f2;
    mg_trace t;
    if (text == NULL)
        return 0;
    if (size)
        memcpy(text, data, size); /* not NUL-terminated: the parser must keep to size */
    if (mg_traceparent_parse(text, size, trace, parent, &flags) == 0) {
        static const uint8_t zero[16];
        if (!memcmp(trace, zero, 16) || !memcmp(parent, zero, 8))
            abort();
        if (mg_trace_start(&t, text, size) != 1 || memcmp(t.trace_id, trace, 16) ||
            memcmp(t.parent_id, parent, 8) || t.flags != flags)
            abort();
        mg_traceparent_format(&t, out);
        if (mg_traceparent_parse(out, strlen(out), t2, p2, &f2) != 0 || memcmp(t2, trace, 16) ||
            memcmp(p2, t.span_id, 8) || f2 != flags)
            abort();
    }
    free(text);
    return 0;
}
