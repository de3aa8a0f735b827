/*
 * Unit tests for what pages a directory's files are made of (mg_shm.h), from mountinfo texts:
 * the longest mount point holding the path (and of equal ones the later), escapes in mount
 * points, hugetlbfs, tmpfs with each huge= and the global shmem_enabled word, other
 * filesystems, and a path no mount holds.
 */
#include "mg_shm.h"
#include "mg_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *mounts =
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "25 22 0:23 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=1024k\n"
    "30 22 0:28 / /mnt/big rw,relatime shared:9 - tmpfs tmpfs rw,size=8g,huge=within_size\n"
    "31 22 0:29 / /mnt/adv rw,relatime - tmpfs tmpfs rw,huge=advise\n"
    "32 22 0:30 / /mnt/hp rw,relatime shared:10 master:2 - hugetlbfs none rw,pagesize=2M\n"
    "33 22 0:31 / /mnt/with\\040space rw - tmpfs tmpfs rw,huge=always\n"
    "34 25 0:32 / /dev/shm/moongate rw - tmpfs tmpfs rw,huge=always\n"
    "35 25 0:33 / /dev/shm/moongate rw - tmpfs tmpfs rw\n"; /* mounted over 34 */

static const char *thp_never = "always within_size advise [never] deny force\n";

static int pages(const char *path, const char *thp, char *desc)
{
    return mg_shm_pages_of(mounts, thp, path, desc, 128);
}

static void test_mounts(void)
{
    char d[128];
    CU_ASSERT_EQUAL(pages("/dev/shm/x", thp_never, d), 0);
    CU_ASSERT_STRING_EQUAL(d, "tmpfs without huge=");
    CU_ASSERT_EQUAL(pages("/mnt/big/seg", thp_never, d), 1);
    CU_ASSERT_STRING_EQUAL(d, "tmpfs huge=within_size");
    CU_ASSERT_EQUAL(pages("/mnt/big", NULL, d), 1);         /* the mount point itself */
    CU_ASSERT_EQUAL(pages("/mnt/bigger", thp_never, d), 0); /* not under /mnt/big */
    CU_ASSERT_STRING_EQUAL(d, "ext4 (not tmpfs: page cache of 4 KiB pages)");
    CU_ASSERT_EQUAL(pages("/mnt/adv/a", thp_never, d), 0);
    CU_ASSERT_STRING_EQUAL(d, "tmpfs huge=advise");
    CU_ASSERT_EQUAL(pages("/mnt/hp/a/b", thp_never, d), 1);
    CU_ASSERT_STRING_EQUAL(d, "hugetlbfs pagesize=2M");
    CU_ASSERT_EQUAL(pages("/mnt/with space/a", thp_never, d), 1);
    CU_ASSERT_EQUAL(pages("/dev/shm/moongate/seg", thp_never, d), 0); /* the later mount */
}

static void test_global_word(void)
{
    char d[128];
    CU_ASSERT_EQUAL(pages("/mnt/big/seg", "always within_size advise never [deny] force", d), 0);
    CU_ASSERT_STRING_EQUAL(d, "tmpfs, shmem_enabled deny");
    CU_ASSERT_EQUAL(pages("/dev/shm/x", "always within_size advise never deny [force]", d), 1);
    CU_ASSERT_EQUAL(pages("/dev/shm/x", "", d), 0);
    CU_ASSERT_EQUAL(mg_shm_pages_of("", thp_never, "/a", d, sizeof(d)), -1);
    CU_ASSERT_EQUAL(mg_shm_pages_of("garbage\n\n1 2\n", thp_never, "/a", d, sizeof(d)), -1);
}

static void test_this_machine(void)
{
    char d[128];
    CU_ASSERT_NOT_EQUAL(mg_shm_pages("/", d, sizeof(d)), -1);
    CU_ASSERT_EQUAL(mg_shm_pages("/no/such/dir", d, sizeof(d)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(d, "does not exist"));
}

/* The directory's lock: held once; a second taker (another open file, as another daemon's
 * would be) is refused naming the holder's pid; let go with its descriptor. */
static void test_dir_lock(void)
{
    char dir[] = "/tmp/mg-shm-lock-XXXXXX", why[512], want[64], path[600];
    int a, b;
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    a = mg_shm_dir_lock(dir, why, sizeof(why));
    CU_ASSERT_TRUE(a >= 0);
    b = mg_shm_dir_lock(dir, why, sizeof(why));
    CU_ASSERT_EQUAL(b, -1);
    snprintf(want, sizeof(want), "pid=%ld ", (long)getpid());
    CU_ASSERT_PTR_NOT_NULL(strstr(why, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "another daemon holds this shm directory"));
    close(a);
    b = mg_shm_dir_lock(dir, why, sizeof(why));
    CU_ASSERT_TRUE(b >= 0);
    close(b);
    CU_ASSERT_EQUAL(mg_shm_dir_lock("/no/such/dir", why, sizeof(why)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "No such file"));
    snprintf(path, sizeof(path), "%s/%s", dir, MG_SHM_LOCK_FILE);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_mounts),
        MG_TEST(test_global_word),
        MG_TEST(test_this_machine),
        MG_TEST(test_dir_lock),
    };
    return mg_test_run("shm", cases, sizeof(cases) / sizeof(cases[0]));
}
