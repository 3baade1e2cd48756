/* cuda_case.h: what the suites that compile graphs for the CUDA targets share (test_cuda,
 * test_cuda_runtime): the storage of the case being run, the emulator's thread orders, the
 * ragged sizes, random inputs rounded to the storage, and compiling a graph through the compile
 * driver. Include after harness_bind.h and op_cases.h, with the suite's make_tmpdir defined. */
#ifndef XTC_TESTS_CUDA_CASE_H
#define XTC_TESTS_CUDA_CASE_H

#include "codegen.h"
#include "xtc.h"

#include <check.h>
#include <stdio.h>

/* The storage of floating-point tensors of the case being run (compile --dtype): 0 f32, 1 bf16,
 * 2 fp16; and the matmul precision (CgOptions.mma; CG_MMA_AUTO: that of the storage). */
static int storage;
static int case_mma = CG_MMA_AUTO;
static const char *const STORAGE_NAME[] = {"f32", "bf16", "fp16"};

/* XTC_CUDA_EMU_ORDER: threads of a block run forward, reverse or shuffled between barriers */
static const char *const ORDERS[] = {"forward", "reverse", "shuffled"};
/* (b, n) */
static const int64_t SIZES[][2] = {{1, 1}, {1, 7}, {2, 17}, {3, 33}, {1, 65}, {2, 130}};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

static inline IrGraph *new_graph(const char *name, BuildFn build) { return harness_new_graph(name, build, 256); }

/* The random inputs of a case: f32 ones rounded to the storage format, as the runtime rounds them
 * on upload. */
static inline void bind_case(Binding *bd, const IrGraph *g, const int64_t *syms)
{
    BindDraw draw = {.param_scale = 1.0, .int_range = int_range_by_name, .storage = storage};
    bind_random(bd, g, syms, &draw);
}

/* g compiled for target ("cpu", "cuda-emu", "cuda") through the compile driver, with the storage
 * and case_mma above, and loaded */
static inline XtcModule *compile_target(const IrGraph *g, const char *name, const char *target)
{
    make_tmpdir();
    char path[512], err[2048];
    snprintf(path, sizeof path, "%s/%s.%s.%s%s.so", tmpdir, name, target, STORAGE_NAME[storage],
             case_mma == CG_MMA_OFF ? ".nomma" : "");
    CgOptions opt = {.output = path, .target = target, .opt_level = 2, .source = "# test\n", .source_name = "t.xtf",
                     .dtype = STORAGE_NAME[storage], .mma = case_mma};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "compiling %s for %s: %s", name, target, err);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "loading %s: %s", name, xtc_module_error(m));
    return m;
}

#endif
