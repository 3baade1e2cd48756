/* rt_module.c: loading a compiled module (dlopen, version check, metadata) and describing it:
 * the introspection half of include/xtc.h. */
#include "rt_internal.h"
#include "rt_alloc.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

const char *xtc_version(void)
{
    return XTC_VERSION;
}

const char *xtc_status_name(int status)
{
    static const char *names[] = {
        [XTC_OK] = "XTC_OK",
        [XTC_ERR_ARG] = "XTC_ERR_ARG",
        [XTC_ERR_IO] = "XTC_ERR_IO",
        [XTC_ERR_FORMAT] = "XTC_ERR_FORMAT",
        [XTC_ERR_NAME] = "XTC_ERR_NAME",
        [XTC_ERR_SHAPE] = "XTC_ERR_SHAPE",
        [XTC_ERR_RANGE] = "XTC_ERR_RANGE",
        [XTC_ERR_MEMORY] = "XTC_ERR_MEMORY",
        [XTC_ERR_STATE] = "XTC_ERR_STATE",
    };
    if (status < 0 || status >= (int)(sizeof names / sizeof names[0]) || !names[status])
        return "XTC_ERR_?";
    return names[status];
}

const char *xtc_dtype_name(XtcDType t)
{
    static const char *names[XTC_NUM_DTYPES] = {"f32", "i32", "i64", "bool", "i8"};
    return (unsigned)t < XTC_NUM_DTYPES ? names[t] : "?";
}

size_t xtc_dtype_size(XtcDType t)
{
    static const size_t sizes[XTC_NUM_DTYPES] = {4, 4, 8, 1, 1};
    return (unsigned)t < XTC_NUM_DTYPES ? sizes[t] : 0;
}

static const char *option(const XtcModule *m, const char *key)
{
    for (int i = 0; i < m->noptions; i++)
        if (strcmp(m->options[i].key, key) == 0)
            return m->options[i].value;
    return NULL;
}

/* The CPU features the module's code was compiled to use (option "requires", written by the LLVM
 * backend) must all be present here, or its first vector instruction is a SIGILL. Nothing of the
 * module has run yet: dlopen only ran the C library's start-up code, built for any x86-64. */
static int check_cpu(XtcModule *m, const char *path)
{
    const char *req = option(m, "requires");
    char missing[512];
    int n = req ? rt_cpu_missing(req, missing, sizeof missing) : 0;
    if (n == 0)
        return XTC_OK;
    const char *cpu = option(m, "cpu");
    rt_set_error(m->err, sizeof m->err,
                 "%.300s: compiled for CPU %.64s, which has %s this CPU lacks: %s (recompile with "
                 "--cpu=generic to run on any x86-64, or on this machine with the default --cpu=native)",
                 path, cpu ? cpu : "?", n == 1 ? "a feature" : "features", missing);
    m->abi = NULL; /* not runnable: sessions refuse it */
    return XTC_ERR_FORMAT;
}

/* Whether the loaded object dl maps the file of st (device and inode), by /proc/self/maps: 1, 0, or
 * -1 when that cannot be told. */
static int maps_file(void *dl, const struct stat *st)
{
    const void *sym = dlsym(dl, XTC_ABI_SYMBOL);
    FILE *f = sym ? fopen("/proc/self/maps", "re") : NULL;
    if (!f)
        return -1;
    uintptr_t at = (uintptr_t)sym;
    char line[4096];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, off, ino;
        unsigned maj, min;
        if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &lo, &hi, &off, &maj, &min, &ino) == 6 && at >= lo &&
            at < hi)
            found = maj == major(st->st_dev) && min == minor(st->st_dev) && ino == (unsigned long long)st->st_ino;
    }
    fclose(f);
    return found;
}

/* Copies the file from to a new file in dir (a name made by mkstemp); returns its name in out (n
 * bytes) or 0 when that fails. */
static int copy_to_temp(const char *from, const char *dir, const char *base, char *out, size_t n)
{
    if ((size_t)snprintf(out, n, "%s/.%s.xtc-load-XXXXXX", dir, base) >= n)
        return 0;
    int to = mkstemp(out);
    if (to < 0)
        return 0;
    int in = open(from, O_RDONLY | O_CLOEXEC), ok = in >= 0;
    char buf[65536];
    for (ssize_t r; ok && (r = read(in, buf, sizeof buf)) != 0;) {
        ok = r > 0;
        for (ssize_t w = 0, k; ok && w < r; w += k)
            ok = (k = write(to, buf + w, (size_t)(r - w))) > 0;
    }
    if (in >= 0)
        close(in);
    ok &= close(to) == 0;
    if (!ok)
        unlink(out);
    return ok;
}

/* dlopen(p): but dlopen returns the object it has already loaded under the name p (even by way of a
 * symbolic link) without looking at the file, so a module file replaced since (a recompile renames
 * a new file over it) would give the old code and metadata. When p names a loaded object that is
 * not the file now at p, the file is copied to a new name beside it (or in $TMPDIR) and loaded
 * from there; the copy is removed once loaded. The same file loaded twice shares the object. */
static void *open_module(const char *p)
{
    void *old = dlopen(p, RTLD_LAZY | RTLD_NOLOAD);
    if (!old)
        return dlopen(p, RTLD_NOW | RTLD_LOCAL);
    struct stat st;
    void *dl = NULL;
    if (stat(p, &st) == 0 && maps_file(old, &st) == 0) {
        const char *slash = strrchr(p, '/'), *tmp = getenv("TMPDIR");
        char dir[4096], copy[4200];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - p) : 1, slash ? p : ".");
        const char *dirs[2] = {dir, tmp && *tmp ? tmp : "/tmp"};
        for (int i = 0; i < 2 && !dl; i++) {
            if (!copy_to_temp(p, dirs[i], slash ? slash + 1 : p, copy, sizeof copy))
                continue;
            void *h = dlopen(copy, RTLD_LAZY | RTLD_NOLOAD); /* a freed copy's name, still loaded */
            if (h)
                dlclose(h);
            else
                dl = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
            unlink(copy);
        }
    }
    if (!dl) /* the same file, or no way to tell or to copy: dlopen's own answer */
        dl = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    dlclose(old);
    return dl;
}

int xtc_module_load(const char *path, XtcModule **out)
{
    if (!out)
        return XTC_ERR_ARG;
    XtcModule *m = rt_calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return XTC_ERR_MEMORY;
    if (!path) {
        rt_set_error(m->err, sizeof m->err, "xtc_module_load: no path");
        return XTC_ERR_ARG;
    }
    /* dlopen searches the library path for names without a slash; a module is a file */
    char buf[4096];
    const char *p = path;
    if (!strchr(path, '/')) {
        snprintf(buf, sizeof buf, "./%s", path);
        p = buf;
    }
    /* dlopen trusts the file: a truncated one crashes it (SIGBUS), so look before loading */
    int status = rt_elf_check(p, m->err, sizeof m->err);
    if (status != XTC_OK)
        return status;
    m->dl = open_module(p);
    if (!m->dl) {
        const char *e = dlerror();
        rt_set_error(m->err, sizeof m->err, "cannot load module %s: %s", path, e ? e : "dlopen failed");
        return XTC_ERR_IO;
    }
    dlerror();
    const XtcModuleV1 *abi = dlsym(m->dl, XTC_ABI_SYMBOL);
    if (!abi) {
        rt_set_error(m->err, sizeof m->err, "%s is not an xtc module (no symbol %s)", path, XTC_ABI_SYMBOL);
        return XTC_ERR_FORMAT;
    }
    if (abi->magic != XTC_ABI_MAGIC) {
        rt_set_error(m->err, sizeof m->err, "%s: bad module magic 0x%08x", path, abi->magic);
        return XTC_ERR_FORMAT;
    }
    if (abi->version != XTC_ABI_VERSION) {
        rt_set_error(m->err, sizeof m->err,
                     "%s: module format version %u, this runtime reads version %d (recompile it)",
                     path, abi->version, XTC_ABI_VERSION);
        return XTC_ERR_FORMAT;
    }
    if (!abi->meta || !abi->run) {
        rt_set_error(m->err, sizeof m->err, "%s: module without metadata or entry point", path);
        return XTC_ERR_FORMAT;
    }
    m->abi = abi;
    if (rt_device_attach(m, path) < 0)
        return XTC_ERR_FORMAT;
    int rc = rt_meta_parse(m, abi->meta);
    if (rc < 0) {
        char tmp[sizeof m->err];
        snprintf(tmp, sizeof tmp, "%.300s: %.700s", path, m->err);
        memcpy(m->err, tmp, sizeof tmp);
        return rc == -2 ? XTC_ERR_MEMORY : XTC_ERR_FORMAT;
    }
    for (int b = 0; b < m->nbufs && !m->device; b++) /* the host converts what it binds (rt_store.c) */
        if (m->bufs[b].storage == 2) {
            rt_set_error(m->err, sizeof m->err, "%.300s: buffer %d ('%.100s') stored in fp16: a CPU module stores in "
                         "f32 or bf16", path, b, m->bufs[b].name);
            return XTC_ERR_FORMAT;
        }
    for (int b = 0; b < m->nbufs; b++) { /* int8 rows: a CPU module's KV caches, rows of a constant size */
        const RtBuffer *buf = &m->bufs[b];
        int ok = !m->device && buf->rank >= 1 && buf->shape[buf->rank - 1].c > 0;
        for (int s = 0; ok && s < RT_MAXSYM; s++)
            ok = buf->shape[buf->rank - 1].k[s] == 0;
        if (buf->storage == RT_STORE_INT8_ROWS && !ok) {
            rt_set_error(m->err, sizeof m->err, "%.300s: buffer %d ('%.100s') stored as int8 rows: only a CPU module's "
                         "buffers whose last dimension is constant are", path, b, buf->name);
            return XTC_ERR_FORMAT;
        }
    }
    return check_cpu(m, path);
}

void xtc_module_free(XtcModule *m)
{
    if (!m)
        return;
    rt_meta_free(m);
    if (m->dl)
        dlclose(m->dl);
    free(m);
}

const char *xtc_module_error(const XtcModule *m) { return m ? m->err : "no module"; }

static int loaded(const XtcModule *m) { return m && m->abi && m->text; }

int xtc_module_count(const XtcModule *m, XtcKind kind)
{
    if (!loaded(m))
        return 0;
    switch (kind) {
    case XTC_INPUT: return m->nby_kind[RT_BUF_INPUT];
    case XTC_PARAM: return m->nby_kind[RT_BUF_PARAM];
    case XTC_STATE: return m->nby_kind[RT_BUF_STATE];
    case XTC_OUTPUT: return m->nouts;
    }
    return 0;
}

static void fill_info(XtcTensorInfo *info, const char *name, XtcDType dtype, int rank, const RtDim *shape,
                      const char *const *dims)
{
    memset(info, 0, sizeof *info);
    info->name = name;
    info->dtype = dtype;
    info->rank = rank;
    for (int i = 0; i < rank; i++) {
        int constant = 1;
        for (int s = 0; s < RT_MAXSYM; s++)
            constant &= shape[i].k[s] == 0;
        info->shape[i] = constant ? shape[i].c : -1;
        info->dims[i] = dims[i];
    }
}

static int kind_index(XtcKind kind)
{
    switch (kind) {
    case XTC_INPUT: return RT_BUF_INPUT;
    case XTC_PARAM: return RT_BUF_PARAM;
    case XTC_STATE: return RT_BUF_STATE;
    default: return -1;
    }
}

int xtc_module_tensor(const XtcModule *m, XtcKind kind, int i, XtcTensorInfo *info)
{
    if (!loaded(m) || !info || i < 0 || i >= xtc_module_count(m, kind))
        return XTC_ERR_ARG;
    if (kind == XTC_OUTPUT) {
        const RtOutput *o = &m->outs[i];
        fill_info(info, o->name, o->dtype, o->rank, o->shape, o->dims);
    } else {
        const RtBuffer *b = &m->bufs[m->by_kind[kind_index(kind)][i]];
        fill_info(info, b->name, b->dtype, b->rank, b->shape, b->dims);
    }
    return XTC_OK;
}

int xtc_module_find(const XtcModule *m, XtcKind kind, const char *name)
{
    if (!loaded(m) || !name)
        return -1;
    int n = xtc_module_count(m, kind);
    for (int i = 0; i < n; i++) {
        const char *nm = kind == XTC_OUTPUT ? m->outs[i].name : m->bufs[m->by_kind[kind_index(kind)][i]].name;
        if (strcmp(nm, name) == 0)
            return i;
    }
    return -1;
}

int xtc_module_param_init(const XtcModule *m, const char *name, double *value)
{
    int i = xtc_module_find(m, XTC_PARAM, name);
    if (i < 0)
        return -1;
    const RtBuffer *b = &m->bufs[m->by_kind[kind_index(XTC_PARAM)][i]];
    int fixed = b->has_init && b->init_rule == XTC_INIT_CONST;
    if (fixed && value)
        *value = b->init;
    return fixed;
}

int xtc_module_num_symbols(const XtcModule *m) { return loaded(m) ? m->nsyms : 0; }

int xtc_module_symbol(const XtcModule *m, int i, const char **name, int64_t *max)
{
    if (!loaded(m) || i < 0 || i >= m->nsyms)
        return XTC_ERR_ARG;
    if (name)
        *name = m->sym_name[i];
    if (max)
        *max = m->sym_max[i];
    return XTC_OK;
}

const char *xtc_module_name(const XtcModule *m) { return loaded(m) ? m->name : ""; }
const char *xtc_module_source(const XtcModule *m) { return loaded(m) && m->abi->source ? m->abi->source : ""; }
const char *xtc_module_metadata(const XtcModule *m) { return loaded(m) ? m->abi->meta : ""; }

int64_t xtc_module_param_count(const XtcModule *m)
{
    if (!loaded(m))
        return 0;
    int64_t total = 0, none[RT_MAXSYM] = {0};
    for (int i = 0; i < m->nby_kind[RT_BUF_PARAM]; i++) {
        const RtBuffer *b = &m->bufs[m->by_kind[RT_BUF_PARAM][i]];
        /* each at most 2^40 (rt_meta_parse); saturate rather than wrap on absurd counts */
        if (__builtin_add_overflow(total, rt_numel(b->shape, b->rank, none), &total))
            return INT64_MAX;
    }
    return total;
}

int xtc_module_num_kernels(const XtcModule *m) { return loaded(m) ? m->nkernels : 0; }

int xtc_module_kernel(const XtcModule *m, int k, const char **fn, const char **op, int *uses)
{
    if (!loaded(m) || k < 0 || k >= m->nkernels)
        return XTC_ERR_ARG;
    if (fn)
        *fn = m->kernels[k].fn;
    if (op)
        *op = m->kernels[k].op;
    if (uses)
        *uses = m->kernels[k].uses;
    return XTC_OK;
}

int xtc_module_num_steps(const XtcModule *m) { return loaded(m) ? m->nsteps : 0; }

int xtc_module_step(const XtcModule *m, int i, int *kernel, const char **label)
{
    if (!loaded(m) || i < 0 || i >= m->nsteps)
        return XTC_ERR_ARG;
    if (kernel)
        *kernel = m->steps[i].kernel;
    if (label)
        *label = m->steps[i].label;
    return XTC_OK;
}

static void print_shape(FILE *out, int rank, const char *const *dims)
{
    fputc('[', out);
    for (int i = 0; i < rank; i++)
        fprintf(out, "%s%s", i ? ", " : "", dims[i]);
    fputc(']', out);
}

int xtc_module_describe(const XtcModule *m, FILE *out)
{
    if (!loaded(m) || !out)
        return XTC_ERR_ARG;
    fprintf(out, "model %s (module format %d)\n", m->name, XTC_ABI_VERSION);
    for (int i = 0; i < m->noptions; i++)
        fprintf(out, "  option %s = %s\n", m->options[i].key, m->options[i].value);
    fprintf(out, "symbols:");
    for (int s = 0; s < m->nsyms; s++) {
        fprintf(out, " %s", m->sym_name[s]);
        if (m->sym_derived[s]) {
            /* q = min(n + p, K): the affine definition, then the bound */
            const RtDim *d = &m->sym_def[s];
            fprintf(out, " = %s", m->sym_max[s] ? "min(" : "");
            int first = 1;
            for (int t = 0; t < m->nsyms; t++) {
                if (!d->k[t])
                    continue;
                int64_t k = d->k[t];
                fprintf(out, "%s", first ? (k < 0 ? "-" : "") : (k < 0 ? " - " : " + "));
                if (k != 1 && k != -1)
                    fprintf(out, "%lld*", (long long)(k < 0 ? -k : k));
                fprintf(out, "%s", m->sym_name[t]);
                first = 0;
            }
            if (first || d->c)
                fprintf(out, first ? "%lld" : (d->c < 0 ? " - %lld" : " + %lld"),
                        (long long)(first || d->c >= 0 ? d->c : -d->c));
            if (m->sym_max[s])
                fprintf(out, ", %lld)", (long long)m->sym_max[s]);
        } else if (m->sym_max[s])
            fprintf(out, " <= %lld", (long long)m->sym_max[s]);
        fprintf(out, "%s", s + 1 < m->nsyms ? "," : "");
    }
    fprintf(out, "\n");
    static const char *titles[] = {"inputs", "outputs", "parameters", "state buffers"};
    static const XtcKind kinds[] = {XTC_INPUT, XTC_OUTPUT, XTC_PARAM, XTC_STATE};
    for (int k = 0; k < 4; k++) {
        int n = xtc_module_count(m, kinds[k]);
        fprintf(out, "%s: %d\n", titles[k], n);
        for (int i = 0; i < n; i++) {
            XtcTensorInfo ti;
            xtc_module_tensor(m, kinds[k], i, &ti);
            fprintf(out, "  %-48s %-4s ", ti.name, xtc_dtype_name(ti.dtype));
            print_shape(out, ti.rank, ti.dims);
            if (kinds[k] == XTC_INPUT) {
                const RtBuffer *b = &m->bufs[m->by_kind[RT_BUF_INPUT][i]];
                if (b->has_range)
                    fprintf(out, "  values in [%lld, %lld)", (long long)b->lo, (long long)b->hi);
            }
            const RtBuffer *w = kinds[k] == XTC_PARAM || kinds[k] == XTC_STATE
                                    ? &m->bufs[m->by_kind[kind_index(kinds[k])][i]] : NULL;
            if (w && w->has_init && w->init_rule == XTC_INIT_CONST)
                fprintf(out, "  starts at %.17g", w->init);
            else if (w && w->has_init)
                fprintf(out, "  starts %s %.9g", xtc_init_rule_name(w->init_rule), w->init);
            fputc('\n', out);
        }
    }
    for (int i = 0; i < m->naliases; i++)
        fprintf(out, "  %-48s tied to %s\n", m->aliases[i].name, m->bufs[m->aliases[i].buf].name);
    fprintf(out, "parameter count: %lld\n", (long long)xtc_module_param_count(m));
    int ntemps = 0;
    for (int i = 0; i < m->nbufs; i++)
        ntemps += m->bufs[i].kind == RT_BUF_TEMP;
    fprintf(out, "schedule: %d steps, %d kernels, %d intermediate buffers\n", m->nsteps, m->nkernels, ntemps);
    for (int i = 0; i < m->nkernels; i++)
        fprintf(out, "  %-24s %-14s used %d time%s\n", m->kernels[i].fn, m->kernels[i].op, m->kernels[i].uses,
                m->kernels[i].uses == 1 ? "" : "s");
    size_t srclen = strlen(xtc_module_source(m));
    fprintf(out, "source: %zu bytes embedded\n", srclen);
    return XTC_OK;
}
