/*
 * Memory registration (registerLocalMemory and its batch forms). Memory the caller mapped from a
 * file it shares (a memfd it keeps open, shm_open, a /dev/shm or hugetlbfs file) is registered
 * by descriptor, where it lies: peers may read and write it, and RDMA reaches it (where the
 * daemon has devices, a remote-accessible file must be sealed against shrinking: a memfd with
 * F_SEAL_SHRINK). Any other memory (malloc, the stack, a private mapping) is
 * registered as process memory: the daemon reaches it with process_vm, and, remote-accessible,
 * peers read and write it over TCP (never RDMA). Device memory (a CUDA pointer: location
 * "cuda:N", or any range no host mapping of this process holds, asked of the driver loaded at
 * run time only then) is registered by its dma-buf, one region per allocation the range
 * crosses: peers read and write it over RDMA; a daemon without RDMA devices refuses it at
 * registration, saying why. Which one it was is logged, once each.
 */
#include "te_internal.h"

#include "mg_cuda.h"
#include "mg_vram.h"
#include "moongate/v1/memory.pb-c.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define ERR_INVALID_ARGUMENT       (-1)
#define ERR_ADDRESS_NOT_REGISTERED (-3)
#define ERR_ADDRESS_OVERLAPPED     (-7)

/* A descriptor open on the file with this device and inode, found among this process's open
 * descriptors (a memfd the program keeps open), or -1. */
static int open_fd_of(dev_t dev, ino_t ino)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    char path[300];
    int fd = -1;
    while (d != NULL && fd < 0 && (de = readdir(d)) != NULL) {
        struct stat st;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
        if (de->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_dev == dev && st.st_ino == ino)
            fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (d != NULL)
        closedir(d);
    return fd;
}

/* A descriptor (O_RDWR) of the shared file mapping [addr, addr + len) lies in, with the file
 * offset of addr; -1 when the range is not inside one such mapping or the file cannot be
 * opened again: by a descriptor the process holds, by its path, or by /proc/self/map_files. */
static int file_of(uintptr_t addr, size_t len, uint64_t *offset)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4400], perms[8], path[4096];
    unsigned long start, end, off, ino;
    unsigned int major, minor;
    int fd = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        path[0] = '\0';
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %4095[^\n]", &start, &end, perms, &off, &major,
                   &minor, &ino, path) < 7 ||
            addr < start || addr >= end)
            continue;
        if (addr + len > end || len > end - start || strncmp(perms, "rw", 2) != 0 ||
            perms[3] != 's' || ino == 0)
            break;
        fd = open_fd_of(makedev(major, minor), (ino_t)ino);
        if (fd < 0 && path[0] == '/' && strstr(path, " (deleted)") == NULL)
            fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) { /* where the kernel lets this process open its mappings */
            snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", start, end);
            fd = open(path, O_RDWR | O_CLOEXEC);
        }
        *offset = off + (addr - start);
        break;
    }
    if (f != NULL)
        fclose(f);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            fd = -1;
        }
    }
    return fd;
}

/* Fills q to register the range by descriptor (1) or as process memory (0); -1 on failure. */
static int describe_memory(te_engine *e, uintptr_t addr, size_t len, int remote,
                           Moongate__V1__RegisterRequest *q)
{
    uint64_t offset = 0, handle = 0, ttl = 0;
    char sock[4200], err[512];
    int fd = file_of(addr, len, &offset), st = 0;
    q->client_address = addr;
    q->size = len;
    q->remote_accessible = remote != 0;
    if (fd < 0) {
        q->source = MOONGATE__V1__SEGMENT_SOURCE__PROCESS;
        return 0;
    }
    if (mg_fd_socket_of(e->target, sock, sizeof(sock)) != 0 ||
        mg_fd_pass(sock, fd, e->token[0] ? e->token : NULL, &handle, &ttl, &st, err, sizeof(err)) !=
            0) {
        te_log("registerLocalMemory(%#lx): passing its file: %s", (unsigned long)addr, err);
        close(fd);
        return -1;
    }
    close(fd);
    q->source = MOONGATE__V1__SEGMENT_SOURCE__FD;
    q->fd_handle = handle;
    q->offset = offset;
    return 1;
}

static int overlaps(te_engine *e, uintptr_t addr, size_t len)
{
    for (size_t i = 0; i < e->n_regions; i++)
        if (e->regions[i].addr < addr + len && addr < e->regions[i].addr + e->regions[i].len)
            return 1;
    return 0;
}

int te_holds(te_engine *e, uintptr_t addr, size_t len)
{
    for (size_t i = 0; i < e->n_regions; i++)
        if (e->regions[i].addr <= addr && len <= e->regions[i].len &&
            addr - e->regions[i].addr <= e->regions[i].len - len)
            return 1;
    return 0;
}

/* One RegisterSegment of the range, by descriptor or as process memory (*kind 1 or 0). */
static int register_call(te_engine *e, uintptr_t a, size_t length, int remote, char *name,
                         int *kind, uint8_t **resp, size_t *len, char *msg, size_t msgcap)
{
    Moongate__V1__RegisterRequest q = MOONGATE__V1__REGISTER_REQUEST__INIT;
    if ((*kind = describe_memory(e, a, length, remote, &q)) < 0) {
        snprintf(msg, msgcap, "its file could not be passed");
        return MG_GRPC_UNAVAILABLE;
    }
    q.name = name;
    return te_call_run(e, "/moongate.v1.Memory/RegisterSegment", &q.base, 60000, resp, len, msg,
                       msgcap);
}

/* 1 when every byte of [addr, addr + len) lies in a readable and writable mapping of this
 * process that is not a GPU driver's device file: host memory, never asked of the driver. */
static int host_memory(uintptr_t addr, size_t len)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4400], perms[8], path[4096];
    unsigned long start, end, off, ino;
    unsigned int major, minor;
    uintptr_t at = addr;
    while (f != NULL && at - addr < len && fgets(line, sizeof(line), f) != NULL) {
        path[0] = '\0';
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %4095[^\n]", &start, &end, perms, &off, &major,
                   &minor, &ino, path) < 7 ||
            at < start || at >= end)
            continue; /* the maps are in address order: a gap ends the search below */
        if (strncmp(perms, "rw", 2) != 0 || strncmp(path, "/dev/nvidia", 11) == 0)
            break;
        at = end;
    }
    if (f != NULL)
        fclose(f);
    return at - addr >= len;
}

/* The CUDA device of [addr, addr + len) when the driver knows it as device memory; -1 when it
 * does not (host memory; why says so where no host mapping holds it either), or -2 with why (no
 * driver, or location "cuda:N" naming memory the driver does not hold). The driver is loaded
 * only when asked for: a "cuda" location, or a range no host mapping holds. */
static int device_of(uintptr_t addr, size_t len, const char *location, char *why, size_t cap)
{
    int asked = location != NULL && strncmp(location, "cuda", 4) == 0, device;
    if (!asked && host_memory(addr, len))
        return -1;
    if ((device = mg_cuda_device_of(addr, why, cap)) >= 0)
        return device;
    if (asked && strncmp(why, "no CUDA driver", 14) != 0)
        snprintf(why, cap,
                 "location \"%s\", but the CUDA driver does not know %#lx as device "
                 "memory",
                 location, (unsigned long)addr);
    return asked ? -2 : -1; /* not asked: the daemon says what it makes of the range */
}

/* Appends n regions to the engine's list: 0, or -1 (out of memory: none added). */
static int append_regions(te_engine *e, const te_region *g, size_t n)
{
    te_region *grown;
    pthread_mutex_lock(&e->mu);
    grown = realloc(e->regions, (e->n_regions + n) * sizeof(*grown));
    if (grown != NULL) {
        e->regions = grown;
        memcpy(grown + e->n_regions, g, n * sizeof(*g));
        e->n_regions += n;
    }
    pthread_mutex_unlock(&e->mu);
    return grown != NULL ? 0 : -1;
}

/* Unregisters segment id, registered for addr, with the daemon: 0, or the gRPC code (logged). */
static int unregister_id(te_engine *e, uint64_t id, const void *addr)
{
    Moongate__V1__UnregisterRequest q = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
    char msg[512];
    int st;
    q.id = id;
    if ((st = te_call_run(e, "/moongate.v1.Memory/UnregisterSegment", &q.base, 60000, NULL, NULL,
                          msg, sizeof(msg))) == 0)
        return 0;
    te_log("unregisterLocalMemory(%p): segment %llu: %s", addr, (unsigned long long)id, msg);
    return st;
}

/* RegisterSegment of q; the segment's id in *id. 0, or a gRPC code with msg. */
static int register_request(te_engine *e, Moongate__V1__RegisterRequest *q, uint64_t *id, char *msg,
                            size_t msgcap)
{
    Moongate__V1__RegisterResponse *r;
    uint8_t *resp = NULL;
    size_t len = 0;
    int st;
    if ((st = te_call_run(e, "/moongate.v1.Memory/RegisterSegment", &q->base, 60000, &resp, &len,
                          msg, msgcap)) != 0)
        return st;
    r = moongate__v1__register_response__unpack(NULL, len, resp);
    free(resp);
    st = r != NULL && r->segment != NULL ? 0 : MG_GRPC_INTERNAL;
    if (st == 0)
        *id = r->segment->id;
    else
        snprintf(msg, msgcap, "the daemon's RegisterResponse did not decode");
    if (r != NULL)
        moongate__v1__register_response__free_unpacked(r, NULL);
    return st;
}

/* One RegisterSegment of device memory's piece p, by its dma-buf; its id in *id. */
static int register_piece(te_engine *e, const char *sock, const mg_vram_piece *p, char *name,
                          int remote, uint64_t *id, char *msg, size_t msgcap)
{
    Moongate__V1__RegisterRequest q = MOONGATE__V1__REGISTER_REQUEST__INIT;
    char location[24];
    int st;
    if (mg_vram_piece_request(sock, e->token[0] ? e->token : NULL, p, remote, &q, location,
                              sizeof(location), &st, msg, msgcap) != 0)
        return st ? st : MG_GRPC_UNAVAILABLE;
    q.name = name;
    return register_request(e, &q, id, msg, msgcap);
}

/* Device memory g->addr, g->len registered STAGED (no RDMA path reaches it): its copy channel
 * served by this process's copy thread (mg_vram_stage_serve), the daemon's end passed on the fd
 * socket. Sets g->segment and g->device. 0, or a gRPC code with msg. */
static int register_staged(te_engine *e, te_region *g, char *msg, size_t msgcap)
{
    Moongate__V1__RegisterRequest q = MOONGATE__V1__REGISTER_REQUEST__INIT;
    char sock[4200], location[24], name[80];
    int chan, st = MG_GRPC_FAILED_PRECONDITION;
    if (mg_fd_socket_of(e->target, sock, sizeof(sock)) != 0) {
        snprintf(msg, msgcap, "GPU memory is staged through the daemon's Unix socket");
        return st;
    }
    if (mg_vram_stage_request(sock, e->token[0] ? e->token : NULL, g->addr, g->len, g->remote, &q,
                              location, sizeof(location), &chan, &st, msg, msgcap) != 0)
        return st ? st : MG_GRPC_UNAVAILABLE;
    g->device = atoi(location + 5); /* "cuda:N" */
    snprintf(name, sizeof(name), "mooncake-%d-%lx", (int)getpid(), (unsigned long)g->addr);
    q.name = name;
    if ((st = register_request(e, &q, &g->segment, msg, msgcap)) != 0)
        shutdown(chan, SHUT_RDWR); /* the copy thread sees the end and lets it go */
    return st;
}

/* Device memory [a, a + length) registered by its dma-bufs: a region per allocation it
 * crosses, all or none. 0, or a gRPC code with msg. */
static int register_device(te_engine *e, uintptr_t a, size_t length, int remote, char *msg,
                           size_t msgcap)
{
    mg_vram_piece pieces[16];
    te_region made[16];
    char sock[4200], name[80];
    int n, k = 0, st = 0;
    if (mg_fd_socket_of(e->target, sock, sizeof(sock)) != 0) {
        snprintf(msg, msgcap, "GPU memory is passed as dma-bufs on the daemon's Unix socket");
        return MG_GRPC_FAILED_PRECONDITION;
    }
    if ((n = mg_vram_export(a, length, pieces, 16, msg, msgcap)) < 0)
        return MG_GRPC_FAILED_PRECONDITION;
    for (; k < n && st == 0; k++) {
        uintptr_t from = pieces[k].address > a ? pieces[k].address : a;
        uintptr_t to = pieces[k].address + pieces[k].size < a + length
                           ? pieces[k].address + pieces[k].size
                           : a + length;
        snprintf(name, sizeof(name), "mooncake-%d-%lx-%d", (int)getpid(), (unsigned long)a, k);
        made[k] = (te_region){.addr = from,
                              .len = to - from,
                              .remote = remote,
                              .device = pieces[k].device,
                              .group = a};
        st = register_piece(e, sock, &pieces[k], name, remote, &made[k].segment, msg, msgcap);
    }
    for (int i = 0; i < n; i++)
        close(pieces[i].fd); /* passed: the daemon holds its own */
    if (st == 0) {
        if (append_regions(e, made, (size_t)n) == 0)
            return 0;
        snprintf(msg, msgcap, "out of memory");
        st = MG_GRPC_RESOURCE_EXHAUSTED;
        k++;
    }
    for (int i = 0; i + 1 < k; i++) /* nothing stays: those registered before go */
        unregister_id(e, made[i].segment, (void *)a);
    return st;
}

/* Adds region g to the engine's list: 0, or -1 (out of memory: the segment is let go). */
static int add_region(te_engine *e, const te_region *g)
{
    if (append_regions(e, g, 1) == 0)
        return 0;
    unregister_id(e, g->segment, (void *)g->addr);
    return -1;
}

static int register_one(te_engine *e, void *addr, size_t length, const char *location,
                        int remote_accessible)
{
    Moongate__V1__RegisterResponse *r;
    uintptr_t a = (uintptr_t)addr;
    char name[64], msg[512], not_device[512] = "";
    uint8_t *resp = NULL;
    size_t len = 0;
    int kind, st, busy, remote = remote_accessible;
    if (e == NULL || addr == NULL || length == 0)
        return ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    busy = overlaps(e, a, length);
    pthread_mutex_unlock(&e->mu);
    if (busy) {
        te_log("registerLocalMemory(%p, %zu): overlaps memory registered before", addr, length);
        return ERR_ADDRESS_OVERLAPPED;
    }
    if ((st = device_of(a, length, location, not_device, sizeof(not_device))) == -2) {
        te_log("registerLocalMemory(%p, %zu): %s", addr, length, not_device);
        return ERR_INVALID_ARGUMENT;
    }
    if (st >= 0) {
        int device = st;
        if ((st = register_device(e, a, length, remote_accessible, msg, sizeof(msg))) == 0) {
            TE_LOG_ONCE("registerLocalMemory: device memory is registered by its dma-buf: the "
                        "NIC reads and writes it, and peers reach it over RDMA");
            return 0;
        }
        if (st == MG_GRPC_FAILED_PRECONDITION) { /* no RDMA path: staged by this process */
            te_region g = {
                .addr = a, .len = length, .remote = remote_accessible, .staged = 1, .group = a};
            char why[512];
            snprintf(why, sizeof(why), "%s", msg);
            if ((st = register_staged(e, &g, msg, sizeof(msg))) == MG_GRPC_FAILED_PRECONDITION &&
                g.remote) { /* no TCP data plane for peers: this process's transfers only */
                g.remote = 0;
                st = register_staged(e, &g, msg, sizeof(msg));
            }
            if (st == 0) {
                TE_LOG_ONCE("registerLocalMemory(%p): device memory by its dma-buf: %s; "
                            "registered staged instead: %s, this process's copy thread moving "
                            "it to and from the device",
                            addr, why,
                            g.remote ? "peers reach it over TCP"
                                     : "for this process's transfers only (no TCP data plane "
                                       "for peers on this daemon)");
                return add_region(e, &g);
            }
        }
        te_log("registerLocalMemory(%p, %zu): device memory (CUDA device %d): %s", addr, length,
               device, msg);
        return st == MG_GRPC_ALREADY_EXISTS ? ERR_ADDRESS_OVERLAPPED : -1;
    }
    snprintf(name, sizeof(name), "mooncake-%d-%lx", (int)getpid(), (unsigned long)a);
    st = register_call(e, a, length, remote_accessible, name, &kind, &resp, &len, msg, sizeof(msg));
    if (st == MG_GRPC_FAILED_PRECONDITION && remote_accessible) {
        /* a file that may shrink with RDMA devices on the daemon, or process memory with its
         * data plane off: this process's use only (process memory off fails again, below) */
        char why[512];
        snprintf(why, sizeof(why), "%s", msg);
        st = register_call(e, a, length, 0, name, &kind, &resp, &len, msg, sizeof(msg));
        if (st == 0)
            TE_LOG_ONCE("registerLocalMemory(%p): %s; registered for this process's transfers "
                        "only%s",
                        addr, why,
                        kind ? " (map a memfd sealed with F_SEAL_SHRINK for peers to reach it)"
                             : "");
        remote = 0;
    }
    if (st == MG_GRPC_INVALID_ARGUMENT && not_device[0] != '\0') {
        te_log("registerLocalMemory(%p, %zu): neither memory of this process nor device memory "
               "the CUDA driver knows (freed, another process's, or of a context that is gone): "
               "as host memory, %s; as device memory, %s",
               addr, length, msg, not_device);
        return -1;
    }
    if (st != 0) {
        te_log("registerLocalMemory(%p, %zu): %s", addr, length, msg);
        return st == MG_GRPC_ALREADY_EXISTS ? ERR_ADDRESS_OVERLAPPED : -1;
    }
    if (kind == 0 && remote)
        TE_LOG_ONCE("registerLocalMemory: memory of no shared file is process memory: the daemon "
                    "reaches it with process_vm, and peers read and write it over TCP (never "
                    "RDMA). Memory mapped from a shared file (shm_open, /dev/shm, a memfd) is "
                    "registered by descriptor and RDMA reaches it too.");
    else if (kind == 1)
        TE_LOG_ONCE("registerLocalMemory: memory mapped from a shared file is registered by "
                    "descriptor: peers may read and write it, RDMA reaches it");
    r = moongate__v1__register_response__unpack(NULL, len, resp);
    free(resp);
    pthread_mutex_lock(&e->mu);
    st = -1;
    if (r != NULL && r->segment != NULL) {
        te_region *grown = realloc(e->regions, (e->n_regions + 1) * sizeof(*grown));
        if (grown != NULL) {
            e->regions = grown;
            grown[e->n_regions++] = (te_region){.addr = a,
                                                .len = length,
                                                .segment = r->segment->id,
                                                .remote = remote,
                                                .device = -1,
                                                .group = a};
            st = 0;
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (r != NULL)
        moongate__v1__register_response__free_unpacked(r, NULL);
    return st;
}

int te_register_again(te_engine *e, size_t k, char *msg, size_t msgcap)
{
    Moongate__V1__RegisterResponse *r;
    te_region g;
    char name[64];
    uint8_t *resp = NULL;
    size_t len = 0;
    int kind, st;
    pthread_mutex_lock(&e->mu);
    g = e->regions[k];
    pthread_mutex_unlock(&e->mu);
    if (g.staged) { /* a new copy channel */
        if ((st = register_staged(e, &g, msg, msgcap)) == 0) {
            pthread_mutex_lock(&e->mu);
            e->regions[k].segment = g.segment;
            pthread_mutex_unlock(&e->mu);
        }
        return st;
    }
    if (g.device >= 0) { /* its allocation's dma-buf, exported again */
        mg_vram_piece p;
        char sock[4200];
        uint64_t id = 0;
        snprintf(name, sizeof(name), "mooncake-%d-%lx-%lx", (int)getpid(), (unsigned long)g.group,
                 (unsigned long)g.addr);
        if (mg_fd_socket_of(e->target, sock, sizeof(sock)) != 0 ||
            mg_vram_export(g.addr, g.len, &p, 1, msg, msgcap) != 1)
            return MG_GRPC_FAILED_PRECONDITION;
        st = register_piece(e, sock, &p, name, g.remote, &id, msg, msgcap);
        close(p.fd);
        if (st == 0) {
            pthread_mutex_lock(&e->mu);
            e->regions[k].segment = id;
            pthread_mutex_unlock(&e->mu);
        }
        return st;
    }
    snprintf(name, sizeof(name), "mooncake-%d-%lx", (int)getpid(), (unsigned long)g.addr);
    st = register_call(e, g.addr, g.len, g.remote, name, &kind, &resp, &len, msg, msgcap);
    if (st != 0)
        return st;
    r = moongate__v1__register_response__unpack(NULL, len, resp);
    free(resp);
    if (r == NULL || r->segment == NULL) {
        if (r != NULL)
            moongate__v1__register_response__free_unpacked(r, NULL);
        snprintf(msg, msgcap, "the daemon's RegisterResponse did not decode");
        return MG_GRPC_INTERNAL;
    }
    pthread_mutex_lock(&e->mu);
    e->regions[k].segment = r->segment->id;
    pthread_mutex_unlock(&e->mu);
    moongate__v1__register_response__free_unpacked(r, NULL);
    return 0;
}

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible)
{
    return register_one(engine, addr, length, location, remote_accessible);
}

int unregisterLocalMemory(transfer_engine_t engine, void *addr)
{
    te_engine *e = engine;
    te_region gone[16];
    size_t found = 0, kept = 0;
    if (e == NULL)
        return ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->n_regions && found < 16;) /* device memory: every piece */
        if (e->regions[i].group == (uintptr_t)addr) {
            gone[found++] = e->regions[i];
            e->regions[i] = e->regions[--e->n_regions];
        } else {
            i++;
        }
    pthread_mutex_unlock(&e->mu);
    if (!found) {
        te_log("unregisterLocalMemory(%p): not registered", addr);
        return ERR_ADDRESS_NOT_REGISTERED;
    }
    for (size_t k = 0; k < found; k++) {
        int st = unregister_id(e, gone[k].segment, addr);
        if (st != 0 && st != MG_GRPC_NOT_FOUND) /* held by a transfer: it stays, to retry */
            gone[kept++] = gone[k];
    }
    if (kept && append_regions(e, gone, kept) != 0)
        te_log("unregisterLocalMemory(%p): out of memory keeping what stays registered", addr);
    return kept ? -1 : 0;
}

int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location)
{
    int rc = 0;
    size_t i;
    if (engine == NULL || (buffer_list == NULL && buffer_len > 0))
        return ERR_INVALID_ARGUMENT;
    for (i = 0; i < buffer_len && rc == 0; i++)
        rc = register_one(engine, buffer_list[i].addr, buffer_list[i].length, location, 1);
    if (rc != 0) /* all or nothing, as Mooncake's */
        for (size_t k = 0; k + 1 < i; k++)
            unregisterLocalMemory(engine, buffer_list[k].addr);
    return rc;
}

int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len)
{
    int rc = 0;
    if (engine == NULL || (addr_list == NULL && addr_len > 0))
        return ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < addr_len; i++) {
        int one = unregisterLocalMemory(engine, addr_list[i]);
        if (rc == 0)
            rc = one;
    }
    return rc;
}
