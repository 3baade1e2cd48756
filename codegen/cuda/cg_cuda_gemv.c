/* cg_cuda_gemv.c: matrix multiplication with few rows (M <= GEMV_MAX_M: one token's step of
 * incremental decoding, a small batch of them), the matmul kernel's other path, chosen at run time
 * from M (cg_cuda_matmul.c's kernels call cg_cuda_gemv after their prologue, in the loop over
 * batch matrices, and cg_cuda_gemv_geometry after their geometry).
 *
 * A product of one row against a weight matrix reads every weight once for two flops: it is bound
 * by the weights' bytes, which the tiled kernels read through a handful of 64-row tiles, each
 * walking all of K serially. Here the work is spread over the columns of C instead:
 *
 *  - B transposed ([N, K], a linear layer's weight): one warp per output column, its lanes
 *    across K, VEC (8) consecutive k each per load (one 16-byte load of 16-bit storage, two of
 *    f32), the warp's sums combined with shuffles; a block of W warps covers W columns.
 *  - B as [K, N]: a block per 32 columns, lane = column (a warp's loads are contiguous), the
 *    warps splitting K; their sums combined through shared memory (taken only where the
 *    kernel's own arrays leave room for them, cg_cuda_gemv's smem).
 *
 * Rows are taken GROWS at a time (each thread keeps GROWS sums per product column), so B is read
 * once per GROWS rows. With a GLU epilogue (parts = 2) each output column needs the product's
 * column in both halves (oc and Nout + oc): the warp or lane computes both, mm and mm1. The
 * vector loads need K a multiple of VEC and 16-byte aligned A and B (checked at run time; else
 * the lanes read one element at a time). Under --mma the operands are rounded to the tensor
 * cores' 16-bit format, as the tensor-core kernel does (cu_mma_operand), so both paths compute
 * the same products. The epilogue is the tiled kernels' (cu_matmul_store): it sees
 * batch, row, col, C, M, N (and Nout, mm1). */
#include "cg_cuda.h"

#include <string.h>

#define GEMV_MAX_M 16 /* products of at most this many rows take this path */
#define GROWS 8       /* rows a thread sums at once */
#define VEC 8         /* consecutive k a lane loads at once (cu_load_vec8: 16 bytes of 16-bit storage) */

void cu_load_vec8(CuKernel *k, const char *v, const char *p, const char *idx, const char *at)
{
    fprintf(k->f, "%sxtc_ld8(%s, %s, %s);\n", at, v, p, idx);
}

/* The value expression as the product's operand: under --mma rounded to the tensor cores'
 * format, as the tensor-core kernel rounds it (an identity on values stored in it; the kernel's
 * text does not depend on the storage, only the prelude does). */
void cu_mma_operand(const CuKernel *k, const char *value, char *buf, size_t n)
{
    if (k->gen->mma == CG_MMA_OFF)
        snprintf(buf, n, "%s", value);
    else if (k->gen->mma == CG_MMA_FP16)
        snprintf(buf, n, "xtc_f16_float(xtc_f16_bits(%s))", value);
    else
        snprintf(buf, n, "xtc_bf16_float(xtc_bf16_bits(%s))", value);
}

/* gemv_b's shared sums, Gv: GROWS x 32 floats a warp */
static int gemv_b_smem(unsigned threads) { return (int)(threads / 32) * GROWS * 32 * 4; }

/* Whether node x's M may be small enough for this path, and its shared memory (none with B
 * transposed) fits in the smem bytes the kernel leaves; never for A read transposed in place
 * (CG_VIEW_A_T: the tiles read it, a weight's gradient, whose M is a weight's dim). */
static int may_take(const CuKernel *k, const IrNode *x, unsigned threads, int smem)
{
    if (!x->ia[IR_IA_TRANSPOSE_B] && gemv_b_smem(threads) > smem)
        return 0;
    if (cu_matmul_views(k, x) & CG_VIEW_A_T)
        return 0;
    IrDim m = x->shape[x->rank - 2];
    for (int s = 0; s < IR_MAXSYM; s++)
        if (m.k[s])
            return 1;
    return m.c <= GEMV_MAX_M;
}

/* B transposed: warp gw of the block computes output column gc, its lanes across k. */
static int gemv_bt(CuKernel *k, int parts, const char *tb, CuEpilogue epilogue, void *ctx)
{
    FILE *f = k->f;
    char av[96], bv[96];
    fprintf(f, "            const int gvec = K %% %d == 0 && ((size_t)A | (size_t)B) %% 16 == 0; /* 16-byte loads */\n", VEC);
    fprintf(f, "            for (i64 gc = (i64)blockIdx.x * gnw + gw; gc < cols; gc += (i64)gridDim.x * gnw) {\n");
    for (int p = 0; p < parts; p++)
        fprintf(f, "                const %s *gb%d = B + (%sgc) * K;\n", tb, p, p ? "Nout + " : "");
    fprintf(f, "                for (i64 gm = 0; gm < M; gm += %d) {\n", GROWS);
    fprintf(f, "                    float ga[%d][%d]; /* [product half][row gm + r]: the lane's sums */\n", parts, GROWS);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++)\n", GROWS);
    fprintf(f, "                        for (int p = 0; p < %d; p++)\n", parts);
    fprintf(f, "                            ga[p][r] = 0.0f;\n");
    fprintf(f, "                    if (gvec) {\n");
    fprintf(f, "                        for (i64 kq = %d * gl; kq < K; kq += %d) {\n", VEC, 32 * VEC);
    fprintf(f, "                            float bw[%d][%d], aw[%d];\n", parts, VEC, VEC);
    for (int p = 0; p < parts; p++) {
        char v[16], pp[16];
        snprintf(v, sizeof v, "bw[%d]", p);
        snprintf(pp, sizeof pp, "gb%d", p);
        cu_load_vec8(k, v, pp, "kq", "                            ");
    }
    cu_mma_operand(k, "bw[p][u]", bv, sizeof bv);
    cu_mma_operand(k, "aw[u]", av, sizeof av);
    if (strcmp(bv, "bw[p][u]") != 0) {
        fprintf(f, "                            for (int p = 0; p < %d; p++)\n", parts);
        fprintf(f, "                                for (int u = 0; u < %d; u++)\n", VEC);
        fprintf(f, "                                    bw[p][u] = %s;\n", bv);
    }
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                            for (int r = 0; r < %d; r++) {\n", GROWS);
    fprintf(f, "                                if (gm + r >= M)\n");
    fprintf(f, "                                    break;\n");
    cu_load_vec8(k, "aw", "A", "(gm + r) * K + kq", "                                ");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                                for (int u = 0; u < %d; u++) {\n", VEC);
    if (strcmp(av, "aw[u]") != 0)
        fprintf(f, "                                    aw[u] = %s;\n", av);
    for (int p = 0; p < parts; p++)
        fprintf(f, "                                    ga[%d][r] += aw[u] * bw[%d][u];\n", p, p);
    fprintf(f, "                                }\n");
    fprintf(f, "                            }\n");
    fprintf(f, "                        }\n");
    fprintf(f, "                    } else {\n");
    fprintf(f, "                        for (i64 kq = gl; kq < K; kq += 32) {\n");
    for (int p = 0; p < parts; p++) {
        char ld[64], v[160];
        snprintf(ld, sizeof ld, "xtc_ld(gb%d, kq)", p);
        cu_mma_operand(k, ld, v, sizeof v);
        fprintf(f, "                            const float gbv%d = %s;\n", p, v);
    }
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                            for (int r = 0; r < %d; r++) {\n", GROWS);
    fprintf(f, "                                if (gm + r >= M)\n");
    fprintf(f, "                                    break;\n");
    cu_mma_operand(k, "xtc_ld(A, (gm + r) * K + kq)", av, sizeof av);
    fprintf(f, "                                const float gav = %s;\n", av);
    for (int p = 0; p < parts; p++)
        fprintf(f, "                                ga[%d][r] += gav * gbv%d;\n", p, p);
    fprintf(f, "                            }\n");
    fprintf(f, "                        }\n");
    fprintf(f, "                    }\n");
    /* the warp's sums: every lane ends with all of them; lane r takes row gm + r's */
    fprintf(f, "                    float gs[%d] = {0.0f%s};\n", parts, parts == 2 ? ", 0.0f" : "");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++)\n", GROWS);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int p = 0; p < %d; p++) {\n", parts);
    fprintf(f, "                            float s = ga[p][r];\n");
    fprintf(f, "                            for (int w = 16; w > 0; w >>= 1)\n");
    fprintf(f, "                                s += __shfl_xor_sync(0xffffffffu, s, w);\n");
    fprintf(f, "                            if (gl == r)\n");
    fprintf(f, "                                gs[p] = s;\n");
    fprintf(f, "                        }\n");
    fprintf(f, "                    const i64 row = gm + gl, col = gc;\n");
    fprintf(f, "                    if (gl < %d && row < M)\n", GROWS);
    if (cu_matmul_store(k, epilogue, ctx, "gs[0]", parts == 2 ? "gs[1]" : NULL, "                        ") < 0)
        return -1;
    fprintf(f, "                }\n");
    fprintf(f, "            }\n");
    return 0;
}

/* B as [K, N]: the block's 32 columns from gc0, lane gl's column gc0 + gl, warp gw's k gw,
 * gw + gnw, ...; the warps' sums meet in shared memory. */
static int gemv_b(CuKernel *k, int parts, CuEpilogue epilogue, void *ctx, unsigned threads)
{
    FILE *f = k->f;
    int rows = GROWS / parts; /* the shared sums stay GROWS x 32 floats a warp (gemv_b_smem) */
    char av[96], bv[160];
    fprintf(f, "            __shared__ float Gv[%u][%d][%d][32]; /* [warp][half][row][lane]: the warps' sums */\n",
            threads / 32, parts, rows);
    fprintf(f, "            for (i64 gc0 = (i64)blockIdx.x * 32; gc0 < cols; gc0 += (i64)gridDim.x * 32) {\n");
    fprintf(f, "                const i64 gc = gc0 + gl;\n");
    fprintf(f, "                for (i64 gm = 0; gm < M; gm += %d) {\n", rows);
    fprintf(f, "                    float ga[%d][%d];\n", parts, rows);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++)\n", rows);
    fprintf(f, "                        for (int p = 0; p < %d; p++)\n", parts);
    fprintf(f, "                            ga[p][r] = 0.0f;\n");
    fprintf(f, "                    if (gc < cols)\n");
    fprintf(f, "                        for (i64 kq = gw; kq < K; kq += gnw) {\n");
    for (int p = 0; p < parts; p++) {
        char ld[96];
        snprintf(ld, sizeof ld, "xtc_ld(B, kq * N + %sgc)", p ? "Nout + " : "");
        cu_mma_operand(k, ld, bv, sizeof bv);
        fprintf(f, "                            const float gbv%d = %s;\n", p, bv);
    }
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                            for (int r = 0; r < %d; r++) {\n", rows);
    fprintf(f, "                                if (gm + r >= M)\n");
    fprintf(f, "                                    break;\n");
    cu_mma_operand(k, "xtc_ld(A, (gm + r) * K + kq)", av, sizeof av);
    fprintf(f, "                                const float gav = %s;\n", av);
    for (int p = 0; p < parts; p++)
        fprintf(f, "                                ga[%d][r] += gav * gbv%d;\n", p, p);
    fprintf(f, "                            }\n");
    fprintf(f, "                        }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++)\n", rows);
    fprintf(f, "                        for (int p = 0; p < %d; p++)\n", parts);
    fprintf(f, "                            Gv[gw][p][r][gl] = ga[p][r];\n");
    fprintf(f, "                    __syncthreads();\n");
    fprintf(f, "                    for (int e = threadIdx.x; e < %d * 32; e += blockDim.x) {\n", rows);
    fprintf(f, "                        const int r = e / 32, gx = e %% 32;\n");
    fprintf(f, "                        const i64 row = gm + r, col = gc0 + gx;\n");
    fprintf(f, "                        float gs[%d] = {0.0f%s};\n", parts, parts == 2 ? ", 0.0f" : "");
    fprintf(f, "                        for (int w = 0; w < gnw; w++)\n");
    fprintf(f, "                            for (int p = 0; p < %d; p++)\n", parts);
    fprintf(f, "                                gs[p] += Gv[w][p][r][gx];\n");
    fprintf(f, "                        if (row < M && col < cols)\n");
    if (cu_matmul_store(k, epilogue, ctx, "gs[0]", parts == 2 ? "gs[1]" : NULL, "                            ") < 0)
        return -1;
    fprintf(f, "                    }\n");
    fprintf(f, "                    __syncthreads(); /* before the next rows overwrite Gv */\n");
    fprintf(f, "                }\n");
    fprintf(f, "            }\n");
    return 0;
}

int cg_cuda_gemv(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx, unsigned threads,
                 int smem)
{
    if (!may_take(k, x, threads, smem))
        return 0;
    FILE *f = k->f;
    int tb = x->ia[IR_IA_TRANSPOSE_B] != 0;
    const char *tbt = cu_mem_type(k->node->in[ib]);
    (void)ia;
    fprintf(f, "        if (M <= %d) { /* few rows: the columns spread over the grid (cg_cuda_gemv.c) */\n", GEMV_MAX_M);
    fprintf(f, "            const int gl = threadIdx.x %% 32, gw = threadIdx.x / 32, gnw = blockDim.x / 32;\n");
    fprintf(f, "            const i64 cols = %s; /* the output's columns */\n", parts == 2 ? "Nout" : "N");
    fprintf(f, "            (void)gw;\n");
    int rc = tb ? gemv_bt(k, parts, tbt, epilogue, ctx) : gemv_b(k, parts, epilogue, ctx, threads);
    if (rc < 0)
        return -1;
    fprintf(f, "            continue; /* the next batch matrix */\n");
    fprintf(f, "        }\n");
    return 0;
}

void cg_cuda_gemv_geometry(CuKernel *k, const IrNode *x, int parts, unsigned threads, int smem)
{
    if (!may_take(k, x, threads, smem))
        return;
    CuGen *gen = k->gen;
    int r = x->rank, tb = x->ia[IR_IA_TRANSPOSE_B] != 0;
    char M[CU_EXPR], N[CU_EXPR], cols[CU_EXPR + 16], blocks[2 * CU_EXPR], grid[sizeof k->geom.grid_x];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    if (parts == 2)
        snprintf(cols, sizeof cols, "(%s) / 2", N);
    else
        snprintf(cols, sizeof cols, "%s", N);
    cu_ceil_div(cols, tb ? threads / 32 : 32, blocks, sizeof blocks);
    size_t len = (size_t)snprintf(grid, sizeof grid, "(%s) <= %d ? (%s) : (%s)", M, GEMV_MAX_M, blocks, k->geom.grid_x);
    if (len < sizeof k->geom.grid_x)
        memcpy(k->geom.grid_x, grid, len + 1);
    else /* the tiles' grid, which the grid-stride loops also cover */
        cu_error(gen, "matmul: the launch geometry's expression is too long");
}
