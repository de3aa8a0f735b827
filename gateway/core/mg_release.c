/*
 * mg_release: segments the daemon lets go of on its own, and the unmap every unregistration
 * ends with. The core's, for every service (mg_service.h): the memory service unmaps what its
 * callers unregister, and releases a process's segments when the process exits and a GPU
 * segment's when its connection closes; the agent service an agent's regions when it ends.
 *
 * A segment registered as a process's own memory (source PROCESS) can serve no request once
 * that process has exited, so the daemon releases it then: one watch per process (a duplicate
 * of the segment's pidfd, readable when the process ends) holds the ids of its segments; when
 * it fires each is unregistered, and one still held by a request (which fails, the process
 * being gone) is tried again a second later. A segment unregistered before is simply not found.
 * Segments released for another reason (mg_gateway_release: an agent ended, a connection
 * closed) go the same way, without the pidfd. Loop thread only.
 */
#include "mg_server_int.h"
#include "mg_service.h"

#include "mg_log.h"

#include "moongate/v1/memory.pb-c.h"

#include "moongate/checksum.h"
#include "moongate/procmem.h"
#include "moongate/segment.h"

#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct mg_exit_watch {
    mg_gateway *gw;
    mg_proc proc;
    int pidfd; /* our own duplicate */
    struct event *ev;
    uint64_t *ids; /* its segments */
    size_t n, cap;
    const char *reason; /* why they go (a static string) */
    struct mg_exit_watch *next;
} exit_watch;

static exit_watch **watches(mg_gateway *gw)
{
    return &gw->core->exit_watches;
}

/* ---- the unmap every unregistration ends with ---- */

typedef struct unmap_job {
    mg_gateway *gw;
    mg_unregister_done_fn done;
    void *arg;
} unmap_job;

static void unmapped(void *arg, const mg_segment_info *info)
{
    unmap_job *j = arg;
    j->gw->core->stats.unregistered_total++;
    if (j->done)
        j->done(j->arg, info);
    else /* the daemon's own: nobody waits to hear it */
        mg_info("segment_unregistered", "id=%" PRIu64 " name=%s bytes=%" PRIu64, info->id,
                info->name, info->size);
    free(j);
}

int mg_gateway_unmap(mg_gateway *gw, mg_segment *seg, mg_unregister_done_fn done, void *arg)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    unmap_job *j = malloc(sizeof(*j));
    int rc;
    if (j == NULL) {
        mg_registry_restore(reg, seg);
        return MG_ERR_NOMEM;
    }
    *j = (unmap_job){gw, done, arg};
    if ((rc = mg_registry_unregister_async(reg, gw->engine, gw->cq, seg, unmapped, j)) != 0)
        free(j);
    return rc;
}

/* ---- releases ---- */

static void watch_free(exit_watch *w)
{
    exit_watch **pp = watches(w->gw);
    while (*pp && *pp != w)
        pp = &(*pp)->next;
    if (*pp)
        *pp = w->next;
    if (w->ev)
        event_free(w->ev);
    if (w->pidfd >= 0)
        close(w->pidfd);
    free(w->ids);
    free(w);
}

/* The process exited (or a second passed since a segment was still held): release what can be. */
static void exited(evutil_socket_t fd, short what, void *arg)
{
    exit_watch *w = arg;
    mg_registry *reg = mg_engine_registry(w->gw->engine);
    size_t kept = 0, released = 0;
    (void)fd;
    (void)what;
    for (size_t i = 0; i < w->n; i++) {
        char err[MG_SEG_ERROR_MAX];
        mg_segment *seg;
        int rc = mg_registry_unregister(reg, NULL, w->ids[i], &seg, err);
        if (rc == 0 && mg_gateway_unmap(w->gw, seg, NULL, NULL) == 0)
            released++;
        else if (rc == MG_ERR_BUSY || rc == 0) /* held, or no worker slot: later */
            w->ids[kept++] = w->ids[i];
    }
    if (released)
        mg_info("segments_released", "pid=%d count=%zu reason=\"%s\"", (int)w->proc.pid, released,
                w->reason);
    w->n = kept;
    if (kept == 0) {
        watch_free(w);
        return;
    }
    {
        struct timeval again = {1, 0};
        if (w->ev)
            event_free(w->ev);
        w->ev = evtimer_new(w->gw->base, exited, w);
        if (w->ev == NULL || evtimer_add(w->ev, &again) != 0)
            mg_warn("segments_release_failed", "pid=%d count=%zu reason=\"out of memory\"",
                    (int)w->proc.pid, kept);
    }
}

/* The watch of proc, made when it has none. */
static exit_watch *watch_of(mg_gateway *gw, const mg_procmem *pm)
{
    const mg_proc *proc = mg_procmem_proc(pm);
    exit_watch *w;
    for (w = *watches(gw); w; w = w->next) {
        if (w->proc.pid == proc->pid && w->proc.start == proc->start)
            return w;
    }
    if ((w = calloc(1, sizeof(*w))) == NULL)
        return NULL;
    w->gw = gw;
    w->proc = *proc;
    w->reason = "its process exited";
    w->pidfd = fcntl(mg_procmem_pidfd(pm), F_DUPFD_CLOEXEC, 0);
    w->ev = w->pidfd >= 0 ? event_new(gw->base, w->pidfd, EV_READ, exited, w) : NULL;
    if (w->ev == NULL || event_add(w->ev, NULL) != 0) {
        if (w->ev)
            event_free(w->ev);
        if (w->pidfd >= 0)
            close(w->pidfd);
        free(w);
        return NULL;
    }
    w->next = *watches(gw);
    *watches(gw) = w;
    return w;
}

void mg_gateway_watch_exit(mg_gateway *gw, mg_segment *seg)
{
    mg_procmem *pm = mg_segment_procmem(seg);
    mg_segment_info info;
    exit_watch *w;
    if (pm == NULL)
        return;
    mg_segment_get_info(mg_engine_registry(gw->engine), seg, &info);
    w = watch_of(gw, pm);
    if (w && w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4;
        uint64_t *ids = realloc(w->ids, cap * sizeof(*ids));
        if (ids) {
            w->ids = ids;
            w->cap = cap;
        }
    }
    if (w == NULL || w->n == w->cap) {
        mg_warn("segment_exit_watch_failed",
                "id=%" PRIu64 " reason=\"out of memory: released only when unregistered\"",
                info.id);
        return;
    }
    w->ids[w->n++] = info.id;
}

void mg_release_free(mg_gateway *gw)
{
    while (*watches(gw))
        watch_free(*watches(gw));
}

void mg_gateway_release(mg_gateway *gw, const mg_proc *proc, const uint64_t *ids, size_t n,
                        const char *reason)
{
    exit_watch *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->ids = malloc((n ? n : 1) * sizeof(*ids))) == NULL) {
        free(w);
        mg_warn("segments_release_failed", "pid=%d count=%zu reason=\"out of memory\"",
                (int)proc->pid, n);
        return;
    }
    memcpy(w->ids, ids, n * sizeof(*ids));
    w->n = w->cap = n;
    w->gw = gw;
    w->proc = *proc;
    w->pidfd = -1;
    w->reason = reason;
    w->next = *watches(gw);
    *watches(gw) = w;
    exited(-1, 0, w); /* what nobody holds goes now; the rest a second later */
}

/* ---- the CRC32C of a held range, answered as a ChecksumResponse ---- */

typedef struct {
    mg_call *call;
    uint64_t length;
} sum_call;

static void summed(void *arg, int result, uint32_t crc, const char *why)
{
    sum_call *sc = arg;
    Moongate__V1__ChecksumResponse resp = MOONGATE__V1__CHECKSUM_RESPONSE__INIT;
    if (mg_call_done(sc->call))
        ;
    else if (result != 0)
        mg_call_fail(sc->call, result, "reading the range: %s", why[0] ? why : "failed");
    else {
        resp.crc32c = crc;
        resp.length = sc->length;
        mg_call_reply(sc->call, &resp.base);
    }
    mg_call_unref(sc->call);
    free(sc);
}

void mg_gateway_checksum(mg_call *call, mg_segment *seg, void *lease, const uint8_t *p,
                         uint64_t length)
{
    mg_gateway *gw = mg_call_gateway(call);
    sum_call *sc = malloc(sizeof(*sc));
    int rc;
    if (sc == NULL) {
        mg_registry_put(mg_engine_registry(gw->engine), seg);
        mg_pools_unuse(gw->pools, lease);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    *sc = (sum_call){call, length};
    mg_call_ref(call);
    rc = mg_checksum_async(gw->engine, gw->cq, gw->pools, seg, lease, p, length, summed, sc);
    if (rc != 0) {
        mg_call_unref(call);
        free(sc);
        if (rc == MG_ERR_NOMEM)
            mg_call_fail(call, rc, NULL);
        else
            mg_call_fail(call, rc, "engine queue holds %u jobs (--queue-depth)",
                         (unsigned)gw->cfg->queue_depth);
    }
}
