/* cmd_ir.c: `xtc ir`: print the IR of a model. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "passes.h"

static void usage(void)
{
    printf("usage: xtc ir model.xtf [--model NAME] [--train] [--mask] [--kv-cache]\n"
           "              [--after=PASS|all] [--disable-pass=NAME]... [--no-fuse] [--list-passes]\n\n"
           "Prints the tensor IR of a model, one op per line with its type: as lowered from the\n"
           "source by default, or after a pass of the pipeline.\n"
           "  --after=PASS  run the pipeline up to and including PASS ('all': the whole pipeline)\n"
           "  --disable-pass=NAME  skip that pass (repeatable)\n"
           "  --no-fuse     skip every fusion pass\n"
           "  --list-passes list the passes in pipeline order and exit\n"
           "  --model NAME  which model of the file (default: the last one)\n"
           "  --train       include the targets input, the loss output and the backward graph\n"
           "                (one output grad.<name> per parameter; without a loss, the\n"
           "                gradient of each output comes in as the input grad.<output>)\n"
           "  --kv-cache    the incremental-decoding form (cache.<l>.k/.v in and out)\n"
           "  --mask        include the padding-mask inputs (mask, src_mask, tgt_mask, context_mask)\n");
}

int cli_ir(int argc, char **argv)
{
    const char *path = NULL, *model = NULL, *v, *after = NULL;
    const char *disabled[64];
    PassOptions po = {0};
    po.disable = disabled;
    po.verify_each = 1;
    char err[512];
    XtLowerOpts opt = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--model"))) {
            model = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--after"))) {
            if (strcmp(v, "all") && strcmp(v, "lower") && pass_check_name(v, err, sizeof err)) {
                fprintf(stderr, "xtc ir: %s\n", err);
                return 2;
            }
            after = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--disable-pass"))) {
            if (pass_check_name(v, err, sizeof err) || po.ndisable == 64) {
                fprintf(stderr, "xtc ir: %s\n", po.ndisable == 64 ? "too many --disable-pass" : err);
                return 2;
            }
            disabled[po.ndisable++] = v;
        } else if (!strcmp(argv[i], "--no-fuse")) {
            po.no_fuse = 1;
        } else if (!strcmp(argv[i], "--list-passes")) {
            pass_list(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--train")) {
            opt.train = 1;
        } else if (!strcmp(argv[i], "--kv-cache")) {
            opt.kv_cache = 1;
        } else if (!strcmp(argv[i], "--mask")) {
            opt.mask = opt.src_mask = opt.tgt_mask = opt.context_mask = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "xtc ir: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "xtc ir: more than one input file\n");
            return 2;
        }
    }
    if (!path) {
        usage();
        return 2;
    }
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    IrGraph *g = cli_lower(f, model, &opt);
    xtf_free(f);
    if (!g)
        return 1;
    /* the loss when the model has one, else every output seeded by an input grad.<output> */
    IrGradOpts grad = {.seed_outputs = 1};
    for (int i = 0; i < g->noutputs; i++)
        if (!strcmp(g->outputs[i].name, "loss"))
            grad.loss = "loss";
    if (opt.train && ir_autodiff(g, &grad, err, sizeof err) < 0) {
        fprintf(stderr, "xtc ir: %s\n", err);
        ir_graph_free(g);
        return 1;
    }
    if (after && strcmp(after, "lower")) { /* autodiff first, then the passes (STYLE.md 4) */
        po.stop_after = strcmp(after, "all") ? after : NULL;
        IrGraph *opt_g = pass_run_pipeline(g, &po, err, sizeof err);
        ir_graph_free(g);
        if (!opt_g) {
            fprintf(stderr, "xtc ir: %s\n", err);
            return 1;
        }
        g = opt_g;
    }
    ir_print(g, stdout);
    ir_graph_free(g);
    return 0;
}
