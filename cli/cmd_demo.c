/* cmd_demo.c: `xtc demo`: the main job on an embedded default. Takes the bundled GPT
 * (models/gpt.xtf, compiled into this binary), lowers it, initialises fresh seeded weights by
 * x-transformers' rules, runs a prompt through it and shows the prediction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "init.h"

extern const unsigned char xtc_bundled_gpt[];
extern const unsigned int xtc_bundled_gpt_len;

typedef struct {
    const IrGraph *g;
    float **vals;      /* per node id, parameters only */
    int64_t *tokens;
    int64_t b, n;
} Demo;

static int bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Demo *d = ctx;
    memset(out, 0, sizeof *out);
    if (leaf->op == IR_INPUT && strcmp(leaf->s, "tokens") == 0) {
        out->dtype = IR_I64;
        out->rank = 2;
        out->shape[0] = d->b;
        out->shape[1] = d->n;
        out->data = d->tokens;
        return 0;
    }
    if ((leaf->op == IR_PARAM || leaf->op == IR_BUFFER) && d->vals[leaf->id]) {
        out->dtype = IR_F32;
        out->rank = leaf->rank;
        for (int i = 0; i < leaf->rank; i++)
            out->shape[i] = leaf->shape[i].c;
        out->data = d->vals[leaf->id];
        return 0;
    }
    return -1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cli_demo(int argc, char **argv)
{
    const char *prompt = "The quick brown fox";
    unsigned long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: xtc demo [--prompt TEXT] [--seed N]\n\n"
                   "Lowers the bundled GPT (models/gpt.xtf, 12 layers, dim 512), initialises\n"
                   "seeded weights, runs the prompt (bytes as token ids) and prints the most\n"
                   "likely next tokens.\n");
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prompt"))) {
            prompt = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            seed = strtoul(v, NULL, 10);
        } else {
            fprintf(stderr, "xtc demo: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    size_t len = strlen(prompt);
    if (len == 0) {
        fprintf(stderr, "xtc demo: empty prompt\n");
        return 2;
    }
    XtfDiag diag;
    xtf_diag_init(&diag);
    XtfFile *f = xtf_parse("models/gpt.xtf (bundled)", (const char *)xtc_bundled_gpt, xtc_bundled_gpt_len, &diag);
    if (f && !diag.nerrors)
        xtf_check(f, &diag);
    if (!f || diag.nerrors) {
        fputs(diag.text ? diag.text : "", stderr);
        xtf_diag_free(&diag);
        xtf_free(f);
        return 1;
    }
    xtf_diag_free(&diag);
    XtLowerOpts opt = {0};
    double t0 = now();
    IrGraph *g = cli_lower(f, NULL, &opt);
    xtf_free(f);
    if (!g)
        return 1;
    double t1 = now();
    int64_t nparams = 0;
    int nleaves = 0;
    Demo d = {.g = g, .b = 1, .n = (int64_t)len};
    d.vals = calloc((size_t)g->nnodes, sizeof *d.vals);
    d.tokens = calloc(len, sizeof *d.tokens);
    int rc = 1;
    if (!d.vals || !d.tokens)
        goto done;
    RtRng rng;
    rt_rng_seed(&rng, seed);
    for (int i = 0; i < g->nnodes; i++) {
        IrNode *n = g->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        int64_t shape[IR_MAXRANK], numel = 1;
        for (int k = 0; k < n->rank; k++)
            numel *= shape[k] = n->shape[k].c;
        if (!(d.vals[i] = malloc((size_t)numel * sizeof(float))))
            goto done;
        rt_init_tensor(n->s, n->rank, shape, d.vals[i], &rng);
        if (n->op == IR_PARAM)
            nparams += numel;
        nleaves++;
    }
    if (d.n > g->sym_max[ir_graph_find_sym(g, "n")])
        d.n = g->sym_max[ir_graph_find_sym(g, "n")];
    for (int64_t i = 0; i < d.n; i++)
        d.tokens[i] = (unsigned char)prompt[i];
    printf("model    gpt (bundled models/gpt.xtf): %d IR nodes, %d parameter tensors, %.1fM parameters\n",
           g->nnodes, nleaves, nparams / 1e6);
    printf("lowered  in %.1f ms\n", (t1 - t0) * 1e3);
    printf("prompt   \"%s\" (%lld byte tokens)\n", prompt, (long long)d.n);
    IrHostTensor out;
    char err[512];
    double t2 = now();
    if (ir_interp(g, bind, &d, &out, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        goto done;
    }
    double t3 = now();
    const float *logits = out.data;
    int64_t V = out.shape[2];
    const float *last = logits + (d.n - 1) * V;
    printf("ran      on the reference interpreter in %.0f ms: logits [%lld, %lld, %lld]\n", (t3 - t2) * 1e3,
           (long long)out.shape[0], (long long)out.shape[1], (long long)V);
    printf("next     top-5 token ids after the prompt (random weights, seed %lu):", seed);
    int used[5] = {-1, -1, -1, -1, -1};
    for (int k = 0; k < 5; k++) {
        int best = -1;
        for (int64_t v = 0; v < V; v++) {
            int skip = 0;
            for (int j = 0; j < k; j++)
                skip |= used[j] == v;
            if (!skip && (best < 0 || last[v] > last[best]))
                best = (int)v;
        }
        used[k] = best;
        printf(" %d (%.3f)", best, last[best]);
    }
    printf("\n");
    ir_host_free(&out);
    rc = 0;
done:
    if (d.vals)
        for (int i = 0; i < g->nnodes; i++)
            free(d.vals[i]);
    free(d.vals);
    free(d.tokens);
    ir_graph_free(g);
    return rc;
}
