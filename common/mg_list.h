/*
 * mg_list: an intrusive doubly linked list, h2o's linklist shape. An object that lives on a
 * list embeds an mg_list_node; the list is a sentinel node, so insert and remove are O(1) with
 * no special case, and a node knows whether it is on a list. mg_container_of() gets the object
 * back from its node. Not thread-safe: the list's owner serialises.
 *
 *     typedef struct conn { ...; mg_list_node link; } conn;
 *     mg_list conns;            mg_list_init(&conns);
 *     mg_list_push_back(&conns, &c->link);
 *     mg_list_foreach_safe(&conns, n, next) { conn *c = mg_container_of(n, conn, link); ... }
 */
#ifndef MG_LIST_H
#define MG_LIST_H

#include <stddef.h>

#define mg_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

typedef struct mg_list_node {
    struct mg_list_node *prev, *next; /* both NULL while on no list */
} mg_list_node;

typedef mg_list_node mg_list; /* the sentinel: next is the first node, prev the last */

static inline void mg_list_init(mg_list *l)
{
    l->prev = l->next = l;
}

static inline int mg_list_empty(const mg_list *l)
{
    return l->next == l;
}

static inline int mg_list_linked(const mg_list_node *n)
{
    return n->next != NULL;
}

static inline void mg_list_insert_before(mg_list_node *pos, mg_list_node *n)
{
    n->prev = pos->prev;
    n->next = pos;
    pos->prev->next = n;
    pos->prev = n;
}

static inline void mg_list_push_back(mg_list *l, mg_list_node *n)
{
    mg_list_insert_before(l, n);
}

static inline void mg_list_push_front(mg_list *l, mg_list_node *n)
{
    mg_list_insert_before(l->next, n);
}

static inline void mg_list_remove(mg_list_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* The first node, or NULL for an empty list. */
static inline mg_list_node *mg_list_first(const mg_list *l)
{
    return mg_list_empty(l) ? NULL : l->next;
}

#define mg_list_foreach(l, n) for (mg_list_node *n = (l)->next; n != (l); n = n->next)
/* The body may remove n (and only n). */
#define mg_list_foreach_safe(l, n, nx) \
    for (mg_list_node *n = (l)->next, *nx = n->next; n != (l); n = nx, nx = n->next)

#endif
