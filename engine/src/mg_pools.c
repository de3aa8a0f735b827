/*
 * mg_pools: the pool set (see moongate/pools.h).
 *
 * Each pool entry keeps its line of blocked acquires (a FIFO of mg_pools_wait); the set keeps
 * the published leases (a list; a lease id finds its own RDMA registration there) and the
 * overflow budget. Waits and overflow registrations share one handle type, so the caller has
 * one way to take an acquire back.
 */
#include "moongate/pools.h"

#include "mg_list.h"
#include "mg_log.h"
#include "mg_str.h"
#include "mg_time.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_OWNER      "moongate:pool" /* owner of the default pool's segment: no caller's */
#define OVERFLOW_LOG_NS (10ULL * 1000000000ULL) /* one overflow log line per 10 s at most */

typedef struct pool_entry {
    char name[MG_POOL_NAME_MAX + 1];  /* "default", "tenant.NAME" */
    char tenant[MG_SEG_NAME_MAX + 1]; /* whose pool ("" for the default pool) */
    char owner[MG_SEG_NAME_MAX + 1];  /* tenant owning its segment */
    uint64_t lease_bytes, reserve_bytes;
    mg_pool *pool; /* NULL until registered */
    uint64_t t0_ns;
    mg_list line; /* blocked acquires, first come first served (mg_pools_wait.link) */
    uint64_t nwaiters;
    mg_pools *ps;
} pool_entry;

/* A blocked acquire in its pool's line, or an overflow region being registered. */
struct mg_pools_wait {
    mg_list_node link; /* in its pool's line (waits only) */
    pool_entry *pe;
    int kind; /* MG_POOLS_WAITING or MG_POOLS_REGISTERING */
    mg_pools_done_fn done;
    void *arg;
    uint64_t size, alignment, ttl_ms, deadline_ms, t0_ms;
    int remote;
    int cancelled; /* overflow: the caller left; undo when the registration is back */
    uint64_t reserved;
    char tenant[MG_SEG_NAME_MAX + 1];
    char request_id[MG_SEG_NAME_MAX + 1];
};

/* A remote-accessible lease published in the lease table (held in use meanwhile). Its own
 * registration makes the key a peer gets reach this lease's bytes only, and it is dead
 * (deregistered) before the range goes back to the pool. */
typedef struct published {
    mg_list_node link;
    pool_entry *pe;
    mg_lease *l;
    uint64_t id;
    uint8_t *addr;
    uint64_t len;
    mg_rdma_mr *mr;
    int registering; /* a worker is registering it */
    int ended;       /* let go of while registering: done when the registration is back */
} published;

struct mg_pools {
    mg_pools_config cfg;
    pool_entry pools[MG_POOLS_MAX];
    size_t npools;
    pool_entry *fallback; /* the default pool, or NULL without one */
    mg_list published;
    uint64_t overflow_pending; /* bytes of overflow regions being registered */
    uint64_t overflow_seq;     /* names of overflow segments */
    uint64_t overflow_logged_ns, overflow_unlogged, overflow_unlogged_bytes;
    void (*started)(void *arg, int rc);
    void *started_arg;
};

static pool_entry *entry_for(mg_pools *ps, const char *tenant)
{
    for (size_t i = 0; i < ps->npools; i++) {
        if (ps->pools[i].tenant[0] && strcmp(ps->pools[i].tenant, tenant) == 0)
            return &ps->pools[i];
    }
    return ps->fallback;
}

static pool_entry *entry_of(mg_pools *ps, const mg_pool *pool)
{
    for (size_t i = 0; i < ps->npools; i++) {
        if (ps->pools[i].pool == pool)
            return &ps->pools[i];
    }
    return NULL;
}

mg_pool *mg_pools_for(mg_pools *ps, const char *tenant, int *rc)
{
    pool_entry *pe = ps ? entry_for(ps, tenant) : NULL;
    *rc = pe == NULL ? MG_ERR_NOT_FOUND : pe->pool == NULL ? MG_ERR_UNAVAILABLE : 0;
    return *rc ? NULL : pe->pool;
}

/* ---- publishing: remote-accessible leases for the data plane (moongate/lease_table.h) ---- */

static void serve_line(pool_entry *pe);

static int lease_reg_work(void *arg)
{
    published *p = arg;
    char why[256];
    if (mg_rdma_reg(p->pe->ps->cfg.rdma, p->addr, p->len, 1, &p->mr, why, sizeof(why)) != 0)
        mg_warn("lease_rdma_failed", "lease=%" PRIu64 " error=\"%s\" transport=tcp", p->id, why);
    return 0;
}

static void unpublished(published *p);

static void lease_reg_done(void *arg, int result)
{
    published *p = arg;
    (void)result;
    p->registering = 0;
    if (p->ended)
        unpublished(p);
}

static void publish(pool_entry *pe, mg_lease *l)
{
    mg_pools *ps = pe->ps;
    published *p;
    mg_lease_info li;
    int rc;
    mg_lease_set_remote(l, 1);
    if (ps->cfg.leases == NULL)
        return; /* no data plane: nobody could reach it */
    mg_lease_get_info(pe->pool, l, &li);
    p = calloc(1, sizeof(*p));
    rc = p ? mg_lease_table_put(ps->cfg.leases, li.id, li.tenant, mg_lease_addr(pe->pool, l),
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
    p->addr = mg_lease_addr(pe->pool, l);
    p->len = li.requested;
    mg_list_push_back(&ps->published, &p->link);
    if (ps->cfg.rdma) { /* until it is registered, peers reach it over TCP */
        p->registering = 1;
        if (mg_engine_submit(ps->cfg.engine, ps->cfg.cq, lease_reg_work, lease_reg_done, p) != 0)
            p->registering = 0;
    }
}

static void let_go(published *p)
{
    mg_lease_unuse(p->pe->pool, p->l);
    serve_line(p->pe); /* the lease's range may just have come back */
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
    (void)result;
    if (p->mr) { /* the engine stopped first */
        mg_rdma_dereg(p->mr);
        p->mr = NULL;
    }
    let_go(p);
}

/* The lease ended and no TCP slice uses it: its RDMA key dies first, then the range goes. */
static void unpublished(published *p)
{
    mg_pools *ps = p->pe->ps;
    if (p->registering) {
        p->ended = 1;
        return;
    }
    if (p->mr &&
        mg_engine_submit(ps->cfg.engine, ps->cfg.cq, lease_dereg_work, lease_dereg_done, p) == 0)
        return;
    lease_dereg_done(p, 0);
}

/* Withdraws the published leases that ended (released, expired), and lets go of those whose
 * last data-plane slice has finished since. */
static void sweep_published(mg_pools *ps, int ended)
{
    void *done[64];
    size_t n;
    if (ps->cfg.leases == NULL)
        return;
    mg_list_foreach_safe (&ps->published, node, next) {
        published *p = mg_container_of(node, published, link);
        if (!ended || !mg_lease_released(p->l))
            continue;
        mg_list_remove(&p->link);
        if (mg_lease_table_withdraw(ps->cfg.leases, p->id) == p)
            unpublished(p); /* else the table gives it back once its slices end */
    }
    while ((n = mg_lease_table_collect(ps->cfg.leases, done, 64)) > 0) {
        for (size_t i = 0; i < n; i++)
            unpublished(done[i]);
    }
}

int mg_pools_lease_rdma(mg_pools *ps, uint64_t lease_id, uint64_t *addr, uint32_t *rkeys,
                        unsigned *n)
{
    if (ps == NULL)
        return MG_ERR_NOT_FOUND;
    mg_list_foreach (&ps->published, node) {
        published *p = mg_container_of(node, published, link);
        if (p->id != lease_id)
            continue;
        if (p->mr == NULL || p->registering || p->ended)
            return MG_ERR_NOT_FOUND;
        *addr = (uintptr_t)p->addr;
        *n = (unsigned)mg_rdma_device_count(ps->cfg.rdma);
        for (unsigned k = 0; k < *n && k < 8; k++)
            rkeys[k] = mg_rdma_mr_rkey(p->mr, (int)k);
        return 0;
    }
    return MG_ERR_NOT_FOUND;
}

/* ---- the line of blocked acquires ---- */

static void wait_unlink(mg_pools_wait *w)
{
    mg_list_remove(&w->link);
    w->pe->nwaiters--;
}

/* Serves a pool's line from its head while there is room. */
static void serve_line(pool_entry *pe)
{
    mg_list_node *node;
    while ((node = mg_list_first(&pe->line)) != NULL) {
        mg_pools_wait *w = mg_container_of(node, mg_pools_wait, link);
        mg_lease *l = NULL;
        char err[MG_SEG_ERROR_MAX];
        int rc = mg_pool_acquire(pe->pool, w->tenant, w->size, w->alignment, w->ttl_ms,
                                 mg_now_mono_ms(), w->request_id, &l, err);
        if (rc == MG_ERR_FULL)
            return; /* the head waits; nobody overtakes it */
        wait_unlink(w);
        if (w->remote && rc == 0)
            publish(pe, l);
        w->done(w->arg, rc, pe->pool, l, err);
        free(w);
    }
}

static mg_pools_wait *wait_new(pool_entry *pe, const mg_pools_req *req, int kind,
                               mg_pools_done_fn done, void *arg)
{
    mg_pools_wait *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->pe = pe;
    w->kind = kind;
    w->done = done;
    w->arg = arg;
    w->size = req->size;
    w->alignment = req->alignment;
    w->ttl_ms = req->ttl_ms;
    w->deadline_ms = req->deadline_ms;
    w->remote = req->remote;
    w->t0_ms = mg_now_mono_ms();
    mg_strlcpy(w->tenant, req->tenant, sizeof(w->tenant));
    mg_strlcpy(w->request_id, req->request_id ? req->request_id : "", sizeof(w->request_id));
    return w;
}

static int enqueue(pool_entry *pe, const mg_pools_req *req, mg_pools_done_fn done, void *arg,
                   mg_pools_wait **wait)
{
    mg_pools_wait *w = wait_new(pe, req, MG_POOLS_WAITING, done, arg);
    if (w == NULL)
        return MG_ERR_NOMEM;
    mg_list_push_back(&pe->line, &w->link);
    pe->nwaiters++;
    *wait = w;
    return MG_POOLS_WAITING;
}

void mg_pools_cancel(mg_pools_wait *w)
{
    pool_entry *pe;
    if (w == NULL)
        return;
    if (w->kind == MG_POOLS_REGISTERING) {
        w->cancelled = 1; /* the registration comes back and is undone */
        return;
    }
    pe = w->pe;
    wait_unlink(w);
    free(w);
    serve_line(pe); /* the next in line may fit where this one did not */
}

void mg_pools_drain(mg_pools *ps)
{
    for (size_t i = 0; ps && i < ps->npools; i++) {
        mg_list_node *node;
        while ((node = mg_list_first(&ps->pools[i].line)) != NULL) {
            mg_pools_wait *w = mg_container_of(node, mg_pools_wait, link);
            wait_unlink(w);
            w->done(w->arg, MG_ERR_SHUTDOWN, NULL, NULL, "the daemon is draining; no new leases");
            free(w);
        }
    }
}

/* ---- overflow: a lease the pool cannot serve gets its own region ---- */

/* Bytes of overflow leases alive, over all pools. */
static uint64_t overflow_alive(mg_pools *ps)
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

static void unregistered(void *arg, const mg_segment_info *info)
{
    (void)arg;
    mg_info("segment_unregistered", "id=%" PRIu64 " name=%s bytes=%" PRIu64, info->id, info->name,
            info->size);
}

/* Unregisters an overflow region on a worker; logs a failure. */
static void overflow_unregister(mg_pools *ps, const char *tenant, uint64_t id, const char *why)
{
    mg_segment *seg;
    char err[MG_SEG_ERROR_MAX];
    int rc = mg_registry_unregister(ps->cfg.reg, tenant, id, &seg, err);
    if (rc == 0) /* no worker: it stays, listed, until the daemon stops */
        rc = mg_registry_unregister_async(ps->cfg.reg, ps->cfg.engine, ps->cfg.cq, seg,
                                          unregistered, NULL);
    if (rc != 0)
        mg_warn("segment_unregister_failed", "id=%" PRIu64 " reason=\"%s\" error=\"%s\"", id, why,
                rc == MG_ERR_BUSY ? err : mg_strerror(rc));
}

/* The pool dropped an overflow lease: unregister its region (its lease's reference first). */
static void drop_overflow(void *arg, mg_segment *seg)
{
    mg_pools *ps = arg;
    mg_segment_info info;
    mg_segment_get_info(ps->cfg.reg, seg, &info);
    mg_registry_put(ps->cfg.reg, seg);
    overflow_unregister(ps, info.tenant, info.id, "overflow lease ended");
}

static void overflow_log(mg_pools *ps, const pool_entry *pe, uint64_t bytes)
{
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

/* The overflow region's registration is back: adopt it as the lease, or undo it. */
static int overflow_adopt(mg_pools_wait *w, mg_segment *seg, mg_lease **l, char *err)
{
    mg_pools *ps = w->pe->ps;
    mg_segment_info info;
    mg_segment *held;
    int rc;
    mg_segment_get_info(ps->cfg.reg, seg, &info);
    if (w->cancelled || w->pe->pool == NULL) { /* the caller left: undo */
        overflow_unregister(ps, w->tenant, info.id, "overflow lease's caller gone");
        return MG_ERR_CANCELLED;
    }
    if (mg_registry_acquire(ps->cfg.reg, w->tenant, info.id, "an overflow lease", &held) != 0) {
        snprintf(err, MG_SEG_ERROR_MAX, "the overflow region vanished");
        return MG_ERR_NOT_FOUND;
    }
    rc = mg_pool_adopt(w->pe->pool, w->tenant, held, w->size, w->ttl_ms, mg_now_mono_ms(), l);
    if (rc != 0) {
        mg_registry_put(ps->cfg.reg, held);
        overflow_unregister(ps, w->tenant, info.id, "overflow lease refused");
        if (rc == MG_ERR_FULL)
            snprintf(err, MG_SEG_ERROR_MAX, "the pool holds its limit of leases (--max-leases)");
        else
            snprintf(err, MG_SEG_ERROR_MAX, "%s", mg_strerror(rc));
    }
    return rc;
}

static void overflow_done(void *arg, mg_segment *seg, int result, const char *why)
{
    mg_pools_wait *w = arg;
    mg_pools *ps = w->pe->ps;
    mg_lease *l = NULL;
    char err[MG_SEG_ERROR_MAX], msg[MG_SEG_ERROR_MAX + 64];
    int rc = result;

    ps->overflow_pending -= w->reserved;
    mg_strlcpy(err, why, sizeof(err));
    if (rc == 0)
        rc = overflow_adopt(w, seg, &l, err);
    if (rc == 0) {
        if (w->remote)
            publish(w->pe, l);
        overflow_log(ps, w->pe, w->reserved);
        w->done(w->arg, 0, w->pe->pool, l, "");
    } else if (!w->cancelled) {
        snprintf(msg, sizeof(msg), "the pool is full and its overflow region failed: %s", err);
        w->done(w->arg, rc, NULL, NULL, msg);
    }
    free(w);
}

/* Starts an overflow lease. Returns MG_POOLS_REGISTERING, or an MG_ERR_* with err saying why
 * not (the overflow budget, or the registration refused) appended. */
static int start_overflow(pool_entry *pe, const mg_pools_req *req, mg_pools_done_fn done, void *arg,
                          mg_pools_wait **wait, char *err)
{
    mg_pools *ps = pe->ps;
    uint64_t reserved = (req->size + MG_POOL_GRANULE - 1) / MG_POOL_GRANULE * MG_POOL_GRANULE;
    uint64_t alive = overflow_alive(ps);
    size_t n = strlen(err);
    mg_segment_spec spec;
    mg_segment *seg;
    mg_pools_wait *w;
    char name[MG_SEG_NAME_MAX + 1], why[MG_SEG_ERROR_MAX];
    int rc;

    if (req->size == 0 || req->alignment > MG_POOL_GRANULE ||
        alive + ps->overflow_pending + reserved > ps->cfg.overflow_max_bytes) {
        snprintf(err + n, MG_SEG_ERROR_MAX - n,
                 "; overflow: %llu of --pool-overflow-max-bytes %llu in use",
                 (unsigned long long)(alive + ps->overflow_pending),
                 (unsigned long long)ps->cfg.overflow_max_bytes);
        return MG_ERR_FULL;
    }
    snprintf(name, sizeof(name), "pool.%.64s.overflow.%llu", pe->name,
             (unsigned long long)++ps->overflow_seq);
    memset(&spec, 0, sizeof(spec));
    spec.tenant = req->tenant;
    spec.name = name;
    spec.source = MG_SEG_ANON;
    spec.size = reserved;
    spec.remote_accessible = 1;
    spec.memlock = ps->cfg.memlock;
    spec.prefault = 1;
    if ((w = wait_new(pe, req, MG_POOLS_REGISTERING, done, arg)) == NULL)
        return MG_ERR_NOMEM;
    w->reserved = reserved;
    rc = mg_registry_reserve(ps->cfg.reg, &spec, &seg, why);
    if (rc != 0) {
        snprintf(err + n, MG_SEG_ERROR_MAX - n, "; overflow region refused: %.200s", why);
        free(w);
        return rc;
    }
    rc = mg_registry_register_async(ps->cfg.reg, ps->cfg.engine, ps->cfg.cq, seg, overflow_done, w);
    if (rc != 0) { /* the reservation is undone */
        free(w);
        return rc;
    }
    ps->overflow_pending += reserved;
    *wait = w;
    return MG_POOLS_REGISTERING;
}

/* ---- acquire ---- */

int mg_pools_acquire(mg_pools *ps, mg_pool *pool, const mg_pools_req *req, uint64_t now_ms,
                     mg_pools_done_fn done, void *arg, mg_pools_wait **wait, mg_lease **out,
                     char *err)
{
    pool_entry *pe = entry_of(ps, pool);
    int rc;
    err[0] = '\0';
    if (pe == NULL)
        return MG_ERR_NOT_FOUND;
    if (req->block && !mg_list_empty(&pe->line)) { /* others wait already: join the line */
        mg_pool_count_exhausted(pool);
        return enqueue(pe, req, done, arg, wait);
    }
    rc = mg_pool_acquire(pool, req->tenant, req->size, req->alignment, req->ttl_ms, now_ms,
                         req->request_id, out, err);
    if (rc == MG_ERR_INVALID && ps->cfg.overflow && req->size > pe->lease_bytes)
        rc = MG_ERR_FULL; /* larger than the whole pool: only an overflow region can serve it */
    if (rc == 0 || rc == MG_LEASE_RETRY) {
        if (req->remote && rc == 0)
            publish(pe, *out);
        return rc;
    }
    if (rc != MG_ERR_FULL)
        return rc;
    mg_pool_count_exhausted(pool);
    if (ps->cfg.overflow) {
        int orc = start_overflow(pe, req, done, arg, wait, err);
        if (orc == MG_POOLS_REGISTERING || orc != MG_ERR_FULL || !req->block ||
            req->size > pe->lease_bytes)
            return orc;
    }
    return req->block ? enqueue(pe, req, done, arg, wait) : rc;
}

int mg_pools_acquire_all(mg_pools *ps, mg_pool *pool, const mg_pools_req *reqs, size_t n,
                         uint64_t now_ms, mg_lease **out, size_t *failed, char *err)
{
    pool_entry *pe = entry_of(ps, pool);
    if (pe == NULL)
        return MG_ERR_NOT_FOUND;
    for (size_t i = 0; i < n; i++) {
        const mg_pools_req *r = &reqs[i];
        int rc = mg_pool_acquire(pool, r->tenant, r->size, r->alignment, r->ttl_ms, now_ms,
                                 r->request_id, &out[i], err);
        if (rc != 0) { /* all or nothing: give back what this batch took */
            if (rc == MG_ERR_FULL)
                mg_pool_count_exhausted(pool);
            for (size_t k = 0; k < i; k++)
                mg_pool_release(pool, out[k]);
            *failed = i;
            serve_line(pe);
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++) { /* all taken: the remote-accessible ones go public */
        if (reqs[i].remote)
            publish(pe, out[i]);
    }
    return 0;
}

/* ---- the leases ---- */

int mg_pools_find(mg_pools *ps, const char *scope, uint64_t id, mg_pool **pool, mg_lease **out)
{
    for (size_t i = 0; ps && i < ps->npools; i++) {
        pool_entry *pe = scope ? entry_for(ps, scope) : &ps->pools[i];
        if (pe && pe->pool && mg_pool_find(pe->pool, scope, id, out) == 0) {
            *pool = pe->pool;
            return 0;
        }
        if (scope)
            break;
    }
    return MG_ERR_NOT_FOUND;
}

void mg_pools_release(mg_pools *ps, mg_pool *pool, mg_lease *l)
{
    pool_entry *pe = entry_of(ps, pool);
    mg_pool_release(pool, l);
    sweep_published(ps, 1);
    if (pe)
        serve_line(pe);
}

/* Merges infos[0..n) with tmp[0..k) (both in id order), keeping the `keep` smallest ids. */
static size_t merge_pages(mg_lease_info *infos, mg_pool **pools, size_t n, const mg_lease_info *tmp,
                          size_t k, mg_pool *pool, size_t keep)
{
    size_t total = n + k < keep ? n + k : keep, a = n, b = k;
    while (a + b > total) { /* drop the largest until the merge fits */
        if (b == 0 || (a > 0 && infos[a - 1].id > tmp[b - 1].id))
            a--;
        else
            b--;
    }
    for (size_t out = total; out > 0; out--) { /* then fill from the back */
        if (b == 0 || (a > 0 && infos[a - 1].id > tmp[b - 1].id)) {
            infos[out - 1] = infos[--a];
            pools[out - 1] = pools[a];
        } else {
            infos[out - 1] = tmp[--b];
            pools[out - 1] = pool;
        }
    }
    return total;
}

int mg_pools_list(mg_pools *ps, const char *scope, uint64_t after, mg_lease_info *out,
                  mg_pool **pools, size_t max, size_t *n)
{
    mg_lease_info *tmp;
    *n = 0;
    if (scope) {
        pool_entry *pe = entry_for(ps, scope);
        if (pe && pe->pool)
            *n = mg_pool_list(pe->pool, scope, after, out, max);
        for (size_t i = 0; i < *n; i++)
            pools[i] = pe->pool;
        return 0;
    }
    if ((tmp = calloc(max ? max : 1, sizeof(*tmp))) == NULL)
        return MG_ERR_NOMEM;
    for (size_t p = 0; p < ps->npools; p++) {
        mg_pool *pool = ps->pools[p].pool;
        if (pool)
            *n = merge_pages(out, pools, *n, tmp, mg_pool_list(pool, NULL, after, tmp, max), pool,
                             max);
    }
    free(tmp);
    return 0;
}

/* Fails the waits in pe's line whose deadline passed. */
static void expire_waits(pool_entry *pe, uint64_t now_ms)
{
    mg_list_foreach_safe (&pe->line, node, next) {
        mg_pools_wait *w = mg_container_of(node, mg_pools_wait, link);
        char err[160];
        if (w->deadline_ms == 0 || now_ms < w->deadline_ms)
            continue;
        wait_unlink(w);
        snprintf(err, sizeof(err), "no room for %" PRIu64 " bytes within %.1f s", w->size,
                 (double)(now_ms - w->t0_ms) / 1000.0);
        w->done(w->arg, MG_ERR_TIMEOUT, NULL, NULL, err);
        free(w);
    }
}

unsigned mg_pools_expire(mg_pools *ps, uint64_t now_ms)
{
    unsigned expired = 0;
    for (size_t i = 0; ps && i < ps->npools; i++) {
        pool_entry *pe = &ps->pools[i];
        unsigned n = pe->pool ? mg_pool_expire(pe->pool, now_ms) : 0;
        expire_waits(pe, now_ms);
        if (n > 0) {
            mg_info("leases_expired", "pool=%s count=%u", pe->name, n);
            serve_line(pe);
            expired += n;
        }
    }
    if (ps)
        sweep_published(ps, expired > 0);
    return expired;
}

int mg_pools_use(mg_pools *ps, const char *tenant, uint64_t lease_id, const char *holder,
                 mg_segment **seg, uint64_t *offset, uint64_t *length, void **token)
{
    pool_entry *pe = ps ? entry_for(ps, tenant) : NULL;
    mg_lease *l;
    mg_lease_info li;
    mg_segment_info si;
    if (pe == NULL || pe->pool == NULL || mg_pool_find(pe->pool, tenant, lease_id, &l) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_get_info(pe->pool, l, &li);
    /* The pool's segment belongs to the pool's owner; an overflow region to the caller. */
    mg_segment_get_info(ps->cfg.reg, mg_pool_segment(pe->pool), &si);
    if (mg_registry_acquire(ps->cfg.reg, si.id == li.segment_id ? pe->owner : tenant, li.segment_id,
                            holder, seg) != 0)
        return MG_ERR_NOT_FOUND;
    mg_lease_use(l);
    *offset = li.offset;
    *length = li.requested;
    *token = l;
    return 0;
}

void mg_pools_unuse(mg_pools *ps, void *token)
{
    pool_entry *pe = ps && token ? entry_for(ps, mg_lease_tenant(token)) : NULL;
    if (pe && pe->pool) {
        mg_lease_unuse(pe->pool, token);
        serve_line(pe); /* a lease released while in use may just have been freed */
    }
}

int mg_pools_resolve(mg_pools *ps, mg_registry *reg, const char *tenant, uint64_t segment,
                     uint64_t lease, uint64_t offset, uint64_t length, const char *holder,
                     mg_segment **seg, void **token, uint8_t **addr)
{
    uint64_t base = 0, size = 0;
    *seg = NULL;
    *token = NULL;
    if (lease) {
        if (mg_pools_use(ps, tenant, lease, holder, seg, &base, &size, token) != 0)
            return MG_ERR_NOT_FOUND;
    } else if (mg_registry_acquire(reg, tenant, segment, holder, seg) != 0) {
        return MG_ERR_NOT_FOUND;
    } else {
        size = mg_segment_size(*seg);
    }
    if (mg_bounds_check(size, offset, length) != 0) {
        mg_registry_put(reg, *seg);
        mg_pools_unuse(ps, *token);
        *seg = NULL;
        *token = NULL;
        return MG_ERR_RANGE;
    }
    *addr = (uint8_t *)mg_segment_addr(*seg) + base + offset;
    return 0;
}

/* ---- the set: pools, start-up, stats ---- */

size_t mg_pools_count(const mg_pools *ps)
{
    return ps ? ps->npools : 0;
}

int mg_pools_get(mg_pools *ps, size_t i, mg_pools_entry_info *out)
{
    mg_segment_info si;
    pool_entry *pe;
    memset(out, 0, sizeof(*out));
    out->name = out->tenant = "";
    if (ps == NULL || i >= ps->npools)
        return MG_ERR_NOT_FOUND;
    pe = &ps->pools[i];
    out->name = pe->name;
    out->tenant = pe->tenant;
    if (pe->pool == NULL)
        return MG_ERR_UNAVAILABLE;
    mg_pool_get_stats(pe->pool, &out->stats);
    out->waiters = pe->nwaiters;
    mg_segment_get_info(ps->cfg.reg, mg_pool_segment(pe->pool), &si);
    out->segment_id = si.id;
    mg_strlcpy(out->path, si.path, sizeof(out->path));
    return 0;
}

static int add_entry(mg_pools *ps, const char *name, const char *tenant, const char *owner,
                     uint64_t lease_bytes, uint64_t reserve_bytes)
{
    pool_entry *pe = &ps->pools[ps->npools++];
    snprintf(pe->name, sizeof(pe->name), "%s", name);
    snprintf(pe->tenant, sizeof(pe->tenant), "%.128s", tenant);
    snprintf(pe->owner, sizeof(pe->owner), "%.128s", owner);
    pe->lease_bytes = lease_bytes;
    pe->reserve_bytes = reserve_bytes;
    pe->ps = ps;
    mg_list_init(&pe->line);
    if (lease_bytes % MG_POOL_GRANULE) {
        mg_error("start_failed", "pool=%s reason=\"%llu bytes is not a multiple of %u\"", pe->name,
                 (unsigned long long)lease_bytes, MG_POOL_GRANULE);
        return MG_ERR_INVALID;
    }
    return 0;
}

int mg_pools_new(mg_pools **out, const mg_pools_config *cfg)
{
    mg_pools *ps;
    int rc = 0;
    *out = NULL;
    if (cfg->reg == NULL || cfg->n_tenants > MG_POOLS_MAX - 1)
        return MG_ERR_INVALID;
    if ((ps = calloc(1, sizeof(*ps))) == NULL)
        return MG_ERR_NOMEM;
    ps->cfg = *cfg;
    ps->cfg.tenants = NULL;
    ps->cfg.n_tenants = 0;
    mg_list_init(&ps->published);
    if (cfg->default_bytes) {
        rc = add_entry(ps, "default", "", POOL_OWNER, cfg->default_bytes,
                       cfg->default_reserve_bytes);
        ps->fallback = &ps->pools[0];
    }
    for (size_t i = 0; rc == 0 && i < cfg->n_tenants; i++) {
        char name[MG_POOL_NAME_MAX + 1];
        snprintf(name, sizeof(name), "tenant.%.56s", cfg->tenants[i].tenant);
        rc = add_entry(ps, name, cfg->tenants[i].tenant, cfg->tenants[i].tenant,
                       cfg->tenants[i].bytes, 0);
    }
    if (rc != 0) {
        free(ps);
        return rc;
    }
    *out = ps;
    return 0;
}

static void pool_registered(void *arg, mg_segment *seg, int result, const char *why)
{
    pool_entry *pe = arg;
    mg_pools *ps = pe->ps;
    mg_segment *held;
    mg_segment_info info;
    mg_pool_config pc = {.name = pe->name,
                         .lease_bytes = pe->lease_bytes,
                         .reserve_bytes = pe->reserve_bytes,
                         .max_leases = ps->cfg.max_leases,
                         .max_tenant_leases = ps->cfg.max_tenant_leases,
                         .max_ttl_ms = ps->cfg.max_ttl_ms,
                         .drop_overflow = drop_overflow,
                         .drop_arg = ps};
    char holder[MG_SEG_HOLDER_MAX], err[MG_SEG_ERROR_MAX];
    int rc = result;

    mg_strlcpy(err, why, sizeof(err));
    if (rc == 0) {
        mg_segment_get_info(ps->cfg.reg, seg, &info);
        snprintf(holder, sizeof(holder), "the buffer pool %s", pe->name);
        rc = mg_registry_acquire(ps->cfg.reg, pe->owner, info.id, holder, &held);
        if (rc == 0 && (rc = mg_pool_new(&pe->pool, ps->cfg.reg, held, &pc)) != 0)
            mg_registry_put(ps->cfg.reg, held);
        if (rc != 0)
            snprintf(err, sizeof(err), "%s", mg_strerror(rc));
    }
    if (rc != 0) {
        mg_error("start_failed", "pool=%s bytes=%llu error=\"%s\"", pe->name,
                 (unsigned long long)(pe->lease_bytes + pe->reserve_bytes), err);
    } else {
        mg_info("pool_ready",
                "pool=%s tenant=%s lease_bytes=%llu reserve_bytes=%llu segment=%" PRIu64
                " locked=%d path=%s ms=%.1f",
                pe->name, pe->tenant[0] ? pe->tenant : "(any)", (unsigned long long)pe->lease_bytes,
                (unsigned long long)pe->reserve_bytes, info.id, info.locked, info.path,
                (double)(mg_now_mono_ns() - pe->t0_ns) / 1e6);
    }
    if (ps->started)
        ps->started(ps->started_arg, rc);
}

static int start_pool(mg_pools *ps, pool_entry *pe)
{
    mg_segment_spec spec;
    mg_segment *seg;
    char err[MG_SEG_ERROR_MAX], name[MG_SEG_NAME_MAX + 1];
    int rc;
    snprintf(name, sizeof(name), "pool.%s", pe->name);
    memset(&spec, 0, sizeof(spec));
    spec.tenant = pe->owner;
    spec.provisioned = 1; /* the operator's memory, not the tenant's quota */
    spec.name = name;
    spec.source = MG_SEG_ANON;
    spec.size = pe->lease_bytes + pe->reserve_bytes;
    spec.remote_accessible = 1;
    spec.memlock = ps->cfg.memlock;
    spec.prefault = 1;
    rc = mg_registry_reserve(ps->cfg.reg, &spec, &seg, err);
    if (rc != 0) {
        mg_error("start_failed", "pool=%s error=\"%s\"", pe->name, err);
        return rc;
    }
    pe->t0_ns = mg_now_mono_ns();
    /* On failure the reservation is undone. */
    return mg_registry_register_async(ps->cfg.reg, ps->cfg.engine, ps->cfg.cq, seg, pool_registered,
                                      pe);
}

int mg_pools_start(mg_pools *ps, void (*started)(void *arg, int rc), void *arg, unsigned *pending)
{
    *pending = 0;
    if (ps) {
        ps->started = started;
        ps->started_arg = arg;
    }
    for (size_t i = 0; ps && i < ps->npools; i++) {
        int rc = start_pool(ps, &ps->pools[i]);
        if (rc != 0)
            return rc;
        (*pending)++;
    }
    return 0;
}

static void published_free(published *p)
{
    mg_rdma_dereg(p->mr); /* the workers have stopped: here */
    free(p);
}

void mg_pools_del(mg_pools *ps)
{
    if (ps == NULL)
        return;
    mg_pools_drain(ps);
    mg_list_foreach_safe (&ps->published, node,
                          next) { /* the data plane has stopped; the leases go with their pools */
        published *p = mg_container_of(node, published, link);
        mg_list_remove(&p->link);
        if (mg_lease_table_withdraw(ps->cfg.leases, p->id) == p)
            published_free(p);
    }
    if (ps->cfg.leases) {
        void *done[64];
        size_t n;
        while ((n = mg_lease_table_collect(ps->cfg.leases, done, 64)) > 0) {
            for (size_t i = 0; i < n; i++)
                published_free(done[i]);
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
}
