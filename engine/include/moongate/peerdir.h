/*
 * moongate peer directory: the peers a daemon's batches move bytes with, one entry per peer
 * control endpoint and tenant, and the machine that starts each request toward its peer.
 *
 * An entry's data-plane session:
 *
 *   NONE --open_session--> OPENING --mg_peerdir_opened--> OPEN --expires, token refused--> NONE
 *                              \--mg_peerdir_failed--> FAILED (its waiting requests fail by name;
 *                                                      the next request asks again)
 *
 * Requests wait in their entry (mg_batch_req.wait) until its session is open, then join its
 * line of the transfer scheduler (moongate/xfer.h), which the directory owns. When both daemons
 * have RDMA devices the first request after a session opens waits while the queue pairs are set
 * up: a worker creates ours, the front hands them to the peer (Peer/ConnectRdma) and brings
 * back the peer's, a worker connects them. Requests then move over RDMA; a failure on the way
 * leaves the peer on TCP, with the reason in rdma_why, until a request after a backoff (1 s,
 * doubling to 60 s) or the next session tries again (a peer that restarted may not have been
 * ready; GPU memory has no other path). A connection
 * that breaks is retired: deleted on a worker once its last job ended, set up anew on next use.
 *
 * A request whose job ends with a token the peer no longer knows, or a data plane that is not
 * where the session said (the peer restarted: a new epoch), goes back to its entry once while
 * a new session is opened; the second failure ends it with both reasons. One naming (agent,
 * address) whose segment the peer no longer has goes back to whoever runs the batches once
 * (mg_peerdir_batch_ops.agent_stale), which asks the peer where that address is now.
 *
 * The front speaks to peers: the directory asks through ops (open a session, hand over RDMA
 * endpoints) and the front answers with mg_peerdir_opened/_failed/_rdma_answered, on the loop.
 * Loop thread only; jobs run on the engine's workers and transport threads.
 */
#ifndef MOONGATE_PEERDIR_H
#define MOONGATE_PEERDIR_H

#include "mg_list.h"
#include "moongate/batches.h"
#include "moongate/dataplane.h"
#include "moongate/peers.h"
#include "moongate/rdma.h"
#include "moongate/xfer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The values are those of moongate.v1.PeerState. */
typedef enum { MG_PEER_NONE, MG_PEER_OPENING, MG_PEER_OPEN, MG_PEER_FAILED } mg_peer_state;
/* RDMA to a peer: not tried yet (or torn down: set up on next use), being set up, connected,
 * or not used (rdma_why says why; tried again after a backoff, or with the next session). */
typedef enum {
    MG_PEER_RDMA_NONE,
    MG_PEER_RDMA_SETUP,
    MG_PEER_RDMA_READY,
    MG_PEER_RDMA_OFF
} mg_peer_rdma;

typedef struct mg_peerdir mg_peerdir;
typedef struct mg_xfer_peer mg_xfer_peer;

/* An RDMA connection per device and the jobs using it. */
struct mg_rconn_ref {
    mg_rdma_conn *c[MG_RDMA_MAX_DEVICES]; /* connection k: our device k to the peer's */
    unsigned n;
    unsigned users;
    int retired;
};

struct mg_xfer_peer {
    char addr[80]; /* the control endpoint ("": this daemon, copies with no session) */
    /* Whose requests: one entry (session, connections, cached targets) per peer and tenant,
     * since the peer serves a session only the targets of the tenant it was opened for. */
    char tenant[MG_SEG_NAME_MAX + 1];
    char key[MG_PEER_NAME_MAX + 1]; /* "tenant@addr": its name in the peer cache */
    mg_peerdir *dir;
    mg_peer_state state;
    int err_code; /* MG_ERR_* of the failed session */
    char err[256];
    uint8_t token[MG_DF_TOKEN_BYTES];
    char data_host[128];
    int data_port;
    uint64_t epoch, expires_ms;
    mg_list waiting;        /* requests waiting for the session (mg_batch_req.wait), in order */
    mg_dp_pool idle;        /* its idle data connections: workers take and give back */
    mg_xfer_line line;      /* its requests ready for a job slot */
    unsigned restarts_seen; /* epoch changes */
    uint64_t bytes[2];      /* moved by requests that completed, by op (1: write) */
    uint64_t rdma_bytes[2]; /* of those, over RDMA */
    uint64_t ended[2][2];   /* requests by op and result (1: failed) */
    /* RDMA */
    int peer_rdma; /* the peer said it has RDMA devices */
    unsigned peer_rdma_devices;
    mg_peer_rdma rdma_state;
    char rdma_why[240];
    uint64_t rdma_retry_ms;    /* OFF: when a request may try again (0: not set yet) */
    uint32_t rdma_backoff_ms;  /* the wait before the next try (doubling; 0: the first) */
    struct mg_rconn_ref *rref; /* READY: the connections */
    unsigned rdma_qps;
    void *front;       /* the front's state of it (front_bytes): its control channel */
    mg_list_node link; /* in the directory, newest first */
};

/* What a peer's OpenSession answered. */
typedef struct mg_peer_session {
    const uint8_t *token;  /* MG_DF_TOKEN_BYTES */
    const char *data_host; /* "", "::" or "0.0.0.0": the host of the control endpoint */
    const char *via;       /* where the control endpoint was reached ("ip:port": its name's
                            * address), or NULL: as it is named */
    int data_port;
    uint64_t epoch;
    uint64_t expires_in_ms;
    int rdma;
    unsigned rdma_devices;
} mg_peer_session;

typedef struct mg_peerdir_config {
    size_t max_peers;
    size_t front_bytes;         /* zeroed room for the front's state of each entry (p->front) */
    mg_xfer_sched_config sched; /* the scheduler it runs (its callbacks are the directory's) */
    mg_peer_cache *descs;       /* what peers said of their targets: RDMA keys */
    mg_engine *engine;          /* RDMA set-up and teardown jobs */
    mg_cq *cq;
    mg_rdma *rdma;          /* NULL: no RDMA device here */
    const char *rdma_why;   /* then: why */
    unsigned rdma_qps;      /* queue pairs per peer and device (--rdma-qps-per-peer) */
    uint32_t io_timeout_ms; /* requests' links */
    int crc;
    char congestion[MG_DP_CONGESTION_MAX]; /* TCP congestion control of data connections */
    uint32_t send_buffer;                  /* theirs, as mg_dp_tcp's */
    void *arg;                             /* what the ops below are called with */
    /* Ask the peer for a session for p->tenant; answer with mg_peerdir_opened or _failed. */
    void (*open_session)(void *arg, mg_xfer_peer *p);
    /* Give the peer our RDMA endpoint of device `device` (`token` is the session's); answer
     * with mg_peerdir_rdma_answered(job, ...). Returns 0, or -1 with why set (not sent). */
    int (*connect_rdma)(void *arg, mg_xfer_peer *p, unsigned device, const mg_rdma_ep *local,
                        void *job, char *why, size_t cap);
} mg_peerdir_config;

/* What the directory hands back to whoever runs the batches, whose requests it moves (the
 * directory may be made before them, and outlive them). */
typedef struct mg_peerdir_batch_ops {
    void *arg;
    /* Request r names (agent, address) and the peer refused the segment it was resolved to
     * (unregistered, perhaps registered again): r is PENDING again, in no line (requeued once);
     * the front resolves it anew and starts it (mg_peerdir_start) or ends it. NULL: it ends. */
    void (*agent_stale)(void *arg, mg_batch_req *r);
    /* Request r of a batch with a digest moved over RDMA (the bytes never passed through the
     * daemon that received them): the front compares the CRC32C of both ranges and ends r.
     * NULL: such batches move over TCP. */
    void (*verify)(void *arg, mg_batch_req *r);
} mg_peerdir_batch_ops;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_peerdir_new(mg_peerdir **out, const mg_peerdir_config *cfg);
/* Sets the batch ops (copied; NULL: none, as before the first call). */
void mg_peerdir_set_batch_ops(mg_peerdir *d, const mg_peerdir_batch_ops *ops);
/* Jobs coming back start no others; answers that come later are dropped (the daemon stops). */
void mg_peerdir_close(mg_peerdir *d);
/* Whether mg_peerdir_close was called. */
int mg_peerdir_closed(const mg_peerdir *d);
/* Accepts NULL. After mg_peerdir_close and once every job came back: frees the entries (their
 * RDMA connections deleted here), and the scheduler. The front lets go of what its p->front
 * holds first. */
void mg_peerdir_del(mg_peerdir *d);
mg_xfer_sched *mg_peerdir_sched(const mg_peerdir *d);
/* The config's arg (what the ops are called with). */
void *mg_peerdir_arg(const mg_peerdir *d);

/* The entry of addr and tenant, made when new; NULL when the directory is full (max_peers) or
 * out of memory. */
mg_xfer_peer *mg_peerdir_get(mg_peerdir *d, const char *addr, const char *tenant);
/* Newest first: for (p = mg_peerdir_first(d); p; p = mg_peerdir_next(d, p)); d may be NULL. */
mg_xfer_peer *mg_peerdir_first(const mg_peerdir *d);
mg_xfer_peer *mg_peerdir_next(const mg_peerdir *d, const mg_xfer_peer *p);
#define mg_peerdir_foreach(d, p) \
    for (mg_xfer_peer *p = mg_peerdir_first(d); p; p = mg_peerdir_next(d, p))
/* Requests of p waiting for its session or in its line. */
size_t mg_peerdir_queued(const mg_xfer_peer *p);

/* A request of an entered batch starts: at once when its peer's session is open (now_ms:
 * mg_now_mono_ms), else it waits for it (a session is asked for). Its peer must be set. */
void mg_peerdir_start(mg_batch_req *r, uint64_t now_ms);
/* Request r of one of p's batches ended (mg_batches' request_ended): p's counts; a target the
 * peer said it does not have is asked for again next time. */
void mg_peerdir_request_ended(const mg_batch_req *r);
/* The front's answers. */
void mg_peerdir_opened(mg_xfer_peer *p, const mg_peer_session *s, uint64_t now_ms);
/* code: MG_ERR_*; why is the peer's (or the channel's) reason. */
void mg_peerdir_failed(mg_xfer_peer *p, int code, const char *why);
/* The peer's RDMA endpoint for the set-up `job` (NULL: it failed, `why` says why).
 * session_gone: the peer did not know the session (it restarted, or the session expired): a new
 * session is opened, and the set-up starts again in it. */
void mg_peerdir_rdma_answered(void *job, const mg_rdma_ep *remote, const char *why,
                              int session_gone);

#ifdef __cplusplus
}
#endif

#endif
