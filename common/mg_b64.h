/*
 * mg_b64: base64 (RFC 4648) encoding with padding, and decoding that accepts the standard and
 * URL-safe alphabets, padded or not (what the proto3 JSON mapping and gRPC `-bin` metadata need).
 */
#ifndef MG_B64_H
#define MG_B64_H

#include <stddef.h>
#include <stdint.h>

/* Bytes needed to encode `len` bytes, including the NUL. */
size_t mg_b64_encoded_size(size_t len);
/* Encodes into dst (mg_b64_encoded_size(len) bytes); returns the length without the NUL. */
size_t mg_b64_encode(char *dst, const uint8_t *src, size_t len);
/* Decodes `len` characters into dst (at least len * 3 / 4 + 3 bytes). Returns the decoded length,
 * or -1 on a character outside both alphabets or misplaced padding. */
long mg_b64_decode(uint8_t *dst, const char *src, size_t len);

#endif
