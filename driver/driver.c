/* driver.c: the compile driver (see driver.h): the target resolved once, then lower,
 * differentiate, run the passes and generate code, each stage reading the target as data. */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int drv_target(DrvTarget *t, const CgOptions *ask, char *err, size_t n)
{
    static const CgOptions none = {0};
    if (!ask)
        ask = &none;
    memset(t, 0, sizeof *t);
    t->name = ask->target && *ask->target ? ask->target : "cpu";
    t->dtype = ask->dtype;
    t->mma = ask->mma;
    t->cuda_arch = ask->cuda_arch;
    t->cpu = ask->cpu;
    t->features = ask->features;
    if ((t->storage = cg_dtype_parse(ask->dtype, err, n)) < 0)
        return -1;
    if (ask->weights_dtype && strcmp(ask->weights_dtype, "f32") && strcmp(ask->weights_dtype, "int8")) {
        snprintf(err, n, "--weights-dtype: expected f32 or int8, got '%s'", ask->weights_dtype);
        return -1;
    }
    t->int8 = ask->weights_dtype && !strcmp(ask->weights_dtype, "int8");
    t->quant_group = ask->quant_group;
    if (ask->quant_group < 0 || ask->quant_group > (1 << 20) || (ask->quant_group && !t->int8)) {
        snprintf(err, n, ask->quant_group && !t->int8 ? "--group applies to --weights-dtype int8"
                                                      : "--group: expected a group size in [1, 1048576]");
        return -1;
    }
    t->kv_dtype = ask->kv_dtype;
    if (!strcmp(t->name, "interp")) {
        if (t->storage > 0 || ask->kv_dtype || ask->cuda_arch || ask->emit_cuda || (ask->mma != CG_MMA_AUTO && ask->mma != CG_MMA_OFF)) {
            snprintf(err, n, "the interpreter computes in double precision: no --dtype, --kv-dtype, --mma or CUDA options");
            return -1;
        }
        return 0; /* no backend: every op (matmul_q8 with --weights-dtype int8), no limits, no loss scale */
    }
    const CgBackend *be = cg_backend_find(t->name);
    if (!be) {
        snprintf(err, n, "unknown target '%s' (this build has: cpu, cuda, cuda-emu)", t->name);
        return -1;
    }
    t->backend = be;
    t->name = be->name;
    t->caps = be->caps;
    if (!cg_storage_supported(be->caps, be->name, t->storage, err, n))
        return -1;
    if ((t->kv_storage = cg_kv_storage(be->caps, be->name, t->storage, ask->kv_dtype, err, n)) < 0)
        return -1;
    if ((ask->cuda_arch || ask->emit_cuda) && !(be->caps & CG_CAP_CUDA)) {
        snprintf(err, n, "--cuda-arch and --emit-cuda apply to --target cuda and cuda-emu, not %s", be->name);
        return -1;
    }
    if ((be->caps & CG_CAP_CUDA) && (t->arch = cg_cuda_arch_number(ask->cuda_arch ? ask->cuda_arch : "sm_80", err, n)) < 0)
        return -1;
    if (!cg_mma_name(ask->mma)) {
        snprintf(err, n, "unknown matmul precision %d (CgOptions.mma)", ask->mma);
        return -1;
    }
    if (ask->mma != CG_MMA_AUTO && ask->mma != CG_MMA_OFF && !(be->caps & CG_CAP_MMA)) {
        snprintf(err, n, "the %s backend has no tensor-core matmul (--mma=%s); the cuda targets have", be->name,
                 cg_mma_name(ask->mma));
        return -1;
    }
    if (ask->mma == CG_MMA_FP16 && !(be->caps & CG_CAP_HALF)) { /* the CPU's vdpbf16ps has no fp16 form */
        snprintf(err, n, "the %s backend's --mma is bf16 or off (fp16 operands are for the cuda targets)", be->name);
        return -1;
    }
    if ((ask->cpu || ask->features) && cg_cpu_check(ask->cpu, ask->features, err, n) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, n, "--cpu: %s", why);
        return -1;
    }
    if (t->int8 && !(be->caps & CG_CAP_INT8)) {
        snprintf(err, n, "--weights-dtype int8: the %s backend has no int8 matmul (int8 weights run on the cpu target)",
                 be->name);
        return -1;
    }
    if (t->int8 && (t->storage > 0 || (ask->mma != CG_MMA_AUTO && ask->mma != CG_MMA_OFF))) {
        snprintf(err, n, "--weights-dtype int8 computes in f32: not with --dtype %s or --mma",
                 ask->dtype ? ask->dtype : "f32");
        return -1;
    }
    t->loss_scale = cg_loss_scale_input(ask->dtype);
    t->passes.supports = be->supports;
    t->passes.attention_max_head = be->attention_max_head;
    t->passes.attention_grad_max_head = be->attention_grad_max_head;
    t->passes.attention_kv_groups = be->attention_kv_groups;
    t->passes.attention_grad_kv_groups = be->attention_grad_kv_groups;
    return 0;
}

const char *drv_stage_name(DrvStage s)
{
    switch (s) {
    case DRV_LOWER: return "lower";
    case DRV_AUTODIFF: return "autodiff";
    case DRV_PASSES: return "passes";
    case DRV_CODEGEN: return "codegen";
    }
    return "?";
}

/* Lowers and verifies the job's model; NULL with err. */
static IrGraph *lower(const DrvJob *job, char *err, size_t n)
{
    XtfDiag local;
    XtfDiag *d = job->diag;
    if (!d) {
        xtf_diag_init(&local);
        d = &local;
    }
    int before = d->nerrors;
    IrGraph *g = xt_lower(job->file, job->model, &job->lower, d);
    if (!g || d->nerrors > before) {
        if (d == &local && d->text && *d->text)
            snprintf(err, n, "%.*s", (int)strcspn(d->text, "\n"), d->text);
        else
            snprintf(err, n, "cannot lower %s", job->file->path);
        ir_graph_free(g);
        g = NULL;
    }
    if (d == &local)
        xtf_diag_free(&local);
    char msg[512];
    if (g && ir_verify(g, msg, sizeof msg) != 0) {
        snprintf(err, n, "internal error: lowered IR does not verify: %s", msg);
        ir_graph_free(g);
        return NULL;
    }
    return g;
}

static int has_output(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->outputs[i].name, name) == 0)
            return 1;
    return 0;
}

int drv_run(const DrvJob *job, const DrvTarget *t, IrGraph **out, CgStats *stats, char *err, size_t n)
{
    if (out)
        *out = NULL;
    if (!job || !t || (!job->file == !job->graph)) {
        snprintf(err, n, "drv_run: a job needs a file or a graph (not both) and a target");
        return -1;
    }
    DrvStage start = job->file ? DRV_LOWER : job->start ? job->start : DRV_AUTODIFF;
    DrvStage stop = job->stop_after ? job->stop_after : DRV_CODEGEN;
    if (start > stop || (job->file && job->start > DRV_LOWER)) {
        snprintf(err, n, "drv_run: stage '%s' comes after '%s'", drv_stage_name(start), drv_stage_name(stop));
        return -1;
    }
    if (stop == DRV_CODEGEN && !t->backend) {
        snprintf(err, n, "the %s target has no code generation", t->name);
        return -1;
    }
    IrGraph *cur = job->graph; /* ours to free once a stage has made a new one */
    int owned = 0;
    if (start == DRV_LOWER) {
        if (!(cur = lower(job, err, n)))
            return -1;
        owned = 1;
    }
    if (start <= DRV_AUTODIFF && stop >= DRV_AUTODIFF && job->grads) {
        int loss = has_output(cur, "loss");
        IrGradOpts go = {.loss = loss ? "loss" : NULL, .seed_outputs = !loss, .loss_scale = t->loss_scale};
        if (ir_autodiff(cur, &go, err, n) != 0)
            goto fail;
    }
    if (t->int8 && job->grads) {
        snprintf(err, n, "--weights-dtype int8 is for inference: training keeps f32 weights (quantize them afterwards)");
        goto fail;
    }
    if (t->int8 && start <= DRV_AUTODIFF && stop >= DRV_AUTODIFF) { /* inference: no autodiff ran */
        IrGraph *next = pass_quantize_weights(cur, t->quant_group, NULL, err, n);
        if (!next)
            goto fail;
        if (owned)
            ir_graph_free(cur);
        cur = next;
        owned = 1;
    }
    if (start <= DRV_PASSES && stop >= DRV_PASSES) {
        PassOptions po = job->passes ? *job->passes : (PassOptions){.verify_each = 1};
        po.target = &t->passes;
        IrGraph *next = pass_run_pipeline(cur, &po, err, n);
        if (!next)
            goto fail;
        if (owned)
            ir_graph_free(cur);
        cur = next;
        owned = 1;
    }
    if (stop == DRV_CODEGEN) {
        CgOptions cg = job->cg;
        cg.target = t->name;
        cg.dtype = t->dtype;
        cg.mma = t->mma;
        cg.cuda_arch = t->cuda_arch;
        cg.cpu = t->cpu;
        cg.features = t->features;
        cg.weights_dtype = t->int8 ? "int8" : NULL;
        cg.quant_group = t->quant_group;
        cg.kv_dtype = t->kv_dtype;
        if (!cg.source && job->file) {
            cg.source = job->file->src;
            cg.source_name = job->file->path;
        }
        if (cg_compile(cur, &cg, stats, err, n) != 0)
            goto fail;
    }
    if (out && owned)
        *out = cur;
    else if (owned)
        ir_graph_free(cur);
    return 0;
fail:
    if (owned)
        ir_graph_free(cur);
    return -1;
}

XtcModule *drv_build_load(const DrvJob *job, const DrvTarget *t, CgStats *stats, char *err, size_t n)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/xtc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(err, n, "cannot create a temporary directory under %s", tmp && *tmp ? tmp : "/tmp");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/model.so", dir);
    DrvJob j = *job;
    j.cg.output = path;
    j.stop_after = DRV_CODEGEN;
    XtcModule *m = NULL;
    if (drv_run(&j, t, NULL, stats, err, n) == 0 && xtc_module_load(path, &m) != XTC_OK) {
        snprintf(err, n, "%s", m ? xtc_module_error(m) : "out of memory");
        xtc_module_free(m);
        m = NULL;
    }
    unlink(path);
    rmdir(dir);
    return m;
}
