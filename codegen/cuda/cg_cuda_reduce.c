/* cg_cuda_reduce.c: the kernels that reduce: sum and max over one axis, softmax over the last
 * axis, and the cross-entropy loss.
 *
 *   - a reduction over contiguous memory (the axis is the last non-unit one) and softmax: one
 *     block of ROW_BLOCK threads per row (rows in a grid-stride loop), each thread striding over
 *     the row, then xtc_block_sum / xtc_block_max (warp shuffles, then the warps' results
 *     through shared memory; see the prelude in cg_cuda_gen.c);
 *   - a reduction over an outer axis: one thread per output element looping down the axis,
 *     so that neighbouring threads read neighbouring memory; when there are few outputs and
 *     the axis is long (a bias gradient: [1, n, 512] over n), a block per 32 columns whose
 *     warps take every COL_WARPS-th row and add their results in warp order;
 *   - cross-entropy: a block per row, the blocks' partial sums added by the last block to
 *     finish, in block order: the loss is deterministic.
 *
 * Like ir/interp.c: NaN propagates through max, a max over an empty axis is an error (status),
 * a sum over an empty axis is 0, targets < 0 are ignored and a target >= the number of classes
 * is an error. */
#include "cg_cuda.h"

#include <string.h>

#define ROW_BLOCK 128 /* threads per row: a multiple of 32 */
#define COL_WARPS 16            /* an outer axis: warps a block */
#define COL_SPLIT_ITEMS 65536  /* split the axis among warps below this many outputs */
#define COL_SPLIT_LEN 16       /* ... when it is at least this long */
#define XENT_BLOCK 256
#define XENT_PARTS 1024 /* cross-entropy: blocks at most, each one partial sum */

static const char *paren_open(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *paren_close(const char *e) { return strchr(e, ' ') ? ")" : ""; }

int cg_cuda_reduce(CuKernel *k)
{
    const IrNode *x = k->node, *in = x->in[0];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    int axis = (int)x->ia[IR_IA_AXIS], is_max = x->op == IR_RMAX;
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
    /* an outer axis: a thread per output element walking down the axis; or, when that leaves
     * fewer than COL_SPLIT_ITEMS threads and the axis is long, columns of 32 outputs a block,
     * the axis split among its warps and their results added in warp order */
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float part[%d][33];\n", COL_WARPS);
    fprintf(f, "    const i64 outer = %s, len = %s, inner = %s, total = outer * inner;\n", outer, len, inner);
    if (is_max)
        fprintf(f, "    if (len == 0 && total > 0 && xtc_global_id() == 0)\n        *status = 1; /* max over an empty axis */\n");
    fprintf(f, "    if (total < %d && len >= %d) {\n", COL_SPLIT_ITEMS, COL_SPLIT_LEN);
    fprintf(f, "        const i64 colgroups = (inner + 31) / 32, groups = outer * colgroups;\n");
    fprintf(f, "        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    fprintf(f, "        for (i64 g = blockIdx.x; g < groups; g += gridDim.x) {\n");
    fprintf(f, "            const i64 o = g / colgroups, c = g %% colgroups * 32 + lane;\n");
    fprintf(f, "            float acc = %s;\n", init);
    fprintf(f, "            if (c < inner) {\n");
    fprintf(f, "                const %s *x = in0 + o * len * inner + c;\n", cu_mem_type(in));
    fprintf(f, "                for (i64 j = warp; j < len; j += %d)\n", COL_WARPS);
    fprintf(f, is_max ? "                    acc = xtc_fmax(acc, xtc_ld(x, j * inner));\n"
                      : "                    acc += xtc_ld(x, j * inner);\n");
    fprintf(f, "            }\n            part[warp][lane] = acc;\n            __syncthreads();\n");
    fprintf(f, "            if (warp == 0 && c < inner) {\n");
    fprintf(f, "                for (int w = 1; w < %d; w++)\n", COL_WARPS);
    fprintf(f, is_max ? "                    acc = xtc_fmax(acc, part[w][lane]);\n" : "                    acc += part[w][lane];\n");
    fprintf(f, "                xtc_st(out, o * inner + c, acc);\n            }\n");
    fprintf(f, "            __syncthreads(); /* part[] is read above */\n        }\n        return;\n    }\n");
    fprintf(f, "    for (i64 i = xtc_global_id(); i < total; i += xtc_global_size()) {\n");
    fprintf(f, "        const %s *x = in0 + i / inner * len * inner + i %% inner;\n", cu_mem_type(in));
    fprintf(f, "        float acc = %s;\n", init);
    fprintf(f, "        for (i64 j = 0; j < len; j++)\n");
    fprintf(f, is_max ? "            acc = xtc_fmax(acc, xtc_ld(x, j * inner));\n" : "            acc += xtc_ld(x, j * inner);\n");
    fprintf(f, "        xtc_st(out, i, acc);\n    }\n");
    cu_kernel_end(k);
    /* the grid of whichever loop runs: column groups, or the elements a block of threads */
    char po[CU_EXPR + 4], pl[CU_EXPR + 4], pi[CU_EXPR + 4];
    snprintf(po, sizeof po, "%s%s%s", paren_open(outer), outer, paren_close(outer));
    snprintf(pl, sizeof pl, "%s%s%s", paren_open(len), len, paren_close(len));
    snprintf(pi, sizeof pi, "%s%s%s", paren_open(inner), inner, paren_close(inner));
    int w = snprintf(k->geom.grid_x, sizeof k->geom.grid_x,
                     "(%s * %s < %d && %s >= %d ? %s * ((%s + 31) / 32) : (%s * %s + %d) / %d)", po, pi, COL_SPLIT_ITEMS,
                     pl, COL_SPLIT_LEN, po, pi, po, pi, 32 * COL_WARPS - 1, 32 * COL_WARPS);
    if (w < 0 || (size_t)w >= sizeof k->geom.grid_x)
        return cu_error(gen, "%s: the launch geometry's expression is too long", k->k->fn);
    k->geom.block = 32 * COL_WARPS;
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

/* cross_entropy: mean over rows whose target is >= 0 of logsumexp(z) - z[target]; 0 if none.
 * A block per row (rows in a grid-stride loop over at most XENT_PARTS blocks); thread 0 adds
 * its block's row losses in order into the kernel's own global memory (XTC_GLOBAL), and the
 * block that finishes last adds the blocks' sums in block order: the loss does not depend on
 * which block ran when. */
int cg_cuda_xent(CuKernel *k)
{
    const IrNode *x = k->node, *z = x->in[0], *tg = x->in[1];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    const char *fn = k->k->fn;
    char rows[CU_EXPR], classes[CU_EXPR];
    cu_dims_prod(gen, tg->shape, 0, tg->rank, rows, sizeof rows);
    cu_dim(gen, z->shape[z->rank - 1], classes, sizeof classes);
    k->sync = 1;
    fprintf(f, "/* %s: each block's loss and row count, and how many blocks have finished */\n", fn);
    /* named after the kernel, ending with its name (test_cuda_nvrtc renames kernels so) */
    fprintf(f, "XTC_GLOBAL double xtc_loss_%s[%d];\nXTC_GLOBAL i64 xtc_count_%s[%d];\nXTC_GLOBAL unsigned xtc_done_%s;\n",
            fn, XENT_PARTS, fn, XENT_PARTS, fn);
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ int last;\n");
    fprintf(f, "    const i64 rows = %s, classes = %s;\n", rows, classes);
    fprintf(f, "    double loss = 0.0; /* thread 0's: the block's rows in order */\n");
    fprintf(f, "    i64 count = 0;\n");
    fprintf(f, "    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    fprintf(f, "        const i64 target = (i64)in1[row]; /* the same in every thread of the block */\n");
    fprintf(f, "        if (target < 0)\n            continue;\n");
    fprintf(f, "        if (target >= classes) {\n            *status = 1;\n            continue;\n        }\n");
    fprintf(f, "        const %s *x = in0 + row * classes;\n", cu_mem_type(z));
    fprintf(f, "        float mx = -XTC_INF, sum = 0.0f;\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < classes; j += blockDim.x)\n            mx = xtc_fmax(mx, xtc_ld(x, j));\n");
    fprintf(f, "        mx = xtc_block_max(mx);\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < classes; j += blockDim.x)\n            sum += expf(xtc_ld(x, j) - mx);\n");
    fprintf(f, "        sum = xtc_block_sum(sum);\n");
    fprintf(f, "        loss += (double)(mx + logf(sum) - xtc_ld(x, target));\n");
    fprintf(f, "        count++;\n    }\n");
    fprintf(f, "    if (threadIdx.x == 0) {\n");
    fprintf(f, "        xtc_loss_%s[blockIdx.x] = loss;\n        xtc_count_%s[blockIdx.x] = count;\n", fn, fn);
    fprintf(f, "        __threadfence(); /* the sums are visible before the count says so */\n");
    fprintf(f, "        last = atomicAdd(&xtc_done_%s, 1u) == gridDim.x - 1;\n    }\n", fn);
    fprintf(f, "    __syncthreads();\n");
    fprintf(f, "    if (last && threadIdx.x == 0) {\n");
    fprintf(f, "        const volatile double *part_loss = xtc_loss_%s;\n", fn);
    fprintf(f, "        const volatile i64 *part_count = xtc_count_%s;\n", fn);
    fprintf(f, "        double total = 0.0;\n        i64 n_rows = 0;\n");
    fprintf(f, "        for (unsigned blk = 0; blk < gridDim.x; blk++) {\n            total += part_loss[blk];\n");
    fprintf(f, "            n_rows += part_count[blk];\n        }\n");
    fprintf(f, "        xtc_st(out, 0, n_rows ? (float)(total / (double)n_rows) : 0.0f);\n");
    fprintf(f, "        xtc_done_%s = 0; /* for the next launch */\n    }\n", fn);
    cu_kernel_end(k);
    /* at least one block, so that no rows still writes the 0 */
    snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "((%s) < 1 ? 1 : (%s) < %d ? (%s) : %d)", rows, rows, XENT_PARTS,
             rows, XENT_PARTS);
    k->geom.block = XENT_BLOCK;
    return 0;
}
