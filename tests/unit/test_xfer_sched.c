/*
 * Unit tests for the transfer scheduler (moongate/xfer.h) in memory, no daemon: an inline
 * worker takes the jobs the scheduler submits and the test decides when each comes back. Each
 * peer's share of the job slots, peers taking turns at them, slots apart for copies, grouping of a
 * batch's small requests (held until all joined), large requests in parts, the first failure
 * speaking for a request, a full engine queue, a request taken out of its line, and a closed
 * scheduler starting nothing more.
 */
#include "mg_test.h"
#include "moongate/xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

/* The inline worker: jobs submitted and not yet come back. */
typedef struct job {
    mg_engine *pool;
    mg_work_fn work;
    mg_done_fn done;
    void *arg;
} job;
static job jobs[64];
static int njobs, submit_rc;
static mg_engine *const WORKERS = (mg_engine *)1, *const IO = (mg_engine *)2;

/* What the scheduler told the caller, in order. */
static mg_xfer_req *ended[512];
static int ended_rc[512], nended, nstarted, njob_started, njob_ended;
static char ended_msg[512][MG_XFER_MSG_MAX];

static int inline_submit(mg_engine *pool, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg)
{
    (void)cq;
    if (submit_rc)
        return submit_rc;
    jobs[njobs++] = (job){pool, work, done, arg};
    return 0;
}

/* Job i comes back with `rc` without running (a worker that moved it, or failed). */
static void finish(int i, int rc)
{
    job j = jobs[i];
    memmove(&jobs[i], &jobs[i + 1], (size_t)(njobs - i - 1) * sizeof(jobs[0]));
    njobs--;
    j.done(j.arg, rc);
}

/* Job i runs on this thread, then comes back. */
static void run(int i)
{
    finish(i, jobs[i].work(jobs[i].arg));
}

static void on_started(void *arg, mg_xfer_req *r)
{
    (void)arg;
    (void)r;
    nstarted++;
}
static void on_job_started(void *arg, mg_xfer_req *r)
{
    (void)arg;
    (void)r;
    njob_started++;
}
static void on_job_ended(void *arg, mg_xfer_req *r)
{
    (void)arg;
    (void)r;
    njob_ended++;
}
static void on_ended(void *arg, mg_xfer_req *r, int rc, const char *msg)
{
    (void)arg;
    ended_rc[nended] = rc;
    snprintf(ended_msg[nended], sizeof(ended_msg[0]), "%s", msg);
    ended[nended++] = r;
}

static mg_xfer_sched *open_sched(unsigned workers, unsigned io, unsigned max_parts)
{
    mg_xfer_sched_config c = {.workers = WORKERS,
                              .io = IO,
                              .cq = (mg_cq *)3,
                              .worker_slots = workers,
                              .io_slots = io,
                              .max_parts = max_parts,
                              .slice_bytes = 1 * MiB,
                              .started = on_started,
                              .job_started = on_job_started,
                              .job_ended = on_job_ended,
                              .ended = on_ended,
                              .submit = inline_submit};
    mg_xfer_sched *s = NULL;
    njobs = nended = nstarted = njob_started = njob_ended = submit_rc = 0;
    CU_ASSERT_EQUAL_FATAL(mg_xfer_sched_new(&s, &c), 0);
    return s;
}

static int stop_word;
static uint8_t mem_a[8 << 20], mem_b[8 << 20];

/* A request of `length` bytes of batch `batch` (TCP unless copy). */
static void req(mg_xfer_req *r, const void *batch, uint64_t length, int copy)
{
    memset(r, 0, sizeof(*r));
    r->kind = copy ? MG_XFER_COPY : MG_XFER_TCP;
    r->batch = batch;
    r->write = 1;
    r->length = length;
    r->local = mem_a;
    r->other = copy ? mem_b : NULL;
    r->link.stop = &stop_word;
}

static int count_ended(int rc)
{
    int n = 0;
    for (int i = 0; i < nended; i++)
        n += ended_rc[i] == rc;
    return n;
}

/* Every peer gets all slots but one; one that has them all waiting cannot starve another. */
static void test_share_between_peers(void)
{
    mg_xfer_sched *s = open_sched(4, 3, 1);
    mg_xfer_line a, b;
    mg_xfer_req ra[5], rb[2];
    int batch_a, batch_b[2];
    mg_xfer_line_init(s, &a, 1);
    mg_xfer_line_init(s, &b, 1);
    for (int i = 0; i < 5; i++) {
        req(&ra[i], &batch_a, 8 * MiB, 0); /* too large to group */
        mg_xfer_sched_add(&a, &ra[i]);
    }
    CU_ASSERT_EQUAL(a.jobs, 2u); /* cap: 3 slots - 1 */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 3u);
    for (int i = 0; i < 2; i++) {
        req(&rb[i], &batch_b[i], 8 * MiB, 0);
        mg_xfer_sched_add(&b, &rb[i]);
    }
    CU_ASSERT_EQUAL(b.jobs, 1u); /* the third slot */
    CU_ASSERT_EQUAL(mg_xfer_sched_jobs(s, 1), 3u);
    CU_ASSERT_EQUAL(njobs, 3);
    for (int i = 0; i < njobs; i++)
        CU_ASSERT_PTR_EQUAL(jobs[i].pool, IO);
    finish(0, 0); /* a's first ends: its slot goes back to a, within its share */
    CU_ASSERT_EQUAL(nended, 1);
    CU_ASSERT_PTR_EQUAL(ended[0], &ra[0]);
    CU_ASSERT_EQUAL(mg_xfer_sched_jobs(s, 1), 3u);
    CU_ASSERT_EQUAL(a.jobs, 2u);
    CU_ASSERT_EQUAL(b.jobs, 1u);
    while (njobs > 0)
        finish(0, 0);
    CU_ASSERT_EQUAL(nended, 7);
    CU_ASSERT_EQUAL(count_ended(0), 7);
    CU_ASSERT_EQUAL(nstarted, 7);
    CU_ASSERT_EQUAL(njob_started, 7);
    CU_ASSERT_EQUAL(njob_ended, 7);
    mg_xfer_line_del(&a);
    mg_xfer_line_del(&b);
    mg_xfer_sched_del(s);
}

/* The line that owns job i. */
static mg_xfer_line *job_line(int i)
{
    return ((mg_xfer_job_part *)jobs[i].arg)->r->line;
}

/* More peers than slots: a freed slot goes to the line served longest ago, so that each peer
 * gets its turn (a first line that always has room must not take every slot that frees). */
static void test_turns_between_peers(void)
{
    enum { LINES = 3, EACH = 12 };
    mg_xfer_sched *s = open_sched(4, 2, 1); /* 2 transport slots: one per line at most */
    mg_xfer_line line[LINES];
    mg_xfer_req r[LINES][EACH];
    int batch[LINES], starts[LINES] = {0};
    for (int l = 0; l < LINES; l++) {
        mg_xfer_line_init(s, &line[l], 1);
        for (int i = 0; i < EACH; i++) {
            req(&r[l][i], &batch[l], 8 * MiB, 0);
            mg_xfer_sched_add(&line[l], &r[l][i]);
        }
    }
    CU_ASSERT_EQUAL_FATAL(njobs, 2);
    CU_ASSERT_PTR_EQUAL(job_line(0), &line[0]);
    CU_ASSERT_PTR_EQUAL(job_line(1), &line[1]);
    for (int k = 0; k < 24; k++) { /* the oldest job ends; one more starts */
        finish(0, 0);
        CU_ASSERT_EQUAL(njobs, 2);
        if (njobs != 2)
            break;
        for (int l = 0; l < LINES; l++)
            starts[l] += job_line(1) == &line[l];
    }
    for (int l = 0; l < LINES; l++)
        CU_ASSERT_EQUAL(starts[l], 8); /* in turn: c, a, b, c, ... */
    while (njobs > 0)
        finish(0, 0);
    CU_ASSERT_EQUAL(nended, LINES * EACH);
    for (int l = 0; l < LINES; l++)
        mg_xfer_line_del(&line[l]);
    mg_xfer_sched_del(s);
}

/* Copies take worker slots, apart from the peers' transport slots. */
static void test_copies_use_the_workers(void)
{
    mg_xfer_sched *s = open_sched(2, 8, 1);
    mg_xfer_line local;
    mg_xfer_req r[3];
    int batch;
    mg_xfer_line_init(s, &local, 0);
    memset(mem_a, 'q', 4096);
    for (int i = 0; i < 3; i++) {
        req(&r[i], &batch, 4096, 1);
        mg_xfer_sched_add(&local, &r[i]);
    }
    CU_ASSERT_EQUAL(mg_xfer_sched_jobs(s, 0), 1u); /* 2 workers: one left to registrations */
    CU_ASSERT_EQUAL(mg_xfer_sched_jobs(s, 1), 0u);
    CU_ASSERT_PTR_EQUAL(jobs[0].pool, WORKERS);
    while (njobs > 0)
        run(0); /* real copies */
    CU_ASSERT_EQUAL(count_ended(0), 3);
    CU_ASSERT_EQUAL(memcmp(mem_b, mem_a, 4096), 0);
    CU_ASSERT_EQUAL(mg_xfer_req_progress(&r[2]), 4096u);
    mg_xfer_line_del(&local);
    mg_xfer_sched_del(s);
}

/* Small requests of one batch back to back are one job; another batch's are not in it; each
 * request of the group still ends on its own. */
static void test_grouping(void)
{
    mg_xfer_sched *s = open_sched(4, 2, 1);
    mg_xfer_line a;
    mg_xfer_req r[4];
    int b1, b2;
    mg_xfer_line_init(s, &a, 1);
    for (int i = 0; i < 3; i++)
        req(&r[i], &b1, 64 * 1024, 0);
    req(&r[3], &b2, 64 * 1024, 0);
    /* Queue them all before a slot frees: hold the only slot with another batch's request. */
    {
        mg_xfer_req hold;
        int b0;
        req(&hold, &b0, 8 * MiB, 0);
        mg_xfer_sched_add(&a, &hold);
        for (int i = 0; i < 4; i++)
            mg_xfer_sched_add(&a, &r[i]);
        CU_ASSERT_EQUAL(njobs, 1);
        finish(0, 0);
    }
    CU_ASSERT_EQUAL(njobs, 1); /* r[0..2] as one job */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 1u);
    r[1].parts[0].m.rc = MG_ERR_RANGE; /* the worker says r[1]'s part was refused */
    mg_xfer_part_say(&r[1].parts[0].m, "out of range");
    finish(0, 0);
    CU_ASSERT_EQUAL_FATAL(nended, 4);
    CU_ASSERT_PTR_EQUAL(ended[1], &r[0]);
    CU_ASSERT_EQUAL(ended_rc[1], 0);
    CU_ASSERT_PTR_EQUAL(ended[2], &r[1]);
    CU_ASSERT_EQUAL(ended_rc[2], MG_ERR_RANGE);
    CU_ASSERT_STRING_EQUAL(ended_msg[2], "out of range");
    CU_ASSERT_EQUAL(ended_rc[3], 0);
    CU_ASSERT_EQUAL(njobs, 1); /* r[3], its own job */
    finish(0, 0);
    CU_ASSERT_EQUAL(nended, 5);
    for (int i = 0; i < 4; i++) /* r[1]'s part holds its message */
        mg_xfer_req_free(&r[i]);
    mg_xfer_line_del(&a);
    mg_xfer_sched_del(s);
}

/* Held while a batch's requests join: they start as one group at release, instead of the first
 * ones taking a free slot each as they come. */
static void test_hold_groups_a_batch(void)
{
    mg_xfer_sched *s = open_sched(4, 4, 1);
    mg_xfer_line a;
    mg_xfer_req r[6];
    int b1;
    mg_xfer_line_init(s, &a, 1);
    for (int i = 0; i < 6; i++)
        req(&r[i], &b1, 64 * 1024, 0);
    mg_xfer_sched_hold(s);
    mg_xfer_sched_hold(s); /* nested */
    for (int i = 0; i < 6; i++)
        mg_xfer_sched_add(&a, &r[i]);
    mg_xfer_sched_pump(s); /* a pump while held starts nothing either */
    mg_xfer_sched_release(s);
    CU_ASSERT_EQUAL(njobs, 0);
    mg_xfer_sched_release(s);
    CU_ASSERT_EQUAL_FATAL(njobs, 1); /* all six, one job */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 0u);
    finish(0, 0);
    CU_ASSERT_EQUAL(nended, 6);
    CU_ASSERT_EQUAL(count_ended(0), 6);
    mg_xfer_line_del(&a);
    mg_xfer_sched_del(s);
}

/* A group stops at MG_XFER_GROUP_MAX requests and at MG_XFER_GROUP_TOTAL bytes: a job holds
 * its slot until all of it has moved, so that a batch's turn at the slot stays bounded. */
static void test_group_limits(void)
{
    enum { N = MG_XFER_GROUP_MAX + 10 };
    static mg_xfer_req r[N], big[6];
    mg_xfer_sched *s = open_sched(4, 2, 1); /* one job at a time on the line */
    mg_xfer_line a;
    int b1, b2;
    mg_xfer_line_init(s, &a, 1);
    for (int i = 0; i < N; i++)
        req(&r[i], &b1, 4096, 0);
    for (int i = 0; i < 6; i++)
        req(&big[i], &b2, MG_XFER_GROUP_BYTES, 0);
    mg_xfer_sched_hold(s);
    for (int i = 0; i < N; i++)
        mg_xfer_sched_add(&a, &r[i]);
    for (int i = 0; i < 6; i++)
        mg_xfer_sched_add(&a, &big[i]);
    mg_xfer_sched_release(s);
    CU_ASSERT_EQUAL_FATAL(njobs, 1); /* the first MG_XFER_GROUP_MAX */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 10u + 6u);
    finish(0, 0);
    CU_ASSERT_EQUAL(nended, MG_XFER_GROUP_MAX);
    CU_ASSERT_EQUAL_FATAL(njobs, 1); /* the other ten: the next batch's are not in it */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 6u);
    finish(0, 0);
    CU_ASSERT_EQUAL_FATAL(njobs, 1); /* four of 4 MiB: MG_XFER_GROUP_TOTAL */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 2u);
    finish(0, 0);
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 0u);
    finish(0, 0);
    CU_ASSERT_EQUAL(nended, N + 6);
    CU_ASSERT_EQUAL(count_ended(0), N + 6);
    mg_xfer_line_del(&a);
    mg_xfer_sched_del(s);
}

/* A large request runs as parts at once; it ends with its last, the first failure speaking. */
static void test_parts_and_first_failure(void)
{
    mg_xfer_sched *s = open_sched(4, 8, 4);
    mg_xfer_line a;
    mg_xfer_req r;
    int batch;
    uint8_t *big = malloc(64 * MiB); /* never touched: the worker is the test */
    CU_ASSERT_PTR_NOT_NULL_FATAL(big);
    mg_xfer_line_init(s, &a, 1);
    req(&r, &batch, 64 * MiB, 0);
    r.local = big;
    mg_xfer_sched_add(&a, &r);
    CU_ASSERT_EQUAL(r.nparts, 4u);
    CU_ASSERT_EQUAL(njobs, 4);
    CU_ASSERT_PTR_EQUAL(r.parts[3].m.local, big + 48 * MiB);
    CU_ASSERT_EQUAL(r.parts[3].m.remote, 48 * MiB);
    mg_xfer_part_say(&r.parts[2].m, "third");
    mg_xfer_part_say(&r.parts[1].m, "second");
    finish(2, MG_ERR_UNAVAILABLE); /* the third part ends first */
    finish(0, 0);
    finish(0, MG_ERR_TIMEOUT); /* the second */
    CU_ASSERT_EQUAL(nended, 0);
    finish(0, 0);
    CU_ASSERT_EQUAL_FATAL(nended, 1);
    CU_ASSERT_EQUAL(ended_rc[0], MG_ERR_TIMEOUT); /* by index, not by time */
    CU_ASSERT_STRING_EQUAL(ended_msg[0], "second");
    mg_xfer_req_free(&r);
    free(big);
    mg_xfer_line_del(&a);
    mg_xfer_sched_del(s);
}

/* A full engine queue fails the request at once; a request taken out of its line never runs; a
 * closed scheduler starts nothing when jobs come back. */
static void test_full_remove_close(void)
{
    mg_xfer_sched *s = open_sched(4, 2, 1);
    mg_xfer_line a;
    mg_xfer_req r[3];
    int batch[3];
    mg_xfer_line_init(s, &a, 1);
    submit_rc = MG_ERR_FULL;
    req(&r[0], &batch[0], 8 * MiB, 0);
    mg_xfer_sched_add(&a, &r[0]);
    CU_ASSERT_EQUAL_FATAL(nended, 1);
    CU_ASSERT_EQUAL(ended_rc[0], MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ended_msg[0], "--queue-depth"));
    CU_ASSERT_EQUAL(a.jobs, 0u);
    mg_xfer_req_free(&r[0]); /* its part says why */
    submit_rc = 0;
    for (int i = 1; i < 3; i++) {
        req(&r[i], &batch[i], 8 * MiB, 0);
        mg_xfer_sched_add(&a, &r[i]);
    }
    CU_ASSERT_EQUAL(njobs, 1);
    CU_ASSERT_EQUAL(mg_xfer_sched_remove(&r[2]), 1);
    CU_ASSERT_EQUAL(mg_xfer_sched_remove(&r[2]), 0);
    CU_ASSERT_EQUAL(mg_xfer_sched_remove(&r[1]), 0); /* running: not in the line */
    req(&r[2], &batch[2], 8 * MiB, 0);
    mg_xfer_sched_add(&a, &r[2]); /* back in line behind the running one */
    mg_xfer_sched_close(s);
    finish(0, 0);
    CU_ASSERT_EQUAL(nended, 2);
    CU_ASSERT_EQUAL(njobs, 0); /* closed: r[2] stays in line */
    CU_ASSERT_EQUAL(mg_xfer_line_ready(&a), 1u);
    mg_xfer_sched_remove(&r[2]);
    mg_xfer_line_del(&a);
    mg_xfer_sched_del(s);
}

/* A stop word set before a copy runs ends it with that code, having moved nothing. */
static void test_stop_word(void)
{
    mg_xfer_sched *s = open_sched(4, 2, 1);
    mg_xfer_line local;
    mg_xfer_req r;
    int batch;
    mg_xfer_line_init(s, &local, 0);
    req(&r, &batch, 1 * MiB, 1);
    mg_xfer_sched_add(&local, &r);
    __atomic_store_n(&stop_word, MG_ERR_CANCELLED, __ATOMIC_RELEASE);
    run(0);
    stop_word = 0;
    CU_ASSERT_EQUAL_FATAL(nended, 1);
    CU_ASSERT_EQUAL(ended_rc[0], MG_ERR_CANCELLED);
    CU_ASSERT_PTR_NOT_NULL(strstr(ended_msg[0], "stopped"));
    CU_ASSERT_EQUAL(mg_xfer_req_progress(&r), 0u);
    mg_xfer_req_free(&r);
    mg_xfer_line_del(&local);
    mg_xfer_sched_del(s);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_share_between_peers),
        MG_TEST(test_turns_between_peers),
        MG_TEST(test_copies_use_the_workers),
        MG_TEST(test_grouping),
        MG_TEST(test_hold_groups_a_batch),
        MG_TEST(test_group_limits),
        MG_TEST(test_parts_and_first_failure),
        MG_TEST(test_full_remove_close),
        MG_TEST(test_stop_word),
    };
    return mg_test_run("xfer_sched", cases, sizeof(cases) / sizeof(cases[0]));
}
