/* Unit tests for the engine's worker pool and completion queues (the hand-off rule). */
#include "mg_test.h"
#include "moongate/engine.h"

#include <event2/event.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    sem_t go; /* posted by the loop while the job runs */
    atomic_int started;
    int result;
    pthread_t done_thread;
    int done_calls;
    int job_on_worker, done_on_worker; /* mg_engine_on_worker() in the job and in done */
} probe;

static pthread_t loop_thread;
static int loop_ticks;

static int wait_for_loop(void *arg)
{
    probe *p = arg;
    struct timespec ts;
    p->job_on_worker = mg_engine_on_worker();
    atomic_store(&p->started, 1);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    /* Only the loop can post this: if the loop were blocked, the job would time out. */
    return sem_timedwait(&p->go, &ts) == 0 ? 0 : MG_ERR_TIMEOUT;
}

static void record_done(void *arg, int result)
{
    probe *p = arg;
    p->result = result;
    p->done_thread = pthread_self();
    p->done_on_worker = mg_engine_on_worker();
    p->done_calls++;
}

typedef struct {
    struct event_base *base;
    mg_cq *cq;
    probe *probes;
    int n;
} loop_ctx;

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    loop_ctx *c = arg;
    int all_done = 1;
    loop_ticks++;
    for (int i = 0; i < c->n; i++) {
        if (atomic_load(&c->probes[i].started) == 1) {
            atomic_store(&c->probes[i].started, 2);
            sem_post(&c->probes[i].go);
        }
        all_done &= c->probes[i].done_calls == 1;
    }
    if (all_done)
        event_base_loopbreak(c->base);
}

static void cq_cb(evutil_socket_t fd, short what, void *arg)
{
    mg_cq_drain(arg, 0);
}

static void test_loop_runs_while_workers_are_busy(void)
{
    mg_engine_config cfg = {.workers = 2, .queue_depth = 8};
    mg_engine *e;
    mg_cq *cq;
    probe p[2];
    loop_ctx ctx;
    struct event_base *base = event_base_new();
    struct event *tick, *cqev;
    struct timeval tv = {0, 2000};

    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &cfg), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    CU_ASSERT_EQUAL(mg_engine_on_worker(), 0);
    memset(p, 0, sizeof(p));
    loop_thread = pthread_self();
    loop_ticks = 0;
    for (int i = 0; i < 2; i++) {
        sem_init(&p[i].go, 0, 0);
        p[i].result = 1;
        CU_ASSERT_EQUAL(mg_engine_submit(e, cq, wait_for_loop, record_done, &p[i]), 0);
    }
    ctx = (loop_ctx){base, cq, p, 2};
    tick = event_new(base, -1, EV_PERSIST, tick_cb, &ctx);
    cqev = event_new(base, mg_cq_fd(cq), EV_READ | EV_PERSIST, cq_cb, cq);
    event_add(tick, &tv);
    event_add(cqev, NULL);
    event_base_dispatch(base);

    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(p[i].result, 0); /* the loop released the job: it was not blocked */
        CU_ASSERT_EQUAL(p[i].done_calls, 1);
        CU_ASSERT_TRUE(pthread_equal(p[i].done_thread, loop_thread));
        CU_ASSERT_EQUAL(p[i].job_on_worker, 1);
        CU_ASSERT_EQUAL(p[i].done_on_worker, 0);
        sem_destroy(&p[i].go);
    }
    event_free(tick);
    event_free(cqev);
    event_base_free(base);
    mg_engine_del(e);
    mg_cq_del(cq);
}

static int block_on(void *arg)
{
    sem_t *s = arg;
    sem_wait(s);
    return 0;
}

static int count_done_result;
static int count_done_calls;

static void count_done(void *arg, int result)
{
    count_done_calls++;
    count_done_result = result;
}

static void test_queue_is_bounded(void)
{
    mg_engine_config cfg = {.workers = 1, .queue_depth = 2};
    mg_engine *e;
    mg_engine_stats st;
    mg_cq *cq;
    sem_t s;
    struct pollfd pfd;

    sem_init(&s, 0, 0);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &cfg), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    count_done_calls = 0;
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), 0);
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), 0);
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), MG_ERR_FULL);
    mg_engine_get_stats(e, &st);
    CU_ASSERT_EQUAL(st.in_flight, 2);
    CU_ASSERT_EQUAL(st.rejected, 1);
    CU_ASSERT_EQUAL(st.submitted, 2);
    sem_post(&s);
    sem_post(&s);
    pfd.fd = mg_cq_fd(cq);
    pfd.events = POLLIN;
    while (count_done_calls < 2) {
        CU_ASSERT_EQUAL_FATAL(poll(&pfd, 1, 10000), 1);
        mg_cq_drain(cq, 0);
    }
    mg_engine_get_stats(e, &st);
    CU_ASSERT_EQUAL(st.in_flight, 0);
    CU_ASSERT_EQUAL(st.completed, 2);
    /* Room again. */
    sem_post(&s);
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), 0);
    mg_engine_del(e);
    mg_cq_drain(cq, 0);
    CU_ASSERT_EQUAL(count_done_calls, 3);
    mg_cq_del(cq);
    sem_destroy(&s);
}

static void *del_thread(void *arg)
{
    mg_engine_del(arg);
    return NULL;
}

static void test_shutdown_cancels_queued_jobs(void)
{
    mg_engine_config cfg = {.workers = 1, .queue_depth = 8};
    mg_engine *e;
    mg_cq *cq;
    sem_t s;
    sem_init(&s, 0, 0);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &cfg), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    count_done_calls = 0;
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), 0);
    while (1) { /* wait until the worker holds the first job */
        mg_engine_stats st;
        mg_engine_get_stats(e, &st);
        usleep(1000);
        if (st.in_flight == 1)
            break;
    }
    CU_ASSERT_EQUAL(mg_engine_submit(e, cq, block_on, count_done, &s), 0);
    {
        /* Stop first, then release the running job: the queued one must never start. */
        pthread_t t;
        pthread_create(&t, NULL, del_thread, e);
        usleep(100000);
        sem_post(&s);
        pthread_join(t, NULL);
    }
    /* Both come back: the run one with 0, the queued one cancelled. */
    CU_ASSERT_EQUAL(mg_cq_drain(cq, 0), 2);
    CU_ASSERT_EQUAL(count_done_calls, 2);
    CU_ASSERT_EQUAL(count_done_result, MG_ERR_CANCELLED);
    mg_cq_del(cq);
    sem_destroy(&s);
}

static int nothing(void *arg)
{
    return 0;
}

static void test_partial_drain_rearms_the_wakeup(void)
{
    mg_engine_config cfg = {.workers = 2, .queue_depth = 64};
    mg_engine *e;
    mg_cq *cq;
    struct pollfd pfd;
    mg_engine_stats st;
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &cfg), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    count_done_calls = 0;
    for (int i = 0; i < 50; i++)
        CU_ASSERT_EQUAL(mg_engine_submit(e, cq, nothing, count_done, NULL), 0);
    do {
        usleep(1000);
        mg_engine_get_stats(e, &st);
    } while (st.completed < 50);
    pfd.fd = mg_cq_fd(cq);
    pfd.events = POLLIN;
    CU_ASSERT_EQUAL(poll(&pfd, 1, 1000), 1);
    CU_ASSERT_EQUAL(mg_cq_drain(cq, 10), 10);
    /* 40 remain: the queue's descriptor must still wake the loop. */
    CU_ASSERT_EQUAL(poll(&pfd, 1, 1000), 1);
    CU_ASSERT_EQUAL(mg_cq_drain(cq, 0), 40);
    CU_ASSERT_EQUAL(poll(&pfd, 1, 0), 0);
    CU_ASSERT_EQUAL(count_done_calls, 50);
    mg_engine_del(e);
    mg_cq_del(cq);
}

static void test_bad_config_and_arguments(void)
{
    mg_engine *e = NULL;
    mg_engine_config zero = {.workers = 0, .queue_depth = 8},
                     deep = {.workers = 1, .queue_depth = 0};
    mg_engine_config ok = {.workers = 1, .queue_depth = 1};
    CU_ASSERT_EQUAL(mg_engine_new(&e, &zero), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_engine_new(&e, &deep), MG_ERR_INVALID);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &ok), 0);
    CU_ASSERT_EQUAL(mg_engine_submit(e, NULL, nothing, count_done, NULL), MG_ERR_INVALID);
    mg_engine_del(e);
    mg_engine_del(NULL);
    CU_ASSERT_STRING_EQUAL(mg_strerror(MG_ERR_NOT_FOUND), "not found");
    CU_ASSERT_STRING_EQUAL(mg_strerror(-99), "unknown error");
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_loop_runs_while_workers_are_busy),
        MG_TEST(test_queue_is_bounded),
        MG_TEST(test_shutdown_cancels_queued_jobs),
        MG_TEST(test_partial_drain_rearms_the_wakeup),
        MG_TEST(test_bad_config_and_arguments),
    };
    return mg_test_run("engine workers", cases, sizeof(cases) / sizeof(cases[0]));
}
