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
 *             range must be mapped (EFAULT otherwise), keys unique; MG_VERBS_EMU_MEMLOCK=bytes
 *             caps what one process may have registered at once (ENOMEM past it, as pinning
 *             past RLIMIT_MEMLOCK fails)
 *
 * The environment is read at every ibv_get_device_list.
 */
#include <infiniband/verbs.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
static uint32_t next_key = 0x1000;

typedef struct emu_mr {
    struct ibv_mr mr;
    int access;
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

EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
    struct ibv_device **list;
    pthread_mutex_lock(&lock);
    setup();
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

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
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
    registered += length;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.handle = next_key;
    m->mr.lkey = next_key++;
    m->mr.rkey = (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) ? next_key++ : 0;
    m->access = access;
    m->next = mrs;
    mrs = m;
    pthread_mutex_unlock(&lock);
    return &m->mr;
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
    pthread_mutex_unlock(&lock);
    free(m);
    return 0;
}
