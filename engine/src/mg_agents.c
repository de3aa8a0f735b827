/*
 * mg_agents: the client processes that named themselves (moongate/agents.h). A small array in
 * id order: agents are few (one or a handful per client process) and looked up when a client
 * or a peer names one, not per byte moved. Holds are a second small array (at most max_agents),
 * filled at start from what the daemon before this one had, and emptied as their agents come
 * back or their time passes.
 */
#include "moongate/agents.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_agents {
    mg_agents_config cfg;
    mg_agent **v; /* in id order */
    size_t n;
    uint64_t next_id;
    uint32_t cursor; /* where the search for a port to assign starts */
    mg_agent_hold *holds;
    size_t n_holds;
};

int mg_agents_new(mg_agents **out, const mg_agents_config *cfg)
{
    mg_agents *a;
    *out = NULL;
    if (cfg->max_agents == 0 || cfg->port_lo == 0 || cfg->port_lo > cfg->port_hi ||
        cfg->port_hi > 65535)
        return MG_ERR_INVALID;
    a = calloc(1, sizeof(*a));
    if (a == NULL || (a->v = calloc(cfg->max_agents, sizeof(*a->v))) == NULL ||
        (a->holds = calloc(cfg->max_agents, sizeof(*a->holds))) == NULL) {
        if (a)
            free(a->v);
        free(a);
        return MG_ERR_NOMEM;
    }
    a->cfg = *cfg;
    a->next_id = 1;
    a->cursor = cfg->port_lo;
    *out = a;
    return 0;
}

void mg_agents_del(mg_agents *a)
{
    if (a == NULL)
        return;
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    free(a->holds);
    free(a);
}

/* Whether s is 1..max of [A-Za-z0-9._:-]. */
static int word_ok(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == ':') ||
            n >= max)
            return 0;
    }
    return n > 0;
}

int mg_agent_name_ok(const char *s)
{
    return word_ok(s, MG_AGENT_NAME_MAX);
}

int mg_agent_tenant_ok(const char *s)
{
    return word_ok(s, MG_SEG_NAME_MAX);
}

static mg_agent *by_port(const mg_agents *a, uint32_t port)
{
    for (size_t i = 0; i < a->n; i++) {
        if (a->v[i]->port == port)
            return a->v[i];
    }
    return NULL;
}

static int reserved(const mg_agents *a, uint32_t port)
{
    for (size_t i = 0; i < sizeof(a->cfg.reserved) / sizeof(a->cfg.reserved[0]); i++) {
        if (a->cfg.reserved[i] == port)
            return 1;
    }
    return 0;
}

static mg_agent_hold *hold_of_port(const mg_agents *a, uint32_t port)
{
    for (size_t i = 0; i < a->n_holds; i++) {
        if (a->holds[i].agent.port == port)
            return &a->holds[i];
    }
    return NULL;
}

static mg_agent_hold *hold_of(const mg_agents *a, const char *tenant, const char *name)
{
    for (size_t i = 0; i < a->n_holds; i++) {
        if (!strcmp(a->holds[i].agent.name, name) && !strcmp(a->holds[i].agent.tenant, tenant))
            return &a->holds[i];
    }
    return NULL;
}

static void hold_end(mg_agents *a, mg_agent_hold *h)
{
    size_t i = (size_t)(h - a->holds);
    memmove(h, h + 1, (a->n_holds - i - 1) * sizeof(*h));
    a->n_holds--;
}

/* A free port of the range, searched from the cursor on (so a port just freed is not handed
 * out again at once), none held; 0 when none is. */
static uint32_t assign_port(mg_agents *a)
{
    uint32_t span = a->cfg.port_hi - a->cfg.port_lo + 1;
    for (uint32_t k = 0; k < span; k++) {
        uint32_t p = a->cfg.port_lo + (a->cursor - a->cfg.port_lo + k) % span;
        if (!reserved(a, p) && by_port(a, p) == NULL && hold_of_port(a, p) == NULL) {
            a->cursor = p == a->cfg.port_hi ? a->cfg.port_lo : p + 1;
            return p;
        }
    }
    return 0;
}

/* Why a port held for another agent is not the caller's: its agent is named only to its own
 * tenant (another tenant's agents are none to the caller). */
static void held_why(const mg_agent_hold *h, const char *tenant, uint64_t now_ms, char *why,
                     size_t cap)
{
    unsigned long long left = (h->until_ms - now_ms + 999) / 1000;
    char whose[MG_AGENT_NAME_MAX + 16];
    if (!strcmp(h->agent.tenant, tenant))
        snprintf(whose, sizeof(whose), "agent \"%s\"", h->agent.name);
    else
        snprintf(whose, sizeof(whose), "an agent of another tenant");
    snprintf(why, cap,
             "port %u is held for %s, which had it before this daemon restarted, until that "
             "agent registers again or for %llu s more (--agent-port-hold); ask for another "
             "port, or 0",
             h->agent.port, whose, left);
}

int mg_agents_add(mg_agents *a, const char *tenant, const char *name, uint32_t port,
                  const mg_proc *proc, uint64_t now_ms, mg_agent **out, char *why, size_t cap)
{
    mg_agent *ag;
    mg_agent_hold *mine, *held;
    *out = NULL;
    mg_agents_expire(a, now_ms);
    if (!mg_agent_name_ok(name)) {
        snprintf(why, cap, "an agent's name is 1..%d of [A-Za-z0-9._:-]", MG_AGENT_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (port > 65535 || (port && reserved(a, port))) {
        snprintf(why, cap, "port %u is not an agent's: 1..65535, none of the daemon's own", port);
        return MG_ERR_INVALID;
    }
    if (mg_agents_by_name(a, tenant, name)) {
        snprintf(why, cap, "the tenant has an agent named \"%s\" on this daemon", name);
        return MG_ERR_EXISTS;
    }
    if (port && by_port(a, port) != NULL) { /* whoever has it: the port is the host's */
        snprintf(why, cap, "port %u is another agent's on this host; ask for another, or 0", port);
        return MG_ERR_EXISTS;
    }
    mine = hold_of(a, tenant, name);
    if (port && (held = hold_of_port(a, port)) != NULL && held != mine) {
        held_why(held, tenant, now_ms, why, cap);
        return MG_ERR_EXISTS;
    }
    if (a->n == a->cfg.max_agents) {
        snprintf(why, cap, "%zu agents are alive, the most this daemon keeps (--max-agents)", a->n);
        return MG_ERR_FULL;
    }
    if (port == 0 && mine && by_port(a, mine->agent.port) == NULL)
        port = mine->agent.port; /* its own again */
    if (port == 0 && (port = assign_port(a)) == 0) {
        snprintf(why, cap, "every port of %u-%u is an agent's (--agent-ports)", a->cfg.port_lo,
                 a->cfg.port_hi);
        return MG_ERR_FULL;
    }
    if ((ag = calloc(1, sizeof(*ag))) == NULL) {
        snprintf(why, cap, "out of memory");
        return MG_ERR_NOMEM;
    }
    ag->id = a->next_id++;
    snprintf(ag->tenant, sizeof(ag->tenant), "%s", tenant);
    snprintf(ag->name, sizeof(ag->name), "%s", name);
    ag->port = port;
    if (proc)
        ag->proc = *proc;
    a->v[a->n++] = ag;
    if (mine)
        hold_end(a, mine); /* it is back: an agent like any other */
    *out = ag;
    return 0;
}

int mg_agents_hold(mg_agents *a, const mg_agent_entry *e, uint64_t until_ms, char *why, size_t cap)
{
    if (!mg_agent_tenant_ok(e->tenant) || !mg_agent_name_ok(e->name)) {
        snprintf(why, cap, "a tenant and an agent's name are 1..%d of [A-Za-z0-9._:-]",
                 MG_AGENT_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (e->port == 0 || e->port > 65535 || reserved(a, e->port)) {
        snprintf(why, cap, "port %u is not an agent's: 1..65535, none of the daemon's own",
                 e->port);
        return MG_ERR_INVALID;
    }
    if (mg_agents_by_name(a, e->tenant, e->name) || hold_of(a, e->tenant, e->name)) {
        snprintf(why, cap, "agent \"%s\" of tenant \"%s\" is alive or held already", e->name,
                 e->tenant);
        return MG_ERR_EXISTS;
    }
    if (by_port(a, e->port) || hold_of_port(a, e->port)) {
        snprintf(why, cap, "port %u is another agent's or held already", e->port);
        return MG_ERR_EXISTS;
    }
    if (a->n_holds == a->cfg.max_agents) {
        snprintf(why, cap, "%zu ports are held, the most this daemon keeps (--max-agents)",
                 a->n_holds);
        return MG_ERR_FULL;
    }
    a->holds[a->n_holds++] = (mg_agent_hold){*e, until_ms};
    return 0;
}

size_t mg_agents_expire(mg_agents *a, uint64_t now_ms)
{
    size_t kept = 0, n = a->n_holds;
    for (size_t i = 0; i < n; i++) {
        if (a->holds[i].until_ms > now_ms)
            a->holds[kept++] = a->holds[i];
    }
    a->n_holds = kept;
    return n - kept;
}

size_t mg_agents_holds(const mg_agents *a, uint64_t now_ms, mg_agent_hold *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n_holds; i++) {
        if (a->holds[i].until_ms <= now_ms)
            continue;
        if (n < max)
            out[n] = a->holds[i];
        n++;
    }
    return n;
}

size_t mg_agents_entries(const mg_agents *a, uint64_t now_ms, mg_agent_entry *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n; i++, n++) {
        if (n < max) {
            snprintf(out[n].tenant, sizeof(out[n].tenant), "%s", a->v[i]->tenant);
            snprintf(out[n].name, sizeof(out[n].name), "%s", a->v[i]->name);
            out[n].port = a->v[i]->port;
        }
    }
    for (size_t i = 0; i < a->n_holds; i++) {
        if (a->holds[i].until_ms <= now_ms)
            continue;
        if (n < max)
            out[n] = a->holds[i].agent;
        n++;
    }
    return n;
}

void mg_agents_remove(mg_agents *a, mg_agent *ag)
{
    for (size_t i = 0; i < a->n; i++) {
        if (a->v[i] == ag) {
            memmove(&a->v[i], &a->v[i + 1], (a->n - i - 1) * sizeof(*a->v));
            a->n--;
            free(ag);
            return;
        }
    }
}

mg_agent *mg_agents_by_name(const mg_agents *a, const char *tenant, const char *name)
{
    for (size_t i = 0; i < a->n; i++) {
        if (!strcmp(a->v[i]->name, name) && !strcmp(a->v[i]->tenant, tenant))
            return a->v[i];
    }
    return NULL;
}

mg_agent *mg_agents_by_port(const mg_agents *a, const char *tenant, uint32_t port)
{
    mg_agent *ag = port ? by_port(a, port) : NULL;
    return ag && !strcmp(ag->tenant, tenant) ? ag : NULL;
}

size_t mg_agents_count(const mg_agents *a, const char *tenant, const mg_proc *proc)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n; i++) {
        const mg_agent *ag = a->v[i];
        n += (tenant == NULL || !strcmp(ag->tenant, tenant)) &&
             (proc == NULL || (ag->proc.pid == proc->pid && ag->proc.start == proc->start));
    }
    return n;
}

size_t mg_agents_list(const mg_agents *a, const char *tenant, uint64_t after, mg_agent **out,
                      size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n && n < max; i++) {
        if (a->v[i]->id > after && (tenant == NULL || !strcmp(a->v[i]->tenant, tenant)))
            out[n++] = a->v[i];
    }
    return n;
}
