/*
 * svc_transfer: moongate.v1.Transfer — batches of READ/WRITE requests between this daemon's
 * segments and segments of peer daemons.
 *
 * Loop thread: Submit checks the whole batch (local segments, bounds, peer addresses) and takes
 * a reference on every local segment, then answers the batch id. The peer directory keeps one
 * entry per peer control endpoint: a data-plane session opened with Peer/OpenSession through
 * the C client library on this loop (the requests for a peer wait until it is open), and a pool
 * of idle data-plane connections. Workers: each request is one job that takes (or opens) a
 * connection to the peer's data plane and moves the bytes in slices (moongate/dataplane.h);
 * the connection goes back to the pool on success and is closed on failure.
 *
 * Failures and stops. A pooled connection that breaks is replaced by a fresh one and the
 * request runs once more (moving the same bytes to the same place again is harmless). A token
 * the peer no longer knows (it restarted: new epoch) sends the request back to its peer's line
 * once while a new session is opened. Each request has a stop word the loop sets — Cancel, the
 * batch's timeout, shutdown — and the worker sees within 100 ms; bytes confirmed so far are
 * counted as slices complete.
 */
#include "mg_gateway.h"
#include "mg_service.h"
#include "moongate/pools.h"

#include "mg_addr.h"
#include "mg_client.h"
#include "mg_hash.h"
#include "mg_log.h"
#include "mg_pbcheck.h"
#include "mg_peer_rpc.h"

#include "mg_rdma_wire.h"

#include "moongate/batch.h"
#include "moongate/dataplane.h"
#include "moongate/fault.h"
#include "moongate/peers.h"
#include "moongate/rdma.h"
#include "moongate/segment.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/peer.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"
#include "moongate/xfer.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* clang-format off */
#define POOL_IDLE      8              /* idle data connections kept per peer */
#define MAX_PEERS      1024           /* peer directory entries (each a line in /metrics) */
#define REQUEST_ID_MAX 128
#define NOTIFY_MAX     16
#define TOPIC_MAX      128
#define PAYLOAD_MAX    65536
#define WAIT_TICK_MS   20             /* progress reports to Wait calls at most this often */
/* clang-format on */

enum { PEER_NONE, PEER_OPENING, PEER_OPEN, PEER_FAILED };
/* RDMA to a peer: not tried yet (or torn down: set up on next use), being set up, connected,
 * or not used (rdma_why says why; tried again with the next session). */
enum { RDMA_NONE, RDMA_SETUP, RDMA_READY, RDMA_OFF };

struct xfer_req;

/* An RDMA connection and the jobs using it: deleted (on a worker) once it is retired — broken,
 * or its peer restarted — and its last job ended. */
typedef struct rconn_ref {
    mg_rdma_conn *c[MG_RDMA_MAX_DEVICES]; /* connection k: our device k to the peer's */
    unsigned n;
    unsigned users;
    int retired;
} rconn_ref;

typedef struct peer_ent {
    char addr[80]; /* the control endpoint */
    /* Whose requests: one entry (session, connections, cached targets) per peer and tenant,
     * since the peer serves a session only the targets of the tenant it was opened for. */
    char tenant[MG_SEG_NAME_MAX + 1];
    char key[MG_PEER_NAME_MAX + 1]; /* "tenant@addr": its name in the peer cache */
    mg_gateway *gw;
    int state;
    int err_code; /* MG_ERR_* of the failed session */
    char err[256];
    uint8_t token[MG_DF_TOKEN_BYTES];
    char data_host[128];
    int data_port;
    uint64_t epoch, expires_ms;
    mg_peer_chan chan;        /* its control channel (mg_peer_rpc.h) */
    struct xfer_req *waiting; /* requests waiting for the session */
    mg_dp_pool idle;          /* its idle data connections: workers take and give back */
    mg_xfer_line line;        /* its requests ready for a job slot (moongate/xfer.h) */
    unsigned restarts_seen;   /* epoch changes */
    uint64_t bytes[2];        /* moved by requests that completed, by op (1: write) */
    uint64_t ended[2][2];     /* requests by op and result (1: failed) */
    /* RDMA: queue pairs to the peer (one connection, used by one job at a time). */
    int peer_rdma; /* the peer said it has RDMA devices */
    unsigned peer_rdma_devices;
    int rdma_state;
    char rdma_why[240];
    rconn_ref *rref; /* READY: the connection */
    unsigned rdma_qps;
    uint64_t rdma_bytes[2]; /* moved over RDMA by requests that completed, by op */
    struct peer_ent *next;
} peer_ent;

struct bwatch;
struct xfer_batch;

/* A notification the batch sends its peer once its WRITEs there are in place. */
typedef struct xfer_note {
    struct xfer_batch *b;
    peer_ent *peer;
    char topic[TOPIC_MAX + 1];
    uint8_t *payload;
    size_t len;
    mg_note_gate g; /* when it is due (moongate/batch.h) */
    int code;       /* gRPC status when FAILED */
    char msg[300];
} xfer_note;

/* What a finished request still tells GetBatch and Wait: all that is kept of it once its batch
 * is over (a kept batch would otherwise hold ~1 KiB per request until --batch-retention). */
typedef struct req_rec {
    uint64_t bytes;
    char *msg;
    int err;
    uint8_t state;
    uint8_t transport; /* TR_* */
} req_rec;

enum { TR_NONE, TR_TCP, TR_RDMA, TR_COPY };
static const char *const transport_names[] = {"", "tcp", "rdma", "copy"};

typedef struct xfer_batch {
    uint64_t id;
    uint64_t t0_ns; /* submitted */
    uint32_t timeout_ms;
    uint64_t end_ms;                     /* when it was over (0: not yet) */
    char request_id[REQUEST_ID_MAX + 1]; /* the client's, or "" */
    int wait;                            /* its Submit answers at the end */
    struct event *timer;                 /* the batch's timeout */
    struct event *wait_ev;               /* the next progress report to Wait calls */
    mg_gateway *gw;
    char tenant[MG_SEG_NAME_MAX + 1];
    size_t n;
    struct xfer_req *reqs; /* NULL once over and compacted into recs */
    req_rec *recs;
    struct event *compact_ev; /* compacts it after the callback that ended it */
    xfer_note *notes;
    size_t nnotes;
    mg_batch_counts counts;  /* requests and notifications ended (moongate/batch.h) */
    mg_list watchers;        /* Wait calls and Submits with `wait` (bwatch.park) */
    struct xfer_batch *next; /* newest first */
} xfer_batch;

typedef struct bwatch {
    mg_parked park; /* in its batch's watchers */
    xfer_batch *b;
    int submit; /* a Submit with `wait`: no progress, one SubmitResponse at the end */
} bwatch;

static bwatch *bwatch_of(mg_list_node *node)
{
    return mg_container_of(node, bwatch, park.node);
}

typedef struct xfer_req {
    xfer_batch *b;
    mg_gateway *gw;
    int write;
    mg_xfer_req x;     /* the request as the engine's scheduler moves it (moongate/xfer.h) */
    mg_segment *local; /* referenced until the request ends */
    void *local_lease; /* mg_pools_use token when the local side is a lease */
    uint8_t *local_addr;
    int local_copy;    /* peer "": the other side is on this daemon too */
    mg_segment *other; /* then: its segment (referenced) */
    void *other_lease; /* and its lease's mg_pools_use token */
    uint8_t *other_addr;
    /* RDMA: chosen when the session's queue pairs are ready and both sides are registered. */
    int rdma;
    rconn_ref *rref;
    uint32_t lkeys[MG_RDMA_MAX_DEVICES], rkeys[MG_RDMA_MAX_DEVICES]; /* per connection */
    uint64_t raddr;                                 /* the remote range's first byte */
    uint64_t remote_segment, remote_offset, length; /* remote_segment: or the lease's id */
    int remote_lease;
    peer_ent *peer;
    mg_req_life life; /* PENDING, RUNNING, DONE or FAILED; requeued once at most */
    int err;          /* MG_ERR_* when failed */
    char *msg;        /* why it failed (malloc'd), or NULL */
    /* Copied for the job, so the worker reads nothing the loop may change. */
    uint8_t token[MG_DF_TOKEN_BYTES];
    char data_host[128];
    int data_port;
    struct xfer_req *next_wait;
    const char *peer_name; /* during Submit only: the request's `peer` */
} xfer_req;

struct mg_transfer_svc {
    mg_gateway *gw;
    /* Requests ready to run wait in their peer's line (peer_ent.line) for a job slot of the
     * engine's scheduler. */
    mg_xfer_sched *sched;
    int closing; /* freeing: answers of peer calls are dropped */
    peer_ent *peers;
    size_t npeers;
    struct event *sweep;  /* forgets batches past --batch-retention */
    mg_peer_cache *descs; /* what peers said of their targets, per epoch */
    struct submit_wait *waits;
    xfer_batch *batches;
    size_t nbatches;
    uint64_t counter;
};

/* ---- batch status ---- */

typedef struct {
    Moongate__V1__Batch msg;
    Moongate__V1__RequestStatus *st;
    Moongate__V1__RequestStatus **ptrs;
    Moongate__V1__NotifyStatus *ns;
    Moongate__V1__NotifyStatus **nptrs;
} batch_msg;

static void batch_msg_free(batch_msg *m);

static int batch_over(const xfer_batch *b)
{
    return mg_batch_over(&b->counts);
}

/* Bytes of r confirmed so far, all parts together. */
static uint64_t req_progress(const xfer_req *r)
{
    return mg_xfer_req_progress(&r->x);
}

/* What GetBatch says of r now (msg: r's own). */
static req_rec req_record(const xfer_req *r)
{
    req_rec rec = {r->life.state == MG_REQ_DONE ? r->length : req_progress(r), r->msg, r->err,
                   (uint8_t)r->life.state,
                   r->local_copy                     ? TR_COPY
                   : r->rdma                         ? TR_RDMA
                   : r->life.state != MG_REQ_PENDING ? TR_TCP
                                                     : TR_NONE};
    return rec;
}

/* Fills m from b; returns -1 when out of memory. Free with batch_msg_free. */
static int batch_msg_fill(batch_msg *m, const xfer_batch *b)
{
    moongate__v1__batch__init(&m->msg);
    m->st = calloc(b->n, sizeof(*m->st));
    m->ptrs = calloc(b->n, sizeof(*m->ptrs));
    m->ns = calloc(b->nnotes + 1, sizeof(*m->ns));
    m->nptrs = calloc(b->nnotes + 1, sizeof(*m->nptrs));
    if (m->st == NULL || m->ptrs == NULL || m->ns == NULL || m->nptrs == NULL) {
        batch_msg_free(m);
        return -1;
    }
    for (size_t i = 0; i < b->nnotes; i++) {
        const xfer_note *n = &b->notes[i];
        moongate__v1__notify_status__init(&m->ns[i]);
        m->ns[i].peer = (char *)n->peer->addr;
        m->ns[i].topic = (char *)n->topic;
        m->ns[i].state = (Moongate__V1__NotifyState)n->g.state;
        m->ns[i].code = n->g.state == MG_NOTE_FAILED ? n->code : 0;
        m->ns[i].message = (char *)n->msg;
        m->nptrs[i] = &m->ns[i];
    }
    m->msg.notify = m->nptrs;
    m->msg.n_notify = b->nnotes;
    for (size_t i = 0; i < b->n; i++) {
        req_rec rec = b->reqs ? req_record(&b->reqs[i]) : b->recs[i];
        moongate__v1__request_status__init(&m->st[i]);
        m->st[i].state = (Moongate__V1__RequestState)rec.state;
        m->st[i].bytes_done = rec.bytes;
        m->st[i].code = rec.state == MG_REQ_FAILED ? mg_err_grpc(rec.err) : 0;
        m->st[i].transport = (char *)transport_names[rec.transport];
        m->st[i].message = rec.msg ? rec.msg : "";
        m->ptrs[i] = &m->st[i];
    }
    m->msg.id = b->id;
    m->msg.done = (uint32_t)b->counts.done;
    m->msg.failed = (uint32_t)b->counts.failed;
    m->msg.state = (Moongate__V1__RequestState)mg_batch_state(&b->counts);
    m->msg.requests = m->ptrs;
    m->msg.n_requests = b->n;
    return 0;
}

static void batch_msg_free(batch_msg *m)
{
    free(m->st);
    free(m->ptrs);
    free(m->ns);
    free(m->nptrs);
}

/* The answer of a Submit with `wait`: the batch id and the batch as m says. */
static void submit_answer(mg_call *call, const xfer_batch *b, batch_msg *m)
{
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    resp.batch_id = b->id;
    resp.batch = &m->msg;
    mg_call_reply(call, &resp.base);
}

static void submit_answer_now(mg_call *call, const xfer_batch *b)
{
    batch_msg m;
    if (batch_msg_fill(&m, b) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    submit_answer(call, b, &m);
    batch_msg_free(&m);
}

/* Tells the Wait calls of b where it stands; ends them, and answers the Submits that wait,
 * when it is over. */
static void batch_tell(xfer_batch *b)
{
    batch_msg m;
    int over = batch_over(b);
    if (mg_list_empty(&b->watchers) || batch_msg_fill(&m, b) != 0)
        return;
    mg_list_foreach_safe(&b->watchers, node, next)
    {
        bwatch *w = bwatch_of(node);
        mg_call *call = w->park.call;
        if (w->submit) {
            if (over)
                submit_answer(call, b, &m);
        } else if (over || mg_call_writable(call)) { /* a slow reader gets the latest later */
            mg_call_send(call, &m.msg.base);
        }
        if (mg_call_data(call) != w)
            continue; /* the answer was too large: the call ended, and w with it (wait_cancel) */
        if (over) {
            mg_call_unpark(&w->park, w->submit ? -1 : MG_GRPC_OK, NULL);
            free(w);
        }
    }
    batch_msg_free(&m);
}

static void wait_tick(evutil_socket_t fd, short what, void *arg)
{
    batch_tell(arg);
}

/* The batch changed. Wait calls hear of the end at once; of progress at most every
 * WAIT_TICK_MS, so a batch of thousands of requests is not re-sent whole for each one. */
static void batch_notify(xfer_batch *b)
{
    static const struct timeval tick = {0, WAIT_TICK_MS * 1000};
    if (mg_list_empty(&b->watchers))
        return;
    if (batch_over(b)) {
        if (b->wait_ev)
            event_del(b->wait_ev);
        batch_tell(b);
        return;
    }
    if (b->wait_ev == NULL)
        b->wait_ev = evtimer_new(b->gw->base, wait_tick, b);
    if (b->wait_ev == NULL)
        batch_tell(b);
    else if (!evtimer_pending(b->wait_ev, NULL))
        evtimer_add(b->wait_ev, &tick);
}

/* ---- requests finishing ---- */

/* Lets go of the request's local memory: the segment reference, and the lease's use. */
static void batch_changed(xfer_batch *b);
static void notes_write_ended(xfer_req *r, int err);

static void req_release_local(xfer_req *r)
{
    if (r->local) {
        mg_registry_put(mg_engine_registry(r->gw->engine), r->local);
        r->local = NULL;
    }
    if (r->local_lease) {
        mg_pools_unuse(r->gw->pools, r->local_lease);
        r->local_lease = NULL;
    }
    if (r->other) {
        mg_registry_put(mg_engine_registry(r->gw->engine), r->other);
        r->other = NULL;
    }
    if (r->other_lease) {
        mg_pools_unuse(r->gw->pools, r->other_lease);
        r->other_lease = NULL;
    }
}

/* Keeps `text` as the request's message ("" or NULL: none). */
static void req_say(xfer_req *r, const char *text)
{
    char *copy = text && *text ? strdup(text) : NULL; /* text may be the old message */
    free(r->msg);
    r->msg = copy;
}

static void req_end(xfer_req *r, int err, const char *msg)
{
    if (mg_req_end(&r->life, &r->b->counts, err != 0) != 0) {
        /* Never expected: counting it would end the batch before its requests. */
        mg_error("transfer_state",
                 "batch=%016" PRIx64 " request=%zu state=%d error=\"%s\" "
                 "reason=\"ended twice, or succeeded without running\"",
                 r->b->id, (size_t)(r - r->b->reqs), (int)r->life.state, mg_strerror(err));
        return;
    }
    r->err = err;
    req_say(r, msg);
    req_release_local(r);
    mg_metrics_transfer(r->gw, r->write, err, r->length,
                        (double)(mg_now_mono_ns() - r->b->t0_ns) / 1e9);
    if (r->peer && err == MG_ERR_NOT_FOUND && r->peer->gw->transfer)
        mg_peer_cache_forget(r->peer->gw->transfer->descs, r->peer->key, r->remote_segment,
                             r->remote_lease); /* asked again next time */
    if (r->peer) {
        r->peer->ended[r->write != 0][err != 0]++;
        if (!err && r->rdma)
            r->peer->rdma_bytes[r->write != 0] += r->length;
        else if (!err)
            r->peer->bytes[r->write != 0] += r->length;
    }
    if (r->write)
        notes_write_ended(r, err);
    batch_changed(r->b);
}

/* An over batch keeps only its requests' records (after the callback that ended it, which may
 * still be walking the requests). */
static void compact_cb(evutil_socket_t fd, short what, void *arg)
{
    xfer_batch *b = arg;
    req_rec *recs;
    if (b->reqs == NULL || !batch_over(b) || (recs = calloc(b->n, sizeof(*recs))) == NULL)
        return; /* out of memory: it stays whole */
    for (size_t i = 0; i < b->n; i++) {
        xfer_req *r = &b->reqs[i];
        recs[i] = req_record(r);
        r->msg = NULL; /* the record has it now */
        mg_xfer_req_free(&r->x);
    }
    free(b->reqs);
    b->reqs = NULL;
    b->recs = recs;
}

/* The batch moved: its Wait calls hear of it, and its timer goes once it is over. */
static void batch_changed(xfer_batch *b)
{
    if (batch_over(b) && b->end_ms == 0) {
        b->end_ms = mg_now_mono_ms();
        b->compact_ev = event_new(b->gw->base, -1, 0, compact_cb, b);
        if (b->compact_ev)
            event_active(b->compact_ev, EV_TIMEOUT, 0);
    }
    if (batch_over(b) && b->timer)
        event_del(b->timer);
    batch_notify(b);
}

/* Takes a pending request out of the line it waits in (its peer's session, or a worker).
 * Returns 1 if it was in one. */
static int unqueue(xfer_req *r)
{
    xfer_req **pp;
    if (r->peer == NULL)
        return 0;
    if (mg_xfer_sched_remove(&r->x))
        return 1;
    for (pp = &r->peer->waiting; *pp && *pp != r; pp = &(*pp)->next_wait)
        ;
    if (*pp == NULL)
        return 0;
    *pp = r->next_wait;
    return 1;
}

/* Ends every request of b that has not ended: waiting ones now, running ones through their
 * stop word (they end when their worker sees it). */
static void batch_stop(xfer_batch *b, int err, const char *why)
{
    for (size_t i = 0; b->reqs && i < b->n; i++) {
        xfer_req *r = &b->reqs[i];
        if (r->life.state == MG_REQ_PENDING && unqueue(r))
            req_end(r, err, why);
        else if (r->life.state == MG_REQ_RUNNING || r->life.state == MG_REQ_PENDING)
            mg_xfer_req_stop(&r->x, err);
    }
}

static void batch_timeout(evutil_socket_t fd, short what, void *arg)
{
    xfer_batch *b = arg;
    char why[96];
    snprintf(why, sizeof(why), "the batch's timeout of %u ms passed before it started",
             b->timeout_ms);
    mg_info("transfer_timeout", "batch=%016" PRIx64 " timeout_ms=%u", b->id, b->timeout_ms);
    batch_stop(b, MG_ERR_TIMEOUT, why);
}

static void batch_free(xfer_batch *b)
{
    if (b->timer)
        event_free(b->timer);
    if (b->wait_ev)
        event_free(b->wait_ev);
    if (b->compact_ev)
        event_free(b->compact_ev);
    for (size_t i = 0; i < b->nnotes; i++)
        free(b->notes[i].payload);
    for (size_t i = 0; b->reqs && i < b->n; i++) {
        mg_xfer_req_free(&b->reqs[i].x);
        free(b->reqs[i].msg);
    }
    for (size_t i = 0; b->recs && i < b->n; i++)
        free(b->recs[i].msg);
    free(b->notes);
    free(b->reqs);
    free(b->recs);
    free(b);
}

/* ---- the engine's scheduler moves the requests (moongate/xfer.h) ---- */

static void session_retry(xfer_req *r);
static int watch_add(mg_call *call, xfer_batch *b, int submit);
static void submit_go(mg_call *call, xfer_batch *b);
static int remote_check(mg_call *call, xfer_batch *b);
static void open_session(mg_gateway *gw, peer_ent *p);
static void rref_release(peer_ent *p, rconn_ref *ref);

static xfer_req *req_of(mg_xfer_req *x)
{
    return mg_container_of(x, xfer_req, x);
}

/* The request took a job slot. */
static void req_started(void *arg, mg_xfer_req *x)
{
    (void)arg;
    mg_req_start(&req_of(x)->life);
}

/* A job of head's goes to a worker, or came back: it holds the RDMA connection meanwhile. */
static void job_started(void *arg, mg_xfer_req *head)
{
    xfer_req *r = req_of(head);
    (void)arg;
    if (r->rdma)
        r->rref->users++;
}

static void job_ended(void *arg, mg_xfer_req *head)
{
    xfer_req *r = req_of(head);
    (void)arg;
    if (r->rdma)
        rref_release(r->peer, r->rref);
}

/* The request's last part ended: it ends, or (a token the peer no longer knows, a data plane
 * not where the session said: it may have restarted) asks its peer again, once. */
static void req_moved(void *arg, mg_xfer_req *x, int result, const char *why)
{
    xfer_req *r = req_of(x);
    char msg[600];
    (void)arg;
    if (result != 0)
        req_say(r, why);
    if ((result == MG_ERR_AUTH || result == MG_ERR_UNAVAILABLE) && !r->life.requeued &&
        mg_xfer_req_stopped(&r->x) == 0) {
        session_retry(r); /* a dead peer fails there, by name */
        return;
    }
    if (result && r->msg && strstr(r->msg, r->peer->addr) == NULL)
        snprintf(msg, sizeof(msg), "peer %s: %.500s", r->peer->addr, r->msg);
    else
        snprintf(msg, sizeof(msg), "%.500s", r->msg ? r->msg : "");
    req_end(r, result, result ? msg : NULL);
}

static int rdma_wanted(const peer_ent *p);
static void rdma_setup(peer_ent *p);

/* RDMA for r when the peer's queue pairs are ready, the local memory is registered with the
 * device and the peer described the target with a key (a remote lease: its own key). */
static void req_transport(xfer_req *r)
{
    peer_ent *p = r->peer;
    mg_remote_desc d;
    r->rdma = 0;
    if (p->rdma_state != RDMA_READY || p->rref == NULL || r->local_copy ||
        mg_peer_cache_get(r->gw->transfer->descs, p->key, r->remote_segment, r->remote_lease, &d,
                          NULL) != 0 ||
        !(d.transports & (1u << MG_TRANSPORT_RDMA)))
        return;
    for (unsigned k = 0; k < p->rref->n; k++) { /* connection k: our device k, the peer's k */
        if (mg_segment_rdma_lkey(r->local, (int)k, &r->lkeys[k]) != 0)
            return;
        if (k < d.rdma_nkeys)
            r->rkeys[k] = d.rdma_rkeys[k];
        else if (k == 0)
            r->rkeys[k] = d.rdma_rkey;
        else
            return;
    }
    r->rdma = 1;
    r->rref = p->rref;
    r->raddr = d.rdma_addr + r->remote_offset;
}

/* What the scheduler and the movers need of r: its ranges and how its jobs reach the peer. */
static void req_link(xfer_req *r)
{
    const mg_config *cfg = r->gw->cfg;
    mg_xfer_req *x = &r->x;
    x->kind = r->local_copy ? MG_XFER_COPY : r->rdma ? MG_XFER_RDMA : MG_XFER_TCP;
    x->batch = r->b;
    x->write = r->write;
    x->local = r->local_addr;
    x->other = r->other_addr;
    x->length = r->length;
    x->lease = r->remote_lease;
    x->target = r->remote_segment;
    x->remote = r->rdma ? r->raddr : r->remote_offset;
    x->lkeys = r->lkeys;
    x->rkeys = r->rkeys;
    x->link = (mg_xfer_link){.stop = &x->stop,
                             .slice_bytes = (uint32_t)cfg->slice_bytes,
                             .io_timeout_ms = (uint32_t)cfg->data_io_timeout * 1000,
                             .crc = cfg->data_crc,
                             .peer = r->peer->addr,
                             .idle = &r->peer->idle,
                             .token = r->token,
                             .host = r->data_host,
                             .port = r->data_port};
    if (r->rdma) {
        x->link.conns = r->rref->c;
        x->link.nconns = r->rref->n;
        x->link.lock = &r->peer->line.rdma_lock;
    }
}

/* The session is open: the request takes its details and joins the line for a worker (after
 * the RDMA connection, while one is being set up). */
static void req_start(xfer_req *r)
{
    peer_ent *p = r->peer;
    if (!r->local_copy && rdma_wanted(p) &&
        (p->rdma_state == RDMA_NONE || p->rdma_state == RDMA_SETUP)) {
        r->next_wait = p->waiting;
        p->waiting = r;
        if (p->rdma_state == RDMA_NONE)
            rdma_setup(p);
        return;
    }
    req_transport(r);
    memcpy(r->token, p->token, sizeof(r->token));
    snprintf(r->data_host, sizeof(r->data_host), "%s", p->data_host);
    r->data_port = p->data_port;
    req_link(r);
    mg_xfer_sched_add(&p->line, &r->x);
}

/* ---- the peer directory: sessions ---- */

/* The session opened or failed: start or fail the requests that waited for it. */
static void release_waiting(peer_ent *p)
{
    xfer_req *r, *next;
    for (r = p->waiting, p->waiting = NULL; r; r = next) {
        next = r->next_wait;
        if (p->state == PEER_OPEN) {
            req_start(r);
        } else if (r->life.requeued && r->msg) { /* both: why it asked again, and what then */
            char both[600];
            snprintf(both, sizeof(both), "%.180s; then a new session: %.200s", r->msg, p->err);
            req_end(r, p->err_code, both);
        } else {
            req_end(r, p->err_code, p->err);
        }
    }
}

static void session_failed_code(peer_ent *p, int code, const char *why)
{
    p->state = PEER_FAILED;
    p->err_code = code;
    snprintf(p->err, sizeof(p->err), "peer %.80s: %.160s", p->addr, why);
    mg_warn("peer_session_failed", "peer=%s error=\"%s\"", p->addr, p->err);
    release_waiting(p);
}

static void session_failed(peer_ent *p, const char *why)
{
    session_failed_code(p, MG_ERR_UNAVAILABLE, why);
}

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
    peer_ent *p = arg;
    mg_peer_chan_close(&p->chan);
    open_session(p->gw, p);
}

static void open_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    peer_ent *p = arg;
    Moongate__V1__OpenSessionResponse *resp = (void *)m;
    if (status == MG_GRPC_UNAVAILABLE && p->chan.used) {
        /* The connection served an earlier session; the peer may have restarted since. */
        static const struct timeval now = {0, 0};
        p->chan.used = 0;
        if (event_base_once(p->gw->base, -1, EV_TIMEOUT, reopen_cb, p, &now) == 0)
            return;
    }
    if (resp == NULL || resp->token.len != MG_DF_TOKEN_BYTES) {
        if (resp)
            moongate__v1__open_session_response__free_unpacked(resp, NULL);
        session_failed_code(p, status ? session_refusal(status) : MG_ERR_UNAVAILABLE,
                            status ? message : "a malformed OpenSession answer");
        return;
    }
    if (resp->protocol_version < MG_DF_VERSION_MIN || resp->protocol_version > MG_DF_VERSION) {
        char why[160];
        snprintf(why, sizeof(why),
                 "it answered data-plane protocol version %u; this daemon speaks %u..%u",
                 resp->protocol_version, MG_DF_VERSION_MIN, MG_DF_VERSION);
        moongate__v1__open_session_response__free_unpacked(resp, NULL);
        session_failed_code(p, MG_ERR_UNSUPPORTED, why);
        return;
    }
    memcpy(p->token, resp->token.data, MG_DF_TOKEN_BYTES);
    /* The data plane's own address when it listens on a wildcard: the one we reached. */
    if (resp->data_host[0] == '\0' || !strcmp(resp->data_host, "::") ||
        !strcmp(resp->data_host, "0.0.0.0")) {
        int port;
        if (mg_split_host_port(p->addr, p->data_host, sizeof(p->data_host), &port) != 0)
            p->data_host[0] = '\0';
    } else {
        snprintf(p->data_host, sizeof(p->data_host), "%s", resp->data_host);
    }
    p->data_port = (int)resp->data_port;
    if (p->epoch && p->epoch != resp->epoch) { /* the peer restarted: old connections go */
        p->restarts_seen++;
        mg_dp_pool_clear(&p->idle);
    }
    if (p->epoch && p->epoch != resp->epoch && p->rref) { /* its queue pairs went with it */
        rconn_ref *old = p->rref;
        p->rref = NULL;
        p->rdma_state = RDMA_NONE;
        old->retired = 1;
        old->users++; /* released at once: deleted now if no job holds it */
        rref_release(p, old);
    }
    p->peer_rdma = resp->rdma;
    p->peer_rdma_devices = resp->rdma_devices;
    if (p->rdma_state == RDMA_OFF) /* a new session: try again */
        p->rdma_state = RDMA_NONE;
    if (p->gw->rdma == NULL)
        snprintf(p->rdma_why, sizeof(p->rdma_why), "this daemon has no RDMA device: %.180s",
                 p->gw->rdma_why);
    else if (!resp->rdma)
        snprintf(p->rdma_why, sizeof(p->rdma_why), "the peer has no RDMA device");
    p->epoch = resp->epoch;
    mg_peer_cache_epoch(p->gw->transfer->descs, p->key, resp->epoch, mg_now_mono_ms());
    p->expires_ms = mg_now_mono_ms() + (resp->expires_in_ms > 60000 ? resp->expires_in_ms - 30000
                                                                    : resp->expires_in_ms);
    moongate__v1__open_session_response__free_unpacked(resp, NULL);
    p->state = PEER_OPEN;
    p->chan.used = 1;
    mg_info("peer_session", "peer=%s data=%s:%d epoch=%016" PRIx64, p->addr, p->data_host,
            p->data_port, p->epoch);
    release_waiting(p);
}

/* Back to the peer's line while a new session is opened (once per request). */
static void session_retry(xfer_req *r)
{
    peer_ent *p = r->peer;
    mg_req_requeue(&r->life);
    mg_xfer_req_reset(&r->x);
    if (p->state == PEER_OPEN && !memcmp(p->token, r->token, sizeof(r->token))) {
        mg_info("peer_session_refused", "peer=%s epoch=%016" PRIx64, p->addr, p->epoch);
        p->state = PEER_NONE; /* that token is dead: every request needs a new one */
    }
    r->next_wait = p->waiting;
    p->waiting = r;
    if (p->state == PEER_OPEN)
        release_waiting(p); /* someone already opened a new session */
    else if (p->state != PEER_OPENING)
        open_session(r->gw, p);
}

static void open_session(mg_gateway *gw, peer_ent *p)
{
    Moongate__V1__OpenSessionRequest req = MOONGATE__V1__OPEN_SESSION_REQUEST__INIT;
    char err[256];
    p->state = PEER_OPENING;
    req.protocol_version = MG_DF_VERSION;
    req.min_protocol_version = MG_DF_VERSION_MIN;
    req.tenant = p->tenant; /* the peer serves this session only that tenant's targets */
    if (mg_peer_unary(gw, &p->chan, p->addr, "/moongate.v1.Peer/OpenSession", &req.base,
                      &moongate__v1__open_session_response__descriptor, open_answered, p, err,
                      sizeof(err)) != 0)
        session_failed(p, err);
}

/* ---- the peer directory: RDMA queue pairs ----
 *
 * When both daemons have RDMA devices, the first request after a session opens waits while
 * a worker creates the queue pairs (--rdma-qps-per-peer), Peer/ConnectRdma gives them to the
 * peer and brings back its own, and a worker connects ours to them. Then requests to the peer
 * move over RDMA; a failure on the way leaves the peer on TCP until the next session, with the
 * reason in ListPeers. A connection that breaks (an error completion) is retired: deleted once
 * its last job ends, and set up anew for the next request. */

typedef struct rdma_setup_job {
    peer_ent *p;
    unsigned k, ndev; /* the device being connected, of how many */
    rconn_ref *ref;   /* the connections made so far (the peer's once setup ends) */
    mg_rdma_conn *c;  /* device k's, being made */
    mg_rdma_ep local, remote;
    int connect; /* 0: create, 1: connect */
    int rc;
    char why[256];
} rdma_setup_job;

static int rdma_wanted(const peer_ent *p)
{
    return p->gw->rdma != NULL && p->peer_rdma && p->addr[0] != '\0';
}

static int conn_del_work(void *arg)
{
    rconn_ref *ref = arg;
    for (unsigned i = 0; i < ref->n; i++) {
        mg_rdma_conn_del(ref->c[i]);
        ref->c[i] = NULL;
    }
    return 0;
}

static void conn_del_done(void *arg, int result)
{
    rconn_ref *ref = arg;
    for (unsigned i = 0; i < ref->n; i++) /* the engine stopped first */
        mg_rdma_conn_del(ref->c[i]);
    free(ref);
}

static int ref_broken(const rconn_ref *ref)
{
    for (unsigned i = 0; i < ref->n; i++) {
        if (mg_rdma_conn_broken(ref->c[i]))
            return 1;
    }
    return 0;
}

/* A job using ref ended: a broken connection is retired; a retired one with no job left goes. */
static void rref_release(peer_ent *p, rconn_ref *ref)
{
    ref->users--;
    if (!ref->retired && ref_broken(ref)) {
        ref->retired = 1;
        if (p->rref == ref) {
            p->rref = NULL;
            p->rdma_state = RDMA_NONE; /* the next request sets up a new one */
            mg_info("rdma_conn_retired", "peer=%s", p->addr);
        }
    }
    if (ref->retired && ref->users == 0 &&
        mg_engine_submit(p->gw->engine, p->gw->cq, conn_del_work, conn_del_done, ref) != 0)
        conn_del_done(ref, 0);
}

/* Connections no request holds go (deleted on a worker). */
static void ref_drop(peer_ent *p, rconn_ref *ref)
{
    ref->retired = 1;
    ref->users++;
    rref_release(p, ref);
}

static void rdma_off(peer_ent *p, const char *why)
{
    p->rdma_state = RDMA_OFF;
    snprintf(p->rdma_why, sizeof(p->rdma_why), "RDMA setup failed: %.200s", why);
    mg_warn("rdma_setup_failed", "peer=%s error=\"%s\" transport=tcp", p->addr, why);
    release_waiting(p);
}

static int rdma_setup_work(void *arg)
{
    rdma_setup_job *j = arg;
    if (!j->connect)
        return j->rc = mg_rdma_conn_new(j->p->gw->rdma, (int)j->k, j->p->rdma_qps, &j->c, &j->local,
                                        j->why, sizeof(j->why));
    return j->rc = mg_rdma_conn_connect(j->c, &j->remote, j->why, sizeof(j->why));
}

static void rdma_setup_done(void *arg, int result);

static void rdma_job_drop(rdma_setup_job *j)
{
    if (j->c) { /* a connection not finished: deleted on a worker */
        rconn_ref *ref = calloc(1, sizeof(*ref));
        if (ref) {
            ref->c[ref->n++] = j->c;
            ref_drop(j->p, ref);
        } else {
            mg_rdma_conn_del(j->c);
        }
    }
    if (j->ref)
        ref_drop(j->p, j->ref);
    free(j);
}

/* Setup ends: with the connections made so far (a later device that fails leaves fewer), or,
 * with none, TCP until the next session. */
static void rdma_setup_end(rdma_setup_job *j, const char *why)
{
    peer_ent *p = j->p;
    rconn_ref *ref = j->ref;
    if (ref == NULL || ref->n == 0) {
        rdma_off(p, why ? why : "no device connected");
        rdma_job_drop(j);
        return;
    }
    if (why)
        mg_warn("rdma_device_skipped", "peer=%s device=%u error=\"%s\" devices=%u", p->addr, j->k,
                why, ref->n);
    j->ref = NULL;
    p->rref = ref;
    p->rdma_state = RDMA_READY;
    p->rdma_why[0] = '\0';
    mg_info("rdma_ready", "peer=%s devices=%u qps=%u mtu=%u", p->addr, ref->n, j->local.nqps,
            j->remote.mtu < j->local.mtu ? j->remote.mtu : j->local.mtu);
    rdma_job_drop(j);
    release_waiting(p);
}

static void connect_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    rdma_setup_job *j = arg;
    peer_ent *p = j->p;
    Moongate__V1__ConnectRdmaResponse *resp = (void *)m;
    char why[300];
    if (p->gw->transfer == NULL || p->gw->transfer->closing) {
        if (resp)
            moongate__v1__connect_rdma_response__free_unpacked(resp, NULL);
        rdma_job_drop(j);
        return;
    }
    if (resp == NULL || mg_rdma_wire_decode(resp->endpoint, &j->remote, why, sizeof(why)) != 0) {
        if (resp == NULL)
            snprintf(why, sizeof(why), "ConnectRdma: %.200s",
                     status ? message : "a malformed answer");
        if (resp)
            moongate__v1__connect_rdma_response__free_unpacked(resp, NULL);
        rdma_setup_end(j, why);
        return;
    }
    moongate__v1__connect_rdma_response__free_unpacked(resp, NULL);
    j->connect = 1;
    if (mg_engine_submit(p->gw->engine, p->gw->cq, rdma_setup_work, rdma_setup_done, j) != 0)
        rdma_setup_end(j, "the engine's queue is full (--queue-depth)");
}

static void rdma_setup_done(void *arg, int result)
{
    rdma_setup_job *j = arg;
    peer_ent *p = j->p;
    if (p->gw->transfer == NULL || p->gw->transfer->closing) {
        rdma_job_drop(j);
        return;
    }
    if (result != 0) {
        rdma_setup_end(j, j->rc ? j->why : "the daemon is stopping");
        return;
    }
    if (!j->connect) { /* our queue pairs exist: the peer's answer brings its own */
        Moongate__V1__ConnectRdmaRequest req = MOONGATE__V1__CONNECT_RDMA_REQUEST__INIT;
        mg_rdma_wire w;
        char err[256];
        mg_rdma_wire_encode(&j->local, &w);
        req.token.data = p->token;
        req.token.len = sizeof(p->token);
        req.endpoint = &w.msg;
        req.device = j->k; /* our device k with the peer's device k */
        if (mg_peer_unary(p->gw, &p->chan, p->addr, "/moongate.v1.Peer/ConnectRdma", &req.base,
                          &moongate__v1__connect_rdma_response__descriptor, connect_answered, j,
                          err, sizeof(err)) != 0)
            rdma_setup_end(j, err);
        return;
    }
    j->ref->c[j->ref->n++] = j->c; /* device k connected */
    j->c = NULL;
    if (++j->k >= j->ndev) {
        rdma_setup_end(j, NULL);
        return;
    }
    j->connect = 0; /* the next device */
    if (mg_engine_submit(p->gw->engine, p->gw->cq, rdma_setup_work, rdma_setup_done, j) != 0)
        rdma_setup_end(j, "the engine's queue is full (--queue-depth)");
}

static void rdma_setup(peer_ent *p)
{
    rdma_setup_job *j = calloc(1, sizeof(*j));
    unsigned ours = (unsigned)mg_rdma_device_count(p->gw->rdma);
    unsigned theirs = p->peer_rdma_devices ? p->peer_rdma_devices : 1;
    p->rdma_state = RDMA_SETUP;
    p->rdma_qps = (unsigned)p->gw->cfg->rdma_qps_per_peer;
    if (j == NULL || (j->ref = calloc(1, sizeof(*j->ref))) == NULL) {
        free(j);
        rdma_off(p, "out of memory");
        return;
    }
    j->p = p;
    j->ndev = ours < theirs ? ours : theirs; /* device k with the peer's device k */
    if (j->ndev > MG_RDMA_MAX_DEVICES)
        j->ndev = MG_RDMA_MAX_DEVICES;
    if (mg_engine_submit(p->gw->engine, p->gw->cq, rdma_setup_work, rdma_setup_done, j) != 0) {
        free(j->ref);
        free(j);
        rdma_off(p, "the engine's queue is full (--queue-depth)");
    }
}

/* ---- notifications: sent to a peer once the batch's WRITEs there are in place ---- */

static void note_end(xfer_note *n, mg_note_state state, int code, const char *msg)
{
    n->g.state = state;
    n->code = code;
    snprintf(n->msg, sizeof(n->msg), "%s", msg ? msg : "");
    mg_batch_note_over(&n->b->counts, state == MG_NOTE_FAILED);
    if (state == MG_NOTE_SENT)
        n->peer->gw->xfer_stats.notes_sent++;
    else
        n->peer->gw->xfer_stats.notes_failed++;
    batch_changed(n->b);
}

typedef struct {
    xfer_note *n;
    struct mg_transfer_svc *ts;
} note_call;

static void deliver_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    note_call *nc = arg;
    xfer_note *n = nc->n;
    int closing = nc->ts->closing;
    free(nc);
    if (closing)
        return;
    if (status == 0) {
        note_end(n, MG_NOTE_SENT, 0, NULL);
    } else {
        char why[300];
        snprintf(why, sizeof(why), "peer %.80s refused it: %.200s", n->peer->addr, message);
        note_end(n, MG_NOTE_FAILED, status, why);
    }
}

static void note_fire(xfer_note *n)
{
    static const mg_rpc_handlers h = {NULL, deliver_closed};
    Moongate__V1__Notification req = MOONGATE__V1__NOTIFICATION__INIT;
    mg_gateway *gw = n->peer->gw;
    note_call *nc;
    char err[256], why[300];
    if (gw->transfer->closing) {
        note_end(n, MG_NOTE_FAILED, MG_GRPC_UNAVAILABLE, "not sent: the daemon is stopping");
        return;
    }
    if (n->g.failed_write) {
        snprintf(why, sizeof(why), "not sent: request %zu to this peer failed",
                 n->g.failed_write - 1);
        note_end(n, MG_NOTE_FAILED, MG_GRPC_FAILED_PRECONDITION, why);
        return;
    }
    nc = calloc(1, sizeof(*nc));
    if (nc == NULL) {
        note_end(n, MG_NOTE_FAILED, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    nc->n = n;
    nc->ts = gw->transfer;
    req.topic = n->topic;
    req.payload.data = n->payload;
    req.payload.len = n->len;
    req.batch_id = n->b->id;
    req.tenant = n->b->tenant; /* the topic is the batch tenant's on the peer */
    n->g.state = MG_NOTE_SENDING;
    if (mg_peer_call(gw, &n->peer->chan, n->peer->addr, "/moongate.v1.Notify/Deliver", &req.base,
                     &h, nc, err, sizeof(err)) != 0) {
        free(nc);
        snprintf(why, sizeof(why), "peer %.80s: %.200s", n->peer->addr, err);
        note_end(n, MG_NOTE_FAILED, MG_GRPC_UNAVAILABLE, why);
    }
}

/* A WRITE of the batch ended: the notifications for its peer may go now. */
static void notes_write_ended(xfer_req *r, int err)
{
    xfer_batch *b = r->b;
    for (size_t i = 0; i < b->nnotes; i++) {
        xfer_note *n = &b->notes[i];
        if (n->peer == r->peer && mg_note_write_ended(&n->g, (size_t)(r - b->reqs), err != 0))
            note_fire(n);
    }
}

static peer_ent *peer_get(struct mg_transfer_svc *ts, const char *addr, const char *tenant)
{
    peer_ent *p;
    for (p = ts->peers; p; p = p->next) {
        if (!strcmp(p->addr, addr) && !strcmp(p->tenant, tenant))
            return p;
    }
    if (ts->npeers >= MAX_PEERS)
        return NULL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    snprintf(p->tenant, sizeof(p->tenant), "%s", tenant);
    snprintf(p->key, sizeof(p->key), "%s@%s", tenant, addr);
    p->gw = ts->gw;
    if (addr[0] == '\0') { /* this daemon: copies on the workers, no session */
        p->state = PEER_OPEN;
        p->expires_ms = UINT64_MAX;
    }
    mg_dp_pool_init(&p->idle, POOL_IDLE);
    mg_xfer_line_init(ts->sched, &p->line, addr[0] != '\0');
    p->next = ts->peers;
    ts->peers = p;
    ts->npeers++;
    return p;
}

/* ---- handlers ---- */

static void forget_oldest(struct mg_transfer_svc *ts, size_t keep)
{
    while (ts->nbatches > keep) {
        xfer_batch **pp = &ts->batches, **victim = NULL;
        for (; *pp; pp = &(*pp)->next) {
            if (batch_over(*pp))
                victim = pp; /* the last finished one in the list is the oldest */
        }
        if (victim == NULL)
            return; /* every batch still runs: keep them */
        {
            xfer_batch *b = *victim;
            *victim = b->next;
            batch_free(b);
            ts->nbatches--;
        }
    }
}

/* Forgets finished batches that ended more than --batch-retention seconds ago. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mg_transfer_svc *ts = arg;
    uint64_t now = mg_now_mono_ms(), keep_ms = ts->gw->cfg->batch_retention * 1000;
    for (xfer_batch **pp = &ts->batches; *pp;) {
        xfer_batch *b = *pp;
        if (b->end_ms && b->end_ms + keep_ms <= now) {
            *pp = b->next;
            batch_free(b);
            ts->nbatches--;
        } else {
            pp = &b->next;
        }
    }
}

/* A request with peer "": its "remote" side is this daemon's own segment or lease, any of the
 * caller's (remote accessibility is for peers). Returns NULL, or what is wrong. */
static const char *resolve_other(mg_gateway *gw, xfer_req *r,
                                 const Moongate__V1__TransferRequest *t, const char *holder)
{
    int rc = mg_pools_resolve(gw->pools, mg_engine_registry(gw->engine), r->b->tenant,
                              t->remote_segment, t->remote_lease, t->remote_offset, t->length,
                              holder, &r->other, &r->other_lease, &r->other_addr);
    r->local_copy = 1;
    if (rc == MG_ERR_NOT_FOUND)
        return t->remote_lease ? "no such lease on this daemon (peer \"\")"
                               : "no such segment on this daemon (peer \"\")";
    return rc ? "remote offset + length is outside the target on this daemon" : NULL;
}

/* The requests of a Submit one after another: `requests`, then each block of `blocks` spelled
 * out as a request (in `tmp`; the peer string stays the message's). */
typedef struct {
    const Moongate__V1__SubmitRequest *req;
    size_t i, g, k;
    Moongate__V1__TransferRequest tmp;
} item_iter;

static const Moongate__V1__TransferRequest *item_next(item_iter *it)
{
    const Moongate__V1__Blocks *bl;
    if (it->i < it->req->n_requests)
        return it->req->requests[it->i++];
    while (it->g < it->req->n_blocks && it->k >= it->req->blocks[it->g]->n_lengths) {
        it->g++;
        it->k = 0;
    }
    if (it->g == it->req->n_blocks)
        return NULL;
    bl = it->req->blocks[it->g];
    moongate__v1__transfer_request__init(&it->tmp);
    it->tmp.op = bl->op;
    it->tmp.local_segment = bl->local_segment;
    it->tmp.local_lease = bl->local_lease;
    it->tmp.peer = bl->peer;
    it->tmp.remote_segment = bl->remote_segment;
    it->tmp.remote_lease = bl->remote_lease;
    it->tmp.local_offset = bl->n_local_offsets ? bl->local_offsets[it->k] : 0;
    it->tmp.remote_offset = bl->n_remote_offsets ? bl->remote_offsets[it->k] : 0;
    it->tmp.length = bl->lengths[it->k];
    it->k++;
    it->i++;
    return &it->tmp;
}

/* How many requests a Submit names, or -1 after failing the call. */
static long submit_count(mg_call *call, const Moongate__V1__SubmitRequest *req, uint64_t max)
{
    uint64_t n = req->n_requests;
    if (req->n_blocks > 64) {
        mg_call_fail(call, MG_ERR_INVALID, "at most 64 groups of blocks");
        return -1;
    }
    for (size_t g = 0; g < req->n_blocks; g++) {
        const Moongate__V1__Blocks *bl = req->blocks[g];
        if ((bl->n_local_offsets && bl->n_local_offsets != bl->n_lengths) ||
            (bl->n_remote_offsets && bl->n_remote_offsets != bl->n_lengths)) {
            mg_call_fail(call, MG_ERR_INVALID,
                         "blocks %zu: local_offsets, remote_offsets and lengths differ in count "
                         "(%zu, %zu, %zu)",
                         g, bl->n_local_offsets, bl->n_remote_offsets, bl->n_lengths);
            return -1;
        }
        n += bl->n_lengths;
    }
    if (n == 0 || n > max) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "a batch has 1..%llu requests (--max-transfer-requests), not %llu",
                     (unsigned long long)max, (unsigned long long)n);
        return -1;
    }
    return (long)n;
}

/* ---- remote targets: checked against the peers' descriptors before a batch starts ---- */

enum { V_CACHED, V_MISSING, V_UNKNOWN }; /* in the cache; the peer says no such target; unasked */

typedef struct desc_key {
    peer_ent *p;
    uint64_t id;
    int is_lease;
    int verdict;
} desc_key;

typedef struct submit_wait {
    struct submit_wait *next; /* the service's Submits waiting for descriptors */
    mg_call *call;
    xfer_batch *b;
    desc_key *keys;
    size_t nkeys, pending;
} submit_wait;

typedef struct {
    submit_wait *sw;
    desc_key *k;
} describe_call;

static desc_key *key_find(desc_key *keys, size_t n, const xfer_req *r)
{
    for (size_t i = 0; i < n; i++) {
        if (keys[i].p == r->peer && keys[i].id == r->remote_segment &&
            keys[i].is_lease == r->remote_lease)
            return &keys[i];
    }
    return NULL;
}

/* Checks request r against what is known of its target. Returns NULL when it may run (also
 * when nothing could be learnt: the data plane checks every slice anyway), else why not. */
static const char *remote_verdict(struct mg_transfer_svc *ts, const xfer_req *r, const desc_key *k,
                                  char *why, size_t cap, uint64_t *size)
{
    int rc;
    if (k && k->verdict == V_UNKNOWN)
        return NULL;
    if (k && k->verdict == V_MISSING) {
        snprintf(why, cap, "peer %s has no %s %llu", r->peer->addr,
                 r->remote_lease ? "remote-accessible lease" : "segment",
                 (unsigned long long)r->remote_segment);
        return why;
    }
    rc = mg_peer_cache_check(ts->descs, r->peer->key, r->peer->addr, r->remote_segment,
                             r->remote_lease, r->remote_offset, r->length, size, why, cap);
    if (rc == MG_ERR_NOT_FOUND)
        return k ? NULL : "unknown"; /* first pass: ask the peer */
    return rc ? why : NULL;
}

/* Every remote request of b against the descriptors; fails the call on the first that cannot
 * run (nothing moved) and returns -1. `keys` (or NULL on the first pass) holds what the peers
 * answered. On the first pass, targets not known (or known to be wrong: they are asked again
 * once before the batch fails) are collected into *fetch instead. */
static int remote_pass(mg_call *call, xfer_batch *b, desc_key *keys, size_t nkeys, desc_key **fetch,
                       size_t *nfetch)
{
    struct mg_transfer_svc *ts = b->gw->transfer;
    const xfer_req *last = NULL;
    uint64_t last_size = 0; /* the size of last's target when it checked out, else 0 */
    char why[400];
    for (size_t i = 0; i < b->n; i++) {
        const xfer_req *r = &b->reqs[i];
        const char *bad;
        if (r->local_copy || r->peer == NULL)
            continue;
        if (last && last_size && last->peer == r->peer &&
            last->remote_segment == r->remote_segment && last->remote_lease == r->remote_lease &&
            mg_bounds_check(last_size, r->remote_offset, r->length) == 0)
            continue; /* the same target as the request before, and inside it */
        if (last && !last_size && keys == NULL && last->peer == r->peer &&
            last->remote_segment == r->remote_segment && last->remote_lease == r->remote_lease)
            continue; /* that target is being asked for already */
        last = r;
        last_size = 0;
        bad = remote_verdict(ts, r, keys ? key_find(keys, nkeys, r) : NULL, why, sizeof(why),
                             &last_size);
        if (bad == NULL)
            continue;
        last_size = 0;
        if (keys == NULL) { /* first pass: ask the peer, once per target */
            desc_key *k = key_find(*fetch, *nfetch, r), *grown;
            if (k)
                continue;
            grown = realloc(*fetch, (*nfetch + 1) * sizeof(**fetch));
            if (grown == NULL) {
                mg_call_fail(call, MG_ERR_NOMEM, NULL);
                return -1;
            }
            *fetch = grown;
            (*fetch)[(*nfetch)++] =
                (desc_key){r->peer, r->remote_segment, r->remote_lease, V_UNKNOWN};
            continue;
        }
        mg_call_fail(call, MG_ERR_INVALID, "request %zu: %s; nothing was moved", i, bad);
        return -1;
    }
    return 0;
}

static void batch_abandon(xfer_batch *b)
{
    for (size_t i = 0; i < b->n; i++)
        req_release_local(&b->reqs[i]);
    batch_free(b);
}

static void submit_wait_unlink(submit_wait *sw)
{
    submit_wait **pp;
    for (pp = &sw->b->gw->transfer->waits; *pp && *pp != sw; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = sw->next;
}

static void submit_wait_end(submit_wait *sw)
{
    mg_call *call = sw->call;
    submit_wait_unlink(sw);
    mg_call_set_data(call, NULL); /* submit_go may set its own (a Submit with `wait`) */
    if (mg_call_done(call) || remote_pass(call, sw->b, sw->keys, sw->nkeys, NULL, NULL) != 0)
        batch_abandon(sw->b); /* the caller left, or the batch cannot run */
    else
        submit_go(call, sw->b);
    mg_call_unref(call);
    free(sw->keys);
    free(sw);
}

static void describe_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    describe_call *dc = arg;
    submit_wait *sw = dc->sw;
    struct mg_transfer_svc *ts = sw->b->gw->transfer;
    Moongate__V1__TargetDescriptor *d = (void *)m;
    if (ts->closing) { /* the daemon stops: the Submit waiting for this goes with it */
        if (d)
            moongate__v1__target_descriptor__free_unpacked(d, NULL);
        free(dc);
        if (--sw->pending == 0) {
            submit_wait_unlink(sw);
            batch_abandon(sw->b);
            mg_call_unref(sw->call);
            free(sw->keys);
            free(sw);
        }
        return;
    }
    if (d) {
        mg_remote_desc rd = {.id = d->id,
                             .is_lease = d->is_lease,
                             .size = d->size,
                             .remote_accessible = d->remote_accessible,
                             .transports = 1u << MG_TRANSPORT_TCP};
        for (size_t t = 0; t < d->n_transports; t++) {
            if (!strcmp(d->transports[t], "rdma") && d->rdma_rkey) {
                rd.transports |= 1u << MG_TRANSPORT_RDMA;
                rd.rdma_addr = d->rdma_addr;
                rd.rdma_rkey = d->rdma_rkey;
                for (size_t k = 0; k < d->n_rdma_rkeys && k < 8; k++)
                    rd.rdma_rkeys[rd.rdma_nkeys++] = d->rdma_rkeys[k];
            }
        }
        /* A new epoch forgets what the peer's previous life said. */
        if (mg_peer_cache_epoch(ts->descs, dc->k->p->key, d->epoch, mg_now_mono_ms()) >= 0 &&
            mg_peer_cache_put(ts->descs, dc->k->p->key, d->epoch, &rd) == 0)
            dc->k->verdict = V_CACHED;
        moongate__v1__target_descriptor__free_unpacked(d, NULL);
    } else if (status == MG_GRPC_NOT_FOUND) {
        dc->k->verdict = V_MISSING;
        mg_peer_cache_forget(ts->descs, dc->k->p->key, dc->k->id, dc->k->is_lease);
    } /* else unreachable or refused: left to the data plane, which fails it by name */
    free(dc);
    if (--sw->pending == 0)
        submit_wait_end(sw);
}

/* Before a batch starts: 0 when every remote target checks out against the descriptors known,
 * -1 when one cannot (the call failed, b is gone), 1 when peers are being asked first (the
 * batch starts, or fails, when they have answered). */
static int remote_check(mg_call *call, xfer_batch *b)
{
    desc_key *fetch = NULL;
    size_t nfetch = 0;
    submit_wait *sw;
    if (remote_pass(call, b, NULL, 0, &fetch, &nfetch) != 0) {
        free(fetch);
        batch_abandon(b);
        return -1;
    }
    if (nfetch == 0)
        return 0;
    sw = calloc(1, sizeof(*sw));
    if (sw == NULL) {
        free(fetch);
        batch_abandon(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return -1;
    }
    sw->call = call;
    sw->b = b;
    sw->next = b->gw->transfer->waits;
    b->gw->transfer->waits = sw;
    sw->keys = fetch;
    sw->nkeys = sw->pending = nfetch;
    mg_call_ref(call);
    sw->pending++; /* held until every call is started */
    for (size_t i = 0; i < nfetch; i++) {
        Moongate__V1__DescribeTargetRequest dr = MOONGATE__V1__DESCRIBE_TARGET_REQUEST__INIT;
        describe_call *dc = calloc(1, sizeof(*dc));
        char err[256];
        dr.id = fetch[i].id;
        dr.is_lease = fetch[i].is_lease;
        dr.tenant = fetch[i].p->tenant;
        if (dc == NULL) {
            sw->pending--;
            continue;
        }
        dc->sw = sw;
        dc->k = &fetch[i];
        if (mg_peer_unary(b->gw, &fetch[i].p->chan, fetch[i].p->addr,
                          "/moongate.v1.Peer/DescribeTarget", &dr.base,
                          &moongate__v1__target_descriptor__descriptor, describe_answered, dc, err,
                          sizeof(err)) != 0) {
            free(dc);
            sw->pending--; /* unreachable: left to the data plane */
        }
    }
    if (--sw->pending == 0)
        submit_wait_end(sw);
    return 1;
}

/* A Submit with a request_id a batch of the tenant already has gets that batch (answered now,
 * or at its end with `wait`); one still being checked is asked to come again. Returns 1 when
 * the call was answered so. */
static int submit_retry(mg_call *call, struct mg_transfer_svc *ts,
                        const Moongate__V1__SubmitRequest *req)
{
    Moongate__V1__SubmitResponse again = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    for (xfer_batch *o = ts->batches; req->request_id[0] && o; o = o->next) {
        if (strcmp(o->request_id, req->request_id) || strcmp(o->tenant, mg_call_tenant(call)))
            continue;
        again.batch_id = o->id;
        if (req->wait && batch_over(o))
            submit_answer_now(call, o);
        else if (!req->wait || watch_add(call, o, 1) != 0)
            mg_call_reply(call, &again.base);
        return 1;
    }
    for (submit_wait *w = ts->waits; req->request_id[0] && w; w = w->next) {
        if (!strcmp(w->b->request_id, req->request_id) &&
            !strcmp(w->b->tenant, mg_call_tenant(call))) {
            mg_call_fail(call, MG_ERR_BUSY,
                         "a Submit with request_id \"%s\" is still being checked; ask again",
                         req->request_id);
            return 1;
        }
    }
    return 0;
}

/* The batch's notifications, checked. Returns 0, or -1 after failing the call. */
static int notify_check(mg_call *call, const Moongate__V1__SubmitRequest *req)
{
    if (req->n_notify > NOTIFY_MAX) {
        mg_call_fail(call, MG_ERR_INVALID, "a batch has at most %d notifications", NOTIFY_MAX);
        return -1;
    }
    for (size_t i = 0; i < req->n_notify; i++) {
        const Moongate__V1__NotifyPeer *np = req->notify[i];
        const char *bad = NULL;
        size_t tl = strlen(np->topic);
        if (!mg_is_numeric_host_port(np->peer))
            bad = "peer must be a numeric host:port";
        else if (tl == 0 || tl > TOPIC_MAX)
            bad = "topic must be 1..128 printable characters";
        else if (np->payload.len > PAYLOAD_MAX)
            bad = "payload is over 65536 bytes";
        for (size_t k = 0; k < tl && bad == NULL; k++) {
            if ((unsigned char)np->topic[k] < 0x20 || (unsigned char)np->topic[k] > 0x7e)
                bad = "topic must be 1..128 printable characters";
        }
        if (bad) {
            mg_call_fail(call, MG_ERR_INVALID, "notification %zu: %s; nothing was moved", i, bad);
            return -1;
        }
    }
    return 0;
}

/* --max-tenant-batches: the tenant's batches not over, those being checked too. Returns 0, or
 * -1 after failing the call. */
static int quota_check(mg_call *call, struct mg_transfer_svc *ts)
{
    uint64_t running = 0, max = ts->gw->cfg->max_tenant_batches;
    if (max == 0)
        return 0;
    for (xfer_batch *o = ts->batches; o; o = o->next)
        running += !batch_over(o) && !strcmp(o->tenant, mg_call_tenant(call));
    for (submit_wait *w = ts->waits; w; w = w->next)
        running += !strcmp(w->b->tenant, mg_call_tenant(call));
    if (running < max)
        return 0;
    mg_call_fail(call, MG_ERR_QUOTA,
                 "tenant \"%s\" has %llu batches running, its quota (--max-tenant-batches); "
                 "nothing was moved",
                 mg_call_tenant(call), (unsigned long long)running);
    return -1;
}

/* Request i of b from t: its fields, and its local range resolved and held. Returns NULL, or
 * what is wrong with it. *last: the local segment of the request before (0: a lease). */
static const char *req_fill(xfer_batch *b, size_t i, const Moongate__V1__TransferRequest *t,
                            uint64_t *last, const char *holder)
{
    mg_gateway *gw = b->gw;
    mg_registry *reg = mg_engine_registry(gw->engine);
    xfer_req *r = &b->reqs[i], *prev = i > 0 ? &b->reqs[i - 1] : NULL;
    uint64_t same = *last;
    int rc;
    r->b = b;
    r->gw = gw;
    r->write = t->op == MOONGATE__V1__TRANSFER_OP__WRITE;
    r->remote_segment = t->remote_lease ? t->remote_lease : t->remote_segment;
    r->remote_lease = t->remote_lease != 0;
    r->peer_name = t->peer;
    r->remote_offset = t->remote_offset;
    r->length = t->length;
    *last = t->local_lease ? 0 : t->local_segment;
    if (t->op != MOONGATE__V1__TRANSFER_OP__READ && t->op != MOONGATE__V1__TRANSFER_OP__WRITE)
        return "op must be READ or WRITE";
    if (t->length == 0)
        return "length must be greater than 0";
    if (t->peer[0] && (prev == NULL || strcmp(t->peer, prev->peer_name) != 0) &&
        !mg_is_numeric_host_port(t->peer)) /* the loop must not resolve names */
        return "peer must be a numeric host:port (\"10.0.0.2:7443\", \"[::1]:7443\"), or \"\" "
               "for this daemon";
    if (t->remote_offset > UINT64_MAX - t->length)
        return "remote offset + length overflows";
    if ((t->local_segment != 0) == (t->local_lease != 0))
        return "name the local memory: local_segment or local_lease, one of them";
    if ((t->remote_segment != 0) == (t->remote_lease != 0))
        return "name the remote target: remote_segment or remote_lease, one of them";
    if (!t->local_lease && prev && prev->local && !prev->local_lease && t->local_segment == same) {
        r->local = prev->local; /* the same segment as the request before */
        mg_registry_hold(reg, r->local);
        if (mg_bounds_check(mg_segment_size(r->local), t->local_offset, t->length) != 0)
            return "local offset + length is outside the local segment";
        r->local_addr = (uint8_t *)mg_segment_addr(r->local) + t->local_offset;
    } else if ((rc = mg_pools_resolve(gw->pools, reg, b->tenant, t->local_segment, t->local_lease,
                                      t->local_offset, t->length, holder, &r->local,
                                      &r->local_lease, &r->local_addr)) != 0) {
        if (rc == MG_ERR_NOT_FOUND)
            return t->local_lease ? "no such local lease" : "no such local segment";
        return t->local_lease ? "local offset + length is outside the local lease"
                              : "local offset + length is outside the local segment";
    }
    return t->peer[0] == '\0' ? resolve_other(gw, r, t, holder) : NULL; /* "": a copy here */
}

/* The batch's peers and notifications, while the request message is still here. Returns 0, or
 * MG_ERR_NOMEM. */
static int batch_peers(xfer_batch *b, const Moongate__V1__SubmitRequest *req)
{
    struct mg_transfer_svc *ts = b->gw->transfer;
    for (size_t i = 0; i < b->n; i++) {
        xfer_req *r = &b->reqs[i];
        r->peer = i > 0 && !strcmp(r->peer_name, b->reqs[i - 1].peer_name)
                      ? b->reqs[i - 1].peer
                      : peer_get(ts, r->peer_name, b->tenant);
    }
    for (size_t i = 0; i < b->n; i++)
        b->reqs[i].peer_name = NULL; /* it points into the request message */
    for (size_t i = 0; i < req->n_notify; i++) {
        const Moongate__V1__NotifyPeer *np = req->notify[i];
        xfer_note *n = &b->notes[i];
        n->b = b;
        n->peer = peer_get(ts, np->peer, b->tenant);
        n->payload = malloc(np->payload.len ? np->payload.len : 1);
        b->nnotes = i + 1;
        if (n->peer == NULL || n->payload == NULL)
            return MG_ERR_NOMEM;
        memcpy(n->payload, np->payload.data, np->payload.len);
        n->len = np->payload.len;
        snprintf(n->topic, sizeof(n->topic), "%s", np->topic);
        for (size_t k = 0; k < b->n; k++) {
            if (b->reqs[k].write && b->reqs[k].peer == n->peer)
                n->g.writes_left++;
        }
    }
    return 0;
}

/* A batch that never started: its local memory let go, then it. */
static void batch_discard(xfer_batch *b, size_t filled)
{
    for (size_t k = 0; k < filled; k++)
        req_release_local(&b->reqs[k]);
    batch_free(b);
}

static void submit_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__SubmitRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_transfer_svc *ts = gw->transfer;
    xfer_batch *b;
    item_iter it = {.req = req};
    uint64_t last_segment = 0;
    long count;
    char holder[MG_SEG_HOLDER_MAX];

    if (ts == NULL || mg_engine_registry(gw->engine) == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot transfer");
        return;
    }
    if ((count = submit_count(call, req, gw->cfg->max_transfer_requests)) < 0)
        return;
    if (strlen(req->request_id) > REQUEST_ID_MAX) {
        mg_call_fail(call, MG_ERR_INVALID, "request_id is at most %d bytes", REQUEST_ID_MAX);
        return;
    }
    if (submit_retry(call, ts, req) || notify_check(call, req) != 0 || quota_check(call, ts) != 0)
        return;
    b = calloc(1, sizeof(*b));
    if (b == NULL || (b->reqs = calloc((size_t)count, sizeof(*b->reqs))) == NULL ||
        (b->notes = calloc(req->n_notify + 1, sizeof(*b->notes))) == NULL) {
        if (b)
            free(b->reqs);
        free(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_list_init(&b->watchers);
    do {
        b->id = mg_mix64(++ts->counter);
    } while (b->id == 0);
    snprintf(b->tenant, sizeof(b->tenant), "%s", mg_call_tenant(call));
    b->n = b->counts.n = (size_t)count;
    b->gw = gw;
    snprintf(holder, sizeof(holder), "transfer batch %" PRIu64 " by %s", b->id, mg_call_peer(call));
    for (size_t i = 0; i < b->n; i++) { /* the whole batch is checked before anything moves */
        const char *bad = req_fill(b, i, item_next(&it), &last_segment, holder);
        if (bad) {
            batch_discard(b, i + 1);
            mg_call_fail(call, MG_ERR_INVALID, "request %zu: %s; nothing was moved", i, bad);
            return;
        }
    }
    if (batch_peers(b, req) != 0) {
        batch_discard(b, b->n);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    b->nnotes = b->counts.notes = req->n_notify;
    snprintf(b->request_id, sizeof(b->request_id), "%s", req->request_id);
    b->wait = req->wait;
    b->timeout_ms = req->timeout_ms ? req->timeout_ms : (uint32_t)gw->cfg->transfer_timeout * 1000;
    if (remote_check(call, b) == 0)
        submit_go(call, b);
}

/* The batch passed every check: it gets its id and its requests start. */
static void submit_go(mg_call *call, xfer_batch *b)
{
    mg_gateway *gw = b->gw;
    struct mg_transfer_svc *ts = gw->transfer;
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    size_t i;
    b->t0_ns = mg_now_mono_ns();
    b->timer = evtimer_new(gw->base, batch_timeout, b);
    if (b->timer == NULL) {
        for (i = 0; i < b->n; i++)
            req_release_local(&b->reqs[i]);
        batch_free(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    {
        struct timeval tv = {b->timeout_ms / 1000, (suseconds_t)(b->timeout_ms % 1000) * 1000};
        evtimer_add(b->timer, &tv);
    }
    gw->xfer_stats.in_flight += b->n;
    b->next = ts->batches;
    ts->batches = b;
    ts->nbatches++;
    forget_oldest(ts, gw->cfg->max_batches);
    resp.batch_id = b->id;
    if (!b->wait || watch_add(call, b, 1) != 0) /* out of memory: the id now, at least */
        mg_call_reply(call, &resp.base);

    for (i = 0; i < b->n; i++) {
        xfer_req *r = &b->reqs[i];
        peer_ent *p = r->peer;
        if (p == NULL) {
            req_end(r, MG_ERR_FULL, "this daemon already knows its limit of 1024 peers");
            continue;
        }
        if (p->state == PEER_OPEN && mg_now_mono_ms() < p->expires_ms) {
            req_start(r);
            continue;
        }
        r->next_wait = p->waiting;
        p->waiting = r;
        if (p->state != PEER_OPENING)
            open_session(gw, p);
    }
    for (i = 0; i < b->nnotes; i++) { /* no WRITE to wait for */
        if (b->notes[i].g.state == MG_NOTE_WAITING && b->notes[i].g.writes_left == 0)
            note_fire(&b->notes[i]);
    }
}

/* The caller's batch `id`, or NULL after failing the call with NOT_FOUND. */
static xfer_batch *batch_for(mg_call *call, uint64_t id)
{
    mg_gateway *gw = mg_call_gateway(call);
    xfer_batch *b = NULL;
    if (gw->transfer)
        for (b = gw->transfer->batches; b && b->id != id; b = b->next)
            ;
    if (b == NULL || (mg_call_scope(call) && strcmp(b->tenant, mg_call_scope(call)) != 0)) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no batch %" PRIu64, id);
        return NULL;
    }
    return b;
}

static void reply_batch(mg_call *call, const xfer_batch *b)
{
    batch_msg m;
    if (batch_msg_fill(&m, b) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_call_reply(call, &m.msg.base);
    batch_msg_free(&m);
}

static void get_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    xfer_batch *b = batch_for(call, req->id);
    if (b)
        reply_batch(call, b);
}

/* call hears of b until it ends (Wait), or is answered then (Submit with `wait`). */
static int watch_add(mg_call *call, xfer_batch *b, int submit)
{
    bwatch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return -1;
    w->b = b;
    w->submit = submit;
    mg_call_park(call, &w->park, &b->watchers);
    return 0;
}

static void wait_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    xfer_batch *b = batch_for(call, req->id);
    batch_msg bm;
    if (b == NULL)
        return;
    if (batch_msg_fill(&bm, b) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_call_send(call, &bm.msg.base);
    batch_msg_free(&bm);
    if (batch_over(b)) {
        mg_call_finish(call, MG_GRPC_OK, NULL);
        return;
    }
    if (watch_add(call, b, 0) != 0)
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
}

static void wait_cancel(mg_call *call)
{
    bwatch *w = mg_call_data(call);
    if (w == NULL)
        return;
    mg_call_unpark(&w->park, -1, NULL);
    free(w);
}

static void cancel_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    xfer_batch *b = batch_for(call, req->id);
    if (b == NULL)
        return;
    batch_stop(b, MG_ERR_CANCELLED, "cancelled before it started");
    reply_batch(call, b);
}

static void list_peers_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__ListPeersResponse resp = MOONGATE__V1__LIST_PEERS_RESPONSE__INIT;
    static char *tcp[] = {"tcp"}, *both[] = {"tcp", "rdma"};
    size_t n = 0, i = 0;
    Moongate__V1__PeerStatus *st, **ptrs;
    char(*data)[160], (*rdma_ready)[32];
    uint64_t now = mg_now_mono_ms();
    const char *scope = mg_call_scope(call);
    for (peer_ent *p = gw->transfer ? gw->transfer->peers : NULL; p; p = p->next)
        n += p->addr[0] != '\0' && (scope == NULL || strcmp(p->tenant, scope) == 0);
    st = calloc(n + 1, sizeof(*st));
    ptrs = calloc(n + 1, sizeof(*ptrs));
    data = calloc(n + 1, sizeof(*data));
    rdma_ready = calloc(n + 1, sizeof(*rdma_ready));
    if (st == NULL || ptrs == NULL || data == NULL || rdma_ready == NULL) {
        free(st);
        free(ptrs);
        free(data);
        free(rdma_ready);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    for (peer_ent *p = gw->transfer ? gw->transfer->peers : NULL; p; p = p->next) {
        unsigned queued = 0;
        if (p->addr[0] == '\0' || (scope && strcmp(p->tenant, scope) != 0))
            continue; /* this daemon's own copies; another tenant's entry */
        for (xfer_req *r = p->waiting; r; r = r->next_wait)
            queued++;
        queued += (unsigned)mg_xfer_line_ready(&p->line);
        moongate__v1__peer_status__init(&st[i]);
        st[i].address = p->addr;
        st[i].tenant = p->tenant;
        st[i].state = (Moongate__V1__PeerState)p->state;
        st[i].epoch = p->epoch;
        st[i].restarts_seen = p->restarts_seen;
        if (p->data_port)
            snprintf(data[i], sizeof(data[i]), "%s%s%s:%d", strchr(p->data_host, ':') ? "[" : "",
                     p->data_host, strchr(p->data_host, ':') ? "]" : "", p->data_port);
        st[i].data_endpoint = data[i];
        st[i].transports = p->rdma_state == RDMA_READY ? both : tcp;
        st[i].n_transports = p->rdma_state == RDMA_READY ? 2 : 1;
        if (p->rdma_state == RDMA_READY && p->rref)
            snprintf(rdma_ready[i], sizeof(rdma_ready[i]), "ready (%u device%s)", p->rref->n,
                     p->rref->n == 1 ? "" : "s");
        st[i].rdma = p->rdma_state == RDMA_READY   ? rdma_ready[i]
                     : p->rdma_state == RDMA_SETUP ? "connecting"
                     : p->rdma_why[0]              ? p->rdma_why
                                                   : "not tried yet";
        st[i].last_error = p->state == PEER_FAILED ? p->err : "";
        st[i].idle_connections = mg_dp_pool_idle(&p->idle);
        st[i].jobs = p->line.jobs;
        st[i].queued = queued;
        st[i].session_expires_in_ms =
            p->state == PEER_OPEN && p->expires_ms > now ? p->expires_ms - now : 0;
        ptrs[i] = &st[i];
        i++;
    }
    resp.peers = ptrs;
    resp.n_peers = n;
    mg_call_reply(call, &resp.base);
    free(st);
    free(ptrs);
    free(data);
    free(rdma_ready);
}

static const mg_method transfer_methods[] = {
    MG_UNARY("/moongate.v1.Transfer/ListPeers", &moongate__v1__list_peers_request__descriptor,
             &moongate__v1__list_peers_response__descriptor, list_peers_message),
    {.path = "/moongate.v1.Transfer/Submit",
     .kind = MG_RPC_UNARY,
     .in = &moongate__v1__submit_request__descriptor,
     .out = &moongate__v1__submit_response__descriptor,
     .on_message = submit_message,
     .on_cancel = wait_cancel}, /* with `wait` */
    MG_UNARY("/moongate.v1.Transfer/GetBatch", &moongate__v1__get_batch_request__descriptor,
             &moongate__v1__batch__descriptor, get_message),
    MG_UNARY("/moongate.v1.Transfer/Cancel", &moongate__v1__get_batch_request__descriptor,
             &moongate__v1__batch__descriptor, cancel_message),
    {.path = "/moongate.v1.Transfer/Wait",
     .kind = MG_RPC_SERVER_STREAM,
     .in = &moongate__v1__get_batch_request__descriptor,
     .out = &moongate__v1__batch__descriptor,
     .on_message = wait_message,
     .on_cancel = wait_cancel},
};

static const mg_route transfer_routes[] = {
    {"POST", "/v1/transfers", 0, "/moongate.v1.Transfer/Submit"},
    {"GET", "/v1/transfers", 1, "/moongate.v1.Transfer/GetBatch"},
    {"GET", "/v1/peers", 0, "/moongate.v1.Transfer/ListPeers"},
};

int mg_svc_transfer_init(mg_gateway *gw)
{
    int rc;
    for (size_t i = 0; i < sizeof(transfer_methods) / sizeof(transfer_methods[0]); i++) {
        if ((rc = mg_gateway_add_method(gw, &transfer_methods[i])) != 0)
            return rc;
    }
    for (size_t i = 0; i < sizeof(transfer_routes) / sizeof(transfer_routes[0]); i++) {
        if ((rc = mg_gateway_add_route(gw, &transfer_routes[i])) != 0)
            return rc;
    }
    if (mg_engine_registry(gw->engine) == NULL)
        return 0;
    gw->transfer = calloc(1, sizeof(*gw->transfer));
    if (gw->transfer == NULL)
        return MG_ERR_NOMEM;
    gw->transfer->gw = gw;
    if (mg_peer_cache_new(&gw->transfer->descs, MAX_PEERS, 4096) != 0)
        return MG_ERR_NOMEM;
    {
        mg_xfer_sched_config sc = {.workers = gw->engine,
                                   .io = gw->io,
                                   .cq = gw->cq,
                                   .worker_slots = (unsigned)gw->cfg->workers,
                                   .io_slots = (unsigned)gw->cfg->io_threads,
                                   .max_parts = (unsigned)gw->cfg->tcp_conns_per_peer,
                                   .slice_bytes = gw->cfg->slice_bytes,
                                   .started = req_started,
                                   .job_started = job_started,
                                   .job_ended = job_ended,
                                   .ended = req_moved};
        if ((rc = mg_xfer_sched_new(&gw->transfer->sched, &sc)) != 0)
            return rc;
    }
    {
        struct timeval every = {1, 0};
        gw->transfer->sweep = event_new(gw->base, -1, EV_PERSIST, sweep_cb, gw->transfer);
        if (gw->transfer->sweep == NULL || event_add(gw->transfer->sweep, &every) != 0)
            return MG_ERR_NOMEM;
    }
    if (getrandom(&gw->transfer->counter, sizeof(gw->transfer->counter), 0) !=
        sizeof(gw->transfer->counter))
        gw->transfer->counter = (uint64_t)(uintptr_t)gw;
    return 0;
}

/* After the engine stopped (no job runs). */
void mg_svc_transfer_free(mg_gateway *gw)
{
    struct mg_transfer_svc *ts = gw->transfer;
    if (ts == NULL)
        return;
    ts->closing = 1; /* no new peer calls; answers to open ones are dropped */
    if (ts->sched)
        mg_xfer_sched_close(ts->sched); /* jobs coming back start no others */
    if (ts->sweep)
        event_free(ts->sweep);
    if (gw->cq)
        mg_cq_drain(gw->cq, 0); /* the jobs' completions still point at batches */
    while (ts->peers) {
        peer_ent *p = ts->peers;
        ts->peers = p->next;
        mg_peer_chan_close(&p->chan);
        if (p->rref) /* the workers have stopped: teardown here */
            conn_del_done(p->rref, 0);
        mg_dp_pool_free(&p->idle);
        mg_xfer_line_del(&p->line);
        free(p);
    }
    while (ts->batches) {
        xfer_batch *b = ts->batches;
        ts->batches = b->next;
        while (!mg_list_empty(&b->watchers)) {
            bwatch *w = bwatch_of(mg_list_first(&b->watchers));
            mg_call_unpark(&w->park, -1, NULL);
            free(w);
        }
        for (size_t i = 0; b->reqs && i < b->n; i++)
            req_release_local(&b->reqs[i]);
        batch_free(b);
    }
    mg_peer_cache_del(ts->descs);
    mg_xfer_sched_del(ts->sched);
    free(ts);
    gw->transfer = NULL;
}

/* Per-peer lines for /metrics. */
void mg_svc_transfer_render_peers(mg_gateway *gw, struct evbuffer *out)
{
    static const char *const ops[] = {"read", "write"};
    if (gw->transfer == NULL)
        return;
    evbuffer_add_printf(out, "# HELP moongate_peer_bytes_total Bytes moved with a peer by "
                             "requests that completed, by op and transport.\n"
                             "# TYPE moongate_peer_bytes_total counter\n");
    for (peer_ent *p = gw->transfer->peers; p; p = p->next) {
        for (int o = 0; o < 2; o++) {
            evbuffer_add_printf(out,
                                "moongate_peer_bytes_total{peer=\"%s\",tenant=\"%s\",op=\"%s\","
                                "transport=\"%s\"} %llu\n",
                                p->addr[0] ? p->addr : "local", p->tenant, ops[o],
                                p->addr[0] ? "tcp" : "copy", (unsigned long long)p->bytes[o]);
            if (p->addr[0] && (p->rdma_bytes[o] || p->rdma_state == RDMA_READY))
                evbuffer_add_printf(out,
                                    "moongate_peer_bytes_total{peer=\"%s\",tenant=\"%s\","
                                    "op=\"%s\",transport=\"rdma\"} %llu\n",
                                    p->addr, p->tenant, ops[o],
                                    (unsigned long long)p->rdma_bytes[o]);
        }
    }
    evbuffer_add_printf(out, "# HELP moongate_peer_requests_total Requests with a peer that "
                             "ended, by op and result.\n"
                             "# TYPE moongate_peer_requests_total counter\n");
    for (peer_ent *p = gw->transfer->peers; p; p = p->next) {
        for (int o = 0; o < 2; o++)
            evbuffer_add_printf(out,
                                "moongate_peer_requests_total{peer=\"%s\",tenant=\"%s\",op=\"%s\","
                                "result=\"done\"} %llu\n"
                                "moongate_peer_requests_total{peer=\"%s\",tenant=\"%s\",op=\"%s\","
                                "result=\"failed\"} %llu\n",
                                p->addr[0] ? p->addr : "local", p->tenant, ops[o],
                                (unsigned long long)p->ended[o][0], p->addr[0] ? p->addr : "local",
                                p->tenant, ops[o], (unsigned long long)p->ended[o][1]);
    }
    evbuffer_add_printf(out, "# HELP moongate_peer_connections Data-plane connections to a peer, "
                             "by state (busy: carrying a part of a request now).\n"
                             "# TYPE moongate_peer_connections gauge\n");
    for (peer_ent *p = gw->transfer->peers; p; p = p->next) {
        int idle;
        if (p->addr[0] == '\0')
            continue;
        idle = (int)mg_dp_pool_idle(&p->idle);
        evbuffer_add_printf(out,
                            "moongate_peer_connections{peer=\"%s\",tenant=\"%s\",state=\"idle\"} "
                            "%d\n"
                            "moongate_peer_connections{peer=\"%s\",tenant=\"%s\",state=\"busy\"} "
                            "%u\n",
                            p->addr, p->tenant, idle, p->addr, p->tenant, p->line.jobs);
    }
}

/* Drain: Wait calls get the batch as it stands and end (UNAVAILABLE) so their connections can
 * close; the batches themselves go on until the daemon stops. */
void mg_svc_transfer_drain(mg_gateway *gw)
{
    for (xfer_batch *b = gw->transfer ? gw->transfer->batches : NULL; b; b = b->next) {
        batch_msg m;
        int have = !mg_list_empty(&b->watchers) && batch_msg_fill(&m, b) == 0;
        while (!mg_list_empty(&b->watchers)) {
            bwatch *w = bwatch_of(mg_list_first(&b->watchers));
            int answered = w->submit && have; /* the batch id, and where it stands */
            if (answered)
                submit_answer(w->park.call, b, &m);
            else if (have && !w->submit)
                mg_call_send(w->park.call, &m.msg.base);
            if (mg_list_first(&b->watchers) != &w->park.node)
                continue; /* the call ended on its own, and w with it (wait_cancel) */
            mg_call_unpark(&w->park, answered ? -1 : MG_GRPC_UNAVAILABLE,
                           "the daemon is draining; the batch goes on until it stops");
            free(w);
        }
        if (have)
            batch_msg_free(&m);
    }
}

/* Before the engine stops: running transfers end now (UNAVAILABLE: shutting down) instead of
 * holding a worker until their peer answers. */
void mg_svc_transfer_stop(mg_gateway *gw)
{
    if (gw->transfer == NULL)
        return;
    for (xfer_batch *b = gw->transfer->batches; b; b = b->next) {
        for (size_t i = 0; i < b->n; i++) {
            if (b->reqs && b->reqs[i].life.state == MG_REQ_RUNNING)
                mg_xfer_req_stop(&b->reqs[i].x, MG_ERR_SHUTDOWN);
        }
    }
}

/* /metrics: the transfers' block. */
static void transfer_metrics(mg_gateway *gw, struct evbuffer *out)
{
    const mg_transfer_stats *s = &gw->xfer_stats;
    static const char *const ops[] = {"read", "write"};
    evbuffer_add_printf(out, "# HELP moongate_transfer_requests_total Transfer requests that "
                             "ended, by op and result.\n"
                             "# TYPE moongate_transfer_requests_total counter\n");
    for (int o = 0; o < 2; o++)
        evbuffer_add_printf(out,
                            "moongate_transfer_requests_total{op=\"%s\",result=\"done\"} %llu\n"
                            "moongate_transfer_requests_total{op=\"%s\",result=\"failed\"} "
                            "%llu\n",
                            ops[o], (unsigned long long)s->requests[o][0], ops[o],
                            (unsigned long long)s->requests[o][1]);
    evbuffer_add_printf(
        out,
        "# HELP moongate_transfer_bytes_total Bytes moved by transfer requests "
        "that completed.\n# TYPE moongate_transfer_bytes_total counter\n"
        "moongate_transfer_bytes_total{op=\"read\"} %llu\n"
        "moongate_transfer_bytes_total{op=\"write\"} %llu\n"
        "# HELP moongate_transfer_requests_in_flight Submitted, not ended.\n"
        "# TYPE moongate_transfer_requests_in_flight gauge\n"
        "moongate_transfer_requests_in_flight %llu\n"
        "# HELP moongate_transfer_slices_in_flight Data-plane slices sent to "
        "peers and not yet answered.\n"
        "# TYPE moongate_transfer_slices_in_flight gauge\n"
        "moongate_transfer_slices_in_flight %lld\n"
        "# HELP moongate_transfer_failures_total Failed transfer requests, by "
        "code.\n# TYPE moongate_transfer_failures_total counter\n",
        (unsigned long long)s->bytes[0], (unsigned long long)s->bytes[1],
        (unsigned long long)s->in_flight,
        (long long)(gw->transfer ? mg_xfer_sched_slices_in_flight(gw->transfer->sched) : 0));
    for (int c = 1; c < MG_GRPC_CODE_COUNT; c++) {
        if (s->failed_by_code[c])
            evbuffer_add_printf(out, "moongate_transfer_failures_total{grpc_code=\"%s\"} %llu\n",
                                mg_grpc_code_name(c), (unsigned long long)s->failed_by_code[c]);
    }
    mg_metrics_render_seconds(out, "moongate_transfer_seconds",
                              "Time from a batch's submit to the end of each of its requests.",
                              s->buckets, s->ended, s->seconds_sum);
    evbuffer_add_printf(
        out,
        "# HELP moongate_transfer_notifications_total Notifications this daemon's batches "
        "sent to peers, by result.\n# TYPE moongate_transfer_notifications_total counter\n"
        "moongate_transfer_notifications_total{result=\"sent\"} %llu\n"
        "moongate_transfer_notifications_total{result=\"failed\"} %llu\n",
        (unsigned long long)s->notes_sent, (unsigned long long)s->notes_failed);
    mg_svc_transfer_render_peers(gw, out);
}

/* /status.json: batches and requests in flight, and each peer's state and load. */
static void transfer_status(mg_gateway *gw, json_t *obj)
{
    static const char *const states[] = {"new", "opening", "open", "failed"};
    size_t running = 0;
    json_t *peers = json_array();
    for (xfer_batch *b = gw->transfer->batches; b; b = b->next)
        running += !batch_over(b);
    for (peer_ent *p = gw->transfer->peers; peers && p; p = p->next) {
        unsigned queued = 0;
        if (p->addr[0] == '\0')
            continue;
        for (xfer_req *r = p->waiting; r; r = r->next_wait)
            queued++;
        queued += (unsigned)mg_xfer_line_ready(&p->line);
        json_array_append_new(peers, json_pack("{s:s,s:s,s:i,s:i,s:s}", "address", p->addr, "state",
                                               states[p->state & 3], "queued", (int)queued, "jobs",
                                               (int)p->line.jobs, "transport",
                                               p->rdma_state == RDMA_READY ? "rdma" : "tcp"));
    }
    json_object_set_new(obj, "transfers",
                        json_pack("{s:I,s:I,s:I}", "batches_running", (json_int_t)running,
                                  "requests_in_flight", (json_int_t)gw->xfer_stats.in_flight,
                                  "slices_in_flight",
                                  (json_int_t)mg_xfer_sched_slices_in_flight(gw->transfer->sched)));
    json_object_set_new(obj, "peers", peers ? peers : json_array());
}

/* Its free runs after the engine stopped: it first runs the completions of the jobs the
 * workers gave up, while every service is still there. */
const mg_service mg_svc_transfer = {.name = "transfer",
                                    .init = mg_svc_transfer_init,
                                    .drain = mg_svc_transfer_drain,
                                    .stop = mg_svc_transfer_stop,
                                    .metrics = transfer_metrics,
                                    .status = transfer_status,
                                    .free = mg_svc_transfer_free};
