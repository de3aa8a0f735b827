/*
 * Unit tests for the peer descriptor cache (moongate/peers.h): lookups per peer and kind,
 * epoch invalidation on a peer restart, answers from an old epoch dropped, bounds and eviction
 * of the oldest, forgetting one target.
 */
#include "mg_test.h"
#include "moongate/peers.h"

static mg_remote_desc desc(uint64_t id, int lease, uint64_t size)
{
    mg_remote_desc d = {id, lease, size, 1, 1u, 0, 0, {0}, 0};
    return d;
}

static void test_lookups_and_epochs(void)
{
    mg_peer_cache *c;
    mg_remote_desc d, got;
    mg_peer_info info[4];
    uint64_t epoch = 0;
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&c, 4, 16), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "10.0.0.2:7445", 111, 1000), 1); /* news */
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "10.0.0.2:7445", 111, 2000), 0); /* known */
    d = desc(42, 0, 1 << 30);
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "10.0.0.2:7445", 111, &d), 0);
    d = desc(42, 1, 4096); /* lease 42 is another target than segment 42 */
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "10.0.0.2:7445", 111, &d), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "10.0.0.2:7445", 42, 0, &got, &epoch), 0);
    CU_ASSERT_EQUAL(got.size, 1u << 30);
    CU_ASSERT_EQUAL(epoch, 111);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "10.0.0.2:7445", 42, 1, &got, NULL), 0);
    CU_ASSERT_EQUAL(got.size, 4096);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "10.0.0.3:7445", 42, 0, &got, NULL), MG_ERR_NOT_FOUND);
    /* The peer restarted: everything of its previous life is gone ... */
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "10.0.0.2:7445", 222, 3000), 1);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "10.0.0.2:7445", 42, 0, &got, NULL), MG_ERR_NOT_FOUND);
    /* ... and a late answer from that life is dropped. */
    d = desc(42, 0, 1 << 30);
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "10.0.0.2:7445", 111, &d), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "10.0.0.2:7445", 222, &d), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_list(c, info, 4), 1);
    CU_ASSERT_STRING_EQUAL(info[0].name, "10.0.0.2:7445");
    CU_ASSERT_EQUAL(info[0].epoch, 222);
    CU_ASSERT_EQUAL(info[0].epoch_changes, 1);
    CU_ASSERT_EQUAL(info[0].descs, 1);
    CU_ASSERT_EQUAL(info[0].seen_ms, 3000);
    mg_peer_cache_forget(c, "10.0.0.2:7445", 42, 0);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "10.0.0.2:7445", 42, 0, &got, NULL), MG_ERR_NOT_FOUND);
    mg_peer_cache_forget(c, "10.0.0.2:7445", 42, 0); /* twice: nothing happens */
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "nobody:1", 1, &d), MG_ERR_NOT_FOUND);
    mg_peer_cache_del(c);
}

static void test_bounds_and_eviction(void)
{
    mg_peer_cache *c;
    mg_remote_desc d, got;
    mg_peer_info info[4];
    CU_ASSERT_EQUAL(mg_peer_cache_new(&c, 0, 4), MG_ERR_INVALID);
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&c, 2, 3), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "a:1", 0, 0), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "", 5, 0), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "a:1", 5, 0), 1);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "b:1", 5, 0), 1);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "c:1", 5, 0), MG_ERR_FULL);
    for (uint64_t id = 1; id <= 5; id++) { /* 3 fit: 1 and 2 are evicted, oldest first */
        d = desc(id, 0, id * 100);
        CU_ASSERT_EQUAL(mg_peer_cache_put(c, "a:1", 5, &d), 0);
    }
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "a:1", 1, 0, &got, NULL), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "a:1", 2, 0, &got, NULL), MG_ERR_NOT_FOUND);
    for (uint64_t id = 3; id <= 5; id++) {
        CU_ASSERT_EQUAL(mg_peer_cache_get(c, "a:1", id, 0, &got, NULL), 0);
        CU_ASSERT_EQUAL(got.size, id * 100);
    }
    d = desc(4, 0, 999); /* an update keeps its place */
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "a:1", 5, &d), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "a:1", 4, 0, &got, NULL), 0);
    CU_ASSERT_EQUAL(got.size, 999);
    CU_ASSERT_EQUAL(mg_peer_cache_list(c, info, 4), 2);
    CU_ASSERT_EQUAL(info[0].descs, 3);
    CU_ASSERT_EQUAL(info[1].descs, 0);
    /* Many ids through a small table: the hash chains stay consistent. */
    for (uint64_t id = 100; id < 2100; id++) {
        d = desc(id, (int)(id & 1), id);
        mg_peer_cache_put(c, "b:1", 5, &d);
        if (id % 3 == 0)
            mg_peer_cache_forget(c, "b:1", id - 1, (int)((id - 1) & 1));
    }
    CU_ASSERT_EQUAL(mg_peer_cache_get(c, "b:1", 2099, 1, &got, NULL), 0);
    mg_peer_cache_list(c, info, 4);
    CU_ASSERT(info[1].descs <= 3);
    mg_peer_cache_del(c);
}

/* What Submit asks of the cache before a batch starts: a target it knows is checked for remote
 * accessibility and bounds, with the reason named; one it does not know is to be asked for. */
static void test_check(void)
{
    mg_peer_cache *c;
    mg_remote_desc d = {.id = 7, .size = 4096, .remote_accessible = 1};
    uint64_t size = 0;
    char why[256];
    CU_ASSERT_EQUAL_FATAL(mg_peer_cache_new(&c, 4, 16), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_epoch(c, "t@p:1", 9, 1), 1);
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", 7, 0, 0, 1, &size, why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "t@p:1", 9, &d), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", 7, 0, 96, 4000, &size, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(size, 4096u);
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", 7, 0, 97, 4000, &size, why, sizeof(why)),
                    MG_ERR_RANGE);
    CU_ASSERT_STRING_EQUAL(why,
                           "remote offset + length is outside segment 7 on peer p:1 (4096 bytes)");
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", 7, 1, 0, 1, &size, why, sizeof(why)),
                    MG_ERR_NOT_FOUND); /* a lease 7 is another target */
    d.id = 8;
    d.is_lease = 1;
    d.remote_accessible = 0;
    CU_ASSERT_EQUAL(mg_peer_cache_put(c, "t@p:1", 9, &d), 0);
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", 8, 1, 0, 1, &size, why, sizeof(why)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_STRING_EQUAL(why, "lease 8 on peer p:1 is not remote-accessible");
    CU_ASSERT_EQUAL(mg_peer_cache_check(c, "t@p:1", "p:1", UINT64_MAX, 0, UINT64_MAX, 2, &size, why,
                                        sizeof(why)),
                    MG_ERR_NOT_FOUND);
    mg_peer_cache_del(c);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_lookups_and_epochs),
        MG_TEST(test_bounds_and_eviction),
        MG_TEST(test_check),
    };
    return mg_test_run("peers", cases, sizeof(cases) / sizeof(cases[0]));
}
