/*
 * moongate TCP data plane: the transport that moves segment bytes between daemons.
 *
 * The receiving daemon runs a server: a listener and one thread per connection (bounded by
 * max_conns), blocking I/O. A connection starts with HELLO carrying a session token, which the
 * daemon's auth callback maps to the initiating tenant; then the peer sends WRITE slices (the
 * payload is read straight into the destination range once the target, its remote
 * accessibility, the tenant and the bounds are checked; WRITE_ACK only after the bytes are in
 * place) and READ requests (answered READ_DATA with a status, then the bytes). A refused slice
 * is answered with its status and the stream stays usable; a malformed frame ends the
 * connection. See moongate/dataframe.h for the frames.
 *
 * The sending side is a connection object with blocking calls that keep up to `window` slices
 * in flight. A slice flagged MG_DF_LEASE is aimed at a lease the target daemon published as
 * remote-accessible (moongate/lease_table.h); its bounds are the lease's requested length.
 */
#ifndef MOONGATE_DATAPLANE_H
#define MOONGATE_DATAPLANE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "moongate/dataframe.h"
#include "moongate/lease_table.h"
#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_dp_server mg_dp_server;

/* Room for a TCP congestion control's name and its NUL (the kernel's TCP_CA_NAME_MAX). */
#define MG_DP_CONGESTION_MAX 16
typedef struct mg_dp_conn mg_dp_conn;

/* How the data plane sets up its TCP connections (both those it opens and those it accepts). */
#define MG_DP_SEND_BUFFER_AUTO UINT32_MAX
#define MG_DP_SEND_BUFFER_MIN  (512u * 1024u) /* what auto bounds a queue to at least */
typedef struct mg_dp_tcp {
    /* TCP congestion control (TCP_CONGESTION), shorter than MG_DP_CONGESTION_MAX; NULL or "":
     * the system's. */
    const char *congestion;
    /* Bytes a connection may hold queued to send (SO_SNDBUF as the kernel counts it, twice the
     * figure set), fixed once its HELLO is answered. 0: the kernel's autotuning.
     * MG_DP_SEND_BUFFER_AUTO: where the connection's congestion control paces it (BBR), twice
     * what 100 Gbit/s fills over its smoothed RTT and at least MG_DP_SEND_BUFFER_MIN, unless
     * that is past autotuning's own ceiling (net.ipv4.tcp_wmem) or, without CAP_NET_ADMIN,
     * past twice net.core.wmem_max; elsewhere autotuning. */
    uint32_t send_buffer;
} mg_dp_tcp;

/* Maps a session token to the tenant it was issued to (tenant: MG_SEG_NAME_MAX + 1 bytes).
 * Returns 0, or MG_ERR_AUTH for an unknown or expired token. Runs on connection threads. */
typedef int (*mg_dp_auth_fn)(void *arg, const uint8_t token[MG_DF_TOKEN_BYTES], char *tenant);

typedef struct mg_dp_server_config {
    const char *host; /* address to listen on, e.g. "127.0.0.1" or "::" */
    int port;         /* 0: any free port (mg_dp_server_port tells) */
    mg_registry *registry;
    mg_lease_table *leases; /* remote-accessible leases; NULL: slices aimed at leases are refused */
    uint32_t max_slice;     /* largest payload accepted */
    unsigned max_conns;
    uint32_t io_timeout_ms; /* a slice's payload must keep arriving within it */
    mg_dp_tcp tcp;          /* of the connections it accepts */
    mg_dp_auth_fn auth;
    void *auth_arg;
} mg_dp_server_config;

typedef struct mg_dp_server_stats {
    uint64_t conns_total, conns_active, conns_refused;
    uint64_t accept_pauses; /* times accepting paused: no descriptor to spare */
    uint64_t slices_in, slices_out, slices_refused;
    uint64_t bytes_in, bytes_out;
} mg_dp_server_stats;

/* Whether this process may give its TCP connections the congestion control `name` (NULL or "":
 * the system's, always). Returns 0, or MG_ERR_INVALID with why in err (naming the ones this
 * kernel has and those any process may choose). */
int mg_dp_congestion_check(const char *name, char *err, size_t errcap);

/* Starts listening. Returns 0, or an MG_ERR_* with the reason in err (MG_ERR_INVALID for a
 * congestion control this kernel lacks or does not let this process choose). The connections
 * it accepts inherit the listener's congestion control. */
int mg_dp_server_start(mg_dp_server **out, const mg_dp_server_config *cfg, char *err,
                       size_t errcap);
int mg_dp_server_port(const mg_dp_server *s);
/* The TCP congestion control its connections use (what the listener has: the configured one, or
 * else the system's), or "unknown". */
void mg_dp_server_congestion(const mg_dp_server *s, char name[MG_DP_CONGESTION_MAX]);
void mg_dp_server_get_stats(mg_dp_server *s, mg_dp_server_stats *out);
/* Tests (Debug/CorruptSlices): the next n checksummed slices served are corrupted — a WRITE's
 * landed bytes get one flipped before they are checked, a READ answer a wrong CRC32C. */
void mg_dp_server_corrupt(mg_dp_server *s, uint32_t n);
/* Closes the listener and every connection and joins their threads. Accepts NULL. */
void mg_dp_server_stop(mg_dp_server *s);

/* Connects to a peer's data plane and presents the session token. Returns 0, or MG_ERR_UNAVAILABLE
 * (cannot connect, or no answer within timeout_ms: err names the peer and why),
 * MG_ERR_AUTH (token refused), MG_ERR_PROTOCOL, or MG_ERR_INVALID (the congestion control
 * cannot be set). `tcp`: how the connection is set up (NULL: the system's ways). `stop` (may
 * be NULL) as in mg_dp_options. */
int mg_dp_connect(mg_dp_conn **out, const char *host, int port,
                  const uint8_t token[MG_DF_TOKEN_BYTES], uint32_t timeout_ms, const mg_dp_tcp *tcp,
                  const int *stop, char *err, size_t errcap);
void mg_dp_close(mg_dp_conn *c);

/* Idle connections to one peer's data plane, for the workers to take and give back: at most
 * `max` (<= MG_DP_POOL_MAX) are kept, more are closed. Any thread; the lock is held for O(1). */
#define MG_DP_POOL_MAX 32
typedef struct mg_dp_pool {
    pthread_mutex_t lock;
    mg_dp_conn *idle[MG_DP_POOL_MAX];
    unsigned n, max;
} mg_dp_pool;

void mg_dp_pool_init(mg_dp_pool *p, unsigned max);
/* An idle connection (the one given back last), or NULL. */
mg_dp_conn *mg_dp_pool_take(mg_dp_pool *p);
/* Keeps c for the next taker, or closes it when `max` are idle already. Accepts NULL. */
void mg_dp_pool_give(mg_dp_pool *p, mg_dp_conn *c);
/* How many are idle now. */
unsigned mg_dp_pool_idle(mg_dp_pool *p);
/* Closes every idle connection (the peer restarted: they lead nowhere). */
void mg_dp_pool_clear(mg_dp_pool *p);
/* Closes them and destroys the lock. */
void mg_dp_pool_free(mg_dp_pool *p);

typedef struct mg_dp_options {
    uint32_t slice_bytes; /* 0: 1 MiB */
    unsigned window;      /* slices in flight; 0: 16 */
    int crc;              /* CRC32C per slice */
    int lease;            /* `target` is a remote-accessible lease's id, not a segment's */
    /* Optional. Another thread sets *stop (atomically) to an MG_ERR_* to end the transfer: it
     * is seen within 100 ms even while the peer is silent, and the call returns that code; the
     * connection is then out of step and must be closed. */
    const int *stop;
    /* Optional: bytes confirmed so far are added here (atomically) as slices complete. */
    uint64_t *progress;
    /* Optional: slices sent and not yet answered, counted here (atomically; shared). */
    int64_t *in_flight;
} mg_dp_options;

/* Copies `len` bytes from `buf` to [offset, offset + len) of the peer's segment `target`.
 * Returns 0 once every slice was acknowledged as in place, or the first failure's MG_ERR_* with
 * err naming the slice and the peer's reason (slices before it may have landed). A peer that
 * takes or answers nothing for the connection's timeout is MG_ERR_UNAVAILABLE ("timed out").
 * After a refused slice (NOT_FOUND, PERMISSION, RANGE, DATA_LOSS) the connection stays usable;
 * after any other failure close it. */
int mg_dp_write(mg_dp_conn *c, uint64_t target, uint64_t offset, const void *buf, uint64_t len,
                const mg_dp_options *o, char *err, size_t errcap);
/* Copies [offset, offset + len) of the peer's segment `target` into `buf`. */
int mg_dp_read(mg_dp_conn *c, uint64_t target, uint64_t offset, void *buf, uint64_t len,
               const mg_dp_options *o, char *err, size_t errcap);

/* Local memory this process does not map (a client process's, reached with process_vm; GPU
 * memory its process stages): the op's bytes [off, off + n) are copied out of it with get and
 * into it with put. Each returns 0, or an MG_ERR_* with why. Optional, ahead: a WRITE's next
 * slice, [off, off + n), said while this one goes, so that memory slow to reach can start
 * fetching it (a hint: get is called for it all the same). */
typedef struct mg_dp_access {
    int (*get)(void *ctx, uint64_t off, void *dst, size_t n, char *why, size_t cap);
    int (*put)(void *ctx, uint64_t off, const void *src, size_t n, char *why, size_t cap);
    void *ctx;
    void (*ahead)(void *ctx, uint64_t off, size_t n);
} mg_dp_access;

/* One transfer of several run together on a connection (mg_dp_run). */
typedef struct mg_dp_op {
    int write;       /* 1: buf -> the peer; 0: the peer -> buf */
    int lease;       /* target is a remote-accessible lease's id */
    uint64_t target; /* segment or lease id on the peer */
    uint64_t offset; /* in the target */
    uint8_t *buf;
    /* Optional, instead of buf: the local memory's own access. A WRITE's payloads are copied
     * out with get into the connection's stage as their slices are framed, side by side, and
     * go from there; a READ's answers come through the stage and are copied in with put. The
     * window stays full meanwhile. A get or put that fails fails this op alone, with its code
     * and why (a READ's payload is still taken off the stream). */
    const mg_dp_access *access;
    uint64_t len;
    uint64_t *progress; /* optional: bytes confirmed are added here (atomically) */
    char *err;          /* why it failed, errcap bytes */
    size_t errcap;
    /* results */
    int rc;            /* 0, or the MG_ERR_* it failed with */
    uint64_t done;     /* bytes confirmed */
    uint64_t slices;   /* how many it was cut into */
    uint64_t answered; /* how many the peer answered */
} mg_dp_op;

/* Runs `n` transfers on c as one stream of slices: up to o->window in flight across all of
 * them, each op's slices in order, answers matched in order. A refused slice fails its op
 * alone (rc, err; it sends no more), the others go on. Returns 0 when the stream stayed in
 * step (c can be reused; each op has its own rc), or the MG_ERR_* of a failure of the
 * connection itself — or of o->stop — which every op not finished takes too (then close c).
 * o->lease and o->progress are taken from each op. */
int mg_dp_run(mg_dp_conn *c, mg_dp_op *ops, size_t n, const mg_dp_options *o);

/* ---- sessions: the tokens this daemon gave peers (Peer/OpenSession) ----
 *
 * The loop issues a random token per session, bound to a tenant and valid for a TTL; the data
 * plane's connection threads check the token a peer sends in HELLO (mg_dp_server_config.auth =
 * mg_dp_sessions_auth, auth_arg = the table). Thread-safe: one mutex, scans of at most `max`
 * entries. */
typedef struct mg_dp_sessions mg_dp_sessions;

/* A table of at most `max` live sessions. Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_dp_sessions_new(mg_dp_sessions **out, size_t max);
/* Accepts NULL. */
void mg_dp_sessions_del(mg_dp_sessions *t);
/* A new session of `tenant` valid until now_ms + ttl_ms: its token (random) into `token`.
 * Expired sessions go first. Returns 0, MG_ERR_FULL (max live sessions) or MG_ERR_SYSTEM (no
 * random bytes). */
int mg_dp_sessions_add(mg_dp_sessions *t, const char *tenant, uint64_t now_ms, uint64_t ttl_ms,
                       uint8_t token[MG_DF_TOKEN_BYTES]);
/* The session of `token` live at now_ms: its tenant (MG_SEG_NAME_MAX + 1 bytes; may be NULL)
 * and expiry (may be NULL). Returns 0 or MG_ERR_AUTH. */
int mg_dp_sessions_find(mg_dp_sessions *t, const uint8_t token[MG_DF_TOKEN_BYTES], uint64_t now_ms,
                        char *tenant, uint64_t *expires_ms);
/* mg_dp_server_config.auth over a table (`arg`), at the monotonic time now. */
int mg_dp_sessions_auth(void *arg, const uint8_t token[MG_DF_TOKEN_BYTES], char *tenant);

/* The MG_ERR_* for a gRPC status code a peer answered with. */
int mg_dp_status_err(uint32_t grpc_status);

#ifdef __cplusplus
}
#endif

#endif
