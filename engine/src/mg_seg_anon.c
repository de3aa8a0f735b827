/*
 * mg_seg_anon: daemon-made memory (MG_SEG_ANON) — a file the daemon creates in its shm
 * directory, named "moongate-seg-<id>", sized, mapped shared, and removed when the segment goes.
 * Local clients map the same file by its path (ListSegments shows it). The buffer pools are
 * segments of this kind.
 */
#include "mg_seg_kind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int anon_check(const mg_seg_env *env, const mg_segment_spec *spec, char *err)
{
    (void)env;
    if (spec->size == 0) {
        snprintf(err, MG_SEG_ERROR_MAX, "size must be greater than 0");
        return MG_ERR_INVALID;
    }
    return 0;
}

static void anon_enter(mg_segment *seg, const mg_segment_spec *spec)
{
    (void)spec;
    snprintf(seg->file, sizeof(seg->file), MG_SEG_FILE_PREFIX "%016llx",
             (unsigned long long)seg->idn.id);
}

/* Creates the file (never one that is there: O_EXCL, no link followed), gives it the daemon's
 * group and mode, sizes it and allocates its blocks. */
static int create_file(mg_segment *seg)
{
    const mg_seg_env *env = seg->env;
    char what[MG_SEG_NAME_MAX + 4096];
    struct stat st;
    seg->fd = openat(env->dirfd, seg->file, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     env->file_mode);
    if (seg->fd < 0) {
        mg_seg_error(seg, "cannot create %s/%s: %s", env->shm_dir, seg->file, strerror(errno));
        return MG_ERR_SYSTEM;
    }
    seg->created = 1;
    if (env->file_gid && fchown(seg->fd, (uid_t)-1, (gid_t)env->file_gid) != 0) {
        mg_seg_error(seg, "cannot give %s/%s to group %u: %s", env->shm_dir, seg->file,
                     env->file_gid, strerror(errno));
        return MG_ERR_SYSTEM;
    }
    if (fchmod(seg->fd, env->file_mode) != 0 || ftruncate(seg->fd, (off_t)seg->size) != 0) {
        mg_seg_error(seg, "cannot size %s/%s to %llu bytes: %s", env->shm_dir, seg->file,
                     (unsigned long long)seg->size, strerror(errno));
        return errno == ENOSPC || errno == EFBIG ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
    }
    if (fstat(seg->fd, &st) != 0) {
        mg_seg_error(seg, "cannot stat %s/%s: %s", env->shm_dir, seg->file, strerror(errno));
        return MG_ERR_SYSTEM;
    }
    if (mg_seg_claim_file(seg, &st, mg_seg_file_what(seg, what, sizeof(what))) != 0)
        return MG_ERR_PERMISSION;
    return mg_seg_file_blocks(seg);
}

static int anon_map(mg_segment *seg)
{
    int rc;
    seg->page = (uint64_t)sysconf(_SC_PAGESIZE);
    if ((rc = create_file(seg)) != 0)
        return rc;
    return mg_seg_file_mmap(seg);
}

const mg_seg_kind mg_seg_anon = {
    .source = MG_SEG_ANON,
    .name = "anon",
    .what = "memory the daemon made (a file in its shm directory)",
    .hint = "",
    .caps = MG_SEG_CAP_TCP | MG_SEG_CAP_RDMA | MG_SEG_CAP_COPY | MG_SEG_CAP_TARGET |
            MG_SEG_CAP_INLINE | MG_SEG_CAP_MAPPED,
    .location = "cpu",
    .location_default = 1,
    .check = anon_check,
    .enter = anon_enter,
    .map = anon_map,
    MG_SEG_FILE_OPS,
};
