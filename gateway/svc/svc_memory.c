/*
 * svc_memory: moongate.v1.Memory — RegisterSegment(s), UnregisterSegment(s), GetSegment and
 * ListSegments over the engine's segment registry (moongate/segment.h). The inline byte calls,
 * ReadSegment and WriteSegment, are in svc_memory_io.c.
 *
 * The loop only does bookkeeping: Register reserves the segment on the loop, maps it in an
 * engine job (create or open, size, mmap, mlock, prefault) and commits when the job comes back;
 * Unregister marks the segment on the loop and unmaps it in a job. A registration whose caller is
 * gone when its job returns is undone (unmapped in another job), so nothing is left that nobody
 * asked for. Every segment belongs to the caller's tenant (mg_call_tenant); another tenant's id
 * is NOT_FOUND, as if it did not exist, except to admins (mg_call_scope).
 */
#include "svc_memory.h"
#include "mg_service.h"

#include "mg_log.h"

#include "mg_fdsock.h"
#include "mg_str.h"
#include "moongate/segment.h"
#include "moongate/v1/memory.pb-c.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_DEFAULT 100
#define LIST_MAX     1000

/* One Segment message with its strings. */
typedef struct {
    Moongate__V1__Segment msg;
    char name[MG_SEG_NAME_MAX + 1], tenant[MG_SEG_NAME_MAX + 1], location[16], path[4097];
    char *transports[MG_TRANSPORT_COUNT];
    char share[MG_SEG_SHARE_LEN + 1]; /* the share list, split in place */
    char *shared[MG_SEG_SHARE_MAX];
} seg_msg;

static void seg_msg_fill(seg_msg *m, const mg_segment_info *in)
{
    moongate__v1__segment__init(&m->msg);
    snprintf(m->name, sizeof(m->name), "%s", in->name);
    snprintf(m->tenant, sizeof(m->tenant), "%s", in->tenant);
    snprintf(m->location, sizeof(m->location), "%s", in->location);
    snprintf(m->path, sizeof(m->path), "%s", in->path);
    m->msg.id = in->id;
    m->msg.name = m->name;
    m->msg.tenant = m->tenant;
    m->msg.size = in->size;
    m->msg.location = m->location;
    m->msg.path = m->path;
    m->msg.source = (Moongate__V1__SegmentSource)in->source; /* the same numbers */
    m->msg.offset = in->offset;
    m->msg.client_address = in->client_addr;
    m->msg.remote_accessible = in->remote_accessible;
    m->msg.locked = in->locked;
    m->msg.state = (Moongate__V1__SegmentState)in->state;
    m->msg.holders = in->refs;
    m->msg.transports = m->transports;
    for (int t = 0; t < MG_TRANSPORT_COUNT; t++) {
        if (in->transports[t].registered)
            m->transports[m->msg.n_transports++] = (char *)mg_transport_names[t];
    }
    snprintf(m->share, sizeof(m->share), "%s", in->share);
    m->msg.shared_with = m->shared;
    for (char *p = m->share, *save = NULL, *t; (t = strtok_r(p, ",", &save)) != NULL; p = NULL)
        if (m->msg.n_shared_with < MG_SEG_SHARE_MAX)
            m->shared[m->msg.n_shared_with++] = t;
}

/* ---- jobs ---- */

typedef struct {
    mg_call *call; /* NULL for an undo job nobody waits for */
    mg_gateway *gw;
    mg_segment *seg;
    uint64_t t0_ns;
} seg_job;

/* A registration ended: err 0 or MG_ERR_*; `on_worker` when it was counted in flight (it then
 * spent `seconds` there), 0 when it was refused before. */
static void count_registration(mg_gateway *gw, int err, double seconds, int on_worker)
{
    mg_segment_stats *s = &memory_of(gw)->stats;
    if (on_worker)
        s->in_flight--;
    if (err != 0) {
        s->failed_total[mg_err_grpc(err)]++;
        return;
    }
    s->registered_total++;
    mg_metrics_observe_seconds(s->buckets, &s->seconds_sum, seconds);
}

/* An unregistration a caller asked for ended: its answer. */
static void unregistered(void *arg, const mg_segment_info *info)
{
    mg_call *call = arg;
    if (!mg_call_done(call)) {
        Moongate__V1__UnregisterResponse resp = MOONGATE__V1__UNREGISTER_RESPONSE__INIT;
        mg_call_reply(call, &resp.base);
    }
    mg_call_unref(call);
    mg_info("segment_unregistered", "id=%" PRIu64 " name=%s bytes=%" PRIu64, info->id, info->name,
            info->size);
}

/* Unmaps a segment already marked UNREGISTERING (mg_gateway_unmap), answering `call` (NULL:
 * nobody waits) once it is gone. Returns 0, or an MG_ERR_* with the segment still registered. */
static int unmap(mg_gateway *gw, mg_segment *seg, mg_call *call)
{
    int rc;
    if (call == NULL)
        return mg_gateway_unmap(gw, seg, NULL, NULL);
    mg_call_ref(call);
    if ((rc = mg_gateway_unmap(gw, seg, unregistered, call)) != 0)
        mg_call_unref(call);
    return rc;
}

/* GPU memory lives as long as the connection that registered it (its agent's too): the device
 * keeps a dma-buf's pages while the daemon holds it, so a caller that goes must not leave it. */
typedef struct gpu_bind {
    mg_conn_bind b;
    mg_gateway *gw;
    mg_proc proc;
    uint64_t id;
} gpu_bind;

static void gpu_conn_closed(mg_conn_bind *b)
{
    gpu_bind *g = (gpu_bind *)b;
    mg_gateway_release(g->gw, &g->proc, &g->id, 1, "its connection closed");
    free(g);
}

static void bind_gpu(mg_gateway *gw, mg_call *call, const mg_segment_info *info)
{
    gpu_bind *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        mg_warn("segment_bind_failed",
                "id=%" PRIu64 " reason=\"out of memory: released only when unregistered\"",
                info->id);
        return;
    }
    g->b.closed = gpu_conn_closed;
    g->gw = gw;
    g->proc.pid = info->client_pid;
    g->id = info->id;
    if (mg_call_bind(call, &g->b) != 0)
        gpu_conn_closed(&g->b); /* the caller is gone already */
}

/* A registration ended: answer the call, or undo it when the caller is gone. */
static void registered(void *arg, mg_segment *seg, int result, const char *why)
{
    seg_job *j = arg;
    mg_gateway *gw = j->gw;
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];

    count_registration(gw, result, (double)(mg_now_mono_ns() - j->t0_ns) / 1e9, 1);
    mg_call_set_data(j->call, NULL);
    if (result != 0) {
        if (!mg_call_done(j->call))
            mg_call_fail(j->call, result, "%s", why[0] ? why : "registration cancelled");
        goto out;
    }
    mg_segment_get_info(reg, seg, &info);
    if (mg_call_done(j->call)) {
        /* The caller is gone: undo, so no segment is left that nobody asked for. */
        mg_segment *gone;
        if (mg_registry_unregister(reg, info.tenant, info.id, &gone, err) == 0 &&
            unmap(gw, gone, NULL) != 0) {
            /* No worker slot: the loop does not unmap. The segment stays, listed. */
            mg_warn("segment_rollback_failed",
                    "id=%" PRIu64 " name=%s reason=\"caller gone, engine queue full\"", info.id,
                    info.name);
            goto out;
        }
        mg_info("segment_rolled_back", "id=%" PRIu64 " name=%s reason=\"caller gone\"", info.id,
                info.name);
        goto out;
    }
    {
        Moongate__V1__RegisterResponse resp = MOONGATE__V1__REGISTER_RESPONSE__INIT;
        seg_msg m;
        seg_msg_fill(&m, &info);
        resp.segment = &m.msg;
        mg_call_reply(j->call, &resp.base);
        mg_gateway_watch_exit(gw, seg); /* a process's memory goes with its process */
        if (mg_segment_caps(seg) & MG_SEG_CAP_CONN)
            bind_gpu(gw, j->call, &info);
        mg_info("segment_registered",
                "id=%" PRIu64 " name=%s source=%s bytes=%" PRIu64 " locked=%d ms=%.3f", info.id,
                info.name, mg_seg_source_name(info.source), info.size, info.locked,
                (double)(mg_now_mono_ns() - j->t0_ns) / 1e6);
    }
out:
    mg_call_unref(j->call);
    free(j);
}

/* ---- handlers ---- */

/* Checks a request of `call` and reserves its segment. Returns 0, or an MG_ERR_* with err set. */
static int reserve(mg_registry *reg, mg_call *call, const Moongate__V1__RegisterRequest *req,
                   int memlock_policy, mg_segment **seg, char *err)
{
    const char *tenant = mg_call_tenant(call);
    mg_segment_spec spec;
    char share[MG_SEG_SHARE_LEN + 1] = "";
    int rc;
    memset(&spec, 0, sizeof(spec));
    spec.source = (mg_seg_source)req->source; /* the engine's kinds have the proto's numbers */
    if (mg_seg_source_name(spec.source) == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX, "source must be ANON, SHM, FD, PROCESS, DMABUF or STAGED");
        return MG_ERR_INVALID;
    }
    if (!(mg_seg_source_caps(spec.source) & MG_SEG_CAP_FD) && (req->fd_handle || req->offset)) {
        snprintf(err, MG_SEG_ERROR_MAX, "fd_handle and offset are for sources FD and DMABUF only");
        return MG_ERR_INVALID;
    }
    spec.tenant = tenant;
    spec.name = req->name;
    spec.size = req->size;
    spec.offset = req->offset;
    spec.shm_file = req->shm_file;
    spec.caller_uid_known = mg_call_socket_uid(call, &spec.caller_uid);
    if ((spec.client_addr = req->client_address) != 0) {
        uint32_t uid;
        if (!mg_call_socket_cred(call, &uid, &spec.client)) {
            spec.client.pid = 0; /* the registry says why an address needs a local process */
        } else if (mg_seg_source_caps(spec.source) & MG_SEG_CAP_CALLER) {
            spec.caller_uid_known = 1; /* the memory's process must run as the socket's uid */
            spec.caller_uid = uid;
        }
    }
    spec.location = req->location;
    spec.remote_accessible = req->remote_accessible;
    switch (req->memlock) {
    case MOONGATE__V1__MEMLOCK__MEMLOCK_DEFAULT:
        spec.memlock = (mg_memlock)memlock_policy;
        break;
    case MOONGATE__V1__MEMLOCK__MEMLOCK_OFF:
        spec.memlock = MG_MEMLOCK_OFF;
        break;
    case MOONGATE__V1__MEMLOCK__MEMLOCK_TRY:
        spec.memlock = MG_MEMLOCK_TRY;
        break;
    case MOONGATE__V1__MEMLOCK__MEMLOCK_REQUIRE:
        spec.memlock = MG_MEMLOCK_REQUIRE;
        break;
    default:
        snprintf(err, MG_SEG_ERROR_MAX, "memlock must be DEFAULT, OFF, TRY or REQUIRE");
        return MG_ERR_INVALID;
    }
    spec.prefault = req->prefault;
    spec.request_id = req->request_id;
    if (req->n_share_with > MG_SEG_SHARE_MAX) {
        snprintf(err, MG_SEG_ERROR_MAX, "share_with names at most %d tenants", MG_SEG_SHARE_MAX);
        return MG_ERR_INVALID;
    }
    for (size_t i = 0, used = 0; i < req->n_share_with; i++) {
        size_t l = strlen(req->share_with[i]);
        if (l == 0 || strchr(req->share_with[i], ',') || used + l + 1 > sizeof(share)) {
            snprintf(err, MG_SEG_ERROR_MAX, "share_with[%zu] is not a tenant name", i);
            return MG_ERR_INVALID;
        }
        used += (size_t)snprintf(share + used, sizeof(share) - used, "%s%s", i ? "," : "",
                                 req->share_with[i]);
    }
    spec.share = share;
    if ((mg_seg_source_caps(spec.source) & MG_SEG_CAP_FD) &&
        (rc = mg_call_take_fd(call, req->fd_handle, &spec.fd, err)) != 0)
        return rc;
    return mg_registry_reserve(reg, &spec, seg, err);
}

static void register_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RegisterRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment *seg;
    seg_job *j;
    char err[MG_SEG_ERROR_MAX];
    int rc = reserve(reg, call, req, gw->memlock, &seg, err);

    if (rc == MG_SEG_RETRY) { /* a retry: the first request's segment */
        Moongate__V1__RegisterResponse resp = MOONGATE__V1__REGISTER_RESPONSE__INIT;
        mg_segment_info info;
        seg_msg sm;
        mg_segment_get_info(reg, seg, &info);
        seg_msg_fill(&sm, &info);
        resp.segment = &sm.msg;
        mg_call_reply(call, &resp.base);
        return;
    }
    if (rc != 0) {
        count_registration(gw, rc, 0, 0);
        mg_call_fail(call, rc, "%s", err);
        return;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        mg_registry_commit(reg, seg, MG_ERR_NOMEM);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    j->call = call;
    j->gw = gw;
    j->seg = seg;
    j->t0_ns = mg_now_mono_ns();
    mg_call_ref(call);
    memory_of(gw)->stats.in_flight++;
    rc = mg_registry_register_async(reg, gw->engine, gw->cq, seg, registered, j);
    if (rc != 0) { /* the reservation is undone */
        count_registration(gw, rc, 0, 1);
        mg_call_unref(call);
        free(j);
        mg_call_fail(call, rc, "engine queue holds %u jobs (--queue-depth)",
                     (unsigned)gw->cfg->queue_depth);
        return;
    }
    mg_call_set_data(call, j);
}

/* The caller left (cancel, deadline, disconnect): stop the mapping between chunks. registered()
 * then finds the call done and the registration failed or, if it had finished, undoes it. */
static void register_cancel(mg_call *call)
{
    seg_job *j = mg_call_data(call);
    if (j)
        mg_segment_cancel(j->seg);
}

static void unregister_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__UnregisterRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_segment *seg;
    char err[MG_SEG_ERROR_MAX];
    int rc = mg_registry_unregister(mg_engine_registry(gw->engine), mg_call_scope(call), req->id,
                                    &seg, err);
    if (rc != 0) {
        mg_call_fail(call, rc, "%s", err);
        return;
    }
    rc = unmap(gw, seg, call);
    if (rc != 0) { /* still registered */
        mg_call_fail(call, rc, "engine queue holds %u jobs (--queue-depth); try again",
                     (unsigned)gw->cfg->queue_depth);
    }
}

static void get_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__GetSegmentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    mg_segment_info info;
    seg_msg sm;
    if (mg_registry_find(mg_engine_registry(gw->engine), mg_call_scope(call), req->id, &info) !=
        0) {
        mg_call_fail(call, MG_ERR_NOT_FOUND, "no segment %" PRIu64, req->id);
        return;
    }
    seg_msg_fill(&sm, &info);
    mg_call_reply(call, &sm.msg.base);
}

static void list_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ListSegmentsRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    Moongate__V1__ListSegmentsResponse resp = MOONGATE__V1__LIST_SEGMENTS_RESPONSE__INIT;
    size_t want = req->page_size ? req->page_size : LIST_DEFAULT, n;
    uint64_t after = 0;
    mg_segment_info *infos;
    seg_msg *msgs;
    Moongate__V1__Segment **ptrs;
    char token[24];

    if (mg_call_page_args(call, req->page_size, req->page_token, LIST_MAX, &after) != 0)
        return;
    infos = calloc(want + 1, sizeof(*infos));
    msgs = calloc(want, sizeof(*msgs));
    ptrs = calloc(want, sizeof(*ptrs));
    if (infos == NULL || msgs == NULL || ptrs == NULL) {
        free(infos);
        free(msgs);
        free(ptrs);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    /* One more than asked tells whether another page follows. */
    n = mg_registry_list(mg_engine_registry(gw->engine), mg_call_scope(call), after, infos,
                         want + 1);
    token[0] = '\0';
    if (n > want) {
        n = want;
        snprintf(token, sizeof(token), "%016" PRIx64, infos[n - 1].id);
    }
    for (size_t i = 0; i < n; i++) {
        seg_msg_fill(&msgs[i], &infos[i]);
        ptrs[i] = &msgs[i].msg;
    }
    resp.segments = ptrs;
    resp.n_segments = n;
    resp.next_page_token = token;
    mg_call_reply(call, &resp.base);
    free(infos);
    free(msgs);
    free(ptrs);
}

/* ---- batches: items spread over the workers, one result each ---- */

typedef struct {
    int code; /* gRPC code, 0 for OK */
    char message[MG_SEG_ERROR_MAX + 64];
    mg_segment *seg;
    int mapping; /* a map job for seg is out */
    mg_segment_info info;
} batch_item;

typedef struct {
    mg_call *call;
    mg_gateway *gw;
    int unregister; /* 0: RegisterSegments, 1: UnregisterSegments */
    size_t n, pending;
    batch_item *items;
} batch;

typedef struct {
    batch *b;
    size_t i;
    uint64_t t0_ns;
} batch_job;

static void item_fail(batch_item *it, int err, const char *msg)
{
    it->code = mg_err_grpc(err);
    snprintf(it->message, sizeof(it->message), "%s: %s", mg_strerror(err), msg);
    it->seg = NULL;
}

static void batch_reply(batch *b)
{
    if (b->unregister) {
        Moongate__V1__UnregisterSegmentsResponse resp =
            MOONGATE__V1__UNREGISTER_SEGMENTS_RESPONSE__INIT;
        Moongate__V1__ItemStatus *st = calloc(b->n, sizeof(*st));
        Moongate__V1__ItemStatus **ps = calloc(b->n, sizeof(*ps));
        if (st == NULL || ps == NULL) {
            mg_call_fail(b->call, MG_ERR_NOMEM, NULL);
        } else {
            for (size_t i = 0; i < b->n; i++) {
                moongate__v1__item_status__init(&st[i]);
                st[i].code = b->items[i].code;
                st[i].message = b->items[i].message;
                ps[i] = &st[i];
            }
            resp.results = ps;
            resp.n_results = b->n;
            mg_call_reply(b->call, &resp.base);
        }
        free(st);
        free(ps);
        return;
    }
    {
        Moongate__V1__RegisterSegmentsResponse resp =
            MOONGATE__V1__REGISTER_SEGMENTS_RESPONSE__INIT;
        Moongate__V1__RegisterResult *rs = calloc(b->n, sizeof(*rs));
        Moongate__V1__RegisterResult **pr = calloc(b->n, sizeof(*pr));
        Moongate__V1__ItemStatus *st = calloc(b->n, sizeof(*st));
        seg_msg *sm = calloc(b->n, sizeof(*sm));
        if (rs == NULL || pr == NULL || st == NULL || sm == NULL) {
            mg_call_fail(b->call, MG_ERR_NOMEM, NULL);
        } else {
            for (size_t i = 0; i < b->n; i++) {
                moongate__v1__register_result__init(&rs[i]);
                moongate__v1__item_status__init(&st[i]);
                st[i].code = b->items[i].code;
                st[i].message = b->items[i].message;
                rs[i].status = &st[i];
                if (b->items[i].code == 0) {
                    seg_msg_fill(&sm[i], &b->items[i].info);
                    rs[i].segment = &sm[i].msg;
                }
                pr[i] = &rs[i];
            }
            resp.results = pr;
            resp.n_results = b->n;
            mg_call_reply(b->call, &resp.base);
        }
        free(rs);
        free(pr);
        free(st);
        free(sm);
    }
}

static void batch_finish(batch *b)
{
    mg_registry *reg = mg_engine_registry(b->gw->engine);
    mg_call_set_data(b->call, NULL);
    if (!mg_call_done(b->call)) {
        batch_reply(b);
    } else if (!b->unregister) {
        /* The caller is gone: undo every registration of the batch. */
        for (size_t i = 0; i < b->n; i++) {
            mg_segment *gone;
            char err[MG_SEG_ERROR_MAX];
            if (b->items[i].code != 0 ||
                mg_registry_unregister(reg, b->items[i].info.tenant, b->items[i].info.id, &gone,
                                       err) != 0)
                continue;
            unmap(b->gw, gone, NULL); /* no worker: it stays, listed */
        }
        mg_info("segments_rolled_back", "items=%zu reason=\"caller gone\"", b->n);
    }
    mg_call_unref(b->call);
    free(b->items);
    free(b);
}

/* The caller of a RegisterSegments left: stop the mappings still running or queued. */
static void register_batch_cancel(mg_call *call)
{
    batch *b = mg_call_data(call);
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->n; i++) {
        if (b->items[i].mapping)
            mg_segment_cancel(b->items[i].seg);
    }
}

static void batch_registered(void *arg, mg_segment *seg, int result, const char *why)
{
    batch_job *j = arg;
    batch *b = j->b;
    batch_item *it = &b->items[j->i];
    it->mapping = 0;
    count_registration(b->gw, result, (double)(mg_now_mono_ns() - j->t0_ns) / 1e9, 1);
    if (result != 0)
        item_fail(it, result, why);
    else {
        mg_segment_get_info(mg_engine_registry(b->gw->engine), seg, &it->info);
        mg_gateway_watch_exit(b->gw, seg);
    }
    free(j);
    if (--b->pending == 0)
        batch_finish(b);
}

static void batch_unregistered(void *arg, const mg_segment_info *info)
{
    batch_job *j = arg;
    batch *b = j->b;
    b->items[j->i].seg = NULL;
    free(j);
    if (--b->pending == 0)
        batch_finish(b);
}

static batch *batch_new(mg_call *call, size_t n, int unregister)
{
    mg_gateway *gw = mg_call_gateway(call);
    batch *b;
    if (n > gw->cfg->max_batch) {
        mg_call_fail(call, MG_ERR_FULL, "%zu items are more than --max-batch %llu", n,
                     (unsigned long long)gw->cfg->max_batch);
        return NULL;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL || (b->items = calloc(n ? n : 1, sizeof(*b->items))) == NULL) {
        free(b);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return NULL;
    }
    b->call = call;
    b->gw = gw;
    b->n = n;
    b->unregister = unregister;
    b->pending = 1; /* released after every item was started, so the batch ends once */
    mg_call_ref(call);
    return b;
}

/* Starts item i's registration or unregistration on a worker; on failure the item fails and
 * its segment is as it was before the batch (reservation undone, or still registered). */
static void batch_start(batch *b, size_t i)
{
    mg_registry *reg = mg_engine_registry(b->gw->engine);
    batch_job *j = calloc(1, sizeof(*j));
    int rc = MG_ERR_NOMEM, counted = 0;
    if (j) {
        j->b = b;
        j->i = i;
        j->t0_ns = mg_now_mono_ns();
        b->pending++;
        if (!b->unregister) {
            memory_of(b->gw)->stats.in_flight++;
            counted = 1;
        }
        rc = b->unregister ? mg_gateway_unmap(b->gw, b->items[i].seg, batch_unregistered, j)
                           : mg_registry_register_async(reg, b->gw->engine, b->gw->cq,
                                                        b->items[i].seg, batch_registered, j);
        if (rc == 0) {
            b->items[i].mapping = !b->unregister;
            return;
        }
        b->pending--;
        free(j);
    } else if (b->unregister) {
        mg_registry_restore(reg, b->items[i].seg);
    } else {
        mg_registry_commit(reg, b->items[i].seg, rc);
    }
    if (!b->unregister)
        count_registration(b->gw, rc, 0, counted);
    item_fail(&b->items[i], rc, "engine queue full (--queue-depth); try this item again");
}

static void register_batch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__RegisterSegmentsRequest *req = (const void *)m;
    batch *b = batch_new(call, req->n_items, 0);
    mg_registry *reg;
    if (b == NULL)
        return;
    mg_call_set_data(call, b); /* for register_batch_cancel, until batch_finish */
    reg = mg_engine_registry(b->gw->engine);
    for (size_t i = 0; i < b->n; i++) {
        char err[MG_SEG_ERROR_MAX];
        int rc = reserve(reg, call, req->items[i], b->gw->memlock, &b->items[i].seg, err);
        if (rc == MG_SEG_RETRY)
            mg_segment_get_info(reg, b->items[i].seg, &b->items[i].info); /* code 0 */
        else if (rc != 0) {
            count_registration(b->gw, rc, 0, 0);
            item_fail(&b->items[i], rc, err);
        } else {
            batch_start(b, i);
        }
    }
    if (--b->pending == 0)
        batch_finish(b);
}

static void unregister_batch_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__UnregisterSegmentsRequest *req = (const void *)m;
    batch *b = batch_new(call, req->n_ids, 1);
    mg_registry *reg;
    if (b == NULL)
        return;
    reg = mg_engine_registry(b->gw->engine);
    for (size_t i = 0; i < b->n; i++) {
        char err[MG_SEG_ERROR_MAX];
        int rc =
            mg_registry_unregister(reg, mg_call_scope(call), req->ids[i], &b->items[i].seg, err);
        if (rc != 0)
            item_fail(&b->items[i], rc, err);
        else
            batch_start(b, i);
    }
    if (--b->pending == 0)
        batch_finish(b);
}

static const mg_method memory_methods[] = {
    {.path = "/moongate.v1.Memory/RegisterSegment",
     .kind = MG_RPC_UNARY,
     .in = &moongate__v1__register_request__descriptor,
     .out = &moongate__v1__register_response__descriptor,
     .on_message = register_message,
     .on_cancel = register_cancel},
    {.path = "/moongate.v1.Memory/RegisterSegments",
     .kind = MG_RPC_UNARY,
     .in = &moongate__v1__register_segments_request__descriptor,
     .out = &moongate__v1__register_segments_response__descriptor,
     .on_message = register_batch_message,
     .on_cancel = register_batch_cancel},
    MG_UNARY("/moongate.v1.Memory/UnregisterSegments",
             &moongate__v1__unregister_segments_request__descriptor,
             &moongate__v1__unregister_segments_response__descriptor, unregister_batch_message),
    MG_UNARY("/moongate.v1.Memory/UnregisterSegment", &moongate__v1__unregister_request__descriptor,
             &moongate__v1__unregister_response__descriptor, unregister_message),
    MG_UNARY("/moongate.v1.Memory/GetSegment", &moongate__v1__get_segment_request__descriptor,
             &moongate__v1__segment__descriptor, get_message),
    MG_UNARY("/moongate.v1.Memory/ListSegments", &moongate__v1__list_segments_request__descriptor,
             &moongate__v1__list_segments_response__descriptor, list_message),
};

static const mg_route memory_routes[] = {
    {"GET", "/v1/segments", 0, "/moongate.v1.Memory/ListSegments"},
    {"POST", "/v1/segments", 0, "/moongate.v1.Memory/RegisterSegment"},
    {"GET", "/v1/segments", 1, "/moongate.v1.Memory/GetSegment"},
    {"DELETE", "/v1/segments", 1, "/moongate.v1.Memory/UnregisterSegment"},
};

static int mg_svc_memory_init(mg_gateway *gw)
{
    int rc;
    if (mg_engine_registry(gw->engine) == NULL)
        return 0; /* an engine without a registry serves no memory calls */
    if ((*mg_gateway_state(gw, &mg_svc_memory) = calloc(1, sizeof(struct mg_memory_svc))) == NULL)
        return MG_ERR_NOMEM;
    rc = mg_gateway_add_methods(gw, memory_methods, MG_NELEM(memory_methods), memory_routes,
                                MG_NELEM(memory_routes));
    return rc != 0 ? rc : mg_svc_memory_io_init(gw);
}

static void memory_free(mg_gateway *gw)
{
    free(memory_of(gw));
    *mg_gateway_state(gw, &mg_svc_memory) = NULL;
}

/* The memory calls' own block: registrations and the bytes moved inline. */
static void memory_metrics(mg_gateway *gw, struct evbuffer *out)
{
    const mg_segment_stats *ss = memory_of(gw) ? &memory_of(gw)->stats : NULL;
    if (ss == NULL)
        return;
    evbuffer_add_printf(
        out,
        "# HELP moongate_segment_registrations_total Registrations that completed.\n"
        "# TYPE moongate_segment_registrations_total counter\n"
        "moongate_segment_registrations_total %llu\n"
        "# HELP moongate_segment_registrations_in_flight Registrations on workers.\n"
        "# TYPE moongate_segment_registrations_in_flight gauge\n"
        "moongate_segment_registrations_in_flight %llu\n"
        "# HELP moongate_segment_registration_failures_total Failed registrations, by the code "
        "returned.\n"
        "# TYPE moongate_segment_registration_failures_total counter\n",
        (unsigned long long)ss->registered_total, (unsigned long long)ss->in_flight);
    for (int c = 1; c < MG_GRPC_CODE_COUNT; c++) {
        if (ss->failed_total[c])
            evbuffer_add_printf(out,
                                "moongate_segment_registration_failures_total{grpc_code=\"%s\"} "
                                "%llu\n",
                                mg_grpc_code_name(c), (unsigned long long)ss->failed_total[c]);
    }
    mg_metrics_render_seconds(out, "moongate_segment_registration_seconds",
                              "Time a registration spent on its worker.", ss->buckets,
                              ss->registered_total, ss->seconds_sum);
    evbuffer_add_printf(out,
                        "# HELP moongate_segment_inline_bytes_total Segment bytes moved inline "
                        "over gRPC (ReadSegment, WriteSegment).\n"
                        "# TYPE moongate_segment_inline_bytes_total counter\n"
                        "moongate_segment_inline_bytes_total{op=\"read\"} %llu\n"
                        "moongate_segment_inline_bytes_total{op=\"write\"} %llu\n"
                        "# HELP moongate_segment_write_queued_bytes WriteSegment bytes received "
                        "and not yet in their segment.\n"
                        "# TYPE moongate_segment_write_queued_bytes gauge\n"
                        "moongate_segment_write_queued_bytes %llu\n",
                        (unsigned long long)ss->inline_read_bytes,
                        (unsigned long long)ss->inline_written_bytes,
                        (unsigned long long)ss->write_queued_bytes);
}

const mg_service mg_svc_memory = {
    .name = "memory", .init = mg_svc_memory_init, .metrics = memory_metrics, .free = memory_free};
