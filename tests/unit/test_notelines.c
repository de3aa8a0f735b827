/*
 * Unit tests for the notification lines (moongate/notelines.h) in memory, no daemon: the
 * front's Delivers are recorded and answered by the test. A batch's notification holds the
 * Sends behind it on its (connection, peer, topic) until it is due and answered; other lines
 * go meanwhile; one Deliver per line at a time; a Send whose caller left is dropped; the line's
 * limit; a notification whose WRITEs failed goes as a failure notice naming them; a Submit
 * refused for good sends notices, one refused for now does not; a Deliver not started fails
 * its item and the next goes; once the directory is closed, answers are dropped and what
 * becomes due fails.
 */
#include "mg_test.h"
#include "mg_grpc.h"
#include "moongate/notelines.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the front: Delivers recorded ---- */

typedef struct sent {
    mg_note_item *item;
    char topic[130];
    char payload[64];
    uint64_t batch_id;
    mg_note_outcome outcome;
    int code;
    char message[1100];
    uint32_t failed[4];
    size_t nfailed;
    uint32_t failed_count;
} sent;

static sent sends[16];
static int n_sends;
static int refuse_deliver; /* the next deliver is not started */

static int deliver(void *arg, mg_note_item *item, const mg_note_msg *m, char *why, size_t cap)
{
    sent *s = &sends[n_sends];
    (void)arg;
    if (refuse_deliver) {
        refuse_deliver = 0;
        snprintf(why, cap, "no connection");
        return -1;
    }
    memset(s, 0, sizeof(*s));
    s->item = item;
    snprintf(s->topic, sizeof(s->topic), "%s", m->topic);
    snprintf(s->payload, sizeof(s->payload), "%.*s", (int)m->len, (const char *)m->payload);
    s->batch_id = m->batch_id;
    s->outcome = m->outcome;
    s->code = m->code;
    snprintf(s->message, sizeof(s->message), "%s", m->message ? m->message : "");
    for (size_t i = 0; i < m->nfailed && i < 4; i++)
        s->failed[i] = m->failed[i];
    s->nfailed = m->nfailed;
    s->failed_count = m->failed_count;
    n_sends++;
    return 0;
}

/* A Send's caller: left or not, and what it heard. */
typedef struct owner {
    int gone;
    int over; /* heard once */
    int code;
    char why[400];
} owner;

static int send_gone(void *arg, void *o)
{
    (void)arg;
    return ((owner *)o)->gone;
}

static void send_over(void *arg, void *o, int code, const char *why)
{
    owner *w = o;
    (void)arg;
    w->over++;
    w->code = code;
    snprintf(w->why, sizeof(w->why), "%s", why ? why : "");
}

/* ---- a peer directory (for peers) and batches ---- */

static void open_session(void *arg, mg_xfer_peer *p)
{
    (void)arg, (void)p;
}
static int connect_rdma(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *setup, char *why, size_t cap)
{
    (void)arg, (void)p, (void)device, (void)local, (void)setup, (void)why, (void)cap;
    return -1;
}

static mg_notelines *nl;
static void on_note_due(void *arg, mg_batch_note *n)
{
    (void)arg;
    mg_notelines_due(nl, n);
}
static void on_request_ended(void *arg, mg_batch_req *r)
{
    (void)arg, (void)r;
}
static void on_changed(void *arg, mg_batch *b)
{
    (void)arg, (void)b;
}
static void on_freed(void *arg, mg_batch *b)
{
    (void)arg, (void)b;
}

static mg_batches *set;
static mg_peer_cache *descs;
static mg_peerdir *dir;
static mg_xfer_peer *p, *q;

static void open_lines(size_t line_max)
{
    mg_batches_config bc = {.max_batches = 16,
                            .retention_ms = 1000,
                            .request_ended = on_request_ended,
                            .note_due = on_note_due,
                            .changed = on_changed,
                            .freed = on_freed};
    mg_peerdir_config dc = {.max_peers = 8,
                            .sched = {.workers = (mg_engine *)1,
                                      .io = (mg_engine *)2,
                                      .cq = (mg_cq *)3,
                                      .worker_slots = 2,
                                      .io_slots = 2,
                                      .max_parts = 1,
                                      .slice_bytes = 1 << 20},
                            .io_timeout_ms = 1000,
                            .open_session = open_session,
                            .connect_rdma = connect_rdma};
    mg_notelines_config nc = {
        .line_max = line_max, .deliver = deliver, .send_gone = send_gone, .send_over = send_over};
    n_sends = refuse_deliver = 0;
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&descs, 16, 16), 0);
    dc.descs = descs;
    CU_ASSERT_EQUAL_FATAL(mg_batches_new(&set, &bc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_peerdir_new(&dir, &dc), 0);
    CU_ASSERT_EQUAL(mg_notelines_new(&nl, &nc), MG_ERR_INVALID); /* no directory */
    nc.dir = dir;
    CU_ASSERT_EQUAL_FATAL(mg_notelines_new(&nl, &nc), 0);
    p = mg_peerdir_get(dir, "10.0.0.2:7443", "t1");
    q = mg_peerdir_get(dir, "10.0.0.3:7443", "t1");
}

static void close_lines(void)
{
    mg_peerdir_close(dir);
    mg_notelines_del(nl);
    mg_batches_del(set);
    mg_peerdir_del(dir);
    mg_peer_cache_del(descs);
}

/* An entered batch on connection 1: n WRITEs to peer `to`, one notification to `to` on topic
 * "kv" with payload "b", waiting for those WRITEs. Its notifications are in line. */
static mg_batch *batch(mg_xfer_peer *to, size_t n)
{
    mg_batch *b = mg_batch_new(set, "t1", n, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    b->conn = 1;
    for (size_t i = 0; i < n; i++) {
        b->reqs[i].write = 1;
        b->reqs[i].length = 4096;
        b->reqs[i].peer = to;
    }
    b->notes[0].peer = to;
    b->notes[0].payload = (uint8_t *)strdup("b");
    b->notes[0].len = 1;
    b->notes[0].g.reqs_left = (unsigned)n;
    snprintf(b->notes[0].topic, sizeof(b->notes[0].topic), "kv");
    mg_batches_add(set, b, 1);
    mg_notelines_enter(nl, b);
    mg_batch_notes_start(b);
    return b;
}

static int send(owner *o, uint64_t conn, mg_xfer_peer *to, const char *topic, const char *payload)
{
    char why[300];
    return mg_notelines_send(nl, conn, to, topic, (const uint8_t *)payload, strlen(payload), 0, "",
                             o, why, sizeof(why));
}

/* A Send waits behind a batch's notification of the same line until that one was answered;
 * another topic goes meanwhile. */
static void test_order_per_line(void)
{
    owner s1 = {0}, s2 = {0};
    mg_batch *b;
    open_lines(8);
    b = batch(p, 1);
    CU_ASSERT_EQUAL(n_sends, 0); /* its WRITE has not ended */
    CU_ASSERT_EQUAL(send(&s1, 1, p, "kv", "s1"), 0);
    CU_ASSERT_EQUAL(n_sends, 0); /* behind the batch's */
    CU_ASSERT_EQUAL(send(&s2, 1, p, "other", "s2"), 0);
    CU_ASSERT_EQUAL(n_sends, 1); /* its own line */
    CU_ASSERT_STRING_EQUAL(sends[0].payload, "s2");
    CU_ASSERT_EQUAL(mg_req_start(&b->reqs[0].life), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], 0, NULL), 0);
    CU_ASSERT_EQUAL(n_sends, 2); /* the batch's is due: first in its line */
    CU_ASSERT_STRING_EQUAL(sends[1].payload, "b");
    CU_ASSERT_EQUAL(sends[1].batch_id, b->id);
    CU_ASSERT_EQUAL(sends[1].outcome, MG_OUTCOME_LANDED);
    CU_ASSERT_EQUAL(b->notes[0].g.state, MG_NOTE_SENDING);
    mg_notelines_delivered(sends[1].item, 0, 1, "");
    CU_ASSERT_EQUAL(b->notes[0].g.state, MG_NOTE_SENT);
    CU_ASSERT_EQUAL(n_sends, 3); /* then the Send behind it */
    CU_ASSERT_STRING_EQUAL(sends[2].payload, "s1");
    CU_ASSERT_EQUAL(sends[2].batch_id, 0u);
    CU_ASSERT_EQUAL(s1.over, 0);
    mg_notelines_delivered(sends[2].item, MG_GRPC_NOT_FOUND, 1, "no such agent");
    CU_ASSERT_EQUAL(s1.over, 1);
    CU_ASSERT_EQUAL(s1.code, MG_GRPC_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(s1.why, "peer 10.0.0.2:7443 refused it: no such agent");
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL(s2.over, 1);
    CU_ASSERT_EQUAL(s2.code, 0);
    CU_ASSERT_EQUAL(mg_notelines_stats_of(nl).sent, 2u);
    CU_ASSERT_EQUAL(mg_notelines_stats_of(nl).failed, 1u);
    close_lines();
}

/* One Deliver per line at a time; other connections and peers have lines of their own. A Send
 * whose caller left before its turn is dropped, and its caller hears -1 once. */
static void test_one_at_a_time(void)
{
    owner a = {0}, b = {0}, c = {0}, d = {0}, e = {0};
    open_lines(8);
    CU_ASSERT_EQUAL(send(&a, 1, p, "kv", "a"), 0);
    CU_ASSERT_EQUAL(send(&b, 1, p, "kv", "b"), 0);
    CU_ASSERT_EQUAL(send(&c, 1, p, "kv", "c"), 0);
    CU_ASSERT_EQUAL(send(&d, 2, p, "kv", "d"), 0); /* another connection */
    CU_ASSERT_EQUAL(send(&e, 1, q, "kv", "e"), 0); /* another peer */
    CU_ASSERT_EQUAL(n_sends, 3);
    CU_ASSERT_STRING_EQUAL(sends[0].payload, "a");
    CU_ASSERT_STRING_EQUAL(sends[1].payload, "d");
    CU_ASSERT_STRING_EQUAL(sends[2].payload, "e");
    b.gone = 1;
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL(a.over, 1);
    CU_ASSERT_EQUAL(b.over, 1);
    CU_ASSERT_EQUAL(b.code, -1); /* not sent */
    CU_ASSERT_EQUAL(n_sends, 4);
    CU_ASSERT_STRING_EQUAL(sends[3].payload, "c");
    mg_notelines_delivered(sends[1].item, 0, 1, "");
    mg_notelines_delivered(sends[2].item, 0, 1, "");
    mg_notelines_delivered(sends[3].item, 0, 1, "");
    CU_ASSERT(c.over == 1 && d.over == 1 && e.over == 1);
    close_lines();
}

/* A line holds line_max Sends: the next is refused naming the limit, and nothing hears of it.
 * Freeing the lines tells the callers of what waited (-1). */
static void test_line_limit(void)
{
    owner a = {0}, b = {0}, c = {0};
    char why[300];
    open_lines(2);
    CU_ASSERT_EQUAL(send(&a, 1, p, "kv", "a"), 0);
    CU_ASSERT_EQUAL(send(&b, 1, p, "kv", "b"), 0);
    CU_ASSERT_EQUAL(
        mg_notelines_send(nl, 1, p, "kv", (const uint8_t *)"c", 1, 0, "", &c, why, sizeof(why)),
        MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "2 Sends of this connection wait in line for peer "
                                       "10.0.0.2:7443, topic \"kv\" (--notify-line)"));
    CU_ASSERT_EQUAL(c.over, 0);
    CU_ASSERT_EQUAL(mg_note_bad("", 1) != NULL, 1);
    CU_ASSERT_EQUAL(mg_note_bad("a\tb", 1) != NULL, 1);
    CU_ASSERT_EQUAL(mg_note_bad("kv", MG_NOTE_PAYLOAD_MAX + 1) != NULL, 1);
    CU_ASSERT_PTR_NULL(mg_note_bad("kv", MG_NOTE_PAYLOAD_MAX));
    mg_peerdir_close(dir);
    mg_notelines_del(nl);
    nl = NULL;
    CU_ASSERT(a.over == 1 && a.code == -1 && b.over == 1 && b.code == -1);
    mg_batches_del(set);
    mg_peerdir_del(dir);
    mg_peer_cache_del(descs);
}

/* A notification whose WRITEs did not all land goes as a failure notice: the first failed
 * WRITE's outcome, code and message, and which failed; the batch shows it FAILED, saying
 * whether the notice reached the peer. */
static void test_failure_notice(void)
{
    mg_batch *b;
    open_lines(8);
    b = batch(p, 3);
    CU_ASSERT_EQUAL(mg_req_start(&b->reqs[0].life), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], 0, NULL), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[1], MG_ERR_CANCELLED, "stopped (cancelled)"), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[2], MG_ERR_UNAVAILABLE, "connection reset"), 0);
    CU_ASSERT_EQUAL_FATAL(n_sends, 1);
    CU_ASSERT_EQUAL(sends[0].outcome, MG_OUTCOME_CANCELLED); /* request 1 failed first */
    CU_ASSERT_EQUAL(sends[0].code, mg_err_grpc(MG_ERR_CANCELLED));
    CU_ASSERT_STRING_EQUAL(sends[0].message, "request 1: stopped (cancelled)");
    CU_ASSERT_EQUAL(sends[0].nfailed, 2u);
    CU_ASSERT_EQUAL(sends[0].failed[0], 1u);
    CU_ASSERT_EQUAL(sends[0].failed[1], 2u);
    CU_ASSERT_EQUAL(sends[0].failed_count, 2u);
    CU_ASSERT_STRING_EQUAL(sends[0].payload, "b"); /* the receiver's own payload still */
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL(b->notes[0].g.state, MG_NOTE_FAILED);
    CU_ASSERT_EQUAL(b->notes[0].code, MG_GRPC_FAILED_PRECONDITION);
    CU_ASSERT_STRING_EQUAL(b->notes[0].msg, "not sent: request 1 to this peer failed; the peer's "
                                            "topic got a failure notice");
    close_lines();
}

/* The notice could not reach the peer: the batch says so. */
static void test_failure_notice_unreached(void)
{
    mg_batch *b;
    open_lines(8);
    b = batch(p, 1);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], MG_ERR_UNAVAILABLE, "connection reset"), 0);
    CU_ASSERT_EQUAL_FATAL(n_sends, 1);
    CU_ASSERT_EQUAL(sends[0].outcome, MG_OUTCOME_FAILED);
    mg_notelines_delivered(sends[0].item, MG_GRPC_UNAVAILABLE, 0, "connection refused");
    CU_ASSERT_STRING_EQUAL(b->notes[0].msg,
                           "not sent: request 0 to this peer failed; the failure notice did not "
                           "reach peer 10.0.0.2:7443: connection refused");
    close_lines();
}

/* A Submit refused for good: each notification is replaced by a notice (batch id 0) in its
 * line, after what waits there; refused for now (a limit): none. */
static void test_refused(void)
{
    owner a = {0};
    mg_batch *b;
    open_lines(8);
    b = mg_batch_new(set, "t1", 1, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    b->conn = 1;
    b->notes[0].peer = p;
    b->notes[0].payload = (uint8_t *)strdup("x");
    b->notes[0].len = 1;
    snprintf(b->notes[0].topic, sizeof(b->notes[0].topic), "kv");
    mg_notelines_refused(nl, b, "", MG_GRPC_RESOURCE_EXHAUSTED, "quota");
    CU_ASSERT_EQUAL(n_sends, 0);
    CU_ASSERT_EQUAL(send(&a, 1, p, "kv", "a"), 0);
    mg_notelines_refused(nl, b, "", MG_GRPC_NOT_FOUND, "no segment 7");
    CU_ASSERT_EQUAL(n_sends, 1); /* behind the Send */
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL_FATAL(n_sends, 2);
    CU_ASSERT_EQUAL(sends[1].batch_id, 0u);
    CU_ASSERT_EQUAL(sends[1].outcome, MG_OUTCOME_FAILED);
    CU_ASSERT_EQUAL(sends[1].code, MG_GRPC_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(sends[1].message,
                           "the sender's Submit was refused; nothing was moved: no segment 7");
    CU_ASSERT_STRING_EQUAL(sends[1].payload, "x");
    mg_batch_discard(b); /* the notice keeps its own copy */
    mg_notelines_delivered(sends[1].item, 0, 1, "");
    CU_ASSERT_EQUAL(mg_notelines_stats_of(nl).sent, 2u);
    close_lines();
}

/* A Deliver that cannot start fails its item naming the peer, and the next goes. */
static void test_deliver_not_started(void)
{
    owner a = {0}, b = {0};
    open_lines(8);
    refuse_deliver = 1;
    CU_ASSERT_EQUAL(send(&a, 1, p, "kv", "a"), 0);
    CU_ASSERT_EQUAL(a.over, 1);
    CU_ASSERT_EQUAL(a.code, MG_GRPC_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(a.why, "peer 10.0.0.2:7443: no connection");
    CU_ASSERT_EQUAL(send(&b, 1, p, "kv", "b"), 0);
    CU_ASSERT_EQUAL(n_sends, 1);
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL(b.over, 1);
    close_lines();
}

/* Once the directory is closed: an answer is dropped (the item waits for the end), and a
 * notification that becomes due fails saying the daemon stops. */
static void test_closed(void)
{
    owner a = {0};
    mg_batch *b;
    open_lines(8);
    b = batch(q, 1);
    CU_ASSERT_EQUAL(send(&a, 1, p, "kv", "a"), 0);
    mg_peerdir_close(dir);
    mg_notelines_delivered(sends[0].item, 0, 1, "");
    CU_ASSERT_EQUAL(a.over, 0);
    CU_ASSERT_EQUAL(mg_req_start(&b->reqs[0].life), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], 0, NULL), 0);
    CU_ASSERT_EQUAL(n_sends, 1);
    CU_ASSERT_EQUAL(b->notes[0].g.state, MG_NOTE_FAILED);
    CU_ASSERT_STRING_EQUAL(b->notes[0].msg, "not sent: the daemon is stopping");
    mg_notelines_del(nl);
    CU_ASSERT(a.over == 1 && a.code == -1);
    mg_batches_del(set);
    mg_peerdir_del(dir);
    mg_peer_cache_del(descs);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_order_per_line),
        MG_TEST(test_one_at_a_time),
        MG_TEST(test_line_limit),
        MG_TEST(test_failure_notice),
        MG_TEST(test_failure_notice_unreached),
        MG_TEST(test_refused),
        MG_TEST(test_deliver_not_started),
        MG_TEST(test_closed),
    };
    return mg_test_run("notification lines", cases, sizeof(cases) / sizeof(cases[0]));
}
