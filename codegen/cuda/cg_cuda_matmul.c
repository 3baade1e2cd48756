/* cg_cuda_matmul.c: matrix multiplication on the GPU, C[.., M, N] = A[.., M, K] x B[.., K, N]
 * (B given as [.., N, K] with transpose_b), batch dimensions broadcast.
 *
 * Without tensor cores, shared-memory tiling with register blocking, blocks of 256 threads in one
 * of two shapes chosen at run time from M and N (f32_tiles): 64 x 64 tiles of C, each thread a
 * 4 x 4 grid of it, k 16 per stage; or, when there are at least LARGE_MIN tiles of 128 x 128,
 * those, each thread an 8 x 8 grid, k 8 per stage (a quarter of the blocks, each reading half as
 * much per product; the small tiles keep small products spread over the whole GPU). A thread's
 * rows and columns are runs of 4 contiguous ones, so that one k step reads each operand from
 * shared memory with 128-bit loads (xtc_lds4). K advances through two shared buffers: the next
 * stage's operand tiles are read from global memory into registers while the current stage's
 * products run, then stored to the other buffer, one barrier a stage. Tiles are stored [k][m]
 * and [k][n] (zero past the edges, so ragged sizes need no other care), rows padded by 4 floats.
 * Tiles are x (a grid-stride loop), batch matrices y. A fused program whose first step is the
 * matmul (bias, activation, residual) replaces the store of C by its epilogue (cg_cuda_fused.c),
 * which reads mm, the product at (batch, row, col).
 *
 * Views (cg_plan.h; a plain matmul step's, cu_matmul_views): with CG_VIEW_A_T, A is the permute's
 * operand read in place, stored [.., K, M] (element (i, p) at p M + i): its tiles are staged
 * along m as B's are along n. With CG_VIEW_SUM_B too the batch is folded into the reduction:
 * operands [b, k, m] and [b, k, n] are contiguous [b k, m] and [b k, n] rows, so the kernel runs
 * one product with K = b k (batches = 1) and writes the sum over the batch as C.
 *
 * With tensor cores (CgOptions.mma, bf16 or fp16 operands, f32 sums) the block is 4 warps (128
 * threads) over a 64 x 64 tile of C, each warp a 32 x 32 quarter of it as 2 x 4 products of
 * mma.m16n8k16 (the prelude's xtc_mma_m16n8k16_*, whose fragment layout is the PTX ISA's). K
 * advances MKT (32) at a time: the block converts A[64 x 32] and B[32 x 64] to 16-bit pairs in
 * shared memory, As[m][k / 2] and Bs[n][k / 2] (zero past the edges), laid out so that each
 * fragment register is one 32-bit word: a lane's a0 is As[row g][k pair t], its b0 Bs[col g][k
 * pair t]. Rows are padded to 20 words so that a warp's fragment loads hit 32 different banks.
 * Every read of the operands in global memory is in stage_operand, through one load expression
 * (operand_load: xtc_ld), so that with 16-bit storage of the same format the staging is a load
 * of the stored value, rounded exactly once (when it was stored). The epilogues, batches, transposes
 * and ragged edges are those of the f32 kernel. */
#include "cg_cuda.h"

#include <string.h>

#define TILE 64      /* the tile of the launch geometry and of the tensor-core kernel */
#define THREADS 256
#define STAGE 4      /* elements of each operand's tile a thread stages, in both f32 shapes */
#define LARGE_MIN 256 /* f32: 128 x 128 tiles from this many of them */

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

static int matmul_mma(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx);

unsigned cu_matmul_views(const CuKernel *k, const IrNode *x)
{
    return k->k && k->node == x ? k->k->views & (CG_VIEW_A_T | CG_VIEW_SUM_B) : 0;
}

void cu_matmul_batches(const CuKernel *k, const IrNode *x, char *buf, size_t n)
{
    if (cu_matmul_views(k, x) & CG_VIEW_SUM_B)
        snprintf(buf, n, "1");
    else
        cu_dims_prod(k->gen, x->shape, 0, x->rank - 2, buf, n);
}

int cg_cuda_matmul(CuKernel *k) { return cg_cuda_matmul_with(k, k->node, 0, 1, 1, NULL, NULL); }

/* A split product (parts = 2, a GLU epilogue): a tile covers half as many output columns, from
 * n0, and its column v (an expression) holds the product's half (v / R) % 2 at output column
 * oc = n0 + v / 2R * R + v % R. R is chosen per kernel shape so that a thread's columns come in
 * pairs R apart, the same output column of the two halves: the epilogue has both in registers.
 * Writes oc and the product's column (half * Nout + oc). */
static void split_col(const char *v, int R, char *oc, size_t on, char *col, size_t cn)
{
    snprintf(oc, on, "n0 + (%s) / %d * %d + (%s) %% %d", v, 2 * R, R, v, R);
    snprintf(col, cn, "(%s) / %d %% 2 * Nout + n0 + (%s) / %d * %d + (%s) %% %d", v, R, v, 2 * R, R, v, R);
}

/* The sizes and the loop over batch matrices, down to the pointers A, B and C of the batch;
 * leaves the loop open. */
void cu_matmul_prologue(CuKernel *k, const IrNode *x, int ia, int ib, int parts)
{
    const IrNode *a = x->in[0];
    CuGen *gen = k->gen;
    FILE *f = k->f;
    int r = x->rank;
    char M[CU_EXPR], N[CU_EXPR], K[CU_EXPR], batches[CU_EXPR];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    if (cu_matmul_views(k, x) & CG_VIEW_SUM_B) /* [b, k, m]^T x [b, k, n]: one product over the b k rows */
        cu_dims_prod(gen, a->in[0]->shape, 0, 2, K, sizeof K);
    else
        cu_dim(gen, a->shape[a->rank - 1], K, sizeof K);
    cu_matmul_batches(k, x, batches, sizeof batches);
    fprintf(f, "    const i64 M = %s, N = %s, K = %s, batches = %s;\n", M, N, K, batches);
    if (parts == 2)
        fprintf(f, "    const i64 Nout = N / 2; /* the output's columns: the product's halves side by side */\n");
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
    fprintf(f, "        %s *C = out + batch * M * %s;\n", cu_matmul_views(k, x) ? cu_out_type(k->k) : cu_mem_type(k->node),
            parts == 2 ? "Nout" : "N");
}

/* The launch: tiles along x, batch matrices along y. */
static void matmul_geometry(CuKernel *k, const IrNode *x, unsigned threads)
{
    CuGen *gen = k->gen;
    int r = x->rank;
    char M[CU_EXPR], N[CU_EXPR], batches[CU_EXPR];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    cu_matmul_batches(k, x, batches, sizeof batches);
    char tm[2 * CU_EXPR], tn[2 * CU_EXPR];
    cu_ceil_div(M, TILE, tm, sizeof tm);
    cu_ceil_div(N, TILE, tn, sizeof tn);
    snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "(%s) * (%s)", tm, tn);
    snprintf(k->geom.grid_y, sizeof k->geom.grid_y, "%s", batches);
    k->geom.block = threads;
}

/* What becomes of the product value (an expression) at C[row, col] (both in range): the
 * epilogue's code, or the store. */
int cu_matmul_store(CuKernel *k, CuEpilogue epilogue, void *ctx, const char *value, const char *value1,
                        const char *indent)
{
    FILE *f = k->f;
    if (!epilogue) {
        fprintf(f, "%sxtc_st(C, row * N + col, %s);\n", indent, value);
        return 0;
    }
    char inner[64];
    snprintf(inner, sizeof inner, "%s    ", indent);
    fprintf(f, "%s{\n%s    const float mm = %s;\n", indent, indent, value);
    if (value1) /* a split product: the same output column of its second half */
        fprintf(f, "%s    const float mm1 = %s;\n", indent, value1);
    if (epilogue(ctx, k, inner) < 0)
        return -1;
    fprintf(f, "%s}\n", indent);
    return 0;
}

/* The f32 kernel's two shapes (both 256 threads, tx = threadIdx.x % 16, ty = threadIdx.x / 16):
 * tile rows and columns, outputs per thread along each, k per stage. */
typedef struct {
    int tile, per, kt;
    const char *as, *bs; /* their shared arrays */
} F32Shape;

static const F32Shape shape_small = {64, 4, 16, "As", "Bs"};
static const F32Shape shape_large = {128, 8, 8, "Al", "Bl"};
_Static_assert(64 * 16 == STAGE * THREADS && 128 * 8 == STAGE * THREADS, "each thread stages STAGE elements");

/* One stage's share of the operand tiles, global memory to registers: ra[i] = A[m0 + tr, kz + tc]
 * for the thread's STAGE elements of A's tile x kt (e = threadIdx.x + THREADS i, tr = e / kt, tc =
 * e % kt: a warp reads rows of kt contiguous floats; A read transposed, ta, stored [K][M]: tr = e %
 * tile along m, e / tile along k), rb[i] likewise from B's tile (transposed B the same walk over
 * n; else tr = e / tile along k, tc = e % tile along n); zero past the edges. */
static void stage_load(FILE *f, const F32Shape *sh, int tb, int ta, int R, const char *kz, const char *at)
{
    fprintf(f, "%sfor (int i = 0; i < %d; i++) { /* the stage from k = %s */\n", at, STAGE, kz);
    fprintf(f, "%s    const int e = threadIdx.x + %d * i;\n", at, THREADS);
    if (ta) {
        fprintf(f, "%s    const i64 ak = %s + e / %d, am = m0 + e %% %d;\n", at, kz, sh->tile, sh->tile);
        fprintf(f, "%s    ra[i] = ak < K && am < M ? xtc_ld(A, ak * M + am) : 0.0f;\n", at);
    }
    if (!ta || tb)
        fprintf(f, "%s    const i64 tr = e / %d, tc = %s + e %% %d;\n", at, sh->kt, kz, sh->kt);
    if (!ta)
        fprintf(f, "%s    ra[i] = m0 + tr < M && tc < K ? xtc_ld(A, (m0 + tr) * K + tc) : 0.0f;\n", at);
    char oc[256], col[256];
    if (tb && R) {
        split_col("tr", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "%s    rb[i] = %s < Nout && tc < K ? xtc_ld(B, (%s) * K + tc) : 0.0f;\n", at, oc, col);
    } else if (tb) {
        fprintf(f, "%s    rb[i] = n0 + tr < N && tc < K ? xtc_ld(B, (n0 + tr) * K + tc) : 0.0f;\n", at);
    } else if (R) {
        split_col("v", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "%s    const i64 gk = %s + e / %d, v = e %% %d;\n", at, kz, sh->tile, sh->tile);
        fprintf(f, "%s    rb[i] = gk < K && %s < Nout ? xtc_ld(B, gk * N + %s) : 0.0f;\n", at, oc, col);
    } else {
        fprintf(f, "%s    const i64 gk = %s + e / %d, gr = n0 + e %% %d;\n", at, kz, sh->tile, sh->tile);
        fprintf(f, "%s    rb[i] = gk < K && gr < N ? xtc_ld(B, gk * N + gr) : 0.0f;\n", at);
    }
    fprintf(f, "%s}\n", at);
}

/* ... and registers to the shared buffer `buf`, both tiles stored [k][m or n] */
static void stage_store(FILE *f, const F32Shape *sh, int tb, int ta, const char *buf, const char *at)
{
    fprintf(f, "%sfor (int i = 0; i < %d; i++) {\n", at, STAGE);
    fprintf(f, "%s    const int e = threadIdx.x + %d * i;\n", at, THREADS);
    if (ta)
        fprintf(f, "%s    %s[%s][e / %d][e %% %d] = ra[i];\n", at, sh->as, buf, sh->tile, sh->tile);
    else
        fprintf(f, "%s    %s[%s][e %% %d][e / %d] = ra[i];\n", at, sh->as, buf, sh->kt, sh->kt);
    if (tb)
        fprintf(f, "%s    %s[%s][e %% %d][e / %d] = rb[i];\n", at, sh->bs, buf, sh->kt, sh->kt);
    else
        fprintf(f, "%s    %s[%s][e / %d][e %% %d] = rb[i];\n", at, sh->bs, buf, sh->tile, sh->tile);
    fprintf(f, "%s}\n", at);
}

/* The tile loop of one shape, for the batch's A, B and C. Thread (tx, ty) computes rows
 * q / 4 * tile / 2 + ty * 4 + q % 4 and columns w / 4 * tile / 2 + tx * 4 + w % 4 of the tile
 * (q, w < per): a k step is per / 2 128-bit loads of each operand from shared memory (a warp's
 * reads of A share 2 addresses, its reads of B are 256 contiguous bytes) for per x per fused
 * multiply-adds. The next stage's tiles are read from global memory into registers while the
 * current stage's products run, then stored to the other buffer: one barrier a stage. */
static int f32_tiles(CuKernel *k, const F32Shape *sh, int tb, int ta, int parts, CuEpilogue epilogue, void *ctx)
{
    FILE *f = k->f;
    int t = sh->tile, per = sh->per, half = sh->tile / 2;
    /* split: a thread's columns are runs of 4 (small tiles: pairs 2 apart) or two runs half a
     * tile apart (large: pairs 64 apart) */
    int R = parts == 2 ? (per == 4 ? 2 : half) : 0, tw = R ? half : t; /* output columns per tile */
    fprintf(f, "            const i64 tn = (%s + %d) / %d, nt = (M + %d) / %d * tn;\n", R ? "Nout" : "N", tw - 1, tw, t - 1, t);
    fprintf(f, "            for (i64 tile = blockIdx.x; tile < nt; tile += gridDim.x) {\n");
    fprintf(f, "                const i64 m0 = tile / tn * %d, n0 = tile %% tn * %d;\n", t, tw);
    fprintf(f, "                float acc[%d][%d], ra[%d], rb[%d];\n", per, per, STAGE, STAGE);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int q = 0; q < %d; q++)\n", per);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int w = 0; w < %d; w++)\n", per);
    fprintf(f, "                        acc[q][w] = 0.0f;\n");
    stage_load(f, sh, tb, ta, R, "0", "                ");
    stage_store(f, sh, tb, ta, "0", "                ");
    fprintf(f, "                __syncthreads();\n");
    fprintf(f, "                for (i64 k0 = 0; k0 < K; k0 += %d) {\n", sh->kt);
    fprintf(f, "                    const int cur = (int)(k0 / %d %% 2), more = k0 + %d < K;\n", sh->kt, sh->kt);
    fprintf(f, "                    if (more) { /* the next stage's loads, in flight during this one's products */\n");
    char kz[32];
    snprintf(kz, sizeof kz, "k0 + %d", sh->kt);
    stage_load(f, sh, tb, ta, R, kz, "                        ");
    fprintf(f, "                    }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int kk = 0; kk < %d; kk++) {\n", sh->kt);
    fprintf(f, "                        float av[%d], bv[%d];\n", per, per);
    for (int h = 0; h < per / 4; h++) {
        fprintf(f, "                        xtc_lds4(av + %d, &%s[cur][kk][%d + ty * 4]);\n", 4 * h, sh->as, h * half);
        fprintf(f, "                        xtc_lds4(bv + %d, &%s[cur][kk][%d + tx * 4]);\n", 4 * h, sh->bs, h * half);
    }
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int q = 0; q < %d; q++)\n", per);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                            for (int w = 0; w < %d; w++)\n", per);
    fprintf(f, "                                acc[q][w] += av[q] * bv[w];\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                    if (more) {\n");
    stage_store(f, sh, tb, ta, "cur ^ 1", "                        ");
    fprintf(f, "                    }\n");
    fprintf(f, "                    __syncthreads();\n");
    fprintf(f, "                }\n");
    /* unrolled, so that acc stays in registers however long the epilogue */
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int q = 0; q < %d; q++)\n", per);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int w = 0; w < %d; w++) {\n", R ? per / 2 : per);
    if (R) { /* the first half's columns; the second's are per / 2 further in acc */
        char oc[256], col[256], partner[32];
        split_col("v", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "                        const int v = w / 4 * %d + tx * 4 + w %% 4;\n", half);
        fprintf(f, "                        const i64 row = m0 + q / 4 * %d + ty * 4 + q %% 4, col = %s;\n", half, oc);
        fprintf(f, "                        if (row < M && col < Nout)\n");
        snprintf(partner, sizeof partner, "acc[q][w + %d]", per / 2);
        if (cu_matmul_store(k, epilogue, ctx, "acc[q][w]", partner, "                            ") < 0)
            return -1;
    } else {
        fprintf(f, "                        const i64 row = m0 + q / 4 * %d + ty * 4 + q %% 4, col = n0 + w / 4 * %d + tx * 4 + w %% 4;\n",
                half, half);
        fprintf(f, "                        if (row < M && col < N)\n");
        if (cu_matmul_store(k, epilogue, ctx, "acc[q][w]", NULL, "                            ") < 0)
            return -1;
    }
    fprintf(f, "                    }\n");
    fprintf(f, "            }\n");
    return 0;
}

/* Whether the large tiles are used: when there are at least LARGE_MIN of them, enough blocks to
 * fill a big GPU a few times over; fewer, larger tiles would leave its SMs idle. */
static void large_test(char *buf, size_t n, const char *M, const char *N)
{
    char tm[2 * CU_EXPR], tn[2 * CU_EXPR];
    cu_ceil_div(M, shape_large.tile, tm, sizeof tm);
    cu_ceil_div(N, shape_large.tile, tn, sizeof tn);
    snprintf(buf, n, "(%s) * (%s) >= %d", tm, tn, LARGE_MIN);
}

int cg_cuda_matmul_with(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx)
{
    if (parts == 2 && !epilogue)
        return cu_error(k->gen, "a split matmul needs an epilogue");
    if (k->gen->mma != CG_MMA_OFF) /* operands stored in the mma's format: cg_cuda_matmul_mma.c */
        return cg_cuda_mma16_fits(k, ia, ib) ? cg_cuda_matmul_mma16(k, x, ia, ib, parts, epilogue, ctx)
                                             : matmul_mma(k, x, ia, ib, parts, epilogue, ctx);
    FILE *f = k->f;
    int tb = x->ia[IR_IA_TRANSPOSE_B] != 0, ta = (cu_matmul_views(k, x) & CG_VIEW_A_T) != 0;
    k->sync = 1;
    /* two blocks resident per SM: the registers capped at 128 a thread (the large tiles' 64
     * accumulators fit; uncapped, the compiler takes ~167 and one block runs per SM) */
    k->bound_threads = THREADS;
    k->bound_blocks = 2;
    cu_kernel_begin(k);
    /* rows padded by 4 floats: a warp's stage stores spread over the banks, and rows stay 16-byte
     * aligned for xtc_lds4 */
    const F32Shape *shapes[2] = {&shape_small, &shape_large};
    int smem = CU_SMEM_STATIC; /* what the tiles leave */
    for (int s = 0; s < 2; s++) {
        const F32Shape *sh = shapes[s];
        fprintf(f, "    __shared__ XTC_ALIGN16 float %s[2][%d][%d + 4]; /* [stage][k][m]: A's %d-tile, transposed */\n",
                sh->as, sh->kt, sh->tile, sh->tile);
        fprintf(f, "    __shared__ XTC_ALIGN16 float %s[2][%d][%d + 4]; /* [stage][k][n] */\n", sh->bs, sh->kt, sh->tile);
        smem -= 2 * 2 * sh->kt * (sh->tile + 4) * 4;
    }
    fprintf(f, "    const int tx = threadIdx.x %% 16, ty = threadIdx.x / 16;\n");
    cu_matmul_prologue(k, x, ia, ib, parts);
    if (cg_cuda_gemv(k, x, ia, ib, parts, epilogue, ctx, THREADS, smem) < 0)
        return -1;
    char big[6 * CU_EXPR];
    large_test(big, sizeof big, "M", "N");
    fprintf(f, "        if (%s) {\n", big);
    if (f32_tiles(k, &shape_large, tb, ta, parts, epilogue, ctx) < 0)
        return -1;
    fprintf(f, "        } else {\n");
    if (f32_tiles(k, &shape_small, tb, ta, parts, epilogue, ctx) < 0)
        return -1;
    fprintf(f, "        }\n    }\n");
    cu_kernel_end(k);
    matmul_geometry(k, x, THREADS);
    /* the large shape needs a quarter of the blocks */
    CuGen *gen = k->gen;
    int r = x->rank;
    char M[CU_EXPR], N[CU_EXPR], tm[2 * CU_EXPR], tn[2 * CU_EXPR], grid[16 * CU_EXPR];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    large_test(big, sizeof big, M, N);
    cu_ceil_div(M, shape_large.tile, tm, sizeof tm);
    cu_ceil_div(N, shape_large.tile, tn, sizeof tn);
    size_t len = (size_t)snprintf(grid, sizeof grid, "(%s) ? (%s) * (%s) : %s", big, tm, tn, k->geom.grid_x);
    if (len < sizeof k->geom.grid_x) /* else the small tiles' grid, which the grid-stride loop also covers */
        memcpy(k->geom.grid_x, grid, len + 1);
    cg_cuda_gemv_geometry(k, x, parts, THREADS, smem);
    return k->gen->err[0] ? -1 : 0;
}

/* ---- tensor cores ---- */

#define MKT 32                    /* k per stage: two mma k-steps of 16 */
#define MPAIRS (MKT / 2)          /* 16-bit pairs per tile row */
#define MSTRIDE (MPAIRS + 4)      /* words per row in shared memory: conflict-free fragment loads */
#define MTHREADS 128              /* 4 warps, 2 x 2 over the tile, 32 x 32 each */

/* The one expression that reads an operand element in global memory as a float: xtc_ld, the
 * storage's load. With 16-bit storage of the operand's format the value is exact in it, so the
 * packing below rounds nothing: the operand is rounded once, when it was stored. */
static char *operand_load(const char *src, const char *index, char *buf, size_t n)
{
    snprintf(buf, n, "xtc_ld(%s, %s)", src, index);
    return buf;
}

/* The copy of one operand's tile into shared memory, 16-bit pairs along k: dst[r][p] holds the
 * operand at (tile row r, k0 + 2p) and (r, k0 + 2p + 1), zero outside. rows: the operand's size
 * along the tile (M or N), first its tile origin (m0 or n0); k_inner: the operand is stored
 * [rows][K] (A; B transposed), else [K][rows] (B), whose pairs then come from two rows. The
 * threads of a warp walk the direction that is contiguous in global memory. */
static void stage_operand(CuKernel *k, const char *dst, const char *src, const char *rows, const char *first,
                          int k_inner, int R)
{
    FILE *f = k->f;
    const char *pack = k->gen->mma == CG_MMA_FP16 ? "xtc_pack_f16x2" : "xtc_pack_bf16x2";
    fprintf(f, "                for (int e = threadIdx.x; e < %d * %d; e += %d) {\n", TILE, MPAIRS, MTHREADS);
    if (k_inner)
        fprintf(f, "                    const int tr = e / %d, tc = e %% %d; /* tile row, k pair */\n", MPAIRS, MPAIRS);
    else
        fprintf(f, "                    const int tr = e %% %d, tc = e / %d; /* tile row, k pair */\n", TILE, TILE);
    if (R) { /* B of a split product: tile column tr is the product's column gr (split_col) */
        char oc[256], col[256];
        split_col("tr", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "                    const i64 oc = %s, gr = %s, gk = k0 + 2 * tc;\n", oc, col);
        fprintf(f, "                    float lo = 0.0f, hi = 0.0f;\n");
        fprintf(f, "                    if (oc < Nout) {\n");
    } else {
        fprintf(f, "                    const i64 gr = %s + tr, gk = k0 + 2 * tc;\n", first);
        fprintf(f, "                    float lo = 0.0f, hi = 0.0f;\n");
        fprintf(f, "                    if (gr < %s) {\n", rows);
    }
    char lo_at[CU_EXPR], hi_at[CU_EXPR], load[2 * CU_EXPR];
    if (k_inner) {
        snprintf(lo_at, sizeof lo_at, "gr * K + gk");
        snprintf(hi_at, sizeof hi_at, "gr * K + gk + 1");
    } else {
        snprintf(lo_at, sizeof lo_at, "gk * %s + gr", rows);
        snprintf(hi_at, sizeof hi_at, "(gk + 1) * %s + gr", rows);
    }
    fprintf(f, "                        if (gk < K)\n");
    fprintf(f, "                            lo = %s;\n", operand_load(src, lo_at, load, sizeof load));
    fprintf(f, "                        if (gk + 1 < K)\n");
    fprintf(f, "                            hi = %s;\n", operand_load(src, hi_at, load, sizeof load));
    fprintf(f, "                    }\n");
    fprintf(f, "                    %s[tr][tc] = %s(lo, hi);\n", dst, pack);
    fprintf(f, "                }\n");
}

static int matmul_mma(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx)
{
    FILE *f = k->f;
    int tb = x->ia[IR_IA_TRANSPOSE_B] != 0, ta = (cu_matmul_views(k, x) & CG_VIEW_A_T) != 0;
    const char *mma = k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16";
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    /* tensor cores: operands in %s, sums in f32 */\n", k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16");
    fprintf(f, "    __shared__ unsigned As[%d][%d]; /* [m][k pair]: A's tile in 16-bit pairs */\n", TILE, MSTRIDE);
    fprintf(f, "    __shared__ unsigned Bs[%d][%d]; /* [n][k pair] */\n", TILE, MSTRIDE);
    fprintf(f, "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n");
    fprintf(f, "    const int g = lane / 4, t = lane %% 4; /* the fragment coordinates of the lane */\n");
    fprintf(f, "    const int wm = warp / 2 * 32, wn = warp %% 2 * 32; /* the warp's quarter of the tile */\n");
    cu_matmul_prologue(k, x, ia, ib, parts);
    const int smem = CU_SMEM_STATIC - 2 * TILE * MSTRIDE * 4; /* what As and Bs leave */
    if (cg_cuda_gemv(k, x, ia, ib, parts, epilogue, ctx, MTHREADS, smem) < 0)
        return -1;
    /* split: a warp's columns 8 j + 2 t (+ 1), j < 4, pair up 16 apart */
    int R = parts == 2 ? 16 : 0, tw = R ? TILE / 2 : TILE;
    fprintf(f, "        const i64 tiles_n = (%s + %d) / %d, tiles = (M + %d) / %d * tiles_n;\n", R ? "Nout" : "N", tw - 1, tw,
            TILE - 1, TILE);
    fprintf(f, "        for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n");
    fprintf(f, "            const i64 m0 = tile / tiles_n * %d, n0 = tile %% tiles_n * %d;\n", TILE, tw);
    fprintf(f, "            float acc[2][4][4]; /* [16-row block][8-column block][the mma's d] */\n");
    fprintf(f, "            for (int i = 0; i < 2; i++)\n");
    fprintf(f, "                for (int j = 0; j < 4; j++)\n");
    fprintf(f, "                    for (int q = 0; q < 4; q++)\n");
    fprintf(f, "                        acc[i][j][q] = 0.0f;\n");
    fprintf(f, "            for (i64 k0 = 0; k0 < K; k0 += %d) {\n", MKT);
    stage_operand(k, "As", "A", "M", "m0", !ta, 0); /* A read transposed (ta): stored [K][M] */
    stage_operand(k, "Bs", "B", "N", "n0", tb, R);
    fprintf(f, "                __syncthreads();\n");
    fprintf(f, "                for (int kp = 0; kp < %d; kp += 8) { /* k pairs kp .. kp + 7: one mma k-step */\n",
            MPAIRS);
    fprintf(f, "                    unsigned af[2][4], bf[4][2];\n");
    fprintf(f, "                    for (int i = 0; i < 2; i++) {\n");
    fprintf(f, "                        const int rw = wm + 16 * i + g;\n");
    fprintf(f, "                        af[i][0] = As[rw][kp + t];\n");
    fprintf(f, "                        af[i][1] = As[rw + 8][kp + t];\n");
    fprintf(f, "                        af[i][2] = As[rw][kp + t + 4];\n");
    fprintf(f, "                        af[i][3] = As[rw + 8][kp + t + 4];\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                    for (int j = 0; j < 4; j++) {\n");
    fprintf(f, "                        bf[j][0] = Bs[wn + 8 * j + g][kp + t];\n");
    fprintf(f, "                        bf[j][1] = Bs[wn + 8 * j + g][kp + t + 4];\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                    for (int i = 0; i < 2; i++)\n");
    fprintf(f, "                        for (int j = 0; j < 4; j++)\n");
    fprintf(f, "                            %s(acc[i][j], af[i], bf[j], acc[i][j]);\n", mma);
    fprintf(f, "                }\n");
    fprintf(f, "                __syncthreads(); /* before the next tiles overwrite As and Bs */\n");
    fprintf(f, "            }\n");
    /* unrolled, so that acc stays in registers however long the epilogue (C ignores the pragma) */
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int i = 0; i < 2; i++)\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int j = 0; j < %d; j++)\n", R ? 2 : 4);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int q = 0; q < 4; q++) { /* d[q] = C[g + 8 (q / 2)][2t + q %% 2] */\n");
    fprintf(f, "                        const i64 row = m0 + wm + 16 * i + g + 8 * (q / 2);\n");
    if (R) { /* the first half's columns; the second's are in acc[i][j + 2] */
        char oc[256], col[256];
        split_col("v", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "                        const int v = wn + 8 * j + 2 * t + q %% 2;\n");
        fprintf(f, "                        const i64 col = %s;\n", oc);
        fprintf(f, "                        if (row < M && col < Nout)\n");
        if (cu_matmul_store(k, epilogue, ctx, "acc[i][j][q]", "acc[i][j + 2][q]", "                            ") < 0)
            return -1;
    } else {
        fprintf(f, "                        const i64 col = n0 + wn + 8 * j + 2 * t + q %% 2;\n");
        fprintf(f, "                        if (row < M && col < N)\n");
        if (cu_matmul_store(k, epilogue, ctx, "acc[i][j][q]", NULL, "                            ") < 0)
            return -1;
    }
    fprintf(f, "                    }\n");
    fprintf(f, "        }\n    }\n");
    cu_kernel_end(k);
    matmul_geometry(k, x, MTHREADS);
    cg_cuda_gemv_geometry(k, x, parts, MTHREADS, smem);
    return k->gen->err[0] ? -1 : 0;
}

/* ---- for cg_cuda_matmul_mma.c ---- */

void cu_matmul_split_col(const char *v, int R, char *oc, size_t on, char *col, size_t cn) { split_col(v, R, oc, on, col, cn); }
