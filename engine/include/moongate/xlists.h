/*
 * moongate prepared lists: ranges of memory a caller names once (PrepareList) and its later
 * batches name by index (SubmitRequest.prepared) — NIXL's prepared descriptor lists, so that a
 * batch of 10,000 ranges sends 10,000 indexes, not 10,000 addresses and lengths.
 *
 * A list is the caller's own memory by address (peer and agent "": checked by the front when
 * it is made, each range in one region of the caller's process) or an agent's memory (named as
 * a request names it, checked by the front against the agent's regions where the daemon knows
 * them, else when a batch uses it). A list
 * belongs to its owner (the front's id of the connection that made it) and its tenant: no
 * other may use it. Bounded: at most max_ranges ranges in all the daemon's lists.
 *
 * Loop thread only.
 */
#ifndef MOONGATE_XLISTS_H
#define MOONGATE_XLISTS_H

#include "mg_idmap.h"
#include "moongate/agents.h"
#include "moongate/peers.h"
#include "moongate/segment.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_XLISTS_MAX_RANGES (1u << 22) /* ranges in all of a daemon's lists: 64 MiB of them */

typedef struct mg_xlist {
    mg_idmap_node node; /* node.id: the list's id */
    uint64_t owner;     /* the front's id of the connection that made it */
    char tenant[MG_SEG_NAME_MAX + 1];
    char peer[MG_PEER_NAME_MAX + 1];   /* "" for this daemon */
    char agent[MG_AGENT_NAME_MAX + 1]; /* "" (with peer ""): the owner's own memory */
    uint32_t n;
    uint64_t *addrs, *lens;
    void *front; /* the front's state of it */
} mg_xlist;

typedef struct mg_xlists mg_xlists;

int mg_xlists_new(mg_xlists **out, uint64_t max_ranges);
/* Frees every list (their front state is the front's to free before). */
void mg_xlists_del(mg_xlists *s);

/* A new list of n ranges (addrs and lens copied): 0 with *out, MG_ERR_INVALID (n is 0, a length
 * is 0 or a range runs past the end of the address space: *bad its index; peer or agent too
 * long: *bad n), MG_ERR_FULL (max_ranges would be passed) or MG_ERR_NOMEM. */
int mg_xlists_add(mg_xlists *s, const char *tenant, uint64_t owner, const char *peer,
                  const char *agent, const uint64_t *addrs, const uint64_t *lens, size_t n,
                  mg_xlist **out, size_t *bad);
/* The list `id` of owner and tenant, or NULL (none, or another's). */
mg_xlist *mg_xlists_find(mg_xlists *s, uint64_t id, const char *tenant, uint64_t owner);
/* Forgets and frees a list. */
void mg_xlists_drop(mg_xlists *s, mg_xlist *l);
/* Lists kept, and their ranges. */
size_t mg_xlists_count(const mg_xlists *s);
uint64_t mg_xlists_ranges(const mg_xlists *s);

/* Checks a group of pairs by index: the local list is an owner's own memory, the remote list
 * an agent's, the index arrays of equal count (at least one), each index in range,
 * each pair's two ranges the same length. Returns NULL, or what is wrong (in why[cap]). */
const char *mg_xlists_check_pairs(const mg_xlist *local, const mg_xlist *remote, const uint32_t *li,
                                  size_t nl, const uint32_t *ri, size_t nr, char *why, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
