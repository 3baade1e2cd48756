/* rt_internal.h: what the runtime's files share: the parsed module metadata, the thread pool
 * and small helpers. Not installed; users see include/xtc.h only. */
#ifndef XTC_RT_INTERNAL_H
#define XTC_RT_INTERNAL_H

#include "rt_abi.h"
#include "xtc.h"

#include <stddef.h>
#include <stdint.h>

#define RT_MAXSYM 8
#define RT_MAXLIMIT 4 /* "limit" records (the IR's IR_MAXLIMIT) */
#define RT_MAXIN XTC_ABI_MAXIN

/* An affine dimension c + sum k[s] * sym[s], as the IR has it. */
typedef struct {
    int64_t c;
    int64_t k[RT_MAXSYM];
} RtDim;

typedef enum { RT_BUF_INPUT, RT_BUF_PARAM, RT_BUF_STATE, RT_BUF_TEMP } RtBufKind;
/* RtBuffer.storage of rows of int8 values with an f32 scale each (rt_half.h rt_i8_row_quantize) */
enum { RT_STORE_INT8_ROWS = 3 };

typedef struct {
    RtBufKind kind;
    const char *name;
    XtcDType dtype;
    int rank;
    RtDim shape[XTC_MAX_RANK];
    const char *dims[XTC_MAX_RANK]; /* the text of each dimension */
    int first, last;                /* temps: steps that write it first and read it last */
    int has_range;                  /* inputs used as indices: valid values [lo, hi) */
    int64_t lo, hi;
    double row_norm;                /* "norm" record: f32 input rows' L2 norm bound; 0: none */
    int has_init;                   /* params, state: fresh values start by init_rule (XtcInitRule) */
    int init_rule;                  /* with its parameter init (the init line) */
    double init;
    int storage;                    /* "storage" record: 0 as dtype, 1 bf16, 2 fp16 (f32 buffers),
                                     * RT_STORE_INT8_ROWS (a CPU module's KV caches, rt_half.h) */
    int qscale, qweight;            /* an i8 weight: its scales' buffer; a scale buffer: its weight;
                                     * else -1 (rt_quant.c) */
    int64_t qgroup;                 /* an i8 weight: its scales' group along k */
} RtBuffer;

typedef struct {
    const char *name;
    int buf;
    XtcDType dtype;
    int rank;
    RtDim shape[XTC_MAX_RANK];
    const char *dims[XTC_MAX_RANK];
} RtOutput;

typedef struct {
    const char *fn, *op;
    int uses;
} RtKernel;

typedef struct {
    int kernel, out, in[RT_MAXIN];
    const char *op, *label;
} RtStep;

typedef struct {
    const char *key, *value;
} RtOption;

typedef struct {
    const char *name;
    int buf; /* the parameter or state buffer it names again */
} RtAlias;

struct XtcModule {
    char err[1024];
    void *dl;
    const XtcModuleV1 *abi;
    char *text;                 /* our copy of the metadata, split in place into the strings below */
    const char *name;
    int nsyms;
    const char *sym_name[RT_MAXSYM];
    int64_t sym_max[RT_MAXSYM];
    int sym_is_batch[RT_MAXSYM];
    /* derived symbols ("derive" records): sym = min(sym_def, sym_max) (no min when sym_max is 0),
     * computed from the symbols before it once the inputs bind them (rt_derive_syms) */
    int sym_derived[RT_MAXSYM];
    RtDim sym_def[RT_MAXSYM];
    /* limits ("limit" records): limit_def <= limit_max once the inputs bind its symbols (a KV
     * cache: c+n <= max_seq_len); limit_text is the form as the metadata writes it ("c+n") */
    int nlimits;
    RtDim limit_def[RT_MAXLIMIT];
    int64_t limit_max[RT_MAXLIMIT];
    const char *limit_text[RT_MAXLIMIT];
    RtBuffer *bufs;
    int nbufs;
    RtOutput *outs;
    int nouts;
    int *by_kind[4];            /* buffer ids of inputs, params, states (index RtBufKind) */
    int nby_kind[4];
    RtKernel *kernels;
    int nkernels;
    RtStep *steps;
    int nsteps;
    RtOption *options;
    int noptions;
    RtAlias *aliases;
    int naliases;
    int64_t quant_group;        /* int8 weights: the option quant_group (rt_quant.c); 0 = per row */
    /* where the schedule runs: NULL = the module's own run function on the CPU; else a device
     * (CUDA modules: rt_cuda.c) and the module's object for it (an XtcCudaModuleV1) */
    const struct RtDeviceOps *device;
    const void *device_abi;
};

/* A device that runs a module's schedule instead of its run function (STYLE.md practice 5: a
 * table of functions, chosen when the module is loaded by the symbols it exports; rt_device.c). */
typedef struct RtDevice RtDevice;
typedef struct {
    void *const *host;         /* per buffer: host memory: the session's copies of inputs and
                                  weights; outputs' places in the host arena, where they come back
                                  (as the module's dtype: f32 whatever the device stores) */
    const uint8_t *changed;    /* per buffer: input or weight rebound since the last run */
    const uint8_t *lazy;       /* per buffer, or NULL: an output not to copy back after the run
                                  (one carried on the device: fetch copies it when it is read) */
    const int *place;          /* per buffer, or NULL: 1 + the input whose device memory an output
                                  appending to it is written over, where that has room (the
                                  concat kernel then writes only the new rows); 0: the arena */
    const int64_t *syms;
    const size_t *offset;      /* per temp: its offset in the device arena (the session's plan
                                  of it, each temp at elem_bytes per element) */
    size_t arena_bytes;        /* the device arena that plan needs */
    double *step_s;            /* profiling: seconds to add to per step (the device's own timer:
                                  CUDA events), or NULL; added only when the run succeeds */
    void *pool;                /* the session's thread pool (rt_pool_parallel_for), for the host's
                                  share of a run (widening 16-bit outputs), or NULL */
} RtDeviceRun;
struct RtAdamW;
typedef struct RtDeviceOps {
    const char *name;
    /* Opens the device for a session: returns an XtcStatus, with a message in err on failure
     * (no driver, no device, a module the device cannot load). */
    int (*open)(const XtcModule *m, RtDevice **dev, char *err, size_t n);
    /* Runs the schedule: 0, 1 + the step whose kernel found bad input values, or with a message
     * in err -1 (a failure of the device or its driver) or -2 (out of host or device memory). */
    int32_t (*run)(RtDevice *dev, const RtDeviceRun *r, char *err, size_t n);
    void (*close)(RtDevice *dev);
    /* xtc_session_carry on the device: the value of output buffer `from` of the last run (its
     * shape from syms) becomes the device copy of input buffer `to`, by a copy in device memory
     * queued before the next run, or none when the run wrote it there (RtDeviceRun.place): 0; 1
     * when it cannot (the two are stored in different types); -1 or -2 as run, with a message in
     * err. The input's host copy is left as it was: the device one is the value. */
    int (*carry)(RtDevice *dev, int from, int to, const int64_t *syms, char *err, size_t n);
    /* Copies output buffer b of the last run (its shape from syms) into host (f32): the outputs
     * the run left on the device (RtDeviceRun.lazy), 16-bit ones widened on the threads of pool
     * (the session's, or NULL). 0, or -1 or -2 with a message in err. */
    int (*fetch)(RtDevice *dev, int b, void *host, const int64_t *syms, void *pool, char *err, size_t n);
    /* Bytes per element of buffer buf of m in the device's memory (CUDA: 2 where the module
     * stores it in 16 bits), by which the session plans the device arena. */
    size_t (*elem_bytes)(const XtcModule *m, int buf);
    /* The device as its driver names it ("NVIDIA H100 80GB HBM3"), for reports. */
    const char *(*device_name)(const RtDevice *dev);
    /* The session's host arena, where run copies the outputs, is now p (bytes long); NULL before
     * the session frees it. The device may page-lock it for faster copies until then, or until
     * close. */
    void (*host_arena)(RtDevice *dev, void *p, size_t bytes);
    /* The AdamW step on the device (struct RtAdamW below), NULL where the device has none. 0,
     * 1 when the module has no optimizer kernels (the host steps), or -1 / -2 as run. */
    int (*adamw)(RtDevice *dev, const struct RtAdamW *a, char *err, size_t n);
    /* For a library of collectives on the device's memory (NCCL: rt_nccl.c), NULL where the device
     * has none: makes the device's context current on this thread, sets *stream to the stream the
     * runs queue their work on and, for b >= 0, *ptr to the device address of output buffer b of
     * the last run. 0; 1 when b is not f32 on the device (stored in 16 bits); -1 with a message. */
    int (*locate)(RtDevice *dev, int b, void **ptr, void **stream, char *err, size_t n);
} RtDeviceOps;

/* What rt_optim.c asks of a device's AdamW step (codegen/cuda/kernels/adamw.cuh), phase by
 * phase. The device keeps f32 master weights and the moments, a vector of `total` values cut at
 * offset[] as the host's; the gradients are the outputs of the last run, still on the device. */
enum { RT_ADAMW_PUSH, RT_ADAMW_NORM, RT_ADAMW_UPDATE, RT_ADAMW_PULL };
typedef struct RtAdamW {
    int phase;             /* PUSH: host weights and m, v to the device; NORM: partial[b], the sum
                              of squares of block b of the gradients, to the host; UPDATE: one
                              step with the settings below (weights, moments, the device copy of
                              each weight); PULL: the device's weights and m, v to the host */
    int nparams;
    const int *param;      /* [nparams] the buffer of each parameter */
    const int *grad;       /* [nparams] the buffer of its gradient */
    const int64_t *offset; /* [nparams + 1] */
    int64_t nblocks;       /* blocks of RT_ADAMW_BLOCK values */
    double *partial;       /* NORM: [nblocks] */
    float *m, *v;          /* the host's moments [offset[nparams]] (PUSH reads, PULL writes) */
    void *const *host;     /* per buffer: the session's host memory of the weights (f32) */
    float clip, decay, b1, b2, omb1, omb2, eps, step_size, bc2; /* UPDATE, as rt_optim.c */
} RtAdamW;
#define RT_ADAMW_BLOCK 8192

/* Sets m->device when the loaded module m exports a device's symbol; -1 with m->err set when
 * that object is malformed. */
int rt_device_attach(XtcModule *m, const char *path);

/* Parses the metadata text into m (m->text receives a copy). Returns 0, or with m->err set -1
 * (malformed) or -2 (out of memory). */
int rt_meta_parse(XtcModule *m, const char *text);
void rt_meta_free(XtcModule *m);

/* Loader checks (rt_loadcheck.c). rt_elf_check: whether path is an ELF shared object that dlopen
 * can map on this machine (class, byte order, architecture, type, every header and segment inside
 * the file); an XtcStatus, with a message naming the problem in err. rt_cpu_has: whether the running
 * CPU has the feature of LLVM name name[0..len): 1, 0, or -1 when this runtime cannot tell (a name
 * it does not know; every name off x86). rt_cpu_missing: how many features of a comma-separated
 * list ("avx2,fma" or LLVM's "+avx2,-avx512f"; "-" entries require nothing) the CPU lacks, named
 * in missing (", "-separated, truncated to n). */
int rt_elf_check(const char *path, char *err, size_t n);
int rt_cpu_has(const char *name, size_t len);
int rt_cpu_missing(const char *features, char *missing, size_t n);

/* c + sum k[s] * syms[s], saturated to INT64_MIN / INT64_MAX where it does not fit */
int64_t rt_dim_eval(const RtDim *d, const int64_t *syms);
/* Fills syms[s] of every derived symbol from the values of the symbols before it. */
void rt_derive_syms(const XtcModule *m, int64_t *syms);
int64_t rt_numel(const RtDim *shape, int rank, const int64_t *syms);
XtcDType rt_dtype_from_name(const char *name); /* XTC_NUM_DTYPES if unknown */

/* Thread pool: nthreads workers counting the caller. parallel_for matches XtcParallelFor. */
typedef struct RtPool RtPool;
RtPool *rt_pool_new(int nthreads);  /* NULL with errno ENOMEM, or pthread_create's error */
void rt_pool_free(RtPool *p);
void rt_pool_parallel_for(void *pool, XtcTaskFn fn, void *ctx, int64_t n);
int rt_pool_threads(const RtPool *p); /* counting the caller; 0 for NULL */
/* Calls run(bufs, syms, api), a module's entry point, and returns what it returns. The kernels keep
 * their tiles on the stack (a few MiB at most): where the calling thread has less stack left, the
 * call runs on a thread of its own with enough, or returns RT_RUN_NO_STACK when that thread cannot
 * be started. */
#define RT_RUN_NO_STACK INT32_MIN
int32_t rt_run_module(XtcRunFn run, void **bufs, const int64_t *syms, const XtcRtApi *api);
/* The CPUs this process may run on: its affinity mask (sched_getaffinity; taskset, cpusets), else
 * the CPUs online; 1 to 1024. The thread count of XTC_THREADS_AUTO. */
int rt_cpus_available(void);

/* What the optimizer (rt_optim.c) reaches in a session (rt_session.c): the memory of a bound
 * input, parameter or state buffer and its shape (NULL when unbound); an output's memory after a
 * successful run (NULL otherwise); the pool; the module; the slot holding the optimizer state
 * (freed with the session by rt_optim_free); setting the session's error (returns status). */
struct RtOptim;
/* Dynamic loss scaling of a session whose module has the scalar input XTC_LOSS_SCALE_INPUT (fp16
 * training modules; include/xtc.h): the session binds scale before each run unless the caller
 * bound the input (by_caller), divides the grad.<param> outputs by the value the run used and
 * notes a non-finite one (overflow); xtc_session_step (rt_optim.c) skips its update after an
 * overflow and moves scale. */
typedef struct {
    int buf;            /* the loss-scale input's buffer; -1: the module has no loss scaling */
    int by_caller;      /* the caller bound the input: runs use its value, not scale */
    double scale;       /* S, bound before each run */
    int64_t interval;   /* good steps after which S doubles */
    int64_t good;       /* consecutive steps taken since S last changed */
    int overflow;       /* the last successful run gave a non-finite gradient */
    int skipped;        /* the last xtc_session_step skipped its update */
} RtScaler;
RtScaler *rt_session_scaler(XtcSession *s);
void *rt_session_buffer(XtcSession *s, int buf, const int64_t **shape);
/* As rt_session_buffer, for reading: the device's weights copied back first where it holds newer
 * ones (rt_optim_pull), and the buffer not marked for another upload. */
const void *rt_session_weight(XtcSession *s, int buf, const int64_t **shape);
void *rt_session_output(XtcSession *s, int out);
/* The session's device's AdamW phase a (RtDeviceOps.adamw): 0, -1 when there is none (a CPU
 * module, a CUDA module without the kernels), or a status with the session's error set. */
int rt_session_device_adamw(XtcSession *s, const RtAdamW *a);
/* Leaves output buffer buf of later runs on the device (copied when read), as every output of a
 * device session is unless XTC_EAGER_OUTPUTS copies them: the gradients the device steps from or
 * NCCL sums there. 0, or -1 when out of memory. */
int rt_session_keep_on_device(XtcSession *s, int buf);
/* per buffer: the session's own host memory of inputs and weights (the device's PUSH and PULL) */
void *const *rt_session_own(XtcSession *s);
/* rt_optim.c: where the device holds newer weights and moments than the host (it stepped), copies
 * them back (0, or a status with the session's error set); rt_optim_host_write also makes the
 * host's the newer ones (the caller is about to change them: the next device step uploads). */
int rt_optim_pull(XtcSession *s);
int rt_optim_host_write(XtcSession *s);
/* 1 when output out of the last run is withheld: a training module run without its targets
 * computes the outputs that do not depend on them (logits), not the loss and gradients. */
int rt_session_withheld(const XtcSession *s, int out);
/* 1 when output out of the last successful run is available (not withheld), wherever it is */
int rt_session_output_ready(const XtcSession *s, int out);
/* rt_session_adopt takes ownership of data (f32, the buffer's constant shape, already checked) as
 * the value of parameter or state buffer buf, allocating nothing: a commit that cannot fail. */
void rt_session_adopt(XtcSession *s, int buf, float *data);
RtPool *rt_session_pool(XtcSession *s);
const XtcModule *rt_session_module(const XtcSession *s);
struct RtOptim **rt_session_optim(XtcSession *s);
/* 1 once xtc_session_step used the gradients of the last run (a run sets it back to 0). */
uint8_t *rt_session_stepped(XtcSession *s);
int rt_session_fail(XtcSession *s, int status, const char *msg);
/* At the start of an API call: clears the session's last error (a call that succeeds leaves
 * none). */
void rt_session_begin(XtcSession *s);
void rt_optim_free(struct RtOptim *o);
/* Data parallelism (rt_comm.c): the gradient of parameter `param` (module order) summed over the
 * ranks by the last run, NULL without a communicator; rt_session_has_comm says whether there is
 * one. rt_optim_sync (rt_optim.c) makes the optimizer state rank 0's, whose step count is `step`
 * (0: none, the state is dropped), with rt_comm_broadcast (rank 0's bytes to every rank). */
int rt_session_has_comm(const XtcSession *s);
const float *rt_comm_grad(XtcSession *s, int param);
/* 1 when the last run's gradients were summed on the device (NCCL) and the device may step from
 * them (not with ZeRO-1, which steps on the host) */
int rt_comm_on_device(const XtcSession *s);
int rt_comm_broadcast(XtcSession *s, void *data, int64_t bytes);
int rt_comm_broadcast_from(XtcSession *s, void *data, int64_t bytes, int root);
int rt_optim_sync(XtcSession *s, int64_t step);
/* ZeRO-1 (rt_comm.c): the ranks' number (1 without a communicator); rt_comm_shard sets [*lo, *hi),
 * the elements of a vector of `total` (parameters concatenated) whose optimizer state rank `rank`
 * (-1: this one) keeps, whole blocks of RT_ADAMW_BLOCK, and returns 1 when ZeRO-1 is on (0: off,
 * or no communicator: the range is then all of it); rt_comm_gather_params gives every rank the
 * others' shards of the weights p[nparams] (cut at offset[]) after a step updated its own;
 * rt_optim_gather (rt_optim.c) every rank's shard of the optimizer state to every rank. All three
 * collectives are XTC_OK or a status with the session's error set. */
int rt_comm_size(const XtcSession *s);
int rt_comm_shard(const XtcSession *s, int64_t total, int rank, int64_t *lo, int64_t *hi);
int rt_comm_gather_params(XtcSession *s, float *const *p, const int64_t *offset, int nparams);
int rt_optim_gather(XtcSession *s);
/* A checkpoint's optimizer state: for a tensor name "optim.m.<param>" or "optim.v.<param>", the
 * <param> it belongs to, else NULL. Wherever weights load, such a tensor of a parameter of the
 * model is ignored (a checkpoint loads as weights). */
const char *rt_optim_state_param(const char *name);

/* printf into a fixed error buffer (truncating). */
void rt_set_error(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
