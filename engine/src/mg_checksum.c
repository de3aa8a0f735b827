/*
 * mg_checksum: the CRC32C of a range of registered memory on a worker (moongate/checksum.h).
 * The job owns the caller's hold on the range from the call on and lets it go on the loop.
 */
#include "moongate/checksum.h"

#include <stdlib.h>

typedef struct sum_job {
    mg_registry *reg;
    mg_pools *pools;
    mg_segment *seg;
    void *lease;
    const uint8_t *p;
    uint64_t length;
    uint32_t crc;
    mg_checksum_done_fn done;
    void *arg;
    char why[160];
} sum_job;

static void let_go(sum_job *j)
{
    mg_registry_put(j->reg, j->seg);
    mg_pools_unuse(j->pools, j->lease);
}

static int sum_work(void *arg)
{
    sum_job *j = arg;
    return mg_segment_crc32c(j->seg, j->p, j->length, &j->crc, j->why, sizeof(j->why));
}

static void sum_done(void *arg, int result)
{
    sum_job *j = arg;
    let_go(j);
    j->done(j->arg, result, result == 0 ? j->crc : 0, j->why);
    free(j);
}

int mg_checksum_async(mg_engine *engine, mg_cq *cq, mg_pools *pools, mg_segment *seg, void *lease,
                      const uint8_t *p, uint64_t length, mg_checksum_done_fn done, void *arg)
{
    sum_job *j = calloc(1, sizeof(*j));
    int rc;
    if (j == NULL) {
        mg_registry_put(mg_engine_registry(engine), seg);
        mg_pools_unuse(pools, lease);
        return MG_ERR_NOMEM;
    }
    *j = (sum_job){.reg = mg_engine_registry(engine),
                   .pools = pools,
                   .seg = seg,
                   .lease = lease,
                   .p = p,
                   .length = length,
                   .done = done,
                   .arg = arg};
    if ((rc = mg_engine_submit(engine, cq, sum_work, sum_done, j)) != 0) {
        let_go(j);
        free(j);
    }
    return rc;
}
