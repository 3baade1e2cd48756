/* interp_fused.c: the reference semantics of the fused ops (interp_fused.h), in double precision.
 *
 * attention (q[.., I, D], k[.., J, D], v[.., J, E], bias, mask, scale), for each batch index
 * and query row i, is what lower.c's subgraph computes (XT-SEMANTICS.md section 5, steps 7-16):
 *   s_j   = (q_i . k_j) * scale + bias[i, j]          (scale: one value per batch and head)
 *   s_j   = -FLT_MAX where !mask[i, j], or causal and j > i + (J - I)
 *   p_j   = exp(s_j - max s) / sum_j exp(s_j - max s)      (a fully masked row attends uniformly)
 *   out_i = sum_j p_j v_j,  and with stats the row's logsumexp max s + log(sum exp(s - max s))
 *
 * attention_grad: the gradient of that, given dout (the gradient of out_i, and of the logsumexp
 * when dout carries E+1 columns), with respect to q, k and v, stacked as [.., I + 2J, D]:
 *   dp_j  = dout_i . v_j;  D = sum_j p_j dp_j
 *   ds_j  = p_j (dp_j - D + dlse_i), 0 where s_j was masked (the where passes nothing back)
 *   dq_i += sum_j (ds_j scale) k_j;  dk_j += (ds_j scale) q_i;  dv_j += p_j dout_i
 * Grouped key/values (k, v [.., G, J, D] where q is [.., H, I, D]): query head i reads key/value
 * head i mod G (x-transformers' repeat 'b kvh n d -> b (r kvh) n d'). attention_grad then
 * computes each query head's dk, dv as above and adds them, heads ascending, into the rows of
 * key/value head i mod G (the order of the repeat's gradient, a sum over the repeats); the dk,
 * dv rows of heads G..H-1 stay zero.
 * Every sum runs in the order the unfused graph's ops run theirs, so the interpreter gives the
 * fused graph's outputs bit for bit (up to the sign of zeros).
 * The o operand (the forward output with its statistics) is not read here: the backends use it
 * to save work, the semantics do not depend on it. Nor do they depend on attention's bound,
 * which is checked here (att_check_bound). */
#include "interp_fused.h"
#include "fused_expr.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* max propagating NaN, as the interpreter's max */
static double fmax_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

/* Strides of x broadcast to a value of rank r and shape full[] (numpy rules, 0 where x repeats). */
static void bcast_strides(const IrFusedArg *x, int r, const int64_t *full, int64_t *st)
{
    int64_t s = 1, xst[IR_MAXRANK];
    for (int d = x->rank - 1; d >= 0; d--) {
        xst[d] = s;
        s *= x->shape[d];
    }
    for (int d = 0; d < r; d++) {
        int k = d - (r - x->rank);
        st[d] = k < 0 || (x->shape[k] == 1 && full[d] != 1) ? 0 : xst[k];
    }
}

/* The view of one attention: sizes, operand pointers and the strides of bias and mask. */
typedef struct {
    int r;
    int64_t nb, I, J, D, E;
    const IrFusedArg *q, *k, *v, *bias, *mask, *scale;
    int64_t bst[IR_MAXRANK], mst[IR_MAXRANK], sst[IR_MAXRANK]; /* over [batch.., I, J] */
    int causal;
    int64_t window; /* 0, or w: keys j < i + J - I - w dropped too */
    int64_t H, G;   /* query and key/value heads (ir_attention_kv_group); H = G: not grouped */
} Att;

/* the key/value batch index of query batch index bi: head i reads key/value head i mod G */
static int64_t att_kv(const Att *a, int64_t bi) { return a->H == a->G ? bi : bi / a->H * a->G + bi % a->H % a->G; }

static void att_init(Att *a, const IrNode *n, const IrFusedArg *q, const IrFusedArg *k, const IrFusedArg *v,
                     const IrFusedArg *bias, const IrFusedArg *mask, const IrFusedArg *scale)
{
    memset(a, 0, sizeof *a);
    a->r = q->rank;
    a->q = q, a->k = k, a->v = v, a->bias = bias, a->mask = mask, a->scale = scale;
    a->I = q->shape[a->r - 2];
    a->D = q->shape[a->r - 1];
    a->J = k->shape[a->r - 2];
    a->E = v->shape[a->r - 1];
    a->nb = 1;
    int64_t full[IR_MAXRANK];
    for (int d = 0; d < a->r - 2; d++) {
        full[d] = q->shape[d];
        a->nb *= q->shape[d];
    }
    full[a->r - 2] = a->I;
    full[a->r - 1] = a->J;
    bcast_strides(bias, a->r, full, a->bst);
    bcast_strides(mask, a->r, full, a->mst);
    bcast_strides(scale, a->r, full, a->sst);
    a->causal = n->ia[IR_IA_CAUSAL] != 0;
    a->window = n->op == IR_ATTENTION ? n->ia[IR_IA_WINDOW] : n->ia[IR_IA_GRAD_WINDOW];
    a->H = a->r >= 3 ? q->shape[a->r - 3] : 1;
    a->G = a->r >= 3 ? k->shape[a->r - 3] : 1;
}

/* offsets of batch index bi in bias, mask and scale */
static void att_batch(const Att *a, int64_t bi, int64_t *boff, int64_t *moff, int64_t *soff)
{
    *boff = *moff = *soff = 0;
    for (int d = a->r - 3; d >= 0; d--) {
        int64_t size = a->q->shape[d], idx = bi % size;
        bi /= size;
        *boff += idx * a->bst[d];
        *moff += idx * a->mst[d];
        *soff += idx * a->sst[d];
    }
}

static double att_scale(const Att *a, int64_t bi)
{
    int64_t boff, moff, soff;
    att_batch(a, bi, &boff, &moff, &soff);
    return a->scale->data[soff];
}

/* scores s[J] of query row i of batch bi; keep[j] = 0 where masked. Returns the row maximum. */
static double att_scores(const Att *a, int64_t bi, int64_t i, double *s, char *keep)
{
    int64_t boff, moff, soff;
    att_batch(a, bi, &boff, &moff, &soff);
    double scale = a->scale->data[soff];
    const double *qi = a->q->data + (bi * a->I + i) * a->D;
    const double *kb = a->k->data + att_kv(a, bi) * a->J * a->D;
    int r = a->r;
    double m = -INFINITY;
    for (int64_t j = 0; j < a->J; j++) {
        double dot = 0;
        for (int64_t d = 0; d < a->D; d++)
            dot += qi[d] * kb[j * a->D + d];
        double x = dot * scale + a->bias->data[boff + i * a->bst[r - 2] + j * a->bst[r - 1]];
        keep[j] = a->mask->data[moff + i * a->mst[r - 2] + j * a->mst[r - 1]] != 0 &&
                  !(a->causal && j > i + (a->J - a->I)) && !(a->window && j < i + (a->J - a->I) - a->window);
        s[j] = keep[j] ? x : -(double)FLT_MAX;
        m = j ? fmax_nan(m, s[j]) : s[j];
    }
    return m;
}

/* p[j] = softmax of s; returns the logsumexp */
static double att_probs(const Att *a, const double *s, double m, double *p)
{
    double l = 0;
    for (int64_t j = 0; j < a->J; j++) {
        p[j] = exp(s[j] - m);
        l += p[j];
    }
    for (int64_t j = 0; j < a->J; j++)
        p[j] /= l;
    return m + log(l);
}

static int att_alloc(const Att *a, double **s, double **p, char **keep, char *err, size_t nerr)
{
    size_t J = (size_t)(a->J > 0 ? a->J : 1);
    *s = malloc(J * sizeof **s);
    *p = malloc(J * sizeof **p);
    *keep = malloc(J);
    if (*s && *p && *keep)
        return 0;
    free(*s), free(*p), free(*keep);
    snprintf(err, nerr, "out of memory");
    return -1;
}

/* A bounded attention (bound b > 0) claims |q_i . k_j| <= b for every pair (the pass derives it
 * from l2-normalised q and k, ops.def): the kernels take b scale as each row's maximum, so a
 * wrong claim is a wrong program. The semantics do not depend on b; this checks it, allowing
 * for the rounding of f32 norms. */
static int att_check_bound(const Att *a, int64_t bound, char *err, size_t nerr)
{
    double lim = (double)bound * (1 + 1e-4);
    for (int64_t bi = 0; bi < a->nb; bi++)
        for (int64_t i = 0; i < a->I; i++)
            for (int64_t j = 0; j < a->J; j++) {
                const double *qi = a->q->data + (bi * a->I + i) * a->D, *kj = a->k->data + (att_kv(a, bi) * a->J + j) * a->D;
                double dot = 0;
                for (int64_t d = 0; d < a->D; d++)
                    dot += qi[d] * kj[d];
                if (!(fabs(dot) <= lim)) {
                    snprintf(err, nerr, "attention with bound=%lld: |q . k| = %g exceeds the bound", (long long)bound,
                             fabs(dot));
                    return -1;
                }
            }
    return 0;
}

int ir_fused_attention(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out, char *err,
                       size_t nerr)
{
    Att a;
    att_init(&a, n, &in[0], &in[1], &in[2], &in[3], &in[4], &in[5]);
    int stats = n->ia[IR_IA_STATS] != 0;
    int64_t ocols = out_shape[a.r - 1]; /* E, or E + 1 with stats */
    if (n->ia[IR_IA_BOUND] > 0 && att_check_bound(&a, n->ia[IR_IA_BOUND], err, nerr) < 0)
        return -1;
    double *s, *p;
    char *keep;
    if (att_alloc(&a, &s, &p, &keep, err, nerr) < 0)
        return -1;
    for (int64_t bi = 0; bi < a.nb; bi++)
        for (int64_t i = 0; i < a.I; i++) {
            double *oi = out + (bi * a.I + i) * ocols;
            if (a.J == 0) { /* softmax of nothing, times nothing */
                for (int64_t c = 0; c < ocols; c++)
                    oi[c] = c < a.E ? 0 : -INFINITY; /* log of an empty sum */
                continue;
            }
            double m = att_scores(&a, bi, i, s, keep);
            double lse = att_probs(&a, s, m, p);
            const double *vb = a.v->data + att_kv(&a, bi) * a.J * a.E;
            for (int64_t e = 0; e < a.E; e++)
                oi[e] = 0;
            for (int64_t j = 0; j < a.J; j++)
                for (int64_t e = 0; e < a.E; e++)
                    oi[e] += p[j] * vb[j * a.E + e];
            if (stats)
                oi[a.E] = lse;
        }
    free(s), free(p), free(keep);
    return 0;
}

int ir_fused_attention_grad(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out,
                            char *err, size_t nerr)
{
    Att a;
    att_init(&a, n, &in[0], &in[1], &in[2], &in[5], &in[6], &in[7]);
    const IrFusedArg *dout = &in[4];
    int64_t gcols = dout->shape[a.r - 1]; /* E, or E + 1 with the logsumexp's gradient */
    int64_t rows = out_shape[a.r - 2];    /* I + 2J */
    memset(out, 0, sizeof *out * (size_t)(a.nb * rows * a.D));
    double *s, *p, *dkh = NULL; /* grouped: one query head's dk, dv [2J, D] before the group's sum */
    char *keep;
    if (att_alloc(&a, &s, &p, &keep, err, nerr) < 0)
        return -1;
    if (a.H != a.G && !(dkh = calloc((size_t)(2 * a.J * a.D + 1), sizeof *dkh))) {
        free(s), free(p), free(keep);
        snprintf(err, nerr, "out of memory");
        return -1;
    }
    for (int64_t bi = 0; bi < a.nb; bi++) {
        double *dq = out + bi * rows * a.D, *dk = dq + a.I * a.D, *dv = dk + a.J * a.D;
        const double *qb = a.q->data + bi * a.I * a.D, *kb = a.k->data + att_kv(&a, bi) * a.J * a.D;
        const double *vb = a.v->data + att_kv(&a, bi) * a.J * a.E;
        if (dkh) {
            memset(dkh, 0, sizeof *dkh * (size_t)(2 * a.J * a.D));
            dk = dkh, dv = dkh + a.J * a.D;
        }
        double scale = att_scale(&a, bi);
        for (int64_t i = 0; i < a.I && a.J > 0; i++) {
            const double *g = dout->data + (bi * a.I + i) * gcols;
            double dlse = gcols > a.E ? g[a.E] : 0;
            double m = att_scores(&a, bi, i, s, keep);
            att_probs(&a, s, m, p);
            double dd = 0;
            for (int64_t j = 0; j < a.J; j++) { /* s[j] := dp_j */
                double dp = 0;
                for (int64_t e = 0; e < a.E; e++)
                    dp += g[e] * vb[j * a.E + e];
                s[j] = dp;
                dd += p[j] * dp;
            }
            for (int64_t j = 0; j < a.J; j++) {
                for (int64_t e = 0; e < a.E; e++)
                    dv[j * a.E + e] += p[j] * g[e];
                if (!keep[j])
                    continue;
                double ds = p[j] * (s[j] - dd + dlse) * scale;
                for (int64_t d = 0; d < a.D; d++) {
                    dq[i * a.D + d] += ds * kb[j * a.D + d];
                    dk[j * a.D + d] += ds * qb[i * a.D + d];
                }
            }
        }
        if (dkh) { /* into key/value head g = h mod G's rows of the same batch index */
            int64_t g = bi % a.H % a.G;
            double *to = out + (bi - bi % a.H + g) * rows * a.D + a.I * a.D;
            for (int64_t x = 0; x < 2 * a.J * a.D; x++)
                to[x] += dkh[x];
        }
    }
    free(s), free(p), free(keep), free(dkh);
    return 0;
}

/* ---- fused programs ---- */

typedef struct {
    int n;
    IrHostTensor t[IR_MAXIN];
} ProgBind;

static int prog_bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    ProgBind *b = ctx;
    int k = leaf->s && leaf->s[0] == 'x' ? atoi(leaf->s + 1) : -1;
    if (k < 0 || k >= b->n)
        return -1;
    *out = b->t[k];
    return 0;
}

int ir_fused_program(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out, char *err,
                     size_t nerr)
{
    IrFusedProgram *p = malloc(sizeof *p);
    if (!p) {
        snprintf(err, nerr, "out of memory");
        return -1;
    }
    int rc = -1;
    IrGraph *g = NULL;
    ProgBind b;
    memset(&b, 0, sizeof b);
    IrHostTensor y;
    memset(&y, 0, sizeof y);
    if (ir_fused_parse(n->s, p, err, nerr) < 0)
        goto done;
    /* the graph at these sizes: constant dims, so nothing needs binding but the data */
    IrDType dt[IR_MAXIN];
    int rk[IR_MAXIN];
    IrDim sh[IR_MAXIN][IR_MAXRANK], os[IR_MAXRANK];
    for (int k = 0; k < n->nin; k++) {
        dt[k] = n->in[k]->dtype;
        rk[k] = in[k].rank;
        for (int d = 0; d < in[k].rank; d++)
            sh[k][d] = ir_dim(in[k].shape[d]);
    }
    for (int d = 0; d < n->rank; d++)
        os[d] = ir_dim(out_shape[d]);
    g = ir_fused_graph(p, n->nin, dt, rk, sh, n->rank, os, NULL, err, nerr);
    if (!g)
        goto done;
    /* operands in the types ir_interp_f64 takes: f32 as double, others in their storage type */
    b.n = n->nin;
    for (int k = 0; k < n->nin; k++) {
        IrHostTensor *t = &b.t[k];
        int64_t numel = 1;
        t->dtype = dt[k];
        t->rank = in[k].rank;
        for (int d = 0; d < in[k].rank; d++)
            numel *= t->shape[d] = in[k].shape[d];
        size_t es = dt[k] == IR_F32 ? sizeof(double) : ir_dtype_size(dt[k]);
        t->data = malloc((size_t)(numel ? numel : 1) * es);
        if (!t->data) {
            snprintf(err, nerr, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < numel; i++) {
            double v = in[k].data[i];
            switch (dt[k]) {
            case IR_F32: ((double *)t->data)[i] = v; break;
            case IR_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
            case IR_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
            default: ((uint8_t *)t->data)[i] = v != 0; break;
            }
        }
    }
    if (ir_interp_f64(g, prog_bind, &b, &y, err, nerr) < 0)
        goto done;
    int64_t numel = ir_host_numel(&y);
    for (int64_t i = 0; i < numel; i++) {
        switch (y.dtype) {
        case IR_F32: out[i] = ((const double *)y.data)[i]; break;
        case IR_I32: out[i] = ((const int32_t *)y.data)[i]; break;
        case IR_I64: out[i] = (double)((const int64_t *)y.data)[i]; break;
        default: out[i] = ((const uint8_t *)y.data)[i] != 0; break;
        }
    }
    rc = 0;
done:
    for (int k = 0; k < b.n; k++)
        free(b.t[k].data);
    ir_host_free(&y);
    ir_graph_free(g);
    free(p);
    return rc;
}
