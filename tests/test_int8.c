/* test_int8.c: int8 weights (xtc compile --weights-dtype int8; include/xtc.h, "int8 weights").
 *
 *  - the quantization rule (runtime/rt_quant.c) on hand-made rows: scales, rounding ties to even,
 *    groups with a partial last one, odd sizes, zero rows, clamping, non-finite values;
 *  - every model of models/ compiled with int8 weights (per output row, and in groups of 32)
 *    against the reference interpreter evaluating the same quantized graph on the same int8
 *    values and scales (dequantized exactly, in double precision): the forward pass, and for the
 *    models with a KV cache, a prompt and two one-token calls with the caches carried (tiny_gpt's
 *    also with the caches stored in bf16, the interpreter rounding them as the module does);
 *  - the three ways weights reach a session agree bit for bit (the f32 file quantized as it
 *    loads, the I8 file, xtc_session_set_weight), and bad files (wrong dtype, a missing or extra
 *    scale, shapes that do not fit, another group, a NaN) give one error naming the tensor and
 *    change nothing;
 *  - the refusals: int8 with --train, on the cuda targets, with 16-bit storage. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "harness_bind.h"
#include "harness_drive.h"
#include "harness_kv.h"
#include "rt_half.h"
#include "rt_quant.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

/* ---- the rule ---- */

START_TEST(test_quantize_rule)
{
    /* one row of 7 in groups of 3: [3, 3, 1] */
    const float w[7] = {1.27f, -0.5f, 0.635f, 0, 0, 0, -2.54f};
    int8_t q[7];
    float s[3];
    ck_assert_int_eq(rt_quantize_rows(w, 1, 7, 3, q, s), -1);
    ck_assert_float_eq(s[0], 1.27f / 127);
    ck_assert_float_eq(s[1], 0);
    ck_assert_float_eq(s[2], 2.54f / 127);
    ck_assert_int_eq(q[0], 127);  /* the largest of a group is exactly +-127 */
    ck_assert_int_eq(q[1], -50);
    ck_assert_int_eq(q[2], 64);   /* 63.5 (as f32 0.635 / 0.01: 63.49999..) rounds to nearest */
    ck_assert_int_eq(q[3], 0);    /* a zero group: scale 0, values 0 */
    ck_assert_int_eq(q[6], -127); /* a group of one */
    /* ties go to even: 2.5 and 3.5 steps of 1/127 of the group's maximum 127 */
    const float t[4] = {127, 2.5f, 3.5f, -2.5f};
    int8_t qt[4];
    float st[1];
    ck_assert_int_eq(rt_quantize_rows(t, 1, 4, 0, qt, st), -1);
    ck_assert_float_eq(st[0], 1);
    ck_assert_int_eq(qt[1], 2);
    ck_assert_int_eq(qt[2], 4);
    ck_assert_int_eq(qt[3], -2);
    /* odd sizes, random rows: every weight within half a step, each group's extreme exact */
    enum { N = 5, K = 77 };
    float r[N * K];
    for (int i = 0; i < N * K; i++)
        r[i] = (float)uniform(-3, 3);
    for (int g = 0; g <= 80; g += 16) { /* 0: per row; 16 .. 64: groups, the last partial; 80 >= k: per row */
        int8_t qr[N * K];
        float sr[N * K];
        int64_t group = rt_quant_group_of(g, K), ng = (K + group - 1) / group;
        ck_assert_int_eq(group, g == 0 || g >= K ? K : g);
        ck_assert_int_eq(rt_quantize_rows(r, N, K, g, qr, sr), -1);
        for (int j = 0; j < N; j++)
            for (int64_t gi = 0; gi < ng; gi++) {
                int top = 0;
                for (int64_t p = gi * group; p < K && p < (gi + 1) * group; p++) {
                    double back = qr[j * K + p] * (double)sr[j * ng + gi];
                    ck_assert_msg(fabs(back - r[j * K + p]) <= 0.5 * sr[j * ng + gi] * (1 + 1e-6),
                                  "group %d: [%d, %lld] %g -> %g", g, j, (long long)p, r[j * K + p], back);
                    top |= abs(qr[j * K + p]) == 127;
                }
                ck_assert(top);
            }
    }
    /* non-finite values are refused, at their index */
    float bad[6] = {1, 2, 3, 4, NAN, 6};
    int8_t qb[6];
    float sb[2];
    ck_assert_int_eq(rt_quantize_rows(bad, 2, 3, 0, qb, sb), 4);
    bad[4] = INFINITY;
    ck_assert_int_eq(rt_quantize_rows(bad, 2, 3, 2, qb, sb), 4);
}
END_TEST

/* ---- models: compiled against the interpreter on the same int8 weights ---- */

#define MAXB 1024

typedef struct {
    int n;
    const char *name[MAXB];
    IrHostTensor t[MAXB];
    int owned[MAXB];
} Leaves;

static void leaves_free(Leaves *l)
{
    for (int i = 0; i < l->n; i++)
        if (l->owned[i])
            free(l->t[i].data);
    l->n = 0;
}

static void leaves_put(Leaves *l, const char *name, IrDType dt, int rank, const int64_t *shape, void *data, int owned)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->name[i], name)) {
            if (l->owned[i])
                free(l->t[i].data);
            l->n--;
            memmove(&l->name[i], &l->name[i + 1], sizeof l->name[0] * (size_t)(l->n - i));
            memmove(&l->t[i], &l->t[i + 1], sizeof l->t[0] * (size_t)(l->n - i));
            memmove(&l->owned[i], &l->owned[i + 1], sizeof l->owned[0] * (size_t)(l->n - i));
            break;
        }
    ck_assert_int_lt(l->n, MAXB);
    l->name[l->n] = name;
    l->t[l->n] = (IrHostTensor){.dtype = dt, .rank = rank, .data = data};
    memcpy(l->t[l->n].shape, shape, sizeof(int64_t) * (size_t)rank);
    l->owned[l->n++] = owned;
}

static int leaves_cb(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Leaves *l = ctx;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->name[i], leaf->s)) {
            *out = l->t[i];
            return 0;
        }
    return -1;
}

/* The session's weights (the int8 values and scales it holds), for the interpreter. */
static void session_weights(XtcSession *s, const XtcModule *m, Leaves *l)
{
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor t;
            xtc_module_tensor(m, (XtcKind)kind, i, &info);
            ck_assert_msg(xtc_session_get_weight(s, info.name, &t) == XTC_OK, "%s", xtc_session_error(s));
            leaves_put(l, info.name, t.dtype == XTC_I8 ? IR_I8 : IR_F32, t.rank, t.shape, (void *)t.data, 0);
        }
}

/* symbol values: the batch b, the new positions n, the cache c (from the caches bound), others 3 */
static int64_t sym_value(const IrGraph *g, int s, int64_t b, int64_t n, int64_t c)
{
    const char *nm = g->sym_name[s];
    return !strcmp(nm, "b") ? b : !strcmp(nm, "n") ? n : !strcmp(nm, "c") ? c : 3;
}

/* Random inputs (not the caches, which the caller binds) into l and the session. */
static void random_inputs(const IrGraph *g, XtcSession *s, Leaves *l, int64_t b, int64_t n, int64_t c)
{
    int64_t syms[IR_MAXSYM] = {0};
    for (int k = 0; k < g->nsyms; k++)
        syms[k] = sym_value(g, k, b, n, c);
    ir_graph_derive_syms(g, syms);
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op != IR_INPUT || !strncmp(x->s, "cache.", 6))
            continue;
        int64_t shape[IR_MAXRANK], numel = 1;
        for (int d = 0; d < x->rank; d++)
            numel *= shape[d] = ir_dim_eval(x->shape[d], syms);
        void *data = malloc((size_t)(numel ? numel : 1) * 8);
        for (int64_t k = 0; k < numel; k++) {
            if (x->dtype == IR_F32)
                ((float *)data)[k] = (float)uniform(-1, 1);
            else if (x->dtype == IR_BOOL)
                ((uint8_t *)data)[k] = 1;
            else /* token ids: within every bundled model's vocabulary */
                ((int64_t *)data)[k] = (int64_t)(rnd() % 200);
        }
        IrDType dt = x->dtype == IR_I32 ? IR_I64 : x->dtype;
        leaves_put(l, x->s, dt, x->rank, shape, data, 1);
        ck_assert_msg(xtc_session_set_input(s, x->s, xdt(dt), x->rank, shape, data) == XTC_OK, "%s: %s", x->s,
                      xtc_session_error(s));
    }
}

/* Every output of the call within 1e-5 + rel max|ref| of the interpreter's. */
static double compare_outputs(const char *what, const IrGraph *g, XtcSession *s, const IrHostTensor *ref, double rel)
{
    double worst = 0;
    for (int o = 0; o < g->noutputs; o++) {
        XtcTensor got;
        ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &got) == XTC_OK, "%s", xtc_session_error(s));
        char label[1024];
        snprintf(label, sizeof label, "%s: %s", what, g->outputs[o].name);
        double maxabs;
        int64_t numel = compare_layout(label, &ref[o], &got, &maxabs);
        compare_values(label, "", &ref[o], &got, numel, 1e-5 + rel * maxabs, 0);
        for (int64_t i = 0; i < numel; i++)
            if (maxabs > 0)
                worst = fmax(worst, fabs(value_at(got.data, XTC_F32, i) - value_at(ref[o].data, XTC_F32, i)) / maxabs);
    }
    return worst;
}

/* the KV caches rounded to bf16 as a module compiled with --kv-dtype bf16 stores them: each
 * concat of a cache input and the call's rows (ir_interp_rounded) */
static void round_caches(void *ctx, const IrNode *n, double *v, int64_t count)
{
    (void)ctx;
    if (n->op == IR_CONCAT && n->in[0]->op == IR_INPUT && !strncmp(n->in[0]->s, "cache.", 6))
        for (int64_t i = 0; i < count; i++)
            v[i] = rt_bf16_to_f32(rt_f32_to_bf16((float)v[i]));
}

/* ... or to int8 rows as --kv-dtype int8 stores them (rt_half.h rt_i8_row_quantize) */
static void round_caches_int8(void *ctx, const IrNode *n, double *v, int64_t count)
{
    (void)ctx;
    if (n->op == IR_CONCAT && n->in[0]->op == IR_INPUT && !strncmp(n->in[0]->s, "cache.", 6))
        harness_round_rows_int8(v, count, n->shape[n->rank - 1].c);
}

/* One model of a file: forward (and with kv, a prompt of 3 tokens and two one-token calls; kvst:
 * the caches stored in bf16 (1, --kv-dtype bf16) or as int8 rows (3, --kv-dtype int8) against
 * the interpreter rounding them the same way, every output within 4e-3 of its largest value: a
 * cache value the f32 sums put on the other side of a rounding boundary than the double ones,
 * one unit of bf16, or of the row's int8 scale). */
static void check_model(const char *path, int kv, int group, int kvst)
{
    int kv16 = kvst != 0; /* caches rounded, bf16 or int8 */
    const char *kvname = kvst == 3 ? "int8" : "bf16";
    clock_t t0 = clock();
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(path, &d);
    if (f && d.nerrors == 0)
        xtf_check(f, &d);
    ck_assert_msg(f != NULL && d.nerrors == 0, "%s: %s", path, d.text ? d.text : "");
    char err[1024];
    CgOptions ask = {.target = "interp", .weights_dtype = "int8", .quant_group = group};
    DrvTarget interp, cpu;
    ck_assert_msg(drv_target(&interp, &ask, err, sizeof err) == 0, "%s", err);
    ask.target = "cpu";
    ask.kv_dtype = kv16 ? kvname : NULL;
    ck_assert_msg(drv_target(&cpu, &ask, err, sizeof err) == 0, "%s", err);
    XtLowerOpts lo = {.kv_cache = kv};
    IrGraph *g = harness_build(f, NULL, &lo, 0, &interp, NULL, NULL, err, sizeof err);
    if (!g && kv) { /* encoders and Transformer-XL have no cached form: the lowering says so */
        xtf_free(f);
        xtf_diag_free(&d);
        return;
    }
    ck_assert_msg(g != NULL, "%s: %s", path, err);
    int caches = 0;
    for (int i = 0; i < g->nnodes; i++)
        caches += g->nodes[i]->op == IR_INPUT && !strncmp(g->nodes[i]->s, "cache.", 6);
    if (kv && !caches) { /* nothing is cached (an encoder only): the forward covers it */
        ir_graph_free(g);
        xtf_free(f);
        xtf_diag_free(&d);
        return;
    }
    int q8 = 0;
    for (int i = 0; i < g->nnodes; i++)
        q8 += g->nodes[i]->op == IR_MATMUL_Q8;
    ck_assert_msg(q8 > 0, "%s: no matmul weight was quantized", path);
    DrvJob job = {.file = f, .lower = lo, .cg = {.opt_level = 2}};
    XtcModule *m = drv_build_load(&job, &cpu, NULL, err, sizeof err);
    ck_assert_msg(m != NULL, "%s: %s", path, err);
    char kvmeta[32];
    snprintf(kvmeta, sizeof kvmeta, "kv_dtype %s", kvname);
    if (kv16)
        ck_assert_msg(strstr(xtc_module_metadata(m), kvmeta) != NULL, "%s: caches not stored in %s", path, kvname);
    XtcSession *s;
    /* 2 threads for the small models (the kernels' split of work), 1 for the others (CPU time) */
    int threads = strstr(path, "tiny_gpt") || strstr(path, "gpt_rotary") ? 2 : 1;
    ck_assert_msg(xtc_session_new(m, &(XtcSessionOptions){.threads = threads}, &s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_init_weights(s, 7) == XTC_OK, "%s", xtc_session_error(s));
    Leaves l = {0};
    session_weights(s, m, &l);
    int calls = kv ? 3 : 1;
    int64_t c = 0;
    double worst = 0;
    for (int call = 0; call < calls; call++) {
        int64_t n = call == 0 ? 3 : 1, b = kv ? 1 : 2; /* forward: 6 rows, the blocked path; decoding: the matrix-vector one */
        random_inputs(g, s, &l, b, n, c);
        for (int i = 0; call == 0 && i < g->nnodes; i++) { /* empty caches */
            const IrNode *x = g->nodes[i];
            if (x->op != IR_INPUT || strncmp(x->s, "cache.", 6))
                continue;
            int64_t shape[IR_MAXRANK];
            for (int dd = 0; dd < x->rank; dd++)
                shape[dd] = ir_dim_is_const(x->shape[dd]) ? x->shape[dd].c : dd == 0 ? b : 0;
            leaves_put(&l, x->s, IR_F32, x->rank, shape, malloc(1), 1);
            ck_assert_msg(xtc_session_set_input(s, x->s, XTC_F32, x->rank, shape, NULL) == XTC_OK, "%s",
                          xtc_session_error(s));
        }
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: %s", path, xtc_session_error(s));
        IrHostTensor *ref = interp_outputs(g, leaves_cb, &l, kvst == 3 ? round_caches_int8 : kv16 ? round_caches : NULL, path);
        char what[600];
        snprintf(what, sizeof what, "%s%s%s%s group %d call %d", path, kv16 ? " " : "", kv16 ? kvname : "",
                 kv16 || kv ? " (KV cache)" : "", group, call);
        worst = fmax(worst, compare_outputs(what, g, s, ref, kv16 ? 4e-3 : 1e-4));
        for (int o = 0; o < g->noutputs; o++) { /* the caches go on: the interpreter's and the session's */
            const char *nm = g->outputs[o].name;
            if (strncmp(nm, "cache.", 6))
                continue;
            int64_t numel = ir_host_numel(&ref[o]);
            float *copy = malloc((size_t)(numel ? numel : 1) * sizeof *copy);
            memcpy(copy, ref[o].data, (size_t)numel * sizeof *copy);
            leaves_put(&l, nm, IR_F32, ref[o].rank, ref[o].shape, copy, 1);
            c = ref[o].shape[1];
            ck_assert_msg(xtc_session_carry(s, nm, nm) == XTC_OK, "%s", xtc_session_error(s));
        }
        free_outputs(g, ref);
    }
    printf("int8: %s%s%s%s, group %d: %d int8 matmuls, %d call(s), largest error %.2g of max|ref| (%.1f s)\n", path,
           kv16 ? " " : "", kv16 ? kvname : "", kv16 || kv ? " (KV cache)" : "", group, q8, calls, worst,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
    leaves_free(&l);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
    xtf_free(f);
    xtf_diag_free(&d);
}

static int model_files(char names[][256], int max)
{
    DIR *dir = opendir(XTC_SOURCE_DIR "/models");
    ck_assert_ptr_nonnull(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < max) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".xtf"))
            snprintf(names[n++], 256, "%s/models/%s", XTC_SOURCE_DIR, e->d_name);
    }
    closedir(dir);
    ck_assert_int_ge(n, 9);
    return n;
}

START_TEST(test_models)
{
    char names[32][256];
    int n = model_files(names, 32);
    /* the forward of every model, per output row, and the cached decoding of those that have it
     * (gpt, gpt_rotary, tiny_gpt); tiny_gpt's both again in groups of 32 */
    for (int i = 0; i < n; i++) {
        check_model(names[i], 0, 0, 0);
        check_model(names[i], 1, 0, 0);
        if (strstr(names[i], "/tiny_gpt.xtf")) {
            check_model(names[i], 0, 32, 0);
            check_model(names[i], 1, 32, 0);
            check_model(names[i], 1, 0, 1); /* with the caches in bf16 */
            check_model(names[i], 1, 0, 3); /* ... and as int8 rows */
        }
    }
}
END_TEST

/* ---- weights files ---- */

static const char *TINY = "m = TransformerWrapper(num_tokens = 40, max_seq_len = 16,\n"
                          "    attn_layers = Decoder(dim = 16, depth = 1, heads = 2))\n";

static XtcModule *tiny_module(int group)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", TINY, strlen(TINY), &d);
    ck_assert_ptr_nonnull(f);
    xtf_check(f, &d);
    char err[1024];
    DrvTarget t;
    ck_assert_msg(drv_target(&t, &(CgOptions){.weights_dtype = group < 0 ? NULL : "int8", .quant_group = group > 0 ? group : 0},
                             err, sizeof err) == 0, "%s", err);
    DrvJob job = {.file = f, .cg = {.opt_level = 1}};
    XtcModule *m = drv_build_load(&job, &t, NULL, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    xtf_free(f);
    xtf_diag_free(&d);
    return m;
}

/* Writes every weight of session s as the module holds it (int8 weights as I8 + scales), with
 * edit applied to the writer's choice for tensor name (see below). */
enum { KEEP, DROP, AS_I16, BAD_SHAPE, AS_F32_WITH_SCALE, NAN_AT_0 };
static void write_file(XtcSession *s, const XtcModule *m, const char *path, const char *target, int edit,
                       const char *group)
{
    RtStWriter *w = rt_st_writer_new();
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor t;
            xtc_module_tensor(m, (XtcKind)kind, i, &info);
            ck_assert(xtc_session_get_weight(s, info.name, &t) == XTC_OK);
            int64_t numel = 1;
            for (int d = 0; d < t.rank; d++)
                numel *= t.shape[d];
            RtDType dt = t.dtype == XTC_I8 ? RT_I8 : RT_F32;
            const void *data = t.data;
            int64_t shape[XTC_MAX_RANK];
            memcpy(shape, t.shape, sizeof shape);
            void *tmp = NULL;
            if (target && !strcmp(info.name, target)) {
                if (edit == DROP)
                    continue;
                if (edit == AS_I16) {
                    tmp = calloc((size_t)numel, 2);
                    dt = RT_I16;
                    data = tmp;
                } else if (edit == BAD_SHAPE) {
                    shape[t.rank - 1] -= 1;
                } else if (edit == NAN_AT_0) {
                    tmp = malloc((size_t)numel * sizeof(float));
                    memcpy(tmp, t.data, (size_t)numel * sizeof(float));
                    ((float *)tmp)[0] = NAN;
                    data = tmp;
                }
            }
            rt_st_writer_add(w, info.name, dt, t.rank, shape, data);
            free(tmp);
        }
    if (group)
        rt_st_writer_meta(w, "xtc.quant_group", group);
    char err[512];
    ck_assert_msg(rt_st_writer_save(w, path, err, sizeof err) == 0, "%s", err);
    rt_st_writer_free(w);
}

/* The logits of tokens 1..5 with the session's weights. */
static void logits(XtcSession *s, float *out)
{
    int64_t tok[5] = {1, 2, 3, 4, 5}, shape[2] = {1, 5};
    ck_assert(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) == XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor t;
    ck_assert(xtc_session_get_output(s, "logits", &t) == XTC_OK);
    memcpy(out, t.data, 5 * 40 * sizeof *out);
}

static void expect_refused(XtcSession *s, const char *path, const char *needle, const float *before)
{
    ck_assert_int_ne(xtc_session_load_weights(s, path), XTC_OK);
    ck_assert_msg(strstr(xtc_session_error(s), needle), "expected '%s' in: %s", needle, xtc_session_error(s));
    ck_assert_msg(!strchr(xtc_session_error(s), '\n'), "one line: %s", xtc_session_error(s));
    float now[200];
    logits(s, now); /* nothing changed */
    ck_assert(!memcmp(now, before, sizeof now));
}

START_TEST(test_weights_files)
{
    XtcModule *mf = tiny_module(-1), *m = tiny_module(0), *mg = tiny_module(8);
    XtcSession *sf, *s, *s2;
    ck_assert(xtc_session_new(mf, NULL, &sf) == XTC_OK && xtc_session_new(m, NULL, &s) == XTC_OK &&
              xtc_session_new(m, NULL, &s2) == XTC_OK);
    /* f32 weights into the f32 module, then its file into the int8 module: quantized as it loads */
    ck_assert(xtc_session_init_weights(sf, 5) == XTC_OK);
    char f32[512], i8[512], bad[512];
    snprintf(f32, sizeof f32, "%s/f32.safetensors", tmpdir);
    snprintf(i8, sizeof i8, "%s/i8.safetensors", tmpdir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", tmpdir);
    write_file(sf, mf, f32, NULL, KEEP, NULL);
    ck_assert_msg(xtc_session_load_weights(s, f32) == XTC_OK, "%s", xtc_session_error(s));
    /* the same values set one by one: xtc_session_set_weight quantizes them */
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(mf, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor t;
            xtc_module_tensor(mf, (XtcKind)kind, i, &info);
            ck_assert(xtc_session_get_weight(sf, info.name, &t) == XTC_OK);
            ck_assert_msg(xtc_session_set_weight(s2, info.name, t.rank, t.shape, t.data) == XTC_OK, "%s",
                          xtc_session_error(s2));
        }
    float a[200], b[200], fl[200];
    logits(s, a);
    logits(s2, b);
    ck_assert(!memcmp(a, b, sizeof a));
    logits(sf, fl);
    double dmax = 0, fmaxv = 0;
    for (int i = 0; i < 200; i++) {
        dmax = fmax(dmax, fabs(a[i] - fl[i]));
        fmaxv = fmax(fmaxv, fabs(fl[i]));
    }
    ck_assert_msg(dmax > 0 && dmax < 0.05 * fmaxv, "int8 against f32 logits: %g of %g", dmax, fmaxv);
    /* the I8 file the session holds, back: the same logits */
    write_file(s, m, i8, NULL, KEEP, "0");
    ck_assert_msg(xtc_session_load_weights(s2, i8) == XTC_OK, "%s", xtc_session_error(s2));
    logits(s2, b);
    ck_assert(!memcmp(a, b, sizeof a));
    /* a checkpoint of the int8 session loads as weights too */
    char ck[512];
    snprintf(ck, sizeof ck, "%s/ck.safetensors", tmpdir);
    ck_assert_msg(xtc_session_save_checkpoint(s, ck, NULL, NULL, 0) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_msg(xtc_session_load_weights(s2, ck) == XTC_OK, "%s", xtc_session_error(s2));
    logits(s2, b);
    ck_assert(!memcmp(a, b, sizeof a));

    const char *w = "attn_layers.layers.0.1.to_q.weight", *ws = "attn_layers.layers.0.1.to_q.weight.scale";
    write_file(s, m, bad, w, AS_I16, "0");
    expect_refused(s2, bad, "'attn_layers.layers.0.1.to_q.weight' is I16 [128, 16], expected I8 (with its scales) or f32 [128, 16]);", a);
    write_file(s, m, bad, ws, DROP, "0");
    expect_refused(s2, bad, "1 missing ('attn_layers.layers.0.1.to_q.weight.scale')", a);
    write_file(s, m, bad, ws, BAD_SHAPE, "0");
    expect_refused(s2, bad, "1 mis-shaped ('attn_layers.layers.0.1.to_q.weight.scale' is F32 [128, 0], expected f32 [128, 1])", a);
    write_file(s, m, bad, w, BAD_SHAPE, "0");
    expect_refused(s2, bad, "1 mis-shaped ('attn_layers.layers.0.1.to_q.weight' is I8 [128, 15], expected I8 (with its scales) or f32 [128, 16])", a);
    write_file(s, m, bad, w, KEEP, "100000");
    ck_assert_msg(xtc_session_load_weights(s2, bad) == XTC_OK, "%s", xtc_session_error(s2)); /* G >= k: per row */
    write_file(s, m, bad, w, KEEP, "8");
    expect_refused(s2, bad, "was quantized in groups of 8 along k, the module's are of 16", a);
    /* an f32 file with a scale beside a float weight; a NaN in an f32 weight */
    RtStFile *src;
    char err[512];
    ck_assert(rt_st_open(f32, &src, err, sizeof err) == 0);
    RtStWriter *wr = rt_st_writer_new();
    for (int i = 0; i < rt_st_count(src); i++) {
        const RtStTensor *t = rt_st_get(src, i);
        rt_st_writer_add(wr, t->name, t->dtype, t->rank, t->shape, t->data);
    }
    rt_st_writer_add(wr, ws, RT_F32, 2, (int64_t[]){128, 1}, (float[128]){0});
    ck_assert(rt_st_writer_save(wr, bad, err, sizeof err) == 0);
    rt_st_writer_free(wr);
    rt_st_close(src);
    expect_refused(s2, bad, "'attn_layers.layers.0.1.to_q.weight.scale' is given but 'attn_layers.layers.0.1.to_q.weight' "
                   "is not I8", a);
    write_file(sf, mf, bad, w, NAN_AT_0, NULL);
    expect_refused(s2, bad, "weight 'attn_layers.layers.0.1.to_q.weight' holds nan at [0, 0]", a);
    /* groups: the module in groups of 8 loads the f32 file, not the per-row I8 file */
    XtcSession *sg;
    ck_assert(xtc_session_new(mg, NULL, &sg) == XTC_OK);
    ck_assert_msg(xtc_session_load_weights(sg, f32) == XTC_OK, "%s", xtc_session_error(sg));
    ck_assert_int_ne(xtc_session_load_weights(sg, i8), XTC_OK);
    ck_assert_msg(strstr(xtc_session_error(sg), "groups of 0") || strstr(xtc_session_error(sg), "mis-shaped"), "%s",
                  xtc_session_error(sg));
    /* xtc_session_set_weight_i8 and the scales by name */
    XtcTensor q;
    ck_assert(xtc_session_get_weight(s, w, &q) == XTC_OK && q.dtype == XTC_I8);
    ck_assert_int_eq(xtc_session_set_weight_i8(s2, w, q.rank, q.shape, q.data), XTC_OK);
    ck_assert_int_eq(xtc_session_set_weight_i8(s2, "token_emb.weight", q.rank, q.shape, q.data), XTC_ERR_NAME);
    xtc_session_free(sg);
    xtc_session_free(s2);
    xtc_session_free(s);
    xtc_session_free(sf);
    xtc_module_free(mg);
    xtc_module_free(m);
    xtc_module_free(mf);
}
END_TEST

/* ---- the matrix-vector path's int16 products ----
 * Decoding multiplies one row of activations by each int8 weight: with AVX512-BW the row is split
 * into two int16 parts and the products are vpmaddwd/vpdpwssd (cg_llvm_q8.c, the dot products
 * test_models checks against the interpreter); without AVX-512 the weights are widened to f32. */
static int file_has(const char *path, const char *what)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "no %s", path);
    static char text[1 << 22];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = 0;
    return strstr(text, what) != NULL;
}

START_TEST(test_gemv_paths)
{
    static const char *src = "m = TransformerWrapper(num_tokens = 40, max_seq_len = 16,\n"
                             "    attn_layers = Decoder(dim = 64, depth = 1, heads = 2))\n";
    static const struct {
        const char *cpu;
        int i16;
    } cases[] = {{"x86-64-v4", 1}, {"x86-64-v3", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        XtfDiag d;
        xtf_diag_init(&d);
        XtfFile *f = xtf_parse("gemv.xtf", src, strlen(src), &d);
        ck_assert_ptr_nonnull(f);
        xtf_check(f, &d);
        char err[1024], ll[600];
        snprintf(ll, sizeof ll, "%s/gemv.%s.ll", tmpdir, cases[i].cpu);
        CgOptions opt = {.weights_dtype = "int8", .cpu = cases[i].cpu, .emit_llvm = ll, .opt_level = 1};
        DrvTarget t;
        ck_assert_msg(drv_target(&t, &opt, err, sizeof err) == 0, "%s", err);
        DrvJob job = {.file = f, .lower = {.kv_cache = 1}, .cg = opt};
        XtcModule *m = drv_build_load(&job, &t, NULL, err, sizeof err);
        ck_assert_msg(m != NULL, "%s", err);
        xtc_module_free(m);
        /* f32 caches: the attention's int8-key scores (which use it too) are not in this module */
        ck_assert_msg(file_has(ll, "llvm.x86.avx512.pmaddw.d.512") == cases[i].i16, "%s: int16 products %s", cases[i].cpu,
                      cases[i].i16 ? "missing" : "used without AVX512-BW");
        xtf_free(f);
        xtf_diag_free(&d);
    }
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_refusals)
{
    char err[512];
    DrvTarget t;
    ck_assert_int_ne(drv_target(&t, &(CgOptions){.target = "cuda-emu", .weights_dtype = "int8"}, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "the cuda-emu backend has no int8 matmul"), "%s", err);
    ck_assert_int_ne(drv_target(&t, &(CgOptions){.weights_dtype = "int8", .mma = CG_MMA_BF16}, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "computes in f32"), "%s", err);
    ck_assert_int_ne(drv_target(&t, &(CgOptions){.weights_dtype = "int4"}, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "expected f32 or int8, got 'int4'"), "%s", err);
    ck_assert_int_ne(drv_target(&t, &(CgOptions){.quant_group = 32}, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "--group applies to --weights-dtype int8"), "%s", err);
    /* training */
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", TINY, strlen(TINY), &d);
    xtf_check(f, &d);
    ck_assert(drv_target(&t, &(CgOptions){.weights_dtype = "int8"}, err, sizeof err) == 0);
    XtLowerOpts lo = {.train = 1};
    ck_assert_ptr_null(harness_build(f, NULL, &lo, 1, &t, NULL, NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "--weights-dtype int8 is for inference"), "%s", err);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("int8");
    TCase *tc = tcase_create("int8");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_quantize_rule);
    tcase_add_test(tc, test_weights_files);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_gemv_paths);
    tcase_add_test(tc, test_models);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return harness_run(suite(), "int8"); }
