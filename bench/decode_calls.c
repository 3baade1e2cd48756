/* decode_calls.c: the CUDA driver calls of one-token decoding, per token, by kind, and the host's
 * time inside them and outside (runtime/rt_cuda_calls.c counts them: XTC_CUDA_CALLS is set here).
 * It reaches the runtime's internals, so it is built from the sources or the static library:
 *
 *   built as build/decode_calls; elsewhere (e.g. beside a GPU kit):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Iinclude/abi -Iruntime -Ibench bench/decode_calls.c \
 *      build/libxtc_rt.a -lm -ldl -lpthread -o decode_calls
 *   decode_calls MODULE.so PROMPT TOKENS     (a --kv-cache module, --target cuda or cuda-emu)
 *
 * A prompt of PROMPT tokens, then TOKENS one-token calls, each carrying the caches, setting the
 * token, running and reading the logits as gpu_bench decode does; the first 3 calls are left out
 * of the figures. On the emulator "launch" is the kernels' CPU time. */
#include "bench_util.h"
#include "rt_cuda.h"
#include "xtc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: decode_calls MODULE.so PROMPT TOKENS\n");
        return 2;
    }
    setenv("XTC_CUDA_CALLS", "1", 0);
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    if (xtc_module_load(argv[1], &m)) {
        fprintf(stderr, "decode_calls: %s\n", xtc_module_error(m));
        return 1;
    }
    int prompt = atoi(argv[2]), tokens = atoi(argv[3]);
    if (prompt < 1 || tokens < 4 || xtc_session_new(m, &(XtcSessionOptions){.threads = 1}, &s) ||
        xtc_session_init_weights(s, 1)) {
        fprintf(stderr, "decode_calls: %s\n", s ? xtc_session_error(s) : "PROMPT >= 1 and TOKENS >= 4");
        return 1;
    }
    const char *names[256], *failed = NULL;
    int nc = bench_empty_caches(s, m, names, 256, &failed);
    int64_t *tok = calloc((size_t)(prompt + tokens), sizeof *tok), sh[2] = {1, prompt};
    for (int i = 0; tok && i < prompt + tokens; i++)
        tok[i] = i % 7;
    if (nc <= 0 || !tok || xtc_session_set_input(s, "tokens", XTC_I64, 2, sh, tok) || xtc_session_run(s)) {
        fprintf(stderr, "decode_calls: not a --kv-cache module, or %s\n", xtc_session_error(s));
        return 1;
    }
    uint64_t total[RT_CU_NCALLS] = {0}, most[RT_CU_NCALLS] = {0};
    double host[RT_CU_NCALLS] = {0}, wall = 0;
    for (int i = 0; i < tokens; i++) {
        RtCuCalls a, b;
        rt_cu_calls(&a);
        double t0 = now();
        int bad = 0;
        for (int c = 0; c < nc && !bad; c++)
            bad = xtc_session_carry(s, names[c], names[c]);
        sh[1] = 1;
        XtcTensor lg;
        if (bad || xtc_session_set_input(s, "tokens", XTC_I64, 2, sh, tok + prompt + i) || xtc_session_run(s) ||
            xtc_session_get_output(s, "logits", &lg)) {
            fprintf(stderr, "decode_calls: %s\n", xtc_session_error(s));
            return 1;
        }
        double t1 = now();
        rt_cu_calls(&b);
        if (i < 3)
            continue;
        wall += t1 - t0;
        for (int k = 0; k < RT_CU_NCALLS; k++) {
            uint64_t d = b.calls[k] - a.calls[k];
            total[k] += d;
            most[k] = d > most[k] ? d : most[k];
            host[k] += b.host_s[k] - a.host_s[k];
        }
    }
    int n = tokens - 3;
    printf("%s on %s: %d one-token calls (prompt %d): per token, calls (mean, most) and host ms inside\n", argv[1],
           xtc_session_device(s), n, prompt);
    double inside = 0;
    for (int k = 0; k < RT_CU_NCALLS; k++) {
        inside += host[k];
        if (total[k])
            printf("  %-9s %8.2f %5llu  %.4f\n", rt_cu_call_names[k], (double)total[k] / n,
                   (unsigned long long)most[k], 1e3 * host[k] / n);
    }
    printf("wall %.4f ms a token, %.4f ms of it outside driver calls\n", 1e3 * wall / n, 1e3 * (wall - inside) / n);
    free(tok);
    xtc_session_free(s);
    xtc_module_free(m);
    return 0;
}
