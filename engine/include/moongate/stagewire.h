/*
 * The copy channel of staged GPU memory (MG_SEG_STAGED): a Unix SOCK_SEQPACKET socket pair
 * between the daemon and the process whose device memory it is, one per registered range. The
 * process's end is served by its client library on a thread of its own (mg_vram_stage.c); the
 * daemon's end was passed on the fd socket at registration (mg_seg_staged.c).
 *
 * The daemon cannot reach device memory: a peer's WRITE lands in host memory of the daemon's
 * (the staging buffer, shared with the process), and the daemon orders the process to copy it
 * into the device (TO_DEVICE), waiting for the answer before the slice is acknowledged; a READ
 * orders the copy out (FROM_DEVICE) and sends what landed. Both ends run on one host: the
 * messages are this machine's structs, one per packet.
 *
 *   daemon -> process   HELLO (with SCM_RIGHTS: the staging buffer's memfd; len its size, addr
 *                       the range's first device address), then orders, one at a time
 *   process -> daemon   one answer per message, same seq: status 0, or a gRPC code and why
 */
#ifndef MOONGATE_STAGEWIRE_H
#define MOONGATE_STAGEWIRE_H

#include <stdint.h>

#define MG_STAGE_MAGIC 0x6d677331u /* "mgs1" */

enum { MG_STAGE_HELLO = 1, MG_STAGE_TO_DEVICE = 2, MG_STAGE_FROM_DEVICE = 3 };

typedef struct mg_stage_order {
    uint32_t magic;
    uint32_t type;     /* MG_STAGE_* */
    uint64_t seq;      /* echoed by the answer */
    uint64_t addr;     /* the device address in the process */
    uint64_t slot_off; /* where in the staging buffer */
    uint64_t len;      /* bytes (HELLO: the staging buffer's size) */
} mg_stage_order;

typedef struct mg_stage_answer {
    uint32_t magic;
    uint32_t status; /* 0, or a gRPC code */
    uint64_t seq;
    char why[240]; /* NUL-terminated, when status is not 0 */
} mg_stage_answer;

#endif
