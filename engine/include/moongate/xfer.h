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
 *         again), the whole chain as one stream of slices; a part whose local side is a
 *         client process's memory is read and written through the connection's stage with
 *         process_vm, slice by slice as they go and come (mg_dp_access);
 *   RDMA  the peer's queue pairs (moongate/rdma.h), one part after another, slices taking turns
 *         over every device's connection.
 *
 * Every part gets its own rc and message; progress (bytes confirmed) is counted atomically so
 * the loop can report it while the job runs. The loop stops a job by setting *stop to an
 * MG_ERR_*; the movers see it within 100 ms.
 *
 * The scheduler (mg_xfer_sched) runs on the loop: requests ready to move wait in their peer's
 * line (mg_xfer_line) for a job slot — of the transport threads for peers, of the workers for
 * copies on this daemon — so a large batch neither overflows a queue nor crowds out other work.
 * Each line takes at most all slots of its kind but one, so a peer that stalls (until the I/O
 * timeout) cannot hold up the others, and copies leave a worker to registrations. A request
 * starts all its parts at once; small requests of one batch that follow each other in a line
 * run as one job (a group). The caller hears of each request once, when its last part ended,
 * with the first failure's code and message.
 *
 * Thread-safe as described: mg_xfer_run runs on a worker; everything it reads stays unchanged
 * by the loop until the job's completion runs, except *stop and the progress counters. The
 * scheduler is the loop's.
 */
#ifndef MOONGATE_XFER_H
#define MOONGATE_XFER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "mg_list.h"
#include "moongate/dataframe.h"
#include "moongate/dataplane.h"
#include "moongate/engine.h"
#include "moongate/mg_error.h"
#include "moongate/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MG_XFER_COPY = 0, MG_XFER_TCP = 1, MG_XFER_RDMA = 2 } mg_xfer_kind;

#define MG_XFER_MSG_MAX 400 /* a failure message's bytes at most, with its NUL */

/* A range one job moves: a part of a request, or a whole small request in a group. */
typedef struct mg_xfer_part {
    /* Set by the loop before the job starts. */
    int write;             /* 1: local -> the other side; 0: the other side -> local */
    uint8_t *local;        /* the local range's first byte */
    uint64_t length;       /* bytes */
    uint8_t *other;        /* COPY: the other range's first byte, on this daemon */
    int lease;             /* TCP: `target` is a remote-accessible lease's id */
    uint64_t target;       /* TCP: the peer's segment (or lease) */
    uint64_t remote;       /* TCP: the offset in it; RDMA: the remote range's address */
    const uint32_t *lkeys; /* RDMA: the local range's key on each device */
    const uint32_t *rkeys; /* RDMA: the remote range's key on each of the peer's devices */
    /* COPY and TCP: the local range lies in this segment, which the daemon does not map
     * (another process's memory, GPU memory its process stages): `local` is its address there,
     * and its bytes move with the kind's read and write (mg_segment_read/_write); NULL: the
     * daemon's own mapping. */
    const struct mg_segment *unmapped;
    struct mg_xfer_part *next; /* the next part of the same job, or NULL */
    /* Results. */
    uint64_t progress; /* bytes confirmed (atomic) */
    int rc;            /* 0 or an MG_ERR_* */
    char *msg;         /* why it failed (mg_xfer_part_say; freed with the request), or NULL:
                        * held only by the parts that failed, so a batch of thousands of small
                        * requests does not carry a message buffer for each */
} mg_xfer_part;

/* Sets pt->msg (printf-style, at most MG_XFER_MSG_MAX bytes); out of memory leaves it NULL. */
void mg_xfer_part_say(mg_xfer_part *pt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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
    mg_dp_tcp tcp;    /* how new connections are set up */
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

/* ---- the scheduler (loop thread) ---- */

#define MG_XFER_MAX_PARTS   8             /* a large request runs as this many parts at most */
#define MG_XFER_PART_MIN    (16ull << 20) /* each of them at least this long */
#define MG_XFER_GROUP_MAX   256           /* small requests of a batch moved by one job */
#define MG_XFER_GROUP_BYTES (4ull << 20)  /* "small": at most this long */
#define MG_XFER_GROUP_TOTAL (16ull << 20) /* a group's bytes at most (a slot's turn) */

typedef struct mg_xfer_sched mg_xfer_sched;
typedef struct mg_xfer_req mg_xfer_req;

/* One peer's line of requests ready to move; embedded in the caller's peer entry. */
typedef struct mg_xfer_line {
    mg_list ready;             /* mg_xfer_req.node, in order */
    pthread_mutex_t rdma_lock; /* its RDMA jobs take turns on the queue pairs (link.lock) */
    unsigned jobs;             /* its jobs running */
    int io;                    /* its jobs run on the transport threads, else on the workers */
    mg_list_node node;         /* in the scheduler's lines */
    mg_xfer_sched *s;
} mg_xfer_line;

/* A part of a request as a job: the range it moves and whose it is. */
typedef struct mg_xfer_job_part {
    mg_xfer_part m; /* m.next: the next small request's part in a group */
    mg_xfer_req *r;
    uint64_t offset; /* within the request */
    int grouped;     /* run in a group's job (rc is set by it) */
} mg_xfer_job_part;

/* A request as the scheduler sees it; embedded in the caller's request. The caller sets the
 * fields up to `link` before mg_xfer_sched_add; the rest is the scheduler's. */
struct mg_xfer_req {
    mg_xfer_kind kind;
    const void *batch; /* grouping: small requests of one batch back to back run as one job */
    int write;
    uint8_t *local; /* the local range's first byte */
    uint8_t *other; /* COPY: the other range's */
    uint64_t length;
    int lease;                         /* TCP: target is a lease */
    uint64_t target;                   /* TCP: the peer's segment or lease */
    uint64_t remote;                   /* TCP: the offset in it; RDMA: the remote address */
    const uint32_t *lkeys, *rkeys;     /* RDMA */
    const struct mg_segment *unmapped; /* mg_xfer_part.unmapped */
    mg_xfer_link link; /* how its jobs reach the other side (link.stop: &stop; link.in_flight:
                        * the scheduler's counter when NULL) */
    int stop;          /* its stop word: mg_xfer_req_stop */
    mg_list_node node; /* in its line while ready */
    mg_xfer_line *line;
    mg_xfer_job_part one, *parts; /* parts: &one, or an array for a request in several */
    unsigned nparts, parts_left;
};

typedef struct mg_xfer_sched_config {
    mg_engine *workers;    /* copies (COPY requests' lines) */
    mg_engine *io;         /* peers' jobs; NULL: the workers */
    mg_cq *cq;             /* the loop's completion queue */
    unsigned worker_slots; /* jobs on the workers at most (--workers) */
    unsigned io_slots;     /* on the transport threads (--io-threads) */
    unsigned max_parts;    /* parts of one request (--tcp-conns-per-peer, <= MG_XFER_MAX_PARTS) */
    uint64_t slice_bytes;  /* parts are cut on slice boundaries */
    void *arg;
    /* A request takes its slot (it runs now). */
    void (*started)(void *arg, mg_xfer_req *r);
    /* A job of `head`'s (one part, or a group led by head) goes to / came back from a worker. */
    void (*job_started)(void *arg, mg_xfer_req *head);
    void (*job_ended)(void *arg, mg_xfer_req *head);
    /* The request's last part ended: rc 0 or the first failure's MG_ERR_* with its message. */
    void (*ended)(void *arg, mg_xfer_req *r, int rc, const char *msg);
    /* Optional: how jobs are submitted (mg_engine_submit when NULL); tests run them inline. */
    int (*submit)(mg_engine *pool, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *job);
} mg_xfer_sched_config;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_xfer_sched_new(mg_xfer_sched **out, const mg_xfer_sched_config *cfg);
/* Accepts NULL. Jobs must all have come back. */
void mg_xfer_sched_del(mg_xfer_sched *s);
/* Jobs coming back start no others (the daemon stops). */
void mg_xfer_sched_close(mg_xfer_sched *s);
/* Jobs running now on the transport threads (io 1) or the workers (io 0). */
unsigned mg_xfer_sched_jobs(const mg_xfer_sched *s, int io);
/* Data-plane slices its jobs sent and the peers have not answered yet. */
int64_t mg_xfer_sched_slices_in_flight(const mg_xfer_sched *s);

/* A new, empty line of s. */
void mg_xfer_line_init(mg_xfer_sched *s, mg_xfer_line *line, int io);
/* Leaves s; the line must be empty and have no jobs. */
void mg_xfer_line_del(mg_xfer_line *line);
/* How many requests wait in the line. */
size_t mg_xfer_line_ready(const mg_xfer_line *line);

/* r joins the end of `line` and the scheduler starts what the slots allow. */
void mg_xfer_sched_add(mg_xfer_line *line, mg_xfer_req *r);
/* Takes r out of its line before it started. Returns 1 if it was waiting there. */
int mg_xfer_sched_remove(mg_xfer_req *r);
/* Starts ready requests while slots are free (nothing while held). */
void mg_xfer_sched_pump(mg_xfer_sched *s);
/* While held (calls nest), requests joining lines start nothing: a batch's requests all join
 * before the first starts, so that its small ones group instead of the first few taking a job
 * each. Release starts what the slots allow. */
void mg_xfer_sched_hold(mg_xfer_sched *s);
void mg_xfer_sched_release(mg_xfer_sched *s);
/* Asks r's jobs to stop with `err` (an MG_ERR_*; any thread): the movers see it within 100 ms
 * and end with that code. */
void mg_xfer_req_stop(mg_xfer_req *r, int err);
/* r's stop word: 0, or the MG_ERR_* it was asked to stop with. */
int mg_xfer_req_stopped(const mg_xfer_req *r);
/* Bytes of r confirmed so far (its parts' progress). */
uint64_t mg_xfer_req_progress(const mg_xfer_req *r);
/* Forgets r's parts' progress (it runs again). */
void mg_xfer_req_reset(mg_xfer_req *r);
/* Frees r's parts (the request is gone). */
void mg_xfer_req_free(mg_xfer_req *r);

/* Loop. How many parts a request of `length` bytes runs as: up to `max_parts` of at least
 * `part_min` bytes each, 1 when `rdma` (one job posts the slices over every queue pair).
 * *each: the length of every part but the last, a multiple of `slice` (> 0). */
unsigned mg_xfer_plan(uint64_t length, uint64_t slice, unsigned max_parts, uint64_t part_min,
                      int rdma, uint64_t *each);

#ifdef __cplusplus
}
#endif

#endif
