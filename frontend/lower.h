/* lower.h: what the files of the lowering share: the state of one lowering (Lx), one
 * AttentionLayers stack's options (Stack), the position tables, and the builders. lower.c: the
 * wrappers and xt_lower; lower_stack.c: reading a stack's options and building its layers;
 * lower_blocks.c: the blocks (norms, attention, feed-forward, positions). Private to the frontend. */
#ifndef XTC_LOWER_H
#define XTC_LOWER_H

#include "xtf.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "options.h"
#include "rt_abi.h" /* xtc_alibi_slope: the one definition, shared with the runtime's init rule */

typedef enum { NORM_LAYER, NORM_SCALE, NORM_RMS, NORM_SIMPLE_RMS } NormKind;

#define MAX_LAYERS 512

/* One AttentionLayers stack (section 4) with its Attention and FeedForward options. */
typedef struct {
    const XtfValue *call;
    int dim, depth, heads, dim_head;
    int kv_heads;               /* attn_kv_heads / attn_one_kv_head (1.x, 2.x); = heads without */
    int unit_offset;            /* 2.x norm_add_unit_offset: stored gains are gain - 1 */
    int causal, cross_attend, only_cross;
    NormKind norm;
    int pre_norm, sandwich_norm, rezero, macaron;
    int scale_residual, gate_residual, residual_attn, cross_residual_attn;
    int rotary, rotary_dim;     /* rotary_dim = rd of section 7.2 */
    int xpos;                   /* 1.x, 2.x rotary_xpos: q and k scaled per rotary pair by position */
    double xpos_scale_base;     /* rotary_xpos_scale_base */
    int rel_pos, rel_buckets, rel_max_distance;
    int pia;                    /* position_infused_attn */
    int use_qk_norm_attn, qk_norm;
    double qk_scale_init;       /* the log-temperature qk_norm's scale starts at (section 9) */
    double qk_norm_scale;       /* 1.x, 2.x: the fixed scale of cosine-sim logits */
    int qk_norm_groups, qk_norm_dim_scale;
    int attn_zero_init, ff_zero_init; /* zero_init_output: to_out, and the FF's last Linear start at 0 */
    int collab_qk;              /* collab_heads: the width of the shared q and k, 0 = off */
    int talking_heads, on_attn, gate_values, head_scale, num_mem_kv;
    int sparse_topk;            /* k, 0 = off */
    int max_attend_past;        /* the attention window w, 0 = off */
    int entmax15;
    int alibi, alibi_heads, alibi_learned; /* section 7.4: learned slopes (or not causal) */
    int ff_glu, ff_relu_squared, ff_post_act_ln, ff_swish, ff_no_bias;
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
    const XtVersion *V;   /* the x-transformers version the file mirrors (versions.h) */
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

typedef struct {
    IrNode *rot_cos, *rot_sin;  /* [n, rd] */
    IrNode *xpos_q, *xpos_k;    /* rotary_xpos: [n, rd] scales of q and (their reciprocals) of k */
    IrNode *pia;                /* [n, dim] sinusoids */
    IrNode *relpos_table;       /* [buckets, heads] */
    IrNode *alibi_past, *alibi_future; /* ALiBi slopes [1, heads, 1, 1] (future: bidirectional) */
} Positions;


/* ---- small helpers ---- */

static inline IrDim C(int64_t v) { return ir_dim(v); }
static inline IrNode *cf(Lx *L, double v) { return ir_const(L->g, v, IR_F32); }
static inline IrNode *add(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_ADD, a, b); }
static inline IrNode *sub(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_SUB, a, b); }
static inline IrNode *mul(Lx *L, IrNode *a, IrNode *b) { return ir_binary(L->g, IR_MUL, a, b); }
static inline IrNode *un(Lx *L, IrOp op, IrNode *x) { return ir_unary(L->g, op, x); }
static inline IrDim seq_of(IrNode *x) { return x ? x->shape[1] : C(0); }

/* Fresh values of leaf p start by this rule (IrInit; a later one replaces it). Returns p. Every
 * parameter and buffer the lowering creates gets one (xt_lower checks). */
static inline IrNode *lx_init(Lx *L, IrNode *p, IrInitKind kind, double value)
{
    ir_init(L->g, p, kind, value);
    return p;
}

/* ---- the builders the files share ---- */

IrNode *lx_paramv(Lx *L, int buffer, int rank, const IrDim *shape, const char *fmt, ...);
IrNode *lx_param1(Lx *L, int64_t d0, const char *prefix, const char *leaf);
IrNode *lx_lab(Lx *L, IrNode *n, const char *fmt, ...);
IrNode *lx_linear(Lx *L, IrNode *x, const char *prefix, int in, int out, int bias);
IrNode *lx_layer_norm(Lx *L, IrNode *x, const char *prefix, int d);
IrNode *lx_block_norm(Lx *L, const Stack *S, IrNode *x, const char *prefix);
IrNode *lx_final_norm(Lx *L, const Stack *S, IrNode *x);
IrNode *lx_dropout(Lx *L, IrNode *x, double p);
IrNode *lx_per_head(Lx *L, IrNode *v, int nv, int heads);
IrNode *lx_shift_tokens(Lx *L, const Stack *S, IrNode *x, int s, IrNode *mask);
IrNode *lx_attention(Lx *L, const Stack *S, IrNode *x, const char *p, int layer, int cross, const Positions *P, IrNode **prev, IrNode *mem);
IrNode *lx_feed_forward(Lx *L, const Stack *S, IrNode *x, const char *p, int layer);
IrNode *lx_gru_gate(Lx *L, const Stack *S, IrNode *out, IrNode *res, const char *p);
int lx_stack_error(Lx *L, const XtfValue *call, const char *fmt, ...);
int lx_read_stack(Lx *L, const XtfValue *call, Stack *S);
int lx_wrapper_stack(Lx *L, const XtfValue *call, Stack *S);
IrNode *lx_attention_layers(Lx *L, const Stack *S, IrNode *x);

#endif
