/*
 * mg_engine: the engine object. Today it owns the worker pool; the segment registry, the pool
 * and leases, and the transports hang off it as they arrive.
 */
#include "moongate/engine.h"

#include "mg_workers.h"

#include <stdlib.h>

struct mg_engine {
    mg_workers *workers;
};

int mg_engine_new(mg_engine **out, const mg_engine_config *cfg)
{
    mg_engine *e = calloc(1, sizeof(*e));
    int rc;
    if (e == NULL)
        return MG_ERR_NOMEM;
    rc = mg_workers_new(&e->workers, cfg->workers, cfg->queue_depth);
    if (rc != 0) {
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void mg_engine_del(mg_engine *e)
{
    if (e == NULL)
        return;
    mg_workers_del(e->workers);
    free(e);
}

int mg_engine_submit(mg_engine *e, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg)
{
    if (e == NULL || cq == NULL || work == NULL || done == NULL)
        return MG_ERR_INVALID;
    return mg_workers_submit(e->workers, cq, work, done, arg);
}

void mg_engine_get_stats(mg_engine *e, mg_engine_stats *out)
{
    mg_workers_stats(e->workers, out);
}
