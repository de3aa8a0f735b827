/*
 * Unit tests for the engine's pool set (moongate/pools.h), in memory with real workers and a
 * real registry, no daemon: start-up, the line of blocked acquires (first come first served,
 * cancel, deadline, drain), overflow regions, all-or-nothing batches, listing over pools, and
 * the order in which a published lease leaves the data plane and gives its range back.
 */
#include "mg_test.h"
#include "moongate/pools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024ULL * 1024ULL)

static char dir[64];
static mg_registry *reg;
static mg_engine *engine;
static mg_cq *cq;
static mg_lease_table *table;
static int started_rc[8], n_started;

/* What a `done` callback saw, in the order the answers came. */
typedef struct answer {
    int id;
    int rc;
    mg_pool *pool;
    mg_lease *l;
    char err[600];
} answer;
static answer answers[16];
static int n_answers;

static void on_started(void *arg, int rc)
{
    (void)arg;
    started_rc[n_started++] = rc;
}

static void on_done(void *arg, int rc, mg_pool *pool, mg_lease *l, const char *err)
{
    answer *a = &answers[n_answers++];
    a->id = (int)(intptr_t)arg;
    a->rc = rc;
    a->pool = pool;
    a->l = l;
    snprintf(a->err, sizeof(a->err), "%s", err ? err : "");
}

/* A set with a default pool of `bytes` and, when tenant_bytes, a pool of tenant "t2"; started
 * and registered. */
static mg_pools *open_set(uint64_t bytes, uint64_t tenant_bytes, int overflow,
                          uint64_t overflow_max)
{
    mg_registry_config rc = {.shm_dir = dir, .file_mode = 0600, .max_segments = 16};
    mg_engine_config ec = {.workers = 2, .queue_depth = 64};
    mg_pools_tenant t = {"t2", tenant_bytes};
    mg_pools_config pc = {.default_bytes = bytes,
                          .tenants = &t,
                          .n_tenants = tenant_bytes ? 1 : 0,
                          .max_leases = 64,
                          .max_ttl_ms = 60000,
                          .overflow = overflow,
                          .overflow_max_bytes = overflow_max};
    mg_pools *ps = NULL;
    unsigned pending = 0;
    snprintf(dir, sizeof(dir), "/tmp/mgpools-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &rc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_engine_new(&engine, &ec), 0);
    CU_ASSERT_EQUAL_FATAL(mg_cq_new(&cq), 0);
    CU_ASSERT_EQUAL_FATAL(mg_lease_table_new(&table), 0);
    pc.reg = reg;
    pc.engine = engine;
    pc.cq = cq;
    pc.leases = table;
    CU_ASSERT_EQUAL_FATAL(mg_pools_new(&ps, &pc), 0);
    n_started = n_answers = 0;
    CU_ASSERT_EQUAL_FATAL(mg_pools_start(ps, on_started, NULL, &pending), 0);
    CU_ASSERT_EQUAL(pending, tenant_bytes ? 2u : 1u);
    mg_cq_settle(cq);
    CU_ASSERT_EQUAL(n_started, (int)pending);
    for (int i = 0; i < n_started; i++)
        CU_ASSERT_EQUAL(started_rc[i], 0);
    return ps;
}

static void close_set(mg_pools *ps)
{
    mg_cq_settle(cq);
    mg_engine_stop(engine);
    mg_pools_del(ps);
    mg_cq_drain(cq, 0);
    mg_engine_del(engine);
    mg_cq_del(cq);
    mg_lease_table_del(table);
    mg_registry_del(reg);
    rmdir(dir);
}

static mg_pools_req req(const char *tenant, uint64_t size, int block)
{
    mg_pools_req r = {.tenant = tenant, .size = size, .ttl_ms = 10000, .block = block};
    return r;
}

/* Acquires now or fails the test. */
static mg_lease *take(mg_pools *ps, mg_pool *pool, const char *tenant, uint64_t size)
{
    mg_pools_req r = req(tenant, size, 0);
    mg_pools_wait *w = NULL;
    mg_lease *l = NULL;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_pools_acquire(ps, pool, &r, 1000, on_done, NULL, &w, &l, err), 0);
    return l;
}

/* Queues a blocking acquire that must wait; its answers carry `id`. */
static mg_pools_wait *wait_for(mg_pools *ps, mg_pool *pool, uint64_t size, int id,
                               uint64_t deadline_ms)
{
    mg_pools_req r = req("t1", size, 1);
    mg_pools_wait *w = NULL;
    mg_lease *l = NULL;
    char err[MG_SEG_ERROR_MAX];
    r.deadline_ms = deadline_ms;
    CU_ASSERT_EQUAL(
        mg_pools_acquire(ps, pool, &r, 1000, on_done, (void *)(intptr_t)id, &w, &l, err),
        MG_POOLS_WAITING);
    CU_ASSERT_PTR_NOT_NULL(w);
    return w;
}

static void test_start_and_pool_choice(void)
{
    mg_pools *ps = open_set(4 * MiB, 1 * MiB, 0, 0);
    mg_pools_entry_info e;
    int rc;
    mg_pool *def = mg_pools_for(ps, "t1", &rc), *own = mg_pools_for(ps, "t2", &rc);
    CU_ASSERT_PTR_NOT_NULL(def);
    CU_ASSERT_PTR_NOT_NULL(own);
    CU_ASSERT_PTR_NOT_EQUAL(def, own);
    CU_ASSERT_STRING_EQUAL(mg_pool_name(def), "default");
    CU_ASSERT_STRING_EQUAL(mg_pool_name(own), "tenant.t2");
    CU_ASSERT_EQUAL(mg_pools_count(ps), 2u);
    CU_ASSERT_EQUAL(mg_pools_get(ps, 1, &e), 0);
    CU_ASSERT_STRING_EQUAL(e.tenant, "t2");
    CU_ASSERT_EQUAL(e.stats.capacity, 1 * MiB);
    CU_ASSERT_EQUAL(mg_pools_get(ps, 2, &e), MG_ERR_NOT_FOUND);
    close_set(ps);
}

/* A large request at the head is never overtaken by small ones behind it, even when they
 * would fit; a release serves the line in order. */
static void test_line_is_first_come_first_served(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_lease *big = take(ps, pool, "t1", 3 * MiB);
    mg_pools_entry_info e;
    wait_for(ps, pool, 2 * MiB, 1, 0);
    wait_for(ps, pool, 4096, 2, 0); /* fits now, but waits behind the first */
    CU_ASSERT_EQUAL(n_answers, 0);
    CU_ASSERT_EQUAL(mg_pools_get(ps, 0, &e), 0);
    CU_ASSERT_EQUAL(e.waiters, 2u);
    mg_pools_release(ps, pool, big);
    CU_ASSERT_EQUAL_FATAL(n_answers, 2);
    CU_ASSERT_EQUAL(answers[0].id, 1);
    CU_ASSERT_EQUAL(answers[0].rc, 0);
    CU_ASSERT_EQUAL(answers[1].id, 2);
    CU_ASSERT_EQUAL(answers[1].rc, 0);
    CU_ASSERT_PTR_EQUAL(answers[0].pool, pool);
    close_set(ps);
}

/* Cancelling the head lets the next one through; a cancelled wait is never answered. */
static void test_cancel_serves_the_next(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    take(ps, pool, "t1", 3 * MiB);
    mg_pools_wait *head = wait_for(ps, pool, 2 * MiB, 1, 0);
    wait_for(ps, pool, 4096, 2, 0);
    mg_pools_cancel(head);
    CU_ASSERT_EQUAL_FATAL(n_answers, 1);
    CU_ASSERT_EQUAL(answers[0].id, 2);
    CU_ASSERT_EQUAL(answers[0].rc, 0);
    close_set(ps);
}

/* A wait ends at its deadline as the time is passed in, not before; drain ends the rest. */
static void test_deadline_and_drain(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    take(ps, pool, "t1", 4 * MiB);
    wait_for(ps, pool, 1 * MiB, 1, 5000);
    wait_for(ps, pool, 1 * MiB, 2, 0);
    mg_pools_expire(ps, 4999);
    CU_ASSERT_EQUAL(n_answers, 0);
    mg_pools_expire(ps, 5000);
    CU_ASSERT_EQUAL_FATAL(n_answers, 1);
    CU_ASSERT_EQUAL(answers[0].id, 1);
    CU_ASSERT_EQUAL(answers[0].rc, MG_ERR_TIMEOUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(answers[0].err, "no room for 1048576 bytes"));
    mg_pools_drain(ps);
    CU_ASSERT_EQUAL_FATAL(n_answers, 2);
    CU_ASSERT_EQUAL(answers[1].id, 2);
    CU_ASSERT_EQUAL(answers[1].rc, MG_ERR_SHUTDOWN);
    close_set(ps);
}

/* A published lease: peers find it in the table; released while a slice uses it, it leaves the
 * table at once but its range comes back only after the slice ends. */
static void test_published_lease_gives_its_range_back_last(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_pools_req r = req("t1", 4 * MiB, 0);
    mg_pools_wait *w = NULL;
    mg_lease *l = NULL;
    mg_lease_info li;
    mg_lease_slot *slot;
    uint8_t *addr;
    uint64_t len = 0;
    char err[MG_SEG_ERROR_MAX];
    r.remote = 1;
    CU_ASSERT_EQUAL_FATAL(mg_pools_acquire(ps, pool, &r, 1000, on_done, NULL, &w, &l, err), 0);
    mg_lease_get_info(pool, l, &li);
    CU_ASSERT_EQUAL(li.remote_accessible, 1);
    CU_ASSERT_EQUAL(mg_lease_table_describe(table, li.id, "t1", &len), 0);
    CU_ASSERT_EQUAL(len, 4 * MiB);
    CU_ASSERT_EQUAL(mg_lease_table_describe(table, li.id, "t9", &len), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL_FATAL(mg_lease_table_begin(table, li.id, "t1", 0, 4096, &addr, &slot), 0);
    wait_for(ps, pool, 1 * MiB, 1, 0);
    mg_pools_release(ps, pool, l);
    CU_ASSERT_EQUAL(mg_lease_table_describe(table, li.id, "t1", &len), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(n_answers, 0); /* the slice still writes into the range */
    mg_lease_table_end(table, slot);
    mg_pools_expire(ps, 1001); /* the timer collects what the data plane finished */
    mg_cq_settle(cq);
    CU_ASSERT_EQUAL_FATAL(n_answers, 1);
    CU_ASSERT_EQUAL(answers[0].rc, 0);
    close_set(ps);
}

/* mg_pools_use holds a lease's range past its release until mg_pools_unuse. */
static void test_use_holds_the_range(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_lease *l = take(ps, pool, "t1", 4 * MiB);
    mg_lease_info li;
    mg_segment *seg;
    uint64_t off, len;
    void *token;
    mg_lease_get_info(pool, l, &li);
    CU_ASSERT_EQUAL(mg_pools_use(ps, "t9", li.id, "test", &seg, &off, &len, &token),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL_FATAL(mg_pools_use(ps, "t1", li.id, "test", &seg, &off, &len, &token), 0);
    CU_ASSERT_EQUAL(len, 4 * MiB);
    wait_for(ps, pool, 1 * MiB, 1, 0);
    mg_pools_release(ps, pool, l);
    CU_ASSERT_EQUAL(n_answers, 0);
    mg_pools_unuse(ps, token);
    mg_registry_put(reg, seg);
    CU_ASSERT_EQUAL_FATAL(n_answers, 1);
    CU_ASSERT_EQUAL(answers[0].rc, 0);
    close_set(ps);
}

/* A batch takes every lease or none. */
static void test_acquire_all_is_all_or_nothing(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_pools_req rs[3] = {req("t1", 1 * MiB, 0), req("t1", 1 * MiB, 0), req("t1", 3 * MiB, 0)};
    mg_lease *got[3];
    mg_pools_entry_info e;
    size_t failed = 9;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_pools_acquire_all(ps, pool, rs, 3, 1000, got, &failed, err), MG_ERR_FULL);
    CU_ASSERT_EQUAL(failed, 2u);
    mg_pools_get(ps, 0, &e);
    CU_ASSERT_EQUAL(e.stats.leases, 0u);
    rs[2].size = 2 * MiB;
    CU_ASSERT_EQUAL(mg_pools_acquire_all(ps, pool, rs, 3, 1000, got, &failed, err), 0);
    mg_pools_get(ps, 0, &e);
    CU_ASSERT_EQUAL(e.stats.leases, 3u);
    close_set(ps);
}

/* An admin's list merges every pool's leases by id, a page at a time. */
static void test_list_merges_pools(void)
{
    mg_pools *ps = open_set(4 * MiB, 1 * MiB, 0, 0);
    int rc;
    mg_pool *def = mg_pools_for(ps, "t1", &rc), *own = mg_pools_for(ps, "t2", &rc);
    mg_lease_info out[8];
    mg_pool *pools[8];
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        take(ps, def, "t1", 4096);
        take(ps, own, "t2", 4096);
    }
    CU_ASSERT_EQUAL(mg_pools_list(ps, NULL, 0, out, pools, 8, &n), 0);
    CU_ASSERT_EQUAL(n, 6u);
    for (size_t i = 1; i < n; i++)
        CU_ASSERT(out[i - 1].id < out[i].id);
    for (size_t i = 0; i < n; i++)
        CU_ASSERT_PTR_EQUAL(pools[i], strcmp(out[i].tenant, "t2") == 0 ? own : def);
    CU_ASSERT_EQUAL(mg_pools_list(ps, NULL, 0, out, pools, 4, &n), 0);
    CU_ASSERT_EQUAL(n, 4u);
    CU_ASSERT_EQUAL(mg_pools_list(ps, "t2", 0, out, pools, 8, &n), 0);
    CU_ASSERT_EQUAL(n, 3u);
    close_set(ps);
}

/* A full pool with overflow gives the lease a region of its own, within the budget; a caller
 * that leaves during the registration leaves nothing behind. */
static void test_overflow(void)
{
    mg_pools *ps = open_set(1 * MiB, 0, 1, 2 * MiB);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_pools_req r = req("t1", 2 * MiB, 0);
    mg_pools_wait *w = NULL;
    mg_lease *l = NULL;
    mg_registry_stats st;
    mg_pool_stats ps_st;
    char err[MG_SEG_ERROR_MAX];
    take(ps, pool, "t1", 1 * MiB);
    CU_ASSERT_EQUAL_FATAL(mg_pools_acquire(ps, pool, &r, 1000, on_done, (void *)1, &w, &l, err),
                          MG_POOLS_REGISTERING);
    r.size = 4096; /* over the budget while the first is registering */
    CU_ASSERT_EQUAL(mg_pools_acquire(ps, pool, &r, 1000, on_done, (void *)2, &w, &l, err),
                    MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--pool-overflow-max-bytes"));
    mg_cq_settle(cq);
    CU_ASSERT_EQUAL_FATAL(n_answers, 1);
    CU_ASSERT_EQUAL(answers[0].rc, 0);
    mg_pool_get_stats(pool, &ps_st);
    CU_ASSERT_EQUAL(ps_st.overflow_leases, 1u);
    mg_pools_release(ps, pool, answers[0].l); /* its region is unregistered */
    mg_cq_settle(cq);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 1u);
    r.size = 1 * MiB; /* the caller leaves while it registers */
    CU_ASSERT_EQUAL_FATAL(mg_pools_acquire(ps, pool, &r, 1000, on_done, (void *)3, &w, &l, err),
                          MG_POOLS_REGISTERING);
    mg_pools_cancel(w);
    mg_cq_settle(cq);
    CU_ASSERT_EQUAL(n_answers, 1);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 1u);
    close_set(ps);
}

/* A tenant's segment or lease as a range to move: held while in use, refused by name for another
 * tenant or outside it, and nothing held after a refusal. */
static void test_resolve(void)
{
    mg_pools *ps = open_set(4 * MiB, 0, 0, 0);
    int rc;
    mg_pool *pool = mg_pools_for(ps, "t1", &rc);
    mg_lease *l = take(ps, pool, "t1", 8192);
    mg_lease_info li;
    mg_segment_spec spec = {.tenant = "t1", .name = "own", .source = MG_SEG_ANON, .size = 65536};
    mg_segment *seg, *got;
    mg_segment_info si;
    mg_registry_stats st;
    void *token;
    uint8_t *addr;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    mg_registry_commit(reg, seg, mg_segment_map(seg));
    mg_segment_get_info(reg, seg, &si);
    mg_lease_get_info(pool, l, &li);
    CU_ASSERT_EQUAL(
        mg_pools_resolve(ps, reg, "t1", si.id, 0, 100, 1000, "test", &got, &token, &addr), 0);
    CU_ASSERT_PTR_EQUAL(addr, (uint8_t *)mg_segment_addr(seg) + 100);
    CU_ASSERT_PTR_NULL(token);
    mg_segment_get_info(reg, seg, &si);
    CU_ASSERT_EQUAL(si.refs, 1u);
    mg_registry_put(reg, got);
    CU_ASSERT_EQUAL(
        mg_pools_resolve(ps, reg, "t1", 0, li.id, 8000, 192, "test", &got, &token, &addr), 0);
    CU_ASSERT_PTR_EQUAL(addr, mg_lease_addr(pool, l) + 8000);
    CU_ASSERT_PTR_NOT_NULL(token);
    mg_pools_unuse(ps, token);
    mg_registry_put(reg, got);
    CU_ASSERT_EQUAL(
        mg_pools_resolve(ps, reg, "t1", 0, li.id, 8000, 193, "test", &got, &token, &addr),
        MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_pools_resolve(ps, reg, "t2", si.id, 0, 0, 1, "test", &got, &token, &addr),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_pools_resolve(ps, reg, "t2", 0, li.id, 0, 1, "test", &got, &token, &addr),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(
        mg_pools_resolve(ps, reg, "t1", si.id, 0, 65000, 1000, "test", &got, &token, &addr),
        MG_ERR_RANGE);
    CU_ASSERT_PTR_NULL(got);
    mg_segment_get_info(reg, seg, &si);
    CU_ASSERT_EQUAL(si.refs, 0u); /* refusals hold nothing */
    mg_lease_get_info(pool, l, &li);
    CU_ASSERT_EQUAL(li.users, 0u);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 2u);
    close_set(ps);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_start_and_pool_choice),
        MG_TEST(test_line_is_first_come_first_served),
        MG_TEST(test_cancel_serves_the_next),
        MG_TEST(test_deadline_and_drain),
        MG_TEST(test_published_lease_gives_its_range_back_last),
        MG_TEST(test_use_holds_the_range),
        MG_TEST(test_acquire_all_is_all_or_nothing),
        MG_TEST(test_list_merges_pools),
        MG_TEST(test_overflow),
        MG_TEST(test_resolve),
    };
    return mg_test_run("pools", cases, sizeof(cases) / sizeof(cases[0]));
}
