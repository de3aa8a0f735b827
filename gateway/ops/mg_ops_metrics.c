/*
 * mg_ops_metrics: Prometheus text exposition of what the gateway and the engine count, for the
 * /metrics page. Counters are plain integers written by the loop thread; this renderer runs on
 * the same thread. Engine figures come from mg_engine_get_stats(), which takes the engine's
 * lock briefly.
 */
#include "mg_ops.h"

#include "mg_core.h"
#include "mg_fdsock.h"
#include "moongate/procmem.h"

#include "moongate/pools.h"
#include "moongate/rdma.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "/pkg.Service/Method" -> service and method label values. */
static void split_path(const char *path, char *svc, size_t scap, char *meth, size_t mcap)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash && slash > path ? (size_t)(slash - path - 1) : 0;
    if (n >= scap)
        n = scap - 1;
    memcpy(svc, path + 1, n);
    svc[n] = '\0';
    snprintf(meth, mcap, "%s", slash ? slash + 1 : path);
}

/* The daemon itself: build, uptime, connections, HTTP/2, auth, descriptors. */
static void render_daemon(mg_gateway *gw, const mg_ops_counts *ops, struct evbuffer *out)
{
    static const char *const kinds[3] = {"tls", "h2c", "unix"};
    mg_gateway_stats gs;
    double uptime = (double)(mg_now_mono_ns() - gw->start_mono_ns) / 1e9;

    mg_gateway_get_stats(gw, &gs);
    evbuffer_add_printf(out,
                        "# HELP moongate_build_info Build information.\n"
                        "# TYPE moongate_build_info gauge\n"
                        "moongate_build_info{version=\"%s\"} 1\n"
                        "# HELP moongate_up_state Serving state: 0 starting, 1 serving, 2 "
                        "draining.\n# TYPE moongate_up_state gauge\nmoongate_up_state %d\n"
                        "# HELP moongate_uptime_seconds Seconds since start.\n"
                        "# TYPE moongate_uptime_seconds gauge\nmoongate_uptime_seconds %.3f\n",
                        MG_VERSION, (int)gw->state, uptime);
    evbuffer_add_printf(out, "# HELP moongate_connections_total Connections accepted.\n"
                             "# TYPE moongate_connections_total counter\n");
    for (int k = 0; k < 3; k++)
        evbuffer_add_printf(out, "moongate_connections_total{kind=\"%s\"} %llu\n", kinds[k],
                            (unsigned long long)gs.conns_total[k]);
    evbuffer_add_printf(
        out,
        "# HELP moongate_connections_active Open control connections.\n"
        "# TYPE moongate_connections_active gauge\nmoongate_connections_active %llu\n"
        "# HELP moongate_streams_active Open HTTP/2 streams.\n"
        "# TYPE moongate_streams_active gauge\nmoongate_streams_active %llu\n"
        "# HELP moongate_tls_handshake_errors_total Failed TLS handshakes.\n"
        "# TYPE moongate_tls_handshake_errors_total counter\n"
        "moongate_tls_handshake_errors_total %llu\n"
        "# HELP moongate_http2_protocol_errors_total Connections closed for HTTP/2 errors.\n"
        "# TYPE moongate_http2_protocol_errors_total counter\n"
        "moongate_http2_protocol_errors_total %llu\n"
        "# HELP moongate_rst_stream_received_total RST_STREAM frames from clients.\n"
        "# TYPE moongate_rst_stream_received_total counter\n"
        "moongate_rst_stream_received_total %llu\n"
        "# HELP moongate_goaway_sent_total GOAWAY frames sent.\n"
        "# TYPE moongate_goaway_sent_total counter\nmoongate_goaway_sent_total %llu\n"
        "# HELP moongate_unknown_method_calls_total Calls to methods the daemon does not serve.\n"
        "# TYPE moongate_unknown_method_calls_total counter\n"
        "moongate_unknown_method_calls_total %llu\n",
        (unsigned long long)gs.conns_active, (unsigned long long)gs.streams_active,
        (unsigned long long)gs.tls_handshake_errors, (unsigned long long)gs.protocol_errors,
        (unsigned long long)gs.rst_received, (unsigned long long)gs.goaway_sent,
        (unsigned long long)gs.unknown_method_calls);
    evbuffer_add_printf(
        out,
        "# HELP moongate_write_timeouts_total Connections closed because the client read "
        "nothing for --write-timeout while output waited.\n"
        "# TYPE moongate_write_timeouts_total counter\nmoongate_write_timeouts_total %llu\n"
        "# HELP moongate_auth_refused_total Calls refused before their handler: unauthenticated "
        "(no or unknown credentials), denied (a known identity without a tenant).\n"
        "# TYPE moongate_auth_refused_total counter\n"
        "moongate_auth_refused_total{reason=\"unauthenticated\"} %llu\n"
        "moongate_auth_refused_total{reason=\"denied\"} %llu\n"
        "# HELP moongate_rate_refused_total Calls refused: the tenant was over --tenant-rate.\n"
        "# TYPE moongate_rate_refused_total counter\nmoongate_rate_refused_total %llu\n"
        "# HELP moongate_auth_principals Principals in --auth-file as last loaded.\n"
        "# TYPE moongate_auth_principals gauge\nmoongate_auth_principals %zu\n"
        "# HELP moongate_reloads_total Changed files re-read and swapped in.\n"
        "# TYPE moongate_reloads_total counter\n"
        "moongate_reloads_total{file=\"auth\"} %llu\nmoongate_reloads_total{file=\"tls\"} %llu\n"
        "# HELP moongate_reload_errors_total Changed files that failed to load (the previous "
        "ones stay in use).\n"
        "# TYPE moongate_reload_errors_total counter\n"
        "moongate_reload_errors_total{file=\"auth\"} %llu\n"
        "moongate_reload_errors_total{file=\"tls\"} %llu\n"
        "# HELP moongate_open_files_limit The daemon's RLIMIT_NOFILE (raised to its hard limit "
        "at start).\n"
        "# TYPE moongate_open_files_limit gauge\nmoongate_open_files_limit %llu\n"
        "# HELP moongate_accept_paused_total Times the listeners paused accepting: no "
        "descriptor to spare.\n"
        "# TYPE moongate_accept_paused_total counter\nmoongate_accept_paused_total %llu\n"
        "# HELP moongate_accept_paused 1 while the listeners are paused for want of "
        "descriptors.\n"
        "# TYPE moongate_accept_paused gauge\nmoongate_accept_paused %d\n"
        "# HELP moongate_ops_connections_refused_total Ops-port connections closed at accept: "
        "--ops-max-connections were open.\n"
        "# TYPE moongate_ops_connections_refused_total counter\n"
        "moongate_ops_connections_refused_total %llu\n"
        "# HELP moongate_ops_header_timeouts_total Ops-port connections closed: their request "
        "was not whole within --ops-header-timeout.\n"
        "# TYPE moongate_ops_header_timeouts_total counter\n"
        "moongate_ops_header_timeouts_total %llu\n",
        (unsigned long long)gs.write_timeouts, (unsigned long long)gs.auth_unauthenticated,
        (unsigned long long)gs.auth_denied, (unsigned long long)gs.rate_refused, gs.auth_principals,
        (unsigned long long)gs.reloads[0], (unsigned long long)gs.reloads[1],
        (unsigned long long)gs.reload_errors[0], (unsigned long long)gs.reload_errors[1],
        (unsigned long long)gw->open_files_limit, (unsigned long long)gs.accept_pauses,
        gs.accept_paused, (unsigned long long)ops->refused,
        (unsigned long long)ops->header_timeouts);
}

/* Calls by method: started, handled by code, latency. */
static void render_methods(mg_gateway *gw, struct evbuffer *out)
{
    const mg_method *m;
    evbuffer_add_printf(out, "# HELP moongate_grpc_started_total Calls started, by method.\n"
                             "# TYPE moongate_grpc_started_total counter\n");
    for (size_t i = 0; (m = mg_gateway_method(gw, i)) != NULL; i++) {
        char svc[128], meth[64];
        split_path(m->path, svc, sizeof(svc), meth, sizeof(meth));
        evbuffer_add_printf(out,
                            "moongate_grpc_started_total{grpc_service=\"%s\",grpc_method=\"%s\"} "
                            "%llu\n",
                            svc, meth, (unsigned long long)mg_gateway_method_stats(gw, i)->started);
    }
    evbuffer_add_printf(out, "# HELP moongate_grpc_handled_total Calls finished, by method and "
                             "status code.\n# TYPE moongate_grpc_handled_total counter\n");
    for (size_t i = 0; (m = mg_gateway_method(gw, i)) != NULL; i++) {
        const mg_method_stats *s = mg_gateway_method_stats(gw, i);
        char svc[128], meth[64];
        split_path(m->path, svc, sizeof(svc), meth, sizeof(meth));
        for (int c = 0; c < MG_GRPC_CODE_COUNT; c++) {
            if (c != 0 && s->handled[c] == 0)
                continue; /* OK is always present; other codes once seen */
            evbuffer_add_printf(
                out,
                "moongate_grpc_handled_total{grpc_service=\"%s\",grpc_method=\"%s\","
                "grpc_code=\"%s\"} %llu\n",
                svc, meth, mg_grpc_code_name(c), (unsigned long long)s->handled[c]);
        }
    }
    evbuffer_add_printf(out, "# HELP moongate_grpc_handling_seconds Call latency, by method.\n"
                             "# TYPE moongate_grpc_handling_seconds histogram\n");
    for (size_t i = 0; (m = mg_gateway_method(gw, i)) != NULL; i++) {
        char svc[128], meth[64];
        uint64_t count = 0;
        const mg_method_stats *s = mg_gateway_method_stats(gw, i);
        split_path(m->path, svc, sizeof(svc), meth, sizeof(meth));
        for (int c = 0; c < MG_GRPC_CODE_COUNT; c++)
            count += s->handled[c];
        for (int b = 0; b < 12; b++)
            evbuffer_add_printf(out,
                                "moongate_grpc_handling_seconds_bucket{grpc_service=\"%s\","
                                "grpc_method=\"%s\",le=\"%g\"} %llu\n",
                                svc, meth, mg_call_seconds_le[b],
                                (unsigned long long)s->buckets[b]);
        evbuffer_add_printf(out,
                            "moongate_grpc_handling_seconds_bucket{grpc_service=\"%s\","
                            "grpc_method=\"%s\",le=\"+Inf\"} %llu\n"
                            "moongate_grpc_handling_seconds_sum{grpc_service=\"%s\","
                            "grpc_method=\"%s\"} %.6f\n"
                            "moongate_grpc_handling_seconds_count{grpc_service=\"%s\","
                            "grpc_method=\"%s\"} %llu\n",
                            svc, meth, (unsigned long long)count, svc, meth, s->seconds_sum, svc,
                            meth, (unsigned long long)count);
    }
}

/* The segment registry, and the unregistrations (every one ends in mg_gateway_unmap). */
static void render_segments(mg_gateway *gw, struct evbuffer *out)
{
    if (mg_engine_registry(gw->engine)) {
        mg_registry_stats rs;
        mg_gateway_stats gs;
        mg_registry_get_stats(mg_engine_registry(gw->engine), &rs);
        mg_gateway_get_stats(gw, &gs);
        evbuffer_add_printf(
            out,
            "# HELP moongate_segments Registered segments, by state.\n"
            "# TYPE moongate_segments gauge\n"
            "moongate_segments{state=\"ready\"} %llu\n"
            "moongate_segments{state=\"registering\"} %llu\n"
            "# HELP moongate_registered_bytes Bytes of the segments entered in the registry.\n"
            "# TYPE moongate_registered_bytes gauge\nmoongate_registered_bytes %llu\n"
            "# HELP moongate_locked_bytes Bytes of segments locked in memory.\n"
            "# TYPE moongate_locked_bytes gauge\nmoongate_locked_bytes %llu\n"
            "# HELP moongate_segment_jobs_total Segment map and unmap jobs, by the thread that "
            "ran them (anything but worker is a bug).\n"
            "# TYPE moongate_segment_jobs_total counter\n"
            "moongate_segment_jobs_total{thread=\"worker\"} %llu\n"
            "moongate_segment_jobs_total{thread=\"other\"} %llu\n",
            (unsigned long long)rs.segments, (unsigned long long)rs.registering,
            (unsigned long long)rs.bytes, (unsigned long long)rs.locked_bytes,
            (unsigned long long)(rs.jobs - rs.jobs_off_worker),
            (unsigned long long)rs.jobs_off_worker);
        evbuffer_add_printf(
            out,
            "# HELP moongate_segment_unregistrations_total Unregistrations that completed.\n"
            "# TYPE moongate_segment_unregistrations_total counter\n"
            "moongate_segment_unregistrations_total %llu\n",
            (unsigned long long)gs.unregistered_total);
    }
}

/* Client processes' own memory moved with process_vm (moongate/procmem.h). */
static void render_process_vm(struct evbuffer *out)
{
    uint64_t rd, wr;
    mg_procmem_bytes(&rd, &wr);
    evbuffer_add_printf(out,
                        "# HELP moongate_process_vm_bytes_total Bytes read from (op read) and "
                        "written into (op write) client processes' own memory.\n"
                        "# TYPE moongate_process_vm_bytes_total counter\n"
                        "moongate_process_vm_bytes_total{op=\"read\"} %llu\n"
                        "moongate_process_vm_bytes_total{op=\"write\"} %llu\n",
                        (unsigned long long)rd, (unsigned long long)wr);
    mg_segment_staged_bytes(&rd, &wr);
    evbuffer_add_printf(out,
                        "# HELP moongate_staged_bytes_total Bytes copied out of (op read) and "
                        "into (op write) GPU memory its own process stages (source STAGED).\n"
                        "# TYPE moongate_staged_bytes_total counter\n"
                        "moongate_staged_bytes_total{op=\"read\"} %llu\n"
                        "moongate_staged_bytes_total{op=\"write\"} %llu\n",
                        (unsigned long long)rd, (unsigned long long)wr);
}

/* Descriptors passed on the fd socket (mg_fdsock.h), when the daemon has one. */
static void render_fd_handles(mg_gateway *gw, struct evbuffer *out)
{
    mg_fd_handles *t = mg_fdsock_handles(gw);
    mg_fd_handles_stats st;
    if (t == NULL)
        return;
    mg_fd_handles_get_stats(t, &st);
    evbuffer_add_printf(out,
                        "# HELP moongate_fd_handles Passed descriptors waiting for the "
                        "registration that names them.\n"
                        "# TYPE moongate_fd_handles gauge\n"
                        "moongate_fd_handles{state=\"held\"} %llu\n"
                        "# HELP moongate_fd_handles_total Descriptors passed on the fd socket, "
                        "by what became of them.\n"
                        "# TYPE moongate_fd_handles_total counter\n"
                        "moongate_fd_handles_total{event=\"passed\"} %llu\n"
                        "moongate_fd_handles_total{event=\"claimed\"} %llu\n"
                        "moongate_fd_handles_total{event=\"expired\"} %llu\n"
                        "moongate_fd_handles_total{event=\"refused\"} %llu\n"
                        "moongate_fd_handles_total{event=\"discarded\"} %llu\n",
                        (unsigned long long)st.held, (unsigned long long)st.passed,
                        (unsigned long long)st.claimed, (unsigned long long)st.expired,
                        (unsigned long long)st.refused,
                        (unsigned long long)mg_fdsock_discarded(gw));
}

/* The engine's workers, the RDMA devices and the transport threads. */
static void render_engine(mg_gateway *gw, struct evbuffer *out)
{
    mg_engine_stats es;
    mg_engine_get_stats(gw->engine, &es);
    evbuffer_add_printf(
        out,
        "# HELP moongate_engine_workers Engine worker threads.\n"
        "# TYPE moongate_engine_workers gauge\nmoongate_engine_workers %u\n"
        "# HELP moongate_engine_queue_depth Engine jobs allowed queued or running.\n"
        "# TYPE moongate_engine_queue_depth gauge\nmoongate_engine_queue_depth %u\n"
        "# HELP moongate_engine_jobs_in_flight Engine jobs queued or running.\n"
        "# TYPE moongate_engine_jobs_in_flight gauge\nmoongate_engine_jobs_in_flight %u\n"
        "# HELP moongate_engine_jobs_submitted_total Engine jobs accepted.\n"
        "# TYPE moongate_engine_jobs_submitted_total counter\n"
        "moongate_engine_jobs_submitted_total %llu\n"
        "# HELP moongate_engine_jobs_rejected_total Engine jobs refused, queue full.\n"
        "# TYPE moongate_engine_jobs_rejected_total counter\n"
        "moongate_engine_jobs_rejected_total %llu\n"
        "# HELP moongate_engine_jobs_completed_total Engine jobs run.\n"
        "# TYPE moongate_engine_jobs_completed_total counter\n"
        "moongate_engine_jobs_completed_total %llu\n",
        es.workers, es.queue_depth, es.in_flight, (unsigned long long)es.submitted,
        (unsigned long long)es.rejected, (unsigned long long)es.completed);
    {
        int n = mg_rdma_device_count(gw->rdma);
        mg_rdma_stats rs = {0};
        if (gw->rdma)
            mg_rdma_get_stats(gw->rdma, &rs);
        evbuffer_add_printf(
            out,
            "# HELP moongate_rdma_devices RDMA devices in use (0: TCP carries every byte).\n"
            "# TYPE moongate_rdma_devices gauge\nmoongate_rdma_devices %d\n"
            "# HELP moongate_rdma_memory_regions Registrations with the RDMA devices.\n"
            "# TYPE moongate_rdma_memory_regions gauge\nmoongate_rdma_memory_regions %llu\n"
            "# HELP moongate_rdma_registered_bytes Bytes registered with the RDMA devices.\n"
            "# TYPE moongate_rdma_registered_bytes gauge\nmoongate_rdma_registered_bytes %llu\n"
            "# HELP moongate_rdma_registrations_failed_total RDMA registrations that failed.\n"
            "# TYPE moongate_rdma_registrations_failed_total counter\n"
            "moongate_rdma_registrations_failed_total %llu\n",
            n, (unsigned long long)rs.mrs, (unsigned long long)rs.mr_bytes,
            (unsigned long long)rs.reg_failed);
        if (n > 0)
            evbuffer_add_printf(out, "# HELP moongate_rdma_device RDMA devices and their ports.\n"
                                     "# TYPE moongate_rdma_device gauge\n");
        for (int i = 0; i < n; i++) {
            mg_rdma_device_info d;
            mg_rdma_device(gw->rdma, i, &d);
            evbuffer_add_printf(out,
                                "moongate_rdma_device{device=\"%s\",port=\"%u\",link=\"%s\","
                                "mtu=\"%u\"} 1\n",
                                d.name, d.port, d.roce ? "roce" : "ib", d.mtu);
        }
    }
    if (gw->io) {
        mg_engine_get_stats(gw->io, &es);
        evbuffer_add_printf(
            out,
            "# HELP moongate_transport_threads Transport threads (--io-threads).\n"
            "# TYPE moongate_transport_threads gauge\nmoongate_transport_threads %u\n"
            "# HELP moongate_transport_jobs_in_flight Transfer jobs queued or running on them.\n"
            "# TYPE moongate_transport_jobs_in_flight gauge\n"
            "moongate_transport_jobs_in_flight %u\n"
            "# HELP moongate_transport_jobs_completed_total Transfer jobs they ran.\n"
            "# TYPE moongate_transport_jobs_completed_total counter\n"
            "moongate_transport_jobs_completed_total %llu\n",
            es.workers, es.in_flight, (unsigned long long)es.completed);
    }
}

/* The buffer pools' families: values [first, first + count) of each pool's row, labelled with
 * keys[first..] when `label` is set. */
static const struct {
    const char *name, *type, *help, *label;
    size_t first, count;
} pool_families[] = {
    {"moongate_pool_bytes", "gauge", "The buffer pools' bytes, by what they are.", "kind", 0, 7},
    {"moongate_pool_fragmentation", "gauge", "1 - largest free range / free bytes.", NULL, 7, 1},
    {"moongate_pool_leases", "gauge", "Live leases.", NULL, 8, 1},
    {"moongate_pool_waiters", "gauge", "Blocking acquires waiting in line.", NULL, 9, 1},
    {"moongate_pool_lease_events_total", "counter", "Lease events.", "event", 10, 5},
};
static const char *const pool_keys[15] = {
    "capacity",      "reserve",  "in_use",  "free",      "largest_free",
    "largest_lease", "overflow", NULL,      NULL,        NULL,
    "acquired",      "released", "expired", "exhausted", "overflow"};

/* The engine's buffer pools: bytes, leases, lines of waiting acquires, lease events. */
static void render_pools(mg_gateway *gw, struct evbuffer *out)
{
    mg_pools_entry_info *e = calloc(1, sizeof(*e));
    size_t n = mg_pools_count(gw->pools);
    struct {
        const char *name;
        double v[15];
    } *rows = calloc(n + 1, sizeof(*rows));
    for (size_t i = 0; e && rows && i < n; i++) {
        const mg_pool_stats *ps = &e->stats;
        double frag;
        mg_pools_get(gw->pools, i, e); /* this pool's figures, then what is made of them */
        frag = ps->free ? 1.0 - (double)ps->largest_free / (double)ps->free : 0.0;
        rows[i].name = e->name; /* the set's own string */
        memcpy(rows[i].v,
               (const double[15]){ps->capacity, ps->reserve, ps->in_use, ps->free, ps->largest_free,
                                  ps->largest_lease, ps->overflow_bytes, frag, ps->leases,
                                  e->waiters, ps->acquired_total, ps->released_total,
                                  ps->expired_total, ps->exhausted_total, ps->overflow_total},
               sizeof(rows[i].v));
    }
    for (size_t f = 0; e && rows && n && f < sizeof(pool_families) / sizeof(pool_families[0]);
         f++) {
        const char *name = pool_families[f].name, *label = pool_families[f].label;
        size_t first = pool_families[f].first, end = first + pool_families[f].count;
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, pool_families[f].help, name,
                            pool_families[f].type);
        for (size_t i = 0; i < n; i++) {
            for (size_t k = first; k < end; k++) {
                char lab[64] = "";
                if (label)
                    snprintf(lab, sizeof(lab), ",%s=\"%s\"", label, pool_keys[k]);
                evbuffer_add_printf(out, "%s{pool=\"%s\"%s} %.17g\n", name, rows[i].name, lab,
                                    rows[i].v[k]);
            }
        }
    }
    free(e);
    free(rows);
}

void mg_ops_metrics(mg_gateway *gw, const mg_ops_counts *ops, struct evbuffer *out)
{
    render_daemon(gw, ops, out);
    render_methods(gw, out);
    render_segments(gw, out);
    render_pools(gw, out);
    render_fd_handles(gw, out);
    render_process_vm(out);
    mg_gateway_services_metrics(gw, out); /* each service's own block */
    render_engine(gw, out);
}
