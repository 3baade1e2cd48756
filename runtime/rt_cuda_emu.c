/* rt_cuda_emu.c: the CUDA Driver API emulated on the CPU, for cuda-emu modules: the runtime's
 * CUDA device (rt_cuda.c) drives it exactly as it drives libcuda.so.1, so the tests exercise the
 * real launch path (device memory, copies, the arena, launches, status words, events) without a
 * GPU.
 *
 *   device        one, "the xtc CUDA emulator", compute capability 9.0
 *   memory        cuMemAlloc = aligned_alloc, copies and memsets are memcpy and memset
 *   modules       the "image" is the module's XtcEmuModule: its kernels compiled for the host
 *   launches      cuLaunchKernel runs the grid through the module's launcher (xtc_cuda_emu.h),
 *                 synchronously; its errors (deadlocks ...) are kept per module (LaunchError)
 *   streams       synchronous: every call has finished when it returns
 *   events        the host's monotonic clock, read when the (synchronous) stream reaches the
 *                 event, i.e. when cuEventRecord is called: the time between two events is the
 *                 CPU time of the emulated work between them, not a GPU figure. As with the
 *                 driver, the time to or from an event never recorded is CUDA_ERROR_INVALID_HANDLE
 *
 * Every object is allocated per call: no global state, several sessions in several threads; but
 * for the counts of bytes copied each way (rt_cu_emu_traffic) and the registered host memory
 * (cuMemHostRegister: checked as the driver checks it, rt_cu_emu_registered), which tests read. */
#include "rt_cuda.h"
#include "rt_alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_ullong traffic[3]; /* host to device, device to host, device to device */

void rt_cu_emu_traffic(uint64_t bytes[3])
{
    for (int i = 0; i < 3; i++)
        bytes[i] = atomic_load(&traffic[i]);
}

typedef struct EmuModule EmuModule;

typedef struct {
    EmuModule *mod;
    const XtcEmuKernel *kernel;
} EmuFunction;

struct EmuModule {
    const XtcEmuModule *emu;
    EmuFunction *fns;
    void *cache; /* the launcher's thread stacks, kept between launches */
    int order;
    char err[1024];
};

/* handles that only need to be non-NULL */
static char the_context, the_stream;

static CUresult emu_init(unsigned flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

static CUresult emu_version(int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

static CUresult emu_count(int *count)
{
    *count = 1;
    return CUDA_SUCCESS;
}

static CUresult emu_device(CUdevice *dev, int ordinal)
{
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = 0;
    return CUDA_SUCCESS;
}

static CUresult emu_name(char *name, int len, CUdevice dev)
{
    (void)dev;
    snprintf(name, (size_t)len, "the xtc CUDA emulator (CPU)");
    return CUDA_SUCCESS;
}

static CUresult emu_attribute(int *value, int attribute, CUdevice dev)
{
    (void)dev;
    *value = attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
    return CUDA_SUCCESS;
}

static CUresult emu_retain(CUcontext *ctx, CUdevice dev)
{
    (void)dev;
    *ctx = (CUcontext)(void *)&the_context;
    return CUDA_SUCCESS;
}

static CUresult emu_release(CUdevice dev)
{
    (void)dev;
    return CUDA_SUCCESS;
}

static CUresult emu_set_current(CUcontext ctx)
{
    (void)ctx;
    return CUDA_SUCCESS;
}

static CUresult emu_stream_create(CUstream *s, unsigned flags)
{
    (void)flags;
    *s = (CUstream)(void *)&the_stream;
    return CUDA_SUCCESS;
}

static CUresult emu_stream(CUstream s)
{
    (void)s;
    return CUDA_SUCCESS;
}

static CUresult emu_alloc(CUdeviceptr *p, size_t bytes)
{
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *m = rt_aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static CUresult emu_free(CUdeviceptr p)
{
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}

static CUresult emu_htod(CUdeviceptr dst, const void *src, size_t bytes, CUstream s)
{
    (void)s;
    if (bytes)
        memcpy((void *)(uintptr_t)dst, src, bytes);
    atomic_fetch_add(&traffic[0], bytes);
    return CUDA_SUCCESS;
}

static CUresult emu_dtoh(void *dst, CUdeviceptr src, size_t bytes, CUstream s)
{
    (void)s;
    if (bytes)
        memcpy(dst, (const void *)(uintptr_t)src, bytes);
    atomic_fetch_add(&traffic[1], bytes);
    return CUDA_SUCCESS;
}

static CUresult emu_dtod(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s)
{
    (void)s;
    if (bytes)
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    atomic_fetch_add(&traffic[2], bytes);
    return CUDA_SUCCESS;
}

static CUresult emu_memset(CUdeviceptr dst, unsigned char v, size_t bytes, CUstream s)
{
    (void)s;
    if (bytes)
        memset((void *)(uintptr_t)dst, v, bytes);
    return CUDA_SUCCESS;
}

/* Registered host memory, as the driver checks it: a range may not overlap one registered
 * already, and only a registered range's start unregisters it. */
typedef struct EmuRange {
    char *p;
    size_t bytes;
    struct EmuRange *next;
} EmuRange;
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;
static EmuRange *ranges;

static CUresult emu_host_register(void *p, size_t bytes, unsigned flags)
{
    (void)flags;
    if (!p || !bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&ranges_lock);
    for (EmuRange *e = ranges; e; e = e->next)
        if ((char *)p < e->p + e->bytes && e->p < (char *)p + bytes)
            r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    /* malloc, not rt_malloc: the driver's own bookkeeping, outside the runtime's injected faults
     * (a refused registration is not an error of the session: it copies unlocked) */
    EmuRange *e = r == CUDA_SUCCESS ? malloc(sizeof *e) : NULL;
    if (e) {
        *e = (EmuRange){p, bytes, ranges};
        ranges = e;
    } else if (r == CUDA_SUCCESS) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&ranges_lock);
    return r;
}

static CUresult emu_host_unregister(void *p)
{
    CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    pthread_mutex_lock(&ranges_lock);
    for (EmuRange **e = &ranges; *e; e = &(*e)->next)
        if ((*e)->p == p) {
            EmuRange *dead = *e;
            *e = dead->next;
            free(dead);
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&ranges_lock);
    return r;
}

void rt_cu_emu_registered(int64_t *nranges, uint64_t *bytes)
{
    *nranges = 0;
    *bytes = 0;
    pthread_mutex_lock(&ranges_lock);
    for (EmuRange *e = ranges; e; e = e->next) {
        ++*nranges;
        *bytes += e->bytes;
    }
    pthread_mutex_unlock(&ranges_lock);
}

static int order_from_env(void)
{
    const char *o = getenv("XTC_CUDA_EMU_ORDER");
    if (o && strcmp(o, "reverse") == 0)
        return XTC_EMU_REVERSE;
    if (o && strcmp(o, "shuffled") == 0)
        return XTC_EMU_SHUFFLED;
    return XTC_EMU_FORWARD;
}

static CUresult emu_load(CUmodule *mod, const void *image, unsigned nopts, int *opts, void **values)
{
    (void)nopts, (void)opts, (void)values;
    const XtcEmuModule *emu = image;
    if (!emu || emu->magic != XTC_EMU_MAGIC || emu->version != XTC_EMU_VERSION || emu->nkernels < 0)
        return CUDA_ERROR_INVALID_IMAGE;
    EmuModule *m = rt_calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->fns = rt_calloc((size_t)emu->nkernels + 1, sizeof *m->fns);
    if (!m->fns) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->emu = emu;
    m->order = order_from_env();
    for (int k = 0; k < emu->nkernels; k++) {
        m->fns[k].mod = m;
        m->fns[k].kernel = &emu->kernels[k];
    }
    *mod = (CUmodule)(void *)m;
    return CUDA_SUCCESS;
}

static CUresult emu_unload(CUmodule mod)
{
    EmuModule *m = (EmuModule *)(void *)mod;
    if (!m)
        return CUDA_SUCCESS;
    if (m->emu->release)
        m->emu->release(m->cache);
    free(m->fns);
    free(m);
    return CUDA_SUCCESS;
}

static CUresult emu_function(CUfunction *fn, CUmodule mod, const char *name)
{
    EmuModule *m = (EmuModule *)(void *)mod;
    for (int k = 0; k < m->emu->nkernels; k++)
        if (strcmp(m->emu->kernels[k].name, name) == 0) {
            *fn = (CUfunction)(void *)&m->fns[k];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

static CUresult emu_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, unsigned shared_bytes, CUstream s, void **params, void **extra)
{
    (void)s;
    EmuFunction *f = (EmuFunction *)(void *)fn;
    EmuModule *m = f->mod;
    if (shared_bytes || extra) {
        snprintf(m->err, sizeof m->err, "kernel %s: dynamic shared memory and 'extra' are not emulated",
                 f->kernel->name);
        return CUDA_ERROR_INVALID_VALUE;
    }
    XtcEmuLaunch l = {{gx, gy, gz}, {bx, by, bz}, m->order, &m->cache, m->err, sizeof m->err};
    return m->emu->launch(f->kernel, &l, params) == 0 ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_FAILED;
}

static const char *emu_launch_error(CUmodule mod)
{
    EmuModule *m = (EmuModule *)(void *)mod;
    return m && m->err[0] ? m->err : NULL;
}

/* an event: when the stream reached it (seconds), and whether it has been recorded */
typedef struct {
    double t;
    int recorded;
} EmuEvent;

static CUresult emu_event_create(CUevent *e, unsigned flags)
{
    (void)flags;
    EmuEvent *ev = rt_calloc(1, sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (CUevent)(void *)ev;
    return CUDA_SUCCESS;
}

static CUresult emu_event_destroy(CUevent e)
{
    free((void *)e);
    return CUDA_SUCCESS;
}

static CUresult emu_event_record(CUevent e, CUstream s)
{
    (void)s;
    EmuEvent *ev = (EmuEvent *)(void *)e;
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ev->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    ev->recorded = 1;
    return CUDA_SUCCESS;
}

static CUresult emu_event_sync(CUevent e)
{
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult emu_elapsed(float *ms, CUevent start, CUevent end)
{
    const EmuEvent *a = (const EmuEvent *)(void *)start, *b = (const EmuEvent *)(void *)end;
    if (!ms || !a || !b || !a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(1e3 * (b->t - a->t));
    return CUDA_SUCCESS;
}

static CUresult emu_error_string(CUresult r, const char **text)
{
    switch (r) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_INVALID_IMAGE: *text = "device kernel image is invalid"; break;
    case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *text = "unspecified launch failure"; break;
    default: *text = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

void rt_cu_emulator(RtCuDriver *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "the xtc CUDA emulator");
    d->emulated = 1;
    d->Init = emu_init;
    d->DriverGetVersion = emu_version;
    d->DeviceGetCount = emu_count;
    d->DeviceGet = emu_device;
    d->DeviceGetName = emu_name;
    d->DeviceGetAttribute = emu_attribute;
    d->DevicePrimaryCtxRetain = emu_retain;
    d->DevicePrimaryCtxRelease = emu_release;
    d->CtxSetCurrent = emu_set_current;
    d->StreamCreate = emu_stream_create;
    d->StreamDestroy = emu_stream;
    d->StreamSynchronize = emu_stream;
    d->MemAlloc = emu_alloc;
    d->MemFree = emu_free;
    d->MemcpyHtoDAsync = emu_htod;
    d->MemcpyDtoHAsync = emu_dtoh;
    d->MemcpyDtoDAsync = emu_dtod;
    d->MemsetD8Async = emu_memset;
    d->MemHostRegister = emu_host_register;
    d->MemHostUnregister = emu_host_unregister;
    d->ModuleLoadDataEx = emu_load;
    d->ModuleUnload = emu_unload;
    d->ModuleGetFunction = emu_function;
    d->LaunchKernel = emu_launch;
    d->EventCreate = emu_event_create;
    d->EventDestroy = emu_event_destroy;
    d->EventRecord = emu_event_record;
    d->EventSynchronize = emu_event_sync;
    d->EventElapsedTime = emu_elapsed;
    d->GetErrorString = emu_error_string;
    d->LaunchError = emu_launch_error;
}
