/* rt_cuda.c: the CUDA device a session runs a CUDA module on (RtDeviceOps, see rt_internal.h).
 *
 * open:  the driver (libcuda.so.1, or the emulator for cuda-emu modules), the device
 *        ($XTC_CUDA_DEVICE, default 0) and its primary context, a stream, the module (the PTX,
 *        JIT-compiled by the driver for the device, with the JIT's log in any error) and its
 *        kernels. No driver or no device is an error here, from xtc_session_new.
 * run:   uploads the inputs and weights that changed since the last run (weights: once), lays
 *        the intermediates out in one device arena at the offsets of the session's device plan,
 *        clears one status word per step, runs the module's schedule (every launch on the
 *        stream), copies the outputs the session did not leave on the device (RtDeviceRun.lazy:
 *        by default all of them, rs_lazy_outputs) back into the host arena and synchronises;
 *        then the first step whose status word is set is the one that met bad values (a token
 *        id outside the vocabulary ...). fetch copies an output left on the device back when
 *        the session's caller reads it. With profiling on, a CUDA event is recorded on the stream before every
 *        step and one after the last; after the synchronisation, step s gets the time between
 *        events s and s+1 (cuEventElapsedTime): the device's time for its launch (and the memset
 *        of an accumulating kernel), without the host's launch overhead or the copies.
 *        With XTC_CUDA_GRAPHS=1 and without profiling the schedule goes through a CUDA graph where the driver has them
 *        (rt_cuda_graph.c): captured once per binding of the symbols and buffer addresses,
 *        then replayed with one launch (otherwise: step by step).
 * carry: xtc_session_carry's copy of an output into an input, device to device: the input's
 *        device copy becomes the output's value and is not uploaded again, so a KV cache never
 *        crosses the bus while decoding (it did twice per token: down with the outputs, up as the
 *        changed input). Its memory is allocated a quarter larger than the value, so that the
 *        next runs can write a cache growing by a token a call in place over it (the session's
 *        RtDeviceRun.place; the concat kernel skips the rows already there), and the carry
 *        then copies nothing; it is reallocated only when the cache outgrows it.
 * adamw: xtc_session_step on the device (rt_optim.c decides and adds the per-block sums): the
 *        kernels of codegen/cuda/kernels/adamw.cuh over f32 master weights and moments kept
 *        here, the gradients where the last run left them, the device weights rewritten in
 *        their storage.
 * close: frees all of it.
 *
 * The session plans two arenas with one planner (rt_session.c): the device arena, where every
 * intermediate lives at its device size (cuda_elem_bytes), whose offsets the run receives; and
 * the host arena, which holds only the outputs, in f32, where they are copied back: outputs
 * are views like a CPU session's.
 *
 * A module compiled with --dtype bf16 or fp16 keeps f32 buffers in 16 bits on the device
 * (XtcCudaModuleV1.buf_storage): inputs and weights are rounded to it on upload (through a host
 * staging buffer) and outputs widened back to f32 on download, so the session's interface and
 * its host copies (the optimizer's master weights included) stay f32. Intermediates take 2
 * bytes per element in the device arena, so its activation memory is about half the f32
 * module's; the buffers that stay f32 (cg_keeps_f32: the loss ...) take 4. */
#include "rt_cuda.h"
#include "rt_alloc.h"
#include "rt_half.h"

#include <stdlib.h>
#include <string.h>

struct RtDevice {
    const XtcModule *m;
    const XtcCudaModuleV1 *cm;
    RtCuDriver drv;
    CUdevice dev;
    CUcontext ctx;
    int retained;
    CUstream stream;
    CUmodule mod;
    CUfunction *fn;         /* [nkernels] */
    CUdeviceptr *dbuf;      /* [nbufs]: device copies of inputs, parameters and state buffers */
    size_t *dbytes;         /* [nbufs]: their allocated sizes */
    CUdeviceptr arena;
    size_t arena_bytes;
    CUdeviceptr status;     /* [nsteps + 1] int32 */
    int32_t *host_status;
    void **dptr;            /* [nbufs]: device addresses handed to the schedule */
    CUevent *ev;            /* [nsteps + 1], created when profiling is first asked for */
    int profiling;
    CUresult event_error;   /* the first failed cuEventRecord of the run */
    int step;               /* the step being launched, for messages */
    char err[1024];         /* why a launch failed */
    char device_name[256];
    void *stage;            /* host staging for 16-bit uploads and downloads */
    size_t stage_bytes;
    int stage_pinned;       /* stage is registered with the driver, as the host arena below */
    void *pinned;           /* the session's host arena, registered with the driver (page-locked:
                             * outputs come back at the bus's speed, not through the driver's
                             * own staging), or NULL: see cuda_host_arena */
    void *host;             /* the session's host arena and its bytes */
    size_t host_bytes;
    size_t host_copied;     /* bytes copied into it since it was allocated */
    int host_refused;       /* the driver refused to register it */
    /* the AdamW step (cuda_adamw): the kernels' indices in fn (-1: none), the master weights and
     * moments [opt_total], the per-block sums [opt_nblocks], the kernels' tables */
    int k_norm, k_update;
    int64_t opt_total, opt_nblocks;
    CUdeviceptr opt_master, opt_m, opt_v, opt_partial, opt_tables;
    void *opt_host;         /* the tables as uploaded */
    size_t opt_tables_bytes;
    RtCuGraphs graphs;      /* the schedule's CUDA graphs (rt_cuda_graph.c) */
    uint64_t *key;          /* [RT_MAXSYM + nbufs + 1]: this run's graph key */
    int print_calls;        /* XTC_CUDA_CALLS=print: the driver calls to stderr at close */
};

/* -1 with the message in err; -2 when the driver ran out of memory */
static int cu_fail(RtDevice *d, CUresult r, const char *what, char *err, size_t n)
{
    char text[200];
    rt_set_error(err, n, "%s (%s): %s", what, d->drv.name, rt_cu_error_text(&d->drv, r, text, sizeof text));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -2 : -1;
}

static void close_device(RtDevice *d)
{
    if (!d)
        return;
    const RtCuDriver *drv = &d->drv;
    if (d->ctx)
        drv->CtxSetCurrent(d->ctx);
    if (d->pinned)
        drv->MemHostUnregister(d->pinned);
    if (d->stage_pinned)
        drv->MemHostUnregister(d->stage);
    if (d->ev)
        for (int s = 0; s <= d->m->nsteps; s++)
            if (d->ev[s])
                drv->EventDestroy(d->ev[s]);
    if (d->dbuf)
        for (int b = 0; b < d->m->nbufs; b++)
            if (d->dbuf[b])
                drv->MemFree(d->dbuf[b]);
    if (d->arena)
        drv->MemFree(d->arena);
    if (d->status)
        drv->MemFree(d->status);
    CUdeviceptr opt[] = {d->opt_master, d->opt_m, d->opt_v, d->opt_partial, d->opt_tables};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (opt[i])
            drv->MemFree(opt[i]);
    free(d->opt_host);
    rt_cu_graphs_free(&d->graphs, drv);
    free(d->key);
    if (d->mod)
        drv->ModuleUnload(d->mod);
    if (d->stream)
        drv->StreamDestroy(d->stream);
    if (d->retained)
        drv->DevicePrimaryCtxRelease(d->dev);
    free(d->ev);
    free(d->fn);
    free(d->dbuf);
    free(d->dbytes);
    free(d->dptr);
    free(d->host_status);
    free(d->stage);
    if (d->print_calls)
        rt_cu_calls_print(stderr);
    free(d);
}

/* The driver JIT-compiles the PTX for the device: its log goes into the message. */
static int load_module(RtDevice *d, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    char log[4096] = "";
    int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[2] = {log, (void *)(uintptr_t)sizeof log};
    const void *image = drv->emulated ? (const void *)d->cm->emu : (const void *)d->cm->ptx;
    if (!image) {
        rt_set_error(err, n, "this CUDA module has no code for %s (compile it with --target %s)", drv->name,
                     drv->emulated ? "cuda-emu" : "cuda");
        return -1;
    }
    CUresult r = drv->ModuleLoadDataEx(&d->mod, image, 2, opts, values);
    if (r != CUDA_SUCCESS) {
        char text[200];
        log[sizeof log - 1] = 0;
        rt_set_error(err, n, "loading the module's kernels on %s (PTX for %s): %s%s%.700s", d->device_name,
                     d->cm->arch ? d->cm->arch : "?", rt_cu_error_text(drv, r, text, sizeof text), log[0] ? ": " : "",
                     log);
        return r == CUDA_ERROR_OUT_OF_MEMORY ? -2 : -1;
    }
    d->k_norm = d->k_update = -1;
    for (int k = 0; k < d->cm->nkernels; k++) {
        if ((r = drv->ModuleGetFunction(&d->fn[k], d->mod, d->cm->kernel_names[k])) != CUDA_SUCCESS) {
            char what[200];
            snprintf(what, sizeof what, "kernel %s is missing from the module", d->cm->kernel_names[k]);
            return cu_fail(d, r, what, err, n);
        }
        if (!strcmp(d->cm->kernel_names[k], "xtc_adamw_norm"))
            d->k_norm = k;
        if (!strcmp(d->cm->kernel_names[k], "xtc_adamw_update"))
            d->k_update = k;
    }
    return 0;
}

/* The compute capability the module's PTX needs, from its arch ("sm_80" -> 80). */
static int arch_of(const char *arch)
{
    int v = 0;
    for (const char *p = arch ? arch : ""; *p; p++)
        if (*p >= '0' && *p <= '9')
            v = v * 10 + (*p - '0');
        else if (v)
            break;
    return v;
}

static int cuda_open(const XtcModule *m, RtDevice **out, char *err, size_t n)
{
    *out = NULL;
    RtDevice *d = rt_calloc(1, sizeof *d);
    if (!d) {
        rt_set_error(err, n, "out of memory opening the CUDA device");
        return XTC_ERR_MEMORY;
    }
    d->m = m;
    d->cm = m->device_abi;
    if (d->cm->nbufs != m->nbufs || (m->nbufs && !d->cm->buf_storage)) {
        rt_set_error(err, n, "malformed CUDA module: storage of %d buffers for %d (recompile it)", d->cm->nbufs,
                     m->nbufs);
        free(d);
        return XTC_ERR_FORMAT;
    }
    for (int b = 0; b < m->nbufs; b++)
        if (d->cm->buf_storage[b] > XTC_CUDA_FP16 || (d->cm->buf_storage[b] && m->bufs[b].dtype != XTC_F32)) {
            rt_set_error(err, n, "malformed CUDA module: buffer '%s' has storage %d (recompile it)", m->bufs[b].name,
                         d->cm->buf_storage[b]);
            free(d);
            return XTC_ERR_FORMAT;
        }
    size_t nb = (size_t)m->nbufs + 1, nk = (size_t)d->cm->nkernels + 1, ns = (size_t)m->nsteps + 1;
    d->fn = rt_calloc(nk, sizeof *d->fn);
    d->dbuf = rt_calloc(nb, sizeof *d->dbuf);
    d->dbytes = rt_calloc(nb, sizeof *d->dbytes);
    d->dptr = rt_calloc(nb, sizeof *d->dptr);
    d->host_status = rt_calloc(ns, sizeof *d->host_status);
    d->key = rt_calloc((size_t)RT_MAXSYM + nb, sizeof *d->key);
    if (!d->fn || !d->dbuf || !d->dbytes || !d->dptr || !d->host_status || !d->key) {
        close_device(d);
        rt_set_error(err, n, "out of memory opening the CUDA device");
        return XTC_ERR_MEMORY;
    }
    if (d->cm->emu)
        rt_cu_emulator(&d->drv);
    else if (rt_cu_driver_load(&d->drv, err, n) < 0) {
        close_device(d);
        return XTC_ERR_IO;
    }
    d->print_calls = rt_cu_count_calls(&d->drv) == 2;
    const RtCuDriver *drv = &d->drv;
    rt_cu_graphs_init(&d->graphs, drv, RT_MAXSYM + m->nbufs + 1);
    CUresult r = drv->Init(0);
    if (r != CUDA_SUCCESS) {
        cu_fail(d, r, r == CUDA_ERROR_NO_DEVICE ? "no CUDA device: cuInit failed" : "cuInit failed", err, n);
        close_device(d);
        return XTC_ERR_IO;
    }
    int count = 0, ordinal = 0;
    const char *env = getenv("XTC_CUDA_DEVICE");
    if (env && *env)
        ordinal = atoi(env);
    if ((r = drv->DeviceGetCount(&count)) != CUDA_SUCCESS || count == 0) {
        if (r == CUDA_SUCCESS)
            rt_set_error(err, n, "no CUDA device (%s reports none)", drv->name);
        else
            cu_fail(d, r, "cannot count the CUDA devices", err, n);
        close_device(d);
        return XTC_ERR_IO;
    }
    if (ordinal < 0 || ordinal >= count) {
        rt_set_error(err, n, "XTC_CUDA_DEVICE=%s, but there %s only %d CUDA device%s", env, count == 1 ? "is" : "are",
                     count, count == 1 ? "" : "s");
        close_device(d);
        return XTC_ERR_ARG;
    }
    int major = 0, minor = 0;
    if ((r = drv->DeviceGet(&d->dev, ordinal)) != CUDA_SUCCESS ||
        (r = drv->DeviceGetName(d->device_name, (int)sizeof d->device_name, d->dev)) != CUDA_SUCCESS ||
        (r = drv->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev)) != CUDA_SUCCESS ||
        (r = drv->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev)) != CUDA_SUCCESS) {
        cu_fail(d, r, "cannot query the CUDA device", err, n);
        close_device(d);
        return XTC_ERR_IO;
    }
    int need = arch_of(d->cm->arch);
    if (!drv->emulated && need > major * 10 + minor) {
        rt_set_error(err, n, "the module's PTX is for %s, but %s has compute capability %d.%d: recompile with "
                     "--cuda-arch sm_%d%d", d->cm->arch, d->device_name, major, minor, major, minor);
        close_device(d);
        return XTC_ERR_FORMAT;
    }
    if ((r = drv->DevicePrimaryCtxRetain(&d->ctx, d->dev)) != CUDA_SUCCESS) {
        cu_fail(d, r, "cannot create a CUDA context", err, n);
        close_device(d);
        return XTC_ERR_IO;
    }
    d->retained = 1;
    if ((r = drv->CtxSetCurrent(d->ctx)) != CUDA_SUCCESS ||
        (r = drv->StreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        cu_fail(d, r, "cannot create a CUDA stream", err, n);
        close_device(d);
        return XTC_ERR_IO;
    }
    int loaded = load_module(d, err, n);
    if (loaded < 0) {
        close_device(d);
        return loaded == -2 ? XTC_ERR_MEMORY : XTC_ERR_FORMAT;
    }
    if ((r = drv->MemAlloc(&d->status, ((size_t)m->nsteps + 1) * sizeof(int32_t))) != CUDA_SUCCESS) {
        cu_fail(d, r, "cannot allocate device memory", err, n);
        close_device(d);
        return XTC_ERR_MEMORY;
    }
    *out = d;
    return XTC_OK;
}

/* ---- the callbacks the module's schedule makes (XtcCudaApi) ---- */

static int32_t api_launch(void *ctx, int32_t kernel, const uint32_t *grid, const uint32_t *block, void **args)
{
    RtDevice *d = ctx;
    const RtCuDriver *drv = &d->drv;
    CUresult r = drv->LaunchKernel(d->fn[kernel], grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                                   d->stream, args, NULL);
    if (r == CUDA_SUCCESS)
        return 0;
    const char *why = drv->LaunchError ? drv->LaunchError(d->mod) : NULL;
    char text[200];
    const RtStep *st = d->step >= 0 && d->step < d->m->nsteps ? &d->m->steps[d->step] : NULL;
    rt_set_error(d->err, sizeof d->err, "step %d (%s %%%s): launching %s (grid %ux%ux%u, block %u) on %s failed: %s",
                 d->step, st ? st->op : "?", st ? st->label : "?", d->cm->kernel_names[kernel], grid[0], grid[1],
                 grid[2], block[0], d->device_name, why ? why : rt_cu_error_text(drv, r, text, sizeof text));
    return 1;
}

static int32_t api_zero(void *ctx, void *ptr, uint64_t bytes)
{
    RtDevice *d = ctx;
    if (!bytes)
        return 0;
    CUresult r = d->drv.MemsetD8Async((CUdeviceptr)(uintptr_t)ptr, 0, (size_t)bytes, d->stream);
    if (r == CUDA_SUCCESS)
        return 0;
    char text[200];
    rt_set_error(d->err, sizeof d->err, "step %d: clearing %llu bytes of device memory: %s", d->step,
                 (unsigned long long)bytes, rt_cu_error_text(&d->drv, r, text, sizeof text));
    return 1;
}

static void api_step(void *ctx, int32_t s)
{
    RtDevice *d = ctx;
    d->step = s;
    if (d->profiling && d->ev[s]) {
        CUresult r = d->drv.EventRecord(d->ev[s], d->stream);
        if (r != CUDA_SUCCESS && d->event_error == CUDA_SUCCESS)
            d->event_error = r;
    }
}

/* ---- running ---- */

/* The schedule's work queued on the stream, launch by launch (or into a graph's capture):
 * nonzero when a launch failed, with the message in d->err. */
typedef struct {
    RtDevice *d;
    const int64_t *syms;
} Issue;

static int issue(void *ctx)
{
    Issue *is = ctx;
    RtDevice *d = is->d;
    XtcCudaApi api = {.ctx = d, .launch = api_launch, .zero = api_zero, .step = api_step};
    d->step = -1;
    d->err[0] = 0;
    d->event_error = CUDA_SUCCESS;
    return d->cm->run(d->dptr, is->syms, (int32_t *)(uintptr_t)d->status, &api) != 0;
}

/* The bytes of buffer b on the device: 2 per element where it is stored in 16 bits. */
static size_t buffer_bytes(const RtDevice *d, int b, const int64_t *syms)
{
    const RtBuffer *buf = &d->m->bufs[b];
    int64_t n = rt_numel(buf->shape, buf->rank, syms);
    return n > 0 ? (size_t)n * (d->cm->buf_storage[b] ? 2 : xtc_dtype_size(buf->dtype)) : 0;
}

static int stage_reserve(RtDevice *d, size_t bytes, char *err, size_t n)
{
    if (bytes <= d->stage_bytes)
        return 0;
    const RtCuDriver *drv = &d->drv;
    if (d->stage_pinned)
        drv->MemHostUnregister(d->stage);
    d->stage_pinned = 0;
    void *p = rt_realloc(d->stage, bytes);
    if (!p) {
        rt_set_error(err, n, "out of memory: %zu bytes to convert tensors to and from 16 bits", bytes);
        return -2;
    }
    d->stage = p;
    d->stage_bytes = bytes;
    /* page-locked as the host arena (cuda_host_arena), best effort; the uploads through it
     * wait for their copy before the next reuses it */
    d->stage_pinned = drv->MemHostRegister && drv->MemHostRegister(p, bytes, 0) == CUDA_SUCCESS;
    return 0;
}

/* Device memory of at least want bytes for bound buffer b: cap bytes when it must be allocated.
 * 1 when it was (its old contents are gone), 0 when it had room, or -1 / -2 as cu_fail. */
static int device_buffer(RtDevice *d, int b, size_t want, size_t cap, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    if (d->dbuf[b] && d->dbytes[b] >= want)
        return 0;
    if (d->dbuf[b]) {
        drv->StreamSynchronize(d->stream); /* a carry's copy into it may be queued */
        drv->MemFree(d->dbuf[b]);
    }
    d->dbuf[b] = 0;
    d->dbytes[b] = 0;
    CUresult r = drv->MemAlloc(&d->dbuf[b], cap);
    if (r != CUDA_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what, "allocating %zu bytes of device memory for '%s'", cap, d->m->bufs[b].name);
        return cu_fail(d, r, what, err, n);
    }
    d->dbytes[b] = cap;
    return 1;
}

/* Device memory for bound buffer b of `bytes`; uploaded when new or changed (rounded to 16 bits
 * first where the module stores it so). */
static int upload(RtDevice *d, int b, const void *host, size_t bytes, int changed, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    CUresult r;
    int storage = d->cm->buf_storage[b];
    size_t want = bytes ? bytes : 1;
    int fresh = device_buffer(d, b, want, want, err, n);
    if (fresh < 0)
        return fresh;
    changed |= fresh;
    if (!changed || !bytes)
        return 0;
    if (storage) {
        int rs = stage_reserve(d, bytes, err, n);
        if (rs < 0)
            return rs;
        const float *src = host;
        uint16_t *dst = d->stage;
        for (size_t i = 0; i < bytes / 2; i++)
            dst[i] = rt_f32_to_half(storage, src[i]);
        host = d->stage;
    }
    char what[300];
    snprintf(what, sizeof what, "copying '%s' to the device", d->m->bufs[b].name);
    if ((r = drv->MemcpyHtoDAsync(d->dbuf[b], host, bytes, d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, what, err, n);
    /* the staging buffer is reused by the next upload */
    if (storage && (r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, what, err, n);
    return 0;
}

/* whether the run copies output buffer b back to the host: an intermediate not left on the device */
static int downloads(const XtcModule *m, const RtDeviceRun *run, int b)
{
    return m->bufs[b].kind == RT_BUF_TEMP && !(run->lazy && run->lazy[b]);
}

/* The 16-bit outputs of a run, staged one after another, widened into their f32 host places:
 * WIDEN_CHUNK values a task, on the session's threads (GPT's 59M gradients take 15 ms on one
 * core). Chunk c is found by walking the outputs in the order they were staged. */
#define WIDEN_CHUNK ((size_t)1 << 20)

typedef struct {
    RtDevice *d;
    const RtDeviceRun *run;
} WidenCtx;

/* widens chunk c (>= 0) and returns 0; with c < 0 returns the number of chunks */
static int64_t widen_chunk(RtDevice *d, const RtDeviceRun *run, int64_t c)
{
    const XtcModule *m = d->m;
    size_t staged = 0;
    int64_t chunks = 0;
    for (int o = 0; o < m->nouts; o++) {
        int b = m->outs[o].buf, storage = d->cm->buf_storage[b];
        if (!downloads(m, run, b) || !storage)
            continue;
        size_t bytes = buffer_bytes(d, b, run->syms), values = bytes / 2;
        int64_t nc = (int64_t)((values + WIDEN_CHUNK - 1) / WIDEN_CHUNK);
        if (c >= 0 && c < chunks + nc) {
            size_t lo = (size_t)(c - chunks) * WIDEN_CHUNK, len = values - lo < WIDEN_CHUNK ? values - lo : WIDEN_CHUNK;
            rt_half_widen(storage, (const uint16_t *)((char *)d->stage + staged) + lo, (float *)run->host[b] + lo, len);
            return 0;
        }
        chunks += nc;
        staged += bytes;
    }
    return chunks;
}

static void widen_task(void *ctx, int64_t lo, int64_t hi)
{
    WidenCtx *w = ctx;
    for (int64_t c = lo; c < hi; c++)
        widen_chunk(w->d, w->run, c);
}

/* one 16-bit output fetched on demand, widened WIDEN_CHUNK values a task */
typedef struct {
    int storage;
    const uint16_t *src;
    float *dst;
    size_t n;
} WidenOne;

static void widen_one_task(void *ctx, int64_t lo, int64_t hi)
{
    const WidenOne *w = ctx;
    for (int64_t c = lo; c < hi; c++) {
        size_t at = (size_t)c * WIDEN_CHUNK, len = w->n - at < WIDEN_CHUNK ? w->n - at : WIDEN_CHUNK;
        rt_half_widen(w->storage, w->src + at, w->dst + at, len);
    }
}

static void widen_outputs(RtDevice *d, const RtDeviceRun *run)
{
    int64_t n = widen_chunk(d, run, -1);
    WidenCtx w = {d, run};
    if (run->pool && n > 1)
        rt_pool_parallel_for(run->pool, widen_task, &w, n);
    else
        widen_task(&w, 0, n);
}

static void pin_host_arena(RtDevice *d);

static int32_t cuda_run(RtDevice *d, const RtDeviceRun *run, char *err, size_t n)
{
    const XtcModule *m = d->m;
    const RtCuDriver *drv = &d->drv;
    CUresult r;
    if ((r = drv->CtxSetCurrent(d->ctx)) != CUDA_SUCCESS)
        return cu_fail(d, r, "cannot make the CUDA context current", err, n);
    for (int b = 0; b < m->nbufs; b++) {
        int up = m->bufs[b].kind == RT_BUF_TEMP
                     ? 0 : upload(d, b, run->host[b], buffer_bytes(d, b, run->syms), run->changed[b], err, n);
        if (up < 0)
            return up;
    }
    if (run->arena_bytes > d->arena_bytes || !d->arena) {
        if (d->arena) {
            drv->StreamSynchronize(d->stream); /* a carry's copy out of it may be queued */
            drv->MemFree(d->arena);
        }
        d->arena = 0;
        d->arena_bytes = 0;
        size_t want = run->arena_bytes ? run->arena_bytes : 1;
        if ((r = drv->MemAlloc(&d->arena, want)) != CUDA_SUCCESS) {
            char what[200];
            snprintf(what, sizeof what, "allocating the %zu-byte activation arena", want);
            return cu_fail(d, r, what, err, n);
        }
        d->arena_bytes = run->arena_bytes;
    }
    for (int b = 0; b < m->nbufs; b++) {
        d->dptr[b] = m->bufs[b].kind == RT_BUF_TEMP ? (void *)(uintptr_t)(d->arena + run->offset[b])
                                                   : (void *)(uintptr_t)d->dbuf[b];
        int to = run->place ? run->place[b] - 1 : -1; /* an output appending to input `to` */
        if (to >= 0 && d->cm->buf_storage[b] == d->cm->buf_storage[to] && d->dbuf[to] &&
            d->dbytes[to] >= buffer_bytes(d, b, run->syms))
            d->dptr[b] = (void *)(uintptr_t)d->dbuf[to];
    }
    size_t status_bytes = ((size_t)m->nsteps + 1) * sizeof(int32_t);
    if ((r = drv->MemsetD8Async(d->status, 0, status_bytes, d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, "clearing the status words", err, n);
    d->profiling = run->step_s != NULL;
    if (d->profiling && !d->ev) {
        d->ev = rt_calloc((size_t)m->nsteps + 1, sizeof *d->ev);
        if (!d->ev) {
            rt_set_error(err, n, "out of memory for the profile");
            return -2;
        }
        for (int s = 0; s <= m->nsteps; s++)
            if ((r = drv->EventCreate(&d->ev[s], 0)) != CUDA_SUCCESS) {
                for (int k = 0; k < s; k++) /* all or none, so that the next run tries again */
                    drv->EventDestroy(d->ev[k]);
                free(d->ev);
                d->ev = NULL;
                return cu_fail(d, r, "cannot create CUDA events", err, n);
            }
    }
    Issue is = {d, run->syms};
    int32_t rc = 1;
    if (!d->profiling && d->graphs.enabled) { /* the events between steps need the launches */
        rt_cu_graph_key(d->key, run->syms, d->dptr, m->nbufs, d->status);
        int g = rt_cu_graph_run(&d->graphs, drv, d->stream, d->key, issue, &is, err, n);
        if (g < 0)
            return g;
        rc = g; /* 1: step by step */
    }
    if (rc)
        rc = issue(&is);
    if (rc != 0) {
        drv->StreamSynchronize(d->stream);
        rt_set_error(err, n, "%s", d->err[0] ? d->err : "the CUDA schedule failed");
        return -1;
    }
    /* outputs into the host arena; inputs and weights that are outputs are there already. 16-bit
     * outputs go through the staging buffer, widened once the stream is done. */
    size_t staged = 0;
    for (int o = 0; o < m->nouts; o++) {
        int b = m->outs[o].buf;
        if (downloads(m, run, b) && d->cm->buf_storage[b])
            staged += buffer_bytes(d, b, run->syms);
    }
    int rs = stage_reserve(d, staged, err, n);
    if (rs < 0)
        return rs;
    staged = 0;
    for (int o = 0; o < m->nouts; o++) {
        int b = m->outs[o].buf;
        if (!downloads(m, run, b))
            continue;
        size_t bytes = buffer_bytes(d, b, run->syms);
        void *dst = d->cm->buf_storage[b] ? (char *)d->stage + staged : run->host[b];
        if (d->cm->buf_storage[b])
            staged += bytes;
        else
            d->host_copied += bytes;
        if (bytes && (r = drv->MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)d->dptr[b], bytes, d->stream)) != CUDA_SUCCESS)
            return cu_fail(d, r, "copying an output from the device", err, n);
    }
    if ((r = drv->MemcpyDtoHAsync(d->host_status, d->status, status_bytes, d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, "copying the status words from the device", err, n);
    if ((r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, "the CUDA run failed", err, n);
    pin_host_arena(d);
    widen_outputs(d, run);
    for (int s = 0; s < m->nsteps; s++)
        if (d->host_status[s])
            return 1 + s;
    if (d->profiling) {
        if (d->event_error != CUDA_SUCCESS)
            return cu_fail(d, d->event_error, "recording the profile's CUDA events", err, n);
        for (int s = 0; s < m->nsteps; s++) {
            float ms = 0;
            if ((r = drv->EventElapsedTime(&ms, d->ev[s], d->ev[s + 1])) != CUDA_SUCCESS) {
                char what[200];
                snprintf(what, sizeof what, "reading the profile's CUDA events around step %d", s);
                return cu_fail(d, r, what, err, n);
            }
            run->step_s[s] += 1e-3 * ms;
        }
    }
    return 0;
}

static int cuda_carry(RtDevice *d, int from, int to, const int64_t *syms, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    if (d->cm->buf_storage[from] != d->cm->buf_storage[to] || !d->dptr[from])
        return 1;
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)d->dptr[from];
    if (d->dbuf[to] && src == d->dbuf[to]) /* written in place over the input by the run */
        return 0;
    size_t bytes = buffer_bytes(d, from, syms);
    CUresult r;
    if ((r = drv->CtxSetCurrent(d->ctx)) != CUDA_SUCCESS)
        return cu_fail(d, r, "cannot make the CUDA context current", err, n);
    int fresh = device_buffer(d, to, bytes ? bytes : 1, bytes + bytes / 4 + 256, err, n);
    if (fresh < 0)
        return fresh;
    if (bytes && (r = drv->MemcpyDtoDAsync(d->dbuf[to], src, bytes, d->stream)) != CUDA_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what, "copying '%s' into '%s' on the device", d->m->bufs[from].name, d->m->bufs[to].name);
        return cu_fail(d, r, what, err, n);
    }
    return 0;
}

static int cuda_fetch(RtDevice *d, int b, void *host, const int64_t *syms, void *pool, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    size_t bytes = buffer_bytes(d, b, syms);
    int storage = d->cm->buf_storage[b];
    if (!bytes)
        return 0;
    CUresult r;
    if ((r = drv->CtxSetCurrent(d->ctx)) != CUDA_SUCCESS)
        return cu_fail(d, r, "cannot make the CUDA context current", err, n);
    int rs = storage ? stage_reserve(d, bytes, err, n) : 0;
    if (rs < 0)
        return rs;
    char what[300];
    snprintf(what, sizeof what, "copying '%s' from the device", d->m->bufs[b].name);
    if ((r = drv->MemcpyDtoHAsync(storage ? d->stage : host, (CUdeviceptr)(uintptr_t)d->dptr[b], bytes, d->stream)) !=
            CUDA_SUCCESS ||
        (r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS)
        return cu_fail(d, r, what, err, n);
    if (!storage) {
        d->host_copied += bytes;
        pin_host_arena(d);
    }
    if (storage) {
        WidenOne w = {storage, d->stage, host, bytes / 2};
        int64_t chunks = (int64_t)((w.n + WIDEN_CHUNK - 1) / WIDEN_CHUNK);
        if (pool && chunks > 1)
            rt_pool_parallel_for(pool, widen_one_task, &w, chunks);
        else
            widen_one_task(&w, 0, chunks);
    }
    return 0;
}

static void cuda_close(RtDevice *d) { close_device(d); }

/* ---- the AdamW step (codegen/cuda/kernels/adamw.cuh; rt_optim.c decides and sums) ---- */

/* device memory of `bytes` at *p, kept while big enough */
static int opt_alloc(RtDevice *d, CUdeviceptr *p, size_t bytes, size_t old, char *err, size_t n)
{
    if (*p && bytes <= old)
        return 0;
    if (*p)
        d->drv.MemFree(*p);
    *p = 0;
    CUresult r = d->drv.MemAlloc(p, bytes ? bytes : 1);
    return r == CUDA_SUCCESS ? 0 : cu_fail(d, r, "allocating the optimizer's device memory", err, n);
}

/* The kernels' tables for a (the gradients where the last run left them): grads [np], weights
 * [np], offset [np + 1], then the storage bytes of the gradients [np] and the weights [np]. */
static int opt_tables(RtDevice *d, const RtAdamW *a, char *err, size_t n)
{
    size_t np = (size_t)a->nparams, bytes = np * 8 * 3 + 8 + np * 2;
    if (bytes > d->opt_tables_bytes) {
        void *h = rt_realloc(d->opt_host, bytes);
        if (!h) {
            rt_set_error(err, n, "out of memory for the optimizer's tables");
            return -2;
        }
        d->opt_host = h;
        int rc = opt_alloc(d, &d->opt_tables, bytes, 0, err, n);
        if (rc)
            return rc;
        d->opt_tables_bytes = bytes;
    }
    uint64_t *grads = d->opt_host, *weights = grads + np;
    int64_t *offset = (int64_t *)(weights + np);
    uint8_t *gs = (uint8_t *)(offset + np + 1), *ws = gs + np;
    for (size_t i = 0; i < np; i++) {
        grads[i] = (uint64_t)(uintptr_t)d->dptr[a->grad[i]];
        weights[i] = d->dbuf[a->param[i]];
        gs[i] = d->cm->buf_storage[a->grad[i]];
        ws[i] = d->cm->buf_storage[a->param[i]];
        if (!grads[i] || !weights[i]) {
            rt_set_error(err, n, "the device step has no gradient or weight '%s' on the device (run first)",
                         d->m->bufs[a->param[i]].name);
            return -1;
        }
    }
    memcpy(offset, a->offset, (np + 1) * sizeof *offset);
    CUresult r = d->drv.MemcpyHtoDAsync(d->opt_tables, d->opt_host, bytes, d->stream);
    return r == CUDA_SUCCESS ? 0 : cu_fail(d, r, "copying the optimizer's tables", err, n);
}

static int cuda_adamw(RtDevice *d, const RtAdamW *a, char *err, size_t n)
{
    const RtCuDriver *drv = &d->drv;
    if (d->k_norm < 0 || d->k_update < 0)
        return 1;
    CUresult r;
    if ((r = drv->CtxSetCurrent(d->ctx)) != CUDA_SUCCESS)
        return cu_fail(d, r, "cannot make the CUDA context current", err, n);
    int64_t total = a->offset[a->nparams];
    size_t fbytes = (size_t)total * sizeof(float);
    int np = a->nparams, rc = 0;
    switch (a->phase) {
    case RT_ADAMW_PUSH: {
        size_t old = (size_t)d->opt_total * sizeof(float);
        if ((rc = opt_alloc(d, &d->opt_master, fbytes, old, err, n)) || (rc = opt_alloc(d, &d->opt_m, fbytes, old, err, n)) ||
            (rc = opt_alloc(d, &d->opt_v, fbytes, old, err, n)) ||
            (rc = opt_alloc(d, &d->opt_partial, (size_t)a->nblocks * sizeof(double),
                            (size_t)d->opt_nblocks * sizeof(double), err, n)))
            return rc;
        d->opt_total = total > d->opt_total ? total : d->opt_total;
        d->opt_nblocks = a->nblocks > d->opt_nblocks ? a->nblocks : d->opt_nblocks;
        for (int i = 0; i < np && !rc; i++)
            if ((r = drv->MemcpyHtoDAsync(d->opt_master + (CUdeviceptr)a->offset[i] * 4, a->host[a->param[i]],
                                          (size_t)(a->offset[i + 1] - a->offset[i]) * 4, d->stream)) != CUDA_SUCCESS)
                rc = cu_fail(d, r, "copying the weights to the device's optimizer", err, n);
        if (!rc && ((r = drv->MemcpyHtoDAsync(d->opt_m, a->m, fbytes, d->stream)) != CUDA_SUCCESS ||
                    (r = drv->MemcpyHtoDAsync(d->opt_v, a->v, fbytes, d->stream)) != CUDA_SUCCESS ||
                    (r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS))
            rc = cu_fail(d, r, "copying the optimizer state to the device", err, n);
        return rc;
    }
    case RT_ADAMW_NORM: {
        if ((rc = opt_tables(d, a, err, n)))
            return rc;
        CUdeviceptr grads = d->opt_tables, offset = grads + (CUdeviceptr)np * 16;
        CUdeviceptr gs = offset + (CUdeviceptr)(np + 1) * 8;
        int64_t t = total;
        void *args[] = {&grads, &gs, &offset, &np, &t, &d->opt_partial};
        unsigned grid = (unsigned)(a->nblocks < 0x7fffffff ? a->nblocks : 0x7fffffff);
        if (grid && (r = drv->LaunchKernel(d->fn[d->k_norm], grid, 1, 1, 8, 1, 1, 0, d->stream, args, NULL)) !=
                        CUDA_SUCCESS) {
            const char *why = drv->LaunchError ? drv->LaunchError(d->mod) : NULL;
            char text[200];
            rt_set_error(err, n, "the optimizer's gradient norm on %s failed: %s", d->device_name,
                         why ? why : rt_cu_error_text(drv, r, text, sizeof text));
            return -1;
        }
        if ((r = drv->MemcpyDtoHAsync(a->partial, d->opt_partial, (size_t)a->nblocks * sizeof(double), d->stream)) !=
                CUDA_SUCCESS ||
            (r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS)
            return cu_fail(d, r, "the optimizer's gradient norm", err, n);
        return 0;
    }
    case RT_ADAMW_UPDATE: {
        CUdeviceptr grads = d->opt_tables, weights = grads + (CUdeviceptr)np * 8, offset = grads + (CUdeviceptr)np * 16;
        CUdeviceptr gs = offset + (CUdeviceptr)(np + 1) * 8, ws = gs + (CUdeviceptr)np;
        int64_t t = total;
        float f[9] = {a->clip, a->decay, a->b1, a->b2, a->omb1, a->omb2, a->eps, a->step_size, a->bc2};
        void *args[19] = {&weights, &grads, &ws, &gs, &offset, &np, &t, &d->opt_master, &d->opt_m, &d->opt_v};
        for (int i = 0; i < 9; i++)
            args[10 + i] = &f[i];
        int64_t blocks = (total + 255) / 256;
        unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
        if (grid && (r = drv->LaunchKernel(d->fn[d->k_update], grid, 1, 1, 256, 1, 1, 0, d->stream, args, NULL)) !=
                        CUDA_SUCCESS) {
            const char *why = drv->LaunchError ? drv->LaunchError(d->mod) : NULL;
            char text[200];
            rt_set_error(err, n, "the optimizer's update on %s failed: %s", d->device_name,
                         why ? why : rt_cu_error_text(drv, r, text, sizeof text));
            return -1;
        }
        return 0;
    }
    case RT_ADAMW_PULL:
        for (int i = 0; i < np && !rc; i++)
            if ((r = drv->MemcpyDtoHAsync(a->host[a->param[i]], d->opt_master + (CUdeviceptr)a->offset[i] * 4,
                                          (size_t)(a->offset[i + 1] - a->offset[i]) * 4, d->stream)) != CUDA_SUCCESS)
                rc = cu_fail(d, r, "copying the weights from the device's optimizer", err, n);
        if (!rc && ((r = drv->MemcpyDtoHAsync(a->m, d->opt_m, fbytes, d->stream)) != CUDA_SUCCESS ||
                    (r = drv->MemcpyDtoHAsync(a->v, d->opt_v, fbytes, d->stream)) != CUDA_SUCCESS ||
                    (r = drv->StreamSynchronize(d->stream)) != CUDA_SUCCESS))
            rc = cu_fail(d, r, "copying the optimizer state from the device", err, n);
        return rc;
    }
    return -1;
}

/* The host arena, where the outputs come back: registered with the driver (page-locked), so that
 * copies into it run at the bus's speed, once the runs have copied as many bytes into it as it
 * holds: registering costs about what copying its size through the driver's staging costs
 * (0.4 ms a MB measured on an H200: 53 ms for GPT's 125 MB arena of logits and caches), so a
 * session that copies little into a large arena (decoding: a token's logits a call, the caches
 * left on the device) never pays it, and one that copies a lot (training: the gradients every
 * step) pays it once. Best effort: where the driver refuses (a limit on locked memory), the
 * copies go through the driver's staging as before. The context is current (a run's, a fetch's). */
static void pin_host_arena(RtDevice *d)
{
    const RtCuDriver *drv = &d->drv;
    if (d->pinned || d->host_refused || !d->host || !drv->MemHostRegister || d->host_copied < d->host_bytes)
        return;
    if (drv->MemHostRegister(d->host, d->host_bytes, 0) == CUDA_SUCCESS)
        d->pinned = d->host;
    else
        d->host_refused = 1;
}

static void cuda_host_arena(RtDevice *d, void *p, size_t bytes)
{
    const RtCuDriver *drv = &d->drv;
    if (p == d->host || drv->CtxSetCurrent(d->ctx) != CUDA_SUCCESS)
        return;
    if (d->pinned)
        drv->MemHostUnregister(d->pinned);
    d->pinned = NULL;
    d->host = p && bytes ? p : NULL;
    d->host_bytes = d->host ? bytes : 0;
    d->host_copied = 0;
    d->host_refused = 0;
}

/* Bytes per element of buffer b on the device (before cuda_open checked the module: as on the
 * host where its storage table does not cover b). */
static size_t cuda_elem_bytes(const XtcModule *m, int b)
{
    const XtcCudaModuleV1 *cm = m->device_abi;
    int half = cm->buf_storage && b < cm->nbufs && cm->buf_storage[b] && m->bufs[b].dtype == XTC_F32;
    return half ? 2 : xtc_dtype_size(m->bufs[b].dtype);
}

static const char *cuda_device_name(const RtDevice *d) { return d->device_name; }

static int cuda_locate(RtDevice *d, int b, void **ptr, void **stream, char *err, size_t n)
{
    CUresult r = d->drv.CtxSetCurrent(d->ctx);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, "cannot make the CUDA context current", err, n);
    *stream = d->stream;
    if (b < 0)
        return 0;
    if (cuda_elem_bytes(d->m, b) != sizeof(float) || d->m->bufs[b].dtype != XTC_F32)
        return 1;
    *ptr = d->dptr ? d->dptr[b] : NULL;
    return 0;
}

const RtDeviceOps rt_cuda_device = {
    .name = "cuda",
    .open = cuda_open,
    .run = cuda_run,
    .close = cuda_close,
    .device_name = cuda_device_name,
    .elem_bytes = cuda_elem_bytes,
    .carry = cuda_carry,
    .fetch = cuda_fetch,
    .host_arena = cuda_host_arena,
    .adamw = cuda_adamw,
    .locate = cuda_locate,
};
