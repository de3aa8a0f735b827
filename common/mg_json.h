/*
 * mg_json: the proto3 JSON mapping, done once and generically from protobuf-c descriptors.
 *
 * Output: lowerCamelCase keys, every field emitted (unset oneof members and unset proto3
 * `optional` fields excepted), 64-bit integers as strings, bytes as padded base64, enums by name,
 * non-finite floats as "NaN"/"Infinity"/"-Infinity".
 * Input: keys in lowerCamelCase or as declared; integers as numbers or strings; enums by name or
 * number; bytes in standard or URL-safe base64; null means the default. Unknown keys, wrong types
 * and out-of-range numbers are errors whose text names the field.
 * Map fields are handled as repeated entry messages. No threads, no global state.
 */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

/* Returns a new JSON object for msg, or NULL when out of memory. */
json_t *mg_json_from_message(const ProtobufCMessage *msg);

/* Returns a new message of type desc built from `json` (an object), to be freed with
 * protobuf_c_message_free_unpacked(msg, NULL); or NULL with a message naming what was wrong
 * written into err. */
ProtobufCMessage *mg_json_to_message(const ProtobufCMessageDescriptor *desc, const json_t *json,
                                     char *err, size_t errcap);

/* Writes the lowerCamelCase JSON name of a proto field name into dst. */
void mg_json_name(char *dst, size_t cap, const char *field_name);

#endif
