/* cg_cuda_attention_decode.c: attention of a few query rows against many keys (one token of
 * incremental decoding against its KV cache), the forward kernel's path chosen at run time when
 * I <= DEC_ROWS: the keys split over warps, as flash-decoding does.
 *
 * The forward kernels (cg_cuda_attention.c, cg_cuda_attention_mma.c) give a block to each tile of
 * 32-64 query rows of a (batch, head) matrix and walk its keys serially: with one query row that
 * is one block per head, each reading the whole cache in turn. Here warp w of the grid takes keys
 * [32 w, 32 w + 32) of its matrix, one per lane:
 *
 *   1. the lane's score q . k_j (scale, bias, mask, causal and window as the other kernels: a
 *      key outside the row's range scores -inf, weight 0; a masked one -FLT_MAX);
 *   2. the warp's maximum m and sum l of exp(s - m) by shuffles, and its share of the output,
 *      o[e] = sum_j p_j v[j, e] (the lanes across e, p_j broadcast from lane j);
 *   3. (m, l, o) stored in the kernel's own global memory (XTC_GLOBAL); the block that finishes
 *      last among those of its matrix (a counter per matrix) combines them:
 *      M = max m_s, L = sum l_s e^(m_s - M), out = sum o_s e^(m_s - M) / L, and the
 *      logsumexp M + log L where the node keeps it.
 * Bounded (cosine-sim attention: Att.bmax, no mask operand; under causal J >= I, a run-time
 * condition) every m is the bound b s from the start, as in the tiled forward: no shuffles for
 * the maximum, and the combination's weights e^(m_s - M) are all 1. The probabilities stay f32
 * here (nothing is packed to 16 bits as in kernels/flash_fwd.cuh), so 16-bit storage, fp16
 * included, takes it too: each exp(score - b s) >= exp(-2 b s) is a normal float.
 *
 * No shared memory beyond one flag: the path sits in front of the other kernels, whose tiles may
 * fill it. The rows of a matrix (at most DEC_ROWS) are taken one after another by each warp. It is
 * taken when the partial results fit (DEC_FLOATS floats, DEC_MATS matrices) and the value rows
 * are at most 32 DEC_EC wide; else the other kernels run. Under --mma q, k and v are rounded to
 * the tensor cores' format, as the tensor-core kernel rounds them (cu_mma_operand). The
 * partials and counters belong to the kernel: two launches of it must not run at once (the
 * schedule runs its steps in order on one stream). */
#include "cg_cuda_attention.h"

#include <stdlib.h>
#include <string.h>

#define DEC_ROWS 8           /* query rows up to which this path is taken */
#define DEC_EC 8             /* value columns a lane sums: E up to 256 */
#define DEC_MATS 4096        /* (batch, head) matrices the counters cover */
#define DEC_FLOATS (1 << 18) /* room for the partial results (1 MiB) */

static const char *po(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *pc(const char *e) { return strchr(e, ' ') ? ")" : ""; }


/* Whether node x may have few enough query rows for this path, and its head sizes fit it. */
static int may_take(const CuKernel *k)
{
    const IrNode *x = k->node, *q = x->in[0], *v = x->in[2];
    int r = q->rank;
    if (!ir_dim_is_const(q->shape[r - 1]) || !ir_dim_is_const(v->shape[r - 1]) || v->shape[r - 1].c > 32 * DEC_EC ||
        q->shape[r - 1].c < 1 || v->shape[r - 1].c < 1)
        return 0;
    IrDim i = q->shape[r - 2];
    for (int s = 0; s < IR_MAXSYM; s++)
        if (i.k[s])
            return 1;
    return i.c >= 1 && i.c <= DEC_ROWS;
}

/* The decode path's code, at the start of the kernel's body: taken or not at run time. */
static void decode_body(CuKernel *k, const Att *a, int stats, unsigned block)
{
    const IrNode *x = k->node, *q = x->in[0], *kk = x->in[1], *v = x->in[2];
    unsigned views = k->k->views;
    const char *fn = k->k->fn;
    FILE *f = k->f;
    int ec = (int)((a->E + 31) / 32), nw = (int)(block / 32);
    char qv[128], kv[128], vv[160];
    cu_mma_operand(k, "xtc_ld(qb, i * qs + d)", qv, sizeof qv);
    cu_mma_operand(k, "xtc_ld(kb, j * ks + d)", kv, sizeof kv);
    cu_mma_operand(k, "xtc_ld(vb, (c0 + jj) * vs + e)", vv, sizeof vv);
    fprintf(f, "    { /* few query rows: the keys split over warps (cg_cuda_attention_decode.c) */\n");
    fprintf(f, "    __shared__ int dlast;\n");
    cu_att_forward_sizes(k, a, a->E + stats);
    fprintf(f, "    const i64 SW = (J + 31) / 32, dbl = (SW + %d) / %d; /* warps of keys, blocks per matrix */\n", nw - 1, nw);
    fprintf(f, "    if (I >= 1 && I <= %d && J >= 1 && batches <= %d && batches * I * SW * (E + 2) <= %d) {\n", DEC_ROWS,
            DEC_MATS, DEC_FLOATS);
    fprintf(f, "    const int dlane = threadIdx.x %% 32, dwarp = threadIdx.x / 32;\n");
    fprintf(f, "    for (i64 dblk = blockIdx.x; dblk < batches * dbl; dblk += gridDim.x) {\n");
    fprintf(f, "        const i64 batch = dblk / dbl, sw = dblk %% dbl * %d + dwarp; /* the matrix, the warp's keys */\n", nw);
    cu_att_batch_indices(k, q, "        ");
    cu_att_operand_rows(k, q, views & CG_VIEW_Q, "const ", cu_mem_type(q), "qb", "in0", "I", "D", "qs");
    cu_att_operand_rows(k, kk, views & CG_VIEW_K, "const ", cu_mem_type(kk), "kb", "in1", "J", "D", "ks");
    cu_att_operand_rows(k, v, views & CG_VIEW_V, "const ", cu_mem_type(v), "vb", "in2", "J", "E", "vs");
    cu_att_operand_rows(k, x, views & CG_VIEW_OUT, "", cu_mem_type(x), "ob", "out", "I", "OC", "os");
    fprintf(f, "        const i64 c0 = sw * 32;\n");
    if (a->D % 8 == 0)
        fprintf(f, "        const int dvec = qs %% 8 == 0 && ks %% 8 == 0 && ((size_t)qb | (size_t)kb) %% 16 == 0; /* 16-byte loads */\n");
    if (a->bmax[0]) /* bounded: every row sees a key unless causal with fewer keys than queries */
        fprintf(f, "        const int bounded = %s; /* block-uniform: the shuffles stay whole */\n",
                a->causal ? "J >= I" : "1");
    fprintf(f, "        for (i64 i = 0; sw < SW && i < I; i++) { /* warp-uniform */\n");
    cu_att_key_range(k, a, "            ");
    fprintf(f, "            const i64 cb = c0 > jb ? c0 : jb, ce = c0 + 32 < je ? c0 + 32 : je; /* the warp's keys of row i */\n");
    fprintf(f, "            const i64 j = c0 + dlane;\n");
    fprintf(f, "            float sc = -XTC_INF; /* outside the row's keys: weight 0 */\n");
    fprintf(f, "            if (j >= cb && j < ce) {\n");
    fprintf(f, "                float dot = 0.0f;\n");
    if (a->D % 8 == 0) { /* the rows 16 bytes at a time where aligned */
        char qe[64], ke[64];
        cu_mma_operand(k, "qw[u]", qe, sizeof qe);
        cu_mma_operand(k, "kw[u]", ke, sizeof ke);
        fprintf(f, "                if (dvec) {\n");
        fprintf(f, "#pragma unroll 8\n");
        fprintf(f, "                    for (int d = 0; d < D; d += 8) {\n");
        fprintf(f, "                        float qw[8], kw[8];\n");
        cu_load_vec8(k, "qw", "qb", "i * qs + d", "                        ");
        cu_load_vec8(k, "kw", "kb", "j * ks + d", "                        ");
        fprintf(f, "#pragma unroll\n");
        fprintf(f, "                        for (int u = 0; u < 8; u++)\n");
        fprintf(f, "                            dot += %s * %s;\n", qe, ke);
        fprintf(f, "                    }\n");
        fprintf(f, "                } else {\n");
        fprintf(f, "                    for (int d = 0; d < D; d++)\n");
        fprintf(f, "                        dot += %s * %s;\n", qv, kv);
        fprintf(f, "                }\n");
    } else {
        fprintf(f, "#pragma unroll 8\n");
        fprintf(f, "                for (int d = 0; d < D; d++)\n");
        fprintf(f, "                    dot += %s * %s;\n", qv, kv);
    }
    fprintf(f, "                const float scale = %s;\n", a->scale);
    fprintf(f, "                sc = %s ? dot * scale%s : -3.40282347e+38f; /* -FLT_MAX where masked */\n", a->keep, a->bias);
    fprintf(f, "            }\n");
    if (a->bmax[0]) /* bounded: the row's maximum is the bound, no maximum to reduce */
        fprintf(f, "            const float dm = bounded ? %s : xtc_warp_max(sc);\n", a->bmax);
    else
        fprintf(f, "            const float dm = xtc_warp_max(sc);\n");
    fprintf(f, "            const float pj = sc == -XTC_INF ? 0.0f : expf(sc - dm);\n");
    fprintf(f, "            const float dsum = xtc_warp_sum(pj);\n");
    fprintf(f, "            float acc[%d];\n", ec);
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int ci = 0; ci < %d; ci++)\n", ec);
    fprintf(f, "                acc[ci] = 0.0f;\n");
    fprintf(f, "#pragma unroll 4\n");
    fprintf(f, "            for (i64 jj = cb - c0; jj < ce - c0; jj++) { /* O += p_j v_j, the lanes across e */\n");
    fprintf(f, "                const float p = __shfl_sync(0xffffffffu, pj, (int)jj);\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "                for (int ci = 0; ci < %d; ci++) {\n", ec);
    fprintf(f, "                    const int e = dlane + 32 * ci;\n");
    fprintf(f, "                    if (e < E)\n");
    fprintf(f, "                        acc[ci] += p * %s;\n", vv);
    fprintf(f, "                }\n");
    fprintf(f, "            }\n");
    fprintf(f, "            float *part = xtc_dpart_%s + ((batch * I + i) * SW + sw) * (E + 2);\n", fn);
    fprintf(f, "            if (dlane == 0) {\n");
    fprintf(f, "                part[0] = dm;\n");
    fprintf(f, "                part[1] = dsum;\n");
    fprintf(f, "            }\n");
    fprintf(f, "#pragma unroll\n");
    fprintf(f, "            for (int ci = 0; ci < %d; ci++)\n", ec);
    fprintf(f, "                if (dlane + 32 * ci < E)\n");
    fprintf(f, "                    part[2 + dlane + 32 * ci] = acc[ci];\n");
    fprintf(f, "        }\n");
    fprintf(f, "        __threadfence(); /* the partials are visible before the count says so */\n");
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        if (threadIdx.x == 0)\n");
    fprintf(f, "            dlast = atomicAdd(&xtc_ddone_%s[batch], 1u) == (unsigned)(dbl - 1);\n", fn);
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        if (dlast) { /* the matrix's last block: combine its rows' partials */\n");
    fprintf(f, "            __threadfence();\n");
    fprintf(f, "            for (i64 t = threadIdx.x; t < I * (E + 1); t += blockDim.x) {\n");
    fprintf(f, "                const i64 i = t / (E + 1);\n");
    fprintf(f, "                const int e = (int)(t %% (E + 1)); /* E: the logsumexp */\n");
    fprintf(f, "                const volatile float *pp = xtc_dpart_%s + (batch * I + i) * SW * (E + 2);\n", fn);
    fprintf(f, "                float mx = -XTC_INF, lsum = 0.0f, sum = 0.0f;\n");
    if (a->bmax[0]) /* bounded: every warp's m is the bound, so is M (each weight 1) */
        fprintf(f, "                if (bounded)\n"
                   "                    mx = %s;\n"
                   "                else\n"
                   "                    for (i64 s = 0; s < SW; s++)\n"
                   "                        mx = xtc_fmax(mx, pp[s * (E + 2)]);\n", a->bmax);
    else
        fprintf(f, "                for (i64 s = 0; s < SW; s++)\n"
                   "                    mx = xtc_fmax(mx, pp[s * (E + 2)]);\n");
    fprintf(f, "                for (i64 s = 0; s < SW; s++) {\n");
    fprintf(f, "                    const float ms = pp[s * (E + 2)];\n");
    fprintf(f, "                    const float w = %sms == -XTC_INF ? 0.0f : expf(ms - mx);\n",
            a->bmax[0] ? "bounded ? 1.0f : " : "");
    fprintf(f, "                    lsum += pp[s * (E + 2) + 1] * w;\n");
    fprintf(f, "                    if (e < E)\n");
    fprintf(f, "                        sum += pp[s * (E + 2) + 2 + e] * w;\n");
    fprintf(f, "                }\n");
    fprintf(f, "                if (e < E)\n");
    fprintf(f, "                    xtc_st(ob, i * os + e, lsum > 0.0f ? sum / lsum : 0.0f);\n");
    if (stats)
        fprintf(f, "                else\n                    xtc_st(ob, i * os + E, lsum > 0.0f ? mx + logf(lsum) : -XTC_INF); /* the logsumexp */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            if (threadIdx.x == 0)\n");
    fprintf(f, "                xtc_ddone_%s[batch] = 0; /* for the next launch */\n", fn);
    fprintf(f, "        }\n");
    fprintf(f, "        __syncthreads(); /* dlast, before the next matrix */\n");
    fprintf(f, "    }\n");
    fprintf(f, "    return;\n");
    fprintf(f, "    }\n");
    fprintf(f, "    }\n");
}

int cu_attention_decode(CuKernel *k)
{
    if (k->inner || !may_take(k))
        return 0;
    FILE *f = k->f;
    char *buf = NULL;
    size_t len = 0;
    /* the other kernels' text and geometry, with this path written in front of their body */
    k->inner = 1;
    k->f = open_memstream(&buf, &len);
    if (!k->f) {
        k->f = f;
        k->inner = 0;
        return 0;
    }
    int rc = cg_cuda_attention(k);
    fclose(k->f);
    k->f = f;
    k->inner = 0;
    const char *sig = buf ? strstr(buf, "XTC_KERNEL ") : NULL; /* (after the functions some kernels have) */
    const char *body = sig ? strstr(sig, ")\n{\n") : NULL;
    if (rc < 0 || !body || k->geom.block % 32 || k->geom.block < 32 || k->geom.grid_y[0]) {
        if (buf && rc == 0)
            fputs(buf, f); /* the other kernel alone */
        free(buf);
        return rc < 0 ? -1 : 1;
    }
    body += 4;
    const IrNode *x = k->node;
    Att a;
    if (cu_att_setup(k, &a, x->in[0], x->in[1], x->in[2], x->in[3], x->in[4], x->in[5], "in3", "in4", "in5",
                     x->ia[IR_IA_CAUSAL] != 0, x->ia[IR_IA_WINDOW]) < 0) {
        free(buf);
        return -1;
    }
    int stats = x->ia[IR_IA_STATS] != 0;
    const char *fn = k->k->fn;
    /* named after the kernel, ending with its name (test_cuda_nvrtc renames kernels so) */
    fprintf(f, "/* %s: the key warps' partial results, and per matrix how many blocks have finished */\n", fn);
    fprintf(f, "XTC_GLOBAL float xtc_dpart_%s[%d];\nXTC_GLOBAL unsigned xtc_ddone_%s[%d];\n", fn, DEC_FLOATS, fn, DEC_MATS);
    fwrite(buf, 1, (size_t)(body - buf), f);
    decode_body(k, &a, stats, k->geom.block);
    fputs(body, f);
    free(buf);
    /* the grid: blocks of the decode path where it is taken */
    int nw = (int)(k->geom.block / 32);
    char sw[2 * CU_EXPR], dbl[3 * CU_EXPR], grid[sizeof k->geom.grid_x];
    cu_ceil_div(a.J, 32, sw, sizeof sw);
    snprintf(dbl, sizeof dbl, "((%s) + %d) / %d", sw, nw - 1, nw);
    size_t n = (size_t)snprintf(grid, sizeof grid,
                                "(%s) >= 1 && (%s) <= %d && (%s) >= 1 && (%s) <= %d && %s%s%s * (%s) * (%s) * %lld <= %d ? "
                                "%s%s%s * %s : (%s)",
                                a.I, a.I, DEC_ROWS, a.J, a.batches, DEC_MATS, po(a.batches), a.batches, pc(a.batches), a.I, sw,
                                a.E + 2, DEC_FLOATS, po(a.batches), a.batches, pc(a.batches), dbl, k->geom.grid_x);
    if (n >= sizeof grid)
        return cu_error(k->gen, "attention: the launch geometry's expression is too long");
    memcpy(k->geom.grid_x, grid, n + 1);
    return 1;
}
