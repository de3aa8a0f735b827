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

#endif
