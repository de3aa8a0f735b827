/*
 * mg_alloc: the O(1) offset allocator (see moongate/alloc.h), after Sebastian Aaltonen's
 * OffsetAllocator, with allocations rounded up to their class so that a freed range returns to
 * the bin it came from (uniform lease sizes then use the whole pool).
 *
 * Units: everything inside is counted in granules (uint32). A size class ("bin") is a small
 * float: 5 bits of exponent, 3 of mantissa; sizes below 8 are exact. Nodes live in one array:
 * a node is either a live allocation or a free range; both are linked to their neighbours in
 * address order (for merging), free ranges also into their bin's list. Invariant: no two free
 * ranges are adjacent.
 */
#include "moongate/alloc.h"

#include <stdlib.h>
#include <string.h>

#define NONE          0xffffffffu
#define MANTISSA_BITS 3
#define MANTISSA_MASK 7u
#define TOP_BINS      32
#define LEAF_BINS     8
#define NBINS         (TOP_BINS * LEAF_BINS)
#define MAX_UNITS     (1u << 31)

typedef struct node {
    uint32_t offset, size;       /* granules */
    uint32_t prev, next;         /* neighbours in address order */
    uint32_t bin_prev, bin_next; /* free ranges: the bin's list */
    uint8_t used;                /* a live allocation */
    uint8_t live;                /* the node is in use (allocation or free range) */
} node;

struct mg_alloc {
    uint64_t granule;
    unsigned shift;
    uint32_t capacity; /* granules */
    uint64_t free;     /* granules */
    uint32_t max_allocations, allocations, free_ranges;
    uint32_t top_used;           /* bit t: some bin t*8..t*8+7 is non-empty */
    uint8_t leaf_used[TOP_BINS]; /* bit l: bin t*8+l is non-empty */
    uint32_t bin_head[NBINS];
    node *nodes;
    uint32_t nnodes;
    uint32_t *spare; /* stack of unused node indices */
    uint32_t nspare;
};

/* ------------------------------------------------------------------ size classes */

static uint32_t highest_bit(uint32_t v)
{
    return 31u - (uint32_t)__builtin_clz(v);
}

static uint32_t bin_round_up(uint32_t size)
{
    uint32_t exp = 0, mantissa, start;
    if (size < (1u << MANTISSA_BITS))
        return size;
    start = highest_bit(size) - MANTISSA_BITS;
    exp = start + 1;
    mantissa = (size >> start) & MANTISSA_MASK;
    if (size & ((1u << start) - 1))
        mantissa++; /* may carry into the exponent: the next power of two */
    return (exp << MANTISSA_BITS) + mantissa;
}

static uint32_t bin_round_down(uint32_t size)
{
    uint32_t start;
    if (size < (1u << MANTISSA_BITS))
        return size;
    start = highest_bit(size) - MANTISSA_BITS;
    return ((start + 1) << MANTISSA_BITS) + ((size >> start) & MANTISSA_MASK);
}

/* The smallest size of a bin (granules; may exceed 32 bits for the top bins). */
static uint64_t bin_size(uint32_t bin)
{
    uint32_t exp = bin >> MANTISSA_BITS, mantissa = bin & MANTISSA_MASK;
    if (exp == 0)
        return mantissa;
    return (uint64_t)(mantissa | (1u << MANTISSA_BITS)) << (exp - 1);
}

/* The lowest set bit of `bits` at or above `from`, or NONE. */
static uint32_t lowest_bit_from(uint32_t bits, uint32_t from)
{
    if (from >= 32)
        return NONE;
    bits &= ~0u << from;
    return bits ? (uint32_t)__builtin_ctz(bits) : NONE;
}

/* ------------------------------------------------------------------ nodes and bins */

static uint32_t node_new(mg_alloc *a)
{
    uint32_t i = a->spare[--a->nspare];
    memset(&a->nodes[i], 0, sizeof(node));
    a->nodes[i].live = 1;
    a->nodes[i].prev = a->nodes[i].next = NONE;
    a->nodes[i].bin_prev = a->nodes[i].bin_next = NONE;
    return i;
}

static void node_drop(mg_alloc *a, uint32_t i)
{
    a->nodes[i].live = 0;
    a->nodes[i].used = 0;
    a->spare[a->nspare++] = i;
}

static void bin_insert(mg_alloc *a, uint32_t i)
{
    node *n = &a->nodes[i];
    uint32_t bin = bin_round_down(n->size), top = bin >> MANTISSA_BITS;
    n->bin_prev = NONE;
    n->bin_next = a->bin_head[bin];
    if (n->bin_next != NONE)
        a->nodes[n->bin_next].bin_prev = i;
    a->bin_head[bin] = i;
    a->top_used |= 1u << top;
    a->leaf_used[top] |= (uint8_t)(1u << (bin & MANTISSA_MASK));
    a->free_ranges++;
}

static void bin_remove(mg_alloc *a, uint32_t i)
{
    node *n = &a->nodes[i];
    uint32_t bin = bin_round_down(n->size), top = bin >> MANTISSA_BITS;
    if (n->bin_prev != NONE)
        a->nodes[n->bin_prev].bin_next = n->bin_next;
    else
        a->bin_head[bin] = n->bin_next;
    if (n->bin_next != NONE)
        a->nodes[n->bin_next].bin_prev = n->bin_prev;
    if (a->bin_head[bin] == NONE) {
        a->leaf_used[top] &= (uint8_t) ~(1u << (bin & MANTISSA_MASK));
        if (a->leaf_used[top] == 0)
            a->top_used &= ~(1u << top);
    }
    a->free_ranges--;
}

/* Links node `i` into the address order right after `after` (NONE: first). */
static void link_after(mg_alloc *a, uint32_t i, uint32_t after, uint32_t before)
{
    a->nodes[i].prev = after;
    a->nodes[i].next = before;
    if (after != NONE)
        a->nodes[after].next = i;
    if (before != NONE)
        a->nodes[before].prev = i;
}

/* ------------------------------------------------------------------ API */

int mg_alloc_new(mg_alloc **out, uint64_t capacity, uint64_t granule, uint32_t max_allocations)
{
    mg_alloc *a;
    uint64_t units;
    uint32_t first;
    if (granule == 0 || (granule & (granule - 1)) || capacity == 0 || capacity % granule ||
        max_allocations == 0 || max_allocations > (1u << 28))
        return MG_ERR_INVALID;
    units = capacity / granule;
    if (units > MAX_UNITS)
        return MG_ERR_INVALID;
    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return MG_ERR_NOMEM;
    a->granule = granule;
    a->shift = (unsigned)__builtin_ctzll(granule);
    a->capacity = (uint32_t)units;
    a->max_allocations = max_allocations;
    a->nnodes = 2 * max_allocations + 2;
    a->nodes = calloc(a->nnodes, sizeof(*a->nodes));
    a->spare = calloc(a->nnodes, sizeof(*a->spare));
    if (a->nodes == NULL || a->spare == NULL) {
        mg_alloc_del(a);
        return MG_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < a->nnodes; i++)
        a->spare[i] = a->nnodes - 1 - i;
    a->nspare = a->nnodes;
    for (uint32_t b = 0; b < NBINS; b++)
        a->bin_head[b] = NONE;
    first = node_new(a);
    a->nodes[first].size = a->capacity;
    bin_insert(a, first);
    a->free = a->capacity;
    *out = a;
    return 0;
}

void mg_alloc_del(mg_alloc *a)
{
    if (a == NULL)
        return;
    free(a->nodes);
    free(a->spare);
    free(a);
}

/* Granules for `size` bytes rounded up to their class; 0 when beyond the capacity. */
static uint32_t reserved_units(const mg_alloc *a, uint64_t size)
{
    uint64_t units = (size + a->granule - 1) >> a->shift, r;
    if (size == 0 || units > a->capacity)
        return 0;
    r = bin_size(bin_round_up((uint32_t)units));
    return r <= a->capacity ? (uint32_t)r : (uint32_t)units;
}

uint64_t mg_alloc_reserved_for(const mg_alloc *a, uint64_t size)
{
    return (uint64_t)reserved_units(a, size) << a->shift;
}

int mg_alloc_take(mg_alloc *a, uint64_t size, uint64_t alignment, uint64_t *offset,
                  uint64_t *reserved, uint32_t *handle)
{
    uint32_t want, align = 1, bin, top, leaf, i, start, head, tail;
    uint64_t need;
    node *n;

    if (alignment & (alignment - 1))
        return MG_ERR_INVALID;
    if (alignment > a->granule) {
        if ((alignment >> a->shift) > a->capacity)
            return MG_ERR_INVALID;
        align = (uint32_t)(alignment >> a->shift);
    }
    want = reserved_units(a, size);
    if (want == 0)
        return MG_ERR_INVALID;
    if (a->allocations >= a->max_allocations || a->nspare < 2)
        return MG_ERR_FULL;
    need = (uint64_t)want + align - 1; /* room to slide the range to an aligned offset */
    if (need > a->capacity)
        return MG_ERR_FULL;

    /* The first non-empty bin whose every range holds `need`. */
    bin = bin_round_up((uint32_t)need);
    top = bin >> MANTISSA_BITS;
    leaf = NONE;
    if (top < TOP_BINS && (a->top_used & (1u << top)))
        leaf = lowest_bit_from(a->leaf_used[top], bin & MANTISSA_MASK);
    if (leaf == NONE) {
        top = lowest_bit_from(a->top_used, top + 1);
        if (top == NONE)
            return MG_ERR_FULL;
        leaf = (uint32_t)__builtin_ctz(a->leaf_used[top]);
    }
    i = a->bin_head[(top << MANTISSA_BITS) | leaf];
    n = &a->nodes[i];
    bin_remove(a, i);

    start = (n->offset + align - 1) & ~(align - 1);
    head = start - n->offset;
    tail = n->size - head - want;
    if (head > 0) { /* the part before the aligned start stays free */
        uint32_t h = node_new(a);
        n = &a->nodes[i];
        a->nodes[h].offset = n->offset;
        a->nodes[h].size = head;
        link_after(a, h, n->prev, i);
        bin_insert(a, h);
    }
    if (tail > 0) { /* and so does the rest */
        uint32_t t = node_new(a);
        n = &a->nodes[i];
        a->nodes[t].offset = start + want;
        a->nodes[t].size = tail;
        link_after(a, t, i, n->next);
        bin_insert(a, t);
    }
    n = &a->nodes[i];
    n->offset = start;
    n->size = want;
    n->used = 1;
    a->free -= want;
    a->allocations++;
    *offset = (uint64_t)start << a->shift;
    *reserved = (uint64_t)want << a->shift;
    *handle = i;
    return 0;
}

int mg_alloc_give(mg_alloc *a, uint32_t handle)
{
    node *n;
    uint32_t p, q;
    if (handle >= a->nnodes || !a->nodes[handle].live || !a->nodes[handle].used)
        return MG_ERR_NOT_FOUND;
    n = &a->nodes[handle];
    a->free += n->size;
    a->allocations--;
    n->used = 0;
    p = n->prev;
    if (p != NONE && !a->nodes[p].used) { /* merge with the free range before */
        bin_remove(a, p);
        n->offset = a->nodes[p].offset;
        n->size += a->nodes[p].size;
        link_after(a, handle, a->nodes[p].prev, n->next);
        node_drop(a, p);
    }
    q = n->next;
    if (q != NONE && !a->nodes[q].used) { /* and with the one after */
        bin_remove(a, q);
        n->size += a->nodes[q].size;
        link_after(a, handle, n->prev, a->nodes[q].next);
        node_drop(a, q);
    }
    bin_insert(a, handle);
    return 0;
}

void mg_alloc_get_stats(const mg_alloc *a, mg_alloc_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->capacity = (uint64_t)a->capacity << a->shift;
    out->free = a->free << a->shift;
    out->allocations = a->allocations;
    out->free_ranges = a->free_ranges;
    if (a->top_used) {
        uint32_t top = highest_bit(a->top_used);
        uint32_t leaf = highest_bit(a->leaf_used[top]);
        uint32_t bin = (top << MANTISSA_BITS) | leaf;
        /* Every range in that bin holds at least its size; a request is served from a bin
         * at or above its own rounded-up class, which that size has exactly. */
        out->largest_free = bin_size(bin) << a->shift;
        /* The largest range is in that bin too: a walk of its (short) list. */
        for (uint32_t i = a->bin_head[bin]; i != NONE; i = a->nodes[i].bin_next) {
            if (((uint64_t)a->nodes[i].size << a->shift) > out->largest_range)
                out->largest_range = (uint64_t)a->nodes[i].size << a->shift;
        }
    }
}
