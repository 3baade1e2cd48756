/* test_kv_cache.c: incremental decoding with a KV cache (xt_lower with .kv_cache) gives the
 * logits of full recomputation, through the reference interpreter: a prompt call with an
 * empty cache, then one token per call, for models whose attention depends on positions in
 * every way the lowering supports (absolute, rotary, T5 buckets, PIA, memory key/values), and
 * with grouped or single key/value heads (x-transformers 1.x and 2.x), the cache sized by them,
 * and rotary_xpos (keys scaled by their absolute positions); int8 caches at every context 1..40.
 * The same decoding through compiled modules, CPU and emulated CUDA, with the caches carried
 * from call to call by xtc_session_carry (on the CPU appended in place, on the device copied there
 * without crossing the bus), gives those logits and, after the last call, those caches too; with
 * the caches stored in bf16 (--kv-dtype bf16), the logits of the interpreter decoding with them
 * rounded to bf16. Cosine-sim attention decodes with its bound (the cache holds normalised keys).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen.h"
#include "gpu.h"
#include "harness.h"
#include "harness_drive.h"
#include "harness_kv.h"
#include "init.h"
#include "ir.h"
#include "passes.h"
#include "rt_cuda.h"
#include "rt_half.h"
#include "rt_session.h"
#include "xtc.h"
#include "xtf.h"

#define MAXT 64

typedef struct {
    const IrGraph *g;
    float **w;              /* per parameter name, shared by both graphs: indexed by name hash */
    const char **names;
    int nw;
    int64_t *tokens, b, n;
    float *cache[MAXT];     /* cache.<l>.k/.v by input order */
    const char *cache_names[MAXT];
    int64_t cache_shape[MAXT][4];
    int ncache;
} Bind;

/* frees what a Bind holds: its weights, and with caches its cache buffers */
static void bind_free(Bind *b, int caches)
{
    for (int c = 0; caches && c < b->ncache; c++)
        free(b->cache[c]);
    for (int i = 0; i < b->nw; i++)
        free(b->w[i]);
    free(b->w);
    free(b->names);
}

static int bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Bind *b = ctx;
    memset(out, 0, sizeof *out);
    if (leaf->op == IR_INPUT && !strcmp(leaf->s, "tokens")) {
        out->dtype = IR_I64;
        out->rank = 2;
        out->shape[0] = b->b;
        out->shape[1] = b->n;
        out->data = b->tokens;
        return 0;
    }
    if (leaf->op == IR_INPUT) {
        for (int i = 0; i < b->ncache; i++)
            if (!strcmp(b->cache_names[i], leaf->s)) {
                out->dtype = IR_F32;
                out->rank = 4;
                memcpy(out->shape, b->cache_shape[i], sizeof b->cache_shape[i]);
                out->data = b->cache[i];
                return 0;
            }
        return -1;
    }
    for (int i = 0; i < b->nw; i++)
        if (!strcmp(b->names[i], leaf->s)) {
            out->dtype = IR_F32;
            out->rank = leaf->rank;
            for (int d = 0; d < leaf->rank; d++)
                out->shape[d] = leaf->shape[d].c;
            out->data = b->w[i];
            return 0;
        }
    return -1;
}

static IrGraph *lower(const char *src, int kv)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("t.xtf", src, strlen(src), &d);
    ck_assert_ptr_nonnull(f);
    xtf_check(f, &d);
    XtLowerOpts o = {.kv_cache = kv};
    char err[512];
    IrGraph *g = d.nerrors ? NULL : harness_build(f, NULL, &o, 0, harness_target("cpu"), NULL, &d, err, sizeof err);
    if (!g)
        ck_abort_msg("%s", d.text ? d.text : err);
    xtf_diag_free(&d);
    xtf_free(f);
    return g;
}

/* weights for every parameter/buffer of g, seeded, perturbed away from special values */
static void make_weights(const IrGraph *g, Bind *b)
{
    RtRng rng;
    rt_rng_seed(&rng, 7);
    b->w = calloc((size_t)g->nnodes, sizeof *b->w);
    b->names = calloc((size_t)g->nnodes, sizeof *b->names);
    for (int i = 0; i < g->nnodes; i++) {
        IrNode *n = g->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        int64_t shape[IR_MAXRANK], numel = 1;
        for (int d = 0; d < n->rank; d++)
            numel *= shape[d] = n->shape[d].c;
        float *w = malloc((size_t)numel * sizeof *w);
        const IrInit *rule = ir_find_init(g, n);
        ck_assert_msg(rule, "%s has no init rule", n->s);
        rt_init_by_name(ir_init_name(rule->kind), rule->value, n->rank, shape, w, &rng);
        if (n->op == IR_PARAM)
            for (int64_t k = 0; k < numel; k++)
                w[k] += (float)(0.05 * rt_rng_normal(&rng));
        b->names[b->nw] = n->s;
        b->w[b->nw++] = w;
    }
}

/* rows of D values read back from a cache stored as int8 rows: each an int8 row times its scale,
 * so quantized again it gives itself */
static void expect_int8_rows(const char *name, const float *v, int64_t rows, int64_t D)
{
    float x[512];
    char row[512 + 4];
    ck_assert(D > 0 && D <= 512);
    for (int64_t r = 0; r < rows; r++) {
        rt_i8_row_quantize(v + r * D, D, row);
        rt_i8_row_widen(row, D, x);
        for (int64_t i = 0; i < D; i++)
            ck_assert_msg(x[i] == v[r * D + i], "%s row %lld: %.9g is not an int8 value times the row's scale", name,
                          (long long)r, v[r * D + i]);
    }
}

/* Decodes tok[0, T) with the step graph compiled for target ("cpu", "cuda-emu", "cuda"), as `xtc
 * generate` does: the prompt (PROMPT tokens) on empty caches, then a token per call, each call's
 * caches carried into the next. Returns the largest difference from the reference logits ref
 * [1, T, V]; the CPU's caches must have stayed in place for most calls. mma: CgOptions.mma (bf16
 * matmuls on the CPU: the last caches then within 2e-2 of their largest value, else 1e-4); dtype:
 * CgOptions.dtype; kv: 0, or compiled with --kv-dtype bf16 and the caches expected in bf16 (1:
 * every value read back is a bf16 value, the last caches within 2^-8 of each value, one unit of
 * bf16, where the reference rounded them too) or in f32 (-1: a reader other than attention);
 * 2 / -2 the same with --kv-dtype int8 (every row read back an int8 row times its scale, the
 * last caches within one unit, max|row| / 127, of the reference's);
 * cpu_name: --cpu (NULL: this one; a CPU this one cannot run: -1 with a message, not run). */
static double decode_compiled(const IrGraph *step, const Bind *w, const int64_t *tok, int T, int PROMPT,
                              const IrHostTensor *ref, const char *target, int mma, const char *dtype, int kv,
                              const char *cpu_name)
{
    char err[1024], path[600];
    int cpu = !strcmp(target, "cpu"), emu = !strcmp(target, "cuda-emu");
    PassOptions po = {.verify_each = 1};
    IrGraph *h = harness_passes((IrGraph *)step, target, &po, err, sizeof err);
    ck_assert_msg(h != NULL, "passes: %s", err);
    harness_make_tmpdir("kv_cache");
    snprintf(path, sizeof path, "%s/step_%s.so", tmpdir, target);
    CgOptions opt = {.output = path, .target = cpu ? NULL : target, .opt_level = 1, .source = "# test\n",
                     .source_name = "t.xtf", .mma = mma, .dtype = dtype, .kv_dtype = kv ? (abs(kv) == 2 ? "int8" : "bf16") : NULL, .cpu = cpu_name};
    CgStats st;
    ck_assert_msg(harness_cg(h, &opt, &st, err, sizeof err) == 0, "%s: %s", target, err);
    ir_graph_free(h);
    XtcModule *m = NULL;
    int lrc = xtc_module_load(path, &m);
    unlink(path);
    if (lrc != XTC_OK && cpu_name) {
        fprintf(stderr, "test_kv_cache: --cpu=%s not run here: %s\n", cpu_name, xtc_module_error(m));
        xtc_module_free(m);
        return -1;
    }
    ck_assert_msg(lrc == XTC_OK, "%s", xtc_module_error(m));
    if (dtype) /* the weights are stored in bf16 (metadata "storage" records) */
        ck_assert_msg(strstr(xtc_module_metadata(m), "\nstorage ") != NULL, "%s --dtype %s: no weight stored in 16 bits",
                      target, dtype);
    int kv16 = kv == 1, kv8 = kv == 2;
    const char *kvname = abs(kv) == 2 ? "int8" : "bf16";
    char kvmeta[32];
    snprintf(kvmeta, sizeof kvmeta, "kv_dtype %s", kvname);
    if (kv)
        ck_assert_msg((strstr(xtc_module_metadata(m), kvmeta) != NULL) == (kv > 0), "--kv-dtype %s: caches %s", kvname,
                      kv > 0 ? "not stored so" : "stored so although something other than attention reads them");
    XtcSession *s = NULL;
    setenv("XTC_CUDA_CALLS", "1", 1); /* the driver calls of each call, counted (rt_cuda_calls.c) */
    ck_assert_msg(xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s) == XTC_OK, "%s", xtc_session_error(s));
    for (int i = 0; i < step->nnodes; i++) {
        const IrNode *n = step->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        int64_t shape[IR_MAXRANK];
        for (int d = 0; d < n->rank; d++)
            shape[d] = n->shape[d].c;
        for (int k = 0; k < w->nw; k++)
            if (!strcmp(w->names[k], n->s))
                ck_assert_msg(xtc_session_set_weight(s, n->s, n->rank, shape, w->w[k]) == XTC_OK, "%s",
                              xtc_session_error(s));
    }
    float dummy = 0;
    for (int c = 0; c < w->ncache; c++)
        ck_assert_msg(xtc_session_set_input(s, w->cache_names[c], XTC_F32, 4,
                                            (int64_t[]){1, 0, w->cache_shape[c][2], w->cache_shape[c][3]}, &dummy) == XTC_OK,
                      "%s", xtc_session_error(s));
    int64_t V = ref->shape[2];
    const float *rf = ref->data;
    const void *where[MAXT] = {0};
    int calls = 0, stayed = 0, copyless = 0;
    double worst = 0;
    uint64_t first[3] = {0}; /* emulated CUDA: the bytes copied each way by the second call */
    for (int pos = 0; pos < T; calls++) {
        int64_t n = pos == 0 ? PROMPT : 1;
        uint64_t t0[3], t1[3];
        RtCuCalls k0, k1;
        rt_cu_calls(&k0);
        rt_cu_emu_traffic(t0);
        ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, n}, tok + pos), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s at %d: %s", target, pos, xtc_session_error(s));
        XtcTensor lg;
        ck_assert_int_eq(xtc_session_get_output(s, "logits", &lg), XTC_OK);
        rt_cu_emu_traffic(t1);
        rt_cu_calls(&k1);
        if (emu && calls > 0) { /* a token's call: the token up, the launches, the status words and
                                 * the logits down, two synchronisations (the run's, the fetch's);
                                 * an allocation only where the arena is outgrown (and
                                 * synchronised before the old one is freed) */
            uint64_t c[RT_CU_NCALLS];
            for (int k = 0; k < RT_CU_NCALLS; k++)
                c[k] = k1.calls[k] - k0.calls[k];
            expect_msg(c[RT_CU_CALL_ALLOC] <= 1 && c[RT_CU_CALL_FREE] == c[RT_CU_CALL_ALLOC] &&
                           c[RT_CU_CALL_SYNC] <= 2 + c[RT_CU_CALL_FREE] && c[RT_CU_CALL_HTOD] == 1 &&
                           c[RT_CU_CALL_DTOH] == 2 && c[RT_CU_CALL_DTOD] == 0,
                       "%s at %d: a token's call allocated %llu, freed %llu, synchronised %llu times, copied %llu up, "
                       "%llu down, %llu on the device",
                       target, pos, (unsigned long long)c[RT_CU_CALL_ALLOC], (unsigned long long)c[RT_CU_CALL_FREE],
                       (unsigned long long)c[RT_CU_CALL_SYNC], (unsigned long long)c[RT_CU_CALL_HTOD],
                       (unsigned long long)c[RT_CU_CALL_DTOH], (unsigned long long)c[RT_CU_CALL_DTOD]);
        }
        if (emu && calls == 1)
            for (int k = 0; k < 2; k++)
                first[k] = t1[k] - t0[k];
        /* one token a call: the caches stay on the device (carried there), so what crosses the
         * bus (the token up, the logits and status words down) does not grow with them */
        if (emu && calls > 1)
            for (int k = 0; k < 2; k++)
                ck_assert_msg(t1[k] - t0[k] == first[k], "%s at %d: %llu bytes %s, %llu in the second call", target,
                              pos, (unsigned long long)(t1[k] - t0[k]), k ? "to the host" : "to the device",
                              (unsigned long long)first[k]);
        for (int64_t t = 0; t < n; t++)
            for (int64_t v = 0; v < V; v++) {
                double e = fabs((double)((const float *)lg.data)[t * V + v] - rf[(pos + t) * V + v]);
                worst = e > worst ? e : worst;
            }
        for (int c = 0; c < w->ncache; c++) {
            XtcTensor ct;
            ck_assert_int_eq(xtc_session_get_output(s, w->cache_names[c], &ct), XTC_OK);
            ck_assert_int_eq(ct.shape[1], pos + n);
            const float *cv = ct.data;
            for (int64_t i = 0; kv16 && i < ct.shape[1] * ct.shape[2] * ct.shape[3]; i++)
                ck_assert_msg(rt_bf16_to_f32(rt_f32_to_bf16(cv[i])) == cv[i], "%s[%lld] = %.9g: not a bf16 value",
                              w->cache_names[c], (long long)i, cv[i]);
            if (kv8)
                expect_int8_rows(w->cache_names[c], cv, ct.shape[1] * ct.shape[2], ct.shape[3]);
            XtcTensor raw; /* where the session keeps it (the API's f32 copy of a bf16 one is elsewhere) */
            ck_assert_int_eq(rs_get_output(s, w->cache_names[c], &raw, 0), XTC_OK);
            stayed += calls > 0 && raw.data == where[c];
            where[c] = raw.data;
            if (pos + n == T) { /* the last call: the caches of the interpreter's decoding */
                int64_t numel = T * ct.shape[2] * ct.shape[3];
                double tol = 1e-4;
                for (int64_t i = 0; (mma == CG_MMA_BF16 || dtype) && i < numel; i++)
                    tol = fmax(tol, 2e-2 * fabs(w->cache[c][i]));
                for (int64_t i = 0; kv16 && !dtype && mma != CG_MMA_BF16 && i < numel; i++)
                    tol = fmax(tol, 0x1p-8 * fabs(w->cache[c][i]) * 1.0001);
                for (int64_t i = 0; kv8 && !dtype && mma != CG_MMA_BF16 && i < numel; i++)
                    tol = fmax(tol, fabs(w->cache[c][i]) / 127 * 1.0001);
                for (int64_t i = 0; i < numel; i++)
                    expect_msg(fabs(((const float *)ct.data)[i] - w->cache[c][i]) < tol, "%s: %s[%lld] %g, expected %g",
                               target, w->cache_names[c], (long long)i, ((const float *)ct.data)[i], w->cache[c][i]);
            }
        }
        uint64_t c0[3], c1[3];
        rt_cu_emu_traffic(c0);
        for (int c = 0; c < w->ncache; c++)
            ck_assert_msg(xtc_session_carry(s, w->cache_names[c], w->cache_names[c]) == XTC_OK, "%s",
                          xtc_session_error(s));
        rt_cu_emu_traffic(c1);
        copyless += c1[2] == c0[2];
        pos += (int)n;
    }
    if (cpu) /* the first two calls write apart, then the caches grow in place, but for the calls
              * that outgrow their room (a quarter more each time: with these tiny caches, every
              * other call) */
        ck_assert_msg(stayed >= 2 * w->ncache, "%s: caches in place %d times of %d", target, stayed,
                      w->ncache * (calls - 1));
    else if (emu) /* on the device the carries copy nothing once the runs append over the caches */
        ck_assert_msg(copyless >= 3, "%s: %d of %d calls' carries copied nothing", target, copyless, calls);
    xtc_session_free(s);
    xtc_module_free(m);
    return worst;
}

/* Decodes tok[0, T) with the step graph on the interpreter (the prompt, then a token per call),
 * the caches of the last call left in b; rounded: each cache (the concat of the cache carried in
 * and the call's rows) rounded to bf16 as the CPU stores it under --kv-dtype bf16 (rounded 1) or
 * to int8 rows (2, --kv-dtype int8). Returns the
 * largest difference from the reference logits ref [1, T, V]; logits (T V floats, or NULL) gets
 * the decoding's. */
static void round_caches(void *ctx, const IrNode *n, double *v, int64_t count)
{
    int int8 = *(const int *)ctx == 2; /* else bf16 */
    if (!(n->op == IR_CONCAT && n->in[0]->op == IR_INPUT && !strncmp(n->in[0]->s, "cache.", 6)))
        return;
    if (int8) {
        harness_round_rows_int8(v, count, n->shape[n->rank - 1].c);
        return;
    }
    for (int64_t i = 0; i < count; i++)
        v[i] = rt_bf16_to_f32(rt_f32_to_bf16((float)v[i]));
}

static double interp_decode(const IrGraph *step, Bind *b, const int64_t *tok, int T, int PROMPT, const IrHostTensor *ref,
                            int rounded, float *logits)
{
    char err[512];
    int64_t V = ref->shape[2];
    for (int c = 0; c < b->ncache; c++)
        free(b->cache[c]);
    b->ncache = 0;
    /* the cache inputs, empty at first */
    for (int i = 0; i < step->nnodes; i++) {
        IrNode *n = step->nodes[i];
        if (n->op == IR_INPUT && !strncmp(n->s, "cache.", 6)) {
            b->cache_names[b->ncache] = n->s;
            b->cache_shape[b->ncache][0] = 1;
            b->cache_shape[b->ncache][1] = 0; /* [b, c, h, dh]: positions second */
            b->cache_shape[b->ncache][2] = n->shape[2].c;
            b->cache_shape[b->ncache][3] = n->shape[3].c;
            b->cache[b->ncache++] = NULL;
        }
    }
    ck_assert_int_gt(b->ncache, 0);
    IrHostTensor *outs = calloc((size_t)step->noutputs, sizeof *outs);
    double worst = 0;
    for (int pos = 0; pos < T;) {
        int n = pos == 0 ? PROMPT : 1;
        b->g = step;
        b->n = n;
        b->tokens = (int64_t *)tok + pos;
        if ((rounded ? ir_interp_rounded(step, bind, b, round_caches, &rounded, outs, err, sizeof err)
                     : ir_interp(step, bind, b, outs, err, sizeof err)) != 0)
            ck_abort_msg("step at %d: %s", pos, err);
        const float *lg = outs[0].data, *rf = ref->data;
        for (int t = 0; t < n; t++)
            for (int64_t v = 0; v < V; v++)
                worst = fmax(worst, fabs((double)lg[t * V + v] - rf[(pos + t) * V + v]));
        if (logits)
            memcpy(logits + pos * V, lg, (size_t)(n * V) * sizeof *lg);
        /* the new caches become the next inputs */
        for (int c = 0; c < b->ncache; c++) {
            free(b->cache[c]);
            for (int o = 1; o < step->noutputs; o++)
                if (!strcmp(step->outputs[o].name, b->cache_names[c])) {
                    b->cache[c] = outs[o].data;
                    outs[o].data = NULL;
                    b->cache_shape[c][1] = outs[o].shape[1];
                }
        }
        for (int o = 0; o < step->noutputs; o++)
            ir_host_free(&outs[o]);
        pos += n;
    }
    free(outs);
    return worst;
}

/* KV caches stored as int8 rows (--kv-dtype int8, f32 weights and matmuls): decoding (a prompt of
 * `prompt` rows, more than the attention's few-rows path reads in place, then a token a call)
 * against the interpreter decoding with the same caches rounded to int8 rows, within 2e-3 of the
 * largest logit (the f32 sums put a value on the other side of a rounding boundary now and then:
 * one unit, max|row| / 127); for this CPU and, with wide, for x86-64-v3 (8-float vectors: the
 * scalar few-rows loops). kv8 0: something other than attention reads the caches, which stay
 * f32: recomputation's logits. */
static void check_int8_caches(const IrGraph *step, Bind *b, const int64_t *tok, int T, int prompt, const IrHostTensor *ref,
                              int kv8, int wide)
{
    clock_t t0 = clock();
    int64_t V = ref->shape[2];
    double maxlogit = 0;
    for (int64_t i = 0; i < T * V; i++)
        maxlogit = fmax(maxlogit, fabs(((const float *)ref->data)[i]));
    IrHostTensor rref = *ref;
    rref.data = malloc((size_t)(T * V) * sizeof(float));
    double er = interp_decode(step, b, tok, T, prompt, ref, kv8 ? 2 : 0, rref.data);
    double ek = decode_compiled(step, b, tok, T, prompt, &rref, "cpu", CG_MMA_AUTO, NULL, kv8 ? 2 : -2, NULL);
    if (kv8 && wide)
        ek = fmax(ek, decode_compiled(step, b, tok, T, prompt, &rref, "cpu", CG_MMA_AUTO, NULL, 2, "x86-64-v3"));
    fprintf(stderr, "test_kv_cache: %s caches: decoding within %.2g of the interpreter's%s, which is within %.2g of "
            "recomputation (of max|logit| %.3g; %.1f s CPU)\n", kv8 ? "int8" : "f32 (kept)", ek / maxlogit,
            kv8 ? " rounded so" : "", er / maxlogit, maxlogit, (double)(clock() - t0) / CLOCKS_PER_SEC);
    ck_assert_msg(ek <= (kv8 ? 2e-3 * maxlogit : 1e-4), "cpu --kv-dtype int8: decoding differs from the interpreter's "
                  "by %g (max|logit| %g)", ek, maxlogit);
    ck_assert_msg(!kv8 || er > 1e-5 * maxlogit, "caches rounded to int8 gave the f32 logits (%g): were they rounded?", er);
    free(rref.data);
}

/* The whole sequence tok[0..T) through the full (uncached) graph: the reference that cached
 * decoding must reproduce; leaves b bound to the full graph at batch 1. */
static void full_reference(IrGraph *full, Bind *b, int64_t *tok, int T, IrHostTensor *ref)
{
    char err[512];
    b->g = full;
    b->b = 1;
    b->n = T;
    b->tokens = tok;
    if (ir_interp(full, bind, b, ref, err, sizeof err) != 0)
        ck_abort_msg("full: %s", err);
}

/* kv16: whether --kv-dtype bf16 stores this model's caches in bf16 (only attention reads them) */
static void check_model_kv(const char *src, int kv16)
{
    IrGraph *full = lower(src, 0), *step = lower(src, 1);
    Bind b = {0};
    make_weights(full, &b);
    enum { T = 9, PROMPT = 4 };
    int64_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 7 + 3) % 64;

    /* full recomputation */
    IrHostTensor ref;
    full_reference(full, &b, tok, T, &ref);
    int64_t V = ref.shape[2];

    double worst = interp_decode(step, &b, tok, T, PROMPT, &ref, 0, NULL);
    ck_assert_msg(worst < 1e-4, "cached decoding differs from recomputation by %g", worst);
    static const char *targets[] = {"cpu", "cuda-emu", "cuda"}; /* "cuda" on a machine with a GPU */
    char why[1200];
    for (int t = 0; t < 2 + gpu_present(why, sizeof why); t++) {
        double e = decode_compiled(step, &b, tok, T, PROMPT, &ref, targets[t], CG_MMA_AUTO, NULL, 0, NULL);
        ck_assert_msg(e < 1e-4, "%s: cached decoding differs from recomputation by %g", targets[t], e);
    }
    /* bf16 matmuls on the CPU (--mma=bf16): within 2e-2 of the largest logit, as test_cpu_bf16's
     * parity bound, and not the f32 logits */
    double maxlogit = 0;
    for (int64_t i = 0; i < T * V; i++)
        maxlogit = fmax(maxlogit, fabs(((const float *)ref.data)[i]));
    double e16 = decode_compiled(step, &b, tok, T, PROMPT, &ref, "cpu", CG_MMA_BF16, NULL, 0, NULL);
    fprintf(stderr, "test_kv_cache: bf16 matmuls: decoding within %.2g of max|logit| %.3g\n", e16 / maxlogit, maxlogit);
    ck_assert_msg(e16 <= 2e-2 * maxlogit && e16 > 0, "cpu --mma=bf16: decoding differs from recomputation by %g (max|logit| %g)",
                  e16, maxlogit);
    /* bf16 weights (--dtype bf16: stored rounded, read by bf16 matmuls; the matrix-vector path
     * reads them as stored and sums in another order): within the same bound */
    double ew = decode_compiled(step, &b, tok, T, PROMPT, &ref, "cpu", CG_MMA_AUTO, "bf16", 0, NULL);
    fprintf(stderr, "test_kv_cache: bf16 weights: decoding within %.2g of max|logit| %.3g\n", ew / maxlogit, maxlogit);
    ck_assert_msg(ew <= 2e-2 * maxlogit && ew > 0, "cpu --dtype bf16: decoding differs from recomputation by %g (max|logit| %g)",
                  ew, maxlogit);
    /* KV caches stored in bf16 (--kv-dtype bf16; f32 weights and matmuls): the logits of the
     * interpreter's decoding with the same caches rounded to bf16, within 1e-3 of the largest
     * (the f32 sums, and a value on either side of a bf16 rounding boundary); that rounding
     * itself moves them from recomputation's by more than f32 arithmetic does. Where something
     * other than attention reads the caches (kv16 0), they stay f32: recomputation's logits. */
    IrHostTensor rref = ref;
    rref.data = malloc((size_t)(T * V) * sizeof(float));
    enum { PROMPT_LONG = 5 }; /* more rows than the attention's few-rows path: k and v packed from bf16 */
    double er = interp_decode(step, &b, tok, T, PROMPT_LONG, &ref, kv16, rref.data);
    double ek = decode_compiled(step, &b, tok, T, PROMPT_LONG, &rref, "cpu", CG_MMA_AUTO, NULL, kv16 ? 1 : -1, NULL);
    if (kv16) /* ... with 8-float vectors (AVX2: the widening takes 8 values at a time) */
        ek = fmax(ek, decode_compiled(step, &b, tok, T, PROMPT_LONG, &rref, "cpu", CG_MMA_AUTO, NULL, 1, "x86-64-v3"));
    fprintf(stderr, "test_kv_cache: %s caches: decoding within %.2g of the interpreter's%s, which is within %.2g of "
            "recomputation (of max|logit| %.3g)\n", kv16 ? "bf16" : "f32 (kept)", ek / maxlogit, kv16 ? " rounded so" : "",
            er / maxlogit, maxlogit);
    ck_assert_msg(ek <= (kv16 ? 1e-3 * maxlogit : 1e-4), "cpu --kv-dtype bf16: decoding differs from the interpreter's "
                  "by %g (max|logit| %g)", ek, maxlogit);
    ck_assert_msg(!kv16 || er > 1e-5 * maxlogit, "caches rounded to bf16 gave the f32 logits (%g): were they rounded?", er);
    free(rref.data);
    check_int8_caches(step, &b, tok, T, PROMPT_LONG, &ref, kv16, 1); /* int8 rows: the same caches as bf16 */
    bind_free(&b, 1);
    ir_host_free(&ref);
    ir_graph_free(full);
    ir_graph_free(step);
}

static void check_model(const char *src) { check_model_kv(src, 0); }

#define MODEL(layers) \
    "m = TransformerWrapper(num_tokens = 64, max_seq_len = 32, attn_layers = Decoder(" layers "))\n"

START_TEST(absolute_positions) { check_model_kv(MODEL("dim = 16, depth = 2, heads = 2, attn_dim_head = 8"), 1); }
END_TEST

START_TEST(rotary) { check_model_kv(MODEL("dim = 32, depth = 2, heads = 2, attn_dim_head = 64, rotary_pos_emb = true"), 1); }
END_TEST

START_TEST(rel_pos_and_mem_kv)
{
    check_model(MODEL("dim = 16, depth = 1, heads = 2, attn_dim_head = 8, rel_pos_bias = true,"
                      " rel_pos_num_buckets = 8, rel_pos_max_distance = 16, attn_num_mem_kv = 2"));
}
END_TEST

START_TEST(pia_talking_heads_residual_attn)
{
    check_model(MODEL("dim = 16, depth = 2, heads = 2, attn_dim_head = 8, position_infused_attn = true,"
                      " attn_talking_heads = true, residual_attn = true, attn_qk_norm = true"));
}
END_TEST

/* grouped-query attention of x-transformers 2.26.4 (4 query heads over 2 key/value heads, rotary
 * on interleaved pairs, SwiGLU, RMSNorm): the cache holds the 2 key/value heads, not 4 */
#define XT2 "xtransformers = \"2.26.4\"\n"
START_TEST(grouped_kv_heads_2x)
{
    const char *src = XT2 MODEL("dim = 16, depth = 2, heads = 4, attn_kv_heads = 2, attn_dim_head = 8,"
                                " rotary_pos_emb = true, ff_swish = true, ff_glu = true, use_rmsnorm = true");
    IrGraph *step = lower(src, 1);
    IrNode *ck = ir_find_leaf(step, IR_INPUT, "cache.0.k");
    ck_assert_ptr_nonnull(ck);
    ck_assert_int_eq(ck->rank, 4);
    ck_assert_int_eq(ck->shape[2].c, 2); /* [b, c, kv_heads, dim_head] */
    ir_graph_free(step);
    check_model_kv(src, 1); /* attention reads the 2 heads in place (kv_groups): caches in bf16 */
}
END_TEST

START_TEST(one_kv_head_1x)
{
    check_model_kv("xtransformers = \"1.29.2\"\n"
                   MODEL("dim = 16, depth = 1, heads = 2, attn_one_kv_head = true, attn_dim_head = 32,"
                         " rotary_pos_emb = true"), 1);
}
END_TEST

/* rotary_xpos (2.x): the cached keys keep the scale of their own positions, the new queries
 * take theirs; scale_base 8 so that 32 positions scale q and k by up to 0.29^+-2; grouped key/values
 * read in place (pass kv_groups), so their caches can be bf16 */
START_TEST(xpos_2x)
{
    check_model_kv(XT2 MODEL("dim = 16, depth = 2, heads = 4, attn_kv_heads = 2, attn_dim_head = 8,"
                             " rotary_xpos = true, rotary_xpos_scale_base = 8"), 1);
}
END_TEST

/* int8 caches (--kv-dtype int8) decoded one token a call from a 1-token prompt to 40 positions, so
 * the few-rows path's 4-key loop meets every remainder and rows near its prefetch distance; heads of
 * 32, 64 and 96 (multiples of 32: int8 keys' scores as int16 products where the CPU has AVX512-BW)
 * and 48 (the widening path), one with grouped key/values; against the interpreter rounding the
 * caches the same way (check_int8_caches) */
START_TEST(int8_every_context)
{
    static const char *const layers[] = {
        "dim = 16, depth = 1, heads = 2, attn_dim_head = 32",
        "dim = 16, depth = 1, heads = 2, attn_dim_head = 48",
        "dim = 16, depth = 1, heads = 1, attn_dim_head = 64",
        "dim = 16, depth = 1, heads = 4, attn_kv_heads = 2, attn_dim_head = 96",
    };
    enum { T = 41 };
    int64_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 11 + 5) % 64;
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        char src[512];
        snprintf(src, sizeof src, "%sm = TransformerWrapper(num_tokens = 64, max_seq_len = 48, attn_layers = Decoder(%s))\n",
                 strstr(layers[i], "kv_heads") ? XT2 : "", layers[i]);
        IrGraph *full = lower(src, 0), *step = lower(src, 1);
        Bind b = {0};
        make_weights(full, &b);
        IrHostTensor ref;
        full_reference(full, &b, tok, T, &ref);
        check_int8_caches(step, &b, tok, T, 1, &ref, 1, 0);
        bind_free(&b, 1);
        ir_host_free(&ref);
        ir_graph_free(full);
        ir_graph_free(step);
    }
}
END_TEST

/* The pairing cosine_sim reads, on IR text: a cache input is bounded by the rows appended to it
 * only where the output of its own name is that append (a: bound 1, the claim printed and read
 * back as "rownorm %ka = 1"); appended to but carried out under another name (b), or appended rows
 * with no bound (c): no bound, no claim. */
static const char *const pairs_ir =
    "graph pairs(b, n <= 8, c <= 8) {\n"
    "  %x = input \"q\" : f32[b, n, 4]\n"
    "  %y = input \"k\" : f32[b, n, 4]\n"
    "  %ka = input \"a\" : f32[b, c, 4]\n"
    "  %kb = input \"b\" : f32[b, c, 4]\n"
    "  %kc = input \"c\" : f32[b, c, 4]\n"
    "  %eps = const 1e-12 : f32[]\n"
    "  %scale = const 10 : f32[]\n"
    "  %xx = mul %x, %x : f32[b, n, 4]\n"
    "  %xs = sum %xx [axis=2] : f32[b, n, 1]\n"
    "  %xr = sqrt %xs : f32[b, n, 1]\n"
    "  %xm = max %xr, %eps : f32[b, n, 1]\n"
    "  %q = div %x, %xm : f32[b, n, 4]\n"
    "  %yy = mul %y, %y : f32[b, n, 4]\n"
    "  %ys = sum %yy [axis=2] : f32[b, n, 1]\n"
    "  %yr = sqrt %ys : f32[b, n, 1]\n"
    "  %ym = max %yr, %eps : f32[b, n, 1]\n"
    "  %k = div %y, %ym : f32[b, n, 4]\n"
    "  %a = concat %ka, %k [axis=1] : f32[b, n+c, 4]\n"
    "  %bb = concat %kb, %k [axis=1] : f32[b, n+c, 4]\n"
    "  %cc = concat %kc, %y [axis=1] : f32[b, n+c, 4]\n"
    "  %qa = matmul %q, %a [transpose_b=1] : f32[b, n, n+c]\n"
    "  %da = mul %qa, %scale : f32[b, n, n+c]\n"
    "  %wa = softmax %da : f32[b, n, n+c]\n"
    "  %oa = matmul %wa, %a [transpose_b=0] : f32[b, n, 4]\n"
    "  %qb = matmul %q, %bb [transpose_b=1] : f32[b, n, n+c]\n"
    "  %db = mul %qb, %scale : f32[b, n, n+c]\n"
    "  %wb = softmax %db : f32[b, n, n+c]\n"
    "  %ob = matmul %wb, %bb [transpose_b=0] : f32[b, n, 4]\n"
    "  %qc = matmul %q, %cc [transpose_b=1] : f32[b, n, n+c]\n"
    "  %dc = mul %qc, %scale : f32[b, n, n+c]\n"
    "  %wc = softmax %dc : f32[b, n, n+c]\n"
    "  %oc = matmul %wc, %cc [transpose_b=0] : f32[b, n, 4]\n"
    "  output oa = %oa\n"
    "  output ob = %ob\n"
    "  output oc = %oc\n"
    "  output a = %a\n"
    "  output b_next = %bb\n"
    "  output c = %cc\n"
    "}\n";

START_TEST(cosine_sim_pairs)
{
    char err[512];
    IrGraph *g = ir_parse(pairs_ir, "pairs.ir", err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    IrGraph *h = harness_passes(g, NULL, NULL, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    static const char *const outs[] = {"oa", "ob", "oc"};
    for (int o = 0; o < h->noutputs; o++)
        for (int i = 0; i < 3; i++)
            if (!strcmp(h->outputs[o].name, outs[i])) {
                const IrNode *at = h->outputs[o].node;
                ck_assert_msg(at->op == IR_ATTENTION, "%s: %s", outs[i], ir_ops[at->op].name);
                ck_assert_msg(at->ia[IR_IA_BOUND] == (i == 0), "%s: bound=%lld", outs[i], (long long)at->ia[IR_IA_BOUND]);
            }
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "a")) == 1);
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "b")) == 0);
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "c")) == 0);
    /* the claim in the text form: "rownorm %ka = 1", read back the same */
    char *text = ir_print_str(h);
    ck_assert_msg(strstr(text, "\n  rownorm %ka = 1\n") != NULL, "%s", text);
    IrGraph *r = ir_parse(text, "pairs_after.ir", err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    ck_assert(ir_find_row_norm(r, ir_find_leaf(r, IR_INPUT, "a")) == 1);
    char *again = ir_print_str(r);
    ck_assert_str_eq(again, text);
    free(again);
    free(text);
    ir_graph_free(r);
    ir_graph_free(h);
    ir_graph_free(g);
}
END_TEST

/* Cosine-sim attention of 2.x (l2-normalised q and k, the fixed qk_norm_scale, rotary, grouped
 * key/values) decoding with a KV cache: the pipeline bounds the cached attention too, since the
 * cache holds only the normalised keys the module appended (ir_row_norm on cache.<l>.k, not on
 * .v); the interpreter decodes through the bounded graph, checking |q . k| <= bound at every call
 * (and refuses a cache whose keys break it); the compiled modules, CPU (f32 and bf16 caches) and
 * emulated CUDA, decode as the other models do. A module's session refuses a caller's cache
 * whose rows exceed the norm, and a carry into it from another output. */
START_TEST(cosine_sim_2x)
{
    const char *src = XT2 MODEL("dim = 16, depth = 2, heads = 4, attn_kv_heads = 2, attn_dim_head = 8,"
                                " attn_qk_norm = true, rotary_pos_emb = true");
    IrGraph *full = lower(src, 0), *step = lower(src, 1);
    char err[1024];
    IrGraph *h = harness_passes(step, NULL, NULL, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    int attn = 0, bounded = 0;
    for (int i = 0; i < h->nnodes; i++)
        if (h->nodes[i]->op == IR_ATTENTION) {
            attn++;
            bounded += h->nodes[i]->ia[IR_IA_BOUND] == 1;
        }
    ck_assert_int_eq(attn, 2);
    ck_assert_int_eq(bounded, 2);
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "cache.0.k")) == 1);
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "cache.1.k")) == 1);
    ck_assert(ir_find_row_norm(h, ir_find_leaf(h, IR_INPUT, "cache.0.v")) == 0);

    Bind b = {0};
    make_weights(full, &b);
    enum { T = 9, PROMPT = 4 };
    int64_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 5 + 1) % 64;
    IrHostTensor ref;
    full_reference(full, &b, tok, T, &ref);
    double worst = interp_decode(h, &b, tok, T, PROMPT, &ref, 0, NULL);
    ck_assert_msg(worst < 1e-4, "bounded cached decoding differs from recomputation by %g", worst);
    /* the last call's caches, the keys of layer 0 three times longer: the interpreter's check */
    ck_assert_str_eq(b.cache_names[0], "cache.0.k");
    for (int64_t i = 0; i < T * 2 * 8; i++)
        b.cache[0][i] *= 3;
    b.g = h;
    b.n = 1;
    IrHostTensor *outs = calloc((size_t)h->noutputs, sizeof *outs);
    ck_assert_int_ne(ir_interp(h, bind, &b, outs, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "exceeds the bound"), "%s", err);
    free(outs);
    ir_graph_free(h);

    /* the module: its metadata lists the claim, its session checks what a caller binds */
    PassOptions po = {.verify_each = 1};
    char path[600];
    h = harness_passes(step, "cpu", &po, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    bounded = 0;
    for (int i = 0; i < h->nnodes; i++)
        bounded += h->nodes[i]->op == IR_ATTENTION && h->nodes[i]->ia[IR_IA_BOUND] == 1;
    ck_assert_int_eq(bounded, 2);
    harness_make_tmpdir("kv_cache");
    snprintf(path, sizeof path, "%s/cosine.so", tmpdir);
    CgOptions opt = {.output = path, .opt_level = 1, .source = "# test\n", .source_name = "t.xtf"};
    ck_assert_msg(harness_cg(h, &opt, NULL, err, sizeof err) == 0, "%s", err);
    ir_graph_free(h);
    XtcModule *m = NULL;
    ck_assert_int_eq(xtc_module_load(path, &m), XTC_OK);
    unlink(path);
    ck_assert_msg(strstr(xtc_module_metadata(m), "\nnorm ") != NULL, "no norm record");
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    float rows[3 * 2 * 8];
    for (int i = 0; i < 3 * 2 * 8; i++)
        rows[i] = i % 8 == i / 8 % 8 ? 1 : 0; /* unit rows */
    ck_assert_msg(xtc_session_set_input(s, "cache.0.k", XTC_F32, 4, (int64_t[]){1, 3, 2, 8}, rows) == XTC_OK, "%s",
                  xtc_session_error(s));
    rows[5 * 8 + 3] = 0.6f; /* row 5: norm sqrt(1.36) */
    ck_assert_int_eq(xtc_session_set_input(s, "cache.0.k", XTC_F32, 4, (int64_t[]){1, 3, 2, 8}, rows), XTC_ERR_RANGE);
    ck_assert_msg(strstr(xtc_session_error(s), "input 'cache.0.k': row 5 has L2 norm 1.16619"), "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_set_input(s, "cache.0.v", XTC_F32, 4, (int64_t[]){1, 3, 2, 8}, rows), XTC_OK);
    ck_assert_int_eq(xtc_session_carry(s, "cache.0.v", "cache.0.k"), XTC_ERR_ARG);
    ck_assert_msg(strstr(xtc_session_error(s), "only output 'cache.0.k' carries into it"), "%s", xtc_session_error(s));
    xtc_session_free(s);
    xtc_module_free(m);

    bind_free(&b, 1);
    ir_host_free(&ref);
    ir_graph_free(full);
    ir_graph_free(step);
    check_model_kv(src, 1); /* compiled: CPU (f32 and bf16 caches) and emulated CUDA, bounded */
}
END_TEST

/* a sliding window (max_attend_past): the cached keys older than it are masked in each step as in
 * the full recomputation, memory key/values too */
START_TEST(window_mem_kv)
{
    check_model(MODEL("dim = 16, depth = 2, heads = 2, attn_dim_head = 8, attn_max_attend_past = 3,"
                      " attn_num_mem_kv = 2"));
}
END_TEST

/* a window over keys of 32 values (the few-rows scores in vectors, 4 keys at a time, from the
 * window's first key: a start and a remainder that are not multiples of 4), caches in bf16 */
START_TEST(window_wide_heads)
{
    check_model_kv(MODEL("dim = 32, depth = 1, heads = 2, attn_dim_head = 32, attn_max_attend_past = 6"), 1);
}
END_TEST

/* The cache's positions and the call's together stay within max_seq_len (the position table):
 * c + n > 32 is refused naming both lengths, by the interpreter and by a session when the
 * second of the two inputs is bound (set or carried), or else when it runs. */
START_TEST(past_max_seq_len)
{
    IrGraph *step = lower(MODEL("dim = 16, depth = 1, heads = 2, attn_dim_head = 8"), 1);
    Bind b = {0};
    make_weights(step, &b);
    int64_t tok[32] = {0};
    static float zeros[32 * 2 * 8];
    b.g = step;
    b.b = 1;
    b.n = 4;
    b.tokens = tok;
    for (int i = 0; i < step->nnodes; i++) {
        IrNode *n = step->nodes[i];
        if (n->op == IR_INPUT && !strncmp(n->s, "cache.", 6)) {
            b.cache_names[b.ncache] = n->s;
            memcpy(b.cache_shape[b.ncache], (int64_t[]){1, 30, 2, 8}, sizeof b.cache_shape[0]);
            b.cache[b.ncache++] = zeros;
        }
    }
    ck_assert_int_eq(b.ncache, 2);
    IrHostTensor outs[3];
    char err[512];
    ck_assert_int_ne(ir_interp(step, bind, &b, outs, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "n+c = 34 with these inputs exceeds its bound 32"), "%s", err);

    char path[600];
    PassOptions po = {.verify_each = 1};
    IrGraph *h = harness_passes(step, "cpu", &po, err, sizeof err);
    ck_assert_msg(h != NULL, "passes: %s", err);
    harness_make_tmpdir("kv_cache");
    snprintf(path, sizeof path, "%s/limit.so", tmpdir);
    CgOptions opt = {.output = path, .opt_level = 0, .source = "# test\n", .source_name = "t.xtf"};
    CgStats cs;
    ck_assert_msg(harness_cg(h, &opt, &cs, err, sizeof err) == 0, "%s", err);
    ir_graph_free(h);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    unlink(path);
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    for (int i = 0; i < step->nnodes; i++) {
        const IrNode *n = step->nodes[i];
        int64_t shape[IR_MAXRANK];
        for (int d = 0; d < n->rank; d++)
            shape[d] = n->shape[d].c;
        for (int k = 0; (n->op == IR_PARAM || n->op == IR_BUFFER) && k < b.nw; k++)
            if (!strcmp(b.names[k], n->s))
                ck_assert_int_eq(xtc_session_set_weight(s, n->s, n->rank, shape, b.w[k]), XTC_OK);
    }
    /* set: the second input bound is refused */
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, 4}, tok), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "cache.0.k", XTC_F32, 4, (int64_t[]){1, 30, 2, 8}, zeros), XTC_ERR_RANGE);
    const char *e = xtc_session_error(s);
    ck_assert_msg(strstr(e, "n+c = 34 exceeds 32") && strstr(e, "n = 4 (input 'tokens')") &&
                  strstr(e, "c = 30 (input 'cache.0.k')"), "%s", e);
    /* c + n = 32 runs; carried, the cache is then 32 long: one more token is refused when it is
     * set, and by the run when the old tokens are kept */
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, 2}, tok), XTC_OK);
    for (int c = 0; c < b.ncache; c++)
        ck_assert_int_eq(xtc_session_set_input(s, b.cache_names[c], XTC_F32, 4, (int64_t[]){1, 30, 2, 8}, zeros), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    for (int c = 0; c < b.ncache; c++)
        ck_assert_msg(xtc_session_carry(s, b.cache_names[c], b.cache_names[c]) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, 1}, tok), XTC_ERR_RANGE);
    ck_assert_msg(strstr(xtc_session_error(s), "n+c = 33 exceeds 32"), "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_RANGE);
    ck_assert_msg(strstr(xtc_session_error(s), "n+c = 34 exceeds 32"), "%s", xtc_session_error(s));
    for (int c = 0; c < b.ncache; c++)
        ck_assert_int_eq(xtc_session_set_input(s, b.cache_names[c], XTC_F32, 4, (int64_t[]){1, 30, 2, 8}, zeros), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    /* a new prompt while the caches are half rebound (one emptied, one still the full carried
     * one): not refused on the stale one; the run checks what is bound then */
    for (int c = 0; c < b.ncache; c++)
        ck_assert_int_eq(xtc_session_carry(s, b.cache_names[c], b.cache_names[c]), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, b.cache_names[0], XTC_F32, 4, (int64_t[]){1, 0, 2, 8}, zeros), XTC_OK);
    ck_assert_msg(xtc_session_set_input(s, "tokens", XTC_I64, 2, (int64_t[]){1, 20}, tok) == XTC_OK, "%s",
                  xtc_session_error(s));
    ck_assert_int_eq(xtc_session_set_input(s, b.cache_names[1], XTC_F32, 4, (int64_t[]){1, 0, 2, 8}, zeros), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    xtc_session_free(s);
    xtc_module_free(m);
    bind_free(&b, 0); /* its caches are one shared buffer of zeros */
    ir_graph_free(step);
}
END_TEST

/* the layers (a constructor call) lowered in the KV-cache form are refused with message */
static void refused(const char *layers, const char *message)
{
    char src[256];
    snprintf(src, sizeof src, "m = TransformerWrapper(num_tokens = 64, max_seq_len = 32, attn_layers = %s)\n", layers);
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("t.xtf", src, strlen(src), &d);
    xtf_check(f, &d);
    XtLowerOpts o = {.kv_cache = 1};
    char err[512];
    ck_assert_ptr_null(harness_build(f, NULL, &o, 0, harness_target("cpu"), NULL, &d, err, sizeof err));
    ck_assert_msg(d.text && strstr(d.text, message), "%s: expected '%s' in: %s", layers, message, d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
}

START_TEST(refusals)
{
    refused("Encoder(dim = 16, depth = 1)", "a KV cache needs a causal Decoder");
    /* a causal CrossAttender is not a decoder either */
    refused("CrossAttender(dim = 16, depth = 1, causal = true)", "a KV cache needs a causal Decoder");
    /* collaborative heads share one k, which the cache (per head) does not hold */
    refused("Decoder(dim = 16, depth = 1, attn_collab_heads = true)", "attn_collab_heads is not supported yet");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *tc = tcase_create("decode");
    tcase_add_test(tc, absolute_positions);
    tcase_add_test(tc, rotary);
    tcase_add_test(tc, rel_pos_and_mem_kv);
    tcase_add_test(tc, pia_talking_heads_residual_attn);
    tcase_add_test(tc, window_mem_kv);
    tcase_add_test(tc, window_wide_heads);
    tcase_add_test(tc, grouped_kv_heads_2x);
    tcase_add_test(tc, one_kv_head_1x);
    tcase_add_test(tc, xpos_2x);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, past_max_seq_len);
    suite_add_tcase(s, tc);
    TCase *i8 = tcase_create("int8_contexts"); /* CK_RUN_CASE=int8_contexts runs it alone */
    tcase_set_timeout(i8, 600);
    tcase_add_test(i8, int8_every_context);
    suite_add_tcase(s, i8);
    TCase *cos = tcase_create("cosine_sim"); /* CK_RUN_CASE=cosine_sim runs it alone */
    tcase_add_test(cos, cosine_sim_pairs);
    tcase_add_test(cos, cosine_sim_2x);
    suite_add_tcase(s, cos);
    return harness_run(s, NULL);
}
