/*
 * svc_memory_io: the inline byte calls of moongate.v1.Memory, for clients that do not share
 * memory with the daemon.
 *
 *   ReadSegment   server streaming: chunks are copied out of the segment and framed on
 *                 workers, one at a time, paced by how fast the client reads (on_writable).
 *   Checksum      unary: the CRC32C of a range, computed on a worker.
 *   WriteSegment  client streaming: each request message goes to a worker undecoded (on_raw);
 *                 the worker decodes it, checks its bounds and copies its bytes into the
 *                 segment. Messages are applied one at a time, in order; the stream's
 *                 flow-control window is only given back as they are done, so a fast writer
 *                 waits instead of queueing memory here.
 *
 * Both hold a reference on the segment while they run: it cannot be unregistered under them.
 * The loop only does bookkeeping; every byte is copied on a worker.
 */
#include "svc_memory.h"

#include "moongate/fault.h"
#include "moongate/pools.h"
#include "moongate/segment.h"
#include "moongate/v1/memory.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ReadSegment: chunks copied and framed on workers, handed to the call as they come ---- */

#define READ_CHUNK_DEFAULT (1u << 20)

typedef struct {
    mg_call *call;
    mg_gateway *gw;
    mg_segment *seg; /* referenced until the read ends */
    uint64_t next, end;
    uint32_t chunk;
    int in_flight; /* a copy job is out */
    int ended;     /* the call ended for the handler (cancel, deadline, error) */
    uint64_t base; /* where offset 0 is in the segment: a lease's offset, else 0 */
    void *lease;   /* the lease read from (mg_pools_use), or NULL */
} read_state;

typedef struct {
    read_state *st;
    uint64_t offset;
    uint32_t n;
    uint8_t *frame;
    size_t frame_len;
} read_job;

static void read_free(read_state *st)
{
    mg_registry_put(mg_engine_registry(st->gw->engine), st->seg);
    mg_pools_unuse(st->gw->pools, st->lease);
    mg_call_set_data(st->call, NULL);
    mg_call_unref(st->call);
    free(st);
}

typedef struct {
    const ProtobufCMessage *msg;
    uint8_t *out;
} pack_op;

static int pack_guarded(void *arg)
{
    pack_op *p = arg;
    protobuf_c_message_pack(p->msg, p->out);
    return 0;
}

/* Worker: one SegmentChunk, framed, with its bytes copied out of the segment (guarded: a client
 * may have shrunk the segment's file under it). */
static int read_work(void *arg)
{
    read_job *j = arg;
    Moongate__V1__SegmentChunk c = MOONGATE__V1__SEGMENT_CHUNK__INIT;
    pack_op p = {&c.base, NULL};
    size_t len;
    int rc;
    c.offset = j->offset;
    c.data.data = (uint8_t *)mg_segment_addr(j->st->seg) + j->st->base + j->offset;
    c.data.len = j->n;
    len = protobuf_c_message_get_packed_size(&c.base);
    j->frame = malloc(MG_GRPC_PREFIX_LEN + len);
    if (j->frame == NULL)
        return MG_ERR_NOMEM;
    mg_grpc_prefix(j->frame, (uint32_t)len);
    p.out = j->frame + MG_GRPC_PREFIX_LEN;
    if ((rc = mg_fault_guard(pack_guarded, &p)) != 0)
        return rc;
    j->frame_len = MG_GRPC_PREFIX_LEN + len;
    return 0;
}

static void read_pump(read_state *st);

static void read_done(void *arg, int result)
{
    read_job *j = arg;
    read_state *st = j->st;
    int rc;
    st->in_flight = 0;
    if (st->ended || mg_call_done(st->call)) {
        free(j->frame);
        free(j);
        read_free(st);
        return;
    }
    if (result != 0) {
        free(j->frame);
        free(j);
        st->ended = 1;
        mg_call_fail(st->call, result, "%s",
                     result == MG_ERR_DATA_LOSS
                         ? "copying the segment: its file is shorter than registered (a client "
                           "truncated it)"
                         : "copying the segment");
        read_free(st);
        return;
    }
    st->next = j->offset + j->n;
    memory_of(st->gw)->stats.inline_read_bytes += j->n;
    st->ended = 1; /* a failing send runs read_cancel from inside: it must not free st */
    rc = mg_call_send_framed(st->call, j->frame, j->frame_len);
    st->ended = 0;
    free(j);
    if (rc != 0) {
        st->ended = 1;
        read_free(st);
        return;
    }
    read_pump(st);
}

/* Starts the next copy when none is out and the call's queue has room. */
static void read_pump(read_state *st)
{
    read_job *j;
    int rc;
    if (st->in_flight || st->ended)
        return;
    if (st->next >= st->end) {
        st->ended = 1;
        mg_call_finish(st->call, MG_GRPC_OK, NULL);
        read_free(st);
        return;
    }
    if (!mg_call_writable(st->call))
        return; /* a slow reader: read_writable resumes */
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        st->ended = 1;
        mg_call_fail(st->call, MG_ERR_NOMEM, NULL);
        read_free(st);
        return;
    }
    j->st = st;
    j->offset = st->next;
    j->n = (uint32_t)(st->end - st->next < st->chunk ? st->end - st->next : st->chunk);
    rc = mg_engine_submit(st->gw->engine, st->gw->cq, read_work, read_done, j);
    if (rc != 0) {
        free(j);
        st->ended = 1;
        mg_call_fail(st->call, rc, "engine queue holds %u jobs (--queue-depth)",
                     (unsigned)st->gw->cfg->queue_depth);
        read_free(st);
        return;
    }
    st->in_flight = 1;
}

static void read_writable(mg_call *call)
{
    read_state *st = mg_call_data(call);
    if (st)
        read_pump(st);
}

static void read_cancel(mg_call *call)
{
    read_state *st = mg_call_data(call);
    if (st == NULL || st->ended)
        return;
    st->ended = 1;
    if (!st->in_flight)
        read_free(st); /* else the job's return frees it */
}

/* The range a ReadSegmentRequest names (a segment of the caller's, or a lease), held for
 * `what`: the segment referenced, where the range starts in it and how long it is, and the
 * lease used (or NULL). Returns 0, or -1 with the call failed and nothing held. */
static int range_open(mg_call *call, const Moongate__V1__ReadSegmentRequest *req, const char *what,
                      mg_segment **seg, uint64_t *start, uint64_t *length, void **lease)
{
    mg_gateway *gw = mg_call_gateway(call);
    mg_registry *reg = mg_engine_registry(gw->engine);
    mg_segment_info info;
    uint64_t base = 0, size;
    char holder[MG_SEG_HOLDER_MAX], why[MG_SEG_ERROR_MAX];
    *lease = NULL;
    if (req->lease_id && req->id) {
        mg_call_fail(call, MG_ERR_INVALID, "give id or lease_id, not both");
        return -1;
    }
    if (req->lease_id) {
        snprintf(holder, sizeof(holder), "%s of lease %" PRIu64 " by %s", what, req->lease_id,
                 mg_call_peer(call));
        if (mg_pools_use(gw->pools, mg_call_tenant(call), req->lease_id, holder, seg, &base, &size,
                         lease) != 0) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no lease %" PRIu64, req->lease_id);
            return -1;
        }
    } else {
        snprintf(holder, sizeof(holder), "%s by %s", what, mg_call_peer(call));
        if (mg_registry_acquire(reg, mg_call_tenant(call), req->id, holder, seg) != 0) {
            mg_call_fail(call, MG_ERR_NOT_FOUND, "no segment %" PRIu64, req->id);
            return -1;
        }
        mg_segment_get_info(reg, *seg, &info);
        size = info.size;
        if (mg_segment_allows(*seg, MG_SEG_CAP_INLINE, why, sizeof(why)) != 0) {
            mg_registry_put(reg, *seg); /* a process's memory, GPU memory: no mapping here */
            mg_call_fail(call, MG_ERR_STATE, "%s", why);
            return -1;
        }
    }
    *length = req->length ? req->length : (req->offset <= size ? size - req->offset : 0);
    if (mg_bounds_check(size, req->offset, *length) != 0) {
        mg_registry_put(reg, *seg);
        mg_pools_unuse(gw->pools, *lease);
        mg_call_fail(call, MG_ERR_RANGE,
                     "offset %" PRIu64 " + length %" PRIu64 " is outside the %s's %" PRIu64
                     " bytes",
                     req->offset, req->length, *lease ? "lease" : "segment", size);
        return -1;
    }
    *start = base;
    return 0;
}

static void read_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReadSegmentRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    uint64_t max_chunk = gw->cfg->max_message_bytes - 64, length, base;
    mg_segment *seg;
    read_state *st;
    void *lease;

    if (req->chunk_bytes > max_chunk) {
        mg_call_fail(call, MG_ERR_INVALID, "chunk_bytes %u is above %llu (--max-message-bytes)",
                     req->chunk_bytes, (unsigned long long)max_chunk);
        return;
    }
    if (range_open(call, req, "ReadSegment", &seg, &base, &length, &lease) != 0)
        return;
    st = calloc(1, sizeof(*st));
    if (st == NULL) {
        mg_registry_put(mg_engine_registry(gw->engine), seg);
        mg_pools_unuse(gw->pools, lease);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    st->base = base;
    st->lease = lease;
    st->call = call;
    st->gw = gw;
    st->seg = seg;
    st->next = req->offset;
    st->end = req->offset + length;
    st->chunk = req->chunk_bytes
                    ? req->chunk_bytes
                    : (uint32_t)(READ_CHUNK_DEFAULT < max_chunk ? READ_CHUNK_DEFAULT : max_chunk);
    mg_call_ref(call);
    mg_call_set_data(call, st);
    read_pump(st);
}

/* ---- Checksum: the CRC32C of a range, on a worker (mg_gateway_checksum) ---- */

static void checksum_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ReadSegmentRequest *req = (const void *)m;
    mg_segment *seg;
    uint64_t base, length;
    void *lease;
    if (range_open(call, req, "Checksum", &seg, &base, &length, &lease) == 0)
        mg_gateway_checksum(call, seg, lease,
                            (const uint8_t *)mg_segment_addr(seg) + base + req->offset, length);
}

/* ---- WriteSegment: messages decoded and copied on workers, one at a time, in order ---- */

typedef struct write_msg {
    uint8_t *raw; /* the serialized WriteSegmentRequest */
    size_t len;
    struct write_msg *next;
} write_msg;

typedef struct {
    mg_call *call;
    mg_gateway *gw;
    mg_segment *seg;        /* referenced once the first message named it */
    uint64_t id;            /* the segment's id, or 0 when writing to a lease */
    uint64_t lease_id;      /* the lease's id, or 0 */
    void *lease;            /* mg_pools_use token */
    uint64_t base;          /* where offset 0 is in the segment (a lease's offset) */
    uint64_t limit;         /* bytes writable from base: the segment's size or the lease's */
    write_msg *head, *tail; /* received, not yet applied */
    int in_flight;          /* a job is out */
    int ended;              /* the call ended for the handler */
    int half_closed;
    uint64_t messages; /* applied */
    uint64_t written;
} write_state;

typedef struct {
    write_state *st;
    uint8_t *raw; /* freed by the worker once decoded */
    size_t len;
    uint64_t index; /* 1-based, for error messages */
    Moongate__V1__WriteSegmentRequest *req;
    uint64_t size; /* of the segment, when known */
    int err;       /* MG_ERR_* of the job */
    char why[256];
} write_job;

static void write_job_free(write_job *j)
{
    memory_of(j->st->gw)->stats.write_queued_bytes -= j->len;
    free(j->raw);
    if (j->req)
        protobuf_c_message_free_unpacked(&j->req->base, NULL);
    free(j);
}

static void write_free(write_state *st)
{
    while (st->head) {
        write_msg *m = st->head;
        st->head = m->next;
        memory_of(st->gw)->stats.write_queued_bytes -= m->len;
        free(m->raw);
        free(m);
        mg_call_release(st->call);
    }
    if (st->seg)
        mg_registry_put(mg_engine_registry(st->gw->engine), st->seg);
    mg_pools_unuse(st->gw->pools, st->lease);
    mg_call_set_data(st->call, NULL);
    mg_call_unref(st->call);
    free(st);
}

/* Worker: decodes the message (once) and, when the segment is known, copies it in. Only reads
 * st->seg and st->id, which the loop does not change while a job is out. */
static int write_work(void *arg)
{
    write_job *j = arg;
    const Moongate__V1__WriteSegmentRequest *r;
    mg_registry_gate(mg_engine_registry(j->st->gw->engine), 0); /* a test hold */
    if (j->req == NULL) {
        j->req = moongate__v1__write_segment_request__unpack(NULL, j->len, j->raw);
        free(j->raw);
        j->raw = NULL;
        if (j->req == NULL) {
            j->err = MG_ERR_INVALID;
            snprintf(j->why, sizeof(j->why), "message %" PRIu64 " is not a WriteSegmentRequest",
                     j->index);
            return j->err;
        }
    }
    if (j->st->seg == NULL)
        return 0; /* the loop looks the segment up, then sends the job back */
    r = j->req;
    if ((r->id != 0 && r->id != j->st->id) ||
        (r->lease_id != 0 && r->lease_id != j->st->lease_id)) {
        j->err = MG_ERR_INVALID;
        snprintf(j->why, sizeof(j->why),
                 "message %" PRIu64 " names %s %" PRIu64 ", the stream writes to %s %" PRIu64,
                 j->index, r->id ? "segment" : "lease", r->id ? r->id : r->lease_id,
                 j->st->id ? "segment" : "lease", j->st->id ? j->st->id : j->st->lease_id);
        return j->err;
    }
    if (mg_bounds_check(j->size, r->offset, r->data.len) != 0) {
        j->err = MG_ERR_RANGE;
        snprintf(j->why, sizeof(j->why),
                 "message %" PRIu64 ": offset %" PRIu64 " + %zu bytes is outside the %s's "
                 "%" PRIu64 " bytes",
                 j->index, r->offset, r->data.len, j->st->lease ? "lease" : "segment", j->size);
        return j->err;
    }
    if (r->data.len > 0 &&
        mg_guarded_copy((uint8_t *)mg_segment_addr(j->st->seg) + j->st->base + r->offset,
                        r->data.data, r->data.len) != 0) {
        j->err = MG_ERR_DATA_LOSS;
        snprintf(j->why, sizeof(j->why),
                 "message %" PRIu64 ": the %s's file is shorter than registered (a client "
                 "truncated it): offset %" PRIu64 " is gone",
                 j->index, j->st->lease ? "lease's pool" : "segment", r->offset);
        return j->err;
    }
    return 0;
}

static void write_pump(write_state *st);

static void write_end(write_state *st, int err, const char *why)
{
    st->ended = 1;
    if (err)
        mg_call_fail(st->call, err, "%s", why);
    write_free(st);
}

static int write_submit(write_state *st, write_job *j);

static void write_done(void *arg, int result)
{
    write_job *j = arg;
    write_state *st = j->st;
    mg_registry *reg = mg_engine_registry(st->gw->engine);

    st->in_flight = 0;
    if (st->ended || mg_call_done(st->call)) {
        write_job_free(j);
        mg_call_release(st->call);
        write_free(st);
        return;
    }
    if (result != 0) {
        char why[256];
        snprintf(why, sizeof(why), "%s", j->why);
        write_job_free(j);
        write_end(st, result, why);
        return;
    }
    if (st->seg == NULL) { /* the first message: look its segment or lease up, then copy */
        mg_segment_info info;
        uint64_t id = j->req->id, lease_id = j->req->lease_id;
        char holder[MG_SEG_HOLDER_MAX], why[256];
        int rc = 0;
        if ((id == 0) == (lease_id == 0)) {
            rc = MG_ERR_INVALID;
            snprintf(why, sizeof(why),
                     "the first message must name the segment (id) or a lease "
                     "(lease_id), one of them");
        } else if (lease_id) {
            snprintf(holder, sizeof(holder), "WriteSegment of lease %" PRIu64 " by %s", lease_id,
                     mg_call_peer(st->call));
            if (mg_pools_use(st->gw->pools, mg_call_tenant(st->call), lease_id, holder, &st->seg,
                             &st->base, &st->limit, &st->lease) != 0) {
                rc = MG_ERR_NOT_FOUND;
                snprintf(why, sizeof(why), "no lease %" PRIu64, lease_id);
            }
            st->lease_id = lease_id;
        } else {
            snprintf(holder, sizeof(holder), "WriteSegment by %s", mg_call_peer(st->call));
            if (mg_registry_acquire(reg, mg_call_tenant(st->call), id, holder, &st->seg) != 0) {
                rc = MG_ERR_NOT_FOUND;
                snprintf(why, sizeof(why), "no segment %" PRIu64, id);
            } else {
                mg_segment_get_info(reg, st->seg, &info);
                st->limit = info.size;
                if ((rc = mg_segment_allows(st->seg, MG_SEG_CAP_INLINE, why, sizeof(why))) != 0)
                    mg_registry_put(reg, st->seg); /* no mapping here to copy into */
            }
            st->id = id;
        }
        if (rc != 0) {
            st->seg = NULL;
            write_job_free(j);
            write_end(st, rc, why);
            return;
        }
        j->size = st->limit;
        write_submit(st, j);
        return;
    }
    st->messages++;
    st->written += j->req->data.len;
    memory_of(st->gw)->stats.inline_written_bytes += j->req->data.len;
    write_job_free(j);
    mg_call_release(st->call);
    write_pump(st);
}

/* Sends a job to a worker; on failure ends the call (and frees the job). */
static int write_submit(write_state *st, write_job *j)
{
    int rc = mg_engine_submit(st->gw->engine, st->gw->cq, write_work, write_done, j);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof(why), "engine queue holds %u jobs (--queue-depth)",
                 (unsigned)st->gw->cfg->queue_depth);
        write_job_free(j);
        write_end(st, rc, why);
        return -1;
    }
    st->in_flight = 1;
    return 0;
}

/* Applies the next received message when no job is out; answers after the last one. */
static void write_pump(write_state *st)
{
    write_msg *m;
    write_job *j;

    if (st->in_flight || st->ended)
        return;
    if (st->head == NULL) {
        if (!st->half_closed)
            return;
        if (st->messages == 0) {
            write_end(st, MG_ERR_INVALID, "WriteSegment needs at least one message");
            return;
        }
        {
            Moongate__V1__WriteSegmentResponse resp = MOONGATE__V1__WRITE_SEGMENT_RESPONSE__INIT;
            resp.bytes_written = st->written;
            resp.chunks = st->messages;
            st->ended = 1;
            mg_call_reply(st->call, &resp.base);
            write_free(st);
        }
        return;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        write_end(st, MG_ERR_NOMEM, "out of memory");
        return;
    }
    m = st->head;
    st->head = m->next;
    if (st->head == NULL)
        st->tail = NULL;
    j->st = st;
    j->raw = m->raw;
    j->len = m->len;
    j->index = st->messages + 1;
    free(m);
    j->size = st->limit;
    write_submit(st, j);
}

static write_state *write_state_get(mg_call *call)
{
    write_state *st = mg_call_data(call);
    if (st != NULL)
        return st;
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NULL;
    st->call = call;
    st->gw = mg_call_gateway(call);
    mg_call_ref(call);
    mg_call_set_data(call, st);
    return st;
}

static void write_raw(mg_call *call, uint8_t *data, size_t len)
{
    write_state *st = write_state_get(call);
    write_msg *m = st ? calloc(1, sizeof(*m)) : NULL;
    if (m == NULL) {
        free(data);
        mg_call_release(call);
        if (st)
            write_end(st, MG_ERR_NOMEM, "out of memory");
        else
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    m->raw = data;
    m->len = len;
    memory_of(st->gw)->stats.write_queued_bytes += len;
    if (st->tail)
        st->tail->next = m;
    else
        st->head = m;
    st->tail = m;
    write_pump(st);
}

static void write_half_close(mg_call *call)
{
    write_state *st = write_state_get(call);
    if (st == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    st->half_closed = 1;
    write_pump(st);
}

static void write_cancel(mg_call *call)
{
    write_state *st = mg_call_data(call);
    if (st == NULL || st->ended)
        return;
    st->ended = 1;
    if (!st->in_flight)
        write_free(st); /* else the job's return frees it */
}

static const mg_method io_methods[] = {
    {.path = "/moongate.v1.Memory/ReadSegment",
     .kind = MG_RPC_SERVER_STREAM,
     .in = &moongate__v1__read_segment_request__descriptor,
     .out = &moongate__v1__segment_chunk__descriptor,
     .on_message = read_message,
     .on_cancel = read_cancel,
     .on_writable = read_writable},
    {.path = "/moongate.v1.Memory/WriteSegment",
     .kind = MG_RPC_CLIENT_STREAM,
     .in = &moongate__v1__write_segment_request__descriptor,
     .out = &moongate__v1__write_segment_response__descriptor,
     .on_raw = write_raw,
     .on_half_close = write_half_close,
     .on_cancel = write_cancel},
    MG_UNARY("/moongate.v1.Memory/Checksum", &moongate__v1__read_segment_request__descriptor,
             &moongate__v1__checksum_response__descriptor, checksum_message),
};

int mg_svc_memory_io_init(mg_gateway *gw)
{
    return mg_gateway_add_methods(gw, io_methods, MG_NELEM(io_methods), NULL, 0);
}
