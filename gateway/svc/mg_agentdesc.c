/* mg_agentdesc: agent descriptors decoded and checked (see mg_agentdesc.h). */
#include "mg_agentdesc.h"

#include "mg_addr.h"
#include "mg_pbcheck.h"
#include "moongate/agentcache.h"
#include "moongate/mg_error.h"

#include <stdio.h>
#include <string.h>

/* What is wrong with the decoded descriptor's fields, or NULL. */
static const char *problem(const Moongate__V1__AgentDescriptor *d)
{
    char host[256];
    int port;
    if (d->version != MG_AGENTDESC_VERSION)
        return "version must be 1";
    if (d->base.n_unknown_fields)
        return "it has fields version 1 does not";
    if (strlen(d->endpoint) > MG_PEER_NAME_MAX ||
        mg_split_host_port(d->endpoint, host, sizeof(host), &port) != 0 || port == 0)
        return "endpoint must be host:port";
    if (!mg_agent_name_ok(d->tenant) || strlen(d->tenant) > MG_SEG_NAME_MAX)
        return "tenant is not a tenant's name";
    if (!mg_agent_name_ok(d->name))
        return "name is not an agent's name";
    if (d->port == 0 || d->port > 65535)
        return "port must be 1..65535";
    if (d->epoch == 0 || d->agent_id == 0)
        return "epoch and agent_id must be set";
    if (d->n_regions > MG_AGENT_REGIONS_MAX)
        return "it has more than 1024 regions";
    for (size_t i = 0; i < d->n_regions; i++) {
        const Moongate__V1__AgentRegion *r = d->regions[i];
        if (r->base.n_unknown_fields)
            return "a region has fields version 1 does not";
        if (r->length == 0 || r->address > UINT64_MAX - r->length)
            return "a region is empty or wraps";
        if (i > 0 && d->regions[i - 1]->address + d->regions[i - 1]->length > r->address)
            return "regions are out of order or overlap";
    }
    return NULL;
}

Moongate__V1__AgentDescriptor *mg_agentdesc_decode(const uint8_t *buf, size_t len, char *why,
                                                   size_t cap)
{
    Moongate__V1__AgentDescriptor *d;
    const char *bad;
    char err[200];
    if (len == 0 || len > MG_AGENTDESC_MAX) {
        snprintf(why, cap, "a descriptor has 1..%d bytes, not %zu", MG_AGENTDESC_MAX, len);
        return NULL;
    }
    if (mg_pb_check_strings(&moongate__v1__agent_descriptor__descriptor, buf, len, err,
                            sizeof(err)) != 0) {
        snprintf(why, cap, "not an agent descriptor: %s", err);
        return NULL;
    }
    d = moongate__v1__agent_descriptor__unpack(NULL, len, buf);
    if (d == NULL) {
        snprintf(why, cap, "not an agent descriptor (moongate.v1.AgentDescriptor)");
        return NULL;
    }
    if ((bad = problem(d)) != NULL) {
        snprintf(why, cap, "not an agent descriptor: %s", bad);
        moongate__v1__agent_descriptor__free_unpacked(d, NULL);
        return NULL;
    }
    return d;
}

/* Appends text to why (cap bytes, *len used), cut where it does not fit. */
static void append(char *why, size_t cap, size_t *len, const char *text)
{
    size_t n = strlen(text);
    if (*len + 1 >= cap)
        return;
    if (n > cap - 1 - *len)
        n = cap - 1 - *len;
    memcpy(why + *len, text, n);
    *len += n;
    why[*len] = '\0';
}

/* Appends to why (after ", " when it has something) that the descriptor's field differs. */
static void differs(char *why, size_t cap, size_t *len, const char *field, uint64_t mine,
                    uint64_t theirs)
{
    char part[160];
    snprintf(part, sizeof(part), "%sthe descriptor's %s %llu differs from the agent's %llu",
             *len ? ", " : "", field, (unsigned long long)mine, (unsigned long long)theirs);
    append(why, cap, len, part);
}

int mg_agentdesc_compare(const Moongate__V1__AgentDescriptor *d, const char *name, uint32_t port,
                         uint64_t epoch, uint64_t agent_id, char *why, size_t cap)
{
    size_t len = 0;
    int w;
    why[0] = '\0';
    if (epoch != d->epoch) {
        snprintf(why, cap,
                 "the descriptor's epoch %llu differs from its daemon's %llu: the daemon restarted "
                 "since it was exported",
                 (unsigned long long)d->epoch, (unsigned long long)epoch);
        return MG_ERR_STATE;
    }
    if (strcmp(name, d->name) != 0) {
        w = snprintf(why, cap, "the descriptor's name differs from the agent's \"%.140s\"", name);
        len = w > 0 && (size_t)w < cap ? (size_t)w : cap - 1;
    }
    if (port != d->port)
        differs(why, cap, &len, "port", d->port, port);
    if (agent_id != d->agent_id)
        differs(why, cap, &len, "agent_id", d->agent_id, agent_id);
    if (len == 0)
        return 0;
    append(why, cap, &len, " (registered again since it was exported, or forged)");
    return MG_ERR_STATE;
}
