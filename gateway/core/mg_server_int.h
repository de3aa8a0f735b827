/*
 * mg_server_int: what the core's own files (gateway/core) share and nothing else sees: the
 * gateway's own state (struct mg_core), the connection and call structures, and the functions
 * that pass a request from the connection layer (mg_conn.c: sockets, TLS, nghttp2) to the call
 * layer (mg_call.c: routing, gRPC/JSON/HTTP answers) and back. Neither the services nor the ops
 * pages include it. All of it runs on the gateway loop thread.
 */
#ifndef MG_SERVER_INT_H
#define MG_SERVER_INT_H

#include "mg_auth.h"
#include "mg_core.h"
#include "mg_gateway.h"
#include "mg_list.h"
#include "mg_tls.h"

#include <nghttp2/nghttp2.h>

struct bufferevent;
struct mg_agents;

#define MG_MAX_ROUTES 48

/* The gateway's own state, behind gw->core: what services do not see. */
typedef struct mg_core mg_core;
struct mg_core {
    struct event *cq_event;
    void *ssl_ctx;        /* SSL_CTX, NULL when TLS is off; swapped when its files change */
    struct mg_auth *auth; /* --auth-file's principals (NULL: none); swapped when it changes */
    struct mg_reload *reload;
    struct mg_rates *rates; /* --tenant-rate limiters (mg_admit.c) */
    uint64_t conns_opened;  /* the last connection's id (mg_call_conn_id) */

    const mg_route *routes[MG_MAX_ROUTES]; /* readable routes and pages */
    size_t n_routes;
    const mg_method *methods[MG_MAX_METHODS];
    size_t method_len[MG_MAX_METHODS]; /* strlen of each method's path */
    mg_method_stats method_stats[MG_MAX_METHODS];
    size_t n_methods;
    mg_gateway_stats stats; /* its counters; the rest is filled by mg_gateway_get_stats */

    struct mg_listener *listeners;    /* control-port listeners */
    struct evconnlistener *others[8]; /* others on the loop (mg_gateway_add_listener) */
    size_t n_others;
    mg_list conns;                      /* all open connections (mg_conn.link) */
    struct mg_fdsock *fdsock;           /* the fd socket (mg_fdsock.h), or NULL */
    struct mg_shared *shared;           /* what the core makes for every service (mg_shared.c) */
    struct mg_agentfile *agentfile;     /* the agents' state file (mg_agentfile.c) */
    struct mg_exit_watch *exit_watches; /* segments released when nobody holds them */
    unsigned starting_jobs;             /* start-up work (the pools) before the daemon may serve */
    int serve_wanted;                   /* mg_gateway_set_serving() was called */
    unsigned char started[16];          /* services whose init ran, by index in mg_services */
    void *service_state[16]; /* each service's own state, by the same index (mg_gateway_state) */

    struct event *drain_timer;
    struct event *grace_timer;
    int drain_phase;          /* 0 none, 1 notice sent, 2 final GOAWAY sent */
    uint64_t conn_reads;      /* reads that delivered bytes from a connection: --busy-poll-us */
    int accept_paused;        /* listeners disabled for want of descriptors (mg_conn.c) */
    int accept_episode;       /* paused since the last accept that succeeded */
    int accept_logged;        /* the episode's accept_paused line was written */
    uint64_t accept_pause_ns; /* when the episode began */
    uint64_t accept_warn_ns;  /* the last accept_failed line */
    struct event *accept_timer;
    int exit_code;
};

typedef enum { CONN_TLS = 0, CONN_H2C = 1, CONN_UNIX = 2 } conn_kind;
extern const char *const mg_conn_kind_names[];

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
    struct evbuffer *stage; /* output written straight to the socket (h2c, unix); mg_bev.h */
    nghttp2_session *ng;
    conn_kind kind;
    uint64_t serial; /* gw->conns_opened when it opened */
    char peer[128];
    mg_tls_id id; /* TLS: the client certificate, once the handshake is done */
    int has_uid;  /* Unix socket: the kernel told the caller's user id and process id */
    uint32_t uid;
    mg_proc proc;        /* the process (pid 0: in a pid namespace the daemon cannot see) */
    struct event *timer; /* handshake, then idle */
    struct event *flush_ev;
    struct event *read_ev; /* h2c and unix: the socket read directly (conn_plain_read_cb) */
    unsigned nstreams;
    int got_frame;
    int read_paused;
    int in_send;
    int send_capped; /* send_cb stopped at --max-conn-output-bytes in this send */
    mg_call *calls;
    mg_list binds;     /* what services bound to the connection (mg_call_bind) */
    mg_list_node link; /* in gw->conns */
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
    char traceparent[128];                 /* the `traceparent` header as sent, or "" */
    int auth_header;                       /* 0 none, 1 a bearer token (hashed), -1 malformed */
    uint8_t bearer_hash[MG_AUTH_HASH_LEN]; /* SHA-256 of the bearer token */
    mg_principal who;                      /* the caller, once auth_gate let it in */
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
    int final_sent;    /* our END_STREAM frame went out */
    int rst_wanted;    /* reset the stream once final_sent (client kept sending) */
    unsigned raw_held; /* on_raw messages the handler has not released */
    size_t withheld;   /* stream window held back while raw_held > 0 */
    void *data;
    struct mg_call *next, *prev;
};

/* ---- mg_call.c: the call layer, driven by the connection's nghttp2 callbacks ---- */

/* A new request stream: the call, linked into the connection's list. NULL when out of memory. */
mg_call *mg_call_open(mg_conn *conn, int32_t stream_id);
/* mg_call.c, for mg_call_in.c: ends the call with code and message (on_cancel runs when
 * cancel_handler is set); answers a plain HTTP request; submits the final frames. */
void mg_call_end(mg_call *call, int code, const char *msg, int cancel_handler);
void mg_call_http(mg_call *call, int status, const char *ctype, const char *body, size_t len);
void mg_call_submit_final(mg_call *call);
/* One request header field (request trailers are not passed). */
void mg_call_on_header(mg_call *call, const uint8_t *name, size_t namelen, const uint8_t *value,
                       size_t valuelen);
/* The request headers are complete: route the call. */
void mg_call_on_headers_end(mg_call *call);
/* A chunk of request body. */
void mg_call_on_data(mg_call *call, const uint8_t *data, size_t len);
/* A request DATA frame without END_STREAM is complete. */
void mg_call_on_data_frame(mg_call *call);
/* The client half-closed (END_STREAM). */
void mg_call_on_request_end(mg_call *call);
/* Our last frame (END_STREAM) of the call went out. */
void mg_call_on_final_sent(mg_call *call);
/* The stream is gone: unlink the call, cancel it for its handler if unfinished, drop the
 * stream's reference. */
void mg_call_detach(mg_call *call, const char *why);

/* ---- mg_conn.c: connections and listeners ---- */

/* Sends queued frames soon, from a deferred event (never inside nghttp2). Accepts NULL. */
void mg_conn_schedule_flush(mg_conn *conn);
/* Hands queued frames to the socket now. Returns -1 when the connection was freed. */
int mg_conn_send(mg_conn *conn);
void mg_conn_free(mg_conn *conn);
/* Listeners: control-port TLS, h2c TCP (loopback unless allowed) and the Unix socket. */
int mg_listeners_add(mg_gateway *gw, conn_kind kind, const char *list);
int mg_listener_add_unix(mg_gateway *gw, const char *path);
/* A Unix socket's path: a stale socket there removed (any other file: MG_ERR_EXISTS), and once
 * bound, given --unix-socket-group and --unix-socket-mode (MG_ERR_SYSTEM when the group cannot
 * be). `what` names the socket in the log ("unix", "fd_socket"). */
int mg_unix_path_clear(const char *path, const char *what);
int mg_unix_path_own(mg_gateway *gw, const char *path, const char *what);
void mg_listeners_free(mg_gateway *gw);
/* The process behind a Unix-socket connection: its pid (SO_PEERCRED) and start time. Returns 0
 * with *uid and *proc set (pid 0 when the kernel names none), or -1. */
int mg_unix_peer(int fd, uint32_t *uid, mg_proc *proc);

/* ---- mg_gateway.c ---- */

/* The index of a registered method (metrics), or -1. */
int mg_gateway_method_index(const mg_gateway *gw, const mg_method *m);
/* Ends the event loop once a drain has closed every connection. */
void mg_gateway_check_drained(mg_gateway *gw);
/* mg_release.c: drops the release watches (after every service's free; nothing is released). */
void mg_release_free(mg_gateway *gw);

/* ---- mg_reload.c ---- */

/* Reads --auth-file (a bad file fails start-up, after logging why) and checks it and the TLS
 * files every --reload-interval seconds, swapping in what changed and loads. */
int mg_reload_start(mg_gateway *gw);
void mg_reload_free(mg_gateway *gw);

/* ---- mg_shared.c: what the core makes for every service (mg_service.h) ---- */

/* Before any service's init: the agents, then the peer front. Returns 0 or an MG_ERR_*
 * (logged where the configuration is at fault). */
int mg_shared_new(mg_gateway *gw);
/* Before any service's free: the peer front takes no more work and drops later answers; the
 * jobs that came back and the calls waiting on its channels end here. */
void mg_shared_close(mg_gateway *gw);
/* After every service's free. Accepts a gateway without them. */
void mg_shared_free(mg_gateway *gw);

/* ---- mg_agentfile.c: the agents' state file (<shm-dir>/.moongate.agents) ---- */

/* After the agents are made, before the loop serves: reads the file the daemon before this one
 * left and holds its agents' ports for --agent-port-hold seconds (what cannot be read is
 * logged and ignored). Returns 0 or MG_ERR_NOMEM. */
int mg_agentfile_new(mg_gateway *gw, struct mg_agents *agents);
/* A drain began: the file keeps what it says now (a change not written yet still is). */
void mg_agentfile_drain(mg_gateway *gw);
/* The gateway is going: nothing more is written (a write in flight still comes back). */
void mg_agentfile_close(mg_gateway *gw);
/* After every job came back. Accepts a gateway without one. */
void mg_agentfile_free(mg_gateway *gw);

#endif
