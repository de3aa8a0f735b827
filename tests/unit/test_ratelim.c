/* Unit tests: the rate limiter (common/mg_ratelim) driven through chosen instants, and the
 * intrusive list (common/mg_list.h). */
#include "mg_list.h"
#include "mg_ratelim.h"
#include "mg_test.h"

#define SEC 1000000000ULL

/* A full bucket lets `burst` through at once, then one event per interval. */
static void test_burst_then_rate(void)
{
    mg_ratelim rl;
    uint64_t t = 5 * SEC;
    mg_ratelim_init(&rl, 10, 10, t);
    for (int i = 0; i < 10; i++)
        CU_ASSERT_EQUAL(mg_ratelim_take(&rl, t), 0);
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, t), -1);
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, t + SEC / 10 - 1), -1); /* not quite 100 ms */
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, t + SEC / 10), 0);
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, t + SEC / 10), -1);
}

/* Refused events cost nothing, and a long pause refills no more than the burst. */
static void test_refusals_are_free_and_idle_caps_at_burst(void)
{
    mg_ratelim rl;
    int ok = 0;
    mg_ratelim_init(&rl, 100, 5, 0);
    for (int i = 0; i < 1000; i++) /* a flood in the same instant */
        ok += mg_ratelim_take(&rl, 0) == 0;
    CU_ASSERT_EQUAL(ok, 5);
    ok = 0;
    for (int i = 0; i < 1000; i++) /* an hour later: the burst, not an hour's worth */
        ok += mg_ratelim_take(&rl, 3600 * SEC) == 0;
    CU_ASSERT_EQUAL(ok, 5);
}

/* Over a long steady run, what passes is rate * time + burst. */
static void test_long_run_average(void)
{
    mg_ratelim rl;
    uint64_t ok = 0;
    mg_ratelim_init(&rl, 1000, 100, 0);
    for (uint64_t t = 0; t < 10 * SEC; t += SEC / 10000) /* 10 000 attempts a second */
        ok += mg_ratelim_take(&rl, t) == 0;
    CU_ASSERT(ok >= 10000 + 99 && ok <= 10000 + 101);
}

static void test_limits_of_the_arguments(void)
{
    mg_ratelim rl;
    mg_ratelim_init(&rl, 0, 0, 0); /* at least one a second, bursts of one */
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, 0), 0);
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, 0), -1);
    CU_ASSERT_EQUAL(mg_ratelim_take(&rl, SEC), 0);
    mg_ratelim_init(&rl, 2000000000ULL, UINT64_MAX, 0); /* clamped; no overflow */
    for (int i = 0; i < 1000; i++)
        CU_ASSERT_EQUAL(mg_ratelim_take(&rl, 0), 0);
}

typedef struct item {
    int v;
    mg_list_node link;
} item;

static void test_list(void)
{
    mg_list l;
    item it[4];
    int seen[8], n = 0;
    mg_list_init(&l);
    CU_ASSERT(mg_list_empty(&l));
    CU_ASSERT_PTR_NULL(mg_list_first(&l));
    for (int i = 0; i < 4; i++) {
        it[i].v = i;
        it[i].link.prev = it[i].link.next = NULL;
        CU_ASSERT(!mg_list_linked(&it[i].link));
    }
    mg_list_push_back(&l, &it[1].link);
    mg_list_push_back(&l, &it[2].link);
    mg_list_push_front(&l, &it[0].link);
    mg_list_push_back(&l, &it[3].link);
    mg_list_foreach (&l, node)
        seen[n++] = mg_container_of(node, item, link)->v;
    CU_ASSERT_EQUAL(n, 4);
    for (int i = 0; i < n; i++)
        CU_ASSERT_EQUAL(seen[i], i);
    mg_list_foreach_safe (&l, node, next) {
        item *x = mg_container_of(node, item, link);
        if (x->v % 2)
            mg_list_remove(node); /* removing the current node is allowed */
    }
    CU_ASSERT(!mg_list_linked(&it[1].link) && mg_list_linked(&it[2].link));
    n = 0;
    mg_list_foreach (&l, node)
        seen[n++] = mg_container_of(node, item, link)->v;
    CU_ASSERT(n == 2 && seen[0] == 0 && seen[1] == 2);
    mg_list_remove(&it[0].link);
    mg_list_remove(&it[2].link);
    CU_ASSERT(mg_list_empty(&l));
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_burst_then_rate),
        MG_TEST(test_refusals_are_free_and_idle_caps_at_burst),
        MG_TEST(test_long_run_average),
        MG_TEST(test_limits_of_the_arguments),
        MG_TEST(test_list),
    };
    return mg_test_run("ratelim and list", cases, sizeof(cases) / sizeof(cases[0]));
}
