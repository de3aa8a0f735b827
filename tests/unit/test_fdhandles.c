/*
 * Unit tests for the table of passed descriptors (moongate/fdhandles.h): a handle goes once to
 * the process, user and tenant that passed it; a second or late use is told which it was; the
 * limits per key and in all; expiry closes the descriptors; the table closes what it holds.
 */
#include "mg_test.h"
#include "moongate/fdhandles.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int open_fd(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CU_ASSERT_FATAL(fd >= 0);
    return fd;
}

static int is_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

static mg_fd_handles *table(uint32_t max, uint32_t per_key, uint64_t ttl)
{
    mg_fd_handles_config cfg = {.max_handles = max, .max_per_key = per_key, .ttl_ms = ttl};
    mg_fd_handles *t = NULL;
    CU_ASSERT_EQUAL_FATAL(mg_fd_handles_new(&t, &cfg), 0);
    return t;
}

static const mg_fd_owner alice = {.uid = 1000, .proc = {.pid = 42, .start = 7}, .tenant = "team-a"};

static void test_handle_goes_once_to_its_owner(void)
{
    mg_fd_handles *t = table(8, 4, 1000);
    mg_fd_owner other_pid = alice, other_uid = alice, other_tenant = alice, reused = alice;
    mg_fd_handles_stats st;
    uint64_t h = 0, h2 = 0;
    char err[256];
    int fd = open_fd(), got = -1;
    other_pid.proc.pid = 43;
    reused.proc.start = 8; /* the same pid, another process */
    other_uid.uid = 1001;
    snprintf(other_tenant.tenant, sizeof(other_tenant.tenant), "team-b");

    CU_ASSERT_EQUAL_FATAL(mg_fd_handles_put(t, fd, &alice, 1, 0, &h, err, sizeof(err)), 0);
    CU_ASSERT_NOT_EQUAL(h, 0);
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, open_fd(), &alice, 1, 0, &h2, err, sizeof(err)), 0);
    CU_ASSERT_NOT_EQUAL(h, h2); /* random, distinct */
    /* Another process, user or tenant: refused, and the handle stays its owner's. */
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &other_pid, 10, &got, err, sizeof(err)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "passed by uid 1000 pid 42"));
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &other_uid, 10, &got, err, sizeof(err)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &reused, 10, &got, err, sizeof(err)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "another process with the same pid"));
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &other_tenant, 10, &got, err, sizeof(err)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tenant \"team-a\""));
    CU_ASSERT_EQUAL(got, -1);
    /* Its owner takes it, once. */
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &alice, 10, &got, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(got, fd);
    CU_ASSERT(is_open(fd)); /* now the caller's */
    close(fd);
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h, &alice, 10, &got, err, sizeof(err)), MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "was used already"));
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, 12345, &alice, 10, &got, err, sizeof(err)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no fd handle 12345"));
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, 0, &alice, 10, &got, err, sizeof(err)), MG_ERR_NOT_FOUND);
    mg_fd_handles_get_stats(t, &st);
    CU_ASSERT_EQUAL(st.passed, 2);
    CU_ASSERT_EQUAL(st.claimed, 1);
    CU_ASSERT_EQUAL(st.held, 1);
    mg_fd_handles_del(t); /* closes h2's descriptor */
}

static void test_expiry_closes_and_says_so(void)
{
    mg_fd_handles *t = table(8, 8, 100);
    mg_fd_handles_stats st;
    uint64_t h[3];
    char err[256];
    int fds[3], got = -1;
    static const uint64_t at[3] = {0, 10, 60};
    for (int i = 0; i < 3; i++) {
        fds[i] = open_fd();
        CU_ASSERT_EQUAL_FATAL(
            mg_fd_handles_put(t, fds[i], &alice, 7, at[i], &h[i], err, sizeof(err)), 0);
    }
    CU_ASSERT_EQUAL(mg_fd_handles_expire(t, 99), 0);
    CU_ASSERT_EQUAL(mg_fd_handles_expire(t, 110), 2); /* due at 100 and 110 */
    CU_ASSERT(!is_open(fds[0]) && !is_open(fds[1]));
    CU_ASSERT(is_open(fds[2]));
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h[0], &alice, 150, &got, err, sizeof(err)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "expired"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "100 ms"));
    /* A take finds a handle whose time is up as expired, timer or not. */
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, h[2], &alice, 200, &got, err, sizeof(err)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "expired"));
    CU_ASSERT(!is_open(fds[2]));
    mg_fd_handles_get_stats(t, &st);
    CU_ASSERT_EQUAL(st.expired, 3);
    CU_ASSERT_EQUAL(st.held, 0);
    mg_fd_handles_del(t);
}

static void test_limits(void)
{
    mg_fd_handles *t = table(3, 2, 1000);
    mg_fd_handles_stats st;
    uint64_t h, first;
    char err[256];
    int fd, got;
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, open_fd(), &alice, 1, 0, &first, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, open_fd(), &alice, 1, 0, &h, err, sizeof(err)), 0);
    fd = open_fd();
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, fd, &alice, 1, 0, &h, err, sizeof(err)), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--max-unclaimed-fds"));
    CU_ASSERT(is_open(fd)); /* refused: still the caller's */
    CU_ASSERT_EQUAL(mg_fd_handles_count(t, 1), 2);
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, fd, &alice, 2, 0, &h, err, sizeof(err)), 0);
    fd = open_fd();
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, fd, &alice, 3, 0, &h, err, sizeof(err)), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--max-fd-handles"));
    /* A claim makes room for the key and in all. */
    CU_ASSERT_EQUAL(mg_fd_handles_take(t, first, &alice, 1, &got, err, sizeof(err)), 0);
    close(got);
    CU_ASSERT_EQUAL(mg_fd_handles_put(t, fd, &alice, 1, 1, &h, err, sizeof(err)), 0);
    mg_fd_handles_get_stats(t, &st);
    CU_ASSERT_EQUAL(st.refused, 2);
    CU_ASSERT_EQUAL(st.held, 3);
    mg_fd_handles_del(t);
    mg_fd_handles_del(NULL);
}

static void test_bad_config(void)
{
    mg_fd_handles *t = NULL;
    mg_fd_handles_config none = {.max_handles = 0, .max_per_key = 1, .ttl_ms = 1};
    mg_fd_handles_config ttl = {.max_handles = 1, .max_per_key = 1, .ttl_ms = 0};
    CU_ASSERT_EQUAL(mg_fd_handles_new(&t, &none), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_fd_handles_new(&t, &ttl), MG_ERR_INVALID);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_handle_goes_once_to_its_owner),
        MG_TEST(test_expiry_closes_and_says_so),
        MG_TEST(test_limits),
        MG_TEST(test_bad_config),
    };
    return mg_test_run("fd handles", cases, sizeof(cases) / sizeof(cases[0]));
}
