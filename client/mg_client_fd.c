/* mg_client_fd: passing a descriptor on the daemon's fd socket (mg_client.h, mg_fd_pass). */
#include "mg_client.h"
#include "mg_fdproto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
