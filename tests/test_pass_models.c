/* test_pass_models.c: the whole pass pipeline on every model xtc compiles.
 *
 * Every .xtf of models/ and of tests/parity/, lowered for inference and for training (with the
 * padding masks where the model takes them), and the training graph also differentiated
 * (ir_autodiff, forward + backward as the compiler sees it), runs through the pipeline with
 * the verifier after every pass. Then: the result verifies, the node count did not grow, a
 * second run changes nothing, the interpreter gives the same outputs before and after on random
 * weights and inputs (pass_equiv.h: no tolerance), and the attention recognizer (match.h) finds
 * every attention of the lowering. The log has one line per case with the node counts.
 *
 * The interpreter comparison runs on models up to 20M parameters by default (the large models
 * of models/ take minutes in double precision); XTC_PASS_MODELS=full compares them all. */
#include "match.h"
#include "passes.h"
#include "rewrite.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "harness_drive.h"
#include "pass_equiv.h"

typedef struct {
    int cases, skipped, interp_skipped;
    Compared c;
    int attn_softmax, attn_matched, attn_private, attn_causal, attn_mask, attn_bias, attn_const;
    int attn_bounded; /* fused attentions the pipeline gave a bound (cosine_sim) */
} ModelStats;

/* The attention recognizer (match.h) on a cleaned graph: it must find every attention of the
 * lowering (each softmax labelled *.attn.weights) except where talking heads mix the heads
 * around the softmax or sparse top-k masks the scores by their own k-th largest; returns the
 * number found. */
static int count_attention(const char *what, const IrGraph *h, ModelStats *st, int *private_n)
{
    int *uses = calloc((size_t)h->nnodes + 1, sizeof *uses);
    char *live = pass_liveness(h, uses);
    int softmax = 0, matched = 0, priv = 0, mixed = 0;
    for (int i = 0; i < h->nnodes; i++) {
        const IrNode *x = h->nodes[i];
        if (x->op == IR_SOFTMAX && x->label && strstr(x->label, "attn.weights"))
            softmax++;
        if (x->op == IR_PARAM && strstr(x->s, "talking_heads"))
            mixed = 1; /* heads mixed before and after the softmax */
        if (x->op == IR_KTH_LARGEST)
            mixed = 1; /* sparse top-k: a mask computed from the scores themselves stays unfused */
        PassAttention m;
        if (!live[i] || !pass_match_attention(x, &m))
            continue;
        matched++;
        priv += pass_attention_private(&m, uses);
        st->attn_causal += m.causal != NULL;
        st->attn_mask += m.mask != NULL;
        st->attn_bias += m.bias != NULL;
        st->attn_const += m.scale_is_const;
    }
    ck_assert_msg(matched == (mixed ? 0 : softmax),
                  "%s: %d attentions recognized, %d softmax of attention", what, matched, softmax);
    st->attn_softmax += softmax;
    st->attn_matched += matched;
    st->attn_private += priv;
    free(uses);
    free(live);
    *private_n = priv;
    return matched;
}

static int64_t param_count(const IrGraph *g)
{
    int64_t total = 0, sym[IR_MAXSYM] = {0};
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op != IR_PARAM)
            continue;
        int64_t k = 1;
        for (int d = 0; d < x->rank; d++)
            k *= ir_dim_eval(x->shape[d], sym);
        total += k;
    }
    return total;
}

/* The pipeline with the verifier after every pass; no growth; equal outputs. */
static void pipeline_case(const char *what, IrGraph *g, ModelStats *st)
{
    char err[1024];
    PassOptions o = {.verify_each = 1};
    clock_t t0 = clock();
    IrGraph *h = harness_passes(g, NULL, &o, err, sizeof err);
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ck_assert_msg(h != NULL, "%s: %s", what, err);
    ck_assert_msg(ir_verify(h, err, sizeof err) == 0, "%s: result: %s", what, err);
    ck_assert_msg(h->nnodes <= g->nnodes, "%s: %d nodes grew to %d", what, g->nnodes, h->nnodes);
    for (int i = 0; i < h->nnodes; i++)
        st->attn_bounded += h->nodes[i]->op == IR_ATTENTION && h->nodes[i]->ia[IR_IA_BOUND] > 0;
    /* the pipeline is idempotent: a second run finds nothing more to do */
    IrGraph *h2 = harness_passes(h, NULL, &o, err, sizeof err);
    ck_assert_msg(h2 != NULL, "%s: second run: %s", what, err);
    char *s1 = ir_print_str(h), *s2 = ir_print_str(h2);
    ck_assert_msg(strcmp(s1, s2) == 0, "%s: a second run of the pipeline changes the graph", what);
    free(s1);
    free(s2);
    ir_graph_free(h2);
    /* the recognizer's coverage, on the graph the fusions start from (they take its matches) */
    PassOptions cleanup = {.verify_each = 1, .no_fuse = 1};
    IrGraph *hc = harness_passes(g, NULL, &cleanup, err, sizeof err);
    ck_assert_msg(hc != NULL, "%s: --no-fuse: %s", what, err);
    int priv, matched = count_attention(what, hc, st, &priv);
    ir_graph_free(hc);
    if (strstr(what, "+grad")) /* the backward reads the softmax: nothing is private */
        ck_assert_msg(priv == 0, "%s: %d private attentions in a training graph", what, priv);
    else if (!strstr(what, "residual_attn") && !strstr(what, "xtransformer")) /* scores shared */
        ck_assert_msg(priv == matched, "%s: %d of %d attentions private", what, priv, matched);
    int64_t params = param_count(g);
    int quick = !(getenv("XTC_PASS_MODELS") && strcmp(getenv("XTC_PASS_MODELS"), "full") == 0);
    if (quick && params > 20000000) {
        st->interp_skipped++;
        printf("passes: %-44s %6d -> %6d nodes (%.2f s); interpreter compared only with XTC_PASS_MODELS=full\n", what,
               g->nnodes, h->nnodes, secs);
    } else {
        Env e;
        env_init(&e, g);
        same_outputs(what, g, h, &e, &st->c);
        env_free(&e);
        printf("passes: %-44s %6d -> %6d nodes (%.2f s); same outputs\n", what, g->nnodes,
               h->nnodes, secs);
    }
    ir_graph_free(h);
    st->cases++;
}

static IrGraph *lower(XtfFile *f, const XtLowerOpts *opts)
{
    char err[512];
    return harness_build(f, NULL, opts, 0, harness_target("interp"), NULL, NULL, err, sizeof err);
}

static void check_model_file(const char *path, ModelStats *st)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(path, &d);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (!f || d.nerrors || xtf_check(f, &d) > 0) {
        const char *nl = d.text ? strchr(d.text, '\n') : NULL;
        printf("passes: %-44s skipped: %.*s\n", base, nl ? (int)(nl - d.text) : 0, d.text ? d.text : "");
        st->skipped++;
        xtf_diag_free(&d);
        xtf_free(f);
        return;
    }
    xtf_diag_free(&d);
    static const XtLowerOpts infer = {0};
    static const XtLowerOpts train_mask = {.train = 1, .mask = 1, .context_mask = 1, .tgt_mask = 1};
    static const XtLowerOpts train = {.train = 1};
    char what[1400];

    IrGraph *g = lower(f, &infer);
    ck_assert_msg(g != NULL, "%s does not lower", path);
    snprintf(what, sizeof what, "%s", base);
    pipeline_case(what, g, st);
    ir_graph_free(g);

    const XtLowerOpts *t = &train_mask;
    g = lower(f, t);
    if (!g) { /* the model refuses a padding mask (Transformer-XL) */
        t = &train;
        g = lower(f, t);
    }
    ck_assert_msg(g != NULL, "%s does not lower for training", path);
    snprintf(what, sizeof what, "%s --train%s", base, t == &train_mask ? " --mask" : "");
    pipeline_case(what, g, st);

    /* forward + backward, as the compiler sees a training graph */
    char err[512]; /* the loss, or the outputs seeded by grad.<output> */
    if (harness_autodiff(g, "interp", err, sizeof err) == 0) {
        snprintf(what, sizeof what, "%s --train%s +grad", base, t == &train_mask ? " --mask" : "");
        pipeline_case(what, g, st);
    } else {
        printf("passes: %-44s autodiff unavailable: %s\n", base, err);
    }
    ir_graph_free(g);
    xtf_free(f);
}

static void check_model_dir(const char *dir, ModelStats *st)
{
    DIR *dp = opendir(dir);
    ck_assert_msg(dp != NULL, "cannot open %s", dir);
    struct dirent *de;
    char *names[256];
    int k = 0;
    while ((de = readdir(dp)) && k < 256) {
        size_t len = strlen(de->d_name);
        if (len > 4 && strcmp(de->d_name + len - 4, ".xtf") == 0)
            names[k++] = strdup(de->d_name);
    }
    closedir(dp);
    for (int i = 0; i < k; i++) { /* sorted, for a stable log */
        for (int j = i + 1; j < k; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    }
    for (int i = 0; i < k; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        check_model_file(path, st);
        free(names[i]);
    }
}

START_TEST(test_models)
{
    ModelStats st = {0};
    check_model_dir(XTC_SOURCE_DIR "/models", &st);
    ck_assert_int_ge(st.cases, 6);
    printf("passes: models/: %d cases, %lld output elements equal (%lld bitwise, %lld +-0)\n",
           st.cases, (long long)st.c.elems, (long long)st.c.bitwise, (long long)st.c.zero_sign);
}
END_TEST

START_TEST(test_parity_models)
{
    ModelStats st = {0};
    check_model_dir(XTC_SOURCE_DIR "/tests/parity", &st);
    ck_assert_int_ge(st.cases, 40);
    printf("passes: tests/parity/: %d cases, %d files skipped, %lld output elements equal "
           "(%lld bitwise, %lld +-0)\n", st.cases, st.skipped, (long long)st.c.elems,
           (long long)st.c.bitwise, (long long)st.c.zero_sign);
    printf("passes: attention recognized %d times (of %d softmax; %d private, %d causal, %d masked, "
           "%d with a bias, %d with a constant scale)\n", st.attn_matched, st.attn_softmax,
           st.attn_private, st.attn_causal, st.attn_mask, st.attn_bias, st.attn_const);
}
END_TEST

/* Cosine-sim attention of 1.x and 2.x (attn_qk_norm, with rotary in both pair layouts, one
 * key/value head, a padding mask, qk_norm_groups): the pipeline bounds every attention
 * (cosine_sim), in inference and in training, and the interpreter, which checks each bound
 * against the values, gives the same outputs and gradients before and after. */
START_TEST(test_cosine_models)
{
    static const char *files[] = {"v1_qk_norm_rotary_mqa_mask", "v2_qk_norm_rotary_mqa_mask", "v2_qk_norm_groups_scale",
                                  "v1_attn_qk_norm"};
    ModelStats st = {0};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/tests/parity_newer/%s.xtf", XTC_SOURCE_DIR, files[i]);
        check_model_file(path, &st);
    }
    ck_assert_int_eq(st.cases, 12);
    ck_assert_msg(st.attn_bounded >= st.cases, "%d bounded attentions in %d cases", st.attn_bounded, st.cases);
    printf("passes: cosine-sim models: %d cases, %d bounded attentions, %lld output elements equal\n", st.cases,
           st.attn_bounded, (long long)st.c.elems);
}
END_TEST

static Suite *pass_models_suite(void)
{
    Suite *s = suite_create("pass_models");
    TCase *m = tcase_create("models");
    tcase_set_timeout(m, 600);
    tcase_add_test(m, test_parity_models);
    tcase_add_test(m, test_models);
    tcase_add_test(m, test_cosine_models);
    suite_add_tcase(s, m);
    return s;
}

int main(void)
{
    return harness_run(pass_models_suite(), NULL);
}
