/*
 * mg_client: see mg_client.h. One nghttp2 client session per mg_client, on one bufferevent.
 * Calls are submitted at once; nghttp2 holds the frames until the connection is up. Each call
 * has a bounded deframer for responses and an evbuffer of request bytes read by the data source.
 */
#include "mg_client.h"
#include "mg_client_int.h"
#include "mg_bev.h"
#include "mg_bev_err.h"
#include "mg_str.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <protobuf-c/protobuf-c.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#define MAX_HDRS 16

struct mg_rpc {
    mg_client *c;
    int32_t stream_id;
    const mg_rpc_handlers *h;
    void *arg;
    struct evbuffer *out;
    int send_closed;
    int deferred;
    int closed;
    int http_status;
    int grpc_status; /* -1 until seen */
    char *grpc_message;
    nghttp2_rcbuf *hdr_names[MAX_HDRS]; /* nghttp2's own buffers, referenced, not copied */
    nghttp2_rcbuf *hdr_values[MAX_HDRS];
    int n_hdrs;
    mg_deframer deframer;
    int deframe_error;
    struct event *deadline;
    uint64_t timeout_ms;
    struct mg_rpc *next, *prev;
};

struct mg_client {
    struct event_base *base;
    struct bufferevent *bev;
    struct evbuffer *stage; /* output written straight to the socket (h2c, unix); mg_bev.h */
    int send_capped;        /* send_cb stopped at its output cap in this send */
    nghttp2_session *ng;
    SSL_CTX *ssl_ctx;
    char target[256];
    char authority[256];
    char bearer[1100]; /* "Bearer TOKEN" from mg_client_options.token, or "" */
    int tls;
    int connected;
    int failed;
    char fail_msg[600];
    uint32_t max_message;
    mg_rpc *rpcs;
    struct event *flush_ev;
    struct event *read_ev; /* h2c and unix once connected: the socket read directly */
    uint32_t busy_poll_us;
    void (*on_broken)(void *arg, const char *why);
    void *broken_arg;
    /* Depth of the library's event callbacks running now. A user callback inside one may call
     * mg_client_del(): the client is then only marked and freed as the outermost returns. */
    int in_cb;
    int doomed;
    int owns_base; /* made by mg_client_open: its base goes with it */
    mg_keep *keep; /* made by mg_client_open: what it makes again after a restart */
};

static void client_fail(mg_client *c, const char *why);
static void client_flush(mg_client *c);
static void client_free(mg_client *c);
static int client_connect(mg_client *c, const mg_client_options *o, char *err, size_t errcap);

static void enter(mg_client *c)
{
    c->in_cb++;
}

static void leave(mg_client *c)
{
    if (--c->in_cb == 0 && c->doomed)
        client_free(c);
}

/* ------------------------------------------------------------------ calls */

static void rpc_free(mg_rpc *rpc)
{
    if (rpc->deadline)
        event_free(rpc->deadline);
    evbuffer_free(rpc->out);
    mg_deframer_free(&rpc->deframer);
    free(rpc->grpc_message);
    for (int i = 0; i < rpc->n_hdrs; i++) {
        nghttp2_rcbuf_decref(rpc->hdr_names[i]);
        nghttp2_rcbuf_decref(rpc->hdr_values[i]);
    }
    free(rpc);
}

static void rpc_unlink(mg_rpc *rpc)
{
    mg_client *c = rpc->c;
    if (rpc->prev)
        rpc->prev->next = rpc->next;
    else if (c->rpcs == rpc)
        c->rpcs = rpc->next;
    if (rpc->next)
        rpc->next->prev = rpc->prev;
    rpc->next = rpc->prev = NULL;
}

/* Reports the final status once and frees the call. */
static void rpc_close(mg_rpc *rpc, int status, const char *message)
{
    if (rpc->closed)
        return;
    rpc->closed = 1;
    rpc_unlink(rpc);
    if (rpc->stream_id > 0 && rpc->c->ng)
        nghttp2_session_set_stream_user_data(rpc->c->ng, rpc->stream_id, NULL);
    if (rpc->h->on_close)
        rpc->h->on_close(rpc, status, message ? message : "", rpc->arg);
    rpc_free(rpc);
}

static ssize_t rpc_read_cb(nghttp2_session *ng, int32_t stream_id, uint8_t *buf, size_t length,
                           uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    mg_rpc *rpc = source->ptr;
    int n = evbuffer_remove(rpc->out, buf, length);
    if (n > 0)
        return n;
    if (rpc->send_closed) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
    }
    rpc->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_rpc *rpc = arg;
    mg_client *c = rpc->c;
    char msg[96];
    enter(c);
    if (rpc->stream_id > 0 && c->ng)
        nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, rpc->stream_id, NGHTTP2_CANCEL);
    snprintf(msg, sizeof(msg), "deadline of %llu ms exceeded", (unsigned long long)rpc->timeout_ms);
    rpc_close(rpc, MG_GRPC_DEADLINE_EXCEEDED, msg);
    if (!c->doomed)
        client_flush(c);
    leave(c);
}

mg_rpc *mg_rpc_start(mg_client *c, const char *path, const mg_metadata *md, size_t n_md,
                     uint64_t timeout_ms, const mg_rpc_handlers *h, void *arg)
{
    nghttp2_nv nva[8 + 32];
    size_t n = 0;
    char tbuf[16];
    mg_rpc *rpc;
    nghttp2_data_provider dp;

    if (c->failed || n_md > 32)
        return NULL;
    rpc = calloc(1, sizeof(*rpc));
    if (rpc == NULL)
        return NULL;
    rpc->out = evbuffer_new();
    if (rpc->out == NULL) {
        free(rpc);
        return NULL;
    }
    rpc->c = c;
    rpc->h = h;
    rpc->arg = arg;
    rpc->grpc_status = -1;
    rpc->timeout_ms = timeout_ms;
    mg_deframer_init(&rpc->deframer, c->max_message);

#define ADD(nm, val)                                                                    \
    nva[n++] = (nghttp2_nv){(uint8_t *)(nm), (uint8_t *)(val), strlen(nm), strlen(val), \
                            NGHTTP2_NV_FLAG_NONE}
    ADD(":method", "POST");
    ADD(":scheme", c->tls ? "https" : "http");
    ADD(":authority", c->authority);
    ADD(":path", path);
    if (timeout_ms) {
        mg_grpc_timeout_format(tbuf, timeout_ms < UINT64_MAX / 1000000u ? timeout_ms * 1000000u
                                                                        : UINT64_MAX);
        ADD("grpc-timeout", tbuf);
    }
    ADD("content-type", "application/grpc");
    ADD("te", "trailers");
    ADD("user-agent", "moongate-c/" MG_VERSION);
    if (c->bearer[0])
        nva[n++] = (nghttp2_nv){(uint8_t *)"authorization", (uint8_t *)c->bearer, 13,
                                strlen(c->bearer), NGHTTP2_NV_FLAG_NO_INDEX};
    for (size_t i = 0; i < n_md; i++)
        ADD(md[i].name, md[i].value);
#undef ADD
    dp.source.ptr = rpc;
    dp.read_callback = rpc_read_cb;
    rpc->stream_id = nghttp2_submit_request(c->ng, NULL, nva, n, &dp, rpc);
    if (rpc->stream_id < 0) {
        rpc_free(rpc);
        return NULL;
    }
    rpc->next = c->rpcs;
    if (c->rpcs)
        c->rpcs->prev = rpc;
    c->rpcs = rpc;
    if (timeout_ms) {
        struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
        rpc->deadline = evtimer_new(c->base, deadline_cb, rpc);
        if (rpc->deadline)
            evtimer_add(rpc->deadline, &tv);
    }
    client_flush(c);
    return rpc;
}

static void rpc_resume(mg_rpc *rpc)
{
    if (rpc->deferred) {
        rpc->deferred = 0;
        nghttp2_session_resume_data(rpc->c->ng, rpc->stream_id);
    }
    client_flush(rpc->c);
}

int mg_rpc_send(mg_rpc *rpc, const uint8_t *msg, size_t len)
{
    uint8_t prefix[MG_GRPC_PREFIX_LEN];
    if (rpc->closed || rpc->send_closed || len > UINT32_MAX)
        return -1;
    mg_grpc_prefix(prefix, (uint32_t)len);
    if (evbuffer_add(rpc->out, prefix, sizeof(prefix)) != 0 ||
        (len && evbuffer_add(rpc->out, msg, len) != 0))
        return -1;
    rpc_resume(rpc);
    return 0;
}

int mg_rpc_close_send(mg_rpc *rpc)
{
    if (rpc->closed || rpc->send_closed)
        return -1;
    rpc->send_closed = 1;
    rpc_resume(rpc);
    return 0;
}

void mg_rpc_cancel(mg_rpc *rpc)
{
    mg_client *c = rpc->c;
    if (rpc->closed)
        return;
    if (rpc->stream_id > 0 && c->ng)
        nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, rpc->stream_id, NGHTTP2_CANCEL);
    rpc_close(rpc, MG_GRPC_CANCELLED, "cancelled by the client");
    client_flush(c);
}

const char *mg_rpc_header(const mg_rpc *rpc, const char *name)
{
    size_t len = strlen(name);
    for (int i = 0; i < rpc->n_hdrs; i++) {
        nghttp2_vec n = nghttp2_rcbuf_get_buf(rpc->hdr_names[i]);
        if (n.len == len && memcmp(n.base, name, len) == 0) /* nghttp2 terminates values */
            return (const char *)nghttp2_rcbuf_get_buf(rpc->hdr_values[i]).base;
    }
    return NULL;
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static ssize_t send_cb(nghttp2_session *ng, const uint8_t *data, size_t length, int flags,
                       void *user_data)
{
    mg_client *c = user_data;
    if (!c->connected)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (mg_bev_pending(c->bev, c->stage) > 4 * 1024 * 1024) {
        c->send_capped = 1;
        return NGHTTP2_ERR_WOULDBLOCK;
    }
    if (mg_bev_add(c->bev, c->stage, data, length) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

static int on_header_cb(nghttp2_session *ng, const nghttp2_frame *frame, nghttp2_rcbuf *name_buf,
                        nghttp2_rcbuf *value_buf, uint8_t flags, void *user_data)
{
    mg_rpc *rpc = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    nghttp2_vec nv = nghttp2_rcbuf_get_buf(name_buf), vv = nghttp2_rcbuf_get_buf(value_buf);
    const uint8_t *name = nv.base, *value = vv.base;
    size_t namelen = nv.len, valuelen = vv.len;
    if (rpc == NULL || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        rpc->http_status = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            rpc->http_status = rpc->http_status * 10 + (value[i] - '0');
    } else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        char buf[8];
        size_t n = valuelen < sizeof(buf) - 1 ? valuelen : sizeof(buf) - 1;
        memcpy(buf, value, n);
        buf[n] = '\0';
        rpc->grpc_status = mg_grpc_code_parse(buf);
        if (rpc->grpc_status < 0)
            rpc->grpc_status = MG_GRPC_UNKNOWN;
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        free(rpc->grpc_message);
        rpc->grpc_message = malloc(valuelen + 1);
        if (rpc->grpc_message)
            mg_pct_decode(rpc->grpc_message, (const char *)value, valuelen);
    }
    if (rpc->n_hdrs < MAX_HDRS) {
        nghttp2_rcbuf_incref(name_buf);
        nghttp2_rcbuf_incref(value_buf);
        rpc->hdr_names[rpc->n_hdrs] = name_buf;
        rpc->hdr_values[rpc->n_hdrs++] = value_buf;
    }
    return 0;
}

static int on_message(void *arg, const uint8_t *msg, size_t len)
{
    mg_rpc *rpc = arg;
    if (rpc->h->on_message)
        rpc->h->on_message(rpc, msg, len, rpc->arg);
    return rpc->closed ? 1 : 0;
}

static int on_data_chunk_recv_cb(nghttp2_session *ng, uint8_t flags, int32_t stream_id,
                                 const uint8_t *data, size_t len, void *user_data)
{
    mg_rpc *rpc = nghttp2_session_get_stream_user_data(ng, stream_id);
    int rv;
    if (rpc == NULL || rpc->deframe_error)
        return 0;
    rv = mg_deframer_feed(&rpc->deframer, data, len, on_message, rpc);
    if (rv < 0) {
        char msg[160];
        rpc->deframe_error = 1;
        if (rv == MG_DEFRAME_TOO_LARGE)
            snprintf(msg, sizeof(msg), "response message of %u bytes exceeds the limit of %u",
                     rpc->deframer.declared, rpc->deframer.max_message);
        else
            snprintf(msg, sizeof(msg), "malformed response framing (%d)", rv);
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
        rpc_close(rpc, rv == MG_DEFRAME_TOO_LARGE ? MG_GRPC_RESOURCE_EXHAUSTED : MG_GRPC_INTERNAL,
                  msg);
    }
    return 0;
}

/* gRPC's HTTP-to-status mapping, for responses without grpc-status. */
static int http_to_grpc(int http)
{
    switch (http) {
    case 400:
        return MG_GRPC_INTERNAL;
    case 401:
        return MG_GRPC_UNAUTHENTICATED;
    case 403:
        return MG_GRPC_PERMISSION_DENIED;
    case 404:
        return MG_GRPC_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return MG_GRPC_UNAVAILABLE;
    default:
        return MG_GRPC_UNKNOWN;
    }
}

static int on_stream_close_cb(nghttp2_session *ng, int32_t stream_id, uint32_t error_code,
                              void *user_data)
{
    mg_rpc *rpc = nghttp2_session_get_stream_user_data(ng, stream_id);
    char msg[160];
    if (rpc == NULL)
        return 0;
    if (rpc->grpc_status >= 0) {
        if (rpc->grpc_status == MG_GRPC_OK && mg_deframer_partial(&rpc->deframer))
            rpc_close(rpc, MG_GRPC_INTERNAL, "response ended inside a message");
        else
            rpc_close(rpc, rpc->grpc_status, rpc->grpc_message);
    } else if (error_code != NGHTTP2_NO_ERROR) {
        snprintf(msg, sizeof(msg), "stream reset by the server: %s",
                 nghttp2_http2_strerror(error_code));
        rpc_close(rpc,
                  error_code == NGHTTP2_REFUSED_STREAM ? MG_GRPC_UNAVAILABLE
                  : error_code == NGHTTP2_CANCEL       ? MG_GRPC_CANCELLED
                                                       : MG_GRPC_INTERNAL,
                  msg);
    } else {
        snprintf(msg, sizeof(msg), "response without grpc-status (HTTP %d)", rpc->http_status);
        rpc_close(rpc, http_to_grpc(rpc->http_status), msg);
    }
    return 0;
}

/* ------------------------------------------------------------------ connection */

static void client_send(mg_client *c)
{
    int rv;
    if (c->ng == NULL || !c->connected || c->failed)
        return;
    do { /* stopped at the output cap, and all of it went straight to the socket: go on */
        c->send_capped = 0;
        rv = nghttp2_session_send(c->ng);
    } while (mg_bev_flush(c->bev, c->stage) && rv == 0 && c->send_capped);
    if (rv != 0) {
        char why[128];
        snprintf(why, sizeof(why), "HTTP/2: %s", nghttp2_strerror(rv));
        client_fail(c, why);
    }
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_client *c = arg;
    enter(c);
    client_send(c);
    leave(c);
}

static void client_flush(mg_client *c)
{
    if (c->flush_ev && !event_pending(c->flush_ev, EV_TIMEOUT, NULL))
        event_active(c->flush_ev, EV_TIMEOUT, 0);
}

/* The connection is unusable: every open call ends with UNAVAILABLE. */
static void client_fail(mg_client *c, const char *why)
{
    if (c->read_ev)
        event_del(c->read_ev); /* a closed socket stays readable */
    int first = !c->failed;
    if (first) {
        c->failed = 1;
        snprintf(c->fail_msg, sizeof(c->fail_msg), "%s: %s", c->target, why);
    }
    while (c->rpcs)
        rpc_close(c->rpcs, MG_GRPC_UNAVAILABLE, c->fail_msg);
    if (first && !c->doomed && c->on_broken)
        c->on_broken(c->broken_arg, c->fail_msg);
}

static int feed(mg_client *c, const uint8_t *data, size_t len)
{
    ssize_t r = nghttp2_session_mem_recv(c->ng, data, len);
    if (r < 0) {
        char why[128];
        snprintf(why, sizeof(why), "HTTP/2 protocol error: %s", nghttp2_strerror((int)r));
        client_fail(c, why);
        return -1;
    }
    return 0;
}

static void read_body(struct bufferevent *bev, mg_client *c)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) > 0 && !c->failed) {
        size_t len = evbuffer_get_contiguous_space(in);
        if (feed(c, evbuffer_pullup(in, (ssize_t)len), len) != 0)
            return;
        evbuffer_drain(in, len);
    }
    client_send(c);
}

/* h2c and unix: reads the socket straight into nghttp2 (no input buffer, no FIONREAD, no later
 * loop pass), at most four times. Returns 1 when something was read. */
static int plain_read(mg_client *c)
{
    uint8_t buf[16384];
    int got = 0;
    for (int i = 0; i < 4 && !c->failed; i++) {
        ssize_t n = recv(bufferevent_getfd(c->bev), buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0) {
            client_fail(c, n == 0 ? "connection closed by the server" : strerror(errno));
            break;
        }
        got = 1;
        if (feed(c, buf, (size_t)n) != 0 || (size_t)n < sizeof(buf))
            break;
    }
    if (got)
        client_send(c);
    return got;
}

static void plain_read_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_client *c = arg;
    enter(c);
    plain_read(c);
    leave(c);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    mg_client *c = arg;
    enter(c);
    read_body(bev, c);
    leave(c);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
    mg_client *c = arg;
    enter(c);
    client_send(c);
    leave(c);
}

static void event_body(struct bufferevent *bev, short events, mg_client *c, int sock_err)
{
    if (events & BEV_EVENT_CONNECTED) {
        if (c->tls) {
            const unsigned char *alpn = NULL;
            unsigned alpnlen = 0;
            SSL *ssl = bufferevent_openssl_get_ssl(bev);
            SSL_get0_alpn_selected(ssl, &alpn, &alpnlen);
            if (alpn == NULL || alpnlen != 2 || memcmp(alpn, "h2", 2) != 0) {
                client_fail(c, "server did not negotiate ALPN h2");
                return;
            }
        }
        {
            int one = 1;
            evutil_socket_t fd = bufferevent_getfd(bev);
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        c->connected = 1;
        bufferevent_set_timeouts(bev, NULL, NULL);
        if (c->stage) { /* plain socket: read it directly from now on */
            c->read_ev =
                event_new(c->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST, plain_read_cb, c);
            if (c->read_ev == NULL) {
                client_fail(c, "out of memory");
                return;
            }
            bufferevent_disable(bev, EV_READ);
            event_add(c->read_ev, NULL);
            read_body(bev, c); /* anything the bufferevent read before */
            return;
        }
        client_send(c);
        return;
    }
    {
        char why[256];
        unsigned long e = c->tls ? bufferevent_get_openssl_error(bev) : 0;
        if (events & BEV_EVENT_TIMEOUT)
            snprintf(why, sizeof(why), "connect timed out");
        else if (e == 0 && events & BEV_EVENT_EOF)
            snprintf(why, sizeof(why), "connection closed by the server");
        else /* a failed TLS handshake is reported as EOF too */
            mg_bev_error_reason(e, sock_err, why, sizeof(why));
        if (c->tls && bufferevent_openssl_get_ssl(bev) &&
            SSL_get_verify_result(bufferevent_openssl_get_ssl(bev)) != X509_V_OK) {
            size_t n = strlen(why); /* which check failed: the name, the chain, the dates */
            long v = SSL_get_verify_result(bufferevent_openssl_get_ssl(bev));
            snprintf(why + n, sizeof(why) - n, " (%s)", X509_verify_cert_error_string(v));
        }
        client_fail(c, why);
    }
}

static void event_cb(struct bufferevent *bev, short events, void *arg)
{
    mg_client *c = arg;
    int sock_err = EVUTIL_SOCKET_ERROR(); /* before anything else can change errno */
    enter(c);
    event_body(bev, events, c, sock_err);
    leave(c);
}

static SSL_CTX *client_ssl_ctx(const mg_client_options *o, char *err, size_t errcap)
{
    static const unsigned char alpn[] = "\x02h2";
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    if (!o->insecure) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (o->ca_file ? SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL) != 1
                       : SSL_CTX_set_default_verify_paths(ctx) != 1) {
            snprintf(err, errcap, "cannot load CA %s: %s", o->ca_file ? o->ca_file : "(system)",
                     mg_ssl_last_reason());
            goto fail;
        }
    }
    if (o->cert_file) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->cert_file) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, o->key_file ? o->key_file : o->cert_file,
                                        SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(err, errcap, "cannot load client certificate %s / key %s: %s", o->cert_file,
                     o->key_file ? o->key_file : o->cert_file, mg_ssl_last_reason());
            goto fail;
        }
    }
    return ctx;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
}

int mg_client_new(mg_client **out, struct event_base *base, const mg_client_options *o, char *err,
                  size_t errcap)
{
    mg_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    c->base = base;
    c->tls = o->tls;
    c->max_message = o->max_message_bytes ? o->max_message_bytes : 4u * 1024u * 1024u;
    c->busy_poll_us = o->busy_poll_us;
    c->on_broken = o->on_broken;
    c->broken_arg = o->broken_arg;
    snprintf(c->target, sizeof(c->target), "%s", o->target);
    if (o->token && o->token[0]) {
        if (strlen(o->token) > 1024 || strpbrk(o->token, "\r\n")) {
            snprintf(err, errcap, "the token is longer than 1024 bytes or holds a line break");
            mg_client_del(c);
            return -1;
        }
        snprintf(c->bearer, sizeof(c->bearer), "Bearer %s", o->token);
    }
    if (client_connect(c, o, err, errcap) != 0) {
        mg_client_del(c);
        return -1;
    }
    *out = c;
    return 0;
}

/* The connection of c to o->target: its socket, TLS, nghttp2 session and flush event. Returns 0,
 * or -1 with err set (the caller frees what was made). */
static int client_connect(mg_client *c, const mg_client_options *o, char *err, size_t errcap)
{
    struct event_base *base = c->base;
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 4 * 1024 * 1024}};
    struct timeval ct;
    char host[256];
    const char *t = o->target;

    ct.tv_sec = o->connect_timeout_ms ? o->connect_timeout_ms / 1000 : 10;
    ct.tv_usec = o->connect_timeout_ms ? (suseconds_t)(o->connect_timeout_ms % 1000) * 1000 : 0;

    if (strncmp(t, "unix:", 5) == 0) {
        struct sockaddr_un sun;
        const char *path = t + 5;
        if (strlen(path) >= sizeof(sun.sun_path) || *path == '\0') {
            snprintf(err, errcap, "bad Unix socket path in \"%s\"", t);
            goto fail;
        }
        snprintf(c->authority, sizeof(c->authority), "localhost");
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        memcpy(sun.sun_path, path, strlen(path) + 1);
        c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (c->bev == NULL) {
            snprintf(err, errcap, "out of memory");
            goto fail;
        }
        bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
        bufferevent_set_timeouts(c->bev, &ct, &ct);
        if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
            snprintf(err, errcap, "connect %s: %s", t, strerror(errno));
            goto fail;
        }
    } else {
        struct evutil_addrinfo hints, *ai = NULL;
        const char *colon = strrchr(t, ':');
        size_t hl;
        int gai;
        if (colon == NULL || colon[1] == '\0') {
            snprintf(err, errcap, "target \"%s\" is not host:port or unix:/path", t);
            goto fail;
        }
        hl = (size_t)(colon - t);
        if (hl >= 2 && t[0] == '[' && t[hl - 1] == ']')
            snprintf(host, sizeof(host), "%.*s", (int)(hl - 2), t + 1);
        else
            snprintf(host, sizeof(host), "%.*s", (int)hl, t);
        snprintf(c->authority, sizeof(c->authority), "%s", t);
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = EVUTIL_AI_ADDRCONFIG;
        gai = evutil_getaddrinfo(host, colon + 1, &hints, &ai);
        if (gai != 0 || ai == NULL) {
            snprintf(err, errcap, "cannot resolve \"%s\": %s", host, evutil_gai_strerror(gai));
            goto fail;
        }
        if (c->tls) {
            SSL *ssl;
            c->ssl_ctx = client_ssl_ctx(o, err, errcap);
            if (c->ssl_ctx == NULL) {
                evutil_freeaddrinfo(ai);
                goto fail;
            }
            ssl = SSL_new(c->ssl_ctx);
            if (ssl == NULL) {
                evutil_freeaddrinfo(ai);
                snprintf(err, errcap, "out of memory");
                goto fail;
            }
            {
                const char *sni = o->server_name ? o->server_name : host;
                SSL_set_tlsext_host_name(ssl, sni);
                if (!o->insecure)
                    SSL_set1_host(ssl, sni);
            }
            c->bev =
                bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                               BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
            if (c->bev == NULL)
                SSL_free(ssl);
            else
                bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
        } else {
            c->bev =
                bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        }
        if (c->bev == NULL) {
            evutil_freeaddrinfo(ai);
            snprintf(err, errcap, "out of memory");
            goto fail;
        }
        bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
        bufferevent_set_timeouts(c->bev, &ct, &ct);
        if (bufferevent_socket_connect(c->bev, ai->ai_addr, (int)ai->ai_addrlen) != 0) {
            snprintf(err, errcap, "connect %s: %s", t, strerror(errno));
            evutil_freeaddrinfo(ai);
            goto fail;
        }
        evutil_freeaddrinfo(ai);
    }
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_openssl_get_ssl(c->bev) == NULL && (c->stage = evbuffer_new()) == NULL)
        goto fail_ng;

    if (nghttp2_session_callbacks_new(&cbs) != 0)
        goto fail_ng;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_on_header_callback2(cbs, on_header_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close_cb);
    if (nghttp2_session_client_new(&c->ng, cbs, c) != 0)
        goto fail_ng;
    nghttp2_session_callbacks_del(cbs);
    cbs = NULL;
    nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->ng, NGHTTP2_FLAG_NONE, 0, 16 * 1024 * 1024);
    c->flush_ev = event_new(base, -1, 0, flush_cb, c);
    if (c->flush_ev == NULL)
        goto fail_ng;
    return 0;

fail_ng:
    snprintf(err, errcap, "out of memory");
    if (cbs)
        nghttp2_session_callbacks_del(cbs);
fail:
    return -1;
}

void mg_client_del(mg_client *c)
{
    if (c == NULL || c->doomed)
        return;
    if (c->in_cb > 0) { /* inside one of its callbacks: freed as that returns */
        c->doomed = 1;
        c->failed = 1; /* nothing more is sent or started on it */
        while (c->rpcs)
            rpc_close(c->rpcs, MG_GRPC_CANCELLED, "client closed");
        return;
    }
    client_free(c);
}

/* Ends c's connection (its calls with CANCELLED) and frees what client_connect made. */
static void client_disconnect(mg_client *c)
{
    while (c->rpcs)
        rpc_close(c->rpcs, MG_GRPC_CANCELLED, "client closed");
    if (c->ng)
        nghttp2_session_del(c->ng);
    if (c->flush_ev)
        event_free(c->flush_ev);
    if (c->read_ev)
        event_free(c->read_ev); /* before the bufferevent closes the socket */
    if (c->stage)
        evbuffer_free(c->stage);
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->ssl_ctx)
        SSL_CTX_free(c->ssl_ctx);
    c->ng = NULL;
    c->flush_ev = c->read_ev = NULL;
    c->stage = NULL;
    c->bev = NULL;
    c->ssl_ctx = NULL;
}

static void client_free(mg_client *c)
{
    client_disconnect(c);
    mgc_keep_free(c->keep);
    free(c);
}

int mgc_reconnect(mg_client *c, char *err, size_t errcap)
{
    mg_client_options o = {.target = c->target, .token = mg_client_token(c)};
    if (c->in_cb > 0 || c->doomed || c->tls) {
        snprintf(err, errcap, "this client cannot reconnect");
        return -1;
    }
    client_disconnect(c);
    c->connected = c->failed = 0;
    c->fail_msg[0] = '\0';
    if (client_connect(c, &o, err, errcap) != 0) {
        client_disconnect(c);
        c->failed = 1;
        snprintf(c->fail_msg, sizeof(c->fail_msg), "%s: %s", c->target, err);
        return -1;
    }
    return 0;
}

mg_keep *mgc_keep_of(const mg_client *c)
{
    return c->keep;
}

const char *mgc_fail_msg(const mg_client *c)
{
    return c->failed ? c->fail_msg : NULL;
}

/* A blocking client's connection: anything the daemon sent meanwhile is read now, so that a
 * connection it closed (or is closing: GOAWAY) since the last call is known before a call
 * goes out on it. */
static void client_check(mg_client *c)
{
    if (c->in_cb > 0 || c->failed || !c->connected)
        return;
    enter(c);
    if (c->read_ev)
        plain_read(c);
    if (!c->failed && !nghttp2_session_check_request_allowed(c->ng))
        client_fail(c, "the daemon is closing the connection (GOAWAY)");
    leave(c);
}

int mgc_ready(mg_client *c, int *status, char *message, size_t msgcap)
{
    if (c->keep == NULL) /* a client of mg_client_new: its owner handles a broken connection */
        return 0;
    client_check(c);
    return c->failed || mgc_keep_refused(c->keep) ? mgc_keep_restore(c, status, message, msgcap)
                                                  : 0;
}

/* ------------------------------------------------------------------ blocking calls */

typedef struct {
    uint8_t *resp;
    size_t len;
    int messages;
    int status;
    int done;
    char *message;
    size_t msgcap;
} call_state;

static void call_msg(mg_rpc *rpc, const uint8_t *msg, size_t len, void *arg)
{
    call_state *s = arg;
    uint8_t *copy = malloc(len ? len : 1);
    s->messages++;
    if (copy == NULL)
        return; /* reported at the close */
    memcpy(copy, msg, len);
    free(s->resp);
    s->resp = copy;
    s->len = len;
}

static void call_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    call_state *s = arg;
    s->status = status;
    if (s->msgcap)
        mg_strlcpy(s->message, message, s->msgcap);
    s->done = 1;
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* mg_client_call; `unary` also requires exactly one response message. */
static int call_run(mg_client *c, const char *path, const uint8_t *req, size_t req_len,
                    uint64_t timeout_ms, int unary, uint8_t **resp, size_t *resp_len, int *status,
                    char *message, size_t msgcap)
{
    static const mg_rpc_handlers h = {call_msg, call_close};
    call_state s = {.status = MG_GRPC_UNKNOWN, .message = message, .msgcap = msgcap};
    mg_rpc *rpc;

    *resp = NULL;
    *resp_len = 0;
    *status = MG_GRPC_UNKNOWN;
    if (msgcap)
        message[0] = '\0';
    if (mgc_ready(c, status, message, msgcap) != 0)
        return 0;
    rpc = mg_rpc_start(c, path, NULL, 0, timeout_ms, &h, &s);
    if (rpc == NULL) {
        snprintf(message, msgcap, "%s", c->failed ? c->fail_msg : "out of memory");
        return -1;
    }
    if (mg_rpc_send(rpc, req, req_len) != 0 || mg_rpc_close_send(rpc) != 0) {
        mg_rpc_cancel(rpc);
        snprintf(message, msgcap, "out of memory");
        return -1;
    }
    if (c->in_cb == 0 && c->connected) { /* the request out now, not on the loop's next pass */
        event_del(c->flush_ev);
        enter(c);
        client_send(c);
        leave(c);
    }
    if (c->busy_poll_us && c->read_ev) {
        uint64_t until = mono_us() + c->busy_poll_us;
        while (!s.done && !c->failed && mono_us() < until) {
            enter(c);
            plain_read(c);
            leave(c);
        }
    }
    while (!s.done) {
        if (event_base_loop(c->base, EVLOOP_ONCE) != 0 && !s.done) { /* nothing left to wait on */
            mg_rpc_cancel(rpc);
            break;
        }
    }
    *status = s.status;
    if (s.status == MG_GRPC_OK && (s.resp == NULL || (unary && s.messages != 1))) {
        *status = MG_GRPC_INTERNAL;
        snprintf(message, msgcap, "%s",
                 s.messages == 0  ? "no response message"
                 : s.resp == NULL ? "out of memory"
                                  : "more than one response message for a unary call");
    }
    if (*status == MG_GRPC_OK) {
        *resp = s.resp;
        *resp_len = s.len;
        if (c->keep)
            mgc_keep_called(c, path, req, req_len, s.resp, s.len);
    } else {
        free(s.resp);
    }
    return 0;
}

int mg_client_call(mg_client *c, const char *path, const uint8_t *req, size_t req_len,
                   uint64_t timeout_ms, uint8_t **resp, size_t *resp_len, int *status,
                   char *message, size_t msgcap)
{
    return call_run(c, path, req, req_len, timeout_ms, 0, resp, resp_len, status, message, msgcap);
}

void *mg_client_call_msg(mg_client *c, const char *path, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *resp, uint64_t timeout_ms, int *status,
                         char *err, size_t errcap)
{
    size_t n = protobuf_c_message_get_packed_size(req), rl = 0;
    uint8_t *buf = malloc(n ? n : 1), *out = NULL;
    void *msg = NULL;
    if (buf == NULL) {
        *status = MG_GRPC_RESOURCE_EXHAUSTED;
        snprintf(err, errcap, "%s: out of memory", path);
        return NULL;
    }
    protobuf_c_message_pack(req, buf);
    if (call_run(c, path, buf, n, timeout_ms, 0, &out, &rl, status, err, errcap) != 0) {
        *status = MG_GRPC_UNAVAILABLE;
    } else if (*status == MG_GRPC_OK &&
               (msg = protobuf_c_message_unpack(resp, NULL, rl, out)) == NULL) {
        *status = MG_GRPC_INTERNAL;
        snprintf(err, errcap, "%s: the daemon's answer is no %s", path, resp->name);
    }
    free(buf);
    free(out);
    return msg;
}

/* A client with a loop of its own (mg_client_close frees both). */
static mg_client *client_open(const mg_client_options *o, char *err, size_t errcap)
{
    struct event_base *base = event_base_new();
    mg_client *c;
    if (base == NULL) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    if (mg_client_new(&c, base, o, err, errcap) != 0) {
        event_base_free(base);
        return NULL;
    }
    c->owns_base = 1;
    return c;
}

mg_client *mg_client_open(const char *target, const char *token, char *err, size_t errcap)
{
    mg_client_options o = {.target = target, .token = token};
    mg_client *c = client_open(&o, err, errcap);
    if (c && (c->keep = mgc_keep_new(c)) == NULL) {
        snprintf(err, errcap, "out of memory");
        mg_client_close(c);
        return NULL;
    }
    return c;
}

void mg_client_close(mg_client *c)
{
    struct event_base *base;
    if (c == NULL)
        return;
    base = c->owns_base ? c->base : NULL;
    mg_client_del(c);
    if (base) { /* deferred bufferevent callbacks run, so the connection is released */
        event_base_loop(base, EVLOOP_NONBLOCK);
        event_base_free(base);
    }
}

int mg_client_unary(const mg_client_options *opts, const char *path, const uint8_t *req,
                    size_t req_len, uint64_t timeout_ms, uint8_t **resp, size_t *resp_len,
                    int *status, char **message, char *err, size_t errcap)
{
    char msg[2048];
    mg_client *c = client_open(opts, err, errcap);
    int rc;
    if (c == NULL)
        return -1;
    rc = call_run(c, path, req, req_len, timeout_ms, 1, resp, resp_len, status, msg, sizeof(msg));
    mg_client_close(c);
    if (rc != 0) {
        snprintf(err, errcap, "cannot start the call: %s", msg);
        return -1;
    }
    *message = strdup(msg);
    return 0;
}

const char *mg_client_target(const mg_client *c)
{
    return c->target;
}

const char *mg_client_token(const mg_client *c)
{
    return c->bearer[0] ? c->bearer + 7 : NULL; /* after "Bearer " */
}
