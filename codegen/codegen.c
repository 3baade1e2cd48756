/* codegen.c: the driver of code generation: verify, plan, render with the chosen backend,
 * compile, and report. The pipeline is this one function; backends supply the stages. */
#include "cg_plan.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

static const CgBackend *const backends[] = {&cg_llvm_backend, &cg_cuda_backend, &cg_cuda_emu_backend};

const CgBackend *cg_backend_find(const char *name)
{
    if (!name || !*name)
        name = "cpu";
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cg_compile(const IrGraph *g, const CgOptions *opt, CgStats *stats, char *err, size_t n)
{
    CgStats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!g || !opt || !opt->output || !opt->output[0]) {
        snprintf(err, n, "cg_compile: no graph or no output path");
        return -1;
    }
    if (opt->opt_level < 0 || opt->opt_level > 3) {
        snprintf(err, n, "optimisation level %d is not 0..3", opt->opt_level);
        return -1;
    }
    const CgBackend *be = cg_backend_find(opt->target);
    if (!be) {
        snprintf(err, n, "unknown target '%s' (this build has: cpu, cuda, cuda-emu)", opt->target);
        return -1;
    }
    int storage = cg_dtype_parse(opt->dtype, err, n);
    if (storage < 0)
        return -1;
    if (!cg_storage_supported(be->caps, be->name, storage, err, n))
        return -1;
    if (opt->mma != CG_MMA_AUTO && opt->mma != CG_MMA_OFF && (!cg_mma_name(opt->mma) || !(be->caps & CG_CAP_MMA))) {
        if (!cg_mma_name(opt->mma))
            snprintf(err, n, "unknown matmul precision %d (CgOptions.mma)", opt->mma);
        else
            snprintf(err, n, "the %s backend has no tensor-core matmul (--mma=%s); the cuda targets have", be->name,
                     cg_mma_name(opt->mma));
        return -1;
    }
    double t0 = now_s();
    CgPlan plan;
    int kv = cg_kv_storage(be->caps, be->name, storage, opt->kv_dtype, err, n);
    if (kv < 0)
        return -1;
    CgPlanOpts popt = {.head_views = (be->caps & CG_CAP_HEAD_VIEWS) != 0,
                       .matmul_views = (be->caps & CG_CAP_MATMUL_VIEWS) != 0, .storage = storage ? storage : kv,
                       .kv_storage = kv,
                       .scope = be->caps & CG_CAP_HALF ? CG_STORE_ALL
                                : (storage ? CG_STORE_MATMUL_WEIGHTS : 0) | (kv ? CG_STORE_KV_CACHES : 0)};
    if (cg_plan_build_opts(g, &plan, &popt, err, n) < 0)
        return -1;
    for (int s = 0; be->scratch && s < plan.nsteps; s++) { /* the steps' scratch buffers, now that storage is known */
        IrDim shape[IR_MAXRANK];
        int rank = be->scratch(&plan, s, opt, shape, err, n);
        if (rank > 0 && cg_plan_add_scratch(&plan, s, rank, shape) < 0)
            snprintf(err, n, "out of memory"), rank = -1;
        if (rank < 0) {
            cg_plan_free(&plan);
            return -1;
        }
    }
    for (int k = 0; k < plan.nkernels; k++) {
        const IrNode *node = plan.kernels[k].node;
        if (!be->supports(node->op)) {
            snprintf(err, n, "the %s backend has no lowering for op '%s' (node %%%s)", be->name,
                     ir_ops[node->op].name, node->label ? node->label : "?");
            cg_plan_free(&plan);
            return -1;
        }
    }
    stats->nsteps = plan.nsteps;
    stats->nkernels = plan.nkernels;
    stats->nbuffers = plan.nbufs;
    double t1 = now_s();
    void *unit = NULL;
    int rc = be->render(&plan, opt, &unit, err, n);
    double t2 = now_s();
    if (rc == 0)
        rc = be->compile(unit, opt, stats, err, n);
    be->release(unit);
    cg_plan_free(&plan);
    stats->plan_s = t1 - t0;
    stats->render_s = t2 - t1;
    stats->total_s = now_s() - t0;
    return rc;
}

int cg_storage_supported(unsigned caps, const char *backend, int storage, char *err, size_t n)
{
    if (storage <= 0 || (caps & CG_CAP_HALF) || (storage == 1 && (caps & CG_CAP_HALF_WEIGHTS)))
        return 1;
    if (caps & CG_CAP_HALF_WEIGHTS)
        snprintf(err, n, "--dtype fp16: the %s backend stores in f32 or bf16 (fp16 is for --target cuda or cuda-emu)",
                 backend);
    else
        snprintf(err, n, "--dtype %s: the %s backend computes and stores in f32 only (use --target cuda or cuda-emu)",
                 storage == 1 ? "bf16" : "fp16", backend);
    return 0;
}

int cg_kv_storage(unsigned caps, const char *backend, int storage, const char *kv_dtype, char *err, size_t n)
{
    if (kv_dtype && strcmp(kv_dtype, "f32") && strcmp(kv_dtype, "bf16") && strcmp(kv_dtype, "int8")) {
        snprintf(err, n, "--kv-dtype: expected f32, bf16 or int8, got '%s'", kv_dtype);
        return -1;
    }
    if (!(caps & CG_CAP_HALF_WEIGHTS)) {
        if (!kv_dtype)
            return 0;
        snprintf(err, n, "--kv-dtype applies to the cpu target (the %s backend stores its KV caches as --dtype)", backend);
        return -1;
    }
    if (kv_dtype)
        return !strcmp(kv_dtype, "bf16") ? 1 : !strcmp(kv_dtype, "int8") ? CG_STORE_INT8_ROWS : 0;
    return storage == 1;
}

int cg_dtype_parse(const char *dtype, char *err, size_t n)
{
    static const char *const names[] = {"f32", "bf16", "fp16"};
    if (!dtype || !dtype[0])
        return 0;
    for (int i = 0; i < 3; i++)
        if (strcmp(dtype, names[i]) == 0)
            return i;
    snprintf(err, n, "unknown dtype '%s' (expected f32, bf16 or fp16)", dtype);
    return -1;
}

const char *cg_loss_scale_input(const char *dtype)
{
    char err[128];
    return cg_dtype_parse(dtype, err, sizeof err) == 2 ? IR_LOSS_SCALE_INPUT : NULL;
}

int cg_mma_parse(const char *name)
{
    if (!name)
        return -1;
    if (!strcmp(name, "auto"))
        return CG_MMA_AUTO;
    if (!strcmp(name, "off"))
        return CG_MMA_OFF;
    if (!strcmp(name, "bf16"))
        return CG_MMA_BF16;
    if (!strcmp(name, "fp16") || !strcmp(name, "f16"))
        return CG_MMA_FP16;
    return -1;
}

const char *cg_mma_name(int mma)
{
    switch (mma) {
    case CG_MMA_AUTO: return "auto";
    case CG_MMA_OFF: return "off";
    case CG_MMA_BF16: return "bf16";
    case CG_MMA_FP16: return "fp16";
    default: return NULL;
    }
}

int cg_mma_resolve(int mma, int storage, int arch, int emu, char *err, size_t n)
{
    static const char *const storage_name[] = {"f32", "bf16", "fp16"};
    if (!cg_mma_name(mma) || storage < 0 || storage > 2) {
        snprintf(err, n, "unknown matmul precision %d or storage %d", mma, storage);
        return -1;
    }
    if (mma == CG_MMA_AUTO) /* 16-bit storage uses the tensor cores where there are some */
        return storage == 0 || arch < 80 ? CG_MMA_OFF : storage == 1 ? CG_MMA_BF16 : CG_MMA_FP16;
    if (mma == CG_MMA_OFF)
        return CG_MMA_OFF;
    if (!emu && arch < 80) {
        snprintf(err, n, "--mma=%s needs tensor cores with mma.sync.m16n8k16 (--cuda-arch sm_80 or newer), not sm_%d",
                 cg_mma_name(mma), arch);
        return -1;
    }
    if (storage && storage != (mma == CG_MMA_BF16 ? 1 : 2)) {
        snprintf(err, n, "--mma=%s with --dtype %s: the stored %s operands would be rounded a second time, to %s; "
                 "use --mma=%s (the default for --dtype %s) or --mma=off", cg_mma_name(mma), storage_name[storage],
                 storage_name[storage], cg_mma_name(mma), storage_name[storage], storage_name[storage]);
        return -1;
    }
    return mma;
}

int cg_run_program(char *const *argv, const char *logpath)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
