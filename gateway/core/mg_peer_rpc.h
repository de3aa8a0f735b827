/*
 * mg_peer_rpc: calls to peer daemons' control ports over the C client library (mg_client.h),
 * on the gateway loop: one control channel per peer entry, opened on demand and replaced when
 * its connection failed. Part of the core's peer front (mg_shared.c): every service calls peers
 * through it, on the entries of the core's peer directory (mg_gateway_peers).
 *
 * This daemon's identity towards peers is --peer-cert (else its server certificate), checked by
 * the peer against its --peer-ca; calls time out after --data-io-timeout, as the data plane.
 */
#ifndef MG_PEER_RPC_H
#define MG_PEER_RPC_H

#include "mg_client.h"
#include "mg_gateway.h"
#include "moongate/agentcache.h"
#include "moongate/peerdir.h"

struct mg_peer_pending;

/* A peer's control channel. A peer named by a DNS name ("node-b.moongate.svc:7443") is looked
 * up on an engine worker (getaddrinfo: /etc/hosts and nsswitch as they are at that moment),
 * which also tries each of its addresses in turn until one takes a TCP connection; the channel
 * then connects there, with the name as TLS server name (SNI) and as the name its certificate
 * must carry. Calls made meanwhile wait in `pending`. The name is looked up again whenever a
 * connection has to be made anew (the last one failed, or the peer restarted). */
typedef struct mg_peer_chan {
    mg_client *client; /* NULL until the first call, and after its connection failed */
    int used;          /* it carried a session before: it may be stale (the peer restarted) */
    mg_gateway *gw;    /* whose loop it runs on (set by the first call) */
    char resolved[80]; /* a name's address now ("ip:port"; "": not looked up) */
    int resolving;
    struct mg_peer_pending *pending; /* calls waiting for the lookup, in order */
    uint64_t lookups, lookup_failures;
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

/* A peer entry's channel: the room the engine's peer directory keeps in it for the front. */
static inline mg_peer_chan *mg_peer_chan_of(mg_xfer_peer *p)
{
    return p->front;
}

/* Closes the channel's connection (a fresh one is opened by the next call, to where the
 * peer's name leads then). */
void mg_peer_chan_close(mg_peer_chan *ch);
/* At the end: closes it and ends the calls waiting for a lookup (CANCELLED). */
void mg_peer_chan_free(mg_peer_chan *ch);

/* The calls the engine's peer directory asks for (moongate/peerdir.h); each entry's p->front
 * is its channel. OpenSession for p's tenant: answered with mg_peerdir_opened, or
 * mg_peerdir_failed (a refusal by its meaning: not trusted, no common version, unavailable).
 * A channel that carried an earlier session and fails is replaced once (the peer may have
 * restarted). */
void mg_peer_open_session(mg_gateway *gw, mg_xfer_peer *p);
/* ConnectRdma: our endpoint of `device` to the peer, its own back through
 * mg_peerdir_rdma_answered(job, ...). Returns 0, or -1 with why set (nothing sent). */
int mg_peer_connect_rdma(mg_gateway *gw, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                         void *job, char *why, size_t cap);

/* DescribeTarget: what peer p says of its target `id` (a lease when is_lease) for p's tenant.
 * `described` gets the descriptor and its epoch, or NULL and the gRPC status (NOT_FOUND: the
 * peer has no such target; else it could not be asked). Returns 0 (described will be called
 * once), or -1 (the call could not be started). */
typedef void (*mg_peer_described_fn)(void *arg, const mg_remote_desc *d, uint64_t epoch,
                                     int status);
int mg_peer_describe(mg_gateway *gw, mg_xfer_peer *p, uint64_t id, int is_lease,
                     mg_peer_described_fn described, void *arg);
/* DescribeAgent: what a peer said of one of its agents — code 0 and `a` (its regions and what
 * DescribeTarget would say of each are in the core's agent and peer caches already), or a gRPC
 * code and why. `peer` is the peer's control endpoint. */
struct Moongate__V1__PeerAgent;
typedef void (*mg_peer_agent_fn)(void *arg, int code, const char *msg,
                                 const struct Moongate__V1__PeerAgent *a, const char *peer);
/* Asks peer p for its agent `ref` of p's tenant. Returns 0 (fn will be called once), or -1
 * with why set. */
int mg_peer_describe_agent(mg_gateway *gw, mg_xfer_peer *p, const mg_agent_ref *ref,
                           mg_peer_agent_fn fn, void *arg, char *why, size_t cap);
/* The same of the peer ref->peer, for `tenant` (its entry in the directory made when new). */
int mg_peer_ask_agent(mg_gateway *gw, const char *tenant, const mg_agent_ref *ref,
                      mg_peer_agent_fn fn, void *arg, char *why, size_t cap);

/* What a peer's TargetDescriptor says, as the peer cache keeps it. */
struct Moongate__V1__TargetDescriptor;
void mg_peer_desc_of(const struct Moongate__V1__TargetDescriptor *d, mg_remote_desc *out);

#endif
