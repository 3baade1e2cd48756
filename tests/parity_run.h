/* parity_run.h: one x-transformers parity case (the folder parity/ beside DESIGN.md, with its
 * .xtf in tests/parity) compiled for the CPU and run on the library's inputs and weights, its
 * outputs held to the library's. Used by test_codegen (f32) and test_cpu_bf16 (--mma=bf16, --dtype bf16).
 * Include after harness_bind.h (bind_inputs) and harness.h (tmpdir). */
#ifndef XTC_TESTS_PARITY_RUN_H
#define XTC_TESTS_PARITY_RUN_H

#include "codegen.h"
#include "harness_drive.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>

/* How a parity case is compiled and held: CgOptions.mma and opt_level, and the bound on each
 * output, max|got - expected| <= atol + rtol max|expected|; worst (if set) gets the largest ratio
 * of that difference to max|expected| over the outputs; unfit (or NULL): NULL-terminated
 * "name: why" strings, cases not run under this setting, each printed with its reason. */
typedef struct {
    int mma, opt_level;
    double atol, rtol;
    double *worst;
    const char *const *unfit;
    const char *dtype; /* CgOptions.dtype (NULL: f32) */
} ParityRun;

/* DESIGN.md's parity: 1e-5 + 1e-3 max|e| */
static const ParityRun PARITY_F32 = {CG_MMA_AUTO, 2, 1e-5, 1e-3, NULL, NULL, NULL};

/* Every f32 output of s that exp holds, within atol + rtol max|expected| (a NaN or infinite
 * output fails); worst (if set) gets the largest ratio of the difference to max|expected|.
 * Returns how many were compared, or -1 with the message (naming what) in err. */
static inline int parity_compare(XtcSession *s, const XtcModule *m, RtStFile *exp, const char *what, double atol,
                                 double rtol, double *worst, char *err, size_t n)
{
    int compared = 0;
    for (int o = 0; o < xtc_module_count(m, XTC_OUTPUT); o++) {
        XtcTensorInfo info;
        xtc_module_tensor(m, XTC_OUTPUT, o, &info);
        const RtStTensor *e = rt_st_find(exp, info.name);
        XtcTensor t;
        if (!e || info.dtype != XTC_F32 || xtc_session_get_output(s, info.name, &t))
            continue;
        int64_t numel = rt_st_numel(e);
        float *ev = malloc((size_t)(numel ? numel : 1) * sizeof *ev);
        if (!ev || rt_st_to_f32(e, ev, err, n)) {
            free(ev);
            return -1;
        }
        double maxe = 0, maxd = 0;
        for (int64_t i = 0; i < numel; i++)
            maxe = fmax(maxe, fabs(ev[i]));
        for (int64_t i = 0; i < numel; i++) { /* a NaN or infinite output fails (fmax drops NaN) */
            double a = ((const float *)t.data)[i];
            maxd = isfinite(a) ? fmax(maxd, fabs(a - ev[i])) : INFINITY;
            if (!isfinite(a))
                break;
        }
        free(ev);
        if (worst && maxe > 0)
            *worst = fmax(*worst, maxd / maxe);
        if (!(maxd <= atol + rtol * maxe)) {
            snprintf(err, n, "%s: output '%s' differs from x-transformers by %g (max |e| %g)", what, info.name, maxd,
                     maxe);
            return -1;
        }
        compared++;
    }
    return compared;
}

/* 0: passed; 1: the language refuses the case (fine); -1: failed, message in err */
static inline int parity_case(const char *name, const ParityRun *run, char *err, size_t n)
{
    char xtf[512], dir[512], path[600];
    snprintf(xtf, sizeof xtf, "%s/tests/parity/%s.xtf", XTC_SOURCE_DIR, name);
    snprintf(dir, sizeof dir, "%s/parity/%s", XTC_SHARED_DIR, name);
    RtStFile *in = NULL, *exp = NULL;
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    if (rt_st_open(path, &in, err, n))
        return -1;
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(xtf, &d);
    if (f && !d.nerrors)
        xtf_check(f, &d);
    XtLowerOpts lo = {
        .train = rt_st_find(in, "targets") != NULL,
        .mask = rt_st_find(in, "mask") != NULL,
        .src_mask = rt_st_find(in, "src_mask") != NULL,
        .context_mask = rt_st_find(in, "context_mask") != NULL,
        .tgt_mask = rt_st_find(in, "tgt_mask") != NULL,
    };
    IrGraph *g = f && !d.nerrors ? harness_build(f, NULL, &lo, 0, harness_target("cpu"), NULL, &d, err, n) : NULL;
    xtf_diag_free(&d);
    xtf_free(f);
    if (!g) {
        rt_st_close(in);
        return 1;
    }
    int rc = -1;
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    snprintf(path, sizeof path, "%s/parity_%s.so", tmpdir, name);
    CgOptions opt = {.output = path, .opt_level = run->opt_level, .mma = run->mma, .dtype = run->dtype};
    if (harness_cg(g, &opt, NULL, err, n))
        goto done;
    if (xtc_module_load(path, &m) || xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s)) {
        snprintf(err, n, "%s", s ? xtc_session_error(s) : xtc_module_error(m));
        goto done;
    }
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (xtc_session_load_weights(s, path)) {
        snprintf(err, n, "%s", xtc_session_error(s));
        goto done;
    }
    if (bind_inputs(s, m, in, err, n))
        goto done;
    if (xtc_session_run(s)) {
        snprintf(err, n, "%s", xtc_session_error(s));
        goto done;
    }
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (rt_st_open(path, &exp, err, n))
        goto done;
    int compared = parity_compare(s, m, exp, name, run->atol, run->rtol, run->worst, err, n);
    if (compared < 0)
        goto done;
    if (!compared) {
        snprintf(err, n, "%s: no output to compare", name);
        goto done;
    }
    rc = 0;
done:
    rt_st_close(exp);
    rt_st_close(in);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
    return rc;
}

/* The counts of a walk over the parity cases; failures: "\n  name: message" each. */
typedef struct {
    int passed, refused, failed;
    char failures[4096];
} ParityCount;

/* Calls one(name, ctx, err, n) for every parity case with a reference (but transformer_xl, a
 * two-segment protocol test_parity_interp.sh drives), but those unfit names (NULL-terminated
 * "name: why" strings; each printed after what, with its reason); counts what it returns
 * (0 passed, 1 refused by the language, -1 failed with the message in err). */
static inline void parity_each(int (*one)(const char *name, void *ctx, char *err, size_t n), void *ctx,
                               const char *const *unfit, const char *what, ParityCount *pc)
{
    char dirpath[512];
    snprintf(dirpath, sizeof dirpath, "%s/tests/parity", XTC_SOURCE_DIR);
    DIR *dir = opendir(dirpath);
    ck_assert_msg(dir != NULL, "%s: no %s", what, dirpath);
    struct dirent *e;
    memset(pc, 0, sizeof *pc);
    while ((e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".xtf") != 0)
            continue;
        char name[256], err[1024] = "";
        snprintf(name, sizeof name, "%.*s", (int)(len - 4), e->d_name);
        char probe[700];
        snprintf(probe, sizeof probe, "%s/parity/%s/inputs.safetensors", XTC_SHARED_DIR, name);
        if (access(probe, R_OK) != 0 || strcmp(name, "transformer_xl") == 0)
            continue;
        const char *why = NULL;
        for (int u = 0; unfit && unfit[u] && !why; u++)
            if (!strncmp(unfit[u], name, strlen(name)) && unfit[u][strlen(name)] == ':')
                why = unfit[u];
        if (why) {
            fprintf(stderr, "%s: not run: %s\n", what, why);
            continue;
        }
        int rc = one(name, ctx, err, sizeof err);
        if (rc == 0)
            pc->passed++;
        else if (rc == 1)
            pc->refused++;
        else {
            pc->failed++;
            size_t fl = strlen(pc->failures);
            snprintf(pc->failures + fl, sizeof pc->failures - fl, "\n  %s: %s", name, err);
        }
    }
    closedir(dir);
}

static inline int parity_run_one(const char *name, void *run, char *err, size_t n)
{
    return parity_case(name, run, err, n);
}

/* Every parity case through run; asserts that none fails and some pass, and prints the counts
 * after what. */
static inline void parity_run_all(const ParityRun *run, const char *what)
{
    ParityCount pc;
    parity_each(parity_run_one, (void *)run, run->unfit, what, &pc);
    fprintf(stderr, "%s: %d passed, %d refused by the language, %d failed\n", what, pc.passed, pc.refused, pc.failed);
    ck_assert_msg(pc.failed == 0, "parity failures:%s", pc.failures);
    ck_assert_int_gt(pc.passed, 0);
}

#endif
