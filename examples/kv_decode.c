/* kv_decode.c: greedy decoding with a KV cache through xtc's runtime API (include/xtc.h), checked
 * against recomputing the whole sequence.
 *
 *   xtc compile --kv-cache models/tiny_gpt.xtf -o tiny_kv.so      # the decoding form
 *   xtc compile models/tiny_gpt.xtf -o tiny.so                    # the forward form
 *   xtc init tiny.so -o tiny.safetensors                          # or train_loop's checkpoint
 *   cc kv_decode.c $(pkg-config --cflags --libs xtc) -o kv_decode
 *   ./kv_decode tiny_kv.so tiny.safetensors "the cat" 24 tiny.so
 *
 * The decoding module takes tokens [1, n] and the keys and values of the positions so far,
 * cache.<layer>.k/.v [1, c, heads, dim_head], and returns the logits of the n new positions and
 * the caches grown to c + n. The prompt (the bytes of the text) goes in first with empty caches
 * (c = 0); then each call feeds the one token chosen last (the arg-max of the logits) and the
 * caches of the call before, handed over by xtc_session_carry without a copy. With the forward
 * module given last, the whole sequence is then run through it once: at every position its
 * arg-max must be the token the cached decoding chose (exit status 1 otherwise), and the largest
 * difference between the two logits is printed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc.h"

#define MAX_CACHE 256 /* cache inputs: 2 per layer */

typedef struct {
    XtcModule *mod;
    XtcSession *s;
} Model;

static int open_model(Model *m, const char *module_path, const char *weights_path)
{
    if (xtc_module_load(module_path, &m->mod) != XTC_OK) {
        fprintf(stderr, "kv_decode: %s\n", m->mod ? xtc_module_error(m->mod) : "out of memory");
        return -1;
    }
    XtcSessionOptions opts = {.threads = 2};
    if (xtc_session_new(m->mod, &opts, &m->s) != XTC_OK || xtc_session_load_weights(m->s, weights_path) != XTC_OK) {
        fprintf(stderr, "kv_decode: %s\n", m->s ? xtc_session_error(m->s) : "out of memory");
        return -1;
    }
    return 0;
}

static int64_t argmax(const float *row, int64_t n)
{
    int64_t best = 0;
    for (int64_t v = 1; v < n; v++)
        if (row[v] > row[best])
            best = v;
    return best;
}

/* the bound of the module's symbol `name` (its max_seq_len for "n"), 0 when unbounded */
static int64_t symbol_max(const XtcModule *m, const char *name)
{
    for (int i = 0; i < xtc_module_num_symbols(m); i++) {
        const char *s;
        int64_t max;
        if (xtc_module_symbol(m, i, &s, &max) == XTC_OK && !strcmp(s, name))
            return max;
    }
    return 0;
}

/* The caches the last call returned become the next call's inputs (from the second carry on without
 * a copy: the session appends the new rows in place) */
static int carry_caches(XtcSession *s, const char *const *cache, int n)
{
    for (int c = 0; c < n; c++)
        if (xtc_session_carry(s, cache[c], cache[c]) != XTC_OK)
            return -1;
    return 0;
}

static void print_bytes(const int64_t *tok, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= 32 && tok[i] < 127)
            putchar((int)tok[i]);
        else
            printf("\\x%02x", (unsigned)tok[i] & 0xff);
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s kv_module.so weights.safetensors PROMPT TOKENS [forward_module.so]\n", argv[0]);
        return 2;
    }
    const char *prompt = argv[3];
    int64_t plen = (int64_t)strlen(prompt), want = atoll(argv[4]);
    if (plen == 0 || want < 1) {
        fprintf(stderr, "kv_decode: the prompt must not be empty and TOKENS must be at least 1\n");
        return 2;
    }
    Model kv = {0}, full = {0};
    int64_t *seq = NULL;
    float *cached_logits = NULL;
    int rc = 1;
    if (open_model(&kv, argv[1], argv[2]) != 0)
        goto done;

    /* the cache inputs: cache.<l>.k and .v, f32 [b, c, heads, dim_head] */
    const char *cache[MAX_CACHE];
    int64_t cache_shape[MAX_CACHE][4];
    int ncache = 0;
    for (int i = 0; i < xtc_module_count(kv.mod, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(kv.mod, XTC_INPUT, i, &t);
        if (!strncmp(t.name, "cache.", 6) && t.rank == 4 && ncache < MAX_CACHE) {
            cache[ncache] = t.name;
            memcpy(cache_shape[ncache], (int64_t[4]){1, 0, t.shape[2], t.shape[3]}, sizeof cache_shape[0]);
            ncache++;
        }
    }
    if (ncache == 0) {
        fprintf(stderr, "kv_decode: %s has no cache inputs (compile it with xtc compile --kv-cache)\n", argv[1]);
        goto done;
    }
    /* prompt and new tokens together within the model's positions */
    int64_t maxlen = symbol_max(kv.mod, "n");
    if (maxlen > 0 && plen + want > maxlen) {
        want = maxlen - plen;
        if (want < 1) {
            fprintf(stderr, "kv_decode: the prompt is longer than the model's %lld positions\n", (long long)maxlen);
            goto done;
        }
    }
    seq = malloc((size_t)(plen + want) * sizeof *seq);
    if (!seq)
        goto done;
    for (int64_t i = 0; i < plen; i++)
        seq[i] = (unsigned char)prompt[i];

    /* empty caches [1, 0, heads, dim_head] for the prompt's call (no element: any pointer) */
    static const float none;
    for (int c = 0; c < ncache; c++)
        if (xtc_session_set_input(kv.s, cache[c], XTC_F32, 4, cache_shape[c], &none) != XTC_OK) {
            fprintf(stderr, "kv_decode: %s\n", xtc_session_error(kv.s));
            goto done;
        }
    int64_t len = plen, vocab = 0;
    for (int64_t k = 0; k < want; k++) {
        /* the prompt first, then the last token chosen: tokens i64 [1, n] */
        int64_t from = k == 0 ? 0 : len - 1, shape[2] = {1, len - from};
        XtcTensor logits;
        if ((k > 0 && carry_caches(kv.s, cache, ncache) != 0) ||
            xtc_session_set_input(kv.s, "tokens", XTC_I64, 2, shape, seq + from) != XTC_OK ||
            xtc_session_run(kv.s) != XTC_OK || xtc_session_get_output(kv.s, "logits", &logits) != XTC_OK) {
            fprintf(stderr, "kv_decode: token %lld: %s\n", (long long)k, xtc_session_error(kv.s));
            goto done;
        }
        /* logits f32 [1, n, vocab]: the last position's arg-max is the next token */
        vocab = logits.shape[2];
        if (!cached_logits && !(cached_logits = malloc((size_t)(want * vocab) * sizeof *cached_logits)))
            goto done;
        const float *last = (const float *)logits.data + (shape[1] - 1) * vocab;
        memcpy(cached_logits + k * vocab, last, (size_t)vocab * sizeof *last);
        seq[len++] = argmax(last, vocab);
    }
    printf("prompt \"");
    print_bytes(seq, plen);
    printf("\", %lld tokens with the KV cache: \"", (long long)want);
    print_bytes(seq + plen, want);
    printf("\"\n");

    if (argc == 6) {
        /* the reference: the whole sequence but its last token in one call of the forward module;
         * position plen - 1 + k predicts token k of the decoding */
        if (open_model(&full, argv[5], argv[2]) != 0)
            goto done;
        int64_t shape[2] = {1, len - 1};
        XtcTensor logits;
        if (xtc_session_set_input(full.s, "tokens", XTC_I64, 2, shape, seq) != XTC_OK ||
            xtc_session_run(full.s) != XTC_OK || xtc_session_get_output(full.s, "logits", &logits) != XTC_OK) {
            fprintf(stderr, "kv_decode: recomputing: %s\n", xtc_session_error(full.s));
            goto done;
        }
        double worst = 0;
        int64_t mismatches = 0;
        for (int64_t k = 0; k < want; k++) {
            const float *row = (const float *)logits.data + (plen - 1 + k) * vocab;
            for (int64_t v = 0; v < vocab; v++) {
                double d = (double)row[v] - cached_logits[k * vocab + v];
                d = d < 0 ? -d : d;
                worst = d > worst ? d : worst;
            }
            int64_t best = argmax(row, vocab);
            if (best != seq[plen + k]) {
                mismatches++;
                fprintf(stderr, "kv_decode: token %lld: the cached decoding chose %lld, recomputing gives %lld\n",
                        (long long)k, (long long)seq[plen + k], (long long)best);
            }
        }
        printf("recomputed: %lld of %lld tokens the same, largest logit difference %.3g\n",
               (long long)(want - mismatches), (long long)want, worst);
        if (mismatches)
            goto done;
    }
    rc = 0;
done:
    xtc_session_free(kv.s);
    xtc_module_free(kv.mod);
    xtc_session_free(full.s);
    xtc_module_free(full.mod);
    free(seq);
    free(cached_logits);
    return rc;
}
