/* cmd_run.c: `xtc run`: evaluate a model on inputs from a .safetensors file and write its
 * outputs. A .xtf model runs on the reference interpreter (double precision). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "cli.h"
#include "rt_internal.h"
#include "safetensors.h"

typedef struct {
    RtStFile *weights, *inputs;
    const char *wpath, *ipath;
    void **scratch;       /* converted or realigned copies, freed at the end */
    int nscratch, cap;
    char err[512];        /* why a tensor the file has could not be bound */
} Binding;

static int map_dtype(RtDType t, IrDType *out)
{
    switch (t) {
    case RT_F32: *out = IR_F32; return 0;
    case RT_I32: *out = IR_I32; return 0;
    case RT_I64: *out = IR_I64; return 0;
    case RT_I8: *out = IR_I8; return 0; /* int8 weights (the file of xtc quantize) */
    case RT_BOOL:
    case RT_U8: *out = IR_BOOL; return 0;
    default: return -1;
    }
}

/* A buffer owned by the binding (freed at the end); NULL when out of memory. */
static void *scratch(Binding *b, size_t bytes)
{
    if (b->nscratch == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        void **s = realloc(b->scratch, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        b->scratch = s;
        b->cap = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        b->scratch[b->nscratch++] = p;
    return p;
}

static int bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Binding *b = ctx;
    RtStFile *src = leaf->op == IR_INPUT ? b->inputs : b->weights;
    const RtStTensor *t = src ? rt_st_find(src, leaf->s) : NULL;
    if (!t)
        return -1;
    const char *kind = leaf->op == IR_INPUT ? "input" : "parameter";
    const char *path = leaf->op == IR_INPUT ? b->ipath : b->wpath;
    memset(out, 0, sizeof *out);
    out->rank = t->rank;
    for (int i = 0; i < t->rank && i < IR_MAXRANK; i++)
        out->shape[i] = t->shape[i];
    size_t n = (size_t)rt_st_numel(t);
    if (map_dtype(t->dtype, &out->dtype) == 0) {
        const unsigned char *bytes = t->data;
        for (size_t i = 0; t->dtype == RT_BOOL && i < n; i++)
            if (bytes[i] > 1) {
                snprintf(b->err, sizeof b->err, "%s: %s '%s': BOOL element %zu has byte value %u (not 0 or 1)",
                         path, kind, leaf->s, i, bytes[i]);
                return -1;
            }
        out->data = (void *)t->data;
        if ((uintptr_t)t->data % rt_dtype_size(t->dtype) != 0) {
            /* the file's data need not be aligned; the interpreter reads typed elements */
            if (!(out->data = scratch(b, t->nbytes)))
                goto oom;
            memcpy(out->data, t->data, t->nbytes);
        }
        return 0;
    }
    /* other types are converted: floats (F64, F16, BF16) to f32, integers (I16, I8) to i64 */
    int is_int = t->dtype == RT_I16 || t->dtype == RT_I8;
    if (is_int != (leaf->dtype != IR_F32)) {
        snprintf(b->err, sizeof b->err, "%s: %s '%s' is %s; the model expects %s values", path, kind, leaf->s,
                 rt_dtype_name(t->dtype), ir_dtype_name(leaf->dtype));
        return -1;
    }
    void *buf = scratch(b, n * (is_int ? sizeof(int64_t) : sizeof(float)));
    if (!buf)
        goto oom;
    char err[256];
    if ((is_int ? rt_st_to_i64(t, buf, err, sizeof err) : rt_st_to_f32(t, buf, err, sizeof err)) != 0) {
        snprintf(b->err, sizeof b->err, "%s: %s", path, err); /* err names the tensor */
        return -1;
    }
    out->dtype = is_int ? IR_I64 : IR_F32;
    out->data = buf;
    return 0;
oom:
    snprintf(b->err, sizeof b->err, "%s: %s '%s': out of memory", path, kind, leaf->s);
    return -1;
}

static int rt_of_ir(IrDType t)
{
    switch (t) {
    case IR_F32: return RT_F32;
    case IR_I32: return RT_I32;
    case IR_I64: return RT_I64;
    default: return RT_BOOL;
    }
}

/* Every parameter and buffer of the graph must be in the weights file with its shape, and
 * every tensor of the file must be used (as load_state_dict(strict=True)). */
static int check_weights(const IrGraph *g, RtStFile *w, const char *path)
{
    int bad = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        const RtStTensor *t = rt_st_find(w, n->s);
        if (!t) {
            fprintf(stderr, "xtc: %s: missing tensor '%s'\n", path, n->s);
            bad++;
            continue;
        }
        int same = t->rank == n->rank;
        for (int d = 0; same && d < n->rank; d++)
            same = ir_dim_is_const(n->shape[d]) && t->shape[d] == n->shape[d].c;
        if (!same) {
            char want[128] = "", got[128] = "", dim[32];
            for (int d = 0; d < n->rank; d++) {
                ir_dim_str(g, n->shape[d], dim, sizeof dim);
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", d ? ", " : "", dim);
            }
            for (int d = 0; d < t->rank; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)t->shape[d]);
            fprintf(stderr, "xtc: %s: tensor '%s' has shape [%s], the model expects [%s]\n", path,
                    n->s, got, want);
            bad++;
        }
    }
    for (int i = 0; i < g->naliases; i++) { /* tied tensors: the second name must hold the same values */
        const IrAlias *a = &g->aliases[i];
        const RtStTensor *t = rt_st_find(w, a->name), *u = rt_st_find(w, a->target->s);
        if (!t) {
            fprintf(stderr, "xtc: %s: missing tensor '%s' (tied to '%s')\n", path, a->name, a->target->s);
            bad++;
        } else if (u && (t->nbytes != u->nbytes || t->dtype != u->dtype || memcmp(t->data, u->data, t->nbytes))) {
            fprintf(stderr, "xtc: %s: tensors '%s' and '%s' are tied but hold different values\n", path,
                    a->name, a->target->s);
            bad++;
        }
    }
    for (int i = 0; i < rt_st_count(w); i++) {
        const RtStTensor *t = rt_st_get(w, i);
        const char *of = rt_optim_state_param(t->name); /* a checkpoint's optimizer state: ignored */
        if (of && ir_find_leaf(g, IR_PARAM, of))
            continue;
        if (!ir_find_leaf(g, IR_PARAM, t->name) && !ir_find_leaf(g, IR_BUFFER, t->name) &&
            !ir_find_alias(g, t->name)) {
            fprintf(stderr, "xtc: %s: unexpected tensor '%s' (not a parameter of this model)\n", path,
                    t->name);
            bad++;
        }
    }
    return bad ? -1 : 0;
}

int cli_run(int argc, char **argv)
{
    const char *path = NULL, *wpath = NULL, *ipath = NULL, *opath = NULL, *model = NULL;
    int grads = 0;
    int check_finite = 0;
    int threads = 1; /* a compiled module's (cli_run_module); the interpreter runs on one */
    CgOptions q8 = {.target = "interp"}; /* --weights-dtype int8: the graph of such a module */
    const CliOpt opts[] = {
        {"--weights", CLI_STR, &wpath, "W", .help = "the weights (.safetensors)"},
        {"--input", CLI_STR, &ipath, "I", .help = "the inputs (.safetensors)"},
        {"--output", CLI_STR, &opath, "O", .help = "the outputs to write (.safetensors)"},
        {"--model", CLI_STR, &model, "NAME", .help = ".xtf: which model of the file (default: the last one)"},
        {"--threads", CLI_THREADS, &threads, "T", .help = ".so: worker threads (default 1; the interpreter runs on one)"},
        {"--grads", CLI_FLAG, &grads, .help = "also write grad.<name> for every parameter: the gradient of 'loss' when\n"
         "targets are given, else of sum(output * grad.<output>) for output\n"
         "gradients grad.<output> supplied in the input file (y.backward(g));\na .so must be compiled with --train"},
        {"--check-finite", CLI_FLAG, &check_finite, .help = "refuse NaN or infinity in the weights and inputs, and report an output\n"
         "(with --grads, a gradient) that overflows to one, naming the tensor and\n"
         "the element; the output file is then not written"},
        {"--weights-dtype", CLI_STR, &q8.weights_dtype, "D", .help = ".xtf: int8 evaluates the model as xtc compile --weights-dtype int8\n"
         "compiles it, on weights from xtc quantize (I8 and scales), exactly"},
        {"--group", CLI_INT, &q8.quant_group, "G", .help = ".xtf, with --weights-dtype int8: the scales' group, as for xtc compile",
         .lo = 1, .hi = 1 << 20},
    };
    const CliCmd cmd = {
        .name = "run", .usage = "model.xtf|model.so --weights W --input I --output O [options]",
        .about = "Runs a model on the inputs and writes its outputs. A .so (xtc compile) runs in the\n"
                 "runtime; a .xtf model runs on the reference interpreter (double precision, the oracle\n"
                 "of the test suite). Inputs by name: tokens (i64 or i32 [b, n]), mask (bool [b, n],\n"
                 "optional), targets (i64 [b, n], optional: when present the output also holds 'loss',\n"
                 "the mean cross-entropy over targets >= 0). Weights by x-transformers state_dict name;\n"
                 "missing, extra or mis-shaped tensors are errors naming the tensor. Token ids and\n"
                 "targets must index the model's vocabulary.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "model",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path)
        return cli_usage_error(&cmd, "no model given");
    size_t plen = strlen(path); /* a module by its name, or by its first bytes unless named .xtf */
    if ((plen > 3 && !strcmp(path + plen - 3, ".so")) ||
        (!(plen > 4 && !strcmp(path + plen - 4, ".xtf")) && cli_is_elf_file(path)))
        return cli_run_module(argc, argv); /* a compiled module runs in the runtime */
    if (!wpath || !ipath || !opath)
        return cli_usage_error(&cmd, !wpath ? "no --weights given" : !ipath ? "no --input given" : "no --output given");
    if (cli_output_is_input("run", "--output", opath, "--input", ipath) ||
        cli_output_is_input("run", "--output", opath, "--weights", wpath) ||
        cli_output_is_input("run", "--output", opath, "the model", path))
        return 2;
    char err[1024];
    int rc = 1;
    Binding b = {.wpath = wpath, .ipath = ipath};
    XtfFile *f = NULL;
    IrGraph *g = NULL;
    IrHostTensor *outs = NULL;
    if (rt_st_open(wpath, &b.weights, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        goto done;
    }
    if (rt_st_open(ipath, &b.inputs, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        goto done;
    }
    if (!(f = cli_load_xtf(path)))
        goto done;
    XtLowerOpts opt = {
        .train = rt_st_find(b.inputs, "targets") != NULL,
        .mask = rt_st_find(b.inputs, "mask") != NULL,
        .src_mask = rt_st_find(b.inputs, "src_mask") != NULL,
        .context_mask = rt_st_find(b.inputs, "context_mask") != NULL,
        .tgt_mask = rt_st_find(b.inputs, "tgt_mask") != NULL,
    };
    /* --grads: the built-in loss when the model has one (targets given), else the caller's
     * output gradients grad.<output> from the input file; for the interpreter, unscaled */
    DrvTarget interp;
    DrvJob job = {.file = f, .model = model, .lower = opt, .grads = grads, .stop_after = DRV_AUTODIFF};
    if (drv_target(&interp, &q8, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        goto done;
    }
    if (cli_drive("xtc", &job, &interp, &g, NULL) != 0)
        goto done;
    for (int i = 0; i < g->nnodes; i++) { /* int8 weights: the interpreter reads them as xtc quantize wrote them */
        const IrNode *x = g->nodes[i];
        const RtStTensor *t = x->op == IR_BUFFER && x->dtype == IR_I8 ? rt_st_find(b.weights, x->s) : NULL;
        if (t && t->dtype != RT_I8) {
            fprintf(stderr, "xtc: %s: '%s' is %s: with --weights-dtype int8 the interpreter takes the int8 weights "
                            "of xtc quantize (I8 and scales); quantize the file first\n", wpath, x->s,
                    rt_dtype_name(t->dtype));
            goto done;
        }
    }
    if (check_weights(g, b.weights, wpath) != 0 || cli_check_ids(g, b.inputs, ipath) != 0)
        goto done;
    if (check_finite && (cli_check_finite_file(g, b.weights, wpath, 0) != 0 ||
                         cli_check_finite_file(g, b.inputs, ipath, 1) != 0))
        goto done;
    outs = calloc((size_t)g->noutputs, sizeof *outs);
    if (!outs || ir_interp(g, bind, &b, outs, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", !outs ? "out of memory" : b.err[0] ? b.err : err);
        goto done;
    }
    if (check_finite && cli_check_finite_outputs(g, outs) != 0)
        goto done;
    RtStWriter *w = rt_st_writer_new();
    int ok = w != NULL;
    for (int i = 0; ok && i < g->noutputs; i++)
        ok = rt_st_writer_add(w, g->outputs[i].name, rt_of_ir(outs[i].dtype), outs[i].rank,
                              outs[i].shape, outs[i].data) == 0;
    if (ok)
        ok = rt_st_writer_save(w, opath, err, sizeof err) == 0;
    else
        snprintf(err, sizeof err, "cannot assemble the outputs");
    rt_st_writer_free(w);
    if (!ok) {
        fprintf(stderr, "xtc: %s\n", err);
        goto done;
    }
    rc = 0;
done:
    if (outs && g)
        for (int i = 0; i < g->noutputs; i++)
            ir_host_free(&outs[i]);
    free(outs);
    for (int i = 0; i < b.nscratch; i++)
        free(b.scratch[i]);
    free(b.scratch);
    rt_st_close(b.weights);
    rt_st_close(b.inputs);
    ir_graph_free(g);
    xtf_free(f);
    return rc;
}
