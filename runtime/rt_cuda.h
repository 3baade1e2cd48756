/* rt_cuda.h: the runtime's CUDA device, internal to the runtime.
 *
 *   rt_cuda.c         the device a session runs a CUDA module on: device memory (weights uploaded
 *                     once, inputs when rebound, one arena for the intermediates laid out by the
 *                     session's plan of it, at their device sizes), a stream, the launches,
 *                     outputs copied back, per-step status words, profiling with CUDA events (one
 *                     recorded on the stream before every step and one after the last: step s
 *                     takes elapsed(ev[s], ev[s+1]))
 *   rt_cuda_driver.c  the Driver API of libcuda.so.1, loaded with dlopen
 *   rt_cuda_emu.c     the same API emulated on the CPU for cuda-emu modules: memory is malloc,
 *                     cuLaunchKernel runs the grid through the module's emulator
 *
 * rt_cuda.c only ever calls the Driver API through an RtCuDriver, so the launch path is the same
 * for a GPU and for the emulator. No CUDA header is used: the few types, constants and functions
 * are declared here with the driver's own names and signatures. */
#ifndef XTC_RT_CUDA_H
#define XTC_RT_CUDA_H

#include "rt_cuda_abi.h"
#include "rt_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct {
    int result; /* CUgraphExecUpdateResult */
    CUgraphNode errorNode, errorFromNode;
} CUgraphExecUpdateResultInfo;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
};
enum { CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };

typedef struct RtCuDriver {
    char name[128];   /* "libcuda.so.1", "the xtc CUDA emulator" */
    int emulated;     /* modules are XtcEmuModule images rather than PTX */
    CUresult (*Init)(unsigned flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*DeviceGetCount)(int *count);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*DeviceGetAttribute)(int *value, int attribute, CUdevice dev);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*CtxSetCurrent)(CUcontext ctx);
    CUresult (*StreamCreate)(CUstream *stream, unsigned flags);
    CUresult (*StreamDestroy)(CUstream stream);
    CUresult (*StreamSynchronize)(CUstream stream);
    CUresult (*MemAlloc)(CUdeviceptr *ptr, size_t bytes);
    CUresult (*MemFree)(CUdeviceptr ptr);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream);
    /* page-locking host memory the device copies into (optional: NULL when the driver lacks it) */
    CUresult (*MemHostRegister)(void *p, size_t bytes, unsigned flags);
    CUresult (*MemHostUnregister)(void *p);
    CUresult (*ModuleLoadDataEx)(CUmodule *mod, const void *image, unsigned nopts, int *opts, void **values);
    CUresult (*ModuleUnload)(CUmodule mod);
    CUresult (*ModuleGetFunction)(CUfunction *fn, CUmodule mod, const char *name);
    CUresult (*LaunchKernel)(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared_bytes, CUstream stream, void **params, void **extra);
    CUresult (*EventCreate)(CUevent *event, unsigned flags);
    CUresult (*EventDestroy)(CUevent event);
    CUresult (*EventRecord)(CUevent event, CUstream stream);
    CUresult (*EventSynchronize)(CUevent event);
    CUresult (*EventElapsedTime)(float *ms, CUevent start, CUevent end);
    CUresult (*GetErrorString)(CUresult error, const char **text);
    /* The emulator's account of the last failed launch of a module (a deadlock at a barrier...);
     * NULL for the real driver. */
    const char *(*LaunchError)(CUmodule mod);
    /* CUDA graphs (rt_cuda_graph.c), optional: NULL where the driver lacks them (the emulator) */
    CUresult (*StreamBeginCapture)(CUstream stream, int mode);
    CUresult (*StreamEndCapture)(CUstream stream, CUgraph *graph);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
    CUresult (*GraphExecUpdate)(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info);
    CUresult (*GraphLaunch)(CUgraphExec exec, CUstream stream);
    CUresult (*GraphExecDestroy)(CUgraphExec exec);
    CUresult (*GraphDestroy)(CUgraph graph);
} RtCuDriver;

/* rt_cuda_graph.c: the schedule's CUDA graphs (see the file). The key of a run is
 * RT_MAXSYM + nbufs + 1 words: rt_cu_graph_key. */
#define RT_CU_GRAPHS 4
typedef struct {
    CUgraphExec exec;    /* NULL: a free slot */
    CUgraph graph;
    uint64_t *key;
    uint64_t used;       /* the clock when last launched */
} RtCuGraph;
typedef struct {
    int enabled;         /* the driver has graphs, XTC_CUDA_GRAPHS is not 0, no capture failed */
    int nkey;
    RtCuGraph e[RT_CU_GRAPHS];
    uint64_t clock;
    int64_t captures, instantiations, updates, replays; /* counts, for tests and reports */
} RtCuGraphs;
void rt_cu_graphs_init(RtCuGraphs *g, const RtCuDriver *drv, int nkey);
void rt_cu_graphs_free(RtCuGraphs *g, const RtCuDriver *drv);
void rt_cu_graph_key(uint64_t *key, const int64_t *syms, void *const *dptr, int nbufs, CUdeviceptr status);
/* The slot holding key, or -1 - the slot a capture of it goes to (a free one, else the least
 * recently used). */
int rt_cu_graph_find(const RtCuGraphs *g, const uint64_t *key);
/* Runs the schedule through the graph of key: replayed, or captured first (issue(ctx) queues
 * the schedule's work on stream; nonzero: a launch failed). 0 when it was launched; 1 when the
 * caller must run the schedule step by step (graphs off, the capture failed or was refused: then
 * nothing ran); -1 / -2 with a message when the graph's launch failed. */
int rt_cu_graph_run(RtCuGraphs *g, const RtCuDriver *drv, CUstream stream, const uint64_t *key,
                    int (*issue)(void *ctx), void *ctx, char *err, size_t n);

/* rt_cuda_driver.c: loads libcuda.so.1 (or $XTC_LIBCUDA) and fills d. -1 with a message when
 * there is no driver or it lacks a function. The library stays loaded for the process. */
int rt_cu_driver_load(RtCuDriver *d, char *err, size_t n);
/* rt_cuda_emu.c: fills d with the emulated driver. Threads of a launch run in the order
 * $XTC_CUDA_EMU_ORDER names: forward (default), reverse or shuffled. */
void rt_cu_emulator(RtCuDriver *d);
/* The bytes the emulator has copied, process-wide, since it started: host to device, device to
 * host and device to device (a diagnostic: what a session moves across the bus per run). */
void rt_cu_emu_traffic(uint64_t bytes[3]);
/* The host memory registered with the emulator (cuMemHostRegister) now, process-wide: how many
 * ranges and how many bytes. */
void rt_cu_emu_registered(int64_t *ranges, uint64_t *bytes);

/* rt_cuda_calls.c: the driver calls of the process's CUDA sessions, by kind, and the host's time
 * inside them, counted where $XTC_CUDA_CALLS is set when a session is created (a diagnostic). */
enum {
    RT_CU_CALL_CONTEXT,  /* cuCtxSetCurrent */
    RT_CU_CALL_SYNC,     /* cuStreamSynchronize, cuEventSynchronize */
    RT_CU_CALL_ALLOC,    /* cuMemAlloc */
    RT_CU_CALL_FREE,     /* cuMemFree */
    RT_CU_CALL_HTOD,     /* cuMemcpyHtoDAsync */
    RT_CU_CALL_DTOH,     /* cuMemcpyDtoHAsync */
    RT_CU_CALL_DTOD,     /* cuMemcpyDtoDAsync */
    RT_CU_CALL_MEMSET,   /* cuMemsetD8Async */
    RT_CU_CALL_LAUNCH,   /* cuLaunchKernel */
    RT_CU_CALL_REGISTER, /* cuMemHostRegister, cuMemHostUnregister */
    RT_CU_CALL_EVENT,    /* cuEventRecord */
    RT_CU_CALL_GRAPH,    /* captures, instantiations, updates and launches of graphs */
    RT_CU_NCALLS
};
extern const char *const rt_cu_call_names[RT_CU_NCALLS];
typedef struct {
    uint64_t calls[RT_CU_NCALLS];
    double host_s[RT_CU_NCALLS]; /* seconds the host spent inside them */
} RtCuCalls;
void rt_cu_calls(RtCuCalls *out);
void rt_cu_calls_print(FILE *f);
/* Wraps d's entry points in counting ones where $XTC_CUDA_CALLS is set: 0 when not, 2 when it is
 * "print" (the caller prints the counts when it closes), else 1. */
int rt_cu_count_calls(RtCuDriver *d);

/* "CUDA_ERROR_... (text)" for an error code of d. */
const char *rt_cu_error_text(const RtCuDriver *d, CUresult r, char *buf, size_t n);

/* rt_cuda.c: the device of CUDA modules (see RtDeviceOps in rt_internal.h). */
extern const RtDeviceOps rt_cuda_device;

#endif
