/*
 * Unit tests for submission rings (moongate/ring.h) on a real ring thread and completion
 * queue, with this test as both the process (writing the shared memory as ringwire.h says) and
 * the loop (draining the queue): submissions come to the loop copied and in order; the thread
 * takes only what the completion queue has room to answer, and takes the rest when the process
 * reads completions and rings; a process that makes its counters impossible breaks only its
 * ring, which says why; a closed ring's submissions are let go unseen.
 */
#include "mg_test.h"
#include "moongate/ring.h"

#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct loop {
    mg_ring_sub *got[64];
    int n;
} loop;

static void on_sub(void *arg, mg_ring_sub *s)
{
    loop *l = arg;
    if (l->n < 64)
        l->got[l->n++] = s;
    else
        mg_ring_sub_free(s);
}

/* The process's view of ring r: its memory mapped from the descriptor the daemon hands over. */
typedef struct proc {
    uint8_t *mem;
    uint64_t size;
    mg_ring_hdr *h;
    int doorbell, bell;
} proc;

static void proc_map(mg_ring *r, proc *p)
{
    int fds[3];
    mg_ring_fds(r, fds, &p->size);
    p->mem = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    CU_ASSERT_FATAL(p->mem != MAP_FAILED);
    p->h = (mg_ring_hdr *)p->mem;
    p->doorbell = fds[1];
    p->bell = fds[2];
}

/* Posts a strided entry of `count` blocks with user_data ud, and rings. */
static void post(proc *p, uint64_t ud, uint32_t count)
{
    uint32_t tail = p->h->sq_tail;
    mg_ring_sqe *e =
        (mg_ring_sqe *)(p->mem + p->h->sq_off + (tail & (p->h->sq_entries - 1)) * MG_RING_SQE_SIZE);
    memset(e, 0, sizeof(*e));
    e->user_data = ud;
    e->op = MG_RING_WRITE;
    e->kind = MG_RING_STRIDED;
    e->count = count;
    e->u.strided.length = 4096;
    __atomic_store_n(&p->h->sq_tail, tail + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->h->daemon_sleeping, __ATOMIC_SEQ_CST))
        eventfd_write(p->doorbell, 1);
}

/* Drains cq until the loop holds `want` submissions or tries * 10 ms pass. */
static void drain_for(mg_cq *cq, loop *l, int want, int tries)
{
    for (int i = 0; i < tries && l->n < want; i++) {
        struct pollfd pfd = {mg_cq_fd(cq), POLLIN, 0};
        poll(&pfd, 1, 10);
        mg_cq_drain(cq, 0);
    }
}

static void drain_until(mg_cq *cq, loop *l, int want)
{
    drain_for(cq, l, want, 500);
}

static void test_submissions_in_order_and_back_pressure(void)
{
    mg_cq *cq;
    mg_rings *rs;
    mg_ring *r;
    loop l = {.n = 0};
    proc p;
    char err[256];
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rings_new(&rs, cq, on_sub, &l), 0);
    CU_ASSERT_EQUAL(mg_ring_new(rs, 12, NULL, &r, err, sizeof(err)), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "a power of two"));
    CU_ASSERT_EQUAL_FATAL(mg_ring_new(rs, 8, &l, &r, err, sizeof(err)), 0);
    CU_ASSERT_PTR_EQUAL(mg_ring_front(r), &l);
    proc_map(r, &p);
    CU_ASSERT_EQUAL(p.h->magic, MG_RING_MAGIC);
    mg_ring_start(r);
    for (uint64_t ud = 1; ud <= 8; ud++) /* a full queue; none answered */
        post(&p, ud, (uint32_t)ud);
    for (int i = 0; i < 500 && !__atomic_load_n(&p.h->daemon_needs_room, __ATOMIC_SEQ_CST); i++)
        usleep(10000); /* it stops when the completion queue has no room */
    drain_until(cq, &l, 7);
    /* room for both answers of any submission: 7 taken of 8 unanswered places, then it waits */
    CU_ASSERT_EQUAL(l.n, 7);
    CU_ASSERT_EQUAL(__atomic_load_n(&p.h->sq_head, __ATOMIC_SEQ_CST), 7u);
    for (int i = 0; i < l.n; i++) {
        CU_ASSERT_EQUAL(l.got[i]->e.user_data, (uint64_t)i + 1);
        CU_ASSERT_EQUAL(l.got[i]->e.count, (uint32_t)i + 1);
        CU_ASSERT_EQUAL(l.got[i]->bad[0], '\0');
        CU_ASSERT_PTR_EQUAL(l.got[i]->ring, r);
    }
    CU_ASSERT_EQUAL(__atomic_load_n(&p.h->daemon_needs_room, __ATOMIC_SEQ_CST), 1u);
    for (int i = 0; i < l.n; i++) { /* the loop answers them all */
        mg_ring_cqe c = {.user_data = l.got[i]->e.user_data, .done = 1};
        mg_ring_complete(r, &c);
        mg_ring_sub_free(l.got[i]);
    }
    CU_ASSERT_EQUAL(p.h->cq_tail, 7u);
    for (uint32_t i = 0; i < 7; i++) {
        mg_ring_cqe *c = (mg_ring_cqe *)(p.mem + p.h->cq_off + i * MG_RING_CQE_SIZE);
        CU_ASSERT_EQUAL(c->user_data, (uint64_t)i + 1);
    }
    l.n = 0;
    /* the process reads them, and rings because the daemon waits for room */
    __atomic_store_n(&p.h->cq_head, 7u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p.h->daemon_needs_room, __ATOMIC_SEQ_CST))
        eventfd_write(p.doorbell, 1);
    drain_until(cq, &l, 1);
    CU_ASSERT_EQUAL_FATAL(l.n, 1);
    CU_ASSERT_EQUAL(l.got[0]->e.user_data, 8u);
    mg_ring_sub_free(l.got[0]);
    CU_ASSERT_EQUAL(mg_rings_taken(rs), 8u);
    CU_ASSERT_EQUAL(mg_rings_open(rs), 1u);
    munmap(p.mem, p.size);
    mg_ring_free(r);
    mg_rings_del(rs);
    mg_cq_drain(cq, 0);
    mg_cq_del(cq);
}

static void test_an_impossible_tail_breaks_only_that_ring(void)
{
    mg_cq *cq;
    mg_rings *rs;
    mg_ring *bad, *good;
    loop l = {.n = 0};
    proc pb, pg;
    char err[256];
    struct pollfd pfd;
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rings_new(&rs, cq, on_sub, &l), 0);
    CU_ASSERT_EQUAL_FATAL(mg_ring_new(rs, 8, NULL, &bad, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_ring_new(rs, 8, NULL, &good, err, sizeof(err)), 0);
    CU_ASSERT_NOT_EQUAL(mg_ring_id(bad), mg_ring_id(good));
    proc_map(bad, &pb);
    proc_map(good, &pg);
    mg_ring_start(bad);
    mg_ring_start(good);
    __atomic_store_n(&pb.h->sq_tail, 1000u, __ATOMIC_SEQ_CST); /* 1000 slots in a ring of 8 */
    eventfd_write(pb.doorbell, 1);
    pfd = (struct pollfd){pb.bell, POLLIN, 0};
    CU_ASSERT_EQUAL(poll(&pfd, 1, 5000), 1); /* told by the bell */
    CU_ASSERT_EQUAL(__atomic_load_n(&pb.h->broken, __ATOMIC_SEQ_CST), 3u);
    CU_ASSERT_PTR_NOT_NULL(strstr(pb.h->why, "sq_tail is 1000 slots past sq_head 0"));
    post(&pg, 42, 1); /* the other ring goes on */
    drain_until(cq, &l, 1);
    CU_ASSERT_EQUAL_FATAL(l.n, 1);
    CU_ASSERT_EQUAL(l.got[0]->e.user_data, 42u);
    mg_ring_sub_free(l.got[0]);
    /* a closed ring's submissions reach the loop no more */
    l.n = 0;
    mg_ring_close(good);
    post(&pg, 43, 1);
    drain_for(cq, &l, 1, 20); /* what would come, comes within 200 ms on an idle machine */
    CU_ASSERT_EQUAL(l.n, 0);
    munmap(pb.mem, pb.size);
    munmap(pg.mem, pg.size);
    mg_ring_free(bad);
    mg_ring_free(good);
    mg_rings_del(rs);
    mg_cq_drain(cq, 0);
    mg_cq_del(cq);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_submissions_in_order_and_back_pressure),
        MG_TEST(test_an_impossible_tail_breaks_only_that_ring),
    };
    return mg_test_run("ring", cases, sizeof(cases) / sizeof(cases[0]));
}
