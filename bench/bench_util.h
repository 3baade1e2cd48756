/* bench_util.h: what the programs of bench/ (gpu_bench.c, gpu_check.c, nccl_check.c,
 * train_step.c) share: a monotonic clock, the median of timings, the xorshift stream their tokens
 * and targets come from, and binding a --kv-cache module's caches empty before a prompt. Header
 * only (static functions), so that each program stays one `cc bench/X.c libxtc_rt.a` away on a
 * machine without the build; public API (include/xtc.h) only. Include it before any other header. */
#ifndef XTC_BENCH_UTIL_H
#define XTC_BENCH_UTIL_H

/* clock_gettime under -std=c11 (the scripts' cc line): included first, before any system header */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xtc.h"

/* seconds on the monotonic clock */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median of v[0..n) (n >= 1; v is sorted in place): the middle value, or the mean of the two
 * middle ones */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* xorshift64: the programs' one random stream (gpu_check seeds it from its SEED argument) */
#define BENCH_RNG_START 88172645463325252ull
static uint64_t bench_rng = BENCH_RNG_START;

static inline uint64_t bench_next(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return bench_rng;
}

/* A --kv-cache module's caches (its rank-4 inputs cache.*) bound empty ([1, 0, heads, dim_head])
 * for a prompt; their names into names[0..max). Returns how many (0: not a --kv-cache module),
 * or -1 when binding one failed (*failed names it; xtc_session_error says why). */
static inline int bench_empty_caches(XtcSession *s, const XtcModule *m, const char **names, int max,
                                     const char **failed)
{
    int nc = 0;
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT) && nc < max; i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_INPUT, i, &t);
        if (!strncmp(t.name, "cache.", 6) && t.rank == 4) {
            int64_t cs[4] = {1, 0, t.shape[2], t.shape[3]};
            float dummy = 0;
            names[nc++] = t.name;
            if (xtc_session_set_input(s, t.name, XTC_F32, 4, cs, &dummy)) {
                *failed = t.name;
                return -1;
            }
        }
    }
    return nc;
}

#endif
