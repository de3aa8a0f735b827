/*
 * Unit tests for another process's memory (moongate/procmem.h): a child process's bytes read
 * and written where they lie; a range with a hole, or an address that is not mapped, refused at
 * the probe with the reason; a process of another uid refused; a pid whose process is another
 * one now (its start time differs) and a process that exits are told apart from copy errors.
 */
#include "mg_test.h"
#include "moongate/procmem.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child that maps 3 pages (a hole in the third), writes "child" at the start, tells its
 * address through the pipe and waits for a byte (or its end). */
typedef struct {
    pid_t pid;
    int to_child, from_child;
    uint64_t addr;
} child_t;

static void child_start(child_t *c, uid_t become)
{
    int up[2], down[2];
    CU_ASSERT_FATAL(pipe(up) == 0 && pipe(down) == 0);
    c->pid = fork();
    CU_ASSERT_FATAL(c->pid >= 0);
    if (c->pid == 0) {
        char *m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        uint64_t a = (uint64_t)(uintptr_t)m;
        char b;
        munmap(m + 2 * 4096, 4096);
        strcpy(m, "child");
        if (become && setresuid(become, become, become) != 0)
            _exit(3);
        if (write(up[1], &a, sizeof(a)) != (ssize_t)sizeof(a))
            _exit(2);
        (void)!read(down[0], &b, 1);
        _exit(m[100] == 'W' ? 0 : 1); /* the parent's write arrived */
    }
    close(up[1]);
    close(down[0]);
    c->to_child = down[1];
    c->from_child = up[0];
    CU_ASSERT_FATAL(read(c->from_child, &c->addr, sizeof(c->addr)) == (ssize_t)sizeof(c->addr));
}

static int child_end(child_t *c)
{
    int st = 0;
    (void)!write(c->to_child, "x", 1);
    close(c->to_child);
    close(c->from_child);
    waitpid(c->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_read_write_probe(void)
{
    child_t c;
    mg_procmem *pm = NULL;
    mg_proc p;
    char buf[8] = "", why[512];
    uint64_t rd0, wr0, rd, wr;
    child_start(&c, 0);
    p.pid = c.pid;
    p.start = mg_proc_start_time(c.pid);
    CU_ASSERT_NOT_EQUAL(p.start, 0);
    mg_procmem_bytes(&rd0, &wr0);
    CU_ASSERT_EQUAL_FATAL(mg_procmem_open(&pm, &p, (uint32_t)getuid(), why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_procmem_probe(pm, c.addr, 2 * 4096, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_procmem_read(pm, buf, c.addr, 6, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(buf, "child");
    CU_ASSERT_EQUAL(mg_procmem_write(pm, c.addr + 100, "W", 1, why, sizeof(why)), 0);
    mg_procmem_bytes(&rd, &wr);
    CU_ASSERT(rd >= rd0 + 6 && wr >= wr0 + 1);
    /* The hole: the probe names its first address; a copy into it is DATA_LOSS. */
    CU_ASSERT_EQUAL(mg_procmem_probe(pm, c.addr, 3 * 4096, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "not memory the daemon can reach"));
    {
        char expect[32];
        snprintf(expect, sizeof(expect), "0x%llx", (unsigned long long)(c.addr + 2 * 4096));
        CU_ASSERT_PTR_NOT_NULL(strstr(why, expect));
    }
    CU_ASSERT_EQUAL(mg_procmem_read(pm, buf, c.addr + 2 * 4096 - 2, 4, why, sizeof(why)),
                    MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_procmem_probe(pm, 0x1000, 1, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(child_end(&c), 0); /* it saw the write */
    /* It exited: told as such, not as a copy error. */
    CU_ASSERT_EQUAL(mg_procmem_read(pm, buf, c.addr, 1, why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "exited"));
    mg_procmem_close(pm);
    mg_procmem_close(NULL);
}

static void test_who_may_be_read(void)
{
    child_t c;
    mg_procmem *pm = NULL;
    mg_proc p = {.pid = 0};
    char why[512];
    CU_ASSERT_EQUAL(mg_procmem_open(&pm, &p, 0, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "hostPID"));
    child_start(&c, getuid() == 0 ? 65534 : 0);
    p.pid = c.pid;
    p.start = mg_proc_start_time(c.pid);
    if (getuid() == 0) { /* the child became nobody: root's caller may not read it */
        CU_ASSERT_EQUAL(mg_procmem_open(&pm, &p, 0, why, sizeof(why)), MG_ERR_PERMISSION);
        CU_ASSERT_PTR_NOT_NULL(strstr(why, "runs as uid 65534"));
    }
    /* Another start time: the pid is another process's now. */
    p.start += 1;
    CU_ASSERT_EQUAL(mg_procmem_open(&pm, &p, (uint32_t)getuid(), why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "another process's now"));
    kill(c.pid, SIGKILL);
    child_end(&c);
    p.start -= 1;
    CU_ASSERT_EQUAL(mg_procmem_open(&pm, &p, (uint32_t)getuid(), why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "is gone"));
}

int main(void)
{
    /* child_end tells a child it killed to go on: a write to a pipe nobody reads any more. */
    signal(SIGPIPE, SIG_IGN);
    static const mg_test_case cases[] = {
        MG_TEST(test_read_write_probe),
        MG_TEST(test_who_may_be_read),
    };
    return mg_test_run("process memory", cases, sizeof(cases) / sizeof(cases[0]));
}
