/* build.c: the command line's side of the compile driver (see build.h): jobs run with their
 * errors printed, temporary modules for train/generate, and loading modules and their .xtf text. */
#include "build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cli_drive(const char *prefix, const DrvJob *job, const DrvTarget *t, IrGraph **out, CgStats *stats)
{
    XtfDiag d;
    xtf_diag_init(&d);
    DrvJob j = *job;
    j.diag = job->file ? &d : NULL;
    char err[1024];
    int rc = drv_run(&j, t, out, stats, err, sizeof err);
    if (rc != 0 && d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        fprintf(stderr, "xtc: %s\n", err);
    } else if (rc != 0) {
        fprintf(stderr, "%s: %s\n", prefix, err);
    }
    xtf_diag_free(&d);
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

XtcModule *cli_build_load(const XtfFile *f, const DrvJob *job)
{
    DrvTarget cpu;
    char err[1024];
    if (drv_target(&cpu, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        return NULL;
    }
    DrvJob j = *job;
    j.file = f;
    j.cg.opt_level = 2;
    XtfDiag d;
    xtf_diag_init(&d);
    j.diag = &d;
    XtcModule *m = drv_build_load(&j, &cpu, NULL, err, sizeof err);
    if (!m && d.nerrors) {
        fputs(d.text ? d.text : "", stderr);
        fprintf(stderr, "xtc: %s\n", err);
    } else if (!m) {
        fprintf(stderr, "xtc: %s: %s\n", f->path, err);
    }
    xtf_diag_free(&d);
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
