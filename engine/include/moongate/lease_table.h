/*
 * moongate lease table: the leases peers may reach, for the data plane's threads.
 *
 * The pool and its leases belong to the loop thread, but a peer's slice aimed at a lease is
 * served on a data-plane connection thread. The loop therefore publishes every
 * remote-accessible lease here (its id, tenant, first byte and requested length) while holding
 * the lease in use, so its range cannot be handed to anyone else; connection threads look
 * leases up and mark them used for the length of one slice. When the lease ends (released,
 * expired, revoked) the loop withdraws it: at once when no slice is using it, else when the
 * last one finishes (mg_lease_table_collect). Until then its bytes stay the lease's.
 *
 * Thread-safe (one mutex; a slice holds it only to look up and to finish).
 */
#ifndef MOONGATE_LEASE_TABLE_H
#define MOONGATE_LEASE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_lease_table mg_lease_table;
typedef struct mg_lease_slot mg_lease_slot;

int mg_lease_table_new(mg_lease_table **out);
/* Frees the table. Entries still there are dropped (their handles are the caller's). */
void mg_lease_table_del(mg_lease_table *t);

/* Publishes lease `id` of `tenant`: its bytes are [addr, addr + length). `handle` comes back
 * from withdraw or collect. Returns 0, MG_ERR_EXISTS or MG_ERR_NOMEM. */
int mg_lease_table_put(mg_lease_table *t, uint64_t id, const char *tenant, uint8_t *addr,
                       uint64_t length, void *handle);
/* Withdraws lease `id`: no new slice finds it. Returns its handle when no slice uses it (the
 * caller lets the lease go now), NULL when slices still do (or it was not published). */
void *mg_lease_table_withdraw(mg_lease_table *t, uint64_t id);
/* Handles of withdrawn leases whose last slice has finished since; at most max. */
size_t mg_lease_table_collect(mg_lease_table *t, void **out, size_t max);

/* A slice of [offset, offset + length) of lease `id` for `tenant`: 0 with the address of its
 * first byte and a slot to end it with; MG_ERR_NOT_FOUND (no such lease of that tenant, or
 * withdrawn) or MG_ERR_RANGE (outside the lease's requested length). */
int mg_lease_table_begin(mg_lease_table *t, uint64_t id, const char *tenant, uint64_t offset,
                         uint64_t length, uint8_t **addr, mg_lease_slot **slot);
void mg_lease_table_end(mg_lease_table *t, mg_lease_slot *slot);
/* Whether lease `id` of `tenant` is published, and its requested length. 0 or MG_ERR_NOT_FOUND. */
int mg_lease_table_describe(mg_lease_table *t, uint64_t id, const char *tenant, uint64_t *length);

#ifdef __cplusplus
}
#endif

#endif
