/*
 * svc_transfer_notes: the notifications this daemon sends peers — those of batches, due once
 * the batch's WRITEs to that peer are in place, and those clients Send on their own.
 *
 * They keep their order per (connection, peer, topic): each waits in its line (note_line) until
 * every one before it was sent or failed, and goes when it is due as well. A batch's note takes
 * its place when the batch is entered and is due when the engine says so (note_due); a Send is
 * due at once. One Deliver call per line is in flight at a time, so the peer queues them in
 * line order. A Send whose call ended before its turn is dropped (not sent).
 *
 * A batch's note whose WRITEs to its peer did not all land goes as a failure notice instead:
 * the outcome (FAILED, CANCELLED or TIMED_OUT, from the first WRITE that failed), its code and
 * message, and which WRITEs failed. The batch still shows the note FAILED (the notification
 * proper was not sent), saying whether the notice reached the peer.
 *
 * A Submit refused for good (mg_xfer_notes_refused: a request that can never run as asked) has
 * no batch, but its notifications' peers still hear: a failure notice with batch id 0 goes in
 * each notification's place, saying why nothing was moved. Loop thread only.
 */
#include "svc_transfer.h"

#include "mg_peer_rpc.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_time.h"
#include "mg_trace.h"

#include "moongate/v1/notify.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAYLOAD_MAX 65536
#define FAILED_MAX  1024 /* failed requests a failure notice lists */

typedef struct note_line {
    uint64_t conn;
    mg_xfer_peer *p;
    char topic[MG_BATCH_TOPIC_MAX + 1];
    mg_list items; /* note_item.node, in order */
    size_t sends;  /* Sends in it */
    int pumping;
    struct note_line *next;
} note_line;

typedef struct note_item {
    mg_list_node node;
    note_line *line;
    mg_batch_note *n; /* a batch's; NULL for a Send */
    int due;
    int sending;
    mg_call *call; /* a Send: its call (referenced) and payload */
    uint8_t *payload;
    size_t len;
    char *refused;       /* a refused Submit's notice (neither n nor call): why (malloc'd) */
    int code;            /* and its gRPC status */
    mg_trace t;          /* its span: a child of its batch's, or a Send's own */
    int traced;          /* logged: its batch's caller, or the Send's, sent a traceparent */
    uint64_t t0_ns;      /* when it went (the span's start) */
    uint32_t agent_port; /* a Send to an agent: its port on the peer, which checks it is there */
} note_item;

const char *mg_xfer_note_bad(const char *topic, size_t payload_len)
{
    size_t tl = strlen(topic);
    if (tl == 0 || tl > MG_BATCH_TOPIC_MAX)
        return "topic must be 1..128 printable characters";
    for (size_t k = 0; k < tl; k++) {
        if ((unsigned char)topic[k] < 0x20 || (unsigned char)topic[k] > 0x7e)
            return "topic must be 1..128 printable characters";
    }
    return payload_len > PAYLOAD_MAX ? "payload is over 65536 bytes" : NULL;
}

/* The line of (conn, p, topic), made when new; NULL when out of memory. */
static note_line *line_get(struct mg_transfer_svc *ts, uint64_t conn, mg_xfer_peer *p,
                           const char *topic)
{
    note_line *l;
    for (l = ts->lines; l; l = l->next) {
        if (l->conn == conn && l->p == p && !strcmp(l->topic, topic))
            return l;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL)
        return NULL;
    l->conn = conn;
    l->p = p;
    snprintf(l->topic, sizeof(l->topic), "%s", topic);
    mg_list_init(&l->items);
    l->next = ts->lines;
    ts->lines = l;
    return l;
}

static void line_free(struct mg_transfer_svc *ts, note_line *l)
{
    note_line **pp;
    for (pp = &ts->lines; *pp && *pp != l; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = l->next;
    free(l);
}

static void item_free(note_item *it)
{
    if (mg_list_linked(&it->node))
        mg_list_remove(&it->node);
    if (it->n)
        it->n->front = NULL;
    else
        it->line->sends--;
    if (it->call)
        mg_call_unref(it->call);
    free(it->payload);
    free(it->refused);
    free(it);
}

static void pump(struct mg_transfer_svc *ts, note_line *l);

/* An item was sent (code 0) or failed: its batch or its caller hears, the next may go. */
static void item_over(struct mg_transfer_svc *ts, note_item *it, int code, const char *why)
{
    note_line *l = it->line;
    if (code == 0)
        ts->stats.notes_sent++;
    else
        ts->stats.notes_failed++;
    if (it->n) {
        mg_batch_note *n = it->n;
        item_free(it);
        mg_batch_note_end(n, code ? MG_NOTE_FAILED : MG_NOTE_SENT, code, why);
    } else {
        Moongate__V1__SendResponse resp = MOONGATE__V1__SEND_RESPONSE__INIT;
        if (it->call == NULL || mg_call_done(it->call)) /* a refused Submit's, or gone */
            ;
        else if (code)
            mg_call_finish(it->call, code, "%s", why);
        else
            mg_call_reply(it->call, &resp.base);
        item_free(it);
    }
    pump(ts, l);
}

typedef struct {
    struct mg_transfer_svc *ts;
    note_item *it;
} deliver_call;

/* The item's Deliver was answered: its span is kept (when sampled). */
static void note_traced_end(struct mg_transfer_svc *ts, const note_item *it, int status)
{
    char attrs[MG_SPAN_ATTRS_MAX];
    snprintf(attrs, sizeof(attrs), "moongate.peer=%.60s moongate.batch=%016llx moongate.status=%d",
             it->line->p->addr, (unsigned long long)(it->n ? it->n->b->id : 0), status);
    mg_spans_add(ts->gw->spans, &it->t, MG_SPAN_PRODUCER, "notify.send", it->t0_ns,
                 mg_now_unix_ns(), attrs);
}

static void deliver_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    deliver_call dc = *(deliver_call *)arg;
    mg_batch_note *n = dc.it->n;
    const char *addr = dc.it->line->p->addr;
    /* The peer answered this status (its trailers say so), or this daemon came to it on its
     * own (the name did not resolve, the connection or its TLS failed, no answer in time). */
    int answered = rpc && mg_rpc_header(rpc, "grpc-status") != NULL;
    char why[400];
    free(arg);
    if (transfer_closing(dc.ts))
        return; /* the lines went with the service */
    note_traced_end(dc.ts, dc.it, status);
    if (n && n->g.failed_write) { /* it was the failure notice */
        if (status)
            snprintf(
                why, sizeof(why), "not sent: request %zu to this peer failed; %s %.80s%s: %.120s",
                n->g.failed_write - 1, answered ? "peer" : "the failure notice did not reach peer",
                addr, answered ? " refused the failure notice" : "", message);
        else
            snprintf(why, sizeof(why),
                     "not sent: request %zu to this peer failed; the peer's topic got a failure "
                     "notice",
                     n->g.failed_write - 1);
        item_over(dc.ts, dc.it, MG_GRPC_FAILED_PRECONDITION, why);
        return;
    }
    snprintf(why, sizeof(why), "peer %.80s%s: %.200s", addr, answered ? " refused it" : "",
             message);
    item_over(dc.ts, dc.it, status, status ? why : NULL);
}

/* What the failure notice of n says: the outcome, code and message of the first WRITE to its
 * peer that failed, and the indexes of those that failed (into failed[FAILED_MAX]). */
static void notice_of(const mg_batch_note *n, Moongate__V1__Notification *req, uint32_t *failed,
                      char *msg, size_t cap)
{
    const mg_batch *b = n->b;
    const mg_batch_req *first = &b->reqs[n->g.failed_write - 1];
    req->outcome = first->err == MG_ERR_CANCELLED ? MOONGATE__V1__OUTCOME__OUTCOME_CANCELLED
                   : first->err == MG_ERR_TIMEOUT ? MOONGATE__V1__OUTCOME__OUTCOME_TIMED_OUT
                                                  : MOONGATE__V1__OUTCOME__OUTCOME_FAILED;
    req->code = (uint32_t)mg_err_grpc(first->err);
    snprintf(msg, cap, "request %zu: %s", n->g.failed_write - 1,
             first->msg ? first->msg : mg_strerror(first->err));
    req->message = msg;
    req->failed_requests = failed;
    for (size_t i = 0; i < b->n; i++) {
        const mg_batch_req *r = &b->reqs[i];
        if (r->write && r->peer == n->peer && r->life.state == MG_REQ_FAILED) {
            if (req->n_failed_requests < FAILED_MAX)
                failed[req->n_failed_requests++] = (uint32_t)i;
            req->failed_count++;
        }
    }
}

/* Sends the item at the head of its line (or fails it, saying why). */
static void fire(struct mg_transfer_svc *ts, note_item *it)
{
    static const mg_rpc_handlers h = {NULL, deliver_closed};
    Moongate__V1__Notification req = MOONGATE__V1__NOTIFICATION__INIT;
    mg_xfer_peer *p = it->line->p;
    deliver_call *dc;
    uint32_t *failed = NULL;
    char err[256], why[300], msg[1024], tp[MG_TRACEPARENT_LEN + 1];
    int rc;
    if (it->n && it->n->g.failed_write) {
        if ((failed = malloc(FAILED_MAX * sizeof(*failed))) == NULL) {
            item_over(ts, it, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        notice_of(it->n, &req, failed, msg, sizeof(msg));
    } else if (it->refused) {
        req.outcome = MOONGATE__V1__OUTCOME__OUTCOME_FAILED;
        req.code = (uint32_t)it->code;
        req.message = it->refused;
    }
    if ((dc = calloc(1, sizeof(*dc))) == NULL) {
        free(failed);
        item_over(ts, it, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *dc = (deliver_call){ts, it};
    req.topic = it->line->topic;
    req.payload.data = it->n ? it->n->payload : it->payload;
    req.payload.len = it->n ? it->n->len : it->len;
    req.batch_id = it->n ? it->n->b->id : 0;
    req.tenant = p->tenant; /* the topic is the sender tenant's on the peer */
    req.agent_port = it->agent_port;
    if (it->n && mg_trace_child(&it->t, &it->n->b->trace) == 0)
        it->traced = it->n->b->traced;
    it->t0_ns = mg_now_unix_ns();
    mg_traceparent_format(&it->t, tp);
    req.traceparent = tp;
    if (it->traced) {
        mg_trace_ids ids = mg_trace_ids_of(&it->t);
        mg_info("notification_sent",
                "batch=%016llx peer=%s topic=\"%s\" outcome=%d trace=%s span=%s parent=%s",
                (unsigned long long)req.batch_id, p->addr, req.topic, (int)req.outcome, ids.trace,
                ids.span, ids.parent);
    }
    it->sending = 1;
    if (it->n)
        it->n->g.state = MG_NOTE_SENDING;
    rc = mg_peer_call(ts->gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Notify/Deliver", &req.base,
                      &h, dc, err, sizeof(err));
    free(failed); /* the request is encoded by now */
    if (rc != 0) {
        free(dc);
        snprintf(why, sizeof(why), "peer %.80s: %.200s", p->addr, err);
        item_over(ts, it, MG_GRPC_UNAVAILABLE, why);
    }
}

/* Starts the head of the line when it is due and none is on its way; an empty line goes. */
static void pump(struct mg_transfer_svc *ts, note_line *l)
{
    if (l->pumping)
        return; /* an item over while firing: the loop below goes on */
    l->pumping = 1;
    while (!mg_list_empty(&l->items)) {
        note_item *it = mg_container_of(mg_list_first(&l->items), note_item, node);
        if (!it->due || it->sending)
            break;
        if (it->call && mg_call_done(it->call)) { /* its caller left: not sent */
            item_free(it);
            continue;
        }
        fire(ts, it);
    }
    l->pumping = 0;
    if (mg_list_empty(&l->items))
        line_free(ts, l);
}

void mg_xfer_notes_enter(mg_batch *b)
{
    struct mg_transfer_svc *ts = svc_of(b);
    for (size_t i = 0; i < b->nnotes; i++) {
        mg_batch_note *n = &b->notes[i];
        note_item *it = calloc(1, sizeof(*it));
        note_line *l = it ? line_get(ts, b->conn, n->peer, n->topic) : NULL;
        if (l == NULL) { /* out of memory: it goes when due, out of line */
            free(it);
            continue;
        }
        it->line = l;
        it->n = n;
        n->front = it;
        mg_list_push_back(&l->items, &it->node);
    }
}

void mg_xfer_note_due(void *arg, mg_batch_note *n)
{
    struct mg_transfer_svc *ts = arg;
    note_item *it = n->front;
    if (transfer_closing(ts)) {
        mg_batch_note_end(n, MG_NOTE_FAILED, MG_GRPC_UNAVAILABLE,
                          "not sent: the daemon is stopping");
        return;
    }
    if (it == NULL) { /* it found no place in line */
        ts->stats.notes_failed++;
        mg_batch_note_end(n, MG_NOTE_FAILED, MG_GRPC_RESOURCE_EXHAUSTED, "not sent: out of memory");
        return;
    }
    it->due = 1;
    pump(ts, it->line);
}

void mg_xfer_svc_send(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__SendRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_transfer_svc *ts = transfer_of(gw);
    const char *bad = mg_xfer_note_bad(req->topic, req->payload.len), *peer = req->peer;
    mg_agent_ref ref;
    mg_xfer_peer *p;
    note_line *l;
    note_item *it;
    char why[300];
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
    p = mg_peerdir_get(ts->dir, peer, mg_call_tenant(call));
    l = p ? line_get(ts, mg_call_conn_id(call), p, req->topic) : NULL;
    if (l && l->sends >= gw->cfg->notify_line) {
        mg_call_fail(call, MG_ERR_FULL,
                     "%zu Sends of this connection wait in line for peer %s, topic \"%s\" "
                     "(--notify-line)",
                     l->sends, peer, req->topic);
        return;
    }
    it = l ? calloc(1, sizeof(*it)) : NULL;
    if (it == NULL || (it->payload = malloc(req->payload.len + 1)) == NULL) {
        free(it);
        if (l && mg_list_empty(&l->items))
            line_free(ts, l);
        mg_call_fail(call, p ? MG_ERR_NOMEM : MG_ERR_FULL,
                     p ? NULL : "this daemon already knows its limit of peers");
        return;
    }
    if (req->payload.len) /* an empty payload has no data pointer */
        memcpy(it->payload, req->payload.data, req->payload.len);
    it->len = req->payload.len;
    it->line = l;
    it->due = 1;
    it->agent_port = ref.port;
    /* Logged only when it continues the caller's trace, as a batch's; no random bytes: an
     * all-zero span, not logged either. */
    it->traced =
        mg_trace_start(&it->t, mg_call_traceparent(call), strlen(mg_call_traceparent(call))) == 1;
    it->call = call;
    mg_call_ref(call);
    l->sends++;
    mg_list_push_back(&l->items, &it->node);
    pump(ts, l);
}

/* Whether a Submit refused with gRPC status `code` is refused for good: what it asks can never
 * run as asked (a bad request, a target that is not there, no permission). Refusals a caller
 * may retry (limits, quotas, memory, a peer not answering, "ask again") are not: the batch may
 * yet come, and the receivers' expectations bound their wait meanwhile. */
static int refused_for_good(int code)
{
    return code == MG_GRPC_INVALID_ARGUMENT || code == MG_GRPC_NOT_FOUND ||
           code == MG_GRPC_PERMISSION_DENIED || code == MG_GRPC_OUT_OF_RANGE ||
           code == MG_GRPC_UNIMPLEMENTED;
}

void mg_xfer_notes_refused(mg_batch *b, const char *traceparent, int code, const char *why)
{
    struct mg_transfer_svc *ts = svc_of(b);
    if (!refused_for_good(code) || transfer_closing(ts))
        return;
    for (size_t i = 0; i < b->nnotes; i++) {
        const mg_batch_note *n = &b->notes[i];
        note_line *l = n->peer ? line_get(ts, b->conn, n->peer, n->topic) : NULL;
        note_item *it = NULL;
        size_t cap = 1024; /* a peer takes a notice's message of at most 1024 bytes */
        if (l && l->sends < ts->gw->cfg->notify_line && (it = calloc(1, sizeof(*it))) &&
            (it->payload = malloc(n->len + 1)) && (it->refused = malloc(cap))) {
            if (n->len)
                memcpy(it->payload, n->payload, n->len);
            it->len = n->len;
            snprintf(it->refused, cap, "the sender's Submit was refused; nothing was moved: %.900s",
                     why);
            it->code = code;
            it->line = l;
            it->due = 1;
            it->traced = mg_trace_start(&it->t, traceparent, strlen(traceparent)) == 1;
            l->sends++;
            mg_list_push_back(&l->items, &it->node);
            pump(ts, l);
            continue;
        }
        if (it) /* out of memory, or the line is full (--notify-line): not sent */
            free(it->payload);
        free(it);
        ts->stats.notes_failed++;
        mg_warn("notification_not_sent",
                "peer=%s topic=\"%s\" why=\"a refused Submit's notice: %s\"",
                n->peer ? n->peer->addr : "?", n->topic,
                l ? "out of memory or --notify-line reached" : "out of memory");
        if (l && mg_list_empty(&l->items))
            line_free(ts, l);
    }
}

void mg_xfer_notes_free(struct mg_transfer_svc *ts)
{
    while (ts->lines) {
        note_line *l = ts->lines;
        while (!mg_list_empty(&l->items))
            item_free(mg_container_of(mg_list_first(&l->items), note_item, node));
        line_free(ts, l);
    }
}
