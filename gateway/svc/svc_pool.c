/*
 * svc_pool: moongate.v1.Pool — leases of the buffer pools, translated to the engine's pool set
 * (moongate/pools.h), which the gateway core creates from --pool-bytes and --tenant-pool.
 *
 * The core registers the pools' regions at start (the daemon turns ready only once they all
 * are); this service passes the time to the set (a 250 ms timer: lease expiry, --max-wait) and
 * answers the calls. A blocking acquire the pool cannot serve at once keeps
 * its call until the set answers, or until the call ends and the acquire is taken back.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "mg_log.h"
#include "mg_str.h"

#include "moongate/pools.h"
#include "moongate/v1/pool.pb-c.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_DEFAULT 100
#define LIST_MAX     1000
#define TICK_MS      250

/* The service's state (its slot of the gateway, mg_gateway_state): the set's tick, and the
 * blocking acquires that waited in line (/metrics: seconds waited, see mg_metrics.c). */
typedef struct pool_svc {
    struct event *tick;
    uint64_t waits_total, waited_total; /* acquires that had to wait; waits that ended */
    uint64_t buckets[12];
    double seconds_sum;
} pool_svc;

extern const mg_service mg_svc_pool;

static pool_svc *pool_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_pool);
}

/* A blocking acquire or an overflow lease the set answers later. */
typedef struct pending {
    mg_parked park; /* in no line: the pool set keeps the line */
    mg_gateway *gw;
    mg_pools_wait *wait;
    int waiting; /* in the pool's line (counted as a wait), not an overflow registration */
    uint64_t t0_ns;
} pending;

/* ---- messages ---- */

typedef struct {
    Moongate__V1__Lease msg;
    char path[4097];
    char tenant[MG_SEG_NAME_MAX + 1];
} lease_msg;

static void lease_msg_fill(lease_msg *m, const mg_pool *pool, const mg_lease_info *in)
{
    uint64_t now = mg_now_mono_ms();
    moongate__v1__lease__init(&m->msg);
    mg_strlcpy(m->path, in->path, sizeof(m->path));
    mg_strlcpy(m->tenant, in->tenant, sizeof(m->tenant));
    m->msg.id = in->id;
    m->msg.tenant = m->tenant;
    m->msg.pool = (char *)mg_pool_name(pool);
    m->msg.segment_id = in->segment_id;
    m->msg.path = m->path;
    m->msg.offset = in->offset;
    m->msg.requested = in->requested;
    m->msg.reserved = in->reserved;
    m->msg.expires_in_ms = in->expires_ms > now ? in->expires_ms - now : 0;
    m->msg.remote_accessible = in->remote_accessible;
    m->msg.users = in->users;
}

static void reply_lease(mg_call *call, const mg_pool *pool, const mg_lease *l)
{
    mg_lease_info info;
    lease_msg m;
    mg_lease_get_info(pool, l, &info);
    lease_msg_fill(&m, pool, &info);
    mg_call_reply(call, &m.msg.base);
}

/* ---- acquires answered later ---- */

static void pending_end(pending *a)
{
    pool_svc *ps = pool_of(a->gw);
    if (a->waiting) {
        ps->waited_total++;
        mg_metrics_observe_seconds(ps->buckets, &ps->seconds_sum,
                                   (double)(mg_now_mono_ns() - a->t0_ns) / 1e9);
    }
    mg_call_unpark(&a->park, -1, NULL);
    free(a);
}

static void acquired(void *arg, int rc, mg_pool *pool, mg_lease *l, const char *err)
{
    pending *a = arg;
    if (rc == 0 || rc == MG_LEASE_RETRY) {
        if (!mg_call_done(a->park.call))
            reply_lease(a->park.call, pool, l);
        else if (rc == 0)
            mg_pools_release(a->gw->pools, pool, l); /* nobody is left to use it */
    } else if (rc == MG_ERR_TIMEOUT) {
        mg_call_fail(a->park.call, rc, "%s (--max-wait %llu s)", err,
                     (unsigned long long)a->gw->cfg->max_wait);
    } else {
        mg_call_fail(a->park.call, rc, "%s", err);
    }
    pending_end(a);
}

static void acquire_cancel(mg_call *call)
{
    pending *a = mg_call_data(call);
    if (a == NULL)
        return;
    mg_pools_cancel(a->wait);
    pending_end(a);
}

/* ---- handlers ---- */

/* The caller's pool, or NULL after failing the call (no pool, or the daemon is draining). */
static mg_pool *pool_for(mg_call *call, int acquiring)
{
    mg_gateway *gw = mg_call_gateway(call);
    int rc;
    mg_pool *pool = mg_pools_for(gw->pools, mg_call_tenant(call), &rc);
    if (rc == MG_ERR_NOT_FOUND) {
        mg_call_fail(call, MG_ERR_BUSY,
                     "this daemon has no buffer pool for tenant %s (--pool-bytes 0, no "
                     "--tenant-pool)",
                     mg_call_tenant(call));
        return NULL;
    }
    if (pool == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the buffer pool is still being registered");
        return NULL;
    }
    if (acquiring && gw->state == MG_STATE_DRAINING) {
        mg_call_fail(call, MG_ERR_SHUTDOWN, "the daemon is draining; no new leases");
        return NULL;
    }
    return pool;
}

/* A request's TTL: its own or --lease-ttl. Returns 0, or -1 over --max-lease-ttl. */
static int ttl_of(mg_gateway *gw, uint32_t ttl_ms, uint64_t *out)
{
    *out = ttl_ms ? ttl_ms : gw->cfg->lease_ttl * 1000;
    return *out <= gw->cfg->max_lease_ttl * 1000 ? 0 : -1;
}

/* An AcquireLeaseRequest as the set's request. Returns 0, or -1 after failing the call. */
static int req_of(mg_call *call, const Moongate__V1__AcquireLeaseRequest *r, mg_pools_req *out)
{
    mg_gateway *gw = mg_call_gateway(call);
    memset(out, 0, sizeof(*out));
    if (ttl_of(gw, r->ttl_ms, &out->ttl_ms) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)", r->ttl_ms,
                     (unsigned long long)gw->cfg->max_lease_ttl);
        return -1;
    }
    out->tenant = mg_call_tenant(call);
    out->size = r->size;
    out->alignment = r->alignment;
    out->request_id = r->request_id;
    out->remote = r->remote_accessible;
    out->block = r->block;
    if (r->block && mg_call_remaining_ms(call) < 0) /* the call's deadline ends it, else this */
        out->deadline_ms = mg_now_mono_ms() + gw->cfg->max_wait * 1000;
    return 0;
}

static void acquire_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    mg_pool *pool = pool_for(call, 1);
    mg_pools_req req;
    mg_pools_wait *wait = NULL;
    mg_lease *l = NULL;
    pending *a;
    char err[MG_SEG_ERROR_MAX];
    int rc;
    if (pool == NULL || req_of(call, (const void *)m, &req) != 0)
        return;
    if ((a = calloc(1, sizeof(*a))) == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    rc = mg_pools_acquire(gw->pools, pool, &req, mg_now_mono_ms(), acquired, a, &wait, &l, err);
    if (rc == MG_POOLS_WAITING || rc == MG_POOLS_REGISTERING) {
        a->gw = gw;
        a->wait = wait;
        a->waiting = rc == MG_POOLS_WAITING;
        a->t0_ns = mg_now_mono_ns();
        pool_of(gw)->waits_total += (uint64_t)a->waiting;
        mg_call_park(call, &a->park, NULL);
        return;
    }
    free(a);
    if (rc == 0 || rc == MG_LEASE_RETRY)
        reply_lease(call, pool, l);
    else
        mg_call_fail(call, rc, "%s", err);
}

/* n Lease messages in one allocation the caller frees (NULL: out of memory): of leases[i] in
 * `pool`, or of infos[i] in pools[i]. */
static Moongate__V1__Lease **lease_msgs(mg_pool *pool, mg_lease *const *leases,
                                        mg_pool *const *pools, const mg_lease_info *infos, size_t n)
{
    Moongate__V1__Lease **ptrs = calloc(n + 1, sizeof(*ptrs) + sizeof(lease_msg));
    lease_msg *msgs = ptrs ? (lease_msg *)(void *)(ptrs + n + 1) : NULL;
    for (size_t i = 0; ptrs && i < n; i++) {
        mg_lease_info info;
        if (leases)
            mg_lease_get_info(pool, leases[i], &info);
        lease_msg_fill(&msgs[i], leases ? pool : pools[i], leases ? &info : &infos[i]);
        ptrs[i] = &msgs[i].msg;
    }
    return ptrs;
}

static void acquire_batch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__AcquireLeasesRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_pool *pool = pool_for(call, 1);
    Moongate__V1__AcquireLeasesResponse resp = MOONGATE__V1__ACQUIRE_LEASES_RESPONSE__INIT;
    size_t n = req->n_items, failed = 0;
    mg_pools_req *reqs = calloc(n + 1, sizeof(*reqs));
    mg_lease **got = calloc(n + 1, sizeof(*got));
    char err[MG_SEG_ERROR_MAX];
    int rc = reqs && got ? 0 : MG_ERR_NOMEM;
    if (pool == NULL)
        goto out;
    if (n > gw->cfg->max_batch) {
        mg_call_fail(call, MG_ERR_FULL, "%zu items are more than --max-batch %llu", n,
                     (unsigned long long)gw->cfg->max_batch);
        goto out;
    }
    for (size_t k = 0; rc == 0 && k < n; k++) {
        const Moongate__V1__AcquireLeaseRequest *it = req->items[k];
        reqs[k] = (mg_pools_req){.tenant = mg_call_tenant(call),
                                 .size = it->size,
                                 .alignment = it->alignment,
                                 .remote = it->remote_accessible};
        if (ttl_of(gw, it->ttl_ms, &reqs[k].ttl_ms) != 0) {
            mg_call_fail(call, MG_ERR_INVALID,
                         "item %zu: ttl_ms %u is above --max-lease-ttl; no lease was taken", k,
                         it->ttl_ms);
            goto out;
        }
    }
    if (rc == 0 && (rc = mg_pools_acquire_all(gw->pools, pool, reqs, n, mg_now_mono_ms(), got,
                                              &failed, err)) != 0) {
        mg_call_fail(call, rc, "item %zu: %s; no lease was taken", failed, err);
        goto out;
    }
    if (rc == 0 && (resp.leases = lease_msgs(pool, got, NULL, NULL, n)) != NULL) {
        resp.n_leases = n;
        mg_call_reply(call, &resp.base);
    }
    mg_call_fail(call, MG_ERR_NOMEM, NULL); /* no-op once answered */
out:
    free(resp.leases);
    free(reqs);
    free(got);
}

/* Lease `id` of the caller, in its pool; an admin's search covers every pool and tenant. Fails
 * the call (no pool; NOT_FOUND: another tenant's lease looks the same as none). */
static mg_lease *lease_for(mg_call *call, uint64_t id, mg_pool **pool)
{
    mg_lease *l;
    if (pool_for(call, 0) == NULL)
        return NULL;
    if (mg_pools_find(mg_call_gateway(call)->pools, mg_call_scope(call), id, pool, &l) == 0)
        return l;
    mg_call_fail(call, MG_ERR_NOT_FOUND, "no lease %" PRIu64, id);
    return NULL;
}

static void release_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReleaseLeaseRequest *req = (const void *)m;
    Moongate__V1__ReleaseLeaseResponse resp = MOONGATE__V1__RELEASE_LEASE_RESPONSE__INIT;
    mg_pool *pool;
    mg_lease *l = lease_for(call, req->id, &pool);
    if (l == NULL)
        return;
    if (mg_call_admin(call) && strcmp(mg_lease_tenant(l), mg_call_tenant(call)) != 0)
        mg_info("lease_revoked", "id=%" PRIu64 " tenant=%s by=%s", req->id, mg_lease_tenant(l),
                mg_call_tenant(call));
    mg_pools_release(mg_call_gateway(call)->pools, pool, l);
    mg_call_reply(call, &resp.base);
}

static void renew_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RenewLeaseRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_pool *pool;
    mg_lease *l = lease_for(call, req->id, &pool);
    uint64_t ttl;
    if (l == NULL)
        return;
    if (ttl_of(gw, req->ttl_ms, &ttl) != 0 || mg_pool_renew(pool, l, ttl, mg_now_mono_ms()) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "ttl_ms %u is above %llu s (--max-lease-ttl)",
                     req->ttl_ms, (unsigned long long)gw->cfg->max_lease_ttl);
        return;
    }
    reply_lease(call, pool, l);
}

static void get_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetLeaseRequest *req = (const void *)m;
    mg_pool *pool;
    mg_lease *l = lease_for(call, req->id, &pool);
    if (l != NULL)
        reply_lease(call, pool, l);
}

static void list_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ListLeasesRequest *req = (const void *)m;
    Moongate__V1__ListLeasesResponse resp = MOONGATE__V1__LIST_LEASES_RESPONSE__INIT;
    size_t want = req->page_size ? req->page_size : LIST_DEFAULT, n = 0;
    uint64_t after = 0;
    mg_lease_info *infos;
    mg_pool **pools;
    char token[24] = "";
    if (pool_for(call, 0) == NULL ||
        mg_call_page_args(call, req->page_size, req->page_token, LIST_MAX, &after) != 0)
        return;
    infos = calloc(want + 1, sizeof(*infos));
    pools = calloc(want + 1, sizeof(*pools));
    if (infos && pools &&
        mg_pools_list(mg_call_gateway(call)->pools, mg_call_scope(call), after, infos, pools,
                      want + 1, &n) == 0) {
        if (n > want) {
            n = want;
            snprintf(token, sizeof(token), "%016" PRIx64, infos[n - 1].id);
        }
        if ((resp.leases = lease_msgs(NULL, NULL, pools, infos, n)) != NULL) {
            resp.n_leases = n;
            resp.next_page_token = token;
            mg_call_reply(call, &resp.base);
        }
    }
    mg_call_fail(call, MG_ERR_NOMEM, NULL); /* no-op once answered */
    free(resp.leases);
    free(infos);
    free(pools);
}

static void stats_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__PoolStatsResponse resp = MOONGATE__V1__POOL_STATS_RESPONSE__INIT;
    Moongate__V1__PoolStat st[MG_POOLS_MAX], *ptrs[MG_POOLS_MAX];
    mg_pools_entry_info *e = calloc(MG_POOLS_MAX, sizeof(*e));
    const char *scope = mg_call_scope(call);
    size_t n = 0;
    (void)m;
    if (pool_for(call, 0) == NULL || e == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL); /* no-op after pool_for failed it */
        goto out;
    }
    for (size_t i = 0; i < mg_pools_count(gw->pools) && n < MG_POOLS_MAX; i++) {
        const mg_pool_stats *ps = &e[n].stats;
        if (mg_pools_get(gw->pools, i, &e[n]) != 0 ||
            (scope && e[n].tenant[0] && strcmp(e[n].tenant, scope) != 0))
            continue; /* not registered yet, or another tenant's pool: an admin's business */
        moongate__v1__pool_stat__init(&st[n]);
        st[n].name = (char *)e[n].name, st[n].path = e[n].path;
        st[n].segment_id = e[n].segment_id, st[n].waiters = e[n].waiters;
        st[n].capacity = ps->capacity, st[n].reserve = ps->reserve;
        st[n].in_use = ps->in_use, st[n].free = ps->free, st[n].leases = ps->leases;
        st[n].largest_free = ps->largest_free, st[n].largest_lease = ps->largest_lease;
        st[n].acquired_total = ps->acquired_total, st[n].released_total = ps->released_total;
        st[n].expired_total = ps->expired_total, st[n].exhausted_total = ps->exhausted_total;
        st[n].overflow_total = ps->overflow_total, st[n].overflow_bytes = ps->overflow_bytes;
        st[n].fragmentation = ps->free ? 1.0 - (double)ps->largest_free / (double)ps->free : 0.0;
        ptrs[n] = &st[n];
        n++;
    }
    resp.pools = ptrs;
    resp.n_pools = n;
    mg_call_reply(call, &resp.base);
out:
    free(e);
}

/* ---- time, start-up, drain ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    (void)fd;
    (void)what;
    mg_pools_expire(gw->pools, mg_now_mono_ms());
}

static void pool_drain(mg_gateway *gw)
{
    mg_pools_drain(gw->pools);
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

static int pool_init(mg_gateway *gw)
{
    struct timeval tv = {0, TICK_MS * 1000};
    pool_svc *ps;
    int rc = mg_gateway_add_methods(gw, pool_methods, MG_NELEM(pool_methods), pool_routes,
                                    MG_NELEM(pool_routes));
    if (rc != 0 || gw->pools == NULL)
        return rc;
    if ((ps = calloc(1, sizeof(*ps))) == NULL)
        return MG_ERR_NOMEM;
    *mg_gateway_state(gw, &mg_svc_pool) = ps;
    ps->tick = event_new(gw->base, -1, EV_PERSIST, tick_cb, gw);
    return ps->tick == NULL || event_add(ps->tick, &tv) != 0 ? MG_ERR_NOMEM : 0;
}

static void pool_free(mg_gateway *gw)
{
    pool_svc *ps = pool_of(gw);
    mg_pools_drain(gw->pools); /* the set itself goes with the gateway's engine parts */
    if (ps && ps->tick)
        event_free(ps->tick);
    free(ps);
    *mg_gateway_state(gw, &mg_svc_pool) = NULL;
}

/* The pool service's own block: the acquires that waited in line. */
static void pool_metrics(mg_gateway *gw, struct evbuffer *out)
{
    const pool_svc *w = pool_of(gw);
    if (w == NULL)
        return;
    evbuffer_add_printf(out,
                        "# HELP moongate_pool_waits_total Blocking acquires that waited in "
                        "line.\n# TYPE moongate_pool_waits_total counter\n"
                        "moongate_pool_waits_total %llu\n",
                        (unsigned long long)w->waits_total);
    mg_metrics_render_seconds(out, "moongate_pool_wait_seconds",
                              "Time blocking acquires waited in line.", w->buckets, w->waited_total,
                              w->seconds_sum);
}

const mg_service mg_svc_pool = {.name = "pool",
                                .init = pool_init,
                                .drain = pool_drain,
                                .metrics = pool_metrics,
                                .free = pool_free};
