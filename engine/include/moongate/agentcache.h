/*
 * moongate agent cache: what peers said of their agents — each agent's regions (address in its
 * process, size, segment id) — so that a transfer naming remote memory by (agent, address)
 * needs no round trip to the peer once its agent is known.
 *
 * What a peer said belongs to its epoch: an entry is used only while the peer's epoch is the
 * one it was learnt under (the peer cache's, moongate/peers.h), so a restarted peer is asked
 * again. A region the peer unregistered since (and perhaps registered anew, with a new id) is
 * found out by the peer refusing its id; the caller then forgets the agent and asks again.
 *
 * The one-string form "host:port" names an agent too: the agent with port `port` on the daemon
 * whose control endpoint is host:peer_port (docs/api.md). mg_agent_ref_parse reads both forms.
 *
 * Bounded: at most max_agents agents in all (the oldest learnt goes first). Loop thread only.
 */
#ifndef MOONGATE_AGENTCACHE_H
#define MOONGATE_AGENTCACHE_H

#include "moongate/agents.h"
#include "moongate/peers.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_AGENT_REGIONS_MAX 1024 /* regions a peer describes of one agent */

/* An agent as a request names it: by name or by port, on a peer ("": this daemon). */
typedef struct mg_agent_ref {
    char peer[MG_PEER_NAME_MAX + 1];
    char name[MG_AGENT_NAME_MAX + 1]; /* "" when named by port */
    uint32_t port;                    /* 0 when named by name */
} mg_agent_ref;

/* The agent a request names: with peer "" and agent in the one-string form "host:port" (a
 * numeric port), the agent with that port on the daemon at host:peer_port; otherwise the agent
 * named `agent` on `peer`. Returns 0, or MG_ERR_INVALID with why set (a one-string form whose
 * port is not 1..65535 is refused naming the port, not taken for a name). */
int mg_agent_ref_parse(const char *peer, const char *agent, int peer_port, mg_agent_ref *out,
                       char *why, size_t cap);
/* "agent \"name\"" or "agent at port N", for messages. */
const char *mg_agent_ref_str(const mg_agent_ref *r, char *buf, size_t cap);

typedef struct mg_remote_region {
    uint64_t address; /* in the agent's process */
    uint64_t size;
    uint64_t id; /* its segment on the peer */
} mg_remote_region;

typedef struct mg_remote_agent {
    char name[MG_AGENT_NAME_MAX + 1];
    uint32_t port;
    uint64_t agent_id; /* the peer's id of it: another agent of the same name has another */
    const mg_remote_region *regions; /* in address order */
    size_t n;
} mg_remote_agent;

typedef struct mg_agent_cache mg_agent_cache;

int mg_agent_cache_new(mg_agent_cache **out, size_t max_agents);
void mg_agent_cache_del(mg_agent_cache *c);

/* Keeps what `peer` (a peer cache key) said under `epoch` of an agent, in place of what it
 * said of it before. Returns 0, MG_ERR_INVALID (regions out of order or overlapping, too
 * many) or MG_ERR_NOMEM. */
int mg_agent_cache_put(mg_agent_cache *c, const char *peer, uint64_t epoch,
                       const mg_remote_agent *a);
/* Where [addr, addr + len) of agent `ref` lies on `peer` whose epoch is now `epoch`: 0 with
 * the region's segment id and the offset of addr in it; MG_ERR_NOT_FOUND (nothing known of the
 * agent under this epoch: ask the peer); or, with why set, MG_ERR_INVALID (known, and no
 * region of it holds addr) or MG_ERR_RANGE (the range runs past the end of addr's region). */
int mg_agent_cache_resolve(mg_agent_cache *c, const char *peer, uint64_t epoch,
                           const mg_agent_ref *ref, uint64_t addr, uint64_t len, uint64_t *id,
                           uint64_t *offset, char *why, size_t cap);
/* The same, answering the whole region that holds the range. */
int mg_agent_cache_region(mg_agent_cache *c, const char *peer, uint64_t epoch,
                          const mg_agent_ref *ref, uint64_t addr, uint64_t len,
                          mg_remote_region *region, char *why, size_t cap);
/* What the cache knows of the agent under `epoch`: 0 with *out (its regions stay the cache's
 * until the next put or forget), or MG_ERR_NOT_FOUND. */
int mg_agent_cache_get(mg_agent_cache *c, const char *peer, uint64_t epoch, const mg_agent_ref *ref,
                       mg_remote_agent *out);
/* Forgets the agent (a region of it was refused: it changed). */
void mg_agent_cache_forget(mg_agent_cache *c, const char *peer, const mg_agent_ref *ref);
/* Agents known (any epoch). */
size_t mg_agent_cache_count(const mg_agent_cache *c);

#ifdef __cplusplus
}
#endif

#endif
