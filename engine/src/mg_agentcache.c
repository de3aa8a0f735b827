/*
 * mg_agentcache: what peers said of their agents (moongate/agentcache.h). An array of entries,
 * newest last; an agent's regions are sorted by address and searched by halving.
 */
#include "moongate/agentcache.h"

#include "mg_addr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char peer[MG_PEER_NAME_MAX + 1];
    uint64_t epoch;
    mg_remote_agent a; /* a.regions: the entry's own copy */
} entry;

struct mg_agent_cache {
    entry *v; /* oldest first */
    size_t n, max;
};

/* The digits after agent's last ':' when there are only digits there (the one-string form's
 * port, whatever its value), else NULL. */
static const char *port_digits(const char *agent)
{
    const char *colon = strrchr(agent, ':');
    if (colon == NULL || colon == agent || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return NULL;
    return colon + 1;
}

int mg_agent_ref_parse(const char *peer, const char *agent, int peer_port, mg_agent_ref *out,
                       char *why, size_t cap)
{
    char host[MG_PEER_NAME_MAX - 16]; /* room for brackets and the port */
    const char *digits = peer[0] == '\0' ? port_digits(agent) : NULL;
    int port;
    memset(out, 0, sizeof(*out));
    if (digits) { /* "host:port": an agent's port is 1..65535, and 0 names none */
        unsigned long value = 0;
        for (const char *d = digits; *d && value <= 65535; d++)
            value = value * 10 + (unsigned long)(*d - '0');
        if (value == 0 || value > 65535) {
            snprintf(why, cap, "agent \"%.140s\": port %.24s is not 1..65535", agent, digits);
            return MG_ERR_INVALID;
        }
        if (mg_split_host_port(agent, host, sizeof(host), &port) == 0) {
            int bracket = strchr(host, ':') != NULL;
            snprintf(out->peer, sizeof(out->peer), "%s%s%s:%d", bracket ? "[" : "", host,
                     bracket ? "]" : "", peer_port);
            out->port = (uint32_t)port;
            return 0;
        }
        snprintf(why, cap, "agent \"%.140s\": the host before the port is empty or over %zu bytes",
                 agent, sizeof(host) - 1);
        return MG_ERR_INVALID;
    }
    if (!mg_agent_name_ok(agent)) {
        snprintf(why, cap,
                 "agent \"%.140s\" is neither \"host:port\" (with peer \"\") nor a name (1..%d "
                 "of [A-Za-z0-9._:-])",
                 agent, MG_AGENT_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (strlen(peer) > MG_PEER_NAME_MAX) {
        snprintf(why, cap, "peer is over %d bytes", MG_PEER_NAME_MAX);
        return MG_ERR_INVALID;
    }
    snprintf(out->peer, sizeof(out->peer), "%s", peer);
    snprintf(out->name, sizeof(out->name), "%s", agent);
    return 0;
}

const char *mg_agent_ref_str(const mg_agent_ref *r, char *buf, size_t cap)
{
    if (r->name[0])
        snprintf(buf, cap, "agent \"%s\"", r->name);
    else
        snprintf(buf, cap, "agent at port %u", r->port);
    return buf;
}

int mg_agent_cache_new(mg_agent_cache **out, size_t max_agents)
{
    mg_agent_cache *c;
    *out = NULL;
    if (max_agents == 0)
        return MG_ERR_INVALID;
    c = calloc(1, sizeof(*c));
    if (c == NULL || (c->v = calloc(max_agents, sizeof(*c->v))) == NULL) {
        free(c);
        return MG_ERR_NOMEM;
    }
    c->max = max_agents;
    *out = c;
    return 0;
}

static void drop(mg_agent_cache *c, size_t i)
{
    free((void *)c->v[i].a.regions);
    memmove(&c->v[i], &c->v[i + 1], (c->n - i - 1) * sizeof(*c->v));
    c->n--;
}

void mg_agent_cache_del(mg_agent_cache *c)
{
    if (c == NULL)
        return;
    while (c->n)
        drop(c, c->n - 1);
    free(c->v);
    free(c);
}

static int matches(const entry *e, const char *peer, const mg_agent_ref *ref)
{
    if (strcmp(e->peer, peer) != 0)
        return 0;
    return ref->name[0] ? !strcmp(e->a.name, ref->name) : e->a.port == ref->port;
}

static entry *find(mg_agent_cache *c, const char *peer, uint64_t epoch, const mg_agent_ref *ref)
{
    for (size_t i = c->n; i-- > 0;) {
        if (matches(&c->v[i], peer, ref))
            return c->v[i].epoch == epoch ? &c->v[i] : NULL;
    }
    return NULL;
}

int mg_agent_cache_put(mg_agent_cache *c, const char *peer, uint64_t epoch,
                       const mg_remote_agent *a)
{
    mg_remote_region *copy;
    mg_agent_ref by_name = {.port = 0}, by_port = {.port = a->port};
    if (a->n > MG_AGENT_REGIONS_MAX || strlen(peer) > MG_PEER_NAME_MAX || epoch == 0)
        return MG_ERR_INVALID;
    for (size_t i = 0; i < a->n; i++) { /* ordered, no overlap, no wrap */
        const mg_remote_region *r = &a->regions[i];
        if (r->size == 0 || r->address > UINT64_MAX - r->size ||
            (i > 0 && a->regions[i - 1].address + a->regions[i - 1].size > r->address))
            return MG_ERR_INVALID;
    }
    copy = malloc(a->n ? a->n * sizeof(*copy) : 1);
    if (copy == NULL)
        return MG_ERR_NOMEM;
    memcpy(copy, a->regions, a->n * sizeof(*copy));
    snprintf(by_name.name, sizeof(by_name.name), "%s", a->name);
    for (size_t i = c->n; i-- > 0;) { /* what it said before of the agent, by either name */
        if (matches(&c->v[i], peer, &by_name) || (a->port && matches(&c->v[i], peer, &by_port)))
            drop(c, i);
    }
    if (c->n == c->max)
        drop(c, 0);
    c->v[c->n] = (entry){.epoch = epoch, .a = *a};
    snprintf(c->v[c->n].peer, sizeof(c->v[c->n].peer), "%s", peer);
    c->v[c->n].a.regions = copy;
    c->n++;
    return 0;
}

int mg_agent_cache_get(mg_agent_cache *c, const char *peer, uint64_t epoch, const mg_agent_ref *ref,
                       mg_remote_agent *out)
{
    entry *e = find(c, peer, epoch, ref);
    if (e == NULL)
        return MG_ERR_NOT_FOUND;
    *out = e->a;
    return 0;
}

int mg_agent_cache_region(mg_agent_cache *c, const char *peer, uint64_t epoch,
                          const mg_agent_ref *ref, uint64_t addr, uint64_t len,
                          mg_remote_region *region, char *why, size_t cap)
{
    entry *e = find(c, peer, epoch, ref);
    size_t lo = 0, hi;
    const mg_remote_region *r;
    char who[MG_AGENT_NAME_MAX + 32];
    if (e == NULL)
        return MG_ERR_NOT_FOUND;
    hi = e->a.n;
    while (lo < hi) { /* regions starting at or before addr: [0, lo) */
        size_t mid = lo + (hi - lo) / 2;
        if (e->a.regions[mid].address <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    mg_agent_ref_str(ref, who, sizeof(who));
    r = lo > 0 ? &e->a.regions[lo - 1] : NULL;
    if (r == NULL || addr - r->address >= r->size) {
        snprintf(why, cap, "%s on %s has no region holding address 0x%llx (%zu regions)", who, peer,
                 (unsigned long long)addr, e->a.n);
        return MG_ERR_INVALID;
    }
    if (len > r->size - (addr - r->address)) {
        snprintf(why, cap,
                 "[0x%llx, +%llu) runs past the end of %s's region [0x%llx, 0x%llx) on %s; a "
                 "request's range lies in one region",
                 (unsigned long long)addr, (unsigned long long)len, who,
                 (unsigned long long)r->address, (unsigned long long)(r->address + r->size), peer);
        return MG_ERR_RANGE;
    }
    *region = *r;
    return 0;
}

int mg_agent_cache_resolve(mg_agent_cache *c, const char *peer, uint64_t epoch,
                           const mg_agent_ref *ref, uint64_t addr, uint64_t len, uint64_t *id,
                           uint64_t *offset, char *why, size_t cap)
{
    mg_remote_region r;
    int rc = mg_agent_cache_region(c, peer, epoch, ref, addr, len, &r, why, cap);
    if (rc == 0) {
        *id = r.id;
        *offset = addr - r.address;
    }
    return rc;
}

void mg_agent_cache_forget(mg_agent_cache *c, const char *peer, const mg_agent_ref *ref)
{
    for (size_t i = c->n; i-- > 0;) {
        if (matches(&c->v[i], peer, ref))
            drop(c, i);
    }
}

size_t mg_agent_cache_count(const mg_agent_cache *c)
{
    return c->n;
}
