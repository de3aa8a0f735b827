/*
 * Unit tests for the transfer batches (moongate/batches.h) in memory, no daemon: a real
 * segment registry for the local memory requests hold, and the transfer scheduler with an
 * inline worker for requests that run. Ids and lookups; a request ends once and lets go of its
 * memory; a stop at every state a request can be in (ended, running, in its peer's line,
 * waiting for a session, between lines); notifications due after their peer's WRITEs; records
 * kept after compaction; --max-batches and --batch-retention forgetting only batches over.
 */
#include "mg_test_jobs.h"
#include "moongate/batches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static mg_registry *reg;
static mg_segment *seg; /* one anon segment the requests' local sides are in */

/* What the batches told the front. */
static int n_req_ended, n_changed, n_freed;
static mg_batch_note *due[8];
static int n_due;

static void on_request_ended(void *arg, mg_batch_req *r)
{
    (void)arg;
    (void)r;
    n_req_ended++;
}
static void on_note_due(void *arg, mg_batch_note *n)
{
    (void)arg;
    due[n_due++] = n;
}
static void on_changed(void *arg, mg_batch *b)
{
    (void)arg;
    (void)b;
    n_changed++;
}
static void on_freed(void *arg, mg_batch *b)
{
    (void)arg;
    n_freed++;
    free(b->front);
    b->front = NULL;
}

static uint32_t seg_refs(void)
{
    mg_segment_info info;
    mg_segment_get_info(reg, seg, &info);
    return info.refs;
}

/* The set's clock: the test says what time it is. */
static uint64_t clock_ms = 1;
static uint64_t test_clock(void)
{
    return clock_ms;
}

static mg_batches *open_set(size_t max_batches, uint64_t retention_ms)
{
    mg_registry_config rc = {.shm_dir = dir, .file_mode = 0600, .max_segments = 4};
    mg_segment_spec spec = {.tenant = "t1",
                            .name = "a",
                            .source = MG_SEG_ANON,
                            .size = 1 << 20,
                            .location = "cpu:0",
                            .memlock = MG_MEMLOCK_OFF};
    mg_batches_config c = {.max_batches = max_batches,
                           .retention_ms = retention_ms,
                           .now_ms = test_clock,
                           .request_ended = on_request_ended,
                           .note_due = on_note_due,
                           .changed = on_changed,
                           .freed = on_freed};
    mg_batches *s = NULL;
    char err[MG_SEG_ERROR_MAX];
    snprintf(dir, sizeof(dir), "/tmp/mgbatches-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &rc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    CU_ASSERT_EQUAL_FATAL(mg_segment_map(seg), 0);
    mg_registry_commit(reg, seg, 0);
    c.reg = reg;
    CU_ASSERT_EQUAL_FATAL(mg_batches_new(&s, &c), 0);
    n_req_ended = n_changed = n_freed = n_due = 0;
    return s;
}

static void close_set(mg_batches *s)
{
    mg_batches_del(s);
    CU_ASSERT_EQUAL(seg_refs(), 0u); /* every request let go of its memory */
    mg_registry_del(reg);
    rmdir(dir);
}

/* A batch of n requests, each holding the segment (op WRITE when write), not entered yet. */
static mg_batch *batch(mg_batches *s, const char *tenant, size_t n, size_t nnotes, int write)
{
    mg_batch *b = mg_batch_new(s, tenant, n, nnotes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    for (size_t i = 0; i < n; i++) {
        mg_batch_req *r = &b->reqs[i];
        r->write = write;
        r->length = 4096;
        r->local = seg;
        mg_registry_hold(reg, seg, 1);
        r->local_addr = mg_segment_addr(seg);
    }
    return b;
}

/* Entered, with a front (so the set tells of its freeing). */
static mg_batch *enter(mg_batches *s, mg_batch *b)
{
    b->front = calloc(1, 1);
    mg_batches_add(s, b, 1);
    return b;
}

static void test_ids_and_lookup(void)
{
    mg_batches *s = open_set(16, 1000);
    mg_batch *a = batch(s, "t1", 2, 0, 0), *b = batch(s, "t2", 1, 0, 0), *c;
    CU_ASSERT_NOT_EQUAL(a->id, 0);
    CU_ASSERT_NOT_EQUAL(a->id, b->id);
    CU_ASSERT_EQUAL(seg_refs(), 3u);
    CU_ASSERT_PTR_NULL(mg_batches_find(s, a->id)); /* being checked: not found yet */
    snprintf(a->request_id, sizeof(a->request_id), "job-1");
    enter(s, a);
    CU_ASSERT_PTR_EQUAL(mg_batches_find(s, a->id), a);
    CU_ASSERT_PTR_EQUAL(mg_batches_find_request(s, "t1", "job-1"), a);
    CU_ASSERT_PTR_NULL(mg_batches_find_request(s, "t2", "job-1")); /* another tenant's */
    CU_ASSERT_PTR_NULL(mg_batches_find_request(s, "t1", ""));
    CU_ASSERT_EQUAL(mg_batches_running(s, "t1"), 1u);
    CU_ASSERT_EQUAL(mg_batches_running(s, "t2"), 0u);
    mg_batch_discard(b); /* failed its checks: its memory goes back, no event */
    CU_ASSERT_EQUAL(seg_refs(), 2u);
    CU_ASSERT_EQUAL(n_freed, 0);
    c = enter(s, batch(s, "t2", 1, 0, 0));
    CU_ASSERT_PTR_EQUAL(mg_batches_first(s), c); /* newest first */
    CU_ASSERT_PTR_EQUAL(mg_batches_next(s, c), a);
    CU_ASSERT_PTR_NULL(mg_batches_next(s, a));
    CU_ASSERT_EQUAL(mg_batches_count(s), 2u);
    CU_ASSERT_EQUAL(mg_batches_running(s, NULL), 2u);
    close_set(s);
    CU_ASSERT_EQUAL(n_freed, 2);
}

/* A request ends once; success needs a run; its memory goes back when it ends; the batch's
 * records say the same before and after compaction. */
static void test_request_ends_once(void)
{
    mg_batches *s = open_set(16, 1000);
    mg_batch *b = enter(s, batch(s, "t1", 2, 0, 0));
    mg_batch_rec before[2], after[2];
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], 0, NULL), -1); /* DONE without running */
    CU_ASSERT_EQUAL(b->reqs[0].life.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(mg_req_start(&b->reqs[0].life), 0);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], 0, NULL), 0);
    CU_ASSERT_EQUAL(seg_refs(), 1u);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[0], MG_ERR_TIMEOUT, "late"), -1);
    CU_ASSERT_EQUAL(b->counts.done, 1u);
    CU_ASSERT_EQUAL(b->counts.failed, 0u);
    CU_ASSERT_FALSE(mg_batch_is_over(b));
    mg_batch_compact(b); /* not over: nothing changes */
    CU_ASSERT_PTR_NOT_NULL(b->reqs);
    CU_ASSERT_EQUAL(mg_batch_req_end(&b->reqs[1], MG_ERR_UNAVAILABLE, "peer 10.0.0.2:7443: gone"),
                    0);
    CU_ASSERT_EQUAL(seg_refs(), 0u);
    CU_ASSERT_EQUAL(n_req_ended, 2);
    CU_ASSERT_EQUAL(n_changed, 2);
    CU_ASSERT_TRUE(mg_batch_is_over(b));
    CU_ASSERT_NOT_EQUAL(b->end_ms, 0);
    CU_ASSERT_EQUAL(mg_batch_state(&b->counts), MG_REQ_FAILED);
    for (int i = 0; i < 2; i++)
        before[i] = mg_batch_record(b, (size_t)i);
    mg_batch_compact(b);
    CU_ASSERT_PTR_NULL(b->reqs);
    for (int i = 0; i < 2; i++) {
        after[i] = mg_batch_record(b, (size_t)i);
        CU_ASSERT_EQUAL(after[i].bytes, before[i].bytes);
        CU_ASSERT_EQUAL(after[i].state, before[i].state);
        CU_ASSERT_EQUAL(after[i].err, before[i].err);
        CU_ASSERT_EQUAL(after[i].transport, before[i].transport);
    }
    CU_ASSERT_EQUAL(after[0].bytes, 4096u);
    CU_ASSERT_STRING_EQUAL(mg_batch_transport_name(after[0].transport), "tcp");
    CU_ASSERT_PTR_NULL(after[0].msg);
    CU_ASSERT_STRING_EQUAL(after[1].msg, "peer 10.0.0.2:7443: gone");
    CU_ASSERT_EQUAL(after[1].state, MG_REQ_FAILED);
    close_set(s);
}

/* ---- the scheduler, with an inline worker, for requests that run ---- */

static mg_batch_req *req_of(mg_xfer_req *x)
{
    return mg_container_of(x, mg_batch_req, x);
}
static void on_started(void *arg, mg_xfer_req *x)
{
    (void)arg;
    mg_req_start(&req_of(x)->life);
}
static void on_job(void *arg, mg_xfer_req *x)
{
    (void)arg;
    (void)x;
}
static void on_moved(void *arg, mg_xfer_req *x, int rc, const char *msg)
{
    (void)arg;
    mg_batch_req_end(req_of(x), rc, msg);
}

static mg_xfer_sched *open_sched(void)
{
    mg_xfer_sched_config c = {.workers = (mg_engine *)1,
                              .io = (mg_engine *)2,
                              .cq = (mg_cq *)3,
                              .worker_slots = 2,
                              .io_slots = 2, /* a peer gets all slots but one: 1 job */
                              .max_parts = 1,
                              .slice_bytes = 1 << 20,
                              .started = on_started,
                              .job_started = on_job,
                              .job_ended = on_job,
                              .ended = on_moved,
                              .submit = mg_test_submit};
    mg_xfer_sched *s = NULL;
    mg_test_njobs = 0;
    CU_ASSERT_EQUAL_FATAL(mg_xfer_sched_new(&s, &c), 0);
    return s;
}

/* What the front does when a request's session is open: it joins its peer's line. */
static void line_up(mg_xfer_line *line, mg_batch_req *r)
{
    r->x.kind = MG_XFER_TCP;
    r->x.write = r->write;
    r->x.local = r->local_addr;
    r->x.length = r->length;
    r->x.link.stop = &r->x.stop;
    mg_xfer_sched_add(line, &r->x);
}

/* Cancel (or a timeout) reaches a request in every state it can be in. */
static void test_stop_at_every_state(void)
{
    mg_batches *s = open_set(16, 1000);
    mg_xfer_sched *sched = open_sched();
    mg_xfer_line line;
    mg_list waiting; /* a peer's requests waiting for its session */
    mg_batch *b = enter(s, batch(s, "t1", 5, 0, 1));
    mg_batch_req *r = b->reqs;
    mg_xfer_line_init(sched, &line, 1);
    mg_list_init(&waiting);
    line_up(&line, &r[0]); /* runs, and is done */
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    mg_test_job_back(0);
    CU_ASSERT_EQUAL(r[0].life.state, MG_REQ_DONE);
    line_up(&line, &r[1]); /* runs: the peer's one slot */
    line_up(&line, &r[2]); /* waits in the line for it */
    CU_ASSERT_EQUAL(r[1].life.state, MG_REQ_RUNNING);
    CU_ASSERT_EQUAL(r[2].life.state, MG_REQ_PENDING);
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&line), 1u);
    mg_list_push_back(&waiting, &r[3].wait); /* waits for its peer's session */
    /* r[4]: pending in no line (between the session and its line) */

    mg_batch_stop(b, MG_ERR_CANCELLED, "cancelled before it started");
    CU_ASSERT_EQUAL(r[0].life.state, MG_REQ_DONE); /* ended: stays as it was */
    CU_ASSERT_EQUAL(r[0].err, 0);
    CU_ASSERT_EQUAL(r[1].life.state, MG_REQ_RUNNING); /* ends when its job sees the word */
    CU_ASSERT_EQUAL(mg_xfer_req_stopped(&r[1].x), MG_ERR_CANCELLED);
    CU_ASSERT_EQUAL(r[2].life.state, MG_REQ_FAILED); /* out of the line, ended now */
    CU_ASSERT_EQUAL(r[2].err, MG_ERR_CANCELLED);
    CU_ASSERT_STRING_EQUAL(r[2].msg, "cancelled before it started");
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&line), 0u);
    CU_ASSERT_EQUAL(r[3].life.state, MG_REQ_FAILED); /* off the session's waiting list */
    CU_ASSERT_TRUE(mg_list_empty(&waiting));
    CU_ASSERT_EQUAL(r[4].life.state, MG_REQ_PENDING); /* stops when it is started */
    CU_ASSERT_EQUAL(mg_xfer_req_stopped(&r[4].x), MG_ERR_CANCELLED);
    CU_ASSERT_EQUAL(seg_refs(), 2u); /* r[1] and r[4] hold theirs still */
    CU_ASSERT_FALSE(mg_batch_is_over(b));

    CU_ASSERT_EQUAL_FATAL(mg_test_njobs,
                          1); /* r[1]'s job comes back: the mover saw the stop word */
    mg_test_job_back(MG_ERR_CANCELLED);
    CU_ASSERT_EQUAL(r[1].life.state, MG_REQ_FAILED);
    CU_ASSERT_EQUAL(r[1].err, MG_ERR_CANCELLED);
    CU_ASSERT_EQUAL(mg_test_njobs, 0); /* the line is empty: nothing else started */
    line_up(&line, &r[4]);             /* started late, it ends at its first look at the word */
    CU_ASSERT_EQUAL_FATAL(mg_test_njobs, 1);
    mg_test_job_back(mg_xfer_req_stopped(&r[4].x));
    CU_ASSERT_EQUAL(r[4].err, MG_ERR_CANCELLED);
    CU_ASSERT_TRUE(mg_batch_is_over(b));
    CU_ASSERT_EQUAL(b->counts.done, 1u);
    CU_ASSERT_EQUAL(b->counts.failed, 4u);
    CU_ASSERT_EQUAL(seg_refs(), 0u);
    mg_batch_stop(b, MG_ERR_TIMEOUT, "late"); /* over: a timeout after the end changes nothing */
    CU_ASSERT_EQUAL(r[2].err, MG_ERR_CANCELLED);
    mg_xfer_line_del(&line);
    mg_xfer_sched_del(sched);
    close_set(s);
}

/* A notification is due when its peer's last WRITE of the batch ended; one to a peer with no
 * WRITE at once; a failed WRITE is named. */
static void test_notes_after_writes(void)
{
    mg_batches *s = open_set(16, 1000);
    struct mg_xfer_peer *p = (void *)&dir[0], *q = (void *)&dir[1]; /* two peers' entries */
    mg_batch *b = batch(s, "t1", 3, 2, 1);
    b->reqs[0].peer = b->reqs[1].peer = p;
    b->reqs[2].peer = q;
    b->reqs[2].write = 0; /* a READ from q: nothing for q's notification to wait for */
    b->notes[0].peer = p;
    b->notes[0].g.reqs_left = 2;
    b->notes[1].peer = q;
    enter(s, b);
    mg_batch_notes_start(b);
    CU_ASSERT_EQUAL_FATAL(n_due, 1);
    CU_ASSERT_PTR_EQUAL(due[0], &b->notes[1]);
    mg_batch_note_end(due[0], MG_NOTE_SENT, 0, NULL);
    mg_req_start(&b->reqs[0].life);
    mg_batch_req_end(&b->reqs[0], 0, NULL);
    CU_ASSERT_EQUAL(n_due, 1); /* one WRITE to p still runs */
    mg_batch_req_end(&b->reqs[1], MG_ERR_UNAVAILABLE, "peer gone");
    CU_ASSERT_EQUAL_FATAL(n_due, 2);
    CU_ASSERT_PTR_EQUAL(due[1], &b->notes[0]);
    CU_ASSERT_EQUAL(b->notes[0].g.failed_req, 2u); /* request 1, counted from 1 */
    mg_batch_note_end(due[1], MG_NOTE_FAILED, 9, "not sent: request 1 to this peer failed");
    CU_ASSERT_FALSE(mg_batch_is_over(b)); /* the READ runs */
    mg_batch_req_end(&b->reqs[2], MG_ERR_CANCELLED, NULL);
    CU_ASSERT_TRUE(mg_batch_is_over(b));
    CU_ASSERT_EQUAL(b->counts.notes_failed, 1u);
    CU_ASSERT_STRING_EQUAL(b->notes[0].msg, "not sent: request 1 to this peer failed");
    close_set(s);
}

/* Ends every request of b (one run and done, the others failed) at end_ms. */
static void finish(mg_batch *b, uint64_t end_ms)
{
    clock_ms = end_ms;
    mg_req_start(&b->reqs[0].life);
    mg_batch_req_end(&b->reqs[0], 0, NULL);
    for (size_t i = 1; i < b->n; i++)
        mg_batch_req_end(&b->reqs[i], MG_ERR_CANCELLED, NULL);
    CU_ASSERT_EQUAL(b->end_ms, end_ms);
}

/* --max-batches forgets the oldest over batches first and never a running one;
 * --batch-retention forgets over batches that long after their end. */
static void test_forgetting(void)
{
    mg_batches *s = open_set(2, 1000);
    mg_batch *old = enter(s, batch(s, "t1", 1, 0, 0));
    mg_batch *running = enter(s, batch(s, "t1", 2, 0, 0));
    mg_batch *over, *c;
    uint64_t id_old = old->id, id_over;
    finish(old, 100);
    over = enter(s, batch(s, "t1", 1, 0, 0)); /* three: the oldest over one goes */
    id_over = over->id;
    CU_ASSERT_PTR_NULL(mg_batches_find(s, id_old));
    CU_ASSERT_EQUAL(n_freed, 1);
    CU_ASSERT_EQUAL(mg_batches_count(s), 2u);
    finish(over, 5000);
    c = enter(s, batch(s, "t1", 1, 0, 0)); /* `over` goes; `running` stays, though older */
    CU_ASSERT_PTR_NULL(mg_batches_find(s, id_over));
    CU_ASSERT_PTR_EQUAL(mg_batches_find(s, running->id), running);
    c = enter(s, batch(s, "t1", 1, 0, 0)); /* all run: kept, over the limit */
    CU_ASSERT_EQUAL(mg_batches_count(s), 3u);
    finish(c, 5000);
    mg_batches_expire(s, 5999); /* not yet */
    CU_ASSERT_EQUAL(mg_batches_count(s), 3u);
    mg_batches_expire(s, 6000); /* c went 1000 ms after its end; running ones never */
    CU_ASSERT_EQUAL(mg_batches_count(s), 2u);
    CU_ASSERT_PTR_NOT_NULL(mg_batches_find(s, running->id));
    CU_ASSERT_EQUAL(seg_refs(), 3u);             /* held by the two running batches' requests */
    mg_batches_stop_running(s, MG_ERR_SHUTDOWN); /* nothing runs: no word is set */
    CU_ASSERT_EQUAL(mg_xfer_req_stopped(&running->reqs[0].x), 0);
    close_set(s); /* frees the running ones too, their memory let go */
    CU_ASSERT_EQUAL(n_freed, 5);
}

/* Each request is checked and its memory resolved before anything moves; a refusal names what
 * is wrong, and whatever the batch held goes back with it. */
static void test_fill(void)
{
    mg_batches *s = open_set(16, 1000);
    mg_batch *b = mg_batch_new(s, "t1", 4, 0);
    uint64_t id, last = 0;
    mg_segment_info info;
    mg_batch_item ok = {.write = 1,
                        .local_offset = 4096,
                        .peer = "10.0.0.2:7443",
                        .remote_segment = 9,
                        .length = 4096};
    mg_batch_item t;
    static const struct {
        const char *field;
        uint64_t value;
        const char *why;
    } bad[] = {
        {"length", 0, "length must be greater than 0"},
        {"remote_offset", UINT64_MAX - 100, "remote offset + length overflows"},
        {"local_lease", 5, "name the local memory: local_segment or local_lease, one of them"},
        {"remote_lease", 5, "name the remote target: remote_segment or remote_lease, one of them"},
        {"local_segment", 12345, "no such local segment"},
        {"local_offset", (1 << 20) - 100, "local offset + length is outside the local segment"},
    };
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    mg_segment_get_info(reg, seg, &info);
    ok.local_segment = id = info.id;
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        t = ok;
        if (!strcmp(bad[k].field, "length"))
            t.length = bad[k].value;
        else if (!strcmp(bad[k].field, "remote_offset"))
            t.remote_offset = bad[k].value;
        else if (!strcmp(bad[k].field, "local_lease"))
            t.local_lease = bad[k].value;
        else if (!strcmp(bad[k].field, "remote_lease"))
            t.remote_lease = bad[k].value;
        else if (!strcmp(bad[k].field, "local_segment"))
            t.local_segment = bad[k].value;
        else
            t.local_offset = bad[k].value;
        CU_ASSERT_STRING_EQUAL(mg_batch_fill(b, 0, &t, &last, "test"), bad[k].why);
    }
    t = ok;
    t.peer = "peer_example:7443"; /* not a DNS name (a name is looked up later, on a worker) */
    CU_ASSERT_PTR_NOT_NULL(strstr(mg_batch_fill(b, 0, &t, &last, "test"), "must be host:port"));
    mg_batch_discard(b);
    b = mg_batch_new(s, "t1", 1, 0);
    t.peer = "peer.example:7443";
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 0, &t, &last, "test"));
    mg_batch_discard(b);
    CU_ASSERT_EQUAL(seg_refs(), 0u); /* the refused local range held nothing */

    b = mg_batch_new(s, "t1", 3, 0);
    last = 0;
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 0, &ok, &last, "test"));
    CU_ASSERT_EQUAL(last, id);
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 1, &ok, &last, "test")); /* the same segment again */
    CU_ASSERT_PTR_EQUAL(b->reqs[1].local, seg);
    CU_ASSERT_PTR_EQUAL(b->reqs[1].local_addr, (uint8_t *)mg_segment_addr(seg) + 4096);
    t = ok;
    t.peer = ""; /* a copy on this daemon: the other side resolved too */
    t.remote_segment = id;
    t.remote_offset = 8192;
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 2, &t, &last, "test"));
    CU_ASSERT_TRUE(b->reqs[2].local_copy);
    CU_ASSERT_PTR_EQUAL(b->reqs[2].other_addr, (uint8_t *)mg_segment_addr(seg) + 8192);
    CU_ASSERT_EQUAL(seg_refs(), 4u);
    mg_batch_discard(b);
    CU_ASSERT_EQUAL(seg_refs(), 0u);
    /* A batch refused half-filled (blocks of one segment take their references at the end of
     * their run): what it took goes, and another holder's reference stays. */
    mg_registry_hold(reg, seg, 1);
    b = mg_batch_new(s, "t1", 4, 0);
    last = 0;
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 0, &ok, &last, "test"));
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 1, &ok, &last, "test"));
    CU_ASSERT_PTR_NULL(mg_batch_fill(b, 2, &ok, &last, "test"));
    mg_batch_discard(b);
    CU_ASSERT_EQUAL(seg_refs(), 1u);
    mg_registry_put(reg, seg);
    b = mg_batch_new(s, "t1", 1, 0);
    t.remote_offset = 1 << 20;
    CU_ASSERT_STRING_EQUAL(mg_batch_fill(b, 0, &t, &last, "test"),
                           "remote offset + length is outside the target on this daemon");
    mg_batch_discard(b);
    CU_ASSERT_EQUAL(seg_refs(), 0u);
    close_set(s);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_ids_and_lookup),      MG_TEST(test_request_ends_once),
        MG_TEST(test_stop_at_every_state), MG_TEST(test_notes_after_writes),
        MG_TEST(test_forgetting),          MG_TEST(test_fill),
    };
    return mg_test_run("transfer batches", cases, sizeof(cases) / sizeof(cases[0]));
}
