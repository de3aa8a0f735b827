/*
 * Unit tests for W3C trace context and the span ring (mg_trace.h): traceparents parsed and
 * refused (lengths, separators, upper case, zero ids, version ff, a later version's extra
 * field), a step continuing the caller's trace or starting one of its own, children, the
 * format read back, and the ring keeping the newest sampled spans as OTLP/JSON lines.
 */
#include "mg_test.h"
#include "mg_trace.h"

#include <stdio.h>
#include <string.h>

static const char *good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

static int parses(const char *s)
{
    uint8_t t[16], p[8], f;
    return mg_traceparent_parse(s, strlen(s), t, p, &f) == 0;
}

static void test_parse(void)
{
    uint8_t t[16], p[8], f;
    CU_ASSERT_EQUAL(mg_traceparent_parse(good, strlen(good), t, p, &f), 0);
    CU_ASSERT_EQUAL(t[0], 0x4b);
    CU_ASSERT_EQUAL(t[15], 0x36);
    CU_ASSERT_EQUAL(p[7], 0xb7);
    CU_ASSERT_EQUAL(f, 1);
    CU_ASSERT_FALSE(parses(""));
    CU_ASSERT_FALSE(parses("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"));
    CU_ASSERT_FALSE(parses("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011"));
    CU_ASSERT_FALSE(parses("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"));
    CU_ASSERT_FALSE(parses("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
    CU_ASSERT_FALSE(parses("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"));
    CU_ASSERT_FALSE(parses("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    CU_ASSERT_FALSE(parses("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    CU_ASSERT_FALSE(parses("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01"));
    /* A later version may carry more fields after a dash; version 00 may not. */
    CU_ASSERT_TRUE(parses("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
    CU_ASSERT_FALSE(parses("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"));
    CU_ASSERT_FALSE(parses("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
}

static void test_steps(void)
{
    mg_trace t, c, own;
    char out[MG_TRACEPARENT_LEN + 1], hex[33];
    CU_ASSERT_EQUAL(mg_trace_start(&t, good, strlen(good)), 1);
    mg_trace_hex(t.trace_id, 16, hex);
    CU_ASSERT_STRING_EQUAL(hex, "4bf92f3577b34da6a3ce929d0e0e4736");
    mg_trace_hex(t.parent_id, 8, hex);
    CU_ASSERT_STRING_EQUAL(hex, "00f067aa0ba902b7"); /* the caller's span */
    CU_ASSERT_TRUE(mg_trace_sampled(&t));
    CU_ASSERT_EQUAL(mg_trace_child(&c, &t), 0);
    CU_ASSERT_EQUAL(memcmp(c.parent_id, t.span_id, 8), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(c.span_id, t.span_id, 8), 0);
    mg_traceparent_format(&c, out);
    CU_ASSERT_EQUAL(strlen(out), MG_TRACEPARENT_LEN);
    CU_ASSERT_TRUE(parses(out));
    CU_ASSERT_EQUAL(strncmp(out, good, 36), 0); /* the same trace */
    CU_ASSERT_STRING_EQUAL(out + 53, "01");
    /* Malformed or none: a trace of its own, unsampled, no parent. */
    CU_ASSERT_EQUAL(mg_trace_start(&own, "nonsense", 8), 0);
    CU_ASSERT_FALSE(mg_trace_sampled(&own));
    mg_trace_hex(own.parent_id, 8, hex);
    CU_ASSERT_STRING_EQUAL(hex, "0000000000000000");
    CU_ASSERT_NOT_EQUAL(memcmp(own.trace_id, t.trace_id, 16), 0);
}

typedef struct {
    char text[8192];
    size_t len;
    int lines;
} sink;

static void collect(void *arg, const char *text, size_t len)
{
    sink *s = arg;
    if (s->len + len < sizeof(s->text)) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    s->lines++;
}

static void test_ring_and_export(void)
{
    mg_spans *s = mg_spans_new(2);
    mg_trace t, unsampled;
    sink out = {0};
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(mg_trace_start(&t, good, strlen(good)), 1);
    CU_ASSERT_EQUAL(mg_trace_start(&unsampled, "", 0), 0);
    mg_spans_add(s, &t, MG_SPAN_SERVER, "first", 1, 2, "a=1");
    mg_spans_add(s, &unsampled, MG_SPAN_SERVER, "never", 1, 2, "");
    mg_spans_add(s, &t, MG_SPAN_INTERNAL, "second", 3, 4, "");
    mg_spans_add(s, &t, MG_SPAN_CONSUMER, "third", 5, 6, "k=v moongate.batch=00ff");
    CU_ASSERT_EQUAL(mg_spans_export(s, "moongate", collect, &out), 2u); /* the newest two */
    CU_ASSERT_EQUAL(out.lines, 2);
    CU_ASSERT_PTR_NULL(strstr(out.text, "\"first\""));
    CU_ASSERT_PTR_NULL(strstr(out.text, "never"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out.text, "\"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(out.text, "\"parentSpanId\":\"00f067aa0ba902b7\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(out.text, "\"kind\":5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out.text, "\"startTimeUnixNano\":\"5\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(out.text,
                                  "{\"key\":\"moongate.batch\",\"value\":{\"stringValue\":"
                                  "\"00ff\"}}"));
    CU_ASSERT_TRUE(strchr(out.text, '\n') < strrchr(out.text, '\n')); /* one line each */
    mg_spans_del(s);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_parse),
        MG_TEST(test_steps),
        MG_TEST(test_ring_and_export),
    };
    return mg_test_run("trace", cases, sizeof(cases) / sizeof(cases[0]));
}
