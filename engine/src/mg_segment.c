/*
 * mg_segment: the segment registry (see moongate/segment.h).
 *
 * Storage: two chained hash tables of fixed size (a power of two >= max_segments), one by id and
 * one by (tenant, name), plus a list of all segments. The id table is common/mg_idmap.h, shared
 * with the pools, which mints the ids: a bijective 64-bit mix of a counter that starts at a
 * random value, so they are unique, never 0 and not guessable from one another.
 * The mutex guards the tables, the list, the counters and each segment's state and refs; it is
 * held for O(1) work except in mg_registry_list (O(n), n <= max_segments).
 *
 * Files the daemon creates are named "moongate-seg-<id>" in shm_dir; a client's shm file may not
 * use that prefix. Every file is opened relative to shm_dir's descriptor without following
 * symbolic links, must be a regular file with one link, and is mapped MAP_SHARED. A client's
 * file must belong to the caller's uid (the daemon opens it with its own rights), and a third
 * hash table by (st_dev, st_ino) keeps one file to one tenant: whatever name, link or rename
 * reaches an inode, a tenant other than the one that registered it first is refused.
 *
 * Segments registered with the registering process's address of them (client_addr) are also in
 * an array sorted by (pid, start time, address), searched by halving: mg_registry_resolve turns
 * a process's address into a segment and offset, and a new range of a process is checked there
 * against the ranges it has.
 *
 * A descriptor a client passed (MG_SEG_FD) needs no name and no owner check: holding it open
 * for reading and writing is the right to its bytes. The worker checks what it is, maps the
 * range asked for (from the page it starts in) and closes it, like every other source.
 */
#include "moongate/segment.h"
#include "moongate/fault.h"
#include "moongate/dataframe.h"
#include "moongate/procmem.h"
#include "moongate/rdma.h"

#include "mg_hash.h"
#include "mg_idmap.h"
#include "mg_list.h"
#include "mg_log.h"
#include "mg_str.h"
#include "moongate/engine.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define FILE_PREFIX "moongate-seg-"
#define CHUNK       (8ULL << 20) /* bytes locked, prefaulted or unmapped at a time */

struct mg_segment {
    mg_registry *reg;
    mg_idmap_node idn; /* its id, in the registry's id map */
    char tenant[MG_SEG_NAME_MAX + 1];
    char name[MG_SEG_NAME_MAX + 1];
    char file[MG_SEG_NAME_MAX + 1]; /* name inside shm_dir */
    char request_id[MG_SEG_NAME_MAX + 1];
    char location[16];
    mg_seg_source source;
    uint64_t size;        /* 0 for an shm or fd segment of unknown size until mapped */
    uint64_t offset;      /* fd: where the segment starts in the file */
    uint64_t client_addr; /* where the registering process has it (0: not known) */
    uint64_t order;       /* the registry's count of segments entered, when it was */
    mg_proc client;
    int in_addrs;   /* in reg->addrs */
    mg_procmem *pm; /* process: its process, once mapped */
    int remote_accessible;
    mg_memlock memlock;
    int prefault;
    mg_seg_state state;
    uint32_t refs;
    mg_seg_transport transports[MG_TRANSPORT_COUNT];
    mg_rdma_mr *mr;                 /* its registration with the RDMA devices */
    int cancel;                     /* set by mg_segment_cancel (any thread), read between chunks */
    char holder[MG_SEG_HOLDER_MAX]; /* who took the latest reference */
    int fd;
    uint32_t caller_uid; /* shm: who asked (mg_segment_spec.caller_uid) */
    int has_file_id;     /* dev and ino are set and the segment is in by_file */
    dev_t dev;
    ino_t ino;
    void *addr;     /* the segment's first byte */
    void *map_base; /* the mapping: addr rounded down to its page, or to a huge page */
    uint64_t map_len;
    uint64_t page; /* the mapping's page size: the system's, or a hugetlbfs file's */
    int locked;
    int created;     /* the daemon created the file: it removes it */
    int provisioned; /* not counted in its tenant's bytes (mg_segment_spec.provisioned) */
    char share[MG_SEG_SHARE_LEN + 1]; /* other tenants that may use it, "a,b", or "" */
    char error[MG_SEG_ERROR_MAX];
    struct mg_segment *name_next, *req_next, *file_next; /* hash chains */
    struct mg_segment *prev, *next;                      /* all segments */
};

/* Segments and bytes entered per tenant, for max_tenant_segments and max_tenant_bytes. A list:
 * tenants are few. */
typedef struct tenant_count {
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t segments;
    uint64_t bytes;
    struct tenant_count *next;
} tenant_count;

struct mg_registry {
    pthread_mutex_t lock;
    char *shm_dir;
    int dirfd;
    unsigned file_mode;
    unsigned file_gid;
    uint64_t max_segments, max_bytes, max_segment_bytes, max_tenant_segments, max_tenant_bytes;
    mg_rdma *rdma;
    mg_register_gate_fn gate; /* a test hook (mg_registry_set_gate) */
    void *gate_arg;
    tenant_count *tenants;
    size_t nbuckets;
    mg_idmap ids;
    mg_segment **by_name, **by_req, **by_file;
    mg_segment *all;
    mg_segment **addrs; /* segments with a client address, by (pid, start, client_addr) */
    size_t naddrs, addrs_cap;
    uint64_t jobs, jobs_off_worker; /* mg_segment_map/unmap calls, and those off a worker */
    uint64_t count, ready, registering, bytes, locked_bytes;
    uint64_t entered; /* segments entered so far: their order (mg_region.order) */
};

const char *const mg_transport_names[MG_TRANSPORT_COUNT] = {"tcp", "rdma"};

/* ------------------------------------------------------------------ helpers */

int mg_bounds_check(uint64_t size, uint64_t offset, uint64_t length)
{
    if (offset > size || length > size - offset)
        return MG_ERR_RANGE;
    return 0;
}

static int valid_name(const char *s, int allow_colon)
{
    size_t n = 0;
    if (s == NULL)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || (allow_colon && c == ':')))
            return 0;
        if (n >= MG_SEG_NAME_MAX)
            return 0;
    }
    return n > 0;
}

/* Non-zero when `tenant` may use seg's bytes: its owner or a tenant it is shared with. */
static int may_use(const mg_segment *seg, const char *tenant)
{
    size_t n = strlen(tenant);
    if (strcmp(seg->tenant, tenant) == 0)
        return 1;
    for (const char *p = seg->share; *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && memcmp(p, tenant, n) == 0)
            return 1;
        p += l;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* Checks a share list: valid names, not the owner, no repeats, at most MG_SEG_SHARE_MAX. */
static int share_ok(const char *share, const char *owner, char *err)
{
    char buf[MG_SEG_SHARE_LEN + 1], *save = NULL, *names[MG_SEG_SHARE_MAX];
    int n = 0;
    if (share == NULL || share[0] == '\0')
        return 1;
    if (strlen(share) > MG_SEG_SHARE_LEN) {
        snprintf(err, MG_SEG_ERROR_MAX, "share list is longer than %d bytes", MG_SEG_SHARE_LEN);
        return 0;
    }
    snprintf(buf, sizeof(buf), "%s", share);
    if (buf[0] == ',' || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,")) {
        snprintf(err, MG_SEG_ERROR_MAX, "share list has an empty tenant name");
        return 0;
    }
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!valid_name(t, 1)) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: tenant \"%.64s\" is not [A-Za-z0-9._:-]", t);
            return 0;
        }
        if (strcmp(t, owner) == 0) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: \"%.64s\" owns the segment already", t);
            return 0;
        }
        for (int k = 0; k < n; k++)
            if (strcmp(names[k], t) == 0) {
                snprintf(err, MG_SEG_ERROR_MAX, "share: \"%.64s\" is named twice", t);
                return 0;
            }
        if (n == MG_SEG_SHARE_MAX) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: at most %d tenants", MG_SEG_SHARE_MAX);
            return 0;
        }
        names[n++] = t;
    }
    return 1;
}

/* "cpu:N" (or "cuda:N" when gpu), N < 4096, into out; NULL or "" is "cpu:0". */
static int parse_location(const char *loc, int gpu, char out[16])
{
    const char *kind = gpu ? "cuda:" : "cpu:";
    size_t k = strlen(kind);
    unsigned long n;
    char *end;
    if (!gpu && (loc == NULL || *loc == '\0')) {
        snprintf(out, 16, "cpu:0");
        return 0;
    }
    if (loc == NULL || strncmp(loc, kind, k) != 0 || loc[k] < '0' || loc[k] > '9')
        return -1;
    n = strtoul(loc + k, &end, 10);
    if (*end != '\0' || n >= 4096)
        return -1;
    snprintf(out, 16, "%s%lu", kind, n);
    return 0;
}

static void set_error(mg_segment *seg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_error(mg_segment *seg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(seg->error, sizeof(seg->error), fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ registry */

static void unmap_files(mg_segment *seg);
static void addrs_remove_nolock(mg_registry *reg, mg_segment *seg);

/* Counts a registration job and whether it runs where it must: on an engine worker. */
static void count_job(mg_registry *reg)
{
    __atomic_add_fetch(&reg->jobs, 1, __ATOMIC_RELAXED);
    if (!mg_engine_on_worker())
        __atomic_add_fetch(&reg->jobs_off_worker, 1, __ATOMIC_RELAXED);
}

static void remove_stale_files(mg_registry *reg)
{
    int fd = dup(reg->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    unsigned removed = 0;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, FILE_PREFIX, sizeof(FILE_PREFIX) - 1) == 0 &&
            unlinkat(reg->dirfd, e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    if (removed)
        mg_info("segments_cleanup", "shm_dir=%s removed=%u reason=\"files of an earlier daemon\"",
                reg->shm_dir, removed);
}

int mg_registry_new(mg_registry **out, const mg_registry_config *cfg)
{
    mg_registry *reg;
    size_t nb = 16;
    struct stat st;

    if (cfg->shm_dir == NULL || cfg->shm_dir[0] != '/' || cfg->max_segments == 0 ||
        cfg->max_segments > (1u << 24) || cfg->file_mode > 0777) {
        mg_error("registry_config", "shm_dir=%s max_segments=%llu",
                 cfg->shm_dir ? cfg->shm_dir : "(none)", (unsigned long long)cfg->max_segments);
        return MG_ERR_INVALID;
    }
    reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return MG_ERR_NOMEM;
    while (nb < cfg->max_segments)
        nb <<= 1;
    reg->nbuckets = nb;
    reg->rdma = cfg->rdma;
    mg_idmap_init(&reg->ids, nb);
    reg->by_name = calloc(nb, sizeof(*reg->by_name));
    reg->by_req = calloc(nb, sizeof(*reg->by_req));
    reg->by_file = calloc(nb, sizeof(*reg->by_file));
    reg->shm_dir = strdup(cfg->shm_dir);
    if (reg->ids.buckets == NULL || reg->by_name == NULL || reg->by_req == NULL ||
        reg->by_file == NULL || reg->shm_dir == NULL)
        goto fail_nomem;
    reg->dirfd = open(cfg->shm_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (reg->dirfd < 0 || fstat(reg->dirfd, &st) != 0) {
        mg_error("registry_config", "shm_dir=%s error=\"%s\"", cfg->shm_dir, strerror(errno));
        if (reg->dirfd >= 0)
            close(reg->dirfd);
        mg_idmap_free(&reg->ids);
        free(reg->by_name);
        free(reg->by_req);
        free(reg->by_file);
        free(reg->shm_dir);
        free(reg);
        return MG_ERR_SYSTEM;
    }
    reg->file_mode = cfg->file_mode;
    reg->file_gid = cfg->file_gid;
    reg->max_tenant_segments = cfg->max_tenant_segments;
    reg->max_tenant_bytes = cfg->max_tenant_bytes;
    reg->max_segments = cfg->max_segments;
    reg->max_bytes = cfg->max_registered_bytes;
    reg->max_segment_bytes = cfg->max_segment_bytes;
    pthread_mutex_init(&reg->lock, NULL);
    remove_stale_files(reg);
    *out = reg;
    return 0;

fail_nomem:
    mg_idmap_free(&reg->ids);
    free(reg->by_name);
    free(reg->by_req);
    free(reg->by_file);
    free(reg->shm_dir);
    free(reg);
    return MG_ERR_NOMEM;
}

static tenant_count *tenant_nolock(mg_registry *reg, const char *tenant, int create)
{
    tenant_count *t;
    for (t = reg->tenants; t; t = t->next) {
        if (strcmp(t->tenant, tenant) == 0)
            return t;
    }
    if (!create || (t = calloc(1, sizeof(*t))) == NULL)
        return NULL;
    snprintf(t->tenant, sizeof(t->tenant), "%s", tenant);
    t->next = reg->tenants;
    reg->tenants = t;
    return t;
}

static void tenant_drop_nolock(mg_registry *reg, const char *tenant, uint64_t bytes)
{
    tenant_count **pp = &reg->tenants;
    while (*pp && strcmp((*pp)->tenant, tenant) != 0)
        pp = &(*pp)->next;
    if (*pp)
        (*pp)->bytes -= bytes;
    if (*pp && --(*pp)->segments == 0) {
        tenant_count *t = *pp;
        *pp = t->next;
        free(t);
    }
}

static size_t file_bucket(const mg_registry *reg, dev_t dev, ino_t ino)
{
    return (size_t)(mg_mix64((uint64_t)ino ^ mg_mix64((uint64_t)dev)) & (reg->nbuckets - 1));
}

static void unlink_nolock(mg_registry *reg, mg_segment *seg)
{
    mg_segment **pp;
    mg_idmap_remove(&reg->ids, &seg->idn);
    pp = &reg->by_name[mg_hash_str2(seg->tenant, seg->name) & (reg->nbuckets - 1)];
    while (*pp && *pp != seg)
        pp = &(*pp)->name_next;
    if (*pp)
        *pp = seg->name_next;
    if (seg->request_id[0]) {
        pp = &reg->by_req[mg_hash_str2(seg->tenant, seg->request_id) & (reg->nbuckets - 1)];
        while (*pp && *pp != seg)
            pp = &(*pp)->req_next;
        if (*pp)
            *pp = seg->req_next;
    }
    addrs_remove_nolock(reg, seg);
    if (seg->has_file_id) {
        pp = &reg->by_file[file_bucket(reg, seg->dev, seg->ino)];
        while (*pp && *pp != seg)
            pp = &(*pp)->file_next;
        if (*pp)
            *pp = seg->file_next;
        seg->has_file_id = 0;
    }
    if (seg->prev)
        seg->prev->next = seg->next;
    else
        reg->all = seg->next;
    if (seg->next)
        seg->next->prev = seg->prev;
    reg->count--;
    tenant_drop_nolock(reg, seg->tenant, seg->provisioned ? 0 : seg->size);
    reg->bytes -= seg->size;
    if (seg->state == MG_SEG_READY)
        reg->ready--;
    else if (seg->state == MG_SEG_REGISTERING)
        reg->registering--;
    if (seg->locked)
        reg->locked_bytes -= seg->size;
}

void mg_registry_del(mg_registry *reg)
{
    if (reg == NULL)
        return;
    while (reg->all) {
        mg_segment *seg = reg->all;
        unlink_nolock(reg, seg);
        unmap_files(seg);
        free(seg);
    }
    close(reg->dirfd);
    free(reg->addrs);
    pthread_mutex_destroy(&reg->lock);
    mg_idmap_free(&reg->ids);
    free(reg->by_name);
    free(reg->by_req);
    free(reg->by_file);
    free(reg->shm_dir);
    free(reg);
}

static mg_segment *find_name_nolock(mg_registry *reg, const char *tenant, const char *name)
{
    mg_segment *s = reg->by_name[mg_hash_str2(tenant, name) & (reg->nbuckets - 1)];
    for (; s; s = s->name_next) {
        if (strcmp(s->tenant, tenant) == 0 && strcmp(s->name, name) == 0)
            return s;
    }
    return NULL;
}

static mg_segment *find_req_nolock(mg_registry *reg, const char *tenant, const char *req)
{
    mg_segment *s = reg->by_req[mg_hash_str2(tenant, req) & (reg->nbuckets - 1)];
    for (; s; s = s->req_next) {
        if (strcmp(s->tenant, tenant) == 0 && strcmp(s->request_id, req) == 0)
            return s;
    }
    return NULL;
}

static int valid_request_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        if ((unsigned char)s[n] < 0x21 || (unsigned char)s[n] > 0x7e || n >= MG_SEG_NAME_MAX)
            return 0;
    }
    return 1;
}

static mg_segment *find_id_nolock(mg_registry *reg, uint64_t id)
{
    mg_idmap_node *n = mg_idmap_find(&reg->ids, id);
    return n ? mg_container_of(n, mg_segment, idn) : NULL;
}

/* ---- the registering processes' addresses (reg->addrs) ---- */

static int same_proc(const mg_proc *p, const mg_segment *s)
{
    return s->client.pid == p->pid && s->client.start == p->start;
}

/* How process p's address a sorts against segment s's: -1, 0 or 1. */
static int addr_cmp(const mg_proc *p, uint64_t a, const mg_segment *s)
{
    if (p->pid != s->client.pid)
        return p->pid < s->client.pid ? -1 : 1;
    if (p->start != s->client.start)
        return p->start < s->client.start ? -1 : 1;
    return a == s->client_addr ? 0 : a < s->client_addr ? -1 : 1;
}

/* How many entries of reg->addrs sort at or before (p, a). */
static size_t addrs_upper(const mg_registry *reg, const mg_proc *p, uint64_t a)
{
    size_t lo = 0, hi = reg->naddrs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (addr_cmp(p, a, reg->addrs[mid]) >= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A range of process p that overlaps [a, a + n), or NULL. */
static mg_segment *overlap_nolock(const mg_registry *reg, const mg_proc *p, uint64_t a, uint64_t n)
{
    size_t i = addrs_upper(reg, p, a);
    if (i > 0 && same_proc(p, reg->addrs[i - 1]) &&
        a - reg->addrs[i - 1]->client_addr < reg->addrs[i - 1]->size)
        return reg->addrs[i - 1];
    if (i < reg->naddrs && same_proc(p, reg->addrs[i]) && reg->addrs[i]->client_addr - a < n)
        return reg->addrs[i];
    return NULL;
}

/* Enters seg (its client address set) in reg->addrs, unless it overlaps a range of the same
 * process. Returns 0, MG_ERR_EXISTS or MG_ERR_NOMEM, with err set. */
static int addrs_insert_nolock(mg_registry *reg, mg_segment *seg, char *err)
{
    mg_segment *o = overlap_nolock(reg, &seg->client, seg->client_addr, seg->size);
    size_t i;
    if (o) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "[0x%llx, 0x%llx) overlaps segment %llu (\"%s\", [0x%llx, 0x%llx)) this process "
                 "registered; unregister it first",
                 (unsigned long long)seg->client_addr,
                 (unsigned long long)(seg->client_addr + seg->size), (unsigned long long)o->idn.id,
                 o->name, (unsigned long long)o->client_addr,
                 (unsigned long long)(o->client_addr + o->size));
        return MG_ERR_EXISTS;
    }
    if (reg->naddrs == reg->addrs_cap) {
        size_t cap = reg->addrs_cap ? reg->addrs_cap * 2 : 64;
        mg_segment **a = realloc(reg->addrs, cap * sizeof(*a));
        if (a == NULL) {
            snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
            return MG_ERR_NOMEM;
        }
        reg->addrs = a;
        reg->addrs_cap = cap;
    }
    i = addrs_upper(reg, &seg->client, seg->client_addr);
    memmove(&reg->addrs[i + 1], &reg->addrs[i], (reg->naddrs - i) * sizeof(*reg->addrs));
    reg->addrs[i] = seg;
    reg->naddrs++;
    seg->in_addrs = 1;
    return 0;
}

static void addrs_remove_nolock(mg_registry *reg, mg_segment *seg)
{
    size_t i = addrs_upper(reg, &seg->client, seg->client_addr);
    if (!seg->in_addrs || i == 0 || reg->addrs[i - 1] != seg)
        return;
    memmove(&reg->addrs[i - 1], &reg->addrs[i], (reg->naddrs - i) * sizeof(*reg->addrs));
    reg->naddrs--;
    seg->in_addrs = 0;
}

int mg_registry_resolve(mg_registry *reg, const char *tenant, const mg_proc *proc, uint64_t addr,
                        uint64_t len, uint64_t *id, uint64_t *offset, char *err)
{
    const mg_segment *s, *next;
    size_t i;
    pthread_mutex_lock(&reg->lock);
    i = addrs_upper(reg, proc, addr);
    s = i > 0 ? reg->addrs[i - 1] : NULL;
    if (s == NULL || !same_proc(proc, s) || addr - s->client_addr >= s->size ||
        s->state != MG_SEG_READY || strcmp(s->tenant, tenant) != 0) {
        pthread_mutex_unlock(&reg->lock);
        snprintf(err, MG_SEG_ERROR_MAX,
                 "no region this process registered holds address 0x%llx (regions are "
                 "registered with client_address; an address of an earlier registration is "
                 "gone with it)",
                 (unsigned long long)addr);
        return MG_ERR_NOT_FOUND;
    }
    *offset = addr - s->client_addr;
    if (len > s->size - *offset) {
        next = i < reg->naddrs && same_proc(proc, reg->addrs[i]) &&
                       reg->addrs[i]->client_addr - addr < len
                   ? reg->addrs[i]
                   : NULL;
        if (next)
            snprintf(err, MG_SEG_ERROR_MAX,
                     "[0x%llx, +%llu) crosses from segment %llu (\"%s\") into segment %llu "
                     "(\"%s\"); a request's range lies in one region",
                     (unsigned long long)addr, (unsigned long long)len,
                     (unsigned long long)s->idn.id, s->name, (unsigned long long)next->idn.id,
                     next->name);
        else
            snprintf(err, MG_SEG_ERROR_MAX,
                     "[0x%llx, +%llu) runs past the end of segment %llu (\"%s\", [0x%llx, "
                     "0x%llx))",
                     (unsigned long long)addr, (unsigned long long)len,
                     (unsigned long long)s->idn.id, s->name, (unsigned long long)s->client_addr,
                     (unsigned long long)(s->client_addr + s->size));
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_RANGE;
    }
    *id = s->idn.id;
    pthread_mutex_unlock(&reg->lock);
    return 0;
}

size_t mg_registry_regions(mg_registry *reg, const char *tenant, const mg_proc *proc,
                           uint64_t after, mg_region *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&reg->lock);
    for (size_t i = addrs_upper(reg, proc, after); i < reg->naddrs && n < max; i++) {
        const mg_segment *s = reg->addrs[i];
        if (!same_proc(proc, s))
            break;
        if (s->state == MG_SEG_READY && !strcmp(s->tenant, tenant))
            out[n++] =
                (mg_region){s->idn.id, s->client_addr, s->size, s->remote_accessible, s->order};
    }
    pthread_mutex_unlock(&reg->lock);
    return n;
}

uint64_t mg_segment_client_addr(const mg_segment *seg, const mg_proc *proc)
{
    return seg->client_addr && same_proc(proc, seg) ? seg->client_addr : 0;
}

/* The spec's own checks, before anything is locked. Returns 0 with loc set, or an MG_ERR_*. */
static int check_spec(const mg_registry *reg, const mg_segment_spec *spec, char loc[16], char *err)
{
    if (!valid_name(spec->tenant, 1)) {
        snprintf(err, MG_SEG_ERROR_MAX, "tenant must be 1-%d characters of [A-Za-z0-9._:-]",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (!share_ok(spec->share, spec->tenant, err))
        return MG_ERR_INVALID;
    if (!valid_name(spec->name, 1)) {
        snprintf(err, MG_SEG_ERROR_MAX, "name must be 1-%d characters of [A-Za-z0-9._:-]",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (parse_location(spec->location, spec->source == MG_SEG_DMABUF, loc) != 0) {
        snprintf(err, MG_SEG_ERROR_MAX, "location \"%.64s\" is not %s:N (N < 4096)",
                 spec->location ? spec->location : "",
                 spec->source == MG_SEG_DMABUF ? "cuda" : "cpu");
        return MG_ERR_INVALID;
    }
    if (spec->request_id && !valid_request_id(spec->request_id)) {
        snprintf(err, MG_SEG_ERROR_MAX, "request id must be at most %d printable characters",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (spec->memlock > MG_MEMLOCK_REQUIRE) {
        snprintf(err, MG_SEG_ERROR_MAX, "memlock must be off, try or require");
        return MG_ERR_INVALID;
    }
    if (spec->source == MG_SEG_ANON) {
        if (spec->size == 0) {
            snprintf(err, MG_SEG_ERROR_MAX, "size must be greater than 0");
            return MG_ERR_INVALID;
        }
    } else if (spec->source == MG_SEG_SHM) {
        if (!valid_name(spec->shm_file, 0) || !strcmp(spec->shm_file, ".") ||
            !strcmp(spec->shm_file, "..") ||
            strncmp(spec->shm_file, FILE_PREFIX, sizeof(FILE_PREFIX) - 1) == 0) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "shm file must be a file name inside the shm directory ([A-Za-z0-9._-], "
                     "not . or .., not starting with %s)",
                     FILE_PREFIX);
            return MG_ERR_INVALID;
        }
        if (!spec->caller_uid_known) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "a file is registered by name only for its owner, a caller on the Unix "
                     "socket known by its uid; token and certificate callers pass the file "
                     "descriptor, or register an ANON segment");
            return MG_ERR_PERMISSION;
        }
    } else if (spec->source == MG_SEG_PROCESS) {
        if (spec->client_addr == 0 || spec->size == 0 || !spec->caller_uid_known) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "process memory is named by its address and size (client_address, size), "
                     "by the process that has it, on the Unix socket");
            return MG_ERR_INVALID;
        }
        if (spec->remote_accessible || (spec->share && spec->share[0])) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "process memory is reached by this daemon only, with process_vm: it is "
                     "never remote-accessible nor shared (register it by descriptor for that)");
            return MG_ERR_INVALID;
        }
    } else if (spec->source == MG_SEG_FD) {
        if (spec->fd < 0) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "no descriptor: an fd segment needs the file's "
                     "descriptor, passed on the daemon's fd socket");
            return MG_ERR_INVALID;
        }
    } else if (spec->source == MG_SEG_DMABUF) {
        if (spec->fd < 0 || spec->client_addr == 0 || spec->size == 0) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "GPU memory is registered by its dma-buf (passed on the daemon's fd "
                     "socket), its client address and its size");
            return MG_ERR_INVALID;
        }
        if (reg->rdma == NULL) {
            snprintf(err, MG_SEG_ERROR_MAX,
                     "GPU memory moves over RDMA only, and this daemon has no RDMA device: "
                     "the client library stages it through the buffer pool instead");
            return MG_ERR_STATE;
        }
    } else {
        snprintf(err, MG_SEG_ERROR_MAX, "source must be anon, shm, fd, process or dmabuf");
        return MG_ERR_INVALID;
    }
    if (spec->client_addr != 0 && spec->client.pid <= 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a client address is a local process's: register it on "
                 "the Unix socket, from the process that has the memory");
        return MG_ERR_INVALID;
    }
    if (spec->client_addr != 0 &&
        (spec->size == 0 || spec->size > UINT64_MAX - spec->client_addr)) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a region with a client address needs its size (and "
                 "address + size within 64 bits)");
        return MG_ERR_INVALID;
    }
    if (spec->offset != 0 && spec->source != MG_SEG_FD && spec->source != MG_SEG_DMABUF) {
        snprintf(err, MG_SEG_ERROR_MAX, "offset is for segments of a passed descriptor only");
        return MG_ERR_INVALID;
    }
    if (reg->max_segment_bytes && spec->size > reg->max_segment_bytes) {
        snprintf(err, MG_SEG_ERROR_MAX, "size %llu is above the largest segment allowed, %llu",
                 (unsigned long long)spec->size, (unsigned long long)reg->max_segment_bytes);
        return MG_ERR_FULL;
    }
    return 0;
}

/* A request id seen before: 0 when it was not (go on), else MG_SEG_RETRY with *out the first
 * request's READY segment, or an MG_ERR_* with err set. */
static int earlier_request_nolock(mg_registry *reg, const mg_segment *seg, mg_segment **out,
                                  char *err)
{
    mg_segment *first = find_req_nolock(reg, seg->tenant, seg->request_id);
    if (first == NULL)
        return 0;
    if (strcmp(first->name, seg->name) != 0) {
        snprintf(err, MG_SEG_ERROR_MAX, "request id \"%s\" was used for segment \"%s\"",
                 seg->request_id, first->name);
        return MG_ERR_INVALID;
    }
    if (first->state == MG_SEG_REGISTERING) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "the first request with id \"%s\" is still registering; retry", seg->request_id);
        return MG_ERR_UNAVAILABLE;
    }
    if (first->state == MG_SEG_READY) {
        *out = first;
        return MG_SEG_RETRY;
    }
    snprintf(err, MG_SEG_ERROR_MAX, "segment \"%s\" of request id \"%s\" is being unregistered",
             first->name, seg->request_id);
    return MG_ERR_UNAVAILABLE;
}

/* The registry's and the tenant's limits for one more segment of spec->size bytes, and its
 * name. Returns 0 with *tcp the tenant's counts (created), or an MG_ERR_* with err set. */
static int limits_nolock(mg_registry *reg, const mg_segment_spec *spec, const mg_segment *seg,
                         tenant_count **tcp, char *err)
{
    tenant_count *tc = tenant_nolock(reg, seg->tenant, 0);
    uint64_t tenant_bytes = tc ? tc->bytes : 0;
    if (reg->count >= reg->max_segments) {
        snprintf(err, MG_SEG_ERROR_MAX, "%llu segments are registered, the limit (--max-segments)",
                 (unsigned long long)reg->count);
        return MG_ERR_FULL;
    }
    if (reg->max_tenant_segments && tc && tc->segments >= reg->max_tenant_segments) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "tenant \"%s\" has %llu segments, the limit per tenant (--max-tenant-segments)",
                 seg->tenant, (unsigned long long)tc->segments);
        return MG_ERR_QUOTA;
    }
    if (reg->max_tenant_bytes && !spec->provisioned &&
        spec->size > reg->max_tenant_bytes - tenant_bytes) {
        if (tc)
            snprintf(err, MG_SEG_ERROR_MAX,
                     "%llu more bytes would exceed tenant \"%s\"'s registered-bytes quota of %llu "
                     "(%llu registered; --max-tenant-bytes)",
                     (unsigned long long)spec->size, seg->tenant,
                     (unsigned long long)reg->max_tenant_bytes, (unsigned long long)tc->bytes);
        else
            snprintf(err, MG_SEG_ERROR_MAX,
                     "%llu bytes exceed tenant \"%s\"'s registered-bytes quota of %llu "
                     "(--max-tenant-bytes)",
                     (unsigned long long)spec->size, seg->tenant,
                     (unsigned long long)reg->max_tenant_bytes);
        return MG_ERR_QUOTA;
    }
    if (reg->max_bytes && spec->size > reg->max_bytes - reg->bytes) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "%llu more bytes would exceed the registered-bytes limit of %llu "
                 "(%llu registered)",
                 (unsigned long long)spec->size, (unsigned long long)reg->max_bytes,
                 (unsigned long long)reg->bytes);
        return MG_ERR_FULL;
    }
    if (find_name_nolock(reg, seg->tenant, seg->name)) {
        snprintf(err, MG_SEG_ERROR_MAX, "a segment named \"%s\" exists", seg->name);
        return MG_ERR_EXISTS;
    }
    if (tc == NULL && (tc = tenant_nolock(reg, seg->tenant, 1)) == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
        return MG_ERR_NOMEM;
    }
    *tcp = tc;
    return 0;
}

/* Gives seg its id and enters it in the tables and the list, REGISTERING. */
static void enter_nolock(mg_registry *reg, mg_segment *seg)
{
    size_t b;
    mg_idmap_add(&reg->ids, &seg->idn);
    seg->order = ++reg->entered;
    if (seg->source == MG_SEG_ANON)
        snprintf(seg->file, sizeof(seg->file), FILE_PREFIX "%016llx",
                 (unsigned long long)seg->idn.id);
    b = mg_hash_str2(seg->tenant, seg->name) & (reg->nbuckets - 1);
    seg->name_next = reg->by_name[b];
    reg->by_name[b] = seg;
    if (seg->request_id[0]) {
        b = mg_hash_str2(seg->tenant, seg->request_id) & (reg->nbuckets - 1);
        seg->req_next = reg->by_req[b];
        reg->by_req[b] = seg;
    }
    seg->next = reg->all;
    if (reg->all)
        reg->all->prev = seg;
    reg->all = seg;
    reg->count++;
    reg->bytes += seg->size;
    seg->state = MG_SEG_REGISTERING;
    reg->registering++;
}

static int reserve(mg_registry *reg, const mg_segment_spec *spec, mg_segment **out, char *err)
{
    mg_segment *seg;
    tenant_count *tc = NULL;
    char loc[16];
    int rc;

    err[0] = '\0';
    if ((rc = check_spec(reg, spec, loc, err)) != 0)
        return rc;
    seg = calloc(1, sizeof(*seg));
    if (seg == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
        return MG_ERR_NOMEM;
    }
    seg->reg = reg;
    seg->fd = spec->source == MG_SEG_FD || spec->source == MG_SEG_DMABUF ? spec->fd : -1;
    seg->offset = spec->offset;
    seg->client_addr = spec->client_addr;
    if (spec->client_addr)
        seg->client = spec->client;
    snprintf(seg->tenant, sizeof(seg->tenant), "%s", spec->tenant);
    snprintf(seg->name, sizeof(seg->name), "%s", spec->name);
    memcpy(seg->location, loc, sizeof(loc));
    seg->source = spec->source;
    seg->size = spec->size;
    seg->remote_accessible = spec->remote_accessible != 0;
    seg->memlock = spec->memlock;
    seg->prefault = spec->prefault != 0;
    seg->provisioned = spec->provisioned;
    snprintf(seg->share, sizeof(seg->share), "%s", spec->share ? spec->share : "");
    if (spec->source == MG_SEG_SHM) {
        snprintf(seg->file, sizeof(seg->file), "%s", spec->shm_file);
        seg->caller_uid = spec->caller_uid;
    }
    if (spec->source == MG_SEG_PROCESS)
        seg->caller_uid = spec->caller_uid;
    if (spec->request_id)
        snprintf(seg->request_id, sizeof(seg->request_id), "%s", spec->request_id);

    pthread_mutex_lock(&reg->lock);
    rc = seg->request_id[0] ? earlier_request_nolock(reg, seg, out, err) : 0;
    if (rc == 0)
        rc = limits_nolock(reg, spec, seg, &tc, err);
    if (rc == 0 && seg->client_addr)
        rc = addrs_insert_nolock(reg, seg, err);
    if (rc != 0) {
        pthread_mutex_unlock(&reg->lock);
        free(seg);
        return rc;
    }
    tc->segments++;
    if (!seg->provisioned)
        tc->bytes += spec->size;
    enter_nolock(reg, seg);
    pthread_mutex_unlock(&reg->lock);
    *out = seg;
    return 0;
}

int mg_registry_reserve(mg_registry *reg, const mg_segment_spec *spec, mg_segment **out, char *err)
{
    int rc = reserve(reg, spec, out, err);
    /* A passed descriptor is the registry's: the segment entered holds it, else it is closed. */
    if (rc != 0 && (spec->source == MG_SEG_FD || spec->source == MG_SEG_DMABUF) && spec->fd >= 0)
        close(spec->fd);
    return rc;
}

/* Worker: an shm segment of size 0 learns its size from the file; account for it now. */
static int grow_reservation(mg_segment *seg, uint64_t size)
{
    mg_registry *reg = seg->reg;
    int rc = 0;
    if (reg->max_segment_bytes && size > reg->max_segment_bytes) {
        set_error(seg, "file of %llu bytes is above the largest segment allowed, %llu",
                  (unsigned long long)size, (unsigned long long)reg->max_segment_bytes);
        return MG_ERR_FULL;
    }
    pthread_mutex_lock(&reg->lock);
    tenant_count *tc = tenant_nolock(reg, seg->tenant, 0);
    if (reg->max_bytes && size > reg->max_bytes - reg->bytes) {
        set_error(seg, "%llu more bytes would exceed the registered-bytes limit of %llu",
                  (unsigned long long)size, (unsigned long long)reg->max_bytes);
        rc = MG_ERR_FULL;
    } else if (reg->max_tenant_bytes && tc && !seg->provisioned &&
               size > reg->max_tenant_bytes - tc->bytes) {
        set_error(seg,
                  "%llu more bytes would exceed tenant \"%s\"'s registered-bytes quota of %llu "
                  "(--max-tenant-bytes)",
                  (unsigned long long)size, seg->tenant, (unsigned long long)reg->max_tenant_bytes);
        rc = MG_ERR_QUOTA;
    } else {
        reg->bytes += size;
        if (tc && !seg->provisioned)
            tc->bytes += size;
        seg->size = size;
    }
    pthread_mutex_unlock(&reg->lock);
    return rc;
}

/* "moongate-seg-1 in /dev/shm/moongate" or "the passed file", for messages. */
static const char *describe(const mg_segment *seg, char *buf, size_t cap)
{
    if (seg->source == MG_SEG_FD)
        return "the passed file";
    snprintf(buf, cap, "%s in %s", seg->file, seg->reg->shm_dir);
    return buf;
}

/* Worker: allocates the file's blocks now. A tmpfs (or a pod's memory-backed emptyDir) that
 * is full would otherwise accept the size and fail only when a page is first touched — with
 * SIGBUS, in whichever process touches it. Filesystems without fallocate are left as they are. */
static int reserve_blocks(mg_segment *seg)
{
    char what[MG_SEG_NAME_MAX + 4096];
    int e;
    if (fallocate(seg->fd, 0, (off_t)seg->offset, (off_t)seg->size) == 0 || errno == EOPNOTSUPP)
        return 0;
    e = errno;
    set_error(seg, "cannot reserve %llu bytes for %s: %s", (unsigned long long)seg->size,
              describe(seg, what, sizeof(what)), strerror(e));
    return e == ENOSPC || e == EFBIG ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
}

/* Worker: enters the open file's (st_dev, st_ino) in by_file. Returns 0, or MG_ERR_PERMISSION
 * when a segment of another tenant has the same file, whatever name reached it. */
static int claim_file(mg_segment *seg, const struct stat *st)
{
    mg_registry *reg = seg->reg;
    size_t b = file_bucket(reg, st->st_dev, st->st_ino);
    char what[MG_SEG_NAME_MAX + 4096];
    pthread_mutex_lock(&reg->lock);
    for (mg_segment *s = reg->by_file[b]; s; s = s->file_next) {
        if (s->dev == st->st_dev && s->ino == st->st_ino && strcmp(s->tenant, seg->tenant) != 0) {
            pthread_mutex_unlock(&reg->lock);
            set_error(seg,
                      "%s is another tenant's segment; its owner shares it by share_with, "
                      "and it is never registered again for another tenant",
                      describe(seg, what, sizeof(what)));
            return MG_ERR_PERMISSION;
        }
    }
    seg->dev = st->st_dev;
    seg->ino = st->st_ino;
    seg->has_file_id = 1;
    seg->file_next = reg->by_file[b];
    reg->by_file[b] = seg;
    pthread_mutex_unlock(&reg->lock);
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "directory"
           : S_ISFIFO(m) ? "pipe"
           : S_ISSOCK(m) ? "socket"
           : S_ISCHR(m)  ? "character device"
           : S_ISBLK(m)  ? "block device"
                         : "file of another kind";
}

/* Worker: what a passed descriptor may be (see mg_segment_spec.fd). Returns 0 with
 * [offset, offset + size) known to lie in the file, or an MG_ERR_* with the reason set. */
static int check_passed_fd(mg_segment *seg, struct stat *st)
{
    int fl = fcntl(seg->fd, F_GETFL), seals;
    uint64_t fsize;
    struct statfs fs;

    if (fl < 0 || fstat(seg->fd, st) != 0) {
        set_error(seg, "cannot inspect the passed descriptor: %s", strerror(errno));
        return MG_ERR_SYSTEM;
    }
    if (fl & O_PATH) {
        set_error(seg, "the descriptor was opened with O_PATH: it names a file but cannot map "
                       "it; pass one opened O_RDWR");
        return MG_ERR_INVALID;
    }
    if (!S_ISREG(st->st_mode)) {
        set_error(seg,
                  "the descriptor is a %s, not memory: pass a memfd, a tmpfs or hugetlbfs "
                  "file, or another regular file",
                  file_kind(st->st_mode));
        return MG_ERR_INVALID;
    }
    if ((fl & O_ACCMODE) != O_RDWR) {
        set_error(seg, "the descriptor is open %s; a segment is read and written: open it O_RDWR",
                  (fl & O_ACCMODE) == O_WRONLY ? "write-only" : "read-only");
        return MG_ERR_INVALID;
    }
    seals = fcntl(seg->fd, F_GET_SEALS);
    if (seals > 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))) {
        set_error(seg, "the memfd is sealed against writes (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE); "
                       "a segment is written");
        return MG_ERR_INVALID;
    }
    if (seg->remote_accessible && mg_rdma_device_count(seg->reg->rdma) > 0 &&
        (seals < 0 || !(seals & F_SEAL_SHRINK))) {
        set_error(seg,
                  "a remote-accessible segment is registered with this daemon's RDMA devices, "
                  "which keep the pages a shrink takes from the file, so peers would write where "
                  "the client no longer sees: pass a memfd sealed with F_SEAL_SHRINK "
                  "(fcntl F_ADD_SEALS), or register it without remote access");
        return MG_ERR_STATE;
    }
    fsize = st->st_size > 0 ? (uint64_t)st->st_size : 0;
    if (seg->offset >= fsize) {
        set_error(seg, "offset %llu is not inside the file (%llu bytes)",
                  (unsigned long long)seg->offset, (unsigned long long)fsize);
        return MG_ERR_RANGE;
    }
    if (seg->size != 0 && mg_bounds_check(fsize, seg->offset, seg->size) != 0) {
        set_error(seg, "%llu bytes from offset %llu run past the end of the file (%llu bytes)",
                  (unsigned long long)seg->size, (unsigned long long)seg->offset,
                  (unsigned long long)fsize);
        return MG_ERR_RANGE;
    }
    seg->page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (fstatfs(seg->fd, &fs) == 0 && (unsigned long)fs.f_type == HUGETLBFS_MAGIC) {
        uint64_t size = seg->size ? seg->size : fsize - seg->offset;
        seg->page = (uint64_t)fs.f_bsize;
        if (seg->offset % seg->page != 0 || size % seg->page != 0) {
            set_error(seg,
                      "a hugetlbfs file maps in whole huge pages of %llu bytes: offset %llu and "
                      "size %llu must be multiples of it",
                      (unsigned long long)seg->page, (unsigned long long)seg->offset,
                      (unsigned long long)size);
            return MG_ERR_INVALID;
        }
    }
    if (claim_file(seg, st) != 0)
        return MG_ERR_PERMISSION;
    if (seg->size == 0) {
        int rc = grow_reservation(seg, fsize - seg->offset);
        if (rc != 0)
            return rc;
    }
    return reserve_blocks(seg);
}

static int open_file(mg_segment *seg)
{
    mg_registry *reg = seg->reg;
    struct stat st;

    seg->page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (seg->source == MG_SEG_FD)
        return check_passed_fd(seg, &st);
    if (seg->source == MG_SEG_ANON) {
        seg->fd = openat(reg->dirfd, seg->file, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                         reg->file_mode);
        if (seg->fd < 0) {
            set_error(seg, "cannot create %s/%s: %s", reg->shm_dir, seg->file, strerror(errno));
            return MG_ERR_SYSTEM;
        }
        seg->created = 1;
        if (reg->file_gid && fchown(seg->fd, (uid_t)-1, (gid_t)reg->file_gid) != 0) {
            set_error(seg, "cannot give %s/%s to group %u: %s", reg->shm_dir, seg->file,
                      reg->file_gid, strerror(errno));
            return MG_ERR_SYSTEM;
        }
        if (fchmod(seg->fd, reg->file_mode) != 0 || ftruncate(seg->fd, (off_t)seg->size) != 0) {
            set_error(seg, "cannot size %s/%s to %llu bytes: %s", reg->shm_dir, seg->file,
                      (unsigned long long)seg->size, strerror(errno));
            return errno == ENOSPC || errno == EFBIG ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
        }
        if (fstat(seg->fd, &st) != 0) {
            set_error(seg, "cannot stat %s/%s: %s", reg->shm_dir, seg->file, strerror(errno));
            return MG_ERR_SYSTEM;
        }
        if (claim_file(seg, &st) != 0)
            return MG_ERR_PERMISSION;
        return reserve_blocks(seg);
    }
    seg->fd = openat(reg->dirfd, seg->file, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (seg->fd < 0) {
        int e = errno;
        if (e == ELOOP) {
            set_error(seg, "%s in %s is a symbolic link; segments are regular files", seg->file,
                      reg->shm_dir);
            return MG_ERR_PERMISSION;
        }
        set_error(seg, "cannot open %s in %s: %s", seg->file, reg->shm_dir, strerror(e));
        return e == EACCES || e == EPERM ? MG_ERR_PERMISSION : MG_ERR_INVALID;
    }
    if (fstat(seg->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        set_error(seg, "%s in %s is not a regular file", seg->file, reg->shm_dir);
        return MG_ERR_INVALID;
    }
    if (st.st_nlink != 1) {
        set_error(seg, "%s in %s has %lu hard links; a segment file must have one", seg->file,
                  reg->shm_dir, (unsigned long)st.st_nlink);
        return MG_ERR_PERMISSION;
    }
    /* The daemon opened the file with its own rights: the caller must own it. */
    if (st.st_uid != seg->caller_uid) {
        set_error(seg, "%s in %s belongs to uid %u, not to the caller (uid %u)", seg->file,
                  reg->shm_dir, (unsigned)st.st_uid, (unsigned)seg->caller_uid);
        return MG_ERR_PERMISSION;
    }
    if ((st.st_mode & (S_IRUSR | S_IWUSR)) != (S_IRUSR | S_IWUSR)) {
        set_error(seg, "%s in %s has mode %04o: its owner may not both read and write it",
                  seg->file, reg->shm_dir, (unsigned)(st.st_mode & 07777));
        return MG_ERR_PERMISSION;
    }
    if (claim_file(seg, &st) != 0)
        return MG_ERR_PERMISSION;
    if (st.st_size <= 0) {
        set_error(seg, "%s in %s is empty", seg->file, reg->shm_dir);
        return MG_ERR_INVALID;
    }
    if (seg->size == 0) {
        int rc = grow_reservation(seg, (uint64_t)st.st_size);
        return rc != 0 ? rc : reserve_blocks(seg);
    }
    if ((uint64_t)st.st_size < seg->size) {
        set_error(seg, "%s in %s has %lld bytes, fewer than the %llu asked for", seg->file,
                  reg->shm_dir, (long long)st.st_size, (unsigned long long)seg->size);
        return MG_ERR_INVALID;
    }
    return reserve_blocks(seg); /* a client's sparse file: its holes, within its size */
}

static int cancelled(mg_segment *seg)
{
    if (!__atomic_load_n(&seg->cancel, __ATOMIC_RELAXED))
        return 0;
    set_error(seg, "registration cancelled: its caller is gone");
    return 1;
}

void mg_segment_cancel(mg_segment *seg)
{
    __atomic_store_n(&seg->cancel, 1, __ATOMIC_RELAXED);
}

static int lock_pages(mg_segment *seg)
{
    struct rlimit rl;
    int e;
    if (seg->memlock == MG_MEMLOCK_OFF)
        return 0;
    /* In chunks: mlock holds the process's mmap lock while it faults pages in, and the loop
     * thread's own page faults and mappings wait for that lock. */
    e = 0;
    for (uint64_t off = 0; off < seg->size; off += CHUNK) {
        uint64_t n = seg->size - off < CHUNK ? seg->size - off : CHUNK;
        if (cancelled(seg)) {
            munlock(seg->addr, off);
            return MG_ERR_CANCELLED;
        }
        if (mlock((char *)seg->addr + off, n) != 0) {
            e = errno;
            munlock(seg->addr, off);
            break;
        }
    }
    if (e == 0) {
        seg->locked = 1;
        return 0;
    }
    if (seg->memlock == MG_MEMLOCK_TRY) {
        mg_warn("segment_mlock", "id=%llu bytes=%llu error=\"%s\" policy=try",
                (unsigned long long)seg->idn.id, (unsigned long long)seg->size, strerror(e));
        return 0;
    }
    getrlimit(RLIMIT_MEMLOCK, &rl);
    if (rl.rlim_cur == RLIM_INFINITY)
        set_error(seg, "cannot lock %llu bytes in memory: %s", (unsigned long long)seg->size,
                  strerror(e));
    else
        set_error(seg,
                  "cannot lock %llu bytes in memory: %s (RLIMIT_MEMLOCK is %llu bytes; raise "
                  "it, e.g. ulimit -l, or use memlock try/off)",
                  (unsigned long long)seg->size, strerror(e), (unsigned long long)rl.rlim_cur);
    return e == EPERM ? MG_ERR_PERMISSION : MG_ERR_NOMEM;
}

typedef struct {
    const char *p;
    uint64_t len, page;
} touch_op;

static int touch_pages(void *arg)
{
    touch_op *t = arg;
    for (uint64_t off = 0; off < t->len; off += t->page)
        (void)*(volatile const char *)(t->p + off);
    return 0;
}

/* Returns 0, MG_ERR_CANCELLED or MG_ERR_DATA_LOSS (the file is shorter than the mapping: a
 * client shrank it). */
static int prefault(mg_segment *seg)
{
    long page = sysconf(_SC_PAGESIZE);
#ifdef MADV_POPULATE_WRITE
    {
        /* In chunks, for the same reason as lock_pages. */
        uint64_t off = 0;
        for (; off < seg->size; off += CHUNK) {
            uint64_t n = seg->size - off < CHUNK ? seg->size - off : CHUNK;
            if (cancelled(seg))
                return MG_ERR_CANCELLED;
            if (madvise((char *)seg->addr + off, n, MADV_POPULATE_WRITE) != 0)
                break;
        }
        if (off >= seg->size)
            return 0;
    }
#endif
    /* Older kernels (or a file shorter than the mapping): read every page, a chunk at a time,
     * guarded; writes would race with a client's own. */
    for (uint64_t off = 0; off < seg->size; off += CHUNK) {
        touch_op t = {(const char *)seg->addr + off,
                      seg->size - off < CHUNK ? seg->size - off : CHUNK, (uint64_t)page};
        if (cancelled(seg))
            return MG_ERR_CANCELLED;
        if (mg_fault_guard(touch_pages, &t) != 0) {
            set_error(seg, "the file is shorter than the segment's %llu bytes (truncated under it)",
                      (unsigned long long)seg->size);
            return MG_ERR_DATA_LOSS;
        }
    }
    return 0;
}

/* Worker: a process segment maps nothing: its process is opened and every page of the range
 * checked to be memory the daemon can reach there. */
static int open_process(mg_segment *seg)
{
    int rc =
        mg_procmem_open(&seg->pm, &seg->client, seg->caller_uid, seg->error, sizeof(seg->error));
    if (rc == 0)
        rc = mg_procmem_probe(seg->pm, seg->client_addr, seg->size, seg->error, sizeof(seg->error));
    if (rc != 0) {
        mg_procmem_close(seg->pm);
        seg->pm = NULL;
        return rc;
    }
    seg->addr = (void *)(uintptr_t)seg->client_addr;
    return 0;
}

/* Worker: GPU memory, registered with every RDMA device by its client address (the iova peers
 * and work requests name it by); the dma-buf is the devices' to hold from then on. seg->addr is
 * that address, which no path of this process ever touches (mg_segment_gpu refuses them). */
static int register_dmabuf(mg_segment *seg)
{
    char why[512];
    int rc = mg_rdma_reg_dmabuf(seg->reg->rdma, seg->fd, seg->offset, seg->size, seg->client_addr,
                                seg->remote_accessible, &seg->mr, why, sizeof(why));
    close(seg->fd);
    seg->fd = -1;
    if (rc != 0) {
        set_error(seg, "RDMA registration of the dma-buf: %s", why);
        return rc;
    }
    seg->addr = (void *)(uintptr_t)seg->client_addr;
    seg->transports[MG_TRANSPORT_RDMA].registered = seg->remote_accessible;
    seg->transports[MG_TRANSPORT_RDMA].lkey = mg_rdma_mr_lkey(seg->mr, 0);
    seg->transports[MG_TRANSPORT_RDMA].rkey = mg_rdma_mr_rkey(seg->mr, 0);
    seg->transports[MG_TRANSPORT_RDMA].addr = seg->client_addr;
    return 0;
}

int mg_segment_map(mg_segment *seg)
{
    int rc;
    count_job(seg->reg);
    seg->error[0] = '\0';
    if (cancelled(seg))
        return MG_ERR_CANCELLED;
    if (seg->source == MG_SEG_PROCESS)
        return open_process(seg);
    if (seg->source == MG_SEG_DMABUF)
        return register_dmabuf(seg);
    rc = open_file(seg);
    if (rc != 0)
        goto fail;
    {
        /* From the page the segment starts in: a passed file's offset need not be aligned. */
        uint64_t skip = seg->offset % seg->page;
        void *base;
        seg->map_len = seg->size + skip;
        base = mmap(NULL, seg->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd,
                    (off_t)(seg->offset - skip));
        if (base == MAP_FAILED) {
            int e = errno;
            set_error(seg, "cannot map %llu bytes: %s", (unsigned long long)seg->size, strerror(e));
            rc = e == ENOMEM ? MG_ERR_NOMEM : MG_ERR_SYSTEM;
            goto fail;
        }
        seg->map_base = base;
        seg->addr = (char *)base + skip;
    }
    /* The mapping keeps the file; a descriptor per segment would make the open-files limit,
     * not --max-segments, the bound on registrations. */
    close(seg->fd);
    seg->fd = -1;
    /* Fault the pages in first, then lock them: populating takes the mmap lock for reading,
     * so registrations on several workers proceed in parallel, while mlock takes it for
     * writing and would fault every page in under it, one registration at a time. */
    if ((seg->prefault || seg->memlock != MG_MEMLOCK_OFF) && (rc = prefault(seg)) != 0)
        goto fail;
    if ((rc = lock_pages(seg)) != 0)
        goto fail;
    /* The TCP data plane serves a remote-accessible segment from this mapping. */
    seg->transports[MG_TRANSPORT_TCP].registered = seg->remote_accessible;
    if (seg->reg->rdma) { /* pins the pages on every device; remote access only if asked */
        char why[256];
        rc = mg_rdma_reg(seg->reg->rdma, seg->addr, seg->size, seg->remote_accessible, &seg->mr,
                         why, sizeof(why));
        if (rc != 0) {
            set_error(seg, "RDMA registration: %s", why);
            goto fail;
        }
        seg->transports[MG_TRANSPORT_RDMA].registered = seg->remote_accessible;
        seg->transports[MG_TRANSPORT_RDMA].lkey = mg_rdma_mr_lkey(seg->mr, 0);
        seg->transports[MG_TRANSPORT_RDMA].rkey = mg_rdma_mr_rkey(seg->mr, 0);
        seg->transports[MG_TRANSPORT_RDMA].addr = (uintptr_t)seg->addr;
    }
    return 0;

fail:
    unmap_files(seg);
    return rc;
}

int mg_segment_rdma_lkey(const mg_segment *seg, int dev, uint32_t *lkey)
{
    if (seg->mr == NULL || dev < 0 || dev >= mg_rdma_device_count(seg->reg->rdma))
        return -1;
    *lkey = mg_rdma_mr_lkey(seg->mr, dev);
    return 0;
}

const char *mg_segment_error(const mg_segment *seg)
{
    return seg->error;
}

void mg_segment_unmap(mg_segment *seg)
{
    count_job(seg->reg);
    unmap_files(seg);
}

static void unmap_files(mg_segment *seg)
{
    mg_registry *reg = seg->reg;
    if (seg->mr) { /* the devices let go of the pages before they are unmapped */
        mg_rdma_dereg(seg->mr);
        seg->mr = NULL;
        memset(&seg->transports[MG_TRANSPORT_RDMA], 0, sizeof(seg->transports[0]));
    }
    if (seg->pm) {
        mg_procmem_close(seg->pm);
        seg->pm = NULL;
        seg->addr = NULL;
    }
    if (seg->source == MG_SEG_DMABUF)
        seg->addr = NULL;
    if (seg->map_base) {
        /* In chunks, so the mmap lock is released between them (see lock_pages); whole huge
         * pages of a hugetlbfs file. */
        uint64_t step = seg->page > CHUNK ? seg->page : CHUNK;
        for (uint64_t off = 0; off < seg->map_len; off += step)
            munmap((char *)seg->map_base + off,
                   seg->map_len - off < step ? seg->map_len - off : step);
        seg->map_base = NULL;
        seg->addr = NULL;
    }
    if (seg->fd >= 0) {
        close(seg->fd);
        seg->fd = -1;
    }
    if (seg->created) {
        unlinkat(reg->dirfd, seg->file, 0);
        seg->created = 0;
    }
}

void mg_registry_commit(mg_registry *reg, mg_segment *seg, int result)
{
    pthread_mutex_lock(&reg->lock);
    if (result == 0) {
        seg->state = MG_SEG_READY;
        reg->registering--;
        reg->ready++;
        if (seg->locked)
            reg->locked_bytes += seg->size;
        pthread_mutex_unlock(&reg->lock);
        return;
    }
    seg->locked = 0; /* a REGISTERING segment's bytes are not in locked_bytes */
    unlink_nolock(reg, seg);
    pthread_mutex_unlock(&reg->lock);
    free(seg);
}

int mg_registry_acquire(mg_registry *reg, const char *tenant, uint64_t id, const char *holder,
                        mg_segment **out)
{
    mg_segment *seg;
    pthread_mutex_lock(&reg->lock);
    seg = find_id_nolock(reg, id);
    if (seg == NULL || seg->state != MG_SEG_READY || !may_use(seg, tenant)) {
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_NOT_FOUND;
    }
    seg->refs++;
    snprintf(seg->holder, sizeof(seg->holder), "%s", holder ? holder : "");
    pthread_mutex_unlock(&reg->lock);
    *out = seg;
    return 0;
}

void mg_registry_hold(mg_registry *reg, mg_segment *seg)
{
    pthread_mutex_lock(&reg->lock);
    seg->refs++;
    pthread_mutex_unlock(&reg->lock);
}

void mg_registry_put(mg_registry *reg, mg_segment *seg)
{
    pthread_mutex_lock(&reg->lock);
    if (seg->refs > 0)
        seg->refs--;
    pthread_mutex_unlock(&reg->lock);
}

int mg_registry_unregister(mg_registry *reg, const char *tenant, uint64_t id, mg_segment **out,
                           char *err)
{
    mg_segment *seg;
    err[0] = '\0';
    pthread_mutex_lock(&reg->lock);
    seg = find_id_nolock(reg, id);
    if (seg == NULL || seg->state != MG_SEG_READY || (tenant && strcmp(seg->tenant, tenant) != 0)) {
        pthread_mutex_unlock(&reg->lock);
        snprintf(err, MG_SEG_ERROR_MAX, "no segment %llu", (unsigned long long)id);
        return MG_ERR_NOT_FOUND;
    }
    if (seg->refs > 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "segment %llu (\"%s\") is held by %u lease(s) or transfer(s), the latest: %s",
                 (unsigned long long)id, seg->name, seg->refs,
                 seg->holder[0] ? seg->holder : "unnamed");
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_BUSY;
    }
    seg->state = MG_SEG_UNREGISTERING;
    reg->ready--;
    pthread_mutex_unlock(&reg->lock);
    *out = seg;
    return 0;
}

void mg_registry_restore(mg_registry *reg, mg_segment *seg)
{
    pthread_mutex_lock(&reg->lock);
    if (seg->state == MG_SEG_UNREGISTERING) {
        seg->state = MG_SEG_READY;
        reg->ready++;
    }
    pthread_mutex_unlock(&reg->lock);
}

void mg_registry_release(mg_registry *reg, mg_segment *seg)
{
    pthread_mutex_lock(&reg->lock);
    unlink_nolock(reg, seg);
    pthread_mutex_unlock(&reg->lock);
    free(seg);
}

static void info_nolock(const mg_registry *reg, const mg_segment *seg, mg_segment_info *out)
{
    memset(out, 0, sizeof(*out));
    out->id = seg->idn.id;
    memcpy(out->tenant, seg->tenant, sizeof(out->tenant));
    memcpy(out->name, seg->name, sizeof(out->name));
    memcpy(out->location, seg->location, sizeof(out->location));
    if (seg->source == MG_SEG_ANON || seg->source == MG_SEG_SHM) {
        /* shm_dir "/" file, as snprintf "%s/%s" would (this runs for every lease reply) */
        size_t d = strnlen(reg->shm_dir, sizeof(out->path) - 2);
        memcpy(out->path, reg->shm_dir, d);
        out->path[d++] = '/';
        mg_strlcpy(out->path + d, seg->file, sizeof(out->path) - d);
    }
    out->source = seg->source;
    out->offset = seg->offset;
    out->client_addr = seg->client_addr;
    out->client_pid = seg->client.pid;
    out->size = seg->size;
    out->remote_accessible = seg->remote_accessible;
    out->locked = seg->locked;
    memcpy(out->transports, seg->transports, sizeof(out->transports));
    if (seg->state == MG_SEG_READY && seg->mr && seg->remote_accessible) {
        int n = mg_rdma_device_count(reg->rdma);
        for (int i = 0; i < n && i < MG_RDMA_MAX_DEVICES; i++)
            out->rdma_rkeys[out->rdma_ndev++] = mg_rdma_mr_rkey(seg->mr, i);
    }
    out->state = seg->state;
    out->refs = seg->refs;
    memcpy(out->share, seg->share, sizeof(out->share));
}

void mg_segment_get_info(mg_registry *reg, const mg_segment *seg, mg_segment_info *out)
{
    pthread_mutex_lock(&reg->lock);
    info_nolock(reg, seg, out);
    pthread_mutex_unlock(&reg->lock);
}

int mg_registry_find_target(mg_registry *reg, const char *tenant, uint64_t id, mg_segment_info *out)
{
    const mg_segment *seg;
    pthread_mutex_lock(&reg->lock);
    seg = find_id_nolock(reg, id);
    if (seg == NULL || !may_use(seg, tenant)) {
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_NOT_FOUND;
    }
    info_nolock(reg, seg, out);
    pthread_mutex_unlock(&reg->lock);
    return 0;
}

int mg_registry_find(mg_registry *reg, const char *tenant, uint64_t id, mg_segment_info *out)
{
    const mg_segment *seg;
    pthread_mutex_lock(&reg->lock);
    seg = find_id_nolock(reg, id);
    if (seg == NULL || (tenant && strcmp(seg->tenant, tenant) != 0)) {
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_NOT_FOUND;
    }
    info_nolock(reg, seg, out);
    pthread_mutex_unlock(&reg->lock);
    return 0;
}

void *mg_segment_addr(const mg_segment *seg)
{
    return seg->addr;
}

int mg_segment_gpu(const mg_segment *seg)
{
    return seg->source == MG_SEG_DMABUF;
}

mg_procmem *mg_segment_procmem(const mg_segment *seg)
{
    return seg->pm;
}

uint64_t mg_segment_size(const mg_segment *seg)
{
    return seg->size;
}

size_t mg_registry_list(mg_registry *reg, const char *tenant, uint64_t after, mg_segment_info *out,
                        size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&reg->lock);
    /* In id order from the id map's tree: O(log n) a segment, another tenant's skipped. */
    for (mg_idmap_node *x = mg_idmap_next(&reg->ids, after); x && n < max;
         x = mg_idmap_next(&reg->ids, x->id)) {
        const mg_segment *s = mg_container_of(x, mg_segment, idn);
        if (tenant == NULL || strcmp(s->tenant, tenant) == 0)
            info_nolock(reg, s, &out[n++]);
    }
    pthread_mutex_unlock(&reg->lock);
    return n;
}

void mg_registry_get_stats(mg_registry *reg, mg_registry_stats *out)
{
    pthread_mutex_lock(&reg->lock);
    out->segments = reg->ready;
    out->registering = reg->registering;
    out->bytes = reg->bytes;
    out->locked_bytes = reg->locked_bytes;
    pthread_mutex_unlock(&reg->lock);
    out->jobs = __atomic_load_n(&reg->jobs, __ATOMIC_RELAXED);
    out->jobs_off_worker = __atomic_load_n(&reg->jobs_off_worker, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ asynchronous protocol */

void mg_registry_set_gate(mg_registry *reg, mg_register_gate_fn gate, void *arg)
{
    reg->gate = gate;
    reg->gate_arg = arg;
}

void mg_registry_gate(mg_registry *reg, int after_map)
{
    if (reg->gate)
        reg->gate(reg->gate_arg, after_map);
}

typedef struct reg_job {
    mg_registry *reg;
    mg_segment *seg;
    mg_register_done_fn done;
    mg_unregister_done_fn unreg_done;
    void *arg;
} reg_job;

static int register_work(void *arg)
{
    reg_job *j = arg;
    int rc;
    mg_registry_gate(j->reg, 0);
    rc = mg_segment_map(j->seg);
    mg_registry_gate(j->reg, 1);
    return rc;
}

static void register_done(void *arg, int result)
{
    reg_job *j = arg;
    char why[MG_SEG_ERROR_MAX] = "";
    if (result != 0)
        mg_strlcpy(why, j->seg->error, sizeof(why)); /* before the reservation goes */
    mg_registry_commit(j->reg, j->seg, result);
    j->done(j->arg, result == 0 ? j->seg : NULL, result, why);
    free(j);
}

/* Submits a copy of `job` to the workers. Returns 0, or an MG_ERR_* with nothing submitted. */
static int submit_job(mg_engine *engine, mg_cq *cq, const reg_job *job, mg_work_fn work,
                      mg_done_fn done)
{
    reg_job *j = malloc(sizeof(*j));
    int rc;
    if (j == NULL)
        return MG_ERR_NOMEM;
    *j = *job;
    rc = mg_engine_submit(engine, cq, work, done, j);
    if (rc != 0)
        free(j);
    return rc;
}

int mg_registry_register_async(mg_registry *reg, mg_engine *engine, mg_cq *cq, mg_segment *seg,
                               mg_register_done_fn done, void *arg)
{
    reg_job job = {reg, seg, done, NULL, arg};
    int rc = submit_job(engine, cq, &job, register_work, register_done);
    if (rc != 0)
        mg_registry_commit(reg, seg, rc); /* the reservation is undone */
    return rc;
}

static int unregister_work(void *arg)
{
    reg_job *j = arg;
    mg_segment_unmap(j->seg);
    return 0;
}

static void unregister_done(void *arg, int result)
{
    reg_job *j = arg;
    mg_segment_info info;
    mg_segment_get_info(j->reg, j->seg, &info);
    mg_registry_release(j->reg, j->seg);
    if (j->unreg_done)
        j->unreg_done(j->arg, &info);
    free(j);
}

int mg_registry_unregister_async(mg_registry *reg, mg_engine *engine, mg_cq *cq, mg_segment *seg,
                                 mg_unregister_done_fn done, void *arg)
{
    reg_job job = {reg, seg, NULL, done, arg};
    int rc = submit_job(engine, cq, &job, unregister_work, unregister_done);
    if (rc != 0)
        mg_registry_restore(reg, seg); /* no worker: it stays, listed */
    return rc;
}

int mg_segment_crc32c(const mg_segment *seg, const uint8_t *addr, uint64_t len, uint32_t *crc,
                      char *why, size_t cap)
{
    struct mg_procmem *pm = mg_segment_procmem(seg);
    enum { STEP = 1 << 20 };
    uint8_t *buf;
    int rc = 0;
    if (mg_segment_gpu(seg)) {
        snprintf(why, cap, "GPU memory is not readable by the daemon");
        return MG_ERR_STATE;
    }
    if (pm == NULL) {
        rc = mg_guarded_crc32c(crc, addr, len);
        if (rc)
            snprintf(why, cap, "the segment's file is shorter than registered");
        return rc;
    }
    if ((buf = malloc(len < STEP ? (len ? len : 1) : STEP)) == NULL)
        return MG_ERR_NOMEM;
    for (uint64_t done = 0; done < len && rc == 0;) {
        size_t n = len - done < STEP ? (size_t)(len - done) : STEP;
        rc = mg_procmem_read(pm, buf, (uint64_t)(uintptr_t)addr + done, n, why, cap);
        if (rc == 0)
            *crc = mg_crc32c(*crc, buf, n);
        done += n;
    }
    free(buf);
    return rc;
}
