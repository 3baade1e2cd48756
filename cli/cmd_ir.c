/* cmd_ir.c: `xtc ir`: print the IR of a model. */
#include <stdio.h>
#include <string.h>

#include "build.h"
#include "cli.h"
#include "passes.h"

static int opt_after(const char *v, void *ptr, char *err, size_t n)
{
    if (strcmp(v, "all") && strcmp(v, "lower") && pass_check_name(v, err, n))
        return -1;
    *(const char **)ptr = v;
    return 0;
}

int cli_ir(int argc, char **argv)
{
    const char *path = NULL, *model = NULL, *after = NULL;
    const char *disabled[CLI_MAX_DISABLE];
    PassOptions po = {0};
    po.disable = disabled;
    po.verify_each = 1;
    char err[512];
    XtLowerOpts opt = {0};
    CgOptions co = {0};
    int list_passes = 0;
    const CliOpt opts[] = {
        {"--after", CLI_FN, &after, "PASS", .help = "run the pipeline up to and including PASS ('all': the whole pipeline)",
         .fn = opt_after},
        {"--disable-pass", CLI_FN, &po, "NAME", .help = "skip that pass (repeatable)", .fn = cli_opt_disable_pass},
        {"--no-fuse", CLI_FLAG, &po.no_fuse, .help = "skip every fusion pass"},
        {"--list-passes", CLI_FLAG, &list_passes, .help = "list the passes in pipeline order and exit"},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the file (default: the last one)"},
        {"--train", CLI_FLAG, &opt.train, .help = "include the targets input, the loss output and the backward graph\n"
         "(one output grad.<name> per parameter; without a loss, the\n"
         "gradient of each output comes in as the input grad.<output>)"},
        {"--kv-cache", CLI_FLAG, &opt.kv_cache, .help = "the incremental-decoding form (cache.<l>.k/.v in and out)"},
        {"--mask", CLI_FN, &opt, .help = "include the padding-mask inputs (mask, src_mask, tgt_mask, context_mask)",
         .fn = cli_opt_mask},
        {"--target", CLI_STR, &co.target, "T", .help = "the backend whose compile the passes prepare for: cpu (default), cuda,\n"
         "cuda-emu (the fusions it can lower, within its kernels' limits)"},
        {"--dtype", CLI_FN, &co.dtype, "D", .help = "cuda, cuda-emu: the storage compiled for; --train --dtype fp16 adds the\n"
         "loss_scale input (as xtc compile does)", .fn = cli_opt_dtype},
    };
    const CliCmd cmd = {
        .name = "ir", .usage = "model.xtf [options]",
        .about = "Prints the tensor IR of a model, one op per line with its type: as lowered from the\n"
                 "source by default, or after a pass of the pipeline.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "input file",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (list_passes) {
        pass_list(stdout);
        return 0;
    }
    if (!path)
        return cli_usage_error(&cmd, "no model file given");
    DrvTarget target; /* the IR the target's compile would see: its fusions, its loss scale */
    if (drv_target(&target, &co, err, sizeof err) != 0) {
        fprintf(stderr, "xtc ir: %s\n", err);
        return 2;
    }
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    /* --train: the loss when the model has one, else every output seeded by an input
     * grad.<output>; autodiff first, then the passes (STYLE.md 4) */
    int passes = after && strcmp(after, "lower");
    po.stop_after = passes && strcmp(after, "all") ? after : NULL;
    DrvJob job = {.file = f, .model = model, .lower = opt, .grads = opt.train, .passes = &po,
                  .stop_after = passes ? DRV_PASSES : DRV_AUTODIFF};
    IrGraph *g = NULL;
    int rc = cli_drive("xtc ir", &job, &target, &g, NULL);
    xtf_free(f);
    if (rc != 0)
        return 1;
    ir_print(g, stdout);
    ir_graph_free(g);
    return 0;
}
