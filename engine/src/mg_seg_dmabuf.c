/*
 * mg_seg_dmabuf: GPU memory (MG_SEG_DMABUF) — a dma-buf the client exported from its device
 * ("cuda:N"), passed on the fd socket with the memory's address in the client (the iova peers
 * and work requests name it by) and its size. It is registered with every RDMA device and
 * never mapped, read or written by this process: every path but RDMA refuses it, so a daemon
 * without RDMA devices refuses the registration. The devices hold the dma-buf once it is
 * registered (the descriptor is closed then) and keep its pages while the daemon holds it, so
 * the segment lives no longer than the connection that registered it.
 */
#include "mg_seg_kind.h"

#include <stdio.h>
#include <unistd.h>

static int dmabuf_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    if (spec->fd < 0 || spec->client_addr == 0 || spec->size == 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "GPU memory is registered by its dma-buf (passed on the daemon's fd "
                 "socket), its client address and its size");
        return MG_ERR_INVALID;
    }
    if (env->rdma == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "GPU memory moves over RDMA only, and this daemon has no RDMA device: "
                 "no peer can reach it here (moongate's own move_vram stages device memory "
                 "through the buffer pool, unregistered)");
        return MG_ERR_STATE;
    }
    return 0;
}

/* Nothing to map: the address is the client's, which no path of this process touches. */
static int dmabuf_map(mg_segment *seg)
{
    seg->addr = (void *)(uintptr_t)seg->client_addr;
    return 0;
}

/* Registered by its client address; the dma-buf is the devices' to hold from then on. */
static int dmabuf_rdma(mg_segment *seg)
{
    char why[512];
    int rc = mg_rdma_reg_dmabuf(seg->env->rdma, seg->fd, seg->offset, seg->size, seg->client_addr,
                                seg->remote_accessible, &seg->mr, why, sizeof(why));
    close(seg->fd);
    seg->fd = -1;
    if (rc != 0)
        mg_seg_error(seg, "RDMA registration of the dma-buf: %s", why);
    return rc;
}

static void dmabuf_unmap(mg_segment *seg)
{
    if (seg->fd >= 0) {
        close(seg->fd);
        seg->fd = -1;
    }
    seg->addr = NULL;
}

const mg_seg_kind mg_seg_dmabuf = {
    .source = MG_SEG_DMABUF,
    .name = "dmabuf",
    .what = "GPU memory (a dma-buf the RDMA devices reach, never this daemon)",
    .hint = "move it with a transfer over RDMA",
    .caps = MG_SEG_CAP_RDMA | MG_SEG_CAP_TARGET | MG_SEG_CAP_FD | MG_SEG_CAP_CONN,
    .location = "cuda",
    .location_default = 0,
    .check = dmabuf_check,
    .map = dmabuf_map,
    .rdma = dmabuf_rdma,
    .unmap = dmabuf_unmap,
    .describe = mg_seg_describe_offset,
};
