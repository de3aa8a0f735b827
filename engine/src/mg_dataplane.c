/*
 * mg_dataplane: the TCP data plane (see moongate/dataplane.h).
 *
 * Server: an accept thread and one thread per connection, blocking I/O; stop() shuts every
 * socket down so blocked reads return, then joins. A connection thread owns its socket and
 * takes a registry reference on a target for exactly as long as a slice's bytes move.
 * Client: blocking calls on the caller's thread (an engine worker), up to `window` slices in
 * flight, answers read in order.
 */
#include "moongate/dataplane.h"
#include "moongate/fault.h"

#include "mg_log.h"
#include "mg_tsan.h"
#include "mg_time.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* gRPC status codes used on the wire (the values of grpc/status.h). */
enum {
    ST_OK = 0,
    ST_INVALID_ARGUMENT = 3,
    ST_NOT_FOUND = 5,
    ST_PERMISSION_DENIED = 7,
    ST_FAILED_PRECONDITION = 9,
    ST_OUT_OF_RANGE = 11,
    ST_UNIMPLEMENTED = 12,
    ST_INTERNAL = 13,
    ST_DATA_LOSS = 15,
    ST_UNAUTHENTICATED = 16,
};

int mg_dp_status_err(uint32_t st)
{
    switch (st) {
    case ST_OK:
        return 0;
    case ST_INVALID_ARGUMENT:
        return MG_ERR_INVALID;
    case ST_NOT_FOUND:
        return MG_ERR_NOT_FOUND;
    case ST_PERMISSION_DENIED:
        return MG_ERR_PERMISSION;
    case ST_FAILED_PRECONDITION:
        return MG_ERR_STATE;
    case ST_OUT_OF_RANGE:
        return MG_ERR_RANGE;
    case ST_UNIMPLEMENTED:
        return MG_ERR_UNSUPPORTED;
    case ST_DATA_LOSS:
        return MG_ERR_DATA_LOSS;
    case ST_UNAUTHENTICATED:
        return MG_ERR_AUTH;
    default:
        return MG_ERR_PROTOCOL;
    }
}

/* ------------------------------------------------------------------ socket helpers */

/* Waits until fd is ready for `events`, at most timeout_ms (-1: no limit). With a stop word
 * (may be NULL) it looks at it every 100 ms. Returns 0, or -1 with errno ETIMEDOUT, ECANCELED
 * (*stop was set) or poll's error. */
static int wait_ready(int fd, short events, int timeout_ms, const int *stop)
{
    int waited = 0;
    for (;;) {
        struct pollfd pfd = {fd, events, 0};
        int step = timeout_ms < 0 ? -1 : timeout_ms - waited, pr;
        if (stop) {
            if (__atomic_load_n(stop, __ATOMIC_ACQUIRE) != 0) {
                errno = ECANCELED;
                return -1;
            }
            if (step < 0 || step > 100)
                step = 100;
        }
        pr = poll(&pfd, 1, step);
        if (pr > 0)
            return 0;
        if (pr < 0 && errno != EINTR)
            return -1;
        if (pr == 0 && timeout_ms >= 0 && (waited += step) >= timeout_ms) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
}

/* Sets fd's TCP congestion control to `name` (NULL or "": leaves the system's). Returns 0, or -1
 * with why in err, naming the ones this kernel has and those any process may choose. */
static int set_congestion(int fd, const char *name, char *err, size_t errcap)
{
    static const char *const lists[2] = {"/proc/sys/net/ipv4/tcp_available_congestion_control",
                                         "/proc/sys/net/ipv4/tcp_allowed_congestion_control"};
    char have[2][160] = {"unknown", "unknown"};
    int e;
    if (name == NULL || name[0] == '\0')
        return 0;
    if (strlen(name) < MG_DP_CONGESTION_MAX &&
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0)
        return 0;
    e = strlen(name) < MG_DP_CONGESTION_MAX ? errno : ENAMETOOLONG;
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(lists[i], "r");
        if (f && fgets(have[i], sizeof(have[i]), f))
            have[i][strcspn(have[i], "\n")] = '\0';
        if (f)
            fclose(f);
    }
    snprintf(err, errcap,
             "TCP congestion control %.32s: %s (this kernel has: %s; without CAP_NET_ADMIN "
             "only: %s)",
             name, strerror(e), have[0], have[1]);
    return -1;
}

/* The number in field `field` (0-based) of the /proc file at path, or 0. */
static uint64_t proc_number(const char *path, int field)
{
    unsigned long long v[3] = {0, 0, 0};
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%llu %llu %llu", &v[0], &v[1], &v[2]) < field + 1)
        v[field] = 0;
    fclose(f);
    return v[field];
}

/* Bounds what fd may hold queued to send, as mg_dp_tcp.send_buffer says. BBR sends at a paced
 * rate, so what the application writes waits in the queue; autotuning lets that queue grow to
 * tcp_wmem's ceiling (4 MiB by default), megabytes whose cache lines are gone by the time they
 * are sent and, on a host's own links, copied out by the receiver. A queue of twice what
 * 100 Gbit/s fills over the path's RTT still lets one connection carry 25 GB/s. */
static void set_send_buffer(int fd, uint32_t want, const char *peer)
{
    char cc[MG_DP_CONGESTION_MAX] = "";
    socklen_t len = sizeof(cc) - 1, tlen = sizeof(struct tcp_info);
    struct tcp_info ti = {0};
    int half, automatic = want == MG_DP_SEND_BUFFER_AUTO;
    if (want == 0)
        return;
    getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len);
    getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tlen);
    if (automatic) {
        uint64_t bound = (uint64_t)ti.tcpi_rtt * 25000; /* 2 x 12.5 GB/s x RTT in us */
        if (bound < MG_DP_SEND_BUFFER_MIN)
            bound = MG_DP_SEND_BUFFER_MIN;
        if (strncmp(cc, "bbr", 3) != 0 || bound > proc_number("/proc/sys/net/ipv4/tcp_wmem", 2))
            return;
        want = (uint32_t)bound;
    }
    half = (int)(want / 2);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &half, sizeof(half)) != 0) {
        /* Without CAP_NET_ADMIN the kernel holds it at net.core.wmem_max: a size asked for is
         * held there; auto keeps autotuning rather than a queue shorter than the path needs. */
        if (automatic && (uint64_t)half > proc_number("/proc/sys/net/core/wmem_max", 0))
            return;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &half, sizeof(half));
    }
    len = sizeof(half);
    if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &half, &len) != 0)
        half = 0;
    mg_debug("send_buffer", "peer=%s congestion=%s rtt_us=%u bytes=%d", peer, cc, ti.tcpi_rtt,
             half);
}

/* Receives into the pieces of iov (in order), at least one byte: what is there, or, when nothing
 * is, what comes first (waits at most timeout_ms, -1: forever). Returns the count, or -1
 * (closed, error, timeout or stop; errno says which: 0 for an orderly close). */
static ssize_t recv_iov(int fd, struct iovec *iov, size_t iovcnt, int timeout_ms, const int *stop)
{
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = iovcnt};
    for (;;) {
        ssize_t r;
        MG_PAYLOAD_BEGIN(); /* into a segment's bytes (mg_tsan.h) */
        r = recvmsg(fd, &mh, MSG_DONTWAIT);
        MG_PAYLOAD_END();
        if (r > 0)
            return r;
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_ready(fd, POLLIN, timeout_ms, stop) != 0)
                return -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
}

/* Reads exactly n bytes; waits at most timeout_ms for each piece (-1: forever). Returns 0, or
 * -1 as recv_iov. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms, const int *stop)
{
    uint8_t *p = buf;
    while (n > 0) {
        struct iovec iov = {p, n};
        ssize_t r = recv_iov(fd, &iov, 1, timeout_ms, stop);
        if (r < 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Writes the iovcnt pieces of iov (changed: what is left of them) in as few sendmsg calls as
 * the socket takes (one, unless it is full): a frame's header never goes as a packet of its
 * own. `more`: another frame follows at once (MSG_MORE: the kernel fills packets instead of
 * sending each frame as its own; the writer pushes the last one, see run_send). */
static int write_iov(int fd, struct iovec *iov, size_t iovcnt, int more, int timeout_ms,
                     const int *stop)
{
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = iovcnt};
    while (mh.msg_iovlen > 0) {
        ssize_t w;
        MG_PAYLOAD_BEGIN(); /* from a segment's bytes (mg_tsan.h) */
        w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
        MG_PAYLOAD_END();
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_ready(fd, POLLOUT, timeout_ms, stop) != 0)
                    return -1;
                continue;
            }
            if (errno == EINTR)
                continue;
            return -1;
        }
        for (size_t took; mh.msg_iovlen > 0; mh.msg_iov++, mh.msg_iovlen--) {
            took = (size_t)w < mh.msg_iov->iov_len ? (size_t)w : mh.msg_iov->iov_len;
            mh.msg_iov->iov_base = (uint8_t *)mh.msg_iov->iov_base + took;
            mh.msg_iov->iov_len -= took;
            w -= (ssize_t)took;
            if (mh.msg_iov->iov_len > 0)
                break; /* the socket took part of this piece */
        }
    }
    return 0;
}

/* write_iov of a header of plen bytes and a payload of len (may be 0). */
static int write_two(int fd, const void *pre, size_t plen, const void *payload, size_t len,
                     int more, int timeout_ms, const int *stop)
{
    struct iovec iov[2] = {{(void *)pre, plen}, {(void *)payload, len}};
    return write_iov(fd, iov, len ? 2 : 1, more, timeout_ms, stop);
}

static int send_frame(int fd, const mg_df_header *h, const void *payload, size_t len,
                      int timeout_ms, const int *stop)
{
    uint8_t head[MG_DF_HEADER_BYTES];
    mg_df_encode(h, head);
    return write_two(fd, head, sizeof(head), payload, len, 0, timeout_ms, stop);
}

/* ------------------------------------------------------------------ server */

/* After a payload shorter than this the server reads ahead; after a longer one, exactly. */
#define MG_DP_AHEAD_BYTES (64u << 10)
#define RBUF_BYTES        (128u << 10) /* a connection's read-ahead */
#define OUT_FRAMES        32           /* answers a connection holds back at most */
#define OUT_BYTES         (1u << 20)   /* ... and READ payload bytes */

/* The destination or source of a slice: a segment (a reference is taken) or a remote-accessible
 * lease (a slot is taken); released with target_done. */
typedef struct {
    mg_segment *seg;
    mg_lease_slot *slot;
} dp_target;

/* A segment a connection keeps its reference to while slices to it come one after another:
 * the next ones take no registry lock each. */
typedef struct {
    dp_target t;
    uint64_t id, size;
    uint8_t *addr;
} dp_hot;

/* An answer held back: its header, and a READ's payload with what keeps that in place. */
typedef struct {
    uint8_t head[MG_DF_HEADER_BYTES];
    const uint8_t *payload;
    uint32_t len;
    dp_target tgt;
} dp_answer;

typedef struct dp_conn {
    mg_dp_server *srv;
    int fd;
    pthread_t thread;
    int done; /* the thread ended: join it */
    char peer[64];
    struct dp_conn *next;
    /* Answers not sent yet (WRITE acks, READ data): they go together, in order and in one
     * sendmsg, once the client's requests stop coming (the next header is not there yet), or
     * when OUT_FRAMES or OUT_BYTES are waiting. */
    dp_answer out[OUT_FRAMES];
    size_t nout, out_bytes;
    /* Read-ahead: after a small frame, the stream is read in large pieces (small slices take
     * one recv for many instead of two each) and headers and small payloads are copied out;
     * after a large one, exactly the next header is read, and payloads go straight into place
     * (no copy by the CPU). */
    int ahead;
    size_t rpos, rlen; /* rbuf[rpos, rlen): received, not used yet */
    uint8_t rbuf[RBUF_BYTES];
    uint8_t *stage; /* checksummed READ answers pass through here summed, side by side, and
                     * READ answers from memory this process does not map (a process's) */
    size_t stage_cap;
    size_t staged; /* bytes of it the answers held use */
    uint8_t *land; /* WRITEs into memory this process does not map land here first (LAND_BYTES) */
    /* The segments the last WRITE and the last READ slice used ([1]: READ), let go when the
     * answers go out, and so before the connection waits for the next frame: the WRITE's
     * before (a client that has its acks may unregister the segment at once), the READ's
     * after (the answers' payloads are in it). */
    dp_hot hot[2];
} dp_conn;

/* A connection's stage (*stage of *cap bytes) grown to at least n. Returns 0, or -1 (errno
 * ENOMEM; the stage as it was). */
static int stage_grow(uint8_t **stage, size_t *cap, size_t n)
{
    uint8_t *grown;
    if (*cap >= n)
        return 0;
    if ((grown = realloc(*stage, n)) == NULL) {
        errno = ENOMEM;
        return -1;
    }
    *stage = grown;
    *cap = n;
    return 0;
}

/* The CRC32C of n source bytes, taken while they are copied into a stage (*stage, grown to n):
 * the segment is read once — the kernel's send then reads the warm copy — instead of once for
 * the sum and again for the send. Returns the stage, or NULL: no memory for it (*crc
 * untouched: sum the source itself) or the source faulted (errno EFAULT: a client cut the
 * segment's file). */
static const uint8_t *stage_summed(uint8_t **stage, size_t *cap, const uint8_t *src, size_t n,
                                   uint32_t *crc)
{
    if (stage_grow(stage, cap, n) != 0)
        return NULL;
    if (mg_guarded_copy_crc32c(*stage, src, n, crc, 0) != 0) { /* send reads it next */
        errno = EFAULT;
        return NULL;
    }
    return *stage;
}

/* stage_summed, or the sum of the source itself when no stage can be had. Returns what to
 * send (NULL: the source faulted). */
static const uint8_t *summed(uint8_t **stage, size_t *cap, const uint8_t *src, size_t n,
                             uint32_t *crc)
{
    const uint8_t *staged = stage_summed(stage, cap, src, n, crc);
    if (staged || errno == EFAULT)
        return staged;
    return mg_guarded_crc32c(crc, src, n) == 0 ? src : NULL;
}

/* Checksummed payloads are staged side by side in a stage of this much (when it can be had),
 * and go together in one sendmsg when it is full. */
#define STAGE_GATHER_BYTES (512u << 10)

/* summed() into the stage at offset `at`, behind payloads staged there and not sent yet: the
 * stage is not moved then (the caller checked that at + n fits). At 0 it first grows to hold
 * several payloads, if it can. */
static const uint8_t *summed_at(uint8_t **stage, size_t *cap, size_t at, const uint8_t *src,
                                size_t n, uint32_t *crc)
{
    uint8_t *p = *stage + at;
    size_t room = *cap - at;
    if (at > 0)
        return stage_summed(&p, &room, src, n, crc);
    (void)stage_grow(stage, cap, STAGE_GATHER_BYTES); /* if refused, one payload at a time */
    return summed(stage, cap, src, n, crc);
}

struct mg_dp_server {
    mg_dp_server_config cfg;
    int lfd;
    int port;
    pthread_t accept_thread;
    pthread_mutex_t lock;
    dp_conn *conns;
    unsigned active;
    int stopping;
    mg_dp_server_stats stats; /* under lock; slices and bytes atomic (tally) */
    uint32_t corrupt;         /* checksummed slices still to corrupt (atomic; tests only) */
};

void mg_dp_server_corrupt(mg_dp_server *s, uint32_t n)
{
    __atomic_store_n(&s->corrupt, n, __ATOMIC_RELEASE);
}

/* Whether this checksummed slice is one to corrupt (Debug/CorruptSlices). */
static int corrupt_this(mg_dp_server *s)
{
    uint32_t n = __atomic_load_n(&s->corrupt, __ATOMIC_ACQUIRE);
    while (n && !__atomic_compare_exchange_n(&s->corrupt, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE))
        ;
    return n != 0;
}

static void target_done(mg_dp_server *s, dp_target *t)
{
    if (t->seg)
        mg_registry_put_passing(s->cfg.registry, t->seg);
    if (t->slot)
        mg_lease_table_end(s->cfg.leases, t->slot);
    t->seg = NULL;
    t->slot = NULL;
}

/* The answers held back go (send: 0 drops them, the connection ending) and what kept their
 * payloads in place is released. Returns 0 or -1. */
static int out_flush(dp_conn *c, int send)
{
    struct iovec iov[2 * OUT_FRAMES];
    size_t n = 0;
    int rc = 0;
    target_done(c->srv, &c->hot[0].t);
    for (size_t i = 0; i < c->nout; i++) {
        iov[n++] = (struct iovec){c->out[i].head, MG_DF_HEADER_BYTES};
        if (c->out[i].len)
            iov[n++] = (struct iovec){(void *)(uintptr_t)c->out[i].payload, c->out[i].len};
    }
    if (send && n && (rc = write_iov(c->fd, iov, n, 0, (int)c->srv->cfg.io_timeout_ms, NULL)) &&
        errno == EFAULT) /* probed when held (mg_fault_probe): cut since, mid-frame */
        mg_warn("data_send_cut",
                "peer=%s note=\"a segment's file was cut while a READ's bytes were sent from it: "
                "the connection ends\"",
                c->peer);
    for (size_t i = 0; i < c->nout; i++)
        target_done(c->srv, &c->out[i].tgt);
    target_done(c->srv, &c->hot[1].t);
    c->nout = c->out_bytes = c->staged = 0;
    return rc;
}

/* Holds back an answer: h, and len bytes of payload kept in place by *tgt (taken over; may be
 * NULL without a payload) or in the stage. Returns 0 or -1. */
static int out_hold(dp_conn *c, const mg_df_header *h, const uint8_t *payload, uint32_t len,
                    dp_target *tgt)
{
    dp_answer *a = &c->out[c->nout++];
    mg_df_encode(h, a->head);
    a->payload = payload;
    a->len = len;
    a->tgt = tgt ? *tgt : (dp_target){NULL, NULL};
    if (tgt)
        *tgt = (dp_target){NULL, NULL};
    c->out_bytes += len;
    return c->nout == OUT_FRAMES || c->out_bytes >= OUT_BYTES ? out_flush(c, 1) : 0;
}

static size_t rb_avail(const dp_conn *c)
{
    return c->rlen - c->rpos;
}

/* Receives into the read-ahead what is there (all the room takes when c->ahead, else up to
 * `want` bytes held in all), waiting (poll, timeout_ms; -1 for ever) only when nothing is and
 * `wait`. Returns 0 (maybe nothing got, when !wait) or -1 (errno; 0 when the peer closed). */
static int rb_fill(dp_conn *c, size_t want, int wait, int timeout_ms)
{
    if (c->rpos > 0) { /* what is left to the front: a frame's start, short */
        memmove(c->rbuf, c->rbuf + c->rpos, rb_avail(c));
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    for (;;) {
        size_t room = c->ahead ? sizeof(c->rbuf) - c->rlen : want - c->rlen;
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, room, MSG_DONTWAIT);
        if (r > 0) {
            c->rlen += (size_t)r;
            return 0;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || !wait)
            return wait ? -1 : 0;
        if (wait_ready(c->fd, POLLIN, timeout_ms, NULL) != 0)
            return -1;
    }
}

/* The next frame's header: taken at once if it is all there, else the answers held back go
 * out first (the client may be waiting for them) and the header is waited for. */
static int read_header(dp_conn *c, uint8_t *head)
{
    if (rb_avail(c) < MG_DF_HEADER_BYTES && c->nout && rb_fill(c, MG_DF_HEADER_BYTES, 0, 0) != 0)
        return -1;
    if (rb_avail(c) < MG_DF_HEADER_BYTES && out_flush(c, 1) != 0)
        return -1;
    while (rb_avail(c) < MG_DF_HEADER_BYTES) {
        if (rb_fill(c, MG_DF_HEADER_BYTES, 1, -1) != 0) /* idle peers wait */
            return -1;
    }
    memcpy(head, c->rbuf + c->rpos, MG_DF_HEADER_BYTES);
    c->rpos += MG_DF_HEADER_BYTES;
    return 0;
}

/* Bytes that just landed at p: the first is flipped when *flip asks (Debug/CorruptSlices). */
static void landed(uint8_t *p, size_t n, int *flip)
{
    if (*flip && n) {
        p[0] ^= 0x20;
        *flip = 0;
    }
}

/* The next n bytes of the stream into dst (a segment's memory: copies by the CPU run guarded),
 * or dropped when dst is NULL: first what the read-ahead holds, then a small rest through it,
 * a large one straight into place. With crc, every piece goes through the read-ahead and is
 * summed as it is copied into place (mg_crc32c_copy): summing it in the segment afterwards
 * would be a second pass over it, which costs about as much as the copy. The CRC32C is carried
 * on in *crc; flip: the first byte is corrupted on landing (tests). Returns 0,
 * MG_ERR_DATA_LOSS (dst's pages went missing: the bytes were still taken off the stream) or -1
 * (the connection failed). */
static int read_payload(dp_conn *c, uint8_t *dst, uint64_t n, int timeout_ms, uint32_t *crc,
                        int flip)
{
    int lost = 0;
    size_t after = n < MG_DP_AHEAD_BYTES ? sizeof(c->rbuf) : MG_DF_HEADER_BYTES;
    while (n > 0) {
        size_t k = rb_avail(c) < n ? rb_avail(c) : (size_t)n;
        if (k == 0 && dst && !lost && !crc && (n > sizeof(c->rbuf) / 2 || !c->ahead)) {
            /* What follows the payload comes in the same call, into the emptied read-ahead:
             * the next header, or after a small payload all that is there. */
            struct iovec iov[2] = {{dst, n}, {c->rbuf, after}};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
            ssize_t r;
            MG_PAYLOAD_BEGIN(); /* into the segment's bytes (mg_tsan.h) */
            r = recvmsg(c->fd, &mh, MSG_DONTWAIT);
            MG_PAYLOAD_END();
            c->rpos = c->rlen = 0;
            if (r > 0 && (uint64_t)r > n) {
                c->rlen = (size_t)r - n;
                r = (ssize_t)n;
            }
            if (r > 0) {
                landed(dst, (size_t)r, &flip);
                dst += r;
                n -= (uint64_t)r;
            } else if (r == 0) {
                errno = 0;
                return -1;
            } else if (errno == EFAULT) { /* takes nothing off the stream: the rest is dropped */
                lost = 1;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_ready(c->fd, POLLIN, timeout_ms, NULL) != 0)
                    return -1;
            } else if (errno != EINTR) {
                return -1;
            }
            continue;
        }
        if (k == 0) {
            if (rb_fill(c, n < sizeof(c->rbuf) ? (size_t)n : sizeof(c->rbuf), 1, timeout_ms) != 0)
                return -1;
            continue;
        }
        if (dst && !lost) {
            landed(c->rbuf + c->rpos, k, &flip);
            if ((crc ? mg_guarded_copy_crc32c(dst, c->rbuf + c->rpos, k, crc, 1)
                     : mg_guarded_copy(dst, c->rbuf + c->rpos, k)) != 0)
                lost = 1;
        }
        c->rpos += k;
        n -= k;
        if (dst)
            dst += k;
    }
    return lost ? MG_ERR_DATA_LOSS : 0;
}

/* Counts a slice answered: status st, a WRITE's bytes in or a READ's out (atomic: the
 * connections' threads count without the server's lock). */
static void tally(mg_dp_server *s, uint32_t st, int write, uint64_t bytes)
{
    mg_dp_server_stats *t = &s->stats;
    if (st != ST_OK) {
        __atomic_fetch_add(&t->slices_refused, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(write ? &t->slices_in : &t->slices_out, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(write ? &t->bytes_in : &t->bytes_out, bytes, __ATOMIC_RELAXED);
}

/* Checks a slice against its target; on success holds a reference and gives the address. */
static uint32_t check_target(mg_dp_server *s, const char *tenant, const mg_df_header *h,
                             dp_target *t, uint8_t **addr, uint64_t *size)
{
    mg_segment_info info;
    mg_segment **seg = &t->seg;
    if (h->flags & MG_DF_LEASE) {
        if (s->cfg.leases == NULL)
            return ST_UNIMPLEMENTED;
        switch (mg_lease_table_begin(s->cfg.leases, h->target, tenant, h->offset, h->length, addr,
                                     &t->slot)) {
        case 0:
            return ST_OK;
        case MG_ERR_RANGE:
            return ST_OUT_OF_RANGE;
        default: /* unknown, another tenant's, or not remote-accessible */
            return ST_NOT_FOUND;
        }
    }
    if (mg_registry_acquire_passing(s->cfg.registry, tenant, h->target, seg) != 0)
        return ST_NOT_FOUND;
    mg_segment_get_info(s->cfg.registry, *seg, &info);
    if (!info.remote_accessible || !(mg_segment_caps(*seg) & MG_SEG_CAP_TCP)) { /* RDMA only */
        mg_registry_put_passing(s->cfg.registry, *seg);
        return info.remote_accessible ? ST_UNIMPLEMENTED : ST_PERMISSION_DENIED;
    }
    if (mg_bounds_check(info.size, h->offset, h->length) != 0) {
        mg_registry_put_passing(s->cfg.registry, *seg);
        return ST_OUT_OF_RANGE;
    }
    /* memory this process does not map (a process's) is moved through its kind's read and
     * write (dp_unmapped_*): no address */
    *addr = mg_segment_caps(*seg) & MG_SEG_CAP_MAPPED ? (uint8_t *)mg_segment_addr(*seg) + h->offset
                                                      : NULL;
    *size = info.size;
    return ST_OK;
}

/* check_target through the connection's held segment for the slice's kind (c->hot): a slice to
 * it is checked against its size alone; one to another segment is checked in full, and that
 * segment's reference becomes the one held (a READ's only when none is: the answers held may
 * be in the one before). A checksummed READ keeps its own reference: the answers may go out
 * (and the held one with them) before it is summed into the stage. */
static uint32_t check_hot_target(dp_conn *c, const char *tenant, const mg_df_header *h,
                                 dp_target *t, uint8_t **addr)
{
    dp_hot *hot = &c->hot[h->type == MG_DF_READ];
    uint64_t size = 0;
    uint32_t st;
    if (h->type == MG_DF_READ && (h->flags & MG_DF_CRC))
        return check_target(c->srv, tenant, h, t, addr, &size);
    if (hot->t.seg && !(h->flags & MG_DF_LEASE) && h->target == hot->id) {
        if (mg_bounds_check(hot->size, h->offset, h->length) != 0)
            return ST_OUT_OF_RANGE;
        *addr = hot->addr + h->offset;
        return ST_OK;
    }
    st = check_target(c->srv, tenant, h, t, addr, &size);
    if (st == ST_OK && t->seg && *addr && (h->type == MG_DF_WRITE || !hot->t.seg)) {
        target_done(c->srv, &hot->t); /* a WRITE's: its slices have landed */
        *hot = (dp_hot){*t, h->target, size, *addr - h->offset};
        *t = (dp_target){NULL, NULL};
    }
    return st;
}

/* ---- memory this process does not map (a process's: no MG_SEG_CAP_MAPPED) ---- */

#define LAND_BYTES (256u << 10) /* a WRITE into it lands here piece by piece, in the cache */

/* The wire status of the kind's read or write failing. */
static uint32_t unmapped_status(int rc)
{
    switch (rc) {
    case MG_ERR_STATE: /* its process exited, or is another one now */
        return ST_FAILED_PRECONDITION;
    case MG_ERR_DATA_LOSS: /* part of the range is not mapped there any more */
        return ST_DATA_LOSS;
    case MG_ERR_PERMISSION:
        return ST_PERMISSION_DENIED;
    case MG_ERR_RANGE:
        return ST_OUT_OF_RANGE;
    default:
        return ST_INTERNAL;
    }
}

/* The wire status of a kind's failed read or write, said in the log with its reason (the wire
 * carries the status alone). */
static uint32_t unmapped_failed(const char *op, uint64_t off, int rc, const char *why)
{
    char q[300];
    mg_log(MG_LOG_WARN, "dp_target_failed", "op=%s offset=%llu why=%s", op, (unsigned long long)off,
           mg_log_quote(q, sizeof(q), why));
    return unmapped_status(rc);
}

/* A WRITE's n payload bytes into seg at off: each piece received into c->land (summed into *crc
 * when crc; its first byte flipped when flip), then written there with the kind's write (one
 * copy more than into a mapping, from the cache). After a failure the rest is taken off the
 * stream and dropped. Returns 0 with *st ST_OK or the failure's, or -1 (the connection
 * failed). */
static int unmapped_write(dp_conn *c, mg_segment *seg, uint64_t off, uint64_t n, int timeout_ms,
                          uint32_t *crc, int flip, uint32_t *st)
{
    char why[256];
    int rc, lands = mg_segment_lands(seg);
    if (!lands && c->land == NULL && (c->land = malloc(LAND_BYTES)) == NULL)
        *st = ST_INTERNAL;
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < LAND_BYTES ? (size_t)(n - done) : LAND_BYTES, cap;
        int ok = *st == ST_OK, ticket = -1;
        uint8_t *dst = c->land;
        if (ok && lands) { /* straight into the kind's own buffer (a staging slot) */
            if ((dst = mg_segment_land(seg, &cap, &ticket, why, sizeof(why))) == NULL) {
                *st = unmapped_failed("write", off + done, MG_ERR_STATE, why);
                ok = 0;
            } else {
                k = n - done < cap ? (size_t)(n - done) : cap; /* a slot's worth */
            }
        }
        if ((rc = read_payload(c, ok ? dst : NULL, k, timeout_ms, ok ? crc : NULL, ok && flip)) ==
            -1) {
            if (ticket >= 0)
                mg_segment_commit(seg, ticket, 0, 0, why, sizeof(why)); /* given back */
            return -1;
        }
        flip = 0;
        if (ticket >= 0) {
            int got = rc == 0;
            if ((rc = mg_segment_commit(seg, ticket, off + done, got ? k : 0, why, sizeof(why))))
                *st = unmapped_failed("write", off + done, rc, why);
            else if (!got)
                *st = ST_INTERNAL;
        } else if (ok && rc == 0 &&
                   (rc = mg_segment_write(seg, off + done, c->land, k, why, sizeof(why)))) {
            *st = unmapped_failed("write", off + done, rc, why);
        } else if (ok && rc != 0) {
            *st = ST_INTERNAL;
        }
        done += k;
    }
    if (*st == ST_OK && (rc = mg_segment_sync(seg, why, sizeof(why))) != 0)
        *st = unmapped_failed("write", off, rc, why); /* acknowledged once it landed */
    return 0;
}

/* A READ's n bytes of seg at off, copied with the kind's read into the stage behind the answers
 * held (they go first when it is full), summed into *crc when crc. Returns the payload, or NULL
 * with *st the failure's, or with *broken set (sending the answers held failed). */
static const uint8_t *unmapped_read(dp_conn *c, mg_segment *seg, uint64_t off, uint32_t n,
                                    uint32_t *crc, uint32_t *st, int *broken)
{
    char why[256];
    uint8_t *p;
    int rc;
    if (c->staged > 0 && c->staged + n > c->stage_cap && out_flush(c, 1) != 0) {
        *broken = 1;
        return NULL;
    }
    if (c->staged == 0 &&
        stage_grow(&c->stage, &c->stage_cap, n > STAGE_GATHER_BYTES ? n : STAGE_GATHER_BYTES)) {
        *st = ST_INTERNAL;
        return NULL;
    }
    p = c->stage + c->staged;
    if ((rc = mg_segment_read(seg, off, p, n, why, sizeof(why))) != 0) {
        *st = unmapped_failed("read", off, rc, why);
        return NULL;
    }
    if (crc)
        *crc = mg_crc32c(0, p, n);
    c->staged += n;
    return p;
}

/* HELLO: returns 0 with the tenant, or -1 after answering ERROR. */
static int serve_hello(dp_conn *c, char *tenant)
{
    mg_dp_server *s = c->srv;
    uint8_t head[MG_DF_HEADER_BYTES], token[MG_DF_TOKEN_BYTES];
    mg_df_header h, reply = {0};
    static const char refused[] = "session token refused";
    int rc;
    if (read_full(c->fd, head, sizeof(head), (int)s->cfg.io_timeout_ms, NULL) != 0)
        return -1;
    rc = mg_df_decode(head, sizeof(head), s->cfg.max_slice, &h);
    if (rc != MG_DF_OK || h.type != MG_DF_HELLO ||
        read_full(c->fd, token, sizeof(token), (int)s->cfg.io_timeout_ms, NULL) != 0) {
        const char *why = rc != MG_DF_OK ? mg_df_strerror(rc) : "the first frame must be HELLO";
        reply.type = MG_DF_ERROR;
        reply.status = rc == MG_DF_BAD_VERSION ? ST_UNIMPLEMENTED : ST_INVALID_ARGUMENT;
        reply.length = (uint32_t)strlen(why);
        send_frame(c->fd, &reply, why, reply.length, (int)s->cfg.io_timeout_ms, NULL);
        return -1;
    }
    if (s->cfg.auth(s->cfg.auth_arg, token, tenant) != 0) {
        reply.type = MG_DF_ERROR;
        reply.status = ST_UNAUTHENTICATED;
        reply.length = sizeof(refused) - 1;
        send_frame(c->fd, &reply, refused, reply.length, (int)s->cfg.io_timeout_ms, NULL);
        return -1;
    }
    reply.type = MG_DF_HELLO_OK;
    return send_frame(c->fd, &reply, NULL, 0, (int)s->cfg.io_timeout_ms, NULL);
}

static void *conn_main(void *arg)
{
    dp_conn *c = arg;
    mg_dp_server *s = c->srv;
    char tenant[MG_SEG_NAME_MAX + 1];
    int timeout = (int)s->cfg.io_timeout_ms;

    if (serve_hello(c, tenant) != 0)
        goto out;
    set_send_buffer(c->fd, s->cfg.tcp.send_buffer, c->peer);
    for (;;) {
        uint8_t head[MG_DF_HEADER_BYTES];
        mg_df_header h, reply = {0};
        dp_target tgt = {NULL, NULL};
        uint8_t *addr = NULL;
        uint32_t st;
        int rc;
        if (read_header(c, head) != 0)
            break;
        rc = mg_df_decode(head, sizeof(head), s->cfg.max_slice, &h);
        if (rc != MG_DF_OK || (h.type != MG_DF_WRITE && h.type != MG_DF_READ)) {
            const char *why = rc != MG_DF_OK ? mg_df_strerror(rc) : "unexpected frame type";
            reply.type = MG_DF_ERROR;
            reply.status = ST_INVALID_ARGUMENT;
            reply.length = (uint32_t)strlen(why);
            if (out_flush(c, 1) == 0) /* the answers before it, in order */
                send_frame(c->fd, &reply, why, reply.length, (int)s->cfg.io_timeout_ms, NULL);
            break; /* the stream cannot be trusted any more */
        }
        st = check_hot_target(c, tenant, &h, &tgt, &addr);
        reply.slice = h.slice;
        reply.target = h.target;
        reply.offset = h.offset;
        reply.flags = h.flags & MG_DF_LEASE;
        if (h.type == MG_DF_WRITE) {
            /* The bytes go straight into place; the ack follows only once they are there. A
             * checksummed slice's CRC32C is taken of each piece as it lands. */
            uint32_t crc = 0;
            int summed = st == ST_OK && (h.flags & MG_DF_CRC);
            if (st == ST_OK && addr == NULL) /* a process's memory */
                rc = unmapped_write(c, tgt.seg, h.offset, h.length, timeout, summed ? &crc : NULL,
                                    summed && corrupt_this(s), &st);
            else
                rc = read_payload(c, st == ST_OK ? addr : NULL, h.length, timeout,
                                  summed ? &crc : NULL, summed && corrupt_this(s));
            c->ahead = h.length < MG_DP_AHEAD_BYTES;
            if (rc == -1) {
                target_done(s, &tgt);
                break;
            }
            if (rc == MG_ERR_DATA_LOSS) /* the segment's file is shorter than registered */
                st = ST_DATA_LOSS;
            if (st == ST_OK && summed && crc != h.payload_crc)
                st = ST_DATA_LOSS;
            reply.type = MG_DF_WRITE_ACK;
            reply.length = h.length;
            reply.status = st;
            /* Counted before the ack: whoever the ack reaches sees the counters include it. */
            tally(s, st, 1, h.length);
            rc = out_hold(c, &reply, NULL, 0, NULL);
        } else {
            uint32_t crc = 0;
            const uint8_t *payload = addr;
            c->ahead = 1;                      /* READ frames are headers alone */
            if (st == ST_OK && addr == NULL) { /* a process's memory: copied into the stage */
                int broken = 0;
                payload = unmapped_read(c, tgt.seg, h.offset, h.length,
                                        (h.flags & MG_DF_CRC) ? &crc : NULL, &st, &broken);
                if (broken) {
                    target_done(s, &tgt);
                    break;
                }
            } else if (st == ST_OK && (h.flags & MG_DF_CRC)) {
                /* Summed into the stage behind the answers held, once they went if it is full. */
                if (c->staged > 0 && c->staged + h.length > c->stage_cap && out_flush(c, 1) != 0) {
                    target_done(s, &tgt);
                    break;
                }
                payload = summed_at(&c->stage, &c->stage_cap, c->staged, addr, h.length, &crc);
                if (payload == NULL)
                    st = ST_DATA_LOSS; /* the segment's file is shorter than registered */
                else if (payload == c->stage + c->staged)
                    c->staged += h.length;
            } else if (st == ST_OK && mg_fault_probe(addr, h.length) != 0) {
                /* The file was cut under the range: the kernel's copy (send) would fail EFAULT
                 * with the answer's header gone, and the stream with it. */
                st = ST_DATA_LOSS;
            }
            reply.type = MG_DF_READ_DATA;
            reply.status = st;
            reply.length = st == ST_OK ? h.length : 0;
            if (st == ST_OK && (h.flags & MG_DF_CRC)) {
                reply.flags |= MG_DF_CRC;
                reply.payload_crc = corrupt_this(s) ? ~crc : crc;
            }
            tally(s, st, 0, h.length);
            /* Held back with what keeps the payload in place, which goes with it. */
            rc = out_hold(c, &reply, payload, reply.length, &tgt);
        }
        target_done(s, &tgt);
        if (rc != 0)
            break;
    }
out:
    out_flush(c, 0); /* answers still held: the connection failed under them */
    free(c->land);
    c->land = NULL;
    shutdown(c->fd, SHUT_RDWR); /* the peer sees the end now; the descriptor closes at reap */
    pthread_mutex_lock(&s->lock);
    s->active--;
    s->stats.conns_active--;
    c->done = 1;
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Joins the threads of finished connections (lock held). */
static void reap(mg_dp_server *s)
{
    dp_conn **pp = &s->conns;
    while (*pp) {
        dp_conn *c = *pp;
        if (c->done) {
            *pp = c->next;
            pthread_join(c->thread, NULL);
            close(c->fd);
            free(c->stage);
            free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void *accept_main(void *arg)
{
    mg_dp_server *s = arg;
    int paused = 0; /* accept failed for want of a descriptor; 100 ms pauses until one frees */
    uint64_t last_ns = 0; /* the last accept_paused line: one a second at most */
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept(s->lfd, (struct sockaddr *)&ss, &sl), one = 1;
        dp_conn *c;
        char host[48] = "?", serv[8] = "?";
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                /* The connection waits in the kernel's queue; retrying at once would spin. */
                if (!paused) {
                    uint64_t now = mg_now_mono_ns();
                    paused = 1;
                    pthread_mutex_lock(&s->lock);
                    s->stats.accept_pauses++;
                    pthread_mutex_unlock(&s->lock);
                    if (last_ns == 0 || now - last_ns >= 1000000000ULL) {
                        last_ns = now;
                        mg_warn("accept_paused",
                                "listener=data error=\"%s\" note=\"accepting resumes when a "
                                "descriptor frees\"",
                                strerror(e));
                    }
                }
                poll(NULL, 0, 100);
                continue;
            }
            break; /* the listener was shut down */
        }
        if (paused) {
            paused = 0;
            mg_debug("accept_resumed", "listener=data");
        }
        pthread_mutex_lock(&s->lock);
        reap(s);
        if (s->stopping || s->active >= s->cfg.max_conns) {
            s->stats.conns_refused++;
            pthread_mutex_unlock(&s->lock);
            close(fd);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->srv = s;
        c->fd = fd;
        snprintf(c->peer, sizeof(c->peer), "%s:%s", host, serv);
        pthread_mutex_lock(&s->lock);
        if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&s->lock);
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        s->conns = c;
        s->active++;
        s->stats.conns_total++;
        s->stats.conns_active++;
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

int mg_dp_server_start(mg_dp_server **out, const mg_dp_server_config *cfg, char *err, size_t errcap)
{
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM},
                    *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    mg_dp_server *s;
    char port[8];
    int one = 1, rc;

    if (cfg->registry == NULL || cfg->auth == NULL || cfg->max_slice == 0 || cfg->max_conns == 0 ||
        cfg->port < 0 || cfg->port > 65535) {
        snprintf(err, errcap, "bad data-plane configuration");
        return MG_ERR_INVALID;
    }
    snprintf(port, sizeof(port), "%d", cfg->port);
    rc = getaddrinfo(cfg->host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errcap, "data-plane address %s: %s", cfg->host, gai_strerror(rc));
        return MG_ERR_INVALID;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        freeaddrinfo(ai);
        return MG_ERR_NOMEM;
    }
    s->cfg = *cfg;
    s->cfg.tcp.congestion = NULL; /* the listener has it; the connections it accepts inherit it */
    s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->lfd >= 0 && set_congestion(s->lfd, cfg->tcp.congestion, err, errcap) != 0) {
        close(s->lfd);
        freeaddrinfo(ai);
        free(s);
        return MG_ERR_INVALID;
    }
    if (s->lfd < 0 || setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(s->lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s->lfd, 64) != 0 ||
        getsockname(s->lfd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(err, errcap, "data-plane listener on %s:%d: %s", cfg->host, cfg->port,
                 strerror(errno));
        if (s->lfd >= 0)
            close(s->lfd);
        freeaddrinfo(ai);
        free(s);
        return MG_ERR_SYSTEM;
    }
    freeaddrinfo(ai);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    pthread_mutex_init(&s->lock, NULL);
    if (pthread_create(&s->accept_thread, NULL, accept_main, s) != 0) {
        close(s->lfd);
        pthread_mutex_destroy(&s->lock);
        free(s);
        snprintf(err, errcap, "cannot start the data-plane thread");
        return MG_ERR_SYSTEM;
    }
    *out = s;
    return 0;
}

int mg_dp_server_port(const mg_dp_server *s)
{
    return s->port;
}

int mg_dp_congestion_check(const char *name, char *err, size_t errcap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;
    if (fd < 0) {
        snprintf(err, errcap, "TCP congestion control %.32s: no socket to try it on: %s", name,
                 strerror(errno));
        return MG_ERR_SYSTEM;
    }
    rc = set_congestion(fd, name, err, errcap) == 0 ? 0 : MG_ERR_INVALID;
    close(fd);
    return rc;
}

void mg_dp_server_congestion(const mg_dp_server *s, char name[MG_DP_CONGESTION_MAX])
{
    socklen_t len = MG_DP_CONGESTION_MAX - 1;
    memset(name, 0, MG_DP_CONGESTION_MAX);
    if (getsockopt(s->lfd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0 || name[0] == '\0')
        snprintf(name, MG_DP_CONGESTION_MAX, "unknown");
}

void mg_dp_server_get_stats(mg_dp_server *s, mg_dp_server_stats *out)
{
    const mg_dp_server_stats *t = &s->stats;
    pthread_mutex_lock(&s->lock);
    out->conns_total = t->conns_total;
    out->conns_active = t->conns_active;
    out->conns_refused = t->conns_refused;
    out->accept_pauses = t->accept_pauses;
    pthread_mutex_unlock(&s->lock);
    out->slices_in = __atomic_load_n(&t->slices_in, __ATOMIC_RELAXED); /* counted by tally */
    out->slices_out = __atomic_load_n(&t->slices_out, __ATOMIC_RELAXED);
    out->slices_refused = __atomic_load_n(&t->slices_refused, __ATOMIC_RELAXED);
    out->bytes_in = __atomic_load_n(&t->bytes_in, __ATOMIC_RELAXED);
    out->bytes_out = __atomic_load_n(&t->bytes_out, __ATOMIC_RELAXED);
}

void mg_dp_server_stop(mg_dp_server *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    for (dp_conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR); /* blocked reads and writes return */
    pthread_mutex_unlock(&s->lock);
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->accept_thread, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->lock);
    for (dp_conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR); /* any accepted meanwhile */
    pthread_mutex_unlock(&s->lock);
    while (s->conns) {
        dp_conn *c = s->conns;
        s->conns = c->next;
        pthread_join(c->thread, NULL);
        close(c->fd);
        free(c->stage);
        free(c);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ------------------------------------------------------------------ client */

#define ABUF_BYTES 4096 /* a client connection's read-ahead of answers */

struct mg_dp_conn {
    int fd;
    char peer[300];
    uint32_t timeout_ms;
    uint64_t next_slice;
    const int *stop; /* the running transfer's stop word, or NULL */
    uint8_t *stage;  /* checksummed WRITE payloads, and READ answers, pass through here summed */
    size_t stage_cap;
    /* Answers read ahead: one recv takes every WRITE ack that is there. */
    size_t apos, alen; /* abuf[apos, alen): received, not used yet */
    uint8_t abuf[ABUF_BYTES];
};

/* Reads exactly n bytes of the peer's answers into buf (it may be a segment's memory: copies by
 * the CPU run guarded). Returns 0 or -1 as read_full (errno EFAULT: buf's pages went
 * missing). */
static int conn_read(mg_dp_conn *c, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        size_t k = c->alen - c->apos < n ? c->alen - c->apos : n;
        struct iovec iov[2] = {{p, n}, {c->abuf, sizeof(c->abuf)}};
        int direct = n >= sizeof(c->abuf);
        ssize_t r;
        if (k > 0) { /* what the read-ahead holds first */
            if (mg_guarded_copy(p, c->abuf + c->apos, k) != 0) {
                errno = EFAULT; /* as recv reports it */
                return -1;
            }
            c->apos += k;
            p += k;
            n -= k;
            continue;
        }
        /* The read-ahead is empty: a large rest goes straight into place and what follows it
         * into the read-ahead (the next answer's header comes in the same call); a small one
         * through the read-ahead. */
        r = recv_iov(c->fd, direct ? iov : iov + 1, direct ? 2 : 1, (int)c->timeout_ms, c->stop);
        if (r < 0)
            return -1;
        c->apos = 0;
        c->alen = (size_t)r;
        if (direct) {
            size_t into = (size_t)r < n ? (size_t)r : n;
            p += into;
            n -= into;
            c->alen -= into;
        }
    }
    return 0;
}

/* Whether a whole answer header is read ahead already. */
static int conn_header_ready(const mg_dp_conn *c)
{
    return c->alen - c->apos >= MG_DF_HEADER_BYTES;
}

/* Reads an answer's ERROR text into err. */
static void read_error_text(mg_dp_conn *c, const mg_df_header *h, char *err, size_t errcap,
                            const char *what)
{
    char text[1025] = "";
    uint32_t n = h->length < sizeof(text) - 1 ? h->length : (uint32_t)sizeof(text) - 1;
    if (conn_read(c, text, n) == 0)
        text[n] = '\0';
    snprintf(err, errcap, "%s: peer %s says: %s", what, c->peer, text);
}

/* The next n bytes of the stream into dst, summed into *crc: piece by piece through the stage
 * (read, then summed as it is copied into place; see read_payload). Returns 0,
 * MG_ERR_DATA_LOSS (dst's pages went missing: the rest is still taken off the stream),
 * MG_ERR_NOMEM (no stage: nothing read) or -1 (the connection failed, errno). */
static int read_summed(mg_dp_conn *c, uint8_t *dst, size_t n, uint32_t *crc)
{
    int lost = 0;
    if (stage_grow(&c->stage, &c->stage_cap, RBUF_BYTES) != 0)
        return MG_ERR_NOMEM;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < RBUF_BYTES ? n - done : RBUF_BYTES;
        if (conn_read(c, c->stage, k) != 0)
            return -1;
        if (!lost && mg_guarded_copy_crc32c(dst + done, c->stage, k, crc, 1) != 0)
            lost = 1; /* the sum no longer matters: the slice is lost */
        done += k;
    }
    return lost ? MG_ERR_DATA_LOSS : 0;
}

int mg_dp_connect(mg_dp_conn **out, const char *host, int port,
                  const uint8_t token[MG_DF_TOKEN_BYTES], uint32_t timeout_ms, const mg_dp_tcp *tcp,
                  const int *stop, char *err, size_t errcap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    char serv[8];
    mg_dp_conn *c;
    mg_df_header hello = {0}, h;
    uint8_t head[MG_DF_HEADER_BYTES];
    int fd = -1, one = 1, rc;

    snprintf(serv, sizeof(serv), "%d", port);
    rc = getaddrinfo(host, serv, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errcap, "peer %s:%d: %s", host, port, gai_strerror(rc));
        return MG_ERR_UNAVAILABLE;
    }
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        if (set_congestion(fd, tcp ? tcp->congestion : NULL, err, errcap) != 0) {
            close(fd);
            freeaddrinfo(ai);
            return MG_ERR_INVALID;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
            continue;
        }
        if (wait_ready(fd, POLLOUT, (int)timeout_ms, stop) != 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
            if (soerr)
                errno = soerr;
            close(fd);
            fd = -1;
            if (errno == ECANCELED)
                break;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0 && errno == ECANCELED) {
        snprintf(err, errcap, "stopped (%s) while connecting to peer %s:%d", mg_strerror(*stop),
                 host, port);
        return *stop;
    }
    if (fd < 0) {
        snprintf(err, errcap, "cannot reach peer %s:%d: %s", host, port, strerror(errno));
        return MG_ERR_UNAVAILABLE; /* silent for the I/O timeout: unreachable */
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* blocking from here on */
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return MG_ERR_NOMEM;
    }
    c->fd = fd;
    c->timeout_ms = timeout_ms ? timeout_ms : 10000;
    snprintf(c->peer, sizeof(c->peer), "%s:%d", host, port);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    hello.type = MG_DF_HELLO;
    hello.length = MG_DF_TOKEN_BYTES;
    if (send_frame(fd, &hello, token, MG_DF_TOKEN_BYTES, (int)c->timeout_ms, stop) != 0 ||
        read_full(fd, head, sizeof(head), (int)c->timeout_ms, stop) != 0) {
        int e = errno;
        if (e == ECANCELED) {
            snprintf(err, errcap, "stopped (%s) while greeting peer %s", mg_strerror(*stop),
                     c->peer);
            rc = *stop;
        } else {
            snprintf(err, errcap, "peer %s: no answer to HELLO: %s", c->peer,
                     e ? strerror(e) : "connection closed");
            rc = MG_ERR_UNAVAILABLE;
        }
        mg_dp_close(c);
        return rc;
    }
    rc = mg_df_decode(head, sizeof(head), 1 << 30, &h);
    if (rc != MG_DF_OK || (h.type != MG_DF_HELLO_OK && h.type != MG_DF_ERROR)) {
        snprintf(err, errcap, "peer %s: %s", c->peer,
                 rc != MG_DF_OK ? mg_df_strerror(rc) : "unexpected answer to HELLO");
        mg_dp_close(c);
        return MG_ERR_PROTOCOL;
    }
    if (h.type == MG_DF_ERROR) {
        read_error_text(c, &h, err, errcap, "HELLO");
        rc = h.status == ST_UNAUTHENTICATED ? MG_ERR_AUTH : mg_dp_status_err(h.status);
        mg_dp_close(c);
        return rc;
    }
    set_send_buffer(c->fd, tcp ? tcp->send_buffer : 0, c->peer);
    *out = c;
    return 0;
}

void mg_dp_close(mg_dp_conn *c)
{
    if (c == NULL)
        return;
    close(c->fd);
    free(c->stage);
    free(c);
}

/* Frames slice sl of an op (a WRITE with its payload, or a READ): its header into head, and
 * in *payload what follows it (NULL: nothing). A checksummed WRITE's payload is copied into
 * the connection's stage at offset `at` (the stage holds at least at + its length when at > 0,
 * so that slices gathered before it stay where they are). Returns 0, or -1 (errno EFAULT: the
 * local bytes went missing while they were summed). */
/* A WRITE slice's payload copied out of memory reached by op->access, into the stage at `at`
 * (behind payloads staged there and not sent yet; at 0 the stage first grows to hold several),
 * summed into *crc when asked. Returns the staged bytes, or NULL with op->rc and op->err set. */
static const uint8_t *staged_from_access(mg_dp_conn *c, mg_dp_op *op, const mg_slice *sl, size_t at,
                                         uint32_t *crc)
{
    size_t n = sl->length;
    int rc;
    if (at == 0 &&
        stage_grow(&c->stage, &c->stage_cap, n > STAGE_GATHER_BYTES ? n : STAGE_GATHER_BYTES)) {
        op->rc = MG_ERR_NOMEM;
        snprintf(op->err, op->errcap, "out of memory (a stage of %zu bytes)", n);
        return NULL;
    }
    if ((rc = op->access->get(op->access->ctx, sl->local_offset, c->stage + at, n, op->err,
                              op->errcap)) != 0) {
        op->rc = rc;
        return NULL;
    }
    if (crc)
        *crc = mg_crc32c(0, c->stage + at, n);
    return c->stage + at;
}

/* Frames slice sl of op: its header in head, and in *payload what follows it (NULL for a READ).
 * Returns 0; -1 with errno when the local bytes are not there (EFAULT); 1 when op's own access
 * failed (op->rc set: the op sends no more). */
static int frame_slice(mg_dp_conn *c, mg_dp_op *op, const mg_slice *sl, const mg_dp_options *o,
                       uint64_t id, size_t at, uint8_t head[MG_DF_HEADER_BYTES],
                       const uint8_t **payload)
{
    mg_df_header h = {0};
    h.type = op->write ? MG_DF_WRITE : MG_DF_READ;
    h.flags = (o->crc ? MG_DF_CRC : 0) | (o->lease ? MG_DF_LEASE : 0);
    h.slice = id;
    h.target = op->target;
    h.offset = sl->remote_offset;
    h.length = sl->length;
    *payload = NULL;
    if (op->write && op->access) {
        if ((*payload = staged_from_access(c, op, sl, at, o->crc ? &h.payload_crc : NULL)) == NULL)
            return 1;
    } else if (op->write) {
        *payload = op->buf + sl->local_offset;
        if (o->crc && (*payload = summed_at(&c->stage, &c->stage_cap, at, *payload, sl->length,
                                            &h.payload_crc)) == NULL) {
            errno = EFAULT; /* as send() reports a missing page of the local segment */
            return -1;
        }
    }
    mg_df_encode(&h, head);
    return 0;
}

/* Frames one sendmsg carries at most, and the payload bytes after which it goes. */
#define GATHER_FRAMES 64
#define GATHER_BYTES  (1u << 20)
/* Slices shorter than this are gathered: the window refills once half of it is answered. */
#define SMALL_SLICE_BYTES (GATHER_BYTES / 8)

/* Frames waiting to go in one sendmsg: headers and payloads, in order. */
typedef struct {
    struct iovec iov[2 * GATHER_FRAMES];
    uint8_t heads[GATHER_FRAMES][MG_DF_HEADER_BYTES];
    size_t frames, iovcnt, bytes;
    size_t staged;  /* bytes of the connection's stage the payloads use */
    uint64_t first; /* the first one's slice, for messages */
} gather;

/* A slice on its way: which op, which of its slices, under which id. */
typedef struct {
    size_t op;
    uint64_t slice, id;
} in_flight;

/* The connection failed (or was stopped): every op not finished gets `code` and a message. */
static int run_failed(mg_dp_conn *c, mg_dp_op *ops, size_t n, int code, int stopped,
                      const char *why)
{
    for (size_t i = 0; i < n; i++) {
        mg_dp_op *op = &ops[i];
        if (op->rc != 0 || op->answered == op->slices)
            continue;
        op->rc = code;
        if (stopped)
            snprintf(op->err, op->errcap,
                     "stopped (%s) with %llu of %llu bytes confirmed by peer %s", mg_strerror(code),
                     (unsigned long long)op->done, (unsigned long long)op->len, c->peer);
        else
            snprintf(op->err, op->errcap, "%s", why);
    }
    return code;
}

/* Ends a run: its ring goes, and the slices still counted in flight stop counting. */
static void run_release(in_flight *ring, const mg_dp_options *o, size_t count)
{
    free(ring);
    if (o->in_flight && count)
        __atomic_fetch_sub(o->in_flight, (int64_t)count, __ATOMIC_RELAXED);
}

/* One run's pipeline: the window of slices sent and not yet answered, and where sending is. */
typedef struct run_state {
    mg_dp_conn *c;
    mg_dp_op *ops;
    size_t n;
    mg_dp_options o;
    in_flight *ring;
    size_t head, count, sop; /* ring start, slices in flight, the op being sent */
    uint64_t sslice;         /* its next slice */
    gather g;                /* frames framed, not sent yet */
    uint32_t answered_len;   /* the length of the slice answered last */
    char why[512];
} run_state;

/* Ends the run with every unfinished op failed (the ring released). */
static int run_fail(run_state *r, int code, int stopped)
{
    run_release(r->ring, &r->o, r->count);
    return run_failed(r->c, r->ops, r->n, code, stopped, r->why);
}

/* A read or write on the connection failed with `err` (its errno): stopped (ECANCELED), the
 * local memory is gone (EFAULT: DATA_LOSS), or the peer is unreachable. */
static int run_io_failed(run_state *r, int err)
{
    if (err == ECANCELED)
        return run_fail(r, *r->o.stop, 1);
    if (err == EFAULT) { /* the local bytes are not there: a client shrank the file under them */
        size_t l = strlen(r->why);
        snprintf(r->why + l, sizeof(r->why) - l,
                 " (the local segment's file is shorter than registered: shrunk under it)");
        return run_fail(r, MG_ERR_DATA_LOSS, 0);
    }
    return run_fail(r, MG_ERR_UNAVAILABLE, 0);
}

/* Sends what r->g gathered (`more`: with MSG_MORE). Returns 0, or the run's end (failed). */
static int run_flush(run_state *r, int more)
{
    gather *g = &r->g;
    if (g->frames == 0)
        return 0;
    if (write_iov(r->c->fd, g->iov, g->iovcnt, more, (int)r->c->timeout_ms, r->o.stop) != 0) {
        int err = errno;
        snprintf(r->why, sizeof(r->why), "peer %s: sending %zu slices from slice %llu: %s",
                 r->c->peer, g->frames, (unsigned long long)g->first, strerror(err));
        return run_io_failed(r, err);
    }
    g->frames = g->iovcnt = g->bytes = g->staged = 0;
    return 0;
}

/* Sends while the window has room: each op's slices in order, ops one after another; an op the
 * peer refused a slice of sends no more. Frames go several to a sendmsg (up to GATHER_FRAMES
 * and GATHER_BYTES, and checksummed WRITE payloads as many as the stage holds side by side),
 * with MSG_MORE while more follow at once, so that small ones share packets; the last is pushed
 * before the answers are waited for. Returns 0, or the run's end (failed). */
static int run_send(run_state *r)
{
    mg_dp_conn *c = r->c;
    gather *g = &r->g;
    int rc, held = 0; /* frames sent with MSG_MORE and not pushed yet */
    static const int one = 1;
    while (r->count < r->o.window && r->sop < r->n) {
        mg_dp_options so = r->o;
        mg_dp_op *op = &r->ops[r->sop];
        const uint8_t *payload;
        mg_slice sl;
        in_flight e;
        int more;
        if (op->rc != 0 || r->sslice >= op->slices) {
            r->sop++;
            r->sslice = 0;
            continue;
        }
        if (r->o.stop && (rc = __atomic_load_n(r->o.stop, __ATOMIC_ACQUIRE)) != 0)
            return run_fail(r, rc, 1);
        mg_slice_plan(0, op->offset, op->len, r->o.slice_bytes, r->sslice, &sl, 1);
        so.lease = op->lease;
        if (op->write && (so.crc || op->access) && g->staged > 0 &&
            g->staged + sl.length > c->stage_cap) {
            /* The stage is full: what it holds goes first, pushed (held back, its last packet
             * would wait for this slice's sum or copy). */
            if ((rc = run_flush(r, 0)) != 0)
                return rc;
            held = 0;
        }
        if (g->frames == 0)
            g->first = r->sslice;
        if ((rc = frame_slice(c, op, &sl, &so, c->next_slice, g->staged, g->heads[g->frames],
                              &payload)) == 1)
            continue; /* its own memory failed it: the slices in flight are still answered */
        if (op->write && op->access && op->access->ahead && r->sslice + 1 < op->slices) {
            mg_slice next; /* fetched while this one goes out */
            mg_slice_plan(0, op->offset, op->len, r->o.slice_bytes, r->sslice + 1, &next, 1);
            op->access->ahead(op->access->ctx, next.local_offset, next.length);
        }
        e = (in_flight){r->sop, r->sslice, c->next_slice++};
        if (rc != 0) {
            int err = errno; /* before snprintf may change it */
            snprintf(r->why, sizeof(r->why), "peer %s: sending slice %llu: %s", c->peer,
                     (unsigned long long)r->sslice, strerror(err));
            return run_io_failed(r, err);
        }
        g->iov[g->iovcnt++] = (struct iovec){g->heads[g->frames++], MG_DF_HEADER_BYTES};
        if (payload) {
            g->iov[g->iovcnt++] = (struct iovec){(void *)(uintptr_t)payload, sl.length};
            g->bytes += sl.length;
            if (payload == c->stage + g->staged)
                g->staged += sl.length;
        }
        r->ring[(r->head + r->count) % r->o.window] = e;
        r->count++;
        if (r->o.in_flight)
            __atomic_fetch_add(r->o.in_flight, 1, __ATOMIC_RELAXED);
        r->sslice++;
        more = r->count < r->o.window && (r->sslice < op->slices || r->sop + 1 < r->n);
        if (!more || g->frames == GATHER_FRAMES || g->bytes >= GATHER_BYTES) {
            more = more && g->bytes < GATHER_BYTES; /* a full send fills its packets anyway */
            if ((rc = run_flush(r, more)) != 0)
                return rc;
            held = more;
        }
    }
    if (g->frames) {
        if ((rc = run_flush(r, 0)) != 0)
            return rc;
        held = 0; /* a send without MSG_MORE pushes what was held */
    }
    /* Setting TCP_NODELAY sends what MSG_MORE held back (tcp(7)). */
    if (held && setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        int err = errno;
        snprintf(r->why, sizeof(r->why), "peer %s: pushing slices: %s", c->peer, strerror(err));
        return run_io_failed(r, err);
    }
    return 0;
}

/* Where a slice's bytes were lost, when this end saw it (0: the peer answered the status). */
enum { LOST_HERE = 1, LOST_ON_THE_WAY, LOST_TO_ACCESS };

/* A READ slice's n payload bytes into memory reached by op->access at `off`: piece by piece
 * through the stage, summed into *crc when crc is not NULL. Returns 0, LOST_TO_ACCESS (put failed:
 * op->rc and op->err set once; the rest is still taken off the stream), MG_ERR_NOMEM (no stage:
 * nothing read) or -1 (the connection failed, errno). */
static int read_into_access(mg_dp_conn *c, mg_dp_op *op, uint64_t off, size_t n, uint32_t *crc)
{
    char spare[8]; /* why, when the op failed before */
    int lost = 0, rc;
    if (stage_grow(&c->stage, &c->stage_cap, RBUF_BYTES) != 0)
        return MG_ERR_NOMEM;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < c->stage_cap ? n - done : c->stage_cap;
        if (conn_read(c, c->stage, k) != 0)
            return -1;
        if (crc)
            *crc = mg_crc32c(*crc, c->stage, k);
        if (!lost && (rc = op->access->put(op->access->ctx, off + done, c->stage, k,
                                           op->rc ? spare : op->err,
                                           op->rc ? sizeof(spare) : op->errcap)) != 0) {
            if (op->rc == 0)
                op->rc = rc;
            lost = LOST_TO_ACCESS;
        }
        done += k;
    }
    return lost;
}

/* A slice failed with status st: the op takes its error and a message naming the slice, its
 * segment (or lease) and, for DATA_LOSS, what this end can tell of the cause. */
static void slice_failed(const mg_dp_conn *c, mg_dp_op *op, uint64_t slice, const mg_slice *sl,
                         uint32_t st, int lost, int crc)
{
    const char *cause = "";
    op->rc = mg_dp_status_err(st);
    if (lost == LOST_HERE)
        cause = ": the local segment's file is shorter than registered (a client truncated it)";
    else if (lost == LOST_ON_THE_WAY)
        cause = ": the bytes arrived corrupted (their CRC32C differs from the peer's)";
    else if (op->rc == MG_ERR_DATA_LOSS && op->write && crc)
        cause = ": the bytes landed corrupted (a CRC32C mismatch), or its file there is shorter "
                "than registered (a client truncated it)";
    else if (op->rc == MG_ERR_DATA_LOSS)
        cause = ": its file there is shorter than registered (a client truncated it), or its "
                "process there no longer maps the range";
    else if (op->rc == MG_ERR_STATE)
        cause = ": the process whose memory it is there exited (or, for GPU memory it stages, "
                "stopped serving its copies: the peer's log says which)";
    else if (op->rc == MG_ERR_NOT_FOUND)
        cause = op->lease ? ": the peer holds no such lease (released or expired)"
                          : ": the peer holds no such segment (unregistered, or the process whose "
                            "memory it was exited)";
    snprintf(op->err, op->errcap, "peer %s %s slice %llu (offset %llu, %u bytes) of %s %llu: %s%s",
             c->peer, lost ? "sent" : "refused", (unsigned long long)slice,
             (unsigned long long)sl->remote_offset, sl->length, op->lease ? "lease" : "segment",
             (unsigned long long)op->target, mg_strerror(op->rc), cause);
}

/* Reads the answer to the oldest slice in flight and records it in its op. Returns 0, or the
 * run's end (failed). */
static int run_answer(run_state *r)
{
    mg_dp_conn *c = r->c;
    mg_df_header h;
    mg_slice expect;
    uint8_t head_buf[MG_DF_HEADER_BYTES];
    in_flight e = r->ring[r->head];
    mg_dp_op *op = &r->ops[e.op];
    int rc, lost = 0;
    r->head = (r->head + 1) % r->o.window;
    r->count--;
    if (r->o.in_flight)
        __atomic_fetch_sub(r->o.in_flight, 1, __ATOMIC_RELAXED);
    if (conn_read(c, head_buf, sizeof(head_buf)) != 0) {
        int err = errno;
        snprintf(r->why, sizeof(r->why), "peer %s: waiting for slice %llu: %s", c->peer,
                 (unsigned long long)e.slice, err ? strerror(err) : "connection closed");
        return run_io_failed(r, err);
    }
    rc = mg_df_decode(head_buf, sizeof(head_buf), r->o.slice_bytes, &h);
    if (rc == MG_DF_OK && h.type == MG_DF_ERROR) {
        read_error_text(c, &h, r->why, sizeof(r->why), "transfer");
        return run_fail(r, MG_ERR_PROTOCOL, 0);
    }
    mg_slice_plan(0, op->offset, op->len, r->o.slice_bytes, e.slice, &expect, 1);
    r->answered_len = expect.length;
    if (rc != MG_DF_OK || h.slice != e.id ||
        h.type != (op->write ? MG_DF_WRITE_ACK : MG_DF_READ_DATA)) {
        snprintf(r->why, sizeof(r->why), "peer %s: bad answer to slice %llu: %s", c->peer,
                 (unsigned long long)e.slice,
                 rc != MG_DF_OK ? mg_df_strerror(rc) : "unexpected frame");
        return run_fail(r, MG_ERR_PROTOCOL, 0);
    }
    if (!op->write && h.status == ST_OK) {
        uint8_t *dst = op->access ? NULL : op->buf + expect.local_offset;
        uint32_t crc = 0;
        int got;
        if (h.length != expect.length)
            got = -1;
        else if (op->access)
            got = read_into_access(c, op, expect.local_offset, h.length,
                                   h.flags & MG_DF_CRC ? &crc : NULL);
        else if (h.flags & MG_DF_CRC)
            got = read_summed(c, dst, h.length, &crc);
        else
            got = conn_read(c, dst, h.length);
        if (got == -1 || got == MG_ERR_NOMEM) {
            int err = h.length != expect.length ? 0 : errno; /* a length not asked: no errno */
            snprintf(r->why, sizeof(r->why), "peer %s: reading slice %llu", c->peer,
                     (unsigned long long)e.slice);
            return run_io_failed(r, err);
        }
        if (got == MG_ERR_DATA_LOSS)
            lost = LOST_HERE;
        else if (got == LOST_TO_ACCESS)
            lost = LOST_TO_ACCESS;
        else if ((h.flags & MG_DF_CRC) && crc != h.payload_crc)
            lost = LOST_ON_THE_WAY;
    }
    op->answered++;
    if ((h.status != ST_OK || lost) && op->rc == 0)
        slice_failed(c, op, e.slice, &expect, lost ? ST_DATA_LOSS : h.status, lost, r->o.crc);
    else if (h.status == ST_OK && !lost) {
        op->done += expect.length;
        if (op->progress)
            __atomic_fetch_add(op->progress, (uint64_t)expect.length, __ATOMIC_RELAXED);
    }
    return 0;
}

int mg_dp_run(mg_dp_conn *c, mg_dp_op *ops, size_t n, const mg_dp_options *opt)
{
    run_state r = {.c = c, .ops = ops, .n = n, .o = opt ? *opt : (mg_dp_options){0}};
    int rc;
    if (r.o.slice_bytes == 0)
        r.o.slice_bytes = 1u << 20;
    if (r.o.window == 0)
        r.o.window = 16;
    r.ring = calloc(r.o.window, sizeof(*r.ring));
    if (r.ring == NULL)
        return run_failed(c, ops, n, MG_ERR_NOMEM, 0, "out of memory");
    c->stop = r.o.stop;
    for (size_t i = 0; i < n; i++) {
        mg_dp_op *op = &ops[i];
        op->rc = 0;
        op->done = op->answered = 0;
        op->slices = mg_slice_count(op->len, r.o.slice_bytes);
        if (op->offset > UINT64_MAX - op->len) {
            op->rc = MG_ERR_RANGE;
            snprintf(op->err, op->errcap, "offset %llu + %llu bytes overflows",
                     (unsigned long long)op->offset, (unsigned long long)op->len);
        }
    }
    for (;;) {
        if ((rc = run_send(&r)) != 0)
            return rc;
        if (r.count == 0)
            break; /* everything sent was answered */
        /* Answers every one read ahead, and while slices are small until half the window is
         * free: the next sends then carry many slices each (a large slice fills a send alone,
         * as a checksummed one goes alone, and its room in the window is best refilled at
         * once). */
        do {
            if ((rc = run_answer(&r)) != 0)
                return rc;
        } while (r.count > 0 &&
                 (conn_header_ready(c) ||
                  (r.count > r.o.window / 2 && r.answered_len < SMALL_SLICE_BYTES && !r.o.crc)));
    }
    run_release(r.ring, &r.o, r.count);
    return 0;
}

static int transfer(mg_dp_conn *c, int write, uint64_t target, uint64_t offset, uint8_t *buf,
                    uint64_t len, const mg_dp_options *opt, char *err, size_t errcap)
{
    mg_dp_op op = {.write = write,
                   .lease = opt ? opt->lease : 0,
                   .target = target,
                   .offset = offset,
                   .buf = buf,
                   .len = len,
                   .progress = opt ? opt->progress : NULL,
                   .err = err,
                   .errcap = errcap};
    mg_dp_run(c, &op, 1, opt);
    return op.rc;
}

int mg_dp_write(mg_dp_conn *c, uint64_t target, uint64_t offset, const void *buf, uint64_t len,
                const mg_dp_options *o, char *err, size_t errcap)
{
    return transfer(c, 1, target, offset, (uint8_t *)(uintptr_t)buf, len, o, err, errcap);
}

int mg_dp_read(mg_dp_conn *c, uint64_t target, uint64_t offset, void *buf, uint64_t len,
               const mg_dp_options *o, char *err, size_t errcap)
{
    return transfer(c, 0, target, offset, buf, len, o, err, errcap);
}

/* ------------------------------------------------------------------ idle connections */

void mg_dp_pool_init(mg_dp_pool *p, unsigned max)
{
    pthread_mutex_init(&p->lock, NULL);
    p->n = 0;
    p->max = max > MG_DP_POOL_MAX ? MG_DP_POOL_MAX : max;
}

mg_dp_conn *mg_dp_pool_take(mg_dp_pool *p)
{
    mg_dp_conn *c = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->n > 0)
        c = p->idle[--p->n];
    pthread_mutex_unlock(&p->lock);
    return c;
}

void mg_dp_pool_give(mg_dp_pool *p, mg_dp_conn *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    if (p->n < p->max) {
        p->idle[p->n++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    mg_dp_close(c); /* the pool is full: one too many */
}

unsigned mg_dp_pool_idle(mg_dp_pool *p)
{
    unsigned n;
    pthread_mutex_lock(&p->lock);
    n = p->n;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void mg_dp_pool_clear(mg_dp_pool *p)
{
    mg_dp_conn *c;
    while ((c = mg_dp_pool_take(p)) != NULL)
        mg_dp_close(c);
}

void mg_dp_pool_free(mg_dp_pool *p)
{
    mg_dp_pool_clear(p);
    pthread_mutex_destroy(&p->lock);
}
