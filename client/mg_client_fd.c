/* mg_client_fd: memory the program has — a descriptor passed on the daemon's fd socket
 * (mg_fd_pass), and buffers allocated here and registered where they lie (mg_buffer_alloc). */
#include "mg_client.h"
#include "mg_client_int.h"
#include "mg_fdproto.h"

#include "moongate/v1/memory.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int mg_fd_socket_of(const char *target, char *out, size_t cap)
{
    int n;
    if (target == NULL || strncmp(target, "unix:", 5) != 0)
        return -1;
    n = snprintf(out, cap, "%s.fd", target + 5);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int mg_fd_pass(const char *fd_socket, int fd, const char *token, uint64_t *handle, uint64_t *ttl_ms,
               int *status, char *err, size_t errcap)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    char req[MG_FDPROTO_REQUEST_MAX + 1], rep[800];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov;
    struct msghdr msg = {0};
    struct cmsghdr *cm;
    ssize_t n;
    int s, len;

    *status = MG_GRPC_UNAVAILABLE;
    len = snprintf(req, sizeof(req), token && *token ? "PUT %s" : "PUT", token);
    if (strlen(fd_socket) >= sizeof(sun.sun_path) || len < 0 || (size_t)len >= sizeof(req)) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "fd socket path or token too long");
        return -1;
    }
    memcpy(sun.sun_path, fd_socket, strlen(fd_socket) + 1);
    s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        snprintf(err, errcap, "cannot connect to the fd socket %s: %s", fd_socket, strerror(errno));
        if (s >= 0)
            close(s);
        return -1;
    }
    iov.iov_base = req;
    iov.iov_len = (size_t)len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    errno = 0;
    if (sendmsg(s, &msg, MSG_NOSIGNAL) != len || (n = recv(s, rep, sizeof(rep) - 1, 0)) <= 0) {
        snprintf(err, errcap, "the fd socket %s: %s", fd_socket,
                 errno ? strerror(errno) : "closed without an answer");
        close(s);
        return -1;
    }
    close(s);
    rep[n] = '\0';
    return mg_fdproto_reply(rep, handle, ttl_ms, status, err, errcap);
}

/* ---- buffers: memory allocated here, registered where it lies ---- */

static unsigned long buffer_seq;

/* A memfd of `size` bytes sealed against shrinking and growing, mapped here. Returns its
 * descriptor and *addr, or -1 with err set. */
static int buffer_memory(size_t size, void **addr, char *err, size_t errcap)
{
    int fd = memfd_create("moongate-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (*addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        snprintf(err, errcap, "cannot allocate a buffer of %zu bytes: %s", size, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* RegisterSegment of a passed descriptor with its address here. Returns 0 and *id, or -1. */
static int register_buffer(mg_client *c, const char *name, uint64_t handle, size_t size,
                           int remote_accessible, void *addr, uint64_t *id, int *status, char *err,
                           size_t errcap)
{
    Moongate__V1__RegisterRequest req = MOONGATE__V1__REGISTER_REQUEST__INIT;
    req.name = (char *)name;
    req.source = MOONGATE__V1__SEGMENT_SOURCE__FD;
    req.fd_handle = handle;
    req.size = size;
    req.remote_accessible = remote_accessible != 0;
    req.client_address = (uint64_t)(uintptr_t)addr;
    return mg_client_register(c, &req, id, status, err, errcap);
}

int mg_client_register(mg_client *c, const Moongate__V1__RegisterRequest *req, uint64_t *id,
                       int *status, char *err, size_t errcap)
{
    Moongate__V1__RegisterResponse *r = mg_client_call_msg(
        c, "/moongate.v1.Memory/RegisterSegment", &req->base,
        &moongate__v1__register_response__descriptor, 30000, status, err, errcap);
    if (r == NULL)
        return -1;
    if (r->segment == NULL) {
        *status = MG_GRPC_INTERNAL;
        snprintf(err, errcap, "the daemon's answer holds no segment");
        moongate__v1__register_response__free_unpacked(r, NULL);
        return -1;
    }
    *id = r->segment->id;
    moongate__v1__register_response__free_unpacked(r, NULL);
    return 0;
}

/* What makes a buffer again after a restart: the library keeps its memfd. */
typedef struct {
    int fd;
    size_t size;
    int remote_accessible;
    void *addr;
    char name[128];
} kept_buffer;

static void buffer_drop(void *arg)
{
    kept_buffer *b = arg;
    close(b->fd);
    free(b);
}

static int buffer_redo(mg_client *c, void *arg, uint64_t *id, char *err, size_t errcap)
{
    kept_buffer *b = arg;
    char sock[128];
    uint64_t handle, ttl_ms;
    int status;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0 ||
        mg_fd_pass(sock, b->fd, mg_client_token(c), &handle, &ttl_ms, &status, err, errcap) != 0)
        return -1;
    return register_buffer(c, b->name, handle, b->size, b->remote_accessible, b->addr, id, &status,
                           err, errcap);
}

/* Keeps fd (the caller's to close either way) so that the buffer can be made again. */
static void buffer_keep(mg_client *c, int fd, size_t size, int remote_accessible, void *addr,
                        const char *name, uint64_t id)
{
    kept_buffer *b;
    if (mgc_keep_of(c) == NULL || (b = calloc(1, sizeof(*b))) == NULL)
        return;
    if ((b->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        free(b);
        return; /* it does not come back after a restart; nothing else is lost */
    }
    b->size = size;
    b->remote_accessible = remote_accessible;
    b->addr = addr;
    snprintf(b->name, sizeof(b->name), "%s", name);
    mgc_keep_redo(c, id, buffer_redo, buffer_drop, b, 0);
}

int mg_buffer_alloc(mg_client *c, size_t size, int remote_accessible, const char *name,
                    mg_buffer *out, int *status, char *err, size_t errcap)
{
    char sock[128], fallback[64];
    uint64_t handle, ttl_ms, id;
    void *addr = NULL;
    int fd;
    *status = MG_GRPC_INVALID_ARGUMENT;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0) {
        snprintf(err, errcap,
                 "buffers are registered over the daemon's Unix socket: connect "
                 "to a unix:PATH target");
        return -1;
    }
    if (size == 0) {
        snprintf(err, errcap, "a buffer needs a size");
        return -1;
    }
    *status = MG_GRPC_RESOURCE_EXHAUSTED;
    if ((fd = buffer_memory(size, &addr, err, errcap)) < 0)
        return -1;
    if (name == NULL) {
        snprintf(fallback, sizeof(fallback), "buffer-%d-%lu", (int)getpid(),
                 __atomic_add_fetch(&buffer_seq, 1, __ATOMIC_RELAXED));
        name = fallback;
    }
    if (mg_fd_pass(sock, fd, mg_client_token(c), &handle, &ttl_ms, status, err, errcap) != 0 ||
        register_buffer(c, name, handle, size, remote_accessible, addr, &id, status, err, errcap) !=
            0) {
        munmap(addr, size);
        close(fd);
        return -1;
    }
    buffer_keep(c, fd, size, remote_accessible, addr, name, id);
    close(fd); /* the mapping here and the daemon's keep the memory */
    out->addr = addr;
    out->size = size;
    out->segment_id = id;
    return 0;
}

int mg_client_unregister(mg_client *c, uint64_t id, int *status, char *err, size_t errcap)
{
    Moongate__V1__UnregisterRequest req = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
    uint8_t buf[16], *resp = NULL;
    size_t n, resp_len = 0;
    int rc;
    req.id = mg_client_segment_now(c, id);
    if (mgc_keep_forget(c, id)) { /* it did not come back after a restart: nothing to undo */
        *status = MG_GRPC_OK;
        return 0;
    }
    n = moongate__v1__unregister_request__pack(&req, buf);
    rc = mg_client_call(c, "/moongate.v1.Memory/UnregisterSegment", buf, n, 30000, &resp, &resp_len,
                        status, err, errcap);
    free(resp);
    if (rc != 0)
        *status = MG_GRPC_UNAVAILABLE;
    return rc != 0 || *status != MG_GRPC_OK ? -1 : 0;
}

int mg_buffer_free(mg_client *c, mg_buffer *b, int *status, char *err, size_t errcap)
{
    int rc = mg_client_unregister(c, b->segment_id, status, err, errcap);
    if (b->addr)
        munmap(b->addr, b->size);
    b->addr = NULL;
    return rc;
}
