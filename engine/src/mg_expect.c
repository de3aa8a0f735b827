/*
 * mg_expect: receivers' expectations and the probes of their senders (moongate/expect.h).
 */
#include "moongate/expect.h"

#include "moongate/mg_error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_expects {
    mg_list all;     /* mg_expect.link, oldest first */
    mg_list senders; /* mg_expect_sender.link */
    size_t n, max;
    uint64_t next_id;
    uint64_t liveness_ms, probe_ms;
    mg_expect_failed_fn failed;
    void *arg;
    uint64_t failures[8];
};

static mg_expect *expect_of(mg_list_node *n)
{
    return mg_container_of(n, mg_expect, link);
}

const char *mg_expect_cause_name(mg_expect_cause c)
{
    switch (c) {
    case MG_EXPECT_DEADLINE:
        return "deadline";
    case MG_EXPECT_UNREACHABLE:
        return "sender_unreachable";
    case MG_EXPECT_RESTARTED:
        return "sender_restarted";
    case MG_EXPECT_AGENT_GONE:
        return "sender_agent_gone";
    }
    return "unknown";
}

mg_expects *mg_expects_new(size_t max, uint64_t liveness_ms, uint64_t probe_ms,
                           mg_expect_failed_fn failed, void *arg)
{
    mg_expects *s;
    if (max == 0 || liveness_ms == 0 || probe_ms == 0 || failed == NULL ||
        (s = calloc(1, sizeof(*s))) == NULL)
        return NULL;
    mg_list_init(&s->all);
    mg_list_init(&s->senders);
    s->max = max;
    s->liveness_ms = liveness_ms;
    s->probe_ms = probe_ms;
    s->failed = failed;
    s->arg = arg;
    s->next_id = 1;
    return s;
}

static void sender_unref(mg_expect_sender *d)
{
    if (--d->refs == 0 && !d->probing) {
        mg_list_remove(&d->link);
        free(d);
    }
}

static void expect_free(mg_expects *s, mg_expect *e)
{
    mg_list_remove(&e->link);
    s->n--;
    if (e->sender)
        sender_unref(e->sender);
    free(e);
}

void mg_expects_del(mg_expects *s)
{
    if (s == NULL)
        return;
    while (!mg_list_empty(&s->all))
        expect_free(s, expect_of(mg_list_first(&s->all)));
    while (!mg_list_empty(&s->senders)) { /* left probing: their answers were dropped */
        mg_list_node *n = mg_list_first(&s->senders);
        mg_list_remove(n);
        free(mg_container_of(n, mg_expect_sender, link));
    }
    free(s);
}

/* The entry of (tenant, peer, agent), made when new with a probe due at once. */
static mg_expect_sender *sender_get(mg_expects *s, const mg_expect_spec *sp, uint64_t now_ms)
{
    mg_expect_sender *d;
    mg_list_foreach (&s->senders, n) {
        d = mg_container_of(n, mg_expect_sender, link);
        if (!strcmp(d->tenant, sp->tenant) && !strcmp(d->peer, sp->peer) &&
            !strcmp(d->agent, sp->agent) && d->agent_port == sp->agent_port) {
            if (!d->probing)
                d->next_probe_ms = now_ms; /* the new expectation's baseline, soon */
            d->refs++;
            return d;
        }
    }
    if ((d = calloc(1, sizeof(*d))) == NULL)
        return NULL;
    snprintf(d->tenant, sizeof(d->tenant), "%s", sp->tenant);
    snprintf(d->peer, sizeof(d->peer), "%s", sp->peer);
    snprintf(d->agent, sizeof(d->agent), "%s", sp->agent);
    d->agent_port = sp->agent_port;
    d->next_probe_ms = now_ms;
    d->refs = 1;
    mg_list_push_back(&s->senders, &d->link);
    return d;
}

int mg_expect_add(mg_expects *s, const mg_expect_spec *sp, uint64_t now_ms, const mg_expect **out,
                  char *why, size_t cap)
{
    mg_expect *e;
    size_t tl = strlen(sp->topic);
    if (tl == 0 || tl > MG_EXPECT_TOPIC_MAX || strlen(sp->tenant) > MG_SEG_NAME_MAX ||
        strlen(sp->peer) > MG_PEER_NAME_MAX || strlen(sp->agent) > MG_AGENT_NAME_MAX) {
        snprintf(why, cap, "a topic is 1..%d characters; a peer, agent or tenant too long",
                 MG_EXPECT_TOPIC_MAX);
        return MG_ERR_INVALID;
    }
    if (sp->timeout_ms == 0 || sp->timeout_ms > MG_EXPECT_TIMEOUT_MAX) {
        snprintf(why, cap, "timeout_ms must be 1..%d, not %" PRIu32, MG_EXPECT_TIMEOUT_MAX,
                 sp->timeout_ms);
        return MG_ERR_INVALID;
    }
    if (sp->peer[0] == '\0' && (sp->agent[0] || sp->agent_port || sp->epoch)) {
        snprintf(why, cap, "an agent or epoch needs the sender's daemon");
        return MG_ERR_INVALID;
    }
    if (s->n >= s->max) {
        snprintf(why, cap, "%zu expectations are waiting on this daemon already", s->n);
        return MG_ERR_FULL;
    }
    if ((e = calloc(1, sizeof(*e))) == NULL)
        return MG_ERR_NOMEM;
    if (sp->peer[0] && (e->sender = sender_get(s, sp, now_ms)) == NULL) {
        free(e);
        return MG_ERR_NOMEM;
    }
    e->id = s->next_id++;
    snprintf(e->tenant, sizeof(e->tenant), "%s", sp->tenant);
    snprintf(e->topic, sizeof(e->topic), "%s", sp->topic);
    e->epoch = sp->epoch;
    e->lease = sp->lease;
    e->segment = sp->segment;
    e->t0_ms = now_ms;
    e->deadline_ms = now_ms + sp->timeout_ms;
    mg_list_push_back(&s->all, &e->link);
    s->n++;
    *out = e;
    return 0;
}

int mg_expect_remove(mg_expects *s, const char *tenant, uint64_t id)
{
    mg_list_foreach (&s->all, n) {
        mg_expect *e = expect_of(n);
        if (e->id == id && !strcmp(e->tenant, tenant)) {
            expect_free(s, e);
            return 0;
        }
    }
    return MG_ERR_NOT_FOUND;
}

int mg_expect_heard(mg_expects *s, const char *tenant, const char *topic)
{
    mg_list_foreach (&s->all, n) {
        mg_expect *e = expect_of(n);
        if (!strcmp(e->topic, topic) && !strcmp(e->tenant, tenant)) {
            expect_free(s, e);
            return 1;
        }
    }
    return 0;
}

static void fail(mg_expects *s, mg_expect *e, mg_expect_cause cause, const char *why)
{
    s->failures[cause]++;
    s->failed(s->arg, e, cause, why);
    expect_free(s, e);
}

void mg_expects_probe_due(mg_expects *s, uint64_t now_ms,
                          void (*probe)(void *arg, mg_expect_sender *sender), void *parg)
{
    mg_list_foreach (&s->senders, n) {
        mg_expect_sender *d = mg_container_of(n, mg_expect_sender, link);
        if (!d->probing && d->refs && d->next_probe_ms <= now_ms) {
            d->probing = 1;
            d->probe_sent_ms = now_ms;
            probe(parg, d);
        }
    }
}

/* What the answer means for e, or 0 when it holds. */
static mg_expect_cause answer_breaks(mg_expect *e, const mg_expect_sender *d, uint64_t epoch,
                                     int agent_present, uint64_t agent_id, char *why, size_t cap)
{
    if (e->epoch && e->epoch != epoch) {
        snprintf(why, cap,
                 "the sender's daemon %s restarted: it answers under epoch %016" PRIx64
                 ", not %016" PRIx64,
                 d->peer, epoch, e->epoch);
        return MG_EXPECT_RESTARTED;
    }
    if (d->agent[0] == '\0' && d->agent_port == 0)
        return 0;
    if (!agent_present || (e->agent_id && e->agent_id != agent_id)) {
        char name[MG_AGENT_NAME_MAX + 32];
        if (d->agent[0])
            snprintf(name, sizeof(name), "agent \"%s\"", d->agent);
        else
            snprintf(name, sizeof(name), "the agent at port %" PRIu32, d->agent_port);
        snprintf(why, cap, "the sender's %s is gone from its daemon %s%s", name, d->peer,
                 agent_present ? " (another took its place)" : "");
        return MG_EXPECT_AGENT_GONE;
    }
    return 0;
}

void mg_expect_probed(mg_expects *s, mg_expect_sender *d, int answered, uint64_t epoch,
                      int agent_present, uint64_t agent_id, uint64_t now_ms)
{
    char why[512];
    d->probing = 0;
    d->next_probe_ms = d->probe_sent_ms + s->probe_ms;
    if (d->refs == 0) {
        d->refs = 1;
        sender_unref(d);
        return;
    }
    if (!answered)
        return; /* the tick says when it has been too long */
    d->last_error[0] = '\0';
    d->last_answer_ms = now_ms;
    d->refs++; /* held while its expectations may go */
    mg_list_foreach_safe (&s->all, n, next) {
        mg_expect *e = expect_of(n);
        mg_expect_cause cause;
        if (e->sender != d)
            continue;
        if (e->t0_ms <= d->probe_sent_ms) { /* asked after it was declared: its baseline */
            if (e->epoch == 0)
                e->epoch = epoch;
            if (e->agent_id == 0 && agent_present)
                e->agent_id = agent_id;
        }
        if ((cause = answer_breaks(e, d, epoch, agent_present, agent_id, why, sizeof(why))) != 0)
            fail(s, e, cause, why);
    }
    sender_unref(d);
}

/* When e's sender has been silent too long (UINT64_MAX: none named). */
static uint64_t silent_at(const mg_expects *s, const mg_expect *e)
{
    uint64_t from;
    if (e->sender == NULL)
        return UINT64_MAX;
    from = e->sender->last_answer_ms > e->t0_ms ? e->sender->last_answer_ms : e->t0_ms;
    return from + s->liveness_ms;
}

void mg_expects_tick(mg_expects *s, uint64_t now_ms)
{
    char why[768];
    mg_list_foreach_safe (&s->all, n, next) {
        mg_expect *e = expect_of(n);
        if (e->deadline_ms <= now_ms) {
            snprintf(why, sizeof(why), "no notification on topic \"%s\" within %" PRIu64 " ms",
                     e->topic, e->deadline_ms - e->t0_ms);
            fail(s, e, MG_EXPECT_DEADLINE, why);
        } else if (silent_at(s, e) <= now_ms) {
            const mg_expect_sender *d = e->sender;
            snprintf(why, sizeof(why),
                     "the sender's daemon %s did not answer for %" PRIu64
                     " ms (--peer-liveness-timeout)%s%s",
                     d->peer, s->liveness_ms, d->last_error[0] ? "; last probe: " : "",
                     d->last_error);
            fail(s, e, MG_EXPECT_UNREACHABLE, why);
        }
    }
}

uint64_t mg_expects_next_ms(const mg_expects *s)
{
    uint64_t next = UINT64_MAX;
    mg_list_foreach (&s->all, n) {
        const mg_expect *e = expect_of(n);
        uint64_t at = silent_at(s, e);
        if (e->deadline_ms < next)
            next = e->deadline_ms;
        if (at < next)
            next = at;
    }
    mg_list_foreach (&s->senders, n) {
        const mg_expect_sender *d = mg_container_of(n, mg_expect_sender, link);
        if (!d->probing && d->refs && d->next_probe_ms < next)
            next = d->next_probe_ms;
    }
    return next;
}

size_t mg_expects_count(const mg_expects *s)
{
    return s->n;
}

const mg_expect *mg_expects_first(const mg_expects *s)
{
    return mg_list_empty(&s->all) ? NULL : expect_of(mg_list_first(&s->all));
}

const mg_expect *mg_expects_next(const mg_expects *s, const mg_expect *e)
{
    return e->link.next != &s->all ? expect_of(e->link.next) : NULL;
}

void mg_expects_failures(const mg_expects *s, uint64_t out[8])
{
    memcpy(out, s->failures, sizeof(s->failures));
}
