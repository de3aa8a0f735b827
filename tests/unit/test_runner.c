/*
 * Unit tests for the batch runner (moongate/runner.h) in memory, no daemon: the front's asks
 * of peers are recorded and answered by the test, the scheduler's jobs run on an inline worker
 * the test completes (mg_test_jobs.h), and a digest's local CRC32C is taken of a real segment.
 * A batch naming an agent is resolved after one ask, then its target described, then
 * prepared; refusals name the request or the peer; a batch being prepared is counted and found
 * by request_id; once the directory is closed, prepare answers UNAVAILABLE; a started batch's
 * requests join their peers and its notifications with no WRITE are due; a region refused
 * while running is asked for once for every request on it, and the request starts again or
 * ends with both reasons (refused again: the peer's); a digest ends a request DONE, DATA_LOSS
 * or UNAVAILABLE.
 */
#include "mg_test_jobs.h"
#include "moongate/dataframe.h"
#include "mg_grpc.h"
#include "moongate/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the front: asks recorded ---- */

static void *agent_jobs[8];
static int n_agent_asks;
static void *target_jobs[8];
static uint64_t target_ids[8];
static int n_target_asks;
static void *crc_jobs[8];
static int n_crc_asks;
static int refuse_asks; /* asks are not started */

static int describe_agent(void *arg, mg_xfer_peer *p, const mg_agent_ref *ref, void *job, char *why,
                          size_t cap)
{
    (void)arg, (void)p, (void)ref;
    if (refuse_asks) {
        snprintf(why, cap, "no connection");
        return -1;
    }
    agent_jobs[n_agent_asks++] = job;
    return 0;
}

static int describe_target(void *arg, mg_xfer_peer *p, uint64_t id, int is_lease, void *job)
{
    (void)arg, (void)p, (void)is_lease;
    target_ids[n_target_asks] = id;
    target_jobs[n_target_asks++] = job;
    return 0;
}

static int checksum(void *arg, const mg_batch_req *r, void *job, char *why, size_t cap)
{
    (void)arg, (void)r, (void)why, (void)cap;
    crc_jobs[n_crc_asks++] = job;
    return 0;
}

/* What prepared said. */
static int n_prepared;
static mg_batch *prepared_b;
static mg_xfer_refusal refusal;
static int refused;

static void prepared(void *arg, void *ctx, mg_batch *b, const mg_xfer_refusal *no)
{
    (void)arg, (void)ctx;
    n_prepared++;
    prepared_b = b;
    refused = no != NULL;
    if (no)
        refusal = *no;
}

/* The runner's clock: the time the session below was opened. */
static uint64_t test_clock(void)
{
    return 1000;
}

/* The engine's workers, inline: a digest's local CRC32C runs at once. */
static int submit_inline(mg_engine *e, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg)
{
    (void)e, (void)cq;
    done(arg, work(arg));
    return 0;
}

/* ---- the engine's pieces ---- */

static mg_xfer_peer *sessions[8];
static int n_sessions;
static void open_session(void *arg, mg_xfer_peer *p)
{
    (void)arg;
    sessions[n_sessions++] = p;
}
static int connect_rdma(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *setup, char *why, size_t cap)
{
    (void)arg, (void)p, (void)device, (void)local, (void)setup, (void)why, (void)cap;
    return -1;
}

static mg_batch_note *due[8];
static int n_due;
static void on_request_ended(void *arg, mg_batch_req *r)
{
    (void)arg;
    if (r->peer) /* as the front does */
        mg_peerdir_request_ended(r);
}
static void on_note_due(void *arg, mg_batch_note *n)
{
    (void)arg;
    due[n_due++] = n;
}
static void on_changed(void *arg, mg_batch *b)
{
    (void)arg, (void)b;
}
static void on_freed(void *arg, mg_batch *b)
{
    (void)arg, (void)b;
}
static int deliver(void *arg, mg_note_item *item, const mg_note_msg *m, char *why, size_t cap)
{
    (void)arg, (void)item, (void)m, (void)why, (void)cap;
    return 0;
}
static void send_over(void *arg, void *owner, int code, const char *why)
{
    (void)arg, (void)owner, (void)code, (void)why;
}

static mg_batches *set;
static mg_peer_cache *descs;
static mg_agent_cache *agents;
static mg_peerdir *dir;
static mg_notelines *lines;
static mg_runner *run;
static mg_xfer_peer *p;

static char shm[64];
static mg_registry *reg;
static mg_segment *seg;

static void open_runner(void)
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
                                      .slice_bytes = 1 << 20,
                                      .submit = mg_test_submit},
                            .io_timeout_ms = 1000,
                            .open_session = open_session,
                            .connect_rdma = connect_rdma};
    mg_notelines_config nc = {.line_max = 8, .deliver = deliver, .send_over = send_over};
    mg_runner_config rc = {.describe_agent = describe_agent,
                           .describe_target = describe_target,
                           .checksum = checksum,
                           .prepared = prepared,
                           .submit = submit_inline,
                           .now_ms = test_clock};
    mg_registry_config gc = {.shm_dir = shm, .file_mode = 0600, .max_segments = 4};
    mg_segment_spec spec = {.tenant = "t1",
                            .name = "a",
                            .source = MG_SEG_ANON,
                            .size = 1 << 16,
                            .location = "cpu:0",
                            .memlock = MG_MEMLOCK_OFF};
    char err[MG_SEG_ERROR_MAX];
    n_agent_asks = n_target_asks = n_crc_asks = refuse_asks = n_prepared = refused = 0;
    n_sessions = n_due = mg_test_njobs = 0;
    snprintf(shm, sizeof(shm), "/tmp/mgrunner-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(shm));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &gc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    CU_ASSERT_EQUAL_FATAL(mg_segment_map(seg), 0);
    mg_registry_commit(reg, seg, 0);
    bc.reg = reg;
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&descs, 16, 16), 0);
    CU_ASSERT_EQUAL_FATAL(mg_agent_cache_new(&agents, 16), 0);
    dc.descs = descs;
    CU_ASSERT_EQUAL_FATAL(mg_batches_new(&set, &bc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_peerdir_new(&dir, &dc), 0);
    nc.dir = dir;
    CU_ASSERT_EQUAL_FATAL(mg_notelines_new(&lines, &nc), 0);
    rc.dir = dir;
    rc.agents = agents;
    rc.descs = descs;
    CU_ASSERT_EQUAL(mg_runner_new(&run, &rc), MG_ERR_INVALID); /* no lines */
    rc.lines = lines;
    CU_ASSERT_EQUAL_FATAL(mg_runner_new(&run, &rc), 0);
    p = mg_peerdir_get(dir, "10.0.0.2:7443", "t1");
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(descs, p->key, 1, 1000), 1); /* news */
}

static void close_runner(void)
{
    while (mg_test_njobs)
        mg_test_job_back(MG_ERR_SHUTDOWN);
    mg_peerdir_close(dir);
    mg_runner_del(run);
    mg_notelines_del(lines);
    mg_batches_del(set);
    mg_peerdir_del(dir);
    mg_agent_cache_del(agents);
    mg_peer_cache_del(descs);
    mg_registry_del(reg);
    rmdir(shm);
}

static const mg_agent_ref agent_a = {.peer = "10.0.0.2:7443", .name = "a"};

/* A batch of n READs of 4 KiB from agent "a" on p at 0x10000 + 4096 i (not entered). */
static mg_batch *agent_batch(size_t n, const char *request_id)
{
    mg_batch *b = mg_batch_new(set, "t1", n, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    b->agents = calloc(1, sizeof(*b->agents));
    CU_ASSERT_PTR_NOT_NULL_FATAL(b->agents);
    b->agents[0] = malloc(sizeof(mg_agent_ref));
    CU_ASSERT_PTR_NOT_NULL_FATAL(b->agents[0]);
    *b->agents[0] = agent_a;
    b->nagents = 1;
    snprintf(b->request_id, sizeof(b->request_id), "%s", request_id);
    for (size_t i = 0; i < n; i++) {
        b->reqs[i].length = 4096;
        b->reqs[i].peer = p;
        b->reqs[i].agent = 1;
        b->reqs[i].remote_address = 0x10000 + 4096 * i;
    }
    return b;
}

/* What the peer says of agent "a": one region at 0x10000 of `size` bytes, segment `id`. */
static void agent_known(uint64_t id, uint64_t size)
{
    mg_remote_region region = {.address = 0x10000, .size = size, .id = id};
    mg_remote_agent a = {.name = "a", .port = 17000, .agent_id = 1, .regions = &region, .n = 1};
    CU_ASSERT_EQUAL(mg_agent_cache_put(agents, p->key, 1, &a), 0);
}

static void target_known(uint64_t id, uint64_t size)
{
    mg_remote_desc d = {.id = id, .size = size, .remote_accessible = 1, .transports = 1};
    CU_ASSERT_EQUAL(mg_peer_cache_put(descs, p->key, 1, &d), 0);
}

/* An agent not known is asked for once; its answer resolves every request; the segment it
 * names is described; then the batch is prepared. Meanwhile it counts as being prepared. */
static void test_prepare(void)
{
    mg_batch *b;
    mg_remote_desc d = {.id = 7, .size = 1 << 20, .remote_accessible = 1, .transports = 1};
    open_runner();
    b = agent_batch(3, "r1");
    mg_runner_prepare(run, b, NULL);
    CU_ASSERT_EQUAL(n_agent_asks, 1); /* three requests, one agent */
    CU_ASSERT_EQUAL(n_prepared, 0);
    CU_ASSERT_EQUAL(mg_runner_preparing(run, "t1", NULL), 1u);
    CU_ASSERT_EQUAL(mg_runner_preparing(run, "t1", "r1"), 1u);
    CU_ASSERT_EQUAL(mg_runner_preparing(run, "t1", "r2"), 0u);
    CU_ASSERT_EQUAL(mg_runner_preparing(run, "t2", NULL), 0u);
    agent_known(7, 1 << 20);
    mg_runner_agent_answered(agent_jobs[0], 0, NULL);
    CU_ASSERT_EQUAL(b->reqs[2].remote_segment, 7u);
    CU_ASSERT_EQUAL(b->reqs[2].remote_offset, 8192u);
    CU_ASSERT_EQUAL_FATAL(n_target_asks, 1); /* segment 7, once */
    CU_ASSERT_EQUAL(target_ids[0], 7u);
    CU_ASSERT_EQUAL(n_prepared, 0);
    mg_runner_target_answered(target_jobs[0], &d, 1, 0);
    CU_ASSERT_EQUAL(n_prepared, 1);
    CU_ASSERT_PTR_EQUAL(prepared_b, b);
    CU_ASSERT_EQUAL(refused, 0);
    CU_ASSERT_EQUAL(mg_runner_preparing(run, "t1", NULL), 0u);
    mg_batch_discard(b);
    /* known now: the next batch is prepared at once, asking nothing */
    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL);
    CU_ASSERT_EQUAL(n_prepared, 2);
    CU_ASSERT_EQUAL(refused, 0);
    CU_ASSERT_EQUAL(n_agent_asks + n_target_asks, 2);
    mg_batch_discard(b);
    close_runner();
}

/* Refusals: a peer that did not answer (named, once whatever the number of asks), an ask that
 * could not start, an address no region holds (the request named), a target the peer does not
 * have (the request named). */
static void test_prepare_refused(void)
{
    mg_batch *b;
    open_runner();
    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL);
    mg_runner_agent_answered(agent_jobs[0], MG_GRPC_UNAVAILABLE, "connection refused");
    CU_ASSERT_EQUAL(refused, 1);
    CU_ASSERT_EQUAL(refusal.grpc, MG_GRPC_UNAVAILABLE);
    CU_ASSERT_EQUAL(refusal.err, 0);
    CU_ASSERT_STRING_EQUAL(refusal.why,
                           "peer 10.0.0.2:7443: connection refused; nothing was moved");
    mg_batch_discard(b);

    refuse_asks = 1;
    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL); /* answered before it returns */
    CU_ASSERT_EQUAL(n_prepared, 2);
    CU_ASSERT_EQUAL(refusal.grpc, MG_GRPC_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(refusal.why, "peer 10.0.0.2:7443: no connection; nothing was moved");
    mg_batch_discard(b);
    refuse_asks = 0;

    b = agent_batch(2, "");
    b->reqs[1].remote_address = 0x90000; /* outside the region the peer will describe */
    mg_runner_prepare(run, b, NULL);
    agent_known(7, 8192);
    mg_runner_agent_answered(agent_jobs[1], 0, NULL);
    CU_ASSERT_EQUAL(refusal.err, MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(refusal.request, 1u);
    mg_batch_discard(b);

    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL); /* agent known: its segment 7 is asked for */
    CU_ASSERT_EQUAL_FATAL(n_target_asks, 1);
    mg_runner_target_answered(target_jobs[0], NULL, 0, MG_GRPC_NOT_FOUND);
    CU_ASSERT_EQUAL(refusal.err, MG_ERR_INVALID);
    CU_ASSERT_EQUAL(refusal.request, 0u);
    CU_ASSERT_STRING_EQUAL(refusal.why, "peer 10.0.0.2:7443 has no segment 7");
    CU_ASSERT_EQUAL(n_prepared, 4);
    mg_batch_discard(b);
    close_runner();
}

/* The daemon stops while peers are asked: the batch is refused UNAVAILABLE. */
static void test_prepare_closed(void)
{
    mg_batch *b;
    open_runner();
    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL);
    mg_peerdir_close(dir);
    mg_runner_agent_answered(agent_jobs[0], 0, NULL);
    CU_ASSERT_EQUAL(refused, 1);
    CU_ASSERT_EQUAL(refusal.grpc, MG_GRPC_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(refusal.why, "the daemon is stopping");
    mg_batch_discard(b);
    close_runner();
}

/* A started batch: each request joins its peer (a session is asked for), one with no peer
 * entry ends naming the limit, and a notification with no WRITE to wait for is due. */
static void test_start(void)
{
    mg_batch *b;
    open_runner();
    b = mg_batch_new(set, "t1", 2, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    b->reqs[0].length = b->reqs[1].length = 4096;
    b->reqs[0].remote_segment = 7;
    b->reqs[0].peer = p;
    b->notes[0].peer = p;
    b->notes[0].payload = malloc(1);
    snprintf(b->notes[0].topic, sizeof(b->notes[0].topic), "kv");
    mg_batches_add(set, b, 1);
    mg_runner_start(run, b);
    CU_ASSERT_EQUAL(n_sessions, 1);
    CU_ASSERT_EQUAL(mg_peerdir_queued(p), 1u);
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_FAILED);
    CU_ASSERT_STRING_EQUAL(b->reqs[1].msg, "this daemon already knows its limit of 1024 peers");
    CU_ASSERT_EQUAL(n_due, 1);
    CU_ASSERT_PTR_NOT_NULL(b->notes[0].front); /* in line */
    mg_batch_note_end(due[0], MG_NOTE_SENT, 0, NULL);
    close_runner();
}

static const uint8_t token_a[MG_DF_TOKEN_BYTES] = {0xa};

/* Opens p's session: the started requests take jobs. */
static void session_open(void)
{
    mg_peer_session s = {.token = token_a,
                         .data_host = "0.0.0.0",
                         .data_port = 7446,
                         .epoch = 1,
                         .expires_in_ms = 600000};
    mg_peerdir_opened(p, &s, 1000);
}

/* A region refused while running: one ask for both requests on it; the answer moves them to
 * where the address is now and they start again; an address no region holds now ends its
 * request with both reasons, and a request refused once more ends with the peer's (no second
 * ask). */
static void test_region_refused(void)
{
    mg_batch *b;
    open_runner();
    agent_known(7, 1 << 20);
    target_known(7, 1 << 20);
    b = agent_batch(2, "");
    mg_runner_prepare(run, b, NULL);
    CU_ASSERT_EQUAL_FATAL(n_prepared, 1);
    CU_ASSERT_EQUAL(refused, 0);
    mg_batches_add(set, b, 1);
    mg_runner_start(run, b);
    session_open();
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1); /* one job at a time on the peer's line */
    mg_test_job_back(MG_ERR_NOT_FOUND);      /* the peer has no segment 7 now */
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    mg_test_job_back(MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(n_agent_asks, 1); /* once for both */
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_PENDING);
    agent_known(9, 4096); /* registered again: segment 9, one page */
    target_known(9, 4096);
    mg_runner_agent_answered(agent_jobs[0], 0, NULL);
    CU_ASSERT_EQUAL(b->reqs[0].remote_segment, 9u);
    CU_ASSERT_EQUAL(mg_test_njobs, 1); /* request 0 again */
    CU_ASSERT_EQUAL(b->reqs[1].life.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(b->reqs[1].err, MG_ERR_NOT_FOUND); /* no region holds its address */
    CU_ASSERT_PTR_NOT_NULL(strstr(b->reqs[1].msg, "peer 10.0.0.2:7443: its region at 0x11000 was "
                                                  "refused, and asked again: "));
    CU_ASSERT_STRING_EQUAL(b->reqs[1].msg,
                           "peer 10.0.0.2:7443: its region at 0x11000 was refused, and asked "
                           "again: agent \"a\" on t1@10.0.0.2:7443 has no region holding address "
                           "0x11000 (1 regions)");
    mg_test_job_back(MG_ERR_NOT_FOUND); /* refused once more: it ends, no second ask */
    CU_ASSERT_EQUAL(n_agent_asks, 1);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(b->reqs[0].err, MG_ERR_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(b->reqs[0].msg, "peer 10.0.0.2:7443: not found"); /* the peer's */
    close_runner();
}

/* The peer could not say where the address is now: the request ends with both reasons. */
static void test_region_refused_unanswered(void)
{
    mg_batch *b;
    open_runner();
    agent_known(7, 1 << 20);
    target_known(7, 1 << 20);
    b = agent_batch(1, "");
    mg_runner_prepare(run, b, NULL);
    mg_batches_add(set, b, 1);
    mg_runner_start(run, b);
    session_open();
    mg_test_job_back(MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL_FATAL(n_agent_asks, 1);
    mg_runner_agent_answered(agent_jobs[0], MG_GRPC_UNAVAILABLE, "connection refused");
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(b->reqs[0].err, MG_ERR_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(b->reqs[0].msg, "peer 10.0.0.2:7443: its region at 0x10000 was "
                                           "refused, and asked again: connection refused");
    close_runner();
}

/* A digest: the local CRC32C against the peer's; equal ends DONE, different DATA_LOSS naming
 * both, no answer UNAVAILABLE. */
static void test_digest(void)
{
    mg_batch *b;
    uint8_t *mem;
    uint32_t crc;
    open_runner();
    mem = mg_segment_addr(seg);
    memset(mem, 0x5a, 4096);
    crc = mg_crc32c(0, mem, 4096);
    b = mg_batch_new(set, "t1", 3, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    b->digest = 1;
    for (size_t i = 0; i < 3; i++) {
        b->reqs[i].write = 1;
        b->reqs[i].length = 4096;
        b->reqs[i].peer = p;
        b->reqs[i].local = seg;
        mg_registry_hold(reg, seg, 1);
        b->reqs[i].local_addr = mem;
        CU_ASSERT_EQUAL(mg_req_start(&b->reqs[i].life), 0);
    }
    mg_batches_add(set, b, 1);
    for (size_t i = 0; i < 3; i++)
        mg_runner_verify(run, &b->reqs[i]);
    CU_ASSERT_EQUAL_FATAL(n_crc_asks, 3);
    mg_runner_checksum_answered(crc_jobs[0], 0, NULL, crc);
    mg_runner_checksum_answered(crc_jobs[1], 0, NULL, crc ^ 1);
    mg_runner_checksum_answered(crc_jobs[2], MG_GRPC_UNAVAILABLE, "gone", 0);
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_DONE);
    CU_ASSERT_EQUAL(b->reqs[1].err, MG_ERR_DATA_LOSS);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(b->reqs[1].msg, "the CRC32C of the bytes that landed on the peer"));
    CU_ASSERT_EQUAL(b->reqs[2].err, MG_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(b->reqs[2].msg, "did not give the CRC32C of the range: gone"));
    close_runner();
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_prepare),
        MG_TEST(test_prepare_refused),
        MG_TEST(test_prepare_closed),
        MG_TEST(test_start),
        MG_TEST(test_region_refused),
        MG_TEST(test_digest),
        MG_TEST(test_region_refused_unanswered),
    };
    return mg_test_run("batch runner", cases, sizeof(cases) / sizeof(cases[0]));
}
