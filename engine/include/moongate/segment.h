/*
 * moongate segments: registered memory regions and their registry.
 *
 * A segment is a range of a file, mapped shared by the daemon so that local clients can map the
 * same bytes: `anon` segments are files the daemon creates in its shm directory (and removes),
 * `shm` segments are files a local client made there, and `fd` segments are a range of a file a
 * client passed as a descriptor (a memfd, a tmpfs or hugetlbfs file, any regular file it could
 * open for reading and writing). `process` segments are memory a local client allocated itself
 * (malloc'd, CPU tensors) with no file to pass: the daemon maps nothing and reaches the bytes
 * in the client process with process_vm_readv/writev (moongate/procmem.h), on the copy and TCP
 * paths only — never RDMA, never a peer's target. Each has an opaque 64-bit id, a name unique
 * per tenant, an owner tenant, a size, a location ("cpu:N"), a remote-accessible flag, a state
 * and a reference count (leases and transfers in flight hold references; a segment in use cannot
 * be unregistered).
 *
 * Threads. The registry is shared and guarded by one mutex held only for O(1) work (hash
 * lookups and list links). The blocking part of a registration — creating or opening the file,
 * sizing, mapping, locking and prefaulting — is mg_segment_map(), which only engine workers call;
 * the loop thread calls the rest:
 *
 *   loop:    mg_registry_reserve()  checks the spec and the limits, enters the segment as
 *                                   REGISTERING (its name is taken, nothing is mapped yet)
 *   worker:  mg_segment_map()       does the slow work; on failure says why in the segment
 *   loop:    mg_registry_commit()   READY, or the reservation is undone and nothing is left
 *
 *   loop:    mg_registry_unregister() READY and unreferenced -> UNREGISTERING (others: errors)
 *   worker:  mg_segment_unmap()     munmap, and unlink a file the daemon created
 *   loop:    mg_registry_release()  the segment is gone
 */
#ifndef MOONGATE_SEGMENT_H
#define MOONGATE_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_registry mg_registry;
typedef struct mg_segment mg_segment;

/* The kinds of memory a segment can be (the same numbers as memory.proto's SegmentSource). Each
 * is a file of the engine's of its own (engine/src/mg_seg_<kind>.c); what one allows is
 * mg_seg_source_caps(). MG_SEG_DMABUF: GPU memory, a dma-buf the client exported (its device's
 * "cuda:N" location): registered with the RDMA devices by its client address (the iova), never
 * mapped, read or written here — every path but RDMA refuses it (mg_segment_gpu).
 * MG_SEG_STAGED: GPU memory its own process copies to and from the device, ordered over a copy
 * channel (moongate/stagewire.h): a peer's target over TCP where no RDMA path reaches it. */
typedef enum {
    MG_SEG_ANON = 0,
    MG_SEG_SHM = 1,
    MG_SEG_FD = 2,
    MG_SEG_PROCESS = 3,
    MG_SEG_DMABUF = 4,
    MG_SEG_STAGED = 5
} mg_seg_source;
typedef enum { MG_MEMLOCK_OFF = 0, MG_MEMLOCK_TRY = 1, MG_MEMLOCK_REQUIRE = 2 } mg_memlock;
typedef enum { MG_SEG_REGISTERING = 0, MG_SEG_READY = 1, MG_SEG_UNREGISTERING = 2 } mg_seg_state;

#define MG_SEG_NAME_MAX   128 /* bytes of a segment name, tenant or shm file name */
#define MG_SEG_SHARE_MAX  4   /* tenants a segment is shared with, besides its owner */
#define MG_SEG_SHARE_LEN  255 /* bytes of their comma-separated list */
#define MG_SEG_ERROR_MAX  512
#define MG_SEG_HOLDER_MAX 160 /* bytes of a holder's description */

/* A local process as the kernel named it when it connected: its pid, and its start time (clock
 * ticks after boot, /proc/PID/stat) so that a pid the system gives to another process later is
 * not the same process. pid 0: none. */
typedef struct mg_proc {
    int32_t pid;
    uint64_t start;
} mg_proc;

typedef struct mg_registry_config {
    const char *shm_dir;           /* where segment files live; must exist */
    unsigned file_mode;            /* mode of files the daemon creates, e.g. 0600 */
    uint64_t max_segments;         /* in the whole registry */
    uint64_t max_registered_bytes; /* sum of segment sizes */
    uint64_t max_segment_bytes;    /* largest single segment; 0: no limit of its own */
    uint64_t max_tenant_segments;  /* segments of one tenant; 0: only max_segments */
    uint64_t max_tenant_bytes;     /* bytes registered by one tenant; 0: no quota */
    unsigned file_gid;             /* group of files the daemon creates; 0: the daemon's */
    /* RDMA devices (moongate/rdma.h) every segment is registered with once mapped, on the
     * worker that maps it; NULL: none. Segments are deregistered before they are unmapped. */
    struct mg_rdma *rdma;
    /* Process memory (MG_SEG_PROCESS) refused at registration, and why (an operator's setting
     * to name); NULL: allowed. */
    const char *process_memory_off;
    /* A TCP data plane serves peers here: process memory may be remote-accessible (it has no
     * RDMA path). */
    int tcp_targets;
} mg_registry_config;

typedef struct mg_segment_spec {
    const char *tenant; /* owner; [A-Za-z0-9._:-], 1..128 bytes */
    const char *name;   /* unique per tenant; same alphabet */
    mg_seg_source source;
    uint64_t size;        /* anon: bytes (> 0). shm: 0 = the whole file, else at most its size */
    const char *shm_file; /* shm: a file name inside shm_dir (no '/', not "." or "..") */
    /* fd: a descriptor of the file, which the registry takes: from mg_registry_reserve() on it
     * is the registry's to close, whatever that returns. The worker checks it: a regular file
     * (memfd, tmpfs, hugetlbfs, any filesystem that maps), opened for reading and writing, not
     * O_PATH, [offset, offset + size) inside it (size 0: to its end), hugetlbfs offsets and
     * sizes whole huge pages, and, for a remote-accessible segment of a daemon with RDMA
     * devices, sealed with F_SEAL_SHRINK. offset need not be page-aligned. */
    int fd;
    uint64_t offset;
    /* Optional: where the region starts in the registering process's memory (its mapping of
     * the file), so that process may name its bytes by address (mg_registry_resolve). Needs
     * `client` and a size; ranges one process registered may not overlap (MG_ERR_EXISTS).
     * process: required; the bytes themselves, in process `client`. */
    uint64_t client_addr;
    mg_proc client;
    /* shm: the caller's user id, as the kernel reported it for its Unix-socket connection. A
     * file is registered by name only for its owner: caller_uid_known must be set, the file
     * must belong to caller_uid and its mode must let the owner read and write it.
     * process: the memory's process (`client`) must run as caller_uid. */
    int caller_uid_known;
    uint32_t caller_uid;
    const char *location; /* "cpu:N" with N < 4096; NULL or "" means "cpu:0". dmabuf: "cuda:N" */
    int remote_accessible;
    mg_memlock memlock;
    int prefault;
    const char *request_id; /* optional client request id, unique per tenant; NULL or "" */
    int provisioned;        /* the operator's memory (a buffer pool): outside max_tenant_bytes */
    /* Optional: other tenants that may read and write the segment's bytes (as local memory, a
     * transfer's target, inline, or from peers' sessions of theirs) — never unregister, get or
     * list it. Comma-separated, at most MG_SEG_SHARE_MAX names, MG_SEG_SHARE_LEN bytes. */
    const char *share;
} mg_segment_spec;

/* The data paths peers can reach a segment over. Each has its own registration record: TCP
 * needs none beyond the mapping; RDMA will hold the memory region's keys. */
typedef enum { MG_TRANSPORT_TCP = 0, MG_TRANSPORT_RDMA = 1, MG_TRANSPORT_COUNT = 2 } mg_transport;
extern const char *const mg_transport_names[MG_TRANSPORT_COUNT]; /* "tcp", "rdma" */

typedef struct mg_seg_transport {
    int registered;      /* peers can reach the segment over this transport */
    uint32_t lkey, rkey; /* RDMA: the memory region's keys (of the first device) */
    uint64_t addr;       /* RDMA: where the registered bytes start */
} mg_seg_transport;

/* The key of a mapped segment's registration with RDMA device `dev`, for local RDMA
 * operations; -1 when it is not registered. Constant while the segment is referenced. */
int mg_segment_rdma_lkey(const mg_segment *seg, int dev, uint32_t *lkey);

typedef struct mg_segment_info {
    uint64_t id;
    char tenant[MG_SEG_NAME_MAX + 1];
    char name[MG_SEG_NAME_MAX + 1];
    char location[16];
    char path[4096 + 1]; /* "" for an fd segment: the client has the file */
    mg_seg_source source;
    uint64_t offset;      /* fd: where the segment starts in the file */
    uint64_t client_addr; /* where the registering process has it, or 0 */
    int32_t client_pid;
    uint64_t size;
    int remote_accessible;
    int locked; /* pages are locked in memory */
    mg_seg_state state;
    uint32_t refs;                    /* holders besides the registry (leases, transfers) */
    char share[MG_SEG_SHARE_LEN + 1]; /* tenants it is shared with, comma-separated, or "" */
    mg_seg_transport transports[MG_TRANSPORT_COUNT];
    uint32_t rdma_rkeys[MG_RDMA_MAX_DEVICES]; /* a ready remote-accessible segment's key on each
                                               * RDMA device */
    unsigned rdma_ndev;
} mg_segment_info;

/* What a kind of memory allows: the paths its bytes take and how it is registered. A path a
 * segment's kind lacks refuses it by name (mg_segment_allows). */
#define MG_SEG_CAP_TCP  0x01u /* moves over the TCP data plane (this process reaches it) */
#define MG_SEG_CAP_RDMA 0x02u /* moves over RDMA (registered with the devices) */
#define MG_SEG_CAP_COPY 0x04u /* copied on this daemon (peer ""), as a request's local side */
#define MG_SEG_CAP_TARGET                                                                   \
    0x08u                       /* a target: of copies, and of peers and other tenants when \
                                 * remote-accessible or shared */
#define MG_SEG_CAP_INLINE 0x10u /* read and written inline (ReadSegment, WriteSegment) */
#define MG_SEG_CAP_FD     0x20u /* registered from a passed descriptor (fd, offset) */
#define MG_SEG_CAP_CONN   0x40u /* lives no longer than the connection that registered it */
#define MG_SEG_CAP_CALLER                                                 \
    0x80u /* the caller's own memory, by address: its process runs as the \
           * socket's uid */
#define MG_SEG_CAP_MAPPED                                                                  \
    0x100u /* mapped into this process (mg_segment_addr points at the bytes): the TCP data \
            * plane moves them in place; else through the kind's read and write */

/* The kind's name ("anon", "shm", "fd", "process", "dmabuf"), or NULL for a value that names
 * none. */
const char *mg_seg_source_name(mg_seg_source source);
/* The kind's MG_SEG_CAP_* bits; 0 for a value that names none. */
unsigned mg_seg_source_caps(mg_seg_source source);

/* Opens the registry on cfg->shm_dir and removes the segment files an earlier daemon created
 * there (they are served no more). Returns 0, MG_ERR_INVALID (bad config; why is logged),
 * MG_ERR_SYSTEM (shm_dir unusable) or MG_ERR_NOMEM. */
int mg_registry_new(mg_registry **out, const mg_registry_config *cfg);
/* Unmaps every segment and removes the files the daemon created. Accepts NULL. Call only when
 * no worker runs registry work. */
void mg_registry_del(mg_registry *reg);

#define MG_SEG_RETRY 1 /* mg_registry_reserve: a retry of a registered request */

/* Loop. Checks spec and limits and enters the segment as REGISTERING. Returns 0 and the
 * segment; MG_SEG_RETRY and the READY segment an earlier request with the same request id
 * registered (nothing new is entered); or: MG_ERR_INVALID (bad name, tenant, size, location,
 * shm file name, descriptor, request id, or a request id used for another name), MG_ERR_UNAVAILABLE
 * (the request id's first registration is still running), MG_ERR_EXISTS (the tenant has a segment
 * of that name), MG_ERR_QUOTA (max_tenant_bytes, max_tenant_segments), MG_ERR_FULL (max_segments,
 * max_registered_bytes or max_segment_bytes; err says which). err (MG_SEG_ERROR_MAX bytes) says
 * what was wrong. */
int mg_registry_reserve(mg_registry *reg, const mg_segment_spec *spec, mg_segment **out, char *err);
/* Worker. Creates (anon), opens (shm) or checks (fd) the file, sizes, maps, locks and prefaults
 * it, then registers a remote-accessible segment with the transports (TCP: a record, nothing
 * more).
 * Returns 0 or an MG_ERR_*; on error the segment's error text says why and nothing stays
 * mapped or created. */
int mg_segment_map(mg_segment *seg);
/* Any thread. Asks mg_segment_map() of this segment to stop: before it starts or between two
 * chunks of locking or prefaulting, it undoes its work and fails with MG_ERR_CANCELLED. */
void mg_segment_cancel(mg_segment *seg);
/* Loop. With result 0: READY. Otherwise the reservation is undone and the segment freed. */
void mg_registry_commit(mg_registry *reg, mg_segment *seg, int result);
/* The text of the last mg_segment_map() failure ("" when none). */
const char *mg_segment_error(const mg_segment *seg);

/* Loop. Finds a READY segment by id that `tenant` owns or that is shared with it (any other is
 * NOT_FOUND) and takes a reference for `holder`, a description an unregister refused meanwhile
 * names ("ReadSegment by uid:1000 pid:42"). Returns 0, MG_ERR_NOT_FOUND. */
int mg_registry_acquire(mg_registry *reg, const char *tenant, uint64_t id, const char *holder,
                        mg_segment **out);
/* Any thread. mg_registry_acquire for a data-plane slice in flight: a reference that goes as soon
 * as the slice's bytes went. An unregister does not refuse it but waits for it (drain). */
int mg_registry_acquire_passing(mg_registry *reg, const char *tenant, uint64_t id,
                                mg_segment **out);
/* n more references on a segment the caller already holds one on (same holder). */
void mg_registry_hold(mg_registry *reg, mg_segment *seg, uint32_t n);
/* Drops a reference taken by mg_registry_acquire() or mg_registry_hold(). */
void mg_registry_put(mg_registry *reg, mg_segment *seg);
/* Drops a reference taken by mg_registry_acquire_passing(). */
void mg_registry_put_passing(mg_registry *reg, mg_segment *seg);
/* Worker. Waits until an UNREGISTERING segment's last reference (a slice passing) went. Bounded:
 * a slice stalled past the data plane's io timeout, or staged GPU memory whose process does not
 * answer (STAGE_ANSWER_MS), fails, and its connection lets go of its hold. */
void mg_registry_drain(mg_registry *reg, mg_segment *seg);

/* Loop. Starts unregistering a READY segment of `tenant` (NULL: of any tenant, for admins). Returns
 * 0 (now UNREGISTERING: unmap it on a worker, then release it), MG_ERR_NOT_FOUND (unknown, another
 * tenant's, or already going), MG_ERR_BUSY (references held; err names how many). Data-plane slices
 * passing do not refuse it: the unmapping waits for them (mg_registry_drain), so a peer told a
 * transfer is done can unregister at once though the slice's sender has not let go yet. */
int mg_registry_unregister(mg_registry *reg, const char *tenant, uint64_t id, mg_segment **out,
                           char *err);
/* Loop. Undoes mg_registry_unregister() when the unmapping cannot be started: READY again. */
void mg_registry_restore(mg_registry *reg, mg_segment *seg);
/* Worker. Unmaps and removes a file the daemon created. */
void mg_segment_unmap(mg_segment *seg);
/* Loop. Forgets an unmapped segment and frees it. */
void mg_registry_release(mg_registry *reg, mg_segment *seg);

/* ---- the protocol above as two asynchronous calls, for the loop ---- */

struct mg_engine;
struct mg_cq;

/* A registration's end, on the loop: result 0 and the segment, READY; or an MG_ERR_* with
 * the reservation undone (seg NULL) and why it failed ("" when it was cancelled). */
typedef void (*mg_register_done_fn)(void *arg, mg_segment *seg, int result, const char *why);
/* A test hook the registry's worker jobs pass: before (after_map 0) and after (1) a mapping,
 * and before a copy into a segment (0). It may make the worker wait. */
typedef void (*mg_register_gate_fn)(void *arg, int after_map);
/* Installs (or, with NULL, removes) the gate. Only while no worker runs registry jobs. */
void mg_registry_set_gate(mg_registry *reg, mg_register_gate_fn gate, void *arg);
/* Worker: passes the gate, if one is installed. */
void mg_registry_gate(mg_registry *reg, int after_map);
/* An unregistration's end, on the loop: the segment is unmapped and gone; info is what it was. */
typedef void (*mg_unregister_done_fn)(void *arg, const mg_segment_info *info);

/* Loop. Maps the segment mg_registry_reserve() entered on a worker of `engine` and commits it on
 * the loop that drains `cq`, then calls done once. Returns 0, or an MG_ERR_* (the engine's queue
 * is full, no memory) with the reservation undone and done not called. */
int mg_registry_register_async(mg_registry *reg, struct mg_engine *engine, struct mg_cq *cq,
                               mg_segment *seg, mg_register_done_fn done, void *arg);
/* Loop. Unmaps a segment mg_registry_unregister() marked UNREGISTERING on a worker, releases it
 * on the loop and calls done (may be NULL) once. Returns 0, or an MG_ERR_* with the segment
 * restored (READY, still registered) and done not called. */
int mg_registry_unregister_async(mg_registry *reg, struct mg_engine *engine, struct mg_cq *cq,
                                 mg_segment *seg, mg_unregister_done_fn done, void *arg);

/* Loop. A snapshot of the tenant's (NULL: any tenant's) segment `id` in any state. Returns 0,
 * MG_ERR_NOT_FOUND. */
int mg_registry_find(mg_registry *reg, const char *tenant, uint64_t id, mg_segment_info *out);
/* The same for a segment `tenant` owns or that is shared with it: what a peer may target. */
int mg_registry_find_target(mg_registry *reg, const char *tenant, uint64_t id,
                            mg_segment_info *out);
/* Snapshot of one segment. */
void mg_segment_get_info(mg_registry *reg, const mg_segment *seg, mg_segment_info *out);
/* The mapped bytes (NULL before mapping); stable while the caller holds a reference. For a
 * process segment: the client's address, never to be dereferenced here (see
 * mg_segment_procmem). */
void *mg_segment_addr(const mg_segment *seg);
struct mg_procmem;
/* 1 for GPU memory (MG_SEG_DMABUF): bytes only RDMA reaches, never this process. */
int mg_segment_gpu(const mg_segment *seg);
/* A process segment's process (moongate/procmem.h); NULL for every other source. */
struct mg_procmem *mg_segment_procmem(const mg_segment *seg);
/* Worker. The CRC32C of len bytes at addr of seg (a process segment's are read from its
 * process, in steps), continuing *crc. Returns 0, MG_ERR_DATA_LOSS (the mapping's file was cut
 * under it), or as mg_procmem_read (why set); MG_ERR_STATE for GPU memory. */
int mg_segment_crc32c(const mg_segment *seg, const uint8_t *addr, uint64_t len, uint32_t *crc,
                      char *why, size_t cap);
/* Its kind's MG_SEG_CAP_* bits. */
unsigned mg_segment_caps(const mg_segment *seg);
/* 0 when the segment's kind allows every path in `caps` (MG_SEG_CAP_*), else MG_ERR_STATE with
 * why saying what the memory is, what it is not, and how its bytes move instead. */
int mg_segment_allows(const mg_segment *seg, unsigned caps, char *why, size_t cap);
/* Any thread, while referenced: whether [off, off + len) of the segment can be reached now.
 * Returns 0, MG_ERR_RANGE (outside it), MG_ERR_DATA_LOSS (a mapped file cut under it), or as
 * mg_procmem_probe for a process's memory; why says which. */
int mg_segment_check_range(const mg_segment *seg, uint64_t off, uint64_t len, char *why,
                           size_t cap);
/* Worker: n bytes at off copied out of (read) or into (write) the segment, guarded (a mapped
 * file) or with process_vm (a process's memory). Returns 0, MG_ERR_RANGE, MG_ERR_DATA_LOSS, as
 * mg_procmem_read/write, or MG_ERR_STATE for memory this process never touches (GPU memory);
 * why says which. */
int mg_segment_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                    size_t cap);
int mg_segment_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                     size_t cap);
/* Worker: every mg_segment_write so far has landed where the segment's bytes are (a kind may
 * return from a write before: GPU memory its own process copies in). 0 or an MG_ERR_* with why
 * set. */
int mg_segment_sync(const mg_segment *seg, char *why, size_t cap);
/* Bytes copied out of (read) and ordered into (written) GPU memory staged by its own process,
 * every such segment's, since start (the metrics' moongate_staged_bytes_total). */
void mg_segment_staged_bytes(uint64_t *read, uint64_t *written);
/* Worker: 1 when the segment's kind lands a WRITE's bytes in buffers of its own (the staging
 * slots of GPU memory staged by its process): mg_segment_land holds one for the caller (its
 * address; *cap its size; NULL with why when the memory can take no more), the caller receives
 * the bytes into it and mg_segment_commit puts n of them at off (n 0: the buffer given back;
 * bounds checked), as mg_segment_write does (mg_segment_sync waits for them). */
int mg_segment_lands(const mg_segment *seg);
/* Worker: a hint that `token`'s caller will mg_segment_read [off, off + n) next, so a kind slow
 * to reach (GPU memory staged by its process) starts fetching it; mg_segment_prefetch_drop lets
 * go of whatever `token` fetched and did not read, once its request is over. Nothing for kinds
 * without it. */
void mg_segment_prefetch(const mg_segment *seg, const void *token, uint64_t off, size_t n);
void mg_segment_prefetch_drop(const mg_segment *seg, const void *token);
void *mg_segment_land(const mg_segment *seg, size_t *cap, int *ticket, char *why, size_t whycap);
int mg_segment_commit(const mg_segment *seg, int ticket, uint64_t off, size_t n, char *why,
                      size_t cap);
/* Its size in bytes (fixed once registered; no lock needed while referenced). */
uint64_t mg_segment_size(const mg_segment *seg);

/* Loop. The READY segment of `tenant` that process `proc` registered at an address range holding
 * [addr, addr + len): returns 0 with *id and *offset (of addr in the segment), or with err
 * (MG_SEG_ERROR_MAX bytes) set: MG_ERR_NOT_FOUND (no range of the process holds addr) or
 * MG_ERR_RANGE (the range runs past the end of the region that holds addr; err names it and
 * the region after, if the range crosses into one). */
int mg_registry_resolve(mg_registry *reg, const char *tenant, const mg_proc *proc, uint64_t addr,
                        uint64_t len, uint64_t *id, uint64_t *offset, char *err);
/* A region a process registered with its address: what its agent shows peers. */
typedef struct mg_region {
    uint64_t id;
    uint64_t address; /* in the process */
    uint64_t size;
    int remote_accessible;
    uint64_t order; /* when it was registered on this daemon: the smaller, the earlier */
} mg_region;
/* Loop. The READY segments of `tenant` process `proc` registered with an address above
 * `after`, in address order, at most max. Returns how many were written. */
size_t mg_registry_regions(mg_registry *reg, const char *tenant, const mg_proc *proc,
                           uint64_t after, mg_region *out, size_t max);
/* Where process `proc` has the segment, if it registered it with its address; else 0. Fixed
 * once registered. */
uint64_t mg_segment_client_addr(const mg_segment *seg, const mg_proc *proc);

/* Lists the tenant's segments (all tenants when tenant is NULL) whose id is greater than
 * `after`, in id order, at most `max`. Returns how many were written. */
size_t mg_registry_list(mg_registry *reg, const char *tenant, uint64_t after, mg_segment_info *out,
                        size_t max);

typedef struct mg_registry_stats {
    uint64_t segments; /* READY */
    uint64_t registering;
    uint64_t bytes; /* sum of sizes of segments entered (any state) */
    uint64_t locked_bytes;
    uint64_t jobs;            /* mg_segment_map and mg_segment_unmap calls */
    uint64_t jobs_off_worker; /* of those, calls not on an engine worker (the daemon: none) */
} mg_registry_stats;
void mg_registry_get_stats(mg_registry *reg, mg_registry_stats *out);

/* Checks that [offset, offset + length) lies inside a region of `size` bytes, without
 * overflow. Returns 0 or MG_ERR_RANGE. */
int mg_bounds_check(uint64_t size, uint64_t offset, uint64_t length);

#ifdef __cplusplus
}
#endif

#endif
