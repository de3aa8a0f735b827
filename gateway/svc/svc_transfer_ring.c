/*
 * svc_transfer_ring: moongate.v1.Transfer AttachRing — the submission rings of processes on the
 * daemon's host (moongate/ring.h, moongate/ringwire.h). A process posts batches there by index
 * into its connection's prepared lists and reads their ends without a call each.
 *
 * Loop thread. The ring thread (engine) copies each submission out of the ring and checks its
 * shape; here it becomes a SubmitRequest of one group (prepared pairs, or a strided group over
 * two listed ranges) and goes through the checks of any Submit (mg_xfer_svc_submit), as its
 * connection's: its tenant, its process, its lists. Its batch is a batch like any other; its
 * end, or its refusal, is answered on the ring. A ring is bound to the connection that attached
 * it: when that closes, nothing more is taken from the ring or answered on it, and the ring goes
 * with the last batch it posted.
 */
#include "svc_transfer.h"

#include "mg_fdsock.h"
#include "mg_log.h"
#include "mg_str.h"

#include "moongate/ring.h"
#include "moongate/v1/transfer.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RINGS_PER_CONN       4
#define RING_ENTRIES_DEFAULT 256

typedef struct xring {
    mg_conn_bind bind;
    struct mg_transfer_svc *ts;
    mg_ring *ring;
    struct xring *prev, *next; /* the service's rings */
    int refs;                  /* the binding's, each batch's and each held origin's */
    int gone;                  /* its connection closed */
    int chan;                  /* the process's channel: closed when the ring goes, it hears */
    uint64_t conn;
    mg_proc proc;
    char tenant[MG_SEG_NAME_MAX + 1];
    char who[128];
} xring;

void mg_xfer_ring_hold(xring *x, int delta)
{
    x->refs += delta;
    if (x->refs > 0)
        return;
    mg_ring_free(x->ring);
    free(x);
}

static void ring_closed(mg_conn_bind *b)
{
    xring *x = mg_container_of(b, xring, bind);
    x->gone = 1;
    mg_ring_close(x->ring);
    close(x->chan); /* the process hears the ring is gone (its end reads EOF) */
    x->chan = -1;
    if (x->prev)
        x->prev->next = x->next;
    else
        x->ts->ring_list = x->next;
    if (x->next)
        x->next->prev = x->prev;
    x->prev = x->next = NULL;
    mg_xfer_ring_hold(x, -1);
}

int mg_xfer_ring_gone(const xfer_origin *o)
{
    return o->ring->gone;
}

static void answer(xring *x, uint64_t user_data, const mg_ring_cqe *c)
{
    mg_ring_cqe a = *c;
    a.user_data = user_data;
    mg_ring_complete(x->ring, &a);
}

void mg_xfer_ring_refused(const xfer_origin *o, int code, const char *fmt, ...)
{
    mg_ring_cqe c = {.code = (uint32_t)code, .failed = UINT32_MAX};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c.why, sizeof(c.why), fmt, ap);
    va_end(ap);
    answer(o->ring, o->user_data, &c);
    if (o->accepted) /* it will not be accepted: one answer only */
        mg_ring_forgo(o->ring->ring);
}

void mg_xfer_ring_entered(const xfer_origin *o, mg_batch *b)
{
    batch_front *f = front_of(b);
    f->ring = o->ring;
    f->user_data = o->user_data;
    mg_xfer_ring_hold(o->ring, 1);
    if (o->accepted) {
        mg_ring_cqe c = {.batch_id = b->id,
                         .requests = (uint32_t)b->n,
                         .failed = UINT32_MAX,
                         .flags = MG_RING_CQE_ACCEPTED};
        answer(o->ring, o->user_data, &c);
    }
}

/* The first request of b that failed: its index, error and message. */
static size_t first_failed(const mg_batch *b, int *err, const char **msg)
{
    for (size_t i = 0; i < b->n; i++) {
        int failed =
            b->reqs ? b->reqs[i].life.state == MG_REQ_FAILED : b->recs[i].state == MG_REQ_FAILED;
        if (failed) {
            *err = b->reqs ? b->reqs[i].err : b->recs[i].err;
            *msg = b->reqs ? b->reqs[i].msg : b->recs[i].msg;
            return i;
        }
    }
    return SIZE_MAX;
}

void mg_xfer_ring_over(mg_batch *b)
{
    batch_front *f = front_of(b);
    xring *x = f->ring;
    mg_ring_cqe c = {.batch_id = b->id,
                     .requests = (uint32_t)b->n,
                     .done = (uint32_t)b->counts.done,
                     .failed = UINT32_MAX};
    const char *msg = NULL;
    int err = 0;
    size_t i;
    f->ring = NULL;
    if (!mg_batch_is_over(b)) {
        c.code = (uint32_t)mg_err_grpc(MG_ERR_SHUTDOWN);
        snprintf(c.why, sizeof(c.why), "the daemon stopped before batch %" PRIu64 " ended", b->id);
    } else if ((i = first_failed(b, &err, &msg)) != SIZE_MAX) {
        c.code = (uint32_t)mg_err_grpc(err ? err : MG_ERR_INVALID);
        c.failed = (uint32_t)i;
        snprintf(c.why, sizeof(c.why), "request %zu: %s", i, msg ? msg : mg_strerror(err));
    }
    answer(x, f->user_data, &c);
    mg_xfer_ring_hold(x, -1);
}

/* ---- submissions ---- */

/* Range `index` of list l, for a strided submission: the block count - 1 at offset + (count -
 * 1) * stride, length bytes, ends inside it. Returns NULL, or what is wrong (in why). */
static const char *strided_range(const mg_xlist *l, const char *side, uint32_t index,
                                 uint64_t offset, uint64_t stride, uint64_t length, uint32_t count,
                                 char *why, size_t cap)
{
    uint64_t last = count - 1, len;
    if (index >= l->n) {
        snprintf(why, cap, "%s_index %u is past the list's %u ranges", side, index, l->n);
        return why;
    }
    len = l->lens[index];
    if ((stride && last > (UINT64_MAX - offset) / stride) || length > len ||
        offset + last * stride > len - length) {
        snprintf(why, cap,
                 "block %" PRIu64 " (%s_offset %" PRIu64 " + %" PRIu64 " * %s_stride %" PRIu64
                 ", %" PRIu64 " bytes) ends past range %u of %s_list (%" PRIu64 " bytes)",
                 last, side, offset, last, side, stride, length, index, side, len);
        return why;
    }
    return NULL;
}

/* A strided submission as a Strided group over the two lists' ranges. Returns 0, or -1 after
 * answering it. */
static int strided_group(const xfer_origin *o, const mg_ring_sqe *e, Moongate__V1__Strided *st)
{
    struct mg_transfer_svc *ts = o->ts;
    const mg_xlist *lo = mg_xlists_find(ts->xlists, e->local_list, o->tenant, o->conn);
    const mg_xlist *ro = mg_xlists_find(ts->xlists, e->remote_list, o->tenant, o->conn);
    const char *bad = NULL;
    char why[256];
    if (lo == NULL || ro == NULL) {
        mg_xfer_origin_fail(o, MG_ERR_NOT_FOUND,
                            "no prepared list %" PRIu64 " of this ring's connection",
                            lo == NULL ? e->local_list : e->remote_list);
        return -1;
    }
    if (lo->agent[0] || !ro->agent[0]) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID,
                            "local_list is this process's memory and remote_list an agent's: "
                            "lists %" PRIu64 " and %" PRIu64 " are not",
                            e->local_list, e->remote_list);
        return -1;
    }
    bad = strided_range(lo, "local", e->u.strided.local_index, e->u.strided.local_offset,
                        e->u.strided.local_stride, e->u.strided.length, e->count, why, sizeof(why));
    if (bad == NULL)
        bad = strided_range(ro, "remote", e->u.strided.remote_index, e->u.strided.remote_offset,
                            e->u.strided.remote_stride, e->u.strided.length, e->count, why,
                            sizeof(why));
    if (bad) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID, "%s; nothing was moved", bad);
        return -1;
    }
    st->op = e->op;
    st->local_address = lo->addrs[e->u.strided.local_index];
    st->local_offset = e->u.strided.local_offset;
    st->local_stride = e->u.strided.local_stride;
    st->peer = (char *)ro->peer;
    st->remote_agent = (char *)ro->agent;
    st->remote_address = ro->addrs[e->u.strided.remote_index];
    st->remote_offset = e->u.strided.remote_offset;
    st->remote_stride = e->u.strided.remote_stride;
    st->length = e->u.strided.length;
    st->count = e->count;
    return 0;
}

/* The note of a submission with MG_RING_NOTIFY, for the remote list's peer. Returns 0 (np
 * set; topic and payload point into s->note), or -1 after answering it. */
static int ring_note(const xfer_origin *o, mg_ring_sub *s, Moongate__V1__NotifyPeer *np)
{
    const mg_xlist *ro = mg_xlists_find(o->ts->xlists, s->e.remote_list, o->tenant, o->conn);
    char *nul = memchr(s->note, '\0', s->e.note_len);
    if (nul == NULL) {
        mg_xfer_origin_fail(o, MG_ERR_INVALID, "note: no NUL after its topic; nothing was moved");
        return -1;
    }
    np->peer = ro ? (char *)ro->peer : ""; /* no list: the batch is refused naming it */
    np->topic = s->note;
    np->payload.data = (uint8_t *)nul + 1;
    np->payload.len = s->e.note_len - (size_t)(nul + 1 - s->note);
    return 0;
}

/* A submission the ring thread took (mg_ring_sub_fn): a Submit of its connection. */
static void ring_submission(void *arg, mg_ring_sub *s)
{
    struct mg_transfer_svc *ts = arg;
    xring *x = mg_ring_front(s->ring);
    Moongate__V1__SubmitRequest req = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__Prepared p = MOONGATE__V1__PREPARED__INIT, *pp = &p;
    Moongate__V1__Strided st = MOONGATE__V1__STRIDED__INIT, *stp = &st;
    Moongate__V1__NotifyPeer np = MOONGATE__V1__NOTIFY_PEER__INIT, *npp = &np;
    xfer_origin o = {.ts = ts,
                     .ring = x,
                     .user_data = s->e.user_data,
                     .accepted = s->answers == 2,
                     .tenant = x->tenant,
                     .conn = x->conn,
                     .proc = x->proc,
                     .who = x->who};
    if (s->bad[0]) {
        mg_xfer_origin_fail(&o, MG_ERR_INVALID, "%s; nothing was moved", s->bad);
    } else if (transfer_closing(ts)) {
        mg_xfer_origin_fail(&o, MG_ERR_SHUTDOWN, "the daemon is stopping; nothing was moved");
    } else if (s->note && ring_note(&o, s, &np) != 0) {
        /* answered */
    } else if (s->e.kind == MG_RING_PAIRS) {
        p.op = s->e.op;
        p.local_list = s->e.local_list;
        p.remote_list = s->e.remote_list;
        p.n_local_indices = p.n_remote_indices = s->e.count;
        p.local_indices = s->local;
        p.remote_indices = s->remote;
        req.n_prepared = 1;
        req.prepared = &pp;
        req.n_notify = s->note ? 1 : 0;
        req.notify = &npp;
        mg_xfer_svc_submit(&o, &req);
    } else if (strided_group(&o, &s->e, &st) == 0) {
        req.n_strided = 1;
        req.strided = &stp;
        req.n_notify = s->note ? 1 : 0;
        req.notify = &npp;
        mg_xfer_svc_submit(&o, &req);
    }
    mg_ring_sub_free(s);
}

/* ---- AttachRing ---- */

static int rings_of(const struct mg_transfer_svc *ts, uint64_t conn)
{
    int n = 0;
    for (const xring *x = ts->ring_list; x; x = x->next)
        n += x->conn == conn;
    return n;
}

/* Sends the ring's memory and bells to the process on its channel socket. */
static int send_hello(int chan, mg_ring *r, char *err, size_t cap)
{
    mg_ring_hello h = {.magic = MG_RING_MAGIC, .ring_id = mg_ring_id(r)};
    int fds[3];
    char ctl[CMSG_SPACE(sizeof(fds))];
    struct iovec iov = {&h, sizeof(h)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *cm;
    int type = 0;
    socklen_t tl = sizeof(type);
    if (getsockopt(chan, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_SEQPACKET) {
        snprintf(err, cap, "channel: not a SOCK_SEQPACKET Unix socket");
        return MG_ERR_INVALID;
    }
    mg_ring_fds(r, fds, &h.size);
    memset(ctl, 0, sizeof(ctl));
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(cm), fds, sizeof(fds));
    if (sendmsg(chan, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(h)) {
        snprintf(err, cap, "channel: the ring cannot be sent there: %s", strerror(errno));
        return MG_ERR_INVALID;
    }
    return 0;
}

void mg_xfer_svc_attach_ring(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__AttachRingRequest *req = (const void *)m;
    struct mg_transfer_svc *ts = transfer_of(mg_call_gateway(call));
    Moongate__V1__AttachRingResponse resp = MOONGATE__V1__ATTACH_RING_RESPONSE__INIT;
    uint32_t entries = req->entries ? req->entries : RING_ENTRIES_DEFAULT, uid;
    char err[MG_SEG_ERROR_MAX];
    int chan = -1, rc;
    xring *x;
    if (ts == NULL || ts->rings == NULL) {
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "this daemon cannot transfer");
        return;
    }
    if ((x = calloc(1, sizeof(*x))) == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    if (!mg_call_socket_cred(call, &uid, &x->proc) || x->proc.pid <= 0) {
        free(x);
        mg_call_fail(call, MG_ERR_INVALID,
                     "a ring is for a process on the daemon's host: attach it on the Unix socket");
        return;
    }
    if (rings_of(ts, mg_call_conn_id(call)) >= RINGS_PER_CONN) {
        free(x);
        mg_call_fail(call, MG_ERR_QUOTA, "this connection has %d rings already", RINGS_PER_CONN);
        return;
    }
    x->ts = ts;
    x->refs = 1;
    x->conn = mg_call_conn_id(call);
    mg_strlcpy(x->tenant, mg_call_tenant(call), sizeof(x->tenant));
    snprintf(x->who, sizeof(x->who), "ring of %s", mg_call_peer(call));
    if ((rc = mg_call_take_fd(call, req->channel, &chan, err)) != 0 ||
        (rc = mg_ring_new(ts->rings, entries, x, &x->ring, err, sizeof(err))) != 0 ||
        (rc = send_hello(chan, x->ring, err, sizeof(err))) != 0) {
        if (chan >= 0)
            close(chan);
        mg_ring_free(x->ring);
        free(x);
        mg_call_fail(call, rc, "%s", err);
        return;
    }
    x->chan = chan; /* kept open while the ring is served: the process can tell */
    x->bind.closed = ring_closed;
    if (mg_call_bind(call, &x->bind) != 0) { /* the connection is gone */
        close(chan);
        mg_ring_free(x->ring);
        free(x);
        mg_call_fail(call, MG_ERR_UNAVAILABLE, "the connection closed");
        return;
    }
    x->next = ts->ring_list;
    if (x->next)
        x->next->prev = x;
    ts->ring_list = x;
    mg_ring_start(x->ring);
    mg_info("ring_attached", "ring=%" PRIu64 " entries=%u pid=%d tenant=%s", mg_ring_id(x->ring),
            entries, (int)x->proc.pid, x->tenant);
    resp.ring_id = mg_ring_id(x->ring);
    resp.entries = entries;
    {
        int fds[3];
        mg_ring_fds(x->ring, fds, &resp.size);
    }
    mg_call_reply(call, &resp.base);
}

int mg_xfer_rings_start(struct mg_transfer_svc *ts)
{
    return mg_rings_new(&ts->rings, ts->gw->cq, ring_submission, ts);
}

void mg_xfer_rings_stop(struct mg_transfer_svc *ts)
{
    mg_rings_del(ts->rings);
    ts->rings = NULL;
}
