/*
 * mg_ops: the plaintext HTTP/1.1 ops port, served by libevent's evhttp on the gateway loop:
 * /livez, /readyz (/healthz), /metrics and a small status page at /. Read-only: nothing here
 * changes the daemon. The same routes answer GET on the control port (mg_ops_route).
 */
#include "mg_gateway.h"

#include "mg_addr.h"
#include "mg_log.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <stdlib.h>
#include <string.h>

struct mg_ops {
    struct evhttp *http;
};

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
        if (verbose)
            evbuffer_add_printf(body, "[%s] state: %s\n[+] engine: %u workers\n", ready ? "+" : "-",
                                mg_state_name(gw->state), (unsigned)gw->cfg->workers);
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
        mg_engine_get_stats(gw->engine, &es);
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
            "<tr><th align=left>transports</th><td>tcp</td></tr>"
            "</table><p><a href=\"/metrics\">metrics</a> &middot; <a href=\"/readyz?verbose\">"
            "readiness</a></p></body></html>\n",
            MG_VERSION, mg_state_name(gw->state), (unsigned long long)gw->epoch, up,
            (unsigned long long)gw->stats.conns_active,
            (unsigned long long)gw->stats.streams_active, es.workers, es.in_flight, es.queue_depth);
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
