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

#endif
