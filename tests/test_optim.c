/* test_optim.c: the runtime's training half (runtime/rt_optim.c): the AdamW step of
 * xtc_session_step against an independent double-precision implementation of
 * torch.optim.AdamW (+ clip_grad_norm_), the same bits for any number of threads, the
 * optimizer state through checkpoints, the errors, and the gradients summed through a
 * communicator (runtime/rt_comm.c, with a fake one; tests/test_mpi.sh runs MPI).
 *
 * The model is a compiled training module of a small graph whose gradients are known in closed
 * form: loss = sum(w * x) + sum(b * y) + 0.5 * sum(b * b), so grad.w = x and grad.b = y + b (it
 * depends on the parameter, so the reference must follow the weights step by step). w has more
 * elements than the optimizer's block (8192), so steps cross block and parameter boundaries. */
#include "codegen.h"
#include "harness.h"
#include "harness_drive.h"
#include "init.h"
#include "rt_abi.h"
#include "ir.h"
#include "safetensors.h"
#include "xtc.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WR 37
#define WC 300
#define NW (WR * WC)
#define NB 5

static char module_path[300], plain_path[300];

/* loss = sum(w * x) + sum(b * y) + 0.5 sum(b * b); grads by ir_autodiff (grads = 1) */
static IrGraph *build(int grads)
{
    IrGraph *g = ir_graph_new("quad");
    IrDim ws[2] = {ir_dim(WR), ir_dim(WC)}, bs[1] = {ir_dim(NB)};
    IrNode *w = ir_param(g, "w", 2, ws), *b = ir_param(g, "layer.b", 1, bs);
    IrNode *x = ir_input(g, "x", IR_F32, 2, ws), *y = ir_input(g, "y", IR_F32, 1, bs);
    IrNode *sw = ir_reduce(g, IR_SUM, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, w, x), 1), 0);
    IrNode *bb = ir_binary(g, IR_ADD, ir_binary(g, IR_MUL, b, y),
                           ir_binary(g, IR_MUL, ir_binary(g, IR_MUL, b, b), ir_const(g, 0.5, IR_F32)));
    IrNode *sb = ir_reduce(g, IR_SUM, bb, 0);
    IrNode *loss = ir_binary(g, IR_ADD, ir_reshape(g, sw, 0, NULL), ir_reshape(g, sb, 0, NULL));
    ir_output(g, "loss", loss);
    ck_assert_msg(!ir_graph_error(g), "%s", ir_graph_error(g));
    char err[512];
    if (grads)
        ck_assert_msg(ir_autodiff(g, NULL, err, sizeof err) == 0, "%s", err);
    return g;
}

static void compile_to(const char *path, int grads)
{
    IrGraph *g = build(grads);
    char err[1024];
    CgOptions opt = {.output = path, .opt_level = 1};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "%s", err);
    ir_graph_free(g);
}

/* the modules, in the scratch directory that harness_run makes */
static void setup(void)
{
    snprintf(module_path, sizeof module_path, "%s/quad_train.so", tmpdir);
    snprintf(plain_path, sizeof plain_path, "%s/quad.so", tmpdir);
    compile_to(module_path, 1);
    compile_to(plain_path, 0);
}

/* ---- data and sessions ---- */

typedef struct {
    float w[NW], b[NB], x[NW], y[NB];
} Data;

static void fill(Data *d, uint64_t seed)
{
    RtRng r;
    rt_rng_seed(&r, seed);
    for (int i = 0; i < NW; i++) {
        d->w[i] = (float)rt_rng_normal(&r);
        d->x[i] = (float)(rt_rng_normal(&r) * (i % 7 == 0 ? 3 : 0.1)); /* some large gradients */
    }
    for (int i = 0; i < NB; i++) {
        d->b[i] = (float)rt_rng_normal(&r);
        d->y[i] = (float)rt_rng_normal(&r);
    }
}

static XtcSession *session(XtcModule **m, const char *path, int threads, const Data *d)
{
    ck_assert_msg(xtc_module_load(path, m) == XTC_OK, "%s", xtc_module_error(*m));
    XtcSession *s;
    XtcSessionOptions so = {.threads = threads};
    ck_assert_msg(xtc_session_new(*m, &so, &s) == XTC_OK, "%s", xtc_session_error(s));
    int64_t ws[2] = {WR, WC}, bs[1] = {NB};
    ck_assert_int_eq(xtc_session_set_weight(s, "w", 2, ws, d->w), XTC_OK);
    ck_assert_int_eq(xtc_session_set_weight(s, "layer.b", 1, bs, d->b), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, ws, d->x), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "y", XTC_F32, 1, bs, d->y), XTC_OK);
    return s;
}

static void run_step(XtcSession *s, const XtcAdamW *o)
{
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_step(s, o) == XTC_OK, "%s", xtc_session_error(s));
}

static const float *weight(XtcSession *s, const char *name)
{
    XtcTensor t;
    ck_assert_msg(xtc_session_get_weight(s, name, &t) == XTC_OK, "%s", xtc_session_error(s));
    return t.data;
}

/* The settings of the steps: the second clips (the norm is far above 1), the third does not. */
static XtcAdamW settings(int k)
{
    XtcAdamW o = xtc_adamw_defaults();
    o.lr = k == 0 ? 1e-2f : k == 1 ? 3e-3f : 5e-2f;
    o.weight_decay = 0.1f;
    o.beta2 = 0.99f;
    o.max_grad_norm = k == 1 ? 1.0f : k == 2 ? 1e6f : 0;
    return o;
}

/* ---- the reference: torch.optim.AdamW after clip_grad_norm_, in double ---- */

typedef struct {
    double p[NW + NB], m[NW + NB], v[NW + NB];
    int t;
} Ref;

static void ref_step(Ref *r, const Data *d, const XtcAdamW *o)
{
    double g[NW + NB], sq = 0;
    for (int i = 0; i < NW; i++)
        g[i] = d->x[i];
    for (int i = 0; i < NB; i++)
        g[NW + i] = d->y[i] + r->p[NW + i];
    for (int i = 0; i < NW + NB; i++)
        sq += g[i] * g[i];
    double norm = sqrt(sq), coef = 1;
    if (o->max_grad_norm > 0) {
        coef = o->max_grad_norm / (norm + 1e-6);
        if (coef > 1)
            coef = 1;
    }
    r->t++;
    double bc1 = 1 - pow(o->beta1, r->t), bc2 = 1 - pow(o->beta2, r->t);
    for (int i = 0; i < NW + NB; i++) {
        double gi = g[i] * coef;
        r->p[i] *= 1 - (double)o->lr * o->weight_decay;
        r->m[i] = o->beta1 * r->m[i] + (1 - (double)o->beta1) * gi;
        r->v[i] = o->beta2 * r->v[i] + (1 - (double)o->beta2) * gi * gi;
        r->p[i] -= o->lr / bc1 * r->m[i] / (sqrt(r->v[i]) / sqrt(bc2) + o->eps);
    }
}

START_TEST(test_adamw_matches_reference)
{
    static Data d;
    static Ref r;
    fill(&d, 7);
    memset(&r, 0, sizeof r);
    for (int i = 0; i < NW; i++)
        r.p[i] = d.w[i];
    for (int i = 0; i < NB; i++)
        r.p[NW + i] = d.b[i];
    XtcModule *m;
    XtcSession *s = session(&m, module_path, 2, &d);
    ck_assert_int_eq(xtc_session_step_count(s), 0);
    ck_assert(xtc_session_grad_norm(s) < 0);
    for (int k = 0; k < 3; k++) {
        XtcAdamW o = settings(k);
        run_step(s, &o);
        ref_step(&r, &d, &o);
        const float *w = weight(s, "w"), *b = weight(s, "layer.b");
        double worst = 0;
        for (int i = 0; i < NW + NB; i++) {
            double got = i < NW ? w[i] : b[i - NW], want = r.p[i];
            double err = fabs(got - want) / (1e-6 + 1e-5 * fabs(want));
            if (err > worst)
                worst = err;
            expect_msg(fabs(got - want) <= 1e-6 + 1e-5 * fabs(want),
                       "step %d, element %d: %.9g, the reference has %.9g", k + 1, i, got, want);
        }
        XtcTensor mt, vt;
        ck_assert_int_eq(xtc_session_get_optim(s, "layer.b", &mt, &vt), XTC_OK);
        ck_assert_int_eq(mt.rank, 1);
        ck_assert_int_eq(mt.shape[0], NB);
        for (int i = 0; i < NB; i++) {
            ck_assert(fabs(((const float *)mt.data)[i] - r.m[NW + i]) <= 1e-6 + 1e-5 * fabs(r.m[NW + i]));
            ck_assert(fabs(((const float *)vt.data)[i] - r.v[NW + i]) <= 1e-7 + 1e-5 * fabs(r.v[NW + i]));
        }
    }
    ck_assert_int_eq(xtc_session_step_count(s), 3);
    ck_assert(xtc_session_grad_norm(s) > 1);
    /* the outputs of the last run stay readable after the step */
    XtcTensor loss;
    ck_assert_int_eq(xtc_session_get_output(s, "loss", &loss), XTC_OK);
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

START_TEST(test_adamw_thread_independent)
{
    static Data d;
    fill(&d, 11);
    static float w1[NW], b1[NB];
    for (int threads = 1; threads <= 3; threads += 2) {
        XtcModule *m;
        XtcSession *s = session(&m, module_path, threads, &d);
        for (int k = 0; k < 3; k++) {
            XtcAdamW o = settings(k);
            run_step(s, &o);
        }
        if (threads == 1) {
            memcpy(w1, weight(s, "w"), sizeof w1);
            memcpy(b1, weight(s, "layer.b"), sizeof b1);
        } else {
            ck_assert_msg(memcmp(w1, weight(s, "w"), sizeof w1) == 0, "w differs between 1 and 3 threads");
            ck_assert_msg(memcmp(b1, weight(s, "layer.b"), sizeof b1) == 0, "b differs between 1 and 3 threads");
        }
        xtc_session_free(s);
        xtc_module_free(m);
    }
}
END_TEST

/* save after two steps, load into a fresh session, take a third step in both: same bits */
START_TEST(test_checkpoint_continues)
{
    static Data d;
    fill(&d, 5);
    char ckpt[400];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", tmpdir);
    XtcModule *m1, *m2;
    XtcSession *a = session(&m1, module_path, 2, &d);
    for (int k = 0; k < 2; k++) {
        XtcAdamW o = settings(k);
        run_step(a, &o);
    }
    const char *keys[1] = {"note"}, *vals[1] = {"hello"};
    ck_assert_msg(xtc_session_save_checkpoint(a, ckpt, keys, vals, 1) == XTC_OK, "%s", xtc_session_error(a));
    RtStFile *f;
    char err[512];
    ck_assert_msg(rt_st_open(ckpt, &f, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(rt_st_metadata(f, "xtc.optim.step"), "2");
    ck_assert_str_eq(rt_st_metadata(f, "note"), "hello");
    ck_assert_ptr_nonnull(rt_st_find(f, "optim.m.w"));
    ck_assert_ptr_nonnull(rt_st_find(f, "optim.v.layer.b"));
    ck_assert_int_eq(rt_st_count(f), 6);
    rt_st_close(f);

    Data other;
    fill(&other, 99); /* different weights, replaced by the checkpoint's */
    memcpy(other.x, d.x, sizeof d.x);
    memcpy(other.y, d.y, sizeof d.y);
    XtcSession *b = session(&m2, module_path, 1, &other);
    ck_assert_msg(xtc_session_load_checkpoint(b, ckpt, 1) == XTC_OK, "%s", xtc_session_error(b));
    ck_assert_int_eq(xtc_session_step_count(b), 2);
    ck_assert(memcmp(weight(a, "w"), weight(b, "w"), NW * sizeof(float)) == 0);
    XtcAdamW o = settings(2);
    run_step(a, &o);
    run_step(b, &o);
    ck_assert_msg(memcmp(weight(a, "w"), weight(b, "w"), NW * sizeof(float)) == 0, "w after the resumed step");
    ck_assert(memcmp(weight(a, "layer.b"), weight(b, "layer.b"), NB * sizeof(float)) == 0);
    /* weights only: the optimizer starts over */
    ck_assert_msg(xtc_session_load_checkpoint(b, ckpt, 0) == XTC_OK, "%s", xtc_session_error(b));
    ck_assert_int_eq(xtc_session_step_count(b), 3);
    ck_assert_msg(xtc_session_load_checkpoint(b, ckpt, 1) == XTC_OK, "%s", xtc_session_error(b));
    ck_assert_int_eq(xtc_session_step_count(b), 2);
    xtc_session_free(a);
    xtc_session_free(b);
    xtc_module_free(m1);
    xtc_module_free(m2);

    /* a forward module (no gradients) loads the checkpoint's weights and ignores the rest */
    XtcModule *m3;
    XtcSession *c = session(&m3, plain_path, 1, &other);
    ck_assert_msg(xtc_session_load_checkpoint(c, ckpt, 0) == XTC_OK, "%s", xtc_session_error(c));
    xtc_session_free(c);
    xtc_module_free(m3);
}
END_TEST

/* a checkpoint loads as weights (xtc_session_load_weights ignores the
 * optimizer state of the module's parameters, not other extra tensors); non-finite weights are
 * never saved (XTC_ERR_RANGE, the previous file intact) */
START_TEST(test_checkpoint_as_weights)
{
    static Data d;
    fill(&d, 7);
    char ckpt[400], other[400];
    snprintf(ckpt, sizeof ckpt, "%s/ckw.safetensors", tmpdir);
    snprintf(other, sizeof other, "%s/ckw_extra.safetensors", tmpdir);
    XtcModule *m1, *m2;
    XtcSession *a = session(&m1, module_path, 1, &d);
    XtcAdamW o = settings(0);
    run_step(a, &o);
    ck_assert_msg(xtc_session_save_checkpoint(a, ckpt, NULL, NULL, 0) == XTC_OK, "%s", xtc_session_error(a));
    static Data z;
    fill(&z, 123);
    memcpy(z.x, d.x, sizeof d.x);
    memcpy(z.y, d.y, sizeof d.y);
    XtcSession *b = session(&m2, plain_path, 1, &z);
    ck_assert_msg(xtc_session_load_weights(b, ckpt) == XTC_OK, "%s", xtc_session_error(b));
    ck_assert(memcmp(weight(a, "w"), weight(b, "w"), NW * sizeof(float)) == 0);
    /* optimizer state of a name that is no parameter stays an error */
    RtStWriter *w = rt_st_writer_new();
    int64_t ws[2] = {WR, WC}, bs[1] = {NB};
    rt_st_writer_add(w, "w", RT_F32, 2, ws, d.w);
    rt_st_writer_add(w, "layer.b", RT_F32, 1, bs, d.b);
    rt_st_writer_add(w, "optim.m.nosuch", RT_F32, 1, bs, d.b);
    char err[512];
    ck_assert_msg(rt_st_writer_save(w, other, err, sizeof err) == 0, "%s", err);
    rt_st_writer_free(w);
    ck_assert_int_eq(xtc_session_load_weights(b, other), XTC_ERR_NAME);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(b), "'optim.m.nosuch'"));
    /* a diverged weight: not saved, the previous checkpoint stays */
    FILE *fp = fopen(ckpt, "rb");
    ck_assert_ptr_nonnull(fp);
    static unsigned char before[1 << 20], after[1 << 20];
    size_t nb = fread(before, 1, sizeof before, fp);
    fclose(fp);
    static float bad[NW];
    memcpy(bad, d.w, sizeof bad);
    bad[41] = NAN;
    ck_assert_int_eq(xtc_session_set_weight(a, "w", 2, ws, bad), XTC_OK);
    ck_assert_int_eq(xtc_session_save_checkpoint(a, ckpt, NULL, NULL, 0), XTC_ERR_RANGE);
    ck_assert_msg(strstr(xtc_session_error(a), "weight 'w' holds nan at element 41"), "%s", xtc_session_error(a));
    fp = fopen(ckpt, "rb");
    ck_assert_ptr_nonnull(fp);
    size_t na = fread(after, 1, sizeof after, fp);
    fclose(fp);
    ck_assert(na == nb && memcmp(before, after, na) == 0);
    xtc_session_free(a);
    xtc_session_free(b);
    xtc_module_free(m1);
    xtc_module_free(m2);
}
END_TEST

START_TEST(test_errors)
{
    static Data d;
    fill(&d, 3);
    XtcModule *m;
    XtcSession *s = session(&m, module_path, 1, &d);
    XtcAdamW o = xtc_adamw_defaults();
    ck_assert_int_eq(xtc_session_step(s, &o), XTC_ERR_STATE); /* no run yet */
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "run"));
    ck_assert_int_eq(xtc_session_step(s, NULL), XTC_ERR_ARG);
    XtcAdamW bad = o;
    bad.beta1 = 1;
    ck_assert_int_eq(xtc_session_step(s, &bad), XTC_ERR_RANGE);
    bad = o;
    bad.lr = NAN;
    ck_assert_int_eq(xtc_session_step(s, &bad), XTC_ERR_RANGE);
    XtcTensor t;
    ck_assert_int_eq(xtc_session_get_optim(s, "w", &t, NULL), XTC_ERR_STATE);
    ck_assert_int_eq(xtc_session_get_weight(s, "nope", &t), XTC_ERR_NAME);
    ck_assert_int_eq(xtc_session_load_checkpoint(s, "/nonexistent/x.safetensors", 1), XTC_ERR_IO);
    ck_assert_int_eq(xtc_session_step(NULL, &o), XTC_ERR_ARG);

    /* a checkpoint with a stranger tensor, or with part of the optimizer state, is refused and
     * changes nothing */
    char path[400];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    int64_t ws[2] = {WR, WC}, bs[1] = {NB};
    static float zeros[NW];
    RtStWriter *w = rt_st_writer_new();
    rt_st_writer_add(w, "w", RT_F32, 2, ws, zeros);
    rt_st_writer_add(w, "layer.b", RT_F32, 1, bs, zeros);
    rt_st_writer_add(w, "optim.m.w", RT_F32, 2, ws, zeros);
    rt_st_writer_meta(w, "xtc.optim.step", "4");
    char err[512];
    ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), 0);
    rt_st_writer_free(w);
    ck_assert_int_eq(xtc_session_load_checkpoint(s, path, 1), XTC_ERR_NAME);
    ck_assert(weight(s, "w")[0] == d.w[0]);
    w = rt_st_writer_new();
    rt_st_writer_add(w, "w", RT_F32, 2, ws, zeros);
    rt_st_writer_add(w, "layer.b", RT_F32, 1, bs, zeros);
    rt_st_writer_add(w, "decoder.extra", RT_F32, 1, bs, zeros);
    ck_assert_int_eq(rt_st_writer_save(w, path, err, sizeof err), 0);
    rt_st_writer_free(w);
    ck_assert_int_eq(xtc_session_load_checkpoint(s, path, 0), XTC_ERR_NAME);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "decoder.extra"));
    ck_assert(weight(s, "w")[0] == d.w[0]);
    xtc_session_free(s);
    xtc_module_free(m);

    /* a module without gradients cannot step */
    s = session(&m, plain_path, 1, &d);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    ck_assert_int_eq(xtc_session_step(s, &o), XTC_ERR_NAME);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "grad.w"));
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* ---- data parallelism without MPI: a communicator of two ranks where the other rank had the
 * same gradients (a sum is the data times 2), so that with the default share 1/2 the summed
 * gradients are this rank's own, bit for bit ---- */

typedef struct {
    int starts, waits, tests, bcasts, released, fail;
    int64_t floats, bcast_bytes;
} FakeComm;

static int fake_start(void *ctx, float *data, int64_t n, void **req, char *err, size_t errlen)
{
    FakeComm *f = ctx;
    if (f->fail) {
        snprintf(err, errlen, "the fake link is down");
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        data[i] *= 2;
    f->starts++;
    f->floats += n;
    *req = f;
    return 0;
}

static int fake_test(void *ctx, void *req, char *err, size_t errlen)
{
    (void)req, (void)err, (void)errlen;
    ((FakeComm *)ctx)->tests++;
    return 0; /* never done early: every bucket is waited for */
}

static int fake_wait(void *ctx, void *req, char *err, size_t errlen)
{
    (void)req, (void)err, (void)errlen;
    ((FakeComm *)ctx)->waits++;
    return 0;
}

static int fake_bcast(void *ctx, void *data, int64_t bytes, int root, char *err, size_t errlen)
{
    (void)data, (void)root, (void)err, (void)errlen;
    FakeComm *f = ctx;
    f->bcasts++;
    f->bcast_bytes += bytes;
    return 0;
}

static void fake_release(void *ctx) { ((FakeComm *)ctx)->released++; }

START_TEST(test_comm_sums_gradients)
{
    static Data d;
    fill(&d, 5);
    XtcModule *m1, *m2;
    XtcSession *alone = session(&m1, module_path, 2, &d), *ranked = session(&m2, module_path, 2, &d);
    FakeComm f = {0};
    XtcComm c = {.rank = 0, .size = 2, .ctx = &f, .allreduce_start = fake_start, .test = fake_test,
                 .wait = fake_wait, .broadcast = fake_bcast, .release = fake_release};
    XtcComm no_wait = c;
    no_wait.wait = NULL;
    ck_assert_int_eq(xtc_session_set_comm(ranked, &no_wait), XTC_ERR_ARG);
    ck_assert_int_eq(xtc_session_set_grad_share(ranked, 0.5), XTC_ERR_STATE); /* no communicator yet */
    ck_assert_int_eq(xtc_session_set_comm(ranked, &c), XTC_OK);
    ck_assert_int_eq(xtc_session_set_grad_share(ranked, 0), XTC_ERR_RANGE);
    ck_assert_int_eq(xtc_session_set_grad_share(ranked, 1.5), XTC_ERR_RANGE);
    ck_assert_int_eq(xtc_session_sync(ranked), XTC_OK); /* w, b, and the step count (0: no state) */
    ck_assert_int_eq(f.bcasts, 3);
    ck_assert_int_eq(f.bcast_bytes, (NW + NB) * 4 + 8);
    for (int k = 0; k < 3; k++) {
        XtcAdamW o = settings(k);
        run_step(alone, &o);
        run_step(ranked, &o);
        ck_assert_msg(memcmp(weight(alone, "w"), weight(ranked, "w"), NW * 4) == 0, "w differs at step %d", k + 1);
        ck_assert_msg(memcmp(weight(alone, "layer.b"), weight(ranked, "layer.b"), NB * 4) == 0, "b differs");
        ck_assert(xtc_session_grad_norm(alone) == xtc_session_grad_norm(ranked)); /* the clip's norm */
    }
    /* one bucket per parameter here (each alone, or both within 4 MiB): every float summed once a run */
    ck_assert_int_eq(f.floats, 3 * (NW + NB));
    ck_assert_int_eq(f.waits, f.starts);
    ck_assert_int_eq(xtc_session_sync(ranked), XTC_OK); /* now with the optimizer's m and v */
    /* the weights, the step count, whether rank 0 holds all of the state (not ZeRO-1 shards), m, v */
    ck_assert_int_eq(f.bcasts, 3 + 6);
    /* paused (evaluation): the run sums nothing, and no step follows it */
    int starts = f.starts;
    ck_assert_int_eq(xtc_session_set_comm_paused(ranked, 1), XTC_OK);
    ck_assert_msg(xtc_session_run(ranked) == XTC_OK, "%s", xtc_session_error(ranked));
    ck_assert_int_eq(f.starts, starts);
    XtcAdamW o0 = settings(0);
    ck_assert_int_eq(xtc_session_step(ranked, &o0), XTC_ERR_STATE);
    ck_assert_msg(strstr(xtc_session_error(ranked), "paused"), "%s", xtc_session_error(ranked));
    ck_assert_int_eq(xtc_session_set_comm_paused(ranked, 0), XTC_OK);
    double during = -1, after = -1;
    ck_assert_int_eq(xtc_session_comm_time(ranked, &during, &after), XTC_OK);
    ck_assert(during >= 0 && after >= 0);
    /* a failed sum fails the run, naming the communicator's message; no step on those gradients */
    f.fail = 1;
    ck_assert_int_eq(xtc_session_run(ranked), XTC_ERR_IO);
    ck_assert_msg(strstr(xtc_session_error(ranked), "the fake link is down"), "%s", xtc_session_error(ranked));
    XtcAdamW o = settings(0);
    ck_assert_int_eq(xtc_session_step(ranked, &o), XTC_ERR_STATE);
    ck_assert_int_eq(f.released, 0);
    ck_assert_int_eq(xtc_session_set_comm(ranked, NULL), XTC_OK); /* detached: released once */
    ck_assert_int_eq(f.released, 1);
    ck_assert_int_eq(xtc_session_set_comm(ranked, &c), XTC_OK);
    xtc_session_free(ranked);
    ck_assert_int_eq(f.released, 2);
    xtc_session_free(alone);
    xtc_module_free(m1);
    xtc_module_free(m2);
}
END_TEST

/* ZeRO-1's interface through the fake communicator (whose broadcasts move nothing: the values
 * are tested with MPI, test_mpi.sh (d)): this module's parameters are two blocks of the optimizer's
 * vector, one per rank; after a step the state is sharded, refused by get_optim and checkpoints
 * with the way out, until xtc_session_gather_optim (one broadcast of m and one of v per rank);
 * turning ZeRO-1 off gathers too, and it needs a communicator. */
START_TEST(test_zero1)
{
    static Data d;
    fill(&d, 7);
    XtcModule *m;
    XtcSession *s = session(&m, module_path, 1, &d);
    ck_assert_int_eq(xtc_session_set_zero1(s, 1), XTC_ERR_STATE); /* no communicator */
    ck_assert_int_eq(xtc_session_gather_optim(s), XTC_OK);        /* nothing to gather */
    FakeComm f = {0};
    XtcComm c = {.rank = 0, .size = 2, .ctx = &f, .allreduce_start = fake_start, .test = fake_test,
                 .wait = fake_wait, .broadcast = fake_bcast};
    ck_assert_int_eq(xtc_session_set_comm(s, &c), XTC_OK);
    ck_assert_int_eq(xtc_session_set_zero1(s, 1), XTC_OK);
    XtcAdamW o = settings(0);
    run_step(s, &o);
    ck_assert_int_eq(f.bcasts, 2); /* each shard of the weights from its owner */
    XtcTensor mt, vt;
    ck_assert_int_eq(xtc_session_get_optim(s, "w", &mt, &vt), XTC_ERR_STATE);
    ck_assert_msg(strstr(xtc_session_error(s), "xtc_session_gather_optim"), "%s", xtc_session_error(s));
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/zero1.safetensors", tmpdir);
    ck_assert_int_eq(xtc_session_save_checkpoint(s, ckpt, NULL, NULL, 0), XTC_ERR_STATE);
    ck_assert_int_eq(xtc_session_gather_optim(s), XTC_OK);
    ck_assert_int_eq(f.bcasts, 2 + 4);
    ck_assert_int_eq(xtc_session_get_optim(s, "w", &mt, &vt), XTC_OK);
    ck_assert_msg(xtc_session_save_checkpoint(s, ckpt, NULL, NULL, 0) == XTC_OK, "%s", xtc_session_error(s));
    run_step(s, &o); /* sharded again */
    ck_assert_int_eq(xtc_session_get_optim(s, "w", &mt, &vt), XTC_ERR_STATE);
    ck_assert_int_eq(xtc_session_set_comm(s, NULL), XTC_ERR_STATE); /* the shards would be lost */
    ck_assert_int_eq(xtc_session_set_zero1(s, 0), XTC_OK); /* off: gathered */
    ck_assert_int_eq(xtc_session_set_comm(s, NULL), XTC_OK);
    ck_assert_int_eq(xtc_session_get_optim(s, "w", &mt, &vt), XTC_OK);
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* A weight's initialisation rule (IrInit) survives the IR text and the passes' rewrite, goes into
 * the module, and rt_init_module_param fills by it; a later rule replaces an earlier one. */
START_TEST(test_init_hint)
{
    IrGraph *g = build(0);
    ck_assert_int_eq(ir_init(g, ir_find_leaf(g, IR_PARAM, "w"), IR_INIT_CONST, 0.5), 0);
    ck_assert_int_eq(ir_init(g, ir_find_leaf(g, IR_PARAM, "w"), IR_INIT_CONST, 0.25), 0); /* replaces */
    ck_assert_int_eq(ir_init(g, ir_find_leaf(g, IR_PARAM, "layer.b"), IR_INIT_UNIFORM, 0.125), 0);
    ck_assert_int_lt(ir_init(g, ir_find_leaf(g, IR_INPUT, "x"), IR_INIT_CONST, 0.5), 0); /* a weight */
    ck_assert_int_eq(g->ninits, 2);
    char *text = ir_print_str(g);
    ck_assert_ptr_nonnull(strstr(text, "init %w = 0.25"));
    ck_assert_ptr_nonnull(strstr(text, " = uniform 0.125"));
    char err[1024];
    IrGraph *back = ir_parse(text, "hint.ir", err, sizeof err);
    ck_assert_msg(back != NULL, "%s", err);
    ck_assert_int_eq(back->ninits, 2);
    ck_assert_double_eq(ir_find_init(back, ir_find_leaf(back, IR_PARAM, "w"))->value, 0.25);
    ck_assert_int_eq(ir_find_init(back, ir_find_leaf(back, IR_PARAM, "layer.b"))->kind, IR_INIT_UNIFORM);
    char path[600];
    snprintf(path, sizeof path, "%s/hint.so", tmpdir);
    CgOptions opt = {.output = path, .opt_level = 0};
    ck_assert_msg(harness_cg(back, &opt, NULL, err, sizeof err) == 0, "%s", err);
    XtcModule *m = NULL;
    ck_assert_int_eq(xtc_module_load(path, &m), XTC_OK);
    double v = 0;
    ck_assert_int_eq(xtc_module_param_init(m, "w", &v), 1); /* a constant */
    ck_assert_double_eq(v, 0.25);
    ck_assert_int_eq(xtc_module_param_init(m, "layer.b", &v), 0); /* a rule, not a constant */
    ck_assert_int_eq(xtc_module_param_init(m, "nope", &v), -1);
    float w[NW];
    int64_t ws[2] = {WR, WC};
    RtRng rng;
    rt_rng_seed(&rng, 3);
    ck_assert_int_eq(rt_init_module_param(m, "w", 2, ws, w, &rng), 0);
    ck_assert_float_eq(w[0], 0.25f);
    ck_assert_float_eq(w[NW - 1], 0.25f);
    int64_t bs[1] = {WR};
    float b[WR];
    ck_assert_int_eq(rt_init_module_param(m, "layer.b", 1, bs, b, &rng), 0);
    for (int i = 0; i < WR; i++)
        ck_assert(fabsf(b[i]) <= 0.125f);
    ck_assert_int_eq(rt_init_module_param(m, "nope", 1, bs, b, &rng), -1); /* no rule: zeros */
    ck_assert_float_eq(b[0], 0.0f);
    xtc_module_free(m);
    free(text);
    ir_graph_free(back);
    ir_graph_free(g);
}
END_TEST

/* The runtime's fill of each init rule (include/abi/rt_abi.h, XtcInitRule) */
START_TEST(test_init_rules)
{
    RtRng rng;
    rt_rng_seed(&rng, 7);
    float v[4096];
    int64_t s8[4] = {1, 8, 1, 1}, s4[1] = {4}, big[1] = {4096};
    ck_assert_int_eq(rt_init_fill(XTC_INIT_CONST, -3, 1, s4, v, &rng), 0);
    ck_assert_float_eq(v[3], -3.0f);
    /* ALiBi, 8 heads: slopes 2^-1 .. 2^-8 */
    ck_assert_int_eq(rt_init_fill(XTC_INIT_ALIBI, 0, 4, s8, v, &rng), 0);
    for (int h = 0; h < 8; h++)
        ck_assert_double_eq_tol(v[h], log(pow(2.0, -(h + 1))), 1e-6);
    ck_assert_int_eq(rt_init_by_name("inv_freq", 10000, 1, s4, v, &rng), 0); /* 1 / 10000^(k/4) */
    ck_assert_float_eq(v[0], 1.0f);
    ck_assert_double_eq_tol(v[2], 0.01, 1e-8);
    /* rotary_xpos's scale, 4 pairs (rotary dim 8): x-transformers' (arange(0, 8, 2) + 3.2) / 11.2 */
    ck_assert_int_eq(rt_init_by_name("xpos_scale", 0, 1, s4, v, &rng), 0);
    static const float xpos8[4] = {0.2857142984867096f, 0.4642857015132904f, 0.6428571343421936f, 0.8214285969734192f};
    for (int k = 0; k < 4; k++)
        ck_assert_float_eq_tol(v[k], xpos8[k], 1e-7);
    ck_assert_int_eq(rt_init_fill(XTC_INIT_UNIFORM, 0.5, 1, big, v, &rng), 0);
    double mx = 0, ss = 0;
    for (int i = 0; i < 4096; i++)
        mx = fmax(mx, fabs(v[i]));
    ck_assert(mx <= 0.5 && mx > 0.49);
    ck_assert_int_eq(rt_init_fill(XTC_INIT_NORMAL, 2.0, 1, big, v, &rng), 0);
    for (int i = 0; i < 4096; i++)
        ss += v[i] * v[i];
    ck_assert_double_eq_tol(sqrt(ss / 4096), 2.0, 0.1); /* std 2 */
    ck_assert_int_eq(rt_init_by_name("nonsense", 1, 1, s4, v, &rng), -1);
    ck_assert_float_eq(v[0], 0.0f);
    ck_assert_int_eq(rt_init_by_name(NULL, 1, 1, s4, v, &rng), -1);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("optim");
    TCase *tc = tcase_create("adamw");
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_adamw_matches_reference);
    tcase_add_test(tc, test_adamw_thread_independent);
    tcase_add_test(tc, test_checkpoint_continues);
    tcase_add_test(tc, test_checkpoint_as_weights);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_init_rules);
    tcase_add_test(tc, test_init_hint);
    tcase_add_test(tc, test_comm_sums_gradients);
    tcase_add_test(tc, test_zero1);
    suite_add_tcase(su, tc);
    return harness_run(su, "optim");
}
