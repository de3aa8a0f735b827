/* Shared CUnit runner for the unit suites: verbose basic run, exit status = failures. */
#ifndef MG_TEST_H
#define MG_TEST_H

#include <CUnit/Basic.h>

typedef struct {
    const char *name;
    CU_TestFunc fn;
} mg_test_case;

static inline int mg_test_run(const char *suite, const mg_test_case *cases, size_t n)
{
    CU_pSuite s;
    unsigned failed;
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    s = CU_add_suite(suite, NULL, NULL);
    for (size_t i = 0; s && i < n; i++)
        CU_add_test(s, cases[i].name, cases[i].fn);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

#define MG_TEST(fn) \
    {               \
#fn, fn     \
    }

#endif
