/*
 * mg_seg_file: a file mapped shared — what the three kinds that map one (anon, shm, fd) share
 * once their file is open: the mapping, faulting in and locking, the registration with the
 * RDMA devices by address, the unmapping, and the daemon's own guarded access to the bytes.
 *
 * Faulting in, locking and unmapping go in chunks (MG_SEG_CHUNK): each holds the process's mmap
 * lock, which the loop thread's own page faults wait for. Clients map the same file and may
 * shrink it: every access of the daemon's CPU is guarded (moongate/fault.h) and a page past
 * the file's new end is MG_ERR_DATA_LOSS, never a SIGBUS.
 */
#include "mg_seg_kind.h"

#include "moongate/fault.h"

#include "mg_log.h"
#include "mg_str.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

const char *mg_seg_file_what(const mg_segment *seg, char *buf, size_t cap)
{
    if (seg->file[0] == '\0')
        return "the passed file";
    snprintf(buf, cap, "%s in %s", seg->file, seg->env->shm_dir);
    return buf;
}

/* A tmpfs (or a pod's memory-backed emptyDir) that is full would otherwise accept the size and
 * fail only when a page is first touched — with SIGBUS, in whichever process touches it.
 * Filesystems without fallocate are left as they are. */
int mg_seg_file_blocks(mg_segment *seg)
{
    char what[MG_SEG_NAME_MAX + 4096];
    int e;
    if (fallocate(seg->fd, 0, (off_t)seg->offset, (off_t)seg->size) == 0 || errno == EOPNOTSUPP)
        return 0;
    e = errno;
    mg_seg_error(seg, "cannot reserve %llu bytes for %s: %s", (unsigned long long)seg->size,
                 mg_seg_file_what(seg, what, sizeof(what)), strerror(e));
    return e == ENOSPC || e == EFBIG ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
}

static int lock_pages(mg_segment *seg)
{
    struct rlimit rl;
    int e;
    if (seg->memlock == MG_MEMLOCK_OFF)
        return 0;
    /* In chunks: mlock holds the process's mmap lock while it faults pages in, and the loop
     * thread's own page faults and mappings wait for that lock. */
    e = 0;
    for (uint64_t off = 0; off < seg->size; off += MG_SEG_CHUNK) {
        uint64_t n = seg->size - off < MG_SEG_CHUNK ? seg->size - off : MG_SEG_CHUNK;
        if (mg_seg_cancelled(seg)) {
            munlock(seg->addr, off);
            return MG_ERR_CANCELLED;
        }
        if (mlock((char *)seg->addr + off, n) != 0) {
            e = errno;
            munlock(seg->addr, off);
            break;
        }
    }
    if (e == 0) {
        seg->locked = 1;
        return 0;
    }
    if (seg->memlock == MG_MEMLOCK_TRY) {
        mg_warn("segment_mlock", "id=%llu bytes=%llu error=\"%s\" policy=try",
                (unsigned long long)seg->idn.id, (unsigned long long)seg->size, strerror(e));
        return 0;
    }
    getrlimit(RLIMIT_MEMLOCK, &rl);
    if (rl.rlim_cur == RLIM_INFINITY)
        mg_seg_error(seg, "cannot lock %llu bytes in memory: %s", (unsigned long long)seg->size,
                     strerror(e));
    else
        mg_seg_error(seg,
                     "cannot lock %llu bytes in memory: %s (RLIMIT_MEMLOCK is %llu bytes; raise "
                     "it, e.g. ulimit -l, or use memlock try/off)",
                     (unsigned long long)seg->size, strerror(e), (unsigned long long)rl.rlim_cur);
    return e == EPERM ? MG_ERR_PERMISSION : MG_ERR_NOMEM;
}

typedef struct {
    const char *p;
    uint64_t len, page;
} touch_op;

static int touch_pages(void *arg)
{
    touch_op *t = arg;
    for (uint64_t off = 0; off < t->len; off += t->page)
        (void)*(volatile const char *)(t->p + off);
    return 0;
}

/* Returns 0, MG_ERR_CANCELLED or MG_ERR_DATA_LOSS (the file is shorter than the mapping: a
 * client shrank it). */
static int prefault(mg_segment *seg)
{
    long page = sysconf(_SC_PAGESIZE);
#ifdef MADV_POPULATE_WRITE
    {
        /* In chunks, for the same reason as lock_pages. */
        uint64_t off = 0;
        for (; off < seg->size; off += MG_SEG_CHUNK) {
            uint64_t n = seg->size - off < MG_SEG_CHUNK ? seg->size - off : MG_SEG_CHUNK;
            if (mg_seg_cancelled(seg))
                return MG_ERR_CANCELLED;
            if (madvise((char *)seg->addr + off, n, MADV_POPULATE_WRITE) != 0)
                break;
        }
        if (off >= seg->size)
            return 0;
    }
#endif
    /* Older kernels (or a file shorter than the mapping): read every page, a chunk at a time,
     * guarded; writes would race with a client's own. */
    for (uint64_t off = 0; off < seg->size; off += MG_SEG_CHUNK) {
        touch_op t = {(const char *)seg->addr + off,
                      seg->size - off < MG_SEG_CHUNK ? seg->size - off : MG_SEG_CHUNK,
                      (uint64_t)page};
        if (mg_seg_cancelled(seg))
            return MG_ERR_CANCELLED;
        if (mg_fault_guard(touch_pages, &t) != 0) {
            mg_seg_error(seg,
                         "the file is shorter than the segment's %llu bytes (truncated under it)",
                         (unsigned long long)seg->size);
            return MG_ERR_DATA_LOSS;
        }
    }
    return 0;
}

int mg_seg_file_mmap(mg_segment *seg)
{
    /* From the page the segment starts in: a passed file's offset need not be aligned. */
    uint64_t skip = seg->offset % seg->page;
    void *base;
    int rc;
    seg->map_len = seg->size + skip;
    base = mmap(NULL, seg->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd,
                (off_t)(seg->offset - skip));
    if (base == MAP_FAILED) {
        int e = errno;
        mg_seg_error(seg, "cannot map %llu bytes: %s", (unsigned long long)seg->size, strerror(e));
        return e == ENOMEM ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
    }
    seg->map_base = base;
    seg->addr = (char *)base + skip;
    /* The mapping keeps the file; a descriptor per segment would make the open-files limit,
     * not --max-segments, the bound on registrations. */
    close(seg->fd);
    seg->fd = -1;
    /* Fault the pages in first, then lock them: populating takes the mmap lock for reading,
     * so registrations on several workers proceed in parallel, while mlock takes it for
     * writing and would fault every page in under it, one registration at a time. */
    if ((seg->prefault || seg->memlock != MG_MEMLOCK_OFF) && (rc = prefault(seg)) != 0)
        return rc;
    return lock_pages(seg);
}

/* Pins the mapped pages on every device; remote access only if asked. */
int mg_seg_file_rdma(mg_segment *seg)
{
    char why[256];
    int rc = mg_rdma_reg(seg->env->rdma, seg->addr, seg->size, seg->remote_accessible, &seg->mr,
                         why, sizeof(why));
    if (rc != 0)
        mg_seg_error(seg, "RDMA registration: %s", why);
    return rc;
}

void mg_seg_file_unmap(mg_segment *seg)
{
    if (seg->map_base) {
        /* In chunks, so the mmap lock is released between them (see lock_pages); whole huge
         * pages of a hugetlbfs file. */
        uint64_t step = seg->page > MG_SEG_CHUNK ? seg->page : MG_SEG_CHUNK;
        for (uint64_t off = 0; off < seg->map_len; off += step)
            munmap((char *)seg->map_base + off,
                   seg->map_len - off < step ? seg->map_len - off : step);
        seg->map_base = NULL;
        seg->addr = NULL;
    }
    if (seg->fd >= 0) {
        close(seg->fd);
        seg->fd = -1;
    }
    if (seg->created) {
        unlinkat(seg->env->dirfd, seg->file, 0);
        seg->created = 0;
    }
}

/* A file is cut from its end: one guarded load of the range's last byte tells. */
int mg_seg_file_range(const mg_segment *seg, uint64_t off, uint64_t len, char *why, size_t cap)
{
    if (mg_fault_probe((const char *)seg->addr + off, len) == 0)
        return 0;
    snprintf(why, cap, "the segment's file is shorter than registered (cut under it)");
    return MG_ERR_DATA_LOSS;
}

int mg_seg_file_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why,
                     size_t cap)
{
    if (mg_guarded_copy(dst, (const char *)seg->addr + off, n) == 0)
        return 0;
    snprintf(why, cap, "the segment's file is shorter than registered (cut under it)");
    return MG_ERR_DATA_LOSS;
}

int mg_seg_file_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                      size_t cap)
{
    if (mg_guarded_copy((char *)seg->addr + off, src, n) == 0)
        return 0;
    snprintf(why, cap, "the segment's file is shorter than registered (cut under it)");
    return MG_ERR_DATA_LOSS;
}

int mg_seg_file_crc32c(const mg_segment *seg, uint64_t off, uint64_t len, uint32_t *crc, char *why,
                       size_t cap)
{
    int rc = mg_guarded_crc32c(crc, (const char *)seg->addr + off, len);
    if (rc)
        snprintf(why, cap, "the segment's file is shorter than registered");
    return rc;
}

void mg_seg_file_describe(const mg_segment *seg, mg_segment_info *out)
{
    out->offset = seg->offset;
    if (seg->file[0]) {
        /* shm_dir "/" file, as snprintf "%s/%s" would (this runs for every lease reply) */
        size_t d = strnlen(seg->env->shm_dir, sizeof(out->path) - 2);
        memcpy(out->path, seg->env->shm_dir, d);
        out->path[d++] = '/';
        mg_strlcpy(out->path + d, seg->file, sizeof(out->path) - d);
    }
}
