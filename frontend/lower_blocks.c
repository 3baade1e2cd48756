/* lower_blocks.c: the blocks of a layer stack in IR: linear layers, norms, heads, positions
 * (rotary, ALiBi, relative bias), attention, feed-forward and gates (as XT-SEMANTICS.md
 * defines them). */
#include "lower.h"

IrNode *lx_paramv(Lx *L, int buffer, int rank, const IrDim *shape, const char *fmt, ...)
{
    char name[256], full[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s%s", L->root, name);
    return buffer ? ir_buffer(L->g, full, rank, shape) : ir_param(L->g, full, rank, shape);
}

IrNode *lx_param1(Lx *L, int64_t d0, const char *prefix, const char *leaf)
{
    IrDim s[1] = {C(d0)};
    return lx_paramv(L, 0, 1, s, "%s.%s", prefix, leaf);
}


IrNode *lx_lab(Lx *L, IrNode *n, const char *fmt, ...)
{
    char buf[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ir_label(L->g, n, "%s%s", L->vroot, buf);
}


/* y = x @ W.T (+ b); W is [out, in] (section 1) */
IrNode *lx_linear(Lx *L, IrNode *x, const char *prefix, int in, int out, int bias)
{
    IrDim ws[2] = {C(out), C(in)};
    double bound = 1.0 / sqrt((double)in); /* torch's default: U(-1/sqrt(in), 1/sqrt(in)) */
    IrNode *y = ir_matmul(L->g, x, lx_init(L, lx_paramv(L, 0, 2, ws, "%s.weight", prefix), IR_INIT_UNIFORM, bound), 1);
    if (bias)
        y = add(L, y, lx_init(L, lx_param1(L, out, prefix, "bias"), IR_INIT_UNIFORM, bound));
    return y;
}

/* fresh weights of the Linear at prefix start at constants, weight w and bias b (x-transformers'
 * init_zero_ for zero_init_output; gate_values' constant_ 0 and 1) */
static void init_linear_const(Lx *L, const char *prefix, double w, double b)
{
    char name[300];
    const char *leaf[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s.%s", L->root, prefix, leaf[i]);
        ir_init(L->g, ir_find_leaf(L->g, IR_PARAM, name), IR_INIT_CONST, i ? b : w);
    }
}

static IrNode *mean_last(Lx *L, IrNode *x, int d)
{
    return mul(L, ir_reduce(L->g, IR_SUM, x, -1), cf(L, 1.0 / d));
}

/* nn.LayerNorm(d): (x - mean) / sqrt(var_biased + 1e-5) * weight + bias (section 8) */
IrNode *lx_layer_norm(Lx *L, IrNode *x, const char *prefix, int d)
{
    IrNode *xc = sub(L, x, mean_last(L, x, d));
    IrNode *var = mean_last(L, mul(L, xc, xc), d);
    IrNode *y = mul(L, xc, un(L, IR_RSQRT, add(L, var, cf(L, 1e-5))));
    IrNode *w = lx_init(L, lx_param1(L, d, prefix, "weight"), IR_INIT_CONST, 1.0); /* state_dict order */
    IrNode *b = lx_init(L, lx_param1(L, d, prefix, "bias"), IR_INIT_CONST, 0.0);
    return add(L, mul(L, y, w), b);
}

/* ScaleNorm / RMSNorm: x / clamp(||x|| * d^-0.5, min=eps) * g (section 8) */
static IrNode *scale_norm(Lx *L, IrNode *x, const char *prefix, int d, int gdim, double eps)
{
    IrNode *nrm = un(L, IR_SQRT, ir_reduce(L->g, IR_SUM, mul(L, x, x), -1));
    nrm = ir_binary(L->g, IR_MAX, mul(L, nrm, cf(L, 1.0 / sqrt((double)d))), cf(L, eps));
    return mul(L, ir_binary(L->g, IR_DIV, x, nrm), lx_init(L, lx_param1(L, gdim, prefix, "g"), IR_INIT_CONST, 1.0));
}

/* F.normalize(x, dim=-1): x / max(||x||, 1e-12) */
static IrNode *l2norm(Lx *L, IrNode *x)
{
    IrNode *nrm = un(L, IR_SQRT, ir_reduce(L->g, IR_SUM, mul(L, x, x), -1));
    return ir_binary(L->g, IR_DIV, x, ir_binary(L->g, IR_MAX, nrm, cf(L, 1e-12)));
}

/* A learned gain of the newer norms: the parameter, plus one where 2.x stores gain - 1 */
static IrNode *norm_gain(Lx *L, const Stack *S, const char *prefix, const char *leaf, int d)
{
    IrNode *g = lx_init(L, lx_param1(L, d, prefix, leaf), IR_INIT_CONST, S->unit_offset ? 0.0 : 1.0);
    return S->unit_offset ? add(L, g, cf(L, 1)) : g;
}

/* The norms of 1.x and 2.x: bias-free LayerNorm (gain 'gamma'; 1.29.2 adds its zero 'beta'
 * buffer), and RMSNorm, ScaleNorm, SimpleRMSNorm as F.normalize(x) * sqrt(d) (* gain 'g') */
static IrNode *newer_norm(Lx *L, const Stack *S, IrNode *x, const char *prefix)
{
    int d = S->dim;
    if (S->norm == NORM_LAYER) {
        IrNode *xc = sub(L, x, mean_last(L, x, d));
        IrNode *var = mean_last(L, mul(L, xc, xc), d);
        IrNode *y = mul(L, mul(L, xc, un(L, IR_RSQRT, add(L, var, cf(L, 1e-5)))), norm_gain(L, S, prefix, "gamma", d));
        if (L->V->ln_beta_buffer) {
            IrDim bs[1] = {C(d)};
            y = add(L, y, lx_init(L, lx_paramv(L, 1, 1, bs, "%s.beta", prefix), IR_INIT_CONST, 0.0));
        }
        return y;
    }
    IrNode *y = mul(L, l2norm(L, x), cf(L, sqrt((double)d)));
    if (S->norm == NORM_SIMPLE_RMS)
        return y;
    return mul(L, y, norm_gain(L, S, prefix, "g", S->norm == NORM_SCALE ? 1 : d));
}

/* The norm after the last layer: 0.23.0's wrapper LayerNorm 'norm', or from 1.x on the stack's
 * own norm class as attn_layers.final_norm */
IrNode *lx_final_norm(Lx *L, const Stack *S, IrNode *x)
{
    if (!L->V->final_norm_follows)
        return lx_layer_norm(L, x, L->V->final_norm, S->dim);
    return newer_norm(L, S, x, L->V->final_norm);
}

IrNode *lx_block_norm(Lx *L, const Stack *S, IrNode *x, const char *prefix)
{
    if (S->rezero) /* use_rezero: every block norm is Identity */
        return x;
    if (!L->V->norm_legacy_eps)
        return newer_norm(L, S, x, prefix);
    switch (S->norm) {
    case NORM_RMS: return scale_norm(L, x, prefix, S->dim, S->dim, 1e-8);
    case NORM_SCALE: return scale_norm(L, x, prefix, S->dim, 1, 1e-5);
    default: return lx_layer_norm(L, x, prefix, S->dim);
    }
}

/* l2norm(t, groups) of 1.x/2.x: F.normalize over each of `groups` equal chunks of the last axis */
static IrNode *l2norm_groups(Lx *L, IrNode *t, int groups)
{
    if (groups <= 1)
        return l2norm(L, t);
    int r = t->rank, d = (int)t->shape[r - 1].c;
    IrDim s[IR_MAXRANK], back[IR_MAXRANK];
    for (int i = 0; i < r; i++)
        s[i] = back[i] = t->shape[i];
    s[r - 1] = C(groups);
    s[r] = C(d / groups);
    return ir_reshape(L->g, l2norm(L, ir_reshape(L->g, t, r + 1, s)), r, back);
}

/* nn.Dropout(p) in training mode (XtLowerOpts.dropout): each element is zeroed with probability p
 * and the others scaled by 1 / (1 - p). The mask is rand_like(dropout_seed) < p on a stream of its
 * own per site, with p rounded to rand_like's 2^-24 grid so every backend draws the same mask.
 * Evaluation (and p = 0) leaves x alone. */
IrNode *lx_dropout(Lx *L, IrNode *x, double p)
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
    IrNode *w = lx_paramv(L, 0, 4, ws, "%s.%s.weight", prefix, which); /* Conv2d's default init */
    w = ir_reshape(L->g, lx_init(L, w, IR_INIT_UNIFORM, 1.0 / sqrt((double)h)), 2, w2);
    static const int to_last[4] = {0, 2, 3, 1}, back[4] = {0, 3, 1, 2};
    return ir_permute(L->g, ir_matmul(L->g, ir_permute(L->g, dots, to_last), w, 1), back);
}

/* Per-stack position tensors, shared by every self-attention layer. */
/* Positions tables cover L = mem + n positions; a tensor of length m takes the last m rows. */
static IrNode *last_rows(Lx *L, IrNode *table, IrDim m)
{
    if (!table)
        return NULL;
    return ir_slice(L->g, table, 0, ir_dim_sub(table->shape[0], m), m);
}

/* Rotary positions (section 7.2) on t[b, h, m, dh], positions L-m .. L-1; xpos: the rotated
 * columns times xs[L-m .. L-1] (1.x, 2.x rotary_xpos; NULL: none). */
static IrNode *rotary(Lx *L, const Stack *S, IrNode *t, const Positions *P, IrNode *xs)
{
    IrGraph *g = L->g;
    if (!t)
        return NULL;
    int rd = S->rotary_dim, half = rd / 2, dh = (int)t->shape[t->rank - 1].c; /* collab q, k: qk wide */
    IrNode *cosv = last_rows(L, P->rot_cos, t->shape[2]), *sinv = last_rows(L, P->rot_sin, t->shape[2]);
    IrNode *xr = ir_slice(g, t, -1, C(0), C(rd)), *rot;
    if (L->V->rotary_interleaved) { /* 2.x: pairs (2i, 2i+1) -> (-x[2i+1], x[2i]) */
        IrDim p5[5] = {t->shape[0], t->shape[1], t->shape[2], C(half), C(2)};
        IrNode *pr = ir_reshape(g, xr, 5, p5);
        IrNode *x1 = ir_slice(g, pr, -1, C(0), C(1)), *x2 = ir_slice(g, pr, -1, C(1), C(1));
        IrDim r4[4] = {t->shape[0], t->shape[1], t->shape[2], C(rd)};
        rot = ir_reshape(g, ir_concat(g, un(L, IR_NEG, x2), x1, -1), 4, r4);
    } else { /* halves (i, i + rd/2) */
        IrNode *x1 = ir_slice(g, xr, -1, C(0), C(half));
        IrNode *x2 = ir_slice(g, xr, -1, C(half), C(half));
        rot = ir_concat(g, un(L, IR_NEG, x2), x1, -1);
    }
    IrNode *out = add(L, mul(L, xr, cosv), mul(L, rot, sinv));
    if (xs)
        out = mul(L, out, last_rows(L, xs, t->shape[2]));
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

/* [1, heads, 1, 1]: slopes v[0 .. nv) then zeros (the heads ALiBi leaves alone) */
IrNode *lx_per_head(Lx *L, IrNode *v, int nv, int heads)
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
IrNode *lx_shift_tokens(Lx *L, const Stack *S, IrNode *x, int s, IrNode *mask)
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
IrNode *lx_attention(Lx *L, const Stack *S, IrNode *x, const char *p, int layer, int cross,
                         const Positions *P, IrNode **prev, IrNode *mem)
{
    IrGraph *g = L->g;
    char name[256];
    int h = S->heads, dh = S->dim_head, inner = h * dh, kvh = S->kv_heads;
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
        IrNode *qs = lx_lab(L, lx_linear(L, q_in, name, S->dim, qk, 0), "layer%d.attn.q", layer);
        snprintf(name, sizeof name, "%s.to_k", p);
        IrNode *ks = lx_lab(L, lx_linear(L, k_in, name, S->dim, qk, 0), "layer%d.attn.k", layer);
        IrDim ms[2] = {C(h), C(qk)}, m4[4] = {C(1), C(h), C(1), C(qk)};
        IrDim q4[4] = {L->B, C(1), seq_of(qs), C(qk)}, k4[4] = {L->B, C(1), seq_of(ks), C(qk)};
        IrNode *mix = lx_init(L, lx_paramv(L, 0, 2, ms, "%s.collab_mixing", p), IR_INIT_NORMAL, 1.0);
        mix = ir_reshape(g, mix, 4, m4);
        q = qs ? mul(L, ir_reshape(g, qs, 4, q4), mix) : NULL;
        k = ks ? ir_reshape(g, ks, 4, k4) : NULL;
    } else {
        snprintf(name, sizeof name, "%s.to_q", p);
        q = split_heads(L, lx_lab(L, lx_linear(L, q_in, name, S->dim, inner, 0), "layer%d.attn.q", layer), h, dh);
        snprintf(name, sizeof name, "%s.to_k", p);
        k = split_heads(L, lx_lab(L, lx_linear(L, k_in, name, S->dim, kvh * dh, 0), "layer%d.attn.k", layer), kvh, dh);
    }
    snprintf(name, sizeof name, "%s.to_v", p);
    IrNode *v = split_heads(L, lx_lab(L, lx_linear(L, kv, name, S->dim, kvh * dh, 0), "layer%d.attn.v", layer), kvh, dh);

    int fixed_qk = S->qk_norm && L->V->qk_norm_fixed;
    if (fixed_qk && q && k) { /* 1.x, 2.x: cosine-sim q and k (per group), before rotary */
        q = l2norm_groups(L, q, S->qk_norm_groups);
        k = l2norm_groups(L, k, S->qk_norm_groups);
        if (S->qk_norm_dim_scale) {
            IrDim qs[3] = {C(h), C(1), C(dh)}, ks[3] = {C(L->V->qk_dim_scale_kv ? kvh : h), C(1), C(dh)};
            double init = L->V->qk_dim_scale_kv ? pow((double)dh, 0.25) : 1.0; /* 2.x: dim_head^1/4 */
            q = mul(L, q, lx_init(L, lx_paramv(L, 0, 3, qs, "%s.qk_norm_q_scale", p), IR_INIT_CONST, init));
            k = mul(L, k, lx_init(L, lx_paramv(L, 0, 3, ks, "%s.qk_norm_k_scale", p), IR_INIT_CONST, init));
        }
    }
    if (!cross && S->rotary) { /* step 4: q, k AND v (0.23.0); q and k from 1.x on */
        q = lx_lab(L, rotary(L, S, q, P, P->xpos_q), "layer%d.attn.q_rot", layer);
        k = lx_lab(L, rotary(L, S, k, P, P->xpos_k), "layer%d.attn.k_rot", layer);
        if (L->V->rotary_on_v)
            v = lx_lab(L, rotary(L, S, v, P, P->xpos_k), "layer%d.attn.v_rot", layer);
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
    if (kvh < h) {
        /* grouped / single key-value heads (1.x, 2.x): query head i reads key/value head
         * i mod kv_heads ('b kvh n d -> b (r kvh) n d'). The repeat is explicit here (the cache
         * above holds kv_heads); after the attention fusion, passes/kv_groups.c lets the fused
         * attention read the kv_heads themselves where the target's kernel can. */
        IrDim J0 = k->shape[2];
        IrDim s5[5] = {L->B, C(1), C(kvh), J0, C(dh)}, e5[5] = {L->B, C(h / kvh), C(kvh), J0, C(dh)};
        IrDim s4[4] = {L->B, C(h), J0, C(dh)};
        k = ir_reshape(g, ir_expand(g, ir_reshape(g, k, 5, s5), 5, e5), 4, s4);
        v = ir_reshape(g, ir_expand(g, ir_reshape(g, v, 5, s5), 5, e5), 4, s4);
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
        IrNode *qm = qmask && L->V->mask_queries ? ir_reshape(g, qmask, 4, sq) : t; /* keys only from 1.x on */
        IrNode *km = kmask ? ir_reshape(g, kmask, 4, sk) : t;
        IrDim full[4] = {L->B, C(1), I, J};
        input_mask = ir_expand(g, ir_binary(g, IR_AND, qm, km), 4, full);
    }
    /* step 6: memory key/values, broadcast over the batch, not rotated */
    if (S->num_mem_kv) {
        int M = S->num_mem_kv;
        IrDim ms[3] = {C(h), C(M), C(dh)}, bs[4] = {L->B, C(h), C(M), C(dh)};
        IrNode *mk = lx_init(L, lx_paramv(L, 0, 3, ms, "%s.mem_k", p), IR_INIT_NORMAL, 1.0); /* torch.randn */
        IrNode *mv = lx_init(L, lx_paramv(L, 0, 3, ms, "%s.mem_v", p), IR_INIT_NORMAL, 1.0);
        mk = ir_expand(g, mk, 4, bs);
        mv = ir_expand(g, mv, 4, bs);
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
    if (fixed_qk) {
        scale = cf(L, S->qk_norm_dim_scale && L->V->qk_dim_scale_kv ? pow((double)dh, -0.5) : S->qk_norm_scale);
    } else if (S->qk_norm) {
        q = l2norm(L, q);
        k = l2norm(L, k);
        IrDim ss[4] = {C(1), C(h), C(1), C(1)};
        IrNode *s = lx_paramv(L, 0, 4, ss, "%s.scale", p);
        lx_init(L, s, IR_INIT_CONST, S->qk_scale_init);
        scale = ir_unary(g, IR_RECIP, ir_binary(g, IR_MAX, un(L, IR_EXP, s), cf(L, 1e-2)));
    } else {
        scale = cf(L, pow((double)dh, -0.5));
    }
    IrNode *dots = lx_lab(L, mul(L, ir_matmul(g, q, k, 1), scale), "layer%d.attn.dots", layer);
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
        dots = add(L, dots, lx_lab(L, mul(L, b, cf(L, sqrt((double)dh))), "layer%d.attn.rel_pos", layer));
    }
    if (!cross && P->alibi_past) /* step 11, section 7.4 */
        dots = add(L, dots, lx_lab(L, alibi_bias(L, S, P, I, J), "layer%d.attn.alibi", layer));
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
        IrNode *keep = lx_lab(L, ir_binary(g, IR_LT, qi, kw), "attn_window");
        input_mask = input_mask ? ir_binary(g, IR_AND, input_mask, keep) : keep;
    }
    if (input_mask)
        dots = ir_where(g, input_mask, dots, neg);
    if (!cross && S->causal) { /* j > i + (J - I) */
        IrDim si[2] = {I, C(1)}, sj[2] = {C(1), J};
        IrNode *qi = ir_reshape(g, ir_arange(g, ir_dim_sub(J, I), I, IR_I64), 2, si);
        IrNode *kj = ir_reshape(g, ir_arange(g, C(0), J, IR_I64), 2, sj);
        dots = ir_where(g, lx_lab(L, ir_binary(g, IR_LT, qi, kj), "causal_mask"), neg, dots);
    }
    if (S->sparse_topk) { /* step 13: below the row's k-th largest (ties kept); k >= J changes nothing */
        IrNode *kth = lx_lab(L, ir_kth_largest(g, dots, S->sparse_topk), "layer%d.attn.topk", layer);
        dots = ir_where(g, ir_binary(g, IR_LT, dots, kth), neg, dots);
    }
    /* step 14: softmax, or entmax15 (section 10) */
    IrNode *attn = lx_lab(L, S->entmax15 ? ir_entmax15(g, dots) : ir_softmax(g, dots), "layer%d.attn.weights", layer);
    attn = lx_dropout(L, attn, S->attn_dropout); /* step 15: dropout, then the post-softmax mix */
    if (S->talking_heads)
        attn = mix_heads(L, attn, p, "post_softmax_talking_heads", h);
    IrNode *out = ir_matmul(g, attn, v, 0); /* step 16 */
    if (S->head_scale) {
        IrDim ss[4] = {C(1), C(h), C(1), C(1)};
        out = mul(L, out, lx_init(L, lx_paramv(L, 0, 4, ss, "%s.head_scale_params", p), IR_INIT_CONST, 1.0));
    }
    out = merge_heads(L, out, h, dh);
    if (S->gate_values) { /* step 17 */
        snprintf(name, sizeof name, "%s.to_v_gate", p);
        out = mul(L, out, un(L, IR_SIGMOID, lx_linear(L, x, name, S->dim, inner, L->V->gate_values_bias)));
        init_linear_const(L, name, 0.0, 1.0); /* without the bias (2.x) its rule is skipped */
    }
    if (S->on_attn) { /* step 18: Linear(inner, 2 dim) + GLU: a * sigmoid(gate) */
        snprintf(name, sizeof name, "%s.to_out.0", p);
        IrNode *y = lx_linear(L, out, name, inner, 2 * S->dim, 1);
        IrNode *a = ir_slice(g, y, -1, C(0), C(S->dim));
        IrNode *gt = ir_slice(g, y, -1, C(S->dim), C(S->dim));
        out = mul(L, a, un(L, IR_SIGMOID, gt));
    } else if (L->V->single_head_no_to_out && h == 1) {
        /* 2.x builds no to_out for one head (dim_head == dim, checked by read_stack) */
    } else {
        snprintf(name, sizeof name, "%s.to_out", p);
        out = lx_linear(L, out, name, inner, S->dim, L->V->linear_biases);
        if (S->attn_zero_init) /* zero_init_output: init_zero_(to_out) */
            init_linear_const(L, name, 0.0, 0.0);
    }
    if (L->mask && L->V->zero_padded_rows) { /* 1.x, 2.x: out at padded query rows is 0 */
        IrDim ms[3] = {L->B, seq_of(x), C(1)};
        out = ir_where(g, ir_reshape(g, L->mask, 3, ms), out, cf(L, 0));
    }
    return lx_lab(L, out, "layer%d.attn.out", layer);
}

static IrNode *ff_act(Lx *L, const Stack *S, IrNode *x)
{
    if (S->ff_relu_squared) {
        IrNode *r = un(L, IR_RELU, x);
        return mul(L, r, r);
    }
    if (S->ff_swish) /* nn.SiLU: x * sigmoid(x) */
        return mul(L, x, un(L, IR_SIGMOID, x));
    return un(L, IR_GELU, x);
}

/* FeedForward (section 6) */
IrNode *lx_feed_forward(Lx *L, const Stack *S, IrNode *x, const char *p, int layer)
{
    IrGraph *g = L->g;
    char name[256];
    int inner = (int)(S->dim * S->ff_mult);
    IrNode *hdn;
    const char *net = L->V->ff_net; /* "net" (0.23.0) or "ff" */
    int bias = !S->ff_no_bias;
    if (S->ff_glu) { /* val, gate = proj(x).chunk(2); val * act(gate): the second half gates;
                      * GLU's proj keeps its bias even with ff_no_bias */
        snprintf(name, sizeof name, "%s.%s.0.proj", p, net);
        IrNode *pr = lx_lab(L, lx_linear(L, x, name, S->dim, 2 * inner, 1), "layer%d.ff.proj", layer);
        IrNode *val = ir_slice(g, pr, -1, C(0), C(inner));
        IrNode *gate = ir_slice(g, pr, -1, C(inner), C(inner));
        hdn = mul(L, val, ff_act(L, S, gate));
    } else {
        snprintf(name, sizeof name, "%s.%s.0.0", p, net);
        IrNode *pr = lx_lab(L, lx_linear(L, x, name, S->dim, inner, bias), "layer%d.ff.proj", layer);
        hdn = ff_act(L, S, pr);
    }
    lx_lab(L, hdn, "layer%d.ff.act", layer);
    if (S->ff_post_act_ln) {
        snprintf(name, sizeof name, "%s.net.1", p);
        hdn = lx_layer_norm(L, hdn, name, inner);
    }
    hdn = lx_dropout(L, hdn, S->ff_dropout); /* net.2 */
    snprintf(name, sizeof name, "%s.%s.%d", p, net, L->V->ff_out_index);
    IrNode *y = lx_linear(L, hdn, name, inner, S->dim, bias);
    if (S->ff_zero_init) /* zero_init_output: init_zero_(net[-1]) */
        init_linear_const(L, name, 0.0, 0.0);
    return lx_lab(L, y, "layer%d.ff.out", layer);
}

/* GRUCell(input = out, hidden = residual), row blocks r, z, n (section 4) */
IrNode *lx_gru_gate(Lx *L, const Stack *S, IrNode *out, IrNode *res, const char *p)
{
    IrGraph *g = L->g;
    int d = S->dim;
    IrDim ws[2] = {C(3 * d), C(d)};
    double bound = 1.0 / sqrt((double)d); /* nn.GRUCell's default: all U(-1/sqrt(d), 1/sqrt(d)) */
    IrNode *w_ih = lx_init(L, lx_paramv(L, 0, 2, ws, "%s.gru.weight_ih", p), IR_INIT_UNIFORM, bound); /* state_dict order */
    IrNode *w_hh = lx_init(L, lx_paramv(L, 0, 2, ws, "%s.gru.weight_hh", p), IR_INIT_UNIFORM, bound);
    IrNode *b_ih = lx_init(L, lx_param1(L, 3 * d, p, "gru.bias_ih"), IR_INIT_UNIFORM, bound);
    IrNode *b_hh = lx_init(L, lx_param1(L, 3 * d, p, "gru.bias_hh"), IR_INIT_UNIFORM, bound);
    IrNode *gi = add(L, ir_matmul(g, out, w_ih, 1), b_ih);
    IrNode *gh = add(L, ir_matmul(g, res, w_hh, 1), b_hh);
    IrNode *r = un(L, IR_SIGMOID, add(L, ir_slice(g, gi, -1, C(0), C(d)), ir_slice(g, gh, -1, C(0), C(d))));
    IrNode *z = un(L, IR_SIGMOID, add(L, ir_slice(g, gi, -1, C(d), C(d)), ir_slice(g, gh, -1, C(d), C(d))));
    IrNode *c = un(L, IR_TANH, add(L, ir_slice(g, gi, -1, C(2 * d), C(d)), mul(L, r, ir_slice(g, gh, -1, C(2 * d), C(d)))));
    /* (1 - z) * c + z * res = c + z * (res - c) */
    return add(L, c, mul(L, z, sub(L, res, c)));
}

