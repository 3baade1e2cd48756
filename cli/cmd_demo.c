/* cmd_demo.c: `xtc demo`: the main job on an embedded default. Compiles the bundled GPT
 * (models/gpt.xtf, built into this binary) to a native module, loads it through the public
 * runtime API with fresh seeded weights (x-transformers' initialisation), runs a prompt and
 * shows the prediction, checked against the reference interpreter. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "codegen.h"
#include "init.h"
#include "passes.h"
#include "xtc.h"

extern const unsigned char xtc_bundled_gpt[];
extern const unsigned int xtc_bundled_gpt_len;

typedef struct {
    const IrGraph *g;
    float **vals; /* per node id: parameter values */
    int64_t *tokens, n;
} Demo;

static int bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Demo *d = ctx;
    memset(out, 0, sizeof *out);
    if (leaf->op == IR_INPUT && strcmp(leaf->s, "tokens") == 0) {
        out->dtype = IR_I64;
        out->rank = 2;
        out->shape[0] = 1;
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

static void top5(const float *row, int64_t V, int *best)
{
    for (int k = 0; k < 5; k++) {
        best[k] = -1;
        for (int64_t v = 0; v < V; v++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= best[j] == v;
            if (!taken && (best[k] < 0 || row[v] > row[best[k]]))
                best[k] = (int)v;
        }
    }
}

int cli_demo(int argc, char **argv)
{
    const char *prompt = "The quick brown fox";
    uint64_t seed = 1;
    int threads = 2;
    const CliOpt opts[] = {
        {"--prompt", CLI_ANY_STR, &prompt, "TEXT", .help = "the prompt, bytes as token ids (\"The quick brown fox\")"},
        {"--seed", CLI_U64, &seed, "N", .help = "the weights' seed (1)"},
        {"--threads", CLI_THREADS, &threads, "T", .help = "worker threads (2)"},
    };
    const CliCmd cmd = {
        .name = "demo", .usage = "--inference [--prompt TEXT] [--seed N] [--threads T]",
        .about = "Compiles the bundled GPT (models/gpt.xtf: 12 layers, dim 512, 20000 tokens) to a\n"
                 "native module, loads it through the runtime with seeded weights, runs the prompt\n"
                 "(bytes as token ids), prints the most likely next tokens and checks the logits\n"
                 "against the reference interpreter.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts),
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    size_t len = strlen(prompt);
    if (len == 0 || threads < 1) {
        fprintf(stderr, "xtc demo: %s\n", len ? "--threads must be at least 1" : "empty prompt");
        return 2;
    }

    /* 1. front end: the bundled source, checked and lowered */
    XtfDiag diag;
    xtf_diag_init(&diag);
    XtfFile *f = xtf_parse("models/gpt.xtf", (const char *)xtc_bundled_gpt, xtc_bundled_gpt_len, &diag);
    if (f && !diag.nerrors)
        xtf_check(f, &diag);
    if (!f || diag.nerrors) {
        fputs(diag.text ? diag.text : "", stderr);
        xtf_diag_free(&diag);
        xtf_free(f);
        return 1;
    }
    xtf_diag_free(&diag);
    double t0 = now();
    char err[1024];
    DrvTarget cpu;
    if (drv_target(&cpu, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "xtc demo: %s\n", err);
        xtf_free(f);
        return 1;
    }
    /* the lowered graph is kept: the interpreter checks the module against it */
    IrGraph *g = NULL, *opt = NULL;
    DrvJob lower = {.file = f, .stop_after = DRV_LOWER};
    int lowered = cli_drive("xtc demo", &lower, &cpu, &g, NULL);
    xtf_free(f);
    if (lowered != 0)
        return 1;

    /* 2. code generation: a native module in a temporary directory */
    char dir[] = "/tmp/xtc-demo-XXXXXX", so[64];
    if (!mkdtemp(dir)) {
        perror("xtc demo: mkdtemp");
        ir_graph_free(g);
        return 1;
    }
    snprintf(so, sizeof so, "%s/gpt.so", dir);
    DrvJob compile = {.graph = g, .start = DRV_PASSES,
                      .cg = {.output = so, .opt_level = 2, .source = (const char *)xtc_bundled_gpt,
                             .source_name = "models/gpt.xtf"}};
    CgStats st = {0};
    int rc = 1;
    Demo d = {.g = g, .n = (int64_t)len};
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    if (cli_drive("xtc demo", &compile, &cpu, &opt, &st) != 0)
        goto done;
    double t1 = now();
    printf("compiled models/gpt.xtf (bundled) in %.2f s: %d IR nodes, %d kernels for %d steps, "
           "module %lld KB\n", t1 - t0, opt->nnodes, st.nkernels, st.nsteps, (long long)st.module_bytes / 1024);

    /* 3. the runtime: load, weights, input, run */
    if (xtc_module_load(so, &m) != XTC_OK || !m) {
        fprintf(stderr, "xtc demo: %s\n", m ? xtc_module_error(m) : "out of memory");
        goto done;
    }
    XtcSessionOptions so_opt = {.threads = threads};
    if (xtc_session_new(m, &so_opt, &s) != XTC_OK) {
        fprintf(stderr, "xtc demo: %s\n", s ? xtc_session_error(s) : "out of memory");
        goto done;
    }
    d.vals = calloc((size_t)g->nnodes, sizeof *d.vals);
    d.tokens = calloc(len, sizeof *d.tokens);
    if (!d.vals || !d.tokens)
        goto done;
    RtRng rng;
    rt_rng_seed(&rng, seed);
    int64_t nparams = 0;
    for (int i = 0; i < g->nnodes; i++) {
        IrNode *n = g->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        int64_t shape[IR_MAXRANK], numel = 1;
        for (int k = 0; k < n->rank; k++)
            numel *= shape[k] = n->shape[k].c;
        if (!(d.vals[i] = malloc((size_t)numel * sizeof(float))))
            goto done;
        const IrInit *rule = ir_find_init(g, n);
        rt_init_by_name(rule ? ir_init_name(rule->kind) : NULL, rule ? rule->value : 0, n->rank, shape, d.vals[i], &rng);
        nparams += numel;
        if (xtc_session_set_weight(s, n->s, n->rank, shape, d.vals[i]) != XTC_OK) {
            fprintf(stderr, "xtc demo: %s\n", xtc_session_error(s));
            goto done;
        }
    }
    int64_t maxn = g->sym_max[ir_graph_find_sym(g, "n")];
    if (d.n > maxn)
        d.n = maxn;
    for (int64_t i = 0; i < d.n; i++)
        d.tokens[i] = (unsigned char)prompt[i];
    int64_t shape[2] = {1, d.n};
    double t2 = now();
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, d.tokens) != XTC_OK ||
        xtc_session_run(s) != XTC_OK) {
        fprintf(stderr, "xtc demo: %s\n", xtc_session_error(s));
        goto done;
    }
    double t3 = now();
    XtcTensor logits;
    xtc_session_get_output(s, "logits", &logits);
    int64_t V = logits.shape[2];
    const float *last = (const float *)logits.data + (d.n - 1) * V;
    printf("ran      \"%s\" (%lld byte tokens) through the native module, %d threads: %.1f ms, "
           "%.1fM parameters, peak activations %.1f MB\n", prompt, (long long)d.n, threads, (t3 - t2) * 1e3,
           nparams / 1e6, xtc_session_peak_bytes(s) / 1e6);
    int best[5];
    top5(last, V, best);
    printf("next     top-5 token ids after the prompt (fresh weights, seed %lu):", seed);
    for (int k = 0; k < 5; k++)
        printf(" %d (%.3f)", best[k], last[best[k]]);
    printf("\n");

    /* 4. the same prompt on the reference interpreter (double precision) */
    IrHostTensor ref;
    if (ir_interp(g, bind, &d, &ref, err, sizeof err) != 0) {
        fprintf(stderr, "xtc demo: %s\n", err);
        goto done;
    }
    double maxd = 0, maxr = 0;
    const float *rv = ref.data, *cv = logits.data;
    for (int64_t i = 0; i < d.n * V; i++) {
        maxd = fmax(maxd, fabs((double)rv[i] - cv[i]));
        maxr = fmax(maxr, fabs((double)rv[i]));
    }
    ir_host_free(&ref);
    int ok = maxd <= 1e-5 + 1e-3 * maxr;
    printf("check    against the reference interpreter: max |difference| %.2e (max |logit| %.2f): %s\n", maxd,
           maxr, ok ? "ok" : "MISMATCH");
    rc = ok ? 0 : 1;
done:
    xtc_session_free(s);
    xtc_module_free(m);
    unlink(so);
    rmdir(dir);
    if (d.vals)
        for (int i = 0; i < g->nnodes; i++)
            free(d.vals[i]);
    free(d.vals);
    free(d.tokens);
    ir_graph_free(opt);
    ir_graph_free(g);
    return rc;
}
