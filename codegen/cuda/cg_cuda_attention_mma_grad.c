/* cg_cuda_attention_mma_grad.c: attention_grad on tensor cores (the FlashAttention-2 backward),
 * taken when the module's matmuls are (CgOptions.mma) and D = E. Where q, k, v and the output
 * gradient are stored in the mma's format and the heads are multiples of 8 up to FLASH_BWD_HEAD,
 * the kernel is kernels/flash_bwd.cuh's (flash_bwd16 below writes its parameters as macros:
 * tiles copied as stored by cp.async, fragments by ldmatrix and .trans). Otherwise, for heads
 * up to MMA_GRAD_HEAD, the kernel below, which converts as it stages; wider heads take
 * cg_cuda_attention.c's CUDA-core kernels. Every bias, mask, scale, causal and window form of
 * the CUDA-core kernel is covered, element by element as it does.
 *
 * The work is split as the CUDA-core tiled kernel splits it, so that every output row has one
 * writer (no atomics, no f32 workspace to clear and convert, the same bits on every run), and
 * grouped key/values (ops.def) as there: a dq block reads its query head's key/value head, a
 * dk/dv block of head g < G streams the query tiles of the query heads g, g + G, .. in turn into
 * the same accumulators, those of heads G..H-1 write zeros (cu_att_grad_rows, cu_att_grad_heads_begin,
 * cu_att_grad_zero_rows; flash_bwd.cuh likewise). Per
 * batch, blocks [0, QT) take 64 query rows each (their dq), blocks [QT, QT + KT) 64 keys each
 * (their dk and dv), numbered tile-major and the dq tiles from the last rows on, so that under
 * causal limits the longest blocks (late query rows, early keys) start first. A block is 4 warps (128 threads), a warp owns 16 of the block's rows and
 * keeps them in registers as mma A fragments (16-bit pairs along the head); the other side
 * streams through shared memory as 16-bit pairs, 64 keys or BQ = 32 query rows a tile (the dk/dv
 * half holds four sets of 16 x D in registers), twice: [row][d pair] (the B operand of a
 * product over d) and, transposed in shared memory, [d][row pair] (the B operand of a product
 * over the rows); rows padded by 4 words: conflict-free fragment loads. The tiles are addressed
 * as offsets into one shared array (pointers into it cost NVRTC's code 64-bit registers).
 *   dq block:   S = Q K^T, dP = dO V^T over the key tile; P = exp(S scale + bias - lse) from the
 *               forward's logsumexp (o's last column); dS = P (dP - D_i + dlse_i) scale, 0 where
 *               masked, with D_i = dout_i . o_i computed by the row's 4 lanes;
 *               dQ += dS K: dS's accumulator layout is the A fragment's, packed in registers.
 *   dk/dv block: S^T = K Q^T, dP^T = V dO^T over the query tile (lse and D_i of its rows in
 *               shared memory); dV += P^T dO, dK += dS^T Q, P^T and dS^T again A fragments.
 * The dq half recomputes S and dP (7 products of rows x keys x D where the atomic dq of
 * FlashAttention-2 does 5) and buys with it determinism and a single 16-bit or f32 store of
 * each gradient. The causal and window limits bound both loops as in the CUDA-core kernel (the
 * tiles past the diagonal are never visited; cu_att_tile_keys, cu_att_query_ranges); each pair
 * is still checked against its query row's key range. Operands are rounded to the mma format
 * once (with 16-bit storage of that format, copied as raw bits); P and dS are rounded to it
 * before their products, as FlashAttention-2 does; scores, statistics and sums are f32. */
#include "cg_cuda_attention.h"

#include <stdlib.h>
#include <string.h>

#define MMA_GRAD_HEAD 64 /* the widest head below: 4 accumulator sets of D / 2 a thread */
#define FLASH_BWD_HEAD 128 /* the widest head of kernels/flash_bwd.cuh */
#define BT 64            /* rows of a block (16 a warp), and keys of the dq half's streamed tile */
#define BQ 32            /* query rows of the dk/dv half's streamed tile (registers: 4 sets of 16 x D) */

static const char *po(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *pc(const char *e) { return strchr(e, ' ') ? ")" : ""; }

/* Whether x's storage (the module's, storage) is the 16-bit format of the mma operands (mma):
 * pairs are then raw bits. */
static int raw_format(int storage, int mma, const IrNode *x)
{
    return storage == (mma == CG_MMA_FP16 ? 2 : 1) && strcmp(cu_mem_type(x), "xtc_fs") == 0;
}

static int raw_pairs(const CuKernel *k, const IrNode *x) { return raw_format(k->gen->storage, k->gen->mma, x); }

int cu_flash_bwd16_fits(int storage, int mma, const IrNode *x)
{
    const IrNode *q = x->in[0], *v = x->in[2];
    int r = q->rank;
    if (x->op != IR_ATTENTION_GRAD || mma == CG_MMA_OFF || r < 2 || !ir_dim_is_const(q->shape[r - 1]) ||
        !ir_dim_is_const(v->shape[r - 1]))
        return 0;
    long long D = (long long)q->shape[r - 1].c, E = (long long)v->shape[r - 1].c;
    return D == E && D >= 8 && D % 8 == 0 && D <= FLASH_BWD_HEAD && raw_format(storage, mma, q) &&
           raw_format(storage, mma, x->in[1]) && raw_format(storage, mma, v) && raw_format(storage, mma, x->in[4]) &&
           strcmp(cu_mem_type(x->in[3]), "float") == 0;
}

void cu_att_pair(CuKernel *k, const IrNode *x, const char *indent, const char *dst, const char *p, const char *clo,
                 const char *lo, const char *chi, const char *hi)
{
    if (raw_pairs(k, x))
        fprintf(k->f, "%s%s = (%s ? (unsigned)%s[%s] : 0u) | (%s ? (unsigned)%s[%s] : 0u) << 16;\n", indent, dst, clo, p,
                lo, chi, p, hi);
    else
        fprintf(k->f, "%s%s = %s(%s ? xtc_ld(%s, %s) : 0.0f, %s ? xtc_ld(%s, %s) : 0.0f);\n", indent, dst,
                k->gen->mma == CG_MMA_FP16 ? "xtc_pack_f16x2" : "xtc_pack_bf16x2", clo, p, lo, chi, p, hi);
}

/* A fragments f[kd][u] of the warp's 16 rows r0, r0 + 8 of p (row stride ld, `width` columns,
 * rows below lim) */
static void a_frags(CuKernel *k, const IrNode *x, const char *f, const char *p, const char *r0, const char *lim,
                    const char *width, const char *ld, long long dk)
{
    FILE *o = k->f;
    char clo[160], chi[160], lo[96], hi[96];
    fprintf(o, "            unsigned %s[%lld][4];\n", f, dk);
    fprintf(o, "#pragma unroll\n            for (int kd = 0; kd < %lld; kd++)\n", dk);
    fprintf(o, "#pragma unroll\n            for (int u = 0; u < 4; u++) { /* row g + 8 (u %% 2), columns 16 kd + 2 t + 8 (u / 2) */\n");
    fprintf(o, "                const i64 r = %s + 8 * (u %% 2);\n", r0);
    fprintf(o, "                const int d = 16 * kd + 2 * t + 8 * (u / 2);\n");
    snprintf(clo, sizeof clo, "r < %s && d < %s", lim, width);
    snprintf(chi, sizeof chi, "r < %s && d + 1 < %s", lim, width);
    snprintf(lo, sizeof lo, "r * %s + d", ld);
    snprintf(hi, sizeof hi, "r * %s + d + 1", ld);
    char dst[32];
    snprintf(dst, sizeof dst, "%s[kd][u]", f);
    cu_att_pair(k, x, "                ", dst, p, clo, lo, chi, hi);
    fprintf(o, "            }\n");
}

/* The tile [rows][st] of rows base.. (below lim) of p (row stride ld, `width` columns) as 16-bit
 * pairs along the row, zero past lim and width */
static void load_pairs(CuKernel *k, const IrNode *x, const char *dst, const char *p, const char *base, const char *lim,
                       const char *width, const char *ld, int rows, long long dpairs, long long st)
{
    FILE *o = k->f;
    char clo[160], chi[160], lo[96], hi[96], d[64];
    fprintf(o, "                for (int e = threadIdx.x; e < %d * %lld; e += blockDim.x) {\n", rows, dpairs);
    fprintf(o, "                    const int c = e / %lld, d = 2 * (e %% %lld); /* row, first column of the pair */\n",
            dpairs, dpairs);
    fprintf(o, "                    const i64 r = %s + c;\n", base);
    snprintf(clo, sizeof clo, "r < %s && d < %s", lim, width);
    snprintf(chi, sizeof chi, "r < %s && d + 1 < %s", lim, width);
    snprintf(lo, sizeof lo, "r * %s + d", ld);
    snprintf(hi, sizeof hi, "r * %s + d + 1", ld);
    snprintf(d, sizeof d, "sm[%s + c * %lld + d / 2]", dst, st);
    cu_att_pair(k, x, "                    ", d, p, clo, lo, chi, hi);
    fprintf(o, "                }\n");
}

/* dst[d][row pair] (row stride tst) from src[row][d pair] (row stride st): the 16-bit halves
 * regrouped, d < dpad */
static void transpose_pairs(CuKernel *k, const char *dst, const char *src, int rows, long long st, long long dpad,
                            long long tst)
{
    FILE *o = k->f;
    fprintf(o, "                for (int e = threadIdx.x; e < %lld * %d; e += blockDim.x) {\n", dpad, rows / 2);
    fprintf(o, "                    const int d = e %% %lld, p = e / %lld, sh = 16 * (d & 1);\n", dpad, dpad);
    fprintf(o, "                    const unsigned lo = sm[%s + 2 * p * %lld + d / 2], hi = sm[%s + (2 * p + 1) * %lld + d / 2];\n",
            src, st, src, st);
    fprintf(o, "                    sm[%s + d * %lld + p] = (lo >> sh & 0xffffu) | (hi >> sh & 0xffffu) << 16;\n", dst, tst);
    fprintf(o, "                }\n");
}

/* s[c] (+)= A . B over kd for the rows / 8 column tiles of a tile of rows: B fragments from
 * rows 8 c + g, pairs 8 kd + t (+ 4) of the [row][pair] tile src */
static void products(CuKernel *k, const char *mma, const char *acc, const char *a, const char *src, int rows,
                     long long st, long long dk)
{
    FILE *o = k->f;
    fprintf(o, "#pragma unroll\n                for (int kd = 0; kd < %lld; kd++)\n", dk);
    fprintf(o, "#pragma unroll\n                    for (int c = 0; c < %d; c++) {\n", rows / 8);
    fprintf(o, "                        const unsigned bf[2] = {sm[%s + (8 * c + g) * %lld + 8 * kd + t], sm[%s + (8 * c + g) * %lld + 8 * kd + t + 4]};\n",
            src, st, src, st);
    fprintf(o, "                        %s(%s[c], %s[kd], bf, %s[c]);\n", mma, acc, a, acc);
    fprintf(o, "                    }\n");
}

/* acc[ci] += P . B: P the [16][rows] probabilities-shaped accumulators p (packed to A
 * fragments), B from the [d][row pair] tile src */
static void products_t(CuKernel *k, const char *mma, const char *pack, const char *acc, const char *p, const char *src,
                       int rows, long long tst, long long dn)
{
    FILE *o = k->f;
    fprintf(o, "#pragma unroll\n                for (int kc = 0; kc < %d; kc++) {\n", rows / 16);
    fprintf(o, "                    const unsigned pa[4] = {%s(%s[2 * kc][0], %s[2 * kc][1]), %s(%s[2 * kc][2], %s[2 * kc][3]),\n",
            pack, p, p, pack, p, p);
    fprintf(o, "                                            %s(%s[2 * kc + 1][0], %s[2 * kc + 1][1]), %s(%s[2 * kc + 1][2], %s[2 * kc + 1][3])};\n",
            pack, p, p, pack, p, p);
    fprintf(o, "#pragma unroll\n                    for (int ci = 0; ci < %lld; ci++) {\n", dn);
    fprintf(o, "                        const unsigned bf[2] = {sm[%s + (8 * ci + g) * %lld + 8 * kc + t], sm[%s + (8 * ci + g) * %lld + 8 * kc + t + 4]};\n",
            src, tst, src, tst);
    fprintf(o, "                        %s(%s[ci], pa, bf, %s[ci]);\n", mma, acc, acc);
    fprintf(o, "                    }\n                }\n");
}

/* p and ds of the pair (i, j) in scope from the score sv and dp dv, lse and dl (dlse - D_i) */
static void pair_grad(CuKernel *k, const Att *a, const char *sv, const char *dv, const char *lse, const char *dl,
                      const char *indent)
{
    FILE *o = k->f;
    fprintf(o, "%sconst float scale = %s;\n", indent, a->scale);
    fprintf(o, "%sconst int keep = %s;\n", indent, a->keep);
    fprintf(o, "%spij = xtc_prob(keep ? %s * scale%s : -3.40282347e+38f, %s, J);\n", indent, sv, a->bias, lse);
    fprintf(o, "%sds = keep ? pij * (%s + %s) * scale : 0.0f;\n", indent, dv, dl);
}

/* zero acc[n][4] */
static void zero(FILE *o, const char *acc, long long n, const char *indent)
{
    fprintf(o, "%sfloat %s[%lld][4];\n", indent, acc, n);
    fprintf(o, "#pragma unroll\n%sfor (int c = 0; c < %lld; c++)\n", indent, n);
    fprintf(o, "#pragma unroll\n%s    for (int u = 0; u < 4; u++)\n%s        %s[c][u] = 0.0f;\n", indent, indent, acc);
}

/* rows r0 + 8 r of dst (below lim) from the accumulators acc[dn][4], D columns */
static void store_rows(FILE *o, const char *dst, const char *acc, const char *r0, const char *lim, long long dn)
{
    fprintf(o, "#pragma unroll\n            for (int r = 0; r < 2; r++) {\n");
    fprintf(o, "                const i64 row = %s + 8 * r;\n", r0);
    fprintf(o, "                if (row >= %s)\n                    continue;\n", lim);
    fprintf(o, "#pragma unroll\n                for (int ci = 0; ci < %lld; ci++)\n", dn);
    fprintf(o, "#pragma unroll\n                    for (int u = 0; u < 2; u++)\n");
    fprintf(o, "                        if (8 * ci + 2 * t + u < D)\n");
    fprintf(o, "                            xtc_st(%s, row * D + 8 * ci + 2 * t + u, %s[ci][2 * r + u]);\n", dst, acc);
    fprintf(o, "            }\n");
}

/* Runs emit(k, a, indent) into a string and writes it as `#define head` (cu_att_define_lines),
 * wrapped as { text tail }: the generator's limits and ranges as macros of kernels/flash_bwd.cuh.
 * Returns 0, or -1 out of memory. */
static int define_emitted(CuKernel *k, const Att *a, void (*emit)(CuKernel *, const Att *, const char *),
                          const char *head, const char *tail)
{
    CuAttCapture c;
    if (cu_att_capture_begin(k, &c) < 0)
        return -1;
    fprintf(k->f, "    {\n");
    emit(k, a, "        ");
    fprintf(k->f, "        %s\n    }", tail);
    cu_att_capture_define(k, &c, head);
    return 0;
}

/* The backward whose body is kernels/flash_bwd.cuh (see there): q, k, v and the output gradient
 * stored in the mma's format, D = E a multiple of 8 up to FLASH_BWD_HEAD. Streamed tiles of 64,
 * 32 or 16 rows in two stages (one for the widest heads) beside the two resident tiles of 64
 * rows, in 48 KiB of static shared memory. Returns 1 written, 0 when it does not apply, -1 error. */
static int flash_bwd16(CuKernel *k, const Att *a, const char *gcols)
{
    const IrNode *x = k->node;
    const IrNode *mask = x->in[6], *scale = x->in[7];
    if (!cu_flash_bwd16_fits(k->gen->storage, k->gen->mma, x))
        return 0;
    long long dp = (a->D + 15) / 16 * 16, ds = dp + 8;
    int bn = 64, nst = 2;
    for (;;) { /* bytes: the resident tiles, the stages, the streamed rows' statistics */
        long long bytes = 2 * (2 * 64 * ds + nst * 2LL * bn * ds) + nst * bn * 24LL;
        if (bytes <= 48 * 1024 || (nst == 1 && bn == 16))
            break;
        if (bn > 16)
            bn /= 2;
        else
            nst = 1, bn = 64;
    }
    int plain = mask->op == IR_CONST && mask->f != 0 && !a->bias[0] && scale->op == IR_CONST;
    FILE *f = k->f;
    k->sync = 1;
    /* the scratch: each query row's dlse_i - D_i, from xtc_fb_pre before the kernel */
    snprintf(k->geom.pre, sizeof k->geom.pre, "%s%s%s * %s%s%s", po(a->batches), a->batches, pc(a->batches), po(a->I),
             a->I, pc(a->I));
    snprintf(k->geom.pre_gc, sizeof k->geom.pre_gc, "%s", gcols);
    k->geom.pre_e = a->E;
    fputs(cg_embed_flash_lib_cuh, f);
    cu_kernel_begin(k);
    fprintf(f, "    /* FlashAttention-2 backward on tensor cores: operands in %s, copied as stored (cp.async, ldmatrix); "
               "scores, statistics and sums in f32 */\n", k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16");
    fprintf(f, "    const i64 I = %s, J = %s, batches = %s;\n", a->I, a->J, a->batches);
    fprintf(f, "    const int D = %lld, E = %lld, OC = %lld, GC = %s; /* o has E + 1 columns, dout E or E + 1 */\n",
            a->D, a->E, a->E + 1, gcols);
    fprintf(f, "#define XTC_FB_BN %d\n#define XTC_FB_NST %d\n#define XTC_FB_DP %lld\n", bn, nst, dp);
    fprintf(f, "#define XTC_FB_MMA %s\n#define XTC_FB_PACK %s\n",
            k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16",
            k->gen->mma == CG_MMA_FP16 ? "xtc_fa_pack_f16" : "xtc_fa_pack_bf16");
    /* the batch indices and the operands' rows (k and v at the query head's key/value head) */
    CuAttCapture c;
    if (cu_att_capture_begin(k, &c) < 0)
        return -1;
    cu_att_grad_rows(k, GR_Q | GR_KV, "batch", "        ");
    cu_att_capture_define(k, &c, "XTC_FB_TILE");
    fprintf(f, "#define XTC_FB_OUT %s *dq = out + bt * (I + 2 * J) * D, *dk = dq + I * D, *dv = dk + J * D;\n",
            cu_mem_type(x));
    long long H, G;
    if (cu_att_grad_groups(x, &H, &G)) /* grouped key/values (ops.def) */
        fprintf(f, "#define XTC_FB_HEADS %lld\n#define XTC_FB_HSTEP %lld\n#define XTC_FB_NOKV(xtc_b) ((xtc_b) %% %lld >= %lld)\n",
                H / G, G, H, G);
    else
        fprintf(f, "#define XTC_FB_HEADS 1\n#define XTC_FB_HSTEP 0\n#define XTC_FB_NOKV(xtc_b) 0\n");
    if (define_emitted(k, a, cu_att_key_range, "XTC_FB_KEYS(i, xtc_lo, xtc_hi)", "xtc_lo = jb;\n        xtc_hi = je;") < 0 ||
        define_emitted(k, a, cu_att_query_ranges, "XTC_FB_QUERIES(j, xtc_fm, xtc_ib, xtc_ie)",
                       "xtc_fm = fm;\n        xtc_ib = ib;\n        xtc_ie = ie;") < 0)
        return -1;
    fprintf(f, "#define XTC_FB_PAIR(xtc_x, xtc_y, i, j, xtc_lse, xtc_dl, xtc_p, xtc_ds) \\\n");
    fprintf(f, "    { \\\n        const float scale = %s; \\\n        const int keep = %s; \\\n", a->scale, a->keep);
    fprintf(f, "        xtc_p = xtc_prob(keep ? (xtc_x) * scale%s : -3.40282347e+38f, xtc_lse, J); \\\n", a->bias);
    fprintf(f, "        xtc_ds = keep ? xtc_p * ((xtc_y) + (xtc_dl)) * scale : 0.0f; \\\n    }\n");
    /* full tiles (plain): every pair at or below the first row's causal limit, at or above the
     * last row's window limit */
    if (plain) {
        fprintf(f, "#define XTC_FB_FULL(xtc_if, xtc_il, xtc_jf, xtc_jl) (1");
        if (a->causal)
            fprintf(f, " && (xtc_jl) <= (xtc_if) + J - I");
        if (a->window > 0)
            fprintf(f, " && (xtc_jf) >= (xtc_il) + J - I - %lld", a->window);
        fprintf(f, ")\n");
        char c[64];
        fprintf(f, "#define XTC_FB_SCALE %s\n", a->scale);
        fprintf(f, "#define XTC_FB_SCALE2 %s\n", cu_float(scale->f * 1.4426950408889634, c, sizeof c));
    } else {
        fprintf(f, "#define XTC_FB_FULL(xtc_if, xtc_il, xtc_jf, xtc_jl) 0\n#define XTC_FB_SCALE 1.0f\n#define XTC_FB_SCALE2 1.0f\n");
    }
    fputs(cg_embed_flash_bwd_cuh, f);
    cu_kernel_end(k);
    char qt[CU_EXPR], kt[CU_EXPR], rows[4 * CU_EXPR];
    cu_ceil_div(a->I, 64, qt, sizeof qt);
    cu_ceil_div(a->J, 64, kt, sizeof kt);
    snprintf(rows, sizeof rows, "%s%s%s * (%s + %s)", po(a->batches), a->batches, pc(a->batches), qt, kt);
    cu_geom_rows(k, rows, 128);
    return 1;
}

int cu_attention_grad_mma(CuKernel *k, const Att *a, const char *gcols)
{
    if (k->gen->mma == CG_MMA_OFF || a->D < 1 || a->E != a->D)
        return 0;
    int rc = flash_bwd16(k, a, gcols); /* operands in the mma's format: kernels/flash_bwd.cuh */
    if (rc)
        return rc;
    if (a->D > MMA_GRAD_HEAD)
        return 0;
    const IrNode *x = k->node, *q = x->in[0], *kk = x->in[1], *v = x->in[2], *dout = x->in[4];
    const char *mma = k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16";
    const char *pack = k->gen->mma == CG_MMA_FP16 ? "xtc_pack_f16x2" : "xtc_pack_bf16x2";
    long long dk = (a->D + 15) / 16, dn = (a->D + 7) / 8; /* k-steps over d, n tiles of d */
    long long dpairs = 8 * dk, dpad = 8 * dn, st = dpairs + 4, tst = BT / 2 + 4, qtst = BQ / 2 + 4;
    long long wq = 2 * BT * st + dpad * tst, wk = 2 * BQ * st + 2 * dpad * qtst; /* the dq, the dk/dv half */
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    /* FlashAttention-2 backward on tensor cores: operands in %s, scores, statistics and sums in f32 */\n",
            k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16");
    fprintf(f, "    __shared__ XTC_ALIGN16 unsigned sm[%lld]; /* the 16-bit pair tiles of either half */\n", wq > wk ? wq : wk);
    fprintf(f, "    __shared__ float Ls[%d], Dl[%d]; /* dk/dv half: the query tile's lse and dlse - D_i */\n", BQ, BQ);
    fprintf(f, "    const i64 I = %s, J = %s, batches = %s;\n", a->I, a->J, a->batches);
    fprintf(f, "    const int D = %lld, E = %lld, OC = %lld, GC = %s; /* o has E + 1 columns, dout E or E + 1 */\n",
            a->D, a->E, a->E + 1, gcols);
    fprintf(f, "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n");
    fprintf(f, "    const int g = lane / 4, t = lane %% 4; /* the fragment coordinates of the lane */\n");
    fprintf(f, "    const i64 qtiles = (I + %d) / %d, ktiles = (J + %d) / %d;\n", BT - 1, BT, BT - 1, BT);
    fprintf(f, "    for (i64 blk = blockIdx.x; blk < batches * (qtiles + ktiles); blk += gridDim.x) {\n");
    fprintf(f, "        /* tile-major, the dq tiles last row first: under causal limits the longest blocks start first */\n");
    fprintf(f, "        const i64 bt = blk %% batches, tile = blk / batches;\n");
    fprintf(f, "        %s *dq = out + bt * (I + 2 * J) * D, *dk = dq + I * D, *dv = dk + J * D;\n", cu_mem_type(x));

    /* ---- dq: 64 query rows, the key tiles streamed ---- */
    fprintf(f, "        if (tile < qtiles) { /* dq_i = sum_j ds_ij k_j */\n");
    fprintf(f, "            const i64 batch = bt;\n");
    cu_att_grad_rows(k, GR_Q | GR_KV, "batch", "            ");
    fprintf(f, "            const int Ks = 0, Vs = %lld, Kt = %lld; /* where the tiles start in sm */\n", BT * st, 2 * BT * st);
    fprintf(f, "            const i64 i0 = (qtiles - 1 - tile) * %d, r0 = i0 + warp * 16 + g; /* the lane's rows r0, r0 + 8 */\n", BT);
    a_frags(k, q, "qf", "qb", "r0", "I", "D", "D", dk);
    a_frags(k, dout, "gf", "gb", "r0", "I", "E", "GC", dk);
    fprintf(f, "            i64 rjb[2], rje[2]; /* each row's keys */\n");
    fprintf(f, "            float lse[2], dl[2]; /* each row's logsumexp and dlse - D_i */\n");
    fprintf(f, "#pragma unroll\n            for (int r = 0; r < 2; r++) {\n");
    fprintf(f, "                const i64 i = r0 + 8 * r;\n");
    cu_att_key_range(k, a, "                ");
    fprintf(f, "                rjb[r] = i < I ? jb : 0;\n                rje[r] = i < I ? je : 0;\n");
    fprintf(f, "                float dsum = 0.0f; /* D_i = dout_i . o_i over the row's four lanes */\n");
    fprintf(f, "                for (int e = t; e < E && i < I; e += 4)\n");
    fprintf(f, "                    dsum += xtc_ld(gb, i * GC + e) * xtc_ld(ob, i * OC + e);\n");
    fprintf(f, "                for (int w = 1; w < 4; w <<= 1)\n");
    fprintf(f, "                    dsum += __shfl_xor_sync(0xffffffffu, dsum, w);\n");
    fprintf(f, "                lse[r] = i < I ? xtc_ld(ob, i * OC + E) : 0.0f;\n");
    fprintf(f, "                dl[r] = (i < I && GC > E ? xtc_ld(gb, i * GC + E) : 0.0f) - dsum;\n");
    fprintf(f, "            }\n");
    zero(f, "acc", dn, "            ");
    cu_att_tile_keys(k, a, BT, "            ");
    fprintf(f, "            for (i64 j0 = tjb; j0 < tje; j0 += %d) {\n", BT);
    load_pairs(k, kk, "Ks", "kb", "j0", "tje", "D", "D", BT, dpairs, st);
    load_pairs(k, v, "Vs", "vb", "j0", "tje", "E", "E", BT, dpairs, st);
    fprintf(f, "                __syncthreads(); /* Ks, Vs */\n");
    transpose_pairs(k, "Kt", "Ks", BT, st, dpad, tst);
    zero(f, "s", BT / 8, "                ");
    zero(f, "dp", BT / 8, "                ");
    products(k, mma, "s", "qf", "Ks", BT, st, dk);
    products(k, mma, "dp", "gf", "Vs", BT, st, dk);
    fprintf(f, "#pragma unroll\n                for (int c = 0; c < %d; c++)\n", BT / 8);
    fprintf(f, "#pragma unroll\n                    for (int u = 0; u < 4; u++) { /* row g + 8 (u / 2), key 8 c + 2 t + u %% 2 */\n");
    fprintf(f, "                        const int r = u / 2;\n");
    fprintf(f, "                        const i64 i = r0 + 8 * r, j = j0 + 8 * c + 2 * t + u %% 2;\n");
    fprintf(f, "                        float pij = 0.0f, ds = 0.0f;\n");
    fprintf(f, "                        if (j >= rjb[r] && j < rje[r]) {\n");
    pair_grad(k, a, "s[c][u]", "dp[c][u]", "lse[r]", "dl[r]", "                            ");
    fprintf(f, "                        }\n");
    fprintf(f, "                        (void)i;\n                        (void)pij;\n");
    fprintf(f, "                        s[c][u] = ds;\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                __syncthreads(); /* Kt */\n");
    products_t(k, mma, pack, "acc", "s", "Kt", BT, tst, dn);
    fprintf(f, "                __syncthreads(); /* before the next tile replaces Ks, Vs, Kt */\n");
    fprintf(f, "            }\n");
    store_rows(f, "dq", "acc", "r0", "I", dn);

    /* ---- dk, dv: 64 keys, the query tiles streamed ---- */
    fprintf(f, "        } else { /* dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i (over a group's query heads) */\n");
    fprintf(f, "            const int Qs = 0, Gs = %lld, Qt = %lld, Gt = %lld; /* where the tiles start in sm */\n", BQ * st,
            2 * BQ * st, 2 * BQ * st + dpad * qtst);
    fprintf(f, "            const i64 jt0 = (tile - qtiles) * %d, c0 = jt0 + warp * 16 + g; /* the lane's keys c0, c0 + 8 */\n",
            BT);
    char bt[16];
    snprintf(bt, sizeof bt, "%d", BT);
    cu_att_grad_zero_rows(k, "jt0", bt, "            ");
    cu_att_grad_rows(k, GR_KV, "bt", "            ");
    a_frags(k, kk, "kf", "kb", "c0", "J", "D", "D", dk);
    a_frags(k, v, "vf", "vb", "c0", "J", "E", "E", dk);
    zero(f, "dka", dn, "            ");
    zero(f, "dva", dn, "            ");
    fprintf(f, "            i64 fmq, tib, tie; /* the query rows of the tile's keys: [0, fmq) and [tib, tie) */\n");
    fprintf(f, "            {\n                const i64 j = jt0;\n");
    cu_att_query_ranges(k, a, "                ");
    fprintf(f, "                fmq = fm; /* the same for every key */\n                tib = ib;\n                (void)ie;\n            }\n");
    fprintf(f, "            {\n                const i64 j = (jt0 + %d < J ? jt0 + %d : J) - 1;\n", BT, BT);
    cu_att_query_ranges(k, a, "                ");
    fprintf(f, "                tie = ie;\n                (void)fm;\n                (void)ib;\n            }\n");
    cu_att_grad_heads_begin(k, "            ");
    fprintf(f, "            for (int seg = 0; seg < 2; seg++)\n");
    fprintf(f, "            for (i64 i0 = seg ? tib : 0, ihi = seg ? tie : fmq; i0 < ihi; i0 += %d) {\n", BQ);
    load_pairs(k, q, "Qs", "qb", "i0", "ihi", "D", "D", BQ, dpairs, st);
    load_pairs(k, dout, "Gs", "gb", "i0", "ihi", "E", "GC", BQ, dpairs, st);
    fprintf(f, "                { /* each query row's lse and dlse - D_i: %d lanes a row */\n", 128 / BQ);
    fprintf(f, "                    const int rr = threadIdx.x / %d, h = threadIdx.x %% %d;\n", 128 / BQ, 128 / BQ);
    fprintf(f, "                    const i64 i = i0 + rr;\n");
    fprintf(f, "                    float dsum = 0.0f;\n");
    fprintf(f, "                    for (int e = h; e < E && i < ihi; e += %d)\n", 128 / BQ);
    fprintf(f, "                        dsum += xtc_ld(gb, i * GC + e) * xtc_ld(ob, i * OC + e);\n");
    fprintf(f, "                    for (int w = 1; w < %d; w <<= 1)\n", 128 / BQ);
    fprintf(f, "                        dsum += __shfl_xor_sync(0xffffffffu, dsum, w);\n");
    fprintf(f, "                    if (h == 0) {\n");
    fprintf(f, "                        Ls[rr] = i < ihi ? xtc_ld(ob, i * OC + E) : 0.0f;\n");
    fprintf(f, "                        Dl[rr] = (i < ihi && GC > E ? xtc_ld(gb, i * GC + E) : 0.0f) - dsum;\n");
    fprintf(f, "                    }\n                }\n");
    fprintf(f, "                __syncthreads(); /* Qs, Gs, Ls, Dl */\n");
    transpose_pairs(k, "Qt", "Qs", BQ, st, dpad, qtst);
    transpose_pairs(k, "Gt", "Gs", BQ, st, dpad, qtst);
    zero(f, "s", BQ / 8, "                ");
    zero(f, "dp", BQ / 8, "                ");
    products(k, mma, "s", "kf", "Qs", BQ, st, dk);
    products(k, mma, "dp", "vf", "Gs", BQ, st, dk);
    fprintf(f, "#pragma unroll\n                for (int c = 0; c < %d; c++)\n", BQ / 8);
    fprintf(f, "#pragma unroll\n                    for (int u = 0; u < 4; u++) { /* key g + 8 (u / 2), query 8 c + 2 t + u %% 2 */\n");
    fprintf(f, "                        const int qi = 8 * c + 2 * t + u %% 2;\n");
    fprintf(f, "                        const i64 i = i0 + qi, j = c0 + 8 * (u / 2);\n");
    fprintf(f, "                        float pij = 0.0f, ds = 0.0f;\n");
    fprintf(f, "                        if (i < ihi && j < J) {\n");
    cu_att_key_range(k, a, "                            ");
    fprintf(f, "                            if (j >= jb && j < je) {\n");
    pair_grad(k, a, "s[c][u]", "dp[c][u]", "Ls[qi]", "Dl[qi]", "                                ");
    fprintf(f, "                            }\n                        }\n");
    fprintf(f, "                        s[c][u] = pij;\n");
    fprintf(f, "                        dp[c][u] = ds;\n");
    fprintf(f, "                    }\n");
    fprintf(f, "                __syncthreads(); /* Qt, Gt */\n");
    products_t(k, mma, pack, "dva", "s", "Gt", BQ, qtst, dn);
    products_t(k, mma, pack, "dka", "dp", "Qt", BQ, qtst, dn);
    fprintf(f, "                __syncthreads(); /* before the next tile replaces Qs, Gs, Qt, Gt, Ls, Dl */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            }\n"); /* cu_att_grad_heads_begin's */
    store_rows(f, "dk", "dka", "c0", "J", dn);
    store_rows(f, "dv", "dva", "c0", "J", dn);
    long long H, G;
    if (cu_att_grad_groups(x, &H, &G))
        fprintf(f, "            }\n"); /* cu_att_grad_zero_rows' else */
    fprintf(f, "        }\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char qt[CU_EXPR], kt[CU_EXPR], rows[4 * CU_EXPR];
    cu_ceil_div(a->I, BT, qt, sizeof qt);
    cu_ceil_div(a->J, BT, kt, sizeof kt);
    snprintf(rows, sizeof rows, "%s%s%s * (%s + %s)", po(a->batches), a->batches, pc(a->batches), qt, kt);
    cu_geom_rows(k, rows, 128);
    return 1;
}
