/*
 * A software verbs emulator for tests: a shared library exporting the libibverbs entry points
 * moongate resolves, so that the RDMA transport runs on machines without RDMA hardware. The
 * daemon loads it only through its dlopen seam (--ibverbs-lib); nothing in moongate knows it.
 *
 * What it emulates, as real hardware and libibverbs behave:
 *   devices   named by MG_VERBS_EMU_DEVICES (comma-separated; default "emu0"; "" for none), each
 *             with one port, RoCE (Ethernet link layer), active MTU 4096, a GID table of 4
 *             entries (index 0: the IPv4-mapped 127.0.0.1); MG_VERBS_EMU_PORT_DOWN=name leaves
 *             that device's port down
 *   PDs       per context
 *   MRs       access flags checked as the verbs rules say (remote write needs local write), the
 *             range must be mapped (EFAULT otherwise), keys unique across processes;
 *             dma-buf MRs (ibv_reg_dmabuf_mr) of the CUDA driver emulator's dma-bufs, named by
 *             their iova in work requests;
 *             MG_VERBS_EMU_MEMLOCK=bytes caps what one process may have registered at once
 *             (ENOMEM past it, as pinning past RLIMIT_MEMLOCK fails)
 *   CQs       with completion channels (a pipe: one event per arming)
 *   RC QPs    the state machine RESET -> INIT -> RTR -> RTS with the attribute masks RC needs
 *             (others refused with EINVAL; RoCE needs a GRH; the path MTU at most the port's),
 *             ERR after a failed work request (the rest flushed)
 *   RDMA      WRITE and READ executed when posted, between processes of the same host with
 *             process_vm_writev/readv against the registered range of the remote key, after the
 *             checks the responder's hardware makes: a key that is unknown, lacks the access or
 *             does not cover the range -> IBV_WC_REM_ACCESS_ERR; a local key that does not cover
 *             the buffer -> IBV_WC_LOC_PROT_ERR; the peer's process or QP gone ->
 *             IBV_WC_RETRY_EXC_ERR (real hardware reports it after timeout x retries);
 *             MG_VERBS_EMU_CORRUPT=PATH is a corruption switch: while the file PATH exists, the
 *             next RDMA WRITE or READ lands with its first byte flipped, and the file is removed
 *             (one transfer per file, whichever process takes it), as a bad link or memory would
 *
 * Keys and QP numbers are claimed as files in a directory shared by the processes of one user
 * (MG_VERBS_EMU_DIR, default /dev/shm/mg-verbs-emu-UID): "mr-KEY" holds the owner's pid, the
 * range and the access; "qp-QPN" the owner's pid.
 *
 * The environment is read at every ibv_get_device_list.
 */
#include <infiniband/verbs.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_query_port

#define EMU_MAX_DEVICES 8
#define EMU_GIDS        4

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devices[EMU_MAX_DEVICES];
static int ndevices;
static char port_down[IBV_SYSFS_NAME_MAX];
static uint64_t memlock_cap, registered;

typedef struct emu_mr {
    struct ibv_mr mr; /* mr.addr: the range's address as work requests name it (a dma-buf's iova) */
    int access;
    char *map; /* a dma-buf MR: the device's mapping of the buffer (NULL: mr.addr is memory) */
    struct emu_mr *next;
} emu_mr;
static emu_mr *mrs;

/* Reads the environment: at every device listing, so that a process can list other devices
 * later (the device structures of an earlier listing must no longer be in use). */
static void setup(void)
{
    const char *names, *down, *cap;
    names = getenv("MG_VERBS_EMU_DEVICES");
    down = getenv("MG_VERBS_EMU_PORT_DOWN");
    cap = getenv("MG_VERBS_EMU_MEMLOCK");
    if (names == NULL)
        names = "emu0";
    ndevices = 0;
    for (const char *p = names; *p && ndevices < EMU_MAX_DEVICES;) {
        size_t len = strcspn(p, ",");
        struct ibv_device *d = &devices[ndevices];
        if (len > 0 && len < sizeof(d->name)) {
            memset(d, 0, sizeof(*d));
            d->node_type = IBV_NODE_CA;
            d->transport_type = IBV_TRANSPORT_IB;
            memcpy(d->name, p, len);
            snprintf(d->dev_name, sizeof(d->dev_name), "uverbs%d", ndevices);
            ndevices++;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    snprintf(port_down, sizeof(port_down), "%s", down ? down : "");
    memlock_cap = cap ? strtoull(cap, NULL, 10) : 0;
}

static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

static void sweep_dead(void);

EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
    struct ibv_device **list;
    pthread_mutex_lock(&lock);
    setup();
    sweep_dead();
    list = calloc((size_t)ndevices + 1, sizeof(*list));
    for (int i = 0; list && i < ndevices; i++)
        list[i] = &devices[i];
    if (num)
        *num = list ? ndevices : 0;
    pthread_mutex_unlock(&lock);
    if (list == NULL)
        errno = ENOMEM;
    return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    ctx->device = device;
    ctx->cmd_fd = -1;
    ctx->async_fd = -1;
    ctx->num_comp_vectors = 1;
    ctx->ops.poll_cq = emu_poll_cq;
    ctx->ops.req_notify_cq = emu_req_notify_cq;
    ctx->ops.post_send = emu_post_send;
    ctx->ops.post_recv = emu_post_recv;
    pthread_mutex_init(&ctx->mutex, NULL);
    return ctx;
}

EXPORT int ibv_close_device(struct ibv_context *ctx)
{
    pthread_mutex_destroy(&ctx->mutex);
    free(ctx);
    return 0;
}

EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
    (void)ctx;
    memset(attr, 0, sizeof(*attr));
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "moongate-verbs-emu");
    attr->max_mr_size = 1ULL << 40;
    attr->page_size_cap = 4096;
    attr->max_qp = 4096;
    attr->max_qp_wr = 4096;
    attr->max_sge = 4;
    attr->max_cq = 4096;
    attr->max_cqe = 65536;
    attr->max_mr = 65536;
    attr->max_pd = 1024;
    attr->max_qp_rd_atom = 16;
    attr->max_qp_init_rd_atom = 16;
    attr->phys_port_cnt = 1;
    return 0;
}

/* The exported (compat) entry: it fills the leading fields of struct ibv_port_attr, which is
 * what the caller passes. */
EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *a)
{
    struct ibv_port_attr *attr = (struct ibv_port_attr *)a;
    if (port != 1) {
        errno = EINVAL;
        return EINVAL;
    }
    memset(attr, 0, sizeof(*attr));
    attr->state = strcmp(ctx->device->name, port_down) ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_4096;
    attr->gid_tbl_len = EMU_GIDS;
    attr->max_msg_sz = 1u << 30;
    attr->pkey_tbl_len = 1;
    attr->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    (void)ctx;
    if (port != 1 || index < 0 || index >= EMU_GIDS) {
        errno = EINVAL;
        return -1;
    }
    memset(gid, 0, sizeof(*gid));
    gid->raw[10] = gid->raw[11] = 0xff; /* ::ffff:127.0.0.1 (index > 0: other loopbacks) */
    gid->raw[12] = 127;
    gid->raw[15] = (uint8_t)(1 + index);
    return 0;
}

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    static uint32_t handles;
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = ctx;
    pd->handle = __atomic_add_fetch(&handles, 1, __ATOMIC_RELAXED);
    return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    int busy = 0;
    pthread_mutex_lock(&lock);
    for (emu_mr *m = mrs; m; m = m->next)
        busy |= m->mr.pd == pd;
    pthread_mutex_unlock(&lock);
    if (busy) /* real verbs: a PD with registrations cannot go */
        return EBUSY;
    free(pd);
    return 0;
}

/* ---- keys and QP numbers shared between processes ---- */

/* A claimed key's or QP number's file: the owner's pid first (sweep_dead reads it), then the
 * device, which the responder's hardware checks: a key is valid only on its own device. */
typedef struct shared_qp {
    pid_t pid;
    char dev[IBV_SYSFS_NAME_MAX];
} shared_qp;

typedef struct shared_mr {
    pid_t pid;
    char dev[IBV_SYSFS_NAME_MAX];
    uint64_t addr, len; /* as work requests name it */
    int access;
    uint64_t mem; /* where its bytes are in pid's memory (addr, but for a dma-buf MR) */
} shared_mr;

static const char *emu_dir(void)
{
    static char dir[256];
    if (dir[0] == '\0') {
        const char *d = getenv("MG_VERBS_EMU_DIR");
        if (d && *d)
            snprintf(dir, sizeof(dir), "%s", d);
        else
            snprintf(dir, sizeof(dir), "/dev/shm/mg-verbs-emu-%u", (unsigned)getuid());
        mkdir(dir, 0700);
    }
    return dir;
}

/* Claims a fresh name "KIND-%08x" for `bytes` of content; returns the number (never 0). */
static uint32_t claim(const char *kind, uint32_t mask, const void *data, size_t bytes)
{
    char path[320];
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t n = 0;
        int fd;
        if (getrandom(&n, sizeof(n), 0) != sizeof(n))
            n = (uint32_t)rand();
        n &= mask;
        if (n == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s-%08x", emu_dir(), kind, n);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
            continue;
        if (write(fd, data, bytes) != (ssize_t)bytes) {
            close(fd);
            unlink(path);
            return 0;
        }
        close(fd);
        return n;
    }
    return 0;
}

static void unclaim(const char *kind, uint32_t n)
{
    char path[320];
    snprintf(path, sizeof(path), "%s/%s-%08x", emu_dir(), kind, n);
    unlink(path);
}

/* Reads what was claimed as KIND-n; 0, or -1 when there is no such name. */
static int lookup(const char *kind, uint32_t n, void *out, size_t bytes)
{
    char path[320];
    int fd, ok;
    snprintf(path, sizeof(path), "%s/%s-%08x", emu_dir(), kind, n);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ok = read(fd, out, bytes) == (ssize_t)bytes;
    close(fd);
    return ok ? 0 : -1;
}

static int alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* Names claimed by processes that are gone (killed without cleaning up) are released, so the
 * directory does not grow and a later process with the same pid is not mistaken for them. */
static void sweep_dead(void)
{
    DIR *d = opendir(emu_dir());
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[600];
        pid_t pid;
        int fd, ok;
        if (strncmp(e->d_name, "mr-", 3) != 0 && strncmp(e->d_name, "qp-", 3) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", emu_dir(), e->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ok = read(fd, &pid, sizeof(pid)) == (ssize_t)sizeof(pid); /* both start with the pid */
        close(fd);
        if (ok && !alive(pid))
            unlink(path);
    }
    if (d)
        closedir(d);
}

/* ---- memory regions ---- */

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, char *map,
                          int access);

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return reg(pd, addr, length, (uintptr_t)addr, NULL, access);
}

/* An MR named by `iova` in work requests, whose bytes are at addr here (map: a dma-buf's
 * mapping the MR owns, unmapped with it). */
static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, char *map,
                          int access)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
    shared_mr sh = {
        .pid = getpid(), .addr = iova, .len = length, .access = access, .mem = (uintptr_t)addr};
    uint32_t key;
    emu_mr *m;
    if (pd == NULL || length == 0 ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return NULL;
    }
    if ((uintptr_t)addr + length < (uintptr_t)addr ||
        msync((void *)start, (uintptr_t)addr + length - start, MS_ASYNC) != 0) {
        errno = EFAULT; /* not mapped: pinning would fail */
        return NULL;
    }
    snprintf(sh.dev, sizeof(sh.dev), "%s", pd->context->device->name);
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&lock);
    if (memlock_cap && registered + length > memlock_cap) {
        pthread_mutex_unlock(&lock);
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    key = claim("mr", 0xffffffffu, &sh, sizeof(sh));
    if (key == 0) {
        pthread_mutex_unlock(&lock);
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    registered += length;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = (void *)(uintptr_t)iova;
    m->map = map;
    m->mr.length = length;
    m->mr.handle = key;
    m->mr.lkey = key;
    m->mr.rkey = (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) ? key : 0;
    m->access = access;
    m->next = mrs;
    mrs = m;
    pthread_mutex_unlock(&lock);
    return &m->mr;
}

/* A dma-buf registered as the NIC would: the buffer mapped for the device. The CUDA driver
 * emulator's dma-buf (tests/cuda_emu) is its allocation's memfd, opened read-only, whose file
 * position is where the exported range starts; the device opens it again for writing, as a NIC
 * reaches what a real dma-buf exports. MG_VERBS_EMU_NO_DMABUF=1: providers without dma-buf
 * (EOPNOTSUPP); =NAME: device NAME's only. */
EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                        uint64_t iova, int fd, int access)
{
    const char *no = getenv("MG_VERBS_EMU_NO_DMABUF");
    long page = sysconf(_SC_PAGESIZE);
    off_t base = lseek(fd, 0, SEEK_CUR);
    char path[64], *map;
    struct ibv_mr *mr;
    int rw, e;
    if (no != NULL && *no && strcmp(no, "0") != 0 &&
        (strcmp(no, "1") == 0 || (pd && strcmp(no, pd->context->device->name) == 0))) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (pd == NULL || length == 0 || base < 0 || (base + (off_t)offset) % page != 0) {
        errno = EINVAL;
        return NULL;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if ((rw = open(path, O_RDWR | O_CLOEXEC)) < 0)
        return NULL;
    map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, rw, base + (off_t)offset);
    e = errno;
    close(rw);
    if (map == MAP_FAILED) {
        errno = e;
        return NULL;
    }
    if ((mr = reg(pd, map, length, iova, map, access)) == NULL) {
        e = errno;
        munmap(map, length);
        errno = e;
    }
    return mr;
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    emu_mr **pp;
    pthread_mutex_lock(&lock);
    for (pp = &mrs; *pp && &(*pp)->mr != mr; pp = &(*pp)->next)
        ;
    if (*pp == NULL) {
        pthread_mutex_unlock(&lock);
        return EINVAL;
    }
    emu_mr *m = *pp;
    *pp = m->next;
    registered -= m->mr.length;
    unclaim("mr", m->mr.lkey);
    pthread_mutex_unlock(&lock);
    if (m->map != NULL)
        munmap(m->map, m->mr.length);
    free(m);
    return 0;
}

/* The local MR of `lkey` covering [addr, addr + len) with `need` access: 0 with *mem where the
 * bytes are (a dma-buf MR's mapping), or -1. */
static int local_ok(struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint64_t len, int need,
                    void **mem)
{
    int ok = 0;
    pthread_mutex_lock(&lock);
    for (emu_mr *m = mrs; m; m = m->next) {
        uint64_t a = (uintptr_t)m->mr.addr;
        if (m->mr.lkey == lkey && m->mr.pd == pd && addr >= a && addr + len >= addr &&
            addr + len <= a + m->mr.length && (m->access & need) == need) {
            *mem = m->map ? m->map + (addr - a) : (void *)(uintptr_t)addr;
            ok = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

/* ---- completion queues and channels ---- */

typedef struct emu_cq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    struct ibv_wc *ring;
    int size, head, count;
    int armed;
    int overflow;
} emu_cq;

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
    struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
    int fds[2];
    if (ch == NULL || pipe2(fds, O_CLOEXEC) != 0) {
        free(ch);
        errno = ENOMEM;
        return NULL;
    }
    ch->context = ctx;
    ch->fd = fds[0];
    ch->refcnt = fds[1]; /* the write end (the field is the library's own in real verbs) */
    return ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    close(ch->fd);
    close(ch->refcnt);
    free(ch);
    return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector)
{
    emu_cq *c;
    (void)comp_vector;
    if (cqe < 1 || cqe > 65536) {
        errno = EINVAL;
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL || (c->ring = calloc((size_t)cqe, sizeof(*c->ring))) == NULL) {
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    c->size = cqe;
    c->cq.context = ctx;
    c->cq.channel = channel;
    c->cq.cq_context = cq_context;
    c->cq.cqe = cqe;
    pthread_mutex_init(&c->lock, NULL);
    return &c->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
    emu_cq *c = (emu_cq *)cq;
    pthread_mutex_destroy(&c->lock);
    free(c->ring);
    free(c);
    return 0;
}

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc)
{
    emu_cq *c = (emu_cq *)cq;
    int wake = 0;
    pthread_mutex_lock(&c->lock);
    if (c->count == c->size) {
        c->overflow = 1; /* real hardware: a CQ overrun, the QP's errors follow */
    } else {
        c->ring[(c->head + c->count) % c->size] = *wc;
        c->count++;
    }
    if (c->armed && cq->channel) {
        c->armed = 0;
        wake = 1;
    }
    pthread_mutex_unlock(&c->lock);
    if (wake && write(cq->channel->refcnt, &cq, sizeof(cq)) != sizeof(cq))
        abort(); /* the pipe holds far more events than a CQ can have armed */
}

static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    emu_cq *c = (emu_cq *)cq;
    int got = 0;
    pthread_mutex_lock(&c->lock);
    if (c->overflow) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    while (got < n && c->count > 0) {
        wc[got++] = c->ring[c->head];
        c->head = (c->head + 1) % c->size;
        c->count--;
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    emu_cq *c = (emu_cq *)cq;
    (void)solicited_only;
    pthread_mutex_lock(&c->lock);
    c->armed = 1;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
    struct ibv_cq *c; /* each event is the CQ's pointer, written by cq_push */
    if (read(ch->fd, &c, sizeof(c)) != sizeof(c)) {
        errno = EAGAIN;
        return -1;
    }
    *cq = c;
    *cq_context = c->cq_context;
    return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    (void)cq;
    (void)nevents;
}

/* ---- RC queue pairs ---- */

typedef struct emu_qp {
    struct ibv_qp qp;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    int access;            /* remote access the QP allows (INIT) */
    uint32_t dest_qpn;     /* RTR */
    enum ibv_mtu path_mtu; /* RTR */
    uint64_t posted;       /* work requests posted on it */
    struct emu_qp *next;   /* this process's QPs */
} emu_qp;

static emu_qp *qps;

EXPORT long long mg_verbs_emu_posted(uint32_t qpn);

/* For tests, not a verbs entry point: work requests posted on this process's QP `qpn`, or -1
 * when there is no such QP. */
EXPORT long long mg_verbs_emu_posted(uint32_t qpn)
{
    long long n = -1;
    pthread_mutex_lock(&lock);
    for (emu_qp *q = qps; q; q = q->next) {
        if (q->qp.qp_num == qpn)
            n = (long long)q->posted;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    shared_qp me = {0};
    emu_qp *q;
    if (pd == NULL || a == NULL || a->qp_type != IBV_QPT_RC || a->send_cq == NULL ||
        a->recv_cq == NULL || a->cap.max_send_wr < 1 || a->cap.max_send_wr > 4096 ||
        a->cap.max_send_sge < 1 || a->cap.max_send_sge > 4) {
        errno = EINVAL;
        return NULL;
    }
    q = calloc(1, sizeof(*q));
    if (q == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    q->qp.context = pd->context;
    q->qp.qp_context = a->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.state = IBV_QPS_RESET;
    me.pid = getpid();
    snprintf(me.dev, sizeof(me.dev), "%s", pd->context->device->name);
    q->qp.qp_num = claim("qp", 0xffffffu, &me, sizeof(me));
    if (q->qp.qp_num == 0) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->qp.handle = q->qp.qp_num;
    q->cap = a->cap;
    q->sq_sig_all = a->sq_sig_all;
    pthread_mutex_lock(&lock);
    q->next = qps;
    qps = q;
    pthread_mutex_unlock(&lock);
    return &q->qp;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    emu_qp *q = (emu_qp *)qp, **pp;
    unclaim("qp", qp->qp_num);
    pthread_mutex_lock(&lock);
    for (pp = &qps; *pp && *pp != q; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = q->next;
    pthread_mutex_unlock(&lock);
    free(q);
    return 0;
}

/* What RC needs for each transition (and allows). */
#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK                                                                    \
    (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK                                                                           \
    (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | \
     IBV_QP_MAX_QP_RD_ATOMIC)

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    emu_qp *q = (emu_qp *)qp;
    enum ibv_qp_state to;
    if (!(mask & IBV_QP_STATE))
        return EINVAL;
    to = attr->qp_state;
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
        qp->state = to;
        return 0;
    }
    if (qp->state == IBV_QPS_RESET && to == IBV_QPS_INIT) {
        if ((mask & INIT_MASK) != INIT_MASK || (mask & ~INIT_MASK) || attr->port_num != 1)
            return EINVAL;
        q->access = attr->qp_access_flags;
    } else if (qp->state == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        if ((mask & RTR_MASK) != RTR_MASK || !attr->ah_attr.is_global ||
            attr->ah_attr.port_num != 1 || attr->path_mtu < IBV_MTU_256 ||
            attr->path_mtu > IBV_MTU_4096 || attr->dest_qp_num == 0 || attr->dest_qp_num > 0xffffff)
            return EINVAL;
        q->dest_qpn = attr->dest_qp_num;
        q->path_mtu = attr->path_mtu;
    } else if (qp->state == IBV_QPS_RTR && to == IBV_QPS_RTS) {
        if ((mask & RTS_MASK) != RTS_MASK || attr->retry_cnt > 7 || attr->rnr_retry > 7 ||
            attr->timeout > 31)
            return EINVAL;
    } else {
        return EINVAL; /* not a transition RC allows */
    }
    qp->state = to;
    return 0;
}

/* The corruption switch (MG_VERBS_EMU_CORRUPT): when its file can be taken, the first byte that
 * landed — at the remote end of a WRITE, the local end of a READ — is flipped. */
static void corrupt(int write, pid_t pid, const struct iovec *local, const struct iovec *remote)
{
    const char *path = getenv("MG_VERBS_EMU_CORRUPT");
    uint8_t b;
    struct iovec one = {&b, 1}, at = {remote->iov_base, 1};
    if (path == NULL || *path == '\0' || local->iov_len == 0 || unlink(path) != 0)
        return;
    if (!write) {
        ((uint8_t *)local->iov_base)[0] ^= 0x20;
        return;
    }
    b = ((const uint8_t *)local->iov_base)[0] ^ 0x20;
    if (process_vm_writev(pid, &one, 1, &at, 1, 0) != 1)
        return; /* the transfer stands as it landed */
}

/* Runs one RDMA WRITE or READ; returns the completion status. */
static enum ibv_wc_status execute(emu_qp *q, const struct ibv_send_wr *wr, uint32_t *bytes)
{
    int write = wr->opcode == IBV_WR_RDMA_WRITE;
    uint64_t total = 0;
    shared_mr rm;
    shared_qp peer;
    struct iovec local[4], remote;
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ)
        return IBV_WC_LOC_QP_OP_ERR;
    if (wr->num_sge < 1 || wr->num_sge > (int)q->cap.max_send_sge)
        return IBV_WC_LOC_LEN_ERR;
    for (int i = 0; i < wr->num_sge; i++) {
        const struct ibv_sge *g = &wr->sg_list[i];
        if (local_ok(q->qp.pd, g->lkey, g->addr, g->length, write ? 0 : IBV_ACCESS_LOCAL_WRITE,
                     &local[i].iov_base) != 0)
            return IBV_WC_LOC_PROT_ERR;
        local[i].iov_len = g->length;
        total += g->length;
    }
    *bytes = (uint32_t)total;
    /* The responder: its QP must still exist, in a live process; the key must be one of its
     * device's. */
    if (lookup("qp", q->dest_qpn, &peer, sizeof(peer)) != 0 || !alive(peer.pid))
        return IBV_WC_RETRY_EXC_ERR;
    if (lookup("mr", wr->wr.rdma.rkey, &rm, sizeof(rm)) != 0 || rm.pid != peer.pid ||
        strcmp(rm.dev, peer.dev) != 0 ||
        !(rm.access & (write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ)) ||
        wr->wr.rdma.remote_addr < rm.addr || wr->wr.rdma.remote_addr + total < total ||
        wr->wr.rdma.remote_addr + total > rm.addr + rm.len)
        return IBV_WC_REM_ACCESS_ERR;
    remote.iov_base = (void *)(uintptr_t)(rm.mem + (wr->wr.rdma.remote_addr - rm.addr));
    remote.iov_len = total;
    if (total > 0) {
        ssize_t n =
            write ? process_vm_writev(peer.pid, local, (unsigned long)wr->num_sge, &remote, 1, 0)
                  : process_vm_readv(peer.pid, local, (unsigned long)wr->num_sge, &remote, 1, 0);
        if (n < 0 && errno == ESRCH)
            return IBV_WC_RETRY_EXC_ERR;
        if (n != (ssize_t)total)
            return IBV_WC_REM_OP_ERR;
        corrupt(write, peer.pid, &local[0], &remote);
    }
    return IBV_WC_SUCCESS;
}

static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    emu_qp *q = (emu_qp *)qp;
    for (; wr; wr = wr->next) {
        struct ibv_wc wc;
        uint32_t bytes = 0;
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
            *bad = wr;
            return EINVAL;
        }
        __atomic_fetch_add(&q->posted, 1, __ATOMIC_RELAXED);
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr->wr_id;
        wc.qp_num = qp->qp_num;
        wc.opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
        /* After an error every later work request is flushed, as on hardware. */
        wc.status = qp->state == IBV_QPS_ERR ? IBV_WC_WR_FLUSH_ERR : execute(q, wr, &bytes);
        wc.byte_len = wc.opcode == IBV_WC_RDMA_READ ? bytes : 0;
        if (wc.status != IBV_WC_SUCCESS)
            qp->state = IBV_QPS_ERR;
        if (wc.status != IBV_WC_SUCCESS || q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
            cq_push(qp->send_cq, &wc);
    }
    return 0;
}

static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)qp;
    *bad = wr;
    return EINVAL; /* moongate moves bytes with one-sided operations only */
}

EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    switch (status) {
    case IBV_WC_SUCCESS:
        return "success";
    case IBV_WC_LOC_LEN_ERR:
        return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
        return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR:
        return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
        return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR:
        return "remote access error";
    case IBV_WC_REM_OP_ERR:
        return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
        return "transport retry counter exceeded";
    default:
        return "unknown";
    }
}
