/* cg_cuda_reduce.c: the kernels that reduce: sum and max over one axis, softmax over the last
 * axis, and the cross-entropy loss.
 *
 *   - a reduction over contiguous memory (the axis is the last non-unit one) and softmax: one
 *     block of ROW_BLOCK threads per row (rows in a grid-stride loop), each thread striding over
 *     the row, then xtc_block_sum / xtc_block_max (warp shuffles, then the warps' results
 *     through shared memory; see the prelude in cg_cuda_gen.c);
 *   - a reduction over an outer axis: one thread per output element looping down the axis,
 *     so that neighbouring threads read neighbouring memory;
 *   - cross-entropy: one block; each warp takes rows, reduces max and sum of exp across its
 *     lanes, and the warps' totals are added in a fixed order: the loss is deterministic.
 *
 * Like ir/interp.c: NaN propagates through max, a max over an empty axis is an error (status),
 * a sum over an empty axis is 0, targets < 0 are ignored and a target >= the number of classes
 * is an error. */
#include "cg_cuda.h"

#include <string.h>

#define ROW_BLOCK 128 /* threads per row: a multiple of 32 */
#define COL_BLOCK 256
#define XENT_BLOCK 256

static const char *paren_open(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *paren_close(const char *e) { return strchr(e, ' ') ? ")" : ""; }

int cg_cuda_reduce(CuKernel *k)
{
    const IrNode *x = k->node, *in = x->in[0];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    int axis = (int)x->ia[0], is_max = x->op == IR_RMAX;
    char outer[CU_EXPR], len[CU_EXPR], inner[CU_EXPR];
    cu_dims_prod(gen, in->shape, 0, axis, outer, sizeof outer);
    cu_dim(gen, in->shape[axis], len, sizeof len);
    cu_dims_prod(gen, in->shape, axis + 1, in->rank, inner, sizeof inner);
    const char *init = is_max ? "-XTC_INF" : "0.0f";
    if (cg_dims_are_one(in->shape, axis + 1, in->rank)) {
        /* rows of contiguous memory: a block per row */
        k->sync = 1;
        cu_kernel_begin(k);
        fprintf(f, "    const i64 rows = %s, len = %s;\n", outer, len);
        if (is_max)
            fprintf(f, "    if (len == 0 && threadIdx.x == 0)\n        *status = 1; /* max over an empty axis */\n");
        fprintf(f, "    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n");
        fprintf(f, "        const %s *x = in0 + row * len;\n", cu_mem_type(in));
        fprintf(f, "        float acc = %s;\n", init);
        fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
        fprintf(f, is_max ? "            acc = xtc_fmax(acc, xtc_ld(x, j));\n" : "            acc += xtc_ld(x, j);\n");
        fprintf(f, "        acc = %s(acc);\n", is_max ? "xtc_block_max" : "xtc_block_sum");
        fprintf(f, "        if (threadIdx.x == 0)\n            xtc_st(out, row, acc);\n    }\n");
        cu_kernel_end(k);
        cu_geom_rows(k, outer, ROW_BLOCK);
        return 0;
    }
    /* an outer axis: a thread per output element, walking down the axis */
    cu_kernel_begin(k);
    fprintf(f, "    const i64 outer = %s, len = %s, inner = %s, total = outer * inner;\n", outer, len, inner);
    if (is_max)
        fprintf(f, "    if (len == 0 && total > 0 && xtc_global_id() == 0)\n        *status = 1; /* max over an empty axis */\n");
    fprintf(f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    fprintf(f, "        const %s *x = in0 + i / inner * len * inner + i %% inner;\n", cu_mem_type(in));
    fprintf(f, "        float acc = %s;\n", init);
    fprintf(f, "        for (i64 j = 0; j < len; j++)\n");
    fprintf(f, is_max ? "            acc = xtc_fmax(acc, xtc_ld(x, j * inner));\n" : "            acc += xtc_ld(x, j * inner);\n");
    fprintf(f, "        xtc_st(out, i, acc);\n    }\n");
    cu_kernel_end(k);
    char total[3 * CU_EXPR];
    snprintf(total, sizeof total, "%s%s%s * %s%s%s", paren_open(outer), outer, paren_close(outer), paren_open(inner),
             inner, paren_close(inner));
    cu_geom_items(k, total, COL_BLOCK);
    return 0;
}

/* softmax over the last axis: e^(x - max) / sum, a block per row */
int cg_cuda_softmax(CuKernel *k)
{
    const IrNode *x = k->node;
    CuGen *gen = k->gen;
    FILE *f = k->f;
    char rows[CU_EXPR], len[CU_EXPR];
    cu_dims_prod(gen, x->shape, 0, x->rank - 1, rows, sizeof rows);
    cu_dim(gen, x->shape[x->rank - 1], len, sizeof len);
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 rows = %s, len = %s;\n", rows, len);
    fprintf(f, "    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    fprintf(f, "        const %s *x = in0 + row * len;\n", cu_mem_type(x->in[0]));
    fprintf(f, "        %s *y = out + row * len;\n", cu_mem_type(x));
    fprintf(f, "        float mx = -XTC_INF;\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
    fprintf(f, "            mx = xtc_fmax(mx, xtc_ld(x, j));\n");
    fprintf(f, "        mx = xtc_block_max(mx);\n");
    fprintf(f, "        float sum = 0.0f;\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
    fprintf(f, "            sum += expf(xtc_ld(x, j) - mx);\n");
    fprintf(f, "        const float inv = 1.0f / xtc_block_sum(sum);\n");
    fprintf(f, "        /* the exponentials again, so that y is rounded to its storage once */\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
    fprintf(f, "            xtc_st(y, j, expf(xtc_ld(x, j) - mx) * inv);\n    }\n");
    cu_kernel_end(k);
    cu_geom_rows(k, rows, ROW_BLOCK);
    return 0;
}

/* cross_entropy: mean over rows whose target is >= 0 of logsumexp(z) - z[target]; 0 if none */
int cg_cuda_xent(CuKernel *k)
{
    const IrNode *x = k->node, *z = x->in[0], *tg = x->in[1];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    char rows[CU_EXPR], classes[CU_EXPR];
    cu_dims_prod(gen, tg->shape, 0, tg->rank, rows, sizeof rows);
    cu_dim(gen, z->shape[z->rank - 1], classes, sizeof classes);
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ double part_loss[32];\n");
    fprintf(f, "    __shared__ i64 part_count[32];\n");
    fprintf(f, "    const i64 rows = %s, classes = %s;\n", rows, classes);
    fprintf(f, "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;\n");
    fprintf(f, "    double loss = 0.0; /* every lane of a warp holds the same sums */\n");
    fprintf(f, "    i64 count = 0;\n");
    fprintf(f, "    for (i64 row = warp; row < rows; row += nwarps) {\n");
    fprintf(f, "        const i64 target = (i64)in1[row];\n");
    fprintf(f, "        if (target < 0)\n            continue;\n");
    fprintf(f, "        if (target >= classes) {\n            *status = 1;\n            continue;\n        }\n");
    fprintf(f, "        const %s *x = in0 + row * classes;\n", cu_mem_type(z));
    fprintf(f, "        float mx = -XTC_INF, sum = 0.0f;\n");
    fprintf(f, "        for (i64 j = lane; j < classes; j += 32)\n            mx = xtc_fmax(mx, xtc_ld(x, j));\n");
    fprintf(f, "        mx = xtc_warp_max(mx);\n");
    fprintf(f, "        for (i64 j = lane; j < classes; j += 32)\n            sum += expf(xtc_ld(x, j) - mx);\n");
    fprintf(f, "        sum = xtc_warp_sum(sum);\n");
    fprintf(f, "        loss += (double)(mx + logf(sum) - xtc_ld(x, target));\n");
    fprintf(f, "        count++;\n    }\n");
    fprintf(f, "    if (lane == 0) {\n        part_loss[warp] = loss;\n        part_count[warp] = count;\n    }\n");
    fprintf(f, "    __syncthreads();\n");
    fprintf(f, "    if (threadIdx.x == 0) {\n");
    fprintf(f, "        double total = 0.0;\n        i64 n_rows = 0;\n");
    fprintf(f, "        for (int w = 0; w < nwarps; w++) {\n            total += part_loss[w];\n");
    fprintf(f, "            n_rows += part_count[w];\n        }\n");
    fprintf(f, "        xtc_st(out, 0, n_rows ? (float)(total / (double)n_rows) : 0.0f);\n    }\n");
    cu_kernel_end(k);
    cu_geom_rows(k, "1", XENT_BLOCK);
    return 0;
}
