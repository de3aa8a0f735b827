/*
 * moongate transfer batches: the engine's record of every batch a caller submitted — its
 * requests as they move and end, what is kept of them once the batch is over, the
 * notifications it sends, and how long it is remembered.
 *
 * The life of one batch:
 *
 *   mg_batch_new      id minted; the front fills the requests (local memory resolved and
 *                     held), checks them, and either mg_batch_discard()s it (nothing moved)
 *   mg_batches_add    or enters it: from now GetBatch finds it and its requests start
 *   mg_batch_req_end  each request ends once (DONE or FAILED) and lets go of its local memory;
 *                     a WRITE that ends may make a notification due (event note_due)
 *   mg_batch_stop     Cancel, the batch's timeout, shutdown: waiting requests end now,
 *                     running ones through their stop word
 *   mg_batch_compact  over: only a small record per request is kept (bytes, state, message)
 *   mg_batches_expire forgotten --batch-retention after it was over; --max-batches forgets
 *                     the oldest over batches first, never one still running
 *
 * A batch tells the front through events: a request ended (metrics, its peer's counts), a
 * notification is due (the front sends it and calls mg_batch_note_end), the batch changed
 * (Wait streams; over: timers off), the batch is freed (the front's state of it goes). The
 * front owns the timers (no event loop here): the batch's timeout calls mg_batch_stop, a tick
 * calls mg_batches_expire, and compaction runs after the callback that ended the batch.
 *
 * Loop thread only, like the scheduler whose requests these are (moongate/xfer.h).
 */
#ifndef MOONGATE_BATCHES_H
#define MOONGATE_BATCHES_H

#include "mg_idmap.h"
#include "mg_list.h"
#include "mg_trace.h"
#include "moongate/agentcache.h"
#include "moongate/batch.h"
#include "moongate/peers.h"
#include "moongate/pools.h"
#include "moongate/segment.h"
#include "moongate/xfer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_BATCH_REQUEST_ID_MAX 128 /* bytes of a client's request_id */
#define MG_BATCH_TOPIC_MAX      128 /* bytes of a notification's topic */

/* How a request moved (GetBatch's `transport`). */
typedef enum {
    MG_TR_NONE,
    MG_TR_TCP,
    MG_TR_RDMA,
    MG_TR_COPY,
    MG_TR_PROCESS_VM, /* the local side is a client process's memory (moongate/procmem.h) */
    MG_TR_STAGED      /* the local side is GPU memory its own process stages */
} mg_batch_transport;

/* "", "tcp", "rdma", "copy", "process_vm", "staged". */
const char *mg_batch_transport_name(mg_batch_transport t);

/* What the client library made of the caller's memory before submitting (SubmitRequest.tag):
 * GPU memory staged through leases, or registered by dma-buf. Counted by tag in /metrics. */
typedef enum { MG_TAG_NONE, MG_TAG_STAGED, MG_TAG_DMABUF, MG_TAG_COUNT } mg_batch_tag;
/* "", "staged", "rdma-dmabuf". */
const char *mg_batch_tag_name(mg_batch_tag t);
/* The tag a name says, or -1 for a name that is none of them. */
int mg_batch_tag_parse(const char *name);

struct mg_xfer_peer; /* the peer directory's entry of a request's peer */
struct mg_rconn_ref; /* the RDMA connections a request's jobs use */

typedef struct mg_batches mg_batches;
typedef struct mg_batch mg_batch;

/* One request of a batch. The front sets the fields up to `peer` while it fills the batch. */
typedef struct mg_batch_req {
    mg_batch *b;
    int write;
    mg_segment *local; /* referenced until the request ends */
    void *local_lease; /* mg_pools_use token when the local side is a lease */
    uint8_t *local_addr;
    int local_copy;    /* the other side is on this daemon too (peer "") */
    mg_segment *other; /* then: its segment (referenced) */
    void *other_lease; /* and its lease's mg_pools_use token */
    uint8_t *other_addr;
    uint64_t remote_segment, remote_offset, length; /* remote_segment: or the lease's id */
    int remote_lease;
    /* A remote side named by (agent, address) on a peer: 1 + the agent's index in b->agents,
     * and the address; remote_segment and remote_offset are set once it is resolved. */
    uint32_t agent;
    uint64_t remote_address;
    struct mg_xfer_peer *peer;
    const char *peer_name;            /* while the batch is filled only: the request's `peer` */
    const char *agent_arg, *peer_arg; /* and then its remote_agent and peer as the caller gave
                                       * them (blocks of one group share them) */
    /* Its life. */
    mg_req_life life;  /* PENDING, RUNNING, DONE or FAILED; requeued once at most */
    int err;           /* MG_ERR_* when failed */
    char *msg;         /* why it failed (malloc'd), or NULL */
    mg_xfer_req x;     /* as the scheduler moves it */
    mg_list_node wait; /* in its peer's requests waiting for a session */
    /* Set when it starts, from its peer's session: copied so the worker reads nothing the loop
     * may change. RDMA: chosen when the queue pairs are ready and both sides are registered. */
    int rdma;
    int rdma_only;       /* the target is reached over RDMA only (GPU memory): never TCP */
    uint8_t span[8];     /* its span of a sampled trace (set when it starts) */
    uint64_t t0_unix_ns; /* when it started */
    struct mg_rconn_ref *rref;
    uint32_t lkeys[MG_RDMA_MAX_DEVICES], rkeys[MG_RDMA_MAX_DEVICES]; /* per connection */
    uint64_t raddr; /* the remote range's first byte */
    uint8_t token[MG_DF_TOKEN_BYTES];
    char data_host[128];
    int data_port;
} mg_batch_req;

/* What an over batch keeps of a request (all GetBatch and Wait still say of it). */
typedef struct mg_batch_rec {
    uint64_t bytes;
    char *msg;
    int err;
    uint8_t state;     /* mg_req_state */
    uint8_t transport; /* mg_batch_transport */
} mg_batch_rec;

/* A notification the batch sends a peer once its WRITEs there are in place. */
typedef struct mg_batch_note {
    mg_batch *b;
    struct mg_xfer_peer *peer;
    char topic[MG_BATCH_TOPIC_MAX + 1];
    uint8_t *payload;
    size_t len;
    mg_note_gate g; /* when it is due (moongate/batch.h) */
    int code;       /* gRPC status when FAILED */
    char msg[300];
    void *front; /* the front's state of it (its place in line) */
} mg_batch_note;

struct mg_batch {
    mg_idmap_node node; /* node.id: the batch's id */
    uint64_t id;
    mg_batches *set;
    uint64_t t0_ns;  /* entered (mg_now_mono_ns) */
    uint64_t end_ms; /* when it was over (the set's clock, now_ms; 0: not yet) */
    uint32_t timeout_ms;
    char request_id[MG_BATCH_REQUEST_ID_MAX + 1]; /* the client's, or "" */
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t conn; /* the front's id of the connection it came on (notifications keep order) */
    int wait;      /* its Submit answers at the end */
    int brief;     /* ... listing only the requests that failed (SubmitRequest.brief) */
    mg_batch_tag tag;
    int digest;     /* CRC32C end to end (SubmitRequest.digest): over TCP, per slice */
    mg_trace trace; /* its span: the caller's traceparent as parent, or a trace of its own */
    int traced;     /* the caller sent a traceparent: its submit and notifications are logged */
    uint64_t t0_unix_ns; /* submitted (the span's start) */
    size_t n;
    mg_batch_req *reqs; /* NULL once over and compacted into recs */
    mg_batch_rec *recs;
    mg_batch_note *notes;
    size_t nnotes;
    mg_batch_counts counts; /* requests and notifications ended */
    mg_agent_ref **agents;  /* the remote agents its requests name */
    size_t nagents;
    /* While it is filled: references its requests took on owed_seg, the segment of the request
     * before (one atomic add for a run of blocks in one segment, at its end, the last fill or
     * the discard). */
    struct mg_segment *owed_seg;
    uint32_t owed;
    void *front;       /* the front's state of it (Wait calls, timers) */
    mg_list_node link; /* in the set, newest first */
};

typedef struct mg_batches_config {
    mg_registry *reg;         /* the requests' local segments are referenced in it */
    mg_pools *pools;          /* and their leases used in it */
    const mg_agents *agents;  /* this daemon's agents (NULL: none), for requests naming them */
    struct mg_spans *spans;   /* sampled spans are kept here (NULL: none) */
    int peer_port;            /* peers' control port, in an agent's one-string form */
    size_t max_batches;       /* kept at most (--max-batches; over ones are forgotten first) */
    uint64_t retention_ms;    /* an over batch is kept this long (--batch-retention) */
    uint64_t (*now_ms)(void); /* the clock a batch's end is read from (NULL: mg_now_mono_ms) */
    void *arg;
    /* Request r ended (its err and msg say how); its local memory is let go already. */
    void (*request_ended)(void *arg, mg_batch_req *r);
    /* Notification n is due: the front sends it (or fails it) and calls mg_batch_note_end. */
    void (*note_due)(void *arg, mg_batch_note *n);
    /* The batch moved: a request or notification ended. */
    void (*changed)(void *arg, mg_batch *b);
    /* The batch is being freed: the front lets go of b->front. */
    void (*freed)(void *arg, mg_batch *b);
} mg_batches_config;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_batches_new(mg_batches **out, const mg_batches_config *cfg);
/* Accepts NULL. Frees every batch (their requests' local memory let go); no job may run. */
void mg_batches_del(mg_batches *s);

/* A new batch of n requests and nnotes notifications, with a fresh id, for `tenant`; not in
 * the set yet. NULL when out of memory. */
mg_batch *mg_batch_new(mg_batches *s, const char *tenant, size_t n, size_t nnotes);
/* A batch that never entered the set: the local memory its requests hold let go, then it. */
void mg_batch_discard(mg_batch *b);
/* One request as the caller names it. */
typedef struct mg_batch_item {
    int write;                                         /* 1: WRITE local -> remote; 0: READ */
    uint64_t local_segment, local_lease, local_offset; /* one of segment and lease */
    const char *peer; /* "host:port" (a name is looked up later, off the loop), or "" for this
                       * daemon (a copy) */
    uint64_t remote_segment, remote_lease, remote_offset; /* one of segment and lease */
    uint64_t length;
    /* Instead of local_segment: the address of the local bytes (plus local_offset) in process
     * `proc` (the caller), in a region it registered with its address (mg_registry_resolve). */
    uint64_t local_address;
    const mg_proc *proc;
    /* Instead of remote_segment and remote_lease: the remote bytes at remote_address (plus
     * remote_offset) in the process of agent remote_agent (moongate/agentcache.h). */
    const char *remote_agent;
    uint64_t remote_address;
} mg_batch_item;

/* Request i of b from t: its fields, and its local memory (and the other side's, for peer "")
 * resolved in the tenant's segments and leases (or the caller's addresses) and held for
 * `holder`. Returns NULL, or what is wrong with it (what it holds is let go with the batch; the
 * text may be the request's own, freed with the batch: use it before mg_batch_discard). *last:
 * the local segment of the request before (0: a lease), for the next. Peer strings are not
 * copied: resolve them (r->peer) before the items go. */
const char *mg_batch_fill(mg_batch *b, size_t i, const mg_batch_item *t, uint64_t *last,
                          const char *holder);
/* An agent a batch names on a peer, to be asked for (mg_batch_resolve_agents). */
typedef struct mg_batch_agent_ask {
    struct mg_xfer_peer *peer;
    const mg_agent_ref *ref;
} mg_batch_agent_ask;
/* Resolves the requests of b naming (agent, address) on peers through what `cache` knows (under
 * the peers' epochs in `descs`). First pass (answered 0): an agent not known, or known without
 * a region holding the request's range (it may have registered one since), is added to *ask
 * (realloc'd; the caller frees it). Second pass (answered 1, after the peers said what they
 * have): every request must resolve. Returns 0 (resolved, or *ask to be asked), or with *bad
 * and why set MG_ERR_NOT_FOUND (no such agent, or no region at the address) or MG_ERR_RANGE
 * (the range runs out of its region); MG_ERR_NOMEM. */
int mg_batch_resolve_agents(mg_batch *b, mg_agent_cache *cache, mg_peer_cache *descs, int answered,
                            mg_batch_agent_ask **ask, size_t *nask, size_t *bad, char *why,
                            size_t cap);
/* A remote target of a batch, and what its peer said of it. */
typedef enum {
    MG_TARGET_UNANSWERED, /* not (yet) described: unreachable or refused, left to the data plane */
    MG_TARGET_KNOWN,      /* described: in the peer cache */
    MG_TARGET_MISSING,    /* the peer has no such target */
} mg_target_state;

typedef struct mg_batch_target {
    struct mg_xfer_peer *peer;
    uint64_t id; /* segment, or lease */
    int is_lease;
    mg_target_state state;
} mg_batch_target;

/* Checks every remote request of b against what `descs` knows of its target. First pass
 * (answers NULL): targets not known (or known to be wrong: they are asked again once before
 * the batch fails) are added to *ask (realloc'd; the caller frees it) and the others checked.
 * Second pass (answers: what was asked, with what the peers said): every request is checked.
 * Returns 0 (all may run, or wait for *ask), MG_ERR_INVALID (request *bad cannot run: why
 * says why) or MG_ERR_NOMEM. */
int mg_batch_check_remote(const mg_batch *b, mg_peer_cache *descs, mg_batch_target *answers,
                          size_t nanswers, mg_batch_target **ask, size_t *nask, size_t *bad,
                          char *why, size_t cap);
/* A peer's answer for target t: its descriptor d under `epoch` (cached), or none (missing: the
 * peer has no such target; else the peer could not be asked). */
void mg_batch_target_answered(mg_peer_cache *descs, mg_batch_target *t, const mg_remote_desc *d,
                              uint64_t epoch, int missing, uint64_t now_ms);
/* Enters b (now_ns: mg_now_mono_ns()); forgets the oldest over batches past max_batches. */
void mg_batches_add(mg_batches *s, mg_batch *b, uint64_t now_ns);
/* Notifications of b with no WRITE to wait for are due now (after mg_batches_add). */
void mg_batch_notes_start(mg_batch *b);

/* The batch with that id, or NULL. */
mg_batch *mg_batches_find(const mg_batches *s, uint64_t id);
/* The tenant's batch with that client request_id (not ""), or NULL. */
mg_batch *mg_batches_find_request(const mg_batches *s, const char *tenant, const char *request_id);
/* Batches not over, of `tenant` (NULL: of all). */
size_t mg_batches_running(const mg_batches *s, const char *tenant);
size_t mg_batches_count(const mg_batches *s);
/* The config's arg (what the events are called with). */
void *mg_batches_arg(const mg_batches *s);
/* Newest first: for (b = mg_batches_first(s); b; b = mg_batches_next(s, b)). */
mg_batch *mg_batches_first(const mg_batches *s);
mg_batch *mg_batches_next(const mg_batches *s, const mg_batch *b);
/* Forgets the batches over for retention_ms or more at now_ms (mg_now_mono_ms). */
void mg_batches_expire(mg_batches *s, uint64_t now_ms);
/* Asks every running request to stop with `err` (the daemon stops). */
void mg_batches_stop_running(mg_batches *s, int err);

int mg_batch_is_over(const mg_batch *b);
/* Ends r: DONE when err is 0, else FAILED with msg. Its local memory is let go, its WRITE may
 * make notifications due, and the batch changes. Returns -1 (nothing changed, an error is
 * logged) when r already ended, or would succeed without having run. */
int mg_batch_req_end(mg_batch_req *r, int err, const char *msg);
/* Keeps `text` as r's message ("" or NULL: none). */
void mg_batch_req_say(mg_batch_req *r, const char *text);
/* Takes a pending r out of the line it waits in: its peer's line (the scheduler's) or the
 * requests waiting for its peer's session. Returns 1 if it was in one. */
int mg_batch_req_unqueue(mg_batch_req *r);
/* b's trace: a step of `traceparent` (the caller's header; "" or malformed: a trace of b's own,
 * unsampled), logged when the caller sent one. Returns 0, or -1 when no random bytes. */
int mg_batch_trace(mg_batch *b, const char *traceparent);
/* Request r took a job slot: a request of a sampled trace gets its span and logs its start
 * (its end is logged by mg_batch_req_end). */
void mg_batch_req_started(mg_batch_req *r);
/* Notification n was sent (SENT) or not (FAILED, with a gRPC code and why). */
void mg_batch_note_end(mg_batch_note *n, mg_note_state state, int code, const char *msg);
/* Ends every request of b that has not ended: waiting ones now, running ones through their
 * stop word (they end when their job sees it). */
void mg_batch_stop(mg_batch *b, int err, const char *why);
/* An over batch keeps only its requests' records. Call it outside any walk of b's requests.
 * Nothing changes when b is not over, or memory is short (it stays whole). */
void mg_batch_compact(mg_batch *b);
/* What GetBatch says of request i now (msg: the batch's own). */
mg_batch_rec mg_batch_record(const mg_batch *b, size_t i);

#ifdef __cplusplus
}
#endif

#endif
