/* build.c: the compile pipeline shared by the commands that make modules (see build.h): lower,
 * differentiate for training, run the passes, generate code; and the small helpers around
 * loading modules and the .xtf text they carry. */
#include "build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int has_output(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->outputs[i].name, name) == 0)
            return 1;
    return 0;
}

IrGraph *cli_build_graph(const XtfFile *f, const CliBuild *b)
{
    IrGraph *g = cli_lower((XtfFile *)f, b->model, &b->lower);
    if (!g)
        return NULL;
    char err[1024];
    if (b->grads) {
        int loss = has_output(g, "loss");
        IrGradOpts go = {.loss = loss ? "loss" : NULL, .seed_outputs = !loss,
                         .loss_scale = cg_loss_scale_input(b->cg.dtype)};
        if (ir_autodiff(g, &go, err, sizeof err) != 0) {
            fprintf(stderr, "xtc: %s: cannot differentiate: %s\n", f->path, err);
            ir_graph_free(g);
            return NULL;
        }
    }
    const CgBackend *be = cg_backend_find(b->cg.target);
    PassOptions every = {.verify_each = 1, .supports = be ? be->supports : NULL}; /* fusions it can lower */
    IrGraph *h = pass_run_pipeline(g, b->passes ? b->passes : &every, err, sizeof err);
    ir_graph_free(g);
    if (!h)
        fprintf(stderr, "xtc: %s: %s\n", f->path, err);
    return h;
}

int cli_build_module(const XtfFile *f, const CliBuild *b, CgStats *stats)
{
    IrGraph *g = cli_build_graph(f, b);
    if (!g)
        return -1;
    CgOptions cg = b->cg;
    if (!cg.source) {
        cg.source = f->src;
        cg.source_name = f->path;
    }
    if (!cg.opt_level)
        cg.opt_level = 2;
    char err[1024];
    int rc = cg_compile(g, &cg, stats, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "xtc: %s: %s\n", f->path, err);
    ir_graph_free(g);
    return rc;
}

XtcModule *cli_load_module(const char *path)
{
    XtcModule *m = NULL;
    if (xtc_module_load(path, &m) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return NULL;
    }
    return m;
}

XtcModule *cli_build_load(const XtfFile *f, CliBuild *b, CgStats *stats)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/xtc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "xtc: cannot create a temporary directory under %s\n", tmp && *tmp ? tmp : "/tmp");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/model.so", dir);
    b->cg.output = path;
    XtcModule *m = cli_build_module(f, b, stats) == 0 ? cli_load_module(path) : NULL;
    b->cg.output = NULL;
    unlink(path);
    rmdir(dir);
    return m;
}

int cli_is_module_path(const char *path)
{
    size_t n = strlen(path);
    return n > 3 && strcmp(path + n - 3, ".so") == 0;
}

XtfFile *cli_module_xtf(const XtcModule *m, const char *path)
{
    const char *src = xtc_module_source(m);
    if (!src || !*src) {
        fprintf(stderr, "xtc: %s carries no .xtf source to recompile from\n", path);
        return NULL;
    }
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse(path, src, strlen(src), &d);
    if (f && !d.nerrors)
        xtf_check(f, &d);
    if (!f || d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        fprintf(stderr, "xtc: the source embedded in %s does not check\n", path);
        xtf_diag_free(&d);
        xtf_free(f);
        return NULL;
    }
    xtf_diag_free(&d);
    return f;
}
