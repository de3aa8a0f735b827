/*
 * moongate engine: the public C API the gateway calls.
 *
 * The engine owns the worker pool that runs blocking work (mapping, locking and pinning memory,
 * verbs registration, large copies) away from the gateway's HTTP/2 loops. It knows nothing of
 * HTTP/2, gRPC or protobuf: it takes plain C values and reports completion through callbacks.
 *
 * Hand-off rule: a loop submits a job to a bounded queue (full -> MG_ERR_FULL). A worker runs the
 * job's work function, then pushes the job onto the completion queue (mg_cq) of the loop that
 * submitted it. The queue's file descriptor becomes readable only when the queue goes from empty
 * to non-empty; the loop then calls mg_cq_drain(), which runs the done callbacks on the loop's
 * own thread. A job is owned by exactly one side at a time; every submitted job comes back to its
 * loop, cancelled or not, so the loop can free what it attached.
 */
#ifndef MOONGATE_ENGINE_H
#define MOONGATE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_engine mg_engine;
typedef struct mg_cq mg_cq;
typedef struct mg_job mg_job;

typedef struct mg_engine_config {
    unsigned workers;     /* worker threads, 1..256 */
    unsigned queue_depth; /* jobs queued or running at most, 1..1048576 */
    /* The segment registry; when registry.shm_dir is NULL the engine has none. */
    mg_registry_config registry;
} mg_engine_config;

/* Runs on a worker thread; returns 0 or a negative MG_ERR_*. */
typedef int (*mg_work_fn)(void *arg);
/* Runs on the submitting loop's thread with the work function's result (MG_ERR_CANCELLED when
 * the engine shut down before the job ran). */
typedef void (*mg_done_fn)(void *arg, int result);

/* Creates the engine (its segment registry, then its workers). Returns 0, MG_ERR_INVALID,
 * MG_ERR_SYSTEM (the shm directory) or MG_ERR_NOMEM. */
int mg_engine_new(mg_engine **out, const mg_engine_config *cfg);
/* Stops the workers after the jobs already running; queued jobs complete with
 * MG_ERR_CANCELLED. Completion queues must be drained and freed by their loops afterwards.
 * Accepts NULL. */
/* Stops the workers: each finishes its current job, queued jobs complete as cancelled
 * (MG_ERR_SHUTDOWN) into their completion queues; later submits fail with MG_ERR_SHUTDOWN. The
 * registry stays until mg_engine_del, so the owners of those queues can drain them first. */
void mg_engine_stop(mg_engine *engine);
void mg_engine_del(mg_engine *engine);

/* A completion queue belongs to one loop thread. Returns 0 or MG_ERR_NOMEM / MG_ERR_SYSTEM. */
int mg_cq_new(mg_cq **out);
/* Frees the queue; runs nothing. Accepts NULL. The caller makes sure no job targets it. */
void mg_cq_del(mg_cq *cq);
/* A file descriptor that becomes readable when completions are waiting. */
int mg_cq_fd(const mg_cq *cq);
/* Runs the done callbacks of up to `max` completed jobs on the calling thread (0 = all).
 * Returns how many ran. */
unsigned mg_cq_drain(mg_cq *cq, unsigned max);
/* Blocks until every job submitted for cq has completed and its done callback has run (draining
 * as they come). For teardown: a queue must not be freed while a worker may still push to it. */
void mg_cq_settle(mg_cq *cq);

/* Hands `done` (with `result`) to the loop that drains cq, from any thread: for engine threads
 * other than the workers (the ring thread). Returns 0 or MG_ERR_NOMEM (nothing was posted). */
int mg_cq_post(mg_cq *cq, mg_done_fn done, void *arg, int result);

/* Queues `work` on the pool; `done` later runs on the thread that drains `cq`.
 * Returns 0, MG_ERR_FULL when queue_depth jobs are queued or running, MG_ERR_SHUTDOWN after
 * mg_engine_del began, or MG_ERR_NOMEM. On error nothing was queued and `done` never runs. */
int mg_engine_submit(mg_engine *engine, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg);

/* The engine's segment registry (NULL when it has none). */
mg_registry *mg_engine_registry(mg_engine *engine);

typedef struct mg_engine_stats {
    unsigned workers;
    unsigned queue_depth;
    unsigned in_flight; /* queued or running */
    uint64_t submitted; /* accepted by mg_engine_submit */
    uint64_t rejected;  /* refused with MG_ERR_FULL */
    uint64_t completed; /* work functions that returned */
} mg_engine_stats;

void mg_engine_get_stats(mg_engine *engine, mg_engine_stats *out);

/* Non-zero when the calling thread is one of an engine's workers. */
int mg_engine_on_worker(void);

#ifdef __cplusplus
}
#endif

#endif
