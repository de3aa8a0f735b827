/* mg_xlists: prepared lists of ranges that batches name by index (moongate/xlists.h). */
#include "moongate/xlists.h"

#include "moongate/mg_error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_xlists {
    mg_idmap ids;
    size_t n;
    uint64_t ranges, max_ranges;
};

int mg_xlists_new(mg_xlists **out, uint64_t max_ranges)
{
    mg_xlists *s = calloc(1, sizeof(*s));
    if (s == NULL || mg_idmap_init(&s->ids, 4096) != 0) {
        free(s);
        return MG_ERR_NOMEM;
    }
    s->max_ranges = max_ranges;
    *out = s;
    return 0;
}

static void list_free(mg_xlist *l)
{
    free(l->addrs);
    free(l->lens);
    free(l);
}

void mg_xlists_del(mg_xlists *s)
{
    mg_idmap_node *n;
    if (s == NULL)
        return;
    while ((n = s->ids.root) != NULL) {
        mg_idmap_remove(&s->ids, n);
        list_free((mg_xlist *)n);
    }
    mg_idmap_free(&s->ids);
    free(s);
}

int mg_xlists_add(mg_xlists *s, const char *tenant, uint64_t owner, const char *peer,
                  const char *agent, const uint64_t *addrs, const uint64_t *lens, size_t n,
                  mg_xlist **out, size_t *bad)
{
    mg_xlist *l;
    *bad = n;
    if (n == 0 || n > UINT32_MAX || strlen(peer) > MG_PEER_NAME_MAX ||
        strlen(agent) > MG_AGENT_NAME_MAX || strlen(tenant) > MG_SEG_NAME_MAX)
        return MG_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (lens[i] == 0 || addrs[i] > UINT64_MAX - lens[i]) {
            *bad = i;
            return MG_ERR_INVALID;
        }
    if (n > s->max_ranges - s->ranges)
        return MG_ERR_FULL;
    if ((l = calloc(1, sizeof(*l))) == NULL || (l->addrs = malloc(n * sizeof(*addrs))) == NULL ||
        (l->lens = malloc(n * sizeof(*lens))) == NULL) {
        if (l)
            list_free(l);
        return MG_ERR_NOMEM;
    }
    memcpy(l->addrs, addrs, n * sizeof(*addrs));
    memcpy(l->lens, lens, n * sizeof(*lens));
    l->n = (uint32_t)n;
    l->owner = owner;
    snprintf(l->tenant, sizeof(l->tenant), "%s", tenant);
    snprintf(l->peer, sizeof(l->peer), "%s", peer);
    snprintf(l->agent, sizeof(l->agent), "%s", agent);
    l->node.id = mg_idmap_mint(&s->ids);
    mg_idmap_insert(&s->ids, &l->node);
    s->n++;
    s->ranges += n;
    *out = l;
    return 0;
}

mg_xlist *mg_xlists_find(mg_xlists *s, uint64_t id, const char *tenant, uint64_t owner)
{
    mg_xlist *l = (mg_xlist *)mg_idmap_find(&s->ids, id);
    return l && l->owner == owner && !strcmp(l->tenant, tenant) ? l : NULL;
}

void mg_xlists_drop(mg_xlists *s, mg_xlist *l)
{
    mg_idmap_remove(&s->ids, &l->node);
    s->n--;
    s->ranges -= l->n;
    list_free(l);
}

size_t mg_xlists_count(const mg_xlists *s)
{
    return s->n;
}

uint64_t mg_xlists_ranges(const mg_xlists *s)
{
    return s->ranges;
}

const char *mg_xlists_check_pairs(const mg_xlist *local, const mg_xlist *remote, const uint32_t *li,
                                  size_t nl, const uint32_t *ri, size_t nr, char *why, size_t cap)
{
    if (local->agent[0] || local->peer[0])
        return "local_list is an agent's memory, not the caller's own (prepare it with peer "
               "and remote_agent \"\")";
    if (!remote->agent[0])
        return "remote_list is the caller's own memory: prepare it for an agent (remote_agent)";
    if (nl != nr || nl == 0) {
        snprintf(why, cap, "%zu local indices and %zu remote: one pair each, at least one", nl, nr);
        return why;
    }
    for (size_t k = 0; k < nl; k++) {
        if (li[k] >= local->n || ri[k] >= remote->n) {
            int l = li[k] >= local->n;
            snprintf(why, cap,
                     "pair %zu: %s index %" PRIu32 " is past the list's %" PRIu32 " ranges", k,
                     l ? "local" : "remote", l ? li[k] : ri[k], l ? local->n : remote->n);
            return why;
        }
        if (local->lens[li[k]] != remote->lens[ri[k]]) {
            snprintf(why, cap,
                     "pair %zu: local range %" PRIu32 " is %" PRIu64 " bytes, remote range %" PRIu32
                     " %" PRIu64,
                     k, li[k], local->lens[li[k]], ri[k], remote->lens[ri[k]]);
            return why;
        }
    }
    return NULL;
}
