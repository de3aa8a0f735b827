/*
 * A CUDA driver emulator for tests: a shared library exporting the driver API names moongate's
 * client library resolves (with their ABI suffixes), so that the GPU paths run on machines
 * without a GPU. The client library loads it only through its dlopen seam ($MOONGATE_CUDA_LIB);
 * nothing in moongate knows it.
 *
 * What it emulates, as the driver behaves:
 *   devices   MG_CUDA_EMU_DEVICES of them (default 1; 0: cuInit fails CUDA_ERROR_NO_DEVICE),
 *             each with a primary context; DMA_BUF_SUPPORTED 1 (MG_CUDA_EMU_DMABUF=0: 0)
 *   contexts  current per thread; copies and allocations need one (CUDA_ERROR_INVALID_CONTEXT)
 *   pinned    cuMemHostAlloc maps page-locked host memory (plain memory of the process, as the
 *             driver's is); cuPointerGetAttribute knows it and cuMemHostRegister's ranges as
 *             host memory (MEMORY_TYPE HOST)
 *   memory    device memory lies in an address range reserved PROT_NONE in the process: a
 *             device pointer is not host memory (touching it faults; process_vm_readv of it
 *             fails), as with a GPU. Each allocation is a memfd the emulator maps a second time
 *             where only it looks, and copies go through that mapping.
 *   copies    real memcpy, on a thread per stream in the order they were queued (the legacy
 *             default stream, 0, has one too); events complete in order with the stream, and
 *             host functions (cuLaunchHostFunc) run there in order too;
 *             a copy's error is reported by the stream's next synchronization and by the
 *             events recorded after it, as the driver's asynchronous errors are (it is not
 *             sticky: the stream's synchronization clears it)
 *   dma-buf   cuMemGetHandleForAddressRange(DMA_BUF_FD) of a page-aligned range inside one
 *             allocation: a new descriptor of the allocation's memfd opened read-only (a daemon
 *             that tried to map it for writing would fail), its file position set to the range's
 *             offset in the allocation (the verbs emulator's ibv_reg_dmabuf_mr reads it there,
 *             as a NIC reaches the range a real dma-buf exports)
 *   pace      MG_CUDA_EMU_COPY_US=N: each copy on a stream takes N microseconds more (a slow
 *             PCIe link), so that what orders work on streams shows
 *   failures  MG_CUDA_EMU_FAIL="NAME:N[:CODE]" makes the N-th call of NAME (an exported name, or
 *             "copy" for the N-th copy executed on a stream) fail with CODE (default 700,
 *             CUDA_ERROR_ILLEGAL_ADDRESS)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct emu_ctx *CUcontext;
typedef struct emu_stream *CUstream;
typedef struct emu_event *CUevent;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* The driver API this emulator exports (the names and ABI versions the driver's are). */
#define EXPORT_API                                                                                \
    CUresult cuInit(unsigned int);                                                                \
    CUresult cuDriverGetVersion(int *);                                                           \
    CUresult cuGetErrorName(CUresult, const char **);                                             \
    CUresult cuGetErrorString(CUresult, const char **);                                           \
    CUresult cuDeviceGetCount(int *);                                                             \
    CUresult cuDeviceGet(CUdevice *, int);                                                        \
    CUresult cuDeviceGetAttribute(int *, int, CUdevice);                                          \
    CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);                                     \
    CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);                                              \
    CUresult cuCtxGetCurrent(CUcontext *);                                                        \
    CUresult cuCtxSetCurrent(CUcontext);                                                          \
    CUresult cuCtxPushCurrent_v2(CUcontext);                                                      \
    CUresult cuCtxPopCurrent_v2(CUcontext *);                                                     \
    CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);                                                \
    CUresult cuMemFree_v2(CUdeviceptr);                                                           \
    CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);                       \
    CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);                                     \
    CUresult cuMemGetHandleForAddressRange(void *, CUdeviceptr, size_t, int, unsigned long long); \
    CUresult cuMemHostRegister_v2(void *, size_t, unsigned int);                                  \
    CUresult cuMemHostUnregister(void *);                                                         \
    CUresult cuMemHostAlloc(void **, size_t, unsigned int);                                       \
    CUresult cuMemFreeHost(void *);                                                               \
    CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);                         \
    CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);                   \
    CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);                                        \
    CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);                                  \
    CUresult cuStreamCreate(CUstream *, unsigned int);                                            \
    CUresult cuStreamDestroy_v2(CUstream);                                                        \
    CUresult cuStreamSynchronize(CUstream);                                                       \
    CUresult cuEventCreate(CUevent *, unsigned int);                                              \
    CUresult cuEventDestroy_v2(CUevent);                                                          \
    CUresult cuEventRecord(CUevent, CUstream);                                                    \
    CUresult cuEventQuery(CUevent);                                                               \
    CUresult cuEventSynchronize(CUevent);                                                         \
    CUresult cuLaunchHostFunc(CUstream, void (*)(void *), void *);
EXPORT_API

#define MAX_DEVICES 8
#define MAX_ALLOCS  4096
#define RESERVE     (64ULL << 30) /* the emulated address space of all devices */
#define PAGE        4096ULL

struct emu_ctx {
    int device;
};

typedef struct alloc {
    CUdeviceptr base;
    size_t size;
    int fd;       /* its memfd */
    char *shadow; /* the emulator's own mapping of it */
    int device;
} alloc;

typedef struct op {
    enum { OP_COPY, OP_EVENT, OP_HOST } kind;
    void *dst;
    const void *src;
    size_t n;
    CUevent ev;
    void (*fn)(void *); /* OP_HOST: a host function, run on the stream's thread */
    void *arg;
    struct op *next;
} op;

struct emu_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    int busy, stop;
    CUresult error; /* the first error of a copy, reported by the next synchronization */
    pthread_t thread;
};

struct emu_event {
    int recorded, done;
    CUresult error; /* its stream's copy error when it completed */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static int initialized, n_devices = 1, dmabuf_ok = 1;
static unsigned copy_us; /* MG_CUDA_EMU_COPY_US: a stream copy takes at least this long */
static struct emu_ctx primary[MAX_DEVICES];
static char *space; /* the reserved device address range */
static CUdeviceptr next_addr;
static alloc allocs[MAX_ALLOCS];
static int n_allocs;
static struct {
    void *p;
    size_t n;
    int allocated; /* cuMemHostAlloc's: the emulator's mapping, unmapped by cuMemFreeHost */
} host_regs[256];
static struct emu_stream default_stream;
static __thread CUcontext current;

/* ---- failure injection ---- */

static char fail_name[128];
static long fail_at;
static int fail_code = CUDA_ERROR_ILLEGAL_ADDRESS;
static long calls_seen;

static void read_failures(void)
{
    const char *f = getenv("MG_CUDA_EMU_FAIL");
    char buf[128], *colon;
    if (f == NULL || *f == '\0')
        return;
    snprintf(buf, sizeof(buf), "%s", f);
    if ((colon = strchr(buf, ':')) == NULL)
        return;
    *colon = '\0';
    snprintf(fail_name, sizeof(fail_name), "%s", buf);
    fail_at = strtol(colon + 1, &colon, 10);
    if (*colon == ':')
        fail_code = (int)strtol(colon + 1, NULL, 10);
}

/* The error injected into this call of `name`, or CUDA_SUCCESS. With `lock` held. */
static CUresult injected(const char *name)
{
    if (fail_at > 0 && strcmp(name, fail_name) == 0 && ++calls_seen == fail_at)
        return fail_code;
    return CUDA_SUCCESS;
}

#define ENTER(name)                                                       \
    do {                                                                  \
        CUresult inj_;                                                    \
        pthread_mutex_lock(&lock);                                        \
        inj_ = initialized ? injected(name) : CUDA_ERROR_NOT_INITIALIZED; \
        pthread_mutex_unlock(&lock);                                      \
        if (inj_ != CUDA_SUCCESS)                                         \
            return inj_;                                                  \
    } while (0)

/* ---- streams ---- */

static void *stream_main(void *arg);

static int stream_init(struct emu_stream *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    return pthread_create(&s->thread, NULL, stream_main, s);
}

static void run_op(struct emu_stream *s, op *o)
{
    if (o->kind == OP_COPY) {
        CUresult inj;
        pthread_mutex_lock(&lock);
        inj = injected("copy");
        pthread_mutex_unlock(&lock);
        if (copy_us)
            usleep(copy_us); /* a slow link: work queued after it waits, as on a stream */
        if (inj == CUDA_SUCCESS)
            memcpy(o->dst, o->src, o->n);
        else if (s->error == CUDA_SUCCESS)
            s->error = inj;
    } else if (o->kind == OP_HOST) {
        o->fn(o->arg); /* work queued after it waits for its return, as on a stream */
    } else {
        pthread_mutex_lock(&lock);
        o->ev->done = 1;
        o->ev->error = s->error;
        pthread_cond_broadcast(&done_cv);
        pthread_mutex_unlock(&lock);
    }
}

static void *stream_main(void *arg)
{
    struct emu_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        op *o;
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL)
            break;
        o = s->head;
        s->head = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        run_op(s, o);
        free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static CUresult enqueue(CUstream hs, op *o)
{
    struct emu_stream *s = hs ? hs : &default_stream;
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

static CUresult drain(CUstream hs)
{
    struct emu_stream *s = hs ? hs : &default_stream;
    CUresult rc;
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL || s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    rc = s->error;
    s->error = CUDA_SUCCESS;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- init, devices, contexts ---- */

EXPORT CUresult cuInit(unsigned int flags)
{
    const char *nd = getenv("MG_CUDA_EMU_DEVICES"), *db = getenv("MG_CUDA_EMU_DMABUF");
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        n_devices = nd && *nd ? atoi(nd) : 1;
        dmabuf_ok = !(db && strcmp(db, "0") == 0);
        copy_us = getenv("MG_CUDA_EMU_COPY_US") ? (unsigned)atoi(getenv("MG_CUDA_EMU_COPY_US")) : 0;
        read_failures();
        if (n_devices <= 0 || n_devices > MAX_DEVICES) {
            rc = CUDA_ERROR_NO_DEVICE;
        } else if ((space = mmap(NULL, RESERVE, PROT_NONE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) ==
                   MAP_FAILED) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            for (int i = 0; i < n_devices; i++)
                primary[i].device = i;
            next_addr = (CUdeviceptr)(uintptr_t)space;
            initialized = stream_init(&default_stream) == 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc != CUDA_SUCCESS ? rc : injected("cuInit");
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult rc;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

static int error_index(CUresult rc)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].rc == rc)
            return (int)i;
    return -1;
}

EXPORT CUresult cuGetErrorName(CUresult rc, const char **name)
{
    int i = error_index(rc);
    if (name == NULL || i < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *name = errors[i].name;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult rc, const char **text)
{
    int i = error_index(rc);
    if (text == NULL || i < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *text = errors[i].text;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
    ENTER("cuDeviceGetCount");
    *n = n_devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    ENTER("cuDeviceGet");
    if (ordinal < 0 || ordinal >= n_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    ENTER("cuDeviceGetAttribute");
    if (dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute == 124 ? dmabuf_ok : 0; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxRetain");
    if (dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return dev >= 0 && dev < n_devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    ENTER("cuCtxGetCurrent");
    *ctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    ENTER("cuCtxSetCurrent");
    current = ctx;
    return CUDA_SUCCESS;
}

/* One level of push is all moongate uses: the previous context is kept to pop back to. */
static __thread CUcontext pushed[16];
static __thread int n_pushed;

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    ENTER("cuCtxPushCurrent_v2");
    if (ctx == NULL || n_pushed == 16)
        return CUDA_ERROR_INVALID_VALUE;
    pushed[n_pushed++] = current;
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    ENTER("cuCtxPopCurrent_v2");
    if (n_pushed == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx != NULL)
        *ctx = current;
    current = pushed[--n_pushed];
    return CUDA_SUCCESS;
}

/* ---- device memory ---- */

/* The allocation holding [p, p + n), or NULL. With `lock` held. */
static alloc *find(CUdeviceptr p, size_t n)
{
    for (int i = 0; i < n_allocs; i++)
        if (allocs[i].base <= p && p < allocs[i].base + allocs[i].size &&
            n <= allocs[i].base + allocs[i].size - p)
            return &allocs[i];
    return NULL;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    size_t len = (size + PAGE - 1) & ~(PAGE - 1);
    alloc a = {.fd = -1};
    ENTER("cuMemAlloc_v2");
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (dptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (n_allocs == MAX_ALLOCS || next_addr + len > (CUdeviceptr)(uintptr_t)space + RESERVE ||
        (a.fd = memfd_create("mg-cuda-emu", MFD_CLOEXEC)) < 0 || ftruncate(a.fd, (off_t)len) ||
        (a.shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0)) == MAP_FAILED) {
        if (a.fd >= 0)
            close(a.fd);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.base = next_addr;
    a.size = len;
    a.device = current->device;
    next_addr += len; /* back to back, as VMM mappings of several allocations can be */
    allocs[n_allocs++] = a;
    *dptr = a.base;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    ENTER("cuMemFree_v2");
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_allocs; i++)
        if (allocs[i].base == dptr) {
            munmap(allocs[i].shadow, allocs[i].size);
            close(allocs[i].fd);
            allocs[i] = allocs[--n_allocs];
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    alloc *a;
    ENTER("cuMemGetAddressRange_v2");
    pthread_mutex_lock(&lock);
    a = find(dptr, 1);
    if (a != NULL) {
        if (base)
            *base = a->base;
        if (size)
            *size = a->size;
    }
    pthread_mutex_unlock(&lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The host_regs entry holding p, or -1. With `lock` held. */
static int host_reg_of(const void *p)
{
    for (int i = 0; i < 256 && host_regs[i].p != NULL; i++)
        if ((const char *)host_regs[i].p <= (const char *)p &&
            (const char *)p < (const char *)host_regs[i].p + host_regs[i].n)
            return i;
    return -1;
}

/* Drops host_regs entry i (the table stays packed). With `lock` held. */
static void host_reg_drop(int i)
{
    int last = i;
    while (last + 1 < 256 && host_regs[last + 1].p != NULL)
        last++;
    host_regs[i] = host_regs[last];
    host_regs[last].p = NULL;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    alloc *a;
    CUresult rc = CUDA_SUCCESS;
    ENTER("cuPointerGetAttribute");
    pthread_mutex_lock(&lock);
    a = find(ptr, 1);
    if (a == NULL && data != NULL && host_reg_of((void *)(uintptr_t)ptr) >= 0) {
        if (attribute == 2) /* MEMORY_TYPE: host memory the driver pinned */
            *(unsigned int *)data = 1;
        else if (attribute == 1) /* CONTEXT */
            *(CUcontext *)data = &primary[0];
        else
            rc = CUDA_ERROR_INVALID_VALUE;
    } else if (a == NULL || data == NULL)
        rc = CUDA_ERROR_INVALID_VALUE; /* host memory the driver was never told of */
    else if (attribute == 1)           /* CONTEXT */
        *(CUcontext *)data = &primary[a->device];
    else if (attribute == 2) /* MEMORY_TYPE: device */
        *(unsigned int *)data = 2;
    else if (attribute == 9) /* DEVICE_ORDINAL */
        *(int *)data = a->device;
    else if (attribute == 11) /* RANGE_START_ADDR */
        *(CUdeviceptr *)data = a->base;
    else if (attribute == 12) /* RANGE_SIZE */
        *(size_t *)data = a->size;
    else
        rc = CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                              int handle_type, unsigned long long flags)
{
    alloc *a;
    char path[64];
    int fd = -1;
    ENTER("cuMemGetHandleForAddressRange");
    if (handle == NULL || handle_type != 1 || flags != 0 || size == 0 || dptr % PAGE || size % PAGE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dmabuf_ok)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    a = find(dptr, size);
    if (a != NULL) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            lseek(fd, (off_t)(dptr - a->base), SEEK_SET);
    }
    pthread_mutex_unlock(&lock);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* ---- host memory ---- */

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
    CUresult rc = CUDA_SUCCESS;
    int i;
    ENTER("cuMemHostRegister_v2");
    if (p == NULL || size == 0 || msync((void *)start, (uintptr_t)p + size - start, MS_ASYNC))
        return CUDA_ERROR_INVALID_VALUE; /* not mapped */
    pthread_mutex_lock(&lock);
    for (i = 0; i < 256 && host_regs[i].p != NULL; i++)
        if ((char *)host_regs[i].p < (char *)p + size &&
            (char *)p < (char *)host_regs[i].p + host_regs[i].n)
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (rc == CUDA_SUCCESS && i == 256)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        host_regs[i].p = p;
        host_regs[i].n = size;
        host_regs[i].allocated = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUresult rc = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    ENTER("cuMemHostUnregister");
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 256 && host_regs[i].p != NULL; i++)
        if (host_regs[i].p == p && !host_regs[i].allocated) {
            host_reg_drop(i);
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    size_t len = (size + PAGE - 1) & ~(PAGE - 1);
    void *p;
    int i;
    (void)flags;
    ENTER("cuMemHostAlloc");
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pp == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (i = 0; i < 256 && host_regs[i].p != NULL; i++)
        ;
    if (i < 256) {
        host_regs[i].p = p;
        host_regs[i].n = len;
        host_regs[i].allocated = 1;
    }
    pthread_mutex_unlock(&lock);
    if (i == 256) {
        munmap(p, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    ENTER("cuMemFreeHost");
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 256 && host_regs[i].p != NULL; i++)
        if (host_regs[i].p == p && host_regs[i].allocated) {
            munmap(p, host_regs[i].n);
            host_reg_drop(i);
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- copies, streams, events ---- */

/* The emulator's own address of device range [p, p + n), or NULL. */
static char *shadow_of(CUdeviceptr p, size_t n)
{
    alloc *a;
    char *s = NULL;
    pthread_mutex_lock(&lock);
    a = find(p, n);
    if (a != NULL)
        s = a->shadow + (p - a->base);
    pthread_mutex_unlock(&lock);
    return s;
}

static CUresult copy_async(void *dst, const void *src, size_t n, CUstream s)
{
    op *o = calloc(1, sizeof(*o));
    if (current == NULL) {
        free(o);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (o != NULL)
        *o = (op){.kind = OP_COPY, .dst = dst, .src = src, .n = n};
    return enqueue(s, o);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    char *from = shadow_of(src, n);
    ENTER("cuMemcpyDtoHAsync_v2");
    return from == NULL || dst == NULL ? CUDA_ERROR_INVALID_VALUE : copy_async(dst, from, n, s);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    char *to = shadow_of(dst, n);
    ENTER("cuMemcpyHtoDAsync_v2");
    return to == NULL || src == NULL ? CUDA_ERROR_INVALID_VALUE : copy_async(to, src, n, s);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    char *from = shadow_of(src, n);
    CUresult rc;
    ENTER("cuMemcpyDtoH_v2");
    if (from == NULL || dst == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    rc = copy_async(dst, from, n, NULL);
    return rc != CUDA_SUCCESS ? rc : drain(NULL);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    char *to = shadow_of(dst, n);
    CUresult rc;
    ENTER("cuMemcpyHtoD_v2");
    if (to == NULL || src == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    rc = copy_async(to, src, n, NULL);
    return rc != CUDA_SUCCESS ? rc : drain(NULL);
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    struct emu_stream *s;
    ENTER("cuStreamCreate");
    if (ps == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((s = malloc(sizeof(*s))) == NULL || stream_init(s) != 0) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    drain(s);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    ENTER("cuStreamSynchronize");
    return drain(s);
}

EXPORT CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
    ENTER("cuEventCreate");
    if (ev == NULL || (*ev = calloc(1, sizeof(**ev))) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent ev)
{
    free(ev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent ev, CUstream s)
{
    op *o;
    ENTER("cuEventRecord");
    if (ev == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    ev->recorded = 1;
    ev->done = 0;
    ev->error = CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    o = calloc(1, sizeof(*o));
    if (o != NULL)
        *o = (op){.kind = OP_EVENT, .ev = ev};
    return enqueue(s, o);
}

EXPORT CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *arg)
{
    op *o;
    ENTER("cuLaunchHostFunc");
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    o = calloc(1, sizeof(*o));
    if (o != NULL)
        *o = (op){.kind = OP_HOST, .fn = fn, .arg = arg};
    return enqueue(s, o);
}

EXPORT CUresult cuEventQuery(CUevent ev)
{
    int done;
    if (ev == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    done = !ev->recorded || ev->done;
    pthread_mutex_unlock(&lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent ev)
{
    if (ev == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc;
    pthread_mutex_lock(&lock);
    while (ev->recorded && !ev->done)
        pthread_cond_wait(&done_cv, &lock);
    rc = ev->recorded ? ev->error : CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    return rc;
}
