/*
 * svc_transfer_agent: transfers that name remote memory by (agent, address).
 *
 * Before a batch starts, each of its requests naming an agent on a peer is resolved to a
 * segment of the peer and an offset, from what the agent cache knows of the agent under the
 * peer's epoch (moongate/agentcache.h). An agent it does not know — or knows without a region
 * holding the range, since the agent may have registered one since — is asked for once with
 * Peer/DescribeAgent, which also says what DescribeTarget would of each region (they go into
 * the peer cache: no second round trip; the core's mg_peer_describe_agent, which the agent
 * service's Describe uses too). Then every request must resolve, or the Submit fails naming it
 * and nothing moves. Loop thread only.
 */
#include "svc_transfer.h"

#include "mg_peer_rpc.h"

#include "mg_log.h"
#include "mg_time.h"

#include "moongate/v1/peer.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a Submit's agents ---- */

typedef struct agents_wait {
    mg_call *call;
    mg_batch *b;
    void (*then)(mg_call *call, mg_batch *b);
    size_t pending;
    int code; /* the first ask that failed: its gRPC code and why */
    char msg[400];
} agents_wait;

/* Every request resolved (second pass), or the Submit fails naming the first that is not. */
static void agents_end(agents_wait *w)
{
    struct mg_transfer_svc *ts = svc_of(w->b);
    mg_call *call = w->call;
    char why[400];
    size_t bad = 0;
    int rc = 0;
    if (!mg_call_done(call) && w->code == 0 && !transfer_closing(ts))
        rc = mg_batch_resolve_agents(w->b, ts->agents, ts->descs, 1, NULL, NULL, &bad, why,
                                     sizeof(why));
    if (mg_call_done(call) || transfer_closing(ts)) {
        mg_batch_discard(w->b);
    } else if (w->code) {
        mg_xfer_svc_refuse(call, w->b, w->code, "%s; nothing was moved", w->msg);
    } else if (rc) {
        mg_xfer_svc_refuse_request(call, w->b, rc, bad, why);
    } else {
        w->then(call, w->b);
    }
    mg_call_unref(call);
    free(w);
}

static void agent_answered(void *arg, int code, const char *msg, const Moongate__V1__PeerAgent *a,
                           const char *peer)
{
    agents_wait *w = arg;
    (void)a;
    if (code && w->code == 0) {
        w->code = code;
        snprintf(w->msg, sizeof(w->msg), "peer %.80s: %.300s", peer,
                 msg && *msg ? msg : "no answer");
    }
    if (--w->pending == 0)
        agents_end(w);
}

int mg_xfer_agents_resolve(mg_call *call, mg_batch *b, void (*then)(mg_call *, mg_batch *))
{
    struct mg_transfer_svc *ts = svc_of(b);
    mg_batch_agent_ask *ask = NULL;
    size_t nask = 0, bad = 0;
    agents_wait *w;
    char why[400];
    int rc;
    if (b->nagents == 0)
        return 0;
    rc = mg_batch_resolve_agents(b, ts->agents, ts->descs, 0, &ask, &nask, &bad, why, sizeof(why));
    if (rc != 0 || nask == 0 || (w = calloc(1, sizeof(*w))) == NULL) {
        free(ask);
        if (rc == 0 && nask == 0)
            return 0;
        if (rc == 0 || rc == MG_ERR_NOMEM) {
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
            mg_batch_discard(b);
        } else {
            mg_xfer_svc_refuse_request(call, b, rc, bad, why);
        }
        return -1;
    }
    *w = (agents_wait){.call = call, .b = b, .then = then, .pending = nask + 1};
    mg_call_ref(call);
    for (size_t i = 0; i < nask; i++) {
        if (mg_peer_describe_agent(ts->gw, ask[i].peer, ask[i].ref, agent_answered, w, why,
                                   sizeof(why)) != 0) {
            if (w->code == 0) {
                w->code = MG_GRPC_UNAVAILABLE;
                snprintf(w->msg, sizeof(w->msg), "peer %.80s: %.300s", ask[i].peer->addr, why);
            }
            w->pending--;
        }
    }
    free(ask);
    if (--w->pending == 0)
        agents_end(w);
    return 1;
}

/* ---- a region refused while a batch runs: where is that address now? ---- */

/* The requests of a batch whose agent's region the peer refused, waiting (mg_batch_req.wait)
 * for one DescribeAgent per peer and agent. */
typedef struct relookup {
    struct mg_transfer_svc *ts;
    mg_xfer_peer *p;
    mg_agent_ref ref;
    mg_list waiting;
    struct relookup *next;
} relookup;

/* Starts r again at where its address is now, or ends it saying why not. */
static void restart(relookup *lk, mg_batch_req *r, int code, const char *msg)
{
    struct mg_transfer_svc *ts = lk->ts;
    char why[400], both[600];
    uint64_t size;
    int rc = code ? MG_ERR_NOT_FOUND : 0;
    if (rc == 0)
        rc = mg_agent_cache_resolve(
            ts->agents, lk->p->key, mg_peer_cache_epoch_of(ts->descs, lk->p->key), &lk->ref,
            r->remote_address, r->length, &r->remote_segment, &r->remote_offset, why, sizeof(why));
    else
        snprintf(why, sizeof(why), "%.380s", msg && *msg ? msg : "no answer");
    if (rc == MG_ERR_NOT_FOUND && code == 0)
        snprintf(why, sizeof(why), "it has no such agent now");
    if (rc == 0)
        rc = mg_peer_cache_check(ts->descs, lk->p->key, lk->p->addr, r->remote_segment, 0,
                                 r->remote_offset, r->length, &size, why, sizeof(why));
    if (rc == 0) {
        mg_batch_req_say(r, NULL);
        mg_peerdir_start(r, mg_now_mono_ms());
        return;
    }
    snprintf(both, sizeof(both),
             "peer %.80s: its region at 0x%llx was refused, and asked again: %.380s", lk->p->addr,
             (unsigned long long)r->remote_address, why);
    mg_batch_req_end(r, rc == MG_ERR_RANGE ? MG_ERR_RANGE : MG_ERR_NOT_FOUND, both);
}

static void relookup_answered(void *arg, int code, const char *msg,
                              const Moongate__V1__PeerAgent *a, const char *peer)
{
    relookup *lk = arg, **pp;
    (void)a;
    (void)peer;
    for (pp = &lk->ts->relookups; *pp && *pp != lk; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = lk->next;
    while (!transfer_closing(lk->ts) && !mg_list_empty(&lk->waiting)) {
        mg_batch_req *r = mg_container_of(mg_list_first(&lk->waiting), mg_batch_req, wait);
        mg_list_remove(&r->wait);
        restart(lk, r, code, msg);
    }
    free(lk);
}

void mg_xfer_agent_stale(void *arg, mg_batch_req *r)
{
    struct mg_transfer_svc *ts = arg;
    const mg_agent_ref *ref = r->b->agents[r->agent - 1];
    relookup *lk;
    char why[300];
    for (lk = ts->relookups; lk; lk = lk->next) { /* being asked already */
        if (lk->p == r->peer && !strcmp(lk->ref.name, ref->name) && lk->ref.port == ref->port) {
            mg_list_push_back(&lk->waiting, &r->wait);
            return;
        }
    }
    mg_agent_cache_forget(ts->agents, r->peer->key, ref);
    if ((lk = calloc(1, sizeof(*lk))) == NULL) {
        mg_batch_req_end(r, MG_ERR_NOMEM, "out of memory");
        return;
    }
    lk->ts = ts;
    lk->p = r->peer;
    lk->ref = *ref;
    mg_list_init(&lk->waiting);
    mg_list_push_back(&lk->waiting, &r->wait);
    if (mg_peer_describe_agent(ts->gw, r->peer, ref, relookup_answered, lk, why, sizeof(why)) !=
        0) {
        mg_list_remove(&r->wait);
        free(lk);
        mg_batch_req_end(r, MG_ERR_NOT_FOUND, r->msg ? r->msg : "its region was refused");
        return;
    }
    lk->next = ts->relookups;
    ts->relookups = lk;
}
