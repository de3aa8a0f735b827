/*
 * Unit tests for the transfer batch state machine (moongate/batch.h): each request's legal
 * transitions and the refused ones (ending twice, success without a run, a second requeue),
 * the batch's counts and its state with notifications, and a random walk checked against a
 * plain model: the counts always equal the requests' states.
 */
#include "mg_test.h"
#include "moongate/batch.h"

#include <stdlib.h>

static void test_request_life(void)
{
    mg_batch_counts c = {.n = 3};
    mg_req_life a = {MG_REQ_PENDING, 0}, b = a, x = a;

    /* a: runs, goes back once for a new session, runs again, done. */
    CU_ASSERT_EQUAL(mg_req_start(&a), 0);
    CU_ASSERT_EQUAL(a.state, MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(mg_req_start(&a), -1); /* already running */
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_SESSION), 0);
    CU_ASSERT_EQUAL(a.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_TARGET), -1); /* not running */
    CU_ASSERT_EQUAL(mg_req_start(&a), 0);
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_SESSION), -1); /* once for each cause */
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_TARGET), 0);
    CU_ASSERT_EQUAL(mg_req_start(&a), 0);
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_TARGET), -1);
    CU_ASSERT_EQUAL(a.state, MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(mg_req_end(&a, &c, 0), 0);
    CU_ASSERT_EQUAL(a.state, MG_REQ_DONE);

    /* An ended request never changes again, and is counted once. */
    CU_ASSERT_EQUAL(mg_req_end(&a, &c, 1), -1);
    CU_ASSERT_EQUAL(mg_req_end(&a, &c, 0), -1);
    CU_ASSERT_EQUAL(mg_req_start(&a), -1);
    CU_ASSERT_EQUAL(mg_req_requeue(&a, MG_REQUEUE_SESSION), -1);
    CU_ASSERT_EQUAL(a.state, MG_REQ_DONE);
    CU_ASSERT_EQUAL(c.done, 1);
    CU_ASSERT_EQUAL(c.failed, 0);

    /* b: a pending request cannot succeed, but can fail (cancelled, timed out). */
    CU_ASSERT_EQUAL(mg_req_end(&b, &c, 0), -1);
    CU_ASSERT_EQUAL(b.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(mg_req_end(&b, &c, 1), 0);
    CU_ASSERT_EQUAL(b.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(mg_req_start(&b), -1);
    CU_ASSERT_EQUAL(c.failed, 1);
    CU_ASSERT_EQUAL(mg_batch_state(&c), MG_REQ_RUNNING);
    CU_ASSERT_FALSE(mg_batch_over(&c));

    /* x: running, then failed: the batch is over and failed. */
    CU_ASSERT_EQUAL(mg_req_start(&x), 0);
    CU_ASSERT_EQUAL(mg_req_end(&x, &c, 1), 0);
    CU_ASSERT_TRUE(mg_batch_over(&c));
    CU_ASSERT_EQUAL(mg_batch_state(&c), MG_REQ_FAILED);

    /* A fourth end on a batch of three cannot be counted. */
    mg_req_life y = {MG_REQ_RUNNING, 0};
    CU_ASSERT_EQUAL(mg_req_end(&y, &c, 0), -1);
    CU_ASSERT_EQUAL(y.state, MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(c.done + c.failed, 3);
}

static void test_batch_with_notifications(void)
{
    mg_batch_counts c = {.n = 2, .notes = 2};
    mg_req_life r[2] = {{MG_REQ_PENDING, 0}, {MG_REQ_PENDING, 0}};
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(mg_req_start(&r[i]), 0);
        CU_ASSERT_EQUAL(mg_req_end(&r[i], &c, 0), 0);
    }
    /* Every request done, notifications not sent yet: still running. */
    CU_ASSERT_FALSE(mg_batch_over(&c));
    CU_ASSERT_EQUAL(mg_batch_state(&c), MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(mg_batch_note_over(&c, 0), 0);
    CU_ASSERT_EQUAL(mg_batch_state(&c), MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(mg_batch_note_over(&c, 1), 0); /* refused by the peer */
    CU_ASSERT_TRUE(mg_batch_over(&c));
    CU_ASSERT_EQUAL(mg_batch_state(&c), MG_REQ_FAILED); /* the data is there, the news is not */
    CU_ASSERT_EQUAL(mg_batch_note_over(&c, 0), -1);     /* no third */
    CU_ASSERT_EQUAL(c.notes_over, 2);

    mg_batch_counts ok = {.n = 1, .notes = 1};
    mg_req_life q = {MG_REQ_PENDING, 0};
    CU_ASSERT_EQUAL(mg_req_start(&q), 0);
    CU_ASSERT_EQUAL(mg_req_end(&q, &ok, 0), 0);
    CU_ASSERT_EQUAL(mg_batch_note_over(&ok, 0), 0);
    CU_ASSERT_EQUAL(mg_batch_state(&ok), MG_REQ_DONE);

    mg_batch_counts empty = {0};
    CU_ASSERT_TRUE(mg_batch_over(&empty));
    CU_ASSERT_EQUAL(mg_batch_state(&empty), MG_REQ_DONE);
}

/* Random events on a batch, checked after each against the requests themselves. */
static void test_random_walk(void)
{
    enum { N = 64 };
    mg_req_life r[N];
    mg_batch_counts c = {.n = N};
    unsigned seed = 12345;
    for (int i = 0; i < N; i++)
        r[i] = (mg_req_life){MG_REQ_PENDING, 0};
    for (int step = 0; step < 20000; step++) {
        int i = rand_r(&seed) % N, ev = rand_r(&seed) % 4, rc;
        mg_req_life before = r[i];
        switch (ev) {
        case 0:
            rc = mg_req_start(&r[i]);
            CU_ASSERT_EQUAL(rc == 0, before.state == MG_REQ_PENDING);
            break;
        case 1:
            rc = mg_req_requeue(&r[i], 1u << (step & 1));
            CU_ASSERT_EQUAL(rc == 0, before.state == MG_REQ_RUNNING &&
                                         !(before.requeued & (1u << (step & 1))));
            break;
        case 2:
            rc = mg_req_end(&r[i], &c, 0);
            CU_ASSERT_EQUAL(rc == 0, before.state == MG_REQ_RUNNING);
            break;
        default:
            rc = mg_req_end(&r[i], &c, 1);
            CU_ASSERT_EQUAL(rc == 0,
                            before.state == MG_REQ_PENDING || before.state == MG_REQ_RUNNING);
            break;
        }
        if (rc != 0)
            CU_ASSERT_EQUAL(r[i].state, before.state);
        size_t done = 0, failed = 0;
        for (int k = 0; k < N; k++) {
            done += r[k].state == MG_REQ_DONE;
            failed += r[k].state == MG_REQ_FAILED;
        }
        CU_ASSERT_EQUAL(c.done, done);
        CU_ASSERT_EQUAL(c.failed, failed);
        CU_ASSERT_EQUAL(mg_batch_over(&c), done + failed == N);
    }
    CU_ASSERT_TRUE(mg_batch_over(&c)); /* 20000 random events end 64 requests */
}

/* A notification is due only once every WRITE of the batch to its peer ended, whatever their
 * order; a failed one is remembered (the first) so the note is failed instead of sent; a note
 * no longer waiting, or with nothing left to wait for, is never due again. */
static void test_notification_after_every_request(void)
{
    mg_note_gate g = {.state = MG_NOTE_WAITING, .reqs_left = 3};
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 4, 0), 0);
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 0, 0), 0);
    CU_ASSERT_EQUAL(g.failed_req, 0u);
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 2, 0), 1); /* the last of the three */
    CU_ASSERT_EQUAL(g.failed_req, 0u);
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 5, 0), 0); /* an extra end: not due twice */

    g = (mg_note_gate){.state = MG_NOTE_WAITING, .reqs_left = 3};
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 7, 1), 0);
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 1, 1), 0);
    CU_ASSERT_EQUAL(g.failed_req, 8u); /* the first that failed speaks */
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 3, 0), 1);

    g = (mg_note_gate){.state = MG_NOTE_FAILED, .reqs_left = 1};
    CU_ASSERT_EQUAL(mg_note_req_ended(&g, 0, 0), 0); /* failed already (daemon stopping) */
    CU_ASSERT_EQUAL(g.reqs_left, 1u);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_request_life),
        MG_TEST(test_batch_with_notifications),
        MG_TEST(test_random_walk),
        MG_TEST(test_notification_after_every_request),
    };
    return mg_test_run("batch", cases, sizeof(cases) / sizeof(cases[0]));
}
