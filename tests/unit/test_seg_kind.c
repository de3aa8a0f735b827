/*
 * Unit tests for the kinds of memory behind one table (engine/src/mg_seg_kind.h): every kind's
 * table has the operations it must have and names itself as memory.proto does; what a kind
 * lacks (a NULL operation, a missing capability) comes back as an error that names the kind;
 * the operations the daemon's own access goes through (check a range, read, write, CRC32C) on
 * a mapped file and on a process's memory; and an unknown source refused at reserve.
 */
#include "mg_seg_kind.h"
#include "mg_test.h"
#include "moongate/dataframe.h"
#include "moongate/v1/memory.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static char dir[64];

static mg_registry *open_reg(void)
{
    mg_registry_config cfg = {
        .shm_dir = dir, .file_mode = 0600, .max_segments = 16, .max_registered_bytes = 1 << 24};
    mg_registry *reg = NULL;
    snprintf(dir, sizeof(dir), "/tmp/mgkind-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    return reg;
}

static void close_reg(mg_registry *reg)
{
    char cmd[128];
    mg_registry_del(reg);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

/* Every kind, walked: its place, its name, the operations it must have, and the ones its
 * capabilities need. */
static void test_every_kind_has_its_operations(void)
{
    size_t n;
    const mg_seg_kind *const *all = mg_seg_kinds_all(&n);
    CU_ASSERT_EQUAL_FATAL(n, 6);
    for (size_t i = 0; i < n; i++) {
        const mg_seg_kind *k = all[i];
        const ProtobufCEnumValue *v;
        CU_ASSERT_PTR_NOT_NULL_FATAL(k);
        CU_ASSERT_EQUAL((size_t)k->source, i);
        CU_ASSERT_PTR_EQUAL(mg_seg_kind_of(k->source), k);
        CU_ASSERT_PTR_EQUAL(mg_seg_source_name(k->source), k->name);
        CU_ASSERT_EQUAL(mg_seg_source_caps(k->source), k->caps);
        /* The gateway passes memory.proto's SegmentSource through as the kind's number. */
        v = protobuf_c_enum_descriptor_get_value(&moongate__v1__segment_source__descriptor,
                                                 (int)k->source);
        CU_ASSERT_PTR_NOT_NULL_FATAL(v);
        CU_ASSERT_EQUAL(strcasecmp(v->name, k->name), 0);
        for (size_t j = 0; j < i; j++)
            CU_ASSERT_STRING_NOT_EQUAL(all[j]->name, k->name);
        CU_ASSERT(k->what && k->what[0] && k->hint);
        CU_ASSERT(!strcmp(k->location, "cpu") || !strcmp(k->location, "cuda"));
        /* Required: every kind is checked, mapped, unmapped and described. */
        CU_ASSERT_PTR_NOT_NULL(k->check);
        CU_ASSERT_PTR_NOT_NULL(k->map);
        CU_ASSERT_PTR_NOT_NULL(k->unmap);
        CU_ASSERT_PTR_NOT_NULL(k->describe);
        /* The paths that have this process touch the bytes need read and write. */
        if (k->caps & (MG_SEG_CAP_TCP | MG_SEG_CAP_COPY | MG_SEG_CAP_INLINE)) {
            CU_ASSERT(k->read != NULL && k->write != NULL);
        } else {
            CU_ASSERT(k->read == NULL && k->write == NULL && k->crc32c == NULL);
        }
        /* Landing in buffers of its own: both operations or neither, and a sync to wait. */
        CU_ASSERT_EQUAL(k->land != NULL, k->commit != NULL);
        CU_ASSERT(k->land == NULL || k->sync != NULL);
        /* RDMA: the kind says how it registers with the devices, and only then. */
        CU_ASSERT_EQUAL(k->rdma != NULL, (k->caps & MG_SEG_CAP_RDMA) != 0);
        /* Memory that moves at all. */
        CU_ASSERT(k->caps & (MG_SEG_CAP_TCP | MG_SEG_CAP_RDMA | MG_SEG_CAP_COPY));
    }
    CU_ASSERT_PTR_NULL(mg_seg_kind_of((mg_seg_source)n));
    CU_ASSERT_PTR_NULL(mg_seg_kind_of((mg_seg_source)-1));
    CU_ASSERT_PTR_NULL(mg_seg_source_name((mg_seg_source)n));
    CU_ASSERT_EQUAL(mg_seg_source_caps((mg_seg_source)n), 0);
}

/* What a kind does not do is an error naming the kind, for every kind and every capability
 * and operation it lacks (the segments here are never mapped: nothing is touched). */
static void test_what_a_kind_lacks_is_named(void)
{
    size_t n;
    const mg_seg_kind *const *all = mg_seg_kinds_all(&n);
    for (size_t i = 0; i < n; i++) {
        mg_segment *seg = calloc(1, sizeof(*seg));
        char why[MG_SEG_ERROR_MAX], buf[8] = "";
        uint32_t crc = 0;
        CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
        seg->kind = all[i];
        seg->size = 4096;
        CU_ASSERT_EQUAL(mg_segment_caps(seg), all[i]->caps);
        for (unsigned b = 0; b < 8; b++) {
            int rc = mg_segment_allows(seg, 1u << b, why, sizeof(why));
            if (all[i]->caps & (1u << b)) {
                CU_ASSERT_EQUAL(rc, 0);
                continue;
            }
            CU_ASSERT_EQUAL(rc, MG_ERR_STATE);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, all[i]->what));
        }
        if (all[i]->read == NULL) {
            CU_ASSERT_EQUAL(mg_segment_read(seg, 0, buf, 1, why, sizeof(why)), MG_ERR_STATE);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, all[i]->what));
            CU_ASSERT_EQUAL(mg_segment_crc32c(seg, seg->addr, 1, &crc, why, sizeof(why)),
                            MG_ERR_STATE);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, "not read by this daemon"));
        }
        if (all[i]->write == NULL) {
            CU_ASSERT_EQUAL(mg_segment_write(seg, 0, "x", 1, why, sizeof(why)), MG_ERR_STATE);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, all[i]->what));
        }
        /* Outside the segment: a range error whatever the kind (nothing is reached). */
        CU_ASSERT_EQUAL(mg_segment_check_range(seg, 4000, 97, why, sizeof(why)), MG_ERR_RANGE);
        /* GPU memory only RDMA reaches: by dma-buf; staged GPU memory moves over TCP */
        CU_ASSERT_EQUAL(mg_segment_gpu(seg), all[i]->source == MG_SEG_DMABUF);
        free(seg);
    }
}

/* The inline calls' refusals read as they did when the gateway wrote them itself. */
static void test_inline_refusals_name_the_memory(void)
{
    mg_segment seg;
    char why[MG_SEG_ERROR_MAX];
    memset(&seg, 0, sizeof(seg));
    seg.kind = mg_seg_kind_of(MG_SEG_PROCESS);
    CU_ASSERT_EQUAL(mg_segment_allows(&seg, MG_SEG_CAP_INLINE, why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(why, "the segment is a process's memory (reached with process_vm on "
                                "transfers): it is not read or written inline; move it with a "
                                "transfer (peer \"\" to a segment here)");
    seg.kind = mg_seg_kind_of(MG_SEG_DMABUF);
    CU_ASSERT_EQUAL(mg_segment_allows(&seg, MG_SEG_CAP_INLINE, why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(why, "the segment is GPU memory (a dma-buf the RDMA devices reach, "
                                "never this daemon): it is not read or written inline; move it "
                                "with a transfer over RDMA");
    seg.kind = mg_seg_kind_of(MG_SEG_ANON);
    CU_ASSERT_EQUAL(mg_segment_allows(&seg, MG_SEG_CAP_INLINE | MG_SEG_CAP_TCP, why, sizeof(why)),
                    0);
}

static mg_segment *reg_map(mg_registry *reg, const mg_segment_spec *spec)
{
    mg_segment *seg = NULL;
    char err[MG_SEG_ERROR_MAX];
    int rc = mg_registry_reserve(reg, spec, &seg, err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    rc = mg_segment_map(seg);
    if (rc != 0)
        fprintf(stderr, "map: %s\n", mg_segment_error(seg));
    mg_registry_commit(reg, seg, rc);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return seg;
}

/* A mapped file through its kind: written, read back, summed; a range past it refused; and a
 * file a client cut under the mapping is DATA_LOSS, not a SIGBUS. */
static void test_a_mapped_file_read_and_written(void)
{
    mg_registry *reg = open_reg();
    mg_segment_spec spec = {.tenant = "t", .name = "a", .source = MG_SEG_ANON, .size = 65536};
    mg_segment_info info;
    mg_segment *seg = reg_map(reg, &spec);
    char buf[8] = "", why[MG_SEG_ERROR_MAX];
    uint32_t crc = 0;
    CU_ASSERT_EQUAL(mg_segment_write(seg, 100, "hello", 5, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp((char *)mg_segment_addr(seg) + 100, "hello", 5), 0);
    CU_ASSERT_EQUAL(mg_segment_read(seg, 100, buf, 5, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(buf, "hello");
    CU_ASSERT_EQUAL(
        mg_segment_crc32c(seg, (uint8_t *)mg_segment_addr(seg) + 100, 5, &crc, why, sizeof(why)),
        0);
    CU_ASSERT_EQUAL(crc, mg_crc32c(0, "hello", 5));
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 0, 65536, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 65535, 2, why, sizeof(why)), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_segment_read(seg, 65535, buf, 2, why, sizeof(why)), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_segment_write(seg, UINT64_MAX, buf, 2, why, sizeof(why)), MG_ERR_RANGE);
    /* Listings: the daemon's file by its path, the kind by its number. */
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.source, MG_SEG_ANON);
    CU_ASSERT_EQUAL(strncmp(info.path, dir, strlen(dir)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(info.path, MG_SEG_FILE_PREFIX));
    CU_ASSERT_EQUAL(truncate(info.path, 4096), 0);
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 8192, 100, why, sizeof(why)), MG_ERR_DATA_LOSS);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "shorter than registered"));
    CU_ASSERT_EQUAL(mg_segment_read(seg, 8192, buf, 4, why, sizeof(why)), MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 0, 4096, why, sizeof(why)), 0);
    close_reg(reg);
}

/* A process's memory through its kind: the same calls reach this process's own buffer with
 * process_vm; inline and RDMA are refused by name; listings show no path. */
/* 8 KiB of this process's memory at mem, as process memory. */
static mg_segment_spec heap_spec(const char *mem)
{
    mg_segment_spec spec = {.tenant = "t",
                            .name = "heap",
                            .source = MG_SEG_PROCESS,
                            .size = 8192,
                            .client_addr = (uint64_t)(uintptr_t)mem,
                            .client = {getpid(), mg_proc_start_time(getpid())},
                            .caller_uid_known = 1,
                            .caller_uid = (uint32_t)getuid()};
    return spec;
}

static void test_process_memory_read_and_written(void)
{
    mg_registry *reg = open_reg();
    char *mem = calloc(1, 8192), buf[8] = "", why[MG_SEG_ERROR_MAX];
    mg_segment_spec spec = heap_spec(mem);
    mg_segment_info info;
    mg_segment *seg;
    uint32_t crc = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
    memcpy(mem + 10, "bytes", 5);
    seg = reg_map(reg, &spec);
    CU_ASSERT_PTR_NOT_NULL(mg_segment_procmem(seg));
    CU_ASSERT_EQUAL(mg_segment_read(seg, 10, buf, 5, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(buf, "bytes");
    CU_ASSERT_EQUAL(mg_segment_write(seg, 4000, "moved", 5, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(mem + 4000, "moved", 5), 0);
    /* No crc32c of its own: summed from what read copies out, in steps. */
    CU_ASSERT_EQUAL(mg_segment_crc32c(seg, (const uint8_t *)mem + 10, 5, &crc, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(crc, mg_crc32c(0, "bytes", 5));
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 0, 8192, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_segment_check_range(seg, 8000, 193, why, sizeof(why)), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_segment_allows(seg, MG_SEG_CAP_RDMA, why, sizeof(why)), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "process_vm"));
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.source, MG_SEG_PROCESS);
    CU_ASSERT_STRING_EQUAL(info.path, "");
    CU_ASSERT_EQUAL(info.transports[MG_TRANSPORT_TCP].registered, 0);
    close_reg(reg);
    free(mem);
}

/* A source no kind has is refused at reserve, naming the ones there are. */
static void test_unknown_source_is_refused(void)
{
    mg_registry *reg = open_reg();
    mg_segment_spec spec = {.tenant = "t", .name = "x", .source = (mg_seg_source)99, .size = 1};
    mg_segment *seg = NULL;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &spec, &seg, err), MG_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err, "source must be anon, shm, fd, process, dmabuf or staged");
    close_reg(reg);
}

/* Process memory is refused at registration where no path serves it, naming why: the
 * daemon's --process-memory=false (the setting named), remote access without a TCP data
 * plane, sharing. Remote-accessible with a data plane, it is a TCP target (not mapped here:
 * the data plane moves it with the kind's read and write). */
static void test_process_memory_refusals_and_target(void)
{
    char *mem = calloc(1, 8192), err[MG_SEG_ERROR_MAX];
    mg_registry_config cfg = {.shm_dir = dir,
                              .file_mode = 0600,
                              .max_segments = 16,
                              .max_registered_bytes = 1 << 24,
                              .process_memory_off = "process memory is off (--process-memory)"};
    mg_segment_spec spec = heap_spec(mem);
    mg_registry *reg = NULL;
    mg_segment *seg = NULL;
    mg_segment_info info;
    CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
    spec.remote_accessible = 1;
    snprintf(dir, sizeof(dir), "/tmp/mgkind-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &spec, &seg, err), MG_ERR_STATE);
    CU_ASSERT_STRING_EQUAL(err, "process memory is off (--process-memory)");
    close_reg(reg);

    reg = open_reg(); /* process memory on, no TCP data plane */
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &spec, &seg, err), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--data-listen"));
    spec.remote_accessible = 0;
    spec.share = "u";
    CU_ASSERT_EQUAL(mg_registry_reserve(reg, &spec, &seg, err), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "never shared"));
    close_reg(reg);

    cfg.process_memory_off = NULL;
    cfg.tcp_targets = 1;
    spec.share = NULL;
    spec.remote_accessible = 1;
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(strcpy(dir, "/tmp/mgkind-XXXXXX")));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    seg = reg_map(reg, &spec);
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL(info.transports[MG_TRANSPORT_TCP].registered, 1);
    CU_ASSERT_EQUAL(info.transports[MG_TRANSPORT_RDMA].registered, 0);
    CU_ASSERT_EQUAL(mg_segment_caps(seg) & MG_SEG_CAP_MAPPED, 0);
    CU_ASSERT_EQUAL(mg_segment_caps(seg) & MG_SEG_CAP_TCP, MG_SEG_CAP_TCP);
    /* the kinds the data plane moves in place: the mapped files */
    CU_ASSERT(mg_seg_source_caps(MG_SEG_ANON) & MG_SEG_CAP_MAPPED);
    CU_ASSERT(mg_seg_source_caps(MG_SEG_SHM) & MG_SEG_CAP_MAPPED);
    CU_ASSERT(mg_seg_source_caps(MG_SEG_FD) & MG_SEG_CAP_MAPPED);
    CU_ASSERT_FALSE(mg_seg_source_caps(MG_SEG_DMABUF) & MG_SEG_CAP_MAPPED);
    close_reg(reg);
    free(mem);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_every_kind_has_its_operations),
        MG_TEST(test_what_a_kind_lacks_is_named),
        MG_TEST(test_inline_refusals_name_the_memory),
        MG_TEST(test_a_mapped_file_read_and_written),
        MG_TEST(test_process_memory_read_and_written),
        MG_TEST(test_unknown_source_is_refused),
        MG_TEST(test_process_memory_refusals_and_target),
    };
    return mg_test_run("segment kinds", cases, sizeof(cases) / sizeof(cases[0]));
}
