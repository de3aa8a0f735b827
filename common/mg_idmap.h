/*
 * mg_idmap: 64-bit ids to the records that own them, for the engine's tables (the segment
 * registry, the buffer pools). Intrusive: a record embeds an mg_idmap_node; the map is a fixed
 * power-of-two array of bucket chains, sized once for the table's limit.
 *
 * The map mints the ids: mg_mix64 of a counter that starts at a random value, so ids are unique
 * in the map, never 0, and reveal neither their order nor how many came before.
 *
 * The records are also kept in id order, in a binary search tree: listing a page after an id
 * (mg_idmap_next) costs O(log n) a record, not a scan of the table. The ids are as good as
 * random, so the tree stays balanced in expectation (depth about 2 ln n) without rebalancing.
 *
 * Not thread-safe: the owner's lock (if any) covers it.
 */
#ifndef MG_IDMAP_H
#define MG_IDMAP_H

#include "mg_hash.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>

typedef struct mg_idmap_node {
    uint64_t id;
    struct mg_idmap_node *next;         /* its bucket's chain */
    struct mg_idmap_node *left, *right; /* the id-ordered tree */
} mg_idmap_node;

typedef struct mg_idmap {
    mg_idmap_node **buckets;
    size_t mask;
    uint64_t counter;
    mg_idmap_node *root; /* the id-ordered tree */
} mg_idmap;

/* A map of `nbuckets` chains (a power of two). Returns 0 or -1 (out of memory). */
static inline int mg_idmap_init(mg_idmap *m, size_t nbuckets)
{
    m->buckets = calloc(nbuckets, sizeof(*m->buckets));
    m->mask = nbuckets - 1;
    m->root = NULL;
    if (getrandom(&m->counter, sizeof(m->counter), 0) != sizeof(m->counter))
        m->counter = (uint64_t)(uintptr_t)m ^ (uint64_t)(uintptr_t)m->buckets;
    return m->buckets ? 0 : -1;
}

/* Frees the buckets (the records are the owner's). Accepts a map whose init failed. */
static inline void mg_idmap_free(mg_idmap *m)
{
    free(m->buckets);
    m->buckets = NULL;
}

static inline mg_idmap_node *mg_idmap_find(const mg_idmap *m, uint64_t id)
{
    mg_idmap_node *n = m->buckets[mg_mix64(id) & m->mask];
    while (n && n->id != id)
        n = n->next;
    return n;
}

/* A fresh id, not yet entered (mg_idmap_insert): a record may need its id before it joins. */
static inline uint64_t mg_idmap_mint(mg_idmap *m)
{
    uint64_t id;
    do {
        id = mg_mix64(++m->counter);
    } while (id == 0 || mg_idmap_find(m, id));
    return id;
}

/* Enters n under the id it has (minted by m). */
static inline void mg_idmap_insert(mg_idmap *m, mg_idmap_node *n)
{
    mg_idmap_node **b = &m->buckets[mg_mix64(n->id) & m->mask], **t = &m->root;
    n->next = *b;
    *b = n;
    while (*t)
        t = n->id < (*t)->id ? &(*t)->left : &(*t)->right;
    n->left = n->right = NULL;
    *t = n;
}

/* Gives n a fresh id and enters it. Returns the id. */
static inline uint64_t mg_idmap_add(mg_idmap *m, mg_idmap_node *n)
{
    n->id = mg_idmap_mint(m);
    mg_idmap_insert(m, n);
    return n->id;
}

/* Takes n out of the map (no-op when it is not in it). */
static inline void mg_idmap_remove(mg_idmap *m, mg_idmap_node *n)
{
    mg_idmap_node **pp = &m->buckets[mg_mix64(n->id) & m->mask], **t = &m->root;
    while (*pp && *pp != n)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return;
    *pp = n->next;
    while (*t != n) /* n is in the tree: its path by id */
        t = n->id < (*t)->id ? &(*t)->left : &(*t)->right;
    if (n->left == NULL) {
        *t = n->right;
    } else if (n->right == NULL) {
        *t = n->left;
    } else { /* its successor, the smallest of its right subtree, takes its place */
        mg_idmap_node **s = &n->right, *succ;
        while ((*s)->left)
            s = &(*s)->left;
        succ = *s;
        *s = succ->right;
        succ->left = n->left;
        succ->right = n->right;
        *t = succ;
    }
}

/* The record with the smallest id above `after` (0: the first), or NULL. O(depth). */
static inline mg_idmap_node *mg_idmap_next(const mg_idmap *m, uint64_t after)
{
    mg_idmap_node *best = NULL;
    for (mg_idmap_node *x = m->root; x;)
        if (x->id > after) {
            best = x;
            x = x->left;
        } else {
            x = x->right;
        }
    return best;
}

#endif
