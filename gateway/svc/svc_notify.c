/*
 * svc_notify: moongate.v1.Notify — the receiving end of transfer notifications.
 *
 * A peer daemon delivers a notification once every request of its batch to this daemon ended
 * (its WRITEs in place here, its READs from here landed there). Notifications go to topics: a topic
 * is a queue of what nobody has taken yet plus the Watch calls reading it. A delivery goes straight
 * to a watcher that can take it (the one waiting longest first), else into the queue; Watch starts
 * by taking the queue, Poll takes from it. Bounded: --notify-queue notifications per topic and
 * --notify-max-bytes queued in all; past either, Deliver answers RESOURCE_EXHAUSTED and the
 * sender's batch says so — nothing is dropped silently. A topic with nothing queued and nobody
 * watching is forgotten.
 *
 * A failure notice (outcome other than LANDED) goes the same way: a peer's batch whose WRITEs
 * here failed delivers one, and this daemon posts one itself when an expectation fails
 * (svc_notify_expect.c); its own pass the limits. Loop thread only.
 */
#include "svc_notify.h"

#include "mg_auth.h"

#include "mg_log.h"
#include "mg_time.h"
#include "mg_trace.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPIC_MAX   128
#define PAYLOAD_MAX 65536
#define POLL_MAX    1000
#define MESSAGE_MAX 1024 /* bytes of a failure notice's message */
#define FAILED_MAX  1024 /* failed requests a notice lists */

typedef struct note {
    Moongate__V1__Notification msg; /* its strings and arrays point into the note's own copies */
    char topic[TOPIC_MAX + 1];
    char from[MG_PEER_NAME_MAX + 1];
    char traceparent[MG_TRACEPARENT_LEN + 1];
    uint8_t *payload;
    char *message;
    uint32_t *failed;
    struct note *next;
} note;

struct topic;

typedef struct watcher {
    mg_parked park; /* in its topic's watchers */
    struct topic *t;
} watcher;

typedef struct topic {
    char tenant[MG_TENANT_MAX + 1]; /* topics are per tenant: another's is another queue */
    char name[TOPIC_MAX + 1];
    note *head, *tail;
    size_t queued;
    size_t unclaimed; /* of them, peers' that met no expectation (at most `queued`) */
    mg_list watchers; /* oldest first */
    struct topic *next;
} topic;

int mg_notify_topic_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TOPIC_MAX)
        return 0;
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return 0;
    }
    return 1;
}

static topic *topic_find(struct mg_notify_svc *ns, const char *tenant, const char *name, int create)
{
    topic *t;
    for (t = ns->topics; t; t = t->next) {
        if (!strcmp(t->name, name) && !strcmp(t->tenant, tenant))
            return t;
    }
    if (!create || (t = calloc(1, sizeof(*t))) == NULL)
        return NULL;
    snprintf(t->tenant, sizeof(t->tenant), "%s", tenant);
    snprintf(t->name, sizeof(t->name), "%s", name);
    mg_list_init(&t->watchers);
    t->next = ns->topics;
    ns->topics = t;
    return t;
}

/* Forgets t when nothing is queued there and nobody watches it. */
static void topic_gc(struct mg_notify_svc *ns, topic *t)
{
    topic **pp;
    if (t->head || !mg_list_empty(&t->watchers))
        return;
    for (pp = &ns->topics; *pp && *pp != t; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = t->next;
    free(t);
}

static void note_free(note *n)
{
    if (n) {
        free(n->payload);
        free(n->message);
        free(n->failed);
        free(n);
    }
}

/* Takes the oldest queued note of t. */
static note *take(struct mg_notify_svc *ns, topic *t)
{
    note *n = t->head;
    if (n == NULL)
        return NULL;
    t->head = n->next;
    if (t->head == NULL)
        t->tail = NULL;
    t->queued--;
    if (t->unclaimed > t->queued)
        t->unclaimed = t->queued;
    ns->queued_bytes -= n->msg.payload.len;
    return n;
}

/* Hands queued notes to t's watchers while they can take them. */
static void feed(struct mg_notify_svc *ns, topic *t)
{
    mg_list_foreach (&t->watchers, node) {
        mg_call *call = mg_container_of(node, watcher, park.node)->park.call;
        while (t->head && mg_call_writable(call)) {
            note *n = take(ns, t);
            mg_call_send(call, &n->msg.base);
            note_free(n);
        }
        if (t->head == NULL)
            break;
    }
}

int mg_notify_claim(struct mg_notify_svc *ns, const char *tenant, const char *name)
{
    topic *t = topic_find(ns, tenant, name, 0);
    if (t == NULL || t->unclaimed == 0)
        return 0;
    t->unclaimed--;
    return 1;
}

int mg_notify_post(struct mg_notify_svc *ns, const char *tenant,
                   const Moongate__V1__Notification *m, const char *from, int own, char *why,
                   size_t cap)
{
    const mg_config *cfg = ns->gw->cfg;
    topic *t = topic_find(ns, tenant, m->topic, 1);
    note *n;
    if (t == NULL)
        return MG_ERR_NOMEM;
    if (!own && (t->queued >= cfg->notify_queue ||
                 ns->queued_bytes + m->payload.len > cfg->notify_max_bytes)) {
        ns->refused_total++;
        snprintf(why, cap,
                 "topic \"%s\" on this daemon holds %zu notifications nobody took (%" PRIu64
                 " bytes queued in all; --notify-queue %llu, --notify-max-bytes %llu)",
                 t->name, t->queued, ns->queued_bytes, (unsigned long long)cfg->notify_queue,
                 (unsigned long long)cfg->notify_max_bytes);
        topic_gc(ns, t);
        return MG_ERR_FULL;
    }
    n = calloc(1, sizeof(*n));
    if (n == NULL || (m->payload.len && (n->payload = malloc(m->payload.len)) == NULL) ||
        (m->message[0] && (n->message = strdup(m->message)) == NULL) ||
        (m->n_failed_requests &&
         (n->failed = malloc(m->n_failed_requests * sizeof(*n->failed))) == NULL)) {
        note_free(n);
        topic_gc(ns, t);
        return MG_ERR_NOMEM;
    }
    n->msg = *m;
    n->msg.tenant = "";
    snprintf(n->topic, sizeof(n->topic), "%s", m->topic);
    snprintf(n->from, sizeof(n->from), "%s", from);
    if (m->payload.len)
        memcpy(n->payload, m->payload.data, m->payload.len);
    if (m->n_failed_requests)
        memcpy(n->failed, m->failed_requests, m->n_failed_requests * sizeof(*n->failed));
    n->msg.topic = n->topic;
    n->msg.from = n->from;
    n->msg.payload.data = n->payload;
    n->msg.message = n->message ? n->message : "";
    snprintf(n->traceparent, sizeof(n->traceparent), "%s",
             strlen(m->traceparent) == MG_TRACEPARENT_LEN ? m->traceparent : "");
    n->msg.traceparent = n->traceparent;
    n->msg.failed_requests = n->failed;
    if (t->tail)
        t->tail->next = n;
    else
        t->head = n;
    t->tail = n;
    t->queued++;
    t->unclaimed += !own;
    ns->queued_bytes += m->payload.len;
    if (m->outcome != MOONGATE__V1__OUTCOME__OUTCOME_LANDED)
        ns->notices_total++;
    feed(ns, t);
    return 0;
}

/* A delivery that carries the sender's trace: the receiving step's span, logged and kept; what
 * readers get carries it on (*tp). */
static void deliver_traced(struct mg_notify_svc *ns, const Moongate__V1__Notification *req,
                           const char *from, char tp[MG_TRACEPARENT_LEN + 1])
{
    char attrs[MG_SPAN_ATTRS_MAX];
    mg_trace_ids h;
    mg_trace t;
    uint64_t now;
    tp[0] = '\0';
    if (mg_trace_start(&t, req->traceparent, strlen(req->traceparent)) != 1)
        return;
    mg_traceparent_format(&t, tp);
    h = mg_trace_ids_of(&t);
    mg_info("notification_received",
            "batch=%016llx from=%s topic=\"%s\" outcome=%d trace=%s span=%s parent=%s",
            (unsigned long long)req->batch_id, from, req->topic, (int)req->outcome, h.trace, h.span,
            h.parent);
    snprintf(attrs, sizeof(attrs), "moongate.from=%.60s moongate.batch=%016llx", from,
             (unsigned long long)req->batch_id);
    now = mg_now_unix_ns(); /* once: two reads in one call's arguments come in either order */
    mg_spans_add(ns->gw->spans, &t, MG_SPAN_CONSUMER, "notify.receive", now, now, attrs);
}

static void deliver_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__Notification *req = (const void *)m;
    Moongate__V1__Notification carried;
    char tp[MG_TRACEPARENT_LEN + 1];
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    Moongate__V1__DeliverResponse resp = MOONGATE__V1__DELIVER_RESPONSE__INIT;
    const char *tenant = req->tenant[0] ? req->tenant : "default";
    char why[512];
    int rc;
    if (!mg_notify_topic_ok(req->topic)) {
        mg_call_fail(call, MG_ERR_INVALID, "a topic is 1..%d printable characters", TOPIC_MAX);
        return;
    }
    if (req->payload.len > PAYLOAD_MAX) {
        mg_call_fail(call, MG_ERR_INVALID, "a payload is at most %d bytes, not %zu", PAYLOAD_MAX,
                     req->payload.len);
        return;
    }
    if (req->tenant[0] && !mg_tenant_ok(req->tenant, strlen(req->tenant))) {
        mg_call_fail(call, MG_ERR_INVALID, "tenant is 1..%d of [A-Za-z0-9._:-]", MG_TENANT_MAX);
        return;
    }
    /* A peer's notice is of its batch: LANDED, FAILED, CANCELLED or TIMED_OUT. */
    if (req->outcome > MOONGATE__V1__OUTCOME__OUTCOME_TIMED_OUT || req->expectation ||
        strlen(req->message) > MESSAGE_MAX || req->n_failed_requests > FAILED_MAX ||
        req->failed_count < req->n_failed_requests || req->code >= MG_GRPC_CODE_COUNT) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "a peer's notice has outcome LANDED, FAILED, CANCELLED or TIMED_OUT, no "
                     "expectation, a message of at most %d bytes, a gRPC code and at most %d "
                     "failed requests (failed_count at least as many)",
                     MESSAGE_MAX, FAILED_MAX);
        return;
    }
    if (req->agent_port > 65535) {
        mg_call_fail(call, MG_ERR_INVALID, "agent_port %u is not 1..65535", req->agent_port);
        return;
    }
    if (req->agent_port &&
        (mg_gateway_agents(ns->gw) == NULL ||
         !mg_agents_by_port(mg_gateway_agents(ns->gw), tenant, req->agent_port))) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no agent at port %u of tenant \"%s\" on this daemon",
                     req->agent_port, tenant);
        return;
    }
    deliver_traced(ns, req, mg_call_peer(call), tp);
    carried = *req;
    carried.traceparent = tp;
    if ((rc = mg_notify_post(ns, tenant, &carried, mg_call_peer(call), 0, why, sizeof(why))) != 0) {
        if (rc == MG_ERR_FULL)
            mg_call_fail(call, rc, "%s", why);
        else
            mg_call_fail(call, rc, NULL);
        return;
    }
    ns->delivered_total++;
    if (mg_notify_expect_heard(ns, tenant, req->topic))
        mg_notify_claim(ns, tenant, req->topic);
    mg_call_reply(call, &resp.base);
}

static void watch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__WatchRequest *req = (const void *)m;
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    watcher *w;
    topic *t;
    if (!mg_notify_topic_ok(req->topic)) {
        mg_call_fail(call, MG_ERR_INVALID, "a topic is 1..%d printable characters", TOPIC_MAX);
        return;
    }
    w = calloc(1, sizeof(*w));
    t = w ? topic_find(ns, mg_call_tenant(call), req->topic, 1) : NULL;
    if (t == NULL) {
        free(w);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    w->t = t;
    mg_call_park(call, &w->park, &t->watchers); /* newest last: the longest waiting fed first */
    feed(ns, t);
}

/* The watcher's call goes (finished with grpc_code >= 0 first, if asked); its topic too when
 * it was the last reason to keep it. */
static void watcher_drop(struct mg_notify_svc *ns, watcher *w, int grpc_code, const char *message)
{
    topic *t = w->t;
    mg_call_unpark(&w->park, grpc_code, message);
    free(w);
    if (ns)
        topic_gc(ns, t);
}

static void watch_cancel(mg_call *call)
{
    watcher *w = mg_call_data(call);
    if (w)
        watcher_drop(notify_of(mg_call_gateway(call)), w, -1, NULL);
}

static void watch_writable(mg_call *call)
{
    watcher *w = mg_call_data(call);
    if (w)
        feed(notify_of(mg_call_gateway(call)), w->t);
}

static void poll_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__PollRequest *req = (const void *)m;
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    Moongate__V1__PollResponse resp = MOONGATE__V1__POLL_RESPONSE__INIT;
    size_t max = req->max ? req->max : 100, n = 0;
    uint64_t bytes = 0, cap = mg_call_gateway(call)->cfg->max_message_bytes / 2;
    Moongate__V1__Notification **msgs;
    note **got;
    topic *t;
    if (!mg_notify_topic_ok(req->topic)) {
        mg_call_fail(call, MG_ERR_INVALID, "a topic is 1..%d printable characters", TOPIC_MAX);
        return;
    }
    if (max > POLL_MAX)
        max = POLL_MAX;
    t = topic_find(ns, mg_call_tenant(call), req->topic, 0);
    got = calloc(max, sizeof(*got));
    msgs = calloc(max, sizeof(*msgs));
    if (got == NULL || msgs == NULL) {
        free(got);
        free(msgs);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    /* The answer stays well inside --max-message-bytes: the rest waits for the next Poll. */
    while (t && n < max && t->head && (n == 0 || bytes + t->head->msg.payload.len < cap)) {
        bytes += t->head->msg.payload.len + TOPIC_MAX + 64;
        got[n] = take(ns, t);
        msgs[n] = &got[n]->msg;
        n++;
    }
    resp.notifications = msgs;
    resp.n_notifications = n;
    mg_call_reply(call, &resp.base);
    for (size_t i = 0; i < n; i++)
        note_free(got[i]);
    free(got);
    free(msgs);
    if (t)
        topic_gc(ns, t);
}

/* Queued notifications and watchers, for /metrics. */
static void mg_svc_notify_get_stats(mg_gateway *gw, uint64_t *queued, uint64_t *queued_bytes,
                                    uint64_t *delivered, uint64_t *refused)
{
    struct mg_notify_svc *ns = notify_of(gw);
    *queued = *queued_bytes = *delivered = *refused = 0;
    if (ns == NULL)
        return;
    for (topic *t = ns->topics; t; t = t->next)
        *queued += t->queued;
    *queued_bytes = ns->queued_bytes;
    *delivered = ns->delivered_total;
    *refused = ns->refused_total;
}

static const mg_method notify_methods[] = {
    MG_PEER_UNARY("/moongate.v1.Notify/Deliver", &moongate__v1__notification__descriptor,
                  &moongate__v1__deliver_response__descriptor, deliver_message),
    MG_UNARY("/moongate.v1.Notify/Poll", &moongate__v1__poll_request__descriptor,
             &moongate__v1__poll_response__descriptor, poll_message),
    {.path = "/moongate.v1.Notify/Watch",
     .kind = MG_RPC_SERVER_STREAM,
     .in = &moongate__v1__watch_request__descriptor,
     .out = &moongate__v1__notification__descriptor,
     .on_message = watch_message,
     .on_cancel = watch_cancel,
     .on_writable = watch_writable},
    MG_UNARY("/moongate.v1.Notify/Expect", &moongate__v1__expect_request__descriptor,
             &moongate__v1__expectation__descriptor, mg_notify_svc_expect),
    MG_UNARY("/moongate.v1.Notify/Unexpect", &moongate__v1__unexpect_request__descriptor,
             &moongate__v1__unexpect_response__descriptor, mg_notify_svc_unexpect),
    MG_UNARY("/moongate.v1.Notify/ListExpectations",
             &moongate__v1__list_expectations_request__descriptor,
             &moongate__v1__list_expectations_response__descriptor,
             mg_notify_svc_list_expectations),
};

/* Drain: Watch calls end (UNAVAILABLE) so their connections can close; queued notes stay
 * for Poll until the daemon exits. */
static void mg_svc_notify_drain(mg_gateway *gw)
{
    struct mg_notify_svc *ns = notify_of(gw);
    for (topic *t = ns ? ns->topics : NULL, *next; t; t = next) {
        next = t->next;
        while (!mg_list_empty(&t->watchers))
            watcher_drop(NULL, mg_container_of(mg_list_first(&t->watchers), watcher, park.node),
                         MG_GRPC_UNAVAILABLE, "the daemon is draining");
        topic_gc(ns, t);
    }
}

static const mg_route notify_routes[] = {
    {"GET", "/v1/notifications", 0, "/moongate.v1.Notify/Poll"},
    {"POST", "/v1/expectations", 0, "/moongate.v1.Notify/Expect"},
    {"GET", "/v1/expectations", 0, "/moongate.v1.Notify/ListExpectations"},
    {"DELETE", "/v1/expectations", 1, "/moongate.v1.Notify/Unexpect"},
};

static int mg_svc_notify_init(mg_gateway *gw)
{
    int rc = mg_gateway_add_methods(gw, notify_methods, MG_NELEM(notify_methods), notify_routes,
                                    MG_NELEM(notify_routes));
    if (rc != 0)
        return rc;
    *mg_gateway_state(gw, &mg_svc_notify) = calloc(1, sizeof(*notify_of(gw)));
    if (notify_of(gw) == NULL)
        return MG_ERR_NOMEM;
    notify_of(gw)->gw = gw;
    return mg_notify_expect_init(notify_of(gw));
}

static void mg_svc_notify_free(mg_gateway *gw)
{
    struct mg_notify_svc *ns = notify_of(gw);
    if (ns == NULL)
        return;
    mg_notify_expect_free(ns);
    while (ns->topics) {
        topic *t = ns->topics;
        ns->topics = t->next;
        while (t->head)
            note_free(take(ns, t));
        while (!mg_list_empty(&t->watchers))
            watcher_drop(NULL, mg_container_of(mg_list_first(&t->watchers), watcher, park.node), -1,
                         NULL);
        free(t);
    }
    free(ns);
    *mg_gateway_state(gw, &mg_svc_notify) = NULL;
}

/* /metrics: notifications peers delivered here. */
static void notify_metrics(mg_gateway *gw, struct evbuffer *out)
{
    uint64_t queued, queued_bytes, received, refused;
    mg_svc_notify_get_stats(gw, &queued, &queued_bytes, &received, &refused);
    evbuffer_add_printf(
        out,
        "# HELP moongate_notifications_received_total Notifications peers delivered here, "
        "by result (refused: the topic or all topics were full).\n"
        "# TYPE moongate_notifications_received_total counter\n"
        "moongate_notifications_received_total{result=\"queued\"} %llu\n"
        "moongate_notifications_received_total{result=\"refused\"} %llu\n"
        "# HELP moongate_notifications_queued Notifications waiting for a reader.\n"
        "# TYPE moongate_notifications_queued gauge\nmoongate_notifications_queued %llu\n"
        "# HELP moongate_notifications_queued_bytes Their payload bytes.\n"
        "# TYPE moongate_notifications_queued_bytes gauge\n"
        "moongate_notifications_queued_bytes %llu\n",
        (unsigned long long)received, (unsigned long long)refused, (unsigned long long)queued,
        (unsigned long long)queued_bytes);
    if (notify_of(gw) == NULL)
        return;
    evbuffer_add_printf(out,
                        "# HELP moongate_notification_notices_total Failure notices queued here "
                        "(a peer's batch that did not land, or an expectation that failed).\n"
                        "# TYPE moongate_notification_notices_total counter\n"
                        "moongate_notification_notices_total %llu\n",
                        (unsigned long long)notify_of(gw)->notices_total);
    mg_notify_expect_metrics(notify_of(gw), out);
}

const mg_service mg_svc_notify = {.name = "notify",
                                  .init = mg_svc_notify_init,
                                  .drain = mg_svc_notify_drain,
                                  .metrics = notify_metrics,
                                  .free = mg_svc_notify_free};
