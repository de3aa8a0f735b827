/*
 * svc_peer: moongate.v1.Peer and the daemon's TCP data plane.
 *
 * At start-up the gateway starts the data-plane server (moongate/dataplane.h) on --data-listen
 * over the engine's registry. A peer daemon first asks OpenSession here (a random 32-byte token,
 * valid --session-ttl, bound to the caller's tenant), then presents the token on the data plane,
 * whose connection threads check it in the engine's session table (mg_dp_sessions) — the one
 * piece of state they share with the loop. DescribeTarget tells a peer a target's size and whether
 * peers may reach it. Only authenticated peer daemons call here (mg_method.peer_only): they
 * name the tenant a session or a lookup is for, and get that tenant's targets only.
 */
#include "mg_gateway.h"
#include "mg_service.h"
#include "moongate/pools.h"

#include "mg_auth.h"

#include "mg_addr.h"
#include "mg_log.h"

#include "mg_rdma_wire.h"

#include "moongate/dataplane.h"
#include "moongate/lease_table.h"
#include "moongate/rdma.h"
#include "moongate/segment.h"
#include "moongate/v1/peer.pb-c.h"
#include "moongate/v1/debug.pb-c.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SESSIONS 4096
#define MAX_RCONNS   64 /* RDMA connections peers made here, all sessions together */

struct mg_peer_svc {
    mg_dp_server *server;
    char host[128];
    int port;
    mg_dp_sessions *sessions; /* the loop adds, connection threads look up */
    /* RDMA connections peers asked for (ConnectRdma), alive with their session. Loop only. */
    struct rconn {
        uint8_t token[MG_DF_TOKEN_BYTES];
        uint64_t expires_ms;
        mg_rdma_conn *c;
    } rconns[MAX_RCONNS];
    size_t nrconns;
    unsigned rdma_jobs; /* ConnectRdma jobs on workers */
};

extern const mg_service mg_svc_peer;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static struct mg_peer_svc *peer_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_peer);
}

/* The session's data-plane version: the newest both sides speak. A caller that names none speaks
 * version 1 only. Returns 0, or -1 when the ranges do not overlap (*out: the caller's newest). */
static int version_pick(const Moongate__V1__OpenSessionRequest *req, uint32_t *out)
{
    uint32_t hi = req->protocol_version ? req->protocol_version : 1;
    uint32_t lo = req->min_protocol_version ? req->min_protocol_version : hi;
    *out = hi < MG_DF_VERSION ? hi : MG_DF_VERSION;
    if (lo > hi || *out < lo || *out < MG_DF_VERSION_MIN) {
        *out = hi;
        return -1;
    }
    return 0;
}

/* A tenant named by a peer: "" (the default) or a valid name. Fails the call otherwise. */
static int peer_tenant(mg_call *call, const char *tenant)
{
    if (tenant[0] == '\0' || mg_tenant_ok(tenant, strlen(tenant)))
        return 1;
    mg_call_fail(call, MG_ERR_INVALID, "tenant is 1..%d of [A-Za-z0-9._:-]", MG_TENANT_MAX);
    return 0;
}

static void open_session_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__OpenSessionRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_peer_svc *ps = peer_of(gw);
    Moongate__V1__OpenSessionResponse resp = MOONGATE__V1__OPEN_SESSION_RESPONSE__INIT;
    uint8_t token[MG_DF_TOKEN_BYTES];
    uint32_t version;
    int rc;
    if (ps == NULL || ps->server == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE,
                     "this daemon has no data plane (--data-listen \"\")");
        return;
    }
    if (version_pick(req, &version) != 0) {
        mg_call_fail(call, MG_ERR_UNSUPPORTED,
                     "data-plane protocol versions %u..%u (the caller's) and %u..%u (this "
                     "daemon's) do not overlap",
                     req->min_protocol_version ? req->min_protocol_version : version, version,
                     MG_DF_VERSION_MIN, MG_DF_VERSION);
        return;
    }
    if (!peer_tenant(call, req->tenant))
        return;
    rc = mg_dp_sessions_add(ps->sessions, req->tenant[0] ? req->tenant : "default",
                            mg_now_mono_ms(), gw->cfg->session_ttl * 1000, token);
    if (rc != 0) {
        if (rc == MG_ERR_FULL)
            mg_call_fail(call, rc, "%d data-plane sessions are open, the most a daemon keeps",
                         MAX_SESSIONS);
        else
            mg_call_fail(call, rc, "no random bytes for a session token (getrandom)");
        return;
    }
    resp.token.data = token;
    resp.token.len = sizeof(token);
    resp.data_host = ps->host;
    resp.data_port = (uint32_t)ps->port;
    resp.epoch = gw->epoch;
    resp.protocol_version = version;
    mg_info("peer_session_opened", "peer=%s identity=\"%s\" tenant=%s version=%u",
            mg_call_peer(call), mg_call_identity(call)[0] ? mg_call_identity(call) : "-",
            req->tenant[0] ? req->tenant : "default", version);
    resp.expires_in_ms = gw->cfg->session_ttl * 1000;
    resp.rdma = gw->rdma != NULL;
    resp.rdma_devices = (uint32_t)mg_rdma_device_count(gw->rdma);
    mg_call_reply(call, &resp.base);
}

/* What DescribeTarget says of a ready segment (its RDMA key for this authenticated peer). */
static void segment_desc(mg_gateway *gw, mg_segment_info *info,
                         Moongate__V1__TargetDescriptor *resp, char **transports)
{
    resp->id = info->id;
    resp->size = info->size;
    resp->remote_accessible = info->remote_accessible;
    resp->transports = transports;
    for (int t = 0; t < MG_TRANSPORT_COUNT; t++) {
        if (info->transports[t].registered)
            transports[resp->n_transports++] = (char *)mg_transport_names[t];
    }
    if (info->transports[MG_TRANSPORT_RDMA].registered) {
        resp->rdma_addr = info->transports[MG_TRANSPORT_RDMA].addr;
        resp->rdma_rkey = info->transports[MG_TRANSPORT_RDMA].rkey;
        resp->rdma_rkeys = info->rdma_rkeys;
        resp->n_rdma_rkeys = info->rdma_ndev;
    }
    resp->epoch = gw->epoch;
}

static void describe_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__DescribeTargetRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__TargetDescriptor resp = MOONGATE__V1__TARGET_DESCRIPTOR__INIT;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    char *transports[MG_TRANSPORT_COUNT];
    const char *tenant = req->tenant[0] ? req->tenant : "default";
    if (!peer_tenant(call, req->tenant))
        return;
    if (req->is_lease) { /* only remote-accessible leases are published */
        static char *tcp[] = {"tcp"}, *both[] = {"tcp", "rdma"};
        uint32_t rkeys[8];
        unsigned nkeys = 0;
        uint64_t addr = 0;
        if (gw->leases == NULL ||
            mg_lease_table_describe(gw->leases, req->id, tenant, &resp.size) != 0) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no remote-accessible lease %" PRIu64, req->id);
            return;
        }
        resp.id = req->id;
        resp.is_lease = 1;
        resp.remote_accessible = 1;
        resp.transports = tcp;
        resp.n_transports = 1;
        if (mg_pools_lease_rdma(gw->pools, req->id, &addr, rkeys, &nkeys) == 0 && nkeys > 0) {
            resp.transports = both; /* the lease's own key: it reaches nothing else */
            resp.n_transports = 2;
            resp.rdma_addr = addr;
            resp.rdma_rkey = rkeys[0];
            resp.rdma_rkeys = rkeys;
            resp.n_rdma_rkeys = nkeys;
        }
        resp.epoch = gw->epoch;
        mg_call_reply(call, &resp.base);
        return;
    }
    if (reg == NULL || mg_registry_find_target(reg, tenant, req->id, &info) != 0 ||
        info.state != MG_SEG_READY) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no segment %" PRIu64, req->id);
        return;
    }
    segment_desc(gw, &info, &resp, transports);
    mg_call_reply(call, &resp.base);
}

/* Ping: this daemon's epoch, and whether the agent named (if any) is here. */
static void ping_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__PeerAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__PeerPing resp = MOONGATE__V1__PEER_PING__INIT;
    mg_agent_ref ref = {.port = req->port};
    const mg_agent *ag;
    if (!peer_tenant(call, req->tenant))
        return;
    resp.epoch = gw->epoch;
    if (req->name[0] || req->port) {
        snprintf(ref.name, sizeof(ref.name), "%.*s", MG_AGENT_NAME_MAX, req->name);
        ag = mg_gateway_agent_find(gw, req->tenant[0] ? req->tenant : "default", &ref);
        resp.agent_present = ag != NULL;
        resp.agent_id = ag ? ag->id : 0;
    }
    mg_call_reply(call, &resp.base);
}

/* An agent of a tenant here, by name or port, with its regions' descriptors. */
static void describe_agent_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__PeerAgentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__PeerAgent resp = MOONGATE__V1__PEER_AGENT__INIT;
    const char *tenant = req->tenant[0] ? req->tenant : "default";
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_agent_ref ref = {.port = req->port};
    const mg_agent *ag;
    struct agent_region {
        Moongate__V1__PeerAgentRegion r;
        Moongate__V1__PeerAgentRegion *rp;
        Moongate__V1__TargetDescriptor t;
        char *transports[MG_TRANSPORT_COUNT];
        mg_segment_info info;
    } *v = NULL;
    mg_region regions[64];
    size_t n = 0, got;
    uint64_t after = 0, first = UINT64_MAX; /* the order of the one registered first */
    if (!peer_tenant(call, req->tenant))
        return;
    snprintf(ref.name, sizeof(ref.name), "%.*s", MG_AGENT_NAME_MAX, req->name);
    if ((ag = mg_gateway_agent_find(gw, tenant, &ref)) == NULL) { /* another tenant's: the same */
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no agent %s%s%s%.0u here", req->name[0] ? "\"" : "",
                     req->name, req->name[0] ? "\"" : "at port ", req->port);
        return;
    }
    resp.name = (char *)ag->name;
    resp.port = ag->port;
    resp.epoch = gw->epoch;
    resp.agent_id = ag->id;
    while (reg && ag->proc.pid > 0 && n <= MG_AGENT_REGIONS_MAX &&
           (got = mg_registry_regions(reg, tenant, &ag->proc, after, regions, 64)) > 0) {
        struct agent_region *grown = realloc(v, (n + got) * sizeof(*v));
        if (grown == NULL) {
            free(v);
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
            return;
        }
        v = grown;
        for (size_t i = 0; i < got; i++) {
            if (mg_registry_find_target(reg, tenant, regions[i].id, &v[n].info) != 0)
                continue; /* unregistered since: left out */
            if (n++ < MG_AGENT_REGIONS_MAX && regions[i].order < first) {
                first = regions[i].order; /* Mooncake's get_first_buffer_address */
                resp.first_address = regions[i].address;
            }
        }
        after = regions[got - 1].address;
    }
    resp.truncated = n > MG_AGENT_REGIONS_MAX;
    resp.n_regions = resp.truncated ? MG_AGENT_REGIONS_MAX : n;
    resp.regions = calloc(resp.n_regions + 1, sizeof(*resp.regions));
    if (resp.regions == NULL) {
        free(v);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    for (size_t i = 0; i < resp.n_regions; i++) {
        moongate__v1__peer_agent_region__init(&v[i].r);
        moongate__v1__target_descriptor__init(&v[i].t);
        segment_desc(gw, &v[i].info, &v[i].t, v[i].transports);
        v[i].r.address = v[i].info.client_addr;
        v[i].r.target = &v[i].t;
        resp.regions[i] = &v[i].r;
    }
    mg_call_reply(call, &resp.base);
    free(resp.regions);
    free(v);
}

/* ---- ConnectRdma: queue pairs for a peer's session, made and connected on a worker ---- */

typedef struct rdma_job {
    mg_call *call;
    mg_gateway *gw;
    uint8_t token[MG_DF_TOKEN_BYTES];
    uint64_t expires_ms;
    mg_rdma_ep remote, local;
    mg_rdma_conn *c;
    mg_rdma_conn *old[MAX_RCONNS]; /* expired or replaced: deleted on the worker first */
    size_t nold;
    int ran; /* the work ran (else the engine stopped first) */
    int device;
    int rc;
    char why[256];
} rdma_job;

static int rdma_work(void *arg)
{
    rdma_job *j = arg;
    j->ran = 1;
    for (size_t i = 0; i < j->nold; i++)
        mg_rdma_conn_del(j->old[i]);
    j->rc = mg_rdma_conn_new(j->gw->rdma, j->device, j->remote.nqps, &j->c, &j->local, j->why,
                             sizeof(j->why));
    if (j->rc == 0 &&
        (j->rc = mg_rdma_conn_connect(j->c, &j->remote, j->why, sizeof(j->why))) != 0) {
        mg_rdma_conn_del(j->c);
        j->c = NULL;
    }
    return j->rc;
}

static void rdma_done(void *arg, int result)
{
    rdma_job *j = arg;
    struct mg_peer_svc *ps = peer_of(j->gw);
    ps->rdma_jobs--;
    for (size_t i = 0; !j->ran && i < j->nold; i++) /* shutting down: teardown here */
        mg_rdma_conn_del(j->old[i]);
    if (!j->ran)
        snprintf(j->why, sizeof(j->why), "the daemon is stopping");
    if (result == 0 && j->c) {
        if (ps->nrconns < MAX_RCONNS) {
            struct rconn *rc = &ps->rconns[ps->nrconns++];
            memcpy(rc->token, j->token, sizeof(rc->token));
            rc->expires_ms = j->expires_ms;
            rc->c = j->c;
        } else { /* no room was made for it: never expected, but never leaked */
            mg_rdma_conn_del(j->c);
            result = MG_ERR_FULL;
            snprintf(j->why, sizeof(j->why), "%d RDMA connections are open", MAX_RCONNS);
        }
    }
    if (result == 0) {
        Moongate__V1__ConnectRdmaResponse resp = MOONGATE__V1__CONNECT_RDMA_RESPONSE__INIT;
        mg_rdma_wire w;
        mg_rdma_wire_encode(&j->local, &w);
        resp.endpoint = &w.msg;
        mg_info("rdma_connected", "peer=%s identity=\"%s\" device=%d qps=%u", mg_call_peer(j->call),
                mg_call_identity(j->call)[0] ? mg_call_identity(j->call) : "-", j->device,
                j->local.nqps);
        mg_call_reply(j->call, &resp.base);
    } else {
        mg_call_fail(j->call, result, "RDMA connection: %s", j->why);
    }
    mg_call_unref(j->call);
    free(j);
}

static void connect_rdma_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ConnectRdmaRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_peer_svc *ps = peer_of(gw);
    uint64_t now = mg_now_mono_ms(), expires = 0;
    rdma_job *j;
    int rc;
    if (ps == NULL || gw->rdma == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon has no RDMA device: %s",
                     gw->rdma_why[0] ? gw->rdma_why : "no data plane");
        return;
    }
    if (req->token.len != MG_DF_TOKEN_BYTES) {
        mg_call_fail(call, MG_ERR_INVALID, "the session token has %d bytes", MG_DF_TOKEN_BYTES);
        return;
    }
    if (mg_dp_sessions_find(ps->sessions, req->token.data, mg_now_mono_ms(), NULL, &expires) != 0) {
        mg_call_fail(call, MG_ERR_AUTH, "no such session (it expired, or this daemon restarted)");
        return;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    if (req->device >= (uint32_t)mg_rdma_device_count(gw->rdma)) {
        mg_call_fail(call, MG_ERR_INVALID, "this daemon has %d RDMA devices, no device %u",
                     mg_rdma_device_count(gw->rdma), req->device);
        free(j);
        return;
    }
    j->device = (int)req->device;
    if (mg_rdma_wire_decode(req->endpoint, &j->remote, j->why, sizeof(j->why)) != 0) {
        mg_call_fail(call, MG_ERR_INVALID, "%s", j->why);
        free(j);
        return;
    }
    /* Room: expired sessions' connections go, then, the table being full, one of the others. */
    for (size_t i = 0; i < ps->nrconns;) {
        if (ps->rconns[i].expires_ms <= now ||
            (ps->nrconns + ps->rdma_jobs >= MAX_RCONNS && i == 0)) {
            j->old[j->nold++] = ps->rconns[i].c;
            ps->rconns[i] = ps->rconns[--ps->nrconns];
        } else {
            i++;
        }
    }
    if (ps->nrconns + ps->rdma_jobs >= MAX_RCONNS) {
        mg_call_fail(call, MG_ERR_FULL, "%d RDMA connections are being made", MAX_RCONNS);
        for (size_t i = 0; i < j->nold; i++) /* teardown without a job: rare, and small */
            mg_rdma_conn_del(j->old[i]);
        free(j);
        return;
    }
    memcpy(j->token, req->token.data, MG_DF_TOKEN_BYTES);
    j->expires_ms = expires;
    j->gw = gw;
    j->call = call;
    mg_call_ref(call);
    rc = mg_engine_submit(gw->engine, gw->cq, rdma_work, rdma_done, j);
    if (rc != 0) {
        mg_call_unref(call);
        mg_call_fail(call, rc, "the engine's queue is full (--queue-depth)");
        for (size_t i = 0; i < j->nold; i++)
            mg_rdma_conn_del(j->old[i]);
        free(j);
        return;
    }
    ps->rdma_jobs++;
}

static void mg_svc_peer_get_stats(mg_gateway *gw, mg_dp_server_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (peer_of(gw) && peer_of(gw)->server)
        mg_dp_server_get_stats(peer_of(gw)->server, out);
}

/* ---- Peer/Checksum: the CRC32C of a range of a remote-accessible target here, on a worker
 * (moongate/checksum.h) ---- */

static void checksum_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__PeerChecksumRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_registry *reg = mg_engine_registry(gw->engine);
    const char *tenant = req->tenant[0] ? req->tenant : "default";
    char holder[MG_SEG_HOLDER_MAX];
    mg_segment_info info;
    mg_segment *seg;
    uint64_t base = 0, size;
    void *lease = NULL;
    if (!peer_tenant(call, req->tenant))
        return;
    snprintf(holder, sizeof(holder), "a digest check by %s", mg_call_peer(call));
    if (req->lease) { /* only remote-accessible leases, as DescribeTarget and the data plane */
        if (gw->pools == NULL || gw->leases == NULL ||
            mg_lease_table_describe(gw->leases, req->target, tenant, &size) != 0 ||
            mg_pools_use(gw->pools, tenant, req->target, holder, &seg, &base, &size, &lease)) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no remote-accessible lease %" PRIu64,
                         req->target);
            return;
        }
    } else {
        if (reg == NULL || mg_registry_acquire(reg, tenant, req->target, holder, &seg) != 0) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no segment %" PRIu64, req->target);
            return;
        }
        mg_segment_get_info(reg, seg, &info);
        size = info.size;
        if (!info.remote_accessible) {
            mg_registry_put(reg, seg);
            mg_call_fail(call, MG_ERR_PERMISSION, "segment %" PRIu64 " is not remote-accessible",
                         req->target);
            return;
        }
    }
    if (mg_bounds_check(size, req->offset, req->length) != 0) {
        mg_registry_put(reg, seg);
        mg_pools_unuse(gw->pools, lease);
        mg_call_fail(call, MG_ERR_RANGE,
                     "offset %" PRIu64 " + length %" PRIu64 " is outside the target's %" PRIu64
                     " bytes",
                     req->offset, req->length, size);
        return;
    }
    mg_gateway_checksum(call, seg, lease,
                        (const uint8_t *)mg_segment_addr(seg) + base + req->offset, req->length);
}

/* Debug/CorruptSlices (with --debug-service): the data plane corrupts the next checksummed
 * slices it serves, for the tests of digests. */
static void corrupt_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__CorruptRequest *req = (const void *)m;
    struct mg_peer_svc *ps = peer_of(mg_call_gateway(call));
    Moongate__V1__CorruptResponse resp = MOONGATE__V1__CORRUPT_RESPONSE__INIT;
    if (ps == NULL || ps->server == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon has no data plane (--data-listen)");
        return;
    }
    mg_dp_server_corrupt(ps->server, req->count);
    mg_call_reply(call, &resp.base);
}

static const mg_method corrupt_method[] = {
    MG_UNARY("/moongate.v1.Debug/CorruptSlices", &moongate__v1__corrupt_request__descriptor,
             &moongate__v1__corrupt_response__descriptor, corrupt_message),
};

static const mg_method peer_methods[] = {
    MG_PEER_UNARY("/moongate.v1.Peer/OpenSession", &moongate__v1__open_session_request__descriptor,
                  &moongate__v1__open_session_response__descriptor, open_session_message),
    MG_PEER_UNARY("/moongate.v1.Peer/DescribeTarget",
                  &moongate__v1__describe_target_request__descriptor,
                  &moongate__v1__target_descriptor__descriptor, describe_message),
    MG_PEER_UNARY("/moongate.v1.Peer/ConnectRdma", &moongate__v1__connect_rdma_request__descriptor,
                  &moongate__v1__connect_rdma_response__descriptor, connect_rdma_message),
    MG_PEER_UNARY("/moongate.v1.Peer/DescribeAgent", &moongate__v1__peer_agent_request__descriptor,
                  &moongate__v1__peer_agent__descriptor, describe_agent_message),
    MG_PEER_UNARY("/moongate.v1.Peer/Checksum", &moongate__v1__peer_checksum_request__descriptor,
                  &moongate__v1__checksum_response__descriptor, checksum_message),
    MG_PEER_UNARY("/moongate.v1.Peer/Ping", &moongate__v1__peer_agent_request__descriptor,
                  &moongate__v1__peer_ping__descriptor, ping_message),
};

static int mg_svc_peer_init(mg_gateway *gw)
{
    struct mg_peer_svc *ps;
    mg_dp_server_config dc;
    char err[256];
    int rc;
    if ((rc = mg_gateway_add_methods(gw, peer_methods, MG_NELEM(peer_methods), NULL, 0)) != 0)
        return rc;
    if (gw->cfg->debug_service &&
        (rc = mg_gateway_add_methods(gw, corrupt_method, 1, NULL, 0)) != 0)
        return rc;
    if (gw->cfg->data_listen[0] == '\0' || mg_engine_registry(gw->engine) == NULL)
        return 0;
    ps = calloc(1, sizeof(*ps));
    if (ps == NULL)
        return MG_ERR_NOMEM;
    *mg_gateway_state(gw, &mg_svc_peer) = ps;
    if ((rc = mg_dp_sessions_new(&ps->sessions, MAX_SESSIONS)) != 0)
        return rc;
    if (mg_split_host_port(gw->cfg->data_listen, ps->host, sizeof(ps->host), &ps->port) != 0) {
        mg_error("start_failed", "reason=\"--data-listen %s is not host:port\"",
                 gw->cfg->data_listen);
        return MG_ERR_INVALID;
    }
    memset(&dc, 0, sizeof(dc));
    dc.host = ps->host;
    dc.port = ps->port;
    dc.registry = mg_engine_registry(gw->engine);
    dc.leases = gw->leases;
    dc.max_slice = (uint32_t)gw->cfg->data_max_slice;
    dc.max_conns = (unsigned)gw->cfg->data_max_conns;
    dc.io_timeout_ms = (uint32_t)gw->cfg->data_io_timeout * 1000;
    dc.tcp = gw->cfg->data_tcp;
    dc.auth = mg_dp_sessions_auth;
    dc.auth_arg = ps->sessions;
    rc = mg_dp_server_start(&ps->server, &dc, err, sizeof(err));
    if (rc != 0) {
        mg_error("listen_failed", "kind=data addr=%s error=\"%s\"", gw->cfg->data_listen, err);
        return rc;
    }
    ps->port = mg_dp_server_port(ps->server);
    snprintf(gw->data_endpoint, sizeof(gw->data_endpoint), "%s%s%s:%d",
             strchr(ps->host, ':') ? "[" : "", ps->host, strchr(ps->host, ':') ? "]" : "",
             ps->port);
    {
        char cc[MG_DP_CONGESTION_MAX], sb[24] = "auto";
        mg_dp_server_congestion(ps->server, cc);
        if (gw->cfg->tcp_send_buffer != MG_CONFIG_AUTO)
            snprintf(sb, sizeof(sb), "%" PRIu64, gw->cfg->tcp_send_buffer);
        mg_info("listen", "addr=%s kind=data port=%d congestion=%s%s send_buffer=%s",
                gw->cfg->data_listen, ps->port, cc,
                gw->cfg->tcp_congestion[0] ? "" : " congestion_from=system", sb);
    }
    return 0;
}

static void mg_svc_peer_free(mg_gateway *gw)
{
    struct mg_peer_svc *ps = peer_of(gw);
    if (ps == NULL)
        return;
    mg_dp_server_stop(ps->server);           /* joins its threads: no slice runs after this */
    for (size_t i = 0; i < ps->nrconns; i++) /* the workers have stopped: teardown here */
        mg_rdma_conn_del(ps->rconns[i].c);
    mg_dp_sessions_del(ps->sessions);
    free(ps);
    *mg_gateway_state(gw, &mg_svc_peer) = NULL;
}

/* /metrics: the data plane. */
static void peer_metrics(mg_gateway *gw, struct evbuffer *out)
{
    mg_dp_server_stats ds;
    mg_svc_peer_get_stats(gw, &ds);
    evbuffer_add_printf(
        out,
        "# HELP moongate_data_conns Data-plane connections from peers.\n"
        "# TYPE moongate_data_conns gauge\nmoongate_data_conns %llu\n"
        "# HELP moongate_data_conns_total Data-plane connections accepted, and refused "
        "(--data-max-conns).\n# TYPE moongate_data_conns_total counter\n"
        "moongate_data_conns_total{result=\"accepted\"} %llu\n"
        "moongate_data_conns_total{result=\"refused\"} %llu\n"
        "# HELP moongate_data_accept_paused_total Times the data-plane listener paused "
        "accepting: no descriptor to spare.\n"
        "# TYPE moongate_data_accept_paused_total counter\n"
        "moongate_data_accept_paused_total %llu\n"
        "# HELP moongate_data_slices_total Data-plane slices served, by op, and refused.\n"
        "# TYPE moongate_data_slices_total counter\n"
        "moongate_data_slices_total{op=\"write\"} %llu\n"
        "moongate_data_slices_total{op=\"read\"} %llu\n"
        "moongate_data_slices_total{op=\"refused\"} %llu\n"
        "# HELP moongate_data_bytes_total Data-plane payload bytes, by direction.\n"
        "# TYPE moongate_data_bytes_total counter\n"
        "moongate_data_bytes_total{dir=\"in\"} %llu\n"
        "moongate_data_bytes_total{dir=\"out\"} %llu\n",
        (unsigned long long)ds.conns_active, (unsigned long long)ds.conns_total,
        (unsigned long long)ds.conns_refused, (unsigned long long)ds.accept_pauses,
        (unsigned long long)ds.slices_in, (unsigned long long)ds.slices_out,
        (unsigned long long)ds.slices_refused, (unsigned long long)ds.bytes_in,
        (unsigned long long)ds.bytes_out);
}

const mg_service mg_svc_peer = {
    .name = "peer", .init = mg_svc_peer_init, .metrics = peer_metrics, .free = mg_svc_peer_free};
