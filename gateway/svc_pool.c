/*
 * svc_pool: moongate.v1.Pool — leases of the buffer pools (moongate/pool.h).
 *
 * Pools: the default pool (--pool-bytes, for every tenant without a pool of its own) and the
 * tenant pools (--tenant-pool TENANT=BYTES,...). At start-up each pool's region is registered
 * as a segment ("pool.default", "pool.tenant.NAME": the lease area, plus the reserve for the
 * default pool, prefaulted) on a worker; the daemon turns ready only once all are. From then
 * on every lease operation is O(1) bookkeeping on the loop: acquire, renew, release, expiry
 * (a timer), and each pool's line of blocked acquires, served first come, first served
 * whenever room appears, so a large request is never starved by small ones behind it.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "mg_log.h"
#include "mg_str.h"

#include "moongate/lease_table.h"
#include "moongate/pool.h"
#include "moongate/rdma.h"
#include "moongate/segment.h"
#include "moongate/v1/pool.pb-c.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_OWNER   "moongate:pool" /* owner of the default pool's segment: no caller's */
#define MAX_POOLS    17              /* the default pool and up to 16 tenant pools */
#define LIST_DEFAULT 100
#define LIST_MAX     1000
#define TICK_MS      250

struct pool_entry;

typedef struct waiter {
    mg_call *call;
    mg_gateway *gw;
    struct pool_entry *pe;
    uint64_t size, alignment, ttl_ms;
    int remote;
    char tenant[MG_SEG_NAME_MAX + 1];
    char request_id[MG_SEG_NAME_MAX + 1];
    uint64_t t0_ns;
    struct event *timer; /* --max-wait, when the call has no deadline */
    struct waiter *prev, *next;
} waiter;

/* One pool: its region, its leases and its line of blocked acquires. */
typedef struct pool_entry {
    char name[MG_POOL_NAME_MAX + 1];  /* "default", "tenant.NAME" */
    char tenant[MG_SEG_NAME_MAX + 1]; /* whose pool ("" for the default pool) */
    char owner[MG_SEG_NAME_MAX + 1];  /* tenant owning its segment */
    uint64_t lease_bytes, reserve_bytes;
    mg_pool *pool; /* NULL until registered */
    uint64_t t0_ns;
    waiter *head, *tail;
    uint64_t nwaiters;
} pool_entry;

/* A remote-accessible lease published in the gateway's lease table (held in use meanwhile). */
typedef struct published {
    pool_entry *pe;
    mg_lease *l;
    uint64_t id;
    struct published *next;
    /* RDMA: the lease's own registration, so that the key a peer gets reaches this lease's
     * bytes only, and is dead (deregistered) before the range goes back to the pool. */
    mg_gateway *gw;
    uint8_t *addr;
    uint64_t len;
    mg_rdma_mr *mr;
    int registering; /* a worker is registering it */
    int ended;       /* let go of while registering: done when the registration is back */
} published;

struct mg_pool_svc {
    pool_entry pools[MAX_POOLS];
    published *published;
    size_t npools;
    pool_entry *fallback;      /* the default pool, or NULL without one */
    int overflow;              /* --pool-overflow register */
    uint64_t overflow_pending; /* bytes of overflow regions being registered */
    uint64_t overflow_seq;     /* names of overflow segments */
    uint64_t overflow_logged_ns, overflow_unlogged, overflow_unlogged_bytes;
    struct event *tick;
};

/* The pool a tenant's leases come from: its own, else the default pool. NULL: none. */
static pool_entry *entry_for(struct mg_pool_svc *ps, const char *tenant)
{
    for (size_t i = 0; i < ps->npools; i++) {
        if (ps->pools[i].tenant[0] && strcmp(ps->pools[i].tenant, tenant) == 0)
            return &ps->pools[i];
    }
    return ps->fallback;
}

/* ---- messages ---- */

typedef struct {
    Moongate__V1__Lease msg;
    char path[4097];
    char tenant[MG_SEG_NAME_MAX + 1];
} lease_msg;

static void lease_msg_fill(lease_msg *m, const pool_entry *pe, const mg_lease_info *in)
{
    uint64_t now = mg_now_mono_ms();
    moongate__v1__lease__init(&m->msg);
    mg_strlcpy(m->path, in->path, sizeof(m->path));
    mg_strlcpy(m->tenant, in->tenant, sizeof(m->tenant));
    m->msg.id = in->id;
    m->msg.tenant = m->tenant;
    m->msg.pool = (char *)pe->name;
    m->msg.segment_id = in->segment_id;
    m->msg.path = m->path;
    m->msg.offset = in->offset;
    m->msg.requested = in->requested;
    m->msg.reserved = in->reserved;
    m->msg.expires_in_ms = in->expires_ms > now ? in->expires_ms - now : 0;
    m->msg.remote_accessible = in->remote_accessible;
    m->msg.users = in->users;
}

static void reply_lease(mg_call *call, const pool_entry *pe, const mg_lease *l)
{
    mg_lease_info info;
    lease_msg m;
    mg_lease_get_info(pe->pool, l, &info);
    lease_msg_fill(&m, pe, &info);
    mg_call_reply(call, &m.msg.base);
}

/* ---- the line of blocked acquires ---- */

static void waiter_unlink(waiter *w)
{
    pool_entry *pe = w->pe;
    if (w->prev)
        w->prev->next = w->next;
    else
        pe->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        pe->tail = w->prev;
    pe->nwaiters--;
}

/* Every wait ends here, whether served, failed, timed out or abandoned. */
static void waiter_free(waiter *w)
{
    mg_metrics_pool_wait(w->gw, (double)(mg_now_mono_ns() - w->t0_ns) / 1e9);
    if (w->timer)
        event_free(w->timer);
    mg_call_set_data(w->call, NULL);
    mg_call_unref(w->call);
    free(w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    waiter *w = arg;
    mg_gateway *gw = w->gw;
    waiter_unlink(w);
    mg_call_finish(w->call, MG_GRPC_DEADLINE_EXCEEDED,
                   "no room for %" PRIu64 " bytes within %llu s (--max-wait)", w->size,
                   (unsigned long long)gw->cfg->max_wait);
    waiter_free(w);
}

/* Serves a pool's line from its head while there is room. */
static void publish(mg_gateway *gw, pool_entry *pe, mg_lease *l);
static void unpublished(published *p);

static int lease_reg_work(void *arg)
{
    published *p = arg;
    char why[256];
    if (mg_rdma_reg(p->gw->rdma, p->addr, p->len, 1, &p->mr, why, sizeof(why)) != 0)
        mg_warn("lease_rdma_failed", "lease=%" PRIu64 " error=\"%s\" transport=tcp", p->id, why);
    return 0;
}

static void lease_reg_done(void *arg, int result)
{
    published *p = arg;
    p->registering = 0;
    if (p->ended)
        unpublished(p);
}

static void serve_waiters(pool_entry *pe)
{
    while (pe->head) {
        waiter *w = pe->head;
        mg_lease *l;
        char err[MG_SEG_ERROR_MAX];
        int rc = mg_pool_acquire(pe->pool, w->tenant, w->size, w->alignment, w->ttl_ms,
                                 mg_now_mono_ms(), w->request_id, &l, err);
        if (rc == MG_ERR_FULL)
            return; /* the head waits; nobody overtakes it */
        waiter_unlink(w);
        if (rc == 0 || rc == MG_LEASE_RETRY) {
            if (mg_call_done(w->call)) {
                if (rc == 0)
                    mg_pool_release(pe->pool, l); /* nobody is left to use it */
            } else {
                if (w->remote && rc == 0)
                    publish(mg_call_gateway(w->call), pe, l);
                reply_lease(w->call, pe, l);
            }
        } else {
            mg_call_fail(w->call, rc, "%s", err);
        }
        waiter_free(w);
    }
}

static void acquire_cancel(mg_call *call)
{
    waiter *w = mg_call_data(call);
    pool_entry *pe;
    if (w == NULL)
        return;
    pe = w->pe;
    waiter_unlink(w);
    waiter_free(w);
    serve_waiters(pe); /* the next in line may fit where this one did not */
}

static int enqueue(mg_call *call, pool_entry *pe, const Moongate__V1__AcquireLeaseRequest *req,
                   uint64_t ttl_ms)
{
    mg_gateway *gw = mg_call_gateway(call);
    waiter *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return MG_ERR_NOMEM;
    w->call = call;
    w->gw = gw;
    w->pe = pe;
    w->size = req->size;
    w->alignment = req->alignment;
    w->ttl_ms = ttl_ms;
    w->remote = req->remote_accessible;
    mg_strlcpy(w->request_id, req->request_id, sizeof(w->request_id));
    mg_strlcpy(w->tenant, mg_call_tenant(call), sizeof(w->tenant));
    w->t0_ns = mg_now_mono_ns();
    if (mg_call_remaining_ms(call) < 0) {
        struct timeval tv = {(time_t)gw->cfg->max_wait, 0};
        w->timer = evtimer_new(gw->base, waiter_timeout, w);
        if (w->timer == NULL || evtimer_add(w->timer, &tv) != 0) {
            if (w->timer)
                event_free(w->timer);
            free(w);
            return MG_ERR_NOMEM;
        }
    }
    mg_call_ref(call);
    mg_call_set_data(call, w);
    w->prev = pe->tail;
    if (pe->tail)
        pe->tail->next = w;
    else
        pe->head = w;
    pe->tail = w;
    pe->nwaiters++;
    gw->pool_stats.waits_total++;
    return 0;
}

/* ---- overflow: a lease the pool cannot serve gets its own region (--pool-overflow register) */

#define OVERFLOW_LOG_NS (10ULL * 1000000000ULL) /* one log line per 10 s at most */

typedef struct {
    mg_gateway *gw;
    pool_entry *pe;
    mg_call *call;
    mg_segment *seg;
    uint64_t size, reserved, ttl_ms;
    int remote;
    char tenant[MG_SEG_NAME_MAX + 1];
} overflow_job;

/* Bytes of overflow leases alive, over all pools. */
static uint64_t overflow_alive(struct mg_pool_svc *ps)
{
    uint64_t n = 0;
    for (size_t i = 0; i < ps->npools; i++) {
        mg_pool_stats st;
        if (ps->pools[i].pool) {
            mg_pool_get_stats(ps->pools[i].pool, &st);
            n += st.overflow_bytes;
        }
    }
    return n;
}

/* The pool dropped an overflow lease: unregister its region (its lease's reference first). */
static void drop_overflow(void *arg, mg_segment *seg)
{
    mg_gateway *gw = arg;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    mg_segment_get_info(reg, seg, &info);
    mg_registry_put(reg, seg);
    mg_svc_memory_unregister(gw, info.tenant, info.id, "overflow lease ended");
}

static void overflow_log(mg_gateway *gw, const pool_entry *pe, uint64_t bytes)
{
    struct mg_pool_svc *ps = gw->pool;
    uint64_t now = mg_now_mono_ns();
    ps->overflow_unlogged++;
    ps->overflow_unlogged_bytes += bytes;
    if (ps->overflow_logged_ns && now - ps->overflow_logged_ns < OVERFLOW_LOG_NS)
        return;
    mg_warn("pool_overflow",
            "pool=%s leases=%llu bytes=%llu since_last_log=%llu alive_bytes=%llu "
            "reason=\"pool full; --pool-overflow register gave them their own regions\"",
            pe->name, (unsigned long long)ps->overflow_unlogged,
            (unsigned long long)ps->overflow_unlogged_bytes,
            (unsigned long long)(ps->overflow_logged_ns
                                     ? (now - ps->overflow_logged_ns) / 1000000000ULL
                                     : 0),
            (unsigned long long)overflow_alive(ps));
    ps->overflow_logged_ns = now;
    ps->overflow_unlogged = ps->overflow_unlogged_bytes = 0;
}

static void overflow_done(void *arg, mg_segment *seg, int result, const char *why)
{
    overflow_job *j = arg;
    mg_gateway *gw = j->gw;
    struct mg_pool_svc *ps = gw->pool;
    pool_entry *pe = j->pe;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    mg_segment *held;
    mg_lease *l;
    char err[MG_SEG_ERROR_MAX];
    int rc = result;

    ps->overflow_pending -= j->reserved;
    mg_strlcpy(err, why, sizeof(err));
    if (rc == 0) {
        mg_segment_get_info(reg, seg, &info);
        if (mg_call_done(j->call) || pe->pool == NULL) { /* the caller left: undo */
            mg_svc_memory_unregister(gw, j->tenant, info.id, "overflow lease's caller gone");
        } else if (mg_registry_acquire(reg, j->tenant, info.id, "an overflow lease", &held) != 0) {
            rc = MG_ERR_NOT_FOUND;
            snprintf(err, sizeof(err), "the overflow region vanished");
        } else if ((rc = mg_pool_adopt(pe->pool, j->tenant, held, j->size, j->ttl_ms,
                                       mg_now_mono_ms(), &l)) != 0) {
            mg_registry_put(reg, held);
            mg_svc_memory_unregister(gw, j->tenant, info.id, "overflow lease refused");
            if (rc == MG_ERR_FULL)
                snprintf(err, sizeof(err), "the pool holds its limit of leases (--max-leases)");
            else
                snprintf(err, sizeof(err), "%s", mg_strerror(rc));
        } else {
            if (j->remote)
                publish(gw, pe, l);
            overflow_log(gw, pe, j->reserved);
            reply_lease(j->call, pe, l);
        }
    }
    if (rc != 0 && !mg_call_done(j->call))
        mg_call_fail(j->call, rc, "the pool is full and its overflow region failed: %s", err);
    mg_call_unref(j->call);
    free(j);
}

/* Starts an overflow lease for `call`. Returns 0 (answered later) or an MG_ERR_* with err
 * saying why not (the overflow budget, or the registration refused). */
static int start_overflow(mg_call *call, pool_entry *pe,
                          const Moongate__V1__AcquireLeaseRequest *req, uint64_t ttl_ms, char *err)
{
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_pool_svc *ps = gw->pool;
    mg_registry *reg = mg_engine_registry(gw->engine);
    uint64_t reserved = (req->size + MG_POOL_GRANULE - 1) / MG_POOL_GRANULE * MG_POOL_GRANULE;
    uint64_t alive = overflow_alive(ps);
    mg_segment_spec spec;
    overflow_job *j;
    char name[MG_SEG_NAME_MAX + 1], why[MG_SEG_ERROR_MAX];
    int rc;

    if (req->size == 0 || req->alignment > MG_POOL_GRANULE ||
        alive + ps->overflow_pending + reserved > gw->cfg->pool_overflow_max_bytes) {
        size_t n = strlen(err);
        snprintf(err + n, MG_SEG_ERROR_MAX - n,
                 "; overflow: %llu of --pool-overflow-max-bytes %llu in use",
                 (unsigned long long)(alive + ps->overflow_pending),
                 (unsigned long long)gw->cfg->pool_overflow_max_bytes);
        return MG_ERR_FULL;
    }
    snprintf(name, sizeof(name), "pool.%.64s.overflow.%llu", pe->name,
             (unsigned long long)++ps->overflow_seq);
    memset(&spec, 0, sizeof(spec));
    spec.tenant = mg_call_tenant(call);
    spec.name = name;
    spec.source = MG_SEG_ANON;
    spec.size = reserved;
    spec.remote_accessible = 1;
    spec.memlock = (mg_memlock)gw->memlock;
    spec.prefault = 1;
    j = calloc(1, sizeof(*j));
    if (j == NULL)
        return MG_ERR_NOMEM;
    rc = mg_registry_reserve(reg, &spec, &j->seg, why);
    if (rc != 0) {
        size_t n = strlen(err);
        snprintf(err + n, MG_SEG_ERROR_MAX - n, "; overflow region refused: %.200s", why);
        free(j);
        return rc;
    }
    j->gw = gw;
    j->pe = pe;
    j->call = call;
    j->size = req->size;
    j->reserved = reserved;
    j->ttl_ms = ttl_ms;
    j->remote = req->remote_accessible;
    mg_strlcpy(j->tenant, mg_call_tenant(call), sizeof(j->tenant));
    mg_call_ref(call);
    rc = mg_registry_register_async(reg, gw->engine, gw->cq, j->seg, overflow_done, j);
    if (rc != 0) { /* the reservation is undone */
        mg_call_unref(call);
        free(j);
        return rc;
    }
    ps->overflow_pending += reserved;
    return 0;
}

/* ---- handlers ---- */

/* The caller's pool, or NULL after failing the call (no pool, or the daemon is draining). */
static pool_entry *pool_for(mg_call *call, int acquiring)
{
    mg_gateway *gw = mg_call_gateway(call);
    pool_entry *pe = gw->pool ? entry_for(gw->pool, mg_call_tenant(call)) : NULL;
    if (pe == NULL) {
        mg_call_fail(call, MG_ERR_BUSY,
                     "this daemon has no buffer pool for tenant %s (--pool-bytes 0, no "
                     "--tenant-pool)",
                     mg_call_tenant(call));
        return NULL;
    }
    if (pe->pool == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the buffer pool is still being registered");
        return NULL;
    }
    if (acquiring && gw->state == MG_STATE_DRAINING) {
        mg_call_fail(call, MG_ERR_SHUTDOWN, "the daemon is draining; no new leases");
        return NULL;
    }
    return pe;
}

static int ttl_of(mg_gateway *gw, uint32_t ttl_ms, uint64_t *out)
{
    *out = ttl_ms ? ttl_ms : gw->cfg->lease_ttl * 1000;
    return *out <= gw->cfg->max_lease_ttl * 1000 ? 0 : MG_ERR_INVALID;
}

static void acquire_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__AcquireLeaseRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    pool_entry *pe = pool_for(call, 1);
    mg_pool *pool;
    mg_lease *l;
    char err[MG_SEG_ERROR_MAX];
    uint64_t ttl;
    int rc;
    if (pe == NULL)
        return;
    pool = pe->pool;
    if (ttl_of(gw, req->ttl_ms, &ttl) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)",
                     req->ttl_ms, (unsigned long long)gw->cfg->max_lease_ttl);
        return;
    }
    if (req->block && pe->head) { /* others wait already: join the line behind them */
        mg_pool_count_exhausted(pool);
        rc = enqueue(call, pe, req, ttl);
        if (rc != 0)
            mg_call_fail(call, rc, "out of memory");
        return;
    }
    rc = mg_pool_acquire(pool, mg_call_tenant(call), req->size, req->alignment, ttl,
                         mg_now_mono_ms(), req->request_id, &l, err);
    if (rc == MG_ERR_INVALID && gw->pool->overflow && req->size > pe->lease_bytes)
        rc = MG_ERR_FULL; /* larger than the whole pool: only an overflow region can serve it */
    if (rc == 0 || rc == MG_LEASE_RETRY) {
        if (req->remote_accessible && rc == 0)
            publish(gw, pe, l);
        reply_lease(call, pe, l);
        return;
    }
    if (rc == MG_ERR_FULL)
        mg_pool_count_exhausted(pool);
    if (rc == MG_ERR_FULL && gw->pool->overflow) {
        int orc = start_overflow(call, pe, req, ttl, err);
        if (orc == 0)
            return;
        if (orc != MG_ERR_FULL || !req->block || req->size > pe->lease_bytes) {
            mg_call_fail(call, orc, "%s", err);
            return;
        }
    }
    if (rc == MG_ERR_FULL && req->block) {
        rc = enqueue(call, pe, req, ttl);
        if (rc == 0)
            return;
    }
    mg_call_fail(call, rc, "%s", err);
}

static void acquire_batch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__AcquireLeasesRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    pool_entry *pe = pool_for(call, 1);
    mg_pool *pool = pe ? pe->pool : NULL;
    Moongate__V1__AcquireLeasesResponse resp = MOONGATE__V1__ACQUIRE_LEASES_RESPONSE__INIT;
    mg_lease **got;
    lease_msg *msgs;
    Moongate__V1__Lease **ptrs;
    size_t n = 0;
    if (pool == NULL)
        return;
    if (req->n_items > gw->cfg->max_batch) {
        mg_call_fail(call, MG_ERR_FULL, "%zu items are more than --max-batch %llu", req->n_items,
                     (unsigned long long)gw->cfg->max_batch);
        return;
    }
    got = calloc(req->n_items + 1, sizeof(*got));
    msgs = calloc(req->n_items + 1, sizeof(*msgs));
    ptrs = calloc(req->n_items + 1, sizeof(*ptrs));
    if (got == NULL || msgs == NULL || ptrs == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        goto out;
    }
    for (; n < req->n_items; n++) {
        const Moongate__V1__AcquireLeaseRequest *it = req->items[n];
        char err[MG_SEG_ERROR_MAX];
        uint64_t ttl;
        int rc = ttl_of(gw, it->ttl_ms, &ttl);
        if (rc == 0)
            rc = mg_pool_acquire(pool, mg_call_tenant(call), it->size, it->alignment, ttl,
                                 mg_now_mono_ms(), NULL, &got[n], err);
        else
            snprintf(err, sizeof(err), "ttl_ms %u is above --max-lease-ttl", it->ttl_ms);
        if (rc != 0) { /* all or nothing: give back what this batch took */
            if (rc == MG_ERR_FULL)
                mg_pool_count_exhausted(pool);
            for (size_t k = 0; k < n; k++)
                mg_pool_release(pool, got[k]);
            mg_call_fail(call, rc, "item %zu: %s; no lease was taken", n, err);
            serve_waiters(pe);
            goto out;
        }
    }
    for (size_t k = 0; k < n; k++) { /* all taken: the remote-accessible ones go public */
        if (req->items[k]->remote_accessible)
            publish(gw, pe, got[k]);
    }
    for (size_t k = 0; k < n; k++) {
        mg_lease_info info;
        mg_lease_get_info(pool, got[k], &info);
        lease_msg_fill(&msgs[k], pe, &info);
        ptrs[k] = &msgs[k].msg;
    }
    resp.leases = ptrs;
    resp.n_leases = n;
    mg_call_reply(call, &resp.base);
out:
    free(got);
    free(msgs);
    free(ptrs);
}

/* Finds the caller's lease named by `id`, or fails the call with NOT_FOUND. */
/* ---- remote-accessible leases: published for the data plane (moongate/lease_table.h) ---- */

static void publish(mg_gateway *gw, pool_entry *pe, mg_lease *l)
{
    published *p;
    mg_lease_info li;
    int rc;
    mg_lease_set_remote(l, 1);
    if (gw->leases == NULL)
        return; /* no data plane: nobody could reach it */
    mg_lease_get_info(pe->pool, l, &li);
    p = calloc(1, sizeof(*p));
    rc = p ? mg_lease_table_put(gw->leases, li.id, li.tenant, mg_lease_addr(pe->pool, l),
                                li.requested, p)
           : MG_ERR_NOMEM;
    if (rc != 0) {
        mg_warn("lease_publish_failed", "lease=%" PRIu64 " error=\"%s\"", li.id, mg_strerror(rc));
        free(p);
        return;
    }
    mg_lease_use(l); /* its range stays the lease's while a peer may reach it */
    p->pe = pe;
    p->l = l;
    p->id = li.id;
    p->gw = gw;
    p->addr = mg_lease_addr(pe->pool, l);
    p->len = li.requested;
    p->next = gw->pool->published;
    gw->pool->published = p;
    if (gw->rdma) { /* until it is registered, peers reach it over TCP */
        p->registering = 1;
        if (mg_engine_submit(gw->engine, gw->cq, lease_reg_work, lease_reg_done, p) != 0)
            p->registering = 0;
    }
}

static void let_go(published *p)
{
    mg_lease_unuse(p->pe->pool, p->l);
    serve_waiters(p->pe); /* the lease's range may just have come back */
    free(p);
}

static int lease_dereg_work(void *arg)
{
    published *p = arg;
    mg_rdma_dereg(p->mr);
    p->mr = NULL;
    return 0;
}

static void lease_dereg_done(void *arg, int result)
{
    published *p = arg;
    if (p->mr) { /* the engine stopped first */
        mg_rdma_dereg(p->mr);
        p->mr = NULL;
    }
    let_go(p);
}

/* The lease ended and no TCP slice uses it: its RDMA key dies first, then the range goes. */
static void unpublished(published *p)
{
    if (p->registering) {
        p->ended = 1;
        return;
    }
    if (p->mr &&
        mg_engine_submit(p->gw->engine, p->gw->cq, lease_dereg_work, lease_dereg_done, p) == 0)
        return;
    lease_dereg_done(p, 0);
}

/* Withdraws the published leases that ended (released, expired), and lets go of those whose
 * last data-plane slice has finished since. */
static void sweep_published(mg_gateway *gw, int ended)
{
    void *done[64];
    size_t n;
    if (gw->leases == NULL)
        return;
    for (published **pp = &gw->pool->published; ended && *pp;) {
        published *p = *pp;
        if (!mg_lease_released(p->l)) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (mg_lease_table_withdraw(gw->leases, p->id) == p)
            unpublished(p); /* else the table gives it back once its slices end */
    }
    while ((n = mg_lease_table_collect(gw->leases, done, 64)) > 0) {
        for (size_t i = 0; i < n; i++)
            unpublished(done[i]);
    }
}

/* Lease `id` of the caller, in its pool; an admin's search covers every pool and tenant. Fails
 * the call with NOT_FOUND (another tenant's lease looks the same as none). */
static mg_lease *lease_for(mg_call *call, uint64_t id, pool_entry **pep)
{
    struct mg_pool_svc *ps = mg_call_gateway(call)->pool;
    const char *scope = mg_call_scope(call);
    mg_lease *l;
    for (size_t i = 0; ps && i < ps->npools; i++) {
        pool_entry *pe = scope ? entry_for(ps, scope) : &ps->pools[i];
        if (pe && pe->pool && mg_pool_find(pe->pool, scope, id, &l) == 0) {
            *pep = pe;
            return l;
        }
        if (scope)
            break;
    }
    mg_call_fail(call, MG_ERR_NOT_FOUND, "no lease %" PRIu64, id);
    return NULL;
}

static void release_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReleaseLeaseRequest *req = (const void *)m;
    Moongate__V1__ReleaseLeaseResponse resp = MOONGATE__V1__RELEASE_LEASE_RESPONSE__INIT;
    pool_entry *pe = pool_for(call, 0);
    mg_lease *l;
    if (pe == NULL || (l = lease_for(call, req->id, &pe)) == NULL)
        return;
    if (mg_call_admin(call)) {
        mg_lease_info li;
        mg_lease_get_info(pe->pool, l, &li);
        if (strcmp(li.tenant, mg_call_tenant(call)) != 0)
            mg_info("lease_revoked", "id=%" PRIu64 " tenant=%s by=%s", li.id, li.tenant,
                    mg_call_tenant(call));
    }
    mg_pool_release(pe->pool, l);
    mg_call_reply(call, &resp.base);
    sweep_published(mg_call_gateway(call), 1);
    serve_waiters(pe);
}

static void renew_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RenewLeaseRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    pool_entry *pe = pool_for(call, 0);
    mg_lease *l;
    uint64_t ttl;
    if (pe == NULL || (l = lease_for(call, req->id, &pe)) == NULL)
        return;
    if (ttl_of(gw, req->ttl_ms, &ttl) != 0 ||
        mg_pool_renew(pe->pool, l, ttl, mg_now_mono_ms()) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)",
                     req->ttl_ms, (unsigned long long)gw->cfg->max_lease_ttl);
        return;
    }
    reply_lease(call, pe, l);
}

static void get_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetLeaseRequest *req = (const void *)m;
    pool_entry *pe = pool_for(call, 0);
    mg_lease *l;
    if (pe == NULL || (l = lease_for(call, req->id, &pe)) == NULL)
        return;
    reply_lease(call, pe, l);
}

/* Up to `want` + 1 leases with id > after: the caller's, or for an admin every tenant's in
 * every pool (merged by id). Returns how many; pes[i] is the pool of infos[i]. */
static size_t collect_leases(mg_call *call, pool_entry *own, uint64_t after, size_t want,
                             mg_lease_info *infos, pool_entry **pes, mg_lease_info *tmp)
{
    struct mg_pool_svc *ps = mg_call_gateway(call)->pool;
    const char *scope = mg_call_scope(call);
    size_t n = 0;
    if (scope) {
        n = mg_pool_list(own->pool, scope, after, infos, want + 1);
        for (size_t i = 0; i < n; i++)
            pes[i] = own;
        return n;
    }
    for (size_t p = 0; p < ps->npools; p++) {
        pool_entry *pe = &ps->pools[p];
        size_t k, a, b, out = 0;
        if (pe->pool == NULL)
            continue;
        k = mg_pool_list(pe->pool, NULL, after, tmp, want + 1);
        /* Merge infos[0..n) with tmp[0..k) from the back, keeping the want + 1 smallest ids. */
        size_t total = n + k < want + 1 ? n + k : want + 1;
        a = n;
        b = k;
        /* Drop the largest until the merge fits, then fill from the back. */
        while (a + b > total) {
            if (b == 0 || (a > 0 && infos[a - 1].id > tmp[b - 1].id))
                a--;
            else
                b--;
        }
        for (out = total; out > 0; out--) {
            if (b == 0 || (a > 0 && infos[a - 1].id > tmp[b - 1].id)) {
                infos[out - 1] = infos[--a];
                pes[out - 1] = pes[a];
            } else {
                infos[out - 1] = tmp[--b];
                pes[out - 1] = pe;
            }
        }
        n = total;
    }
    return n;
}

static void list_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ListLeasesRequest *req = (const void *)m;
    Moongate__V1__ListLeasesResponse resp = MOONGATE__V1__LIST_LEASES_RESPONSE__INIT;
    pool_entry *pe = pool_for(call, 0);
    size_t want = req->page_size ? req->page_size : LIST_DEFAULT, n;
    uint64_t after = 0;
    mg_lease_info *infos, *tmp = NULL;
    pool_entry **pes;
    lease_msg *msgs;
    Moongate__V1__Lease **ptrs;
    char token[24];
    if (pe == NULL)
        return;
    if (mg_call_page_args(call, req->page_size, req->page_token, LIST_MAX, &after) != 0)
        return;
    infos = calloc(want + 1, sizeof(*infos));
    pes = calloc(want + 1, sizeof(*pes));
    msgs = calloc(want, sizeof(*msgs));
    ptrs = calloc(want, sizeof(*ptrs));
    if (mg_call_admin(call))
        tmp = calloc(want + 1, sizeof(*tmp));
    if (infos && pes && msgs && ptrs && (tmp || !mg_call_admin(call))) {
        n = collect_leases(call, pe, after, want, infos, pes, tmp);
        token[0] = '\0';
        if (n > want) {
            n = want;
            snprintf(token, sizeof(token), "%016" PRIx64, infos[n - 1].id);
        }
        for (size_t i = 0; i < n; i++) {
            lease_msg_fill(&msgs[i], pes[i], &infos[i]);
            ptrs[i] = &msgs[i].msg;
        }
        resp.leases = ptrs;
        resp.n_leases = n;
        resp.next_page_token = token;
        mg_call_reply(call, &resp.base);
    } else {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    }
    free(infos);
    free(pes);
    free(tmp);
    free(msgs);
    free(ptrs);
}

size_t mg_svc_pool_count(mg_gateway *gw)
{
    return gw->pool ? gw->pool->npools : 0;
}

const char *mg_svc_pool_tenant(mg_gateway *gw, size_t i)
{
    return gw->pool && i < gw->pool->npools ? gw->pool->pools[i].tenant : "";
}

int mg_svc_pool_get_stats(mg_gateway *gw, size_t i, mg_pool_stats *out, uint64_t *waiters,
                          uint64_t *segment_id, char *path, size_t pathcap, const char **name)
{
    mg_segment_info si;
    pool_entry *pe;
    memset(out, 0, sizeof(*out));
    *waiters = 0;
    *segment_id = 0;
    if (pathcap)
        path[0] = '\0';
    if (gw->pool == NULL || i >= gw->pool->npools)
        return MG_ERR_NOT_FOUND;
    pe = &gw->pool->pools[i];
    *name = pe->name;
    if (pe->pool == NULL)
        return MG_ERR_UNAVAILABLE;
    mg_pool_get_stats(pe->pool, out);
    *waiters = pe->nwaiters;
    mg_segment_get_info(mg_engine_registry(gw->engine), mg_pool_segment(pe->pool), &si);
    *segment_id = si.id;
    mg_strlcpy(path, si.path, pathcap);
    return 0;
}

static void stats_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__PoolStatsResponse resp = MOONGATE__V1__POOL_STATS_RESPONSE__INIT;
    Moongate__V1__PoolStat st[MAX_POOLS], *ptrs[MAX_POOLS];
    char paths[MAX_POOLS][4097];
    size_t n = 0;
    const char *scope = mg_call_scope(call);
    if (pool_for(call, 0) == NULL)
        return;
    for (size_t i = 0; i < mg_svc_pool_count(gw); i++) {
        mg_pool_stats ps;
        const char *name = "";
        const char *owner = gw->pool->pools[i].tenant;
        if (scope && owner[0] && strcmp(owner, scope) != 0)
            continue; /* another tenant's pool: an admin's business */
        moongate__v1__pool_stat__init(&st[n]);
        if (mg_svc_pool_get_stats(gw, i, &ps, &st[n].waiters, &st[n].segment_id, paths[n],
                                  sizeof(paths[n]), &name) != 0)
            continue;
        st[n].name = (char *)name;
        st[n].path = paths[n];
        st[n].capacity = ps.capacity;
        st[n].reserve = ps.reserve;
        st[n].in_use = ps.in_use;
        st[n].free = ps.free;
        st[n].largest_free = ps.largest_free;
        st[n].largest_lease = ps.largest_lease;
        st[n].leases = ps.leases;
        st[n].acquired_total = ps.acquired_total;
        st[n].released_total = ps.released_total;
        st[n].expired_total = ps.expired_total;
        st[n].exhausted_total = ps.exhausted_total;
        st[n].overflow_total = ps.overflow_total;
        st[n].overflow_bytes = ps.overflow_bytes;
        st[n].fragmentation = ps.free ? 1.0 - (double)ps.largest_free / (double)ps.free : 0.0;
        ptrs[n] = &st[n];
        n++;
    }
    resp.pools = ptrs;
    resp.n_pools = n;
    mg_call_reply(call, &resp.base);
}

/* ---- expiry ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    unsigned expired = 0;
    for (size_t i = 0; i < gw->pool->npools; i++) {
        pool_entry *pe = &gw->pool->pools[i];
        unsigned n = pe->pool ? mg_pool_expire(pe->pool, mg_now_mono_ms()) : 0;
        if (n > 0) {
            mg_info("leases_expired", "pool=%s count=%u", pe->name, n);
            serve_waiters(pe);
            expired += n;
        }
    }
    sweep_published(gw, expired > 0);
}

/* ---- start-up: each pool's region, registered on a worker ---- */

typedef struct {
    mg_gateway *gw;
    pool_entry *pe;
} pool_job;

static void pool_registered(void *arg, mg_segment *seg, int result, const char *why)
{
    pool_job *j = arg;
    mg_gateway *gw = j->gw;
    pool_entry *pe = j->pe;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment *held;
    mg_segment_info info;
    mg_pool_config pc = {.name = pe->name,
                         .lease_bytes = pe->lease_bytes,
                         .reserve_bytes = pe->reserve_bytes,
                         .max_leases = (uint32_t)gw->cfg->max_leases,
                         .max_tenant_leases = gw->cfg->max_tenant_leases,
                         .max_ttl_ms = gw->cfg->max_lease_ttl * 1000,
                         .drop_overflow = drop_overflow,
                         .drop_arg = gw};
    char holder[MG_SEG_HOLDER_MAX];
    int rc = result;
    char err[MG_SEG_ERROR_MAX];

    mg_strlcpy(err, why, sizeof(err));
    if (rc == 0) {
        mg_segment_get_info(reg, seg, &info);
        snprintf(holder, sizeof(holder), "the buffer pool %s", pe->name);
        rc = mg_registry_acquire(reg, pe->owner, info.id, holder, &held);
        if (rc == 0 && (rc = mg_pool_new(&pe->pool, reg, held, &pc)) != 0)
            mg_registry_put(reg, held);
        if (rc != 0)
            snprintf(err, sizeof(err), "%s", mg_strerror(rc));
    }
    free(j);
    if (rc != 0) {
        mg_error("start_failed", "pool=%s bytes=%llu error=\"%s\"", pe->name,
                 (unsigned long long)(pe->lease_bytes + pe->reserve_bytes), err);
        mg_gateway_start_done(gw, rc);
        return;
    }
    mg_info("pool_ready",
            "pool=%s tenant=%s lease_bytes=%llu reserve_bytes=%llu segment=%" PRIu64
            " locked=%d path=%s ms=%.1f",
            pe->name, pe->tenant[0] ? pe->tenant : "(any)", (unsigned long long)pe->lease_bytes,
            (unsigned long long)pe->reserve_bytes, info.id, info.locked, info.path,
            (double)(mg_now_mono_ns() - pe->t0_ns) / 1e6);
    mg_gateway_start_done(gw, 0);
}

static int start_pool(mg_gateway *gw, pool_entry *pe)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_spec spec;
    mg_segment *seg;
    pool_job *j;
    char err[MG_SEG_ERROR_MAX], name[MG_SEG_NAME_MAX + 1];
    int rc;
    if (pe->lease_bytes % MG_POOL_GRANULE) {
        mg_error("start_failed", "pool=%s reason=\"%llu bytes is not a multiple of %u\"", pe->name,
                 (unsigned long long)pe->lease_bytes, MG_POOL_GRANULE);
        return MG_ERR_INVALID;
    }
    snprintf(name, sizeof(name), "pool.%s", pe->name);
    memset(&spec, 0, sizeof(spec));
    spec.tenant = pe->owner;
    spec.provisioned = 1; /* the operator's memory, not the tenant's quota */
    spec.name = name;
    spec.source = MG_SEG_ANON;
    spec.size = pe->lease_bytes + pe->reserve_bytes;
    spec.remote_accessible = 1;
    spec.memlock = (mg_memlock)gw->memlock;
    spec.prefault = 1;
    rc = mg_registry_reserve(reg, &spec, &seg, err);
    if (rc != 0) {
        mg_error("start_failed", "pool=%s error=\"%s\"", pe->name, err);
        return rc;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        mg_registry_commit(reg, seg, MG_ERR_NOMEM);
        return MG_ERR_NOMEM;
    }
    j->gw = gw;
    j->pe = pe;
    pe->t0_ns = mg_now_mono_ns();
    rc = mg_registry_register_async(reg, gw->engine, gw->cq, seg, pool_registered, j);
    if (rc != 0) { /* the reservation is undone */
        free(j);
        return rc;
    }
    mg_gateway_hold_start(gw);
    return 0;
}

int mg_svc_pool_lease_rdma(mg_gateway *gw, uint64_t lease_id, uint64_t *addr, uint32_t *rkeys,
                           unsigned *n)
{
    for (published *p = gw->pool ? gw->pool->published : NULL; p; p = p->next) {
        if (p->id != lease_id)
            continue;
        if (p->mr == NULL || p->registering || p->ended)
            return -1;
        *addr = (uintptr_t)p->addr;
        *n = (unsigned)mg_rdma_device_count(gw->rdma);
        for (unsigned k = 0; k < *n && k < 8; k++)
            rkeys[k] = mg_rdma_mr_rkey(p->mr, (int)k);
        return 0;
    }
    return -1;
}

int mg_svc_pool_use(mg_gateway *gw, const char *tenant, uint64_t lease_id, const char *holder,
                    mg_segment **seg, uint64_t *offset, uint64_t *length, void **token)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    pool_entry *pe = gw->pool ? entry_for(gw->pool, tenant) : NULL;
    mg_lease *l;
    mg_lease_info li;
    mg_segment_info si;
    if (pe == NULL || pe->pool == NULL || mg_pool_find(pe->pool, tenant, lease_id, &l) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_get_info(pe->pool, l, &li);
    /* The pool's segment belongs to the pool's owner; an overflow region to the caller. */
    mg_segment_get_info(reg, mg_pool_segment(pe->pool), &si);
    if (mg_registry_acquire(reg, si.id == li.segment_id ? pe->owner : tenant, li.segment_id, holder,
                            seg) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_use(l);
    *offset = li.offset;
    *length = li.requested;
    *token = l;
    return 0;
}

void mg_svc_pool_unuse(mg_gateway *gw, void *token)
{
    pool_entry *pe = gw->pool && token ? entry_for(gw->pool, mg_lease_tenant(token)) : NULL;
    if (token && pe && pe->pool) {
        mg_lease_unuse(pe->pool, token);
        serve_waiters(pe); /* a lease released while in use may just have been freed */
    }
}

void mg_svc_pool_drain(mg_gateway *gw)
{
    struct mg_pool_svc *ps = gw->pool;
    if (ps == NULL)
        return;
    for (size_t i = 0; i < ps->npools; i++) {
        while (ps->pools[i].head) {
            waiter *w = ps->pools[i].head;
            waiter_unlink(w);
            mg_call_fail(w->call, MG_ERR_SHUTDOWN, "the daemon is draining; no new leases");
            waiter_free(w);
        }
    }
}

static const mg_method pool_methods[] = {
    {.path = "/moongate.v1.Pool/AcquireLease",
     .kind = MG_RPC_UNARY,
     .in = &moongate__v1__acquire_lease_request__descriptor,
     .out = &moongate__v1__lease__descriptor,
     .on_message = acquire_message,
     .on_cancel = acquire_cancel},
    MG_UNARY("/moongate.v1.Pool/AcquireLeases", &moongate__v1__acquire_leases_request__descriptor,
             &moongate__v1__acquire_leases_response__descriptor, acquire_batch_message),
    MG_UNARY("/moongate.v1.Pool/RenewLease", &moongate__v1__renew_lease_request__descriptor,
             &moongate__v1__lease__descriptor, renew_message),
    MG_UNARY("/moongate.v1.Pool/ReleaseLease", &moongate__v1__release_lease_request__descriptor,
             &moongate__v1__release_lease_response__descriptor, release_message),
    MG_UNARY("/moongate.v1.Pool/GetLease", &moongate__v1__get_lease_request__descriptor,
             &moongate__v1__lease__descriptor, get_message),
    MG_UNARY("/moongate.v1.Pool/ListLeases", &moongate__v1__list_leases_request__descriptor,
             &moongate__v1__list_leases_response__descriptor, list_message),
    MG_UNARY("/moongate.v1.Pool/PoolStats", &moongate__v1__pool_stats_request__descriptor,
             &moongate__v1__pool_stats_response__descriptor, stats_message),
};

static const mg_route pool_routes[] = {
    {"GET", "/v1/pool", 0, "/moongate.v1.Pool/PoolStats"},
    {"GET", "/v1/leases", 0, "/moongate.v1.Pool/ListLeases"},
    {"POST", "/v1/leases", 0, "/moongate.v1.Pool/AcquireLease"},
    {"GET", "/v1/leases", 1, "/moongate.v1.Pool/GetLease"},
    {"DELETE", "/v1/leases", 1, "/moongate.v1.Pool/ReleaseLease"},
};

/* Adds a pool entry. */
static pool_entry *add_entry(struct mg_pool_svc *ps, const char *name, const char *tenant,
                             const char *owner, uint64_t lease_bytes, uint64_t reserve_bytes)
{
    pool_entry *pe = &ps->pools[ps->npools++];
    snprintf(pe->name, sizeof(pe->name), "%s", name);
    snprintf(pe->tenant, sizeof(pe->tenant), "%.128s", tenant);
    snprintf(pe->owner, sizeof(pe->owner), "%.128s", owner);
    pe->lease_bytes = lease_bytes;
    pe->reserve_bytes = reserve_bytes;
    return pe;
}

int mg_svc_pool_init(mg_gateway *gw)
{
    struct timeval tv = {0, TICK_MS * 1000};
    mg_tenant_pool tp[MAX_POOLS - 1];
    char err[256];
    int ntp, rc;
    for (size_t i = 0; i < sizeof(pool_methods) / sizeof(pool_methods[0]); i++) {
        if ((rc = mg_gateway_add_method(gw, &pool_methods[i])) != 0)
            return rc;
    }
    for (size_t i = 0; i < sizeof(pool_routes) / sizeof(pool_routes[0]); i++) {
        if ((rc = mg_gateway_add_route(gw, &pool_routes[i])) != 0)
            return rc;
    }
    ntp = mg_config_tenant_pools(gw->cfg->tenant_pool, tp, MAX_POOLS - 1, err, sizeof(err));
    if (ntp < 0) {
        mg_error("start_failed", "reason=\"--tenant-pool: %s\"", err);
        return MG_ERR_INVALID;
    }
    if ((gw->cfg->pool_bytes == 0 && ntp == 0) || mg_engine_registry(gw->engine) == NULL)
        return 0;
    gw->pool = calloc(1, sizeof(*gw->pool));
    if (gw->pool == NULL)
        return MG_ERR_NOMEM;
    gw->pool->overflow = strcmp(gw->cfg->pool_overflow, "register") == 0;
    gw->pool->tick = event_new(gw->base, -1, EV_PERSIST, tick_cb, gw);
    if (gw->pool->tick == NULL || event_add(gw->pool->tick, &tv) != 0)
        return MG_ERR_NOMEM;
    if (gw->cfg->pool_bytes)
        gw->pool->fallback = add_entry(gw->pool, "default", "", POOL_OWNER, gw->cfg->pool_bytes,
                                       gw->cfg->pool_reserve_bytes);
    for (int i = 0; i < ntp; i++) {
        char name[MG_POOL_NAME_MAX + 1];
        snprintf(name, sizeof(name), "tenant.%.56s", tp[i].tenant);
        add_entry(gw->pool, name, tp[i].tenant, tp[i].tenant, tp[i].bytes, 0);
    }
    for (size_t i = 0; i < gw->pool->npools; i++) {
        if ((rc = start_pool(gw, &gw->pool->pools[i])) != 0)
            return rc;
    }
    return 0;
}

void mg_svc_pool_free(mg_gateway *gw)
{
    struct mg_pool_svc *ps = gw->pool;
    if (ps == NULL)
        return;
    mg_svc_pool_drain(gw);
    if (ps->tick)
        event_free(ps->tick);
    while (ps->published) { /* the data plane has stopped; the leases go with their pools */
        published *p = ps->published;
        ps->published = p->next;
        if (mg_lease_table_withdraw(gw->leases, p->id) == p) {
            mg_rdma_dereg(p->mr); /* the workers have stopped: here */
            free(p);
        }
    }
    if (gw->leases) {
        void *done[64];
        size_t n;
        while ((n = mg_lease_table_collect(gw->leases, done, 64)) > 0) {
            for (size_t i = 0; i < n; i++) {
                mg_rdma_dereg(((published *)done[i])->mr);
                free(done[i]);
            }
        }
    }
    for (size_t i = 0; i < ps->npools; i++) {
        pool_entry *pe = &ps->pools[i];
        if (pe->pool) {
            unsigned n = mg_pool_revoke_all(pe->pool);
            if (n)
                mg_warn("leases_revoked", "pool=%s count=%u reason=\"daemon stopping\"", pe->name,
                        n);
            mg_pool_del(pe->pool);
        }
    }
    free(ps);
    gw->pool = NULL;
}

/* The buffer pools: capacity, use, leases, waits. */
static void pool_metrics(mg_gateway *gw, struct evbuffer *out)
{
    static const char *const kinds[] = {"capacity",     "reserve",       "in_use",  "free",
                                        "largest_free", "largest_lease", "overflow"};
    static const char *const events[] = {"acquired", "released", "expired", "exhausted",
                                         "overflow"};
    size_t n = mg_svc_pool_count(gw);
    const mg_pool_wait_stats *w = &gw->pool_stats;
    mg_pool_stats ps[17];
    uint64_t waiters[17], seg_id;
    const char *names[17];
    char path[8];
    if (n == 0)
        return;
    if (n > 17)
        n = 17;
    for (size_t i = 0; i < n; i++) {
        names[i] = "";
        mg_svc_pool_get_stats(gw, i, &ps[i], &waiters[i], &seg_id, path, sizeof(path), &names[i]);
    }
    evbuffer_add_printf(out, "# HELP moongate_pool_bytes The buffer pools' bytes, by what "
                             "they are.\n# TYPE moongate_pool_bytes gauge\n");
    for (size_t i = 0; i < n; i++) {
        const uint64_t v[] = {ps[i].capacity,      ps[i].reserve,      ps[i].in_use,
                              ps[i].free,          ps[i].largest_free, ps[i].largest_lease,
                              ps[i].overflow_bytes};
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
            evbuffer_add_printf(out, "moongate_pool_bytes{pool=\"%s\",kind=\"%s\"} %llu\n",
                                names[i], kinds[k], (unsigned long long)v[k]);
    }
    evbuffer_add_printf(out, "# HELP moongate_pool_fragmentation 1 - largest free range / free "
                             "bytes.\n# TYPE moongate_pool_fragmentation gauge\n");
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(out, "moongate_pool_fragmentation{pool=\"%s\"} %.6f\n", names[i],
                            ps[i].free ? 1.0 - (double)ps[i].largest_free / (double)ps[i].free
                                       : 0.0);
    evbuffer_add_printf(out, "# HELP moongate_pool_leases Live leases.\n"
                             "# TYPE moongate_pool_leases gauge\n");
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(out, "moongate_pool_leases{pool=\"%s\"} %llu\n", names[i],
                            (unsigned long long)ps[i].leases);
    evbuffer_add_printf(out, "# HELP moongate_pool_waiters Blocking acquires waiting in line.\n"
                             "# TYPE moongate_pool_waiters gauge\n");
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(out, "moongate_pool_waiters{pool=\"%s\"} %llu\n", names[i],
                            (unsigned long long)waiters[i]);
    evbuffer_add_printf(out, "# HELP moongate_pool_lease_events_total Lease events.\n"
                             "# TYPE moongate_pool_lease_events_total counter\n");
    for (size_t i = 0; i < n; i++) {
        const uint64_t v[] = {ps[i].acquired_total, ps[i].released_total, ps[i].expired_total,
                              ps[i].exhausted_total, ps[i].overflow_total};
        for (size_t k = 0; k < sizeof(events) / sizeof(events[0]); k++)
            evbuffer_add_printf(out,
                                "moongate_pool_lease_events_total{pool=\"%s\",event=\"%s\"} "
                                "%llu\n",
                                names[i], events[k], (unsigned long long)v[k]);
    }
    evbuffer_add_printf(out,
                        "# HELP moongate_pool_waits_total Blocking acquires that waited in "
                        "line.\n# TYPE moongate_pool_waits_total counter\n"
                        "moongate_pool_waits_total %llu\n",
                        (unsigned long long)w->waits_total);
    mg_metrics_render_seconds(out, "moongate_pool_wait_seconds",
                              "Time blocking acquires waited in line.", w->buckets, w->waited_total,
                              w->seconds_sum);
}

/* /status.json: the shared default pool and its leases; a tenant pool is its tenant's. */
static void pool_status(mg_gateway *gw, json_t *obj)
{
    json_t *pools = json_array();
    uint64_t leases = 0;
    for (size_t i = 0; pools && i < mg_svc_pool_count(gw); i++) {
        mg_pool_stats ps;
        uint64_t waiters = 0, seg = 0;
        const char *name = "";
        char path[64];
        if (mg_svc_pool_tenant(gw, i)[0] ||
            mg_svc_pool_get_stats(gw, i, &ps, &waiters, &seg, path, sizeof(path), &name) != 0)
            continue;
        leases += ps.leases;
        json_array_append_new(
            pools, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "name", name, "capacity",
                             (json_int_t)ps.capacity, "in_use", (json_int_t)ps.in_use, "free",
                             (json_int_t)ps.free, "largest_lease", (json_int_t)ps.largest_lease,
                             "leases", (json_int_t)ps.leases, "waiters", (json_int_t)waiters));
    }
    json_object_set_new(obj, "pools", pools ? pools : json_array());
    json_object_set_new(obj, "leases", json_pack("{s:I}", "live", (json_int_t)leases));
}

const mg_service mg_svc_pool = {.name = "pool",
                                .init = mg_svc_pool_init,
                                .drain = mg_svc_pool_drain,
                                .metrics = pool_metrics,
                                .status = pool_status,
                                .free = mg_svc_pool_free};
