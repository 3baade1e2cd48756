/* cg_llvm_attention_grad.c: the CPU kernel of the fused attention's backward (ops.def:
 * attention_grad), FlashAttention-2 style like the forward (cg_llvm_attention.c, whose helpers
 * it shares through cg_llvm_attention.h): the n x n scores exist only a tile at a time, on the stack.
 *
 * Backward, one work item = one batch index of k and v (dq accumulates in place, with no other
 * thread writing it). With grouped key/values (G key/value heads for H query heads, R = H / G),
 * that is one key/value head, and the item runs its R query heads h = g, G + g, ... in turn inside
 * each key tile: dK, dV sum over them there, with no other thread writing key/value head g's rows
 * (ops.def: the dk, dv rows of head g; the item clears those of its heads G..H-1); K and V are
 * packed once for the R heads. B G items, not B H.
 *   u = sum of dout over the fully masked rows / J              (their uniform share of dv)
 *   for each tile of BBC keys: dK = dV = 0, K and V packed once
 *     for each query head of the item, each tile of BBR query rows that sees any of these keys:
 *       S = Q K^T, dP = dO V^T;  P = exp(S scale + bias - lse), 0 where masked
 *       Drow = dO . O - dlse;  dS = P (dP - Drow) scale
 *       dV += P^T dO;  dK += dS^T Q;  dQ += dS K
 *     dk = dK, dv = dV + u
 * Five tile products per pair of tiles, none of them n x n in memory. */
#include "cg_llvm_attention.h"

#include <float.h>
#include <string.h>

#define BBR 48  /* backward: query rows per tile */
#define BBC 64  /* backward: keys per tile */
_Static_assert(BBR % 16 == 0 && BBC % 16 == 0, "transpose_tile moves whole blocks of up to 16 x 16");

/* C[0..rows, 0..nc) (+)= A[rows, kc] x panel bp, A rows at a + r lda, C rows at c + r ldc */
static void micro_rows(K *k, LLVMValueRef a, LLVMValueRef lda, LLVMValueRef rows, LLVMValueRef kc, LLVMValueRef bp,
                       LLVMValueRef c, LLVMValueRef ldc, LLVMValueRef nc, int accumulate)
{
    CgLoop l;
    cg_for(k->f, &l, ci(k, 0), ceil_div(k, rows, k->mr), "mt");
    LLVMValueRef r0 = imul(k, l.iv, ci(k, k->mr));
    LLVMValueRef mr = imin(k, ci(k, k->mr), isub(k, rows, r0));
    LLVMValueRef args[11] = {a, lda, r0, isub(k, rows, ci(k, 1)), kc, bp, c, ldc, mr, nc,
                             LLVMConstInt(k->cg->t_i1, (unsigned long long)accumulate, 0)};
    LLVMBuildCall2(k->b, k->micro_ty, k->micro, args, 11, "");
    cg_for_end(k->f, &l);
}

/* dst[c dld + r] = src[r sld + c] for r < rows, c < cols, in VW x VW blocks through registers
 * (cg_transpose_vectors): whole blocks, so up to VW - 1 rows and columns past the edges, which
 * the arrays hold and nothing reads, move too. Scattering each element to its transposed place
 * instead vectorises into scatter instructions, which this CPU runs an element at a time. */
static void transpose_tile(K *k, LLVMValueRef src, int64_t sld, LLVMValueRef dst, int64_t dld, LLVMValueRef rows,
                           LLVMValueRef cols)
{
    int vw = k->nr / 2;
    LLVMTypeRef vt = LLVMVectorType(k->cg->t_f32, (unsigned)vw);
    CgLoop lr, lc;
    cg_for(k->f, &lr, ci(k, 0), ceil_div(k, rows, vw), "trow");
    LLVMValueRef r0 = imul(k, lr.iv, ci(k, vw));
    cg_for(k->f, &lc, ci(k, 0), ceil_div(k, cols, vw), "tcol");
    LLVMValueRef c0 = imul(k, lc.iv, ci(k, vw));
    LLVMValueRef v[64];
    for (int t = 0; t < vw; t++) {
        v[t] = LLVMBuildLoad2(k->b, vt, ptr(k, src, iadd(k, imul(k, iadd(k, r0, ci(k, t)), ci(k, sld)), c0)), "");
        LLVMSetAlignment(v[t], 4);
    }
    cg_transpose_vectors(k->cg, v, vw);
    for (int u = 0; u < vw; u++)
        LLVMSetAlignment(LLVMBuildStore(k->b, v[u], ptr(k, dst, iadd(k, imul(k, iadd(k, c0, ci(k, u)), ci(k, dld)), r0))), 4);
    cg_for_end(k->f, &lc);
    cg_for_end(k->f, &lr);
}

void cg_attention_grad_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    K k;
    cg_att_k_base(&k, f);
    const IrNode *n = f->node, *q = n->in[0];
    int r = q->rank;
    LLVMValueRef qitems = cg_dims_prod(f, q->shape, 0, r - 2); /* query batch indices */
    *items = cg_dims_prod(f, n->in[1]->shape, 0, r - 2);       /* key/value ones: the grouped items */
    LLVMValueRef I = cg_dim(f, q->shape[r - 2]), J = cg_dim(f, n->in[1]->shape[r - 2]);
    *cost = imul(&k, imul(&k, qitems, I), imul(&k, J, cg_dims_prod(f, q->shape, r - 1, r)));
}

/* The query heads of backward work item kbi (a key/value batch index): with grouped key/values
 * (R = H / G > 1), a loop over the R query heads h = g, G + g, .. of its key/value head g
 * (closed by heads_end); else the item's own batch index. Returns the query batch index. */
typedef struct {
    int64_t R, H, G;
    CgLoop l;
} Heads;

static LLVMValueRef heads_begin(K *k, Heads *h, LLVMValueRef kbi, int64_t from)
{
    if (h->R == 1)
        return kbi;
    cg_for(k->f, &h->l, ci(k, from), ci(k, h->R), "qhead");
    LLVMValueRef b = idiv(k, kbi, ci(k, h->G)), g = irem(k, kbi, ci(k, h->G));
    return iadd(k, imul(k, b, ci(k, h->H)), iadd(k, imul(k, h->l.iv, ci(k, h->G)), g));
}

static void heads_end(K *k, Heads *h)
{
    if (h->R > 1)
        cg_for_end(k->f, &h->l);
}

/* What the backward reads and writes for query batch index bi: its q, o (with the logsumexp
 * column), dout and dq rows, its bias and mask offsets and its scale. */
typedef struct {
    LLVMValueRef qb, obf, gb, dqb, boff, moff, scale;
} GradHead;

static void grad_head(K *k, const Dims *d, const ScoreOp *bias, const ScoreOp *mask, LLVMValueRef bi, GradHead *h)
{
    CgFn *f = k->f;
    const IrNode *n = f->node, *q = n->in[0], *dout = n->in[4];
    int r = q->rank;
    int64_t Go = ir_dim_is_const(dout->shape[r - 1]) && dout->shape[r - 1].c == d->E ? d->E : d->E + 1;
    LLVMValueRef rows = imul(k, bi, d->I), rowsout = iadd(k, d->I, imul(k, d->J, ci(k, 2)));
    h->qb = ptr(k, f->in[0], imul(k, rows, ci(k, d->D)));
    h->obf = ptr(k, f->in[3], imul(k, rows, ci(k, d->E + 1)));
    h->gb = ptr(k, f->in[4], imul(k, rows, ci(k, Go)));
    h->dqb = ptr(k, f->out, imul(k, imul(k, bi, rowsout), ci(k, d->D)));
    h->boff = bias->present ? cg_att_score_batch_offset(k, q, bias, bi) : ci(k, 0);
    h->moff = mask->present ? cg_att_score_batch_offset(k, q, mask, bi) : ci(k, 0);
    h->scale = cg_att_scale_of(k, q, n->in[7], f->in[7], bi);
}

int cg_attention_grad_impl(CgFn *f)
{
    K k;
    cg_att_k_init(&k, f);
    const IrNode *n = f->node, *q = n->in[0], *dout = n->in[4];
    Dims d;
    if (cg_att_dims_of(&k, n, &d) < 0)
        return -1;
    int causal = n->ia[IR_IA_GRAD_CAUSAL] != 0, D = d.D, E = d.E, nr = k.nr;
    int64_t window = n->ia[IR_IA_GRAD_WINDOW];
    int r = q->rank;
    int64_t Eo = E + 1, Go = ir_dim_is_const(dout->shape[r - 1]) && dout->shape[r - 1].c == E ? E : E + 1;
    ScoreOp bias, mask;
    cg_att_score_op(&k, q, n->in[5], f->in[5], 0, &bias);
    cg_att_score_op(&k, q, n->in[6], f->in[6], 1, &mask);
    int kpanels = (BBC + nr - 1) / nr, dpanels = (D + nr - 1) / nr;
    LLVMValueRef S = stack_floats(&k, BBR * BBC, "S"), DP = stack_floats(&k, BBR * BBC, "dP");
    LLVMValueRef PT = stack_floats(&k, BBC * BBR, "PT"), DST = stack_floats(&k, BBC * BBR, "dST");
    LLVMValueRef DK = stack_floats(&k, (int64_t)BBC * D, "dK"), DV = stack_floats(&k, (int64_t)BBC * E, "dV");
    LLVMValueRef KPT = stack_floats(&k, (int64_t)kpanels * D * nr, "kpt");
    LLVMValueRef VPT = stack_floats(&k, (int64_t)kpanels * E * nr, "vpt");
    LLVMValueRef KPN = stack_floats(&k, (int64_t)dpanels * BBC * nr, "kpn");
    LLVMValueRef BP = stack_floats(&k, (int64_t)BBR * nr, "bp");
    LLVMValueRef LSE = stack_floats(&k, BBR, "lse"), DROW = stack_floats(&k, BBR, "drow");
    LLVMValueRef U = stack_floats(&k, E, "u");
    LLVMValueRef neg_max = fc(&k, -FLT_MAX);
    LLVMValueRef cD = ci(&k, D), cE = ci(&k, E), cEo = ci(&k, Eo), cGo = ci(&k, Go), cBBC = ci(&k, BBC), cBBR = ci(&k, BBR);
    LLVMValueRef off = isub(&k, d.J, d.I);
    LLVMValueRef rowsout = iadd(&k, d.I, imul(&k, d.J, ci(&k, 2)));

    Heads hd = {ir_attention_kv_group(n), 1, 1, {0}};
    if (hd.R > 1)
        hd.H = q->shape[r - 3].c, hd.G = n->in[1]->shape[r - 3].c;
    CgLoop li;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef kbi = li.iv; /* k and v's batch index; grouped: their rows' head g in the output */
    LLVMValueRef kvq = kbi; /* the query batch index of head g: b H + g */
    if (hd.R > 1)
        kvq = iadd(&k, imul(&k, idiv(&k, kbi, ci(&k, hd.G)), ci(&k, hd.H)), irem(&k, kbi, ci(&k, hd.G)));
    LLVMValueRef kb = ptr(&k, f->in[1], imul(&k, imul(&k, kbi, d.J), cD));
    LLVMValueRef vb = ptr(&k, f->in[2], imul(&k, imul(&k, kbi, d.J), cE));
    LLVMValueRef dkb = ptr(&k, f->out, iadd(&k, imul(&k, imul(&k, kvq, rowsout), cD), imul(&k, d.I, cD)));
    LLVMValueRef dvb = ptr(&k, dkb, imul(&k, d.J, cD));
    GradHead h;
    if (hd.R > 1) { /* the dk, dv rows of the item's heads G..H-1: zero */
        LLVMValueRef hb = heads_begin(&k, &hd, kbi, 1);
        cg_att_fill(&k, ptr(&k, f->out, iadd(&k, imul(&k, imul(&k, hb, rowsout), cD), imul(&k, d.I, cD))),
                    imul(&k, imul(&k, d.J, ci(&k, 2)), cD), 0);
        heads_end(&k, &hd);
    }
    /* u: the fully masked rows' uniform share of every dv row (summed over the item's heads) */
    cg_att_fill(&k, U, cE, 0);
    CgLoop lr, lc;
    grad_head(&k, &d, &bias, &mask, heads_begin(&k, &hd, kbi, 0), &h);
    LLVMValueRef qb = h.qb, obf = h.obf, gb = h.gb, dqb = h.dqb, boff = h.boff, moff = h.moff, scale = h.scale;
    cg_att_fill(&k, dqb, imul(&k, d.I, cD), 0);
    cg_for(f, &lr, ci(&k, 0), d.I, "i");
    LLVMValueRef lse_i = ld(&k, obf, iadd(&k, imul(&k, lr.iv, cEo), cE));
    CgIf fm;
    cg_if(f, &fm, LLVMBuildFCmp(k.b, LLVMRealOLE, lse_i, neg_max, ""));
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, U, lc.iv, f_add(&k, ld(&k, U, lc.iv), ld(&k, gb, iadd(&k, imul(&k, lr.iv, cGo), lc.iv))));
    cg_for_end(f, &lc);
    cg_if_end(f, &fm);
    cg_for_end(f, &lr);
    heads_end(&k, &hd);
    LLVMValueRef invj = LLVMBuildFDiv(k.b, fc(&k, 1), LLVMBuildSIToFP(k.b, imax(&k, d.J, ci(&k, 1)), k.cg->t_f32, ""), "");
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, U, lc.iv, f_mul(&k, ld(&k, U, lc.iv), invj));
    cg_for_end(f, &lc);

    CgLoop lj;
    cg_for(f, &lj, ci(&k, 0), ceil_div(&k, d.J, BBC), "ktile");
    LLVMValueRef j0 = imul(&k, lj.iv, cBBC);
    LLVMValueRef bc = imin(&k, cBBC, isub(&k, d.J, j0));
    cg_att_fill(&k, DK, ci(&k, (int64_t)BBC * D), 0);
    cg_att_fill(&k, DV, ci(&k, (int64_t)BBC * E), 0);
    /* K and V of the tile, packed once: transposed panels for Q K^T and dO V^T, plain for dS K */
    CgLoop lp;
    cg_for(f, &lp, ci(&k, 0), ceil_div(&k, bc, nr), "kpanel");
    LLVMValueRef p0 = imul(&k, lp.iv, ci(&k, nr));
    LLVMValueRef nc = imin(&k, ci(&k, nr), isub(&k, bc, p0));
    pack(&k, 1, ptr(&k, KPT, imul(&k, lp.iv, ci(&k, (int64_t)D * nr))), kb, cD, ci(&k, 0), cD, iadd(&k, j0, p0), nc);
    pack(&k, 1, ptr(&k, VPT, imul(&k, lp.iv, ci(&k, (int64_t)E * nr))), vb, cE, ci(&k, 0), cE, iadd(&k, j0, p0), nc);
    cg_for_end(f, &lp);
    for (int dp = 0; dp < dpanels; dp++)
        pack(&k, 0, ptr(&k, KPN, ci(&k, (int64_t)dp * BBC * nr)), kb, cD, j0, bc, ci(&k, dp * nr),
             ci(&k, D - dp * nr < nr ? D - dp * nr : nr));

    /* query tiles that see any key of this tile: i + off >= j0 under causal, and with a window
     * i + off - window < j0 + bc */
    LLVMValueRef istart = causal ? imin(&k, d.I, imax(&k, ci(&k, 0), isub(&k, j0, off))) : ci(&k, 0);
    LLVMValueRef iend = window ? imax(&k, istart, imin(&k, d.I, iadd(&k, isub(&k, iadd(&k, j0, bc), off), ci(&k, window))))
                               : d.I;
    grad_head(&k, &d, &bias, &mask, heads_begin(&k, &hd, kbi, 0), &h);
    qb = h.qb, obf = h.obf, gb = h.gb, dqb = h.dqb, boff = h.boff, moff = h.moff, scale = h.scale;
    CgLoop lq;
    cg_for(f, &lq, ci(&k, 0), ceil_div(&k, isub(&k, iend, istart), BBR), "qtile");
    LLVMValueRef i0 = iadd(&k, istart, imul(&k, lq.iv, cBBR));
    LLVMValueRef rows = imin(&k, cBBR, isub(&k, iend, i0));
    LLVMValueRef qt = ptr(&k, qb, imul(&k, i0, cD)), gt = ptr(&k, gb, imul(&k, i0, cGo));
    /* S = Q K^T, dP = dO V^T, panel by panel */
    cg_for(f, &lp, ci(&k, 0), ceil_div(&k, bc, nr), "kpanel");
    p0 = imul(&k, lp.iv, ci(&k, nr));
    nc = imin(&k, ci(&k, nr), isub(&k, bc, p0));
    micro_rows(&k, qt, cD, rows, cD, ptr(&k, KPT, imul(&k, lp.iv, ci(&k, (int64_t)D * nr))), ptr(&k, S, p0), cBBC, nc, 0);
    micro_rows(&k, gt, cGo, rows, cE, ptr(&k, VPT, imul(&k, lp.iv, ci(&k, (int64_t)E * nr))), ptr(&k, DP, p0), cBBC, nc, 0);
    cg_for_end(f, &lp);
    /* row statistics: lse, and Drow = dO . O - dlse */
    cg_for(f, &lr, ci(&k, 0), rows, "row");
    LLVMValueRef i = iadd(&k, i0, lr.iv);
    st(&k, LSE, lr.iv, ld(&k, obf, iadd(&k, imul(&k, i, cEo), cE)));
    LLVMValueRef dsum = cg_var(f, k.cg->t_f32, fc(&k, 0), "dsum");
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    fsum_into(&k, dsum, f_mul(&k, ld(&k, gb, iadd(&k, imul(&k, i, cGo), lc.iv)), ld(&k, obf, iadd(&k, imul(&k, i, cEo), lc.iv))));
    cg_for_end(f, &lc);
    LLVMValueRef dr = fget(&k, dsum);
    if (Go > E)
        dr = f_sub(&k, dr, ld(&k, gb, iadd(&k, imul(&k, i, cGo), cE)));
    st(&k, DROW, lr.iv, dr);
    cg_for_end(f, &lr);
    /* P and dS, row by row, stored as they are and transposed */
    cg_for(f, &lr, ci(&k, 0), rows, "row");
    i = iadd(&k, i0, lr.iv);
    LLVMValueRef srow = imul(&k, lr.iv, cBBC);
    LLVMValueRef lse = ld(&k, LSE, lr.iv), drow = ld(&k, DROW, lr.iv);
    LLVMValueRef notfull = LLVMBuildFCmp(k.b, LLVMRealOGT, lse, neg_max, "");
    LLVMValueRef lim = causal ? isub(&k, iadd(&k, iadd(&k, i, off), ci(&k, 1)), j0) : bc;
    LLVMValueRef brow = bias.present ? cg_att_score_row(&k, &bias, boff, i, j0) : NULL;
    LLVMValueRef mrow = mask.present ? cg_att_score_row(&k, &mask, moff, i, j0) : NULL;
    cg_for(f, &lc, ci(&k, 0), bc, "c");
    LLVMValueRef si = iadd(&k, srow, lc.iv), keep;
    LLVMValueRef lo = window ? isub(&k, isub(&k, iadd(&k, i, off), ci(&k, window)), j0) : NULL;
    LLVMValueRef x = cg_att_score_at(&k, &bias, &mask, brow, mrow, lc.iv, lo, lim, f_mul(&k, ld(&k, S, si), scale), &keep);
    keep = LLVMBuildAnd(k.b, keep, notfull, "");
    LLVMValueRef p = LLVMBuildSelect(k.b, keep, cg_exp_finite(k.cg, f_sub(&k, x, lse)), fc(&k, 0), "");
    LLVMValueRef ds = f_mul(&k, f_mul(&k, p, f_sub(&k, ld(&k, DP, si), drow)), scale);
    st(&k, S, si, p); /* the scores are done with: P takes their place */
    st(&k, DP, si, ds);
    cg_for_end(f, &lc);
    cg_for_end(f, &lr);
    transpose_tile(&k, S, BBC, PT, BBR, rows, bc);
    transpose_tile(&k, DP, BBC, DST, BBR, rows, bc);
    /* dV += P^T dO, dK += dS^T Q, dQ += dS K */
    for (int e0 = 0; e0 < E; e0 += nr) {
        LLVMValueRef enc = ci(&k, E - e0 < nr ? E - e0 : nr);
        pack(&k, 0, BP, gb, cGo, i0, rows, ci(&k, e0), enc);
        micro_rows(&k, PT, cBBR, bc, rows, BP, ptr(&k, DV, ci(&k, e0)), cE, enc, 1);
    }
    for (int d0 = 0; d0 < D; d0 += nr) {
        LLVMValueRef dnc = ci(&k, D - d0 < nr ? D - d0 : nr);
        pack(&k, 0, BP, qb, cD, i0, rows, ci(&k, d0), dnc);
        micro_rows(&k, DST, cBBR, bc, rows, BP, ptr(&k, DK, ci(&k, d0)), cD, dnc, 1);
        micro_rows(&k, DP, cBBC, rows, bc, ptr(&k, KPN, ci(&k, (int64_t)(d0 / nr) * BBC * nr)),
                   ptr(&k, dqb, iadd(&k, imul(&k, i0, cD), ci(&k, d0))), cD, dnc, 1);
    }
    cg_for_end(f, &lq);
    heads_end(&k, &hd);
    /* the tile's dk and dv rows */
    cg_for(f, &lr, ci(&k, 0), bc, "krow");
    LLVMValueRef jrow = iadd(&k, j0, lr.iv);
    cg_for(f, &lc, ci(&k, 0), cD, "d");
    st(&k, dkb, iadd(&k, imul(&k, jrow, cD), lc.iv), ld(&k, DK, iadd(&k, imul(&k, lr.iv, cD), lc.iv)));
    cg_for_end(f, &lc);
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, dvb, iadd(&k, imul(&k, jrow, cE), lc.iv),
       f_add(&k, ld(&k, DV, iadd(&k, imul(&k, lr.iv, cE), lc.iv)), ld(&k, U, lc.iv)));
    cg_for_end(f, &lc);
    cg_for_end(f, &lr);
    cg_for_end(f, &lj);
    cg_for_end(f, &li);
    return 0;
}
