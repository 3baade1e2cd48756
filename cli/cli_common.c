/* cli_common.c: helpers shared by the subcommands: loading .xtf, `xtc check` (which lowers
 * through the compile driver). */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "codegen.h"
#include "rt_fileio.h"
#include "passes.h"
#include "versions.h"

int cli_opt_disable_pass(const char *v, void *ptr, char *err, size_t n)
{
    PassOptions *po = ptr;
    if (pass_check_name(v, err, n) != 0)
        return -1;
    if (po->ndisable == CLI_MAX_DISABLE) {
        snprintf(err, n, "at most %d passes can be disabled", CLI_MAX_DISABLE);
        return -1;
    }
    ((const char **)po->disable)[po->ndisable++] = v;
    return 0;
}

int cli_opt_mask(const char *v, void *ptr, char *err, size_t n)
{
    (void)v, (void)err, (void)n;
    XtLowerOpts *lo = ptr;
    lo->mask = lo->src_mask = lo->tgt_mask = lo->context_mask = 1;
    return 0;
}

int cli_opt_dtype(const char *v, void *ptr, char *err, size_t n)
{
    if (cg_dtype_parse(v, err, n) < 0)
        return -1;
    *(const char **)ptr = v;
    return 0;
}

int cli_opt_mma(const char *v, void *ptr, char *err, size_t n)
{
    if ((*(int *)ptr = cg_mma_parse(v)) < 0) {
        snprintf(err, n, "expected bf16, fp16 or off, got '%s'", v);
        return -1;
    }
    return 0;
}

/* A compiled module or another binary file given where a .xtf source belongs: one line naming it,
 * before the parser quotes its bytes as source lines. Only regular files are looked at (reading
 * a FIFO or a terminal would take what the parser is to read). Returns -1 after printing. */
static int check_text(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    unsigned char b[4096];
    ssize_t n = read(fd, b, sizeof b);
    close(fd);
    if (n >= 4 && !memcmp(b, "\177ELF", 4)) {
        fprintf(stderr, "xtc: %s is a compiled module, not a .xtf source (use xtc run/info)\n", path);
        return -1;
    }
    int controls = 0;
    for (ssize_t i = 0; i < n; i++) {
        int c = b[i];
        if (c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') || c == 0x7f)
            if (c == 0 || ++controls >= 8) {
                fprintf(stderr, "xtc: %s is not a text file (byte 0x%02x at offset %zd); a .xtf source is text\n",
                        path, c, i);
                return -1;
            }
    }
    return 0;
}

int cli_output_is_input(const char *cmd, const char *out_name, const char *out, const char *in_name, const char *in)
{
    if (!rt_file_same(out, in))
        return 0;
    fprintf(stderr, "xtc %s: %s %s is the same file as %s %s; refusing to overwrite an input\n", cmd, out_name,
            out, in_name, in);
    return 1;
}

XtfFile *cli_load_xtf(const char *path)
{
    if (check_text(path) != 0)
        return NULL;
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

int cli_check(int argc, char **argv)
{
    const char *path = NULL;
    const CliCmd cmd = {
        .name = "check", .usage = "model.xtf",
        .about = "Parses and checks the file against the option table, printing every error\n"
                 "(file:line:col, the line and a caret). Exit status 0 when the file is valid.\n",
        .pos = &path, .maxpos = 1, .pos_name = "file",
    };
    int rc = cli_parse(&cmd, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (!path)
        return cli_usage_error(&cmd, "no file given");
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    /* lower every model as `xtc compile --model NAME` would (default options), so that the
     * combinations only lowering refuses get the same verdict here */
    static const char *const wrappers[] = {"TransformerWrapper", "ContinuousTransformerWrapper",
                                           "ViTransformerWrapper", "XTransformer", "EncoderDecoder"};
    int bad = 0;
    DrvTarget interp; /* lowering reads no target */
    char err[512];
    drv_target(&interp, &(CgOptions){.target = "interp"}, err, sizeof err);
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
        DrvJob job = {.file = f, .model = f->stmts[i].name, .diag = &d, .stop_after = DRV_LOWER};
        if (drv_run(&job, &interp, NULL, NULL, err, sizeof err) != 0) {
            if (d.nerrors)
                fputs(d.text ? d.text : "", stderr);
            else
                fprintf(stderr, "xtc: %s\n", err);
            bad++;
        }
        xtf_diag_free(&d);
    }
    if (bad) {
        fprintf(stderr, "xtc: %d model%s in %s cannot be compiled\n", bad, bad == 1 ? "" : "s", path);
        xtf_free(f);
        return 1;
    }
    int nmodels = f->nstmts - (f->nstmts > 0 && !strcmp(f->stmts[0].name, XT_VERSION_KEY)); /* not the version */
    printf("%s: ok, %d model%s\n", path, nmodels, nmodels == 1 ? "" : "s");
    xtf_free(f);
    return 0;
}
