/*
 * What pages the files of a directory (the daemon's --shm-dir) are made of: huge pages (a
 * hugetlbfs mount, or tmpfs mounted huge=always or huge=within_size) or 4 KiB ones. Every pass
 * over a segment — a copy into a socket, a checksum, a same-host copy — costs a TLB miss per
 * page touched, and with 4 KiB pages that is a large part of what moving a big segment costs.
 */
#ifndef MG_SHM_H
#define MG_SHM_H

#include <stddef.h>

/* From mountinfo (the text of /proc/self/mountinfo) and shmem_enabled (the text of
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled, or NULL): whether `path` (absolute, no
 * symbolic links) lies on huge pages (1) or not (0), with what its filesystem is in `desc`,
 * e.g. "tmpfs huge=within_size" or "tmpfs without huge=". -1 when no mount holds it. */
int mg_shm_pages_of(const char *mountinfo, const char *shmem_enabled, const char *path, char *desc,
                    size_t cap);

/* The same for a directory on this machine, read from /proc and /sys. */
int mg_shm_pages(const char *dir, char *desc, size_t cap);

/* The lock a daemon holds on its shm directory for its whole life, so that a second daemon on
 * the same directory (whose start-up would remove the first one's files) refuses to start. It
 * is an exclusive flock on MG_SHM_LOCK_FILE in dir; the holder writes "pid=N host=H" into the
 * file. Returns the descriptor holding the lock (close-on-exec; closing it lets the lock go), or
 * -1 with why (cap bytes): the holder's pid and host when another process holds it, else the
 * system call that failed. */
#define MG_SHM_LOCK_FILE ".moongate.lock"
int mg_shm_dir_lock(const char *dir, char *why, size_t cap);

#endif
