/* mg_notelines: notifications to peers, in order per (connection, peer, topic)
 * (moongate/notelines.h). */
#include "moongate/notelines.h"

#include "mg_grpc.h"
#include "mg_log.h"
#include "mg_time.h"
#include "moongate/mg_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct note_line {
    mg_notelines *nl;
    uint64_t conn;
    mg_xfer_peer *p;
    char topic[MG_BATCH_TOPIC_MAX + 1];
    mg_list items; /* mg_note_item.node, in order */
    size_t sends;  /* Sends and notices in it */
    int pumping;
    struct note_line *next;
} note_line;

struct mg_note_item {
    mg_list_node node;
    note_line *line;
    mg_batch_note *n; /* a batch's; NULL for a Send or a notice */
    int due;
    int sending;
    void *owner; /* a Send: its caller (the front's), and payload */
    uint8_t *payload;
    size_t len;
    char *refused;       /* a refused Submit's notice (neither n nor owner): why (malloc'd) */
    int code;            /* and its gRPC status */
    mg_trace t;          /* its span: a child of its batch's, or a Send's own */
    int traced;          /* logged: its batch's caller, or the Send's, sent a traceparent */
    uint64_t t0_ns;      /* when it went (the span's start) */
    uint32_t agent_port; /* a Send to an agent: its port on the peer */
};

struct mg_notelines {
    mg_notelines_config cfg;
    note_line *lines;
    mg_notelines_stats stats;
};

int mg_notelines_new(mg_notelines **out, const mg_notelines_config *cfg)
{
    mg_notelines *nl;
    *out = NULL;
    if (cfg->dir == NULL || cfg->deliver == NULL || cfg->send_over == NULL || cfg->line_max == 0)
        return MG_ERR_INVALID;
    if ((nl = calloc(1, sizeof(*nl))) == NULL)
        return MG_ERR_NOMEM;
    nl->cfg = *cfg;
    *out = nl;
    return 0;
}

static int closed(const mg_notelines *nl)
{
    return mg_peerdir_closed(nl->cfg.dir);
}

mg_notelines_stats mg_notelines_stats_of(const mg_notelines *nl)
{
    return nl->stats;
}

const char *mg_note_bad(const char *topic, size_t payload_len)
{
    size_t tl = strlen(topic);
    if (tl == 0 || tl > MG_BATCH_TOPIC_MAX)
        return "topic must be 1..128 printable characters";
    for (size_t k = 0; k < tl; k++) {
        if ((unsigned char)topic[k] < 0x20 || (unsigned char)topic[k] > 0x7e)
            return "topic must be 1..128 printable characters";
    }
    return payload_len > MG_NOTE_PAYLOAD_MAX ? "payload is over 65536 bytes" : NULL;
}

/* The line of (conn, p, topic), made when new; NULL when out of memory. */
static note_line *line_get(mg_notelines *nl, uint64_t conn, mg_xfer_peer *p, const char *topic)
{
    note_line *l;
    for (l = nl->lines; l; l = l->next) {
        if (l->conn == conn && l->p == p && !strcmp(l->topic, topic))
            return l;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL)
        return NULL;
    l->nl = nl;
    l->conn = conn;
    l->p = p;
    snprintf(l->topic, sizeof(l->topic), "%s", topic);
    mg_list_init(&l->items);
    l->next = nl->lines;
    nl->lines = l;
    return l;
}

static void line_free(note_line *l)
{
    note_line **pp;
    for (pp = &l->nl->lines; *pp && *pp != l; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = l->next;
    free(l);
}

/* Takes the item out of its line and frees it; a Send's owner hears code (-1: not sent). */
static void item_free(mg_note_item *it, int code, const char *why)
{
    mg_notelines *nl = it->line->nl;
    if (mg_list_linked(&it->node))
        mg_list_remove(&it->node);
    if (it->n)
        it->n->front = NULL;
    else
        it->line->sends--;
    if (it->owner)
        nl->cfg.send_over(nl->cfg.arg, it->owner, code, why);
    free(it->payload);
    free(it->refused);
    free(it);
}

static void pump(note_line *l);

/* An item was sent (code 0) or failed: its batch or its caller hears, the next may go. */
static void item_over(mg_note_item *it, int code, const char *why)
{
    note_line *l = it->line;
    if (code == 0)
        l->nl->stats.sent++;
    else
        l->nl->stats.failed++;
    if (it->n) {
        mg_batch_note *n = it->n;
        item_free(it, 0, NULL);
        mg_batch_note_end(n, code ? MG_NOTE_FAILED : MG_NOTE_SENT, code, why);
    } else {
        item_free(it, code, why);
    }
    pump(l);
}

/* The item's Deliver was answered: its span is kept (when sampled). */
static void traced_end(const mg_note_item *it, int status)
{
    char attrs[MG_SPAN_ATTRS_MAX];
    if (it->line->nl->cfg.spans == NULL)
        return;
    snprintf(attrs, sizeof(attrs), "moongate.peer=%.60s moongate.batch=%016llx moongate.status=%d",
             it->line->p->addr, (unsigned long long)(it->n ? it->n->b->id : 0), status);
    mg_spans_add(it->line->nl->cfg.spans, &it->t, MG_SPAN_PRODUCER, "notify.send", it->t0_ns,
                 mg_now_unix_ns(), attrs);
}

void mg_notelines_delivered(mg_note_item *it, int status, int answered, const char *message)
{
    mg_batch_note *n = it->n;
    const char *addr = it->line->p->addr;
    char why[400];
    if (closed(it->line->nl))
        return; /* what waits goes with mg_notelines_del */
    traced_end(it, status);
    if (n && n->g.failed_req) { /* it was the failure notice */
        if (status)
            snprintf(
                why, sizeof(why), "not sent: request %zu to this peer failed; %s %.80s%s: %.120s",
                n->g.failed_req - 1, answered ? "peer" : "the failure notice did not reach peer",
                addr, answered ? " refused the failure notice" : "", message);
        else
            snprintf(why, sizeof(why),
                     "not sent: request %zu to this peer failed; the peer's topic got a failure "
                     "notice",
                     n->g.failed_req - 1);
        item_over(it, MG_GRPC_FAILED_PRECONDITION, why);
        return;
    }
    snprintf(why, sizeof(why), "peer %.80s%s: %.200s", addr, answered ? " refused it" : "",
             message);
    item_over(it, status, status ? why : NULL);
}

/* What the failure notice of n says: the outcome, code and message of the first WRITE to its
 * peer that failed, and the indexes of those that failed (into failed[MG_NOTE_FAILED_MAX]). */
static void notice_of(const mg_batch_note *n, mg_note_msg *m, uint32_t *failed, char *msg,
                      size_t cap)
{
    const mg_batch *b = n->b;
    const mg_batch_req *first = &b->reqs[n->g.failed_req - 1];
    m->outcome = first->err == MG_ERR_CANCELLED ? MG_OUTCOME_CANCELLED
                 : first->err == MG_ERR_TIMEOUT ? MG_OUTCOME_TIMED_OUT
                                                : MG_OUTCOME_FAILED;
    m->code = mg_err_grpc(first->err);
    snprintf(msg, cap, "request %zu: %s", n->g.failed_req - 1,
             first->msg ? first->msg : mg_strerror(first->err));
    m->message = msg;
    m->failed = failed;
    for (size_t i = 0; i < b->n; i++) {
        const mg_batch_req *r = &b->reqs[i];
        if (r->write && r->peer == n->peer && r->life.state == MG_REQ_FAILED) {
            if (m->nfailed < MG_NOTE_FAILED_MAX)
                failed[m->nfailed++] = (uint32_t)i;
            m->failed_count++;
        }
    }
}

/* Sends the item at the head of its line (or fails it, saying why). */
static void fire(mg_note_item *it)
{
    mg_notelines *nl = it->line->nl;
    mg_note_msg m = {.peer = it->line->p, .topic = it->line->topic};
    uint32_t *failed = NULL;
    char err[256], why[300], msg[1024];
    int rc;
    if (it->n && it->n->g.failed_req) {
        if ((failed = malloc(MG_NOTE_FAILED_MAX * sizeof(*failed))) == NULL) {
            item_over(it, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        notice_of(it->n, &m, failed, msg, sizeof(msg));
    } else if (it->refused) {
        m.outcome = MG_OUTCOME_FAILED;
        m.code = it->code;
        m.message = it->refused;
    }
    m.payload = it->n ? it->n->payload : it->payload;
    m.len = it->n ? it->n->len : it->len;
    m.batch_id = it->n ? it->n->b->id : 0;
    m.agent_port = it->agent_port;
    if (it->n && mg_trace_child(&it->t, &it->n->b->trace) == 0)
        it->traced = it->n->b->traced;
    it->t0_ns = mg_now_unix_ns();
    m.trace = &it->t;
    if (it->traced) {
        mg_trace_ids ids = mg_trace_ids_of(&it->t);
        mg_info("notification_sent",
                "batch=%016llx peer=%s topic=\"%s\" outcome=%d trace=%s span=%s parent=%s",
                (unsigned long long)m.batch_id, m.peer->addr, m.topic, (int)m.outcome, ids.trace,
                ids.span, ids.parent);
    }
    it->sending = 1;
    if (it->n)
        it->n->g.state = MG_NOTE_SENDING;
    rc = nl->cfg.deliver(nl->cfg.arg, it, &m, err, sizeof(err));
    free(failed); /* the front encoded the message by now */
    if (rc != 0) {
        snprintf(why, sizeof(why), "peer %.80s: %.200s", m.peer->addr, err);
        item_over(it, MG_GRPC_UNAVAILABLE, why);
    }
}

/* Starts the head of the line when it is due and none is on its way; an empty line goes. */
static void pump(note_line *l)
{
    mg_notelines *nl = l->nl;
    if (l->pumping)
        return; /* an item over while firing: the loop below goes on */
    l->pumping = 1;
    while (!mg_list_empty(&l->items)) {
        mg_note_item *it = mg_container_of(mg_list_first(&l->items), mg_note_item, node);
        if (!it->due || it->sending)
            break;
        if (it->owner && nl->cfg.send_gone && nl->cfg.send_gone(nl->cfg.arg, it->owner)) {
            item_free(it, -1, NULL); /* its caller left: not sent */
            continue;
        }
        fire(it);
    }
    l->pumping = 0;
    if (mg_list_empty(&l->items))
        line_free(l);
}

void mg_notelines_enter(mg_notelines *nl, mg_batch *b)
{
    for (size_t i = 0; i < b->nnotes; i++) {
        mg_batch_note *n = &b->notes[i];
        mg_note_item *it = calloc(1, sizeof(*it));
        note_line *l = it ? line_get(nl, b->conn, n->peer, n->topic) : NULL;
        if (l == NULL) { /* out of memory: it fails when due */
            free(it);
            continue;
        }
        it->line = l;
        it->n = n;
        n->front = it;
        mg_list_push_back(&l->items, &it->node);
    }
}

void mg_notelines_due(mg_notelines *nl, mg_batch_note *n)
{
    mg_note_item *it = n->front;
    if (closed(nl)) {
        mg_batch_note_end(n, MG_NOTE_FAILED, MG_GRPC_UNAVAILABLE,
                          "not sent: the daemon is stopping");
        return;
    }
    if (it == NULL) { /* it found no place in line */
        nl->stats.failed++;
        mg_batch_note_end(n, MG_NOTE_FAILED, MG_GRPC_RESOURCE_EXHAUSTED, "not sent: out of memory");
        return;
    }
    it->due = 1;
    pump(it->line);
}

/* A due item of its own payload (a Send or a notice) at the end of l, or NULL (out of memory). */
static mg_note_item *item_add(note_line *l, const uint8_t *payload, size_t len,
                              const char *traceparent)
{
    mg_note_item *it = calloc(1, sizeof(*it));
    if (it == NULL || (it->payload = malloc(len + 1)) == NULL) {
        free(it);
        return NULL;
    }
    if (len) /* an empty payload has no data pointer */
        memcpy(it->payload, payload, len);
    it->len = len;
    it->line = l;
    it->due = 1;
    /* Logged only when it continues the caller's trace; else an all-zero span, not kept. */
    it->traced = mg_trace_start(&it->t, traceparent, strlen(traceparent)) == 1;
    l->sends++;
    mg_list_push_back(&l->items, &it->node);
    return it;
}

int mg_notelines_send(mg_notelines *nl, uint64_t conn, mg_xfer_peer *p, const char *topic,
                      const uint8_t *payload, size_t len, uint32_t agent_port,
                      const char *traceparent, void *owner, char *why, size_t cap)
{
    note_line *l = line_get(nl, conn, p, topic);
    mg_note_item *it;
    if (l && l->sends >= nl->cfg.line_max) {
        snprintf(why, cap,
                 "%zu Sends of this connection wait in line for peer %s, topic \"%s\" "
                 "(--notify-line)",
                 l->sends, p->addr, topic);
        return MG_ERR_FULL;
    }
    if (l == NULL || (it = item_add(l, payload, len, traceparent)) == NULL) {
        if (l && mg_list_empty(&l->items))
            line_free(l);
        snprintf(why, cap, "out of memory");
        return MG_ERR_NOMEM;
    }
    it->agent_port = agent_port;
    it->owner = owner;
    pump(l);
    return 0;
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

void mg_notelines_refused(mg_notelines *nl, const mg_batch *b, const char *traceparent, int code,
                          const char *why)
{
    if (!refused_for_good(code) || closed(nl))
        return;
    for (size_t i = 0; i < b->nnotes; i++) {
        const mg_batch_note *n = &b->notes[i];
        note_line *l = n->peer ? line_get(nl, b->conn, n->peer, n->topic) : NULL;
        mg_note_item *it = NULL;
        size_t cap = 1024; /* a peer takes a notice's message of at most 1024 bytes */
        char *text = l && l->sends < nl->cfg.line_max ? malloc(cap) : NULL;
        if (text && (it = item_add(l, n->payload, n->len, traceparent)) != NULL) {
            snprintf(text, cap, "the sender's Submit was refused; nothing was moved: %.900s", why);
            it->refused = text;
            it->code = code;
            pump(l);
            continue;
        }
        free(text); /* out of memory, or the line is full (--notify-line): not sent */
        nl->stats.failed++;
        mg_warn("notification_not_sent",
                "peer=%s topic=\"%s\" why=\"a refused Submit's notice: %s\"",
                n->peer ? n->peer->addr : "?", n->topic,
                l && l->sends >= nl->cfg.line_max ? "--notify-line reached" : "out of memory");
        if (l && mg_list_empty(&l->items))
            line_free(l);
    }
}

void mg_notelines_del(mg_notelines *nl)
{
    if (nl == NULL)
        return;
    while (nl->lines) {
        note_line *l = nl->lines;
        while (!mg_list_empty(&l->items))
            item_free(mg_container_of(mg_list_first(&l->items), mg_note_item, node), -1, NULL);
        line_free(l);
    }
    free(nl);
}
