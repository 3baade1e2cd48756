/* cg_cuda_reduce.c: the kernels that reduce: sum and max over one axis, softmax over the last
 * axis, and the cross-entropy loss.
 *
 *   - a reduction over contiguous memory (the axis is the last non-unit one) and softmax: one
 *     block of ROW_BLOCK threads per row (rows in a grid-stride loop), each thread striding over
 *     the row, then xtc_block_sum / xtc_block_max (warp shuffles, then the warps' results
 *     through shared memory; see the prelude in cg_cuda_gen.c);
 *   - a reduction over an outer axis: one thread per output element (per pair of neighbours,
 *     one 2-value load a row, where the inner size is even) looping down the axis, so that
 *     neighbouring threads read neighbouring memory; when there are few outputs and the axis is
 *     long (a bias gradient: [1, n, 512] over n), blocks of 32 columns times chunks of rows,
 *     whose partial sums the last block of each column group adds in chunk order (col_loops);
 *     32-bit indices where the tensor is small enough, chosen at run time;
 *   - cross-entropy: a block per row (8 neighbouring classes a thread, 16-byte loads, where the
 *     row allows it), the blocks' partial sums added by the last block to finish, in block
 *     order: the loss is deterministic.
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
#define COL_CHUNK_ROWS 64      /* ... in chunks of at least this many rows */
#define COL_PART_BLOCKS 1024   /* ... for about this many blocks (and the partial sums' room) */
#define XENT_BLOCK 256
#define XENT_PARTS 1024 /* cross-entropy: blocks at most, each one partial sum */

static const char *paren_open(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *paren_close(const char *e) { return strchr(e, ' ') ? ")" : ""; }

/* The row chunks of the column groups (both expressions): chunks of at least COL_CHUNK_ROWS
 * rows, as many as make about COL_PART_BLOCKS blocks in all; one where the groups alone are
 * that many (the partial sums' buffer holds COL_PART_BLOCKS blocks' 32 sums). */
static void col_chunks(const char *groups, const char *len, char *buf, size_t n)
{
    char a[4 * CU_EXPR], b[4 * CU_EXPR];
    snprintf(a, sizeof a, "%d / %s", COL_PART_BLOCKS, groups);
    snprintf(b, sizeof b, "(%s + %d) / %d", len, COL_CHUNK_ROWS - 1, COL_CHUNK_ROWS);
    snprintf(buf, n, "(%s >= %d ? 1 : %s < %s ? %s : %s)", groups, COL_PART_BLOCKS / 2, a, b, a, b);
}

/* The reduction down an outer axis of [outer, len, inner], with indices of type ix (int where
 * every offset fits):
 *   - few outputs and a long axis (a bias gradient: [1, n, 512] over n): blocks of 32 columns
 *     times chunks of rows; a block's warps take every COL_WARPS-th row of its chunk and add
 *     their results in warp order; with more than one chunk the blocks leave their sums in the
 *     kernel's own global memory and the last block of a column group to finish adds them in
 *     chunk order, so the sum does not depend on which block ran when;
 *   - else a thread per output (per pair of neighbouring outputs, one 2-value load a row, where
 *     inner is even) walking down the axis, neighbouring threads reading neighbouring memory.
 * one_outer: outer is 1 (no division). */
static void col_loops(CuKernel *k, const char *ix, int is_max, int one_outer)
{
    FILE *f = k->f;
    const char *fn = k->k->fn, *mt = cu_mem_type(k->node->in[0]), *init = is_max ? "-XTC_INF" : "0.0f";
    char chunks[24 * CU_EXPR];
    fprintf(f, "        if (total < %d && len >= %d) {\n", COL_SPLIT_ITEMS, COL_SPLIT_LEN);
    fprintf(f, "            const %s colgroups = ((%s)inner + 31) / 32, groups = (%s)outer * colgroups;\n", ix, ix, ix);
    col_chunks("groups", "len", chunks, sizeof chunks);
    fprintf(f, "            const %s chunks = %s;\n", ix, chunks);
    fprintf(f, "            const %s per = ((%s)len + chunks - 1) / chunks; /* rows a chunk */\n", ix, ix);
    fprintf(f, "            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    fprintf(f, "            for (%s t = blockIdx.x; t < groups * chunks; t += gridDim.x) {\n", ix);
    fprintf(f, "                const %s g = t / chunks, ch = t - g * chunks;\n", ix);
    fprintf(f, "                const %s o = g / colgroups, c = (g - o * colgroups) * 32 + lane;\n", ix);
    fprintf(f, "                const %s j1 = ch * per + per < (%s)len ? ch * per + per : (%s)len;\n", ix, ix, ix);
    fprintf(f, "                float acc = %s;\n", init);
    fprintf(f, "                if (c < (%s)inner) {\n", ix);
    fprintf(f, "                    const %s *x = in0 + o * (%s)len * (%s)inner + c;\n", mt, ix, ix);
    fprintf(f, "                    for (%s j = ch * per + warp; j < j1; j += %d)\n", ix, COL_WARPS);
    fprintf(f, is_max ? "                        acc = xtc_fmax(acc, xtc_ld(x, j * (%s)inner));\n"
                      : "                        acc += xtc_ld(x, j * (%s)inner);\n", ix);
    fprintf(f, "                }\n                part[warp][lane] = acc;\n                __syncthreads();\n");
    fprintf(f, "                if (warp == 0)\n                    for (int w = 1; w < %d; w++)\n", COL_WARPS);
    fprintf(f, is_max ? "                        acc = xtc_fmax(acc, part[w][lane]);\n"
                      : "                        acc += part[w][lane];\n");
    fprintf(f, "                if (chunks > 1) {\n");
    fprintf(f, "                    if (warp == 0)\n                        xtc_part_%s[t * 32 + lane] = acc;\n", fn);
    fprintf(f, "                    __threadfence(); /* the sums are visible before the count says so */\n");
    fprintf(f, "                    __syncthreads();\n");
    fprintf(f, "                    if (threadIdx.x == 0)\n");
    fprintf(f, "                        last = atomicAdd(&xtc_done_%s[g], 1u) == (unsigned)chunks - 1;\n", fn);
    fprintf(f, "                    __syncthreads();\n");
    fprintf(f, "                    if (last && warp == 0) {\n");
    fprintf(f, "                        const volatile float *p = xtc_part_%s + g * chunks * 32 + lane;\n", fn);
    fprintf(f, "                        acc = p[0];\n");
    fprintf(f, "                        for (%s q = 1; q < chunks; q++)\n", ix);
    fprintf(f, is_max ? "                            acc = xtc_fmax(acc, p[q * 32]);\n"
                      : "                            acc += p[q * 32];\n");
    fprintf(f, "                        if (lane == 0)\n");
    fprintf(f, "                            xtc_done_%s[g] = 0; /* for the next launch */\n", fn);
    fprintf(f, "                    }\n                }\n");
    fprintf(f, "                if (warp == 0 && c < (%s)inner && (chunks == 1 || last))\n", ix);
    fprintf(f, "                    xtc_st(out, o * (%s)inner + c, acc);\n", ix);
    fprintf(f, "                __syncthreads(); /* part[] and last are read above */\n            }\n");
    fprintf(f, "            return;\n        }\n");
    /* a thread per output, or per pair */
    fprintf(f, "        const %s istride = (%s)inner, step = (%s)len * istride;\n", ix, ix, ix);
    fprintf(f, "        if (istride %% 2 == 0 && ((size_t)in0 | (size_t)out) %% 8 == 0) { /* pairs */\n");
    fprintf(f, "            for (%s i = 2 * ((%s)blockIdx.x * blockDim.x + threadIdx.x); i < (%s)total;\n", ix, ix, ix);
    fprintf(f, "                 i += 2 * (%s)gridDim.x * blockDim.x) {\n", ix);
    if (one_outer)
        fprintf(f, "                const %s *x = in0 + i;\n", mt);
    else
        fprintf(f, "                const %s o = i / istride;\n                const %s *x = in0 + o * step + (i - o * istride);\n", ix, mt);
    fprintf(f, "                float a0 = %s, a1 = %s;\n", init, init);
    fprintf(f, "                for (%s j = 0; j < step; j += istride) {\n", ix);
    fprintf(f, "                    float v[2];\n                    xtc_ld2(v, x, j);\n");
    fprintf(f, is_max ? "                    a0 = xtc_fmax(a0, v[0]);\n                    a1 = xtc_fmax(a1, v[1]);\n"
                      : "                    a0 += v[0];\n                    a1 += v[1];\n");
    fprintf(f, "                }\n                xtc_st2(out, i, a0, a1);\n            }\n            return;\n        }\n");
    fprintf(f, "        for (%s i = (%s)blockIdx.x * blockDim.x + threadIdx.x; i < (%s)total; i += (%s)gridDim.x * blockDim.x) {\n",
            ix, ix, ix, ix);
    if (one_outer)
        fprintf(f, "            const %s *x = in0 + i;\n", mt);
    else
        fprintf(f, "            const %s o = i / istride;\n            const %s *x = in0 + o * step + (i - o * istride);\n", ix, mt);
    fprintf(f, "            float acc = %s;\n", init);
    fprintf(f, "            for (%s j = 0; j < step; j += istride)\n", ix);
    fprintf(f, is_max ? "                acc = xtc_fmax(acc, xtc_ld(x, j));\n" : "                acc += xtc_ld(x, j);\n");
    fprintf(f, "            xtc_st(out, i, acc);\n        }\n");
}

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
    /* an outer axis: see col_loops; 32-bit indices where every offset fits (chosen at run time) */
    k->sync = 1;
    fprintf(f, "/* %s: the column groups' partial sums by row chunk, and how many chunks have finished */\n", k->k->fn);
    fprintf(f, "XTC_GLOBAL float xtc_part_%s[%d];\nXTC_GLOBAL unsigned xtc_done_%s[%d];\n", k->k->fn,
            32 * COL_PART_BLOCKS, k->k->fn, COL_PART_BLOCKS);
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float part[%d][33];\n    __shared__ int last;\n", COL_WARPS);
    fprintf(f, "    const i64 outer = %s, len = %s, inner = %s, total = outer * inner;\n", outer, len, inner);
    if (is_max)
        fprintf(f, "    if (len == 0 && total > 0 && xtc_global_id() == 0)\n        *status = 1; /* max over an empty axis */\n");
    fprintf(f, "    if (total * (len > 0 ? len : 1) <= 0x3fffffff) { /* i + the grid's size fits too */\n");
    col_loops(k, "int", is_max, strcmp(outer, "1") == 0);
    fprintf(f, "    } else {\n");
    col_loops(k, "i64", is_max, strcmp(outer, "1") == 0);
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    /* the grid of whichever loop runs: column groups times row chunks, or the elements (pairs of
     * them where inner is even) a block of threads */
    char po[CU_EXPR + 4], pl[CU_EXPR + 4], pi[CU_EXPR + 4];
    snprintf(po, sizeof po, "%s%s%s", paren_open(outer), outer, paren_close(outer));
    snprintf(pl, sizeof pl, "%s%s%s", paren_open(len), len, paren_close(len));
    snprintf(pi, sizeof pi, "%s%s%s", paren_open(inner), inner, paren_close(inner));
    char groups[3 * CU_EXPR], chunks[24 * CU_EXPR];
    snprintf(groups, sizeof groups, "(%s * ((%s + 31) / 32))", po, pi);
    col_chunks(groups, pl, chunks, sizeof chunks);
    int w = snprintf(k->geom.grid_x, sizeof k->geom.grid_x,
                     "(%s * %s < %d && %s >= %d ? %s * %s : (%s * %s / (%s %% 2 == 0 ? 2 : 1) + %d) / %d)", po, pi,
                     COL_SPLIT_ITEMS, pl, COL_SPLIT_LEN, groups, chunks, po, pi, pi, 32 * COL_WARPS - 1, 32 * COL_WARPS);
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
    /* 8 neighbouring classes a thread, one 16-byte load of 16-bit storage (two of f32), where the
     * row has a multiple of 8 and starts 16-byte aligned (decided here for a known count that is
     * not, else tested); else a class at a time */
    int vec = !ir_dim_is_const(z->shape[z->rank - 1]) || z->shape[z->rank - 1].c % 8 == 0;
    if (vec) {
        fprintf(f, "        const int vec = classes %% 8 == 0 && (unsigned long long)(const void *)x %% 16 == 0;\n");
        fprintf(f, "        if (vec) {\n");
        fprintf(f, "            for (i64 j = threadIdx.x * 8; j < classes; j += blockDim.x * 8) {\n");
        fprintf(f, "                float v[8];\n                xtc_ld8(v, x, j);\n");
        fprintf(f, "                for (int u = 0; u < 8; u++)\n                    mx = xtc_fmax(mx, v[u]);\n");
        fprintf(f, "            }\n        } else {\n    ");
    }
    fprintf(f, "        for (i64 j = threadIdx.x; j < classes; j += blockDim.x)\n    %s        mx = xtc_fmax(mx, xtc_ld(x, j));\n",
            vec ? "    " : "");
    if (vec)
        fprintf(f, "        }\n");
    fprintf(f, "        mx = xtc_block_max(mx);\n");
    if (vec) {
        fprintf(f, "        if (vec) {\n");
        fprintf(f, "            for (i64 j = threadIdx.x * 8; j < classes; j += blockDim.x * 8) {\n");
        fprintf(f, "                float v[8];\n                xtc_ld8(v, x, j);\n");
        fprintf(f, "                for (int u = 0; u < 8; u++)\n                    sum += expf(v[u] - mx);\n");
        fprintf(f, "            }\n        } else {\n    ");
    }
    fprintf(f, "        for (i64 j = threadIdx.x; j < classes; j += blockDim.x)\n    %s        sum += expf(xtc_ld(x, j) - mx);\n",
            vec ? "    " : "");
    if (vec)
        fprintf(f, "        }\n");
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
