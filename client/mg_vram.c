/*
 * GPU memory, client side: a device range's dma-bufs (mg_vram.h).
 */
#include "mg_vram.h"

#include "mg_client.h"
#include "mg_client_int.h"
#include "mg_cuda.h"

#include "moongate/v1/memory.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Device `dev` exports dma-bufs: 0, or -1 with err. */
static int dmabuf_supported(const mg_cuda *cu, int dev, char *err, size_t errcap)
{
    mg_cu_device d;
    int ok = 0;
    mg_cu_result rc = cu->cuDeviceGet(&d, dev);
    char text[256];
    if (rc == MG_CU_SUCCESS)
        rc = cu->cuDeviceGetAttribute(&ok, MG_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
    if (rc != MG_CU_SUCCESS) {
        snprintf(err, errcap, "cuda:%d: %s", dev, mg_cuda_strerror(cu, rc, text, sizeof(text)));
        return -1;
    }
    if (!ok) {
        snprintf(err, errcap,
                 "cuda:%d exports no dma-buf (DMA_BUF_SUPPORTED is 0: CUDA 11.7 or later and "
                 "the open kernel modules have it)",
                 dev);
        return -1;
    }
    return 0;
}

/* The dma-buf of [start, end), inside one allocation, in the context that owns it. */
static int export_one(const mg_cuda *cu, const mg_cuda_ptr_info *info, uint64_t start, uint64_t end,
                      mg_vram_piece *out, char *err, size_t errcap)
{
    mg_cu_result rc = cu->cuCtxPushCurrent(info->context);
    char text[256];
    int fd = -1;
    if (rc == MG_CU_SUCCESS) {
        rc = cu->cuMemGetHandleForAddressRange(&fd, start, end - start,
                                               MG_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        cu->cuCtxPopCurrent(NULL);
    }
    if (rc != MG_CU_SUCCESS) {
        snprintf(err, errcap, "cuMemGetHandleForAddressRange(0x%llx, %llu): %s",
                 (unsigned long long)start, (unsigned long long)(end - start),
                 mg_cuda_strerror(cu, rc, text, sizeof(text)));
        return -1;
    }
    *out = (mg_vram_piece){.fd = fd, .address = start, .size = end - start, .device = info->device};
    return 0;
}

int mg_vram_export(uintptr_t ptr, size_t len, mg_vram_piece *out, int cap, char *err, size_t errcap)
{
    const mg_cuda *cu = mg_cuda_get(err, errcap);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), at = ptr, end = (uint64_t)ptr + len;
    int n = 0;
    if (cu == NULL)
        return -1;
    if (len == 0 || end < at) {
        snprintf(err, errcap, "a range of GPU memory needs a length (and no wrap)");
        return -1;
    }
    while (at < end) {
        mg_cuda_ptr_info info;
        uint64_t lo, hi;
        if (mg_cuda_pointer(cu, (uintptr_t)at, &info) != 1) {
            snprintf(err, errcap, "0x%llx is not GPU memory the CUDA driver knows",
                     (unsigned long long)at);
            goto fail;
        }
        if (n == cap) {
            snprintf(err, errcap, "the range crosses more than %d allocations", cap);
            goto fail;
        }
        lo = at / page * page < info.base ? info.base : at / page * page;
        hi = end < info.base + info.size ? end : info.base + info.size;
        hi = (hi + page - 1) / page * page > info.base + info.size ? hi
                                                                   : (hi + page - 1) / page * page;
        if (dmabuf_supported(cu, info.device, err, errcap) != 0 ||
            export_one(cu, &info, lo, hi, &out[n], err, errcap) != 0)
            goto fail;
        n++;
        at = info.base + info.size;
    }
    return n;
fail:
    while (n > 0)
        close(out[--n].fd);
    return -1;
}

int mg_vram_piece_request(const char *sock, const char *token, const mg_vram_piece *p,
                          int remote_accessible, Moongate__V1__RegisterRequest *req, char *location,
                          size_t loccap, int *status, char *err, size_t errcap)
{
    uint64_t handle, ttl;
    snprintf(location, loccap, "cuda:%d", p->device);
    if (mg_fd_pass(sock, p->fd, token, &handle, &ttl, status, err, errcap) != 0)
        return -1;
    req->source = MOONGATE__V1__SEGMENT_SOURCE__DMABUF;
    req->fd_handle = handle;
    req->size = p->size;
    req->client_address = p->address;
    req->location = location;
    req->remote_accessible = remote_accessible != 0;
    return 0;
}

/* One piece's registration: the dma-buf passed on the fd socket and RegisterSegment. */
static int register_piece(mg_client *c, const char *sock, const mg_vram_piece *p, const char *name,
                          int remote_accessible, uint64_t *id, int *status, char *err,
                          size_t errcap)
{
    Moongate__V1__RegisterRequest req = MOONGATE__V1__REGISTER_REQUEST__INIT;
    char location[24];
    if (mg_vram_piece_request(sock, mg_client_token(c), p, remote_accessible, &req, location,
                              sizeof(location), status, err, errcap) != 0)
        return -1;
    req.name = (char *)name;
    return mg_client_register(c, &req, id, status, err, errcap);
}

/* What makes a piece again after a restart: its range, exported again. */
typedef struct {
    uint64_t address, size;
    int remote_accessible;
    char name[160];
} kept_piece;

static int piece_redo(mg_client *c, void *arg, uint64_t *id, char *err, size_t errcap)
{
    kept_piece *k = arg;
    mg_vram_piece p;
    char sock[4200];
    int status, rc;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0 ||
        mg_vram_export((uintptr_t)k->address, k->size, &p, 1, err, errcap) != 1)
        return -1;
    rc = register_piece(c, sock, &p, k->name, k->remote_accessible, id, &status, err, errcap);
    close(p.fd);
    return rc;
}

static void piece_keep(mg_client *c, const mg_vram_piece *p, const char *name,
                       int remote_accessible, uint64_t id)
{
    kept_piece *k = mgc_keep_of(c) ? calloc(1, sizeof(*k)) : NULL;
    if (k == NULL)
        return; /* it does not come back after a restart; nothing else is lost */
    k->address = p->address;
    k->size = p->size;
    k->remote_accessible = remote_accessible;
    snprintf(k->name, sizeof(k->name), "%s", name);
    mgc_keep_redo(c, id, piece_redo, free, k, 1);
}

int mg_vram_register(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                     const char *name, uint64_t *ids, int cap, int *status, char *err,
                     size_t errcap)
{
    mg_vram_piece pieces[64];
    char sock[4200], names[160];
    int n, k = 0;
    *status = MG_GRPC_FAILED_PRECONDITION;
    if (mg_fd_socket_of(mg_client_target(c), sock, sizeof(sock)) != 0) {
        snprintf(err, errcap,
                 "GPU memory is passed as dma-bufs on the daemon's Unix socket: "
                 "connect to a unix:PATH target");
        return -1;
    }
    if ((n = mg_vram_export(ptr, len, pieces, cap < 64 ? cap : 64, err, errcap)) < 0)
        return -1;
    for (; k < n; k++) {
        if (name)
            snprintf(names, sizeof(names), "%.120s-%d", name, k);
        else
            snprintf(names, sizeof(names), "vram-%d-%llx-%d", (int)getpid(),
                     (unsigned long long)ptr, k);
        if (register_piece(c, sock, &pieces[k], names, remote_accessible, &ids[k], status, err,
                           errcap) != 0)
            break;
        piece_keep(c, &pieces[k], names, remote_accessible, ids[k]);
    }
    for (int i = 0; i < n; i++)
        close(pieces[i].fd); /* passed: the daemon has its own */
    if (k < n) {             /* nothing stays: the pieces registered so far go */
        for (int i = 0; i < k; i++) {
            int st;
            char msg[128];
            mg_client_unregister(c, ids[i], &st, msg, sizeof(msg));
        }
        return -1;
    }
    *status = MG_GRPC_OK;
    return n;
}
