/*
 * moongate pool: a region registered once (a segment the pool holds) and sliced into leases.
 *
 * The region is split in two: the lease area, which the offset allocator (moongate/alloc.h)
 * hands out, and the reserve after it, which no lease can take (engine staging, inline copies).
 * A lease is an id, an owner tenant, an offset, the requested and the reserved (rounded)
 * length, an expiry and a count of operations using it. Acquire, renew, release and expiry are
 * O(1) (release of a lease in use waits for its last user), so they run on the loop thread;
 * only the registration of the region runs on a worker.
 *
 * Loop thread only.
 */
#ifndef MOONGATE_POOL_H
#define MOONGATE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_pool mg_pool;
typedef struct mg_lease mg_lease;

#define MG_POOL_GRANULE  4096u
#define MG_LEASE_RETRY   1 /* mg_pool_acquire: a retry of an acquired request id */
#define MG_POOL_NAME_MAX 64

typedef struct mg_pool_config {
    const char *name;       /* "default" */
    uint64_t lease_bytes;   /* the lease area: a multiple of MG_POOL_GRANULE */
    uint64_t reserve_bytes; /* after it; leases never take it */
    uint32_t max_leases;
    uint64_t max_tenant_leases; /* live leases of one tenant; 0: no quota */
    uint64_t max_ttl_ms;        /* longest TTL a lease may ask for */
    /* Overflow leases (mg_pool_adopt) own a segment; when such a lease ends the pool hands its
     * segment (and the reference the lease held) to this callback to unregister. */
    void (*drop_overflow)(void *arg, mg_segment *seg);
    void *drop_arg;
} mg_pool_config;

typedef struct mg_lease_info {
    uint64_t id;
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t segment_id; /* the pool's segment */
    char path[4096 + 1]; /* its file */
    uint64_t offset;     /* in the segment */
    uint64_t requested, reserved;
    uint64_t expires_ms; /* monotonic milliseconds */
    int remote_accessible;
    uint32_t users; /* operations using the lease now */
    int released;   /* released or expired while in use: freed when the last user ends */
} mg_lease_info;

typedef struct mg_pool_stats {
    uint64_t capacity; /* the lease area */
    uint64_t reserve;
    uint64_t in_use; /* reserved bytes of live leases */
    uint64_t free;
    uint64_t largest_free;  /* the largest free range */
    uint64_t largest_lease; /* the largest lease that can be served now (<= largest_free) */
    uint64_t leases;
    uint64_t acquired_total, released_total, expired_total, exhausted_total;
    uint64_t overflow_total;  /* leases given their own registered region */
    uint64_t overflow_bytes;  /* bytes of those alive now */
    uint64_t overflow_leases; /* of them alive now */
} mg_pool_stats;

/* A pool on `seg`, a READY segment of at least lease_bytes + reserve_bytes that the caller
 * acquired a reference on for the pool (the pool keeps it until mg_pool_del). Returns 0,
 * MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_pool_new(mg_pool **out, mg_registry *reg, mg_segment *seg, const mg_pool_config *cfg);
/* Frees the pool, its leases and its reference on the segment. Accepts NULL. */
void mg_pool_del(mg_pool *p);
const char *mg_pool_name(const mg_pool *p);

/* Takes a lease of `size` bytes (alignment 0 or a power of two) for `tenant`, valid `ttl_ms`
 * from `now_ms`. `request_id` (optional, printable, <= 128 bytes): a retry returns the live
 * lease the first request got (MG_LEASE_RETRY). Returns 0 or MG_LEASE_RETRY with the lease;
 * MG_ERR_INVALID (size 0, larger than the pool, bad alignment or TTL, request id used for
 * another size); MG_ERR_FULL (no room now, or max_leases: err says requested, free and largest
 * free bytes). err has MG_SEG_ERROR_MAX bytes. */
int mg_pool_acquire(mg_pool *p, const char *tenant, uint64_t size, uint64_t alignment,
                    uint64_t ttl_ms, uint64_t now_ms, const char *request_id, mg_lease **out,
                    char *err);
/* An overflow lease: `seg` (READY, referenced for the lease) is the lease's own region, of at
 * least `size` bytes. Counted apart; when the lease ends, drop_overflow gets the segment.
 * Returns 0, MG_ERR_FULL (max_leases) or MG_ERR_NOMEM. */
int mg_pool_adopt(mg_pool *p, const char *tenant, mg_segment *seg, uint64_t size, uint64_t ttl_ms,
                  uint64_t now_ms, mg_lease **out);
/* Finds a live (not released) lease of `tenant` (NULL: of any tenant, for admins). Returns 0 or
 * MG_ERR_NOT_FOUND. */
int mg_pool_find(mg_pool *p, const char *tenant, uint64_t id, mg_lease **out);
/* Ends a lease: its range returns to the pool now, or when its last user ends. */
void mg_pool_release(mg_pool *p, mg_lease *l);
/* Extends a live lease to now_ms + ttl_ms. Returns 0 or MG_ERR_INVALID (TTL). */
int mg_pool_renew(mg_pool *p, mg_lease *l, uint64_t ttl_ms, uint64_t now_ms);
void mg_lease_set_remote(mg_lease *l, int remote_accessible);
/* Whether the lease was released (or expired, or revoked) and waits for its last user. */
int mg_lease_released(const mg_lease *l);
/* The tenant owning the lease. */
const char *mg_lease_tenant(const mg_lease *l);
/* An operation starts or stops using the lease (a released lease is freed on the last stop). */
void mg_lease_use(mg_lease *l);
void mg_lease_unuse(mg_pool *p, mg_lease *l);
/* Releases the leases whose expiry is at or before now_ms. Returns how many. */
unsigned mg_pool_expire(mg_pool *p, uint64_t now_ms);
/* Releases every lease (shutdown). Returns how many were live. */
unsigned mg_pool_revoke_all(mg_pool *p);

void mg_lease_get_info(const mg_pool *p, const mg_lease *l, mg_lease_info *out);
/* The tenant's live leases (all tenants when NULL) with id > after, in id order, at most max.
 * Returns how many were written. */
size_t mg_pool_list(mg_pool *p, const char *tenant, uint64_t after, mg_lease_info *out, size_t max);
void mg_pool_get_stats(const mg_pool *p, mg_pool_stats *out);
/* Counts an acquire that could not be served at once for want of room (refused or made to
 * wait): the caller decides, once per request. */
void mg_pool_count_exhausted(mg_pool *p);
/* The segment of the pool and the address of a lease's first byte. */
mg_segment *mg_pool_segment(const mg_pool *p);
uint8_t *mg_lease_addr(const mg_pool *p, const mg_lease *l);

#ifdef __cplusplus
}
#endif

#endif
