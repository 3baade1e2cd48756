/* rt_cuda_driver.c: the CUDA Driver API of libcuda.so.1, loaded with dlopen when a session of a
 * CUDA module is created, so that the runtime links nothing of CUDA and a machine without a GPU
 * gets a clear error instead of a failed program start.
 *
 * Functions are looked up under the versioned names cuda.h maps them to (cuMemAlloc_v2, ...).
 * $XTC_LIBCUDA overrides the library's path (tests point it at missing or stub libraries). The
 * library is never unloaded: unloading a GPU driver while the process lives is asking for
 * trouble, and the loader counts references anyway. */
#include "rt_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *sym(void *dl, const char *name, const char **missing)
{
    void *p = dlsym(dl, name);
    if (!p && !*missing)
        *missing = name;
    return p;
}

/* the first of two names that exists (newer drivers have cuEventElapsedTime_v2) */
static void *sym2(void *dl, const char *name, const char *fallback, const char **missing)
{
    void *p = dlsym(dl, name);
    return p ? p : sym(dl, fallback, missing);
}

int rt_cu_driver_load(RtCuDriver *d, char *err, size_t n)
{
    memset(d, 0, sizeof *d);
    const char *path = getenv("XTC_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        rt_set_error(err, n,
                     "no CUDA driver: cannot load %s (%s). This module was compiled for NVIDIA GPUs (--target cuda); "
                     "run it on a machine with a GPU and its driver, or compile with --target cpu (or --target "
                     "cuda-emu to emulate the GPU on the CPU)",
                     path, e ? e : "dlopen failed");
        return -1;
    }
    const char *missing = NULL;
    *(void **)&d->Init = sym(dl, "cuInit", &missing);
    *(void **)&d->DriverGetVersion = sym(dl, "cuDriverGetVersion", &missing);
    *(void **)&d->DeviceGetCount = sym(dl, "cuDeviceGetCount", &missing);
    *(void **)&d->DeviceGet = sym(dl, "cuDeviceGet", &missing);
    *(void **)&d->DeviceGetName = sym(dl, "cuDeviceGetName", &missing);
    *(void **)&d->DeviceGetAttribute = sym(dl, "cuDeviceGetAttribute", &missing);
    *(void **)&d->DevicePrimaryCtxRetain = sym(dl, "cuDevicePrimaryCtxRetain", &missing);
    *(void **)&d->DevicePrimaryCtxRelease = sym(dl, "cuDevicePrimaryCtxRelease_v2", &missing);
    *(void **)&d->CtxSetCurrent = sym(dl, "cuCtxSetCurrent", &missing);
    *(void **)&d->StreamCreate = sym(dl, "cuStreamCreate", &missing);
    *(void **)&d->StreamDestroy = sym(dl, "cuStreamDestroy_v2", &missing);
    *(void **)&d->StreamSynchronize = sym(dl, "cuStreamSynchronize", &missing);
    *(void **)&d->MemAlloc = sym(dl, "cuMemAlloc_v2", &missing);
    *(void **)&d->MemFree = sym(dl, "cuMemFree_v2", &missing);
    *(void **)&d->MemcpyHtoDAsync = sym(dl, "cuMemcpyHtoDAsync_v2", &missing);
    *(void **)&d->MemcpyDtoHAsync = sym(dl, "cuMemcpyDtoHAsync_v2", &missing);
    *(void **)&d->MemcpyDtoDAsync = sym(dl, "cuMemcpyDtoDAsync_v2", &missing);
    *(void **)&d->MemsetD8Async = sym(dl, "cuMemsetD8Async", &missing);
    *(void **)&d->ModuleLoadDataEx = sym(dl, "cuModuleLoadDataEx", &missing);
    *(void **)&d->ModuleUnload = sym(dl, "cuModuleUnload", &missing);
    *(void **)&d->ModuleGetFunction = sym(dl, "cuModuleGetFunction", &missing);
    *(void **)&d->LaunchKernel = sym(dl, "cuLaunchKernel", &missing);
    *(void **)&d->EventCreate = sym(dl, "cuEventCreate", &missing);
    *(void **)&d->EventDestroy = sym(dl, "cuEventDestroy_v2", &missing);
    *(void **)&d->EventRecord = sym(dl, "cuEventRecord", &missing);
    *(void **)&d->EventSynchronize = sym(dl, "cuEventSynchronize", &missing);
    *(void **)&d->EventElapsedTime = sym2(dl, "cuEventElapsedTime_v2", "cuEventElapsedTime", &missing);
    *(void **)&d->GetErrorString = sym(dl, "cuGetErrorString", &missing);
    *(void **)&d->MemHostRegister = dlsym(dl, "cuMemHostRegister_v2"); /* optional */
    *(void **)&d->MemHostUnregister = dlsym(dl, "cuMemHostUnregister");
    if (!d->MemHostRegister || !d->MemHostUnregister)
        d->MemHostRegister = NULL, d->MemHostUnregister = NULL;
    /* CUDA graphs, optional (rt_cuda_graph.c): without any of them (but the update) there are none */
    *(void **)&d->StreamBeginCapture = dlsym(dl, "cuStreamBeginCapture_v2");
    *(void **)&d->StreamEndCapture = dlsym(dl, "cuStreamEndCapture");
    *(void **)&d->GraphInstantiateWithFlags = dlsym(dl, "cuGraphInstantiateWithFlags");
    *(void **)&d->GraphExecUpdate = dlsym(dl, "cuGraphExecUpdate_v2");
    *(void **)&d->GraphLaunch = dlsym(dl, "cuGraphLaunch");
    *(void **)&d->GraphExecDestroy = dlsym(dl, "cuGraphExecDestroy");
    *(void **)&d->GraphDestroy = dlsym(dl, "cuGraphDestroy");
    if (missing) {
        rt_set_error(err, n, "the CUDA driver %s lacks %s (too old a driver?)", path, missing);
        memset(d, 0, sizeof *d);
        return -1;
    }
    snprintf(d->name, sizeof d->name, "%s", path);
    return 0;
}

const char *rt_cu_error_text(const RtCuDriver *d, CUresult r, char *buf, size_t n)
{
    const char *text = NULL;
    if (!d->GetErrorString || d->GetErrorString(r, &text) != CUDA_SUCCESS || !text)
        text = "unknown error";
    snprintf(buf, n, "CUDA error %d: %s", r, text);
    return buf;
}
