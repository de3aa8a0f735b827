/*
 * mg_seg_kind: the kinds of memory a segment can be, each behind one table (private to the
 * engine), as libevent puts each backend behind its struct eventop.
 *
 * The registry (mg_segment.c) keeps what every segment has whatever its bytes are: its id,
 * names, range, holders, the per-process address index, reservations and their commit or
 * rollback, limits and quotas. Where the bytes are and how they are reached is the kind's: each
 * kind is a file of its own (mg_seg_anon.c, mg_seg_shm.c, mg_seg_fd.c, mg_seg_proc.c,
 * mg_seg_dmabuf.c; the three kinds that map a file share mg_seg_file.c) that fills one
 * mg_seg_kind. The registry picks the table from the spec's source once, when it reserves the
 * segment (mg_seg_kind_of), and from then on calls the segment's table: nothing else asks
 * which kind a segment is. A NULL operation means the kind does not do that; the registry turns
 * it into an error that names the kind (mg_segment_allows, mg_segment_read, ...).
 *
 * Adding a kind: its value in mg_seg_source (moongate/segment.h; the same number as memory.proto's
 * SegmentSource), a file mg_seg_<kind>.c defining its table, and the table's line in
 * mg_seg_kinds[] (mg_segment.c). tests/unit/test_seg_kind.c walks every table.
 */
#ifndef MG_SEG_KIND_H
#define MG_SEG_KIND_H

#include "moongate/segment.h"
#include "moongate/procmem.h"
#include "moongate/rdma.h"

#include "mg_idmap.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define MG_SEG_FILE_PREFIX "moongate-seg-" /* files the daemon creates in shm_dir */
#define MG_SEG_CHUNK       (8ULL << 20)    /* bytes locked, prefaulted or unmapped at a time */

/* What a kind may use of the registry's configuration; fixed once the registry is open. */
typedef struct mg_seg_env {
    char *shm_dir;
    int dirfd; /* shm_dir, opened */
    unsigned file_mode;
    unsigned file_gid;
    mg_rdma *rdma;                  /* NULL: no RDMA devices */
    const char *process_memory_off; /* mg_registry_config's */
    int tcp_targets;
} mg_seg_env;

typedef struct mg_seg_kind mg_seg_kind;

struct mg_segment {
    /* ---- the registry's, under its mutex where it says so (mg_segment.c) ---- */
    mg_registry *reg;
    const mg_seg_env *env;
    const mg_seg_kind *kind; /* chosen at reserve, never changed */
    mg_idmap_node idn;       /* its id, in the registry's id map */
    char tenant[MG_SEG_NAME_MAX + 1];
    char name[MG_SEG_NAME_MAX + 1];
    char request_id[MG_SEG_NAME_MAX + 1];
    char location[16];
    uint64_t size;        /* 0 for a file segment of unknown size until mapped */
    uint64_t offset;      /* where the segment starts in its file (a passed one's) */
    uint64_t client_addr; /* where the registering process has it (0: not known) */
    uint64_t order;       /* the registry's count of segments entered, when it was */
    mg_proc client;
    int in_addrs; /* in the registry's address index */
    int remote_accessible;
    mg_memlock memlock;
    int prefault;
    mg_seg_state state;
    uint32_t refs;
    uint32_t passing; /* of refs, data-plane slices in flight: theirs go once their bytes went */
    mg_seg_transport transports[MG_TRANSPORT_COUNT];
    mg_rdma_mr *mr;                 /* its registration with the RDMA devices */
    int cancel;                     /* set by mg_segment_cancel (any thread), read between chunks */
    char holder[MG_SEG_HOLDER_MAX]; /* who took the latest reference */
    uint32_t caller_uid;            /* who asked (mg_segment_spec.caller_uid) */
    int has_file_id;                /* dev and ino are set and the segment is in by_file */
    dev_t dev;
    ino_t ino;
    void *addr; /* the segment's first byte (a process's or a device's address: never touched) */
    int locked;
    int provisioned; /* not counted in its tenant's bytes (mg_segment_spec.provisioned) */
    char share[MG_SEG_SHARE_LEN + 1]; /* other tenants that may use it, "a,b", or "" */
    char error[MG_SEG_ERROR_MAX];
    struct mg_segment *name_next, *req_next, *file_next; /* hash chains */
    struct mg_segment *prev, *next;                      /* all segments */

    /* ---- the kind's ---- */
    int fd;                         /* the file or dma-buf while it is open; else -1 */
    char file[MG_SEG_NAME_MAX + 1]; /* a file's name inside shm_dir; "" for a passed one */
    int created;                    /* the daemon created the file: it removes it */
    void *map_base;                 /* the mapping: addr rounded down to its page */
    uint64_t map_len;
    uint64_t page;         /* the mapping's page size: the system's, or a hugetlbfs file's */
    mg_procmem *pm;        /* process memory: its process, once mapped */
    struct mg_staged *stg; /* staged GPU memory: its staging buffer (mg_seg_staged.c) */
};

/* A kind of memory. Every operation runs on the thread it names; the segment is the caller's
 * (reserved, or referenced) for the call. */
struct mg_seg_kind {
    mg_seg_source source;
    const char *name;     /* "anon", "shm", ...: logs and listings (mg_seg_source_name) */
    const char *what;     /* what the memory is, as messages name it ("GPU memory (...)") */
    const char *hint;     /* how its bytes move where a path refuses them */
    unsigned caps;        /* MG_SEG_CAP_*: the paths it allows (moongate/segment.h) */
    const char *location; /* its location's kind: "cpu" or "cuda" */
    int location_default; /* a spec without a location is "<location>:0" (else it must name it) */

    /* Loop, before anything is entered: this kind's checks of the spec (the registry has
     * checked names, location, limits and what every kind shares). Returns 0, or an MG_ERR_*
     * with err (MG_SEG_ERROR_MAX bytes) set. Required. */
    int (*check)(const mg_seg_env *env, const mg_segment_spec *spec, char *err);
    /* Loop, under the registry's mutex, once the segment has its id: what the kind keeps of the
     * spec (a file's name). O(1). Optional. */
    void (*enter)(mg_segment *seg, const mg_segment_spec *spec);
    /* Worker: makes the bytes reachable — creates, opens or checks the file and maps it
     * (prefaulted, locked as the segment asks), or opens the process — and sets seg->addr.
     * Returns 0, or an MG_ERR_* with the reason set (mg_seg_error); the registry then calls
     * unmap. Between chunks it stops at a cancel (mg_seg_cancelled). Required. */
    int (*map)(mg_segment *seg);
    /* Worker, after map, with RDMA devices: registers the bytes with every device (seg->mr),
     * remote access as seg->remote_accessible says. Returns 0 or an MG_ERR_* with the reason
     * set. NULL: the kind is never registered (the devices never reach it). */
    int (*rdma)(mg_segment *seg);
    /* Worker (or the registry's teardown): undoes whatever part of map ran, closes what the
     * segment holds open, removes a file the daemon created. Idempotent. Required. */
    void (*unmap)(mg_segment *seg);
    /* Any thread, while referenced: can [off, off + len) (inside the segment: the registry
     * checked) be reached now? Returns 0 or an MG_ERR_* with why set. NULL: nothing to check
     * beyond the bounds. */
    int (*range)(const mg_segment *seg, uint64_t off, uint64_t len, char *why, size_t cap);
    /* Worker: n bytes at off (inside the segment) copied out of or into it. Returns 0 or an
     * MG_ERR_* with why set. NULL: the daemon never touches these bytes. */
    int (*read)(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why, size_t cap);
    int (*write)(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                 size_t cap);
    /* Worker: every write so far is where it belongs, for kinds whose write returns before
     * then (GPU memory its process copies in). Returns 0 or an MG_ERR_* with why set. NULL:
     * write returns once the bytes are there. */
    int (*sync)(const mg_segment *seg, char *why, size_t cap);
    /* Worker, both or neither: kinds that land a WRITE's bytes in buffers of their own, straight
     * from the network (GPU memory staged by its process: the staging slots). land holds a
     * buffer for the caller (waiting for one to be free): its address, its size in *cap and
     * what commit names it by in *ticket; NULL with why (the memory can take no more). commit
     * puts the n bytes landed there at off (n 0: the buffer given back unused), as write does;
     * sync waits for them. Returns 0 or an MG_ERR_* with why set. */
    void *(*land)(const mg_segment *seg, size_t *cap, int *ticket, char *why, size_t whycap);
    int (*commit)(const mg_segment *seg, int ticket, uint64_t off, size_t n, char *why, size_t cap);
    /* Worker, both or neither: a read of [off, off + n) (inside the segment) `token`'s caller
     * will make next, started now if it can be without waiting (a hint: read is called for it
     * all the same, and takes what was fetched); drop lets go of what `token` fetched and did
     * not read. Only ever within one request, so what was fetched is never older than it. */
    void (*prefetch)(const mg_segment *seg, const void *token, uint64_t off, size_t n);
    void (*drop)(const mg_segment *seg, const void *token);
    /* Worker: the CRC32C of len bytes at off where they lie, continuing *crc. NULL: summed
     * from read, in steps. */
    int (*crc32c)(const mg_segment *seg, uint64_t off, uint64_t len, uint32_t *crc, char *why,
                  size_t cap);
    /* Loop, under the registry's mutex: what listings show of the bytes — out->path (a file's
     * path, or "") and out->offset. Required. */
    void (*describe)(const mg_segment *seg, mg_segment_info *out);
};

extern const mg_seg_kind mg_seg_anon, mg_seg_shm, mg_seg_fd, mg_seg_proc, mg_seg_dmabuf,
    mg_seg_staged;

/* The table of a source, or NULL for a value that names none. */
const mg_seg_kind *mg_seg_kind_of(mg_seg_source source);
/* Every kind, in mg_seg_source order: *n of them. */
const mg_seg_kind *const *mg_seg_kinds_all(size_t *n);

/* ---- what the registry offers the kinds (mg_segment.c) ---- */

/* A kind's describe for memory with no file of the daemon's: the offset alone (mg_seg_ops.c). */
void mg_seg_describe_offset(const mg_segment *seg, mg_segment_info *out);

/* Counts a map or unmap job and whether it runs on an engine worker (mg_registry_stats). */
void mg_seg_count_job(mg_segment *seg);

/* Sets the segment's error text (mg_segment_error). */
void mg_seg_error(mg_segment *seg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Non-zero, with the error set, once mg_segment_cancel() asked the segment's map to stop. */
int mg_seg_cancelled(mg_segment *seg);
/* Worker: enters the open file's (st_dev, st_ino) in the registry, so one file stays one
 * tenant's. Returns 0, or MG_ERR_PERMISSION (error set, `what` naming the file) when a segment
 * of another tenant has it, whatever name reached it. */
int mg_seg_claim_file(mg_segment *seg, const struct stat *st, const char *what);
/* Worker: a segment that learnt its size from its file (size 0 in the spec) accounted for it
 * against the limits and quotas. Returns 0, MG_ERR_FULL or MG_ERR_QUOTA (error set). */
int mg_seg_grow(mg_segment *seg, uint64_t size);

/* ---- the rest of the registry's files ---- */

/* mg_seg_spec.c. Loop: the spec's checks, the kind's among them. Returns 0 with *kind (the
 * spec's source's table) and loc (the location, normalised), or an MG_ERR_* with err set. */
int mg_seg_check_spec(const mg_seg_env *env, const mg_segment_spec *spec, const mg_seg_kind **kind,
                      char loc[16], char *err);

/* mg_seg_ops.c. The RDMA registration let go of, then the kind's unmap. */
void mg_seg_teardown(mg_segment *seg);

/* mg_seg_addrs.c: the segments registered with their process's address, sorted by (pid,
 * start time, address). Under the registry's mutex. */
typedef struct mg_seg_addrs {
    mg_segment **a;
    size_t n, cap;
} mg_seg_addrs;
/* Enters seg (its client address set), unless it overlaps a range of the same process.
 * Returns 0, MG_ERR_EXISTS or MG_ERR_NOMEM, with err set. */
int mg_seg_addrs_insert(mg_seg_addrs *x, mg_segment *seg, char *err);
void mg_seg_addrs_remove(mg_seg_addrs *x, mg_segment *seg);
/* As mg_registry_resolve and mg_registry_regions (moongate/segment.h). */
int mg_seg_addrs_resolve(const mg_seg_addrs *x, const char *tenant, const mg_proc *proc,
                         uint64_t addr, uint64_t len, uint64_t *id, uint64_t *offset, char *err);
size_t mg_seg_addrs_regions(const mg_seg_addrs *x, const char *tenant, const mg_proc *proc,
                            uint64_t after, mg_region *out, size_t max);

/* ---- a file mapped shared: the part anon, shm and fd share (mg_seg_file.c) ---- */

/* "moongate-seg-1 in /dev/shm/moongate", or "the passed file", for messages. */
const char *mg_seg_file_what(const mg_segment *seg, char *buf, size_t cap);
/* Worker: allocates the file's blocks for [offset, offset + size) now (a full tmpfs fails
 * here, not with SIGBUS later). Returns 0, MG_ERR_NOMEM or MG_ERR_SYSTEM (error set). */
int mg_seg_file_blocks(mg_segment *seg);
/* Worker: maps the open file seg->fd from seg->offset (seg->page set), closes the descriptor,
 * prefaults and locks as the segment asks. Returns 0 or an MG_ERR_* (error set). */
int mg_seg_file_mmap(mg_segment *seg);
int mg_seg_file_rdma(mg_segment *seg);
void mg_seg_file_unmap(mg_segment *seg);
int mg_seg_file_range(const mg_segment *seg, uint64_t off, uint64_t len, char *why, size_t cap);
int mg_seg_file_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                     size_t cap);
int mg_seg_file_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                      size_t cap);
int mg_seg_file_crc32c(const mg_segment *seg, uint64_t off, uint64_t len, uint32_t *crc, char *why,
                       size_t cap);
void mg_seg_file_describe(const mg_segment *seg, mg_segment_info *out);

/* The operations every file kind (anon, shm, fd) shares, as designated initializers of its
 * table: each kind adds its own check, enter and map. */
#define MG_SEG_FILE_OPS                                                                 \
    .rdma = mg_seg_file_rdma, .unmap = mg_seg_file_unmap, .range = mg_seg_file_range,   \
    .read = mg_seg_file_read, .write = mg_seg_file_write, .crc32c = mg_seg_file_crc32c, \
    .describe = mg_seg_file_describe

#endif
