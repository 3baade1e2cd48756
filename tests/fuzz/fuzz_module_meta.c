/* fuzz_module_meta.c: libFuzzer target for the module metadata reader (runtime/rt_meta.c) and
 * what a loaded module offers on top of it (runtime/rt_module.c). The input is the metadata text
 * a module embeds (rt_abi.h). It is parsed into an XtcModule as xtc_module_load does after dlopen;
 * one that parses is walked through every introspection call (count, tensor, find, symbols,
 * kernels, steps, describe, parameter count), its "requires" option through the loader's CPU
 * feature check, and every reference between its tables is checked. A broken promise aborts.
 * Built as a fuzzer with XTC_FUZZ=ON; replayed over corpus/ and regress/ by fuzz_replay.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

static void internal_error(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_module_meta: %s: %s\n", what, detail);
    abort();
}

static void check_tables(const XtcModule *m)
{
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < m->nby_kind[k]; i++) {
            int b = m->by_kind[k][i];
            if (b < 0 || b >= m->nbufs || (int)m->bufs[b].kind != k)
                internal_error("by_kind names a wrong buffer", "");
        }
    for (int i = 0; i < m->nouts; i++)
        if (m->outs[i].buf < 0 || m->outs[i].buf >= m->nbufs)
            internal_error("an output's buffer is out of range", m->outs[i].name);
    for (int i = 0; i < m->nsteps; i++) {
        const RtStep *s = &m->steps[i];
        if (s->kernel < 0 || s->kernel >= m->nkernels || s->out < 0 || s->out >= m->nbufs)
            internal_error("a step's kernel or output is out of range", s->label);
        for (int j = 0; j < RT_MAXIN; j++)
            if (s->in[j] < -1 || s->in[j] >= m->nbufs)
                internal_error("a step's operand is out of range", s->label);
    }
    for (int i = 0; i < m->naliases; i++)
        if (m->aliases[i].buf < 0 || m->aliases[i].buf >= m->nbufs)
            internal_error("an alias's buffer is out of range", m->aliases[i].name);
    for (int i = 0; i < m->nbufs; i++)
        if (m->bufs[i].rank < 0 || m->bufs[i].rank > XTC_MAX_RANK)
            internal_error("a buffer's rank is out of range", m->bufs[i].name);
}

static void introspect(const XtcModule *m, FILE *sink)
{
    static const XtcKind kinds[] = {XTC_INPUT, XTC_OUTPUT, XTC_PARAM, XTC_STATE};
    for (int k = 0; k < 4; k++) {
        int n = xtc_module_count(m, kinds[k]);
        for (int i = 0; i < n; i++) {
            XtcTensorInfo ti;
            if (xtc_module_tensor(m, kinds[k], i, &ti) != XTC_OK)
                internal_error("xtc_module_tensor refused an index below the count", "");
            int found = xtc_module_find(m, kinds[k], ti.name);
            if (found < 0 || found > i) /* names may repeat: the first one is found */
                internal_error("xtc_module_find does not find a listed tensor", ti.name);
        }
        XtcTensorInfo ti;
        if (xtc_module_tensor(m, kinds[k], n, &ti) == XTC_OK)
            internal_error("xtc_module_tensor accepted an index past the count", "");
    }
    for (int i = 0; i < xtc_module_num_symbols(m); i++) {
        const char *name;
        int64_t max;
        if (xtc_module_symbol(m, i, &name, &max) != XTC_OK || !name)
            internal_error("xtc_module_symbol refused a symbol", "");
    }
    for (int i = 0; i < xtc_module_num_kernels(m); i++) {
        const char *fn, *op;
        int uses;
        if (xtc_module_kernel(m, i, &fn, &op, &uses) != XTC_OK)
            internal_error("xtc_module_kernel refused a kernel", "");
    }
    for (int i = 0; i < xtc_module_num_steps(m); i++) {
        int kernel;
        const char *label;
        if (xtc_module_step(m, i, &kernel, &label) != XTC_OK || kernel < 0 || kernel >= xtc_module_num_kernels(m))
            internal_error("xtc_module_step gave a bad kernel", "");
    }
    (void)xtc_module_param_count(m);
    (void)xtc_module_name(m);
    if (sink && xtc_module_describe(m, sink) != XTC_OK)
        internal_error("xtc_module_describe failed on a parsed module", "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink)
        sink = fopen("/dev/null", "w");
    char *text = malloc(size + 1);
    XtcModule *m = calloc(1, sizeof *m);
    if (!text || !m) {
        free(text);
        free(m);
        return 0;
    }
    memcpy(text, data, size);
    text[size] = 0;
    /* what xtc_module_load holds after dlopen: the module's object, here without code */
    XtcModuleV1 abi = {.magic = XTC_ABI_MAGIC, .version = XTC_ABI_VERSION, .meta = text, .source = ""};
    m->abi = &abi;
    char missing[512];
    (void)rt_cpu_missing(text, missing, sizeof missing); /* the feature-list parser on any text */
    if (rt_meta_parse(m, text) == 0) {
        check_tables(m);
        introspect(m, sink);
        for (int i = 0; i < m->noptions; i++)
            if (strcmp(m->options[i].key, "requires") == 0)
                (void)rt_cpu_missing(m->options[i].value, missing, sizeof missing);
    } else if (!m->err[0]) {
        internal_error("rt_meta_parse failed without a message", text);
    }
    m->abi = NULL;
    xtc_module_free(m);
    free(text);
    return 0;
}
