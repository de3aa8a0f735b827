/*
 * Memory of this process by its address, whatever it is, registered the way a path serves it
 * (mg_client_register_any in mg_client.h): host memory as process memory, GPU memory by its
 * dma-bufs or staged. The CUDA driver is asked only of memory the daemon cannot reach as the
 * process's own.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mg_client.h"
#include "mg_cuda.h"
#include "mg_grpc.h"
#include "mg_vram.h"
#include "moongate/v1/memory.pb-c.h"

/* RegisterSegment of [ptr, ptr + len) as process memory. 0 with *id, or -1 with *status. */
static int register_process(mg_client *c, uintptr_t ptr, size_t len, int remote, const char *name,
                            uint64_t *id, int *status, char *err, size_t errcap)
{
    Moongate__V1__RegisterRequest q = MOONGATE__V1__REGISTER_REQUEST__INIT;
    q.name = (char *)name;
    q.source = MOONGATE__V1__SEGMENT_SOURCE__PROCESS;
    q.client_address = ptr;
    q.size = len;
    q.remote_accessible = remote;
    return mg_client_register(c, &q, id, status, err, errcap);
}

/* The device paths of mg_client_register_any, for memory the daemon refused as the process's
 * own (its reason in err). */
static int register_device(mg_client *c, uintptr_t ptr, size_t len, int remote, const char *name,
                           uint64_t *ids, int cap, mg_registered *out, int *status, char *err,
                           size_t errcap)
{
    char not_device[256], why[512];
    int n;
    if (mg_cuda_device_of(ptr, not_device, sizeof(not_device)) < 0) {
        snprintf(why, sizeof(why), "%s", err);
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap,
                 "%#lx (%zu bytes) is neither memory of this process nor device memory the CUDA "
                 "driver knows (freed, another process's, or of a context that is gone): as host "
                 "memory, %s; as device memory, %s",
                 (unsigned long)ptr, len, why, not_device);
        return -1;
    }
    out->kind = "device";
    n = mg_vram_register(c, ptr, len, remote, name, ids, cap, status, err, errcap);
    if (n >= 0 || *status != MG_GRPC_FAILED_PRECONDITION) {
        out->path = n >= 0 && remote ? "dmabuf" : "";
        return n;
    }
    snprintf(out->why, sizeof(out->why), "GPU memory by dma-buf: %s", err);
    if (cap < 1) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "no room for a segment id (cap %d)", cap);
        return -1;
    }
    if (mg_vram_register_staged(c, ptr, len, remote, name, &ids[0], status, err, errcap) == 0) {
        out->path = remote ? "staged" : "";
        return 1;
    }
    if (*status != MG_GRPC_FAILED_PRECONDITION || !remote)
        return -1;
    n = (int)strlen(out->why); /* no TCP data plane for peers: this process's transfers only */
    snprintf(out->why + n, sizeof(out->why) - (size_t)n, "; staged for peers: %s", err);
    if (mg_vram_register_staged(c, ptr, len, 0, name, &ids[0], status, err, errcap) != 0)
        return -1;
    out->path = "";
    return 1;
}

int mg_client_register_any(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                           const char *name, uint64_t *ids, int cap, mg_registered *out,
                           int *status, char *err, size_t errcap)
{
    char own[96];
    memset(out, 0, sizeof(*out));
    out->kind = "process";
    out->path = "";
    if (name == NULL) {
        snprintf(own, sizeof(own), "mem-%d-%lx", (int)getpid(), (unsigned long)ptr);
        name = own;
    }
    if (cap < 1) {
        *status = MG_GRPC_INVALID_ARGUMENT;
        snprintf(err, errcap, "no room for a segment id (cap %d)", cap);
        return -1;
    }
    if (register_process(c, ptr, len, remote_accessible, name, &ids[0], status, err, errcap) == 0) {
        out->path = remote_accessible ? "process_vm" : "";
        return 1;
    }
    if (*status == MG_GRPC_INVALID_ARGUMENT)
        return register_device(c, ptr, len, remote_accessible, name, ids, cap, out, status, err,
                               errcap);
    if (*status != MG_GRPC_FAILED_PRECONDITION || !remote_accessible)
        return -1;
    /* no data plane for peers; process memory off on the daemon fails again, naming it */
    snprintf(out->why, sizeof(out->why), "%s", err);
    if (register_process(c, ptr, len, 0, name, &ids[0], status, err, errcap) == 0)
        return 1;
    if (*status == MG_GRPC_INVALID_ARGUMENT)
        return register_device(c, ptr, len, 0, name, ids, cap, out, status, err, errcap);
    return -1;
}
