/*
 * svc_agent: moongate.v1.Agent — client processes name themselves.
 *
 * Register makes an agent (moongate/agents.h) and binds it to the connection the call came on
 * (mg_call_bind): the agent lives as long as that connection, which is then never closed for
 * being idle. When it ends — Unregister, or the connection closes — its name and port are free
 * and the regions its process registered with client_address are unregistered, each once no
 * request holds it (mg_gateway_release), unless another agent of the same process and tenant
 * is still alive. Every agent added or ended is written to the agents' state file
 * (mg_gateway_agents_changed), from which a daemon started after this one holds their ports
 * until they register again (--agent-port-hold). Describe shows an agent here, or asks a peer for
 * one of its own (mg_peer_ask_agent: the same call transfers by (agent, address) make). The agents
 * themselves are the core's (mg_gateway_agents: the peer service, transfers and notifications look
 * them up); this service keeps what binds each to its connection. Loop thread only.
 */
#include "mg_agentdesc.h"
#include "mg_gateway.h"
#include "mg_peer_rpc.h"
#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_time.h"

#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/peer.pb-c.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIST_MAX 1024 /* agents one List answers */

typedef struct agent_svc {
    mg_gateway *gw;
    mg_agents *agents; /* the core's (mg_gateway_agents) */
    uint64_t registered, ended;
} agent_svc;

/* What the front keeps of an agent: its binding to the connection. */
typedef struct agent_front {
    mg_conn_bind bind;
    agent_svc *as;
    mg_agent *ag;
} agent_front;

extern const mg_service mg_svc_agent;

static agent_svc *agent_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_agent);
}

/* The agent ends: its regions go with it (unless its process has another agent here). */
static void agent_end(agent_svc *as, mg_agent *ag, const char *why)
{
    agent_front *f = ag->front;
    mg_proc proc = ag->proc;
    char tenant[sizeof(ag->tenant)];
    mg_unbind(&f->bind);
    mg_info("agent_ended", "tenant=%s agent=\"%s\" port=%u pid=%d reason=\"%s\"", ag->tenant,
            ag->name, ag->port, (int)ag->proc.pid, why);
    snprintf(tenant, sizeof(tenant), "%s", ag->tenant);
    mg_agents_remove(as->agents, ag);
    free(f);
    as->ended++;
    mg_gateway_agents_changed(as->gw);
    if (proc.pid > 0 && mg_agents_count(as->agents, tenant, &proc) == 0) {
        mg_region regions[256];
        uint64_t ids[256], after = 0;
        size_t n;
        mg_registry *reg = mg_engine_registry(as->gw->engine);
        while (reg && (n = mg_registry_regions(reg, tenant, &proc, after, regions, 256)) > 0) {
            for (size_t i = 0; i < n; i++)
                ids[i] = regions[i].id;
            after = regions[n - 1].address;
            mg_gateway_release(as->gw, &proc, ids, n, "its agent ended");
        }
    }
}

static void conn_closed(mg_conn_bind *b)
{
    agent_front *f = mg_container_of(b, agent_front, bind);
    agent_end(f->as, f->ag, "its connection closed");
}

/* An agent here, as AgentInfo (regions in `regions`, room for MG_AGENT_REGIONS_MAX). */
static void info_local(mg_gateway *gw, const mg_agent *ag, Moongate__V1__AgentInfo *out,
                       Moongate__V1__AgentRegion *rm, Moongate__V1__AgentRegion **rp,
                       mg_region *regions)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    size_t n = 0;
    out->name = (char *)ag->name;
    out->port = ag->port;
    out->tenant = (char *)ag->tenant;
    out->epoch = gw->epoch;
    out->agent_id = ag->id;
    if (rm && reg && ag->proc.pid > 0)
        n = mg_registry_regions(reg, ag->tenant, &ag->proc, 0, regions, MG_AGENT_REGIONS_MAX + 1);
    out->truncated = n > MG_AGENT_REGIONS_MAX;
    if (out->truncated)
        n = MG_AGENT_REGIONS_MAX;
    out->first_address = n ? regions[0].address : 0;
    for (size_t i = 0, first = 0; i < n; i++) {
        moongate__v1__agent_region__init(&rm[i]);
        rm[i].address = regions[i].address;
        rm[i].length = regions[i].size;
        rm[i].segment = regions[i].id;
        rm[i].remote_accessible = regions[i].remote_accessible;
        rp[i] = &rm[i];
        if (regions[i].order < regions[first].order) /* registered first, as Mooncake's */
            out->first_address = regions[first = i].address;
    }
    out->regions = rp;
    out->n_regions = n;
}

/* Replies with the agent's info and regions. */
static void reply_local(mg_call *call, const mg_agent *ag)
{
    Moongate__V1__AgentInfo info = MOONGATE__V1__AGENT_INFO__INIT;
    size_t cap = MG_AGENT_REGIONS_MAX + 1;
    Moongate__V1__AgentRegion *rm = calloc(cap, sizeof(*rm));
    Moongate__V1__AgentRegion **rp = calloc(cap, sizeof(*rp));
    mg_region *regions = calloc(cap, sizeof(*regions));
    if (rm == NULL || rp == NULL || regions == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    } else {
        info_local(mg_call_gateway(call), ag, &info, rm, rp, regions);
        mg_call_reply(call, &info.base);
    }
    free(rm);
    free(rp);
    free(regions);
}

static void register_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RegisterAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    agent_svc *as = agent_of(gw);
    agent_front *f;
    mg_agent *ag;
    mg_proc proc = {0, 0};
    uint32_t uid;
    char why[256];
    int rc;
    if (as == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon keeps no agents");
        return;
    }
    if (!mg_call_socket_cred(call, &uid, &proc))
        proc = (mg_proc){0, 0}; /* on TCP: an agent without regions by address */
    if ((f = calloc(1, sizeof(*f))) == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    rc = mg_agents_add(as->agents, mg_call_tenant(call), req->name, req->port, &proc,
                       mg_now_mono_ms(), &ag, why, sizeof(why));
    if (rc != 0) {
        free(f);
        mg_call_fail(call, rc, "%s", why);
        return;
    }
    f->as = as;
    f->ag = ag;
    f->bind.closed = conn_closed;
    ag->front = f;
    if (mg_call_bind(call, &f->bind) != 0) { /* its connection is gone already */
        agent_end(as, ag, "its connection closed");
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the connection closed");
        return;
    }
    as->registered++;
    mg_gateway_agents_changed(gw);
    mg_info("agent_registered", "tenant=%s agent=\"%s\" port=%u pid=%d by=%s", mg_call_tenant(call),
            ag->name, ag->port, (int)proc.pid, mg_call_peer(call));
    reply_local(call, ag);
}

static void unregister_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__UnregisterAgentRequest *req = (const void *)m;
    Moongate__V1__UnregisterAgentResponse resp = MOONGATE__V1__UNREGISTER_AGENT_RESPONSE__INIT;
    agent_svc *as = agent_of(mg_call_gateway(call));
    mg_agent *ag = as ? mg_agents_by_name(as->agents, mg_call_tenant(call), req->name) : NULL;
    if (ag && !mg_call_bound(call, &((agent_front *)ag->front)->bind))
        ag = NULL; /* only the connection that registered it may end it */
    if (ag == NULL) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "this connection has no agent named \"%.140s\"",
                     req->name);
        return;
    }
    agent_end(as, ag, "unregistered");
    mg_call_reply(call, &resp.base);
}

/* ---- Describe ---- */

/* A peer answered about one of its agents: the caller gets it as AgentInfo. */
static void describe_answered(void *arg, int code, const char *msg,
                              const Moongate__V1__PeerAgent *a, const char *peer)
{
    mg_call *call = arg;
    Moongate__V1__AgentInfo info = MOONGATE__V1__AGENT_INFO__INIT;
    Moongate__V1__AgentRegion *rm = NULL, **rp = NULL;
    if (mg_call_done(call)) {
        mg_call_unref(call);
        return;
    }
    if (a == NULL) {
        mg_call_finish(call, code ? code : MG_GRPC_UNAVAILABLE, "peer %s: %s", peer,
                       msg && *msg ? msg : "no answer");
        mg_call_unref(call);
        return;
    }
    rm = calloc(a->n_regions + 1, sizeof(*rm));
    rp = calloc(a->n_regions + 1, sizeof(*rp));
    if (rm == NULL || rp == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    } else {
        for (size_t i = 0; i < a->n_regions; i++) {
            const Moongate__V1__TargetDescriptor *t = a->regions[i]->target;
            moongate__v1__agent_region__init(&rm[i]);
            rm[i].address = a->regions[i]->address;
            rm[i].length = t ? t->size : 0;
            rm[i].segment = t ? t->id : 0;
            rm[i].remote_accessible = t ? t->remote_accessible : 0;
            rp[i] = &rm[i];
        }
        info.name = a->name;
        info.port = a->port;
        info.tenant = (char *)mg_call_tenant(call);
        info.peer = (char *)peer;
        info.epoch = a->epoch;
        info.agent_id = a->agent_id;
        info.regions = rp;
        info.n_regions = a->n_regions;
        /* the region the peer says was registered first; rm[0] from a peer that does not say */
        info.first_address = a->first_address ? a->first_address : a->n_regions ? rm[0].address : 0;
        info.truncated = a->truncated;
        mg_call_reply(call, &info.base);
    }
    free(rm);
    free(rp);
    mg_call_unref(call);
}

static void describe_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__DescribeAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_agent_ref ref;
    mg_agent *ag;
    char why[300], who[MG_AGENT_NAME_MAX + 32];
    int rc =
        mg_agent_ref_parse(req->peer, req->agent, (int)gw->cfg->peer_port, &ref, why, sizeof(why));
    if (rc != 0) {
        mg_call_fail(call, rc, "%s", why);
        return;
    }
    if (ref.peer[0] == '\0') {
        if ((ag = mg_gateway_agent_find(gw, mg_call_tenant(call), &ref)) == NULL) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no %s on this daemon",
                         mg_agent_ref_str(&ref, who, sizeof(who)));
            return;
        }
        reply_local(call, ag);
        return;
    }
    if (!mg_is_host_port(ref.peer)) {
        mg_call_fail(call, MG_ERR_INVALID, "peer \"%s\" must be host:port", ref.peer);
        return;
    }
    mg_call_ref(call);
    if (mg_peer_ask_agent(gw, mg_call_tenant(call), &ref, describe_answered, call, why,
                          sizeof(why)) != 0) {
        mg_call_unref(call);
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "peer %s: %s", ref.peer, why);
    }
}

static void list_message(mg_call *call, const ProtobufCMessage *m)
{
    Moongate__V1__ListAgentsResponse resp = MOONGATE__V1__LIST_AGENTS_RESPONSE__INIT;
    mg_gateway *gw = mg_call_gateway(call);
    agent_svc *as = agent_of(gw);
    mg_agent **v = calloc(LIST_MAX, sizeof(*v));
    Moongate__V1__AgentInfo *infos = calloc(LIST_MAX, sizeof(*infos));
    Moongate__V1__AgentInfo **ip = calloc(LIST_MAX, sizeof(*ip));
    (void)m;
    if (v == NULL || infos == NULL || ip == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    } else {
        size_t n = as ? mg_agents_list(as->agents, mg_call_scope(call), 0, v, LIST_MAX) : 0;
        for (size_t i = 0; i < n; i++) {
            moongate__v1__agent_info__init(&infos[i]);
            info_local(gw, v[i], &infos[i], NULL, NULL, NULL);
            ip[i] = &infos[i];
        }
        resp.agents = ip;
        resp.n_agents = n;
        mg_call_reply(call, &resp.base);
    }
    free(v);
    free(infos);
    free(ip);
}

/* ---- descriptors ---- */

/* This daemon's control endpoint for peers: --advertise, else this host's name and
 * --peer-port. */
static void advertised(const mg_gateway *gw, char *out, size_t cap)
{
    char host[200];
    if (gw->cfg->advertise[0]) {
        snprintf(out, cap, "%s", gw->cfg->advertise);
        return;
    }
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    snprintf(out, cap, "%s:%u", host, (unsigned)gw->cfg->peer_port);
}

static void export_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ExportAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__AgentDescriptor d = MOONGATE__V1__AGENT_DESCRIPTOR__INIT;
    Moongate__V1__ExportAgentResponse resp = MOONGATE__V1__EXPORT_AGENT_RESPONSE__INIT;
    Moongate__V1__AgentInfo info = MOONGATE__V1__AGENT_INFO__INIT;
    size_t cap = MG_AGENT_REGIONS_MAX + 1;
    Moongate__V1__AgentRegion *rm = calloc(cap, sizeof(*rm));
    Moongate__V1__AgentRegion **rp = calloc(cap, sizeof(*rp));
    mg_region *regions = calloc(cap, sizeof(*regions));
    mg_agent *ag = mg_agents_by_name(mg_gateway_agents(gw), mg_call_tenant(call), req->name);
    char endpoint[MG_PEER_NAME_MAX + 1];
    uint8_t *blob = NULL;
    if (ag == NULL) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no agent \"%.140s\" on this daemon", req->name);
    } else if (rm == NULL || rp == NULL || regions == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    } else {
        snprintf(endpoint, sizeof(endpoint), "%s", req->endpoint);
        if (endpoint[0] == '\0')
            advertised(gw, endpoint, sizeof(endpoint));
        info_local(gw, ag, &info, rm, rp, regions);
        d.version = MG_AGENTDESC_VERSION;
        d.endpoint = endpoint;
        d.tenant = ag->tenant;
        d.name = ag->name;
        d.port = ag->port;
        d.epoch = gw->epoch;
        d.agent_id = ag->id;
        d.regions = info.regions;
        d.n_regions = info.n_regions;
        resp.descriptor.len = moongate__v1__agent_descriptor__get_packed_size(&d);
        if ((blob = malloc(resp.descriptor.len + 1)) == NULL) {
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
        } else {
            moongate__v1__agent_descriptor__pack(&d, blob);
            resp.descriptor.data = blob;
            mg_call_reply(call, &resp.base);
        }
    }
    free(blob);
    free(rm);
    free(rp);
    free(regions);
}

/* An import: the descriptor, kept while its daemon is asked. */
typedef struct import_call {
    mg_call *call;
    Moongate__V1__AgentDescriptor *d;
} import_call;

static void import_answered(void *arg, int code, const char *msg, const Moongate__V1__PeerAgent *a,
                            const char *peer)
{
    import_call *ic = arg;
    const Moongate__V1__AgentDescriptor *d = ic->d;
    char why[400];
    if (a && !mg_call_done(ic->call) &&
        mg_agentdesc_compare(d, a->name, a->port, a->epoch, a->agent_id, why, sizeof(why)) != 0) {
        mg_call_fail(ic->call, MG_ERR_STATE, "descriptor of agent \"%.140s\" on %s: %s", d->name,
                     peer, why);
        a = NULL;
        code = -1;
    }
    if (code >= 0)
        describe_answered(ic->call, code, msg, a, peer); /* answers and lets go of the call */
    else
        mg_call_unref(ic->call);
    moongate__v1__agent_descriptor__free_unpacked(ic->d, NULL);
    free(ic);
}

static void import_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ImportAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    import_call *ic;
    mg_agent_ref ref;
    char why[300];
    Moongate__V1__AgentDescriptor *d =
        mg_agentdesc_decode(req->descriptor.data, req->descriptor.len, why, sizeof(why));
    if (d == NULL) {
        mg_call_fail(call, MG_ERR_INVALID, "%s", why);
        return;
    }
    if (strcmp(d->tenant, mg_call_tenant(call)) != 0) {
        mg_call_fail(call, MG_ERR_PERMISSION, "the descriptor is another tenant's agent");
    } else if (!mg_is_host_port(d->endpoint)) {
        mg_call_fail(call, MG_ERR_INVALID, "endpoint \"%s\" must be host:port", d->endpoint);
    } else if ((ic = calloc(1, sizeof(*ic))) == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
    } else {
        memset(&ref, 0, sizeof(ref));
        snprintf(ref.peer, sizeof(ref.peer), "%s", d->endpoint);
        snprintf(ref.name, sizeof(ref.name), "%s", d->name);
        *ic = (import_call){call, d};
        mg_call_ref(call);
        if (mg_peer_ask_agent(gw, mg_call_tenant(call), &ref, import_answered, ic, why,
                              sizeof(why)) == 0)
            return;
        mg_call_unref(call);
        free(ic);
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "peer %s: %s", d->endpoint, why);
    }
    moongate__v1__agent_descriptor__free_unpacked(d, NULL);
}

static const mg_method agent_methods[] = {
    MG_UNARY("/moongate.v1.Agent/RegisterAgent", &moongate__v1__register_agent_request__descriptor,
             &moongate__v1__agent_info__descriptor, register_message),
    MG_UNARY("/moongate.v1.Agent/UnregisterAgent",
             &moongate__v1__unregister_agent_request__descriptor,
             &moongate__v1__unregister_agent_response__descriptor, unregister_message),
    MG_UNARY("/moongate.v1.Agent/DescribeAgent", &moongate__v1__describe_agent_request__descriptor,
             &moongate__v1__agent_info__descriptor, describe_message),
    MG_UNARY("/moongate.v1.Agent/ExportAgent", &moongate__v1__export_agent_request__descriptor,
             &moongate__v1__export_agent_response__descriptor, export_message),
    MG_UNARY("/moongate.v1.Agent/ImportAgent", &moongate__v1__import_agent_request__descriptor,
             &moongate__v1__agent_info__descriptor, import_message),
    MG_UNARY("/moongate.v1.Agent/ListAgents", &moongate__v1__list_agents_request__descriptor,
             &moongate__v1__list_agents_response__descriptor, list_message),
};

static const mg_route agent_routes[] = {
    {"GET", "/v1/agents", 0, "/moongate.v1.Agent/ListAgents"},
};

static int mg_svc_agent_init(mg_gateway *gw)
{
    agent_svc *as;
    int rc = mg_gateway_add_methods(gw, agent_methods, MG_NELEM(agent_methods), agent_routes,
                                    MG_NELEM(agent_routes));
    if (rc != 0)
        return rc;
    if ((as = calloc(1, sizeof(*as))) == NULL)
        return MG_ERR_NOMEM;
    *mg_gateway_state(gw, &mg_svc_agent) = as;
    as->gw = gw;
    as->agents = mg_gateway_agents(gw);
    return 0;
}

static void mg_svc_agent_free(mg_gateway *gw)
{
    agent_svc *as = agent_of(gw);
    mg_agent *v[64];
    size_t n;
    if (as == NULL)
        return;
    while (as->agents && (n = mg_agents_list(as->agents, NULL, 0, v, 64)) > 0) {
        for (size_t i = 0; i < n; i++) { /* their connections outlive nothing of them */
            agent_front *f = v[i]->front;
            mg_unbind(&f->bind);
            mg_agents_remove(as->agents, v[i]);
            free(f);
        }
    }
    free(as); /* the table is the core's, empty now */
    *mg_gateway_state(gw, &mg_svc_agent) = NULL;
}

static void agent_metrics(mg_gateway *gw, struct evbuffer *out)
{
    agent_svc *as = agent_of(gw);
    uint64_t written, failed;
    if (as == NULL)
        return;
    mg_gateway_agents_file_stats(gw, &written, &failed);
    evbuffer_add_printf(
        out,
        "# HELP moongate_agents_held Ports held for agents of the daemon before this one until "
        "they register again (--agent-port-hold).\n"
        "# TYPE moongate_agents_held gauge\nmoongate_agents_held %zu\n"
        "# HELP moongate_agents_state_writes_total Writes of the agents' state file "
        "(<shm-dir>/.moongate.agents), by result.\n"
        "# TYPE moongate_agents_state_writes_total counter\n"
        "moongate_agents_state_writes_total{result=\"written\"} %llu\n"
        "moongate_agents_state_writes_total{result=\"failed\"} %llu\n",
        mg_agents_holds(as->agents, mg_now_mono_ms(), NULL, 0), (unsigned long long)written,
        (unsigned long long)failed);
    evbuffer_add_printf(out,
                        "# HELP moongate_agents Agents alive on this daemon.\n"
                        "# TYPE moongate_agents gauge\nmoongate_agents %zu\n"
                        "# HELP moongate_agents_total Agents registered, and ended.\n"
                        "# TYPE moongate_agents_total counter\n"
                        "moongate_agents_total{event=\"registered\"} %llu\n"
                        "moongate_agents_total{event=\"ended\"} %llu\n",
                        mg_agents_count(as->agents, NULL, NULL), (unsigned long long)as->registered,
                        (unsigned long long)as->ended);
}

const mg_service mg_svc_agent = {.name = "agent",
                                 .init = mg_svc_agent_init,
                                 .metrics = agent_metrics,
                                 .free = mg_svc_agent_free};
