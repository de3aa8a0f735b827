/*
 * mg_conn: the connection layer of the control port: listeners, accepted connections and their
 * nghttp2 server sessions. A connection is a bufferevent (OpenSSL for TLS, a plain socket for h2c
 * over TCP and the Unix socket) plus a session. nghttp2 callbacks only record and submit, handing
 * request events to the call layer (mg_call.c); bytes move in mg_conn_send(), called after each
 * read and from a per-connection deferred event, so the answers of many calls finished in one
 * loop pass go out in one write. Output is bounded per connection: past the bound the daemon
 * stops reading from that connection until its peer reads.
 *
 * Loop thread only.
 */
#include "mg_server_int.h"
#include "mg_fdsock.h"
#include "moongate/procmem.h"

#include "mg_bev.h"
#include "mg_bev_err.h"
#include "mg_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

const char *const mg_conn_kind_names[] = {"tls", "h2c", "unix"};

/* ------------------------------------------------------------------ nghttp2 callbacks */

static ssize_t send_cb(nghttp2_session *ng, const uint8_t *data, size_t length, int flags,
                       void *user_data)
{
    mg_conn *conn = user_data;
    if (mg_bev_pending(conn->bev, conn->stage) >= conn->gw->cfg->max_conn_output_bytes) {
        conn->send_capped = 1;
        return NGHTTP2_ERR_WOULDBLOCK;
    }
    if (mg_bev_add(conn->bev, conn->stage, data, length) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

static int on_begin_headers_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    call = mg_call_open(conn, frame->hd.stream_id);
    if (call == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, call);
    conn->nstreams++;
    conn->gw->core->stats.streams_active++;
    if (conn->timer)
        evtimer_del(conn->timer);
    return 0;
}

static int on_header_cb(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user_data)
{
    mg_call *call;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* request trailers carry nothing we use */
    call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (call)
        mg_call_on_header(call, name, namelen, value, valuelen);
    return 0;
}

static int on_frame_recv_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call;

    if (!conn->got_frame) {
        conn->got_frame = 1;
        if (conn->timer && conn->nstreams == 0) {
            struct timeval tv = {(time_t)conn->gw->cfg->idle_timeout, 0};
            evtimer_add(conn->timer, &tv);
        }
    }
    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (call == NULL)
            break;
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST)
            mg_call_on_headers_end(call);
        if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
            mg_call_on_request_end(call);
        break;
    case NGHTTP2_DATA:
        call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (call == NULL)
            break;
        if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
            mg_call_on_request_end(call);
        else
            mg_call_on_data_frame(call);
        break;
    case NGHTTP2_RST_STREAM:
        conn->gw->core->stats.rst_received++;
        break;
    default:
        break;
    }
    return 0;
}

static int on_data_chunk_recv_cb(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
                                 const uint8_t *data, size_t len, void *user_data)
{
    mg_call *call = nghttp2_session_get_stream_user_data(ng, stream_id);
    /* Window updates are ours (no_auto_window_update): the connection's window is given back
     * at once, a stream's as its call uses the bytes (mg_call_on_data). */
    nghttp2_session_consume_connection(ng, len);
    if (call)
        mg_call_on_data(call, data, len);
    else
        nghttp2_session_consume_stream(ng, stream_id, len);
    return 0;
}

static int on_frame_send_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        mg_call *call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (call)
            mg_call_on_final_sent(call);
    } else if (frame->hd.type == NGHTTP2_GOAWAY) {
        mg_conn *conn = user_data;
        conn->gw->core->stats.goaway_sent++;
        if (frame->goaway.error_code != NGHTTP2_NO_ERROR) /* the connection ends for a cause */
            mg_warn("conn_goaway", "peer=%s kind=%s error=%s last_stream=%d", conn->peer,
                    mg_conn_kind_names[conn->kind],
                    nghttp2_http2_strerror(frame->goaway.error_code), frame->goaway.last_stream_id);
    }
    return 0;
}

static int on_stream_close_cb(nghttp2_session *ng, int32_t stream_id, uint32_t error_code,
                              void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call = nghttp2_session_get_stream_user_data(ng, stream_id);
    if (call == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
    mg_call_detach(call, error_code == NGHTTP2_CANCEL ? "cancelled by the client"
                                                      : "stream reset before the call finished");
    if (conn->nstreams == 0 && conn->timer) {
        struct timeval tv = {(time_t)conn->gw->cfg->idle_timeout, 0};
        evtimer_add(conn->timer, &tv);
    }
    return 0;
}

/* ------------------------------------------------------------------ connections */

static int conn_session_new(mg_conn *conn)
{
    const mg_config *cfg = conn->gw->cfg;
    nghttp2_session_callbacks *cbs;
    nghttp2_option *opt;
    int rv;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, (uint32_t)cfg->max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)cfg->stream_window_bytes},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)cfg->max_header_list_bytes},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };

    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return -1;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers_cb);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close_cb);
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        return -1;
    }
    /* Flood limits, set explicitly rather than left to the library's defaults. */
    nghttp2_option_set_max_continuations(opt, (size_t)cfg->max_continuations);
    nghttp2_option_set_stream_reset_rate_limit(opt, cfg->reset_burst, cfg->reset_rate);
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    rv = nghttp2_session_server_new2(&conn->ng, cbs, conn, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0)
        return -1;
    if (nghttp2_submit_settings(conn->ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) != 0)
        return -1;
    if (nghttp2_session_set_local_window_size(conn->ng, NGHTTP2_FLAG_NONE, 0,
                                              (int32_t)cfg->conn_window_bytes) != 0)
        return -1;
    if (conn->gw->core->drain_phase >= 1)
        nghttp2_submit_shutdown_notice(conn->ng);
    return 0;
}

/* Closes the connection when nghttp2 has nothing left to read or write and the output drained.
 * Returns 1 when the connection was freed. */
static int conn_maybe_close(mg_conn *conn)
{
    if (nghttp2_session_want_read(conn->ng) || nghttp2_session_want_write(conn->ng))
        return 0;
    if (evbuffer_get_length(bufferevent_get_output(conn->bev)) > 0)
        return 0;
    mg_conn_free(conn);
    return 1;
}

int mg_conn_send(mg_conn *conn)
{
    int rv;
    if (conn->ng == NULL)
        return 0;
    conn->in_send = 1;
    do { /* stopped at the output cap, and all of it went straight to the socket: go on */
        conn->send_capped = 0;
        rv = nghttp2_session_send(conn->ng);
    } while (mg_bev_flush(conn->bev, conn->stage) && rv == 0 && conn->send_capped);
    conn->in_send = 0;
    if (rv != 0) {
        mg_warn("conn_error", "peer=%s kind=%s error=\"%s\"", conn->peer,
                mg_conn_kind_names[conn->kind], nghttp2_strerror(rv));
        mg_conn_free(conn);
        return -1;
    }
    return conn_maybe_close(conn) ? -1 : 0;
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_conn_send(arg);
}

void mg_conn_schedule_flush(mg_conn *conn)
{
    if (conn && conn->flush_ev && !event_pending(conn->flush_ev, EV_TIMEOUT, NULL))
        event_active(conn->flush_ev, EV_TIMEOUT, 0);
}

/* Stops or resumes reading while the peer is not reading what we already wrote. */
static void conn_set_reading(mg_conn *conn, int on)
{
    conn->read_paused = !on;
    if (conn->read_ev == NULL) {
        if (on)
            bufferevent_enable(conn->bev, EV_READ);
        else
            bufferevent_disable(conn->bev, EV_READ);
    } else if (on) {
        event_add(conn->read_ev, NULL);
    } else {
        event_del(conn->read_ev);
    }
}

/* Hands `len` received bytes to nghttp2 and sends what they produced. Returns -1 when the
 * connection was closed (and freed). */
static int conn_feed(mg_conn *conn, const uint8_t *data, size_t len)
{
    ssize_t r = nghttp2_session_mem_recv(conn->ng, data, len);
    if (r < 0) {
        conn->gw->core->stats.protocol_errors++;
        mg_info("conn_protocol_error", "peer=%s kind=%s error=\"%s\"", conn->peer,
                mg_conn_kind_names[conn->kind], nghttp2_strerror((int)r));
        /* nghttp2 queued a GOAWAY where it could; send it, then close. */
        nghttp2_session_terminate_session(conn->ng, NGHTTP2_PROTOCOL_ERROR);
        mg_conn_send(conn);
        return -1;
    }
    return mg_conn_send(conn);
}

static void conn_check_output(mg_conn *conn)
{
    if (evbuffer_get_length(bufferevent_get_output(conn->bev)) >=
        conn->gw->cfg->max_conn_output_bytes)
        conn_set_reading(conn, 0);
}

/* TLS: the bufferevent decrypted what arrived. */
static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    mg_conn *conn = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    if (conn->ng == NULL)
        return;
    conn->gw->core->conn_reads++;
    while (evbuffer_get_length(in) > 0) {
        size_t len = evbuffer_get_contiguous_space(in);
        uint8_t *data = evbuffer_pullup(in, (ssize_t)len);
        if (conn_feed(conn, data, len) < 0)
            return; /* conn is gone, and the bufferevent with it */
        evbuffer_drain(in, len);
    }
    conn_check_output(conn);
}

/* h2c and the Unix socket: the socket is read here, straight into nghttp2, rather than through
 * the bufferevent's input buffer (which asks the kernel how much is waiting before each read and
 * runs the callback on a later pass of the loop). At most four reads per wake-up, so one busy
 * connection does not hold the loop. */
static void conn_plain_read_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_conn *conn = arg;
    uint8_t buf[16384];

    for (int i = 0; i < 4; i++) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0) { /* the peer closed, or the socket failed: as the bufferevent would report */
            if (n < 0)
                mg_debug("conn_read_error", "peer=%s kind=%s error=\"%s\"", conn->peer,
                         mg_conn_kind_names[conn->kind], strerror(errno));
            mg_conn_free(conn);
            return;
        }
        conn->gw->core->conn_reads++;
        if (conn_feed(conn, buf, (size_t)n) < 0)
            return;
        conn_check_output(conn);
        if (conn->read_paused || (size_t)n < sizeof(buf))
            return;
    }
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    mg_conn *conn = arg;
    if (conn->ng == NULL)
        return;
    if (conn->read_paused &&
        evbuffer_get_length(bufferevent_get_output(bev)) < conn->gw->cfg->max_conn_output_bytes / 2)
        conn_set_reading(conn, 1);
    mg_conn_send(conn);
}

static void conn_event_cb(struct bufferevent *bev, short events, void *arg)
{
    mg_conn *conn = arg;
    int sock_err = EVUTIL_SOCKET_ERROR(); /* before anything else can change errno */
    if (events & BEV_EVENT_CONNECTED) {
        const unsigned char *alpn = NULL;
        unsigned alpnlen = 0;
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        if (ssl) {
            SSL_get0_alpn_selected(ssl, &alpn, &alpnlen);
            mg_tls_identity(ssl, &conn->id);
        }
        if (alpn == NULL || alpnlen != 2 || memcmp(alpn, "h2", 2) != 0) {
            mg_info("conn_rejected", "peer=%s reason=\"ALPN h2 not negotiated\"", conn->peer);
            mg_conn_free(conn);
            return;
        }
        if (conn_session_new(conn) != 0) {
            mg_conn_free(conn);
            return;
        }
        mg_conn_send(conn);
        return;
    }
    if (events & BEV_EVENT_TIMEOUT) {
        conn->gw->core->stats.write_timeouts++;
        mg_info("conn_timeout", "peer=%s kind=%s reason=write unsent=%zu", conn->peer,
                mg_conn_kind_names[conn->kind], evbuffer_get_length(bufferevent_get_output(bev)));
    }
    if (events & BEV_EVENT_ERROR && conn->kind == CONN_TLS && conn->ng == NULL) {
        char buf[256];
        conn->gw->core->stats.tls_handshake_errors++;
        mg_bev_error_reason(bufferevent_get_openssl_error(bev), sock_err, buf, sizeof(buf));
        mg_info("tls_handshake_failed", "peer=%s error=\"%s\"", conn->peer, buf);
    }
    mg_conn_free(conn);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_conn *conn = arg;
    if (conn->ng == NULL || !conn->got_frame) {
        mg_info("conn_timeout", "peer=%s kind=%s reason=handshake", conn->peer,
                mg_conn_kind_names[conn->kind]);
        mg_conn_free(conn);
        return;
    }
    if (conn->nstreams > 0 || !mg_list_empty(&conn->binds))
        return; /* busy, or something lives as long as it (an agent) */
    mg_debug("conn_idle", "peer=%s kind=%s", conn->peer, mg_conn_kind_names[conn->kind]);
    nghttp2_submit_goaway(conn->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(conn->ng), NGHTTP2_NO_ERROR,
                          (const uint8_t *)"idle", 4);
    mg_conn_send(conn);
}

void mg_conn_free(mg_conn *conn)
{
    mg_gateway *gw = conn->gw;
    while (conn->calls) {
        mg_call *call = conn->calls;
        if (conn->ng)
            nghttp2_session_set_stream_user_data(conn->ng, call->stream_id, NULL);
        mg_call_detach(call, "connection closed before the call finished");
    }
    while (!mg_list_empty(&conn->binds)) { /* agents and the like end with it */
        mg_conn_bind *b = mg_container_of(mg_list_first(&conn->binds), mg_conn_bind, node);
        mg_list_remove(&b->node);
        b->closed(b);
    }
    if (conn->ng)
        nghttp2_session_del(conn->ng);
    if (conn->timer)
        event_free(conn->timer);
    if (conn->flush_ev)
        event_free(conn->flush_ev);
    if (conn->read_ev)
        event_free(conn->read_ev); /* before the bufferevent closes the socket */
    if (conn->stage)
        evbuffer_free(conn->stage);
    if (conn->bev) {
        SSL *ssl = bufferevent_openssl_get_ssl(conn->bev);
        if (ssl)
            SSL_set_shutdown(ssl, SSL_RECEIVED_SHUTDOWN);
        bufferevent_free(conn->bev);
    }
    if (mg_list_linked(&conn->link))
        mg_list_remove(&conn->link);
    gw->core->stats.conns_active--;
    mg_debug("conn_closed", "peer=%s kind=%s", conn->peer, mg_conn_kind_names[conn->kind]);
    free(conn);
    mg_accept_resume(gw); /* a descriptor is free: listeners paused for want of one go on */
    mg_gateway_check_drained(gw);
}

int mg_unix_peer(int fd, uint32_t *uid, mg_proc *proc)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return -1;
    *uid = (uint32_t)cred.uid;
    proc->pid = cred.pid > 0 ? (int32_t)cred.pid : 0;
    proc->start = proc->pid ? mg_proc_start_time(proc->pid) : 0;
    return 0;
}

static void peer_name(mg_conn *conn, char *dst, size_t cap, evutil_socket_t fd,
                      const struct sockaddr *sa, conn_kind kind)
{
    if (kind == CONN_UNIX) {
        if (mg_unix_peer(fd, &conn->uid, &conn->proc) == 0) {
            snprintf(dst, cap, "uid:%u pid:%d", (unsigned)conn->uid, (int)conn->proc.pid);
            conn->has_uid = 1;
        } else
            snprintf(dst, cap, "unix");
        return;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        port = ntohs(s4->sin_port);
        snprintf(dst, cap, "%s:%d", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        port = ntohs(s6->sin6_port);
        snprintf(dst, cap, "[%s]:%d", host, port);
    } else {
        snprintf(dst, cap, "unknown");
    }
}

static void accept_cb(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    mg_listener *l = arg;
    mg_gateway *gw = l->gw;
    mg_conn *conn;
    struct timeval tv = {(time_t)gw->cfg->handshake_timeout, 0};
    int one = 1;

    mg_accept_ok(gw);
    if (gw->state == MG_STATE_DRAINING) {
        evutil_closesocket(fd);
        return;
    }
    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        evutil_closesocket(fd);
        return;
    }
    conn->gw = gw;
    mg_list_init(&conn->binds);
    conn->serial = ++gw->core->conns_opened;
    conn->kind = l->kind;
    peer_name(conn, conn->peer, sizeof(conn->peer), fd, sa, l->kind);
    if (l->kind != CONN_UNIX)
        setsockopt(fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
    if (l->kind == CONN_TLS) {
        SSL *ssl = SSL_new(gw->core->ssl_ctx);
        if (ssl == NULL) {
            evutil_closesocket(fd);
            free(conn);
            return;
        }
        conn->bev = bufferevent_openssl_socket_new(gw->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                   BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (conn->bev)
            bufferevent_openssl_set_allow_dirty_shutdown(conn->bev, 1);
        else
            SSL_free(ssl);
    } else {
        conn->bev =
            bufferevent_socket_new(gw->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        conn->stage = evbuffer_new();
        conn->read_ev = event_new(gw->base, fd, EV_READ | EV_PERSIST, conn_plain_read_cb, conn);
    }
    conn->timer = evtimer_new(gw->base, conn_timer_cb, conn);
    conn->flush_ev = event_new(gw->base, -1, 0, flush_cb, conn);
    mg_list_push_front(&gw->core->conns, &conn->link);
    gw->core->stats.conns_active++;
    gw->core->stats.conns_total[l->kind]++;
    if (conn->bev == NULL || conn->timer == NULL || conn->flush_ev == NULL ||
        (l->kind != CONN_TLS && (conn->stage == NULL || conn->read_ev == NULL))) {
        if (conn->bev == NULL)
            evutil_closesocket(fd);
        mg_conn_free(conn);
        return;
    }
    evtimer_add(conn->timer, &tv);
    {
        /* Armed by libevent only while output is waiting: no progress for this long ends it. */
        struct timeval wt = {(time_t)gw->cfg->write_timeout, 0};
        bufferevent_set_timeouts(conn->bev, NULL, &wt);
    }
    bufferevent_setcb(conn->bev, conn_read_cb, conn_write_cb, conn_event_cb, conn);
    bufferevent_setwatermark(conn->bev, EV_WRITE, 0, 0);
    if (conn->read_ev) {
        bufferevent_enable(conn->bev, EV_WRITE);
        event_add(conn->read_ev, NULL);
    } else {
        bufferevent_enable(conn->bev, EV_READ | EV_WRITE);
    }
    mg_debug("conn_open", "peer=%s kind=%s", conn->peer, mg_conn_kind_names[conn->kind]);
    if (l->kind != CONN_TLS) {
        if (conn_session_new(conn) != 0) {
            mg_conn_free(conn);
            return;
        }
        mg_conn_send(conn);
    }
}

/* ------------------------------------------------------------------ listeners */

static void listener_error_cb(struct evconnlistener *lev, void *arg);

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return 1;
        if (IN6_IS_ADDR_V4MAPPED(a))
            return a->s6_addr[12] == 127;
    }
    return 0;
}

static int add_listener(mg_gateway *gw, conn_kind kind, const char *addr)
{
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    mg_listener *l;

    memset(&ss, 0, sizeof(ss));
    if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&ss, &sslen) != 0) {
        mg_error("listen_failed", "addr=%s reason=\"not a host:port ([v6]:port for IPv6)\"", addr);
        return MG_ERR_INVALID;
    }
    if (kind == CONN_H2C && !gw->cfg->allow_h2c_any && !is_loopback((struct sockaddr *)&ss)) {
        mg_error("listen_failed",
                 "addr=%s reason=\"plaintext h2c only on loopback unless --allow-h2c-any\"", addr);
        return MG_ERR_PERMISSION;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return MG_ERR_NOMEM;
    l->gw = gw;
    l->kind = kind;
    snprintf(l->addr, sizeof(l->addr), "%s", addr);
    l->lev = evconnlistener_new_bind(
        gw->base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, (struct sockaddr *)&ss, sslen);
    if (l->lev == NULL) {
        mg_error("listen_failed", "addr=%s kind=%s errno=%d reason=\"%s\"", addr,
                 mg_conn_kind_names[kind], errno, strerror(errno));
        free(l);
        return MG_ERR_SYSTEM;
    }
    l->next = gw->core->listeners;
    gw->core->listeners = l;
    evconnlistener_set_error_cb(l->lev, listener_error_cb);
    mg_info("listen", "addr=%s kind=%s", addr, mg_conn_kind_names[kind]);
    return 0;
}

int mg_unix_path_clear(const char *path, const char *what)
{
    struct stat st;
    /* Remove a stale socket of an earlier run, never any other kind of file. */
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            mg_error("listen_failed", "%s=%s reason=\"exists and is not a socket\"", what, path);
            return MG_ERR_EXISTS;
        }
        unlink(path);
    }
    return 0;
}

int mg_unix_path_own(mg_gateway *gw, const char *path, const char *what)
{
    /* The group first: until the mode is set the socket has the umask's bits. */
    if (gw->cfg->unix_socket_group[0]) {
        unsigned gid;
        const char *why = NULL;
        if (mg_config_group(gw->cfg->unix_socket_group, &gid) != 0)
            why = "no such group";
        else if (chown(path, (uid_t)-1, (gid_t)gid) != 0)
            why = strerror(errno);
        if (why) {
            mg_error("listen_failed", "%s=%s unix_socket_group=%s reason=\"%s\"", what, path,
                     gw->cfg->unix_socket_group, why);
            return MG_ERR_SYSTEM;
        }
    }
    if (chmod(path, (mode_t)gw->cfg->unix_socket_mode) != 0)
        mg_warn("unix_socket_mode", "path=%s error=\"%s\"", path, strerror(errno));
    return 0;
}

int mg_listener_add_unix(mg_gateway *gw, const char *path)
{
    struct sockaddr_un sun;
    mg_listener *l;
    char dir[sizeof(sun.sun_path)];
    char *slash;

    if (strlen(path) >= sizeof(sun.sun_path)) {
        mg_error("listen_failed", "unix=%s reason=\"path longer than %zu bytes\"", path,
                 sizeof(sun.sun_path) - 1);
        return MG_ERR_INVALID;
    }
    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            mg_error("listen_failed", "unix=%s reason=\"mkdir %s: %s\"", path, dir,
                     strerror(errno));
            return MG_ERR_SYSTEM;
        }
    }
    if (mg_unix_path_clear(path, "unix") != 0)
        return MG_ERR_EXISTS;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path) + 1);
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return MG_ERR_NOMEM;
    l->gw = gw;
    l->kind = CONN_UNIX;
    snprintf(l->addr, sizeof(l->addr), "unix:%s", path);
    l->unix_path = strdup(path);
    l->lev = evconnlistener_new_bind(gw->base, accept_cb, l,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 1024,
                                     (struct sockaddr *)&sun, sizeof(sun));
    if (l->lev == NULL || l->unix_path == NULL) {
        mg_error("listen_failed", "unix=%s errno=%d reason=\"%s\"", path, errno, strerror(errno));
        if (l->lev)
            evconnlistener_free(l->lev);
        free(l->unix_path);
        free(l);
        return MG_ERR_SYSTEM;
    }
    if (mg_unix_path_own(gw, path, "unix") != 0) {
        evconnlistener_free(l->lev);
        unlink(path);
        free(l->unix_path);
        free(l);
        return MG_ERR_SYSTEM;
    }
    evconnlistener_set_error_cb(l->lev, listener_error_cb);
    l->next = gw->core->listeners;
    gw->core->listeners = l;
    mg_info("listen", "addr=unix:%s kind=unix", path);
    return 0;
}

/* ------------------------------------------------------------------ accepting without descriptors
 */

static void listeners_enable(mg_gateway *gw, int on)
{
    for (mg_listener *l = gw->core->listeners; l; l = l->next) {
        if (on)
            evconnlistener_enable(l->lev);
        else
            evconnlistener_disable(l->lev);
    }
    for (size_t i = 0; i < gw->core->n_others; i++) {
        if (on)
            evconnlistener_enable(gw->core->others[i]);
        else
            evconnlistener_disable(gw->core->others[i]);
    }
    mg_fdsock_accepting(gw, on);
}

int mg_gateway_add_listener(mg_gateway *gw, struct evconnlistener *lev)
{
    if (gw->core->n_others == sizeof(gw->core->others) / sizeof(gw->core->others[0]))
        return MG_ERR_FULL;
    gw->core->others[gw->core->n_others++] = lev;
    return 0;
}

void mg_gateway_del_listener(mg_gateway *gw, struct evconnlistener *lev)
{
    for (size_t i = 0; i < gw->core->n_others; i++) {
        if (gw->core->others[i] == lev) {
            gw->core->others[i] = gw->core->others[--gw->core->n_others];
            return;
        }
    }
}

static void accept_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_accept_resume(arg);
}

void mg_accept_resume(mg_gateway *gw)
{
    if (!gw->core->accept_paused)
        return;
    gw->core->accept_paused = 0;
    if (gw->core->accept_timer)
        evtimer_del(gw->core->accept_timer);
    listeners_enable(gw, 1); /* the next accept tells whether a descriptor is free now */
}

void mg_accept_ok(mg_gateway *gw)
{
    if (!gw->core->accept_episode)
        return;
    gw->core->accept_episode = 0;
    if (gw->core->accept_logged) /* the episode's pause was logged: so is its end */
        mg_info("accept_resumed", "paused_ms=%.0f",
                (double)(mg_now_mono_ns() - gw->core->accept_pause_ns) / 1e6);
}

void mg_accept_failed(mg_gateway *gw, const char *where, int err)
{
    static const struct timeval retry = {0, 100 * 1000};
    if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
        uint64_t now = mg_now_mono_ns();
        if (now - gw->core->accept_warn_ns > 1000000000ULL) { /* at most a line a second */
            gw->core->accept_warn_ns = now;
            mg_warn("accept_failed", "listener=%s error=\"%s\"", where, strerror(err));
        }
        return;
    }
    if (!gw->core->accept_episode) {
        /* Episodes follow each other as fast as descriptors free and are taken again: each is
         * counted, a line logged a second at most. */
        uint64_t now = mg_now_mono_ns();
        gw->core->accept_episode = 1;
        gw->core->accept_pause_ns = now;
        gw->core->stats.accept_pauses++;
        gw->core->accept_logged = now - gw->core->accept_warn_ns >= 1000000000ULL;
        if (gw->core->accept_logged) {
            gw->core->accept_warn_ns = now;
            mg_warn("accept_paused",
                    "listener=%s error=\"%s\" open_files_limit=%llu open_connections=%llu "
                    "note=\"accepting resumes when a descriptor frees\"",
                    where, strerror(err), (unsigned long long)gw->open_files_limit,
                    (unsigned long long)gw->core->stats.conns_active);
        }
    }
    if (gw->core->accept_paused)
        return;
    gw->core->accept_paused = 1;
    listeners_enable(gw, 0);
    if (gw->core->accept_timer == NULL)
        gw->core->accept_timer = evtimer_new(gw->base, accept_timer_cb, gw);
    if (gw->core->accept_timer)
        evtimer_add(gw->core->accept_timer, &retry);
}

static void listener_error_cb(struct evconnlistener *lev, void *arg)
{
    mg_listener *l = arg;
    mg_accept_failed(l->gw, l->addr, EVUTIL_SOCKET_ERROR());
}

void mg_listeners_free(mg_gateway *gw)
{
    while (gw->core->listeners) {
        mg_listener *l = gw->core->listeners;
        gw->core->listeners = l->next;
        evconnlistener_free(l->lev);
        if (l->unix_path) {
            unlink(l->unix_path);
            free(l->unix_path);
        }
        free(l);
    }
}

/* Adds a listener of `kind` for each comma-separated host:port of list. */
int mg_listeners_add(mg_gateway *gw, conn_kind kind, const char *list)
{
    char buf[1024], *save = NULL, *tok;
    int rc;
    snprintf(buf, sizeof(buf), "%s", list);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (*tok == '\0')
            continue;
        rc = add_listener(gw, kind, tok);
        if (rc != 0)
            return rc;
    }
    return 0;
}
