/* cg_cuda_attention_mma.c: the attention forward on tensor cores (FlashAttention-2), taken when
 * the module's matmuls are (CgOptions.mma: --mma=bf16|fp16, the default of --dtype bf16|fp16)
 * and both head sizes are at most MMA_HEAD; otherwise the CUDA-core kernels of
 * cg_cuda_attention.c run, which also compute the backward in every case.
 *
 * Where q, k and v are stored in the mma's format (--dtype bf16 with bf16 tensor cores, fp16
 * with fp16) and D and E are multiples of 8, the kernel is kernels/flash_fwd.cuh's (flash16
 * below writes its parameters as macros): tiles copied as stored by cp.async into two stages,
 * fragments by ldmatrix (.trans for V), exp2, one barrier a stage. Otherwise (f32 storage with
 * --mma, odd heads) the kernel below, which converts as it stages:
 *
 * A block is 4 warps (128 threads) over BR = 64 query rows, 16 per warp. A warp keeps its query
 * rows in registers as mma A fragments (qf, 16-bit pairs along the head, rounded once as the
 * tensor-core matmul rounds its operands; with 16-bit storage of the format, the raw bits:
 * cu_att_pair), and walks
 * the keys of the tile's rows (causal and window limits bound them: tiles past the diagonal are
 * skipped) BC = 64 at a time. The block stages a key tile Ks[key][d pair] and the transposed
 * value tile Vt[e][key pair] in shared memory as 16-bit pairs (zero past J and past D, E; rows
 * padded by 4 words: conflict-free fragment loads). Then per warp:
 *   S = Q K^T     D / 16 k-steps of xtc_mma_m16n8k16_* into 8 score tiles of 16 x 8 (f32);
 *   the scores scaled, biased and masked element by element exactly as the CUDA-core kernel
 *   does (-FLT_MAX where masked, -inf outside the row's key range: weight 0);
 *   online softmax in registers with f32 statistics: a lane holds rows g and g + 8 of its warp's
 *   16 (g = lane / 4), their maxima reduced over the row's 4 lanes with shuffles, the running
 *   sums kept per lane and reduced once at the end (alpha is the same on the row's lanes);
 *   O += P V      the probabilities' accumulator layout is the A fragment's (FlashAttention-2's
 *   register reuse), packed to 16 bits in registers: BC / 16 k-steps into E / 8 output tiles.
 * The output is O / l, and with stats the logsumexp mx + log l in column E, as the backward
 * reads it. Ragged I and J, head sizes not multiples of 16 (zero padding), the batch dims of
 * bias, mask and scale, and head-split views are those of the CUDA-core kernel. */
#include "cg_cuda_attention.h"

#include <stdlib.h>
#include <string.h>

#define MMA_HEAD 128 /* the widest head (D and E) on tensor cores: E / 2 accumulators a thread */
#define BR 64        /* query rows a block: 16 a warp */
#define BC 64        /* keys a stage */

static const char *po(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *pc(const char *e) { return strchr(e, ' ') ? ")" : ""; }

void cu_att_define_lines(FILE *f, const char *head, const char *body)
{
    fprintf(f, "#define %s", head);
    for (const char *p = body; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(f, " \\\n%.*s", (int)n, p);
        p += n + (nl != NULL);
    }
    fputc('\n', f);
}

/* Whether x is stored in the mma's 16-bit format (its values copy to the tiles as they are). */
static int stored_raw(const CuKernel *k, const IrNode *x)
{
    int fmt = k->gen->mma == CG_MMA_FP16 ? 2 : 1;
    return k->gen->storage == fmt && strcmp(cu_mem_type(x), "xtc_fs") == 0;
}

/* The forward whose body is kernels/flash_fwd.cuh (see there): q, k and v stored in the mma's
 * format, D and E multiples of 8 (16-byte rows). 128 query rows a block (two 16-row tiles a warp)
 * for heads up to 64, else 64; 64 keys a stage, 32 where two stages of 64 would pass the 48 KiB
 * of static shared memory (heads over 80) and, with 128 rows, for the forms with a mask operand,
 * a bias or a scale operand (their element work needs the registers: ptxas spilled at 64).
 * Returns 1 written, 0 when it does not apply, -1 error. */
static int flash16(CuKernel *k, const Att *a, int stats)
{
    const IrNode *x = k->node, *q = x->in[0], *kk = x->in[1], *v = x->in[2];
    if (!stored_raw(k, q) || !stored_raw(k, kk) || !stored_raw(k, v) || a->D % 8 || a->E % 8)
        return 0;
    long long dp = (a->D + 15) / 16 * 16, ep = (a->E + 15) / 16 * 16;
    /* plain: no mask operand (the causal and window limits are the rows' key ranges), no bias, a
     * constant scale */
    const IrNode *mask = x->in[4], *scale = x->in[5];
    int plain = mask->op == IR_CONST && mask->f != 0 && !a->bias[0] && scale->op == IR_CONST;
    int mt = a->D <= 64 && a->E <= 64 ? 2 : 1, bc = mt == 2 && !plain ? 32 : 64;
    for (;; bc /= 2) { /* stage 0, and stage 1 or the query tile: rows padded by 8 values */
        long long stage = bc * (dp + 8 + ep + 8), qtile = 64LL * mt * (dp + 8);
        if (2 * (stage + (qtile > stage ? qtile : stage)) <= 48 * 1024 || bc == 16)
            break;
    }
    unsigned views = k->k->views;
    FILE *f = k->f;
    k->sync = 1;
    fputs(cg_embed_flash_lib_cuh, f);
    cu_kernel_begin(k);
    fprintf(f, "    /* FlashAttention-2 on tensor cores: operands in %s, copied as stored (cp.async, ldmatrix); scores and sums in f32 */\n",
            k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16");
    cu_att_forward_sizes(k, a, a->E + stats);
    fprintf(f, "#define XTC_FA_MT %d\n#define XTC_FA_BC %d\n#define XTC_FA_DP %lld\n#define XTC_FA_EP %lld\n", mt, bc, dp, ep);
    fprintf(f, "#define XTC_FA_MMA %s\n#define XTC_FA_PACK %s\n#define XTC_FA_STATS %d\n",
            k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16",
            k->gen->mma == CG_MMA_FP16 ? "xtc_fa_pack_f16" : "xtc_fa_pack_bf16", stats);
    /* the batch indices and the operands' rows, and a row's keys: the shared emitters' text */
    CuAttCapture c;
    if (cu_att_capture_begin(k, &c) < 0)
        return -1;
    cu_att_batch_indices(k, q, "        ");
    cu_att_operand_rows(k, q, views & CG_VIEW_Q, "const ", cu_mem_type(q), "qb", "in0", "I", "D", "qs");
    cu_att_operand_rows(k, kk, views & CG_VIEW_K, "const ", cu_mem_type(kk), "kb", "in1", "J", "D", "ks");
    cu_att_operand_rows(k, v, views & CG_VIEW_V, "const ", cu_mem_type(v), "vb", "in2", "J", "E", "vs");
    cu_att_operand_rows(k, x, views & CG_VIEW_OUT, "", cu_mem_type(x), "ob", "out", "I", "OC", "os");
    cu_att_capture_define(k, &c, "XTC_FA_TILE");
    if (cu_att_capture_begin(k, &c) < 0)
        return -1;
    fprintf(k->f, "    {\n");
    cu_att_key_range(k, a, "        ");
    fprintf(k->f, "        xtc_lo = jb;\n        xtc_hi = je;\n    }");
    cu_att_capture_define(k, &c, "XTC_FA_KEYS(i, xtc_lo, xtc_hi)");
    /* plain, within a row's key range only a causal row that sees no key is masked (keep's
     * limits hold for the others); else the score as the CUDA-core kernels make it */
    if (plain)
        fprintf(f, "#define XTC_FA_SCORE(xtc_x, i, j) (%s ? (xtc_x) * (%s) : -3.40282347e+38f)\n",
                a->causal ? "(i) + J - I >= 0" : "1", a->scale);
    else
        fprintf(f, "#define XTC_FA_SCORE(xtc_x, i, j) ((%s) ? (xtc_x) * (%s)%s : -3.40282347e+38f)\n", a->keep, a->scale,
                a->bias);
    /* full tiles (plain): every key of the tile below J, at or below the first row's causal
     * limit, at or above the last row's window limit */
    if (plain) {
        fprintf(f, "#define XTC_FA_FULL(rf, rl, j0) ((j0) + %d <= J", bc);
        if (a->causal)
            fprintf(f, " && (j0) + %d <= (rf) + J - I", bc - 1);
        if (a->window > 0)
            fprintf(f, " && (j0) >= (rl) + J - I - %lld", a->window);
        fprintf(f, ")\n");
        char c[64];
        fprintf(f, "#define XTC_FA_SCALE2 %s\n", cu_float(scale->f * 1.4426950408889634, c, sizeof c));
    } else {
        fprintf(f, "#define XTC_FA_FULL(rf, rl, j0) 0\n#define XTC_FA_SCALE2 1.0f\n");
    }
    /* bounded: every row sees a key unless causal with fewer keys than queries. Not with fp16
     * tensor cores: P = 2^(s - bound) packed to fp16 would lose the probabilities below 2^-24 (a
     * row whose scores are all far below the bound), where bf16 keeps f32's exponent range */
    if (a->bmax[0] && k->gen->mma != CG_MMA_FP16) {
        char c[64];
        fprintf(f, "#define XTC_FA_BOUNDED (%s)\n#define XTC_FA_BOUND %s\n", a->causal ? "J >= I" : "1",
                cu_float((double)x->ia[IR_IA_BOUND] * scale->f * 1.4426950408889634, c, sizeof c));
    } else {
        fprintf(f, "#define XTC_FA_BOUNDED 0\n#define XTC_FA_BOUND 0.0f\n");
    }
    fputs(cg_embed_flash_fwd_cuh, f);
    cu_kernel_end(k);
    char tiles[CU_EXPR], rows[3 * CU_EXPR];
    cu_ceil_div(a->I, 64 * mt, tiles, sizeof tiles);
    snprintf(rows, sizeof rows, "%s%s%s * %s%s%s", po(a->batches), a->batches, pc(a->batches), po(tiles), tiles,
             pc(tiles));
    cu_geom_rows(k, rows, 128);
    return 1;
}

int cu_attention_mma(CuKernel *k, const Att *a, int stats)
{
    if (k->gen->mma == CG_MMA_OFF || a->D < 1 || a->E < 1 || a->D > MMA_HEAD || a->E > MMA_HEAD)
        return 0;
    int rc = flash16(k, a, stats); /* operands in the mma's format: kernels/flash_fwd.cuh */
    if (rc)
        return rc < 0 ? -1 : 1;
    const IrNode *x = k->node, *q = x->in[0], *kk = x->in[1], *v = x->in[2];
    unsigned views = k->k->views;
    const char *mma = k->gen->mma == CG_MMA_FP16 ? "xtc_mma_m16n8k16_f16" : "xtc_mma_m16n8k16_bf16";
    const char *pack = k->gen->mma == CG_MMA_FP16 ? "xtc_pack_f16x2" : "xtc_pack_bf16x2";
    long long dk = (a->D + 15) / 16, en = (a->E + 7) / 8; /* k-steps of QK^T, n tiles of PV */
    long long dpairs = 8 * dk, epad = 8 * en;
    int sn = BC / 8, pk = BC / 16; /* score tiles, k-steps of PV */
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    /* FlashAttention-2 on tensor cores: operands in %s, scores and sums in f32 */\n",
            k->gen->mma == CG_MMA_FP16 ? "fp16" : "bf16");
    fprintf(f, "    __shared__ unsigned Ks[%d][%lld]; /* [key][d pair]: the key tile in 16-bit pairs */\n", BC, dpairs + 4);
    fprintf(f, "    __shared__ unsigned Vt[%lld][%d]; /* [e][key pair]: the value tile, transposed */\n", epad, BC / 2 + 4);
    cu_att_forward_sizes(k, a, a->E + stats);
    fprintf(f, "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n");
    fprintf(f, "    const int g = lane / 4, t = lane %% 4; /* the fragment coordinates of the lane */\n");
    fprintf(f, "    const i64 tiles = (I + %d) / %d;\n", BR - 1, BR);
    fprintf(f, "    for (i64 tile = blockIdx.x; tile < batches * tiles; tile += gridDim.x) {\n");
    fprintf(f, "        const i64 batch = tile / tiles, i0 = tile %% tiles * %d;\n", BR);
    cu_att_batch_indices(k, q, "        ");
    cu_att_operand_rows(k, q, views & CG_VIEW_Q, "const ", cu_mem_type(q), "qb", "in0", "I", "D", "qs");
    cu_att_operand_rows(k, kk, views & CG_VIEW_K, "const ", cu_mem_type(kk), "kb", "in1", "J", "D", "ks");
    cu_att_operand_rows(k, v, views & CG_VIEW_V, "const ", cu_mem_type(v), "vb", "in2", "J", "E", "vs");
    cu_att_operand_rows(k, x, views & CG_VIEW_OUT, "", cu_mem_type(x), "ob", "out", "I", "OC", "os");
    /* the lane's two rows: r = 0 row g, r = 1 row g + 8 of the warp's 16 */
    fprintf(f, "        const i64 r0 = i0 + warp * 16 + g;\n");
    fprintf(f, "        unsigned qf[%lld][4]; /* the warp's query rows: A fragments, one per k-step of 16 */\n", dk);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "        for (int kd = 0; kd < %lld; kd++)\n", dk);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int u = 0; u < 4; u++) { /* a[u]: row g + 8 (u %% 2), columns 16 kd + 2 t + 8 (u / 2) */\n");
    fprintf(f, "                const i64 i = r0 + 8 * (u %% 2);\n");
    fprintf(f, "                const int d = 16 * kd + 2 * t + 8 * (u / 2);\n");
    cu_att_pair(k, q, "                ", "qf[kd][u]", "qb", "i < I && d < D", "i * qs + d", "i < I && d + 1 < D",
                "i * qs + d + 1");
    fprintf(f, "            }\n");
    fprintf(f, "        i64 rjb[2], rje[2]; /* each row's keys */\n");
    fprintf(f, "        float mx[2], lsum[2], o[%lld][4]; /* running max and (this lane's part of the) sum; O */\n", en);
    fprintf(f, "#pragma unroll\n        for (int r = 0; r < 2; r++) {\n");
    fprintf(f, "            const i64 i = r0 + 8 * r;\n");
    cu_att_key_range(k, a, "            ");
    fprintf(f, "            rjb[r] = i < I ? jb : 0;\n            rje[r] = i < I ? je : 0;\n");
    fprintf(f, "            mx[r] = -XTC_INF;\n            lsum[r] = 0.0f;\n        }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "        for (int ci = 0; ci < %lld; ci++)\n", en);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int u = 0; u < 4; u++)\n                o[ci][u] = 0.0f;\n");
    cu_att_tile_keys(k, a, BR, "        ");
    fprintf(f, "        for (i64 j0 = tjb; j0 < tje; j0 += %d) {\n", BC);
    fprintf(f, "            for (int e = threadIdx.x; e < %d * %lld; e += blockDim.x) {\n", BC, dpairs);
    fprintf(f, "                const int c = e / %lld, p = e %% %lld, d = 2 * p; /* key, d pair */\n", dpairs, dpairs);
    fprintf(f, "                const i64 j = j0 + c;\n");
    cu_att_pair(k, kk, "                ", "Ks[c][p]", "kb", "j < tje && d < D", "j * ks + d", "j < tje && d + 1 < D",
                "j * ks + d + 1");
    fprintf(f, "            }\n");
    fprintf(f, "            for (int e = threadIdx.x; e < %d * %lld; e += blockDim.x) {\n", BC / 2, epad);
    fprintf(f, "                const int c = e %% %lld, p = e / %lld; /* value column, key pair */\n", epad, epad);
    fprintf(f, "                const i64 j = j0 + 2 * p;\n");
    cu_att_pair(k, v, "                ", "Vt[c][p]", "vb", "j < tje && c < E", "j * vs + c", "j + 1 < tje && c < E",
                "(j + 1) * vs + c");
    fprintf(f, "            }\n");
    fprintf(f, "            __syncthreads(); /* Ks, Vt */\n");
    fprintf(f, "            float s[%d][4]; /* S = Q K^T: tile c holds keys 8 c .. 8 c + 7 */\n", sn);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int c = 0; c < %d; c++)\n", sn);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int u = 0; u < 4; u++)\n                    s[c][u] = 0.0f;\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int kd = 0; kd < %lld; kd++)\n", dk);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int c = 0; c < %d; c++) {\n", sn);
    fprintf(f, "                    const unsigned bf[2] = {Ks[8 * c + g][8 * kd + t], Ks[8 * c + g][8 * kd + t + 4]};\n");
    fprintf(f, "                    %s(s[c], qf[kd], bf, s[c]);\n", mma);
    fprintf(f, "                }\n");
    /* the scores as the CUDA-core kernel makes them, then the online softmax */
    fprintf(f, "            float rmax[2] = {-XTC_INF, -XTC_INF};\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int c = 0; c < %d; c++)\n", sn);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int u = 0; u < 4; u++) { /* d[u]: row g + 8 (u / 2), key 8 c + 2 t + u %% 2 */\n");
    fprintf(f, "                    const int r = u / 2;\n");
    fprintf(f, "                    const i64 i = r0 + 8 * r, j = j0 + 8 * c + 2 * t + u %% 2;\n");
    fprintf(f, "                    float sc = -XTC_INF; /* outside the row's keys: weight 0 */\n");
    fprintf(f, "                    if (j >= rjb[r] && j < rje[r]) {\n");
    fprintf(f, "                        const float scale = %s;\n", a->scale);
    fprintf(f, "                        sc = %s ? s[c][u] * scale%s : -3.40282347e+38f; /* -FLT_MAX where masked */\n",
            a->keep, a->bias);
    fprintf(f, "                    }\n");
    fprintf(f, "                    s[c][u] = sc;\n");
    fprintf(f, "                    rmax[r] = xtc_fmax(rmax[r], sc);\n");
    fprintf(f, "                }\n");
    fprintf(f, "            float alpha[2];\n");
    fprintf(f, "#pragma unroll\n            for (int r = 0; r < 2; r++) {\n");
    fprintf(f, "                for (int w = 1; w < 4; w <<= 1) /* the row's four lanes */\n");
    fprintf(f, "                    rmax[r] = xtc_fmax(rmax[r], __shfl_xor_sync(0xffffffffu, rmax[r], w));\n");
    fprintf(f, "                const float m_new = xtc_fmax(mx[r], rmax[r]);\n");
    fprintf(f, "                alpha[r] = m_new == -XTC_INF ? 1.0f : expf(mx[r] - m_new);\n");
    fprintf(f, "                mx[r] = m_new;\n");
    fprintf(f, "                lsum[r] *= alpha[r];\n            }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int c = 0; c < %d; c++)\n", sn);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int u = 0; u < 4; u++) {\n");
    fprintf(f, "                    const float p = s[c][u] == -XTC_INF ? 0.0f : expf(s[c][u] - mx[u / 2]);\n");
    fprintf(f, "                    s[c][u] = p;\n");
    fprintf(f, "                    lsum[u / 2] += p;\n                }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int ci = 0; ci < %lld; ci++)\n", en);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int u = 0; u < 4; u++)\n                    o[ci][u] *= alpha[u / 2];\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int kc = 0; kc < %d; kc++) { /* O += P V: keys 16 kc .. 16 kc + 15 */\n", pk);
    fprintf(f, "                const unsigned pa[4] = {%s(s[2 * kc][0], s[2 * kc][1]), %s(s[2 * kc][2], s[2 * kc][3]),\n",
            pack, pack);
    fprintf(f, "                                        %s(s[2 * kc + 1][0], s[2 * kc + 1][1]), %s(s[2 * kc + 1][2], s[2 * kc + 1][3])};\n",
            pack, pack);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int ci = 0; ci < %lld; ci++) {\n", en);
    fprintf(f, "                    const unsigned bf[2] = {Vt[8 * ci + g][8 * kc + t], Vt[8 * ci + g][8 * kc + t + 4]};\n");
    fprintf(f, "                    %s(o[ci], pa, bf, o[ci]);\n", mma);
    fprintf(f, "                }\n            }\n");
    fprintf(f, "            __syncthreads(); /* before the next stage replaces Ks, Vt */\n");
    fprintf(f, "        }\n");
    fprintf(f, "#pragma unroll\n        for (int r = 0; r < 2; r++) {\n");
    fprintf(f, "            for (int w = 1; w < 4; w <<= 1) /* the row's sum over its four lanes */\n");
    fprintf(f, "                lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], w);\n");
    fprintf(f, "            const i64 i = r0 + 8 * r;\n");
    fprintf(f, "            if (i >= I)\n                continue;\n");
    fprintf(f, "            %s *orow = ob + i * os;\n", cu_mem_type(x));
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int ci = 0; ci < %lld; ci++)\n", en);
    fprintf(f, "#pragma unroll\n                for (int u = 0; u < 2; u++) {\n");
    fprintf(f, "                    const int col = 8 * ci + 2 * t + u;\n");
    fprintf(f, "                    if (col < E)\n");
    fprintf(f, "                        xtc_st(orow, col, J > 0 ? o[ci][2 * r + u] / lsum[r] : 0.0f);\n");
    fprintf(f, "                }\n");
    if (stats)
        fprintf(f, "            if (t == 0)\n                xtc_st(orow, E, J > 0 ? mx[r] + logf(lsum[r]) : -XTC_INF); /* the logsumexp */\n");
    fprintf(f, "        }\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char tiles[CU_EXPR], rows[3 * CU_EXPR];
    cu_ceil_div(a->I, BR, tiles, sizeof tiles);
    snprintf(rows, sizeof rows, "%s%s%s * %s%s%s", po(a->batches), a->batches, pc(a->batches), po(tiles), tiles,
             pc(tiles));
    cu_geom_rows(k, rows, 128);
    return 1;
}
