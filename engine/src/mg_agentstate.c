/*
 * mg_agentstate: the agents' state file, written and read (moongate/agentstate.h). Strict: a
 * file that is not exactly what a daemon writes is refused whole, so a reader never holds a
 * port on the word of a damaged file.
 */
#include "moongate/agentstate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADER "moongate-agents "

int mg_agentstate_format(const mg_agent_entry *v, size_t n, char **out, size_t *len)
{
    size_t cap = sizeof(HEADER) + 16, used;
    char *buf;
    *out = NULL;
    *len = 0;
    if (n > (SIZE_MAX - cap) / MG_AGENTSTATE_LINE_MAX)
        return MG_ERR_NOMEM;
    cap += n * MG_AGENTSTATE_LINE_MAX;
    if ((buf = malloc(cap)) == NULL)
        return MG_ERR_NOMEM;
    used = (size_t)snprintf(buf, cap, HEADER "%d\n", MG_AGENTSTATE_VERSION);
    for (size_t i = 0; i < n; i++) {
        int k =
            snprintf(buf + used, cap - used, "agent %s %s %u\n", v[i].tenant, v[i].name, v[i].port);
        if (k < 0 || (size_t)k >= cap - used) { /* cannot be: the entries are bounded */
            free(buf);
            return MG_ERR_NOMEM;
        }
        used += (size_t)k;
    }
    *out = buf;
    *len = used;
    return 0;
}

/* The next word of [p, end) up to a space (or the end), copied into out (cap bytes with its
 * NUL). Returns the byte after it, or NULL when it is empty or too long. */
static const char *word(const char *p, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    while (p + n < end && p[n] != ' ')
        n++;
    if (n == 0 || n >= cap || memchr(p, '\0', n) != NULL)
        return NULL;
    memcpy(out, p, n);
    out[n] = '\0';
    return p + n;
}

/* The port: 1..65535 in decimal, without leading zeros (as written). Returns 0, or -1. */
static int port_of(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    size_t n = strlen(s);
    if (n == 0 || n > 5 || s[0] == '0')
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    if (v == 0 || v > 65535)
        return -1;
    *out = v;
    return 0;
}

/* One entry line (without its '\n'). Returns 0, or -1 with why. */
static int entry(const char *p, const char *end, mg_agent_entry *e, char *why, size_t cap)
{
    char kind[8], port[8];
    if ((p = word(p, end, kind, sizeof(kind))) == NULL || strcmp(kind, "agent") != 0 || p == end) {
        snprintf(why, cap, "not \"agent TENANT NAME PORT\"");
        return -1;
    }
    if ((p = word(p + 1, end, e->tenant, sizeof(e->tenant))) == NULL || p == end ||
        !mg_agent_tenant_ok(e->tenant)) {
        snprintf(why, cap, "the tenant is not 1..%d of [A-Za-z0-9._:-]", MG_SEG_NAME_MAX);
        return -1;
    }
    if ((p = word(p + 1, end, e->name, sizeof(e->name))) == NULL || p == end ||
        !mg_agent_name_ok(e->name)) {
        snprintf(why, cap, "the agent's name is not 1..%d of [A-Za-z0-9._:-]", MG_AGENT_NAME_MAX);
        return -1;
    }
    if ((p = word(p + 1, end, port, sizeof(port))) == NULL || p != end ||
        port_of(port, &e->port) != 0) {
        snprintf(why, cap, "the port is not 1..65535 ending the line");
        return -1;
    }
    return 0;
}

/* The first line: the header of this version. Returns 0, or -1 with why. */
static int header(const char *p, const char *end, char *why, size_t cap)
{
    char want[32];
    size_t n = (size_t)snprintf(want, sizeof(want), HEADER "%d", MG_AGENTSTATE_VERSION);
    size_t h = sizeof(HEADER) - 1, len = (size_t)(end - p), v = len > h ? len - h : 0, digits = 0;
    if (len == n && memcmp(p, want, n) == 0)
        return 0;
    while (digits < v && p[h + digits] >= '0' && p[h + digits] <= '9')
        digits++;
    if (v > 0 && v <= 9 && digits == v && memcmp(p, HEADER, h) == 0)
        snprintf(why, cap, "version %.*s: this daemon reads version %d", (int)v, p + h,
                 MG_AGENTSTATE_VERSION);
    else
        snprintf(why, cap, "not a moongate agents file (the first line is not \"%s\")", want);
    return -1;
}

/* Line `line` of the file, [p, end) without its '\n': the header, or the next entry into
 * out[*n] (room for max). Returns 0, or -1 with why. */
static int one_line(size_t line, const char *p, const char *end, mg_agent_entry *out, size_t max,
                    size_t *n, char *why, size_t cap)
{
    if ((size_t)(end - p) >= MG_AGENTSTATE_LINE_MAX) {
        snprintf(why, cap, "longer than %d bytes", MG_AGENTSTATE_LINE_MAX - 1);
        return -1;
    }
    if (line == 1)
        return header(p, end, why, cap);
    if (*n == max) {
        snprintf(why, cap, "more than %zu agents", max);
        return -1;
    }
    if (entry(p, end, &out[*n], why, cap) != 0)
        return -1;
    (*n)++;
    return 0;
}

int mg_agentstate_parse(const char *text, size_t len, mg_agent_entry *out, size_t max, size_t *n,
                        size_t *line, char *why, size_t cap)
{
    const char *p = text, *end = text + len;
    char what[200];
    *n = 0;
    for (*line = 1; p < end || *line == 1; (*line)++) {
        const char *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        if (nl == NULL) {
            snprintf(why, cap, "line %zu: cut short (no newline ends it)", *line);
            return MG_ERR_INVALID;
        }
        if (one_line(*line, p, nl, out, max, n, what, sizeof(what)) != 0) {
            snprintf(why, cap, "line %zu: %s", *line, what);
            return MG_ERR_INVALID;
        }
        p = nl + 1;
    }
    *line = 0;
    return 0;
}
