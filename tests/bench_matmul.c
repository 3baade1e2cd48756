/* bench_matmul.c: GFLOP/s of xtc's generated matrix multiplication (not a test; built beside
 * the tests). Usage: bench_matmul [M K N] ... ; defaults: 512x512x512 and [1024x512]x[512x2048]
 * (plain and with B transposed), each with 1 and 2 threads, medians of repeated runs.
 * bench_matmul --attention H N D ...: the fused causal attention of H heads, N queries and keys,
 * head size D (the FLOPs counted are the 4 N^2 D H / 2 of the causal half).
 * bench_matmul --cosine H N D ...: cosine-sim attention (unit q and k rows, scale 10), causal, by
 * the bounded kernel (bound=1: the scale as every row's softmax maximum, passes/attention_bound.c)
 * and the general one (a running maximum), runs alternating, with 1 and 2 threads: both medians,
 * general / bounded, and the largest difference between their outputs.
 * bench_matmul --epilogue M K N ...: a feed-forward projection, gelu(A W^T + bias) with W [N, K],
 * compiled fused (the bias and GELU as the matmul's epilogue) and unfused (three kernels), and
 * the unfused / fused ratio: what the epilogue fusion saves on one layer's worth of work.
 * With 1 thread the work runs on the calling thread, and the thread's CPU time is reported too:
 * it is what the kernel costs even when other processes share the cores.
 * bench_matmul --bf16 [M K N] ...: the matmuls compiled with --dtype bf16 (the weight stored in
 * bf16), with --mma=bf16 (operands rounded to bf16 as read; f32 sums both: vdpbf16ps on CPUs with
 * AVX512_BF16), then in f32, and the ratios; by default the models' shapes and three of one token
 * (the matrix-vector path of decoding).
 * bench_matmul --blas [M K N T] ...: the f32 matmul beside OpenBLAS's cblas_sgemm on the same
 * operands (T 1: B given as [N, K], the weights' layout; T 2: A given as [K, M] and transposed by a
 * permute, which the matmul reads in place: a weight's gradient), runs alternating, with 1 and 2 threads,
 * and xtc / OpenBLAS in per cent of OpenBLAS's rate; by default the shapes of GPT-M's forward and
 * training step. OpenBLAS is loaded at run time (the OpenMP build with its SkylakeX kernels, as
 * ../shared/bench/README.md sets PyTorch up; XTC_BENCH_OPENBLAS names another library). */
#include "codegen.h"
#include "driver.h"
#include "passes.h"
#include "xtc.h"

#include <dlfcn.h>
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

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Times xtc_session_run: medians of the wall and (1 thread) the thread's CPU time, in seconds. */
static int time_runs(XtcSession *s, double *wall, double *cpu)
{
    double t[25], c[25];
    int reps = 0;
    double t0 = now_s();
    if (xtc_session_run(s)) { /* warm up */
        fprintf(stderr, "%s\n", xtc_session_error(s));
        return 1;
    }
    while (reps < 25 && (reps < 5 || now_s() - t0 < 2.0)) {
        double a0 = now_s(), c0 = cpu_s();
        if (xtc_session_run(s)) {
            fprintf(stderr, "%s\n", xtc_session_error(s));
            return 1;
        }
        c[reps] = cpu_s() - c0;
        t[reps++] = now_s() - a0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    qsort(c, (size_t)reps, sizeof c[0], cmp_double);
    *wall = t[reps / 2];
    *cpu = c[reps / 2];
    return 0;
}

static int mma = CG_MMA_AUTO; /* --bf16: CG_MMA_BF16 for the matmul benches */
static const char *dtype;     /* --bf16: "bf16" for the weights stored in bf16 (compile --dtype bf16) */

/* Compiles g (after the passes po asks for, when set) at -O3 for this CPU into path through the
 * compile driver, and loads it; NULL, with the message on stderr, when either fails. */
static XtcModule *compile_and_load(IrGraph *g, const PassOptions *po, const char *path)
{
    char err[1024];
    DrvTarget cpu;
    DrvJob job = {.graph = g, .start = po ? DRV_PASSES : DRV_CODEGEN, .passes = po,
                  .cg = {.output = path, .opt_level = 3}};
    CgStats st;
    job.cg.dtype = dtype;
    if (drv_target(&cpu, &(CgOptions){.mma = mma, .dtype = dtype}, err, sizeof err) ||
        drv_run(&job, &cpu, NULL, &st, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    XtcModule *mod;
    if (xtc_module_load(path, &mod)) {
        fprintf(stderr, "%s\n", xtc_module_error(mod));
        return NULL;
    }
    return mod;
}

/* The end of a result line: the rate from the wall time, and with 1 thread from its CPU time. */
static void print_rate(double flop, int threads, double wall, double cpu)
{
    printf("  threads %d  %8.3f ms  %7.1f GFLOP/s", threads, wall * 1e3, flop / wall * 1e-9);
    if (threads == 1)
        printf("   cpu %8.3f ms  %7.1f GFLOP/s", cpu * 1e3, flop / cpu * 1e-9);
    printf("\n");
}

static int bench(int64_t m, int64_t k, int64_t n, int tb, const char *dir, double *wall2)
{
    IrGraph *g = ir_graph_new("bench");
    IrDim sa[] = {ir_dim(m), ir_dim(k)}, sb[] = {ir_dim(tb ? n : k), ir_dim(tb ? k : n)};
    IrNode *a = ir_input(g, "a", IR_F32, 2, sa), *b = ir_param(g, "w", 2, sb);
    ir_output(g, "c", ir_matmul(g, a, b, tb));
    char path[600];
    snprintf(path, sizeof path, "%s/bench_%lld_%lld_%lld_%d.so", dir, (long long)m, (long long)k, (long long)n, tb);
    XtcModule *mod = compile_and_load(g, NULL, path);
    if (!mod)
        return 1;
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
        double med, cpu;
        if (time_runs(s, &med, &cpu))
            return 1;
        /* spot-check the result against a plain dot product */
        XtcTensor c;
        xtc_session_get_output(s, "c", &c);
        for (int probe = 0; probe < 64; probe++) {
            int64_t i = (probe * 7919) % m, j = (probe * 104729) % n;
            double ref = 0;
            for (int64_t p = 0; p < k; p++)
                ref += (double)A[i * k + p] * (double)(tb ? B[j * k + p] : B[p * n + j]);
            double got = ((const float *)c.data)[i * n + j];
            if (fabs(got - ref) > (mma == CG_MMA_BF16 || dtype ? 1e-2 : 1e-3) * (1 + fabs(ref))) { /* bf16: 2^-8 a product */
                fprintf(stderr, "wrong result at [%lld, %lld]: %g, expected %g\n", (long long)i, (long long)j, got, ref);
                return 1;
            }
        }
        double flop = 2.0 * (double)m * (double)n * (double)k;
        printf("matmul [%lldx%lld]x[%lldx%lld]%s%s", (long long)m, (long long)k, (long long)k, (long long)n,
               tb ? "^T" : "  ", dtype ? " bf16 weights" : mma == CG_MMA_BF16 ? " bf16" : "");
        print_rate(flop, threads, med, cpu);
        if (wall2 && threads == 2)
            *wall2 = med;
        xtc_session_free(s);
    }
    free(A);
    free(B);
    xtc_module_free(mod);
    unlink(path);
    ir_graph_free(g);
    return 0;
}

/* Causal attention of h heads over n positions, head size d: the output's rows against the
 * double-precision softmax of a few probes. */
static int bench_attention(int64_t h, int64_t n, int64_t d, const char *dir)
{
    IrGraph *g = ir_graph_new("bench");
    IrDim sh[] = {ir_dim(1), ir_dim(h), ir_dim(n), ir_dim(d)};
    IrNode *q = ir_input(g, "q", IR_F32, 4, sh), *k = ir_input(g, "k", IR_F32, 4, sh), *v = ir_input(g, "v", IR_F32, 4, sh);
    ir_output(g, "o", ir_attention(g, q, k, v, NULL, NULL, ir_const(g, 1.0 / sqrt((double)d), IR_F32), 1, 0));
    char path[600];
    snprintf(path, sizeof path, "%s/attn_%lld_%lld_%lld.so", dir, (long long)h, (long long)n, (long long)d);
    XtcModule *mod = compile_and_load(g, NULL, path);
    if (!mod)
        return 1;
    int64_t count = h * n * d, shape[4] = {1, h, n, d};
    float *x[3];
    for (int t = 0; t < 3; t++) {
        x[t] = malloc((size_t)count * 4);
        for (int64_t i = 0; i < count; i++)
            x[t][i] = (float)(((i + t) * (7 + 2 * t)) % 17) * 0.1f - 0.8f;
    }
    for (int threads = 1; threads <= 2; threads++) {
        XtcSession *s;
        xtc_session_new(mod, &(XtcSessionOptions){.threads = threads}, &s);
        xtc_session_set_input(s, "q", XTC_F32, 4, shape, x[0]);
        xtc_session_set_input(s, "k", XTC_F32, 4, shape, x[1]);
        xtc_session_set_input(s, "v", XTC_F32, 4, shape, x[2]);
        double med, cpu;
        if (time_runs(s, &med, &cpu))
            return 1;
        XtcTensor o;
        xtc_session_get_output(s, "o", &o);
        for (int probe = 0; probe < 16; probe++) {
            int64_t hh = probe % h, i = (probe * 7919) % n, e = (probe * 31) % d;
            const float *qi = x[0] + (hh * n + i) * d;
            double mx = -INFINITY, sum = 0, acc = 0, sc = 1.0 / sqrt((double)d);
            for (int64_t j = 0; j <= i; j++) {
                double dot = 0;
                for (int64_t c = 0; c < d; c++)
                    dot += (double)qi[c] * x[1][(hh * n + j) * d + c];
                mx = fmax(mx, dot * sc);
            }
            for (int64_t j = 0; j <= i; j++) {
                double dot = 0;
                for (int64_t c = 0; c < d; c++)
                    dot += (double)qi[c] * x[1][(hh * n + j) * d + c];
                double p = exp(dot * sc - mx);
                sum += p;
                acc += p * x[2][(hh * n + j) * d + e];
            }
            double got = ((const float *)o.data)[(hh * n + i) * d + e], ref = acc / sum;
            if (fabs(got - ref) > 1e-3 * (1 + fabs(ref))) {
                fprintf(stderr, "wrong attention at [%lld, %lld, %lld]: %g, expected %g\n", (long long)hh, (long long)i,
                        (long long)e, got, ref);
                return 1;
            }
        }
        double flop = 4.0 * (double)h * (double)n * (double)n * (double)d / 2;
        printf("attention causal h %lld n %lld d %lld", (long long)h, (long long)n, (long long)d);
        print_rate(flop, threads, med, cpu);
        xtc_session_free(s);
    }
    for (int t = 0; t < 3; t++)
        free(x[t]);
    xtc_module_free(mod);
    unlink(path);
    ir_graph_free(g);
    return 0;
}

/* bench_matmul --cosine: the bounded attention kernel against the general one (see the top). */
static int bench_cosine(int64_t h, int64_t n, int64_t d, const char *dir)
{
    int64_t count = h * n * d, shape[4] = {1, h, n, d};
    float *x[3];
    for (int t = 0; t < 3; t++) {
        x[t] = malloc((size_t)count * 4);
        for (int64_t i = 0; i < count; i++)
            x[t][i] = (float)(((i + t) * (7 + 2 * t)) % 17) * 0.1f - 0.8f + (float)((i * 31 + t) % 5) * 0.013f;
    }
    for (int t = 0; t < 2; t++) /* q and k rows of unit norm */
        for (int64_t r = 0; r < h * n; r++) {
            double ss = 0;
            for (int64_t c = 0; c < d; c++)
                ss += (double)x[t][r * d + c] * x[t][r * d + c];
            for (int64_t c = 0; c < d; c++)
                x[t][r * d + c] = (float)(x[t][r * d + c] / sqrt(ss));
        }
    XtcModule *mod[2] = {NULL, NULL}; /* [0] general, [1] bounded */
    IrGraph *g[2] = {NULL, NULL};
    char path[2][600];
    int rc = 0;
    for (int v = 0; v < 2 && !rc; v++) {
        g[v] = ir_graph_new("bench");
        IrDim sh[] = {ir_dim(1), ir_dim(h), ir_dim(n), ir_dim(d)};
        IrNode *q = ir_input(g[v], "q", IR_F32, 4, sh), *k = ir_input(g[v], "k", IR_F32, 4, sh);
        IrNode *vv = ir_input(g[v], "v", IR_F32, 4, sh);
        ir_output(g[v], "o", ir_attention_bounded(g[v], q, k, vv, NULL, ir_const(g[v], 10.0, IR_F32), 1, 0, 0, v));
        snprintf(path[v], sizeof path[v], "%s/cosine_%d.so", dir, v);
        mod[v] = compile_and_load(g[v], NULL, path[v]);
        rc = !mod[v];
    }
    double flop = 4.0 * (double)h * (double)n * (double)n * (double)d / 2;
    for (int threads = 1; threads <= 2 && !rc; threads++) {
        XtcSession *s[2];
        double t[2][15], c[2][15];
        for (int v = 0; v < 2; v++) {
            xtc_session_new(mod[v], &(XtcSessionOptions){.threads = threads}, &s[v]);
            xtc_session_set_input(s[v], "q", XTC_F32, 4, shape, x[0]);
            xtc_session_set_input(s[v], "k", XTC_F32, 4, shape, x[1]);
            xtc_session_set_input(s[v], "v", XTC_F32, 4, shape, x[2]);
            if (xtc_session_run(s[v])) { /* warm up */
                fprintf(stderr, "%s\n", xtc_session_error(s[v]));
                rc = 1;
            }
        }
        for (int r = 0; r < 15 && !rc; r++)
            for (int v = 0; v < 2; v++) {
                double t0 = now_s(), c0 = cpu_s();
                xtc_session_run(s[v]);
                t[v][r] = now_s() - t0;
                c[v][r] = cpu_s() - c0;
            }
        if (!rc) {
            XtcTensor o[2];
            xtc_session_get_output(s[0], "o", &o[0]);
            xtc_session_get_output(s[1], "o", &o[1]);
            double diff = 0, big = 0;
            for (int64_t i = 0; i < count; i++) {
                double a = ((const float *)o[0].data)[i], b = ((const float *)o[1].data)[i];
                diff = fmax(diff, fabs(a - b));
                big = fmax(big, fabs(a));
            }
            if (!(diff <= 1e-5 + 1e-4 * big)) {
                fprintf(stderr, "cosine: the bounded kernel differs from the general one by %g\n", diff);
                rc = 1;
            }
            for (int v = 0; v < 2; v++) {
                qsort(t[v], 15, sizeof t[v][0], cmp_double);
                qsort(c[v], 15, sizeof c[v][0], cmp_double);
            }
            printf("cosine-sim attention causal h %lld n %lld d %lld  threads %d  bounded %8.3f ms %6.1f GFLOP/s  "
                   "general %8.3f ms  general/bounded %.2fx  max|diff| %.1e\n", (long long)h, (long long)n, (long long)d,
                   threads, t[1][7] * 1e3, flop / t[1][7] * 1e-9, t[0][7] * 1e3, t[0][7] / t[1][7], diff);
            if (threads == 1) /* the calling thread's CPU time: what each costs even on a shared machine */
                printf("  thread CPU time: bounded %8.3f ms  general %8.3f ms  general/bounded %.2fx\n", c[1][7] * 1e3,
                       c[0][7] * 1e3, c[0][7] / c[1][7]);
        }
        xtc_session_free(s[0]);
        xtc_session_free(s[1]);
    }
    for (int v = 0; v < 2; v++) {
        if (mod[v]) {
            xtc_module_free(mod[v]);
            unlink(path[v]);
        }
        ir_graph_free(g[v]);
    }
    for (int t = 0; t < 3; t++)
        free(x[t]);
    return rc;
}

/* The reference for bench_epilogue: gelu(A W^T + bias) at row i, column j, in double. */
static double ff_ref(const float *A, const float *W, const float *B, int64_t k, int64_t i, int64_t j)
{
    double x = B[j];
    for (int64_t p = 0; p < k; p++)
        x += (double)A[i * k + p] * (double)W[j * k + p];
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

/* gelu(A W^T + bias), A [m, k], W [n, k]: the fused program (the bias and GELU applied by the
 * matmul kernel, as the passes fuse them) and the unfused one (passes without fusions: three
 * kernels), with 1 and 2 threads. Their runs alternate, so that both see the same machine, and
 * each reports its median; the outputs are checked against a double-precision reference. */
static int bench_epilogue(int64_t m, int64_t k, int64_t n, const char *dir)
{
    IrGraph *g = ir_graph_new("bench");
    IrDim sa[] = {ir_dim(m), ir_dim(k)}, sw[] = {ir_dim(n), ir_dim(k)}, sb[] = {ir_dim(n)};
    IrNode *a = ir_input(g, "a", IR_F32, 2, sa), *w = ir_param(g, "w", 2, sw), *bias = ir_param(g, "bias", 1, sb);
    ir_output(g, "c", ir_unary(g, IR_GELU, ir_binary(g, IR_ADD, ir_matmul(g, a, w, 1), bias)));
    float *A = malloc((size_t)(m * k) * 4), *W = malloc((size_t)(n * k) * 4), *B = malloc((size_t)n * 4);
    for (int64_t i = 0; i < m * k; i++)
        A[i] = (float)((i * 7) % 13) * 0.02f - 0.1f;
    for (int64_t i = 0; i < n * k; i++)
        W[i] = (float)((i * 5) % 11) * 0.01f - 0.05f;
    for (int64_t i = 0; i < n; i++)
        B[i] = (float)(i % 7) * 0.1f - 0.3f;
    XtcModule *mod[2] = {NULL, NULL}; /* [0] unfused, [1] fused */
    char path[2][600];
    int rc = 0;
    for (int fuse = 0; fuse < 2 && !rc; fuse++) {
        PassOptions po = {.no_fuse = !fuse};
        snprintf(path[fuse], sizeof path[fuse], "%s/ff_%d.so", dir, fuse);
        mod[fuse] = compile_and_load(g, &po, path[fuse]);
        rc = !mod[fuse];
    }
    double flop = 2.0 * (double)m * (double)n * (double)k;
    for (int threads = 1; threads <= 2 && !rc; threads++) {
        XtcSession *s[2];
        double t[2][21];
        for (int v = 0; v < 2; v++) {
            xtc_session_new(mod[v], &(XtcSessionOptions){.threads = threads}, &s[v]);
            xtc_session_set_input(s[v], "a", XTC_F32, 2, (int64_t[]){m, k}, A);
            xtc_session_set_weight(s[v], "w", 2, (int64_t[]){n, k}, W);
            xtc_session_set_weight(s[v], "bias", 1, (int64_t[]){n}, B);
            if (xtc_session_run(s[v])) { /* warm up */
                fprintf(stderr, "%s\n", xtc_session_error(s[v]));
                rc = 1;
            }
        }
        for (int r = 0; r < 21 && !rc; r++)
            for (int v = 0; v < 2; v++) {
                double t0 = now_s();
                xtc_session_run(s[v]);
                t[v][r] = now_s() - t0;
            }
        for (int v = 0; v < 2 && !rc; v++) {
            XtcTensor c;
            xtc_session_get_output(s[v], "c", &c);
            for (int probe = 0; probe < 64 && !rc; probe++) {
                int64_t i = (probe * 7919) % m, j = (probe * 104729) % n;
                double ref = ff_ref(A, W, B, k, i, j), got = ((const float *)c.data)[i * n + j];
                if (fabs(got - ref) > 1e-3 * (1 + fabs(ref))) {
                    fprintf(stderr, "%s: wrong result at [%lld, %lld]: %g, expected %g\n", v ? "fused" : "unfused",
                            (long long)i, (long long)j, got, ref);
                    rc = 1;
                }
            }
            qsort(t[v], 21, sizeof t[v][0], cmp_double);
        }
        if (!rc)
            printf("gelu([%lldx%lld]x[%lldx%lld]^T + bias)  threads %d  fused %8.3f ms %7.1f GFLOP/s  unfused %8.3f ms"
                   "  unfused/fused %.2fx\n", (long long)m, (long long)k, (long long)k, (long long)n, threads,
                   t[1][10] * 1e3, flop / t[1][10] * 1e-9, t[0][10] * 1e3, t[0][10] / t[1][10]);
        xtc_session_free(s[0]);
        xtc_session_free(s[1]);
    }
    for (int v = 0; v < 2; v++)
        if (mod[v]) {
            xtc_module_free(mod[v]);
            unlink(path[v]);
        }
    free(A);
    free(W);
    free(B);
    ir_graph_free(g);
    return rc;
}

/* OpenBLAS, loaded at run time: cblas_sgemm(RowMajor, NoTrans, transb, m, n, k, 1, A, lda, B, ldb, 0, C, n) */
typedef void (*SgemmFn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
static SgemmFn blas_sgemm;
static void (*blas_set_threads)(int);

static int blas_open(void)
{
    /* the library reads the core type once, as it loads: Debian's 0.3.21 does not know this CPU */
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    const char *paths[] = {getenv("XTC_BENCH_OPENBLAS"), "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                           "libopenblas.so.0"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        void *h = paths[i] ? dlopen(paths[i], RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!h)
            continue;
        blas_sgemm = (SgemmFn)dlsym(h, "cblas_sgemm");
        blas_set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
        if (blas_sgemm && blas_set_threads) {
            printf("OpenBLAS: %s (OPENBLAS_CORETYPE=%s)\n", paths[i], getenv("OPENBLAS_CORETYPE"));
            return 0;
        }
        dlclose(h);
    }
    fprintf(stderr, "bench_matmul --blas: no OpenBLAS with cblas_sgemm (apt-get install libopenblas0-openmp, or set "
                    "XTC_BENCH_OPENBLAS)\n");
    return 1;
}

/* xtc's [m x k] x [k x n] (form 1: B given [n, k]; 2: A given [k, m]) and cblas_sgemm on the same
 * operands, one run of each in turn, 1 and 2 threads: the medians, and xtc's rate in per cent of
 * OpenBLAS's. */
static int bench_blas(int64_t m, int64_t k, int64_t n, int form, const char *dir)
{
    int tb = form == 1, ta = form == 2;
    IrGraph *g = ir_graph_new("bench");
    IrDim sa[] = {ir_dim(ta ? k : m), ir_dim(ta ? m : k)}, sb[] = {ir_dim(tb ? n : k), ir_dim(tb ? k : n)};
    IrNode *a = ir_input(g, "a", IR_F32, 2, sa), *b = ir_param(g, "w", 2, sb);
    ir_output(g, "c", ir_matmul(g, ta ? ir_permute(g, a, (int[]){1, 0}) : a, b, tb));
    char path[600];
    snprintf(path, sizeof path, "%s/blas_%lld_%lld_%lld_%d.so", dir, (long long)m, (long long)k, (long long)n, form);
    XtcModule *mod = compile_and_load(g, NULL, path);
    ir_graph_free(g);
    if (!mod)
        return 1;
    float *A = malloc((size_t)(m * k) * 4), *B = malloc((size_t)(k * n) * 4), *C = malloc((size_t)(m * n) * 4);
    for (int64_t i = 0; i < m * k; i++)
        A[i] = (float)((i * 7) % 13) * 0.1f;
    for (int64_t i = 0; i < k * n; i++)
        B[i] = (float)((i * 5) % 11) * 0.1f;
    int rc = 0;
    double flop = 2.0 * (double)m * (double)n * (double)k;
    for (int threads = 1; threads <= 2 && !rc; threads++) {
        XtcSession *s;
        xtc_session_new(mod, &(XtcSessionOptions){.threads = threads}, &s);
        xtc_session_set_input(s, "a", XTC_F32, 2, ta ? (int64_t[]){k, m} : (int64_t[]){m, k}, A);
        xtc_session_set_weight(s, "w", 2, tb ? (int64_t[]){n, k} : (int64_t[]){k, n}, B);
        blas_set_threads(threads);
        double t[2][25], c[2][25];
        int reps = 0;
        for (int r = -1; r < 25 && (r < 7 || t[0][0] * r < 3.0); r++) { /* r -1: warm-up */
            for (int v = 0; v < 2 && !rc; v++) {
                double w0 = now_s(), c0 = cpu_s();
                if (v == 0)
                    rc = xtc_session_run(s) != 0;
                else
                    blas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, (int)m, (int)n, (int)k, 1.0f, A, ta ? (int)m : (int)k, B, tb ? (int)k : (int)n,
                               0.0f, C, (int)n);
                if (r >= 0)
                    c[v][r] = cpu_s() - c0, t[v][r] = now_s() - w0;
            }
            reps = r + 1;
        }
        if (rc) {
            fprintf(stderr, "%s\n", xtc_session_error(s));
            xtc_session_free(s);
            break;
        }
        XtcTensor out;
        xtc_session_get_output(s, "c", &out);
        for (int probe = 0; probe < 64 && !rc; probe++) {
            int64_t i = (probe * 7919) % m, j = (probe * 104729) % n;
            double ref = 0;
            for (int64_t p = 0; p < k; p++)
                ref += (double)(ta ? A[p * m + i] : A[i * k + p]) * (double)(tb ? B[j * k + p] : B[p * n + j]);
            double got = ((const float *)out.data)[i * n + j], gotb = C[i * n + j];
            if (fabs(got - ref) > 1e-3 * (1 + fabs(ref)) || fabs(gotb - ref) > 1e-3 * (1 + fabs(ref))) {
                fprintf(stderr, "wrong result at [%lld, %lld]: xtc %g, OpenBLAS %g, expected %g\n", (long long)i,
                        (long long)j, got, gotb, ref);
                rc = 1;
            }
        }
        xtc_session_free(s);
        if (rc)
            break;
        for (int v = 0; v < 2; v++) {
            qsort(t[v], (size_t)reps, sizeof t[v][0], cmp_double);
            qsort(c[v], (size_t)reps, sizeof c[v][0], cmp_double);
        }
        double tx = t[0][reps / 2], tbl = t[1][reps / 2], cx = c[0][reps / 2], cb = c[1][reps / 2];
        printf("[%5lldx%5lld]%sx[%5lldx%5lld]%s threads %d  xtc %8.3f ms %6.1f GFLOP/s  OpenBLAS %8.3f ms %6.1f GFLOP/s"
               "  xtc/OpenBLAS %5.1f %%", (long long)m, (long long)k, ta ? "^T" : "  ", (long long)k, (long long)n, tb ? "^T" : "  ",
               threads, tx * 1e3, flop / tx * 1e-9, tbl * 1e3, flop / tbl * 1e-9, 100 * tbl / tx);
        if (threads == 1)
            printf("  (cpu time: %5.1f %%)", 100 * cb / cx);
        printf("\n");
    }
    free(A);
    free(B);
    free(C);
    xtc_module_free(mod);
    unlink(path);
    return rc;
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/xtc-bench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    int rc = 0;
    if (argc >= 5 && !strcmp(argv[1], "--attention")) {
        for (int i = 2; i + 2 < argc; i += 3)
            rc |= bench_attention(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), dir);
    } else if (argc >= 5 && !strcmp(argv[1], "--cosine")) {
        for (int i = 2; i + 2 < argc; i += 3)
            rc |= bench_cosine(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), dir);
    } else if (argc >= 5 && !strcmp(argv[1], "--epilogue")) {
        for (int i = 2; i + 2 < argc; i += 3)
            rc |= bench_epilogue(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), dir);
    } else if (argc >= 2 && !strcmp(argv[1], "--blas")) {
        /* GPT-M (batch 2 x seq 512 rows, d 512, 4d, vocab 20000): the forward's projections against
         * the weights ([n, k]), its logits, and the training step's products: a gradient of the input
         * (dY W, W as stored) and of a weight (dY^T X, dY read transposed; summed over the batch, so
         * k = batch x seq rows) */
        static const int64_t shapes[][4] = {{1024, 512, 512, 1}, {1024, 512, 2048, 1}, {1024, 2048, 512, 1},
                                            {1024, 512, 20000, 1}, {1024, 512, 512, 0}, {1024, 2048, 512, 0},
                                            {1024, 20000, 512, 0}, {1024, 512, 2048, 0}, {512, 1024, 512, 2}, {2048, 1024, 512, 2},
                                            {512, 1024, 2048, 2}, {20000, 1024, 512, 2}};
        int nshapes = argc >= 6 ? (argc - 2) / 4 : (int)(sizeof shapes / sizeof shapes[0]);
        rc = blas_open();
        for (int i = 0; i < nshapes && !rc; i++) {
            const int64_t *sh = shapes[i];
            int64_t given[4];
            if (argc >= 6) {
                for (int j = 0; j < 4; j++)
                    given[j] = atoll(argv[2 + 4 * i + j]);
                sh = given;
            }
            rc |= bench_blas(sh[0], sh[1], sh[2], (int)sh[3], dir);
        }
    } else if (argc >= 2 && !strcmp(argv[1], "--bf16")) {
        /* the models' shapes by default: GPT-M's rows (batch 2 x seq 512) against d 512, 4d, vocab */
        static const int64_t shapes[][4] = {{1024, 512, 512, 1}, {1024, 512, 2048, 1}, {1024, 2048, 512, 1},
                                            {1024, 512, 2048, 0}, {1024, 512, 20000, 1},
                                            /* one token decoded: the matrix-vector path */
                                            {1, 512, 2048, 1}, {1, 2048, 512, 1}, {1, 256, 1024, 1}};
        int nshapes = argc >= 5 ? (argc - 2) / 3 : (int)(sizeof shapes / sizeof shapes[0]);
        for (int i = 0; i < nshapes; i++) {
            int64_t m = argc >= 5 ? atoll(argv[2 + 3 * i]) : shapes[i][0], k = argc >= 5 ? atoll(argv[3 + 3 * i]) : shapes[i][1];
            int64_t n = argc >= 5 ? atoll(argv[4 + 3 * i]) : shapes[i][2];
            int tb = argc >= 5 ? 1 : (int)shapes[i][3];
            /* --dtype bf16 (bf16 weights and operands), --mma=bf16 (f32 weights rounded as read), f32 */
            double tw = 0, t16 = 0, t32 = 0;
            dtype = "bf16";
            rc |= bench(m, k, n, tb, dir, &tw);
            dtype = NULL;
            mma = CG_MMA_BF16;
            rc |= bench(m, k, n, tb, dir, &t16);
            mma = CG_MMA_AUTO;
            rc |= bench(m, k, n, tb, dir, &t32);
            if (t16 > 0 && tw > 0)
                printf("  speed over f32 (2 threads): bf16 weights %.2fx, --mma=bf16 %.2fx\n", t32 / tw, t32 / t16);
        }
    } else if (argc >= 4) {
        for (int i = 1; i + 2 < argc; i += 3)
            rc |= bench(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), 0, dir, NULL);
    } else {
        rc |= bench(512, 512, 512, 0, dir, NULL);
        rc |= bench(1024, 512, 2048, 0, dir, NULL);
        rc |= bench(1024, 512, 2048, 1, dir, NULL);
    }
    rmdir(dir);
    return rc;
}
