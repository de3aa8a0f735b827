/*
 * fault: copies over memory a client shares, without letting the client crash the daemon.
 *
 * A segment's (or the pool's) file is mapped by the daemon and by clients. A client with write
 * access can shrink the file; the daemon's mapping keeps its length, and touching a page past the
 * file's new end raises SIGBUS. Copies by the CPU (inline reads and writes, local transfer
 * copies, CRC32C over slices) therefore run guarded: a SIGBUS inside one makes it return
 * MG_ERR_DATA_LOSS. Copies the kernel makes (send, recv, process_vm_readv) report EFAULT
 * instead and need no guard; where that would come too late (a send whose frame header went
 * first), mg_fault_probe asks beforehand. A SIGBUS outside a guard is a bug and still kills the
 * process.
 *
 * Any thread. The handler is installed on first use (mg_fault_init() does it up front).
 */
#ifndef MOONGATE_FAULT_H
#define MOONGATE_FAULT_H

#include <stddef.h>
#include <stdint.h>

/* Installs the SIGBUS handler. Returns 0 or MG_ERR_SYSTEM. */
int mg_fault_init(void);
/* memmove(dst, src, n), or MG_ERR_DATA_LOSS when a page of either went missing. */
int mg_guarded_copy(void *dst, const void *src, size_t n);
/* *crc = mg_crc32c(*crc, p, n), or MG_ERR_DATA_LOSS as above. */
int mg_guarded_crc32c(uint32_t *crc, const void *p, size_t n);
/* *crc = mg_crc32c_copy(*crc, dst, src, n, stream) (not overlapping), or MG_ERR_DATA_LOSS as
 * above (*crc untouched, dst partly written). */
int mg_guarded_copy_crc32c(void *dst, const void *src, size_t n, uint32_t *crc, int stream);
/* 0 when the n bytes at p are all still there (n == 0: nothing to look at), MG_ERR_DATA_LOSS
 * when a page of them went missing. A file is cut from its end, so its last byte tells: one
 * guarded load, before the kernel is asked to copy the range (a send from a mapping). A file
 * cut between the probe and the copy still makes the copy fail EFAULT. */
int mg_fault_probe(const void *p, size_t n);
/* Runs fn(arg) guarded: its result, or MG_ERR_DATA_LOSS when it touched a missing page. fn must
 * leave nothing half done when cut short (no allocation, no lock): a copy or a checksum. */
int mg_fault_guard(int (*fn)(void *), void *arg);

#endif
