/*
 * libtransfer_engine internals: an engine is one connection to the daemon (mg_client), run by a
 * thread of its own (its libevent loop). Callers' threads hand it calls (te_call) and wait for
 * their answers; a submit is one Submit call with `wait`, nobody waiting, whose answer (the batch
 * at its end) the loop writes into a snapshot that getTransferStatus reads without the engine's
 * lock (no call per poll).
 */
#ifndef TE_INTERNAL_H
#define TE_INTERNAL_H

#include "mg_client.h"
#include "transfer_engine_c.h"

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct event;

typedef struct te_task {
    int status; /* STATUS_* */
    uint64_t bytes;
} te_task;

enum { TE_NOTE_NONE, TE_NOTE_WAITING, TE_NOTE_SENDING, TE_NOTE_SENT, TE_NOTE_FAILED };

/* Batches live in chunks that never move, so that getTransferStatus reads a task's state
 * without the engine's lock (a caller polling in a tight loop would otherwise keep the loop
 * thread from writing it): gen, n, the tasks' fields and note_state are written with release
 * stores (under e->mu) and read with acquire loads.
 *
 * What a reader may rely on is the order of each publish: a value read with an acquire load
 * shows every store made before the release store that wrote it. So a writer stores first what
 * a reader reads second: a task's bytes, then its status (the reader loads the status, then the
 * bytes: a COMPLETED status comes with the final count, never an older one); a batch's tasks,
 * then n; a batch's fields, then gen; a chunk's slots, then the chunk's pointer. Each publish
 * point says so. */
#define TE_CHUNK      256
#define TE_MAX_CHUNKS 4096
#define TE_SET(x, v)  __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define TE_GET(x)     __atomic_load_n(&(x), __ATOMIC_ACQUIRE)

typedef struct te_batch {
    uint32_t gen; /* 0: a free slot */
    size_t slot;
    size_t cap, n;
    te_task *tasks;
    int streams;        /* submits not yet ended (their Submit calls not answered yet) */
    char *note_to;      /* the agent told once every task is done (submitTransferWithNotify) */
    char *note_payload; /* {"name":..., "msg":...} */
    int note_state;     /* TE_NOTE_* */
} te_batch;

/* A registered range. Device memory is one region per allocation the range crosses (each its
 * own dma-buf registration); `group` ties them to the address registerLocalMemory was given. */
typedef struct te_region {
    uintptr_t addr;
    size_t len;
    uint64_t segment;
    int remote;      /* registered remote-accessible (registered so again after a restart) */
    int device;      /* -1: host memory; else the CUDA device (registered by its dma-buf) */
    int staged;      /* device memory staged by this process's copy thread (no RDMA path) */
    uintptr_t group; /* the address registerLocalMemory was given */
} te_region;

typedef struct te_call te_call;

typedef struct te_engine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    struct event_base *base;
    struct event *wake;
    int efd;
    mg_client *client;
    char target[4200];
    char token[1025];
    int stopping, running;
    te_call *queue;
    char name[129]; /* the agent's name on the daemon */
    char host[256];
    uint32_t port;
    te_batch *chunks[TE_MAX_CHUNKS];
    size_t n_batches; /* slots made so far */
    uint32_t next_gen;
    char **segs; /* segment id k + 1: its name (NULL once removed) */
    size_t n_segs;
    te_region *regions;
    size_t n_regions;
    /* Test only, from MG_TE_TEST_STRADDLE=1 at createTransferEngine: every terminal status the
     * loop thread publishes waits for a poll to be between its two loads, and that poll waits
     * for the publish (te_test_straddle): each such poll straddles a publish, the case a torn
     * read needs. Never set in production. */
    int test_straddle;
    int test_mid_poll; /* a poll is between its two loads (atomic) */
    /* The daemon restarted (te_restore.c): while the restorer thread reconnects and makes the
     * agent and regions again, callers' calls wait (te_gate); if it gives up, `gone` says why
     * and calls fail with it. Under mu. */
    uint64_t bound_ms;   /* MOONGATE_RECONNECT_S (0: never reconnects) */
    uint64_t backoff_ms; /* MOONGATE_RECONNECT_BACKOFF_MS: the longest wait between tries */
    int restoring;
    int quit;        /* the engine is being destroyed: the restorer ends */
    int fatal;       /* gone for good: the daemon back refuses the token, or is another's */
    int retry_once;  /* the restorer tries once (a call after it gave up), not for the bound */
    long sock_owner; /* the uid the daemon's socket belonged to (-1: not known) */
    int restorer_joinable;
    pthread_t restorer;
    char gone[600];
    uint64_t epoch; /* the daemon's, when last seen */
    unsigned restarts;
} te_engine;

/* One unary call, made on the engine's loop. */
struct te_call {
    te_engine *e;
    const char *path;
    uint8_t *req;
    size_t req_len;
    uint64_t timeout_ms;
    uint8_t *resp; /* the answer's bytes when status is 0 */
    size_t resp_len;
    int status; /* gRPC code */
    char msg[512];
    int done;
    int detached; /* nobody waits: the loop frees it */
    int note;     /* the notification of batch `slot`: its outcome goes there */
    /* Submit: the batch slot, generation and task range its answer ends */
    int watch;
    size_t slot;
    uint32_t gen;
    size_t first, count;
    te_call *next;
};

/* Logs one line to stderr, prefixed "moongate transfer_engine: ". */
void te_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define TE_LOG_ONCE(...)                                       \
    do {                                                       \
        static int said_;                                      \
        if (!__atomic_exchange_n(&said_, 1, __ATOMIC_RELAXED)) \
            te_log(__VA_ARGS__);                               \
    } while (0)

/* Starts the engine's loop thread and connection. Returns 0, or -1 (logged). */
int te_start(te_engine *e);
/* On the loop: drops the connection and opens a new one. Returns 0, or -1 with why set. */
int te_connect(te_engine *e, char *why, size_t cap);
/* A caller's thread: replaces the connection (on the loop) and waits. Returns a gRPC status. */
int te_call_reconnect(te_engine *e, char *msg, size_t msgcap);

/* ---- te_restore.c: the daemon restarted ---- */

/* The connection broke (mg_client_options.on_broken, on the loop): the restorer starts. */
void te_broken(void *arg, const char *why);
/* A caller's thread, after the engine gave up on its daemon: one more try (it may be back). */
void te_retry(te_engine *e);
/* A caller's thread: waits while the engine restores (the restorer itself passes). */
void te_gate(te_engine *e);
/* The reconnect settings from the environment, and the daemon's epoch now. */
void te_restore_init(te_engine *e);
/* Joins a restorer that ended or is told to (te_stop). */
void te_restore_stop(te_engine *e);
/* RegisterAgent of e->name with `port` (0: the daemon assigns); e->port is set. Returns a gRPC
 * status, msg set. */
int te_register_agent(te_engine *e, uint64_t port, char *msg, size_t msgcap);
/* Region k registered again (after a restart); its segment id updated. Returns a gRPC
 * status, msg set. */
int te_register_again(te_engine *e, size_t k, char *msg, size_t msgcap);
/* Stops the loop thread and frees the connection. */
void te_stop(te_engine *e);

/* A call from a caller's thread: packs `req`, hands it to the loop and waits for the answer.
 * Returns the gRPC status (0: OK, with *resp and *resp_len set when asked for; free *resp),
 * and msg. */
int te_call_run(te_engine *e, const char *path, const ProtobufCMessage *req, uint64_t timeout_ms,
                uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap);
/* A Submit (with `wait`) of tasks [first, first + count) of a batch, handed to the loop without
 * waiting: its answer, the batch at its end, makes the tasks' statuses (a failed call fails
 * them, logged with the daemon's reason). Returns 0, or a gRPC status with msg when the call
 * cannot go (the engine is done with its daemon, no memory). */
int te_call_submit(te_engine *e, const ProtobufCMessage *req, size_t slot, uint32_t gen,
                   size_t first, size_t count, char *msg, size_t msgcap);

/* The batch in slot s holding generation gen (not 0), or NULL. Safe without e->mu. */
te_batch *te_slot(te_engine *e, size_t s, uint32_t gen);
/* The batch a handle names, or NULL. Safe without e->mu. */
te_batch *te_batch_find(te_engine *e, uint64_t id, size_t *slot);
/* What a task reports (the notification a batch carries holds COMPLETED back until sent). */
int te_task_status(const te_batch *b, size_t k);
/* Test only (e->test_straddle): a poll of task k of b, between its two loads, marks itself there
 * and waits (bounded) until the task's status is terminal. */
void te_test_straddle(te_engine *e, const te_batch *b, size_t k);
/* With e->mu held: [addr, addr + len) lies in one region this engine registered. */
int te_holds(te_engine *e, uintptr_t addr, size_t len);
/* A notification's payload (malloc'd), or NULL: {"name": name, "msg": msg}, each as a JSON
 * string when it is UTF-8, else as "name_b64" / "msg_b64", its bytes in base64 (as
 * moongate.compat.mooncake writes and reads them). */
char *te_note_payload(const char *name, const char *msg);
/* A payload's o[key] (or o[key + "_b64"] decoded) as a C string (malloc'd; up to its first
 * NUL), or NULL when it has neither. */
char *te_note_text(json_t *o, const char *key);
/* The topic an engine's notifications arrive on (shared with moongate.compat.mooncake). */
void te_note_topic(char *out, size_t cap, uint32_t port);
/* With e->mu held: once every submit of the batch has ended, sends its notification when every
 * task completed (else marks it failed). */
void te_batch_settle(te_engine *e, te_batch *b);

#endif
