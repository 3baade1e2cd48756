/* predict.c: the smallest complete user of xtc's runtime API (include/xtc.h).
 *
 *   xtc compile models/gpt.xtf -o gpt.so
 *   xtc init gpt.so -o gpt.safetensors            # or a state_dict saved from x-transformers
 *   ./predict gpt.so gpt.safetensors "Hello"
 *
 * Loads a compiled module and its weights, runs one batch (the bytes of the text as token
 * ids), and prints the most likely next token after every position. Links against the runtime
 * only (libc, libm, libdl, pthreads): no LLVM, no compiler. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s model.so weights.safetensors TEXT\n", argv[0]);
        return 2;
    }
    const char *text = argv[3];
    int64_t n = (int64_t)strlen(text);
    if (n == 0) {
        fprintf(stderr, "predict: empty text\n");
        return 2;
    }

    XtcModule *mod = NULL;
    XtcSession *sess = NULL;
    int64_t *tokens = malloc((size_t)n * sizeof *tokens);
    int rc = 1;
    if (!tokens)
        return 1;
    if (xtc_module_load(argv[1], &mod) != XTC_OK) {
        fprintf(stderr, "predict: %s\n", mod ? xtc_module_error(mod) : "out of memory");
        goto done;
    }
    XtcSessionOptions opts = {.threads = 2};
    if (xtc_session_new(mod, &opts, &sess) != XTC_OK ||
        xtc_session_load_weights(sess, argv[2]) != XTC_OK) {
        fprintf(stderr, "predict: %s\n", sess ? xtc_session_error(sess) : "out of memory");
        goto done;
    }

    /* one batch of one sequence: tokens i64 [1, n] */
    for (int64_t i = 0; i < n; i++)
        tokens[i] = (unsigned char)text[i];
    int64_t shape[2] = {1, n};
    XtcTensor logits;
    if (xtc_session_set_input(sess, "tokens", XTC_I64, 2, shape, tokens) != XTC_OK ||
        xtc_session_run(sess) != XTC_OK || xtc_session_get_output(sess, "logits", &logits) != XTC_OK) {
        fprintf(stderr, "predict: %s\n", xtc_session_error(sess));
        goto done;
    }

    /* logits f32 [1, n, vocab]: the arg-max after each position */
    int64_t vocab = logits.shape[2];
    const float *z = logits.data;
    printf("position  token  predicted next\n");
    for (int64_t t = 0; t < n; t++) {
        const float *row = z + t * vocab;
        int64_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (row[v] > row[best])
                best = v;
        printf("%8lld  %5lld  %lld\n", (long long)t, (long long)tokens[t], (long long)best);
    }
    rc = 0;
done:
    xtc_session_free(sess);
    xtc_module_free(mod);
    free(tokens);
    return rc;
}
