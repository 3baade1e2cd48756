/* rt_cuda_calls.c: a count of the CUDA driver calls a session makes, by kind, and the host's time
 * inside them: a diagnostic of what a run costs outside its kernels (a decode call's launches,
 * copies, synchronisations, allocations per token), for tests (rt_cu_calls) and benchmarks.
 *
 * With $XTC_CUDA_CALLS set (not "0") when a session of a CUDA module is created, rt_cuda.c's
 * driver table gets counting entry points in place of the driver's own for the calls a run makes:
 * each counts and times the call and forwards it. The table wrapped is the real driver's or the
 * emulator's (one slot each, process-wide: the real library is loaded once per process), so the
 * counts of the emulator are those of libcuda.so.1 for the same run: the launch path is one. The
 * emulator's launch runs the kernel on the CPU: its time is the kernels', the rest is the host's.
 * With XTC_CUDA_CALLS=print the process-wide counts go to stderr when a session closes. */
#include "rt_cuda.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const rt_cu_call_names[RT_CU_NCALLS] = {
    "context", "sync", "alloc", "free", "htod", "dtoh", "dtod", "memset", "launch", "register", "event", "graph",
};

static atomic_ullong count[RT_CU_NCALLS], ns[RT_CU_NCALLS];
static RtCuDriver real[2]; /* the wrapped tables: [0] libcuda.so.1, [1] the emulator */

void rt_cu_calls(RtCuCalls *out)
{
    for (int k = 0; k < RT_CU_NCALLS; k++) {
        out->calls[k] = atomic_load(&count[k]);
        out->host_s[k] = 1e-9 * (double)atomic_load(&ns[k]);
    }
}

void rt_cu_calls_print(FILE *f)
{
    RtCuCalls c;
    rt_cu_calls(&c);
    fprintf(f, "xtc: CUDA driver calls of this process (count, host ms):");
    for (int k = 0; k < RT_CU_NCALLS; k++)
        if (c.calls[k])
            fprintf(f, " %s %llu %.3f", rt_cu_call_names[k], (unsigned long long)c.calls[k], 1e3 * c.host_s[k]);
    fprintf(f, "\n");
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void counted(int kind, uint64_t t0)
{
    atomic_fetch_add_explicit(&count[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ns[kind], now_ns() - t0, memory_order_relaxed);
}

/* one set of counting entry points per slot S of real[] */
#define WRAP(S, KIND, FIELD, PARAMS, ARGS)                                                                               \
    static CUresult FIELD##S PARAMS                                                                                    \
    {                                                                                                                  \
        uint64_t t0 = now_ns();                                                                                        \
        CUresult r = real[S].FIELD ARGS;                                                                               \
        counted(RT_CU_CALL_##KIND, t0);                                                                                \
        return r;                                                                                                      \
    }
#define WRAPS(S)                                                                                                       \
    WRAP(S, CONTEXT, CtxSetCurrent, (CUcontext c), (c))                                                                \
    WRAP(S, SYNC, StreamSynchronize, (CUstream s), (s))                                                                \
    WRAP(S, SYNC, EventSynchronize, (CUevent e), (e))                                                                  \
    WRAP(S, ALLOC, MemAlloc, (CUdeviceptr * p, size_t b), (p, b))                                                      \
    WRAP(S, FREE, MemFree, (CUdeviceptr p), (p))                                                                       \
    WRAP(S, HTOD, MemcpyHtoDAsync, (CUdeviceptr d, const void *h, size_t b, CUstream s), (d, h, b, s))                 \
    WRAP(S, DTOH, MemcpyDtoHAsync, (void *h, CUdeviceptr d, size_t b, CUstream s), (h, d, b, s))                       \
    WRAP(S, DTOD, MemcpyDtoDAsync, (CUdeviceptr d, CUdeviceptr f, size_t b, CUstream s), (d, f, b, s))                 \
    WRAP(S, MEMSET, MemsetD8Async, (CUdeviceptr d, unsigned char v, size_t b, CUstream s), (d, v, b, s))               \
    WRAP(S, REGISTER, MemHostRegister, (void *p, size_t b, unsigned f), (p, b, f))                                     \
    WRAP(S, REGISTER, MemHostUnregister, (void *p), (p))                                                               \
    WRAP(S, EVENT, EventRecord, (CUevent e, CUstream s), (e, s))                                                       \
    WRAP(S, LAUNCH, LaunchKernel,                                                                                      \
         (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh,      \
          CUstream s, void **p, void **e),                                                                             \
         (f, gx, gy, gz, bx, by, bz, sh, s, p, e))                                                                     \
    WRAP(S, GRAPH, StreamBeginCapture, (CUstream s, int m), (s, m))                                                    \
    WRAP(S, GRAPH, StreamEndCapture, (CUstream s, CUgraph * g), (s, g))                                                \
    WRAP(S, GRAPH, GraphInstantiateWithFlags, (CUgraphExec * x, CUgraph g, unsigned long long f), (x, g, f))           \
    WRAP(S, GRAPH, GraphExecUpdate, (CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo * i), (x, g, i))            \
    WRAP(S, GRAPH, GraphLaunch, (CUgraphExec x, CUstream s), (x, s))

WRAPS(0)
WRAPS(1)

#define SET(S, FIELD)                                                                                                  \
    if (d->FIELD)                                                                                                      \
        d->FIELD = FIELD##S;
#define SETS(S)                                                                                                        \
    SET(S, CtxSetCurrent)                                                                                              \
    SET(S, StreamSynchronize)                                                                                          \
    SET(S, EventSynchronize)                                                                                           \
    SET(S, MemAlloc)                                                                                                   \
    SET(S, MemFree)                                                                                                    \
    SET(S, MemcpyHtoDAsync)                                                                                            \
    SET(S, MemcpyDtoHAsync)                                                                                            \
    SET(S, MemcpyDtoDAsync)                                                                                            \
    SET(S, MemsetD8Async)                                                                                              \
    SET(S, MemHostRegister)                                                                                            \
    SET(S, MemHostUnregister)                                                                                          \
    SET(S, EventRecord)                                                                                                \
    SET(S, LaunchKernel)                                                                                               \
    SET(S, StreamBeginCapture)                                                                                         \
    SET(S, StreamEndCapture)                                                                                           \
    SET(S, GraphInstantiateWithFlags)                                                                                  \
    SET(S, GraphExecUpdate)                                                                                            \
    SET(S, GraphLaunch)

int rt_cu_count_calls(RtCuDriver *d)
{
    const char *env = getenv("XTC_CUDA_CALLS");
    if (!env || !*env || !strcmp(env, "0"))
        return 0;
    int s = d->emulated ? 1 : 0;
    real[s] = *d;
    if (s) {
        SETS(1)
    } else {
        SETS(0)
    }
    return !strcmp(env, "print") ? 2 : 1;
}
