/*
 * Fuzz target: agent descriptors (gateway/svc/mg_agentdesc.h), the blob one process hands
 * another and ImportAgent takes. Any bytes either decode into a descriptor whose every field
 * holds what the checks promise — and which packs and decodes again to the same — or are
 * refused with a reason. Nothing reads past what it was given.
 */
#include "mg_agentdesc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[300] = "";
    Moongate__V1__AgentDescriptor *d = mg_agentdesc_decode(data, size, why, sizeof(why)), *again;
    uint8_t *buf;
    size_t n;
    if (d == NULL) {
        if (why[0] == '\0' || strlen(why) >= sizeof(why))
            abort();
        return 0;
    }
    if (d->version != 1 || d->port == 0 || d->port > 65535 || d->epoch == 0 || d->n_regions > 1024)
        abort();
    for (size_t i = 0; i < d->n_regions; i++) {
        if (d->regions[i]->length == 0 ||
            (i && d->regions[i - 1]->address + d->regions[i - 1]->length > d->regions[i]->address))
            abort();
    }
    n = moongate__v1__agent_descriptor__get_packed_size(d);
    buf = malloc(n + 1);
    if (buf == NULL)
        abort();
    moongate__v1__agent_descriptor__pack(d, buf);
    again = mg_agentdesc_decode(buf, n, why, sizeof(why));
    if (again == NULL || again->port != d->port || strcmp(again->name, d->name) != 0 ||
        again->n_regions != d->n_regions)
        abort();
    moongate__v1__agent_descriptor__free_unpacked(again, NULL);
    moongate__v1__agent_descriptor__free_unpacked(d, NULL);
    free(buf);
    return 0;
}
