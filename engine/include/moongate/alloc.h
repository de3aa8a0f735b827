/*
 * moongate offset allocator: hands out byte ranges of a fixed region (a pool) in O(1).
 *
 * Free ranges sit in 256 size-class bins: each power-of-two range of sizes is split into 8 equal
 * steps (a small float with a 3-bit mantissa), and a two-level bitmap says which bins hold a free
 * range. An allocation rounds its size up to the next class boundary (at most 12.5% more, the
 * "reserved" length) and takes a range from the first non-empty bin of that class or above;
 * what is left of the range goes back as a free range. Freeing merges a range with free
 * neighbours. Sizes and offsets are multiples of the granule (e.g. 4096).
 *
 * Not thread-safe: one owner (the pool) serialises calls.
 */
#ifndef MOONGATE_ALLOC_H
#define MOONGATE_ALLOC_H

#include <stdint.h>

#include "moongate/mg_error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_alloc mg_alloc;

typedef struct mg_alloc_stats {
    uint64_t capacity;      /* bytes under management */
    uint64_t free;          /* bytes in free ranges */
    uint64_t largest_free;  /* the largest allocation that succeeds now (alignment: granule) */
    uint64_t largest_range; /* the largest free range (>= largest_free: sizes round up) */
    uint32_t allocations;   /* ranges handed out */
    uint32_t free_ranges;
} mg_alloc_stats;

/* A region of `capacity` bytes (a multiple of granule; at most 2^31 granules) in granules of
 * `granule` bytes (a power of two), for at most `max_allocations` ranges at a time. Returns 0,
 * MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_alloc_new(mg_alloc **out, uint64_t capacity, uint64_t granule, uint32_t max_allocations);
void mg_alloc_del(mg_alloc *a);

/* Takes a range of at least `size` bytes whose offset is a multiple of `alignment` (0 or a power
 * of two; below the granule means the granule). Returns 0 with the range's offset, its reserved
 * length (size rounded up to its class: at most 12.5% + one granule more) and a handle for
 * mg_alloc_free(); MG_ERR_INVALID (size 0, bad alignment, or more than the capacity) or
 * MG_ERR_FULL (no free range fits, or max_allocations reached). */
int mg_alloc_take(mg_alloc *a, uint64_t size, uint64_t alignment, uint64_t *offset,
                  uint64_t *reserved, uint32_t *handle);
/* Returns a range. Returns 0, or MG_ERR_NOT_FOUND for a handle that is not a live range. */
int mg_alloc_give(mg_alloc *a, uint32_t handle);

void mg_alloc_get_stats(const mg_alloc *a, mg_alloc_stats *out);
/* The reserved length mg_alloc_take() would give `size` (alignment aside); 0 when too large. */
uint64_t mg_alloc_reserved_for(const mg_alloc *a, uint64_t size);

#ifdef __cplusplus
}
#endif

#endif
