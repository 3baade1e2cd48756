/* test_kv_cache.c: incremental decoding with a KV cache (xt_lower with .kv_cache) gives the
 * logits of full recomputation, through the reference interpreter: a prompt call with an
 * empty cache, then one token per call, for models whose attention depends on positions in
 * every way the lowering supports (absolute, rotary, T5 buckets, PIA, memory key/values). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "init.h"
#include "ir.h"
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
    IrGraph *g = d.nerrors ? NULL : xt_lower(f, NULL, &o, &d);
    if (!g)
        ck_abort_msg("%s", d.text ? d.text : "lowering failed");
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
        rt_init_tensor(n->s, n->rank, shape, w, &rng);
        if (n->op == IR_PARAM)
            for (int64_t k = 0; k < numel; k++)
                w[k] += (float)(0.05 * rt_rng_normal(&rng));
        b->names[b->nw] = n->s;
        b->w[b->nw++] = w;
    }
}

static void check_model(const char *src)
{
    IrGraph *full = lower(src, 0), *step = lower(src, 1);
    Bind b = {0};
    make_weights(full, &b);
    enum { T = 9, PROMPT = 4 };
    int64_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 7 + 3) % 64;
    char err[512];

    /* full recomputation */
    IrHostTensor ref;
    b.g = full;
    b.b = 1;
    b.n = T;
    b.tokens = tok;
    if (ir_interp(full, bind, &b, &ref, err, sizeof err) != 0)
        ck_abort_msg("full: %s", err);
    int64_t V = ref.shape[2];

    /* the cache inputs, empty at first */
    for (int i = 0; i < step->nnodes; i++) {
        IrNode *n = step->nodes[i];
        if (n->op == IR_INPUT && !strncmp(n->s, "cache.", 6)) {
            b.cache_names[b.ncache] = n->s;
            b.cache_shape[b.ncache][0] = 1;
            b.cache_shape[b.ncache][1] = 0; /* [b, c, h, dh]: positions second */
            b.cache_shape[b.ncache][2] = n->shape[2].c;
            b.cache_shape[b.ncache][3] = n->shape[3].c;
            b.cache[b.ncache++] = NULL;
        }
    }
    ck_assert_int_gt(b.ncache, 0);
    IrHostTensor *outs = calloc((size_t)step->noutputs, sizeof *outs);
    double worst = 0;
    for (int pos = 0; pos < T;) {
        int n = pos == 0 ? PROMPT : 1;
        b.g = step;
        b.n = n;
        b.tokens = tok + pos;
        if (ir_interp(step, bind, &b, outs, err, sizeof err) != 0)
            ck_abort_msg("step at %d: %s", pos, err);
        const float *lg = outs[0].data, *rf = ref.data;
        for (int t = 0; t < n; t++)
            for (int64_t v = 0; v < V; v++) {
                double e = fabs((double)lg[t * V + v] - rf[(pos + t) * V + v]);
                if (e > worst)
                    worst = e;
            }
        /* the new caches become the next inputs */
        for (int c = 0; c < b.ncache; c++) {
            free(b.cache[c]);
            for (int o = 1; o < step->noutputs; o++)
                if (!strcmp(step->outputs[o].name, b.cache_names[c])) {
                    b.cache[c] = outs[o].data;
                    outs[o].data = NULL;
                    b.cache_shape[c][1] = outs[o].shape[1];
                }
        }
        for (int o = 0; o < step->noutputs; o++)
            ir_host_free(&outs[o]);
        pos += n;
    }
    ck_assert_msg(worst < 1e-4, "cached decoding differs from recomputation by %g", worst);
    for (int c = 0; c < b.ncache; c++)
        free(b.cache[c]);
    for (int i = 0; i < b.nw; i++)
        free(b.w[i]);
    free(b.w);
    free(b.names);
    free(outs);
    ir_host_free(&ref);
    ir_graph_free(full);
    ir_graph_free(step);
}

#define MODEL(layers) \
    "m = TransformerWrapper(num_tokens = 64, max_seq_len = 32, attn_layers = Decoder(" layers "))\n"

START_TEST(absolute_positions) { check_model(MODEL("dim = 16, depth = 2, heads = 2, attn_dim_head = 8")); }
END_TEST

START_TEST(rotary) { check_model(MODEL("dim = 32, depth = 2, heads = 2, attn_dim_head = 64, rotary_pos_emb = true")); }
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

/* a sliding window (max_attend_past): the cached keys older than it are masked in each step as in
 * the full recomputation, memory key/values too */
START_TEST(window_mem_kv)
{
    check_model(MODEL("dim = 16, depth = 2, heads = 2, attn_dim_head = 8, attn_max_attend_past = 3,"
                      " attn_num_mem_kv = 2"));
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
    ck_assert_ptr_null(xt_lower(f, NULL, &o, &d));
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
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    return harness_run(s, NULL);
}
