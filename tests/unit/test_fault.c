/*
 * Unit tests for moongate/fault.h: copies and checksums over a mapping whose file was shrunk
 * under it fail with MG_ERR_DATA_LOSS instead of SIGBUS, on any thread, again and again; intact
 * memory copies as memmove does; a probe tells a range that ends past the file; a SIGBUS
 * outside a guard still kills.
 */
#include "mg_test.h"

#include "moongate/dataframe.h"
#include "moongate/fault.h"
#include "moongate/mg_error.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { PAGES = 4 };

static size_t page;

/* A shared mapping of PAGES pages of a file in /dev/shm, filled, then the file cut to one
 * page: the other pages of the mapping have no file behind them any more. */
static uint8_t *shrunk_mapping(void)
{
    char path[] = "/dev/shm/mg-test-fault-XXXXXX";
    int fd = mkstemp(path);
    uint8_t *p;
    CU_ASSERT_FATAL(fd >= 0);
    unlink(path);
    CU_ASSERT_FATAL(ftruncate(fd, (off_t)(PAGES * page)) == 0);
    p = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CU_ASSERT_FATAL(p != MAP_FAILED);
    memset(p, 0xab, PAGES * page);
    CU_ASSERT_FATAL(ftruncate(fd, (off_t)page) == 0);
    close(fd);
    return p;
}

static void test_copies_over_missing_pages_fail(void)
{
    uint8_t *p = shrunk_mapping(), *buf = malloc(PAGES * page);
    uint32_t crc = 7;
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    for (int round = 0; round < 3; round++) { /* the handler keeps working after a jump */
        CU_ASSERT_EQUAL(mg_guarded_copy(buf, p, PAGES * page), MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(mg_guarded_copy(p + page, buf, page), MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(mg_guarded_crc32c(&crc, p, 2 * page), MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(mg_guarded_copy_crc32c(buf, p, 2 * page, &crc, 0), MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(mg_guarded_copy_crc32c(p + page, buf, page, &crc, 1), MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(crc, 7); /* untouched on failure */
    }
    /* The page still backed by the file copies and sums as ever. */
    CU_ASSERT_EQUAL(mg_guarded_copy(buf, p, page), 0);
    CU_ASSERT_EQUAL(buf[0], 0xab);
    CU_ASSERT_EQUAL(buf[page - 1], 0xab);
    CU_ASSERT_EQUAL(mg_guarded_crc32c(&crc, p, page), 0);
    CU_ASSERT_EQUAL(crc, mg_crc32c(7, buf, page));
    memset(buf, 0, page);
    crc = 7;
    CU_ASSERT_EQUAL(mg_guarded_copy_crc32c(buf, p, page, &crc, 1), 0);
    CU_ASSERT_EQUAL(buf[page - 1], 0xab);
    CU_ASSERT_EQUAL(crc, mg_crc32c(7, buf, page));
    munmap(p, PAGES * page);
    free(buf);
}

static void test_overlapping_copy_is_a_move(void)
{
    uint8_t b[64];
    for (int i = 0; i < 64; i++)
        b[i] = (uint8_t)i;
    CU_ASSERT_EQUAL(mg_guarded_copy(b + 8, b, 32), 0);
    for (int i = 0; i < 32; i++)
        CU_ASSERT_EQUAL(b[8 + i], i);
}

static void *thread_main(void *arg)
{
    uint8_t *p = arg, buf[64];
    long failures = 0;
    for (int i = 0; i < 100; i++)
        failures += mg_guarded_copy(buf, p + 2 * page, sizeof(buf)) == MG_ERR_DATA_LOSS;
    return (void *)failures;
}

static void test_each_thread_has_its_own_guard(void)
{
    uint8_t *p = shrunk_mapping();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, thread_main, p), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        CU_ASSERT_EQUAL((long)r, 100);
    }
    munmap(p, PAGES * page);
}

/* A probe asks before the kernel copies a range: a range within the file's first page is
 * there, one ending past it is not (wherever it starts), and nothing is there to miss. */
static void test_probe_tells_a_range_past_the_end(void)
{
    uint8_t *p = shrunk_mapping();
    CU_ASSERT_EQUAL(mg_fault_probe(p, page), 0);
    CU_ASSERT_EQUAL(mg_fault_probe(p + 7, page - 7), 0);
    CU_ASSERT_EQUAL(mg_fault_probe(p, page + 1), MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_fault_probe(p + page - 1, 2), MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_fault_probe(p + 2 * page, page), MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_fault_probe(p + 2 * page, 0), 0);
    munmap(p, PAGES * page);
}

static void test_a_fault_outside_a_guard_still_kills(void)
{
    uint8_t *p = shrunk_mapping();
    pid_t child;
    int status = 0;
    CU_ASSERT_EQUAL(mg_fault_init(), 0);
    child = fork();
    if (child == 0) {
        volatile uint8_t v = p[2 * page]; /* no guard: a bug, and it must not be hidden */
        (void)v;
        _exit(0);
    }
    CU_ASSERT_EQUAL_FATAL(waitpid(child, &status, 0), child);
    CU_ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS);
    munmap(p, PAGES * page);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_copies_over_missing_pages_fail),
        MG_TEST(test_overlapping_copy_is_a_move),
        MG_TEST(test_each_thread_has_its_own_guard),
        MG_TEST(test_probe_tells_a_range_past_the_end),
        MG_TEST(test_a_fault_outside_a_guard_still_kills),
    };
    page = (size_t)sysconf(_SC_PAGESIZE);
    return mg_test_run("fault", cases, sizeof(cases) / sizeof(cases[0]));
}
