/*
 * mg_workers: the engine's fixed worker pool and the per-loop completion queues.
 *
 * Threads: `workers` pthreads take jobs from one bounded FIFO (mutex + condition variable; the
 * lock is held only to link or unlink a job). A finished job is appended to its completion queue
 * under that queue's own mutex; the queue's eventfd is written only on the empty -> non-empty
 * transition, so a burst of completions costs the loop one wake-up.
 */
#ifndef MG_WORKERS_H
#define MG_WORKERS_H

#include "moongate/engine.h"

typedef struct mg_workers mg_workers;

int mg_workers_new(mg_workers **out, unsigned workers, unsigned queue_depth);
void mg_workers_del(mg_workers *w);
int mg_workers_submit(mg_workers *w, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg);
void mg_workers_stats(mg_workers *w, mg_engine_stats *out);

#endif
