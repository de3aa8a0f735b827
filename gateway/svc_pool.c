/*
 * svc_pool: moongate.v1.Pool — leases of the default buffer pool (moongate/pool.h).
 *
 * At start-up the pool's region is registered as a segment ("pool.default": the lease area
 * plus the reserve, prefaulted) on a worker; the daemon turns ready only once it is. From then
 * on every lease operation is O(1) bookkeeping on the loop: acquire, renew, release, expiry
 * (a timer), and the line of blocked acquires, served first come, first served whenever room
 * appears, so a large request is never starved by small ones behind it.
 */
#include "mg_gateway.h"

#include "mg_log.h"

#include "moongate/pool.h"
#include "moongate/segment.h"
#include "moongate/v1/pool.pb-c.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENANT       "default"
#define POOL_NAME    "default"
#define LIST_DEFAULT 100
#define LIST_MAX     1000
#define TICK_MS      250

typedef struct waiter {
    mg_call *call;
    mg_gateway *gw;
    uint64_t size, alignment, ttl_ms;
    int remote;
    char request_id[MG_SEG_NAME_MAX + 1];
    uint64_t t0_ns;
    struct event *timer; /* --max-wait, when the call has no deadline */
    struct waiter *prev, *next;
} waiter;

struct mg_pool_svc {
    mg_pool *pool;
    int overflow;              /* --pool-overflow register */
    uint64_t overflow_pending; /* bytes of overflow regions being registered */
    uint64_t overflow_seq;     /* names of overflow segments */
    uint64_t overflow_logged_ns, overflow_unlogged, overflow_unlogged_bytes;
    mg_segment *seg; /* while registering */
    uint64_t t0_ns;
    waiter *head, *tail;
    uint64_t nwaiters;
    struct event *tick;
};

static uint64_t now_ms(void)
{
    return mg_now_mono_ns() / 1000000ULL;
}

/* ---- messages ---- */

typedef struct {
    Moongate__V1__Lease msg;
    char path[4097];
} lease_msg;

static void lease_msg_fill(lease_msg *m, const mg_lease_info *in)
{
    uint64_t now = now_ms();
    moongate__v1__lease__init(&m->msg);
    snprintf(m->path, sizeof(m->path), "%s", in->path);
    m->msg.id = in->id;
    m->msg.pool = (char *)POOL_NAME;
    m->msg.segment_id = in->segment_id;
    m->msg.path = m->path;
    m->msg.offset = in->offset;
    m->msg.requested = in->requested;
    m->msg.reserved = in->reserved;
    m->msg.expires_in_ms = in->expires_ms > now ? in->expires_ms - now : 0;
    m->msg.remote_accessible = in->remote_accessible;
    m->msg.users = in->users;
}

static void reply_lease(mg_call *call, mg_pool *pool, const mg_lease *l)
{
    mg_lease_info info;
    lease_msg m;
    mg_lease_get_info(pool, l, &info);
    lease_msg_fill(&m, &info);
    mg_call_reply(call, &m.msg.base);
}

/* ---- the line of blocked acquires ---- */

static void waiter_unlink(struct mg_pool_svc *ps, waiter *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        ps->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        ps->tail = w->prev;
    ps->nwaiters--;
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
    struct mg_pool_svc *ps = gw->pool;
    waiter_unlink(ps, w);
    mg_call_finish(w->call, MG_GRPC_DEADLINE_EXCEEDED,
                   "no room for %" PRIu64 " bytes within %llu s (--max-wait)", w->size,
                   (unsigned long long)gw->cfg->max_wait);
    waiter_free(w);
}

/* Serves the line from its head while there is room. */
static void serve_waiters(mg_gateway *gw)
{
    struct mg_pool_svc *ps = gw->pool;
    while (ps->head) {
        waiter *w = ps->head;
        mg_lease *l;
        char err[MG_SEG_ERROR_MAX];
        int rc = mg_pool_acquire(ps->pool, TENANT, w->size, w->alignment, w->ttl_ms, now_ms(),
                                 w->request_id, &l, err);
        if (rc == MG_ERR_FULL)
            return; /* the head waits; nobody overtakes it */
        waiter_unlink(ps, w);
        if (rc == 0 || rc == MG_LEASE_RETRY) {
            if (mg_call_done(w->call)) {
                if (rc == 0)
                    mg_pool_release(ps->pool, l); /* nobody is left to use it */
            } else {
                if (w->remote)
                    mg_lease_set_remote(l, 1);
                reply_lease(w->call, ps->pool, l);
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
    mg_gateway *gw;
    if (w == NULL)
        return;
    gw = w->gw;
    waiter_unlink(gw->pool, w);
    waiter_free(w);
    serve_waiters(gw); /* the next in line may fit where this one did not */
}

static int enqueue(mg_call *call, const Moongate__V1__AcquireLeaseRequest *req, uint64_t ttl_ms)
{
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_pool_svc *ps = gw->pool;
    waiter *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return MG_ERR_NOMEM;
    w->call = call;
    w->gw = gw;
    w->size = req->size;
    w->alignment = req->alignment;
    w->ttl_ms = ttl_ms;
    w->remote = req->remote_accessible;
    snprintf(w->request_id, sizeof(w->request_id), "%s", req->request_id);
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
    w->prev = ps->tail;
    if (ps->tail)
        ps->tail->next = w;
    else
        ps->head = w;
    ps->tail = w;
    ps->nwaiters++;
    gw->pool_stats.waits_total++;
    return 0;
}

/* ---- overflow: a lease the pool cannot serve gets its own region (--pool-overflow register) */

#define OVERFLOW_LOG_NS (10ULL * 1000000000ULL) /* one log line per 10 s at most */

typedef struct {
    mg_gateway *gw;
    mg_call *call;
    mg_segment *seg;
    uint64_t size, reserved, ttl_ms;
    int remote;
} overflow_job;

/* The pool dropped an overflow lease: unregister its region (its lease's reference first). */
static void drop_overflow(void *arg, mg_segment *seg)
{
    mg_gateway *gw = arg;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    mg_segment_get_info(reg, seg, &info);
    mg_registry_put(reg, seg);
    mg_svc_memory_unregister(gw, TENANT, info.id, "overflow lease ended");
}

static void overflow_log(mg_gateway *gw, uint64_t bytes)
{
    struct mg_pool_svc *ps = gw->pool;
    uint64_t now = mg_now_mono_ns();
    mg_pool_stats st;
    ps->overflow_unlogged++;
    ps->overflow_unlogged_bytes += bytes;
    if (ps->overflow_logged_ns && now - ps->overflow_logged_ns < OVERFLOW_LOG_NS)
        return;
    mg_pool_get_stats(ps->pool, &st);
    mg_warn("pool_overflow",
            "pool=%s leases=%llu bytes=%llu since_last_log=%llu alive_bytes=%llu "
            "reason=\"pool full; --pool-overflow register gave them their own regions\"",
            POOL_NAME, (unsigned long long)ps->overflow_unlogged,
            (unsigned long long)ps->overflow_unlogged_bytes,
            (unsigned long long)(ps->overflow_logged_ns
                                     ? (now - ps->overflow_logged_ns) / 1000000000ULL
                                     : 0),
            (unsigned long long)st.overflow_bytes);
    ps->overflow_logged_ns = now;
    ps->overflow_unlogged = ps->overflow_unlogged_bytes = 0;
}

static int overflow_work(void *arg)
{
    overflow_job *j = arg;
    return mg_segment_map(j->seg);
}

static void overflow_done(void *arg, int result)
{
    overflow_job *j = arg;
    mg_gateway *gw = j->gw;
    struct mg_pool_svc *ps = gw->pool;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    mg_segment *held;
    mg_lease *l;
    char err[MG_SEG_ERROR_MAX];
    int rc = result;

    ps->overflow_pending -= j->reserved;
    snprintf(err, sizeof(err), "%s", result ? mg_segment_error(j->seg) : "");
    mg_registry_commit(reg, j->seg, result);
    if (rc == 0) {
        mg_segment_get_info(reg, j->seg, &info);
        if (mg_call_done(j->call) || ps->pool == NULL) { /* the caller left: undo */
            mg_svc_memory_unregister(gw, TENANT, info.id, "overflow lease's caller gone");
        } else if (mg_registry_acquire(reg, TENANT, info.id, "an overflow lease", &held) != 0) {
            rc = MG_ERR_NOT_FOUND;
            snprintf(err, sizeof(err), "the overflow region vanished");
        } else if ((rc = mg_pool_adopt(ps->pool, TENANT, held, j->size, j->ttl_ms, now_ms(), &l)) !=
                   0) {
            mg_registry_put(reg, held);
            mg_svc_memory_unregister(gw, TENANT, info.id, "overflow lease refused");
            snprintf(err, sizeof(err), "%s", mg_strerror(rc));
        } else {
            if (j->remote)
                mg_lease_set_remote(l, 1);
            overflow_log(gw, j->reserved);
            reply_lease(j->call, ps->pool, l);
        }
    }
    if (rc != 0 && !mg_call_done(j->call))
        mg_call_fail(j->call, rc, "the pool is full and its overflow region failed: %s", err);
    mg_call_unref(j->call);
    free(j);
}

/* Starts an overflow lease for `call`. Returns 0 (answered later) or an MG_ERR_* with err
 * saying why not (the overflow budget, or the registration refused). */
static int start_overflow(mg_call *call, const Moongate__V1__AcquireLeaseRequest *req,
                          uint64_t ttl_ms, char *err)
{
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_pool_svc *ps = gw->pool;
    mg_registry *reg = mg_engine_registry(gw->engine);
    uint64_t reserved = (req->size + MG_POOL_GRANULE - 1) / MG_POOL_GRANULE * MG_POOL_GRANULE;
    mg_pool_stats st;
    mg_segment_spec spec;
    overflow_job *j;
    char name[64], why[MG_SEG_ERROR_MAX];
    int rc;

    mg_pool_get_stats(ps->pool, &st);
    if (req->size == 0 || req->alignment > MG_POOL_GRANULE ||
        st.overflow_bytes + ps->overflow_pending + reserved > gw->cfg->pool_overflow_max_bytes) {
        size_t n = strlen(err);
        snprintf(err + n, MG_SEG_ERROR_MAX - n,
                 "; overflow: %llu of --pool-overflow-max-bytes %llu in use",
                 (unsigned long long)(st.overflow_bytes + ps->overflow_pending),
                 (unsigned long long)gw->cfg->pool_overflow_max_bytes);
        return MG_ERR_FULL;
    }
    snprintf(name, sizeof(name), "pool." POOL_NAME ".overflow.%llu",
             (unsigned long long)++ps->overflow_seq);
    memset(&spec, 0, sizeof(spec));
    spec.tenant = TENANT;
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
    j->call = call;
    j->size = req->size;
    j->reserved = reserved;
    j->ttl_ms = ttl_ms;
    j->remote = req->remote_accessible;
    mg_call_ref(call);
    rc = mg_engine_submit(gw->engine, gw->cq, overflow_work, overflow_done, j);
    if (rc != 0) {
        mg_registry_commit(reg, j->seg, rc);
        mg_call_unref(call);
        free(j);
        return rc;
    }
    ps->overflow_pending += reserved;
    return 0;
}

/* ---- handlers ---- */

/* The pool, or NULL after failing the call (no pool, or the daemon is draining). */
static mg_pool *pool_for(mg_call *call, int acquiring)
{
    mg_gateway *gw = mg_call_gateway(call);
    if (gw->pool == NULL) {
        mg_call_fail(call, MG_ERR_BUSY, "this daemon has no buffer pool (--pool-bytes 0)");
        return NULL;
    }
    if (gw->pool->pool == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the buffer pool is still being registered");
        return NULL;
    }
    if (acquiring && gw->state == MG_STATE_DRAINING) {
        mg_call_fail(call, MG_ERR_SHUTDOWN, "the daemon is draining; no new leases");
        return NULL;
    }
    return gw->pool->pool;
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
    mg_pool *pool = pool_for(call, 1);
    mg_lease *l;
    char err[MG_SEG_ERROR_MAX];
    uint64_t ttl;
    int rc;
    if (pool == NULL)
        return;
    if (ttl_of(gw, req->ttl_ms, &ttl) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)",
                     req->ttl_ms, (unsigned long long)gw->cfg->max_lease_ttl);
        return;
    }
    if (req->block && gw->pool->head) { /* others wait already: join the line behind them */
        mg_pool_count_exhausted(pool);
        rc = enqueue(call, req, ttl);
        if (rc != 0)
            mg_call_fail(call, rc, "out of memory");
        return;
    }
    rc = mg_pool_acquire(pool, TENANT, req->size, req->alignment, ttl, now_ms(), req->request_id,
                         &l, err);
    if (rc == MG_ERR_INVALID && gw->pool->overflow && req->size > gw->cfg->pool_bytes)
        rc = MG_ERR_FULL; /* larger than the whole pool: only an overflow region can serve it */
    if (rc == 0 || rc == MG_LEASE_RETRY) {
        if (req->remote_accessible)
            mg_lease_set_remote(l, 1);
        reply_lease(call, pool, l);
        return;
    }
    if (rc == MG_ERR_FULL)
        mg_pool_count_exhausted(pool);
    if (rc == MG_ERR_FULL && gw->pool->overflow) {
        int orc = start_overflow(call, req, ttl, err);
        if (orc == 0)
            return;
        if (orc != MG_ERR_FULL || !req->block || req->size > gw->cfg->pool_bytes) {
            mg_call_fail(call, orc, "%s", err);
            return;
        }
    }
    if (rc == MG_ERR_FULL && req->block) {
        rc = enqueue(call, req, ttl);
        if (rc == 0)
            return;
    }
    mg_call_fail(call, rc, "%s", err);
}

static void acquire_batch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__AcquireLeasesRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_pool *pool = pool_for(call, 1);
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
            rc = mg_pool_acquire(pool, TENANT, it->size, it->alignment, ttl, now_ms(), NULL,
                                 &got[n], err);
        else
            snprintf(err, sizeof(err), "ttl_ms %u is above --max-lease-ttl", it->ttl_ms);
        if (rc != 0) { /* all or nothing: give back what this batch took */
            if (rc == MG_ERR_FULL)
                mg_pool_count_exhausted(pool);
            for (size_t k = 0; k < n; k++)
                mg_pool_release(pool, got[k]);
            mg_call_fail(call, rc, "item %zu: %s; no lease was taken", n, err);
            serve_waiters(gw);
            goto out;
        }
        if (it->remote_accessible)
            mg_lease_set_remote(got[n], 1);
    }
    for (size_t k = 0; k < n; k++) {
        mg_lease_info info;
        mg_lease_get_info(pool, got[k], &info);
        lease_msg_fill(&msgs[k], &info);
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
static mg_lease *lease_for(mg_call *call, mg_pool *pool, uint64_t id)
{
    mg_lease *l;
    if (mg_pool_find(pool, TENANT, id, &l) != 0) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no lease %" PRIu64, id);
        return NULL;
    }
    return l;
}

static void release_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReleaseLeaseRequest *req = (const void *)m;
    Moongate__V1__ReleaseLeaseResponse resp = MOONGATE__V1__RELEASE_LEASE_RESPONSE__INIT;
    mg_pool *pool = pool_for(call, 0);
    mg_lease *l;
    if (pool == NULL || (l = lease_for(call, pool, req->id)) == NULL)
        return;
    mg_pool_release(pool, l);
    mg_call_reply(call, &resp.base);
    serve_waiters(mg_call_gateway(call));
}

static void renew_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RenewLeaseRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_pool *pool = pool_for(call, 0);
    mg_lease *l;
    uint64_t ttl;
    if (pool == NULL || (l = lease_for(call, pool, req->id)) == NULL)
        return;
    if (ttl_of(gw, req->ttl_ms, &ttl) != 0 || mg_pool_renew(pool, l, ttl, now_ms()) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)",
                     req->ttl_ms, (unsigned long long)gw->cfg->max_lease_ttl);
        return;
    }
    reply_lease(call, pool, l);
}

static void get_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetLeaseRequest *req = (const void *)m;
    mg_pool *pool = pool_for(call, 0);
    mg_lease *l;
    if (pool == NULL || (l = lease_for(call, pool, req->id)) == NULL)
        return;
    reply_lease(call, pool, l);
}

static void list_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ListLeasesRequest *req = (const void *)m;
    Moongate__V1__ListLeasesResponse resp = MOONGATE__V1__LIST_LEASES_RESPONSE__INIT;
    mg_pool *pool = pool_for(call, 0);
    size_t want = req->page_size ? req->page_size : LIST_DEFAULT, n;
    uint64_t after = 0;
    mg_lease_info *infos;
    lease_msg *msgs;
    Moongate__V1__Lease **ptrs;
    char token[24];
    if (pool == NULL)
        return;
    if (want > LIST_MAX) {
        mg_call_fail(call, MG_ERR_INVALID, "page_size %u is above %d", req->page_size, LIST_MAX);
        return;
    }
    if (req->page_token[0]) {
        char *end;
        after = strtoull(req->page_token, &end, 16);
        if (*end != '\0' || strlen(req->page_token) != 16) {
            mg_call_fail(call, MG_ERR_INVALID, "page_token \"%.32s\" is not one this daemon gave",
                         req->page_token);
            return;
        }
    }
    infos = calloc(want + 1, sizeof(*infos));
    msgs = calloc(want, sizeof(*msgs));
    ptrs = calloc(want, sizeof(*ptrs));
    if (infos && msgs && ptrs) {
        n = mg_pool_list(pool, TENANT, after, infos, want + 1);
        token[0] = '\0';
        if (n > want) {
            n = want;
            snprintf(token, sizeof(token), "%016" PRIx64, infos[n - 1].id);
        }
        for (size_t i = 0; i < n; i++) {
            lease_msg_fill(&msgs[i], &infos[i]);
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
    free(msgs);
    free(ptrs);
}

void mg_svc_pool_get_stats(mg_gateway *gw, mg_pool_stats *out, uint64_t *waiters,
                           uint64_t *segment_id, char *path, size_t pathcap)
{
    mg_segment_info si;
    memset(out, 0, sizeof(*out));
    *waiters = 0;
    *segment_id = 0;
    if (pathcap)
        path[0] = '\0';
    if (gw->pool == NULL || gw->pool->pool == NULL)
        return;
    mg_pool_get_stats(gw->pool->pool, out);
    *waiters = gw->pool->nwaiters;
    mg_segment_get_info(mg_engine_registry(gw->engine), mg_pool_segment(gw->pool->pool), &si);
    *segment_id = si.id;
    snprintf(path, pathcap, "%s", si.path);
}

static void stats_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__PoolStatsResponse resp = MOONGATE__V1__POOL_STATS_RESPONSE__INIT;
    Moongate__V1__PoolStat st = MOONGATE__V1__POOL_STAT__INIT, *one = &st;
    mg_pool_stats ps;
    char path[4097];
    if (pool_for(call, 0) == NULL)
        return;
    mg_svc_pool_get_stats(gw, &ps, &st.waiters, &st.segment_id, path, sizeof(path));
    st.name = (char *)POOL_NAME;
    st.path = path;
    st.capacity = ps.capacity;
    st.reserve = ps.reserve;
    st.in_use = ps.in_use;
    st.free = ps.free;
    st.largest_free = ps.largest_free;
    st.largest_lease = ps.largest_lease;
    st.leases = ps.leases;
    st.acquired_total = ps.acquired_total;
    st.released_total = ps.released_total;
    st.expired_total = ps.expired_total;
    st.exhausted_total = ps.exhausted_total;
    st.overflow_total = ps.overflow_total;
    st.overflow_bytes = ps.overflow_bytes;
    st.fragmentation = ps.free ? 1.0 - (double)ps.largest_free / (double)ps.free : 0.0;
    resp.pools = &one;
    resp.n_pools = 1;
    mg_call_reply(call, &resp.base);
}

/* ---- expiry ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    unsigned n;
    if (gw->pool->pool == NULL)
        return;
    n = mg_pool_expire(gw->pool->pool, now_ms());
    if (n > 0) {
        mg_info("leases_expired", "pool=%s count=%u", POOL_NAME, n);
        serve_waiters(gw);
    }
}

/* ---- start-up: the pool's region, registered on a worker ---- */

typedef struct {
    mg_gateway *gw;
    mg_segment *seg;
} pool_job;

static int pool_map_work(void *arg)
{
    pool_job *j = arg;
    return mg_segment_map(j->seg);
}

static void pool_map_done(void *arg, int result)
{
    pool_job *j = arg;
    mg_gateway *gw = j->gw;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment *held;
    mg_segment_info info;
    mg_pool_config pc = {POOL_NAME,
                         gw->cfg->pool_bytes,
                         gw->cfg->pool_reserve_bytes,
                         (uint32_t)gw->cfg->max_leases,
                         gw->cfg->max_lease_ttl * 1000,
                         drop_overflow,
                         gw};
    int rc = result;
    char err[MG_SEG_ERROR_MAX];

    snprintf(err, sizeof(err), "%s", result ? mg_segment_error(j->seg) : "");
    mg_registry_commit(reg, j->seg, result);
    if (rc == 0) {
        mg_segment_get_info(reg, j->seg, &info);
        rc = mg_registry_acquire(reg, TENANT, info.id, "the default buffer pool", &held);
        if (rc == 0 && (rc = mg_pool_new(&gw->pool->pool, reg, held, &pc)) != 0)
            mg_registry_put(reg, held);
        if (rc != 0)
            snprintf(err, sizeof(err), "%s", mg_strerror(rc));
    }
    free(j);
    gw->starting_jobs--;
    if (rc != 0) {
        mg_error("start_failed", "pool=%s bytes=%llu error=\"%s\"", POOL_NAME,
                 (unsigned long long)(gw->cfg->pool_bytes + gw->cfg->pool_reserve_bytes), err);
        gw->exit_code = 1;
        event_base_loopbreak(gw->base);
        return;
    }
    mg_info("pool_ready",
            "pool=%s lease_bytes=%llu reserve_bytes=%llu segment=%" PRIu64
            " locked=%d path=%s ms=%.1f",
            POOL_NAME, (unsigned long long)gw->cfg->pool_bytes,
            (unsigned long long)gw->cfg->pool_reserve_bytes, info.id, info.locked, info.path,
            (double)(mg_now_mono_ns() - gw->pool->t0_ns) / 1e6);
    if (gw->serve_wanted)
        mg_gateway_set_serving(gw);
}

static int start_pool(mg_gateway *gw)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_spec spec;
    pool_job *j;
    char err[MG_SEG_ERROR_MAX];
    int rc;
    if (gw->cfg->pool_bytes % MG_POOL_GRANULE) {
        mg_error("start_failed", "reason=\"--pool-bytes %llu is not a multiple of %u\"",
                 (unsigned long long)gw->cfg->pool_bytes, MG_POOL_GRANULE);
        return MG_ERR_INVALID;
    }
    memset(&spec, 0, sizeof(spec));
    spec.tenant = TENANT;
    spec.name = "pool." POOL_NAME;
    spec.source = MG_SEG_ANON;
    spec.size = gw->cfg->pool_bytes + gw->cfg->pool_reserve_bytes;
    spec.remote_accessible = 1;
    spec.memlock = (mg_memlock)gw->memlock;
    spec.prefault = 1;
    rc = mg_registry_reserve(reg, &spec, &gw->pool->seg, err);
    if (rc != 0) {
        mg_error("start_failed", "pool=%s error=\"%s\"", POOL_NAME, err);
        return rc;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        mg_registry_commit(reg, gw->pool->seg, MG_ERR_NOMEM);
        return MG_ERR_NOMEM;
    }
    j->gw = gw;
    j->seg = gw->pool->seg;
    gw->pool->t0_ns = mg_now_mono_ns();
    rc = mg_engine_submit(gw->engine, gw->cq, pool_map_work, pool_map_done, j);
    if (rc != 0) {
        mg_registry_commit(reg, j->seg, rc);
        free(j);
        return rc;
    }
    gw->starting_jobs++;
    return 0;
}

int mg_svc_pool_use(mg_gateway *gw, uint64_t lease_id, const char *holder, mg_segment **seg,
                    uint64_t *offset, uint64_t *length, void **token)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_lease *l;
    mg_lease_info li;
    if (gw->pool == NULL || gw->pool->pool == NULL ||
        mg_pool_find(gw->pool->pool, TENANT, lease_id, &l) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_get_info(gw->pool->pool, l, &li);
    if (mg_registry_acquire(reg, TENANT, li.segment_id, holder, seg) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_use(l);
    *offset = li.offset;
    *length = li.requested;
    *token = l;
    return 0;
}

void mg_svc_pool_unuse(mg_gateway *gw, void *token)
{
    if (token && gw->pool && gw->pool->pool) {
        mg_lease_unuse(gw->pool->pool, token);
        serve_waiters(gw); /* a lease released while in use may just have been freed */
    }
}

void mg_svc_pool_drain(mg_gateway *gw)
{
    struct mg_pool_svc *ps = gw->pool;
    if (ps == NULL)
        return;
    while (ps->head) {
        waiter *w = ps->head;
        waiter_unlink(ps, w);
        mg_call_fail(w->call, MG_ERR_SHUTDOWN, "the daemon is draining; no new leases");
        waiter_free(w);
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

int mg_svc_pool_init(mg_gateway *gw)
{
    struct timeval tv = {0, TICK_MS * 1000};
    int rc;
    for (size_t i = 0; i < sizeof(pool_methods) / sizeof(pool_methods[0]); i++) {
        if ((rc = mg_gateway_add_method(gw, &pool_methods[i])) != 0)
            return rc;
    }
    for (size_t i = 0; i < sizeof(pool_routes) / sizeof(pool_routes[0]); i++) {
        if ((rc = mg_gateway_add_route(gw, &pool_routes[i])) != 0)
            return rc;
    }
    if (gw->cfg->pool_bytes == 0 || mg_engine_registry(gw->engine) == NULL)
        return 0;
    gw->pool = calloc(1, sizeof(*gw->pool));
    if (gw->pool == NULL)
        return MG_ERR_NOMEM;
    gw->pool->overflow = strcmp(gw->cfg->pool_overflow, "register") == 0;
    gw->pool->tick = event_new(gw->base, -1, EV_PERSIST, tick_cb, gw);
    if (gw->pool->tick == NULL || event_add(gw->pool->tick, &tv) != 0)
        return MG_ERR_NOMEM;
    return start_pool(gw);
}

void mg_svc_pool_free(mg_gateway *gw)
{
    struct mg_pool_svc *ps = gw->pool;
    if (ps == NULL)
        return;
    mg_svc_pool_drain(gw);
    if (ps->tick)
        event_free(ps->tick);
    if (ps->pool) {
        unsigned n = mg_pool_revoke_all(ps->pool);
        if (n)
            mg_warn("leases_revoked", "pool=%s count=%u reason=\"daemon stopping\"", POOL_NAME, n);
        mg_pool_del(ps->pool);
    }
    free(ps);
    gw->pool = NULL;
}
