/*
 * GPU memory staged at the target (client side): device memory registered as STAGED, a peer's
 * target over TCP where no RDMA path reaches it. For each registration this library makes a
 * copy channel (a SOCK_SEQPACKET socket pair, moongate/stagewire.h), passes the daemon's end on
 * the fd socket and serves its own end on one thread per process, started by the first
 * registration: the daemon's staging buffer mapped at HELLO, then each order's copy into or out
 * of device memory in the context that owns the pointer, then the answer. The program that owns
 * the memory does nothing meanwhile (and a Python program's GIL is never taken). A channel whose
 * daemon end closes (the segment unregistered, its connection gone, the daemon ended) is
 * dropped with its mapping.
 */
#include "mg_client.h"
#include "mg_client_int.h"
#include "mg_cuda.h"
#include "mg_vram.h"
#include "moongate/stagewire.h"
#include "moongate/v1/memory.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CHANNELS 256

typedef struct channel {
    int fd;            /* this process's end */
    mg_cu_context ctx; /* the context that owns the memory */
    uint8_t *buf;      /* the daemon's staging buffer, mapped at HELLO */
    size_t cap;
    int pinned; /* cuMemHostRegister took the mapping */
} channel;

static struct {
    pthread_mutex_t mu;
    pthread_t thread;
    int started;
    int wake; /* an eventfd: a channel was added */
    channel ch[MAX_CHANNELS];
    int n;
} srv = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = -1};

static void answer(int fd, uint64_t seq, uint32_t status, const char *why)
{
    mg_stage_answer a = {.magic = MG_STAGE_MAGIC, .status = status, .seq = seq};
    if (why)
        snprintf(a.why, sizeof(a.why), "%s", why);
    if (send(fd, &a, sizeof(a), MSG_NOSIGNAL) < 0) {
        /* the daemon's end is gone: the next receive sees it and drops the channel */
    }
}

/* The order's copy, in the memory's context. 0, or a gRPC code with why. */
static uint32_t copy(const mg_cuda *cu, channel *ch, const mg_stage_order *o, char *why, size_t cap)
{
    mg_cu_result rc;
    char text[160];
    if (ch->buf == NULL || o->slot_off > ch->cap || o->len > ch->cap - o->slot_off) {
        snprintf(why, cap, "an order outside the staging buffer (%llu bytes at %llu of %zu)",
                 (unsigned long long)o->len, (unsigned long long)o->slot_off, ch->cap);
        return MG_GRPC_INTERNAL;
    }
    if ((rc = cu->cuCtxSetCurrent(ch->ctx)) == 0)
        rc = o->type == MG_STAGE_TO_DEVICE
                 ? cu->cuMemcpyHtoD((mg_cu_ptr)o->addr, ch->buf + o->slot_off, o->len)
                 : cu->cuMemcpyDtoH(ch->buf + o->slot_off, (mg_cu_ptr)o->addr, o->len);
    if (rc == 0)
        return 0;
    snprintf(why, cap, "%s of %llu bytes at device address %#llx: %s",
             o->type == MG_STAGE_TO_DEVICE ? "cuMemcpyHtoD" : "cuMemcpyDtoH",
             (unsigned long long)o->len, (unsigned long long)o->addr,
             mg_cuda_strerror(cu, rc, text, sizeof(text)));
    return MG_GRPC_INTERNAL;
}

/* HELLO: the staging buffer (fd) mapped and, where the driver takes it, pinned. */
static uint32_t hello(const mg_cuda *cu, channel *ch, const mg_stage_order *o, int fd, char *why,
                      size_t cap)
{
    mg_cuda_ptr_info info;
    void *p;
    if (fd < 0 || o->len == 0) {
        snprintf(why, cap, "a HELLO without its staging buffer");
        return MG_GRPC_INVALID_ARGUMENT;
    }
    if (mg_cuda_pointer(cu, (uintptr_t)o->addr, &info) != 1) {
        snprintf(why, cap, "%#llx is not device memory of this process",
                 (unsigned long long)o->addr);
        return MG_GRPC_INVALID_ARGUMENT;
    }
    p = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, cap, "mapping the staging buffer: %s", strerror(errno));
        return MG_GRPC_RESOURCE_EXHAUSTED;
    }
    ch->buf = p;
    ch->cap = o->len;
    ch->pinned = cu->cuCtxSetCurrent(ch->ctx) == 0 && cu->cuMemHostRegister(p, o->len, 0) == 0;
    return 0;
}

static void drop(const mg_cuda *cu, channel *ch)
{
    if (ch->buf) {
        if (ch->pinned)
            cu->cuMemHostUnregister(ch->buf);
        munmap(ch->buf, ch->cap);
    }
    close(ch->fd);
}

/* One message of channel k: its order served and answered. -1 when the channel ended. */
static int serve_one(const mg_cuda *cu, channel *ch)
{
    mg_stage_order o;
    char ctl[CMSG_SPACE(sizeof(int))], why[240];
    struct iovec iov = {.iov_base = &o, .iov_len = sizeof(o)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c;
    int fd = -1;
    uint32_t st;
    ssize_t n = recvmsg(ch->fd, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    for (c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; c != NULL; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof(int));
    if (n != (ssize_t)sizeof(o) || o.magic != MG_STAGE_MAGIC) {
        if (fd >= 0)
            close(fd);
        return -1; /* ended, or not a peer this library speaks with */
    }
    why[0] = '\0';
    if (o.type == MG_STAGE_HELLO && ch->buf == NULL)
        st = hello(cu, ch, &o, fd, why, sizeof(why));
    else if (o.type == MG_STAGE_TO_DEVICE || o.type == MG_STAGE_FROM_DEVICE)
        st = copy(cu, ch, &o, why, sizeof(why));
    else
        st = MG_GRPC_INVALID_ARGUMENT, snprintf(why, sizeof(why), "order %u", o.type);
    if (fd >= 0)
        close(fd); /* mapped (or refused): the mapping holds the buffer */
    answer(ch->fd, o.seq, st, why);
    return 0;
}

static void *serve(void *arg)
{
    const mg_cuda *cu = arg;
    struct pollfd p[MAX_CHANNELS + 1];
    for (;;) {
        int n;
        pthread_mutex_lock(&srv.mu);
        n = srv.n;
        p[0] = (struct pollfd){.fd = srv.wake, .events = POLLIN};
        for (int i = 0; i < n; i++)
            p[i + 1] = (struct pollfd){.fd = srv.ch[i].fd, .events = POLLIN};
        pthread_mutex_unlock(&srv.mu);
        if (poll(p, (nfds_t)n + 1, -1) < 0)
            continue;
        if (p[0].revents) {
            uint64_t v;
            if (read(srv.wake, &v, sizeof(v)) < 0) {
                /* nothing to drain: woken anyway */
            }
        }
        /* Only this thread removes channels; others append under the lock, past n. */
        for (int i = n - 1; i >= 0; i--) {
            if (!p[i + 1].revents || serve_one(cu, &srv.ch[i]) == 0)
                continue;
            pthread_mutex_lock(&srv.mu);
            drop(cu, &srv.ch[i]);
            srv.ch[i] = srv.ch[--srv.n];
            pthread_mutex_unlock(&srv.mu);
        }
    }
    return NULL;
}

/* Serves fd (a channel's end) from now on, in context ctx. 0, or -1 with err. */
static int serve_channel(const mg_cuda *cu, int fd, mg_cu_context ctx, char *err, size_t errcap)
{
    uint64_t one = 1;
    int rc = 0;
    pthread_mutex_lock(&srv.mu);
    if (!srv.started) {
        sigset_t all, old;
        srv.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        sigfillset(&all); /* the serving thread takes none of the program's signals */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        srv.started = srv.wake >= 0 && pthread_create(&srv.thread, NULL, serve, (void *)cu) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (srv.started)
            pthread_detach(srv.thread);
    }
    if (!srv.started || srv.n == MAX_CHANNELS) {
        snprintf(err, errcap,
                 srv.started ? "%d staged GPU registrations in this process already"
                             : "the thread that serves staged GPU memory did not start (%d)",
                 MAX_CHANNELS);
        rc = -1;
    } else {
        srv.ch[srv.n++] = (channel){.fd = fd, .ctx = ctx};
        if (write(srv.wake, &one, sizeof(one)) < 0)
            rc = 0; /* a wake already pending does as well */
    }
    pthread_mutex_unlock(&srv.mu);
    return rc;
}

int mg_vram_stage_serve(int fd, uintptr_t ptr, int *device, int *status, char *err, size_t errcap)
{
    const mg_cuda *cu;
    mg_cuda_ptr_info info;
    *status = MG_GRPC_FAILED_PRECONDITION;
    if ((cu = mg_cuda_get(err, errcap)) == NULL)
        return -1;
    if (mg_cuda_pointer(cu, ptr, &info) != 1) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "%#llx is not device memory the CUDA driver knows",
                 (unsigned long long)ptr);
        return -1;
    }
    if (serve_channel(cu, fd, info.context, err, errcap) != 0)
        return -1;
    *device = info.device;
    return 0;
}

typedef struct staged_keep {
    uint64_t ptr, len;
    int remote_accessible;
    char name[160];
} staged_keep;

int mg_vram_stage_request(const char *sock, const char *token, uintptr_t ptr, size_t len,
                          int remote_accessible, struct Moongate__V1__RegisterRequest *req,
                          char *location, size_t loccap, int *chan, int *status, char *err,
                          size_t errcap)
{
    uint64_t handle, ttl;
    int sv[2], device;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        *status = MG_GRPC_RESOURCE_EXHAUSTED;
        snprintf(err, errcap, "socketpair: %s", strerror(errno));
        return -1;
    }
    if (mg_vram_stage_serve(sv[0], ptr, &device, status, err, errcap) != 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    /* from here the serving thread owns sv[0]: the daemon closing its end (or never getting
     * it) ends the channel there */
    if (mg_fd_pass(sock, sv[1], token, &handle, &ttl, status, err, errcap) != 0) {
        close(sv[1]);
        shutdown(sv[0], SHUT_RDWR);
        return -1;
    }
    close(sv[1]);
    snprintf(location, loccap, "cuda:%d", device);
    req->source = MOONGATE__V1__SEGMENT_SOURCE__STAGED;
    req->fd_handle = handle;
    req->size = len;
    req->client_address = ptr;
    req->location = location;
    req->remote_accessible = remote_accessible != 0;
    *chan = sv[0];
    return 0;
}

static int register_staged(mg_client *c, const staged_keep *k, uint64_t *id, int *status, char *err,
                           size_t errcap)
{
    Moongate__V1__RegisterRequest req = MOONGATE__V1__REGISTER_REQUEST__INIT;
    char sock[4200], location[24];
    int chan;
    *status = MG_GRPC_FAILED_PRECONDITION;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0) {
        snprintf(err, errcap,
                 "staged GPU memory is registered on the daemon's Unix socket: "
                 "connect to a unix:PATH target");
        return -1;
    }
    if (mg_vram_stage_request(sock, mg_client_token(c), k->ptr, k->len, k->remote_accessible, &req,
                              location, sizeof(location), &chan, status, err, errcap) != 0)
        return -1;
    req.name = (char *)k->name;
    if (mg_client_register(c, &req, id, status, err, errcap) != 0) {
        shutdown(chan, SHUT_RDWR); /* the serving thread sees the end and lets it go */
        return -1;
    }
    return 0;
}

static int staged_redo(mg_client *c, void *arg, uint64_t *id, char *err, size_t errcap)
{
    int status;
    return register_staged(c, arg, id, &status, err, errcap);
}

int mg_vram_register_staged(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                            const char *name, uint64_t *id, int *status, char *err, size_t errcap)
{
    staged_keep k = {.ptr = ptr, .len = len, .remote_accessible = remote_accessible};
    staged_keep *kept;
    if (ptr == 0 || len == 0) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "staged GPU memory needs an address and a size");
        return -1;
    }
    if (name)
        snprintf(k.name, sizeof(k.name), "%.150s", name);
    else
        snprintf(k.name, sizeof(k.name), "vram-staged-%d-%llx", (int)getpid(),
                 (unsigned long long)ptr);
    if (register_staged(c, &k, id, status, err, errcap) != 0)
        return -1;
    if (mgc_keep_of(c) && (kept = malloc(sizeof(*kept))) != NULL) {
        *kept = k;
        mgc_keep_redo(c, *id, staged_redo, free, kept, 1);
    }
    *status = MG_GRPC_OK;
    return 0;
}
