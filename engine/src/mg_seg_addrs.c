/*
 * mg_seg_addrs: the registry's index of the segments registered with the registering process's
 * address of them (client_addr): an array sorted by (pid, start time, address), searched by
 * halving. mg_registry_resolve turns a process's address into a segment and offset here, and a
 * new range of a process is checked here against the ranges it has. The registry's mutex guards
 * it: every function is called with it held.
 */
#include "mg_seg_kind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* How many entries of x->a sort at or before (p, a). */
static size_t addrs_upper(const mg_seg_addrs *x, const mg_proc *p, uint64_t a)
{
    size_t lo = 0, hi = x->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (addr_cmp(p, a, x->a[mid]) >= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A range of process p that overlaps [a, a + n), or NULL. */
static mg_segment *overlap(const mg_seg_addrs *x, const mg_proc *p, uint64_t a, uint64_t n)
{
    size_t i = addrs_upper(x, p, a);
    if (i > 0 && same_proc(p, x->a[i - 1]) && a - x->a[i - 1]->client_addr < x->a[i - 1]->size)
        return x->a[i - 1];
    if (i < x->n && same_proc(p, x->a[i]) && x->a[i]->client_addr - a < n)
        return x->a[i];
    return NULL;
}

/* Enters seg (its client address set) in x->a, unless it overlaps a range of the same
 * process. Returns 0, MG_ERR_EXISTS or MG_ERR_NOMEM, with err set. */
int mg_seg_addrs_insert(mg_seg_addrs *x, mg_segment *seg, char *err)
{
    mg_segment *o = overlap(x, &seg->client, seg->client_addr, seg->size);
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
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        mg_segment **a = realloc(x->a, cap * sizeof(*a));
        if (a == NULL) {
            snprintf(err, MG_SEG_ERROR_MAX, "out of memory");
            return MG_ERR_NOMEM;
        }
        x->a = a;
        x->cap = cap;
    }
    i = addrs_upper(x, &seg->client, seg->client_addr);
    memmove(&x->a[i + 1], &x->a[i], (x->n - i) * sizeof(*x->a));
    x->a[i] = seg;
    x->n++;
    seg->in_addrs = 1;
    return 0;
}

void mg_seg_addrs_remove(mg_seg_addrs *x, mg_segment *seg)
{
    size_t i = addrs_upper(x, &seg->client, seg->client_addr);
    if (!seg->in_addrs || i == 0 || x->a[i - 1] != seg)
        return;
    memmove(&x->a[i - 1], &x->a[i], (x->n - i) * sizeof(*x->a));
    x->n--;
    seg->in_addrs = 0;
}

int mg_seg_addrs_resolve(const mg_seg_addrs *x, const char *tenant, const mg_proc *proc,
                         uint64_t addr, uint64_t len, uint64_t *id, uint64_t *offset, char *err)
{
    const mg_segment *s, *next;
    size_t i;
    i = addrs_upper(x, proc, addr);
    s = i > 0 ? x->a[i - 1] : NULL;
    if (s == NULL || !same_proc(proc, s) || addr - s->client_addr >= s->size ||
        s->state != MG_SEG_READY || strcmp(s->tenant, tenant) != 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "no region this process registered holds address 0x%llx (regions are "
                 "registered with client_address; an address of an earlier registration is "
                 "gone with it)",
                 (unsigned long long)addr);
        return MG_ERR_NOT_FOUND;
    }
    *offset = addr - s->client_addr;
    if (len > s->size - *offset) {
        next = i < x->n && same_proc(proc, x->a[i]) && x->a[i]->client_addr - addr < len ? x->a[i]
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
        return MG_ERR_RANGE;
    }
    *id = s->idn.id;
    return 0;
}

size_t mg_seg_addrs_regions(const mg_seg_addrs *x, const char *tenant, const mg_proc *proc,
                            uint64_t after, mg_region *out, size_t max)
{
    size_t n = 0;
    for (size_t i = addrs_upper(x, proc, after); i < x->n && n < max; i++) {
        const mg_segment *s = x->a[i];
        if (!same_proc(proc, s))
            break;
        if (s->state == MG_SEG_READY && !strcmp(s->tenant, tenant))
            out[n++] =
                (mg_region){s->idn.id, s->client_addr, s->size, s->remote_accessible, s->order};
    }
    return n;
}

uint64_t mg_segment_client_addr(const mg_segment *seg, const mg_proc *proc)
{
    return seg->client_addr && same_proc(proc, seg) ? seg->client_addr : 0;
}
