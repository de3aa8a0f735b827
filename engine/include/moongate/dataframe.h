/*
 * moongate data-plane frames: what two daemons' TCP transports send each other.
 *
 * Every frame is a fixed 48-byte header, little-endian, optionally followed by a payload:
 *
 *   off size field
 *     0    4 magic       "MGDP"
 *     4    1 version     MG_DF_VERSION; a peer of another version is refused with a clear error
 *     5    1 type        HELLO, HELLO_OK, WRITE, WRITE_ACK, READ, READ_DATA, ERROR
 *     6    2 flags       MG_DF_CRC (payload_crc is set), MG_DF_LEASE (target is a lease id)
 *     8    8 slice       the sender's slice id, echoed in the answer
 *    16    8 target      segment id (or lease id) in the receiver's registry: never an address
 *    24    8 offset      in the target
 *    32    4 length      bytes of the slice (READ: asked; WRITE, READ_DATA: payload that follows)
 *    36    4 status      answers: 0 or a gRPC status code
 *    40    4 payload_crc CRC32C of the payload when MG_DF_CRC
 *    44    4 header_crc  CRC32C of bytes 0..43: a torn or shifted stream is caught at once
 *
 * HELLO carries the session token (MG_DF_TOKEN_BYTES) as its payload; the receiver answers
 * HELLO_OK or ERROR. The receiver checks every other field against the target (bounds with
 * overflow-safe arithmetic, remote accessibility, tenant) before any payload byte lands.
 */
#ifndef MOONGATE_DATAFRAME_H
#define MOONGATE_DATAFRAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_DF_MAGIC 0x5044474dU /* "MGDP" little-endian */
/* The data-plane protocol versions this build speaks, oldest to newest. Two daemons agree on one
 * when the session opens (Peer/OpenSession: the highest both speak), so a rolling upgrade works
 * while neighbouring releases overlap; ranges that do not overlap are refused, naming both. */
#define MG_DF_VERSION      1
#define MG_DF_VERSION_MIN  1
#define MG_DF_HEADER_BYTES 48
#define MG_DF_TOKEN_BYTES  32

enum {
    MG_DF_HELLO = 1,
    MG_DF_HELLO_OK = 2,
    MG_DF_WRITE = 3,
    MG_DF_WRITE_ACK = 4,
    MG_DF_READ = 5,
    MG_DF_READ_DATA = 6,
    MG_DF_ERROR = 7,
};

#define MG_DF_CRC   0x0001u
#define MG_DF_LEASE 0x0002u

typedef struct mg_df_header {
    uint8_t version;
    uint8_t type;
    uint16_t flags;
    uint64_t slice;
    uint64_t target;
    uint64_t offset;
    uint32_t length;
    uint32_t status;
    uint32_t payload_crc;
} mg_df_header;

/* Results of mg_df_decode. */
enum {
    MG_DF_OK = 0,
    MG_DF_NEED_MORE = 1,    /* fewer than MG_DF_HEADER_BYTES bytes */
    MG_DF_BAD_MAGIC = -1,   /* not a moongate data-plane stream */
    MG_DF_BAD_VERSION = -2, /* another protocol version (the header's version is reported) */
    MG_DF_BAD_CRC = -3,     /* header checksum mismatch */
    MG_DF_BAD_TYPE = -4,    /* unknown type */
    MG_DF_BAD_FLAGS = -5,   /* unknown flag bits, or a flag the type does not take */
    MG_DF_BAD_LENGTH = -6,  /* payload over the limit, or a length the type does not take */
    MG_DF_BAD_RANGE = -7,   /* offset + length wraps around 2^64 */
};

/* Writes the 48-byte header of `h` (version MG_DF_VERSION) into out, checksummed. */
void mg_df_encode(const mg_df_header *h, uint8_t out[MG_DF_HEADER_BYTES]);
/* Reads a header from `len` bytes at `in` and checks it: magic, version, header checksum,
 * type, flags, length against `max_payload` (and HELLO's token size), offset + length overflow.
 * Returns MG_DF_OK, MG_DF_NEED_MORE or a negative MG_DF_BAD_*; `h` is filled as far as known
 * (h->version always once 5 bytes are there). */
int mg_df_decode(const uint8_t *in, size_t len, uint32_t max_payload, mg_df_header *h);
/* Bytes of payload that follow a decoded header. */
uint32_t mg_df_payload_bytes(const mg_df_header *h);
const char *mg_df_strerror(int rc);

/* CRC32C (Castagnoli), continuing from `crc` (0 to start), the fastest way the CPU has: */
enum {
    MG_CRC_TABLE, /* a byte at a time, through a table */
    MG_CRC_SSE42, /* the crc32 instruction, three streams at once */
    MG_CRC_FOLD,  /* past 1 KiB, AVX-512 carry-less multiplies (VPCLMULQDQ) */
};
uint32_t mg_crc32c(uint32_t crc, const void *data, size_t len);
/* From now on, in every thread, no faster than `way` (tests run each); returns the way in use. */
int mg_crc32c_limit(int way);
/* The same with a table, on any CPU (tests compare the two). */
uint32_t mg_crc32c_portable(uint32_t crc, const void *data, size_t len);
/* mg_crc32c of len bytes at src while copying them to dst (not overlapping): one pass over src
 * instead of a copy and a sum. With stream, dst is written by non-temporal stores: no read for
 * ownership and no cache lines taken, for a destination nobody reads soon (bytes landing in a
 * segment); without, dst stays in cache (a stage that is sent next). */
uint32_t mg_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len, int stream);

/* ---- slices: how a transfer is cut for the wire ---- */

typedef struct mg_slice {
    uint64_t local_offset;
    uint64_t remote_offset;
    uint32_t length;
} mg_slice;

/* How many slices of at most `slice_bytes` a transfer of `length` bytes takes (0 for 0). */
uint64_t mg_slice_count(uint64_t length, uint32_t slice_bytes);
/* Writes slices [first, first + max) of the transfer; returns how many were written. Offsets
 * are assumed checked (no wrap) by the caller. */
size_t mg_slice_plan(uint64_t local_offset, uint64_t remote_offset, uint64_t length,
                     uint32_t slice_bytes, uint64_t first, mg_slice *out, size_t max);

#ifdef __cplusplus
}
#endif

#endif
