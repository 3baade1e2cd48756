/* op_cases_grouped.h: op_cases.h's case of grouped key/values (ops.def: multi- and grouped-query
 * attention), included by op_cases.h after its helpers (input, out, unit_rows). */
#ifndef XTC_TESTS_OP_CASES_GROUPED_H
#define XTC_TESTS_OP_CASES_GROUPED_H

/* Grouped key/values (ops.def: k and v with G heads where q has H, query head i reading key/value
 * head i mod G; passes/kv_groups.c lets the node read them without the lowering's repeat): 4
 * query heads over 2 key/value heads with a bias per query head, a padding mask, a scale per
 * batch and head and the statistics, causal with keys offset from the queries; over 1 (multi-
 * query) with a window; one decoded row (the few-row paths); heads read and written in place
 * through head-split views of their own head counts; and the bounded (cosine-sim) variant. */
static void build_attention_grouped(IrGraph *g, IrDim b, IrDim n)
{
    static const int split[4] = {0, 2, 1, 3};
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(4), hd = ir_dim(8), one = ir_dim(1);
    IrDim sq[] = {b, h, n, hd}, sk2[] = {b, ir_dim(2), J, hd}, sk1[] = {b, one, J, hd};
    IrDim sbias[] = {h, n, J}, smask[] = {b, one, one, J}, sscale[] = {b, h, one, one}, sq1[] = {b, h, one, hd};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk2), *v = input(g, "v", IR_F32, 4, sk2);
    IrNode *k1 = input(g, "k1", IR_F32, 4, sk1), *v1 = input(g, "v1", IR_F32, 4, sk1);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    out(g, "gqa_all", ir_attention(g, q, k, v, bias, mask, scale, 1, 1));
    out(g, "mqa_window", ir_attention_window(g, q, k1, v1, NULL, NULL, c, 1, 1, 2));
    out(g, "gqa_decode", ir_attention(g, input(g, "q1", IR_F32, 4, sq1), k, v, NULL, NULL, c, 1, 0));
    IrDim sxq[] = {b, n, h, hd}, sxk[] = {b, J, ir_dim(2), hd};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split), *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxk), split);
    out(g, "gqa_heads", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, c, 1, 0), split));
    out(g, "gqa_bounded", ir_attention_bounded(g, unit_rows(g, q), unit_rows(g, k), v, NULL, ir_const(g, 10.0, IR_F32), 1, 1, 0, 1));
}

/* The gradient of grouped key/values (ops.def: attention_grad; dk, dv of key/value head g, summed
 * over its query heads h mod G = g, in the rows of head g, zeros in those of heads G..H-1): 4
 * query heads over 2 with a bias per query head, a padding mask (rows with no key: their uniform
 * share of dv), a scale per batch and head, causal with keys offset and the logsumexp's gradient;
 * without any; over 1 (multi-query) with a mask and a window, and causal with a bias; 4 over 2
 * bounded (cosine-sim: the forward's maximum the bound, its logsumexp read back); 2 over 1 of
 * 130 wide heads (CUDA's row kernel), causal. The CPU's tiles: build_attention_grouped_tiles. */
static void build_attention_grouped_grad(IrGraph *g, IrDim b, IrDim n)
{
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(4), hd = ir_dim(8), one = ir_dim(1), two = ir_dim(2);
    IrDim sq[] = {b, h, n, hd}, sg[] = {b, h, n, ir_dim(9)}, sk2[] = {b, two, J, hd}, sk1[] = {b, one, J, hd};
    IrDim sbias[] = {h, n, J}, smask[] = {b, one, one, J}, sscale[] = {b, h, one, one};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk2), *v = input(g, "v", IR_F32, 4, sk2);
    IrNode *k1 = input(g, "k1", IR_F32, 4, sk1), *v1 = input(g, "v1", IR_F32, 4, sk1);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    IrNode *all = ir_attention(g, q, k, v, bias, mask, scale, 1, 1);
    out(g, "gqa_all_grad", ir_attention_grad(g, all, input(g, "dout_lse", IR_F32, 4, sg)));
    IrNode *plain = ir_attention(g, q, k, v, NULL, NULL, c, 0, 1);
    out(g, "gqa_plain_grad", ir_attention_grad(g, plain, input(g, "dout", IR_F32, 4, sq)));
    IrNode *mw = ir_attention_window(g, q, k1, v1, NULL, mask, c, 1, 1, 2);
    out(g, "mqa_window_grad", ir_attention_grad(g, mw, input(g, "dout_w", IR_F32, 4, sq)));
    IrNode *mc = ir_attention(g, q, k1, v1, bias, NULL, scale, 1, 1);
    out(g, "mqa_bias_grad", ir_attention_grad(g, mc, input(g, "dout_b", IR_F32, 4, sq)));
    IrNode *bd = ir_attention_bounded(g, unit_rows(g, q), unit_rows(g, k), v, NULL, ir_const(g, 10.0, IR_F32), 1, 1, 0, 1);
    out(g, "gqa_bounded_grad", ir_attention_grad(g, bd, input(g, "dout_bd", IR_F32, 4, sq)));
    /* 130 wide heads, 2 over 1: CUDA's row kernel (a block per query row or key), causal */
    IrDim swq[] = {b, two, ir_dim(5), ir_dim(130)}, swk[] = {b, one, ir_dim(9), ir_dim(130)};
    IrNode *wq = input(g, "wq", IR_F32, 4, swq), *wk = input(g, "wk", IR_F32, 4, swk), *wv = input(g, "wv", IR_F32, 4, swk);
    IrNode *wide = ir_attention(g, wq, wk, wv, NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1);
    out(g, "mqa_wide_grad", ir_attention_grad(g, wide, input(g, "dout_wide", IR_F32, 4, swq)));
}

/* For the CPU kernel's tiles (attention_grouped_grad has the CUDA kernels' at n = 130: five
 * query and key tiles of 32): 4 query heads over 2 of 24 wide heads at n + 40 queries and
 * 2n + 60 keys (two query and two or three key tiles of the CPU backward), causal; 4 over 1 at n
 * queries and n + 3 keys, v the same tensor as k, not causal. */
static void build_attention_grouped_tiles(IrGraph *g, IrDim b, IrDim n)
{
    IrDim I2 = ir_dim_addc(n, 40), J2 = ir_dim_addc(ir_dim_add(n, n), 60), hw = ir_dim(24);
    IrDim stq[] = {b, ir_dim(4), I2, hw}, stk[] = {b, ir_dim(2), J2, hw};
    IrNode *tq = input(g, "tq", IR_F32, 4, stq), *tk = input(g, "tk", IR_F32, 4, stk), *tv = input(g, "tv", IR_F32, 4, stk);
    IrNode *tiles = ir_attention(g, tq, tk, tv, NULL, NULL, ir_const(g, 0.2, IR_F32), 1, 1);
    out(g, "gqa_tiles_grad", ir_attention_grad(g, tiles, input(g, "dout_t", IR_F32, 4, stq)));
    IrDim smq[] = {b, ir_dim(4), n, hw}, smk[] = {b, ir_dim(1), ir_dim_addc(n, 3), hw};
    IrNode *mk = input(g, "mk", IR_F32, 4, smk);
    IrNode *mqa = ir_attention(g, input(g, "mq", IR_F32, 4, smq), mk, mk, NULL, NULL, ir_const(g, 0.2, IR_F32), 0, 1);
    out(g, "mqa_n_grad", ir_attention_grad(g, mqa, input(g, "dout_m", IR_F32, 4, smq)));
}

#endif
