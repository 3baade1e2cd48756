/* cmd_convert.c: `xtc convert`: a checkpoint of one x-transformers version as the checkpoint of
 * another, for a model whose math is the same in both (frontend/versions.h holds what differs).
 *
 * The model is lowered under both versions; each parameter and buffer of the target is taken
 * from the source tensor of the same role (names rewritten by the version table: token_emb,
 * ff / net, final_norm / norm, LayerNorm weight / gamma), with stored norm gains shifted where
 * one version stores gain - 1. A target bias or buffer the source lacks starts at zero; a source
 * bias the target lacks must be zero. Everything else is refused with the reason: options the
 * target does not have, rotary that rotates v or pairs dimensions differently, a final norm of
 * another class, a learned qk-norm temperature against a fixed scale, one head with and
 * without to_out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "cli.h"
#include "options.h"

typedef struct {
    const XtVersion *S, *T;
    int off_s, off_t; /* stored norm gains are gain - 1 (2.x norm_add_unit_offset) */
} Conv;

/* Options of the model that the target version lacks: one error each; returns their count. */
static int foreign_options(const XtfValue *call, int target, const char *path)
{
    int bad = 0;
    while (call && call->kind == XV_REF)
        call = call->ref;
    if (!call || call->kind != XV_CALL)
        return 0;
    const XtfCtor *c = xtf_ctor_find(call->s);
    for (int i = 0; c && i < call->nargs; i++) {
        const XtfOption *o = xtf_option_find(c, call->args[i].key);
        if (o && !(xtf_option_versions(o) & XT_V_BIT(target))) {
            fprintf(stderr, "xtc convert: %s:%d: '%s' has no counterpart in x-transformers %s as xtc implements it\n",
                    path, call->args[i].loc.line, call->args[i].key, xt_versions[target].name);
            bad++;
        }
        bad += foreign_options(call->args[i].value, target, path);
    }
    return bad;
}

static int rotary_dim(const XtfValue *layers, const XtVersion *V)
{
    const XtfValue *rd = xtf_arg(layers, "rotary_emb_dim");
    int r = rd && rd->kind == XV_INT ? (int)rd->i : (int)xtf_int(layers, "attn_dim_head") / 2;
    return r < V->rotary_min_dim ? V->rotary_min_dim : r;
}

/* Where the math of the two versions differs for this model: the reason, or NULL. */
static const char *math_differs(const XtfValue *layers, const Conv *cv, char *buf, size_t n)
{
    const XtVersion *S = cv->S, *T = cv->T;
    if (xtf_bool(layers, "rotary_pos_emb")) {
        if (S->rotary_on_v != T->rotary_on_v)
            return "rotary_pos_emb rotates v in x-transformers 0.23.0 and not later";
        if (S->rotary_interleaved != T->rotary_interleaved)
            return "rotary_pos_emb pairs dimensions (i, i + r/2) before 2.x and (2i, 2i+1) in 2.x";
        if (rotary_dim(layers, S) != rotary_dim(layers, T)) {
            snprintf(buf, n, "the rotary dimension is %d in %s and %d in %s (set rotary_emb_dim)",
                     rotary_dim(layers, S), S->name, rotary_dim(layers, T), T->name);
            return buf;
        }
    }
    int other_norm = xtf_bool(layers, "use_rmsnorm") || xtf_bool(layers, "use_scalenorm") ||
                     xtf_bool(layers, "use_simple_rmsnorm");
    if (other_norm && S->final_norm_follows != T->final_norm_follows)
        return "the final norm is a LayerNorm in x-transformers 0.23.0 and the layers' own norm later";
    if (xtf_bool(layers, "attn_qk_norm") && S->qk_norm_fixed != T->qk_norm_fixed)
        return "attn_qk_norm learns a temperature in x-transformers 0.23.0 and uses a fixed scale later";
    if (xtf_bool(layers, "attn_qk_norm") && xtf_bool(layers, "attn_qk_norm_dim_scale") &&
        S->qk_dim_scale_kv != T->qk_dim_scale_kv)
        return "attn_qk_norm_dim_scale scales the logits by qk_norm_scale in 1.x and by dim_head^-0.5 in 2.x";
    if (xtf_int(layers, "heads") == 1 && S->single_head_no_to_out != T->single_head_no_to_out)
        return "with one head x-transformers 2.x has no to_out";
    return NULL;
}

static int is_norm_name(const char *name, const XtVersion *V)
{
    size_t fl = strlen(V->final_norm);
    if (strncmp(name, V->final_norm, fl) == 0 && name[fl] == '.')
        return 1;
    int layer;
    char rest[8];
    /* attn_layers.layers.<i>.0.<j>.<leaf>: a layer's norms */
    return sscanf(name, "attn_layers.layers.%d.0.%*d.%7s", &layer, rest) == 2;
}

static void replace(char *s, size_t cap, const char *from, const char *to)
{
    char *p = strstr(s, from);
    if (!p)
        return;
    char tail[512];
    snprintf(tail, sizeof tail, "%s", p + strlen(from));
    snprintf(p, cap - (size_t)(p - s), "%s%s", to, tail);
}

/* name, spelt for version A, as version B spells it */
static void map_name(const char *name, const XtVersion *A, const XtVersion *B, char *out, size_t cap)
{
    char a[64], b[64];
    snprintf(out, cap, "%s", name);
    if (strcmp(name, A->token_emb) == 0) {
        snprintf(out, cap, "%s", B->token_emb);
        return;
    }
    int norm = is_norm_name(name, A);
    snprintf(a, sizeof a, "%s.", A->final_norm);
    snprintf(b, sizeof b, "%s.", B->final_norm);
    if (strncmp(out, a, strlen(a)) == 0)
        replace(out, cap, a, b);
    snprintf(a, sizeof a, ".%s.0.", A->ff_net);
    snprintf(b, sizeof b, ".%s.0.", B->ff_net);
    replace(out, cap, a, b);
    snprintf(a, sizeof a, ".%s.%d.", A->ff_net, A->ff_out_index);
    snprintf(b, sizeof b, ".%s.%d.", B->ff_net, B->ff_out_index);
    replace(out, cap, a, b);
    size_t len = strlen(out);
    if (norm && A->layer_norm_bias != B->layer_norm_bias) {
        const char *from = A->layer_norm_bias ? ".weight" : ".gamma", *to = A->layer_norm_bias ? ".gamma" : ".weight";
        if (len > strlen(from) && strcmp(out + len - strlen(from), from) == 0)
            snprintf(out + len - strlen(from), cap - (len - strlen(from)), "%s", to);
        const char *bf = A->layer_norm_bias ? ".bias" : ".beta", *bt = A->layer_norm_bias ? ".beta" : ".bias";
        if (len > strlen(bf) && strcmp(out + len - strlen(bf), bf) == 0)
            snprintf(out + len - strlen(bf), cap - (len - strlen(bf)), "%s", bt);
    }
}

static int is_gain(const char *name, const XtVersion *V)
{
    size_t n = strlen(name);
    return is_norm_name(name, V) && ((n > 2 && strcmp(name + n - 2, ".g") == 0) ||
                                     (n > 6 && strcmp(name + n - 6, ".gamma") == 0));
}

static int zero_fill_ok(const char *name)
{
    size_t n = strlen(name);
    return (n > 5 && strcmp(name + n - 5, ".bias") == 0) || (n > 5 && strcmp(name + n - 5, ".beta") == 0);
}

static int convert(const IrGraph *gt, const RtStFile *in, const Conv *cv, RtStWriter *w)
{
    int n = rt_st_count(in);
    char *used = calloc((size_t)n + 1, 1);
    int rc = 0;
    for (int i = 0; i < gt->nnodes && rc == 0; i++) {
        const IrNode *leaf = gt->nodes[i];
        if (leaf->op != IR_PARAM && leaf->op != IR_BUFFER)
            continue;
        int64_t shape[RT_ST_MAX_RANK], numel = 1;
        for (int d = 0; d < leaf->rank; d++)
            numel *= (shape[d] = leaf->shape[d].c);
        char src[512];
        map_name(leaf->s, cv->T, cv->S, src, sizeof src);
        const RtStTensor *t = rt_st_find(in, src);
        float *v = calloc((size_t)numel + 1, sizeof *v);
        if (!v) {
            rc = -1;
            break;
        }
        char err[256];
        if (t) {
            used[t - rt_st_get(in, 0)] = 1;
            int same = t->rank == leaf->rank && rt_st_numel(t) == numel;
            for (int d = 0; same && d < t->rank; d++)
                same = t->shape[d] == shape[d];
            if (!same) {
                fprintf(stderr, "xtc convert: %s has another shape than %s of x-transformers %s needs\n", src,
                        leaf->s, cv->T->name);
                rc = -1;
            } else if (rt_st_to_f32(t, v, err, sizeof err) != RT_ST_OK) {
                fprintf(stderr, "xtc convert: %s: %s\n", src, err);
                rc = -1;
            } else if (is_gain(leaf->s, cv->T)) {
                for (int64_t k = 0; k < numel; k++)
                    v[k] += (float)(cv->off_s - cv->off_t);
            }
        } else if (!zero_fill_ok(leaf->s)) {
            fprintf(stderr, "xtc convert: the weights have no %s (x-transformers %s's %s)\n", src, cv->T->name, leaf->s);
            rc = -1;
        }
        if (rc == 0 && rt_st_writer_add(w, leaf->s, RT_F32, leaf->rank, shape, v) != RT_ST_OK)
            rc = -1;
        free(v);
    }
    /* what the target has no place for: only zero biases may go */
    for (int i = 0; i < n && rc == 0; i++) {
        const RtStTensor *t = rt_st_get(in, i);
        if (used[i])
            continue;
        int64_t numel = rt_st_numel(t);
        float *v = malloc(((size_t)(numel > 0 ? numel : 0) + 1) * sizeof *v);
        double mx = 0;
        if (v && rt_st_to_f32(t, v, NULL, 0) == RT_ST_OK)
            for (int64_t k = 0; k < numel; k++)
                mx = fmax(mx, fabs(v[k]));
        else
            mx = INFINITY;
        free(v);
        if (!zero_fill_ok(t->name)) {
            fprintf(stderr, "xtc convert: %s has no place in x-transformers %s's model\n", t->name, cv->T->name);
            rc = -1;
        } else if (mx != 0) {
            fprintf(stderr, "xtc convert: %s is not zero (max |x| = %g): x-transformers %s has no such bias\n",
                    t->name, mx, cv->T->name);
            rc = -1;
        }
    }
    free(used);
    return rc;
}

int cli_convert(int argc, char **argv)
{
    const char *path = NULL, *weights = NULL, *to = NULL, *out = NULL, *model = NULL;
    const CliOpt opts[] = {
        {"--weights", CLI_STR, &weights, "W", .help = "the checkpoint (.safetensors) of the version the model file states"},
        {"--to", CLI_STR, &to, "VERSION", .help = "the x-transformers version to convert to (2.26.4, 1.29.2, 0.23.0)"},
        {"-o", CLI_STR, &out, "OUT", .help = "the converted checkpoint (.safetensors)"},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the file (default: the last one)"},
    };
    const CliCmd cmd = {
        .name = "convert", .usage = "model.xtf --weights W --to VERSION -o OUT",
        .about = "Writes the checkpoint of a model for another x-transformers version: the same\n"
                 "model under that version's state_dict names and storage (norm gains, biases), where\n"
                 "the two versions compute the same function; otherwise it says why not. The model\n"
                 "file states the source version (xtransformers = \"1.29.2\"; none: 0.23.0).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "model file",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path || !weights || !to || !out)
        return cli_usage_error(&cmd, "a model file, --weights, --to and -o are required");
    int target = xt_version_find(to);
    if (target < 0) {
        fprintf(stderr, "xtc convert: '%s' is not a version xtc mirrors (0.23.0, 1.29.2, 2.26.4)\n", to);
        return 2;
    }
    if (cli_output_is_input("convert", "-o", out, "--weights", weights))
        return 1;
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    int rc = 1, source = f->version;
    const XtfStmt *st = model ? xtf_find(f, model) : f->nstmts ? &f->stmts[f->nstmts - 1] : NULL;
    const XtfValue *call = st ? st->value : NULL;
    while (call && call->kind == XV_REF)
        call = call->ref;
    const XtfValue *layers = call && call->kind == XV_CALL && strcmp(call->s, "TransformerWrapper") == 0
                                 ? xtf_callv(call, "attn_layers") : NULL;
    RtStFile *in = NULL;
    IrGraph *gt = NULL;
    RtStWriter *w = NULL;
    char err[512], buf[200];
    Conv cv = {&xt_versions[source], &xt_versions[target], 0, 0};
    if (!layers) {
        fprintf(stderr, "xtc convert: %s: converts a TransformerWrapper model\n", path);
        goto done;
    }
    if (foreign_options(call, target, path))
        goto done;
    const char *why = math_differs(layers, &cv, buf, sizeof buf);
    if (why) {
        fprintf(stderr, "xtc convert: x-transformers %s and %s compute this model differently: %s\n",
                cv.S->name, cv.T->name, why);
        goto done;
    }
    cv.off_s = cv.S->unit_offset_option && xtf_bool(layers, "norm_add_unit_offset");
    cv.off_t = cv.T->unit_offset_option && xtf_bool(layers, "norm_add_unit_offset");
    f->version = target; /* the same model under the target's table */
    DrvTarget interp;
    DrvJob job = {.file = f, .model = model, .stop_after = DRV_LOWER};
    if (drv_target(&interp, &(CgOptions){.target = "interp"}, err, sizeof err) != 0 ||
        cli_drive("xtc convert", &job, &interp, &gt, NULL) != 0)
        gt = NULL;
    f->version = source;
    if (!gt)
        goto done;
    if (rt_st_open(weights, &in, err, sizeof err) != RT_ST_OK) {
        fprintf(stderr, "xtc convert: %s\n", err);
        goto done;
    }
    w = rt_st_writer_new();
    if (!w || convert(gt, in, &cv, w) != 0)
        goto done;
    rt_st_writer_meta(w, "x_transformers_version", cv.T->name);
    if (rt_st_writer_save(w, out, err, sizeof err) != RT_ST_OK) {
        fprintf(stderr, "xtc convert: %s\n", err);
        goto done;
    }
    printf("%s: the checkpoint for x-transformers %s (state xtransformers = \"%s\" first in the model file)\n", out,
           cv.T->name, cv.T->name);
    if (cv.S->mask_queries != cv.T->mask_queries)
        printf("note: with a padding mask the outputs at padded positions differ between the versions (real "
               "positions agree)\n");
    rc = 0;
done:
    rt_st_writer_free(w);
    rt_st_close(in);
    ir_graph_free(gt);
    xtf_free(f);
    return rc;
}
