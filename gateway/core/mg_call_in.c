/*
 * mg_call_in: the request side of a call (see mg_call.c for the answers). The connection layer
 * feeds it headers, body chunks and stream events: the mode is chosen from the headers, the
 * caller admitted (mg_admit.c), a readable route mapped to its method (mg_route.c), the deadline
 * armed, and the body decoded — gRPC frames, a JSON document, or raw messages whose
 * flow-control window stays held until their handler releases them.
 *
 * Loop thread only.
 */
#include "mg_server_int.h"

#include "mg_admit.h"
#include "mg_json.h"
#include "mg_log.h"
#include "mg_pbcheck.h"
#include "mg_route.h"
#include "mg_str.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_call *call = arg;
    char msg[96];
    snprintf(msg, sizeof(msg), "deadline of %.3f s exceeded", (double)call->timeout_ns / 1e9);
    mg_call_end(call, MG_GRPC_DEADLINE_EXCEEDED, msg, 1);
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
    /* Before anything decodes it: protobuf-c would cut a string at a NUL byte. */
    if (mg_pb_check_strings(call->method->in, data, len, m, sizeof(m)) != 0) {
        mg_call_end(call, MG_GRPC_INVALID_ARGUMENT, m, 1);
        return 1;
    }
    if (call->method->on_raw) {
        uint8_t *own = mg_deframer_take(&call->deframer, data);
        if (own == NULL && (own = malloc(len ? len : 1)) != NULL)
            memcpy(own, data, len);
        if (own == NULL) {
            mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
            return 1;
        }
        call->raw_held++;
        call->method->on_raw(call, own, len);
        return mg_call_done(call) ? 1 : 0;
    }
    msg = protobuf_c_message_unpack(call->method->in, NULL, len, data);
    if (msg == NULL) {
        snprintf(m, sizeof(m), "could not decode request message %llu (%zu bytes) as %s",
                 (unsigned long long)call->msgs_in, len, call->method->in->name);
        mg_call_end(call, MG_GRPC_INTERNAL, m, 1);
        return 1;
    }
    if (call->method->kind == MG_RPC_UNARY || call->method->kind == MG_RPC_SERVER_STREAM) {
        if (call->pending) {
            protobuf_c_message_free_unpacked(msg, NULL);
            snprintf(m, sizeof(m), "%s takes exactly one request message, got more",
                     call->method->path);
            mg_call_end(call, MG_GRPC_UNIMPLEMENTED, m, 1);
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
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 1);
        break;
    case MG_DEFRAME_COMPRESSED:
        mg_call_end(call, MG_GRPC_UNIMPLEMENTED,
                    "compressed request messages are not supported; send identity encoding", 1);
        break;
    case MG_DEFRAME_BAD_FLAG:
        mg_call_end(call, MG_GRPC_INTERNAL, "malformed message prefix: flag byte is not 0 or 1", 1);
        break;
    case MG_DEFRAME_NOMEM:
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 1);
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

    /* NUL bytes are let through jansson so that the decoder refuses them naming the field. */
    j = json_loadb(text, len ? len : 2, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (j == NULL) {
        snprintf(err, sizeof(err), "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                 jerr.text);
        mg_call_end(call, MG_GRPC_INVALID_ARGUMENT, err, 0);
        return;
    }
    msg = mg_json_to_message(call->method->in, j, err, sizeof(err));
    json_decref(j);
    if (msg == NULL) {
        mg_call_end(call, MG_GRPC_INVALID_ARGUMENT, err, 0);
        return;
    }
    call->msgs_in = 1;
    deliver(call, msg);
    protobuf_c_message_free_unpacked(msg, NULL);
}

void mg_call_on_request_end(mg_call *call)
{
    char m[256];
    call->remote_closed = 1;
    if (call->submit_pending)
        mg_call_submit_final(call);
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
        mg_call_end(call, MG_GRPC_INTERNAL, m, 1);
        return;
    }
    if (call->method->kind == MG_RPC_UNARY || call->method->kind == MG_RPC_SERVER_STREAM) {
        ProtobufCMessage *msg = call->pending;
        if (msg == NULL) {
            snprintf(m, sizeof(m), "%s takes exactly one request message, got none",
                     call->method->path);
            mg_call_end(call, MG_GRPC_UNIMPLEMENTED, m, 0);
            return;
        }
        call->pending = NULL;
        deliver(call, msg);
        protobuf_c_message_free_unpacked(msg, NULL);
    } else if (call->method->on_half_close) {
        call->method->on_half_close(call);
    }
}

/* The three gates of mg_admit.h, in order: finishes the call and returns 1 when one refuses
 * it; sets call->who when the caller is admitted. */
static int admission(mg_call *call)
{
    mg_conn *conn = call->conn;
    mg_gateway *gw = conn->gw;
    mg_verdict v;
    mg_admit_req r = {.kind = conn->kind,
                      .id = &conn->id,
                      .has_uid = conn->has_uid,
                      .uid = conn->uid,
                      .auth_header = call->auth_header,
                      .bearer_hash = call->bearer_hash,
                      .path = call->path,
                      .open = call->method->open,
                      .peer_only = call->method->peer_only};
    if (mg_admit_peer(gw->cfg, &r, &v) == 0 &&
        mg_admit_caller(gw->cfg, gw->core->auth, &r, &call->who, &v) == 0 &&
        mg_admit_rate(gw->cfg, &gw->core->rates, &r, call->who.tenant, mg_now_mono_ns(), &v) == 0)
        return 0;
    if (v.why == MG_ADMIT_RATE)
        gw->core->stats.rate_refused++;
    else if (v.why == MG_ADMIT_DENIED && !call->method->peer_only)
        gw->core->stats.auth_denied++;
    else if (!call->method->peer_only)
        gw->core->stats.auth_unauthenticated++;
    mg_call_end(call, v.code, v.message, 0);
    return 1;
}

/* A readable route (GET /v1/segments/{id} ...): the call becomes a JSON call of the route's
 * method, its request built from the id and query here and from the body for POST. Returns 1
 * when the path is a readable route (the call is set up or answered), 0 otherwise. */
static int readable_route(mg_call *call)
{
    mg_gateway *gw = call->conn->gw;
    const mg_route *hit;
    mg_route_match m;
    char *s;
    int known;
    json_t *obj;

    switch (mg_route_find(gw->core->routes, gw->core->n_routes, call->verb, call->path, &m)) {
    case MG_ROUTE_NONE:
        return 0;
    case MG_ROUTE_VERB:
        call->mode = MODE_JSON;
        mg_call_end(call, MG_GRPC_UNIMPLEMENTED, "this route does not take that verb", 0);
        return 1;
    default:
        if (m.route->method == NULL)
            return 0; /* a page: answered as the GET it is */
        break;
    }
    call->mode = MODE_JSON;
    hit = m.route;
    call->method = mg_gateway_find_method(gw, hit->method, strlen(hit->method), &known);
    call->body = evbuffer_new();
    obj = json_object();
    if (call->method == NULL || call->body == NULL || obj == NULL) {
        json_decref(obj);
        mg_call_end(call, MG_GRPC_INTERNAL, "route without its method", 0);
        return 1;
    }
    call->method_index = mg_gateway_method_index(gw, call->method);
    gw->core->method_stats[call->method_index].started++;
    if (admission(call)) {
        json_decref(obj);
        return 1;
    }
    if (m.id[0] && json_object_set_new(obj, "id", json_string(m.id)) != 0) {
        json_decref(obj);
        mg_call_end(call, MG_GRPC_INVALID_ARGUMENT, "the path's id is not UTF-8", 0);
        return 1;
    }
    if (m.query) {
        char qerr[256];
        if (mg_route_query(m.query, obj, qerr, sizeof(qerr)) != 0) {
            json_decref(obj);
            mg_call_end(call, MG_GRPC_INVALID_ARGUMENT, qerr, 0);
            return 1;
        }
    }
    if (json_object_size(obj) > 0 && strcmp(hit->verb, "POST") != 0) {
        s = json_dumps(obj, JSON_COMPACT);
        if (s)
            evbuffer_add(call->body, s, strlen(s));
        free(s);
    }
    json_decref(obj);
    return 1;
}

void mg_call_on_headers_end(mg_call *call)
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
        mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 0);
        return;
    }
    if (strncmp(call->path, "/v1/", 4) == 0 && readable_route(call))
        return;
    if (!strcmp(call->verb, "GET") || !strcmp(call->verb, "HEAD")) {
        struct evbuffer *body = evbuffer_new();
        const char *ctype = "text/plain; charset=utf-8";
        int status;
        gw->core->stats.http_requests++;
        if (body == NULL) {
            mg_call_http(call, 500, ctype, "out of memory\n", 14);
            return;
        }
        status = mg_gateway_page(gw, call->path, body, &ctype);
        if (strcmp(call->verb, "HEAD") != 0)
            evbuffer_add_buffer(call->out, body);
        evbuffer_free(body);
        mg_call_http(call, status, ctype, NULL, 0);
        return;
    }
    if (strcmp(call->verb, "POST") != 0) {
        static const char msg[] = "use POST for gRPC and JSON calls, GET for /livez /readyz "
                                  "/metrics\n";
        mg_call_http(call, 405, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
        return;
    }
    if (!is_grpc && !is_json) {
        static const char msg[] = "content-type must be application/grpc (gRPC) or "
                                  "application/json (JSON)\n";
        mg_call_http(call, 415, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
        return;
    }
    call->mode = is_grpc ? MODE_GRPC : MODE_JSON;
    call->method = mg_gateway_find_method(gw, call->path, strlen(call->path), &service_known);
    if (call->method == NULL) {
        gw->core->stats.unknown_method_calls++;
        if (service_known)
            snprintf(m, sizeof(m), "unknown method %s", call->path);
        else
            snprintf(m, sizeof(m), "unknown service in %s", call->path);
        mg_call_end(call, MG_GRPC_UNIMPLEMENTED, m, 0);
        return;
    }
    call->method_index = mg_gateway_method_index(gw, call->method);
    gw->core->method_stats[call->method_index].started++;
    if (admission(call))
        return;
    if (is_grpc && !call->te_trailers) {
        mg_call_end(call, MG_GRPC_INTERNAL, "missing \"te: trailers\" request header", 0);
        return;
    }
    if (call->bad_timeout) {
        mg_call_end(call, MG_GRPC_INTERNAL, "malformed grpc-timeout header", 0);
        return;
    }
    if (is_json && call->method->kind != MG_RPC_UNARY) {
        snprintf(m, sizeof(m), "%s is a streaming method; JSON serves unary methods only",
                 call->path);
        mg_call_end(call, MG_GRPC_UNIMPLEMENTED, m, 0);
        return;
    }
    if (is_json) {
        call->body = evbuffer_new();
        if (call->body == NULL) {
            mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory", 0);
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

/* ------------------------------------------------------------------ stream events */

static void copy_hdr(char *dst, size_t cap, const uint8_t *v, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, v, len);
    dst[len] = '\0';
}

void mg_call_on_header(mg_call *call, const uint8_t *name, size_t namelen, const uint8_t *value,
                       size_t valuelen)
{
    /* Over the limit the call is refused, yet the fields that decide how to answer (mode,
     * content-length: see answer_after_body) are still read; each is a bounded copy. */
    call->header_bytes += namelen + valuelen + 32;
    if (call->header_bytes > call->conn->gw->cfg->max_header_list_bytes)
        call->headers_too_large = 1;
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
    } else if (IS("traceparent")) {
        if (valuelen < sizeof(call->traceparent)) /* longer: not one (the call goes untraced) */
            copy_hdr(call->traceparent, sizeof(call->traceparent), value, valuelen);
    } else if (IS("authorization")) {
        /* Only the token's hash is kept; the token itself is never stored or logged. */
        if (valuelen > 7 && strncasecmp((const char *)value, "bearer ", 7) == 0 &&
            call->auth_header == 0) {
            mg_auth_hash((const char *)value + 7, valuelen - 7, call->bearer_hash);
            call->auth_header = 1;
        } else {
            call->auth_header = -1;
        }
    }
#undef IS
}

/* Request bytes a finished call may still receive before its stream is reset: one default
 * stream window for gRPC (a small request simply ends), one message for JSON and HTTP. */
static uint64_t discard_allowance(const mg_call *call)
{
    return call->mode == MODE_GRPC ? 65535 : call->conn->gw->cfg->max_message_bytes;
}

static void call_data(mg_call *call, const uint8_t *data, size_t len)
{
    if (call->finished) {
        call->discarded += len; /* judged when the frame is complete: mg_call_on_data_frame */
        return;
    }
    if (call->mode == MODE_GRPC) {
        grpc_data(call, data, len);
    } else if (call->mode == MODE_JSON && call->body) {
        if (evbuffer_get_length(call->body) + len > call->conn->gw->cfg->max_message_bytes) {
            char m[160];
            snprintf(m, sizeof(m), "JSON body exceeds the limit of %llu bytes",
                     (unsigned long long)call->conn->gw->cfg->max_message_bytes);
            mg_call_end(call, MG_GRPC_RESOURCE_EXHAUSTED, m, 0);
            return;
        }
        evbuffer_add(call->body, data, len);
    }
}

/* Flow control: the stream's window is given back as its bytes are used, except while the
 * handler holds raw messages (on_raw): then the bytes wait in `withheld` until it released
 * them all, so a client can have at most one window of bytes beyond those messages here. */
void mg_call_on_data(mg_call *call, const uint8_t *data, size_t len)
{
    call_data(call, data, len);
    if (call->raw_held > 0 && !mg_call_done(call))
        call->withheld += len;
    else if (call->conn)
        nghttp2_session_consume_stream(call->conn->ng, call->stream_id, len);
}

void mg_call_release(mg_call *call)
{
    if (call->raw_held == 0)
        return;
    if (--call->raw_held > 0 || call->withheld == 0)
        return;
    if (call->conn && !call->stream_closed) {
        nghttp2_session_consume_stream(call->conn->ng, call->stream_id, call->withheld);
        mg_conn_schedule_flush(call->conn); /* the WINDOW_UPDATE */
    }
    call->withheld = 0;
}

void mg_call_on_data_frame(mg_call *call)
{
    if (!call->finished || call->submit_pending || call->discarded <= discard_allowance(call))
        return;
    /* Answered, yet the client keeps sending: ask it to stop (RFC 9113 8.1), once the answer
     * is out (a reset submitted earlier would cancel it). A request that simply ends is never
     * reset, as curl reports such a reset as an error. */
    if (call->final_sent)
        nghttp2_submit_rst_stream(call->conn->ng, NGHTTP2_FLAG_NONE, call->stream_id,
                                  NGHTTP2_NO_ERROR);
    else
        call->rst_wanted = 1;
}
