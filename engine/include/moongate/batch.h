/*
 * moongate transfer batch state: the life of each request of a batch and what the batch as a
 * whole says, kept apart from the gRPC service so that every transition can be tested.
 *
 *   PENDING --start--> RUNNING --end(ok)--> DONE
 *      ^                  |  \
 *      +-----requeue------+   `--end(err)--> FAILED
 *   PENDING --end(err)--> FAILED          (cancelled or timed out before it ran)
 *
 * A request goes back from RUNNING to PENDING at most once for each cause: its peer restarted
 * (a new session is asked for), or the region an agent's address named was registered again
 * (the peer is asked where the address is now). An ended request never changes again: a second end
 * is refused, so the batch's counts cannot run ahead of its requests. The batch is over when every
 * request has ended and every notification it carries was sent or failed; it then says FAILED if
 * any of them failed, DONE otherwise, and RUNNING until then.
 */
#ifndef MOONGATE_BATCH_H
#define MOONGATE_BATCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The values are those of moongate.v1.RequestState. */
typedef enum {
    MG_REQ_PENDING = 0,
    MG_REQ_RUNNING = 1,
    MG_REQ_DONE = 2,
    MG_REQ_FAILED = 3,
} mg_req_state;

typedef struct mg_req_life {
    mg_req_state state;
    unsigned requeued; /* why it went back to PENDING: MG_REQUEUE_* bits, each once */
} mg_req_life;

typedef struct mg_batch_counts {
    size_t n;            /* requests */
    size_t done, failed; /* requests ended */
    size_t notes;        /* notifications */
    size_t notes_over, notes_failed;
} mg_batch_counts;

/* Each returns 0, or -1 (nothing changed) when the request is not in a state that allows it. */
int mg_req_start(mg_req_life *r);
/* Back to PENDING for `cause` (one MG_REQUEUE_* bit): refused when r is not running, or went
 * back for that cause before. */
#define MG_REQUEUE_SESSION 1u /* its peer refused the session's token: a new session */
#define MG_REQUEUE_TARGET  2u /* its peer refused the segment an agent's address named */
int mg_req_requeue(mg_req_life *r, unsigned cause);
/* Ends r: DONE when failed is 0, else FAILED; counts it in c. */
int mg_req_end(mg_req_life *r, mg_batch_counts *c, int failed);
/* A notification of the batch was sent (failed 0) or failed. -1 when all are already over. */
int mg_batch_note_over(mg_batch_counts *c, int failed);

/* A notification the batch sends one peer once every request of the batch to that peer ended
 * (NOTIFY's contract: the bytes are in place before the receiver hears of them — a WRITE's
 * acknowledged on the peer, a READ's landed here, so that the peer may reuse the memory it was
 * read from). The values are those of moongate.v1.NotifyState. */
typedef enum {
    MG_NOTE_WAITING = 0,
    MG_NOTE_SENDING = 1,
    MG_NOTE_SENT = 2,
    MG_NOTE_FAILED = 3,
} mg_note_state;

typedef struct mg_note_gate {
    mg_note_state state;
    size_t reqs_left;  /* requests of the batch to the peer not ended */
    size_t failed_req; /* 1 + the index of the first of them that failed, or 0 */
} mg_note_gate;

/* Request `index` of the batch to the note's peer ended (failed or not). Returns 1 when the
 * note is due now — its last request ended: send it, or fail it when failed_req says one
 * failed — and 0 otherwise (requests still running, or the note is no longer waiting). */
int mg_note_req_ended(mg_note_gate *g, size_t index, int failed);

int mg_batch_over(const mg_batch_counts *c);
/* RUNNING until over, then FAILED or DONE (as mg_req_state values). */
mg_req_state mg_batch_state(const mg_batch_counts *c);

#ifdef __cplusplus
}
#endif

#endif
