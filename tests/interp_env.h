/* interp_env.h: what the interpreter suites (test_interp, test_interp_models) share: leaves bound
 * by name, a graph run to its outputs (or to its error), and checks of an output's shape and
 * values. Each suite includes it once. */
#ifndef XTC_TEST_INTERP_ENV_H
#define XTC_TEST_INTERP_ENV_H


#include "ir.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIMS(...) ((IrDim[]){__VA_ARGS__})
#define SHAPE(...) ((int64_t[]){__VA_ARGS__})

/* ---- binding leaves by name ---- */

typedef struct {
    int n;
    struct {
        const char *name;
        IrHostTensor t;
    } b[512];
} Env;

static inline void env_set(Env *e, const char *name, IrDType dt, int rank, const int64_t *shape, const void *data)
{
    ck_assert_int_lt(e->n, 512);
    e->b[e->n].name = name;
    IrHostTensor *t = &e->b[e->n].t;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->shape[i] = shape[i];
    t->data = (void *)data;
    e->n++;
}

static inline int env_bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Env *e = ctx;
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->b[i].name, leaf->s) == 0) {
            *out = e->b[i].t;
            return 0;
        }
    return -1;
}

/* ---- running ---- */

static IrHostTensor outs[32];
static char errbuf[512];

static inline void run_ok(IrGraph *g, Env *e)
{
    ck_assert_int_le(g->noutputs, 32);
    ck_assert_msg(!ir_graph_error(g), "build: %s", ir_graph_error(g));
    ck_assert_msg(ir_verify(g, errbuf, sizeof errbuf) == 0, "verify: %s", errbuf);
    int rc = ir_interp(g, env_bind, e, outs, errbuf, sizeof errbuf);
    ck_assert_msg(rc == 0, "ir_interp: %s", errbuf);
}

/* Runs a graph that must fail; returns the message. */
static inline const char *run_err(IrGraph *g, Env *e)
{
    ck_assert_msg(!ir_graph_error(g), "build: %s", ir_graph_error(g));
    ck_assert_msg(ir_verify(g, errbuf, sizeof errbuf) == 0, "verify: %s", errbuf);
    int rc = ir_interp(g, env_bind, e, outs, errbuf, sizeof errbuf);
    ck_assert_int_eq(rc, -1);
    for (int o = 0; o < g->noutputs; o++)
        ck_assert_ptr_null(outs[o].data);
    return errbuf;
}

static inline void done(IrGraph *g)
{
    for (int o = 0; o < g->noutputs; o++)
        ir_host_free(&outs[o]);
    ir_graph_free(g);
}

static inline float F(int o, int64_t i) { return ((float *)outs[o].data)[i]; }
static inline int64_t I64(int o, int64_t i) { return ((int64_t *)outs[o].data)[i]; }
static inline int32_t I32(int o, int64_t i) { return ((int32_t *)outs[o].data)[i]; }
static inline int B(int o, int64_t i) { return ((uint8_t *)outs[o].data)[i]; }

static inline void check_shape(int o, IrDType dt, int rank, const int64_t *shape)
{
    ck_assert_int_eq(outs[o].dtype, dt);
    ck_assert_int_eq(outs[o].rank, rank);
    for (int i = 0; i < rank; i++)
        ck_assert_int_eq(outs[o].shape[i], shape[i]);
}

/* f32 outputs against doubles: the interpreter computes in double and rounds once */
static inline void check_f32(int o, int64_t n, const double *want)
{
    ck_assert_int_eq(ir_host_numel(&outs[o]), n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(F(o, i) - want[i]) <= 1e-6 * (1 + fabs(want[i])),
                      "output %d[%lld] = %.9g, want %.9g", o, (long long)i, F(o, i), want[i]);
}

#endif
