/* emu_lib.h: for the suites that run CUDA C through the emulator as a plain shared library
 * (test_cuda, test_cuda_mma): compile a source beside the emulator and ABI headers, load it, and
 * launch the kernels it lists as test_kernels, test_launch and test_release. Include after
 * harness.h, once the suite's scratch directory exists. */
#ifndef XTC_TEST_EMU_LIB_H
#define XTC_TEST_EMU_LIB_H

#include "cg_cuda.h"
#include "rt_cuda_abi.h"

#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *dl;
    const XtcEmuKernel *kernels;
    int32_t (*launch)(const XtcEmuKernel *, const XtcEmuLaunch *, void **);
    void (*release)(void *);
    void *cache;
    char err[1024];
} EmuLib;

/* Writes NAME.c (source) into the suite's directory beside xtc_cuda_emu.h and rt_cuda_abi.h,
 * compiles it with `cc FLAGS` into NAME.so and loads it (a Check failure if either fails). */
static inline void *emu_build_so(const char *name, const char *source, const char *flags)
{
    harness_write_text("xtc_cuda_emu.h", cg_embed_emu_h);
    harness_write_text("rt_cuda_abi.h", cg_embed_rt_cuda_abi_h);
    char c[300], so[600], cmd[2000];
    snprintf(c, sizeof c, "%s.c", name);
    harness_write_text(c, source);
    snprintf(so, sizeof so, "%s/%s.so", tmpdir, name);
    snprintf(cmd, sizeof cmd, "cc %s -I%s -o %s %s/%s -lm", flags, tmpdir, so, tmpdir, c);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(dl != NULL, "%s", dlerror());
    return dl;
}

/* Binds e to the kernels of a library emu_build_so loaded. */
static inline void emu_bind(EmuLib *e, void *dl)
{
    memset(e, 0, sizeof *e);
    e->dl = dl;
    e->kernels = dlsym(dl, "test_kernels");
    int32_t (*const *launch)(const XtcEmuKernel *, const XtcEmuLaunch *, void **) = dlsym(dl, "test_launch");
    void (*const *release)(void *) = dlsym(dl, "test_release");
    ck_assert(e->kernels && launch && release);
    e->launch = *launch;
    e->release = *release;
}

/* Launches kernel k on a one-dimensional grid and block, threads in the given order. */
static inline int emu_run(EmuLib *e, int k, unsigned grid, unsigned block, int order, void **args)
{
    XtcEmuLaunch l = {{grid, 1, 1}, {block, 1, 1}, order, &e->cache, e->err, sizeof e->err};
    e->err[0] = 0;
    return e->launch(&e->kernels[k], &l, args);
}

static inline void emu_close(EmuLib *e)
{
    e->release(e->cache);
    dlclose(e->dl);
}

#endif
