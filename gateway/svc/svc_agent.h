/* svc_agent.h: the agents of this daemon (svc_agent.c), for the services that resolve them:
 * the peer API (a peer names an agent here) and transfers (a request names an agent's memory). */
#ifndef SVC_AGENT_H
#define SVC_AGENT_H

#include "mg_gateway.h"
#include "moongate/agentcache.h"
#include "moongate/agents.h"

/* This daemon's agents; NULL when the service did not start. */
mg_agents *mg_agent_table(mg_gateway *gw);

/* The agent ref names on this daemon (ref->peer ""), of `tenant`: NULL when there is none. */
mg_agent *mg_agent_find(mg_gateway *gw, const char *tenant, const mg_agent_ref *ref);

#endif
