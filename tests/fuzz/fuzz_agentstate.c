/*
 * Fuzz target: the agents' state file (moongate/agentstate.h), which a daemon reads at start
 * from its shm directory. Any bytes are either refused whole, naming a line within the text, or
 * read into entries that hold what the checks promise (tenant and name of [A-Za-z0-9._:-],
 * port 1..65535) and that write back byte for byte into the text they came from. Nothing reads
 * past what it was given.
 */
#include "moongate/agentstate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_agent_entry v[MAX];
    char why[300] = "", *text;
    size_t n, line, len, lines = 1;
    /* a copy of its own, so that a read past the end is one past the fuzzer's buffer */
    char *in = malloc(size ? size : 1);
    if (in == NULL)
        abort();
    memcpy(in, data, size);
    for (size_t i = 0; i < size; i++)
        lines += in[i] == '\n';
    if (mg_agentstate_parse(in, size, v, MAX, &n, &line, why, sizeof(why)) != 0) {
        char want[32];
        size_t k = (size_t)snprintf(want, sizeof(want), "line %zu: ", line);
        if (line == 0 || line > lines || strncmp(why, want, k) != 0 || strlen(why) >= sizeof(why))
            abort();
        free(in);
        return 0;
    }
    if (n > MAX || line != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        if (!mg_agent_tenant_ok(v[i].tenant) || !mg_agent_name_ok(v[i].name) || v[i].port == 0 ||
            v[i].port > 65535)
            abort();
    }
    if (mg_agentstate_format(v, n, &text, &len) != 0)
        abort();
    if (len != size || memcmp(text, in, size) != 0)
        abort();
    free(text);
    free(in);
    return 0;
}
