/*
 * moongate rings: the submission rings of local clients (moongate/ringwire.h), the engine's
 * side. One ring thread takes submissions from every ring: it copies each out of the shared
 * memory before it looks at it, checks its shape, and hands it to the loop through the loop's
 * completion queue (mg_cq_post), so the loop never reads what a process may still be
 * writing and never waits on it. The loop turns a submission into a batch like any other and
 * answers it, at the batch's end or at once when it is refused, with mg_ring_complete.
 *
 * A ring takes a submission only while its completion queue has room for the answer, counting
 * the answers not yet written: back-pressure, never loss. A ring whose counters the process
 * made impossible is broken: nothing more is taken from it, and the process is told in the
 * header (`broken`, `why`) and by the completion bell.
 *
 * Threads: mg_rings_new starts the ring thread; every other function is the loop's, except
 * that a submission may be freed on any thread.
 */
#ifndef MOONGATE_RING_H
#define MOONGATE_RING_H

#include "moongate/engine.h"
#include "moongate/ringwire.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_rings mg_rings;
typedef struct mg_ring mg_ring;

/* A submission as the ring thread copied and checked it. */
typedef struct mg_ring_sub {
    mg_ring *ring;    /* referenced until mg_ring_sub_free */
    mg_ring_sqe e;    /* its first slot */
    uint32_t *local;  /* MG_RING_PAIRS: the count local indices, */
    uint32_t *remote; /* and remote ones */
    char *note;       /* MG_RING_NOTIFY: e.note_len bytes, topic NUL payload (malloc'd) */
    char bad[96];     /* not "": what is wrong with its shape (answer INVALID_ARGUMENT) */
    unsigned answers; /* completions it is owed: 2 with MG_RING_ACCEPTED, else 1 */
} mg_ring_sub;

/* Runs on the loop for each submission; the callee frees it (mg_ring_sub_free). */
typedef void (*mg_ring_sub_fn)(void *arg, mg_ring_sub *s);

/* Starts the ring thread; its submissions go to the loop draining cq, to fn(arg, sub).
 * Returns 0, MG_ERR_SYSTEM or MG_ERR_NOMEM. */
int mg_rings_new(mg_rings **out, mg_cq *cq, mg_ring_sub_fn fn, void *arg);
/* Stops and joins the ring thread (rings still open are let go; submissions already handed
 * over are freed unseen when their ring was closed). Accepts NULL. */
void mg_rings_del(mg_rings *rs);
/* Rings open, and submissions taken from them, ever. */
size_t mg_rings_open(const mg_rings *rs);
uint64_t mg_rings_taken(const mg_rings *rs);

/* A new ring of `entries` slots each way (a power of two, 8..MG_RING_MAX_ENTRIES) for the
 * front's `front`: its memory (a sealed memfd) and its two eventfds, not served yet. Returns 0,
 * or MG_ERR_INVALID / MG_ERR_SYSTEM / MG_ERR_NOMEM with err set. */
int mg_ring_new(mg_rings *rs, uint32_t entries, void *front, mg_ring **out, char *err, size_t cap);
/* Its id (unique in the daemon), front, and the three descriptors the process gets in
 * MG_RING_HELLO: the memory, the doorbell and the completion bell (the ring keeps them). */
uint64_t mg_ring_id(const mg_ring *r);
void *mg_ring_front(const mg_ring *r);
void mg_ring_fds(const mg_ring *r, int fds[3], uint64_t *size);
/* The ring thread starts taking from it. */
void mg_ring_start(mg_ring *r);
/* Nothing more is taken from it or answered on it (its process is gone). */
void mg_ring_close(mg_ring *r);
/* The front lets go (closing it first): the ring is freed once the thread and every submission
 * let go of it too. Accepts NULL. */
void mg_ring_free(mg_ring *r);
/* Writes one of a submission's answers and rings the bell if the process waits for one. A
 * submission refused before its acceptance is answered once: mg_ring_forgo gives back the
 * room of the answer it was owed and will not get. */
void mg_ring_complete(mg_ring *r, const mg_ring_cqe *c);
void mg_ring_forgo(mg_ring *r);
void mg_ring_sub_free(mg_ring_sub *s);

/* What the ring thread does with the submission at slot counter `head` of a submission queue
 * of `entries` slots (a power of two) holding `avail` published slots from there: copies it
 * into s (its first slot into s->e, an MG_RING_PAIRS entry's pairs into s->local and
 * s->remote, a note into s->note, malloc'd) and checks its shape (s->bad says what is wrong; the
 * entry then takes one slot). Returns the slots it takes (>= 1), or 0 when out of memory. */
uint32_t mg_ring_sqe_copy(const uint8_t *sq, uint32_t entries, uint32_t head, uint32_t avail,
                          mg_ring_sub *s);

#ifdef __cplusplus
}
#endif

#endif
