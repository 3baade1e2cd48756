/* match.h: recognizers for the subgraphs the fusion passes replace.
 *
 * Each recognizer takes the root of a candidate subgraph and fills a description of its parts,
 * matching exactly what frontend/lower.c emits after the cleanup passes (cse's operand order
 * included). They only look; a fusion pass decides from the description and the use counts
 * (PassRewriter.uses) whether replacing is worth it. */
#ifndef XTC_MATCH_H
#define XTC_MATCH_H

#include "ir.h"

/* Attention as lower.c writes it (XT-SEMANTICS.md section 5, steps 7-16):
 *
 *   scores = matmul(q, k, transpose_b=1) * scale              [.., I, J]
 *   x      = scores (+ bias)                                   rel. position bias, residual attn
 *   x      = where(mask, x, -FLT_MAX)                          padding mask, true = keep
 *   x      = where(j > i + (J - I), -FLT_MAX, x)               causal
 *   out    = matmul(softmax(x), v)                             [.., I, E]
 *
 * bias, mask and causal are each optional. */
typedef struct {
    const IrNode *out;       /* the root: matmul(weights, v) */
    const IrNode *q, *k, *v; /* [.., I, D], [.., J, D], [.., J, E] */
    const IrNode *qk;        /* matmul(q, k, transpose_b=1) */
    const IrNode *scores;    /* qk * scale */
    const IrNode *scale;     /* the scale operand: a scalar constant, or a tensor (cosine-sim) */
    double scale_value;      /* when scale_is_const */
    int scale_is_const;
    const IrNode *bias;      /* the additive term, or NULL */
    const IrNode *add;       /* scores + bias, or NULL */
    const IrNode *mask;      /* bool, broadcastable to [.., I, J], or NULL */
    const IrNode *masked;    /* the where of the mask, or NULL */
    const IrNode *causal;    /* the where of the causal mask, or NULL */
    const IrNode *softmax;
} PassAttention;

/* 1 and *m filled when out is the root of an attention subgraph, else 0. */
int pass_match_attention(const IrNode *out, PassAttention *m);

/* 1 and *w filled when c is lower.c's sliding-window keep condition over [I, J] (max_attend_past):
 * lt(arange(J - I, I)[I, 1], arange(w + 1, J)[1, J]), i.e. key j kept while i + J - I - j <= w. */
int pass_match_window(const IrNode *c, IrDim I, IrDim J, int64_t *w);

/* 1 when every interior node (qk, scores, add, masked, causal, softmax) has exactly one use in
 * uses[] (node id -> live uses), so that fusing removes them all; 0 when one is shared, as the
 * softmax is with its gradient in a training graph, or the scores with the next layer under
 * residual attention. */
int pass_attention_private(const PassAttention *m, const int *uses);

#endif
