/* mg_batches: the transfer batches a daemon holds (moongate/batches.h). */
#include "mg_batches_int.h"

#include "mg_log.h"
#include "mg_time.h"
#include "moongate/peerdir.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const transport_names[] = {"", "tcp", "rdma", "copy", "process_vm", "staged"};

const char *mg_batch_transport_name(mg_batch_transport t)
{
    return (unsigned)t < sizeof(transport_names) / sizeof(transport_names[0]) ? transport_names[t]
                                                                              : "";
}

static const char *const tag_names[MG_TAG_COUNT] = {"", "staged", "rdma-dmabuf"};

const char *mg_batch_tag_name(mg_batch_tag t)
{
    return (unsigned)t < MG_TAG_COUNT ? tag_names[t] : "";
}

int mg_batch_tag_parse(const char *name)
{
    for (int t = 0; t < MG_TAG_COUNT; t++)
        if (strcmp(name, tag_names[t]) == 0)
            return t;
    return -1;
}

int mg_batches_new(mg_batches **out, const mg_batches_config *cfg)
{
    mg_batches *s;
    size_t nb = 64;
    *out = NULL;
    if (cfg->max_batches == 0 || cfg->request_ended == NULL || cfg->note_due == NULL ||
        cfg->changed == NULL || cfg->freed == NULL)
        return MG_ERR_INVALID;
    while (nb < cfg->max_batches && nb < (1u << 16))
        nb <<= 1;
    s = calloc(1, sizeof(*s));
    if (s == NULL || mg_idmap_init(&s->ids, nb) != 0) {
        if (s)
            mg_idmap_free(&s->ids);
        free(s);
        return MG_ERR_NOMEM;
    }
    s->cfg = *cfg;
    if (s->cfg.now_ms == NULL)
        s->cfg.now_ms = mg_now_mono_ms;
    mg_list_init(&s->batches);
    *out = s;
    return 0;
}

static mg_batch *batch_of(const mg_list_node *n)
{
    return mg_container_of(n, mg_batch, link);
}

/* Lets go of the request's local memory: the segment references, and the leases' use. */
static void req_release_local(mg_batch_req *r)
{
    const mg_batches_config *cfg = &r->b->set->cfg;
    if (r->local)
        mg_registry_put(cfg->reg, r->local);
    if (r->local_lease)
        mg_pools_unuse(cfg->pools, r->local_lease);
    if (r->other)
        mg_registry_put(cfg->reg, r->other);
    if (r->other_lease)
        mg_pools_unuse(cfg->pools, r->other_lease);
    r->local = r->other = NULL;
    r->local_lease = r->other_lease = NULL;
}

static void batch_free(mg_batch *b)
{
    mg_batch_pay_holds(b); /* a batch refused while filled: then each request lets go of its own */
    if (b->front)
        b->set->cfg.freed(b->set->cfg.arg, b);
    for (size_t i = 0; i < b->nnotes; i++)
        free(b->notes[i].payload);
    for (size_t i = 0; b->reqs && i < b->n; i++) {
        req_release_local(&b->reqs[i]);
        mg_xfer_req_free(&b->reqs[i].x);
        free(b->reqs[i].msg);
    }
    for (size_t i = 0; b->recs && i < b->n; i++)
        free(b->recs[i].msg);
    for (size_t i = 0; i < b->nagents; i++)
        free(b->agents[i]);
    free(b->agents);
    free(b->notes);
    free(b->reqs);
    free(b->recs);
    free(b);
}

/* Takes b out of the set and frees it. */
static void batch_forget(mg_batches *s, mg_batch *b)
{
    mg_idmap_remove(&s->ids, &b->node);
    mg_list_remove(&b->link);
    s->n--;
    batch_free(b);
}

void mg_batches_del(mg_batches *s)
{
    if (s == NULL)
        return;
    while (!mg_list_empty(&s->batches))
        batch_forget(s, batch_of(mg_list_first(&s->batches)));
    mg_idmap_free(&s->ids);
    free(s);
}

mg_batch *mg_batch_new(mg_batches *s, const char *tenant, size_t n, size_t nnotes)
{
    mg_batch *b = calloc(1, sizeof(*b));
    if (b == NULL || (b->reqs = calloc(n ? n : 1, sizeof(*b->reqs))) == NULL ||
        (b->notes = calloc(nnotes + 1, sizeof(*b->notes))) == NULL) {
        if (b)
            free(b->reqs);
        free(b);
        return NULL;
    }
    b->set = s;
    b->id = b->node.id = mg_idmap_mint(&s->ids);
    snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
    b->n = b->counts.n = n;
    b->nnotes = b->counts.notes = nnotes;
    for (size_t i = 0; i < n; i++)
        b->reqs[i].b = b;
    for (size_t i = 0; i < nnotes; i++)
        b->notes[i].b = b;
    return b;
}

void mg_batch_discard(mg_batch *b)
{
    batch_free(b);
}

/* The oldest over batches go while more than `keep` are held; running ones always stay. */
static void forget_oldest(mg_batches *s, size_t keep)
{
    mg_list_node *n = s->batches.prev; /* the oldest */
    while (s->n > keep && n != &s->batches) {
        mg_list_node *newer = n->prev;
        if (mg_batch_is_over(batch_of(n)))
            batch_forget(s, batch_of(n));
        n = newer;
    }
}

void mg_batches_add(mg_batches *s, mg_batch *b, uint64_t now_ns)
{
    b->t0_ns = now_ns;
    mg_idmap_insert(&s->ids, &b->node);
    mg_list_push_front(&s->batches, &b->link);
    s->n++;
    forget_oldest(s, s->cfg.max_batches);
}

void mg_batch_notes_start(mg_batch *b)
{
    for (size_t i = 0; i < b->nnotes; i++) {
        if (b->notes[i].g.state == MG_NOTE_WAITING && b->notes[i].g.reqs_left == 0)
            b->set->cfg.note_due(b->set->cfg.arg, &b->notes[i]);
    }
}

mg_batch *mg_batches_find(const mg_batches *s, uint64_t id)
{
    mg_idmap_node *n = mg_idmap_find(&s->ids, id);
    return n ? mg_container_of(n, mg_batch, node) : NULL;
}

mg_batch *mg_batches_find_request(const mg_batches *s, const char *tenant, const char *request_id)
{
    if (request_id[0] == '\0')
        return NULL;
    mg_list_foreach (&s->batches, n) {
        mg_batch *b = batch_of(n);
        if (!strcmp(b->request_id, request_id) && !strcmp(b->tenant, tenant))
            return b;
    }
    return NULL;
}

size_t mg_batches_running(const mg_batches *s, const char *tenant)
{
    size_t running = 0;
    mg_list_foreach (&s->batches, n) {
        const mg_batch *b = batch_of(n);
        running += !mg_batch_is_over(b) && (tenant == NULL || !strcmp(b->tenant, tenant));
    }
    return running;
}

size_t mg_batches_count(const mg_batches *s)
{
    return s->n;
}

void *mg_batches_arg(const mg_batches *s)
{
    return s->cfg.arg;
}

mg_batch *mg_batches_first(const mg_batches *s)
{
    mg_list_node *n = mg_list_first(&s->batches);
    return n ? batch_of(n) : NULL;
}

mg_batch *mg_batches_next(const mg_batches *s, const mg_batch *b)
{
    return b->link.next != &s->batches ? batch_of(b->link.next) : NULL;
}

void mg_batches_expire(mg_batches *s, uint64_t now_ms)
{
    mg_list_foreach_safe (&s->batches, n, next) {
        mg_batch *b = batch_of(n);
        if (b->end_ms && b->end_ms + s->cfg.retention_ms <= now_ms)
            batch_forget(s, b);
    }
}

void mg_batches_stop_running(mg_batches *s, int err)
{
    mg_list_foreach (&s->batches, n) {
        mg_batch *b = batch_of(n);
        for (size_t i = 0; b->reqs && i < b->n; i++) {
            if (b->reqs[i].life.state == MG_REQ_RUNNING)
                mg_xfer_req_stop(&b->reqs[i].x, err);
        }
    }
}

int mg_batch_is_over(const mg_batch *b)
{
    return mg_batch_over(&b->counts);
}

/* The ids of r's step of its batch's trace: r's span, the batch's as its parent. */
static mg_trace req_trace(const mg_batch_req *r)
{
    mg_trace t = r->b->trace;
    memcpy(t.span_id, r->span, sizeof(t.span_id));
    memcpy(t.parent_id, r->b->trace.span_id, sizeof(t.parent_id));
    return t;
}

int mg_batch_trace(mg_batch *b, const char *traceparent)
{
    int rc = mg_trace_start(&b->trace, traceparent, strlen(traceparent));
    mg_trace_ids h;
    b->t0_unix_ns = mg_now_unix_ns();
    if (rc < 0)
        return -1;
    b->traced = rc == 1;
    if (b->traced) {
        h = mg_trace_ids_of(&b->trace);
        mg_info("transfer_submitted",
                "batch=%016" PRIx64 " requests=%zu tenant=%s trace=%s span=%s parent=%s "
                "sampled=%d",
                b->id, b->n, b->tenant, h.trace, h.span, h.parent, mg_trace_sampled(&b->trace));
    }
    return 0;
}

void mg_batch_req_started(mg_batch_req *r)
{
    mg_batch *b = r->b;
    mg_trace child;
    mg_trace_ids h;
    if (!mg_trace_sampled(&b->trace) || mg_trace_child(&child, &b->trace) != 0)
        return;
    memcpy(r->span, child.span_id, sizeof(r->span));
    r->t0_unix_ns = mg_now_unix_ns();
    h = mg_trace_ids_of(&child);
    mg_info("transfer_request_start",
            "batch=%016" PRIx64 " request=%zu op=%s peer=%s bytes=%" PRIu64
            " trace=%s span=%s parent=%s",
            b->id, (size_t)(r - b->reqs), r->write ? "write" : "read", r->peer ? r->peer->addr : "",
            r->length, h.trace, h.span, h.parent);
}

/* A request of a sampled trace ended: its end logged, its span kept. */
static void req_traced_end(mg_batch_req *r)
{
    mg_batch *b = r->b;
    mg_trace t = req_trace(r);
    char attrs[MG_SPAN_ATTRS_MAX];
    mg_trace_ids h;
    if (!mg_trace_sampled(&b->trace) || r->t0_unix_ns == 0)
        return; /* not sampled, or it ended before it started (cancelled, refused) */
    h = mg_trace_ids_of(&t);
    mg_info("transfer_request_end",
            "batch=%016" PRIx64 " request=%zu state=%s error=%s trace=%s span=%s parent=%s", b->id,
            (size_t)(r - b->reqs), r->err ? "failed" : "done", r->err ? mg_strerror(r->err) : "-",
            h.trace, h.span, h.parent);
    snprintf(attrs, sizeof(attrs),
             "moongate.batch=%016" PRIx64 " moongate.request=%zu "
             "moongate.op=%s moongate.state=%s",
             b->id, (size_t)(r - b->reqs), r->write ? "write" : "read", r->err ? "failed" : "done");
    mg_spans_add(b->set->cfg.spans, &t, MG_SPAN_INTERNAL, "transfer.request", r->t0_unix_ns,
                 mg_now_unix_ns(), attrs);
}

/* The batch moved: it is over when its last request and notification ended. */
static void batch_changed(mg_batch *b)
{
    if (mg_batch_is_over(b) && b->end_ms == 0) {
        char attrs[MG_SPAN_ATTRS_MAX];
        snprintf(attrs, sizeof(attrs),
                 "moongate.batch=%016" PRIx64 " moongate.requests=%zu moongate.failed=%zu", b->id,
                 b->n, b->counts.failed);
        mg_spans_add(b->set->cfg.spans, &b->trace, MG_SPAN_SERVER, "transfer.batch", b->t0_unix_ns,
                     mg_now_unix_ns(), attrs);
        b->end_ms = b->set->cfg.now_ms();
    }
    b->set->cfg.changed(b->set->cfg.arg, b);
}

void mg_batch_req_say(mg_batch_req *r, const char *text)
{
    char *copy = text && *text ? strdup(text) : NULL; /* text may be the old message */
    free(r->msg);
    r->msg = copy;
}

/* A request of the batch ended: the notifications for its peer may be due now. */
static void notes_req_ended(mg_batch_req *r, int err)
{
    mg_batch *b = r->b;
    for (size_t i = 0; i < b->nnotes; i++) {
        mg_batch_note *n = &b->notes[i];
        if (n->peer == r->peer && mg_note_req_ended(&n->g, (size_t)(r - b->reqs), err != 0))
            b->set->cfg.note_due(b->set->cfg.arg, n);
    }
}

int mg_batch_req_end(mg_batch_req *r, int err, const char *msg)
{
    mg_batch *b = r->b;
    if (mg_req_end(&r->life, &b->counts, err != 0) != 0) {
        /* Never expected: counting it would end the batch before its requests. */
        mg_error("transfer_state",
                 "batch=%016" PRIx64 " request=%zu state=%d error=\"%s\" "
                 "reason=\"ended twice, or succeeded without running\"",
                 b->id, (size_t)(r - b->reqs), (int)r->life.state, mg_strerror(err));
        return -1;
    }
    r->err = err;
    mg_batch_req_say(r, msg);
    req_traced_end(r);
    req_release_local(r);
    b->set->cfg.request_ended(b->set->cfg.arg, r);
    notes_req_ended(r, err);
    batch_changed(b);
    return 0;
}

int mg_batch_req_unqueue(mg_batch_req *r)
{
    if (mg_xfer_sched_remove(&r->x))
        return 1;
    if (!mg_list_linked(&r->wait))
        return 0;
    mg_list_remove(&r->wait);
    return 1;
}

void mg_batch_note_end(mg_batch_note *n, mg_note_state state, int code, const char *msg)
{
    n->g.state = state;
    n->code = code;
    snprintf(n->msg, sizeof(n->msg), "%s", msg ? msg : "");
    mg_batch_note_over(&n->b->counts, state == MG_NOTE_FAILED);
    batch_changed(n->b);
}

void mg_batch_stop(mg_batch *b, int err, const char *why)
{
    for (size_t i = 0; b->reqs && i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        if (r->life.state == MG_REQ_PENDING && mg_batch_req_unqueue(r))
            mg_batch_req_end(r, err, why);
        else if (r->life.state == MG_REQ_RUNNING || r->life.state == MG_REQ_PENDING)
            mg_xfer_req_stop(&r->x, err); /* running, or between lines: it ends when it looks */
    }
}

mg_batch_rec mg_batch_record(const mg_batch *b, size_t i)
{
    const mg_batch_req *r;
    mg_batch_rec rec;
    if (b->reqs == NULL)
        return b->recs[i];
    r = &b->reqs[i];
    rec.bytes = r->life.state == MG_REQ_DONE ? r->length : mg_xfer_req_progress(&r->x);
    rec.msg = r->msg;
    rec.err = r->err;
    rec.state = (uint8_t)r->life.state;
    rec.transport = r->x.unmapped && mg_segment_procmem(r->x.unmapped) ? MG_TR_PROCESS_VM
                    : r->x.unmapped                                    ? MG_TR_STAGED
                    : r->local_copy                                    ? MG_TR_COPY
                    : r->rdma                                          ? MG_TR_RDMA
                    : r->life.state != MG_REQ_PENDING                  ? MG_TR_TCP
                                                                       : MG_TR_NONE;
    return rec;
}

void mg_batch_compact(mg_batch *b)
{
    mg_batch_rec *recs;
    if (b->reqs == NULL || !mg_batch_is_over(b) || (recs = calloc(b->n, sizeof(*recs))) == NULL)
        return;
    for (size_t i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        recs[i] = mg_batch_record(b, i);
        r->msg = NULL; /* the record has it now */
        mg_xfer_req_free(&r->x);
    }
    free(b->reqs);
    b->reqs = NULL;
    b->recs = recs;
}
