/* rt_session.h: the session object and the helpers its files share (rt_session.c: creation,
 * binding, runs and outputs; rt_weights.c: setting and loading weights; rt_arena.c: the memory
 * plan and the bounds of a call's work; rt_carry.c: limits on sums of symbols, carrying outputs
 * into inputs, outputs left on a device; rt_scaler.c: loss scaling; rt_comm.c: gradients summed
 * over ranks; rt_store.c: 16-bit storage on the CPU). Private to the runtime. */
#ifndef XTC_RT_SESSION_H
#define XTC_RT_SESSION_H

#include "safetensors.h"
#include "rt_alloc.h"
#include "rt_internal.h"

#define ARENA_ALIGN 64

/* What a decoding session's growing memory is given when it outgrows what it has: half as much
 * again, so that a cache a token longer each call is reallocated a logarithmic number of times.
 * The one growth rule of the runtime: the arenas' plan (xtc_session_run) and the carried outputs'
 * spare memory (rt_carry.c) both take it. */
static inline int64_t rs_headroom(int64_t need)
{
    return need + need / 2;
}

/* One layout of a module's temps in an arena, made by plan_offsets. */
typedef struct {
    size_t *elem;   /* per buffer: bytes per element of a temp in this arena; 0: not in it */
    size_t *offset; /* per temp: its offset */
    size_t *bytes;  /* per temp: its planned size (a multiple of ARENA_ALIGN) */
    size_t total;
} ArenaPlan;

struct XtcSession {
    const XtcModule *m;
    char err[1024];
    RtPool *pool;
    XtcRtApi api;
    int64_t cap[RT_MAXSYM];      /* session limits, 0 = none */
    int64_t planned[RT_MAXSYM];  /* symbol values the arena plan is for */
    int64_t syms[RT_MAXSYM];     /* values of the last run (-1 before) */
    void **ptr;                  /* per buffer: its memory for the next run */
    void **own;                  /* per input/param/state buffer: our copy */
    int64_t (*shape)[XTC_MAX_RANK]; /* per input: the bound shape */
    uint8_t *set;                /* per input/param/state: bound yet? */
    uint8_t *fresh;              /* per input/param/state: bound since the last run (early limits) */
    ArenaPlan host;              /* the temps in the host arena (every temp, or a device's outputs) */
    char *arena;
    size_t arena_bytes;
    ArenaPlan devplan;           /* a device module's temps in the device arena; elem NULL otherwise */
    size_t dev_arena_bytes;      /* the largest device plan so far (the device keeps that much) */
    int outputs_valid;
    uint8_t stepped;             /* xtc_session_step used the last run's gradients (rt_optim.c) */
    /* a training module run without its targets (bind_no_targets): they were all -1 (ignored),
     * and the outputs computed from them (loss, gradients) are not available */
    int targets;                 /* the targets input's buffer, -1: none */
    int targetless;              /* the last run had no targets */
    void *no_targets;            /* the -1s bound instead, no_targets_bytes long */
    size_t no_targets_bytes;
    uint8_t *from_targets;       /* per buffer: computed from the targets (NULL until needed) */
    struct RtOptim *optim;       /* optimizer state (rt_optim.c), NULL before the first step */
    RtScaler scaler;             /* loss scaling (fp16 training modules), scaler.buf -1 otherwise */
    int *unscale;                /* [nunscale] the distinct temp buffers of the grad.<param> outputs */
    int nunscale;
    RtDevice *dev;               /* a device module's device (m->device), else NULL */
    uint8_t *changed;            /* device, or a CPU module with 16-bit storage: per buffer,
                                    rebound (or handed out for writing) since the last run */
    void **half;                 /* a CPU module with 16-bit storage (rt_store.c): per weight, the
                                    bf16 copy its kernels read; per 16-bit output (a KV cache), its
                                    f32 copy for xtc_session_get_output; NULL otherwise */
    /* xtc_session_carry (NULL until its first use): per buffer, */
    int *carried;                /* a temp output carried into an input (1 + that input's buffer, 0:
                                    not carried): written outside the arena, ... */
    void **spare;                /* ... into this memory of spare_cap bytes (the run grows it) */
    size_t *spare_cap;
    size_t *own_cap;             /* an input's own[] capacity when it came from a spare (0: exact) */
    int carries;                 /* xtc_session_carry was called (decoding) */
    /* a device module's outputs (rs_lazy_outputs) and carries (device_carry): per buffer, */
    uint8_t *lazy;               /* an output left on the device by the runs, ... */
    uint8_t *fetched;            /* ... and copied to the host when read after the last run */
    int *into;                   /* the input it was carried into (1 + its buffer, 0: none) */
    int *place;                  /* for the next run: 1 + the input it appends to (appends_to) */
    struct RtComm *comm;         /* data parallelism (rt_comm.c), NULL: this process alone */
    /* profiling */
    double *step_s;              /* per step: seconds over the profiled runs */
    int profiled_runs;
    int64_t last_ns;
};

/* shared by the session's files (see each for what it does) */
int rs_fail(XtcSession *s, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void rs_bind_buffer(XtcSession *s, int b, void *data, int rank, const int64_t *shape);
int rs_check_shape(XtcSession *s, const RtBuffer *b, const char *what, int rank, const int64_t *shape);
/* rs_check_shape's check alone: the status, and its message in msg (not the session's) */
int rs_shape_problem(const XtcSession *s, const RtBuffer *b, const char *what, int rank, const int64_t *shape,
                     char *msg, size_t n);
void rs_shape_text(char *buf, size_t n, int rank, const int64_t *shape); /* "[2, 3]" */
void rs_dims_text(char *buf, size_t n, const RtBuffer *b);
int rs_find_buffer(const XtcModule *m, RtBufKind kind, const char *name);
int64_t rs_numel_of(int rank, const int64_t *shape);
int rs_ready(XtcSession *s, const char *what);
int rs_alloc_plan(const XtcModule *m, ArenaPlan *p);
size_t rs_buffer_bytes(const RtBuffer *b, size_t elem, const int64_t *syms);
int rs_check_work(XtcSession *s, const int64_t *syms);
void rs_free_plan(ArenaPlan *p);
int rs_no_output_elements(const XtcModule *m, const int64_t *syms);
int rs_plan_arena(XtcSession *s, const int64_t *syms);
void rs_plan_elem_sizes(const XtcModule *m, size_t *host, size_t *dev);
int rs_plan_fits(const XtcModule *m, const ArenaPlan *p, const int64_t *syms);
int rs_appends_to(const XtcSession *s, int ob, int ib, const int64_t *syms);
int rs_check_limits(XtcSession *s, const int64_t *syms, const int *known, int b, const int64_t *shape);
int rs_check_limits_early(XtcSession *s, int b, const int64_t *shape);
/* The rows (last axis) of f32 input b's value x [shape] against the module's "norm" record (a KV
 * cache that cosine-sim attention reads with a bound): XTC_OK, or XTC_ERR_RANGE naming the first
 * row whose L2 norm is not finite or exceeds the record by more than rounding to a cache's storage
 * can (RS_ROW_NORM_SLACK). */
#define RS_ROW_NORM_SLACK 1.125
int rs_check_row_norms(XtcSession *s, int b, int rank, const int64_t *shape, const float *x);
int rs_find_output(const XtcModule *m, const char *name);
/* xtc_session_get_output; widen 0: a 16-bit output of a CPU module as stored (its bytes) */
int rs_get_output(XtcSession *s, const char *name, XtcTensor *out, int widen);
int rs_place_carried(XtcSession *s, const int64_t *syms);
int rs_lazy_alloc(XtcSession *s);
int rs_lazy_outputs(XtcSession *s);
int rs_output_on_host(XtcSession *s, int b, const char *name);
int rs_scaler_bind(XtcSession *s);
int rs_scaler_init(XtcSession *s);
int rs_scaler_unscale(XtcSession *s);
void rs_update_hook(XtcSession *s);
/* rt_store.c: the 16-bit copies of a CPU module's weights (open at session creation, sync before
 * each run: point s->ptr at them, converting those changed; forget one rebound; free) */
int rs_store_open(XtcSession *s);
int rs_store_sync(XtcSession *s);
void rs_store_forget(XtcSession *s, int b);
void rs_store_free(XtcSession *s);
/* ... a 16-bit input's stored copy of n f32 values (malloc'ed; NULL when out of memory), a 16-bit
 * output's n stored values widened into s->half[b] (NULL when out of memory), and the bytes per
 * element of buffer b in a CPU session's memory (2 for 16-bit storage) */
void *rs_store_input(const XtcModule *m, int b, const float *src, int64_t n);
const float *rs_store_output(XtcSession *s, int b, const void *data, int64_t n);
size_t rs_stored_elem(const XtcModule *m, int b);
/* ... and the bytes of buffer b at this shape in a CPU session's memory (int8 rows: D + 4 a row) */
size_t rs_stored_bytes(const XtcModule *m, int b, int rank, const int64_t *shape);
/* rt_comm.c: a run's reductions (begin before the schedule, the step hook during it, finish after
 * a successful run, abandon after a failed one) */
void rt_comm_begin(XtcSession *s);
void rt_comm_step_done(XtcSession *s, int32_t step);
int rt_comm_finish(XtcSession *s);
void rt_comm_abandon(XtcSession *s);
void rt_comm_free(XtcSession *s);
int rt_comm_rank(const XtcSession *s);
/* rt_nccl.c: an NCCL communicator (xtc_session_set_nccl); rt_comm_set_nccl hands it to the
 * session's communicator, which then sums the gradients with it on the device (rt_comm.c) and
 * frees it with itself. The functions return 0, or -1 with a message in err. */
typedef struct RtNccl RtNccl;
int rt_comm_set_nccl(XtcSession *s, RtNccl *nc);
int rt_nccl_allreduce(RtNccl *nc, void *dptr, int64_t n, double weight, void *stream, char *err, size_t errlen);
int rt_nccl_group(RtNccl *nc, int start, char *err, size_t errlen);
void rt_nccl_free(RtNccl *nc);

#endif
