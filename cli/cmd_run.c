/* cmd_run.c: `xtc run`: evaluate a model on inputs from a .safetensors file and write its
 * outputs. A .xtf model runs on the reference interpreter (double precision). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "safetensors.h"

typedef struct {
    RtStFile *weights, *inputs;
    void *scratch[256];   /* converted copies, freed at the end */
    int nscratch;
} Binding;

static int map_dtype(RtDType t, IrDType *out)
{
    switch (t) {
    case RT_F32: *out = IR_F32; return 0;
    case RT_I32: *out = IR_I32; return 0;
    case RT_I64: *out = IR_I64; return 0;
    case RT_BOOL:
    case RT_U8: *out = IR_BOOL; return 0;
    default: return -1;
    }
}

static int bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Binding *b = ctx;
    RtStFile *src = leaf->op == IR_INPUT ? b->inputs : b->weights;
    const RtStTensor *t = src ? rt_st_find(src, leaf->s) : NULL;
    if (!t)
        return -1;
    memset(out, 0, sizeof *out);
    out->rank = t->rank;
    for (int i = 0; i < t->rank && i < IR_MAXRANK; i++)
        out->shape[i] = t->shape[i];
    if (map_dtype(t->dtype, &out->dtype) == 0) {
        out->data = (void *)t->data;
        return 0;
    }
    /* other float types (F64, F16, BF16) are converted to f32 */
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->shape[i];
    float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
    char err[256];
    if (!buf || b->nscratch == 256 || rt_st_to_f32(t, buf, err, sizeof err) != 0) {
        free(buf);
        return -1;
    }
    b->scratch[b->nscratch++] = buf;
    out->dtype = IR_F32;
    out->data = buf;
    return 0;
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
        if (!ir_find_leaf(g, IR_PARAM, t->name) && !ir_find_leaf(g, IR_BUFFER, t->name) &&
            !ir_find_alias(g, t->name)) {
            fprintf(stderr, "xtc: %s: unexpected tensor '%s' (not a parameter of this model)\n", path,
                    t->name);
            bad++;
        }
    }
    return bad ? -1 : 0;
}

static void usage(void)
{
    printf("usage: xtc run model.xtf --weights W.safetensors --input I.safetensors --output O.safetensors\n"
           "             [--model NAME] [--grads]\n\n"
           "Runs a model on the inputs and writes its outputs. A .xtf model runs on the reference\n"
           "interpreter (double precision, the oracle of the test suite). Inputs by name: tokens\n"
           "(i64 or i32 [b, n]), mask (bool [b, n], optional), targets (i64 [b, n], optional:\n"
           "when present the output also holds 'loss', the mean cross-entropy over targets >= 0).\n"
           "Weights by x-transformers state_dict name; missing, extra or mis-shaped tensors are\n"
           "errors naming the tensor.\n"
           "  --grads   also write grad.<name> for every parameter: the gradient of 'loss' when\n"
           "            targets are given, else of sum(output * grad.<output>) for the output\n"
           "            gradients grad.<output> supplied in the input file (as y.backward(g))\n");
}

int cli_run(int argc, char **argv)
{
    const char *path = NULL, *wpath = NULL, *ipath = NULL, *opath = NULL, *model = NULL, *v;
    int grads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--weights"))) {
            wpath = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--input"))) {
            ipath = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--output"))) {
            opath = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--model"))) {
            model = v;
        } else if (!strcmp(argv[i], "--grads")) {
            grads = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "xtc run: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "xtc run: more than one model\n");
            return 2;
        }
    }
    if (!path || !wpath || !ipath || !opath) {
        usage();
        return 2;
    }
    char err[1024];
    int rc = 1;
    Binding b = {0};
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
    if (!(g = cli_lower(f, model, &opt)))
        goto done;
    if (grads) {
        /* the built-in loss when the model has one (targets given), else the caller's output
         * gradients grad.<output> from the input file */
        int has_loss = 0;
        for (int i = 0; i < g->noutputs; i++)
            has_loss |= !strcmp(g->outputs[i].name, "loss");
        IrGradOpts go = {.loss = has_loss ? "loss" : NULL, .seed_outputs = !has_loss};
        if (ir_autodiff(g, &go, err, sizeof err) != 0) {
            fprintf(stderr, "xtc: %s\n", err);
            goto done;
        }
    }
    if (check_weights(g, b.weights, wpath) != 0)
        goto done;
    outs = calloc((size_t)g->noutputs, sizeof *outs);
    if (!outs || ir_interp(g, bind, &b, outs, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", outs ? err : "out of memory");
        goto done;
    }
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
    rt_st_close(b.weights);
    rt_st_close(b.inputs);
    ir_graph_free(g);
    xtf_free(f);
    return rc;
}
