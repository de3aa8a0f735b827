/*
 * mg_core: the gateway core's own header, beyond the handler API (mg_gateway.h): what the
 * daemon's entry point (main.c) uses to make, run and drain the gateway, and what the ops pages
 * (gateway/ops) use to serve and count — the pages' answers, the figures the core keeps, the
 * services' /metrics and /status.json hooks, the accept pause. Services never include it; the
 * core's internals (connections, calls, TLS, the gateway's own fields) are in mg_server_int.h,
 * which ops does not include either. Loop thread.
 */
#ifndef MG_CORE_H
#define MG_CORE_H

#include "mg_gateway.h"

#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct evconnlistener;
struct json_t;

/* ---- making, running and draining the gateway (main.c) ---- */

/* The engine parts the gateway hands requests to. */
typedef struct mg_gateway_parts {
    mg_engine *engine;    /* workers, with the segment registry */
    mg_engine *io;        /* transport threads, or NULL (the workers then) */
    struct mg_rdma *rdma; /* RDMA devices, or NULL */
    const char *rdma_why; /* why there are none */
} mg_gateway_parts;

/* Creates the gateway on `base`: the lease table and buffer pools, the services of
 * mg_services.c and the ops pages (whose init opens the ops port), TLS context, listeners.
 * Returns 0 or a negative MG_ERR_* after logging what failed. */
int mg_gateway_new(mg_gateway **out, struct event_base *base, const mg_config *cfg,
                   const mg_gateway_parts *parts);
void mg_gateway_del(mg_gateway *gw);
/* Runs every service's stop hook: the engine's workers are about to stop. Accepts NULL. */
void mg_gateway_stop_services(mg_gateway *gw);
/* Moves to SERVING (readiness true) once the start-up jobs are done, or starts the graceful
 * drain. */
void mg_gateway_set_serving(mg_gateway *gw);
void mg_gateway_drain(mg_gateway *gw);
/* Runs the loop until the daemon stops (the drain ends it, or start-up work failed). With
 * --busy-poll-us the loop, once a connection delivered bytes, polls without sleeping until that
 * long passes with no more: a client's next call then finds the thread awake. Returns the
 * daemon's exit status: 0, or 1 when start-up work (a pool's registration) failed. */
int mg_gateway_run(mg_gateway *gw);

/* ---- serving and counting (the ops pages) ---- */

/* Answers a GET or HEAD of path (query string included) from the pages: fills body and *ctype
 * and returns the HTTP status — the page's, or 404 with a line naming the pages. The control
 * port and the ops port both answer through it. */
int mg_gateway_page(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype);
/* Runs every started service's metrics hook (its /metrics block) or status hook (its members
 * of /status.json), in list order. */
void mg_gateway_services_metrics(mg_gateway *gw, struct evbuffer *out);
void mg_gateway_services_status(mg_gateway *gw, struct json_t *obj);

/* What the core counts (mg_gateway_get_stats: a copy). */
typedef struct mg_gateway_stats {
    uint64_t conns_total[3]; /* by kind: tls, h2c tcp, unix */
    uint64_t conns_active;
    uint64_t streams_active;
    uint64_t tls_handshake_errors;
    uint64_t protocol_errors;
    uint64_t http_requests; /* GET routes on the control port */
    uint64_t unknown_method_calls;
    uint64_t rst_received;
    uint64_t goaway_sent;
    uint64_t write_timeouts;       /* connections closed: the client read nothing for too long */
    uint64_t auth_unauthenticated; /* calls refused: no or unknown credentials */
    uint64_t auth_denied;          /* calls refused: known identity without a tenant or role */
    uint64_t rate_refused;         /* calls refused: the tenant was over --tenant-rate */
    uint64_t accept_pauses;        /* times accepting paused: no descriptor to spare */
    uint64_t reloads[2];           /* files re-read and swapped in: auth, TLS */
    uint64_t reload_errors[2];     /* changed files that failed to load: auth, TLS */
    uint64_t unregistered_total;   /* unregistrations that completed (mg_release.c) */
    /* not counted: what holds when the copy is made */
    size_t auth_principals; /* in --auth-file as last loaded */
    int accept_paused;      /* 1 while the listeners are paused for want of descriptors */
} mg_gateway_stats;
void mg_gateway_get_stats(const mg_gateway *gw, mg_gateway_stats *out);

/* Calls of one method: started, finished by status code, and their latency. */
typedef struct mg_method_stats {
    uint64_t started;
    uint64_t handled[MG_GRPC_CODE_COUNT];
    uint64_t buckets[12]; /* latency histogram: upper bounds mg_call_seconds_le */
    double seconds_sum;
} mg_method_stats;
/* The figures of method i (mg_gateway_method), or NULL past the last. */
const mg_method_stats *mg_gateway_method_stats(const mg_gateway *gw, size_t i);
/* mg_call.c: the upper bounds of the call latency buckets (0.1 ms .. 1 s). */
extern const double mg_call_seconds_le[12];

/* ---- accepting without descriptors (mg_conn.c) ---- */

/* When a listener's accept fails for want of a descriptor (EMFILE, ENFILE, ENOBUFS, ENOMEM),
 * the connection stays in the kernel's queue and an enabled listener would wake the loop again
 * at once, forever. mg_accept_failed() disables every listener of the gateway (control, h2c,
 * Unix socket, fd socket, and those of mg_gateway_add_listener: the ops port's), logs one line
 * for the episode and counts it; accepting resumes when a connection of the gateway closes, or
 * after 100 ms, and the episode ends with the first accept that succeeds (mg_accept_ok). Other
 * accept errors are logged, rate-limited. */
void mg_accept_failed(mg_gateway *gw, const char *where, int err);
void mg_accept_ok(mg_gateway *gw);
/* Wakes paused listeners (a descriptor was freed). */
void mg_accept_resume(mg_gateway *gw);
/* A listener another part of the daemon opened on the gateway's loop (the ops port's) pauses
 * and resumes with the gateway's own. Returns 0 or MG_ERR_FULL. mg_gateway_del_listener takes
 * it back before it is freed. */
int mg_gateway_add_listener(mg_gateway *gw, struct evconnlistener *lev);
void mg_gateway_del_listener(mg_gateway *gw, struct evconnlistener *lev);

#endif
