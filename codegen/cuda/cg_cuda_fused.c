/* cg_cuda_fused.c: the CUDA kernel of the `fused` op (ops.def): a program of elementwise ops,
 * last-axis reductions, softmaxes, slices, concats and permutes over the operands
 * (ir/fused_expr.h), one kernel and one pass over memory per reduction instead of a kernel and an
 * intermediate tensor per op.
 *
 * As the CPU kernel (cg_llvm_fused.c) does, the program is built as a small graph
 * (ir_fused_graph_of) whose nodes become C expressions through the templates of the elementwise
 * kernels (cg_cuda_ops.c), so every op means here what it means in its own kernel. A row is one
 * index of the node's leading dims; every program value is a function of the row and of a column
 * of its own last axis, which is where the ops differ:
 *   elementwise, bcast  an operand of last dim 1 is read at column 0, others at the same column
 *   slice               the argument at column + start
 *   concat              the first part below its length, the second above (both read at clamped
 *                       columns, then selected)
 *   permute             of an operand, keeping its last axis: read with the permuted strides
 *   sum, reduce_max     a per-row value (red<id>), computed before the row's value
 *   softmax             exp(x - max) * (1 / sum), its max and 1 / sum per-row values
 * Values are recomputed in every loop that needs them rather than stored.
 *
 * Indices are 32-bit where the output and every operand are small enough (chosen at run time:
 * the kernel holds both loops), so that splitting an element index into row and column and the
 * row into the leading dims' indices are 32-bit divisions.
 *   without reductions: a thread per output element, in a grid-stride loop;
 *   with reductions:    a block per row; for each reduction in program order a loop over its
 *                       argument's columns (softmax: two) and a block reduction whose result
 *                       every thread keeps; then a loop writing the row. Where the lengths of
 *                       those loops are multiples of 8 (decided when generating for known sizes,
 *                       tested in the kernel otherwise) and the f32 output and the f32 operands
 *                       read along the row start 16-byte aligned (each row's offset a multiple
 *                       of 8, the pointers tested), each thread takes 8 neighbouring columns at
 *                       once: the operands read at the loop's column come in one 16-byte load
 *                       of 16-bit storage (xtc_ld8; two of f32), the row goes out likewise
 *                       (xtc_st8), the 8 columns computed in between; else a column at a time.
 * A program with a matmul step (bias and activation, a residual add after a matmul) is the tiled
 * matmul kernel (cg_cuda_matmul.c) with the rest of the program as its epilogue, run on each
 * product. */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "fused_expr.h"

#define BLOCK 256
#define ROW_BLOCK 128
#define COL 600 /* room for a column expression */

typedef struct {
    CuKernel *k;
    FILE *f;
    IrGraph *pg;         /* the program's graph */
    IrFusedProgram prog;
    IrNode *steps[IR_FUSED_MAXSTEPS];
    int has_reduce;
    const IrNode *mm;    /* the matmul step: the program is its epilogue */
    int mm_parts;        /* ir_epilogue_parts: 1, or 2 (the product's halves, mm and mm1) */
    int64_t coff;        /* columns added by the slices around the value being written */
    char *declared;      /* per program node: v<id> (its value at the loop's column) exists */
    const char *col;     /* the loop's own column variable */
    const char *indent;
    int temps;           /* values at other columns: t<n> */
    const char *ix;      /* the index type: "int" where every offset fits, else "i64" */
    int vec;             /* the rows' loops have a path of 8 columns a thread (see above) */
    int vec_out;         /* ... the loop writing the row too */
    int in_vec;          /* generating that path's columns: own-column reads of a vector operand are xv<op>[u] */
    unsigned char vop[IR_MAXIN]; /* operands that may be read 8 at a time: f32, read along the row */
    unsigned char vmark[IR_MAXIN]; /* ... read so in the loop being generated */
    char vtest[1024];    /* the row's test of that path */
} Fz;

static int operand_of(const IrNode *x) { return x->s && x->s[0] == 'x' ? atoi(x->s + 1) : 0; }

static const char *label(const IrNode *n) { return n->label ? n->label : "?"; }

static int last_is_one(const IrNode *x) { return x->rank == 0 || ir_dim_is_one(x->shape[x->rank - 1]); }

/* Builds the program's graph and checks what this kernel handles (what the CPU's does). */
static int fz_init(Fz *z, CuKernel *k)
{
    memset(z, 0, sizeof *z);
    z->k = k;
    z->f = k->f;
    const IrNode *n = k->node;
    char err[300];
    z->pg = ir_fused_graph_of(n, &z->prog, z->steps, err, sizeof err);
    if (!z->pg)
        return cu_error(k->gen, "fused %%%s: %s", label(n), err);
    if (n->rank < 1)
        return cu_error(k->gen, "fused %%%s: the CUDA kernel needs rank >= 1", label(n));
    if (ir_fused_kernel_check(n, z->pg, &z->prog, z->steps, &z->has_reduce, &z->mm, &z->mm_parts, err, sizeof err))
        return cu_error(k->gen, "fused %%%s: %s", label(n), err);
    z->declared = calloc((size_t)z->pg->nnodes + 1, 1);
    if (!z->declared)
        return cu_error(k->gen, "out of memory");
    return 0;
}

static void fz_free(Fz *z)
{
    ir_graph_free(z->pg);
    free(z->declared);
}

/* "+ i * (n * 32)" terms of an offset: dim d of the node's leading dims has index ri<d> */
static void add_term(char *buf, size_t n, size_t *len, int d, const char *stride)
{
    if (*len >= n)
        return;
    int p = strchr(stride, ' ') != NULL;
    if (strcmp(stride, "1") == 0)
        *len += (size_t)snprintf(buf + *len, n - *len, "%sri%d", *len ? " + " : "", d);
    else
        *len += (size_t)snprintf(buf + *len, n - *len, "%sri%d * %s%s%s", *len ? " + " : "", d, p ? "(" : "", stride,
                                 p ? ")" : "");
}

/* The row's offset in each operand (base<k>) and in each permuted operand (pbase<id>), from the
 * row index, an expression. */
static void row_bases(Fz *z, const char *row, const char *indent)
{
    CuKernel *k = z->k;
    const IrNode *n = k->node;
    FILE *f = z->f;
    int r = n->rank;
    char expr[2048];
    const char *ix = z->ix;
    if (r > 2) {
        fprintf(f, "%s%s rest = %s;\n", indent, ix, row);
        for (int d = r - 2; d >= 1; d--) {
            char size[CU_EXPR];
            cu_dim(k->gen, n->shape[d], size, sizeof size);
            int p = strchr(size, ' ') != NULL;
            const char *cast = strcmp(ix, "int") ? "" : "(int)"; /* a 32-bit division */
            fprintf(f, "%sconst %s ri%d = rest %% %s%s%s%s;\n%srest /= %s%s%s%s;\n", indent, ix, d, cast, p ? "(" : "",
                    size, p ? ")" : "", indent, cast, p ? "(" : "", size, p ? ")" : "");
        }
        fprintf(f, "%sconst %s ri0 = rest;\n", indent, ix);
    } else if (r == 2) {
        fprintf(f, "%sconst %s ri0 = %s;\n", indent, ix, row);
    }
    for (int d = 0; d < r - 1; d++)
        fprintf(f, "%s(void)ri%d;\n", indent, d);
    for (int op = 0; op < n->nin; op++) {
        const IrNode *x = n->in[op];
        size_t len = 0;
        expr[0] = 0;
        for (int d = 0; d < r - 1; d++) {
            int kd = d - (r - x->rank);
            if (kd < 0 || ir_dim_is_one(x->shape[kd]))
                continue;
            char stride[CU_EXPR];
            cu_dims_prod(k->gen, x->shape, kd + 1, x->rank, stride, sizeof stride);
            add_term(expr, sizeof expr, &len, d, stride);
        }
        fprintf(f, "%sconst %s base%d = %s;\n", indent, ix, op, len ? expr : "0");
    }
    for (int i = 0; i < z->pg->nnodes; i++) {
        const IrNode *pv = z->pg->nodes[i], *x;
        if (pv->op != IR_PERMUTE)
            continue;
        x = pv->in[0]; /* an operand: the permuted value's dim kd is its dim perm[kd] */
        size_t len = 0;
        expr[0] = 0;
        for (int d = 0; d < r - 1; d++) {
            int kd = d - (r - pv->rank);
            if (kd < 0 || ir_dim_is_one(pv->shape[kd]))
                continue;
            char stride[CU_EXPR];
            cu_dims_prod(k->gen, x->shape, pv->perm[kd] + 1, x->rank, stride, sizeof stride);
            add_term(expr, sizeof expr, &len, d, stride);
        }
        fprintf(f, "%sconst %s pbase%d = %s; /* operand %d, permuted */\n", indent, ix, pv->id, len ? expr : "0",
                operand_of(x));
    }
}

static void value(Fz *z, const IrNode *x, const char *col, char *buf, size_t n);

/* the column at which x is read: 0 where its last axis has length 1 */
static const char *col_of(const IrNode *x, const char *col) { return last_is_one(x) ? "0" : col; }

/* The value of program node x at column col of the current row, into buf: a literal, a per-row
 * value, or the name of a local the function declares (v<id> at the loop's own column, else a
 * fresh t<n>). */
static void value(Fz *z, const IrNode *x, const char *col, char *buf, size_t n)
{
    FILE *f = z->f;
    const char *in = z->indent;
    int own = strcmp(col, z->col) == 0;
    switch (x->op) {
    case IR_SUM:
    case IR_RMAX:
        snprintf(buf, n, "red%d", x->id);
        return;
    case IR_MATMUL: /* the epilogue's product; mm1 its second half (coff: the width) */
        snprintf(buf, n, "%s", z->coff ? "mm1" : "mm");
        return;
    case IR_CONST:
        switch (x->dtype) {
        case IR_F32: cu_float(x->f, buf, n); break;
        case IR_BOOL: snprintf(buf, n, "%d", x->f != 0); break;
        case IR_I32: snprintf(buf, n, "%lld", (long long)x->f); break;
        default: snprintf(buf, n, "%lldLL", (long long)x->f); break;
        }
        return;
    case IR_EXPAND:
        value(z, x->in[0], col_of(x->in[0], col), buf, n);
        return;
    case IR_SLICE: {
        char start[CU_EXPR], c[COL];
        cu_dim(z->k->gen, x->d, start, sizeof start);
        snprintf(c, sizeof c, "%s + %s", col, start);
        int64_t s = ir_dim_is_const(x->d) ? x->d.c : 0;
        z->coff += s;
        value(z, x->in[0], c, buf, n);
        z->coff -= s;
        return;
    }
    default: break;
    }
    if (own && z->declared[x->id]) {
        snprintf(buf, n, "v%d", x->id);
        return;
    }
    char name[32], expr[1200], ptr[16], idx[COL + 32];
    if (own)
        snprintf(name, sizeof name, "v%d", x->id);
    else
        snprintf(name, sizeof name, "t%d", z->temps++);
    switch (x->op) {
    case IR_INPUT: {
        int op = operand_of(x);
        snprintf(ptr, sizeof ptr, "in%d", op);
        if (z->in_vec && own && op < IR_MAXIN && z->vop[op]) { /* loaded with its 7 neighbours */
            z->vmark[op] = 1;
            snprintf(expr, sizeof expr, "xv%d[u]", op);
            break;
        }
        if (last_is_one(x))
            snprintf(idx, sizeof idx, "base%d", op);
        else
            snprintf(idx, sizeof idx, "base%d + %s", op, col);
        cu_load(x, ptr, idx, expr, sizeof expr);
        break;
    }
    case IR_PERMUTE: {
        int op = operand_of(x->in[0]);
        snprintf(ptr, sizeof ptr, "in%d", op);
        if (last_is_one(x))
            snprintf(idx, sizeof idx, "pbase%d", x->id);
        else
            snprintf(idx, sizeof idx, "pbase%d + %s", x->id, col);
        cu_load(x, ptr, idx, expr, sizeof expr);
        break;
    }
    case IR_CONCAT: {
        char la[CU_EXPR], ca[COL + CU_EXPR], cb[COL + CU_EXPR], va[64], vb[64];
        cu_dim(z->k->gen, x->in[0]->shape[x->rank - 1], la, sizeof la);
        /* both parts at clamped columns, then the one that applies */
        snprintf(ca, sizeof ca, "(%s < %s ? %s : %s - 1)", col, la, col, la);
        snprintf(cb, sizeof cb, "(%s < %s ? 0 : %s - (%s))", col, la, col, la);
        value(z, x->in[0], col_of(x->in[0], ca), va, sizeof va);
        value(z, x->in[1], col_of(x->in[1], cb), vb, sizeof vb);
        snprintf(expr, sizeof expr, "%s < %s ? %s : %s", col, la, va, vb);
        break;
    }
    case IR_SOFTMAX: {
        char a[64];
        value(z, x->in[0], col, a, sizeof a);
        snprintf(expr, sizeof expr, "expf(%s - red%d) * inv%d", a, x->id, x->id);
        break;
    }
    default: {
        char args[3][64];
        const char *argv[3] = {"0", "0", "0"};
        for (int i = 0; i < x->nin && i < 3; i++) {
            value(z, x->in[i], col_of(x->in[i], col), args[i], sizeof args[i]);
            argv[i] = args[i];
        }
        const char *tmpl = cg_cuda_scalar(x);
        if (!tmpl) {
            cu_error(z->k->gen, "fused %%%s: no CUDA form of '%s' in a fused program", label(z->k->node),
                     ir_ops[x->op].name);
            tmpl = "0";
        }
        cg_cuda_expand(tmpl, x->in[x->op == IR_WHERE ? 1 : 0]->dtype, argv, expr, sizeof expr);
        break;
    }
    }
    fprintf(f, "%sconst %s %s = %s;\n", in, cu_val_type(x->dtype), name, expr);
    if (own)
        z->declared[x->id] = 1;
    snprintf(buf, n, "%s", name);
}

static void new_loop(Fz *z, const char *col, const char *indent)
{
    memset(z->declared, 0, (size_t)z->pg->nnodes);
    z->col = col;
    z->indent = indent;
}

enum { ACC_RED, ACC_INV, ACC_WRITE }; /* what a loop over the row's columns does with its value */

/* The statement of column j of a loop at z->indent: add the value to red<id> or inv<id>, or
 * write the row's value (in the 8-column path into ov[u]). */
static void col_stmt(Fz *z, int what, const IrNode *x)
{
    FILE *f = z->f;
    const char *in = z->indent;
    const IrNode *n = z->k->node, *root = z->steps[z->prog.nsteps - 1];
    char a[64];
    if (what == ACC_WRITE) {
        value(z, root, col_of(root, "j"), a, sizeof a);
        char value_text[96], store[256];
        snprintf(value_text, sizeof value_text, n->dtype == IR_BOOL ? "(u8)(%s)" : "%s", a);
        if (z->in_vec)
            fprintf(f, "%sov[u] = %s;\n", in, a);
        else
            fprintf(f, "%s%s;\n", in, cu_store(n, "out", "row * Lout + j", value_text, store, sizeof store));
        return;
    }
    value(z, x->in[0], "j", a, sizeof a);
    if (what == ACC_INV)
        fprintf(f, "%sinv%d += expf(%s - red%d);\n", in, x->id, a, x->id);
    else if (x->op != IR_SUM)
        fprintf(f, "%sred%d = xtc_fmax(red%d, %s);\n", in, x->id, x->id, a);
    else
        fprintf(f, "%sred%d += %s;\n", in, x->id, a);
}

/* A loop over the row's len columns (at 8 spaces): a column a thread, or where z->vec, under
 * the row's test `vec` 8 neighbouring columns a thread, the operands read at the column loaded
 * 16 bytes at a time before the 8 columns' statements and the written row stored after them. */
static void col_loop(Fz *z, int what, const IrNode *x, const char *len)
{
    FILE *f = z->f;
    const char *ind = "        ";
    if (z->vec && (what != ACC_WRITE || z->vec_out)) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *mem = open_memstream(&buf, &blen);
        if (!mem) {
            cu_error(z->k->gen, "out of memory");
            return;
        }
        memset(z->vmark, 0, sizeof z->vmark);
        z->f = mem;
        z->in_vec = 1;
        new_loop(z, "j", "                    ");
        col_stmt(z, what, x);
        z->in_vec = 0;
        z->f = f;
        fclose(mem);
        fprintf(f, "%sif (vec) {\n", ind);
        fprintf(f, "%s    for (%s jv = threadIdx.x * 8; jv < %s; jv += blockDim.x * 8) {\n", ind, z->ix, len);
        if (what == ACC_WRITE)
            fprintf(f, "%s        float ov[8];\n", ind);
        for (int op = 0; op < IR_MAXIN; op++)
            if (z->vmark[op]) {
                fprintf(f, "%s        float xv%d[8];\n%s        xtc_ld8(xv%d, in%d, base%d + jv);\n", ind, op, ind, op, op, op);
            }
        fprintf(f, "%s        for (int u = 0; u < 8; u++) {\n", ind);
        fprintf(f, "%s            const %s j = jv + u;\n%s            (void)j;\n", ind, z->ix, ind);
        fputs(buf ? buf : "", f);
        free(buf);
        fprintf(f, "%s        }\n", ind);
        if (what == ACC_WRITE)
            fprintf(f, "%s        xtc_st8(out, row * Lout + jv, ov);\n", ind);
        fprintf(f, "%s    }\n%s} else {\n", ind, ind);
        fprintf(f, "%s    for (%s j = threadIdx.x; j < %s; j += blockDim.x) {\n", ind, z->ix, len);
        new_loop(z, "j", "                ");
        col_stmt(z, what, x);
        fprintf(f, "%s    }\n%s}\n", ind, ind);
        return;
    }
    fprintf(f, "%sfor (%s j = threadIdx.x; j < %s; j += blockDim.x) {\n", ind, z->ix, len);
    new_loop(z, "j", "            ");
    col_stmt(z, what, x);
    fprintf(f, "%s}\n", ind);
}

/* One reduction of the row over its argument's columns: red<id> (and for a softmax inv<id>),
 * the same in every thread. */
static void reduction(Fz *z, const IrNode *x)
{
    FILE *f = z->f;
    const IrNode *e = x->in[0];
    char len[CU_EXPR];
    int is_max = x->op != IR_SUM;
    cu_dim(z->k->gen, e->shape[e->rank - 1], len, sizeof len);
    fprintf(f, "        /* %s over %s columns */\n", ir_ops[x->op].name, len);
    fprintf(f, "        float red%d = %s;\n", x->id, is_max ? "-XTC_INF" : "0.0f");
    col_loop(z, ACC_RED, x, len);
    fprintf(f, "        red%d = %s(red%d);\n", x->id, is_max ? "xtc_block_max" : "xtc_block_sum", x->id);
    if (x->op != IR_SOFTMAX)
        return;
    fprintf(f, "        float inv%d = 0.0f; /* softmax: 1 / sum of exp(x - max) */\n", x->id);
    col_loop(z, ACC_INV, x, len);
    fprintf(f, "        inv%d = 1.0f / xtc_block_sum(inv%d);\n", x->id, x->id);
}

/* The epilogue of a matmul step: the node's row is (batch, row), the column col. */
static int epilogue(void *ctx, CuKernel *k, const char *indent)
{
    Fz *z = ctx;
    const IrNode *root = z->steps[z->prog.nsteps - 1];
    fprintf(k->f, "%s{\n", indent);
    z->ix = "i64";
    char deeper[64], v[64];
    snprintf(deeper, sizeof deeper, "%s    ", indent);
    row_bases(z, "batch * M + row", deeper);
    new_loop(z, "col", deeper);
    value(z, root, col_of(root, "col"), v, sizeof v);
    fprintf(k->f, "%sxtc_st(C, row * %s + col, %s);\n%s}\n", deeper, z->mm_parts == 2 ? "Nout" : "N", v, indent);
    return k->gen->err[0] ? -1 : 0;
}

/* Appends to t (cap bytes) at *len; past the end, only *len grows (the caller gives up then). */
static void append(char *t, size_t cap, size_t *len, const char *fmt, const char *a, int i)
{
    char piece[CU_EXPR + 80];
    snprintf(piece, sizeof piece, fmt, a ? a : "", i);
    size_t l = strlen(piece);
    if (*len + l < cap)
        memcpy(t + *len, piece, l + 1);
    *len += l;
}

/* Whether the rows' loops get the 8-column path, and the row's test of it (z->vtest): every
 * reduction's length a multiple of 8 and the vector operands 16-byte aligned (pointers and each
 * row's offset); the loop writing the row takes it too (z->vec_out) where the output is f32 with
 * a length a multiple of 8 (a row of 1, the statistics of a norm, is written by one thread
 * anyway), its pointer and rows aligned likewise. The vector operands (z->vop) are the f32 ones
 * with a last axis longer than 1 that the program reads other than through a permute. */
static void vec_plan(Fz *z)
{
    const IrNode *n = z->k->node;
    CuGen *gen = z->k->gen;
    char t[sizeof z->vtest] = "1";
    size_t len = 1, cap = sizeof t;
    if (!z->has_reduce || z->mm)
        return;
    IrDim dout = n->shape[n->rank - 1];
    int out = n->dtype == IR_F32 && !last_is_one(n) && !(ir_dim_is_const(dout) && dout.c % 8);
    for (int i = 0; i < z->pg->nnodes; i++) {
        const IrNode *x = z->pg->nodes[i];
        const IrNode *lx = ir_fused_is_reduce(x->op) ? x->in[0] : x == z->steps[z->prog.nsteps - 1] && out ? n : NULL;
        if (lx) {
            IrDim d = lx->shape[lx->rank - 1];
            if (ir_dim_is_const(d) && d.c % 8)
                return; /* decided here: a column at a time */
            if (!ir_dim_is_const(d)) {
                char dim[CU_EXPR];
                cu_dim(gen, d, dim, sizeof dim);
                append(t, cap, &len, " && (%s) %% 8 == 0", dim, 0);
            }
        }
        for (int a = 0; a < x->nin; a++) {
            const IrNode *in = x->in[a];
            int op = operand_of(in);
            if (in->op == IR_INPUT && x->op != IR_PERMUTE && op < IR_MAXIN && n->in[op]->dtype == IR_F32 &&
                !last_is_one(in))
                z->vop[op] = 1;
        }
    }
    append(t, cap, &len, " && ((unsigned long long)(const void *)%s", out ? "out" : "0", 0);
    int any = 0;
    for (int op = 0; op < n->nin && op < IR_MAXIN; op++)
        if (z->vop[op]) {
            any = 1;
            append(t, cap, &len, "%s | (unsigned long long)(const void *)in%d", NULL, op);
        }
    append(t, cap, &len, ") %% 16 == 0 && ((%s", out ? "row * Lout" : "0", 0);
    for (int op = 0; op < n->nin && op < IR_MAXIN; op++)
        if (z->vop[op])
            append(t, cap, &len, "%s | base%d", NULL, op);
    append(t, cap, &len, "%s) & 7) == 0", NULL, 0);
    if (!any || len >= cap)
        return; /* no operand read along the row, or a test too long: a column at a time */
    memcpy(z->vtest, t + 5, strlen(t + 5) + 1); /* without "1 && " */
    z->vec = 1;
    z->vec_out = out;
}

/* The loops over the rows with index type ix, written to z->f. */
static void body(Fz *z, const char *ix)
{
    FILE *f = z->f;
    char lout[32];
    z->ix = ix;
    z->temps = 0;
    if (z->has_reduce) {
        fprintf(f, "    for (%s row = blockIdx.x; row < (%s)rows; row += gridDim.x) {\n", ix, ix);
        row_bases(z, "row", "        ");
        if (z->vec)
            fprintf(f, "        const int vec = %s; /* 8 columns a thread */\n", z->vtest);
        for (int i = 0; i < z->pg->nnodes; i++)
            if (ir_fused_is_reduce(z->pg->nodes[i]->op))
                reduction(z, z->pg->nodes[i]);
        snprintf(lout, sizeof lout, "(%s)Lout", ix);
        col_loop(z, ACC_WRITE, NULL, lout);
        fprintf(f, "    }\n");
        return;
    }
    fprintf(f, "    for (%s e = (%s)blockIdx.x * blockDim.x + threadIdx.x; e < (%s)(rows * Lout);\n", ix, ix, ix);
    fprintf(f, "         e += (%s)gridDim.x * blockDim.x) {\n", ix);
    fprintf(f, "        const %s row = e / (%s)Lout, j = e %% (%s)Lout;\n", ix, ix, ix);
    row_bases(z, "row", "        ");
    fprintf(f, "        {\n");
    new_loop(z, "j", "            ");
    col_stmt(z, ACC_WRITE, NULL);
    fprintf(f, "        }\n    }\n");
}

/* body() one level deeper, into k's text; -1 when out of memory */
static int body_indented(Fz *z, const char *ix)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = z->f, *mem = open_memstream(&buf, &len);
    if (!mem)
        return -1;
    z->f = mem;
    body(z, ix);
    fclose(mem);
    z->f = out;
    if (!buf)
        return -1;
    for (const char *line = buf; *line;) {
        const char *end = strchr(line, '\n');
        size_t l = end ? (size_t)(end - line + 1) : strlen(line);
        fprintf(out, "%s%.*s", l > 1 ? "    " : "", (int)l, line);
        line += l;
    }
    free(buf);
    return 0;
}

int cg_cuda_fused(CuKernel *k)
{
    Fz z;
    if (fz_init(&z, k) < 0) {
        fz_free(&z);
        return -1;
    }
    const IrNode *n = k->node;
    FILE *f = k->f;
    CuGen *gen = k->gen;
    if (z.mm) { /* the matmul's kernel, the rest of the program as its epilogue */
        if (n->dtype != IR_F32) {
            fz_free(&z);
            return cu_error(gen, "fused %%%s: a matmul epilogue ends in f32", label(n));
        }
        int rc = cg_cuda_matmul_with(k, z.mm, operand_of(z.mm->in[0]), operand_of(z.mm->in[1]), z.mm_parts, epilogue, &z);
        fz_free(&z);
        return rc;
    }
    char rows[CU_EXPR], lout[CU_EXPR];
    cu_dims_prod(gen, n->shape, 0, n->rank - 1, rows, sizeof rows);
    cu_dim(gen, n->shape[n->rank - 1], lout, sizeof lout);
    k->sync = z.has_reduce;
    vec_plan(&z);
    cu_kernel_begin(k);
    fprintf(f, "    /* %s */\n", n->s);
    fprintf(f, "    const i64 rows = %s, Lout = %s; /* the output as [rows, Lout] */\n", rows, lout);
    /* 32-bit indices where the output and every operand have few enough elements that an offset
     * plus the grid's size fits (the division of an element index into row and column is a long
     * sequence on the GPU in 64 bits) */
    fprintf(f, "    if (rows * Lout <= 0x3fffffff");
    for (int op = 0; op < n->nin; op++) {
        char size[CU_EXPR], seen[CU_EXPR];
        const IrNode *x = n->in[op];
        int again = 0;
        cu_dims_prod(gen, x->shape, 0, x->rank, size, sizeof size);
        for (int o = 0; o < op && !again; o++) /* an operand of the same size checked already */
            again = strcmp(cu_dims_prod(gen, n->in[o]->shape, 0, n->in[o]->rank, seen, sizeof seen), size) == 0;
        if (!again && (size[strspn(size, "0123456789")] != 0 || atoll(size) > 0x3fffffff)) /* not a small constant */
            fprintf(f, " && %s%s%s <= 0x3fffffff", strchr(size, ' ') ? "(" : "", size, strchr(size, ' ') ? ")" : "");
    }
    fprintf(f, ") {\n");
    if (body_indented(&z, "int") < 0) {
        fz_free(&z);
        return cu_error(gen, "out of memory");
    }
    fprintf(f, "    } else {\n");
    if (body_indented(&z, "i64") < 0) {
        fz_free(&z);
        return cu_error(gen, "out of memory");
    }
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    if (z.has_reduce) {
        cu_geom_rows(k, rows, ROW_BLOCK);
    } else {
        char items[3 * CU_EXPR];
        snprintf(items, sizeof items, "(%s) * (%s)", rows, lout);
        cu_geom_items(k, items, BLOCK);
    }
    int rc = gen->err[0] ? -1 : 0;
    fz_free(&z);
    return rc;
}
