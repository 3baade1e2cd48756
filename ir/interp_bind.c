/* interp_bind.c: the interpreter's step 2 (interp.c): binding every leaf through the caller's
 * callback, symbols from the dimensions that name them, derived symbols, and the checks of each
 * leaf's dtype class, shape and symbol bounds. */
#include "interp_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding the leaves ---- */

static int is_leaf_bound(IrOp op) { return op == IR_INPUT || op == IR_PARAM || op == IR_BUFFER; }

/* index of the symbol if d is exactly one symbol (coefficient 1, constant 0), else -1 */
static int pure_sym(IrDim d)
{
    int s = -1;
    if (d.c != 0)
        return -1;
    for (int k = 0; k < IR_MAXSYM; k++) {
        if (!d.k[k])
            continue;
        if (d.k[k] != 1 || s >= 0)
            return -1;
        s = k;
    }
    return s;
}

static int dtype_class(IrDType t) { return t == IR_F32 ? 0 : ir_dtype_is_int(t) ? 1 : t == IR_I8 ? 3 : 2; }

/* "input 'tokens': expected i64[b, n] (b=2, n=16), got i64[2, 17]" */
static int leaf_mismatch(Interp *it, const IrNode *n, const IrHostTensor *t)
{
    char want[256], got[256], dim[64];
    size_t len = (size_t)snprintf(want, sizeof want, "%s[", ir_dtype_name(n->dtype));
    int used[IR_MAXSYM] = {0};
    for (int i = 0; i < n->rank && len < sizeof want; i++) {
        len += (size_t)snprintf(want + len, sizeof want - len, "%s%s", i ? ", " : "",
                                ir_dim_str(it->g, n->shape[i], dim, sizeof dim));
        for (int s = 0; s < IR_MAXSYM; s++)
            used[s] |= n->shape[i].k[s] != 0;
    }
    if (len < sizeof want)
        len += (size_t)snprintf(want + len, sizeof want - len, "]");
    int first = 1;
    for (int s = 0; s < it->g->nsyms && len < sizeof want; s++) {
        if (!used[s] || !it->sym_from[s])
            continue;
        len += (size_t)snprintf(want + len, sizeof want - len, "%s%s=%lld", first ? " (" : ", ",
                                it->g->sym_name[s], (long long)it->sym[s]);
        first = 0;
    }
    if (!first && len < sizeof want)
        snprintf(want + len, sizeof want - len, ")");

    len = (size_t)snprintf(got, sizeof got, "%s[", ir_dtype_name(t->dtype));
    for (int i = 0; i < t->rank && len < sizeof got; i++)
        len += (size_t)snprintf(got + len, sizeof got - len, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    if (len < sizeof got)
        snprintf(got + len, sizeof got - len, "]");
    return ii_fail(it, "%s '%s': expected %s, got %s", ii_leaf_kind(n->op), n->s, want, got);
}

/* Derived symbols (ir_graph_add_derived_sym), in order, once the symbols they use are bound:
 * min(def, cap). One whose symbols are not all bound stays unbound (an error only if used). */
static int derive_syms(Interp *it)
{
    const IrGraph *g = it->g;
    for (int s = 0; s < g->nsyms; s++) {
        if (!g->sym_derived[s] || ii_unbound_sym(it, g->sym_def[s]) >= 0)
            continue;
        int64_t v[IR_MAXSYM];
        memcpy(v, it->sym, sizeof v);
        ir_graph_derive_syms(g, v);
        if (v[s] < 0) {
            char def[128];
            ir_dim_str(g, g->sym_def[s], def, sizeof def);
            return ii_fail(it, "symbol '%s' = %s is %lld with these inputs", g->sym_name[s], def, (long long)v[s]);
        }
        it->sym[s] = v[s];
        it->sym_from[s] = SYM_DERIVED;
    }
    return 0;
}

/* Pass 1 asks for every leaf and binds symbols (not the derived ones, computed next); pass 2
 * checks each bound leaf's dtype class and shape, the dims that name derived symbols included.
 * A leaf the outputs do not need may be missing. */
int ii_bind_leaves(Interp *it, IrBindFn bind, void *ctx, const char *needed)
{
    const IrGraph *g = it->g;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (!is_leaf_bound(n->op))
            continue;
        IrHostTensor t;
        memset(&t, 0, sizeof t);
        if (bind(ctx, n, &t) != 0) {
            if (needed[i])
                return ii_fail(it, "missing %s '%s'", ii_leaf_kind(n->op), n->s);
            continue;
        }
        if (t.dtype >= IR_NUM_DTYPES || t.rank < 0 || t.rank > IR_MAXRANK)
            return ii_fail(it, "%s '%s': bad dtype or rank", ii_leaf_kind(n->op), n->s);
        for (int d = 0; d < t.rank; d++)
            if (t.shape[d] < 0 || t.shape[d] > MAX_SYM_VALUE)
                return ii_fail(it, "%s '%s': bad dimension %lld", ii_leaf_kind(n->op), n->s,
                            (long long)t.shape[d]);
        int64_t numel = ii_numel_checked(t.rank, t.shape);
        if (numel < 0)
            return ii_fail(it, "%s '%s': too many elements", ii_leaf_kind(n->op), n->s);
        if (numel > 0 && !t.data)
            return ii_fail(it, "%s '%s': no data", ii_leaf_kind(n->op), n->s);
        it->host[i] = t;
        it->have_host[i] = 1;
        if (t.rank != n->rank)
            continue; /* reported in pass 2 */
        for (int d = 0; d < n->rank; d++) {
            int s = pure_sym(n->shape[d]);
            if (s < 0 || s >= g->nsyms || it->sym_from[s] || g->sym_derived[s])
                continue;
            it->sym[s] = t.shape[d];
            it->sym_from[s] = i + 1;
            if (g->sym_max[s] > 0 && t.shape[d] > g->sym_max[s])
                return ii_fail(it, "symbol '%s' = %lld exceeds its bound %lld (from %s '%s')",
                            g->sym_name[s], (long long)t.shape[d], (long long)g->sym_max[s],
                            ii_leaf_kind(n->op), n->s);
        }
    }
    if (derive_syms(it) < 0)
        return -1;
    for (int l = 0; l < g->nlimits; l++) /* c+n <= max_seq_len (ir_graph_add_limit) */
        if (ii_unbound_sym(it, g->limit_def[l]) < 0 && ir_dim_eval(g->limit_def[l], it->sym) > g->limit_max[l]) {
            char def[128];
            ir_dim_str(g, g->limit_def[l], def, sizeof def);
            return ii_fail(it, "%s = %lld with these inputs exceeds its bound %lld", def,
                        (long long)ir_dim_eval(g->limit_def[l], it->sym), (long long)g->limit_max[l]);
        }
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (!it->have_host[i])
            continue;
        const IrHostTensor *t = &it->host[i];
        if (dtype_class(t->dtype) != dtype_class(n->dtype) || t->rank != n->rank)
            return leaf_mismatch(it, n, t);
        for (int d = 0; d < n->rank; d++) {
            int s = ii_unbound_sym(it, n->shape[d]);
            if (s >= 0)
                return ii_fail(it, "%s '%s': symbol '%s' in its shape is not bound by any input",
                            ii_leaf_kind(n->op), n->s, ii_sym_name(it, s));
            int64_t want;
            if (ii_dim_value(it, n, n->shape[d], &want) < 0)
                return -1;
            if (want != t->shape[d])
                return leaf_mismatch(it, n, t);
        }
    }
    return 0;
}

