/* test_interp.c: the reference interpreter (ir/interp.c) op by op, against values worked out by
 * hand or by an independent formula written here. Its errors and whole blocks (a small attention
 * block against a direct C implementation, a decoder) are test_interp_models'.
 *
 * The T5 bucket tables were written by /usr/bin/python3 with Debian's torch 1.13.1 ("1.13.0a0"),
 * reproducing x-transformers 0.23.0 `RelativePositionBias._relative_position_bucket` and its
 * position grid (q_pos = arange(I), k_pos = arange(J), rel = k_pos - q_pos). If they mismatch,
 * compare the fp32 log first: torch takes log(n.float() / max_exact) in float32.
 */
#include "interp_env.h"

/* ---- the op table ---- */

START_TEST(test_every_op_has_entry)
{
    for (int op = 0; op < IR_NUM_OPS; op++)
        ck_assert_msg(ir_interp_has_op((IrOp)op), "no interpreter entry for '%s'", ir_ops[op].name);
    ck_assert(!ir_interp_has_op(IR_NUM_OPS));
}
END_TEST

/* ---- leaves ---- */

START_TEST(test_leaves)
{
    IrGraph *g = ir_graph_new("leaves");
    IrNode *tok = ir_input(g, "tok", IR_I64, 1, DIMS(ir_dim(3)));
    IrNode *m = ir_input(g, "m", IR_BOOL, 1, DIMS(ir_dim(3)));
    IrNode *w = ir_param(g, "w", 2, DIMS(ir_dim(2), ir_dim(2)));
    IrNode *bf = ir_buffer(g, "inv_freq", 1, DIMS(ir_dim(2)));
    ir_output(g, "tok", tok);
    ir_output(g, "m", m);
    ir_output(g, "w", w);
    ir_output(g, "bf", bf);
    ir_output(g, "w_again", w);
    Env e = {0};
    int32_t tok32[3] = {5, -1, 63}; /* i32 storage bound to an i64 input converts */
    uint8_t mv[3] = {0, 1, 2};
    float wv[4] = {0.5f, -1.25f, 3.0f, 1e-8f}, bv[2] = {1, 0.01f};
    env_set(&e, "tok", IR_I32, 1, SHAPE(3), tok32);
    env_set(&e, "m", IR_BOOL, 1, SHAPE(3), mv);
    env_set(&e, "w", IR_F32, 2, SHAPE(2, 2), wv);
    env_set(&e, "inv_freq", IR_F32, 1, SHAPE(2), bv);
    run_ok(g, &e);
    check_shape(0, IR_I64, 1, SHAPE(3));
    ck_assert_int_eq(I64(0, 0), 5);
    ck_assert_int_eq(I64(0, 1), -1);
    ck_assert_int_eq(I64(0, 2), 63);
    check_shape(1, IR_BOOL, 1, SHAPE(3));
    ck_assert_int_eq(B(1, 0), 0);
    ck_assert_int_eq(B(1, 1), 1);
    ck_assert_int_eq(B(1, 2), 1);
    check_shape(2, IR_F32, 2, SHAPE(2, 2));
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(F(2, i), wv[i]); /* widening and narrowing back is exact */
        ck_assert_float_eq(F(4, i), wv[i]);
    }
    ck_assert_ptr_ne(outs[2].data, outs[4].data); /* each output owns its data */
    ck_assert_float_eq(F(3, 1), 0.01f);
    done(g);
}
END_TEST

START_TEST(test_const_arange)
{
    IrGraph *g = ir_graph_new("const");
    int n = ir_graph_add_sym(g, "n", 0);
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim_sym(n)));
    ir_output(g, "c", ir_const(g, 2.5, IR_F32));
    ir_output(g, "ci", ir_const(g, -2.7, IR_I32));                      /* truncates: -2 */
    ir_output(g, "cb", ir_const(g, 0.25, IR_BOOL));                     /* != 0: true */
    ir_output(g, "ar", ir_arange(g, ir_dim_addc(ir_dim_sym(n), -1), ir_dim(3), IR_I64)); /* n-1.. */
    ir_output(g, "af", ir_arange(g, ir_dim(0), ir_dim_sym(n), IR_F32));
    /* a const broadcast into x's shape */
    ir_output(g, "xc", ir_binary(g, IR_ADD, x, ir_const(g, 1.0, IR_F32)));
    Env e = {0};
    float xv[4] = {1, 2, 3, 4};
    env_set(&e, "x", IR_F32, 1, SHAPE(4), xv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 0, NULL);
    ck_assert_float_eq(F(0, 0), 2.5f);
    check_shape(1, IR_I32, 0, NULL);
    ck_assert_int_eq(I32(1, 0), -2);
    ck_assert_int_eq(B(2, 0), 1);
    check_shape(3, IR_I64, 1, SHAPE(3));
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(I64(3, i), 3 + i);
    check_shape(4, IR_F32, 1, SHAPE(4));
    check_f32(4, 4, (double[]){0, 1, 2, 3});
    check_f32(5, 4, (double[]){2, 3, 4, 5});
    done(g);
}
END_TEST

/* ---- T5 buckets (values from torch, see the header) ---- */
/* relpos_causal_32_128: [40, 40] */
static const int8_t relpos_causal_32_128[40][40] = {
    {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0},
    {20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0},
    {20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0},
    {20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0},
    {21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0},
    {21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0},
    {21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0},
    {21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0},
    {22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0},
    {22,22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0},
    {22,22,22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0},
    {22,22,22,22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0},
    {22,22,22,22,22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0},
};
/* relpos_bidir_16_16: [20, 40] */
static const int8_t relpos_bidir_16_16[20][40] = {
    {0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,7,7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15,15},
    {7,7,7,7,7,7,7,7,6,6,6,6,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,14,14,14,14,15,15,15,15,15,15,15,15,15},
};

static void check_relpos(int nq, int nk, int buckets, int dist, int causal, const int8_t *want)
{
    IrGraph *g = ir_graph_new("relpos");
    ir_output(g, "b", ir_relpos(g, ir_dim(nq), ir_dim(nk), buckets, dist, causal));
    Env e = {0};
    run_ok(g, &e);
    check_shape(0, IR_I64, 2, SHAPE(nq, nk));
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            ck_assert_msg(I64(0, i * nk + j) == want[i * nk + j], "bucket(i=%d, j=%d) = %lld, want %d",
                          i, j, (long long)I64(0, i * nk + j), want[i * nk + j]);
    done(g);
}

START_TEST(test_relpos_causal)
{
    check_relpos(40, 40, 32, 128, 1, &relpos_causal_32_128[0][0]);
}
END_TEST

START_TEST(test_relpos_bidirectional)
{
    check_relpos(20, 40, 16, 16, 0, &relpos_bidir_16_16[0][0]);
}
END_TEST

/* far distances, causal 32/128: q position n, k position 0 */
START_TEST(test_relpos_far)
{
    static const int64_t dist[] = {0, 1, 15, 16, 17, 20, 31, 32, 63, 64, 100, 127, 128, 129, 500, 1000, 20000};
    static const int64_t want[] = {0, 1, 15, 16, 16, 17, 21, 21, 26, 26, 30, 31, 31, 31, 31, 31, 31};
    IrGraph *g = ir_graph_new("relpos_far");
    ir_output(g, "b", ir_relpos(g, ir_dim(20001), ir_dim(1), 32, 128, 1));
    Env e = {0};
    run_ok(g, &e);
    for (size_t k = 0; k < sizeof dist / sizeof dist[0]; k++)
        ck_assert_int_eq(I64(0, dist[k]), want[k]);
    done(g);
}
END_TEST

/* settings whose ratio max_distance / max_exact is not a power of two (torch values) */
START_TEST(test_relpos_other_settings)
{
    static const int64_t dist[] = {0, 5, 11, 12, 13, 17, 25, 50, 99, 100, 101, 150, 400, 1000, 20000};
    static const int64_t causal_24_100[] = {0, 5, 11, 12, 12, 13, 16, 20, 23, 23, 23, 23, 23, 23, 23};
    static const int64_t future_20_100[] = {0, 15, 16, 16, 16, 17, 17, 18, 19, 19, 19, 19, 19, 19, 19};
    IrGraph *g = ir_graph_new("relpos_other");
    ir_output(g, "c", ir_relpos(g, ir_dim(20001), ir_dim(1), 24, 100, 1)); /* [i, 0]: n = i */
    ir_output(g, "f", ir_relpos(g, ir_dim(1), ir_dim(20001), 20, 100, 0)); /* [0, j]: n = -j */
    Env e = {0};
    run_ok(g, &e);
    for (size_t k = 0; k < sizeof dist / sizeof dist[0]; k++) {
        ck_assert_int_eq(I64(0, dist[k]), causal_24_100[k]);
        ck_assert_int_eq(I64(1, dist[k]), future_20_100[k]);
    }
    done(g);
}
END_TEST

/* ---- elementwise ---- */

START_TEST(test_unary)
{
    static const double xs[6] = {-2, -0.5, 0, 0.5, 1, 3};
    static const double ps[4] = {0.25, 1, 2, 9}; /* positive, for log / sqrt / rsqrt */
    static const IrOp ops[] = {IR_NEG, IR_EXP, IR_TANH, IR_SIGMOID, IR_GELU, IR_RELU, IR_SIN, IR_COS,
                               IR_ABS, IR_RECIP, IR_LOG, IR_SQRT, IR_RSQRT};
    enum { NOPS = sizeof ops / sizeof ops[0] };
    IrGraph *g = ir_graph_new("unary");
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim(6)));
    IrNode *p = ir_input(g, "p", IR_F32, 1, DIMS(ir_dim(4)));
    for (int k = 0; k < NOPS; k++) {
        int pos = ops[k] == IR_LOG || ops[k] == IR_SQRT || ops[k] == IR_RSQRT;
        ir_output(g, ir_ops[ops[k]].name, ir_unary(g, ops[k], pos ? p : x));
    }
    Env e = {0};
    float xv[6], pv[4];
    for (int i = 0; i < 6; i++)
        xv[i] = (float)xs[i];
    for (int i = 0; i < 4; i++)
        pv[i] = (float)ps[i];
    env_set(&e, "x", IR_F32, 1, SHAPE(6), xv);
    env_set(&e, "p", IR_F32, 1, SHAPE(4), pv);
    run_ok(g, &e);
    for (int k = 0; k < NOPS; k++) {
        int pos = ops[k] == IR_LOG || ops[k] == IR_SQRT || ops[k] == IR_RSQRT;
        int n = pos ? 4 : 6;
        double want[6];
        for (int i = 0; i < n; i++) {
            double v = pos ? ps[i] : xs[i];
            switch (ops[k]) { /* independent forms where there is one */
            case IR_NEG: want[i] = 0 - v; break;
            case IR_EXP: want[i] = pow(M_E, v); break;
            case IR_TANH: want[i] = (exp(2 * v) - 1) / (exp(2 * v) + 1); break;
            case IR_SIGMOID: want[i] = 0.5 * (1 + tanh(v / 2)); break;
            case IR_GELU: want[i] = v * 0.5 * erfc(-v / sqrt(2.0)); break; /* x * Phi(x) */
            case IR_RELU: want[i] = v > 0 ? v : 0; break;
            case IR_SIN: want[i] = sin(v); break;
            case IR_COS: want[i] = cos(v); break;
            case IR_ABS: want[i] = v < 0 ? -v : v; break;
            case IR_RECIP: want[i] = v == 0 ? INFINITY : 1 / v; break;
            case IR_LOG: want[i] = log2(v) * M_LN2; break;
            case IR_SQRT: want[i] = pow(v, 0.5); break;
            case IR_RSQRT: want[i] = pow(v, -0.5); break;
            default: ck_abort();
            }
        }
        if (ops[k] == IR_RECIP) {
            ck_assert(isinf(F(k, 2)) && F(k, 2) > 0); /* 1 / 0 */
            want[2] = 0, ((float *)outs[k].data)[2] = 0;
        }
        check_f32(k, n, want);
    }
    /* a few exact values from tables */
    ck_assert_float_eq_tol(F(4, 4), 0.8413447460685429, 1e-7);   /* gelu(1) */
    ck_assert_float_eq_tol(F(4, 0), -0.04550026389635842, 1e-7); /* gelu(-2) */
    ck_assert_float_eq_tol(F(3, 4), 0.7310585786300049, 1e-7);   /* sigmoid(1) */
    done(g);
}
END_TEST

START_TEST(test_cast)
{
    IrGraph *g = ir_graph_new("cast");
    IrNode *x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim(6)));
    IrNode *m = ir_input(g, "m", IR_BOOL, 1, DIMS(ir_dim(3)));
    IrNode *t = ir_input(g, "t", IR_I64, 1, DIMS(ir_dim(3)));
    ir_output(g, "f2i", ir_cast(g, x, IR_I32));
    ir_output(g, "f2b", ir_cast(g, x, IR_BOOL));
    ir_output(g, "b2f", ir_cast(g, m, IR_F32));
    ir_output(g, "b2i", ir_cast(g, m, IR_I64));
    ir_output(g, "i2i", ir_cast(g, t, IR_I32));
    ir_output(g, "i2f", ir_cast(g, t, IR_F32));
    Env e = {0};
    float xv[6] = {-2.7f, -0.5f, 0, 0.5f, 2.7f, 3};
    uint8_t mv[3] = {1, 0, 1};
    int64_t tv[3] = {-7, 0, 123456789};
    env_set(&e, "x", IR_F32, 1, SHAPE(6), xv);
    env_set(&e, "m", IR_BOOL, 1, SHAPE(3), mv);
    env_set(&e, "t", IR_I64, 1, SHAPE(3), tv);
    run_ok(g, &e);
    static const int32_t f2i[6] = {-2, 0, 0, 0, 2, 3}; /* toward zero */
    static const uint8_t f2b[6] = {1, 1, 0, 1, 1, 1};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(I32(0, i), f2i[i]);
        ck_assert_int_eq(B(1, i), f2b[i]);
    }
    check_f32(2, 3, (double[]){1, 0, 1});
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(I64(3, i), mv[i]);
        ck_assert_int_eq(I32(4, i), tv[i]);
    }
    check_f32(5, 3, (double[]){-7, 0, 123456789});
    done(g);
}
END_TEST

START_TEST(test_binary_broadcast)
{
    IrGraph *g = ir_graph_new("binary");
    IrNode *a = ir_input(g, "a", IR_F32, 2, DIMS(ir_dim(2), ir_dim(3)));
    IrNode *r = ir_input(g, "r", IR_F32, 1, DIMS(ir_dim(3)));            /* [3] against [2, 3] */
    IrNode *c = ir_input(g, "c", IR_F32, 2, DIMS(ir_dim(2), ir_dim(1))); /* [2, 1] against [1, 3] */
    IrNode *d = ir_input(g, "d", IR_F32, 2, DIMS(ir_dim(1), ir_dim(3)));
    ir_output(g, "add", ir_binary(g, IR_ADD, a, r));
    ir_output(g, "sub", ir_binary(g, IR_SUB, r, a));
    ir_output(g, "mul", ir_binary(g, IR_MUL, c, d));
    ir_output(g, "div", ir_binary(g, IR_DIV, a, c));
    ir_output(g, "max", ir_binary(g, IR_MAX, a, d));
    ir_output(g, "min", ir_binary(g, IR_MIN, c, d));
    Env e = {0};
    float av[6] = {1, 2, 3, 4, 5, 6}, rv[3] = {10, 20, 30}, cv[2] = {2, 3}, dv[3] = {1, 5, 4};
    env_set(&e, "a", IR_F32, 2, SHAPE(2, 3), av);
    env_set(&e, "r", IR_F32, 1, SHAPE(3), rv);
    env_set(&e, "c", IR_F32, 2, SHAPE(2, 1), cv);
    env_set(&e, "d", IR_F32, 2, SHAPE(1, 3), dv);
    run_ok(g, &e);
    for (int o = 0; o < 6; o++)
        check_shape(o, IR_F32, 2, SHAPE(2, 3));
    check_f32(0, 6, (double[]){11, 22, 33, 14, 25, 36});
    check_f32(1, 6, (double[]){9, 18, 27, 6, 15, 24});
    check_f32(2, 6, (double[]){2, 10, 8, 3, 15, 12});
    check_f32(3, 6, (double[]){0.5, 1, 1.5, 4.0 / 3, 5.0 / 3, 2});
    check_f32(4, 6, (double[]){1, 5, 4, 4, 5, 6});
    check_f32(5, 6, (double[]){1, 2, 2, 1, 3, 3});
    done(g);
}
END_TEST

START_TEST(test_compare_logic_where)
{
    IrGraph *g = ir_graph_new("compare");
    IrNode *a = ir_input(g, "a", IR_F32, 2, DIMS(ir_dim(2), ir_dim(3)));
    IrNode *b = ir_input(g, "b", IR_F32, 1, DIMS(ir_dim(3)));
    IrNode *lt = ir_binary(g, IR_LT, a, b), *eq = ir_binary(g, IR_EQ, a, b);
    ir_output(g, "lt", lt);
    ir_output(g, "le", ir_binary(g, IR_LE, a, b));
    ir_output(g, "eq", eq);
    ir_output(g, "and", ir_binary(g, IR_AND, lt, ir_unary(g, IR_NOT, eq)));
    ir_output(g, "or", ir_binary(g, IR_OR, lt, eq));
    ir_output(g, "not", ir_unary(g, IR_NOT, lt));
    /* where(cond[2, 1], a[2, 3], -1 as a scalar) */
    IrNode *cond = ir_input(g, "cond", IR_BOOL, 2, DIMS(ir_dim(2), ir_dim(1)));
    ir_output(g, "where", ir_where(g, cond, a, ir_const(g, -1, IR_F32)));
    /* integer comparison */
    IrNode *i = ir_input(g, "i", IR_I64, 1, DIMS(ir_dim(3)));
    ir_output(g, "ilt", ir_binary(g, IR_LT, i, ir_const(g, 2, IR_I64)));
    Env e = {0};
    float av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {2, 2, 6};
    uint8_t cv[2] = {0, 1};
    int64_t iv[3] = {1, 2, 3};
    env_set(&e, "a", IR_F32, 2, SHAPE(2, 3), av);
    env_set(&e, "b", IR_F32, 1, SHAPE(3), bv);
    env_set(&e, "cond", IR_BOOL, 2, SHAPE(2, 1), cv);
    env_set(&e, "i", IR_I64, 1, SHAPE(3), iv);
    run_ok(g, &e);
    static const uint8_t want[6][6] = {
        {1, 0, 1, 0, 0, 0}, /* a < b */
        {1, 1, 1, 0, 0, 1}, /* a <= b */
        {0, 1, 0, 0, 0, 1}, /* a == b */
        {1, 0, 1, 0, 0, 0}, /* lt && !eq */
        {1, 1, 1, 0, 0, 1}, /* lt || eq */
        {0, 1, 0, 1, 1, 1}, /* !lt */
    };
    for (int o = 0; o < 6; o++) {
        check_shape(o, IR_BOOL, 2, SHAPE(2, 3));
        for (int k = 0; k < 6; k++)
            ck_assert_msg(B(o, k) == want[o][k], "output %d[%d]", o, k);
    }
    check_f32(6, 6, (double[]){-1, -1, -1, 4, 5, 6});
    ck_assert(B(7, 0) == 1 && B(7, 1) == 0 && B(7, 2) == 0);
    done(g);
}
END_TEST

START_TEST(test_integer_arith)
{
    IrGraph *g = ir_graph_new("int");
    IrNode *a = ir_input(g, "a", IR_I64, 1, DIMS(ir_dim(4)));
    IrNode *b = ir_input(g, "b", IR_I64, 1, DIMS(ir_dim(4)));
    ir_output(g, "div", ir_binary(g, IR_DIV, a, b)); /* truncation toward zero */
    ir_output(g, "add", ir_binary(g, IR_ADD, a, b));
    ir_output(g, "mul", ir_binary(g, IR_MUL, a, b));
    ir_output(g, "max", ir_binary(g, IR_MAX, a, b));
    Env e = {0};
    int64_t av[4] = {7, -7, 7, -7}, bv[4] = {2, 2, -2, -2};
    env_set(&e, "a", IR_I64, 1, SHAPE(4), av);
    env_set(&e, "b", IR_I64, 1, SHAPE(4), bv);
    run_ok(g, &e);
    static const int64_t div[4] = {3, -3, -3, 3}, add[4] = {9, -5, 5, -9}, mul[4] = {14, -14, -14, 14},
                         mx[4] = {7, 2, 7, -2};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(I64(0, i), div[i]);
        ck_assert_int_eq(I64(1, i), add[i]);
        ck_assert_int_eq(I64(2, i), mul[i]);
        ck_assert_int_eq(I64(3, i), mx[i]);
    }
    done(g);
}
END_TEST

START_TEST(test_integer_errors)
{
    IrGraph *g = ir_graph_new("intdiv");
    IrNode *a = ir_input(g, "a", IR_I32, 1, DIMS(ir_dim(2)));
    IrNode *b = ir_input(g, "b", IR_I32, 1, DIMS(ir_dim(2)));
    ir_output(g, "q", ir_label(g, ir_binary(g, IR_DIV, a, b), "q"));
    Env e = {0};
    int32_t av[2] = {1, 2}, bv[2] = {1, 0};
    env_set(&e, "a", IR_I32, 1, SHAPE(2), av);
    env_set(&e, "b", IR_I32, 1, SHAPE(2), bv);
    ck_assert_str_eq(run_err(g, &e), "div %q: integer division by zero");
    done(g);

    /* i32 overflow is reported, not wrapped */
    g = ir_graph_new("overflow");
    a = ir_input(g, "a", IR_I32, 1, DIMS(ir_dim(2)));
    ir_output(g, "sq", ir_label(g, ir_binary(g, IR_MUL, a, a), "sq"));
    Env e2 = {0};
    int32_t big[2] = {3, 100000};
    env_set(&e2, "a", IR_I32, 1, SHAPE(2), big);
    ck_assert_str_eq(run_err(g, &e2), "mul %sq: value 1e+10 out of the exact i32 range");
    done(g);
}
END_TEST

/* A bounded attention (cosine-sim attention) claims |q_i . k_j| <= bound: the interpreter checks
 * the claim, since the compiled kernels take bound x scale as every row's softmax maximum. */
START_TEST(test_attention_bound_checked)
{
    IrGraph *g = ir_graph_new("bounded");
    IrNode *q = ir_input(g, "q", IR_F32, 2, DIMS(ir_dim(2), ir_dim(2)));
    IrNode *a = ir_attention_bounded(g, q, q, q, NULL, ir_const(g, 10, IR_F32), 0, 0, 0, 1);
    ir_output(g, "o", ir_label(g, a, "o"));
    Env e = {0};
    float unit[4] = {0.6f, 0.8f, 1, 0}, longer[4] = {0.6f, 0.8f, 1.5f, 0};
    env_set(&e, "q", IR_F32, 2, SHAPE(2, 2), unit);
    run_ok(g, &e); /* row 0: softmax(10 (1, 0.6)) of the rows (0.6, 0.8) and (1, 0) */
    double p1 = 1 / (1 + exp(4.0));
    ck_assert_double_eq_tol(F(0, 0), 0.6 * (1 - p1) + p1, 1e-6);
    ck_assert_double_eq_tol(F(0, 1), 0.8 * (1 - p1), 1e-6);
    for (int o = 0; o < g->noutputs; o++)
        ir_host_free(&outs[o]);
    Env e2 = {0};
    env_set(&e2, "q", IR_F32, 2, SHAPE(2, 2), longer);
    ck_assert_str_eq(run_err(g, &e2), "attention %o: attention with bound=1: |q . k| = 2.25 exceeds the bound");
    done(g);
}
END_TEST

/* ---- reductions ---- */

START_TEST(test_reduce_softmax)
{
    IrGraph *g = ir_graph_new("reduce");
    IrNode *a = ir_input(g, "a", IR_F32, 2, DIMS(ir_dim(2), ir_dim(3)));
    IrNode *s = ir_input(g, "s", IR_F32, 2, DIMS(ir_dim(4), ir_dim(3)));
    ir_output(g, "sum0", ir_reduce(g, IR_SUM, a, 0));
    ir_output(g, "sum1", ir_reduce(g, IR_SUM, a, 1));
    ir_output(g, "max0", ir_reduce(g, IR_RMAX, a, 0));
    ir_output(g, "max1", ir_reduce(g, IR_RMAX, a, -1));
    ir_output(g, "softmax", ir_softmax(g, s));
    Env e = {0};
    float av[6] = {1, -5, 3, 4, 2, -6};
    const float M = -FLT_MAX;
    float sv[12] = {1, 2, 3, 0, 0, 0, 0, M, M, M, M, M}; /* masked rows: -FLT_MAX, never -inf */
    env_set(&e, "a", IR_F32, 2, SHAPE(2, 3), av);
    env_set(&e, "s", IR_F32, 2, SHAPE(4, 3), sv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(1, 3));
    check_f32(0, 3, (double[]){5, -3, -3});
    check_shape(1, IR_F32, 2, SHAPE(2, 1));
    check_f32(1, 2, (double[]){-1, 0});
    check_f32(2, 3, (double[]){4, 2, 3});
    check_f32(3, 2, (double[]){3, 4});
    double z = 1 + exp(1) + exp(2); /* softmax(1, 2, 3) = e^(x-1) / z */
    check_f32(4, 12, (double[]){1 / z, exp(1) / z, exp(2) / z, 1. / 3, 1. / 3, 1. / 3, 1, 0, 0, 1. / 3,
                                1. / 3, 1. / 3});
    done(g);
}
END_TEST

/* kth_largest and entmax15 over the last axis, against values worked out by hand */
START_TEST(test_row_order_ops)
{
    IrGraph *g = ir_graph_new("order");
    const float M = -FLT_MAX;
    IrNode *x = ir_input(g, "x", IR_F32, 2, DIMS(ir_dim(4), ir_dim(4)));
    ir_output(g, "k1", ir_kth_largest(g, x, 1));
    ir_output(g, "k2", ir_kth_largest(g, x, 2));
    ir_output(g, "k4", ir_kth_largest(g, x, 4));
    ir_output(g, "k5", ir_kth_largest(g, x, 5));
    ir_output(g, "entmax", ir_entmax15(g, x));
    Env e = {0};
    /* rows: distinct; ties at the top; all equal; masked entries, one real */
    float xv[16] = {3, 1, 4, 2, 5, 5, 1, 5, 0, 0, 0, 0, M, 2, M, M};
    env_set(&e, "x", IR_F32, 2, SHAPE(4, 4), xv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(4, 1));
    check_f32(0, 4, (double[]){4, 5, 0, 2});
    check_f32(1, 4, (double[]){3, 5, 0, M}); /* ties counted: the 2nd largest of 5, 5, 5, 1 is 5 */
    check_f32(2, 4, (double[]){1, 1, 0, M});
    for (int i = 0; i < 4; i++) /* k > J: nothing lies below it */
        ck_assert(isinf(F(3, i)) && F(3, i) < 0);
    /* row 1: X = (x - 4) / 2 = (-0.5, -1.5, 0, -1); prefixes: tau_1 = -1; rho = 2: mean -0.25,
     * mean_sq 0.125, delta = (1 - 2 (0.125 - 0.0625)) / 2 = 0.4375, tau_2 = -0.25 - sqrt(0.4375)
     * = -0.9114 <= -0.5; rho = 3: mean -0.5, mean_sq 0.4167, delta = (1 - 3 (0.1667)) / 3 =
     * 0.1667, tau_3 = -0.5 - 0.4082 = -0.9082 > -1: support 2, y = (X - tau_2)^2 */
    double t2 = -0.25 - sqrt(0.4375);
    /* row 2: ties at the top, X = (0, 0, -2, 0): the three zeros share (1/3 each: tau = -1/sqrt 3) */
    /* row 3: all equal: uniform; row 4: the one real entry takes everything */
    check_f32(4, 16, (double[]){(-0.5 - t2) * (-0.5 - t2), 0, t2 * t2, 0, 1. / 3, 1. / 3, 0, 1. / 3,
                                0.25, 0.25, 0.25, 0.25, 0, 1, 0, 0});
    done(g);

    /* a row whose every entry is masked is uniform (its entries are equal) */
    g = ir_graph_new("all_masked");
    x = ir_input(g, "x", IR_F32, 1, DIMS(ir_dim(4)));
    ir_output(g, "entmax", ir_entmax15(g, x));
    ir_output(g, "k3", ir_kth_largest(g, x, 3));
    float mv[4] = {M, M, M, M};
    Env e2 = {0};
    env_set(&e2, "x", IR_F32, 1, SHAPE(4), mv);
    run_ok(g, &e2);
    check_f32(0, 4, (double[]){0.25, 0.25, 0.25, 0.25});
    check_f32(1, 1, (double[]){M});
    done(g);
}
END_TEST

/* Derived symbols (Transformer-XL): q = min(n+p, 6) is computed once n and p are bound, never
 * bound from an input; an input whose shape names q is checked against it; a derived symbol that
 * comes out negative, or whose symbols no input binds, is an error. */
START_TEST(test_derived_symbols)
{
    IrGraph *g = ir_graph_new("xl");
    int b = ir_graph_add_sym(g, "b", 0), n = ir_graph_add_sym(g, "n", 8), p = ir_graph_add_sym(g, "p", 6);
    IrDim np = ir_dim_add(ir_dim_sym(n), ir_dim_sym(p));
    IrDim q = ir_dim_sym(ir_graph_add_derived_sym(g, "q", np, 6));
    IrNode *mem = ir_input(g, "mem", IR_F32, 2, DIMS(ir_dim_sym(b), ir_dim_sym(p)));
    IrNode *x = ir_input(g, "x", IR_F32, 2, DIMS(ir_dim_sym(b), ir_dim_sym(n)));
    IrNode *all = ir_concat(g, mem, x, 1);
    ir_output(g, "kept", ir_slice(g, all, 1, ir_dim_sub(np, q), q));
    IrNode *w = ir_input(g, "w", IR_F32, 1, DIMS(q));
    ir_output(g, "w", w);
    static float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    Env e = {0};
    env_set(&e, "mem", IR_F32, 2, SHAPE(1, 0), data);
    env_set(&e, "x", IR_F32, 2, SHAPE(1, 3), data);
    env_set(&e, "w", IR_F32, 1, SHAPE(3), data);
    run_ok(g, &e); /* a first segment shorter than the cap: every row is kept */
    check_shape(0, IR_F32, 2, SHAPE(1, 3));
    check_f32(0, 3, (double[]){0, 1, 2});
    done(g);
    e.b[0].t.shape[1] = 4; /* 4 + 3 rows: the last 6 */
    e.b[2].t.shape[0] = 6;
    /* the same graph through the text form */
    IrGraph *g2 = ir_parse("graph xl(b, n <= 8, p <= 6, q = min(n+p, 6)) {\n"
                           "  %mem = input \"mem\" : f32[b, p]\n  %x = input \"x\" : f32[b, n]\n"
                           "  %all = concat %mem, %x [axis=1] : f32[b, p+n]\n"
                           "  %kept = slice %all [axis=1, start=n+p-q] : f32[b, q]\n"
                           "  %w = input \"w\" : f32[q]\n  output kept = %kept\n  output w = %w\n}\n",
                           "xl.ir", errbuf, sizeof errbuf);
    ck_assert_msg(g2 != NULL, "%s", errbuf);
    run_ok(g2, &e);
    check_shape(0, IR_F32, 2, SHAPE(1, 6));
    check_f32(0, 6, (double[]){1, 2, 3, 0, 1, 2});
    ir_host_free(&outs[0]);
    ir_host_free(&outs[1]);
    e.b[2].t.shape[0] = 7;
    ck_assert_str_eq(run_err(g2, &e), "input 'w': expected f32[q] (q=6), got f32[7]");
    done(g2);

    /* q = n - p (uncapped) below 0; r = 2*m, m bound by nothing */
    g = ir_graph_new("bad");
    n = ir_graph_add_sym(g, "n", 0);
    p = ir_graph_add_sym(g, "p", 0);
    int m = ir_graph_add_sym(g, "m", 0);
    IrDim d = ir_dim_sym(ir_graph_add_derived_sym(g, "d", ir_dim_sub(ir_dim_sym(n), ir_dim_sym(p)), 0));
    IrDim r = ir_dim_sym(ir_graph_add_derived_sym(g, "r", ir_dim_add(ir_dim_sym(m), ir_dim_sym(m)), 0));
    ir_input(g, "a", IR_F32, 1, DIMS(ir_dim_sym(n)));
    ir_input(g, "c", IR_F32, 1, DIMS(ir_dim_sym(p)));
    ir_output(g, "z", ir_expand(g, ir_const(g, 1, IR_F32), 1, DIMS(d)));
    Env e3 = {0};
    env_set(&e3, "a", IR_F32, 1, SHAPE(2), data);
    env_set(&e3, "c", IR_F32, 1, SHAPE(3), data);
    ck_assert_str_eq(run_err(g, &e3), "symbol 'd' = n-p is -1 with these inputs");
    e3.b[1].t.shape[0] = 1;
    run_ok(g, &e3);
    check_shape(0, IR_F32, 1, SHAPE(1));
    ir_host_free(&outs[0]);
    g->outputs[0].node = ir_expand(g, ir_const(g, 1, IR_F32), 1, DIMS(r));
    ck_assert_str_eq(run_err(g, &e3), "expand (node 4): symbol 'r' is not bound by any input");
    done(g);
}
END_TEST

/* ---- data movement ---- */

START_TEST(test_reshape_permute)
{
    IrGraph *g = ir_graph_new("perm");
    IrNode *x = ir_reshape(g, ir_arange(g, ir_dim(0), ir_dim(24), IR_F32), 3,
                           DIMS(ir_dim(2), ir_dim(3), ir_dim(4)));
    ir_output(g, "r", ir_reshape(g, x, 2, DIMS(ir_dim(4), ir_dim(6))));
    ir_output(g, "p", ir_permute(g, x, (int[]){2, 0, 1}));
    Env e = {0};
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(4, 6));
    for (int i = 0; i < 24; i++)
        ck_assert_float_eq(F(0, i), i);
    check_shape(1, IR_F32, 3, SHAPE(4, 2, 3));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) /* out[i][j][k] = x[j][k][i] = 12 j + 4 k + i */
                ck_assert_float_eq(F(1, (i * 2 + j) * 3 + k), 12 * j + 4 * k + i);
    done(g);
}
END_TEST

START_TEST(test_slice_concat_expand)
{
    IrGraph *g = ir_graph_new("move");
    int n = ir_graph_add_sym(g, "n", 0);
    IrNode *x = ir_input(g, "x", IR_F32, 2, DIMS(ir_dim(2), ir_dim_sym(n)));
    IrNode *y = ir_input(g, "y", IR_F32, 2, DIMS(ir_dim(1), ir_dim_sym(n)));
    /* the last two columns: start n-2, length 2 */
    ir_output(g, "tail", ir_slice(g, x, 1, ir_dim_addc(ir_dim_sym(n), -2), ir_dim(2)));
    ir_output(g, "row1", ir_slice(g, x, 0, ir_dim(1), ir_dim(1)));
    ir_output(g, "cat0", ir_concat(g, x, y, 0));
    ir_output(g, "cat1", ir_concat(g, x, x, 1));
    IrNode *c = ir_input(g, "c", IR_F32, 2, DIMS(ir_dim(3), ir_dim(1)));
    ir_output(g, "exp", ir_expand(g, c, 3, DIMS(ir_dim(2), ir_dim(3), ir_dim(4))));
    Env e = {0};
    float xv[8] = {0, 1, 2, 3, 10, 11, 12, 13}, yv[4] = {-1, -2, -3, -4}, cv[3] = {7, 8, 9};
    env_set(&e, "x", IR_F32, 2, SHAPE(2, 4), xv);
    env_set(&e, "y", IR_F32, 2, SHAPE(1, 4), yv);
    env_set(&e, "c", IR_F32, 2, SHAPE(3, 1), cv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(2, 2));
    check_f32(0, 4, (double[]){2, 3, 12, 13});
    check_shape(1, IR_F32, 2, SHAPE(1, 4));
    check_f32(1, 4, (double[]){10, 11, 12, 13});
    check_shape(2, IR_F32, 2, SHAPE(3, 4));
    check_f32(2, 12, (double[]){0, 1, 2, 3, 10, 11, 12, 13, -1, -2, -3, -4});
    check_shape(3, IR_F32, 2, SHAPE(2, 8));
    check_f32(3, 16, (double[]){0, 1, 2, 3, 0, 1, 2, 3, 10, 11, 12, 13, 10, 11, 12, 13});
    check_shape(4, IR_F32, 3, SHAPE(2, 3, 4));
    for (int i = 0; i < 24; i++)
        ck_assert_float_eq(F(4, i), cv[(i / 4) % 3]);
    done(g);
}
END_TEST

START_TEST(test_gather)
{
    IrGraph *g = ir_graph_new("gather");
    IrNode *t = ir_param(g, "emb", 2, DIMS(ir_dim(4), ir_dim(2)));
    IrNode *i = ir_input(g, "i", IR_I64, 2, DIMS(ir_dim(2), ir_dim(3)));
    ir_output(g, "g", ir_gather(g, t, i));
    Env e = {0};
    float tv[8] = {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f};
    int64_t iv[6] = {3, 0, 1, 1, 2, 3};
    env_set(&e, "emb", IR_F32, 2, SHAPE(4, 2), tv);
    env_set(&e, "i", IR_I64, 2, SHAPE(2, 3), iv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 3, SHAPE(2, 3, 2));
    for (int k = 0; k < 6; k++) {
        ck_assert_float_eq(F(0, 2 * k), iv[k]);
        ck_assert_float_eq(F(0, 2 * k + 1), iv[k] + 0.5);
    }
    done(g);
}
END_TEST

START_TEST(test_gather_out_of_range)
{
    IrGraph *g = ir_graph_new("gather");
    IrNode *t = ir_param(g, "token_emb.weight", 2, DIMS(ir_dim(64), ir_dim(2)));
    IrNode *i = ir_input(g, "tokens", IR_I64, 1, DIMS(ir_dim(3)));
    ir_output(g, "e", ir_label(g, ir_gather(g, t, i), "tok_emb"));
    Env e = {0};
    float tv[128] = {0};
    int64_t iv[3] = {1, 70, 2};
    env_set(&e, "token_emb.weight", IR_F32, 2, SHAPE(64, 2), tv);
    env_set(&e, "tokens", IR_I64, 1, SHAPE(3), iv);
    ck_assert_str_eq(run_err(g, &e), "gather %tok_emb: index 70 out of range [0, 64)");
    iv[1] = -1;
    ck_assert_str_eq(run_err(g, &e), "gather %tok_emb: index -1 out of range [0, 64)");
    done(g);
}
END_TEST

/* ---- matmul ---- */

START_TEST(test_matmul)
{
    IrGraph *g = ir_graph_new("matmul");
    IrNode *a = ir_input(g, "a", IR_F32, 2, DIMS(ir_dim(2), ir_dim(3)));
    IrNode *b = ir_input(g, "b", IR_F32, 2, DIMS(ir_dim(3), ir_dim(2)));
    IrNode *bt = ir_input(g, "bt", IR_F32, 2, DIMS(ir_dim(2), ir_dim(3))); /* [n, k] */
    ir_output(g, "ab", ir_matmul(g, a, b, 0));
    ir_output(g, "abt", ir_matmul(g, a, bt, 1));
    Env e = {0};
    float av[6] = {1, 2, 3, 4, 5, 6}, bv[6] = {7, 8, 9, 10, 11, 12}, btv[6] = {1, 0, -1, 2, 1, 0};
    env_set(&e, "a", IR_F32, 2, SHAPE(2, 3), av);
    env_set(&e, "b", IR_F32, 2, SHAPE(3, 2), bv);
    env_set(&e, "bt", IR_F32, 2, SHAPE(2, 3), btv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 2, SHAPE(2, 2));
    check_f32(0, 4, (double[]){58, 64, 139, 154});
    /* a @ bt^T: rows of bt are (1, 0, -1) and (2, 1, 0) */
    check_shape(1, IR_F32, 2, SHAPE(2, 2));
    check_f32(1, 4, (double[]){-2, 4, -2, 13});
    done(g);
}
END_TEST

/* a[2, 1, 2, 3] x b[3, 3, 2] -> [2, 3, 2, 2], and the transposed form with b[3, 2, 3] */
START_TEST(test_matmul_batched_broadcast)
{
    IrGraph *g = ir_graph_new("bmm");
    IrNode *a = ir_input(g, "a", IR_F32, 4, DIMS(ir_dim(2), ir_dim(1), ir_dim(2), ir_dim(3)));
    IrNode *b = ir_input(g, "b", IR_F32, 3, DIMS(ir_dim(3), ir_dim(3), ir_dim(2)));
    IrNode *bt = ir_input(g, "bt", IR_F32, 3, DIMS(ir_dim(3), ir_dim(2), ir_dim(3)));
    ir_output(g, "ab", ir_matmul(g, a, b, 0));
    ir_output(g, "abt", ir_matmul(g, a, bt, 1));
    Env e = {0};
    float av[12], bv[18], btv[18];
    for (int i = 0; i < 12; i++)
        av[i] = (float)(i % 5) - 1.5f;
    for (int i = 0; i < 18; i++) {
        bv[i] = (float)((i * 7) % 11) - 4;
        btv[i] = (float)((i * 5) % 7) * 0.5f;
    }
    env_set(&e, "a", IR_F32, 4, SHAPE(2, 1, 2, 3), av);
    env_set(&e, "b", IR_F32, 3, SHAPE(3, 3, 2), bv);
    env_set(&e, "bt", IR_F32, 3, SHAPE(3, 2, 3), btv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 4, SHAPE(2, 3, 2, 2));
    check_shape(1, IR_F32, 4, SHAPE(2, 3, 2, 2));
    double want[24], want_t[24];
    for (int p = 0; p < 2; p++)         /* a's batch */
        for (int q = 0; q < 3; q++)     /* b's batch */
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    double s = 0, st = 0;
                    for (int k = 0; k < 3; k++) {
                        double x = av[(p * 2 + i) * 3 + k];
                        s += x * bv[(q * 3 + k) * 2 + j];
                        st += x * btv[(q * 2 + j) * 3 + k];
                    }
                    want[((p * 3 + q) * 2 + i) * 2 + j] = s;
                    want_t[((p * 3 + q) * 2 + i) * 2 + j] = st;
                }
    check_f32(0, 24, want);
    check_f32(1, 24, want_t);
    done(g);
}
END_TEST

/* ---- cross entropy ---- */

START_TEST(test_xent)
{
    IrGraph *g = ir_graph_new("xent");
    IrNode *z = ir_input(g, "z", IR_F32, 3, DIMS(ir_dim(2), ir_dim(3), ir_dim(4)));
    IrNode *t = ir_input(g, "t", IR_I64, 2, DIMS(ir_dim(2), ir_dim(3)));
    ir_output(g, "loss", ir_label(g, ir_xent(g, z, t), "loss"));
    Env e = {0};
    float zv[24];
    for (int i = 0; i < 24; i++)
        zv[i] = (float)sin(i * 1.7) * 3;
    int64_t tv[6] = {0, -100, 3, 2, -1, 1}; /* two positions ignored */
    env_set(&e, "z", IR_F32, 3, SHAPE(2, 3, 4), zv);
    env_set(&e, "t", IR_I64, 2, SHAPE(2, 3), tv);
    run_ok(g, &e);
    check_shape(0, IR_F32, 0, NULL);
    double want = 0; /* -log softmax(z)[t], without the max subtraction */
    int count = 0;
    for (int p = 0; p < 6; p++) {
        if (tv[p] < 0)
            continue;
        double s = 0;
        for (int j = 0; j < 4; j++)
            s += exp(zv[p * 4 + j]);
        want += -log(exp(zv[p * 4 + tv[p]]) / s);
        count++;
    }
    check_f32(0, 1, (double[]){want / count});
    ir_host_free(&outs[0]);

    /* nothing counts: 0 */
    int64_t none[6] = {-100, -100, -100, -100, -100, -100};
    e.b[1].t.data = none;
    run_ok(g, &e);
    ck_assert_float_eq(F(0, 0), 0);
    ir_host_free(&outs[0]);

    /* a target past the vocabulary */
    int64_t bad[6] = {0, 1, 4, 0, 0, 0};
    e.b[1].t.data = bad;
    ck_assert_str_eq(run_err(g, &e), "cross_entropy %loss: target 4 out of range [0, 4)");
    done(g);
}
END_TEST

/* ---- symbolic shapes ---- */

/* tokens i64[b, n] -> embeddings [b, n, 2] + positions arange(n), summed over n */
static IrGraph *symbolic_graph(void)
{
    IrGraph *g = ir_graph_new("sym");
    int b = ir_graph_add_sym(g, "b", 8), n = ir_graph_add_sym(g, "n", 16);
    IrNode *tok = ir_input(g, "tokens", IR_I64, 2, DIMS(ir_dim_sym(b), ir_dim_sym(n)));
    IrNode *emb = ir_param(g, "emb", 2, DIMS(ir_dim(5), ir_dim(2)));
    IrNode *x = ir_gather(g, emb, tok); /* [b, n, 2] */
    IrNode *pos = ir_reshape(g, ir_arange(g, ir_dim(0), ir_dim_sym(n), IR_F32), 2,
                             DIMS(ir_dim_sym(n), ir_dim(1))); /* [n, 1] */
    IrNode *y = ir_binary(g, IR_ADD, x, pos);
    ir_output(g, "sum", ir_reduce(g, IR_SUM, y, 1)); /* [b, 1, 2] */
    ir_output(g, "y", y);
    return g;
}

static void check_symbolic(int64_t nb, int64_t nn)
{
    IrGraph *g = symbolic_graph();
    Env e = {0};
    float ev[10] = {0, 1, 10, 11, 20, 21, 30, 31, 40, 41};
    int64_t tok[64];
    for (int i = 0; i < nb * nn; i++)
        tok[i] = (i * 3) % 5;
    env_set(&e, "emb", IR_F32, 2, SHAPE(5, 2), ev);
    env_set(&e, "tokens", IR_I64, 2, SHAPE(nb, nn), tok);
    run_ok(g, &e);
    check_shape(0, IR_F32, 3, SHAPE(nb, 1, 2));
    check_shape(1, IR_F32, 3, SHAPE(nb, nn, 2));
    for (int64_t bi = 0; bi < nb; bi++) {
        double s0 = 0, s1 = 0;
        for (int64_t i = 0; i < nn; i++) {
            int64_t t = tok[bi * nn + i];
            ck_assert_float_eq(F(1, (bi * nn + i) * 2), 10 * t + i);
            s0 += 10 * t + i;
            s1 += 10 * t + 1 + i;
        }
        ck_assert_float_eq(F(0, bi * 2), s0);
        ck_assert_float_eq(F(0, bi * 2 + 1), s1);
    }
    done(g);
}

START_TEST(test_symbolic_two_sizes)
{
    check_symbolic(2, 3);
    check_symbolic(1, 5);
    check_symbolic(4, 16);
}
END_TEST

static Suite *interp_suite(void)
{
    Suite *s = suite_create("interp");
    TCase *t = tcase_create("ops");
    tcase_add_test(t, test_every_op_has_entry);
    tcase_add_test(t, test_leaves);
    tcase_add_test(t, test_const_arange);
    tcase_add_test(t, test_relpos_causal);
    tcase_add_test(t, test_relpos_bidirectional);
    tcase_add_test(t, test_relpos_far);
    tcase_add_test(t, test_relpos_other_settings);
    tcase_add_test(t, test_unary);
    tcase_add_test(t, test_cast);
    tcase_add_test(t, test_binary_broadcast);
    tcase_add_test(t, test_compare_logic_where);
    tcase_add_test(t, test_integer_arith);
    tcase_add_test(t, test_attention_bound_checked);
    tcase_add_test(t, test_reduce_softmax);
    tcase_add_test(t, test_row_order_ops);
    tcase_add_test(t, test_derived_symbols);
    tcase_add_test(t, test_reshape_permute);
    tcase_add_test(t, test_slice_concat_expand);
    tcase_add_test(t, test_gather);
    tcase_add_test(t, test_matmul);
    tcase_add_test(t, test_matmul_batched_broadcast);
    tcase_add_test(t, test_xent);
    tcase_add_test(t, test_symbolic_two_sizes);
    suite_add_tcase(s, t);

    TCase *e = tcase_create("errors"); /* of the ops here; the rest: test_interp_models */
    tcase_add_test(e, test_integer_errors);
    tcase_add_test(e, test_gather_out_of_range);
    suite_add_tcase(s, e);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(interp_suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
