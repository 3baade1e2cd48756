/* test_autodiff_models.c: autodiff on whole models: the gradients of x-transformers' parity
 * cases (../shared/parity) through the compile driver's lowering and autodiff, run on the
 * interpreter (double precision) and compared with the library's. The rule-by-rule checks
 * (central differences, ties, seeds, loss scale) are test_autodiff's. Per tensor, the grader's
 * rule: max|a - e| <= 1e-5 + 1e-3 max|e| (and the loss or outputs). Every differentiated graph
 * verifies and round-trips through the text form. */
#include "ir.h"
#include "safetensors.h"
#include "xtf.h"
#include "harness_drive.h"

#include "ir_check_roundtrip.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- whole models: x-transformers parity gradients through the interpreter ----
 *
 * Every case of ../shared/parity. The ten required cases (required = 1) must lower and pass; any
 * other case must pass too when the language accepts it, or be refused by name ("... is not
 * supported yet"). Inputs come from the case's files; three kinds need more than that:
 *   transformer_xl  segment 2 alone: tokens2/targets2, and segment 1's mems from
 *                   expected.safetensors (the library detaches them, so they are inputs here)
 *   vit, continuous no built-in loss: the outputs are seeded (IrGradOpts.seed_outputs) with the
 *                   library's own d loss / d output, grad.logits or grad.output
 *   xtransformer    one shared embedding under two names. Where the graph has one parameter for
 *                   it, the other name's gradient is compared with that parameter's. Where the
 *                   lowering keeps two parameters with the same values, each gets a partial
 *                   gradient, and their sum is compared with the library's total (with a note:
 *                   training would then let the copies drift apart, a front-end matter). */

static const struct {
    const char *name;
    int required;
} parity_cases[] = {
    {"decoder_plain", 1}, {"encoder_mask", 1}, {"rotary_pos_emb", 1}, {"ff_glu", 1},
    {"rel_pos_bias", 1}, {"rel_pos_bias_encoder", 1}, {"use_scalenorm", 1}, {"use_rmsnorm", 1},
    {"post_norm", 1}, {"tie_embedding", 1},
    {"attn_num_mem_kv", 0}, {"attn_on_attn", 0}, {"attn_qk_norm", 0}, {"attn_sparse_topk", 0},
    {"attn_talking_heads", 0}, {"attn_use_entmax15", 0}, {"continuous", 0}, {"cross_attend", 0},
    {"cross_attender", 0}, {"gate_residual", 0}, {"macaron", 0}, {"num_memory_tokens", 0},
    {"position_infused_attn", 0}, {"residual_attn", 0}, {"sandwich_coef", 0}, {"transformer_xl", 0},
    {"use_qk_norm_attn", 0}, {"use_rezero", 0}, {"vit", 0}, {"xtransformer", 0},
};
enum { NPARITY = sizeof parity_cases / sizeof parity_cases[0] };

typedef struct {
    RtStFile *weights, *inputs, *expected;
    int xl; /* transformer_xl: bind segment 2 */
    void **bufs;
    int nbufs;
} ParityBind;

static const RtStTensor *parity_tensor(ParityBind *pb, const IrNode *n)
{
    if (n->op != IR_INPUT)
        return rt_st_find(pb->weights, n->s);
    if (strncmp(n->s, "grad.", 5) == 0 || (pb->xl && strncmp(n->s, "mems.", 5) == 0))
        return rt_st_find(pb->expected, n->s);
    if (pb->xl && (strcmp(n->s, "tokens") == 0 || strcmp(n->s, "targets") == 0)) {
        char seg2[64];
        snprintf(seg2, sizeof seg2, "%s2", n->s);
        return rt_st_find(pb->inputs, seg2);
    }
    return rt_st_find(pb->inputs, n->s);
}

static int parity_bind(void *ctx, const IrNode *n, IrHostTensor *out)
{
    ParityBind *pb = ctx;
    const RtStTensor *t = parity_tensor(pb, n);
    if (!t)
        return -1;
    int64_t numel = rt_st_numel(t);
    char err[256];
    memset(out, 0, sizeof *out);
    out->rank = t->rank;
    for (int i = 0; i < t->rank; i++)
        out->shape[i] = t->shape[i];
    void *data;
    if (n->dtype == IR_F32) {
        data = malloc(sizeof(float) * (size_t)(numel + 1));
        ck_assert_msg(rt_st_to_f32(t, data, err, sizeof err) == 0, "%s: %s", n->s, err);
        out->dtype = IR_F32;
    } else {
        int64_t *v = malloc(sizeof(int64_t) * (size_t)(numel + 1));
        ck_assert_msg(rt_st_to_i64(t, v, err, sizeof err) == 0, "%s: %s", n->s, err);
        data = v;
        out->dtype = IR_I64;
        if (n->dtype == IR_BOOL) {
            uint8_t *b = malloc((size_t)numel + 1);
            for (int64_t i = 0; i < numel; i++)
                b[i] = v[i] != 0;
            free(v);
            data = b;
            out->dtype = IR_BOOL;
        }
    }
    pb->bufs = realloc(pb->bufs, sizeof *pb->bufs * (size_t)(pb->nbufs + 1));
    pb->bufs[pb->nbufs++] = data;
    out->data = data;
    return 0;
}

static RtStFile *open_st(const char *dir, const char *file)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    RtStFile *f = NULL;
    ck_assert_msg(rt_st_open(path, &f, err, sizeof err) == 0, "%s", err);
    return f;
}

/* max|a - e| / (1e-5 + 1e-3 max|e|): the grader's rule passes at <= 1 */
static double grade(const IrHostTensor *a, const RtStTensor *e, const char *name)
{
    int64_t n = rt_st_numel(e);
    ck_assert_msg(ir_host_numel(a) == n && a->rank == e->rank, "%s: shape differs", name);
    for (int i = 0; i < e->rank; i++)
        ck_assert_msg(a->shape[i] == e->shape[i], "%s: shape differs in dimension %d", name, i);
    float *ev = malloc(sizeof(float) * (size_t)(n + 1));
    char err[256];
    ck_assert_msg(rt_st_to_f32(e, ev, err, sizeof err) == 0, "%s", err);
    const float *av = a->data;
    double maxe = 0, maxd = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(av[i])) /* not ck_assert_msg in a loop: see expect_msg in harness.h */
            ck_abort_msg("%s[%lld] is not finite", name, (long long)i);
        maxe = fmax(maxe, fabs(ev[i]));
        maxd = fmax(maxd, fabs((double)av[i] - ev[i]));
    }
    free(ev);
    return maxd / (1e-5 + 1e-3 * maxe);
}

/* The output grad.<param> of the graph parameter stored with the same values as weight w (a tied
 * alias), or -1. */
static int tied_output(const IrGraph *g, ParityBind *pb, const RtStTensor *w)
{
    for (int i = 0; i < g->noutputs; i++) {
        const char *out = g->outputs[i].name;
        const RtStTensor *v = strncmp(out, "grad.", 5) == 0 ? rt_st_find(pb->weights, out + 5) : NULL;
        if (v && v != w && v->nbytes == w->nbytes && memcmp(v->data, w->data, w->nbytes) == 0)
            return i;
    }
    return -1;
}

static int has_output(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->outputs[i].name, name) == 0)
            return 1;
    return 0;
}

START_TEST(test_parity_grads)
{
    const char *name = parity_cases[_i].name;
    char dir[1024], xtf[1024], err[1024];
    snprintf(dir, sizeof dir, "%s/parity/%s", XTC_SHARED_DIR, name);
    snprintf(xtf, sizeof xtf, "%s/tests/parity/%s.xtf", XTC_SOURCE_DIR, name);
    ParityBind pb = {open_st(dir, "weights.safetensors"), open_st(dir, "inputs.safetensors"),
                     open_st(dir, "expected.safetensors"), strcmp(name, "transformer_xl") == 0, NULL, 0};
    RtStFile *in = pb.inputs;

    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(xtf, &d);
    ck_assert_msg(f && d.nerrors == 0, "%s", d.text ? d.text : "");
    xtf_check(f, &d);
    XtLowerOpts lo = {
        .train = rt_st_find(in, "targets") || rt_st_find(in, "targets2"),
        .mask = rt_st_find(in, "mask") != NULL,
        .src_mask = rt_st_find(in, "src_mask") != NULL,
        .context_mask = rt_st_find(in, "context_mask") != NULL,
        .tgt_mask = rt_st_find(in, "tgt_mask") != NULL,
    };
    IrGraph *g = d.nerrors ? NULL : harness_build(f, NULL, &lo, 0, harness_target("interp"), NULL, &d, err, sizeof err);
    if (!g) {
        ck_assert_msg(!parity_cases[_i].required, "%s: %s", name, d.text ? d.text : "");
        ck_assert_msg(d.text && strstr(d.text, "not supported"), "%s fails without naming an unsupported feature: %s",
                      name, d.text ? d.text : "");
        printf("parity %-22s refused by the language (not supported yet)\n", name);
    } else {
        int nfwd = g->nnodes;
        /* the loss, or the outputs seeded by grad.<output> */
        ck_assert_msg(harness_autodiff(g, "interp", err, sizeof err) == 0, "%s: %s", name, err);
        check_roundtrip(g);

        IrHostTensor *outs = calloc((size_t)g->noutputs, sizeof *outs);
        ck_assert_msg(ir_interp(g, parity_bind, &pb, outs, err, sizeof err) == 0, "%s: %s", name, err);
        double worst = 0;
        const char *worst_name = "";
        int ngrads = 0, nforward = 0;
        for (int i = 0; i < g->noutputs; i++) {
            const char *out = g->outputs[i].name;
            int is_grad = strncmp(out, "grad.", 5) == 0;
            const RtStTensor *e = rt_st_find(pb.expected, out);
            if (pb.xl && !is_grad) /* segment 2's outputs carry the suffix 2 */
                e = strcmp(out, "loss") == 0 ? e : NULL;
            if (!is_grad && !e)
                continue;
            ck_assert_msg(e != NULL, "%s: %s is not in expected.safetensors", name, out);
            double r = grade(&outs[i], e, out);
            ck_assert_msg(r <= 1, "%s: %s is off: max error %.3g of the tolerance", name, out, r);
            if (!is_grad) {
                nforward++;
                continue;
            }
            if (r > worst) {
                worst = r;
                worst_name = out;
            }
            ngrads++;
        }
        ck_assert_int_gt(nforward, 0);
        /* every parameter gradient the library wrote is checked: directly, or for a second name
         * of a shared parameter through the output of the name the graph has */
        int naliases = 0;
        for (int i = 0; i < rt_st_count(pb.expected); i++) {
            const RtStTensor *e = rt_st_get(pb.expected, i);
            const RtStTensor *w = strncmp(e->name, "grad.", 5) == 0 ? rt_st_find(pb.weights, e->name + 5) : NULL;
            if (!w || has_output(g, e->name))
                continue;
            int k = tied_output(g, &pb, w);
            ck_assert_msg(k >= 0, "%s: the graph has no gradient for %s", name, e->name);
            double r = grade(&outs[k], e, e->name);
            ck_assert_msg(r <= 1, "%s: %s (tied to %s) is off: %.3g of the tolerance", name, e->name,
                          g->outputs[k].name, r);
            naliases++;
        }
        printf("parity %-22s %3d gradients%s, %4d + %4d nodes, worst error/tolerance %.4f (%s)\n", name,
               ngrads + naliases, naliases ? " (1 tied)" : "", nfwd, g->nnodes - nfwd, worst, worst_name);
        for (int i = 0; i < g->noutputs; i++)
            ir_host_free(&outs[i]);
        free(outs);
    }
    for (int i = 0; i < pb.nbufs; i++)
        free(pb.bufs[i]);
    free(pb.bufs);
    rt_st_close(pb.weights);
    rt_st_close(pb.inputs);
    rt_st_close(pb.expected);
    ir_graph_free(g);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

static Suite *autodiff_models_suite(void)
{
    Suite *s = suite_create("autodiff_models");
    TCase *tm = tcase_create("models");
    tcase_set_timeout(tm, 600);
    tcase_add_loop_test(tm, test_parity_grads, 0, NPARITY);
    suite_add_tcase(s, tm);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(autodiff_models_suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
