/*
 * Fuzz target: protobuf decoding of every request type the daemon takes. Byte 0 picks one of
 * the input messages of every method of every service; the rest is decoded as that message.
 * A message that decodes is encoded again and turned into JSON; JSON the daemon wrote must be
 * read back into the same type (the transcoding of responses and requests must agree). Nothing
 * may crash or leak. And the daemon's string check (mg_pbcheck.h) must be whole: when it passes
 * a message, every string protobuf-c unpacks from it, at any depth, is valid UTF-8; the seeds
 * hold a NUL byte and invalid UTF-8 in every string field of every request type
 * (tests/fuzz/make_string_seeds.py).
 */
#include "mg_json.h"
#include "mg_pbcheck.h"

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/debug.pb-c.h"
#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/peer.pb-c.h"
#include "moongate/v1/pool.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ProtobufCServiceDescriptor *const services[] = {
    &grpc__health__v1__health__descriptor, &grpc__reflection__v1__server_reflection__descriptor,
    &moongate__v1__daemon__descriptor,     &moongate__v1__memory__descriptor,
    &moongate__v1__pool__descriptor,       &moongate__v1__transfer__descriptor,
    &moongate__v1__notify__descriptor,     &moongate__v1__peer__descriptor,
    &moongate__v1__debug__descriptor,
};

static const ProtobufCMessageDescriptor *pick(uint8_t k)
{
    unsigned n = 0;
    for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++)
        n += services[s]->n_methods;
    k %= n;
    for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
        if (k < services[s]->n_methods)
            return services[s]->methods[k].input;
        k -= services[s]->n_methods;
    }
    return NULL;
}

/* Every string of an unpacked message, at any depth, is valid UTF-8 (else abort). */
static void strings_whole(const ProtobufCMessage *m, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    if (depth > 64)
        return;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        size_t n = 1;
        const void *const *items;
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)(base + f->quantifier_offset);
            items = *(const void *const *const *)(base + f->offset);
        } else {
            items = (const void *const *)(base + f->offset);
        }
        for (size_t k = 0; k < n; k++) {
            const void *v = items[k];
            if (v == NULL)
                continue;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                strings_whole(v, depth + 1);
            } else if (!mg_utf8_valid(v, strlen(v))) {
                fprintf(stderr, "%s.%s passed the string check but is not UTF-8\n", d->name,
                        f->name);
                abort();
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m, *back;
    uint8_t *buf;
    size_t len;
    json_t *j;
    char err[256];
    if (size < 1)
        return 0;
    d = pick(data[0]);
    m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (m == NULL)
        return 0;
    if (mg_pb_check_strings(d, data + 1, size - 1, err, sizeof(err)) == 0)
        strings_whole(m, 0);
    /* The handlers' view of it: encoded again (a response may echo parts of it). Unknown
     * fields are protobuf-c's to keep; re-decoding them is its business, not checked here. */
    len = protobuf_c_message_get_packed_size(m);
    buf = malloc(len ? len : 1);
    if (buf == NULL || protobuf_c_message_pack(m, buf) != len)
        abort();
    free(buf);
    j = mg_json_from_message(m); /* NULL: not representable (e.g. invalid UTF-8): skipped */
    if (j) {
        back = mg_json_to_message(d, j, err, sizeof(err));
        if (back == NULL) { /* JSON written by the daemon must read back */
            char *text = json_dumps(j, JSON_COMPACT);
            fprintf(stderr, "%s: %s does not read back: %s\n", d->name, text ? text : "?", err);
            abort();
        }
        protobuf_c_message_free_unpacked(back, NULL);
        json_decref(j);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
