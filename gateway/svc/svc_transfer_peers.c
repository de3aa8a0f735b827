/*
 * svc_transfer_peers: what the engine's batch runner and notification lines ask of peers
 * (moongate/runner.h, moongate/notelines.h), said in the protocol over the core's peer calls
 * (core/mg_peer_rpc.c): Notify/Deliver, Peer/DescribeAgent, Peer/DescribeTarget and
 * Peer/Checksum, each answer handed back to the engine. And Notify/Send, a client's
 * notification, which waits in its line there. Loop thread only.
 */
#include "svc_transfer.h"

#include "mg_peer_rpc.h"

#include "mg_addr.h"
#include "mg_trace.h"

#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/peer.pb-c.h"

#include <stdio.h>
#include <string.h>

/* ---- notifications ---- */

static void delivered(mg_rpc *rpc, int status, const char *message, void *arg)
{
    /* The peer answered this status (its trailers say so), or this daemon came to it on its
     * own (the name did not resolve, the connection or its TLS failed, no answer in time). */
    int answered = rpc && mg_rpc_header(rpc, "grpc-status") != NULL;
    mg_notelines_delivered(arg, status, answered, message);
}

static int deliver(void *arg, mg_note_item *item, const mg_note_msg *m, char *why, size_t cap)
{
    static const mg_rpc_handlers h = {NULL, delivered};
    struct mg_transfer_svc *ts = arg;
    Moongate__V1__Notification req = MOONGATE__V1__NOTIFICATION__INIT;
    char tp[MG_TRACEPARENT_LEN + 1];
    req.topic = (char *)m->topic;
    req.payload.data = (uint8_t *)m->payload;
    req.payload.len = m->len;
    req.batch_id = m->batch_id;
    req.tenant = m->peer->tenant; /* the topic is the sender tenant's on the peer */
    req.agent_port = m->agent_port;
    req.outcome = (Moongate__V1__Outcome)m->outcome;
    req.code = (uint32_t)m->code;
    req.message = (char *)(m->message ? m->message : "");
    req.failed_requests = (uint32_t *)m->failed;
    req.n_failed_requests = m->nfailed;
    req.failed_count = m->failed_count;
    mg_traceparent_format(m->trace, tp);
    req.traceparent = tp;
    return mg_peer_call(ts->gw, mg_peer_chan_of(m->peer), m->peer->addr,
                        "/moongate.v1.Notify/Deliver", &req.base, &h, item, why, cap);
}

static int send_gone(void *arg, void *owner)
{
    (void)arg;
    return mg_call_done(owner);
}

static void send_over(void *arg, void *owner, int code, const char *why)
{
    Moongate__V1__SendResponse resp = MOONGATE__V1__SEND_RESPONSE__INIT;
    mg_call *call = owner;
    (void)arg;
    if (code < 0 || mg_call_done(call)) /* not sent, or its caller left */
        ;
    else if (code)
        mg_call_finish(call, code, "%s", why);
    else
        mg_call_reply(call, &resp.base);
    mg_call_unref(call);
}

void mg_xfer_svc_send(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__SendRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_transfer_svc *ts = transfer_of(gw);
    const char *bad = mg_note_bad(req->topic, req->payload.len), *peer = req->peer;
    mg_agent_ref ref;
    mg_xfer_peer *p;
    char why[300];
    int rc;
    if (ts == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot transfer");
        return;
    }
    memset(&ref, 0, sizeof(ref));
    if (bad == NULL && req->agent[0]) {
        if (req->peer[0])
            bad = "name the peer one way: peer, or agent";
        else if (mg_agent_ref_parse("", req->agent, (int)gw->cfg->peer_port, &ref, why,
                                    sizeof(why)) != 0)
            bad = why; /* a port no agent has, named */
        else if (ref.port == 0)
            bad = "agent must be the one-string form \"host:port\"";
        else
            peer = ref.peer;
    }
    if (bad == NULL && !mg_is_host_port(peer))
        bad = "peer must be host:port (\"10.0.0.2:7443\", \"node-b.moongate.svc:7443\")";
    if (bad) {
        mg_call_fail(call, MG_ERR_INVALID, "%s", bad);
        return;
    }
    if ((p = mg_peerdir_get(ts->dir, peer, mg_call_tenant(call))) == NULL) {
        mg_call_fail(call, MG_ERR_FULL, "this daemon already knows its limit of peers");
        return;
    }
    mg_call_ref(call); /* until send_over */
    rc = mg_notelines_send(ts->lines, mg_call_conn_id(call), p, req->topic, req->payload.data,
                           req->payload.len, ref.port, mg_call_traceparent(call), call, why,
                           sizeof(why));
    if (rc != 0) {
        mg_call_unref(call);
        mg_call_fail(call, rc, "%s", why);
    }
}

/* ---- agents, targets and digests ---- */

static void agent_described(void *arg, int code, const char *msg, const Moongate__V1__PeerAgent *a,
                            const char *peer)
{
    (void)a, (void)peer;
    mg_runner_agent_answered(arg, code, msg);
}

static int describe_agent(void *arg, mg_xfer_peer *p, const mg_agent_ref *ref, void *job, char *why,
                          size_t cap)
{
    struct mg_transfer_svc *ts = arg;
    return mg_peer_describe_agent(ts->gw, p, ref, agent_described, job, why, cap);
}

static int describe_target(void *arg, mg_xfer_peer *p, uint64_t id, int is_lease, void *job)
{
    struct mg_transfer_svc *ts = arg;
    return mg_peer_describe(ts->gw, p, id, is_lease, mg_runner_target_answered, job);
}

static void checksum_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    Moongate__V1__ChecksumResponse *a = (void *)m;
    if (a == NULL) /* failed, or an answer that is not one */
        mg_runner_checksum_answered(arg, status ? status : MG_GRPC_INTERNAL, message, 0);
    else
        mg_runner_checksum_answered(arg, 0, NULL, a->crc32c);
    if (a)
        moongate__v1__checksum_response__free_unpacked(a, NULL);
}

static int checksum(void *arg, const mg_batch_req *r, void *job, char *why, size_t cap)
{
    struct mg_transfer_svc *ts = arg;
    Moongate__V1__PeerChecksumRequest req = MOONGATE__V1__PEER_CHECKSUM_REQUEST__INIT;
    req.tenant = r->b->tenant;
    req.target = r->remote_segment;
    req.lease = r->remote_lease;
    req.offset = r->remote_offset;
    req.length = r->length;
    return mg_peer_unary(
        ts->gw, mg_peer_chan_of(r->peer), r->peer->addr, "/moongate.v1.Peer/Checksum", &req.base,
        &moongate__v1__checksum_response__descriptor, checksum_answered, job, why, cap);
}

/* A Submit's origin the runner held when it went (the daemon stops). */
static void forget(void *arg, void *ctx)
{
    (void)arg;
    mg_xfer_origin_free(ctx);
}

int mg_xfer_svc_engine(struct mg_transfer_svc *ts,
                       void (*prepared)(void *, void *, mg_batch *, const mg_xfer_refusal *))
{
    mg_gateway *gw = ts->gw;
    mg_notelines_config nc = {.dir = ts->dir,
                              .line_max = gw->cfg->notify_line,
                              .spans = gw->spans,
                              .arg = ts,
                              .deliver = deliver,
                              .send_gone = send_gone,
                              .send_over = send_over};
    mg_runner_config rc = {.dir = ts->dir,
                           .agents = ts->agents,
                           .descs = ts->descs,
                           .engine = gw->engine,
                           .cq = gw->cq,
                           .arg = ts,
                           .describe_agent = describe_agent,
                           .describe_target = describe_target,
                           .checksum = checksum,
                           .prepared = prepared,
                           .forget = forget};
    int err = mg_notelines_new(&ts->lines, &nc);
    if (err == 0) {
        rc.lines = ts->lines;
        err = mg_runner_new(&ts->run, &rc);
    }
    return err;
}
