/*
 * mg_rdma: libibverbs through dlopen (moongate/rdma.h). Nothing here links against the library;
 * every verbs call goes through `fn`, the table filled from the loaded library.
 */
#include "moongate/rdma.h"

#include "moongate/mg_error.h"

#include "mg_time.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *ch, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    const char *(*wc_status_str)(enum ibv_wc_status status);
    /* optional (rdma-core 34 and later): NULL when the library lacks it */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                    int fd, int access);
} verbs_fn;

typedef struct dev {
    mg_rdma_device_info info;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    int gid_index;
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
    SYM(get_device_list),
    SYM(free_device_list),
    SYM(get_device_name),
    SYM(open_device),
    SYM(close_device),
    SYM(query_device),
    SYM(query_port),
    SYM(query_gid),
    SYM(alloc_pd),
    SYM(dealloc_pd),
    SYM(reg_mr),
    SYM(dereg_mr),
    SYM(create_comp_channel),
    SYM(destroy_comp_channel),
    SYM(create_cq),
    SYM(destroy_cq),
    SYM(get_cq_event),
    SYM(ack_cq_events),
    SYM(create_qp),
    SYM(modify_qp),
    SYM(destroy_qp),
    SYM(wc_status_str),
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
    d->mtu = pa.active_mtu;
    d->gid_index = gid_index;
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
    d->gid = gid;
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
    r->fn.reg_dmabuf_mr =
        (struct ibv_mr * (*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))
            dlsym(r->lib, "ibv_reg_dmabuf_mr");
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

/* A registration that failed on a device (errno e): rolled back, counted, the error mapped. */
static int reg_failed(mg_rdma *r, mg_rdma_mr *m, int e)
{
    mg_rdma_dereg(m); /* the devices done so far */
    pthread_mutex_lock(&r->lock);
    r->stats.reg_failed++;
    pthread_mutex_unlock(&r->lock);
    return e == ENOMEM                 ? MG_ERR_NOMEM
           : e == EPERM || e == EAGAIN ? MG_ERR_PERMISSION
           : e == EOPNOTSUPP           ? MG_ERR_UNSUPPORTED
                                       : MG_ERR_SYSTEM;
}

static void reg_counted(mg_rdma *r, size_t len)
{
    pthread_mutex_lock(&r->lock);
    r->stats.mrs++;
    r->stats.mr_bytes += len;
    r->stats.reg_total++;
    pthread_mutex_unlock(&r->lock);
}

/* What to register: memory at addr, or (fd >= 0) a dma-buf's range named by iova. */
typedef struct reg_src {
    void *addr;
    int fd;
    uint64_t offset, iova;
} reg_src;

static void reg_why(const mg_rdma *r, int i, const reg_src *src, size_t len, int e, char *why,
                    size_t whycap)
{
    const char *hint = "";
    if (src->fd >= 0 && e == EOPNOTSUPP)
        hint = " (its provider takes no dma-buf)";
    else if (src->fd < 0 && (e == ENOMEM || e == EPERM || e == EAGAIN))
        hint = " (is the memlock limit high enough? ulimit -l, LimitMEMLOCK)";
    snprintf(why, whycap, "device %s: %s of %zu bytes: %s%s", r->devs[i].info.name,
             src->fd >= 0 ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr", len, strerror(e), hint);
}

/* Registers src with every device, all or nothing. A dma-buf is offered to every device even
 * after one refused it, so that the refusal says what each device's provider answered. */
static int reg_all(mg_rdma *r, const reg_src *src, size_t len, int remote, mg_rdma_mr **out,
                   char *why, size_t whycap)
{
    int access = IBV_ACCESS_LOCAL_WRITE, errs[MG_RDMA_MAX_DEVICES] = {0};
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
        struct ibv_pd *pd = r->devs[i].pd;
        m->mr[i] = src->fd < 0
                       ? r->fn.reg_mr(pd, src->addr, len, access)
                       : r->fn.reg_dmabuf_mr(pd, src->offset, len, src->iova, src->fd, access);
        errs[i] = m->mr[i] == NULL ? (errno ? errno : EIO) : 0;
        if (m->mr[i] == NULL && src->fd < 0) {
            reg_why(r, i, src, len, errs[i], why, whycap);
            return reg_failed(r, m, errs[i]);
        }
    }
    if (src->fd >= 0) { /* each provider decides on a dma-buf: the answer names every device */
        size_t at = 0;
        int e = 0;
        for (int i = 0; i < r->ndevs && at < whycap; i++) {
            char one[200];
            if (m->mr[i] == NULL) {
                e = e ? e : errs[i];
                reg_why(r, i, src, len, errs[i], one, sizeof(one));
            } else {
                snprintf(one, sizeof(one), "device %s: took it", r->devs[i].info.name);
            }
            at += (size_t)snprintf(why + at, whycap - at, "%s%s", i ? "; " : "", one);
        }
        if (e != 0)
            return reg_failed(r, m, e);
    }
    reg_counted(r, len);
    *out = m;
    return 0;
}

int mg_rdma_reg(mg_rdma *r, void *addr, size_t len, int remote, mg_rdma_mr **out, char *why,
                size_t whycap)
{
    reg_src src = {.addr = addr, .fd = -1};
    return reg_all(r, &src, len, remote, out, why, whycap);
}

int mg_rdma_has_dmabuf(const mg_rdma *r)
{
    return r->fn.reg_dmabuf_mr != NULL;
}

int mg_rdma_reg_dmabuf(mg_rdma *r, int fd, uint64_t offset, size_t len, uint64_t iova, int remote,
                       mg_rdma_mr **out, char *why, size_t whycap)
{
    reg_src src = {.fd = fd, .offset = offset, .iova = iova};
    *out = NULL;
    if (r->fn.reg_dmabuf_mr == NULL) {
        snprintf(why, whycap, "%s has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)",
                 r->lib_name);
        return MG_ERR_UNSUPPORTED;
    }
    if (fd < 0) {
        snprintf(why, whycap, "no dma-buf descriptor");
        return MG_ERR_INVALID;
    }
    return reg_all(r, &src, len, remote, out, why, whycap);
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

/* ---- connections ---- */

/* QP settings: local ACK timeout 4.096 us x 2^14 = 67 ms, 7 retries: a peer that is gone is a
 * retry-exceeded completion after about half a second, well inside any request's deadline. */
#define QP_TIMEOUT 14
#define QP_RETRY   7
#define QP_MAX_WR  128
#define BUSY_POLLS 2000 /* empty polls before sleeping on the completion channel */

struct mg_rdma_conn {
    mg_rdma *r;
    int dev;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    unsigned nqps;
    struct ibv_qp *qp[MG_RDMA_MAX_QPS];
    uint32_t psn[MG_RDMA_MAX_QPS];
    int broken; /* atomic: see mark_broken */
};

/*
 * A connection is broken for good once a mover fails on it (its QPs go to ERR) or its set-up
 * failed. Movers take turns on a connection under their line's lock, but the loop reads the
 * flag without it, when a job that used the connection ends (the peer directory retires a
 * broken one), while another job may be failing it on a worker: an atomic, relaxed. Readers
 * rely on nothing written before it: the flag says "use no more", and the connection is
 * deleted only once every job holding it came back through its completion queue, which orders
 * all the rest.
 */
static void mark_broken(mg_rdma_conn *c)
{
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELAXED);
}

static void stat_add(mg_rdma *r, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&r->lock);
    *field += n;
    pthread_mutex_unlock(&r->lock);
}

static enum ibv_mtu mtu_enum(uint32_t bytes)
{
    enum ibv_mtu m = IBV_MTU_256;
    while (m < IBV_MTU_4096 && (256u << (m - IBV_MTU_256)) < bytes)
        m++;
    return m;
}

int mg_rdma_conn_new(mg_rdma *r, int devi, unsigned nqps, mg_rdma_conn **out, mg_rdma_ep *local,
                     char *why, size_t whycap)
{
    dev *d = &r->devs[devi];
    mg_rdma_conn *c;
    *out = NULL;
    if (devi < 0 || devi >= r->ndevs || nqps < 1 || nqps > MG_RDMA_MAX_QPS) {
        snprintf(why, whycap, "bad device %d or QP count %u", devi, nqps);
        return MG_ERR_INVALID;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(why, whycap, "out of memory");
        return MG_ERR_NOMEM;
    }
    c->r = r;
    c->dev = devi;
    c->ch = r->fn.create_comp_channel(d->ctx);
    if (c->ch)
        c->cq = r->fn.create_cq(d->ctx, (int)(nqps * QP_MAX_WR), c, c->ch, 0);
    if (c->cq == NULL) {
        snprintf(why, whycap, "device %s: cannot create a completion queue: %s", d->info.name,
                 strerror(errno));
        goto fail;
    }
    memset(local, 0, sizeof(*local));
    memcpy(local->gid, d->gid.raw, 16);
    local->lid = d->info.lid;
    local->mtu = d->info.mtu;
    local->nqps = nqps;
    for (unsigned i = 0; i < nqps; i++) {
        struct ibv_qp_init_attr ia;
        struct ibv_qp_attr a;
        memset(&ia, 0, sizeof(ia));
        ia.send_cq = c->cq;
        ia.recv_cq = c->cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = QP_MAX_WR;
        ia.cap.max_recv_wr = 1;
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        c->qp[i] = r->fn.create_qp(d->pd, &ia);
        if (c->qp[i] == NULL) {
            snprintf(why, whycap, "device %s: cannot create a queue pair: %s", d->info.name,
                     strerror(errno));
            goto fail;
        }
        c->nqps = i + 1;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = d->info.port;
        a.qp_access_flags =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
        if (r->fn.modify_qp(c->qp[i], &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
            0) {
            snprintf(why, whycap, "device %s: queue pair to INIT refused", d->info.name);
            goto fail;
        }
        if (getrandom(&c->psn[i], sizeof(c->psn[i]), 0) != sizeof(c->psn[i]))
            c->psn[i] = (uint32_t)i * 7919u;
        c->psn[i] &= 0xffffff;
        local->qpn[i] = c->qp[i]->qp_num;
        local->psn[i] = c->psn[i];
    }
    stat_add(r, &r->stats.conns, 1);
    *out = c;
    return 0;
fail:
    mark_broken(c);
    stat_add(r, &r->stats.conns, 1); /* mg_rdma_conn_del takes it back */
    mg_rdma_conn_del(c);
    return MG_ERR_SYSTEM;
}

int mg_rdma_conn_connect(mg_rdma_conn *c, const mg_rdma_ep *remote, char *why, size_t whycap)
{
    dev *d = &c->r->devs[c->dev];
    uint32_t mtu = remote->mtu < d->info.mtu ? remote->mtu : d->info.mtu;
    if (remote->nqps != c->nqps) {
        snprintf(why, whycap, "the peer has %u queue pairs for our %u", remote->nqps, c->nqps);
        return MG_ERR_PROTOCOL;
    }
    for (unsigned i = 0; i < c->nqps; i++) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = mtu_enum(mtu);
        a.dest_qp_num = remote->qpn[i];
        a.rq_psn = remote->psn[i];
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = remote->lid;
        a.ah_attr.port_num = d->info.port;
        if (c->r->fn.modify_qp(c->qp[i], &a,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_MIN_RNR_TIMER) != 0) {
            snprintf(why, whycap, "device %s: queue pair to RTR refused (peer QPN %u)",
                     d->info.name, remote->qpn[i]);
            mark_broken(c);
            return MG_ERR_PROTOCOL;
        }
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTS;
        a.timeout = QP_TIMEOUT;
        a.retry_cnt = QP_RETRY;
        a.rnr_retry = QP_RETRY;
        a.sq_psn = c->psn[i];
        a.max_rd_atomic = 16;
        if (c->r->fn.modify_qp(c->qp[i], &a,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
            snprintf(why, whycap, "device %s: queue pair to RTS refused", d->info.name);
            mark_broken(c);
            return MG_ERR_PROTOCOL;
        }
    }
    return 0;
}

void mg_rdma_conn_del(mg_rdma_conn *c)
{
    if (c == NULL)
        return;
    for (unsigned i = 0; i < c->nqps; i++)
        c->r->fn.destroy_qp(c->qp[i]);
    if (c->cq)
        c->r->fn.destroy_cq(c->cq);
    if (c->ch)
        c->r->fn.destroy_comp_channel(c->ch);
    pthread_mutex_lock(&c->r->lock);
    c->r->stats.conns--;
    pthread_mutex_unlock(&c->r->lock);
    free(c);
}

int mg_rdma_conn_broken(const mg_rdma_conn *c)
{
    return __atomic_load_n(&c->broken, __ATOMIC_RELAXED); /* see mark_broken */
}

static int verbs_err(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return MG_ERR_UNAVAILABLE;
    case IBV_WC_REM_ACCESS_ERR:
        return MG_ERR_NOT_FOUND;
    default:
        return MG_ERR_PROTOCOL;
    }
}

/* Waits for completions on any of the connections: polls them, then sleeps on their channels in
 * steps of 100 ms while stop is clear and before `until`. Returns how many it got (>= 0) into
 * wc with *which set to the connection they came from, or -1 when a CQ failed. */
static int wait_cqs(mg_rdma_conn *const *cs, unsigned nc, struct ibv_wc *wc, int n, unsigned *which,
                    const int *stop, uint64_t until)
{
    int got;
    for (int spin = 0; spin < BUSY_POLLS; spin++) {
        for (unsigned k = 0; k < nc; k++) {
            if ((got = ibv_poll_cq(cs[k]->cq, n, wc)) != 0) {
                *which = k;
                return got;
            }
        }
    }
    for (;;) {
        struct pollfd pfd[MG_RDMA_MAX_DEVICES];
        for (unsigned k = 0; k < nc; k++) {
            if (ibv_req_notify_cq(cs[k]->cq, 0) != 0)
                return -1;
            pfd[k] = (struct pollfd){cs[k]->ch->fd, POLLIN, 0};
        }
        for (unsigned k = 0; k < nc; k++) { /* what came before the arming */
            if ((got = ibv_poll_cq(cs[k]->cq, n, wc)) != 0) {
                *which = k;
                return got;
            }
        }
        if ((stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) || mg_now_mono_ms() >= until)
            return 0;
        if (poll(pfd, nc, 100) > 0) {
            for (unsigned k = 0; k < nc; k++) {
                struct ibv_cq *cq;
                void *ctx;
                if ((pfd[k].revents & POLLIN) &&
                    cs[k]->r->fn.get_cq_event(cs[k]->ch, &cq, &ctx) == 0)
                    cs[k]->r->fn.ack_cq_events(cq, 1);
            }
        }
        for (unsigned k = 0; k < nc; k++) {
            if ((got = ibv_poll_cq(cs[k]->cq, n, wc)) != 0) {
                *which = k;
                return got;
            }
        }
    }
}

/* After a failure or a stop: the QPs go to ERR so the hardware flushes what was posted, and
 * those completions are collected, so no slice is still moving when the caller lets go of the
 * memory. */
static void flush(mg_rdma_conn *const *cs, unsigned nc, unsigned *outstanding)
{
    struct ibv_wc wc[32];
    uint64_t until = mg_now_mono_ms() + 2000;
    unsigned left = 0, k;
    for (k = 0; k < nc; k++) {
        mark_broken(cs[k]);
        left += outstanding[k];
        for (unsigned i = 0; i < cs[k]->nqps; i++) {
            struct ibv_qp_attr a;
            memset(&a, 0, sizeof(a));
            a.qp_state = IBV_QPS_ERR;
            cs[k]->r->fn.modify_qp(cs[k]->qp[i], &a, IBV_QP_STATE);
        }
    }
    while (left > 0 && mg_now_mono_ms() < until) {
        int got = wait_cqs(cs, nc, wc, 32, &k, NULL, until);
        if (got < 0)
            break;
        left -= (unsigned)got < left ? (unsigned)got : left;
    }
}

int mg_rdma_move_multi(mg_rdma_conn *const *cs, unsigned nc, const mg_rdma_op *op,
                       const uint32_t *lkeys, const uint32_t *rkeys, uint32_t slice,
                       unsigned window, const int *stop, uint64_t *progress, uint32_t wait_ms,
                       char *why, size_t whycap)
{
    struct ibv_wc wc[32];
    uint64_t next = 0, done = 0;
    unsigned outstanding[MG_RDMA_MAX_DEVICES] = {0}, qi[MG_RDMA_MAX_DEVICES] = {0}, which = 0;
    int rc = 0, failed_status = -1;
    mg_rdma *r = cs[0]->r;
    if (nc < 1 || nc > MG_RDMA_MAX_DEVICES) {
        snprintf(why, whycap, "%u RDMA connections", nc);
        return MG_ERR_INVALID;
    }
    if (slice == 0)
        slice = 1u << 20;
    if (window == 0 || window > QP_MAX_WR)
        window = QP_MAX_WR;
    for (unsigned k = 0; k < nc; k++) {
        if (mg_rdma_conn_broken(cs[k])) {
            snprintf(why, whycap, "the RDMA connection on device %s failed earlier",
                     r->devs[cs[k]->dev].info.name);
            return MG_ERR_UNAVAILABLE;
        }
    }
    while (done < op->len) {
        int got;
        /* Slices in turn over the connections (devices), and over each one's QPs, until
         * every window is full or nothing is left to post. */
        for (int posted = 1; posted && next < op->len;) {
            posted = 0;
            for (unsigned k = 0; k < nc && next < op->len; k++) {
                mg_rdma_conn *c = cs[k];
                uint64_t n = op->len - next < slice ? op->len - next : slice;
                struct ibv_sge sge = {(uintptr_t)op->local + next, (uint32_t)n, lkeys[k]};
                struct ibv_send_wr wr, *bad = NULL;
                if (outstanding[k] >= window * c->nqps)
                    continue;
                memset(&wr, 0, sizeof(wr));
                wr.wr_id = n;
                wr.sg_list = &sge;
                wr.num_sge = 1;
                wr.opcode = op->write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
                wr.send_flags = IBV_SEND_SIGNALED;
                wr.wr.rdma.remote_addr = op->remote_addr + next;
                wr.wr.rdma.rkey = rkeys[k];
                if (ibv_post_send(c->qp[qi[k]], &wr, &bad) != 0) {
                    snprintf(why, whycap, "device %s: ibv_post_send refused the work request",
                             r->devs[c->dev].info.name);
                    flush(cs, nc, outstanding);
                    return MG_ERR_PROTOCOL;
                }
                qi[k] = (qi[k] + 1) % c->nqps;
                outstanding[k]++;
                next += n;
                posted = 1;
                stat_add(r, &r->stats.wr_posted, 1);
            }
        }
        if (stop && (rc = __atomic_load_n(stop, __ATOMIC_ACQUIRE)) != 0) {
            snprintf(why, whycap, "stopped (%s)", mg_strerror(rc));
            flush(cs, nc, outstanding);
            return rc;
        }
        got = wait_cqs(cs, nc, wc, 32, &which, stop, mg_now_mono_ms() + wait_ms);
        if (got < 0) {
            snprintf(why, whycap, "an RDMA completion queue failed");
            flush(cs, nc, outstanding);
            return MG_ERR_PROTOCOL;
        }
        if (got == 0 && !(stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE))) {
            snprintf(why, whycap, "no RDMA completion within %u ms", wait_ms);
            flush(cs, nc, outstanding);
            return MG_ERR_UNAVAILABLE;
        }
        for (int i = 0; i < got; i++) {
            outstanding[which]--;
            if (wc[i].status != IBV_WC_SUCCESS) {
                if (failed_status < 0)
                    failed_status = (int)wc[i].status;
                continue;
            }
            done += wc[i].wr_id;
            if (progress)
                __atomic_fetch_add(progress, wc[i].wr_id, __ATOMIC_RELAXED);
        }
        if (failed_status >= 0) {
            const char *st = r->fn.wc_status_str((enum ibv_wc_status)failed_status);
            snprintf(why, whycap, "RDMA %s on device %s: %s (status %d)",
                     op->write ? "WRITE" : "READ", r->devs[cs[which]->dev].info.name, st ? st : "?",
                     failed_status);
            stat_add(r, &r->stats.wr_failed, 1);
            flush(cs, nc, outstanding);
            return verbs_err((enum ibv_wc_status)failed_status);
        }
    }
    stat_add(r, op->write ? &r->stats.bytes_written : &r->stats.bytes_read, op->len);
    return 0;
}

int mg_rdma_move(mg_rdma_conn *c, const mg_rdma_op *op, uint32_t slice, unsigned window,
                 const int *stop, uint64_t *progress, uint32_t wait_ms, char *why, size_t whycap)
{
    return mg_rdma_move_multi(&c, 1, op, &op->lkey, &op->rkey, slice, window, stop, progress,
                              wait_ms, why, whycap);
}
