/*
 * mg_ops: the plaintext HTTP/1.1 ops port, served by libevent's evhttp on the gateway loop:
 * /livez, /readyz (/healthz), /metrics and a small status page at /. Read-only: nothing here
 * changes the daemon. The same routes answer GET on the control port (mg_ops_route).
 */
#include "mg_gateway.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "moongate/rdma.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_ops {
    struct evhttp *http;
};

/* "2 devices (mlx5_0, mlx5_1)", or why RDMA is not in use. */
static void rdma_line(mg_gateway *gw, char *out, size_t cap)
{
    int n = mg_rdma_device_count(gw->rdma);
    size_t used;
    if (n == 0) {
        snprintf(out, cap, "unavailable (%s)", gw->rdma_why[0] ? gw->rdma_why : "not started");
        return;
    }
    used = (size_t)snprintf(out, cap, "%d device%s (", n, n == 1 ? "" : "s");
    for (int i = 0; i < n && used < cap; i++) {
        mg_rdma_device_info d;
        mg_rdma_device(gw->rdma, i, &d);
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? ", " : "", d.name);
    }
    if (used < cap)
        snprintf(out + used, cap - used, ")");
}

int mg_ops_route(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    char clean[256];
    const char *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    int verbose = q && strstr(q, "verbose") != NULL;
    if (n >= sizeof(clean))
        n = sizeof(clean) - 1;
    memcpy(clean, path, n);
    clean[n] = '\0';

    *ctype = "text/plain; charset=utf-8";
    if (!strcmp(clean, "/livez")) {
        evbuffer_add_printf(body, "ok\n");
        return 200;
    }
    if (!strcmp(clean, "/readyz") || !strcmp(clean, "/healthz")) {
        int ready = gw->state == MG_STATE_SERVING;
        if (verbose) {
            char rdma[400];
            rdma_line(gw, rdma, sizeof(rdma));
            evbuffer_add_printf(body,
                                "[%s] state: %s\n[+] engine: %u workers\n[+] transport tcp\n"
                                "[%s] transport rdma: %s\n",
                                ready ? "+" : "-", mg_state_name(gw->state),
                                (unsigned)gw->cfg->workers, gw->rdma ? "+" : "-", rdma);
        }
        evbuffer_add_printf(body, "%s\n", ready ? "ok" : mg_state_name(gw->state));
        return ready ? 200 : 503;
    }
    if (!strcmp(clean, "/metrics")) {
        *ctype = "text/plain; version=0.0.4; charset=utf-8";
        mg_metrics_render(gw, body);
        return 200;
    }
    if (!strcmp(clean, "/")) {
        mg_engine_stats es;
        double up = (double)(mg_now_mono_ns() - gw->start_mono_ns) / 1e9;
        char rdma[400], html[1200];
        size_t k = 0;
        mg_engine_get_stats(gw->engine, &es);
        rdma_line(gw, rdma, sizeof(rdma));
        for (const char *c = rdma; *c && k + 6 < sizeof(html); c++) { /* escaped for HTML */
            const char *e = *c == '<' ? "&lt;" : *c == '>' ? "&gt;" : *c == '&' ? "&amp;" : NULL;
            if (e) {
                memcpy(html + k, e, strlen(e));
                k += strlen(e);
            } else {
                html[k++] = *c;
            }
        }
        html[k] = '\0';
        *ctype = "text/html; charset=utf-8";
        evbuffer_add_printf(
            body,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>moongate</title></head>"
            "<body><h1>moongate %s</h1><table>"
            "<tr><th align=left>state</th><td>%s</td></tr>"
            "<tr><th align=left>epoch</th><td>%016llx</td></tr>"
            "<tr><th align=left>uptime</th><td>%.0f s</td></tr>"
            "<tr><th align=left>connections</th><td>%llu open</td></tr>"
            "<tr><th align=left>streams</th><td>%llu open</td></tr>"
            "<tr><th align=left>engine</th><td>%u workers, %u of %u jobs in flight</td></tr>"
            "<tr><th align=left>transports</th><td>tcp; rdma: %s</td></tr>"
            "</table><p><a href=\"/metrics\">metrics</a> &middot; <a href=\"/readyz?verbose\">"
            "readiness</a></p></body></html>\n",
            MG_VERSION, mg_state_name(gw->state), (unsigned long long)gw->epoch, up,
            (unsigned long long)gw->stats.conns_active,
            (unsigned long long)gw->stats.streams_active, es.workers, es.in_flight, es.queue_depth,
            html);
        return 200;
    }
    evbuffer_add_printf(body, "not found: %s (try /livez /readyz /metrics /)\n", clean);
    return 404;
}

static void ops_cb(struct evhttp_request *req, void *arg)
{
    mg_gateway *gw = arg;
    struct evbuffer *body = evbuffer_new();
    const char *ctype = "text/plain";
    int status;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);

    if (body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evbuffer_add_printf(body, "the ops port is read-only: use GET\n");
        status = 405;
    } else {
        status = mg_ops_route(gw, evhttp_request_get_uri(req), body, &ctype);
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evhttp_send_reply(req, status,
                      status == 200   ? "OK"
                      : status == 503 ? "Service Unavailable"
                      : status == 405 ? "Method Not Allowed"
                                      : "Not Found",
                      body);
    evbuffer_free(body);
}

int mg_ops_start(mg_gateway *gw, const char *listen)
{
    char buf[512], *save = NULL, *tok;
    gw->ops = calloc(1, sizeof(*gw->ops));
    if (gw->ops == NULL)
        return MG_ERR_NOMEM;
    gw->ops->http = evhttp_new(gw->base);
    if (gw->ops->http == NULL)
        return MG_ERR_NOMEM;
    evhttp_set_gencb(gw->ops->http, ops_cb, gw);
    evhttp_set_timeout(gw->ops->http, 30);
    evhttp_set_max_headers_size(gw->ops->http, 16384);
    evhttp_set_max_body_size(gw->ops->http, 0);
    evhttp_set_allowed_methods(gw->ops->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
    snprintf(buf, sizeof(buf), "%s", listen);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char host[256];
        int port;
        while (*tok == ' ')
            tok++;
        if (mg_split_host_port(tok, host, sizeof(host), &port) != 0 || port == 0) {
            mg_error("listen_failed", "ops=%s reason=\"not a host:port\"", tok);
            return MG_ERR_INVALID;
        }
        if (evhttp_bind_socket(gw->ops->http, host, (ev_uint16_t)port) != 0) {
            mg_error("listen_failed", "ops=%s:%d reason=\"cannot bind\"", host, port);
            return MG_ERR_SYSTEM;
        }
        mg_info("listen", "addr=%s%s%s:%d kind=ops", strchr(host, ':') ? "[" : "", host,
                strchr(host, ':') ? "]" : "", port);
    }
    return 0;
}

void mg_ops_stop(mg_gateway *gw)
{
    if (gw->ops == NULL)
        return;
    if (gw->ops->http)
        evhttp_free(gw->ops->http);
    free(gw->ops);
    gw->ops = NULL;
}
