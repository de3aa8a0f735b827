/*
 * mg_pbcheck: the strings of a request, checked before anything decodes them.
 *
 * protobuf-c unpacks a `string` field into a NUL-terminated C string and does not look at its
 * bytes: "a\0b" arrives as "a", and bytes that are not UTF-8 arrive as they are. Every string
 * that enters the daemon therefore passes here first, on the encoded message, in one walk
 * driven by the message's descriptor (nested messages and repeated fields included): a NUL
 * byte or invalid UTF-8 (overlong forms, surrogates, code points above U+10FFFF, truncated
 * sequences) is refused naming the field. Pure functions; no allocation.
 */
#ifndef MG_PBCHECK_H
#define MG_PBCHECK_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* Non-zero when the len bytes at s are valid UTF-8 (RFC 3629). */
int mg_utf8_valid(const uint8_t *s, size_t len);

/* What is wrong with one string's bytes: NULL when they are fine, else "holds a NUL byte" or
 * "is not valid UTF-8". */
const char *mg_string_problem(const uint8_t *s, size_t len);

/* Walks the encoded message `buf` of type `d`. Returns 0 when every string field in it (at any
 * depth) is free of NUL bytes and valid UTF-8, else -1 with err set to
 * `field "items[2].name": holds a NUL byte`. A message that is not well-formed protobuf is left
 * to the decoder to refuse (0). Unknown fields are skipped. */
int mg_pb_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                        char *err, size_t errcap);

#endif
