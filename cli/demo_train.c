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
    const char *keep = NULL;
    long steps = t.steps, tokens = g.tokens, seed = 1;
    int threads = 0;
    const CliOpt opts[] = {
        {"--steps", CLI_LONG, &steps, "N", .help = "training steps (500)", .lo = 1, .hi = 1e8},
        {"--threads", CLI_THREADS, &threads, "T", .help = "worker threads (the number of CPUs)"},
        {"--prompt", CLI_ANY_STR, &g.prompt, "TEXT", .help = "the beginning of the sample (\"The \")"},
        {"--tokens", CLI_LONG, &tokens, "N", .help = "bytes to sample (300)", .lo = 0, .hi = 1e8},
        {"--seed", CLI_LONG, &seed, "S", .help = "initialisation, batches, dropout and sampling (1)", .lo = 0, .hi = 1e8},
        {"--ckpt", CLI_STR, &keep, "PATH", .help = "keep the trained checkpoint (for xtc generate models/tiny_gpt.xtf\n"
         "--weights PATH)"},
        {"--inference", CLI_NOT_HERE, .help = "must be the first argument (xtc demo --inference [--prompt TEXT] "
         "[--seed N] [--threads T])"},
    };
    const CliCmd cmd = {
        .name = "demo", .usage = "[--steps N] [--threads T] [--prompt TEXT] [--tokens N] [--seed S] [--ckpt PATH]\n"
                                 "       xtc demo --inference [--prompt TEXT] [--seed N] [--threads T]",
        .about = "Trains the bundled tiny GPT (models/tiny_gpt.xtf: 4 layers, dim 128, bytes as tokens) for\n"
                 "N steps on 400 kB of generated English-like text, printing the validation loss,\n"
                 "then samples bytes after the prompt with the KV cache.\n",
        .after = "xtc demo --inference runs the inference demo instead: the bundled 12-layer GPT compiled\n"
                 "to native code, checked against the reference interpreter (xtc demo --inference --help).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts),
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    t.steps = steps;
    t.threads = g.threads = threads;
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
