/*
 * moongate pool set: the daemon's buffer pools, their lines of blocked acquires, overflow
 * regions and the leases peers may reach.
 *
 * Pools: the default pool (for every tenant without a pool of its own) and up to 16 tenant
 * pools. mg_pools_start() registers each pool's region as a segment ("pool.default",
 * "pool.tenant.NAME", prefaulted) on a worker; `started` reports each one. From then on every
 * lease operation is O(1) bookkeeping on the loop thread:
 *
 *   acquire   now (0 or MG_LEASE_RETRY), or later through `done`: MG_POOLS_WAITING (in the
 *             pool's line, served first come, first served as room appears, so a large request
 *             is never starved by small ones behind it) or MG_POOLS_REGISTERING (the pool is
 *             full and the set gives the lease a region of its own: overflow). Until `done`
 *             runs, mg_pools_cancel() takes the acquire back.
 *   publish   a remote-accessible lease goes into the lease table for the data plane, held in
 *             use, and gets its own RDMA registration on a worker (peers reach it over TCP
 *             until then). When the lease ends its key is deregistered first, then its range
 *             goes back to the pool: publish/unpublish never hands a peer a key to bytes that
 *             are someone else's.
 *   expire    the caller's timer passes the time in (mg_pools_expire): leases past their TTL
 *             end, waits past their deadline fail with MG_ERR_TIMEOUT.
 *
 * Time is passed in; the set knows no event loop. Loop thread only, except where noted.
 */
#ifndef MOONGATE_POOLS_H
#define MOONGATE_POOLS_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/engine.h"
#include "moongate/lease_table.h"
#include "moongate/mg_error.h"
#include "moongate/pool.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_pools mg_pools;
typedef struct mg_pools_wait mg_pools_wait;

#define MG_POOLS_MAX         17 /* the default pool and up to 16 tenant pools */
#define MG_POOLS_WAITING     2  /* mg_pools_acquire: in the pool's line; `done` answers */
#define MG_POOLS_REGISTERING 3  /* mg_pools_acquire: an overflow region is being registered */

typedef struct mg_pools_tenant {
    const char *tenant; /* the pool's tenant: only its leases come from it */
    uint64_t bytes;     /* a multiple of MG_POOL_GRANULE */
} mg_pools_tenant;

typedef struct mg_pools_config {
    mg_registry *reg;
    mg_engine *engine;      /* registrations, RDMA keys of published leases */
    mg_cq *cq;              /* the loop's completion queue */
    struct mg_rdma *rdma;   /* published leases get their own registration; NULL: none */
    mg_lease_table *leases; /* where remote-accessible leases are published; NULL: no data plane */
    mg_memlock memlock;
    uint64_t default_bytes; /* the default pool's lease area; 0: no default pool */
    uint64_t default_reserve_bytes;
    const mg_pools_tenant *tenants;
    size_t n_tenants; /* at most MG_POOLS_MAX - 1 */
    uint32_t max_leases;
    uint64_t max_tenant_leases;
    uint64_t max_ttl_ms;
    int overflow;                /* a lease the pool cannot hold gets its own region */
    uint64_t overflow_max_bytes; /* bytes of overflow regions alive or being registered */
} mg_pools_config;

/* An acquire, answered later. rc 0 or MG_LEASE_RETRY with the lease of `pool`, else an MG_ERR_*
 * with err saying why. Runs once per MG_POOLS_WAITING or MG_POOLS_REGISTERING, unless the
 * acquire was cancelled first. */
typedef void (*mg_pools_done_fn)(void *arg, int rc, mg_pool *pool, mg_lease *l, const char *err);

typedef struct mg_pools_req {
    const char *tenant;
    uint64_t size, alignment, ttl_ms;
    const char *request_id; /* optional: a retry returns the first request's lease */
    int remote;             /* publish the lease for peers */
    int block;              /* wait in line when the pool is full */
    uint64_t deadline_ms;   /* a wait in line ends here (monotonic ms); 0: only on cancel */
} mg_pools_req;

/* A set from cfg (copied; strings too). Nothing is registered yet. Returns 0, MG_ERR_INVALID
 * (a pool's bytes, too many pools) or MG_ERR_NOMEM. */
int mg_pools_new(mg_pools **out, const mg_pools_config *cfg);
/* Registers every pool's region on the workers; started(arg, rc) runs once per pool when its
 * registration ends (rc 0 or an MG_ERR_*, logged). *pending: how many will report. Returns 0
 * or an MG_ERR_* (logged; pools already started still report). */
int mg_pools_start(mg_pools *ps, void (*started)(void *arg, int rc), void *arg, unsigned *pending);
/* Fails every wait in line with MG_ERR_SHUTDOWN (drain). */
void mg_pools_drain(mg_pools *ps);
/* After the data plane and the workers stopped: drains, withdraws and deregisters published
 * leases, revokes the leases and frees the pools. Accepts NULL. */
void mg_pools_del(mg_pools *ps);

/* The pool `tenant`'s leases come from: its own, else the default pool. NULL with *rc
 * MG_ERR_NOT_FOUND (no pool for it) or MG_ERR_UNAVAILABLE (not registered yet). */
mg_pool *mg_pools_for(mg_pools *ps, const char *tenant, int *rc);

/* Acquires a lease of `pool` (from mg_pools_for). Returns 0 or MG_LEASE_RETRY with *out;
 * MG_POOLS_WAITING or MG_POOLS_REGISTERING with *wait (done answers later); or an MG_ERR_* with
 * err (MG_SEG_ERROR_MAX bytes) saying why. */
int mg_pools_acquire(mg_pools *ps, mg_pool *pool, const mg_pools_req *req, uint64_t now_ms,
                     mg_pools_done_fn done, void *arg, mg_pools_wait **wait, mg_lease **out,
                     char *err);
/* All or nothing: n leases of `pool` (no waiting, no overflow). Returns 0 with out[0..n), or an
 * MG_ERR_* with *failed the index of the item refused and err why (no lease was taken). */
int mg_pools_acquire_all(mg_pools *ps, mg_pool *pool, const mg_pools_req *reqs, size_t n,
                         uint64_t now_ms, mg_lease **out, size_t *failed, char *err);
/* Takes back an acquire answered later; its `done` does not run. */
void mg_pools_cancel(mg_pools_wait *w);

/* Lease `id` of `scope`'s pool (NULL: searched in every pool, for admins). Returns 0 with the
 * pool and lease, or MG_ERR_NOT_FOUND. */
int mg_pools_find(mg_pools *ps, const char *scope, uint64_t id, mg_pool **pool, mg_lease **out);
/* Ends a lease and serves the waits its room lets through. */
void mg_pools_release(mg_pools *ps, mg_pool *pool, mg_lease *l);
/* Up to `max` leases with id > after, in id order: `scope`'s in its pool, or (NULL) every
 * tenant's in every pool. pools[i] is the pool of out[i]. Returns 0 with *n, or MG_ERR_NOMEM. */
int mg_pools_list(mg_pools *ps, const char *scope, uint64_t after, mg_lease_info *out,
                  mg_pool **pools, size_t max, size_t *n);
/* Ends leases past their TTL and waits past their deadline; withdraws published leases whose
 * last data-plane slice ended. Returns how many leases expired. */
unsigned mg_pools_expire(mg_pools *ps, uint64_t now_ms);

/* An operation uses lease `lease_id` of `tenant`: takes a reference on its segment for
 * `holder` and marks the lease used (a release then waits for mg_pools_unuse). Gives the
 * segment, the lease's offset in it and its requested length, and a token for unuse. Returns 0
 * or MG_ERR_NOT_FOUND. The caller puts the segment reference itself. */
int mg_pools_use(mg_pools *ps, const char *tenant, uint64_t lease_id, const char *holder,
                 mg_segment **seg, uint64_t *offset, uint64_t *length, void **token);
/* Accepts NULL tokens. */
void mg_pools_unuse(mg_pools *ps, void *token);
/* A tenant's range [offset, offset + length) of its segment `segment` or its lease `lease`
 * (exactly one of them non-zero; ps may be NULL: no leases), held for `holder` as by
 * mg_pools_use or mg_registry_acquire: *seg referenced, *token the lease's (NULL for a segment),
 * *addr its first byte. Returns 0, MG_ERR_NOT_FOUND (the tenant has no such segment or lease)
 * or MG_ERR_RANGE (outside it); on failure nothing is held. */
int mg_pools_resolve(mg_pools *ps, mg_registry *reg, const char *tenant, uint64_t segment,
                     uint64_t lease, uint64_t offset, uint64_t length, const char *holder,
                     mg_segment **seg, void **token, uint8_t **addr);
/* A published lease's own RDMA registration: where its bytes start and its key on each device
 * (rkeys: room for 8). Returns 0, or MG_ERR_NOT_FOUND when it has none (yet). */
int mg_pools_lease_rdma(mg_pools *ps, uint64_t lease_id, uint64_t *addr, uint32_t *rkeys,
                        unsigned *n);

/* How many pools, and pool i's name, tenant ("" for the default pool), stats and waits in
 * line. Returns 0, MG_ERR_NOT_FOUND (no pool i) or MG_ERR_UNAVAILABLE (not registered yet;
 * name and tenant are set). */
size_t mg_pools_count(const mg_pools *ps);
typedef struct mg_pools_entry_info {
    const char *name;
    const char *tenant;
    mg_pool_stats stats;
    uint64_t waiters;
    uint64_t segment_id;
    char path[4097];
} mg_pools_entry_info;
int mg_pools_get(mg_pools *ps, size_t i, mg_pools_entry_info *out);

#ifdef __cplusplus
}
#endif

#endif
