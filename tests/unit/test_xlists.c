/*
 * Unit tests for prepared lists (moongate/xlists.h): ids minted and found only by their owner
 * and tenant, the bound on ranges in all lists, ranges refused (empty, past the end of the
 * address space), and the checks of a group of pairs by index (sides, counts, indices past
 * the list, lengths that differ).
 */
#include "mg_test.h"
#include "moongate/mg_error.h"
#include "moongate/xlists.h"

#include <stdint.h>
#include <string.h>

static void test_lists_owners_and_bounds(void)
{
    const uint64_t addrs[3] = {0x1000, 0x2000, UINT64_MAX - 10}, lens[3] = {4096, 4096, 11};
    mg_xlists *s;
    mg_xlist *a, *b;
    size_t bad;
    CU_ASSERT_EQUAL_FATAL(mg_xlists_new(&s, 5), 0);
    CU_ASSERT_EQUAL(mg_xlists_add(s, "t", 7, "", "", addrs, lens, 3, &a, &bad), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(bad, 2u); /* runs past the end of the address space */
    CU_ASSERT_EQUAL(mg_xlists_add(s, "t", 7, "", "", addrs, lens, 0, &a, &bad), MG_ERR_INVALID);
    CU_ASSERT_EQUAL_FATAL(mg_xlists_add(s, "t", 7, "", "", addrs, lens, 2, &a, &bad), 0);
    CU_ASSERT_EQUAL_FATAL(mg_xlists_add(s, "t", 7, "p:1", "agent", addrs, lens, 2, &b, &bad), 0);
    CU_ASSERT_EQUAL(mg_xlists_add(s, "t", 7, "", "", addrs, lens, 2, &a, &bad), MG_ERR_FULL);
    CU_ASSERT_EQUAL(mg_xlists_ranges(s), 4u);
    CU_ASSERT_PTR_EQUAL(mg_xlists_find(s, a->node.id, "t", 7), a);
    CU_ASSERT_PTR_NULL(mg_xlists_find(s, a->node.id, "t", 8));     /* another connection's */
    CU_ASSERT_PTR_NULL(mg_xlists_find(s, a->node.id, "u", 7));     /* another tenant's */
    CU_ASSERT_PTR_NULL(mg_xlists_find(s, a->node.id ^ 1, "t", 7)); /* no such id */
    CU_ASSERT_STRING_EQUAL(b->agent, "agent");
    mg_xlists_drop(s, a);
    CU_ASSERT_EQUAL(mg_xlists_count(s), 1u);
    CU_ASSERT_EQUAL(mg_xlists_ranges(s), 2u);
    mg_xlists_del(s); /* frees b */
}

static void test_pairs_checked(void)
{
    const uint64_t la[3] = {0x1000, 0x2000, 0x3000}, ll[3] = {4096, 4096, 2048};
    const uint64_t ra[2] = {0x9000, 0xa000}, rl[2] = {4096, 4096};
    const uint32_t i0[2] = {0, 1}, i1[2] = {1, 0}, past[2] = {0, 3}, short_[2] = {2, 0};
    mg_xlists *s;
    mg_xlist *l, *r;
    size_t bad;
    char why[256];
    CU_ASSERT_EQUAL_FATAL(mg_xlists_new(&s, 100), 0);
    CU_ASSERT_EQUAL_FATAL(mg_xlists_add(s, "t", 1, "", "", la, ll, 3, &l, &bad), 0);
    CU_ASSERT_EQUAL_FATAL(mg_xlists_add(s, "t", 1, "p:1", "a", ra, rl, 2, &r, &bad), 0);
    CU_ASSERT_PTR_NULL(mg_xlists_check_pairs(l, r, i0, 2, i1, 2, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(r, r, i0, 2, i1, 2, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(l, l, i0, 2, i1, 2, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(l, r, i0, 2, i1, 1, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(l, r, i0, 0, i1, 0, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(l, r, past, 2, i1, 2, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "pair 1: local index 3 is past the list's 3 ranges"));
    CU_ASSERT_PTR_NOT_NULL(mg_xlists_check_pairs(l, r, short_, 2, i1, 2, why, sizeof(why)));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "pair 0: local range 2 is 2048 bytes, remote range 1 4096"));
    mg_xlists_del(s);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_lists_owners_and_bounds),
        MG_TEST(test_pairs_checked),
    };
    return mg_test_run("xlists", cases, sizeof(cases) / sizeof(cases[0]));
}
