/*
 * mg_gateway: the handler API — what the services (gateway/svc) and the ops pages (gateway/ops)
 * use of the daemon's HTTP/2 side: calls, the method and route table they register in, their
 * state slots, and what they read of the gateway. The core's own header is mg_core.h (the
 * daemon's entry point and the ops pages), its internals mg_server_int.h; no service includes
 * either.
 *
 * Threads: everything here runs on the gateway loop thread (one libevent base), which never
 * blocks. Blocking work goes to the engine with mg_engine_submit() and comes back through the
 * loop's completion queue.
 *
 * A call (mg_call) is one HTTP/2 stream carrying one RPC, in one of three modes: gRPC
 * (application/grpc), JSON (application/json, unary methods only) or plain HTTP (GET routes such
 * as /livez). Its handler learns of it through the method's callbacks and answers with
 * mg_call_send() / mg_call_finish(). A call is reference counted: the stream holds one reference
 * until it closes; a handler that answers later (after engine work, on a timer) takes its own
 * with mg_call_ref() and checks mg_call_done() before answering. When the client cancels, the
 * deadline passes or the connection drops, the call is finished for the handler: on_cancel runs
 * once and further sends are dropped.
 */
#ifndef MG_GATEWAY_H
#define MG_GATEWAY_H

#include <event2/event.h>
#include <protobuf-c/protobuf-c.h>
#include <stdint.h>

#include "mg_config.h"
#include "mg_grpc.h"
#include "mg_list.h"
#include "mg_time.h"
#include "moongate/engine.h"
#include "moongate/segment.h"

struct evbuffer;

typedef enum {
    MG_RPC_UNARY,
    MG_RPC_CLIENT_STREAM,
    MG_RPC_SERVER_STREAM,
    MG_RPC_BIDI,
} mg_rpc_kind;

typedef enum { MG_STATE_STARTING, MG_STATE_SERVING, MG_STATE_DRAINING } mg_state;

typedef struct mg_call mg_call;
typedef struct mg_gateway mg_gateway;

typedef struct mg_method {
    const char *path; /* "/package.Service/Method" */
    mg_rpc_kind kind;
    const ProtobufCMessageDescriptor *in;
    const ProtobufCMessageDescriptor *out;
    /* A request message. Unary and server-streaming methods get exactly one, after the client
     * half-closed; streaming-request methods get each as it arrives. The message is freed when
     * the callback returns. */
    void (*on_message)(mg_call *call, const ProtobufCMessage *msg);
    /* Optional, for client-streaming methods that pass their messages to workers: replaces
     * on_message. Each request message arrives undecoded, as its serialized bytes in a malloc'd
     * buffer the handler owns (and frees, on any thread). The handler calls mg_call_release()
     * once per message when it is done with it; until then the stream's flow-control window
     * is not given back, so what a fast client can have queued here is bounded by one window
     * beyond the messages held. */
    void (*on_raw)(mg_call *call, uint8_t *data, size_t len);
    /* Client-streaming and bidi methods: the client sent its last message. */
    void (*on_half_close)(mg_call *call);
    /* The call ended before the handler finished it (cancel, deadline, connection loss,
     * shutdown). Optional. The handler drops what it keeps for the call. */
    void (*on_cancel)(mg_call *call);
    /* Streaming responses: the call's queue drained below half its bound after
     * mg_call_writable() returned 0. Optional; runs from the loop, never inside nghttp2. */
    void (*on_writable)(mg_call *call);
    /* Only peer daemons may call it: a client certificate from --peer-ca (and in --peer-allow),
     * unless the daemon runs with --peer-anonymous. */
    int peer_only;
    /* Any caller, without credentials: health checks and reflection. */
    int open;
} mg_method;

/* A readable route for curl: VERB prefix[/{id}] onto a unary method, answered as JSON. The
 * request message is built from the path's id (field `id`), the query string (?page_size=10)
 * and, for POST, the JSON body. */
typedef struct mg_route {
    const char *verb;   /* "GET", "POST", "DELETE" */
    const char *prefix; /* "/v1/segments" */
    int with_id;        /* the path continues with "/{id}" */
    const char *method; /* "/moongate.v1.Memory/GetSegment" */
} mg_route;

/* A page: plain HTTP for GET and HEAD (/livez, /metrics, the status page), answered alike on the
 * control port and the ops port. It is a route without a method (route.method NULL) in the same
 * table. render writes the body, may change *ctype (preset to "text/plain; charset=utf-8") and
 * returns the HTTP status; path is the request's, query string included. Loop thread. */
typedef struct mg_page {
    mg_route route;
    int (*render)(mg_gateway *gw, const char *path, struct evbuffer *body, const char **ctype);
    int hidden; /* not named in the 404 answer's list of pages (an alias) */
} mg_page;
#define MG_PAGE(path_, render_)                                 \
    {                                                           \
        .route = {"GET", (path_), 0, NULL}, .render = (render_) \
    }

/* A unary method's table entry: path, request and response descriptors, handler. */
#define MG_UNARY(path_, in_, out_, handler_)                               \
    {                                                                      \
        .path = (path_), .kind = MG_RPC_UNARY, .in = (in_), .out = (out_), \
        .on_message = (handler_)                                           \
    }
/* A unary method only peer daemons may call. */
#define MG_PEER_UNARY(path_, in_, out_, handler_)                          \
    {                                                                      \
        .path = (path_), .kind = MG_RPC_UNARY, .in = (in_), .out = (out_), \
        .on_message = (handler_), .peer_only = 1                           \
    }

/* ---- calls: used by handlers ---- */

/* Queues one response message. Returns 0, or -1 when the call is already done (the message is
 * dropped) or the message exceeds --max-message-bytes (the call is finished with
 * RESOURCE_EXHAUSTED). */
int mg_call_send(mg_call *call, const ProtobufCMessage *msg);
/* Non-zero while the call's queued response bytes are below their bound
 * (--max-conn-output-bytes). A streaming handler sends while this holds, then waits for
 * on_writable: that is how a slow reader holds back its producer. */
int mg_call_writable(mg_call *call);
/* Ends the call with a status; the message is printf-formatted (may be NULL). No-op when done. */
void mg_call_finish(mg_call *call, int grpc_code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Queues one response message already framed (5-byte prefix + message) in `frame`, a malloc'd
 * buffer the call takes over and frees once sent: a handler can build large messages on a
 * worker and hand them over without another copy. Returns 0, or -1 when the call is done or the
 * frame is over --max-message-bytes (the buffer is freed either way). gRPC mode only. */
int mg_call_send_framed(mg_call *call, uint8_t *frame, size_t len);
/* The handler is done with one message it got through on_raw (loop thread; also after the
 * call ended). */
void mg_call_release(mg_call *call);
/* The paging arguments of a List method: page_size at most `max`, page_token "" or the 16 hex
 * digits of the last id of the previous page (*after). Returns 0, or -1 after failing the call
 * with INVALID_ARGUMENT naming the bad argument. */
int mg_call_page_args(mg_call *call, uint32_t page_size, const char *token, size_t max,
                      uint64_t *after);
/* mg_call_send + mg_call_finish(OK). */
void mg_call_reply(mg_call *call, const ProtobufCMessage *msg);
/* Ends the call with the status of an MG_ERR_* and a message. */
void mg_call_fail(mg_call *call, int mg_err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Non-zero once the call was finished or cancelled: stop working on it. */
int mg_call_done(const mg_call *call);
void mg_call_ref(mg_call *call);
void mg_call_unref(mg_call *call);
/* One pointer of handler state; the handler frees it (on finish or in on_cancel). */
void mg_call_set_data(mg_call *call, void *data);
void *mg_call_data(const mg_call *call);
mg_gateway *mg_call_gateway(const mg_call *call);

/* A call parked while it waits for something (a lease, a batch, a notification, a state
 * change), in a line its handler keeps: the record the handler keeps for it starts with one.
 * Parking takes a reference and points the call's data at the record, so on_cancel finds it
 * with mg_call_data(); unparking takes it out of its line, clears the data and drops the
 * reference — after finishing the call with grpc_code (>= 0) and message, if asked. */
typedef struct mg_parked {
    mg_list_node node; /* in the handler's line (NULL line: in none) */
    mg_call *call;
} mg_parked;
void mg_call_park(mg_call *call, mg_parked *p, mg_list *line);
void mg_call_unpark(mg_parked *p, int grpc_code, const char *message);
/* Who called: "uid:0 pid:123" on the Unix socket, the address on TCP. */
const char *mg_call_peer(const mg_call *call);
/* The W3C `traceparent` request header as the caller sent it (not checked), or "". */
const char *mg_call_traceparent(const mg_call *call);
/* The caller's verified TLS client certificate identity, or "" without one. */
const char *mg_call_identity(const mg_call *call);
/* The tenant the caller acts for ("" for open and peer-only methods: the peer API names the
 * tenant in its requests). Valid for the call's life. */
const char *mg_call_tenant(const mg_call *call);
/* Non-zero, and *uid set, when the caller is known by the user id the kernel reported for its
 * Unix-socket connection: a `uid` principal of --auth-file, or an anonymous caller on the
 * socket (--allow-anonymous). Zero for token and certificate callers, wherever they connect:
 * their tenant is not the uid's. */
int mg_call_socket_uid(const mg_call *call, uint32_t *uid);
/* Non-zero, with *uid and *proc set, when the call came on the Unix socket and the kernel told
 * who is at the other end (SO_PEERCRED and the process's start time, at connect), whatever
 * principal it was admitted as. proc->pid is 0 for a process the daemon cannot see. */
int mg_call_socket_cred(const mg_call *call, uint32_t *uid, mg_proc *proc);
/* Something a service keeps for as long as the caller's connection lives (an agent): while
 * bound, the connection is never closed for being idle; when it closes, `closed` runs once
 * (after its calls were detached) and the binding is gone. mg_call_bind links b into the
 * connection of the call (0), or returns -1 when the connection is gone. mg_unbind takes it
 * out first (closed does not run); it accepts a binding that is in no connection. */
typedef struct mg_conn_bind {
    mg_list_node node;
    void (*closed)(struct mg_conn_bind *b);
} mg_conn_bind;
int mg_call_bind(mg_call *call, mg_conn_bind *b);
void mg_unbind(mg_conn_bind *b);
/* The id of the call's connection: unique in the daemon's life; 0 once it is gone. */
uint64_t mg_call_conn_id(const mg_call *call);
/* Non-zero when b is bound to the connection of the call. */
int mg_call_bound(const mg_call *call, const mg_conn_bind *b);
/* Non-zero when the caller has the admin role: it may list and revoke every tenant's
 * resources. */
int mg_call_admin(const mg_call *call);
/* Whose resources the caller may see and revoke: its tenant, or NULL (every tenant) for an
 * admin. For lookups, lists and revocations; never for creating or moving bytes. */
const char *mg_call_scope(const mg_call *call);
/* Milliseconds left before the call's deadline, or -1 without one. */
int64_t mg_call_remaining_ms(const mg_call *call);

/* ---- the gateway ---- */

/* What services read of the gateway (loop thread). Set at start and fixed after, but for state
 * (the core moves it) and data_endpoint (the peer service fills it at init). The core's own
 * state is behind `core` (mg_server_int.h), which no service looks into. */
struct mg_gateway {
    struct event_base *base;
    const mg_config *cfg;
    mg_engine *engine;
    mg_engine *io;          /* the transport threads (--io-threads): data-plane jobs of transfers */
    struct mg_rdma *rdma;   /* the RDMA devices, or NULL (rdma_why says why) */
    struct mg_spans *spans; /* sampled trace spans kept for GET /traces (NULL: --trace-spans 0) */
    char rdma_why[300];
    int process_vm;           /* clients' own memory can be reached (moongate/procmem.h) */
    char process_vm_why[300]; /* when not, or only partly, why: read once at start */
    mg_cq *cq;                /* the loop's completion queue: engine jobs come back here */
    mg_state state;
    int memlock; /* --memlock as an mg_memlock: what MEMLOCK_DEFAULT means */
    uint64_t epoch;
    char epoch_hex[17]; /* the epoch as every gRPC answer's moongate-epoch header says it */
    uint64_t start_unix_ms;
    uint64_t start_mono_ns;
    uint64_t open_files_limit;     /* RLIMIT_NOFILE in force (main raises it to the hard limit) */
    struct mg_pools *pools;        /* the buffer pools (engine), or NULL without a pool */
    struct mg_lease_table *leases; /* remote-accessible leases, for the data plane */
    char data_endpoint[160]; /* the data plane's "host:port" ("" without one): the peer service's */
    struct mg_core *core;    /* the core's own */
};

struct mg_service;
/* Service svc's state slot (svc: its descriptor, one of mg_services): where its init keeps
 * what it made, NULL until then. */
void **mg_gateway_state(mg_gateway *gw, const struct mg_service *svc);
/* Registers a method (at start-up). Returns 0, MG_ERR_FULL or MG_ERR_EXISTS. */
int mg_gateway_add_method(mg_gateway *gw, const mg_method *m);
const mg_method *mg_gateway_find_method(const mg_gateway *gw, const char *path, size_t len,
                                        int *service_known);
#define MG_MAX_METHODS 64 /* methods one gateway holds */
/* The registered method i (in registration order), or NULL past the last. */
const mg_method *mg_gateway_method(const mg_gateway *gw, size_t i);
/* Registers a readable route (at start-up). Returns 0 or MG_ERR_FULL. */
int mg_gateway_add_route(mg_gateway *gw, const mg_route *r);
/* Registers a page (at start-up): its route, in the same table. Returns 0 or MG_ERR_FULL. */
int mg_gateway_add_page(mg_gateway *gw, const mg_page *p);
/* A service's table: its n methods, then its nr routes (routes may be NULL). Returns 0 or the
 * first error of mg_gateway_add_method / _add_route. */
int mg_gateway_add_methods(mg_gateway *gw, const mg_method *methods, size_t n,
                           const mg_route *routes, size_t nr);
#define MG_NELEM(a) (sizeof(a) / sizeof((a)[0]))
const char *mg_state_name(mg_state s);

/* mg_metrics.c: histograms of seconds for the services' own /metrics blocks. Writes a
 * histogram of the registration buckets (1 ms .. 10 s) with its HELP and TYPE lines. */
void mg_metrics_render_seconds(struct evbuffer *out, const char *name, const char *help,
                               const uint64_t buckets[12], uint64_t count, double sum);
/* One observation into a histogram of the registration buckets (for mg_metrics_render_seconds). */
void mg_metrics_observe_seconds(uint64_t buckets[12], double *sum, double seconds);

#endif
