/*
 * te_restore: an engine outlives its daemon. When the engine's connection breaks (the daemon was
 * killed, stopped or upgraded), a thread of the engine's own reconnects — trying again with a
 * back-off up to MOONGATE_RECONNECT_BACKOFF_MS (default 1000 ms), for at most
 * MOONGATE_RECONNECT_S seconds (default 30; 0: never) — and makes again what the engine had made
 * on the daemon: its agent, with the same name and port, then each region it registered, in the
 * order registered. Callers' calls wait meanwhile (they would meet a daemon that does not know
 * them yet); transfers that were on their way fail, as their Submit calls ended. If the daemon
 * does not come back in time, or comes back refusing the engine's token (said once, not tried
 * again), calls fail with that reason until the connection breaks again.
 */
#include "te_internal.h"

#include "moongate/v1/daemon.pb-c.h"

#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TE_INFO_MS 5000 /* the time an Info call gets when no bound limits it */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The daemon's epoch (Daemon/Info). Returns a gRPC status, msg set. */
static int daemon_epoch(te_engine *e, uint64_t timeout_ms, uint64_t *epoch, char *msg, size_t cap)
{
    Moongate__V1__InfoRequest q = MOONGATE__V1__INFO_REQUEST__INIT;
    Moongate__V1__InfoResponse *info;
    uint8_t *resp = NULL;
    size_t len = 0;
    int st = te_call_run(e, "/moongate.v1.Daemon/Info", &q.base, timeout_ms, &resp, &len, msg, cap);
    if (st != 0)
        return st;
    info = moongate__v1__info_response__unpack(NULL, len, resp);
    free(resp);
    if (info == NULL) {
        snprintf(msg, cap, "the daemon's InfoResponse did not decode");
        return MG_GRPC_INTERNAL;
    }
    *epoch = info->epoch;
    moongate__v1__info_response__free_unpacked(info, NULL);
    return 0;
}

void te_restore_init(te_engine *e)
{
    char msg[512];
    if (mg_client_reconnect_env(&e->bound_ms, &e->backoff_ms, msg, sizeof(msg)) != 0)
        te_log("%s", msg);
    if (daemon_epoch(e, TE_INFO_MS, &e->epoch, msg, sizeof(msg)) != 0)
        e->epoch = 0;
    e->sock_owner = mg_client_socket_owner(e->target);
}

void te_gate(te_engine *e)
{
    pthread_mutex_lock(&e->mu);
    while (e->restoring && !pthread_equal(pthread_self(), e->restorer) && !e->quit)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* Whether the engine is being destroyed (the restorer then ends at its next step). */
static int quitting(te_engine *e)
{
    int q;
    pthread_mutex_lock(&e->mu);
    q = e->quit;
    pthread_mutex_unlock(&e->mu);
    return q;
}

/* Connects again until the daemon answers Info, or the bound passes, or it refuses us. Returns
 * 0 with the epoch, else -1 with e->gone set. */
static int reconnect(te_engine *e, uint64_t *epoch)
{
    uint64_t deadline = mono_ms() + (e->retry_once ? 0 : e->bound_ms), wait_ms = 50, left, info_ms;
    char msg[512];
    int st = MG_GRPC_UNAVAILABLE;
    for (;;) {
        if (quitting(e))
            return -1;
        left = deadline > mono_ms() ? deadline - mono_ms() : 0;
        /* whose daemon is there, before the token goes to it */
        if (e->sock_owner >= 0 && mg_client_socket_owner(e->target) >= 0 &&
            mg_client_socket_owner(e->target) != e->sock_owner) {
            pthread_mutex_lock(&e->mu);
            snprintf(e->gone, sizeof(e->gone),
                     "the daemon came back on %s as another user's (the socket is uid %ld's, was "
                     "uid %ld's): refused, this engine makes nothing there",
                     e->target + 5, mg_client_socket_owner(e->target), e->sock_owner);
            e->fatal = 1;
            pthread_mutex_unlock(&e->mu);
            return -1;
        }
        st = te_call_reconnect(e, msg, sizeof(msg));
        /* Info's time: what is left of the bound, at most 1 s; the one try after giving up has
         * no bound left and gets an Info's usual time (1 ms failed it on a busy machine) */
        info_ms = e->retry_once ? TE_INFO_MS : left < 1000 ? (left ? left : 1) : 1000;
        if (st == 0 && !quitting(e))
            st = daemon_epoch(e, info_ms, epoch, msg, sizeof(msg));
        if (st == 0)
            return 0;
        if (st == MG_GRPC_UNAUTHENTICATED || st == MG_GRPC_PERMISSION_DENIED) {
            pthread_mutex_lock(&e->mu);
            snprintf(e->gone, sizeof(e->gone),
                     "the daemon came back and refuses this engine's credentials (%s: %s); not "
                     "tried again",
                     mg_grpc_code_name(st), msg);
            e->fatal = 1;
            pthread_mutex_unlock(&e->mu);
            return -1;
        }
        if (mono_ms() >= deadline) {
            pthread_mutex_lock(&e->mu);
            if (!e->retry_once || e->gone[0] == '\0')
                snprintf(e->gone, sizeof(e->gone),
                         "the daemon did not come back within MOONGATE_RECONNECT_S=%.3g s (last: "
                         "%.400s); calls fail until it does",
                         (double)e->bound_ms / 1000, msg);
            pthread_mutex_unlock(&e->mu);
            return -1;
        }
        {
            struct timespec ts = {(time_t)(wait_ms / 1000), (long)(wait_ms % 1000) * 1000000};
            nanosleep(&ts, NULL);
        }
        wait_ms = wait_ms * 2 > e->backoff_ms ? e->backoff_ms : wait_ms * 2;
    }
}

/* The restorer: the agent, then each region, made again. */
static void *restore_main(void *arg)
{
    te_engine *e = arg;
    uint64_t t0 = mono_ms(), epoch = 0;
    size_t made = 0, n;
    char msg[512];
    int st;
    if (reconnect(e, &epoch) == 0 && !quitting(e)) {
        if ((st = te_register_agent(e, e->port, msg, sizeof(msg))) != 0)
            te_log("after the daemon came back, agent \"%s\" (port %u) could not be made again: "
                   "%s",
                   e->name, e->port, msg);
        pthread_mutex_lock(&e->mu);
        n = e->n_regions;
        pthread_mutex_unlock(&e->mu);
        for (size_t k = 0; k < n && !quitting(e); k++) {
            if ((st = te_register_again(e, k, msg, sizeof(msg))) == 0)
                made++;
            else
                te_log("after the daemon came back, region %zu could not be registered again: %s",
                       k, msg);
        }
        te_log("daemon %s (epoch %016llx): agent \"%s\" (port %u) and %zu of %zu regions made "
               "again in %llu ms",
               epoch != e->epoch ? "restarted" : "reconnected", (unsigned long long)epoch, e->name,
               e->port, made, n, (unsigned long long)(mono_ms() - t0));
        pthread_mutex_lock(&e->mu);
        e->restarts += epoch != e->epoch;
        e->epoch = epoch;
        e->gone[0] = '\0';
        pthread_mutex_unlock(&e->mu);
    } else if (e->gone[0] && !e->retry_once) {
        te_log("%s", e->gone);
    }
    pthread_mutex_lock(&e->mu);
    e->restoring = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* With e->mu held: starts the restorer, unless one runs or there is no point; once: one try
 * (a call after the engine gave up). Returns 1 when it started. */
static int start_restorer(te_engine *e, int once)
{
    if (e->stopping || e->quit || e->restoring || e->fatal || e->bound_ms == 0 || !e->running)
        return 0;
    if (e->restorer_joinable) /* the last one ended: let it go */
        pthread_join(e->restorer, NULL);
    e->restorer_joinable = 0;
    e->restoring = 1;
    e->retry_once = once;
    if (pthread_create(&e->restorer, NULL, restore_main, e) != 0) {
        e->restoring = 0;
        return 0;
    }
    e->restorer_joinable = 1;
    return 1;
}

void te_retry(te_engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->gone[0] && !(e->restorer_joinable && pthread_equal(pthread_self(), e->restorer)))
        start_restorer(e, 1);
    pthread_mutex_unlock(&e->mu);
}

void te_broken(void *arg, const char *why)
{
    te_engine *e = arg;
    int start;
    pthread_mutex_lock(&e->mu);
    e->gone[0] = '\0';
    start = start_restorer(e, 0);
    pthread_mutex_unlock(&e->mu);
    if (start)
        te_log("the connection to the daemon broke (%s): reconnecting (MOONGATE_RECONNECT_S=%.3g)",
               why, (double)e->bound_ms / 1000);
}

void te_restore_stop(te_engine *e)
{
    int join;
    pthread_mutex_lock(&e->mu);
    e->quit = 1; /* the loop still runs: the restorer's calls end */
    pthread_cond_broadcast(&e->cv);
    join = e->restorer_joinable;
    e->restorer_joinable = 0;
    pthread_mutex_unlock(&e->mu);
    if (join)
        pthread_join(e->restorer, NULL);
}
