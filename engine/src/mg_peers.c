/*
 * mg_peers: the peer descriptor cache (see moongate/peers.h).
 *
 * Per peer: a chained hash of descriptors keyed by (id, is_lease) over a fixed node array, and
 * the nodes in insertion order for eviction (the oldest goes when the peer's table is full).
 */
#include "moongate/peers.h"
#include "moongate/segment.h"

#include "mg_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE 0xffffffffu

typedef struct node {
    mg_remote_desc d;
    uint32_t chain;        /* next in the bucket */
    uint32_t older, newer; /* insertion order */
} node;

typedef struct peer {
    mg_peer_info info;
    node *nodes;
    uint32_t *buckets;
    uint32_t *spare;
    size_t nspare;
    uint32_t oldest, newest;
} peer;

struct mg_peer_cache {
    size_t max_peers, max_descs, nbuckets, npeers;
    peer *peers;
};

static uint64_t key_hash(uint64_t id, int is_lease)
{
    return mg_mix64(id ^ (is_lease ? 0x9e3779b97f4a7c15ULL : 0));
}

static void peer_clear(mg_peer_cache *c, peer *p)
{
    for (size_t b = 0; b < c->nbuckets; b++)
        p->buckets[b] = NONE;
    for (size_t i = 0; i < c->max_descs; i++)
        p->spare[i] = (uint32_t)(c->max_descs - 1 - i);
    p->nspare = c->max_descs;
    p->oldest = p->newest = NONE;
    p->info.descs = 0;
}

int mg_peer_cache_new(mg_peer_cache **out, size_t max_peers, size_t max_descs)
{
    mg_peer_cache *c;
    if (max_peers == 0 || max_descs == 0 || max_descs > (1u << 24) || max_peers > 65536)
        return MG_ERR_INVALID;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return MG_ERR_NOMEM;
    c->max_peers = max_peers;
    c->max_descs = max_descs;
    c->nbuckets = 16;
    while (c->nbuckets < max_descs)
        c->nbuckets <<= 1;
    c->peers = calloc(max_peers, sizeof(*c->peers));
    if (c->peers == NULL) {
        free(c);
        return MG_ERR_NOMEM;
    }
    *out = c;
    return 0;
}

void mg_peer_cache_del(mg_peer_cache *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->npeers; i++) {
        free(c->peers[i].nodes);
        free(c->peers[i].buckets);
        free(c->peers[i].spare);
    }
    free(c->peers);
    free(c);
}

static peer *find_peer(const mg_peer_cache *c, const char *name)
{
    for (size_t i = 0; i < c->npeers; i++) {
        if (strcmp(c->peers[i].info.name, name) == 0)
            return &c->peers[i];
    }
    return NULL;
}

int mg_peer_cache_epoch(mg_peer_cache *c, const char *name, uint64_t epoch, uint64_t now_ms)
{
    peer *p;
    if (name == NULL || *name == '\0' || strlen(name) > MG_PEER_NAME_MAX || epoch == 0)
        return MG_ERR_INVALID;
    p = find_peer(c, name);
    if (p) {
        p->info.seen_ms = now_ms;
        if (p->info.epoch == epoch)
            return 0;
        p->info.epoch = epoch; /* a restart: what we knew belongs to its previous life */
        p->info.epoch_changes++;
        peer_clear(c, p);
        return 1;
    }
    if (c->npeers >= c->max_peers)
        return MG_ERR_FULL;
    p = &c->peers[c->npeers];
    memset(p, 0, sizeof(*p));
    p->nodes = calloc(c->max_descs, sizeof(*p->nodes));
    p->buckets = calloc(c->nbuckets, sizeof(*p->buckets));
    p->spare = calloc(c->max_descs, sizeof(*p->spare));
    if (p->nodes == NULL || p->buckets == NULL || p->spare == NULL) {
        free(p->nodes);
        free(p->buckets);
        free(p->spare);
        return MG_ERR_NOMEM;
    }
    snprintf(p->info.name, sizeof(p->info.name), "%s", name);
    p->info.epoch = epoch;
    p->info.seen_ms = now_ms;
    peer_clear(c, p);
    c->npeers++;
    return 1;
}

/* The node of (id, is_lease), or NONE; *slot gets the link that points at it. */
static uint32_t find_node(const mg_peer_cache *c, peer *p, uint64_t id, int is_lease,
                          uint32_t **slot)
{
    uint32_t *at = &p->buckets[key_hash(id, is_lease) & (c->nbuckets - 1)];
    while (*at != NONE) {
        node *n = &p->nodes[*at];
        if (n->d.id == id && (n->d.is_lease != 0) == (is_lease != 0))
            break;
        at = &n->chain;
    }
    if (slot)
        *slot = at;
    return *at;
}

static void remove_node(mg_peer_cache *c, peer *p, uint32_t i)
{
    uint32_t *slot;
    node *n = &p->nodes[i];
    find_node(c, p, n->d.id, n->d.is_lease, &slot);
    *slot = n->chain;
    if (n->older != NONE)
        p->nodes[n->older].newer = n->newer;
    else
        p->oldest = n->newer;
    if (n->newer != NONE)
        p->nodes[n->newer].older = n->older;
    else
        p->newest = n->older;
    p->spare[p->nspare++] = i;
    p->info.descs--;
}

uint64_t mg_peer_cache_epoch_of(const mg_peer_cache *c, const char *name)
{
    const peer *p = find_peer(c, name);
    return p ? p->info.epoch : 0;
}

int mg_peer_cache_put(mg_peer_cache *c, const char *name, uint64_t epoch, const mg_remote_desc *d)
{
    peer *p = find_peer(c, name);
    uint32_t i, *slot;
    node *n;
    if (p == NULL || p->info.epoch != epoch)
        return MG_ERR_NOT_FOUND;
    i = find_node(c, p, d->id, d->is_lease, &slot);
    if (i != NONE) { /* newer news of a known target */
        p->nodes[i].d = *d;
        return 0;
    }
    if (p->nspare == 0)
        remove_node(c, p, p->oldest);
    i = p->spare[--p->nspare];
    n = &p->nodes[i];
    n->d = *d;
    n->chain = p->buckets[key_hash(d->id, d->is_lease) & (c->nbuckets - 1)];
    p->buckets[key_hash(d->id, d->is_lease) & (c->nbuckets - 1)] = i;
    n->older = p->newest;
    n->newer = NONE;
    if (p->newest != NONE)
        p->nodes[p->newest].newer = i;
    else
        p->oldest = i;
    p->newest = i;
    p->info.descs++;
    return 0;
}

int mg_peer_cache_get(mg_peer_cache *c, const char *name, uint64_t id, int is_lease,
                      mg_remote_desc *out, uint64_t *epoch)
{
    peer *p = find_peer(c, name);
    uint32_t i;
    if (p == NULL || (i = find_node(c, p, id, is_lease, NULL)) == NONE)
        return MG_ERR_NOT_FOUND;
    *out = p->nodes[i].d;
    if (epoch)
        *epoch = p->info.epoch;
    return 0;
}

int mg_peer_cache_check(mg_peer_cache *c, const char *name, const char *addr, uint64_t id,
                        int is_lease, uint64_t offset, uint64_t length, uint64_t *size, char *why,
                        size_t cap)
{
    const char *kind = is_lease ? "lease" : "segment";
    mg_remote_desc d;
    if (mg_peer_cache_get(c, name, id, is_lease, &d, NULL) != 0)
        return MG_ERR_NOT_FOUND;
    if (!d.remote_accessible) {
        snprintf(why, cap, "%s %llu on peer %s is not remote-accessible", kind,
                 (unsigned long long)id, addr);
        return MG_ERR_PERMISSION;
    }
    if (mg_bounds_check(d.size, offset, length) != 0) {
        snprintf(why, cap, "remote offset + length is outside %s %llu on peer %s (%llu bytes)",
                 kind, (unsigned long long)id, addr, (unsigned long long)d.size);
        return MG_ERR_RANGE;
    }
    *size = d.size;
    return 0;
}

void mg_peer_cache_forget(mg_peer_cache *c, const char *name, uint64_t id, int is_lease)
{
    peer *p = find_peer(c, name);
    uint32_t i;
    if (p && (i = find_node(c, p, id, is_lease, NULL)) != NONE)
        remove_node(c, p, i);
}

size_t mg_peer_cache_list(const mg_peer_cache *c, mg_peer_info *out, size_t max)
{
    size_t n = 0;
    for (; n < c->npeers && n < max; n++)
        out[n] = c->peers[n].info;
    return n;
}
