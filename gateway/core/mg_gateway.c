/*
 * mg_gateway: the gateway object: its method and route table (pages included), start-up
 * (engine completion queue, services and the ops pages, TLS context, listeners), the serving
 * state and the graceful drain.
 *
 * Drain: SIGTERM/SIGINT -> state draining (readiness false, Watch streams told NOT_SERVING) ->
 * listeners closed -> GOAWAY shutdown notice on every connection -> one second later (at once
 * when none is open) GOAWAY with the last processed stream and Watch streams ended ->
 * connections close as their calls finish -> the loop ends. --grace bounds it all; a second signal
 * ends it at once. Loop thread only.
 */
#include "mg_server_int.h"

#include "mg_admit.h"
#include "mg_fdsock.h"
#include "mg_route.h"

#include "mg_log.h"
#include "mg_service.h"
#include "mg_trace.h"
#include "moongate/lease_table.h"
#include "moongate/pools.h"
#include "moongate/procmem.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

const char *mg_state_name(mg_state s)
{
    switch (s) {
    case MG_STATE_STARTING:
        return "starting";
    case MG_STATE_SERVING:
        return "serving";
    case MG_STATE_DRAINING:
        return "draining";
    }
    return "unknown";
}

/* ------------------------------------------------------------------ methods */

int mg_gateway_add_method(mg_gateway *gw, const mg_method *m)
{
    int known;
    if (mg_gateway_find_method(gw, m->path, strlen(m->path), &known))
        return MG_ERR_EXISTS;
    if (gw->core->n_methods >= MG_MAX_METHODS)
        return MG_ERR_FULL;
    gw->core->method_len[gw->core->n_methods] = strlen(m->path);
    gw->core->methods[gw->core->n_methods++] = m;
    return 0;
}

int mg_gateway_add_route(mg_gateway *gw, const mg_route *r)
{
    if (gw->core->n_routes >= MG_MAX_ROUTES)
        return MG_ERR_FULL;
    gw->core->routes[gw->core->n_routes++] = r;
    return 0;
}

int mg_gateway_add_page(mg_gateway *gw, const mg_page *p)
{
    return mg_gateway_add_route(gw, &p->route);
}

/* An unknown page: 404, the path (without its query string) and the pages there are. */
static int page_not_found(mg_gateway *gw, const char *path, struct evbuffer *body)
{
    size_t n = strcspn(path, "?");
    evbuffer_add_printf(body, "not found: %.*s (try", (int)(n < 255 ? n : 255), path);
    for (size_t i = 0; i < gw->core->n_routes; i++) {
        const mg_route *r = gw->core->routes[i];
        if (r->method == NULL && !mg_container_of(r, mg_page, route)->hidden)
            evbuffer_add_printf(body, " %s", r->prefix);
    }
    evbuffer_add(body, ")\n", 2);
    return 404;
}

int mg_gateway_page(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    mg_route_match m;
    *ctype = "text/plain; charset=utf-8";
    if (mg_route_find(gw->core->routes, gw->core->n_routes, "GET", path, &m) == MG_ROUTE_HIT &&
        m.route->method == NULL)
        return mg_container_of(m.route, mg_page, route)->render(gw, path, body, ctype);
    return page_not_found(gw, path, body);
}

int mg_gateway_add_methods(mg_gateway *gw, const mg_method *methods, size_t n,
                           const mg_route *routes, size_t nr)
{
    int rc;
    for (size_t i = 0; i < n; i++) {
        if ((rc = mg_gateway_add_method(gw, &methods[i])) != 0)
            return rc;
    }
    for (size_t i = 0; i < nr; i++) {
        if ((rc = mg_gateway_add_route(gw, &routes[i])) != 0)
            return rc;
    }
    return 0;
}

const mg_method *mg_gateway_method(const mg_gateway *gw, size_t i)
{
    return i < gw->core->n_methods ? gw->core->methods[i] : NULL;
}

const mg_method_stats *mg_gateway_method_stats(const mg_gateway *gw, size_t i)
{
    return i < gw->core->n_methods ? &gw->core->method_stats[i] : NULL;
}

void mg_gateway_get_stats(const mg_gateway *gw, mg_gateway_stats *out)
{
    *out = gw->core->stats;
    out->auth_principals = mg_auth_count(gw->core->auth);
    out->accept_paused = gw->core->accept_episode;
}

int mg_gateway_method_index(const mg_gateway *gw, const mg_method *m)
{
    for (size_t i = 0; i < gw->core->n_methods; i++) {
        if (gw->core->methods[i] == m)
            return (int)i;
    }
    return -1;
}

const mg_method *mg_gateway_find_method(const mg_gateway *gw, const char *path, size_t len,
                                        int *service_known)
{
    const char *slash = len > 1 ? memchr(path + 1, '/', len - 1) : NULL;
    size_t svc_len = slash ? (size_t)(slash - path) : len;
    *service_known = 0;
    for (size_t i = 0; i < gw->core->n_methods; i++) { /* lengths first: most differ */
        if (gw->core->method_len[i] == len && memcmp(gw->core->methods[i]->path, path, len) == 0) {
            *service_known = 1;
            return gw->core->methods[i];
        }
    }
    for (size_t i = 0; i < gw->core->n_methods; i++) {
        const char *p = gw->core->methods[i]->path;
        if (gw->core->method_len[i] > svc_len && memcmp(p, path, svc_len) == 0 &&
            p[svc_len] == '/') {
            *service_known = 1;
            break;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ gateway */

static void cq_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    mg_cq_drain(gw->cq, 256);
}

/* The buffer pools of --pool-bytes and --tenant-pool (none without a registry). Returns 0 or
 * an MG_ERR_* after logging why. */
static int pools_new(mg_gateway *gw)
{
    const mg_config *cfg = gw->cfg;
    mg_tenant_pool tp[MG_POOLS_MAX - 1];
    mg_pools_tenant tenants[MG_POOLS_MAX - 1];
    char err[256];
    int ntp = mg_config_tenant_pools(cfg->tenant_pool, tp, MG_POOLS_MAX - 1, err, sizeof(err));
    mg_pools_config pc = {.reg = mg_engine_registry(gw->engine),
                          .engine = gw->engine,
                          .cq = gw->cq,
                          .rdma = gw->rdma,
                          .leases = gw->leases,
                          .memlock = (mg_memlock)gw->memlock,
                          .default_bytes = cfg->pool_bytes,
                          .default_reserve_bytes = cfg->pool_reserve_bytes,
                          .tenants = tenants,
                          .max_leases = (uint32_t)cfg->max_leases,
                          .max_tenant_leases = cfg->max_tenant_leases,
                          .max_ttl_ms = cfg->max_lease_ttl * 1000,
                          .overflow = strcmp(cfg->pool_overflow, "register") == 0,
                          .overflow_max_bytes = cfg->pool_overflow_max_bytes};
    if (ntp < 0) {
        mg_error("start_failed", "reason=\"--tenant-pool: %s\"", err);
        return MG_ERR_INVALID;
    }
    if ((cfg->pool_bytes == 0 && ntp == 0) || pc.reg == NULL)
        return 0;
    for (int i = 0; i < ntp; i++)
        tenants[i] = (mg_pools_tenant){tp[i].tenant, tp[i].bytes};
    pc.n_tenants = (size_t)ntp;
    return mg_pools_new(&gw->pools, &pc);
}

/* A pool's region is registered (rc 0) or could not be (logged): the start barrier. */
static void pool_started(void *arg, int rc)
{
    mg_gateway *gw = arg;
    gw->core->starting_jobs--;
    if (rc != 0) {
        gw->core->exit_code = 1;
        event_base_loopbreak(gw->base);
        return;
    }
    if (gw->core->serve_wanted)
        mg_gateway_set_serving(gw);
}

/* Start-up work on the workers, once every service's init ran (so none of their jobs runs
 * before, say, a test gate is installed): each pool's region is registered, and the daemon
 * serves only once they all are. Returns 0 or an MG_ERR_* (logged). */
static int start_work(mg_gateway *gw)
{
    unsigned starting = 0;
    int rc = gw->pools ? mg_pools_start(gw->pools, pool_started, gw, &starting) : 0;
    gw->core->starting_jobs += starting; /* each reports through pool_started */
    return rc;
}

int mg_gateway_new(mg_gateway **out, struct event_base *base, const mg_config *cfg,
                   const mg_gateway_parts *parts)
{
    mg_engine *engine = parts->engine;
    struct {
        mg_gateway gw; /* first: freeing the gateway frees both */
        mg_core core;
    } *both = calloc(1, sizeof(*both));
    mg_gateway *gw = both ? &both->gw : NULL;
    int rc;
    if (gw == NULL)
        return MG_ERR_NOMEM;
    gw->core = &both->core;
    mg_list_init(&gw->core->conns); /* first: mg_gateway_del walks it */
    gw->base = base;
    gw->cfg = cfg;
    gw->memlock = mg_config_memlock(cfg->memlock);
    if (gw->memlock < 0)
        gw->memlock = 0;
    gw->engine = engine;
    gw->io = parts->io;
    gw->rdma = parts->rdma;
    snprintf(gw->rdma_why, sizeof(gw->rdma_why), "%s", parts->rdma_why ? parts->rdma_why : "");
    /* procfs reads, done here once rather than on the loop at every Info or status call */
    if (!cfg->process_memory)
        snprintf(gw->process_vm_why, sizeof(gw->process_vm_why),
                 "off on this daemon (--process-memory=false)");
    else
        gw->process_vm = mg_procmem_available(gw->process_vm_why, sizeof(gw->process_vm_why));
    gw->state = MG_STATE_STARTING;
    gw->start_unix_ms = mg_now_unix_ms();
    gw->start_mono_ns = mg_now_mono_ns();
    if (getrandom(&gw->epoch, sizeof(gw->epoch), 0) != sizeof(gw->epoch))
        gw->epoch = gw->start_mono_ns ^ gw->start_unix_ms;
    snprintf(gw->epoch_hex, sizeof(gw->epoch_hex), "%016llx", (unsigned long long)gw->epoch);
    if (cfg->trace_spans && (gw->spans = mg_spans_new(cfg->trace_spans)) == NULL) {
        rc = MG_ERR_NOMEM;
        goto fail;
    }
    {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
            gw->open_files_limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
    }

    rc = mg_cq_new(&gw->cq);
    if (rc != 0)
        goto fail;
    gw->core->cq_event = event_new(base, mg_cq_fd(gw->cq), EV_READ | EV_PERSIST, cq_cb, gw);
    if (gw->core->cq_event == NULL || event_add(gw->core->cq_event, NULL) != 0) {
        rc = MG_ERR_NOMEM;
        goto fail;
    }
    if (mg_engine_registry(engine) != NULL && (rc = mg_lease_table_new(&gw->leases)) != 0)
        goto fail;
    if ((rc = pools_new(gw)) != 0 || (rc = mg_shared_new(gw)) != 0)
        goto fail;
    if (mg_n_services > sizeof(gw->core->started)) {
        rc = MG_ERR_INVALID;
        goto fail;
    }
    for (size_t i = 0; i < mg_n_services; i++) {
        const mg_service *s = mg_services[i];
        if (s->wanted && !s->wanted(cfg))
            continue;
        gw->core->started[i] = 1;
        if ((rc = s->init(gw)) != 0) {
            mg_error("start_failed", "service=%s error=\"%s\"", s->name, mg_strerror(rc));
            goto fail;
        }
    }
    if ((rc = start_work(gw)) != 0)
        goto fail;

    if ((rc = mg_reload_start(gw)) != 0)
        goto fail;
    if (*cfg->tls_cert) {
        gw->core->ssl_ctx =
            mg_tls_server_ctx(cfg->tls_cert, cfg->tls_key, cfg->peer_ca, cfg->client_ca);
        if (gw->core->ssl_ctx == NULL) {
            rc = MG_ERR_INVALID;
            goto fail;
        }
        if ((rc = mg_listeners_add(gw, CONN_TLS, cfg->listen)) != 0)
            goto fail;
    } else if (*cfg->listen) {
        /* No certificate: serve h2c on loopback at the first listener's port. */
        struct sockaddr_storage ss;
        int sslen = sizeof(ss);
        char first[256], addr[64], *comma;
        snprintf(first, sizeof(first), "%s", cfg->listen);
        comma = strchr(first, ',');
        if (comma)
            *comma = '\0';
        if (evutil_parse_sockaddr_port(first, (struct sockaddr *)&ss, &sslen) != 0) {
            mg_error("listen_failed", "addr=%s reason=\"not a host:port\"", first);
            rc = MG_ERR_INVALID;
            goto fail;
        }
        snprintf(addr, sizeof(addr), "127.0.0.1:%d",
                 ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port));
        mg_warn("tls_disabled",
                "reason=\"no --tls-cert\" fallback=h2c addr=%s note=\"loopback only\"", addr);
        if ((rc = mg_listeners_add(gw, CONN_H2C, addr)) != 0)
            goto fail;
    }
    if (*cfg->h2c_listen && (rc = mg_listeners_add(gw, CONN_H2C, cfg->h2c_listen)) != 0)
        goto fail;
    if (*cfg->unix_socket && (rc = mg_listener_add_unix(gw, cfg->unix_socket)) != 0)
        goto fail;
    if ((rc = mg_fdsock_start(gw)) != 0)
        goto fail;
    *out = gw;
    return 0;

fail:
    mg_gateway_del(gw);
    return rc;
}

void mg_gateway_del(mg_gateway *gw)
{
    if (gw == NULL)
        return;
    mg_agentfile_close(gw); /* agents ending from here on are not written */
    /* Jobs still on the workers (a failed start leaves the pool's mapping running) push to
     * this gateway's queue: let them all come back before anything they use is freed. */
    if (gw->cq)
        mg_cq_settle(gw->cq);
    mg_listeners_free(gw);
    mg_fdsock_stop(gw);
    while (!mg_list_empty(&gw->core->conns))
        mg_conn_free(mg_container_of(mg_list_first(&gw->core->conns), mg_conn, link));
    if (gw->core->accept_timer)
        event_free(gw->core->accept_timer);
    mg_shared_close(gw);
    for (size_t i = mg_n_services; i-- > 0;) { /* Peer's joins the data-plane threads */
        if (gw->core->started[i] && mg_services[i]->free)
            mg_services[i]->free(gw);
    }
    mg_release_free(gw);
    mg_shared_free(gw);
    mg_pools_del(gw->pools); /* after the data plane's threads and every service */
    mg_lease_table_del(gw->leases);
    if (gw->core->drain_timer)
        event_free(gw->core->drain_timer);
    if (gw->core->grace_timer)
        event_free(gw->core->grace_timer);
    if (gw->core->cq_event)
        event_free(gw->core->cq_event);
    if (gw->cq) {
        mg_cq_drain(gw->cq, 0);
        mg_cq_del(gw->cq);
    }
    mg_reload_free(gw);
    mg_spans_del(gw->spans);
    mg_rates_del(gw->core->rates);
    mg_tls_ctx_free(gw->core->ssl_ctx);
    free(gw);
}

typedef enum { HOOK_STATE, HOOK_DRAIN, HOOK_DRAIN_FINAL, HOOK_STOP } hook;

/* Runs one hook of every service that started, in list order. */
static void each_service(mg_gateway *gw, hook h)
{
    for (size_t i = 0; i < mg_n_services; i++) {
        const mg_service *s = mg_services[i];
        void (*fn)(mg_gateway *) = h == HOOK_STATE         ? s->state
                                   : h == HOOK_DRAIN       ? s->drain
                                   : h == HOOK_DRAIN_FINAL ? s->drain_final
                                                           : s->stop;
        if (gw->core->started[i] && fn)
            fn(gw);
    }
}

void mg_gateway_stop_services(mg_gateway *gw)
{
    if (gw)
        each_service(gw, HOOK_STOP);
}

void mg_gateway_services_metrics(mg_gateway *gw, struct evbuffer *out)
{
    for (size_t i = 0; i < mg_n_services; i++) {
        if (gw->core->started[i] && mg_services[i]->metrics)
            mg_services[i]->metrics(gw, out);
    }
}

void mg_gateway_services_status(mg_gateway *gw, struct json_t *obj)
{
    for (size_t i = 0; i < mg_n_services; i++) {
        if (gw->core->started[i] && mg_services[i]->status)
            mg_services[i]->status(gw, obj);
    }
}

void mg_gateway_set_serving(mg_gateway *gw)
{
    gw->core->serve_wanted = 1;
    if (gw->state != MG_STATE_STARTING || gw->core->starting_jobs > 0)
        return;
    gw->state = MG_STATE_SERVING;
    each_service(gw, HOOK_STATE);
    mg_info("ready", "state=serving epoch=%016llx", (unsigned long long)gw->epoch);
}

static uint64_t mono_us(void)
{
    return mg_now_mono_ns() / 1000u;
}

/* The loop, until it ends (mg_gateway_run). */
static void run_loop(mg_gateway *gw)
{
    uint64_t window = gw->cfg->busy_poll_us;

    if (window == 0) {
        event_base_dispatch(gw->base);
        return;
    }
    for (;;) {
        uint64_t seen = gw->core->conn_reads, last;
        /* Sleep until something happens; 1: nothing left to wait for. */
        if (event_base_loop(gw->base, EVLOOP_ONCE) != 0 || event_base_got_break(gw->base))
            return;
        if (gw->core->conn_reads == seen)
            continue; /* timers, workers' completions: no client waiting on a reply */
        seen = gw->core->conn_reads;
        last = mono_us();
        for (;;) {
            uint64_t now;
            if (event_base_loop(gw->base, EVLOOP_NONBLOCK) != 0 || event_base_got_break(gw->base))
                return;
            now = mono_us();
            if (gw->core->conn_reads != seen) {
                seen = gw->core->conn_reads;
                last = now;
            } else if (now - last >= window) {
                break;
            }
        }
    }
}

int mg_gateway_run(mg_gateway *gw)
{
    run_loop(gw);
    return gw->core->exit_code;
}

void mg_gateway_check_drained(mg_gateway *gw)
{
    if (gw->core->drain_phase == 2 && mg_list_empty(&gw->core->conns)) {
        mg_info("drained", "result=clean");
        event_base_loopbreak(gw->base);
    }
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    unsigned n = 0;
    mg_list_foreach (&gw->core->conns, node)
        n++;
    mg_warn("drain_timeout", "grace_s=%llu connections_closed=%u",
            (unsigned long long)gw->cfg->grace, n);
    gw->core->drain_phase = 3;
    while (!mg_list_empty(&gw->core->conns))
        mg_conn_free(mg_container_of(mg_list_first(&gw->core->conns), mg_conn, link));
    event_base_loopbreak(gw->base);
}

/* Second step of the drain: the real last stream id, watchers ended. */
static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    gw->core->drain_phase = 2;
    each_service(gw, HOOK_DRAIN_FINAL);
    mg_list_foreach_safe (&gw->core->conns, node, next) {
        mg_conn *c = mg_container_of(node, mg_conn, link); /* only c may be freed here */
        if (c->ng == NULL) {
            mg_conn_free(c);
            continue;
        }
        nghttp2_submit_goaway(c->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(c->ng), NGHTTP2_NO_ERROR,
                              (const uint8_t *)"shutdown", 8);
        mg_conn_send(c);
    }
    mg_gateway_check_drained(gw);
}

void mg_gateway_drain(mg_gateway *gw)
{
    struct timeval rtt = {1, 0};
    struct timeval grace = {(time_t)gw->cfg->grace, 0};
    if (gw->state == MG_STATE_DRAINING) {
        mg_warn("drain_forced", "reason=\"second signal\"");
        grace_cb(-1, 0, gw);
        return;
    }
    gw->state = MG_STATE_DRAINING;
    gw->core->drain_phase = 1;
    mg_info("draining", "grace_s=%llu", (unsigned long long)gw->cfg->grace);
    mg_agentfile_drain(gw); /* the agents as they are now are what the next daemon holds */
    each_service(gw, HOOK_STATE);
    each_service(gw, HOOK_DRAIN);
    mg_listeners_free(gw); /* stop accepting */
    mg_list_foreach (&gw->core->conns, node) {
        mg_conn *c = mg_container_of(node, mg_conn, link);
        if (c->ng) {
            nghttp2_submit_shutdown_notice(c->ng);
            mg_conn_schedule_flush(c);
        }
    }
    gw->core->drain_timer = evtimer_new(gw->base, drain_cb, gw);
    gw->core->grace_timer = evtimer_new(gw->base, grace_cb, gw);
    if (gw->core->drain_timer == NULL || gw->core->grace_timer == NULL) {
        grace_cb(-1, 0, gw);
        return;
    }
    /* the second GOAWAY waits a round trip for clients to see the first: with no connection
     * open there is no one to wait for (a daemon stopped between tests, a node drained idle) */
    if (gw->cfg->grace < 1 || mg_list_empty(&gw->core->conns))
        rtt.tv_sec = 0;
    evtimer_add(gw->core->drain_timer, &rtt);
    evtimer_add(gw->core->grace_timer, &grace);
}

void **mg_gateway_state(mg_gateway *gw, const mg_service *svc)
{
    for (size_t i = 0; i < mg_n_services; i++) {
        if (mg_services[i] == svc)
            return &gw->core->service_state[i];
    }
    abort(); /* not a service of the list: a programming error */
}
