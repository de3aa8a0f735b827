/*
 * A program written against Mooncake's C API, as TensorRT-LLM's transfer agent and NIXL's Mooncake
 * plugin are: it carries its own copy of the documented types and struct layouts (checked below,
 * x86-64 and aarch64 LP64), loads libtransfer_engine.so with dlopen (as TensorRT-LLM loads its
 * wrapper) and finds every function of transfer_engine_c.h by name.
 *
 *   te_harness LIB target SIZE [malloc|device]
 *       an engine (P2PHANDSHAKE) with SIZE bytes registered: a sealed memfd's mapping, malloc'd
 *       memory, or device memory of the CUDA driver ($MOONGATE_CUDA_LIB, location "*"); prints
 *       {"session": "host:port", "address": N}, then obeys stdin: "dump OFF LEN" (hex),
 *       "notifs" ([[name, msg], ...]: JSON strings, each byte outside printable ASCII as
 *       \u00XX), "quit".
 *   te_harness LIB initiator SESSION ADDRESS
 *       the calls those users make, against the target: one JSON object of outcomes on stdout.
 *   te_harness LIB loop SESSION ADDRESS SLOTS
 *       loops as a serving process does, as tests/integration/mooncake/loop.py: iteration i
 *       WRITEs 4 KiB of pattern i to slot i % SLOTS at ADDRESS with a notification ("loop", i),
 *       READs it back and compares; "ok I T" or "fail I T WHY" per iteration (T: the monotonic
 *       clock, seconds); a line on stdin stops it ("end").
 *   te_harness LIB polls N SIZE BATCH
 *       N copies of SIZE bytes between two regions of this engine (LOCAL_SEGMENT), BATCH tasks a
 *       submit, each task polled in a tight loop until it ends while a thread spins beside it:
 *       {"transfers", "completed", "torn" (COMPLETED with a count other than SIZE),
 *       "straddled" (tasks a poll saw not yet ended with all SIZE bytes), "polls"}.
 *   te_harness LIB nixl SOCKET_A SOCKET_B
 *       as NIXL's Mooncake plugin: an engine per agent (one on each daemon), openSegment both
 *       ways, WRITEs and READs both ways in tight polls, notifications both ways: one JSON
 *       object of outcomes.
 *   te_harness LIB device SESSION ADDRESS SIZE
 *       SIZE bytes of device memory ($MOONGATE_CUDA_LIB) filled with a pattern and registered
 *       (location "cuda:0"): WRITEs it all to ADDRESS, clears it, READs it back; one JSON object
 *       {"register", "write", "read", "same"}.
 *   te_harness LIB notify SESSION NAME_HEX MSG_HEX
 *       genNotifyInEngine of those bytes to SESSION; prints its return code.
 *   te_harness LIB latency SESSION ADDRESS N SIZE
 *       N WRITEs of SIZE bytes to ADDRESS, one at a time, each in a batch of its own
 *       (allocateBatchID(1), submitTransfer, getTransferStatus in a tight loop until it ends,
 *       freeBatchID), after 200 untimed: {"n", "size", "p50_us", "p99_us", "avg_us" (from just
 *       before submitTransfer to the poll that saw COMPLETED), "failed", "submit_avg_us" (the
 *       time submitTransfer took), "allocate_avg_us", "free_avg_us", "polls_avg"}.
 *
 * Environment: MOONGATE_SOCKET, as for any program using the library.
 */
#include <dlfcn.h>
#include <poll.h>
#include <time.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the documented types, copied (not included) ---- */
struct transfer_request {
    int opcode;
    void *source;
    int32_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};
struct notify_msg {
    char *name;
    char *msg;
};
struct buffer_entry {
    void *addr;
    size_t length;
};
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path, *subsystem_name, *proto, *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
_Static_assert(sizeof(struct transfer_request) == 40, "transfer_request");
_Static_assert(offsetof(struct transfer_request, source) == 8, "source");
_Static_assert(offsetof(struct transfer_request, target_id) == 16, "target_id");
_Static_assert(offsetof(struct transfer_request, target_offset) == 24, "target_offset");
_Static_assert(offsetof(struct transfer_request, length) == 32, "length");
_Static_assert(sizeof(struct transfer_status) == 16, "transfer_status");
_Static_assert(offsetof(struct transfer_status, transferred_bytes) == 8, "transferred_bytes");
_Static_assert(sizeof(struct notify_msg) == 16 && offsetof(struct notify_msg, msg) == 8, "notify");
_Static_assert(sizeof(struct buffer_entry) == 16, "buffer_entry");
_Static_assert(sizeof(struct segment_desc) == 48 && offsetof(struct segment_desc, desc_) == 8,
               "segment_desc");

#define OPCODE_READ      0
#define OPCODE_WRITE     1
#define STATUS_CANCELED  3
#define STATUS_COMPLETED 4
#define INVALID_BATCH    UINT64_MAX

typedef struct notify_msg notify_msg_t;
typedef void *engine_t;

/* ---- every function of the header, by name ---- */
static struct {
    engine_t (*createTransferEngine)(const char *, const char *, const char *, uint64_t, int);
    void (*destroyTransferEngine)(engine_t);
    int (*discoverTopology)(engine_t);
    int (*getLocalIpAndPort)(engine_t, char *, size_t);
    void *(*installTransport)(engine_t, const char *, void **);
    int (*uninstallTransport)(engine_t, const char *);
    int32_t (*openSegment)(engine_t, const char *);
    int32_t (*openSegmentNoCache)(engine_t, const char *);
    int (*closeSegment)(engine_t, int32_t);
    int (*removeLocalSegment)(engine_t, const char *);
    int (*syncSegmentCache)(engine_t);
    int (*registerLocalMemory)(engine_t, void *, size_t, const char *, int);
    int (*unregisterLocalMemory)(engine_t, void *);
    int (*registerLocalMemoryBatch)(engine_t, struct buffer_entry *, size_t, const char *);
    int (*unregisterLocalMemoryBatch)(engine_t, void **, size_t);
    uint64_t (*allocateBatchID)(engine_t, size_t);
    int (*submitTransfer)(engine_t, uint64_t, struct transfer_request *, size_t);
    int (*submitTransferWithNotify)(engine_t, uint64_t, struct transfer_request *, size_t,
                                    notify_msg_t);
    int (*getTransferStatus)(engine_t, uint64_t, size_t, struct transfer_status *);
    int (*freeBatchID)(engine_t, uint64_t);
    notify_msg_t *(*getNotifsFromEngine)(engine_t, int *);
    int (*freeNotifsMsgBuf)(notify_msg_t *, int);
    int (*genNotifyInEngine)(engine_t, uint64_t, notify_msg_t);
    int (*getNicLoadStats)(engine_t, void *, size_t *);
    void (*enableGracefulShutdown)(engine_t);
    int (*showLinks)(engine_t, char *, size_t, int);
    int (*warmupEfaSegment)(engine_t, const char *);
} te;

#define FN(name)                 \
    {                            \
#name, (void **)&te.name \
    }
static const struct {
    const char *name;
    void **slot;
} fns[] = {
    FN(createTransferEngine),
    FN(destroyTransferEngine),
    FN(discoverTopology),
    FN(getLocalIpAndPort),
    FN(installTransport),
    FN(uninstallTransport),
    FN(openSegment),
    FN(openSegmentNoCache),
    FN(closeSegment),
    FN(removeLocalSegment),
    FN(syncSegmentCache),
    FN(registerLocalMemory),
    FN(unregisterLocalMemory),
    FN(registerLocalMemoryBatch),
    FN(unregisterLocalMemoryBatch),
    FN(allocateBatchID),
    FN(submitTransfer),
    FN(submitTransferWithNotify),
    FN(getTransferStatus),
    FN(freeBatchID),
    FN(getNotifsFromEngine),
    FN(freeNotifsMsgBuf),
    FN(genNotifyInEngine),
    FN(getNicLoadStats),
    FN(enableGracefulShutdown),
    FN(showLinks),
    FN(warmupEfaSegment),
};

static int load(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return -1;
    }
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
        if ((*fns[i].slot = dlsym(h, fns[i].name)) == NULL) {
            fprintf(stderr, "missing: %s\n", fns[i].name);
            return -1;
        }
    return 0;
}

static char shm_names[4][64];
static int n_shm;

static void shm_cleanup(void)
{
    for (int i = 0; i < n_shm; i++)
        shm_unlink(shm_names[i]);
}

/* SIZE bytes of a shared file (shm_open), as programs sharing buffers between processes make
 * them; `keep`: its name stays until exit (else only the mapping holds it). */
static void *shared_memory(size_t size, int keep)
{
    char *name = shm_names[n_shm];
    int fd;
    void *p;
    snprintf(name, sizeof(shm_names[0]), "/te-harness-%d-%d", (int)getpid(), n_shm);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
        return NULL;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (keep && n_shm++ == 0)
        atexit(shm_cleanup);
    else if (!keep)
        shm_unlink(name);
    return p == MAP_FAILED ? NULL : p;
}

/* SIZE bytes of a memfd sealed against shrinking and growing, kept open: memory peers may
 * reach over RDMA too. */
static void *sealed_memory(size_t size)
{
    int fd = memfd_create("te-harness", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return NULL;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p; /* fd stays open, as a program keeps its memfd */
}

/* ---- device memory, from the CUDA driver ($MOONGATE_CUDA_LIB) ---- */
static struct {
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*set_current)(void *);
    int (*alloc)(uint64_t *, size_t);
    int (*htod)(uint64_t, const void *, size_t);
    int (*dtoh)(void *, uint64_t, size_t);
    int (*free)(uint64_t);
    int (*host_alloc)(void **, size_t, unsigned);
} cu;

/* SIZE bytes of device 0's memory, zeroed, or NULL (said on stderr). kind "pinned": page-locked
 * host memory from the driver (cuMemHostAlloc, what cudaHostAlloc makes); "freed": device memory
 * freed at once (a pointer the driver no longer knows). */
static void *device_memory(size_t size, const char *kind)
{
    const char *lib = getenv("MOONGATE_CUDA_LIB");
    void *h = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *ctx, *zero;
    uint64_t d = 0;
    int ok;
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return NULL;
    }
    *(void **)&cu.init = dlsym(h, "cuInit");
    *(void **)&cu.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.htod = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&cu.dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    *(void **)&cu.free = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.host_alloc = dlsym(h, "cuMemHostAlloc");
    zero = calloc(1, size);
    ok = cu.init && cu.retain && cu.set_current && cu.alloc && cu.htod && cu.dtoh && cu.free &&
         cu.host_alloc && zero && cu.init(0) == 0 && cu.retain(&ctx, 0) == 0 &&
         cu.set_current(ctx) == 0;
    if (ok && strcmp(kind, "pinned") == 0) {
        void *p = NULL;
        ok = cu.host_alloc(&p, size, 0) == 0;
        free(zero);
        if (!ok)
            fprintf(stderr, "pinned memory: the CUDA driver failed\n");
        return ok ? memset(p, 0, size) : NULL;
    }
    ok = ok && cu.alloc(&d, size) == 0 && cu.htod(d, zero, size) == 0 &&
         (strcmp(kind, "freed") != 0 || cu.free(d) == 0);
    free(zero);
    if (!ok)
        fprintf(stderr, "device memory: the CUDA driver failed\n");
    return ok ? (void *)(uintptr_t)d : NULL;
}

/* A C string as a JSON string, each byte outside printable ASCII as \u00XX (a notification's
 * bytes read back one for one). */
static void json_text(const char *t)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        if (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\')
            printf("\\u%04x", *p);
        else
            putchar(*p);
    putchar('"');
}

/* A target engine with `size` bytes of memory registered remote-accessible: a sealed memfd's
 * mapping, or malloc'd memory ("malloc"), device memory ("device"), page-locked host memory
 * ("pinned") or a freed device pointer ("freed") registered as TensorRT-LLM's and NIXL's
 * Mooncake backends register theirs (location "*"). */
static int target(size_t size, const char *kind)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    char where[128], line[256];
    int heap = strcmp(kind, "malloc") == 0, device = strcmp(kind, "device") == 0;
    int driver = device || strcmp(kind, "pinned") == 0 || strcmp(kind, "freed") == 0;
    uint8_t *mem = heap     ? calloc(1, size)
                   : driver ? device_memory(size, kind)
                            : sealed_memory(size);
    uint8_t *seen = device ? malloc(size) : mem;
    if (e == NULL || mem == NULL || seen == NULL ||
        te.getLocalIpAndPort(e, where, sizeof(where)) != 0 ||
        te.registerLocalMemory(e, mem, size, heap || driver ? "*" : "cpu:0", 1) != 0) {
        if (e != NULL)
            te.destroyTransferEngine(e);
        if (heap)
            free(mem);
        return 1;
    }
    printf("{\"session\": \"%s\", \"address\": %llu}\n", where, (unsigned long long)(uintptr_t)mem);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        size_t off, len;
        if (sscanf(line, "dump %zu %zu", &off, &len) == 2 && off + len <= size) {
            if (device && cu.dtoh(seen, (uintptr_t)mem, size) != 0)
                memset(seen, 0, size);
            for (size_t i = 0; i < len; i++)
                printf("%02x", seen[off + i]);
            printf("\n");
        } else if (strncmp(line, "notifs", 6) == 0) {
            int n = 0;
            notify_msg_t *m = te.getNotifsFromEngine(e, &n);
            printf("[");
            for (int i = 0; i < n; i++) {
                printf("%s[", i ? ", " : "");
                json_text(m[i].name);
                printf(", ");
                json_text(m[i].msg);
                printf("]");
            }
            printf("]\n");
            te.freeNotifsMsgBuf(m, n);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
        fflush(stdout);
    }
    te.destroyTransferEngine(e);
    if (heap)
        free(mem);
    if (device)
        free(seen);
    return 0;
}

/* Polls every task of a batch until each is terminal; returns how many completed. */
static size_t wait_tasks(engine_t e, uint64_t batch, size_t n, unsigned long *polls)
{
    size_t done = 0;
    for (size_t k = 0; k < n; k++) {
        struct transfer_status s = {0};
        do { /* the tight loop callers write: no call to the daemon per poll */
            if (te.getTransferStatus(e, batch, k, &s) != 0)
                return done;
            (*polls)++;
        } while (s.status < 3);
        done += s.status == STATUS_COMPLETED;
    }
    return done;
}

#define OUT(key, fmt, ...) printf("%s\"%s\": " fmt, first++ ? ", " : "{", key, __VA_ARGS__)

static int initiator(const char *session, uint64_t taddr)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    size_t size = 1 << 20, first = 0;
    uint8_t *src = shared_memory(size, 1), *dst = shared_memory(size, 0), *heap = malloc(65536);
    struct transfer_request r[8];
    struct transfer_status st;
    unsigned long polls = 0;
    char where[128];
    int32_t seg;
    uint64_t b;
    if (e == NULL || src == NULL || dst == NULL || heap == NULL) {
        free(heap);
        return 1;
    }
    for (size_t i = 0; i < size; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    OUT("where", "%d",
        te.getLocalIpAndPort(e, where, sizeof(where)) == 0 &&
            strncmp(where, "127.0.0.1:", 10) == 0);
    OUT("register", "%d", te.registerLocalMemory(e, src, size, "cpu:0", 1));
    OUT("register_batch", "%d",
        te.registerLocalMemoryBatch(e, (struct buffer_entry[]){{dst, size}, {heap, 65536}}, 2,
                                    "*"));
    OUT("overlap", "%d", te.registerLocalMemory(e, src + 4096, 4096, "cpu:0", 1));
    seg = te.openSegment(e, session);
    OUT("open", "%d", seg >= 1 && te.openSegment(e, session) == seg);
    OUT("open_unknown", "%d", te.openSegment(e, "127.0.0.1:1"));
    OUT("open_unreachable", "%d", te.openSegment(e, "127.0.0.2:9")); /* no daemon there */
    OUT("transport", "%d", te.installTransport(e, "rdma", NULL) != NULL);

    /* one batch filled by two submits: tasks 0-1, then 2-3 */
    b = te.allocateBatchID(e, 4);
    for (int i = 0; i < 4; i++)
        r[i] =
            (struct transfer_request){OPCODE_WRITE, src + i * 65536, seg, taddr + i * 65536, 65536};
    OUT("submit_1", "%d", te.submitTransfer(e, b, r, 2));
    OUT("submit_2", "%d", te.submitTransfer(e, b, r + 2, 2));
    OUT("too_many", "%d", te.submitTransfer(e, b, r, 1));
    OUT("completed", "%zu", wait_tasks(e, b, 4, &polls));
    OUT("bytes", "%d", te.getTransferStatus(e, b, 3, &st) == 0 ? (int)st.transferred_bytes : -1);
    OUT("task_out_of_range", "%d", te.getTransferStatus(e, b, 4, &st));
    OUT("free", "%d", te.freeBatchID(e, b));
    OUT("free_again", "%d", te.freeBatchID(e, b));

    /* read it all back, in one submit of four */
    b = te.allocateBatchID(e, 4);
    for (int i = 0; i < 4; i++)
        r[i] = (struct transfer_request){OPCODE_READ, dst + (3 - i) * 65536, seg, taddr + i * 65536,
                                         65536};
    OUT("read", "%d", te.submitTransfer(e, b, r, 4));
    OUT("read_completed", "%zu", wait_tasks(e, b, 4, &polls));
    OUT("read_same", "%d",
        memcmp(dst, src + 3 * 65536, 65536) == 0 && memcmp(dst + 3 * 65536, src, 65536) == 0);
    te.freeBatchID(e, b);

    /* memory of no shared file (malloc): the local side of a transfer */
    memset(heap, 0x5a, 65536);
    b = te.allocateBatchID(e, 1);
    r[0] = (struct transfer_request){OPCODE_WRITE, heap, seg, taddr + 5 * 65536, 65536};
    OUT("heap_write", "%d", te.submitTransfer(e, b, r, 1));
    OUT("heap_completed", "%zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);

    /* a WRITE and a READ in one submit (requests, not one group) */
    b = te.allocateBatchID(e, 2);
    r[0] = (struct transfer_request){OPCODE_WRITE, src, seg, taddr + 7 * 65536, 4096};
    r[1] = (struct transfer_request){OPCODE_READ, dst + 7 * 65536, seg, taddr, 4096};
    OUT("mixed", "%d", te.submitTransfer(e, b, r, 2));
    OUT("mixed_completed", "%zu", wait_tasks(e, b, 2, &polls));
    OUT("mixed_same", "%d", memcmp(dst + 7 * 65536, src, 4096) == 0);
    te.freeBatchID(e, b);

    /* notifications: with a batch, and on their own */
    b = te.allocateBatchID(e, 1);
    r[0] = (struct transfer_request){OPCODE_WRITE, src, seg, taddr + 6 * 65536, 4096};
    OUT("notify_submit", "%d",
        te.submitTransferWithNotify(e, b, r, 1, (notify_msg_t){"kv-7", "written"}));
    OUT("notify_completed", "%zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);
    OUT("gen_notify", "%d", te.genNotifyInEngine(e, (uint64_t)seg, (notify_msg_t){"gen", "hello"}));
    /* bytes that are not UTF-8 (a pickled message, as NIXL's first notification is) */
    b = te.allocateBatchID(e, 1);
    r[0] = (struct transfer_request){OPCODE_WRITE, src, seg, taddr + 6 * 65536, 4096};
    OUT("notify_binary", "%d",
        te.submitTransferWithNotify(e, b, r, 1,
                                    (notify_msg_t){"bin", "\x80\x04\x95pickle\xff\x01."}));
    OUT("notify_binary_completed", "%zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);
    OUT("gen_binary", "%d",
        te.genNotifyInEngine(e, (uint64_t)seg, (notify_msg_t){"\xc3\x28", "\xfe\xff text"}));
    OUT("gen_unknown_segment", "%d",
        te.genNotifyInEngine(e, 99, (notify_msg_t){"gen", "to nobody"}));
    OUT("gen_no_engine", "%d", te.genNotifyInEngine(NULL, 1, (notify_msg_t){"gen", "x"}));

    /* refusals */
    b = te.allocateBatchID(e, 2);
    r[0] = (struct transfer_request){OPCODE_WRITE, (uint8_t *)&polls, seg, taddr, 8};
    OUT("unregistered_source", "%d", te.submitTransfer(e, b, r, 1));
    r[0] = (struct transfer_request){OPCODE_WRITE, src, 99, taddr, 8};
    OUT("unknown_segment", "%d", te.submitTransfer(e, b, r, 1));
    r[0] = (struct transfer_request){7, src, seg, taddr, 8};
    OUT("bad_opcode", "%d", te.submitTransfer(e, b, r, 1));
    r[0] = (struct transfer_request){OPCODE_WRITE, src, seg, taddr + size - 8, 4096};
    OUT("past_the_region", "%d", te.submitTransfer(e, b, r, 1));
    OUT("past_the_region_state", "%zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);
    b = te.allocateBatchID(e, 1); /* its notification is not sent: said so */
    OUT("notify_after_failure", "%d",
        te.submitTransferWithNotify(e, b, r, 1, (notify_msg_t){"kv-8", "never"}));
    OUT("notify_after_failure_state", "%zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);
    OUT("forged_batch", "%d", te.getTransferStatus(e, 0x1234567800000001ull, 0, &st));
    OUT("polls", "%lu", polls);
    te.enableGracefulShutdown(e);
    OUT("no_meaning", "%d",
        te.getNicLoadStats(e, NULL, &(size_t){8}) == -1 &&
            te.showLinks(e, where, sizeof(where), 1) == -1 && te.warmupEfaSegment(e, session) == 0);
    {
        int n = -1;
        notify_msg_t *m = te.getNotifsFromEngine(e, &n); /* none came to this engine */
        OUT("no_notifs", "%d", m == NULL && n == 0);
        te.freeNotifsMsgBuf(m, n);
    }
    OUT("unregister", "%d", te.unregisterLocalMemoryBatch(e, (void *[]){src, dst, heap}, 3));
    OUT("unregister_again", "%d", te.unregisterLocalMemory(e, src));
    printf("}\n");
    te.destroyTransferEngine(e);
    free(heap);
    return 0;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One task of a new batch (with a notification when note is not NULL); 0 when it completed. */
static int one_task(engine_t e, int op, uint8_t *local, int32_t seg, uint64_t remote,
                    const char *note)
{
    struct transfer_request r = {op, local, seg, remote, 4096};
    unsigned long polls = 0;
    uint64_t b = te.allocateBatchID(e, 1);
    int rc;
    if (b == INVALID_BATCH)
        return -1;
    rc = note ? te.submitTransferWithNotify(e, b, &r, 1, (notify_msg_t){"loop", (char *)note})
              : te.submitTransfer(e, b, &r, 1);
    if (rc == 0)
        rc = wait_tasks(e, b, 1, &polls) == 1 ? 0 : -1;
    te.freeBatchID(e, b);
    return rc;
}

/* Reads the test's next line (its go-ahead); 0, or -1 when stdin ended. */
static int next_line(void)
{
    char line[64];
    return fgets(line, sizeof(line), stdin) ? 0 : -1;
}

/* Memory a transfer holds, its peer's daemon frozen by the test between the lines it sends:
 * unregisterLocalMemory fails and the memory stays registered; once the transfer ended it
 * goes. Prints a line per step (ready, submitted, held, after). */
static int held(const char *session, uint64_t taddr)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    size_t size = 1 << 20;
    uint8_t *src = malloc(size);
    unsigned long polls = 0;
    int32_t seg;
    uint64_t b;
    int rc = 1;
    if (e == NULL || src == NULL)
        goto out;
    memset(src, 0x6b, size);
    seg = te.registerLocalMemory(e, src, size, "cpu:0", 1) == 0 ? te.openSegment(e, session) : -1;
    printf("ready %d\n", seg >= 0 ? one_task(e, OPCODE_WRITE, src, seg, taddr, NULL) : -1);
    fflush(stdout);
    if (seg < 0 || next_line() != 0) /* the test freezes the peer's daemon */
        goto out;
    b = te.allocateBatchID(e, 1);
    printf("submitted %d\n",
           te.submitTransfer(e, b, &(struct transfer_request){OPCODE_WRITE, src, seg, taddr, size},
                             1));
    fflush(stdout);
    if (next_line() != 0) /* the daemon holds the memory for the batch now */
        goto out;
    printf("held %d", te.unregisterLocalMemory(e, src));
    printf(" %d\n", te.unregisterLocalMemory(e, src));
    fflush(stdout);
    if (next_line() != 0) /* the peer's daemon resumed */
        goto out;
    printf("after %zu", wait_tasks(e, b, 1, &polls));
    te.freeBatchID(e, b);
    printf(" %d", te.unregisterLocalMemory(e, src));
    printf(" %d\n", te.unregisterLocalMemory(e, src));
    rc = 0;
out:
    if (e != NULL)
        te.destroyTransferEngine(e);
    free(src);
    return rc;
}

static int loop(const char *session, uint64_t taddr, unsigned slots)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    uint8_t *buf = shared_memory(8192, 0);
    struct pollfd in = {.fd = 0, .events = POLLIN};
    int32_t seg;
    if (e == NULL || buf == NULL || te.registerLocalMemory(e, buf, 8192, "cpu:0", 1) != 0 ||
        (seg = te.openSegment(e, session)) < 0) {
        printf("fail -1 %f initialize\n", mono_s());
        return 1;
    }
    for (uint32_t i = 0; poll(&in, 1, 0) == 0; i++) {
        uint64_t peer = taddr + (uint64_t)(i % slots) * 4096;
        const char *why = NULL;
        char note[16];
        for (size_t k = 0; k < 4096; k += 4)
            memcpy(buf + k, &i, 4); /* pattern i: i, little-endian, over and over */
        snprintf(note, sizeof(note), "%u", i);
        if (one_task(e, OPCODE_WRITE, buf, seg, peer, note) != 0)
            why = "write";
        else if (one_task(e, OPCODE_READ, buf + 4096, seg, peer, NULL) != 0)
            why = "read";
        else if (memcmp(buf, buf + 4096, 4096) != 0)
            why = "compare";
        if (why == NULL) {
            printf("ok %u %f\n", i, mono_s());
        } else {
            printf("fail %u %f %s\n", i, mono_s(), why);
            usleep(20000); /* a daemon on its way back: no hot loop */
        }
        fflush(stdout);
    }
    te.destroyTransferEngine(e);
    printf("end\n");
    return 0;
}

static int spinning; /* atomic: the main thread ends the spin */

static void *spin(void *arg)
{
    while (__atomic_load_n(&spinning, __ATOMIC_RELAXED)) /* a busy CPU beside the polls: the threads
                                                            they wait for are preempted */
        ;
    return NULL;
}

/* One task of batch b polled until it ends; counts what the polls saw. Returns its status. */
static int poll_task(engine_t e, uint64_t b, size_t k, uint64_t size, unsigned long *polls,
                     unsigned long *torn, unsigned long *straddled)
{
    struct transfer_status s;
    int saw_all = 0;
    do {
        if (te.getTransferStatus(e, b, k, &s) != 0)
            return -1;
        (*polls)++;
        if (s.status < STATUS_CANCELED && s.transferred_bytes == size)
            saw_all = 1; /* the count came in before the status did */
    } while (s.status < STATUS_CANCELED);
    *torn += s.status == STATUS_COMPLETED && s.transferred_bytes != size;
    *straddled += saw_all;
    return s.status;
}

static int polls(unsigned long n, uint64_t size, size_t batch)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    size_t room = (size_t)size * batch * 2;
    uint8_t *src = shared_memory(room, 1), *dst = shared_memory(room, 1);
    unsigned long done = 0, completed = 0, torn = 0, straddled = 0, npolls = 0;
    struct transfer_request r[64];
    pthread_t spinner;
    if (e == NULL || src == NULL || dst == NULL || batch == 0 || batch > 64 ||
        te.registerLocalMemory(e, src, room, "cpu:0", 1) != 0 ||
        te.registerLocalMemory(e, dst, room, "cpu:0", 1) != 0)
        return 1;
    __atomic_store_n(&spinning, 1, __ATOMIC_RELAXED);
    if (pthread_create(&spinner, NULL, spin, NULL) != 0)
        return 1;
    while (done < n) {
        size_t m = n - done < batch ? (size_t)(n - done) : batch;
        uint64_t b = te.allocateBatchID(e, m);
        for (size_t k = 0; k < m; k++) {
            size_t off = (size_t)(((done + k) % (2 * batch)) * size);
            r[k] = (struct transfer_request){OPCODE_WRITE, src + off, 0,
                                             (uint64_t)(uintptr_t)(dst + off), size};
        }
        if (b == INVALID_BATCH || te.submitTransfer(e, b, r, m) != 0)
            break;
        for (size_t k = 0; k < m; k++)
            completed += poll_task(e, b, k, size, &npolls, &torn, &straddled) == STATUS_COMPLETED;
        te.freeBatchID(e, b);
        done += m;
    }
    __atomic_store_n(&spinning, 0, __ATOMIC_RELAXED);
    pthread_join(spinner, NULL);
    printf("{\"transfers\": %lu, \"completed\": %lu, \"torn\": %lu, \"straddled\": %lu, "
           "\"polls\": %lu}\n",
           done, completed, torn, straddled, npolls);
    te.destroyTransferEngine(e);
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

#define LATENCY_WARMUP 200

/* One WRITE of SIZE bytes at a time, as a serving system makes it: allocateBatchID(1),
 * submitTransfer, getTransferStatus in a tight loop until the task ends, freeBatchID. Each
 * iteration's time runs from just before submitTransfer to the poll that saw it COMPLETED;
 * allocateBatchID and freeBatchID (no call to the daemon) are timed on their own. */
static int latency(const char *session, uint64_t taddr, unsigned long n, uint64_t size)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    uint8_t *src = size > 0 ? shared_memory(size, 1) : NULL;
    uint64_t *ns = n > 0 && n <= 10000000 ? calloc(n, sizeof(*ns)) : NULL;
    uint64_t alloc_ns = 0, submit_ns = 0, free_ns = 0, sum = 0;
    unsigned long got = 0, failed = 0, polls = 0;
    int32_t seg;
    if (e == NULL || src == NULL || ns == NULL ||
        te.registerLocalMemory(e, src, size, "cpu:0", 1) != 0 ||
        (seg = te.openSegment(e, session)) < 0) {
        fprintf(stderr, "latency: the engine, its memory or the segment %s failed\n", session);
        free(ns);
        return 1;
    }
    memset(src, 0x6b, size);
    for (unsigned long i = 0; i < n + LATENCY_WARMUP; i++) {
        struct transfer_request r = {OPCODE_WRITE, src, seg, taddr, size};
        struct transfer_status s = {0};
        uint64_t t0 = mono_ns(), t1, ts = 0, t2, t3;
        uint64_t b = te.allocateBatchID(e, 1);
        int ok = b != INVALID_BATCH;
        t1 = mono_ns();
        if (ok && te.submitTransfer(e, b, &r, 1) == 0) {
            ts = mono_ns();
            do /* the tight loop callers write */
                polls++;
            while (te.getTransferStatus(e, b, 0, &s) == 0 && s.status < STATUS_CANCELED);
        }
        t2 = mono_ns();
        ok = ok && s.status == STATUS_COMPLETED;
        if (b != INVALID_BATCH && te.freeBatchID(e, b) != 0)
            ok = 0;
        t3 = mono_ns();
        if (i < LATENCY_WARMUP)
            continue;
        if (!ok) {
            failed++;
            continue;
        }
        ns[got++] = t2 - t1;
        sum += t2 - t1;
        alloc_ns += t1 - t0;
        submit_ns += ts - t1;
        free_ns += t3 - t2;
    }
    qsort(ns, got, sizeof(*ns), cmp_u64);
    printf("{\"n\": %lu, \"size\": %llu, \"p50_us\": %.1f, \"p99_us\": %.1f, \"avg_us\": %.1f, "
           "\"failed\": %lu, \"submit_avg_us\": %.1f, \"allocate_avg_us\": %.3f, "
           "\"free_avg_us\": %.3f, \"polls_avg\": %.1f}\n",
           got, (unsigned long long)size, got ? (double)ns[got / 2] / 1e3 : 0,
           got ? (double)ns[got * 99 / 100] / 1e3 : 0, got ? (double)sum / (double)got / 1e3 : 0,
           failed, got ? (double)submit_ns / (double)got / 1e3 : 0,
           got ? (double)alloc_ns / (double)got / 1e3 : 0,
           got ? (double)free_ns / (double)got / 1e3 : 0,
           (double)polls / (double)(n + LATENCY_WARMUP));
    free(ns);
    te.destroyTransferEngine(e);
    return failed ? 1 : 0;
}

/* One task to its end (tight polls): 1 when COMPLETED. */
static int move_polled(engine_t e, int op, void *src, int seg, uint64_t addr, size_t len)
{
    uint64_t b = te.allocateBatchID(e, 1);
    unsigned long polls = 0;
    struct transfer_request r = {op, src, seg, addr, len};
    int ok = b != INVALID_BATCH && te.submitTransfer(e, b, &r, 1) == 0 &&
             wait_tasks(e, b, 1, &polls) == 1;
    te.freeBatchID(e, b);
    return ok;
}

/* The first notification engine e gets within 10 s, printed as JSON [name, msg], or null. */
static void first_note(engine_t e)
{
    for (int i = 0; i < 10000; i++) {
        int n = 0;
        notify_msg_t *m = te.getNotifsFromEngine(e, &n);
        if (n > 0) {
            printf("[");
            json_text(m[0].name);
            printf(", ");
            json_text(m[0].msg);
            printf("]");
            te.freeNotifsMsgBuf(m, n);
            return;
        }
        usleep(1000);
    }
    printf("null");
}

/* Device memory as the local side: WRITE a pattern to the target, clear, READ it back. */
static int device(const char *session, uint64_t taddr, size_t size)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 1);
    uint8_t *d = device_memory(size, "device"), *host = malloc(size), *back = calloc(1, size);
    int first = 0, seg;
    if (e == NULL || d == NULL || host == NULL || back == NULL)
        return 1;
    for (size_t i = 0; i < size; i++)
        host[i] = (uint8_t)(i * 7 + 3);
    OUT("register", "%d", te.registerLocalMemory(e, d, size, "cuda:0", 1));
    seg = te.openSegment(e, session);
    OUT("write", "%d",
        cu.htod((uintptr_t)d, host, size) == 0 &&
            move_polled(e, OPCODE_WRITE, d, seg, taddr, size));
    OUT("read", "%d",
        cu.htod((uintptr_t)d, back, size) == 0 && move_polled(e, OPCODE_READ, d, seg, taddr, size));
    OUT("same", "%d", cu.dtoh(back, (uintptr_t)d, size) == 0 && memcmp(back, host, size) == 0);
    OUT("unregister", "%d", te.unregisterLocalMemory(e, d));
    printf("}\n");
    te.destroyTransferEngine(e);
    free(host);
    free(back);
    return 0;
}

/* As NIXL's Mooncake plugin runs its agents: an engine per agent (here two, one on each daemon,
 * in one process, as NIXL's own example makes them), each registering its memory, openSegment
 * both ways, WRITEs and READs both ways polled in a tight loop, notifications both ways (NIXL's
 * first is a pickled message: bytes that are not UTF-8). One JSON object of outcomes. */
static int nixl(const char *sock_a, const char *sock_b)
{
    size_t size = 1 << 20, first = 0;
    engine_t ea, eb;
    uint8_t *ma, *mb;
    char na[128], nb[128];
    int sa, sb;
    setenv("MOONGATE_SOCKET", sock_a, 1);
    ea = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    setenv("MOONGATE_SOCKET", sock_b, 1);
    eb = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    ma = sealed_memory(size);
    mb = sealed_memory(size);
    if (ea == NULL || eb == NULL || ma == NULL || mb == NULL ||
        te.getLocalIpAndPort(ea, na, sizeof(na)) != 0 ||
        te.getLocalIpAndPort(eb, nb, sizeof(nb)) != 0)
        return 1;
    for (size_t i = 0; i < size; i++) {
        ma[i] = (uint8_t)(i * 7 + 3);
        mb[i] = (uint8_t)(i * 5 + 1);
    }
    OUT("register_a", "%d", te.registerLocalMemory(ea, ma, size, "*", 1));
    OUT("register_b", "%d", te.registerLocalMemory(eb, mb, size, "*", 1));
    sb = te.openSegment(ea, nb); /* each agent opens the other */
    sa = te.openSegment(eb, na);
    OUT("open_both", "%d", sa >= 1 && sb >= 1);
    /* A writes its first 64 KiB into B's second; B writes its first into A's second */
    OUT("write_ab", "%d",
        move_polled(ea, OPCODE_WRITE, ma, sb, (uint64_t)(uintptr_t)(mb + 65536), 65536));
    OUT("write_ba", "%d",
        move_polled(eb, OPCODE_WRITE, mb, sa, (uint64_t)(uintptr_t)(ma + 65536), 65536));
    OUT("landed_ab", "%d", memcmp(mb + 65536, ma, 65536) != 0 ? 0 : 1);
    /* A reads B's third 64 KiB into its fourth */
    OUT("read_ab", "%d",
        move_polled(ea, OPCODE_READ, ma + 3 * 65536, sb, (uint64_t)(uintptr_t)(mb + 2 * 65536),
                    65536));
    OUT("read_same", "%d", memcmp(ma + 3 * 65536, mb + 2 * 65536, 65536) == 0);
    OUT("notify_ab", "%d",
        te.genNotifyInEngine(ea, (uint64_t)sb, (notify_msg_t){"agent-a", "\x80\x04\x95pickled"}));
    OUT("notify_ba", "%d",
        te.genNotifyInEngine(eb, (uint64_t)sa, (notify_msg_t){"agent-b", "ack"}));
    printf(", \"note_at_b\": ");
    first_note(eb);
    printf(", \"note_at_a\": ");
    first_note(ea);
    printf("}\n");
    te.destroyTransferEngine(ea);
    te.destroyTransferEngine(eb);
    return 0;
}

/* hex to a C string (malloc'd), or NULL */
static char *unhex(const char *h)
{
    size_t n = strlen(h) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; out != NULL && i < n; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) {
            free(out);
            return NULL;
        }
        out[i] = (char)v;
    }
    if (out != NULL)
        out[n] = '\0';
    return out;
}

/* genNotifyInEngine of NAME and MSG (hex) to SESSION; prints its return code. */
static int notify(const char *session, const char *name_hex, const char *msg_hex)
{
    engine_t e = te.createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    char *name = unhex(name_hex), *msg = unhex(msg_hex);
    int seg = e ? te.openSegment(e, session) : -1, rc = 1;
    if (seg >= 0 && name != NULL && msg != NULL) {
        printf("%d\n", te.genNotifyInEngine(e, (uint64_t)seg, (notify_msg_t){name, msg}));
        rc = 0;
    }
    free(name);
    free(msg);
    if (e != NULL)
        te.destroyTransferEngine(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4 || load(argv[1]) != 0) {
        fprintf(stderr, "usage: te_harness LIB target SIZE [malloc|device] | "
                        "LIB device SESSION ADDRESS SIZE | "
                        "LIB initiator SESSION ADDRESS | LIB held SESSION ADDRESS | "
                        "LIB loop SESSION ADDRESS SLOTS | LIB polls N SIZE BATCH | "
                        "LIB notify SESSION NAME_HEX MSG_HEX | "
                        "LIB latency SESSION ADDRESS N SIZE\n");
        return 2;
    }
    if (strcmp(argv[2], "target") == 0)
        return target(strtoull(argv[3], NULL, 0), argc > 4 ? argv[4] : "memfd");
    if (strcmp(argv[2], "device") == 0 && argc > 5)
        return device(argv[3], strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0));
    if (strcmp(argv[2], "initiator") == 0 && argc > 4)
        return initiator(argv[3], strtoull(argv[4], NULL, 0));
    if (strcmp(argv[2], "held") == 0 && argc > 4)
        return held(argv[3], strtoull(argv[4], NULL, 0));
    if (strcmp(argv[2], "loop") == 0 && argc > 5)
        return loop(argv[3], strtoull(argv[4], NULL, 0), (unsigned)strtoul(argv[5], NULL, 0));
    if (strcmp(argv[2], "nixl") == 0 && argc > 4)
        return nixl(argv[3], argv[4]);
    if (strcmp(argv[2], "notify") == 0 && argc > 5)
        return notify(argv[3], argv[4], argv[5]);
    if (strcmp(argv[2], "latency") == 0 && argc > 6)
        return latency(argv[3], strtoull(argv[4], NULL, 0), strtoul(argv[5], NULL, 0),
                       strtoull(argv[6], NULL, 0));
    if (strcmp(argv[2], "polls") == 0 && argc > 5)
        return polls(strtoul(argv[3], NULL, 0), strtoull(argv[4], NULL, 0),
                     strtoul(argv[5], NULL, 0));
    return 2;
}
