/*
 * moongate agents: the client processes that named themselves to this daemon.
 *
 * An agent is a name a client chose (unique per tenant on this daemon) and a port number
 * unique on this daemon — the one the client asked for when it is free, else one the daemon
 * assigns from its range — so that the one-string form "host:port" names one agent on the
 * daemon at `host` (docs/api.md). An agent on the Unix socket is also its process (pid and
 * start time): the regions that process registered with their address are the agent's, and a
 * peer names their bytes by (agent, address).
 *
 * The table keeps the agents and nothing of their regions (the registry has those, by
 * process). What binds an agent to a connection and ends it is the front's.
 *
 * Holds: a port the daemon keeps for an agent that had it before the daemon restarted, until
 * that agent registers again or the hold's time passes. While it lasts, the agent of that
 * tenant and name gets the port back (asking for it, or for 0), nobody else may ask for it, and
 * no other agent is assigned it. Time is the caller's (now_ms, until_ms: one clock, e.g.
 * mg_now_mono_ms); the table reads no clock.
 *
 * Threads: one (the daemon's loop).
 */
#ifndef MOONGATE_AGENTS_H
#define MOONGATE_AGENTS_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_AGENT_NAME_MAX 128 /* bytes of an agent's name: [A-Za-z0-9._:-] */

typedef struct mg_agents mg_agents;

typedef struct mg_agent {
    uint64_t id; /* never reused in the daemon's life */
    char tenant[MG_SEG_NAME_MAX + 1];
    char name[MG_AGENT_NAME_MAX + 1];
    uint32_t port;
    mg_proc proc; /* its process (pid 0: not on the Unix socket, or unseen) */
    void *front;  /* the front's state of it */
} mg_agent;

/* An agent's tenant, name and port: what a restart keeps of it (moongate/agentstate.h). */
typedef struct mg_agent_entry {
    char tenant[MG_SEG_NAME_MAX + 1];
    char name[MG_AGENT_NAME_MAX + 1];
    uint32_t port;
} mg_agent_entry;

/* A port held for an agent until until_ms. */
typedef struct mg_agent_hold {
    mg_agent_entry agent;
    uint64_t until_ms;
} mg_agent_hold;

typedef struct mg_agents_config {
    size_t max_agents;         /* at once, every tenant (>= 1); as many holds besides */
    uint32_t port_lo, port_hi; /* the range assigned ports come from (1 <= lo <= hi <= 65535) */
    uint32_t reserved[8];      /* the daemon's own ports: never an agent's (0: none) */
} mg_agents_config;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_agents_new(mg_agents **out, const mg_agents_config *cfg);
/* Accepts NULL. Frees every agent (their front state must be gone). */
void mg_agents_del(mg_agents *a);

/* Whether s is a valid agent name. */
int mg_agent_name_ok(const char *s);

/* Whether s is a valid tenant for the table: 1..MG_SEG_NAME_MAX of [A-Za-z0-9._:-]. */
int mg_agent_tenant_ok(const char *s);

/* A new agent of `tenant` named `name` with port `port` (0: one from the range, or the port
 * held for it) at now_ms; holds whose time passed by now_ms end first. Its own hold, if any,
 * ends. Returns 0 and the agent, or with why (cap bytes) set: MG_ERR_INVALID (a bad name or
 * port, a port of the daemon's own), MG_ERR_EXISTS (the tenant has an agent of that name, or
 * the port is taken or held for another agent on this daemon), MG_ERR_FULL (max_agents, or no
 * port of the range is free), MG_ERR_NOMEM. */
int mg_agents_add(mg_agents *a, const char *tenant, const char *name, uint32_t port,
                  const mg_proc *proc, uint64_t now_ms, mg_agent **out, char *why, size_t cap);
/* Ends an agent: its name and port are free again. */
void mg_agents_remove(mg_agents *a, mg_agent *ag);

/* Holds e->port for agent e->name of e->tenant until until_ms. Returns 0, or with why set:
 * MG_ERR_INVALID (a bad tenant, name or port, a port of the daemon's own), MG_ERR_EXISTS (the
 * agent is alive or held already, or the port is another agent's or held), MG_ERR_FULL
 * (max_agents holds). */
int mg_agents_hold(mg_agents *a, const mg_agent_entry *e, uint64_t until_ms, char *why, size_t cap);
/* Ends the holds whose time passed by now_ms. Returns how many ended. */
size_t mg_agents_expire(mg_agents *a, uint64_t now_ms);
/* The holds that last past now_ms, at most max into out (out may be NULL with max 0). Returns
 * how many there are. */
size_t mg_agents_holds(const mg_agents *a, uint64_t now_ms, mg_agent_hold *out, size_t max);
/* What a restart keeps: every agent, then every hold lasting past now_ms, at most max into
 * out (out may be NULL with max 0). Returns how many there are. */
size_t mg_agents_entries(const mg_agents *a, uint64_t now_ms, mg_agent_entry *out, size_t max);

/* The tenant's agent of that name, or NULL. */
mg_agent *mg_agents_by_name(const mg_agents *a, const char *tenant, const char *name);
/* The agent with that port if it is the tenant's (another tenant's is NULL, as none), or NULL. */
mg_agent *mg_agents_by_port(const mg_agents *a, const char *tenant, uint32_t port);
/* How many agents of `tenant` (NULL: every tenant) are alive; with proc, of that process only. */
size_t mg_agents_count(const mg_agents *a, const char *tenant, const mg_proc *proc);
/* The tenant's (NULL: every tenant's) agents whose id is greater than `after`, in id order, at
 * most max. Returns how many were written. */
size_t mg_agents_list(const mg_agents *a, const char *tenant, uint64_t after, mg_agent **out,
                      size_t max);

#ifdef __cplusplus
}
#endif

#endif
