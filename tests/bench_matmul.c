/* bench_matmul.c: GFLOP/s of xtc's generated matrix multiplication (not a test; built beside
 * the tests). Usage: bench_matmul [M K N [transpose_b]] ... ; defaults: 512x512x512 and
 * [1024x512]x[512x2048], each with 1 and 2 threads, medians of repeated runs. */
#include "codegen.h"
#include "xtc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(int64_t m, int64_t k, int64_t n, int tb, const char *dir)
{
    IrGraph *g = ir_graph_new("bench");
    IrDim sa[] = {ir_dim(m), ir_dim(k)}, sb[] = {ir_dim(tb ? n : k), ir_dim(tb ? k : n)};
    IrNode *a = ir_input(g, "a", IR_F32, 2, sa), *b = ir_param(g, "w", 2, sb);
    ir_output(g, "c", ir_matmul(g, a, b, tb));
    char path[600], err[1024];
    snprintf(path, sizeof path, "%s/bench_%lld_%lld_%lld_%d.so", dir, (long long)m, (long long)k, (long long)n, tb);
    CgOptions opt = {.output = path, .opt_level = 3};
    CgStats st;
    if (cg_compile(g, &opt, &st, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    XtcModule *mod;
    if (xtc_module_load(path, &mod)) {
        fprintf(stderr, "%s\n", xtc_module_error(mod));
        return 1;
    }
    float *A = malloc((size_t)(m * k) * 4), *B = malloc((size_t)(k * n) * 4);
    for (int64_t i = 0; i < m * k; i++)
        A[i] = (float)((i * 7) % 13) * 0.1f;
    for (int64_t i = 0; i < k * n; i++)
        B[i] = (float)((i * 5) % 11) * 0.1f;
    for (int threads = 1; threads <= 2; threads++) {
        XtcSession *s;
        xtc_session_new(mod, &(XtcSessionOptions){.threads = threads}, &s);
        xtc_session_set_input(s, "a", XTC_F32, 2, (int64_t[]){m, k}, A);
        xtc_session_set_weight(s, "w", 2, tb ? (int64_t[]){n, k} : (int64_t[]){k, n}, B);
        double t[25];
        int reps = 0;
        double t0 = now_s();
        xtc_session_run(s); /* warm up */
        while (reps < 25 && (reps < 5 || now_s() - t0 < 2.0)) {
            double a0 = now_s();
            if (xtc_session_run(s)) {
                fprintf(stderr, "%s\n", xtc_session_error(s));
                return 1;
            }
            t[reps++] = now_s() - a0;
        }
        /* spot-check the result against a plain dot product */
        XtcTensor c;
        xtc_session_get_output(s, "c", &c);
        for (int probe = 0; probe < 64; probe++) {
            int64_t i = (probe * 7919) % m, j = (probe * 104729) % n;
            double ref = 0;
            for (int64_t p = 0; p < k; p++)
                ref += (double)A[i * k + p] * (double)(tb ? B[j * k + p] : B[p * n + j]);
            double got = ((const float *)c.data)[i * n + j];
            if (fabs(got - ref) > 1e-3 * (1 + fabs(ref))) {
                fprintf(stderr, "wrong result at [%lld, %lld]: %g, expected %g\n", (long long)i, (long long)j, got, ref);
                return 1;
            }
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp_double);
        double med = t[reps / 2];
        printf("matmul [%lldx%lld]x[%lldx%lld]%s  threads %d  %8.3f ms  %7.1f GFLOP/s\n", (long long)m, (long long)k,
               (long long)k, (long long)n, tb ? "^T" : "  ", threads, med * 1e3, 2.0 * m * n * k / med * 1e-9);
        xtc_session_free(s);
    }
    free(A);
    free(B);
    xtc_module_free(mod);
    unlink(path);
    ir_graph_free(g);
    return 0;
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/xtc-bench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    int rc = 0;
    if (argc >= 4) {
        for (int i = 1; i + 2 < argc; i += 3)
            rc |= bench(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), 0, dir);
    } else {
        rc |= bench(512, 512, 512, 0, dir);
        rc |= bench(1024, 512, 2048, 0, dir);
        rc |= bench(1024, 512, 2048, 1, dir);
    }
    rmdir(dir);
    return rc;
}
