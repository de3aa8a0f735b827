/*
 * svc_notify.h: what the notify service's two files share. svc_notify.c takes deliveries and
 * the clients reading topics (Deliver, Watch, Poll); svc_notify_expect.c the expectations of
 * receiving clients (Expect, Unexpect, ListExpectations) and the probes of their senders.
 */
#ifndef SVC_NOTIFY_H
#define SVC_NOTIFY_H

#include "mg_gateway.h"
#include "mg_service.h"
#include "moongate/expect.h"

#include "moongate/v1/notify.pb-c.h"

struct event;
struct topic;

struct mg_notify_svc {
    mg_gateway *gw;
    struct topic *topics;
    uint64_t queued_bytes;
    uint64_t delivered_total, refused_total, notices_total;
    mg_expects *expects;                        /* receivers' expectations (moongate/expect.h) */
    struct event *ex_tick;                      /* the next probe or expectation due */
    uint64_t ex_met, probes, probes_unanswered; /* probes: answered */
};

extern const mg_service mg_svc_notify;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static inline struct mg_notify_svc *notify_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_notify);
}

/* ---- svc_notify.c ---- */

/* Queues m on its topic of `tenant` for the topic's readers; `from` is the sender as this
 * daemon names it. A notice this daemon posts itself (own) passes the queue limits: a failure
 * notice for an expectation is never refused. Returns 0, or MG_ERR_FULL (why set) or
 * MG_ERR_NOMEM. */
int mg_notify_post(struct mg_notify_svc *ns, const char *tenant,
                   const Moongate__V1__Notification *m, const char *from, int own, char *why,
                   size_t cap);

/* Non-zero when s is a topic: 1..128 printable characters. */
int mg_notify_topic_ok(const char *s);

/* Claims a notification queued on the tenant's topic that no expectation claimed yet (it met
an Expect declared after it). Returns 1 when there was one, else 0. */
int mg_notify_claim(struct mg_notify_svc *ns, const char *tenant, const char *name);

/* ---- svc_notify_expect.c ---- */

/* Starts the expectations (the service's init). Returns 0 or MG_ERR_NOMEM. */
int mg_notify_expect_init(struct mg_notify_svc *ns);
/* A notification was queued on the tenant's topic: it meets the oldest expectation there.
 * Returns 1 when it met one. */
int mg_notify_expect_heard(struct mg_notify_svc *ns, const char *tenant, const char *topic);
/* The handlers of Expect, Unexpect and ListExpectations. */
void mg_notify_svc_expect(mg_call *call, const ProtobufCMessage *m);
void mg_notify_svc_unexpect(mg_call *call, const ProtobufCMessage *m);
void mg_notify_svc_list_expectations(mg_call *call, const ProtobufCMessage *m);
/* /metrics lines of the expectations. */
void mg_notify_expect_metrics(struct mg_notify_svc *ns, struct evbuffer *out);
/* Frees them (the service's free; no notice is posted). */
void mg_notify_expect_free(struct mg_notify_svc *ns);

#endif
