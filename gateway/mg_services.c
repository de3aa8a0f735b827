/* mg_services: the daemon's services, listed once (mg_service.h). Their hooks run in this
 * order, their /metrics blocks come in it, and they are freed in reverse. No service uses
 * another's state: what several of them use the core makes before any init runs (the agents,
 * the peer front, the pool set: mg_shared.c, mg_gateway.c) and lets go after every free, and
 * no job runs before every init has (the core starts the pools' registrations then, so Debug's
 * registry gate is in place first), so the order is the reader's: the daemon's own services,
 * then memory, its users, and the peers. The ops pages come last, through a descriptor of the
 * same kind (gateway/ops: its init registers the pages and opens the ops port). */
#include "mg_gateway.h"
#include "mg_service.h"

extern const mg_service mg_svc_health, mg_svc_daemon, mg_svc_memory, mg_svc_agent, mg_svc_pool,
    mg_svc_peer, mg_svc_notify, mg_svc_transfer, mg_svc_reflection, mg_svc_debug, mg_ops_service;

const mg_service *const mg_services[] = {
    &mg_svc_health,   &mg_svc_debug,      &mg_svc_daemon,  &mg_svc_memory,
    &mg_svc_agent,    &mg_svc_pool,       &mg_svc_peer,    &mg_svc_notify,
    &mg_svc_transfer, &mg_svc_reflection, &mg_ops_service,
};
const size_t mg_n_services = sizeof(mg_services) / sizeof(mg_services[0]);
