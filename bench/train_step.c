/* train_step.c: times one training step (forward + backward: xtc_session_run of a training
 * module; AdamW: xtc_session_step) through the public API only, the xtc half of
 * bench/train_bench.sh. Built by that script against include/xtc.h and libxtc_rt.a.
 *
 *   train_step MODULE.so BATCH SEQ THREADS [ITERS] [WARMUP]
 *
 * Prints one JSON line: median (and min) seconds of the whole step and of its two halves,
 * tokens/s. Like ../shared/bench/torch_gpt.py, each iteration records the CPU time other
 * processes took meanwhile ("foreign", a fraction of all cores); the median is over the clean
 * iterations (foreign < 10%) when there are at least 3, else over all. */
#include "bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xtc.h"

/* busy ticks of the whole machine; ticks of this process (all threads) */
static void ticks(long long *busy, long long *self)
{
    long long v[10] = {0}, total = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4],
                   &v[5], &v[6], &v[7], &v[8], &v[9]) < 5)
            memset(v, 0, sizeof v);
        fclose(f);
    }
    for (int i = 0; i < 10; i++)
        total += v[i];
    *busy = total - v[3] - v[4];
    *self = 0;
    f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[2048];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        char *p = strrchr(buf, ')');
        long long ut = 0, st = 0;
        /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
        if (p && sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) == 2)
            *self = ut + st;
    }
}

static int die(XtcSession *s, const char *what)
{
    fprintf(stderr, "train_step: %s: %s\n", what, xtc_session_error(s));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: train_step MODULE.so BATCH SEQ THREADS [ITERS] [WARMUP]\n");
        return 2;
    }
    int64_t B = atoll(argv[2]), N = atoll(argv[3]);
    int threads = atoi(argv[4]), iters = argc > 5 ? atoi(argv[5]) : 10, warmup = argc > 6 ? atoi(argv[6]) : 2;
    if (B < 1 || N < 1 || threads < 1 || iters < 1 || iters > 1000 || warmup < 0) {
        fprintf(stderr, "train_step: bad arguments\n");
        return 2;
    }
    XtcModule *m;
    if (xtc_module_load(argv[1], &m)) {
        fprintf(stderr, "train_step: %s\n", xtc_module_error(m));
        return 1;
    }
    XtcSession *s;
    XtcSessionOptions so = {.threads = threads};
    if (xtc_session_new(m, &so, &s))
        return die(s, "session");
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo t;
            xtc_module_tensor(m, (XtcKind)kind, i, &t);
            int64_t n = 1;
            for (int d = 0; d < t.rank; d++)
                n *= t.shape[d];
            float *w = malloc((size_t)n * sizeof *w);
            for (int64_t k = 0; k < n; k++)
                w[k] = (float)((double)(bench_next() >> 11) * 0x1.0p-53 - 0.5) * 0.04f;
            if (xtc_session_set_weight(s, t.name, t.rank, t.shape, w))
                return die(s, t.name);
            free(w);
        }
    XtcTensorInfo lg;
    xtc_module_tensor(m, XTC_OUTPUT, xtc_module_find(m, XTC_OUTPUT, "logits"), &lg);
    int64_t V = lg.shape[lg.rank - 1], shape[2] = {B, N};
    int64_t *tok = malloc((size_t)(B * N) * sizeof *tok), *tgt = malloc((size_t)(B * N) * sizeof *tgt);
    for (int64_t i = 0; i < B * N; i++) {
        tok[i] = (int64_t)(bench_next() % (uint64_t)V);
        tgt[i] = (int64_t)(bench_next() % (uint64_t)V);
    }
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) ||
        xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt))
        return die(s, "inputs");
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 1e-4f;
    double *all = calloc((size_t)iters, sizeof *all), *fb = calloc((size_t)iters, sizeof *fb),
           *st = calloc((size_t)iters, sizeof *st), *clean = calloc((size_t)iters, sizeof *clean);
    double *cfb = calloc((size_t)iters, sizeof *cfb), *cst = calloc((size_t)iters, sizeof *cst);
    int nclean = 0;
    double foreign_max = 0, hz = (double)sysconf(_SC_CLK_TCK), ncpu = (double)sysconf(_SC_NPROCESSORS_ONLN);
    for (int it = -warmup; it < iters; it++) {
        long long b0, s0, b1, s1;
        ticks(&b0, &s0);
        double t0 = bench_now();
        if (xtc_session_run(s))
            return die(s, "run");
        double t1 = bench_now();
        if (xtc_session_step(s, &opt))
            return die(s, "step");
        double t2 = bench_now();
        ticks(&b1, &s1);
        if (it < 0)
            continue;
        double foreign = ((double)(b1 - b0) - (double)(s1 - s0)) / hz / ((t2 - t0) * ncpu);
        if (foreign < 0)
            foreign = 0;
        if (foreign > foreign_max)
            foreign_max = foreign;
        all[it] = t2 - t0;
        fb[it] = t1 - t0;
        st[it] = t2 - t1;
        if (foreign < 0.10) {
            clean[nclean] = all[it];
            cfb[nclean] = fb[it];
            cst[nclean++] = st[it];
        }
    }
    double min = all[0];
    for (int i = 1; i < iters; i++)
        min = all[i] < min ? all[i] : min;
    int use_clean = nclean >= 3;
    double med = use_clean ? bench_median(clean, nclean) : bench_median(all, iters);
    double med_fb = use_clean ? bench_median(cfb, nclean) : bench_median(fb, iters);
    double med_st = use_clean ? bench_median(cst, nclean) : bench_median(st, iters);
    double med_all = bench_median(all, iters);
    printf("{\"module\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"threads\": %d, \"params\": %lld, "
           "\"median_s\": %.6f, \"min_s\": %.6f, \"median_all_s\": %.6f, \"fwdbwd_median_s\": %.6f, "
           "\"adamw_median_s\": %.6f, \"iters\": %d, \"clean_iters\": %d, \"foreign_cpu_max\": %.3f, "
           "\"tok_per_s\": %.1f}\n",
           argv[1], (long long)B, (long long)N, threads, (long long)xtc_module_param_count(m), med, min, med_all,
           med_fb, med_st, iters, nclean, foreign_max, (double)(B * N) / med);
    free(all);
    free(fb);
    free(st);
    free(clean);
    free(cfb);
    free(cst);
    free(tok);
    free(tgt);
    xtc_session_free(s);
    xtc_module_free(m);
    return 0;
}
