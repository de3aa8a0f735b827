/*
 * mg_call: the call layer. A call is one request stream in one of three modes — gRPC
 * (application/grpc), JSON (application/json on a unary method's path) or plain HTTP (GET
 * routes) — routed to a method's handler, which answers through the mg_call_* API of
 * mg_gateway.h. The connection layer (mg_conn.c) feeds it headers, body chunks and stream
 * events, which mg_call_in.c turns into a request; this file holds the handler API and decides
 * what the client sees, submitting it to nghttp2.
 *
 * Loop thread only. Invariants:
 *  - a call is on its connection's list while its stream is open; the stream holds a reference;
 *  - a finished call never sends again; its handler's on_cancel runs at most once;
 *  - the trailers of a gRPC response are submitted from the data source callback after the last
 *    queued message, so they never overtake DATA (nghttp2 issue #269);
 *  - a call finished before its request ended is reset (RST_STREAM NO_ERROR) only when the
 *    client keeps sending after it, and only after the answer went out (nghttp2 drops frames
 *    still queued for a stream it resets); a request that simply ends is never reset.
 */
#include "mg_server_int.h"

#include "mg_json.h"
#include "mg_log.h"
#include "mg_str.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ calls */

mg_call *mg_call_open(mg_conn *conn, int32_t stream_id)
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

void mg_call_park(mg_call *call, mg_parked *p, mg_list *line)
{
    p->call = call;
    mg_call_ref(call);
    call->data = p;
    if (line)
        mg_list_push_back(line, &p->node);
}

void mg_call_unpark(mg_parked *p, int grpc_code, const char *message)
{
    mg_call *call = p->call;
    if (mg_list_linked(&p->node))
        mg_list_remove(&p->node);
    call->data = NULL;
    if (grpc_code >= 0)
        mg_call_finish(call, grpc_code, "%s", message ? message : "");
    mg_call_unref(call);
}

mg_gateway *mg_call_gateway(const mg_call *call)
{
    return call->conn ? call->conn->gw : NULL;
}

const char *mg_call_peer(const mg_call *call)
{
    return call->conn ? call->conn->peer : "gone";
}

const char *mg_call_traceparent(const mg_call *call)
{
    return call->traceparent;
}

const char *mg_call_identity(const mg_call *call)
{
    if (call->conn == NULL || call->conn->id.state != MG_TLS_ID_VERIFIED)
        return "";
    return call->conn->id.name;
}

const char *mg_call_tenant(const mg_call *call)
{
    return call->who.tenant;
}

int mg_call_socket_uid(const mg_call *call, uint32_t *uid)
{
    const mg_conn *conn = call->conn;
    if (conn->kind != CONN_UNIX || !conn->has_uid || call->who.how == NULL ||
        (strcmp(call->who.how, "uid") != 0 && strcmp(call->who.how, "anonymous") != 0))
        return 0;
    *uid = conn->uid;
    return 1;
}

int mg_call_socket_cred(const mg_call *call, uint32_t *uid, mg_proc *proc)
{
    const mg_conn *conn = call->conn;
    if (conn == NULL || conn->kind != CONN_UNIX || !conn->has_uid)
        return 0;
    *uid = conn->uid;
    *proc = conn->proc;
    return 1;
}

int mg_call_bind(mg_call *call, mg_conn_bind *b)
{
    if (call->conn == NULL)
        return -1;
    mg_list_push_back(&call->conn->binds, &b->node);
    return 0;
}

uint64_t mg_call_conn_id(const mg_call *call)
{
    return call->conn ? call->conn->serial : 0;
}

int mg_call_bound(const mg_call *call, const mg_conn_bind *b)
{
    if (call->conn == NULL)
        return 0;
    for (const mg_list_node *n = call->conn->binds.next; n != &call->conn->binds; n = n->next) {
        if (n == &b->node)
            return 1;
    }
    return 0;
}

void mg_unbind(mg_conn_bind *b)
{
    if (mg_list_linked(&b->node))
        mg_list_remove(&b->node);
}

int mg_call_admin(const mg_call *call)
{
    return call->who.admin;
}

const char *mg_call_scope(const mg_call *call)
{
    return call->who.admin ? NULL : call->who.tenant;
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
        size_t clen = 0;
        unsigned st = (unsigned)call->status; /* 0..16 */
        if (st >= 10)
            code[clen++] = (char)('0' + st / 10 % 10);
        code[clen++] = (char)('0' + st % 10);
        code[clen] = '\0';
        trailers[0] =
            (nghttp2_nv){(uint8_t *)"grpc-status", (uint8_t *)code, 11, clen, NGHTTP2_NV_FLAG_NONE};
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
    /* moongate-epoch: a client that reconnected on its own learns that the daemon restarted */
    nghttp2_nv hdrs[] = {NV(":status", status), NV("content-type", ctype),
                         NV("grpc-accept-encoding", "identity"),
                         NV("moongate-epoch", call->conn->gw->epoch_hex)};
    size_t n = call->mode == MODE_GRPC ? 4 : 2;
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
    mg_conn_schedule_flush(call->conn);
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
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 1);
        return -1;
    }
    if (call->mode == MODE_JSON) {
        json_t *j = mg_json_from_message(msg);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        if (s == NULL) {
            mg_call_end(call, MG_GRPC_INTERNAL, "could not encode the response as JSON", 1);
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
            mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
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

static void free_frame(const void *data, size_t len, void *arg)
{
    free(arg);
}

int mg_call_send_framed(mg_call *call, uint8_t *frame, size_t len)
{
    if (mg_call_done(call) || call->mode != MODE_GRPC || len < MG_GRPC_PREFIX_LEN) {
        free(frame);
        return -1;
    }
    if (len - MG_GRPC_PREFIX_LEN > call->conn->gw->cfg->max_message_bytes) {
        free(frame);
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "response message over the limit", 1);
        return -1;
    }
    if (evbuffer_add_reference(call->out, frame, len, free_frame, frame) != 0) {
        free(frame);
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
        return -1;
    }
    call->msgs_out++;
    if (!call->headers_sent)
        submit_with_body(call, "200", "application/grpc");
    resume(call);
    return 0;
}

const double mg_call_seconds_le[12] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                       0.01,   0.025,   0.05,   0.1,   0.5,    1.0};

/* A finished call in its method's figures: its status code, and its latency. */
static void count_call(mg_gateway *gw, int idx, int code, double seconds)
{
    mg_method_stats *s;
    if (idx < 0 || (size_t)idx >= gw->core->n_methods)
        return;
    s = &gw->core->method_stats[idx];
    if (code < 0 || code >= MG_GRPC_CODE_COUNT)
        code = MG_GRPC_UNKNOWN;
    s->handled[code]++;
    s->seconds_sum += seconds;
    for (int b = 0; b < 12; b++) {
        if (seconds <= mg_call_seconds_le[b])
            s->buckets[b]++;
    }
}

static void access_log(mg_call *call)
{
    mg_gateway *gw = call->conn ? call->conn->gw : NULL;
    double secs = (double)(mg_now_mono_ns() - call->start_ns) / 1e9;
    char msg[256], peer[160], path[300];
    if (gw && call->method_index >= 0)
        count_call(gw, call->method_index, call->status, secs);
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
void mg_call_submit_final(mg_call *call)
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
            nghttp2_nv hdrs[5] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                                  NV("moongate-epoch", call->conn->gw->epoch_hex),
                                  NV("grpc-status", "0"), NV("grpc-message", "")};
            size_t n = 4;
            snprintf(codebuf, sizeof(codebuf), "%d", call->status);
            hdrs[3].value = (uint8_t *)codebuf;
            hdrs[3].valuelen = strlen(codebuf);
            if (call->message && *call->message) {
                mg_pct_encode(pct, sizeof(pct), call->message, strlen(call->message));
                hdrs[4].value = (uint8_t *)pct;
                hdrs[4].valuelen = strlen(pct);
                n = 5;
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
    mg_conn_schedule_flush(call->conn);
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
void mg_call_end(mg_call *call, int code, const char *msg, int cancel_handler)
{
    if (call->finished)
        return;
    call->finished = 1;
    call->status = code;
    free(call->message);
    call->message = msg ? strdup(msg) : NULL;
    if (call->deadline)
        event_del(call->deadline);
    if (call->withheld > 0 && call->conn && !call->stream_closed) {
        /* No message is waited for any more: let what the client still sends flow (and be
         * discarded). */
        nghttp2_session_consume_stream(call->conn->ng, call->stream_id, call->withheld);
        call->withheld = 0;
    }

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
            mg_call_submit_final(call);
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
    mg_call_end(call, code, msg, 0);
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
        mg_call_end(call, mg_err_grpc(err), msg, 0);
}

int mg_call_page_args(mg_call *call, uint32_t page_size, const char *token, size_t max,
                      uint64_t *after)
{
    char *end;
    *after = 0;
    if (page_size > max) {
        mg_call_fail(call, MG_ERR_INVALID, "page_size %u is above %zu", page_size, max);
        return -1;
    }
    if (token == NULL || token[0] == '\0')
        return 0;
    *after = strtoull(token, &end, 16);
    if (*end != '\0' || strlen(token) != 16) {
        mg_call_fail(call, MG_ERR_INVALID, "page_token \"%.32s\" is not one this daemon gave",
                     token);
        return -1;
    }
    return 0;
}

void mg_call_reply(mg_call *call, const ProtobufCMessage *msg)
{
    if (mg_call_send(call, msg) == 0)
        mg_call_end(call, MG_GRPC_OK, NULL, 0);
}

/* Plain HTTP answer (GET routes, 415, 405): headers and a body, then END_STREAM. */
void mg_call_http(mg_call *call, int status, const char *ctype, const char *body, size_t len)
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
        mg_call_submit_final(call);
    access_log(call);
}

void mg_call_on_final_sent(mg_call *call)
{
    call->final_sent = 1;
    if (call->rst_wanted && !call->remote_closed)
        nghttp2_submit_rst_stream(call->conn->ng, NGHTTP2_FLAG_NONE, call->stream_id,
                                  NGHTTP2_NO_ERROR);
}

/* The stream is gone: detach the call, cancelling it for its handler if it was not finished. */
void mg_call_detach(mg_call *call, const char *why)
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
        conn->gw->core->stats.streams_active--;
    }
    if (!call->finished) {
        call->stream_closed = 1;
        mg_call_end(call, MG_GRPC_CANCELLED, why, 1);
    }
    call->stream_closed = 1;
    call->conn = NULL;
    mg_call_unref(call);
}
