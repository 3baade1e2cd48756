/* cg_cuda.c: the CUDA backends.
 *
 *   "cuda"      render: CgPlan -> CUDA C, one kernel per plan signature (cg_cuda_ops.c's table);
 *               compile: NVRTC -> PTX for --cuda-arch (default sm_80; no GPU needed), then the
 *               host code (cg_cuda_host.c) with the PTX, CUDA C and metadata embedded, linked by
 *               cc into model.so. The runtime runs it through libcuda.so.1.
 *   "cuda-emu"  the same CUDA C compiled by cc as C with the emulator (xtc_cuda_emu.h) into the
 *               module, no NVRTC: the runtime runs it through its emulated Driver API. This is
 *               how every CUDA kernel is checked on machines without a GPU.
 *
 * The compile step writes its files into a temporary directory (kept when XTC_KEEP_TMP is set,
 * for debugging) and needs cc; --emit-cuda (CgOptions.emit_cuda) writes the CUDA C out. */
#include "cg_cuda.h"
#include "cg_cuda_attention.h"
#include "rt_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- render ---- */

/* How the emulator calls the kernel from cuLaunchKernel-style args. */
static char *emu_call_text(const CuGen *gen, const CgKernel *K, int scratch)
{
    const IrNode *x = K->node;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    int a = 0;
    fprintf(f, "%s(*(%s **)a[%d]", K->fn, cu_out_type(K), a++);
    for (int i = 0; i < x->nin; i++)
        fprintf(f, ", *(const %s **)a[%d]", cu_mem_type(x->in[i]), a++);
    if (scratch)
        fprintf(f, ", *(float **)a[%d]", a++);
    for (int s = 0; s < gen->g->nsyms; s++)
        fprintf(f, ", *(i64 *)a[%d]", a++);
    fprintf(f, ", *(int **)a[%d])", a);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The kernels of codegen/cuda/kernels/adamw.cuh, in the order the module lists them. */
const CuLibKernel cu_lib_kernels[] = {
    {"xtc_adamw_norm",
     "xtc_adamw_norm(*(const void *const **)a[0], *(const u8 **)a[1], *(const i64 **)a[2], *(int *)a[3], "
     "*(i64 *)a[4], *(double **)a[5])",
     1},
    {"xtc_adamw_update",
     "xtc_adamw_update(*(void *const **)a[0], *(const void *const **)a[1], *(const u8 **)a[2], *(const u8 **)a[3], "
     "*(const i64 **)a[4], *(int *)a[5], *(i64 *)a[6], *(float **)a[7], *(float **)a[8], *(float **)a[9], "
     "*(float *)a[10], *(float *)a[11], *(float *)a[12], *(float *)a[13], *(float *)a[14], *(float *)a[15], "
     "*(float *)a[16], *(float *)a[17], *(float *)a[18])",
     0},
    {"xtc_fb_pre", /* kernels/flash_pre.cuh */
     "xtc_fb_pre(*(const xtc_fs **)a[0], *(const float **)a[1], *(float **)a[2], *(i64 *)a[3], *(int *)a[4], "
     "*(int *)a[5])",
     1},
};

/* Whether g is a training graph: it has grad.<param> outputs, which the optimizer steps from. */
static int trains(const IrGraph *g)
{
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i].name && !strncmp(g->outputs[i].name, "grad.", 5))
            return 1;
    return 0;
}

void cg_cuda_unit_free(CuUnit *u)
{
    for (int k = 0; k < u->nkernels; k++) {
        if (u->kernel_text)
            free(u->kernel_text[k]);
        if (u->emu_call)
            free(u->emu_call[k]);
    }
    free(u->kernel_text);
    free(u->emu_call);
    free(u->geom);
    free(u->sync);
    free(u->source);
    memset(u, 0, sizeof *u);
}

/* The architecture, storage and resolved matmul precision opt compiles with; 0 or -1 with a message. */
static int resolve(const CgOptions *opt, int emu, const char **arch, int *storage, int *mma, char *err, size_t n)
{
    *arch = opt && opt->cuda_arch && opt->cuda_arch[0] ? opt->cuda_arch : CU_DEFAULT_ARCH;
    int num = cg_cuda_arch_number(*arch, err, n);
    if (num < 0 || (*storage = cg_dtype_parse(opt ? opt->dtype : NULL, err, n)) < 0)
        return -1;
    return (*mma = cg_mma_resolve(opt ? opt->mma : CG_MMA_AUTO, *storage, num, emu, err, n)) < 0 ? -1 : 0;
}

/* CgBackend.scratch: attention_grad steps whose kernel is kernels/flash_bwd.cuh's get each query
 * row's dlse_i - D_i, [q's batch dims.., I] (cu_flash_bwd16_fits, CuGeom.pre) */
static int scratch_of(const CgPlan *plan, int step, const CgOptions *opt, int emu, IrDim *shape, char *err, size_t n)
{
    const IrNode *x = plan->steps[step].node;
    if (x->op != IR_ATTENTION_GRAD)
        return 0;
    const char *arch;
    int storage, mma;
    if (resolve(opt, emu, &arch, &storage, &mma, err, n) < 0)
        return -1;
    if (!cu_flash_bwd16_fits(storage, mma, x))
        return 0;
    const IrNode *q = x->in[0];
    memcpy(shape, q->shape, (size_t)(q->rank - 1) * sizeof *shape);
    return q->rank - 1;
}

static int cuda_scratch(const CgPlan *plan, int step, const CgOptions *opt, IrDim *shape, char *err, size_t n)
{
    return scratch_of(plan, step, opt, 0, shape, err, n);
}

static int emu_scratch(const CgPlan *plan, int step, const CgOptions *opt, IrDim *shape, char *err, size_t n)
{
    return scratch_of(plan, step, opt, 1, shape, err, n);
}

int cg_cuda_render_unit(const CgPlan *plan, const CgOptions *opt, int emu, CuUnit *u, char *err, size_t n)
{
    memset(u, 0, sizeof *u);
    cu_gen_init(&u->gen, plan);
    u->plan = plan;
    u->emu = emu;
    const char *arch;
    if (resolve(opt, emu, &arch, &u->gen.storage, &u->gen.mma, err, n) < 0)
        return -1;
    snprintf(u->arch, sizeof u->arch, "%s", arch);
    int nk = plan->nkernels;
    u->kernel_text = calloc((size_t)nk + 1, sizeof *u->kernel_text);
    u->emu_call = calloc((size_t)nk + 1, sizeof *u->emu_call);
    u->geom = calloc((size_t)nk + 1, sizeof *u->geom);
    u->sync = calloc((size_t)nk + 1, sizeof *u->sync);
    if (!u->kernel_text || !u->emu_call || !u->geom || !u->sync) {
        cg_cuda_unit_free(u);
        snprintf(err, n, "out of memory");
        return -1;
    }
    u->nkernels = nk;
    for (int k = 0; k < nk; k++) {
        const CgKernel *K = &plan->kernels[k];
        const CuLower *L = cg_cuda_lowering(K->node->op);
        if (!L || !L->emit) {
            snprintf(err, n, "the cuda backend has no lowering for op '%s' (node %%%s)", ir_ops[K->node->op].name,
                     K->node->label ? K->node->label : "?");
            cg_cuda_unit_free(u);
            return -1;
        }
        size_t len = 0;
        CuKernel ck = {.gen = &u->gen, .k = K, .node = K->node};
        ck.f = open_memstream(&u->kernel_text[k], &len);
        if (!ck.f) {
            snprintf(err, n, "out of memory");
            cg_cuda_unit_free(u);
            return -1;
        }
        int rc = L->emit(&ck);
        if (fclose(ck.f) != 0 || rc < 0 || !(u->emu_call[k] = emu_call_text(&u->gen, K, ck.geom.pre[0] != 0))) {
            snprintf(err, n, "%s", u->gen.err[0] ? u->gen.err : "out of memory");
            cg_cuda_unit_free(u);
            return -1;
        }
        u->geom[k] = ck.geom;
        u->sync[k] = ck.sync;
    }
    int pre = 0; /* a kernel takes a scratch buffer that xtc_fb_pre fills */
    for (int k = 0; k < nk; k++)
        pre |= u->geom[k].pre[0] != 0;
    size_t len = 0;
    FILE *f = open_memstream(&u->source, &len);
    if (!f) {
        snprintf(err, n, "out of memory");
        cg_cuda_unit_free(u);
        return -1;
    }
    cu_prelude(f, plan->g, nk, u->gen.storage);
    for (int k = 0; k < nk; k++)
        fprintf(f, "\n%s", u->kernel_text[k]);
    if (trains(plan->g)) { /* the device's AdamW step over the grad.<param> outputs */
        fprintf(f, "\n%s", cg_embed_adamw_cuh);
        u->lib[u->nlib++] = CU_LIB_ADAMW_NORM;
        u->lib[u->nlib++] = CU_LIB_ADAMW_UPDATE;
    }
    if (pre) { /* the flash backward's preprocessing (CuGeom.pre) */
        fprintf(f, "\n%s", cg_embed_flash_pre_cuh);
        u->lib[u->nlib++] = CU_LIB_FB_PRE;
    }
    if (fclose(f) != 0) {
        snprintf(err, n, "out of memory");
        cg_cuda_unit_free(u);
        return -1;
    }
    return 0;
}

static int cuda_supports(IrOp op) { return cg_cuda_lowering(op) != NULL; }

static int render(const CgPlan *plan, const CgOptions *opt, void **unit, int emu, char *err, size_t n)
{
    CuUnit *u = calloc(1, sizeof *u);
    *unit = u;
    if (!u) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    return cg_cuda_render_unit(plan, opt, emu, u, err, n);
}

static int cuda_render(const CgPlan *plan, const CgOptions *opt, void **unit, char *err, size_t n)
{
    return render(plan, opt, unit, 0, err, n);
}

static int emu_render(const CgPlan *plan, const CgOptions *opt, void **unit, char *err, size_t n)
{
    return render(plan, opt, unit, 1, err, n);
}

static void cuda_release(void *unit)
{
    if (!unit)
        return;
    cg_cuda_unit_free(unit);
    free(unit);
}

/* ---- compile ---- */

static int write_file(const char *dir, const char *name, const char *text, char *err, size_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0) {
        snprintf(err, n, "cannot write %s: %s", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    if (fclose(f) != 0) {
        snprintf(err, n, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static void read_log(const char *path, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t len = fread(buf, 1, n - 1, f);
    buf[len] = 0;
    fclose(f);
}

static void remove_dir(const char *dir)
{
    static const char *const files[] = {"rt_abi.h", "rt_cuda_abi.h", "xtc_cuda_emu.h", "kernels.cu", "emu_main.c",
                                        "host.c",   "cc.log"};
    char path[4200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* cc's options for a module, before the directory of its headers, the output and the sources.
 * -O1: the emulated kernels are the tests' workload, and at their sizes -O2 costs more compile
 * time than it saves (test_cuda: cc 161 -> 97 s, the whole suite 338 -> 272 s; -O0 compiles in
 * 35 s but runs slower, 360 s). Integer overflow wraps as on the GPU; warnings are the
 * generator's business, checked by NVRTC's stricter compile. */
static const char *const cc_flags[] = {"-std=gnu11", "-O1", "-fPIC", "-shared", "-fwrapv", "-fno-strict-aliasing",
                                       "-w"};
#define NCC_FLAGS ((int)(sizeof cc_flags / sizeof cc_flags[0]))
#define CC_OPT_FLAG 1 /* cc_flags[CC_OPT_FLAG] is the optimisation level */

/* The optimisation level of an emulated module's cc: $XTC_EMU_OPT (0 to 3) replaces -O1 where a
 * module runs little and compiles much (test_cuda_parity: -O0); unset or empty, -O1. The flags
 * chosen are part of the module cache's key. */
static const char *emu_opt_flag(char *err, size_t n)
{
    static const char *const levels[] = {"-O0", "-O1", "-O2", "-O3"};
    const char *v = getenv("XTC_EMU_OPT");
    if (!v || !v[0])
        return cc_flags[CC_OPT_FLAG];
    if (v[0] >= '0' && v[0] <= '3' && !v[1])
        return levels[v[0] - '0'];
    snprintf(err, n, "XTC_EMU_OPT must be 0, 1, 2 or 3 (the emulated module's cc -O level), not '%.40s'", v);
    return NULL;
}

/* Whether the plan's scratch buffers are those its kernels take (CgBackend.scratch, as
 * cg_compile asks for them); 0, or -1 with a message. A unit rendered from a plan without them
 * has kernel texts, but no schedule. */
static int scratch_check(const CuUnit *u, char *err, size_t n)
{
    for (int s = 0; s < u->plan->nsteps; s++) {
        const CgStep *st = &u->plan->steps[s];
        if ((st->scratch >= 0) != (u->geom[st->kernel].pre[0] != 0)) {
            snprintf(err, n, "internal: step %d (node %%%s) %s a scratch buffer its kernel %s", s,
                     st->node->label ? st->node->label : "?", st->scratch >= 0 ? "has" : "lacks",
                     st->scratch >= 0 ? "does not take" : "takes");
            return -1;
        }
    }
    return 0;
}

static int compile(void *unit, const CgOptions *opt, CgStats *stats, char *err, size_t n)
{
    CuUnit *u = unit;
    double t0 = now_s();
    const char *flags[NCC_FLAGS];
    memcpy(flags, cc_flags, sizeof flags);
    if (u->emu && !(flags[CC_OPT_FLAG] = emu_opt_flag(err, n)))
        return -1;
    char *ptx = NULL, *meta = NULL, *host = NULL, *emu_main = NULL;
    int rc = -1;
    char dirbuf[4096] = "", nvrtc_version[32] = "", compiler[64];
    if (scratch_check(u, err, n) < 0 || (opt->emit_cuda && write_file(NULL, opt->emit_cuda, u->source, err, n) < 0))
        return -1;
    if (!u->emu) {
        if (cg_nvrtc_compile(u->source, "model.cu", u->arch, &ptx, err, n) < 0)
            return -1;
        cg_nvrtc_available(nvrtc_version, sizeof nvrtc_version, NULL, 0);
        snprintf(compiler, sizeof compiler, "xtc-cuda-nvrtc-%s", nvrtc_version);
    } else {
        snprintf(compiler, sizeof compiler, "xtc-cuda-emu");
    }
    double t1 = now_s();
    char nk[16];
    snprintf(nk, sizeof nk, "%d", u->nkernels);
    const char *options[] = {
        "compiler", compiler,
        "target", u->emu ? "cuda-emu" : "cuda",
        "arch", u->arch,
        "dtype", u->gen.storage == 1 ? "bf16" : u->gen.storage == 2 ? "fp16" : "f32",
        "cuda_kernels", nk,
        "mma", cg_mma_name(u->gen.mma),
        "source", opt->source_name,
    };
    meta = cg_plan_meta(u->plan, options, (int)(sizeof options / sizeof options[0] / 2));
    host = meta ? cg_cuda_host_source(u, meta, ptx, opt->source) : NULL;
    emu_main = u->emu ? cg_cuda_emu_main(u) : NULL;
    if (!meta || !host || (u->emu && !emu_main)) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    /* the module cache's key (cg_cache.c): every file cc reads, its options, the cc */
    CgHash key;
    int cache = cg_cache_enabled();
    if (cache) {
        cg_hash_init(&key, u->emu ? "xtc cuda-emu module 1" : "xtc cuda module 1");
        const char *parts[] = {cg_embed_rt_abi_h, cg_embed_rt_cuda_abi_h, host, u->emu ? cg_embed_emu_h : NULL,
                               u->emu ? u->source : NULL, u->emu ? emu_main : NULL};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            cg_hash_str(&key, parts[i]);
        for (int i = 0; i < NCC_FLAGS; i++)
            cg_hash_str(&key, flags[i]);
        cg_hash_program(&key, "cc");
        if (cg_cache_fetch(&key, opt->output)) {
            if (stats)
                stats->cached = 1;
            rc = 0;
            goto done;
        }
    }
    const char *tmpdir = getenv("TMPDIR");
    snprintf(dirbuf, sizeof dirbuf, "%s/xtc-cuda-XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
    if (!mkdtemp(dirbuf)) {
        snprintf(err, n, "cannot create a temporary directory in %s: %s", tmpdir && tmpdir[0] ? tmpdir : "/tmp",
                 strerror(errno));
        dirbuf[0] = 0;
        goto done;
    }
    if (write_file(dirbuf, "rt_abi.h", cg_embed_rt_abi_h, err, n) < 0 ||
        write_file(dirbuf, "rt_cuda_abi.h", cg_embed_rt_cuda_abi_h, err, n) < 0 ||
        write_file(dirbuf, "host.c", host, err, n) < 0)
        goto done;
    if (u->emu && (write_file(dirbuf, "xtc_cuda_emu.h", cg_embed_emu_h, err, n) < 0 ||
                   write_file(dirbuf, "kernels.cu", u->source, err, n) < 0 ||
                   write_file(dirbuf, "emu_main.c", emu_main, err, n) < 0))
        goto done;
    char hostc[4200], emuc[4200], log[4200];
    snprintf(hostc, sizeof hostc, "%s/host.c", dirbuf);
    snprintf(emuc, sizeof emuc, "%s/emu_main.c", dirbuf);
    snprintf(log, sizeof log, "%s/cc.log", dirbuf);
    RtWFile out; /* the output is replaced atomically, through symlinks, keeping its mode */
    if (rt_wfile_open_named(&out, opt->output, err, n) != 0)
        goto done;
    char *tmpso = out.tmp;
    char *argv[NCC_FLAGS + 9] = {"cc"};
    int argc = 1;
    for (int i = 0; i < NCC_FLAGS; i++)
        argv[argc++] = (char *)flags[i];
    char *files[] = {"-I", dirbuf, "-o", tmpso, hostc, u->emu ? emuc : NULL, u->emu ? "-lm" : NULL, NULL};
    memcpy(argv + argc, files, sizeof files);
    if (cg_run_program(argv, log) < 0) {
        char text[1500];
        read_log(log, text, sizeof text);
        snprintf(err, n, "compiling the %s module with cc failed%s: %s", u->emu ? "cuda-emu" : "cuda",
                 getenv("XTC_KEEP_TMP") ? "" : " (set XTC_KEEP_TMP=1 to keep the sources)",
                 text[0] ? text : "cannot run cc");
        rt_wfile_abort(&out);
        goto done;
    }
    if (cache)
        cg_cache_store(&key, tmpso); /* the bytes compiled here, not what -o holds later */
    if (rt_wfile_commit(&out, err, n) != 0)
        goto done;
    rc = 0;
done:
    if (dirbuf[0]) {
        if (getenv("XTC_KEEP_TMP"))
            fprintf(stderr, "xtc: CUDA sources kept in %s\n", dirbuf);
        else
            remove_dir(dirbuf);
    }
    double t2 = now_s();
    if (stats) {
        stats->optimize_s = t1 - t0; /* NVRTC */
        stats->link_s = t2 - t1;     /* cc */
        struct stat sb;
        stats->module_bytes = rc == 0 && stat(opt->output, &sb) == 0 ? (int64_t)sb.st_size : 0;
    }
    free(ptx);
    free(meta);
    free(host);
    free(emu_main);
    return rc;
}

const CgBackend cg_cuda_backend = {
    .name = "cuda",
    .description = "CUDA: kernels compiled by NVRTC to PTX, run through libcuda.so.1 on an NVIDIA GPU",
    .caps = CG_CAP_SYMBOLIC | CG_CAP_HALF | CG_CAP_CUDA | CG_CAP_MMA | CG_CAP_HEAD_VIEWS |
            CG_CAP_MATMUL_VIEWS,
    .supports = cuda_supports,
    .render = cuda_render,
    .compile = compile,
    .release = cuda_release,
    .attention_max_head = CG_CUDA_ATTENTION_MAX_HEAD,
    .attention_grad_max_head = CG_CUDA_ATTENTION_MAX_HEAD,
    .attention_kv_groups = 1, /* every forward kernel: cu_att_operand_rows */
    .attention_grad_kv_groups = 1, /* every backward kernel sums each group: cu_att_grad_heads_begin */
    .scratch = cuda_scratch,
};

const CgBackend cg_cuda_emu_backend = {
    .name = "cuda-emu",
    .description = "CUDA emulated on the CPU: the same CUDA C compiled by cc with the emulator (testing)",
    .caps = CG_CAP_SYMBOLIC | CG_CAP_HOST_RUN | CG_CAP_HALF | CG_CAP_CUDA | CG_CAP_MMA | CG_CAP_HEAD_VIEWS |
            CG_CAP_MATMUL_VIEWS,
    .supports = cuda_supports,
    .render = emu_render,
    .compile = compile,
    .release = cuda_release,
    .attention_max_head = CG_CUDA_ATTENTION_MAX_HEAD,
    .attention_grad_max_head = CG_CUDA_ATTENTION_MAX_HEAD,
    .attention_kv_groups = 1, /* every forward kernel: cu_att_operand_rows */
    .attention_grad_kv_groups = 1, /* every backward kernel sums each group: cu_att_grad_heads_begin */
    .scratch = emu_scratch,
};
