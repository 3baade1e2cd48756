/* lower.c: lowering of checked x-transformers models (.xtf) to the tensor IR.
 *
 * Follows ../shared/XT-SEMANTICS.md (x-transformers 0.23.0) operation for operation: the
 * section numbers in comments point there. Parameters carry their exact state_dict names.
 * Everything is expressed in primitive IR ops (LayerNorm as mean/variance/rsqrt, attention as
 * matmul/softmax/where); the fusion passes recombine them.
 *
 * Symbols: "b" (batch), "n" (sequence, bounded by max_seq_len), "m" (context length, for
 * cross-attention), "s"/"t" (source/target lengths of XTransformer), "p" (Transformer-XL memory
 * rows in) and the derived "q" = min(n+p, max_mem_len) (rows out), "c" (KV cache length). Inputs
 * and outputs are named as in DESIGN.md ("Module interface"). */
#include "xtf.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "options.h"

typedef enum { NORM_LAYER, NORM_SCALE, NORM_RMS } NormKind;

#define MAX_LAYERS 512

/* One AttentionLayers stack (section 4) with its Attention and FeedForward options. */
typedef struct {
    const XtfValue *call;
    int dim, depth, heads, dim_head;
    int causal, cross_attend, only_cross;
    NormKind norm;
    int pre_norm, sandwich_norm, rezero, macaron;
    int scale_residual, gate_residual, residual_attn, cross_residual_attn;
    int rotary, rotary_dim;     /* rotary_dim = rd of section 7.2 */
    int rel_pos, rel_buckets, rel_max_distance;
    int pia;                    /* position_infused_attn */
    int use_qk_norm_attn, qk_norm;
    double qk_scale_init;       /* the log-temperature qk_norm's scale starts at (section 9) */
    int attn_zero_init, ff_zero_init; /* zero_init_output: to_out, and the FF's last Linear start at 0 */
    int collab_qk;              /* collab_heads: the width of the shared q and k, 0 = off */
    int talking_heads, on_attn, gate_values, head_scale, num_mem_kv;
    int sparse_topk;            /* k, 0 = off */
    int max_attend_past;        /* the attention window w, 0 = off */
    int entmax15;
    int alibi, alibi_heads, alibi_learned; /* section 7.4: learned slopes (or not causal) */
    int ff_glu, ff_relu_squared, ff_post_act_ln;
    double ff_mult;
    double attn_dropout, ff_dropout;
    char types[MAX_LAYERS];
    int shift[MAX_LAYERS];      /* shift_tokens of each layer, 0 = none (section 4) */
    int ntypes;
} Stack;

typedef struct {
    IrGraph *g;
    const XtfFile *f;
    XtfDiag *d;
    const XtLowerOpts *opt;
    const char *root;     /* state_dict prefix of the current wrapper ("", "encoder.", ...) */
    const char *vroot;    /* label prefix ("", "enc.", ...) */
    IrDim B;
    IrNode *mask;         /* bool[b, n] for self-attention, or NULL */
    IrNode *context;      /* f32[b, m, dim] for cross-attention, or NULL */
    IrNode *context_mask; /* bool[b, m] or NULL */
    IrNode **mems_in;     /* Transformer-XL: one f32[b, p, dim] per self-attention layer */
    IrNode **hiddens;     /* ... and each such layer's input, filled by attention_layers */
    IrNode **cache_k, **cache_v; /* KV cache: f32[b, c, h, dh] per self-attention layer, in */
    IrNode **new_k, **new_v;     /* ... and out (cache + this call's keys/values) */
    IrDim pos_offset;     /* position of the first token (the cache length) */
    int cur_attn;         /* index of the self-attention layer being built */
    IrNode *tied_emb;     /* XTransformer tie_token_emb: the embedding the decoder reuses */
    IrNode *store[6][MAX_LAYERS]; /* storage behind mems_in .. new_v */
    IrNode *dropout_seed; /* training with dropout: the i64 scalar input seeding the masks */
    int dropout_sites;    /* one random stream per dropout site */
} Lx;

/* ---- small helpers ---- */

static IrDim C(int64_t v) { return ir_dim(v); }

static IrNode *paramv(Lx *L, int buffer, int rank, const IrDim *shape, const char *fmt, ...)
{
    char name[256], full[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s%s", L->root, name);
    return buffer ? ir_buffer(L->g, full, rank, shape) : ir_param(L->g, full, rank, shape);
}

static IrNode *param1(Lx *L, int64_t d0, const char *prefix, const char *leaf)
{
    IrDim s[1] = {C(d0)};
    return paramv(L, 0, 1, s, "%s.%s", prefix, leaf);
}

static IrNode *cf(Lx *L, double v) { return ir_const(L->g, v, IR_F32); }
static IrNode *add(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_ADD, a, b); }
static IrNode *sub(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_SUB, a, b); }
static IrNode *mul(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_MUL, a, b); }
static IrNode *un(Lx *L, IrOp op, IrNode *x) { return ir_unary(L->g, op, x); }

static IrNode *lab(Lx *L, IrNode *n, const char *fmt, ...)
{
    char buf[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ir_label(L->g, n, "%s%s", L->vroot, buf);
}

static IrDim seq_of(IrNode *x) { return x ? x->shape[1] : C(0); }

/* y = x @ W.T (+ b); W is [out, in] (section 1) */
static IrNode *linear(Lx *L, IrNode *x, const char *prefix, int in, int out, int bias)
{
    IrDim ws[2] = {C(out), C(in)};
    IrNode *y = ir_matmul(L->g, x, paramv(L, 0, 2, ws, "%s.weight", prefix), 1);
    if (bias)
        y = add(L, y, param1(L, out, prefix, "bias"));
    return y;
}

/* fresh weights of the Linear at prefix start at zero, weight and bias (x-transformers'
 * init_zero_, for zero_init_output) */
static void zero_init_linear(Lx *L, const char *prefix)
{
    char name[300];
    const char *leaf[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s.%s", L->root, prefix, leaf[i]);
        ir_init_const(L->g, ir_find_leaf(L->g, IR_PARAM, name), 0.0);
    }
}

static IrNode *mean_last(Lx *L, IrNode *x, int d)
{
    return mul(L, ir_reduce(L->g, IR_SUM, x, -1), cf(L, 1.0 / d));
}

/* nn.LayerNorm(d): (x - mean) / sqrt(var_biased + 1e-5) * weight + bias (section 8) */
static IrNode *layer_norm(Lx *L, IrNode *x, const char *prefix, int d)
{
    IrNode *xc = sub(L, x, mean_last(L, x, d));
    IrNode *var = mean_last(L, mul(L, xc, xc), d);
    IrNode *y = mul(L, xc, un(L, IR_RSQRT, add(L, var, cf(L, 1e-5))));
    IrNode *w = param1(L, d, prefix, "weight"); /* declared in state_dict order */
    IrNode *b = param1(L, d, prefix, "bias");
    return add(L, mul(L, y, w), b);
}

/* ScaleNorm / RMSNorm: x / clamp(||x|| * d^-0.5, min=eps) * g (section 8) */
static IrNode *scale_norm(Lx *L, IrNode *x, const char *prefix, int d, int gdim, double eps)
{
    IrNode *nrm = un(L, IR_SQRT, ir_reduce(L->g, IR_SUM, mul(L, x, x), -1));
    nrm = ir_binary(L->g, IR_MAX, mul(L, nrm, cf(L, 1.0 / sqrt((double)d))), cf(L, eps));
    return mul(L, ir_binary(L->g, IR_DIV, x, nrm), param1(L, gdim, prefix, "g"));
}

static IrNode *block_norm(Lx *L, const Stack *S, IrNode *x, const char *prefix)
{
    if (S->rezero) /* use_rezero: every block norm is Identity */
        return x;
    switch (S->norm) {
    case NORM_RMS: return scale_norm(L, x, prefix, S->dim, S->dim, 1e-8);
    case NORM_SCALE: return scale_norm(L, x, prefix, S->dim, 1, 1e-5);
    default: return layer_norm(L, x, prefix, S->dim);
    }
}

/* F.normalize(x, dim=-1): x / max(||x||, 1e-12) */
static IrNode *l2norm(Lx *L, IrNode *x)
{
    IrNode *nrm = un(L, IR_SQRT, ir_reduce(L->g, IR_SUM, mul(L, x, x), -1));
    return ir_binary(L->g, IR_DIV, x, ir_binary(L->g, IR_MAX, nrm, cf(L, 1e-12)));
}

/* nn.Dropout(p) in training mode (XtLowerOpts.dropout): each element is zeroed with probability p
 * and the others scaled by 1 / (1 - p). The mask is rand_like(dropout_seed) < p on a stream of its
 * own per site, with p rounded to rand_like's 2^-24 grid so every backend draws the same mask.
 * Evaluation (and p = 0) leaves x alone. */
static IrNode *dropout(Lx *L, IrNode *x, double p)
{
    IrGraph *g = L->g;
    if (!x || !L->opt->dropout || !(p > 0))
        return x;
    if (!L->dropout_seed)
        L->dropout_seed = ir_input(g, "dropout_seed", IR_I64, 0, NULL);
    double q = round(p * 16777216.0) / 16777216.0;
    if (q >= 1)
        return mul(L, x, cf(L, 0));
    IrNode *drop = ir_binary(g, IR_LT, ir_rand(g, L->dropout_seed, x, L->dropout_sites++), cf(L, q));
    return ir_where(g, drop, cf(L, 0), mul(L, x, cf(L, 1.0 / (1.0 - q))));
}

/* [b, n, h*d] -> [b, h, n, d] */
static IrNode *split_heads(Lx *L, IrNode *x, int h, int dh)
{
    if (!x)
        return NULL;
    IrDim s[4] = {L->B, seq_of(x), C(h), C(dh)};
    static const int perm[4] = {0, 2, 1, 3};
    return ir_permute(L->g, ir_reshape(L->g, x, 4, s), perm);
}

/* [b, h, n, d] -> [b, n, h*d] */
static IrNode *merge_heads(Lx *L, IrNode *x, int h, int dh)
{
    if (!x)
        return NULL;
    static const int perm[4] = {0, 2, 1, 3};
    IrDim s[3] = {L->B, x->shape[2], C((int64_t)h * dh)};
    return ir_reshape(L->g, ir_permute(L->g, x, perm), 3, s);
}

/* dots[b, g, i, j] = sum_h W[g, h] dots[b, h, i, j]: talking heads, a 1x1 conv (step 10) */
static IrNode *mix_heads(Lx *L, IrNode *dots, const char *prefix, const char *which, int h)
{
    IrDim ws[4] = {C(h), C(h), C(1), C(1)}, w2[2] = {C(h), C(h)};
    IrNode *w = ir_reshape(L->g, paramv(L, 0, 4, ws, "%s.%s.weight", prefix, which), 2, w2);
    static const int to_last[4] = {0, 2, 3, 1}, back[4] = {0, 3, 1, 2};
    return ir_permute(L->g, ir_matmul(L->g, ir_permute(L->g, dots, to_last), w, 1), back);
}

/* Per-stack position tensors, shared by every self-attention layer. */
typedef struct {
    IrNode *rot_cos, *rot_sin;  /* [n, rd] */
    IrNode *pia;                /* [n, dim] sinusoids */
    IrNode *relpos_table;       /* [buckets, heads] */
    IrNode *alibi_past, *alibi_future; /* ALiBi slopes [1, heads, 1, 1] (future: bidirectional) */
} Positions;

/* Positions tables cover L = mem + n positions; a tensor of length m takes the last m rows. */
static IrNode *last_rows(Lx *L, IrNode *table, IrDim m)
{
    if (!table)
        return NULL;
    return ir_slice(L->g, table, 0, ir_dim_sub(table->shape[0], m), m);
}

/* Rotary positions (section 7.2) on t[b, h, m, dh], positions L-m .. L-1. */
static IrNode *rotary(Lx *L, const Stack *S, IrNode *t, const Positions *P)
{
    IrGraph *g = L->g;
    if (!t)
        return NULL;
    int rd = S->rotary_dim, half = rd / 2, dh = (int)t->shape[t->rank - 1].c; /* collab q, k: qk wide */
    IrNode *cosv = last_rows(L, P->rot_cos, t->shape[2]), *sinv = last_rows(L, P->rot_sin, t->shape[2]);
    IrNode *xr = ir_slice(g, t, -1, C(0), C(rd));
    IrNode *x1 = ir_slice(g, xr, -1, C(0), C(half));
    IrNode *x2 = ir_slice(g, xr, -1, C(half), C(half));
    IrNode *rot = ir_concat(g, un(L, IR_NEG, x2), x1, -1);
    IrNode *out = add(L, mul(L, xr, cosv), mul(L, rot, sinv));
    if (rd < dh)
        out = ir_concat(g, out, ir_slice(g, t, -1, C(rd), C(dh - rd)), -1);
    return out;
}

/* The ALiBi bias [1, heads or 1, I, J] of x-transformers 0.23.0 (section 7.4), heads past
 * alibi_num_heads at slope 0. Fixed slopes (causal): j * slope, the same on every row (softmax
 * cannot tell it from -(i - j) * slope). Learned (or bidirectional): (j - i) * slope, with
 * bidirectionally |j - i| * past slope for j <= i and |j - i| * future slope for j >= i (tril and
 * triu; 0.23.0 adds these distances with a plus sign). Positions count from 0 on both axes, keys
 * past memories and memory key/values included; with a KV cache the rows are those of the full
 * recomputation. */
static IrNode *alibi_bias(Lx *L, const Stack *S, const Positions *P, IrDim I, IrDim J)
{
    IrGraph *g = L->g;
    IrDim sj[4] = {C(1), C(1), C(1), J}, si[4] = {C(1), C(1), I, C(1)};
    IrNode *j = ir_reshape(g, ir_arange(g, C(0), J, IR_F32), 4, sj);
    if (!S->alibi_learned)
        return mul(L, j, P->alibi_past);
    IrDim first = L->cache_k ? ir_dim_sub(ir_dim_addc(J, -S->num_mem_kv), I) : C(0);
    IrNode *d = sub(L, j, ir_reshape(g, ir_arange(g, first, I, IR_F32), 4, si)); /* j - i */
    if (S->causal)
        return mul(L, d, P->alibi_past);
    IrNode *dist = un(L, IR_ABS, d), *zero = cf(L, 0);
    IrNode *past = ir_where(g, ir_binary(g, IR_LE, d, zero), mul(L, dist, P->alibi_past), zero);
    IrNode *future = ir_where(g, ir_binary(g, IR_LE, zero, d), mul(L, dist, P->alibi_future), zero);
    return add(L, past, future);
}

/* Slope h of ALiBi over `heads` heads as x-transformers 0.23.0 computes it (a Python list of
 * doubles, then a float32 tensor): for a power of two n, start * start^h with
 * start = 2^(-2^-(log2 n - 3)); otherwise the slopes of the power of two p below n, then every
 * other slope of 2p. */
static double alibi_slope(int heads, int h)
{
    int p2 = 1;
    while (p2 * 2 <= heads)
        p2 *= 2;
    int n = h < p2 ? p2 : 2 * p2, i = h < p2 ? h : 2 * (h - p2);
    double start = pow(2.0, -pow(2.0, -(log2((double)n) - 3)));
    return (float)(start * pow(start, (double)i));
}

/* [1, heads, 1, 1]: slopes v[0 .. nv) then zeros (the heads ALiBi leaves alone) */
static IrNode *per_head(Lx *L, IrNode *v, int nv, int heads)
{
    if (nv == heads)
        return v;
    IrDim zs[4] = {C(1), C(heads - nv), C(1), C(1)};
    return ir_concat(L->g, v, ir_expand(L->g, cf(L, 0), 4, zs), 1);
}

/* ShiftTokens (section 4): the features split into chunks of dim // len(shifts) (the rest left
 * alone); chunk k moves along the sequence by shifts[k] with zero fill, its masked positions
 * zeroed first (the 'a' and 'c' blocks get the mask, 'f' blocks not; a shift of 0 leaves the
 * chunk as it is). shifts = range(-s, s+1), or range(0, s+1) when causal. */
static IrNode *shift_tokens(Lx *L, const Stack *S, IrNode *x, int s, IrNode *mask)
{
    IrGraph *g = L->g;
    if (!x)
        return NULL;
    int lo = S->causal ? 0 : -s, nseg = s - lo + 1, f = S->dim / nseg;
    IrDim n = seq_of(x);
    IrNode *out = NULL;
    for (int k = 0; k < nseg; k++) {
        IrNode *c = ir_slice(g, x, -1, C((int64_t)k * f), C(f));
        int a = lo + k;
        if (a != 0) {
            if (mask) {
                IrDim ms[3] = {L->B, n, C(1)};
                c = ir_where(g, ir_reshape(g, mask, 3, ms), c, cf(L, 0));
            }
            IrDim zs[3] = {L->B, C(a > 0 ? a : -a), C(f)};
            IrNode *z = ir_expand(g, cf(L, 0), 3, zs);
            c = a > 0 ? ir_slice(g, ir_concat(g, z, c, 1), 1, C(0), n) /* pad a in front, crop the end */
                      : ir_slice(g, ir_concat(g, c, z, 1), 1, C(-a), n);
        }
        out = out ? ir_concat(g, out, c, -1) : c;
    }
    if (nseg * f < S->dim)
        out = ir_concat(g, out, ir_slice(g, x, -1, C((int64_t)nseg * f), C(S->dim - nseg * f)), -1);
    return out;
}

/* Attention block (section 5). x[b, n, dim] is the normed stream; cross = 'c' layer.
 * *prev: in, the previous layer's pre-softmax logits (residual attention) or NULL; out, this
 * layer's. */
static IrNode *attention(Lx *L, const Stack *S, IrNode *x, const char *p, int layer, int cross,
                         const Positions *P, IrNode **prev, IrNode *mem)
{
    IrGraph *g = L->g;
    char name[256];
    int h = S->heads, dh = S->dim_head, inner = h * dh;
    /* step 1: Transformer-XL memory (the un-normed stream of the previous segment) */
    IrNode *kv = cross ? L->context : mem ? ir_concat(g, mem, x, 1) : x;
    if (!kv || !x)
        return NULL;
    IrNode *q_in = x, *k_in = kv;
    if (!cross && S->pia) { /* step 2: sinusoids on the q and k inputs, not v */
        q_in = add(L, x, last_rows(L, P->pia, seq_of(x)));
        k_in = add(L, kv, last_rows(L, P->pia, seq_of(kv)));
    }
    IrNode *q, *k;
    if (S->collab_qk) { /* collab_heads: q and k of width qk shared by the heads, q scaled per head by
                         * its row of collab_mixing; k broadcast over the heads (after step 6) */
        int qk = S->collab_qk;
        snprintf(name, sizeof name, "%s.to_q", p);
        IrNode *qs = lab(L, linear(L, q_in, name, S->dim, qk, 0), "layer%d.attn.q", layer);
        snprintf(name, sizeof name, "%s.to_k", p);
        IrNode *ks = lab(L, linear(L, k_in, name, S->dim, qk, 0), "layer%d.attn.k", layer);
        IrDim ms[2] = {C(h), C(qk)}, m4[4] = {C(1), C(h), C(1), C(qk)};
        IrDim q4[4] = {L->B, C(1), seq_of(qs), C(qk)}, k4[4] = {L->B, C(1), seq_of(ks), C(qk)};
        IrNode *mix = ir_reshape(g, paramv(L, 0, 2, ms, "%s.collab_mixing", p), 4, m4);
        q = qs ? mul(L, ir_reshape(g, qs, 4, q4), mix) : NULL;
        k = ks ? ir_reshape(g, ks, 4, k4) : NULL;
    } else {
        snprintf(name, sizeof name, "%s.to_q", p);
        q = split_heads(L, lab(L, linear(L, q_in, name, S->dim, inner, 0), "layer%d.attn.q", layer), h, dh);
        snprintf(name, sizeof name, "%s.to_k", p);
        k = split_heads(L, lab(L, linear(L, k_in, name, S->dim, inner, 0), "layer%d.attn.k", layer), h, dh);
    }
    snprintf(name, sizeof name, "%s.to_v", p);
    IrNode *v = split_heads(L, lab(L, linear(L, kv, name, S->dim, inner, 0), "layer%d.attn.v", layer), h, dh);

    if (!cross && S->rotary) { /* step 4: q, k AND v */
        q = lab(L, rotary(L, S, q, P), "layer%d.attn.q_rot", layer);
        k = lab(L, rotary(L, S, k, P), "layer%d.attn.k_rot", layer);
        v = lab(L, rotary(L, S, v, P), "layer%d.attn.v_rot", layer);
    }
    if (!q || !k || !v)
        return NULL;
    if (!cross && L->cache_k) { /* decoding: earlier keys/values (rotated) come from the cache */
        /* caches are position-major, [b, c, h, dh]: with one sequence, the new positions go at the
         * end of its memory, which the session then writes in place (rt_session.c appends_to) */
        static const int perm[4] = {0, 2, 1, 3};
        k = L->new_k[L->cur_attn] = ir_concat(g, L->cache_k[L->cur_attn], ir_permute(g, k, perm), 1);
        v = L->new_v[L->cur_attn] = ir_concat(g, L->cache_v[L->cur_attn], ir_permute(g, v, perm), 1);
        k = ir_permute(g, k, perm);
        v = ir_permute(g, v, perm);
        if (!k || !v)
            return NULL;
    }
    IrDim I = q->shape[2], J = k->shape[2];

    /* step 5: key padding, masking queries too */
    IrNode *qmask = L->mask, *kmask = cross ? L->context_mask : L->mask;
    IrNode *input_mask = NULL;
    if (L->mask || (cross && L->context_mask)) {
        IrNode *t = ir_const(g, 1, IR_BOOL);
        IrDim sq[4] = {L->B, C(1), I, C(1)}, sk[4] = {L->B, C(1), C(1), J};
        IrNode *qm = qmask ? ir_reshape(g, qmask, 4, sq) : t;
        IrNode *km = kmask ? ir_reshape(g, kmask, 4, sk) : t;
        IrDim full[4] = {L->B, C(1), I, J};
        input_mask = ir_expand(g, ir_binary(g, IR_AND, qm, km), 4, full);
    }
    /* step 6: memory key/values, broadcast over the batch, not rotated */
    if (S->num_mem_kv) {
        int M = S->num_mem_kv;
        IrDim ms[3] = {C(h), C(M), C(dh)}, bs[4] = {L->B, C(h), C(M), C(dh)};
        IrNode *mk = ir_expand(g, paramv(L, 0, 3, ms, "%s.mem_k", p), 4, bs);
        IrNode *mv = ir_expand(g, paramv(L, 0, 3, ms, "%s.mem_v", p), 4, bs);
        k = ir_concat(g, mk, k, 2);
        v = ir_concat(g, mv, v, 2);
        if (input_mask) {
            IrDim ps[4] = {L->B, C(1), I, C(M)};
            input_mask = ir_concat(g, ir_expand(g, ir_const(g, 1, IR_BOOL), 4, ps), input_mask, 3);
        }
        if (!k)
            return NULL;
        J = k->shape[2];
    }
    if (S->collab_qk) {
        IrDim ks[4] = {L->B, C(h), J, C(S->collab_qk)};
        k = ir_expand(g, k, 4, ks);
    }
    /* steps 7-8: scaled logits, or cosine similarity with a learned temperature */
    IrNode *scale;
    if (S->qk_norm) {
        q = l2norm(L, q);
        k = l2norm(L, k);
        IrDim ss[4] = {C(1), C(h), C(1), C(1)};
        IrNode *s = paramv(L, 0, 4, ss, "%s.scale", p);
        ir_init_const(g, s, S->qk_scale_init);
        scale = ir_unary(g, IR_RECIP, ir_binary(g, IR_MAX, un(L, IR_EXP, s), cf(L, 1e-2)));
    } else {
        scale = cf(L, pow((double)dh, -0.5));
    }
    IrNode *dots = lab(L, mul(L, ir_matmul(g, q, k, 1), scale), "layer%d.attn.dots", layer);
    if (*prev) /* step 9 */
        dots = add(L, dots, *prev);
    *prev = dots; /* pre_softmax_attn */
    if (S->talking_heads) /* step 10 */
        dots = mix_heads(L, dots, p, "pre_softmax_talking_heads", h);
    if (!cross && P->relpos_table) { /* step 11, section 7.3 */
        IrNode *bucket = ir_relpos(g, I, J, S->rel_buckets, S->rel_max_distance, S->causal);
        if (L->cache_k) { /* rows p .. p+n-1 of the full recomputation's [p+n, J] table */
            IrDim full = ir_dim_addc(J, -S->num_mem_kv);
            bucket = ir_slice(g, ir_relpos(g, full, J, S->rel_buckets, S->rel_max_distance, S->causal),
                              0, ir_dim_sub(full, I), I);
        }
        static const int perm[3] = {2, 0, 1};
        IrNode *b = ir_permute(g, ir_gather(g, P->relpos_table, bucket), perm);
        dots = add(L, dots, lab(L, mul(L, b, cf(L, sqrt((double)dh))), "layer%d.attn.rel_pos", layer));
    }
    if (!cross && P->alibi_past) /* step 11, section 7.4 */
        dots = add(L, dots, lab(L, alibi_bias(L, S, P, I, J), "layer%d.attn.alibi", layer));
    /* step 12: -FLT_MAX fill (not -inf), so fully masked rows attend uniformly */
    IrNode *neg = cf(L, -FLT_MAX);
    if (S->max_attend_past) {
        /* keys further back than the window: query i sits at position i + (J - I) of all J keys
         * (memory key/values and XL memories included, as in 0.23.0), and key j stays while
         * (i + J - I) - j <= w, i.e. i + J - I < j + w + 1. Every attention, cross too. One
         * mask with the padding's (the fills are the same value), which the attention fusion
         * takes as its mask operand. */
        IrDim si[2] = {I, C(1)}, sj[2] = {C(1), J};
        IrNode *qi = ir_reshape(g, ir_arange(g, ir_dim_sub(J, I), I, IR_I64), 2, si);
        IrNode *kw = ir_reshape(g, ir_arange(g, C(S->max_attend_past + 1), J, IR_I64), 2, sj);
        IrNode *keep = lab(L, ir_binary(g, IR_LT, qi, kw), "attn_window");
        input_mask = input_mask ? ir_binary(g, IR_AND, input_mask, keep) : keep;
    }
    if (input_mask)
        dots = ir_where(g, input_mask, dots, neg);
    if (!cross && S->causal) { /* j > i + (J - I) */
        IrDim si[2] = {I, C(1)}, sj[2] = {C(1), J};
        IrNode *qi = ir_reshape(g, ir_arange(g, ir_dim_sub(J, I), I, IR_I64), 2, si);
        IrNode *kj = ir_reshape(g, ir_arange(g, C(0), J, IR_I64), 2, sj);
        dots = ir_where(g, lab(L, ir_binary(g, IR_LT, qi, kj), "causal_mask"), neg, dots);
    }
    if (S->sparse_topk) { /* step 13: below the row's k-th largest (ties kept); k >= J changes nothing */
        IrNode *kth = lab(L, ir_kth_largest(g, dots, S->sparse_topk), "layer%d.attn.topk", layer);
        dots = ir_where(g, ir_binary(g, IR_LT, dots, kth), neg, dots);
    }
    /* step 14: softmax, or entmax15 (section 10) */
    IrNode *attn = lab(L, S->entmax15 ? ir_entmax15(g, dots) : ir_softmax(g, dots), "layer%d.attn.weights", layer);
    attn = dropout(L, attn, S->attn_dropout); /* step 15: dropout, then the post-softmax mix */
    if (S->talking_heads)
        attn = mix_heads(L, attn, p, "post_softmax_talking_heads", h);
    IrNode *out = ir_matmul(g, attn, v, 0); /* step 16 */
    if (S->head_scale) {
        IrDim ss[4] = {C(1), C(h), C(1), C(1)};
        out = mul(L, out, paramv(L, 0, 4, ss, "%s.head_scale_params", p));
    }
    out = merge_heads(L, out, h, dh);
    if (S->gate_values) { /* step 17 */
        snprintf(name, sizeof name, "%s.to_v_gate", p);
        out = mul(L, out, un(L, IR_SIGMOID, linear(L, x, name, S->dim, inner, 1)));
    }
    if (S->on_attn) { /* step 18: Linear(inner, 2 dim) + GLU: a * sigmoid(gate) */
        snprintf(name, sizeof name, "%s.to_out.0", p);
        IrNode *y = linear(L, out, name, inner, 2 * S->dim, 1);
        IrNode *a = ir_slice(g, y, -1, C(0), C(S->dim));
        IrNode *gt = ir_slice(g, y, -1, C(S->dim), C(S->dim));
        out = mul(L, a, un(L, IR_SIGMOID, gt));
    } else {
        snprintf(name, sizeof name, "%s.to_out", p);
        out = linear(L, out, name, inner, S->dim, 1);
        if (S->attn_zero_init) /* zero_init_output: init_zero_(to_out) */
            zero_init_linear(L, name);
    }
    return lab(L, out, "layer%d.attn.out", layer);
}

static IrNode *ff_act(Lx *L, const Stack *S, IrNode *x)
{
    if (S->ff_relu_squared) {
        IrNode *r = un(L, IR_RELU, x);
        return mul(L, r, r);
    }
    return un(L, IR_GELU, x);
}

/* FeedForward (section 6) */
static IrNode *feed_forward(Lx *L, const Stack *S, IrNode *x, const char *p, int layer)
{
    IrGraph *g = L->g;
    char name[256];
    int inner = (int)(S->dim * S->ff_mult);
    IrNode *hdn;
    if (S->ff_glu) { /* val, gate = proj(x).chunk(2); val * act(gate): the second half gates */
        snprintf(name, sizeof name, "%s.net.0.proj", p);
        IrNode *pr = lab(L, linear(L, x, name, S->dim, 2 * inner, 1), "layer%d.ff.proj", layer);
        IrNode *val = ir_slice(g, pr, -1, C(0), C(inner));
        IrNode *gate = ir_slice(g, pr, -1, C(inner), C(inner));
        hdn = mul(L, val, ff_act(L, S, gate));
    } else {
        snprintf(name, sizeof name, "%s.net.0.0", p);
        IrNode *pr = lab(L, linear(L, x, name, S->dim, inner, 1), "layer%d.ff.proj", layer);
        hdn = ff_act(L, S, pr);
    }
    lab(L, hdn, "layer%d.ff.act", layer);
    if (S->ff_post_act_ln) {
        snprintf(name, sizeof name, "%s.net.1", p);
        hdn = layer_norm(L, hdn, name, inner);
    }
    hdn = dropout(L, hdn, S->ff_dropout); /* net.2 */
    snprintf(name, sizeof name, "%s.net.3", p);
    IrNode *y = linear(L, hdn, name, inner, S->dim, 1);
    if (S->ff_zero_init) /* zero_init_output: init_zero_(net[-1]) */
        zero_init_linear(L, name);
    return lab(L, y, "layer%d.ff.out", layer);
}

/* GRUCell(input = out, hidden = residual), row blocks r, z, n (section 4) */
static IrNode *gru_gate(Lx *L, const Stack *S, IrNode *out, IrNode *res, const char *p)
{
    IrGraph *g = L->g;
    int d = S->dim;
    IrDim ws[2] = {C(3 * d), C(d)};
    IrNode *w_ih = paramv(L, 0, 2, ws, "%s.gru.weight_ih", p); /* state_dict order */
    IrNode *w_hh = paramv(L, 0, 2, ws, "%s.gru.weight_hh", p);
    IrNode *b_ih = param1(L, 3 * d, p, "gru.bias_ih");
    IrNode *b_hh = param1(L, 3 * d, p, "gru.bias_hh");
    IrNode *gi = add(L, ir_matmul(g, out, w_ih, 1), b_ih);
    IrNode *gh = add(L, ir_matmul(g, res, w_hh, 1), b_hh);
    IrNode *r = un(L, IR_SIGMOID, add(L, ir_slice(g, gi, -1, C(0), C(d)), ir_slice(g, gh, -1, C(0), C(d))));
    IrNode *z = un(L, IR_SIGMOID, add(L, ir_slice(g, gi, -1, C(d), C(d)), ir_slice(g, gh, -1, C(d), C(d))));
    IrNode *c = un(L, IR_TANH, add(L, ir_slice(g, gi, -1, C(2 * d), C(d)), mul(L, r, ir_slice(g, gh, -1, C(2 * d), C(d)))));
    /* (1 - z) * c + z * res = c + z * (res - c) */
    return add(L, c, mul(L, z, sub(L, res, c)));
}

static int stack_error(Lx *L, const XtfValue *call, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xtf_diag_error(L->d, L->f, call->loc, "%s", msg);
    return -1;
}

static int read_stack(Lx *L, const XtfValue *call, Stack *S)
{
    memset(S, 0, sizeof *S);
    S->call = call;
    int is_cross_attender = strcmp(call->s, "CrossAttender") == 0;
    /* a CrossAttender may be causal: it matters to its self-attention layers (custom_layers),
     * token shifting and the ALiBi class, as in 0.23.0 */
    S->causal = strcmp(call->s, "Decoder") == 0 || (is_cross_attender && xtf_bool(call, "causal"));
    S->cross_attend = xtf_bool(call, "cross_attend") || is_cross_attender;
    S->only_cross = xtf_bool(call, "only_cross") || is_cross_attender;
    S->dim = (int)xtf_int(call, "dim");
    S->depth = (int)xtf_int(call, "depth");
    S->heads = (int)xtf_int(call, "heads");
    S->dim_head = (int)xtf_int(call, "attn_dim_head");
    S->norm = xtf_bool(call, "use_rmsnorm") ? NORM_RMS : xtf_bool(call, "use_scalenorm") ? NORM_SCALE : NORM_LAYER;
    S->pre_norm = xtf_bool(call, "pre_norm");
    S->sandwich_norm = xtf_bool(call, "sandwich_norm");
    S->rezero = xtf_bool(call, "use_rezero");
    S->macaron = xtf_bool(call, "macaron");
    S->scale_residual = xtf_bool(call, "scale_residual");
    S->gate_residual = xtf_bool(call, "gate_residual");
    S->residual_attn = xtf_bool(call, "residual_attn");
    S->cross_residual_attn = xtf_bool(call, "cross_residual_attn");
    S->rotary = xtf_bool(call, "rotary_pos_emb");
    if (S->rotary) {
        const XtfValue *rd = xtf_arg(call, "rotary_emb_dim");
        int r = rd && rd->kind == XV_INT ? (int)rd->i : S->dim_head / 2;
        S->rotary_dim = r < 32 ? 32 : r; /* section 7.2: silently raised to 32 */
        if (S->rotary_dim > S->dim_head || S->rotary_dim % 2)
            return stack_error(L, call, "rotary dimension %d must be even and at most attn_dim_head (%d)",
                               S->rotary_dim, S->dim_head);
    }
    S->rel_pos = xtf_bool(call, "rel_pos_bias");
    S->rel_buckets = (int)xtf_int(call, "rel_pos_num_buckets");
    S->rel_max_distance = (int)xtf_int(call, "rel_pos_max_distance");
    S->pia = xtf_bool(call, "position_infused_attn");
    if (S->pia && S->dim % 2)
        return stack_error(L, call, "position_infused_attn needs an even dim, got %d", S->dim);
    S->use_qk_norm_attn = xtf_bool(call, "use_qk_norm_attn");
    S->qk_norm = xtf_bool(call, "attn_qk_norm") || S->use_qk_norm_attn;
    /* 0.23.0: use_qk_norm_attn replaces scale_init_value by -log(log2(L^2 - L)) for
     * qk_norm_attn_seq_len L, or None; None means -3 */
    const XtfValue *sv = xtf_value(call, S->use_qk_norm_attn ? "qk_norm_attn_seq_len" : "attn_scale_init_value");
    int have = sv && (sv->kind == XV_INT || sv->kind == XV_FLOAT);
    double qv = have ? xtf_float(call, S->use_qk_norm_attn ? "qk_norm_attn_seq_len" : "attn_scale_init_value") : 0;
    S->qk_scale_init = !have ? -3.0 : S->use_qk_norm_attn ? -log(log2(qv * qv - qv)) : qv;
    int branch_zero = xtf_bool(call, "zero_init_branch_output");
    S->attn_zero_init = branch_zero || xtf_bool(call, "attn_zero_init_output");
    S->ff_zero_init = branch_zero || xtf_bool(call, "ff_zero_init_output");
    S->talking_heads = xtf_bool(call, "attn_talking_heads");
    S->on_attn = xtf_bool(call, "attn_on_attn");
    if (xtf_bool(call, "attn_collab_heads")) {
        /* 0.23.0: int(collab_compression * heads * dim_head) */
        S->collab_qk = (int)(xtf_float(call, "attn_collab_compression") * (double)(S->heads * S->dim_head));
        if (S->collab_qk < 1)
            return stack_error(L, call, "attn_collab_compression leaves q and k no width (%g x %d heads x %d)",
                               xtf_float(call, "attn_collab_compression"), S->heads, S->dim_head);
        if (xtf_int(call, "attn_num_mem_kv") > 0)
            return stack_error(L, call, "attn_collab_heads together with attn_num_mem_kv is not supported "
                                        "(x-transformers 0.23.0 crashes on it: one k for all heads, memory keys per head)");
        if (S->rotary && S->rotary_dim > S->collab_qk)
            return stack_error(L, call, "attn_collab_heads leaves q and k %d wide, less than the rotary dimension %d "
                                        "(x-transformers 0.23.0 crashes on it)", S->collab_qk, S->rotary_dim);
    }
    if (S->on_attn && S->attn_zero_init)
        return stack_error(L, call, "attn_on_attn together with zero_init_output (or zero_init_branch_output) "
                                    "is not supported (x-transformers 0.23.0 crashes on it: init_zero_ of a Sequential)");
    S->gate_values = xtf_bool(call, "attn_gate_values");
    S->head_scale = xtf_bool(call, "attn_head_scale");
    S->num_mem_kv = (int)xtf_int(call, "attn_num_mem_kv");
    S->alibi = xtf_bool(call, "alibi_pos_bias");
    const XtfValue *ah = xtf_arg(call, "alibi_num_heads");
    S->alibi_heads = ah && ah->kind == XV_INT ? (int)ah->i : S->heads;
    S->alibi_learned = xtf_bool(call, "alibi_learned") || !S->causal; /* 0.23.0's class choice */
    if (S->alibi && S->rel_pos)
        return stack_error(L, call, "alibi_pos_bias and rel_pos_bias exclude each other (x-transformers "
                                    "0.23.0 asserts it)");
    if (S->alibi && S->alibi_heads > S->heads)
        return stack_error(L, call, "alibi_num_heads (%d) must be at most heads (%d)", S->alibi_heads, S->heads);
    const XtfValue *topk = xtf_arg(call, "attn_sparse_topk");
    S->sparse_topk = topk && topk->kind == XV_INT ? (int)topk->i : 0;
    const XtfValue *past = xtf_arg(call, "attn_max_attend_past");
    S->max_attend_past = past && past->kind == XV_INT ? (int)past->i : 0;
    S->entmax15 = xtf_bool(call, "attn_use_entmax15");
    S->ff_glu = xtf_bool(call, "ff_glu");
    S->ff_relu_squared = xtf_bool(call, "ff_relu_squared");
    S->ff_post_act_ln = xtf_bool(call, "ff_post_act_ln");
    S->ff_mult = xtf_float(call, "ff_mult");
    S->attn_dropout = xtf_float(call, "attn_dropout");
    S->ff_dropout = xtf_float(call, "ff_dropout");
    if (!(S->dim * S->ff_mult >= 1)) /* int(dim * ff_mult) < 1 */
        return stack_error(L, call, "ff_mult %g gives an empty feed-forward layer", S->ff_mult);
    /* sizes derived from two options must fit too (options.h: XTF_MAX_SIZE) */
    if (S->dim * S->ff_mult > XTF_MAX_SIZE || (int64_t)S->heads * S->dim_head > XTF_MAX_SIZE)
        return stack_error(L, call, "the layers are too wide: dim * ff_mult and heads * attn_dim_head "
                                    "must be at most %d", XTF_MAX_SIZE);

    /* the layer list (section 4) */
    const char *block = S->only_cross ? "cf" : S->cross_attend ? "acf" : "af";
    char blk[8];
    snprintf(blk, sizeof blk, "%s%s", S->macaron ? "f" : "", block);
    int k = (int)xtf_int(call, "sandwich_coef");
    int par = (int)xtf_int(call, "par_ratio");
    const XtfValue *custom = xtf_arg(call, "custom_layers");
    while (custom && custom->kind == XV_REF)
        custom = custom->ref;
    S->ntypes = 0;
    if (custom && custom->kind == XV_TUPLE) { /* custom_layers: the list as written */
        if (custom->nitems < 1 || custom->nitems >= MAX_LAYERS)
            return stack_error(L, call, "custom_layers needs 1 to %d layers, got %d", MAX_LAYERS - 1,
                               custom->nitems);
        for (int i = 0; i < custom->nitems; i++) {
            const XtfValue *it = custom->items[i];
            if (it->kind != XV_STRING || strlen(it->s) != 1 || !strchr("acf", it->s[0]))
                return stack_error(L, call, "custom_layers items are 'a', 'c' or 'f'");
            if (it->s[0] == 'c' && !S->cross_attend && !S->only_cross)
                return stack_error(L, call, "custom_layers has a 'c' layer: set cross_attend = true "
                                            "so the model takes a context");
            S->types[S->ntypes++] = it->s[0];
        }
    } else if (par > 0) { /* par_ratio: the PAR layout (x-transformers 0.23.0) */
        int par_depth = S->depth * (int)strlen(blk);
        if (!(1 < par && par <= par_depth))
            return stack_error(L, call, "par_ratio must be in (1, %d], got %d", par_depth, par);
        char nf[8];
        int nn = 0;
        for (const char *c = blk; *c; c++)
            if (*c != 'f')
                nf[nn++] = *c;
        nf[nn] = 0;
        int par_attn = par_depth / par;
        int depth_cut = par_depth * 2 / 3;
        int par_width = (depth_cut + depth_cut / par_attn) / par_attn;
        if (nn > par_width)
            return stack_error(L, call, "the default block is too large for par_ratio %d", par);
        if (par_depth >= MAX_LAYERS)
            return stack_error(L, call, "too many layers (%d, at most %d)", par_depth, MAX_LAYERS - 1);
        for (int r = 0; r < par_attn; r++)
            for (int w = 0; w < par_width; w++)
                S->types[S->ntypes++] = w < nn ? nf[w] : 'f';
        while (S->ntypes < par_depth)
            S->types[S->ntypes++] = 'f';
    } else {
        if (k < 0 || k > S->depth)
            return stack_error(L, call, "sandwich_coef must be between 1 and depth (%d), got %d", S->depth, k);
        size_t need = (size_t)S->depth * strlen(blk) + 2u * (size_t)k;
        if (need >= MAX_LAYERS)
            return stack_error(L, call, "too many layers (%zu, at most %d)", need, MAX_LAYERS - 1);
        for (int i = 0; i < k; i++)
            S->types[S->ntypes++] = 'a';
        for (int i = 0; i < S->depth - k; i++)
            for (const char *c = blk; *c; c++)
                S->types[S->ntypes++] = *c;
        for (int i = 0; i < k; i++)
            S->types[S->ntypes++] = 'f';
    }

    /* shift_tokens: one amount for every layer, or a tuple with one per layer (x-transformers
     * zips it with the layer list, so a shorter tuple would build fewer layers) */
    const XtfValue *st = xtf_arg(call, "shift_tokens");
    while (st && st->kind == XV_REF)
        st = st->ref;
    if (st && st->kind == XV_TUPLE && st->nitems != S->ntypes)
        return stack_error(L, call, "shift_tokens has %d values for %d layers (%s): give one per layer, or one "
                                    "integer for all", st->nitems, S->ntypes, S->types);
    for (int i = 0; i < S->ntypes; i++) {
        const XtfValue *v = st && st->kind == XV_TUPLE ? st->items[i] : st;
        while (v && v->kind == XV_REF)
            v = v->ref;
        S->shift[i] = v && v->kind == XV_INT && v->i > 0 ? (int)v->i : 0;
        int segments = S->causal ? S->shift[i] + 1 : 2 * S->shift[i] + 1;
        if (S->shift[i] > 0 && segments > S->dim)
            return stack_error(L, call, "shift_tokens %d splits dim %d into %d chunks: at most dim", S->shift[i],
                               S->dim, segments);
    }
    return 0;
}

/* The attn_layers of a wrapper call, read into *S: 0, or -1 with the error reported. */
static int wrapper_stack(Lx *L, const XtfValue *call, Stack *S)
{
    const XtfValue *layers = xtf_callv(call, "attn_layers");
    if (!layers)
        return stack_error(L, call, "%s needs attn_layers", call->s);
    return read_stack(L, layers, S) < 0 ? -1 : 0;
}

/* AttentionLayers forward (section 4) on x[b, n, dim]. hiddens/nh collect each 'a' layer's
 * input (Transformer-XL memories) when non-NULL. */
static IrNode *attention_layers(Lx *L, const Stack *S, IrNode *x)
{
    IrGraph *g = L->g;
    char p[160], np[200];
    Positions P = {0};
    IrDim n = seq_of(x); /* positions cover memory (or cache) + sequence */
    if (L->mems_in && L->mems_in[0])
        n = ir_dim_add(n, seq_of(L->mems_in[0]));
    n = ir_dim_add(n, L->pos_offset);

    if (S->rel_pos) {
        IrDim ts[2] = {C(S->rel_buckets), C(S->heads)};
        P.relpos_table = paramv(L, 0, 2, ts, "attn_layers.rel_pos.relative_attention_bias.weight");
    }
    if (S->alibi && S->alibi_learned) {
        /* exp of the learned log-slopes (and the future ones). 0.23.0 makes both parameters of one
         * tensor, so they share storage: its state dicts hold equal values (load_state_dict leaves
         * both with the second's), while each gets its own gradient, as here */
        IrDim ls[4] = {C(1), C(S->alibi_heads), C(1), C(1)};
        IrNode *past = paramv(L, 0, 4, ls, "attn_layers.rel_pos.learned_logslopes");
        P.alibi_past = per_head(L, un(L, IR_EXP, past), S->alibi_heads, S->heads);
        if (!S->causal) {
            IrNode *future = paramv(L, 0, 4, ls, "attn_layers.rel_pos.learned_logslopes_future");
            P.alibi_future = per_head(L, un(L, IR_EXP, future), S->alibi_heads, S->heads);
        }
    } else if (S->alibi) { /* fixed slopes: constants (non-persistent buffers, not in the weights) */
        IrDim one[4] = {C(1), C(1), C(1), C(1)};
        IrNode *v = NULL;
        for (int h = 0; h < S->alibi_heads; h++) {
            IrNode *c = ir_expand(g, cf(L, alibi_slope(S->alibi_heads, h)), 4, one);
            v = v ? ir_concat(g, v, c, 1) : c;
        }
        P.alibi_past = per_head(L, v, S->alibi_heads, S->heads);
    }
    if (S->rotary) { /* theta[p] = p * inv_freq, freqs = cat(theta, theta) */
        IrDim fs[1] = {C(S->rotary_dim / 2)};
        IrNode *inv = paramv(L, 1, 1, fs, "attn_layers.rotary_pos_emb.inv_freq");
        IrDim sp[2] = {n, C(1)}, sf[2] = {C(1), C(S->rotary_dim / 2)};
        IrNode *pos = ir_reshape(g, ir_arange(g, C(0), n, IR_F32), 2, sp);
        IrNode *theta = mul(L, pos, ir_reshape(g, inv, 2, sf));
        IrNode *freqs = lab(L, ir_concat(g, theta, theta, -1), "rotary.freqs");
        P.rot_cos = lab(L, un(L, IR_COS, freqs), "rotary.cos");
        P.rot_sin = lab(L, un(L, IR_SIN, freqs), "rotary.sin");
    }
    if (S->pia) { /* S(p) = cat(sin(p * inv_freq), cos(p * inv_freq)) */
        IrDim fs[1] = {C(S->dim / 2)};
        IrNode *inv = paramv(L, 1, 1, fs, "attn_layers.pia_pos_emb.inv_freq");
        IrDim sp[2] = {n, C(1)}, sf[2] = {C(1), C(S->dim / 2)};
        IrNode *pos = ir_reshape(g, ir_arange(g, C(0), n, IR_F32), 2, sp);
        IrNode *ang = mul(L, pos, ir_reshape(g, inv, 2, sf));
        P.pia = lab(L, ir_concat(g, un(L, IR_SIN, ang), un(L, IR_COS, ang), -1), "pia.sinusoids");
    }

    IrNode *prev_attn = NULL, *prev_cross = NULL;
    int nattn = 0;
    for (int i = 0; i < S->ntypes; i++) {
        char t = S->types[i];
        int is_attn = t == 'a' || t == 'c';
        int qk_layer = S->use_qk_norm_attn && is_attn;
        snprintf(p, sizeof p, "attn_layers.layers.%d", i);
        IrNode *residual = x;
        if (S->pre_norm && !qk_layer) {
            snprintf(np, sizeof np, "%s.0.0", p);
            x = lab(L, block_norm(L, S, x, np), "layer%d.norm", i);
        }
        if (S->shift[i] > 0) /* ShiftTokens wraps the block: only 'a' and 'c' blocks see the mask */
            x = lab(L, shift_tokens(L, S, x, S->shift[i], t == 'f' ? NULL : L->mask), "layer%d.shifted", i);
        /* the block's keys: .1.*, under .fn. for each wrapper (Rezero, ShiftTokens, macaron's Scale) */
        snprintf(np, sizeof np, "%s.1%s%s%s", p, S->rezero ? ".fn" : "", S->shift[i] > 0 ? ".fn" : "",
                 t == 'f' && S->macaron ? ".fn" : "");
        IrNode *out;
        if (t == 'a') {
            IrNode *prev = S->residual_attn ? prev_attn : NULL;
            IrNode *mem = NULL;
            if (L->mems_in) { /* XL: this layer's memory in, its input (pre-norm) out */
                mem = L->mems_in[nattn];
                L->hiddens[nattn] = residual;
            }
            L->cur_attn = nattn++;
            out = attention(L, S, x, np, i, 0, &P, &prev, mem);
            if (S->residual_attn)
                prev_attn = prev;
        } else if (t == 'c') {
            IrNode *prev = S->cross_residual_attn ? prev_cross : NULL;
            out = attention(L, S, x, np, i, 1, &P, &prev, NULL);
            if (S->cross_residual_attn)
                prev_cross = prev;
        } else {
            out = feed_forward(L, S, x, np, i);
            if (S->macaron)
                out = mul(L, out, cf(L, 0.5));
        }
        if (S->rezero) {
            snprintf(np, sizeof np, "%s.1", p);
            out = mul(L, out, param1(L, 1, np, "g"));
        }
        if (S->sandwich_norm || qk_layer) {
            snprintf(np, sizeof np, "%s.0.1", p);
            out = block_norm(L, S, out, np);
        }
        snprintf(np, sizeof np, "%s.2", p);
        if (S->scale_residual)
            residual = mul(L, residual, param1(L, S->dim, np, "residual_scale"));
        if (S->gate_residual)
            x = gru_gate(L, S, out, residual, np);
        else
            x = add(L, out, residual);
        lab(L, x, "layer%d.residual", i);
        if (!S->pre_norm && i != S->ntypes - 1) {
            snprintf(np, sizeof np, "%s.0.2", p);
            x = lab(L, block_norm(L, S, x, np), "layer%d.post_norm", i);
        }
    }
    return x;
}

static int add_sym(Lx *L, const char *name, int64_t max, IrDim *out)
{
    int s = ir_graph_add_sym(L->g, name, max);
    if (s < 0)
        return -1;
    *out = ir_dim_sym(s);
    return 0;
}

/* TransformerWrapper forward (section 3) on tokens[b, n]; returns the final-normed hidden
 * states [b, n, dim] in *hidden and the logits. */
static IrNode *transformer_wrapper(Lx *L, const XtfValue *call, IrNode *tokens, IrNode **hidden)
{
    IrGraph *g = L->g;
    Stack S;
    if (wrapper_stack(L, call, &S) < 0)
        return NULL;
    int V = (int)xtf_int(call, "num_tokens");
    int maxlen = (int)xtf_int(call, "max_seq_len");
    const XtfValue *ed = xtf_arg(call, "emb_dim");
    int emb_dim = ed && ed->kind == XV_INT ? (int)ed->i : S.dim;
    int M = (int)xtf_int(call, "num_memory_tokens");
    if (xtf_bool(call, "tie_embedding") && emb_dim != S.dim) {
        stack_error(L, call, "tie_embedding needs emb_dim (%d) equal to dim (%d)", emb_dim, S.dim);
        return NULL;
    }
    IrDim es[2] = {C(V), C(emb_dim)};
    IrNode *emb_w;
    if (L->tied_emb) { /* one module under two state_dict names */
        char alias[300];
        snprintf(alias, sizeof alias, "%stoken_emb.weight", L->root);
        emb_w = L->tied_emb;
        if (emb_w && !(ir_dim_eq(emb_w->shape[0], C(V)) && ir_dim_eq(emb_w->shape[1], C(emb_dim)))) {
            stack_error(L, call, "tie_token_emb needs equal enc_num_tokens and dec_num_tokens");
            return NULL;
        }
        ir_alias(g, alias, emb_w);
    } else {
        emb_w = paramv(L, 0, 2, es, "token_emb.weight");
    }
    IrNode *x = lab(L, ir_gather(g, emb_w, tokens), "token_emb");
    if (xtf_bool(call, "use_pos_emb") && !(S.rotary || S.rel_pos || S.pia)) {
        IrDim ps[2] = {C(maxlen), C(emb_dim)};
        IrNode *pos = ir_slice(g, paramv(L, 0, 2, ps, "pos_emb.emb.weight"), 0, L->pos_offset, seq_of(tokens));
        x = lab(L, add(L, x, mul(L, pos, cf(L, pow((double)emb_dim, -0.5)))), "embed");
    }
    x = dropout(L, x, xtf_float(call, "emb_dropout"));
    if (emb_dim != S.dim)
        x = linear(L, x, "project_emb", emb_dim, S.dim, 1);
    IrNode *saved_mask = L->mask;
    if (M > 0) { /* memory tokens, prepended; the mask is padded with true */
        IrDim ms[2] = {C(M), C(S.dim)}, bs[3] = {L->B, C(M), C(S.dim)};
        x = ir_concat(g, ir_expand(g, paramv(L, 0, 2, ms, "memory_tokens"), 3, bs), x, 1);
        if (L->mask) {
            IrDim pm[2] = {L->B, C(M)};
            L->mask = ir_concat(g, ir_expand(g, ir_const(g, 1, IR_BOOL), 2, pm), L->mask, 1);
        }
    }
    x = attention_layers(L, &S, x);
    L->mask = saved_mask;
    x = lab(L, layer_norm(L, x, "norm", S.dim), "final_norm");
    if (M > 0)
        x = ir_slice(g, x, 1, C(M), seq_of(tokens));
    *hidden = x;
    if (xtf_bool(call, "tie_embedding"))
        return ir_matmul(g, x, emb_w, 1);
    return linear(L, x, "to_logits", S.dim, V, 1);
}

static int lower_transformer_wrapper(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    const XtfValue *layers = xtf_callv(call, "attn_layers");
    IrDim n;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "n", xtf_int(call, "max_seq_len"), &n) < 0)
        return -1;
    IrDim bn[2] = {L->B, n};
    IrNode *tokens = ir_input(g, "tokens", IR_I64, 2, bn);
    if (L->opt && L->opt->mask)
        L->mask = ir_input(g, "mask", IR_BOOL, 2, bn);
    if (layers && (xtf_bool(layers, "cross_attend") || strcmp(layers->s, "CrossAttender") == 0)) {
        IrDim m;
        if (add_sym(L, "m", 0, &m) < 0)
            return -1;
        IrDim cs[3] = {L->B, m, C(xtf_int(layers, "dim"))}, cm[2] = {L->B, m};
        L->context = ir_input(g, "context", IR_F32, 3, cs);
        if (L->opt && L->opt->context_mask)
            L->context_mask = ir_input(g, "context_mask", IR_BOOL, 2, cm);
    }
    IrNode *targets = L->opt && L->opt->train ? ir_input(g, "targets", IR_I64, 2, bn) : NULL;

    /* Transformer-XL (section 10): mems.<l> in and out, one per self-attention layer */
    int K = (int)xtf_int(call, "max_mem_len"), nmem = 0;
    IrNode **mems_in = L->store[0], **hiddens = L->store[1];
    if (K > 0) {
        Stack S;
        if (!layers || read_stack(L, layers, &S) < 0)
            return -1;
        if (L->mask)
            return stack_error(L, call, "a padding mask together with max_mem_len is not supported "
                                        "(x-transformers 0.23.0 crashes on it)");
        if (xtf_int(call, "num_memory_tokens") > 0)
            return stack_error(L, call, "num_memory_tokens together with max_mem_len is not supported yet");
        IrDim pm;
        if (add_sym(L, "p", K, &pm) < 0)
            return -1;
        /* the memories out keep q = min(n+p, max_mem_len) rows: all of them while the recurrence
         * is younger than max_mem_len (a first segment shorter than it, say) */
        if (ir_graph_add_derived_sym(g, "q", ir_dim_add(n, pm), K) < 0)
            return -1;
        IrDim ms[3] = {L->B, pm, C(S.dim)};
        char name[32];
        for (int i = 0; i < S.ntypes; i++)
            if (S.types[i] == 'a') {
                snprintf(name, sizeof name, "mems.%d", nmem);
                hiddens[nmem] = NULL;
                mems_in[nmem++] = ir_input(g, name, IR_F32, 3, ms);
            }
        /* shift_mem_down = s: layer l reads (and extends) the memories given as mems.<l + s>,
         * the list rotated as 0.23.0 does with mems[s:] + mems[:s] (so s >= the number of
         * memories leaves it as it is) */
        int s = (int)xtf_int(call, "shift_mem_down");
        if (s > 0 && s < nmem) {
            IrNode *given[MAX_LAYERS];
            memcpy(given, mems_in, sizeof *given * (size_t)nmem);
            for (int l = 0; l < nmem; l++)
                mems_in[l] = given[(l + s) % nmem];
        }
        L->mems_in = mems_in;
        L->hiddens = hiddens;
    }
    /* KV cache for incremental decoding: cache.<l>.k / .v in and out per self-attention layer */
    int ncache = 0;
    IrNode **ck = L->store[2], **cv = L->store[3], **nk = L->store[4], **nv = L->store[5];
    if (L->opt->kv_cache) {
        Stack S;
        if (!layers || read_stack(L, layers, &S) < 0)
            return -1;
        if (!S.causal || strcmp(layers->s, "Decoder") != 0)
            return stack_error(L, layers, "a KV cache needs a causal Decoder");
        if (S.collab_qk)
            return stack_error(L, layers, "a KV cache together with attn_collab_heads is not supported yet");
        if (L->mask || K > 0 || xtf_int(call, "num_memory_tokens") > 0)
            return stack_error(L, call, "a KV cache together with a mask, max_mem_len or "
                                        "num_memory_tokens is not supported yet");
        IrDim c;
        if (add_sym(L, "c", xtf_int(call, "max_seq_len"), &c) < 0)
            return -1;
        /* the call's positions follow the cache's: all of them within the position table */
        if (ir_graph_add_limit(g, ir_dim_add(c, n), xtf_int(call, "max_seq_len")) < 0)
            return -1;
        IrDim cs[4] = {L->B, c, C(S.heads), C(S.dim_head)};
        char name[48];
        for (int i = 0; i < S.ntypes; i++)
            if (S.types[i] == 'a') {
                snprintf(name, sizeof name, "cache.%d.k", ncache);
                ck[ncache] = ir_input(g, name, IR_F32, 4, cs);
                snprintf(name, sizeof name, "cache.%d.v", ncache);
                cv[ncache] = ir_input(g, name, IR_F32, 4, cs);
                nk[ncache] = nv[ncache] = NULL;
                ncache++;
            }
        L->cache_k = ck;
        L->cache_v = cv;
        L->new_k = nk;
        L->new_v = nv;
        L->pos_offset = c;
    }
    IrNode *hidden = NULL;
    IrNode *logits = transformer_wrapper(L, call, tokens, &hidden);
    if (!logits)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "logits", lab(L, logits, "logits"));
    for (int l = 0; l < ncache; l++) {
        char name[48];
        snprintf(name, sizeof name, "cache.%d.k", l);
        ir_output(g, name, nk[l]);
        snprintf(name, sizeof name, "cache.%d.v", l);
        ir_output(g, name, nv[l]);
    }
    L->cache_k = L->cache_v = L->new_k = L->new_v = NULL;
    L->pos_offset = C(0);
    for (int l = 0; l < nmem; l++) { /* cat(mems, hiddens)[:, -max_mem_len:], detached */
        char name[32];
        snprintf(name, sizeof name, "mems.%d", l);
        IrNode *all = ir_concat(g, mems_in[l], hiddens[l], 1); /* [b, p+n, dim] */
        if (!all)
            break;
        IrDim q = ir_dim_sym(ir_graph_find_sym(g, "q"));
        ir_output(g, name, ir_slice(g, all, 1, ir_dim_sub(seq_of(all), q), q));
    }
    L->mems_in = L->hiddens = NULL;
    if (L->opt && L->opt->embeddings)
        ir_output(g, "embeddings", hidden);
    if (targets)
        ir_output(g, "loss", lab(L, ir_xent(g, logits, targets), "loss"));
    return 0;
}

/* ContinuousTransformerWrapper body (section 10) on x[b, n, dim_in]: returns the output
 * [b, n, dim_out] and, in *emb, the final-normed embeddings [b, n, dim]. */
static IrNode *continuous_forward(Lx *L, const XtfValue *call, IrNode *x, IrNode **emb)
{
    IrGraph *g = L->g;
    Stack S;
    if (wrapper_stack(L, call, &S) < 0)
        return NULL;
    int maxlen = (int)xtf_int(call, "max_seq_len");
    const XtfValue *di = xtf_arg(call, "dim_in"), *dout = xtf_arg(call, "dim_out");
    if (di && di->kind == XV_INT)
        x = linear(L, x, "project_in", (int)di->i, S.dim, 1);
    if (xtf_bool(call, "use_pos_emb") && !(S.rotary || S.rel_pos || S.pia)) {
        IrDim ps[2] = {C(maxlen), C(S.dim)};
        IrNode *pos = ir_slice(g, paramv(L, 0, 2, ps, "pos_emb.emb.weight"), 0, C(0), seq_of(x));
        x = add(L, x, mul(L, pos, cf(L, pow((double)S.dim, -0.5))));
    }
    x = dropout(L, x, xtf_float(call, "emb_dropout"));
    x = attention_layers(L, &S, x);
    x = *emb = lab(L, layer_norm(L, x, "norm", S.dim), "final_norm");
    if (dout && dout->kind == XV_INT)
        x = linear(L, x, "project_out", S.dim, (int)dout->i, 1);
    return x;
}

static int continuous_dim_in(const XtfValue *call)
{
    const XtfValue *di = xtf_arg(call, "dim_in");
    return di && di->kind == XV_INT ? (int)di->i : (int)xtf_int(xtf_callv(call, "attn_layers"), "dim");
}

/* ContinuousTransformerWrapper: x[b, n, dim_in] -> output[b, n, dim_out] */
static int lower_continuous(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    IrDim n;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "n", xtf_int(call, "max_seq_len"), &n) < 0)
        return -1;
    IrDim xs[3] = {L->B, n, C(continuous_dim_in(call))}, bn[2] = {L->B, n};
    IrNode *x = ir_input(g, "x", IR_F32, 3, xs);
    if (L->opt->mask)
        L->mask = ir_input(g, "mask", IR_BOOL, 2, bn);
    IrNode *emb = NULL, *out = continuous_forward(L, call, x, &emb);
    if (!out)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "output", lab(L, out, "output"));
    if (L->opt->embeddings)
        ir_output(g, "embeddings", emb);
    return 0;
}

/* ViTransformerWrapper body (section 10) on image[b, 3, H, W]: returns the logits [b, classes]
 * (NULL without num_classes) and, in *emb, the final-normed embeddings [b, patches + 1, dim]. */
static IrNode *vit_forward(Lx *L, const XtfValue *call, IrNode *image, IrNode **emb)
{
    IrGraph *g = L->g;
    Stack S;
    *emb = NULL;
    if (wrapper_stack(L, call, &S) < 0)
        return NULL;
    int img = (int)xtf_int(call, "image_size"), ps = (int)xtf_int(call, "patch_size");
    if (img % ps) {
        stack_error(L, call, "image_size %d is not divisible by patch_size %d", img, ps);
        return NULL;
    }
    if ((int64_t)(img / ps) * (img / ps) > XTF_MAX_SIZE || 3 * (int64_t)ps * ps > XTF_MAX_SIZE) {
        stack_error(L, call, "too many or too large patches: (image_size / patch_size)^2 and "
                             "3 * patch_size^2 must be at most %d", XTF_MAX_SIZE);
        return NULL;
    }
    int hp = img / ps, np = hp * hp, pdim = 3 * ps * ps, dim = S.dim;
    /* 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' */
    IrDim s6[6] = {L->B, C(3), C(hp), C(ps), C(hp), C(ps)};
    static const int perm[6] = {0, 2, 4, 3, 5, 1};
    IrDim s3[3] = {L->B, C(np), C(pdim)};
    IrNode *x = ir_reshape(g, ir_permute(g, ir_reshape(g, image, 6, s6), perm), 3, s3);
    x = lab(L, linear(L, x, "patch_to_embedding", pdim, dim, 1), "patches");
    IrDim cs[3] = {C(1), C(1), C(dim)}, cb[3] = {L->B, C(1), C(dim)}, pe[3] = {C(1), C(np + 1), C(dim)};
    x = ir_concat(g, ir_expand(g, paramv(L, 0, 3, cs, "cls_token"), 3, cb), x, 1);
    x = add(L, x, paramv(L, 0, 3, pe, "pos_embedding"));
    x = dropout(L, x, xtf_float(call, "emb_dropout")); /* `dropout` is the mlp_head's */
    x = attention_layers(L, &S, x);
    x = *emb = lab(L, layer_norm(L, x, "norm", dim), "final_norm");
    const XtfValue *nc = xtf_arg(call, "num_classes");
    if (!nc || nc->kind != XV_INT)
        return NULL;
    /* mlp_head = FeedForward(dim, dim_out = classes) on the cls token */
    IrDim e2[2] = {L->B, C(dim)};
    IrNode *cls = ir_reshape(g, ir_slice(g, x, 1, C(0), C(1)), 2, e2);
    IrNode *h = un(L, IR_GELU, linear(L, cls, "mlp_head.net.0.0", dim, 4 * dim, 1));
    h = dropout(L, h, xtf_float(call, "dropout"));
    return linear(L, h, "mlp_head.net.3", 4 * dim, (int)nc->i, 1);
}

static IrNode *vit_image_input(Lx *L, const XtfValue *call)
{
    int img = (int)xtf_int(call, "image_size");
    IrDim is[4] = {L->B, C(3), C(img), C(img)};
    return ir_input(L->g, "image", IR_F32, 4, is);
}

/* ViTransformerWrapper: image[b, 3, H, W] -> logits[b, classes] (and/or embeddings) */
static int lower_vit(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    if (add_sym(L, "b", 0, &L->B) < 0)
        return -1;
    IrNode *emb = NULL, *logits = vit_forward(L, call, vit_image_input(L, call), &emb);
    if (!emb)
        return ir_graph_error(g) ? 0 : -1;
    if (logits)
        ir_output(g, "logits", lab(L, logits, "logits"));
    if (L->opt->embeddings || !logits)
        ir_output(g, "embeddings", emb);
    return 0;
}

/* EncoderDecoder(encoder, decoder): the encoder's final-normed embeddings are the context of a
 * cross-attending decoder (an image captioner: ViT -> Decoder(cross_attend = true)). Inputs:
 * the encoder's (image; or src, src_mask for token and continuous encoders) and the decoder's
 * (tokens, mask, targets). Parameters: encoder.* and decoder.*. */
static int lower_encoder_decoder(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    const XtfValue *enc = xtf_callv(call, "encoder"), *dec = xtf_callv(call, "decoder");
    const XtfValue *dec_layers = xtf_callv(dec, "attn_layers");
    if (!enc || !dec || !dec_layers)
        return stack_error(L, call, "EncoderDecoder needs an encoder and a decoder model");
    if (!xtf_bool(dec_layers, "cross_attend") && strcmp(dec_layers->s, "CrossAttender") != 0)
        return stack_error(L, dec_layers, "the decoder of EncoderDecoder must cross-attend "
                                          "(cross_attend = true, or CrossAttender)");
    int enc_dim = (int)xtf_int(xtf_callv(enc, "attn_layers"), "dim");
    int dec_dim = (int)xtf_int(dec_layers, "dim");
    if (enc_dim != dec_dim)
        return stack_error(L, call, "the encoder's dim (%d) must equal the decoder's (%d): "
                                    "cross-attention keys and values are read from dim-wide context",
                           enc_dim, dec_dim);
    if (add_sym(L, "b", 0, &L->B) < 0)
        return -1;
    IrNode *emb = NULL, *src_mask = NULL;
    L->root = "encoder.";
    L->vroot = "enc.";
    if (strcmp(enc->s, "ViTransformerWrapper") == 0) {
        vit_forward(L, enc, vit_image_input(L, enc), &emb);
    } else {
        IrDim s;
        if (add_sym(L, "s", xtf_int(enc, "max_seq_len"), &s) < 0)
            return -1;
        IrDim bs[2] = {L->B, s};
        if (L->opt->src_mask)
            src_mask = L->mask = ir_input(g, "src_mask", IR_BOOL, 2, bs);
        if (strcmp(enc->s, "ContinuousTransformerWrapper") == 0) {
            IrDim xs[3] = {L->B, s, C(continuous_dim_in(enc))};
            continuous_forward(L, enc, ir_input(g, "src", IR_F32, 3, xs), &emb);
        } else {
            transformer_wrapper(L, enc, ir_input(g, "src", IR_I64, 2, bs), &emb);
        }
    }
    if (!emb)
        return ir_graph_error(g) ? 0 : -1;
    if (L->opt->embeddings)
        ir_output(g, "embeddings", emb);
    IrDim n;
    if (add_sym(L, "n", xtf_int(dec, "max_seq_len"), &n) < 0)
        return -1;
    IrDim bn[2] = {L->B, n};
    L->root = "decoder.";
    L->vroot = "dec.";
    L->context = emb;
    L->context_mask = src_mask;
    IrNode *tokens = ir_input(g, "tokens", IR_I64, 2, bn);
    L->mask = L->opt->mask ? ir_input(g, "mask", IR_BOOL, 2, bn) : NULL;
    IrNode *targets = L->opt->train ? ir_input(g, "targets", IR_I64, 2, bn) : NULL;
    IrNode *hidden, *logits = transformer_wrapper(L, dec, tokens, &hidden);
    L->root = L->vroot = "";
    if (!logits)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "logits", ir_label(g, logits, "logits"));
    if (targets)
        ir_output(g, "loss", ir_label(g, ir_xent(g, logits, targets), "loss"));
    return 0;
}

/* XTransformer routes enc_* and dec_* options (section 10): builds the two calls it stands
 * for, TransformerWrapper(attn_layers = Encoder(...)) and TransformerWrapper(attn_layers =
 * Decoder(cross_attend = true, ...)), with the shared dim, so the rest of the lowering reads
 * them like any other model. The synthetic values live in *store (freed by the caller). */
typedef struct {
    XtfValue wrapper, layers, dim, cross;
    XtfArg wargs[64], largs[128];
} Routed;

static void route(const XtfValue *x, const char *prefix, const char *layers_name, int cross, Routed *r)
{
    memset(r, 0, sizeof *r);
    const XtfCtor *tw = xtf_ctor_find("TransformerWrapper");
    r->wrapper.kind = r->layers.kind = XV_CALL;
    r->wrapper.loc = r->layers.loc = x->loc;
    r->wrapper.s = "TransformerWrapper";
    r->layers.s = layers_name;
    r->wrapper.args = r->wargs;
    r->layers.args = r->largs;
    size_t plen = strlen(prefix);
    for (int i = 0; i < x->nargs; i++) {
        const char *k = x->args[i].key;
        if (!k || strncmp(k, prefix, plen) != 0)
            continue;
        XtfArg a = x->args[i];
        a.key = k + plen;
        if (xtf_option_find(tw, a.key) && r->wrapper.nargs < 63)
            r->wargs[r->wrapper.nargs++] = a;
        else if (r->layers.nargs < 126)
            r->largs[r->layers.nargs++] = a;
    }
    r->dim.kind = XV_INT;
    r->dim.i = xtf_int(x, "dim");
    r->dim.loc = x->loc;
    r->largs[r->layers.nargs++] = (XtfArg){"dim", x->loc, &r->dim};
    if (cross) {
        r->cross.kind = XV_BOOL;
        r->cross.b = 1;
        r->largs[r->layers.nargs++] = (XtfArg){"cross_attend", x->loc, &r->cross};
    }
    r->wargs[r->wrapper.nargs++] = (XtfArg){"attn_layers", x->loc, &r->layers};
}

/* XTransformer (section 10): encoder(src) feeds the cross-attending decoder(tgt[:, :-1]). */
static int lower_xtransformer(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    Routed *re = malloc(sizeof *re), *rd = malloc(sizeof *rd);
    int rc = -1;
    if (!re || !rd)
        goto done;
    route(call, "enc_", "Encoder", 0, re);
    route(call, "dec_", "Decoder", 1, rd);
    const XtfValue *enc = &re->wrapper, *dec = &rd->wrapper;
    IrDim s, t;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "s", xtf_int(enc, "max_seq_len"), &s) < 0 ||
        add_sym(L, "t", xtf_int(dec, "max_seq_len") + 1, &t) < 0)
        goto done;
    IrDim bs[2] = {L->B, s}, bt[2] = {L->B, t}, bt1[2] = {L->B, ir_dim_addc(t, -1)};
    IrNode *src = ir_input(g, "src", IR_I64, 2, bs), *tgt = ir_input(g, "tgt", IR_I64, 2, bt);
    IrNode *src_mask = L->opt->src_mask ? ir_input(g, "src_mask", IR_BOOL, 2, bs) : NULL;
    IrNode *tgt_mask = L->opt->tgt_mask ? ir_input(g, "tgt_mask", IR_BOOL, 2, bt) : NULL;
    IrNode *targets = L->opt->train ? ir_input(g, "targets", IR_I64, 2, bt1) : NULL;

    IrNode *hidden;
    L->root = "encoder.";
    L->vroot = "enc.";
    L->mask = src_mask;
    IrNode *enc_logits = transformer_wrapper(L, enc, src, &hidden);
    if (!enc_logits) {
        rc = ir_graph_error(g) ? 0 : -1;
        goto done;
    }
    /* the encoder's to_logits is in the state_dict but never used: it stays a parameter (so
     * the weights load strictly) whose gradient is zero, as in x-transformers */
    L->root = "decoder.net.";
    L->vroot = "dec.";
    L->context = hidden;
    L->context_mask = src_mask;
    IrDim t1 = ir_dim_addc(t, -1);
    L->mask = tgt_mask ? ir_slice(g, tgt_mask, 1, C(0), t1) : NULL;
    if (xtf_bool(call, "tie_token_emb"))
        L->tied_emb = ir_find_leaf(g, IR_PARAM, "encoder.token_emb.weight");
    IrNode *logits = transformer_wrapper(L, dec, ir_slice(g, tgt, 1, C(0), t1), &hidden);
    L->tied_emb = NULL;
    L->root = "";
    L->vroot = "";
    if (!logits) {
        rc = ir_graph_error(g) ? 0 : -1;
        goto done;
    }
    ir_output(g, "logits", ir_label(g, logits, "logits"));
    if (targets)
        ir_output(g, "loss", ir_label(g, ir_xent(g, logits, targets), "loss"));
    rc = 0;
done:
    free(re);
    free(rd);
    return rc;
}

IrGraph *xt_lower(const XtfFile *f, const char *model, const XtLowerOpts *opts, XtfDiag *d)
{
    const XtfStmt *st = NULL;
    XtfLoc top = {1, 1, 1};
    if (model) {
        st = xtf_find(f, model);
        if (!st) {
            xtf_diag_error(d, f, top, "no model named '%s' in this file", model);
            return NULL;
        }
    } else if (f->nstmts > 0) {
        st = &f->stmts[f->nstmts - 1];
    } else {
        xtf_diag_error(d, f, top, "the file defines no model");
        return NULL;
    }
    const XtfValue *call = st->value;
    while (call && call->kind == XV_REF)
        call = call->ref;
    if (!call || call->kind != XV_CALL) {
        xtf_diag_error(d, f, st->loc, "'%s' is not a model", st->name);
        return NULL;
    }
    IrGraph *g = ir_graph_new(st->name);
    if (!g)
        return NULL;
    static const XtLowerOpts none = {0};
    static Lx zero;
    Lx *Lp = malloc(sizeof *Lp);
    if (!Lp) {
        ir_graph_free(g);
        return NULL;
    }
    *Lp = zero;
    Lp->g = g;
    Lp->f = f;
    Lp->d = d;
    Lp->opt = opts ? opts : &none;
    Lp->root = Lp->vroot = "";
    int rc;
    if (strcmp(call->s, "TransformerWrapper") == 0)
        rc = lower_transformer_wrapper(Lp, call);
    else if (strcmp(call->s, "ContinuousTransformerWrapper") == 0)
        rc = lower_continuous(Lp, call);
    else if (strcmp(call->s, "ViTransformerWrapper") == 0)
        rc = lower_vit(Lp, call);
    else if (strcmp(call->s, "XTransformer") == 0)
        rc = lower_xtransformer(Lp, call);
    else if (strcmp(call->s, "EncoderDecoder") == 0)
        rc = lower_encoder_decoder(Lp, call);
    else
        rc = stack_error(Lp, call, "%s is not a model wrapper (TransformerWrapper, XTransformer, "
                                   "ViTransformerWrapper, ContinuousTransformerWrapper or EncoderDecoder)", call->s);
    if (rc == 0 && ir_graph_error(g)) {
        xtf_diag_error(d, f, call->loc, "internal error while lowering '%s': %s", st->name, ir_graph_error(g));
        rc = -1;
    }
    free(Lp);
    if (rc != 0) {
        ir_graph_free(g);
        return NULL;
    }
    return g;
}
