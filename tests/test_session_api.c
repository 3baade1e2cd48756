/* test_session_api.c: the session API's contract beyond running models (include/xtc.h): a failed
 * constructor's object can be freed; the error text describes the last call that failed until a
 * call succeeds; a step uses a run's gradients once; a training module gives its logits without
 * targets (the loss and gradients withheld); token ids and targets (tokens, tgt, targets) are
 * checked against their tables when bound, naming the input, the value and its position; a call
 * with no output elements computes nothing, and one whose loops are absurdly long is refused;
 * xtc_session_init_weights sets every weight to the values the initialisation rules write to a
 * file for the same seed (what xtc init writes), and a run may follow it.
 * The modules are tiny_train.h's decoder (training form, and the
 * forward form) and a tiny XTransformer. */
#include "harness.h"
#include "harness_drive.h"
#include "tiny_train.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define B 2
#define N 5

static char train_path[300], fwd_path[300], weights_path[300], encdec_path[300];

static const char tiny_encdec_src[] =
    "ed = XTransformer(dim = 16, enc_num_tokens = 37, enc_depth = 1, enc_heads = 2, enc_max_seq_len = 8,\n"
    "    dec_num_tokens = 37, dec_depth = 1, dec_heads = 2, dec_max_seq_len = 8)\n";

/* compiles src at path: a training module, or (train 0) the forward form */
static void compile_form(const char *src, const char *path, int train)
{
    if (train) {
        tiny_compile(src, path, "cpu");
        return;
    }
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", src, strlen(src), &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    char err[1024];
    DrvJob job = {.file = f, .diag = &d, .cg = {.output = path, .opt_level = 1, .source_name = "tiny.xtf"}};
    ck_assert_msg(drv_run(&job, harness_target("cpu"), NULL, NULL, err, sizeof err) == 0, "compiling %s: %s %s", path,
                  err, d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
}

static void setup(void)
{
    snprintf(train_path, sizeof train_path, "%s/tiny_train.so", tmpdir);
    snprintf(fwd_path, sizeof fwd_path, "%s/tiny.so", tmpdir);
    snprintf(weights_path, sizeof weights_path, "%s/tiny.safetensors", tmpdir);
    snprintf(encdec_path, sizeof encdec_path, "%s/encdec_train.so", tmpdir);
    compile_form(tiny_gpt_src, train_path, 1);
    compile_form(tiny_gpt_src, fwd_path, 0);
    compile_form(tiny_encdec_src, encdec_path, 1);
    tiny_write_weights(train_path, weights_path, 7);
}

static XtcSession *open_session(const char *path, XtcModule **m)
{
    ck_assert_msg(xtc_module_load(path, m) == XTC_OK, "%s", xtc_module_error(*m));
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(*m, NULL, &s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_load_weights(s, weights_path) == XTC_OK, "%s", xtc_session_error(s));
    return s;
}

#define ERR_HAS(s, text) ck_assert_msg(strstr(xtc_session_error(s), text), "'%s' not in: %s", text, xtc_session_error(s))

/* the object a failed xtc_session_new hands back is freed like any other */
START_TEST(test_free_failed_session)
{
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(NULL, NULL, &s), XTC_ERR_ARG);
    ck_assert_ptr_nonnull(s);
    ERR_HAS(s, "no loaded module");
    xtc_session_free(s);
    char path[400];
    XtcModule *bad = NULL;
    snprintf(path, sizeof path, "%s/none.so", tmpdir);
    ck_assert_int_eq(xtc_module_load(path, &bad), XTC_ERR_IO);
    ck_assert_int_eq(xtc_session_new(bad, NULL, &s), XTC_ERR_ARG);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_STATE); /* unusable, but answers */
    xtc_session_free(s);
    xtc_module_free(bad);
    XtcModule *m = NULL;
    ck_assert_int_eq(xtc_module_load(fwd_path, &m), XTC_OK);
    ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = -5}, &s), XTC_ERR_ARG);
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* the error describes the last failed call until one succeeds; a second step without a
 * run is a state error; a training module's logits without targets */
START_TEST(test_error_cleared_and_steps)
{
    XtcModule *m;
    XtcSession *s = open_session(train_path, &m);
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 3);
    ck_assert_int_eq(xtc_session_set_input(s, "tokenz", XTC_I64, 2, shape, tokens), XTC_ERR_NAME);
    ERR_HAS(s, "tokenz");
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens), XTC_OK);
    ck_assert_str_eq(xtc_session_error(s), "");
    XtcTensor t;
    ck_assert_int_eq(xtc_session_get_weight(s, "nope", &t), XTC_ERR_NAME);
    ck_assert_int_eq(xtc_session_get_weight(s, "token_emb.weight", &t), XTC_OK);
    ck_assert_str_eq(xtc_session_error(s), "");

    /* no targets: the logits, not the loss nor the gradients; no step */
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_get_output(s, "logits", &t), XTC_OK);
    ck_assert_int_eq(t.shape[2], TINY_VOCAB);
    float *free_logits = malloc((size_t)tiny_numel(&t) * sizeof(float));
    memcpy(free_logits, t.data, (size_t)tiny_numel(&t) * sizeof(float));
    ck_assert_int_eq(xtc_session_get_output(s, "loss", &t), XTC_ERR_STATE);
    ERR_HAS(s, "input 'targets' not set");
    ck_assert_int_eq(xtc_session_get_output(s, "grad.token_emb.weight", &t), XTC_ERR_STATE);
    XtcAdamW opt = xtc_adamw_defaults();
    ck_assert_int_eq(xtc_session_step(s, &opt), XTC_ERR_STATE);
    ERR_HAS(s, "with its targets");

    /* with targets: the same logits, a loss, one step per run */
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_get_output(s, "logits", &t), XTC_OK);
    ck_assert_int_eq(memcmp(free_logits, t.data, (size_t)tiny_numel(&t) * sizeof(float)), 0);
    free(free_logits);
    ck_assert_int_eq(xtc_session_get_output(s, "loss", &t), XTC_OK);
    ck_assert(*(const float *)t.data > 0);
    ck_assert_int_eq(xtc_session_step(s, &opt), XTC_OK);
    ck_assert_str_eq(xtc_session_error(s), "");
    ck_assert_int_eq(xtc_session_step(s, &opt), XTC_ERR_STATE);
    ERR_HAS(s, "used by a step already");
    ck_assert_int_eq(xtc_session_step_count(s), 1);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    ck_assert_str_eq(xtc_session_error(s), "");
    ck_assert_int_eq(xtc_session_step(s, &opt), XTC_OK);
    ck_assert_int_eq(xtc_session_step_count(s), 2);
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* token ids and targets out of their tables are refused when bound, naming the input,
 * the value and where it is; negative targets are ignored, not refused */
START_TEST(test_id_ranges)
{
    XtcModule *m;
    XtcSession *s = open_session(train_path, &m);
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 5);
    targets[1 * N + 3] = 300;
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets), XTC_ERR_RANGE);
    ERR_HAS(s, "input 'targets': value 300 at [1, 3] is outside [0, 37)");
    targets[1 * N + 3] = -100;
    ck_assert_msg(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets) == XTC_OK, "%s",
                  xtc_session_error(s));
    int32_t tok32[B * N];
    for (int i = 0; i < B * N; i++)
        tok32[i] = (int32_t)tokens[i];
    tok32[4] = 37;
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I32, 2, shape, tok32), XTC_ERR_RANGE);
    ERR_HAS(s, "input 'tokens': value 37 at [0, 4] is outside [0, 37)");
    xtc_session_free(s);
    xtc_module_free(m);

    /* XTransformer: tgt (the decoder reads tgt[:, :-1]) and targets */
    ck_assert_int_eq(xtc_module_load(encdec_path, &m), XTC_OK);
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    int64_t tgt[2 * 4] = {1, 2, 3, 4, 5, 6, 7, -1};
    ck_assert_int_eq(xtc_session_set_input(s, "tgt", XTC_I64, 2, (int64_t[]){2, 4}, tgt), XTC_ERR_RANGE);
    ERR_HAS(s, "input 'tgt': value -1 at [1, 3] is outside [0, 37)");
    int64_t tt[2 * 3] = {1, 2, 3, 4, 37, -100};
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, (int64_t[]){2, 3}, tt), XTC_ERR_RANGE);
    ERR_HAS(s, "input 'targets': value 37 at [1, 1] is outside [0, 37)");
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* no output elements, no work (a batch of 2^40 empty sequences returns at once); a
 * call whose loops would be absurd (a training module's scalar loss over 2^40 empty rows) is
 * refused before it runs */
START_TEST(test_empty_batches)
{
    XtcModule *m;
    XtcSession *s = open_session(fwd_path, &m);
    int64_t none = 0, huge[2] = {(int64_t)1 << 40, 0};
    ck_assert_msg(xtc_session_set_input(s, "tokens", XTC_I64, 2, huge, &none) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor t;
    ck_assert_int_eq(xtc_session_get_output(s, "logits", &t), XTC_OK);
    ck_assert(t.shape[0] == ((int64_t)1 << 40) && t.shape[1] == 0);
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 5);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s)); /* the session is fine */
    xtc_session_free(s);
    xtc_module_free(m);

    s = open_session(train_path, &m);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, huge, &none), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, huge, &none), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_RANGE);
    ERR_HAS(s, "b = 1099511627776, n = 0 are too large");
    int64_t small[2] = {3, 0};
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, small, &none), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, small, &none), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s)); /* an empty batch trains nothing */
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST

/* fresh weights in the session: bitwise those tiny_write_weights wrote with the same seed */
START_TEST(test_init_weights)
{
    ck_assert_int_eq(xtc_session_init_weights(NULL, 7), XTC_ERR_ARG);
    XtcModule *m = NULL;
    XtcSession *file = open_session(train_path, &m), *s = NULL, *other = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    ck_assert_int_eq(xtc_session_new(m, NULL, &other), XTC_OK);
    ck_assert_msg(xtc_session_init_weights(s, 7) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_init_weights(other, 8) == XTC_OK, "%s", xtc_session_error(other));
    int checked = 0, random = 0;
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor a, e, o;
            ck_assert_int_eq(xtc_module_tensor(m, (XtcKind)kind, i, &info), XTC_OK);
            ck_assert_int_eq(xtc_session_get_weight(s, info.name, &a), XTC_OK);
            ck_assert_int_eq(xtc_session_get_weight(file, info.name, &e), XTC_OK);
            ck_assert_int_eq(xtc_session_get_weight(other, info.name, &o), XTC_OK);
            size_t bytes = (size_t)tiny_numel(&e) * sizeof(float);
            ck_assert_int_eq(tiny_numel(&a), tiny_numel(&e));
            ck_assert_msg(memcmp(a.data, e.data, bytes) == 0, "%s differs from the seed's initial values", info.name);
            /* a drawn tensor (not a constant such as a norm's gain) changes with the seed */
            const float *ev = e.data;
            int drawn = 0;
            for (int64_t k = 1; k < tiny_numel(&e); k++)
                drawn |= ev[k] != ev[0];
            ck_assert_msg(!drawn || memcmp(o.data, e.data, bytes) != 0, "%s is the same for another seed", info.name);
            random += drawn;
            checked++;
        }
    ck_assert_msg(checked > 5 && random > 5, "%d weights, %d drawn", checked, random);
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 5);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    xtc_session_free(other);
    xtc_session_free(s);
    xtc_session_free(file);
    xtc_module_free(m);
}
END_TEST

int main(void)
{
    (void)tiny_hash; /* tiny_train.h's, for the suites comparing runs bitwise */
    Suite *s = suite_create("session_api");
    TCase *tc = tcase_create("api");
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_free_failed_session);
    tcase_add_test(tc, test_error_cleared_and_steps);
    tcase_add_test(tc, test_id_ranges);
    tcase_add_test(tc, test_empty_batches);
    tcase_add_test(tc, test_init_weights);
    suite_add_tcase(s, tc);
    return harness_run(s, "session_api");
}
