/*
 * mg_shared: what the core makes for every service and no service owns (mg_service.h): this
 * daemon's agents (moongate/agents.h), and the peer front — what peers said of their targets
 * and of their agents (the peer cache and the agent cache), and the peer directory
 * (moongate/peerdir.h) with its transfer scheduler, each entry holding the control channel
 * this daemon calls that peer on (mg_peer_rpc.h). The calls the directory itself asks for
 * (OpenSession, ConnectRdma) are made here; whoever runs the batches tells it what to do with
 * the requests that come back (mg_peerdir_set_batch_ops).
 *
 * Order: mg_shared_new runs before any service's init and makes the agents (with the ports
 * held for the agents of the daemon before, mg_agentfile.c), then the caches,
 * then the directory that uses them, so any service may use them from its init on.
 * mg_shared_close runs before any service's free: the directory takes no more work, the jobs
 * that came back run their completions while every service is still there, and the channels
 * end the calls still waiting (each caller hears, and sees the front closed). mg_shared_free
 * runs after every service's free. Without a segment registry there is no peer front. Loop
 * thread only.
 */
#include "mg_server_int.h"
#include "mg_service.h"

#include "mg_addr.h"
#include "mg_log.h"
#include "mg_peer_rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PEERS 1024 /* peer directory entries, and peers cached (each a line in /metrics) */

struct mg_shared {
    mg_agents *agents;
    mg_peer_cache *descs;        /* what peers said of their targets, per epoch */
    mg_agent_cache *agent_cache; /* what peers said of their agents, per epoch */
    mg_peerdir *dir;
    int closed;
};

/* ---- the agents ---- */

/* "LO-HI" of --agent-ports. Returns 0, or -1. */
static int port_range(const char *s, uint32_t *lo, uint32_t *hi)
{
    unsigned a, b;
    char tail;
    if (sscanf(s, "%u-%u%c", &a, &b, &tail) != 2 || a == 0 || a > b || b > 65535)
        return -1;
    *lo = a;
    *hi = b;
    return 0;
}

/* The daemon's own ports (never an agent's): its control, h2c and peer ports. */
static void own_ports(const mg_gateway *gw, uint32_t *out, size_t cap)
{
    const char *lists[] = {gw->cfg->listen, gw->cfg->h2c_listen, gw->cfg->data_listen};
    size_t n = 0;
    out[n++] = (uint32_t)gw->cfg->peer_port;
    for (size_t i = 0; i < MG_NELEM(lists) && n < cap; i++) {
        char host[256];
        int port;
        const char *comma = strchr(lists[i], ',');
        char first[300];
        snprintf(first, sizeof(first), "%.*s",
                 comma ? (int)(comma - lists[i]) : (int)strlen(lists[i]), lists[i]);
        if (mg_split_host_port(first, host, sizeof(host), &port) == 0 && port > 0)
            out[n++] = (uint32_t)port;
    }
}

static int agents_new(mg_gateway *gw, struct mg_shared *sh)
{
    mg_agents_config ac = {.max_agents = (size_t)gw->cfg->max_agents};
    int rc;
    if (port_range(gw->cfg->agent_ports, &ac.port_lo, &ac.port_hi) != 0) {
        mg_error("start_failed", "reason=\"--agent-ports %s is not LO-HI within 1..65535\"",
                 gw->cfg->agent_ports);
        return MG_ERR_INVALID;
    }
    own_ports(gw, ac.reserved, MG_NELEM(ac.reserved));
    if ((rc = mg_agents_new(&sh->agents, &ac)) != 0)
        return rc;
    return mg_agentfile_new(gw, sh->agents); /* the ports the daemon before had, held */
}

/* ---- the peer front ---- */

/* The directory's ops: the calls over mg_peer_rpc.c. */
static void open_session(void *arg, mg_xfer_peer *p)
{
    mg_peer_open_session(arg, p);
}

static int connect_rdma(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *job, char *why, size_t cap)
{
    return mg_peer_connect_rdma(arg, p, device, local, job, why, cap);
}

static int front_new(mg_gateway *gw, struct mg_shared *sh)
{
    const mg_config *cfg = gw->cfg;
    mg_peerdir_config pc = {.max_peers = MAX_PEERS,
                            .front_bytes = sizeof(mg_peer_chan),
                            .sched = {.workers = gw->engine,
                                      .io = gw->io,
                                      .cq = gw->cq,
                                      .worker_slots = (unsigned)cfg->workers,
                                      .io_slots = (unsigned)cfg->io_threads,
                                      .max_parts = (unsigned)cfg->tcp_conns_per_peer,
                                      .slice_bytes = cfg->slice_bytes},
                            .engine = gw->engine,
                            .cq = gw->cq,
                            .rdma = gw->rdma,
                            .rdma_why = gw->rdma_why,
                            .rdma_qps = (unsigned)cfg->rdma_qps_per_peer,
                            .io_timeout_ms = (uint32_t)cfg->data_io_timeout * 1000,
                            .crc = cfg->data_crc,
                            .send_buffer = cfg->data_tcp.send_buffer,
                            .arg = gw,
                            .open_session = open_session,
                            .connect_rdma = connect_rdma};
    char err[512];
    int rc;
    /* checked here, where it is needed even without a data listener of our own */
    if ((rc = mg_dp_congestion_check(cfg->tcp_congestion, err, sizeof(err))) != 0) {
        mg_error("start_failed", "reason=\"--tcp-congestion: %s\"", err);
        return rc;
    }
    if (mg_peer_cache_new(&sh->descs, MAX_PEERS, 4096) != 0 ||
        mg_agent_cache_new(&sh->agent_cache, 1024) != 0)
        return MG_ERR_NOMEM;
    pc.descs = sh->descs;
    snprintf(pc.congestion, sizeof(pc.congestion), "%s", cfg->tcp_congestion);
    return mg_peerdir_new(&sh->dir, &pc);
}

/* ---- the core's side ---- */

int mg_shared_new(mg_gateway *gw)
{
    struct mg_shared *sh = calloc(1, sizeof(*sh));
    int rc;
    if ((gw->core->shared = sh) == NULL)
        return MG_ERR_NOMEM;
    if ((rc = agents_new(gw, sh)) != 0)
        return rc;
    return mg_engine_registry(gw->engine) ? front_new(gw, sh) : 0;
}

void mg_shared_close(mg_gateway *gw)
{
    struct mg_shared *sh = gw->core->shared;
    if (sh == NULL || sh->dir == NULL || sh->closed)
        return;
    sh->closed = 1;            /* no new peer calls; answers to open ones are dropped */
    mg_peerdir_close(sh->dir); /* jobs coming back start no others */
    mg_cq_drain(gw->cq, 0);    /* their completions, while the services that wait are there */
    mg_peerdir_foreach (sh->dir, p)
        mg_peer_chan_free(mg_peer_chan_of(p));
}

void mg_shared_free(mg_gateway *gw)
{
    struct mg_shared *sh = gw->core->shared;
    if (sh == NULL)
        return;
    mg_peerdir_del(sh->dir);
    mg_peer_cache_del(sh->descs);
    mg_agent_cache_del(sh->agent_cache);
    mg_agentfile_free(gw);
    mg_agents_del(sh->agents);
    free(sh);
    gw->core->shared = NULL;
}

/* ---- what the services get (mg_service.h) ---- */

mg_agents *mg_gateway_agents(const mg_gateway *gw)
{
    return gw->core->shared ? gw->core->shared->agents : NULL;
}

mg_agent *mg_gateway_agent_find(const mg_gateway *gw, const char *tenant, const mg_agent_ref *ref)
{
    mg_agents *a = mg_gateway_agents(gw);
    if (a == NULL)
        return NULL;
    return ref->name[0] ? mg_agents_by_name(a, tenant, ref->name)
                        : mg_agents_by_port(a, tenant, ref->port);
}

mg_peerdir *mg_gateway_peers(const mg_gateway *gw)
{
    return gw->core->shared ? gw->core->shared->dir : NULL;
}

mg_peer_cache *mg_gateway_peer_cache(const mg_gateway *gw)
{
    return gw->core->shared ? gw->core->shared->descs : NULL;
}

mg_agent_cache *mg_gateway_agent_cache(const mg_gateway *gw)
{
    return gw->core->shared ? gw->core->shared->agent_cache : NULL;
}

int mg_gateway_peers_closed(const mg_gateway *gw)
{
    return gw->core->shared && gw->core->shared->closed;
}
