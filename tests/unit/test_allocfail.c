/*
 * Allocation failures walked through the engine's request paths: the registry (reserve, map,
 * commit, acquire, unregister), the pool (new, acquire with tenants and request ids, adopt,
 * expiry, release), the lease table, the peer cache and the auth-file parser. The test links
 * with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc, so every allocation those modules make
 * goes through the wrappers below; run N fails the N-th allocation of the scenario and every one
 * after it. For each N the scenario must end with an error code or success — never a crash —
 * and leave nothing behind (the ASan build checks for leaks). The walk stops at the first N
 * that no allocation reaches: the scenario then ran whole.
 */
#include "mg_auth.h"
#include "mg_test.h"
#include "moongate/alloc.h"
#include "moongate/lease_table.h"
#include "moongate/peers.h"
#include "moongate/pool.h"
#include "moongate/segment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long countdown = -1; /* allocations left before they fail; -1: never */
static long reached;        /* allocations made in this run */

static int fail_now(void)
{
    reached++;
    if (countdown < 0)
        return 0;
    if (countdown == 0)
        return 1;
    countdown--;
    return 0;
}

#include "mg_allocfail.h"

static char dir[64];

static void drop_overflow(void *arg, mg_segment *seg)
{
    mg_registry_put(arg, seg);
}

/* One pass through the paths; every step may fail, none may crash or leak. */
static void scenario(void)
{
    mg_registry_config rc = {
        .shm_dir = dir, .file_mode = 0600, .max_segments = 16, .max_tenant_segments = 16};
    mg_segment_spec spec = {.tenant = "t1",
                            .name = "pool",
                            .source = MG_SEG_ANON,
                            .size = 1 << 20,
                            .location = "cpu:0",
                            .memlock = MG_MEMLOCK_OFF};
    mg_registry *reg = NULL;
    mg_segment *seg = NULL, *held = NULL, *gone = NULL;
    mg_segment_info info;
    mg_pool *pool = NULL;
    mg_lease *l1 = NULL, *l2 = NULL;
    mg_lease_table *lt = NULL;
    mg_peer_cache *pc = NULL;
    mg_auth *auth;
    char err[MG_SEG_ERROR_MAX];

    static const char file[] = "token sha256:4f66a4283f8bc9768c3cb97fd06d267b79315aee941c9c1727b9"
                               "354509242ffe t1\ncert a t2 admin\nuid 7 t3\n";
    auth = mg_auth_parse(file, strlen(file), err, sizeof(err));
    mg_auth_free(auth);

    if (mg_registry_new(&reg, &rc) != 0)
        return;
    if (mg_registry_reserve(reg, &spec, &seg, err) == 0) {
        int mapped = mg_segment_map(seg);
        mg_registry_commit(reg, seg, mapped); /* a failed registration is freed here */
        if (mapped != 0)
            seg = NULL;
    }
    if (seg) {
        mg_segment_get_info(reg, seg, &info);
        if (mg_registry_acquire(reg, "t1", info.id, "the pool", &held) == 0) {
            mg_pool_config pcfg = {.name = "default",
                                   .lease_bytes = 512 << 10,
                                   .reserve_bytes = 0,
                                   .max_leases = 8,
                                   .max_tenant_leases = 4,
                                   .max_ttl_ms = 10000,
                                   .drop_overflow = drop_overflow,
                                   .drop_arg = reg};
            if (mg_pool_new(&pool, reg, held, &pcfg) != 0)
                mg_registry_put(reg, held);
        }
    }
    if (pool) {
        mg_lease_info li;
        mg_pool_acquire(pool, "t1", 4096, 0, 1000, 0, "r1", &l1, err);
        mg_pool_acquire(pool, "t2", 65536, 4096, 1000, 0, NULL, &l2, err);
        mg_pool_acquire(pool, "t1", 4096, 0, 1000, 0, "r1", &l1, err); /* a retry */
        if (mg_lease_table_new(&lt) == 0 && l1 && !mg_lease_released(l1)) {
            mg_lease_get_info(pool, l1, &li);
            if (mg_lease_table_put(lt, li.id, "t1", mg_lease_addr(pool, l1), li.requested, l1) ==
                0) {
                uint8_t *addr;
                mg_lease_slot *slot;
                if (mg_lease_table_begin(lt, li.id, "t1", 0, 16, &addr, &slot) == 0)
                    mg_lease_table_end(lt, slot);
                mg_lease_table_withdraw(lt, li.id);
            }
        }
        mg_lease_table_del(lt);
        mg_pool_expire(pool, 5000); /* both expire */
        mg_pool_del(pool);
    }
    if (mg_peer_cache_new(&pc, 4, 4) == 0) {
        mg_remote_desc d = {.id = 9, .size = 4096, .remote_accessible = 1, .transports = 1};
        mg_remote_desc got;
        if (mg_peer_cache_epoch(pc, "10.0.0.1:7443", 77, 1) >= 0)
            mg_peer_cache_put(pc, "10.0.0.1:7443", 77, &d);
        uint64_t epoch;
        mg_peer_cache_get(pc, "10.0.0.1:7443", 9, 0, &got, &epoch);
        mg_peer_cache_del(pc);
    }
    if (seg && mg_registry_unregister(reg, "t1", info.id, &gone, err) == 0) {
        mg_segment_unmap(gone);
        mg_registry_release(reg, gone);
    }
    mg_registry_del(reg);
}

static void test_walk(void)
{
    long n, total;
    snprintf(dir, sizeof(dir), "/tmp/mg-allocfail-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    countdown = -1;
    reached = 0;
    scenario();
    total = reached;
    CU_ASSERT(total > 20);
    for (n = 0; n <= total + 1; n++) {
        countdown = n;
        reached = 0;
        scenario();
        countdown = -1;
        if (reached <= n)
            break; /* no allocation failed: the whole path ran */
    }
    printf("\n  %ld allocations in the scenario, each made to fail in turn\n", total);
    CU_ASSERT(n >= total);
    rmdir(dir);
}

int main(void)
{
    static const mg_test_case cases[] = {MG_TEST(test_walk)};
    return mg_test_run("allocation failures", cases, sizeof(cases) / sizeof(cases[0]));
}
