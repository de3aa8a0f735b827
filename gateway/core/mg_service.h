/*
 * mg_service: what the gateway's core knows of a service — one descriptor of its lifecycle
 * hooks. The services are listed once, in order, in mg_services.c; the core runs their hooks
 * through that list and names none of them. All hooks run on the loop thread.
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

/* ---- what the core does for every service ---- */

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

#endif
