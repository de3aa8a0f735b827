/*
 * mg_peer_rpc: calls to peer daemons' control ports (see mg_peer_rpc.h).
 */
#include "mg_peer_rpc.h"
#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_pbcheck.h"
#include "mg_rdma_wire.h"
#include "mg_time.h"

#include "moongate/v1/peer.pb-c.h"

#include <event2/event.h>

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The call started on the channel's connection (a new one when the old one is known to have
 * failed): to `addr`, or for a name to where it was looked up. Returns 0, 1 when the name must
 * be looked up first (nothing started), or -1 with err set. */
static int call_now(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                    const uint8_t *buf, size_t len, const mg_rpc_handlers *h, void *arg, char *err,
                    size_t errcap)
{
    uint32_t timeout_ms = (uint32_t)gw->cfg->data_io_timeout * 1000; /* as for the data plane */
    /* This daemon's identity towards peers: --peer-cert, else its server certificate. */
    const char *peer_cert = gw->cfg->peer_cert[0] ? gw->cfg->peer_cert : gw->cfg->tls_cert;
    const char *peer_key = gw->cfg->peer_cert[0] ? gw->cfg->peer_key : gw->cfg->tls_key;
    int named = !mg_is_numeric_host_port(addr);
    char name[256];
    int port;
    mg_rpc *rpc = NULL;
    ch->gw = gw;
    for (int attempt = 0; attempt < 2 && rpc == NULL; attempt++) {
        if (ch->client == NULL) {
            mg_client_options o = {.target = named ? ch->resolved : addr,
                                   .tls = gw->cfg->peer_tls,
                                   .ca_file = gw->cfg->peer_ca[0] ? gw->cfg->peer_ca : NULL,
                                   .cert_file = peer_cert[0] ? peer_cert : NULL,
                                   .key_file = peer_cert[0] ? peer_key : NULL,
                                   .connect_timeout_ms = timeout_ms};
            if (named && ch->resolved[0] == '\0')
                return 1;
            if (named && mg_split_host_port(addr, name, sizeof(name), &port) == 0)
                o.server_name = name; /* SNI, and the name its certificate must carry */
            ch->used = 0;
            if (mg_client_new(&ch->client, gw->base, &o, err, errcap) != 0) {
                ch->client = NULL;
                return -1;
            }
        }
        rpc = mg_rpc_start(ch->client, path, NULL, 0, timeout_ms, h, arg);
        if (rpc == NULL) /* its connection failed earlier: once more on a new one */
            mg_peer_chan_close(ch);
    }
    if (rpc == NULL) {
        snprintf(err, errcap, "its control connection failed");
        return -1;
    }
    mg_rpc_send(rpc, buf, len);
    mg_rpc_close_send(rpc);
    return 0;
}

/* ---- peers by name: looked up on a worker ---- */

typedef struct mg_peer_pending {
    char path[64];
    uint8_t *buf;
    size_t len;
    const mg_rpc_handlers *h;
    void *arg;
    char addr[MG_PEER_NAME_MAX + 1];
    struct mg_peer_pending *next;
} mg_peer_pending;

typedef struct lookup_job {
    mg_peer_chan *ch;
    char host[256], port[8];
    uint32_t timeout_ms;
    int ran;
    char found[80]; /* "ip:port" that took a connection, or "" */
    char why[300];
} lookup_job;

/* Connects to a (non-blocking, at most timeout_ms). Returns 0, or an errno. */
static int probe(const struct addrinfo *a, uint32_t timeout_ms)
{
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), err = 0;
    socklen_t sl = sizeof(err);
    struct pollfd pfd;
    if (fd < 0)
        return errno;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
        err = errno;
    } else {
        pfd = (struct pollfd){.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, (int)timeout_ms) != 1)
            err = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
            err = errno;
    }
    close(fd);
    return err;
}

/* Worker: the name's addresses, each tried in turn until one takes a connection. */
static int lookup_work(void *arg)
{
    lookup_job *j = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ip[INET6_ADDRSTRLEN], last[200] = "";
    int rc, n = 0;
    j->ran = 1;
    rc = getaddrinfo(j->host, j->port, &hints, &ai);
    if (rc != 0) {
        snprintf(j->why, sizeof(j->why), "cannot resolve \"%s\": %s", j->host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return MG_ERR_UNAVAILABLE;
    }
    for (const struct addrinfo *a = ai; a && j->found[0] == '\0'; a = a->ai_next, n++) {
        int err;
        if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), NULL, 0, NI_NUMERICHOST) != 0)
            continue;
        if ((err = probe(a, j->timeout_ms)) == 0)
            snprintf(j->found, sizeof(j->found), "%s%s%s:%s", a->ai_family == AF_INET6 ? "[" : "",
                     ip, a->ai_family == AF_INET6 ? "]" : "", j->port);
        else
            snprintf(last, sizeof(last), "%s: %s", ip, strerror(err));
    }
    freeaddrinfo(ai);
    if (j->found[0])
        return 0;
    snprintf(j->why, sizeof(j->why), "\"%.100s\" has %d address%s; none took a connection (%.120s)",
             j->host, n, n == 1 ? "" : "es", last);
    return MG_ERR_UNAVAILABLE;
}

/* Loop: the lookup is over; the calls that waited for it start, or end saying why not. */
static void lookup_done(void *arg, int result)
{
    lookup_job *j = arg;
    mg_peer_chan *ch = j->ch;
    mg_peer_pending *list = ch->pending;
    ch->pending = NULL;
    ch->resolving = 0;
    ch->lookups++;
    if (!j->ran)
        snprintf(j->why, sizeof(j->why), "the daemon is stopping");
    if (result == 0 && j->ran) {
        snprintf(ch->resolved, sizeof(ch->resolved), "%s", j->found);
        mg_info("peer_resolved", "name=%s:%s addr=%s", j->host, j->port, j->found);
    } else {
        ch->lookup_failures++;
        mg_warn("peer_resolve_failed", "name=%s:%s error=\"%s\"", j->host, j->port, j->why);
    }
    while (list) {
        mg_peer_pending *pc = list;
        char err[300];
        int rc = -1;
        list = pc->next;
        if (ch->resolved[0])
            rc = call_now(ch->gw, ch, pc->addr, pc->path, pc->buf, pc->len, pc->h, pc->arg, err,
                          sizeof(err));
        if (rc != 0)
            pc->h->on_close(NULL, MG_GRPC_UNAVAILABLE, rc == -1 && ch->resolved[0] ? err : j->why,
                            pc->arg);
        free(pc->buf);
        free(pc);
    }
    free(j);
}

/* The call waits for the lookup of addr's name (started unless one runs). Returns 0, or -1
 * with err set. */
static int pend(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                const uint8_t *buf, size_t len, const mg_rpc_handlers *h, void *arg, char *err,
                size_t errcap)
{
    mg_peer_pending *pc = calloc(1, sizeof(*pc)), **tail;
    lookup_job *j = NULL;
    int port;
    if (pc == NULL || (pc->buf = malloc(len ? len : 1)) == NULL ||
        (!ch->resolving && (j = calloc(1, sizeof(*j))) == NULL)) {
        if (pc)
            free(pc->buf);
        free(pc);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    memcpy(pc->buf, buf, len);
    *pc = (mg_peer_pending){.buf = pc->buf, .len = len, .h = h, .arg = arg};
    snprintf(pc->path, sizeof(pc->path), "%s", path);
    snprintf(pc->addr, sizeof(pc->addr), "%s", addr);
    if (j) {
        j->ch = ch;
        j->timeout_ms = (uint32_t)gw->cfg->data_io_timeout * 1000;
        if (mg_split_host_port(addr, j->host, sizeof(j->host), &port) == 0)
            snprintf(j->port, sizeof(j->port), "%d", port); /* before the worker may run */
        if (j->port[0] == '\0' ||
            mg_engine_submit(gw->engine, gw->cq, lookup_work, lookup_done, j) != 0) {
            snprintf(err, errcap, "its name cannot be looked up now (the engine's queue is full)");
            free(j);
            free(pc->buf);
            free(pc);
            return -1;
        }
        ch->resolving = 1;
    }
    for (tail = &ch->pending; *tail; tail = &(*tail)->next)
        ;
    *tail = pc;
    return 0;
}

int mg_peer_call(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                 const ProtobufCMessage *req, const mg_rpc_handlers *h, void *arg, char *err,
                 size_t errcap)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    int rc;
    if (buf == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    protobuf_c_message_pack(req, buf);
    ch->gw = gw;
    rc = ch->resolving ? 1 : call_now(gw, ch, addr, path, buf, len, h, arg, err, errcap);
    if (rc == 1) /* a name not looked up (again) yet */
        rc = pend(gw, ch, addr, path, buf, len, h, arg, err, errcap);
    free(buf);
    return rc;
}

typedef struct {
    const ProtobufCMessageDescriptor *desc;
    mg_peer_answer_fn answered;
    void *arg;
    uint8_t *resp; /* the answer's bytes, until the call closes */
    size_t len;
} unary_call;

static void unary_msg(mg_rpc *rpc, const uint8_t *m, size_t len, void *arg)
{
    unary_call *u = arg;
    (void)rpc;
    free(u->resp);
    u->resp = malloc(len ? len : 1);
    u->len = len;
    if (u->resp)
        memcpy(u->resp, m, len);
}

static void unary_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    unary_call *u = arg;
    ProtobufCMessage *m = NULL;
    char err[256];
    (void)rpc;
    if (status == 0 && u->resp &&
        mg_pb_check_strings(u->desc, u->resp, u->len, err, sizeof(err)) == 0)
        m = protobuf_c_message_unpack(u->desc, NULL, u->len, u->resp);
    free(u->resp);
    u->answered(u->arg, status, message, m);
    free(u);
}

int mg_peer_unary(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                  const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                  mg_peer_answer_fn answered, void *arg, char *err, size_t errcap)
{
    static const mg_rpc_handlers h = {unary_msg, unary_closed};
    unary_call *u = calloc(1, sizeof(*u));
    if (u == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    *u = (unary_call){desc, answered, arg, NULL, 0};
    if (mg_peer_call(gw, ch, addr, path, req, &h, u, err, errcap) != 0) {
        free(u);
        return -1;
    }
    return 0;
}

void mg_peer_chan_close(mg_peer_chan *ch)
{
    mg_client_del(ch->client);
    ch->client = NULL;
    ch->resolved[0] = '\0'; /* a name is looked up again for the next connection */
}

void mg_peer_chan_free(mg_peer_chan *ch)
{
    mg_peer_chan_close(ch);
    while (ch->pending) {
        mg_peer_pending *pc = ch->pending;
        ch->pending = pc->next;
        pc->h->on_close(NULL, MG_GRPC_CANCELLED, "the daemon is stopping", pc->arg);
        free(pc->buf);
        free(pc);
    }
}

/* ---- the calls the engine's peer directory asks for ---- */

/* What a peer's refusal of OpenSession means for the requests: it does not trust this daemon
 * (PERMISSION_DENIED, whichever of the two it said), speaks no version we do (UNIMPLEMENTED),
 * or cannot be used now (UNAVAILABLE). */
static int session_refusal(int status)
{
    switch (status) {
    case MG_GRPC_UNAUTHENTICATED:
    case MG_GRPC_PERMISSION_DENIED:
        return MG_ERR_PERMISSION;
    case MG_GRPC_UNIMPLEMENTED:
        return MG_ERR_UNSUPPORTED;
    default:
        return MG_ERR_UNAVAILABLE;
    }
}

/* A fresh control connection for a peer whose old one failed (outside the client's callbacks). */
static void reopen_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_xfer_peer *p = arg;
    (void)fd, (void)what;
    mg_peer_chan_close(mg_peer_chan_of(p));
    mg_peer_open_session(mg_peer_chan_of(p)->gw, p);
}

static void open_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    mg_xfer_peer *p = arg;
    Moongate__V1__OpenSessionResponse *resp = (void *)m;
    mg_peer_session s;
    if (status == MG_GRPC_UNAVAILABLE && mg_peer_chan_of(p)->used) {
        /* The connection served an earlier session; the peer may have restarted since. */
        static const struct timeval now = {0, 0};
        mg_peer_chan_of(p)->used = 0;
        if (event_base_once(mg_peer_chan_of(p)->gw->base, -1, EV_TIMEOUT, reopen_cb, p, &now) == 0)
            return;
    }
    if (resp == NULL || resp->token.len != MG_DF_TOKEN_BYTES) {
        if (resp)
            moongate__v1__open_session_response__free_unpacked(resp, NULL);
        mg_peerdir_failed(p, status ? session_refusal(status) : MG_ERR_UNAVAILABLE,
                          status ? message : "a malformed OpenSession answer");
        return;
    }
    if (resp->protocol_version < MG_DF_VERSION_MIN || resp->protocol_version > MG_DF_VERSION) {
        char why[160];
        snprintf(why, sizeof(why),
                 "it answered data-plane protocol version %u; this daemon speaks %u..%u",
                 resp->protocol_version, MG_DF_VERSION_MIN, MG_DF_VERSION);
        moongate__v1__open_session_response__free_unpacked(resp, NULL);
        mg_peerdir_failed(p, MG_ERR_UNSUPPORTED, why);
        return;
    }
    s = (mg_peer_session){.token = resp->token.data,
                          .data_host = resp->data_host,
                          .data_port = (int)resp->data_port,
                          .epoch = resp->epoch,
                          .expires_in_ms = resp->expires_in_ms,
                          .rdma = resp->rdma,
                          .rdma_devices = resp->rdma_devices,
                          .via = mg_peer_chan_of(p)->resolved[0] ? mg_peer_chan_of(p)->resolved
                                                                 : NULL};
    mg_peer_chan_of(p)->used = 1;
    mg_peerdir_opened(p, &s, mg_now_mono_ms());
    moongate__v1__open_session_response__free_unpacked(resp, NULL);
}

void mg_peer_open_session(mg_gateway *gw, mg_xfer_peer *p)
{
    Moongate__V1__OpenSessionRequest req = MOONGATE__V1__OPEN_SESSION_REQUEST__INIT;
    char err[256];
    req.protocol_version = MG_DF_VERSION;
    req.min_protocol_version = MG_DF_VERSION_MIN;
    req.tenant = p->tenant; /* the peer serves this session only that tenant's targets */
    if (mg_peer_unary(gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Peer/OpenSession", &req.base,
                      &moongate__v1__open_session_response__descriptor, open_answered, p, err,
                      sizeof(err)) != 0)
        mg_peerdir_failed(p, MG_ERR_UNAVAILABLE, err);
}

typedef struct {
    mg_xfer_peer *p;
    void *job; /* the directory's RDMA set-up */
} connect_call;

static void connect_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    connect_call cc = *(connect_call *)arg;
    Moongate__V1__ConnectRdmaResponse *resp = (void *)m;
    mg_rdma_ep remote;
    char why[300];
    free(arg);
    if (resp == NULL)
        snprintf(why, sizeof(why), "ConnectRdma: %.200s", status ? message : "a malformed answer");
    else if (mg_rdma_wire_decode(resp->endpoint, &remote, why, sizeof(why)) == 0)
        why[0] = '\0';
    if (resp)
        moongate__v1__connect_rdma_response__free_unpacked(resp, NULL);
    mg_peerdir_rdma_answered(cc.job, why[0] ? NULL : &remote, why,
                             resp == NULL && status == MG_GRPC_UNAUTHENTICATED);
}

int mg_peer_connect_rdma(mg_gateway *gw, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                         void *job, char *why, size_t cap)
{
    Moongate__V1__ConnectRdmaRequest req = MOONGATE__V1__CONNECT_RDMA_REQUEST__INIT;
    connect_call *cc = malloc(sizeof(*cc));
    mg_rdma_wire w;
    if (cc == NULL) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    *cc = (connect_call){p, job};
    mg_rdma_wire_encode(local, &w);
    req.token.data = p->token;
    req.token.len = sizeof(p->token);
    req.endpoint = &w.msg;
    req.device = device; /* our device k with the peer's device k */
    if (mg_peer_unary(gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Peer/ConnectRdma", &req.base,
                      &moongate__v1__connect_rdma_response__descriptor, connect_answered, cc, why,
                      cap) != 0) {
        free(cc);
        return -1;
    }
    return 0;
}

typedef struct {
    mg_peer_described_fn described;
    void *arg;
} describe_call;

void mg_peer_desc_of(const Moongate__V1__TargetDescriptor *d, mg_remote_desc *out)
{
    /* TCP unless the peer lists transports without it (GPU memory: RDMA only) */
    *out = (mg_remote_desc){.id = d->id,
                            .is_lease = d->is_lease,
                            .size = d->size,
                            .remote_accessible = d->remote_accessible,
                            .transports = 1u << MG_TRANSPORT_TCP};
    for (size_t t = 0; t < d->n_transports; t++)
        if (!strcmp(d->transports[t], "tcp"))
            break;
        else if (t + 1 == d->n_transports)
            out->transports = 0;
    for (size_t t = 0; t < d->n_transports; t++) {
        if (!strcmp(d->transports[t], "rdma") && d->rdma_rkey) {
            out->transports |= 1u << MG_TRANSPORT_RDMA;
            out->rdma_addr = d->rdma_addr;
            out->rdma_rkey = d->rdma_rkey;
            for (size_t k = 0; k < d->n_rdma_rkeys && k < 8; k++)
                out->rdma_rkeys[out->rdma_nkeys++] = d->rdma_rkeys[k];
        }
    }
}

static void describe_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    describe_call dc = *(describe_call *)arg;
    Moongate__V1__TargetDescriptor *d = (void *)m;
    mg_remote_desc rd;
    (void)message;
    free(arg);
    if (d == NULL) {
        dc.described(dc.arg, NULL, 0, status ? status : MG_GRPC_INTERNAL);
        return;
    }
    mg_peer_desc_of(d, &rd);
    dc.described(dc.arg, &rd, d->epoch, 0);
    moongate__v1__target_descriptor__free_unpacked(d, NULL);
}

int mg_peer_describe(mg_gateway *gw, mg_xfer_peer *p, uint64_t id, int is_lease,
                     mg_peer_described_fn described, void *arg)
{
    Moongate__V1__DescribeTargetRequest req = MOONGATE__V1__DESCRIBE_TARGET_REQUEST__INIT;
    describe_call *dc = malloc(sizeof(*dc));
    char err[256];
    if (dc == NULL)
        return -1;
    *dc = (describe_call){described, arg};
    req.id = id;
    req.is_lease = is_lease;
    req.tenant = p->tenant;
    if (mg_peer_unary(gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Peer/DescribeTarget",
                      &req.base, &moongate__v1__target_descriptor__descriptor, describe_answered,
                      dc, err, sizeof(err)) != 0) {
        free(dc);
        return -1;
    }
    return 0;
}

/* ---- DescribeAgent: a peer's agent, kept in the caches ---- */

typedef struct ask_call {
    mg_gateway *gw;
    mg_xfer_peer *p;
    mg_peer_agent_fn fn;
    void *arg;
} ask_call;

/* Keeps what the peer said of the agent: its regions' descriptors and the regions. Returns 0,
 * or -1 when the answer cannot be kept (why set). */
static int keep(mg_gateway *gw, mg_xfer_peer *p, const Moongate__V1__PeerAgent *a, char *why,
                size_t cap)
{
    mg_peer_cache *descs = mg_gateway_peer_cache(gw);
    mg_remote_region *rr = calloc(a->n_regions + 1, sizeof(*rr));
    mg_remote_agent ra = {.port = a->port, .agent_id = a->agent_id, .n = a->n_regions};
    int rc = mg_peer_cache_epoch(descs, p->key, a->epoch, mg_now_mono_ms());
    if (rr == NULL || rc < 0 || strlen(a->name) > MG_AGENT_NAME_MAX) {
        free(rr);
        snprintf(why, cap, rc < 0 ? "its epoch cannot be kept" : "a malformed agent");
        return -1;
    }
    for (size_t i = 0; i < a->n_regions && rc >= 0; i++) {
        mg_remote_desc d;
        if (a->regions[i]->target == NULL) {
            rc = -1;
            break;
        }
        mg_peer_desc_of(a->regions[i]->target, &d);
        rr[i] = (mg_remote_region){a->regions[i]->address, d.size, d.id};
        mg_peer_cache_put(descs, p->key, a->epoch, &d);
    }
    snprintf(ra.name, sizeof(ra.name), "%s", a->name);
    ra.regions = rr;
    if (rc < 0 || mg_agent_cache_put(mg_gateway_agent_cache(gw), p->key, a->epoch, &ra) != 0) {
        free(rr);
        snprintf(why, cap, "its regions are malformed (out of order, overlapping or empty)");
        return -1;
    }
    free(rr);
    return 0;
}

static void ask_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    ask_call ac = *(ask_call *)arg;
    Moongate__V1__PeerAgent *a = (void *)m;
    int closed = mg_gateway_peers_closed(ac.gw);
    char why[160];
    free(arg);
    if (a && (closed || keep(ac.gw, ac.p, a, why, sizeof(why)) != 0)) {
        moongate__v1__peer_agent__free_unpacked(a, NULL);
        ac.fn(ac.arg, MG_GRPC_UNAVAILABLE, closed ? "the daemon is stopping" : why, NULL,
              ac.p->addr);
        return;
    }
    ac.fn(ac.arg, a ? 0 : status ? status : MG_GRPC_UNAVAILABLE, message, a, ac.p->addr);
    if (a)
        moongate__v1__peer_agent__free_unpacked(a, NULL);
}

int mg_peer_describe_agent(mg_gateway *gw, mg_xfer_peer *p, const mg_agent_ref *ref,
                           mg_peer_agent_fn fn, void *arg, char *why, size_t cap)
{
    Moongate__V1__PeerAgentRequest req = MOONGATE__V1__PEER_AGENT_REQUEST__INIT;
    ask_call *ac = malloc(sizeof(*ac));
    if (ac == NULL) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    *ac = (ask_call){gw, p, fn, arg};
    req.tenant = p->tenant;
    req.name = (char *)ref->name;
    req.port = ref->port;
    if (mg_peer_unary(gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Peer/DescribeAgent", &req.base,
                      &moongate__v1__peer_agent__descriptor, ask_answered, ac, why, cap) != 0) {
        free(ac);
        return -1;
    }
    return 0;
}

int mg_peer_ask_agent(mg_gateway *gw, const char *tenant, const mg_agent_ref *ref,
                      mg_peer_agent_fn fn, void *arg, char *why, size_t cap)
{
    mg_peerdir *dir = mg_gateway_peers(gw);
    mg_xfer_peer *p =
        dir && !mg_gateway_peers_closed(gw) ? mg_peerdir_get(dir, ref->peer, tenant) : NULL;
    if (p == NULL) {
        snprintf(why, cap,
                 dir == NULL                   ? "this daemon cannot transfer"
                 : mg_gateway_peers_closed(gw) ? "the daemon is stopping"
                                               : "this daemon already knows its limit of peers");
        return -1;
    }
    return mg_peer_describe_agent(gw, p, ref, fn, arg, why, cap);
}
