/* rt_internal.h: what the runtime's files share: the parsed module metadata, the thread pool
 * and small helpers. Not installed; users see include/xtc.h only. */
#ifndef XTC_RT_INTERNAL_H
#define XTC_RT_INTERNAL_H

#include "rt_abi.h"
#include "xtc.h"

#include <stddef.h>
#include <stdint.h>

#define RT_MAXSYM 8
#define RT_MAXIN 3

/* An affine dimension c + sum k[s] * sym[s], as the IR has it. */
typedef struct {
    int64_t c;
    int64_t k[RT_MAXSYM];
} RtDim;

typedef enum { RT_BUF_INPUT, RT_BUF_PARAM, RT_BUF_STATE, RT_BUF_TEMP } RtBufKind;

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
};

/* Parses the metadata text into m (m->text receives a copy). Returns 0 or -1 with m->err set. */
int rt_meta_parse(XtcModule *m, const char *text);
void rt_meta_free(XtcModule *m);

int64_t rt_dim_eval(const RtDim *d, const int64_t *syms);
int64_t rt_numel(const RtDim *shape, int rank, const int64_t *syms);
XtcDType rt_dtype_from_name(const char *name); /* XTC_NUM_DTYPES if unknown */

/* Thread pool: nthreads workers counting the caller. parallel_for matches XtcParallelFor. */
typedef struct RtPool RtPool;
RtPool *rt_pool_new(int nthreads);  /* NULL when threads cannot be created */
void rt_pool_free(RtPool *p);
void rt_pool_parallel_for(void *pool, XtcTaskFn fn, void *ctx, int64_t n);

/* printf into a fixed error buffer (truncating). */
void rt_set_error(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
