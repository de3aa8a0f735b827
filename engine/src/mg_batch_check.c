/* mg_batch_check: a batch's requests checked before anything moves — their memory on this
 * daemon resolved and held, their targets on peers against what the peers described
 * (moongate/batches.h). */
#include "mg_batches_int.h"

#include "mg_addr.h"
#include "moongate/peerdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request with peer "": its "remote" side is this daemon's own segment or lease, any of the
 * caller's (remote accessibility is for peers). Returns NULL, or what is wrong. */
static const char *resolve_other(mg_batch_req *r, const mg_batch_item *t, const char *holder)
{
    const mg_batches_config *cfg = &r->b->set->cfg;
    int rc = mg_pools_resolve(cfg->pools, cfg->reg, r->b->tenant, t->remote_segment,
                              t->remote_lease, t->remote_offset, t->length, holder, &r->other,
                              &r->other_lease, &r->other_addr);
    r->local_copy = 1;
    if (rc == MG_ERR_NOT_FOUND)
        return t->remote_lease ? "no such lease on this daemon (peer \"\")"
                               : "no such segment on this daemon (peer \"\")";
    if (rc == 0 && mg_segment_procmem(r->other))
        return "the target is a process's memory (reached with process_vm): a copy on this "
               "daemon (peer \"\") cannot land in it; peers reach it when it is registered "
               "remote-accessible";
    if (rc == 0 && (mg_segment_gpu(r->other) || (r->local && mg_segment_gpu(r->local))))
        return "GPU memory moves over RDMA only: a copy on this daemon (peer \"\") cannot "
               "reach it";
    return rc ? "remote offset + length is outside the target on this daemon" : NULL;
}

/* The local side of r, resolved and held. Returns NULL, or what is wrong. */
static const char *resolve_local(mg_batch_req *r, const mg_batch_item *t, uint64_t same,
                                 const char *holder)
{
    const mg_batches_config *cfg = &r->b->set->cfg;
    const mg_batch_req *prev = r > r->b->reqs ? r - 1 : NULL;
    int rc;
    if (!t->local_lease && prev && prev->local && !prev->local_lease && t->local_segment == same) {
        r->local = prev->local; /* the same segment as the request before: owed till the run ends */
        if (r->b->owed_seg != r->local)
            mg_batch_pay_holds(r->b);
        r->b->owed_seg = r->local;
        r->b->owed++;
        if (mg_bounds_check(mg_segment_size(r->local), t->local_offset, t->length) != 0)
            return "local offset + length is outside the local segment";
        r->local_addr = (uint8_t *)mg_segment_addr(r->local) + t->local_offset;
        return NULL;
    }
    rc = mg_pools_resolve(cfg->pools, cfg->reg, r->b->tenant, t->local_segment, t->local_lease,
                          t->local_offset, t->length, holder, &r->local, &r->local_lease,
                          &r->local_addr);
    if (rc == MG_ERR_NOT_FOUND)
        return t->local_lease ? "no such local lease" : "no such local segment";
    if (rc)
        return t->local_lease ? "local offset + length is outside the local lease"
                              : "local offset + length is outside the local segment";
    return NULL;
}

/* A request naming its local bytes by address, as one naming a segment and offset (in *u).
 * Returns NULL, or what is wrong (in r->msg when it names the regions). */
static const char *resolve_address(mg_batch_req *r, const mg_batch_item *t, uint64_t same,
                                   mg_batch_item *u)
{
    const mg_batches_config *cfg = &r->b->set->cfg;
    const mg_batch_req *prev = r > r->b->reqs ? r - 1 : NULL;
    char err[MG_SEG_ERROR_MAX];
    uint64_t base, addr;
    if (t->local_segment || t->local_lease)
        return "name the local memory one way: local_address (plus local_offset), or "
               "local_segment or local_lease";
    if (t->local_offset > UINT64_MAX - t->local_address)
        return "local_address + local_offset overflows";
    if (t->proc == NULL || t->proc->pid <= 0)
        return "local_address is a local process's: submit on the Unix socket, from the process "
               "that registered the region";
    *u = *t;
    addr = t->local_address + t->local_offset;
    u->local_address = 0;
    /* Blocks in the region of the request before need no search. */
    if (prev && prev->local && !prev->local_lease && same &&
        (base = mg_segment_client_addr(prev->local, t->proc)) != 0 && addr >= base &&
        t->length <= mg_segment_size(prev->local) &&
        addr - base <= mg_segment_size(prev->local) - t->length) {
        u->local_segment = same;
        u->local_offset = addr - base;
        return NULL;
    }
    if (mg_registry_resolve(cfg->reg, r->b->tenant, t->proc, addr, t->length, &u->local_segment,
                            &u->local_offset, err) == 0)
        return NULL;
    free(r->msg);
    r->msg = strdup(err);
    return r->msg ? r->msg : "local_address: no such region";
}

/* Keeps text as r's message and returns it. */
static const char *say(mg_batch_req *r, const char *text)
{
    free(r->msg);
    r->msg = strdup(text);
    return r->msg ? r->msg : "out of memory";
}

static int ref_eq(const mg_agent_ref *a, const mg_agent_ref *b)
{
    return a->port == b->port && !strcmp(a->name, b->name) && !strcmp(a->peer, b->peer);
}

/* The remote agent of request r on this daemon: its region holding the range, now (in *v). */
static const char *resolve_agent_here(mg_batch_req *r, const mg_batch_item *t,
                                      const mg_agent_ref *ref, mg_batch_item *v)
{
    const mg_batches_config *cfg = &r->b->set->cfg;
    const mg_agent *ag = NULL;
    char err[MG_SEG_ERROR_MAX], who[MG_AGENT_NAME_MAX + 32];
    if (cfg->agents)
        ag = ref->name[0] ? mg_agents_by_name(cfg->agents, r->b->tenant, ref->name)
                          : mg_agents_by_port(cfg->agents, r->b->tenant, ref->port);
    if (ag == NULL || ag->proc.pid <= 0) {
        r->err = MG_ERR_NOT_FOUND;
        snprintf(err, sizeof(err), "no %s with regions on this daemon",
                 mg_agent_ref_str(ref, who, sizeof(who)));
        return say(r, err);
    }
    if ((r->err = mg_registry_resolve(cfg->reg, r->b->tenant, &ag->proc, v->remote_address,
                                      t->length, &v->remote_segment, &v->remote_offset, err)) != 0)
        return say(r, err);
    return NULL;
}

/* A request naming its remote bytes by (agent, address), as one naming a segment (*v): an
 * agent here is resolved now; one on a peer is entered in b->agents, to be resolved with what
 * the peer says (mg_batch_resolve_agents). Returns NULL, or what is wrong (r->err set when it
 * is not INVALID_ARGUMENT). */
static const char *resolve_agent(mg_batch_req *r, const mg_batch_item *t, mg_batch_item *v)
{
    mg_batch *b = r->b;
    const mg_batch_req *prev = r > b->reqs ? r - 1 : NULL;
    mg_agent_ref ref, **grown;
    char why[300];
    if (t->remote_segment || t->remote_lease)
        return "name the remote memory one way: remote_agent and remote_address, or "
               "remote_segment or remote_lease";
    if (t->remote_offset > UINT64_MAX - t->remote_address)
        return "remote_address + remote_offset overflows";
    *v = *t;
    v->remote_agent = NULL;
    v->remote_address = t->remote_address + t->remote_offset;
    v->remote_offset = 0;
    r->agent_arg = t->remote_agent;
    r->peer_arg = t->peer;
    if (prev && prev->agent && prev->agent_arg == t->remote_agent && prev->peer_arg == t->peer) {
        r->agent = prev->agent; /* the same strings (blocks of one group): nothing to parse */
        r->remote_address = v->remote_address;
        v->peer = b->agents[r->agent - 1]->peer;
        return NULL;
    }
    if (mg_agent_ref_parse(t->peer, t->remote_agent, b->set->cfg.peer_port, &ref, why,
                           sizeof(why)) != 0)
        return say(r, why);
    if (ref.peer[0] == '\0')
        return resolve_agent_here(r, t, &ref, v);
    if (prev && prev->agent && ref_eq(b->agents[prev->agent - 1], &ref)) {
        r->agent = prev->agent;
    } else {
        if ((grown = realloc(b->agents, (b->nagents + 1) * sizeof(*grown))) == NULL)
            return "out of memory";
        b->agents = grown;
        if ((b->agents[b->nagents] = malloc(sizeof(ref))) == NULL)
            return "out of memory";
        *b->agents[b->nagents++] = ref;
        r->agent = (uint32_t)b->nagents;
    }
    r->remote_address = v->remote_address;
    v->peer = b->agents[r->agent - 1]->peer;
    return NULL;
}

void mg_batch_pay_holds(mg_batch *b)
{
    if (b->owed)
        mg_registry_hold(b->set->cfg.reg, b->owed_seg, b->owed);
    b->owed = 0;
    b->owed_seg = NULL;
}

/* mg_batch_fill, the references owed taken after the last request. */
static const char *fill(mg_batch *b, size_t i, const mg_batch_item *t, uint64_t *last,
                        const char *holder);

const char *mg_batch_fill(mg_batch *b, size_t i, const mg_batch_item *t, uint64_t *last,
                          const char *holder)
{
    const char *bad = fill(b, i, t, last, holder);
    if (i + 1 == b->n)
        mg_batch_pay_holds(b);
    return bad;
}

static const char *fill(mg_batch *b, size_t i, const mg_batch_item *t, uint64_t *last,
                        const char *holder)
{
    mg_batch_req *r = &b->reqs[i], *prev = i > 0 ? &b->reqs[i - 1] : NULL;
    uint64_t same = *last;
    mg_batch_item u, v;
    const char *bad;
    *last = 0;
    if (t->local_address && t->length && (bad = resolve_address(r, t, same, &u)) != NULL)
        return bad;
    if (t->local_address && t->length)
        t = &u;
    if (t->remote_agent && t->remote_agent[0] && t->length) {
        if ((bad = resolve_agent(r, t, &v)) != NULL)
            return bad;
        t = &v;
    }
    r->write = t->write;
    r->remote_segment = t->remote_lease ? t->remote_lease : t->remote_segment;
    r->remote_lease = t->remote_lease != 0;
    r->peer_name = t->peer;
    r->remote_offset = t->remote_offset;
    r->length = t->length;
    if (t->length == 0)
        return "length must be greater than 0";
    if (t->peer[0] &&
        (prev == NULL || (t->peer != prev->peer_name && strcmp(t->peer, prev->peer_name))) &&
        !mg_is_host_port(t->peer)) /* names are looked up later, on a worker */
        return "peer must be host:port (\"10.0.0.2:7443\", \"[::1]:7443\", "
               "\"node-b.moongate.svc:7443\"), or \"\" for this daemon";
    if (t->remote_offset > UINT64_MAX - t->length)
        return "remote offset + length overflows";
    if ((t->local_segment != 0) == (t->local_lease != 0))
        return "name the local memory: local_segment or local_lease, one of them";
    if (!r->agent && (t->remote_segment != 0) == (t->remote_lease != 0))
        return "name the remote target: remote_segment or remote_lease, one of them";
    if ((bad = resolve_local(r, t, same, holder)) != NULL)
        return bad;
    *last = t->local_lease ? 0 : t->local_segment;
    return t->peer[0] == '\0' ? resolve_other(r, t, holder) : NULL; /* "": a copy here */
}

/* ---- remote targets ---- */

static mg_batch_target *target_find(mg_batch_target *ts, size_t n, const mg_batch_req *r)
{
    for (size_t i = 0; i < n; i++) {
        if (ts[i].peer == r->peer && ts[i].id == r->remote_segment &&
            ts[i].is_lease == r->remote_lease)
            return &ts[i];
    }
    return NULL;
}

/* Checks request r against what is known of its target (t: what its peer answered, or NULL on
 * the first pass). Returns NULL when it may run (also when nothing could be learnt: the data
 * plane checks every slice anyway), "" when its peer is to be asked, else why not. */
static const char *verdict(mg_peer_cache *descs, const mg_batch_req *r, const mg_batch_target *t,
                           char *why, size_t cap, uint64_t *size)
{
    int rc;
    if (t && t->state == MG_TARGET_UNANSWERED)
        return NULL;
    if (t && t->state == MG_TARGET_MISSING) {
        snprintf(why, cap, "peer %s has no %s %llu", r->peer->addr,
                 r->remote_lease ? "remote-accessible lease" : "segment",
                 (unsigned long long)r->remote_segment);
        return why;
    }
    rc = mg_peer_cache_check(descs, r->peer->key, r->peer->addr, r->remote_segment, r->remote_lease,
                             r->remote_offset, r->length, size, why, cap);
    if (rc == MG_ERR_NOT_FOUND)
        return t ? NULL : ""; /* first pass: ask the peer */
    return rc ? why : NULL;
}

/* Adds r's target to *ask unless it is there. Returns 0 or MG_ERR_NOMEM. */
static int ask_for(mg_batch_target **ask, size_t *nask, const mg_batch_req *r)
{
    mg_batch_target *grown;
    if (target_find(*ask, *nask, r))
        return 0;
    grown = realloc(*ask, (*nask + 1) * sizeof(**ask));
    if (grown == NULL)
        return MG_ERR_NOMEM;
    *ask = grown;
    (*ask)[(*nask)++] =
        (mg_batch_target){r->peer, r->remote_segment, r->remote_lease, MG_TARGET_UNANSWERED};
    return 0;
}

int mg_batch_check_remote(const mg_batch *b, mg_peer_cache *descs, mg_batch_target *answers,
                          size_t nanswers, mg_batch_target **ask, size_t *nask, size_t *bad,
                          char *why, size_t cap)
{
    const mg_batch_req *last = NULL;
    uint64_t last_size = 0; /* the size of last's target when it checked out, else 0 */
    for (size_t i = 0; i < b->n; i++) {
        const mg_batch_req *r = &b->reqs[i];
        const char *no;
        int same;
        if (r->local_copy || r->peer == NULL)
            continue;
        same = last && last->peer == r->peer && last->remote_segment == r->remote_segment &&
               last->remote_lease == r->remote_lease;
        if (same && last_size && mg_bounds_check(last_size, r->remote_offset, r->length) == 0)
            continue; /* the same target as the request before, and inside it */
        if (same && !last_size && answers == NULL)
            continue; /* that target is being asked for already */
        last = r;
        last_size = 0;
        no = verdict(descs, r, answers ? target_find(answers, nanswers, r) : NULL, why, cap,
                     &last_size);
        if (no == NULL)
            continue;
        last_size = 0;
        if (answers == NULL) { /* first pass: ask the peer, once per target */
            if (ask_for(ask, nask, r) != 0)
                return MG_ERR_NOMEM;
            continue;
        }
        *bad = i;
        return MG_ERR_INVALID;
    }
    return 0;
}

void mg_batch_target_answered(mg_peer_cache *descs, mg_batch_target *t, const mg_remote_desc *d,
                              uint64_t epoch, int missing, uint64_t now_ms)
{
    if (d) {
        /* A new epoch forgets what the peer's previous life said. */
        if (mg_peer_cache_epoch(descs, t->peer->key, epoch, now_ms) >= 0 &&
            mg_peer_cache_put(descs, t->peer->key, epoch, d) == 0)
            t->state = MG_TARGET_KNOWN;
    } else if (missing) {
        t->state = MG_TARGET_MISSING;
        mg_peer_cache_forget(descs, t->peer->key, t->id, t->is_lease);
    } /* else unreachable or refused: left to the data plane, which fails it by name */
}

/* ---- remote agents ---- */

int mg_batch_resolve_agents(mg_batch *b, mg_agent_cache *cache, mg_peer_cache *descs, int answered,
                            mg_batch_agent_ask **ask, size_t *nask, size_t *bad, char *why,
                            size_t cap)
{
    const mg_agent_ref *asked = NULL;  /* the agent asked for last */
    mg_remote_region last = {0, 0, 0}; /* the region the request before resolved into */
    uint32_t last_agent = 0;
    for (size_t i = 0; i < b->n; i++) {
        mg_batch_req *r = &b->reqs[i];
        const mg_agent_ref *ref;
        mg_batch_agent_ask *grown;
        int rc;
        if (!r->agent || r->peer == NULL)
            continue;
        ref = b->agents[r->agent - 1];
        if (r->agent == last_agent && r->remote_address >= last.address && /* the same region */
            r->length <= last.size && r->remote_address - last.address <= last.size - r->length) {
            r->remote_segment = last.id;
            r->remote_offset = r->remote_address - last.address;
            continue;
        }
        last_agent = 0;
        rc = mg_agent_cache_region(cache, r->peer->key, mg_peer_cache_epoch_of(descs, r->peer->key),
                                   ref, r->remote_address, r->length, &last, why, cap);
        if (rc == 0) {
            last_agent = r->agent;
            r->remote_segment = last.id;
            r->remote_offset = r->remote_address - last.address;
            continue;
        }
        if (!answered && ref == asked)
            continue;
        if (answered) {
            char who[MG_AGENT_NAME_MAX + 32];
            if (rc == MG_ERR_NOT_FOUND)
                snprintf(why, cap, "peer %s has no %s", r->peer->addr,
                         mg_agent_ref_str(ref, who, sizeof(who)));
            *bad = i;
            return rc == MG_ERR_RANGE ? MG_ERR_RANGE : MG_ERR_NOT_FOUND;
        }
        for (size_t k = 0; k < *nask && asked != ref; k++) {
            if ((*ask)[k].peer == r->peer && ref_eq((*ask)[k].ref, ref))
                asked = ref; /* the same agent, named again further on */
        }
        if (asked == ref)
            continue;
        if ((grown = realloc(*ask, (*nask + 1) * sizeof(**ask))) == NULL)
            return MG_ERR_NOMEM;
        *ask = grown;
        (*ask)[(*nask)++] = (mg_batch_agent_ask){r->peer, ref};
        asked = ref;
    }
    return 0;
}
