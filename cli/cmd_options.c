/* cmd_options.c: `xtc options`: the support table of the language, printed from the one option
 * table of the front end (frontend/options.c), so the documentation cannot drift from it. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "options.h"

static const char *status_name(XtfStatus s)
{
    return s == XTF_SUPPORTED ? "supported" : s == XTF_NOT_YET ? "not supported yet" : "not allowed";
}

static void default_text(const XtfOption *o, char *buf, size_t n)
{
    const XtfValue *d = o->def;
    if (!d)
        snprintf(buf, n, "required");
    else if (d->kind == XV_INT)
        snprintf(buf, n, "%lld", (long long)d->i);
    else if (d->kind == XV_FLOAT)
        snprintf(buf, n, "%g", d->f);
    else if (d->kind == XV_BOOL)
        snprintf(buf, n, "%s", d->b ? "true" : "false");
    else if (d->kind == XV_NONE)
        snprintf(buf, n, "None");
    else
        snprintf(buf, n, "-");
}

static int row(void *arg, const char *key, const XtfOption *o)
{
    int markdown = *(int *)arg;
    char type[160], def[64], vers[96];
    xtf_option_type_name(o, type, sizeof type);
    default_text(o, def, sizeof def);
    unsigned v = xtf_option_versions(o);
    if (v == XT_V_ALL)
        snprintf(vers, sizeof vers, "all");
    else
        xt_version_list(v, vers, sizeof vers);
    if (markdown)
        printf("| `%s` | %s | %s | %s | %s |\n", key, type, def, status_name(o->status), vers);
    else
        printf("  %-28s %-44s %-10s %-18s %s\n", key, type, def, status_name(o->status), vers);
    return 0;
}

int cli_options(int argc, char **argv)
{
    int markdown = 0;
    const char *only = NULL;
    const CliOpt opts[] = {
        {"--markdown", CLI_FLAG, &markdown, .help = "print the tables in Markdown"},
    };
    const CliCmd cmd = {
        .name = "options", .usage = "[CONSTRUCTOR] [--markdown]",
        .about = "Lists every constructor of the language and its options: type, default and\n"
                 "whether xtc supports it, and the x-transformers versions in which xtc takes it (a\n"
                 "file states its version with a first statement xtransformers = \"2.26.4\"; without\n"
                 "one it mirrors 0.23.0). Routed enc_/dec_ keys of XTransformer included.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &only, .maxpos = 1, .pos_name = "constructor",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (only && !xtf_ctor_find(only)) {
        fprintf(stderr, "xtc options: no constructor '%s'\n", only);
        return 1;
    }
    for (int c = 0; c < XTF_C_NUM; c++) {
        const XtfCtor *ctor = &xtf_ctors[c];
        if (only && strcmp(only, ctor->name))
            continue;
        if (ctor->status == XTF_FORBIDDEN) {
            if (!only)
                printf(markdown ? "\n`%s`: not allowed: %s\n" : "\n%s: not allowed: %s\n", ctor->name, ctor->why);
            continue;
        }
        if (markdown)
            printf("\n#### `%s` (%s)\n\n| option | type | default | status | versions |\n|---|---|---|---|---|\n", ctor->name,
                   status_name(ctor->status));
        else
            printf("\n%s (%s)\n", ctor->name, status_name(ctor->status));
        xtf_option_each(ctor, row, &markdown);
    }
    return 0;
}
