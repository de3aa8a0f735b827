/*
 * mg_pool: leases over a registered region (see moongate/pool.h).
 *
 * Storage: leases in two chained hash tables of fixed size (a power of two >= max_leases), by
 * id (the id map the segment registry uses too: common/mg_idmap.h, which mints the ids) and by
 * (tenant, request id), and in one list. A released lease that operations still use stays
 * in the tables, marked, until its last user ends; lookups do not see it.
 */
#include "moongate/pool.h"

#include "mg_hash.h"
#include "mg_idmap.h"
#include "mg_list.h"
#include "mg_str.h"
#include "moongate/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct mg_lease {
    mg_idmap_node idn; /* its id, in the pool's id map */
    char tenant[MG_SEG_NAME_MAX + 1];
    char request_id[MG_SEG_NAME_MAX + 1];
    uint64_t offset, requested, reserved;
    uint64_t expires_ms;
    uint32_t handle; /* in the allocator */
    mg_segment *own; /* an overflow lease's own segment (referenced), or NULL */
    uint32_t users;
    int released;
    int remote_accessible;
    struct mg_lease *req_next, *prev, *next;
};

/* Live leases per tenant, for max_tenant_leases. A list: tenants are few. */
typedef struct tenant_leases {
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t live;
    struct tenant_leases *next;
} tenant_leases;

struct mg_pool {
    char name[MG_POOL_NAME_MAX + 1];
    mg_registry *reg;
    mg_segment *seg;
    uint8_t *base;
    mg_alloc *alloc;
    mg_pool_config cfg;
    mg_idmap ids;
    size_t nbuckets;
    mg_lease **by_req;
    mg_lease *all;
    uint64_t live;
    uint64_t acquired_total, released_total, expired_total, exhausted_total;
    uint64_t overflow_total, overflow_bytes, overflow_leases;
    tenant_leases *tenants;
};

static tenant_leases *tenant_of(mg_pool *p, const char *tenant, int create)
{
    tenant_leases *t;
    for (t = p->tenants; t; t = t->next)
        if (strcmp(t->tenant, tenant) == 0)
            return t;
    if (!create || (t = calloc(1, sizeof(*t))) == NULL)
        return NULL;
    mg_strlcpy(t->tenant, tenant, sizeof(t->tenant));
    t->next = p->tenants;
    p->tenants = t;
    return t;
}

/* Room for one more live lease of `tenant` (max_tenant_leases)? 0, or MG_ERR_QUOTA with err. */
static int tenant_room(mg_pool *p, const char *tenant, char *err)
{
    tenant_leases *t = p->cfg.max_tenant_leases ? tenant_of(p, tenant, 0) : NULL;
    if (t == NULL || t->live < p->cfg.max_tenant_leases)
        return 0;
    if (err)
        snprintf(err, MG_SEG_ERROR_MAX,
                 "tenant \"%s\" holds %llu leases, its quota (--max-tenant-leases)", tenant,
                 (unsigned long long)t->live);
    return MG_ERR_QUOTA;
}

static void tenant_drop(mg_pool *p, const char *tenant)
{
    tenant_leases **pp = &p->tenants;
    while (*pp && strcmp((*pp)->tenant, tenant) != 0)
        pp = &(*pp)->next;
    if (*pp && --(*pp)->live == 0) {
        tenant_leases *t = *pp;
        *pp = t->next;
        free(t);
    }
}

int mg_pool_new(mg_pool **out, mg_registry *reg, mg_segment *seg, const mg_pool_config *cfg)
{
    mg_pool *p;
    mg_segment_info info;
    size_t nb = 16;
    int rc;
    mg_segment_get_info(reg, seg, &info);
    if (cfg->name == NULL || strlen(cfg->name) > MG_POOL_NAME_MAX || cfg->lease_bytes == 0 ||
        cfg->lease_bytes % MG_POOL_GRANULE || cfg->max_leases == 0 ||
        cfg->lease_bytes > info.size || cfg->reserve_bytes > info.size - cfg->lease_bytes ||
        mg_segment_addr(seg) == NULL)
        return MG_ERR_INVALID;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return MG_ERR_NOMEM;
    while (nb < cfg->max_leases)
        nb <<= 1;
    p->nbuckets = nb;
    p->by_req = calloc(nb, sizeof(*p->by_req));
    rc = mg_idmap_init(&p->ids, nb) == 0 && p->by_req
             ? mg_alloc_new(&p->alloc, cfg->lease_bytes, MG_POOL_GRANULE, cfg->max_leases)
             : MG_ERR_NOMEM;
    if (rc != 0) {
        mg_idmap_free(&p->ids);
        free(p->by_req);
        free(p);
        return rc;
    }
    snprintf(p->name, sizeof(p->name), "%s", cfg->name);
    p->reg = reg;
    p->seg = seg;
    p->base = mg_segment_addr(seg);
    p->cfg = *cfg;
    p->cfg.name = p->name;
    *out = p;
    return 0;
}

static void lease_free(mg_pool *p, mg_lease *l)
{
    mg_lease **pp;
    mg_idmap_remove(&p->ids, &l->idn);
    if (l->request_id[0]) {
        pp = &p->by_req[mg_hash_str2(l->tenant, l->request_id) & (p->nbuckets - 1)];
        while (*pp && *pp != l)
            pp = &(*pp)->req_next;
        if (*pp)
            *pp = l->req_next;
    }
    if (l->prev)
        l->prev->next = l->next;
    else
        p->all = l->next;
    if (l->next)
        l->next->prev = l->prev;
    if (l->own) {
        p->overflow_bytes -= l->reserved;
        p->overflow_leases--;
        if (p->cfg.drop_overflow)
            p->cfg.drop_overflow(p->cfg.drop_arg, l->own);
        else
            mg_registry_put(p->reg, l->own);
    } else {
        mg_alloc_give(p->alloc, l->handle);
    }
    free(l);
}

void mg_pool_del(mg_pool *p)
{
    if (p == NULL)
        return;
    while (p->all)
        lease_free(p, p->all);
    while (p->tenants) {
        tenant_leases *t = p->tenants;
        p->tenants = t->next;
        free(t);
    }
    mg_alloc_del(p->alloc);
    mg_registry_put(p->reg, p->seg);
    mg_idmap_free(&p->ids);
    free(p->by_req);
    free(p);
}

const char *mg_pool_name(const mg_pool *p)
{
    return p->name;
}

static void enter(mg_pool *p, mg_lease *l);

static mg_lease *find_id(mg_pool *p, uint64_t id)
{
    mg_idmap_node *n = mg_idmap_find(&p->ids, id);
    return n ? mg_container_of(n, mg_lease, idn) : NULL;
}

static mg_lease *find_req(mg_pool *p, const char *tenant, const char *req)
{
    mg_lease *l = p->by_req[mg_hash_str2(tenant, req) & (p->nbuckets - 1)];
    while (l && (strcmp(l->tenant, tenant) != 0 || strcmp(l->request_id, req) != 0))
        l = l->req_next;
    return l;
}

int mg_pool_acquire(mg_pool *p, const char *tenant, uint64_t size, uint64_t alignment,
                    uint64_t ttl_ms, uint64_t now_ms, const char *request_id, mg_lease **out,
                    char *err)
{
    mg_alloc_stats st;
    mg_lease *l;
    uint64_t offset, reserved;
    uint32_t handle;
    int rc;

    err[0] = '\0';
    if (size == 0 || size > p->cfg.lease_bytes) {
        snprintf(err, MG_SEG_ERROR_MAX, "size %llu must be 1..%llu, the pool's lease area",
                 (unsigned long long)size, (unsigned long long)p->cfg.lease_bytes);
        return MG_ERR_INVALID;
    }
    if (alignment & (alignment - 1)) {
        snprintf(err, MG_SEG_ERROR_MAX, "alignment %llu is not a power of two",
                 (unsigned long long)alignment);
        return MG_ERR_INVALID;
    }
    if (ttl_ms == 0 || ttl_ms > p->cfg.max_ttl_ms) {
        snprintf(err, MG_SEG_ERROR_MAX, "ttl must be 1..%llu ms",
                 (unsigned long long)p->cfg.max_ttl_ms);
        return MG_ERR_INVALID;
    }
    if (request_id && *request_id) {
        if (strlen(request_id) > MG_SEG_NAME_MAX) {
            snprintf(err, MG_SEG_ERROR_MAX, "request id must be at most %d characters",
                     MG_SEG_NAME_MAX);
            return MG_ERR_INVALID;
        }
        l = find_req(p, tenant, request_id);
        if (l && !l->released) {
            if (l->requested != size) {
                snprintf(err, MG_SEG_ERROR_MAX,
                         "request id \"%s\" was used for a lease of %llu bytes", request_id,
                         (unsigned long long)l->requested);
                return MG_ERR_INVALID;
            }
            *out = l;
            return MG_LEASE_RETRY;
        }
    }
    if ((rc = tenant_room(p, tenant, err)) != 0)
        return rc;
    if (tenant_of(p, tenant, 1) == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
        return MG_ERR_NOMEM;
    }
    rc = mg_alloc_take(p->alloc, size, alignment, &offset, &reserved, &handle);
    if (rc != 0) {
        mg_alloc_get_stats(p->alloc, &st);
        if (rc == MG_ERR_FULL && st.allocations >= p->cfg.max_leases)
            snprintf(err, MG_SEG_ERROR_MAX, "pool %s holds %u leases, its limit", p->name,
                     st.allocations);
        else
            snprintf(err, MG_SEG_ERROR_MAX,
                     "pool %s cannot serve %llu bytes%s: %llu free, largest free range %llu, "
                     "largest lease now %llu",
                     p->name, (unsigned long long)size,
                     alignment > MG_POOL_GRANULE ? " at that alignment" : "",
                     (unsigned long long)st.free, (unsigned long long)st.largest_range,
                     (unsigned long long)st.largest_free);
        return rc == MG_ERR_INVALID ? MG_ERR_INVALID : MG_ERR_FULL;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL) {
        mg_alloc_give(p->alloc, handle);
        snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
        return MG_ERR_NOMEM;
    }
    mg_strlcpy(l->tenant, tenant, sizeof(l->tenant));
    if (request_id)
        mg_strlcpy(l->request_id, request_id, sizeof(l->request_id));
    l->offset = offset;
    l->requested = size;
    l->reserved = reserved;
    l->handle = handle;
    l->expires_ms = now_ms + ttl_ms;
    enter(p, l);
    *out = l;
    return 0;
}

/* Gives the lease an id and enters it in the tables. */
static void enter(mg_pool *p, mg_lease *l)
{
    size_t b;
    mg_idmap_add(&p->ids, &l->idn);
    if (l->request_id[0]) {
        b = mg_hash_str2(l->tenant, l->request_id) & (p->nbuckets - 1);
        l->req_next = p->by_req[b];
        p->by_req[b] = l;
    }
    l->next = p->all;
    if (p->all)
        p->all->prev = l;
    p->all = l;
    p->live++;
    p->acquired_total++;
    tenant_of(p, l->tenant, 0)->live++; /* made by the caller before */
}

int mg_pool_adopt(mg_pool *p, const char *tenant, mg_segment *seg, uint64_t size, uint64_t ttl_ms,
                  uint64_t now_ms, mg_lease **out)
{
    mg_segment_info si;
    mg_lease *l;
    if (tenant_room(p, tenant, NULL) != 0)
        return MG_ERR_QUOTA;
    if (p->live >= p->cfg.max_leases)
        return MG_ERR_FULL;
    if (tenant_of(p, tenant, 1) == NULL)
        return MG_ERR_NOMEM;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return MG_ERR_NOMEM;
    mg_segment_get_info(p->reg, seg, &si);
    mg_strlcpy(l->tenant, tenant, sizeof(l->tenant));
    l->own = seg;
    l->requested = size;
    l->reserved = si.size;
    l->expires_ms = now_ms + ttl_ms;
    enter(p, l);
    p->overflow_total++;
    p->overflow_bytes += l->reserved;
    p->overflow_leases++;
    *out = l;
    return 0;
}

int mg_pool_find(mg_pool *p, const char *tenant, uint64_t id, mg_lease **out)
{
    mg_lease *l = find_id(p, id);
    if (l == NULL || l->released || (tenant && strcmp(l->tenant, tenant) != 0))
        return MG_ERR_NOT_FOUND;
    *out = l;
    return 0;
}

static void release(mg_pool *p, mg_lease *l, int expired)
{
    if (l->released)
        return;
    l->released = 1;
    p->live--;
    tenant_drop(p, l->tenant);
    if (expired)
        p->expired_total++;
    else
        p->released_total++;
    if (l->users == 0)
        lease_free(p, l);
}

void mg_pool_release(mg_pool *p, mg_lease *l)
{
    release(p, l, 0);
}

int mg_pool_renew(mg_pool *p, mg_lease *l, uint64_t ttl_ms, uint64_t now_ms)
{
    if (ttl_ms == 0 || ttl_ms > p->cfg.max_ttl_ms)
        return MG_ERR_INVALID;
    l->expires_ms = now_ms + ttl_ms;
    return 0;
}

void mg_lease_set_remote(mg_lease *l, int remote_accessible)
{
    l->remote_accessible = remote_accessible != 0;
}

const char *mg_lease_tenant(const mg_lease *l)
{
    return l->tenant;
}

void mg_lease_use(mg_lease *l)
{
    l->users++;
}

void mg_lease_unuse(mg_pool *p, mg_lease *l)
{
    if (l->users > 0 && --l->users == 0 && l->released)
        lease_free(p, l);
}

unsigned mg_pool_expire(mg_pool *p, uint64_t now_ms)
{
    unsigned n = 0;
    mg_lease *l = p->all, *next;
    for (; l; l = next) {
        next = l->next;
        if (!l->released && l->expires_ms <= now_ms) {
            release(p, l, 1);
            n++;
        }
    }
    return n;
}

unsigned mg_pool_revoke_all(mg_pool *p)
{
    unsigned n = 0;
    mg_lease *l = p->all, *next;
    for (; l; l = next) {
        next = l->next;
        if (!l->released) {
            mg_pool_release(p, l);
            n++;
        }
    }
    return n;
}

void mg_lease_get_info(const mg_pool *p, const mg_lease *l, mg_lease_info *out)
{
    mg_segment_info si;
    memset(out, 0, sizeof(*out));
    mg_segment_get_info(p->reg, l->own ? l->own : p->seg, &si);
    out->id = l->idn.id;
    mg_strlcpy(out->tenant, l->tenant, sizeof(out->tenant));
    out->segment_id = si.id;
    mg_strlcpy(out->path, si.path, sizeof(out->path));
    out->offset = l->offset;
    out->requested = l->requested;
    out->reserved = l->reserved;
    out->expires_ms = l->expires_ms;
    out->remote_accessible = l->remote_accessible;
    out->users = l->users;
    out->released = l->released;
}

size_t mg_pool_list(mg_pool *p, const char *tenant, uint64_t after, mg_lease_info *out, size_t max)
{
    /* In id order from the id map's tree: O(log n) a lease; released ones and another
     * tenant's skipped. */
    size_t n = 0;
    for (mg_idmap_node *x = mg_idmap_next(&p->ids, after); x && n < max;
         x = mg_idmap_next(&p->ids, x->id)) {
        const mg_lease *l = mg_container_of(x, mg_lease, idn);
        if (!l->released && (tenant == NULL || strcmp(l->tenant, tenant) == 0))
            mg_lease_get_info(p, l, &out[n++]);
    }
    return n;
}

void mg_pool_get_stats(const mg_pool *p, mg_pool_stats *out)
{
    mg_alloc_stats st;
    mg_alloc_get_stats(p->alloc, &st);
    memset(out, 0, sizeof(*out));
    out->capacity = st.capacity;
    out->reserve = p->cfg.reserve_bytes;
    out->in_use = st.capacity - st.free;
    out->free = st.free;
    out->largest_free = st.largest_range;
    out->largest_lease = st.largest_free;
    out->leases = p->live;
    out->acquired_total = p->acquired_total;
    out->released_total = p->released_total;
    out->expired_total = p->expired_total;
    out->exhausted_total = p->exhausted_total;
    out->overflow_total = p->overflow_total;
    out->overflow_bytes = p->overflow_bytes;
    out->overflow_leases = p->overflow_leases;
}

void mg_pool_count_exhausted(mg_pool *p)
{
    p->exhausted_total++;
}

mg_segment *mg_pool_segment(const mg_pool *p)
{
    return p->seg;
}

int mg_lease_released(const mg_lease *l)
{
    return l->released;
}

uint8_t *mg_lease_addr(const mg_pool *p, const mg_lease *l)
{
    return l->own ? (uint8_t *)mg_segment_addr(l->own) : p->base + l->offset;
}
