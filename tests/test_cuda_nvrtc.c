/* test_cuda_nvrtc.c: every CUDA kernel xtc generates compiles with NVRTC, and its PTX assembles
 * with ptxas (for sm_80 with one prelude, for sm_90 with the others). No GPU is needed.
 *
 * The tensor-core attention forward and backward (flash): their PTX holds the mma.sync of its
 * type, and ptxas -v assembles it for sm_80 and sm_90 with no spills and no stack frame
 * (CK_RUN_CASE=flash). The same for the tensor-core matmul of 16-bit operands, with its ldmatrix
 * and cp.async (flash too).
 *
 * The graphs: every .xtf of models/ (every model statement of each file) and of tests/parity/,
 * lowered for inference, for inference with the padding masks, for incremental decoding (KV
 * cache) where the model allows it, and for training with the backward graph (ir_autodiff),
 * each through the pass pipeline as `xtc compile --target cuda` runs it. Their kernels are
 * rendered once, deduplicated by code (the twelve layers of a model, and the models among
 * themselves, share most kernels; kernels that differ only in comments or in parameters their
 * body never reads are one: same_code) and compiled in NVRTC programs for sm_80, whose PTX ptxas
 * assembles: of the models' one of each form and allocation sizes, and of the parity graphs'
 * those of a form (see thin_to_forms) the models' lack.
 *
 * The kernels' text does not depend on the storage of floating-point tensors (--dtype): the
 * prelude does. So the kernels of every model of models/ are compiled again with the bf16 and
 * the fp16 prelude (the parity graphs' kernels, f32 only, are mostly the same ones).
 * The tensor-core matmuls (--mma=bf16 and --mma=fp16, the default of --dtype bf16 and fp16):
 * GPT's inference and training matmul kernels rendered with them (the other kernels are the
 * ones above), compiled in the same programs, with the f32 prelude and with the prelude of the
 * matching 16-bit storage (the combination --dtype implies); their PTX must hold the mma.sync
 * instructions of that type. Three whole modules go through cg_compile --target cuda and load:
 * f32, bf16 training on tensor cores for sm_90, fp16 inference on tensor cores.
 *
 * CI has the CUDA toolkit: without NVRTC or ptxas this test fails, saying so. On a machine
 * without the toolkit, XTC_SKIP_NVRTC=1 turns that into a visible skip. */
#include "cg_cuda.h"
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_drive.h"
#include "kernel_text.h"

static void make_tmpdir(void) { harness_make_tmpdir("nvrtc"); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1: go on; 0: the toolkit is missing and XTC_SKIP_NVRTC allows skipping (said on stderr) */
static int toolkit_present(void)
{
    char why[1200] = "", version[32];
    int have_nvrtc = cg_nvrtc_available(version, sizeof version, why, sizeof why);
    const char *ptxas = XTC_PTXAS;
    int have_ptxas = ptxas[0] && !strstr(ptxas, "NOTFOUND") && access(ptxas, X_OK) == 0;
    if (have_nvrtc && have_ptxas)
        return 1;
    const char *skip = getenv("XTC_SKIP_NVRTC");
    if (skip && *skip && strcmp(skip, "0") != 0) {
        fprintf(stderr, "test_cuda_nvrtc: SKIPPED (XTC_SKIP_NVRTC is set): %s%s\n", have_nvrtc ? "" : why,
                have_ptxas ? "" : " ptxas not found at configure time");
        return 0;
    }
    ck_abort_msg("the CUDA toolkit is needed (CI has it): %s%s; set XTC_SKIP_NVRTC=1 to skip on a machine "
                 "without it",
                 have_nvrtc ? "" : why, have_ptxas ? "" : " ptxas was not found at configure time (XTC_PTXAS)");
    return 0;
}

/* ---- the kernels of every graph, deduplicated ---- */

typedef struct {
    char **text; /* canonical text: the kernel's name replaced by @NAME@ */
    char **key;  /* what makes two kernels the same program (same_code) */
    int *nparams;
    char **op;
    int n, cap;
    int graphs, refused, kernels;
    int mma;      /* CG_MMA_*: how the matmuls are rendered */
    int only_mma; /* keep only the kernels on tensor cores */
    int viewed;   /* of the distinct kernels: attention through head-split views (CG_VIEW_*) */
} KernelSet;

/* Renders plan's unit into *u and opens a memory stream at *src with the prelude for storage
 * (0 f32, 1 bf16, 2 fp16) written: the caller appends the kernels it compiles, then closes it. */
static FILE *render_with_prelude(const CgPlan *plan, const CgOptions *opt, const IrGraph *g, int storage, CuUnit *u,
                                 char **src, size_t *len)
{
    char err[4096];
    ck_assert_msg(cg_cuda_render_unit(plan, opt, 0, u, err, sizeof err) == 0, "%s", err);
    FILE *f = open_memstream(src, len);
    ck_assert_ptr_nonnull(f);
    cu_prelude(f, g, u->nkernels, storage);
    return f;
}

static void add_graph(KernelSet *ks, const IrGraph *g, const char *what)
{
    char err[1024];
    CgPlan plan;
    /* as cg_compile plans for the cuda target: inference attention through head-split views,
     * weight gradients' matmuls reading A transposed in place */
    unsigned caps = cg_cuda_backend.caps;
    CgPlanOpts o = {.head_views = (caps & CG_CAP_HEAD_VIEWS) != 0, .matmul_views = (caps & CG_CAP_MATMUL_VIEWS) != 0};
    ck_assert_msg(cg_plan_build_opts(g, &plan, &o, err, sizeof err) == 0, "%s: plan: %s", what, err);
    CuUnit u;
    CgOptions opt = {.output = "-", .mma = ks->mma};
    ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &u, err, sizeof err) == 0, "%s: render: %s", what, err);
    for (int k = 0; k < u.nkernels; k++) {
        if (ks->only_mma && !strstr(u.kernel_text[k], "xtc_mma_m16n8k16_"))
            continue;
        char *c = canonical(u.kernel_text[k], plan.kernels[k].fn);
        int nparams;
        char *key = same_code(c, &nparams);
        int found = -1;
        for (int i = 0; i < ks->n && found < 0; i++)
            if (strcmp(ks->key[i], key) == 0)
                found = i;
        if (found >= 0) { /* the same code: the one with the fewest parameters stays */
            if (nparams < ks->nparams[found]) {
                free(ks->text[found]);
                ks->text[found] = c;
                ks->nparams[found] = nparams;
            } else {
                free(c);
            }
            free(key);
            continue;
        }
        if (ks->n == ks->cap) {
            ks->cap = ks->cap ? 2 * ks->cap : 256;
            ks->text = realloc(ks->text, (size_t)ks->cap * sizeof *ks->text);
            ks->key = realloc(ks->key, (size_t)ks->cap * sizeof *ks->key);
            ks->nparams = realloc(ks->nparams, (size_t)ks->cap * sizeof *ks->nparams);
            ks->op = realloc(ks->op, (size_t)ks->cap * sizeof *ks->op);
            ck_assert(ks->text && ks->key && ks->nparams && ks->op);
        }
        ks->viewed += plan.kernels[k].views != 0;
        ks->op[ks->n] = strdup(ir_ops[plan.kernels[k].node->op].name);
        ks->key[ks->n] = key;
        ks->nparams[ks->n] = nparams;
        ks->text[ks->n++] = c;
    }
    ks->kernels += u.nkernels;
    ks->graphs++;
    cg_cuda_unit_free(&u);
    cg_plan_free(&plan);
}

/* The pipeline as xtc compile --target cuda runs it (fusions the backend cannot lower skipped). */
static void add_lowered(KernelSet *ks, IrGraph *g, const char *what)
{
    PassOptions po = {.verify_each = 1};
    char err[1024];
    IrGraph *h = harness_passes(g, "cuda", &po, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: passes: %s", what, err);
    add_graph(ks, h, what);
    ir_graph_free(h);
}

static IrGraph *lower(XtfFile *f, const char *model, const XtLowerOpts *o)
{
    char err[512];
    return harness_build(f, model, o, 0, harness_target("cuda"), NULL, NULL, err, sizeof err);
}

static void add_model(KernelSet *ks, XtfFile *f, const char *model, const char *base)
{
    static const XtLowerOpts infer = {0};
    static const XtLowerOpts masks = {.mask = 1, .context_mask = 1, .tgt_mask = 1, .src_mask = 1};
    static const XtLowerOpts kv = {.kv_cache = 1};
    static const XtLowerOpts train_mask = {.train = 1, .mask = 1, .context_mask = 1, .tgt_mask = 1, .src_mask = 1};
    static const XtLowerOpts train = {.train = 1};
    char what[600];
    IrGraph *g = lower(f, model, &infer);
    if (!g) { /* a feature not supported yet: the language refuses it by name */
        ks->refused++;
        return;
    }
    snprintf(what, sizeof what, "%s:%s", base, model ? model : "");
    add_lowered(ks, g, what);
    ir_graph_free(g);
    if ((g = lower(f, model, &masks))) {
        add_lowered(ks, g, what);
        ir_graph_free(g);
    }
    if ((g = lower(f, model, &kv))) {
        add_lowered(ks, g, what);
        ir_graph_free(g);
    }
    g = lower(f, model, &train_mask);
    if (!g)
        g = lower(f, model, &train);
    if (!g)
        return;
    add_lowered(ks, g, what);
    char err[512]; /* the loss, or the outputs seeded by grad.<output> */
    ck_assert_msg(harness_autodiff(g, "cuda", err, sizeof err) == 0, "%s: autodiff: %s", what, err);
    add_lowered(ks, g, what);
    ir_graph_free(g);
}

static void add_dir(KernelSet *ks, const char *dir, int every_statement)
{
    DIR *dp = opendir(dir);
    ck_assert_msg(dp != NULL, "cannot open %s", dir);
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".xtf") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        XtfDiag d;
        xtf_diag_init(&d);
        XtfFile *f = xtf_parse_file(path, &d);
        int bad = !f || d.nerrors || xtf_check(f, &d) > 0;
        xtf_diag_free(&d);
        if (bad) {
            ks->refused++;
            xtf_free(f);
            continue;
        }
        if (every_statement)
            for (int s = 0; s < f->nstmts; s++)
                add_model(ks, f, f->stmts[s].name, de->d_name);
        else
            add_model(ks, f, NULL, de->d_name);
        xtf_free(f);
    }
    closedir(dp);
}

static const char *const storage_name[] = {"f32", "bf16", "fp16"};

/* One slice of the distinct kernels: NVRTC, then ptxas. The kernels' text is the same whatever
 * the storage of floating-point tensors (--dtype): only the prelude differs, so each slice is
 * compiled with each prelude. The PTX (for sm_80, valid on later GPUs as well) is assembled for
 * one architecture per prelude: sm_80 with f32 storage (every kernel), sm_90 with the 16-bit ones
 * (the models' kernels again), so both architectures see every model's kernels. Assembling
 * every set for both took 490 of the test's 870 s of thread time. */
static const char *const ptxas_arch[] = {"sm_80", "sm_90", "sm_90"};

typedef struct {
    const KernelSet *ks;
    int from, to, index, storage; /* storage: 0 f32, 1 bf16, 2 fp16 (the prelude's) */
    int entries, failed;
    int mma_bf16, mma_f16; /* mma.sync instructions in the PTX, by operand type */
    size_t src_bytes, ptx_bytes;
    double nvrtc_s, ptxas_s; /* seconds in each (summed over the chunks in compile_set) */
    char err[4096];
} Chunk;

static void *compile_chunk(void *arg)
{
    Chunk *c = arg;
    char *src = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&src, &len);
    IrGraph *empty = ir_graph_new("all");
    cu_prelude(f, empty, c->to - c->from, c->storage);
    ir_graph_free(empty);
    for (int i = c->from; i < c->to; i++) {
        char name[64];
        snprintf(name, sizeof name, "xtc_u%d_%s", i, c->ks->op[i]);
        fputc('\n', f);
        for (const char *p = c->ks->text[i]; *p;)
            if (strncmp(p, "@NAME@", 6) == 0) {
                fputs(name, f);
                p += 6;
            } else {
                fputc(*p++, f);
            }
    }
    fclose(f);
    c->src_bytes = len;
    char *ptx = NULL, cu_name[64];
    snprintf(cu_name, sizeof cu_name, "kernels_%d_%s.cu", c->index, storage_name[c->storage]);
    double t0 = now_s();
    int rc = cg_nvrtc_compile(src, cu_name, "sm_80", &ptx, c->err, sizeof c->err);
    c->nvrtc_s = now_s() - t0;
    free(src);
    if (rc != 0) {
        c->failed = 1;
        return NULL;
    }
    c->ptx_bytes = strlen(ptx);
    for (const char *p = ptx; (p = strstr(p, ".entry ")); p++)
        c->entries++;
    for (const char *p = ptx; (p = strstr(p, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")); p++)
        c->mma_bf16++;
    for (const char *p = ptx; (p = strstr(p, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")); p++)
        c->mma_f16++;
    char ptx_path[512], log[512];
    snprintf(ptx_path, sizeof ptx_path, "%s/kernels_%d_%s.ptx", tmpdir, c->index, storage_name[c->storage]);
    snprintf(log, sizeof log, "%s/ptxas_%d.log", tmpdir, c->index);
    FILE *pf = fopen(ptx_path, "w");
    if (!pf || fputs(ptx, pf) < 0) {
        snprintf(c->err, sizeof c->err, "cannot write %s", ptx_path);
        c->failed = 1;
    }
    if (pf)
        fclose(pf);
    free(ptx);
    char arch[32];
    snprintf(arch, sizeof arch, "-arch=%s", ptxas_arch[c->storage]);
    t0 = now_s();
    char *argv[] = {(char *)XTC_PTXAS, arch, ptx_path, "-o", "/dev/null", NULL};
    if (!c->failed && cg_run_program(argv, log) != 0) { /* the log says why */
        char *text = harness_read_file(log, NULL);
        snprintf(c->err, sizeof c->err, "ptxas %s %s failed: %.2000s", arch, ptx_path, text ? text : "");
        free(text);
        c->failed = 1;
    }
    c->ptxas_s = now_s() - t0;
    return NULL;
}

/* NVRTC and ptxas over every kernel of ks; the totals of its chunks into *sum. */
static void compile_set(const KernelSet *ks, int storage, Chunk *sum)
{
    /* slices compiled side by side: NVRTC may be called from several threads */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nchunks = cpus < 2 ? 2 : cpus > 8 ? 8 : (int)cpus;
    Chunk chunks[8];
    pthread_t threads[8];
    for (int c = 0; c < nchunks; c++) {
        chunks[c] = (Chunk){.ks = ks, .from = ks->n * c / nchunks, .to = ks->n * (c + 1) / nchunks, .index = c,
                            .storage = storage};
        ck_assert_int_eq(pthread_create(&threads[c], NULL, compile_chunk, &chunks[c]), 0);
    }
    memset(sum, 0, sizeof *sum);
    sum->index = nchunks;
    for (int c = 0; c < nchunks; c++) {
        pthread_join(threads[c], NULL);
        sum->entries += chunks[c].entries;
        sum->mma_bf16 += chunks[c].mma_bf16;
        sum->mma_f16 += chunks[c].mma_f16;
        sum->src_bytes += chunks[c].src_bytes;
        sum->ptx_bytes += chunks[c].ptx_bytes;
        sum->nvrtc_s += chunks[c].nvrtc_s;
        sum->ptxas_s += chunks[c].ptxas_s;
    }
    for (int c = 0; c < nchunks; c++)
        ck_assert_msg(!chunks[c].failed, "%s", chunks[c].err);
    ck_assert_msg(sum->entries == ks->n, "the PTX has %d entry points for %d kernels", sum->entries, ks->n);
}

static void free_set(KernelSet *ks)
{
    for (int i = 0; i < ks->n; i++) {
        free(ks->text[i]);
        free(ks->key[i]);
        free(ks->op[i]);
    }
    free(ks->text);
    free(ks->key);
    free(ks->nparams);
    free(ks->op);
}

static XtfFile *parse_gpt(void)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(XTC_SOURCE_DIR "/models/gpt.xtf", &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "gpt.xtf: %s", d.text ? d.text : "");
    xtf_diag_free(&d);
    return f;
}

/* GPT's kernels rendered with --mma (inference and training), only those on tensor cores, added
 * to ks: the others are the f32 ones already there. Returns how many were added. */
static int add_mma_kernels(KernelSet *ks, int mma)
{
    XtfFile *f = parse_gpt();
    int n0 = ks->n, graphs = ks->graphs, kernels = ks->kernels;
    ks->mma = mma;
    ks->only_mma = 1;
    add_model(ks, f, NULL, "gpt.xtf");
    ks->mma = CG_MMA_AUTO;
    ks->only_mma = 0;
    ks->graphs = graphs; /* counted among the models' already */
    ks->kernels = kernels;
    xtf_free(f);
    return ks->n - n0;
}

/* A line whose numbers size what ptxas allocates (and may refuse): shared memory, the launch
 * bounds, a global array, a local array (registers or local memory). */
static int sizes_line(const char *line)
{
    static const char *const marks[] = {"__shared__", "XTC_BOUNDS(", "XTC_GLOBAL "};
    static const char *const types[] = {"float ", "double ", "int ", "unsigned ", "i64 ", "short "};
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    for (size_t m = 0; m < sizeof marks / sizeof *marks; m++) {
        const char *p = strstr(line, marks[m]);
        if (p && p < line + len)
            return 1;
    }
    const char *t = line + strspn(line, " ");
    const char *bracket = memchr(t, '[', len - (size_t)(t - line));
    for (size_t k = 0; bracket && k < sizeof types / sizeof *types; k++)
        if (!strncmp(t, types[k], strlen(types[k])))
            return 1;
    return 0;
}

/* The kernel's text with every run of digits read as one digit: kernels that differ only in
 * sizes, strides, constants and value numbers have the same form. With keep_sizes, the numbers
 * of the lines that size an allocation (sizes_line) are read as they are: kernels of the same
 * form whose shared memory, launch bounds or arrays differ are different. */
static int same_form(const char *a, const char *b, int keep_sizes)
{
    int literal = keep_sizes && sizes_line(a);
    if (keep_sizes && literal != sizes_line(b))
        return 0;
    for (;;) {
        int da = *a >= '0' && *a <= '9', db = *b >= '0' && *b <= '9';
        if (da != db)
            return 0;
        if (da && !literal) {
            while (*a >= '0' && *a <= '9')
                a++;
            while (*b >= '0' && *b <= '9')
                b++;
            continue;
        }
        if (*a != *b)
            return 0;
        if (!*a)
            return 1;
        a++, b++;
        if (keep_sizes && a[-1] == '\n') { /* both at the start of a line */
            literal = sizes_line(a);
            if (literal != sizes_line(b))
                return 0;
        }
    }
}

/* The kernels of ks into *out (sharing ks's text), keeping the order: all of those in an index
 * range [from[r], from[r + 1]) with thin[r] zero, none of those with thin[r] negative, and of the
 * others only those whose form is new (not among the kernels kept before them; thin[r] 2: the
 * form with its allocations' sizes); kept[r] counts the kernels of range r that stay.
 * With 16-bit storage only the prelude changes, and what the prelude offers a kernel (16-bit
 * loads and stores, conversions, the tensor-core fragments) depends on its form, not on its
 * numbers: the 16-bit sets compile one kernel of each form (567 of the 859 kernels of models/ and
 * GPT's tensor-core matmuls; the test's thread time 870 -> 460 s, with one ptxas architecture).
 * The f32 set compiles one kernel of models/ of each form and allocation sizes (what ptxas can
 * refuse by its numbers, static shared memory over 48 KiB, or size differently: local arrays,
 * launch bounds), GPT's tensor-core matmuls, and, of the parity graphs' kernels (tiny models of
 * one feature each, whose kernels are the models' at other sizes, 962 more distinct ones), those
 * of a form models/ does not have. */
static void thin_to_forms(const KernelSet *ks, KernelSet *out, const int *from, const int *thin, int nranges,
                          int *kept)
{
    *out = *ks;
    out->key = NULL; /* (only text and op are the thinned set's) */
    out->nparams = NULL;
    out->text = malloc((size_t)ks->n * sizeof *out->text);
    out->op = malloc((size_t)ks->n * sizeof *out->op);
    ck_assert(out->text && out->op);
    out->n = 0;
    for (int r = 0; r < nranges; r++)
        kept[r] = 0;
    for (int i = 0; i < ks->n; i++) {
        int r = 0;
        while (r < nranges - 1 && i >= from[r + 1])
            r++;
        if (thin[r] < 0)
            continue;
        int seen = 0;
        for (int j = 0; j < out->n && !seen && thin[r]; j++)
            seen = same_form(out->text[j], ks->text[i], thin[r] == 2);
        if (seen)
            continue;
        out->text[out->n] = ks->text[i];
        out->op[out->n++] = ks->op[i];
        kept[r]++;
    }
}

/* The kernels of every graph, rendered once for the three storages (an unchecked fixture: it runs
 * in the parent process, before Check forks the tests), in four ranges (ALL_*): every distinct
 * kernel of models/, those the parity graphs add, and GPT's tensor-core matmuls rendered with
 * --mma=bf16 and with --mma=fp16 (only those on tensor cores: the others are the f32 ones). */
enum { ALL_MODELS, ALL_PARITY, ALL_MMA_BF16, ALL_MMA_FP16, ALL_RANGES };
static KernelSet all_kernels;
static int all_from[ALL_RANGES + 1];
static double all_render_s;

static void render_all(void)
{
    double t0 = now_s();
    KernelSet *ks = &all_kernels;
    add_dir(ks, XTC_SOURCE_DIR "/models", 1);
    all_from[ALL_PARITY] = ks->n;
    add_dir(ks, XTC_SOURCE_DIR "/tests/parity", 0);
    all_from[ALL_MMA_BF16] = ks->n;
    ck_assert_int_gt(add_mma_kernels(ks, CG_MMA_BF16), 4);
    all_from[ALL_MMA_FP16] = ks->n;
    ck_assert_int_gt(add_mma_kernels(ks, CG_MMA_FP16), 4);
    all_from[ALL_RANGES] = ks->n;
    all_render_s = now_s() - t0;
}

static void free_all(void) { free_set(&all_kernels); }

/* Every kernel with the f32 (_i 0), bf16 (1) or fp16 (2) prelude. In the same NVRTC programs,
 * GPT's tensor-core matmuls (--mma): both formats with f32 storage, and the format of the
 * storage with 16-bit storage (the combination --dtype implies); every one of them must hold
 * 8 mma.sync per k-step of the type asked for, and no other kernel any. */
START_TEST(test_every_kernel_compiles)
{
    const int storage = _i;
    if (!toolkit_present())
        return;
    make_tmpdir();
    const KernelSet *ks = &all_kernels;
    ck_assert_int_gt(ks->graphs, 0);
    /* the models' inference attention reads q, k, v and writes its result through the views */
    ck_assert_msg(ks->viewed > 0, "no kernel through head-split views among the %d", ks->n);
    /* f32: one kernel of models/ of each form and allocation sizes, GPT's tensor-core matmuls, the
     * parity graphs' of a new form; 16-bit: one kernel of each form, of the models' plain ones,
     * then of the --mma of its format (the parity graphs' add little but time) */
    KernelSet thin;
    int kept[ALL_RANGES];
    static const int thin_of[3][ALL_RANGES] = {{2, 1, 0, 0}, {1, -1, 1, -1}, {1, -1, -1, 1}};
    thin_to_forms(ks, &thin, all_from, thin_of[storage], ALL_RANGES, kept);
    int mma_kernels[CG_MMA_FP16 + 1] = {0};
    mma_kernels[CG_MMA_BF16] = kept[ALL_MMA_BF16];
    mma_kernels[CG_MMA_FP16] = kept[ALL_MMA_FP16];
    ck_assert_int_gt(kept[ALL_MMA_BF16] + kept[ALL_MMA_FP16], 4);
    double t1 = now_s();
    Chunk sum;
    compile_set(&thin, storage, &sum);
    /* each tensor-core kernel holds 8 mma per k-step, of the type asked for only */
    ck_assert_msg(sum.mma_bf16 >= 8 * mma_kernels[CG_MMA_BF16] && sum.mma_f16 >= 8 * mma_kernels[CG_MMA_FP16] &&
                  (mma_kernels[CG_MMA_BF16] || !sum.mma_bf16) && (mma_kernels[CG_MMA_FP16] || !sum.mma_f16),
                  "%d bf16 and %d fp16 tensor-core kernels; the PTX has %d bf16 and %d f16 mma.sync",
                  mma_kernels[CG_MMA_BF16], mma_kernels[CG_MMA_FP16], sum.mma_bf16, sum.mma_f16);
    double t2 = now_s();
    fprintf(stderr,
            "test_cuda_nvrtc: %s storage: %d graphs (%d models refused by the language), %d kernels, %d distinct (%d "
            "through head-split views; %d of models/), and GPT's matmuls on tensor cores (%d with --mma=bf16, %d with "
            "--mma=fp16; %d bf16 and %d f16 mma.sync in the PTX): %d of %d (%s) compiled by NVRTC (%.0f KiB of CUDA C, "
            "%.0f KiB of PTX) and assembled by ptxas for %s in %.1f s on %d threads (NVRTC %.1f s, ptxas %.1f s of "
            "thread time; rendering, once for the three storages, %.1f s)\n",
            storage_name[storage], ks->graphs, ks->refused, ks->kernels, all_from[ALL_MMA_BF16], ks->viewed,
            all_from[ALL_PARITY], mma_kernels[CG_MMA_BF16], mma_kernels[CG_MMA_FP16], sum.mma_bf16, sum.mma_f16,
            thin.n, ks->n, storage ? "one of each form" : "of each form and allocation sizes", sum.src_bytes / 1024.0,
            sum.ptx_bytes / 1024.0, ptxas_arch[storage], t2 - t1, sum.index, sum.nvrtc_s, sum.ptxas_s, all_render_s);
    free(thin.text);
    free(thin.op);
}
END_TEST

/* The whole path of xtc compile --target cuda: NVRTC, the host code, cc, a module that loads. */
static void compile_module(const char *xtf, int train, const char *arch, const char *dtype, const char *want_mma)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(xtf, &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s: %s", xtf, d.text ? d.text : "");
    xtf_diag_free(&d);
    XtLowerOpts lo = {.train = train};
    char err[2048];
    IrGraph *g = harness_build(f, NULL, &lo, train, harness_target("cuda"), NULL, NULL, err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    char path[512], cu[512];
    snprintf(path, sizeof path, "%s/module_%d.so", tmpdir, train);
    snprintf(cu, sizeof cu, "%s/module_%d.cu", tmpdir, train);
    CgOptions opt = {.output = path, .target = "cuda", .cuda_arch = arch, .source = f->src, .source_name = xtf,
                     .emit_cuda = cu, .dtype = dtype};
    CgStats stats;
    ck_assert_msg(harness_cg(g, &opt, &stats, err, sizeof err) == 0, "%s: %s", xtf, err);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    ck_assert_int_eq(xtc_module_num_kernels(m), stats.nkernels);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    xtc_module_describe(m, mem);
    fclose(mem);
    char want[64], mma_line[64];
    snprintf(want, sizeof want, "option dtype = %s\n", dtype ? dtype : "f32");
    snprintf(mma_line, sizeof mma_line, "option mma = %s\n", want_mma);
    ck_assert_msg(strstr(text, "option target = cuda") && strstr(text, arch) && strstr(text, want) &&
                  strstr(text, mma_line), "%s", text);
    free(text);
    struct stat sb;
    ck_assert_int_eq(stat(cu, &sb), 0);
    fprintf(stderr, "test_cuda_nvrtc: %s%s --target cuda --cuda-arch %s --dtype %s (mma %s): %d kernels, NVRTC %.1f "
                    "s, cc %.1f s, %lld bytes\n", xtf, train ? " --train" : "", arch, dtype ? dtype : "f32", want_mma,
            stats.nkernels, stats.optimize_s, stats.link_s, (long long)stats.module_bytes);
    xtc_module_free(m);
    ir_graph_free(g);
    xtf_free(f);
}

START_TEST(test_compile_modules)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    /* each module's kernels are also among those compiled above: one of each kind, not more */
    compile_module(XTC_SOURCE_DIR "/models/gpt.xtf", 0, "sm_80", NULL, "off");
    compile_module(XTC_SOURCE_DIR "/tests/parity/decoder_plain.xtf", 1, "sm_90", "bf16", "bf16");
    compile_module(XTC_SOURCE_DIR "/models/gpt.xtf", 0, "sm_80", "fp16", "fp16");
}
END_TEST

/* The kernels written as CUDA source (codegen/cuda/kernels: the device's AdamW step), after the
 * generated prelude as a training module has them: NVRTC compiles them, ptxas assembles them for
 * sm_80 and sm_90 without spilling registers, and the PTX has every entry point. */
START_TEST(test_library_kernels)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    IrGraph *g = ir_graph_new("lib");
    char *src = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&src, &len);
    cu_prelude(f, g, 2, 1);
    fprintf(f, "\n%s", cg_embed_adamw_cuh);
    fclose(f);
    const char *arch[] = {"sm_80", "sm_90"};
    for (int a = 0; a < 2; a++) {
        char err[4096], *ptx = NULL, path[512], log[512], flag[32];
        ck_assert_msg(cg_nvrtc_compile(src, "adamw.cu", arch[a], &ptx, err, sizeof err) == 0, "%s", err);
        for (int k = 0; k < 2; k++) {
            char entry[128];
            snprintf(entry, sizeof entry, ".entry %s(", cu_lib_kernels[k].name);
            ck_assert_msg(strstr(ptx, entry), "no %s in the PTX for %s", entry, arch[a]);
        }
        snprintf(path, sizeof path, "%s/adamw_%s.ptx", tmpdir, arch[a]);
        snprintf(log, sizeof log, "%s/adamw_%s.log", tmpdir, arch[a]);
        harness_write_text(strrchr(path, '/') + 1, ptx);
        free(ptx);
        snprintf(flag, sizeof flag, "-arch=%s", arch[a]);
        char *argv[] = {(char *)XTC_PTXAS, "-v", flag, path, "-o", "/dev/null", NULL};
        ck_assert_msg(cg_run_program(argv, log) == 0, "ptxas %s %s failed", flag, path);
        char *text = harness_read_file(log, NULL);
        ck_assert_ptr_nonnull(text);
        const char *what[] = {"bytes spill stores", "bytes spill loads"};
        for (int w = 0; w < 2; w++) {
            int kernels = 0;
            for (const char *p = strstr(text, what[w]); p; p = strstr(p + 1, what[w])) {
                const char *q = p;
                while (q > text && q[-1] == ' ')
                    q--;
                while (q > text && q[-1] >= '0' && q[-1] <= '9')
                    q--;
                ck_assert_msg(atoi(q) == 0, "a library kernel spills for %s:\n%s", arch[a], text);
                kernels++;
            }
            ck_assert_msg(kernels >= 2, "ptxas -v for %s reports %d kernels:\n%s", arch[a], kernels, text);
        }
        free(text);
    }
    free(src);
    ir_graph_free(g);
}
END_TEST

/* occurrences of what in [from, end) (end NULL: to the end) */
/* ptxas -v for sm_80 and sm_90 on ptx (written to tmpdir/stem.ptx; freed here): every kernel
 * without local memory (no stack frame, no spills), `kernels` of them; prints each kernel's
 * registers/shared bytes per arch under `what`; with entry, its registers per arch into regs */
static void ptxas_check_entry(char *ptx, const char *stem, int kernels, const char *what, const char *entry,
                              int regs_of[2])
{
    char ptx_path[512], log[512];
    snprintf(ptx_path, sizeof ptx_path, "%s/%s.ptx", tmpdir, stem);
    FILE *pf = fopen(ptx_path, "w");
    ck_assert(pf && fputs(ptx, pf) >= 0);
    fclose(pf);
    free(ptx);
    for (int a = 0; a < 2; a++) {
        const char *arch = a ? "-arch=sm_90" : "-arch=sm_80";
        snprintf(log, sizeof log, "%s/%s_%d.log", tmpdir, stem, a);
        char *argv[] = {(char *)XTC_PTXAS, "-v", (char *)arch, ptx_path, "-o", "/dev/null", NULL};
        int rc = cg_run_program(argv, log);
        char *text = harness_read_file(log, NULL);
        ck_assert_msg(rc == 0 && text, "ptxas %s %s: %s", arch, ptx_path, text ? text : "");
        int infos = 0;
        for (const char *p = strstr(text, "bytes spill stores"); p; p = strstr(p + 1, "bytes spill stores")) {
            const char *line = p;
            while (line > text && line[-1] != '\n')
                line--;
            ck_assert_msg(strncmp(line + strspn(line, " "), "0 bytes stack frame, 0 bytes spill stores, 0 bytes "
                                  "spill loads", 62) == 0, "ptxas %s: local memory: %.300s", arch, line);
            infos++;
        }
        ck_assert_int_eq(infos, kernels);
        char fig[512] = "";
        size_t fl = 0;
        for (const char *p = strstr(text, "Used "); p && fl < sizeof fig; p = strstr(p + 1, "Used ")) {
            int regs = 0, smem = 0;
            const char *sm = strstr(p, "bytes smem"), *eol = strchr(p, '\n');
            if (sm && eol && sm > eol) /* not this kernel's line: it has no shared memory */
                sm = NULL;
            while (sm && sm > p && sm[-1] == ' ')
                sm--;
            while (sm && sm > p && sm[-1] >= '0' && sm[-1] <= '9')
                sm--;
            sscanf(p, "Used %d registers", &regs);
            if (sm)
                sscanf(sm, "%d", &smem);
            fl += (size_t)snprintf(fig + fl, sizeof fig - fl, "%s%d/%d", fl ? ", " : "", regs, smem);
        }
        fprintf(stderr, "test_cuda_nvrtc: %s, %s: registers/shared bytes per kernel %s\n", what, arch + 6, fig);
        char mark[256]; /* "Compiling entry function 'entry'", then its "Used N registers" */
        snprintf(mark, sizeof mark, "function '%s'", entry ? entry : "");
        const char *e = entry ? strstr(text, mark) : NULL, *u = e ? strstr(e, "Used ") : NULL;
        ck_assert_msg(!entry || (u && sscanf(u, "Used %d registers", &regs_of[a]) == 1), "ptxas %s: no %s", arch, mark);
        free(text);
    }
}
#define ptxas_check(ptx, stem, kernels, what) ptxas_check_entry(ptx, stem, kernels, what, NULL, NULL)

static int count_in(const char *from, const char *end, const char *what)
{
    int c = 0;
    for (const char *p = strstr(from, what); p && (!end || p < end); p = strstr(p + 1, what))
        c++;
    return c;
}

/* The tensor-core attention forward (cg_cuda_attention_mma.c) as the GPU gets it: heads of 64
 * (causal, statistics), 128 (a bias and a mask), 40 by 24 (a window) and 128 by 128 (the widest
 * it takes, through head-split views), and the backward (cg_cuda_attention_mma_grad.c) of heads
 * of 64 (causal, with the logsumexp's gradient: unaligned rows; a bias and a mask) and, with
 * 16-bit storage (kernels/flash_bwd.cuh, cp.async, ldmatrix and .trans as the forward), 128
 * (causal), grouped key/values (8 query heads over 2 of 64; 4 over 1 of 128 with 16-bit storage:
 * the key blocks loop over the group's query heads), and a bounded (cosine-sim) forward of heads of 64, with --mma=bf16 and --mma=fp16, each with the f32 prelude and that of its 16-bit
 * storage. Its PTX (sm_80) holds, per kernel, the mma.sync of the type
 * asked for (D / 16 per score tile, E / 8 per value k-step) and none of the other; ptxas -v
 * assembles it for sm_80 and sm_90 with no spills and no stack frame (no local memory). The
 * registers and shared memory are printed. */
START_TEST(test_flash_instruction_mix)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    static const int split[4] = {0, 2, 1, 3};
    IrGraph *g = ir_graph_new("flash");
    IrDim b = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), n = ir_dim_sym(ir_graph_add_sym(g, "n", 16384)), h = ir_dim(4), one = ir_dim(1);
    IrDim s64[] = {b, h, n, ir_dim(64)}, s128[] = {b, h, n, ir_dim(128)}, s40[] = {b, h, n, ir_dim(40)};
    IrDim s24[] = {b, h, n, ir_dim(24)}, sbias[] = {h, n, n}, smask[] = {b, one, one, n}, sx[] = {b, n, h, ir_dim(128)};
    IrNode *q64 = ir_input(g, "q64", IR_F32, 4, s64), *q128 = ir_input(g, "q128", IR_F32, 4, s128);
    IrNode *q40 = ir_input(g, "q40", IR_F32, 4, s40), *v24 = ir_input(g, "v24", IR_F32, 4, s24);
    IrNode *bias = ir_input(g, "bias", IR_F32, 3, sbias), *mask = ir_input(g, "mask", IR_BOOL, 4, smask);
    IrNode *c = ir_const(g, 0.125, IR_F32);
    IrNode *causal64 = ir_attention(g, q64, q64, q64, NULL, NULL, c, 1, 1);
    IrNode *masked64 = ir_attention(g, q64, q64, q64, ir_input(g, "bias64", IR_F32, 3, sbias), mask, c, 0, 1);
    IrDim sd64[] = {b, h, n, ir_dim(65)}; /* with the logsumexp's gradient */
    ir_output(g, "causal64", causal64);
    ir_output(g, "causal64_grad", ir_attention_grad(g, causal64, ir_input(g, "d64", IR_F32, 4, sd64)));
    ir_output(g, "masked64_grad", ir_attention_grad(g, masked64, ir_input(g, "d64m", IR_F32, 4, s64)));
    ir_output(g, "masked128", ir_attention(g, q128, q128, q128, bias, mask, c, 0, 0));
    IrNode *causal128 = ir_attention(g, q128, q128, q128, NULL, NULL, c, 1, 1); /* 16-bit storage only: the widest backward */
    ir_output(g, "causal128_grad", ir_attention_grad(g, causal128, ir_input(g, "d128", IR_F32, 4, s128)));
    ir_output(g, "bounded64", ir_attention_bounded(g, q64, q64, q64, NULL, c, 1, 1, 0, 1)); /* cosine-sim */
    ir_output(g, "window40", ir_attention_window(g, q40, q40, v24, NULL, NULL, c, 1, 1, 256));
    IrNode *hx = ir_permute(g, ir_input(g, "x", IR_F32, 4, sx), split);
    ir_output(g, "heads128", ir_permute(g, ir_attention(g, hx, hx, hx, NULL, NULL, c, 1, 0), split));
    /* grouped key/values: 8 query heads over 2 of 64 (causal, the logsumexp's gradient), 4 over 1
     * of 128 (16-bit storage only) */
    IrDim sg8[] = {b, ir_dim(8), n, ir_dim(64)}, sg8d[] = {b, ir_dim(8), n, ir_dim(65)}, sg2[] = {b, ir_dim(2), n, ir_dim(64)};
    IrNode *gq = ir_input(g, "gq", IR_F32, 4, sg8), *gk = ir_input(g, "gk", IR_F32, 4, sg2);
    ir_output(g, "gqa64_grad", ir_attention_grad(g, ir_attention(g, gq, gk, gk, NULL, NULL, c, 1, 1),
                                                 ir_input(g, "gd", IR_F32, 4, sg8d)));
    IrDim sm1[] = {b, one, n, ir_dim(128)};
    IrNode *mk = ir_input(g, "mk", IR_F32, 4, sm1);
    ir_output(g, "mqa128_grad", ir_attention_grad(g, ir_attention(g, q128, mk, mk, NULL, NULL, c, 1, 1), q128));
    IrDim sx64[] = {b, n, h, ir_dim(64)}; /* GPT's inference attention */
    IrNode *hx64 = ir_permute(g, ir_input(g, "x64", IR_F32, 4, sx64), split);
    ir_output(g, "heads64", ir_permute(g, ir_attention(g, hx64, hx64, hx64, NULL, NULL, c, 1, 0), split));
    CgPlan plan;
    char err[4096];
    ck_assert_msg(ir_graph_error(g) == NULL && ir_verify(g, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
    for (int mma = CG_MMA_BF16; mma <= CG_MMA_FP16; mma++) {
        for (int si = 0; si < 2; si++) {
            const int storage = si ? (mma == CG_MMA_BF16 ? 1 : 2) : 0; /* f32, or the format's 16-bit storage */
            CgOptions opt = {.output = "-", .mma = mma, .dtype = si ? storage_name[storage] : NULL};
            CuUnit u;
            char *src = NULL;
            size_t len = 0;
            FILE *f = render_with_prelude(&plan, &opt, g, storage, &u, &src, &len);
            int flash = 0, stored = 0, grouped = 0;
            const char *stored_fn[15];
            for (int k = 0; k < u.nkernels; k++) {
                IrOp op = plan.kernels[k].node->op;
                if (op == IR_ATTENTION_GRAD && !si && plan.kernels[k].node->in[0]->shape[3].c > 64)
                    continue; /* f32 storage: heads over 64 on CUDA cores */
                if (op == IR_ATTENTION || op == IR_ATTENTION_GRAD) {
                    ck_assert_msg(strstr(u.kernel_text[k], op == IR_ATTENTION ? "FlashAttention-2 on tensor cores"
                                                                             : "FlashAttention-2 backward on tensor cores"),
                                  "%s", u.kernel_text[k]);
                    /* the forward and the backward of operands as stored (kernels/flash_fwd.cuh,
                     * flash_bwd.cuh): with 16-bit storage only */
                    int as_stored = strstr(u.kernel_text[k], "copied as stored (cp.async, ldmatrix)") != NULL;
                    ck_assert_int_eq(as_stored, si);
                    if (as_stored)
                        stored_fn[stored++] = plan.kernels[k].fn;
                    const IrNode *x = plan.kernels[k].node;
                    if (op == IR_ATTENTION_GRAD && x->in[1]->shape[1].c != x->in[0]->shape[1].c) {
                        char heads[64]; /* the key blocks loop over the group's query heads */
                        snprintf(heads, sizeof heads, "#define XTC_FB_HEADS %lld",
                                 (long long)(x->in[0]->shape[1].c / x->in[1]->shape[1].c));
                        ck_assert_msg(strstr(u.kernel_text[k], si ? heads : "the group's query heads"), "%s",
                                      u.kernel_text[k]);
                        grouped++;
                    }
                    fprintf(f, "\n%s", u.kernel_text[k]);
                    flash++;
                }
            }
            fclose(f);
            ck_assert_int_eq(stored, si ? 15 : 0);
            /* 10 forward (masked64 and the grouped two for the gradients), 5 backward (3 in f32), 2
             * of them grouped (1) */
            ck_assert_int_eq(flash, si ? 15 : 13);
            ck_assert_int_eq(grouped, si ? 2 : 1);
            char *ptx = NULL;
            ck_assert_msg(cg_nvrtc_compile(src, "flash.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
            free(src);
            /* per entry: its mma.sync of each type */
            const char *want = mma == CG_MMA_FP16 ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                                  : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
            const char *other = mma == CG_MMA_FP16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                                   : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
            int entries = 0;
            for (const char *e = strstr(ptx, ".entry "); e; e = strstr(e + 1, ".entry ")) {
                const char *end = strstr(e + 1, ".entry ");
                int have = 0, bad = 0;
                for (const char *p = strstr(e, want); p && (!end || p < end); p = strstr(p + 1, want))
                    have++;
                for (const char *p = strstr(e, other); p && (!end || p < end); p = strstr(p + 1, other))
                    bad++;
                /* unrolled: at least one k-step of Q K^T over the 8 score tiles and one of P V */
                ck_assert_msg(have >= 8 + 3 && !bad, "entry %d: %d %s, %d of the other type", entries, have, want, bad);
                entries++;
            }
            ck_assert_int_eq(entries, si ? 15 : 13);
            /* the forward of operands as stored: Q and K by ldmatrix, V by ldmatrix .trans, the
             * tiles by cp.async (16 bytes), waited for once a stage */
            for (int e = 0; e < stored; e++) {
                char entry[128];
                snprintf(entry, sizeof entry, ".entry %s(", stored_fn[e]);
                const char *from = strstr(ptx, entry), *end = from ? strstr(from + 1, ".entry ") : NULL;
                ck_assert_msg(from, "no %s", entry);
                int ldm = count_in(from, end, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
                    ldt = count_in(from, end, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"),
                    cpa = count_in(from, end, "cp.async.cg.shared.global"), wait = count_in(from, end, "cp.async.wait_group");
                ck_assert_msg(ldm >= 2 && ldt >= 1 && cpa >= 2 && wait >= 1,
                              "%s: %d ldmatrix, %d ldmatrix.trans, %d cp.async, %d cp.async.wait_group", stored_fn[e], ldm,
                              ldt, cpa, wait);
            }
            char stem[64], what[128];
            snprintf(stem, sizeof stem, "flash_%d_%d", mma, storage);
            snprintf(what, sizeof what, "flash --mma=%s, %s storage", cg_mma_name(mma), storage_name[storage]);
            ptxas_check(ptx, stem, si ? 15 : 13, what);
            cg_cuda_unit_free(&u);
        }
    }
    cg_plan_free(&plan);
    ir_graph_free(g);
}
END_TEST

/* The tensor-core matmul for 16-bit operands as stored (cg_cuda_matmul_mma.c), as the GPU gets
 * it: plain, transposed, batched with broadcasting, with fused epilogues (bias + GELU, residual,
 * a GLU split) over symbolic sizes, and known sizes with rows of a multiple of 8 values (K = 40)
 * and not (K = 36: no 16-bit copies possible, so none are emitted), A read transposed in place
 * (CG_VIEW_A_T, the plan's as cg_compile's for the cuda target), batched and summed over the
 * batch (CG_VIEW_SUM_B), with --dtype bf16 and fp16. Every kernel's PTX (sm_80) holds ldmatrix
 * and mma.sync of its type, those that can copy 16 bytes cp.async (ldmatrix .trans where B is
 * [K, N], and for A^T); ptxas -v assembles them for sm_80 and
 * sm_90 with no spills and no stack frame. Registers and shared memory are printed. */
static void build_mma16(IrGraph *g)
{
    IrDim b = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), n = ir_dim_sym(ir_graph_add_sym(g, "n", 16384));
    IrDim sx[] = {b, n, ir_dim(64)}, sw[] = {ir_dim(64), ir_dim(192)}, sbias[] = {ir_dim(192)};
    IrDim swt[] = {ir_dim(64), ir_dim(64)}, sy[] = {b, n, ir_dim(64)}, sg[] = {ir_dim(256), ir_dim(64)};
    IrNode *x = ir_input(g, "x", IR_F32, 3, sx);
    ir_output(g, "gelu", ir_unary(g, IR_GELU, ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "w", 2, sw), 0),
                                                          ir_param(g, "bias", 1, sbias))));
    IrNode *y = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "wt", 2, swt), 1), ir_input(g, "res", IR_F32, 3, sy));
    ir_output(g, "residual", y);
    IrNode *p = ir_matmul(g, x, ir_param(g, "wg", 2, sg), 1);
    ir_output(g, "glu", ir_binary(g, IR_MUL, ir_slice(g, p, -1, ir_dim(0), ir_dim(128)),
                                  ir_unary(g, IR_GELU, ir_slice(g, p, -1, ir_dim(128), ir_dim(128)))));
    IrDim sq[] = {b, ir_dim(4), n, ir_dim(32)}, sk[] = {ir_dim(1), ir_dim(4), ir_dim(32), n};
    ir_output(g, "bcast", ir_matmul(g, ir_input(g, "q", IR_F32, 4, sq), ir_input(g, "k", IR_F32, 4, sk), 0));
    IrDim s40[] = {ir_dim(100), ir_dim(40)}, s40b[] = {ir_dim(40), ir_dim(72)};
    ir_output(g, "known", ir_matmul(g, ir_input(g, "u", IR_F32, 2, s40), ir_input(g, "v", IR_F32, 2, s40b), 0));
    IrDim s36[] = {ir_dim(100), ir_dim(36)}, s36b[] = {ir_dim(36), ir_dim(72)};
    ir_output(g, "odd", ir_matmul(g, ir_input(g, "u2", IR_F32, 2, s36), ir_input(g, "v2", IR_F32, 2, s36b), 0));
    static const int swap[] = {0, 2, 1}; /* the sum's product: 16 x 11 large tiles (a 20000-word vocabulary's) */
    IrDim sgo[] = {b, n, ir_dim(192)}, swide[] = {b, n, ir_dim(2048)}, sgw[] = {b, n, ir_dim(1408)};
    ir_output(g, "at", ir_matmul(g, ir_permute(g, x, swap), ir_input(g, "go", IR_F32, 3, sgo), 0));
    IrNode *wide = ir_permute(g, ir_input(g, "wide", IR_F32, 3, swide), swap);
    ir_output(g, "at_sum", ir_reduce(g, IR_SUM, ir_matmul(g, wide, ir_input(g, "gw", IR_F32, 3, sgw), 0), 0));
}

START_TEST(test_matmul_instruction_mix)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    IrGraph *built = ir_graph_new("mma16");
    build_mma16(built);
    char err[4096];
    ck_assert_msg(ir_graph_error(built) == NULL && ir_verify(built, err, sizeof err) == 0, "%s", err);
    PassOptions po = {0};
    IrGraph *g = harness_passes(built, "cuda", &po, err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    CgPlan plan;
    CgPlanOpts po_views = {.matmul_views = (cg_cuda_backend.caps & CG_CAP_MATMUL_VIEWS) != 0};
    ck_assert_msg(cg_plan_build_opts(g, &plan, &po_views, err, sizeof err) == 0, "%s", err);
    for (int mma = CG_MMA_BF16; mma <= CG_MMA_FP16; mma++) {
        CgOptions opt = {.output = "-", .mma = mma, .dtype = mma == CG_MMA_BF16 ? "bf16" : "fp16"};
        CuUnit u;
        char *src = NULL;
        size_t len = 0;
        FILE *f = render_with_prelude(&plan, &opt, g, mma == CG_MMA_BF16 ? 1 : 2, &u, &src, &len);
        int kernels = 0, copying = 0, trans = 0;
        for (int k = 0; k < u.nkernels; k++)
            if (strstr(u.kernel_text[k], "cp.async pipeline")) {
                fprintf(f, "\n%s", u.kernel_text[k]);
                kernels++;
                copying += strstr(u.kernel_text[k], "xtc_cp_async16(") != NULL;
                trans += strstr(u.kernel_text[k], "xtc_ldmatrix_x4_trans(") != NULL;
            }
        fclose(f);
        ck_assert_int_eq(kernels, 8);
        ck_assert_int_eq(copying, 7); /* all but K = 36 */
        ck_assert_int_eq(trans, 6);   /* B as [K, N]: gelu, bcast, known, odd, at, at_sum */
        ck_assert_int_eq(count_in(src, NULL, "a read transposed in place"), 2);
        ck_assert_int_eq(count_in(src, NULL, "summed over the batch"), 1);
        char *ptx = NULL;
        ck_assert_msg(cg_nvrtc_compile(src, "mma16.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
        free(src);
        const char *want = mma == CG_MMA_FP16 ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                              : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
        int entries = 0, with_cp = 0, with_trans = 0;
        for (const char *e = strstr(ptx, ".entry "); e; e = strstr(e + 1, ".entry ")) {
            const char *end = strstr(e + 1, ".entry ");
            int mmas = count_in(e, end, want), lds = count_in(e, end, "ldmatrix.sync.aligned.m8n8.x4.");
            /* unrolled over a stage's two k-steps: at least the small tiles' 2 x 4 mma and 2 x 3
             * ldmatrix (known sizes with few tiles leave out the large tiles' branch) */
            ck_assert_msg(mmas >= 16 && lds >= 6, "entry %d: %d %s, %d ldmatrix", entries, mmas, want, lds);
            with_cp += count_in(e, end, "cp.async.cg.shared.global") > 0 && count_in(e, end, "cp.async.wait_group") > 0;
            with_trans += count_in(e, end, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") > 0;
            entries++;
        }
        ck_assert_int_eq(entries, kernels);
        ck_assert_int_eq(with_cp, copying);
        ck_assert_int_eq(with_trans, trans);
        char stem[64], what[128];
        snprintf(stem, sizeof stem, "mma16_%d", mma);
        snprintf(what, sizeof what, "matmul --dtype %s", opt.dtype);
        ptxas_check(ptx, stem, kernels, what);
        cg_cuda_unit_free(&u);
    }
    cg_plan_free(&plan);
    ir_graph_free(g);
    ir_graph_free(built);
}
END_TEST

/* NVRTC's log reaches the message */
START_TEST(test_nvrtc_errors)
{
    if (!toolkit_present())
        return;
    char err[4096], *ptx = NULL;
    ck_assert_int_eq(cg_nvrtc_compile("extern \"C\" __global__ void k(float *x) { x[0] = undeclared; }", "bad.cu",
                                      "sm_80", &ptx, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "undeclared") && strstr(err, "bad.cu") && strstr(err, "for compute_80 "), "%s", err);
    /* a failing program with many warnings first: the message still names the error */
    size_t cap = 64 * 1024, len = 0;
    char *src = malloc(cap);
    ck_assert(src);
    for (int i = 0; i < 200; i++) /* NVRTC logs each function's warnings before a later one's error */
        len += (size_t)snprintf(src + len, cap - len, "extern \"C\" __global__ void k%d() { int unused_%d = %d; }\n",
                                i, i, i);
    snprintf(src + len, cap - len, "extern \"C\" __global__ void k(float *x) { x[0] = undeclared_at_the_end; }\n");
    ck_assert_int_eq(cg_nvrtc_compile(src, "noisy.cu", "sm_80", &ptx, err, sizeof err), -1);
    free(src);
    ck_assert_msg(strstr(err, "undeclared_at_the_end") && strstr(err, "error"), "%s", err);
    ck_assert_int_eq(cg_nvrtc_compile("", "x.cu", "sm_12", &ptx, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "sm_12"), "%s", err);
    ck_assert_int_eq(cg_cuda_arch_number("banana", err, sizeof err), -1);
    ck_assert_int_eq(cg_cuda_arch_number("sm_90a", err, sizeof err), 90);
}
END_TEST

/* The CUDA-core attention backward with grouped key/values (cg_cuda_attention.c: a dk/dv block
 * loops over its group's query heads, those of heads G..H-1 zeroed), as the GPU gets it: 8 query
 * heads over 2 of 64 (the 32-row tile: causal, the logsumexp's gradient), over 1 of 128 (the
 * 16-row tile: a bias and a mask) and 4 over 2 of 160 (the row kernel), f32 storage: NVRTC
 * compiles them, ptxas -v assembles them for sm_80 and sm_90 with no spills. */
START_TEST(test_grouped_grad_kernels)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    IrGraph *g = ir_graph_new("grouped_grad");
    IrDim b = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), n = ir_dim_sym(ir_graph_add_sym(g, "n", 16384));
    IrDim h = ir_dim(8), one = ir_dim(1);
    static const int heads[3] = {64, 128, 160}, kv[3] = {2, 1, 2}, qh[3] = {8, 8, 4};
    for (int i = 0; i < 3; i++) {
        IrDim sq[] = {b, ir_dim(qh[i]), n, ir_dim(heads[i])}, sk[] = {b, ir_dim(kv[i]), n, ir_dim(heads[i])};
        IrDim sd[] = {b, ir_dim(qh[i]), n, ir_dim(heads[i] + (i == 0))}, sbias[] = {h, n, n}, smask[] = {b, one, one, n};
        char name[32];
        snprintf(name, sizeof name, "q%d", i);
        IrNode *q = ir_input(g, name, IR_F32, 4, sq);
        snprintf(name, sizeof name, "k%d", i);
        IrNode *k = ir_input(g, name, IR_F32, 4, sk);
        snprintf(name, sizeof name, "v%d", i);
        IrNode *v = ir_input(g, name, IR_F32, 4, sk);
        IrNode *o = i == 1 ? ir_attention(g, q, k, v, ir_input(g, "bias", IR_F32, 3, sbias),
                                          ir_input(g, "mask", IR_BOOL, 4, smask), ir_const(g, 0.1, IR_F32), 0, 1)
                           : ir_attention(g, q, k, v, NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1);
        snprintf(name, sizeof name, "d%d", i);
        IrNode *d = ir_input(g, name, IR_F32, 4, sd);
        snprintf(name, sizeof name, "grad%d", i);
        ir_output(g, name, ir_attention_grad(g, o, d));
    }
    CgPlan plan;
    char err[4096];
    ck_assert_msg(ir_graph_error(g) == NULL && ir_verify(g, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cg_plan_build(g, &plan, err, sizeof err) == 0, "%s", err);
    CgOptions opt = {.output = "-", .mma = CG_MMA_OFF};
    CuUnit u;
    char *src = NULL;
    size_t len = 0;
    FILE *f = render_with_prelude(&plan, &opt, g, 0, &u, &src, &len);
    int grads = 0;
    for (int k = 0; k < u.nkernels; k++)
        if (plan.kernels[k].node->op == IR_ATTENTION_GRAD) {
            ck_assert_msg(strstr(u.kernel_text[k], "the group's query heads"), "%s", u.kernel_text[k]);
            fprintf(f, "\n%s", u.kernel_text[k]);
            grads++;
        }
    fclose(f);
    ck_assert_int_eq(grads, 3);
    char *ptx = NULL;
    ck_assert_msg(cg_nvrtc_compile(src, "grouped_grad.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
    free(src);
    ptxas_check(ptx, "grouped_grad", 3, "grouped attention_grad (64, 128 wide: tiled; 160: rows)");
    cg_cuda_unit_free(&u);
    cg_plan_free(&plan);
    ir_graph_free(g);
}
END_TEST

/* The copy kernels of GPT's training step at its sizes, bf16 storage, as the GPU gets them
 * (cg_cuda_ops.c, emit_copy): the heads split and merge and a broadcast of rows move 16-byte
 * vectors (v4 loads and stores in the PTX), the transposes of the last two axes go through a
 * shared tile, a last-axis slice of rows of 65 takes the element loop; NVRTC compiles them and
 * ptxas -v assembles them for sm_80 and sm_90 with no local memory. */
START_TEST(test_copy_kernels)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    IrGraph *g = ir_graph_new("copies");
    IrDim b = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), n = ir_dim_sym(ir_graph_add_sym(g, "n", 16384));
    static const int heads[4] = {0, 2, 1, 3}, t3[3] = {0, 2, 1};
    IrDim sx[] = {b, n, ir_dim(8), ir_dim(64)}, sh[] = {b, ir_dim(8), n, ir_dim(64)}, s65[] = {b, ir_dim(8), n, ir_dim(65)};
    IrDim sd[] = {b, n, ir_dim(512)}, sr[] = {b, ir_dim(1), ir_dim(512)};
    ir_output(g, "split", ir_permute(g, ir_input(g, "x", IR_F32, 4, sx), heads));
    ir_output(g, "merge", ir_permute(g, ir_input(g, "h", IR_F32, 4, sh), heads));
    ir_output(g, "rows", ir_expand(g, ir_input(g, "r", IR_F32, 3, sr), 3, sd));
    ir_output(g, "transpose", ir_permute(g, ir_input(g, "d", IR_F32, 3, sd), t3));
    ir_output(g, "window", ir_slice(g, ir_input(g, "w", IR_F32, 4, s65), 3, ir_dim(0), ir_dim(64)));
    CgPlan plan;
    char err[4096];
    ck_assert_msg(ir_graph_error(g) == NULL && ir_verify(g, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cg_plan_build(g, &plan, err, sizeof err) == 0, "%s", err);
    CgOptions opt = {.output = "-", .mma = CG_MMA_OFF, .dtype = "bf16"};
    CuUnit u;
    char *src = NULL;
    size_t len = 0;
    FILE *f = render_with_prelude(&plan, &opt, g, 1, &u, &src, &len);
    int copies = 0, vectors = 0, tiled = 0;
    for (int k = 0; k < u.nkernels; k++) {
        IrOp op = plan.kernels[k].node->op;
        if (op != IR_PERMUTE && op != IR_SLICE && op != IR_EXPAND)
            continue;
        fprintf(f, "\n%s", u.kernel_text[k]);
        copies++;
        vectors += strstr(u.kernel_text[k], "xtc_cp16(") != NULL;
        tiled += strstr(u.kernel_text[k], "tile[32][33]") != NULL;
    }
    fclose(f);
    ck_assert_int_eq(copies, 5);
    ck_assert_int_eq(vectors, 3); /* split, merge, rows */
    ck_assert_int_eq(tiled, 1);
    char *ptx = NULL;
    ck_assert_msg(cg_nvrtc_compile(src, "copies.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
    free(src);
    int v4 = 0;
    for (const char *e = strstr(ptx, ".entry "); e; e = strstr(e + 1, ".entry ")) {
        const char *end = strstr(e + 1, ".entry ");
        v4 += count_in(e, end, "ld.global.nc.v4.u32") > 0 && count_in(e, end, "st.global.v4.u32") > 0;
    }
    ck_assert_int_eq(v4, vectors);
    ptxas_check(ptx, "copies", copies, "copies (split, merge, rows: 16-byte vectors; transpose: tiled)");
    cg_cuda_unit_free(&u);
    cg_plan_free(&plan);
    ir_graph_free(g);
}
END_TEST

#include "gpt_tc_check.h"
#include "fused_rows_check.h"

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_nvrtc");
    TCase *tc = tcase_create("nvrtc");
    tcase_set_timeout(tc, 1200);
    tcase_add_unchecked_fixture(tc, render_all, free_all);
    tcase_add_test(tc, test_nvrtc_errors);
    tcase_add_loop_test(tc, test_every_kernel_compiles, 0, 3); /* f32, bf16, fp16 storage */
    tcase_add_test(tc, test_compile_modules);
    suite_add_tcase(s, tc);
    TCase *lib = tcase_create("library kernels");
    tcase_set_timeout(lib, 600);
    tcase_add_test(lib, test_library_kernels);
    suite_add_tcase(s, lib);
    TCase *fl = tcase_create("flash");
    tcase_set_timeout(fl, 600);
    tcase_add_test(fl, test_flash_instruction_mix);
    tcase_add_test(fl, test_matmul_instruction_mix);
    tcase_add_test(fl, test_gpt_tensor_core_kernels);
    suite_add_tcase(s, fl);
    TCase *gg = tcase_create("grouped grad"); /* CK_RUN_CASE="grouped grad" runs it alone */
    tcase_set_timeout(gg, 300);
    tcase_add_test(gg, test_grouped_grad_kernels);
    suite_add_tcase(s, gg);
    TCase *cp = tcase_create("copies"); /* CK_RUN_CASE=copies runs it alone */
    tcase_set_timeout(cp, 300);
    tcase_add_test(cp, test_copy_kernels);
    suite_add_tcase(s, cp);
    TCase *fr = tcase_create("fused rows"); /* CK_RUN_CASE="fused rows" runs it alone */
    tcase_set_timeout(fr, 300);
    tcase_add_test(fr, test_fused_row_kernels);
    suite_add_tcase(s, fr);
    return s;
}

int main(void)
{
    return harness_run(suite(), "nvrtc");
}
