/* mg_fdsock: see mg_fdsock.h. */
#include "mg_fdsock.h"
#include "mg_admit.h"
#include "mg_auth.h"
#include "mg_fdproto.h"
#include "mg_server_int.h"

#include "mg_log.h"
#include "mg_str.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FDS_MAX   8   /* descriptors one message may bring before it is a protocol error */
#define CONNS_MAX 256 /* fd-socket connections at once */

typedef struct fd_conn {
    struct mg_fdsock *fs;
    int fd;
    uint64_t key; /* its descriptors' key in the table */
    uint32_t uid;
    mg_proc proc;
    struct event *ev;
    mg_list_node link;
} fd_conn;

typedef struct mg_fdsock {
    mg_gateway *gw;
    char path[108];
    int fd;
    struct event *accept_ev;
    struct event *expire_ev;
    mg_fd_handles *handles;
    mg_list conns;
    unsigned nconns;
    uint64_t next_key;
    uint64_t discarded; /* descriptors closed because their message was no request to serve */
    uint64_t warned_ms; /* the last fd_socket_protocol line: at most one a second */
    uint64_t unsaid;    /* protocol errors since, not logged */
} mg_fdsock;

static void conn_close(fd_conn *c)
{
    c->fs->nconns--;
    mg_list_remove(&c->link);
    event_free(c->ev);
    close(c->fd);
    free(c);
}

/* Sends one reply message. Returns -1 when the client does not take it (it closed, or let its
 * replies pile up): the caller closes the connection. */
static int reply(fd_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int reply(fd_conn *c, const char *fmt, ...)
{
    char buf[700];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    return send(c->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n ? 0 : -1;
}

static void close_all(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* Closes the n descriptors a message brought that no handle took, and counts them. */
static void discard(fd_conn *c, const int *fds, int n)
{
    close_all(fds, n);
    c->fs->discarded += (uint64_t)n;
}

/* Takes every descriptor of every SCM_RIGHTS message in msg: the first max into fds, the rest
 * closed at once (and counted). Returns how many the kernel installed, so a count above max
 * means that only max of them are in fds. */
static int take_fds(fd_conn *c, struct msghdr *msg, int *fds, int max)
{
    int n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        const unsigned char *p = CMSG_DATA(cm);
        for (int i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, p + i * sizeof(int), sizeof(int));
            if (n < max)
                fds[n] = fd;
            else
                discard(c, &fd, 1);
            n++;
        }
    }
    return n;
}

/* Admits the sender as a call on the Unix socket would be. Returns 0 with who->tenant set, or
 * -1 after replying why. */
static int admit(fd_conn *c, const char *token, mg_fd_owner *who)
{
    mg_gateway *gw = c->fs->gw;
    mg_principal p;
    mg_verdict v;
    mg_admit_req r = {.kind = CONN_UNIX, .has_uid = 1, .uid = c->uid, .path = "fd socket"};
    uint8_t hash[MG_AUTH_HASH_LEN];
    memset(&p, 0, sizeof(p));
    if (token) {
        mg_auth_hash(token, strlen(token), hash);
        r.auth_header = 1;
        r.bearer_hash = hash;
    }
    if (mg_admit_caller(gw->cfg, gw->core->auth, &r, &p, &v) != 0) {
        reply(c, "ERR %s %s", mg_grpc_code_name(v.code), v.message);
        return -1;
    }
    who->uid = c->uid;
    who->proc = c->proc;
    mg_strlcpy(who->tenant, p.tenant, sizeof(who->tenant));
    return 0;
}

/* One request: "PUT [TOKEN]" with one descriptor. Returns -1 to close the connection. */
static int serve(fd_conn *c, char *text, size_t len, int *fds, int nfds)
{
    mg_fdsock *fs = c->fs;
    mg_fd_owner who;
    uint64_t handle;
    char err[300];
    const char *token, *why;
    if (mg_fdproto_request(text, len, &token, &why) != 0) {
        discard(c, fds, nfds);
        return reply(c, "ERR INVALID_ARGUMENT %s", why);
    }
    if (nfds != 1) {
        discard(c, fds, nfds);
        return reply(c,
                     "ERR INVALID_ARGUMENT %d descriptors came with the request; PUT takes "
                     "exactly one (SCM_RIGHTS)",
                     nfds);
    }
    if (c->proc.pid == 0) { /* a handle bound to pid 0 would be any such process's */
        discard(c, fds, 1);
        return reply(c, "ERR PERMISSION_DENIED the kernel names no process for this client (it "
                        "runs in a pid namespace the daemon cannot see): run the daemon in the "
                        "host's pid namespace (Kubernetes: hostPID)");
    }
    if (admit(c, token, &who) != 0) {
        discard(c, fds, 1);
        return 0;
    }
    if (mg_fd_handles_put(fs->handles, fds[0], &who, c->key, mg_now_mono_ms(), &handle, err,
                          sizeof(err)) != 0) {
        close(fds[0]);
        return reply(c, "ERR RESOURCE_EXHAUSTED %s", err);
    }
    mg_debug("fd_passed", "uid=%u pid=%d tenant=%s", (unsigned)who.uid, (int)who.proc.pid,
             who.tenant);
    return reply(c, "OK %" PRIu64 " %" PRIu64, handle, mg_fd_handles_ttl_ms(fs->handles));
}

/* Logs a broken message, at most one line a second: a client that sends them in a loop does not
 * flood the log (the line says how many went unsaid before it). */
static void say_broken(fd_conn *c, int nfds, const char *why)
{
    mg_fdsock *fs = c->fs;
    uint64_t now = mg_now_mono_ms();
    if (fs->warned_ms && now - fs->warned_ms < 1000) {
        fs->unsaid++;
        return;
    }
    mg_warn("fd_socket_protocol", "uid=%u pid=%d descriptors=%d reason=\"%s\" unsaid=%" PRIu64,
            (unsigned)c->uid, (int)c->proc.pid, nfds, why, fs->unsaid);
    fs->warned_ms = now;
    fs->unsaid = 0;
}

/* Why a message received as n bytes with nfds descriptors cannot be served and ends its
 * connection, or NULL when it is a request to serve. */
static const char *broken(const struct msghdr *msg, ssize_t n, int nfds)
{
    if (msg->msg_flags & MSG_TRUNC)
        return "the request is longer than PUT and a token";
    if ((msg->msg_flags & MSG_CTRUNC) || nfds > FDS_MAX)
        return "the descriptors did not fit (MSG_CTRUNC)";
    if (n == 0) /* SOCK_SEQPACKET: an empty message, or the end of the connection */
        return nfds ? "an empty message is no request" : "";
    return NULL;
}

/* Reads a few messages, then lets others have the loop. Every descriptor the kernel installs
 * with a message leaves this function in the handle table or closed, whatever the message. */
static void conn_read_cb(evutil_socket_t sock, short what, void *arg)
{
    fd_conn *c = arg;
    char text[MG_FDPROTO_REQUEST_MAX + 1];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * FDS_MAX)];
    } ctl;
    int fds[FDS_MAX];
    (void)what;
    for (int round = 0; round < 16; round++) {
        struct iovec iov = {text, MG_FDPROTO_REQUEST_MAX};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        const char *why;
        ssize_t n;
        int nfds;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n < 0) { /* no descriptor comes with a failed receive */
            conn_close(c);
            return;
        }
        nfds = take_fds(c, &msg, fds, FDS_MAX);
        if ((why = broken(&msg, n, nfds)) != NULL) {
            discard(c, fds, nfds < FDS_MAX ? nfds : FDS_MAX);
            if (why[0]) {
                say_broken(c, nfds, why);
                reply(c, "ERR INVALID_ARGUMENT %s; the connection is closed", why);
            }
            conn_close(c);
            return;
        }
        if (serve(c, text, (size_t)n, fds, nfds) != 0) {
            conn_close(c);
            return;
        }
    }
}

static void accept_cb(evutil_socket_t sock, short what, void *arg)
{
    mg_fdsock *fs = arg;
    (void)what;
    for (;;) {
        uint32_t uid;
        mg_proc proc;
        fd_conn *c;
        int fd = accept4(sock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                mg_accept_failed(fs->gw, "fd socket", errno); /* pauses this socket too */
            return;
        }
        mg_accept_ok(fs->gw);
        if (fs->gw->state == MG_STATE_DRAINING || fs->nconns >= CONNS_MAX ||
            mg_unix_peer(fd, &uid, &proc) != 0 || (c = calloc(1, sizeof(*c))) == NULL) {
            if (fs->nconns >= CONNS_MAX)
                mg_warn("fd_socket_full", "conns=%u", fs->nconns);
            close(fd);
            continue;
        }
        c->fs = fs;
        c->fd = fd;
        c->uid = uid;
        c->proc = proc;
        c->key = ++fs->next_key;
        c->ev = event_new(fs->gw->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
        if (c->ev == NULL || event_add(c->ev, NULL) != 0) {
            if (c->ev)
                event_free(c->ev);
            close(fd);
            free(c);
            continue;
        }
        mg_list_push_front(&fs->conns, &c->link);
        fs->nconns++;
    }
}

static void expire_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_fdsock *fs = arg;
    size_t n = mg_fd_handles_expire(fs->handles, mg_now_mono_ms());
    (void)fd;
    (void)what;
    if (n)
        mg_info("fd_handles_expired", "count=%zu reason=\"not registered within %" PRIu64 " ms\"",
                n, mg_fd_handles_ttl_ms(fs->handles));
}

/* The socket: bound, given the Unix socket's group and mode, listening. Returns its descriptor
 * or -1 after logging why. */
static int open_socket(mg_gateway *gw, const char *path)
{
    struct sockaddr_un sun;
    int fd;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path)) {
        mg_error("listen_failed", "fd_socket=%s reason=\"path longer than %zu bytes\"", path,
                 sizeof(sun.sun_path) - 1);
        return -1;
    }
    memcpy(sun.sun_path, path, strlen(path) + 1);
    if (mg_unix_path_clear(path, "fd_socket") != 0)
        return -1;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0 || listen(fd, 128) != 0) {
        mg_error("listen_failed", "fd_socket=%s reason=\"%s\"", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (mg_unix_path_own(gw, path, "fd_socket") != 0) {
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

int mg_fdsock_start(mg_gateway *gw)
{
    const mg_config *cfg = gw->cfg;
    mg_fd_handles_config hc = {.max_handles = (uint32_t)cfg->max_fd_handles,
                               .max_per_key = (uint32_t)cfg->max_unclaimed_fds,
                               .ttl_ms = cfg->fd_handle_ttl};
    struct timeval tick;
    mg_fdsock *fs;
    int rc;
    if (cfg->fd_socket[0] == '\0' || cfg->unix_socket[0] == '\0')
        return 0;
    fs = calloc(1, sizeof(*fs));
    if (fs == NULL)
        return MG_ERR_NOMEM;
    fs->gw = gw;
    fs->fd = -1;
    mg_list_init(&fs->conns);
    gw->core->fdsock = fs;
    if (strcmp(cfg->fd_socket, "auto") == 0)
        rc = snprintf(fs->path, sizeof(fs->path), "%s.fd", cfg->unix_socket);
    else
        rc = snprintf(fs->path, sizeof(fs->path), "%s", cfg->fd_socket);
    if (rc < 0 || (size_t)rc >= sizeof(fs->path)) {
        mg_error("listen_failed", "fd_socket=%s reason=\"path longer than %zu bytes\"",
                 cfg->fd_socket, sizeof(fs->path) - 1);
        return MG_ERR_INVALID;
    }
    if ((rc = mg_fd_handles_new(&fs->handles, &hc)) != 0)
        return rc;
    if ((fs->fd = open_socket(gw, fs->path)) < 0)
        return MG_ERR_SYSTEM;
    /* Expiry every quarter of a handle's life (at most a second apart, at least 5 ms). */
    {
        uint64_t ms = cfg->fd_handle_ttl / 4;
        ms = ms > 1000 ? 1000 : ms < 5 ? 5 : ms;
        tick.tv_sec = (time_t)(ms / 1000);
        tick.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    }
    fs->accept_ev = event_new(gw->base, fs->fd, EV_READ | EV_PERSIST, accept_cb, fs);
    fs->expire_ev = event_new(gw->base, -1, EV_PERSIST, expire_cb, fs);
    if (fs->accept_ev == NULL || fs->expire_ev == NULL || event_add(fs->accept_ev, NULL) != 0 ||
        event_add(fs->expire_ev, &tick) != 0)
        return MG_ERR_NOMEM;
    mg_info("listen", "addr=unix:%s kind=fd-socket handle_ttl_ms=%" PRIu64, fs->path,
            cfg->fd_handle_ttl);
    return 0;
}

void mg_fdsock_stop(mg_gateway *gw)
{
    mg_fdsock *fs = gw->core->fdsock;
    if (fs == NULL)
        return;
    while (!mg_list_empty(&fs->conns))
        conn_close(mg_container_of(mg_list_first(&fs->conns), fd_conn, link));
    if (fs->accept_ev)
        event_free(fs->accept_ev);
    if (fs->expire_ev)
        event_free(fs->expire_ev);
    if (fs->fd >= 0) {
        close(fs->fd);
        unlink(fs->path);
    }
    mg_fd_handles_del(fs->handles);
    free(fs);
    gw->core->fdsock = NULL;
}

void mg_fdsock_accepting(mg_gateway *gw, int on)
{
    mg_fdsock *fs = gw->core->fdsock;
    if (fs == NULL || fs->accept_ev == NULL)
        return;
    if (on)
        event_add(fs->accept_ev, NULL);
    else
        event_del(fs->accept_ev);
}

mg_fd_handles *mg_fdsock_handles(mg_gateway *gw)
{
    return gw->core->fdsock ? gw->core->fdsock->handles : NULL;
}

const char *mg_fdsock_path(const mg_gateway *gw)
{
    return gw->core->fdsock ? gw->core->fdsock->path : "";
}

uint64_t mg_fdsock_discarded(const mg_gateway *gw)
{
    return gw->core->fdsock ? gw->core->fdsock->discarded : 0;
}

int mg_call_take_fd(mg_call *call, uint64_t handle, int *fd, char *err)
{
    mg_fd_handles *t = mg_fdsock_handles(mg_call_gateway(call));
    mg_fd_owner who;
    if (t == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "this daemon takes no descriptors: it runs without an fd socket (--fd-socket)");
        return MG_ERR_UNSUPPORTED;
    }
    if (!mg_call_socket_cred(call, &who.uid, &who.proc)) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a passed descriptor is used by the process that passed it, calling on the Unix "
                 "socket; this call came over the network");
        return MG_ERR_PERMISSION;
    }
    mg_strlcpy(who.tenant, mg_call_tenant(call), sizeof(who.tenant));
    return mg_fd_handles_take(t, handle, &who, mg_now_mono_ms(), fd, err, MG_SEG_ERROR_MAX);
}
