/* cmd_compile.c: `xtc compile` (model.xtf -> model.so), `xtc info` (what a module holds),
 * `xtc init` (fresh seeded weights for a module) and `xtc run` on a compiled module. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "codegen.h"
#include "init.h"
#include "passes.h"
#include "safetensors.h"
#include "xtc.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + len, 1, cap - len - 1, fp)) > 0;) {
        len += k;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(fp);
    if (buf)
        buf[len] = 0;
    return buf;
}

static void compile_usage(void)
{
    printf("usage: xtc compile model.xtf -o model.so [options]\n\n"
           "Compiles a model to a shared library that the runtime (include/xtc.h) loads.\n"
           "  -o PATH              the module to write\n"
           "  --model NAME         which model of the file (default: the last one)\n"
           "  --target cpu         the backend: cpu (native code through LLVM), cuda (CUDA C compiled by\n"
           "                       NVRTC, run on an NVIDIA GPU), cuda-emu (the same CUDA C emulated on the CPU)\n"
           "  --dtype f32          cuda, cuda-emu: how floating-point tensors are stored on the device:\n"
           "                       f32, bf16 or fp16 (16-bit storage, computed and accumulated in f32)\n"
           "  --cuda-arch=sm_80    cuda: the GPU architecture of the PTX (sm_80 default, sm_90, ...)\n"
           "  --emit-cuda=PATH     cuda, cuda-emu: also write the generated CUDA C\n"
           "  -O0 .. -O3           optimisation level (default -O2)\n"
           "  --cpu=NAME           an LLVM CPU name (default: this machine's; --cpu=help lists them)\n"
           "  --train              compute loss and grad.<param> (targets input; autodiff; dropout_seed\n"
           "                       input where the model drops out)\n"
           "  --mask               add the padding-mask inputs (mask, src_mask, tgt_mask, context_mask)\n"
           "  --kv-cache           the incremental-decoding form (cache.<l>.k/.v in and out)\n"
           "  --no-fuse            skip every fusion pass\n"
           "  --disable-pass=NAME  skip one pass (repeatable; xtc ir --list-passes)\n"
           "  --emit-llvm=PATH     also write the optimised LLVM IR as text\n"
           "  --mma=bf16|fp16|off  cuda, cuda-emu: matmuls on tensor cores, operands in bf16 or fp16, sums in\n"
           "                       f32 (needs sm_80). Default: that of --dtype bf16/fp16 (off below sm_80),\n"
           "                       off with f32; --mma of the other 16-bit format than --dtype is refused\n"
           "  -v                   print the compile statistics\n");
}

int cli_compile(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *model = NULL, *v;
    const char *disabled[64];
    char err[1024];
    XtLowerOpts lo = {0};
    PassOptions po = {0};
    po.disable = disabled;
    CgOptions co = {0};
    co.opt_level = 2;
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            compile_usage();
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "-o"))) {
            out = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--model"))) {
            model = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--target"))) {
            co.target = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cpu"))) {
            co.cpu = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--emit-llvm"))) {
            co.emit_llvm = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--emit-cuda"))) {
            co.emit_cuda = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cuda-arch"))) {
            if (cg_cuda_arch_number(v, err, sizeof err) < 0) {
                fprintf(stderr, "xtc compile: --cuda-arch: %s\n", err);
                return 2;
            }
            co.cuda_arch = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dtype"))) {
            if (cg_dtype_parse(v, err, sizeof err) < 0) {
                fprintf(stderr, "xtc compile: --dtype: %s\n", err);
                return 2;
            }
            co.dtype = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--mma"))) {
            if ((co.mma = cg_mma_parse(v)) < 0) {
                fprintf(stderr, "xtc compile: --mma=%s: expected bf16, fp16 or off\n", v);
                return 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1] == 'O' && argv[i][2] >= '0' && argv[i][2] <= '3' && !argv[i][3]) {
            co.opt_level = argv[i][2] - '0';
        } else if (!strcmp(argv[i], "--train")) {
            lo.train = lo.dropout = 1; /* the model's dropout, seeded by the dropout_seed input */
        } else if (!strcmp(argv[i], "--mask")) {
            lo.mask = lo.src_mask = lo.tgt_mask = lo.context_mask = 1;
        } else if (!strcmp(argv[i], "--kv-cache")) {
            lo.kv_cache = 1;
        } else if (!strcmp(argv[i], "--no-fuse")) {
            po.no_fuse = 1;
        } else if ((v = cli_flag_value(argc, argv, &i, "--disable-pass"))) {
            if (pass_check_name(v, err, sizeof err) || po.ndisable == 64) {
                fprintf(stderr, "xtc compile: %s\n", po.ndisable == 64 ? "too many --disable-pass" : err);
                return 2;
            }
            disabled[po.ndisable++] = v;
        } else if (!strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "xtc compile: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "xtc compile: more than one input file\n");
            return 2;
        }
    }
    if (co.cpu && !strcmp(co.cpu, "help")) {
        int n;
        const char *const *names = cg_cpu_names(&n);
        printf("CPUs for --cpu (LLVM's x86-64 names; default: this machine's, also --cpu=native):\n");
        for (int k = 0; k < n; k++)
            printf("  %s\n", names[k]);
        return 0;
    }
    if (cg_cpu_check(co.cpu, co.features, err, sizeof err) != 0) {
        fprintf(stderr, "xtc compile: --cpu: %s\n", err);
        return 2;
    }
    if (!path || !out) {
        compile_usage();
        return 2;
    }
    const CgBackend *be = cg_backend_find(co.target ? co.target : "cpu");
    if (!be) {
        fprintf(stderr, "xtc compile: unknown target '%s'\n", co.target);
        return 2;
    }
    if (co.dtype && cg_dtype_parse(co.dtype, err, sizeof err) > 0 && !(be->caps & CG_CAP_HALF)) {
        fprintf(stderr, "xtc compile: --dtype %s: the %s backend computes and stores in f32 only (use --target cuda "
                "or cuda-emu)\n", co.dtype, be->name);
        return 2;
    }
    if ((co.cuda_arch || co.emit_cuda) && !(be->caps & CG_CAP_CUDA)) {
        fprintf(stderr, "xtc compile: --cuda-arch and --emit-cuda apply to --target cuda and cuda-emu, not %s\n",
                be->name);
        return 2;
    }
    po.supports = be->supports;
    double t0 = now();
    XtfFile *f = cli_load_xtf(path);
    if (!f)
        return 1;
    IrGraph *g = cli_lower(f, model, &lo);
    xtf_free(f);
    if (!g)
        return 1;
    if (lo.train) {
        IrGradOpts go = {.loss = "loss"};
        int has_loss = 0;
        for (int i = 0; i < g->noutputs; i++)
            has_loss |= !strcmp(g->outputs[i].name, "loss");
        if (!has_loss) /* no built-in loss: the caller supplies grad.<output> */
            go = (IrGradOpts){.loss = NULL, .seed_outputs = 1};
        go.loss_scale = cg_loss_scale_input(co.dtype); /* fp16: the session scales the loss */
        if (ir_autodiff(g, &go, err, sizeof err) != 0) {
            fprintf(stderr, "xtc compile: %s\n", err);
            ir_graph_free(g);
            return 1;
        }
    }
    IrGraph *opt = pass_run_pipeline(g, &po, err, sizeof err);
    ir_graph_free(g);
    if (!opt) {
        fprintf(stderr, "xtc compile: %s\n", err);
        return 1;
    }
    char *src = read_text(path);
    co.output = out;
    co.source = src;
    co.source_name = path;
    CgStats st = {0};
    int rc = cg_compile(opt, &co, &st, err, sizeof err);
    free(src);
    if (rc != 0) {
        fprintf(stderr, "xtc compile: %s\n", err);
        ir_graph_free(opt);
        return 1;
    }
    char parts[64] = "";
    if (st.parts > 1)
        snprintf(parts, sizeof parts, ", %d parts compiled in parallel", st.parts);
    if (verbose)
        printf("%s: %d nodes, %d steps, %d kernels, %d buffers, %lld bytes; %.2f s (plan %.2f, render %.2f, "
               "optimise %.2f, emit %.2f, link %.2f)%s%s\n", out, opt->nnodes, st.nsteps, st.nkernels, st.nbuffers,
               (long long)st.module_bytes, now() - t0, st.plan_s, st.render_s, st.optimize_s, st.emit_s, st.link_s,
               parts, st.cached ? ", from the module cache (XTC_MODULE_CACHE)" : "");
    ir_graph_free(opt);
    return 0;
}

int cli_info(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: xtc info model.so [--source]\n\n"
               "Describes a compiled module: symbols, inputs, outputs, parameters (and their count),\n"
               "compile options, kernels and schedule. --source prints the embedded .xtf source.\n");
        return argc < 2 ? 2 : 0;
    }
    XtcModule *m = NULL;
    if (xtc_module_load(argv[1], &m) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return 1;
    }
    if (argc > 2 && !strcmp(argv[2], "--source"))
        fputs(xtc_module_source(m), stdout);
    else
        xtc_module_describe(m, stdout);
    xtc_module_free(m);
    return 0;
}

/* xtc init model.so -o w.safetensors [--seed N]: x-transformers' initialisation by name */
int cli_init(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *v;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: xtc init model.so -o weights.safetensors [--seed N]\n\n"
                   "Writes fresh weights for every parameter and buffer of a compiled module, following\n"
                   "x-transformers' initialisation rules, reproducibly from the seed (default 0).\n");
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "-o"))) {
            out = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            char *end;
            seed = strtoull(v, &end, 10);
            if (!*v || *end) {
                fprintf(stderr, "xtc init: --seed needs a non-negative integer, got '%s'\n", v);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "xtc init: unknown option '%s'\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path || !out) {
        fprintf(stderr, "usage: xtc init model.so -o weights.safetensors [--seed N]\n");
        return 2;
    }
    XtcModule *m = NULL;
    if (xtc_module_load(path, &m) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return 1;
    }
    RtRng rng;
    rt_rng_seed(&rng, seed);
    RtStWriter *w = rt_st_writer_new();
    int rc = w ? 0 : 1;
    char err[512] = "out of memory";
    for (int kind = XTC_PARAM; rc == 0 && kind <= XTC_STATE; kind++)
        for (int i = 0; rc == 0 && i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo t;
            xtc_module_tensor(m, (XtcKind)kind, i, &t);
            int64_t n = 1;
            for (int d = 0; d < t.rank; d++)
                n *= t.shape[d];
            float *data = malloc((size_t)(n ? n : 1) * sizeof *data);
            if (!data) {
                rc = 1;
                break;
            }
            int how = rt_init_module_param(m, t.name, t.rank, t.shape, data, &rng);
            if (how)
                fprintf(stderr, "xtc init: '%s': %s\n", t.name, rt_init_note(how));
            if (rt_st_writer_add(w, t.name, RT_F32, t.rank, t.shape, data) != 0)
                rc = 1;
            /* tied names hold the same values as their parameter (the file loads as a state_dict) */
            const char *tied;
            for (int k = 0; rc == 0 && (tied = rt_init_tied_name(m, t.name, k)); k++)
                if (rt_st_writer_add(w, tied, RT_F32, t.rank, t.shape, data) != 0)
                    rc = 1;
            free(data);
        }
    if (rc == 0 && rt_st_writer_save(w, out, err, sizeof err) != 0)
        rc = 1;
    if (rc)
        fprintf(stderr, "xtc init: %s\n", err);
    rt_st_writer_free(w);
    xtc_module_free(m);
    return rc;
}

/* xtc run model.so --weights W --input I --output O [--threads T] [--grads] [--check-finite] */
int cli_run_module(int argc, char **argv)
{
    const char *path = NULL, *wpath = NULL, *ipath = NULL, *opath = NULL, *v;
    XtcRunOptions ro = {.threads = 1};
    int grads = 0, check_finite = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--grads"))
            grads = 1;
        else if (!strcmp(argv[i], "--check-finite"))
            check_finite = 1;
        else if ((v = cli_flag_value(argc, argv, &i, "--weights")))
            wpath = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--input")))
            ipath = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--output")))
            opath = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--threads")))
            ro.threads = atoi(v);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "xtc run: option '%s' does not apply to a compiled module\n", argv[i]);
            return 2;
        } else
            path = argv[i];
    }
    if (!path || !wpath || !ipath || !opath || ro.threads < 1) {
        fprintf(stderr, "usage: xtc run model.so --weights W --input I --output O [--threads T] [--grads] "
                        "[--check-finite]\n");
        return 2;
    }
    char err[1024];
    if (grads) { /* a training module computes them; an inference module cannot */
        XtcModule *m = NULL;
        int ok = xtc_module_load(path, &m) == XTC_OK;
        int has = 0;
        for (int i = 0; ok && i < xtc_module_count(m, XTC_OUTPUT); i++) {
            XtcTensorInfo t;
            xtc_module_tensor(m, XTC_OUTPUT, i, &t);
            has |= !strncmp(t.name, "grad.", 5);
        }
        if (!ok || !has)
            fprintf(stderr, "xtc: %s\n", !ok ? xtc_module_error(m) : "--grads: this module computes no "
                                                                     "gradients (compile it with --train)");
        xtc_module_free(m);
        if (!ok || !has)
            return 1;
    }
    if (!check_finite) {
        if (xtc_run_files(path, wpath, ipath, opath, &ro, err, sizeof err) != XTC_OK) {
            fprintf(stderr, "xtc: %s\n", err);
            return 1;
        }
        return 0;
    }
    /* --check-finite: the weights and the inputs the module reads before the run; its outputs
     * (and gradients) in a temporary file beside the output, renamed over it only when finite */
    XtcModule *m = NULL;
    if (xtc_module_load(path, &m) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return 1;
    }
    int bad = cli_check_finite_module_file(m, wpath, "weight") != 0 ||
              cli_check_finite_module_file(m, ipath, "input") != 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", opath, (long)getpid());
    if (!bad && xtc_run_files(path, wpath, ipath, tmp, &ro, err, sizeof err) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", err);
        bad = 1;
    } else if (!bad) {
        bad = cli_check_finite_module_file(m, tmp, "output") != 0;
        if (!bad && rename(tmp, opath) != 0) {
            fprintf(stderr, "xtc: %s: %s\n", opath, strerror(errno));
            bad = 1;
        }
        if (bad)
            unlink(tmp);
    }
    xtc_module_free(m);
    return bad ? 1 : 0;
}
