/*
 * moongate process memory: bytes of a local client process that has no descriptor for them
 * (malloc'd buffers, CPU tensors), read and written with process_vm_readv/writev.
 *
 * The kernel lets a root daemon read any process, so the rule is the daemon's: the memory's
 * process must run as the caller's uid (real, effective and saved), the uid the kernel reported
 * for the caller's connection. The process is held by a pidfd, opened and checked against the
 * start time the caller's connection saw, so a pid the system gives to another process later is
 * never read; every copy first asks the pidfd whether the process is still there. Yama's
 * ptrace_scope and a missing CAP_SYS_PTRACE (a daemon that is not root, or a container without
 * it) make the kernel refuse: the reason says which.
 *
 * Threads: open and close on any thread; copies on workers (they may touch many pages).
 */
#ifndef MOONGATE_PROCMEM_H
#define MOONGATE_PROCMEM_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/mg_error.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_procmem mg_procmem;

/* When process pid started (clock ticks after boot, field 22 of /proc/PID/stat): with the pid,
 * what tells one process from a later one given the same pid. 0 when it cannot be read. A read
 * of procfs, which never waits for a device. */
uint64_t mg_proc_start_time(int32_t pid);

/* Opens process `proc` (its start time must match; 0: as found) running as `uid`. Returns 0, or
 * with why (cap bytes) set: MG_ERR_INVALID (pid 0: a pid namespace the daemon cannot see),
 * MG_ERR_STATE (the process is gone, or is another one now), MG_ERR_PERMISSION (it runs as
 * another uid), MG_ERR_SYSTEM. */
int mg_procmem_open(mg_procmem **out, const mg_proc *proc, uint32_t uid, char *why, size_t cap);
/* Accepts NULL. */
void mg_procmem_close(mg_procmem *pm);
/* The process, as opened. */
const mg_proc *mg_procmem_proc(const mg_procmem *pm);
/* Its pidfd: readable once the process has exited (poll it; do not close it). */
int mg_procmem_pidfd(const mg_procmem *pm);

/* Worker. Copies len bytes from the process's address `addr` to `dst` (read) or from `src` to
 * it (write). Returns 0, or with why set: MG_ERR_STATE (the process exited), MG_ERR_DATA_LOSS
 * (part of the range is not mapped there any more), MG_ERR_PERMISSION (the kernel refused: the
 * reason names ptrace_scope or CAP_SYS_PTRACE). */
int mg_procmem_read(mg_procmem *pm, void *dst, uint64_t addr, size_t len, char *why, size_t cap);
int mg_procmem_write(mg_procmem *pm, uint64_t addr, const void *src, size_t len, char *why,
                     size_t cap);
/* Worker. Checks that every page of [addr, addr + len) is memory the daemon can read in the
 * process (a byte of each). Returns 0, or as mg_procmem_read with MG_ERR_INVALID for a range
 * that is not this host's memory there (unmapped, or a GPU's). */
int mg_procmem_probe(mg_procmem *pm, uint64_t addr, uint64_t len, char *why, size_t cap);

/* Whether this daemon can reach other processes' memory at all, and when not (or only
 * partly) why: Yama's ptrace_scope 3, or no CAP_SYS_PTRACE (then only its own uid's processes).
 * Returns 1 (available; why may still say a limit) or 0. */
int mg_procmem_available(char *why, size_t cap);
/* Bytes read from and written into client processes since start (all threads). */
void mg_procmem_bytes(uint64_t *read, uint64_t *written);

#ifdef __cplusplus
}
#endif

#endif
