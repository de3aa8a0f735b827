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

struct mg_gateway;
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

#endif
