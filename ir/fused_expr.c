/* fused_expr.c: reading, writing and building the program of a `fused` node (fused_expr.h). */
#include "fused_expr.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* the ops a step may name, and how many arguments each takes */
static int step_arity(IrOp op)
{
    if (ir_ops[op].flags & IR_ELEM)
        return op == IR_CAST ? 1 : ir_ops[op].arity;
    if (op == IR_SUM || op == IR_RMAX || op == IR_SOFTMAX || op == IR_EXPAND)
        return 1;
    if (op == IR_SLICE)
        return 1;
    if (op == IR_MATMUL || op == IR_CONCAT)
        return 2;
    if (op == IR_PERMUTE)
        return 1;
    return -1;
}

static int read_word(const char **s, char *buf, size_t n)
{
    size_t k = 0;
    while (**s && (isalnum((unsigned char)**s) || **s == '_')) {
        if (k + 1 < n)
            buf[k++] = **s;
        (*s)++;
    }
    buf[k] = 0;
    return (int)k;
}

static int read_int(const char **s, int64_t *v)
{
    char *end;
    long long x = strtoll(*s, &end, 10);
    if (end == *s)
        return -1;
    *s = end;
    *v = x;
    return 0;
}

static int read_dtype(const char **s, IrDType *t)
{
    char w[16];
    if (!read_word(s, w, sizeof w))
        return -1;
    int d = ir_dtype_lookup(w);
    if (d < 0)
        return -1;
    *t = (IrDType)d;
    return 0;
}

static int read_arg(const char **s, IrFusedRef *a, int nstep, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    int64_t k;
    if (**s == '$' || **s == '%') {
        a->kind = **s;
        (*s)++;
        if (read_int(s, &k) < 0 || k < 0 || (a->kind == '$' && k >= IR_MAXIN) || (a->kind == '%' && k >= nstep))
            return fail(err, n, "fused program: bad reference at '%.20s'", *s);
        a->idx = (int)k;
        return 0;
    }
    char *end;
    double v = strtod(*s, &end);
    if (end == *s || *end != ':')
        return fail(err, n, "fused program: expected $K, %%I or NUMBER:DTYPE at '%.20s'", *s);
    *s = end + 1;
    a->kind = 'c';
    a->value = v;
    if (read_dtype(s, &a->dtype) < 0)
        return fail(err, n, "fused program: bad dtype at '%.20s'", *s);
    return 0;
}

int ir_fused_parse(const char *text, IrFusedProgram *p, char *err, size_t n)
{
    memset(p, 0, sizeof *p);
    const char *s = text ? text : "";
    while (*s) {
        if (p->nsteps == IR_FUSED_MAXSTEPS)
            return fail(err, n, "fused program: more than %d steps", IR_FUSED_MAXSTEPS);
        IrFusedStep *st = &p->step[p->nsteps];
        char name[32];
        if (!read_word(&s, name, sizeof name))
            return fail(err, n, "fused program: expected an op at '%.20s'", s);
        if (!strcmp(name, "bcast"))
            st->op = IR_EXPAND;
        else if ((st->op = ir_op_lookup(name)) == IR_NUM_OPS)
            return fail(err, n, "fused program: unknown op '%s'", name);
        int arity = step_arity(st->op);
        if (arity < 0 || (st->op == IR_EXPAND && strcmp(name, "bcast")))
            return fail(err, n, "fused program: '%s' cannot be a step", name);
        if (st->op == IR_CAST) {
            if (*s++ != ':' || read_dtype(&s, &st->cast_to) < 0)
                return fail(err, n, "fused program: cast needs ':DTYPE'");
        }
        if (*s++ != '(')
            return fail(err, n, "fused program: expected '(' after %s", name);
        for (int k = 0; k < arity; k++) {
            if (k && *s++ != ',')
                return fail(err, n, "fused program: %s takes %d arguments", name, arity);
            if (read_arg(&s, &st->arg[k], p->nsteps, err, n) < 0)
                return -1;
        }
        st->nargs = arity;
        if (st->op == IR_SLICE) {
            if (*s++ != ',' || read_int(&s, &st->start) < 0 || *s++ != ',' || read_int(&s, &st->len) < 0 ||
                st->start < 0 || st->len < 0)
                return fail(err, n, "fused program: slice(ARG,START,LEN)");
        }
        if (st->op == IR_MATMUL) {
            if (*s++ != ',' || read_int(&s, &st->start) < 0 || (st->start != 0 && st->start != 1))
                return fail(err, n, "fused program: matmul(ARG,ARG,TRANSPOSE_B)");
        }
        while (st->op == IR_PERMUTE && *s == ',') {
            int64_t ax;
            s++;
            if (st->nperm == IR_MAXRANK || read_int(&s, &ax) < 0 || ax < 0 || ax >= IR_MAXRANK)
                return fail(err, n, "fused program: permute(ARG,AXIS,...)");
            st->perm[st->nperm++] = (int8_t)ax;
        }
        if (*s++ != ')')
            return fail(err, n, "fused program: expected ')' after the arguments of %s", name);
        p->nsteps++;
        if (*s == ';')
            s++;
        else if (*s)
            return fail(err, n, "fused program: expected ';' at '%.20s'", s);
    }
    if (p->nsteps == 0)
        return fail(err, n, "fused program: no steps");
    return 0;
}

int ir_fused_write(const IrFusedProgram *p, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < p->nsteps; i++) {
        const IrFusedStep *st = &p->step[i];
        const char *name = st->op == IR_EXPAND ? "bcast" : ir_ops[st->op].name;
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s", i ? ";" : "", name);
        if (st->op == IR_CAST)
            len += (size_t)snprintf(buf + len, len < n ? n - len : 0, ":%s", ir_dtype_name(st->cast_to));
        for (int k = 0; k < st->nargs; k++) {
            const IrFusedRef *a = &st->arg[k];
            const char *sep = k ? "," : "(";
            if (a->kind == 'c') {
                char num[40];
                for (int prec = 15; prec <= 17; prec++) {
                    snprintf(num, sizeof num, "%.*g", prec, a->value);
                    if (strtod(num, NULL) == a->value)
                        break;
                }
                len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s:%s", sep, num, ir_dtype_name(a->dtype));
            } else {
                len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%c%d", sep, a->kind, a->idx);
            }
        }
        if (st->op == IR_SLICE)
            len += (size_t)snprintf(buf + len, len < n ? n - len : 0, ",%lld,%lld", (long long)st->start,
                                    (long long)st->len);
        if (st->op == IR_MATMUL)
            len += (size_t)snprintf(buf + len, len < n ? n - len : 0, ",%lld", (long long)st->start);
        for (int k = 0; st->op == IR_PERMUTE && k < st->nperm; k++)
            len += (size_t)snprintf(buf + len, len < n ? n - len : 0, ",%d", st->perm[k]);
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0, ")");
    }
    return len < n ? 0 : -1;
}

IrGraph *ir_fused_graph(const IrFusedProgram *p, int nin, const IrDType *dtypes, const int *ranks,
                        IrDim (*shapes)[IR_MAXRANK], int out_rank, const IrDim *out_shape, IrNode **steps,
                        char *err, size_t n)
{
    IrGraph *g = ir_graph_new("fused");
    if (!g) {
        fail(err, n, "out of memory");
        return NULL;
    }
    for (int s = 0; s < IR_MAXSYM; s++) {
        char nm[16];
        snprintf(nm, sizeof nm, "s%d", s);
        ir_graph_add_sym(g, nm, 0);
    }
    IrNode *x[IR_MAXIN] = {0};
    for (int k = 0; k < nin; k++) {
        char nm[16];
        snprintf(nm, sizeof nm, "x%d", k);
        x[k] = ir_input(g, nm, dtypes[k], ranks[k], shapes[k]);
    }
    IrNode *val[IR_FUSED_MAXSTEPS] = {0};
    for (int i = 0; i < p->nsteps && !ir_graph_error(g); i++) {
        const IrFusedStep *st = &p->step[i];
        IrNode *a[3] = {0};
        for (int k = 0; k < st->nargs; k++) {
            const IrFusedRef *r = &st->arg[k];
            if (r->kind == '$' && r->idx >= nin) {
                ir_graph_set_error(g, "step %d reads operand %d of %d", i, r->idx, nin);
                break;
            }
            a[k] = r->kind == '$' ? x[r->idx] : r->kind == '%' ? val[r->idx] : ir_const(g, r->value, r->dtype);
        }
        if (ir_graph_error(g))
            break;
        IrNode *y;
        switch (st->op) {
        case IR_CAST: y = ir_cast(g, a[0], st->cast_to); break;
        case IR_SUM:
        case IR_RMAX:
            if (a[0] && a[0]->rank < 1) {
                ir_graph_set_error(g, "step %d reduces a scalar", i);
                y = NULL;
            } else {
                y = ir_reduce(g, st->op, a[0], -1);
            }
            break;
        case IR_SOFTMAX: y = ir_softmax(g, a[0]); break;
        case IR_EXPAND: y = ir_expand(g, a[0], out_rank, out_shape); break;
        case IR_SLICE:
            y = a[0] && a[0]->rank >= 1 ? ir_slice(g, a[0], -1, ir_dim(st->start), ir_dim(st->len)) : NULL;
            if (!y && !ir_graph_error(g))
                ir_graph_set_error(g, "step %d slices a scalar", i);
            break;
        case IR_WHERE: y = ir_where(g, a[0], a[1], a[2]); break;
        case IR_MATMUL: y = ir_matmul(g, a[0], a[1], (int)st->start); break;
        case IR_CONCAT: y = ir_concat(g, a[0], a[1], -1); break;
        case IR_PERMUTE: {
            int perm[IR_MAXRANK];
            for (int k = 0; k < IR_MAXRANK; k++)
                perm[k] = k < st->nperm ? st->perm[k] : k;
            if (a[0] && st->nperm != a[0]->rank) {
                ir_graph_set_error(g, "step %d permutes %d axes of a rank-%d value", i, st->nperm, a[0]->rank);
                y = NULL;
            } else {
                y = ir_permute(g, a[0], perm);
            }
            break;
        }
        default: y = st->nargs == 1 ? ir_unary(g, st->op, a[0]) : ir_binary(g, st->op, a[0], a[1]); break;
        }
        val[i] = y;
        if (steps)
            steps[i] = y;
    }
    IrNode *last = p->nsteps ? val[p->nsteps - 1] : NULL;
    if (last && !ir_graph_error(g)) {
        int same = last->rank == out_rank;
        for (int d = 0; same && d < out_rank; d++)
            same = ir_dim_eq(last->shape[d], out_shape[d]);
        IrNode *y = same ? last : ir_expand(g, last, out_rank, out_shape);
        if (y)
            ir_output(g, "y", y);
    }
    if (ir_graph_error(g) || !last) {
        fail(err, n, "fused program: %s", ir_graph_error(g) ? ir_graph_error(g) : "no value");
        ir_graph_free(g);
        return NULL;
    }
    return g;
}

IrGraph *ir_fused_graph_of(const IrNode *node, IrFusedProgram *p, IrNode **steps, char *err, size_t n)
{
    if (ir_fused_parse(node->s, p, err, n) < 0)
        return NULL;
    IrDType dt[IR_MAXIN];
    int rk[IR_MAXIN];
    IrDim sh[IR_MAXIN][IR_MAXRANK];
    for (int k = 0; k < node->nin; k++) {
        dt[k] = node->in[k]->dtype;
        rk[k] = node->in[k]->rank;
        memcpy(sh[k], node->in[k]->shape, sizeof sh[k]);
    }
    return ir_fused_graph(p, node->nin, dt, rk, sh, node->rank, node->shape, steps, err, n);
}

enum { AT_OWN = 1, AT_WIDTH = 2, AT_OTHER = 4 }; /* columns read, relative to the root's */

int ir_epilogue_parts(const IrNode *const *nodes, int n, const IrNode *mm)
{
    if (n < 1 || n > IR_FUSED_MAXSTEPS + IR_MAXIN + 2)
        return 0;
    const IrNode *root = nodes[0];
    int r = root->rank;
    if (r < 1 || mm->rank != r || !ir_dim_is_const(root->shape[r - 1]) || !ir_dim_is_const(mm->shape[r - 1]))
        return 0;
    for (int d = 0; d < r - 1; d++)
        if (!ir_dim_eq(mm->shape[d], root->shape[d]))
            return 0;
    int64_t w = root->shape[r - 1].c, wm = mm->shape[r - 1].c;
    int parts = wm == w ? 1 : wm == 2 * w && w > 0 ? 2 : 0;
    if (!parts)
        return 0;
    int at[IR_FUSED_MAXSTEPS + IR_MAXIN + 2] = {AT_OWN};
    for (int i = 0; i < n; i++) {
        const IrNode *y = nodes[i];
        int my = at[i];
        if (!my || y == mm)
            continue;
        int to = my;
        if (y->op == IR_SLICE && y->ia[IR_IA_AXIS] == y->rank - 1 && ir_dim_is_const(y->d)) {
            int64_t s = y->d.c;
            to = my & AT_OTHER;
            if (my & AT_OWN)
                to |= s == 0 ? AT_OWN : s == w ? AT_WIDTH : AT_OTHER;
            if (my & AT_WIDTH)
                to |= s == 0 ? AT_WIDTH : AT_OTHER;
        } else if (y->op == IR_SLICE || y->op == IR_CONCAT || y->op == IR_SUM || y->op == IR_RMAX ||
                   y->op == IR_SOFTMAX || y->op == IR_PERMUTE || y->op == IR_MATMUL) {
            to = AT_OTHER;
        }
        for (int k = 0; k < y->nin; k++)
            for (int j = i + 1; j < n; j++)
                if (nodes[j] == y->in[k])
                    at[j] |= to;
    }
    int mine = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i] == mm)
            mine = at[i];
    if (!mine || (mine & AT_OTHER) || (parts == 1 && mine != AT_OWN))
        return 0;
    return parts;
}

static int same_shape(const IrNode *a, const IrNode *b)
{
    int same = a->rank == b->rank;
    for (int d = 0; same && d < a->rank; d++)
        same = ir_dim_eq(a->shape[d], b->shape[d]);
    return same;
}

int ir_fused_epilogue_parts(const IrNode *node, const IrFusedProgram *p, IrNode *const *steps, const IrNode *mm)
{
    const IrNode *order[IR_FUSED_MAXSTEPS];
    int remap = 0, no = 0;
    for (int i = p->nsteps - 1; i >= 0; i--) {
        order[no++] = steps[i];
        remap |= steps[i]->op == IR_SLICE || steps[i]->op == IR_CONCAT;
    }
    if (!remap && same_shape(mm, node))
        return 1;
    return no && same_shape(order[0], node) ? ir_epilogue_parts(order, no, mm) : 0;
}

int ir_fused_is_reduce(IrOp op) { return op == IR_SUM || op == IR_RMAX || op == IR_SOFTMAX; }

int ir_fused_kernel_check(const IrNode *node, const IrGraph *pg, const IrFusedProgram *p, IrNode *const *steps,
                          int *has_reduce, const IrNode **mm, int *mm_parts, char *err, size_t n)
{
    *has_reduce = 0;
    *mm = NULL;
    *mm_parts = 0;
    for (int i = 0; i < pg->nnodes; i++) {
        const IrNode *x = pg->nodes[i];
        if (x->rank > node->rank && x->op != IR_INPUT)
            return fail(err, n, "a value of rank %d in a rank-%d kernel", x->rank, node->rank);
        *has_reduce |= ir_fused_is_reduce(x->op);
        if (x->op == IR_PERMUTE && (x->in[0]->op != IR_INPUT || x->perm[x->rank - 1] != x->rank - 1))
            return fail(err, n, "a permute must keep the last axis of an operand");
        if (x->op != IR_MATMUL)
            continue;
        if (*mm || x->in[0]->op != IR_INPUT || x->in[1]->op != IR_INPUT || x->rank != node->rank)
            return fail(err, n, "one matmul of operands, of the node's rank");
        *mm = x;
    }
    if (*mm && *has_reduce)
        return fail(err, n, "a matmul epilogue has no reduction");
    if (*mm && !(*mm_parts = ir_fused_epilogue_parts(node, p, steps, *mm)))
        return fail(err, n, "a matmul epilogue reads the product at the node's own columns, or (twice the node's "
                    "width) there and one width further, through slices");
    return 0;
}
