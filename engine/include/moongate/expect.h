/*
 * moongate expectations: what a receiving client waits for, and what ends the wait when the
 * notification does not come.
 *
 * A client declares that a notification is due on a topic of its tenant by a deadline, and
 * perhaps from which sender: a peer daemon, or an agent on one. The first notification to
 * arrive on the topic meets the oldest expectation of that topic (mg_expect_heard). Otherwise
 * the expectation fails, once, for the first of these causes:
 *
 *   DEADLINE      its deadline passed;
 *   UNREACHABLE   the sender's daemon answered no probe for the liveness timeout (counted from
 *                 its last answer, or from the declaration if later);
 *   RESTARTED     the sender's daemon answers under another epoch than the one the client gave,
 *                 or than the first answer to a probe sent after the declaration;
 *   AGENT_GONE    the sender's daemon answers without the agent, or with another agent of that
 *                 name or port.
 *
 * One sender entry per (tenant, peer, agent) is shared by the expectations naming it; it is
 * probed every probe_ms while any expectation names it, one probe in flight at a time. The front
 * owns the clock and the calls: it asks for the probes due (mg_expects_probe_due), reports their
 * answers (mg_expect_probed), calls mg_expects_tick at mg_expects_next_ms, and posts a failure
 * notice for each expectation the `failed` callback names. Loop thread only.
 */
#ifndef MOONGATE_EXPECT_H
#define MOONGATE_EXPECT_H

#include "mg_list.h"
#include "moongate/agents.h"
#include "moongate/peers.h"
#include "moongate/segment.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_EXPECT_TOPIC_MAX   128      /* bytes of a topic */
#define MG_EXPECT_TIMEOUT_MAX 86400000 /* ms: a day */

/* Why an expectation failed; the values are those of moongate.v1.Outcome. */
typedef enum {
    MG_EXPECT_DEADLINE = 4,
    MG_EXPECT_UNREACHABLE = 5,
    MG_EXPECT_RESTARTED = 6,
    MG_EXPECT_AGENT_GONE = 7,
} mg_expect_cause;

/* "deadline", "sender_unreachable", "sender_restarted", "sender_agent_gone". */
const char *mg_expect_cause_name(mg_expect_cause c);

typedef struct mg_expect_sender {
    char tenant[MG_SEG_NAME_MAX + 1];
    char peer[MG_PEER_NAME_MAX + 1];   /* its daemon's control endpoint, "host:port" */
    char agent[MG_AGENT_NAME_MAX + 1]; /* the agent's name, or "" */
    uint32_t agent_port;               /* or its port (0: no agent named) */
    uint64_t last_answer_ms;           /* its daemon's last answer (0: none yet) */
    uint64_t probe_sent_ms;            /* when the probe in flight (or the last) was sent */
    uint64_t next_probe_ms;
    int probing;
    char last_error[200]; /* why the last probe went unanswered (the front's words), or "" */
    size_t refs;          /* expectations naming it */
    mg_list_node link;
} mg_expect_sender;

typedef struct mg_expect {
    uint64_t id;
    char tenant[MG_SEG_NAME_MAX + 1];
    char topic[MG_EXPECT_TOPIC_MAX + 1];
    mg_expect_sender *sender; /* NULL: none named */
    uint64_t epoch;           /* the sender daemon's epoch it holds to (0: not known yet) */
    uint64_t agent_id;        /* the agent's id there (0: not known yet, or none named) */
    uint64_t lease, segment;  /* what the client said it receives into (0: not named) */
    uint64_t t0_ms, deadline_ms;
    mg_list_node link; /* in the set, oldest first */
} mg_expect;

/* What a client declares. */
typedef struct mg_expect_spec {
    const char *tenant, *topic;
    const char *peer;    /* "host:port" of the sender's daemon, or "" */
    const char *agent;   /* the agent's name, or "" */
    uint32_t agent_port; /* or its port; 0 with agent "": no agent */
    uint64_t epoch;      /* 0: not known */
    uint64_t lease, segment;
    uint32_t timeout_ms; /* 1..MG_EXPECT_TIMEOUT_MAX */
} mg_expect_spec;

typedef struct mg_expects mg_expects;

/* The expectation failed for `cause` (why: in words); it is freed when the callback returns. */
typedef void (*mg_expect_failed_fn)(void *arg, const mg_expect *e, mg_expect_cause cause,
                                    const char *why);

/* At most `max` expectations at once; a sender unanswered for liveness_ms is unreachable, and is
 * probed every probe_ms. NULL when out of memory or a number is 0. */
mg_expects *mg_expects_new(size_t max, uint64_t liveness_ms, uint64_t probe_ms,
                           mg_expect_failed_fn failed, void *arg);
/* Accepts NULL. Frees them all without a notice; no probe may be in flight (the front dropped
 * its answers). */
void mg_expects_del(mg_expects *s);

/* Declares one at now_ms. Returns 0 with *out, MG_ERR_INVALID (a field out of range: why
 * set), MG_ERR_FULL (max reached) or MG_ERR_NOMEM. */
int mg_expect_add(mg_expects *s, const mg_expect_spec *spec, uint64_t now_ms, const mg_expect **out,
                  char *why, size_t cap);
/* Ends the tenant's expectation `id` without a notice. Returns 0 or MG_ERR_NOT_FOUND. */
int mg_expect_remove(mg_expects *s, const char *tenant, uint64_t id);
/* A notification arrived on the tenant's topic: the oldest expectation of it is met (ended
 * without a notice). Returns 1 when one was, else 0. */
int mg_expect_heard(mg_expects *s, const char *tenant, const char *topic);

/* Calls probe(arg, sender) for each sender due for a probe at now_ms, which is then in flight
 * until mg_expect_probed. */
void mg_expects_probe_due(mg_expects *s, uint64_t now_ms,
                          void (*probe)(void *arg, mg_expect_sender *sender), void *parg);
/* The answer to sender's probe: answered 0 (no answer: the call failed or timed out), or its
 * daemon's epoch, whether it has the agent, and the agent's id there. Expectations whose sender
 * restarted or lost its agent fail now; the sender is freed when no expectation names it. */
void mg_expect_probed(mg_expects *s, mg_expect_sender *sender, int answered, uint64_t epoch,
                      int agent_present, uint64_t agent_id, uint64_t now_ms);
/* Fails the expectations whose deadline passed or whose sender is unreachable at now_ms. */
void mg_expects_tick(mg_expects *s, uint64_t now_ms);
/* When the next tick or probe is due (UINT64_MAX: nothing is). */
uint64_t mg_expects_next_ms(const mg_expects *s);

size_t mg_expects_count(const mg_expects *s);
/* Oldest first: for (e = mg_expects_first(s); e; e = mg_expects_next(s, e)). */
const mg_expect *mg_expects_first(const mg_expects *s);
const mg_expect *mg_expects_next(const mg_expects *s, const mg_expect *e);
/* Failures so far, by cause (index: the cause). */
void mg_expects_failures(const mg_expects *s, uint64_t out[8]);

#ifdef __cplusplus
}
#endif

#endif
