/*
 * mg_peer_rpc: calls to peer daemons' control ports (see mg_peer_rpc.h).
 */
#include "mg_peer_rpc.h"

#include "mg_pbcheck.h"
#include "mg_rdma_wire.h"
#include "mg_time.h"

#include "moongate/v1/peer.pb-c.h"

#include <event2/event.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mg_peer_call(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                 const ProtobufCMessage *req, const mg_rpc_handlers *h, void *arg, char *err,
                 size_t errcap)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    uint32_t timeout_ms = (uint32_t)gw->cfg->data_io_timeout * 1000; /* as for the data plane */
    /* This daemon's identity towards peers: --peer-cert, else its server certificate. */
    const char *peer_cert = gw->cfg->peer_cert[0] ? gw->cfg->peer_cert : gw->cfg->tls_cert;
    const char *peer_key = gw->cfg->peer_cert[0] ? gw->cfg->peer_key : gw->cfg->tls_key;
    mg_rpc *rpc = NULL;
    if (buf == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    protobuf_c_message_pack(req, buf);
    ch->gw = gw;
    for (int attempt = 0; attempt < 2 && rpc == NULL; attempt++) {
        if (ch->client == NULL) {
            mg_client_options o = {.target = addr,
                                   .tls = gw->cfg->peer_tls,
                                   .ca_file = gw->cfg->peer_ca[0] ? gw->cfg->peer_ca : NULL,
                                   .cert_file = peer_cert[0] ? peer_cert : NULL,
                                   .key_file = peer_cert[0] ? peer_key : NULL,
                                   .connect_timeout_ms = timeout_ms};
            ch->used = 0;
            if (mg_client_new(&ch->client, gw->base, &o, err, errcap) != 0) {
                ch->client = NULL;
                free(buf);
                return -1;
            }
        }
        rpc = mg_rpc_start(ch->client, path, NULL, 0, timeout_ms, h, arg);
        if (rpc == NULL) /* its connection failed earlier: once more on a new one */
            mg_peer_chan_close(ch);
    }
    if (rpc == NULL) {
        snprintf(err, errcap, "its control connection failed");
        free(buf);
        return -1;
    }
    mg_rpc_send(rpc, buf, len);
    mg_rpc_close_send(rpc);
    free(buf);
    return 0;
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
                          .rdma_devices = resp->rdma_devices};
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
    mg_peerdir_rdma_answered(cc.job, why[0] ? NULL : &remote, why);
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
    *out = (mg_remote_desc){.id = d->id,
                            .is_lease = d->is_lease,
                            .size = d->size,
                            .remote_accessible = d->remote_accessible,
                            .transports = 1u << MG_TRANSPORT_TCP};
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
