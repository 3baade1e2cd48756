/* test_cuda_optim.c: the AdamW step on the device (codegen/cuda/kernels/adamw.cuh, run by
 * runtime/rt_cuda.c for xtc_session_step) gives the same bits as the host's step (rt_optim.c),
 * through the CUDA emulator.
 *
 * Two sessions of the same cuda-emu training module (f32 storage, then bf16) take the same
 * steps from the same weights and batches: one on the device, one on the host (XTC_OPTIM=host
 * when its optimizer is created). After every step the loss, the gradient norm, every weight,
 * the moments and each gradient (read back on demand from the device) must be bitwise equal,
 * with clipping active. The device session must not copy the gradients to the host once it
 * steps there (the emulator's traffic counters), and its state must survive the paths that move
 * it: a checkpoint saved from the device and loaded into a fresh session, and a weight set by
 * the caller between steps (sent to the device before the next). */
#include "driver.h"
#include "harness.h"
#include "rt_cuda.h"
#include "tiny_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B 2
#define N 6
#define STEPS 3

/* tiny_compile_form's training module with the device storage dtype ("f32", "bf16") */
static void compile_dtype(const char *path, const char *dtype)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", tiny_gpt_src, strlen(tiny_gpt_src), &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    char err[1024];
    DrvTarget t;
    ck_assert_msg(drv_target(&t, &(CgOptions){.target = "cuda-emu", .dtype = dtype}, err, sizeof err) == 0, "%s", err);
    DrvJob job = {.file = f, .lower = {.train = 1}, .grads = 1, .diag = &d,
                  .cg = {.output = path, .opt_level = 1, .source = tiny_gpt_src, .source_name = "tiny.xtf"}};
    ck_assert_msg(drv_run(&job, &t, NULL, NULL, err, sizeof err) == 0, "compiling %s: %s %s", path, err,
                  d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
}

static XtcSession *open_session(XtcModule *m, const char *weights)
{
    XtcSession *s = NULL;
    XtcSessionOptions so = {.threads = 2};
    ck_assert_msg(xtc_session_new(m, &so, &s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_load_weights(s, weights) == XTC_OK, "%s", xtc_session_error(s));
    return s;
}

/* run on batch `seed`; the loss */
static float run(XtcSession *s, uint64_t seed)
{
    int64_t tok[B * N], tgt[B * N], shape[2] = {B, N};
    tiny_batch(tok, tgt, B, N, seed);
    ck_assert(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) == XTC_OK);
    ck_assert(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt) == XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor loss;
    ck_assert(xtc_session_get_output(s, "loss", &loss) == XTC_OK);
    return *(const float *)loss.data;
}

static void step(XtcSession *s)
{
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 3e-2f;
    opt.weight_decay = 0.1f;
    opt.max_grad_norm = 0.05f; /* below the norm: the clipping scale is in every update */
    ck_assert_msg(xtc_session_step(s, &opt) == XTC_OK, "%s", xtc_session_error(s));
}

/* every weight, moment (after a step) and gradient of a equal to b's, bit for bit */
static void same_state(XtcModule *m, XtcSession *a, XtcSession *b, const char *when)
{
    ck_assert_msg(xtc_session_grad_norm(a) == xtc_session_grad_norm(b), "%s: grad norm %.17g vs %.17g", when,
                  xtc_session_grad_norm(a), xtc_session_grad_norm(b));
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++) {
        XtcTensorInfo info;
        XtcTensor ta, tb, ma, va, mb, vb, ga, gb;
        xtc_module_tensor(m, XTC_PARAM, i, &info);
        ck_assert_msg(xtc_session_get_weight(a, info.name, &ta) == XTC_OK, "%s", xtc_session_error(a));
        ck_assert(xtc_session_get_weight(b, info.name, &tb) == XTC_OK);
        size_t bytes = (size_t)tiny_numel(&ta) * sizeof(float);
        ck_assert_msg(!memcmp(ta.data, tb.data, bytes), "%s: weight %s differs", when, info.name);
        if (xtc_session_step_count(a) > 0) {
            ck_assert_msg(xtc_session_get_optim(a, info.name, &ma, &va) == XTC_OK, "%s", xtc_session_error(a));
            ck_assert(xtc_session_get_optim(b, info.name, &mb, &vb) == XTC_OK);
            ck_assert_msg(!memcmp(ma.data, mb.data, bytes) && !memcmp(va.data, vb.data, bytes),
                          "%s: the moments of %s differ", when, info.name);
        }
        char name[300];
        snprintf(name, sizeof name, "grad.%s", info.name);
        ck_assert_msg(xtc_session_get_output(a, name, &ga) == XTC_OK, "%s", xtc_session_error(a));
        ck_assert(xtc_session_get_output(b, name, &gb) == XTC_OK);
        ck_assert_msg(!memcmp(ga.data, gb.data, bytes), "%s: %s differs", when, name);
    }
}

static int64_t grad_bytes(XtcModule *m)
{
    int64_t n = 0;
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++) {
        XtcTensorInfo info;
        xtc_module_tensor(m, XTC_PARAM, i, &info);
        int64_t k = 1;
        for (int d = 0; d < info.rank; d++)
            k *= info.shape[d];
        n += k * (int64_t)sizeof(float);
    }
    return n;
}

static void module_path(char *path, size_t n, const char *dtype);

static void device_equals_host(const char *dtype)
{
    char path[300], weights[300], ckpt[300];
    module_path(path, sizeof path, dtype);
    snprintf(weights, sizeof weights, "%s/tiny_%s.safetensors", tmpdir, dtype);
    snprintf(ckpt, sizeof ckpt, "%s/tiny_%s_ckpt.safetensors", tmpdir, dtype);
    tiny_write_weights(path, weights, 11);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *dev = open_session(m, weights), *host = open_session(m, weights);
    for (int it = 0; it < STEPS; it++) {
        uint64_t t0[3], t1[3];
        rt_cu_emu_traffic(t0);
        float la = run(dev, 100 + it);
        step(dev);
        rt_cu_emu_traffic(t1);
        if (it > 0) /* the step of the run before moved them there: the gradients stay */
            ck_assert_msg((int64_t)(t1[1] - t0[1]) < grad_bytes(m) / 4,
                          "%s step %d: %llu bytes came back from the device (the gradients are %lld)", dtype, it,
                          (unsigned long long)(t1[1] - t0[1]), (long long)grad_bytes(m));
        float lb = run(host, 100 + it);
        setenv("XTC_OPTIM", "host", 1); /* read when the host session's optimizer is created */
        step(host);
        unsetenv("XTC_OPTIM");
        ck_assert_msg(la == lb, "%s step %d: loss %.9g vs %.9g", dtype, it, la, lb);
        char when[64];
        snprintf(when, sizeof when, "%s step %d", dtype, it);
        same_state(m, dev, host, when);
    }
    /* a checkpoint of the device's state, loaded into a fresh session that steps on */
    ck_assert_msg(xtc_session_save_checkpoint(dev, ckpt, NULL, NULL, 0) == XTC_OK, "%s", xtc_session_error(dev));
    XtcSession *re = open_session(m, weights);
    ck_assert_msg(xtc_session_load_checkpoint(re, ckpt, 1) == XTC_OK, "%s", xtc_session_error(re));
    ck_assert_int_eq(xtc_session_step_count(re), STEPS);
    /* a weight the caller sets between steps: the device must step from it */
    XtcTensorInfo info;
    xtc_module_tensor(m, XTC_PARAM, 0, &info);
    int64_t n = 1;
    for (int d = 0; d < info.rank; d++)
        n *= info.shape[d];
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t k = 0; k < n; k++)
        w[k] = 0.01f * (float)(k % 7) - 0.03f;
    XtcSession *all[3] = {dev, host, re};
    for (int i = 0; i < 3; i++) {
        ck_assert(xtc_session_set_weight(all[i], info.name, info.rank, info.shape, w) == XTC_OK);
        run(all[i], 200);
        step(all[i]);
    }
    same_state(m, dev, host, "after set_weight");
    same_state(m, re, host, "after the checkpoint");
    free(w);
    for (int i = 0; i < 3; i++)
        xtc_session_free(all[i]);
    xtc_module_free(m);
}

/* the module of dtype at *path, compiled by the first test of this process that needs it */
static void module_path(char *path, size_t n, const char *dtype)
{
    snprintf(path, n, "%s/tiny_%s.so", tmpdir, dtype);
    if (access(path, F_OK) != 0)
        compile_dtype(path, dtype);
}

/* bytes copied device to host by the emulator since t0 */
static uint64_t down_since(const uint64_t t0[3])
{
    uint64_t t[3];
    rt_cu_emu_traffic(t);
    return t[1] - t0[1];
}

/* A CUDA module's runs leave their outputs on the device (rs_lazy_outputs): a session that reads
 * them on demand gives the bits of one that copies them all after each run (XTC_EAGER_OUTPUTS),
 * a run copies nothing but its status words, each output is copied on its first read after a run
 * and never again until the next, and training with the host's optimizer (which reads every
 * gradient; with fp16, the loss scaler too) takes the same steps. */
static void lazy_equals_eager(const char *dtype)
{
    char path[300], weights[300];
    module_path(path, sizeof path, dtype);
    snprintf(weights, sizeof weights, "%s/tiny_%s_lazy.safetensors", tmpdir, dtype);
    tiny_write_weights(path, weights, 5);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    setenv("XTC_EAGER_OUTPUTS", "1", 1);
    XtcSession *eager = open_session(m, weights);
    unsetenv("XTC_EAGER_OUTPUTS");
    XtcSession *lazy = open_session(m, weights);
    uint64_t status = (uint64_t)(xtc_module_num_steps(m) + 1) * sizeof(int32_t);
    int nout = xtc_module_count(m, XTC_OUTPUT);
    setenv("XTC_OPTIM", "host", 1); /* both optimizers on the host: it reads every gradient */
    for (int it = 0; it < STEPS; it++) {
        int64_t tok[B * N], tgt[B * N], shape[2] = {B, N};
        tiny_batch(tok, tgt, B, N, 300 + it);
        XtcSession *both[2] = {eager, lazy};
        uint64_t t0[3], ran[2];
        for (int k = 0; k < 2; k++) {
            ck_assert(xtc_session_set_input(both[k], "tokens", XTC_I64, 2, shape, tok) == XTC_OK);
            ck_assert(xtc_session_set_input(both[k], "targets", XTC_I64, 2, shape, tgt) == XTC_OK);
            rt_cu_emu_traffic(t0);
            ck_assert_msg(xtc_session_run(both[k]) == XTC_OK, "%s", xtc_session_error(both[k]));
            ran[k] = down_since(t0);
        }
        int scaled = xtc_module_find(m, XTC_INPUT, XTC_LOSS_SCALE_INPUT) >= 0;
        uint64_t fetched = 0, unscaled = 0;
        if (scaled) /* the loss scaler unscales the gradients on the host: they came with the run */
            unscaled = ran[1] - status;
        else
            ck_assert_msg(ran[1] == status, "%s run %d: %llu bytes came back (the status words are %llu)", dtype, it,
                          (unsigned long long)ran[1], (unsigned long long)status);
        ck_assert_msg(ran[0] > status, "%s run %d: the eager session copied no output", dtype, it);
        /* read in reverse order the second time round: the order of reads does not matter */
        for (int j = 0; j < nout; j++) {
            XtcTensorInfo info;
            xtc_module_tensor(m, XTC_OUTPUT, it % 2 ? nout - 1 - j : j, &info);
            XtcTensor a, b, again;
            ck_assert(xtc_session_get_output(eager, info.name, &a) == XTC_OK);
            rt_cu_emu_traffic(t0);
            ck_assert_msg(xtc_session_get_output(lazy, info.name, &b) == XTC_OK, "%s", xtc_session_error(lazy));
            fetched += down_since(t0);
            rt_cu_emu_traffic(t0);
            ck_assert(xtc_session_get_output(lazy, info.name, &again) == XTC_OK);
            ck_assert_msg(down_since(t0) == 0 && again.data == b.data, "%s run %d: '%s' copied twice", dtype, it,
                          info.name);
            ck_assert_int_eq(a.rank, b.rank);
            for (int d = 0; d < a.rank; d++)
                ck_assert_int_eq(a.shape[d], b.shape[d]);
            size_t bytes = (size_t)tiny_numel(&a) * xtc_dtype_size(a.dtype);
            ck_assert_msg(!memcmp(a.data, b.data, bytes), "%s run %d: '%s' differs from the eager copy", dtype, it,
                          info.name);
        }
        /* every output crossed once: what the eager run copied (but the status words) */
        ck_assert_msg(fetched + unscaled == ran[0] - status, "%s run %d: %llu bytes read on demand, %llu eagerly",
                      dtype, it, (unsigned long long)(fetched + unscaled), (unsigned long long)(ran[0] - status));
        step(eager);
        rt_cu_emu_traffic(t0);
        step(lazy);
        ck_assert_msg(down_since(t0) == 0, "%s step %d: the gradients read by the step were copied again", dtype, it);
        same_state(m, eager, lazy, "lazy outputs");
    }
    /* a step straight after a run, no output read: the host step fetches the gradients itself */
    for (int k = 0; k < 2; k++) {
        XtcSession *s = k ? lazy : eager;
        run(s, 400);
        step(s);
    }
    unsetenv("XTC_OPTIM");
    same_state(m, eager, lazy, "a step without reads");
    xtc_session_free(eager);
    xtc_session_free(lazy);
    xtc_module_free(m);
}

START_TEST(test_lazy_f32) { lazy_equals_eager("f32"); }
END_TEST

START_TEST(test_lazy_fp16) { lazy_equals_eager("fp16"); }
END_TEST

START_TEST(test_f32)
{
    (void)tiny_hash; /* tiny_train.h's, for other suites */
    (void)tiny_compile;
    device_equals_host("f32");
}
END_TEST

START_TEST(test_bf16) { device_equals_host("bf16"); }
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_optim");
    TCase *tc = tcase_create("device step");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_f32);
    tcase_add_test(tc, test_bf16);
    suite_add_tcase(s, tc);
    TCase *lz = tcase_create("lazy outputs");
    tcase_set_timeout(lz, 600);
    tcase_add_test(lz, test_lazy_f32);
    tcase_add_test(lz, test_lazy_fp16);
    suite_add_tcase(s, lz);
    return s;
}

int main(void)
{
    return harness_run(suite(), "cuda_optim");
}
