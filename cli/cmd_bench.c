/* cmd_bench.c: `xtc bench`: what the fusion passes buy, measured.
 *
 * Lowers a model once (and differentiates it with --train), then compiles it twice with the
 * backend of --target (cpu, cuda, cuda-emu): with every pass ("fused") and with --no-fuse
 * ("unfused"), or with --against PASS, with every pass but PASS (named "without-PASS": what one
 * pass buys, e.g. cosine_sim's bounded attention against the general one). Both modules get the same seeded weights and inputs; after warm-up runs, the two
 * sessions run alternately, R times each, so that the noise of a shared machine falls on both
 * alike. Reported per variant: the median time of every kernel (from the runtime's per-step
 * profile, summed over the steps sharing the kernel), the median of their sum, the total's
 * median, minimum and maximum (host wall clock around xtc_session_run), on the cpu target the
 * process's CPU time around the same runs (every thread's, so the work rather than the latency;
 * other processes on a shared machine move it far less than the wall clock), the activation arena's
 * size (xtc_session_peak_bytes: for cuda and cuda-emu the device arena, each intermediate at its
 * storage size, 2 bytes per element with --dtype bf16 or fp16), and the speed-up of the medians. --json writes the same as one JSON object for scripts
 * (bench/compare.py reads it).
 *
 * Per-kernel times come from the runtime's profile: on the CPU the wall time of each step; for a
 * CUDA module the time between the CUDA events recorded on the stream around each launch (GPU
 * time, without the host's launch overhead); for cuda-emu the emulated driver's events, which
 * read the host clock: CPU times of the emulation, useful to test the path, not GPU figures.
 *
 * A variant whose planned arena (xtc_module_arena_bytes, the same measure) exceeds --max-gib is not run: its planned size is reported (the
 * unfused program at sequence 16384 needs many GiB for its n x n score tensors). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "codegen.h"
#include "init.h"
#include "passes.h"
#include "xtc.h"

typedef struct {
    const char *path, *model, *target;
    const char *dtype;       /* --dtype: storage of cuda and cuda-emu modules, NULL = f32 */
    int mma;                 /* --mma: CgOptions.mma (bf16 matmul operands on the cpu too) */
    const char *weights_dtype, *kv_dtype; /* --decode: --weights-dtype, --kv-dtype as xtc compile's */
    int64_t batch, seq;
    int64_t decode;          /* --decode C: KV-cache decoding after a context of C (bench_decode.c) */
    int train, mask, threads, repeat, warmup, json, top;
    double max_gib;
    int opt_level;
    const char *against;     /* --against PASS: the second variant runs every pass but PASS */
    DrvTarget t;             /* --target and --dtype, resolved once */
} BenchOpts;

/* How each target's per-kernel times are taken, for the report (see the top of the file). */
typedef struct {
    const char *target;
    const char *timer;       /* JSON "kernel_timer" */
    const char *timer_text;  /* the header's words */
    int emulated;            /* device reported as "emulated" */
    int threaded;            /* --threads applies to the kernels (elsewhere to the host's share) */
    int device_arena;        /* the arena is device memory */
    int cpu_time;            /* the process's CPU time around a run is the run's work (not on cuda: the
                              * host's launches and waits; not on cuda-emu: the emulator's, not the GPU's) */
} TargetInfo;

static const TargetInfo targets[] = {
    {"cpu", "wall-clock", "wall clock per step", 0, 1, 0, 1},
    {"cuda", "cuda-events", "CUDA events around each launch", 0, 0, 1, 0},
    {"cuda-emu", "emulated-cuda-events", "emulated CUDA events (host clock: not GPU figures)", 1, 0, 1, 0},
};

static const TargetInfo *target_info(const char *name)
{
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (!strcmp(targets[i].target, name))
            return &targets[i];
    return NULL;
}

/* One compiled variant and its measurements. */
typedef struct {
    const char *name;        /* "fused", "unfused" */
    char so[4200];
    XtcModule *mod;
    XtcSession *sess;
    int nodes, nsteps, nkernels;
    double compile_s;
    int64_t peak;            /* arena bytes (planned when not run) */
    int ran;                 /* 0: skipped (see why) */
    char why[256];
    double *total;           /* [repeat] seconds per run */
    double *cpu;             /* [repeat] the process's CPU seconds per run (every thread's) */
    double *kernels;         /* [repeat] seconds per run summed over the kernels */
    double *kernel_s;        /* [repeat][nkernels] seconds per kernel per run */
    double *step_s;          /* [nsteps] scratch */
} Variant;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static int opt_target(const char *v, void *ptr, char *err, size_t n)
{
    if (!target_info(v) || !cg_backend_find(v)) {
        snprintf(err, n, "unknown target '%s' (cpu, cuda, cuda-emu)", v);
        return -1;
    }
    *(const char **)ptr = v;
    return 0;
}

static int opt_max_gib(const char *v, void *ptr, char *err, size_t n)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0) || !isfinite(x)) {
        snprintf(err, n, "expected a positive number, got '%s'", v);
        return -1;
    }
    *(double *)ptr = x;
    return 0;
}

/* 0 to run, 1 after --help, -1 after an error */
static int parse_args(int argc, char **argv, BenchOpts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->repeat = 5;
    o->warmup = 1;
    o->top = 12;
    o->max_gib = 8;
    o->opt_level = 2;
    o->target = "cpu";
    const CliOpt opts[] = {
        {"--batch", CLI_I64, &o->batch, "B", .help = "sequences (required)", .lo = 1},
        {"--seq", CLI_I64, &o->seq, "N", .help = "sequence length (required): every sequence-like symbol gets N", .lo = 1},
        {"--target", CLI_FN, &o->target, "T", .help = "cpu (default), cuda (a GPU, kernels timed with CUDA events) or\n"
         "cuda-emu (the CUDA path emulated on the CPU: not GPU figures)", .fn = opt_target},
        {"--dtype", CLI_FN, &o->dtype, "D", .help = "storage as xtc compile --dtype: f32 (default), bf16 (cpu: the matmul\n"
         "weights; cuda: every tensor) or fp16 (cuda; the device arena is planned at that size)", .fn = cli_opt_dtype},
        {"--mma", CLI_FN, &o->mma, "M", .help = "matmul operands in bf16 (or fp16 on cuda), sums in f32, as xtc compile --mma",
         .fn = cli_opt_mma},
        {"--train", CLI_FLAG, &o->train, .help = "time the training step (loss and every grad.<param>)"},
        {"--mask", CLI_FLAG, &o->mask, .help = "add the padding-mask inputs (all true)"},
        {"--threads", CLI_THREADS, &o->threads, "T", .help = "worker threads (default 1): the cpu target's kernels; cuda and\n"
         "cuda-emu: the host's share of a run (16-bit outputs widened to f32)"},
        {"--repeat", CLI_INT, &o->repeat, "R", .help = "timed runs per variant (default 5)", .lo = 1, .hi = 100000},
        {"--warmup", CLI_INT, &o->warmup, "W", .help = "untimed runs before them (default 1)", .lo = 0, .hi = 100000},
        {"--top", CLI_INT, &o->top, "K", .help = "kernels listed per variant (default 12)", .lo = 0, .hi = 100000},
        {"--max-gib", CLI_FN, &o->max_gib, "G", .help = "do not run a variant whose arena (for cuda: the device arena)\n"
         "would exceed G GiB (default 8); its planned size is still reported", .fn = opt_max_gib},
        {"--model", CLI_STR, &o->model, "NAME", .help = "which model of the file (default: the last)"},
        {"-O0", CLI_LEVEL, &o->opt_level, ".. -O3", .help = "optimisation level (default -O2)", .set = 0},
        {"-O1", CLI_LEVEL, &o->opt_level, .set = 1},
        {"-O2", CLI_LEVEL, &o->opt_level, .set = 2},
        {"-O3", CLI_LEVEL, &o->opt_level, .set = 3},
        {"--json", CLI_FLAG, &o->json, .help = "one JSON object on stdout instead of tables"},
        {"--decode", CLI_I64, &o->decode, "C", .help = "time KV-cache decoding instead (batch 1): a prompt of C tokens, then\n"
         "--repeat rounds of 8 one-token calls; with --dtype or --mma against f32\n(or --against PASS), the variants alternating "
         "(no --batch or --seq); tokens/s by wall and by CPU time", .lo = 1},
        {"--weights-dtype", CLI_STR, &o->weights_dtype, "D", .help = "with --decode: int8 matmul weights, as xtc compile"},
        {"--kv-dtype", CLI_STR, &o->kv_dtype, "D", .help = "with --decode: the KV caches' storage, as xtc compile"},
        {"--against", CLI_STR, &o->against, "PASS", .help = "compare with every pass but PASS (xtc ir --list-passes)\n"
         "instead of the unfused program; JSON keeps the key \"unfused\" for it"},
    };
    const CliCmd cmd = {
        .name = "bench", .usage = "model.xtf --batch B --seq N [options]",
        .about = "Compiles the model fused (every pass) and unfused (--no-fuse), runs both on the same\n"
                 "seeded weights and inputs, and prints per-kernel medians, the total's median and\n"
                 "spread, the activation memory (arena) and the speed-up.\n"
                 "On the cpu target it also prints the process's CPU time per run (user + system,\n"
                 "every thread's: the work, not the latency; with --threads T > 1 it counts every\n"
                 "worker, their spin-waits included: idle workers spin up to 2 ms after a kernel, the\n"
                 "last ones into the other variant's run) and the speed-up by it: other\n"
                 "processes on a loaded machine move it far less than the wall clock. Not on cuda (the\n"
                 "host's CPU time is launches and waits, not the kernels) nor cuda-emu (the emulator's).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &o->path, .maxpos = 1, .pos_name = "model file",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 1 : -1;
    if (!o->path || (!o->decode && (!o->batch || !o->seq)))
        return cli_usage_error(&cmd, !o->path ? "no model file given" : !o->batch ? "no --batch given" : "no --seq given"),
               -1;
    char err[512];
    if (o->against && pass_check_name(o->against, err, sizeof err) != 0) {
        fprintf(stderr, "xtc bench: --against: %s\n", err);
        return -1;
    }
    if ((o->weights_dtype || o->kv_dtype) && !o->decode) {
        fprintf(stderr, "xtc bench: --weights-dtype and --kv-dtype apply with --decode\n");
        return -1;
    }
    if (drv_target(&o->t, &(CgOptions){.target = o->target, .dtype = o->dtype, .mma = o->mma, .weights_dtype = o->weights_dtype,
                                       .kv_dtype = o->kv_dtype}, err, sizeof err) != 0) {
        fprintf(stderr, "xtc bench: %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- the graph: lowered once, differentiated once ---- */

static IrGraph *build_graph(const BenchOpts *o)
{
    XtfFile *f = cli_load_xtf(o->path);
    if (!f)
        return NULL;
    XtLowerOpts lo = {0};
    lo.train = o->train;
    if (o->mask)
        lo.mask = lo.src_mask = lo.tgt_mask = lo.context_mask = 1;
    /* --train: the built-in loss, or the outputs seeded by grad.<output>; fp16 scales the loss */
    DrvJob job = {.file = f, .model = o->model, .lower = lo, .grads = o->train, .stop_after = DRV_AUTODIFF};
    IrGraph *g = NULL;
    cli_drive("xtc bench", &job, &o->t, &g, NULL);
    xtf_free(f);
    return g;
}

/* Values an integer input may take: the rows of the table it indexes, or the classes of the
 * loss it is the target of (through casts and reshapes); 2 when neither. */
static int64_t int_input_range(const IrGraph *g, const IrNode *in)
{
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op != IR_GATHER && n->op != IR_XENT)
            continue;
        const IrNode *x = n->in[1];
        while (x->op == IR_CAST || x->op == IR_RESHAPE)
            x = x->in[0];
        if (x != in)
            continue;
        IrDim d = n->op == IR_GATHER ? n->in[0]->shape[0] : n->in[0]->shape[n->in[0]->rank - 1];
        if (ir_dim_is_const(d) && d.c > 0)
            return d.c;
    }
    return 2;
}

/* ---- one variant: compile, load, bind ---- */

static int compile_variant(const BenchOpts *o, IrGraph *g, Variant *v, int no_fuse, const char *dir)
{
    PassOptions po = {.no_fuse = no_fuse && !o->against};
    if (no_fuse && o->against) {
        po.disable = &o->against;
        po.ndisable = 1;
    }
    double t0 = now_s();
    snprintf(v->so, sizeof v->so, "%s/%s.so", dir, v->name);
    DrvJob job = {.graph = g, .start = DRV_PASSES, .passes = &po,
                  .cg = {.output = v->so, .opt_level = o->opt_level, .source_name = o->path}};
    char prefix[64];
    snprintf(prefix, sizeof prefix, "xtc bench: %s", v->name);
    IrGraph *opt = NULL;
    CgStats st;
    if (cli_drive(prefix, &job, &o->t, &opt, &st) != 0)
        return -1;
    v->nodes = opt->nnodes;
    ir_graph_free(opt);
    v->compile_s = now_s() - t0;
    if (xtc_module_load(v->so, &v->mod) != XTC_OK) {
        fprintf(stderr, "xtc bench: %s\n", v->mod ? xtc_module_error(v->mod) : "out of memory");
        return -1;
    }
    v->nsteps = xtc_module_num_steps(v->mod);
    v->nkernels = xtc_module_num_kernels(v->mod);
    return 0;
}

/* Symbol values: b = batch, every other symbol = seq. */
static void symbol_values(const XtcModule *m, const BenchOpts *o, int64_t *syms)
{
    for (int s = 0; s < xtc_module_num_symbols(m); s++) {
        const char *name;
        xtc_module_symbol(m, s, &name, NULL);
        syms[s] = !strcmp(name, "b") || !strcmp(name, "batch") ? o->batch : o->seq;
    }
}

static int64_t eval_dim(const XtcModule *m, const char *dim, const int64_t *syms);

/* Weights by x-transformers' rules from one seed; inputs from another: ids uniform over their
 * range, masks all true, floats uniform in [-0.5, 0.5). */
static int bind_session(const BenchOpts *o, const IrGraph *g, Variant *v)
{
    XtcSessionOptions so = {.threads = o->threads};
    if (xtc_session_new(v->mod, &so, &v->sess) != XTC_OK) {
        fprintf(stderr, "xtc bench: %s\n", v->sess ? xtc_session_error(v->sess) : "out of memory");
        return -1;
    }
    if (xtc_session_init_weights(v->sess, 1234) != XTC_OK) {
        fprintf(stderr, "xtc bench: %s\n", xtc_session_error(v->sess));
        return -1;
    }
    RtRng rng;
    int64_t syms[16] = {0};
    symbol_values(v->mod, o, syms);
    rt_rng_seed(&rng, 5678);
    for (int i = 0; i < xtc_module_count(v->mod, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(v->mod, XTC_INPUT, i, &t);
        if (!strcmp(t.name, XTC_LOSS_SCALE_INPUT))
            continue; /* the session binds its loss scale */
        int64_t shape[XTC_MAX_RANK], n = 1;
        for (int d = 0; d < t.rank; d++) {
            shape[d] = eval_dim(v->mod, t.dims[d], syms);
            if (shape[d] < 0) {
                fprintf(stderr, "xtc bench: input '%s': cannot size dimension '%s'\n", t.name, t.dims[d]);
                return -1;
            }
            n *= shape[d];
        }
        void *data = malloc((size_t)(n ? n : 1) * 8);
        if (!data)
            return -1;
        const IrNode *leaf = ir_find_leaf(g, IR_INPUT, t.name);
        int64_t range = leaf ? int_input_range(g, leaf) : 2;
        for (int64_t k = 0; k < n; k++) {
            switch (t.dtype) {
            case XTC_F32: ((float *)data)[k] = (float)(rt_rng_uniform(&rng) - 0.5); break;
            case XTC_I32: ((int32_t *)data)[k] = (int32_t)(rt_rng_next(&rng) % (uint64_t)range); break;
            case XTC_I64: ((int64_t *)data)[k] = (int64_t)(rt_rng_next(&rng) % (uint64_t)range); break;
            default: ((uint8_t *)data)[k] = 1; break;
            }
        }
        int rc = xtc_session_set_input(v->sess, t.name, t.dtype, t.rank, shape, data);
        free(data);
        if (rc != XTC_OK) {
            fprintf(stderr, "xtc bench: %s\n", xtc_session_error(v->sess));
            return -1;
        }
    }
    return 0;
}

/* A dimension's text ("64", "n", "n+3", "2*b", "m+n") at the symbol values; -1 if unreadable. */
static int64_t eval_dim(const XtcModule *m, const char *dim, const int64_t *syms)
{
    int64_t total = 0;
    const char *p = dim;
    while (*p) {
        int sign = 1;
        if (*p == '+' || *p == '-') {
            sign = *p == '-' ? -1 : 1;
            p++;
        }
        int64_t coef = 1;
        if (*p >= '0' && *p <= '9') {
            char *end;
            coef = strtoll(p, &end, 10);
            p = end;
            if (*p != '*') {
                total += sign * coef;
                continue;
            }
            p++;
        }
        size_t len = strcspn(p, "+-*");
        int found = 0;
        for (int s = 0; s < xtc_module_num_symbols(m) && !found; s++) {
            const char *name;
            xtc_module_symbol(m, s, &name, NULL);
            if (strlen(name) == len && !strncmp(name, p, len)) {
                total += sign * coef * syms[s];
                found = 1;
            }
        }
        if (!found || len == 0)
            return -1;
        p += len;
    }
    return total;
}

/* ---- running ---- */

static int run_once(Variant *v, int r)
{
    if (xtc_session_set_profiling(v->sess, 1) != XTC_OK) { /* clears the last run's profile */
        fprintf(stderr, "xtc bench: %s: %s\n", v->name, xtc_session_error(v->sess));
        return -1;
    }
    double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (xtc_session_run(v->sess) != XTC_OK) {
        fprintf(stderr, "xtc bench: %s: %s\n", v->name, xtc_session_error(v->sess));
        return -1;
    }
    double dt = now_s() - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (r < 0)
        return 0;
    v->total[r] = dt;
    v->cpu[r] = dc;
    xtc_session_profile_steps(v->sess, v->step_s, v->nsteps);
    double *ks = v->kernel_s + (size_t)r * (size_t)v->nkernels;
    for (int s = 0; s < v->nsteps; s++) {
        int k;
        if (xtc_module_step(v->mod, s, &k, NULL) == XTC_OK && k >= 0 && k < v->nkernels)
            ks[k] += v->step_s[s];
        v->kernels[r] += v->step_s[s];
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *x, int n, int stride)
{
    double *t = malloc((size_t)(n ? n : 1) * sizeof *t);
    if (!t || n == 0) {
        free(t);
        return 0;
    }
    for (int i = 0; i < n; i++)
        t[i] = x[(size_t)i * (size_t)stride];
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

static double min_of(const double *x, int n)
{
    double m = INFINITY;
    for (int i = 0; i < n; i++)
        m = x[i] < m ? x[i] : m;
    return m;
}

static double max_of(const double *x, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* ---- reporting ---- */

typedef struct {
    int k;
    double ms;
} KMed;

static int by_ms_desc(const void *a, const void *b)
{
    const KMed *x = a, *y = b;
    return x->ms < y->ms ? 1 : x->ms > y->ms ? -1 : x->k - y->k;
}

/* per-kernel medians, slowest first; *n receives the count */
static KMed *kernel_medians(const Variant *v, int repeat)
{
    KMed *km = calloc((size_t)v->nkernels + 1, sizeof *km);
    if (!km)
        return NULL;
    for (int k = 0; k < v->nkernels; k++) {
        km[k].k = k;
        km[k].ms = 1e3 * median(v->kernel_s + k, repeat, v->nkernels);
    }
    qsort(km, (size_t)v->nkernels, sizeof *km, by_ms_desc);
    return km;
}

/* medians summed by op: "matmul", "attention", ... */
typedef struct {
    const char *op;
    double ms;
    int steps;
} OpSum;

static int op_sums(const Variant *v, const KMed *km, OpSum *out, int cap)
{
    int n = 0;
    for (int i = 0; i < v->nkernels; i++) {
        const char *op;
        int uses;
        xtc_module_kernel(v->mod, km[i].k, NULL, &op, &uses);
        int j = 0;
        while (j < n && strcmp(out[j].op, op))
            j++;
        if (j == n) {
            if (n == cap)
                continue;
            out[n].op = op;
            out[n].ms = 0;
            out[n].steps = 0;
            n++;
        }
        out[j].ms += km[i].ms;
        out[j].steps += uses;
    }
    for (int a = 1; a < n; a++) /* insertion sort, slowest first */
        for (int b = a; b > 0 && out[b].ms > out[b - 1].ms; b--) {
            OpSum t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    return n;
}

static void print_variant(const BenchOpts *o, const Variant *v)
{
    printf("\n%s: %d nodes, %d steps, %d kernels, compiled in %.1f s\n", v->name, v->nodes, v->nsteps, v->nkernels,
           v->compile_s);
    if (!v->ran) {
        printf("  not run: %s; planned arena %.3f GiB\n", v->why, v->peak / 1073741824.0);
        return;
    }
    double med = median(v->total, o->repeat, 1);
    printf("  total %.2f ms median (min %.2f, max %.2f, spread %.1f%%), arena %.1f MiB%s\n", 1e3 * med,
           1e3 * min_of(v->total, o->repeat), 1e3 * max_of(v->total, o->repeat),
           med > 0 ? 100 * (max_of(v->total, o->repeat) - min_of(v->total, o->repeat)) / med : 0,
           v->peak / 1048576.0, target_info(o->target)->device_arena ? " of device memory" : "");
    if (target_info(o->target)->cpu_time)
        printf("  cpu %.2f ms median (min %.2f, max %.2f): the process's CPU time, every thread's\n",
               1e3 * median(v->cpu, o->repeat, 1), 1e3 * min_of(v->cpu, o->repeat), 1e3 * max_of(v->cpu, o->repeat));
    printf("  kernels %.3f ms median per run (the sum of the steps' times)\n", 1e3 * median(v->kernels, o->repeat, 1));
    KMed *km = kernel_medians(v, o->repeat);
    if (!km)
        return;
    OpSum ops[128];
    int nops = op_sums(v, km, ops, 128);
    printf("  by op:  %10s %6s %6s  %s\n", "ms", "share", "steps", "op");
    double sum = 0;
    for (int i = 0; i < nops; i++)
        sum += ops[i].ms;
    for (int i = 0; i < nops; i++)
        printf("          %10.3f %5.1f%% %6d  %s\n", ops[i].ms, sum > 0 ? 100 * ops[i].ms / sum : 0, ops[i].steps,
               ops[i].op);
    printf("  slowest kernels (median ms per run, summed over the steps sharing each):\n");
    printf("          %10s %6s %6s  %-14s %s\n", "ms", "share", "steps", "op", "kernel");
    for (int i = 0; i < v->nkernels && i < o->top; i++) {
        const char *fn, *op;
        int uses;
        xtc_module_kernel(v->mod, km[i].k, &fn, &op, &uses);
        printf("          %10.3f %5.1f%% %6d  %-14s %s\n", km[i].ms, sum > 0 ? 100 * km[i].ms / sum : 0, uses, op, fn);
    }
    free(km);
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void json_variant(const BenchOpts *o, const Variant *v)
{
    printf("{\"nodes\": %d, \"steps\": %d, \"kernels\": %d, \"compile_s\": %.3f, \"ran\": %s, \"arena_bytes\": %lld",
           v->nodes, v->nsteps, v->nkernels, v->compile_s, v->ran ? "true" : "false", (long long)v->peak);
    if (!v->ran) {
        printf(", \"why\": ");
        json_str(v->why);
        printf("}");
        return;
    }
    printf(", \"total_ms\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f, \"runs\": [", 1e3 * median(v->total, o->repeat, 1),
           1e3 * min_of(v->total, o->repeat), 1e3 * max_of(v->total, o->repeat));
    for (int r = 0; r < o->repeat; r++)
        printf("%s%.4f", r ? ", " : "", 1e3 * v->total[r]);
    printf("]}, \"kernels_ms\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}", 1e3 * median(v->kernels, o->repeat, 1),
           1e3 * min_of(v->kernels, o->repeat), 1e3 * max_of(v->kernels, o->repeat));
    if (target_info(o->target)->cpu_time) {
        printf(", \"cpu_ms\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f, \"runs\": [", 1e3 * median(v->cpu, o->repeat, 1),
               1e3 * min_of(v->cpu, o->repeat), 1e3 * max_of(v->cpu, o->repeat));
        for (int r = 0; r < o->repeat; r++)
            printf("%s%.4f", r ? ", " : "", 1e3 * v->cpu[r]);
        printf("]}");
    }
    KMed *km = kernel_medians(v, o->repeat);
    if (km) {
        OpSum ops[128];
        int nops = op_sums(v, km, ops, 128);
        printf(", \"ops\": [");
        for (int i = 0; i < nops; i++) {
            printf("%s{\"op\": ", i ? ", " : "");
            json_str(ops[i].op);
            printf(", \"median_ms\": %.4f, \"steps\": %d}", ops[i].ms, ops[i].steps);
        }
        printf("], \"kernel_ms\": [");
        for (int i = 0; i < v->nkernels; i++) {
            const char *fn, *op;
            int uses;
            xtc_module_kernel(v->mod, km[i].k, &fn, &op, &uses);
            printf("%s{\"kernel\": ", i ? ", " : "");
            json_str(fn);
            printf(", \"op\": ");
            json_str(op);
            printf(", \"steps\": %d, \"median_ms\": %.4f}", uses, km[i].ms);
        }
        printf("]");
        free(km);
    }
    printf("}");
}

static void free_variant(Variant *v)
{
    xtc_session_free(v->sess);
    xtc_module_free(v->mod);
    if (v->so[0])
        unlink(v->so);
    free(v->total);
    free(v->cpu);
    free(v->kernels);
    free(v->kernel_s);
    free(v->step_s);
}

int cli_bench(int argc, char **argv)
{
    BenchOpts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    if (o.decode) {
        int asked = o.dtype || (o.mma != CG_MMA_AUTO && o.mma != CG_MMA_OFF) || o.t.int8 || o.t.kv_dtype;
        if (strcmp(o.t.name, "cpu") != 0 || o.train || o.json || (o.against && asked)) {
            fprintf(stderr, "xtc bench: --decode runs on the cpu target, without --train or --json, and --against "
                            "without --dtype, --mma, --weights-dtype or --kv-dtype\n");
            return 2;
        }
        const char *tmpd = getenv("TMPDIR");
        char ddir[4096];
        snprintf(ddir, sizeof ddir, "%s/xtc-bench-XXXXXX", tmpd && *tmpd ? tmpd : "/tmp");
        if (!mkdtemp(ddir)) {
            fprintf(stderr, "xtc bench: cannot create a temporary directory: %s\n", strerror(errno));
            return 1;
        }
        BenchDecode d = {.path = o.path, .model = o.model, .dtype = o.dtype, .dir = ddir, .against = o.against, .mma = o.mma,
                         .threads = o.threads, .repeat = o.repeat, .opt_level = o.opt_level, .context = o.decode,
                         .t = &o.t};
        rc = cli_bench_decode(&d);
        rmdir(ddir);
        return rc;
    }
    IrGraph *g = build_graph(&o);
    if (!g)
        return 1;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/xtc-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "xtc bench: cannot create a temporary directory: %s\n", strerror(errno));
        ir_graph_free(g);
        return 1;
    }
    Variant var[2];
    memset(var, 0, sizeof var);
    var[0].name = "fused";
    char without[96];
    snprintf(without, sizeof without, "without-%s", o.against ? o.against : "");
    var[1].name = o.against ? without : "unfused";
    rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        Variant *v = &var[i];
        if (!o.json)
            fprintf(stderr, "xtc bench: compiling %s ...\n", v->name);
        rc = compile_variant(&o, g, v, i == 1, dir);
        if (rc)
            break;
        v->total = calloc((size_t)o.repeat, sizeof *v->total);
        v->cpu = calloc((size_t)o.repeat, sizeof *v->cpu);
        v->kernels = calloc((size_t)o.repeat, sizeof *v->kernels);
        v->kernel_s = calloc((size_t)o.repeat * (size_t)(v->nkernels + 1), sizeof *v->kernel_s);
        v->step_s = calloc((size_t)v->nsteps + 1, sizeof *v->step_s);
        if (!v->total || !v->cpu || !v->kernels || !v->kernel_s || !v->step_s) {
            rc = -1;
            break;
        }
        int64_t syms[16] = {0};
        symbol_values(v->mod, &o, syms);
        v->peak = xtc_module_arena_bytes(v->mod, syms);
        if (v->peak > o.max_gib * 1073741824.0) {
            snprintf(v->why, sizeof v->why, "the arena would exceed --max-gib %g", o.max_gib);
            continue;
        }
        rc = bind_session(&o, g, v);
        v->ran = rc == 0;
    }
    /* warm up, then alternate the variants */
    for (int w = 0; rc == 0 && w < o.warmup; w++)
        for (int i = 0; i < 2 && rc == 0; i++)
            if (var[i].ran)
                rc = run_once(&var[i], -1);
    for (int r = 0; rc == 0 && r < o.repeat; r++)
        for (int i = 0; i < 2 && rc == 0; i++)
            if (var[i].ran)
                rc = run_once(&var[i], r);
    for (int i = 0; rc == 0 && i < 2; i++)
        if (var[i].ran)
            var[i].peak = xtc_session_peak_bytes(var[i].sess);
    if (rc == 0) {
        double mf = var[0].ran ? median(var[0].total, o.repeat, 1) : 0;
        double mu = var[1].ran ? median(var[1].total, o.repeat, 1) : 0;
        double kf = var[0].ran ? median(var[0].kernels, o.repeat, 1) : 0;
        double ku = var[1].ran ? median(var[1].kernels, o.repeat, 1) : 0;
        /* the runs alternate (fused, unfused, fused, ...): the ratio of each pair of neighbours
         * saw the same moment of a shared machine, so its spread says how far the medians'
         * ratio can be trusted */
        const TargetInfo *ti = target_info(o.target);
        double cf = ti->cpu_time && var[0].ran ? median(var[0].cpu, o.repeat, 1) : 0;
        double cu = ti->cpu_time && var[1].ran ? median(var[1].cpu, o.repeat, 1) : 0;
        double *pair = calloc(2 * (size_t)o.repeat, sizeof *pair), *pair_cpu = pair ? pair + o.repeat : NULL;
        int paired = pair && var[0].ran && var[1].ran;
        for (int r = 0; paired && r < o.repeat; r++) {
            pair[r] = var[0].total[r] > 0 ? var[1].total[r] / var[0].total[r] : 0;
            pair_cpu[r] = var[0].cpu[r] > 0 ? var[1].cpu[r] / var[0].cpu[r] : 0;
        }
        int paired_cpu = paired && cf > 0 && cu > 0 && min_of(pair_cpu, o.repeat) > 0;
        char cpu[256] = "?";
        FILE *ci = fopen("/proc/cpuinfo", "r");
        if (ci) {
            char line[256];
            while (fgets(line, sizeof line, ci))
                if (!strncmp(line, "model name", 10)) {
                    const char *c = strchr(line, ':');
                    snprintf(cpu, sizeof cpu, "%.200s", c ? c + 2 : line);
                    cpu[strcspn(cpu, "\n")] = 0;
                    break;
                }
            fclose(ci);
        }
        /* the device as its driver names it: the GPU (cuDeviceGetName), "emulated", or the CPU */
        const XtcSession *opened = var[0].sess ? var[0].sess : var[1].sess;
        const char *dev = opened ? xtc_session_device(opened) : "";
        if (ti->emulated)
            dev = "emulated";
        else if (!strcmp(dev, "cpu"))
            dev = cpu;
        else if (!*dev)
            dev = "? (not opened: no variant ran)";
        if (o.json) {
            printf("{\"model\": ");
            json_str(o.path);
            printf(", \"batch\": %lld, \"seq\": %lld, \"train\": %s, \"threads\": %d, \"repeat\": %d, \"warmup\": %d, "
                   "\"target\": ",
                   (long long)o.batch, (long long)o.seq, o.train ? "true" : "false", o.threads, o.repeat, o.warmup);
            json_str(o.target);
            printf(", \"dtype\": ");
            json_str(o.dtype ? o.dtype : "f32");
            printf(", \"device\": ");
            json_str(dev);
            printf(", \"kernel_timer\": ");
            json_str(ti->timer);
            printf(", \"cpu\": ");
            json_str(cpu);
            printf(", \"fused\": ");
            json_variant(&o, &var[0]);
            printf(", \"unfused\": ");
            json_variant(&o, &var[1]);
            if (mf > 0 && mu > 0)
                printf(", \"speedup\": %.4f", mu / mf);
            if (kf > 0 && ku > 0)
                printf(", \"speedup_kernels\": %.4f", ku / kf);
            if (paired)
                printf(", \"speedup_pairs\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}",
                       median(pair, o.repeat, 1), min_of(pair, o.repeat), max_of(pair, o.repeat));
            if (cf > 0 && cu > 0)
                printf(", \"speedup_cpu\": %.4f", cu / cf);
            if (paired_cpu)
                printf(", \"speedup_pairs_cpu\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}",
                       median(pair_cpu, o.repeat, 1), min_of(pair_cpu, o.repeat), max_of(pair_cpu, o.repeat));
            printf("}\n");
        } else {
            printf("xtc bench %s: batch %lld, seq %lld, %s, target %s", o.path, (long long)o.batch, (long long)o.seq,
                   o.train ? "training step" : "forward", o.target);
            if (ti->device_arena)
                printf(", dtype %s", o.dtype ? o.dtype : "f32");
            if (ti->threaded)
                printf(", %d thread%s", o.threads, o.threads == 1 ? "" : "s");
            printf(", %d runs after %d warm-up\n", o.repeat, o.warmup);
            if (ti->emulated)
                printf("device: emulated (%s on %s)\n", opened ? xtc_session_device(opened) : "the xtc CUDA emulator",
                       cpu);
            else
                printf("device: %s\n", dev);
            printf("kernel times: %s\n", ti->timer_text);
            print_variant(&o, &var[0]);
            print_variant(&o, &var[1]);
            printf("\n");
            if (mf > 0 && mu > 0 && kf > 0 && ku > 0) {
                printf("speed-up (%s / fused median): %.2fx total, %.2fx kernels", var[1].name, mu / mf, ku / kf);
                if (cf > 0 && cu > 0)
                    printf(", %.2fx cpu", cu / cf);
                printf("\n");
            }
            if (paired && o.repeat > 1) {
                printf("speed-up of neighbouring runs: median %.2fx, from %.2fx to %.2fx", median(pair, o.repeat, 1),
                       min_of(pair, o.repeat), max_of(pair, o.repeat));
                if (paired_cpu)
                    printf("; by cpu: median %.2fx, from %.2fx to %.2fx", median(pair_cpu, o.repeat, 1),
                           min_of(pair_cpu, o.repeat), max_of(pair_cpu, o.repeat));
                printf("\n");
            }
            char what[128] = "";
            if (ti->device_arena)
                snprintf(what, sizeof what, " (device memory, %s storage)", o.dtype ? o.dtype : "f32");
            printf("arena%s: fused %.1f MiB, %s %.1f MiB%s\n", what, var[0].peak / 1048576.0, var[1].name,
                   var[1].peak / 1048576.0, var[1].ran ? "" : " (planned, not run)");
        }
        free(pair);
    }
    free_variant(&var[0]);
    free_variant(&var[1]);
    rmdir(dir);
    ir_graph_free(g);
    return rc ? 1 : 0;
}
