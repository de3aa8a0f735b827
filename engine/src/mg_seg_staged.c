/*
 * mg_seg_staged: GPU memory staged by its own process (MG_SEG_STAGED) — device memory a peer
 * reaches over TCP where no RDMA path (dma-buf) exists. The daemon never touches device memory:
 * the process's client library does the device copies, on a thread of its own, ordered over a
 * copy channel (moongate/stagewire.h) whose daemon end the process passed on the fd socket.
 * At registration the daemon makes a staging buffer (a memfd it maps, STAGE_BYTES) and hands
 * it to the process in the channel's HELLO; the process maps it too and answers.
 *
 * The TCP data plane lands a peer's WRITE with the kind's write: each piece copied into a free
 * slot of the staging buffer and ordered TO_DEVICE, not waited for; the kind's sync, before the
 * slice is acknowledged, waits for every answer, so a slice is acknowledged only once its bytes
 * are in device memory. A READ orders its pieces FROM_DEVICE, STAGE_SLOTS at a time, and takes
 * each as it is answered. The same ops serve the process's own transfers (the local side).
 * A process that ends or closes the channel, does not answer within STAGE_ANSWER_MS, answers
 * out of turn, or whose device copy fails breaks the channel: every order fails from then on,
 * naming the first reason. The registration lives no longer than its connection.
 */
#include "mg_seg_kind.h"

#include "moongate/stagewire.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define STAGE_SLOTS     4            /* orders in flight: the process copies one while the */
#define SLOT_BYTES      (256u << 10) /* daemon fills the next (a WRITE's landing piece) */
#define STAGE_BYTES     (STAGE_SLOTS * SLOT_BYTES)
#define STAGE_ANSWER_MS 10000 /* an answer not come by then fails the order */

/* Orders go out in seq order and the process answers them in that order: order s uses slot
 * s % STAGE_SLOTS, free again once answered. */
struct mg_staged {
    pthread_mutex_t mu;
    uint8_t *buf; /* the staging buffer, mapped here and in the process */
    uint64_t issued, answered;
    char broken[320]; /* why the channel can no longer be used, or "" (sticky) */
};

/* Bytes copied out of (read) and into (written) staged GPU memory, every segment's. */
static uint64_t bytes_read, bytes_written;

void mg_segment_staged_bytes(uint64_t *read, uint64_t *written)
{
    *read = __atomic_load_n(&bytes_read, __ATOMIC_RELAXED);
    *written = __atomic_load_n(&bytes_written, __ATOMIC_RELAXED);
}

static int staged_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    if (spec->fd < 0 || spec->client_addr == 0 || spec->size == 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "staged GPU memory is registered by its copy channel (passed on the daemon's "
                 "fd socket), its device address and its size");
        return MG_ERR_INVALID;
    }
    if (spec->remote_accessible && !env->tcp_targets) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "peers reach staged GPU memory over the TCP data plane, which is off on this "
                 "daemon (--data-listen \"\")");
        return MG_ERR_STATE;
    }
    return 0;
}

/* Marks the channel broken (the first reason stays). Returns rc. Under st->mu. */
static int broken(const mg_segment *seg, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int broken(const mg_segment *seg, int rc, const char *fmt, ...)
{
    struct mg_staged *st = seg->stg;
    va_list ap;
    if (!st->broken[0]) {
        va_start(ap, fmt);
        vsnprintf(st->broken, sizeof(st->broken), fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Sends order o (with fd as SCM_RIGHTS when fd >= 0), not waiting for its answer. 0, or an
 * MG_ERR_*. Under st->mu. */
static int issue(const mg_segment *seg, mg_stage_order *o, int fd)
{
    struct mg_staged *st = seg->stg;
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = o, .iov_len = sizeof(*o)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (st->broken[0])
        return MG_ERR_STATE;
    o->magic = MG_STAGE_MAGIC;
    o->seq = st->issued + 1;
    if (fd >= 0) {
        struct cmsghdr *c;
        memset(ctl, 0, sizeof(ctl));
        m.msg_control = ctl;
        m.msg_controllen = sizeof(ctl);
        c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    if (sendmsg(seg->fd, &m, MSG_NOSIGNAL) != (ssize_t)sizeof(*o))
        return broken(seg, MG_ERR_STATE,
                      "the process of this GPU memory (pid %d) closed its copy channel: it "
                      "ended, or unregistered the memory (%s)",
                      (int)seg->client.pid, strerror(errno));
    st->issued++;
    return 0;
}

/* Reads answers until every order up to seq is answered. 0, or an MG_ERR_* (the channel is
 * then broken: a device copy that failed leaves the context in doubt, and the order of what
 * landed is lost). Under st->mu. */
static int collect(const mg_segment *seg, uint64_t seq)
{
    struct mg_staged *st = seg->stg;
    while (st->answered < seq && !st->broken[0]) {
        struct pollfd p = {.fd = seg->fd, .events = POLLIN};
        mg_stage_answer a;
        ssize_t n;
        int rc;
        while ((rc = poll(&p, 1, STAGE_ANSWER_MS)) < 0 && errno == EINTR)
            ;
        if (rc == 0)
            return broken(seg, MG_ERR_TIMEOUT,
                          "the process of this GPU memory (pid %d) did not answer a copy "
                          "within %d ms",
                          (int)seg->client.pid, STAGE_ANSWER_MS);
        n = recv(seg->fd, &a, sizeof(a), 0);
        if (n != (ssize_t)sizeof(a) || a.magic != MG_STAGE_MAGIC || a.seq != st->answered + 1)
            return broken(seg, MG_ERR_STATE, "the process of this GPU memory (pid %d) %s",
                          (int)seg->client.pid,
                          n == 0 ? "ended, or closed its copy channel, before its copies were "
                                   "done"
                                 : "answered its copy channel out of turn");
        st->answered++;
        if (a.status != 0) {
            a.why[sizeof(a.why) - 1] = '\0';
            return broken(seg, MG_ERR_SYSTEM, "the device copy in process %d failed: %.200s",
                          (int)seg->client.pid, a.why);
        }
    }
    return st->broken[0] ? MG_ERR_STATE : 0;
}

/* The next slot, once free: its order's seq in *seq. 0, or an MG_ERR_*. Under st->mu. */
static int next_slot(const mg_segment *seg, uint64_t *seq, uint8_t **slot)
{
    struct mg_staged *st = seg->stg;
    int rc = 0;
    if (st->issued - st->answered >= STAGE_SLOTS)
        rc = collect(seg, st->issued + 1 - STAGE_SLOTS);
    *seq = st->issued + 1;
    *slot = st->buf + (*seq % STAGE_SLOTS) * SLOT_BYTES;
    return rc;
}

static int fail(const mg_segment *seg, int rc, char *why, size_t cap)
{
    snprintf(why, cap, "%s", seg->stg->broken[0] ? seg->stg->broken : mg_strerror(rc));
    return rc;
}

/* The staging buffer made, mapped and handed to the process, which answers once it has it. */
static int staged_map(mg_segment *seg)
{
    struct mg_staged *st = calloc(1, sizeof(*st));
    mg_stage_order o = {.type = MG_STAGE_HELLO, .addr = seg->client_addr, .len = STAGE_BYTES};
    int mfd = -1, rc;
    if (st == NULL) {
        mg_seg_error(seg, "out of memory");
        return MG_ERR_NOMEM;
    }
    pthread_mutex_init(&st->mu, NULL);
    seg->stg = st;
    st->buf = MAP_FAILED;
    if ((mfd = memfd_create("moongate-stage", MFD_CLOEXEC)) < 0 ||
        ftruncate(mfd, STAGE_BYTES) != 0 ||
        (st->buf = mmap(NULL, STAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)) ==
            MAP_FAILED) {
        mg_seg_error(seg, "the staging buffer (%u bytes): %s", STAGE_BYTES, strerror(errno));
        if (mfd >= 0)
            close(mfd);
        return MG_ERR_NOMEM;
    }
    pthread_mutex_lock(&st->mu);
    if ((rc = issue(seg, &o, mfd)) == 0)
        rc = collect(seg, st->issued);
    if (rc != 0)
        mg_seg_error(seg, "%s", st->broken);
    pthread_mutex_unlock(&st->mu);
    close(mfd);
    if (rc == MG_ERR_SYSTEM)
        rc = MG_ERR_INVALID; /* the process refused its own range: the request was wrong */
    if (rc == 0)
        seg->addr = (void *)(uintptr_t)seg->client_addr;
    return rc;
}

static void staged_unmap(mg_segment *seg)
{
    struct mg_staged *st = seg->stg;
    if (seg->fd >= 0) {
        close(seg->fd); /* the process's library sees the channel end and lets go */
        seg->fd = -1;
    }
    if (st != NULL) {
        if (st->buf != MAP_FAILED)
            munmap(st->buf, STAGE_BYTES);
        pthread_mutex_destroy(&st->mu);
        free(st);
        seg->stg = NULL;
    }
    seg->addr = NULL;
}

/* n bytes out of device memory at off into dst: up to STAGE_SLOTS pieces copied out at once,
 * each taken as soon as its answer came. */
static int staged_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                       size_t cap)
{
    struct mg_staged *st = seg->stg;
    uint64_t first = 0;
    size_t issued = 0, taken = 0;
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    while (rc == 0 && taken < n) {
        while (rc == 0 && issued < n && st->issued - st->answered < STAGE_SLOTS) {
            size_t k = n - issued < SLOT_BYTES ? n - issued : SLOT_BYTES;
            uint64_t seq = st->issued + 1;
            mg_stage_order o = {.type = MG_STAGE_FROM_DEVICE,
                                .addr = seg->client_addr + off + issued,
                                .slot_off = (seq % STAGE_SLOTS) * SLOT_BYTES,
                                .len = k};
            if (first == 0)
                first = seq;
            if ((rc = issue(seg, &o, -1)) == 0)
                issued += k;
        }
        if (rc == 0) { /* the oldest piece of this read: answered, then taken */
            uint64_t seq = first + taken / SLOT_BYTES;
            size_t k = n - taken < SLOT_BYTES ? n - taken : SLOT_BYTES;
            if ((rc = collect(seg, seq)) == 0) {
                memcpy((uint8_t *)dst + taken, st->buf + (seq % STAGE_SLOTS) * SLOT_BYTES, k);
                __atomic_fetch_add(&bytes_read, k, __ATOMIC_RELAXED);
            }
            taken += k;
        }
    }
    if (rc != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* n bytes from src into device memory at off: each piece copied into a free slot and ordered,
 * not waited for (staged_sync waits). */
static int staged_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                        size_t cap)
{
    struct mg_staged *st = seg->stg;
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    for (size_t done = 0; done < n && rc == 0;) {
        size_t k = n - done < SLOT_BYTES ? n - done : SLOT_BYTES;
        uint64_t seq;
        uint8_t *slot;
        if ((rc = next_slot(seg, &seq, &slot)) == 0) {
            mg_stage_order o = {.type = MG_STAGE_TO_DEVICE,
                                .addr = seg->client_addr + off + done,
                                .slot_off = (uint64_t)(slot - st->buf),
                                .len = k};
            memcpy(slot, (const uint8_t *)src + done, k);
            if ((rc = issue(seg, &o, -1)) == 0) /* counted once ordered: a failure breaks all */
                __atomic_fetch_add(&bytes_written, k, __ATOMIC_RELAXED);
        }
        done += k;
    }
    if (rc != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Every write ordered so far is in device memory. */
static int staged_sync(const mg_segment *seg, char *why, size_t cap)
{
    struct mg_staged *st = seg->stg;
    int rc;
    pthread_mutex_lock(&st->mu);
    if ((rc = collect(seg, st->issued)) != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void staged_describe(const mg_segment *seg, mg_segment_info *out)
{
    out->offset = seg->offset;
}

const mg_seg_kind mg_seg_staged = {
    .source = MG_SEG_STAGED,
    .name = "staged",
    .what = "GPU memory staged by its own process (copied to and from the device there)",
    .hint = "move it with a transfer over TCP",
    .caps = MG_SEG_CAP_TCP | MG_SEG_CAP_TARGET | MG_SEG_CAP_FD | MG_SEG_CAP_CONN,
    .location = "cuda",
    .location_default = 0,
    .check = staged_check,
    .map = staged_map,
    .unmap = staged_unmap,
    .read = staged_read,
    .write = staged_write,
    .sync = staged_sync,
    .describe = staged_describe,
};
