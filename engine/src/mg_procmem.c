/* mg_procmem: another process's memory through process_vm_readv/writev (moongate/procmem.h). */
#include "moongate/procmem.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define PROBE_PAGES 1024 /* pages a probe asks about in one call (IOV_MAX) */

static uint64_t bytes_read, bytes_written; /* atomic */

struct mg_procmem {
    mg_proc proc;
    int pidfd;
};

/* A small procfs file, NUL-terminated in buf (cap bytes). Returns 0, or -1 when it cannot be
 * read or is empty. */
static int read_proc(const char *path, char *buf, size_t cap)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    buf[0] = '\0';
    if (fd < 0)
        return -1;
    n = read(fd, buf, cap - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return n > 0 ? 0 : -1;
}

/* The first line of `path` that starts with `key`, copied to out. Returns 0 or -1. */
static int proc_line(const char *path, const char *key, char *out, size_t cap)
{
    char buf[4096], *p;
    if (read_proc(path, buf, sizeof(buf)) != 0)
        return -1;
    for (p = buf; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, key, strlen(key)) == 0) {
            size_t l = strcspn(p, "\n");
            snprintf(out, cap, "%.*s", (int)l, p);
            return 0;
        }
    }
    return -1;
}

uint64_t mg_proc_start_time(int32_t pid)
{
    char path[32], buf[1024], *p;
    unsigned long long start = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (read_proc(path, buf, sizeof(buf)) != 0)
        return 0;
    p = strrchr(buf, ')'); /* after the command name, which may hold anything */
    for (int field = 2; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    if (p)
        sscanf(p + 1, "%llu", &start);
    return start;
}

static int alive(const mg_procmem *pm)
{
    struct pollfd p = {.fd = pm->pidfd, .events = POLLIN};
    return poll(&p, 1, 0) == 0; /* readable: it exited */
}

int mg_procmem_open(mg_procmem **out, const mg_proc *proc, uint32_t uid, char *why, size_t cap)
{
    unsigned long r = 0, e = 0, s = 0;
    char path[48], line[256];
    mg_procmem *pm;
    uint64_t start;
    if (proc->pid <= 0) {
        snprintf(why, cap,
                 "the kernel names no process for this caller (a pid namespace the "
                 "daemon cannot see): run the daemon in the host's (Kubernetes: hostPID)");
        return MG_ERR_INVALID;
    }
    if ((pm = calloc(1, sizeof(*pm))) == NULL) {
        snprintf(why, cap, "out of memory");
        return MG_ERR_NOMEM;
    }
    pm->proc = *proc;
    pm->pidfd = (int)syscall(SYS_pidfd_open, proc->pid, 0);
    start = mg_proc_start_time(proc->pid);
    if (pm->pidfd < 0 || start == 0 || (proc->start && start != proc->start)) {
        snprintf(why, cap, "process %d is gone%s", (int)proc->pid,
                 pm->pidfd >= 0 && start ? " (its pid is another process's now)" : "");
        mg_procmem_close(pm);
        return MG_ERR_STATE;
    }
    pm->proc.start = start;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)proc->pid);
    if (proc_line(path, "Uid:", line, sizeof(line)) != 0 ||
        sscanf(line, "Uid: %lu %lu %lu", &r, &e, &s) != 3 || !alive(pm)) {
        snprintf(why, cap, "process %d is gone", (int)proc->pid);
        mg_procmem_close(pm);
        return MG_ERR_STATE;
    }
    if (r != uid || e != uid || s != uid) {
        snprintf(why, cap,
                 "process %d runs as uid %lu (effective %lu, saved %lu), not as the caller's "
                 "uid %u: the daemon reads only the memory of processes of the caller's own uid",
                 (int)proc->pid, r, e, s, (unsigned)uid);
        mg_procmem_close(pm);
        return MG_ERR_PERMISSION;
    }
    *out = pm;
    return 0;
}

void mg_procmem_close(mg_procmem *pm)
{
    if (pm == NULL)
        return;
    if (pm->pidfd >= 0)
        close(pm->pidfd);
    free(pm);
}

const mg_proc *mg_procmem_proc(const mg_procmem *pm)
{
    return &pm->proc;
}

int mg_procmem_pidfd(const mg_procmem *pm)
{
    return pm->pidfd;
}

/* Yama's ptrace_scope ("" without Yama) and whether the daemon has CAP_SYS_PTRACE. */
static int ptrace_rules(char scope[32])
{
    char caps[128] = "";
    unsigned long long eff = 0;
    read_proc("/proc/sys/kernel/yama/ptrace_scope", scope, 32); /* "" without Yama */
    scope[strcspn(scope, "\n")] = '\0';
    if (proc_line("/proc/self/status", "CapEff:", caps, sizeof(caps)) == 0)
        sscanf(caps, "CapEff: %llx", &eff);
    return (eff & (1ULL << 19)) != 0; /* CAP_SYS_PTRACE */
}

int mg_procmem_available(char *why, size_t cap)
{
    char scope[32];
    int ptrace = ptrace_rules(scope);
    why[0] = '\0';
    if (strcmp(scope, "3") == 0) {
        snprintf(why, cap,
                 "Yama ptrace_scope is 3 (/proc/sys/kernel/yama/ptrace_scope): no "
                 "process may read another's memory");
        return 0;
    }
    if (!ptrace)
        snprintf(why, cap,
                 "without CAP_SYS_PTRACE%s, only processes of the daemon's own uid %u "
                 "(Kubernetes: add CAP_SYS_PTRACE, with hostPID)",
                 scope[0] && strcmp(scope, "0") != 0 ? " and with Yama ptrace_scope above 0: none"
                                                     : "",
                 (unsigned)getuid());
    return 1;
}

void mg_procmem_bytes(uint64_t *read, uint64_t *written)
{
    *read = __atomic_load_n(&bytes_read, __ATOMIC_RELAXED);
    *written = __atomic_load_n(&bytes_written, __ATOMIC_RELAXED);
}

/* Why the kernel refused (EPERM): Yama's ptrace_scope, or no CAP_SYS_PTRACE. */
static void refused(const mg_procmem *pm, char *why, size_t cap)
{
    char scope[32];
    int ptrace = ptrace_rules(scope);
    snprintf(why, cap, "the kernel refused to reach process %d's memory (EPERM): %s%s%s%s",
             (int)pm->proc.pid, scope[0] ? "Yama ptrace_scope is " : "", scope,
             scope[0] ? " (/proc/sys/kernel/yama/ptrace_scope: 3 forbids it, 1 and 2 need "
                        "CAP_SYS_PTRACE); "
                      : "",
             ptrace ? "the daemon has CAP_SYS_PTRACE"
                    : "the daemon lacks CAP_SYS_PTRACE (Kubernetes: add it to the "
                      "daemon's capabilities, with hostPID)");
}

/* One copy, to the end of the range or the first failure. */
static int copy(mg_procmem *pm, int write, void *local, uint64_t addr, size_t len, char *why,
                size_t cap)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(char *)local + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(addr + done), len - done};
        ssize_t n;
        if (!alive(pm)) {
            snprintf(why, cap, "process %d exited", (int)pm->proc.pid);
            return MG_ERR_STATE;
        }
        n = write ? process_vm_writev(pm->proc.pid, &l, 1, &r, 1, 0)
                  : process_vm_readv(pm->proc.pid, &l, 1, &r, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            __atomic_add_fetch(write ? &bytes_written : &bytes_read, (uint64_t)n, __ATOMIC_RELAXED);
            continue;
        }
        if (n == 0 || errno == EFAULT) {
            snprintf(why, cap,
                     "bytes from 0x%llx of process %d are not mapped there any more (freed "
                     "while registered?)",
                     (unsigned long long)(addr + done), (int)pm->proc.pid);
            return MG_ERR_DATA_LOSS;
        }
        if (errno == ESRCH) {
            snprintf(why, cap, "process %d exited", (int)pm->proc.pid);
            return MG_ERR_STATE;
        }
        if (errno == EPERM) {
            refused(pm, why, cap);
            return MG_ERR_PERMISSION;
        }
        if (errno != EINTR) {
            snprintf(why, cap, "process %d: %s", (int)pm->proc.pid, strerror(errno));
            return MG_ERR_SYSTEM;
        }
    }
    if (!alive(pm)) { /* it went during the copy: its pid may be another's already */
        snprintf(why, cap, "process %d exited", (int)pm->proc.pid);
        return MG_ERR_STATE;
    }
    return 0;
}

int mg_procmem_read(mg_procmem *pm, void *dst, uint64_t addr, size_t len, char *why, size_t cap)
{
    return copy(pm, 0, dst, addr, len, why, cap);
}

int mg_procmem_write(mg_procmem *pm, uint64_t addr, const void *src, size_t len, char *why,
                     size_t cap)
{
    return copy(pm, 1, (void *)src, addr, len, why, cap);
}

int mg_procmem_probe(mg_procmem *pm, uint64_t addr, uint64_t len, char *why, size_t cap)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), first = addr - addr % page;
    static __thread struct iovec rv[PROBE_PAGES];
    char sink[PROBE_PAGES];
    struct iovec lv = {sink, 0};
    if (len == 0 || addr > UINT64_MAX - len) {
        snprintf(why, cap, "[0x%llx, +%llu) is not a range", (unsigned long long)addr,
                 (unsigned long long)len);
        return MG_ERR_INVALID;
    }
    for (uint64_t at = first; at < addr + len;) {
        int k = 0;
        ssize_t n;
        for (; k < PROBE_PAGES && at < addr + len; k++, at += page)
            rv[k] = (struct iovec){(void *)(uintptr_t)(at < addr ? addr : at), 1};
        lv.iov_len = (size_t)k;
        n = process_vm_readv(pm->proc.pid, &lv, 1, rv, (unsigned long)k, 0);
        if (n == k)
            continue;
        if (n >= 0 || errno == EFAULT) {
            snprintf(
                why, cap,
                "address 0x%llx is not memory the daemon can reach in process %d: not mapped "
                "there, or a GPU's (device memory is not reached through the process's "
                "pages: register it by its dma-buf, source DMABUF, as the client libraries do)",
                (unsigned long long)(uintptr_t)rv[n > 0 ? n : 0].iov_base, (int)pm->proc.pid);
            return MG_ERR_INVALID;
        }
        return copy(pm, 0, sink, addr, 1, why, cap); /* the same failure, with its reason */
    }
    return alive(pm) ? 0
                     : (snprintf(why, cap, "process %d exited", (int)pm->proc.pid), MG_ERR_STATE);
}
