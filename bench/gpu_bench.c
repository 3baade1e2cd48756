/* gpu_bench.c: the xtc half of bench/gpu_compare.sh: times a compiled module (a CUDA module on a
 * GPU, or a cuda-emu module in the script's --dry-run) through the public API only, and prints
 * one JSON line per shape. Built by that script against include/xtc.h and libxtc_rt.a, so it
 * runs where the module runs (no LLVM needed).
 *
 *   gpu_bench fwd    MODULE.so ITERS WARMUP BxN...   forward (xtc_session_run)
 *   gpu_bench train  MODULE.so ITERS WARMUP BxN...   training step: run (loss, gradients) + AdamW
 *   gpu_bench decode MODULE.so CONTEXT TOKENS        KV-cache decoding: a prompt of CONTEXT - TOKENS
 *                                                    tokens, then TOKENS one-token calls
 *   gpu_bench matmul MODULE.so ITERS WARMUP [MODULE.so...]
 *                                                    a product alone: modules of one matmul c = a b
 *                                                    (inputs a [M, K] and b [K, N], or [N, K] for
 *                                                    B transposed), each timed in turn
 *
 * fwd and train report the median and minimum wall time of ITERS runs (each run synchronises with
 * the device; a training step reads its loss, a forward reads nothing: the runtime copies an
 * output to the host only when it is read), the median of a few more runs that read every output
 * ("read_all_ms": the logits of a forward, the loss and every gradient of a training step, as
 * every run copied them before outputs were copied on demand), and from extra profiled runs the
 * device's own time per run summed over the kernels
 * ("kernels_ms", CUDA events) with the attention kernels' share ("attention_ms" and
 * "attention_grad_ms", the ops of those names). decode reports tokens/s of the one-token calls
 * (each reads its logits back, as a sampler would; "graphs": 0 where XTC_CUDA_GRAPHS=0 turned the
 * runtime's CUDA graphs off, to compare). Weights are fresh ones drawn by
 * xtc_session_init_weights (the speed does not depend on them). With GPU_BENCH_PROFILE set in the environment, fwd, train and decode also
 * write the per-kernel profile (xtc_session_print_profile) to stderr, and decode the time per
 * token spent in carries, runs and reading the logits. GPU_BENCH_THREADS=T runs the session on T
 * threads (default: one per CPU); decode also reports the process's CPU time per token
 * ("cpu_ms_per_token"), which a shared machine's other load disturbs less than the wall clock.
 * matmul reports per module M, K, N, the median wall time of ITERS runs and the mean device time
 * of ITERS profiled runs ("kernels_ms", CUDA events: the product's kernel alone, the inputs bound
 * once, uniform in [-1, 1)) with its TFLOP/s (2 M N K flops). */
#include "bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xtc.h"

static int die(XtcSession *s, const char *what)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, xtc_session_error(s));
    return 1;
}

static int64_t vocab(const XtcModule *m)
{
    XtcTensorInfo lg;
    if (xtc_module_tensor(m, XTC_OUTPUT, xtc_module_find(m, XTC_OUTPUT, "logits"), &lg) || lg.rank < 1)
        return 2;
    return lg.shape[lg.rank - 1];
}

/* Device milliseconds per run summed over all steps and over those of the ops "attention" and
 * "attention_grad", from `runs` profiled runs. */
static int profile(const XtcModule *m, XtcSession *s, int runs, double ms[3])
{
    int n = xtc_module_num_steps(m);
    double *secs = calloc((size_t)n + 1, sizeof *secs);
    if (!secs || xtc_session_set_profiling(s, 1)) {
        free(secs);
        return die(s, "profiling");
    }
    for (int r = 0; r < runs; r++)
        if (xtc_session_run(s)) {
            free(secs);
            return die(s, "profiled run");
        }
    int got = xtc_session_profile_steps(s, secs, n);
    ms[0] = ms[1] = ms[2] = 0;
    for (int i = 0; i < n && got > 0; i++) {
        int k = -1;
        const char *fn = NULL, *op = "";
        xtc_module_step(m, i, &k, NULL);
        xtc_module_kernel(m, k, &fn, &op, NULL);
        double v = 1e3 * secs[i] / got;
        ms[0] += v;
        if (op && !strcmp(op, "attention"))
            ms[1] += v;
        if (op && !strcmp(op, "attention_grad"))
            ms[2] += v;
    }
    if (getenv("GPU_BENCH_PROFILE"))
        xtc_session_print_profile(s, stderr);
    xtc_session_set_profiling(s, 0);
    free(secs);
    return 0;
}

static int timed(const char *mode, const char *path, const XtcModule *m, XtcSession *s, int iters, int warmup,
                 int64_t B, int64_t N)
{
    int train = !strcmp(mode, "train");
    int64_t V = vocab(m), shape[2] = {B, N};
    int64_t *tok = malloc((size_t)(B * N) * sizeof *tok), *tgt = malloc((size_t)(B * N) * sizeof *tgt);
    double *t = calloc((size_t)iters, sizeof *t);
    if (!tok || !tgt || !t) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < B * N; i++) {
        tok[i] = (int64_t)(bench_next() % (uint64_t)V);
        tgt[i] = (int64_t)(bench_next() % (uint64_t)V);
    }
    int rc = 1;
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) ||
        (train && xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt))) {
        die(s, "inputs");
        goto done;
    }
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 1e-4f;
    opt.max_grad_norm = 1.0f;
    XtcTensor out;
    for (int it = -warmup; it < iters; it++) {
        double t0 = bench_now();
        if (xtc_session_run(s) || (train && xtc_session_get_output(s, "loss", &out)) ||
            (train && xtc_session_step(s, &opt))) {
            die(s, train ? "training step" : "run");
            goto done;
        }
        if (it >= 0)
            t[it] = bench_now() - t0;
    }
    /* the same with every output read after the run */
    int nall = iters < 3 ? iters : 3, nout = xtc_module_count(m, XTC_OUTPUT);
    double *all = calloc((size_t)nall, sizeof *all);
    for (int it = 0; all && it < nall; it++) {
        double t0 = bench_now();
        int bad = xtc_session_run(s);
        for (int o = 0; o < nout && !bad; o++) {
            XtcTensorInfo info;
            bad = xtc_module_tensor(m, XTC_OUTPUT, o, &info) || xtc_session_get_output(s, info.name, &out);
        }
        if (bad || (train && xtc_session_step(s, &opt))) {
            free(all);
            die(s, "reading every output");
            goto done;
        }
        all[it] = bench_now() - t0;
    }
    double read_all = all ? bench_median(all, nall) : 0;
    free(all);
    double ms[3];
    if (profile(m, s, iters < 3 ? iters : 3, ms))
        goto done;
    double min = t[0];
    for (int i = 1; i < iters; i++)
        min = t[i] < min ? t[i] : min;
    double med = bench_median(t, iters);
    printf("{\"mode\": \"%s\", \"module\": \"%s\", \"device\": \"%s\", \"batch\": %lld, \"seq\": %lld, "
           "\"params\": %lld, \"median_ms\": %.4f, \"min_ms\": %.4f, \"kernels_ms\": %.4f, \"attention_ms\": %.4f, "
           "\"attention_grad_ms\": %.4f, \"read_all_ms\": %.4f, \"iters\": %d, \"tok_per_s\": %.1f}\n",
           mode, path, xtc_session_device(s), (long long)B, (long long)N, (long long)xtc_module_param_count(m),
           1e3 * med, 1e3 * min, ms[0], ms[1], ms[2], 1e3 * read_all, iters, (double)(B * N) / med);
    fflush(stdout);
    rc = 0;
done:
    free(tok);
    free(tgt);
    free(t);
    return rc;
}

/* A prompt of ctx - tokens, then `tokens` one-token calls carrying the caches. */
static int decode(const char *path, const XtcModule *m, XtcSession *s, int64_t ctx, int64_t tokens)
{
    const char *names[256], *failed = NULL;
    int nc = bench_empty_caches(s, m, names, 256, &failed);
    if (nc < 0)
        return die(s, failed);
    if (!nc || tokens < 1 || ctx <= tokens) {
        fprintf(stderr, "gpu_bench: %s is not a --kv-cache module, or CONTEXT <= TOKENS\n", path);
        return 1;
    }
    int64_t V = vocab(m), prompt = ctx - tokens;
    int64_t *tok = malloc((size_t)ctx * sizeof *tok);
    if (!tok)
        return 1;
    for (int64_t i = 0; i < ctx; i++)
        tok[i] = (int64_t)(bench_next() % (uint64_t)V);
    int64_t shape[2] = {1, prompt};
    double t0 = bench_now();
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) || xtc_session_run(s)) {
        free(tok);
        return die(s, "prompt");
    }
    int prof = getenv("GPU_BENCH_PROFILE") != NULL;
    double t_carry = 0, t_run = 0, t_get = 0;
    if (prof)
        xtc_session_set_profiling(s, 1);
    double t1 = bench_now();
    clock_t c1 = clock();
    for (int64_t i = 0; i < tokens; i++) {
        shape[1] = 1;
        XtcTensor lg;
        double a = bench_now();
        for (int c = 0; c < nc; c++)
            if (xtc_session_carry(s, names[c], names[c])) {
                free(tok);
                return die(s, "carry");
            }
        double b = bench_now();
        if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok + prompt + i) || xtc_session_run(s)) {
            free(tok);
            return die(s, "one-token call");
        }
        double c = bench_now();
        if (xtc_session_get_output(s, "logits", &lg)) {
            free(tok);
            return die(s, "one-token logits");
        }
        double d = bench_now();
        t_carry += b - a, t_run += c - b, t_get += d - c;
    }
    double t2 = bench_now();
    double cpu = (double)(clock() - c1) / CLOCKS_PER_SEC;
    if (prof) {
        fprintf(stderr, "decode: per token carry %.3f ms, set+run %.3f ms, logits %.3f ms\n",
                1e3 * t_carry / (double)tokens, 1e3 * t_run / (double)tokens, 1e3 * t_get / (double)tokens);
        xtc_session_print_profile(s, stderr);
    }
    const char *graphs = getenv("XTC_CUDA_GRAPHS");
    printf("{\"mode\": \"decode\", \"module\": \"%s\", \"device\": \"%s\", \"context\": %lld, \"tokens\": %lld, "
           "\"prompt_ms\": %.3f, \"ms_per_token\": %.4f, \"tok_per_s\": %.1f, \"cpu_ms_per_token\": %.4f, \"graphs\": %d}\n",
           path, xtc_session_device(s), (long long)ctx, (long long)tokens, 1e3 * (t1 - t0),
           1e3 * (t2 - t1) / (double)tokens, (double)tokens / (t2 - t1), 1e3 * cpu / (double)tokens,
           graphs && *graphs && strcmp(graphs, "0") != 0);
    free(tok);
    return 0;
}

/* One matmul module: inputs a and b bound once, ITERS timed runs after WARMUP, ITERS profiled. */
static int matmul(const char *path, int iters, int warmup)
{
    XtcModule *m;
    if (xtc_module_load(path, &m)) {
        fprintf(stderr, "gpu_bench: %s\n", xtc_module_error(m));
        xtc_module_free(m);
        return 1;
    }
    XtcSession *s = NULL;
    XtcTensorInfo a, b, c;
    int rc = 1;
    if (xtc_module_tensor(m, XTC_INPUT, xtc_module_find(m, XTC_INPUT, "a"), &a) ||
        xtc_module_tensor(m, XTC_INPUT, xtc_module_find(m, XTC_INPUT, "b"), &b) ||
        xtc_module_tensor(m, XTC_OUTPUT, xtc_module_find(m, XTC_OUTPUT, "c"), &c) || a.rank != 2 || b.rank != 2 ||
        c.rank != 2 || a.shape[0] < 1 || a.shape[1] < 1 || b.shape[0] < 1 || b.shape[1] < 1) {
        fprintf(stderr, "gpu_bench: %s is not c = a b with a, b and c of constant shapes [., .]\n", path);
        goto done;
    }
    int64_t M = c.shape[0], N = c.shape[1], K = a.shape[1];
    XtcSessionOptions so = {.threads = 1};
    if (xtc_session_new(m, &so, &s)) {
        rc = die(s, "session");
        goto done;
    }
    const XtcTensorInfo *in[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        size_t count = (size_t)(in[i]->shape[0] * in[i]->shape[1]);
        float *v = malloc(count * sizeof *v);
        if (!v) {
            fprintf(stderr, "gpu_bench: out of memory\n");
            goto done;
        }
        for (size_t j = 0; j < count; j++)
            v[j] = (float)(bench_next() >> 40) * 0x1p-23f - 1.0f;
        int bad = xtc_session_set_input(s, in[i]->name, XTC_F32, 2, in[i]->shape, v);
        free(v);
        if (bad) {
            rc = die(s, "inputs");
            goto done;
        }
    }
    double *t = calloc((size_t)iters, sizeof *t);
    if (!t)
        goto done;
    for (int it = -warmup; it < iters; it++) {
        double t0 = bench_now();
        if (xtc_session_run(s)) {
            free(t);
            rc = die(s, "run");
            goto done;
        }
        if (it >= 0)
            t[it] = bench_now() - t0;
    }
    double med = bench_median(t, iters), min = t[0], ms[3];
    free(t);
    if (profile(m, s, iters, ms))
        goto done;
    double flop = 2.0 * (double)M * (double)N * (double)K;
    printf("{\"mode\": \"matmul\", \"module\": \"%s\", \"device\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, "
           "\"median_ms\": %.4f, \"min_ms\": %.4f, \"kernels_ms\": %.4f, \"tflops\": %.2f, "
           "\"iters\": %d}\n",
           path, xtc_session_device(s), (long long)M, (long long)K, (long long)N,
           1e3 * med, 1e3 * min, ms[0], ms[0] > 0 ? flop / ms[0] * 1e-9 : 0.0, iters);
    fflush(stdout);
    rc = 0;
done:
    xtc_session_free(s);
    xtc_module_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "matmul")) {
        int iters = atoi(argv[3]), warmup = atoi(argv[4]), rc = 0;
        if (iters < 1 || iters > 1000 || warmup < 0) {
            fprintf(stderr, "gpu_bench: bad ITERS or WARMUP\n");
            return 2;
        }
        for (int a = 2; a < argc; a = a == 2 ? 5 : a + 1)
            rc |= matmul(argv[a], iters, warmup);
        return rc;
    }
    if (argc < 5 || (strcmp(argv[1], "fwd") && strcmp(argv[1], "train") && strcmp(argv[1], "decode"))) {
        fprintf(stderr, "usage: gpu_bench fwd|train MODULE.so ITERS WARMUP BxN...\n"
                        "       gpu_bench decode MODULE.so CONTEXT TOKENS\n"
                        "       gpu_bench matmul MODULE.so ITERS WARMUP [MODULE.so...]\n");
        return 2;
    }
    XtcModule *m;
    if (xtc_module_load(argv[2], &m)) {
        fprintf(stderr, "gpu_bench: %s\n", xtc_module_error(m));
        return 1;
    }
    XtcSession *s;
    XtcSessionOptions so = {.threads = getenv("GPU_BENCH_THREADS") ? atoi(getenv("GPU_BENCH_THREADS")) : XTC_THREADS_AUTO};
    if (xtc_session_new(m, &so, &s))
        return die(s, "session");
    int rc = xtc_session_init_weights(s, 1) ? die(s, "weights") : 0;
    if (!rc && !strcmp(argv[1], "decode")) {
        rc = decode(argv[2], m, s, atoll(argv[3]), atoll(argv[4]));
    } else if (!rc) {
        int iters = atoi(argv[3]), warmup = atoi(argv[4]);
        if (iters < 1 || iters > 1000 || warmup < 0 || argc < 6) {
            fprintf(stderr, "gpu_bench: bad ITERS, WARMUP or no BxN\n");
            rc = 2;
        }
        for (int a = 5; a < argc && !rc; a++) {
            long long B = 0, N = 0;
            if (sscanf(argv[a], "%lldx%lld", &B, &N) != 2 || B < 1 || N < 1) {
                fprintf(stderr, "gpu_bench: '%s' is not BxN\n", argv[a]);
                rc = 2;
            } else {
                rc = timed(argv[1], argv[2], m, s, iters, warmup, B, N);
            }
        }
    }
    xtc_session_free(s);
    xtc_module_free(m);
    return rc;
}
