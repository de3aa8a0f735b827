/*
 * mg_engine: the engine object. It owns the worker pool and the segment registry; the pool and
 * leases, and the transports hang off it as they arrive.
 */
#include "moongate/engine.h"

#include "mg_workers.h"

#include <stdlib.h>
#include <string.h>

struct mg_engine {
    mg_workers *workers;
    mg_registry *registry;
};

int mg_engine_new(mg_engine **out, const mg_engine_config *cfg)
{
    mg_engine *e = calloc(1, sizeof(*e));
    int rc;
    if (e == NULL)
        return MG_ERR_NOMEM;
    if (cfg->registry.shm_dir && (rc = mg_registry_new(&e->registry, &cfg->registry)) != 0) {
        free(e);
        return rc;
    }
    rc = mg_workers_new(&e->workers, cfg->workers, cfg->queue_depth);
    if (rc != 0) {
        mg_registry_del(e->registry);
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void mg_engine_stop(mg_engine *e)
{
    if (e == NULL || e->workers == NULL)
        return;
    mg_workers_del(e->workers);
    e->workers = NULL;
}

void mg_engine_del(mg_engine *e)
{
    if (e == NULL)
        return;
    mg_engine_stop(e);
    mg_registry_del(e->registry); /* after the workers: no registration runs any more */
    free(e);
}

int mg_engine_submit(mg_engine *e, mg_cq *cq, mg_work_fn work, mg_done_fn done, void *arg)
{
    if (e == NULL || cq == NULL || work == NULL || done == NULL)
        return MG_ERR_INVALID;
    if (e->workers == NULL)
        return MG_ERR_SHUTDOWN;
    return mg_workers_submit(e->workers, cq, work, done, arg);
}

mg_registry *mg_engine_registry(mg_engine *e)
{
    return e->registry;
}

void mg_engine_get_stats(mg_engine *e, mg_engine_stats *out)
{
    if (e->workers == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    mg_workers_stats(e->workers, out);
}
