/* cmd_quantize.c: `xtc quantize model.xtf weights.safetensors -o weights.q8.safetensors [--group G]`:
 * the weights file of a module compiled with --weights-dtype int8, its matmul weights stored as I8
 * with their f32 scales ("<name>" I8 [n, k], "<name>.scale" F32 [n, ceil(k / G)]; include/xtc.h,
 * "int8 weights"). Which weights are quantized is the compile's decision (passes/quantize.c, run
 * here on the model), and their values come from the runtime's one rule (runtime/rt_quant.c), so
 * the file holds exactly what the module would compute from the f32 file as it loads it. Every
 * other tensor is copied as it is (but a checkpoint's optimizer state, which is dropped); the
 * metadata is kept, with xtc.quant_group (G, 0 = one scale per output row) added, which the
 * runtime checks against the module's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "cli.h"
#include "rt_quant.h"

/* The int8 weights of the model: the i8 buffers the quantization makes. NULL after printing. */
static IrGraph *quantized_graph(const char *path, const char *model, int group)
{
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return NULL;
    char err[1024];
    CgOptions co = {.target = "interp", .weights_dtype = "int8", .quant_group = group};
    DrvTarget t;
    DrvJob job = {.file = f, .model = model, .stop_after = DRV_AUTODIFF};
    IrGraph *g = NULL;
    if (drv_target(&t, &co, err, sizeof err) != 0 || drv_run(&job, &t, &g, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "xtc quantize: %s\n", err);
        g = NULL;
    }
    xtf_free(f);
    return g;
}

static const IrNode *find_i8(const IrGraph *g, const char *name)
{
    const IrNode *x = ir_find_leaf(g, IR_BUFFER, name);
    return x && x->dtype == IR_I8 ? x : NULL;
}

int cli_quantize(int argc, char **argv)
{
    const char *pos[2] = {NULL, NULL}, *out = NULL, *model = NULL;
    int group = 0;
    const CliOpt opts[] = {
        {"-o", CLI_STR, &out, "PATH", .help = "the weights file to write"},
        {"--group", CLI_INT, &group, "G", .help = "scales per group of G weights along each row (32 to 128 are usual);\n"
         "default: one scale per output row (per output channel)", .lo = 1, .hi = 1 << 20},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the file (default: the last one)"},
    };
    const CliCmd cmd = {
        .name = "quantize", .usage = "model.xtf weights.safetensors -o weights.q8.safetensors [--group G]",
        .about = "Writes the int8 weights of a model: its matmul weights (attention's q, k, v and output\n"
                 "projections, the feed-forward's, the logits head; not embeddings, norms or biases) as\n"
                 "'<name>' I8 [n, k] and '<name>.scale' F32 [n, ceil(k / G)], w = q * scale; every other\n"
                 "tensor as it is. Load it into a module compiled with `xtc compile --weights-dtype int8`\n"
                 "(with the same --group); such a module also loads the f32 file, quantizing as it loads.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = pos, .maxpos = 2, .pos_name = "input file",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!pos[0] || !pos[1] || !out)
        return cli_usage_error(&cmd, !pos[1] ? "a model (.xtf) and its weights (.safetensors) are needed"
                                             : "no output given (-o weights.q8.safetensors)");
    if (cli_output_is_input("quantize", "-o", out, "the weights", pos[1]))
        return 2;
    IrGraph *g = quantized_graph(pos[0], model, group);
    if (!g)
        return 1;
    char err[1024];
    RtStFile *f;
    if (rt_st_open(pos[1], &f, err, sizeof err)) {
        fprintf(stderr, "xtc quantize: %s\n", err);
        ir_graph_free(g);
        return 1;
    }
    RtStWriter *w = rt_st_writer_new();
    int rc = w ? 0 : 1, nq = 0;
    for (int i = 0; rc == 0 && i < rt_st_count(f); i++) {
        const RtStTensor *t = rt_st_get(f, i);
        if (rt_optim_state_param(t->name))
            continue; /* a checkpoint's optimizer state: not for inference */
        const IrNode *x = find_i8(g, t->name);
        if (!x) {
            if (rt_st_writer_add(w, t->name, t->dtype, t->rank, t->shape, t->data))
                rc = 1;
            continue;
        }
        int64_t n = x->shape[0].c, k = x->shape[1].c, gk = rt_quant_group_of(group, k), ng = (k + gk - 1) / gk;
        if (t->rank != 2 || t->shape[0] != n || t->shape[1] != k || t->dtype == RT_I8) {
            fprintf(stderr, "xtc quantize: %s: '%s' is %s of rank %d, expected a float [%lld, %lld] matmul weight%s\n",
                    pos[1], t->name, rt_dtype_name(t->dtype), t->rank, (long long)n, (long long)k,
                    t->dtype == RT_I8 ? " (the file is quantized already)" : "");
            rc = 2;
            break;
        }
        float *v = malloc((size_t)(n * k > 0 ? n * k : 1) * sizeof *v), *scale = malloc((size_t)(n * ng) * sizeof *scale);
        int8_t *q = malloc((size_t)(n * k > 0 ? n * k : 1));
        int64_t bad = -1;
        if (!v || !scale || !q) {
            snprintf(err, sizeof err, "out of memory");
            rc = 1;
        } else if (rt_st_to_f32(t, v, err, sizeof err)) {
            rc = 1;
        } else if ((bad = rt_quantize_rows(v, n, k, group, q, scale)) >= 0) {
            snprintf(err, sizeof err, "'%s' holds %g at [%lld, %lld]: only finite weights can be quantized", t->name,
                     (double)v[bad], (long long)(bad / k), (long long)(bad % k));
            rc = 1;
        } else {
            char sname[1024];
            snprintf(sname, sizeof sname, "%s.scale", t->name);
            int64_t sshape[2] = {n, ng};
            if (rt_st_writer_add(w, t->name, RT_I8, 2, t->shape, q) || rt_st_writer_add(w, sname, RT_F32, 2, sshape, scale))
                rc = 1;
            nq++;
        }
        if (rc == 1 && err[0])
            fprintf(stderr, "xtc quantize: %s: %s\n", pos[1], err);
        free(v);
        free(scale);
        free(q);
    }
    for (int i = 0; w && rc == 0 && i < rt_st_metadata_count(f); i++) {
        const char *key = rt_st_metadata_key(f, i);
        if (strcmp(key, "xtc.quant_group"))
            rt_st_writer_meta(w, key, rt_st_metadata(f, key));
    }
    char gtext[24];
    snprintf(gtext, sizeof gtext, "%d", group);
    if (rc == 0) {
        rt_st_writer_meta(w, "xtc.quant_group", gtext);
        if (rt_st_writer_error(w)[0]) {
            fprintf(stderr, "xtc quantize: %s\n", rt_st_writer_error(w));
            rc = 1;
        } else if (rt_st_writer_save(w, out, err, sizeof err)) {
            fprintf(stderr, "xtc quantize: %s\n", err);
            rc = 1;
        } else {
            if (group)
                printf("%s: %d matmul weights quantized to int8 (a scale per %d weights of a row)\n", out, nq, group);
            else
                printf("%s: %d matmul weights quantized to int8 (a scale per output row)\n", out, nq);
        }
    } else if (w && rt_st_writer_error(w)[0]) {
        fprintf(stderr, "xtc quantize: %s\n", rt_st_writer_error(w));
    }
    rt_st_writer_free(w);
    rt_st_close(f);
    ir_graph_free(g);
    return rc;
}
