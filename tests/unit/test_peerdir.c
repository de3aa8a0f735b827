/*
 * Unit tests for the peer directory (moongate/peerdir.h) in memory, no daemon: the front's
 * calls to peers are fakes the test answers, and the scheduler's jobs run on an inline worker
 * the test completes. Requests wait for a session and start in order once it opens; a refused
 * session fails them by name and the next request asks again; an expired session is renewed;
 * a token the peer no longer knows (it restarted) sends a request back once through a new
 * session with the new epoch, and a second failure ends it with both reasons; a stopped request
 * is not retried; the directory's limit and its entries per tenant.
 */
#include "mg_test_jobs.h"
#include "moongate/peerdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the front: sessions asked for ---- */

static mg_xfer_peer *asked[16];
static int n_asked;

static void open_session(void *arg, mg_xfer_peer *p)
{
    (void)arg;
    asked[n_asked++] = p;
}

static int connect_rdma(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *setup, char *why, size_t cap)
{
    (void)arg, (void)p, (void)device, (void)local, (void)setup;
    snprintf(why, cap, "no RDMA here");
    return -1;
}

static void on_request_ended(void *arg, mg_batch_req *r)
{
    (void)arg;
    mg_peerdir_request_ended(r); /* what the front does with the event */
}
static void on_note_due(void *arg, mg_batch_note *n)
{
    (void)arg, (void)n;
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

static mg_peerdir *open_dir(size_t max_peers)
{
    mg_batches_config bc = {.max_batches = 16,
                            .retention_ms = 1000,
                            .request_ended = on_request_ended,
                            .note_due = on_note_due,
                            .changed = on_changed,
                            .freed = on_freed};
    mg_peerdir_config c = {.max_peers = max_peers,
                           .sched = {.workers = (mg_engine *)1,
                                     .io = (mg_engine *)2,
                                     .cq = (mg_cq *)3,
                                     .worker_slots = 2,
                                     .io_slots = 2, /* a peer's line gets one job at a time */
                                     .max_parts = 1,
                                     .slice_bytes = 1 << 20,
                                     .submit = mg_test_submit},
                           .io_timeout_ms = 1000,
                           .open_session = open_session,
                           .connect_rdma = connect_rdma};
    mg_peerdir *d = NULL;
    mg_test_njobs = n_asked = 0;
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&descs, 16, 16), 0);
    c.descs = descs;
    CU_ASSERT_EQUAL_FATAL(mg_batches_new(&set, &bc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_peerdir_new(&d, &c), 0);
    return d;
}

static void close_dir(mg_peerdir *d)
{
    while (mg_test_njobs)
        mg_test_job_back(MG_ERR_SHUTDOWN);
    mg_peerdir_close(d);
    mg_peerdir_del(d);
    mg_batches_del(set);
    mg_peer_cache_del(descs);
}

static uint8_t mem[1 << 16];

/* An entered batch of n WRITEs of 4 KiB to peer p. */
static mg_batch *batch(mg_xfer_peer *p, size_t n)
{
    mg_batch *b = mg_batch_new(set, "t1", n, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    for (size_t i = 0; i < n; i++) {
        b->reqs[i].write = 1;
        b->reqs[i].length = 4096;
        b->reqs[i].local_addr = mem;
        b->reqs[i].remote_offset = 4096 * i;
        b->reqs[i].remote_segment = 7;
        b->reqs[i].peer = p;
    }
    mg_batches_add(set, b, 1);
    return b;
}

static mg_peer_session session(const uint8_t *token, uint64_t epoch)
{
    mg_peer_session s = {.token = token,
                         .data_host = "0.0.0.0", /* a wildcard: the control endpoint's host */
                         .data_port = 7446,
                         .epoch = epoch,
                         .expires_in_ms = 600000};
    return s;
}

static const uint8_t token_a[MG_DF_TOKEN_BYTES] = {0xa}, token_b[MG_DF_TOKEN_BYTES] = {0xb};

/* Requests wait for the session, one is asked for, and they start in order once it opens. */
static void test_wait_for_session(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 2);
    mg_peer_session s = session(token_a, 1);
    CU_ASSERT_EQUAL(p->state, MG_PEER_NONE);
    mg_peerdir_start(&b->reqs[0], 1000);
    mg_peerdir_start(&b->reqs[1], 1000);
    CU_ASSERT_EQUAL(n_asked, 1); /* one session for both */
    CU_ASSERT_EQUAL(p->state, MG_PEER_OPENING);
    CU_ASSERT_EQUAL(mg_peerdir_queued(p), 2u);
    CU_ASSERT_EQUAL(mg_test_njobs, 0);
    mg_peerdir_opened(p, &s, 1000);
    CU_ASSERT_EQUAL(p->state, MG_PEER_OPEN);
    CU_ASSERT_STRING_EQUAL(p->data_host, "10.0.0.2");
    CU_ASSERT_EQUAL(p->expires_ms, 1000 + 600000 - 30000); /* renewed before the peer drops it */
    CU_ASSERT_EQUAL(mg_test_njobs, 1); /* the first runs, the second waits in the line */
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(mg_peerdir_queued(p), 1u);
    CU_ASSERT_EQUAL(memcmp(b->reqs[0].token, token_a, MG_DF_TOKEN_BYTES), 0);
    CU_ASSERT_STRING_EQUAL(b->reqs[0].data_host, "10.0.0.2");
    CU_ASSERT_EQUAL(b->reqs[0].data_port, 7446);
    CU_ASSERT_EQUAL(b->reqs[0].x.kind, MG_XFER_TCP);
    CU_ASSERT_EQUAL(b->reqs[0].x.remote, 0u);
    CU_ASSERT_EQUAL(b->reqs[1].x.remote, 4096u);
    mg_test_job_back(0);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_DONE);
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_RUNNING);
    mg_test_job_back(0);
    CU_ASSERT_TRUE(mg_batch_is_over(b));
    CU_ASSERT_EQUAL(p->ended[1][0], 2u); /* the peer's counts: two WRITEs done */
    CU_ASSERT_EQUAL(p->bytes[1], 8192u);
    CU_ASSERT_EQUAL(p->restarts_seen, 0u);
    CU_ASSERT_STRING_EQUAL(p->rdma_why, "this daemon has no RDMA device: ");
    close_dir(d);
}

/* A refused session fails the requests that waited, by name; the next request asks again; a
 * session past its expiry is renewed. */
static void test_session_refused_and_renewed(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 3);
    mg_peer_session s = session(token_a, 1);
    mg_peerdir_start(&b->reqs[0], 1000);
    mg_peerdir_start(&b->reqs[1], 1000);
    mg_peerdir_failed(p, MG_ERR_PERMISSION, "it does not trust this daemon");
    CU_ASSERT_EQUAL(p->state, MG_PEER_FAILED);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(b->reqs[i].life.state, MG_REQ_FAILED);
        CU_ASSERT_EQUAL(b->reqs[i].err, MG_ERR_PERMISSION);
        CU_ASSERT_STRING_EQUAL(b->reqs[i].msg, "peer 10.0.0.2:7443: it does not trust this daemon");
    }
    CU_ASSERT_EQUAL(mg_peerdir_queued(p), 0u);
    CU_ASSERT_EQUAL(p->ended[1][1], 2u);
    CU_ASSERT_EQUAL(p->bytes[1], 0u);
    mg_peerdir_start(&b->reqs[2], 2000); /* asks again */
    CU_ASSERT_EQUAL(n_asked, 2);
    mg_peerdir_opened(p, &s, 2000);
    CU_ASSERT_EQUAL(mg_test_njobs, 1);
    mg_test_job_back(0);
    CU_ASSERT_TRUE(mg_batch_is_over(b));
    b = batch(p, 1);
    mg_peerdir_start(&b->reqs[0], p->expires_ms); /* expired: a new session first */
    CU_ASSERT_EQUAL(n_asked, 3);
    CU_ASSERT_EQUAL(mg_test_njobs, 0);
    mg_peerdir_opened(p, &s, p->expires_ms);
    CU_ASSERT_EQUAL(mg_test_njobs, 1);
    CU_ASSERT_EQUAL(p->restarts_seen, 0u); /* the same epoch */
    close_dir(d);
}

/* A token the peer no longer knows: back once through a new session, with the new epoch; a
 * second failure ends the request with both reasons. */
static void test_retry_after_epoch_change(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 3);
    mg_peer_session s1 = session(token_a, 1), s2 = session(token_b, 2);
    mg_peerdir_start(&b->reqs[0], 1000);
    mg_peerdir_opened(p, &s1, 1000);
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    mg_test_job_back(MG_ERR_AUTH); /* the peer restarted: our token means nothing there */
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_PENDING);
    CU_ASSERT_TRUE(b->reqs[0].life.requeued);
    CU_ASSERT_EQUAL(p->state, MG_PEER_OPENING); /* that token is dead: a new session */
    CU_ASSERT_EQUAL(n_asked, 2);
    mg_peerdir_start(&b->reqs[1], 1000); /* a request meanwhile waits for it too */
    CU_ASSERT_EQUAL(mg_peerdir_queued(p), 2u);
    mg_peerdir_opened(p, &s2, 1100);
    CU_ASSERT_EQUAL(p->restarts_seen, 1u);
    CU_ASSERT_EQUAL(p->epoch, 2u);
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_RUNNING); /* first in, first again */
    CU_ASSERT_EQUAL(memcmp(b->reqs[0].token, token_b, MG_DF_TOKEN_BYTES), 0);
    mg_test_job_back(0);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_DONE);
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    mg_test_job_back(MG_ERR_UNAVAILABLE); /* reqs[1]: its first failure, back once */
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(n_asked, 3);
    mg_peerdir_failed(p, MG_ERR_UNAVAILABLE, "connection refused"); /* and the peer is gone */
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_FAILED);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b->reqs[1].msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(b->reqs[1].msg, "; then a new session: peer 10.0.0.2:7443: "
                                                  "connection refused"));
    mg_peerdir_start(&b->reqs[2], 2000);
    mg_peerdir_opened(p, &s2, 2000);
    mg_test_job_back(MG_ERR_AUTH);
    CU_ASSERT_EQUAL(b->reqs[2].life.state, MG_REQ_PENDING); /* back once... */
    mg_peerdir_opened(p, &s2, 2100);
    mg_test_job_back(MG_ERR_AUTH);
    CU_ASSERT_EQUAL(b->reqs[2].life.state, MG_REQ_FAILED); /* ...not twice */
    CU_ASSERT_EQUAL(b->reqs[2].err, MG_ERR_AUTH);
    CU_ASSERT_PTR_NOT_NULL(strstr(b->reqs[2].msg, "peer 10.0.0.2:7443"));
    CU_ASSERT_EQUAL(p->restarts_seen, 1u);
    close_dir(d);
}

/* A request stopped (Cancel, timeout) whose job fails is not sent back to its peer. */
static void test_stopped_not_retried(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 1);
    mg_peer_session s = session(token_a, 1);
    mg_peerdir_start(&b->reqs[0], 1000);
    mg_peerdir_opened(p, &s, 1000);
    mg_batch_stop(b, MG_ERR_CANCELLED, "cancelled");
    mg_test_job_back(MG_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(n_asked, 1);
    close_dir(d);
}

/* A target the peer says it does not have is forgotten, so the next batch asks for it again. */
static void test_missing_target_forgotten(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 1);
    mg_peer_session s = session(token_a, 1);
    mg_remote_desc rd = {.id = 7, .size = 1 << 20, .remote_accessible = 1, .transports = 1};
    mg_remote_desc out;
    mg_peerdir_start(&b->reqs[0], 1000);
    mg_peerdir_opened(p, &s, 1000); /* the cache knows the peer's epoch now */
    CU_ASSERT_EQUAL(mg_peer_cache_put(descs, p->key, 1, &rd), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_get(descs, p->key, 7, 0, &out, NULL), 0);
    mg_test_job_back(MG_ERR_NOT_FOUND); /* it was unregistered since */
    CU_ASSERT_EQUAL(b->reqs[0].err, MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_peer_cache_get(descs, p->key, 7, 0, &out, NULL), MG_ERR_NOT_FOUND);
    close_dir(d);
}

/* Before a batch starts, its remote targets are checked against what the peers described:
 * unknown ones asked for once each, then a target the peer does not have, or a range outside
 * one, refuses the batch by name; a peer that could not be asked leaves it to the data plane. */
static void test_remote_targets(void)
{
    mg_peerdir *d = open_dir(8);
    mg_xfer_peer *p = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_batch *b = batch(p, 4);
    mg_peer_session s = session(token_a, 1);
    mg_remote_desc seg7 = {.id = 7, .size = 8192, .remote_accessible = 1, .transports = 1};
    mg_batch_target *ask = NULL;
    size_t nask = 0, bad = 99;
    char why[400];
    mg_peerdir_opened(p, &s, 1000); /* the cache knows the peer's epoch */
    b->reqs[2].remote_segment = 8;  /* reqs[0], [1]: segment 7 at 0 and 4096; [2]: segment 8 */
    b->reqs[3].local_copy = 1;      /* a copy here: no peer to ask */
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, NULL, 0, &ask, &nask, &bad, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL_FATAL(nask, 2u); /* each target once */
    CU_ASSERT_EQUAL(ask[0].id, 7u);
    CU_ASSERT_EQUAL(ask[1].id, 8u);
    CU_ASSERT_EQUAL(ask[0].state, MG_TARGET_UNANSWERED);
    mg_batch_target_answered(descs, &ask[0], &seg7, 1, 0, 1000);
    mg_batch_target_answered(descs, &ask[1], NULL, 0, 0, 1000); /* unreachable */
    CU_ASSERT_EQUAL(ask[0].state, MG_TARGET_KNOWN);
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, ask, nask, NULL, NULL, &bad, why, sizeof(why)),
                    0);                                         /* 8 is left to the data plane */
    mg_batch_target_answered(descs, &ask[1], NULL, 0, 1, 1000); /* the peer has no segment 8 */
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, ask, nask, NULL, NULL, &bad, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(bad, 2u);
    CU_ASSERT_STRING_EQUAL(why, "peer 10.0.0.2:7443 has no segment 8");
    b->reqs[2].remote_segment = 7;
    b->reqs[1].remote_offset = 8192; /* past the end of segment 7 */
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, ask, nask, NULL, NULL, &bad, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(bad, 1u);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "10.0.0.2:7443"));
    free(ask);
    ask = NULL;
    nask = 0;
    b->reqs[1].remote_offset = 4096; /* a second batch: the cache answers for segment 7... */
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, NULL, 0, &ask, &nask, &bad, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(nask, 1u); /* ...but reqs[2] is outside it as known: asked again first */
    free(ask);
    ask = NULL;
    nask = 0;
    b->reqs[2].remote_offset = 0;
    CU_ASSERT_EQUAL(mg_batch_check_remote(b, descs, NULL, 0, &ask, &nask, &bad, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(nask, 0u); /* all known and inside: nothing to ask */
    free(ask);
    close_dir(d);
}

/* One entry per peer and tenant, up to the limit; peer "" is this daemon, always open. */
static void test_entries(void)
{
    mg_peerdir *d = open_dir(3);
    mg_xfer_peer *a = mg_peerdir_get(d, "10.0.0.2:7443", "t1");
    mg_xfer_peer *local = mg_peerdir_get(d, "", "t1");
    mg_batch *b = batch(local, 1);
    CU_ASSERT_PTR_EQUAL(mg_peerdir_get(d, "10.0.0.2:7443", "t1"), a);
    CU_ASSERT_PTR_NOT_EQUAL(mg_peerdir_get(d, "10.0.0.2:7443", "t2"), a);
    CU_ASSERT_PTR_NULL(mg_peerdir_get(d, "10.0.0.3:7443", "t1")); /* full */
    CU_ASSERT_STRING_EQUAL(a->key, "t1@10.0.0.2:7443");
    CU_ASSERT_PTR_EQUAL(mg_peerdir_first(d), mg_peerdir_get(d, "10.0.0.2:7443", "t2"));
    b->reqs[0].local_copy = 1;
    b->reqs[0].other_addr = mem + 8192;
    mg_peerdir_start(&b->reqs[0], 1000); /* no session: a copy on the workers */
    CU_ASSERT_EQUAL(n_asked, 0);
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    CU_ASSERT_EQUAL(b->reqs[0].x.kind, MG_XFER_COPY);
    mg_test_job_back(0);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_DONE);
    close_dir(d);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_wait_for_session),
        MG_TEST(test_session_refused_and_renewed),
        MG_TEST(test_retry_after_epoch_change),
        MG_TEST(test_stopped_not_retried),
        MG_TEST(test_missing_target_forgotten),
        MG_TEST(test_remote_targets),
        MG_TEST(test_entries),
    };
    return mg_test_run("peer directory", cases, sizeof(cases) / sizeof(cases[0]));
}
