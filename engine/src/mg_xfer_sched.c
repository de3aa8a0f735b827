/*
 * mg_xfer_sched: the transfer scheduler (see moongate/xfer.h): per-peer lines, job slots,
 * parts and groups, and a request's end when its last part comes back.
 */
#include "moongate/xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_xfer_sched {
    mg_xfer_sched_config cfg;
    mg_list lines;            /* mg_xfer_line.node */
    unsigned jobs[2];         /* running: [0] on the workers, [1] on the transport threads */
    int64_t slices_in_flight; /* the jobs' data-plane slices not answered (atomic) */
    unsigned held;            /* mg_xfer_sched_hold calls not released */
    int closing;
};

int mg_xfer_sched_new(mg_xfer_sched **out, const mg_xfer_sched_config *cfg)
{
    mg_xfer_sched *s;
    *out = NULL;
    if (cfg->workers == NULL || cfg->cq == NULL || cfg->ended == NULL)
        return MG_ERR_INVALID;
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return MG_ERR_NOMEM;
    s->cfg = *cfg;
    if (s->cfg.submit == NULL)
        s->cfg.submit = mg_engine_submit;
    if (s->cfg.max_parts > MG_XFER_MAX_PARTS)
        s->cfg.max_parts = MG_XFER_MAX_PARTS;
    mg_list_init(&s->lines);
    *out = s;
    return 0;
}

void mg_xfer_sched_del(mg_xfer_sched *s)
{
    free(s);
}

void mg_xfer_sched_close(mg_xfer_sched *s)
{
    s->closing = 1;
}

unsigned mg_xfer_sched_jobs(const mg_xfer_sched *s, int io)
{
    return s->jobs[io != 0];
}

int64_t mg_xfer_sched_slices_in_flight(const mg_xfer_sched *s)
{
    return __atomic_load_n(&s->slices_in_flight, __ATOMIC_RELAXED);
}

void mg_xfer_req_stop(mg_xfer_req *r, int err)
{
    __atomic_store_n(&r->stop, err, __ATOMIC_RELEASE);
}

int mg_xfer_req_stopped(const mg_xfer_req *r)
{
    return __atomic_load_n(&r->stop, __ATOMIC_ACQUIRE);
}

void mg_xfer_line_init(mg_xfer_sched *s, mg_xfer_line *line, int io)
{
    memset(line, 0, sizeof(*line));
    mg_list_init(&line->ready);
    pthread_mutex_init(&line->rdma_lock, NULL);
    line->io = io;
    line->s = s;
    mg_list_push_back(&s->lines, &line->node);
}

void mg_xfer_line_del(mg_xfer_line *line)
{
    if (mg_list_linked(&line->node))
        mg_list_remove(&line->node);
    pthread_mutex_destroy(&line->rdma_lock);
}

size_t mg_xfer_line_ready(const mg_xfer_line *line)
{
    size_t n = 0;
    mg_list_foreach (&line->ready, node)
        n++;
    return n;
}

uint64_t mg_xfer_req_progress(const mg_xfer_req *r)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < r->nparts; i++)
        n += __atomic_load_n(&r->parts[i].m.progress, __ATOMIC_RELAXED);
    return n;
}

void mg_xfer_req_reset(mg_xfer_req *r)
{
    for (unsigned i = 0; i < r->nparts; i++)
        __atomic_store_n(&r->parts[i].m.progress, 0, __ATOMIC_RELAXED);
}

void mg_xfer_req_free(mg_xfer_req *r)
{
    for (unsigned i = 0; i < r->nparts; i++)
        free(r->parts[i].m.msg);
    if (r->parts && r->parts != &r->one)
        free(r->parts);
    r->parts = NULL;
    r->nparts = 0;
}

/* ---- jobs ---- */

static int job_work(void *arg)
{
    mg_xfer_job_part *pt = arg;
    return mg_xfer_run(pt->r->kind, &pt->m, &pt->r->link);
}

/* A part ended with `result`: its request ends with its last part, the first failure
 * speaking for it. */
static void part_finish(mg_xfer_sched *s, mg_xfer_job_part *pt, int result)
{
    mg_xfer_req *r = pt->r;
    pt->m.rc = result;
    if (--r->parts_left > 0)
        return;
    for (unsigned i = 0; i < r->nparts; i++) {
        if (r->parts[i].m.rc != 0) {
            s->cfg.ended(s->cfg.arg, r, r->parts[i].m.rc,
                         r->parts[i].m.msg ? r->parts[i].m.msg : "");
            return;
        }
    }
    s->cfg.ended(s->cfg.arg, r, 0, "");
}

static mg_xfer_job_part *next_in_group(mg_xfer_job_part *pt)
{
    return pt->m.next ? mg_container_of(pt->m.next, mg_xfer_job_part, m) : NULL;
}

/* Each request of a group ends on its own (rc: the group's failure, or each part's own). */
static void group_finish(mg_xfer_sched *s, mg_xfer_job_part *head, int rc, const char *msg)
{
    for (mg_xfer_job_part *q = head, *next; q; q = next) {
        next = next_in_group(q);
        q->m.next = NULL;
        q->grouped = 0;
        if (msg)
            mg_xfer_part_say(&q->m, "%s", msg);
        part_finish(s, q, msg ? rc : q->m.rc);
    }
}

static void job_done(void *arg, int result)
{
    mg_xfer_job_part *pt = arg;
    mg_xfer_req *r = pt->r;
    mg_xfer_line *line = r->line;
    mg_xfer_sched *s = line->s;
    s->jobs[line->io]--;
    line->jobs--;
    if (s->cfg.job_ended)
        s->cfg.job_ended(s->cfg.arg, r);
    if (pt->grouped)
        group_finish(s, pt, 0, NULL);
    else
        part_finish(s, pt, result);
    if (!s->closing)
        mg_xfer_sched_pump(s);
}

/* Submits one job (a part, or a group's head). Returns 0 or the engine's MG_ERR_*. */
static int job_submit(mg_xfer_sched *s, mg_xfer_line *line, mg_xfer_job_part *pt)
{
    mg_engine *pool = line->io && s->cfg.io ? s->cfg.io : s->cfg.workers;
    int rc = s->cfg.submit(pool, s->cfg.cq, job_work, job_done, pt);
    if (rc != 0)
        return rc;
    if (s->cfg.job_started)
        s->cfg.job_started(s->cfg.arg, pt->r);
    s->jobs[line->io]++;
    line->jobs++;
    return 0;
}

/* ---- parts ---- */

/* Cuts r into parts (mg_xfer_plan), at most `room`. */
static void req_plan(mg_xfer_sched *s, mg_xfer_req *r, unsigned room)
{
    unsigned most = s->cfg.max_parts < room ? s->cfg.max_parts : room;
    uint64_t each;
    unsigned n = mg_xfer_plan(r->length, s->cfg.slice_bytes, most, MG_XFER_PART_MIN,
                              r->kind == MG_XFER_RDMA, &each);
    mg_xfer_req_free(r);
    r->parts = n > 1 ? calloc(n, sizeof(*r->parts)) : NULL;
    if (r->parts == NULL) {
        r->parts = &r->one;
        if (n > 1)
            mg_xfer_plan(r->length, s->cfg.slice_bytes, 1, MG_XFER_PART_MIN, 1, &each);
    }
    for (uint64_t off = 0; off < r->length; off += each) {
        mg_xfer_job_part *pt = &r->parts[r->nparts++];
        uint64_t len = r->length - off < each ? r->length - off : each;
        memset(pt, 0, sizeof(*pt));
        pt->r = r;
        pt->offset = off;
        pt->m = (mg_xfer_part){.write = r->write,
                               .local = r->local + off,
                               .length = len,
                               .other = r->other ? r->other + off : NULL,
                               .lease = r->lease,
                               .target = r->target,
                               .remote = r->remote + off,
                               .lkeys = r->lkeys,
                               .rkeys = r->rkeys,
                               .unmapped = r->unmapped};
    }
    r->parts_left = r->nparts;
}

/* The first request of the line, taken out of it. */
static mg_xfer_req *line_take(mg_xfer_line *line)
{
    mg_list_node *n = mg_list_first(&line->ready);
    mg_xfer_req *r;
    if (n == NULL)
        return NULL;
    mg_list_remove(n);
    r = mg_container_of(n, mg_xfer_req, node);
    if (r->line->s->cfg.started)
        r->line->s->cfg.started(r->line->s->cfg.arg, r);
    return r;
}

/* Whether the line's next request may join r's group, which holds `bytes` so far. */
static int groups_with(const mg_xfer_line *line, const mg_xfer_req *r, uint64_t bytes)
{
    mg_list_node *n = mg_list_first(&line->ready);
    const mg_xfer_req *q = n ? mg_container_of(n, mg_xfer_req, node) : NULL;
    return q && q->batch == r->batch && q->kind == r->kind && q->length <= MG_XFER_GROUP_BYTES &&
           q->length <= MG_XFER_GROUP_TOTAL - bytes;
}

/* r and the small requests of its batch that follow it, as one job (up to MG_XFER_GROUP_MAX
 * of them and MG_XFER_GROUP_TOTAL bytes: a job holds its slot until all of it is moved). */
static void run_group(mg_xfer_sched *s, mg_xfer_line *line, mg_xfer_req *r)
{
    mg_xfer_part **tail = &r->parts[0].m.next;
    uint64_t bytes = r->length;
    r->parts[0].grouped = 1;
    for (unsigned n = 1; n < MG_XFER_GROUP_MAX && groups_with(line, r, bytes); n++) {
        mg_xfer_req *q = line_take(line);
        bytes += q->length;
        req_plan(s, q, 1);
        q->parts[0].grouped = 1;
        *tail = &q->parts[0].m;
        tail = &q->parts[0].m.next;
    }
    if (job_submit(s, line, &r->parts[0]) != 0)
        group_finish(s, &r->parts[0], MG_ERR_FULL, "the engine's queue is full (--queue-depth)");
}

/* Takes the first request of the line to the workers: all its parts at once. */
static void req_run(mg_xfer_sched *s, mg_xfer_line *line, unsigned cap)
{
    mg_xfer_req *r = line_take(line);
    unsigned started = 0;
    req_plan(s, r, cap - line->jobs);
    if (r->nparts == 1 && r->kind != MG_XFER_COPY && r->length <= MG_XFER_GROUP_BYTES &&
        groups_with(line, r, r->length)) {
        run_group(s, line, r);
        return;
    }
    for (unsigned i = 0; i < r->nparts; i++) {
        int rc = job_submit(s, line, &r->parts[i]);
        if (rc == 0) {
            started++;
            continue;
        }
        for (unsigned k = i; k < r->nparts; k++) { /* the parts not started fail now */
            r->parts[k].m.rc = rc;
            mg_xfer_part_say(&r->parts[k].m, "the engine's queue is full (--queue-depth)");
        }
        r->parts_left = started;
        break;
    }
    if (started == 0)
        s->cfg.ended(s->cfg.arg, r, r->parts[0].m.rc, r->parts[0].m.msg ? r->parts[0].m.msg : "");
}

/* Whether the line has a request waiting and room to start it now. */
static int line_can_run(const mg_xfer_sched *s, const mg_xfer_line *line, unsigned *cap)
{
    unsigned all = line->io ? s->cfg.io_slots : s->cfg.worker_slots;
    *cap = all > 1 ? all - 1 : 1;
    return !mg_list_empty(&line->ready) && line->jobs < *cap && s->jobs[line->io] < all;
}

/* Starts ready requests while slots are free, one request (or group) at a time, each to the
 * line that was served longest ago: the line served goes to the back of the list. Peers and
 * tenants so take turns at the slots, instead of the first line taking all it may whenever
 * one frees. */
void mg_xfer_sched_pump(mg_xfer_sched *s)
{
    while (s->held == 0) {
        mg_xfer_line *pick = NULL;
        unsigned cap = 0;
        mg_list_foreach (&s->lines, node) {
            mg_xfer_line *line = mg_container_of(node, mg_xfer_line, node);
            if (line_can_run(s, line, &cap)) {
                pick = line;
                break;
            }
        }
        if (pick == NULL)
            return;
        mg_list_remove(&pick->node);
        mg_list_push_back(&s->lines, &pick->node);
        req_run(s, pick, cap);
    }
}

void mg_xfer_sched_hold(mg_xfer_sched *s)
{
    s->held++;
}

void mg_xfer_sched_release(mg_xfer_sched *s)
{
    if (s->held > 0 && --s->held == 0 && !s->closing)
        mg_xfer_sched_pump(s);
}

void mg_xfer_sched_add(mg_xfer_line *line, mg_xfer_req *r)
{
    r->line = line;
    if (r->link.stop == NULL)
        r->link.stop = &r->stop;
    if (r->link.in_flight == NULL)
        r->link.in_flight = &line->s->slices_in_flight;
    mg_list_push_back(&line->ready, &r->node);
    mg_xfer_sched_pump(line->s);
}

int mg_xfer_sched_remove(mg_xfer_req *r)
{
    if (!mg_list_linked(&r->node))
        return 0;
    mg_list_remove(&r->node);
    return 1;
}
