/*
 * mg_seg_staged: GPU memory staged by its own process (MG_SEG_STAGED) — device memory a peer
 * reaches over TCP where no RDMA path (dma-buf) exists. The daemon never touches device memory:
 * the process's client library does the device copies, on a thread of its own, ordered over a
 * copy channel (moongate/stagewire.h) whose daemon end the process passed on the fd socket.
 * At registration the daemon makes a staging buffer (a memfd it maps, STAGE_BYTES) and hands
 * it to the process in the channel's HELLO; the process maps it too and answers.
 *
 * The TCP data plane lands a peer's WRITE straight in the staging buffer's slots (the kind's
 * land and commit): each piece received into a free slot and ordered TO_DEVICE, not waited
 * for; the kind's sync, before the slice is acknowledged, waits for every answer, so a slice is
 * acknowledged only once its bytes are in device memory (write does the same from a caller's
 * buffer). A READ orders its pieces FROM_DEVICE, STAGE_SLOTS at a time, and takes
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
#define SLOT_BYTES      (512u << 10) /* daemon fills the next (a WRITE lands straight in one) */
#define STAGE_BYTES     (STAGE_SLOTS * SLOT_BYTES)
#define STAGE_ANSWER_MS 10000 /* an answer not come by then fails the order */

/* Orders go out in seq order (issued under mu) and the process answers them in that order, so
 * the orders outstanding are a queue: `q` holds their slots, oldest first. A slot is FREE,
 * HELD by a caller (landing a WRITE's piece in it, or a READ's piece answered and not yet taken),
 * or ORDERED. One thread at a time reads answers (`reading`), without the lock; the others wait
 * on cv, which every answer and every slot given back wakes. */
enum { SLOT_FREE, SLOT_HELD, SLOT_ORDERED };

struct mg_staged {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf; /* the staging buffer, mapped here and in the process */
    int state[STAGE_SLOTS];
    int q[STAGE_SLOTS];           /* the slots of the orders outstanding, oldest first */
    int q_to_device[STAGE_SLOTS]; /* each one's a TO_DEVICE (its slot FREE once answered) */
    uint64_t issued, answered;
    int reading;
    int orphan[STAGE_SLOTS]; /* a read ahead nobody will take: its slot freed once answered */
    struct {
        const void *token; /* whose (mg_segment_prefetch) */
        uint64_t off, seq;
        size_t n;
        int slot; /* -1: none */
    } ahead[STAGE_SLOTS];
    char broken[320]; /* why the channel can no longer be used, or "" (sticky) */
    int broken_rc;    /* and its MG_ERR_* */
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
        st->broken_rc = rc;
        va_start(ap, fmt);
        vsnprintf(st->broken, sizeof(st->broken), fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Sends order o (with fd as SCM_RIGHTS when fd >= 0) for `slot` (-1: none, HELLO), not waiting
 * for its answer. 0, or an MG_ERR_*. Under st->mu. */
static int issue(const mg_segment *seg, mg_stage_order *o, int slot, int fd)
{
    struct mg_staged *st = seg->stg;
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = o, .iov_len = sizeof(*o)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    int k = (int)(st->issued - st->answered);
    if (st->broken[0])
        return st->broken_rc;
    o->magic = MG_STAGE_MAGIC;
    o->seq = st->issued + 1;
    o->slot_off = slot >= 0 ? (uint64_t)slot * SLOT_BYTES : 0;
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
    st->q[k] = slot; /* at most STAGE_SLOTS outstanding: every order holds a slot (HELLO none) */
    st->q_to_device[k] = o->type == MG_STAGE_TO_DEVICE;
    if (slot >= 0)
        st->state[slot] = SLOT_ORDERED;
    pthread_cond_broadcast(&st->cv); /* an answer to wait for: a waiter may read it */
    return 0;
}

/* Reads one answer, the lock let go meanwhile (this thread the only reader). 0, or an MG_ERR_*
 * (the channel is then broken: a device copy that failed leaves the context in doubt, and what
 * landed after it would be out of order). Under st->mu. */
static int read_answer(const mg_segment *seg)
{
    struct mg_staged *st = seg->stg;
    struct pollfd p = {.fd = seg->fd, .events = POLLIN};
    mg_stage_answer a;
    ssize_t n = -1;
    int rc, slot;
    st->reading = 1;
    pthread_mutex_unlock(&st->mu);
    while ((rc = poll(&p, 1, STAGE_ANSWER_MS)) < 0 && errno == EINTR)
        ;
    if (rc > 0)
        n = recv(seg->fd, &a, sizeof(a), 0);
    pthread_mutex_lock(&st->mu);
    st->reading = 0;
    pthread_cond_broadcast(&st->cv);
    if (rc == 0)
        return broken(seg, MG_ERR_TIMEOUT,
                      "the process of this GPU memory (pid %d) did not answer a copy within %d ms",
                      (int)seg->client.pid, STAGE_ANSWER_MS);
    if (n != (ssize_t)sizeof(a) || a.magic != MG_STAGE_MAGIC || a.seq != st->answered + 1)
        return broken(seg, MG_ERR_STATE, "the process of this GPU memory (pid %d) %s",
                      (int)seg->client.pid,
                      n == 0 ? "ended, or closed its copy channel, before its copies were done"
                             : "answered its copy channel out of turn");
    slot = st->q[0];
    if (slot >= 0 && (st->q_to_device[0] || st->orphan[slot])) {
        st->state[slot] = SLOT_FREE; /* in device memory, or read ahead for nobody: free */
        st->orphan[slot] = 0;
    } else if (slot >= 0) {
        st->state[slot] = SLOT_HELD; /* copied out: its reader takes it, then frees it */
    }
    memmove(st->q, st->q + 1, (STAGE_SLOTS - 1) * sizeof(st->q[0]));
    memmove(st->q_to_device, st->q_to_device + 1, (STAGE_SLOTS - 1) * sizeof(st->q_to_device[0]));
    st->answered++;
    if (a.status != 0) {
        a.why[sizeof(a.why) - 1] = '\0';
        return broken(seg, MG_ERR_SYSTEM, "the device copy in process %d failed: %.200s",
                      (int)seg->client.pid, a.why);
    }
    return 0;
}

/* Waits until `done()` holds: reading answers when no other thread does, else for the one that
 * does. 0, or an MG_ERR_* (broken). Under st->mu. */
static int wait_until(const mg_segment *seg, int (*done)(const struct mg_staged *, uint64_t),
                      uint64_t arg)
{
    struct mg_staged *st = seg->stg;
    while (!done(st, arg) && !st->broken[0]) {
        if (st->reading)
            pthread_cond_wait(&st->cv, &st->mu);
        else if (st->issued > st->answered)
            read_answer(seg);
        else
            pthread_cond_wait(&st->cv, &st->mu); /* every slot held: one is given back */
    }
    return st->broken[0] ? st->broken_rc : 0;
}

static int answered_to(const struct mg_staged *st, uint64_t seq)
{
    return st->answered >= seq;
}

static int a_slot_free(const struct mg_staged *st, uint64_t unused)
{
    (void)unused;
    for (int i = 0; i < STAGE_SLOTS; i++)
        if (st->state[i] == SLOT_FREE)
            return 1;
    return 0;
}

/* A free slot, held for the caller (waits for one). Its index, or -1 (broken). Under st->mu. */
static int take_slot(const mg_segment *seg)
{
    struct mg_staged *st = seg->stg;
    if (wait_until(seg, a_slot_free, 0) != 0)
        return -1;
    for (int i = 0; i < STAGE_SLOTS; i++)
        if (st->state[i] == SLOT_FREE) {
            st->state[i] = SLOT_HELD;
            return i;
        }
    return -1;
}

static void give_back(struct mg_staged *st, int slot)
{
    st->state[slot] = SLOT_FREE;
    pthread_cond_broadcast(&st->cv);
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
    pthread_cond_init(&st->cv, NULL);
    for (int i = 0; i < STAGE_SLOTS; i++)
        st->ahead[i].slot = -1;
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
    if ((rc = issue(seg, &o, -1, mfd)) == 0)
        rc = wait_until(seg, answered_to, st->issued);
    if (rc != 0)
        mg_seg_error(seg, "%s", st->broken);
    pthread_mutex_unlock(&st->mu);
    close(mfd);
    if (strstr(st->broken, "device copy")) /* the process refused its own range */
        rc = MG_ERR_INVALID;
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
        pthread_cond_destroy(&st->cv);
        pthread_mutex_destroy(&st->mu);
        free(st);
        seg->stg = NULL;
    }
    seg->addr = NULL;
}

/* Starts reading [off, off + n) into a slot for token's next read, if a slot is free now. */
static void staged_prefetch(const mg_segment *seg, const void *token, uint64_t off, size_t n)
{
    struct mg_staged *st = seg->stg;
    int e = -1, slot;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < STAGE_SLOTS; i++) {
        if (st->ahead[i].slot >= 0 && st->ahead[i].off == off && st->ahead[i].n == n)
            e = -2; /* on its way already */
        else if (st->ahead[i].slot < 0 && e == -1)
            e = i;
    }
    if (e >= 0 && n > 0 && n <= SLOT_BYTES && !st->broken[0] && a_slot_free(st, 0) &&
        (slot = take_slot(seg)) >= 0) {
        mg_stage_order o = {.type = MG_STAGE_FROM_DEVICE, .addr = seg->client_addr + off, .len = n};
        if (issue(seg, &o, slot, -1) != 0) {
            give_back(st, slot);
        } else {
            st->ahead[e].token = token;
            st->ahead[e].off = off;
            st->ahead[e].n = n;
            st->ahead[e].seq = st->issued;
            st->ahead[e].slot = slot;
        }
    }
    pthread_mutex_unlock(&st->mu);
}

/* Lets go of what token read ahead and did not take. */
static void staged_drop(const mg_segment *seg, const void *token)
{
    struct mg_staged *st = seg->stg;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < STAGE_SLOTS; i++) {
        int slot = st->ahead[i].slot;
        if (slot < 0 || st->ahead[i].token != token)
            continue;
        if (st->state[slot] == SLOT_HELD)
            give_back(st, slot); /* answered: free now */
        else
            st->orphan[slot] = 1; /* freed once answered */
        st->ahead[i].slot = -1;
    }
    pthread_mutex_unlock(&st->mu);
}

/* [off, off + n) read ahead (staged_prefetch): taken once answered. 1 when there was such a
 * read, with *rc its outcome; 0 when none. Under st->mu. */
static int take_ahead(const mg_segment *seg, uint64_t off, void *dst, size_t n, int *rc)
{
    struct mg_staged *st = seg->stg;
    for (int i = 0; i < STAGE_SLOTS; i++) {
        int slot = st->ahead[i].slot;
        if (slot < 0 || st->ahead[i].off != off || st->ahead[i].n != n)
            continue;
        st->ahead[i].slot = -1;
        if ((*rc = wait_until(seg, answered_to, st->ahead[i].seq)) == 0) {
            memcpy(dst, st->buf + (size_t)slot * SLOT_BYTES, n);
            __atomic_fetch_add(&bytes_read, n, __ATOMIC_RELAXED);
            give_back(st, slot);
        }
        return 1;
    }
    return 0;
}

/* n bytes out of device memory at off into dst: what was read ahead for it, else as many
 * pieces ordered at once as slots are free (at least one), each taken as soon as it is
 * answered. */
static int staged_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                       size_t cap)
{
    struct mg_staged *st = seg->stg;
    int slots[STAGE_SLOTS];
    uint64_t seqs[STAGE_SLOTS];
    size_t issued = 0, taken = 0;
    int held = 0, first = 0, rc = 0;
    pthread_mutex_lock(&st->mu);
    if (take_ahead(seg, off, dst, n, &rc))
        taken = n; /* done, or failed with rc */
    while (rc == 0 && taken < n) {
        /* order more while slots are free (and always one when none of this read's is out) */
        while (rc == 0 && issued < n && held < STAGE_SLOTS && (held == 0 || a_slot_free(st, 0))) {
            size_t k = n - issued < SLOT_BYTES ? n - issued : SLOT_BYTES;
            int slot = take_slot(seg), at = (first + held) % STAGE_SLOTS;
            mg_stage_order o = {
                .type = MG_STAGE_FROM_DEVICE, .addr = seg->client_addr + off + issued, .len = k};
            if (slot < 0) {
                rc = st->broken_rc;
            } else if ((rc = issue(seg, &o, slot, -1)) != 0) {
                give_back(st, slot);
            } else {
                slots[at] = slot;
                seqs[at] = st->issued;
                held++;
                issued += k;
            }
        }
        if (rc == 0) { /* the oldest piece of this read: answered, then taken */
            size_t k = n - taken < SLOT_BYTES ? n - taken : SLOT_BYTES;
            if ((rc = wait_until(seg, answered_to, seqs[first])) == 0) {
                memcpy((uint8_t *)dst + taken, st->buf + (size_t)slots[first] * SLOT_BYTES, k);
                __atomic_fetch_add(&bytes_read, k, __ATOMIC_RELAXED);
                give_back(st, slots[first]);
                first = (first + 1) % STAGE_SLOTS;
                held--;
                taken += k;
            }
        }
    }
    for (; held > 0; held--, first = (first + 1) % STAGE_SLOTS) /* after a failure */
        if (st->state[slots[first]] == SLOT_HELD)
            give_back(st, slots[first]);
    if (rc != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Orders the n bytes landed in `slot` into device memory at off (n 0: the slot given back).
 * Under st->mu. */
static int order_in(const mg_segment *seg, int slot, uint64_t off, size_t n)
{
    struct mg_staged *st = seg->stg;
    mg_stage_order o = {.type = MG_STAGE_TO_DEVICE, .addr = seg->client_addr + off, .len = n};
    int rc = n ? issue(seg, &o, slot, -1) : 0;
    if (n == 0 || rc != 0)
        give_back(st, slot);
    else /* counted once ordered: a failure breaks the channel, every later order with it */
        __atomic_fetch_add(&bytes_written, n, __ATOMIC_RELAXED);
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
        int slot = take_slot(seg);
        if (slot < 0) {
            rc = st->broken_rc;
            break;
        }
        memcpy(st->buf + (size_t)slot * SLOT_BYTES, (const uint8_t *)src + done, k);
        rc = order_in(seg, slot, off + done, k);
        done += k;
    }
    if (rc != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* A slot to land a WRITE's piece in, straight from the network (staged_commit orders it). */
static void *staged_land(const mg_segment *seg, size_t *cap, int *ticket, char *why, size_t whycap)
{
    struct mg_staged *st = seg->stg;
    int slot;
    pthread_mutex_lock(&st->mu);
    if ((slot = take_slot(seg)) < 0)
        fail(seg, st->broken_rc, why, whycap);
    pthread_mutex_unlock(&st->mu);
    *cap = SLOT_BYTES;
    *ticket = slot;
    return slot < 0 ? NULL : st->buf + (size_t)slot * SLOT_BYTES;
}

static int staged_commit(const mg_segment *seg, int ticket, uint64_t off, size_t n, char *why,
                         size_t cap)
{
    struct mg_staged *st = seg->stg;
    int rc;
    pthread_mutex_lock(&st->mu);
    if ((rc = order_in(seg, ticket, off, n)) != 0)
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
    if ((rc = wait_until(seg, answered_to, st->issued)) != 0)
        fail(seg, rc, why, cap);
    pthread_mutex_unlock(&st->mu);
    return rc;
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
    .land = staged_land,
    .commit = staged_commit,
    .prefetch = staged_prefetch,
    .drop = staged_drop,
    .describe = mg_seg_describe_offset,
};
