/*
 * Unit tests for the offset allocator (moongate/alloc.h): size classes, a reference model under
 * randomized take/give sequences, fragmentation and merging, uniform sizes filling the region,
 * alignment, limits and bad arguments.
 */
#include "../common/alloc_model.h"
#include "mg_test.h"

#define KiB (1024ULL)
#define MiB (1024ULL * 1024ULL)

static void test_size_classes(void)
{
    mg_alloc *a;
    CU_ASSERT_EQUAL_FATAL(mg_alloc_new(&a, 256 * MiB, 4 * KiB, 1024), 0);
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 64 * KiB), 64 * KiB);   /* exact */
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 100 * KiB), 104 * KiB); /* 8 steps per octave */
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 1000000), 1 * MiB);
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 3 * MiB + 1), 3 * MiB + 256 * KiB);
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 1), 4 * KiB);            /* one granule */
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 7 * 4 * KiB), 28 * KiB); /* small sizes exact */
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 256 * MiB), 256 * MiB);
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 256 * MiB + 1), 0); /* beyond the region */
    CU_ASSERT_EQUAL(mg_alloc_reserved_for(a, 0), 0);
    /* The round-up bound over every size up to 64 MiB in 4 KiB steps. */
    for (uint64_t s = 4 * KiB; s <= 64 * MiB; s += 4 * KiB) {
        uint64_t r = mg_alloc_reserved_for(a, s);
        if (r < s || r * 8 > s * 9) {
            CU_FAIL("reserved length out of bounds");
            break;
        }
    }
    mg_alloc_del(a);
}

/* Pseudo-random numbers, reproducible per seed. */
static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void random_run(uint64_t seed, uint64_t capacity, uint64_t granule, uint32_t max, int steps,
                       uint64_t max_size, int aligned)
{
    alloc_model m;
    uint64_t s = seed;
    int taken = 0, refused = 0;
    CU_ASSERT_EQUAL_FATAL(model_open(&m, capacity, granule, max), 0);
    for (int i = 0; i < steps; i++) {
        if (m.live > 0 && rng(&s) % 100 < 45) {
            model_give(&m, (uint32_t)(rng(&s) % m.live));
        } else {
            uint64_t size = 1 + rng(&s) % max_size;
            uint64_t align = aligned && rng(&s) % 4 == 0 ? granule << (rng(&s) % 6) : 0;
            if (model_take(&m, size, align) == 0)
                taken++;
            else
                refused++;
        }
    }
    CU_ASSERT(taken > 0);
    model_close(&m);
}

static void test_random_against_the_model(void)
{
    /* Small region, many collisions; then a pool-like one with lease-like sizes. */
    for (uint64_t seed = 1; seed <= 20; seed++)
        random_run(seed * 0x9e3779b97f4a7c15ULL, 1 * MiB, 4 * KiB, 64, 3000, 96 * KiB, 1);
    for (uint64_t seed = 1; seed <= 5; seed++)
        random_run(seed * 0xbf58476d1ce4e5b9ULL, 256 * MiB, 4 * KiB, 4096, 20000, 4 * MiB, 1);
    /* Granule 64 bytes, odd sizes. */
    random_run(42, 64 * KiB, 64, 256, 20000, 3000, 0);
}

static void test_uniform_sizes_fill_the_region(void)
{
    mg_alloc *a;
    mg_alloc_stats st;
    uint64_t off, res, n = 0;
    uint32_t h;
    CU_ASSERT_EQUAL_FATAL(mg_alloc_new(&a, 256 * MiB, 4 * KiB, 1 << 16), 0);
    while (mg_alloc_take(a, 100 * KiB, 0, &off, &res, &h) == 0)
        n++;
    mg_alloc_get_stats(a, &st);
    CU_ASSERT_EQUAL(n, 256 * MiB / (104 * KiB)); /* every 104 KiB slot used */
    CU_ASSERT(st.free < 104 * KiB);
    CU_ASSERT(st.largest_free < 104 * KiB);
    mg_alloc_del(a);
}

static void test_merging_and_largest_free(void)
{
    mg_alloc *a;
    mg_alloc_stats st;
    uint64_t off[4], res;
    uint32_t h[4];
    CU_ASSERT_EQUAL_FATAL(mg_alloc_new(&a, 4 * MiB, 4 * KiB, 16), 0);
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL_FATAL(mg_alloc_take(a, 1 * MiB, 0, &off[i], &res, &h[i]), 0);
    mg_alloc_get_stats(a, &st);
    CU_ASSERT_EQUAL(st.free, 0);
    CU_ASSERT_EQUAL(st.largest_free, 0);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 0, &off[0], &res, &h[0]), MG_ERR_FULL);
    /* Two separate holes: 2 MiB free, yet no range of 2 MiB. */
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[1]), 0);
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[3]), 0);
    mg_alloc_get_stats(a, &st);
    CU_ASSERT_EQUAL(st.free, 2 * MiB);
    CU_ASSERT_EQUAL(st.largest_free, 1 * MiB);
    CU_ASSERT_EQUAL(st.free_ranges, 2);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 1 * MiB + 1, 0, &off[1], &res, &h[1]), MG_ERR_FULL);
    /* Giving back the range between them merges all three. */
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[2]), 0);
    mg_alloc_get_stats(a, &st);
    CU_ASSERT_EQUAL(st.free_ranges, 1);
    CU_ASSERT_EQUAL(st.largest_free, 3 * MiB);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 3 * MiB, 0, &off[1], &res, &h[1]), 0);
    CU_ASSERT_EQUAL(off[1], 1 * MiB);
    mg_alloc_del(a);
}

static void test_alignment(void)
{
    mg_alloc *a;
    uint64_t off, res;
    uint32_t h, small;
    CU_ASSERT_EQUAL_FATAL(mg_alloc_new(&a, 64 * MiB, 4 * KiB, 64), 0);
    CU_ASSERT_EQUAL_FATAL(mg_alloc_take(a, 12 * KiB, 0, &off, &res, &small), 0);
    CU_ASSERT_EQUAL(off, 0);
    CU_ASSERT_EQUAL_FATAL(mg_alloc_take(a, 3 * MiB, 2 * MiB, &off, &res, &h), 0);
    CU_ASSERT_EQUAL(off % (2 * MiB), 0);
    CU_ASSERT_EQUAL(res, 3 * MiB);
    /* The slack before the aligned start stays usable. */
    CU_ASSERT_EQUAL_FATAL(mg_alloc_take(a, 8 * KiB, 0, &off, &res, &small), 0);
    CU_ASSERT(off < 2 * MiB);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 3 * KiB, &off, &res, &h), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 128 * MiB, &off, &res, &h), MG_ERR_INVALID);
    mg_alloc_del(a);
}

static void test_limits_and_bad_arguments(void)
{
    mg_alloc *a;
    uint64_t off, res;
    uint32_t h[3];
    CU_ASSERT_EQUAL(mg_alloc_new(&a, 1 * MiB, 3000, 8), MG_ERR_INVALID); /* granule */
    CU_ASSERT_EQUAL(mg_alloc_new(&a, 1 * MiB + 1, 4096, 8), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_new(&a, 0, 4096, 8), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_new(&a, 1 * MiB, 4096, 0), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_new(&a, (1ULL << 31) * 8192, 4096, 8), MG_ERR_INVALID);
    CU_ASSERT_EQUAL_FATAL(mg_alloc_new(&a, 1 * MiB, 4 * KiB, 2), 0);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 0, 0, &off, &res, &h[0]), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 1 * MiB + 1, 0, &off, &res, &h[0]), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 0, &off, &res, &h[0]), 0);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 0, &off, &res, &h[1]), 0);
    CU_ASSERT_EQUAL(mg_alloc_take(a, 4 * KiB, 0, &off, &res, &h[2]), MG_ERR_FULL); /* max 2 */
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[0]), 0);
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[0]), MG_ERR_NOT_FOUND); /* twice */
    CU_ASSERT_EQUAL(mg_alloc_give(a, 1u << 30), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_alloc_give(a, h[1]), 0);
    mg_alloc_del(a);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_size_classes),
        MG_TEST(test_random_against_the_model),
        MG_TEST(test_uniform_sizes_fill_the_region),
        MG_TEST(test_merging_and_largest_free),
        MG_TEST(test_alignment),
        MG_TEST(test_limits_and_bad_arguments),
    };
    return mg_test_run("alloc", cases, sizeof(cases) / sizeof(cases[0]));
}
