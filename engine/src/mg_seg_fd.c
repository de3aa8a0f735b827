/*
 * mg_seg_fd: a passed file (MG_SEG_FD) — a range of a file a client passed as a descriptor on
 * the fd socket: a memfd, a tmpfs or hugetlbfs file, any regular file it could open for reading
 * and writing. It needs no name and no owner check: holding the descriptor open for reading and
 * writing is the right to its bytes. The registry takes the descriptor at reserve; the worker
 * checks what it is, maps the range asked for (from the page it starts in) and closes it.
 * Listings show no path (the client has the file), and the range's offset.
 */
#include "mg_seg_kind.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

static int fd_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    (void)env;
    if (spec->fd < 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "no descriptor: an fd segment needs the file's "
                 "descriptor, passed on the daemon's fd socket");
        return MG_ERR_INVALID;
    }
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "directory"
           : S_ISFIFO(m) ? "pipe"
           : S_ISSOCK(m) ? "socket"
           : S_ISCHR(m)  ? "character device"
           : S_ISBLK(m)  ? "block device"
                         : "file of another kind";
}

/* What the descriptor is and how it was opened: a regular file, read-write, writable. */
static int check_open(mg_segment *seg, struct stat *st, int *seals)
{
    int fl = fcntl(seg->fd, F_GETFL);
    if (fl < 0 || fstat(seg->fd, st) != 0) {
        mg_seg_error(seg, "cannot inspect the passed descriptor: %s", strerror(errno));
        return MG_ERR_SYSTEM;
    }
    if (fl & O_PATH) {
        mg_seg_error(seg, "the descriptor was opened with O_PATH: it names a file but cannot map "
                          "it; pass one opened O_RDWR");
        return MG_ERR_INVALID;
    }
    if (!S_ISREG(st->st_mode)) {
        mg_seg_error(seg,
                     "the descriptor is a %s, not memory: pass a memfd, a tmpfs or hugetlbfs "
                     "file, or another regular file",
                     file_kind(st->st_mode));
        return MG_ERR_INVALID;
    }
    if ((fl & O_ACCMODE) != O_RDWR) {
        mg_seg_error(seg,
                     "the descriptor is open %s; a segment is read and written: open it O_RDWR",
                     (fl & O_ACCMODE) == O_WRONLY ? "write-only" : "read-only");
        return MG_ERR_INVALID;
    }
    *seals = fcntl(seg->fd, F_GET_SEALS);
    if (*seals > 0 && (*seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))) {
        mg_seg_error(seg, "the memfd is sealed against writes (F_SEAL_WRITE or "
                          "F_SEAL_FUTURE_WRITE); a segment is written");
        return MG_ERR_INVALID;
    }
    return 0;
}

/* [offset, offset + size) inside the file (size 0: to its end), and a hugetlbfs file's range
 * in whole huge pages (seg->page set). */
static int check_range(mg_segment *seg, uint64_t fsize)
{
    struct statfs fs;
    if (seg->offset >= fsize) {
        mg_seg_error(seg, "offset %llu is not inside the file (%llu bytes)",
                     (unsigned long long)seg->offset, (unsigned long long)fsize);
        return MG_ERR_RANGE;
    }
    if (seg->size != 0 && mg_bounds_check(fsize, seg->offset, seg->size) != 0) {
        mg_seg_error(seg, "%llu bytes from offset %llu run past the end of the file (%llu bytes)",
                     (unsigned long long)seg->size, (unsigned long long)seg->offset,
                     (unsigned long long)fsize);
        return MG_ERR_RANGE;
    }
    seg->page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (fstatfs(seg->fd, &fs) == 0 && (unsigned long)fs.f_type == HUGETLBFS_MAGIC) {
        uint64_t size = seg->size ? seg->size : fsize - seg->offset;
        seg->page = (uint64_t)fs.f_bsize;
        if (seg->offset % seg->page != 0 || size % seg->page != 0) {
            mg_seg_error(seg,
                         "a hugetlbfs file maps in whole huge pages of %llu bytes: offset %llu "
                         "and size %llu must be multiples of it",
                         (unsigned long long)seg->page, (unsigned long long)seg->offset,
                         (unsigned long long)size);
            return MG_ERR_INVALID;
        }
    }
    return 0;
}

/* What a passed descriptor may be (see mg_segment_spec.fd). Returns 0 with
 * [offset, offset + size) known to lie in the file, or an MG_ERR_* with the reason set. */
static int check_passed_fd(mg_segment *seg)
{
    struct stat st;
    uint64_t fsize;
    int seals, rc;

    if ((rc = check_open(seg, &st, &seals)) != 0)
        return rc;
    if (seg->remote_accessible && mg_rdma_device_count(seg->env->rdma) > 0 &&
        (seals < 0 || !(seals & F_SEAL_SHRINK))) {
        mg_seg_error(seg,
                     "a remote-accessible segment is registered with this daemon's RDMA devices, "
                     "which keep the pages a shrink takes from the file, so peers would write "
                     "where the client no longer sees: pass a memfd sealed with F_SEAL_SHRINK "
                     "(fcntl F_ADD_SEALS), or register it without remote access");
        return MG_ERR_STATE;
    }
    fsize = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    if ((rc = check_range(seg, fsize)) != 0)
        return rc;
    if (mg_seg_claim_file(seg, &st, "the passed file") != 0)
        return MG_ERR_PERMISSION;
    if (seg->size == 0 && (rc = mg_seg_grow(seg, fsize - seg->offset)) != 0)
        return rc;
    return mg_seg_file_blocks(seg);
}

static int fd_map(mg_segment *seg)
{
    int rc = check_passed_fd(seg);
    return rc != 0 ? rc : mg_seg_file_mmap(seg);
}

const mg_seg_kind mg_seg_fd = {
    .source = MG_SEG_FD,
    .name = "fd",
    .what = "a range of a file the client passed",
    .hint = "",
    .caps = MG_SEG_CAP_TCP | MG_SEG_CAP_RDMA | MG_SEG_CAP_COPY | MG_SEG_CAP_TARGET |
            MG_SEG_CAP_INLINE | MG_SEG_CAP_FD | MG_SEG_CAP_MAPPED,
    .location = "cpu",
    .location_default = 1,
    .check = fd_check,
    .map = fd_map,
    MG_SEG_FILE_OPS,
};
