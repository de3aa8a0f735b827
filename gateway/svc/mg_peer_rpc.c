/*
 * mg_peer_rpc: calls to peer daemons' control ports (see mg_peer_rpc.h).
 */
#include "mg_peer_rpc.h"

#include "mg_pbcheck.h"

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
