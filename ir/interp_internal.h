/* interp_internal.h: what the interpreter's files share (interp.c: values, the op table and the
 * driver; interp_bind.c: binding the leaves and the symbols). Private to ir/. */
#ifndef XTC_INTERP_INTERNAL_H
#define XTC_INTERP_INTERNAL_H

#include "ir.h"

#include <stddef.h>
#include <stdint.h>

#define EXACT_INT_MAX 9007199254740992.0 /* 2^53 */
#define MAX_SYM_VALUE ((int64_t)1 << 40) /* keeps c + sum k*sym far from int64 overflow */
#define MAX_DIM_CONST ((int64_t)1 << 61)
#define SYM_DERIVED (-1) /* sym_from of a derived symbol: computed, not bound by a leaf */

/* A value: row-major, contiguous doubles. data is NULL before the node runs and after its last
 * use. */
typedef struct {
    int rank;
    int64_t shape[IR_MAXRANK];
    int64_t numel;
    double *data;
} Val;

typedef struct {
    const IrGraph *g;
    int64_t sym[IR_MAXSYM];
    int sym_from[IR_MAXSYM];  /* 0 = unbound, else 1 + id of the leaf that bound it, or SYM_DERIVED */
    IrHostTensor *host;       /* [nnodes]: the caller's tensor for each bound leaf */
    char *have_host;          /* [nnodes] */
    Val *val;                 /* [nnodes] */
    int f64;                  /* ir_interp_f64: f32 tensors cross the API as double */
    IrRoundFn round;          /* ir_interp_rounded: applied to every f32 value computed */
    void *round_ctx;
    char *err;
    size_t nerr;
} Interp;

int ii_dim_value(Interp *it, const IrNode *n, IrDim d, int64_t *out);
int ii_fail(Interp *it, const char *fmt, ...);
const char *ii_leaf_kind(IrOp op);
int64_t ii_numel_checked(int rank, const int64_t *shape);
const char *ii_sym_name(const Interp *it, int s);
int ii_unbound_sym(const Interp *it, IrDim d);
int ii_bind_leaves(Interp *it, IrBindFn bind, void *ctx, const char *needed);

#endif
