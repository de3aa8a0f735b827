/*
 * mg_client_int: what the client library's files share and programs do not see. mg_client.c
 * owns the connection; mg_client_keep.c the table of what a client of mg_client_open made on its
 * daemon, made again when the daemon comes back (mg_client.h: "Outliving the daemon").
 */
#ifndef MG_CLIENT_INT_H
#define MG_CLIENT_INT_H

#include "mg_client.h"

typedef struct mg_keep mg_keep;

/* ---- mg_client.c ---- */

/* A new connection for c, to the same target, in place of a broken one (its calls ended). Only
 * for clients of mg_client_open, outside their callbacks. Returns 0, or -1 with err set (c is
 * then failed again). */
int mgc_reconnect(mg_client *c, char *err, size_t errcap);
mg_keep *mgc_keep_of(const mg_client *c);
/* Before a call on a client of mg_client_open: a connection the daemon closed since the last
 * call is found now, and restored (mgc_keep_restore). Returns 0, or -1 with *status and message
 * saying why no call may go. */
int mgc_ready(mg_client *c, int *status, char *message, size_t msgcap);
/* Why c's connection broke ("unix:/path: connection closed by the server"), or NULL. */
const char *mgc_fail_msg(const mg_client *c);

/* ---- mg_client_keep.c ---- */

mg_keep *mgc_keep_new(mg_client *c);
void mgc_keep_free(mg_keep *k);
/* The daemon came back refusing this client (its token, or another user's daemon): every call
 * fails with that reason from then on. */
int mgc_keep_refused(const mg_keep *k);
/* Before a call on c, whose connection broke: reconnects within MOONGATE_RECONNECT_S and makes
 * again what c had made. Returns 0 (the call may go), or -1 with *status and message saying why
 * it may not. */
int mgc_keep_restore(mg_client *c, int *status, char *message, size_t msgcap);
/* After a call on c that succeeded: notes what it made or undid (agents, segments). */
void mgc_keep_called(mg_client *c, const char *path, const uint8_t *req, size_t req_len,
                     const uint8_t *resp, size_t resp_len);

/* Segment id, which did not come back after a restart, is forgotten: returns 1; else 0. */
int mgc_keep_forget(mg_client *c, uint64_t id);
/* How segment `id`, registered just now on c, is made again: redo(c, arg, &new_id, ...) returns 0
 * or -1 with err; drop(arg) frees arg when the segment goes. Without this, a segment that is not
 * process memory does not come back. `per_connection`: the daemon lets it go with the
 * connection (GPU memory), so it is made again after any reconnect, not only a restart. */
typedef int (*mgc_redo_fn)(mg_client *c, void *arg, uint64_t *id, char *err, size_t errcap);
void mgc_keep_redo(mg_client *c, uint64_t id, mgc_redo_fn redo, void (*drop)(void *arg), void *arg,
                   int per_connection);

#endif
