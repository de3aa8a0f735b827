/*
 * mg_seg_ops: a segment through its kind's table (mg_seg_kind.h) — the worker's side of a
 * registration (map, then the records of the transports that reach it; unmap), what a kind
 * allows and the named refusal a path it lacks becomes, the daemon's own access to the bytes
 * (check a range, read, write, CRC32C), and the registration protocol as two asynchronous calls
 * (reserve -> map on a worker -> commit on the loop; the undo: unmap -> release).
 *
 * Nothing here asks which kind a segment is: it calls the segment's table, and a NULL operation
 * is the kind saying "not this".
 */
#include "mg_seg_kind.h"

#include "moongate/dataframe.h"
#include "moongate/engine.h"

#include "mg_str.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ what a kind allows */

const char *mg_seg_source_name(mg_seg_source source)
{
    const mg_seg_kind *k = mg_seg_kind_of(source);
    return k ? k->name : NULL;
}

unsigned mg_seg_source_caps(mg_seg_source source)
{
    const mg_seg_kind *k = mg_seg_kind_of(source);
    return k ? k->caps : 0;
}

unsigned mg_segment_caps(const mg_segment *seg)
{
    return seg->kind->caps;
}

/* The segment's kind does not do what `says` names: MG_ERR_STATE, the kind named in why. */
static int refuse(const mg_segment *seg, const char *says, char *why, size_t cap)
{
    const mg_seg_kind *k = seg->kind;
    snprintf(why, cap, "the segment is %s: it is not %s%s%s", k->what, says, k->hint[0] ? "; " : "",
             k->hint);
    return MG_ERR_STATE;
}

int mg_segment_allows(const mg_segment *seg, unsigned caps, char *why, size_t cap)
{
    static const char *const says[] = {
        "moved over TCP",
        "moved over RDMA",
        "copied on this daemon (peer \"\")",
        "a target of copies, peers or other tenants",
        "read or written inline",
        "registered from a descriptor",
        "bound to its connection",
        "named by address in the caller's process",
    };
    unsigned missing = caps & ~seg->kind->caps;
    if (missing == 0)
        return 0;
    for (unsigned b = 0; b < sizeof(says) / sizeof(says[0]); b++)
        if (missing & (1u << b))
            return refuse(seg, says[b], why, cap);
    return refuse(seg, "used that way", why, cap);
}

int mg_segment_gpu(const mg_segment *seg)
{
    /* Bytes only RDMA reaches: nothing of this process touches them. */
    return (seg->kind->caps & (MG_SEG_CAP_TCP | MG_SEG_CAP_COPY | MG_SEG_CAP_INLINE)) == 0;
}

mg_procmem *mg_segment_procmem(const mg_segment *seg)
{
    return seg->pm;
}

/* ------------------------------------------------------------------ the worker's side */

int mg_seg_cancelled(mg_segment *seg)
{
    if (!__atomic_load_n(&seg->cancel, __ATOMIC_RELAXED))
        return 0;
    mg_seg_error(seg, "registration cancelled: its caller is gone");
    return 1;
}

void mg_segment_cancel(mg_segment *seg)
{
    __atomic_store_n(&seg->cancel, 1, __ATOMIC_RELAXED);
}

int mg_segment_map(mg_segment *seg)
{
    const mg_seg_kind *k = seg->kind;
    mg_seg_transport *rdma = &seg->transports[MG_TRANSPORT_RDMA];
    int rc;
    mg_seg_count_job(seg);
    seg->error[0] = '\0';
    if (mg_seg_cancelled(seg))
        return MG_ERR_CANCELLED;
    if ((rc = k->map(seg)) != 0)
        goto fail;
    /* The TCP data plane serves a remote-accessible segment from this process's access. */
    seg->transports[MG_TRANSPORT_TCP].registered =
        seg->remote_accessible && (k->caps & MG_SEG_CAP_TCP);
    if (seg->env->rdma && k->rdma) { /* the devices hold the pages; remote access only if asked */
        if ((rc = k->rdma(seg)) != 0)
            goto fail;
        rdma->registered = seg->remote_accessible;
        rdma->lkey = mg_rdma_mr_lkey(seg->mr, 0);
        rdma->rkey = mg_rdma_mr_rkey(seg->mr, 0);
        rdma->addr = (uintptr_t)seg->addr;
    }
    return 0;

fail:
    mg_seg_teardown(seg);
    return rc;
}

void mg_seg_teardown(mg_segment *seg)
{
    if (seg->mr) { /* the devices let go of the pages before they are unmapped */
        mg_rdma_dereg(seg->mr);
        seg->mr = NULL;
        memset(&seg->transports[MG_TRANSPORT_RDMA], 0, sizeof(seg->transports[0]));
    }
    seg->kind->unmap(seg);
}

void mg_segment_unmap(mg_segment *seg)
{
    mg_seg_count_job(seg);
    mg_seg_teardown(seg);
}

int mg_segment_rdma_lkey(const mg_segment *seg, int dev, uint32_t *lkey)
{
    if (seg->mr == NULL || dev < 0 || dev >= mg_rdma_device_count(seg->env->rdma))
        return -1;
    *lkey = mg_rdma_mr_lkey(seg->mr, dev);
    return 0;
}

const char *mg_segment_error(const mg_segment *seg)
{
    return seg->error;
}

/* ------------------------------------------------------------------ the daemon's access */

int mg_segment_check_range(const mg_segment *seg, uint64_t off, uint64_t len, char *why, size_t cap)
{
    if (mg_bounds_check(seg->size, off, len) != 0) {
        snprintf(why, cap, "[%llu, +%llu) is outside the segment's %llu bytes",
                 (unsigned long long)off, (unsigned long long)len, (unsigned long long)seg->size);
        return MG_ERR_RANGE;
    }
    return seg->kind->range ? seg->kind->range(seg, off, len, why, cap) : 0;
}

int mg_segment_read(const mg_segment *seg, uint64_t off, void *dst, size_t n, char *why, size_t cap)
{
    if (seg->kind->read == NULL)
        return refuse(seg, "read by this daemon", why, cap);
    if (mg_bounds_check(seg->size, off, n) != 0)
        return mg_segment_check_range(seg, off, n, why, cap);
    return seg->kind->read(seg, off, dst, n, why, cap);
}

int mg_segment_write(const mg_segment *seg, uint64_t off, const void *src, size_t n, char *why,
                     size_t cap)
{
    if (seg->kind->write == NULL)
        return refuse(seg, "written by this daemon", why, cap);
    if (mg_bounds_check(seg->size, off, n) != 0)
        return mg_segment_check_range(seg, off, n, why, cap);
    return seg->kind->write(seg, off, src, n, why, cap);
}

void mg_seg_describe_offset(const mg_segment *seg, mg_segment_info *out)
{
    out->offset = seg->offset;
}

int mg_segment_sync(const mg_segment *seg, char *why, size_t cap)
{
    return seg->kind->sync ? seg->kind->sync(seg, why, cap) : 0;
}

void *mg_segment_land(const mg_segment *seg, size_t *cap, int *ticket, char *why, size_t whycap)
{
    return seg->kind->land ? seg->kind->land(seg, cap, ticket, why, whycap) : NULL;
}

int mg_segment_commit(const mg_segment *seg, int ticket, uint64_t off, size_t n, char *why,
                      size_t cap)
{
    if (n > 0 && mg_bounds_check(seg->size, off, n) != 0) {
        seg->kind->commit(seg, ticket, 0, 0, why, cap); /* given back */
        return mg_segment_check_range(seg, off, n, why, cap);
    }
    return seg->kind->commit(seg, ticket, off, n, why, cap);
}

void mg_segment_prefetch(const mg_segment *seg, const void *token, uint64_t off, size_t n)
{
    if (seg->kind->prefetch && mg_bounds_check(seg->size, off, n) == 0)
        seg->kind->prefetch(seg, token, off, n);
}

void mg_segment_prefetch_drop(const mg_segment *seg, const void *token)
{
    if (seg->kind->prefetch)
        seg->kind->drop(seg, token);
}

int mg_segment_lands(const mg_segment *seg)
{
    return seg->kind->land != NULL;
}

int mg_segment_crc32c(const mg_segment *seg, const uint8_t *addr, uint64_t len, uint32_t *crc,
                      char *why, size_t cap)
{
    enum { STEP = 1 << 20 };
    uint64_t off = (uint64_t)(uintptr_t)addr - (uint64_t)(uintptr_t)seg->addr;
    uint8_t *buf;
    int rc = 0;
    if (seg->kind->crc32c)
        return seg->kind->crc32c(seg, off, len, crc, why, cap);
    if (seg->kind->read == NULL)
        return refuse(seg, "read by this daemon", why, cap);
    if ((buf = malloc(len < STEP ? (len ? len : 1) : STEP)) == NULL)
        return MG_ERR_NOMEM;
    for (uint64_t done = 0; done < len && rc == 0;) { /* its bytes read where they are, in steps */
        size_t n = len - done < STEP ? (size_t)(len - done) : STEP;
        rc = seg->kind->read(seg, off + done, buf, n, why, cap);
        if (rc == 0)
            *crc = mg_crc32c(*crc, buf, n);
        done += n;
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ asynchronous protocol */

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
    mg_registry_drain(j->reg, j->seg); /* data-plane slices still passing */
    mg_segment_unmap(j->seg);
    return 0;
}

static void unregister_done(void *arg, int result)
{
    reg_job *j = arg;
    mg_segment_info info;
    if (result != 0) { /* given up as the workers stopped (shutdown): unmapped here, not leaked */
        mg_registry_drain(j->reg, j->seg);
        mg_segment_unmap(j->seg);
    }
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
