/* demo_train.c: `xtc demo`, the README's main job: the whole training story on an embedded
 * default, from anywhere, without downloading anything. It compiles the bundled tiny GPT
 * (models/tiny_gpt.xtf, compiled into this binary), trains it briefly on English-like text the
 * project generates (cli/corpus.c), printing the validation loss as it falls, then samples a
 * continuation of a prompt with the KV cache. About two minutes on two cores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "train.h"

extern const unsigned char xtc_bundled_tiny_gpt[];
extern const unsigned int xtc_bundled_tiny_gpt_len;

static void usage(void)
{
    printf("usage: xtc demo [--steps N] [--threads T] [--prompt TEXT] [--tokens N] [--seed S] [--ckpt PATH]\n"
           "       xtc demo --inference [--prompt TEXT]\n\n"
           "Trains the bundled tiny GPT (models/tiny_gpt.xtf: 4 layers, dim 128, bytes as tokens) for\n"
           "N steps (500) on 400 kB of generated English-like text, printing the validation loss,\n"
           "then samples TOKENS bytes (300) after the prompt (\"The \") with the KV cache.\n"
           "--ckpt keeps the trained checkpoint (for xtc generate models/tiny_gpt.xtf --weights PATH).\n\n"
           "xtc demo --inference [--prompt TEXT] runs the inference demo instead: the bundled 12-layer\n"
           "GPT compiled to native code, checked against the reference interpreter.\n");
}

/* Whether argv[*i] is the flag `name`; if so its value, >= lo, goes to *out (else *bad is set). */
static int num_flag(int argc, char **argv, int *i, const char *name, long lo, long *out, int *bad)
{
    const char *v = cli_flag_value(argc, argv, i, name);
    if (!v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > 100000000) {
        fprintf(stderr, "xtc demo: %s needs an integer >= %ld, got '%s'\n", name, lo, v);
        *bad = 1;
    }
    *out = x;
    return 1;
}

int cli_demo_train(int argc, char **argv)
{
    CliTrainOpts t;
    cli_train_defaults(&t);
    t.steps = 500;
    t.batch = 8;
    t.seq = 128;
    t.lr = 3e-3;
    t.val_tokens = 16384;
    CliGenOpts g;
    cli_generate_defaults(&g);
    g.prompt = "The ";
    g.tokens = 300;
    if (argc > 1 && !strcmp(argv[1], "--inference")) /* the native-vs-interpreter check (cmd_demo.c) */
        return cli_demo(argc - 1, argv + 1);
    const char *keep = NULL, *v;
    long steps = t.steps, threads = 0, tokens = g.tokens, seed = 1;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prompt"))) {
            g.prompt = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--ckpt"))) {
            keep = v;
        } else if (!num_flag(argc, argv, &i, "--steps", 1, &steps, &bad) &&
                   !num_flag(argc, argv, &i, "--threads", 1, &threads, &bad) &&
                   !num_flag(argc, argv, &i, "--tokens", 0, &tokens, &bad) &&
                   !num_flag(argc, argv, &i, "--seed", 0, &seed, &bad)) {
            fprintf(stderr, "xtc demo: unknown option '%s' (xtc demo --help)\n", argv[i]);
            return 2;
        }
        if (bad)
            return 2;
    }
    t.steps = steps;
    t.threads = g.threads = (int)(threads > 1024 ? 1024 : threads);
    g.tokens = tokens;
    t.seed = g.seed = (uint64_t)seed;
    t.val_every = t.steps / 5 > 0 ? t.steps / 5 : 1;

    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("models/tiny_gpt.xtf (bundled)", (const char *)xtc_bundled_tiny_gpt,
                           xtc_bundled_tiny_gpt_len, &d);
    if (f && !d.nerrors)
        xtf_check(f, &d);
    if (!f || d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        xtf_diag_free(&d);
        xtf_free(f);
        return 1;
    }
    xtf_diag_free(&d);

    size_t len = 400000;
    unsigned char *text = malloc(len);
    char dir[512] = "", ckpt[600];
    int rc = 1;
    if (!text) {
        fprintf(stderr, "xtc demo: out of memory\n");
        goto done;
    }
    cli_corpus(text, len, 1);
    if (keep) {
        snprintf(ckpt, sizeof ckpt, "%s", keep);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/xtc-demo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "xtc demo: cannot create a temporary directory\n");
            dir[0] = 0;
            goto done;
        }
        snprintf(ckpt, sizeof ckpt, "%s/tiny_gpt.safetensors", dir);
    }
    t.ckpt = ckpt;
    g.weights = ckpt;
    printf("xtc demo: train the bundled tiny GPT on generated text, then sample from it\n");
    printf("text  %zu bytes of generated stories, for example:\n      \"%.*s...\"\n\n", len, 110, (const char *)text);
    fflush(stdout);
    if (cli_train_run(f, NULL, NULL, text, len, "generated stories", &t) != 0)
        goto done;
    printf("\nsample (temperature %.1f, top-k %d, KV cache):\n\n", g.temperature, g.top_k);
    fflush(stdout);
    if (cli_generate_run(f, NULL, NULL, &g) != 0)
        goto done;
    if (keep)
        printf("\ncheckpoint: %s (xtc generate models/tiny_gpt.xtf --weights %s --prompt ...)\n", keep, keep);
    rc = 0;
done:
    if (dir[0]) {
        unlink(ckpt);
        rmdir(dir);
    }
    free(text);
    xtf_free(f);
    return rc;
}
