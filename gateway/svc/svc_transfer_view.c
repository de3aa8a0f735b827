/*
 * svc_transfer_view: what the transfer service shows of the engine's batches and peers —
 * GetBatch, Wait streams (progress at most every WAIT_TICK_MS, the end at once), Cancel,
 * ListPeers, the /metrics block and /status.json (svc_transfer.h).
 */
#include "svc_transfer.h"

#include "moongate/ring.h"

#include "mg_service.h"
#include "mg_peer_rpc.h"

#include "moongate/v1/transfer.pb-c.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WAIT_TICK_MS 20 /* progress reports to Wait calls at most this often */

/* ---- batch status ---- */

typedef struct {
    Moongate__V1__Batch msg;
    Moongate__V1__RequestStatus *st;
    Moongate__V1__RequestStatus **ptrs;
    Moongate__V1__NotifyStatus *ns;
    Moongate__V1__NotifyStatus **nptrs;
} batch_msg;

static void batch_msg_free(batch_msg *m);

/* Fills m from b, brief (only the requests that failed, with their indexes) or not; returns -1
 * when out of memory. Free with batch_msg_free. */
static int batch_msg_fill(batch_msg *m, const mg_batch *b, int brief)
{
    size_t want = brief ? b->counts.failed : b->n, k = 0;
    moongate__v1__batch__init(&m->msg);
    m->st = calloc(want + 1, sizeof(*m->st));
    m->ptrs = calloc(want + 1, sizeof(*m->ptrs));
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
    for (size_t i = 0; i < b->n && k < want; i++) {
        mg_batch_rec rec = mg_batch_record(b, i);
        if (brief && rec.state != MG_REQ_FAILED)
            continue;
        moongate__v1__request_status__init(&m->st[k]);
        m->st[k].state = (Moongate__V1__RequestState)rec.state;
        m->st[k].bytes_done = rec.bytes;
        m->st[k].code = rec.state == MG_REQ_FAILED ? mg_err_grpc(rec.err) : 0;
        m->st[k].transport = (char *)mg_batch_transport_name(rec.transport);
        m->st[k].message = rec.msg ? rec.msg : "";
        m->st[k].index = brief ? (uint32_t)i : 0;
        m->ptrs[k] = &m->st[k];
        k++;
    }
    m->msg.id = b->id;
    m->msg.tag = (char *)mg_batch_tag_name(b->tag);
    m->msg.done = (uint32_t)b->counts.done;
    m->msg.failed = (uint32_t)b->counts.failed;
    m->msg.state = (Moongate__V1__RequestState)mg_batch_state(&b->counts);
    m->msg.requests = m->ptrs;
    m->msg.n_requests = k;
    return 0;
}

static void batch_msg_free(batch_msg *m)
{
    free(m->st);
    free(m->ptrs);
    free(m->ns);
    free(m->nptrs);
}

/* The batch's message in both forms, each made when first asked for. */
typedef struct {
    batch_msg m[2]; /* full, brief */
    int made[2];
} batch_msgs;

/* b's message, brief or not, from ms; NULL when out of memory. */
static batch_msg *msgs_get(batch_msgs *ms, const mg_batch *b, int brief)
{
    int k = brief != 0;
    if (!ms->made[k] && batch_msg_fill(&ms->m[k], b, k) == 0)
        ms->made[k] = 1;
    return ms->made[k] ? &ms->m[k] : NULL;
}

static void msgs_free(batch_msgs *ms)
{
    for (int k = 0; k < 2; k++) {
        if (ms->made[k])
            batch_msg_free(&ms->m[k]);
    }
}

/* The answer of a Submit with `wait`: the batch id and the batch as m says. */
static void submit_answer(mg_call *call, const mg_batch *b, batch_msg *m)
{
    Moongate__V1__SubmitResponse resp = MOONGATE__V1__SUBMIT_RESPONSE__INIT;
    resp.batch_id = b->id;
    resp.batch = &m->msg;
    mg_call_reply(call, &resp.base);
}

void mg_xfer_svc_answer_now(mg_call *call, const mg_batch *b, int brief)
{
    batch_msg m;
    if (batch_msg_fill(&m, b, brief) != 0) {
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
    batch_msgs ms = {0};
    int over = mg_batch_is_over(b);
    mg_list_foreach_safe (&f->watchers, node, next) {
        bwatch *w = bwatch_of(node);
        mg_call *call = w->park.call;
        batch_msg *bm = w->submit && !over ? NULL : msgs_get(&ms, b, w->brief);
        if (bm == NULL)
            continue; /* a Submit hears at the end; out of memory: told later, or at the end */
        if (w->submit)
            submit_answer(call, b, bm);
        else if (over || mg_call_writable(call)) /* a slow reader gets the latest later */
            mg_call_send(call, &bm->msg.base);
        if (mg_call_data(call) != w)
            continue; /* the answer was too large: the call ended, and w with it
                         (mg_xfer_svc_wait_cancel) */
        if (over) {
            mg_call_unpark(&w->park, w->submit ? -1 : MG_GRPC_OK, NULL);
            free(w);
        }
    }
    msgs_free(&ms);
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
void mg_xfer_svc_changed(void *arg, mg_batch *b)
{
    static const struct timeval tick = {0, WAIT_TICK_MS * 1000};
    struct mg_transfer_svc *ts = arg;
    batch_front *f = front_of(b);
    int over = mg_batch_is_over(b);
    if (f == NULL)
        return; /* not entered yet (the daemon stops while it is checked) */
    if (over && f->ring)
        mg_xfer_ring_over(b);
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
void mg_xfer_svc_freed(void *arg, mg_batch *b)
{
    batch_front *f = front_of(b);
    (void)arg;
    if (f->ring)
        mg_xfer_ring_over(b);
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

/* The caller's batch `id`, or NULL after failing the call with NOT_FOUND. */
static mg_batch *batch_for(mg_call *call, uint64_t id)
{
    mg_gateway *gw = mg_call_gateway(call);
    mg_batch *b = transfer_of(gw) ? mg_batches_find(transfer_of(gw)->batches, id) : NULL;
    if (b == NULL || (mg_call_scope(call) && strcmp(b->tenant, mg_call_scope(call)) != 0)) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no batch %" PRIu64, id);
        return NULL;
    }
    return b;
}

static void reply_batch(mg_call *call, const mg_batch *b, int brief)
{
    batch_msg m;
    if (batch_msg_fill(&m, b, brief) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_call_reply(call, &m.msg.base);
    batch_msg_free(&m);
}

void mg_xfer_svc_get(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    mg_batch *b = batch_for(call, req->id);
    if (b)
        reply_batch(call, b, req->brief);
}

/* call hears of b until it ends (Wait), or is answered then (Submit with `wait`). */
int mg_xfer_svc_watch(mg_call *call, mg_batch *b, int submit, int brief)
{
    bwatch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return -1;
    w->b = b;
    w->submit = submit;
    w->brief = brief;
    mg_call_park(call, &w->park, &front_of(b)->watchers);
    return 0;
}

void mg_xfer_svc_wait(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    mg_batch *b = batch_for(call, req->id);
    batch_msg bm;
    if (b == NULL)
        return;
    if (batch_msg_fill(&bm, b, req->brief) != 0) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    mg_call_send(call, &bm.msg.base);
    batch_msg_free(&bm);
    if (mg_batch_is_over(b)) {
        mg_call_finish(call, MG_GRPC_OK, NULL);
        return;
    }
    if (mg_xfer_svc_watch(call, b, 0, req->brief) != 0)
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
}

void mg_xfer_svc_wait_cancel(mg_call *call)
{
    bwatch *w = mg_call_data(call);
    if (w == NULL)
        return;
    mg_call_unpark(&w->park, -1, NULL);
    free(w);
}

void mg_xfer_svc_cancel(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetBatchRequest *req = (const void *)m;
    mg_batch *b = batch_for(call, req->id);
    if (b == NULL)
        return;
    mg_batch_stop(b, MG_ERR_CANCELLED, "cancelled before it started");
    reply_batch(call, b, req->brief);
}

void mg_xfer_svc_list_peers(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__ListPeersResponse resp = MOONGATE__V1__LIST_PEERS_RESPONSE__INIT;
    static char *tcp[] = {"tcp"}, *both[] = {"tcp", "rdma"};
    size_t n = 0, i = 0;
    Moongate__V1__PeerStatus *st, **ptrs;
    char(*data)[160], (*rdma_ready)[32];
    uint64_t now = mg_now_mono_ms();
    const char *scope = mg_call_scope(call);
    mg_peerdir_foreach (transfer_of(gw) ? transfer_of(gw)->dir : NULL, p)
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
    mg_peerdir_foreach (transfer_of(gw) ? transfer_of(gw)->dir : NULL, p) {
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
        st[i].resolved = mg_peer_chan_of(p)->resolved;
        st[i].lookups = mg_peer_chan_of(p)->lookups;
        st[i].lookup_failures = mg_peer_chan_of(p)->lookup_failures;
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

/* Per-peer lines for /metrics. */
static void render_peers(mg_gateway *gw, struct evbuffer *out)
{
    static const char *const ops[] = {"read", "write"};
    if (transfer_of(gw) == NULL)
        return;
    evbuffer_add_printf(out, "# HELP moongate_peer_bytes_total Bytes moved with a peer by "
                             "requests that completed, by op and transport.\n"
                             "# TYPE moongate_peer_bytes_total counter\n");
    mg_peerdir_foreach (transfer_of(gw)->dir, p) {
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
    mg_peerdir_foreach (transfer_of(gw)->dir, p) {
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
    evbuffer_add_printf(out, "# HELP moongate_peer_lookups_total Lookups of a peer's DNS name, "
                             "by result.\n# TYPE moongate_peer_lookups_total counter\n");
    mg_peerdir_foreach (transfer_of(gw)->dir, p) {
        const mg_peer_chan *ch = mg_peer_chan_of(p);
        if (ch->lookups)
            evbuffer_add_printf(out,
                                "moongate_peer_lookups_total{peer=\"%s\",tenant=\"%s\",result="
                                "\"ok\"} %llu\n"
                                "moongate_peer_lookups_total{peer=\"%s\",tenant=\"%s\",result="
                                "\"failed\"} %llu\n",
                                p->addr, p->tenant,
                                (unsigned long long)(ch->lookups - ch->lookup_failures), p->addr,
                                p->tenant, (unsigned long long)ch->lookup_failures);
    }
    evbuffer_add_printf(out, "# HELP moongate_peer_connections Data-plane connections to a peer, "
                             "by state (busy: carrying a part of a request now).\n"
                             "# TYPE moongate_peer_connections gauge\n");
    mg_peerdir_foreach (transfer_of(gw)->dir, p) {
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
void mg_xfer_svc_drain(mg_gateway *gw)
{
    mg_batches *set = transfer_of(gw) ? transfer_of(gw)->batches : NULL;
    for (mg_batch *b = set ? mg_batches_first(set) : NULL; b; b = mg_batches_next(set, b)) {
        mg_list *watchers = &front_of(b)->watchers;
        batch_msgs ms = {0};
        while (!mg_list_empty(watchers)) {
            bwatch *w = bwatch_of(mg_list_first(watchers));
            batch_msg *m = msgs_get(&ms, b, w->brief);
            int answered = w->submit && m; /* the batch id, and where it stands */
            if (answered)
                submit_answer(w->park.call, b, m);
            else if (m && !w->submit)
                mg_call_send(w->park.call, &m->msg.base);
            if (mg_list_first(watchers) != &w->park.node)
                continue; /* the call ended on its own, and w with it (mg_xfer_svc_wait_cancel) */
            mg_call_unpark(&w->park, answered ? -1 : MG_GRPC_UNAVAILABLE,
                           "the daemon is draining; the batch goes on until it stops");
            free(w);
        }
        msgs_free(&ms);
    }
}

void mg_xfer_svc_count(struct mg_transfer_svc *ts, const mg_batch_req *r)
{
    mg_transfer_stats *s = &ts->stats;
    int err = r->err;
    s->requests[r->write != 0][err != 0]++;
    if (err)
        s->failed_by_code[mg_err_grpc(err)]++;
    else
        s->bytes[r->write != 0] += r->length;
    s->tagged[r->b->tag][r->write != 0][0] += err == 0;
    s->tagged[r->b->tag][r->write != 0][1] += err ? 0 : r->length;
    if (s->in_flight)
        s->in_flight--;
    s->ended++;
    mg_metrics_observe_seconds(s->buckets, &s->seconds_sum,
                               (double)(mg_now_mono_ns() - r->b->t0_ns) / 1e9);
}

/* /metrics: the transfers' block. */
void mg_xfer_svc_metrics(mg_gateway *gw, struct evbuffer *out)
{
    static const mg_transfer_stats none;
    const mg_transfer_stats *s = transfer_of(gw) ? &transfer_of(gw)->stats : &none;
    mg_notelines_stats notes = {0};
    static const char *const ops[] = {"read", "write"};
    if (transfer_of(gw))
        notes = mg_notelines_stats_of(transfer_of(gw)->lines);
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
                        (long long)(transfer_of(gw) ? mg_xfer_sched_slices_in_flight(
                                                          mg_peerdir_sched(transfer_of(gw)->dir))
                                                    : 0));
    if (transfer_of(gw) && transfer_of(gw)->rings)
        evbuffer_add_printf(out,
                            "# HELP moongate_rings_open Submission rings of local clients "
                            "served (AttachRing).\n# TYPE moongate_rings_open gauge\n"
                            "moongate_rings_open %zu\n"
                            "# HELP moongate_ring_submissions_total Submissions taken from "
                            "rings.\n# TYPE moongate_ring_submissions_total counter\n"
                            "moongate_ring_submissions_total %llu\n",
                            mg_rings_open(transfer_of(gw)->rings),
                            (unsigned long long)mg_rings_taken(transfer_of(gw)->rings));
    for (int c = 1; c < MG_GRPC_CODE_COUNT; c++) {
        if (s->failed_by_code[c])
            evbuffer_add_printf(out, "moongate_transfer_failures_total{grpc_code=\"%s\"} %llu\n",
                                mg_grpc_code_name(c), (unsigned long long)s->failed_by_code[c]);
    }
    evbuffer_add_printf(out, "# HELP moongate_transfer_tagged_bytes_total Bytes moved by "
                             "completed requests of batches the client library tagged (staged: GPU "
                             "memory through leases; rdma-dmabuf: GPU memory by dma-buf), by op.\n"
                             "# TYPE moongate_transfer_tagged_bytes_total counter\n");
    for (int t = 1; t < MG_TAG_COUNT; t++)
        for (int o = 0; o < 2; o++)
            evbuffer_add_printf(
                out, "moongate_transfer_tagged_bytes_total{tag=\"%s\",op=\"%s\"} %llu\n",
                mg_batch_tag_name(t), ops[o], (unsigned long long)s->tagged[t][o][1]);
    evbuffer_add_printf(out, "# HELP moongate_transfer_tagged_requests_total Completed requests "
                             "of tagged batches, by tag and op.\n"
                             "# TYPE moongate_transfer_tagged_requests_total counter\n");
    for (int t = 1; t < MG_TAG_COUNT; t++)
        for (int o = 0; o < 2; o++)
            evbuffer_add_printf(
                out, "moongate_transfer_tagged_requests_total{tag=\"%s\",op=\"%s\"} %llu\n",
                mg_batch_tag_name(t), ops[o], (unsigned long long)s->tagged[t][o][0]);
    mg_metrics_render_seconds(out, "moongate_transfer_seconds",
                              "Time from a batch's submit to the end of each of its requests.",
                              s->buckets, s->ended, s->seconds_sum);
    evbuffer_add_printf(
        out,
        "# HELP moongate_transfer_notifications_total Notifications this daemon's batches and Send "
        "calls "
        "sent to peers, by result.\n# TYPE moongate_transfer_notifications_total counter\n"
        "moongate_transfer_notifications_total{result=\"sent\"} %llu\n"
        "moongate_transfer_notifications_total{result=\"failed\"} %llu\n",
        (unsigned long long)notes.sent, (unsigned long long)notes.failed);
    render_peers(gw, out);
}

/* /status.json: batches and requests in flight, and each peer's state and load. */
void mg_xfer_svc_status(mg_gateway *gw, json_t *obj)
{
    static const char *const states[] = {"new", "opening", "open", "failed"};
    size_t running;
    json_t *peers;
    if (transfer_of(gw) == NULL)
        return; /* a daemon without a segment registry transfers nothing */
    running = mg_batches_running(transfer_of(gw)->batches, NULL);
    peers = json_array();
    mg_peerdir_foreach (peers ? transfer_of(gw)->dir : NULL, p) {
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
        json_pack(
            "{s:I,s:I,s:I}", "batches_running", (json_int_t)running, "requests_in_flight",
            (json_int_t)transfer_of(gw)->stats.in_flight, "slices_in_flight",
            (json_int_t)mg_xfer_sched_slices_in_flight(mg_peerdir_sched(transfer_of(gw)->dir))));
    json_object_set_new(obj, "peers", peers ? peers : json_array());
}
