/*
 * mg_rdma: libibverbs through dlopen (moongate/rdma.h). Nothing here links against the library;
 * every verbs call goes through `fn`, the table filled from the loaded library.
 */
#include "moongate/rdma.h"

#include "moongate/mg_error.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The exported functions used; ibv_query_port is the exported (compat) entry the header's
 * inline wrapper falls back to, which fills the leading fields of struct ibv_port_attr. */
typedef struct verbs_fn {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
} verbs_fn;

typedef struct dev {
    mg_rdma_device_info info;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
} dev;

struct mg_rdma {
    void *lib;
    char lib_name[256];
    verbs_fn fn;
    dev devs[MG_RDMA_MAX_DEVICES];
    int ndevs;
    pthread_mutex_t lock; /* stats */
    mg_rdma_stats stats;
};

struct mg_rdma_mr {
    mg_rdma *r;
    size_t len;
    struct ibv_mr *mr[MG_RDMA_MAX_DEVICES];
};

#define SYM(name)                              \
    {                                          \
        "ibv_" #name, offsetof(verbs_fn, name) \
    }

static const struct {
    const char *name;
    size_t off;
} syms[] = {
    SYM(get_device_list), SYM(free_device_list), SYM(get_device_name), SYM(open_device),
    SYM(close_device),    SYM(query_device),     SYM(query_port),      SYM(query_gid),
    SYM(alloc_pd),        SYM(dealloc_pd),       SYM(reg_mr),          SYM(dereg_mr),
};

static unsigned mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 256u << (m - IBV_MTU_256) : 0;
}

/* Is `name` in the comma-separated list? */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && memcmp(p, name, n) == 0)
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static void dev_close(mg_rdma *r, dev *d)
{
    if (d->pd)
        r->fn.dealloc_pd(d->pd);
    if (d->ctx)
        r->fn.close_device(d->ctx);
    memset(d, 0, sizeof(*d));
}

/* Opens device `ibdev`: its first active port, the GID, a protection domain. Returns 0, or -1
 * with why. */
static int dev_open(mg_rdma *r, struct ibv_device *ibdev, int gid_index, dev *d, char *why,
                    size_t whycap)
{
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    union ibv_gid gid;
    const char *name = r->fn.get_device_name(ibdev);
    memset(d, 0, sizeof(*d));
    snprintf(d->info.name, sizeof(d->info.name), "%s", name ? name : "?");
    d->ctx = r->fn.open_device(ibdev);
    if (d->ctx == NULL) {
        snprintf(why, whycap, "device %s: cannot open it: %s", d->info.name, strerror(errno));
        return -1;
    }
    if (r->fn.query_device(d->ctx, &da) != 0) {
        snprintf(why, whycap, "device %s: ibv_query_device: %s", d->info.name, strerror(errno));
        goto fail;
    }
    for (unsigned p = 1; p <= da.phys_port_cnt && d->info.port == 0; p++) {
        memset(&pa, 0, sizeof(pa));
        if (r->fn.query_port(d->ctx, (uint8_t)p, (struct _compat_ibv_port_attr *)&pa) == 0 &&
            pa.state == IBV_PORT_ACTIVE)
            d->info.port = (uint8_t)p;
    }
    if (d->info.port == 0) {
        snprintf(why, whycap, "device %s: no active port (of %u)", d->info.name,
                 (unsigned)da.phys_port_cnt);
        goto fail;
    }
    memset(&pa, 0, sizeof(pa));
    r->fn.query_port(d->ctx, d->info.port, (struct _compat_ibv_port_attr *)&pa);
    d->info.mtu = mtu_bytes(pa.active_mtu);
    d->info.lid = pa.lid;
    d->info.roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    d->info.max_msg_size = pa.max_msg_sz;
    d->info.max_mr_size = da.max_mr_size;
    d->info.max_qp_wr = da.max_qp_wr;
    if (gid_index < 0 || gid_index >= pa.gid_tbl_len ||
        r->fn.query_gid(d->ctx, d->info.port, gid_index, &gid) != 0) {
        snprintf(why, whycap, "device %s: no GID at index %d (--rdma-gid-index; the port has %d)",
                 d->info.name, gid_index, pa.gid_tbl_len);
        goto fail;
    }
    inet_ntop(AF_INET6, gid.raw, d->info.gid, sizeof(d->info.gid));
    d->pd = r->fn.alloc_pd(d->ctx);
    if (d->pd == NULL) {
        snprintf(why, whycap, "device %s: ibv_alloc_pd: %s", d->info.name, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    dev_close(r, d);
    return -1;
}

int mg_rdma_open(mg_rdma **out, const mg_rdma_config *cfg, char *why, size_t whycap)
{
    const char *lib = cfg->lib && cfg->lib[0] ? cfg->lib : "libibverbs.so.1";
    const char *want = cfg->devices ? cfg->devices : "";
    struct ibv_device **list = NULL;
    char skipped[256] = "";
    int n = 0;
    mg_rdma *r;
    *out = NULL;
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        snprintf(why, whycap, "out of memory");
        return MG_ERR_NOMEM;
    }
    snprintf(r->lib_name, sizeof(r->lib_name), "%s", lib);
    pthread_mutex_init(&r->lock, NULL);
    r->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (r->lib == NULL) {
        const char *e = dlerror();
        snprintf(why, whycap, "cannot load %s: %s", lib, e ? e : "?");
        goto fail;
    }
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(r->lib, syms[i].name);
        if (f == NULL) {
            snprintf(why, whycap, "%s has no %s", lib, syms[i].name);
            goto fail;
        }
        memcpy((char *)&r->fn + syms[i].off, &f, sizeof(f));
    }
    errno = 0;
    list = r->fn.get_device_list(&n);
    if (list == NULL) {
        snprintf(why, whycap, "no RDMA support in this kernel (ibv_get_device_list: %s)",
                 strerror(errno ? errno : ENOSYS));
        goto fail;
    }
    for (int i = 0; i < n && r->ndevs < MG_RDMA_MAX_DEVICES; i++) {
        const char *name = r->fn.get_device_name(list[i]);
        char reason[256];
        if (want[0] && (name == NULL || !listed(want, name)))
            continue;
        if (dev_open(r, list[i], cfg->gid_index, &r->devs[r->ndevs], reason, sizeof(reason)) == 0)
            r->ndevs++;
        else if (skipped[0] == '\0')
            snprintf(skipped, sizeof(skipped), "%s", reason);
    }
    if (want[0]) { /* every device asked for must be there and usable */
        for (const char *p = want; *p;) {
            size_t len = strcspn(p, ",");
            int found = 0;
            for (int i = 0; i < r->ndevs; i++)
                found |= strlen(r->devs[i].info.name) == len &&
                         memcmp(r->devs[i].info.name, p, len) == 0;
            if (!found) {
                snprintf(why, whycap, "device %.*s (--rdma-devices) %s%s", (int)len, p,
                         skipped[0] ? "is not usable: " : "not found", skipped[0] ? skipped : "");
                goto fail;
            }
            p += len;
            if (*p == ',')
                p++;
        }
    }
    r->fn.free_device_list(list);
    list = NULL;
    if (r->ndevs == 0) {
        if (skipped[0])
            snprintf(why, whycap, "no usable RDMA device: %s", skipped);
        else
            snprintf(why, whycap, "no RDMA devices");
        goto fail;
    }
    *out = r;
    return 0;
fail:
    if (list)
        r->fn.free_device_list(list);
    mg_rdma_close(r);
    return MG_ERR_UNAVAILABLE;
}

void mg_rdma_close(mg_rdma *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < r->ndevs; i++)
        dev_close(r, &r->devs[i]);
    if (r->lib)
        dlclose(r->lib);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

int mg_rdma_device_count(const mg_rdma *r)
{
    return r ? r->ndevs : 0;
}

void mg_rdma_device(const mg_rdma *r, int i, mg_rdma_device_info *out)
{
    *out = r->devs[i].info;
}

const char *mg_rdma_lib(const mg_rdma *r)
{
    return r->lib_name;
}

int mg_rdma_reg(mg_rdma *r, void *addr, size_t len, int remote, mg_rdma_mr **out, char *why,
                size_t whycap)
{
    int access = IBV_ACCESS_LOCAL_WRITE;
    mg_rdma_mr *m = calloc(1, sizeof(*m));
    *out = NULL;
    if (m == NULL) {
        snprintf(why, whycap, "out of memory");
        return MG_ERR_NOMEM;
    }
    if (remote)
        access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    m->r = r;
    m->len = len;
    for (int i = 0; i < r->ndevs; i++) {
        m->mr[i] = r->fn.reg_mr(r->devs[i].pd, addr, len, access);
        if (m->mr[i] == NULL) {
            int e = errno;
            snprintf(why, whycap, "device %s: ibv_reg_mr of %zu bytes: %s%s", r->devs[i].info.name,
                     len, strerror(e),
                     e == ENOMEM || e == EPERM || e == EAGAIN
                         ? " (is the memlock limit high enough? ulimit -l, LimitMEMLOCK)"
                         : "");
            mg_rdma_dereg(m); /* the devices done so far */
            pthread_mutex_lock(&r->lock);
            r->stats.reg_failed++;
            pthread_mutex_unlock(&r->lock);
            return e == ENOMEM                 ? MG_ERR_NOMEM
                   : e == EPERM || e == EAGAIN ? MG_ERR_PERMISSION
                                               : MG_ERR_SYSTEM;
        }
    }
    pthread_mutex_lock(&r->lock);
    r->stats.mrs++;
    r->stats.mr_bytes += len;
    r->stats.reg_total++;
    pthread_mutex_unlock(&r->lock);
    *out = m;
    return 0;
}

void mg_rdma_dereg(mg_rdma_mr *m)
{
    int all = 1;
    if (m == NULL)
        return;
    for (int i = 0; i < m->r->ndevs; i++) {
        if (m->mr[i])
            m->r->fn.dereg_mr(m->mr[i]);
        else
            all = 0;
    }
    if (all) { /* a complete registration was counted */
        pthread_mutex_lock(&m->r->lock);
        m->r->stats.mrs--;
        m->r->stats.mr_bytes -= m->len;
        pthread_mutex_unlock(&m->r->lock);
    }
    free(m);
}

uint32_t mg_rdma_mr_lkey(const mg_rdma_mr *m, int i)
{
    return m->mr[i]->lkey;
}

uint32_t mg_rdma_mr_rkey(const mg_rdma_mr *m, int i)
{
    return m->mr[i]->rkey;
}

void mg_rdma_get_stats(mg_rdma *r, mg_rdma_stats *out)
{
    pthread_mutex_lock(&r->lock);
    *out = r->stats;
    pthread_mutex_unlock(&r->lock);
}
