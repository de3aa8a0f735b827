/*
 * mg_seg_shm: a file by name (MG_SEG_SHM) — one a local client made in the daemon's shm
 * directory and registers by its name. The daemon opens it with its own rights, so the caller
 * must own it: only a caller on the Unix socket, known by its uid, registers a file by name,
 * and the file must belong to that uid, be a regular file with one link (no symbolic link is
 * followed) that its owner may read and write. Its size is the spec's, or the file's (size 0).
 * The file stays the client's: unregistering unmaps it and leaves it there.
 */
#include "mg_seg_kind.h"

#include "mg_str.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A name inside shm_dir: one path element, of the names' alphabet without ':'. */
static int file_name_ok(const char *s)
{
    size_t n = 0;
    if (s == NULL || !strcmp(s, ".") || !strcmp(s, "..") ||
        strncmp(s, MG_SEG_FILE_PREFIX, sizeof(MG_SEG_FILE_PREFIX) - 1) == 0)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-') ||
            n >= MG_SEG_NAME_MAX)
            return 0;
    }
    return n > 0;
}

static int shm_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    (void)env;
    if (!file_name_ok(spec->shm_file)) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "shm file must be a file name inside the shm directory ([A-Za-z0-9._-], "
                 "not . or .., not starting with %s)",
                 MG_SEG_FILE_PREFIX);
        return MG_ERR_INVALID;
    }
    if (!spec->caller_uid_known) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a file is registered by name only for its owner, a caller on the Unix "
                 "socket known by its uid; token and certificate callers pass the file "
                 "descriptor, or register an ANON segment");
        return MG_ERR_PERMISSION;
    }
    return 0;
}

static void shm_enter(mg_segment *seg, const mg_segment_spec *spec)
{
    mg_strlcpy(seg->file, spec->shm_file, sizeof(seg->file));
}

/* Opens the client's file without following a link, and checks that the caller owns it. */
static int open_owned(mg_segment *seg, struct stat *st)
{
    const char *dir = seg->env->shm_dir;
    seg->fd = openat(seg->env->dirfd, seg->file, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (seg->fd < 0) {
        int e = errno;
        if (e == ELOOP) {
            mg_seg_error(seg, "%s in %s is a symbolic link; segments are regular files", seg->file,
                         dir);
            return MG_ERR_PERMISSION;
        }
        mg_seg_error(seg, "cannot open %s in %s: %s", seg->file, dir, strerror(e));
        return e == EACCES || e == EPERM ? MG_ERR_PERMISSION : MG_ERR_INVALID;
    }
    if (fstat(seg->fd, st) != 0 || !S_ISREG(st->st_mode)) {
        mg_seg_error(seg, "%s in %s is not a regular file", seg->file, dir);
        return MG_ERR_INVALID;
    }
    if (st->st_nlink != 1) {
        mg_seg_error(seg, "%s in %s has %lu hard links; a segment file must have one", seg->file,
                     dir, (unsigned long)st->st_nlink);
        return MG_ERR_PERMISSION;
    }
    /* The daemon opened the file with its own rights: the caller must own it. */
    if (st->st_uid != seg->caller_uid) {
        mg_seg_error(seg, "%s in %s belongs to uid %u, not to the caller (uid %u)", seg->file, dir,
                     (unsigned)st->st_uid, (unsigned)seg->caller_uid);
        return MG_ERR_PERMISSION;
    }
    if ((st->st_mode & (S_IRUSR | S_IWUSR)) != (S_IRUSR | S_IWUSR)) {
        mg_seg_error(seg, "%s in %s has mode %04o: its owner may not both read and write it",
                     seg->file, dir, (unsigned)(st->st_mode & 07777));
        return MG_ERR_PERMISSION;
    }
    return 0;
}

static int open_file(mg_segment *seg)
{
    char what[MG_SEG_NAME_MAX + 4096];
    struct stat st;
    int rc = open_owned(seg, &st);
    if (rc != 0)
        return rc;
    if (mg_seg_claim_file(seg, &st, mg_seg_file_what(seg, what, sizeof(what))) != 0)
        return MG_ERR_PERMISSION;
    if (st.st_size <= 0) {
        mg_seg_error(seg, "%s in %s is empty", seg->file, seg->env->shm_dir);
        return MG_ERR_INVALID;
    }
    if (seg->size == 0) {
        rc = mg_seg_grow(seg, (uint64_t)st.st_size);
        return rc != 0 ? rc : mg_seg_file_blocks(seg);
    }
    if ((uint64_t)st.st_size < seg->size) {
        mg_seg_error(seg, "%s in %s has %lld bytes, fewer than the %llu asked for", seg->file,
                     seg->env->shm_dir, (long long)st.st_size, (unsigned long long)seg->size);
        return MG_ERR_INVALID;
    }
    return mg_seg_file_blocks(seg); /* a client's sparse file: its holes, within its size */
}

static int shm_map(mg_segment *seg)
{
    int rc;
    seg->page = (uint64_t)sysconf(_SC_PAGESIZE);
    if ((rc = open_file(seg)) != 0)
        return rc;
    return mg_seg_file_mmap(seg);
}

const mg_seg_kind mg_seg_shm = {
    .source = MG_SEG_SHM,
    .name = "shm",
    .what = "a client's file in the shm directory",
    .hint = "",
    .caps = MG_SEG_CAP_TCP | MG_SEG_CAP_RDMA | MG_SEG_CAP_COPY | MG_SEG_CAP_TARGET |
            MG_SEG_CAP_INLINE | MG_SEG_CAP_MAPPED,
    .location = "cpu",
    .location_default = 1,
    .check = shm_check,
    .enter = shm_enter,
    .map = shm_map,
    MG_SEG_FILE_OPS,
};
