/*
 * moongate: the daemon. Reads the configuration, starts the engine's workers, then the gateway
 * on one libevent loop, and runs until SIGTERM/SIGINT has drained it (exit 0) or start-up fails
 * (exit 1 with the reason logged; 2 for a configuration error).
 */
#include "mg_config.h"
#include "mg_core.h"
#include "mg_log.h"
#include "mg_shm.h"
#include "moongate/engine.h"
#include "moongate/fault.h"
#include "moongate/rdma.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <openssl/ssl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Creates the shm directory if missing; with a group, hands it to the group, setgid and
 * group-writable, so members can make shm files there and they keep the group. */
static int prepare_shm_dir(const char *dir, unsigned gid)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        mg_error("start_failed", "shm_dir=%s error=\"%s\"", dir, strerror(errno));
        return -1;
    }
    if (gid && (chown(dir, (uid_t)-1, (gid_t)gid) != 0 || chmod(dir, 02770) != 0)) {
        mg_error("start_failed", "shm_dir=%s shm_group=%u error=\"%s\"", dir, gid, strerror(errno));
        return -1;
    }
    return 0;
}

/* RLIMIT_NOFILE up to its hard limit: connections, data-plane sockets and peers each take a
 * descriptor, and the soft limit a daemon inherits (often 1024) is meant for shells. */
static void raise_open_files_limit(void)
{
    struct rlimit rl;
    rlim_t was;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        mg_info("open_files_limit", "raised_from=%llu to=%llu", (unsigned long long)was,
                (unsigned long long)rl.rlim_max);
    else
        mg_warn("open_files_limit", "soft=%llu hard=%llu error=\"%s\"", (unsigned long long)was,
                (unsigned long long)rl.rlim_max, strerror(errno));
}

/* libevent's own messages, as logfmt lines of the daemon's log, at most 20 a second. */
static void libevent_log_cb(int severity, const char *msg)
{
    static uint64_t window_ns, lines, dropped;
    char q[512];
    uint64_t now = mg_now_mono_ns();
    mg_log_level level = severity == EVENT_LOG_DEBUG  ? MG_LOG_DEBUG
                         : severity == EVENT_LOG_MSG  ? MG_LOG_INFO
                         : severity == EVENT_LOG_WARN ? MG_LOG_WARN
                                                      : MG_LOG_ERROR;
    /* libevent logs from the loop thread and the engine's loops alike: count loosely */
    if (now - __atomic_load_n(&window_ns, __ATOMIC_RELAXED) > 1000000000ULL) {
        uint64_t d = __atomic_exchange_n(&dropped, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&window_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&lines, 0, __ATOMIC_RELAXED);
        if (d)
            mg_warn("libevent", "dropped=%llu note=\"lines over 20 a second\"",
                    (unsigned long long)d);
    }
    if (__atomic_add_fetch(&lines, 1, __ATOMIC_RELAXED) > 20) {
        __atomic_add_fetch(&dropped, 1, __ATOMIC_RELAXED);
        return;
    }
    mg_log(level, "libevent", "msg=%s", mg_log_quote(q, sizeof(q), msg));
}

/* A gateway that could not start names the cause: the first error logged (a listener's port in
 * use, a file it could not read), not only the code it came back with. */
static void say_start_failed(int rc)
{
    const char *first = mg_log_first_error();
    char q[600];
    if (first)
        mg_error("start_failed", "error=\"%s\" cause=%s", mg_strerror(rc),
                 mg_log_quote(q, sizeof(q), first));
    else
        mg_error("start_failed", "error=\"%s\"", mg_strerror(rc));
}

/* The last line. A daemon that did not end well repeats what went wrong first, so that the
 * last line of a failed start (kubectl logs --tail 1, a unit's status) names the cause. */
static void say_stopped(int exit_code)
{
    const char *first = exit_code ? mg_log_first_error() : NULL;
    char q[600];
    if (first)
        mg_info("stopped", "exit_code=%d cause=%s", exit_code, mg_log_quote(q, sizeof(q), first));
    else
        mg_info("stopped", "exit_code=%d", exit_code);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    mg_gateway *gw = arg;
    mg_info("signal", "signal=%s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mg_gateway_drain(gw);
}

/* Opens the RDMA devices, or says why TCP carries the bytes. Returns -1 only when RDMA is
 * required and unavailable. */
static int open_rdma(const mg_config *cfg, mg_rdma **out, char *why, size_t cap)
{
    mg_rdma_config rc = {cfg->ibverbs_lib, cfg->rdma_devices, (int)cfg->rdma_gid_index};
    if (cfg->ibverbs_lib[0] == '\0')
        snprintf(why, cap, "RDMA is off (--ibverbs-lib \"\")");
    else if (mg_rdma_open(out, &rc, why, cap) == 0) {
        for (int i = 0; i < mg_rdma_device_count(*out); i++) {
            mg_rdma_device_info d;
            mg_rdma_device(*out, i, &d);
            mg_info("rdma_device", "lib=%s device=%s port=%u mtu=%u link=%s gid=%s lid=%u",
                    mg_rdma_lib(*out), d.name, d.port, d.mtu, d.roce ? "roce" : "ib", d.gid, d.lid);
        }
        return 0;
    }
    if (cfg->require_rdma) {
        mg_error("rdma_required", "reason=\"%s\" hint=\"--require-rdma is set\"", why);
        return -1;
    }
    mg_info("rdma_unavailable", "reason=\"%s\" transport=tcp", why);
    return 0;
}

int main(int argc, char **argv)
{
    mg_config cfg;
    char err[512];
    struct event_base *base = NULL;
    struct event *sigterm = NULL, *sigint = NULL;
    mg_engine *engine = NULL, *io = NULL;
    mg_rdma *rdma = NULL;
    char rdma_why[300] = "";
    mg_gateway *gw = NULL;
    mg_log_level level;
    int rc, exit_code = 1, shm_lock = -1;
    unsigned shm_gid = 0;

    evthread_use_pthreads();
    event_set_log_callback(libevent_log_cb);
    signal(SIGPIPE, SIG_IGN);
    mg_fault_init(); /* SIGBUS in a guarded copy fails that copy (moongate/fault.h) */

    rc = mg_config_load(&cfg, argc, argv, stdout, err, sizeof(err));
    if (rc == MG_CONFIG_EXIT) {
        mg_config_free(&cfg);
        return 0;
    }
    if (rc != MG_CONFIG_OK) {
        fprintf(stderr, "moongate: %s\n", err);
        mg_config_free(&cfg);
        return 2;
    }
    if (strcmp(cfg.pool_overflow, "refuse") != 0 && strcmp(cfg.pool_overflow, "register") != 0) {
        fprintf(stderr, "moongate: --pool-overflow takes refuse or register, not \"%s\"\n",
                cfg.pool_overflow);
        mg_config_free(&cfg);
        return 2;
    }
    {
        mg_tenant_pool tp[16];
        if (mg_config_tenant_pools(cfg.tenant_pool, tp, 16, err, sizeof(err)) < 0) {
            fprintf(stderr, "moongate: --tenant-pool: %s\n", err);
            mg_config_free(&cfg);
            return 2;
        }
    }
    if (mg_config_memlock(cfg.memlock) < 0) {
        fprintf(stderr, "moongate: --memlock takes off, try or require, not \"%s\"\n", cfg.memlock);
        mg_config_free(&cfg);
        return 2;
    }
    if (mg_log_parse_level(cfg.log_level, &level) != 0) {
        fprintf(stderr, "moongate: --log-level takes debug, info, warn or error, not \"%s\"\n",
                cfg.log_level);
        mg_config_free(&cfg);
        return 2;
    }
    mg_log_set_level(level);
    OPENSSL_init_ssl(0, NULL);

    raise_open_files_limit();
    mg_info("starting", "version=%s workers=%llu io_threads=%llu queue_depth=%llu", MG_VERSION,
            (unsigned long long)cfg.workers, (unsigned long long)cfg.io_threads,
            (unsigned long long)cfg.queue_depth);
    if (cfg.shm_group[0] && mg_config_group(cfg.shm_group, &shm_gid) != 0) {
        mg_error("start_failed", "shm_group=%s reason=\"no such group\"", cfg.shm_group);
        goto out;
    }
    if (prepare_shm_dir(cfg.shm_dir, shm_gid) != 0)
        goto out;
    /* Held until exit, before the registry removes an earlier daemon's files from the
     * directory: those of a daemon still running are not "earlier". */
    if ((shm_lock = mg_shm_dir_lock(cfg.shm_dir, err, sizeof(err))) < 0) {
        char q[600];
        mg_error("start_failed", "shm_dir=%s reason=%s", cfg.shm_dir,
                 mg_log_quote(q, sizeof(q), err));
        goto out;
    }
    {
        char fs[160];
        int huge = mg_shm_pages(cfg.shm_dir, fs, sizeof(fs));
        /* every pass over a segment costs a TLB miss per page (docs/operations.md) */
        mg_log(huge == 0 ? MG_LOG_WARN : MG_LOG_INFO, "shm_pages", "dir=%s pages=%s fs=\"%s\"%s",
               cfg.shm_dir,
               huge == 1   ? "huge"
               : huge == 0 ? "4k"
                           : "unknown",
               fs,
               huge == 0 ? " hint=\"mount it tmpfs huge=within_size for large transfers\"" : "");
    }
    if (open_rdma(&cfg, &rdma, rdma_why, sizeof(rdma_why)) != 0)
        goto out;
    {
        mg_engine_config ec = {
            (unsigned)cfg.workers,
            (unsigned)cfg.queue_depth,
            {.shm_dir = cfg.shm_dir,
             .file_mode = (unsigned)cfg.shm_mode,
             .max_segments = cfg.max_segments,
             .max_registered_bytes = cfg.max_registered_bytes,
             .max_tenant_segments = cfg.max_tenant_segments,
             .max_tenant_bytes = cfg.max_tenant_bytes,
             .file_gid = shm_gid,
             .rdma = rdma,
             .process_memory_off = cfg.process_memory
                                       ? NULL
                                       : "process memory is off on this daemon "
                                         "(--process-memory=false; with the helm chart, "
                                         "processMemory.enabled=false)",
             .tcp_targets = cfg.data_listen[0] != '\0'}};
        mg_engine_config ic = {(unsigned)cfg.io_threads, (unsigned)cfg.queue_depth, {0}};
        rc = mg_engine_new(&engine, &ec);
        if (rc == 0)
            rc = mg_engine_new(&io, &ic);
        if (rc != 0) {
            mg_error("start_failed", "reason=\"engine: %s\"", mg_strerror(rc));
            goto out;
        }
    }
    base = event_base_new();
    if (base == NULL) {
        mg_error("start_failed", "reason=\"event_base_new\"");
        goto out;
    }
    {
        mg_gateway_parts parts = {engine, io, rdma, rdma_why};
        rc = mg_gateway_new(&gw, base, &cfg, &parts);
    }
    if (rc != 0) {
        say_start_failed(rc);
        goto out;
    }
    sigterm = evsignal_new(base, SIGTERM, signal_cb, gw);
    sigint = evsignal_new(base, SIGINT, signal_cb, gw);
    if (sigterm == NULL || sigint == NULL || evsignal_add(sigterm, NULL) != 0 ||
        evsignal_add(sigint, NULL) != 0) {
        mg_error("start_failed", "reason=\"signal handlers\"");
        goto out;
    }
    mg_gateway_set_serving(gw);
    exit_code = mg_gateway_run(gw); /* 1 when start-up work (the pool) failed */

out:
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    /* Workers stop after their current job; queued jobs complete as cancelled, and the
     * gateway drains its completion queue as it is freed, so every job's caller is released. */
    if (gw) {
        mg_gateway_stop_services(gw);
    }
    mg_engine_stop(io);
    mg_engine_stop(engine);
    mg_gateway_del(gw); /* drains the completions of the jobs the workers gave up */
    mg_engine_del(io);
    mg_engine_del(engine); /* its segments are deregistered from the devices as they go */
    mg_rdma_close(rdma);
    if (base) {
        /* Connections closed last still have deferred bufferevent callbacks: let them run so
         * the bufferevents are freed, not abandoned with the base. */
        event_base_loop(base, EVLOOP_NONBLOCK);
        event_base_free(base);
    }
    if (shm_lock >= 0)
        close(shm_lock); /* after the registry removed its files */
    say_stopped(exit_code);
    mg_config_free(&cfg);
    return exit_code;
}
