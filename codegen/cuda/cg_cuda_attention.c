/* cg_cuda_attention.c: the fused attention ops (passes/ makes them; ir/interp_fused.c defines
 * them) as CUDA kernels that never store the [I, J] score matrix.
 *
 * attention(q[.., I, D], k[.., J, D], v[.., J, E], bias, mask, scale) -> [.., I, E (+1)]
 *   Tiled as FlashAttention does (attention_tiled): a block of 128 threads per 64 query rows
 *   (32 when there are fewer than ATT_MANY tiles of 64, fewer for wide heads), the keys and
 *   values by tiles of 32 through shared memory, the scores and the probabilities-times-values
 *   products as small register tiles per thread,
 *   the online softmax (running max mx, running sum l) per row, reduced across the row's lanes
 *   with shuffles. With stats the last column is the row's logsumexp mx + log l. Bounded
 *   (cosine-sim attention: the attribute bound = b, a constant scale s, no bias; here also no mask
 *   operand, so that every row sees a key when J >= I, which the kernel checks at run time) mx
 *   starts at b s and stays: no maximum to reduce, nothing to rescale, as on the CPU
 *   (cg_llvm_attention.c), and each exp(score - b s) >= exp(-2 b s) stays a normal float. Through
 *   head-split views (cg_plan.h, CG_VIEW_*) it reads q, k, v as [b, rows, H, width] with row
 *   stride H width, and writes its result so, as the merge permute's value; the backward never
 *   reads through views. Head sizes whose tiles do not fit 48 KiB of shared memory take the row
 *   kernel: a block per query row, the keys in chunks of one per thread. When the module's
 *   matmuls run on tensor cores (--mma, the default of --dtype bf16|fp16) and the heads are at
 *   most 128 wide, the forward is cg_cuda_attention_mma.c's FlashAttention-2 kernel instead.
 * attention_grad(q, k, v, o, dout, bias, mask, scale) -> [.., I + 2J, D]: dq, dk, dv stacked
 *   Blocks of query rows (their dq rows) and blocks of keys (their dk and dv rows), so that
 *   every output row has one writer: no atomics, the same result on every run; tiled
 *   (attention_grad_tiled, T = 32 rows and keys) or, for wide heads, a block per row; with --mma
 *   and heads up to 64 (128 with 16-bit storage of the mma's format), cg_cuda_attention_mma_grad.c's
 *   tensor-core kernels, split the same way. Grouped key/values (k and v with G heads where q
 *   has H, ops.def), in every kernel: a dq block reads its query head's key/value head
 *   (cu_att_grad_rows), a dk/dv block of a head g < G loops over the query heads g, g + G, .. in
 *   order, summing into the same registers, and writes head g's rows; those of heads G..H-1
 *   write zeros (cu_att_grad_zero_rows): still one writer per row. The
 *   probabilities come back from the forward output's logsumexp (o's last column),
 *   p_ij = exp(s_ij - lse_i) (1 / J in a row whose every score was masked, where the logsumexp
 *   rounds to -FLT_MAX), and the softmax term from D_i = dout_i . o_i (flash attention's
 *   identity sum_j p_ij dp_ij = dout_i . o_i):
 *     ds_ij = p_ij (dout_i . v_j - D_i + dlse_i) * scale, 0 where masked
 *     dq_i = sum_j ds_ij k_j,  dk_j = sum_i ds_ij q_i,  dv_j = sum_i p_ij dout_i
 *
 * Without a mask operand, the causal and window limits bound the loops (cu_att_key_range,
 * cu_att_query_ranges): a causal row visits keys up to its limit, not all J (half the work of causal
 * self-attention). The head sizes D and E must be constants (they size shared memory). A bias
 * that is the constant 0, a mask that is the constant true and a constant scale are folded into
 * the code. */
#include "cg_cuda_attention.h"

#include <stdlib.h>
#include <string.h>

#define ATT_BLOCK 128
#define MAX_HEAD CG_CUDA_ATTENTION_MAX_HEAD
#define ATT_MANY 512 /* query tiles of 64 rows from which the tiled forward keeps 64 (attention_tiled) */

static const char *po(const char *e) { return strchr(e, ' ') ? "(" : ""; }
static const char *pc(const char *e) { return strchr(e, ' ') ? ")" : ""; }

/* How a scores-shaped operand x (bias, mask, scale) is read at batch indices ix0.. and (i, j):
 * its offset expression, "" when x is a constant the code folds. */
static void operand_at(CuKernel *k, const IrNode *x, int r, const char *base, char *buf, size_t n)
{
    int f32 = x->dtype == IR_F32; /* loaded with xtc_ld: the storage may be 16 bits */
    size_t len = (size_t)snprintf(buf, n, f32 ? "xtc_ld(%s, " : "%s[", base);
    int terms = 0;
    for (int d = 0; d < r && len < n; d++) {
        int kd = d - (r - x->rank);
        if (kd < 0 || ir_dim_is_one(x->shape[kd]))
            continue;
        char stride[CU_EXPR];
        cu_dims_prod(k->gen, x->shape, kd + 1, x->rank, stride, sizeof stride);
        char index[16];
        if (d == r - 2)
            snprintf(index, sizeof index, "i");
        else if (d == r - 1)
            snprintf(index, sizeof index, "j");
        else
            snprintf(index, sizeof index, "ix%d", d);
        if (strcmp(stride, "1") == 0)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", terms++ ? " + " : "", index);
        else
            len += (size_t)snprintf(buf + len, n - len, "%s%s * %s%s%s", terms++ ? " + " : "", index, po(stride),
                                    stride, pc(stride));
    }
    if (len < n)
        snprintf(buf + len, n - len, "%s%s", terms ? "" : "0", f32 ? ")" : "]");
}

int cu_att_setup(CuKernel *k, Att *a, const IrNode *q, const IrNode *kk, const IrNode *v, const IrNode *bias,
                     const IrNode *mask, const IrNode *scale, const char *bias_in, const char *mask_in,
                     const char *scale_in, int causal, long long window)
{
    CuGen *gen = k->gen;
    int r = a->r = q->rank;
    if (!ir_dim_is_const(q->shape[r - 1]) || !ir_dim_is_const(v->shape[r - 1]) || q->shape[r - 1].c > MAX_HEAD ||
        v->shape[r - 1].c > MAX_HEAD)
        return cu_error(gen, "the cuda backend needs constant head sizes up to %d for attention (node %%%s)", MAX_HEAD,
                        k->node->label ? k->node->label : "?");
    a->D = (long long)q->shape[r - 1].c;
    a->E = (long long)v->shape[r - 1].c;
    cu_dim(gen, q->shape[r - 2], a->I, sizeof a->I);
    cu_dim(gen, kk->shape[r - 2], a->J, sizeof a->J);
    cu_dims_prod(gen, q->shape, 0, r - 2, a->batches, sizeof a->batches);
    char at[1024];
    if (bias->op == IR_CONST && bias->f == 0) {
        a->bias[0] = 0;
    } else {
        operand_at(k, bias, r, bias_in, at, sizeof at);
        snprintf(a->bias, sizeof a->bias, " + %s", at);
    }
    size_t len = 0;
    a->keep[0] = 0;
    a->causal = causal;
    a->window = window;
    a->limits = mask->op == IR_CONST && mask->f != 0 && (causal || window > 0);
    if (!(mask->op == IR_CONST && mask->f != 0)) {
        operand_at(k, mask, r, mask_in, at, sizeof at);
        len += (size_t)snprintf(a->keep, sizeof a->keep, "%s", at);
    }
    if (causal && len < sizeof a->keep)
        len += (size_t)snprintf(a->keep + len, sizeof a->keep - len, "%s(j <= i + J - I)", len ? " && " : "");
    /* a sliding window: masked like the rest (and, without a mask operand, its keys skipped:
     * cu_att_key_range, cu_att_query_ranges) */
    if (window > 0 && len < sizeof a->keep)
        snprintf(a->keep + len, sizeof a->keep - len, "%s(j >= i + J - I - %lld)", len ? " && " : "", window);
    if (!a->keep[0])
        snprintf(a->keep, sizeof a->keep, "1");
    if (scale->op == IR_CONST)
        cu_float(scale->f, a->scale, sizeof a->scale);
    else
        operand_at(k, scale, r, scale_in, a->scale, sizeof a->scale);
    a->bmax[0] = 0;
    const IrNode *x = k->node;
    if (x->op == IR_ATTENTION && x->ia[IR_IA_BOUND] > 0 && mask->op == IR_CONST && mask->f != 0 &&
        scale->op == IR_CONST) /* no mask operand: only causal rows can see no key (then J < I) */
        cu_float((double)x->ia[IR_IA_BOUND] * scale->f, a->bmax, sizeof a->bmax);
    return 0;
}

/* The keys [jb, je) query row i visits: all J, or without a mask operand only those within its
 * causal and window limits (the others have p = 0 exactly). A row that sees no key (i + J - I < 0
 * under causal) visits all J: it attends uniformly to them, as defined. */
void cu_att_key_range(CuKernel *k, const Att *a, const char *indent)
{
    FILE *f = k->f;
    fprintf(f, "%si64 jb = 0, je = J;\n", indent);
    if (!a->limits)
        return;
    fprintf(f, "%s%s{ /* the keys row i sees */\n", indent, a->causal ? "if (i + J - I >= 0) " : "");
    if (a->causal)
        fprintf(f, "%s    je = i + J - I + 1 < J ? i + J - I + 1 : J;\n", indent);
    if (a->window > 0)
        fprintf(f, "%s    jb = i + J - I - %lld > 0 ? i + J - I - %lld : 0;\n", indent, a->window, a->window);
    fprintf(f, "%s}\n", indent);
}

/* The query rows key j gets gradient from: [0, fm), the rows that see no key (they attend to all
 * J uniformly), and [ib, ie), those whose causal and window limits keep key j; [0, 0) and
 * [0, I) with a mask operand or no limit. */
void cu_att_query_ranges(CuKernel *k, const Att *a, const char *indent)
{
    FILE *f = k->f;
    fprintf(f, "%si64 fm = 0, ib = 0, ie = I;\n", indent);
    if (!a->limits)
        return;
    if (a->causal)
        fprintf(f, "%sfm = I - J > 0 ? (I - J < I ? I - J : I) : 0;\n%sib = j - (J - I) > fm ? j - (J - I) : fm;\n",
                indent, indent);
    if (a->window > 0)
        fprintf(f, "%sie = j - (J - I) + %lld + 1 < I ? j - (J - I) + %lld + 1 : I;\n", indent, a->window, a->window);
}

/* the batch index split into the batch dims ix0, ix1, ... (bias, mask and scale broadcast) */
void cu_att_batch_indices(CuKernel *k, const IrNode *q, const char *indent)
{
    FILE *f = k->f;
    int r = q->rank;
    if (r == 3) {
        fprintf(f, "%sconst i64 ix0 = batch;\n", indent);
    } else if (r > 3) {
        fprintf(f, "%si64 rest = batch;\n", indent);
        for (int d = r - 3; d >= 1; d--) {
            char size[CU_EXPR];
            cu_dim(k->gen, q->shape[d], size, sizeof size);
            fprintf(f, "%sconst i64 ix%d = rest %% %s%s%s;\n%srest /= %s%s%s;\n", indent, d, po(size), size, pc(size),
                    indent, po(size), size, pc(size));
        }
        fprintf(f, "%sconst i64 ix0 = rest;\n", indent);
    }
    for (int d = 0; d < r - 2; d++)
        fprintf(f, "%s(void)ix%d;\n", indent, d);
}

int cu_att_capture_begin(CuKernel *k, CuAttCapture *c)
{
    c->saved = k->f;
    c->buf = NULL;
    c->len = 0;
    if (!(k->f = open_memstream(&c->buf, &c->len))) {
        k->f = c->saved;
        return cu_error(k->gen, "out of memory");
    }
    return 0;
}

void cu_att_capture_define(CuKernel *k, CuAttCapture *c, const char *head)
{
    fclose(k->f);
    k->f = c->saved;
    cu_att_define_lines(k->f, head, c->buf);
    free(c->buf);
}

/* Where the [rows, width] matrix of batch index `batch` (flat over the batch dims) of a forward
 * attention operand or result x starts (pointer name), and its row stride (stride): contiguous
 * [.., rows, width]; or, through a head-split view (cg_plan.h, CG_VIEW_*), [b, rows, H, width]
 * read or written in place for the node's [b, H, rows, width]: the rows of head `batch % H` are
 * width elements every H width. Grouped key/values (k and v with G heads where q has H:
 * ops.def): query head i reads key/value head i mod G, so k and v are at their own batch index
 * (batch / H) G + batch % H % G, and in place as [b, rows, G, width]. */
void cu_att_operand_rows(CuKernel *k, const IrNode *x, unsigned view, const char *qual, const char *type,
                         const char *name, const char *base, const char *rows, const char *width, const char *stride)
{
    const IrNode *n = k->node;
    int64_t group = ir_attention_kv_group(n);
    char bat[96] = "batch", heads[32] = "H";
    if (group > 1 && (x == n->in[1] || x == n->in[2])) {
        int r = n->in[0]->rank;
        long long H = (long long)n->in[0]->shape[r - 3].c, G = (long long)n->in[1]->shape[r - 3].c;
        snprintf(bat, sizeof bat, "(batch / %lld * %lld + batch %% %lld %% %lld)", H, G, H, G);
        snprintf(heads, sizeof heads, "%lld", G);
    }
    if (!view)
        fprintf(k->f, "        %s%s *%s = %s + %s * %s * %s;\n        const i64 %s = %s;\n", qual, type, name, base, bat,
                rows, width, stride, width);
    else
        fprintf(k->f, "        %s%s *%s = %s + ((%s / %s) * %s * %s + %s %% %s) * %s;\n"
                      "        const i64 %s = %s * %s;\n", qual, type, name, base, bat, heads, rows, heads, bat, heads,
                width, stride, heads, width);
}

/* The forward kernels' sizes: I, J, batches, the head sizes, the output's columns OC, and with
 * head-split views the heads H. */
void cu_att_forward_sizes(CuKernel *k, const Att *a, long long ocols)
{
    FILE *f = k->f;
    unsigned views = k->k->views;
    fprintf(f, "    const i64 I = %s, J = %s, batches = %s;\n", a->I, a->J, a->batches);
    fprintf(f, "    const int D = %lld, E = %lld, OC = %lld; /* out has E columns, or E + 1 with the logsumexp */\n",
            a->D, a->E, ocols);
    if (views) {
        char h[CU_EXPR];
        cu_dim(k->gen, k->node->in[0]->shape[1], h, sizeof h); /* views exist for rank 4 only */
        fprintf(f, "    const i64 H = %s; /* heads; in place as [b, rows, H, width]:%s%s%s%s */\n", h,
                views & CG_VIEW_Q ? " q" : "", views & CG_VIEW_K ? " k" : "", views & CG_VIEW_V ? " v" : "",
                views & CG_VIEW_OUT ? " out" : "");
    }
}

/* The tiled forward kernel's tile: BR query rows by BC keys, with the query and key tiles
 * (transposed, rows padded by 4), the value tile (E padded to whole groups of 32 columns) and
 * the probabilities (transposed) in static shared memory (48 KiB at most), four rows and columns
 * of scores at most per thread and 64 accumulators; 0 when no tile fits (D or E too large): the
 * row kernel. */
static int att_tile(long long D, long long E, int *br, int *bc)
{
    static const int cand[][2] = {{64, 32}, {32, 32}, {32, 16}, {16, 16}};
    long long groups = (E + 31) / 32;
    for (size_t c = 0; c < sizeof cand / sizeof cand[0]; c++) {
        long long r = cand[c][0], b = cand[c][1];
        long long floats = D * (r + 4) + D * (b + 4) + b * 32 * groups + b * (r + 4);
        if (D >= 1 && E >= 1 && groups <= 4 && (r / 16) * 4 * groups <= 64 && floats * 4 <= 48 * 1024) {
            *br = (int)r;
            *bc = (int)b;
            return 1;
        }
    }
    return 0;
}

/* dst[0 .. n) = the n floats of shared memory at src (a run of a thread's rows or columns): one
 * 128-bit load when there are 4 (the runs start at multiples of 4, the arrays XTC_ALIGN16) */
static void lds_run(FILE *f, const char *dst, const char *src, int n, const char *indent)
{
    if (n == 4)
        fprintf(f, "%sxtc_lds4(%s, &%s);\n", indent, dst, src);
    else
        fprintf(f, "%sfor (int u = 0; u < %d; u++)\n%s    %s[u] = (&%s)[u];\n", indent, n, indent, dst, src);
}

/* tjb, tje: the keys of the tile of rows [i0, i0 + rows) (declared at indent), the union of
 * their key ranges, which the tile's first and last rows bound. */
void cu_att_tile_keys(CuKernel *k, const Att *a, int rows, const char *indent)
{
    FILE *f = k->f;
    char in[64], last[64];
    snprintf(in, sizeof in, "%s    ", indent);
    snprintf(last, sizeof last, "(i0 + %d < I ? i0 + %d : I) - 1", rows, rows);
    fprintf(f, "%si64 tjb, tje; /* the keys of the tile's rows: its first and last rows bound them */\n", indent);
    fprintf(f, "%s{\n%s    const i64 i = i0;\n", indent, indent);
    cu_att_key_range(k, a, in);
    fprintf(f, "%s    tjb = jb;\n%s    tje = je;\n%s}\n", indent, indent, indent);
    fprintf(f, "%s{\n%s    const i64 i = %s;\n", indent, indent, last);
    cu_att_key_range(k, a, in);
    fprintf(f, "%s    tjb = jb < tjb ? jb : tjb;\n%s    tje = je > tje ? je : tje;\n%s}\n", indent, indent, indent);
}

/* The backward's two products of a T x T tile: s[r][c] = row r of ra . row c of ca and dp[r][c]
 * = row r of rb . row c of cb (shared tiles, row stride D + 1), rows ty + 16 r, columns tx + 8 c. */
static void tile_products(CuKernel *k, const char *ra, const char *rb, const char *ca, const char *cb, int rm, int cn)
{
    FILE *f = k->f;
    fprintf(f, "                float s[%d][%d], dp[%d][%d];\n", rm, cn, rm, cn);
    fprintf(f, "                for (int r = 0; r < %d; r++)\n                    for (int c = 0; c < %d; c++)\n"
               "                        s[r][c] = dp[r][c] = 0.0f;\n", rm, cn);
    fprintf(f, "                for (int d = 0; d < D; d++)\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                        const float av = %s[(ty + 16 * r) * (D + 1) + d], bv = %s[(ty + 16 * r) * (D + 1) + d];\n",
            ra, rb);
    fprintf(f, "                        for (int c = 0; c < %d; c++) {\n", cn);
    fprintf(f, "                            s[r][c] += av * %s[(tx + 8 * c) * (D + 1) + d];\n", ca);
    fprintf(f, "                            dp[r][c] += bv * %s[(tx + 8 * c) * (D + 1) + d];\n", cb);
    fprintf(f, "                        }\n                    }\n");
}

/* p and ds of the pair (i, j) in scope, from s[r][c] and dp[r][c], the query row's logsumexp lse
 * and its dlse - D_i (dl): pij (declared here unless `declared`) and ds assigned. */
static void pair_grad(CuKernel *k, const Att *a, const char *lse, const char *dl, int declared, const char *indent)
{
    FILE *f = k->f;
    fprintf(f, "%sconst float scale = %s;\n", indent, a->scale);
    fprintf(f, "%sconst int keep = %s;\n", indent, a->keep);
    fprintf(f, "%s%spij = xtc_prob(keep ? s[r][c] * scale%s : -3.40282347e+38f, %s, J);\n", indent,
            declared ? "" : "const float ", a->bias, lse);
    fprintf(f, "%sds = keep ? pij * (dp[r][c] + %s) * scale : 0.0f;\n", indent, dl);
}

/* attention as FlashAttention tiles it: a block of 128 threads (8 x 16) per BR query rows, the
 * keys by tiles of BC through shared memory. Thread (tx, ty) owns the rm rows ty rm + r and the
 * cn score columns tx cn + c of the tile, and the output columns tx 4 + 32 g + u (4 of each
 * group of 32); the runs are contiguous so that the query and key tiles, stored transposed, and
 * the probabilities, stored transposed, and the value rows are read 4 floats at a time
 * (lds_run). A row's eight threads are neighbouring lanes of one warp, which reduce its maximum
 * and sum with shuffles. Each row keeps its own key range (causal and window limits; a key
 * outside it scores -inf, weight 0, exactly as if not visited), the tile visits the union of
 * its rows' ranges.
 * tiled_rows writes the loop over the query tiles of br rows (at most the br the shared arrays
 * were declared for). */
static void tiled_rows(CuKernel *k, const Att *a, int stats, int br, int bc)
{
    const IrNode *x = k->node, *q = x->in[0], *kk = x->in[1], *v = x->in[2];
    unsigned views = k->k->views;
    int rm = br / 16, cn = bc / 8;
    long long groups = (a->E + 31) / 32, ew = 32 * groups, en = 4 * groups;
    FILE *f = k->f;
    char src[64];
    fprintf(f, "    const i64 tiles = (I + %d) / %d;\n", br - 1, br);
    fprintf(f, "    for (i64 tile = blockIdx.x; tile < batches * tiles; tile += gridDim.x) {\n");
    fprintf(f, "        const i64 batch = tile / tiles, i0 = tile %% tiles * %d;\n", br);
    cu_att_batch_indices(k, q, "        ");
    cu_att_operand_rows(k, q, views & CG_VIEW_Q, "const ", cu_mem_type(q), "qb", "in0", "I", "D", "qs");
    cu_att_operand_rows(k, kk, views & CG_VIEW_K, "const ", cu_mem_type(kk), "kb", "in1", "J", "D", "ks");
    cu_att_operand_rows(k, v, views & CG_VIEW_V, "const ", cu_mem_type(v), "vb", "in2", "J", "E", "vs");
    cu_att_operand_rows(k, x, views & CG_VIEW_OUT, "", cu_mem_type(x), "ob", "out", "I", "OC", "os");
    fprintf(f, "        for (int t = threadIdx.x; t < %d * D; t += blockDim.x) {\n", br);
    fprintf(f, "            const int r = t / D, d = t %% D;\n");
    fprintf(f, "            Qs[d][r] = i0 + r < I ? xtc_ld(qb, (i0 + r) * qs + d) : 0.0f;\n        }\n");
    fprintf(f, "        i64 rjb[%d], rje[%d]; /* each row's keys */\n", rm, rm);
    fprintf(f, "        float mx[%d], lsum[%d], acc[%d][%lld];\n", rm, rm, rm, en);
    if (a->bmax[0]) /* bounded: every row sees a key unless causal with fewer keys than queries */
        fprintf(f, "        const int bounded = %s;\n", a->causal ? "J >= I" : "1");
    fprintf(f, "        for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "            const i64 i = i0 + ty * %d + r;\n", rm);
    cu_att_key_range(k, a, "            ");
    fprintf(f, "            rjb[r] = i < I ? jb : 0;\n            rje[r] = i < I ? je : 0;\n");
    if (a->bmax[0])
        fprintf(f, "            mx[r] = bounded ? %s : -XTC_INF; /* bounded: the scores' bound from the start */\n"
                   "            lsum[r] = 0.0f;\n", a->bmax);
    else
        fprintf(f, "            mx[r] = -XTC_INF;\n            lsum[r] = 0.0f;\n");
    fprintf(f, "            for (int e = 0; e < %lld; e++)\n                acc[r][e] = 0.0f;\n        }\n", en);
    cu_att_tile_keys(k, a, br, "        ");
    fprintf(f, "        __syncthreads(); /* Qs */\n");
    fprintf(f, "        for (i64 j0 = tjb; j0 < tje; j0 += %d) {\n", bc);
    fprintf(f, "            for (int t = threadIdx.x; t < %d * D; t += blockDim.x) {\n", bc);
    fprintf(f, "                const int c = t / D, d = t %% D;\n");
    fprintf(f, "                Ks[d][c] = j0 + c < tje ? xtc_ld(kb, (j0 + c) * ks + d) : 0.0f;\n            }\n");
    fprintf(f, "            for (int t = threadIdx.x; t < %d * %lld; t += blockDim.x) { /* zero past E */\n", bc, ew);
    fprintf(f, "                const int c = t / %lld, e = t %% %lld;\n", ew, ew);
    fprintf(f, "                Vs[c][e] = j0 + c < tje && e < E ? xtc_ld(vb, (j0 + c) * vs + e) : 0.0f;\n            }\n");
    fprintf(f, "            __syncthreads(); /* Ks, Vs */\n");
    fprintf(f, "            float s[%d][%d];\n", rm, cn);
    fprintf(f, "            for (int r = 0; r < %d; r++)\n                for (int c = 0; c < %d; c++)\n"
               "                    s[r][c] = 0.0f;\n", rm, cn);
    fprintf(f, "#pragma unroll 8\n");
    fprintf(f, "            for (int d = 0; d < D; d++) {\n");
    fprintf(f, "                float qv[%d], kv[%d];\n", rm, cn);
    snprintf(src, sizeof src, "Qs[d][ty * %d]", rm);
    lds_run(f, "qv", src, rm, "                ");
    snprintf(src, sizeof src, "Ks[d][tx * %d]", cn);
    lds_run(f, "kv", src, cn, "                ");
    fprintf(f, "                for (int r = 0; r < %d; r++)\n                    for (int c = 0; c < %d; c++)\n"
               "                        s[r][c] += qv[r] * kv[c];\n            }\n", rm, cn);
    fprintf(f, "            for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                const i64 i = i0 + ty * %d + r;\n", rm);
    fprintf(f, "                float rmax = -XTC_INF;\n");
    fprintf(f, "                for (int c = 0; c < %d; c++) {\n", cn);
    fprintf(f, "                    const i64 j = j0 + tx * %d + c;\n", cn);
    fprintf(f, "                    float sc = -XTC_INF; /* outside the row's keys: weight 0 */\n");
    fprintf(f, "                    if (j >= rjb[r] && j < rje[r]) {\n");
    fprintf(f, "                        const float scale = %s;\n", a->scale);
    fprintf(f, "                        sc = %s ? s[r][c] * scale%s : -3.40282347e+38f; /* -FLT_MAX where masked */\n",
            a->keep, a->bias);
    fprintf(f, "                    }\n");
    fprintf(f, "                    s[r][c] = sc;\n                    rmax = xtc_fmax(rmax, sc);\n                }\n");
    const char *in = "";
    if (a->bmax[0]) { /* bounded: no maximum to find (block-uniform branch: the shuffles stay whole) */
        fprintf(f, "                float m_new = mx[r], alpha = 1.0f;\n");
        fprintf(f, "                if (!bounded) {\n");
        in = "    ";
    }
    fprintf(f, "%s                for (int o = 1; o < 8; o <<= 1) /* the row's eight lanes */\n", in);
    fprintf(f, "%s                    rmax = xtc_fmax(rmax, __shfl_xor_sync(0xffffffffu, rmax, o));\n", in);
    fprintf(f, "%s                /* online softmax: rescale what was summed so far to the new maximum */\n", in);
    fprintf(f, "%s                %sm_new = xtc_fmax(mx[r], rmax);\n", in, in[0] ? "" : "const float ");
    fprintf(f, "%s                %salpha = m_new == -XTC_INF ? 1.0f : expf(mx[r] - m_new);\n", in,
            in[0] ? "" : "const float ");
    if (a->bmax[0])
        fprintf(f, "                }\n");
    fprintf(f, "                float psum = 0.0f;\n");
    fprintf(f, "                for (int c = 0; c < %d; c++) {\n", cn);
    fprintf(f, "                    const float p = s[r][c] == -XTC_INF ? 0.0f : expf(s[r][c] - m_new);\n");
    fprintf(f, "                    Ps[tx * %d + c][ty * %d + r] = p;\n                    psum += p;\n                }\n", cn, rm);
    fprintf(f, "                for (int o = 1; o < 8; o <<= 1)\n");
    fprintf(f, "                    psum += __shfl_xor_sync(0xffffffffu, psum, o);\n");
    fprintf(f, "                lsum[r] = lsum[r] * alpha + psum;\n                mx[r] = m_new;\n");
    fprintf(f, "                %sfor (int e = 0; e < %lld; e++)\n                    acc[r][e] *= alpha;\n",
            a->bmax[0] ? "if (!bounded) /* else alpha = 1 */\n                    " : "", en);
    fprintf(f, "                (void)i;\n            }\n");
    fprintf(f, "            __syncthreads(); /* Ps */\n");
    fprintf(f, "#pragma unroll 4\n");
    fprintf(f, "            for (int c = 0; c < %d; c++) {\n", bc);
    fprintf(f, "                float vv[%lld], pv[%d];\n", en, rm);
    for (long long g = 0; g < groups; g++) {
        char dst[32];
        snprintf(dst, sizeof dst, "vv + %lld", 4 * g);
        snprintf(src, sizeof src, "Vs[c][%lld + tx * 4]", 32 * g);
        lds_run(f, dst, src, 4, "                ");
    }
    snprintf(src, sizeof src, "Ps[c][ty * %d]", rm);
    lds_run(f, "pv", src, rm, "                ");
    fprintf(f, "                for (int r = 0; r < %d; r++)\n", rm);
    fprintf(f, "                    for (int e = 0; e < %lld; e++)\n                        acc[r][e] += pv[r] * vv[e];\n", en);
    fprintf(f, "            }\n");
    fprintf(f, "            __syncthreads(); /* before the next tile replaces Ks, Vs, Ps */\n");
    fprintf(f, "        }\n");
    fprintf(f, "        for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "            const i64 i = i0 + ty * %d + r;\n", rm);
    fprintf(f, "            if (i >= I)\n                continue;\n");
    fprintf(f, "            %s *o = ob + i * os;\n", cu_mem_type(x));
    fprintf(f, "            for (int e = 0; e < %lld; e++) {\n", en);
    fprintf(f, "                const int col = e / 4 * 32 + tx * 4 + e %% 4;\n");
    fprintf(f, "                if (col < E)\n");
    fprintf(f, "                    xtc_st(o, col, J > 0 ? acc[r][e] / lsum[r] : 0.0f);\n");
    fprintf(f, "            }\n");
    if (stats)
        fprintf(f, "            if (tx == 0)\n                xtc_st(o, E, J > 0 ? mx[r] + logf(lsum[r]) : -XTC_INF); /* the logsumexp */\n");
    fprintf(f, "        }\n");
    fprintf(f, "        __syncthreads(); /* before the next tile replaces Qs */\n");
    fprintf(f, "    }\n");
}

/* tiled_rows for br rows, its code indented one level more (inside an if) */
static void tiled_rows_indented(CuKernel *k, const Att *a, int stats, int br, int bc)
{
    FILE *f = k->f;
    char *buf = NULL;
    size_t len = 0;
    k->f = open_memstream(&buf, &len);
    if (!k->f) { /* no memory for the copy: the same code, not indented */
        k->f = f;
        tiled_rows(k, a, stats, br, bc);
        return;
    }
    tiled_rows(k, a, stats, br, bc);
    fclose(k->f);
    k->f = f;
    for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        fprintf(f, "    %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
    }
    free(buf);
}

/* The kernel declares the shared tiles for br rows (att_tile's). With br = 64 it chooses at run
 * time: tiles of 64 rows when there are at least ATT_MANY of them, else of 32 (twice as many
 * blocks, each with half the rows). Measured on an H100 (132 SMs, 128 threads and up to 44 KiB
 * of shared memory a block): GPT's forward (seq 1024, 8 heads, 128 tiles of 64) 4.44 -> 3.91 ms
 * with 32 rows, attn16k's (seq 16384, 2048 tiles of 64) 17.07 -> 19.51 ms; ATT_MANY is the
 * geometric mean of those two counts. */
static void attention_tiled(CuKernel *k, const Att *a, int stats, int br, int bc)
{
    long long groups = (a->E + 31) / 32, ew = 32 * groups;
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ XTC_ALIGN16 float Qs[%lld][%d + 4], Ks[%lld][%d + 4]; /* query and key tiles, [d][row] */\n",
            a->D, br, a->D, bc);
    fprintf(f, "    __shared__ XTC_ALIGN16 float Vs[%d][%lld], Ps[%d][%d + 4]; /* a value tile, its probabilities [key][row] */\n",
            bc, ew, bc, br);
    cu_att_forward_sizes(k, a, a->E + stats);
    fprintf(f, "    const int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;\n");
    int half = br == 64 ? 32 : 0; /* the few-tiles choice */
    if (half) {
        fprintf(f, "    if (batches * ((I + %d) / %d) >= %d) { /* many tiles: %d rows each */\n", br - 1, br, ATT_MANY, br);
        tiled_rows_indented(k, a, stats, br, bc);
        fprintf(f, "    } else { /* few: %d rows each, twice as many blocks */\n", half);
        tiled_rows_indented(k, a, stats, half, bc);
        fprintf(f, "    }\n");
    } else {
        tiled_rows(k, a, stats, br, bc);
    }
    cu_kernel_end(k);
    char tiles[CU_EXPR], rows[3 * CU_EXPR];
    cu_ceil_div(a->I, br, tiles, sizeof tiles);
    snprintf(rows, sizeof rows, "%s%s%s * %s%s%s", po(a->batches), a->batches, pc(a->batches), po(tiles), tiles,
             pc(tiles));
    if (half) { /* the grid of the choice the kernel makes */
        char tiles2[CU_EXPR], grid[sizeof k->geom.grid_x];
        cu_ceil_div(a->I, half, tiles2, sizeof tiles2);
        size_t len = (size_t)snprintf(grid, sizeof grid, "(%s) >= %d ? (%s) : %s%s%s * %s%s%s", rows, ATT_MANY, rows,
                                      po(a->batches), a->batches, pc(a->batches), po(tiles2), tiles2, pc(tiles2));
        if (len < sizeof grid) {
            cu_geom_rows(k, grid, 128);
            return;
        }
        /* too long an expression: the 64-row grid, which the grid-stride loop of either covers */
    }
    cu_geom_rows(k, rows, 128);
}

int cg_cuda_attention(CuKernel *k)
{
    int decode = cu_attention_decode(k); /* with the path of few query rows (cg_cuda_attention_decode.c) */
    if (decode)
        return decode < 0 ? -1 : 0;
    const IrNode *x = k->node;
    const IrNode *q = x->in[0], *kk = x->in[1], *v = x->in[2];
    Att a;
    if (cu_att_setup(k, &a, q, kk, v, x->in[3], x->in[4], x->in[5], "in3", "in4", "in5", x->ia[IR_IA_CAUSAL] != 0, x->ia[IR_IA_WINDOW]) < 0)
        return -1;
    int stats = x->ia[IR_IA_STATS] != 0, br, bc;
    int mma = cu_attention_mma(k, &a, stats); /* tensor cores (cg_cuda_attention_mma.c) */
    if (mma)
        return mma < 0 ? -1 : 0;
    if (att_tile(a.D, a.E, &br, &bc)) {
        attention_tiled(k, &a, stats, br, bc);
        return 0;
    }
    unsigned views = k->k->views;
    long long ocols = a.E + stats, accs = (a.E + ATT_BLOCK - 1) / ATT_BLOCK;
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float qi[%lld]; /* the query row */\n", a.D > 0 ? a.D : 1);
    fprintf(f, "    __shared__ float probs[%d]; /* a chunk of probabilities (before the division by l) */\n", ATT_BLOCK);
    cu_att_forward_sizes(k, &a, ocols);
    fprintf(f, "    for (i64 row = blockIdx.x; row < batches * I; row += gridDim.x) {\n");
    fprintf(f, "        const i64 batch = row / I, i = row %% I;\n");
    cu_att_batch_indices(k, q, "        ");
    cu_att_operand_rows(k, q, views & CG_VIEW_Q, "const ", cu_mem_type(q), "qb", "in0", "I", "D", "qs");
    cu_att_operand_rows(k, kk, views & CG_VIEW_K, "const ", cu_mem_type(kk), "kb", "in1", "J", "D", "ks");
    cu_att_operand_rows(k, v, views & CG_VIEW_V, "const ", cu_mem_type(v), "vb", "in2", "J", "E", "vs");
    cu_att_operand_rows(k, x, views & CG_VIEW_OUT, "", cu_mem_type(x), "ob", "out", "I", "OC", "os");
    fprintf(f, "        const float scale = %s;\n", a.scale);
    fprintf(f, "        %s *o = ob + i * os;\n", cu_mem_type(x));
    fprintf(f, "        for (int d = threadIdx.x; d < D; d += blockDim.x)\n");
    fprintf(f, "            qi[d] = xtc_ld(qb, i * qs + d);\n");
    fprintf(f, "        __syncthreads();\n");
    fprintf(f, "        float mx = -XTC_INF, lsum = 0.0f, acc[%lld];\n", accs > 0 ? accs : 1);
    fprintf(f, "        for (int ci = 0; ci < %lld; ci++)\n            acc[ci] = 0.0f;\n", accs);
    cu_att_key_range(k, &a, "        ");
    fprintf(f, "        for (i64 j0 = jb; j0 < je; j0 += %d) {\n", ATT_BLOCK);
    fprintf(f, "            const i64 j = j0 + threadIdx.x;\n");
    fprintf(f, "            float score = -XTC_INF;\n");
    fprintf(f, "            if (j < je) {\n");
    fprintf(f, "                float dot = 0.0f;\n");
    fprintf(f, "                for (int d = 0; d < D; d++)\n                    dot += qi[d] * xtc_ld(kb, j * ks + d);\n");
    fprintf(f, "                score = %s ? dot * scale%s : -3.40282347e+38f; /* -FLT_MAX where masked */\n", a.keep,
            a.bias);
    fprintf(f, "            }\n");
    fprintf(f, "            /* online softmax: rescale what was summed so far to the new maximum */\n");
    fprintf(f, "            const float m_new = xtc_fmax(mx, xtc_block_max(score));\n");
    fprintf(f, "            const float alpha = expf(mx - m_new), pj = j < je ? expf(score - m_new) : 0.0f;\n");
    fprintf(f, "            probs[threadIdx.x] = pj; /* the block_max above separates this from the last chunk's reads */\n");
    fprintf(f, "            lsum = lsum * alpha + xtc_block_sum(pj); /* which also makes p[] visible */\n");
    fprintf(f, "            mx = m_new;\n");
    fprintf(f, "            const int nj = je - j0 < %d ? (int)(je - j0) : %d;\n", ATT_BLOCK, ATT_BLOCK);
    fprintf(f, "            for (int ci = 0; ci < %lld; ci++) {\n", accs);
    fprintf(f, "                const int e = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "                if (e < E) {\n");
    fprintf(f, "                    float sum = acc[ci] * alpha;\n");
    fprintf(f, "                    for (int jj = 0; jj < nj; jj++)\n");
    fprintf(f, "                        sum += probs[jj] * xtc_ld(vb, (j0 + jj) * vs + e);\n");
    fprintf(f, "                    acc[ci] = sum;\n                }\n            }\n        }\n");
    fprintf(f, "        for (int ci = 0; ci < %lld; ci++) {\n", accs);
    fprintf(f, "            const int e = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "            if (e < E)\n                xtc_st(o, e, J > 0 ? acc[ci] / lsum : 0.0f);\n        }\n");
    if (stats)
        fprintf(f, "        if (threadIdx.x == 0)\n            xtc_st(o, E, J > 0 ? mx + logf(lsum) : -XTC_INF); /* the logsumexp */\n");
    fprintf(f, "        __syncthreads(); /* before the next row replaces qi */\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char rows[3 * CU_EXPR];
    snprintf(rows, sizeof rows, "%s%s%s * %s%s%s", po(a.batches), a.batches, pc(a.batches), po(a.I), a.I, pc(a.I));
    cu_geom_rows(k, rows, ATT_BLOCK);
    return 0;
}

/* The tiled backward's tile: T query rows and T keys, 128 threads; 0 when the shared memory of
 * either half (below) does not fit 48 KiB or D > 128: the row kernel. */
static int att_grad_tile(long long D)
{
    for (int t = 32; t >= 16; t /= 2) {
        long long dq = 4LL * t * (D + 1) + (long long)t * (t + 1), dkv = 4LL * t * (D + 1) + 2LL * t * (t + 1) + 3 * t;
        if (D >= 1 && D <= 128 && (dq > dkv ? dq : dkv) * 4 <= 48 * 1024)
            return t;
    }
    return 0;
}

/* Loads rows [base, base + T) of a [.., rows, width] operand (zero from lim on) into shared dst
 * with row stride D + 1. */
static void load_tile(CuKernel *k, const char *dst, const char *src, const char *base, const char *lim,
                      const char *width, int t, const char *indent)
{
    fprintf(k->f, "%sfor (int t = threadIdx.x; t < %d * D; t += blockDim.x) {\n", indent, t);
    fprintf(k->f, "%s    const int r = t / D, d = t %% D;\n", indent);
    fprintf(k->f, "%s    %s[r * (D + 1) + d] = %s + r < %s ? xtc_ld(%s, (%s + r) * %s + d) : 0.0f;\n%s}\n", indent, dst,
            base, lim, src, base, width, indent);
}

/* Grouped key/values in the backward (ops.def: k and v with G heads where q has H): 1 with H and
 * G set, else 0 (G = H). */
int cu_att_grad_groups(const IrNode *x, long long *H, long long *G)
{
    int r = x->in[0]->rank;
    *H = *G = 1;
    if (ir_attention_kv_group(x) == 1)
        return 0;
    *H = (long long)x->in[0]->shape[r - 3].c;
    *G = (long long)x->in[1]->shape[r - 3].c;
    return 1;
}

/* The backward's input rows of query batch index `batch` (a variable's name; the query side's is
 * `batch`, flat over q's batch dims): the batch
 * indices ix0.. and qb, ob, gb (GR_Q), kb, vb (GR_KV) at the key/value batch index of that query
 * head, (batch / H) G + batch % H % G with grouped key/values. */
void cu_att_grad_rows(CuKernel *k, unsigned which, const char *batch, const char *indent)
{
    const IrNode *x = k->node, *q = x->in[0];
    FILE *f = k->f;
    long long H, G;
    char kvb[96];
    snprintf(kvb, sizeof kvb, "%s", batch);
    if (cu_att_grad_groups(x, &H, &G))
        snprintf(kvb, sizeof kvb, "(%s / %lld * %lld + %s %% %lld %% %lld)", batch, H, G, batch, H, G);
    if (which & GR_Q) {
        cu_att_batch_indices(k, q, indent);
        fprintf(f, "%sconst %s *qb = in0 + batch * I * D;\n", indent, cu_mem_type(q));
        fprintf(f, "%sconst %s *ob = in3 + batch * I * OC;\n", indent, cu_mem_type(x->in[3]));
        fprintf(f, "%sconst %s *gb = in4 + batch * I * GC;\n", indent, cu_mem_type(x->in[4]));
    }
    if (which & GR_KV) {
        fprintf(f, "%sconst %s *kb = in1 + %s * J * D;\n", indent, cu_mem_type(x->in[1]), kvb);
        fprintf(f, "%sconst %s *vb = in2 + %s * J * E;\n", indent, cu_mem_type(x->in[2]), kvb);
    }
}

/* The dk/dv side's loop over the query heads of key/value head `bt` (the block's batch index, whose
 * head is below G), ascending, as `batch`: R = H / G heads, or the one head bt; the caller
 * closes it. */
void cu_att_grad_heads_begin(CuKernel *k, const char *indent)
{
    long long H, G;
    if (cu_att_grad_groups(k->node, &H, &G))
        fprintf(k->f, "%sfor (int rh = 0; rh < %lld; rh++) { /* the group's query heads, summed in order */\n"
                      "%s    const i64 batch = bt + rh * %lld;\n", indent, H / G, indent, G);
    else
        fprintf(k->f, "%s{\n%s    const i64 batch = bt;\n", indent, indent);
    char in[64];
    snprintf(in, sizeof in, "%s    ", indent);
    cu_att_grad_rows(k, GR_Q, "batch", in);
}

/* Rows [j0, j0 + n) (below J) of dk and dv of batch index bt set to zero where bt's head is one of
 * heads G..H-1 (grouped key/values: no key/value head of theirs); opens the else of the head that
 * has one, which the caller closes. */
void cu_att_grad_zero_rows(CuKernel *k, const char *j0, const char *n, const char *indent)
{
    long long H, G;
    if (!cu_att_grad_groups(k->node, &H, &G))
        return;
    FILE *f = k->f;
    fprintf(f, "%sif (bt %% %lld >= %lld) { /* no key/value head: zero dk, dv rows */\n", indent, H, G);
    fprintf(f, "%s    for (i64 t = threadIdx.x; t < (i64)%s * D; t += blockDim.x)\n", indent, n);
    fprintf(f, "%s        if (%s + t / D < J) {\n", indent, j0);
    fprintf(f, "%s            xtc_st(dk, (%s + t / D) * D + t %% D, 0.0f);\n", indent, j0);
    fprintf(f, "%s            xtc_st(dv, (%s + t / D) * D + t %% D, 0.0f);\n%s        }\n", indent, j0, indent);
    fprintf(f, "%s} else {\n", indent);
}

/* attention_grad tiled: blocks [0, QT) of a batch take T query rows each (their dq), blocks
 * [QT, QT + KT) T keys each (their dk, dv), so that each output row still has one writer. Both
 * recompute p and ds tile by tile in shared memory: the dq half streams key and value tiles past
 * its queries and output gradients, the dk/dv half query, output-gradient and statistics tiles
 * past its keys and values. Thread (tx, ty) owns rows ty + 16 r and columns tx + 8 c of each
 * T x T tile of scores, and columns tx + 8 e of its accumulators. Whether query i sees key j is
 * decided element by element from i's key range, so both halves skip and keep the same pairs. */
static void attention_grad_tiled(CuKernel *k, const Att *a, const char *gcols, int t)
{
    const IrNode *x = k->node;
    int rm = t / 16, cn = t / 8;
    long long dn = (a->D + 7) / 8;
    long long smem = 4LL * t * (a->D + 1) + 2LL * t * (t + 1) + 3 * t;
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float sm[%lld]; /* the tiles of either half */\n", smem);
    fprintf(f, "    const i64 I = %s, J = %s, batches = %s;\n", a->I, a->J, a->batches);
    fprintf(f, "    const int D = %lld, E = %lld, OC = %lld, GC = %s; /* o has E + 1 columns, dout E or E + 1 */\n",
            a->D, a->E, a->E + 1, gcols);
    fprintf(f, "    const int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;\n");
    fprintf(f, "    const i64 qtiles = (I + %d) / %d, ktiles = (J + %d) / %d;\n", t - 1, t, t - 1, t);
    fprintf(f, "    for (i64 blk = blockIdx.x; blk < batches * (qtiles + ktiles); blk += gridDim.x) {\n");
    fprintf(f, "        const i64 bt = blk / (qtiles + ktiles), tile = blk %% (qtiles + ktiles);\n");
    fprintf(f, "        %s *const dq = out + bt * (I + 2 * J) * D, *const dk = dq + I * D, *const dv = dk + J * D;\n",
            cu_mem_type(x));
    fprintf(f, "        float *const Qs = sm, *const Gs = Qs + %d * (D + 1), *const Ks = Gs + %d * (D + 1);\n", t, t);
    fprintf(f, "        float *const Vs = Ks + %d * (D + 1), *const Ps = Vs + %d * (D + 1), *const Ss = Ps + %d * %d;\n",
            t, t, t, t + 1);
    fprintf(f, "        float *const Ls = Ss + %d * %d; /* per query row of the tile: lse, dlse - D_i, and a spare */\n",
            t, t + 1);
    /* ---- dq ---- */
    fprintf(f, "        if (tile < qtiles) { /* dq_i = sum_j ds_ij k_j for T query rows */\n");
    fprintf(f, "            const i64 batch = bt, i0 = tile * %d;\n", t);
    cu_att_grad_rows(k, GR_Q | GR_KV, "batch", "            ");
    load_tile(k, "Qs", "qb", "i0", "I", "D", t, "            ");
    load_tile(k, "Gs", "gb", "i0", "I", "GC", t, "            ");
    fprintf(f, "            i64 rjb[%d], rje[%d];\n", rm, rm);
    fprintf(f, "            float lse[%d], dl[%d], acc[%d][%lld];\n", rm, rm, rm, dn);
    fprintf(f, "            for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                const i64 i = i0 + ty + 16 * r;\n");
    cu_att_key_range(k, a, "                ");
    fprintf(f, "                rjb[r] = i < I ? jb : 0;\n                rje[r] = i < I ? je : 0;\n");
    fprintf(f, "                float dsum = 0.0f; /* D_i = dout_i . o_i, over the row's eight lanes */\n");
    fprintf(f, "                for (int e = tx; e < E && i < I; e += 8)\n");
    fprintf(f, "                    dsum += xtc_ld(gb, i * GC + e) * xtc_ld(ob, i * OC + e);\n");
    fprintf(f, "                for (int o = 1; o < 8; o <<= 1)\n");
    fprintf(f, "                    dsum += __shfl_xor_sync(0xffffffffu, dsum, o);\n");
    fprintf(f, "                lse[r] = i < I ? xtc_ld(ob, i * OC + E) : 0.0f;\n");
    fprintf(f, "                dl[r] = (i < I && GC > E ? xtc_ld(gb, i * GC + E) : 0.0f) - dsum;\n");
    fprintf(f, "                for (int e = 0; e < %lld; e++)\n                    acc[r][e] = 0.0f;\n            }\n", dn);
    cu_att_tile_keys(k, a, t, "            ");
    fprintf(f, "            __syncthreads(); /* Qs, Gs */\n");
    fprintf(f, "            for (i64 j0 = tjb; j0 < tje; j0 += %d) {\n", t);
    load_tile(k, "Ks", "kb", "j0", "tje", "D", t, "                ");
    load_tile(k, "Vs", "vb", "j0", "tje", "E", t, "                ");
    fprintf(f, "                __syncthreads(); /* Ks, Vs */\n");
    tile_products(k, "Qs", "Gs", "Ks", "Vs", rm, cn);
    fprintf(f, "                for (int r = 0; r < %d; r++)\n", rm);
    fprintf(f, "                    for (int c = 0; c < %d; c++) {\n", cn);
    fprintf(f, "                        const i64 i = i0 + ty + 16 * r, j = j0 + tx + 8 * c;\n");
    fprintf(f, "                        float ds = 0.0f;\n");
    fprintf(f, "                        if (j >= rjb[r] && j < rje[r]) {\n");
    pair_grad(k, a, "lse[r]", "dl[r]", 0, "                            ");
    fprintf(f, "                        }\n");
    fprintf(f, "                        Ss[(ty + 16 * r) * %d + tx + 8 * c] = ds;\n", t + 1);
    fprintf(f, "                    }\n");
    fprintf(f, "                __syncthreads(); /* Ss */\n");
    fprintf(f, "                for (int c = 0; c < %d; c++) {\n", t);
    fprintf(f, "                    float kv[%lld];\n", dn);
    fprintf(f, "                    for (int e = 0; e < %lld; e++)\n", dn);
    fprintf(f, "                        kv[e] = tx + 8 * e < D ? Ks[c * (D + 1) + tx + 8 * e] : 0.0f;\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                        const float w = Ss[(ty + 16 * r) * %d + c];\n", t + 1);
    fprintf(f, "                        for (int e = 0; e < %lld; e++)\n                            acc[r][e] += w * kv[e];\n", dn);
    fprintf(f, "                    }\n                }\n");
    fprintf(f, "                __syncthreads(); /* before the next tile replaces Ks, Vs, Ss */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                const i64 i = i0 + ty + 16 * r;\n");
    fprintf(f, "                for (int e = 0; e < %lld; e++)\n", dn);
    fprintf(f, "                    if (i < I && tx + 8 * e < D)\n");
    fprintf(f, "                        xtc_st(dq, i * D + tx + 8 * e, acc[r][e]);\n            }\n");
    /* ---- dk, dv ---- */
    fprintf(f, "        } else { /* dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i for T keys */\n");
    fprintf(f, "            const i64 jt0 = (tile - qtiles) * %d;\n", t);
    char tn[16];
    snprintf(tn, sizeof tn, "%d", t);
    cu_att_grad_zero_rows(k, "jt0", tn, "            ");
    cu_att_grad_rows(k, GR_KV, "bt", "            ");
    load_tile(k, "Ks", "kb", "jt0", "J", "D", t, "            ");
    load_tile(k, "Vs", "vb", "jt0", "J", "E", t, "            ");
    fprintf(f, "            float acc[%d][%lld], acc2[%d][%lld];\n", rm, dn, rm, dn);
    fprintf(f, "            for (int r = 0; r < %d; r++)\n                for (int e = 0; e < %lld; e++)\n"
               "                    acc[r][e] = acc2[r][e] = 0.0f;\n", rm, dn);
    fprintf(f, "            i64 fmq, tib, tie; /* the query rows of the tile's keys: [0, fmq) and [tib, tie) */\n");
    fprintf(f, "            {\n                const i64 j = jt0;\n");
    cu_att_query_ranges(k, a, "                ");
    fprintf(f, "                fmq = fm; /* the same for every key */\n                tib = ib;\n                (void)ie;\n            }\n");
    fprintf(f, "            {\n                const i64 j = (jt0 + %d < J ? jt0 + %d : J) - 1;\n", t, t);
    cu_att_query_ranges(k, a, "                ");
    fprintf(f, "                tie = ie;\n                (void)fm;\n                (void)ib;\n            }\n");
    cu_att_grad_heads_begin(k, "            ");
    fprintf(f, "            for (int seg = 0; seg < 2; seg++)\n");
    fprintf(f, "            for (i64 i0 = seg ? tib : 0, ihi = seg ? tie : fmq; i0 < ihi; i0 += %d) {\n", t);
    load_tile(k, "Qs", "qb", "i0", "ihi", "D", t, "                ");
    load_tile(k, "Gs", "gb", "i0", "ihi", "GC", t, "                ");
    fprintf(f, "                for (int rr = ty; rr < %d; rr += 16) { /* each query row's lse and dlse - D_i */\n", t);
    fprintf(f, "                    const i64 i = i0 + rr;\n");
    fprintf(f, "                    float dsum = 0.0f;\n");
    fprintf(f, "                    for (int e = tx; e < E && i < ihi; e += 8)\n");
    fprintf(f, "                        dsum += xtc_ld(gb, i * GC + e) * xtc_ld(ob, i * OC + e);\n");
    fprintf(f, "                    for (int o = 1; o < 8; o <<= 1)\n");
    fprintf(f, "                        dsum += __shfl_xor_sync(0xffffffffu, dsum, o);\n");
    fprintf(f, "                    if (tx == 0) {\n");
    fprintf(f, "                        Ls[rr] = i < ihi ? xtc_ld(ob, i * OC + E) : 0.0f;\n");
    fprintf(f, "                        Ls[%d + rr] = (i < ihi && GC > E ? xtc_ld(gb, i * GC + E) : 0.0f) - dsum;\n", t);
    fprintf(f, "                    }\n                }\n");
    fprintf(f, "                __syncthreads(); /* Qs, Gs, Ls */\n");
    tile_products(k, "Ks", "Vs", "Qs", "Gs", rm, cn); /* [key][query] */
    fprintf(f, "                for (int r = 0; r < %d; r++)\n", rm);
    fprintf(f, "                    for (int c = 0; c < %d; c++) {\n", cn);
    fprintf(f, "                        const i64 j = jt0 + ty + 16 * r, i = i0 + tx + 8 * c;\n");
    fprintf(f, "                        float ds = 0.0f, pij = 0.0f;\n");
    fprintf(f, "                        if (i < ihi && j < J) {\n");
    cu_att_key_range(k, a, "                            ");
    fprintf(f, "                            if (j >= jb && j < je) {\n");
    {
        char dl[64];
        snprintf(dl, sizeof dl, "Ls[%d + tx + 8 * c]", t);
        pair_grad(k, a, "Ls[tx + 8 * c]", dl, 1, "                                ");
    }
    fprintf(f, "                            }\n                        }\n");
    fprintf(f, "                        Ps[(ty + 16 * r) * %d + tx + 8 * c] = pij;\n", t + 1);
    fprintf(f, "                        Ss[(ty + 16 * r) * %d + tx + 8 * c] = ds;\n", t + 1);
    fprintf(f, "                    }\n");
    fprintf(f, "                __syncthreads(); /* Ps, Ss */\n");
    fprintf(f, "                for (int c = 0; c < %d; c++) {\n", t);
    fprintf(f, "                    float qv[%lld], gv[%lld];\n", dn, dn);
    fprintf(f, "                    for (int e = 0; e < %lld; e++) {\n", dn);
    fprintf(f, "                        qv[e] = tx + 8 * e < D ? Qs[c * (D + 1) + tx + 8 * e] : 0.0f;\n");
    fprintf(f, "                        gv[e] = tx + 8 * e < D ? Gs[c * (D + 1) + tx + 8 * e] : 0.0f;\n                    }\n");
    fprintf(f, "                    for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                        const float w = Ss[(ty + 16 * r) * %d + c], p = Ps[(ty + 16 * r) * %d + c];\n",
            t + 1, t + 1);
    fprintf(f, "                        for (int e = 0; e < %lld; e++) {\n", dn);
    fprintf(f, "                            acc[r][e] += w * qv[e];\n                            acc2[r][e] += p * gv[e];\n");
    fprintf(f, "                        }\n                    }\n                }\n");
    fprintf(f, "                __syncthreads(); /* before the next tile replaces Qs, Gs, Ls, Ps, Ss */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            }\n"); /* cu_att_grad_heads_begin's loop */
    fprintf(f, "            for (int r = 0; r < %d; r++) {\n", rm);
    fprintf(f, "                const i64 j = jt0 + ty + 16 * r;\n");
    fprintf(f, "                for (int e = 0; e < %lld; e++)\n", dn);
    fprintf(f, "                    if (j < J && tx + 8 * e < D) {\n");
    fprintf(f, "                        xtc_st(dk, j * D + tx + 8 * e, acc[r][e]);\n");
    fprintf(f, "                        xtc_st(dv, j * D + tx + 8 * e, acc2[r][e]);\n                    }\n            }\n");
    long long H, G;
    if (cu_att_grad_groups(x, &H, &G))
        fprintf(f, "            }\n"); /* cu_att_grad_zero_rows' else */
    fprintf(f, "        }\n");
    fprintf(f, "        __syncthreads(); /* before the next block's tiles */\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char qt[CU_EXPR], kt[CU_EXPR], rows[4 * CU_EXPR];
    cu_ceil_div(a->I, t, qt, sizeof qt);
    cu_ceil_div(a->J, t, kt, sizeof kt);
    snprintf(rows, sizeof rows, "%s%s%s * (%s + %s)", po(a->batches), a->batches, pc(a->batches), qt, kt);
    cu_geom_rows(k, rows, 128);
}

int cg_cuda_attention_grad(CuKernel *k)
{
    const IrNode *x = k->node;
    const IrNode *q = x->in[0], *kk = x->in[1], *v = x->in[2], *dout = x->in[4];
    Att a;
    if (cu_att_setup(k, &a, q, kk, v, x->in[5], x->in[6], x->in[7], "in5", "in6", "in7", x->ia[IR_IA_GRAD_CAUSAL] != 0, x->ia[IR_IA_GRAD_WINDOW]) < 0)
        return -1;
    int r = a.r;
    char gcols[CU_EXPR];
    cu_dim(k->gen, dout->shape[r - 1], gcols, sizeof gcols);
    int tc = cu_attention_grad_mma(k, &a, gcols); /* tensor cores (cg_cuda_attention_mma_grad.c) */
    if (tc)
        return tc < 0 ? -1 : 0;
    int t = att_grad_tile(a.D);
    if (t) {
        attention_grad_tiled(k, &a, gcols, t);
        return 0;
    }
    long long accd = (a.D + ATT_BLOCK - 1) / ATT_BLOCK;
    FILE *f = k->f;
    k->sync = 1;
    cu_kernel_begin(k);
    fprintf(f, "    __shared__ float row_a[%lld], row_b[%lld]; /* q_i and dout_i, or k_j and v_j */\n",
            a.D > 0 ? a.D : 1, a.E > 0 ? a.E : 1);
    fprintf(f, "    __shared__ float w1[%d], w2[%d];          /* a chunk of ds, and of p */\n", ATT_BLOCK, ATT_BLOCK);
    fprintf(f, "    const i64 I = %s, J = %s, batches = %s;\n", a.I, a.J, a.batches);
    fprintf(f, "    const int D = %lld, E = %lld, OC = %lld, GC = %s; /* o has E + 1 columns, dout E or E + 1 */\n", a.D,
            a.E, a.E + 1, gcols);
    fprintf(f, "    for (i64 blk = blockIdx.x; blk < batches * (I + J); blk += gridDim.x) {\n");
    fprintf(f, "        const i64 bt = blk / (I + J), r = blk %% (I + J);\n");
    fprintf(f, "        %s *const dq = out + bt * (I + 2 * J) * D, *const dk = dq + I * D, *const dv = dk + J * D;\n",
            cu_mem_type(x));
    fprintf(f, "        const float scale = %s;\n", a.scale);
    fprintf(f, "        float acc[%lld], acc2[%lld];\n", accd > 0 ? accd : 1, accd > 0 ? accd : 1);
    fprintf(f, "        for (int ci = 0; ci < %lld; ci++)\n            acc[ci] = acc2[ci] = 0.0f;\n", accd);
    /* dq rows */
    fprintf(f, "        if (r < I) { /* dq_i = sum_j ds_ij k_j */\n");
    fprintf(f, "            const i64 i = r, batch = bt;\n");
    cu_att_grad_rows(k, GR_Q | GR_KV, "batch", "            ");
    fprintf(f, "            for (int d = threadIdx.x; d < D; d += blockDim.x) {\n");
    fprintf(f, "                row_a[d] = xtc_ld(qb, i * D + d);\n                row_b[d] = xtc_ld(gb, i * GC + d);\n            }\n");
    fprintf(f, "            float dsum = 0.0f; /* D_i = dout_i . o_i */\n");
    fprintf(f, "            for (int e = threadIdx.x; e < E; e += blockDim.x)\n");
    fprintf(f, "                dsum += xtc_ld(gb, i * GC + e) * xtc_ld(ob, i * OC + e);\n");
    fprintf(f, "            dsum = xtc_block_sum(dsum); /* also makes row_a, row_b visible */\n");
    fprintf(f, "            const float lse = xtc_ld(ob, i * OC + E), dlse = GC > E ? xtc_ld(gb, i * GC + E) : 0.0f;\n");
    cu_att_key_range(k, &a, "            ");
    fprintf(f, "            for (i64 j0 = jb; j0 < je; j0 += %d) {\n", ATT_BLOCK);
    fprintf(f, "                const i64 j = j0 + threadIdx.x;\n");
    fprintf(f, "                float ds = 0.0f;\n");
    fprintf(f, "                if (j < je) {\n");
    fprintf(f, "                    float dot = 0.0f, dp = 0.0f;\n");
    fprintf(f, "                    for (int d = 0; d < D; d++) {\n");
    fprintf(f, "                        dot += row_a[d] * xtc_ld(kb, j * D + d);\n");
    fprintf(f, "                        dp += row_b[d] * xtc_ld(vb, j * E + d);\n                    }\n");
    fprintf(f, "                    const int keep = %s;\n", a.keep);
    fprintf(f, "                    const float pij = xtc_prob(keep ? dot * scale%s : -3.40282347e+38f, lse, J);\n", a.bias);
    fprintf(f, "                    ds = keep ? pij * (dp - dsum + dlse) * scale : 0.0f;\n");
    fprintf(f, "                }\n");
    fprintf(f, "                w1[threadIdx.x] = ds;\n");
    fprintf(f, "                __syncthreads();\n");
    fprintf(f, "                const int nj = je - j0 < %d ? (int)(je - j0) : %d;\n", ATT_BLOCK, ATT_BLOCK);
    fprintf(f, "                for (int ci = 0; ci < %lld; ci++) {\n", accd);
    fprintf(f, "                    const int d = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "                    if (d < D)\n");
    fprintf(f, "                        for (int jj = 0; jj < nj; jj++)\n");
    fprintf(f, "                            acc[ci] += w1[jj] * xtc_ld(kb, (j0 + jj) * D + d);\n                }\n");
    fprintf(f, "                __syncthreads(); /* before the next chunk overwrites w1 */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            for (int ci = 0; ci < %lld; ci++) {\n", accd);
    fprintf(f, "                const int d = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "                if (d < D)\n                    xtc_st(dq, i * D + d, acc[ci]);\n            }\n");
    /* dk, dv rows */
    fprintf(f, "        } else { /* dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i */\n");
    fprintf(f, "            const i64 j = r - I;\n");
    cu_att_grad_zero_rows(k, "j", "1", "            ");
    cu_att_grad_rows(k, GR_KV, "bt", "            ");
    fprintf(f, "            for (int d = threadIdx.x; d < D; d += blockDim.x) {\n");
    fprintf(f, "                row_a[d] = xtc_ld(kb, j * D + d);\n                row_b[d] = xtc_ld(vb, j * E + d);\n            }\n");
    fprintf(f, "            __syncthreads();\n");
    cu_att_query_ranges(k, &a, "            ");
    cu_att_grad_heads_begin(k, "            ");
    fprintf(f, "            for (int seg = 0; seg < 2; seg++)\n");
    fprintf(f, "            for (i64 i0 = seg ? ib : 0, ihi = seg ? ie : fm; i0 < ihi; i0 += %d) {\n", ATT_BLOCK);
    fprintf(f, "                const i64 i = i0 + threadIdx.x;\n");
    fprintf(f, "                float ds = 0.0f, pij = 0.0f;\n");
    fprintf(f, "                if (i < ihi) {\n");
    fprintf(f, "                    float dot = 0.0f, dp = 0.0f, dsum = 0.0f;\n");
    fprintf(f, "                    for (int d = 0; d < D; d++) {\n");
    fprintf(f, "                        dot += xtc_ld(qb, i * D + d) * row_a[d];\n");
    fprintf(f, "                        dp += xtc_ld(gb, i * GC + d) * row_b[d];\n");
    fprintf(f, "                        dsum += xtc_ld(gb, i * GC + d) * xtc_ld(ob, i * OC + d);\n                    }\n");
    fprintf(f, "                    const int keep = %s;\n", a.keep);
    fprintf(f, "                    const float lse = xtc_ld(ob, i * OC + E), dlse = GC > E ? xtc_ld(gb, i * GC + E) : 0.0f;\n");
    fprintf(f, "                    pij = xtc_prob(keep ? dot * scale%s : -3.40282347e+38f, lse, J);\n", a.bias);
    fprintf(f, "                    ds = keep ? pij * (dp - dsum + dlse) * scale : 0.0f;\n");
    fprintf(f, "                }\n");
    fprintf(f, "                w1[threadIdx.x] = ds;\n                w2[threadIdx.x] = pij;\n");
    fprintf(f, "                __syncthreads();\n");
    fprintf(f, "                const int ni = ihi - i0 < %d ? (int)(ihi - i0) : %d;\n", ATT_BLOCK, ATT_BLOCK);
    fprintf(f, "                for (int ci = 0; ci < %lld; ci++) {\n", accd);
    fprintf(f, "                    const int d = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "                    if (d < D)\n");
    fprintf(f, "                        for (int ii = 0; ii < ni; ii++) {\n");
    fprintf(f, "                            acc[ci] += w1[ii] * xtc_ld(qb, (i0 + ii) * D + d);\n");
    fprintf(f, "                            acc2[ci] += w2[ii] * xtc_ld(gb, (i0 + ii) * GC + d);\n                        }\n");
    fprintf(f, "                }\n");
    fprintf(f, "                __syncthreads(); /* before the next chunk overwrites w1, w2 */\n");
    fprintf(f, "            }\n");
    fprintf(f, "            }\n"); /* cu_att_grad_heads_begin's loop */
    fprintf(f, "            for (int ci = 0; ci < %lld; ci++) {\n", accd);
    fprintf(f, "                const int d = threadIdx.x + %d * ci;\n", ATT_BLOCK);
    fprintf(f, "                if (d < D) {\n                    xtc_st(dk, j * D + d, acc[ci]);\n");
    fprintf(f, "                    xtc_st(dv, j * D + d, acc2[ci]);\n                }\n            }\n");
    long long H, G;
    if (cu_att_grad_groups(x, &H, &G))
        fprintf(f, "            }\n"); /* cu_att_grad_zero_rows' else */
    fprintf(f, "        }\n");
    fprintf(f, "        __syncthreads(); /* before the next block of rows replaces row_a, row_b */\n");
    fprintf(f, "    }\n");
    cu_kernel_end(k);
    char rows[4 * CU_EXPR];
    snprintf(rows, sizeof rows, "%s%s%s * (%s + %s)", po(a.batches), a.batches, pc(a.batches), a.I, a.J);
    cu_geom_rows(k, rows, ATT_BLOCK);
    return 0;
}
