/* test_ir_text.c: the IR text form (ir/print.c, ir/parse.c).
 *
 *   - graphs built in C that together use every op of ops.def print, parse and print back to
 *     the same text, and the parsed graph equals the built one node by node;
 *   - golden files: tests/ir/NAME.ir (hand-written) parses and prints as tests/ir/NAME.expected
 *     (on a mismatch the actual text is written to BUILD/NAME.actual);
 *   - malformed text gives "file:line:col: error: ..." with the expected message;
 *   - thousands of truncated or corrupted texts (fixed seed) neither crash nor leak, and any
 *     that parses prints to a fixed point.
 */
#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h" /* its xorshift (rnd), from its default seed */
#include "ir.h"

/* ---- helpers ---- */

static IrDim D(int64_t c) { return ir_dim(c); }

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
}

/* ---- graphs built in C ---- */

/* a one-block GPT: embeddings, layer norm by hand, causal attention, MLP, tied logits, loss */
static IrGraph *build_gpt(void)
{
    IrGraph *g = ir_graph_new("gpt");
    IrDim B = ir_dim_sym(ir_graph_add_sym(g, "b", 0));
    IrDim N = ir_dim_sym(ir_graph_add_sym(g, "n", 128));
    enum { V = 50, C = 16, H = 2, HD = 8 };
    IrDim s_bn[] = {B, N}, s_wte[] = {D(V), D(C)}, s_wpe[] = {D(128), D(C)}, s_c[] = {D(C)};
    IrDim s_cc[] = {D(C), D(C)}, s_c4[] = {D(C), D(4 * C)}, s_4c[] = {D(4 * C), D(C)};
    IrDim s_heads[] = {B, N, D(H), D(HD)}, s_bnc[] = {B, N, D(C)};
    IrDim s_col[] = {N, D(1)}, s_row[] = {D(1), N};
    const int to_heads[] = {0, 2, 1, 3};

    IrNode *tok = ir_input(g, "tokens", IR_I64, 2, s_bn);     /* (b, n) */
    IrNode *tgt = ir_input(g, "targets", IR_I64, 2, s_bn);    /* (b, n) */
    IrNode *wte = ir_param(g, "token_emb.weight", 2, s_wte); /* (V, C) */
    IrNode *wpe = ir_param(g, "pos_emb.weight", 2, s_wpe);   /* (128, C) */
    IrNode *emb = ir_label(g, ir_gather(g, wte, tok), "emb"); /* (b, n, C) */
    IrNode *pos = ir_label(g, ir_slice(g, wpe, 0, D(0), N), "pos"); /* (n, C) */
    IrNode *x = ir_label(g, ir_binary(g, IR_ADD, emb, pos), "x");

    /* layer norm over C, written out */
    IrNode *cC = ir_const(g, C, IR_F32);
    IrNode *mean = ir_binary(g, IR_DIV, ir_reduce(g, IR_SUM, x, -1), cC); /* (b, n, 1) */
    IrNode *xc = ir_label(g, ir_binary(g, IR_SUB, x, mean), "ln.centered");
    IrNode *var = ir_binary(g, IR_DIV, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, xc, xc), -1), cC);
    IrNode *rs = ir_unary(g, IR_RSQRT, ir_binary(g, IR_ADD, var, ir_const(g, 1e-5, IR_F32)));
    IrNode *lnw = ir_param(g, "ln.weight", 1, s_c);
    IrNode *h = ir_label(g, ir_binary(g, IR_MUL, ir_binary(g, IR_MUL, xc, rs), lnw), "ln");

    /* causal attention, H heads of HD */
    IrNode *wq = ir_param(g, "attn.q.weight", 2, s_cc);
    IrNode *wk = ir_param(g, "attn.k.weight", 2, s_cc); /* stored transposed */
    IrNode *wv = ir_param(g, "attn.v.weight", 2, s_cc);
    IrNode *q = ir_permute(g, ir_reshape(g, ir_matmul(g, h, wq, 0), 4, s_heads), to_heads);
    IrNode *k = ir_permute(g, ir_reshape(g, ir_matmul(g, h, wk, 1), 4, s_heads), to_heads);
    IrNode *v = ir_permute(g, ir_reshape(g, ir_matmul(g, h, wv, 0), 4, s_heads), to_heads);
    ir_label(g, q, "q.heads");
    ir_label(g, k, "k.heads");
    IrNode *scores = ir_matmul(g, q, k, 1); /* (b, H, n, n) */
    IrNode *scale = ir_const(g, 1.0 / sqrt(HD), IR_F32);
    IrNode *scaled = ir_binary(g, IR_MUL, scores, scale);
    IrNode *ar = ir_arange(g, D(0), N, IR_I64);
    IrNode *causal = ir_binary(g, IR_LE, ir_reshape(g, ar, 2, s_row), ir_reshape(g, ar, 2, s_col));
    IrNode *masked = ir_where(g, ir_label(g, causal, "causal"), scaled, ir_const(g, -INFINITY, IR_F32));
    IrNode *att = ir_label(g, ir_softmax(g, masked), "att");
    IrNode *y = ir_permute(g, ir_matmul(g, att, v, 0), to_heads); /* (b, n, H, HD) */
    IrNode *wo = ir_param(g, "attn.out.weight", 2, s_cc);
    IrNode *x1 = ir_binary(g, IR_ADD, x, ir_matmul(g, ir_reshape(g, y, 3, s_bnc), wo, 0));
    ir_label(g, x1, "x1");

    /* MLP */
    IrNode *w1 = ir_param(g, "mlp.fc.weight", 2, s_c4);
    IrNode *w2 = ir_param(g, "mlp.proj.weight", 2, s_4c);
    IrNode *fc = ir_unary(g, IR_GELU, ir_matmul(g, x1, w1, 0)); /* (b, n, 4C) */
    IrNode *x2 = ir_binary(g, IR_ADD, x1, ir_matmul(g, fc, w2, 0));

    IrNode *logits = ir_label(g, ir_matmul(g, x2, wte, 1), "logits"); /* (b, n, V) */
    IrNode *loss = ir_label(g, ir_xent(g, logits, tgt), "loss");
    ir_output(g, "logits", logits);
    ir_output(g, "loss", loss);
    return g;
}

/* the ops the GPT leaves out, symbolic dims (m+n-8, 2*m+2*n, n-1), odd names and floats */
static IrGraph *build_misc(void)
{
    IrGraph *g = ir_graph_new("misc");
    IrDim M = ir_dim_sym(ir_graph_add_sym(g, "m", 0));
    IrDim N = ir_dim_sym(ir_graph_add_sym(g, "n", 64));
    IrDim MN = ir_dim_add(M, N);
    IrDim s_n4[] = {N, D(4)}, s_m4[] = {M, D(4)}, s_2n4[] = {D(2), N, D(4)};
    const int rot[] = {2, 0, 1};

    IrNode *x = ir_input(g, "x", IR_F32, 2, s_n4);                /* (n, 4) */
    IrNode *odd = ir_input(g, "x y\"z\\w\n\t\x01é", IR_F32, 2, s_n4); /* label becomes x_y_z_w... */
    IrNode *temp = ir_input(g, "temperature", IR_F32, 0, NULL);  /* scalar */
    IrNode *mem = ir_buffer(g, "memory", 2, s_m4);               /* (m, 4) */
    IrNode *cat = ir_label(g, ir_concat(g, mem, x, 0), "cat");   /* (m+n, 4) */
    ir_label(g, ir_slice(g, cat, 0, ir_dim_addc(MN, -8), D(8)), "tail"); /* (8, 4) from m+n-8 */
    ir_concat(g, cat, cat, -2);                                  /* (2*m+2*n, 4) */
    IrNode *shifted = ir_slice(g, x, 0, D(1), ir_dim_addc(N, -1)); /* (n-1, 4) */
    ir_label(g, shifted, "shifted");

    static const IrOp unary[] = {IR_NEG, IR_EXP, IR_LOG, IR_SQRT, IR_RECIP, IR_TANH,
                                 IR_SIGMOID, IR_RELU, IR_SIN, IR_COS, IR_ABS, IR_ERF};
    IrNode *acc = ir_binary(g, IR_DIV, x, temp);
    for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
        acc = ir_binary(g, IR_MAX, ir_unary(g, unary[i], acc), ir_binary(g, IR_MIN, acc, odd));
    IrNode *neg = ir_binary(g, IR_LT, acc, ir_const(g, 0, IR_F32));
    IrNode *same = ir_binary(g, IR_EQ, acc, x);
    IrNode *both = ir_unary(g, IR_NOT, ir_binary(g, IR_AND, neg, same));
    IrNode *either = ir_label(g, ir_binary(g, IR_OR, both, same), "either");
    IrNode *fl = ir_cast(g, either, IR_F32);
    ir_cast(g, x, IR_I32);
    IrNode *rmax = ir_reduce(g, IR_RMAX, fl, 1);                 /* (n, 1) */
    IrNode *wide = ir_expand(g, rmax, 2, s_n4);                  /* (n, 4) */
    IrNode *up = ir_expand(g, wide, 3, s_2n4);                   /* (2, n, 4) */
    IrNode *rotated = ir_label(g, ir_permute(g, up, rot), "rotated"); /* (4, 2, n) */

    IrNode *rel = ir_relpos(g, N, MN, 32, 128, 1);                /* i64 (n, m+n) */
    ir_label(g, rel, "rp");
    IrNode *pos = ir_arange(g, M, N, IR_I32);                    /* i32 (n), from m */
    ir_label(g, ir_gather_grad(g, x, pos, MN), "scattered");     /* (m+n, 4) */
    IrNode *seed = ir_input(g, "seed", IR_I64, 0, NULL);
    ir_label(g, ir_rand(g, seed, x, 3), "noise");                /* f32 (n, 4) */
    IrDim s_w[] = {D(3), D(4)}, s_sc[] = {D(3), D(2)};
    IrNode *w8 = ir_buffer_i8(g, "proj.weight", 2, s_w);        /* i8 (3, 4): int8 weights */
    ir_label(g, ir_matmul_q8(g, x, w8, ir_buffer(g, "proj.weight.scale", 2, s_sc), 3), "q8"); /* (n, 3) */

    /* floats that need care: every one reads back bit for bit */
    const double vals[] = {INFINITY, -INFINITY, NAN, -FLT_MAX, 0.1, 1.0 / 3, 1e-300, 5e-324, -0.0,
                           1e300, 123456789, 0.044194173824159216};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        ir_const(g, vals[i], IR_F32);
    ir_label(g, ir_const(g, 3, IR_I64), "three");

    ir_output(g, "rotated", rotated);
    ir_output(g, "grad.x", shifted);
    ir_output(g, "weird name", rel);
    ir_output(g, "1st", fl);
    return g;
}

/* derived symbols (Transformer-XL: q = min(n+p, 6) memory rows out, r = n+p uncapped) and the
 * row-ordering ops of sparse top-k attention and entmax15 */
static IrGraph *build_xl(void)
{
    IrGraph *g = ir_graph_new("xl");
    IrDim B = ir_dim_sym(ir_graph_add_sym(g, "b", 0));
    IrDim N = ir_dim_sym(ir_graph_add_sym(g, "n", 8));
    IrDim P = ir_dim_sym(ir_graph_add_sym(g, "p", 6));
    IrDim NP = ir_dim_add(N, P);
    IrDim Q = ir_dim_sym(ir_graph_add_derived_sym(g, "q", NP, 6));
    IrDim R = ir_dim_sym(ir_graph_add_derived_sym(g, "r", NP, 0));
    IrDim s_mem[] = {B, P, D(4)}, s_x[] = {B, N, D(4)};
    IrNode *all = ir_concat(g, ir_input(g, "mems", IR_F32, 3, s_mem), ir_input(g, "x", IR_F32, 3, s_x), 1);
    ir_output(g, "mems", ir_label(g, ir_slice(g, all, 1, ir_dim_sub(NP, Q), Q), "kept"));
    ir_output(g, "all", ir_slice(g, all, 1, D(0), R));
    IrNode *kth = ir_label(g, ir_kth_largest(g, all, 2), "kth");    /* (b, n+p, 1) */
    ir_output(g, "sparse", ir_where(g, ir_binary(g, IR_LT, all, kth), ir_const(g, -FLT_MAX, IR_F32), all));
    ir_output(g, "entmax", ir_label(g, ir_entmax15(g, all), "weights"));
    return g;
}

static IrGraph *build_empty(void) { return ir_graph_new("empty"); }

static IrGraph *build_quoted_name(void)
{
    IrGraph *g = ir_graph_new("my model-v2");
    IrNode *c = ir_label(g, ir_const(g, 2.5, IR_F32), "12"); /* label "12" becomes v12 */
    ir_output(g, "", c);
    return g;
}

/* a long chain: the parser stays linear enough for model-size graphs */
static IrGraph *build_chain(void)
{
    IrGraph *g = ir_graph_new("chain");
    IrDim s[] = {ir_dim_sym(ir_graph_add_sym(g, "n", 0))};
    IrNode *x = ir_input(g, "x", IR_F32, 1, s);
    for (int i = 0; i < 3000; i++) {
        x = ir_binary(g, IR_ADD, x, ir_const(g, i, IR_F32));
        if (i % 3 == 0)
            ir_label(g, x, "step%d", i);
    }
    ir_output(g, "y", x);
    return g;
}

typedef IrGraph *(*BuildFn)(void);
/* the fused ops of passes/ (fuse_attention.c, fuse_elementwise.c) */
static IrGraph *build_fused(void)
{
    IrGraph *g = ir_graph_new("fused");
    IrDim B = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), N = ir_dim_sym(ir_graph_add_sym(g, "n", 64));
    IrDim sq[] = {B, D(2), N, D(4)}, sm[] = {B, D(1), N, N}, sx[] = {B, N, D(4)}, sw[] = {D(4)};
    IrNode *q = ir_input(g, "q", IR_F32, 4, sq), *k = ir_input(g, "k", IR_F32, 4, sq), *v = ir_input(g, "v", IR_F32, 4, sq);
    IrNode *mask = ir_input(g, "mask", IR_BOOL, 4, sm);
    IrNode *f = ir_label(g, ir_attention(g, q, k, v, NULL, mask, ir_const(g, 0.5, IR_F32), 1, 1), "attn");
    IrNode *grad = ir_label(g, ir_attention_grad(g, f, ir_input(g, "dout", IR_F32, 4, sq)), "attn.grad");
    IrDim skv[] = {B, D(1), N, D(4)}; /* grouped key/values: one head read by both query heads */
    IrNode *kg = ir_input(g, "kg", IR_F32, 4, skv), *vg = ir_input(g, "vg", IR_F32, 4, skv);
    ir_output(g, "grouped", ir_label(g, ir_attention(g, q, kg, vg, NULL, NULL, ir_const(g, 0.5, IR_F32), 1, 0), "attn.grouped"));
    IrNode *fg = ir_attention(g, q, kg, vg, NULL, mask, ir_const(g, 0.5, IR_F32), 0, 1); /* and its gradient */
    ir_output(g, "grouped_grad", ir_label(g, ir_attention_grad(g, fg, ir_input(g, "doutg", IR_F32, 4, sq)), "attn.grouped.grad"));
    IrNode *in[2] = {ir_input(g, "x", IR_F32, 3, sx), ir_param(g, "w", 1, sw)};
    IrNode *norm = ir_fused(g, "sum($0);mul(%0,0.25:f32);sub($0,%1);mul(%2,%2);sum(%3);rsqrt(%4);mul(%2,%5);mul(%6,$1)",
                            2, in, 3, sx);
    ir_output(g, "attn", f);
    ir_output(g, "grad", grad);
    ir_output(g, "norm", ir_label(g, norm, "norm"));
    return g;
}

static const BuildFn builders[] = {build_gpt, build_misc, build_xl, build_empty, build_quoted_name, build_chain,
                                   build_fused};
enum { NBUILDERS = sizeof builders / sizeof builders[0] };

/* ---- round trips ---- */

static void check_same_graph(const IrGraph *a, const IrGraph *b)
{
    ck_assert_str_eq(a->name, b->name);
    ck_assert_int_eq(a->nsyms, b->nsyms);
    for (int s = 0; s < a->nsyms; s++) {
        ck_assert_str_eq(a->sym_name[s], b->sym_name[s]);
        ck_assert(a->sym_max[s] == b->sym_max[s]);
        ck_assert_int_eq(a->sym_derived[s], b->sym_derived[s]);
        ck_assert(ir_dim_eq(a->sym_def[s], b->sym_def[s]));
    }
    ck_assert_int_eq(a->nnodes, b->nnodes);
    for (int i = 0; i < a->nnodes; i++) {
        const IrNode *x = a->nodes[i], *y = b->nodes[i];
        ck_assert_int_eq(x->op, y->op);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->rank, y->rank);
        for (int d = 0; d < x->rank; d++)
            ck_assert(ir_dim_eq(x->shape[d], y->shape[d]));
        ck_assert_int_eq(x->nin, y->nin);
        for (int k = 0; k < x->nin; k++)
            ck_assert_int_eq(x->in[k]->id, y->in[k]->id);
        ck_assert(memcmp(x->ia, y->ia, sizeof x->ia) == 0);
        ck_assert(ir_dim_eq(x->d, y->d));
        ck_assert(memcmp(x->perm, y->perm, sizeof x->perm) == 0);
        ck_assert((isnan(x->f) && isnan(y->f)) || memcmp(&x->f, &y->f, sizeof x->f) == 0);
        ck_assert((x->s == NULL) == (y->s == NULL));
        if (x->s)
            ck_assert_str_eq(x->s, y->s);
        ck_assert((x->label == NULL) == (y->label == NULL));
        if (x->label)
            ck_assert_str_eq(x->label, y->label);
    }
    ck_assert_int_eq(a->noutputs, b->noutputs);
    for (int i = 0; i < a->noutputs; i++) {
        ck_assert_str_eq(a->outputs[i].name, b->outputs[i].name);
        ck_assert_int_eq(a->outputs[i].node->id, b->outputs[i].node->id);
    }
}

START_TEST(test_roundtrip)
{
    IrGraph *g = builders[_i]();
    char err[1024];
    ck_assert_msg(ir_graph_error(g) == NULL, "builder %d: %s", _i, ir_graph_error(g));
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s", err);
    char *s1 = ir_print_str(g);
    ck_assert_ptr_nonnull(s1);
    IrGraph *g2 = ir_parse(s1, "built.ir", err, sizeof err);
    ck_assert_msg(g2 != NULL, "%s\n--- text:\n%s", err, s1);
    char *s2 = ir_print_str(g2);
    ck_assert_str_eq(s1, s2);
    check_same_graph(g, g2);
    ck_assert_msg(ir_verify(g2, err, sizeof err) == 0, "%s", err);

    /* ir_print writes the same text as ir_print_str */
    FILE *fp = tmpfile();
    ck_assert_ptr_nonnull(fp);
    ir_print(g2, fp);
    long len = ftell(fp);
    ck_assert_int_eq(len, (long)strlen(s1));
    fclose(fp);

    free(s1);
    free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
}
END_TEST

START_TEST(test_every_op_covered)
{
    int seen[IR_NUM_OPS] = {0};
    for (int b = 0; b < NBUILDERS; b++) {
        IrGraph *g = builders[b]();
        for (int i = 0; i < g->nnodes; i++)
            seen[g->nodes[i]->op]++;
        ir_graph_free(g);
    }
    for (int op = 0; op < IR_NUM_OPS; op++)
        ck_assert_msg(seen[op], "op '%s' is in no test graph of test_ir_text.c: add it to build_misc",
                      ir_ops[op].name);
}
END_TEST

/* The named indices into ia[] (ir.h, IR_IA_*) agree with ops.def: each names the k-th "i:"
 * attribute of its ops, and every i-attribute of every op has a name in this table. */
START_TEST(test_attr_names)
{
    static const struct { IrOp op; const char *name; int index; } named[] = {
        {IR_SUM, "axis", IR_IA_AXIS}, {IR_RMAX, "axis", IR_IA_AXIS}, {IR_SLICE, "axis", IR_IA_AXIS},
        {IR_CONCAT, "axis", IR_IA_AXIS}, {IR_KTH_LARGEST, "k", IR_IA_K},
        {IR_MATMUL, "transpose_b", IR_IA_TRANSPOSE_B}, {IR_RAND, "stream", IR_IA_STREAM},
        {IR_RELPOS, "buckets", IR_IA_BUCKETS}, {IR_RELPOS, "max_distance", IR_IA_MAX_DISTANCE},
        {IR_RELPOS, "causal", IR_IA_REL_CAUSAL}, {IR_ATTENTION, "causal", IR_IA_CAUSAL},
        {IR_ATTENTION, "stats", IR_IA_STATS}, {IR_ATTENTION, "window", IR_IA_WINDOW},
        {IR_ATTENTION, "bound", IR_IA_BOUND},
        {IR_ATTENTION_GRAD, "causal", IR_IA_GRAD_CAUSAL}, {IR_ATTENTION_GRAD, "window", IR_IA_GRAD_WINDOW},
        {IR_MATMUL_Q8, "transpose_b", IR_IA_TRANSPOSE_B}, {IR_MATMUL_Q8, "group", IR_IA_GROUP},
    };
    int n = (int)(sizeof named / sizeof named[0]);
    for (int op = 0; op < IR_NUM_OPS; op++) {
        IrSigIter it = {ir_ops[op].attrs, 0, "", 0};
        while (ir_sig_next(&it)) {
            if (it.kind != 'i')
                continue;
            int found = 0;
            for (int i = 0; i < n; i++)
                if ((int)named[i].op == op && !strcmp(named[i].name, it.name)) {
                    ck_assert_msg(named[i].index == it.ik, "%s's %s is ia[%d] in ops.def, ia[%d] in ir.h",
                                  ir_ops[op].name, it.name, it.ik, named[i].index);
                    found = 1;
                }
            ck_assert_msg(found, "%s's i-attribute %s has no IR_IA_* name in ir.h (add it, and here)",
                          ir_ops[op].name, it.name);
        }
    }
}
END_TEST

START_TEST(test_gpt_text)
{
    /* spot checks of the format itself */
    IrGraph *g = build_gpt();
    char *s = ir_print_str(g);
    const char *want[] = {
        "graph gpt(b, n <= 128) {\n",
        "  %tokens = input \"tokens\" : i64[b, n]\n",
        "  %token_emb.weight = param \"token_emb.weight\" : f32[50, 16]\n",
        "  %emb = gather %token_emb.weight, %tokens : f32[b, n, 16]\n",
        "  %pos = slice %pos_emb.weight [axis=0, start=0] : f32[n, 16]\n",
        " = const 0.35355339059327373 : f32[]\n",
        " = const 1e-05 : f32[]\n",
        " = const -inf : f32[]\n",
        "  %q.heads = permute ",
        " [perm=(0, 2, 1, 3)] : f32[b, 2, n, 8]\n",
        " = arange [start=0] : i64[n]\n",
        "  %causal = le ",
        "  %loss = cross_entropy %logits, %targets : f32[]\n",
        "  output logits = %logits\n  output loss = %loss\n}\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(s, want[i]), "missing '%s' in:\n%s", want[i], s);
    free(s);
    ir_graph_free(g);

    g = build_misc();
    s = ir_print_str(g);
    const char *want2[] = {
        "graph misc(m, n <= 64) {\n",
        "  %x_y_z_w_____ = input \"x y\\\"z\\\\w\\n\\t\\x01é\" : f32[n, 4]\n",
        "  %temperature = input \"temperature\" : f32[]\n",
        "  %memory = buffer \"memory\" : f32[m, 4]\n",
        "  %cat = concat %memory, %x [axis=0] : f32[m+n, 4]\n",
        "  %tail = slice %cat [axis=0, start=m+n-8] : f32[8, 4]\n",
        " = concat %cat, %cat [axis=0] : f32[2*m+2*n, 4]\n",
        "  %shifted = slice %x [axis=0, start=1] : f32[n-1, 4]\n",
        "  %rotated = permute ",
        " [perm=(2, 0, 1)] : f32[4, 2, n]\n",
        "  %rp = relpos_bucket [buckets=32, max_distance=128, causal=1] : i64[n, m+n]\n",
        " = arange [start=m] : i32[n]\n",
        " = const inf : f32[]\n",
        " = const nan : f32[]\n",
        " = const -3.4028234663852886e+38 : f32[]\n",
        " = const 0.1 : f32[]\n",
        " = const 0.3333333333333333 : f32[]\n",
        " = const 4.94065645841247e-324 : f32[]\n",
        " = const -0 : f32[]\n",
        " = const 123456789 : f32[]\n",
        " = const 0.044194173824159216 : f32[]\n",
        "  %three = const 3 : i64[]\n",
        "  output grad.x = %shifted\n",
        "  output \"weird name\" = %rp\n",
        "  output \"1st\" = %",
    };
    for (size_t i = 0; i < sizeof want2 / sizeof want2[0]; i++)
        ck_assert_msg(strstr(s, want2[i]), "missing '%s' in:\n%s", want2[i], s);
    free(s);
    ir_graph_free(g);

    g = build_xl();
    s = ir_print_str(g);
    const char *want3[] = {
        "graph xl(b, n <= 8, p <= 6, q = min(n+p, 6), r = n+p) {\n",
        "  %kept = slice %",
        " [axis=1, start=n+p-q] : f32[b, q, 4]\n",
        " [axis=1, start=0] : f32[b, r, 4]\n",
        "  %kth = kth_largest %",
        " [k=2] : f32[b, n+p, 1]\n",
        "  %weights = entmax15 %",
        "  output mems = %kept\n",
    };
    for (size_t i = 0; i < sizeof want3 / sizeof want3[0]; i++)
        ck_assert_msg(strstr(s, want3[i]), "missing '%s' in:\n%s", want3[i], s);
    free(s);
    ir_graph_free(g);

    g = build_quoted_name();
    s = ir_print_str(g);
    ck_assert_str_eq(s, "graph \"my model-v2\"() {\n"
                        "  %v12 = const 2.5 : f32[]\n"
                        "  output \"\" = %v12\n"
                        "}\n");
    free(s);
    ir_graph_free(g);
}
END_TEST

/* ir_graph_add_derived_sym: earlier symbols only, names once; values; copies; the verifier */
START_TEST(test_derived_symbols)
{
    IrGraph *g = ir_graph_new("derived");
    int n = ir_graph_add_sym(g, "n", 8), p = ir_graph_add_sym(g, "p", 6);
    IrDim np = ir_dim_add(ir_dim_sym(n), ir_dim_sym(p));
    int q = ir_graph_add_derived_sym(g, "q", np, 6);
    int r = ir_graph_add_derived_sym(g, "r", ir_dim_addc(ir_dim_sym(q), -1), 0);
    ck_assert_int_eq(q, 2);
    ck_assert_int_eq(r, 3);
    int64_t v[IR_MAXSYM] = {3, 0, -1, -1};
    ir_graph_derive_syms(g, v);
    ck_assert(v[q] == 3 && v[r] == 2);
    v[0] = 5, v[1] = 4;
    ir_graph_derive_syms(g, v);
    ck_assert(v[q] == 6 && v[r] == 5); /* capped */
    IrGraph *c = ir_graph_new("copy");
    ir_graph_copy_syms(c, g);
    ck_assert_int_eq(c->nsyms, 4);
    ck_assert(c->sym_derived[q] && c->sym_max[q] == 6 && ir_dim_eq(c->sym_def[q], np));
    ck_assert(c->sym_derived[r] && c->sym_max[r] == 0 && !c->sym_derived[p]);
    char err[256];
    ck_assert_int_eq(ir_verify(g, err, sizeof err), 0);
    g->sym_def[q].k[r] = 1; /* by hand: q = n+p+r, r declared after it */
    ck_assert_int_eq(ir_verify(g, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "derived symbol 'q' uses 'r', which is not declared before it"), "%s", err);
    /* a later symbol, a name taken: errors, no symbol added */
    IrDim later = ir_dim_sym(5);
    ck_assert_int_eq(ir_graph_add_derived_sym(c, "s", later, 0), -1);
    ck_assert_msg(strstr(ir_graph_error(c), "may only use the symbols declared before it"), "%s", ir_graph_error(c));
    ck_assert_int_eq(c->nsyms, 4);
    IrGraph *d = ir_graph_new("twice");
    ir_graph_add_sym(d, "n", 0);
    ck_assert_int_eq(ir_graph_add_derived_sym(d, "n", ir_dim(3), 0), -1);
    ck_assert_msg(strstr(ir_graph_error(d), "symbol 'n' declared twice"), "%s", ir_graph_error(d));
    ir_graph_free(g);
    ir_graph_free(c);
    ir_graph_free(d);
}
END_TEST

START_TEST(test_labels)
{
    IrGraph *g = ir_graph_new("labels");
    IrNode *a = ir_const(g, 1, IR_F32), *b = ir_const(g, 2, IR_F32), *c = ir_const(g, 3, IR_F32);
    IrNode *d = ir_const(g, 4, IR_F32), *e = ir_const(g, 5, IR_F32);
    ck_assert_str_eq(ir_label(g, a, "12")->label, "v12");
    ck_assert_str_eq(ir_label(g, b, "a-b c")->label, "a_b_c");
    ck_assert_str_eq(ir_label(g, c, "%s", "")->label, "v");
    ck_assert_str_eq(ir_label(g, d, "ok.name_1")->label, "ok.name_1");
    ck_assert_str_eq(ir_label(g, e, "a-b c")->label, "a_b_c.1");
    ck_assert_ptr_null(ir_label(g, NULL, "x"));
    char *s = ir_print_str(g), err[512];
    IrGraph *g2 = ir_parse(s, "labels.ir", err, sizeof err);
    ck_assert_msg(g2 != NULL, "%s", err);
    char *s2 = ir_print_str(g2);
    ck_assert_str_eq(s, s2);
    ck_assert_ptr_nonnull(strstr(s, "%a_b_c.1 = const 5 : f32[]"));
    free(s);
    free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
}
END_TEST

/* every double, printed as a const, reads back bit for bit */
START_TEST(test_float_roundtrip)
{
    IrGraph *g = ir_graph_new("floats");
    for (int i = 0; i < 3000; i++) {
        uint64_t bits = rnd();
        double v;
        if (i % 3 == 0) {
            float f; /* f32 values are what models hold */
            uint32_t fb = (uint32_t)bits;
            memcpy(&f, &fb, sizeof f);
            v = f;
        } else
            memcpy(&v, &bits, sizeof v);
        if (isnan(v))
            continue;
        ir_const(g, v, IR_F32);
    }
    char *s = ir_print_str(g), err[512];
    IrGraph *g2 = ir_parse(s, "floats.ir", err, sizeof err);
    ck_assert_msg(g2 != NULL, "%s", err);
    ck_assert_int_eq(g->nnodes, g2->nnodes);
    for (int i = 0; i < g->nnodes; i++)
        ck_assert_msg(memcmp(&g->nodes[i]->f, &g2->nodes[i]->f, sizeof(double)) == 0,
                      "%.17g became %.17g", g->nodes[i]->f, g2->nodes[i]->f);
    free(s);
    ir_graph_free(g);
    ir_graph_free(g2);
}
END_TEST

/* ---- golden files ---- */

START_TEST(test_golden)
{
    const char *dir = XTC_SOURCE_DIR "/tests/ir";
    DIR *dp = opendir(dir);
    ck_assert_msg(dp != NULL, "cannot open %s", dir);
    int count = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 3, ".ir") != 0)
            continue;
        char in[1024], exp[1024], act[1024], err[1024];
        snprintf(in, sizeof in, "%s/%s", dir, de->d_name);
        snprintf(exp, sizeof exp, "%s/%.*s.expected", dir, (int)(len - 3), de->d_name);
        snprintf(act, sizeof act, "%s/%.*s.actual", XTC_BINARY_DIR, (int)(len - 3), de->d_name);
        char *src = harness_read_file(in, NULL), *want = harness_read_file(exp, NULL);
        ck_assert_msg(src && want, "%s or %s is missing", in, exp);
        IrGraph *g = ir_parse(src, de->d_name, err, sizeof err);
        ck_assert_msg(g != NULL, "%s", err);
        ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s: %s", de->d_name, err);
        char *got = ir_print_str(g);
        if (strcmp(got, want) != 0)
            write_file(act, got);
        ck_assert_msg(strcmp(got, want) == 0, "%s does not print as %s; the text printed is in %s",
                      in, exp, act);
        /* the expected text is itself a fixed point */
        IrGraph *g2 = ir_parse(want, exp, err, sizeof err);
        ck_assert_msg(g2 != NULL, "%s", err);
        char *again = ir_print_str(g2);
        ck_assert_str_eq(again, want);
        free(again);
        free(got);
        free(src);
        free(want);
        ir_graph_free(g);
        ir_graph_free(g2);
        count++;
    }
    closedir(dp);
    ck_assert_msg(count >= 3, "only %d golden files in %s", count, dir);
}
END_TEST

/* ---- errors ---- */

#define HEAD "graph t(b, n <= 16) {\n  %x = input \"x\" : f32[b, n]\n"

typedef struct {
    const char *text;
    const char *message; /* a substring of the error */
} ErrorCase;

static const ErrorCase error_cases[] = {
    /* header and structure */
    {"", "t.ir:1:1: error: expected 'graph NAME(symbols) {', found end of input"},
    {"grph t() {\n}\n", "expected 'graph NAME(symbols) {', found 'grph'"},
    {"graph t(n, n) {\n}\n", "symbol 'n' declared twice"},
    {"graph t(a, b, c, d, e, f, g, h, i) {\n}\n", "too many symbols (at most 8)"},
    {"graph t(n <= 0) {\n}\n", "the bound of 'n' must be positive"},
    {"graph t(n <= ) {\n}\n", "expected an upper bound, found ')'"},
    {"graph t() \n}\n", "expected '{' after the graph header, found end of line"},
    /* derived symbols: min(dim, cap) or dim, of the symbols declared before */
    {"graph t(n, q = min(q, 4)) {\n}\n", "t.ir:1:20: error: unknown symbol 'q'"},
    {"graph t(q = n, n) {\n}\n", "unknown symbol 'n' (symbols are declared in the graph header)"},
    {"graph t(n, q = min(n, 0)) {\n}\n", "the cap of 'q' must be positive"},
    {"graph t(n, q = min(n 4)) {\n}\n", "expected ',' and the cap after the dimension, found '4'"},
    {"graph t(n, q = min(n, 4) {\n}\n", "expected ',' or ')' after the symbol, found '{'"},
    {"graph t(n, q = min(n, 4 {\n}\n", "expected ')' after the cap, found '{'"},
    {"graph t(n, q = ) {\n}\n", "expected a dimension (such as 64, n, n+3 or 2*n), found ')'"},
    {"graph t(n, n = n+1) {\n}\n", "symbol 'n' declared twice"},
    /* limits on sums of declared symbols */
    {"graph t(n, c, c+n) {\n}\n", "expected '<=' and a bound after the limit's dimension"},
    {"graph t(n, c, c+n <= 0) {\n}\n", "a limit on symbols must be positive"},
    {"graph t(n, c+n <= 4) {\n}\n", "unknown symbol 'c'"},
    {"graph t() { junk\n}\n", "expected end of line, found 'junk'"},
    {HEAD, "missing '}' at the end of the graph"},
    {HEAD "}\n%y = exp %x : f32[b, n]\n", "t.ir:4:1: error: unexpected '%' after the end of the graph"},
    {HEAD "  exp %x : f32[b, n]\n}\n",
     "expected a node (%name = op ...), an output or '}', found 'exp'"},
    /* values */
    {HEAD "  %y = exp %z : f32[b, n]\n}\n", "t.ir:3:12: error: undefined value %z"},
    {HEAD "  %x = exp %x : f32[b, n]\n}\n", "value %x defined twice (first on line 2)"},
    {HEAD "  %1a = exp %x : f32[b, n]\n}\n", "bad value name '%1a'"},
    {HEAD "  % = exp %x : f32[b, n]\n}\n", "expected a value name after '%'"},
    {HEAD "  %y exp %x : f32[b, n]\n}\n", "expected '=' after the value name, found 'exp'"},
    /* ops and operands */
    {HEAD "  %y = ad %x, %x : f32[b, n]\n}\n", "t.ir:3:8: error: unknown op 'ad'; did you mean 'add'?"},
    {HEAD "  %y = softmx %x : f32[b, n]\n}\n", "unknown op 'softmx'; did you mean 'softmax'?"},
    {HEAD "  %y = relpos [buckets=2, max_distance=1, causal=0] : i64[n, n]\n}\n",
     "did you mean 'relpos_bucket'?"},
    {HEAD "  %y = frobnicate %x : f32[b, n]\n}\n", "unknown op 'frobnicate'\n"},
    {HEAD "  %y = add %x : f32[b, n]\n}\n", "add takes 2 operands, got 1"},
    {HEAD "  %y = exp %x, %x : f32[b, n]\n}\n", "t.ir:3:16: error: exp takes 1 operand"},
    {HEAD "  %y = input %x : f32[b, n]\n}\n", "input takes its name as a quoted string, found '%'"},
    {HEAD "  %y = input y : f32[b, n]\n}\n", "input takes its name as a quoted string, found 'y'"},
    {HEAD "  %y = input \"x\" : f32[n]\n}\n", "input \"x\" declared twice with different types"},
    {HEAD "  %y = input \"\" : f32[n]\n}\n", "input needs a name"},
    {HEAD "  %y = param \"p\" : i64[n]\n}\n", "parameters are f32"},
    {HEAD "  %y = param \"p\" : i8[4, 4]\n}\n", "parameters are f32"},
    {HEAD "  %y = input \"q\" : i8[4]\n}\n", "i8 is the type of quantized weights, buffers only"},
    /* int8 weights: scales of the wrong shape (a weight [3, 16] in groups of 8 has [3, 2]) */
    {HEAD "  %a = input \"a\" : f32[b, 16]\n  %w = buffer \"w\" : i8[3, 16]\n  %s = buffer \"s\" : f32[3, 1]\n"
          "  %y = matmul_q8 %a, %w, %s [transpose_b=1, group=8] : f32[b, 3]\n}\n",
     "scales must be [3, 2] (a weight [3, 16] in groups of 8)"},
    {HEAD "  %w = buffer \"w\" : f32[3, 16]\n  %s = buffer \"s\" : f32[3, 1]\n"
          "  %y = matmul_q8 %x, %w, %s [transpose_b=1, group=16] : f32[b, 3]\n}\n",
     "expects an f32 operand, an i8 weight and f32 scales"},
    /* attributes */
    {HEAD "  %y = sum %x : f32[b, 1]\n}\n", "sum needs the attribute 'axis' (its attributes: axis)"},
    {HEAD "  %y = sum %x [dim=1] : f32[b, 1]\n}\n", "sum has no attribute 'dim' (its attributes: axis)"},
    {HEAD "  %y = exp %x [axis=1] : f32[b, n]\n}\n", "exp has no attribute 'axis' (it has none)"},
    {HEAD "  %y = sum %x [axis=1, axis=1] : f32[b, 1]\n}\n", "attribute 'axis' given twice"},
    /* attention's bound (cosine-sim attention): no bias, a constant scale s > 0, bound x s <= 40 */
    {HEAD "  %z = input \"bias\" : f32[1, 1]\n  %t = const 1 : bool[]\n  %s = const 10 : f32[]\n"
          "  %y = attention %x, %x, %x, %z, %t, %s [causal=0, stats=0, window=0, bound=1] : f32[b, n]\n}\n",
     "a bounded attention takes no bias (a bias has no known bound)"},
    {HEAD "  %z = const 0 : f32[]\n  %t = const 1 : bool[]\n  %s = const 50 : f32[]\n"
          "  %y = attention %x, %x, %x, %z, %t, %s [causal=0, stats=0, window=0, bound=1] : f32[b, n]\n}\n",
     "a bounded attention needs a constant scale s > 0 with bound x s <= 40"},
    {HEAD "  %z = const 0 : f32[]\n  %t = const 1 : bool[]\n  %s = input \"s\" : f32[1, 1]\n"
          "  %y = attention %x, %x, %x, %z, %t, %s [causal=0, stats=0, window=0, bound=1] : f32[b, n]\n}\n",
     "a bounded attention needs a constant scale s > 0 with bound x s <= 40"},
    {HEAD "  %z = const 0 : f32[]\n  %t = const 1 : bool[]\n  %s = const 10 : f32[]\n"
          "  %y = attention %x, %x, %x, %z, %t, %s [causal=0, stats=0, window=0, bound=-1] : f32[b, n]\n}\n",
     "bound is 0 (none) or a positive bound on |q_i| |k_j|"},
    /* grouped key/values: k's and v's heads divide q's; the gradient keeps q's shape (dk, dv in the first heads) */
    {HEAD "  %q = input \"q\" : f32[b, 4, n, 8]\n  %k = input \"k\" : f32[b, 3, n, 8]\n  %z = const 0 : f32[]\n"
          "  %t = const 1 : bool[]\n  %s = const 1 : f32[]\n"
          "  %y = attention %q, %k, %k, %z, %t, %s [causal=0, stats=0, window=0, bound=0] : f32[b, 4, n, 8]\n}\n",
     "k's and v's heads (dimension 1) must be a constant dividing q's (grouped key/values)"},
    {HEAD "  %q = input \"q\" : f32[b, 4, n, 8]\n  %k = input \"k\" : f32[b, 2, n, 8]\n  %v = input \"v\" : f32[b, 4, n, 8]\n"
          "  %z = const 0 : f32[]\n  %t = const 1 : bool[]\n  %s = const 1 : f32[]\n"
          "  %y = attention %q, %k, %v, %z, %t, %s [causal=0, stats=0, window=0, bound=0] : f32[b, 4, n, 8]\n}\n",
     "k and v differ in batch dimension 1"},
    {HEAD "  %q = input \"q\" : f32[b, 4, n, 8]\n  %k = input \"k\" : f32[b, 2, n, 8]\n  %d = input \"d\" : f32[b, 4, n, 8]\n"
          "  %z = const 0 : f32[]\n  %t = const 1 : bool[]\n  %s = const 1 : f32[]\n"
          "  %o = attention %q, %k, %k, %z, %t, %s [causal=0, stats=1, window=0, bound=0] : f32[b, 4, n, 9]\n"
          "  %y = attention_grad %q, %k, %k, %o, %d, %z, %t, %s [causal=0, window=0] : f32[b, 2, 3*n, 8]\n}\n",
     "type mismatch: written f32[b, 2, 3*n, 8], but attention_grad gives f32[b, 4, 3*n, 8]"},
    {HEAD "  %y = sum %x [axis=99999999999999999999] : f32[b, 1]\n}\n", "integer out of range"},
    {HEAD "  %y = sum %x [axis=5] : f32[b, 1]\n}\n", "sum %x: axis 5 out of range for rank 2"},
    {HEAD "  %y = kth_largest %x [k=0] : f32[b, 1]\n}\n", "kth_largest %x: k must be at least 1, got 0"},
    {HEAD "  %y = sum %x [axis=1 : f32[b, 1]\n}\n",
     "expected ',' or ']' after the attribute, found ':'"},
    {HEAD "  %y = permute %x [perm=(1)] : f32[n, b]\n}\n",
     "permutation of 1 axes for an operand of rank 2"},
    {HEAD "  %y = permute %x [perm=(1, 9)] : f32[n, b]\n}\n", "axis 9 out of range in the permutation"},
    {HEAD "  %y = permute %x [perm=(1, 1)] : f32[n, b]\n}\n", "perm is not a permutation of 0..1"},
    {HEAD "  %y = slice %x [axis=1, start=n+] : f32[b, 1]\n}\n",
     "expected a dimension (such as 64, n, n+3 or 2*n)"},
    {HEAD "  %y = slice %x [axis=1, start=n] : f32[b, 1]\n}\n", "slice out of bounds"},
    {HEAD "  %y = const 1e999 : f32[]\n}\n", "number out of range: 1e999"},
    {HEAD "  %y = const 1.5x : f32[]\n}\n", "bad number: '1.5x'"},
    {HEAD "  %y = const : f32[]\n}\n", "expected a number, found ':'"},
    /* types and dims */
    {HEAD "  %y = exp %x\n}\n", "expected ':' and the type, found end of line"},
    {HEAD "  %y = exp %x : f16[b, n]\n}\n", "unknown type 'f16' (the types are f32, i32, i64 and bool)"},
    {HEAD "  %y = exp %x : f32[b, q]\n}\n",
     "t.ir:3:24: error: unknown symbol 'q' (symbols are declared in the graph header)"},
    {HEAD "  %y = exp %x : f32[b, n\n}\n", "expected ',' or ']' in the shape, found end of line"},
    {HEAD "  %y = exp %x : f32[b, n, ]\n}\n",
     "expected a dimension (such as 64, n, n+3 or 2*n), found ']'"},
    {HEAD "  %y = exp %x : f32[200*n, b]\n}\n", "coefficient of 'n' out of range"},
    {HEAD "  %y = exp %x : f32[9223372036854775807+1]\n}\n", "dimension out of range"},
    {HEAD "  %y = reshape %x : f32[1, 1, 1, 1, 1, 1, 1]\n}\n", "more than 6 dimensions"},
    {HEAD "  %y = sum %x [axis=1] : f32[b, n]\n}\n",
     "t.ir:3:26: error: type mismatch: written f32[b, n], but sum gives f32[b, 1]"},
    {HEAD "  %y = exp %x : i64[b, n]\n}\n", "type mismatch: written i64[b, n], but exp gives f32[b, n]"},
    {HEAD "  %y = matmul %x, %x [transpose_b=0] : f32[b, n]\n}\n",
     "inner dimensions differ: ? vs ? (operands: f32[b, n], f32[b, n])"},
    {HEAD "  %y = reshape %x : f32[n, n]\n}\n",
     "reshape %x: cannot reshape [?, ?] to [?, ?] (operands: f32[b, n])"},
    {HEAD "  %y = add %x, %x : f32[b, n] %x\n}\n", "expected end of line, found '%'"},
    /* strings */
    {HEAD "  %y = input \"abc : f32[]\n}\n", "t.ir:3:14: error: unterminated string"},
    {HEAD "  %y = input \"a\\q\" : f32[]\n}\n", "unknown escape in string: backslash and 'q'"},
    {HEAD "  %y = input \"a\\x0\" : f32[]\n}\n", "\\x needs two hex digits"},
    {HEAD "  %y = input \"a\\x00\" : f32[]\n}\n", "\\x00 is not allowed in a string"},
    /* outputs */
    {HEAD "  output y = %nope\n}\n", "undefined value %nope"},
    {HEAD "  output y = %x\n  output y = %x\n}\n", "output 'y' defined twice"},
    {HEAD "  output = %x\n}\n", "expected an output name, found '='"},
    {HEAD "  output y %x\n}\n", "expected '=' after the output name, found '%'"},
};

START_TEST(test_errors)
{
    const ErrorCase *c = &error_cases[_i];
    char err[1024];
    memset(err, 'z', sizeof err);
    IrGraph *g = ir_parse(c->text, "t.ir", err, sizeof err);
    ck_assert_msg(g == NULL, "case %d parsed but should fail with '%s':\n%s", _i, c->message, c->text);
    ck_assert_msg(strncmp(err, "t.ir:", 5) == 0 && strstr(err, ": error: "), "case %d: bad format: %s",
                  _i, err);
    ck_assert_msg(strstr(err, c->message), "case %d: expected '%s' in:\n%s", _i, c->message, err);
}
END_TEST

START_TEST(test_error_caret)
{
    char err[1024];
    const char *text = HEAD "\t%y = ad %x, %x : f32[b, n]\n}\n";
    ck_assert_ptr_null(ir_parse(text, "t.ir", err, sizeof err));
    ck_assert_str_eq(err, "t.ir:3:7: error: unknown op 'ad'; did you mean 'add'?\n"
                          "  \t%y = ad %x, %x : f32[b, n]\n"
                          "  \t     ^");
    /* tiny or missing error buffers are fine */
    char small[8];
    ck_assert_ptr_null(ir_parse(text, "t.ir", small, sizeof small));
    ck_assert_str_eq(small, "t.ir:3:");
    ck_assert_ptr_null(ir_parse(text, "t.ir", small, 1));
    ck_assert_str_eq(small, "");
    ck_assert_ptr_null(ir_parse(text, "t.ir", NULL, 0));
    ck_assert_ptr_null(ir_parse(NULL, NULL, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "<input>:1:1: error:"));
}
END_TEST

/* what the parser accepts beyond what the printer writes */
START_TEST(test_lenient_input)
{
    const char *text =
        "# comments and blank lines anywhere\n\n"
        "  graph t ( n<=8 ,b ) {   # header comment\r\n"
        "\t%x=input \"x\":f32[ b , n ]\r\n"
        "\n"
        "  %y = slice %x [ start = -1+n+1-n+2 , axis = 1 ] : f32[b, n*1-2]\n"
        "  %3 = const -5E-1 : f32[]\n"
        "  %z = mul %y, %3 : f32[1*b, 0*n+n-2]\n"
        "  output out = %z # trailing comment\n"
        "}\n# end\n\n";
    char err[1024];
    IrGraph *g = ir_parse(text, "lenient.ir", err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    char *s = ir_print_str(g);
    ck_assert_str_eq(s, "graph t(n <= 8, b) {\n"
                        "  %x = input \"x\" : f32[b, n]\n"
                        "  %y = slice %x [axis=1, start=2] : f32[b, n-2]\n"
                        "  %2 = const -0.5 : f32[]\n"
                        "  %z = mul %y, %2 : f32[b, n-2]\n"
                        "  output out = %z\n"
                        "}\n");
    free(s);
    ir_graph_free(g);

    /* no parentheses at all, and an empty body */
    g = ir_parse("graph bare {\n}", "bare.ir", err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    s = ir_print_str(g);
    ck_assert_str_eq(s, "graph bare() {\n}\n");
    free(s);
    ir_graph_free(g);
}
END_TEST

/* ---- robustness ---- */

/* parses text; when it parses, its print is a fixed point and the graph verifies */
static int parse_and_check(const char *text)
{
    char err[1024];
    IrGraph *g = ir_parse(text, "fuzz.ir", err, sizeof err);
    if (!g) {
        expect_msg(strncmp(err, "fuzz.ir:", 8) == 0, "bad error: %s", err);
        return 0;
    }
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s\n--- text:\n%s", err, text);
    char *s1 = ir_print_str(g);
    IrGraph *g2 = ir_parse(s1, "fuzz2.ir", err, sizeof err);
    ck_assert_msg(g2 != NULL, "printed text does not parse: %s\n--- text:\n%s", err, s1);
    char *s2 = ir_print_str(g2);
    ck_assert_str_eq(s1, s2);
    free(s1);
    free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
    return 1;
}

START_TEST(test_fuzz)
{
    IrGraph *gs[] = {build_gpt(), build_misc()};
    const char alphabet[] = "%=,:[]()<>{}\"\\#\n\t 0123456789-+*.abnmxe_";
    int parsed = 0, total = 0;
    rng_state = 0x2545f4914f6cdd1dull;
    for (int k = 0; k < 2; k++) {
        char *text = ir_print_str(gs[k]);
        size_t len = strlen(text);
        char *buf = malloc(2 * len + 2);
        /* every truncation */
        for (size_t cut = 0; cut < len; cut++) {
            memcpy(buf, text, cut);
            buf[cut] = 0;
            parsed += parse_and_check(buf);
            total++;
        }
        /* random corruption: byte changes, deletions and duplicated spans */
        for (int iter = 0; iter < 10000; iter++) {
            memcpy(buf, text, len + 1);
            size_t blen = len;
            int edits = 1 + (int)(rnd() % 4);
            for (int e = 0; e < edits && blen > 1; e++) {
                size_t at = rnd() % blen;
                switch (rnd() % 4) {
                case 0: /* a character the grammar cares about */
                    buf[at] = alphabet[rnd() % (sizeof alphabet - 1)];
                    break;
                case 1: /* any byte but NUL */
                    buf[at] = (char)(1 + rnd() % 255);
                    break;
                case 2: { /* delete a span */
                    size_t n = 1 + rnd() % 16;
                    if (at + n > blen)
                        n = blen - at;
                    memmove(buf + at, buf + at + n, blen - at - n + 1);
                    blen -= n;
                    break;
                }
                default: { /* duplicate a span (the buffer has room for one copy of the text) */
                    size_t n = 1 + rnd() % 64;
                    if (at + n > blen)
                        n = blen - at;
                    if (blen + n > 2 * len)
                        break;
                    memmove(buf + at + n, buf + at, blen - at + 1);
                    blen += n;
                    break;
                }
                }
            }
            parsed += parse_and_check(buf);
            total++;
        }
        free(buf);
        free(text);
    }
    /* a few texts in the corpus must still parse, or the fuzzing tests nothing but the first error */
    ck_assert_msg(parsed > 50, "only %d of %d mutated texts parsed", parsed, total);
    ir_graph_free(gs[0]);
    ir_graph_free(gs[1]);
}
END_TEST

/* pathological input: very long names, strings and dims, long runs of blank lines */
START_TEST(test_long_tokens)
{
    size_t n = 100000;
    char *buf = malloc(n + 200);
    char err[1024];
    /* a very long name */
    strcpy(buf, "graph t() {\n  %");
    size_t len = strlen(buf);
    memset(buf + len, 'a', n);
    strcpy(buf + len + n, " = const 1 : f32[]\n}\n");
    ck_assert_ptr_null(ir_parse(buf, "t.ir", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "value name too long"));
    /* a very long string */
    strcpy(buf, "graph t() {\n  %x = input \"");
    len = strlen(buf);
    memset(buf + len, 'a', n);
    strcpy(buf + len + n, "\" : f32[]\n}\n");
    ck_assert_ptr_null(ir_parse(buf, "t.ir", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "string too long"));
    /* a very long dimension: n+n+n... overflows the coefficient, not the stack */
    strcpy(buf, "graph t(n) {\n  %x = input \"x\" : f32[n");
    len = strlen(buf);
    for (size_t i = 0; i < n / 2; i++)
        memcpy(buf + len + 2 * i, "+n", 2);
    strcpy(buf + len + n, "]\n}\n");
    ck_assert_ptr_null(ir_parse(buf, "t.ir", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "coefficient of 'n' out of range"));
    /* many blank lines and comments */
    strcpy(buf, "graph t() {\n");
    len = strlen(buf);
    for (size_t i = 0; i < n / 2; i++)
        memcpy(buf + len + 2 * i, i % 7 ? "\n\n" : "#\n", 2);
    strcpy(buf + len + n, "}\n");
    IrGraph *g = ir_parse(buf, "t.ir", err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    ir_graph_free(g);
    free(buf);
}
END_TEST

static Suite *ir_text_suite(void)
{
    Suite *s = suite_create("ir_text");
    TCase *tc = tcase_create("roundtrip");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_roundtrip, 0, NBUILDERS);
    tcase_add_test(tc, test_every_op_covered);
    tcase_add_test(tc, test_attr_names);
    tcase_add_test(tc, test_gpt_text);
    tcase_add_test(tc, test_labels);
    tcase_add_test(tc, test_derived_symbols);
    tcase_add_test(tc, test_float_roundtrip);
    tcase_add_test(tc, test_golden);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_loop_test(tc, test_errors, 0, (int)(sizeof error_cases / sizeof error_cases[0]));
    tcase_add_test(tc, test_error_caret);
    tcase_add_test(tc, test_lenient_input);
    suite_add_tcase(s, tc);

    tc = tcase_create("robustness");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fuzz);
    tcase_add_test(tc, test_long_tokens);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(ir_text_suite(), NULL);
}
