/* mg_services: the daemon's services, listed once, in start order (mg_service.h). A service
 * comes after those whose state it uses at start: Memory before Agent (an agent's regions) and
 * Pool (the pool is a segment), Agent before Transfer (requests naming agents), Peer before
 * Notify and Transfer (the data plane and sessions). No job runs before every init did (the
 * core starts the pools' registrations then), so Debug's registry gate is in place first
 * wherever it stands. They are freed in reverse. */
#include "mg_gateway.h"
#include "mg_service.h"

extern const mg_service mg_svc_health, mg_svc_daemon, mg_svc_memory, mg_svc_agent, mg_svc_pool,
    mg_svc_peer, mg_svc_notify, mg_svc_transfer, mg_svc_reflection, mg_svc_debug;

const mg_service *const mg_services[] = {
    &mg_svc_health, &mg_svc_debug, &mg_svc_daemon, &mg_svc_memory,   &mg_svc_agent,
    &mg_svc_pool,   &mg_svc_peer,  &mg_svc_notify, &mg_svc_transfer, &mg_svc_reflection,
};
const size_t mg_n_services = sizeof(mg_services) / sizeof(mg_services[0]);
