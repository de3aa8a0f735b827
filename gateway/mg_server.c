/*
 * mg_server: listeners, connections and calls of the control port.
 *
 * One libevent base runs everything in this file. A connection is a bufferevent (OpenSSL for TLS,
 * a plain socket for h2c over TCP and the Unix socket) plus an nghttp2 server session. nghttp2
 * callbacks only record and submit; bytes move in conn_send(), called after each read and from a
 * per-connection deferred event, so that the responses of many calls finished in one loop pass go
 * out in one write.
 *
 * Invariants:
 *  - a call is on its connection's list while its stream is open; the stream holds a reference;
 *  - a finished call never sends again; its handler's on_cancel runs at most once;
 *  - the trailers of a gRPC response are submitted from the data source callback after the last
 *    queued message, so they never overtake DATA (nghttp2 issue #269);
 *  - a call finished before its request ended is reset (RST_STREAM NO_ERROR) only when the
 *    client keeps sending after it, and only after the answer went out (nghttp2 drops frames
 *    still queued for a stream it resets); a request that simply ends is never reset.
 */
#include "mg_gateway.h"

#include "mg_json.h"
#include "mg_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef enum { CONN_TLS = 0, CONN_H2C = 1, CONN_UNIX = 2 } conn_kind;
static const char *const conn_kind_names[] = {"tls", "h2c", "unix"};

typedef struct mg_listener {
    struct evconnlistener *lev;
    mg_gateway *gw;
    conn_kind kind;
    char addr[128];
    char *unix_path;
    struct mg_listener *next;
} mg_listener;

typedef struct mg_conn {
    mg_gateway *gw;
    struct bufferevent *bev;
    nghttp2_session *ng;
    conn_kind kind;
    char peer[128];
    struct event *timer; /* handshake, then idle */
    struct event *flush_ev;
    unsigned nstreams;
    int got_frame;
    int read_paused;
    int in_send;
    mg_call *calls;
    struct mg_conn *next, *prev;
} mg_conn;

typedef enum { MODE_GRPC, MODE_JSON, MODE_HTTP } call_mode;

struct mg_call {
    mg_conn *conn; /* NULL once the connection is gone */
    int32_t stream_id;
    int refs;
    call_mode mode;
    const mg_method *method;
    int method_index; /* -1: no method (routes, errors) */
    char path[256];
    char verb[8];
    char ctype[96];
    int te_trailers;
    int has_timeout;
    uint64_t timeout_ns;
    int bad_timeout;
    int has_encoding;
    size_t header_bytes;
    int headers_too_large;
    mg_deframer deframer;
    struct evbuffer *body;     /* JSON request body */
    ProtobufCMessage *pending; /* the single request of a unary/server-streaming call */
    struct evbuffer *out;      /* response bytes not yet handed to nghttp2 */
    int headers_sent;
    int finished;
    int remote_closed;
    int stream_closed;
    int deferred;
    int status;
    int http_status;
    char *message;
    struct event *deadline;
    uint64_t start_ns;
    uint64_t msgs_in, msgs_out;
    uint64_t discarded;     /* request bytes received after the call finished */
    int64_t content_length; /* declared request body length, -1 when absent */
    int submit_pending;     /* answer decided, waiting for the request body (see
                               answer_after_body) */
    const char *http_ctype; /* static string: content-type of a JSON or HTTP answer */
    int want_writable;      /* the handler waits for on_writable */
    struct event *writable_ev;
    int final_sent; /* our END_STREAM frame went out */
    int rst_wanted; /* reset the stream once final_sent (client kept sending) */
    void *data;
    struct mg_call *next, *prev;
};

static void conn_free(mg_conn *conn);
static int conn_send(mg_conn *conn);
static void conn_schedule_flush(mg_conn *conn);
static void check_drained(mg_gateway *gw);
static void call_finish(mg_call *call, int code, const char *msg, int cancel_handler);

/* ------------------------------------------------------------------ time */

uint64_t mg_now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t mg_now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ULL + (uint64_t)ts.tv_nsec / 1000000ULL;
}

const char *mg_state_name(mg_state s)
{
    switch (s) {
    case MG_STATE_STARTING:
        return "starting";
    case MG_STATE_SERVING:
        return "serving";
    case MG_STATE_DRAINING:
        return "draining";
    }
    return "unknown";
}

/* ------------------------------------------------------------------ methods */

int mg_gateway_add_method(mg_gateway *gw, const mg_method *m)
{
    int known;
    if (mg_gateway_find_method(gw, m->path, strlen(m->path), &known))
        return MG_ERR_EXISTS;
    if (gw->n_methods >= MG_MAX_METHODS)
        return MG_ERR_FULL;
    gw->methods[gw->n_methods++] = m;
    return 0;
}

static int method_index(const mg_gateway *gw, const mg_method *m)
{
    for (size_t i = 0; i < gw->n_methods; i++) {
        if (gw->methods[i] == m)
            return (int)i;
    }
    return -1;
}

const mg_method *mg_gateway_find_method(const mg_gateway *gw, const char *path, size_t len,
                                        int *service_known)
{
    const char *slash = len > 1 ? memchr(path + 1, '/', len - 1) : NULL;
    size_t svc_len = slash ? (size_t)(slash - path) : len;
    *service_known = 0;
    for (size_t i = 0; i < gw->n_methods; i++) {
        const char *p = gw->methods[i]->path;
        if (strlen(p) == len && memcmp(p, path, len) == 0) {
            *service_known = 1;
            return gw->methods[i];
        }
        if (strncmp(p, path, svc_len) == 0 && p[svc_len] == '/')
            *service_known = 1;
    }
    return NULL;
}

/* ------------------------------------------------------------------ calls */

static mg_call *call_new(mg_conn *conn, int32_t stream_id)
{
    mg_call *call = calloc(1, sizeof(*call));
    if (call == NULL)
        return NULL;
    call->out = evbuffer_new();
    if (call->out == NULL) {
        free(call);
        return NULL;
    }
    call->conn = conn;
    call->stream_id = stream_id;
    call->refs = 1;
    call->method_index = -1;
    call->content_length = -1;
    call->start_ns = mg_now_mono_ns();
    mg_deframer_init(&call->deframer, (uint32_t)conn->gw->cfg->max_message_bytes);
    call->next = conn->calls;
    if (conn->calls)
        conn->calls->prev = call;
    conn->calls = call;
    return call;
}

void mg_call_ref(mg_call *call)
{
    call->refs++;
}

void mg_call_unref(mg_call *call)
{
    if (call == NULL || --call->refs > 0)
        return;
    if (call->deadline)
        event_free(call->deadline);
    if (call->writable_ev)
        event_free(call->writable_ev);
    mg_deframer_free(&call->deframer);
    if (call->body)
        evbuffer_free(call->body);
    if (call->pending)
        protobuf_c_message_free_unpacked(call->pending, NULL);
    evbuffer_free(call->out);
    free(call->message);
    free(call);
}

int mg_call_done(const mg_call *call)
{
    return call->finished || call->stream_closed || call->conn == NULL;
}

void mg_call_set_data(mg_call *call, void *data)
{
    call->data = data;
}

void *mg_call_data(const mg_call *call)
{
    return call->data;
}

mg_gateway *mg_call_gateway(const mg_call *call)
{
    return call->conn ? call->conn->gw : NULL;
}

const char *mg_call_peer(const mg_call *call)
{
    return call->conn ? call->conn->peer : "gone";
}

int64_t mg_call_remaining_ms(const mg_call *call)
{
    uint64_t now, end;
    if (!call->has_timeout)
        return -1;
    now = mg_now_mono_ns();
    end = call->start_ns + call->timeout_ns;
    return end > now ? (int64_t)((end - now) / 1000000ULL) : 0;
}

static void writable_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_call *call = arg;
    call->want_writable = 0;
    if (!mg_call_done(call) && call->method && call->method->on_writable)
        call->method->on_writable(call);
}

int mg_call_writable(mg_call *call)
{
    if (mg_call_done(call))
        return 0;
    if (evbuffer_get_length(call->out) < call->conn->gw->cfg->max_conn_output_bytes)
        return 1;
    call->want_writable = 1;
    if (call->writable_ev == NULL)
        call->writable_ev = event_new(call->conn->gw->base, -1, 0, writable_cb, call);
    return 0;
}

/* Data source: hands queued response bytes to nghttp2. */
static ssize_t call_read_cb(nghttp2_session *ng, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    mg_call *call = source->ptr;
    int n = evbuffer_remove(call->out, buf, length);
    if (call->want_writable && call->writable_ev &&
        evbuffer_get_length(call->out) < call->conn->gw->cfg->max_conn_output_bytes / 2 &&
        !event_pending(call->writable_ev, EV_TIMEOUT, NULL))
        event_active(call->writable_ev, EV_TIMEOUT, 0); /* the handler runs outside nghttp2 */
    if (n > 0)
        return n;
    if (call->mode != MODE_GRPC) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
    }
    if (!call->finished) {
        call->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    {
        char code[8], msg[1024];
        nghttp2_nv trailers[2];
        size_t ntr = 1;
        snprintf(code, sizeof(code), "%d", call->status);
        trailers[0] = (nghttp2_nv){(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code),
                                   NGHTTP2_NV_FLAG_NONE};
        if (call->message && *call->message) {
            mg_pct_encode(msg, sizeof(msg), call->message, strlen(call->message));
            trailers[1] = (nghttp2_nv){(uint8_t *)"grpc-message", (uint8_t *)msg, 12, strlen(msg),
                                       NGHTTP2_NV_FLAG_NONE};
            ntr = 2;
        }
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (nghttp2_submit_trailer(ng, stream_id, trailers, ntr) != 0)
            *data_flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return 0;
}

#define NV(n, v)                                                                       \
    {                                                                                  \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE \
    }

/* Submits response headers plus a body read from call->out. */
static int submit_with_body(mg_call *call, const char *status, const char *ctype)
{
    nghttp2_data_provider dp = {.source.ptr = call, .read_callback = call_read_cb};
    nghttp2_nv hdrs[] = {NV(":status", status), NV("content-type", ctype),
                         NV("grpc-accept-encoding", "identity")};
    size_t n = call->mode == MODE_GRPC ? 3 : 2;
    int rv = nghttp2_submit_response(call->conn->ng, call->stream_id, hdrs, n, &dp);
    call->headers_sent = 1;
    return rv;
}

static void resume(mg_call *call)
{
    if (call->deferred) {
        call->deferred = 0;
        nghttp2_session_resume_data(call->conn->ng, call->stream_id);
    }
    conn_schedule_flush(call->conn);
}

int mg_call_send(mg_call *call, const ProtobufCMessage *msg)
{
    size_t len;
    if (mg_call_done(call))
        return -1;
    len = protobuf_c_message_get_packed_size(msg);
    if (len > call->conn->gw->cfg->max_message_bytes) {
        char m[160];
        snprintf(m, sizeof(m), "response message of %zu bytes exceeds the limit of %llu bytes", len,
                 (unsigned long long)call->conn->gw->cfg->max_message_bytes);
        call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 1);
        return -1;
    }
    if (call->mode == MODE_JSON) {
        json_t *j = mg_json_from_message(msg);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        if (s == NULL) {
            call_finish(call, MG_GRPC_INTERNAL, "could not encode the response as JSON", 1);
            return -1;
        }
        evbuffer_drain(call->out, evbuffer_get_length(call->out));
        evbuffer_add(call->out, s, strlen(s));
        evbuffer_add(call->out, "\n", 1);
        free(s);
        call->msgs_out++;
        return 0;
    }
    {
        struct evbuffer_iovec v;
        uint8_t *p;
        if (evbuffer_reserve_space(call->out, len + MG_GRPC_PREFIX_LEN, &v, 1) < 1) {
            call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
            return -1;
        }
        p = v.iov_base;
        mg_grpc_prefix(p, (uint32_t)len);
        protobuf_c_message_pack(msg, p + MG_GRPC_PREFIX_LEN);
        v.iov_len = len + MG_GRPC_PREFIX_LEN;
        evbuffer_commit_space(call->out, &v, 1);
    }
    call->msgs_out++;
    if (!call->headers_sent)
        submit_with_body(call, "200", "application/grpc");
    resume(call);
    return 0;
}

static void access_log(mg_call *call)
{
    mg_gateway *gw = call->conn ? call->conn->gw : NULL;
    double secs = (double)(mg_now_mono_ns() - call->start_ns) / 1e9;
    char msg[256], peer[160], path[300];
    if (gw && call->method_index >= 0)
        mg_metrics_observe(gw, call->method_index, call->status, secs);
    if (gw && !gw->cfg->access_log)
        return;
    if (gw == NULL && !mg_log_enabled(MG_LOG_INFO))
        return;
    mg_log_quote(peer, sizeof(peer), call->conn ? call->conn->peer : "gone");
    mg_log_quote(path, sizeof(path), call->path);
    mg_log_quote(msg, sizeof(msg), call->message ? call->message : "");
    mg_info("access",
            "proto=%s verb=%s path=%s peer=%s stream=%d status=%d code=%s http=%d "
            "msgs_in=%llu msgs_out=%llu duration_ms=%.3f message=%s",
            call->mode == MODE_GRPC   ? "grpc"
            : call->mode == MODE_JSON ? "json"
                                      : "http",
            call->verb, path, peer, call->stream_id, call->status, mg_grpc_code_name(call->status),
            call->http_status, (unsigned long long)call->msgs_in,
            (unsigned long long)call->msgs_out, secs * 1e3, msg);
}

/* Submits the final answer the call's status and body call for. */
static void submit_final(mg_call *call)
{
    char codebuf[8], pct[1024], status[8];
    nghttp2_session *ng;

    call->submit_pending = 0;
    if (call->conn == NULL || call->stream_closed)
        return;
    ng = call->conn->ng;
    switch (call->mode) {
    case MODE_GRPC:
        if (call->headers_sent) {
            resume(call); /* the data source submits the trailers after the last message */
            return;
        }
        {
            /* Trailers-Only: one HEADERS frame with END_STREAM. */
            nghttp2_nv hdrs[4] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                                  NV("grpc-status", "0"), NV("grpc-message", "")};
            size_t n = 3;
            snprintf(codebuf, sizeof(codebuf), "%d", call->status);
            hdrs[2].value = (uint8_t *)codebuf;
            hdrs[2].valuelen = strlen(codebuf);
            if (call->message && *call->message) {
                mg_pct_encode(pct, sizeof(pct), call->message, strlen(call->message));
                hdrs[3].value = (uint8_t *)pct;
                hdrs[3].valuelen = strlen(pct);
                n = 4;
            }
            nghttp2_submit_response(ng, call->stream_id, hdrs, n, NULL);
            call->headers_sent = 1;
        }
        break;
    case MODE_JSON:
    case MODE_HTTP:
        snprintf(status, sizeof(status), "%d", call->http_status);
        submit_with_body(call, status, call->http_ctype);
        break;
    }
    conn_schedule_flush(call->conn);
}

/* An early answer to a request that declared a body (content-length) waits for that body:
 * curl 7.88 neither finishes a request whose complete response arrived during its upload nor
 * accepts the RST_STREAM that would stop the upload. gRPC clients send no content-length, so
 * streaming calls are answered at once. */
static int answer_after_body(const mg_call *call)
{
    return !call->remote_closed && !call->headers_sent && call->content_length >= 0 &&
           (uint64_t)call->content_length <= call->conn->gw->cfg->max_message_bytes;
}

/* Decides the call's status, submits what the client must see and tells the handler. */
static void call_finish(mg_call *call, int code, const char *msg, int cancel_handler)
{
    if (call->finished)
        return;
    call->finished = 1;
    call->status = code;
    free(call->message);
    call->message = msg ? strdup(msg) : NULL;
    if (call->deadline)
        event_del(call->deadline);

    if (call->mode == MODE_GRPC) {
        call->http_status = 200;
    } else if (call->mode == MODE_JSON) {
        call->http_status = mg_grpc_code_http(code);
        call->http_ctype = "application/json";
        if (code != MG_GRPC_OK) {
            json_t *err = json_pack("{s:i,s:s}", "code", code, "message", msg ? msg : "");
            char *s = err ? json_dumps(err, JSON_COMPACT) : NULL;
            json_decref(err);
            evbuffer_drain(call->out, evbuffer_get_length(call->out));
            if (s) {
                evbuffer_add(call->out, s, strlen(s));
                evbuffer_add(call->out, "\n", 1);
                free(s);
            }
        } else if (evbuffer_get_length(call->out) == 0) {
            evbuffer_add(call->out, "{}\n", 3);
        }
    }
    if (call->conn && !call->stream_closed) {
        if (answer_after_body(call))
            call->submit_pending = 1;
        else
            submit_final(call);
    }
    access_log(call);
    if (cancel_handler && call->method && call->method->on_cancel)
        call->method->on_cancel(call);
}

void mg_call_finish(mg_call *call, int code, const char *fmt, ...)
{
    char msg[1024];
    if (call->finished)
        return;
    msg[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    call_finish(call, code, msg, 0);
}

void mg_call_fail(mg_call *call, int err, const char *fmt, ...)
{
    char msg[1024];
    int n = snprintf(msg, sizeof(msg), "%s", mg_strerror(err));
    if (fmt && n >= 0 && (size_t)n < sizeof(msg) - 2) {
        va_list ap;
        msg[n++] = ':';
        msg[n++] = ' ';
        va_start(ap, fmt);
        vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    if (!call->finished)
        call_finish(call, mg_err_grpc(err), msg, 0);
}

void mg_call_reply(mg_call *call, const ProtobufCMessage *msg)
{
    if (mg_call_send(call, msg) == 0)
        call_finish(call, MG_GRPC_OK, NULL, 0);
}

/* Plain HTTP answer (GET routes, 415, 405): headers and a body, then END_STREAM. */
static void call_http(mg_call *call, int status, const char *ctype, const char *body, size_t len)
{
    call->mode = MODE_HTTP;
    call->finished = 1;
    call->http_status = status;
    call->http_ctype = ctype;
    call->status = status == 200 ? MG_GRPC_OK : MG_GRPC_UNKNOWN;
    if (body)
        evbuffer_add(call->out, body, len);
    if (answer_after_body(call))
        call->submit_pending = 1;
    else
        submit_final(call);
    access_log(call);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_call *call = arg;
    char msg[96];
    snprintf(msg, sizeof(msg), "deadline of %.3f s exceeded", (double)call->timeout_ns / 1e9);
    call_finish(call, MG_GRPC_DEADLINE_EXCEEDED, msg, 1);
}

/* ------------------------------------------------------------------ request handling */

static void deliver(mg_call *call, const ProtobufCMessage *msg)
{
    call->method->on_message(call, msg);
}

static int on_grpc_message(void *arg, const uint8_t *data, size_t len)
{
    mg_call *call = arg;
    ProtobufCMessage *msg;
    char m[256];

    call->msgs_in++;
    msg = protobuf_c_message_unpack(call->method->in, NULL, len, data);
    if (msg == NULL) {
        snprintf(m, sizeof(m), "could not decode request message %llu (%zu bytes) as %s",
                 (unsigned long long)call->msgs_in, len, call->method->in->name);
        call_finish(call, MG_GRPC_INTERNAL, m, 1);
        return 1;
    }
    if (call->method->kind == MG_RPC_UNARY || call->method->kind == MG_RPC_SERVER_STREAM) {
        if (call->pending) {
            protobuf_c_message_free_unpacked(msg, NULL);
            snprintf(m, sizeof(m), "%s takes exactly one request message, got more",
                     call->method->path);
            call_finish(call, MG_GRPC_UNIMPLEMENTED, m, 1);
            return 1;
        }
        call->pending = msg;
        return 0;
    }
    deliver(call, msg);
    protobuf_c_message_free_unpacked(msg, NULL);
    return mg_call_done(call) ? 1 : 0;
}

static void grpc_data(mg_call *call, const uint8_t *data, size_t len)
{
    char m[256];
    int rv = mg_deframer_feed(&call->deframer, data, len, on_grpc_message, call);
    switch (rv) {
    case MG_DEFRAME_TOO_LARGE:
        snprintf(m, sizeof(m),
                 "request message of %u bytes exceeds the limit of %u bytes "
                 "(--max-message-bytes)",
                 call->deframer.declared, call->deframer.max_message);
        call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 1);
        break;
    case MG_DEFRAME_COMPRESSED:
        call_finish(call, MG_GRPC_UNIMPLEMENTED,
                    "compressed request messages are not supported; send identity encoding", 1);
        break;
    case MG_DEFRAME_BAD_FLAG:
        call_finish(call, MG_GRPC_INTERNAL, "malformed message prefix: flag byte is not 0 or 1", 1);
        break;
    case MG_DEFRAME_NOMEM:
        call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
        break;
    default:
        break;
    }
}

static void json_request_end(mg_call *call)
{
    json_error_t jerr;
    json_t *j;
    ProtobufCMessage *msg;
    char err[512];
    size_t len = call->body ? evbuffer_get_length(call->body) : 0;
    const char *text = len ? (const char *)evbuffer_pullup(call->body, -1) : "{}";

    j = json_loadb(text, len ? len : 2, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        snprintf(err, sizeof(err), "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                 jerr.text);
        call_finish(call, MG_GRPC_INVALID_ARGUMENT, err, 0);
        return;
    }
    msg = mg_json_to_message(call->method->in, j, err, sizeof(err));
    json_decref(j);
    if (msg == NULL) {
        call_finish(call, MG_GRPC_INVALID_ARGUMENT, err, 0);
        return;
    }
    call->msgs_in = 1;
    deliver(call, msg);
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void request_end(mg_call *call)
{
    char m[256];
    call->remote_closed = 1;
    if (call->submit_pending)
        submit_final(call);
    if (call->finished)
        return;
    if (call->mode == MODE_JSON) {
        json_request_end(call);
        return;
    }
    if (call->mode != MODE_GRPC)
        return;
    if (mg_deframer_partial(&call->deframer)) {
        snprintf(m, sizeof(m), "request stream ended inside a message (%u of %u bytes)",
                 call->deframer.msg_got, call->deframer.msg_len);
        call_finish(call, MG_GRPC_INTERNAL, m, 1);
        return;
    }
    if (call->method->kind == MG_RPC_UNARY || call->method->kind == MG_RPC_SERVER_STREAM) {
        ProtobufCMessage *msg = call->pending;
        if (msg == NULL) {
            snprintf(m, sizeof(m), "%s takes exactly one request message, got none",
                     call->method->path);
            call_finish(call, MG_GRPC_UNIMPLEMENTED, m, 0);
            return;
        }
        call->pending = NULL;
        deliver(call, msg);
        protobuf_c_message_free_unpacked(msg, NULL);
    } else if (call->method->on_half_close) {
        call->method->on_half_close(call);
    }
}

/* The request's headers are complete: route it. */
static void request_headers(mg_call *call)
{
    mg_conn *conn = call->conn;
    mg_gateway *gw = conn->gw;
    int service_known = 0;
    int is_grpc = strncmp(call->ctype, "application/grpc", 16) == 0 &&
                  (call->ctype[16] == '\0' || call->ctype[16] == '+' || call->ctype[16] == ';');
    int is_json = strncmp(call->ctype, "application/json", 16) == 0;
    char m[400];

    if (call->headers_too_large) {
        call->mode = is_grpc ? MODE_GRPC : MODE_JSON;
        snprintf(m, sizeof(m), "request headers exceed %llu bytes (--max-header-list-bytes)",
                 (unsigned long long)gw->cfg->max_header_list_bytes);
        call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 0);
        return;
    }
    if (!strcmp(call->verb, "GET") || !strcmp(call->verb, "HEAD")) {
        struct evbuffer *body = evbuffer_new();
        const char *ctype = "text/plain; charset=utf-8";
        int status;
        gw->stats.http_requests++;
        if (body == NULL) {
            call_http(call, 500, ctype, "out of memory\n", 14);
            return;
        }
        status = mg_ops_route(gw, call->path, body, &ctype);
        if (strcmp(call->verb, "HEAD") != 0)
            evbuffer_add_buffer(call->out, body);
        evbuffer_free(body);
        call_http(call, status, ctype, NULL, 0);
        return;
    }
    if (strcmp(call->verb, "POST") != 0) {
        static const char msg[] = "use POST for gRPC and JSON calls, GET for /livez /readyz "
                                  "/metrics\n";
        call_http(call, 405, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
        return;
    }
    if (!is_grpc && !is_json) {
        static const char msg[] = "content-type must be application/grpc (gRPC) or "
                                  "application/json (JSON)\n";
        call_http(call, 415, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
        return;
    }
    call->mode = is_grpc ? MODE_GRPC : MODE_JSON;
    call->method = mg_gateway_find_method(gw, call->path, strlen(call->path), &service_known);
    if (call->method == NULL) {
        gw->stats.unknown_method_calls++;
        if (service_known)
            snprintf(m, sizeof(m), "unknown method %s", call->path);
        else
            snprintf(m, sizeof(m), "unknown service in %s", call->path);
        call_finish(call, MG_GRPC_UNIMPLEMENTED, m, 0);
        return;
    }
    call->method_index = method_index(gw, call->method);
    gw->method_stats[call->method_index].started++;
    if (is_grpc && !call->te_trailers) {
        call_finish(call, MG_GRPC_INTERNAL, "missing \"te: trailers\" request header", 0);
        return;
    }
    if (call->bad_timeout) {
        call_finish(call, MG_GRPC_INTERNAL, "malformed grpc-timeout header", 0);
        return;
    }
    if (is_json && call->method->kind != MG_RPC_UNARY) {
        snprintf(m, sizeof(m), "%s is a streaming method; JSON serves unary methods only",
                 call->path);
        call_finish(call, MG_GRPC_UNIMPLEMENTED, m, 0);
        return;
    }
    if (is_json) {
        call->body = evbuffer_new();
        if (call->body == NULL) {
            call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 0);
            return;
        }
    }
    if (call->has_timeout) {
        struct timeval tv = {(time_t)(call->timeout_ns / 1000000000ULL),
                             (suseconds_t)(call->timeout_ns % 1000000000ULL / 1000ULL)};
        call->deadline = evtimer_new(gw->base, deadline_cb, call);
        if (call->deadline)
            evtimer_add(call->deadline, &tv);
    }
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static ssize_t send_cb(nghttp2_session *ng, const uint8_t *data, size_t length, int flags,
                       void *user_data)
{
    mg_conn *conn = user_data;
    struct evbuffer *out = bufferevent_get_output(conn->bev);
    if (evbuffer_get_length(out) >= conn->gw->cfg->max_conn_output_bytes)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (bufferevent_write(conn->bev, data, length) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

static int on_begin_headers_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    call = call_new(conn, frame->hd.stream_id);
    if (call == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(ng, frame->hd.stream_id, call);
    conn->nstreams++;
    conn->gw->stats.streams_active++;
    if (conn->timer)
        evtimer_del(conn->timer);
    return 0;
}

static void copy_hdr(char *dst, size_t cap, const uint8_t *v, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, v, len);
    dst[len] = '\0';
}

static int on_header_cb(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* request trailers carry nothing we use */
    call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (call == NULL)
        return 0;
    call->header_bytes += namelen + valuelen + 32;
    if (call->header_bytes > conn->gw->cfg->max_header_list_bytes) {
        call->headers_too_large = 1;
        return 0;
    }
#define IS(s) (namelen == sizeof(s) - 1 && memcmp(name, s, sizeof(s) - 1) == 0)
    if (IS(":path")) {
        if (valuelen >= sizeof(call->path))
            call->headers_too_large = 1;
        copy_hdr(call->path, sizeof(call->path), value, valuelen);
    } else if (IS(":method")) {
        copy_hdr(call->verb, sizeof(call->verb), value, valuelen);
    } else if (IS("content-type")) {
        copy_hdr(call->ctype, sizeof(call->ctype), value, valuelen);
    } else if (IS("te")) {
        call->te_trailers = valuelen == 8 && memcmp(value, "trailers", 8) == 0;
    } else if (IS("grpc-timeout")) {
        if (mg_grpc_timeout_parse((const char *)value, valuelen, &call->timeout_ns) == 0)
            call->has_timeout = 1;
        else
            call->bad_timeout = 1;
    } else if (IS("content-length")) {
        int64_t v = 0;
        size_t i = 0;
        for (; i < valuelen && i < 18 && value[i] >= '0' && value[i] <= '9'; i++)
            v = v * 10 + (value[i] - '0');
        call->content_length = i == valuelen && i > 0 ? v : -1;
    } else if (IS("grpc-encoding")) {
        call->has_encoding = !(valuelen == 8 && memcmp(value, "identity", 8) == 0);
    }
#undef IS
    return 0;
}

/* Request bytes a finished call may still receive before its stream is reset: one default
 * stream window for gRPC (a small request simply ends), one message for JSON and HTTP. */
static uint64_t discard_allowance(const mg_call *call)
{
    return call->mode == MODE_GRPC ? 65535 : call->conn->gw->cfg->max_message_bytes;
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
            request_headers(call);
        if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
            request_end(call);
        break;
    case NGHTTP2_DATA:
        call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (call == NULL)
            break;
        if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
            request_end(call);
        } else if (call->finished && !call->submit_pending &&
                   call->discarded > discard_allowance(call)) {
            /* Answered, yet the client keeps sending: ask it to stop (RFC 9113 8.1), once
             * the answer is out (a reset submitted earlier would cancel it). A request that
             * simply ends is never reset, as curl reports such a reset as an error. */
            if (call->final_sent)
                nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                          NGHTTP2_NO_ERROR);
            else
                call->rst_wanted = 1;
        }
        break;
    case NGHTTP2_RST_STREAM:
        conn->gw->stats.rst_received++;
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
    if (call == NULL)
        return 0;
    if (call->finished) {
        call->discarded += len; /* judged when the frame is complete, in on_frame_recv_cb */
        return 0;
    }
    if (call->mode == MODE_GRPC) {
        grpc_data(call, data, len);
    } else if (call->mode == MODE_JSON && call->body) {
        if (evbuffer_get_length(call->body) + len > call->conn->gw->cfg->max_message_bytes) {
            char m[160];
            snprintf(m, sizeof(m), "JSON body exceeds the limit of %llu bytes",
                     (unsigned long long)call->conn->gw->cfg->max_message_bytes);
            call_finish(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 0);
            return 0;
        }
        evbuffer_add(call->body, data, len);
    }
    return 0;
}

static int on_frame_send_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *user_data)
{
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        mg_call *call = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
        if (call) {
            call->final_sent = 1;
            if (call->rst_wanted && !call->remote_closed)
                nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                          NGHTTP2_NO_ERROR);
        }
    } else if (frame->hd.type == NGHTTP2_GOAWAY) {
        mg_conn *conn = user_data;
        conn->gw->stats.goaway_sent++;
    }
    return 0;
}

/* The stream is gone: detach the call, cancelling it for its handler if it was not finished. */
static void call_detach(mg_call *call, const char *why)
{
    mg_conn *conn = call->conn;
    if (conn) {
        if (call->prev)
            call->prev->next = call->next;
        else
            conn->calls = call->next;
        if (call->next)
            call->next->prev = call->prev;
        call->next = call->prev = NULL;
        conn->nstreams--;
        conn->gw->stats.streams_active--;
    }
    if (!call->finished) {
        call->stream_closed = 1;
        call_finish(call, MG_GRPC_CANCELLED, why, 1);
    }
    call->stream_closed = 1;
    call->conn = NULL;
    mg_call_unref(call);
}

static int on_stream_close_cb(nghttp2_session *ng, int32_t stream_id, uint32_t error_code,
                              void *user_data)
{
    mg_conn *conn = user_data;
    mg_call *call = nghttp2_session_get_stream_user_data(ng, stream_id);
    if (call == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(ng, stream_id, NULL);
    call_detach(call, error_code == NGHTTP2_CANCEL ? "cancelled by the client"
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
    if (conn->gw->drain_phase >= 1)
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
    conn_free(conn);
    return 1;
}

/* Hands queued frames to the socket. Returns -1 when the connection was freed. */
static int conn_send(mg_conn *conn)
{
    int rv;
    if (conn->ng == NULL)
        return 0;
    conn->in_send = 1;
    rv = nghttp2_session_send(conn->ng);
    conn->in_send = 0;
    if (rv != 0) {
        mg_warn("conn_error", "peer=%s kind=%s error=\"%s\"", conn->peer,
                conn_kind_names[conn->kind], nghttp2_strerror(rv));
        conn_free(conn);
        return -1;
    }
    return conn_maybe_close(conn) ? -1 : 0;
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_send(arg);
}

static void conn_schedule_flush(mg_conn *conn)
{
    if (conn && conn->flush_ev && !event_pending(conn->flush_ev, EV_TIMEOUT, NULL))
        event_active(conn->flush_ev, EV_TIMEOUT, 0);
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    mg_conn *conn = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer *out = bufferevent_get_output(bev);

    if (conn->ng == NULL)
        return;
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v[8];
        int n = evbuffer_peek(in, -1, NULL, v, 8);
        size_t used = 0;
        if (n > 8)
            n = 8;
        for (int i = 0; i < n; i++) {
            ssize_t r = nghttp2_session_mem_recv(conn->ng, v[i].iov_base, v[i].iov_len);
            if (r < 0) {
                conn->gw->stats.protocol_errors++;
                mg_info("conn_protocol_error", "peer=%s kind=%s error=\"%s\"", conn->peer,
                        conn_kind_names[conn->kind], nghttp2_strerror((int)r));
                evbuffer_drain(in, evbuffer_get_length(in));
                /* nghttp2 queued a GOAWAY where it could; send it, then close. */
                nghttp2_session_terminate_session(conn->ng, NGHTTP2_PROTOCOL_ERROR);
                conn_send(conn);
                return;
            }
            used += (size_t)r;
        }
        evbuffer_drain(in, used);
        if (conn_send(conn) < 0)
            return;
    }
    /* Backpressure: stop reading while the peer is not reading what we already wrote. */
    if (evbuffer_get_length(out) >= conn->gw->cfg->max_conn_output_bytes) {
        bufferevent_disable(bev, EV_READ);
        conn->read_paused = 1;
    }
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    mg_conn *conn = arg;
    if (conn->ng == NULL)
        return;
    if (conn->read_paused && evbuffer_get_length(bufferevent_get_output(bev)) <
                                 conn->gw->cfg->max_conn_output_bytes / 2) {
        conn->read_paused = 0;
        bufferevent_enable(bev, EV_READ);
    }
    conn_send(conn);
}

static void conn_event_cb(struct bufferevent *bev, short events, void *arg)
{
    mg_conn *conn = arg;
    if (events & BEV_EVENT_CONNECTED) {
        const unsigned char *alpn = NULL;
        unsigned alpnlen = 0;
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        if (ssl)
            SSL_get0_alpn_selected(ssl, &alpn, &alpnlen);
        if (alpn == NULL || alpnlen != 2 || memcmp(alpn, "h2", 2) != 0) {
            mg_info("conn_rejected", "peer=%s reason=\"ALPN h2 not negotiated\"", conn->peer);
            conn_free(conn);
            return;
        }
        if (conn_session_new(conn) != 0) {
            conn_free(conn);
            return;
        }
        conn_send(conn);
        return;
    }
    if (events & BEV_EVENT_ERROR) {
        unsigned long e = bufferevent_get_openssl_error(bev);
        if (conn->kind == CONN_TLS && conn->ng == NULL) {
            char buf[256] = "";
            conn->gw->stats.tls_handshake_errors++;
            if (e)
                ERR_error_string_n(e, buf, sizeof(buf));
            mg_info("tls_handshake_failed", "peer=%s error=\"%s\"", conn->peer, buf);
        }
    }
    conn_free(conn);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_conn *conn = arg;
    if (conn->ng == NULL || !conn->got_frame) {
        mg_info("conn_timeout", "peer=%s kind=%s reason=handshake", conn->peer,
                conn_kind_names[conn->kind]);
        conn_free(conn);
        return;
    }
    if (conn->nstreams > 0)
        return;
    mg_debug("conn_idle", "peer=%s kind=%s", conn->peer, conn_kind_names[conn->kind]);
    nghttp2_submit_goaway(conn->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(conn->ng), NGHTTP2_NO_ERROR,
                          (const uint8_t *)"idle", 4);
    conn_send(conn);
}

static void conn_free(mg_conn *conn)
{
    mg_gateway *gw = conn->gw;
    while (conn->calls) {
        mg_call *call = conn->calls;
        if (conn->ng)
            nghttp2_session_set_stream_user_data(conn->ng, call->stream_id, NULL);
        call_detach(call, "connection closed before the call finished");
    }
    if (conn->ng)
        nghttp2_session_del(conn->ng);
    if (conn->timer)
        event_free(conn->timer);
    if (conn->flush_ev)
        event_free(conn->flush_ev);
    if (conn->bev) {
        SSL *ssl = bufferevent_openssl_get_ssl(conn->bev);
        if (ssl)
            SSL_set_shutdown(ssl, SSL_RECEIVED_SHUTDOWN);
        bufferevent_free(conn->bev);
    }
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        gw->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    gw->stats.conns_active--;
    mg_debug("conn_closed", "peer=%s kind=%s", conn->peer, conn_kind_names[conn->kind]);
    free(conn);
    check_drained(gw);
}

static void peer_name(char *dst, size_t cap, evutil_socket_t fd, const struct sockaddr *sa,
                      conn_kind kind)
{
    if (kind == CONN_UNIX) {
        struct ucred cred;
        socklen_t len = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
            snprintf(dst, cap, "uid:%u pid:%d", (unsigned)cred.uid, (int)cred.pid);
        else
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
    conn->kind = l->kind;
    peer_name(conn->peer, sizeof(conn->peer), fd, sa, l->kind);
    if (l->kind != CONN_UNIX)
        setsockopt(fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
    if (l->kind == CONN_TLS) {
        SSL *ssl = SSL_new(gw->ssl_ctx);
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
    }
    conn->timer = evtimer_new(gw->base, conn_timer_cb, conn);
    conn->flush_ev = event_new(gw->base, -1, 0, flush_cb, conn);
    conn->next = gw->conns;
    if (gw->conns)
        gw->conns->prev = conn;
    gw->conns = conn;
    gw->stats.conns_active++;
    gw->stats.conns_total[l->kind]++;
    if (conn->bev == NULL || conn->timer == NULL || conn->flush_ev == NULL) {
        if (conn->bev == NULL)
            evutil_closesocket(fd);
        conn_free(conn);
        return;
    }
    evtimer_add(conn->timer, &tv);
    bufferevent_setcb(conn->bev, conn_read_cb, conn_write_cb, conn_event_cb, conn);
    bufferevent_setwatermark(conn->bev, EV_WRITE, 0, 0);
    bufferevent_enable(conn->bev, EV_READ | EV_WRITE);
    mg_debug("conn_open", "peer=%s kind=%s", conn->peer, conn_kind_names[conn->kind]);
    if (l->kind != CONN_TLS) {
        if (conn_session_new(conn) != 0) {
            conn_free(conn);
            return;
        }
        conn_send(conn);
    }
}

/* ------------------------------------------------------------------ listeners */

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
                 conn_kind_names[kind], errno, strerror(errno));
        free(l);
        return MG_ERR_SYSTEM;
    }
    l->next = gw->listeners;
    gw->listeners = l;
    mg_info("listen", "addr=%s kind=%s", addr, conn_kind_names[kind]);
    return 0;
}

static int add_unix_listener(mg_gateway *gw, const char *path)
{
    struct sockaddr_un sun;
    struct stat st;
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
    /* Remove a stale socket of an earlier run, never any other kind of file. */
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            mg_error("listen_failed", "unix=%s reason=\"exists and is not a socket\"", path);
            return MG_ERR_EXISTS;
        }
        unlink(path);
    }
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
    chmod(path, 0660);
    l->next = gw->listeners;
    gw->listeners = l;
    mg_info("listen", "addr=unix:%s kind=unix", path);
    return 0;
}

static void free_listeners(mg_gateway *gw)
{
    while (gw->listeners) {
        mg_listener *l = gw->listeners;
        gw->listeners = l->next;
        evconnlistener_free(l->lev);
        if (l->unix_path) {
            unlink(l->unix_path);
            free(l->unix_path);
        }
        free(l);
    }
}

/* Adds a listener of `kind` for each comma-separated host:port of list. */
static int each_addr(mg_gateway *gw, const char *list, conn_kind kind)
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

/* ------------------------------------------------------------------ gateway */

static void cq_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    mg_cq_drain(gw->cq, 256);
}

int mg_gateway_new(mg_gateway **out, struct event_base *base, const mg_config *cfg,
                   mg_engine *engine)
{
    mg_gateway *gw = calloc(1, sizeof(*gw));
    int rc;
    if (gw == NULL)
        return MG_ERR_NOMEM;
    gw->base = base;
    gw->cfg = cfg;
    gw->engine = engine;
    gw->state = MG_STATE_STARTING;
    gw->start_unix_ms = mg_now_unix_ms();
    gw->start_mono_ns = mg_now_mono_ns();
    if (getrandom(&gw->epoch, sizeof(gw->epoch), 0) != sizeof(gw->epoch))
        gw->epoch = gw->start_mono_ns ^ gw->start_unix_ms;

    rc = mg_cq_new(&gw->cq);
    if (rc != 0)
        goto fail;
    gw->cq_event = event_new(base, mg_cq_fd(gw->cq), EV_READ | EV_PERSIST, cq_cb, gw);
    if (gw->cq_event == NULL || event_add(gw->cq_event, NULL) != 0) {
        rc = MG_ERR_NOMEM;
        goto fail;
    }
    if ((rc = mg_svc_health_init(gw)) != 0 || (rc = mg_svc_daemon_init(gw)) != 0 ||
        (rc = mg_svc_reflection_init(gw)) != 0)
        goto fail;
    if (cfg->debug_service && (rc = mg_svc_debug_init(gw)) != 0)
        goto fail;

    if (*cfg->tls_cert) {
        gw->ssl_ctx = mg_tls_server_ctx(cfg->tls_cert, cfg->tls_key);
        if (gw->ssl_ctx == NULL) {
            rc = MG_ERR_INVALID;
            goto fail;
        }
        if ((rc = each_addr(gw, cfg->listen, CONN_TLS)) != 0)
            goto fail;
    } else if (*cfg->listen) {
        /* No certificate: serve h2c on loopback at the first listener's port. */
        struct sockaddr_storage ss;
        int sslen = sizeof(ss);
        char first[256], addr[64], *comma;
        snprintf(first, sizeof(first), "%s", cfg->listen);
        comma = strchr(first, ',');
        if (comma)
            *comma = '\0';
        if (evutil_parse_sockaddr_port(first, (struct sockaddr *)&ss, &sslen) != 0) {
            mg_error("listen_failed", "addr=%s reason=\"not a host:port\"", first);
            rc = MG_ERR_INVALID;
            goto fail;
        }
        snprintf(addr, sizeof(addr), "127.0.0.1:%d",
                 ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port));
        mg_warn("tls_disabled",
                "reason=\"no --tls-cert\" fallback=h2c addr=%s note=\"loopback only\"", addr);
        if ((rc = add_listener(gw, CONN_H2C, addr)) != 0)
            goto fail;
    }
    if (*cfg->h2c_listen && (rc = each_addr(gw, cfg->h2c_listen, CONN_H2C)) != 0)
        goto fail;
    if (*cfg->unix_socket && (rc = add_unix_listener(gw, cfg->unix_socket)) != 0)
        goto fail;
    if (*cfg->ops_listen && (rc = mg_ops_start(gw, cfg->ops_listen)) != 0)
        goto fail;
    *out = gw;
    return 0;

fail:
    mg_gateway_del(gw);
    return rc;
}

void mg_gateway_del(mg_gateway *gw)
{
    if (gw == NULL)
        return;
    free_listeners(gw);
    while (gw->conns)
        conn_free(gw->conns);
    mg_ops_stop(gw);
    mg_svc_health_free(gw);
    mg_svc_reflection_free(gw);
    if (gw->drain_timer)
        event_free(gw->drain_timer);
    if (gw->grace_timer)
        event_free(gw->grace_timer);
    if (gw->cq_event)
        event_free(gw->cq_event);
    if (gw->cq) {
        mg_cq_drain(gw->cq, 0);
        mg_cq_del(gw->cq);
    }
    mg_tls_ctx_free(gw->ssl_ctx);
    free(gw);
}

void mg_gateway_set_serving(mg_gateway *gw)
{
    if (gw->state != MG_STATE_STARTING)
        return;
    gw->state = MG_STATE_SERVING;
    mg_svc_health_notify(gw);
    mg_info("ready", "state=serving epoch=%016llx", (unsigned long long)gw->epoch);
}

static void check_drained(mg_gateway *gw)
{
    if (gw->drain_phase == 2 && gw->conns == NULL) {
        mg_info("drained", "result=clean");
        event_base_loopbreak(gw->base);
    }
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    unsigned n = 0;
    for (mg_conn *c = gw->conns; c; c = c->next)
        n++;
    mg_warn("drain_timeout", "grace_s=%llu connections_closed=%u",
            (unsigned long long)gw->cfg->grace, n);
    gw->drain_phase = 3;
    while (gw->conns)
        conn_free(gw->conns);
    event_base_loopbreak(gw->base);
}

/* Second step of the drain: the real last stream id, watchers ended. */
static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_gateway *gw = arg;
    mg_conn *c, *next;
    gw->drain_phase = 2;
    mg_svc_health_close_watchers(gw);
    for (c = gw->conns; c; c = next) {
        next = c->next;
        if (c->ng == NULL) {
            conn_free(c);
            continue;
        }
        nghttp2_submit_goaway(c->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(c->ng), NGHTTP2_NO_ERROR,
                              (const uint8_t *)"shutdown", 8);
        conn_send(c);
    }
    check_drained(gw);
}

void mg_gateway_drain(mg_gateway *gw)
{
    struct timeval rtt = {1, 0};
    struct timeval grace = {(time_t)gw->cfg->grace, 0};
    if (gw->state == MG_STATE_DRAINING) {
        mg_warn("drain_forced", "reason=\"second signal\"");
        grace_cb(-1, 0, gw);
        return;
    }
    gw->state = MG_STATE_DRAINING;
    gw->drain_phase = 1;
    mg_info("draining", "grace_s=%llu", (unsigned long long)gw->cfg->grace);
    mg_svc_health_notify(gw);
    free_listeners(gw); /* stop accepting */
    for (mg_conn *c = gw->conns; c; c = c->next) {
        if (c->ng) {
            nghttp2_submit_shutdown_notice(c->ng);
            conn_schedule_flush(c);
        }
    }
    gw->drain_timer = evtimer_new(gw->base, drain_cb, gw);
    gw->grace_timer = evtimer_new(gw->base, grace_cb, gw);
    if (gw->drain_timer == NULL || gw->grace_timer == NULL) {
        grace_cb(-1, 0, gw);
        return;
    }
    if (gw->cfg->grace < 1)
        rtt.tv_sec = 0;
    evtimer_add(gw->drain_timer, &rtt);
    evtimer_add(gw->grace_timer, &grace);
}
