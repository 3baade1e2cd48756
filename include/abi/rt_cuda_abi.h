/* rt_cuda_abi.h: the binary interface between a CUDA module (model.so compiled with
 * --target cuda or cuda-emu) and the runtime's CUDA device (runtime/rt_cuda.c).
 *
 * A CUDA module is an ordinary xtc module (rt_abi.h: `xtc_module_v1` with the same metadata as
 * a CPU module) that also exports `xtc_cuda_module_v1`, an XtcCudaModuleV1. Its xtc_module_v1.run
 * is a stub that fails: the runtime sees the CUDA symbol and runs the schedule through
 * XtcCudaModuleV1.run instead, which calls back into the runtime for every kernel launch.
 *
 *   --target cuda      ptx holds the PTX of every kernel (NVRTC at compile time); the runtime
 *                      loads libcuda.so.1 and JIT-loads the PTX on the device.
 *   --target cuda-emu  emu holds the same CUDA C compiled for the host with the emulation header
 *                      (codegen/cuda/xtc_cuda_emu.h); the runtime drives it through an emulated
 *                      Driver API (runtime/rt_cuda_emu.c), so no GPU or driver is needed.
 *
 * Kernel arguments are those of cuLaunchKernel: args[i] points at the value of parameter i.
 * Every generated kernel takes (out, in0, [in1, [in2,]] sym0, ..., symN, status): device
 * pointers, the values of all the module's symbols as 64-bit integers, and a pointer to the
 * step's status word, set non-zero by the kernel when its inputs are out of range (an index
 * outside a table, a target beyond the classes, an integer division by zero).
 *
 * This header is also compiled into every CUDA module (codegen embeds its text), so it must stay
 * plain C with no includes but stdint.h and stddef.h. */
#ifndef XTC_RT_CUDA_ABI_H
#define XTC_RT_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#define XTC_CUDA_SYMBOL "xtc_cuda_module_v1"
#define XTC_CUDA_MAGIC 0x41445543u /* "CUDA" little-endian */
#define XTC_CUDA_VERSION 2
#define XTC_EMU_MAGIC 0x554d4558u  /* "XEMU" little-endian */
#define XTC_EMU_VERSION 1

/* What the runtime hands to a CUDA module's run function. */
typedef struct XtcCudaApi {
    void *ctx;
    /* Launches kernel k (index into XtcCudaModuleV1.kernel_names) over grid[0..2] blocks of
     * block[0..2] threads. Returns 0, or non-zero when the launch failed (message kept by the
     * runtime). */
    int32_t (*launch)(void *ctx, int32_t kernel, const uint32_t *grid, const uint32_t *block, void **args);
    /* Sets bytes of device memory at ptr to zero (before a kernel that accumulates). */
    int32_t (*zero)(void *ctx, void *ptr, uint64_t bytes);
    /* Profiling: called before step s, and with s = number of steps after the last one; NULL
     * when not profiling. */
    void (*step)(void *ctx, int32_t s);
} XtcCudaApi;

/* bufs[i]: device address of metadata buffer i; syms[s]: symbol values; status: device array
 * of one int32 per step, zero on entry. Returns 0, or non-zero when a launch failed. */
typedef int32_t (*XtcCudaRunFn)(void *const *bufs, const int64_t *syms, int32_t *status, const XtcCudaApi *api);

struct XtcEmuModule;

typedef struct XtcCudaModuleV1 {
    uint32_t magic;                   /* XTC_CUDA_MAGIC */
    uint32_t version;                 /* XTC_CUDA_VERSION */
    const char *arch;                 /* the GPU architecture the PTX is for: "sm_80" */
    const char *ptx;                  /* PTX of every kernel; NULL in an emulated module */
    const char *source;               /* the CUDA C of every kernel, for inspection */
    int32_t nkernels;
    const char *const *kernel_names;  /* entry points in the PTX / the emulated module */
    XtcCudaRunFn run;
    const struct XtcEmuModule *emu;   /* cuda-emu: the kernels compiled for the host; else NULL */
    /* How each metadata buffer's values are stored on the device (compile --dtype): 0 as on the
     * host, XTC_CUDA_BF16 or XTC_CUDA_FP16 for f32 buffers kept in 16 bits. The runtime converts
     * on upload and download; the host side always sees f32. */
    int32_t nbufs;
    const uint8_t *buf_storage;
} XtcCudaModuleV1;

enum { XTC_CUDA_F32 = 0, XTC_CUDA_BF16 = 1, XTC_CUDA_FP16 = 2 };

/* ---- emulated modules (codegen/cuda/xtc_cuda_emu.h implements the launcher) ---- */

/* Calls the kernel for the current emulated thread with cuLaunchKernel-style arguments. */
typedef void (*XtcEmuCallFn)(void **args);

typedef struct XtcEmuKernel {
    const char *name;
    XtcEmuCallFn call;
    int32_t sync; /* uses __syncthreads or warp operations: each thread needs its own stack */
} XtcEmuKernel;

enum { XTC_EMU_FORWARD, XTC_EMU_REVERSE, XTC_EMU_SHUFFLED };

typedef struct XtcEmuLaunch {
    uint32_t grid[3], block[3];
    int32_t order;   /* XTC_EMU_*: the order threads of a block are run in between barriers */
    void **cache;    /* the launcher's reusable memory (thread stacks), owned by the caller:
                        *cache starts NULL and is freed with XtcEmuModule.release */
    char *err;       /* why a launch failed */
    size_t nerr;
} XtcEmuLaunch;

typedef struct XtcEmuModule {
    uint32_t magic;   /* XTC_EMU_MAGIC */
    uint32_t version; /* XTC_EMU_VERSION */
    int32_t nkernels;
    const XtcEmuKernel *kernels;
    /* Runs kernel k over the grid, block after block. 0, or -1 with a message in l->err (a
     * deadlock at a barrier, a warp operation with an exited lane, a bad block size, ...). */
    int32_t (*launch)(const XtcEmuKernel *k, const XtcEmuLaunch *l, void **args);
    void (*release)(void *cache);
} XtcEmuModule;

#endif
