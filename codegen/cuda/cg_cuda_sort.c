/* cg_cuda_sort.c: the ops defined by a sort of each row (over the last axis), as the
 * interpreter defines them (ir/interp.c):
 *
 *   entmax15     exact sort-based 1.5-entmax: entries sorted descending, the threshold tau from
 *                running sums over the sorted prefixes, y = max((x - max) / 2 - tau, 0)^2;
 *                masked entries (<= -FLT_MAX) take no part and get 0
 *   kth_largest  the row's k-th largest value, ties counted (torch.topk); -inf when k > len
 *
 * No sort is run: a block per row, each thread ranks its entries by counting the entries that
 * come before them in the descending order (ties broken by position, NaN first as in torch), so
 * the sorted order is exact whatever the row length, in O(len^2) comparisons per row. entmax15
 * writes each entry's index at its rank into its own output row (scratch), one thread then runs
 * the prefix sums in double precision as the interpreter does, and every thread writes y. */
#include "cg_cuda.h"

#define ROW_BLOCK 128

int cg_cuda_entmax15(CuKernel *k)
{
    const IrNode *x = k->node;
    char rows[CU_EXPR], len[CU_EXPR];
    cu_dims_prod(k->gen, x->shape, 0, x->rank - 1, rows, sizeof rows);
    cu_dim(k->gen, x->shape[x->rank - 1], len, sizeof len);
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float max_and_tau[2];\n");
    fprintf(f, "    const i64 rows = %s, len = %s;\n", rows, len);
    fprintf(f, "    const float masked = -3.40282347e+38f; /* -FLT_MAX: entries at or below take no part */\n");
    fprintf(f, "    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    fprintf(f, "        const %s *x = in0 + row * len;\n", cu_mem_type(x->in[0]));
    fprintf(f, "        float *y = out + row * len; /* f32 whatever the storage (cg_keeps_f32): scratch */\n");
    fprintf(f, "        /* a row whose every entry is masked takes them all */\n");
    fprintf(f, "        float active = 0.0f;\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
    fprintf(f, "            active += xtc_ld(x, j) > masked;\n");
    fprintf(f, "        active = xtc_block_sum(active); /* exact: integers below 2^24 */\n");
    fprintf(f, "        const int all = active == 0.0f;\n");
    fprintf(f, "        const i64 na = all ? len : (i64)active;\n");
    fprintf(f, "        float mx = -XTC_INF;\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x)\n");
    fprintf(f, "            if (all || xtc_ld(x, j) > masked)\n");
    fprintf(f, "                mx = xtc_fmax(mx, xtc_ld(x, j));\n");
    fprintf(f, "        mx = xtc_block_max(mx);\n");
    fprintf(f, "        /* y[rank] = the index of the entry of that rank among the active ones */\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {\n");
    fprintf(f, "            if (!all && !(xtc_ld(x, j) > masked))\n                continue;\n");
    fprintf(f, "            i64 rank = 0;\n");
    fprintf(f, "            for (i64 i = 0; i < len; i++)\n");
    fprintf(f, "                rank += (all || xtc_ld(x, i) > masked) && (xtc_before(xtc_ld(x, i), xtc_ld(x, j)) || "
               "(i < j && !xtc_before(xtc_ld(x, j), xtc_ld(x, i))));;\n");
    fprintf(f, "            y[rank] = (float)j;\n        }\n");
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        if (threadIdx.x == 0) {\n");
    fprintf(f, "            double sum = 0.0, sum_sq = 0.0, tau = 0.0;\n");
    fprintf(f, "            for (i64 r = 0; r < na; r++) {\n");
    fprintf(f, "                const i64 j = (i64)y[r];\n");
    fprintf(f, "                const double xs = ((double)xtc_ld(x, j) - (double)mx) / 2, rho = (double)(r + 1);\n");
    fprintf(f, "                sum += xs;\n                sum_sq += xs * xs;\n");
    fprintf(f, "                const double mean = sum / rho, delta = (1.0 - rho * (sum_sq / rho - mean * mean)) / rho;\n");
    fprintf(f, "                const double tau_r = mean - sqrt(delta > 0.0 ? delta : 0.0);\n");
    fprintf(f, "                if (tau_r <= xs)\n                    tau = tau_r; /* the support ends at the last such prefix */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            max_and_tau[0] = mx;\n            max_and_tau[1] = (float)tau;\n        }\n");
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        const double tau = max_and_tau[1];\n");
    fprintf(f, "        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {\n");
    fprintf(f, "            const double d = ((double)xtc_ld(x, j) - (double)mx) / 2 - tau;\n");
    fprintf(f, "            y[j] = (all || xtc_ld(x, j) > masked) && d > 0.0 ? (float)(d * d) : 0.0f;\n        }\n");
    fprintf(f, "        __syncthreads(); /* y is read as scratch above */\n    }\n");
    cu_kernel_end(k);
    cu_geom_rows(k, rows, ROW_BLOCK);
    return 0;
}

int cg_cuda_kth_largest(CuKernel *k)
{
    const IrNode *x = k->node, *in = x->in[0];
    char rows[CU_EXPR], len[CU_EXPR];
    cu_dims_prod(k->gen, in->shape, 0, in->rank - 1, rows, sizeof rows);
    cu_dim(k->gen, in->shape[in->rank - 1], len, sizeof len);
    FILE *f = k->f;
    cu_kernel_begin(k);
    fprintf(f, "    const i64 rows = %s, len = %s, kth = %lld;\n", rows, len, (long long)x->ia[IR_IA_K]);
    fprintf(f, "    for (i64 e = xtc_global_id(); e < rows * len; e += xtc_global_size()) {\n");
    fprintf(f, "        const i64 row = e / len, j = e %% len;\n");
    fprintf(f, "        const %s *x = in0 + row * len;\n", cu_mem_type(in));
    fprintf(f, "        i64 above = 0, at_or_above = 0; /* entries before x[j] in descending order, ties included */\n");
    fprintf(f, "        for (i64 i = 0; i < len; i++) {\n");
    fprintf(f, "            above += xtc_before(xtc_ld(x, i), xtc_ld(x, j));\n");
    fprintf(f, "            at_or_above += !xtc_before(xtc_ld(x, j), xtc_ld(x, i));\n        }\n");
    fprintf(f, "        if (above < kth && kth <= at_or_above)\n            xtc_st(out, row, xtc_ld(x, j)); /* ties write the same value */\n");
    fprintf(f, "    }\n");
    fprintf(f, "    if (kth > len)\n");
    fprintf(f, "        for (i64 row = xtc_global_id(); row < rows; row += xtc_global_size())\n");
    fprintf(f, "            xtc_st(out, row, -XTC_INF);\n");
    cu_kernel_end(k);
    char items[3 * CU_EXPR]; /* one more per row: never 0 items while rows need their -inf */
    snprintf(items, sizeof items, "(%s) * (%s + 1)", rows, len);
    cu_geom_items(k, items, 256);
    return 0;
}
