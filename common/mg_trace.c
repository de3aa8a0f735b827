/* mg_trace: W3C trace context and the span ring (mg_trace.h). */
#include "mg_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* upper case is not valid in a traceparent */
}

/* n bytes from 2n hex digits; -1 on a bad digit. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i])
            return 0;
    }
    return 1;
}

int mg_traceparent_parse(const char *s, size_t n, uint8_t trace_id[16], uint8_t parent_id[8],
                         uint8_t *flags)
{
    uint8_t version;
    if (n < MG_TRACEPARENT_LEN || s[2] != '-' || s[35] != '-' || s[52] != '-' ||
        unhex(s, &version, 1) != 0 || version == 0xff ||
        (version == 0 && n != MG_TRACEPARENT_LEN) ||
        (n > MG_TRACEPARENT_LEN && s[MG_TRACEPARENT_LEN] != '-'))
        return -1;
    if (unhex(s + 3, trace_id, 16) != 0 || unhex(s + 36, parent_id, 8) != 0 ||
        unhex(s + 53, flags, 1) != 0 || all_zero(trace_id, 16) || all_zero(parent_id, 8))
        return -1;
    return 0;
}

static int random_bytes(uint8_t *p, size_t n)
{
    do {
        if (getrandom(p, n, 0) != (ssize_t)n)
            return -1;
    } while (all_zero(p, n));
    return 0;
}

int mg_trace_start(mg_trace *t, const char *from, size_t n)
{
    int continued = 1;
    memset(t, 0, sizeof(*t));
    if (n == 0 || mg_traceparent_parse(from, n, t->trace_id, t->parent_id, &t->flags) != 0) {
        memset(t, 0, sizeof(*t));
        continued = 0;
        if (random_bytes(t->trace_id, sizeof(t->trace_id)) != 0)
            return -1;
    }
    return random_bytes(t->span_id, sizeof(t->span_id)) != 0 ? -1 : continued;
}

int mg_trace_child(mg_trace *child, const mg_trace *t)
{
    *child = *t;
    memcpy(child->parent_id, t->span_id, sizeof(child->parent_id));
    return random_bytes(child->span_id, sizeof(child->span_id));
}

void mg_trace_hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

mg_trace_ids mg_trace_ids_of(const mg_trace *t)
{
    mg_trace_ids h;
    mg_trace_hex(t->trace_id, 16, h.trace);
    mg_trace_hex(t->span_id, 8, h.span);
    mg_trace_hex(t->parent_id, 8, h.parent);
    return h;
}

void mg_traceparent_format(const mg_trace *t, char out[MG_TRACEPARENT_LEN + 1])
{
    char trace[33], span[17], flags[3];
    mg_trace_hex(t->trace_id, 16, trace);
    mg_trace_hex(t->span_id, 8, span);
    mg_trace_hex(&t->flags, 1, flags);
    snprintf(out, MG_TRACEPARENT_LEN + 1, "00-%s-%s-%s", trace, span, flags);
}

struct mg_spans {
    mg_span *ring;
    size_t max, next, n;
};

mg_spans *mg_spans_new(size_t max)
{
    mg_spans *s = max ? calloc(1, sizeof(*s)) : NULL;
    if (s == NULL || (s->ring = calloc(max, sizeof(*s->ring))) == NULL) {
        free(s);
        return NULL;
    }
    s->max = max;
    return s;
}

void mg_spans_del(mg_spans *s)
{
    if (s) {
        free(s->ring);
        free(s);
    }
}

void mg_spans_add(mg_spans *s, const mg_trace *t, int kind, const char *name, uint64_t start_ns,
                  uint64_t end_ns, const char *attrs)
{
    mg_span *sp;
    if (s == NULL || !mg_trace_sampled(t))
        return;
    sp = &s->ring[s->next];
    sp->t = *t;
    sp->kind = kind;
    snprintf(sp->name, sizeof(sp->name), "%s", name);
    snprintf(sp->attrs, sizeof(sp->attrs), "%s", attrs ? attrs : "");
    sp->start_ns = start_ns;
    sp->end_ns = end_ns;
    s->next = (s->next + 1) % s->max;
    if (s->n < s->max)
        s->n++;
}

/* The attributes "k=v k=v" as OTLP/JSON key-value objects (values strings; no quotes or
 * backslashes in them: the daemon writes them). */
static size_t attrs_json(const char *attrs, char *out, size_t cap)
{
    size_t len = 0;
    const char *p = attrs;
    out[0] = '\0';
    while (*p && len + 1 < cap) {
        const char *eq = strchr(p, '='), *end = strchr(p, ' ');
        int kl, vl, w;
        if (eq == NULL)
            break;
        if (end == NULL)
            end = p + strlen(p);
        kl = (int)(eq - p);
        vl = end > eq ? (int)(end - eq - 1) : 0;
        w = snprintf(out + len, cap - len,
                     "%s{\"key\":\"%.*s\",\"value\":{\"stringValue\":\"%.*s\"}}", len ? "," : "",
                     kl, p, vl, eq + 1);
        if (w < 0 || (size_t)w >= cap - len)
            break;
        len += (size_t)w;
        p = *end ? end + 1 : end;
    }
    return len;
}

size_t mg_spans_export(const mg_spans *s, const char *service,
                       void (*out)(void *arg, const char *text, size_t len), void *arg)
{
    char line[2048], attrs[1024], trace[33], span[17], parent[17];
    for (size_t k = 0; s && k < s->n; k++) {
        const mg_span *sp = &s->ring[(s->next + s->max - s->n + k) % s->max];
        int w;
        attrs_json(sp->attrs, attrs, sizeof(attrs));
        mg_trace_hex(sp->t.trace_id, 16, trace);
        mg_trace_hex(sp->t.span_id, 8, span);
        if (all_zero(sp->t.parent_id, 8))
            parent[0] = '\0';
        else
            mg_trace_hex(sp->t.parent_id, 8, parent);
        w = snprintf(line, sizeof(line),
                     "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\","
                     "\"value\":{\"stringValue\":\"%s\"}}]},\"scopeSpans\":[{\"scope\":{\"name\":"
                     "\"moongate\"},\"spans\":[{\"traceId\":\"%s\",\"spanId\":\"%s\","
                     "\"parentSpanId\":\"%s\",\"flags\":%u,\"name\":\"%s\",\"kind\":%d,"
                     "\"startTimeUnixNano\":\"%llu\",\"endTimeUnixNano\":\"%llu\","
                     "\"attributes\":[%s]}]}]}]}\n",
                     service, trace, span, parent, (unsigned)sp->t.flags, sp->name, sp->kind,
                     (unsigned long long)sp->start_ns, (unsigned long long)sp->end_ns, attrs);
        if (w > 0)
            out(arg, line, (size_t)w < sizeof(line) ? (size_t)w : sizeof(line) - 1);
    }
    return s ? s->n : 0;
}
