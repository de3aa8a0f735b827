/*
 * svc_notify_expect: receivers' expectations (Notify/Expect) — the front of moongate/expect.h.
 *
 * A client declares that a notification is due on a topic by a deadline, perhaps from a named
 * sender (a peer daemon, or an agent on one). The first notification queued on the topic meets
 * it (svc_notify.c calls mg_notify_expect_heard). Otherwise this daemon posts a failure notice to
 * the topic saying why — deadline passed, sender unreachable, restarted, or its agent gone — so a
 * Watch or Poll of the topic always ends. Senders are probed with Peer/Ping over the core's peer
 * channels (mg_peer_rpc.h, on the entries of mg_gateway_peers) every --peer-liveness-timeout / 4
 * (at most 1 s apart), one probe in flight per sender. One timer wakes the service for the next
 * probe or expectation due. Loop thread only.
 */
#include "svc_notify.h"

#include "mg_peer_rpc.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_time.h"

#include "moongate/v1/peer.pb-c.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_MAX 1000 /* expectations ListExpectations shows */

static void rearm(struct mg_notify_svc *ns)
{
    uint64_t next = mg_expects_next_ms(ns->expects), now = mg_now_mono_ms(), in;
    struct timeval tv;
    if (next == UINT64_MAX) {
        evtimer_del(ns->ex_tick);
        return;
    }
    in = next > now ? next - now : 0;
    tv.tv_sec = (time_t)(in / 1000);
    tv.tv_usec = (suseconds_t)(in % 1000) * 1000;
    evtimer_add(ns->ex_tick, &tv);
}

typedef struct probe_call {
    mg_gateway *gw;
    mg_expect_sender *d;
} probe_call;

static void probe_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    probe_call pc = *(probe_call *)arg;
    struct mg_notify_svc *ns = notify_of(pc.gw);
    Moongate__V1__PeerPing *a = (void *)m;
    free(arg);
    if (ns) { /* else the service is gone, and the sender with it */
        ns->probes += a != NULL;
        if (a == NULL) {
            ns->probes_unanswered++;
            snprintf(pc.d->last_error, sizeof(pc.d->last_error), "%s (%s)",
                     message && *message ? message : "no answer", mg_grpc_code_name(status));
        }
        mg_expect_probed(ns->expects, pc.d, a != NULL, a ? a->epoch : 0, a ? a->agent_present : 0,
                         a ? a->agent_id : 0, mg_now_mono_ms());
        rearm(ns);
    }
    if (a)
        moongate__v1__peer_ping__free_unpacked(a, NULL);
}

/* Asks d's daemon whether it is up, under which epoch, and whether it has d's agent. */
static void probe(void *arg, mg_expect_sender *d)
{
    struct mg_notify_svc *ns = arg;
    mg_peerdir *dir = mg_gateway_peers_closed(ns->gw) ? NULL : mg_gateway_peers(ns->gw);
    Moongate__V1__PeerAgentRequest req = MOONGATE__V1__PEER_AGENT_REQUEST__INIT;
    mg_xfer_peer *p = dir ? mg_peerdir_get(dir, d->peer, d->tenant) : NULL;
    probe_call *pc = p ? calloc(1, sizeof(*pc)) : NULL;
    char err[160];
    req.tenant = d->tenant;
    req.name = d->agent;
    req.port = d->agent_port;
    if (pc) {
        *pc = (probe_call){ns->gw, d};
        if (mg_peer_unary(ns->gw, mg_peer_chan_of(p), p->addr, "/moongate.v1.Peer/Ping", &req.base,
                          &moongate__v1__peer_ping__descriptor, probe_answered, pc, err,
                          sizeof(err)) == 0)
            return;
        free(pc);
    } else {
        snprintf(err, sizeof(err), "%s",
                 dir == NULL ? "this daemon cannot call peers"
                 : p         ? "out of memory"
                             : "this daemon already knows its limit of peers");
    }
    ns->probes_unanswered++;
    snprintf(d->last_error, sizeof(d->last_error), "%s", err);
    mg_expect_probed(ns->expects, d, 0, 0, 0, 0, mg_now_mono_ms());
}

/* Probes due and expectations failed by now; the timer set for what comes next. */
static void run(struct mg_notify_svc *ns)
{
    uint64_t now = mg_now_mono_ms();
    mg_expects_probe_due(ns->expects, now, probe, ns);
    mg_expects_tick(ns->expects, now);
    rearm(ns);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    run(arg);
}

/* An expectation failed: its failure notice goes to its topic, past the queue limits. */
static void expect_failed(void *arg, const mg_expect *e, mg_expect_cause cause, const char *why)
{
    struct mg_notify_svc *ns = arg;
    Moongate__V1__Notification n = MOONGATE__V1__NOTIFICATION__INIT;
    char err[160];
    n.topic = (char *)e->topic;
    n.outcome = (Moongate__V1__Outcome)cause;
    n.code = cause == MG_EXPECT_DEADLINE ? MG_GRPC_DEADLINE_EXCEEDED : MG_GRPC_UNAVAILABLE;
    n.message = (char *)why;
    n.expectation = e->id;
    mg_info("expectation_failed",
            "tenant=%s topic=\"%s\" expectation=%" PRIu64 " cause=%s "
            "reason=\"%s\"",
            e->tenant, e->topic, e->id, mg_expect_cause_name(cause), why);
    if (mg_notify_post(ns, e->tenant, &n, e->sender ? e->sender->peer : "", 1, err, sizeof(err)) !=
        0)
        mg_error("expectation_notice",
                 "tenant=%s topic=\"%s\" expectation=%" PRIu64
                 " reason=\"out of memory: the failure notice was not queued\"",
                 e->tenant, e->topic, e->id);
}

int mg_notify_expect_init(struct mg_notify_svc *ns)
{
    const mg_config *cfg = ns->gw->cfg;
    uint64_t probe_ms = cfg->peer_liveness_timeout / 4;
    if (probe_ms > 1000)
        probe_ms = 1000;
    ns->expects = mg_expects_new(cfg->max_expectations, cfg->peer_liveness_timeout,
                                 probe_ms ? probe_ms : 1, expect_failed, ns);
    ns->ex_tick = evtimer_new(ns->gw->base, tick_cb, ns);
    return ns->expects && ns->ex_tick ? 0 : MG_ERR_NOMEM;
}

void mg_notify_expect_free(struct mg_notify_svc *ns)
{
    if (ns->ex_tick)
        event_free(ns->ex_tick);
    mg_expects_del(ns->expects);
    ns->ex_tick = NULL;
    ns->expects = NULL;
}

int mg_notify_expect_heard(struct mg_notify_svc *ns, const char *tenant, const char *topic)
{
    if (!mg_expect_heard(ns->expects, tenant, topic))
        return 0;
    ns->ex_met++;
    rearm(ns);
    return 1;
}

/* What an Expectation says of e at now_ms; `agent` is its buffer for the agent's name. */
static void expectation_of(const mg_expect *e, uint64_t now_ms, Moongate__V1__Expectation *out,
                           char *agent, size_t cap)
{
    const mg_expect_sender *d = e->sender;
    moongate__v1__expectation__init(out);
    out->id = e->id;
    out->topic = (char *)e->topic;
    out->peer = d ? (char *)d->peer : "";
    agent[0] = '\0';
    if (d && d->agent[0])
        snprintf(agent, cap, "%s", d->agent);
    else if (d && d->agent_port) /* the one-string form: the daemon's host, the agent's port */
        snprintf(agent, cap, "%.*s:%" PRIu32, (int)(strrchr(d->peer, ':') - d->peer), d->peer,
                 d->agent_port);
    out->agent = agent;
    out->epoch = e->epoch;
    out->deadline_left_ms = e->deadline_ms > now_ms ? (uint32_t)(e->deadline_ms - now_ms) : 0;
    out->last_answer_ms = d && d->last_answer_ms ? (uint32_t)(now_ms - d->last_answer_ms) : 0;
    out->lease = e->lease;
    out->segment = e->segment;
}

/* What the caller names as the sender and its target, checked; 0, or the call failed. */
static int spec_of(mg_call *call, const Moongate__V1__ExpectRequest *req, mg_expect_spec *sp,
                   mg_agent_ref *ref)
{
    mg_gateway *gw = mg_call_gateway(call);
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    mg_pool *pool;
    mg_lease *l;
    char why[200];
    *sp = (mg_expect_spec){.tenant = mg_call_tenant(call),
                           .topic = req->topic,
                           .peer = req->peer,
                           .agent = "",
                           .epoch = req->epoch,
                           .lease = req->lease,
                           .segment = req->segment,
                           .timeout_ms = req->timeout_ms};
    if (!mg_notify_topic_ok(req->topic)) {
        mg_call_fail(call, MG_ERR_INVALID, "topic must be 1..128 printable characters");
        return -1;
    }
    if (req->agent[0]) {
        if (mg_agent_ref_parse(req->peer, req->agent, (int)gw->cfg->peer_port, ref, why,
                               sizeof(why)) != 0) {
            mg_call_fail(call, MG_ERR_INVALID, "agent: %s", why);
            return -1;
        }
        sp->peer = ref->peer;
        sp->agent = ref->name;
        sp->agent_port = ref->port;
    }
    if (sp->peer[0] && !mg_is_host_port(sp->peer)) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "peer must be host:port (\"10.0.0.2:7443\", \"node-b.moongate.svc:7443\")");
        return -1;
    }
    if (req->lease && req->segment) {
        mg_call_fail(call, MG_ERR_INVALID, "name one of lease and segment");
        return -1;
    }
    if (req->lease && (gw->pools == NULL ||
                       mg_pools_find(gw->pools, mg_call_scope(call), req->lease, &pool, &l) != 0)) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no lease %" PRIu64, req->lease);
        return -1;
    }
    if (req->segment && (reg == NULL || mg_registry_find(reg, sp->tenant, req->segment, &info))) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no segment %" PRIu64, req->segment);
        return -1;
    }
    if (sp->peer[0] && mg_gateway_peers(gw) == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot call peers to ask the sender");
        return -1;
    }
    return 0;
}

void mg_notify_svc_expect(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ExpectRequest *req = (const void *)m;
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    Moongate__V1__Expectation resp;
    const mg_expect *e;
    mg_expect_spec sp;
    mg_agent_ref ref;
    char why[300], agent[MG_PEER_NAME_MAX + 16];
    int rc;
    if (spec_of(call, req, &sp, &ref) != 0)
        return;
    if (mg_notify_claim(ns, sp.tenant, req->topic)) { /* it came already */
        moongate__v1__expectation__init(&resp);
        resp.topic = req->topic;
        resp.met = 1;
        ns->ex_met++;
        mg_call_reply(call, &resp.base);
        return;
    }
    if ((rc = mg_expect_add(ns->expects, &sp, mg_now_mono_ms(), &e, why, sizeof(why))) != 0) {
        if (rc == MG_ERR_NOMEM)
            mg_call_fail(call, rc, NULL);
        else
            mg_call_fail(call, rc, "%s%s", why, rc == MG_ERR_FULL ? " (--max-expectations)" : "");
        return;
    }
    expectation_of(e, mg_now_mono_ms(), &resp, agent, sizeof(agent));
    mg_info("expectation",
            "tenant=%s topic=\"%s\" expectation=%" PRIu64 " peer=%s agent=%s "
            "timeout_ms=%" PRIu32,
            e->tenant, e->topic, e->id, resp.peer[0] ? resp.peer : "-", agent[0] ? agent : "-",
            req->timeout_ms);
    mg_call_reply(call, &resp.base);
    run(ns); /* its sender's first probe goes now */
}

void mg_notify_svc_unexpect(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__UnexpectRequest *req = (const void *)m;
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    Moongate__V1__UnexpectResponse resp = MOONGATE__V1__UNEXPECT_RESPONSE__INIT;
    if (mg_expect_remove(ns->expects, mg_call_tenant(call), req->id) != 0) {
        mg_call_fail(call, MG_ERR_NOT_FOUND,
                     "no expectation %" PRIu64 " (it ended, or is not "
                     "this tenant's)",
                     req->id);
        return;
    }
    rearm(ns);
    mg_call_reply(call, &resp.base);
}

void mg_notify_svc_list_expectations(mg_call *call, const ProtobufCMessage *m)
{
    struct mg_notify_svc *ns = notify_of(mg_call_gateway(call));
    Moongate__V1__ListExpectationsResponse resp = MOONGATE__V1__LIST_EXPECTATIONS_RESPONSE__INIT;
    size_t cap = mg_expects_count(ns->expects), n = 0;
    uint64_t now = mg_now_mono_ms();
    struct shown {
        Moongate__V1__Expectation x;
        char agent[MG_PEER_NAME_MAX + 16];
    } * v;
    Moongate__V1__Expectation **list;
    (void)m;
    cap = cap < LIST_MAX ? cap : LIST_MAX;
    v = calloc(cap + 1, sizeof(*v));
    list = calloc(cap + 1, sizeof(*list));
    if (v == NULL || list == NULL) {
        free(v);
        free(list);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    for (const mg_expect *e = mg_expects_first(ns->expects); e && n < cap;
         e = mg_expects_next(ns->expects, e)) {
        if (strcmp(e->tenant, mg_call_tenant(call)) != 0)
            continue;
        expectation_of(e, now, &v[n].x, v[n].agent, sizeof(v[n].agent));
        list[n] = &v[n].x;
        n++;
    }
    resp.expectations = list;
    resp.n_expectations = n;
    mg_call_reply(call, &resp.base);
    free(v);
    free(list);
}

void mg_notify_expect_metrics(struct mg_notify_svc *ns, struct evbuffer *out)
{
    static const mg_expect_cause causes[] = {MG_EXPECT_DEADLINE, MG_EXPECT_UNREACHABLE,
                                             MG_EXPECT_RESTARTED, MG_EXPECT_AGENT_GONE};
    uint64_t failed[8];
    mg_expects_failures(ns->expects, failed);
    evbuffer_add_printf(
        out,
        "# HELP moongate_expectations Receivers' expectations waiting (Notify/Expect).\n"
        "# TYPE moongate_expectations gauge\nmoongate_expectations %zu\n"
        "# HELP moongate_expectations_ended_total Expectations ended, by how (met: a "
        "notification came; else the cause of the failure notice posted).\n"
        "# TYPE moongate_expectations_ended_total counter\n"
        "moongate_expectations_ended_total{result=\"met\"} %llu\n",
        mg_expects_count(ns->expects), (unsigned long long)ns->ex_met);
    for (size_t i = 0; i < MG_NELEM(causes); i++)
        evbuffer_add_printf(out, "moongate_expectations_ended_total{result=\"%s\"} %llu\n",
                            mg_expect_cause_name(causes[i]), (unsigned long long)failed[causes[i]]);
    evbuffer_add_printf(out,
                        "# HELP moongate_sender_probes_total Peer/Ping calls to the senders "
                        "expectations name, by result.\n"
                        "# TYPE moongate_sender_probes_total counter\n"
                        "moongate_sender_probes_total{result=\"answered\"} %llu\n"
                        "moongate_sender_probes_total{result=\"unanswered\"} %llu\n",
                        (unsigned long long)ns->probes, (unsigned long long)ns->probes_unanswered);
}
