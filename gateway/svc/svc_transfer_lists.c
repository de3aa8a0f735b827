/*
 * svc_transfer_lists: moongate.v1.Transfer PrepareList and ReleaseList — lists of ranges that a
 * connection's later batches name by index (moongate/xlists.h), each range checked once, when
 * the list is made, against the regions it must lie in; and the check of a Submit's groups by
 * index. A list is bound to the connection that made it: it goes when that connection closes.
 */
#include "svc_transfer.h"

#include "mg_log.h"

#include "moongate/agentcache.h"
#include "moongate/v1/transfer.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* What the front keeps of a list: its binding to the connection. */
typedef struct xl_front {
    mg_conn_bind bind;
    mg_xlists *set;
    mg_xlist *l;
} xl_front;

static void list_closed(mg_conn_bind *b)
{
    xl_front *f = mg_container_of(b, xl_front, bind);
    mg_xlists_drop(f->set, f->l);
    free(f);
}

/* Each range of the caller's own memory lies in one region its process registered. Returns
 * 0, or fails the call naming the first that does not. */
static int check_own(mg_call *call, struct mg_transfer_svc *ts,
                     const Moongate__V1__PrepareListRequest *req)
{
    mg_registry *reg = mg_engine_registry(ts->gw->engine);
    char err[MG_SEG_ERROR_MAX];
    uint64_t id, off;
    uint32_t uid;
    mg_proc proc;
    if (!mg_call_socket_cred(call, &uid, &proc) || proc.pid <= 0) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "a list of the caller's own memory is prepared on "
                     "the Unix socket, by the process that registered it");
        return -1;
    }
    for (size_t i = 0; i < req->n_addresses; i++) {
        int rc = mg_registry_resolve(reg, mg_call_tenant(call), &proc, req->addresses[i],
                                     req->lengths[i], &id, &off, err);
        if (rc != 0) {
            mg_call_fail(call, MG_ERR_INVALID, "range %zu (0x%" PRIx64 ", %" PRIu64 "): %s", i,
                         req->addresses[i], req->lengths[i], err);
            return -1;
        }
    }
    return 0;
}

/* Each range of an agent's memory lies in one of its regions, where this daemon knows them: an
 * agent here, or one on a peer whose regions it learnt (ImportAgent, DescribeAgent, a batch).
 * Returns 0, or fails the call naming the first range that does not. An agent on a peer not
 * known yet is checked when a batch uses the list. */
static int check_agent(mg_call *call, struct mg_transfer_svc *ts,
                       const Moongate__V1__PrepareListRequest *req, const mg_agent_ref *ref)
{
    mg_registry *reg = mg_engine_registry(ts->gw->engine);
    const mg_agents *ags = mg_gateway_agents(ts->gw);
    const char *tenant = mg_call_tenant(call);
    char err[MG_SEG_ERROR_MAX], key[MG_SEG_NAME_MAX + MG_PEER_NAME_MAX + 2], who[160];
    const mg_agent *ag = NULL;
    mg_remote_region region;
    uint64_t id, off, epoch;
    if (ref->peer[0] == '\0') { /* an agent on this daemon: its process's regions */
        if (ags)
            ag = ref->name[0] ? mg_agents_by_name(ags, tenant, ref->name)
                              : mg_agents_by_port(ags, tenant, ref->port);
        if (ag == NULL || ag->proc.pid <= 0) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no %s with regions on this daemon",
                         mg_agent_ref_str(ref, who, sizeof(who)));
            return -1;
        }
    }
    snprintf(key, sizeof(key), "%s@%s", tenant, ref->peer);
    epoch = ag ? 0 : mg_peer_cache_epoch_of(ts->descs, key);
    for (size_t i = 0; i < req->n_addresses; i++) {
        int rc = ag ? mg_registry_resolve(reg, tenant, &ag->proc, req->addresses[i],
                                          req->lengths[i], &id, &off, err)
                    : mg_agent_cache_region(ts->agents, key, epoch, ref, req->addresses[i],
                                            req->lengths[i], &region, err, sizeof(err));
        if (rc == MG_ERR_NOT_FOUND && !ag)
            return 0; /* not known here yet */
        if (rc != 0) {
            mg_call_fail(call, MG_ERR_INVALID, "range %zu (0x%" PRIx64 ", %" PRIu64 ") of %s: %s",
                         i, req->addresses[i], req->lengths[i],
                         mg_agent_ref_str(ref, who, sizeof(who)), err);
            return -1;
        }
    }
    return 0;
}

void mg_xfer_svc_prepare_list(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__PrepareListRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_transfer_svc *ts = transfer_of(gw);
    Moongate__V1__PreparedList resp = MOONGATE__V1__PREPARED_LIST__INIT;
    mg_agent_ref ref;
    xl_front *f;
    char why[256];
    size_t bad;
    int rc;
    if (ts == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot transfer");
        return;
    }
    if (req->n_addresses != req->n_lengths || req->n_addresses == 0 ||
        req->n_addresses > gw->cfg->max_transfer_requests) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "a list has 1..%llu ranges (--max-transfer-requests), addresses and lengths "
                     "of equal count: not %zu and %zu",
                     (unsigned long long)gw->cfg->max_transfer_requests, req->n_addresses,
                     req->n_lengths);
        return;
    }
    if (!req->remote_agent[0] && req->peer[0]) {
        mg_call_fail(call, MG_ERR_INVALID,
                     "peer \"%.64s\": name the agent whose memory the list "
                     "is (remote_agent)",
                     req->peer);
        return;
    }
    if (req->remote_agent[0] &&
        mg_agent_ref_parse(req->peer, req->remote_agent, (int)gw->cfg->peer_port, &ref, why,
                           sizeof(why)) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "%s", why);
        return;
    }
    if (!req->remote_agent[0] ? check_own(call, ts, req) != 0
                              : check_agent(call, ts, req, &ref) != 0)
        return;
    if ((f = calloc(1, sizeof(*f))) == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    rc = mg_xlists_add(ts->xlists, mg_call_tenant(call), mg_call_conn_id(call), req->peer,
                       req->remote_agent, req->addresses, req->lengths, req->n_addresses, &f->l,
                       &bad);
    if (rc != 0) {
        free(f);
        if (rc == MG_ERR_INVALID && bad < req->n_addresses)
            mg_call_fail(call, rc,
                         "range %zu (0x%" PRIx64 ", %" PRIu64 "): empty, or past the "
                         "end of the address space",
                         bad, req->addresses[bad], req->lengths[bad]);
        else if (rc == MG_ERR_FULL)
            mg_call_fail(call, rc,
                         "the daemon holds %" PRIu64 " prepared ranges already: "
                         "release lists (ReleaseList) or close their connections",
                         mg_xlists_ranges(ts->xlists));
        else
            mg_call_fail(call, rc, rc == MG_ERR_INVALID ? "peer or remote_agent too long" : NULL);
        return;
    }
    f->set = ts->xlists;
    f->l->front = f;
    f->bind.closed = list_closed;
    if (mg_call_bind(call, &f->bind) != 0) { /* the connection is gone */
        list_closed(&f->bind);
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the connection closed");
        return;
    }
    resp.id = f->l->node.id;
    resp.count = f->l->n;
    mg_call_reply(call, &resp.base);
}

void mg_xfer_svc_release_list(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReleaseListRequest *req = (const void *)m;
    struct mg_transfer_svc *ts = transfer_of(mg_call_gateway(call));
    Moongate__V1__ReleaseListResponse resp = MOONGATE__V1__RELEASE_LIST_RESPONSE__INIT;
    mg_xlist *l =
        ts ? mg_xlists_find(ts->xlists, req->id, mg_call_tenant(call), mg_call_conn_id(call))
           : NULL;
    xl_front *f;
    if (l == NULL) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no prepared list %" PRIu64 " of this connection",
                     req->id);
        return;
    }
    f = l->front;
    mg_unbind(&f->bind);
    list_closed(&f->bind);
    mg_call_reply(call, &resp.base);
}

int mg_xfer_svc_prepared(const xfer_origin *o, const Moongate__V1__Prepared *p, size_t g,
                         const mg_xlist **lo, const mg_xlist **ro)
{
    const char *bad;
    char why[256];
    *lo = mg_xlists_find(o->ts->xlists, p->local_list, o->tenant, o->conn);
    *ro = mg_xlists_find(o->ts->xlists, p->remote_list, o->tenant, o->conn);
    if (*lo == NULL || *ro == NULL) {
        mg_xfer_origin_fail(o, MG_ERR_NOT_FOUND,
                            "prepared %zu: no prepared list %" PRIu64 " of this connection (a "
                            "list lives with the connection that prepared it)",
                            g, *lo == NULL ? p->local_list : p->remote_list);
        return -1;
    }
    bad = mg_xlists_check_pairs(*lo, *ro, p->local_indices, p->n_local_indices, p->remote_indices,
                                p->n_remote_indices, why, sizeof(why));
    if (bad) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID, "prepared %zu: %s", g, bad);
        return -1;
    }
    return 0;
}
