/* bench_decode.c: `xtc bench model.xtf --decode C`: the speed of KV-cache decoding, what `xtc
 * generate` does per token. The model's incremental form (xt_lower .kv_cache) is compiled with the
 * asked --dtype, --mma, --weights-dtype and --kv-dtype and, when those are not f32, in f32 as well; each runs on the same
 * seeded weights (xtc_session_init_weights), with batch 1: a prompt of C tokens in one call, then
 * rounds of DECODE_ROUND one-token calls whose caches are carried to the next call
 * (xtc_session_carry, as generate does), the variants alternating round by round so that the
 * machine's other load falls on both alike. Per variant: the median time per token and tokens/s by
 * the wall clock and by the process's CPU time (every thread's: the work, not the latency; other
 * processes on the cores move it far less), and the speed over the first variant by both. With
 * --against PASS the two variants are f32 both, every pass but PASS ("without-PASS", first) and
 * every pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "build.h"
#include "cli.h"
#include "xtc.h"

#define DECODE_ROUND 8
#define DECODE_MAXCACHE 256

typedef struct {
    const char *name;
    char so[4200];
    XtcModule *m;
    XtcSession *s;
    char cache[DECODE_MAXCACHE][64];
    int ncache;
    int64_t pos, vocab;
    double *wall, *cpu;
    int n;
} DecVar;

static double clock_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double med(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n ? (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2])) : 0;
}

static int fail(DecVar *v, const char *what)
{
    fprintf(stderr, "xtc bench: %s: %s: %s\n", v->name, what, v->s ? xtc_session_error(v->s) : xtc_module_error(v->m));
    return -1;
}

/* one call on n tokens (of value tok) after the cache, and the caches carried */
static int call(DecVar *v, int64_t n)
{
    int64_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok)
        return -1;
    for (int64_t i = 0; i < n; i++)
        tok[i] = (v->pos + i) * 7 % v->vocab;
    int rc = xtc_session_set_input(v->s, "tokens", XTC_I64, 2, (int64_t[]){1, n}, tok) || xtc_session_run(v->s);
    free(tok);
    if (rc)
        return fail(v, "run");
    XtcTensor lg;
    if (xtc_session_get_output(v->s, "logits", &lg))
        return fail(v, "logits");
    for (int c = 0; c < v->ncache; c++)
        if (xtc_session_carry(v->s, v->cache[c], v->cache[c]))
            return fail(v, "carry");
    v->pos += n;
    return 0;
}

static int open_variant(DecVar *v, const BenchDecode *d, XtfFile *f, const DrvTarget *t, int without)
{
    PassOptions po = {.disable = &d->against, .ndisable = 1};
    DrvJob job = {.file = f, .model = d->model, .lower = {.kv_cache = 1}, .passes = without ? &po : NULL,
                  .cg = {.output = v->so, .opt_level = d->opt_level, .source_name = d->path}};
    char prefix[96];
    snprintf(prefix, sizeof prefix, "xtc bench: %s", v->name);
    if (cli_drive(prefix, &job, t, NULL, NULL) != 0)
        return -1;
    if (xtc_module_load(v->so, &v->m) != XTC_OK)
        return fail(v, "load");
    if (xtc_session_new(v->m, &(XtcSessionOptions){.threads = d->threads}, &v->s) || xtc_session_init_weights(v->s, 1))
        return fail(v, "session");
    for (int i = 0; i < xtc_module_count(v->m, XTC_INPUT); i++) {
        XtcTensorInfo ti;
        xtc_module_tensor(v->m, XTC_INPUT, i, &ti);
        if (strncmp(ti.name, "cache.", 6))
            continue;
        if (v->ncache == DECODE_MAXCACHE || ti.rank != 4) {
            fprintf(stderr, "xtc bench: %s: more caches than %d, or not of rank 4\n", v->name, DECODE_MAXCACHE);
            return -1;
        }
        snprintf(v->cache[v->ncache++], sizeof v->cache[0], "%s", ti.name);
        float dummy = 0;
        if (xtc_session_set_input(v->s, ti.name, XTC_F32, 4, (int64_t[]){1, 0, ti.shape[2], ti.shape[3]}, &dummy))
            return fail(v, "cache");
    }
    int lg = xtc_module_find(v->m, XTC_OUTPUT, "logits");
    XtcTensorInfo li = {0};
    if (lg >= 0)
        xtc_module_tensor(v->m, XTC_OUTPUT, lg, &li);
    v->vocab = li.rank == 3 && li.shape[2] > 0 ? li.shape[2] : 0;
    if (!v->ncache || !v->vocab || xtc_module_find(v->m, XTC_INPUT, "tokens") < 0) {
        fprintf(stderr, "xtc bench: --decode: the model has no KV-cache form (a TransformerWrapper around a Decoder)\n");
        return -1;
    }
    return 0;
}

int cli_bench_decode(const BenchDecode *d)
{
    XtfFile *f = cli_load_xtf(d->path);
    if (!f)
        return 1;
    DrvTarget t32;
    char err[512];
    if (drv_target(&t32, &(CgOptions){.target = "cpu"}, err, sizeof err)) {
        fprintf(stderr, "xtc bench: %s\n", err);
        xtf_free(f);
        return 1;
    }
    const DrvTarget *t = d->t;
    int asked = d->dtype || (d->mma != CG_MMA_AUTO && d->mma != CG_MMA_OFF) || t->int8 || t->kv_dtype || d->against;
    DecVar var[2];
    memset(var, 0, sizeof var);
    char label[96], without[80];
    snprintf(without, sizeof without, "without-%s", d->against ? d->against : "");
    var[0].name = d->against ? without : "f32";
    snprintf(label, sizeof label, "%s%s%s%s%s%s", d->dtype ? " --dtype " : "", d->dtype ? d->dtype : "",
             d->mma == CG_MMA_BF16 ? " --mma=bf16" : d->mma == CG_MMA_OFF && d->dtype ? " --mma=off" : "",
             t->int8 ? " --weights-dtype int8" : "", t->kv_dtype ? " --kv-dtype " : "", t->kv_dtype ? t->kv_dtype : "");
    memmove(label, label + 1, strlen(label)); /* the leading space */
    var[1].name = d->against ? "every pass" : label;
    int nvar = asked ? 2 : 1, rc = 0, rounds = d->repeat;
    for (int i = 0; i < nvar && !rc; i++) {
        DecVar *v = &var[i];
        snprintf(v->so, sizeof v->so, "%s/decode%d.so", d->dir, i);
        fprintf(stderr, "xtc bench: compiling %s (KV-cache form) ...\n", v->name);
        rc = open_variant(v, d, f, i ? d->t : &t32, !i && d->against);
        v->wall = calloc((size_t)rounds * DECODE_ROUND, sizeof *v->wall);
        v->cpu = calloc((size_t)rounds * DECODE_ROUND, sizeof *v->cpu);
        if (!rc && (!v->wall || !v->cpu))
            rc = -1;
        if (!rc) /* the prompt, and one untimed token */
            rc = call(v, d->context) || call(v, 1);
    }
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < nvar && !rc; i++)
            for (int k = 0; k < DECODE_ROUND && !rc; k++) {
                DecVar *v = &var[i];
                double w0 = clock_of(CLOCK_MONOTONIC), c0 = clock_of(CLOCK_PROCESS_CPUTIME_ID);
                rc = call(v, 1);
                v->cpu[v->n] = clock_of(CLOCK_PROCESS_CPUTIME_ID) - c0;
                v->wall[v->n++] = clock_of(CLOCK_MONOTONIC) - w0;
            }
    if (!rc) {
        printf("KV-cache decoding: %s, context %lld (+%d tokens timed per variant), %d thread%s, batch 1\n", d->path,
               (long long)d->context, rounds * DECODE_ROUND, d->threads, d->threads == 1 ? "" : "s");
        double base = 0, base_cpu = 0;
        for (int i = 0; i < nvar; i++) {
            DecVar *v = &var[i];
            double w = med(v->wall, v->n), c = med(v->cpu, v->n);
            if (!i)
                base = w, base_cpu = c;
            printf("  %-22s %8.3f ms/token  %8.1f tokens/s   cpu %8.3f ms/token  %8.1f tokens/s", v->name, w * 1e3, 1 / w,
                   c * 1e3, c > 0 ? 1 / c : 0);
            if (i)
                printf("   %.2fx %s, %.2fx by cpu", base / w, var[0].name, c > 0 ? base_cpu / c : 0);
            printf("\n");
        }
    }
    for (int i = 0; i < 2; i++) {
        xtc_session_free(var[i].s);
        xtc_module_free(var[i].m);
        if (var[i].so[0])
            remove(var[i].so);
        free(var[i].wall);
        free(var[i].cpu);
    }
    xtf_free(f);
    return rc ? 1 : 0;
}
