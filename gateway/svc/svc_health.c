/*
 * svc_health: grpc.health.v1.Health. Check answers SERVING while the daemon serves, NOT_SERVING
 * while it starts or drains, for "" (the whole daemon) and for every service it serves; any other
 * name is NOT_FOUND. Watch sends the current status at once and again on every change; for an
 * unknown name it sends SERVICE_UNKNOWN and stays open. Watchers are bounded (--max-watchers) and
 * ended with UNAVAILABLE in the last phase of a drain, after NOT_SERVING was sent.
 * Loop thread only.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "grpc/health/v1/health.pb-c.h"

#include <stdlib.h>
#include <string.h>

typedef struct watcher {
    mg_parked park; /* in mg_health.watchers */
    char *service;
    int last; /* last status sent */
} watcher;

struct mg_health {
    mg_list watchers;
    size_t count;
};

extern const mg_service mg_svc_health;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static struct mg_health *health_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_health);
}

static int status_for(mg_gateway *gw, const char *service, int watch)
{
    int known = 1;
    if (*service) {
        char path[300];
        snprintf(path, sizeof(path), "/%s", service);
        mg_gateway_find_method(gw, path, strlen(path), &known);
    }
    if (!known)
        return watch ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
                     : -1;
    return gw->state == MG_STATE_SERVING
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void check_message(mg_call *call, const ProtobufCMessage *m)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    int st = status_for(mg_call_gateway(call), req->service, 0);
    if (st < 0) {
        mg_call_finish(call, MG_GRPC_NOT_FOUND, "unknown service \"%s\"", req->service);
        return;
    }
    resp.status = st;
    mg_call_reply(call, &resp.base);
}

/* The watcher's call goes, finished with grpc_code (>= 0) and message first if asked. */
static void watcher_drop(mg_gateway *gw, watcher *w, int grpc_code, const char *message)
{
    health_of(gw)->count--;
    free(w->service);
    mg_call_unpark(&w->park, grpc_code, message);
    free(w);
}

static void watch_cancel(mg_call *call)
{
    watcher *w = mg_call_data(call);
    if (w)
        watcher_drop(mg_call_gateway(call), w, -1, NULL);
}

static void watch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    mg_gateway *gw = mg_call_gateway(call);
    watcher *w;

    if (health_of(gw)->count >= gw->cfg->max_watchers) {
        mg_call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED,
                       "%zu Watch streams are open, the limit (--max-watchers)",
                       health_of(gw)->count);
        return;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL || (w->service = strdup(req->service)) == NULL) {
        free(w);
        mg_call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    resp.status = status_for(gw, req->service, 1);
    w->last = resp.status;
    mg_call_park(call, &w->park, &health_of(gw)->watchers);
    health_of(gw)->count++;
    mg_call_send(call, &resp.base);
}

/* Health checks need no credentials: probes and load balancers call them. */
static const mg_method check_method = {
    .path = "/grpc.health.v1.Health/Check",
    .kind = MG_RPC_UNARY,
    .in = &grpc__health__v1__health_check_request__descriptor,
    .out = &grpc__health__v1__health_check_response__descriptor,
    .on_message = check_message,
    .open = 1,
};

static const mg_method watch_method = {
    .path = "/grpc.health.v1.Health/Watch",
    .kind = MG_RPC_SERVER_STREAM,
    .in = &grpc__health__v1__health_check_request__descriptor,
    .out = &grpc__health__v1__health_check_response__descriptor,
    .on_message = watch_message,
    .on_cancel = watch_cancel,
    .open = 1,
};

static int mg_svc_health_init(mg_gateway *gw)
{
    int rc;
    *mg_gateway_state(gw, &mg_svc_health) = calloc(1, sizeof(*health_of(gw)));
    if (health_of(gw) == NULL)
        return MG_ERR_NOMEM;
    mg_list_init(&health_of(gw)->watchers);
    if ((rc = mg_gateway_add_method(gw, &check_method)) != 0 ||
        (rc = mg_gateway_add_method(gw, &watch_method)) != 0)
        return rc;
    return 0;
}

static void mg_svc_health_notify(mg_gateway *gw)
{
    if (health_of(gw) == NULL)
        return;
    mg_list_foreach (&health_of(gw)->watchers, node) {
        watcher *w = mg_container_of(node, watcher, park.node);
        Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        resp.status = status_for(gw, w->service, 1);
        if ((int)resp.status == w->last || mg_call_done(w->park.call))
            continue;
        w->last = resp.status;
        mg_call_send(w->park.call, &resp.base);
    }
}

static void mg_svc_health_close_watchers(mg_gateway *gw)
{
    if (health_of(gw) == NULL)
        return;
    while (!mg_list_empty(&health_of(gw)->watchers))
        watcher_drop(gw,
                     mg_container_of(mg_list_first(&health_of(gw)->watchers), watcher, park.node),
                     MG_GRPC_UNAVAILABLE, "server shutting down");
}

static void mg_svc_health_free(mg_gateway *gw)
{
    if (health_of(gw) == NULL)
        return;
    while (!mg_list_empty(&health_of(gw)->watchers))
        watcher_drop(gw,
                     mg_container_of(mg_list_first(&health_of(gw)->watchers), watcher, park.node),
                     -1, NULL);
    free(health_of(gw));
    *mg_gateway_state(gw, &mg_svc_health) = NULL;
}

const mg_service mg_svc_health = {.name = "health",
                                  .init = mg_svc_health_init,
                                  .state = mg_svc_health_notify,
                                  .drain_final = mg_svc_health_close_watchers,
                                  .free = mg_svc_health_free};
