/*
 * mg_peer_rpc: calls to peer daemons' control ports over the C client library (mg_client.h),
 * on the gateway loop: one control channel per peer entry, opened on demand and replaced when
 * its connection failed.
 *
 * This daemon's identity towards peers is --peer-cert (else its server certificate), checked by
 * the peer against its --peer-ca; calls time out after --data-io-timeout, as the data plane.
 */
#ifndef MG_PEER_RPC_H
#define MG_PEER_RPC_H

#include "mg_client.h"
#include "mg_gateway.h"

/* A peer's control channel. */
typedef struct mg_peer_chan {
    mg_client *client; /* NULL until the first call, and after its connection failed */
    int used;          /* it carried a session before: it may be stale (the peer restarted) */
} mg_peer_chan;

/* Starts a unary call `path` on the channel to `addr` (a new connection when the old one is
 * known to have failed) and sends `req`; h gets the answer. Returns 0, or -1 with err set. */
int mg_peer_call(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                 const ProtobufCMessage *req, const mg_rpc_handlers *h, void *arg, char *err,
                 size_t errcap);

/* The answer of a unary peer call, decoded: `m` is NULL when the call failed or the answer is
 * malformed (not protobuf, or a string not whole: mg_pbcheck.h); the callback frees it. */
typedef void (*mg_peer_answer_fn)(void *arg, int status, const char *message, ProtobufCMessage *m);

/* mg_peer_call whose one answer is decoded with `desc` for `answered`. Returns 0 (`answered`
 * will be called once), or -1 with err set. */
int mg_peer_unary(mg_gateway *gw, mg_peer_chan *ch, const char *addr, const char *path,
                  const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                  mg_peer_answer_fn answered, void *arg, char *err, size_t errcap);

/* Closes the channel's connection (a fresh one is opened by the next call). */
void mg_peer_chan_close(mg_peer_chan *ch);

#endif
