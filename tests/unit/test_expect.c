/*
 * Unit tests for receivers' expectations (moongate/expect.h): met by a notification on their
 * topic (oldest first, per tenant), failed once for each cause — deadline, sender unreachable,
 * sender restarted (against the client's epoch and against the first answer after the
 * declaration), agent gone or replaced — probes shared per sender and one in flight, the next
 * wake-up time, and a sender freed only once its probe answered.
 */
#include "mg_test.h"
#include "moongate/expect.h"
#include "moongate/mg_error.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    int n;
    uint64_t ids[16];
    mg_expect_cause causes[16];
    char why[512];
} failures;

static void on_failed(void *arg, const mg_expect *e, mg_expect_cause cause, const char *why)
{
    failures *f = arg;
    f->ids[f->n] = e->id;
    f->causes[f->n++] = cause;
    snprintf(f->why, sizeof(f->why), "%s", why);
}

typedef struct {
    int n;
    mg_expect_sender *last;
} probes;

static void on_probe(void *arg, mg_expect_sender *d)
{
    probes *p = arg;
    p->n++;
    p->last = d;
}

static mg_expect_spec spec(const char *topic, const char *peer, uint32_t timeout_ms)
{
    mg_expect_spec s = {
        .tenant = "default", .topic = topic, .peer = peer, .agent = "", .timeout_ms = timeout_ms};
    return s;
}

static const mg_expect *add(mg_expects *s, const mg_expect_spec *sp, uint64_t now)
{
    const mg_expect *e = NULL;
    char why[200];
    CU_ASSERT_EQUAL(mg_expect_add(s, sp, now, &e, why, sizeof(why)), 0);
    return e;
}

static void test_met_and_deadline(void)
{
    failures f = {0};
    mg_expects *s = mg_expects_new(4, 1000, 250, on_failed, &f);
    mg_expect_spec a = spec("kv/1", "", 500), b = spec("kv/1", "", 900), c = spec("kv/2", "", 300);
    mg_expect_spec other = a;
    const mg_expect *e;
    uint64_t first;
    char why[200];
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    first = add(s, &a, 100)->id;
    add(s, &b, 100);
    add(s, &c, 100);
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), 400u); /* c's deadline; no sender to probe */

    /* Another tenant's notification on the same topic meets none of them. */
    CU_ASSERT_EQUAL(mg_expect_heard(s, "t2", "kv/1"), 0);
    /* One notification meets the oldest of its topic. */
    CU_ASSERT_EQUAL(mg_expect_heard(s, "default", "kv/1"), 1);
    e = mg_expects_first(s);
    CU_ASSERT_NOT_EQUAL(e->id, first);
    CU_ASSERT_STRING_EQUAL(e->topic, "kv/1");

    mg_expects_tick(s, 399);
    CU_ASSERT_EQUAL(f.n, 0);
    mg_expects_tick(s, 400);
    CU_ASSERT_EQUAL(f.n, 1);
    CU_ASSERT_EQUAL(f.causes[0], MG_EXPECT_DEADLINE);
    CU_ASSERT_PTR_NOT_NULL(strstr(f.why, "within 300 ms"));
    CU_ASSERT_EQUAL(mg_expects_count(s), 1u);
    mg_expects_tick(s, 400); /* once only */
    CU_ASSERT_EQUAL(f.n, 1);

    /* Limits and bad fields. */
    other.tenant = "t2";
    add(s, &other, 500);
    add(s, &other, 500);
    add(s, &other, 500);
    CU_ASSERT_EQUAL(mg_expect_add(s, &other, 500, &e, why, sizeof(why)), MG_ERR_FULL);
    CU_ASSERT_EQUAL(mg_expect_remove(s, "default", mg_expects_first(s)->id + 1), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_expect_remove(s, "t2", mg_expects_first(s)->id), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_expect_remove(s, "default", mg_expects_first(s)->id), 0);
    other.timeout_ms = 0;
    CU_ASSERT_EQUAL(mg_expect_add(s, &other, 500, &e, why, sizeof(why)), MG_ERR_INVALID);
    other.timeout_ms = MG_EXPECT_TIMEOUT_MAX + 1u;
    CU_ASSERT_EQUAL(mg_expect_add(s, &other, 500, &e, why, sizeof(why)), MG_ERR_INVALID);
    other.timeout_ms = 10;
    other.topic = "";
    CU_ASSERT_EQUAL(mg_expect_add(s, &other, 500, &e, why, sizeof(why)), MG_ERR_INVALID);
    other.topic = "x";
    other.epoch = 5; /* an epoch without a sender */
    CU_ASSERT_EQUAL(mg_expect_add(s, &other, 500, &e, why, sizeof(why)), MG_ERR_INVALID);
    mg_expects_del(s);
}

static void test_unreachable(void)
{
    failures f = {0};
    probes p = {0};
    mg_expects *s = mg_expects_new(8, 1000, 250, on_failed, &f);
    mg_expect_spec a = spec("t", "10.0.0.2:7443", 60000), b = a;
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    add(s, &a, 0);
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), 0u); /* its sender's first probe */
    mg_expects_probe_due(s, 0, on_probe, &p);
    CU_ASSERT_EQUAL(p.n, 1);
    mg_expects_probe_due(s, 10, on_probe, &p); /* one in flight at a time */
    CU_ASSERT_EQUAL(p.n, 1);
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), 1000u); /* silent for the liveness timeout */

    /* A second expectation of the same sender shares it. */
    add(s, &b, 500);
    mg_expect_probed(s, p.last, 1, 77, 0, 0, 600);
    CU_ASSERT_EQUAL(mg_expects_first(s)->epoch, 77u);
    CU_ASSERT_EQUAL(mg_expects_next(s, mg_expects_first(s))->epoch, 0u); /* declared after it */
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), 250u);                        /* the next probe */
    mg_expects_probe_due(s, 250, on_probe, &p);
    CU_ASSERT_EQUAL(p.n, 2);
    mg_expect_probed(s, p.last, 0, 0, 0, 0, 1200); /* no answer: nothing yet */
    CU_ASSERT_EQUAL(f.n, 0);
    mg_expects_tick(s, 1599);
    CU_ASSERT_EQUAL(f.n, 0);
    mg_expects_tick(s, 1600); /* 1000 ms after the last answer, at 600 */
    CU_ASSERT_EQUAL(f.n, 2);
    CU_ASSERT_EQUAL(f.causes[0], MG_EXPECT_UNREACHABLE);
    CU_ASSERT_EQUAL(f.causes[1], MG_EXPECT_UNREACHABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(f.why, "10.0.0.2:7443 did not answer for 1000 ms"));
    CU_ASSERT_EQUAL(mg_expects_count(s), 0u);
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), UINT64_MAX); /* the sender went with them */
    mg_expects_del(s);
}

static void test_restarted(void)
{
    failures f = {0};
    probes p = {0};
    mg_expects *s = mg_expects_new(8, 10000, 250, on_failed, &f);
    mg_expect_spec a = spec("t", "b:7443", 60000), known = a;
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    known.epoch = 41;
    add(s, &a, 0);
    add(s, &known, 0);
    mg_expects_probe_due(s, 0, on_probe, &p);
    mg_expect_probed(s, p.last, 1, 42, 0, 0, 5);
    /* The client knew epoch 41: the daemon answering 42 restarted since. */
    CU_ASSERT_EQUAL(f.n, 1);
    CU_ASSERT_EQUAL(f.causes[0], MG_EXPECT_RESTARTED);
    CU_ASSERT_EQUAL(mg_expects_first(s)->epoch, 42u);
    mg_expects_probe_due(s, 250, on_probe, &p);
    mg_expect_probed(s, p.last, 1, 42, 0, 0, 260); /* the same: holds */
    CU_ASSERT_EQUAL(f.n, 1);
    mg_expects_probe_due(s, 500, on_probe, &p);
    mg_expect_probed(s, p.last, 1, 43, 0, 0, 510);
    CU_ASSERT_EQUAL(f.n, 2);
    CU_ASSERT_EQUAL(f.causes[1], MG_EXPECT_RESTARTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(f.why, "b:7443 restarted"));
    mg_expects_del(s);
}

static void test_agent_gone(void)
{
    failures f = {0};
    probes p = {0};
    mg_expects *s = mg_expects_new(8, 10000, 250, on_failed, &f);
    mg_expect_spec by_port = spec("t", "b:7443", 60000), by_name = by_port;
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    by_port.agent_port = 9001;
    by_name.agent = "prefill-0";
    add(s, &by_port, 0);
    add(s, &by_name, 0);
    mg_expects_probe_due(s, 0, on_probe, &p);
    CU_ASSERT_EQUAL(p.n, 2); /* two senders: one agent each */
    CU_ASSERT_STRING_EQUAL(p.last->agent, "prefill-0");
    mg_expect_probed(s, p.last, 1, 7, 1, 100, 5);
    CU_ASSERT_EQUAL(f.n, 0);
    /* The agent at port 9001 is not there. */
    mg_expect_probed(s, mg_expects_first(s)->sender, 1, 7, 0, 0, 6);
    CU_ASSERT_EQUAL(f.n, 1);
    CU_ASSERT_EQUAL(f.causes[0], MG_EXPECT_AGENT_GONE);
    CU_ASSERT_PTR_NOT_NULL(strstr(f.why, "the agent at port 9001 is gone"));
    /* prefill-0 registered again: another id, the one waited for is gone. */
    mg_expects_probe_due(s, 250, on_probe, &p);
    mg_expect_probed(s, p.last, 1, 7, 1, 101, 260);
    CU_ASSERT_EQUAL(f.n, 2);
    CU_ASSERT_EQUAL(f.causes[1], MG_EXPECT_AGENT_GONE);
    CU_ASSERT_PTR_NOT_NULL(strstr(f.why, "another took its place"));
    mg_expects_del(s);
}

static void test_sender_outlives_its_probe(void)
{
    failures f = {0};
    probes p = {0};
    mg_expects *s = mg_expects_new(8, 10000, 250, on_failed, &f);
    mg_expect_spec a = spec("t", "b:7443", 60000);
    const mg_expect *e;
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    e = add(s, &a, 0);
    mg_expects_probe_due(s, 0, on_probe, &p);
    /* Met while its probe is in flight: the sender stays until the answer (ASan checks). */
    CU_ASSERT_EQUAL(mg_expect_remove(s, "default", e->id), 0);
    mg_expect_probed(s, p.last, 1, 1, 0, 0, 10);
    CU_ASSERT_EQUAL(f.n, 0);
    p.n = 0;
    mg_expects_probe_due(s, 1000, on_probe, &p);
    CU_ASSERT_EQUAL(p.n, 0);
    CU_ASSERT_EQUAL(mg_expects_next_ms(s), UINT64_MAX);
    mg_expects_del(s);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_met_and_deadline),
        MG_TEST(test_unreachable),
        MG_TEST(test_restarted),
        MG_TEST(test_agent_gone),
        MG_TEST(test_sender_outlives_its_probe),
    };
    return mg_test_run("expect", cases, sizeof(cases) / sizeof(cases[0]));
}
