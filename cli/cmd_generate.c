/* cmd_generate.c: `xtc generate`: sampling bytes from a trained language model with a KV cache.
 *
 * The model is compiled in its incremental-decoding form (xt_lower with .kv_cache: inputs
 * cache.<l>.k/.v [b, c, heads, dim_head] of the keys and values so far, outputs the same with
 * this call's appended, positions continuing after c). The prompt goes through in one call with
 * an empty cache; every further call feeds one token and the caches of the previous call, so a
 * new token costs time linear in the context instead of a forward pass over all of it. When the
 * context reaches max_seq_len, the cache restarts from the last max_seq_len / 2 tokens (the model
 * has no positions beyond it). --no-cache recomputes the whole context (its last max_seq_len
 * tokens, as x-transformers' generate crops it) for every token: the reference the cached path
 * is tested against. */
#include <errno.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "build.h"
#include "cli.h"
#include "init.h"
#include "train.h"

#define MAX_CACHE 1024

typedef struct {
    XtcModule *m;
    XtcSession *s;
    int kv;                 /* the module has the cache inputs */
    int ncache;             /* cache.<l>.k and .v: 2 * layers */
    char names[MAX_CACHE][32];
    int64_t heads[MAX_CACHE], dim_head[MAX_CACHE];
    int64_t V, maxlen;
} Gen;

void cli_generate_defaults(CliGenOpts *o)
{
    memset(o, 0, sizeof *o);
    o->prompt = "";
    o->tokens = 200;
    o->temperature = 0.8;
    o->top_k = 40;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Checks the module's interface: tokens (and caches) in, logits (and caches) out. */
static int inspect(Gen *G, const char *path)
{
    const XtcModule *m = G->m;
    G->ncache = 0;
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_INPUT, i, &t);
        if (!strncmp(t.name, "cache.", 6) && t.rank == 4 && G->ncache < MAX_CACHE) {
            snprintf(G->names[G->ncache], sizeof G->names[0], "%s", t.name);
            G->heads[G->ncache] = t.shape[2];
            G->dim_head[G->ncache] = t.shape[3];
            G->ncache++;
        } else if (strcmp(t.name, "tokens")) {
            fprintf(stderr, "xtc generate: %s: input '%s' is not something generation provides\n", path, t.name);
            return -1;
        }
    }
    G->kv = G->ncache > 0;
    int lg = xtc_module_find(m, XTC_OUTPUT, "logits");
    if (lg < 0 || xtc_module_find(m, XTC_INPUT, "tokens") < 0) {
        fprintf(stderr, "xtc generate: %s: the model has no tokens input or no logits output\n", path);
        return -1;
    }
    XtcTensorInfo t;
    xtc_module_tensor(m, XTC_OUTPUT, lg, &t);
    G->V = t.shape[t.rank - 1];
    if (G->V < 256) {
        fprintf(stderr, "xtc generate: %s: the model has %" PRId64 " tokens; byte-level text needs at least 256\n",
                path, G->V);
        return -1;
    }
    G->maxlen = 0;
    for (int i = 0; i < xtc_module_num_symbols(m); i++) {
        const char *name;
        int64_t max;
        xtc_module_symbol(m, i, &name, &max);
        if (!strcmp(name, "n"))
            G->maxlen = max;
    }
    if (G->maxlen < 2) {
        fprintf(stderr, "xtc generate: %s: the model's max_seq_len is too small to generate\n", path);
        return -1;
    }
    return 0;
}

static int only_inputs(const XtcModule *m, const char *a, const char *b)
{
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_INPUT, i, &t);
        if (strcmp(t.name, a) && strncmp(t.name, b, strlen(b)))
            return 0;
    }
    return 1;
}

static int get_module(const XtfFile *f, const char *model, const char *module_path, int no_cache, Gen *G)
{
    XtfFile *owned = NULL;
    const char *path = f ? f->path : module_path;
    if (!f) {
        XtcModule *m = cli_load_module(module_path);
        if (!m)
            return -1;
        int kv = xtc_module_find(m, XTC_INPUT, "cache.0.k") >= 0;
        /* usable as is: a decoding module, or (--no-cache) a forward module reading tokens only */
        if ((kv && !no_cache && only_inputs(m, "tokens", "cache.")) || (!kv && no_cache && only_inputs(m, "tokens", "tokens"))) {
            G->m = m;
            return inspect(G, path);
        }
        owned = cli_module_xtf(m, module_path);
        model = xtc_module_name(m);
        if (!owned) {
            xtc_module_free(m);
            return -1;
        }
        f = owned;
        int rc = cli_check_byte_lm(f, model, "generate");
        DrvJob b = {.model = model, .lower = {.kv_cache = !no_cache}};
        if (rc == 0)
            fprintf(stderr, "compiling the %s form of %s ...\n", no_cache ? "forward" : "KV-cache", path);
        G->m = rc == 0 ? cli_build_load(f, &b) : NULL;
        xtc_module_free(m);
    } else {
        if (cli_check_byte_lm(f, model, "generate") != 0)
            return -1;
        DrvJob b = {.model = model, .lower = {.kv_cache = !no_cache}};
        fprintf(stderr, "compiling the %s form of %s ...\n", no_cache ? "forward" : "KV-cache", path);
        G->m = cli_build_load(f, &b);
    }
    xtf_free(owned);
    if (!G->m)
        return -1;
    return inspect(G, path);
}

/* The next token from a row of logits[V]. */
static int64_t sample(const float *logits, int64_t V, const CliGenOpts *o, RtRng *rng, double *scratch)
{
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (!(o->temperature > 0))
        return best;
    double cut = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) { /* the k-th largest value, by selection over a copy */
        for (int64_t i = 0; i < V; i++)
            scratch[i] = logits[i];
        int64_t lo = 0, hi = V - 1, k = o->top_k - 1;
        while (lo < hi) { /* quickselect for descending order */
            double pivot = scratch[(lo + hi) / 2];
            int64_t i = lo, j = hi;
            while (i <= j) {
                while (scratch[i] > pivot)
                    i++;
                while (scratch[j] < pivot)
                    j--;
                if (i <= j) {
                    double t = scratch[i];
                    scratch[i++] = scratch[j];
                    scratch[j--] = t;
                }
            }
            if (k <= j)
                hi = j;
            else if (k >= i)
                lo = i;
            else
                break;
        }
        cut = scratch[k];
    }
    double total = 0, top = logits[best];
    for (int64_t i = 0; i < V; i++) {
        scratch[i] = logits[i] >= cut ? exp((logits[i] - top) / o->temperature) : 0;
        total += scratch[i];
    }
    double u = rt_rng_uniform(rng) * total, acc = 0;
    for (int64_t i = 0; i < V; i++) {
        acc += scratch[i];
        if (u < acc && scratch[i] > 0)
            return i;
    }
    return best;
}

static void put_token(int64_t t, const CliGenOpts *o, int first)
{
    if (o->ids) {
        printf("%s%" PRId64, first ? "" : " ", t);
    } else if ((t < 32 && t != '\n' && t != '\t') || t == 127 || t > 255) {
        printf("\\x%02" PRIx64, t);
    } else {
        putchar((int)t);
    }
    fflush(stdout);
}

/* One call: tokens ctx[from, to) after a cache of `cached` tokens (kv), or the whole window. */
static int run_tokens(Gen *G, const int64_t *ctx, int64_t from, int64_t to, int fresh_cache)
{
    int64_t shape[2] = {1, to - from};
    if (G->kv && fresh_cache) {
        for (int c = 0; c < G->ncache; c++) {
            int64_t cs[4] = {1, 0, G->heads[c], G->dim_head[c]};
            float dummy = 0;
            if (xtc_session_set_input(G->s, G->names[c], XTC_F32, 4, cs, &dummy))
                goto fail;
        }
    }
    if (xtc_session_set_input(G->s, "tokens", XTC_I64, 2, shape, ctx + from) || xtc_session_run(G->s))
        goto fail;
    return 0;
fail:
    fprintf(stderr, "xtc generate: %s\n", xtc_session_error(G->s));
    return -1;
}

/* The caches this call produced become the next call's (without a copy after the first) */
static int carry_caches(Gen *G)
{
    for (int c = 0; c < G->ncache; c++)
        if (xtc_session_carry(G->s, G->names[c], G->names[c])) {
            fprintf(stderr, "xtc generate: %s\n", xtc_session_error(G->s));
            return -1;
        }
    return 0;
}

/* Every weight finite: NaN or infinite weights (a diverged run) would sample garbage. */
static int weights_finite(Gen *G, const char *path)
{
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(G->m, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor t;
            xtc_module_tensor(G->m, (XtcKind)kind, i, &info);
            if (xtc_session_get_weight(G->s, info.name, &t) != XTC_OK || t.dtype != XTC_F32)
                continue; /* (int8 weights were quantized from finite values) */
            int64_t n = 1;
            for (int d = 0; d < t.rank; d++)
                n *= t.shape[d];
            for (int64_t j = 0; j < n; j++)
                if (!isfinite(((const float *)t.data)[j])) {
                    fprintf(stderr, "xtc generate: %s: weight '%s' holds %g at element %" PRId64 " (not finite: "
                                    "the run that wrote it diverged); nothing to sample from\n", path, info.name,
                            ((const float *)t.data)[j], j);
                    return -1;
                }
        }
    return 0;
}

int cli_generate_run(const XtfFile *f, const char *model, const char *module_path, const CliGenOpts *o)
{
#ifdef __GLIBC__
    /* the caches (megabytes at long contexts) grow every token: keep their allocations (the first
     * carry's copy, a spare outgrown every quarter) in the heap rather than in new mappings,
     * whose pages would fault in again */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
    Gen *G = calloc(1, sizeof *G);
    int rc = 1;
    int64_t *ctx = NULL;
    double *scratch = NULL;
    if (!G) {
        fprintf(stderr, "xtc generate: out of memory\n");
        return 1;
    }
    if (get_module(f, model, module_path, o->no_cache, G) != 0)
        goto done;
    /* a decoding step of a small model is too little work to split: one thread is faster */
    int threads = o->threads ? o->threads : xtc_module_param_count(G->m) < 4000000 ? 1 : cli_default_threads();
    XtcSessionOptions so = {.threads = threads};
    if (xtc_session_new(G->m, &so, &G->s) != XTC_OK ||
        xtc_session_load_checkpoint(G->s, o->weights, 0) != XTC_OK) {
        fprintf(stderr, "xtc generate: %s\n", G->s ? xtc_session_error(G->s) : "out of memory");
        goto done;
    }
    if (weights_finite(G, o->weights) != 0)
        goto done;
    size_t plen = strlen(o->prompt);
    int64_t n = (int64_t)(plen ? plen : 1), cap = n + o->tokens + 1;
    ctx = malloc((size_t)cap * sizeof *ctx);
    scratch = malloc((size_t)G->V * sizeof *scratch);
    if (!ctx || !scratch) {
        fprintf(stderr, "xtc generate: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < plen; i++)
        ctx[i] = (unsigned char)o->prompt[i];
    if (!plen)
        ctx[0] = '\n';
    if (!o->ids) {
        fputs(o->prompt, stdout);
        fflush(stdout);
    }
    RtRng rng;
    rt_rng_seed(&rng, o->seed);
    double t0 = now_s(), t_first = 0;
    int64_t cached = 0; /* tokens in the cache (kv) */
    int64_t restarts = 0;
    for (int64_t k = 0; k < o->tokens; k++) {
        int rcall;
        if (!G->kv) {
            int64_t from = n > G->maxlen ? n - G->maxlen : 0;
            rcall = run_tokens(G, ctx, from, n, 0);
        } else if (k == 0 || cached + 1 > G->maxlen) {
            int64_t keep = k == 0 ? G->maxlen : G->maxlen / 2;
            int64_t from = n > keep ? n - keep : 0;
            restarts += k > 0;
            rcall = run_tokens(G, ctx, from, n, 1);
            cached = n - from;
        } else {
            rcall = carry_caches(G) == 0 ? run_tokens(G, ctx, n - 1, n, 0) : -1;
            cached++;
        }
        if (rcall != 0)
            goto done;
        XtcTensor lg;
        if (xtc_session_get_output(G->s, "logits", &lg)) {
            fprintf(stderr, "xtc generate: %s\n", xtc_session_error(G->s));
            goto done;
        }
        const float *row = (const float *)lg.data + (lg.shape[1] - 1) * G->V;
        for (int64_t i = 0; i < G->V; i++)
            if (!isfinite(row[i])) {
                fprintf(stderr, "%sxtc generate: the logits of token %" PRId64 " are not finite (%g for id %" PRId64
                                "); the weights %s do not give a usable model\n", k ? "\n" : "", k + 1, row[i], i,
                        o->weights);
                goto done;
            }
        int64_t next = sample(row, G->V, o, &rng, scratch);
        ctx[n++] = next;
        put_token(next, o, k == 0);
        if (k == 0) {
            t_first = now_s();
            if (o->profile)
                xtc_session_set_profiling(G->s, 1); /* the one-token calls only */
        }
    }
    double t1 = now_s();
    if (o->ids || (n > 0 && ctx[n - 1] != '\n'))
        putchar('\n');
    fflush(stdout);
    if (!o->quiet && o->tokens == 0)
        fprintf(stderr, "nothing generated (--tokens 0)\n");
    else if (!o->quiet)
        fprintf(stderr, "%s: prompt %zu tokens in %.1f ms; %" PRId64 " more tokens in %.3f s (%.1f tokens/s)%s\n",
                G->kv ? "KV cache" : "recomputed", plen, 1e3 * (t_first - t0), o->tokens > 0 ? o->tokens - 1 : 0,
                t1 - t_first, o->tokens > 1 ? (o->tokens - 1) / (t1 - t_first) : 0.0,
                restarts ? " (the cache restarted at max_seq_len)" : "");
    if (o->profile)
        xtc_session_print_profile(G->s, stderr);
    rc = 0;
done:
    free(ctx);
    free(scratch);
    xtc_session_free(G->s);
    xtc_module_free(G->m);
    free(G);
    return rc;
}

/* ---- the command ---- */

int cli_generate(int argc, char **argv)
{
    CliGenOpts o;
    cli_generate_defaults(&o);
    const char *path = NULL, *model = NULL;
    const CliOpt opts[] = {
        {"--weights", CLI_STR, &o.weights, "CKPT", .help = "a checkpoint of xtc train or any weights file of the model"},
        {"--prompt", CLI_ANY_STR, &o.prompt, "TEXT", .help = "the beginning of the text (default: a newline)"},
        {"--tokens", CLI_I64, &o.tokens, "N", .help = "bytes to generate (200)", .lo = 0, .hi = 1e8},
        {"--temperature", CLI_DOUBLE, &o.temperature, "T", .help = "0 = greedy (0.8)", .lo = 0, .hi = 1e6},
        {"--top-k", CLI_INT, &o.top_k, "K", .help = "sample among the K most likely (40; 0 = all)", .lo = 0, .hi = 1e9},
        {"--seed", CLI_U64, &o.seed, "S", .help = "the sampler's seed (0)"},
        {"--threads", CLI_THREADS, &o.threads, "T", .help = "worker threads (1 for models under 4M parameters, whose\n"
         "steps are too small to split; else the number of CPUs)"},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the .xtf file (the last)"},
        {"--no-cache", CLI_FLAG, &o.no_cache, .help = "recompute the whole context for every token (the reference)"},
        {"--ids", CLI_FLAG, &o.ids, .help = "print the generated token ids instead of the text"},
        {"--quiet", CLI_FLAG, &o.quiet, .help = "no statistics line on stderr"},
        {"--profile", CLI_FLAG, &o.profile, .help = "time per kernel of the one-token calls, on stderr"},
    };
    const CliCmd cmd = {
        .name = "generate", .usage = "model.xtf|model.so --weights CKPT --prompt TEXT --tokens N [options]",
        .about = "Samples bytes from a language model (a TransformerWrapper around a Decoder, num_tokens >=\n"
                 "256) trained by xtc train, continuing the prompt. The model is compiled in its KV-cache\n"
                 "form, so each new token costs time linear in the context (a .so compiled with --kv-cache is\n"
                 "used as is; another is recompiled from its embedded source).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "model",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path || !o.weights)
        return cli_usage_error(&cmd, !path ? "no model given" : "no --weights given");
    if (cli_is_module_path(path))
        return cli_generate_run(NULL, model, path, &o);
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    int rc = cli_generate_run(f, model, NULL, &o);
    xtf_free(f);
    return rc;
}
