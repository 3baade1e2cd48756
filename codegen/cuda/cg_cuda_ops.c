/* cg_cuda_ops.c: how each op of ops.def becomes a CUDA kernel: the lowering table (one
 * designated-initializer row per op, its length checked against the op table) and the kernels
 * of every op but the reductions (cg_cuda_reduce.c) and matmul (cg_cuda_matmul.c).
 *
 * Elementwise ops, gathers and the computed leaves (const, arange, relpos_bucket) are one thread
 * per output element in a grid-stride loop, with the element's coordinates recovered by division
 * where operands broadcast or move; the copies (permute, slice, expand, concat) index in 32 bits
 * where the sizes allow, move 16-byte vectors along a contiguous last axis, and transpose the last
 * two axes through shared memory (emit_copy). The
 * elementwise semantics follow ir/interp.c exactly where it matters (NaN through max and relu,
 * saturating float-to-int, truncating integer division with a zero divisor reported). */
#include "cg_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 256 /* threads per block of the elementwise kernels */

/* ---- the iteration space of elementwise ops ---- */

/* The element offset of operand k at the output element whose group indices are i0, i1, ... */
static void operand_offset(CuKernel *k, const CgSpace *sp, int op, char *buf, size_t n)
{
    const IrNode *x = k->node, *in = x->in[op];
    int all = 1, none = 1;
    for (int g = 0; g < sp->ngroups; g++) {
        all &= !sp->bcast[op][g];
        none &= sp->bcast[op][g];
    }
    if (all) {
        snprintf(buf, n, sp->ngroups ? "i" : "0");
        return;
    }
    if (none) {
        snprintf(buf, n, "0");
        return;
    }
    size_t len = 0;
    buf[0] = 0;
    for (int g = 0; g < sp->ngroups && len < n; g++) {
        if (sp->bcast[op][g])
            continue;
        int kd = sp->to[g] - 1 - (x->rank - in->rank); /* the group's last dim in the operand */
        char stride[CU_EXPR];
        cu_dims_prod(k->gen, in->shape, kd + 1, in->rank, stride, sizeof stride);
        if (strcmp(stride, "1") == 0)
            len += (size_t)snprintf(buf + len, n - len, "%si%d", len ? " + " : "", g);
        else if (strchr(stride, ' '))
            len += (size_t)snprintf(buf + len, n - len, "%si%d * (%s)", len ? " + " : "", g, stride);
        else
            len += (size_t)snprintf(buf + len, n - len, "%si%d * %s", len ? " + " : "", g, stride);
    }
}

void cg_cuda_expand(const char *tmpl, IrDType t, const char *const *args, char *buf, size_t n)
{
    size_t len = 0;
    for (const char *p = tmpl; *p && len + 8 < n; p++) {
        if (p[0] == '$' && p[1] >= '0' && p[1] <= '2') {
            len += (size_t)snprintf(buf + len, n - len, "%s", args[p[1] - '0']);
            p++;
        } else if (p[0] == '$' && p[1] == 't') {
            len += (size_t)snprintf(buf + len, n - len, "%s", t == IR_I64 ? "i64" : "i32");
            p++;
        } else {
            buf[len++] = *p;
        }
    }
    buf[len] = 0;
}

/* The CAST rules of the interpreter: toward zero and saturating from float, != 0 to bool. */
static const char *cast_template(IrDType from, IrDType to)
{
    if (from == to)
        return "$0";
    switch (to) {
    case IR_F32: return "(float)$0";
    case IR_BOOL: return from == IR_F32 ? "$0 != 0.0f" : "$0 != 0";
    case IR_I32: return from == IR_F32 ? "xtc_f2i32($0)" : "(int)$0";
    default: return from == IR_F32 ? "xtc_f2i64($0)" : "(i64)$0";
    }
}

const char *cg_cuda_scalar(const IrNode *x)
{
    const CuLower *L = cg_cuda_lowering(x->op);
    IrDType t = x->in[x->op == IR_WHERE ? 1 : 0]->dtype;
    if (!L || L->emit != cg_cuda_elementwise)
        return NULL;
    return x->op == IR_CAST ? cast_template(x->in[0]->dtype, x->dtype) : t == IR_F32 ? L->f32 : L->ints;
}

int cg_cuda_elementwise(CuKernel *k)
{
    const IrNode *x = k->node;
    IrDType t = x->in[x->op == IR_WHERE ? 1 : 0]->dtype;
    const char *tmpl = cg_cuda_scalar(x);
    if (!tmpl)
        return cu_error(k->gen, "the cuda backend has no %s form of op '%s'", ir_dtype_name(t), ir_ops[x->op].name);
    FILE *f = k->f;
    CgSpace sp;
    cg_space_of(x, &sp);
    char total[CU_EXPR], size[CU_EXPR], expr[1024];
    cu_dims_prod(k->gen, x->shape, 0, x->rank, total, sizeof total);
    cu_kernel_begin(k);
    fprintf(f, "    const i64 total = %s;\n", total);
    for (int g = 1; g < sp.ngroups; g++)
        fprintf(f, "    const i64 size%d = %s;\n", g,
                cu_dims_prod(k->gen, x->shape, sp.from[g], sp.to[g], size, sizeof size));
    fprintf(f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    int need_index = 0;
    for (int op = 0; op < x->nin; op++) {
        char off[1024];
        operand_offset(k, &sp, op, off, sizeof off);
        need_index |= strcmp(off, "i") && strcmp(off, "0");
    }
    if (need_index && sp.ngroups == 2) {
        fprintf(f, "        const i64 i1 = i %% size1, i0 = i / size1;\n");
    } else if (need_index) {
        fprintf(f, "        i64 rest = i;\n");
        for (int g = sp.ngroups - 1; g >= 1; g--)
            fprintf(f, "        const i64 i%d = rest %% size%d;\n        rest /= size%d;\n", g, g, g);
        fprintf(f, "        const i64 i0 = rest;\n");
    }
    for (int op = 0; op < x->nin; op++) {
        char off[1024], ptr[16], load[1100];
        operand_offset(k, &sp, op, off, sizeof off);
        snprintf(ptr, sizeof ptr, "in%d", op);
        fprintf(f, "        const %s x%d = %s;\n", cu_val_type(x->in[op]->dtype), op,
                cu_load(x->in[op], ptr, off, load, sizeof load));
    }
    static const char *const xs[] = {"x0", "x1", "x2"};
    cg_cuda_expand(tmpl, t, xs, expr, sizeof expr);
    char value[1100], store[1200];
    snprintf(value, sizeof value, x->dtype == IR_BOOL ? "(u8)(%s)" : "%s", expr);
    fprintf(f, "        %s;\n", cu_store(x, "out", "i", value, store, sizeof store));
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* ---- leaves computed by kernels ---- */

static int emit_const(CuKernel *k)
{
    const IrNode *x = k->node;
    char total[CU_EXPR], value[64];
    cu_dims_prod(k->gen, x->shape, 0, x->rank, total, sizeof total);
    switch (x->dtype) {
    case IR_F32: cu_float(x->f, value, sizeof value); break;
    case IR_BOOL: snprintf(value, sizeof value, "%d", x->f != 0); break;
    case IR_I32: snprintf(value, sizeof value, "%lld", (long long)trunc(x->f)); break;
    default: snprintf(value, sizeof value, "%lldLL", (long long)trunc(x->f)); break;
    }
    char store[128];
    cu_kernel_begin(k);
    fprintf(k->f, "    const i64 total = %s;\n", total);
    fprintf(k->f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size())\n");
    fprintf(k->f, "        %s;\n", cu_store(x, "out", "i", value, store, sizeof store));
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

static int emit_arange(CuKernel *k)
{
    const IrNode *x = k->node;
    char total[CU_EXPR], start[CU_EXPR];
    cu_dims_prod(k->gen, x->shape, 0, x->rank, total, sizeof total);
    cu_dim(k->gen, x->d, start, sizeof start);
    cu_kernel_begin(k);
    fprintf(k->f, "    const i64 total = %s, start = %s;\n", total, start);
    fprintf(k->f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size())\n");
    char value[64], store[128];
    snprintf(value, sizeof value, "(%s)(start + i)", cu_val_type(x->dtype));
    fprintf(k->f, "        %s;\n", cu_store(x, "out", "i", value, store, sizeof store));
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* rand_like: ir/interp.c's rand_at, bit for bit (splitmix64's i+1-th output, top 24 bits) */
static int emit_rand(CuKernel *k)
{
    const IrNode *x = k->node;
    char total[CU_EXPR];
    cu_dims_prod(k->gen, x->shape, 0, x->rank, total, sizeof total);
    cu_kernel_begin(k);
    fprintf(k->f, "    const i64 total = %s;\n", total);
    fprintf(k->f, "    const unsigned long long base = (unsigned long long)(i64)in0[0] * 0xd1b54a32d192ed03ull + "
                  "%lluull;\n", (unsigned long long)((uint64_t)x->ia[IR_IA_STREAM] * 0xabc98388fb8fac03ull));
    fprintf(k->f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    fprintf(k->f, "        unsigned long long z = base + (unsigned long long)(i + 1) * 0x9e3779b97f4a7c15ull;\n");
    fprintf(k->f, "        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;\n");
    fprintf(k->f, "        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;\n");
    fprintf(k->f, "        z ^= z >> 31;\n");
    fprintf(k->f, "        xtc_st(out, i, (float)(z >> 40) * 5.9604644775390625e-8f);\n    }\n");
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* The T5 bucket of distance d >= max_exact as ir/interp.c computes it (float32 logs, truncated):
 * the bucket without the direction offset, or -1 where the formula gives NaN (an error). */
static int64_t relpos_large(int64_t d, int64_t nb, int64_t max_exact, int64_t max_distance)
{
    float den = (float)log((double)max_distance / (double)max_exact);
    float r = logf((float)d / (float)max_exact) / den * (float)(nb - max_exact);
    if (isnan(r))
        return -1;
    if (r > 1e18f)
        r = 1e18f;
    if (r < -1e18f)
        r = -1e18f;
    int64_t large = max_exact + (int64_t)r;
    return large < nb - 1 ? large : nb - 1;
}

/* relpos_bucket [I, J]: the bucket of key j relative to query i. The logarithm of the interpreter
 * is evaluated here, at compile time: the kernel compares the distance with the smallest
 * distance of each bucket, so GPU and CPU give the same buckets to the last one. */
static int emit_relpos(CuKernel *k)
{
    const IrNode *x = k->node;
    int64_t nb = x->ia[IR_IA_BUCKETS], max_distance = x->ia[IR_IA_MAX_DISTANCE];
    int causal = x->ia[IR_IA_REL_CAUSAL] != 0;
    if (!causal)
        nb /= 2;
    int64_t max_exact = nb / 2;
    char rows[CU_EXPR], cols[CU_EXPR], total[CU_EXPR];
    cu_dim(k->gen, x->shape[0], rows, sizeof rows);
    cu_dim(k->gen, x->shape[1], cols, sizeof cols);
    cu_dims_prod(k->gen, x->shape, 0, 2, total, sizeof total);
    FILE *f = k->f;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 rows = %s, cols = %s, total = %s;\n", rows, cols, total);
    if (max_exact == 0) { /* log(d / 0): undefined for every distance, as the interpreter says */
        fprintf(f, "    (void)rows;\n    (void)cols;\n");
        fprintf(f, "    if (total > 0 && xtc_global_id() == 0)\n        *status = 1;\n");
        cu_kernel_end(k);
        cu_geom_items(k, total, BLOCK);
        return 0;
    }
    /* th[q]: the smallest distance whose bucket is max_exact + q + 1 or more (binary search: the
     * bucket grows with the distance) */
    int64_t th[64];
    int nth = 0;
    int nan_at_exact = relpos_large(max_exact, nb, max_exact, max_distance) < 0;
    int64_t limit = max_distance + 2 > ((int64_t)1 << 40) ? ((int64_t)1 << 40) : max_distance + 2;
    for (int64_t v = max_exact + 1; v < nb && nth < 64; v++) {
        int64_t lo = max_exact, hi = limit + 1; /* bucket(hi) >= v is assumed: saturated */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            int64_t b = relpos_large(mid, nb, max_exact, max_distance);
            if (b >= v)
                hi = mid;
            else
                lo = mid + 1;
        }
        th[nth++] = lo;
    }
    (void)rows;
    if (nth) {
        fprintf(f, "    const i64 th[%d] = {", nth);
        for (int q = 0; q < nth; q++)
            fprintf(f, "%s%lld", q ? ", " : "", (long long)th[q]);
        fprintf(f, "};\n");
    }
    fprintf(f, "    for (i64 e = xtc_global_id(); e < total; e += xtc_global_size()) {\n");
    fprintf(f, "        i64 dist = e / cols - e %% cols, bucket = 0; /* query - key */\n");
    if (causal)
        fprintf(f, "        if (dist < 0)\n            dist = 0;\n");
    else
        fprintf(f, "        if (dist < 0) {\n            bucket = %lld;\n            dist = -dist;\n        }\n", (long long)nb);
    fprintf(f, "        if (dist < %lld) {\n            bucket += dist;\n        } else {\n", (long long)max_exact);
    if (nan_at_exact)
        fprintf(f, "            if (dist == %lld)\n                *status = 1;\n", (long long)max_exact);
    fprintf(f, "            i64 large = %lld;\n", (long long)max_exact);
    if (nth)
        fprintf(f, "            for (int r = 0; r < %d; r++)\n                large += dist >= th[r];\n", nth);
    fprintf(f, "            bucket += large < %lld ? large : %lld;\n        }\n", (long long)(nb - 1), (long long)(nb - 1));
    fprintf(f, "        out[e] = bucket;\n    }\n");
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* ---- copies: permute, slice, expand ---- */

/* Whether expression e (a dim expression of cu_dim / cu_dims_prod) is a multiple of v: 1 when
 * known so, 0 when known not, 2 when it depends on the symbols. */
static int known_multiple(const char *e, long long v)
{
    char *end;
    long long c = strtoll(e, &end, 10);
    if (*e && !*end)
        return c % v == 0;
    /* a product ending in a constant ("b * n * 64"): a multiple of it */
    int depth = 0;
    for (const char *p = e; *p; p++) {
        depth += (*p == '(') - (*p == ')');
        if (depth == 0 && (*p == '+' || *p == '-' || *p == '/' || *p == '%'))
            return 2;
    }
    const char *star = strrchr(e, '*');
    if (star && star[1] == ' ' && (c = strtoll(star + 2, &end, 10)) > 0 && !*end && c % v == 0)
        return 1;
    return 2;
}

/* The bytes of one element of storage type t ("xtc_fs", "float", ...: cu_mem_type). */
static int mem_bytes(const CuGen *gen, const char *t)
{
    if (!strcmp(t, "xtc_fs"))
        return gen->storage ? 2 : 4;
    return !strcmp(t, "i64") ? 8 : !strcmp(t, "u8") ? 1 : 4;
}

/* stride[d]: the operand's element stride along output dim d ("0" where expand broadcasts it);
 * base: the operand's offset of the first element (a slice's start). */
static void copy_strides(CuKernel *k, char (*stride)[CU_EXPR], char *base, size_t nbase)
{
    const IrNode *x = k->node, *in = x->in[0];
    snprintf(base, nbase, "0");
    for (int d = 0; d < x->rank; d++) {
        int src = x->op == IR_PERMUTE ? x->perm[d] : d;
        if (x->op == IR_EXPAND) {
            src = d - (x->rank - in->rank);
            if (cg_operand_bcast(x, in, d)) {
                snprintf(stride[d], CU_EXPR, "0");
                continue;
            }
        }
        cu_dims_prod(k->gen, in->shape, src + 1, in->rank, stride[d], CU_EXPR);
    }
    if (x->op == IR_SLICE) {
        char start[CU_EXPR], st[CU_EXPR];
        cu_dim(k->gen, x->d, start, sizeof start);
        cu_dims_prod(k->gen, in->shape, (int)x->ia[IR_IA_AXIS] + 1, in->rank, st, sizeof st);
        if (strcmp(start, "0") && strcmp(st, "1"))
            snprintf(base, nbase, "(%s) * (%s)", start, st);
        else if (strcmp(start, "0"))
            snprintf(base, nbase, "%s", start);
    }
}

/* One grid-stride loop of a copy at indent ind, its index arithmetic in type ity ("unsigned"
 * where the run-time test before it found that the element counts fit in 31 bits, else "i64"):
 * each item is v elements, a 16-byte vector where v > 1 (the last axis contiguous in both, every
 * offset a multiple of v: tested before), or one element. The sizes and strides are hoisted out
 * of the loop, so the per-item divisions are by loop constants, by multiply and shift where
 * they are constants of the kernel. */
static void copy_loop(CuKernel *k, const char *ity, int v, char (*stride)[CU_EXPR], const char *base, const char *ind)
{
    const IrNode *x = k->node, *in = x->in[0];
    FILE *f = k->f;
    /* first: the outermost dim longer than 1 (the index left there needs no modulo); top: the
     * outermost that moves through the operand (those above it, broadcast, need no index) */
    int r = x->rank, first = 0, top;
    while (first < r && ir_dim_is_one(x->shape[first]))
        first++;
    for (top = first; top < r && (ir_dim_is_one(x->shape[top]) || !strcmp(stride[top], "0"));)
        top++;
    fprintf(f, "%s{\n", ind);
    fprintf(f, "%s    const %s items = (%s)(total / %d), base = (%s)(%s);\n", ind, ity, ity, v, ity, base);
    for (int d = r - 1; d >= top; d--) {
        if (ir_dim_is_one(x->shape[d]))
            continue;
        char size[CU_EXPR];
        cu_dim(k->gen, x->shape[d], size, sizeof size);
        if (d > first && d == r - 1 && v > 1)
            fprintf(f, "%s    const %s size%d = (%s)((%s) / %d);\n", ind, ity, d, ity, size, v);
        else if (d > first)
            fprintf(f, "%s    const %s size%d = (%s)(%s);\n", ind, ity, d, ity, size);
        if (strcmp(stride[d], "0") && strcmp(stride[d], "1"))
            fprintf(f, "%s    const %s stride%d = (%s)(%s);\n", ind, ity, d, ity, stride[d]);
    }
    fprintf(f, "%s    for (%s i = (%s)xtc_global_id(); i < items; i += (%s)xtc_global_size()) {\n", ind, ity, ity, ity);
    fprintf(f, "%s        %s rest = i, src = base;\n", ind, ity);
    if (top >= r)
        fprintf(f, "%s        (void)rest;\n", ind);
    for (int d = r - 1; d >= top; d--) {
        if (ir_dim_is_one(x->shape[d]))
            continue;
        char mul[CU_EXPR + 8] = "";
        if (d == r - 1 && v > 1)
            snprintf(mul, sizeof mul, " * %du", v);
        else if (strcmp(stride[d], "1"))
            snprintf(mul, sizeof mul, " * stride%d", d);
        int zero = !strcmp(stride[d], "0");
        if (d == first)
            fprintf(f, "%s        src += rest%s;\n", ind, mul);
        else if (d == top)
            fprintf(f, "%s        src += rest %% size%d%s;\n", ind, d, mul);
        else if (!zero)
            fprintf(f, "%s        src += rest %% size%d%s;\n", ind, d, mul);
        if (d > top)
            fprintf(f, "%s        rest /= size%d;\n", ind, d);
    }
    if (v > 1) {
        fprintf(f, "%s        xtc_cp16(out + i * %du, in0 + src);\n", ind, v);
    } else {
        char load[64], store[128];
        fprintf(f, "%s        %s;\n", ind, cu_store(x, "out", "i", cu_load(in, "in0", "src", load, sizeof load), store, sizeof store));
    }
    fprintf(f, "%s    }\n%s}\n", ind, ind);
}

/* A permute swapping the last two axes ([.., R, C] -> [.., C, R], the leading axes kept), both
 * longer than 1: through a 32 x 33 tile of shared memory, so that the loads run along the
 * input's rows and the stores along the output's (a block of 256 threads per tile, grid-stride
 * over the tiles; the divisions once per tile). */
static int is_inner_transpose(const IrNode *x)
{
    int r = x->rank;
    if (x->op != IR_PERMUTE || r < 2 || x->perm[r - 2] != r - 1 || x->perm[r - 1] != r - 2)
        return 0;
    for (int d = 0; d < r - 2; d++)
        if (x->perm[d] != d)
            return 0;
    return !ir_dim_is_one(x->shape[r - 1]) && !ir_dim_is_one(x->shape[r - 2]);
}

static int emit_transpose(CuKernel *k)
{
    const IrNode *x = k->node, *in = x->in[0];
    FILE *f = k->f;
    int r = x->rank;
    char batch[CU_EXPR], rows[CU_EXPR], cols[CU_EXPR], load[96], store[192];
    cu_dims_prod(k->gen, x->shape, 0, r - 2, batch, sizeof batch);
    cu_dim(k->gen, in->shape[r - 2], rows, sizeof rows);
    cu_dim(k->gen, in->shape[r - 1], cols, sizeof cols);
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    /* tiled transpose: in [batch, R, C] -> out [batch, C, R] */\n");
    fprintf(f, "    const i64 batch = %s, R = %s, C = %s;\n", batch, rows, cols);
    fprintf(f, "    const i64 tr = (R + 31) / 32, tc = (C + 31) / 32, tiles = batch * tr * tc;\n");
    fprintf(f, "    __shared__ %s tile[32][33];\n", cu_val_type(x->dtype));
    fprintf(f, "    const int tx = (int)(threadIdx.x & 31u), ty = (int)(threadIdx.x >> 5);\n");
    fprintf(f, "    for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) {\n");
    fprintf(f, "        const i64 c0 = t %% tc * 32, r0 = t / tc %% tr * 32, plane = t / tc / tr * R * C;\n");
    fprintf(f, "        for (int j = ty; j < 32; j += 8)\n");
    fprintf(f, "            if (r0 + j < R && c0 + tx < C)\n");
    fprintf(f, "                tile[j][tx] = %s;\n", cu_load(in, "in0", "plane + (r0 + j) * C + c0 + tx", load, sizeof load));
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        for (int j = ty; j < 32; j += 8)\n");
    fprintf(f, "            if (c0 + j < C && r0 + tx < R)\n");
    fprintf(f, "                %s;\n", cu_store(x, "out", "plane + (c0 + j) * R + r0 + tx", "tile[tx][j]", store, sizeof store));
    fprintf(f, "        __syncthreads(); /* the tile is read before the next is written */\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char tiles[6 * CU_EXPR], tr[2 * CU_EXPR], tc[2 * CU_EXPR];
    char rr[CU_EXPR + 8], cc[CU_EXPR + 8];
    snprintf(rr, sizeof rr, "(%s)", rows);
    snprintf(cc, sizeof cc, "(%s)", cols);
    cu_ceil_div(rr, 32, tr, sizeof tr);
    cu_ceil_div(cc, 32, tc, sizeof tc);
    snprintf(tiles, sizeof tiles, "(%s) * (%s) * (%s)", batch, tr, tc);
    cu_geom_rows(k, tiles, 256);
    return 0;
}

/* permute, slice, expand: out[i] = in0[src(i)]. The index arithmetic is in 32 bits where the
 * element counts of both fit in 31 bits (tested at run time unless they are constants; the
 * 64-bit loop otherwise), the sizes hoisted. Where the last axis is contiguous in the operand
 * (a permute keeping it, a slice of another axis, an expand not broadcasting it), the storage
 * types are the same and every offset of a row is a multiple of 16 bytes (the runtime's buffers
 * are 64-byte aligned; the pointers are tested too), each item is a 16-byte vector (xtc_cp16):
 * the divisions once per vector rather than per element. A transpose of the last two axes goes
 * through shared memory (emit_transpose). */
static int emit_copy(CuKernel *k)
{
    const IrNode *x = k->node, *in = x->in[0];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    if (is_inner_transpose(x))
        return emit_transpose(k);
    int r = x->rank;
    char total[CU_EXPR], in_total[CU_EXPR], base[3 * CU_EXPR], stride[IR_MAXRANK][CU_EXPR];
    cu_dims_prod(gen, x->shape, 0, r, total, sizeof total);
    cu_dims_prod(gen, in->shape, 0, in->rank, in_total, sizeof in_total);
    copy_strides(k, stride, base, sizeof base);
    /* the vector path: its run-time condition (cond), or none (v = 1) */
    int v = 16 / mem_bytes(gen, cu_mem_type(x));
    char cond[8 * CU_EXPR] = "", last[CU_EXPR] = "1";
    if (r > 0)
        cu_dim(gen, x->shape[r - 1], last, sizeof last);
    if (r == 0 || ir_dim_is_one(x->shape[r - 1]) || strcmp(stride[r - 1], "1") ||
        strcmp(cu_mem_type(x), cu_mem_type(in)) || known_multiple(last, v) == 0 || known_multiple(base, v) == 0)
        v = 1;
    for (int d = 0; d < r - 1 && v > 1; d++)
        if (!ir_dim_is_one(x->shape[d]) && known_multiple(stride[d], v) == 0)
            v = 1;
    if (v > 1) {
        size_t len = (size_t)snprintf(cond, sizeof cond, "((unsigned long long)(const void *)out | "
                                                         "(unsigned long long)(const void *)in0) %% 16 == 0");
        const char *terms[IR_MAXRANK + 2];
        int nt = 0;
        terms[nt++] = last;
        terms[nt++] = base;
        for (int d = 0; d < r - 1; d++)
            if (!ir_dim_is_one(x->shape[d]))
                terms[nt++] = stride[d];
        for (int t = 0; t < nt && len < sizeof cond; t++)
            if (known_multiple(terms[t], v) == 2)
                len += (size_t)snprintf(cond + len, sizeof cond - len, " && (%s) %% %d == 0", terms[t], v);
    }
    /* the 32-bit loops: always, never, or by a run-time test */
    char *end;
    long long ct = strtoll(total, &end, 10), ci = *end ? -1 : strtoll(in_total, &end, 10);
    int fits = *end || ct < 0 || ci < 0 ? 2 : ct <= 0x7fffffff && ci <= 0x7fffffff;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 total = %s;\n", total);
    const char *ind = "    ";
    if (fits == 2) {
        if (strcmp(in_total, total))
            fprintf(f, "    if (total <= 0x7fffffff && (i64)(%s) <= 0x7fffffff) {\n", in_total);
        else
            fprintf(f, "    if (total <= 0x7fffffff) {\n");
        ind = "        ";
    }
    if (fits) {
        if (v > 1) {
            fprintf(f, "%sif (%s)\n", ind, cond);
            copy_loop(k, "unsigned", v, stride, base, ind);
            fprintf(f, "%selse\n", ind);
        }
        copy_loop(k, "unsigned", 1, stride, base, ind);
    }
    if (fits == 2)
        fprintf(f, "    } else {\n");
    if (fits != 1)
        copy_loop(k, "i64", 1, stride, base, ind);
    if (fits == 2)
        fprintf(f, "    }\n");
    cu_kernel_end(k);
    char items[CU_EXPR + 16];
    if (v > 1 && known_multiple(last, v) == 1)
        snprintf(items, sizeof items, "(%s) / %d", total, v);
    else
        snprintf(items, sizeof items, "%s", total);
    cu_geom_items(k, items, BLOCK);
    return 0;
}

static void concat_loop(CuKernel *k, const char *ity, const char *ind)
{
    const IrNode *x = k->node;
    FILE *f = k->f;
    fprintf(f, "%sfor (%s i = (%s)(first + xtc_global_id()); i < (%s)total; i += (%s)xtc_global_size()) {\n", ind, ity,
            ity, ity, ity);
    fprintf(f, "%s    const %s r = i %% (%s)inner, q = i / (%s)inner, j = q %% (%s)(la + lb), o = q / (%s)(la + lb);\n",
            ind, ity, ity, ity, ity, ity);
    char la_load[96], lb_load[96], value[220], store[320], a[64], b[64];
    snprintf(a, sizeof a, "(o * (%s)la + j) * (%s)inner + r", ity, ity);
    snprintf(b, sizeof b, "(o * (%s)lb + j - (%s)la) * (%s)inner + r", ity, ity, ity);
    cu_load(x->in[0], "in0", a, la_load, sizeof la_load);
    cu_load(x->in[1], "in1", b, lb_load, sizeof lb_load);
    snprintf(value, sizeof value, "j < (%s)la ? %s : %s", ity, la_load, lb_load);
    fprintf(f, "%s    %s;\n", ind, cu_store(x, "out", "i", value, store, sizeof store));
    fprintf(f, "%s}\n", ind);
}

/* concat: out[outer, la + lb, inner] from a[outer, la, inner] and b[outer, lb, inner], its index
 * arithmetic in 32 bits where the output's count fits in 31 bits (the operands' are smaller).
 * With outer 1 and out the memory of a (a KV cache appended in place: the runtime places the
 * output there, RtDeviceRun.place), a is already where it belongs and only b is written. */
static int emit_concat(CuKernel *k)
{
    const IrNode *x = k->node;
    CuGen *gen = k->gen;
    int axis = (int)x->ia[IR_IA_AXIS];
    char outer[CU_EXPR], inner[CU_EXPR], la[CU_EXPR], lb[CU_EXPR];
    cu_dims_prod(gen, x->shape, 0, axis, outer, sizeof outer);
    cu_dims_prod(gen, x->shape, axis + 1, x->rank, inner, sizeof inner);
    cu_dim(gen, x->in[0]->shape[axis], la, sizeof la);
    cu_dim(gen, x->in[1]->shape[axis], lb, sizeof lb);
    FILE *f = k->f;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 outer = %s, inner = %s, la = %s, lb = %s;\n", outer, inner, la, lb);
    fprintf(f, "    const i64 total = outer * (la + lb) * inner;\n");
    fprintf(f, "    const i64 first = outer == 1 && (const void *)out == (const void *)in0 ? la * inner : 0;\n");
    fprintf(f, "    if (total <= 0x7fffffff) {\n");
    concat_loop(k, "unsigned", "        ");
    fprintf(f, "    } else {\n");
    concat_loop(k, "i64", "        ");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char total[5 * CU_EXPR];
    snprintf(total, sizeof total, "%s%s%s * (%s + %s) * %s%s%s", strchr(outer, ' ') ? "(" : "", outer,
             strchr(outer, ' ') ? ")" : "", la, lb, strchr(inner, ' ') ? "(" : "", inner, strchr(inner, ' ') ? ")" : "");
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* ---- gather and its gradient ---- */

/* gather: out[..., D] = table[idx[...], :]; an index outside [0, V) sets the status */
static int emit_gather(CuKernel *k)
{
    const IrNode *x = k->node, *table = x->in[0], *idx = x->in[1];
    char rows[CU_EXPR], cols[CU_EXPR], total[CU_EXPR];
    cu_dim(k->gen, table->shape[0], rows, sizeof rows);
    cu_dim(k->gen, table->shape[1], cols, sizeof cols);
    cu_dims_prod(k->gen, x->shape, 0, x->rank, total, sizeof total);
    (void)idx;
    FILE *f = k->f;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 rows = %s, cols = %s, total = %s;\n", rows, cols, total);
    fprintf(f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    fprintf(f, "        const i64 row = (i64)in1[i / cols];\n");
    char zero[64], load[64], copy[128];
    cu_store(x, "out", "i", "0", zero, sizeof zero);
    cu_store(x, "out", "i", cu_load(table, "in0", "row * cols + i % cols", load, sizeof load), copy, sizeof copy);
    fprintf(f, "        if (row < 0 || row >= rows) {\n            *status = 1;\n            %s;\n", zero);
    fprintf(f, "        } else {\n            %s;\n        }\n    }\n", copy);
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    return 0;
}

/* gather_grad: out[rows, D] = 0, then out[idx[e], :] += src[e, :]. The host clears the output
 * before the launch; the rows are added with atomics. */
static int emit_gather_grad(CuKernel *k)
{
    const IrNode *x = k->node, *src = x->in[0];
    char rows[CU_EXPR], cols[CU_EXPR], total[CU_EXPR], out_numel[CU_EXPR];
    cu_dim(k->gen, x->shape[0], rows, sizeof rows);
    cu_dim(k->gen, x->shape[1], cols, sizeof cols);
    cu_dims_prod(k->gen, src->shape, 0, src->rank, total, sizeof total);
    cu_dims_prod(k->gen, x->shape, 0, x->rank, out_numel, sizeof out_numel);
    FILE *f = k->f;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 rows = %s, cols = %s, total = %s;\n", rows, cols, total);
    fprintf(f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    fprintf(f, "        const i64 row = (i64)in1[i / cols];\n");
    fprintf(f, "        if (row < 0 || row >= rows)\n            *status = 1;\n");
    /* out is f32 whatever the storage (cg_keeps_f32): the atomics add in f32 */
    fprintf(f, "        else\n            atomicAdd(&out[row * cols + i %% cols], xtc_ld(in0, i));\n    }\n");
    cu_kernel_end(k);
    cu_geom_items(k, total, BLOCK);
    snprintf(k->geom.zero, sizeof k->geom.zero, "%s%s%s * 4", strchr(out_numel, ' ') ? "(" : "", out_numel,
             strchr(out_numel, ' ') ? ")" : "");
    return 0;
}

/* ---- the table ---- */

#define ELEM(f32, ints) {cg_cuda_elementwise, f32, ints}

static const CuLower lowering[] = {
    /* leaves: inputs, parameters and buffers are bound by the runtime, not computed */
    [IR_INPUT] = {0, 0, 0},
    [IR_PARAM] = {0, 0, 0},
    [IR_BUFFER] = {0, 0, 0},
    [IR_CONST] = {emit_const, 0, 0},
    [IR_ARANGE] = {emit_arange, 0, 0},
    [IR_RELPOS] = {emit_relpos, 0, 0},

    [IR_NEG] = ELEM("-$0", 0),
    [IR_EXP] = ELEM("expf($0)", 0),
    [IR_LOG] = ELEM("logf($0)", 0),
    [IR_SQRT] = ELEM("sqrtf($0)", 0),
    [IR_RSQRT] = ELEM("rsqrtf($0)", 0),
    [IR_RECIP] = ELEM("1.0f / $0", 0),
    [IR_TANH] = ELEM("tanhf($0)", 0),
    [IR_SIGMOID] = ELEM("1.0f / (1.0f + expf(-$0))", 0),
    [IR_GELU] = ELEM("0.5f * $0 * (1.0f + erff($0 * 0.707106781f))", 0),
    [IR_ERF] = ELEM("erff($0)", 0),
    [IR_RELU] = ELEM("$0 > 0.0f ? $0 : 0.0f * $0", 0), /* 0 * x keeps NaN */
    [IR_SIN] = ELEM("sinf($0)", 0),
    [IR_COS] = ELEM("cosf($0)", 0),
    [IR_ABS] = ELEM("fabsf($0)", 0),
    [IR_NOT] = ELEM(0, "!$0"),
    [IR_CAST] = ELEM("$0", "$0"), /* the template comes from cast_template() */

    [IR_ADD] = ELEM("$0 + $1", "$0 + $1"),
    [IR_SUB] = ELEM("$0 - $1", "$0 - $1"),
    [IR_MUL] = ELEM("$0 * $1", "$0 * $1"),
    [IR_DIV] = ELEM("$0 / $1", "xtc_div_$t($0, $1, status)"),
    [IR_MAX] = ELEM("xtc_fmax($0, $1)", "$0 > $1 ? $0 : $1"),
    [IR_MIN] = ELEM("xtc_fmin($0, $1)", "$0 < $1 ? $0 : $1"),
    [IR_LT] = ELEM("$0 < $1", "$0 < $1"),
    [IR_LE] = ELEM("$0 <= $1", "$0 <= $1"),
    [IR_EQ] = ELEM("$0 == $1", "$0 == $1"),
    [IR_AND] = ELEM(0, "$0 && $1"),
    [IR_OR] = ELEM(0, "$0 || $1"),
    [IR_WHERE] = ELEM("$0 ? $1 : $2", "$0 ? $1 : $2"),

    [IR_SUM] = {cg_cuda_reduce, 0, 0},
    [IR_RMAX] = {cg_cuda_reduce, 0, 0},
    [IR_SOFTMAX] = {cg_cuda_softmax, 0, 0},
    [IR_ENTMAX15] = {cg_cuda_entmax15, 0, 0},     /* cg_cuda_sort.c */
    [IR_KTH_LARGEST] = {cg_cuda_kth_largest, 0, 0},

    /* RESHAPE aliases its operand's buffer (cg_plan.c) and never reaches the backend */
    [IR_RESHAPE] = {0, 0, 0},
    [IR_PERMUTE] = {emit_copy, 0, 0},
    [IR_SLICE] = {emit_copy, 0, 0},
    [IR_CONCAT] = {emit_concat, 0, 0},
    [IR_EXPAND] = {emit_copy, 0, 0},
    [IR_GATHER] = {emit_gather, 0, 0},
    [IR_GATHER_GRAD] = {emit_gather_grad, 0, 0},

    [IR_MATMUL] = {cg_cuda_matmul, 0, 0},

    [IR_XENT] = {cg_cuda_xent, 0, 0},

    [IR_RAND] = {emit_rand, 0, 0},

    /* fused ops (passes/) */
    [IR_ATTENTION] = {cg_cuda_attention, 0, 0},          /* cg_cuda_attention.c */
    [IR_ATTENTION_GRAD] = {cg_cuda_attention_grad, 0, 0},
    [IR_FUSED] = {cg_cuda_fused, 0, 0}, /* cg_cuda_fused.c */
};
_Static_assert(sizeof lowering / sizeof lowering[0] == IR_NUM_OPS,
               "codegen/cuda/cg_cuda_ops.c: the lowering table needs a row for every op of ops.def");

const CuLower *cg_cuda_lowering(IrOp op)
{
    if ((unsigned)op >= IR_NUM_OPS)
        return NULL;
    const CuLower *L = &lowering[op];
    int is_leaf_or_view = op == IR_INPUT || op == IR_PARAM || op == IR_BUFFER || op == IR_RESHAPE;
    if (!L->emit && !is_leaf_or_view)
        return NULL;
    return L;
}
