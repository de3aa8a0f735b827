/*
 * moongate fd handles: file descriptors local clients passed to the daemon, each waiting for
 * one registration to name it.
 *
 * A client cannot attach a descriptor to a gRPC call, so it passes it first (the gateway's fd
 * socket, SCM_RIGHTS) and gets a handle: a random 64-bit number bound to who passed it — the
 * kernel's uid and pid of the sender and the tenant it was admitted as. RegisterSegment then
 * names the handle; the descriptor goes to the one caller with the same uid, pid and tenant, once.
 * A handle nobody takes within the table's ttl is dropped and its descriptor closed.
 *
 * Limits: max_handles descriptors held at once in all, and max_per_key of one key (the gateway's
 * key is the fd-socket connection). The last handles used or expired are remembered (not their
 * descriptors), so that a second use or a late one is told which it was.
 *
 * Threads: a table is used by one thread (the daemon's loop).
 */
#ifndef MOONGATE_FDHANDLES_H
#define MOONGATE_FDHANDLES_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_fd_handles mg_fd_handles;

typedef struct mg_fd_owner {
    uint32_t uid; /* SO_PEERCRED of the sender's connection */
    mg_proc proc; /* its process: pid and start time */
    char tenant[MG_SEG_NAME_MAX + 1];
} mg_fd_owner;

typedef struct mg_fd_handles_config {
    uint32_t max_handles; /* descriptors held at once, all keys (>= 1) */
    uint32_t max_per_key; /* of one key (>= 1) */
    uint64_t ttl_ms;      /* a handle's life (>= 1) */
} mg_fd_handles_config;

typedef struct mg_fd_handles_stats {
    uint64_t held;    /* descriptors waiting now */
    uint64_t passed;  /* handles given out, ever */
    uint64_t claimed; /* taken by a registration */
    uint64_t expired; /* closed unclaimed */
    uint64_t refused; /* passes refused for a limit */
} mg_fd_handles_stats;

/* Returns 0, MG_ERR_INVALID (a limit or the ttl is 0) or MG_ERR_NOMEM. */
int mg_fd_handles_new(mg_fd_handles **out, const mg_fd_handles_config *cfg);
/* Closes every descriptor held. Accepts NULL. */
void mg_fd_handles_del(mg_fd_handles *t);

/* Holds `fd` for `who` under `key` until now_ms + ttl. Returns 0 with *handle (never 0) and the
 * descriptor the table's, or MG_ERR_FULL (err, cap bytes, names the limit) with fd still the
 * caller's. */
int mg_fd_handles_put(mg_fd_handles *t, int fd, const mg_fd_owner *who, uint64_t key,
                      uint64_t now_ms, uint64_t *handle, char *err, size_t cap);
/* Gives the descriptor of `handle` to `who`, once. Returns 0 with *fd (now the caller's), or
 * with err set: MG_ERR_NOT_FOUND (unknown, already used or expired: err says which) or
 * MG_ERR_PERMISSION (passed by another process, user or tenant; the handle stays its owner's). */
int mg_fd_handles_take(mg_fd_handles *t, uint64_t handle, const mg_fd_owner *who, uint64_t now_ms,
                       int *fd, char *err, size_t cap);
/* Closes the descriptors whose time is up at now_ms. Returns how many. */
size_t mg_fd_handles_expire(mg_fd_handles *t, uint64_t now_ms);
/* Descriptors `key` holds now. */
uint32_t mg_fd_handles_count(const mg_fd_handles *t, uint64_t key);
uint64_t mg_fd_handles_ttl_ms(const mg_fd_handles *t);
void mg_fd_handles_get_stats(const mg_fd_handles *t, mg_fd_handles_stats *out);

#ifdef __cplusplus
}
#endif

#endif
