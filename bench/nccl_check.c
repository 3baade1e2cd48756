/* nccl_check.c: NCCL end to end on one device: trains a CUDA training module STEPS steps twice
 * from the same weights and batches, alone and with a one-rank NCCL communicator (the gradients
 * all-reduced on the device, then the device's AdamW step), and prints PASS when the losses and
 * the final weights agree (or FAIL, and why). Built against include/xtc.h and libxtc_rt.a
 * (bench/nccl_check.sh --prepare; tests/CMakeLists.txt for test_nccl.sh): no LLVM, no MPI.
 *
 *   nccl_check MODULE.so [STEPS [BATCH SEQ]]      (20 steps of 4 x 32 tokens)
 *
 * NCCL is libnccl.so.2 or the file $XTC_NCCL names. Exit 0 on PASS, 1 on FAIL. */
#include "bench_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xtc.h"

static int fail(XtcSession *s, const char *what)
{
    printf("FAIL: %s: %s\n", what, s ? xtc_session_error(s) : "out of memory");
    return 1;
}

/* |a - b| relative to |b|, 0 when both are the same bits */
static double rel(double a, double b) { return a == b ? 0 : fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

/* Trains s[0] alone, s[1] with NCCL and s[2] alone again and compares them (prints PASS or
 * FAIL); returns the exit status. Frees what it allocates on every path (LeakSanitizer runs it in
 * test_nccl.sh). */
static int check(const XtcModule *m, XtcSession *s[3], int steps, int64_t B, int64_t N)
{
    XtcTensorInfo emb;
    int64_t V = 256;
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++)
        if (!xtc_module_tensor(m, XTC_PARAM, i, &emb) && strstr(emb.name, "token_emb") && emb.rank == 2)
            V = emb.shape[0];
    char why[1024];
    if (!xtc_session_nccl_usable(s[1], why, sizeof why)) {
        printf("FAIL: NCCL cannot be used: %s\n", why);
        return 1;
    }
    printf("device %s; %s\n", xtc_session_device(s[1]), why);
    if (xtc_session_set_nccl(s[1], 0, 1, NULL))
        return fail(s[1], "xtc_session_set_nccl");
    int64_t shape[2] = {B, N};
    int64_t *tok = malloc((size_t)(B * N) * sizeof *tok), *tgt = malloc((size_t)(B * N) * sizeof *tgt);
    int rc = 1;
    if (!tok || !tgt) {
        fail(NULL, "inputs");
        goto done;
    }
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 3e-3f;
    opt.max_grad_norm = 1.0f;
    double worst = 0, secs[3] = {0, 0, 0};
    int same = 0;
    for (int it = 1; it <= steps; it++) {
        for (int64_t i = 0; i < B * N; i++) {
            tok[i] = (int64_t)(bench_next() % (uint64_t)V);
            tgt[i] = (int64_t)(bench_next() % (uint64_t)V);
        }
        float loss[3];
        for (int k = 0; k < 3; k++) {
            XtcTensor t;
            double t0 = bench_now();
            if (xtc_session_set_input(s[k], "tokens", XTC_I64, 2, shape, tok) ||
                xtc_session_set_input(s[k], "targets", XTC_I64, 2, shape, tgt) || xtc_session_run(s[k]) ||
                xtc_session_step(s[k], &opt) || xtc_session_get_output(s[k], "loss", &t)) {
                fail(s[k], k ? "training step with NCCL" : "training step alone");
                goto done;
            }
            secs[k] += bench_now() - t0;
            loss[k] = *(const float *)t.data;
        }
        double d = rel(loss[1], loss[0]);
        worst = d > worst ? d : worst;
        same += loss[0] == loss[1];
        if (it == 1 || it == steps || d > 1e-5)
            printf("step %3d  loss alone %.6f  with NCCL %.6f\n", it, loss[0], loss[1]);
    }
    /* the final weights (the device's, read back), the largest difference of each tensor relative
     * to its largest |weight|: the GPU's atomic sums (the embedding's gradient) are not
     * bit-reproducible, and AdamW turns a last-bit change of a gradient near 0 into a change of
     * up to lr in its weight; so NCCL's difference is judged against two runs alone */
    double wd[3] = {0, 0, 0};
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++) {
        XtcTensorInfo info;
        XtcTensor t[3];
        xtc_module_tensor(m, XTC_PARAM, i, &info);
        for (int k = 0; k < 3; k++)
            if (xtc_session_get_weight(s[k], info.name, &t[k])) {
                fail(s[k], "reading the weights");
                goto done;
            }
        int64_t n = 1;
        for (int d = 0; d < t[0].rank; d++)
            n *= t[0].shape[d];
        const float *x = t[0].data;
        double big = 1e-30;
        for (int64_t j = 0; j < n; j++)
            big = fmax(big, fabs((double)x[j]));
        for (int k = 1; k < 3; k++) {
            const float *y = t[k].data;
            double diff = 0;
            for (int64_t j = 0; j < n; j++)
                diff = fmax(diff, fabs((double)x[j] - y[j]));
            wd[k] = fmax(wd[k], diff / big);
        }
    }
    double wworst = wd[1], wlimit = fmax(1e-4, 2 * wd[2]);
    double during = 0, after = 0;
    xtc_session_comm_time(s[1], &during, &after);
    printf("%d steps of %lld x %lld tokens: losses bit-identical at %d of %d steps, largest relative difference "
           "%.3g; weights: %.3g (two runs alone: %.3g); %.2f ms per step alone, %.2f with NCCL (%.3f ms queueing the all-reduces)\n",
           steps, (long long)B, (long long)N, same, steps, worst, wworst, wd[2], 1e3 * secs[0] / steps,
           1e3 * secs[1] / steps, 1e3 * (during + after) / steps);
    int ok = worst <= 1e-5 && wworst <= wlimit;
    printf("%s: a one-rank NCCL communicator trains as the session alone\n", ok ? "PASS" : "FAIL");
    rc = !ok;
done:
    free(tok);
    free(tgt);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: nccl_check MODULE.so [STEPS [BATCH SEQ]]\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 20;
    int64_t B = argc > 4 ? atoll(argv[3]) : 4, N = argc > 4 ? atoll(argv[4]) : 32;
    XtcModule *m = NULL;
    if (xtc_module_load(argv[1], &m)) {
        printf("FAIL: %s: %s\n", argv[1], m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return 1;
    }
    XtcSessionOptions so = {.threads = 1};
    XtcSession *s[3] = {NULL, NULL, NULL}; /* alone, with NCCL, alone again (the GPU's run-to-run spread) */
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++)
        if (xtc_session_new(m, &so, &s[k]) || xtc_session_init_weights(s[k], 1))
            rc = fail(s[k], "session");
    if (!rc)
        rc = check(m, s, steps, B, N);
    for (int k = 0; k < 3; k++)
        xtc_session_free(s[k]);
    xtc_module_free(m);
    return rc;
}
