/* cg_cuda_matmul_mma.c: the tensor-core matmul for operands stored in the mma's own 16-bit format
 * (--dtype bf16 with bf16 tensor cores, fp16 with fp16), C[.., M, N] = A[.., M, K] x B[.., K, N]
 * (B given as [.., N, K] with transpose_b), batch dimensions broadcast, every epilogue of the
 * f32 kernel (cg_cuda_matmul.c: matmul_prologue, split_col, matmul_store are shared with it).
 *
 * Blocks of 8 warps (256 threads), in one of two tile shapes chosen at run time from M, N and
 * the batch count (tile_large): 128 x 128 tiles of C, each warp 64 x 32 of it (4 x 4 products of
 * mma.m16n8k16), when there are at least LARGE_MIN of them (one per SM of an H100 or H200);
 * otherwise 64 x 64 tiles, each warp 32 x 16 (2 x 2 products), four times as many blocks.
 *
 * K advances KT (32) at a time through STAGES (3) shared buffers filled by cp.async: the copies
 * of stage s + 2 are issued while stage s is multiplied, one barrier a stage. Registers: blocks
 * are bounded to 2 an SM (128 registers a thread), which the large tiles' 64 sums and 24
 * fragment registers nearly fill; so the copies' addresses are recomputed each stage from an
 * opaque thread index (xtc_opaque: not hoisted out of the k loop into registers of their own)
 * and the stage slots are ints stepped with kb, not 64-bit remainders (GPT's kernels spilled
 * up to 28 bytes on sm_80 and sm_90 without these; test_cuda_nvrtc flash checks). The operands are
 * copied as stored, 8 values (16 bytes) a copy, into shared tiles of 16-bit values:
 *   A     [m][k], 4 chunks of 8 k a row (64 bytes), chunk c of row r at c ^ (r / 2 % 4)
 *   B^T   [n][k] (transpose_b: B stored [N, K]), the same layout
 *   B     [k][n], BN / 8 chunks a row, chunk c of row r at c ^ (r % 8)
 * The XOR swizzles put the 8 rows an ldmatrix reads (one chunk each) in 8 different groups of 4
 * banks, so the fragment loads are free of bank conflicts without padding (3 stages of the large
 * tiles fill the 48 KiB of static shared memory exactly). Fragments come by ldmatrix.x4 (.trans
 * for B stored [k][n]) in the PTX ISA's m16n8k16 layout, sums in f32.
 *
 * A 16-byte copy needs rows of a multiple of 8 values (K for A and B^T, N for B; Nout for B's
 * halves in a GLU split) and 16-byte aligned operand pointers. Known sizes decide at code
 * generation; the pointers (and symbolic sizes) at run time, in the kernel: where the copies are
 * not possible the same kernel fills the same tiles a value at a time (the stage's loads then
 * complete before its barrier). Past the edges of M, N and K the tiles hold zeros (cp.async's
 * src-size 0). Without an epilogue a lane's two neighbouring columns of C go out in one store
 * (xtc_st2) where the row length is even. Operands stored in f32 (f32 storage with --mma, or a
 * buffer that keeps f32) take cg_cuda_matmul.c's tensor-core kernel, which converts as it stages.
 *
 * A read transposed in place (CG_VIEW_A_T, cg_plan.h; cg_cuda_matmul.c's prologue folds the batch
 * into K under CG_VIEW_SUM_B): A stored [K][M] is copied as stored, as B is,
 *   A^T   [k][m], BM / 8 chunks a row, chunk c of row r at c ^ (r % 8)
 * and its fragments come by ldmatrix.x4.trans (stage_copy_at, a_frag_at); its copies need rows
 * of a multiple of 8 values along M instead of K. */
#include "cg_cuda.h"

#include <string.h>

#define THREADS 256   /* 8 warps: 2 along m by 4 along n */
#define KT 32         /* k per stage: two mma k-steps of 16 */
#define STAGES 3
#define LARGE_MIN 132 /* 128 x 128 tiles from this many (one per SM of an H100 / H200) */

typedef struct {
    int bm, bn; /* the tile of C */
    int mi, nj; /* a warp's 16-row and 8-column blocks: it covers 16 mi x 8 nj */
} Shape;

static const Shape shape_large = {128, 128, 4, 4};
static const Shape shape_small = {64, 64, 2, 2};
_Static_assert(128 == 2 * 16 * 4 && 128 == 4 * 8 * 4 && 64 == 2 * 16 * 2 && 64 == 4 * 8 * 2, "2 x 4 warps cover a tile");

/* Whether x's product (operands in<ia>, in<ib> of k) runs here: tensor cores on, and both operands
 * stored in the mma's 16-bit format. */
int cg_cuda_mma16_fits(const CuKernel *k, int ia, int ib)
{
    const CuGen *gen = k->gen;
    int want = gen->mma == CG_MMA_BF16 ? 1 : gen->mma == CG_MMA_FP16 ? 2 : 0;
    return want && gen->storage == want && strcmp(cu_mem_type(k->node->in[ia]), "xtc_fs") == 0 &&
           strcmp(cu_mem_type(k->node->in[ib]), "xtc_fs") == 0;
}

/* 16-byte copies: 0 never (known sizes whose rows are not multiples of 8), else 1 (the kernel's
 * `vec` decides at run time, pointers and symbolic sizes). ta: A read transposed, rows along M. */
static int copies_possible(const IrNode *x, int tb, int ta, int parts)
{
    const IrNode *a = x->in[0];
    IrDim K = a->shape[a->rank - 1], N = x->shape[x->rank - 1], M = x->shape[x->rank - 2];
    IrDim arow = ta ? M : K;
    if (ir_dim_is_const(arow) && ir_dim_eval(arow, NULL) % 8)
        return 0;
    if (tb && ir_dim_is_const(K) && ir_dim_eval(K, NULL) % 8)
        return 0;
    if (!tb && ir_dim_is_const(N) && ir_dim_eval(N, NULL) % (parts == 2 ? 16 : 8))
        return 0;
    return 1;
}

/* The swizzled element offset of chunk c (an expression) of row r in a tile of k-rows ([m][k],
 * [n][k]: 32 values a row) or of n-rows ([k][n]: bn values a row) */
static void chunk_at(char *buf, size_t n, int k_rows, int bn, const char *r, const char *c)
{
    if (k_rows)
        snprintf(buf, n, "(%s) * %d + ((%s) ^ ((%s) >> 1 & 3)) * 8", r, KT, c, r);
    else
        snprintf(buf, n, "(%s) * %d + ((%s) ^ ((%s) & 7)) * 8", r, bn, c, r);
}

/* One chunk's copy to dst (8 values) from element src of P: with vec (the kernel's run-time
 * choice) one cp.async when ok, else zeros; otherwise value u when ok_u */
static void copy_chunk(FILE *f, int vec, const char *P, const char *ok, const char *src, const char *ok_u,
                       const char *at)
{
    if (vec) {
        fprintf(f, "%sif (vec) {\n", at);
        fprintf(f, "%s    const int ok = %s;\n", at, ok);
        fprintf(f, "%s    xtc_cp_async16(dst, ok ? %s + (%s) : %s, ok ? 16 : 0);\n", at, P, src, P);
        fprintf(f, "%s} else\n", at);
    }
    fprintf(f, "%s    for (int u = 0; u < 8; u++)\n", at);
    fprintf(f, "%s        dst[u] = %s ? %s[%s + u] : 0;\n", at, ok_u, P, src);
}

/* The copies of one stage: k from kz into buffer slot, every thread its share of the chunks of
 * A's tile (bm x 32) and B's (32 x bn either way); with vec, cp.async where the kernel's vec
 * allows, else (and without vec) value by value. */
/* ... A's tile when A is read transposed (CG_VIEW_A_T), stored [K][M]: 32 rows (k) of bm / 8 chunks */
static void stage_copy_at(FILE *f, const Shape *sh, int vec, const char *slot, const char *kz, const char *at)
{
    char in[64], dst[256];
    int cpr = sh->bm / 8;
    snprintf(in, sizeof in, "%s    ", at);
    fprintf(f, "%sfor (int i = 0; i < %d; i++) { /* A^T[%s .., m0 ..] */\n", at, KT * cpr / THREADS, kz);
    fprintf(f, "%s    const int e = threadIdx.x + %d * i, r = e / %d, c = e %% %d;\n", at, THREADS, cpr, cpr);
    fprintf(f, "%s    const i64 gk = %s + r, gm = m0 + 8 * c;\n", at, kz);
    chunk_at(dst, sizeof dst, 0, sh->bm, "r", "c");
    fprintf(f, "%s    unsigned short *dst = &As[%s][%s];\n", at, slot, dst);
    copy_chunk(f, vec, "A", "gk < K && gm < M", "gk * M + gm", "gk < K && gm + u < M", in);
    fprintf(f, "%s}\n", at);
}

static void stage_copy(FILE *f, const Shape *sh, int tb, int ta, int R, int vec, const char *slot, const char *kz,
                       const char *at)
{
    char in[64], dst[256], ok[512], oku[512], src[512], oc[256], col[256];
    snprintf(in, sizeof in, "%s    ", at);
    if (ta) {
        stage_copy_at(f, sh, vec, slot, kz, at);
    } else { /* A: bm rows of 4 chunks */
        fprintf(f, "%sfor (int i = 0; i < %d; i++) { /* A[m0 .., %s ..] */\n", at, sh->bm * 4 / THREADS, kz);
        fprintf(f, "%s    const int e = (int)xtc_opaque(threadIdx.x) + %d * i, r = e >> 2, c = e & 3;\n", at, THREADS);
        fprintf(f, "%s    const i64 gr = m0 + r, gk = %s + 8 * c;\n", at, kz);
        chunk_at(dst, sizeof dst, 1, 0, "r", "c");
        fprintf(f, "%s    unsigned short *dst = &As[%s][%s];\n", at, slot, dst);
        copy_chunk(f, vec, "A", "gr < M && gk < K", "gr * K + gk", "gr < M && gk + u < K", in);
        fprintf(f, "%s}\n", at);
    }
    if (tb) { /* B^T: bn rows (n) of 4 chunks */
        fprintf(f, "%sfor (int i = 0; i < %d; i++) { /* B[n0 .., %s ..] */\n", at, sh->bn * 4 / THREADS, kz);
        fprintf(f, "%s    const int e = (int)xtc_opaque(threadIdx.x) + %d * i, r = e >> 2, c = e & 3;\n", at, THREADS);
        if (R) { /* tile row r: the product's column (split_col) */
            cu_matmul_split_col("r", R, oc, sizeof oc, col, sizeof col);
            fprintf(f, "%s    const i64 oc = %s, gr = %s, gk = %s + 8 * c;\n", at, oc, col, kz);
            snprintf(ok, sizeof ok, "oc < Nout && gk < K");
            snprintf(oku, sizeof oku, "oc < Nout && gk + u < K");
        } else {
            fprintf(f, "%s    const i64 gr = n0 + r, gk = %s + 8 * c;\n", at, kz);
            snprintf(ok, sizeof ok, "gr < N && gk < K");
            snprintf(oku, sizeof oku, "gr < N && gk + u < K");
        }
        chunk_at(dst, sizeof dst, 1, 0, "r", "c");
        snprintf(src, sizeof src, "gr * K + gk");
    } else { /* B: 32 rows (k) of bn / 8 chunks */
        int cpr = sh->bn / 8;
        fprintf(f, "%sfor (int i = 0; i < %d; i++) { /* B[%s .., n0 ..] */\n", at, KT * cpr / THREADS, kz);
        fprintf(f, "%s    const int e = (int)xtc_opaque(threadIdx.x) + %d * i, r = e / %d, c = e %% %d;\n", at, THREADS, cpr,
                cpr);
        if (R) { /* tile columns 8 c .. 8 c + 7: 8 consecutive columns of one half (R % 8 == 0) */
            cu_matmul_split_col("8 * c", R, oc, sizeof oc, col, sizeof col);
            fprintf(f, "%s    const i64 gk = %s + r, oc = %s, gn = %s;\n", at, kz, oc, col);
            snprintf(ok, sizeof ok, "gk < K && oc < Nout");
            snprintf(oku, sizeof oku, "gk < K && oc + u < Nout");
        } else {
            fprintf(f, "%s    const i64 gk = %s + r, gn = n0 + 8 * c;\n", at, kz);
            snprintf(ok, sizeof ok, "gk < K && gn < N");
            snprintf(oku, sizeof oku, "gk < K && gn + u < N");
        }
        chunk_at(dst, sizeof dst, 0, sh->bn, "r", "c");
        snprintf(src, sizeof src, "gk * N + gn");
    }
    fprintf(f, "%s    unsigned short *dst = &Bs[%s][%s];\n", at, slot, dst);
    copy_chunk(f, vec, "B", ok, src, oku, in);
    fprintf(f, "%s}\n", at);
}

/* A's fragments of the warp's 16-row block i at k-step ks from A^T's tile [k][m] (CG_VIEW_A_T),
 * transposed by ldmatrix: matrices (m +0..7, k +0..7), (m +8..15, k +0..7), (m +0..7, k +8..15),
 * (m +8..15, k +8..15), the a0 .. a3 of m16n8k16, each read as 8 rows of k of 8 values of m */
static void a_frag_at(FILE *f, int bm)
{
    char p[256];
    fprintf(f, "                            const int r = 16 * ks + (lane & 7) + (lane >> 4) * 8, c = (wm + 16 * i) / 8 + (lane >> 3 & 1);\n");
    chunk_at(p, sizeof p, 0, bm, "r", "c");
    fprintf(f, "                            xtc_ldmatrix_x4_trans(af[i], &As[cur][%s]);\n", p);
}

/* The tile loop of one shape for the batch's A, B and C. Warp w covers rows wm .. wm + 16 mi
 * and columns wn .. wn + 8 nj of the tile; its lane (g, t) ends with acc[i][j] = the mma's d of
 * rows wm + 16 i + g (+ 8) and columns wn + 8 j + 2 t (+ 1). */
static int tiles(CuKernel *k, const Shape *sh, int tb, int ta, int parts, int vec, CuEpilogue epilogue, void *ctx)
{
    FILE *f = k->f;
    const char *mma = k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16";
    int bm = sh->bm, bn = sh->bn, mi = sh->mi, nj = sh->nj;
    /* split: the warp's columns pair up R = 4 nj apart, j and j + nj / 2 (multiples of 8, so a
     * chunk of 8 tile columns is 8 consecutive columns of one half) */
    int R = parts == 2 ? 4 * nj : 0, tw = R ? bn / 2 : bn;
    fprintf(f, "            const int wm = warp / 4 * %d, wn = warp %% 4 * %d; /* the warp's part of the tile */\n",
            16 * mi, 8 * nj);
    fprintf(f, "            const i64 tiles_n = (%s + %d) / %d, tiles = (M + %d) / %d * tiles_n, kt = (K + %d) / %d;\n",
            R ? "Nout" : "N", tw - 1, tw, bm - 1, bm, KT - 1, KT);
    fprintf(f, "            for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n");
    fprintf(f, "                const i64 m0 = tile / tiles_n * %d, n0 = tile %% tiles_n * %d;\n", bm, tw);
    fprintf(f, "                float acc[%d][%d][4];\n", mi, nj);
    fprintf(f, "#pragma unroll\n                for (int i = 0; i < %d; i++)\n", mi);
    fprintf(f, "#pragma unroll\n                    for (int j = 0; j < %d; j++)\n", nj);
    fprintf(f, "#pragma unroll\n                        for (int q = 0; q < 4; q++)\n");
    fprintf(f, "                            acc[i][j][q] = 0.0f;\n");
    fprintf(f, "                for (int s = 0; s < %d; s++) { /* the first stages in flight */\n", STAGES - 1);
    fprintf(f, "                    if (s < kt) {\n");
    stage_copy(f, sh, tb, ta, R, vec, "s", "(i64)s * 32", "                        ");
    fprintf(f, "                    }\n");
    fprintf(f, "                    xtc_cp_async_commit();\n");
    fprintf(f, "                }\n");
    /* the stage slots as ints stepped with kb (no 64-bit remainders in the loop) */
    fprintf(f, "                int cur = 0; /* kb's slot */\n");
    fprintf(f, "                for (i64 kb = 0; kb < kt; kb++, cur = cur == %d ? 0 : cur + 1) {\n", STAGES - 1);
    fprintf(f, "                    xtc_cp_async_wait(%d); /* this thread's copies of stage kb have landed */\n", STAGES - 2);
    fprintf(f, "                    __syncthreads(); /* ... everyone's; and stage kb - 1 is read: it can be refilled */\n");
    fprintf(f, "                    if (kb + %d < kt) {\n", STAGES - 1);
    fprintf(f, "                        const int slot = cur == 0 ? %d : cur - 1; /* (kb + %d) %% %d */\n", STAGES - 1,
            STAGES - 1, STAGES);
    stage_copy(f, sh, tb, ta, R, vec, "slot", "(kb + 2) * 32", "                        ");
    fprintf(f, "                    }\n");
    fprintf(f, "                    xtc_cp_async_commit();\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int ks = 0; ks < 2; ks++) { /* k 16 ks .. 16 ks + 15 of the stage */\n");
    fprintf(f, "                        unsigned af[%d][4], bf[%d][2];\n", mi, nj);
    char p[256];
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int i = 0; i < %d; i++) { /* rows +0..7 +8..15, k +0..7 +8..15 */\n", mi);
    if (ta) {
        a_frag_at(f, bm);
    } else {
        fprintf(f, "                            const int r = wm + 16 * i + (lane & 15), c = 2 * ks + (lane >> 4);\n");
        chunk_at(p, sizeof p, 1, 0, "r", "c");
        fprintf(f, "                            xtc_ldmatrix_x4(af[i], &As[cur][%s]);\n", p);
    }
    fprintf(f, "                        }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int j = 0; j < %d; j += 2) { /* columns 8 j .. 8 j + 15 */\n", nj);
    fprintf(f, "                            unsigned d[4];\n");
    if (tb) { /* [n][k]: matrices (n +0..7, k +0..7), (n +0..7, k +8..15), (n +8..15, k +0..7), ... */
        fprintf(f, "                            const int r = wn + 8 * j + (lane & 7) + (lane >> 4) * 8, c = 2 * ks + (lane >> 3 & 1);\n");
        chunk_at(p, sizeof p, 1, 0, "r", "c");
        fprintf(f, "                            xtc_ldmatrix_x4(d, &Bs[cur][%s]);\n", p);
    } else { /* [k][n], transposed: matrices (k +0..7, n +0..7), (k +8..15, n +0..7), (k +0..7, n +8..15), ... */
        fprintf(f, "                            const int r = 16 * ks + (lane & 7) + (lane >> 3 & 1) * 8, c = (wn + 8 * j) / 8 + (lane >> 4);\n");
        chunk_at(p, sizeof p, 0, bn, "r", "c");
        fprintf(f, "                            xtc_ldmatrix_x4_trans(d, &Bs[cur][%s]);\n", p);
    }
    fprintf(f, "                            bf[j][0] = d[0];\n");
    fprintf(f, "                            bf[j][1] = d[1];\n");
    fprintf(f, "                            bf[j + 1][0] = d[2];\n");
    fprintf(f, "                            bf[j + 1][1] = d[3];\n");
    fprintf(f, "                        }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int i = 0; i < %d; i++)\n", mi);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                            for (int j = 0; j < %d; j++)\n", nj);
    fprintf(f, "                                %s(acc[i][j], af[i], bf[j], acc[i][j]);\n", mma);
    fprintf(f, "                    }\n");
    fprintf(f, "                }\n");
    fprintf(f, "                xtc_cp_async_wait(0);\n");
    fprintf(f, "                __syncthreads(); /* the stages are read: the next tile may refill them */\n");
    /* unrolled, so that acc stays in registers however long the epilogue */
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int i = 0; i < %d; i++)\n", mi);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                    for (int j = 0; j < %d; j++)\n", R ? nj / 2 : nj);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                        for (int q = 0; q < 4; q++) { /* d[q] = C[g + 8 (q / 2)][2t + q %% 2] */\n");
    fprintf(f, "                            const i64 row = m0 + wm + 16 * i + g + 8 * (q / 2);\n");
    const char *ind = "                                ";
    if (R) { /* the first half's columns; the second's are in acc[i][j + nj / 2] */
        char oc[256], col[256], partner[64];
        cu_matmul_split_col("v", R, oc, sizeof oc, col, sizeof col);
        fprintf(f, "                            const int v = wn + 8 * j + 2 * t + q %% 2;\n");
        fprintf(f, "                            const i64 col = %s;\n", oc);
        fprintf(f, "                            if (row < M && col < Nout)\n");
        snprintf(partner, sizeof partner, "acc[i][j + %d][q]", nj / 2);
        if (cu_matmul_store(k, epilogue, ctx, "acc[i][j][q]", partner, ind) < 0)
            return -1;
    } else if (!epilogue) { /* the store: the pairs of columns 2t, 2t + 1 in one store where aligned */
        fprintf(f, "                            if (q %% 2)\n");
        fprintf(f, "                                continue;\n");
        fprintf(f, "                            const i64 col = n0 + wn + 8 * j + 2 * t;\n");
        fprintf(f, "                            if (row < M && col + 1 < N && pair)\n");
        fprintf(f, "                                xtc_st2(C, row * N + col, acc[i][j][q], acc[i][j][q + 1]);\n");
        fprintf(f, "                            else if (row < M && col < N) {\n");
        fprintf(f, "                                xtc_st(C, row * N + col, acc[i][j][q]);\n");
        fprintf(f, "                                if (col + 1 < N)\n");
        fprintf(f, "                                    xtc_st(C, row * N + col + 1, acc[i][j][q + 1]);\n");
        fprintf(f, "                            }\n");
    } else {
        fprintf(f, "                            const i64 col = n0 + wn + 8 * j + 2 * t + q %% 2;\n");
        fprintf(f, "                            if (row < M && col < N)\n");
        if (cu_matmul_store(k, epilogue, ctx, "acc[i][j][q]", NULL, ind) < 0)
            return -1;
    }
    fprintf(f, "                        }\n");
    fprintf(f, "            }\n");
    return 0;
}

/* Whether the 128 x 128 tiles are taken: at least LARGE_MIN of them over the batches */
static void tile_large(char *buf, size_t n, const char *M, const char *N, const char *batches)
{
    char tm[2 * CU_EXPR], tn[2 * CU_EXPR];
    cu_ceil_div(M, shape_large.bm, tm, sizeof tm);
    cu_ceil_div(N, shape_large.bn, tn, sizeof tn);
    snprintf(buf, n, "(%s) * (%s) * (%s) >= %d", tm, tn, batches, LARGE_MIN);
}

int cg_cuda_matmul_mma16(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx)
{
    FILE *f = k->f;
    int tb = x->ia[IR_IA_TRANSPOSE_B] != 0, ta = (cu_matmul_views(k, x) & CG_VIEW_A_T) != 0;
    int vec = copies_possible(x, tb, ta, parts);
    k->sync = 1;
    k->bound_threads = THREADS;
    k->bound_blocks = 2;
    cu_kernel_begin(k);
    fprintf(f, "    /* tensor cores: operands in %s as stored, sums in f32; %d-stage cp.async pipeline */\n",
            k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16", STAGES);
    fprintf(f, "    __shared__ XTC_ALIGN16 unsigned short As[%d][%d]; /* [stage][m][k], swizzled chunks */\n", STAGES,
            shape_large.bm * KT);
    fprintf(f, "    __shared__ XTC_ALIGN16 unsigned short Bs[%d][%d]; /* [stage][n][k] or [k][n] */\n", STAGES,
            shape_large.bn * KT);
    fprintf(f, "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n");
    fprintf(f, "    const int g = lane / 4, t = lane %% 4; /* the fragment coordinates of the lane */\n");
    cu_matmul_prologue(k, x, ia, ib, parts);
    /* few rows (decoding): the GEMV path in what As and Bs leave of the static shared memory
     * (nothing: only its form for B transposed, a linear layer's weight, which needs none) */
    const int smem = CU_SMEM_STATIC - STAGES * (shape_large.bm + shape_large.bn) * KT * 2;
    if (cg_cuda_gemv(k, x, ia, ib, parts, epilogue, ctx, THREADS, smem) < 0)
        return -1;
    if (vec) {
        fprintf(f, "        /* 16-byte copies: rows of multiples of 8 values, aligned operands */\n");
        fprintf(f, "        const int vec = %s %% 8 == 0 && %s((unsigned long long)in%d & 15) == 0 &&\n", ta ? "M" : "K",
                tb ? "" : parts == 2 ? "Nout % 8 == 0 && " : "N % 8 == 0 && ", ia);
        fprintf(f, "                        ((unsigned long long)in%d & 15) == 0;\n", ib);
    }
    if (!epilogue) /* C's pairs of columns 2t, 2t + 1 stored at once: even rows, C aligned (8 bytes) */
        fprintf(f, "        const int pair = N %% 2 == 0 && ((unsigned long long)out & 7) == 0;\n");
    char big[6 * CU_EXPR];
    tile_large(big, sizeof big, "M", "N", "batches");
    fprintf(f, "        if (%s) {\n", big);
    if (tiles(k, &shape_large, tb, ta, parts, vec, epilogue, ctx) < 0)
        return -1;
    fprintf(f, "        } else {\n");
    if (tiles(k, &shape_small, tb, ta, parts, vec, epilogue, ctx) < 0)
        return -1;
    fprintf(f, "        }\n    }\n");
    cu_kernel_end(k);
    /* the launch: tiles along x (as many as the shape taken has), batch matrices along y */
    CuGen *gen = k->gen;
    int r = x->rank;
    char M[CU_EXPR], N[CU_EXPR], batches[CU_EXPR], tl[2][2][2 * CU_EXPR];
    cu_dim(gen, x->shape[r - 2], M, sizeof M);
    cu_dim(gen, x->shape[r - 1], N, sizeof N);
    cu_matmul_batches(k, x, batches, sizeof batches);
    tile_large(big, sizeof big, M, N, batches);
    const Shape *shapes[2] = {&shape_large, &shape_small};
    for (int s = 0; s < 2; s++) {
        cu_ceil_div(M, shapes[s]->bm, tl[s][0], sizeof tl[s][0]);
        cu_ceil_div(N, shapes[s]->bn, tl[s][1], sizeof tl[s][1]);
    }
    int len = snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "(%s) ? (%s) * (%s) : (%s) * (%s)", big, tl[0][0],
                       tl[0][1], tl[1][0], tl[1][1]);
    if (len < 0 || (size_t)len >= sizeof k->geom.grid_x) /* the small tiles' count covers both (grid-stride) */
        snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "(%s) * (%s)", tl[1][0], tl[1][1]);
    snprintf(k->geom.grid_y, sizeof k->geom.grid_y, "%s", batches);
    k->geom.block = THREADS;
    cg_cuda_gemv_geometry(k, x, parts, THREADS, smem);
    return k->gen->err[0] ? -1 : 0;
}
