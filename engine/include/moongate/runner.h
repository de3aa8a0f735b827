/*
 * moongate batch runner: a batch from its checks to its start, and the two steps its requests
 * may take on the way back.
 *
 *   mg_runner_prepare   requests naming (agent, address) on peers resolved to a segment and
 *                     offset, from what the agent cache knows under the peer's epoch; an agent
 *                     not known (or known without a region holding the range, since the agent
 *                     may have registered one since) is asked for once (describe_agent), which
 *                     also fills the peer cache with what DescribeTarget would say of each of
 *                     its regions. Then every remote target is checked against what the peers
 *                     said of it; targets not known are asked for (describe_target). The batch
 *                     is `prepared` once, with a refusal naming what cannot run, or none.
 *   mg_runner_start     its notifications take their places in line, its requests start (small
 *                     ones grouped into one job: the scheduler holds while they join), and
 *                     those notifications with no WRITE to wait for are due.
 *   region refused    a request naming an agent whose region the peer refused (unregistered,
 *                     perhaps registered again) is resolved anew once, with one DescribeAgent
 *                     per peer and agent for every request waiting on it, and starts again, or
 *                     ends saying both reasons.
 *   digest            a request of a batch with a digest that moved over RDMA (the bytes never
 *                     passed through the daemon that received them): the CRC32C of its local
 *                     range (on a worker) and of the peer's (checksum) are compared, and it
 *                     ends DONE or DATA_LOSS.
 *
 * The front speaks to peers: the runner asks through the config's callbacks and the front
 * answers with mg_runner_agent_answered / _target_answered / _checksum_answered, on the loop.
 * The runner sets the peer directory's batch ops (moongate/peerdir.h) while it lives. Once the
 * directory is closed, answers are dropped (prepare answers UNAVAILABLE). Loop thread only.
 */
#ifndef MOONGATE_RUNNER_H
#define MOONGATE_RUNNER_H

#include "moongate/agentcache.h"
#include "moongate/batches.h"
#include "moongate/engine.h"
#include "moongate/notelines.h"
#include "moongate/peerdir.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_runner mg_runner;

/* Why a batch cannot start: request `request` (SIZE_MAX: the batch as a whole) with err (an
 * MG_ERR_*), or the gRPC status grpc a peer's answer gave (err 0). */
typedef struct mg_xfer_refusal {
    int err;
    int grpc;
    size_t request;
    char why[600];
} mg_xfer_refusal;

typedef struct mg_runner_config {
    mg_peerdir *dir;
    mg_agent_cache *agents; /* what peers said of their agents */
    mg_peer_cache *descs;   /* and of their targets */
    mg_notelines *lines;    /* where the batches' notifications wait */
    mg_engine *engine;      /* the local CRC32C of a digest runs on its workers */
    mg_cq *cq;
    uint64_t (*now_ms)(void); /* the clock requests start by (NULL: mg_now_mono_ms) */
    /* How a job goes to the workers (NULL: mg_engine_submit). */
    int (*submit)(mg_engine *engine, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg);
    void *arg;
    /* Ask peer p for its agent `ref` of p's tenant; answer with
     * mg_runner_agent_answered(job, ...). Returns 0, or -1 with why set (not asked). */
    int (*describe_agent)(void *arg, mg_xfer_peer *p, const mg_agent_ref *ref, void *job, char *why,
                          size_t cap);
    /* Ask peer p what its target `id` (a lease when is_lease) is; answer with
     * mg_runner_target_answered(job, ...). Returns 0, or -1 (not asked: left to the data
     * plane). */
    int (*describe_target)(void *arg, mg_xfer_peer *p, uint64_t id, int is_lease, void *job);
    /* Ask r's peer for the CRC32C of r's remote range; answer with
     * mg_runner_checksum_answered(job, ...). Returns 0, or -1 with why set (not asked). */
    int (*checksum)(void *arg, const mg_batch_req *r, void *job, char *why, size_t cap);
    /* mg_runner_prepare's answer for b: no is NULL (b may start: mg_runner_start) or says why not
     * (b is the front's to refuse and discard). ctx: mg_runner_prepare's. */
    void (*prepared)(void *arg, void *ctx, mg_batch *b, const mg_xfer_refusal *no);
    /* A batch still being prepared when the runner goes: its ctx is let go (NULL: nothing). */
    void (*forget)(void *arg, void *ctx);
} mg_runner_config;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_runner_new(mg_runner **out, const mg_runner_config *cfg);
/* Accepts NULL. After the directory is closed and every ask was answered: batches still being
 * prepared are discarded (their `prepared` is not called; `forget` is). */
void mg_runner_del(mg_runner *xr);

/* Prepares b (filled, its peers set, not entered): `prepared` is called once, perhaps before
 * this returns. */
void mg_runner_prepare(mg_runner *xr, mg_batch *b, void *ctx);
/* Batches being prepared of `tenant`; with request_id (not NULL), those with that request_id. */
size_t mg_runner_preparing(const mg_runner *xr, const char *tenant, const char *request_id);
/* b (prepared, entered: mg_batches_add) starts. */
void mg_runner_start(mg_runner *xr, mg_batch *b);

/* The peer directory's verify (set by the runner): request r, of a batch with a digest, moved
 * over RDMA; the CRC32C of its local range and of the peer's are compared, and r ends. */
void mg_runner_verify(mg_runner *xr, mg_batch_req *r);

/* The front's answers. code: 0, or a gRPC status and why. */
void mg_runner_agent_answered(void *job, int code, const char *msg);
/* d: the descriptor under `epoch`, or NULL and the gRPC status (NOT_FOUND: the peer has no such
 * target; else it could not be asked). */
void mg_runner_target_answered(void *job, const mg_remote_desc *d, uint64_t epoch, int status);
/* status 0 and the peer's crc32c, or a gRPC status and why. */
void mg_runner_checksum_answered(void *job, int status, const char *msg, uint32_t crc32c);

#ifdef __cplusplus
}
#endif

#endif
