/*
 * mg_fdhandles: the table of passed descriptors (see moongate/fdhandles.h).
 *
 * Storage: an array of at most max_handles entries, unordered (a removal moves the last entry
 * into the hole), searched linearly: it is small (--max-fd-handles, a thousand or so) and used
 * once per registration by descriptor. Handles come from getrandom(), so one client cannot guess
 * another's. A ring of the last GONE_MAX handles used or expired answers a late or second use.
 */
#include "moongate/fdhandles.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define GONE_MAX 256

typedef struct {
    uint64_t handle;
    int fd;
    uint64_t key;
    uint64_t expires_ms;
    mg_fd_owner owner;
} entry;

typedef struct {
    uint64_t handle;
    int expired; /* 1: its time ran out; 0: a registration took it */
} gone;

struct mg_fd_handles {
    mg_fd_handles_config cfg;
    entry *e;
    uint32_t n;
    gone gone[GONE_MAX];
    uint32_t gone_next;
    mg_fd_handles_stats stats;
};

int mg_fd_handles_new(mg_fd_handles **out, const mg_fd_handles_config *cfg)
{
    mg_fd_handles *t;
    if (cfg->max_handles == 0 || cfg->max_per_key == 0 || cfg->ttl_ms == 0)
        return MG_ERR_INVALID;
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->e = calloc(cfg->max_handles, sizeof(*t->e))) == NULL) {
        free(t);
        return MG_ERR_NOMEM;
    }
    t->cfg = *cfg;
    *out = t;
    return 0;
}

void mg_fd_handles_del(mg_fd_handles *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 0; i < t->n; i++)
        close(t->e[i].fd);
    free(t->e);
    free(t);
}

static entry *find(mg_fd_handles *t, uint64_t handle)
{
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->e[i].handle == handle)
            return &t->e[i];
    }
    return NULL;
}

/* A fresh handle: random, not 0, not one held now. */
static uint64_t new_handle(mg_fd_handles *t)
{
    uint64_t h = 0;
    while (h == 0 || find(t, h) != NULL) {
        if (getrandom(&h, sizeof(h), 0) != (ssize_t)sizeof(h))
            h = 0;
    }
    return h;
}

/* Forgets entry e (its descriptor is closed or given away) and remembers why. */
static void drop(mg_fd_handles *t, entry *e, int expired)
{
    t->gone[t->gone_next] = (gone){e->handle, expired};
    t->gone_next = (t->gone_next + 1) % GONE_MAX;
    *e = t->e[--t->n];
}

uint32_t mg_fd_handles_count(const mg_fd_handles *t, uint64_t key)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < t->n; i++)
        c += t->e[i].key == key;
    return c;
}

int mg_fd_handles_put(mg_fd_handles *t, int fd, const mg_fd_owner *who, uint64_t key,
                      uint64_t now_ms, uint64_t *handle, char *err, size_t cap)
{
    entry *e;
    mg_fd_handles_expire(t, now_ms);
    if (t->n == t->cfg.max_handles) {
        snprintf(err, cap,
                 "the daemon holds %u passed descriptors nobody registered yet, its limit "
                 "(--max-fd-handles); register or let them expire first",
                 t->n);
        t->stats.refused++;
        return MG_ERR_FULL;
    }
    if (mg_fd_handles_count(t, key) >= t->cfg.max_per_key) {
        snprintf(err, cap,
                 "this connection passed %u descriptors nobody registered yet, the limit of one "
                 "connection (--max-unclaimed-fds)",
                 t->cfg.max_per_key);
        t->stats.refused++;
        return MG_ERR_FULL;
    }
    e = &t->e[t->n];
    e->handle = new_handle(t);
    e->fd = fd;
    e->key = key;
    e->expires_ms = now_ms + t->cfg.ttl_ms;
    e->owner = *who;
    t->n++;
    t->stats.passed++;
    *handle = e->handle;
    return 0;
}

int mg_fd_handles_take(mg_fd_handles *t, uint64_t handle, const mg_fd_owner *who, uint64_t now_ms,
                       int *fd, char *err, size_t cap)
{
    entry *e;
    mg_fd_handles_expire(t, now_ms);
    e = handle ? find(t, handle) : NULL;
    if (e == NULL) {
        for (uint32_t i = 0; handle && i < GONE_MAX; i++) {
            if (t->gone[i].handle != handle)
                continue;
            if (t->gone[i].expired)
                snprintf(err, cap,
                         "fd handle %llu expired: a handle lives %llu ms after its descriptor "
                         "was passed (--fd-handle-ttl); pass the descriptor again",
                         (unsigned long long)handle, (unsigned long long)t->cfg.ttl_ms);
            else
                snprintf(err, cap,
                         "fd handle %llu was used already: a handle names its descriptor for "
                         "one registration; pass the descriptor again",
                         (unsigned long long)handle);
            return MG_ERR_NOT_FOUND;
        }
        snprintf(err, cap, "no fd handle %llu: pass the descriptor on the daemon's fd socket first",
                 (unsigned long long)handle);
        return MG_ERR_NOT_FOUND;
    }
    if (e->owner.uid != who->uid || e->owner.proc.pid != who->proc.pid ||
        e->owner.proc.start != who->proc.start) {
        snprintf(err, cap,
                 "fd handle %llu was passed by uid %u pid %d; only that process may register "
                 "it (this call: uid %u pid %d%s)",
                 (unsigned long long)handle, (unsigned)e->owner.uid, (int)e->owner.proc.pid,
                 (unsigned)who->uid, (int)who->proc.pid,
                 e->owner.proc.pid == who->proc.pid ? ", another process with the same pid" : "");
        return MG_ERR_PERMISSION;
    }
    if (strcmp(e->owner.tenant, who->tenant) != 0) {
        snprintf(err, cap, "fd handle %llu was passed as tenant \"%s\"; this call is tenant \"%s\"",
                 (unsigned long long)handle, e->owner.tenant, who->tenant);
        return MG_ERR_PERMISSION;
    }
    *fd = e->fd;
    t->stats.claimed++;
    drop(t, e, 0);
    return 0;
}

size_t mg_fd_handles_expire(mg_fd_handles *t, uint64_t now_ms)
{
    size_t n = 0;
    for (uint32_t i = 0; i < t->n;) {
        if (t->e[i].expires_ms > now_ms) {
            i++;
            continue;
        }
        close(t->e[i].fd);
        drop(t, &t->e[i], 1); /* the last entry moves to i: look at i again */
        n++;
    }
    t->stats.expired += n;
    return n;
}

uint64_t mg_fd_handles_ttl_ms(const mg_fd_handles *t)
{
    return t->cfg.ttl_ms;
}

void mg_fd_handles_get_stats(const mg_fd_handles *t, mg_fd_handles_stats *out)
{
    *out = t->stats;
    out->held = t->n;
}
