/* pass_equiv.h: shared by the pass tests (test_passes.c, test_pass_models.c): random bindings
 * for every named leaf of a graph, and running two graphs through the interpreter to check that
 * a rewrite kept every output.
 *
 * Tolerance: none. Every pass is exact under the interpreter (fold computes with the interpreter
 * itself), and the graphs run through ir_interp_f64, so f32 outputs are compared as the doubles
 * the interpreter computed, before any rounding: equal as numbers (== on each element, NaN equal
 * to NaN). The one difference allowed is the sign of a zero (simplify's x + 0 -> x); the
 * counters report how many elements were bitwise equal. */
#ifndef XTC_PASS_EQUIV_H
#define XTC_PASS_EQUIV_H

#include "ir.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- files (reading: harness_read_file) ---- */

static inline void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* ---- random bindings for every named leaf ---- */

static uint64_t rng = 88172645463325252ull;
static inline uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
/* uniform in [0, 1) */
static inline double next_unit(void) { return (double)(next_u64() >> 11) / 9007199254740992.0; }

typedef struct {
    int n;
    const IrNode **leaf; /* of the graph the bindings were made for: matched by op and name */
    IrHostTensor *t;
    int64_t sym[IR_MAXSYM];
} Env;

static inline int env_bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Env *e = ctx;
    for (int i = 0; i < e->n; i++)
        if (e->leaf[i]->op == leaf->op && strcmp(e->leaf[i]->s, leaf->s) == 0) {
            *out = e->t[i];
            return 0;
        }
    return -1;
}

/* Small sizes that every model accepts: a symbol with a bound of at most 8 (Transformer-XL's
 * memory length) takes its bound, others a few positions. */
static inline int64_t sym_value(const IrGraph *g, int s)
{
    const char *nm = g->sym_name[s];
    int64_t v = strcmp(nm, "b") == 0 ? 2 : strcmp(nm, "m") == 0 ? 3 : strcmp(nm, "n") == 0 ? 5 : 4;
    if (g->sym_max[s] > 0 && g->sym_max[s] <= 8)
        v = g->sym_max[s];
    return v;
}

/* Integer inputs index embeddings and name targets: keep them below every table's row count and
 * every cross-entropy's vocabulary. */
static inline int64_t int_range(const IrGraph *g)
{
    int64_t v = 4;
    int any = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        IrDim d;
        if (x->op == IR_GATHER)
            d = x->in[0]->shape[0];
        else if (x->op == IR_XENT)
            d = x->in[0]->shape[x->in[0]->rank - 1];
        else
            continue;
        if (ir_dim_is_const(d) && (!any || d.c < v)) {
            v = d.c;
            any = 1;
        }
    }
    return v;
}

static inline void env_init(Env *e, const IrGraph *g)
{
    memset(e, 0, sizeof *e);
    e->leaf = calloc((size_t)g->nnodes + 1, sizeof *e->leaf);
    e->t = calloc((size_t)g->nnodes + 1, sizeof *e->t);
    for (int s = 0; s < g->nsyms; s++)
        e->sym[s] = sym_value(g, s);
    int64_t vocab = int_range(g);
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op != IR_INPUT && x->op != IR_PARAM && x->op != IR_BUFFER)
            continue;
        IrHostTensor *t = &e->t[e->n];
        e->leaf[e->n++] = x;
        t->dtype = x->dtype;
        t->rank = x->rank;
        int64_t numel = 1;
        for (int d = 0; d < x->rank; d++) {
            t->shape[d] = ir_dim_eval(x->shape[d], e->sym);
            numel *= t->shape[d];
        }
        size_t es = x->dtype == IR_F32 ? sizeof(double) : ir_dtype_size(x->dtype);
        t->data = malloc((size_t)(numel ? numel : 1) * es);
        ck_assert_ptr_nonnull(t->data);
        int targets = strcmp(x->s, "targets") == 0;
        for (int64_t k = 0; k < numel; k++) {
            switch (x->dtype) {
            case IR_F32: ((double *)t->data)[k] = (float)(next_unit() - 0.5); break; /* f64 API */
            case IR_I32: ((int32_t *)t->data)[k] = (int32_t)(next_u64() % (uint64_t)vocab); break;
            case IR_I64:
                ((int64_t *)t->data)[k] = targets && next_u64() % 5 == 0 /* ignored */
                                              ? -1 : (int64_t)(next_u64() % (uint64_t)vocab);
                break;
            default: ((uint8_t *)t->data)[k] = next_u64() % 4 != 0; break;
            }
        }
    }
}

static inline void env_free(Env *e)
{
    for (int i = 0; i < e->n; i++)
        free(e->t[i].data);
    free(e->t);
    free(e->leaf);
}

/* ---- running before and after ---- */

typedef struct {
    int64_t elems, bitwise, zero_sign;
} Compared;

/* Runs both graphs on e through ir_interp_f64 (no rounding to f32 at the outputs, so the check
 * sees every bit the interpreter computed); both fail or both succeed with equal outputs. */
static inline void same_outputs(const char *what, const IrGraph *a, const IrGraph *b, Env *e,
                                Compared *c)
{
    char ea[512], eb[512];
    ck_assert_int_eq(a->noutputs, b->noutputs);
    IrHostTensor *oa = calloc((size_t)a->noutputs + 1, sizeof *oa);
    IrHostTensor *ob = calloc((size_t)b->noutputs + 1, sizeof *ob);
    int ra = ir_interp_f64(a, env_bind, e, oa, ea, sizeof ea);
    int rb = ir_interp_f64(b, env_bind, e, ob, eb, sizeof eb);
    ck_assert_msg(ra == rb, "%s: before: %s; after: %s", what, ra ? ea : "ok", rb ? eb : "ok");
    for (int o = 0; ra == 0 && o < a->noutputs; o++) {
        ck_assert_str_eq(a->outputs[o].name, b->outputs[o].name);
        IrHostTensor *x = &oa[o], *y = &ob[o];
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->rank, y->rank);
        for (int d = 0; d < x->rank; d++)
            ck_assert_int_eq(x->shape[d], y->shape[d]);
        int64_t numel = ir_host_numel(x);
        size_t es = x->dtype == IR_F32 ? sizeof(double) : ir_dtype_size(x->dtype);
        c->elems += numel;
        for (int64_t k = 0; k < numel; k++) {
            if (memcmp((char *)x->data + k * es, (char *)y->data + k * es, es) == 0) {
                c->bitwise++;
                continue;
            }
            ck_assert_msg(x->dtype == IR_F32, "%s: output '%s'[%lld] differs", what,
                          a->outputs[o].name, (long long)k);
            double u = ((double *)x->data)[k], v = ((double *)y->data)[k];
            ck_assert_msg(u == v || (isnan(u) && isnan(v)),
                          "%s: output '%s'[%lld]: %.17g before, %.17g after",
                          what, a->outputs[o].name, (long long)k, u, v);
            c->zero_sign += u == 0;
        }
    }
    for (int o = 0; o < a->noutputs; o++) {
        ir_host_free(&oa[o]);
        ir_host_free(&ob[o]);
    }
    free(oa);
    free(ob);
}

#endif
