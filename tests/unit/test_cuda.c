/*
 * Unit tests for the client library's CUDA driver table (mg_cuda.h) against the CUDA driver
 * emulator, loaded through the same seam as libcuda.so.1 ($MOONGATE_CUDA_LIB): no driver, a
 * library that is not the driver, no device (each in a child process: the table is opened once
 * per process); devices, contexts, allocations, where a pointer lies; copies on streams in order
 * with events; a device pointer is not host memory; the dma-buf export (a range's offset, a
 * descriptor that refuses a writable mapping); an error injected into a copy, reported by the
 * stream's synchronization with the driver's name for it; host registration.
 */
#include "mg_cuda.h"
#include "mg_vram.h"
#include "mg_test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MG_CUDA_EMU
#error "MG_CUDA_EMU: the emulator library's path"
#endif

#define MiB (1u << 20)

/* mg_cuda_get's error in a fresh process (this program again: the table is opened once per
 * process) with these settings; "" when it opened. */
static void child_reason(const char *lib, const char *env, const char *value, char *out, size_t cap)
{
    int p[2];
    pid_t pid;
    ssize_t n;
    out[0] = '\0';
    if (pipe(p) != 0 || (pid = fork()) < 0)
        return;
    if (pid == 0) {
        dup2(p[1], 1);
        execl("/proc/self/exe", "test_cuda", "--reason", lib, env ? env : "", value ? value : "",
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    n = read(p[0], out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
    close(p[0]);
    waitpid(pid, NULL, 0);
}

/* This program again, in a process of its own with `flag`; its exit status (-1: it did not
 * exit). */
static int run_self(const char *flag)
{
    pid_t pid = fork();
    int st = 0;
    if (pid == 0) {
        execl("/proc/self/exe", "test_cuda", flag, (char *)NULL);
        _exit(127);
    }
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

static int reason_main(char **argv)
{
    char err[512] = "";
    setenv("MOONGATE_CUDA_LIB", argv[2], 1);
    if (argv[3][0])
        setenv(argv[3], argv[4], 1);
    mg_cuda_get(err, sizeof(err));
    fputs(err, stdout);
    return 0;
}

static void test_no_driver(void)
{
    char why[512];
    child_reason("/nonexistent/libcuda.so.1", NULL, NULL, why, sizeof(why));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "no CUDA driver: /nonexistent/libcuda.so.1"));
    child_reason("libc.so.6", NULL, NULL, why, sizeof(why));
    CU_ASSERT_STRING_EQUAL(why, "the CUDA driver libc.so.6 has no cuInit (CUDA 11.7 or later "
                                "needed)");
    child_reason(MG_CUDA_EMU, "MG_CUDA_EMU_DEVICES", "0", why, sizeof(why));
    CU_ASSERT_STRING_EQUAL(why, "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is "
                                "detected)");
    child_reason(MG_CUDA_EMU, NULL, NULL, why, sizeof(why));
    CU_ASSERT_STRING_EQUAL(why, "");
}

static const mg_cuda *cu;

static void test_devices_memory_and_pointers(void)
{
    mg_cu_context ctx = NULL, got = NULL;
    mg_cu_ptr d = 0;
    mg_cuda_ptr_info info;
    int n = 0, dmabuf = 0;
    char host[64];
    CU_ASSERT_EQUAL(cu->version, 12040);
    CU_ASSERT_EQUAL(cu->cuDeviceGetCount(&n), 0);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT_EQUAL(cu->cuDeviceGetAttribute(&dmabuf, MG_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 1),
                    0);
    CU_ASSERT_EQUAL(dmabuf, 1);
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&d, MiB), 201); /* no current context */
    CU_ASSERT_EQUAL(cu->cuDevicePrimaryCtxRetain(&ctx, 1), 0);
    CU_ASSERT_EQUAL(cu->cuCtxSetCurrent(ctx), 0);
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&d, MiB + 100), 0);
    CU_ASSERT_EQUAL(mg_cuda_pointer(cu, (uintptr_t)d + 4096, &info), 1);
    CU_ASSERT_EQUAL(info.device, 1);
    CU_ASSERT_PTR_EQUAL(info.context, ctx);
    CU_ASSERT_EQUAL(info.base, d);
    CU_ASSERT_EQUAL(info.size, MiB + 4096); /* whole pages */
    CU_ASSERT_EQUAL(mg_cuda_pointer(cu, (uintptr_t)host, &info), 0);
    CU_ASSERT_EQUAL(mg_cuda_pointer(NULL, (uintptr_t)d, &info), -1);
    CU_ASSERT_EQUAL(cu->cuCtxGetCurrent(&got), 0);
    CU_ASSERT_PTR_EQUAL(got, ctx);
    CU_ASSERT_EQUAL(cu->cuMemFree(d), 0);
    CU_ASSERT_EQUAL(cu->cuMemFree(d), MG_CU_ERROR_INVALID_VALUE);
}

static void test_copies_streams_events(void)
{
    mg_cu_ptr d = 0;
    mg_cu_stream s = NULL;
    mg_cu_event ev = NULL;
    size_t n = 4 * MiB;
    char *src = malloc(n), *back = calloc(1, n), buf[16];
    struct iovec local = {buf, sizeof(buf)}, remote;
    CU_ASSERT_FATAL(src != NULL && back != NULL);
    for (size_t i = 0; i < n; i++)
        src[i] = (char)(i * 13 + 1);
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&d, n), 0);
    CU_ASSERT_EQUAL(cu->cuStreamCreate(&s, MG_CU_STREAM_NON_BLOCKING), 0);
    CU_ASSERT_EQUAL(cu->cuEventCreate(&ev, 0), 0);
    CU_ASSERT_EQUAL(cu->cuMemcpyHtoDAsync(d, src, n, s), 0);
    CU_ASSERT_EQUAL(cu->cuMemcpyDtoHAsync(back, d, n, s), 0); /* after the first, in order */
    CU_ASSERT_EQUAL(cu->cuEventRecord(ev, s), 0);
    CU_ASSERT_EQUAL(cu->cuEventSynchronize(ev), 0);
    CU_ASSERT_EQUAL(cu->cuEventQuery(ev), 0);
    CU_ASSERT_EQUAL(memcmp(src, back, n), 0);
    CU_ASSERT_EQUAL(cu->cuStreamSynchronize(s), 0);
    memset(back, 0, n);
    CU_ASSERT_EQUAL(cu->cuMemcpyDtoH(back, d + 100, 1000), 0); /* synchronous, default stream */
    CU_ASSERT_EQUAL(memcmp(src + 100, back, 1000), 0);
    /* a device pointer is not host memory: another process's view of it fails too */
    remote = (struct iovec){(void *)(uintptr_t)d, sizeof(buf)};
    CU_ASSERT_EQUAL(process_vm_readv(getpid(), &local, 1, &remote, 1, 0), -1);
    CU_ASSERT_EQUAL(errno, EFAULT);
    CU_ASSERT_EQUAL(cu->cuMemcpyDtoH(back, d + n - 10, 20), MG_CU_ERROR_INVALID_VALUE);
    CU_ASSERT_EQUAL(cu->cuEventDestroy(ev), 0);
    CU_ASSERT_EQUAL(cu->cuStreamDestroy(s), 0);
    CU_ASSERT_EQUAL(cu->cuMemFree(d), 0);
    free(src);
    free(back);
}

static void test_dmabuf(void)
{
    mg_cu_ptr d = 0;
    int fd = -1;
    char one = 7;
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&d, 2 * MiB), 0);
    CU_ASSERT_EQUAL(cu->cuMemcpyHtoD(d + MiB, &one, 1), 0);
    CU_ASSERT_EQUAL(cu->cuMemGetHandleForAddressRange(&fd, d + MiB, MiB,
                                                      MG_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                    0);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(lseek(fd, 0, SEEK_CUR), (off_t)MiB); /* where the range starts */
    CU_ASSERT_PTR_EQUAL(mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
    CU_ASSERT_EQUAL(errno, EACCES);
    close(fd);
    CU_ASSERT_EQUAL(cu->cuMemGetHandleForAddressRange(&fd, d + 100, MiB,
                                                      MG_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                    MG_CU_ERROR_INVALID_VALUE); /* not page-aligned */
    CU_ASSERT_EQUAL(cu->cuMemGetHandleForAddressRange(&fd, d + MiB, 2 * MiB,
                                                      MG_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                    MG_CU_ERROR_INVALID_VALUE); /* past the allocation */
    CU_ASSERT_EQUAL(cu->cuMemFree(d), 0);
}

static void test_host_registration(void)
{
    size_t n = 2 * MiB;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CU_ASSERT_FATAL(p != MAP_FAILED);
    CU_ASSERT_EQUAL(cu->cuMemHostRegister(p, n, MG_CU_MEMHOSTREGISTER_PORTABLE), 0);
    CU_ASSERT_EQUAL(cu->cuMemHostRegister(p + 4096, 4096, 0), 712); /* already registered */
    CU_ASSERT_EQUAL(cu->cuMemHostUnregister(p), 0);
    CU_ASSERT_EQUAL(cu->cuMemHostUnregister(p), 713);
    munmap(p, n);
    CU_ASSERT_EQUAL(cu->cuMemHostRegister(p, n, 0), MG_CU_ERROR_INVALID_VALUE); /* unmapped */
}

/* A device range's dma-bufs: one per allocation it crosses, widened to whole pages inside each;
 * host memory named; a device without dma-buf support named (in a fresh process). */
static void test_vram_export(void)
{
    mg_cu_ptr a = 0, b = 0;
    mg_vram_piece p[4];
    char err[256], why[512];
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&a, MiB), 0);
    CU_ASSERT_EQUAL(cu->cuMemAlloc(&b, MiB), 0);
    CU_ASSERT_EQUAL_FATAL(b, a + MiB); /* back to back */
    CU_ASSERT_EQUAL(mg_vram_export((uintptr_t)a + 100, 5000, p, 4, err, sizeof(err)), 1);
    CU_ASSERT_EQUAL(p[0].address, a);
    CU_ASSERT_EQUAL(p[0].size, 8192);
    CU_ASSERT_EQUAL(p[0].device, 1);
    CU_ASSERT_EQUAL(lseek(p[0].fd, 0, SEEK_CUR), 0);
    close(p[0].fd);
    CU_ASSERT_EQUAL(mg_vram_export((uintptr_t)a + MiB - 4000, 8000, p, 4, err, sizeof(err)), 2);
    CU_ASSERT_EQUAL(p[0].address, a + MiB - 4096);
    CU_ASSERT_EQUAL(p[0].size, 4096);
    CU_ASSERT_EQUAL(lseek(p[0].fd, 0, SEEK_CUR), (off_t)(MiB - 4096));
    CU_ASSERT_EQUAL(p[1].address, b);
    CU_ASSERT_EQUAL(p[1].size, 4096);
    close(p[0].fd);
    close(p[1].fd);
    CU_ASSERT_EQUAL(mg_vram_export((uintptr_t)a + MiB - 4000, 8000, p, 1, err, sizeof(err)), -1);
    CU_ASSERT_STRING_EQUAL(err, "the range crosses more than 1 allocations");
    CU_ASSERT_EQUAL(mg_vram_export((uintptr_t)err, 16, p, 4, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "is not GPU memory the CUDA driver knows"));
    CU_ASSERT_EQUAL(mg_vram_export((uintptr_t)b + MiB - 4096, 8192, p, 4, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "is not GPU memory")); /* past the last allocation */
    CU_ASSERT_EQUAL(cu->cuMemFree(a), 0);
    CU_ASSERT_EQUAL(cu->cuMemFree(b), 0);
    child_reason(MG_CUDA_EMU, "MG_CUDA_EMU_DMABUF", "0", why, sizeof(why)); /* it opens */
    CU_ASSERT_STRING_EQUAL(why, "");
    CU_ASSERT_EQUAL(run_self("--no-dmabuf"), 0);
}

/* In a fresh process: the emulator opened with env=value, device 0's context current and
 * 4096 bytes of its memory at *d; NULL when any of it failed. */
static const mg_cuda *fresh_emu(const char *env, const char *value, mg_cu_ptr *d)
{
    char err[256];
    const mg_cuda *c;
    mg_cu_context ctx;
    setenv("MOONGATE_CUDA_LIB", MG_CUDA_EMU, 1);
    setenv(env, value, 1);
    c = mg_cuda_get(err, sizeof(err));
    if (c == NULL || c->cuDevicePrimaryCtxRetain(&ctx, 0) || c->cuCtxSetCurrent(ctx) ||
        c->cuMemAlloc(d, 4096))
        return NULL;
    return c;
}

/* In a fresh process: a device without dma-buf support is said so by mg_vram_export. */
static int no_dmabuf_main(void)
{
    char err[256];
    mg_cu_ptr d;
    mg_vram_piece p;
    if (fresh_emu("MG_CUDA_EMU_DMABUF", "0", &d) == NULL)
        return 2;
    if (mg_vram_export((uintptr_t)d, 4096, &p, 1, err, sizeof(err)) != -1)
        return 3;
    return strcmp(err, "cuda:0 exports no dma-buf (DMA_BUF_SUPPORTED is 0: CUDA 11.7 or later "
                       "and the open kernel modules have it)") == 0
               ? 0
               : 4;
}

/* In a fresh process: the second copy executed fails; its stream's synchronization says so,
 * once. */
static int inject_main(void)
{
    char text[256], b[8] = {0};
    mg_cu_ptr d;
    mg_cu_stream s;
    const mg_cuda *c = fresh_emu("MG_CUDA_EMU_FAIL", "copy:2", &d);
    if (c == NULL || c->cuStreamCreate(&s, 0))
        return 2;
    if (c->cuMemcpyHtoDAsync(d, b, 8, s) || c->cuStreamSynchronize(s)) /* copy 1 */
        return 3;
    if (c->cuMemcpyDtoHAsync(b, d, 8, s) != 0) /* queued: the error comes later */
        return 4;
    mg_cuda_strerror(c, c->cuStreamSynchronize(s), text, sizeof(text));
    if (strcmp(text, "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)"))
        return 5;
    return c->cuStreamSynchronize(s) == 0 ? 0 : 6;
}

static void test_injected_copy_error(void)
{
    CU_ASSERT_EQUAL(run_self("--inject"), 0);
}

int main(int argc, char **argv)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_no_driver),
        MG_TEST(test_devices_memory_and_pointers),
        MG_TEST(test_copies_streams_events),
        MG_TEST(test_dmabuf),
        MG_TEST(test_host_registration),
        MG_TEST(test_injected_copy_error),
        MG_TEST(test_vram_export),
    };
    char err[512];
    if (argc == 5 && strcmp(argv[1], "--reason") == 0)
        return reason_main(argv);
    if (argc == 2 && strcmp(argv[1], "--inject") == 0)
        return inject_main();
    if (argc == 2 && strcmp(argv[1], "--no-dmabuf") == 0)
        return no_dmabuf_main();
    setenv("MOONGATE_CUDA_LIB", MG_CUDA_EMU, 1);
    setenv("MG_CUDA_EMU_DEVICES", "2", 1);
    cu = mg_cuda_get(err, sizeof(err));
    if (cu == NULL) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return mg_test_run("cuda", cases, sizeof(cases) / sizeof(cases[0]));
}
