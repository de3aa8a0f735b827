/*
 * moongate transfer jobs: the worker side of a transfer — moving the bytes of one job.
 *
 * A transfer request is cut into parts (mg_xfer_plan: one, or for a large request several on
 * slice boundaries, each its own job on its own connection), and small requests of one batch
 * and peer are grouped into one job (a chain of parts), so that a batch of thousands of small
 * blocks is one stream of slices and not a round trip per block. A job runs on a worker with
 * mg_xfer_run and moves its parts by one of three movers:
 *
 *   COPY  both ranges are on this daemon: memcpy in 8 MiB steps, guarded against a client
 *         truncating a segment's file (moongate/fault.h);
 *   TCP   the peer's data plane (moongate/dataplane.h): an idle connection of the peer's pool
 *         (a broken one is replaced once by a fresh one: the same bytes to the same place
 *         again), the whole chain as one stream of slices;
 *   RDMA  the peer's queue pairs (moongate/rdma.h), one part after another, slices taking turns
 *         over every device's connection.
 *
 * Every part gets its own rc and message; progress (bytes confirmed) is counted atomically so
 * the loop can report it while the job runs. The loop stops a job by setting *stop to an
 * MG_ERR_*; the movers see it within 100 ms.
 *
 * Thread-safe as described: mg_xfer_run runs on a worker; everything it reads stays unchanged
 * by the loop until the job's completion runs, except *stop and the progress counters.
 */
#ifndef MOONGATE_XFER_H
#define MOONGATE_XFER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "moongate/dataframe.h"
#include "moongate/dataplane.h"
#include "moongate/mg_error.h"
#include "moongate/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MG_XFER_COPY = 0, MG_XFER_TCP = 1, MG_XFER_RDMA = 2 } mg_xfer_kind;

#define MG_XFER_MSG_MAX 400

/* A range one job moves: a part of a request, or a whole small request in a group. */
typedef struct mg_xfer_part {
    /* Set by the loop before the job starts. */
    int write;                 /* 1: local -> the other side; 0: the other side -> local */
    uint8_t *local;            /* the local range's first byte */
    uint64_t length;           /* bytes */
    uint8_t *other;            /* COPY: the other range's first byte, on this daemon */
    int lease;                 /* TCP: `target` is a remote-accessible lease's id */
    uint64_t target;           /* TCP: the peer's segment (or lease) */
    uint64_t remote;           /* TCP: the offset in it; RDMA: the remote range's address */
    const uint32_t *lkeys;     /* RDMA: the local range's key on each device */
    const uint32_t *rkeys;     /* RDMA: the remote range's key on each of the peer's devices */
    struct mg_xfer_part *next; /* the next part of the same job, or NULL */
    /* Results. */
    uint64_t progress;         /* bytes confirmed (atomic) */
    int rc;                    /* 0 or an MG_ERR_* */
    char msg[MG_XFER_MSG_MAX]; /* why it failed */
} mg_xfer_part;

/* How a job reaches the other side. */
typedef struct mg_xfer_link {
    const int *stop;        /* the loop sets an MG_ERR_* to stop the job (atomic) */
    uint32_t slice_bytes;   /* TCP and RDMA slices */
    uint32_t io_timeout_ms; /* a peer silent this long fails the job (MG_ERR_UNAVAILABLE) */
    int crc;                /* TCP: CRC32C per slice */
    int64_t *in_flight;     /* TCP: slices sent and not answered (atomic; optional) */
    const char *peer;       /* the peer's name, for the log */
    /* TCP */
    mg_dp_pool *idle; /* the peer's idle data connections */
    const uint8_t *token;
    const char *host;
    int port;
    /* RDMA */
    mg_rdma_conn *const *conns; /* connection k: our device k to the peer's device k */
    unsigned nconns;
    pthread_mutex_t *lock; /* one mover at a time on the queue pairs */
} mg_xfer_link;

/* Worker. Moves the parts chained from `head` by `kind` over `link`. Each part gets its own rc
 * and msg; returns head's rc. */
int mg_xfer_run(mg_xfer_kind kind, mg_xfer_part *head, const mg_xfer_link *link);

/* Loop. How many parts a request of `length` bytes runs as: up to `max_parts` of at least
 * `part_min` bytes each, 1 when `rdma` (one job posts the slices over every queue pair).
 * *each: the length of every part but the last, a multiple of `slice` (> 0). */
unsigned mg_xfer_plan(uint64_t length, uint64_t slice, unsigned max_parts, uint64_t part_min,
                      int rdma, uint64_t *each);

#ifdef __cplusplus
}
#endif

#endif
