/*
 * mg_cuda: the CUDA driver API, loaded at run time by the client library (never linked; nothing
 * of CUDA is needed to build). The table resolves the names the driver exports — several with
 * their ABI suffix (_v2) — declared here by hand. Programs without a GPU or driver keep working:
 * only the calls that need the GPU fail, saying why.
 *
 * The library is $MOONGATE_CUDA_LIB when set (tests load the driver emulator through it), else
 * libcuda.so.1. mg_cuda_get() opens it once per process and calls cuInit(0).
 */
#ifndef MG_CUDA_H
#define MG_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int mg_cu_result; /* CUresult: 0 is CUDA_SUCCESS */
typedef int mg_cu_device;
typedef void *mg_cu_context;
typedef void *mg_cu_stream;
typedef void *mg_cu_event;
typedef unsigned long long mg_cu_ptr; /* CUdeviceptr */

enum {
    MG_CU_SUCCESS = 0,
    MG_CU_ERROR_INVALID_VALUE = 1,
    MG_CU_ERROR_NOT_READY = 600,
    MG_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    MG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    MG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    MG_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    MG_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    MG_CU_MEMORYTYPE_DEVICE = 2,
    MG_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
    MG_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
    MG_CU_MEMHOSTREGISTER_PORTABLE = 1,
    MG_CU_STREAM_NON_BLOCKING = 1,
};

typedef struct mg_cuda {
    mg_cu_result (*cuInit)(unsigned int flags);
    mg_cu_result (*cuDriverGetVersion)(int *version);
    mg_cu_result (*cuGetErrorName)(mg_cu_result rc, const char **name);
    mg_cu_result (*cuGetErrorString)(mg_cu_result rc, const char **text);
    mg_cu_result (*cuDeviceGetCount)(int *count);
    mg_cu_result (*cuDeviceGet)(mg_cu_device *dev, int ordinal);
    mg_cu_result (*cuDeviceGetAttribute)(int *value, int attribute, mg_cu_device dev);
    mg_cu_result (*cuDevicePrimaryCtxRetain)(mg_cu_context *ctx, mg_cu_device dev);
    mg_cu_result (*cuDevicePrimaryCtxRelease)(mg_cu_device dev); /* _v2 */
    mg_cu_result (*cuCtxGetCurrent)(mg_cu_context *ctx);
    mg_cu_result (*cuCtxSetCurrent)(mg_cu_context ctx);
    mg_cu_result (*cuCtxPushCurrent)(mg_cu_context ctx);                                 /* _v2 */
    mg_cu_result (*cuCtxPopCurrent)(mg_cu_context *ctx);                                 /* _v2 */
    mg_cu_result (*cuMemAlloc)(mg_cu_ptr *dptr, size_t size);                            /* _v2 */
    mg_cu_result (*cuMemFree)(mg_cu_ptr dptr);                                           /* _v2 */
    mg_cu_result (*cuMemGetAddressRange)(mg_cu_ptr *base, size_t *size, mg_cu_ptr dptr); /* _v2 */
    mg_cu_result (*cuPointerGetAttribute)(void *data, int attribute, mg_cu_ptr ptr);
    mg_cu_result (*cuMemGetHandleForAddressRange)(void *handle, mg_cu_ptr dptr, size_t size,
                                                  int handle_type, unsigned long long flags);
    mg_cu_result (*cuMemHostRegister)(void *p, size_t size, unsigned int flags); /* _v2 */
    mg_cu_result (*cuMemHostUnregister)(void *p);
    mg_cu_result (*cuMemcpyDtoHAsync)(void *dst, mg_cu_ptr src, size_t n, mg_cu_stream s); /* _v2 */
    mg_cu_result (*cuMemcpyHtoDAsync)(mg_cu_ptr dst, const void *src, size_t n,
                                      mg_cu_stream s);                      /* _v2 */
    mg_cu_result (*cuMemcpyDtoH)(void *dst, mg_cu_ptr src, size_t n);       /* _v2 */
    mg_cu_result (*cuMemcpyHtoD)(mg_cu_ptr dst, const void *src, size_t n); /* _v2 */
    mg_cu_result (*cuStreamCreate)(mg_cu_stream *s, unsigned int flags);
    mg_cu_result (*cuStreamDestroy)(mg_cu_stream s); /* _v2 */
    mg_cu_result (*cuStreamSynchronize)(mg_cu_stream s);
    mg_cu_result (*cuEventCreate)(mg_cu_event *ev, unsigned int flags);
    mg_cu_result (*cuEventDestroy)(mg_cu_event ev); /* _v2 */
    mg_cu_result (*cuEventRecord)(mg_cu_event ev, mg_cu_stream s);
    mg_cu_result (*cuEventQuery)(mg_cu_event ev);
    mg_cu_result (*cuEventSynchronize)(mg_cu_event ev);
    int version; /* cuDriverGetVersion: 12040 is 12.4 */
} mg_cuda;

/* The driver's table, opened and initialized once; NULL with the reason in err (no driver: the
 * dlopen error; a name it lacks; cuInit's error). Thread-safe. */
const mg_cuda *mg_cuda_get(char *err, size_t errcap);
/* "CUDA_ERROR_NAME (text)" for a result, into buf (also without a driver). */
const char *mg_cuda_strerror(const mg_cuda *cu, mg_cu_result rc, char *buf, size_t cap);

/* Where a pointer lies, as the driver says. */
typedef struct mg_cuda_ptr_info {
    int device;            /* the device ordinal it was allocated on */
    mg_cu_context context; /* the context that owns it */
    mg_cu_ptr base;        /* its allocation */
    size_t size;
} mg_cuda_ptr_info;
/* 1 with *info set when ptr is device memory, 0 when the driver does not know it (host memory),
 * -1 with err set when there is no driver. */
int mg_cuda_pointer(const mg_cuda *cu, uintptr_t ptr, mg_cuda_ptr_info *info);
/* The device of ptr as the driver (loaded by this call) knows it, or -1 with why[cap] saying
 * why it is not device memory: no driver (the dlopen error), or the driver does not know it. */
int mg_cuda_device_of(uintptr_t ptr, char *why, size_t cap);

#endif
