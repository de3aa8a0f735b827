/*
 * Fuzz target: JSON transcoding. The first byte picks a request type; the rest is parsed as JSON
 * and mapped to that message. A message that maps must encode back to JSON, and that JSON must
 * map again to a message that packs to the same bytes.
 */
#include "mg_json.h"

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/debug.pb-c.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const ProtobufCMessageDescriptor *const types[] = {
    &grpc__health__v1__health_check_request__descriptor,
    &grpc__health__v1__health_check_response__descriptor,
    &grpc__reflection__v1__server_reflection_request__descriptor,
    &grpc__reflection__v1__server_reflection_response__descriptor,
    &moongate__v1__info_request__descriptor,
    &moongate__v1__info_response__descriptor,
    &moongate__v1__sleep_request__descriptor,
    &moongate__v1__echo_message__descriptor,
    &moongate__v1__expand_request__descriptor,
};

static uint8_t *packed(const ProtobufCMessage *m, size_t *len)
{
    uint8_t *buf;
    *len = protobuf_c_message_get_packed_size(m);
    buf = malloc(*len ? *len : 1);
    if (buf)
        protobuf_c_message_pack(m, buf);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d;
    json_error_t je;
    json_t *j, *back;
    ProtobufCMessage *m, *m2;
    char err[512];
    size_t l1, l2;
    uint8_t *p1, *p2;

    if (size < 1)
        return 0;
    d = types[data[0] % (sizeof(types) / sizeof(types[0]))];
    j = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (j == NULL)
        return 0;
    m = mg_json_to_message(d, j, err, sizeof(err));
    json_decref(j);
    if (m == NULL) {
        if (err[0] == '\0')
            abort(); /* every refusal explains itself */
        return 0;
    }
    back = mg_json_from_message(m);
    if (back == NULL)
        abort();
    m2 = mg_json_to_message(d, back, err, sizeof(err));
    json_decref(back);
    if (m2 == NULL)
        abort(); /* our own output must map back */
    p1 = packed(m, &l1);
    p2 = packed(m2, &l2);
    /* NaN payloads and float rounding aside, the round trip must be exact for these types,
     * which hold no floating-point fields. */
    if (p1 && p2 && (l1 != l2 || memcmp(p1, p2, l1) != 0))
        abort();
    free(p1);
    free(p2);
    protobuf_c_message_free_unpacked(m, NULL);
    protobuf_c_message_free_unpacked(m2, NULL);
    return 0;
}
