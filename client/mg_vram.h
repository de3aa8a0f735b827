/*
 * GPU memory for moongate (client side): the dma-bufs of a range of device memory, as the
 * daemon registers them with its RDMA devices (ibv_reg_dmabuf_mr). The CUDA driver is reached
 * through mg_cuda.h (loaded at run time).
 */
#ifndef MG_VRAM_H
#define MG_VRAM_H

#include <stddef.h>
#include <stdint.h>

/* One allocation's part of a range, widened to whole pages within that allocation. */
typedef struct mg_vram_piece {
    int fd;           /* its dma-buf: the caller closes it (passing it keeps the daemon's own) */
    uint64_t address; /* its first byte in this process (page-aligned): the client address */
    uint64_t size;    /* a multiple of the page size */
    int device;       /* the CUDA device it lies on */
} mg_vram_piece;

/* The dma-bufs of device memory [ptr, ptr + len): one piece per allocation the range crosses,
 * in address order. Returns how many (at most cap), or -1 with err saying why: no CUDA driver,
 * memory the driver does not know as a device's at an address, a device without dma-buf
 * support (CUDA 11.7+ and a driver with it: the open kernel modules), more than cap pieces, or
 * the driver's error for the export. Nothing stays open on -1. Thread-safe. */
int mg_vram_export(uintptr_t ptr, size_t len, mg_vram_piece *out, int cap, char *err,
                   size_t errcap);

typedef struct mg_client mg_client;

/* Registers device memory [ptr, ptr + len) with the daemon of c (a "unix:" target, used as
 * mg_client_call does): its dma-bufs (mg_vram_export) passed on the fd socket and registered
 * (source DMABUF, location "cuda:N", the piece's address), remote-accessible if asked, named
 * name-K (NULL: "vram-PID-ADDR-K"). The registrations live as long as c's connection (or its
 * agent). Returns how many segments (their ids in ids[0..n), at most cap), or -1 with *status
 * (a gRPC code) and err; nothing stays registered on -1. */
int mg_vram_register(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                     const char *name, uint64_t *ids, int cap, int *status, char *err,
                     size_t errcap);

/* Registers device memory [ptr, ptr + len) with the daemon of c (a "unix:" target) as STAGED:
 * a peer's target over TCP where no RDMA path reaches it (a daemon without RDMA devices, a GPU
 * without dma-buf). This library serves the range's copy channel on a thread of its own from
 * then on (moongate/stagewire.h): a peer's WRITE is copied from the daemon's staging buffer
 * into the device, a READ out of it, in the context that owns ptr, while the program does
 * nothing. The registration lives as long as c's connection (or its agent), and is made again
 * after a daemon restart. Returns 0 with *id, or -1 with *status (a gRPC code) and err: no
 * driver, memory the driver does not know as a device's, the daemon's refusal. */
int mg_vram_register_staged(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                            const char *name, uint64_t *id, int *status, char *err, size_t errcap);

/* Serves fd, this process's end of a staged registration's copy channel, from now on (it is
 * this library's to close): for callers that register the range themselves (Python's client).
 * ptr is the range's device pointer, whose context the copies run in; *device its device.
 * Returns 0, or -1 with *status and err (no driver; not device memory). */
int mg_vram_stage_serve(int fd, uintptr_t ptr, int *device, int *status, char *err, size_t errcap);

struct Moongate__V1__RegisterRequest;

/* For callers that make the RegisterSegment call themselves (the Mooncake C door): a copy
 * channel for device memory [ptr, ptr + len) made and served (mg_vram_stage_serve), the
 * daemon's end passed on the fd socket `sock` (with `token`, or NULL), and req filled to register
 * it STAGED (source, fd_handle, size, client_address, location into location[loccap],
 * remote_accessible); the caller sets the name. 0 with *chan the served end (shut it down,
 * shutdown(2), if the registration fails: the serving thread then lets it go), or -1 with
 * *status and err. */
int mg_vram_stage_request(const char *sock, const char *token, uintptr_t ptr, size_t len,
                          int remote_accessible, struct Moongate__V1__RegisterRequest *req,
                          char *location, size_t loccap, int *chan, int *status, char *err,
                          size_t errcap);

/* The request that registers one piece, for callers that make the RegisterSegment call
 * themselves (the Mooncake C door, from its own loop): passes p->fd on the daemon's fd socket
 * `sock` (with `token`, or NULL), then fills req's source (DMABUF), fd_handle, size,
 * client_address, remote_accessible and location ("cuda:N", written into location[loccap]);
 * the caller sets the name. 0, or -1 with *status and err. */
int mg_vram_piece_request(const char *sock, const char *token, const mg_vram_piece *p,
                          int remote_accessible, struct Moongate__V1__RegisterRequest *req,
                          char *location, size_t loccap, int *status, char *err, size_t errcap);

/* ---- moving GPU memory: by dma-buf over RDMA, or staged through leases ---- */

enum {
    MG_VRAM_AUTO = 0,   /* dma-buf when this daemon has RDMA devices and the range is
                         * registered (mg_vram_register); else, and when that is refused before
                         * a byte moves, staged (the result says why) */
    MG_VRAM_STAGED = 1, /* through leased host buffers, over any transport */
    MG_VRAM_DMABUF = 2, /* by the range's dma-buf registration only (RDMA) */
};

typedef struct mg_vram_move_args {
    int write;     /* 1: WRITE device memory -> target; 0: READ target -> device */
    uintptr_t ptr; /* device memory of this process, any alignment */
    size_t len;
    const char *peer;        /* the target's daemon "host:port"; NULL or "": this daemon */
    uint64_t remote_segment; /* the target: a segment, a lease, or an agent's address */
    uint64_t remote_lease;
    const char *remote_agent;
    uint64_t remote_address;
    uint64_t remote_offset; /* added to the target's start */
    void *stream;           /* a CUstream the copies go on, after the work queued there; NULL:
                             * one of the library's own */
    size_t chunk;           /* staged bytes per step (0: a quarter of len, 1 to 16 MiB); shrinks
                             * to what the pool holds */
    uint32_t timeout_ms;    /* the whole move, waits for a busy pool included; 0: 60 s */
    int path;               /* MG_VRAM_AUTO, MG_VRAM_STAGED or MG_VRAM_DMABUF */
} mg_vram_move_args;

typedef struct mg_vram_move_result {
    const char *path; /* "staged" or "rdma-dmabuf": how the bytes went (the batches' tag) */
    uint64_t bytes;   /* moved */
    uint64_t chunk;   /* staged: bytes per step */
    uint32_t chunks;  /* staged: steps, one batch each */
    int buffers;      /* staged: leases in turn (up to 4; fewer when the pool had no room) */
    int bounce;       /* staged: 1 when the pool's mapping could not be pinned
                       * (cuMemHostRegister) and a private pinned buffer was copied through */
    char pool[64];    /* staged: the pool leased from */
    char why[256];    /* MG_VRAM_AUTO that staged: why not by dma-buf */
} mg_vram_move_result;

/* Moves [ptr, ptr + len) of device memory to (write) or from the target over c (used as
 * mg_client_call: not from its callbacks), in the context that owns ptr, and waits for the end.
 * Staged: up to four leases of this daemon's pool (its file mapped and pinned once per process;
 * the chunk shrinks so that four fit the pool, or fewer in turn), each step one batch tagged
 * "staged", several on the wire at once while the device copy of the next runs. The leases are
 * released on every path. Returns 0 with *r set, or -1 with *status (a gRPC code) and err: the
 * daemon's refusal, the pool (RESOURCE_EXHAUSTED naming it when it cannot hold a page), or the CUDA
 * error of a copy (INTERNAL, "cuMemcpy...: CUDA_ERROR_..."); r->bytes then says what had moved. */
int mg_vram_move(mg_client *c, const mg_vram_move_args *a, mg_vram_move_result *r, int *status,
                 char *err, size_t errcap);

#endif
