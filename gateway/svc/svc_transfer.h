/*
 * svc_transfer.h: what the transfer service's two files share. svc_transfer.c takes Submit,
 * the engine's events and its calls to peers; svc_transfer_view.c shows what the engine holds
 * (GetBatch, Wait streams, Cancel, ListPeers, the /metrics block and /status.json).
 */
#ifndef SVC_TRANSFER_H
#define SVC_TRANSFER_H

#include "mg_gateway.h"
#include "mg_service.h"
#include "moongate/batches.h"
#include "moongate/peerdir.h"

#include <jansson.h>

struct event;
struct evbuffer;

/* What the front keeps of a batch (mg_batch.front): its Wait calls and its timers. */
typedef struct batch_front {
    mg_list watchers;         /* Wait calls and Submits with `wait` (bwatch.park) */
    struct event *timer;      /* the batch's timeout */
    struct event *wait_ev;    /* the next progress report to Wait calls */
    struct event *compact_ev; /* compacts it after the callback that ended it */
} batch_front;

typedef struct bwatch {
    mg_parked park; /* in its batch's watchers */
    mg_batch *b;
    int submit; /* a Submit with `wait`: no progress, one SubmitResponse at the end */
    int brief;  /* hears the batch brief (GetBatchRequest.brief) */
} bwatch;

static inline bwatch *bwatch_of(mg_list_node *node)
{
    return mg_container_of(node, bwatch, park.node);
}

static inline batch_front *front_of(const mg_batch *b)
{
    return b->front;
}

/* What /metrics counts of transfers. */
typedef struct mg_transfer_stats {
    uint64_t requests[2][2];             /* [op: 0 read, 1 write][0 done, 1 failed] */
    uint64_t bytes[2];                   /* moved, by op */
    uint64_t tagged[MG_TAG_COUNT][2][2]; /* [SubmitRequest.tag][op][0 requests, 1 bytes] done */
    uint64_t failed_by_code[MG_GRPC_CODE_COUNT];
    uint64_t in_flight;   /* requests submitted and not ended */
    uint64_t buckets[12]; /* seconds from submit to end (mg_metrics_render_seconds) */
    uint64_t ended;
    double seconds_sum;
    uint64_t notes_sent, notes_failed; /* notifications to peers */
} mg_transfer_stats;

struct mg_transfer_svc {
    mg_gateway *gw;
    mg_batches *batches; /* the batches and their requests (moongate/batches.h) */
    /* The core's peer front (mg_service.h): the peers and the scheduler of their lines
     * (moongate/peerdir.h), what peers said of their targets and of their agents. */
    mg_peerdir *dir;
    mg_peer_cache *descs;
    mg_agent_cache *agents;
    struct event *sweep; /* forgets batches past --batch-retention */
    struct submit_wait *waits;
    struct relookup *relookups; /* agents asked again while their requests wait */
    struct note_line *lines;    /* notifications in order per (connection, peer, topic) */
    mg_transfer_stats stats;
};

extern const mg_service mg_svc_transfer;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static inline struct mg_transfer_svc *transfer_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_transfer);
}

static inline struct mg_transfer_svc *svc_of(const mg_batch *b)
{
    return mg_batches_arg(b->set);
}

/* The daemon stops: the peer front closed, answers of peer calls are dropped. */
static inline int transfer_closing(const struct mg_transfer_svc *ts)
{
    return mg_gateway_peers_closed(ts->gw);
}

/* ---- svc_transfer_agent.c ---- */

/* Submit refused before b started: the call fails with gRPC status `code` and the message,
 * b's notifications' peers hear when that is for good (mg_xfer_notes_refused), b is discarded. */
void mg_xfer_svc_refuse(mg_call *call, mg_batch *b, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same for request i of b, which cannot run for err (an MG_ERR_*) and why: "<err's text>:
 * request i: why; nothing was moved", as mg_call_fail words it. */
void mg_xfer_svc_refuse_request(mg_call *call, mg_batch *b, int err, size_t i, const char *why);
/* Resolves b's requests naming (agent, address) on peers. Returns 0 (resolved: go on), -1 (the
 * call failed, b discarded) or 1 (peers are asked; `then` continues with b once they answered
 * and every request resolved, else the call fails). */
int mg_xfer_agents_resolve(mg_call *call, mg_batch *b, void (*then)(mg_call *, mg_batch *));
/* The peer directory's agent_stale (mg_peerdir_batch_ops): r's region was refused; asks where
 * its address is now. */
void mg_xfer_agent_stale(void *arg, mg_batch_req *r);

/* ---- svc_transfer_digest.c ---- */

/* The peer directory's verify (mg_peerdir_batch_ops): request r of a batch with a digest moved over
 * RDMA; the CRC32C of its local range and of the peer's are compared, and r ends DONE or DATA_LOSS.
 */
void mg_xfer_verify(void *arg, mg_batch_req *r);

/* ---- svc_transfer_notes.c ---- */

/* b's notifications take their places in line (when b is entered). */
void mg_xfer_notes_enter(mg_batch *b);
/* The engine's note_due: a notification may go when its turn comes. */
void mg_xfer_note_due(void *arg, mg_batch_note *n);
/* What is wrong with a notification's topic or payload size, or NULL. */
const char *mg_xfer_note_bad(const char *topic, size_t payload_len);
/* Submit's call was refused with gRPC status `code` for `why` before b started: when that is
 * for good (a request that can never run as asked), each of b's notifications is replaced by a
 * failure notice to its peer (batch id 0), so that its receivers hear. traceparent: the
 * caller's, continued when sampled. b is the caller's to discard. */
void mg_xfer_notes_refused(mg_batch *b, const char *traceparent, int code, const char *why);
/* Notify/Send. */
void mg_xfer_svc_send(mg_call *call, const ProtobufCMessage *m);
/* Frees the lines (the service's free; what waits there is not sent). */
void mg_xfer_notes_free(struct mg_transfer_svc *ts);

/* ---- svc_transfer_view.c ---- */

/* The batch changed / is freed (events of the engine's batches): Wait streams, timers. */
void mg_xfer_svc_changed(void *arg, mg_batch *b);
void mg_xfer_svc_freed(void *arg, mg_batch *b);
/* call hears of b until it ends (Wait), or is answered then (Submit with `wait`, submit 1).
 * Returns 0, or -1 when out of memory. */
int mg_xfer_svc_watch(mg_call *call, mg_batch *b, int submit, int brief);
/* A Submit with `wait` for a batch that is over: the batch id and the batch. */
void mg_xfer_svc_answer_now(mg_call *call, const mg_batch *b, int brief);
/* The handlers of GetBatch, Wait (and its cancel), Cancel and ListPeers. */
void mg_xfer_svc_get(mg_call *call, const ProtobufCMessage *m);
void mg_xfer_svc_wait(mg_call *call, const ProtobufCMessage *m);
void mg_xfer_svc_wait_cancel(mg_call *call);
void mg_xfer_svc_cancel(mg_call *call, const ProtobufCMessage *m);
void mg_xfer_svc_list_peers(mg_call *call, const ProtobufCMessage *m);
/* Request r ended: it is counted for /metrics. */
void mg_xfer_svc_count(struct mg_transfer_svc *ts, const mg_batch_req *r);
/* The service's hooks: drain (Wait calls end), /metrics and /status.json. */
void mg_xfer_svc_drain(mg_gateway *gw);
void mg_xfer_svc_metrics(mg_gateway *gw, struct evbuffer *out);
void mg_xfer_svc_status(mg_gateway *gw, json_t *obj);

#endif
