/*
 * mg_client_ring: prepared lists and submission rings from C (docs/api.md "Submission rings";
 * the layout is moongate/ringwire.h). The process side of the ring: it writes submissions and
 * reads completions in the memory the daemon made, and rings the daemon's doorbell only when
 * the daemon says it sleeps.
 */
#include "mg_client.h"

#include "mg_grpc.h"
#include "moongate/ringwire.h"
#include "moongate/v1/transfer.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LOAD(p)     __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

struct mg_client_ring {
    uint64_t id;
    uint8_t *mem;
    uint64_t size;
    mg_ring_hdr *h;
    uint8_t *sq, *cq;
    uint32_t entries, tail, head; /* our sq_tail and cq_head */
    int doorbell, bell, chan;
};

int mg_client_prepare_list(mg_client *c, const uint64_t *addrs, const uint64_t *lens, size_t n,
                           const char *peer, const char *agent, uint64_t *id, int *status,
                           char *err, size_t errcap)
{
    Moongate__V1__PrepareListRequest req = MOONGATE__V1__PREPARE_LIST_REQUEST__INIT;
    Moongate__V1__PreparedList *r;
    req.n_addresses = req.n_lengths = n;
    req.addresses = (uint64_t *)addrs;
    req.lengths = (uint64_t *)lens;
    req.peer = (char *)(peer ? peer : "");
    req.remote_agent = (char *)(agent ? agent : "");
    r = mg_client_call_msg(c, "/moongate.v1.Transfer/PrepareList", &req.base,
                           &moongate__v1__prepared_list__descriptor, 30000, status, err, errcap);
    if (r == NULL)
        return -1;
    *id = r->id;
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return 0;
}

static int ring_fail(int *status, int code, char *err, size_t errcap, const char *what,
                     const char *why)
{
    *status = code;
    snprintf(err, errcap, "%s%s%s", what, why[0] ? ": " : "", why);
    return -1;
}

/* The daemon's hello on the channel: the ring's memory, doorbell and bell. */
static int ring_hello(int chan, uint64_t ring_id, mg_client_ring *r, int *status, char *err,
                      size_t errcap)
{
    mg_ring_hello h;
    int fds[3] = {-1, -1, -1};
    char ctl[CMSG_SPACE(sizeof(fds))];
    struct iovec iov = {&h, sizeof(h)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *cm;
    ssize_t n = recvmsg(chan, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    cm = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (cm && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(fds)))
        memcpy(fds, CMSG_DATA(cm), sizeof(fds));
    if (n != (ssize_t)sizeof(h) || fds[0] < 0 || h.magic != MG_RING_MAGIC || h.ring_id != ring_id) {
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        return ring_fail(status, MG_GRPC_INTERNAL, err, errcap,
                         "the daemon's ring hello does not check", "");
    }
    r->mem = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    r->doorbell = fds[1];
    r->bell = fds[2];
    if (r->mem == MAP_FAILED) {
        r->mem = NULL;
        return ring_fail(status, MG_GRPC_INTERNAL, err, errcap, "the ring cannot be mapped",
                         strerror(errno));
    }
    r->size = h.size;
    r->h = (mg_ring_hdr *)r->mem;
    r->entries = r->h->sq_entries;
    r->sq = r->mem + r->h->sq_off;
    r->cq = r->mem + r->h->cq_off;
    r->tail = LOAD(&r->h->sq_tail);
    r->head = LOAD(&r->h->cq_head);
    return 0;
}

int mg_client_ring_attach(mg_client *c, uint32_t entries, mg_client_ring **out, int *status,
                          char *err, size_t errcap)
{
    Moongate__V1__AttachRingRequest req = MOONGATE__V1__ATTACH_RING_REQUEST__INIT;
    Moongate__V1__AttachRingResponse *resp = NULL;
    char sock[256];
    int sv[2];
    uint64_t handle, ttl;
    mg_client_ring *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return ring_fail(status, MG_GRPC_RESOURCE_EXHAUSTED, err, errcap, "out of memory", "");
    r->doorbell = r->bell = r->chan = -1;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0) {
        free(r);
        return ring_fail(status, MG_GRPC_FAILED_PRECONDITION, err, errcap,
                         "a ring is for a process on the daemon's host: its Unix socket", "");
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        free(r);
        return ring_fail(status, MG_GRPC_INTERNAL, err, errcap, "socketpair", strerror(errno));
    }
    r->chan = sv[0];
    if (mg_fd_pass(sock, sv[1], mg_client_token(c), &handle, &ttl, status, err, errcap) != 0)
        goto fail;
    req.channel = handle;
    req.entries = entries;
    resp = mg_client_call_msg(c, "/moongate.v1.Transfer/AttachRing", &req.base,
                              &moongate__v1__attach_ring_response__descriptor, 30000, status, err,
                              errcap);
    if (resp == NULL || ring_hello(r->chan, resp->ring_id, r, status, err, errcap) != 0)
        goto fail;
    r->id = resp->ring_id;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    close(sv[1]);
    *out = r;
    return 0;
fail:
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    close(sv[1]);
    mg_client_ring_detach(r);
    return -1;
}

uint64_t mg_client_ring_id(const mg_client_ring *r)
{
    return r->id;
}

/* Room for `slots` more submissions: 0, or MG_GRPC_RESOURCE_EXHAUSTED / the code it broke
 * with. */
static int ring_room(mg_client_ring *r, uint32_t slots)
{
    uint32_t broken = LOAD(&r->h->broken);
    if (broken)
        return (int)broken;
    if (slots > r->entries || r->tail - LOAD(&r->h->sq_head) > r->entries - slots)
        return MG_GRPC_RESOURCE_EXHAUSTED;
    return 0;
}

static mg_ring_sqe *slot(mg_client_ring *r, uint32_t k)
{
    return (mg_ring_sqe *)(r->sq + (size_t)((r->tail + k) & (r->entries - 1)) * MG_RING_SQE_SIZE);
}

/* Writes `len` bytes into the slots from slot k on (wrapping). */
static void put_bytes(mg_client_ring *r, uint32_t k, const uint8_t *src, size_t len)
{
    for (size_t done = 0; done < len; k++) {
        size_t n = len - done < MG_RING_SQE_SIZE ? len - done : MG_RING_SQE_SIZE;
        memcpy(slot(r, k), src + done, n);
        done += n;
    }
}

static void publish(mg_client_ring *r, uint32_t slots)
{
    r->tail += slots;
    STORE(&r->h->sq_tail, r->tail);
    /* the tail is out before the daemon's flag is read (both sequentially consistent) */
    if (LOAD(&r->h->daemon_sleeping))
        eventfd_write(r->doorbell, 1);
}

/* The note's slots (topic, NUL, payload) after `at`, or 0; -1 for a note too long. */
static long note_slots(const char *topic, uint32_t payload_len)
{
    uint64_t len;
    if (topic == NULL)
        return 0;
    len = strlen(topic) + 1 + (uint64_t)payload_len;
    if (len > MG_RING_NOTE_MAX)
        return -1;
    return (long)((len + MG_RING_SQE_SIZE - 1) / MG_RING_SQE_SIZE);
}

static void put_note(mg_client_ring *r, uint32_t k, const char *topic, const void *payload,
                     uint32_t payload_len)
{
    size_t tl = strlen(topic) + 1;
    uint8_t *buf = malloc(tl + payload_len);
    if (buf == NULL) /* the entry says note_len: zeros then, refused by the daemon by name */
        return;
    memcpy(buf, topic, tl);
    if (payload_len)
        memcpy(buf + tl, payload, payload_len);
    put_bytes(r, k, buf, tl + payload_len);
    free(buf);
}

/* The next entry's slot, cleared, with what every entry says. */
static mg_ring_sqe *entry(mg_client_ring *r, int op, uint8_t kind, unsigned flags, uint32_t count,
                          uint64_t local_list, uint64_t remote_list, uint64_t user_data)
{
    mg_ring_sqe *e = slot(r, 0);
    memset(e, 0, sizeof(*e));
    e->user_data = user_data;
    e->op = (uint8_t)op;
    e->kind = kind;
    e->flags = (uint16_t)flags;
    e->count = count;
    e->local_list = local_list;
    e->remote_list = remote_list;
    return e;
}

int mg_client_ring_post_pairs(mg_client_ring *r, int op, uint64_t local_list,
                              const uint32_t *local_idx, uint64_t remote_list,
                              const uint32_t *remote_idx, uint32_t n, uint64_t user_data,
                              unsigned flags, const char *topic, const void *payload,
                              uint32_t payload_len)
{
    uint64_t extra = n > MG_RING_INLINE_PAIRS ? 8 * (uint64_t)(n - MG_RING_INLINE_PAIRS) : 0;
    long ns = note_slots(topic, payload_len);
    uint64_t pslots = (extra + MG_RING_SQE_SIZE - 1) / MG_RING_SQE_SIZE, total;
    mg_ring_sqe *e;
    int rc;
    if (n == 0 || ns < 0)
        return MG_GRPC_INVALID_ARGUMENT;
    total = 1 + pslots + (uint64_t)ns;
    if (total > r->entries)
        return MG_GRPC_INVALID_ARGUMENT;
    if ((rc = ring_room(r, (uint32_t)total)) != 0)
        return rc;
    e = entry(r, op, MG_RING_PAIRS, (flags & MG_RING_ACCEPTED) | (topic ? MG_RING_NOTIFY : 0), n,
              local_list, remote_list, user_data);
    e->note_len = topic ? (uint32_t)(strlen(topic) + 1 + payload_len) : 0;
    for (uint32_t k = 0; k < n; k++) {
        if (k < MG_RING_INLINE_PAIRS) {
            e->u.pairs[k][0] = local_idx[k];
            e->u.pairs[k][1] = remote_idx[k];
        } else {
            uint64_t at = 8 * (uint64_t)(k - MG_RING_INLINE_PAIRS);
            uint8_t *s = (uint8_t *)slot(r, 1 + (uint32_t)(at / MG_RING_SQE_SIZE));
            memcpy(s + at % MG_RING_SQE_SIZE, &local_idx[k], 4);
            memcpy(s + at % MG_RING_SQE_SIZE + 4, &remote_idx[k], 4);
        }
    }
    if (topic)
        put_note(r, 1 + (uint32_t)pslots, topic, payload, payload_len);
    publish(r, (uint32_t)total);
    return 0;
}

int mg_client_ring_post_strided(mg_client_ring *r, int op, uint64_t local_list,
                                uint32_t local_index, uint64_t local_offset, uint64_t local_stride,
                                uint64_t remote_list, uint32_t remote_index, uint64_t remote_offset,
                                uint64_t remote_stride, uint64_t length, uint32_t count,
                                uint64_t user_data, unsigned flags)
{
    mg_ring_sqe *e;
    int rc = ring_room(r, 1);
    if (rc != 0)
        return rc;
    e = entry(r, op, MG_RING_STRIDED, flags & MG_RING_ACCEPTED, count, local_list, remote_list,
              user_data);
    e->u.strided.local_index = local_index;
    e->u.strided.remote_index = remote_index;
    e->u.strided.local_offset = local_offset;
    e->u.strided.remote_offset = remote_offset;
    e->u.strided.local_stride = local_stride;
    e->u.strided.remote_stride = remote_stride;
    e->u.strided.length = length;
    publish(r, 1);
    return 0;
}

unsigned mg_client_ring_poll(mg_client_ring *r, struct mg_ring_cqe *out, unsigned max)
{
    uint32_t tail = LOAD(&r->h->cq_tail);
    unsigned n = 0;
    while (n < max && r->head != tail) {
        memcpy(&out[n++], r->cq + (size_t)(r->head & (r->entries - 1)) * MG_RING_CQE_SIZE,
               sizeof(*out));
        r->head++;
    }
    if (n) {
        STORE(&r->h->cq_head, r->head);
        /* the head is out before the daemon's flag is read (both sequentially consistent) */
        if (LOAD(&r->h->daemon_needs_room))
            eventfd_write(r->doorbell, 1);
    }
    return n;
}

int mg_client_ring_alive(mg_client_ring *r)
{
    struct pollfd p = {r->chan, POLLIN, 0};
    return !LOAD(&r->h->broken) && poll(&p, 1, 0) == 0;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int mg_client_ring_wait(mg_client_ring *r, struct mg_ring_cqe *out, unsigned max, int timeout_ms,
                        unsigned spin_us)
{
    uint64_t t0 = now_us(), spin_end = t0 + spin_us;
    unsigned n;
    while ((n = mg_client_ring_poll(r, out, max)) == 0 && now_us() < spin_end)
        ;
    while (n == 0) {
        struct pollfd p[2] = {{r->bell, POLLIN, 0}, {r->chan, POLLIN, 0}};
        int left = timeout_ms < 0 ? -1 : timeout_ms - (int)((now_us() - t0) / 1000);
        uint64_t v;
        if (LOAD(&r->h->broken))
            return -(int)LOAD(&r->h->broken);
        STORE(&r->h->client_waiting, 1u);
        /* the flag is out before the queue is looked at again (sequentially consistent) */
        if ((n = mg_client_ring_poll(r, out, max)) == 0 && (timeout_ms < 0 || left > 0)) {
            poll(p, 2, left);
            if (eventfd_read(r->bell, &v) != 0 && errno != EAGAIN)
                left = 0;
        }
        STORE(&r->h->client_waiting, 0u);
        if (n == 0 && (n = mg_client_ring_poll(r, out, max)) == 0) {
            if (p[1].revents)
                return -MG_GRPC_UNAVAILABLE; /* the daemon let the ring go */
            if (timeout_ms >= 0 && now_us() - t0 >= (uint64_t)timeout_ms * 1000)
                return 0;
        }
    }
    return (int)n;
}

void mg_client_ring_detach(mg_client_ring *r)
{
    if (r == NULL)
        return;
    if (r->mem)
        munmap(r->mem, r->size);
    if (r->doorbell >= 0)
        close(r->doorbell);
    if (r->bell >= 0)
        close(r->bell);
    if (r->chan >= 0)
        close(r->chan);
    free(r);
}
