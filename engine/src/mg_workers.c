/* mg_workers: see mg_workers.h. */
#include "mg_workers.h"

#include "mg_log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct mg_job {
    mg_work_fn work;
    mg_done_fn done;
    void *arg;
    mg_cq *cq;
    int result;
    struct mg_job *next;
};

struct mg_cq {
    pthread_mutex_t lock;
    mg_job *head, *tail;
    int efd;
    unsigned outstanding; /* jobs submitted for this queue whose done has not run (atomic) */
};

struct mg_workers {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    mg_job *head, *tail;
    unsigned queue_depth;
    unsigned in_flight; /* queued + running */
    int stopping;
    uint64_t submitted, rejected, completed;
    unsigned nthreads;
    pthread_t *threads;
};

int mg_cq_new(mg_cq **out)
{
    mg_cq *cq = calloc(1, sizeof(*cq));
    if (cq == NULL)
        return MG_ERR_NOMEM;
    cq->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (cq->efd < 0) {
        mg_error("cq_new", "eventfd errno=%d", errno);
        free(cq);
        return MG_ERR_SYSTEM;
    }
    pthread_mutex_init(&cq->lock, NULL);
    *out = cq;
    return 0;
}

void mg_cq_del(mg_cq *cq)
{
    if (cq == NULL)
        return;
    close(cq->efd);
    pthread_mutex_destroy(&cq->lock);
    free(cq);
}

int mg_cq_fd(const mg_cq *cq)
{
    return cq->efd;
}

static void cq_wake(mg_cq *cq)
{
    uint64_t one = 1;
    ssize_t w = write(cq->efd, &one, sizeof(one));
    (void)w; /* the counter cannot overflow: it is reset on every drain */
}

static void cq_push(mg_cq *cq, mg_job *job)
{
    int was_empty;
    job->next = NULL;
    pthread_mutex_lock(&cq->lock);
    was_empty = cq->head == NULL;
    if (cq->tail)
        cq->tail->next = job;
    else
        cq->head = job;
    cq->tail = job;
    pthread_mutex_unlock(&cq->lock);
    if (was_empty)
        cq_wake(cq);
}

int mg_cq_post(mg_cq *cq, mg_done_fn done, void *arg, int result)
{
    mg_job *job = calloc(1, sizeof(*job));
    if (job == NULL)
        return MG_ERR_NOMEM;
    job->done = done;
    job->arg = arg;
    job->cq = cq;
    job->result = result;
    __atomic_fetch_add(&cq->outstanding, 1, __ATOMIC_ACQ_REL);
    cq_push(cq, job);
    return 0;
}

unsigned mg_cq_drain(mg_cq *cq, unsigned max)
{
    uint64_t v;
    mg_job *list, *last = NULL;
    unsigned n = 0;
    ssize_t r = read(cq->efd, &v, sizeof(v));
    (void)r;

    pthread_mutex_lock(&cq->lock);
    list = cq->head;
    if (max == 0) {
        cq->head = cq->tail = NULL;
    } else {
        mg_job *j = list;
        unsigned k = 0;
        while (j && k < max) {
            last = j;
            j = j->next;
            k++;
        }
        if (last)
            last->next = NULL;
        cq->head = j;
        if (j == NULL)
            cq->tail = NULL;
    }
    int more = cq->head != NULL;
    pthread_mutex_unlock(&cq->lock);
    if (more)
        cq_wake(cq); /* come back for the rest after other events had their turn */

    while (list) {
        mg_job *j = list;
        list = j->next;
        j->done(j->arg, j->result);
        free(j);
        __atomic_fetch_sub(&cq->outstanding, 1, __ATOMIC_ACQ_REL);
        n++;
    }
    return n;
}

void mg_cq_settle(mg_cq *cq)
{
    for (;;) {
        struct pollfd pfd = {cq->efd, POLLIN, 0};
        mg_cq_drain(cq, 0);
        if (__atomic_load_n(&cq->outstanding, __ATOMIC_ACQUIRE) == 0)
            return;
        poll(&pfd, 1, 100);
    }
}

static __thread int on_worker;

int mg_engine_on_worker(void)
{
    return on_worker;
}

static void *worker_main(void *p)
{
    mg_workers *w = p;
    on_worker = 1;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        mg_job *job;
        while (w->head == NULL && !w->stopping)
            pthread_cond_wait(&w->cond, &w->lock);
        if (w->stopping)
            break;
        job = w->head;
        w->head = job->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&w->lock);

        job->result = job->work(job->arg);

        pthread_mutex_lock(&w->lock);
        w->in_flight--;
        w->completed++;
        pthread_mutex_unlock(&w->lock);
        cq_push(job->cq, job);
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

int mg_workers_new(mg_workers **out, unsigned workers, unsigned queue_depth)
{
    mg_workers *w;
    if (workers == 0 || workers > 256 || queue_depth == 0 || queue_depth > 1048576)
        return MG_ERR_INVALID;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return MG_ERR_NOMEM;
    w->threads = calloc(workers, sizeof(pthread_t));
    if (w->threads == NULL)
        goto fail_threads;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->queue_depth = queue_depth;
    for (; w->nthreads < workers; w->nthreads++) {
        int rc = pthread_create(&w->threads[w->nthreads], NULL, worker_main, w);
        if (rc != 0) {
            mg_error("workers_new", "pthread_create errno=%d started=%u", rc, w->nthreads);
            mg_workers_del(w);
            return MG_ERR_SYSTEM;
        }
    }
    *out = w;
    return 0;

fail_threads:
    free(w);
    return MG_ERR_NOMEM;
}

void mg_workers_del(mg_workers *w)
{
    mg_job *rest;
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->lock);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    for (unsigned i = 0; i < w->nthreads; i++)
        pthread_join(w->threads[i], NULL);
    /* Jobs never started still go back to their loops, cancelled. */
    rest = w->head;
    w->head = w->tail = NULL;
    while (rest) {
        mg_job *j = rest;
        rest = j->next;
        j->result = MG_ERR_CANCELLED;
        cq_push(j->cq, j);
    }
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w->threads);
    free(w);
}

int mg_workers_submit(mg_workers *w, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg)
{
    mg_job *job = malloc(sizeof(*job));
    if (job == NULL)
        return MG_ERR_NOMEM;
    job->work = work;
    job->done = done;
    job->arg = arg;
    job->cq = cq;
    job->result = 0;
    job->next = NULL;

    pthread_mutex_lock(&w->lock);
    if (w->stopping) {
        pthread_mutex_unlock(&w->lock);
        free(job);
        return MG_ERR_SHUTDOWN;
    }
    if (w->in_flight >= w->queue_depth) {
        w->rejected++;
        pthread_mutex_unlock(&w->lock);
        free(job);
        return MG_ERR_FULL;
    }
    w->in_flight++;
    w->submitted++;
    __atomic_fetch_add(&cq->outstanding, 1, __ATOMIC_ACQ_REL);
    if (w->tail)
        w->tail->next = job;
    else
        w->head = job;
    w->tail = job;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

void mg_workers_stats(mg_workers *w, mg_engine_stats *out)
{
    pthread_mutex_lock(&w->lock);
    out->workers = w->nthreads;
    out->queue_depth = w->queue_depth;
    out->in_flight = w->in_flight;
    out->submitted = w->submitted;
    out->rejected = w->rejected;
    out->completed = w->completed;
    pthread_mutex_unlock(&w->lock);
}
