/*
 * mg_grpc: the gRPC-over-HTTP/2 codec shared by the server and the client library.
 *
 * Status codes and their HTTP mapping, `grpc-message` percent-encoding, `grpc-timeout` values and
 * the length-prefixed message stream (5-byte prefix: compressed flag, 32-bit big-endian length).
 * Pure functions and caller-owned state; no I/O, no threads.
 */
#ifndef MG_GRPC_H
#define MG_GRPC_H

#include <stddef.h>
#include <stdint.h>

enum {
    MG_GRPC_OK = 0,
    MG_GRPC_CANCELLED = 1,
    MG_GRPC_UNKNOWN = 2,
    MG_GRPC_INVALID_ARGUMENT = 3,
    MG_GRPC_DEADLINE_EXCEEDED = 4,
    MG_GRPC_NOT_FOUND = 5,
    MG_GRPC_ALREADY_EXISTS = 6,
    MG_GRPC_PERMISSION_DENIED = 7,
    MG_GRPC_RESOURCE_EXHAUSTED = 8,
    MG_GRPC_FAILED_PRECONDITION = 9,
    MG_GRPC_ABORTED = 10,
    MG_GRPC_OUT_OF_RANGE = 11,
    MG_GRPC_UNIMPLEMENTED = 12,
    MG_GRPC_INTERNAL = 13,
    MG_GRPC_UNAVAILABLE = 14,
    MG_GRPC_DATA_LOSS = 15,
    MG_GRPC_UNAUTHENTICATED = 16,
    MG_GRPC_CODE_COUNT = 17
};

#define MG_GRPC_PREFIX_LEN 5

/* The gRPC status of an engine error code (moongate/mg_error.h: 0 for MG_OK, a negative
 * MG_ERR_*); UNKNOWN for a code it does not know. */
int mg_err_grpc(int err);
/* "OK", "CANCELLED", ...; "UNKNOWN" for a code out of range. */
const char *mg_grpc_code_name(int code);
/* Parses a name ("NOT_FOUND") or a number ("5"); returns the code or -1. */
int mg_grpc_code_parse(const char *s);
/* The HTTP status a JSON client sees for a gRPC code (google/rpc/code.proto mapping). */
int mg_grpc_code_http(int code);

/* Percent-encodes `src` for `grpc-message`: bytes outside 0x20-0x7E and '%' become %XX.
 * Writes at most cap-1 bytes plus a NUL into dst (never splitting an escape); returns the
 * length the whole encoding needs (excluding the NUL), like snprintf. */
size_t mg_pct_encode(char *dst, size_t cap, const char *src, size_t len);
/* Decodes %XX escapes in place-compatible fashion into dst (len+1 bytes suffice). Malformed
 * escapes are copied through unchanged, as receivers must not fail on bad encodings.
 * Returns the decoded length; dst is NUL-terminated. */
size_t mg_pct_decode(char *dst, const char *src, size_t len);

/* Parses a `grpc-timeout` value (1-8 digits then H, M, S, m, u or n) into nanoseconds.
 * Returns 0, or -1 when malformed. */
int mg_grpc_timeout_parse(const char *s, size_t len, uint64_t *ns);
/* Formats a timeout in nanoseconds as the shortest exact-or-rounded-up `grpc-timeout`
 * value of at most 8 digits. buf holds at least 16 bytes. Returns the length. */
size_t mg_grpc_timeout_format(char *buf, uint64_t ns);

/* Writes the 5-byte prefix for an uncompressed message of `len` bytes. */
void mg_grpc_prefix(uint8_t out[MG_GRPC_PREFIX_LEN], uint32_t len);

/* ---- incremental deframer: messages may span DATA frames; a frame may hold several ---- */

enum {
    MG_DEFRAME_OK = 0,
    MG_DEFRAME_TOO_LARGE = -1,  /* declared length over the limit */
    MG_DEFRAME_COMPRESSED = -2, /* compressed flag set; no compression is negotiated */
    MG_DEFRAME_BAD_FLAG = -3,   /* flag byte other than 0 or 1 */
    MG_DEFRAME_NOMEM = -4,
};

typedef struct mg_deframer {
    uint8_t prefix[MG_GRPC_PREFIX_LEN];
    size_t prefix_got;
    uint8_t *msg; /* body being assembled (NULL between messages) */
    uint32_t msg_len;
    uint32_t msg_got;
    uint32_t max_message; /* largest accepted body */
    uint32_t declared;    /* length of the last prefix seen, for error messages */
    uint64_t messages;    /* complete messages delivered */
} mg_deframer;

/* Called with each complete message body; the buffer is only valid during the call.
 * A non-zero return stops feeding and is returned by mg_deframer_feed. */
typedef int (*mg_deframer_cb)(void *arg, const uint8_t *msg, size_t len);

void mg_deframer_init(mg_deframer *d, uint32_t max_message);
void mg_deframer_free(mg_deframer *d);
/* Feeds bytes. Returns MG_DEFRAME_OK, a negative MG_DEFRAME_* error or the callback's value. */
int mg_deframer_feed(mg_deframer *d, const uint8_t *data, size_t len, mg_deframer_cb cb, void *arg);
/* Inside the callback: when `msg` is a buffer the deframer assembled, hands it over (the caller
 * frees it) and returns it; NULL when the message lies in the fed bytes. */
uint8_t *mg_deframer_take(mg_deframer *d, const uint8_t *msg);
/* Non-zero when bytes of an unfinished message are buffered (a truncated stream at its end). */
int mg_deframer_partial(const mg_deframer *d);

#endif
