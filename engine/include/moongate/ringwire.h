/*
 * The submission ring of a local client (Transfer/AttachRing): shared memory between the daemon
 * and one process on its host, for posting batches and reading their ends without an HTTP/2
 * request each. The daemon makes the memory (a memfd sealed against shrinking and growing) and
 * two eventfds, and hands them to the process over the channel socket the process passed on the
 * fd socket (one message, MG_RING_HELLO, with the three descriptors: memory, doorbell,
 * completion bell). Both ends run on one host: the layout is this machine's structs.
 *
 *   page 0            mg_ring_hdr
 *   sq_off            sq_entries slots of MG_RING_SQE_SIZE bytes (submissions, process -> daemon)
 *   cq_off            cq_entries slots of MG_RING_CQE_SIZE bytes (completions, daemon -> process)
 *
 * Counters are free running uint32_t; slot i of a queue is counter & (entries - 1). The process
 * writes submission slots from sq_tail on, then stores sq_tail (release); if daemon_sleeping
 * reads 1 after that store (a full fence between), it writes 1 to the doorbell. The daemon
 * copies each submission out of the ring before it looks at it, advances sq_head, and answers
 * every submission it took with exactly one completion, written at cq_tail (then cq_tail is
 * stored, release; the completion bell rings when client_waiting reads 1). It takes a
 * submission only while the completion queue has room for its answer, counting what it has not
 * answered yet: a full ring is back-pressure, nothing is dropped. The process advances cq_head
 * as it reads completions, and rings the doorbell when daemon_needs_room reads 1 after that.
 *
 * Nothing the process writes is trusted: a tail more than sq_entries past the head, or a head of
 * the completion queue past its tail, breaks the ring (the daemon stops taking from it, sets
 * `broken` to a gRPC code and `why`, and rings the completion bell); an entry that does not
 * check is answered with INVALID_ARGUMENT naming why. A process that scribbles on its ring hurts
 * only itself. An entry that does not check takes one slot: what the process meant as its
 * pairs or note is read as the next entries (each answered too).
 *
 * The offsets of the header's fields and the slots' are pinned by engine/src/mg_ring.c's
 * static assertions, for clients in other languages (clients/python/moongate/ring.py).
 */
#ifndef MOONGATE_RINGWIRE_H
#define MOONGATE_RINGWIRE_H

#include <stdint.h>

#define MG_RING_MAGIC       0x31676e69726d6dULL /* "mmring1" */
#define MG_RING_SQE_SIZE    128
#define MG_RING_CQE_SIZE    256
#define MG_RING_MAX_ENTRIES 4096u

/* The one message on the channel socket: with SCM_RIGHTS, the memory, doorbell and bell. */
typedef struct mg_ring_hello {
    uint64_t magic;
    uint64_t ring_id;
    uint64_t size; /* of the memory */
} mg_ring_hello;

typedef struct mg_ring_hdr {
    uint64_t magic;
    uint32_t sq_entries, cq_entries; /* powers of two */
    uint64_t sq_off, cq_off, size;
    uint32_t broken;               /* daemon: 0, or the gRPC code the ring broke with */
    char why[96];                  /* daemon: NUL-terminated, when broken */
    _Alignas(64) uint32_t sq_tail; /* process */
    _Alignas(64) uint32_t sq_head; /* daemon */
    uint32_t daemon_sleeping;      /* daemon: 1 while it waits for the doorbell */
    uint32_t daemon_needs_room;    /* daemon: 1 while submissions wait for completions read */
    _Alignas(64) uint32_t cq_tail; /* daemon */
    _Alignas(64) uint32_t cq_head; /* process */
    uint32_t client_waiting;       /* process: 1 while it waits for the completion bell */
} mg_ring_hdr;

enum { MG_RING_READ = 0, MG_RING_WRITE = 1 }; /* TransferOp's values */

enum {
    /* `count` pairs by index into two prepared lists of the connection that attached the ring
     * (Transfer/PrepareList): pair k moves local_indices[k] of local_list with
     * remote_indices[k] of remote_list. The first MG_RING_INLINE_PAIRS pairs are in the entry;
     * the rest fill the next slots, MG_RING_SLOT_PAIRS each. */
    MG_RING_PAIRS = 1,
    /* `count` blocks of `length` bytes: block k's local bytes at local_offset + k * local_stride
     * of range local_index of local_list, its remote bytes at remote_offset + k * remote_stride
     * of range remote_index of remote_list. One slot. */
    MG_RING_STRIDED = 2,
};

enum { MG_RING_INLINE_PAIRS = 10, MG_RING_SLOT_PAIRS = MG_RING_SQE_SIZE / 8 };

/* flags: the batch notifies the remote list's peer once its requests there ended (as
 * SubmitRequest.notify): note_len bytes in the slots after the entry's (and its pairs'), the
 * topic (1..128 printable characters), a NUL, then the payload (at most 65536 bytes). */
#define MG_RING_NOTIFY 1u
/* flags: the submission is answered twice: once when its batch is accepted (checked and
 * entered: the completion has MG_RING_CQE_ACCEPTED and the batch's id), then at its end. A
 * refused one is answered once. */
#define MG_RING_ACCEPTED 2u
#define MG_RING_NOTE_MAX (128 + 1 + 65536)

/* MG_RING_SQE_SIZE bytes. */
typedef struct mg_ring_sqe {
    uint64_t user_data; /* given back in the completion */
    uint8_t op;         /* MG_RING_READ or MG_RING_WRITE */
    uint8_t kind;       /* MG_RING_PAIRS or MG_RING_STRIDED */
    uint16_t flags;     /* MG_RING_NOTIFY, MG_RING_ACCEPTED, or 0 */
    uint32_t count;     /* pairs or blocks, >= 1 */
    uint64_t local_list, remote_list;
    union {
        uint32_t pairs[MG_RING_INLINE_PAIRS][2]; /* [local index, remote index] */
        struct {
            uint32_t local_index, remote_index;
            uint64_t local_offset, remote_offset;
            uint64_t local_stride, remote_stride;
            uint64_t length;
        } strided;
    } u;
    uint32_t note_len;  /* MG_RING_NOTIFY: the note's bytes */
    uint32_t reserved0; /* 0 */
    uint64_t reserved1; /* 0 */
} mg_ring_sqe;

#define MG_RING_CQE_ACCEPTED 1u

/* MG_RING_CQE_SIZE bytes: a submission's end (or its acceptance, with MG_RING_ACCEPTED). */
typedef struct mg_ring_cqe {
    uint64_t user_data;
    uint64_t batch_id; /* 0 when it was refused before a batch was made */
    uint32_t code;     /* gRPC code: 0 when every request is done */
    uint32_t requests; /* in the batch */
    uint32_t done;     /* requests done */
    uint32_t failed;   /* index of the first failed request, or UINT32_MAX */
    uint32_t flags;    /* MG_RING_CQE_ACCEPTED: the batch was accepted, it goes on */
    char why[220];     /* NUL-terminated: what failed, when code is not 0 */
} mg_ring_cqe;

#endif
