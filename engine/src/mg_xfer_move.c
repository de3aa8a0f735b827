/*
 * mg_xfer_move: the movers of a transfer job, on a worker (see moongate/xfer.h), and the
 * planning of a request's parts.
 */
#include "moongate/xfer.h"

#include "mg_log.h"
#include "moongate/fault.h"
#include "moongate/procmem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COPY_STEP (8u << 20) /* a copy sees a stop between steps this long */

void mg_xfer_part_say(mg_xfer_part *pt, const char *fmt, ...)
{
    char why[MG_XFER_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    free(pt->msg);
    pt->msg = strdup(why);
}

/* pt fails with rc and the message in why (a mover's own buffer); returns rc. */
static int part_fails(mg_xfer_part *pt, int rc, const char *why)
{
    mg_xfer_part_say(pt, "%s", why);
    return pt->rc = rc;
}

/* Where offset off of pt's local range lies in its unmapped segment. */
static uint64_t unmapped_off(const mg_xfer_part *pt, uint64_t off)
{
    return (uint64_t)((uintptr_t)pt->local - (uintptr_t)mg_segment_addr(pt->unmapped)) + off;
}

/* One step of a copy whose local side is a segment this daemon does not map (pt->unmapped):
 * straight between it and the other range's mapping, with its kind's read or write. Returns 0
 * or an MG_ERR_* with why set. */
static int step_unmapped(mg_xfer_part *pt, uint64_t done, uint64_t step, char *why, size_t cap)
{
    uint64_t off = unmapped_off(pt, done);
    int rc;
    if (pt->write)
        return mg_segment_read(pt->unmapped, off, pt->other + done, step, why, cap);
    rc = mg_segment_write(pt->unmapped, off, pt->other + done, step, why, cap);
    return rc ? rc : mg_segment_sync(pt->unmapped, why, cap);
}

/* A part of a copy between two ranges of this daemon, in COPY_STEP steps. */
static int part_copy(mg_xfer_part *pt, const int *stop_word)
{
    uint8_t *from = pt->write ? pt->local : pt->other;
    uint8_t *to = pt->write ? pt->other : pt->local;
    char why[MG_XFER_MSG_MAX] = "";
    for (uint64_t done = 0, step; done < pt->length; done += step) {
        int stop = __atomic_load_n(stop_word, __ATOMIC_ACQUIRE), rc;
        if (stop) {
            mg_xfer_part_say(pt, "stopped (%s) with %llu of %llu bytes copied", mg_strerror(stop),
                             (unsigned long long)done, (unsigned long long)pt->length);
            return pt->rc = stop;
        }
        step = pt->length - done < COPY_STEP ? pt->length - done : COPY_STEP;
        if (pt->unmapped && (rc = step_unmapped(pt, done, step, why, sizeof(why))) != 0)
            return part_fails(pt, rc, why);
        if (pt->unmapped) {
            __atomic_fetch_add(&pt->progress, step, __ATOMIC_RELAXED);
            continue;
        }
        if (mg_guarded_copy(to + done, from + done, step) != 0) {
            mg_xfer_part_say(pt,
                             "a segment's file is shorter than registered (a client truncated "
                             "it): copy stopped at byte %llu of %llu",
                             (unsigned long long)done, (unsigned long long)pt->length);
            return pt->rc = MG_ERR_DATA_LOSS;
        }
        __atomic_fetch_add(&pt->progress, step, __ATOMIC_RELAXED);
    }
    return pt->rc = 0;
}

/* Every op not finished takes rc and, when `why` is set, that message. */
static void ops_fail(mg_dp_op *ops, size_t n, int rc, const char *why)
{
    for (size_t i = 0; i < n; i++) {
        ops[i].rc = rc;
        if (why && ops[i].err != why)
            snprintf(ops[i].err, ops[i].errcap, "%s", why);
    }
}

/* Runs ops on the peer's connections: an idle one, and once more on a fresh one when that one
 * turns out broken (the peer closed it, or restarted). */
static void ops_run(mg_dp_op *ops, size_t n, const mg_dp_options *o, const mg_xfer_link *link,
                    char *err, size_t errcap)
{
    mg_dp_conn *c = mg_dp_pool_take(link->idle);
    int fresh = 0;
    for (;;) {
        int stop = __atomic_load_n(link->stop, __ATOMIC_ACQUIRE), rc;
        if (stop == 0 && c == NULL) {
            fresh = 1;
            rc = mg_dp_connect(&c, link->host, link->port, link->token, link->io_timeout_ms,
                               &link->tcp, link->stop, err, errcap);
            if (rc != 0) {
                ops_fail(ops, n, rc, err);
                return;
            }
        }
        if (stop != 0) {
            char why[64];
            snprintf(why, sizeof(why), "stopped (%s) before it started", mg_strerror(stop));
            ops_fail(ops, n, stop, why);
            mg_dp_pool_give(link->idle, c);
            return;
        }
        for (size_t i = 0; i < n; i++)
            __atomic_store_n(ops[i].progress, 0, __ATOMIC_RELAXED);
        rc = mg_dp_run(c, ops, n, o);
        if (rc == 0) {
            mg_dp_pool_give(link->idle, c);
            return;
        }
        mg_dp_close(c);
        c = NULL;
        if (rc != MG_ERR_UNAVAILABLE || fresh)
            return;
        mg_debug("transfer_retry", "peer=%s reason=\"%s\"", link->peer, err);
    }
}

/* A checksummed slice is copied whole into a stage before its header (which carries the CRC)
 * goes: slices of at most this keep the stage in cache while send reads it. */
#define DIGEST_SLICE_BYTES (256u << 10)

/* Parts of a group this small on average go 64 to a window instead of 32: the window refills
 * once half of it is answered, so a send carries 32 of them (4096 x 4 KiB WRITE, 4 in flight:
 * 1.50 -> 1.75 GB/s; 64 KiB slices lost with 64: 4.42 -> 3.72). */
#define TINY_SLICE_BYTES (8u << 10)

/* The data plane's options for a link's slices. */
static mg_dp_options tcp_options(const mg_xfer_link *link)
{
    return (mg_dp_options){.slice_bytes = link->crc && link->slice_bytes > DIGEST_SLICE_BYTES
                                              ? DIGEST_SLICE_BYTES
                                              : link->slice_bytes,
                           .window = 16,
                           .crc = link->crc,
                           .stop = link->stop, /* a batch's requests stop together */
                           .in_flight = link->in_flight};
}

/* A part's local side in a segment this daemon does not map (pt->unmapped), for the data
 * plane: its bytes at pt->local + off, read and written with the kind's ops (process_vm for a
 * process's memory, the device copies of staged GPU memory). */
static int unmapped_get(void *ctx, uint64_t off, void *dst, size_t n, char *why, size_t cap)
{
    const mg_xfer_part *pt = ctx;
    return mg_segment_read(pt->unmapped, unmapped_off(pt, off), dst, n, why, cap);
}

static void unmapped_ahead(void *ctx, uint64_t off, size_t n)
{
    const mg_xfer_part *pt = ctx;
    mg_segment_prefetch(pt->unmapped, pt, unmapped_off(pt, off), n);
}

static int unmapped_put(void *ctx, uint64_t off, const void *src, size_t n, char *why, size_t cap)
{
    const mg_xfer_part *pt = ctx;
    int rc = mg_segment_write(pt->unmapped, unmapped_off(pt, off), src, n, why, cap);
    return rc ? rc : mg_segment_sync(pt->unmapped, why, cap);
}

/* The parts chained from `head` as one stream of slices on one connection (mg_dp_run). Those
 * whose local side is a client process's memory go through the connection's stage, copied with
 * process_vm as their slices go and come (mg_dp_access): the window stays full meanwhile. */
static int parts_tcp(mg_xfer_part *head, const mg_xfer_link *link)
{
    mg_dp_options o = tcp_options(link);
    size_t n = 0, i = 0;
    uint64_t bytes = 0;
    mg_dp_op *ops;
    mg_dp_access *access;
    char(*why)[MG_XFER_MSG_MAX]; /* each op's message, if it fails (untouched until then) */
    for (mg_xfer_part *pt = head; pt; pt = pt->next) {
        n++;
        bytes += pt->length;
    }
    if (n > 1) /* small slices: more of them in flight, the smallest most */
        o.window = bytes / n <= TINY_SLICE_BYTES ? 64 : 32;
    ops = calloc(n, sizeof(*ops));
    access = calloc(n, sizeof(*access));
    why = ops && access ? malloc(n * sizeof(*why)) : NULL;
    if (why == NULL) {
        for (mg_xfer_part *pt = head; pt; pt = pt->next)
            part_fails(pt, MG_ERR_NOMEM, "out of memory");
        free(access);
        free(ops);
        return MG_ERR_NOMEM;
    }
    for (mg_xfer_part *pt = head; pt; pt = pt->next, i++) {
        pt->rc = 0;
        why[i][0] = '\0';
        access[i] = (mg_dp_access){unmapped_get, unmapped_put, pt, unmapped_ahead};
        ops[i] = (mg_dp_op){.write = pt->write,
                            .lease = pt->lease,
                            .target = pt->target,
                            .offset = pt->remote,
                            .buf = pt->unmapped ? NULL : pt->local,
                            .access = pt->unmapped ? &access[i] : NULL,
                            .len = pt->length,
                            .progress = &pt->progress,
                            .err = why[i],
                            .errcap = sizeof(why[i])};
    }
    ops_run(ops, n, &o, link, ops[0].err, ops[0].errcap);
    i = 0;
    for (mg_xfer_part *pt = head; pt; pt = pt->next, i++) {
        if ((pt->rc = ops[i].rc) != 0)
            mg_xfer_part_say(pt, "%s", why[i]);
        if (pt->unmapped) /* what it fetched ahead and did not take goes with it */
            mg_segment_prefetch_drop(pt->unmapped, pt);
    }
    free(why);
    free(access);
    free(ops);
    return head->rc;
}

/* The parts over the peer's RDMA queue pairs, one after another. */
static int parts_rdma(mg_xfer_part *head, const mg_xfer_link *link)
{
    for (mg_xfer_part *pt = head; pt; pt = pt->next) {
        mg_rdma_op op = {pt->write, pt->local, 0, pt->remote, 0, pt->length};
        char why[MG_XFER_MSG_MAX] = "";
        __atomic_store_n(&pt->progress, 0, __ATOMIC_RELAXED);
        pthread_mutex_lock(link->lock);
        pt->rc = mg_rdma_move_multi(link->conns, link->nconns, &op, pt->lkeys, pt->rkeys,
                                    link->slice_bytes, 16, link->stop, &pt->progress,
                                    link->io_timeout_ms, why, sizeof(why));
        pthread_mutex_unlock(link->lock);
        if (pt->rc)
            part_fails(pt, pt->rc, why);
    }
    return head->rc;
}

int mg_xfer_run(mg_xfer_kind kind, mg_xfer_part *head, const mg_xfer_link *link)
{
    switch (kind) {
    case MG_XFER_COPY:
        for (mg_xfer_part *pt = head; pt; pt = pt->next)
            part_copy(pt, link->stop);
        return head->rc;
    case MG_XFER_RDMA:
        return parts_rdma(head, link);
    default:
        return parts_tcp(head, link);
    }
}

unsigned mg_xfer_plan(uint64_t length, uint64_t slice, unsigned max_parts, uint64_t part_min,
                      int rdma, uint64_t *each)
{
    uint64_t n = part_min ? length / part_min : 1;
    if (n > max_parts)
        n = max_parts;
    if (n < 1 || rdma)
        n = 1;
    if (slice == 0)
        slice = 1;
    *each = (length / n + slice - 1) / slice * slice;
    if (*each == 0)
        *each = slice;
    return (unsigned)n;
}
