/* cmd_compile.c: `xtc compile` (model.xtf -> model.so), `xtc info` (what a module holds),
 * `xtc init` (fresh seeded weights for a module) and `xtc run` on a compiled module. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "codegen.h"
#include "init.h"
#include "rt_fileio.h"
#include "passes.h"
#include "safetensors.h"
#include "xtc.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int opt_cuda_arch(const char *v, void *ptr, char *err, size_t n)
{
    if (cg_cuda_arch_number(v, err, n) < 0)
        return -1;
    *(const char **)ptr = v;
    return 0;
}

int cli_compile(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *model = NULL;
    const char *disabled[CLI_MAX_DISABLE];
    char err[1024];
    XtLowerOpts lo = {0};
    PassOptions po = {0};
    po.disable = disabled;
    CgOptions co = {0};
    co.opt_level = 2;
    int verbose = 0;
    const CliOpt opts[] = {
        {"-o", CLI_STR, &out, "PATH", .help = "the module to write"},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the file (default: the last one)"},
        {"--target", CLI_STR, &co.target, "T", .help = "the backend: cpu (native code through LLVM, the default), cuda (CUDA C\n"
         "compiled by NVRTC, run on an NVIDIA GPU), cuda-emu (the same CUDA C emulated\non the CPU)"},
        {"--dtype", CLI_FN, &co.dtype, "D", .help = "how floating-point tensors are stored: f32 (default), bf16 or fp16\n"
         "(cuda, cuda-emu: every tensor, computed and accumulated in f32; cpu: bf16 only,\n"
         "for the weights of the matmuls, which then take bf16 operands: vdpbf16ps)", .fn = cli_opt_dtype},
        {"--cuda-arch", CLI_FN, &co.cuda_arch, "ARCH", .help = "cuda: the GPU architecture of the PTX (sm_80 default, sm_90, ...)",
         .fn = opt_cuda_arch},
        {"--emit-cuda", CLI_STR, &co.emit_cuda, "PATH", .help = "cuda, cuda-emu: also write the generated CUDA C"},
        {"-O0", CLI_LEVEL, &co.opt_level, ".. -O3", .help = "optimisation level (default -O2)", .set = 0},
        {"-O1", CLI_LEVEL, &co.opt_level, NULL, NULL, .set = 1},
        {"-O2", CLI_LEVEL, &co.opt_level, NULL, NULL, .set = 2},
        {"-O3", CLI_LEVEL, &co.opt_level, NULL, NULL, .set = 3},
        {"--cpu", CLI_ANY_STR, &co.cpu, "NAME", .help = "an LLVM CPU name (default: this machine's; --cpu=help lists them)"},
        {"--train", CLI_FLAG, &lo.train, NULL, .help = "compute loss and grad.<param> (targets input; autodiff; dropout_seed\n"
         "input where the model drops out)"},
        {"--mask", CLI_FN, &lo, NULL, .help = "add the padding-mask inputs (mask, src_mask, tgt_mask, context_mask)",
         .fn = cli_opt_mask},
        {"--kv-cache", CLI_FLAG, &lo.kv_cache, NULL, .help = "the incremental-decoding form (cache.<l>.k/.v in and out)"},
        {"--no-fuse", CLI_FLAG, &po.no_fuse, NULL, .help = "skip every fusion pass"},
        {"--disable-pass", CLI_FN, &po, "NAME", .help = "skip one pass (repeatable; xtc ir --list-passes)",
         .fn = cli_opt_disable_pass},
        {"--emit-llvm", CLI_STR, &co.emit_llvm, "PATH", .help = "also write the optimised LLVM IR as text"},
        {"--mma", CLI_FN, &co.mma, "M", .help = "matmul operands in bf16, fp16 or off, sums in f32. cuda, cuda-emu: on tensor\n"
         "cores (needs sm_80). Default: that of --dtype bf16/fp16\n(off below sm_80), off with f32; "
         "--mma of the other 16-bit format than\n--dtype is refused. cpu: bf16 or off (default): vdpbf16ps where\n"
         "--cpu has AVX512_BF16 (the module then needs it), else the\nsame rounding in software", .fn = cli_opt_mma},
        {"--weights-dtype", CLI_STR, &co.weights_dtype, "D", .help = "cpu: f32 (default), or int8: the matmul weights (attention's\n"
         "projections, the feed-forward's, the logits head) stored as int8 with f32\nscales, for inference "
         "(xtc quantize writes such weights; the f32 file\nloads too, quantized as it loads)"},
        {"--group", CLI_INT, &co.quant_group, "G", .help = "with --weights-dtype int8: a scale per G weights along each row\n"
         "(32 to 128 are usual; default: one per output row)", .lo = 1, .hi = 1 << 20},
        {"--kv-dtype", CLI_STR, &co.kv_dtype, "D", .help = "cpu, with --kv-cache: f32, bf16 or int8, how the KV caches are\n"
         "stored (int8: each row of a head with its scale, max|x|/127; default:\nbf16 with --dtype bf16, else f32); "
         "the API's caches stay f32"},
        {"-v", CLI_FLAG, &verbose, NULL, .help = "print the compile statistics"},
    };
    const CliCmd cmd = {
        .name = "compile", .usage = "model.xtf -o model.so [options]",
        .about = "Compiles a model to a shared library that the runtime (include/xtc.h) loads.\n"
                 "A file named *.ir is a graph in the IR's text form (xtc ir prints it), compiled\n"
                 "as it is: the passes and code generation (--train: its outputs' gradients).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "input file",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (co.cpu && !strcmp(co.cpu, "help")) {
        int n;
        const char *const *names = cg_cpu_names(&n);
        printf("CPUs for --cpu (LLVM's x86-64 names; default: this machine's, also --cpu=native):\n");
        for (int k = 0; k < n; k++)
            printf("  %s\n", names[k]);
        return 0;
    }
    lo.dropout = lo.train; /* the model's dropout, seeded by the dropout_seed input */
    DrvTarget target; /* the options that name the target, checked before anything is read */
    if (drv_target(&target, &co, err, sizeof err) != 0) {
        fprintf(stderr, "xtc compile: %s\n", err);
        return 2;
    }
    if (!path || !out)
        return cli_usage_error(&cmd, !path ? "no model file given" : "no output given (-o model.so)");
    if (co.kv_dtype && !lo.kv_cache) {
        fprintf(stderr, "xtc compile: --kv-dtype applies with --kv-cache (the incremental-decoding form)\n");
        return 2;
    }
    if (cli_output_is_input("compile", "-o", out, "the source", path))
        return 2;
    double t0 = now();
    size_t len = strlen(path);
    IrGraph *g = NULL;
    XtfFile *f = NULL;
    if (len > 3 && !strcmp(path + len - 3, ".ir")) { /* a graph as text: it enters at autodiff */
        char *text = NULL;
        if (rt_file_read_all(path, (size_t)1 << 28, "an IR graph", &text, &len, err, sizeof err) == 0)
            g = ir_parse(text, path, err, sizeof err);
        free(text);
        if (!g) {
            fprintf(stderr, "xtc compile: %s\n", err);
            return 1;
        }
    } else if (!(f = cli_load_xtf(path))) {
        return 1;
    }
    co.output = out;
    /* --train: the gradient of the built-in loss, or without one of the outputs the caller seeds
     * with grad.<output>; fp16 storage adds the loss scale the session manages */
    DrvJob job = {.file = f, .graph = g, .model = model, .lower = lo, .grads = lo.train, .passes = &po, .cg = co};
    IrGraph *opt = NULL;
    CgStats st = {0};
    int rc = cli_drive("xtc compile", &job, &target, &opt, &st);
    xtf_free(f);
    ir_graph_free(g); /* the passes made opt a new graph */
    if (rc != 0)
        return 1;
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
    const char *path = NULL;
    int source = 0;
    const CliOpt opts[] = {
        {"--source", CLI_FLAG, &source, NULL, .help = "print the embedded .xtf source instead"},
    };
    const CliCmd cmd = {
        .name = "info", .usage = "model.so [--source]",
        .about = "Describes a compiled module: symbols, inputs, outputs, parameters (and their count),\n"
                 "compile options, kernels and schedule.\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "module",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path)
        return cli_usage_error(&cmd, "no module given");
    XtcModule *m = NULL;
    if (xtc_module_load(path, &m) != XTC_OK) {
        fprintf(stderr, "xtc: %s\n", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        return 1;
    }
    if (source)
        fputs(xtc_module_source(m), stdout);
    else
        xtc_module_describe(m, stdout);
    xtc_module_free(m);
    return 0;
}

/* xtc init model.so -o w.safetensors [--seed N]: x-transformers' initialisation by name */
/* "<w>.scale" of an int8 weight <w> (include/xtc.h, "int8 weights") */
static int int8_scales(const XtcModule *m, const char *name)
{
    size_t len = strlen(name);
    if (len < 7 || strcmp(name + len - 6, ".scale"))
        return 0;
    char w[1024];
    snprintf(w, sizeof w, "%.*s", (int)(len - 6), name);
    int i = xtc_module_find(m, XTC_STATE, w);
    XtcTensorInfo info;
    return i >= 0 && xtc_module_tensor(m, XTC_STATE, i, &info) == XTC_OK && info.dtype == XTC_I8;
}

int cli_init(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    uint64_t seed = 0;
    const CliOpt opts[] = {
        {"-o", CLI_STR, &out, "PATH", .help = "the weights file to write (.safetensors)"},
        {"--seed", CLI_U64, &seed, "N", .help = "the seed (default 0)"},
    };
    const CliCmd cmd = {
        .name = "init", .usage = "model.so -o weights.safetensors [--seed N]",
        .about = "Writes fresh weights for every parameter and buffer of a compiled module, following\n"
                 "x-transformers' initialisation rules, reproducibly from the seed. A module with int8\n"
                 "weights (--weights-dtype int8) gets them in f32 (no scales), which it quantizes as it\n"
                 "loads them (xtc quantize writes the int8 file).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "module",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path || !out)
        return cli_usage_error(&cmd, !path ? "no module given" : "no output given (-o weights.safetensors)");
    if (cli_output_is_input("init", "-o", out, "the module", path))
        return 2;
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
            if (int8_scales(m, t.name))
                continue; /* an int8 module's weights are written in f32, which it quantizes as it loads */
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
    const char *path = NULL, *wpath = NULL, *ipath = NULL, *opath = NULL;
    XtcRunOptions ro = {.threads = 1};
    int grads = 0, check_finite = 0;
    const CliOpt opts[] = { /* the options of cli_run's table that apply to a compiled module */
        {"--weights", CLI_STR, &wpath, "W", .help = "the weights (.safetensors)"},
        {"--input", CLI_STR, &ipath, "I", .help = "the inputs (.safetensors)"},
        {"--output", CLI_STR, &opath, "O", .help = "the outputs to write (.safetensors)"},
        {"--threads", CLI_THREADS, &ro.threads, "T", .help = "worker threads (default 1)"},
        {"--grads", CLI_FLAG, &grads, .help = "also write loss and grad.<name> (a --train module)"},
        {"--check-finite", CLI_FLAG, &check_finite, .help = "refuse NaN or infinity in and out"},
        {"--weights-dtype", CLI_NOT_HERE, .help = "does not apply to a compiled module (its weights' types are its own)"},
        {"--group", CLI_NOT_HERE, .help = "does not apply to a compiled module (its weights' types are its own)"},
        {"--model", CLI_NOT_HERE, .help = "does not apply to a compiled module (it picks a model of a .xtf file; "
         "xtc compile --model did)"},
    };
    const CliCmd cmd = {
        .name = "run", .usage = "model.so --weights W --input I --output O [--threads T] [--grads] [--check-finite]",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "model",
        .quiet = 1, /* cli_run parsed (and warned) first */
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path || !wpath || !ipath || !opath)
        return cli_usage_error(&cmd, !path ? "no model given" : !wpath ? "no --weights given" :
                                     !ipath ? "no --input given" : "no --output given");
    if (cli_output_is_input("run", "--output", opath, "--input", ipath) ||
        cli_output_is_input("run", "--output", opath, "--weights", wpath) ||
        cli_output_is_input("run", "--output", opath, "the module", path))
        return 2;
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
    RtWFile out; /* replaced atomically, through symlinks, keeping its mode (rt_fileio.c) */
    if (!bad && rt_wfile_open_named(&out, opath, err, sizeof err) != 0) {
        fprintf(stderr, "xtc: %s\n", err);
        bad = 1;
    } else if (!bad) {
        if (xtc_run_files(path, wpath, ipath, out.tmp, &ro, err, sizeof err) != XTC_OK) {
            fprintf(stderr, "xtc: %s\n", err);
            bad = 1;
        }
        bad = bad || cli_check_finite_module_file(m, out.tmp, "output") != 0;
        if (bad)
            rt_wfile_abort(&out);
        else if (rt_wfile_commit(&out, err, sizeof err) != 0) {
            fprintf(stderr, "xtc: %s\n", err);
            bad = 1;
        }
    }
    xtc_module_free(m);
    return bad ? 1 : 0;
}
