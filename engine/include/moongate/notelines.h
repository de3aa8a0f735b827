/*
 * moongate notification lines: the notifications a daemon sends peers, in order.
 *
 * Three kinds go: a batch's notification (due once the batch's WRITEs to its peer are in place,
 * mg_batch_note), a client's Send (due at once), and the failure notice of a Submit refused for
 * good (due at once: the peers of its notifications hear that nothing was moved, batch id 0).
 * They keep their order per (connection, peer, topic): each waits in its line until every one
 * before it was sent or failed, and goes when it is due as well. One per line is on its way at
 * a time, so the peer queues them in line order. A Send whose caller left before its turn is
 * dropped (not sent).
 *
 * A batch's notification whose WRITEs to its peer did not all land goes as a failure notice
 * instead: the outcome (FAILED, CANCELLED or TIMED_OUT, from the first WRITE that failed), its
 * code and message, and which WRITEs failed. The batch still shows the notification FAILED (the
 * notification proper was not sent), saying whether the notice reached the peer.
 *
 * The front speaks to peers: `deliver` sends an item's message and the front answers with
 * mg_notelines_delivered, on the loop. Once the peer directory is closed, answers are dropped.
 * Loop thread only.
 */
#ifndef MOONGATE_NOTELINES_H
#define MOONGATE_NOTELINES_H

#include "mg_trace.h"
#include "moongate/batches.h"
#include "moongate/peerdir.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_NOTE_PAYLOAD_MAX 65536
#define MG_NOTE_FAILED_MAX  1024 /* failed requests a failure notice lists */

/* The values are those of moongate.v1.Outcome. */
typedef enum {
    MG_OUTCOME_LANDED = 0,
    MG_OUTCOME_FAILED = 1,
    MG_OUTCOME_CANCELLED = 2,
    MG_OUTCOME_TIMED_OUT = 3,
} mg_note_outcome;

typedef struct mg_notelines mg_notelines;
typedef struct mg_note_item mg_note_item;

/* What one Deliver carries to the item's peer. */
typedef struct mg_note_msg {
    mg_xfer_peer *peer;
    const char *topic;
    const uint8_t *payload;
    size_t len;
    uint64_t batch_id;   /* 0: a Send, or a refused Submit's notice */
    uint32_t agent_port; /* a Send to an agent: its port on the peer, which checks it is there */
    mg_note_outcome outcome;
    int code;               /* a failure notice: the gRPC status, */
    const char *message;    /* why, */
    const uint32_t *failed; /* and the requests that failed (at most MG_NOTE_FAILED_MAX) */
    size_t nfailed;
    uint32_t failed_count;
    const mg_trace *trace; /* the item's span (its traceparent goes with it) */
} mg_note_msg;

typedef struct mg_notelines_config {
    mg_peerdir *dir;        /* the peers; once it is closed, answers are dropped and what
                             * becomes due fails (the daemon stops) */
    size_t line_max;        /* Sends and notices waiting per line (--notify-line) */
    struct mg_spans *spans; /* each Deliver of a sampled trace keeps its span (NULL: none) */
    void *arg;
    /* Send m to m->peer; answer with mg_notelines_delivered(item, ...). Returns 0, or -1 with
     * why set (nothing sent). */
    int (*deliver)(void *arg, mg_note_item *item, const mg_note_msg *m, char *why, size_t cap);
    /* Whether a Send's caller (its owner) left: then it is not sent. */
    int (*send_gone)(void *arg, void *owner);
    /* A Send is over: code 0 (sent), a gRPC status and why, or -1 (not sent: its caller left,
     * or the lines are freed). Called once per Send; the owner is the front's again. */
    void (*send_over)(void *arg, void *owner, int code, const char *why);
} mg_notelines_config;

/* Counts of notifications to peers. */
typedef struct mg_notelines_stats {
    uint64_t sent, failed;
} mg_notelines_stats;

/* Returns 0, MG_ERR_INVALID or MG_ERR_NOMEM. */
int mg_notelines_new(mg_notelines **out, const mg_notelines_config *cfg);
/* Accepts NULL. What waits in line is not sent (each Send's send_over hears -1); answers of
 * Delivers on their way must not come after this. */
void mg_notelines_del(mg_notelines *nl);
mg_notelines_stats mg_notelines_stats_of(const mg_notelines *nl);

/* What is wrong with a notification's topic or payload size, or NULL. */
const char *mg_note_bad(const char *topic, size_t payload_len);

/* b's notifications take their places in line (before they can be due). */
void mg_notelines_enter(mg_notelines *nl, mg_batch *b);
/* The batches' note_due (mg_batches_config): n goes when its turn comes. */
void mg_notelines_due(mg_notelines *nl, mg_batch_note *n);
/* A client's Send on connection `conn`: goes when its turn comes; owner hears through
 * send_over. traceparent: the caller's ("" or malformed: no trace). Returns 0, MG_ERR_FULL (the
 * line holds line_max Sends; why says so) or MG_ERR_NOMEM; then owner hears nothing. */
int mg_notelines_send(mg_notelines *nl, uint64_t conn, mg_xfer_peer *p, const char *topic,
                      const uint8_t *payload, size_t len, uint32_t agent_port,
                      const char *traceparent, void *owner, char *why, size_t cap);
/* b's Submit was refused with gRPC status `code` for `why` before b started: when that is for
 * good (a request that can never run as asked), each of b's notifications is replaced by a
 * failure notice to its peer (batch id 0), so that its receivers hear. traceparent: the
 * caller's, continued when sampled. b stays the caller's. */
void mg_notelines_refused(mg_notelines *nl, const mg_batch *b, const char *traceparent, int code,
                          const char *why);
/* The answer to the item's Deliver: status 0 (taken), or a gRPC status and the message;
 * `answered`: the peer answered it (else this daemon could not reach the peer). */
void mg_notelines_delivered(mg_note_item *item, int status, int answered, const char *message);

#ifdef __cplusplus
}
#endif

#endif
