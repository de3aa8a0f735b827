/*
 * svc_transfer.h: what the transfer service's three files share. svc_transfer.c takes Submit
 * and the engine's events; svc_transfer_peers.c says in the protocol what the engine asks of
 * peers, and takes Send; svc_transfer_view.c shows what the engine holds (GetBatch, Wait
 * streams, Cancel, ListPeers, the /metrics block and /status.json).
 */
#ifndef SVC_TRANSFER_H
#define SVC_TRANSFER_H

#include "mg_gateway.h"
#include "mg_service.h"
#include "moongate/batches.h"
#include "moongate/notelines.h"
#include "moongate/peerdir.h"
#include "moongate/runner.h"
#include "moongate/xlists.h"

#include <jansson.h>

struct event;
struct Moongate__V1__Prepared;
struct Moongate__V1__SubmitRequest;
struct evbuffer;

/* What the front keeps of a batch (mg_batch.front): its Wait calls and its timers. */
struct xring; /* a submission ring's front (svc_transfer_ring.c) */

typedef struct batch_front {
    struct xring *ring;       /* posted on this ring, answered there at its end; or NULL */
    uint64_t user_data;       /* the ring's submission's */
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
} mg_transfer_stats;

struct mg_transfer_svc {
    mg_gateway *gw;
    mg_batches *batches; /* the batches and their requests (moongate/batches.h) */
    /* The core's peer front (mg_service.h): the peers and the scheduler of their lines
     * (moongate/peerdir.h), what peers said of their targets and of their agents. */
    mg_peerdir *dir;
    mg_peer_cache *descs;
    mg_agent_cache *agents;
    mg_notelines *lines;     /* notifications in order per (connection, peer, topic) */
    mg_runner *run;          /* batches from their checks to their start (moongate/runner.h) */
    struct event *sweep;     /* forgets batches past --batch-retention */
    mg_xlists *xlists;       /* prepared lists (PrepareList), each bound to its connection */
    struct mg_rings *rings;  /* local clients' submission rings (AttachRing) */
    struct xring *ring_list; /* their fronts */
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

/* ---- svc_transfer_peers.c ---- */

/* The engine's notification lines and batch runner of ts, which ask peers through this file;
 * `prepared` is the runner's answer (mg_runner_config). Returns 0 or an MG_ERR_*. */
/* Where a Submit comes from: a call, or a submission of a ring (moongate/ring.h). */
typedef struct xfer_origin {
    struct mg_transfer_svc *ts;
    mg_call *call;      /* the Submit call, or NULL */
    struct xring *ring; /* or the ring, */
    uint64_t user_data; /* and its submission's user_data */
    int accepted;       /* and whether it is answered when accepted too (MG_RING_ACCEPTED) */
    /* While the Submit is checked: */
    const char *tenant;
    uint64_t conn; /* the connection (its prepared lists; notifications keep its order) */
    mg_proc proc;  /* the calling process (pid 0: not on the Unix socket) */
    const char *who;
} xfer_origin;

/* Checks the Submit (of an origin whose service is there) and runs its batch; answers a
 * refusal as its origin hears it. */
void mg_xfer_svc_submit(const xfer_origin *o, const struct Moongate__V1__SubmitRequest *req);
/* Fails the origin: err (an MG_ERR_*) as its gRPC code, "<err's text>: <message>". */
void mg_xfer_origin_fail(const xfer_origin *o, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A copy that outlives the check (the call or ring held), and its end. NULL: no memory. */
xfer_origin *mg_xfer_origin_keep(const xfer_origin *o);
void mg_xfer_origin_free(xfer_origin *o);

/* svc_transfer_ring.c: rings. */
int mg_xfer_rings_start(struct mg_transfer_svc *ts);
void mg_xfer_rings_stop(struct mg_transfer_svc *ts);
void mg_xfer_svc_attach_ring(mg_call *call, const ProtobufCMessage *m);
void mg_xfer_ring_hold(struct xring *x, int delta);
/* The ring's process is gone (nothing to answer). */
int mg_xfer_ring_gone(const xfer_origin *o);
/* A refusal, answered on the ring. */
void mg_xfer_ring_refused(const xfer_origin *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The batch entered: the ring hears of it at its end (mg_xfer_ring_over). */
void mg_xfer_ring_entered(const xfer_origin *o, mg_batch *b);
/* b, posted on a ring, is over (or freed before: the daemon stops): its answer, once. */
void mg_xfer_ring_over(mg_batch *b);

int mg_xfer_svc_engine(struct mg_transfer_svc *ts,
                       void (*prepared)(void *, void *, mg_batch *, const mg_xfer_refusal *));
/* Notify/Send. */
void mg_xfer_svc_send(mg_call *call, const ProtobufCMessage *m);

/* ---- svc_transfer_lists.c ---- */

/* PrepareList and ReleaseList. */
void mg_xfer_svc_prepare_list(mg_call *call, const ProtobufCMessage *m);
void mg_xfer_svc_release_list(mg_call *call, const ProtobufCMessage *m);
/* The prepared lists of group g of a Submit, checked (*lo, *ro), or NULL after failing the
 * call. */
int mg_xfer_svc_prepared(const xfer_origin *o, const struct Moongate__V1__Prepared *p, size_t g,
                         const mg_xlist **lo, const mg_xlist **ro);

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
