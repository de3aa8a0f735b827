/*
 * Unit tests for the checksum call (moongate/checksum.h): the CRC32C of a range taken on a
 * worker and answered on the loop, the caller's hold on the segment let go whatever happens.
 */
#include "mg_test.h"
#include "moongate/checksum.h"
#include "moongate/dataframe.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

typedef struct {
    int calls, result;
    uint32_t crc;
    char why[160];
} sum_rec;

static void rec_summed(void *arg, int result, uint32_t crc, const char *why)
{
    sum_rec *r = arg;
    r->calls++;
    r->result = result;
    r->crc = crc;
    snprintf(r->why, sizeof(r->why), "%s", why);
}

/* The references on seg besides the registry's. */
static uint32_t refs(mg_registry *reg, mg_segment *seg)
{
    mg_segment_info info;
    mg_segment_get_info(reg, seg, &info);
    return info.refs;
}

static void test_sum_on_a_worker_and_the_hold_let_go(void)
{
    mg_engine_config ec = {
        .workers = 1,
        .queue_depth = 4,
        .registry = {
            .shm_dir = dir, .file_mode = 0600, .max_segments = 4, .max_registered_bytes = 1 << 20}};
    mg_segment_spec s = {.tenant = "t",
                         .name = "a",
                         .source = MG_SEG_ANON,
                         .size = 65536,
                         .location = "cpu:0",
                         .memlock = MG_MEMLOCK_OFF,
                         .caller_uid_known = 1,
                         .caller_uid = (uint32_t)getuid()};
    struct pollfd pfd;
    mg_segment *seg = NULL, *held = NULL;
    mg_registry *reg;
    mg_segment_info info;
    mg_engine *e;
    mg_cq *cq;
    sum_rec r = {0};
    uint8_t *p;
    char err[MG_SEG_ERROR_MAX];

    snprintf(dir, sizeof(dir), "/tmp/mgsum-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &ec), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    reg = mg_engine_registry(e);
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &s, &seg, err), 0);
    CU_ASSERT_EQUAL_FATAL(mg_segment_map(seg), 0);
    mg_registry_commit(reg, seg, 0);
    mg_segment_get_info(reg, seg, &info);
    p = mg_segment_addr(seg);
    for (size_t i = 0; i < 65536; i++)
        p[i] = (uint8_t)(i * 7 + 3);

    /* the sum of bytes [100, 40100) on the worker; the reference goes before done runs */
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire(reg, "t", info.id, "a test", &held), 0);
    CU_ASSERT_EQUAL(refs(reg, seg), 1);
    CU_ASSERT_EQUAL_FATAL(
        mg_checksum_async(e, cq, NULL, held, NULL, p + 100, 40000, rec_summed, &r), 0);
    pfd = (struct pollfd){.fd = mg_cq_fd(cq), .events = POLLIN};
    while (r.calls == 0) {
        CU_ASSERT_EQUAL_FATAL(poll(&pfd, 1, 30000), 1);
        mg_cq_drain(cq, 0);
    }
    CU_ASSERT(r.calls == 1 && r.result == 0);
    CU_ASSERT_EQUAL(r.crc, mg_crc32c(0, p + 100, 40000));
    CU_ASSERT_EQUAL(refs(reg, seg), 0);

    /* a call that cannot be queued lets the hold go too, and never calls done */
    memset(&r, 0, sizeof(r));
    mg_engine_stop(e);
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire(reg, "t", info.id, "a test", &held), 0);
    CU_ASSERT_EQUAL(mg_checksum_async(e, cq, NULL, held, NULL, p, 8, rec_summed, &r),
                    MG_ERR_SHUTDOWN);
    CU_ASSERT_EQUAL(refs(reg, seg), 0);
    mg_cq_drain(cq, 0);
    CU_ASSERT_EQUAL(r.calls, 0);

    mg_engine_del(e);
    mg_cq_del(cq);
    {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        CU_ASSERT_EQUAL(system(cmd), 0);
    }
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_sum_on_a_worker_and_the_hold_let_go),
    };
    return mg_test_run("checksum", cases, sizeof(cases) / sizeof(cases[0]));
}
