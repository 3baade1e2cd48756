/* cg_cuda_matmul.c: matrix multiplication on the GPU, C[.., M, N] = A[.., M, K] x B[.., K, N]
 * (B given as [.., N, K] with transpose_b), batch dimensions broadcast.
 *
 * The classic shared-memory tiling: a block of 256 threads computes a TILE x TILE (64 x 64) tile
 * of C, each thread a 4 x 4 grid of it (rows ty + 16 q, columns tx + 16 w, so that a warp's
 * loads from shared memory and its stores to C are contiguous). K advances KT (16) at a time:
 * the block copies A[64 x 16] and B[16 x 64] into shared memory (zero past the edges, so ragged
 * sizes need no other care), waits, and every thread accumulates its 16 products from there.
 * Tiles are x (a grid-stride loop), batch matrices y. A is stored transposed in shared memory,
 * As[k][m], so that both operands are read along a row there. A fused program whose first step is
 * the matmul (bias, activation, residual) replaces the store of C by its epilogue
 * (cg_cuda_fused.c), which reads mm, the product at (batch, row, col). */
#include "cg_cuda.h"

#include <string.h>

#define TILE 64
#define KT 16
#define THREADS 256

static const char *po(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *pc(const char *e) { return strchr(e, ' ') ? ")" : ""; }

/* The element offset of operand x's matrix for the output batch indices ix0, ix1, ...: a dim of
 * x that broadcasts does not move. */
static void batch_offset(CuKernel *k, const IrNode *out, const IrNode *x, char *buf, size_t n)
{
    int r = out->rank, lead = r - x->rank;
    size_t len = 0;
    buf[0] = 0;
    for (int d = 0; d < r - 2 && len < n; d++) {
        int kd = d - lead;
        if (kd < 0 || ir_dim_is_one(x->shape[kd]))
            continue;
        char stride[CU_EXPR];
        cu_dims_prod(k->gen, x->shape, kd + 1, x->rank, stride, sizeof stride);
        len += (size_t)snprintf(buf + len, n - len, "%six%d * %s%s%s", len ? " + " : "", d, po(stride), stride, pc(stride));
    }
    if (!len)
        snprintf(buf, n, "0");
}

int cg_cuda_matmul(CuKernel *k) { return cg_cuda_matmul_with(k, k->node, 0, 1, NULL, NULL); }

int cg_cuda_matmul_with(CuKernel *k, const IrNode *x, int ia, int ib, CuEpilogue epilogue, void *ctx)
{
    const IrNode *a = x->in[0];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    int tb = x->ia[0] != 0, r = x->rank;
    char M[CU_EXPR], N[CU_EXPR], K[CU_EXPR], batches[CU_EXPR];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    cu_dim(gen, a->shape[a->rank - 1], K, sizeof K);
    cu_dims_prod(gen, x->shape, 0, r - 2, batches, sizeof batches);
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float As[%d][%d + 4]; /* [k][m]: A's tile, transposed */\n", KT, TILE);
    fprintf(f, "    __shared__ float Bs[%d][%d + 4]; /* [k][n] */\n", KT, TILE);
    fprintf(f, "    const i64 M = %s, N = %s, K = %s, batches = %s;\n", M, N, K, batches);
    fprintf(f, "    const i64 tiles_n = (N + %d) / %d, tiles = (M + %d) / %d * tiles_n;\n", TILE - 1, TILE, TILE - 1,
            TILE);
    fprintf(f, "    const int tx = threadIdx.x %% 16, ty = threadIdx.x / 16;\n");
    fprintf(f, "    for (i64 batch = blockIdx.y; batch < batches; batch += gridDim.y) {\n");
    /* the batch index, split into the output's batch dims */
    if (r == 3) {
        fprintf(f, "        const i64 ix0 = batch;\n");
    } else if (r > 3) {
        fprintf(f, "        i64 rest = batch;\n");
        for (int d = r - 3; d >= 1; d--) {
            char size[CU_EXPR];
            cu_dim(gen, x->shape[d], size, sizeof size);
            fprintf(f, "        const i64 ix%d = rest %% %s%s%s;\n", d, po(size), size, pc(size));
            fprintf(f, "        rest /= %s%s%s;\n", po(size), size, pc(size));
        }
        fprintf(f, "        const i64 ix0 = rest;\n");
    }
    char offa[1024], offb[1024];
    batch_offset(k, x, x->in[0], offa, sizeof offa);
    batch_offset(k, x, x->in[1], offb, sizeof offb);
    for (int d = 0; d < r - 2; d++)
        fprintf(f, "        (void)ix%d;\n", d);
    /* the kernel's operands in<ia>, in<ib> (x may be a matmul inside a fused program) */
    const char *ta = cu_mem_type(k->node->in[ia]), *tb_ = cu_mem_type(k->node->in[ib]);
    if (strcmp(offa, "0") == 0)
        fprintf(f, "        const %s *A = in%d;\n", ta, ia);
    else
        fprintf(f, "        const %s *A = in%d + %s;\n", ta, ia, offa);
    if (strcmp(offb, "0") == 0)
        fprintf(f, "        const %s *B = in%d;\n", tb_, ib);
    else
        fprintf(f, "        const %s *B = in%d + %s;\n", tb_, ib, offb);
    fprintf(f, "        %s *C = out + batch * M * N;\n", cu_mem_type(k->node));
    fprintf(f, "        for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n");
    fprintf(f, "            const i64 m0 = tile / tiles_n * %d, n0 = tile %% tiles_n * %d;\n", TILE, TILE);
    fprintf(f, "            float acc[4][4] = {{0.0f}};\n");
    fprintf(f, "            for (i64 k0 = 0; k0 < K; k0 += %d) {\n", KT);
    fprintf(f, "                for (int e = threadIdx.x; e < %d * %d; e += %d) { /* A[m0 .. +%d, k0 .. +%d] */\n", TILE,
            KT, THREADS, TILE, KT);
    fprintf(f, "                    const int tr = e / %d, tc = e %% %d;\n", KT, KT);
    fprintf(f, "                    As[tc][tr] = m0 + tr < M && k0 + tc < K ? xtc_ld(A, (m0 + tr) * K + k0 + tc) : 0.0f;\n");
    fprintf(f, "                }\n");
    if (!tb) {
        fprintf(f, "                for (int e = threadIdx.x; e < %d * %d; e += %d) { /* B[k0 .. +%d, n0 .. +%d] */\n",
                KT, TILE, THREADS, KT, TILE);
        fprintf(f, "                    const int tr = e / %d, tc = e %% %d;\n", TILE, TILE);
        fprintf(f, "                    Bs[tr][tc] = k0 + tr < K && n0 + tc < N ? xtc_ld(B, (k0 + tr) * N + n0 + tc) : 0.0f;\n");
    } else {
        fprintf(f, "                for (int e = threadIdx.x; e < %d * %d; e += %d) { /* B[n0 .. +%d, k0 .. +%d] */\n",
                TILE, KT, THREADS, TILE, KT);
        fprintf(f, "                    const int tr = e / %d, tc = e %% %d;\n", KT, KT);
        fprintf(f, "                    Bs[tc][tr] = n0 + tr < N && k0 + tc < K ? xtc_ld(B, (n0 + tr) * K + k0 + tc) : 0.0f;\n");
    }
    fprintf(f, "                }\n");
    fprintf(f, "                __syncthreads();\n");
    fprintf(f, "                for (int kk = 0; kk < %d; kk++) {\n", KT);
    fprintf(f, "                    float av[4], bv[4];\n");
    fprintf(f, "                    for (int q = 0; q < 4; q++) {\n");
    fprintf(f, "                        av[q] = As[kk][ty + 16 * q];\n");
    fprintf(f, "                        bv[q] = Bs[kk][tx + 16 * q];\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                    for (int q = 0; q < 4; q++)\n");
    fprintf(f, "                        for (int w = 0; w < 4; w++)\n");
    fprintf(f, "                            acc[q][w] += av[q] * bv[w];\n");
    fprintf(f, "                }\n");
    fprintf(f, "                __syncthreads(); /* before the next tiles overwrite As and Bs */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            for (int q = 0; q < 4; q++)\n");
    fprintf(f, "                for (int w = 0; w < 4; w++) {\n");
    fprintf(f, "                    const i64 row = m0 + ty + 16 * q, col = n0 + tx + 16 * w;\n");
    if (epilogue) {
        fprintf(f, "                    if (row < M && col < N) {\n");
        fprintf(f, "                        const float mm = acc[q][w];\n");
        if (epilogue(ctx, k, "                        ") < 0)
            return -1;
        fprintf(f, "                    }\n");
    } else {
        fprintf(f, "                    if (row < M && col < N)\n");
        fprintf(f, "                        xtc_st(C, row * N + col, acc[q][w]);\n");
    }
    fprintf(f, "                }\n");
    fprintf(f, "        }\n    }\n");
    cu_kernel_end(k);
    char tm[2 * CU_EXPR], tn[2 * CU_EXPR];
    cu_ceil_div(M, TILE, tm, sizeof tm);
    cu_ceil_div(N, TILE, tn, sizeof tn);
    snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "(%s) * (%s)", tm, tn);
    snprintf(k->geom.grid_y, sizeof k->geom.grid_y, "%s", batches);
    k->geom.block = THREADS;
    return 0;
}
