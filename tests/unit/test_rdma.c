/*
 * Unit tests for the RDMA loader (moongate/rdma.h) against the software verbs emulator, loaded
 * through the same dlopen seam as libibverbs: reasons when the library or a device is missing,
 * devices and their attributes, registration on every device with rollback when one refuses
 * (the emulator's memlock cap is per process, so a registration left behind on the first device
 * would make the next one fail), unmapped memory refused.
 */
#include "mg_test.h"
#include "moongate/mg_error.h"
#include "moongate/rdma.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MG_VERBS_EMU
#error "MG_VERBS_EMU: the emulator library's path"
#endif

static void test_reasons(void)
{
    mg_rdma *r;
    char why[300];
    mg_rdma_config c = {"/nonexistent/libibverbs.so.1", NULL, 0};
    CU_ASSERT_EQUAL(mg_rdma_open(&r, &c, why, sizeof(why)), MG_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NULL(r);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "cannot load /nonexistent/libibverbs.so.1"));
    c.lib = "libc.so.6"; /* a library, but not verbs */
    CU_ASSERT_EQUAL(mg_rdma_open(&r, &c, why, sizeof(why)), MG_ERR_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(why, "libc.so.6 has no ibv_get_device_list");
    setenv("MG_VERBS_EMU_DEVICES", "", 1);
    c.lib = MG_VERBS_EMU;
    CU_ASSERT_EQUAL(mg_rdma_open(&r, &c, why, sizeof(why)), MG_ERR_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(why, "no RDMA devices");
}

static void test_devices_and_registration(void)
{
    mg_rdma *r;
    mg_rdma_mr *mr, *half;
    mg_rdma_device_info d;
    mg_rdma_stats st;
    char why[300];
    size_t len = 1 << 20;
    mg_rdma_config c = {MG_VERBS_EMU, NULL, 0};
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CU_ASSERT_FATAL(buf != MAP_FAILED);
    setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1", 1);
    setenv("MG_VERBS_EMU_MEMLOCK", "1572864", 1); /* 1.5 MiB: one device's worth of len */
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &c, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_rdma_device_count(r), 2);
    mg_rdma_device(r, 1, &d);
    CU_ASSERT_STRING_EQUAL(d.name, "emu1");
    CU_ASSERT_EQUAL(d.port, 1);
    CU_ASSERT_EQUAL(d.mtu, 4096);
    CU_ASSERT_TRUE(d.roce);
    CU_ASSERT_STRING_EQUAL(d.gid, "::ffff:127.0.0.1");
    CU_ASSERT_EQUAL(d.max_msg_size, 1u << 30);

    /* emu0 takes it, emu1 is past the cap: nothing stays registered. */
    CU_ASSERT_EQUAL(mg_rdma_reg(r, buf, len, 1, &mr, why, sizeof(why)), MG_ERR_NOMEM);
    CU_ASSERT_PTR_NULL(mr);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "device emu1: ibv_reg_mr of 1048576 bytes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "memlock"));
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.mrs, 0);
    CU_ASSERT_EQUAL(st.reg_failed, 1);
    /* Half of it fits on both devices only if emu0 let go of the first attempt. */
    CU_ASSERT_EQUAL(mg_rdma_reg(r, buf, len / 2, 1, &half, why, sizeof(why)), 0);
    CU_ASSERT_NOT_EQUAL(mg_rdma_mr_rkey(half, 0), 0);
    CU_ASSERT_NOT_EQUAL(mg_rdma_mr_rkey(half, 1), mg_rdma_mr_rkey(half, 0));
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.mrs, 1);
    CU_ASSERT_EQUAL(st.mr_bytes, len / 2);
    mg_rdma_dereg(half);
    /* Local only: no remote key. */
    CU_ASSERT_EQUAL(mg_rdma_reg(r, buf, 4096, 0, &mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_rdma_mr_rkey(mr, 0), 0);
    CU_ASSERT_NOT_EQUAL(mg_rdma_mr_lkey(mr, 0), 0);
    mg_rdma_dereg(mr);
    /* Memory that is not mapped cannot be pinned. */
    munmap(buf, len);
    CU_ASSERT_EQUAL(mg_rdma_reg(r, buf, len / 2, 0, &mr, why, sizeof(why)), MG_ERR_SYSTEM);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "Bad address"));
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.mrs, 0);
    CU_ASSERT_EQUAL(st.mr_bytes, 0);
    mg_rdma_close(r);
    unsetenv("MG_VERBS_EMU_MEMLOCK");
}

static void test_pinned_devices(void)
{
    mg_rdma *r;
    mg_rdma_device_info d;
    char why[300];
    mg_rdma_config c = {MG_VERBS_EMU, "emu2", 0};
    setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1,emu2", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &c, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_rdma_device_count(r), 1);
    mg_rdma_device(r, 0, &d);
    CU_ASSERT_STRING_EQUAL(d.name, "emu2");
    mg_rdma_close(r);
    c.devices = "emu2,emu9";
    CU_ASSERT_EQUAL(mg_rdma_open(&r, &c, why, sizeof(why)), MG_ERR_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(why, "device emu9 (--rdma-devices) not found");
}

/* Two connections of this process joined to each other, as two daemons' would be. */
static void pair(mg_rdma *r, unsigned nqps, mg_rdma_conn **a, mg_rdma_conn **b)
{
    mg_rdma_ep ea, eb;
    char why[300];
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, 0, nqps, a, &ea, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, 0, nqps, b, &eb, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(ea.nqps, nqps);
    CU_ASSERT_EQUAL(ea.mtu, 4096);
    CU_ASSERT_NOT_EQUAL(ea.qpn[0], eb.qpn[0]);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(*a, &eb, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(*b, &ea, why, sizeof(why)), 0);
}

static void test_rdma_write_and_read(void)
{
    mg_rdma *r;
    mg_rdma_conn *a, *b, *c;
    mg_rdma_mr *src_mr, *dst_mr, *priv_mr;
    mg_rdma_stats st;
    mg_rdma_ep ea;
    char why[300];
    size_t len = 5 * (1 << 20) + 77;
    uint8_t *src = malloc(len), *dst = calloc(1, len), *back = calloc(1, len);
    uint64_t progress = 0;
    int stop = 0;
    mg_rdma_config cfg = {MG_VERBS_EMU, NULL, 0};
    setenv("MG_VERBS_EMU_DEVICES", "emu0", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &cfg, why, sizeof(why)), 0);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, src, len, 0, &src_mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, dst, len, 1, &dst_mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, back, len, 0, &priv_mr, why, sizeof(why)), 0);
    pair(r, 2, &a, &b);

    /* WRITE: slices of 1 MiB over two QPs, 4 in flight on each. */
    mg_rdma_op w = {1,  src, mg_rdma_mr_lkey(src_mr, 0), (uintptr_t)dst, mg_rdma_mr_rkey(dst_mr, 0),
                    len};
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, 1 << 20, 4, &stop, &progress, 5000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(dst, src, len), 0);
    CU_ASSERT_EQUAL(progress, len);
    /* READ it back into another buffer. */
    mg_rdma_op rd = {
        0, back, mg_rdma_mr_lkey(priv_mr, 0), (uintptr_t)dst, mg_rdma_mr_rkey(dst_mr, 0), len};
    CU_ASSERT_EQUAL(mg_rdma_move(a, &rd, 65536, 16, NULL, NULL, 5000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, len), 0);
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.bytes_written, len);
    CU_ASSERT_EQUAL(st.bytes_read, len);
    CU_ASSERT_EQUAL(st.conns, 2);

    /* Past the end of the remote registration: remote access error, nothing written there. */
    w.remote_addr = (uintptr_t)dst + len - 10;
    w.len = 11;
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, 1 << 20, 4, NULL, NULL, 5000, why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "RDMA WRITE on device emu0: remote access error"));
    CU_ASSERT_TRUE(mg_rdma_conn_broken(a)); /* its QPs are in error now */
    CU_ASSERT_EQUAL(mg_rdma_move(a, &rd, 65536, 16, NULL, NULL, 5000, why, sizeof(why)),
                    MG_ERR_UNAVAILABLE);
    mg_rdma_conn_del(a);
    mg_rdma_conn_del(b);

    /* The key of a registration without remote access is refused the same way. */
    pair(r, 1, &a, &b);
    mg_rdma_op bad = {
        1, src, mg_rdma_mr_lkey(src_mr, 0), (uintptr_t)back, mg_rdma_mr_lkey(priv_mr, 0), 4096};
    CU_ASSERT_EQUAL(mg_rdma_move(a, &bad, 4096, 4, NULL, NULL, 5000, why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    mg_rdma_conn_del(a);

    /* The peer's QPs are gone (its daemon died): retry exceeded, UNAVAILABLE. */
    pair(r, 1, &a, &c);
    mg_rdma_conn_del(c);
    w.remote_addr = (uintptr_t)dst;
    w.len = 4096;
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, 4096, 4, NULL, NULL, 5000, why, sizeof(why)),
                    MG_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "transport retry counter exceeded"));
    mg_rdma_conn_del(a);
    mg_rdma_conn_del(b);

    /* QP counts must match. */
    CU_ASSERT_EQUAL(mg_rdma_conn_new(r, 0, 2, &a, &ea, why, sizeof(why)), 0);
    ea.nqps = 1;
    CU_ASSERT_EQUAL(mg_rdma_conn_connect(a, &ea, why, sizeof(why)), MG_ERR_PROTOCOL);
    mg_rdma_conn_del(a);
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.conns, 0);
    mg_rdma_dereg(src_mr);
    mg_rdma_dereg(dst_mr);
    mg_rdma_dereg(priv_mr);
    mg_rdma_close(r);
    free(src);
    free(dst);
    free(back);
}

typedef struct {
    mg_rdma_conn *c;
    mg_rdma_op op;
    int rc;
    char why[300];
} failing_move;

static void *fail_move(void *arg)
{
    failing_move *m = arg;
    m->rc = mg_rdma_move(m->c, &m->op, 4096, 4, NULL, NULL, 5000, m->why, sizeof(m->why));
    return NULL;
}

/* A mover fails a connection on one thread (a worker) while another (the loop, when another
 * job that used it ends) asks whether it is broken: the flag is read as it changes, never torn
 * (ThreadSanitizer's build reports a plain int written and read so). */
static void test_broken_is_read_while_a_mover_fails_it(void)
{
    mg_rdma *r;
    mg_rdma_conn *a, *b;
    mg_rdma_mr *src_mr, *dst_mr;
    char why[300];
    uint8_t *src = calloc(1, 65536), *dst = calloc(1, 65536);
    failing_move m = {.rc = -1};
    pthread_t th;
    time_t deadline = time(NULL) + 60; /* a safety net only */
    mg_rdma_config cfg = {MG_VERBS_EMU, NULL, 0};
    setenv("MG_VERBS_EMU_DEVICES", "emu0", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &cfg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, src, 65536, 0, &src_mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, dst, 65536, 1, &dst_mr, why, sizeof(why)), 0);
    pair(r, 1, &a, &b);
    /* past the end of the remote registration: a remote access error, then the flush */
    m.c = a;
    m.op = (mg_rdma_op){1,
                        src,
                        mg_rdma_mr_lkey(src_mr, 0),
                        (uintptr_t)dst + 65536 - 10,
                        mg_rdma_mr_rkey(dst_mr, 0),
                        4096};
    CU_ASSERT_FALSE(mg_rdma_conn_broken(a));
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, fail_move, &m), 0);
    while (!mg_rdma_conn_broken(a) && time(NULL) < deadline)
        ;
    CU_ASSERT_TRUE(mg_rdma_conn_broken(a));
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(m.rc, MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(m.why, "remote access error"));
    mg_rdma_conn_del(a);
    mg_rdma_conn_del(b);
    mg_rdma_dereg(src_mr);
    mg_rdma_dereg(dst_mr);
    mg_rdma_close(r);
    free(src);
    free(dst);
}

/* Slices go round-robin over a connection's QPs: 10 slices over 3 QPs are 4, 3 and 3, the last
 * slice short. Counted by the emulator (loaded once, so dlopen finds the same instance). */
static void test_slices_spread_over_the_qps(void)
{
    mg_rdma *r;
    mg_rdma_conn *a, *b;
    mg_rdma_mr *mr;
    mg_rdma_ep ea, eb;
    mg_rdma_stats st;
    char why[300];
    size_t slice = 65536, len = 9 * slice + 100;
    uint8_t *buf = calloc(1, 2 * len);
    mg_rdma_config cfg = {MG_VERBS_EMU, NULL, 0};
    void *emu;
    long long (*posted)(uint32_t);
    setenv("MG_VERBS_EMU_DEVICES", "emu0", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &cfg, why, sizeof(why)), 0);
    emu = dlopen(MG_VERBS_EMU, RTLD_NOW | RTLD_NOLOAD);
    CU_ASSERT_PTR_NOT_NULL_FATAL(emu);
    *(void **)&posted = dlsym(emu, "mg_verbs_emu_posted");
    CU_ASSERT_PTR_NOT_NULL_FATAL(posted);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, buf, 2 * len, 1, &mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, 0, 3, &a, &ea, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, 0, 3, &b, &eb, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(a, &eb, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(b, &ea, why, sizeof(why)), 0);
    mg_rdma_get_stats(r, &st);
    uint64_t before = st.wr_posted;
    mg_rdma_op w = {1,  buf, mg_rdma_mr_lkey(mr, 0), (uintptr_t)buf + len, mg_rdma_mr_rkey(mr, 0),
                    len};
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, (uint32_t)slice, 2, NULL, NULL, 5000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(posted(ea.qpn[0]), 4);
    CU_ASSERT_EQUAL(posted(ea.qpn[1]), 3);
    CU_ASSERT_EQUAL(posted(ea.qpn[2]), 3);
    CU_ASSERT_EQUAL(posted(eb.qpn[0]), 0); /* the responder posts nothing: one-sided */
    mg_rdma_get_stats(r, &st);
    CU_ASSERT_EQUAL(st.wr_posted - before, 10);
    mg_rdma_conn_del(a);
    mg_rdma_conn_del(b);
    CU_ASSERT_EQUAL(posted(ea.qpn[0]), -1); /* gone */
    mg_rdma_dereg(mr);
    dlclose(emu);
    mg_rdma_close(r);
    free(buf);
}

/* Two devices: a connection on each, slices taking turns between them (each with its own keys),
 * 7 slices over 2 connections of 1 QP: 4 and 3. */
static void test_slices_spread_over_the_devices(void)
{
    mg_rdma *r;
    mg_rdma_conn *a[2], *b[2];
    mg_rdma_mr *src_mr, *dst_mr;
    mg_rdma_ep ea[2], eb[2];
    char why[300];
    size_t slice = 65536, len = 6 * slice + 1;
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    mg_rdma_config cfg = {MG_VERBS_EMU, NULL, 0};
    uint32_t lkeys[2], rkeys[2];
    void *emu;
    long long (*posted)(uint32_t);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &cfg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_device_count(r), 2);
    emu = dlopen(MG_VERBS_EMU, RTLD_NOW | RTLD_NOLOAD);
    CU_ASSERT_PTR_NOT_NULL_FATAL(emu);
    *(void **)&posted = dlsym(emu, "mg_verbs_emu_posted");
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, src, len, 0, &src_mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, dst, len, 1, &dst_mr, why, sizeof(why)), 0);
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, k, 1, &a[k], &ea[k], why, sizeof(why)), 0);
        CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_new(r, k, 1, &b[k], &eb[k], why, sizeof(why)), 0);
        CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(a[k], &eb[k], why, sizeof(why)), 0);
        CU_ASSERT_EQUAL_FATAL(mg_rdma_conn_connect(b[k], &ea[k], why, sizeof(why)), 0);
        lkeys[k] = mg_rdma_mr_lkey(src_mr, k);
        rkeys[k] = mg_rdma_mr_rkey(dst_mr, k);
    }
    CU_ASSERT_NOT_EQUAL(rkeys[0], rkeys[1]); /* a key per device */
    mg_rdma_op w = {1, src, 0, (uintptr_t)dst, 0, len};
    CU_ASSERT_EQUAL(mg_rdma_move_multi(a, 2, &w, lkeys, rkeys, (uint32_t)slice, 4, NULL, NULL, 5000,
                                       why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(memcmp(dst, src, len), 0);
    CU_ASSERT_EQUAL(posted(ea[0].qpn[0]), 4);
    CU_ASSERT_EQUAL(posted(ea[1].qpn[0]), 3);
    /* A key is valid on its own device only: swapped, the responder refuses it. */
    uint32_t swapped[2] = {rkeys[1], rkeys[0]};
    CU_ASSERT_EQUAL(mg_rdma_move_multi(a, 2, &w, lkeys, swapped, (uint32_t)slice, 4, NULL, NULL,
                                       5000, why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "remote access error"));
    for (int k = 0; k < 2; k++) {
        mg_rdma_conn_del(a[k]);
        mg_rdma_conn_del(b[k]);
    }
    mg_rdma_dereg(src_mr);
    mg_rdma_dereg(dst_mr);
    dlclose(emu);
    mg_rdma_close(r);
    free(src);
    free(dst);
}

/* A dma-buf as the CUDA driver emulator exports one: a memfd (the device memory) opened again
 * read-only, its file position where the exported range starts. */
static int emu_dmabuf(size_t size, off_t start, int *memfd)
{
    char path[64];
    int fd;
    *memfd = memfd_create("vram", MFD_CLOEXEC);
    if (*memfd < 0 || ftruncate(*memfd, (off_t)size) != 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", *memfd);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        lseek(fd, start, SEEK_SET);
    return fd;
}

/* A dma-buf registered with every device: RDMA WRITE and READ name it by its iova (an address
 * of the exporting process, never mapped here); the bytes land in the exported range. A provider
 * that takes no dma-buf is named; a library without the symbol says so. */
static void test_dmabuf_registration(void)
{
    mg_rdma *r;
    mg_rdma_conn *a, *b;
    mg_rdma_mr *src_mr, *vram_mr;
    mg_rdma_config cfg = {MG_VERBS_EMU, NULL, 0};
    size_t len = 1 << 20;
    uint64_t iova = 0x7e0000000000ull; /* the GPU pointer in the client: not memory here */
    uint8_t *src = malloc(len), *check = malloc(len);
    char why[300];
    int memfd = -1, fd;
    setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1", 1);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_open(&r, &cfg, why, sizeof(why)), 0);
    CU_ASSERT_TRUE(mg_rdma_has_dmabuf(r));
    fd = emu_dmabuf(3 * len, (off_t)len, &memfd); /* the range: the allocation's second MiB */
    CU_ASSERT_FATAL(fd >= 0);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 29 + 5);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg(r, src, len, 0, &src_mr, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL_FATAL(mg_rdma_reg_dmabuf(r, fd, 0, len, iova, 1, &vram_mr, why, sizeof(why)),
                          0);
    pair(r, 1, &a, &b);
    mg_rdma_op w = {
        1, src, mg_rdma_mr_lkey(src_mr, 0), iova + 4096, mg_rdma_mr_rkey(vram_mr, 0), len - 4096};
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, 65536, 4, NULL, NULL, 5000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(pread(memfd, check, len - 4096, (off_t)len + 4096), (ssize_t)(len - 4096));
    CU_ASSERT_EQUAL(memcmp(check, src, len - 4096), 0);
    w.remote_addr = iova + len - 10; /* past the exported range */
    w.len = 11;
    CU_ASSERT_EQUAL(mg_rdma_move(a, &w, 65536, 4, NULL, NULL, 5000, why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    mg_rdma_conn_del(a);
    mg_rdma_conn_del(b);
    mg_rdma_dereg(vram_mr);
    setenv("MG_VERBS_EMU_NO_DMABUF", "emu1", 1); /* one provider refuses: each one is named */
    CU_ASSERT_EQUAL(mg_rdma_reg_dmabuf(r, fd, 0, len, iova, 1, &vram_mr, why, sizeof(why)),
                    MG_ERR_UNSUPPORTED);
    CU_ASSERT_STRING_EQUAL(why, "device emu0: took it; device emu1: ibv_reg_dmabuf_mr of 1048576 "
                                "bytes: Operation not supported (its provider takes no dma-buf)");
    CU_ASSERT_PTR_NULL(vram_mr);
    setenv("MG_VERBS_EMU_NO_DMABUF", "1", 1);
    CU_ASSERT_EQUAL(mg_rdma_reg_dmabuf(r, fd, 0, len, iova, 1, &vram_mr, why, sizeof(why)),
                    MG_ERR_UNSUPPORTED);
    CU_ASSERT_STRING_EQUAL(why, "device emu0: ibv_reg_dmabuf_mr of 1048576 bytes: Operation not "
                                "supported (its provider takes no dma-buf); device emu1: "
                                "ibv_reg_dmabuf_mr of 1048576 bytes: Operation not supported (its "
                                "provider takes no dma-buf)");
    unsetenv("MG_VERBS_EMU_NO_DMABUF");
    mg_rdma_dereg(src_mr);
    mg_rdma_close(r);
    close(fd);
    close(memfd);
    free(src);
    free(check);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_reasons),
        MG_TEST(test_devices_and_registration),
        MG_TEST(test_pinned_devices),
        MG_TEST(test_rdma_write_and_read),
        MG_TEST(test_broken_is_read_while_a_mover_fails_it),
        MG_TEST(test_slices_spread_over_the_qps),
        MG_TEST(test_slices_spread_over_the_devices),
        MG_TEST(test_dmabuf_registration),
    };
    return mg_test_run("rdma", cases, sizeof(cases) / sizeof(cases[0]));
}
