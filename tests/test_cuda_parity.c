/* test_cuda_parity.c: the x-transformers parity cases (../shared/parity) through emulated CUDA
 * modules: outputs, loss and every parameter gradient, graded as compare.py grades them.
 *
 * Each case is compiled as `xtc compile --target cuda-emu` would (lowering, autodiff, the pass
 * pipeline, the CUDA backend), loaded, and run through the runtime's CUDA device on its emulated
 * driver, with the case's weights and inputs, as tests/test_parity_interp.sh drives the
 * interpreter:
 *   - token models with targets: the built-in loss and its gradients;
 *   - vit, continuous (no built-in loss): the caller's output gradient loss_weights / numel;
 *   - transformer_xl: segment 1 (targets ignored), then segment 2 on segment 1's mems;
 * every tensor of expected.safetensors (but the reference's dL/dlogits debugging aids) must be
 * produced with max|a - e| <= 1e-5 + 1e-3 * max|e| and no NaN or infinity. Cases whose feature
 * the language refuses by name ("not supported yet") are counted as refused, as the interpreter
 * parity test does.
 *
 * A subset of the cases (HALF_CASES) runs again with 16-bit storage (--dtype bf16 and fp16),
 * graded against the same x-transformers numbers with max|a - e| <= atol + rtol * max|e|, the
 * rtol of that format from HALF_TOL: outputs and loss, and gradients (which go through more
 * rounded intermediates) apart. With 16-bit storage the matmuls run on the tensor cores of the
 * same format, the default (--mma follows --dtype), which the module's options must show. */
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "harness.h"
#include "harness_drive.h"

static char *case_names[64];
static int ncases;

static void make_tmpdir(void) { harness_make_tmpdir("cuda-parity"); }

/* ---- binding inputs ---- */

/* Binds module input `name` from t (converting integer and bool types). */
static void bind_tensor(XtcSession *s, const XtcModule *m, const char *name, const RtStTensor *t)
{
    int i = xtc_module_find(m, XTC_INPUT, name);
    ck_assert_msg(i >= 0, "the module has no input '%s'", name);
    XtcTensorInfo info;
    xtc_module_tensor(m, XTC_INPUT, i, &info);
    int64_t numel = rt_st_numel(t);
    void *data = malloc((size_t)(numel ? numel : 1) * 8);
    char err[512];
    XtcDType dt = info.dtype;
    int rc = info.dtype == XTC_F32 ? rt_st_to_f32(t, data, err, sizeof err) : rt_st_to_i64(t, data, err, sizeof err);
    ck_assert_msg(rc == 0, "input '%s': %s", name, err);
    if (info.dtype == XTC_BOOL)
        for (int64_t k = 0; k < numel; k++)
            ((uint8_t *)data)[k] = ((int64_t *)data)[k] != 0;
    else if (info.dtype != XTC_F32)
        dt = XTC_I64;
    ck_assert_msg(xtc_session_set_input(s, name, dt, t->rank, t->shape, data) == XTC_OK, "%s", xtc_session_error(s));
    free(data);
}

static void bind_f32(XtcSession *s, const char *name, int rank, const int64_t *shape, const float *data)
{
    ck_assert_msg(xtc_session_set_input(s, name, XTC_F32, rank, shape, data) == XTC_OK, "%s", xtc_session_error(s));
}

/* ---- grading, as compare.py ---- */

typedef struct {
    char name[200];
    int rank;
    int64_t shape[XTC_MAX_RANK];
    float *data;
} Result;

typedef struct {
    Result r[256];
    int n;
} Results;

static void keep_output(Results *res, XtcSession *s, const char *name, const char *as)
{
    XtcTensor t;
    ck_assert_msg(xtc_session_get_output(s, name, &t) == XTC_OK, "%s", xtc_session_error(s));
    if (t.dtype != XTC_F32)
        return;
    ck_assert_int_lt(res->n, 256);
    Result *r = &res->r[res->n++];
    snprintf(r->name, sizeof r->name, "%s", as);
    r->rank = t.rank;
    int64_t numel = 1;
    for (int d = 0; d < t.rank; d++) {
        r->shape[d] = t.shape[d];
        numel *= t.shape[d];
    }
    r->data = malloc((size_t)(numel ? numel : 1) * sizeof(float));
    memcpy(r->data, t.data, (size_t)numel * sizeof(float));
}

static void keep_all(Results *res, XtcSession *s, const XtcModule *m, const char *suffix)
{
    for (int o = 0; o < xtc_module_count(m, XTC_OUTPUT); o++) {
        XtcTensorInfo info;
        xtc_module_tensor(m, XTC_OUTPUT, o, &info);
        char as[200];
        if (suffix && strncmp(info.name, "mems.", 5) == 0)
            snprintf(as, sizeof as, "mems%s.%s", suffix, info.name + 5);
        else if (suffix && strcmp(info.name, "logits") == 0)
            snprintf(as, sizeof as, "logits%s", suffix);
        else
            snprintf(as, sizeof as, "%s", info.name);
        keep_output(res, s, info.name, as);
    }
}

static const Result *find_result(const Results *res, const char *name)
{
    for (int i = res->n - 1; i >= 0; i--)
        if (strcmp(res->r[i].name, name) == 0)
            return &res->r[i];
    return NULL;
}

/* 16-bit storage (compile --dtype): the cases run, and the tolerance of each format. */
static const char *const HALF_CASES[] = {"decoder_plain", "encoder_mask", "rotary_pos_emb", "ff_glu",
                                         "cross_attend", "vit", "use_rmsnorm", "tie_embedding"};
#define NHALF ((int)(sizeof HALF_CASES / sizeof HALF_CASES[0]))
typedef struct {
    const char *dtype;
    double atol, rtol_out, rtol_grad; /* outputs and loss; gradients */
} Tolerance;
static const Tolerance F32_TOL = {"f32", 1e-5, 1e-3, 1e-3};
/* rtol: 5 and 10 units of the format's roundoff u (bf16 2^-8, fp16 2^-11), about twice the worst
 * seen over the subset, the same with and without the tensor cores (bf16: outputs 9.3e-3,
 * gradients 2.2e-2; fp16: 1.0e-3, 2.9e-3) */
static const Tolerance HALF_TOL[] = {
    {"bf16", 1e-3, 5 * 0x1p-8, 10 * 0x1p-8},
    {"fp16", 1e-4, 5 * 0x1p-11, 10 * 0x1p-11},
};

/* Every expected tensor but the skipped ones, graded; returns the number graded, failures in msg.
 * worst: max|a - e|; worst_rel[0], [1]: the largest max|a - e| / max|e| of outputs, gradients. */
static int grade(const char *dir, const Results *res, int skip_loss, const Tolerance *tol, double *worst,
                 double *worst_rel, char *msg, size_t n)
{
    char path[700], err[512];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    RtStFile *exp;
    ck_assert_msg(rt_st_open(path, &exp, err, sizeof err) == 0, "%s", err);
    int graded = 0;
    size_t len = 0;
    msg[0] = 0;
    *worst = worst_rel[0] = worst_rel[1] = 0;
    for (int i = 0; i < rt_st_count(exp); i++) {
        const RtStTensor *e = rt_st_get(exp, i);
        if (!strcmp(e->name, "grad.logits") || !strcmp(e->name, "grad.logits2") || !strcmp(e->name, "grad.output") ||
            (skip_loss && !strcmp(e->name, "loss")))
            continue;
        graded++;
        const Result *a = find_result(res, e->name);
        if (!a) {
            len += (size_t)snprintf(msg + len, len < n ? n - len : 0, "\n  %s: missing", e->name);
            continue;
        }
        int same = a->rank == e->rank;
        for (int d = 0; same && d < e->rank; d++)
            same = a->shape[d] == e->shape[d];
        if (!same) {
            char ga[100] = "", ge[100] = "";
            for (int d = 0, la = 0, le = 0; d < a->rank || d < e->rank; d++) {
                if (d < a->rank)
                    la += snprintf(ga + la, sizeof ga - (size_t)la, "%s%lld", d ? "," : "", (long long)a->shape[d]);
                if (d < e->rank)
                    le += snprintf(ge + le, sizeof ge - (size_t)le, "%s%lld", d ? "," : "", (long long)e->shape[d]);
            }
            len += (size_t)snprintf(msg + len, len < n ? n - len : 0, "\n  %s: shape [%s], expected [%s]", e->name,
                                    ga, ge);
            continue;
        }
        int64_t numel = rt_st_numel(e);
        float *ev = malloc((size_t)(numel ? numel : 1) * sizeof *ev);
        rt_st_to_f32(e, ev, err, sizeof err);
        double maxe = 0, maxd = 0;
        int finite = 1;
        for (int64_t k = 0; k < numel; k++) {
            maxe = fmax(maxe, fabs(ev[k]));
            if (!isfinite(a->data[k]))
                finite = 0;
            else
                maxd = fmax(maxd, fabs((double)a->data[k] - ev[k]));
        }
        free(ev);
        int is_grad = strncmp(e->name, "grad.", 5) == 0;
        double limit = tol->atol + (is_grad ? tol->rtol_grad : tol->rtol_out) * maxe;
        if (maxe > 0 && maxd / maxe > worst_rel[is_grad])
            worst_rel[is_grad] = maxd / maxe;
        if (!finite || maxd > limit)
            len += (size_t)snprintf(msg + len, len < n ? n - len : 0, "\n  %s: max_abs_err %.3e, limit %.3e%s",
                                    e->name, maxd, limit, finite ? "" : " (NaN or infinity)");
        if (maxd > *worst)
            *worst = maxd;
    }
    rt_st_close(exp);
    return graded;
}

/* ---- one case ---- */

static void run_parity_case(const char *name, const Tolerance *tol, const char *target)
{
    char dir[600], xtf[600], path[700], err[2048];
    snprintf(dir, sizeof dir, "%s/parity/%s", XTC_SHARED_DIR, name);
    snprintf(xtf, sizeof xtf, "%s/tests/parity/%s.xtf", XTC_SOURCE_DIR, name);
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    RtStFile *in;
    ck_assert_msg(rt_st_open(path, &in, err, sizeof err) == 0, "%s", err);
    int xl = rt_st_find(in, "tokens2") != NULL;
    int seeded = !xl && !rt_st_find(in, "targets"); /* vit, continuous: the caller's dL/doutput */
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(xtf, &d);
    ck_assert_msg(f != NULL, "%s", d.text ? d.text : xtf);
    XtLowerOpts lo = {
        .train = !seeded,
        .mask = rt_st_find(in, "mask") != NULL,
        .src_mask = rt_st_find(in, "src_mask") != NULL,
        .context_mask = rt_st_find(in, "context_mask") != NULL,
        .tgt_mask = rt_st_find(in, "tgt_mask") != NULL,
    };
    snprintf(path, sizeof path, "%s/%s.%s.%s.so", tmpdir, name, tol->dtype, target);
    /* the model's loss, or the outputs seeded by grad.<output>; fp16 gradients unscaled, as this
     * suite compares them (the loss-scaled path: test_cuda_mma) */
    DrvTarget t;
    ck_assert_msg(drv_target(&t, &(CgOptions){.target = target, .dtype = tol->dtype}, err, sizeof err) == 0, "%s", err);
    t.loss_scale = NULL;
    DrvJob job = {.file = f, .lower = lo, .diag = &d, .grads = 1,
                  .cg = {.output = path, .opt_level = 2, .source_name = xtf}};
    IrGraph *h = NULL;
    CgStats stats;
    int rc = !d.nerrors && xtf_check(f, &d) == 0 ? drv_run(&job, &t, &h, &stats, err, sizeof err) : -1;
    if (rc != 0 && d.nerrors) {
        ck_assert_msg(d.text && strstr(d.text, "not supported yet"), "%s: does not lower: %s", name, d.text);
        const char *line = strstr(d.text, "error: ");
        fprintf(stderr, "refused %-24s %.*s\n", name, line ? (int)strcspn(line + 7, "\n") : 0, line ? line + 7 : "");
        xtf_diag_free(&d);
        xtf_free(f);
        rt_st_close(in);
        return;
    }
    ck_assert_msg(rc == 0, "%s: %s", name, err);
    xtf_diag_free(&d);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    { /* 16-bit storage takes the tensor cores of its format by default (f32 keeps f32 matmuls) */
        char *text = NULL, want[64];
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        xtc_module_describe(m, mem);
        fclose(mem);
        snprintf(want, sizeof want, "option mma = %s\n", strcmp(tol->dtype, "f32") ? tol->dtype : "off");
        ck_assert_msg(strstr(text, want), "%s: the module's options lack '%s'", name, want);
        free(text);
    }
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s", xtc_session_error(s));
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    ck_assert_msg(xtc_session_load_weights(s, path) == XTC_OK, "%s", xtc_session_error(s));

    Results *res = calloc(1, sizeof *res);
    if (xl) {
        /* segment 1: empty mems, every target ignored; segment 2 on its mems */
        const RtStTensor *tok = rt_st_find(in, "tokens"), *tok2 = rt_st_find(in, "tokens2");
        int64_t b = tok->shape[0], n1 = tok->shape[1];
        int64_t *ignored = malloc((size_t)(b * n1) * sizeof *ignored);
        for (int64_t k = 0; k < b * n1; k++)
            ignored[k] = -100;
        bind_tensor(s, m, "tokens", tok);
        ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, (int64_t[]){b, n1}, ignored), XTC_OK);
        free(ignored);
        for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
            XtcTensorInfo info;
            xtc_module_tensor(m, XTC_INPUT, i, &info);
            if (strncmp(info.name, "mems.", 5) == 0) {
                int64_t shape[3] = {b, 0, info.shape[2]};
                bind_f32(s, info.name, 3, shape, NULL);
            }
        }
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: segment 1: %s", name, xtc_session_error(s));
        keep_all(res, s, m, "");
        bind_tensor(s, m, "tokens", tok2);
        bind_tensor(s, m, "targets", rt_st_find(in, "targets2"));
        for (int i = 0; i < res->n; i++)
            if (strncmp(res->r[i].name, "mems.", 5) == 0)
                bind_f32(s, res->r[i].name, res->r[i].rank, res->r[i].shape, res->r[i].data);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: segment 2: %s", name, xtc_session_error(s));
        keep_all(res, s, m, "2");
    } else {
        for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
            XtcTensorInfo info;
            xtc_module_tensor(m, XTC_INPUT, i, &info);
            const RtStTensor *t = rt_st_find(in, info.name);
            if (t) {
                bind_tensor(s, m, info.name, t);
                continue;
            }
            /* grad.<output> = loss_weights / numel: the reference's loss is mean(out * loss_weights) */
            const RtStTensor *lw = rt_st_find(in, "loss_weights");
            ck_assert_msg(seeded && lw && strncmp(info.name, "grad.", 5) == 0, "%s: no value for input '%s'", name,
                          info.name);
            int64_t numel = rt_st_numel(lw);
            float *g0 = malloc((size_t)numel * sizeof *g0);
            rt_st_to_f32(lw, g0, err, sizeof err);
            for (int64_t k = 0; k < numel; k++)
                g0[k] /= (float)numel;
            bind_f32(s, info.name, lw->rank, lw->shape, g0);
            free(g0);
        }
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: %s", name, xtc_session_error(s));
        keep_all(res, s, m, NULL);
    }
    char msg[4096];
    double worst, worst_rel[2];
    int graded = grade(dir, res, seeded, tol, &worst, worst_rel, msg, sizeof msg);
    ck_assert_msg(graded > 0, "%s: nothing to grade", name);
    ck_assert_msg(!msg[0], "%s (%s storage, %s): differs from x-transformers:%s", name, tol->dtype, target, msg);
    fprintf(stderr, "ok      %-24s %-4s %-8s %3d tensors, worst max_abs_err %.3e, relative to max|e|: outputs %.2e, "
                    "gradients %.2e (%d kernels, %d steps)\n", name, tol->dtype, target, graded, worst, worst_rel[0],
            worst_rel[1], stats.nkernels, stats.nsteps);
    for (int i = 0; i < res->n; i++)
        free(res->r[i].data);
    free(res);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(h);
    xtf_free(f);
    rt_st_close(in);
}

START_TEST(test_parity_case)
{
    run_parity_case(case_names[_i], &F32_TOL, "cuda-emu");
}
END_TEST

/* the subset again with bf16 (_i < NHALF) and fp16 storage */
START_TEST(test_parity_half)
{
    run_parity_case(HALF_CASES[_i % NHALF], &HALF_TOL[_i / NHALF], "cuda-emu");
}
END_TEST

/* On a machine with a GPU: every case in f32 (_i < ncases), then the subset in bf16 and fp16, on
 * the device through libcuda.so.1, graded alike. */
START_TEST(test_parity_gpu)
{
    if (_i < ncases)
        run_parity_case(case_names[_i], &F32_TOL, "cuda");
    else
        run_parity_case(HALF_CASES[(_i - ncases) % NHALF], &HALF_TOL[(_i - ncases) / NHALF], "cuda");
}
END_TEST

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void find_cases(void)
{
    char dirpath[600];
    snprintf(dirpath, sizeof dirpath, "%s/parity", XTC_SHARED_DIR);
    DIR *dir = opendir(dirpath);
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) && ncases < 64) {
        char probe[900];
        snprintf(probe, sizeof probe, "%s/%s/expected.safetensors", dirpath, e->d_name);
        if (e->d_name[0] != '.' && access(probe, R_OK) == 0)
            case_names[ncases++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(case_names, (size_t)ncases, sizeof *case_names, by_name);
}

START_TEST(test_cases_found)
{
    ck_assert_msg(ncases > 0, "no parity cases in %s/parity (they live beside the repository)", XTC_SHARED_DIR);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_parity");
    TCase *tc = tcase_create("parity");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_cases_found);
    tcase_add_loop_test(tc, test_parity_case, 0, ncases);
    suite_add_tcase(s, tc);
    TCase *half = tcase_create("half"); /* CK_RUN_CASE=half runs these alone */
    tcase_set_timeout(half, 900);
    tcase_add_loop_test(half, test_parity_half, 0, 2 * NHALF);
    suite_add_tcase(s, half);
    char why[1200];
    if (gpu_present(why, sizeof why)) { /* on a machine with a GPU; CK_RUN_CASE=gpu runs these alone */
        TCase *gpu = tcase_create("gpu");
        tcase_set_timeout(gpu, 900);
        tcase_add_loop_test(gpu, test_parity_gpu, 0, ncases + 2 * NHALF);
        suite_add_tcase(s, gpu);
    } else {
        fprintf(stderr, "parity on the GPU SKIPPED (not counted): %s; the cases ran through the emulator\n", why);
    }
    return s;
}

int main(void)
{
    /* each emulated module runs a few steps at the cases' small sizes: cc -O1 was ~90 % of this
     * suite's time, -O0 compiles them 3x faster (the tolerances are the same) */
    setenv("XTC_EMU_OPT", "0", 0);
    make_tmpdir();
    find_cases();
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr), run = srunner_ntests_run(sr);
    fprintf(stderr, "parity through emulated CUDA modules: %d of %d tests passed (%d cases in f32, refused ones "
                    "included, listed above; %d of them in bf16 and in fp16)\n", run - failed, run, ncases, NHALF);
    srunner_free(sr);
    remove_tmpdir();
    for (int i = 0; i < ncases; i++)
        free(case_names[i]);
    return failed ? 1 : 0;
}
