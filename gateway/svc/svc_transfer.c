/*
 * svc_transfer: moongate.v1.Transfer — batches of READ/WRITE requests between this daemon's
 * segments and segments of peer daemons. The service is the protocol's side of the engine's
 * transfer machine: the batches (moongate/batches.h), the peer directory and its scheduler
 * (moongate/peerdir.h), the movers on the workers (moongate/xfer.h).
 *
 * Loop thread. Submit turns the message into a batch whose requests are checked all before any
 * moves (local memory resolved and held, remote targets against what the peers described), and
 * answers its id; Wait streams a batch's progress, and GetBatch and Cancel find it. The service
 * speaks to peers for the engine — OpenSession and ConnectRdma when the directory asks
 * (svc/mg_peer_rpc.c), DescribeTarget before a batch starts, Notify/Deliver when a batch's
 * notification is due — and keeps the timers: each batch's timeout, Wait's progress ticks, the
 * retention sweep.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_peer_rpc.h"

#include "moongate/batches.h"
#include "moongate/peerdir.h"
#include "moongate/pools.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/peer.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* clang-format off */
#define MAX_PEERS      1024           /* peer directory entries (each a line in /metrics) */
#define NOTIFY_MAX     16
#define PAYLOAD_MAX    65536
#define WAIT_TICK_MS   20             /* progress reports to Wait calls at most this often */
/* clang-format on */

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
} bwatch;

static bwatch *bwatch_of(mg_list_node *node)
{
    return mg_container_of(node, bwatch, park.node);
}

static batch_front *front_of(const mg_batch *b)
{
    return b->front;
}

struct mg_transfer_svc {
    mg_gateway *gw;
    mg_batches *batches;  /* the batches and their requests (moongate/batches.h) */
    mg_peerdir *dir;      /* the peers, and the scheduler of their lines (moongate/peerdir.h) */
    int closing;          /* freeing: answers of peer calls are dropped */
    struct event *sweep;  /* forgets batches past --batch-retention */
    mg_peer_cache *descs; /* what peers said of their targets, per epoch */
    struct submit_wait *waits;
};

static struct mg_transfer_svc *svc_of(const mg_batch *b)
{
    return mg_batches_arg(b->set);
}

static struct mg_transfer_svc *peer_svc(const mg_xfer_peer *p)
{
    return mg_peerdir_arg(p->dir);
}

/* ---- batch status ---- */

typedef struct {
    Moongate__V1__Batch msg;
    Moongate__V1__RequestStatus *st;
    Moongate__V1__RequestStatus **ptrs;
    Moongate__V1__NotifyStatus *ns;
    Moongate__V1__NotifyStatus **nptrs;
} batch_msg;

static void batch_msg_free(batch_msg *m);

/* Fills m from b; returns -1 when out of memory. Free with batch_msg_free. */
static int batch_msg_fill(batch_msg *m, const mg_batch *b)
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
        const mg_batch_note *n = &b->notes[i];
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
        mg_batch_rec rec = mg_batch_record(b, i);
        moongate__v1__request_status__init(&m->st[i]);
        m->st[i].state = (Moongate__V1__RequestState)rec.state;
        m->st[i].bytes_done = rec.bytes;
        m->st[i].code = rec.state == MG_REQ_FAILED ? mg_err_grpc(rec.err) : 0;
        m->st[i].transport = (char *)mg_batch_transport_name(rec.transport);
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
static void submit_answer(mg_call *call, const mg_batch *b, batch_msg *m)
{
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    resp.batch_id = b->id;
    resp.batch = &m->msg;
    mg_call_reply(call, &resp.base);
}

static void submit_answer_now(mg_call *call, const mg_batch *b)
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
static void batch_tell(mg_batch *b)
{
    batch_front *f = front_of(b);
    batch_msg m;
    int over = mg_batch_is_over(b);
    if (mg_list_empty(&f->watchers) || batch_msg_fill(&m, b) != 0)
        return;
    mg_list_foreach_safe(&f->watchers, node, next)
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

/* An over batch keeps only its requests' records (after the callback that ended it, which may
 * still be walking the requests). */
static void compact_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_batch_compact(arg);
}

/* The batch changed (an event of the engine's batches). Wait calls hear of the end at once;
 * of progress at most every WAIT_TICK_MS, so a batch of thousands of requests is not re-sent
 * whole for each one. Once it is over its timer goes and it is compacted. */
static void batch_changed(void *arg, mg_batch *b)
{
    static const struct timeval tick = {0, WAIT_TICK_MS * 1000};
    struct mg_transfer_svc *ts = arg;
    batch_front *f = front_of(b);
    int over = mg_batch_is_over(b);
    if (f == NULL)
        return; /* not entered yet (the daemon stops while it is checked) */
    if (over && f->compact_ev == NULL) {
        event_del(f->timer);
        f->compact_ev = event_new(ts->gw->base, -1, 0, compact_cb, b);
        if (f->compact_ev)
            event_active(f->compact_ev, EV_TIMEOUT, 0);
    }
    if (mg_list_empty(&f->watchers))
        return;
    if (over) {
        if (f->wait_ev)
            event_del(f->wait_ev);
        batch_tell(b);
        return;
    }
    if (f->wait_ev == NULL)
        f->wait_ev = evtimer_new(ts->gw->base, wait_tick, b);
    if (f->wait_ev == NULL)
        batch_tell(b);
    else if (!evtimer_pending(f->wait_ev, NULL))
        evtimer_add(f->wait_ev, &tick);
}

/* The batch is freed: its Wait calls (the daemon stops) end, and its timers go. */
static void batch_freed(void *arg, mg_batch *b)
{
    batch_front *f = front_of(b);
    (void)arg;
    while (!mg_list_empty(&f->watchers)) {
        bwatch *w = bwatch_of(mg_list_first(&f->watchers));
        mg_call_unpark(&w->park, -1, NULL);
        free(w);
    }
    if (f->timer)
        event_free(f->timer);
    if (f->wait_ev)
        event_free(f->wait_ev);
    if (f->compact_ev)
        event_free(f->compact_ev);
    free(f);
    b->front = NULL;
}

/* ---- requests finishing ---- */

/* Request r ended (an event of the engine's batches): metrics, and its peer's counts. */
static void request_ended(void *arg, mg_batch_req *r)
{
    struct mg_transfer_svc *ts = arg;
    int err = r->err;
    mg_metrics_transfer(ts->gw, r->write, err, r->length,
                        (double)(mg_now_mono_ns() - r->b->t0_ns) / 1e9);
    if (r->peer)
        mg_peerdir_request_ended(r);
}

static void batch_timeout(evutil_socket_t fd, short what, void *arg)
{
    mg_batch *b = arg;
    char why[96];
    snprintf(why, sizeof(why), "the batch's timeout of %u ms passed before it started",
             b->timeout_ms);
    mg_info("transfer_timeout", "batch=%016" PRIx64 " timeout_ms=%u", b->id, b->timeout_ms);
    mg_batch_stop(b, MG_ERR_TIMEOUT, why);
}

/* ---- the peer directory's calls to peers (moongate/peerdir.h) ---- */

static int watch_add(mg_call *call, mg_batch *b, int submit);
static void submit_go(mg_call *call, mg_batch *b);
static int remote_check(mg_call *call, mg_batch *b);

/* The entry's control channel (room the directory keeps in each entry for it). */
static mg_peer_chan *chan_of(mg_xfer_peer *p)
{
    return p->front;
}

/* The directory's ops: the calls over svc/mg_peer_rpc.c. */
static void open_session(void *arg, mg_xfer_peer *p)
{
    mg_peer_open_session(((struct mg_transfer_svc *)arg)->gw, p);
}

static int connect_rdma(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *job, char *why, size_t cap)
{
    return mg_peer_connect_rdma(((struct mg_transfer_svc *)arg)->gw, p, device, local, job, why,
                                cap);
}

/* ---- notifications: sent to a peer once the batch's WRITEs there are in place ---- */

static void note_end(mg_batch_note *n, mg_note_state state, int code, const char *msg)
{
    if (state == MG_NOTE_SENT)
        peer_svc(n->peer)->gw->xfer_stats.notes_sent++;
    else
        peer_svc(n->peer)->gw->xfer_stats.notes_failed++;
    mg_batch_note_end(n, state, code, msg);
}

typedef struct {
    mg_batch_note *n;
    struct mg_transfer_svc *ts;
} note_call;

static void deliver_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    note_call *nc = arg;
    mg_batch_note *n = nc->n;
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

static void note_fire(mg_batch_note *n)
{
    static const mg_rpc_handlers h = {NULL, deliver_closed};
    Moongate__V1__Notification req = MOONGATE__V1__NOTIFICATION__INIT;
    mg_gateway *gw = peer_svc(n->peer)->gw;
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
    if (mg_peer_call(gw, chan_of(n->peer), n->peer->addr, "/moongate.v1.Notify/Deliver", &req.base,
                     &h, nc, err, sizeof(err)) != 0) {
        free(nc);
        snprintf(why, sizeof(why), "peer %.80s: %.200s", n->peer->addr, err);
        note_end(n, MG_NOTE_FAILED, MG_GRPC_UNAVAILABLE, why);
    }
}

/* A notification is due (an event of the engine's batches). */
static void note_due(void *arg, mg_batch_note *n)
{
    (void)arg;
    note_fire(n);
}

/* ---- handlers ---- */

/* Forgets finished batches that ended more than --batch-retention seconds ago. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mg_transfer_svc *ts = arg;
    mg_batches_expire(ts->batches, mg_now_mono_ms());
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
    mg_xfer_peer *p;
    uint64_t id;
    int is_lease;
    int verdict;
} desc_key;

typedef struct submit_wait {
    struct submit_wait *next; /* the service's Submits waiting for descriptors */
    mg_call *call;
    mg_batch *b;
    desc_key *keys;
    size_t nkeys, pending;
} submit_wait;

typedef struct {
    submit_wait *sw;
    desc_key *k;
} describe_call;

static desc_key *key_find(desc_key *keys, size_t n, const mg_batch_req *r)
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
static const char *remote_verdict(struct mg_transfer_svc *ts, const mg_batch_req *r,
                                  const desc_key *k, char *why, size_t cap, uint64_t *size)
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
static int remote_pass(mg_call *call, mg_batch *b, desc_key *keys, size_t nkeys, desc_key **fetch,
                       size_t *nfetch)
{
    struct mg_transfer_svc *ts = svc_of(b);
    const mg_batch_req *last = NULL;
    uint64_t last_size = 0; /* the size of last's target when it checked out, else 0 */
    char why[400];
    for (size_t i = 0; i < b->n; i++) {
        const mg_batch_req *r = &b->reqs[i];
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

static void submit_wait_unlink(submit_wait *sw)
{
    submit_wait **pp;
    for (pp = &svc_of(sw->b)->waits; *pp && *pp != sw; pp = &(*pp)->next)
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
        mg_batch_discard(sw->b); /* the caller left, or the batch cannot run */
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
    struct mg_transfer_svc *ts = svc_of(sw->b);
    Moongate__V1__TargetDescriptor *d = (void *)m;
    if (ts->closing) { /* the daemon stops: the Submit waiting for this goes with it */
        if (d)
            moongate__v1__target_descriptor__free_unpacked(d, NULL);
        free(dc);
        if (--sw->pending == 0) {
            submit_wait_unlink(sw);
            mg_batch_discard(sw->b);
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
static int remote_check(mg_call *call, mg_batch *b)
{
    desc_key *fetch = NULL;
    size_t nfetch = 0;
    submit_wait *sw;
    if (remote_pass(call, b, NULL, 0, &fetch, &nfetch) != 0) {
        free(fetch);
        mg_batch_discard(b);
        return -1;
    }
    if (nfetch == 0)
        return 0;
    sw = calloc(1, sizeof(*sw));
    if (sw == NULL) {
        free(fetch);
        mg_batch_discard(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return -1;
    }
    sw->call = call;
    sw->b = b;
    sw->next = svc_of(b)->waits;
    svc_of(b)->waits = sw;
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
        if (mg_peer_unary(svc_of(b)->gw, chan_of(fetch[i].p), fetch[i].p->addr,
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
    mg_batch *o = mg_batches_find_request(ts->batches, mg_call_tenant(call), req->request_id);
    if (o) {
        again.batch_id = o->id;
        if (req->wait && mg_batch_is_over(o))
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
        else if (tl == 0 || tl > MG_BATCH_TOPIC_MAX)
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
    uint64_t running, max = ts->gw->cfg->max_tenant_batches;
    if (max == 0)
        return 0;
    running = mg_batches_running(ts->batches, mg_call_tenant(call));
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

/* Request i of b from t (see mg_batch_fill). Returns NULL, or what is wrong with it. */
static const char *req_fill(mg_batch *b, size_t i, const Moongate__V1__TransferRequest *t,
                            uint64_t *last, const char *holder)
{
    mg_batch_item item = {.write = t->op == MOONGATE__V1__TRANSFER_OP__WRITE,
                          .local_segment = t->local_segment,
                          .local_lease = t->local_lease,
                          .local_offset = t->local_offset,
                          .peer = t->peer,
                          .remote_segment = t->remote_segment,
                          .remote_lease = t->remote_lease,
                          .remote_offset = t->remote_offset,
                          .length = t->length};
    if (t->op != MOONGATE__V1__TRANSFER_OP__READ && t->op != MOONGATE__V1__TRANSFER_OP__WRITE)
        return "op must be READ or WRITE";
    return mg_batch_fill(b, i, &item, last, holder);
}

/* The batch's peers and notifications, while the request message is still here. Returns 0, or
 * MG_ERR_NOMEM. */
static int batch_peers(mg_batch *b, const Moongate__V1__SubmitRequest *req)
{
    struct mg_transfer_svc *ts = svc_of(b);
    for (size_t i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        r->peer = i > 0 && !strcmp(r->peer_name, b->reqs[i - 1].peer_name)
                      ? b->reqs[i - 1].peer
                      : mg_peerdir_get(ts->dir, r->peer_name, b->tenant);
    }
    for (size_t i = 0; i < b->n; i++)
        b->reqs[i].peer_name = NULL; /* it points into the request message */
    for (size_t i = 0; i < req->n_notify; i++) {
        const Moongate__V1__NotifyPeer *np = req->notify[i];
        mg_batch_note *n = &b->notes[i];
        n->peer = mg_peerdir_get(ts->dir, np->peer, b->tenant);
        n->payload = malloc(np->payload.len ? np->payload.len : 1);
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

static void submit_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__SubmitRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_transfer_svc *ts = gw->transfer;
    mg_batch *b;
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
    if (strlen(req->request_id) > MG_BATCH_REQUEST_ID_MAX) {
        mg_call_fail(call, MG_ERR_INVALID, "request_id is at most %d bytes",
                     MG_BATCH_REQUEST_ID_MAX);
        return;
    }
    if (submit_retry(call, ts, req) || notify_check(call, req) != 0 || quota_check(call, ts) != 0)
        return;
    b = mg_batch_new(ts->batches, mg_call_tenant(call), (size_t)count, req->n_notify);
    if (b == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    snprintf(holder, sizeof(holder), "transfer batch %" PRIu64 " by %s", b->id, mg_call_peer(call));
    for (size_t i = 0; i < b->n; i++) { /* the whole batch is checked before anything moves */
        const char *bad = req_fill(b, i, item_next(&it), &last_segment, holder);
        if (bad) {
            mg_batch_discard(b);
            mg_call_fail(call, MG_ERR_INVALID, "request %zu: %s; nothing was moved", i, bad);
            return;
        }
    }
    if (batch_peers(b, req) != 0) {
        mg_batch_discard(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    snprintf(b->request_id, sizeof(b->request_id), "%s", req->request_id);
    b->wait = req->wait;
    b->timeout_ms = req->timeout_ms ? req->timeout_ms : (uint32_t)gw->cfg->transfer_timeout * 1000;
    if (remote_check(call, b) == 0)
        submit_go(call, b);
}

/* The batch passed every check: it gets its id and its requests start. */
static void submit_go(mg_call *call, mg_batch *b)
{
    struct mg_transfer_svc *ts = svc_of(b);
    mg_gateway *gw = ts->gw;
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    struct timeval tv = {b->timeout_ms / 1000, (suseconds_t)(b->timeout_ms % 1000) * 1000};
    batch_front *f = calloc(1, sizeof(*f));
    size_t i;
    if (f == NULL || (f->timer = evtimer_new(gw->base, batch_timeout, b)) == NULL) {
        free(f);
        mg_batch_discard(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_list_init(&f->watchers);
    b->front = f;
    evtimer_add(f->timer, &tv);
    gw->xfer_stats.in_flight += b->n;
    mg_batches_add(ts->batches, b, mg_now_mono_ns());
    resp.batch_id = b->id;
    if (!b->wait || watch_add(call, b, 1) != 0) /* out of memory: the id now, at least */
        mg_call_reply(call, &resp.base);

    for (i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        if (r->peer == NULL)
            mg_batch_req_end(r, MG_ERR_FULL, "this daemon already knows its limit of 1024 peers");
        else
            mg_peerdir_start(r, mg_now_mono_ms());
    }
    mg_batch_notes_start(b); /* those with no WRITE to wait for */
}

/* The caller's batch `id`, or NULL after failing the call with NOT_FOUND. */
static mg_batch *batch_for(mg_call *call, uint64_t id)
{
    mg_gateway *gw = mg_call_gateway(call);
    mg_batch *b = gw->transfer ? mg_batches_find(gw->transfer->batches, id) : NULL;
    if (b == NULL || (mg_call_scope(call) && strcmp(b->tenant, mg_call_scope(call)) != 0)) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no batch %" PRIu64, id);
        return NULL;
    }
    return b;
}

static void reply_batch(mg_call *call, const mg_batch *b)
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
    mg_batch *b = batch_for(call, req->id);
    if (b)
        reply_batch(call, b);
}

/* call hears of b until it ends (Wait), or is answered then (Submit with `wait`). */
static int watch_add(mg_call *call, mg_batch *b, int submit)
{
    bwatch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return -1;
    w->b = b;
    w->submit = submit;
    mg_call_park(call, &w->park, &front_of(b)->watchers);
    return 0;
}

static void wait_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    mg_batch *b = batch_for(call, req->id);
    batch_msg bm;
    if (b == NULL)
        return;
    if (batch_msg_fill(&bm, b) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_call_send(call, &bm.msg.base);
    batch_msg_free(&bm);
    if (mg_batch_is_over(b)) {
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
    mg_batch *b = batch_for(call, req->id);
    if (b == NULL)
        return;
    mg_batch_stop(b, MG_ERR_CANCELLED, "cancelled before it started");
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
    mg_peerdir_foreach(gw->transfer ? gw->transfer->dir : NULL, p) n +=
        p->addr[0] != '\0' && (scope == NULL || strcmp(p->tenant, scope) == 0);
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
    mg_peerdir_foreach(gw->transfer ? gw->transfer->dir : NULL, p)
    {
        unsigned queued = (unsigned)mg_peerdir_queued(p);
        if (p->addr[0] == '\0' || (scope && strcmp(p->tenant, scope) != 0))
            continue; /* this daemon's own copies; another tenant's entry */
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
        st[i].transports = p->rdma_state == MG_PEER_RDMA_READY ? both : tcp;
        st[i].n_transports = p->rdma_state == MG_PEER_RDMA_READY ? 2 : 1;
        if (p->rdma_state == MG_PEER_RDMA_READY && p->rref)
            snprintf(rdma_ready[i], sizeof(rdma_ready[i]), "ready (%u device%s)", p->rref->n,
                     p->rref->n == 1 ? "" : "s");
        st[i].rdma = p->rdma_state == MG_PEER_RDMA_READY   ? rdma_ready[i]
                     : p->rdma_state == MG_PEER_RDMA_SETUP ? "connecting"
                     : p->rdma_why[0]                      ? p->rdma_why
                                                           : "not tried yet";
        st[i].last_error = p->state == MG_PEER_FAILED ? p->err : "";
        st[i].idle_connections = mg_dp_pool_idle(&p->idle);
        st[i].jobs = p->line.jobs;
        st[i].queued = queued;
        st[i].session_expires_in_ms =
            p->state == MG_PEER_OPEN && p->expires_ms > now ? p->expires_ms - now : 0;
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
        mg_batches_config bc = {.reg = mg_engine_registry(gw->engine),
                                .pools = gw->pools,
                                .max_batches = gw->cfg->max_batches,
                                .retention_ms = gw->cfg->batch_retention * 1000,
                                .arg = gw->transfer,
                                .request_ended = request_ended,
                                .note_due = note_due,
                                .changed = batch_changed,
                                .freed = batch_freed};
        if ((rc = mg_batches_new(&gw->transfer->batches, &bc)) != 0)
            return rc;
    }
    {
        const mg_config *cfg = gw->cfg;
        mg_peerdir_config pc = {.max_peers = MAX_PEERS,
                                .front_bytes = sizeof(mg_peer_chan),
                                .sched = {.workers = gw->engine,
                                          .io = gw->io,
                                          .cq = gw->cq,
                                          .worker_slots = (unsigned)cfg->workers,
                                          .io_slots = (unsigned)cfg->io_threads,
                                          .max_parts = (unsigned)cfg->tcp_conns_per_peer,
                                          .slice_bytes = cfg->slice_bytes},
                                .descs = gw->transfer->descs,
                                .engine = gw->engine,
                                .cq = gw->cq,
                                .rdma = gw->rdma,
                                .rdma_why = gw->rdma_why,
                                .rdma_qps = (unsigned)cfg->rdma_qps_per_peer,
                                .io_timeout_ms = (uint32_t)cfg->data_io_timeout * 1000,
                                .crc = cfg->data_crc,
                                .arg = gw->transfer,
                                .open_session = open_session,
                                .connect_rdma = connect_rdma};
        if ((rc = mg_peerdir_new(&gw->transfer->dir, &pc)) != 0)
            return rc;
    }
    {
        struct timeval every = {1, 0};
        gw->transfer->sweep = event_new(gw->base, -1, EV_PERSIST, sweep_cb, gw->transfer);
        if (gw->transfer->sweep == NULL || event_add(gw->transfer->sweep, &every) != 0)
            return MG_ERR_NOMEM;
    }
    return 0;
}

/* After the engine stopped (no job runs). */
void mg_svc_transfer_free(mg_gateway *gw)
{
    struct mg_transfer_svc *ts = gw->transfer;
    if (ts == NULL)
        return;
    ts->closing = 1; /* no new peer calls; answers to open ones are dropped */
    if (ts->dir)
        mg_peerdir_close(ts->dir); /* jobs coming back start no others */
    if (ts->sweep)
        event_free(ts->sweep);
    if (gw->cq)
        mg_cq_drain(gw->cq, 0); /* the jobs' completions still point at batches */
    mg_peerdir_foreach(ts->dir, p) mg_peer_chan_close(chan_of(p));
    mg_peerdir_del(ts->dir);
    mg_batches_del(ts->batches); /* their Wait calls end, their memory is let go */
    mg_peer_cache_del(ts->descs);
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
    mg_peerdir_foreach(gw->transfer->dir, p)
    {
        for (int o = 0; o < 2; o++) {
            evbuffer_add_printf(out,
                                "moongate_peer_bytes_total{peer=\"%s\",tenant=\"%s\",op=\"%s\","
                                "transport=\"%s\"} %llu\n",
                                p->addr[0] ? p->addr : "local", p->tenant, ops[o],
                                p->addr[0] ? "tcp" : "copy", (unsigned long long)p->bytes[o]);
            if (p->addr[0] && (p->rdma_bytes[o] || p->rdma_state == MG_PEER_RDMA_READY))
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
    mg_peerdir_foreach(gw->transfer->dir, p)
    {
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
    mg_peerdir_foreach(gw->transfer->dir, p)
    {
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
    mg_batches *set = gw->transfer ? gw->transfer->batches : NULL;
    for (mg_batch *b = set ? mg_batches_first(set) : NULL; b; b = mg_batches_next(set, b)) {
        mg_list *watchers = &front_of(b)->watchers;
        batch_msg m;
        int have = !mg_list_empty(watchers) && batch_msg_fill(&m, b) == 0;
        while (!mg_list_empty(watchers)) {
            bwatch *w = bwatch_of(mg_list_first(watchers));
            int answered = w->submit && have; /* the batch id, and where it stands */
            if (answered)
                submit_answer(w->park.call, b, &m);
            else if (have && !w->submit)
                mg_call_send(w->park.call, &m.msg.base);
            if (mg_list_first(watchers) != &w->park.node)
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
    if (gw->transfer)
        mg_batches_stop_running(gw->transfer->batches, MG_ERR_SHUTDOWN);
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
    evbuffer_add_printf(out,
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
                        (long long)(gw->transfer ? mg_xfer_sched_slices_in_flight(
                                                       mg_peerdir_sched(gw->transfer->dir))
                                                 : 0));
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
    size_t running = mg_batches_running(gw->transfer->batches, NULL);
    json_t *peers = json_array();
    mg_peerdir_foreach(peers ? gw->transfer->dir : NULL, p)
    {
        unsigned queued = (unsigned)mg_peerdir_queued(p);
        if (p->addr[0] == '\0')
            continue;
        json_array_append_new(
            peers, json_pack("{s:s,s:s,s:i,s:i,s:s}", "address", p->addr, "state",
                             states[p->state & 3], "queued", (int)queued, "jobs", (int)p->line.jobs,
                             "transport", p->rdma_state == MG_PEER_RDMA_READY ? "rdma" : "tcp"));
    }
    json_object_set_new(
        obj, "transfers",
        json_pack("{s:I,s:I,s:I}", "batches_running", (json_int_t)running, "requests_in_flight",
                  (json_int_t)gw->xfer_stats.in_flight, "slices_in_flight",
                  (json_int_t)mg_xfer_sched_slices_in_flight(mg_peerdir_sched(gw->transfer->dir))));
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
