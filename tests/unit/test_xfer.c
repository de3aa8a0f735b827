/*
 * Unit tests for the transfer jobs' movers and part planning (moongate/xfer.h), in one process:
 * copies between two ranges, and TCP jobs to a real data-plane server on loopback — a group of
 * parts as one stream where a refused part fails alone, a broken idle connection replaced once
 * by a fresh one, and a stop word seen before anything moves.
 */
#include "mg_test.h"
#include "moongate/xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024u * 1024u)

static char dir[64];
static mg_registry *reg;
static mg_dp_server *srv;
static uint64_t seg_id;
static uint8_t *seg_mem;
static const uint8_t token[MG_DF_TOKEN_BYTES] = "token-of-tenant-t..............";

static int auth(void *arg, const uint8_t tok[MG_DF_TOKEN_BYTES], char *tenant)
{
    (void)arg;
    if (memcmp(tok, token, MG_DF_TOKEN_BYTES) != 0)
        return MG_ERR_AUTH;
    snprintf(tenant, MG_SEG_NAME_MAX + 1, "t");
    return 0;
}

/* A data-plane server on a registry with one remote-accessible 4 MiB segment. */
static mg_dp_server *serve(void)
{
    mg_registry_config rc = {.shm_dir = dir, .file_mode = 0600, .max_segments = 4};
    mg_segment_spec spec = {.tenant = "t",
                            .name = "target",
                            .source = MG_SEG_ANON,
                            .size = 4 * MiB,
                            .remote_accessible = 1};
    mg_dp_server_config sc = {.host = "127.0.0.1",
                              .max_slice = 1 * MiB,
                              .max_conns = 8,
                              .io_timeout_ms = 5000,
                              .auth = auth};
    mg_dp_server *s = NULL;
    mg_segment *seg;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    if (reg == NULL) {
        snprintf(dir, sizeof(dir), "/tmp/mgxfer-XXXXXX");
        CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
        CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &rc), 0);
        CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
        mg_registry_commit(reg, seg, mg_segment_map(seg));
        mg_segment_get_info(reg, seg, &info);
        seg_id = info.id;
        seg_mem = mg_segment_addr(seg);
    }
    sc.registry = reg;
    CU_ASSERT_EQUAL_FATAL(mg_dp_server_start(&s, &sc, err, sizeof(err)), 0);
    return s;
}

static void unserve_all(void)
{
    mg_dp_server_stop(srv);
    srv = NULL;
    mg_registry_del(reg);
    reg = NULL;
    rmdir(dir);
}

static mg_xfer_link tcp_link(const int *stop, mg_dp_pool *idle)
{
    mg_xfer_link l = {.stop = stop,
                      .slice_bytes = 256 * 1024,
                      .io_timeout_ms = 5000,
                      .crc = 1,
                      .peer = "test",
                      .idle = idle,
                      .token = token,
                      .host = "127.0.0.1",
                      .port = mg_dp_server_port(srv)};
    return l;
}

static void test_plan(void)
{
    uint64_t each;
    const uint64_t slice = 1 * MiB, min = 16 * MiB;
    CU_ASSERT_EQUAL(mg_xfer_plan(15 * MiB, slice, 8, min, 0, &each), 1u);
    CU_ASSERT_EQUAL(each, 15 * MiB);
    CU_ASSERT_EQUAL(mg_xfer_plan(64 * MiB, slice, 8, min, 0, &each), 4u);
    CU_ASSERT_EQUAL(each, 16 * MiB);
    CU_ASSERT_EQUAL(mg_xfer_plan(64 * MiB, slice, 2, min, 0, &each), 2u); /* at most max */
    CU_ASSERT_EQUAL(each, 32 * MiB);
    CU_ASSERT_EQUAL(mg_xfer_plan(64 * MiB, slice, 8, min, 1, &each), 1u); /* RDMA: one job */
    CU_ASSERT_EQUAL(mg_xfer_plan(33 * MiB + 1, slice, 8, min, 0, &each), 2u);
    CU_ASSERT_EQUAL(each, 17 * MiB); /* on slice boundaries */
    CU_ASSERT_EQUAL(each % slice, 0u);
    CU_ASSERT_EQUAL(mg_xfer_plan(100, slice, 8, min, 0, &each), 1u);
    CU_ASSERT(each >= 100);
}

/* Copies both ways, counted in progress; a stop word ends a copy before it moves a byte. */
static void test_copy(void)
{
    uint64_t len = 20 * MiB + 7; /* more than one step */
    uint8_t *a = malloc(len), *b = calloc(1, len);
    int stop = 0;
    mg_xfer_link link = {.stop = &stop};
    mg_xfer_part pt = {.write = 1, .local = a, .length = len, .other = b};
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    for (uint64_t i = 0; i < len; i++)
        a[i] = (uint8_t)(i * 7);
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_COPY, &pt, &link), 0);
    CU_ASSERT_EQUAL(memcmp(a, b, len), 0);
    CU_ASSERT_EQUAL(pt.progress, len);
    memset(a, 0, len);
    pt = (mg_xfer_part){.write = 0, .local = a + 1, .length = 10, .other = b + 1};
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_COPY, &pt, &link), 0); /* READ: other -> local */
    CU_ASSERT_EQUAL(memcmp(a + 1, b + 1, 10), 0);
    CU_ASSERT_EQUAL(a[0], 0);
    stop = MG_ERR_CANCELLED;
    pt = (mg_xfer_part){.write = 1, .local = a, .length = len, .other = b};
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_COPY, &pt, &link), MG_ERR_CANCELLED);
    CU_ASSERT_EQUAL(pt.rc, MG_ERR_CANCELLED);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pt.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(pt.msg, "stopped"));
    CU_ASSERT_EQUAL(pt.progress, 0u);
    free(pt.msg);
    free(a);
    free(b);
}

/* Three parts as one stream: the two in range land, the one past the segment's end fails
 * alone with the peer's reason, and the connection goes back to the peer's idle pool. */
static void test_tcp_group(void)
{
    uint8_t src[3][4096];
    int stop = 0;
    mg_dp_pool idle;
    mg_xfer_link link;
    mg_xfer_part pt[3];
    srv = serve();
    mg_dp_pool_init(&idle, 2);
    link = tcp_link(&stop, &idle);
    for (int i = 0; i < 3; i++) {
        memset(src[i], 'a' + i, sizeof(src[i]));
        pt[i] = (mg_xfer_part){.write = 1,
                               .local = src[i],
                               .length = sizeof(src[i]),
                               .target = seg_id,
                               .remote = (uint64_t)i * 8192,
                               .next = i < 2 ? &pt[i + 1] : NULL};
    }
    pt[1].remote = 4 * MiB - 100; /* runs past the end */
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_TCP, &pt[0], &link), 0);
    CU_ASSERT_EQUAL(pt[0].rc, 0);
    CU_ASSERT_EQUAL(pt[1].rc, MG_ERR_RANGE);
    CU_ASSERT(pt[1].msg && strlen(pt[1].msg) > 0);
    CU_ASSERT_EQUAL(pt[2].rc, 0);
    CU_ASSERT_EQUAL(pt[0].progress, 4096u);
    CU_ASSERT_EQUAL(memcmp(seg_mem, src[0], 4096), 0);
    CU_ASSERT_EQUAL(memcmp(seg_mem + 2 * 8192, src[2], 4096), 0);
    CU_ASSERT_EQUAL(mg_dp_pool_idle(&idle), 1u);
    /* And back: a READ into fresh memory on the pooled connection. */
    memset(src[0], 0, sizeof(src[0]));
    free(pt[1].msg); /* the only one that failed */
    CU_ASSERT_PTR_NULL(pt[0].msg);
    CU_ASSERT_PTR_NULL(pt[2].msg);
    pt[0] = (mg_xfer_part){.write = 0, .local = src[0], .length = 4096, .target = seg_id};
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_TCP, &pt[0], &link), 0);
    CU_ASSERT_EQUAL(src[0][0], 'a');
    CU_ASSERT_EQUAL(mg_dp_pool_idle(&idle), 1u);
    mg_dp_pool_free(&idle);
    unserve_all();
}

/* An idle connection whose server went away is replaced once by a fresh one; a stop word set
 * before the job starts fails every part without moving a byte. */
static void test_tcp_broken_idle_and_stop(void)
{
    uint8_t buf[4096];
    int stop = 0;
    mg_dp_pool idle;
    mg_xfer_link link;
    mg_xfer_part pt = {.write = 1, .local = buf, .length = sizeof(buf), .target = seg_id};
    mg_dp_server *gone;
    mg_dp_conn *c = NULL;
    char err[256];
    memset(buf, 'z', sizeof(buf));
    srv = serve();
    gone = serve();
    pt.target = seg_id;
    CU_ASSERT_EQUAL_FATAL(mg_dp_connect(&c, "127.0.0.1", mg_dp_server_port(gone), token, 5000, NULL,
                                        NULL, err, sizeof(err)),
                          0);
    mg_dp_server_stop(gone); /* the pooled connection now leads nowhere */
    mg_dp_pool_init(&idle, 2);
    mg_dp_pool_give(&idle, c);
    link = tcp_link(&stop, &idle);
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_TCP, &pt, &link), 0);
    CU_ASSERT_EQUAL(memcmp(seg_mem, buf, sizeof(buf)), 0);
    stop = MG_ERR_TIMEOUT;
    pt = (mg_xfer_part){.write = 1, .local = buf, .length = sizeof(buf), .target = seg_id};
    CU_ASSERT_EQUAL(mg_xfer_run(MG_XFER_TCP, &pt, &link), MG_ERR_TIMEOUT);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pt.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(pt.msg, "before it started"));
    CU_ASSERT_EQUAL(pt.progress, 0u);
    free(pt.msg);
    mg_dp_pool_free(&idle);
    unserve_all();
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_plan),
        MG_TEST(test_copy),
        MG_TEST(test_tcp_group),
        MG_TEST(test_tcp_broken_idle_and_stop),
    };
    return mg_test_run("xfer", cases, sizeof(cases) / sizeof(cases[0]));
}
