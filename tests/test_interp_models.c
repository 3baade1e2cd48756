/* test_interp_models.c: the reference interpreter (ir/interp.c) on its errors (missing,
 * mis-shaped and out-of-range inputs, symbols over their bounds, empty tensors) and on whole
 * blocks: the lifetimes of intermediates, a small attention block against a direct C
 * implementation, a small decoder. Op-by-op values are test_interp's.
 *
 * XTC_INTERP_BENCH=1 adds a timing run of a 12-layer dim-512 seq-64 decoder. */
#include "interp_env.h"


/* ---- errors ---- */

START_TEST(test_missing_leaves)
{
    IrGraph *g = ir_graph_new("missing");
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim(2)));
    IrNode *m = ir_input(g, "mask", IR_BOOL, 1, DIMS(ir_dim(2)));
    IrNode *w = ir_param(g, "x.weight", 1, DIMS(ir_dim(2)));
    ir_input(g, "unused", IR_F32, 1, DIMS(ir_dim(7))); /* not needed by any output: optional */
    ir_output(g, "y", ir_where(g, m, ir_binary(g, IR_MUL, x, w), x));
    float xv[2] = {1, 2}, wv[2] = {3, 4};
    uint8_t mv[2] = {1, 0};
    Env e = {0};
    env_set(&e, "x", IR_F32, 1, SHAPE(2), xv);
    ck_assert_str_eq(run_err(g, &e), "missing input 'mask'");
    env_set(&e, "mask", IR_BOOL, 1, SHAPE(2), mv);
    ck_assert_str_eq(run_err(g, &e), "missing parameter 'x.weight'");
    env_set(&e, "x.weight", IR_F32, 1, SHAPE(2), wv);
    run_ok(g, &e);
    check_f32(0, 2, (double[]){3, 2});
    done(g);
}
END_TEST

START_TEST(test_shape_errors)
{
    IrGraph *g = ir_graph_new("shape");
    int b = ir_graph_add_sym(g, "b", 0), n = ir_graph_add_sym(g, "n", 16);
    IrNode *mask = ir_input(g, "mask", IR_BOOL, 2, DIMS(ir_dim_sym(b), ir_dim_sym(n)));
    IrNode *tok = ir_input(g, "tokens", IR_I64, 2, DIMS(ir_dim_sym(b), ir_dim_sym(n)));
    ir_output(g, "m", mask);
    ir_output(g, "t", tok);
    static uint8_t mv[64];
    static int64_t tv[64];
    static float fv[64];
    Env e = {0};
    env_set(&e, "mask", IR_BOOL, 2, SHAPE(2, 16), mv); /* mask comes first: it binds b and n */
    env_set(&e, "tokens", IR_I64, 2, SHAPE(2, 17), tv);
    ck_assert_str_eq(run_err(g, &e), "input 'tokens': expected i64[b, n] (b=2, n=16), got i64[2, 17]");
    e.b[1].t.shape[1] = 16;
    e.b[1].t.dtype = IR_F32; /* an int input bound from a float tensor */
    e.b[1].t.data = fv;
    ck_assert_str_eq(run_err(g, &e), "input 'tokens': expected i64[b, n] (b=2, n=16), got f32[2, 16]");
    e.b[1].t.dtype = IR_I32; /* i32 storage for an i64 input is fine */
    e.b[1].t.data = tv;
    run_ok(g, &e);
    ir_host_free(&outs[0]);
    ir_host_free(&outs[1]);
    e.b[1].t.rank = 1;
    ck_assert_str_eq(run_err(g, &e), "input 'tokens': expected i64[b, n] (b=2, n=16), got i32[2]");
    e.b[1].t.rank = 2;
    /* n over its bound of 16 */
    e.b[0].t.shape[0] = 1;
    e.b[0].t.shape[1] = 20;
    e.b[1].t.shape[0] = 1;
    e.b[1].t.shape[1] = 20;
    ck_assert_str_eq(run_err(g, &e), "symbol 'n' = 20 exceeds its bound 16 (from input 'mask')");
    done(g);
}
END_TEST

START_TEST(test_param_shape_error)
{
    IrGraph *g = ir_graph_new("param");
    ir_output(g, "w", ir_param(g, "layers.0.w", 2, DIMS(ir_dim(4), ir_dim(8))));
    float wv[36] = {0};
    Env e = {0};
    env_set(&e, "layers.0.w", IR_F32, 2, SHAPE(4, 9), wv);
    ck_assert_str_eq(run_err(g, &e), "parameter 'layers.0.w': expected f32[4, 8], got f32[4, 9]");
    done(g);
}
END_TEST

START_TEST(test_dimension_errors)
{
    /* a dimension n-2 that evaluates negative */
    IrGraph *g = ir_graph_new("neg");
    int n = ir_graph_add_sym(g, "n", 0);
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim_sym(n)));
    ir_output(g, "s", ir_label(g, ir_slice(g, x, 0, ir_dim(2), ir_dim_addc(ir_dim_sym(n), -2)), "tail"));
    float xv[1] = {0};
    Env e = {0};
    env_set(&e, "x", IR_F32, 1, SHAPE(1), xv);
    ck_assert_str_eq(run_err(g, &e), "slice %tail: dimension 0 (n-2) evaluates to -1");
    done(g);

    /* a symbol no input binds */
    g = ir_graph_new("unbound");
    int m = ir_graph_add_sym(g, "m", 0);
    ir_output(g, "a", ir_label(g, ir_arange(g, ir_dim(0), ir_dim_sym(m), IR_I64), "pos"));
    Env e2 = {0};
    ck_assert_str_eq(run_err(g, &e2), "arange %pos: symbol 'm' is not bound by any input");
    done(g);

    /* a leaf whose shape only uses a symbol in an affine form cannot bind it */
    g = ir_graph_new("affine");
    int k = ir_graph_add_sym(g, "k", 0);
    ir_output(g, "x", ir_input(g, "mem", IR_F32, 1, DIMS(ir_dim_addc(ir_dim_sym(k), 3))));
    Env e3 = {0};
    env_set(&e3, "mem", IR_F32, 1, SHAPE(1), xv);
    ck_assert_str_eq(run_err(g, &e3), "input 'mem': symbol 'k' in its shape is not bound by any input");
    done(g);
}
END_TEST

/* empty tensors: sums are 0, a matmul over k = 0 is 0, an empty maximum is an error */
START_TEST(test_empty_tensors)
{
    IrGraph *g = ir_graph_new("empty");
    int n = ir_graph_add_sym(g, "n", 0);
    IrNode *x = ir_input(g, "x", IR_F32, 2, DIMS(ir_dim_sym(n), ir_dim(3)));
    IrNode *w = ir_input(g, "w", IR_F32, 2, DIMS(ir_dim(2), ir_dim_sym(n)));
    IrNode *t = ir_input(g, "t", IR_I64, 1, DIMS(ir_dim_sym(n)));
    ir_output(g, "sum", ir_reduce(g, IR_SUM, x, 0));
    ir_output(g, "softmax", ir_softmax(g, x));
    ir_output(g, "wx", ir_matmul(g, w, x, 0)); /* [2, 0] x [0, 3] */
    ir_output(g, "loss", ir_xent(g, x, t));
    Env e = {0};
    env_set(&e, "x", IR_F32, 2, SHAPE(0, 3), NULL);
    env_set(&e, "w", IR_F32, 2, SHAPE(2, 0), NULL);
    env_set(&e, "t", IR_I64, 1, SHAPE(0), NULL);
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(1, 3));
    check_f32(0, 3, (double[]){0, 0, 0});
    check_shape(1, IR_F32, 2, SHAPE(0, 3));
    check_shape(2, IR_F32, 2, SHAPE(2, 3));
    check_f32(2, 6, (double[]){0, 0, 0, 0, 0, 0});
    ck_assert_float_eq(F(3, 0), 0);
    done(g);

    g = ir_graph_new("empty_max");
    n = ir_graph_add_sym(g, "n", 0);
    x = ir_input(g, "x", IR_F32, 2, DIMS(ir_dim(2), ir_dim_sym(n)));
    ir_output(g, "m", ir_label(g, ir_reduce(g, IR_RMAX, x, 1), "m"));
    Env e2 = {0};
    env_set(&e2, "x", IR_F32, 2, SHAPE(2, 0), NULL);
    ck_assert_str_eq(run_err(g, &e2), "reduce_max %m: maximum over an empty axis");
    done(g);
}
END_TEST

/* outputs that are leaves or shared, repeated operands, values used far apart: under valgrind
 * this shows that last-use freeing neither leaks nor frees twice */
START_TEST(test_lifetimes)
{
    IrGraph *g = ir_graph_new("life");
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim(3)));
    IrNode *sq = ir_binary(g, IR_MUL, x, x);
    IrNode *e1 = ir_unary(g, IR_EXP, sq);
    IrNode *y = ir_binary(g, IR_ADD, ir_binary(g, IR_SUB, e1, sq), x);
    ir_output(g, "y", y);
    ir_output(g, "x", x);
    ir_output(g, "y2", y);
    float xv[3] = {0, 1, -2};
    Env e = {0};
    env_set(&e, "x", IR_F32, 1, SHAPE(3), xv);
    run_ok(g, &e);
    double want[3];
    for (int i = 0; i < 3; i++)
        want[i] = exp(xv[i] * xv[i]) - xv[i] * xv[i] + xv[i];
    check_f32(0, 3, want);
    check_f32(2, 3, want);
    check_f32(1, 3, (double[]){0, 1, -2});
    done(g);
}
END_TEST

/* ---- a decoder built from primitive ops ---- */

static uint64_t rng_state;
static float rnd(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24) * 2 - 1);
}

typedef struct {
    int dim, heads, depth, vocab, seq;
    Env env;
    float *store[512];
    int nstore;
} Model;

static IrNode *model_param(IrGraph *g, Model *md, const char *name, int rank, const int64_t *shape,
                           float scale, float offset)
{
    IrDim d[IR_MAXRANK];
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        d[i] = ir_dim(shape[i]);
        numel *= shape[i];
    }
    float *v = malloc(sizeof(float) * (size_t)numel);
    for (int64_t i = 0; i < numel; i++)
        v[i] = offset + scale * rnd();
    md->store[md->nstore++] = v;
    char *nm = ir_strdup(g, name);
    env_set(&md->env, nm, IR_F32, rank, shape, v);
    return ir_param(g, nm, rank, d);
}

static IrNode *scalar(IrGraph *g, double v) { return ir_const(g, v, IR_F32); }

/* x[b, n, d] @ W[out, d]^T + bias */
static IrNode *linear(IrGraph *g, Model *md, IrNode *x, const char *name, int in, int out, int bias)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s.weight", name);
    IrNode *y = ir_matmul(g, x, model_param(g, md, buf, 2, SHAPE(out, in), 1.0f / sqrtf((float)in), 0), 1);
    if (bias) {
        snprintf(buf, sizeof buf, "%s.bias", name);
        y = ir_binary(g, IR_ADD, y, model_param(g, md, buf, 1, SHAPE(out), 0.1f, 0));
    }
    return y;
}

static IrNode *layer_norm(IrGraph *g, Model *md, IrNode *x, const char *name)
{
    char buf[128];
    int d = md->dim;
    IrNode *mean = ir_binary(g, IR_MUL, ir_reduce(g, IR_SUM, x, -1), scalar(g, 1.0 / d));
    IrNode *xc = ir_binary(g, IR_SUB, x, mean);
    IrNode *var = ir_binary(g, IR_MUL, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, xc, xc), -1), scalar(g, 1.0 / d));
    IrNode *y = ir_binary(g, IR_MUL, xc, ir_unary(g, IR_RSQRT, ir_binary(g, IR_ADD, var, scalar(g, 1e-5))));
    snprintf(buf, sizeof buf, "%s.weight", name);
    y = ir_binary(g, IR_MUL, y, model_param(g, md, buf, 1, SHAPE(d), 0.1f, 1));
    snprintf(buf, sizeof buf, "%s.bias", name);
    return ir_binary(g, IR_ADD, y, model_param(g, md, buf, 1, SHAPE(d), 0.1f, 0));
}

/* causal self-attention on x[b, n, d], heads split 'b n (h e) -> b h n e' */
static IrNode *attention(IrGraph *g, Model *md, IrNode *x, const char *name, int bs, int n)
{
    char buf[128];
    int d = md->dim, h = md->heads, e = d / h;
    IrNode *qkv[3];
    const char *nm[3] = {"to_q", "to_k", "to_v"};
    for (int k = 0; k < 3; k++) {
        snprintf(buf, sizeof buf, "%s.%s", name, nm[k]);
        IrNode *p = linear(g, md, x, buf, d, d, 0);
        p = ir_reshape(g, p, 4, DIMS(ir_dim(bs), ir_dim(n), ir_dim(h), ir_dim(e)));
        qkv[k] = ir_permute(g, p, (int[]){0, 2, 1, 3}); /* [b, h, n, e] */
    }
    IrNode *dots = ir_binary(g, IR_MUL, ir_matmul(g, qkv[0], qkv[1], 1), scalar(g, 1 / sqrt(e)));
    IrNode *pos = ir_arange(g, ir_dim(0), ir_dim(n), IR_I64);
    IrNode *qi = ir_reshape(g, pos, 2, DIMS(ir_dim(n), ir_dim(1)));
    IrNode *kj = ir_reshape(g, pos, 2, DIMS(ir_dim(1), ir_dim(n)));
    IrNode *future = ir_binary(g, IR_LT, qi, kj);                      /* j > i */
    dots = ir_where(g, future, scalar(g, -FLT_MAX), dots);
    IrNode *o = ir_matmul(g, ir_softmax(g, dots), qkv[2], 0);          /* [b, h, n, e] */
    o = ir_reshape(g, ir_permute(g, o, (int[]){0, 2, 1, 3}), 3, DIMS(ir_dim(bs), ir_dim(n), ir_dim(d)));
    snprintf(buf, sizeof buf, "%s.to_out", name);
    return linear(g, md, o, buf, d, d, 1);
}

/* token ids [b, n] -> logits [b, n, vocab] and the mean loss against the next tokens */
static IrGraph *decoder(Model *md, int bs)
{
    IrGraph *g = ir_graph_new("decoder");
    int n = md->seq, d = md->dim;
    char buf[64];
    IrNode *tok = ir_input(g, "tokens", IR_I64, 2, DIMS(ir_dim(bs), ir_dim(n)));
    IrNode *tgt = ir_input(g, "targets", IR_I64, 2, DIMS(ir_dim(bs), ir_dim(n)));
    IrNode *x = ir_gather(g, model_param(g, md, "token_emb.weight", 2, SHAPE(md->vocab, d), 1, 0), tok);
    for (int l = 0; l < md->depth; l++) {
        snprintf(buf, sizeof buf, "layers.%d", 2 * l);
        x = ir_binary(g, IR_ADD, x, attention(g, md, layer_norm(g, md, x, buf), buf, bs, n));
        snprintf(buf, sizeof buf, "layers.%d", 2 * l + 1);
        char nb[80];
        snprintf(nb, sizeof nb, "%s.net.0", buf);
        IrNode *f = ir_unary(g, IR_GELU, linear(g, md, layer_norm(g, md, x, buf), nb, d, 4 * d, 1));
        snprintf(nb, sizeof nb, "%s.net.3", buf);
        x = ir_binary(g, IR_ADD, x, linear(g, md, f, nb, 4 * d, d, 1));
    }
    IrNode *logits = linear(g, md, layer_norm(g, md, x, "norm"), "to_logits", d, md->vocab, 1);
    ir_output(g, "logits", logits);
    ir_output(g, "loss", ir_xent(g, logits, tgt));
    return g;
}

static void model_free(Model *md)
{
    for (int i = 0; i < md->nstore; i++)
        free(md->store[i]);
}

/* one attention block of the decoder, checked against a direct computation */
START_TEST(test_attention_block)
{
    Model md = {.dim = 8, .heads = 2, .depth = 1, .vocab = 16, .seq = 5};
    rng_state = 42;
    enum { BS = 2, N = 5, D = 8, H = 2, E = 4 };
    IrGraph *g = ir_graph_new("attn");
    IrNode *x = ir_input(g, "x", IR_F32, 3, DIMS(ir_dim(BS), ir_dim(N), ir_dim(D)));
    ir_output(g, "y", attention(g, &md, x, "a", BS, N));
    float xv[BS * N * D];
    for (int i = 0; i < BS * N * D; i++)
        xv[i] = rnd();
    env_set(&md.env, "x", IR_F32, 3, SHAPE(BS, N, D), xv);
    run_ok(g, &md.env);
    check_shape(0, IR_F32, 3, SHAPE(BS, N, D));

    const float *wq = md.store[0], *wk = md.store[1], *wv = md.store[2], *wo = md.store[3], *bo = md.store[4];
    double q[BS][N][D], k[BS][N][D], v[BS][N][D], o[BS][N][D];
    for (int b = 0; b < BS; b++)
        for (int i = 0; i < N; i++)
            for (int f = 0; f < D; f++) {
                q[b][i][f] = k[b][i][f] = v[b][i][f] = 0;
                for (int c = 0; c < D; c++) {
                    q[b][i][f] += (double)xv[(b * N + i) * D + c] * wq[f * D + c];
                    k[b][i][f] += (double)xv[(b * N + i) * D + c] * wk[f * D + c];
                    v[b][i][f] += (double)xv[(b * N + i) * D + c] * wv[f * D + c];
                }
            }
    for (int b = 0; b < BS; b++)
        for (int hh = 0; hh < H; hh++)
            for (int i = 0; i < N; i++) {
                double p[N], z = 0;
                for (int j = 0; j < N; j++) { /* future keys get weight 0; no max needed at this size */
                    double s = 0;
                    for (int c = 0; c < E; c++)
                        s += q[b][i][hh * E + c] * k[b][j][hh * E + c];
                    p[j] = j > i ? 0 : exp(s / 2.0); /* sqrt(E) = 2 */
                    z += p[j];
                }
                for (int c = 0; c < E; c++) {
                    double s = 0;
                    for (int j = 0; j < N; j++)
                        s += p[j] / z * v[b][j][hh * E + c];
                    o[b][i][hh * E + c] = s;
                }
            }
    double want[BS * N * D];
    for (int b = 0; b < BS; b++)
        for (int i = 0; i < N; i++)
            for (int f = 0; f < D; f++) {
                double s = bo[f];
                for (int c = 0; c < D; c++)
                    s += o[b][i][c] * wo[f * D + c];
                want[(b * N + i) * D + f] = s;
            }
    check_f32(0, BS * N * D, want);
    done(g);
    model_free(&md);
}
END_TEST

static double run_decoder(int dim, int heads, int depth, int vocab, int seq, int bs, float *loss)
{
    Model md = {.dim = dim, .heads = heads, .depth = depth, .vocab = vocab, .seq = seq};
    rng_state = 7;
    IrGraph *g = decoder(&md, bs);
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)(bs * seq));
    int64_t *tgt = malloc(sizeof(int64_t) * (size_t)(bs * seq));
    for (int i = 0; i < bs * seq; i++) {
        tok[i] = (i * 7 + 3) % vocab;
        tgt[i] = i % seq == seq - 1 ? -100 : (i * 7 + 10) % vocab;
    }
    env_set(&md.env, "tokens", IR_I64, 2, SHAPE(bs, seq), tok);
    env_set(&md.env, "targets", IR_I64, 2, SHAPE(bs, seq), tgt);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ok(g, &md.env);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    check_shape(0, IR_F32, 3, SHAPE(bs, seq, vocab));
    for (int64_t i = 0; i < ir_host_numel(&outs[0]); i++)
        ck_assert(isfinite(F(0, i)));
    *loss = F(1, 0);
    done(g);
    model_free(&md);
    free(tok);
    free(tgt);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

/* a parity-sized model runs, and its loss is near log(vocab) at this init */
START_TEST(test_small_decoder)
{
    float loss;
    double secs = run_decoder(32, 4, 2, 64, 16, 2, &loss);
    ck_assert_msg(loss > 2.5f && loss < 7.0f, "loss %g", loss);
    if (getenv("XTC_INTERP_BENCH"))
        printf("interp: dim 32, 2 layers, seq 16, batch 2: %.3f s, loss %.4f\n", secs, loss);
}
END_TEST

START_TEST(test_bench_large)
{
    if (!getenv("XTC_INTERP_BENCH"))
        return;
    float loss;
    double secs = run_decoder(512, 8, 12, 256, 64, 1, &loss);
    printf("interp: dim 512, 12 layers, seq 64, batch 1: %.3f s, loss %.4f\n", secs, loss);
}
END_TEST

static Suite *interp_models_suite(void)
{
    Suite *s = suite_create("interp_models");
    TCase *e = tcase_create("errors");
    tcase_add_test(e, test_missing_leaves);
    tcase_add_test(e, test_shape_errors);
    tcase_add_test(e, test_param_shape_error);
    tcase_add_test(e, test_dimension_errors);
    tcase_add_test(e, test_empty_tensors);
    suite_add_tcase(s, e);

    TCase *m = tcase_create("models");
    tcase_set_timeout(m, 120);
    tcase_add_test(m, test_lifetimes);
    tcase_add_test(m, test_attention_block);
    tcase_add_test(m, test_small_decoder);
    tcase_add_test(m, test_bench_large);
    suite_add_tcase(s, m);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(interp_models_suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
