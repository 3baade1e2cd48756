/* train_loop.c: training a model from C with xtc's runtime API (include/xtc.h): fresh weights,
 * AdamW steps on a small text, the loss falling as it goes, a checkpoint at the end.
 *
 *   xtc compile --train models/tiny_gpt.xtf -o tiny_train.so    # share/xtc/models once installed
 *   cc train_loop.c $(pkg-config --cflags --libs xtc) -o train_loop
 *   ./train_loop tiny_train.so tiny.safetensors [steps]
 *
 * The model is a byte-level language model (token ids are byte values, as tiny_gpt's 256): every
 * step trains on BATCH windows of SEQ bytes of the text below, starting at random places, each
 * byte predicting the next. The checkpoint holds the weights and the optimizer state; it loads
 * as weights too (xtc_session_load_weights), e.g. into the forward module for predict.c or
 * kv_decode.c. Exits 1 on an error, or when the loss of the last steps is not below the first's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc.h"

#define BATCH 4
#define SEQ 32

static const char corpus[] =
    "the cat sat on the mat. the dog sat on the log. the cat saw the dog and the dog saw the cat. "
    "a cat and a dog sat on a mat and a log. the mat was red and the log was brown. ";

/* a small generator of window starts (xorshift64), seeded: the same run every time */
static uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s train_module.so checkpoint.safetensors [steps]\n", argv[0]);
        return 2;
    }
    int steps = argc == 4 ? atoi(argv[3]) : 40;
    if (steps < 2) {
        fprintf(stderr, "train_loop: steps must be at least 2\n");
        return 2;
    }
    XtcModule *mod = NULL;
    XtcSession *s = NULL;
    float *losses = malloc((size_t)steps * sizeof *losses);
    int rc = 1;
    if (!losses)
        return 1;
    if (xtc_module_load(argv[1], &mod) != XTC_OK) {
        fprintf(stderr, "train_loop: %s\n", mod ? xtc_module_error(mod) : "out of memory");
        goto done;
    }
    if (xtc_module_find(mod, XTC_OUTPUT, "loss") < 0 || xtc_module_find(mod, XTC_INPUT, "targets") < 0) {
        fprintf(stderr, "train_loop: %s is not a training module (compile it with xtc compile --train)\n", argv[1]);
        goto done;
    }
    /* models with dropout take its seed as an input */
    int has_dropout = xtc_module_find(mod, XTC_INPUT, "dropout_seed") >= 0;
    XtcSessionOptions so = {.threads = 2};
    if (xtc_session_new(mod, &so, &s) != XTC_OK || xtc_session_init_weights(s, 1) != XTC_OK) {
        fprintf(stderr, "train_loop: %s\n", s ? xtc_session_error(s) : "out of memory");
        goto done;
    }
    printf("%s: %lld parameters, %d steps of %d x %d bytes\n", xtc_module_name(mod),
           (long long)xtc_module_param_count(mod), steps, BATCH, SEQ);

    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 3e-3f;
    opt.max_grad_norm = 1.0f;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    const int64_t len = (int64_t)sizeof corpus - 1;
    int64_t tokens[BATCH][SEQ], targets[BATCH][SEQ];
    const int64_t shape[2] = {BATCH, SEQ};
    for (int step = 0; step < steps; step++) {
        /* tokens, targets: i64 [BATCH, SEQ], targets[b][t] = tokens[b][t + 1] */
        for (int b = 0; b < BATCH; b++) {
            int64_t start = (int64_t)(next_random(&rng) % (uint64_t)(len - SEQ));
            for (int t = 0; t < SEQ; t++) {
                tokens[b][t] = (unsigned char)corpus[start + t];
                targets[b][t] = (unsigned char)corpus[start + t + 1];
            }
        }
        int64_t seed = step;
        XtcTensor loss;
        if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens) != XTC_OK ||
            xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets) != XTC_OK ||
            (has_dropout && xtc_session_set_input(s, "dropout_seed", XTC_I64, 0, NULL, &seed) != XTC_OK) ||
            xtc_session_run(s) != XTC_OK || xtc_session_get_output(s, "loss", &loss) != XTC_OK ||
            xtc_session_step(s, &opt) != XTC_OK) {
            fprintf(stderr, "train_loop: step %d: %s\n", step, xtc_session_error(s));
            goto done;
        }
        losses[step] = *(const float *)loss.data; /* f32 [], the mean cross-entropy */
        if (step % 5 == 0 || step == steps - 1)
            printf("step %3d  loss %.4f  grad norm %.3f\n", step, losses[step], xtc_session_grad_norm(s));
    }

    /* the mean of the last (up to) five steps against the first */
    int last = steps < 5 ? steps - 1 : 5;
    double tail = 0;
    for (int i = steps - last; i < steps; i++)
        tail += losses[i] / last;
    printf("loss %.4f -> %.4f\n", losses[0], tail);
    if (!(tail < losses[0])) {
        fprintf(stderr, "train_loop: the loss did not go down\n");
        goto done;
    }

    /* metadata of the caller's own: what wrote the file */
    const char *keys[] = {"example"}, *values[] = {"train_loop"};
    if (xtc_session_save_checkpoint(s, argv[2], keys, values, 1) != XTC_OK) {
        fprintf(stderr, "train_loop: %s\n", xtc_session_error(s));
        goto done;
    }
    printf("checkpoint %s (step %lld)\n", argv[2], (long long)xtc_session_step_count(s));
    rc = 0;
done:
    xtc_session_free(s);
    xtc_module_free(mod);
    free(losses);
    return rc;
}
