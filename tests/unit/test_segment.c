/*
 * Unit tests for the segment registry (moongate/segment.h): spec checks, limits, ids and names,
 * anon files and their mapping, shm file checks (symlinks, non-regular, hard links, short files,
 * reserved names), references and unregistration, listing, restart clean-up, bounds arithmetic.
 * Each test works in its own temporary shm directory.
 */
#include "mg_idmap.h"
#include "mg_test.h"
#include "moongate/engine.h"
#include "moongate/segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/mgseg-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

/* Files in the test's shm directory. */
static int count_files(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static mg_registry *open_reg(uint64_t max_segments, uint64_t max_bytes, uint64_t max_seg)
{
    mg_registry_config cfg = {.shm_dir = dir,
                              .file_mode = 0600,
                              .max_segments = max_segments,
                              .max_registered_bytes = max_bytes,
                              .max_segment_bytes = max_seg};
    mg_registry *reg = NULL;
    CU_ASSERT_EQUAL(mg_registry_new(&reg, &cfg), 0);
    return reg;
}

/* reserve + map + commit, as the gateway does with a worker in between. */
static int reg_segment(mg_registry *reg, const mg_segment_spec *spec, mg_segment **out, char *err)
{
    mg_segment *seg = NULL;
    int rc = mg_registry_reserve(reg, spec, &seg, err);
    if (rc != 0)
        return rc;
    rc = mg_segment_map(seg);
    if (rc != 0)
        snprintf(err, MG_SEG_ERROR_MAX, "%s", mg_segment_error(seg));
    mg_registry_commit(reg, seg, rc);
    if (rc == 0 && out)
        *out = seg;
    return rc;
}

static void unreg(mg_registry *reg, const char *tenant, uint64_t id)
{
    mg_segment *seg = NULL;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister(reg, tenant, id, &seg, err), 0);
    mg_segment_unmap(seg);
    mg_registry_release(reg, seg);
}

static mg_segment_spec anon(const char *tenant, const char *name, uint64_t size)
{
    mg_segment_spec s = {.tenant = tenant,
                         .name = name,
                         .source = MG_SEG_ANON,
                         .size = size,
                         .location = "cpu:0",
                         .memlock = MG_MEMLOCK_OFF,
                         .caller_uid_known = 1, /* for shm: this process owns the files */
                         .caller_uid = (uint32_t)getuid()};
    return s;
}

static void test_bounds(void)
{
    CU_ASSERT_EQUAL(mg_bounds_check(100, 0, 100), 0);
    CU_ASSERT_EQUAL(mg_bounds_check(100, 100, 0), 0);
    CU_ASSERT_EQUAL(mg_bounds_check(100, 99, 2), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_bounds_check(100, 101, 0), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_bounds_check(100, 1, UINT64_MAX), MG_ERR_RANGE); /* would wrap */
    CU_ASSERT_EQUAL(mg_bounds_check(UINT64_MAX, UINT64_MAX, 0), 0);
    CU_ASSERT_EQUAL(mg_bounds_check(UINT64_MAX, 2, UINT64_MAX - 1), MG_ERR_RANGE);
}

static void expect_reserve(mg_registry *reg, const mg_segment_spec *spec, int code,
                           const char *needle)
{
    mg_segment *seg = NULL;
    char err[MG_SEG_ERROR_MAX];
    int rc = mg_registry_reserve(reg, spec, &seg, err);
    CU_ASSERT_EQUAL(rc, code);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    if (rc == 0)
        mg_registry_commit(reg, seg, MG_ERR_CANCELLED);
}

static void test_spec_checks(void)
{
    mg_registry *reg;
    mg_segment_spec s;
    char long_name[200];
    make_dir();
    reg = open_reg(16, 0, 0);
    memset(long_name, 'a', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';

    s = anon("t", "ok", 0);
    expect_reserve(reg, &s, MG_ERR_INVALID, "size must be greater than 0");
    s = anon("t", "bad/name", 4096);
    expect_reserve(reg, &s, MG_ERR_INVALID, "name must be");
    s = anon("t", long_name, 4096);
    expect_reserve(reg, &s, MG_ERR_INVALID, "name must be");
    s = anon("", "x", 4096);
    expect_reserve(reg, &s, MG_ERR_INVALID, "tenant");
    s = anon("t", "x", 4096);
    s.location = "gpu:0";
    expect_reserve(reg, &s, MG_ERR_INVALID, "cpu:N");
    s.location = "cpu:99999";
    expect_reserve(reg, &s, MG_ERR_INVALID, "cpu:N");
    s = anon("t", "x", 4096);
    s.source = MG_SEG_SHM;
    s.shm_file = "../etc/passwd";
    expect_reserve(reg, &s, MG_ERR_INVALID, "shm file");
    s.shm_file = "..";
    expect_reserve(reg, &s, MG_ERR_INVALID, "shm file");
    s.shm_file = "moongate-seg-0000000000000001";
    expect_reserve(reg, &s, MG_ERR_INVALID, "not starting with moongate-seg-");
    s = anon("t", "x", 4096);
    s.memlock = (mg_memlock)7;
    expect_reserve(reg, &s, MG_ERR_INVALID, "memlock");
    {
        mg_registry_stats st;
        mg_registry_get_stats(reg, &st);
        CU_ASSERT_EQUAL(st.segments + st.registering + st.bytes, 0); /* nothing left behind */
    }
    mg_registry_del(reg);
    remove_dir();
}

static void test_limits_names_and_ids(void)
{
    mg_registry *reg;
    mg_segment_spec s;
    mg_segment *a = NULL, *b = NULL, *c = NULL;
    char err[MG_SEG_ERROR_MAX];
    mg_segment_info ia, ib;
    make_dir();
    reg = open_reg(3, 3 * 4096, 2 * 4096);

    s = anon("t1", "a", 4096);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &a, err), 0);
    s = anon("t1", "a", 4096);
    expect_reserve(reg, &s, MG_ERR_EXISTS, "\"a\" exists");
    s = anon("t2", "a", 4096); /* names are per tenant */
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &b, err), 0);
    s = anon("t1", "big", 3 * 4096);
    expect_reserve(reg, &s, MG_ERR_FULL, "largest segment allowed, 8192");
    s = anon("t1", "b", 2 * 4096);
    expect_reserve(reg, &s, MG_ERR_FULL, "registered-bytes limit of 12288");
    s = anon("t1", "b", 4096);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &c, err), 0);
    s = anon("t1", "d", 1);
    expect_reserve(reg, &s, MG_ERR_FULL, "3 segments are registered");

    mg_segment_get_info(reg, a, &ia);
    mg_segment_get_info(reg, b, &ib);
    CU_ASSERT(ia.id != 0 && ib.id != 0 && ia.id != ib.id);
    CU_ASSERT(ia.id != ib.id + 1 && ib.id != ia.id + 1); /* not sequential */
    CU_ASSERT_STRING_EQUAL(ia.tenant, "t1");
    CU_ASSERT_EQUAL(ia.state, MG_SEG_READY);

    unreg(reg, "t1", ia.id);
    s = anon("t1", "a", 4096); /* the name and the bytes are free again */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_registry_del(reg);
    remove_dir();
}

static void test_tenant_limit(void)
{
    mg_registry *reg;
    mg_registry_config cfg = {
        .shm_dir = dir, .file_mode = 0600, .max_segments = 8, .max_tenant_segments = 2};
    mg_segment_spec s;
    mg_segment *a = NULL;
    mg_segment_info ia;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    s = anon("t1", "a", 4096);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &a, err), 0);
    s = anon("t1", "b", 4096);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, NULL, err), 0);
    s = anon("t1", "c", 4096);
    expect_reserve(reg, &s, MG_ERR_QUOTA, "tenant \"t1\" has 2 segments, the limit per tenant");
    s = anon("t2", "c", 4096); /* another tenant has its own count */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_segment_get_info(reg, a, &ia);
    unreg(reg, "t1", ia.id);
    s = anon("t1", "c", 4096); /* room again */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    /* A failed registration does not count. */
    s = anon("t3", "x", 4096);
    s.source = MG_SEG_SHM;
    s.shm_file = "missing";
    s.size = 0;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_INVALID);
    s = anon("t3", "x", 4096);
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    s = anon("t3", "y", 4096);
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    {
        /* This test maps on its own thread, not a worker: the registry sees it. */
        mg_registry_stats st;
        mg_registry_get_stats(reg, &st);
        CU_ASSERT(st.jobs >= 6);
        CU_ASSERT_EQUAL(st.jobs_off_worker, st.jobs);
    }
    mg_registry_del(reg);
    remove_dir();
}

static void test_tenant_bytes_quota(void)
{
    mg_registry *reg;
    mg_registry_config cfg = {.shm_dir = dir,
                              .file_mode = 0600,
                              .max_segments = 8,
                              .max_tenant_segments = 8,
                              .max_tenant_bytes = 3 * 4096};
    mg_segment_spec s;
    mg_segment *a = NULL;
    mg_segment_info ia;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    s = anon("t1", "a", 2 * 4096);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &a, err), 0);
    s = anon("t1", "b", 2 * 4096);
    expect_reserve(reg, &s, MG_ERR_QUOTA, "8192 more bytes would exceed tenant \"t1\"'s");
    s = anon("t1", "b", 4096); /* what is left fits */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    s = anon("t2", "big", 4 * 4096); /* larger than the quota on its own */
    expect_reserve(reg, &s, MG_ERR_QUOTA, "16384 bytes exceed tenant \"t2\"'s");
    s = anon("t2", "big", 4 * 4096);
    s.provisioned = 1; /* the operator's memory (a pool) is outside the quota */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    s = anon("t2", "c", 3 * 4096); /* and does not use it up */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_segment_get_info(reg, a, &ia);
    unreg(reg, "t1", ia.id);
    s = anon("t1", "c", 2 * 4096); /* room again */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_registry_del(reg);
    remove_dir();
}

static void test_sharing(void)
{
    mg_registry *reg;
    mg_registry_config cfg = {
        .shm_dir = dir, .file_mode = 0600, .max_segments = 8, .max_tenant_segments = 8};
    mg_segment_spec s;
    mg_segment *a = NULL, *held = NULL;
    mg_segment_info ia;
    char err[MG_SEG_ERROR_MAX];
    static const struct {
        const char *share, *why;
    } bad[] = {{"t1", "owns the segment"},       {"t2,t2", "named twice"},
               {"a,b,c,d,e", "at most 4"},       {"t2,,t3", "empty tenant"},
               {",t2", "empty tenant"},          {"t2,", "empty tenant"},
               {"t 2", "is not [A-Za-z0-9._:-]"}};
    make_dir();
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = anon("t1", "x", 4096);
        s.share = bad[i].share;
        expect_reserve(reg, &s, MG_ERR_INVALID, bad[i].why);
    }
    s = anon("t1", "a", 4096);
    s.share = "t2,team-3";
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &a, err), 0);
    mg_segment_get_info(reg, a, &ia);
    CU_ASSERT_STRING_EQUAL(ia.share, "t2,team-3");
    /* sharees use its bytes and may target it; they do not find it as theirs */
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "t2", ia.id, "test", &held), 0);
    mg_registry_put(reg, held);
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "team-3", ia.id, "test", &held), 0);
    mg_registry_put(reg, held);
    CU_ASSERT_EQUAL(mg_registry_find_target(reg, "t2", ia.id, &ia), 0);
    CU_ASSERT_EQUAL(mg_registry_find(reg, "t2", ia.id, &ia), MG_ERR_NOT_FOUND);
    /* names are whole: neither prefixes nor the list itself match */
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "t", ia.id, "test", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "team-", ia.id, "test", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "t2,team-3", ia.id, "test", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_find_target(reg, "t4", ia.id, &ia), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "t2", ia.id, &held, err), MG_ERR_NOT_FOUND);
    unreg(reg, "t1", ia.id);
    mg_registry_del(reg);
    remove_dir();
}

static void test_cancel_before_mapping(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "cancelled", 16 << 20);
    mg_segment *seg = NULL;
    mg_registry_stats st;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    reg = open_reg(8, 0, 0);
    s.prefault = 1;
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &s, &seg, err), 0);
    mg_segment_cancel(seg);
    CU_ASSERT_EQUAL(mg_segment_map(seg), MG_ERR_CANCELLED);
    CU_ASSERT_PTR_NOT_NULL(strstr(mg_segment_error(seg), "cancelled"));
    CU_ASSERT_PTR_NULL(mg_segment_addr(seg));
    mg_registry_commit(reg, seg, MG_ERR_CANCELLED);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.bytes, 0);
    CU_ASSERT_EQUAL(st.registering, 0);
    CU_ASSERT_EQUAL(count_files(), 0);
    /* The name is free again. */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_registry_del(reg);
    remove_dir();
}

static void test_request_ids(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "once", 4096);
    mg_segment *first, *again, *pending;
    char err[MG_SEG_ERROR_MAX];
    mg_registry_stats st;
    make_dir();
    reg = open_reg(8, 0, 0);
    s.request_id = "req-1";
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &first, err), 0);
    /* A retry returns the first segment and enters nothing new. */
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &s, &again, err), MG_SEG_RETRY);
    CU_ASSERT_PTR_EQUAL(again, first);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 1);
    CU_ASSERT_EQUAL(st.bytes, 4096);
    /* The same id for another name is a client bug. */
    s.name = "other";
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &s, &again, err), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "was used for segment \"once\""));
    /* While the first request with an id still registers, a retry is told to come back. */
    s.name = "slow";
    s.request_id = "req-2";
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &s, &pending, err), 0);
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &s, &again, err), MG_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "still registering"));
    mg_registry_commit(reg, pending, MG_ERR_CANCELLED);
    /* A failed first attempt frees its id: the retry registers. */
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    s.request_id = "bad id";
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &s, &again, err), MG_ERR_INVALID);
    mg_registry_del(reg);
    remove_dir();
}

static void test_anon_file_is_the_memory(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "kv", 3 * 4096 + 100);
    mg_segment *seg = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX], buf[16];
    struct stat st;
    int fd;
    make_dir();
    reg = open_reg(8, 0, 0);
    s.prefault = 1;
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(stat(info.path, &st), 0);
    CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
    CU_ASSERT_EQUAL((uint64_t)st.st_size, 3 * 4096 + 100);
    CU_ASSERT_PTR_NOT_NULL(strstr(info.path, dir));
    {
        /* Prefaulted: every page is resident. */
        unsigned char vec[4];
        CU_ASSERT_EQUAL(mincore(mg_segment_addr(seg), info.size, vec), 0);
        for (int i = 0; i < 4; i++)
            CU_ASSERT(vec[i] & 1);
    }
    /* What the daemon writes, a local client reads from the file, and the other way. */
    memcpy((char *)mg_segment_addr(seg) + 4096, "from daemon", 11);
    fd = open(info.path, O_RDWR);
    CU_ASSERT_EQUAL(pread(fd, buf, 11, 4096), 11);
    CU_ASSERT_EQUAL(memcmp(buf, "from daemon", 11), 0);
    CU_ASSERT_EQUAL(pwrite(fd, "from client", 11, 8192), 11);
    CU_ASSERT_EQUAL(memcmp((char *)mg_segment_addr(seg) + 8192, "from client", 11), 0);
    close(fd);
    unreg(reg, "t", info.id);
    CU_ASSERT_EQUAL(stat(info.path, &st), -1); /* the daemon's file is gone */
    mg_registry_del(reg);
    remove_dir();
}

typedef struct {
    int calls, result, gates;
    mg_segment *seg;
    char why[MG_SEG_ERROR_MAX];
    mg_segment_info info;
} async_rec;

static void rec_registered(void *arg, mg_segment *seg, int result, const char *why)
{
    async_rec *r = arg;
    r->calls++;
    r->seg = seg;
    r->result = result;
    snprintf(r->why, sizeof(r->why), "%s", why);
}

static void rec_unregistered(void *arg, const mg_segment_info *info)
{
    async_rec *r = arg;
    r->calls++;
    r->info = *info;
}

static void rec_gate(void *arg, int after_map)
{
    async_rec *r = arg;
    CU_ASSERT(mg_engine_on_worker());
    r->gates += after_map ? 10 : 1;
}

/* Runs the loop side until `r` was called. */
static void wait_rec(mg_cq *cq, async_rec *r)
{
    struct pollfd pfd = {.fd = mg_cq_fd(cq), .events = POLLIN};
    while (r->calls == 0) {
        CU_ASSERT_EQUAL_FATAL(poll(&pfd, 1, 30000), 1);
        mg_cq_drain(cq, 0);
    }
}

/* The reserve -> map -> commit protocol and its undo as two asynchronous calls: the mapping on
 * a worker, the commit and the answer on the loop; a failure leaves nothing behind. */
static void test_register_and_unregister_async(void)
{
    mg_registry *reg;
    mg_engine *e;
    mg_cq *cq;
    mg_engine_config ec = {.workers = 1, .queue_depth = 4};
    mg_segment *seg = NULL, *gone = NULL;
    mg_segment_spec s;
    mg_registry_stats st;
    async_rec r = {0};
    mg_segment_info ia;
    struct stat sb;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    reg = open_reg(8, 0, 0);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &ec), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    s = anon("t", "a", 8192);
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &s, &seg, err), 0);
    mg_registry_set_gate(reg, rec_gate, &r); /* the test hook: passed before and after mapping */
    CU_ASSERT_EQUAL_FATAL(mg_registry_register_async(reg, e, cq, seg, rec_registered, &r), 0);
    wait_rec(cq, &r);
    CU_ASSERT(r.calls == 1 && r.result == 0 && r.seg == seg && r.gates == 11);
    mg_segment_get_info(reg, seg, &ia);
    CU_ASSERT_EQUAL(ia.state, MG_SEG_READY);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT(st.segments == 1 && st.registering == 0);
    /* a failure: the file is missing; the reservation is undone before done is called */
    memset(&r, 0, sizeof(r));
    s = anon("t", "b", 0);
    s.source = MG_SEG_SHM;
    s.shm_file = "missing";
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &s, &seg, err), 0);
    mg_registry_set_gate(reg, NULL, NULL);
    CU_ASSERT_EQUAL_FATAL(mg_registry_register_async(reg, e, cq, seg, rec_registered, &r), 0);
    wait_rec(cq, &r);
    CU_ASSERT(r.calls == 1 && r.result == MG_ERR_INVALID && r.seg == NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.why, "cannot open missing"));
    mg_registry_get_stats(reg, &st);
    CU_ASSERT(st.segments == 1 && st.registering == 0);
    /* the undo: unmapped on a worker, released on the loop */
    memset(&r, 0, sizeof(r));
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister(reg, "t", ia.id, &gone, err), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister_async(reg, e, cq, gone, rec_unregistered, &r), 0);
    wait_rec(cq, &r);
    CU_ASSERT(r.info.id == ia.id && strcmp(r.info.name, "a") == 0);
    CU_ASSERT_EQUAL(stat(ia.path, &sb), -1); /* the daemon's file is gone */
    mg_registry_get_stats(reg, &st);
    CU_ASSERT(st.segments == 0 && st.bytes == 0);
    mg_engine_stop(e);
    mg_engine_del(e);
    mg_cq_del(cq);
    mg_registry_del(reg);
    remove_dir();
}

/* A job that holds the one worker until told to go, then a while longer: the stop's flag is set
 * by then, so the job queued behind it is given up, not run. */
typedef struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int started, go;
} blocker;

static int block_work(void *arg)
{
    blocker *b = arg;
    pthread_mutex_lock(&b->m);
    b->started = 1;
    pthread_cond_broadcast(&b->c);
    while (!b->go)
        pthread_cond_wait(&b->c, &b->m);
    pthread_mutex_unlock(&b->m);
    poll(NULL, 0, 50);
    return 0;
}

static void block_done(void *arg, int result)
{
    (void)arg;
    (void)result;
}

static void *stop_main(void *arg)
{
    mg_engine_stop(arg);
    return NULL;
}

/* An unregister still queued when the workers stop is answered cancelled: the segment is
 * unmapped there all the same (its file gone; a device registration let go), not leaked. */
static void test_unregister_given_up_at_stop(void)
{
    mg_registry *reg;
    mg_engine *e;
    mg_cq *cq;
    mg_engine_config ec = {.workers = 1, .queue_depth = 4};
    mg_segment_spec s = anon("t", "given-up", 8192);
    mg_segment *seg = NULL, *gone = NULL;
    mg_segment_info info;
    blocker b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    async_rec r = {0};
    struct stat sb;
    pthread_t th;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    reg = open_reg(8, 0, 0);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&e, &ec), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL_FATAL(mg_engine_submit(e, cq, block_work, block_done, &b), 0);
    pthread_mutex_lock(&b.m);
    while (!b.started)
        pthread_cond_wait(&b.c, &b.m);
    pthread_mutex_unlock(&b.m);
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister(reg, "t", info.id, &gone, err), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister_async(reg, e, cq, gone, rec_unregistered, &r), 0);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, stop_main, e), 0);
    poll(NULL, 0, 50); /* the stop sets its flag */
    pthread_mutex_lock(&b.m);
    b.go = 1;
    pthread_cond_broadcast(&b.c);
    pthread_mutex_unlock(&b.m);
    pthread_join(th, NULL);
    wait_rec(cq, &r);
    CU_ASSERT(r.calls == 1 && r.info.id == info.id);
    CU_ASSERT_EQUAL(stat(info.path, &sb), -1); /* unmapped: the daemon's file is gone */
    mg_engine_del(e);
    mg_cq_del(cq);
    mg_registry_del(reg);
    remove_dir();
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* A mapped segment keeps no descriptor: registrations are bounded by --max-segments, not by
 * the open-files limit. */
static void test_segments_keep_no_descriptor(void)
{
    mg_registry *reg;
    char err[MG_SEG_ERROR_MAX], name[16];
    int before;
    make_dir();
    reg = open_reg(64, 0, 0);
    before = open_fds();
    for (int i = 0; i < 40; i++) {
        mg_segment_spec s;
        snprintf(name, sizeof(name), "s%d", i);
        s = anon("t", name, 4096);
        CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, NULL, err), 0);
    }
    CU_ASSERT_EQUAL(open_fds(), before);
    mg_registry_del(reg);
    remove_dir();
}

static void write_file(const char *name, size_t size)
{
    char path[128];
    int fd;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(ftruncate(fd, (off_t)size), 0);
    if (size >= 5)
        CU_ASSERT_EQUAL(pwrite(fd, "hello", 5, 0), 5);
    close(fd);
}

static void expect_map(mg_registry *reg, const char *file, uint64_t size, int code,
                       const char *needle)
{
    mg_segment_spec s = anon("t", file, size);
    char err[MG_SEG_ERROR_MAX];
    mg_registry_stats st;
    s.source = MG_SEG_SHM;
    s.shm_file = file;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), code);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.registering, 0);
    CU_ASSERT_EQUAL(st.bytes, 0);
}

static void test_shm_file_checks(void)
{
    mg_registry *reg;
    char p1[128], p2[128];
    make_dir();
    reg = open_reg(8, 0, 0);
    write_file("short", 100);
    expect_map(reg, "short", 4096, MG_ERR_INVALID, "has 100 bytes, fewer than the 4096");
    expect_map(reg, "missing", 0, MG_ERR_INVALID, "cannot open missing");
    write_file("empty", 0);
    expect_map(reg, "empty", 0, MG_ERR_INVALID, "is empty");
    snprintf(p1, sizeof(p1), "%s/sub", dir);
    CU_ASSERT_EQUAL(mkdir(p1, 0700), 0);
    expect_map(reg, "sub", 0, MG_ERR_INVALID, "cannot open sub"); /* a directory */
    snprintf(p1, sizeof(p1), "%s/link", dir);
    CU_ASSERT_EQUAL(symlink("/etc/hostname", p1), 0);
    expect_map(reg, "link", 0, MG_ERR_PERMISSION, "symbolic link");
    write_file("twice", 8192);
    snprintf(p1, sizeof(p1), "%s/twice", dir);
    snprintf(p2, sizeof(p2), "%s/twice2", dir);
    CU_ASSERT_EQUAL(link(p1, p2), 0);
    expect_map(reg, "twice", 0, MG_ERR_PERMISSION, "2 hard links");
    snprintf(p1, sizeof(p1), "%s/fifo", dir);
    CU_ASSERT_EQUAL(mkfifo(p1, 0600), 0);
    expect_map(reg, "fifo", 0, MG_ERR_INVALID, "not a regular file");
    mg_registry_del(reg);
    remove_dir();
}

/* A file is registered by name only for its owner, and one file for one tenant, whatever name
 * reaches it. */
static void test_shm_file_owner(void)
{
    mg_registry *reg;
    mg_segment_spec s;
    mg_segment *a = NULL, *b = NULL;
    mg_segment_info ia;
    char err[MG_SEG_ERROR_MAX], p1[128], p2[128];
    make_dir();
    reg = open_reg(8, 0, 0);
    write_file("mine", 8192);
    /* No uid known (a token or certificate caller): refused before anything is opened. */
    s = anon("t1", "x", 0);
    s.source = MG_SEG_SHM;
    s.shm_file = "mine";
    s.caller_uid_known = 0;
    expect_reserve(reg, &s, MG_ERR_PERMISSION, "only for its owner");
    /* Another uid than the file's owner. */
    s.caller_uid_known = 1;
    s.caller_uid = (uint32_t)getuid() + 1;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "not to the caller"));
    /* A mode that does not let the owner write. */
    snprintf(p1, sizeof(p1), "%s/mine", dir);
    CU_ASSERT_EQUAL(chmod(p1, 0400), 0);
    s.caller_uid = (uint32_t)getuid();
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "mode 0400"));
    CU_ASSERT_EQUAL(chmod(p1, 0600), 0);
    /* Tenant t1 registers it; t2 (same uid here) reaches the same inode by its name and, after
     * a rename, by another one: refused both times. t1 may register it again. */
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &a, err), 0);
    s = anon("t2", "y", 0);
    s.source = MG_SEG_SHM;
    s.shm_file = "mine";
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "another tenant's segment"));
    snprintf(p2, sizeof(p2), "%s/renamed", dir);
    CU_ASSERT_EQUAL(rename(p1, p2), 0);
    s.shm_file = "renamed";
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_PERMISSION);
    s = anon("t1", "again", 0);
    s.source = MG_SEG_SHM;
    s.shm_file = "renamed";
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &b, err), 0);
    /* Once t1's segments are gone, the file is free for whoever owns it. */
    mg_segment_get_info(reg, a, &ia);
    unreg(reg, "t1", ia.id);
    s = anon("t2", "y", 0);
    s.source = MG_SEG_SHM;
    s.shm_file = "renamed";
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_PERMISSION); /* "again" holds it */
    mg_segment_get_info(reg, b, &ia);
    unreg(reg, "t1", ia.id);
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    mg_registry_del(reg);
    remove_dir();
}

static void test_shm_whole_file_and_client_bytes(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "client-buf", 0);
    mg_segment *seg = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    struct stat st;
    make_dir();
    reg = open_reg(8, 10000, 0);
    write_file("client.buf", 8192);
    s.source = MG_SEG_SHM;
    s.shm_file = "client.buf";
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.size, 8192); /* size 0: the whole file */
    CU_ASSERT_EQUAL(memcmp(mg_segment_addr(seg), "hello", 5), 0);
    /* The whole-file size counts against the registered-bytes limit. */
    write_file("client2.buf", 4096);
    s.name = "second";
    s.shm_file = "client2.buf";
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "registered-bytes limit of 10000"));
    unreg(reg, "t", info.id);
    CU_ASSERT_EQUAL(stat(info.path, &st), 0); /* a client's file stays */
    mg_registry_del(reg);
    remove_dir();
}

static void test_references_block_unregister(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "held", 4096);
    mg_segment *seg = NULL, *held = NULL, *gone = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    make_dir();
    reg = open_reg(8, 0, 0);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "other", info.id, "x", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "t", info.id + 1, "x", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire(reg, "t", info.id, "lease 7", &held), 0);
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "t", info.id, &gone, err), MG_ERR_BUSY);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "held by 1 lease(s) or transfer(s), the latest: lease 7"));
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "other", info.id, &gone, err), MG_ERR_NOT_FOUND);
    mg_registry_put(reg, held);
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister(reg, "t", info.id, &gone, err), 0);
    /* While it is being unregistered it can be neither acquired nor unregistered again. */
    CU_ASSERT_EQUAL(mg_registry_acquire(reg, "t", info.id, "x", &held), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "t", info.id, &held, err), MG_ERR_NOT_FOUND);
    mg_segment_unmap(gone);
    mg_registry_release(reg, gone);
    mg_registry_del(reg);
    remove_dir();
}

typedef struct {
    mg_registry *reg;
    mg_segment *seg;
    int done; /* atomic */
} drainer;

static void *drain_main(void *arg)
{
    drainer *d = arg;
    mg_registry_drain(d->reg, d->seg);
    __atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A data-plane slice passing (its reference goes once its bytes went) does not refuse an
 * unregister, as a lease or a transfer does: the unmapping waits for it (drain). A peer told its
 * transfer is done may unregister before the sender's thread let the slice go. */
static void test_slices_passing_are_waited_for(void)
{
    mg_registry *reg;
    mg_segment_spec s = anon("t", "passing", 4096);
    mg_segment *seg = NULL, *slice = NULL, *lease = NULL, *gone = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    drainer d = {0};
    pthread_t th;
    make_dir();
    reg = open_reg(8, 0, 0);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(mg_registry_acquire_passing(reg, "other", info.id, &slice), MG_ERR_NOT_FOUND);
    /* A lasting holder still refuses it, named as the latest though a slice came after. */
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire(reg, "t", info.id, "lease 7", &lease), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire_passing(reg, "t", info.id, &slice), 0);
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "t", info.id, &gone, err), MG_ERR_BUSY);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "held by 1 lease(s) or transfer(s), the latest: lease 7"));
    mg_registry_put(reg, lease);
    CU_ASSERT_EQUAL_FATAL(mg_registry_unregister(reg, "t", info.id, &gone, err), 0);
    CU_ASSERT_EQUAL(mg_registry_acquire_passing(reg, "t", info.id, &lease), MG_ERR_NOT_FOUND);
    d = (drainer){reg, gone, 0};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, drain_main, &d), 0);
    poll(NULL, 0, 50); /* the drain, were it not waiting, would be done by now */
    CU_ASSERT_EQUAL(__atomic_load_n(&d.done, __ATOMIC_ACQUIRE), 0);
    mg_registry_put_passing(reg, slice);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(d.done, 1);
    mg_segment_get_info(reg, gone, &info);
    CU_ASSERT_EQUAL(info.refs, 0);
    mg_segment_unmap(gone);
    mg_registry_release(reg, gone);
    mg_registry_del(reg);
    remove_dir();
}

static void test_list_pages_in_id_order(void)
{
    mg_registry *reg;
    mg_segment_info page[4], all[20];
    char err[MG_SEG_ERROR_MAX], name[16];
    uint64_t after = 0;
    size_t n, total = 0;
    make_dir();
    reg = open_reg(32, 0, 0);
    for (int i = 0; i < 10; i++) {
        mg_segment_spec s;
        snprintf(name, sizeof(name), "s%d", i);
        s = anon(i % 2 ? "odd" : "even", name, 4096);
        CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    }
    while ((n = mg_registry_list(reg, "even", after, page, 4)) > 0) {
        for (size_t i = 0; i < n; i++) {
            CU_ASSERT_STRING_EQUAL(page[i].tenant, "even");
            CU_ASSERT(page[i].id > after);
            after = page[i].id;
            all[total++] = page[i];
        }
    }
    CU_ASSERT_EQUAL(total, 5);
    CU_ASSERT_EQUAL(mg_registry_list(reg, NULL, 0, all, 20), 10);
    for (size_t i = 1; i < 10; i++)
        CU_ASSERT(all[i - 1].id < all[i].id);
    mg_registry_del(reg);
    remove_dir();
}

static void test_restart_removes_old_daemon_files(void)
{
    mg_registry *reg;
    struct stat st;
    char path[128];
    make_dir();
    write_file("moongate-seg-00000000deadbeef", 4096);
    write_file("client.buf", 4096);
    reg = open_reg(8, 0, 0);
    snprintf(path, sizeof(path), "%s/moongate-seg-00000000deadbeef", dir);
    CU_ASSERT_EQUAL(stat(path, &st), -1);
    snprintf(path, sizeof(path), "%s/client.buf", dir);
    CU_ASSERT_EQUAL(stat(path, &st), 0);
    mg_registry_del(reg);
    remove_dir();
}

/* Drops CAP_IPC_LOCK so that RLIMIT_MEMLOCK applies even to root. */
static int drop_ipc_lock(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) != 0)
        return -1;
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    return (int)syscall(SYS_capset, &hdr, data);
}

/* In a child process: lock 1 MiB under a 64 KiB RLIMIT_MEMLOCK. Exit status 0 when `require`
 * fails naming the limit and `try` registers without locking. */
static int memlock_child(void)
{
    struct rlimit rl = {65536, 65536};
    mg_registry *reg;
    mg_segment_spec s = anon("t", "locked", 1 << 20);
    mg_segment *seg = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    mg_registry_config cfg = {.shm_dir = dir, .file_mode = 0600, .max_segments = 8};
    if (drop_ipc_lock() != 0 || setrlimit(RLIMIT_MEMLOCK, &rl) != 0 ||
        mg_registry_new(&reg, &cfg) != 0)
        return 10;
    s.memlock = MG_MEMLOCK_REQUIRE;
    if (reg_segment(reg, &s, NULL, err) != MG_ERR_NOMEM)
        return 11;
    if (strstr(err, "RLIMIT_MEMLOCK is 65536 bytes") == NULL)
        return 12;
    s.memlock = MG_MEMLOCK_TRY;
    if (reg_segment(reg, &s, &seg, err) != 0)
        return 13;
    mg_segment_get_info(reg, seg, &info);
    if (info.locked)
        return 14;
    mg_registry_del(reg);
    return 0;
}

/* The sanitizers' runtimes replace mlock() with a no-op that succeeds. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MG_MLOCK_INTERCEPTED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MG_MLOCK_INTERCEPTED 1
#endif
#endif

static void test_memlock_policy_and_limit(void)
{
    pid_t pid;
    int status = -1;
#ifdef MG_MLOCK_INTERCEPTED
    /* Nothing to observe under a sanitizer. The release build runs this test. */
    fprintf(stderr, "(skipped under a sanitizer: mlock is intercepted) ");
    return;
#endif
    make_dir();
    pid = fork();
    if (pid == 0)
        _exit(memlock_child());
    CU_ASSERT_FATAL(pid > 0);
    CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
    CU_ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "memlock child exit %d\n", WEXITSTATUS(status));
    CU_ASSERT_EQUAL(WEXITSTATUS(status), 0);
    {
        /* With the capability (the parent), require locks. */
        mg_registry *reg = open_reg(8, 0, 0);
        mg_segment_spec s = anon("t", "locked", 1 << 20);
        mg_segment *seg = NULL;
        mg_segment_info info;
        mg_registry_stats st;
        char err[MG_SEG_ERROR_MAX];
        s.memlock = MG_MEMLOCK_REQUIRE;
        if (geteuid() == 0) {
            CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
            mg_segment_get_info(reg, seg, &info);
            CU_ASSERT_TRUE(info.locked);
            mg_registry_get_stats(reg, &st);
            CU_ASSERT_EQUAL(st.locked_bytes, 1 << 20);
        }
        mg_registry_del(reg);
    }
    remove_dir();
}

/* ---- segments of a passed descriptor ---- */

static int closed(int fd)
{
    return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

static mg_segment_spec fd_spec(const char *name, int fd, uint64_t offset, uint64_t size)
{
    mg_segment_spec s = anon("t", name, size);
    s.source = MG_SEG_FD;
    s.fd = fd;
    s.offset = offset;
    return s;
}

/* Registers fd (which the registry takes) and expects `code` with `needle` in the reason. */
static void expect_fd(mg_registry *reg, int fd, uint64_t offset, uint64_t size, int code,
                      const char *needle)
{
    mg_segment_spec s = fd_spec("bad", fd, offset, size);
    char err[MG_SEG_ERROR_MAX] = "";
    mg_registry_stats st;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), code);
    if (strstr(err, needle) == NULL)
        fprintf(stderr, "expected \"%s\" in \"%s\"\n", needle, err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    CU_ASSERT(closed(fd)); /* taken and closed: nothing held, nothing leaked */
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.registering + st.segments, 0);
    CU_ASSERT_EQUAL(st.bytes, 0);
}

static int memfd(size_t size, unsigned flags)
{
    int fd = (int)syscall(SYS_memfd_create, "mgtest", flags | MFD_CLOEXEC);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL_FATAL(ftruncate(fd, (off_t)size), 0);
    return fd;
}

/* The segment is the client's own bytes, where they lie: from an unaligned offset, to the end
 * of the file with size 0, and the descriptor is closed once mapped. */
static void test_fd_segment_is_the_clients_memory(void)
{
    mg_registry *reg;
    mg_segment *seg = NULL;
    mg_segment_info info;
    mg_segment_spec s;
    char err[MG_SEG_ERROR_MAX];
    int fd, keep;
    char *mine;
    make_dir();
    reg = open_reg(8, 0, 0);
    fd = memfd(3 * 4096, MFD_ALLOW_SEALING);
    keep = dup(fd);
    mine = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, keep, 0);
    CU_ASSERT_FATAL(mine != MAP_FAILED);
    memcpy(mine + 4096 + 100, "client bytes", 12);
    s = fd_spec("mine", fd, 4096 + 100, 1000);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    CU_ASSERT(closed(fd));
    CU_ASSERT_EQUAL(memcmp(mg_segment_addr(seg), "client bytes", 12), 0);
    memcpy((char *)mg_segment_addr(seg) + 999, "!", 1); /* the daemon writes: the client sees */
    CU_ASSERT_EQUAL(mine[4096 + 100 + 999], '!');
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.source, MG_SEG_FD);
    CU_ASSERT_EQUAL(info.offset, 4096 + 100);
    CU_ASSERT_EQUAL(info.size, 1000);
    CU_ASSERT_STRING_EQUAL(info.path, "");
    unreg(reg, "t", info.id);
    CU_ASSERT_EQUAL(mine[4096 + 100], 'c'); /* unregistering leaves the client's file alone */
    /* size 0: from the offset to the end of the file. */
    s = fd_spec("rest", dup(keep), 4096, 0);
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.size, 2 * 4096);
    CU_ASSERT_EQUAL(memcmp((char *)mg_segment_addr(seg) + 100, "client bytes", 12), 0);
    unreg(reg, "t", info.id);
    munmap(mine, 3 * 4096);
    close(keep);
    mg_registry_del(reg);
    remove_dir();
}

/* What is not mappable memory, or not the caller's to write, is refused by name. */
static void test_fd_segment_checks(void)
{
    mg_registry *reg;
    mg_segment_spec s;
    int p[2], sv[2], fd;
    char path[128];
    make_dir();
    reg = open_reg(8, 0, 0);
    /* No descriptor, and an offset for another source. */
    s = fd_spec("none", -1, 0, 0);
    expect_reserve(reg, &s, MG_ERR_INVALID, "no descriptor");
    s = anon("t", "x", 4096);
    s.offset = 4096;
    expect_reserve(reg, &s, MG_ERR_INVALID, "offset is for");
    CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
    close(p[1]);
    expect_fd(reg, p[0], 0, 0, MG_ERR_INVALID, "is a pipe");
    CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    expect_fd(reg, sv[0], 0, 0, MG_ERR_INVALID, "is a socket");
    expect_fd(reg, open(dir, O_RDONLY | O_DIRECTORY), 0, 0, MG_ERR_INVALID, "is a directory");
    write_file("plain", 8192);
    snprintf(path, sizeof(path), "%s/plain", dir);
    expect_fd(reg, open(path, O_PATH), 0, 0, MG_ERR_INVALID, "O_PATH");
    expect_fd(reg, open(path, O_WRONLY), 0, 0, MG_ERR_INVALID, "write-only");
    expect_fd(reg, open(path, O_RDONLY), 0, 0, MG_ERR_INVALID, "read-only");
    expect_fd(reg, open(path, O_RDWR), 8192, 0, MG_ERR_RANGE, "not inside the file");
    expect_fd(reg, open(path, O_RDWR), 4096, 4097, MG_ERR_RANGE, "run past the end");
    expect_fd(reg, open(path, O_RDWR), UINT64_MAX - 10, 0, MG_ERR_RANGE, "not inside");
    expect_fd(reg, open(path, O_RDWR), 1, UINT64_MAX, MG_ERR_RANGE, "run past the end");
    fd = memfd(4096, MFD_ALLOW_SEALING);
    CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
    expect_fd(reg, fd, 0, 0, MG_ERR_INVALID, "sealed against writes");
    expect_fd(reg, memfd(0, 0), 0, 0, MG_ERR_RANGE, "not inside the file (0 bytes)");
    /* A regular file that is no memfd maps like one. */
    s = fd_spec("plain", open(path, O_RDWR), 0, 0);
    {
        mg_segment *seg = NULL;
        mg_segment_info info;
        char err[MG_SEG_ERROR_MAX];
        CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &seg, err), 0);
        CU_ASSERT_EQUAL(memcmp(mg_segment_addr(seg), "hello", 5), 0);
        mg_segment_get_info(reg, seg, &info);
        unreg(reg, "t", info.id);
    }
    mg_registry_del(reg);
    remove_dir();
}

/* A hugetlbfs memfd maps in whole huge pages. Where the machine has huge pages reserved, one is
 * registered; the alignment check needs none. */
static void test_fd_segment_huge_pages(void)
{
    const uint64_t huge = 2ULL << 20;
    mg_registry *reg;
    mg_segment_spec s;
    mg_segment *seg = NULL;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    int fd = (int)syscall(SYS_memfd_create, "mghuge", MFD_HUGETLB | MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)(2 * huge)) != 0) {
        fprintf(stderr, "  (no hugetlbfs memfd here: %s)\n", strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    make_dir();
    reg = open_reg(8, 0, 0);
    expect_fd(reg, dup(fd), 4096, 0, MG_ERR_INVALID, "whole huge pages of 2097152 bytes");
    expect_fd(reg, dup(fd), huge, 4096, MG_ERR_INVALID, "whole huge pages");
    s = fd_spec("huge", fd, huge, huge);
    if (reg_segment(reg, &s, &seg, err) == 0) {
        mg_segment_get_info(reg, seg, &info);
        CU_ASSERT_EQUAL(info.size, huge);
        unreg(reg, "t", info.id);
    } else {
        fprintf(stderr, "  (no huge page to register here: %s)\n", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot reserve"));
    }
    mg_registry_del(reg);
    remove_dir();
}

/* Regions registered with the process's own address of them: one process's ranges never
 * overlap, an address resolves within the calling process (the same pid with another start time
 * is another process) and its tenant, to one region only. */
static void test_client_addresses(void)
{
    const mg_proc a = {.pid = 100, .start = 5}, a_reused = {.pid = 100, .start = 6};
    mg_registry *reg;
    mg_segment *s1 = NULL, *s3 = NULL;
    mg_segment_spec s;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    uint64_t id, off;
    make_dir();
    reg = open_reg(8, 0, 0);
    s = anon("t", "one", 8192);
    s.client_addr = 0x10000;
    s.client = a;
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &s1, err), 0);
    mg_segment_get_info(reg, s1, &info);
    CU_ASSERT_EQUAL(info.client_addr, 0x10000);
    CU_ASSERT_EQUAL(info.client_pid, 100);
    s.name = "overlaps";
    s.client_addr = 0x11000;
    expect_reserve(reg, &s, MG_ERR_EXISTS, "overlaps segment");
    s.client_addr = 0xf000; /* ends inside "one" */
    expect_reserve(reg, &s, MG_ERR_EXISTS, "(\"one\", [0x10000, 0x12000))");
    s.client = a_reused; /* another process with the same pid: its own ranges */
    s.client_addr = 0x11000;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    s = anon("t", "three", 4096);
    s.client_addr = 0x12000; /* right after "one" */
    s.client = a;
    CU_ASSERT_EQUAL_FATAL(reg_segment(reg, &s, &s3, err), 0);
    /* Resolution. */
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x10000 + 100, 50, &id, &off, err), 0);
    mg_segment_get_info(reg, s1, &info);
    CU_ASSERT_EQUAL(id, info.id);
    CU_ASSERT_EQUAL(off, 100);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x11f00, 0x200, &id, &off, err),
                    MG_ERR_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "crosses from segment"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "into segment"));
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x12f00, 0x200, &id, &off, err),
                    MG_ERR_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "runs past the end of segment"));
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x12f00, UINT64_MAX, &id, &off, err),
                    MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x20000, 1, &id, &off, err),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0xffff, 1, &id, &off, err), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "other", &a, 0x10000, 1, &id, &off, err),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a_reused, 0x11000, 1, &id, &off, err), 0);
    /* Unregistered: its address resolves no more, and the range is free again. */
    unreg(reg, "t", info.id);
    CU_ASSERT_EQUAL(mg_registry_resolve(reg, "t", &a, 0x10000, 1, &id, &off, err),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no region this process registered holds address 0x10000"));
    s = anon("t", "again", 8192);
    s.client_addr = 0x10000;
    s.client = a;
    CU_ASSERT_EQUAL(reg_segment(reg, &s, NULL, err), 0);
    /* The process's regions in address order, each with when it was registered: "three" (at
     * 0x12000) before "again" (at 0x10000), what an agent's first buffer is chosen by. */
    {
        mg_region r[4];
        CU_ASSERT_EQUAL_FATAL(mg_registry_regions(reg, "t", &a, 0, r, 4), 2);
        CU_ASSERT_EQUAL(r[0].address, 0x10000);
        CU_ASSERT_EQUAL(r[1].address, 0x12000);
        CU_ASSERT(r[1].order < r[0].order);
    }
    /* An address needs a process and a size: off the Unix socket there is none; on it, pid 0
     * is a caller in a pid namespace this daemon does not see. */
    s = anon("t", "nopid", 4096);
    s.client_addr = 0x40000;
    s.caller_uid_known = 0;
    expect_reserve(reg, &s, MG_ERR_INVALID, "local process's");
    s.caller_uid_known = 1;
    expect_reserve(reg, &s, MG_ERR_PERMISSION, "hostPID");
    s = fd_spec("nosize", -1, 0, 0);
    s.fd = open("/dev/null", O_RDONLY);
    s.client_addr = 0x40000;
    s.client = a;
    expect_reserve(reg, &s, MG_ERR_INVALID, "needs its size");
    mg_registry_del(reg);
    remove_dir();
}

static void test_bad_registry_config(void)
{
    mg_registry *reg = NULL;
    mg_registry_config rel = {.shm_dir = "relative/dir", .file_mode = 0600, .max_segments = 8};
    mg_registry_config none = {
        .shm_dir = "/nonexistent/moongate", .file_mode = 0600, .max_segments = 8};
    mg_registry_config zero = {.shm_dir = "/tmp", .file_mode = 0600, .max_segments = 0};
    CU_ASSERT_EQUAL(mg_registry_new(&reg, &rel), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_registry_new(&reg, &none), MG_ERR_SYSTEM);
    CU_ASSERT_EQUAL(mg_registry_new(&reg, &zero), MG_ERR_INVALID);
    mg_registry_del(NULL);
}

/* The id map's ordered tree (mg_idmap_next) against a plain array: thousands of records added
 * and removed in random order, the in-order walk checked after each round. */
static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_idmap_walks_in_id_order(void)
{
    enum { N = 4000 };
    mg_idmap m;
    mg_idmap_node *nodes = calloc(N, sizeof(*nodes));
    int *in = calloc(N, sizeof(*in));
    uint64_t *ids = calloc(N, sizeof(*ids)), seed = 12345;
    CU_ASSERT_FATAL(nodes && in && ids);
    CU_ASSERT_EQUAL_FATAL(mg_idmap_init(&m, 1024), 0);
    CU_ASSERT_PTR_NULL(mg_idmap_next(&m, 0));
    for (int round = 0; round < 6; round++) {
        size_t n = 0, k = 0;
        for (int i = 0; i < N; i++) { /* add some, remove some: leaves and inner nodes alike */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            if (!in[i] && (seed >> 33) % 3 != 0) {
                mg_idmap_add(&m, &nodes[i]);
                in[i] = 1;
            } else if (in[i] && (seed >> 33) % 3 == 0) {
                mg_idmap_remove(&m, &nodes[i]);
                in[i] = 0;
            }
        }
        for (int i = 0; i < N; i++)
            if (in[i])
                ids[n++] = nodes[i].id;
        qsort(ids, n, sizeof(*ids), cmp_u64);
        for (mg_idmap_node *x = mg_idmap_next(&m, 0); x; x = mg_idmap_next(&m, x->id)) {
            CU_ASSERT_FATAL(k < n);
            CU_ASSERT_EQUAL_FATAL(x->id, ids[k]);
            CU_ASSERT_PTR_EQUAL(mg_idmap_find(&m, x->id), x);
            k++;
        }
        CU_ASSERT_EQUAL(k, n);
        if (n > 2) /* a page from the middle: the first id above one in the set */
            CU_ASSERT_EQUAL(mg_idmap_next(&m, ids[n / 2])->id, ids[n / 2 + 1]);
    }
    for (int i = 0; i < N; i++)
        if (in[i])
            mg_idmap_remove(&m, &nodes[i]);
    CU_ASSERT_PTR_NULL(mg_idmap_next(&m, 0));
    mg_idmap_free(&m);
    free(nodes);
    free(in);
    free(ids);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_bounds),
        MG_TEST(test_spec_checks),
        MG_TEST(test_limits_names_and_ids),
        MG_TEST(test_tenant_limit),
        MG_TEST(test_tenant_bytes_quota),
        MG_TEST(test_sharing),
        MG_TEST(test_cancel_before_mapping),
        MG_TEST(test_request_ids),
        MG_TEST(test_anon_file_is_the_memory),
        MG_TEST(test_shm_file_checks),
        MG_TEST(test_shm_file_owner),
        MG_TEST(test_segments_keep_no_descriptor),
        MG_TEST(test_register_and_unregister_async),
        MG_TEST(test_shm_whole_file_and_client_bytes),
        MG_TEST(test_references_block_unregister),
        MG_TEST(test_slices_passing_are_waited_for),
        MG_TEST(test_unregister_given_up_at_stop),
        MG_TEST(test_list_pages_in_id_order),
        MG_TEST(test_idmap_walks_in_id_order),
        MG_TEST(test_restart_removes_old_daemon_files),
        MG_TEST(test_memlock_policy_and_limit),
        MG_TEST(test_bad_registry_config),
        MG_TEST(test_fd_segment_is_the_clients_memory),
        MG_TEST(test_fd_segment_checks),
        MG_TEST(test_fd_segment_huge_pages),
        MG_TEST(test_client_addresses),
    };
    return mg_test_run("segment registry", cases, sizeof(cases) / sizeof(cases[0]));
}
