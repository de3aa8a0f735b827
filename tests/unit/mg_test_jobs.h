/*
 * An inline worker for the transfer scheduler's unit tests (moongate/xfer.h): the jobs the
 * scheduler submits wait here, unrun, until the test brings them back with the result their
 * mover would have had. Set the scheduler's config `.submit = mg_test_submit`.
 */
#ifndef MG_TEST_JOBS_H
#define MG_TEST_JOBS_H

#include "mg_test.h"
#include "moongate/xfer.h"

#include <stdio.h>
#include <string.h>

typedef struct mg_test_job {
    mg_work_fn work;
    mg_done_fn done;
    void *arg; /* the job's head part (mg_xfer_job_part) */
} mg_test_job;

static mg_test_job mg_test_jobs[16];
static int mg_test_njobs; /* jobs out */

static inline int mg_test_submit(mg_engine *pool, mg_cq *cq, mg_work_fn work, mg_done_fn done,
                                 void *arg)
{
    (void)pool;
    (void)cq;
    if (mg_test_njobs == (int)(sizeof(mg_test_jobs) / sizeof(mg_test_jobs[0])))
        return MG_ERR_FULL;
    mg_test_jobs[mg_test_njobs++] = (mg_test_job){work, done, arg};
    return 0;
}

/* The oldest job comes back with rc; a failure says why as a mover would (the part's msg). */
static inline void mg_test_job_back(int rc)
{
    mg_test_job j = mg_test_jobs[0];
    CU_ASSERT_FATAL(mg_test_njobs > 0);
    if (rc)
        mg_xfer_part_say(&((mg_xfer_job_part *)j.arg)->m, "%s", mg_strerror(rc));
    memmove(&mg_test_jobs[0], &mg_test_jobs[1],
            (size_t)(mg_test_njobs - 1) * sizeof(mg_test_jobs[0]));
    mg_test_njobs--;
    j.done(j.arg, rc);
}

#endif
