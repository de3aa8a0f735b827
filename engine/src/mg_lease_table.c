/*
 * mg_lease_table: see moongate/lease_table.h. A chained hash of published leases by id, and a
 * list of withdrawn ones that slices still use.
 */
#include "moongate/lease_table.h"

#include "mg_hash.h"
#include "moongate/segment.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BUCKETS 4096 /* a power of two */

struct mg_lease_slot {
    uint64_t id;
    char tenant[MG_SEG_NAME_MAX + 1];
    uint8_t *addr;
    uint64_t length;
    void *handle;
    unsigned users; /* slices in progress */
    int withdrawn;
    struct mg_lease_slot *next; /* bucket chain, or the withdrawn list */
};

struct mg_lease_table {
    pthread_mutex_t lock;
    mg_lease_slot *buckets[BUCKETS];
    mg_lease_slot *withdrawn; /* still used by a slice */
    size_t collectable;       /* of them, no longer used */
};

static mg_lease_slot **bucket(mg_lease_table *t, uint64_t id)
{
    return &t->buckets[mg_mix64(id) & (BUCKETS - 1)];
}

/* The link that points at lease id's slot (or at the NULL ending its chain). Lock held. */
static mg_lease_slot **find(mg_lease_table *t, uint64_t id)
{
    mg_lease_slot **pp = bucket(t, id);
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    return pp;
}

int mg_lease_table_new(mg_lease_table **out)
{
    mg_lease_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return MG_ERR_NOMEM;
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return 0;
}

static void free_chain(mg_lease_slot *s)
{
    while (s) {
        mg_lease_slot *next = s->next;
        free(s);
        s = next;
    }
}

void mg_lease_table_del(mg_lease_table *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < BUCKETS; i++)
        free_chain(t->buckets[i]);
    free_chain(t->withdrawn);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int mg_lease_table_put(mg_lease_table *t, uint64_t id, const char *tenant, uint8_t *addr,
                       uint64_t length, void *handle)
{
    mg_lease_slot *s = calloc(1, sizeof(*s)), **pp;
    if (s == NULL)
        return MG_ERR_NOMEM;
    s->id = id;
    strncpy(s->tenant, tenant, MG_SEG_NAME_MAX);
    s->addr = addr;
    s->length = length;
    s->handle = handle;
    pthread_mutex_lock(&t->lock);
    pp = find(t, id);
    if (*pp) {
        pthread_mutex_unlock(&t->lock);
        free(s);
        return MG_ERR_EXISTS;
    }
    *pp = s;
    pthread_mutex_unlock(&t->lock);
    return 0;
}

void *mg_lease_table_withdraw(mg_lease_table *t, uint64_t id)
{
    mg_lease_slot **pp, *s;
    void *handle = NULL;
    pthread_mutex_lock(&t->lock);
    pp = find(t, id);
    s = *pp;
    if (s) {
        *pp = s->next;
        if (s->users == 0) {
            handle = s->handle;
            free(s);
        } else { /* the last slice to finish makes it collectable */
            s->withdrawn = 1;
            s->next = t->withdrawn;
            t->withdrawn = s;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return handle;
}

size_t mg_lease_table_collect(mg_lease_table *t, void **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&t->lock);
    if (t->collectable > 0) {
        for (mg_lease_slot **pp = &t->withdrawn; *pp && n < max;) {
            mg_lease_slot *s = *pp;
            if (s->users > 0) {
                pp = &s->next;
                continue;
            }
            *pp = s->next;
            out[n++] = s->handle;
            t->collectable--;
            free(s);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return n;
}

int mg_lease_table_begin(mg_lease_table *t, uint64_t id, const char *tenant, uint64_t offset,
                         uint64_t length, uint8_t **addr, mg_lease_slot **slot)
{
    mg_lease_slot *s;
    int rc = 0;
    pthread_mutex_lock(&t->lock);
    s = *find(t, id);
    if (s == NULL || strcmp(s->tenant, tenant) != 0)
        rc = MG_ERR_NOT_FOUND;
    else if (mg_bounds_check(s->length, offset, length) != 0)
        rc = MG_ERR_RANGE;
    else {
        s->users++;
        *addr = s->addr + offset;
        *slot = s;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void mg_lease_table_end(mg_lease_table *t, mg_lease_slot *slot)
{
    pthread_mutex_lock(&t->lock);
    if (--slot->users == 0 && slot->withdrawn)
        t->collectable++;
    pthread_mutex_unlock(&t->lock);
}

int mg_lease_table_describe(mg_lease_table *t, uint64_t id, const char *tenant, uint64_t *length)
{
    mg_lease_slot *s;
    int rc = MG_ERR_NOT_FOUND;
    pthread_mutex_lock(&t->lock);
    s = *find(t, id);
    if (s && strcmp(s->tenant, tenant) == 0) {
        *length = s->length;
        rc = 0;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}
