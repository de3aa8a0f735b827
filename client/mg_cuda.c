/*
 * The CUDA driver API loaded at run time (mg_cuda.h).
 */
#include "mg_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYM(field, name)               \
    {                                  \
        offsetof(mg_cuda, field), name \
    }

/* The names the driver exports, with the ABI versions the table's prototypes are for. */
static const struct {
    size_t off;
    const char *name;
} syms[] = {
    SYM(cuInit, "cuInit"),
    SYM(cuDriverGetVersion, "cuDriverGetVersion"),
    SYM(cuGetErrorName, "cuGetErrorName"),
    SYM(cuGetErrorString, "cuGetErrorString"),
    SYM(cuDeviceGetCount, "cuDeviceGetCount"),
    SYM(cuDeviceGet, "cuDeviceGet"),
    SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(cuCtxGetCurrent, "cuCtxGetCurrent"),
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
    SYM(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
    SYM(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
    SYM(cuMemAlloc, "cuMemAlloc_v2"),
    SYM(cuMemFree, "cuMemFree_v2"),
    SYM(cuMemGetAddressRange, "cuMemGetAddressRange_v2"),
    SYM(cuPointerGetAttribute, "cuPointerGetAttribute"),
    SYM(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"),
    SYM(cuMemHostRegister, "cuMemHostRegister_v2"),
    SYM(cuMemHostUnregister, "cuMemHostUnregister"),
    SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    SYM(cuStreamCreate, "cuStreamCreate"),
    SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
    SYM(cuStreamSynchronize, "cuStreamSynchronize"),
    SYM(cuEventCreate, "cuEventCreate"),
    SYM(cuEventDestroy, "cuEventDestroy_v2"),
    SYM(cuEventRecord, "cuEventRecord"),
    SYM(cuEventQuery, "cuEventQuery"),
    SYM(cuEventSynchronize, "cuEventSynchronize"),
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static mg_cuda table;
static const mg_cuda *loaded;
static char why[512];

static void load(void)
{
    const char *path = getenv("MOONGATE_CUDA_LIB");
    void *h;
    mg_cu_result rc;
    char text[256];
    if (path == NULL || *path == '\0')
        path = "libcuda.so.1";
    if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
        snprintf(why, sizeof(why), "no CUDA driver: %s", dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(h, syms[i].name);
        if (f == NULL) {
            snprintf(why, sizeof(why), "the CUDA driver %s has no %s (CUDA 11.7 or later needed)",
                     path, syms[i].name);
            dlclose(h);
            return;
        }
        memcpy((char *)&table + syms[i].off, &f, sizeof(f));
    }
    if ((rc = table.cuInit(0)) != MG_CU_SUCCESS) {
        snprintf(why, sizeof(why), "cuInit: %s", mg_cuda_strerror(&table, rc, text, sizeof(text)));
        return; /* the library stays open: its symbols are in the table */
    }
    if (table.cuDriverGetVersion(&table.version) != MG_CU_SUCCESS)
        table.version = 0;
    loaded = &table;
}

const mg_cuda *mg_cuda_get(char *err, size_t errcap)
{
    pthread_once(&once, load);
    if (loaded == NULL && err != NULL)
        snprintf(err, errcap, "%s", why);
    return loaded;
}

const char *mg_cuda_strerror(const mg_cuda *cu, mg_cu_result rc, char *buf, size_t cap)
{
    const char *name = NULL, *text = NULL;
    if (cu != NULL && cu->cuGetErrorName != NULL)
        cu->cuGetErrorName(rc, &name);
    if (cu != NULL && cu->cuGetErrorString != NULL)
        cu->cuGetErrorString(rc, &text);
    if (name != NULL)
        snprintf(buf, cap, "%s (%s)", name, text ? text : "no description");
    else
        snprintf(buf, cap, "CUDA error %d", rc);
    return buf;
}

int mg_cuda_pointer(const mg_cuda *cu, uintptr_t ptr, mg_cuda_ptr_info *info)
{
    unsigned int type = 0;
    mg_cu_ptr base = 0;
    size_t size = 0;
    if (cu == NULL)
        return -1;
    if (cu->cuPointerGetAttribute(&type, MG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) !=
            MG_CU_SUCCESS ||
        type != MG_CU_MEMORYTYPE_DEVICE)
        return 0; /* host memory the driver does not know, or knows as host */
    memset(info, 0, sizeof(*info));
    if (cu->cuPointerGetAttribute(&info->device, MG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) !=
            MG_CU_SUCCESS ||
        cu->cuPointerGetAttribute(&info->context, MG_CU_POINTER_ATTRIBUTE_CONTEXT, ptr) !=
            MG_CU_SUCCESS ||
        cu->cuMemGetAddressRange(&base, &size, ptr) != MG_CU_SUCCESS)
        return 0;
    info->base = base;
    info->size = size;
    return 1;
}

int mg_cuda_device_of(uintptr_t ptr, char *whynot, size_t cap)
{
    mg_cuda_ptr_info info;
    char err[512];
    const mg_cuda *cu = mg_cuda_get(err, sizeof(err));
    if (cu == NULL) {
        snprintf(whynot, cap, "no CUDA driver: %.400s", err);
        return -1;
    }
    if (mg_cuda_pointer(cu, ptr, &info) != 1) {
        snprintf(whynot, cap, "the CUDA driver does not know it as device memory");
        return -1;
    }
    return info.device;
}
