/*
 * svc_daemon: moongate.v1.Daemon/Info: version, epoch, uptime, state, build features and the
 * data transports with the reason a transport is unavailable. Loop thread only; no blocking.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "moongate/rdma.h"
#include "moongate/v1/daemon.pb-c.h"

#include <stdio.h>
#include <string.h>

static void info_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__InfoResponse resp = MOONGATE__V1__INFO_RESPONSE__INIT;
    Moongate__V1__TransportInfo tcp = MOONGATE__V1__TRANSPORT_INFO__INIT;
    Moongate__V1__TransportInfo rdma = MOONGATE__V1__TRANSPORT_INFO__INIT;
    char devs[MG_RDMA_MAX_DEVICES][160], *devp[MG_RDMA_MAX_DEVICES];
    int ndev;
    Moongate__V1__TransportInfo pvm = MOONGATE__V1__TRANSPORT_INFO__INIT;
    Moongate__V1__TransportInfo *transports[3] = {&tcp, &rdma, &pvm};
    char *features[10];
    size_t nf = 0;
    mg_engine_stats es;
    char state[16];

    /* with --tls-cert the control port serves TLS: start-up fails without its context */
    features[nf++] = *gw->cfg->tls_cert ? "tls" : "no-tls";
    features[nf++] = "h2c";
    if (*gw->cfg->unix_socket)
        features[nf++] = "unix";
    features[nf++] = "json";
    features[nf++] = "reflection";
    features[nf++] = "health";
    if (gw->cfg->debug_service)
        features[nf++] = "debug-service";
#if defined(__SANITIZE_ADDRESS__)
    features[nf++] = "asan"; /* an AddressSanitizer build: mlock() is a no-op under it */
#endif
#if defined(__SANITIZE_THREAD__)
    features[nf++] = "tsan"; /* a ThreadSanitizer build: mlock() is a no-op under it too */
#endif

    mg_engine_get_stats(gw->engine, &es);
    resp.version = MG_VERSION;
    resp.epoch = gw->epoch;
    resp.uptime_ms = (mg_now_mono_ns() - gw->start_mono_ns) / 1000000ULL;
    resp.start_unix_ms = gw->start_unix_ms;
    snprintf(state, sizeof(state), "%s", mg_state_name(gw->state));
    resp.state = state;
    resp.features = features;
    resp.n_features = nf;
    tcp.name = "tcp";
    if (gw->data_endpoint[0]) {
        tcp.available = 1;
        tcp.endpoint = gw->data_endpoint;
    } else {
        tcp.available = 0;
        tcp.reason = "no data-plane listener (--data-listen \"\")";
    }
    rdma.name = "rdma";
    ndev = mg_rdma_device_count(gw->rdma);
    rdma.available = ndev > 0; /* peers with devices too are reached over it */
    for (int i = 0; i < ndev && i < MG_RDMA_MAX_DEVICES; i++) {
        mg_rdma_device_info d;
        mg_rdma_device(gw->rdma, i, &d);
        snprintf(devs[i], sizeof(devs[i]), "%s port %u mtu %u %s gid %s", d.name, d.port, d.mtu,
                 d.roce ? "roce" : "ib", d.gid);
        devp[i] = devs[i];
    }
    rdma.devices = devp;
    rdma.n_devices = (size_t)ndev;
    rdma.reason = ndev ? "" : gw->rdma_why;
    pvm.name = "process_vm"; /* clients' own memory, on this host (moongate/procmem.h) */
    pvm.available = gw->process_vm;
    pvm.reason = gw->process_vm_why;
    resp.transports = transports;
    resp.n_transports = 3;
    resp.workers = es.workers;
    resp.worker_queue_depth = es.queue_depth;
    resp.open_files_limit = gw->open_files_limit;
    resp.max_wait_ms = (uint64_t)gw->cfg->max_wait * 1000;
    mg_call_reply(call, &resp.base);
}

static const mg_method info_method =
    MG_UNARY("/moongate.v1.Daemon/Info", &moongate__v1__info_request__descriptor,
             &moongate__v1__info_response__descriptor, info_message);

static int mg_svc_daemon_init(mg_gateway *gw)
{
    return mg_gateway_add_method(gw, &info_method);
}

const mg_service mg_svc_daemon = {.name = "daemon", .init = mg_svc_daemon_init};
