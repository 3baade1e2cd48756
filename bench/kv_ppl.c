/* kv_ppl.c: the accuracy of KV-cache decoding with caches stored in another dtype (`xtc compile
 * --kv-cache --kv-dtype ...`): perplexity and the largest logit difference of each module
 * against the first, all decoding the same text with the same weights.
 *
 *   kv_ppl WEIGHTS TEXT PROMPT MODULE_F32.so MODULE.so ...
 *
 * TEXT is cut into windows of 129 bytes; each window's first 128 bytes are decoded as `xtc
 * generate` does: PROMPT of them in one call on empty caches, then one byte a call, the caches
 * carried; every position predicts the next byte (128 predictions a window). Prints, per module,
 * the perplexity (exp of the mean negative log-likelihood) and, from the second module on, its
 * change from the first's and the largest |logit - first module's logit|. bench/train_bench.sh
 * --int8 runs it on the demo model; a measurement, not a test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc.h"

#define WIN 128
#define MAX_CACHE 256

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "kv_ppl: %s: %s\n", what, msg);
    return 1;
}

/* Decodes every window with module path; logits (nwin WIN vocab floats) gets each position's. */
static int decode(const char *path, const char *weights, const unsigned char *text, int64_t nwin, int64_t prompt,
                  float **logits, int64_t *vocab, double *nll)
{
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    if (xtc_module_load(path, &m) != XTC_OK)
        return fail(path, m ? xtc_module_error(m) : "out of memory");
    if (xtc_session_new(m, &(XtcSessionOptions){.threads = 1}, &s) != XTC_OK || xtc_session_load_weights(s, weights) != XTC_OK)
        return fail(path, s ? xtc_session_error(s) : "out of memory");
    const char *cache[MAX_CACHE];
    int64_t shape[MAX_CACHE][4];
    int nc = 0;
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_INPUT, i, &t);
        if (!strncmp(t.name, "cache.", 6) && t.rank == 4 && nc < MAX_CACHE) {
            cache[nc] = t.name;
            memcpy(shape[nc++], (int64_t[4]){1, 0, t.shape[2], t.shape[3]}, sizeof shape[0]);
        }
    }
    if (!nc)
        return fail(path, "no cache inputs (xtc compile --kv-cache)");
    *nll = 0;
    for (int64_t w = 0; w < nwin; w++) {
        const unsigned char *win = text + w * (WIN + 1);
        int64_t tok[WIN];
        for (int i = 0; i < WIN; i++)
            tok[i] = win[i];
        static const float none;
        for (int c = 0; c < nc; c++)
            if (xtc_session_set_input(s, cache[c], XTC_F32, 4, shape[c], &none) != XTC_OK)
                return fail(path, xtc_session_error(s));
        for (int64_t pos = 0; pos < WIN;) {
            int64_t n = pos == 0 ? prompt : 1;
            XtcTensor lg;
            if (xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, n}, tok + pos) != XTC_OK ||
                xtc_session_run(s) != XTC_OK || xtc_session_get_output(s, "logits", &lg) != XTC_OK)
                return fail(path, xtc_session_error(s));
            int64_t V = lg.shape[2];
            if (!*logits) {
                *vocab = V;
                if (!(*logits = malloc((size_t)(nwin * WIN * V) * sizeof **logits)))
                    return fail(path, "out of memory");
            }
            for (int64_t t = 0; t < n; t++) {
                const float *row = (const float *)lg.data + t * V;
                memcpy(*logits + ((w * WIN) + pos + t) * V, row, (size_t)V * sizeof *row);
                double mx = row[0], sum = 0;
                for (int64_t v = 1; v < V; v++)
                    mx = row[v] > mx ? row[v] : mx;
                for (int64_t v = 0; v < V; v++)
                    sum += exp(row[v] - mx);
                *nll += mx + log(sum) - row[win[pos + t + 1]];
            }
            for (int c = 0; c < nc; c++)
                if (xtc_session_carry(s, cache[c], cache[c]) != XTC_OK)
                    return fail(path, xtc_session_error(s));
            pos += n;
        }
    }
    xtc_session_free(s);
    xtc_module_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s WEIGHTS TEXT PROMPT MODULE.so [MODULE.so ...]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f)
        return fail(argv[2], "cannot open");
    static unsigned char text[1 << 22];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    int64_t nwin = (int64_t)len / (WIN + 1), prompt = atoll(argv[3]);
    if (nwin < 1 || prompt < 1 || prompt > WIN)
        return fail(argv[2], "no whole window of 129 bytes, or PROMPT outside [1, 128]");
    float *first = NULL;
    double nll0 = 0;
    int64_t V = 0;
    printf("%lld windows of %d bytes (%lld predictions), a prompt of %lld then one byte a call\n", (long long)nwin, WIN,
           (long long)(nwin * WIN), (long long)prompt);
    for (int i = 4; i < argc; i++) {
        float *lg = NULL;
        double nll;
        if (decode(argv[i], argv[1], text, nwin, prompt, &lg, &V, &nll))
            return 1;
        double ppl = exp(nll / (double)(nwin * WIN));
        if (!first) {
            first = lg, nll0 = nll;
            printf("  %-40s perplexity %.4f\n", argv[i], ppl);
            continue;
        }
        double worst = 0, big = 0;
        for (int64_t k = 0; k < nwin * WIN * V; k++) {
            worst = fmax(worst, fabs((double)lg[k] - first[k]));
            big = fmax(big, fabs((double)first[k]));
        }
        printf("  %-40s perplexity %.4f (%+.3f %% of the first), max |logit - first| %.4f (logits up to %.1f)\n", argv[i],
               ppl, 100 * (exp((nll - nll0) / (double)(nwin * WIN)) - 1), worst, big);
        free(lg);
    }
    free(first);
    return 0;
}
