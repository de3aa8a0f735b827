/*
 * mg_ops: the ops pages — /livez, /readyz (/healthz), /metrics, /status.json, /traces and a
 * small status page at / — and the plaintext HTTP/1.1 ops port, served by libevent's evhttp on
 * the gateway loop. Read-only: nothing here changes the daemon. Its init (mg_ops_service, in
 * the list of mg_services.c) registers the pages in the gateway's route table, where the
 * control port finds them for GET and HEAD, and opens the ops port, which answers from the same
 * table (mg_gateway_page).
 *
 * The port is open to anyone who reaches it, so its connections are bounded here, not by
 * evhttp (whose timeout starts again with every byte): each request must arrive whole within
 * --ops-header-timeout of the accept (or of the previous answer on the connection), and at
 * most --ops-max-connections are open at once. evhttp makes each connection's bufferevent
 * through bev_cb, which keeps a reference to it: a sweep every 200 ms (while any is open)
 * shuts down the socket of a connection past its deadline or over the limit — evhttp then sees
 * it close and lets go — and drops the reference of those evhttp has freed (their callbacks
 * are gone), which closes the descriptor. Each accept drops those first, so the limit counts
 * only connections evhttp still serves.
 */
#include "mg_ops.h"

#include "mg_core.h"
#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_trace.h"
#include "moongate/pools.h"
#include "moongate/rdma.h"
#include "moongate/segment.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define OPS_MAX_LISTENERS 8
#define SWEEP_US          200000

/* One ops-port connection, from its accept until evhttp lets go of its bufferevent. */
typedef struct ops_conn {
    struct bufferevent *bev; /* made by bev_cb; one reference is ours */
    uint64_t deadline_ns;    /* its request must be whole by then */
    int over;                /* beyond --ops-max-connections: closed at once */
    int shut;                /* its socket was shut down; evhttp is letting go */
    struct ops_conn *next;
} ops_conn;

typedef struct mg_ops mg_ops;

struct mg_ops {
    struct evhttp *http;
    mg_gateway *gw;
    struct evconnlistener *lev[OPS_MAX_LISTENERS];
    size_t nlev;
    ops_conn *conns;
    uint64_t nconns;
    struct event *sweep;
    mg_ops_counts counts;
};

extern const mg_service mg_ops_service;

/* The ops port's state, NULL without the port (--ops-listen ""). */
static mg_ops *ops_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_ops_service);
}

/* evhttp hands its listeners' error callback the evhttp, not ours: which gateway it is. Loop
 * thread only; a slot per gateway alive in the process. */
static struct {
    struct evhttp *http;
    mg_ops *ops;
} owners[4];

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

/* /status.json: the shared default pool and its leases; a tenant pool is its tenant's. */
static void pools_status(mg_gateway *gw, json_t *obj)
{
    json_t *pools = json_array();
    mg_pools_entry_info *e = calloc(1, sizeof(*e));
    uint64_t leases = 0;
    for (size_t i = 0; pools && e && i < mg_pools_count(gw->pools); i++) {
        if (mg_pools_get(gw->pools, i, e) != 0 || e->tenant[0])
            continue;
        leases += e->stats.leases;
        json_array_append_new(
            pools, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "name", e->name, "capacity",
                             (json_int_t)e->stats.capacity, "in_use", (json_int_t)e->stats.in_use,
                             "free", (json_int_t)e->stats.free, "largest_lease",
                             (json_int_t)e->stats.largest_lease, "leases",
                             (json_int_t)e->stats.leases, "waiters", (json_int_t)e->waiters));
    }
    free(e);
    json_object_set_new(obj, "pools", pools ? pools : json_array());
    json_object_set_new(obj, "leases", json_pack("{s:I}", "live", (json_int_t)leases));
}

/* The read-only summary behind the status page: counts and sizes, nothing of any tenant — the
 * page is open to anyone who reaches the ops port, so a tenant's pool (its name, usage and
 * leases) is not on it; PoolStats shows it to that tenant and to admins. */
static void status_json(mg_gateway *gw, struct evbuffer *body)
{
    mg_engine_stats es;
    mg_gateway_stats gs;
    mg_registry_stats rs = {0};
    mg_registry *reg = mg_engine_registry(gw->engine);
    char rdma[400], epoch[21], pvm[300];
    json_t *j;
    char *text;
    mg_engine_get_stats(gw->engine, &es);
    mg_gateway_get_stats(gw, &gs);
    if (reg)
        mg_registry_get_stats(reg, &rs);
    rdma_line(gw, rdma, sizeof(rdma));
    snprintf(pvm, sizeof(pvm), "%s",
             gw->process_vm && !gw->process_vm_why[0] ? "available" : gw->process_vm_why);
    snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)gw->epoch); /* as Info's JSON */
    j = json_pack("{s:s,s:s,s:s,s:f,s:I,s:I,s:{s:i,s:i,s:i},s:{s:s,s:s,s:s},s:{s:I,s:I,s:I}}",
                  "version", MG_VERSION, "state", mg_state_name(gw->state), "epoch", epoch,
                  "uptime_s", (double)(mg_now_mono_ns() - gw->start_mono_ns) / 1e9, "connections",
                  (json_int_t)gs.conns_active, "streams", (json_int_t)gs.streams_active, "engine",
                  "workers", (int)es.workers, "in_flight", (int)es.in_flight, "queue_depth",
                  (int)es.queue_depth, "transports", "tcp",
                  gw->data_endpoint[0] ? "available" : "off", "rdma", rdma, "process_vm", pvm,
                  "segments", "ready", (json_int_t)rs.segments, "registering",
                  (json_int_t)rs.registering, "bytes", (json_int_t)rs.bytes);
    if (j) {
        pools_status(gw, j);
        mg_gateway_services_status(gw, j); /* each service's own members */
    }
    text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    evbuffer_add_printf(body, "%s\n", text ? text : "{}");
    free(text);
    json_decref(j);
}

/* The status page: one self-contained document (no external assets) that renders
 * /status.json and refreshes it every two seconds. */

/* mg_spans_export's writer: into an evbuffer. */
static void add_text(void *arg, const char *text, size_t len)
{
    evbuffer_add(arg, text, len);
}

static const char status_page[] =
    "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
    "<title>moongate</title><style>"
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222;background:#fafafa}"
    "h1{font-size:20px}h2{font-size:15px;margin-top:1.5em}"
    "table{border-collapse:collapse;background:#fff}"
    "td,th{border:1px solid #ddd;padding:4px 10px;text-align:left}th{background:#eee}"
    ".ok{color:#080}.bad{color:#b00}#err{color:#b00}"
    "</style></head><body>"
    "<h1>moongate <span id=\"version\">?</span> &middot; <span id=\"state\">?</span></h1>"
    "<div id=\"err\"></div>"
    "<table id=\"overview\"></table>"
    "<h2>Buffer pools</h2><table id=\"pools\"></table>"
    "<h2>Peers</h2><table id=\"peers\"></table>"
    "<p><a href=\"/metrics\">metrics</a> &middot; <a href=\"/readyz?verbose\">readiness</a> "
    "&middot; <a href=\"/status.json\">status.json</a></p>"
    "<script>"
    "function b(n){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(n>=1024&&i<4){n/=1024;i++}"
    "return (i?n.toFixed(1):n)+' '+u[i]}"
    "function esc(s){return String(s).replace(/[&<>\"]/g,function(c){return{'&':'&amp;',"
    "'<':'&lt;','>':'&gt;','\"':'&quot;'}[c]})}"
    "function rows(id,head,list){var h=head.some(Boolean)?'<tr>'+head.map(function(x){"
    "return "
    "'<th>'+x+'</th>'}).join('')+'</"
    "tr>':'';list.forEach(function(r){h+='<tr>'+r.map(function(x){return '<td>'+"
    "esc(x)+'</td>'}).join('')+'</tr>'});if(!list.length)h+='<tr><td colspan='+head.length+"
    "'>none</td></tr>';document.getElementById(id).innerHTML=h}"
    "function show(s){document.getElementById('version').textContent=s.version;"
    "var st=document.getElementById('state');st.textContent=s.state;"
    "st.className=s.state=='serving'?'ok':'bad';document.getElementById('err').textContent='';"
    "rows('overview',['',''],[['epoch',s.epoch],['uptime',Math.round(s.uptime_s)+' s'],"
    "['connections',s.connections+' open, '+s.streams+' streams'],"
    "['engine',s.engine.workers+' workers, '+s.engine.in_flight+' of '+s.engine.queue_depth+"
    "' jobs'],['transports','tcp '+s.transports.tcp+'; rdma '+s.transports.rdma],"
    "['segments',s.segments.ready+' ready, '+s.segments.registering+' registering, '+"
    "b(s.segments.bytes)],['leases',s.leases.live+' live'],"
    "['transfers',s.transfers.batches_running+' batches running, '+"
    "s.transfers.requests_in_flight+' requests in flight']]);"
    "rows('pools',['pool','capacity','in use','free','largest lease','leases','waiters'],"
    "s.pools.map(function(p){return [p.name,b(p.capacity),b(p.in_use),b(p.free),"
    "b(p.largest_lease),p.leases,p.waiters]}));"
    "rows('peers',['peer','state','transport','queued','jobs'],s.peers.map(function(p){"
    "return [p.address,p.state,p.transport,p.queued,p.jobs]}))}"
    "function tick(){fetch('/status.json',{cache:'no-store'}).then(function(r){return r.json()})"
    ".then(show).catch(function(e){document.getElementById('err').textContent="
    "'the daemon does not answer: '+e})}"
    "tick();setInterval(tick,2000);"
    "</script></body></html>\n";

/* The pages: each fills body (and *ctype, preset to plain text) and returns the status. */

static int livez(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    evbuffer_add_printf(body, "ok\n");
    return 200;
}

/* /readyz and /healthz: 200 while serving, else 503; ?verbose adds what it is made of. */
static int readyz(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    const char *q = strchr(path, '?');
    int ready = gw->state == MG_STATE_SERVING;
    if (q && strstr(q, "verbose") != NULL) {
        char rdma[400];
        rdma_line(gw, rdma, sizeof(rdma));
        evbuffer_add_printf(body,
                            "[%s] state: %s\n[+] engine: %u workers\n[+] transport tcp\n"
                            "[%s] transport rdma: %s\n",
                            ready ? "+" : "-", mg_state_name(gw->state), (unsigned)gw->cfg->workers,
                            gw->rdma ? "+" : "-", rdma);
    }
    evbuffer_add_printf(body, "%s\n", ready ? "ok" : mg_state_name(gw->state));
    return ready ? 200 : 503;
}

static int metrics(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    static const mg_ops_counts none;
    mg_ops *ops = ops_of(gw);
    *ctype = "text/plain; version=0.0.4; charset=utf-8";
    mg_ops_metrics(gw, ops ? &ops->counts : &none, body);
    return 200;
}

static int status(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    *ctype = "application/json";
    status_json(gw, body);
    return 200;
}

/* OTLP/JSON lines of the sampled spans, oldest first. */
static int traces(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    *ctype = "application/x-ndjson";
    mg_spans_export(gw->spans, "moongate", add_text, body);
    return 200;
}

static int index_page(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype)
{
    *ctype = "text/html; charset=utf-8";
    evbuffer_add(body, status_page, sizeof(status_page) - 1);
    return 200;
}

/* In the order the 404 answer names them; /healthz is /readyz's other name. */
static const mg_page ops_pages[] = {
    MG_PAGE("/livez", livez),
    MG_PAGE("/readyz", readyz),
    {.route = {"GET", "/healthz", 0, NULL}, .render = readyz, .hidden = 1},
    MG_PAGE("/metrics", metrics),
    MG_PAGE("/status.json", status),
    MG_PAGE("/traces", traces),
    MG_PAGE("/", index_page),
};

static ops_conn *find_conn(mg_ops *ops, const struct bufferevent *bev)
{
    for (ops_conn *c = ops->conns; c; c = c->next) {
        if (c->bev == bev)
            return c;
    }
    return NULL;
}

/* Drops our reference to each connection evhttp has let go of (its callbacks are gone), which
 * closes its descriptor. Returns how many went. */
static int reclaim(mg_ops *ops)
{
    ops_conn **pp = &ops->conns;
    int freed = 0;
    while (*pp) {
        ops_conn *c = *pp;
        bufferevent_event_cb eventcb = NULL;
        bufferevent_getcb(c->bev, NULL, NULL, &eventcb, NULL);
        if (eventcb == NULL) {
            *pp = c->next;
            bufferevent_decref(c->bev);
            free(c);
            ops->nconns--;
            freed++;
            continue;
        }
        pp = &c->next;
    }
    return freed;
}

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_ops *ops = arg;
    mg_gateway *gw = ops->gw;
    uint64_t now = mg_now_mono_ns();
    int freed = reclaim(ops);
    for (ops_conn *c = ops->conns; c; c = c->next) {
        if (!c->shut && (c->over || now > c->deadline_ns)) {
            evutil_socket_t sfd = bufferevent_getfd(c->bev);
            if (!c->over) {
                ops->counts.header_timeouts++;
                mg_info("ops_conn_timeout",
                        "reason=\"request not whole within --ops-header-timeout\" seconds=%llu",
                        (unsigned long long)gw->cfg->ops_header_timeout);
            }
            if (sfd >= 0)
                shutdown(sfd, SHUT_RDWR);
            c->shut = 1;
        }
    }
    if (ops->conns == NULL)
        evtimer_del(ops->sweep);
    if (freed)
        mg_accept_resume(gw);
}

/* evhttp: the bufferevent of a new connection (no socket yet). */
static struct bufferevent *bev_cb(struct event_base *base, void *arg)
{
    mg_ops *ops = arg;
    mg_gateway *gw = ops->gw;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    ops_conn *c = calloc(1, sizeof(*c));
    if (bev == NULL || c == NULL) {
        free(c);
        return bev; /* untracked: evhttp's own timeout still applies */
    }
    mg_accept_ok(gw);
    bufferevent_incref(bev);
    c->bev = bev;
    c->deadline_ns = mg_now_mono_ns() + gw->cfg->ops_header_timeout * 1000000000ULL;
    /* Connections their clients closed, and evhttp with them, count no more: not only from the
     * next sweep on (a client that closes its connections and opens one is not refused). */
    reclaim(ops);
    if (ops->nconns >= gw->cfg->ops_max_connections) {
        c->over = 1;
        if (ops->counts.refused++ == 0 || ops->counts.refused % 1000 == 0)
            mg_warn("ops_conn_refused", "reason=\"--ops-max-connections\" limit=%llu refused=%llu",
                    (unsigned long long)gw->cfg->ops_max_connections,
                    (unsigned long long)ops->counts.refused);
    }
    c->next = ops->conns;
    ops->conns = c;
    ops->nconns++;
    if (c->over) {
        event_active(ops->sweep, EV_TIMEOUT, 0); /* once evhttp has given it its socket */
    } else if (!evtimer_pending(ops->sweep, NULL)) {
        struct timeval tv = {0, SWEEP_US};
        evtimer_add(ops->sweep, &tv);
    }
    return bev;
}

static void ops_accept_error_cb(struct evconnlistener *lev, void *http)
{
    int err = EVUTIL_SOCKET_ERROR();
    for (size_t i = 0; i < sizeof(owners) / sizeof(owners[0]); i++) {
        if (owners[i].http == http) {
            mg_accept_failed(owners[i].ops->gw, "ops", err);
            return;
        }
    }
}

static void ops_cb(struct evhttp_request *req, void *arg)
{
    mg_gateway *gw = arg;
    mg_ops *ops = ops_of(gw);
    ops_conn *c =
        ops ? find_conn(ops, evhttp_connection_get_bufferevent(evhttp_request_get_connection(req)))
            : NULL;
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
        status = mg_gateway_page(gw, evhttp_request_get_uri(req), body, &ctype);
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evhttp_send_reply(req, status,
                      status == 200   ? "OK"
                      : status == 503 ? "Service Unavailable"
                      : status == 405 ? "Method Not Allowed"
                                      : "Not Found",
                      body);
    evbuffer_free(body);
    if (c) /* answered: the next request on the connection has its own deadline */
        c->deadline_ns = mg_now_mono_ns() + gw->cfg->ops_header_timeout * 1000000000ULL;
}

/* Opens the ops port on each address of listen. Returns 0 or an MG_ERR_* (logged); what was
 * made is let go by ops_stop either way. */
static int ops_start(mg_gateway *gw, const char *listen)
{
    char buf[512], *save = NULL, *tok;
    mg_ops *ops = calloc(1, sizeof(*ops));
    size_t slot = 0;
    int rc;
    if (ops == NULL)
        return MG_ERR_NOMEM;
    *mg_gateway_state(gw, &mg_ops_service) = ops;
    ops->gw = gw;
    ops->http = evhttp_new(gw->base);
    ops->sweep = event_new(gw->base, -1, EV_PERSIST, sweep_cb, ops); /* while any is open */
    if (ops->http == NULL || ops->sweep == NULL)
        return MG_ERR_NOMEM;
    while (slot < sizeof(owners) / sizeof(owners[0]) && owners[slot].http)
        slot++;
    if (slot == sizeof(owners) / sizeof(owners[0])) {
        mg_error("listen_failed", "ops=%s reason=\"too many gateways in one process\"", listen);
        return MG_ERR_FULL;
    }
    owners[slot].http = ops->http;
    owners[slot].ops = ops;
    evhttp_set_gencb(ops->http, ops_cb, gw);
    evhttp_set_bevcb(ops->http, bev_cb, ops);
    evhttp_set_timeout(ops->http, 30);
    evhttp_set_max_headers_size(ops->http, 16384);
    evhttp_set_max_body_size(ops->http, 0);
    evhttp_set_allowed_methods(ops->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
    snprintf(buf, sizeof(buf), "%s", listen);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct evhttp_bound_socket *bound;
        char host[256];
        int port;
        while (*tok == ' ')
            tok++;
        if (mg_split_host_port(tok, host, sizeof(host), &port) != 0 || port == 0) {
            mg_error("listen_failed", "ops=%s reason=\"not a host:port\"", tok);
            return MG_ERR_INVALID;
        }
        if (ops->nlev == OPS_MAX_LISTENERS) {
            mg_error("listen_failed", "ops=%s reason=\"more than %d ops listeners\"", tok,
                     OPS_MAX_LISTENERS);
            return MG_ERR_INVALID;
        }
        bound = evhttp_bind_socket_with_handle(ops->http, host, (ev_uint16_t)port);
        if (bound == NULL) {
            mg_error("listen_failed", "ops=%s:%d reason=\"cannot bind\"", host, port);
            return MG_ERR_SYSTEM;
        }
        ops->lev[ops->nlev] = evhttp_bound_socket_get_listener(bound);
        evconnlistener_set_error_cb(ops->lev[ops->nlev], ops_accept_error_cb);
        /* paused with the gateway's own listeners when descriptors run out */
        if ((rc = mg_gateway_add_listener(gw, ops->lev[ops->nlev++])) != 0)
            return rc;
        mg_info("listen", "addr=%s%s%s:%d kind=ops", strchr(host, ':') ? "[" : "", host,
                strchr(host, ':') ? "]" : "", port);
    }
    return 0;
}

static void ops_stop(mg_gateway *gw)
{
    mg_ops *ops = ops_of(gw);
    if (ops == NULL)
        return;
    for (size_t i = 0; i < ops->nlev; i++)
        mg_gateway_del_listener(gw, ops->lev[i]);
    for (size_t i = 0; i < sizeof(owners) / sizeof(owners[0]); i++) {
        if (owners[i].ops == ops)
            owners[i].http = NULL, owners[i].ops = NULL;
    }
    if (ops->http)
        evhttp_free(ops->http); /* frees its connections: their callbacks go */
    while (ops->conns) {
        ops_conn *c = ops->conns;
        ops->conns = c->next;
        bufferevent_decref(c->bev);
        free(c);
    }
    if (ops->sweep)
        event_free(ops->sweep);
    free(ops);
    *mg_gateway_state(gw, &mg_ops_service) = NULL;
}

/* At start: the pages into the route table, then the port (none with --ops-listen ""). */
static int ops_init(mg_gateway *gw)
{
    int rc;
    for (size_t i = 0; i < MG_NELEM(ops_pages); i++) {
        if ((rc = mg_gateway_add_page(gw, &ops_pages[i])) != 0)
            return rc;
    }
    return *gw->cfg->ops_listen ? ops_start(gw, gw->cfg->ops_listen) : 0;
}

const mg_service mg_ops_service = {.name = "ops", .init = ops_init, .free = ops_stop};
