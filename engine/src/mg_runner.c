/* mg_runner: a batch from its checks to its start; regions refused and digests on the way
 * back (moongate/runner.h). */
#include "moongate/runner.h"

#include "mg_grpc.h"
#include "mg_time.h"
#include "moongate/mg_error.h"
#include "moongate/segment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the front answers carries one of these first: which kind of ask it answers. */
typedef enum { JOB_AGENT, JOB_TARGET, JOB_RELOOKUP } job_kind;

/* A batch being prepared: its agents asked for, then its targets. */
typedef struct prep {
    mg_runner *xr;
    mg_batch *b;
    void *ctx;
    size_t pending;        /* asks not answered (plus one while they are being made) */
    mg_xfer_refusal no;    /* the first ask that failed (no.grpc set) */
    mg_batch_target *keys; /* the targets asked for, and what their peers said */
    size_t nkeys;
    struct prep *next;
} prep;

/* One ask of a batch being prepared: an agent on peer p, or target k. */
typedef struct ask_job {
    job_kind kind;
    prep *pr;
    mg_xfer_peer *p;
    mg_batch_target *k;
} ask_job;

/* The requests of batches whose agent's region the peer refused, waiting (mg_batch_req.wait)
 * for one DescribeAgent per peer and agent. */
typedef struct relookup {
    job_kind kind;
    mg_runner *xr;
    mg_xfer_peer *p;
    mg_agent_ref ref;
    mg_list waiting;
    struct relookup *next;
} relookup;

typedef struct verify {
    mg_runner *xr;
    mg_batch_req *r;
    uint32_t local; /* the CRC32C of the local range */
    int rc;
    char why[160];
} verify;

struct mg_runner {
    mg_runner_config cfg;
    prep *preparing;
    relookup *relookups;
};

static int closed(const mg_runner *xr)
{
    return mg_peerdir_closed(xr->cfg.dir);
}

static uint64_t now_ms(const mg_runner *xr)
{
    return xr->cfg.now_ms ? xr->cfg.now_ms() : mg_now_mono_ms();
}

/* ---- preparing ---- */

static void prep_end(prep *pr, const mg_xfer_refusal *no)
{
    mg_runner *xr = pr->xr;
    prep **pp;
    for (pp = &xr->preparing; *pp && *pp != pr; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = pr->next;
    free(pr->keys);
    xr->cfg.prepared(xr->cfg.arg, pr->ctx, pr->b, no);
    free(pr);
}

/* Ends pr refused: request i (SIZE_MAX: the batch) for err, or for the gRPC status grpc. */
static void prep_refuse(prep *pr, int err, int grpc, size_t i, const char *why)
{
    mg_xfer_refusal no = {.err = err, .grpc = grpc, .request = i};
    snprintf(no.why, sizeof(no.why), "%s", why);
    prep_end(pr, &no);
}

static void prep_stopping(prep *pr)
{
    prep_refuse(pr, 0, MG_GRPC_UNAVAILABLE, SIZE_MAX, "the daemon is stopping");
}

/* Every remote request against the descriptors (mg_batch_check_remote). Returns 0 (all may
 * run, or *fetch is to be asked), else pr ended refused. */
static int remote_pass(prep *pr, mg_batch_target **fetch, size_t *nfetch)
{
    char why[400];
    size_t bad = 0;
    int rc = mg_batch_check_remote(pr->b, pr->xr->cfg.descs, pr->keys, pr->nkeys, fetch, nfetch,
                                   &bad, why, sizeof(why));
    if (rc == MG_ERR_INVALID)
        prep_refuse(pr, rc, 0, bad, why);
    else if (rc)
        prep_refuse(pr, rc, 0, SIZE_MAX, mg_strerror(rc));
    return rc;
}

static void targets_end(prep *pr)
{
    if (closed(pr->xr))
        prep_stopping(pr);
    else if (remote_pass(pr, NULL, NULL) == 0)
        prep_end(pr, NULL);
}

/* The remote targets, checked; those not known are asked for first. */
static void targets_check(prep *pr)
{
    mg_runner *xr = pr->xr;
    mg_batch_target *fetch = NULL;
    size_t nfetch = 0;
    if (remote_pass(pr, &fetch, &nfetch) != 0) {
        free(fetch);
        return;
    }
    if (nfetch == 0) {
        prep_end(pr, NULL);
        return;
    }
    pr->keys = fetch;
    pr->nkeys = nfetch;
    pr->pending = nfetch + 1; /* held until every ask is made */
    for (size_t i = 0; i < nfetch; i++) {
        ask_job *j = calloc(1, sizeof(*j));
        if (j)
            *j = (ask_job){.kind = JOB_TARGET, .pr = pr, .k = &fetch[i]};
        if (j == NULL || xr->cfg.describe_target(xr->cfg.arg, fetch[i].peer, fetch[i].id,
                                                 fetch[i].is_lease, j) != 0) {
            free(j);
            pr->pending--; /* unreachable: left to the data plane */
        }
    }
    if (--pr->pending == 0)
        targets_end(pr);
}

void mg_runner_target_answered(void *job, const mg_remote_desc *d, uint64_t epoch, int status)
{
    ask_job *j = job;
    prep *pr = j->pr;
    if (!closed(pr->xr))
        mg_batch_target_answered(pr->xr->cfg.descs, j->k, d, epoch, status == MG_GRPC_NOT_FOUND,
                                 now_ms(pr->xr));
    free(j);
    if (--pr->pending == 0)
        targets_end(pr);
}

/* Every agent asked for answered: every request must resolve now. */
static void agents_end(prep *pr)
{
    char why[400];
    size_t bad = 0;
    int rc;
    if (closed(pr->xr)) {
        prep_stopping(pr);
        return;
    }
    if (pr->no.grpc) {
        prep_end(pr, &pr->no);
        return;
    }
    rc = mg_batch_resolve_agents(pr->b, pr->xr->cfg.agents, pr->xr->cfg.descs, 1, NULL, NULL, &bad,
                                 why, sizeof(why));
    if (rc)
        prep_refuse(pr, rc, 0, bad, why);
    else
        targets_check(pr);
}

/* The first ask that fails: the batch is refused with it once every ask was answered. */
static void ask_failed(prep *pr, int code, const char *peer, const char *msg)
{
    if (pr->no.grpc)
        return;
    pr->no = (mg_xfer_refusal){.grpc = code, .request = SIZE_MAX};
    snprintf(pr->no.why, sizeof(pr->no.why), "peer %.80s: %.300s; nothing was moved", peer,
             msg && *msg ? msg : "no answer");
}

static void agents_resolve(prep *pr)
{
    mg_runner *xr = pr->xr;
    mg_batch_agent_ask *ask = NULL;
    size_t nask = 0, bad = 0;
    char why[400];
    int rc;
    if (pr->b->nagents == 0) {
        targets_check(pr);
        return;
    }
    rc = mg_batch_resolve_agents(pr->b, xr->cfg.agents, xr->cfg.descs, 0, &ask, &nask, &bad, why,
                                 sizeof(why));
    if (rc != 0 || nask == 0) {
        free(ask);
        if (rc == 0)
            targets_check(pr);
        else
            prep_refuse(pr, rc, 0, rc == MG_ERR_NOMEM ? SIZE_MAX : bad,
                        rc == MG_ERR_NOMEM ? "out of memory" : why);
        return;
    }
    pr->pending = nask + 1;
    for (size_t i = 0; i < nask; i++) {
        ask_job *j = calloc(1, sizeof(*j));
        if (j)
            *j = (ask_job){.kind = JOB_AGENT, .pr = pr, .p = ask[i].peer};
        if (j == NULL) {
            ask_failed(pr, MG_GRPC_RESOURCE_EXHAUSTED, ask[i].peer->addr, "out of memory");
            pr->pending--;
        } else if (xr->cfg.describe_agent(xr->cfg.arg, ask[i].peer, ask[i].ref, j, why,
                                          sizeof(why)) != 0) {
            ask_failed(pr, MG_GRPC_UNAVAILABLE, ask[i].peer->addr, why);
            free(j);
            pr->pending--;
        }
    }
    free(ask);
    if (--pr->pending == 0)
        agents_end(pr);
}

void mg_runner_prepare(mg_runner *xr, mg_batch *b, void *ctx)
{
    prep *pr = calloc(1, sizeof(*pr));
    if (pr == NULL) {
        mg_xfer_refusal no = {.err = MG_ERR_NOMEM, .request = SIZE_MAX, .why = "out of memory"};
        xr->cfg.prepared(xr->cfg.arg, ctx, b, &no);
        return;
    }
    *pr = (prep){.xr = xr, .b = b, .ctx = ctx, .next = xr->preparing};
    xr->preparing = pr;
    agents_resolve(pr);
}

size_t mg_runner_preparing(const mg_runner *xr, const char *tenant, const char *request_id)
{
    size_t n = 0;
    for (const prep *pr = xr->preparing; pr; pr = pr->next)
        n += !strcmp(pr->b->tenant, tenant) &&
             (request_id == NULL || !strcmp(pr->b->request_id, request_id));
    return n;
}

/* ---- starting ---- */

void mg_runner_start(mg_runner *xr, mg_batch *b)
{
    mg_xfer_sched *s = mg_peerdir_sched(xr->cfg.dir);
    mg_notelines_enter(xr->cfg.lines, b);
    mg_xfer_sched_hold(s); /* every request joins its line, then they start, small ones grouped */
    for (size_t i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        if (r->peer == NULL)
            mg_batch_req_end(r, MG_ERR_FULL, "this daemon already knows its limit of 1024 peers");
        else
            mg_peerdir_start(r, now_ms(xr));
    }
    mg_xfer_sched_release(s);
    mg_batch_notes_start(b); /* those with no WRITE to wait for */
}

/* ---- a region refused while a batch runs: where is that address now? ---- */

/* Starts r again at where its address is now, or ends it saying why not. */
static void restart(relookup *lk, mg_batch_req *r, int code, const char *msg)
{
    mg_runner *xr = lk->xr;
    char why[400], both[600];
    uint64_t size;
    int rc = code ? MG_ERR_NOT_FOUND : 0;
    if (rc == 0)
        rc = mg_agent_cache_resolve(
            xr->cfg.agents, lk->p->key, mg_peer_cache_epoch_of(xr->cfg.descs, lk->p->key), &lk->ref,
            r->remote_address, r->length, &r->remote_segment, &r->remote_offset, why, sizeof(why));
    else
        snprintf(why, sizeof(why), "%.380s", msg && *msg ? msg : "no answer");
    if (rc == MG_ERR_NOT_FOUND && code == 0)
        snprintf(why, sizeof(why), "it has no such agent now");
    if (rc == 0)
        rc = mg_peer_cache_check(xr->cfg.descs, lk->p->key, lk->p->addr, r->remote_segment, 0,
                                 r->remote_offset, r->length, &size, why, sizeof(why));
    if (rc == 0) {
        mg_batch_req_say(r, NULL);
        mg_peerdir_start(r, now_ms(xr));
        return;
    }
    snprintf(both, sizeof(both),
             "peer %.80s: its region at 0x%llx was refused, and asked again: %.380s", lk->p->addr,
             (unsigned long long)r->remote_address, why);
    mg_batch_req_end(r, rc == MG_ERR_RANGE ? MG_ERR_RANGE : MG_ERR_NOT_FOUND, both);
}

static void relookup_answered(relookup *lk, int code, const char *msg)
{
    relookup **pp;
    for (pp = &lk->xr->relookups; *pp && *pp != lk; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = lk->next;
    while (!closed(lk->xr) && !mg_list_empty(&lk->waiting)) {
        mg_batch_req *r = mg_container_of(mg_list_first(&lk->waiting), mg_batch_req, wait);
        mg_list_remove(&r->wait);
        restart(lk, r, code, msg);
    }
    free(lk);
}

/* The peer directory's agent_stale: r's region was refused; asks where its address is now. */
static void agent_stale(void *arg, mg_batch_req *r)
{
    mg_runner *xr = arg;
    const mg_agent_ref *ref = r->b->agents[r->agent - 1];
    relookup *lk;
    char why[300];
    for (lk = xr->relookups; lk; lk = lk->next) { /* being asked already */
        if (lk->p == r->peer && !strcmp(lk->ref.name, ref->name) && lk->ref.port == ref->port) {
            mg_list_push_back(&lk->waiting, &r->wait);
            return;
        }
    }
    mg_agent_cache_forget(xr->cfg.agents, r->peer->key, ref);
    if ((lk = calloc(1, sizeof(*lk))) == NULL) {
        mg_batch_req_end(r, MG_ERR_NOMEM, "out of memory");
        return;
    }
    *lk = (relookup){.kind = JOB_RELOOKUP, .xr = xr, .p = r->peer, .ref = *ref};
    mg_list_init(&lk->waiting);
    mg_list_push_back(&lk->waiting, &r->wait);
    if (xr->cfg.describe_agent(xr->cfg.arg, r->peer, ref, lk, why, sizeof(why)) != 0) {
        mg_list_remove(&r->wait);
        free(lk);
        mg_batch_req_end(r, MG_ERR_NOT_FOUND, r->msg ? r->msg : "its region was refused");
        return;
    }
    lk->next = xr->relookups;
    xr->relookups = lk;
}

void mg_runner_agent_answered(void *job, int code, const char *msg)
{
    ask_job *j = job;
    prep *pr;
    if (j->kind == JOB_RELOOKUP) {
        relookup_answered(job, code, msg);
        return;
    }
    pr = j->pr;
    if (code)
        ask_failed(pr, code, j->p->addr, msg);
    free(j);
    if (--pr->pending == 0)
        agents_end(pr);
}

/* ---- digests checked ---- */

/* Ends v's request (err 0: DONE), unless it was stopped meanwhile: then as its stop word says. */
static void verify_end(verify *v, int err, const char *msg)
{
    mg_batch_req *r = v->r;
    int stopped = mg_xfer_req_stopped(&r->x);
    free(v);
    if (stopped)
        mg_batch_req_end(r, stopped,
                         stopped == MG_ERR_CANCELLED ? "stopped (cancelled)" : "stopped");
    else
        mg_batch_req_end(r, err, msg);
}

void mg_runner_checksum_answered(void *job, int status, const char *message, uint32_t crc32c)
{
    verify *v = job;
    mg_batch_req *r = v->r;
    char msg[400];
    if (closed(v->xr)) {
        free(v);
    } else if (status) {
        snprintf(msg, sizeof(msg), "digest: peer %s did not give the CRC32C of the range: %s (%s)",
                 r->peer->addr, message && *message ? message : "no answer",
                 mg_grpc_code_name(status));
        verify_end(v, MG_ERR_UNAVAILABLE, msg);
    } else if (crc32c != v->local) {
        snprintf(msg, sizeof(msg),
                 "digest: the CRC32C of the bytes that landed %s (%08x) differs from the "
                 "source's (%08x)",
                 r->write ? "on the peer" : "here", r->write ? crc32c : v->local,
                 r->write ? v->local : crc32c);
        verify_end(v, MG_ERR_DATA_LOSS, msg);
    } else {
        verify_end(v, 0, NULL);
    }
}

static int local_work(void *arg)
{
    verify *v = arg;
    v->rc = mg_segment_crc32c(v->r->local, v->r->local_addr, v->r->length, &v->local, v->why,
                              sizeof(v->why));
    return 0;
}

static void local_done(void *arg, int result)
{
    verify *v = arg;
    char err[256], msg[400];
    (void)result;
    if (closed(v->xr)) {
        free(v);
        return;
    }
    if (v->rc != 0) {
        snprintf(msg, sizeof(msg), "digest: reading the local range: %s", v->why);
        verify_end(v, v->rc, msg);
        return;
    }
    if (v->xr->cfg.checksum(v->xr->cfg.arg, v->r, v, err, sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "digest: asking peer %s: %s", v->r->peer->addr, err);
        verify_end(v, MG_ERR_UNAVAILABLE, msg);
    }
}

static void verify_op(void *arg, mg_batch_req *r)
{
    mg_runner_verify(arg, r);
}

void mg_runner_verify(mg_runner *xr, mg_batch_req *r)
{
    verify *v = calloc(1, sizeof(*v));
    int rc;
    if (v == NULL) {
        mg_batch_req_end(r, MG_ERR_NOMEM, "digest: out of memory");
        return;
    }
    *v = (verify){.xr = xr, .r = r};
    rc = (xr->cfg.submit ? xr->cfg.submit : mg_engine_submit)(xr->cfg.engine, xr->cfg.cq,
                                                              local_work, local_done, v);
    if (rc != 0) {
        free(v);
        mg_batch_req_end(r, rc, "digest: the engine's queue is full (--queue-depth)");
    }
}

/* ---- the runner ---- */

int mg_runner_new(mg_runner **out, const mg_runner_config *cfg)
{
    mg_runner *xr;
    *out = NULL;
    if (cfg->dir == NULL || cfg->agents == NULL || cfg->descs == NULL || cfg->lines == NULL ||
        cfg->describe_agent == NULL || cfg->describe_target == NULL || cfg->prepared == NULL)
        return MG_ERR_INVALID;
    if ((xr = calloc(1, sizeof(*xr))) == NULL)
        return MG_ERR_NOMEM;
    xr->cfg = *cfg;
    /* the requests the directory moves come back here: regions refused, digests over RDMA
     * (without a checksum call, batches with a digest move over TCP) */
    mg_peerdir_set_batch_ops(cfg->dir,
                             &(mg_peerdir_batch_ops){.arg = xr,
                                                     .agent_stale = agent_stale,
                                                     .verify = cfg->checksum ? verify_op : NULL});
    *out = xr;
    return 0;
}

void mg_runner_del(mg_runner *xr)
{
    if (xr == NULL)
        return;
    mg_peerdir_set_batch_ops(xr->cfg.dir, NULL);
    while (xr->preparing) {
        prep *pr = xr->preparing;
        xr->preparing = pr->next;
        mg_batch_discard(pr->b);
        if (xr->cfg.forget)
            xr->cfg.forget(xr->cfg.arg, pr->ctx);
        free(pr->keys);
        free(pr);
    }
    while (xr->relookups) { /* their requests go with their batches */
        relookup *lk = xr->relookups;
        xr->relookups = lk->next;
        free(lk);
    }
    free(xr);
}
