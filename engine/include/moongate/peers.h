/*
 * moongate peer cache: what this daemon knows of its peers' segments and leases.
 *
 * A transfer names a remote target by peer and id; before moving bytes the daemon needs the
 * target's descriptor (size, remote accessibility, transports). Descriptors are fetched from the
 * peer over the control channel and kept here, per peer and per epoch: a peer's epoch changes
 * every time it starts, and everything learnt of an earlier epoch is forgotten the moment a
 * newer one is seen (a restarted peer's ids mean nothing any more). The caller re-fetches a
 * missing or forgotten descriptor once before failing a request.
 *
 * Bounded: at most max_peers peers and max_descs descriptors per peer (the oldest goes first).
 * Not thread-safe: the gateway loop owns it.
 */
#ifndef MOONGATE_PEERS_H
#define MOONGATE_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_peer_cache mg_peer_cache;

#define MG_PEER_NAME_MAX 255 /* "host:port" */

typedef struct mg_remote_desc {
    uint64_t id;
    int is_lease;
    uint64_t size;
    int remote_accessible;
    unsigned transports; /* bit 1 << MG_TRANSPORT_* */
    uint64_t rdma_addr;  /* with MG_TRANSPORT_RDMA: where the target starts, and its key */
    uint32_t rdma_rkey;  /* on the peer's device 0, and on each of its devices: */
    uint32_t rdma_rkeys[8];
    unsigned rdma_nkeys;
} mg_remote_desc;

typedef struct mg_peer_info {
    char name[MG_PEER_NAME_MAX + 1];
    uint64_t epoch;
    uint64_t descs;
    uint64_t epoch_changes; /* restarts seen */
    uint64_t seen_ms;       /* when the peer last told us its epoch */
} mg_peer_info;

int mg_peer_cache_new(mg_peer_cache **out, size_t max_peers, size_t max_descs);
void mg_peer_cache_del(mg_peer_cache *c);

/* The peer said its epoch is `epoch` (now_ms: when). Returns 1 when that is news (a new peer or
 * a restart: the peer's descriptors were forgotten), 0 when it was known, MG_ERR_FULL when the
 * peer is new and max_peers are known, MG_ERR_INVALID for a bad name or epoch 0. */
int mg_peer_cache_epoch(mg_peer_cache *c, const char *peer, uint64_t epoch, uint64_t now_ms);
/* The peer's epoch as last told, or 0 when it is not known. */
uint64_t mg_peer_cache_epoch_of(const mg_peer_cache *c, const char *peer);
/* Stores a descriptor the peer gave under `epoch`. Returns 0, or MG_ERR_NOT_FOUND when the peer
 * is unknown or its epoch is no longer `epoch` (an answer from its previous life: dropped). */
int mg_peer_cache_put(mg_peer_cache *c, const char *peer, uint64_t epoch, const mg_remote_desc *d);
/* Finds a descriptor. Returns 0 with it and the epoch it belongs to, or MG_ERR_NOT_FOUND. */
int mg_peer_cache_get(mg_peer_cache *c, const char *peer, uint64_t id, int is_lease,
                      mg_remote_desc *out, uint64_t *epoch);
/* Whether a transfer may target [offset, offset + length) of target `id` on peer `name` (shown
 * as `addr` in why), as far as the cache knows: 0 (remote-accessible and inside it; *size its
 * size), MG_ERR_NOT_FOUND (not in the cache: ask the peer), or MG_ERR_PERMISSION (not
 * remote-accessible) or MG_ERR_RANGE (outside it), why saying so. */
int mg_peer_cache_check(mg_peer_cache *c, const char *name, const char *addr, uint64_t id,
                        int is_lease, uint64_t offset, uint64_t length, uint64_t *size, char *why,
                        size_t cap);
/* Forgets one descriptor (the peer said the id is unknown, or refused it). */
void mg_peer_cache_forget(mg_peer_cache *c, const char *peer, uint64_t id, int is_lease);
/* Known peers, in the order they were first seen. Returns how many were written. */
size_t mg_peer_cache_list(const mg_peer_cache *c, mg_peer_info *out, size_t max);

#ifdef __cplusplus
}
#endif

#endif
