/*
 * svc_transfer: moongate.v1.Transfer — batches of READ/WRITE requests between this daemon's
 * segments and segments of peer daemons. The service is the protocol's side of the engine's
 * transfer machine: the batches (moongate/batches.h), the peer directory and its scheduler
 * (moongate/peerdir.h), the movers on the workers (moongate/xfer.h).
 *
 * Loop thread. Submit turns the message into a batch whose requests are checked all before any
 * moves (local memory resolved and held, remote targets against what the peers described), and
 * answers its id; Wait streams a batch's progress, and GetBatch and Cancel find it. The service
 * runs the batches over the core's peer front (mg_service.h: the peer directory, its caches
 * and channels, which also opens sessions and RDMA queue pairs when the directory asks), asks
 * peers DescribeTarget before a batch starts and Notify/Deliver when a batch's notification is
 * due (core/mg_peer_rpc.c), and keeps the timers: each batch's timeout, Wait's progress ticks,
 * the retention sweep.
 */
#include "svc_transfer.h"

#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_peer_rpc.h"

#include "moongate/pools.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTIFY_MAX 16

/* ---- requests finishing ---- */

/* Request r ended (an event of the engine's batches): metrics, and its peer's counts. */
static void request_ended(void *arg, mg_batch_req *r)
{
    mg_xfer_svc_count(arg, r);
    if (r->peer)
        mg_peerdir_request_ended(r);
}

/* Notification n is due (an event of the engine's batches): it goes when its turn comes. */
static void note_due(void *arg, mg_batch_note *n)
{
    struct mg_transfer_svc *ts = arg;
    mg_notelines_due(ts->lines, n);
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

static void submit_go(const xfer_origin *o, mg_batch *b);

/* ---- handlers ---- */

/* Forgets finished batches that ended more than --batch-retention seconds ago. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mg_transfer_svc *ts = arg;
    mg_batches_expire(ts->batches, mg_now_mono_ms());
}

/* The requests of a Submit one after another: `requests`, then each block of `blocks`, each
 * pair of `prepared` (its lists found and checked by submit_count), then each block of
 * `strided`, spelled out as a request (in `tmp`; the peer strings stay the message's and the
 * lists'). */
typedef struct {
    const Moongate__V1__SubmitRequest *req;
    size_t i, g, k, pg, pk, sg, sk;
    Moongate__V1__TransferRequest tmp;
    const mg_xlist *lo[64], *ro[64]; /* each prepared group's lists */
} item_iter;

/* Block sk of strided group sg; its offsets cannot overflow (submit_count checked). */
static const Moongate__V1__TransferRequest *strided_next(item_iter *it)
{
    const Moongate__V1__Strided *st;
    while (it->sg < it->req->n_strided && it->sk >= it->req->strided[it->sg]->count) {
        it->sg++;
        it->sk = 0;
    }
    if (it->sg == it->req->n_strided)
        return NULL;
    st = it->req->strided[it->sg];
    moongate__v1__transfer_request__init(&it->tmp);
    it->tmp.op = st->op;
    it->tmp.local_segment = st->local_segment;
    it->tmp.local_lease = st->local_lease;
    it->tmp.local_address = st->local_address;
    it->tmp.local_offset = st->local_offset + it->sk * st->local_stride;
    it->tmp.peer = st->peer;
    it->tmp.remote_segment = st->remote_segment;
    it->tmp.remote_lease = st->remote_lease;
    it->tmp.remote_agent = st->remote_agent;
    it->tmp.remote_address = st->remote_address;
    it->tmp.remote_offset = st->remote_offset + it->sk * st->remote_stride;
    it->tmp.length = st->length;
    it->sk++;
    it->i++;
    return &it->tmp;
}

static const Moongate__V1__TransferRequest *prepared_next(item_iter *it)
{
    const Moongate__V1__Prepared *p;
    const mg_xlist *lo, *ro;
    uint32_t li, ri;
    while (it->pg < it->req->n_prepared && it->pk >= it->req->prepared[it->pg]->n_local_indices) {
        it->pg++;
        it->pk = 0;
    }
    if (it->pg == it->req->n_prepared)
        return strided_next(it);
    p = it->req->prepared[it->pg];
    lo = it->lo[it->pg];
    ro = it->ro[it->pg];
    li = p->local_indices[it->pk];
    ri = p->remote_indices[it->pk];
    if (it->pk == 0) { /* what the group's items share; the rest of tmp stays as set here */
        moongate__v1__transfer_request__init(&it->tmp);
        it->tmp.op = p->op;
        it->tmp.peer = (char *)ro->peer;
        it->tmp.remote_agent = (char *)ro->agent;
    }
    it->tmp.local_address = lo->addrs[li];
    it->tmp.length = lo->lens[li];
    it->tmp.remote_address = ro->addrs[ri];
    it->pk++;
    it->i++;
    return &it->tmp;
}

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
        return prepared_next(it);
    bl = it->req->blocks[it->g];
    moongate__v1__transfer_request__init(&it->tmp);
    it->tmp.op = bl->op;
    it->tmp.local_segment = bl->local_segment;
    it->tmp.local_lease = bl->local_lease;
    it->tmp.local_address = bl->local_address;
    it->tmp.peer = bl->peer;
    it->tmp.remote_segment = bl->remote_segment;
    it->tmp.remote_lease = bl->remote_lease;
    it->tmp.remote_agent = bl->remote_agent;
    it->tmp.remote_address = bl->remote_address;
    it->tmp.local_offset = bl->n_local_offsets ? bl->local_offsets[it->k] : 0;
    it->tmp.remote_offset = bl->n_remote_offsets ? bl->remote_offsets[it->k] : 0;
    it->tmp.length = bl->lengths[it->k];
    it->k++;
    it->i++;
    return &it->tmp;
}

/* Strided group g's last block's offsets fit in 64 bits (each block's bytes are checked as a
 * request's are when the batch is filled). Returns 0, or -1 after failing the call. */
static int strided_check(const xfer_origin *o, const Moongate__V1__Strided *st, size_t g)
{
    uint64_t last = st->count ? st->count - 1 : 0;
    const char *side = NULL;
    if (st->local_stride && last > (UINT64_MAX - st->local_offset) / st->local_stride)
        side = "local_offset + (count - 1) * local_stride";
    else if (st->remote_stride && last > (UINT64_MAX - st->remote_offset) / st->remote_stride)
        side = "remote_offset + (count - 1) * remote_stride";
    if (side == NULL)
        return 0;
    mg_xfer_origin_fail(o, MG_ERR_INVALID,
                        "strided %zu: %s overflows (count %u); nothing was moved", g, side,
                        st->count);
    return -1;
}

/* How many requests a Submit names (its prepared groups' lists found and checked, into it),
 * or -1 after failing the call. */
static long submit_count(const xfer_origin *o, item_iter *it, uint64_t max)
{
    const Moongate__V1__SubmitRequest *req = it->req;
    uint64_t n = req->n_requests;
    if (req->n_blocks > 64 || req->n_prepared > 64 || req->n_strided > 64) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID,
                            "at most 64 groups of blocks, 64 of prepared and 64 of strided");
        return -1;
    }
    for (size_t g = 0; g < req->n_prepared; g++) {
        if (mg_xfer_svc_prepared(o, req->prepared[g], g, &it->lo[g], &it->ro[g]) != 0)
            return -1;
        n += req->prepared[g]->n_local_indices;
    }
    for (size_t g = 0; g < req->n_blocks; g++) {
        const Moongate__V1__Blocks *bl = req->blocks[g];
        if ((bl->n_local_offsets && bl->n_local_offsets != bl->n_lengths) ||
            (bl->n_remote_offsets && bl->n_remote_offsets != bl->n_lengths)) {
            mg_xfer_origin_fail(
                o, MG_ERR_INVALID,
                "blocks %zu: local_offsets, remote_offsets and lengths differ in count "
                "(%zu, %zu, %zu)",
                g, bl->n_local_offsets, bl->n_remote_offsets, bl->n_lengths);
            return -1;
        }
        n += bl->n_lengths;
    }
    for (size_t g = 0; g < req->n_strided; g++) {
        if (strided_check(o, req->strided[g], g) != 0)
            return -1;
        n += req->strided[g]->count;
    }
    if (n == 0 || n > max) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID,
                            "a batch has 1..%llu requests (--max-transfer-requests), not %llu",
                            (unsigned long long)max, (unsigned long long)n);
        return -1;
    }
    return (long)n;
}

/* ---- origins: a Submit call, or a ring's submission ---- */

xfer_origin *mg_xfer_origin_keep(const xfer_origin *o)
{
    xfer_origin *k = malloc(sizeof(*k));
    if (k == NULL)
        return NULL;
    *k = *o;
    k->tenant = k->who = NULL; /* the caller's strings: gone after the check */
    if (k->call)
        mg_call_ref(k->call);
    else
        mg_xfer_ring_hold(k->ring, 1);
    return k;
}

void mg_xfer_origin_free(xfer_origin *o)
{
    if (o->call)
        mg_call_unref(o->call);
    else
        mg_xfer_ring_hold(o->ring, -1);
    free(o);
}

/* ---- refusals ---- */

void mg_xfer_origin_fail(const xfer_origin *o, int err, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (o->call)
        mg_call_fail(o->call, err, "%s", why);
    else
        mg_xfer_ring_refused(o, mg_err_grpc(err), "%s: %s", mg_strerror(err), why);
}

/* Submit refused before b started: the caller hears gRPC status `code` and the message, b's
 * notifications' peers hear when that is for good (mg_notelines_refused), b is discarded. */
static void refuse(const xfer_origin *o, mg_batch *b, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(const xfer_origin *o, mg_batch *b, int code, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    mg_notelines_refused(svc_of(b)->lines, b, o->call ? mg_call_traceparent(o->call) : "", code,
                         why);
    if (o->call)
        mg_call_finish(o->call, code, "%s", why);
    else
        mg_xfer_ring_refused(o, code, "%s", why);
    mg_batch_discard(b);
}

/* The same for request i of b, which cannot run for err (an MG_ERR_*) and why: "<err's text>:
 * request i: why; nothing was moved", as mg_call_fail words it. */
static void refuse_request(const xfer_origin *o, mg_batch *b, int err, size_t i, const char *why)
{
    refuse(o, b, mg_err_grpc(err), "%s: request %zu: %s; nothing was moved", mg_strerror(err), i,
           why);
}

/* The runner's answer for a Submit's batch (moongate/runner.h): it starts, or is refused. ctx
 * is the Submit's origin, copied (the call referenced). */
static void prepared(void *arg, void *ctx, mg_batch *b, const mg_xfer_refusal *no)
{
    xfer_origin *o = ctx;
    if (o->call)
        mg_call_set_data(o->call, NULL); /* submit_go may set its own (a Submit with `wait`) */
    if ((o->call ? mg_call_done(o->call) : mg_xfer_ring_gone(o)) || transfer_closing(arg))
        mg_batch_discard(b); /* the caller left, or the daemon stops */
    else if (no == NULL)
        submit_go(o, b);
    else if (no->err && no->request != SIZE_MAX)
        refuse_request(o, b, no->err, no->request, no->why);
    else
        refuse(o, b, no->err ? mg_err_grpc(no->err) : no->grpc, "%s", no->why);
    mg_xfer_origin_free(o);
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
            mg_xfer_svc_answer_now(call, o, req->brief);
        else if (!req->wait || mg_xfer_svc_watch(call, o, 1, req->brief) != 0)
            mg_call_reply(call, &again.base);
        return 1;
    }
    if (req->request_id[0] && mg_runner_preparing(ts->run, mg_call_tenant(call), req->request_id)) {
        mg_call_fail(call, MG_ERR_BUSY,
                     "a Submit with request_id \"%s\" is still being checked; ask again",
                     req->request_id);
        return 1;
    }
    return 0;
}

/* The batch's notifications, checked. Returns 0, or -1 after failing the caller. */
static int notify_check(const xfer_origin *o, const Moongate__V1__SubmitRequest *req)
{
    if (req->n_notify > NOTIFY_MAX) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID, "a batch has at most %d notifications", NOTIFY_MAX);
        return -1;
    }
    for (size_t i = 0; i < req->n_notify; i++) {
        const Moongate__V1__NotifyPeer *np = req->notify[i];
        const char *bad = mg_is_host_port(np->peer) ? mg_note_bad(np->topic, np->payload.len)
                                                    : "peer must be host:port";
        if (bad) {
            mg_xfer_origin_fail(o, MG_ERR_INVALID, "notification %zu: %s; nothing was moved", i,
                                bad);
            return -1;
        }
    }
    return 0;
}

/* --max-tenant-batches: the tenant's batches not over, those being checked too. Returns 0, or
 * -1 after failing the caller. */
static int quota_check(const xfer_origin *o)
{
    struct mg_transfer_svc *ts = o->ts;
    uint64_t running, max = ts->gw->cfg->max_tenant_batches;
    if (max == 0)
        return 0;
    running =
        mg_batches_running(ts->batches, o->tenant) + mg_runner_preparing(ts->run, o->tenant, NULL);
    if (running < max)
        return 0;
    mg_xfer_origin_fail(o, MG_ERR_QUOTA,
                        "tenant \"%s\" has %llu batches running, its quota "
                        "(--max-tenant-batches); nothing was moved",
                        o->tenant, (unsigned long long)running);
    return -1;
}

/* Request i of b from t (see mg_batch_fill). Returns NULL, or what is wrong with it. */
static const char *req_fill(mg_batch *b, size_t i, const Moongate__V1__TransferRequest *t,
                            uint64_t *last, const char *holder, const mg_proc *proc)
{
    mg_batch_item item = {.write = t->op == MOONGATE__V1__TRANSFER_OP__WRITE,
                          .local_segment = t->local_segment,
                          .local_lease = t->local_lease,
                          .local_offset = t->local_offset,
                          .peer = t->peer,
                          .remote_segment = t->remote_segment,
                          .remote_lease = t->remote_lease,
                          .remote_offset = t->remote_offset,
                          .length = t->length,
                          .local_address = t->local_address,
                          .proc = proc,
                          .remote_agent = t->remote_agent,
                          .remote_address = t->remote_address};
    if (t->op != MOONGATE__V1__TRANSFER_OP__READ && t->op != MOONGATE__V1__TRANSFER_OP__WRITE)
        return "op must be READ or WRITE";
    return mg_batch_fill(b, i, &item, last, holder);
}

/* The batch's notifications, copied out of the request message: first of all, so that a
 * refusal reaches their peers (refuse). Returns 0, or MG_ERR_NOMEM. */
static int batch_notes(mg_batch *b, const Moongate__V1__SubmitRequest *req)
{
    struct mg_transfer_svc *ts = svc_of(b);
    for (size_t i = 0; i < req->n_notify; i++) {
        const Moongate__V1__NotifyPeer *np = req->notify[i];
        mg_batch_note *n = &b->notes[i];
        n->peer = mg_peerdir_get(ts->dir, np->peer, b->tenant);
        n->payload = malloc(np->payload.len ? np->payload.len : 1);
        if (n->peer == NULL || n->payload == NULL)
            return MG_ERR_NOMEM;
        if (np->payload.len) /* an empty payload has no data pointer */
            memcpy(n->payload, np->payload.data, np->payload.len);
        n->len = np->payload.len;
        snprintf(n->topic, sizeof(n->topic), "%s", np->topic);
    }
    return 0;
}

/* The requests' peers, while the request message is still here, and the WRITEs each
 * notification waits for. */
static void batch_peers(mg_batch *b)
{
    struct mg_transfer_svc *ts = svc_of(b);
    for (size_t i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        const char *before = i > 0 ? b->reqs[i - 1].peer_name : NULL;
        r->peer = before && (r->peer_name == before || !strcmp(r->peer_name, before))
                      ? b->reqs[i - 1].peer
                      : mg_peerdir_get(ts->dir, r->peer_name, b->tenant);
    }
    for (size_t i = 0; i < b->n; i++) /* they point into the request message */
        b->reqs[i].peer_name = b->reqs[i].agent_arg = b->reqs[i].peer_arg = NULL;
    for (size_t i = 0; i < b->nnotes; i++) {
        for (size_t k = 0; k < b->n; k++) {
            if (b->reqs[k].peer == b->notes[i].peer)
                b->notes[i].g.reqs_left++;
        }
    }
}

static void submit_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    xfer_origin o = {.ts = transfer_of(gw),
                     .call = call,
                     .tenant = mg_call_tenant(call),
                     .conn = mg_call_conn_id(call),
                     .who = mg_call_peer(call)};
    uint32_t uid;
    if (o.ts == NULL || mg_engine_registry(gw->engine) == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot transfer");
        return;
    }
    if (!mg_call_socket_cred(call, &uid, &o.proc))
        o.proc.pid = 0; /* not a local process: no local addresses */
    mg_xfer_svc_submit(&o, (const void *)m);
}

void mg_xfer_svc_submit(const xfer_origin *o, const Moongate__V1__SubmitRequest *req)
{
    struct mg_transfer_svc *ts = o->ts;
    mg_gateway *gw = ts->gw;
    mg_batch *b;
    item_iter it = {.req = req};
    uint64_t last_segment = 0;
    xfer_origin *keep;
    long count;
    int tag;
    char holder[MG_SEG_HOLDER_MAX];

    if ((count = submit_count(o, &it, gw->cfg->max_transfer_requests)) < 0)
        return;
    if (strlen(req->request_id) > MG_BATCH_REQUEST_ID_MAX) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID, "request_id is at most %d bytes",
                            MG_BATCH_REQUEST_ID_MAX);
        return;
    }
    if ((tag = mg_batch_tag_parse(req->tag)) < 0) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID,
                            "tag \"%.64s\" is none of \"\", \"staged\" and \"rdma-dmabuf\"",
                            req->tag);
        return;
    }
    if ((o->call && submit_retry(o->call, ts, req)) || notify_check(o, req) != 0 ||
        quota_check(o) != 0)
        return;
    b = mg_batch_new(ts->batches, o->tenant, (size_t)count, req->n_notify);
    if (b == NULL) {
        mg_xfer_origin_fail(o, MG_ERR_NOMEM, "no memory for the batch");
        return;
    }
    b->conn = o->conn;
    if (batch_notes(b, req) != 0) {
        mg_batch_discard(b);
        mg_xfer_origin_fail(o, MG_ERR_NOMEM, "no memory for the batch's notifications");
        return;
    }
    snprintf(holder, sizeof(holder), "transfer batch %" PRIu64 " by %s", b->id, o->who);
    for (size_t i = 0; i < b->n; i++) { /* the whole batch is checked before anything moves */
        const char *bad = req_fill(b, i, item_next(&it), &last_segment, holder, &o->proc);
        if (bad) { /* it may be the request's own text, which goes with the batch */
            int err = b->reqs[i].err ? b->reqs[i].err : MG_ERR_INVALID;
            refuse_request(o, b, err, i, bad);
            return;
        }
    }
    batch_peers(b);
    snprintf(b->request_id, sizeof(b->request_id), "%s", req->request_id);
    b->wait = req->wait;
    b->brief = req->brief;
    b->tag = (mg_batch_tag)tag;
    b->digest = req->digest;
    if (mg_batch_trace(b, o->call ? mg_call_traceparent(o->call) : "") != 0) {
        mg_batch_discard(b);
        mg_xfer_origin_fail(o, MG_ERR_SYSTEM, "no random bytes for a trace span");
        return;
    }
    b->timeout_ms = req->timeout_ms ? req->timeout_ms : (uint32_t)gw->cfg->transfer_timeout * 1000;
    if ((keep = mg_xfer_origin_keep(o)) == NULL) {
        mg_batch_discard(b);
        mg_xfer_origin_fail(o, MG_ERR_NOMEM, "no memory for the batch");
        return;
    }
    mg_runner_prepare(ts->run, b, keep);
}

/* The batch passed every check: it is entered, answered with its id (minted by mg_batch_new)
 * and its requests start. */
static void submit_go(const xfer_origin *o, mg_batch *b)
{
    struct mg_transfer_svc *ts = svc_of(b);
    mg_gateway *gw = ts->gw;
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    struct timeval tv = {b->timeout_ms / 1000, (suseconds_t)(b->timeout_ms % 1000) * 1000};
    batch_front *f = calloc(1, sizeof(*f));
    if (f == NULL || (f->timer = evtimer_new(gw->base, batch_timeout, b)) == NULL) {
        free(f);
        refuse(o, b, mg_err_grpc(MG_ERR_NOMEM), "%s: no memory for the batch",
               mg_strerror(MG_ERR_NOMEM));
        return;
    }
    mg_list_init(&f->watchers);
    b->front = f;
    evtimer_add(f->timer, &tv);
    ts->stats.in_flight += b->n;
    mg_batches_add(ts->batches, b, mg_now_mono_ns());
    resp.batch_id = b->id;
    if (o->call == NULL)
        mg_xfer_ring_entered(o, b); /* answered on the ring at its end */
    else if (!b->wait || mg_xfer_svc_watch(o->call, b, 1, b->brief) != 0) /* no memory: the id */
        mg_call_reply(o->call, &resp.base);
    mg_runner_start(ts->run, b);
}

static const mg_method transfer_methods[] = {
    MG_UNARY("/moongate.v1.Transfer/ListPeers", &moongate__v1__list_peers_request__descriptor,
             &moongate__v1__list_peers_response__descriptor, mg_xfer_svc_list_peers),
    {.path = "/moongate.v1.Transfer/Submit",
     .kind = MG_RPC_UNARY,
     .in = &moongate__v1__submit_request__descriptor,
     .out = &moongate__v1__submit_response__descriptor,
     .on_message = submit_message,
     .on_cancel = mg_xfer_svc_wait_cancel}, /* with `wait` */
    MG_UNARY("/moongate.v1.Notify/Send", &moongate__v1__send_request__descriptor,
             &moongate__v1__send_response__descriptor, mg_xfer_svc_send),
    MG_UNARY("/moongate.v1.Transfer/PrepareList", &moongate__v1__prepare_list_request__descriptor,
             &moongate__v1__prepared_list__descriptor, mg_xfer_svc_prepare_list),
    MG_UNARY("/moongate.v1.Transfer/ReleaseList", &moongate__v1__release_list_request__descriptor,
             &moongate__v1__release_list_response__descriptor, mg_xfer_svc_release_list),
    MG_UNARY("/moongate.v1.Transfer/AttachRing", &moongate__v1__attach_ring_request__descriptor,
             &moongate__v1__attach_ring_response__descriptor, mg_xfer_svc_attach_ring),
    MG_UNARY("/moongate.v1.Transfer/GetBatch", &moongate__v1__get_batch_request__descriptor,
             &moongate__v1__batch__descriptor, mg_xfer_svc_get),
    MG_UNARY("/moongate.v1.Transfer/Cancel", &moongate__v1__get_batch_request__descriptor,
             &moongate__v1__batch__descriptor, mg_xfer_svc_cancel),
    {.path = "/moongate.v1.Transfer/Wait",
     .kind = MG_RPC_SERVER_STREAM,
     .in = &moongate__v1__get_batch_request__descriptor,
     .out = &moongate__v1__batch__descriptor,
     .on_message = mg_xfer_svc_wait,
     .on_cancel = mg_xfer_svc_wait_cancel},
};

static const mg_route transfer_routes[] = {
    {"POST", "/v1/transfers", 0, "/moongate.v1.Transfer/Submit"},
    {"GET", "/v1/transfers", 1, "/moongate.v1.Transfer/GetBatch"},
    {"GET", "/v1/peers", 0, "/moongate.v1.Transfer/ListPeers"},
};

static int mg_svc_transfer_init(mg_gateway *gw)
{
    struct mg_transfer_svc *ts;
    struct timeval every = {1, 0};
    int rc = mg_gateway_add_methods(gw, transfer_methods, MG_NELEM(transfer_methods),
                                    transfer_routes, MG_NELEM(transfer_routes));
    if (rc != 0 || mg_gateway_peers(gw) == NULL) /* no registry: nothing to transfer */
        return rc;
    if ((ts = calloc(1, sizeof(*ts))) == NULL)
        return MG_ERR_NOMEM;
    *mg_gateway_state(gw, &mg_svc_transfer) = ts;
    *ts = (struct mg_transfer_svc){.gw = gw,
                                   .dir = mg_gateway_peers(gw),
                                   .descs = mg_gateway_peer_cache(gw),
                                   .agents = mg_gateway_agent_cache(gw)};
    {
        mg_batches_config bc = {.reg = mg_engine_registry(gw->engine),
                                .pools = gw->pools,
                                .agents = mg_gateway_agents(gw),
                                .spans = gw->spans,
                                .peer_port = (int)gw->cfg->peer_port,
                                .max_batches = gw->cfg->max_batches,
                                .retention_ms = gw->cfg->batch_retention * 1000,
                                .arg = ts,
                                .request_ended = request_ended,
                                .note_due = note_due,
                                .changed = mg_xfer_svc_changed,
                                .freed = mg_xfer_svc_freed};
        if ((rc = mg_batches_new(&ts->batches, &bc)) != 0)
            return rc;
    }
    if ((rc = mg_xlists_new(&ts->xlists, MG_XLISTS_MAX_RANGES)) != 0)
        return rc;
    if ((rc = mg_xfer_svc_engine(ts, prepared)) != 0 || (rc = mg_xfer_rings_start(ts)) != 0)
        return rc;
    ts->sweep = event_new(gw->base, -1, EV_PERSIST, sweep_cb, ts);
    if (ts->sweep == NULL || event_add(ts->sweep, &every) != 0)
        return MG_ERR_NOMEM;
    return 0;
}

/* After the engine stopped (no job runs) and the core closed the peer front (the jobs that
 * came back ran, the calls on the peers' channels ended): the batches go. */
static void mg_svc_transfer_free(mg_gateway *gw)
{
    struct mg_transfer_svc *ts = transfer_of(gw);
    if (ts == NULL)
        return;
    if (ts->sweep)
        event_free(ts->sweep);
    mg_runner_del(ts->run);      /* the batches it was preparing are discarded */
    mg_notelines_del(ts->lines); /* before the batches whose notifications wait in line */
    mg_batches_del(ts->batches); /* their Wait calls end, their memory is let go */
    mg_xlists_del(ts->xlists);   /* the connections, and their bindings, are gone */
    mg_xfer_rings_stop(ts);      /* their rings closed, their batches gone */
    free(ts);
    *mg_gateway_state(gw, &mg_svc_transfer) = NULL;
}

/* Before the engine stops: running transfers end now (UNAVAILABLE: shutting down) instead of
 * holding a worker until their peer answers. */
static void mg_svc_transfer_stop(mg_gateway *gw)
{
    if (transfer_of(gw))
        mg_batches_stop_running(transfer_of(gw)->batches, MG_ERR_SHUTDOWN);
}

const mg_service mg_svc_transfer = {.name = "transfer",
                                    .init = mg_svc_transfer_init,
                                    .drain = mg_xfer_svc_drain,
                                    .stop = mg_svc_transfer_stop,
                                    .metrics = mg_xfer_svc_metrics,
                                    .status = mg_xfer_svc_status,
                                    .free = mg_svc_transfer_free};
