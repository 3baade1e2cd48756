/* harness_drive.h: the compile driver (driver/driver.h) for the suites, which compile through it
 * as the command line does: targets resolved once by drv_target, and one stage or a run of
 * stages by drv_run (test_layering.sh refuses a suite that writes the chain out itself). */
#ifndef XTC_TEST_HARNESS_DRIVE_H
#define XTC_TEST_HARNESS_DRIVE_H

#include <check.h>
#include <string.h>

#include "driver.h"

/* The target of that name ("cpu", "cuda", "cuda-emu", "interp"), f32 storage, resolved once. */
static inline const DrvTarget *harness_target(const char *name)
{
    static const char *const names[] = {"cpu", "cuda", "cuda-emu", "interp"};
    static DrvTarget targets[4];
    static int ready[4];
    if (!name)
        name = "cpu";
    for (int i = 0; i < 4; i++)
        if (!strcmp(names[i], name)) {
            char err[512];
            if (!ready[i])
                ck_assert_msg(drv_target(&targets[i], &(CgOptions){.target = name}, err, sizeof err) == 0, "%s", err);
            ready[i] = 1;
            return &targets[i];
        }
    ck_abort_msg("no target '%s'", name);
    return NULL;
}

/* cg_compile through the driver: the target (backend, dtype, mma, cuda_arch, cpu) from opt,
 * code generation only. 0, or -1 with the message in err. */
static inline int harness_cg(const IrGraph *g, const CgOptions *opt, CgStats *stats, char *err, size_t n)
{
    DrvTarget t;
    if (drv_target(&t, opt, err, n) != 0)
        return -1;
    DrvJob job = {.graph = (IrGraph *)g, .start = DRV_CODEGEN, .cg = *opt};
    return drv_run(&job, &t, NULL, stats, err, n);
}

/* The pass pipeline through the driver for target (NULL = "interp": every op, no limits), with
 * po's options (NULL: every pass, verified after each). A new graph, or NULL with err. */
static inline IrGraph *harness_passes(IrGraph *g, const char *target, const PassOptions *po, char *err, size_t n)
{
    DrvJob job = {.graph = g, .start = DRV_PASSES, .stop_after = DRV_PASSES, .passes = po};
    IrGraph *h = NULL;
    return drv_run(&job, harness_target(target ? target : "interp"), &h, NULL, err, n) == 0 ? h : NULL;
}

/* Lowers model (NULL: the last) of the checked file f, differentiated when grads (the loss, or
 * the outputs seeded by grad.<output>; the loss scale of t's storage), optimised for t when
 * passes (NULL: stop after autodiff). Diagnostics go to d when set. NULL with err. */
static inline IrGraph *harness_build(const XtfFile *f, const char *model, const XtLowerOpts *lo, int grads,
                                     const DrvTarget *t, const PassOptions *passes, XtfDiag *d, char *err, size_t n)
{
    DrvJob job = {.file = f, .model = model, .grads = grads, .diag = d, .passes = passes,
                  .stop_after = passes ? DRV_PASSES : DRV_AUTODIFF};
    if (lo)
        job.lower = *lo;
    IrGraph *g = NULL;
    return drv_run(&job, t, &g, NULL, err, n) == 0 ? g : NULL;
}

/* Appends the backward graph to g in place, through the driver (as harness_build's grads). */
static inline int harness_autodiff(IrGraph *g, const char *target, char *err, size_t n)
{
    DrvJob job = {.graph = g, .start = DRV_AUTODIFF, .stop_after = DRV_AUTODIFF, .grads = 1};
    return drv_run(&job, harness_target(target), NULL, NULL, err, n);
}

/* The every-pass options (verified after each) for harness_build. */
#define HARNESS_EVERY_PASS (&(const PassOptions){.verify_each = 1})

#endif
