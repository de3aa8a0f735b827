/*
 * mg_seg_proc: process memory by address (MG_SEG_PROCESS) — memory a local client allocated
 * itself (malloc'd buffers, CPU tensors) with no file to pass. The daemon maps nothing: it
 * reaches the bytes in the client's process with process_vm_readv/writev (moongate/procmem.h),
 * on the copy and TCP paths only: as the local side of a request, and, registered
 * remote-accessible, as a peer's target over the TCP data plane (which lands and sends its
 * slices with the kind's read and write: the kind lacks MG_SEG_CAP_MAPPED) — never over RDMA,
 * never a target of a copy on this daemon, never shared, never read or written inline. Only
 * the process itself registers it, on the Unix socket, by address and size; it must run as the
 * socket's uid. seg->addr is the client's address, never dereferenced here.
 */
#include "mg_seg_kind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int proc_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    if (env->process_memory_off) {
        snprintf(err, MG_SEG_ERROR_MAX, "%s", env->process_memory_off);
        return MG_ERR_STATE;
    }
    if (spec->client_addr == 0 || spec->size == 0 || !spec->caller_uid_known) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "process memory is named by its address and size (client_address, size), "
                 "by the process that has it, on the Unix socket");
        return MG_ERR_INVALID;
    }
    if (spec->share && spec->share[0]) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "process memory is never shared with other tenants (register it by "
                 "descriptor for that)");
        return MG_ERR_INVALID;
    }
    if (spec->remote_accessible && !env->tcp_targets) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "peers reach process memory over the TCP data plane, which is off on this "
                 "daemon (--data-listen \"\"): register it without remote access, or by "
                 "descriptor");
        return MG_ERR_STATE;
    }
    return 0;
}

/* The process is opened and every page of the range checked to be memory the daemon can
 * reach there. */
static int proc_map(mg_segment *seg)
{
    int rc =
        mg_procmem_open(&seg->pm, &seg->client, seg->caller_uid, seg->error, sizeof(seg->error));
    if (rc == 0)
        rc = mg_procmem_probe(seg->pm, seg->client_addr, seg->size, seg->error, sizeof(seg->error));
    if (rc != 0)
        return rc;
    seg->addr = (void *)(uintptr_t)seg->client_addr;
    return 0;
}

static void proc_unmap(mg_segment *seg)
{
    if (seg->pm) {
        mg_procmem_close(seg->pm);
        seg->pm = NULL;
        seg->addr = NULL;
    }
}

static int proc_range(const mg_segment *seg, uint64_t off, uint64_t len, char *why, size_t cap)
{
    return mg_procmem_probe(seg->pm, seg->client_addr + off, len, why, cap);
}

static int proc_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                     size_t cap)
{
    return mg_procmem_read(seg->pm, dst, seg->client_addr + off, n, why, cap);
}

static int proc_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                      size_t cap)
{
    return mg_procmem_write(seg->pm, seg->client_addr + off, src, n, why, cap);
}

const mg_seg_kind mg_seg_proc = {
    .source = MG_SEG_PROCESS,
    .name = "process",
    .what = "a process's memory (reached with process_vm on transfers)",
    .hint = "move it with a transfer (peer \"\" to a segment here)",
    .caps = MG_SEG_CAP_TCP | MG_SEG_CAP_COPY | MG_SEG_CAP_CALLER,
    .location = "cpu",
    .location_default = 1,
    .check = proc_check,
    .map = proc_map,
    .unmap = proc_unmap,
    .range = proc_range,
    .read = proc_read,
    .write = proc_write,
    .describe = mg_seg_describe_offset,
};
