/*
 * mg_service: what the gateway's core knows of a service — one descriptor of its lifecycle
 * hooks. The services are listed once, in order, in mg_services.c; the core runs their hooks
 * through that list and names none of them. The ops pages (gateway/ops) come through the same
 * list: their init registers the pages and opens the ops port. All hooks run on the loop
 * thread.
 *
 *   init        at start, in list order: registers the service's methods and routes and makes
 *               its state, kept in its slot of the gateway (mg_gateway_state: the core holds
 *               it without knowing its type). 0 or an MG_ERR_*; the gateway is then freed
 *               (every free hook runs).
 *   state       the daemon's state changed (starting -> serving -> draining).
 *   drain       a drain began: stop taking new work, fail what waits.
 *   drain_final the drain's last phase: end long-lived streams.
 *   stop        the engine's workers are about to stop (before their jobs come back cancelled).
 *   metrics     writes the service's own block of /metrics (Prometheus text).
 *   status      adds its members to the open status page's /status.json: counts and sizes,
 *               nothing of any tenant.
 *   free        at the end, in reverse list order; also after a failed or skipped init, so it
 *               must accept a service that never started.
 * Every hook but init is optional (NULL). `wanted`, when set, decides from the configuration
 * whether the service runs at all.
 */
#ifndef MG_SERVICE_H
#define MG_SERVICE_H

#include <stddef.h>

#include "mg_gateway.h"
#include "moongate/agentcache.h"
#include "moongate/agents.h"
#include "moongate/peerdir.h"
#include "moongate/segment.h"

struct mg_config;
struct evbuffer;
struct json_t;

typedef struct mg_service {
    const char *name;
    int (*wanted)(const struct mg_config *cfg);
    int (*init)(struct mg_gateway *gw);
    void (*state)(struct mg_gateway *gw);
    void (*drain)(struct mg_gateway *gw);
    void (*drain_final)(struct mg_gateway *gw);
    void (*stop)(struct mg_gateway *gw);
    void (*metrics)(struct mg_gateway *gw, struct evbuffer *out);
    void (*status)(struct mg_gateway *gw, struct json_t *obj);
    void (*free)(struct mg_gateway *gw);
} mg_service;

/* The daemon's services, in start order (mg_services.c). */
extern const mg_service *const mg_services[];
extern const size_t mg_n_services;

/* ---- what the core makes for every service ----
 *
 * Services sit side by side: none calls another or looks into another's state. What more than
 * one of them uses is the core's (mg_shared.c, mg_release.c, mg_peer_rpc.h), made before any
 * service's init — the agents, then the peer caches, then the peer directory that uses them —
 * and let go after every service's free; the peer front is closed before the first free. */

/* This daemon's agents (moongate/agents.h): the agent service registers and ends them, the peer
 * service answers peers about them, transfers and notifications name them. */
mg_agents *mg_gateway_agents(const mg_gateway *gw);
/* The agent `ref` names on this daemon (ref->peer is not looked at), of `tenant`, or NULL. */
mg_agent *mg_gateway_agent_find(const mg_gateway *gw, const char *tenant, const mg_agent_ref *ref);
/* An agent was added or ended (or a hold ended): the agents' state file (<shm-dir>/
 * .moongate.agents, which the next daemon reads to hold their ports) is written again, on a
 * worker; never after a drain began. Holds are ended by mg_agents_add and the core. */
void mg_gateway_agents_changed(mg_gateway *gw);
/* Writes of that file that succeeded, and that failed. */
void mg_gateway_agents_file_stats(const mg_gateway *gw, uint64_t *written, uint64_t *failed);

/* The peer front, NULL without a segment registry (no transfers then): the peer directory
 * (moongate/peerdir.h: one entry per peer and tenant, its session and its line in the transfer
 * scheduler; each entry's control channel, mg_peer_rpc.h), and what peers said of their targets
 * (the peer cache) and of their agents (the agent cache), per epoch. */
mg_peerdir *mg_gateway_peers(const mg_gateway *gw);
mg_peer_cache *mg_gateway_peer_cache(const mg_gateway *gw);
mg_agent_cache *mg_gateway_agent_cache(const mg_gateway *gw);
/* Non-zero once the front closed (the daemon stops): a peer call's answer that comes after is
 * dropped, and no new call is made. */
int mg_gateway_peers_closed(const mg_gateway *gw);

/* Segments let go of (mg_release.c). Unmaps seg, which mg_registry_unregister marked
 * UNREGISTERING, on a worker; done runs once it is gone (NULL: nobody waits, the daemon's own:
 * the unregistration is logged). Every unregistration ends here and is counted
 * (moongate_segment_unregistrations_total). Returns 0, or an MG_ERR_* with the segment
 * restored (still registered) and done not called. */
int mg_gateway_unmap(mg_gateway *gw, mg_segment *seg, mg_unregister_done_fn done, void *arg);
/* A registered process segment (source PROCESS) is unregistered once its process has exited
 * and nothing holds it; other segments are left alone. */
void mg_gateway_watch_exit(mg_gateway *gw, mg_segment *seg);
/* Unregisters segments `ids` of process `proc` (each once nobody holds it; tried again every
 * second), logging `reason` (a static string). Those already gone are simply not found. */
void mg_gateway_release(mg_gateway *gw, const mg_proc *proc, const uint64_t *ids, size_t n,
                        const char *reason);
/* Answers call (Memory/Checksum, Peer/Checksum) with the ChecksumResponse of `length` bytes at
 * p, summed on a worker (moongate/checksum.h). seg's reference and the lease's use (or NULL)
 * are the job's to let go, whatever happens. */
void mg_gateway_checksum(mg_call *call, mg_segment *seg, void *lease, const uint8_t *p,
                         uint64_t length);

#endif
