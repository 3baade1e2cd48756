/* cli_common.c: helpers shared by the subcommands: flag parsing, loading and lowering .xtf. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

const char *cli_flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] == 0) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "xtc: %s needs a value\n", name);
            return "";
        }
        return argv[++*i];
    }
    return NULL;
}

XtfFile *cli_load_xtf(const char *path)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(path, &d);
    if (f && d.nerrors == 0)
        xtf_check(f, &d);
    if (d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        fprintf(stderr, "xtc: %d error%s in %s\n", d.nerrors, d.nerrors == 1 ? "" : "s", path);
        xtf_diag_free(&d);
        xtf_free(f);
        return NULL;
    }
    if (d.text && d.len)
        fputs(d.text, stderr); /* notes and warnings */
    xtf_diag_free(&d);
    return f;
}

IrGraph *cli_lower(XtfFile *f, const char *model, const XtLowerOpts *opt)
{
    XtfDiag d;
    xtf_diag_init(&d);
    IrGraph *g = xt_lower(f, model, opt, &d);
    if (!g || d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        fprintf(stderr, "xtc: cannot lower %s\n", f->path);
        xtf_diag_free(&d);
        ir_graph_free(g);
        return NULL;
    }
    xtf_diag_free(&d);
    char err[512];
    if (ir_verify(g, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: internal error: lowered IR does not verify: %s\n", err);
        ir_graph_free(g);
        return NULL;
    }
    return g;
}

int cli_check(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: xtc check model.xtf\n\n"
               "Parses and checks the file against the option table, printing every error\n"
               "(file:line:col, the line and a caret). Exit status 0 when the file is valid.\n");
        return argc < 2 ? 2 : 0;
    }
    XtfFile *f = cli_load_xtf(argv[1]);
    if (!f)
        return 1;
    /* lower every model as `xtc compile --model NAME` would (default options), so that the
     * combinations only lowering refuses get the same verdict here */
    static const char *const wrappers[] = {"TransformerWrapper", "ContinuousTransformerWrapper",
                                           "ViTransformerWrapper", "XTransformer", "EncoderDecoder"};
    int bad = 0;
    for (int i = 0; i < f->nstmts; i++) {
        const XtfValue *call = f->stmts[i].value;
        while (call && call->kind == XV_REF)
            call = call->ref;
        int model = i == f->nstmts - 1; /* the default of compile: refused there if not a model */
        for (size_t k = 0; call && call->kind == XV_CALL && k < sizeof wrappers / sizeof wrappers[0]; k++)
            model |= !strcmp(call->s, wrappers[k]);
        if (!model)
            continue;
        XtfDiag d;
        xtf_diag_init(&d);
        IrGraph *g = xt_lower(f, f->stmts[i].name, NULL, &d);
        if (!g || d.nerrors) {
            fputs(d.text ? d.text : "", stderr);
            bad++;
        }
        ir_graph_free(g);
        xtf_diag_free(&d);
    }
    if (bad) {
        fprintf(stderr, "xtc: %d model%s in %s cannot be compiled\n", bad, bad == 1 ? "" : "s", argv[1]);
        xtf_free(f);
        return 1;
    }
    printf("%s: ok, %d model%s\n", argv[1], f->nstmts, f->nstmts == 1 ? "" : "s");
    xtf_free(f);
    return 0;
}
