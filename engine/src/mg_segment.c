/*
 * mg_segment: the segment registry (see moongate/segment.h).
 *
 * The registry keeps what every segment has whatever its memory is: ids, names, ranges,
 * holders, the per-process address index (mg_seg_addrs.c), reservations and their commit or
 * rollback, limits and quotas. Where the bytes are and how they are reached is the segment's
 * kind's (mg_seg_kind.h): the registry picks the kind's table from the spec's source once, in
 * mg_registry_reserve, and calls it from then on; a spec's checks are mg_seg_spec.c, the calls
 * that go through the table on workers (map, unmap, read, write, ...) mg_seg_ops.c.
 *
 * Storage: two chained hash tables of fixed size (a power of two >= max_segments), one by id and
 * one by (tenant, name), plus a list of all segments. The id table is common/mg_idmap.h, shared
 * with the pools, which mints the ids: a bijective 64-bit mix of a counter that starts at a
 * random value, so they are unique, never 0 and not guessable from one another.
 * The mutex guards the tables, the list, the counters and each segment's state and refs (but
 * mg_registry_hold's, atomic: a holder adding one); it is held for O(1) work except in
 * mg_registry_list (O(n), n <= max_segments).
 *
 * Files the daemon creates are named "moongate-seg-<id>" in shm_dir (a client's file may not use
 * that prefix); the registry removes an earlier daemon's when it opens. A third hash table by
 * (st_dev, st_ino) keeps one file to one tenant: whatever name, link, rename or passed
 * descriptor reaches an inode, a tenant other than the one that registered it first is refused
 * (mg_seg_claim_file, which the kinds that map a file call).
 */
#include "mg_seg_kind.h"

#include "mg_hash.h"
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
#include <unistd.h>

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
    pthread_cond_t passed; /* a segment going lost its last reference (mg_registry_drain) */
    mg_seg_env env;        /* what the kinds use of the configuration */
    uint64_t max_segments, max_bytes, max_segment_bytes, max_tenant_segments, max_tenant_bytes;
    mg_register_gate_fn gate; /* a test hook (mg_registry_set_gate) */
    void *gate_arg;
    tenant_count *tenants;
    size_t nbuckets;
    mg_idmap ids;
    mg_segment **by_name, **by_req, **by_file;
    mg_segment *all;
    mg_seg_addrs addrs;             /* segments with a client address */
    uint64_t jobs, jobs_off_worker; /* mg_segment_map/unmap calls, and those off a worker */
    uint64_t count, ready, registering, bytes, locked_bytes;
    uint64_t entered; /* segments entered so far: their order (mg_region.order) */
};

const char *const mg_transport_names[MG_TRANSPORT_COUNT] = {"tcp", "rdma"};

/* ------------------------------------------------------------------ the kinds */

/* The one place a source becomes a kind: each kind's table is in its own file. */
static const mg_seg_kind *const mg_seg_kinds[] = {
    [MG_SEG_ANON] = &mg_seg_anon,     [MG_SEG_SHM] = &mg_seg_shm,
    [MG_SEG_FD] = &mg_seg_fd,         [MG_SEG_PROCESS] = &mg_seg_proc,
    [MG_SEG_DMABUF] = &mg_seg_dmabuf, [MG_SEG_STAGED] = &mg_seg_staged,
};

const mg_seg_kind *mg_seg_kind_of(mg_seg_source source)
{
    size_t i = (size_t)source;
    return i < sizeof(mg_seg_kinds) / sizeof(mg_seg_kinds[0]) ? mg_seg_kinds[i] : NULL;
}

const mg_seg_kind *const *mg_seg_kinds_all(size_t *n)
{
    *n = sizeof(mg_seg_kinds) / sizeof(mg_seg_kinds[0]);
    return mg_seg_kinds;
}

/* ------------------------------------------------------------------ helpers */

int mg_bounds_check(uint64_t size, uint64_t offset, uint64_t length)
{
    if (offset > size || length > size - offset)
        return MG_ERR_RANGE;
    return 0;
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

void mg_seg_error(mg_segment *seg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(seg->error, sizeof(seg->error), fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ registry */

/* Counts a registration job and whether it runs where it must: on an engine worker. */
void mg_seg_count_job(mg_segment *seg)
{
    __atomic_add_fetch(&seg->reg->jobs, 1, __ATOMIC_RELAXED);
    if (!mg_engine_on_worker())
        __atomic_add_fetch(&seg->reg->jobs_off_worker, 1, __ATOMIC_RELAXED);
}

static void remove_stale_files(mg_registry *reg)
{
    int fd = dup(reg->env.dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    unsigned removed = 0;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, MG_SEG_FILE_PREFIX, sizeof(MG_SEG_FILE_PREFIX) - 1) == 0 &&
            unlinkat(reg->env.dirfd, e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    if (removed)
        mg_info("segments_cleanup", "shm_dir=%s removed=%u reason=\"files of an earlier daemon\"",
                reg->env.shm_dir, removed);
}

/* Frees what mg_registry_new made before it failed, or what mg_registry_del left. */
static void free_tables(mg_registry *reg)
{
    mg_idmap_free(&reg->ids);
    free(reg->addrs.a);
    free(reg->by_name);
    free(reg->by_req);
    free(reg->by_file);
    free(reg->env.shm_dir);
    free(reg);
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
    reg->env.rdma = cfg->rdma;
    reg->env.process_memory_off = cfg->process_memory_off;
    reg->env.tcp_targets = cfg->tcp_targets;
    mg_idmap_init(&reg->ids, nb);
    reg->by_name = calloc(nb, sizeof(*reg->by_name));
    reg->by_req = calloc(nb, sizeof(*reg->by_req));
    reg->by_file = calloc(nb, sizeof(*reg->by_file));
    reg->env.shm_dir = strdup(cfg->shm_dir);
    if (reg->ids.buckets == NULL || reg->by_name == NULL || reg->by_req == NULL ||
        reg->by_file == NULL || reg->env.shm_dir == NULL) {
        free_tables(reg);
        return MG_ERR_NOMEM;
    }
    reg->env.dirfd = open(cfg->shm_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (reg->env.dirfd < 0 || fstat(reg->env.dirfd, &st) != 0) {
        mg_error("registry_config", "shm_dir=%s error=\"%s\"", cfg->shm_dir, strerror(errno));
        if (reg->env.dirfd >= 0)
            close(reg->env.dirfd);
        free_tables(reg);
        return MG_ERR_SYSTEM;
    }
    reg->env.file_mode = cfg->file_mode;
    reg->env.file_gid = cfg->file_gid;
    reg->max_tenant_segments = cfg->max_tenant_segments;
    reg->max_tenant_bytes = cfg->max_tenant_bytes;
    reg->max_segments = cfg->max_segments;
    reg->max_bytes = cfg->max_registered_bytes;
    reg->max_segment_bytes = cfg->max_segment_bytes;
    pthread_mutex_init(&reg->lock, NULL);
    pthread_cond_init(&reg->passed, NULL);
    remove_stale_files(reg);
    *out = reg;
    return 0;
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
    mg_seg_addrs_remove(&reg->addrs, seg);
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
        mg_seg_teardown(seg);
        free(seg);
    }
    close(reg->env.dirfd);
    pthread_cond_destroy(&reg->passed);
    pthread_mutex_destroy(&reg->lock);
    free_tables(reg);
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

static mg_segment *find_id_nolock(mg_registry *reg, uint64_t id)
{
    mg_idmap_node *n = mg_idmap_find(&reg->ids, id);
    return n ? mg_container_of(n, mg_segment, idn) : NULL;
}

/* ---- the registering processes' addresses (mg_seg_addrs.c, under the mutex) ---- */

int mg_registry_resolve(mg_registry *reg, const char *tenant, const mg_proc *proc, uint64_t addr,
                        uint64_t len, uint64_t *id, uint64_t *offset, char *err)
{
    int rc;
    pthread_mutex_lock(&reg->lock);
    rc = mg_seg_addrs_resolve(&reg->addrs, tenant, proc, addr, len, id, offset, err);
    pthread_mutex_unlock(&reg->lock);
    return rc;
}

size_t mg_registry_regions(mg_registry *reg, const char *tenant, const mg_proc *proc,
                           uint64_t after, mg_region *out, size_t max)
{
    size_t n;
    pthread_mutex_lock(&reg->lock);
    n = mg_seg_addrs_regions(&reg->addrs, tenant, proc, after, out, max);
    pthread_mutex_unlock(&reg->lock);
    return n;
}

/* The spec's checks (mg_seg_spec.c, the kind's among them) and the largest segment allowed.
 * Returns 0 with the kind and the location, or an MG_ERR_* with err set. */
static int check_spec(const mg_registry *reg, const mg_segment_spec *spec, const mg_seg_kind **kind,
                      char loc[16], char *err)
{
    int rc = mg_seg_check_spec(&reg->env, spec, kind, loc, err);
    if (rc != 0)
        return rc;
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
static void enter_nolock(mg_registry *reg, mg_segment *seg, const mg_segment_spec *spec)
{
    size_t b;
    mg_idmap_add(&reg->ids, &seg->idn);
    seg->order = ++reg->entered;
    if (seg->kind->enter)
        seg->kind->enter(seg, spec);
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
    const mg_seg_kind *kind;
    mg_segment *seg;
    tenant_count *tc = NULL;
    char loc[16];
    int rc;

    err[0] = '\0';
    if ((rc = check_spec(reg, spec, &kind, loc, err)) != 0)
        return rc;
    seg = calloc(1, sizeof(*seg));
    if (seg == NULL) {
        snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
        return MG_ERR_NOMEM;
    }
    seg->reg = reg;
    seg->env = &reg->env;
    seg->kind = kind; /* the one choice of kind: every later call goes through its table */
    seg->fd = kind->caps & MG_SEG_CAP_FD ? spec->fd : -1;
    seg->offset = spec->offset;
    seg->client_addr = spec->client_addr;
    if (spec->client_addr)
        seg->client = spec->client;
    snprintf(seg->tenant, sizeof(seg->tenant), "%s", spec->tenant);
    snprintf(seg->name, sizeof(seg->name), "%s", spec->name);
    memcpy(seg->location, loc, sizeof(loc));
    seg->size = spec->size;
    seg->remote_accessible = spec->remote_accessible != 0;
    seg->memlock = spec->memlock;
    seg->prefault = spec->prefault != 0;
    seg->provisioned = spec->provisioned;
    snprintf(seg->share, sizeof(seg->share), "%s", spec->share ? spec->share : "");
    seg->caller_uid = spec->caller_uid;
    if (spec->request_id)
        snprintf(seg->request_id, sizeof(seg->request_id), "%s", spec->request_id);

    pthread_mutex_lock(&reg->lock);
    rc = seg->request_id[0] ? earlier_request_nolock(reg, seg, out, err) : 0;
    if (rc == 0)
        rc = limits_nolock(reg, spec, seg, &tc, err);
    if (rc == 0 && seg->client_addr)
        rc = mg_seg_addrs_insert(&reg->addrs, seg, err);
    if (rc != 0) {
        pthread_mutex_unlock(&reg->lock);
        free(seg);
        return rc;
    }
    tc->segments++;
    if (!seg->provisioned)
        tc->bytes += spec->size;
    enter_nolock(reg, seg, spec);
    pthread_mutex_unlock(&reg->lock);
    *out = seg;
    return 0;
}

int mg_registry_reserve(mg_registry *reg, const mg_segment_spec *spec, mg_segment **out, char *err)
{
    int rc = reserve(reg, spec, out, err);
    /* A passed descriptor is the registry's: the segment entered holds it, else it is closed. */
    if (rc != 0 && (mg_seg_source_caps(spec->source) & MG_SEG_CAP_FD) && spec->fd >= 0)
        close(spec->fd);
    return rc;
}

int mg_seg_grow(mg_segment *seg, uint64_t size)
{
    mg_registry *reg = seg->reg;
    int rc = 0;
    if (reg->max_segment_bytes && size > reg->max_segment_bytes) {
        mg_seg_error(seg, "file of %llu bytes is above the largest segment allowed, %llu",
                     (unsigned long long)size, (unsigned long long)reg->max_segment_bytes);
        return MG_ERR_FULL;
    }
    pthread_mutex_lock(&reg->lock);
    tenant_count *tc = tenant_nolock(reg, seg->tenant, 0);
    if (reg->max_bytes && size > reg->max_bytes - reg->bytes) {
        mg_seg_error(seg, "%llu more bytes would exceed the registered-bytes limit of %llu",
                     (unsigned long long)size, (unsigned long long)reg->max_bytes);
        rc = MG_ERR_FULL;
    } else if (reg->max_tenant_bytes && tc && !seg->provisioned &&
               size > reg->max_tenant_bytes - tc->bytes) {
        mg_seg_error(seg,
                     "%llu more bytes would exceed tenant \"%s\"'s registered-bytes quota of %llu "
                     "(--max-tenant-bytes)",
                     (unsigned long long)size, seg->tenant,
                     (unsigned long long)reg->max_tenant_bytes);
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

int mg_seg_claim_file(mg_segment *seg, const struct stat *st, const char *what)
{
    mg_registry *reg = seg->reg;
    size_t b = file_bucket(reg, st->st_dev, st->st_ino);
    pthread_mutex_lock(&reg->lock);
    for (mg_segment *s = reg->by_file[b]; s; s = s->file_next) {
        if (s->dev == st->st_dev && s->ino == st->st_ino && strcmp(s->tenant, seg->tenant) != 0) {
            pthread_mutex_unlock(&reg->lock);
            mg_seg_error(seg,
                         "%s is another tenant's segment; its owner shares it by share_with, "
                         "and it is never registered again for another tenant",
                         what);
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

/* A segment's references: changed under the lock, but for mg_registry_hold's (atomic, so read
 * atomically everywhere). */
#define REFS(seg)        __atomic_load_n(&(seg)->refs, __ATOMIC_ACQUIRE)
#define REFS_ADD(seg, d) __atomic_add_fetch(&(seg)->refs, (uint32_t)(d), __ATOMIC_ACQ_REL)

static int acquire(mg_registry *reg, const char *tenant, uint64_t id, const char *holder,
                   int passing, mg_segment **out)
{
    mg_segment *seg;
    pthread_mutex_lock(&reg->lock);
    seg = find_id_nolock(reg, id);
    if (seg == NULL || seg->state != MG_SEG_READY || !may_use(seg, tenant)) {
        pthread_mutex_unlock(&reg->lock);
        return MG_ERR_NOT_FOUND;
    }
    REFS_ADD(seg, 1);
    if (passing) /* the holder named stays the latest lasting one */
        seg->passing++;
    else
        snprintf(seg->holder, sizeof(seg->holder), "%s", holder ? holder : "");
    pthread_mutex_unlock(&reg->lock);
    *out = seg;
    return 0;
}

int mg_registry_acquire(mg_registry *reg, const char *tenant, uint64_t id, const char *holder,
                        mg_segment **out)
{
    return acquire(reg, tenant, id, holder, 0, out);
}

int mg_registry_acquire_passing(mg_registry *reg, const char *tenant, uint64_t id, mg_segment **out)
{
    return acquire(reg, tenant, id, NULL, 1, out);
}

void mg_registry_hold(mg_registry *reg, mg_segment *seg, uint32_t n)
{
    (void)reg; /* the caller's reference keeps it READY: no lock */
    REFS_ADD(seg, n);
}

static void put(mg_registry *reg, mg_segment *seg, int passing)
{
    pthread_mutex_lock(&reg->lock);
    if (REFS(seg) > 0)
        REFS_ADD(seg, -1);
    if (passing && seg->passing > 0)
        seg->passing--;
    if (REFS(seg) == 0 && seg->state == MG_SEG_UNREGISTERING)
        pthread_cond_broadcast(&reg->passed);
    pthread_mutex_unlock(&reg->lock);
}

void mg_registry_put(mg_registry *reg, mg_segment *seg)
{
    put(reg, seg, 0);
}

void mg_registry_put_passing(mg_registry *reg, mg_segment *seg)
{
    put(reg, seg, 1);
}

void mg_registry_drain(mg_registry *reg, mg_segment *seg)
{
    pthread_mutex_lock(&reg->lock);
    while (REFS(seg) > 0)
        pthread_cond_wait(&reg->passed, &reg->lock);
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
    if (REFS(seg) > seg->passing) { /* slices passing are waited for (mg_registry_drain) */
        snprintf(err, MG_SEG_ERROR_MAX,
                 "segment %llu (\"%s\") is held by %u lease(s) or transfer(s), the latest: %s",
                 (unsigned long long)id, seg->name, REFS(seg) - seg->passing,
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
    seg->kind->describe(seg, out); /* path, offset */
    out->source = seg->kind->source;
    out->client_addr = seg->client_addr;
    out->client_pid = seg->client.pid;
    out->size = seg->size;
    out->remote_accessible = seg->remote_accessible;
    out->locked = seg->locked;
    memcpy(out->transports, seg->transports, sizeof(out->transports));
    if (seg->state == MG_SEG_READY && seg->mr && seg->remote_accessible) {
        int n = mg_rdma_device_count(reg->env.rdma);
        for (int i = 0; i < n && i < MG_RDMA_MAX_DEVICES; i++)
            out->rdma_rkeys[out->rdma_ndev++] = mg_rdma_mr_rkey(seg->mr, i);
    }
    out->state = seg->state;
    out->refs = REFS(seg);
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

/* ------------------------------------------------------------------ the test hook */

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
