/* mg_ring: see moongate/ring.h and moongate/ringwire.h. */
#include "moongate/ring.h"

#include "mg_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

_Static_assert(sizeof(mg_ring_sqe) == MG_RING_SQE_SIZE, "a submission is one slot");
_Static_assert(sizeof(mg_ring_cqe) == MG_RING_CQE_SIZE, "a completion is one slot");
_Static_assert(sizeof(mg_ring_hdr) <= 4096, "the header is page 0");
/* The offsets clients in other languages use (clients/python/moongate/ring.py). */
_Static_assert(offsetof(mg_ring_hdr, why) == 44 && offsetof(mg_ring_hdr, sq_tail) == 192 &&
                   offsetof(mg_ring_hdr, sq_head) == 256 &&
                   offsetof(mg_ring_hdr, daemon_sleeping) == 260 &&
                   offsetof(mg_ring_hdr, daemon_needs_room) == 264 &&
                   offsetof(mg_ring_hdr, cq_tail) == 320 && offsetof(mg_ring_hdr, cq_head) == 384 &&
                   offsetof(mg_ring_hdr, client_waiting) == 388,
               "the header's layout");
_Static_assert(offsetof(mg_ring_sqe, u.strided.length) == 72 &&
                   offsetof(mg_ring_sqe, note_len) == 112 && offsetof(mg_ring_cqe, why) == 36,
               "the slots' layout");

#define LOAD(p)     __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

struct mg_ring {
    mg_rings *rs;
    uint64_t id;
    void *front;
    int memfd, doorbell, bell;
    uint8_t *mem;
    uint64_t size;
    mg_ring_hdr *hdr;
    uint8_t *sq, *cq;
    uint32_t entries;
    /* The ring thread's. */
    uint32_t sq_head; /* what it took (the header's copy is the process's to read) */
    int broken;
    /* Written by the loop, read by the ring thread. */
    uint32_t cq_tail;    /* answers written */
    uint32_t unanswered; /* taken, answer not written yet */
    int closed;
    unsigned refs;
};

/* A change for the ring thread: a ring to serve, or to let go. */
typedef struct ctl {
    mg_ring *r;
    int add;
    struct ctl *next;
} ctl;

struct mg_rings {
    mg_cq *cq;
    mg_ring_sub_fn fn;
    void *arg;
    int ep, ctl_fd;
    pthread_t thread;
    pthread_mutex_t lock;
    ctl *ctls; /* under lock */
    int stopping;
    uint64_t next_id, taken;
    size_t open;
    /* The ring thread's: the rings it serves. */
    mg_ring **live;
    size_t nlive, cap;
};

static void ring_unref(mg_ring *r)
{
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (r->mem)
        munmap(r->mem, r->size);
    if (r->memfd >= 0)
        close(r->memfd);
    if (r->doorbell >= 0)
        close(r->doorbell);
    if (r->bell >= 0)
        close(r->bell);
    free(r);
}

static void ring_bell(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof(one));
    (void)w; /* a counter at its limit already rings */
}

/* ---- the shape of a submission ---- */

static int sqe_bad(mg_ring_sub *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sqe_bad(mg_ring_sub *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->bad, sizeof(s->bad), fmt, ap);
    va_end(ap);
    return -1;
}

/* Slots of `bytes` bytes. */
static uint64_t slots_of(uint64_t bytes)
{
    return (bytes + MG_RING_SQE_SIZE - 1) / MG_RING_SQE_SIZE;
}

/* The shape of e: 0 with *pair_slots and *note_slots (the slots after the entry's), or -1 with
 * s->bad set. */
static int sqe_check(const mg_ring_sqe *e, uint32_t avail, mg_ring_sub *s, uint64_t *pair_slots,
                     uint64_t *note_slots)
{
    *pair_slots = *note_slots = 0;
    if (e->op != MG_RING_READ && e->op != MG_RING_WRITE)
        return sqe_bad(s, "op %u: READ (0) or WRITE (1)", e->op);
    if ((e->flags & ~(MG_RING_NOTIFY | MG_RING_ACCEPTED)) != 0 || e->reserved0 != 0 ||
        e->reserved1 != 0)
        return sqe_bad(s, "flags other than NOTIFY (1) and ACCEPTED (2), and reserved words, "
                          "must be 0");
    if (e->count == 0)
        return sqe_bad(s, "count 0: a submission moves at least one block");
    if (e->kind == MG_RING_STRIDED) {
        if (e->u.strided.length == 0)
            return sqe_bad(s, "length 0");
    } else if (e->kind != MG_RING_PAIRS) {
        return sqe_bad(s, "kind %u: PAIRS (1) or STRIDED (2)", e->kind);
    } else if (e->count > MG_RING_INLINE_PAIRS) {
        *pair_slots = slots_of(8 * ((uint64_t)e->count - MG_RING_INLINE_PAIRS));
    }
    if (e->flags & MG_RING_NOTIFY) {
        if (e->note_len < 2 || e->note_len > MG_RING_NOTE_MAX)
            return sqe_bad(s, "note_len %u: 2..%u bytes (topic, NUL, payload)", e->note_len,
                           MG_RING_NOTE_MAX);
        *note_slots = slots_of(e->note_len);
    } else if (e->note_len != 0) {
        return sqe_bad(s, "note_len %u without the NOTIFY flag", e->note_len);
    }
    if (1 + *pair_slots + *note_slots > avail) {
        uint64_t want = 1 + *pair_slots + *note_slots;
        *pair_slots = *note_slots = 0;
        return sqe_bad(s, "the entry takes %llu slots (%u pairs%s); %u are published",
                       (unsigned long long)want, e->count,
                       e->flags & MG_RING_NOTIFY ? " and a note" : "", avail);
    }
    return 0;
}

/* Copies `len` bytes that start at slot `from` (wrapping around the ring) into out. */
static void copy_slots(const uint8_t *sq, uint32_t entries, uint32_t from, uint8_t *out,
                       uint64_t len)
{
    for (uint64_t done = 0; done < len; from++) {
        uint64_t n = len - done < MG_RING_SQE_SIZE ? len - done : MG_RING_SQE_SIZE;
        memcpy(out + done, sq + (size_t)(from & (entries - 1)) * MG_RING_SQE_SIZE, n);
        done += n;
    }
}

uint32_t mg_ring_sqe_copy(const uint8_t *sq, uint32_t entries, uint32_t head, uint32_t avail,
                          mg_ring_sub *s)
{
    uint64_t pair_slots, note_slots;
    uint32_t k = 0;
    memcpy(&s->e, sq + (size_t)(head & (entries - 1)) * MG_RING_SQE_SIZE, sizeof(s->e));
    s->bad[0] = '\0';
    if (sqe_check(&s->e, avail, s, &pair_slots, &note_slots) != 0)
        return 1;
    if (s->e.kind == MG_RING_PAIRS) {
        uint8_t *more = NULL;
        uint64_t extra = s->e.count > MG_RING_INLINE_PAIRS
                             ? 8 * ((uint64_t)s->e.count - MG_RING_INLINE_PAIRS)
                             : 0;
        s->local = malloc(sizeof(uint32_t) * s->e.count);
        s->remote = malloc(sizeof(uint32_t) * s->e.count);
        if (s->local == NULL || s->remote == NULL || (extra && (more = malloc(extra)) == NULL))
            return 0;
        for (; k < s->e.count && k < MG_RING_INLINE_PAIRS; k++) {
            s->local[k] = s->e.u.pairs[k][0];
            s->remote[k] = s->e.u.pairs[k][1];
        }
        if (more) { /* copied out once, then read */
            copy_slots(sq, entries, head + 1, more, extra);
            for (uint64_t j = 0; k < s->e.count; j++, k++) {
                memcpy(&s->local[k], more + 8 * j, 4);
                memcpy(&s->remote[k], more + 8 * j + 4, 4);
            }
            free(more);
        }
    }
    if (note_slots) {
        if ((s->note = malloc(s->e.note_len)) == NULL)
            return 0;
        copy_slots(sq, entries, head + 1 + (uint32_t)pair_slots, (uint8_t *)s->note, s->e.note_len);
    }
    return 1 + (uint32_t)pair_slots + (uint32_t)note_slots;
}

/* ---- the ring thread ---- */

static void ring_break(mg_ring *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ring_break(mg_ring *r, const char *fmt, ...)
{
    va_list ap;
    char why[sizeof(r->hdr->why)];
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    r->broken = 1;
    memcpy(r->hdr->why, why, sizeof(why));
    STORE(&r->hdr->broken, 3u); /* INVALID_ARGUMENT */
    ring_bell(r->bell);
    mg_warn("ring_broken", "ring=%llu why=\"%s\"", (unsigned long long)r->id, why);
}

/* Room in the completion queue for answers to new submissions, or -1 when the process's
 * cq_head is impossible (the ring broke). */
static long ring_room(mg_ring *r)
{
    uint32_t unanswered = LOAD(&r->unanswered);
    uint32_t tail = LOAD(&r->cq_tail), head = LOAD(&r->hdr->cq_head);
    if (tail - head > r->entries) {
        ring_break(r, "cq_head %u is past cq_tail %u or more than %u behind it", head, tail,
                   r->entries);
        return -1;
    }
    return (long)r->entries - (long)(tail - head) - (long)unanswered;
}

static void sub_done(void *arg, int result)
{
    mg_ring_sub *s = arg;
    mg_ring *r = s->ring;
    (void)result;
    if (LOAD(&r->closed)) {
        __atomic_sub_fetch(&r->unanswered, s->answers, __ATOMIC_ACQ_REL);
        mg_ring_sub_free(s);
        return;
    }
    r->rs->fn(r->rs->arg, s);
}

/* Takes what ring r has and its completion queue has room to answer. Returns how many. */
static unsigned ring_serve(mg_rings *rs, mg_ring *r)
{
    unsigned taken = 0;
    uint32_t avail;
    if (r->broken || LOAD(&r->closed))
        return 0;
    avail = LOAD(&r->hdr->sq_tail) - r->sq_head;
    if (avail > r->entries) {
        ring_break(r, "sq_tail is %u slots past sq_head %u: more than the ring's %u", avail,
                   r->sq_head, r->entries);
        return 0;
    }
    while (avail > 0) {
        long room = ring_room(r);
        mg_ring_sub *s;
        uint32_t slots;
        if (room < 0)
            break;
        if (room < 2) { /* room for both answers of any submission */
            STORE(&r->hdr->daemon_needs_room, 1u);
            break;
        }
        if ((s = calloc(1, sizeof(*s))) == NULL ||
            (slots = mg_ring_sqe_copy(r->sq, r->entries, r->sq_head, avail, s)) == 0) {
            if (s)
                mg_ring_sub_free(s);
            ring_break(r, "the daemon is out of memory");
            break;
        }
        s->ring = r;
        __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL);
        r->sq_head += slots;
        avail -= slots;
        STORE(&r->hdr->sq_head, r->sq_head);
        s->answers = s->e.flags & MG_RING_ACCEPTED && !s->bad[0] ? 2 : 1;
        __atomic_add_fetch(&r->unanswered, s->answers, __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&rs->taken, 1, __ATOMIC_RELAXED); /* before the loop may see it */
        if (mg_cq_post(rs->cq, sub_done, s, 0) != 0) {
            __atomic_sub_fetch(&r->unanswered, s->answers, __ATOMIC_ACQ_REL);
            __atomic_sub_fetch(&rs->taken, 1, __ATOMIC_RELAXED);
            mg_ring_sub_free(s);
            ring_break(r, "the daemon is out of memory");
            break;
        }
        taken++;
    }
    if (avail == 0)
        STORE(&r->hdr->daemon_needs_room, 0u);
    return taken;
}

/* Whether r has something to take now. */
static int ring_ready(mg_ring *r)
{
    if (r->broken || LOAD(&r->closed) || LOAD(&r->hdr->sq_tail) == r->sq_head)
        return 0;
    return ring_room(r) >= 2;
}

static void live_drop(mg_rings *rs, mg_ring *r)
{
    for (size_t i = 0; i < rs->nlive; i++) {
        if (rs->live[i] == r) {
            rs->live[i] = rs->live[--rs->nlive];
            epoll_ctl(rs->ep, EPOLL_CTL_DEL, r->doorbell, NULL);
            __atomic_sub_fetch(&rs->open, 1, __ATOMIC_RELAXED);
            ring_unref(r);
            return;
        }
    }
}

/* Applies the loop's changes. Returns 1 when the thread is to stop. */
static int apply_ctls(mg_rings *rs)
{
    uint64_t v;
    ctl *list;
    int stop;
    ssize_t rd = read(rs->ctl_fd, &v, sizeof(v));
    (void)rd;
    pthread_mutex_lock(&rs->lock);
    list = rs->ctls;
    rs->ctls = NULL;
    stop = rs->stopping;
    pthread_mutex_unlock(&rs->lock);
    for (ctl *next, *rev = NULL;; list = next) { /* pushed newest first: oldest first */
        if (list == NULL) {
            list = rev;
            break;
        }
        next = list->next;
        list->next = rev;
        rev = list;
    }
    while (list) {
        ctl *c = list;
        list = c->next;
        if (!c->add) {
            live_drop(rs, c->r);
        } else {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c->r};
            if (rs->nlive == rs->cap) {
                size_t cap = rs->cap ? rs->cap * 2 : 8;
                mg_ring **grown = realloc(rs->live, sizeof(*grown) * cap);
                if (grown) {
                    rs->live = grown;
                    rs->cap = cap;
                }
            }
            if (rs->nlive == rs->cap ||
                epoll_ctl(rs->ep, EPOLL_CTL_ADD, c->r->doorbell, &ev) != 0) {
                ring_break(c->r, "the daemon cannot serve another ring (errno %d)", errno);
                ring_unref(c->r);
            } else {
                rs->live[rs->nlive++] = c->r;
                __atomic_add_fetch(&rs->open, 1, __ATOMIC_RELAXED);
            }
        }
        free(c);
    }
    return stop;
}

static void *ring_main(void *p)
{
    mg_rings *rs = p;
    struct epoll_event evs[32];
    for (;;) {
        unsigned took;
        int again = 0, n;
        do { /* serve every ring until none has work */
            took = 0;
            for (size_t i = 0; i < rs->nlive; i++)
                took += ring_serve(rs, rs->live[i]);
        } while (took);
        for (size_t i = 0; i < rs->nlive; i++)
            STORE(&rs->live[i]->hdr->daemon_sleeping, 1u);
        /* then look again (every load and store of the protocol is sequentially consistent:
         * a doorbell the process did not ring, after it saw the flag 0, was not needed) */
        for (size_t i = 0; i < rs->nlive && !again; i++)
            again = ring_ready(rs->live[i]);
        if (!again) {
            int changes = 0;
            n = epoll_wait(rs->ep, evs, 32, -1);
            for (int i = 0; i < n; i++) { /* doorbells first: the changes may let rings go */
                uint64_t v;
                if (evs[i].data.ptr == NULL) {
                    changes = 1;
                } else {
                    ssize_t rd = read(((mg_ring *)evs[i].data.ptr)->doorbell, &v, sizeof(v));
                    (void)rd;
                }
            }
            if (changes && apply_ctls(rs))
                goto out;
        }
        for (size_t i = 0; i < rs->nlive; i++)
            STORE(&rs->live[i]->hdr->daemon_sleeping, 0u);
    }
out:
    while (rs->nlive)
        live_drop(rs, rs->live[0]);
    return NULL;
}

/* ---- the loop's side ---- */

int mg_rings_new(mg_rings **out, mg_cq *cq, mg_ring_sub_fn fn, void *arg)
{
    mg_rings *rs = calloc(1, sizeof(*rs));
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (rs == NULL)
        return MG_ERR_NOMEM;
    rs->cq = cq;
    rs->fn = fn;
    rs->arg = arg;
    rs->ep = epoll_create1(EPOLL_CLOEXEC);
    rs->ctl_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&rs->lock, NULL);
    if (rs->ep < 0 || rs->ctl_fd < 0 || epoll_ctl(rs->ep, EPOLL_CTL_ADD, rs->ctl_fd, &ev) != 0 ||
        pthread_create(&rs->thread, NULL, ring_main, rs) != 0) {
        mg_error("rings_new", "errno=%d", errno);
        if (rs->ep >= 0)
            close(rs->ep);
        if (rs->ctl_fd >= 0)
            close(rs->ctl_fd);
        pthread_mutex_destroy(&rs->lock);
        free(rs);
        return MG_ERR_SYSTEM;
    }
    *out = rs;
    return 0;
}

void mg_rings_del(mg_rings *rs)
{
    if (rs == NULL)
        return;
    pthread_mutex_lock(&rs->lock);
    rs->stopping = 1;
    pthread_mutex_unlock(&rs->lock);
    ring_bell(rs->ctl_fd);
    pthread_join(rs->thread, NULL);
    while (rs->ctls) { /* rings it never took up */
        ctl *c = rs->ctls;
        rs->ctls = c->next;
        if (c->add)
            ring_unref(c->r);
        free(c);
    }
    close(rs->ep);
    close(rs->ctl_fd);
    pthread_mutex_destroy(&rs->lock);
    free(rs->live);
    free(rs);
}

size_t mg_rings_open(const mg_rings *rs)
{
    return __atomic_load_n(&rs->open, __ATOMIC_RELAXED);
}

uint64_t mg_rings_taken(const mg_rings *rs)
{
    return __atomic_load_n(&rs->taken, __ATOMIC_RELAXED);
}

static int ring_fail(mg_ring *r, char *err, size_t cap, const char *what)
{
    snprintf(err, cap, "cannot make the ring: %s: %s", what, strerror(errno));
    ring_unref(r);
    return MG_ERR_SYSTEM;
}

int mg_ring_new(mg_rings *rs, uint32_t entries, void *front, mg_ring **out, char *err, size_t cap)
{
    mg_ring *r;
    uint64_t sq_bytes = ((uint64_t)entries * MG_RING_SQE_SIZE + 4095) & ~(uint64_t)4095;
    uint64_t cq_bytes = ((uint64_t)entries * MG_RING_CQE_SIZE + 4095) & ~(uint64_t)4095;
    if (entries < 8 || entries > MG_RING_MAX_ENTRIES || (entries & (entries - 1)) != 0) {
        snprintf(err, cap, "entries %u: a power of two, 8..%u", entries, MG_RING_MAX_ENTRIES);
        return MG_ERR_INVALID;
    }
    if ((r = calloc(1, sizeof(*r))) == NULL) {
        snprintf(err, cap, "out of memory");
        return MG_ERR_NOMEM;
    }
    r->rs = rs;
    r->refs = 1;
    r->front = front;
    r->entries = entries;
    r->doorbell = r->bell = -1;
    r->size = 4096 + sq_bytes + cq_bytes;
    r->memfd = memfd_create("moongate-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->memfd < 0 || ftruncate(r->memfd, (off_t)r->size) != 0 ||
        fcntl(r->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return ring_fail(r, err, cap, "memfd");
    r->mem = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
    if (r->mem == MAP_FAILED) {
        r->mem = NULL;
        return ring_fail(r, err, cap, "mmap");
    }
    r->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->doorbell < 0 || r->bell < 0)
        return ring_fail(r, err, cap, "eventfd");
    r->hdr = (mg_ring_hdr *)r->mem;
    r->hdr->sq_entries = r->hdr->cq_entries = entries;
    r->hdr->sq_off = 4096;
    r->hdr->cq_off = 4096 + sq_bytes;
    r->hdr->size = r->size;
    r->sq = r->mem + r->hdr->sq_off;
    r->cq = r->mem + r->hdr->cq_off;
    r->id = __atomic_add_fetch(&rs->next_id, 1, __ATOMIC_RELAXED);
    STORE(&r->hdr->magic, MG_RING_MAGIC);
    *out = r;
    return 0;
}

uint64_t mg_ring_id(const mg_ring *r)
{
    return r->id;
}

void *mg_ring_front(const mg_ring *r)
{
    return r->front;
}

void mg_ring_fds(const mg_ring *r, int fds[3], uint64_t *size)
{
    fds[0] = r->memfd;
    fds[1] = r->doorbell;
    fds[2] = r->bell;
    *size = r->size;
}

static void ring_ctl(mg_ring *r, int add)
{
    mg_rings *rs = r->rs;
    ctl *c = calloc(1, sizeof(*c));
    if (c == NULL) { /* the thread never hears of it: a ring to add is let go */
        if (add) {
            ring_break(r, "the daemon is out of memory");
            ring_unref(r);
        }
        return;
    }
    c->r = r;
    c->add = add;
    pthread_mutex_lock(&rs->lock);
    c->next = rs->ctls;
    rs->ctls = c;
    pthread_mutex_unlock(&rs->lock);
    ring_bell(rs->ctl_fd);
}

void mg_ring_start(mg_ring *r)
{
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL); /* the thread's */
    ring_ctl(r, 1);
}

void mg_ring_close(mg_ring *r)
{
    if (LOAD(&r->closed))
        return;
    STORE(&r->closed, 1);
    ring_ctl(r, 0);
}

void mg_ring_free(mg_ring *r)
{
    if (r == NULL)
        return;
    mg_ring_close(r);
    ring_unref(r);
}

void mg_ring_complete(mg_ring *r, const mg_ring_cqe *c)
{
    uint32_t tail = r->cq_tail;
    if (!LOAD(&r->closed)) {
        memcpy(r->cq + (size_t)(tail & (r->entries - 1)) * MG_RING_CQE_SIZE, c, sizeof(*c));
        STORE(&r->hdr->cq_tail, tail + 1);
        STORE(&r->cq_tail, tail + 1);
    }
    __atomic_sub_fetch(&r->unanswered, 1, __ATOMIC_ACQ_REL);
    /* the answer is out before the process's flag is read (both sequentially consistent) */
    if (LOAD(&r->hdr->client_waiting))
        ring_bell(r->bell);
}

void mg_ring_forgo(mg_ring *r)
{
    __atomic_sub_fetch(&r->unanswered, 1, __ATOMIC_ACQ_REL);
}

void mg_ring_sub_free(mg_ring_sub *s)
{
    if (s == NULL)
        return;
    if (s->ring)
        ring_unref(s->ring);
    free(s->local);
    free(s->remote);
    free(s->note);
    free(s);
}
