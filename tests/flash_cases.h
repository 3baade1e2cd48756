/* flash_cases.h: the attention graphs of the tensor-core kernels (test_cuda_mma's flash cases,
 * not op table rows): cg_cuda_attention_mma.c's forward and kernels/flash_fwd.cuh, and the
 * backward, cg_cuda_attention_mma_grad.c and kernels/flash_bwd.cuh. Included after op_cases.h
 * (its input and out helpers). */
#ifndef XTC_TEST_FLASH_CASES_H
#define XTC_TEST_FLASH_CASES_H

/* Every form of bias, mask and scale over q, k of heads 8 and v of heads dv, 2 heads, causal with
 * J = n + 3 and J = n - 1 (row 0 sees no key; J = 0 at n = 1), windows: the outputs that
 * build_flash and build_flash16 share (with few_keys, also one without the logsumexp column);
 * returns q. */
static inline IrNode *flash_forms(IrGraph *g, IrDim b, IrDim n, int64_t dv, int few_keys)
{
    IrDim J = ir_dim_addc(n, 3), J0 = ir_dim_addc(n, -1), h = ir_dim(2), one = ir_dim(1), d8 = ir_dim(8);
    IrDim sq[] = {b, h, n, d8}, sk[] = {b, h, J, d8}, sv[] = {b, h, J, ir_dim(dv)};
    IrDim sk0[] = {b, h, J0, d8}, sbias[] = {h, n, J}, smask[] = {b, one, one, J};
    IrDim sscale[] = {b, h, one, one}, sqm[] = {b, one, n, one};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sv);
    IrNode *k0 = input(g, "k0", IR_F32, 4, sk0), *v0 = input(g, "v0", IR_F32, 4, sk0);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    IrNode *pad = ir_binary(g, IR_AND, input(g, "qmask", IR_BOOL, 4, sqm), input(g, "kmask", IR_BOOL, 4, smask));
    out(g, "plain", ir_attention(g, q, k, v, NULL, NULL, c, 0, 1));
    out(g, "causal", ir_attention(g, q, k, v, NULL, NULL, c, 1, 1));
    out(g, "all", ir_attention(g, q, k, v, bias, mask, scale, 1, 1));
    out(g, "padded", ir_attention(g, q, k, v, NULL, pad, c, 0, 1));
    out(g, "masked_row", ir_attention(g, q, k0, v0, NULL, NULL, c, 1, 1));
    if (few_keys)
        out(g, "few_keys", ir_attention(g, q, k0, v0, NULL, NULL, c, 0, 0));
    out(g, "window", ir_attention_window(g, q, k, v, NULL, NULL, c, 1, 1, 2));
    out(g, "window_all", ir_attention_window(g, q, k, v, bias, pad, scale, 0, 1, 3));
    out(g, "window_row0", ir_attention_window(g, q, k0, v0, NULL, NULL, c, 1, 1, 1));
    return q;
}

/* The attention forms the tensor-core forward (cg_cuda_attention_mma.c) takes, every one with
 * the logsumexp column the backward reads: heads 8 by 12 (padded to the mma's 16 and 8), the
 * forms of flash_forms, heads 64 and 128 by 40, heads split in place (CG_VIEW_*), and one
 * gradient (the CUDA-core backward on the tensor-core forward's output and statistics). */
static inline void build_flash(IrGraph *g, IrDim b, IrDim n)
{
    static const int split[4] = {0, 2, 1, 3};
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(2), one = ir_dim(1);
    flash_forms(g, b, n, 12, 1);
    IrDim s64[] = {b, one, n, ir_dim(64)}, s64k[] = {b, one, J, ir_dim(64)};
    out(g, "head64", ir_attention(g, input(g, "q64", IR_F32, 4, s64), input(g, "k64", IR_F32, 4, s64k),
                                  input(g, "v64", IR_F32, 4, s64k), NULL, NULL, ir_const(g, 0.125, IR_F32), 1, 1));
    IrDim s128[] = {b, one, n, ir_dim(128)}, s128k[] = {b, one, J, ir_dim(128)}, s40[] = {b, one, J, ir_dim(40)};
    out(g, "head128", ir_attention(g, input(g, "q128", IR_F32, 4, s128), input(g, "k128", IR_F32, 4, s128k),
                                   input(g, "v40", IR_F32, 4, s40), NULL, NULL, ir_const(g, 0.09, IR_F32), 0, 1));
    IrDim sxq[] = {b, n, h, ir_dim(16)}, sxk[] = {b, J, h, ir_dim(16)};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split);
    IrNode *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxk), split);
    out(g, "heads", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, ir_const(g, 0.35, IR_F32), 1, 0), split));
}

/* The forward of q, k and v as stored (kernels/flash_fwd.cuh: 16-bit storage of the mma's format,
 * heads multiples of 8): the forms of flash_forms over heads of 8 (padded to 16 in its tiles),
 * GPT's causal head of 64 through head-split views (two 16-row tiles a warp), a window over
 * heads of 40 by 24, heads of 128 (one tile a warp, 32 keys a stage), and grouped key/values
 * (multi-query; grouped through head-split views of 4 and 2 heads). */
static inline void build_flash16(IrGraph *g, IrDim b, IrDim n)
{
    static const int split[4] = {0, 2, 1, 3};
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(2), one = ir_dim(1);
    IrNode *q = flash_forms(g, b, n, 8, 0), *c = ir_const(g, 0.35, IR_F32);
    IrDim sxq[] = {b, n, h, ir_dim(64)}, sxk[] = {b, J, h, ir_dim(64)};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split);
    IrNode *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxk), split);
    out(g, "heads64", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, ir_const(g, 0.125, IR_F32), 1, 0), split));
    IrDim s40[] = {b, one, n, ir_dim(40)}, s40k[] = {b, one, J, ir_dim(40)}, s24[] = {b, one, J, ir_dim(24)};
    out(g, "window40", ir_attention_window(g, input(g, "q40", IR_F32, 4, s40), input(g, "k40", IR_F32, 4, s40k),
                                           input(g, "v24", IR_F32, 4, s24), NULL, NULL, ir_const(g, 0.15, IR_F32), 1, 1, 40));
    IrDim s128[] = {b, one, n, ir_dim(128)}, s128k[] = {b, one, J, ir_dim(128)};
    out(g, "head128", ir_attention(g, input(g, "q128", IR_F32, 4, s128), input(g, "k128", IR_F32, 4, s128k),
                                   input(g, "v128", IR_F32, 4, s128k), NULL, NULL, ir_const(g, 0.09, IR_F32), 1, 1));
    /* grouped key/values: one head for both query heads, and 2 for 4 through head-split views */
    IrDim sk1[] = {b, one, J, ir_dim(8)}, sgq[] = {b, n, ir_dim(4), ir_dim(16)}, sgk[] = {b, J, h, ir_dim(16)};
    out(g, "mqa", ir_attention(g, q, input(g, "k1", IR_F32, 4, sk1), input(g, "v1", IR_F32, 4, sk1), NULL, NULL, c, 1, 1));
    IrNode *gq = ir_permute(g, input(g, "gq", IR_F32, 4, sgq), split);
    IrNode *gk = ir_permute(g, input(g, "gk", IR_F32, 4, sgk), split), *gv = ir_permute(g, input(g, "gv", IR_F32, 4, sgk), split);
    out(g, "gqa_heads", ir_permute(g, ir_attention(g, gq, gk, gv, NULL, NULL, ir_const(g, 0.25, IR_F32), 1, 0), split));
}

/* The bounded (cosine-sim) forward on kernels/flash_fwd.cuh: inputs in [-2, 2] bound |q . k| by 4
 * D; heads of 16 (bound x scale 16), causal with J = n + 3 and n - 1 (rows that see no key: the
 * general path, chosen at run time), not causal, a window, and a causal head of 64 (two tiles a
 * warp, bound x scale 32); each with the statistics and one gradient of them. */
static inline void build_flash16_bounded(IrGraph *g, IrDim b, IrDim n)
{
    IrDim J = ir_dim_addc(n, 3), J0 = ir_dim_addc(n, -1), h = ir_dim(2), d16 = ir_dim(16);
    IrDim sq[] = {b, h, n, d16}, sk[] = {b, h, J, d16}, sk0[] = {b, h, J0, d16};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sk);
    IrNode *k0 = input(g, "k0", IR_F32, 4, sk0), *v0 = input(g, "v0", IR_F32, 4, sk0), *c = ir_const(g, 0.25, IR_F32);
    IrNode *causal = ir_attention_bounded(g, q, k, v, NULL, c, 1, 1, 0, 64);
    out(g, "causal", causal);
    out(g, "causal_grad", ir_attention_grad(g, causal, input(g, "dout", IR_F32, 4, sq)));
    out(g, "full", ir_attention_bounded(g, q, k, v, NULL, c, 0, 1, 0, 64));
    out(g, "window", ir_attention_bounded(g, q, k, v, NULL, c, 1, 1, 5, 64));
    out(g, "few_keys", ir_attention_bounded(g, q, k0, v0, NULL, c, 1, 1, 0, 64));
    IrDim s64[] = {b, ir_dim(1), n, ir_dim(64)};
    IrNode *q64 = input(g, "q64", IR_F32, 4, s64);
    out(g, "head64", ir_attention_bounded(g, q64, q64, input(g, "v64", IR_F32, 4, s64), NULL, ir_const(g, 0.125, IR_F32),
                                          1, 1, 0, 256));
}

/* Gradients on the tensor-core backward (heads up to 64): a bias, a mask and a scale operand,
 * causal and window limits, rows that see no key or whose every key is masked, a ragged head
 * of 40 (and no logsumexp gradient), two tiles of 64 of a head of 64. */
static inline void build_flash_grad(IrGraph *g, IrDim b, IrDim n)
{
    IrDim J = ir_dim_addc(n, 3), J0 = ir_dim_addc(n, -1), h = ir_dim(2), one = ir_dim(1), d8 = ir_dim(8);
    IrDim sq[] = {b, h, n, d8}, sk[] = {b, h, J, d8}, sk0[] = {b, h, J0, d8}, sd[] = {b, h, n, ir_dim(9)};
    IrDim sbias[] = {h, n, J}, smask[] = {b, one, one, J}, sscale[] = {b, h, one, one}, sqm[] = {b, one, n, one};
    IrDim s40q[] = {b, one, n, ir_dim(40)}, s40[] = {b, one, J, ir_dim(40)}, s64[] = {b, one, n, ir_dim(64)};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sk);
    IrNode *k0 = input(g, "k0", IR_F32, 4, sk0), *v0 = input(g, "v0", IR_F32, 4, sk0), *c = ir_const(g, 0.35, IR_F32);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *dout = input(g, "dout", IR_F32, 4, sd);
    IrNode *pad = ir_binary(g, IR_AND, input(g, "qmask", IR_BOOL, 4, sqm), input(g, "kmask", IR_BOOL, 4, smask));
    IrNode *k40 = input(g, "k40", IR_F32, 4, s40), *q64 = input(g, "q64", IR_F32, 4, s64);
    out(g, "all_grad", ir_attention_grad(g, ir_attention(g, q, k, v, bias, mask, scale, 1, 1), dout));
    out(g, "causal_grad", ir_attention_grad(g, ir_attention(g, q, k, v, NULL, NULL, c, 1, 1), dout));
    out(g, "window_grad", ir_attention_grad(g, ir_attention_window(g, q, k, v, NULL, NULL, scale, 1, 1, 2), dout));
    out(g, "row0_grad", ir_attention_grad(g, ir_attention(g, q, k0, v0, NULL, NULL, c, 1, 1), dout));
    out(g, "padded_grad", ir_attention_grad(g, ir_attention(g, q, k, v, bias, pad, c, 0, 1), dout));
    IrNode *a40 = ir_attention(g, input(g, "q40", IR_F32, 4, s40q), k40, k40, NULL, NULL, ir_const(g, 0.15, IR_F32), 0, 1);
    out(g, "head40_grad", ir_attention_grad(g, a40, input(g, "dout40", IR_F32, 4, s40q)));
    IrNode *a64 = ir_attention(g, q64, input(g, "k64", IR_F32, 4, s64), input(g, "v64", IR_F32, 4, s64), NULL, NULL, c, 1, 1);
    out(g, "head64_grad", ir_attention_grad(g, a64, input(g, "dout64", IR_F32, 4, s64)));
}

/* build_flash_grad's gradients and the heads of 32 and 128 for the backward of operands as stored
 * (kernels/flash_bwd.cuh: 16-bit storage of the mma's format, heads multiples of 8): a window
 * with a bias, a mask and a scale operand over heads of 32 and the logsumexp's gradient (rows of
 * 33 values: no 16-byte copies), a causal head of 128 (one stage of 16 rows), and a causal
 * window of 70 over heads of 64 (its full tiles at n = 130: rows 64 .. 79 and keys 32 .. 63). */
static inline void build_flash_grad16(IrGraph *g, IrDim b, IrDim n)
{
    build_flash_grad(g, b, n);
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(2), one = ir_dim(1);
    IrDim s32q[] = {b, h, n, ir_dim(32)}, s32[] = {b, h, J, ir_dim(32)}, s33[] = {b, h, n, ir_dim(33)};
    IrDim sbias[] = {h, n, J}, smask[] = {b, one, one, J}, sscale[] = {b, h, one, one}, sqm[] = {b, one, n, one};
    IrNode *pad = ir_binary(g, IR_AND, input(g, "qm32", IR_BOOL, 4, sqm), input(g, "km32", IR_BOOL, 4, smask));
    IrNode *a32 = ir_attention_window(g, input(g, "q32", IR_F32, 4, s32q), input(g, "k32", IR_F32, 4, s32),
                                      input(g, "v32", IR_F32, 4, s32), input(g, "bias32", IR_F32, 3, sbias), pad,
                                      input(g, "scale32", IR_F32, 4, sscale), 0, 1, 3);
    out(g, "head32_grad", ir_attention_grad(g, a32, input(g, "dout32", IR_F32, 4, s33)));
    IrDim s128q[] = {b, one, n, ir_dim(128)}, s128[] = {b, one, J, ir_dim(128)};
    IrNode *a128 = ir_attention(g, input(g, "q128", IR_F32, 4, s128q), input(g, "k128", IR_F32, 4, s128),
                                input(g, "v128", IR_F32, 4, s128), NULL, NULL, ir_const(g, 0.09, IR_F32), 1, 1);
    out(g, "head128_grad", ir_attention_grad(g, a128, input(g, "dout128", IR_F32, 4, s128q)));
    IrDim e32[] = {b, h, n, ir_dim(32)}, emask[] = {b, one, n, n};
    IrNode *eq = input(g, "eq", IR_F32, 4, e32);
    out(g, "enc_grad", ir_attention_grad(g, ir_attention(g, eq, input(g, "ek", IR_F32, 4, e32), input(g, "ev", IR_F32, 4, e32),
                                                         NULL, input(g, "emask", IR_BOOL, 4, emask), ir_const(g, 0.17, IR_F32), 0, 1),
                                         input(g, "ed", IR_F32, 4, e32)));
    IrDim s64[] = {b, one, n, ir_dim(64)};
    IrNode *w64 = input(g, "w64", IR_F32, 4, s64);
    out(g, "window64_grad", ir_attention_grad(g, ir_attention_window(g, w64, w64, input(g, "wv64", IR_F32, 4, s64), NULL,
                                                                     NULL, ir_const(g, 0.125, IR_F32), 1, 1, 70),
                                              input(g, "wd64", IR_F32, 4, s64)));
}

/* Grouped key/values through the tensor-core backward (ops.def: query head h reads key/value head
 * h mod G; dk, dv of head g summed over its query heads, zeros in the rows of heads G..H-1): 4
 * query heads over 2 of 16 wide with a bias per query head, a padding mask, a scale per batch and
 * head, causal with keys offset and the logsumexp's gradient (rows of 17 values: no 16-byte
 * copies); 8 over 2 (groups of 4) of 32, not causal; multi-query of 64, causal (full tiles at
 * n = 130), and of 8 with a window where row 0 sees no key. */
static inline void build_flash_grad_grouped(IrGraph *g, IrDim b, IrDim n)
{
    IrDim J = ir_dim_addc(n, 3), J0 = ir_dim_addc(n, -1), h = ir_dim(4), one = ir_dim(1), two = ir_dim(2);
    IrDim sq[] = {b, h, n, ir_dim(16)}, sk[] = {b, two, J, ir_dim(16)}, sd[] = {b, h, n, ir_dim(17)};
    IrDim sbias[] = {h, n, J}, smask[] = {b, one, one, J}, sscale[] = {b, h, one, one};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sk);
    IrNode *all = ir_attention(g, q, k, v, input(g, "bias", IR_F32, 3, sbias), input(g, "mask", IR_BOOL, 4, smask),
                               input(g, "scale", IR_F32, 4, sscale), 1, 1);
    out(g, "gqa_all_grad", ir_attention_grad(g, all, input(g, "dout", IR_F32, 4, sd)));
    IrDim s4q[] = {b, ir_dim(8), n, ir_dim(32)}, s4k[] = {b, two, n, ir_dim(32)};
    IrNode *q4 = input(g, "q4", IR_F32, 4, s4q);
    IrNode *a4 = ir_attention(g, q4, input(g, "k4", IR_F32, 4, s4k), input(g, "v4", IR_F32, 4, s4k), NULL, NULL,
                              ir_const(g, 0.17, IR_F32), 0, 1);
    out(g, "gqa4_grad", ir_attention_grad(g, a4, input(g, "d4", IR_F32, 4, s4q)));
    IrDim smq[] = {b, h, n, ir_dim(64)}, smk[] = {b, one, J, ir_dim(64)};
    IrNode *mq = input(g, "mq", IR_F32, 4, smq);
    IrNode *am = ir_attention(g, mq, input(g, "mk", IR_F32, 4, smk), input(g, "mv", IR_F32, 4, smk), NULL, NULL,
                              ir_const(g, 0.125, IR_F32), 1, 1);
    out(g, "mqa_grad", ir_attention_grad(g, am, input(g, "md", IR_F32, 4, smq)));
    IrDim swq[] = {b, two, n, ir_dim(8)}, swk[] = {b, one, J0, ir_dim(8)};
    IrNode *wq = input(g, "wq", IR_F32, 4, swq);
    IrNode *aw = ir_attention_window(g, wq, input(g, "wk", IR_F32, 4, swk), input(g, "wv", IR_F32, 4, swk), NULL, NULL,
                                     ir_const(g, 0.35, IR_F32), 1, 1, 2);
    out(g, "mqa_window_grad", ir_attention_grad(g, aw, input(g, "wd", IR_F32, 4, swq)));
}

/* build_flash_grad_grouped and, for kernels/flash_bwd.cuh alone (one stage of 16 rows), 2 query
 * heads over 1 of 128, causal. */
static inline void build_flash_grad_grouped16(IrGraph *g, IrDim b, IrDim n)
{
    build_flash_grad_grouped(g, b, n);
    IrDim sq[] = {b, ir_dim(2), n, ir_dim(128)}, sk[] = {b, ir_dim(1), ir_dim_addc(n, 3), ir_dim(128)};
    IrNode *q = input(g, "q128", IR_F32, 4, sq);
    IrNode *a = ir_attention(g, q, input(g, "k128", IR_F32, 4, sk), input(g, "v128", IR_F32, 4, sk), NULL, NULL,
                             ir_const(g, 0.09, IR_F32), 1, 1);
    out(g, "mqa128_grad", ir_attention_grad(g, a, input(g, "d128", IR_F32, 4, sq)));
}

#endif
