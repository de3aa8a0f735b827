/*
 * Unit tests for the pool's lease bookkeeping (moongate/pool.h) over a real registered segment:
 * acquire and release, request-id retries, tenants, expiry of leases in use, revocation at
 * shutdown, listing, and the reserve that leases never reach.
 */
#include "mg_test.h"
#include "moongate/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024ULL * 1024ULL)

static char dir[64];
static mg_registry *reg;
static uint64_t tenant_quota; /* max_tenant_leases of the next open_pool */

/* A pool of `lease` bytes plus `reserve` on a fresh registry. */
static mg_pool *open_pool(uint64_t lease, uint64_t reserve, uint32_t max_leases)
{
    mg_registry_config rc = {.shm_dir = dir, .file_mode = 0600, .max_segments = 4};
    mg_segment_spec spec = {
        .tenant = "sys", .name = "pool", .source = MG_SEG_ANON, .size = lease + reserve};
    mg_pool_config pc = {.name = "default",
                         .lease_bytes = lease,
                         .reserve_bytes = reserve,
                         .max_leases = max_leases,
                         .max_tenant_leases = tenant_quota,
                         .max_ttl_ms = 60000};
    mg_segment *seg, *held;
    mg_segment_info info;
    mg_pool *p = NULL;
    char err[MG_SEG_ERROR_MAX];
    snprintf(dir, sizeof(dir), "/tmp/mgpool-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &rc), 0);
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    mg_registry_commit(reg, seg, mg_segment_map(seg));
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL_FATAL(mg_registry_acquire(reg, "sys", info.id, "the pool", &held), 0);
    CU_ASSERT_EQUAL_FATAL(mg_pool_new(&p, reg, held, &pc), 0);
    return p;
}

static void close_pool(mg_pool *p)
{
    mg_registry_stats st;
    mg_pool_del(p);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 1);
    mg_registry_del(reg);
    rmdir(dir);
}

static void test_acquire_release_and_reserve(void)
{
    mg_pool *p = open_pool(4 * MiB, 1 * MiB, 16);
    mg_pool_stats st;
    mg_lease *a, *b, *c;
    mg_lease_info ia;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 3 * MiB, 0, 1000, 0, NULL, &a, err), 0);
    mg_lease_get_info(p, a, &ia);
    CU_ASSERT_EQUAL(ia.requested, 3 * MiB);
    CU_ASSERT(ia.offset + ia.reserved <= 4 * MiB); /* never in the reserve */
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 2 * MiB, 0, 1000, 0, NULL, &b, err), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot serve 2097152 bytes: 1048576 free"));
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 1 * MiB, 0, 1000, 0, NULL, &b, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 4096, 0, 1000, 0, NULL, &c, err), MG_ERR_FULL);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 5 * MiB, 0, 1000, 0, NULL, &c, err), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 0, 0, 1000, 0, NULL, &c, err), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 4096, 0, 0, 0, NULL, &c, err), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 4096, 0, 60001, 0, NULL, &c, err), MG_ERR_INVALID);
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.in_use, 4 * MiB);
    CU_ASSERT_EQUAL(st.reserve, 1 * MiB);
    CU_ASSERT_EQUAL(st.leases, 2);
    /* Another tenant cannot see or release them. */
    CU_ASSERT_EQUAL(mg_pool_find(p, "other", ia.id, &c), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_pool_find(p, "t", ia.id, &c), 0);
    mg_pool_release(p, a);
    CU_ASSERT_EQUAL(mg_pool_find(p, "t", ia.id, &c), MG_ERR_NOT_FOUND);
    mg_pool_release(p, b);
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.free, 4 * MiB);
    CU_ASSERT_EQUAL(st.acquired_total, 2);
    CU_ASSERT_EQUAL(st.released_total, 2);
    close_pool(p);
}

static void test_request_id_retries(void)
{
    mg_pool *p = open_pool(4 * MiB, 0, 16);
    mg_lease *a, *b;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", MiB, 0, 1000, 0, "r1", &a, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", MiB, 0, 1000, 0, "r1", &b, err), MG_LEASE_RETRY);
    CU_ASSERT_PTR_EQUAL(a, b);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 2 * MiB, 0, 1000, 0, "r1", &b, err), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "was used for a lease of 1048576 bytes"));
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "u", MiB, 0, 1000, 0, "r1", &b, err), 0); /* per tenant */
    CU_ASSERT_PTR_NOT_EQUAL(a, b);
    mg_pool_release(p, a);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", MiB, 0, 1000, 0, "r1", &a, err), 0); /* new */
    close_pool(p);
}

static void test_expiry_of_a_lease_in_use(void)
{
    mg_pool *p = open_pool(4 * MiB, 0, 16);
    mg_pool_stats st;
    mg_lease *a, *b;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", MiB, 0, 100, 1000, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", MiB, 0, 500, 1000, NULL, &b, err), 0);
    mg_lease_use(a);
    CU_ASSERT_EQUAL(mg_pool_expire(p, 1099), 0);
    CU_ASSERT_EQUAL(mg_pool_expire(p, 1100), 1); /* a: expired, but in use */
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.leases, 1);
    CU_ASSERT_EQUAL(st.expired_total, 1);
    CU_ASSERT_EQUAL(st.in_use, 2 * MiB); /* a's range stays out until its use ends */
    CU_ASSERT_EQUAL(mg_pool_renew(p, b, 10000, 1100), 0);
    CU_ASSERT_EQUAL(mg_pool_expire(p, 5000), 0); /* renewed */
    mg_lease_unuse(p, a);
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.in_use, 1 * MiB);
    /* Revocation at shutdown: every live lease, in use or not. */
    mg_lease_use(b);
    CU_ASSERT_EQUAL(mg_pool_revoke_all(p), 1);
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.leases, 0);
    mg_lease_unuse(p, b);
    mg_pool_get_stats(p, &st);
    CU_ASSERT_EQUAL(st.free, 4 * MiB);
    close_pool(p);
}

static void test_list_in_id_order_and_limits(void)
{
    mg_pool *p = open_pool(4 * MiB, 0, 3);
    mg_lease *l[3], *x;
    mg_lease_info out[4];
    char err[MG_SEG_ERROR_MAX];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL_FATAL(
            mg_pool_acquire(p, i == 1 ? "u" : "t", 4096, 0, 1000, 0, NULL, &l[i], err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t", 4096, 0, 1000, 0, NULL, &x, err), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "holds 3 leases, its limit"));
    CU_ASSERT_EQUAL(mg_pool_list(p, "t", 0, out, 4), 2);
    CU_ASSERT(out[0].id < out[1].id);
    CU_ASSERT_EQUAL(mg_pool_list(p, NULL, 0, out, 4), 3);
    CU_ASSERT_EQUAL(mg_pool_list(p, NULL, out[0].id, out, 4), 2);
    CU_ASSERT_EQUAL(mg_pool_list(p, NULL, 0, out, 1), 1);
    close_pool(p);
}

static void test_tenant_lease_quota(void)
{
    mg_pool *p;
    mg_lease *a, *b, *c;
    char err[MG_SEG_ERROR_MAX];
    tenant_quota = 2;
    p = open_pool(4 * MiB, 0, 16);
    tenant_quota = 0;
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 0, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 0, "r", &b, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 0, NULL, &c, err), MG_ERR_QUOTA);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tenant \"t1\" holds 2 leases, its quota"));
    /* a retry of a lease it holds is no new lease */
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 0, "r", &c, err), MG_LEASE_RETRY);
    CU_ASSERT_PTR_EQUAL(c, b);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t2", 4096, 0, 1000, 0, NULL, &c, err), 0);
    mg_pool_release(p, a);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 0, NULL, &a, err), 0);
    /* expiry gives room too */
    CU_ASSERT(mg_pool_expire(p, 5000) >= 3);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 5000, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(mg_pool_acquire(p, "t1", 4096, 0, 1000, 5000, NULL, &b, err), 0);
    close_pool(p);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_acquire_release_and_reserve), MG_TEST(test_request_id_retries),
        MG_TEST(test_expiry_of_a_lease_in_use),    MG_TEST(test_list_in_id_order_and_limits),
        MG_TEST(test_tenant_lease_quota),
    };
    return mg_test_run("pool", cases, sizeof(cases) / sizeof(cases[0]));
}
