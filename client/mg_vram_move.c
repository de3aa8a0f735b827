/*
 * GPU memory moved (mg_vram.h): by its dma-buf registration over RDMA, or staged through leases
 * of the daemon's pool — device -> leased host buffer -> transfer for a WRITE, the reverse for
 * a READ — in steps whose device copies overlap the transfers of the step before.
 *
 * The pool's file is mapped once per process and pinned once (cuMemHostRegister), so a step
 * costs one device copy and one Submit. Everything here blocks the calling thread only.
 */
#include "mg_vram.h"

#include "mg_client.h"
#include "mg_cuda.h"

#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/pool.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_CHUNK      (16u << 20) /* at most, and at least MIN_CHUNK */
#define MIN_CHUNK          (1u << 20)
#define DEFAULT_TIMEOUT_MS 60000u
#define MAX_BUFFERS        4

/* ---- the pools' files, mapped and pinned once per process ---- */

typedef struct pool_map {
    dev_t dev;
    ino_t ino; /* a daemon that restarted made a new file: mapped anew */
    char *addr;
    size_t size;
    int pinned; /* cuMemHostRegister took it; 0: steps copy through a private pinned buffer */
} pool_map;

static pool_map maps[8];
static int nmaps;
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;

/* One move: its arguments, where it stands and where its error goes. */
typedef struct move {
    mg_client *c;
    const mg_vram_move_args *a;
    mg_vram_move_result *r;
    const mg_cuda *cu;
    uint64_t deadline_us;
    int *status;
    char *err;
    size_t errcap;
} move;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

__attribute__((format(printf, 3, 4))) static int fail(move *m, int status, const char *fmt, ...)
{
    va_list ap;
    *m->status = status;
    va_start(ap, fmt);
    vsnprintf(m->err, m->errcap, fmt, ap);
    va_end(ap);
    return -1;
}

/* A unary call within the move's deadline: the answer unpacked, or NULL with the status set. */
static void *call(move *m, const char *path, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *out)
{
    uint64_t now = now_us();
    if (now >= m->deadline_us) {
        fail(m, MG_GRPC_DEADLINE_EXCEEDED, "%s: the move's deadline passed", path);
        return NULL;
    }
    return mg_client_call_msg(m->c, path, req, out, (m->deadline_us - now + 999) / 1000, m->status,
                              m->err, m->errcap);
}

/* The mapping of a pool's file (mapped and, if the driver takes it, pinned on first use). */
static const pool_map *pool_mapping(move *m, const char *path)
{
    const pool_map *found = NULL;
    struct stat st;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        fail(m, MG_GRPC_FAILED_PRECONDITION, "cannot open the pool's file %s: %s", path,
             strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    pthread_mutex_lock(&maps_mu);
    for (int i = 0; i < nmaps && found == NULL; i++)
        if (maps[i].dev == st.st_dev && maps[i].ino == st.st_ino &&
            maps[i].size == (size_t)st.st_size)
            found = &maps[i];
    if (found == NULL && nmaps == (int)(sizeof(maps) / sizeof(maps[0])))
        fail(m, MG_GRPC_RESOURCE_EXHAUSTED, "cannot map the pool's file %s: %s", path,
             "8 pool files are mapped in this process already");
    else if (found == NULL) {
        pool_map *p = &maps[nmaps];
        p->addr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p->addr == MAP_FAILED)
            fail(m, MG_GRPC_FAILED_PRECONDITION, "cannot map the pool's file %s: %s", path,
                 strerror(errno));
        else {
            p->dev = st.st_dev;
            p->ino = st.st_ino;
            p->size = (size_t)st.st_size;
            p->pinned = m->cu->cuMemHostRegister(p->addr, p->size,
                                                 MG_CU_MEMHOSTREGISTER_PORTABLE) == MG_CU_SUCCESS;
            found = &maps[nmaps++];
        }
    }
    pthread_mutex_unlock(&maps_mu);
    close(fd);
    return found;
}

/* ---- leases ---- */

typedef struct stage {
    uint64_t lease[MAX_BUFFERS];
    char *host[MAX_BUFFERS]; /* where each lease lies in this process */
    char *bounce;            /* a private pinned buffer (the pool's file could not be pinned) */
    mg_cu_event ev[MAX_BUFFERS];
    int copying[MAX_BUFFERS];    /* a device copy of buffer k was queued, not waited for */
    uint64_t batch[MAX_BUFFERS]; /* the batch moving buffer k now, or 0 */
    uint64_t batch_len[MAX_BUFFERS];
    int n;                    /* leases held */
    mg_cu_stream stream, own; /* the copies' stream; own: the library made it */
} stage;

static Moongate__V1__Lease *acquire(move *m, uint64_t size, int block)
{
    Moongate__V1__AcquireLeaseRequest q = MOONGATE__V1__ACQUIRE_LEASE_REQUEST__INIT;
    q.size = size;
    q.alignment = 4096;
    q.block = block != 0;
    q.ttl_ms = (uint32_t)((m->deadline_us - now_us()) / 1000) + 60000;
    return call(m, "/moongate.v1.Pool/AcquireLease", &q.base, &moongate__v1__lease__descriptor);
}

static void release_all(move *m, stage *s)
{
    int status = *m->status;
    char keep[1024];
    snprintf(keep, sizeof(keep), "%s", m->err); /* the move's own error stays */
    for (int k = 0; k < s->n; k++) {
        Moongate__V1__ReleaseLeaseRequest q = MOONGATE__V1__RELEASE_LEASE_REQUEST__INIT;
        uint64_t d = m->deadline_us;
        void *resp;
        q.id = s->lease[k];
        m->deadline_us = now_us() + 10000000; /* a release goes even after the deadline */
        resp = call(m, "/moongate.v1.Pool/ReleaseLease", &q.base,
                    &moongate__v1__release_lease_response__descriptor);
        m->deadline_us = d;
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
    }
    s->n = 0;
    *m->status = status;
    snprintf(m->err, m->errcap, "%s", keep);
}

/* The smallest pool this caller sees: the chunk must fit in it. */
static int pool_capacity(move *m, uint64_t *cap)
{
    Moongate__V1__PoolStatsRequest q = MOONGATE__V1__POOL_STATS_REQUEST__INIT;
    Moongate__V1__PoolStatsResponse *s = call(m, "/moongate.v1.Pool/PoolStats", &q.base,
                                              &moongate__v1__pool_stats_response__descriptor);
    if (s == NULL) {
        char why[512];
        snprintf(why, sizeof(why), "%s", m->err);
        snprintf(m->err, m->errcap, "GPU memory is staged through leases: %s", why);
        return -1;
    }
    *cap = 0;
    for (size_t i = 0; i < s->n_pools; i++)
        if (i == 0 || s->pools[i]->capacity < *cap) {
            *cap = s->pools[i]->capacity;
            snprintf(m->r->pool, sizeof(m->r->pool), "%s", s->pools[i]->name);
        }
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return 0;
}

/* Leases for the steps: up to MAX_BUFFERS if the pool has room for them now, at least one
 * (waiting in line for a busy pool, within the deadline). Sets the chunk: what was asked, at
 * most what MAX_BUFFERS leases can share of the pool. */
static int stage_leases(move *m, stage *s, const pool_map **map)
{
    uint64_t page = 4096, cap, want = m->a->chunk, most;
    Moongate__V1__Lease *l;
    if (pool_capacity(m, &cap) != 0)
        return -1;
    most = cap * 8 / 9 / MAX_BUFFERS / page * page; /* a lease reserves up to 1/8 more */
    if (most < page)
        most = cap / page * page; /* a small pool: one lease, all of it */
    if (most < page) {
        *m->status = MG_GRPC_RESOURCE_EXHAUSTED;
        snprintf(m->err, m->errcap,
                 "GPU memory is staged through leases, and pool %s holds %llu bytes: less than a "
                 "page (--pool-bytes)",
                 m->r->pool[0] ? m->r->pool : "(none)", (unsigned long long)cap);
        return -1;
    }
    if (want == 0) { /* steps enough to overlap copies and transfers, none too small */
        want = (m->a->len + MAX_BUFFERS - 1) / MAX_BUFFERS;
        want = want < MIN_CHUNK ? MIN_CHUNK : want > DEFAULT_CHUNK ? DEFAULT_CHUNK : want;
    }
    want = want / page * page < page ? page : (want + page - 1) / page * page;
    if (want > (m->a->len + page - 1) / page * page)
        want = (m->a->len + page - 1) / page * page;
    if (want > most)
        want = most;
    if ((l = acquire(m, want, 1)) == NULL)
        return -1;
    for (;;) {
        const pool_map *p = pool_mapping(m, l->path);
        s->lease[s->n] = l->id;
        if (p == NULL || l->offset + want > p->size) {
            if (p != NULL)
                fail(m, MG_GRPC_INTERNAL, "lease %llu lies beyond its pool's file %s",
                     (unsigned long long)l->id, l->path);
            s->n++;
            protobuf_c_message_free_unpacked(&l->base, NULL);
            return -1;
        }
        s->host[s->n++] = p->addr + l->offset;
        snprintf(m->r->pool, sizeof(m->r->pool), "%s", l->pool);
        *map = p;
        protobuf_c_message_free_unpacked(&l->base, NULL);
        if (s->n == MAX_BUFFERS || (uint64_t)s->n * want >= m->a->len ||
            (l = acquire(m, want, 0)) == NULL)
            break;
    }
    *m->status = MG_GRPC_OK; /* no room for another lease: those held, in turn */
    m->r->chunk = want;
    m->r->buffers = s->n;
    return 0;
}

/* ---- the steps ---- */

static int cuda_fail(move *m, const char *what, mg_cu_result rc)
{
    char text[256];
    return fail(m, MG_GRPC_INTERNAL, "%s: %s", what,
                mg_cuda_strerror(m->cu, rc, text, sizeof(text)));
}

/* The bytes of step i: [*off, *off + return) of the move. */
static uint64_t step_span(const move *m, uint32_t i, uint64_t *off)
{
    uint64_t chunk = m->r->chunk;
    *off = (uint64_t)i * chunk;
    return m->a->len - *off < chunk ? m->a->len - *off : chunk;
}

/* A batch of one request of n bytes at its end: counted, or the move fails with its error. */
static int batch_over(move *m, const Moongate__V1__Batch *b, uint64_t n)
{
    const Moongate__V1__RequestStatus *st;
    if (b == NULL || b->n_requests != 1)
        return fail(m, MG_GRPC_INTERNAL, "the daemon's answer holds no request's status");
    st = b->requests[0];
    if (st->state == MOONGATE__V1__REQUEST_STATE__DONE) {
        m->r->bytes += n;
        return 0;
    }
    m->r->bytes += st->bytes_done;
    return fail(m,
                st->state == MOONGATE__V1__REQUEST_STATE__FAILED && st->code ? st->code
                                                                             : MG_GRPC_UNKNOWN,
                "batch %llu: %s", (unsigned long long)b->id,
                st->state == MOONGATE__V1__REQUEST_STATE__FAILED ? st->message
                                                                 : "not over at its deadline");
}

/* Submits step i's batch — from or into lease k (s NULL: the whole move by the range's address,
 * by dma-buf) — and, with `wait`, answers at its end. Its id goes to *id; a batch that ended is
 * counted (ok) or fails the move. */
static int submit(move *m, const stage *s, int k, uint64_t off, uint64_t n, int wait, uint64_t *id)
{
    const mg_vram_move_args *a = m->a;
    Moongate__V1__SubmitRequest q = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__TransferRequest t = MOONGATE__V1__TRANSFER_REQUEST__INIT, *tp = &t;
    Moongate__V1__SubmitResponse *resp;
    int rc = 0;
    t.op = a->write ? MOONGATE__V1__TRANSFER_OP__WRITE : MOONGATE__V1__TRANSFER_OP__READ;
    if (s != NULL)
        t.local_lease = s->lease[k];
    else
        t.local_address = a->ptr;
    t.peer = (char *)(a->peer ? a->peer : "");
    t.remote_segment = a->remote_segment;
    t.remote_lease = a->remote_lease;
    t.remote_agent = (char *)(a->remote_agent ? a->remote_agent : "");
    t.remote_address = a->remote_address;
    t.remote_offset = a->remote_offset + off;
    t.length = n;
    q.requests = &tp;
    q.n_requests = 1;
    q.wait = wait != 0;
    q.tag = s != NULL ? "staged" : "rdma-dmabuf";
    q.timeout_ms = (uint32_t)((m->deadline_us - now_us()) / 1000) + 1;
    resp = call(m, "/moongate.v1.Transfer/Submit", &q.base,
                &moongate__v1__submit_response__descriptor);
    if (resp == NULL)
        return -1;
    *id = resp->batch_id;
    if (wait)
        rc = batch_over(m, resp->batch, n);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return rc;
}

/* Waits for batch id (Transfer/Wait to its end): counted, or the move fails with its error. */
static int batch_wait(move *m, uint64_t id, uint64_t n)
{
    Moongate__V1__GetBatchRequest q = MOONGATE__V1__GET_BATCH_REQUEST__INIT;
    Moongate__V1__Batch *b;
    int rc;
    q.id = id;
    b = call(m, "/moongate.v1.Transfer/Wait", &q.base, &moongate__v1__batch__descriptor);
    if (b == NULL)
        return -1;
    rc = batch_over(m, b, n);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    return rc;
}

/* Queues step i's device copy into or out of buffer k and records k's event. */
static int step_copy(move *m, stage *s, int k, uint32_t i)
{
    const mg_cuda *cu = m->cu;
    uint64_t off, n = step_span(m, i, &off);
    mg_cu_ptr dev = (mg_cu_ptr)(m->a->ptr + off);
    char *host = s->bounce ? s->bounce + (size_t)k * m->r->chunk : s->host[k];
    mg_cu_result rc = m->a->write ? cu->cuMemcpyDtoHAsync(host, dev, n, s->stream)
                                  : cu->cuMemcpyHtoDAsync(dev, host, n, s->stream);
    if (rc != MG_CU_SUCCESS)
        return cuda_fail(m, m->a->write ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", rc);
    if ((rc = cu->cuEventRecord(s->ev[k], s->stream)) != MG_CU_SUCCESS)
        return cuda_fail(m, "cuEventRecord", rc);
    s->copying[k] = 1;
    return 0;
}

/* Waits for buffer k's device copy (its error is the copy's). */
static int copy_wait(move *m, stage *s, int k)
{
    mg_cu_result rc;
    if (!s->copying[k])
        return 0;
    s->copying[k] = 0;
    rc = m->cu->cuEventSynchronize(s->ev[k]);
    return rc == MG_CU_SUCCESS
               ? 0
               : cuda_fail(m, m->a->write ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", rc);
}

/* Waits for buffer k's batch, if one is in flight. */
static int moving_wait(move *m, stage *s, int k)
{
    uint64_t id = s->batch[k];
    if (id == 0)
        return 0;
    s->batch[k] = 0;
    return batch_wait(m, id, s->batch_len[k]);
}

/* Step i from buffer k (a WRITE whose copy ended) or into it (a READ), in flight after. */
static int step_submit(move *m, stage *s, int k, uint32_t i)
{
    uint64_t off, n = step_span(m, i, &off);
    if (s->bounce && m->a->write)
        memcpy(s->host[k], s->bounce + (size_t)k * m->r->chunk, n);
    s->batch_len[k] = n;
    return submit(m, s, k, off, n, 0, &s->batch[k]);
}

/* The steps, each through buffer i % n. A WRITE copies step i+1 off the device while steps
 * i, i-1, ... are on the wire; a READ keeps n steps on the wire and copies each onto the device
 * as it lands. */
static int run_steps(move *m, stage *s)
{
    uint32_t steps = (uint32_t)((m->a->len + m->r->chunk - 1) / m->r->chunk), next = 0;
    for (uint32_t i = 0; i < steps; i++) {
        int k = (int)(i % (uint32_t)s->n);
        m->r->chunks = i + 1;
        if (m->a->write) {
            int k1 = (int)((i + 1) % (uint32_t)s->n);
            if ((i == 0 && step_copy(m, s, k, i) != 0) || copy_wait(m, s, k) != 0 ||
                step_submit(m, s, k, i) != 0)
                return -1;
            if (i + 1 < steps && (moving_wait(m, s, k1) != 0 || step_copy(m, s, k1, i + 1) != 0))
                return -1;
        } else {
            for (; next < steps && next < i + (uint32_t)s->n; next++) {
                int kn = (int)(next % (uint32_t)s->n);
                if (copy_wait(m, s, kn) != 0 || step_submit(m, s, kn, next) != 0)
                    return -1;
            }
            if (moving_wait(m, s, k) != 0)
                return -1;
            if (s->bounce) {
                uint64_t off, n = step_span(m, i, &off);
                memcpy(s->bounce + (size_t)k * m->r->chunk, s->host[k], n);
            }
            if (step_copy(m, s, k, i) != 0)
                return -1;
        }
    }
    for (int k = 0; k < s->n; k++)
        if (moving_wait(m, s, k) != 0 || copy_wait(m, s, k) != 0)
            return -1;
    return 0;
}

/* A private pinned buffer of one chunk per lease, when the pool's file could not be pinned. */
static int stage_bounce(move *m, stage *s)
{
    size_t size = (size_t)m->r->chunk * (size_t)s->n;
    mg_cu_result rc;
    if (posix_memalign((void **)&s->bounce, 4096, size) != 0) {
        s->bounce = NULL;
        return fail(m, MG_GRPC_RESOURCE_EXHAUSTED, "a pinned bounce buffer: out of memory");
    }
    if ((rc = m->cu->cuMemHostRegister(s->bounce, size, 0)) != MG_CU_SUCCESS) {
        free(s->bounce);
        s->bounce = NULL;
        return cuda_fail(
            m, "cuMemHostRegister of a bounce buffer (the pool's file was refused too)", rc);
    }
    m->r->bounce = 1;
    return 0;
}

static int stage_cuda(move *m, stage *s)
{
    mg_cu_result rc = MG_CU_SUCCESS;
    s->stream = m->a->stream;
    if (s->stream == NULL &&
        (rc = m->cu->cuStreamCreate(&s->own, MG_CU_STREAM_NON_BLOCKING)) != MG_CU_SUCCESS)
        return cuda_fail(m, "cuStreamCreate", rc);
    if (s->stream == NULL)
        s->stream = s->own;
    for (int k = 0; k < s->n; k++)
        if ((rc = m->cu->cuEventCreate(&s->ev[k], 0)) != MG_CU_SUCCESS)
            return cuda_fail(m, "cuEventCreate", rc);
    return 0;
}

static void stage_end(move *m, stage *s)
{
    /* batches and copies still using the leases end before the leases go */
    for (int k = 0; k < s->n; k++)
        if (s->batch[k]) {
            int status = *m->status;
            char keep[1024];
            snprintf(keep, sizeof(keep), "%s", m->err);
            m->deadline_us = now_us() + 10000000; /* they end within the batches' deadline */
            moving_wait(m, s, k);
            *m->status = status;
            snprintf(m->err, m->errcap, "%s", keep);
        }
    if (s->stream)
        m->cu->cuStreamSynchronize(s->stream);
    for (int k = 0; k < MAX_BUFFERS; k++)
        if (s->ev[k])
            m->cu->cuEventDestroy(s->ev[k]);
    if (s->own)
        m->cu->cuStreamDestroy(s->own);
    if (s->bounce) {
        m->cu->cuMemHostUnregister(s->bounce);
        free(s->bounce);
    }
    release_all(m, s);
}

static int move_staged(move *m)
{
    stage s = {0};
    const pool_map *map = NULL;
    int rc = -1;
    m->r->path = "staged";
    if (stage_leases(m, &s, &map) == 0 && stage_cuda(m, &s) == 0 &&
        (map->pinned || stage_bounce(m, &s) == 0))
        rc = run_steps(m, &s);
    stage_end(m, &s);
    return rc;
}

/* ---- by dma-buf ---- */

/* This daemon moves bytes over RDMA (Daemon/Info): 1, 0, or -1 with the call's error. */
static int daemon_has_rdma(move *m)
{
    Moongate__V1__InfoRequest q = MOONGATE__V1__INFO_REQUEST__INIT;
    Moongate__V1__InfoResponse *info =
        call(m, "/moongate.v1.Daemon/Info", &q.base, &moongate__v1__info_response__descriptor);
    int rdma = 0;
    if (info == NULL)
        return -1;
    for (size_t i = 0; i < info->n_transports; i++)
        if (strcmp(info->transports[i]->name, "rdma") == 0 && info->transports[i]->available)
            rdma = 1;
    protobuf_c_message_free_unpacked(&info->base, NULL);
    return rdma;
}

static int move_dmabuf(move *m)
{
    uint64_t id;
    m->r->path = "rdma-dmabuf";
    return submit(m, NULL, 0, 0, m->a->len, 1, &id);
}

int mg_vram_move(mg_client *c, const mg_vram_move_args *a, mg_vram_move_result *r, int *status,
                 char *err, size_t errcap)
{
    move m = {.c = c, .a = a, .r = r, .status = status, .err = err, .errcap = errcap};
    mg_cuda_ptr_info info, last;
    mg_cu_result crc;
    int rc, rdma;
    memset(r, 0, sizeof(*r));
    m.deadline_us =
        now_us() + (uint64_t)(a->timeout_ms ? a->timeout_ms : DEFAULT_TIMEOUT_MS) * 1000;
    *status = MG_GRPC_FAILED_PRECONDITION;
    if ((m.cu = mg_cuda_get(err, errcap)) == NULL)
        return -1;
    if (a->len == 0 || a->ptr + a->len < a->ptr)
        return fail(&m, MG_GRPC_INVALID_ARGUMENT,
                    "a move of GPU memory needs a length (and no wrap)");
    if (a->path < MG_VRAM_AUTO || a->path > MG_VRAM_DMABUF)
        return fail(&m, MG_GRPC_INVALID_ARGUMENT, "%s%s", "path is none of AUTO, STAGED, DMABUF",
                    "");
    if (mg_cuda_pointer(m.cu, a->ptr, &info) != 1 ||
        mg_cuda_pointer(m.cu, a->ptr + a->len - 1, &last) != 1) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "[0x%llx, +%zu) is not GPU memory the CUDA driver knows",
                 (unsigned long long)a->ptr, a->len);
        return -1;
    }
    if (a->path == MG_VRAM_DMABUF)
        return move_dmabuf(&m);
    if (a->path == MG_VRAM_AUTO) {
        if ((rdma = daemon_has_rdma(&m)) < 0)
            return -1;
        if (!rdma)
            snprintf(r->why, sizeof(r->why), "this daemon has no RDMA device");
        else if (move_dmabuf(&m) == 0)
            return 0;
        else if (r->bytes > 0 || *status == MG_GRPC_DEADLINE_EXCEEDED ||
                 *status == MG_GRPC_UNAVAILABLE || *status == MG_GRPC_UNAUTHENTICATED ||
                 *status == MG_GRPC_PERMISSION_DENIED)
            return -1; /* not a refusal of the path: staging would meet the same */
        else
            snprintf(r->why, sizeof(r->why), "by dma-buf: %s (%s)", err,
                     mg_grpc_code_name(*status));
    }
    if ((crc = m.cu->cuCtxPushCurrent(info.context)) != MG_CU_SUCCESS)
        return cuda_fail(&m, "cuCtxPushCurrent", crc);
    rc = move_staged(&m);
    m.cu->cuCtxPopCurrent(NULL);
    if (rc == 0)
        *status = MG_GRPC_OK;
    return rc;
}
