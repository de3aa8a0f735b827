/*
 * A reference model of the offset allocator for tests and the fuzz target: it owns a map of
 * every granule and checks each operation of the real allocator against it — ranges inside the
 * region, never overlapping, aligned, reserved length within the 12.5% bound, every byte
 * accounted for, a request up to largest_free always served, and a region that is one free
 * range again once everything is given back. A broken rule abort()s with a message.
 */
#ifndef MG_ALLOC_MODEL_H
#define MG_ALLOC_MODEL_H

#include "moongate/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mg_alloc *a;
    uint64_t granule, capacity;
    uint32_t max;
    uint32_t *owner; /* per granule: 0 free, else handle + 1 */
    uint32_t *handles;
    uint64_t *offsets, *lens;
    uint32_t live;
    uint64_t reserved_sum;
} alloc_model;

#define MODEL_FAIL(...)                               \
    do {                                              \
        fprintf(stderr, "alloc model: " __VA_ARGS__); \
        fputc('\n', stderr);                          \
        abort();                                      \
    } while (0)

static int model_open(alloc_model *m, uint64_t capacity, uint64_t granule, uint32_t max)
{
    memset(m, 0, sizeof(*m));
    if (mg_alloc_new(&m->a, capacity, granule, max) != 0)
        return -1;
    m->granule = granule;
    m->capacity = capacity;
    m->max = max;
    m->owner = calloc(capacity / granule, sizeof(*m->owner));
    m->handles = calloc(max, sizeof(*m->handles));
    m->offsets = calloc(max, sizeof(*m->offsets));
    m->lens = calloc(max, sizeof(*m->lens));
    return m->owner && m->handles && m->offsets && m->lens ? 0 : -1;
}

static void model_check_stats(alloc_model *m)
{
    mg_alloc_stats st;
    mg_alloc_get_stats(m->a, &st);
    if (st.capacity != m->capacity || st.allocations != m->live ||
        st.free != m->capacity - m->reserved_sum || st.largest_free > st.largest_range ||
        st.largest_range > st.free || st.largest_range * 8 > st.largest_free * 9)
        MODEL_FAIL("stats: capacity %llu free %llu largest %llu (range %llu) allocations %u; "
                   "model: %u live, %llu reserved",
                   (unsigned long long)st.capacity, (unsigned long long)st.free,
                   (unsigned long long)st.largest_free, (unsigned long long)st.largest_range,
                   st.allocations, m->live, (unsigned long long)m->reserved_sum);
}

/* One take; returns its result code. */
static int model_take(alloc_model *m, uint64_t size, uint64_t alignment)
{
    mg_alloc_stats before;
    uint64_t off = 0, res = 0, units, g;
    uint32_t h = 0;
    int rc;
    mg_alloc_get_stats(m->a, &before);
    rc = mg_alloc_take(m->a, size, alignment, &off, &res, &h);
    if (rc != 0) {
        if (rc == MG_ERR_FULL && size > 0 && size <= before.largest_free &&
            alignment <= m->granule && m->live < m->max)
            MODEL_FAIL("take %llu refused although largest_free is %llu", (unsigned long long)size,
                       (unsigned long long)before.largest_free);
        if (rc != MG_ERR_FULL && rc != MG_ERR_INVALID)
            MODEL_FAIL("take %llu: unexpected code %d", (unsigned long long)size, rc);
        model_check_stats(m);
        return rc;
    }
    units = (size + m->granule - 1) / m->granule * m->granule;
    if (res < size || res * 8 > units * 9 || res % m->granule || off % m->granule ||
        (alignment > m->granule && off % alignment) || off + res > m->capacity)
        MODEL_FAIL("take %llu align %llu -> offset %llu reserved %llu", (unsigned long long)size,
                   (unsigned long long)alignment, (unsigned long long)off, (unsigned long long)res);
    for (g = off / m->granule; g < (off + res) / m->granule; g++) {
        if (m->owner[g])
            MODEL_FAIL("range [%llu, +%llu) overlaps the range of handle %u",
                       (unsigned long long)off, (unsigned long long)res, m->owner[g] - 1);
        m->owner[g] = h + 1;
    }
    m->handles[m->live] = h;
    m->offsets[m->live] = off;
    m->lens[m->live] = res;
    m->live++;
    m->reserved_sum += res;
    model_check_stats(m);
    return 0;
}

/* Gives back live range number k (0 <= k < live). */
static void model_give(alloc_model *m, uint32_t k)
{
    uint64_t g;
    if (mg_alloc_give(m->a, m->handles[k]) != 0)
        MODEL_FAIL("give of live handle %u refused", m->handles[k]);
    for (g = m->offsets[k] / m->granule; g < (m->offsets[k] + m->lens[k]) / m->granule; g++)
        m->owner[g] = 0;
    m->reserved_sum -= m->lens[k];
    m->live--;
    m->handles[k] = m->handles[m->live];
    m->offsets[k] = m->offsets[m->live];
    m->lens[k] = m->lens[m->live];
    model_check_stats(m);
}

/* Gives everything back and checks the region is whole again; frees the model. */
static void model_close(alloc_model *m)
{
    mg_alloc_stats st;
    while (m->live)
        model_give(m, m->live - 1);
    mg_alloc_get_stats(m->a, &st);
    if (st.free != m->capacity || st.free_ranges != 1)
        MODEL_FAIL("after giving everything back: free %llu of %llu in %u ranges",
                   (unsigned long long)st.free, (unsigned long long)m->capacity, st.free_ranges);
    mg_alloc_del(m->a);
    free(m->owner);
    free(m->handles);
    free(m->offsets);
    free(m->lens);
}

#endif
