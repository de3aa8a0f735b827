/*
 * mg_trace: W3C trace context (https://www.w3.org/TR/trace-context/) for transfers, and the
 * spans a daemon keeps for export as OTLP/JSON.
 *
 * A traceparent is "00-" 32 hex digits of trace id "-" 16 of parent span id "-" 2 of flags
 * (bit 0: sampled), lower case. A batch takes the caller's (the `traceparent` request header)
 * or starts a trace of its own, unsampled; each step that other processes see (the batch, the
 * notification sent to a peer, the notification received) is a span: a new span id whose
 * parent is the step before it. Sampled spans are kept in a ring (mg_spans) and written out as
 * OTLP/JSON lines, ids in hex as OTLP/JSON writes them.
 */
#ifndef MG_TRACE_H
#define MG_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define MG_TRACEPARENT_LEN 55 /* "00-" + 32 + "-" + 16 + "-" + 2 */

typedef struct mg_trace {
    uint8_t trace_id[16];
    uint8_t span_id[8];   /* this step's */
    uint8_t parent_id[8]; /* the step before (all zero: none) */
    uint8_t flags;        /* bit 0: sampled */
} mg_trace;

/* Parses a traceparent of n bytes (version 00, or a later one with the 00 fields first). Returns
 * 0 with the trace id, the parent span id and the flags, or -1: malformed, upper-case hex, an
 * all-zero id, or version ff. */
int mg_traceparent_parse(const char *s, size_t n, uint8_t trace_id[16], uint8_t parent_id[8],
                         uint8_t *flags);
/* The next step of `from` (a traceparent of n bytes; malformed or n 0: a new trace, unsampled):
 * the same trace, a new span id, `from`'s span as its parent. Returns 1 (from's trace is
 * continued), 0 (a new one) or -1 (no random bytes). */
int mg_trace_start(mg_trace *t, const char *from, size_t n);
/* A child step of t: same trace and flags, new span, t's span as parent. */
int mg_trace_child(mg_trace *child, const mg_trace *t);
/* t as the traceparent a peer continues from: t's span is the parent (MG_TRACEPARENT_LEN + 1
 * bytes, NUL-terminated). */
void mg_traceparent_format(const mg_trace *t, char out[MG_TRACEPARENT_LEN + 1]);
/* n bytes as 2n lower-case hex digits and a NUL. */
void mg_trace_hex(const uint8_t *p, size_t n, char *out);
/* t's ids in hex, as log lines give them (trace= span= parent=). */
typedef struct mg_trace_ids {
    char trace[33], span[17], parent[17];
} mg_trace_ids;
mg_trace_ids mg_trace_ids_of(const mg_trace *t);
static inline int mg_trace_sampled(const mg_trace *t)
{
    return t->flags & 1;
}

/* ---- the spans kept for export ---- */

#define MG_SPAN_NAME_MAX  48
#define MG_SPAN_ATTRS_MAX 160

/* OTLP span kinds. */
enum { MG_SPAN_INTERNAL = 1, MG_SPAN_SERVER = 2, MG_SPAN_PRODUCER = 4, MG_SPAN_CONSUMER = 5 };

typedef struct mg_span {
    mg_trace t;
    int kind;
    char name[MG_SPAN_NAME_MAX];
    uint64_t start_ns, end_ns;     /* since the epoch */
    char attrs[MG_SPAN_ATTRS_MAX]; /* "key=value key=value", values without spaces */
} mg_span;

typedef struct mg_spans mg_spans;

/* A ring of the last `max` spans. NULL when out of memory or max is 0. */
mg_spans *mg_spans_new(size_t max);
void mg_spans_del(mg_spans *s);
/* Keeps a span of sampled t (others are not kept): name, its times, attributes. */
void mg_spans_add(mg_spans *s, const mg_trace *t, int kind, const char *name, uint64_t start_ns,
                  uint64_t end_ns, const char *attrs);
/* Spans kept, oldest first, as OTLP/JSON lines (one ExportTraceServiceRequest each, service
 * name `service`), written with `out(arg, text, len)`. Returns how many. */
size_t mg_spans_export(const mg_spans *s, const char *service,
                       void (*out)(void *arg, const char *text, size_t len), void *arg);

#endif
