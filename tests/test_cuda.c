/* test_cuda.c: the CUDA backend's kernels checked against the reference interpreter without a
 * GPU, through the CUDA emulator (codegen/cuda/xtc_cuda_emu.h) and the runtime's emulated Driver API
 * (runtime/rt_cuda_emu.c): the same CUDA C that NVRTC compiles for the GPU, the same launch path.
 *
 * Each case builds a graph holding several ops, compiles it once to a cuda-emu module and runs it
 * at ragged sizes (b, n) = (1, 1), (1, 7), (2, 17), (3, 33), (1, 65), (2, 130) on random inputs;
 * outputs are compared with ir_interp: f32 within 1e-5 + 1e-4 * max|ref|, integers and bools
 * exactly. The same cases run again with 16-bit storage (--dtype bf16 and fp16): the random
 * inputs are rounded to the format, and the reference is the interpreter with every value it
 * computes rounded to the format as the kernels round on store (ir_interp_rounded; the buffers
 * that stay f32, cg_keeps_f32, not), so that the kernels' f32 arithmetic and their single
 * rounding are checked, not the format's distance from exact math: that is measured against
 * x-transformers by test_cuda_parity. These 16-bit sweeps (the tcase "half", ctest's
 * test_cuda_half) run the matmuls without tensor cores, but for the attention case, whose flash
 * kernel keeps them; test_cuda_mma checks the tensor-core paths. Threads of a block run forward, then reverse, then shuffled between barriers, so a
 * missing __syncthreads shows up as a wrong value. Backward graphs (ir_autodiff) of small models
 * are checked the same way, gradients included.
 *
 * Also here: the GPU run of the same cases, skipped with a visible reason where there is no GPU.
 * The conversions, the emulator on hand-written kernels and the runtime's errors and profile
 * events are test_cuda_runtime's.
 *
 * The op cases come from the one table, tests/op_cases.h (its rows for OC_CUDA); adding an op:
 * the recipe at its top (test_every_op_has_a_case fails until a case uses it). */
#include "cg_cuda.h"
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "rt_alloc.h"
#include "rt_cuda.h"
#include "rt_cuda_abi.h"
#include "rt_half.h"
#include "rt_internal.h"
#include "xtc.h"

#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu.h"
#include "harness.h"
#include "harness_drive.h"
#define HARNESS_MAXLEAF 96
#include "harness_bind.h"
#include "emu_lib.h"
#include "op_cases.h"
#include "flash_cases.h"

static void make_tmpdir(void) { harness_make_tmpdir("cuda"); }

#include "cuda_case.h"

/* ---- 16-bit storage ---- */

/* The unit roundoff of each format: 2^-8 for bf16 (8 significant bits), 2^-11 for fp16 (11). */
static const double UNIT[] = {0x1p-24, 0x1p-8, 0x1p-11};
/* The tolerance of a 16-bit output against the rounded reference: HALF_K units of UNIT *
 * max(1, max|ref|) of the tensor (a kernel's f32 result and the reference's f64 one may round to
 * neighbouring values, and that difference travels on; gradients get twice as much), plus
 * HALF_SENS times the output's sensitivity: how far the reference moves when every
 * floating-point input is moved by one unit of the format (an ill-conditioned output, exp(60 x),
 * amplifies such a difference the same way). Integer outputs computed from floats (casts) may
 * differ by as much as that sensitivity; values beyond the format's largest (fp16: 65504) are
 * infinite. */
#define HALF_K 4.0
#define HALF_SENS 4.0
static const double FORMAT_MAX[] = {3.4028234663852886e38, 3.3895313892515355e38, 65504.0};
/* The worst error seen per storage, in the same units, for the report at the end of a case. */
static double worst_err[3];
/* the f32 tolerance of the case running (OpCase.rtol) */
static double case_rtol = 1e-4;
static char worst_what[3][256];

/* ---- comparison ---- */

/* max |a - b| over the elements of two results of the same output (the sensitivity above) */
static double max_diff(const IrHostTensor *a, const IrHostTensor *b)
{
    int64_t numel = 1;
    for (int d = 0; d < a->rank; d++)
        numel *= a->shape[d];
    double m = 0;
    XtcDType t = xdt(a->dtype);
    for (int64_t i = 0; i < numel; i++) {
        double x = value_at(a->data, t, i), y = value_at(b->data, t, i);
        if (isfinite(x) && isfinite(y) && fabs(x - y) > m)
            m = fabs(x - y);
    }
    return m;
}

/* ir_interp_rounded's callback: the storage rounding of the module being checked */
static void round_stored(void *ctx, const IrNode *n, double *v, int64_t count)
{
    (void)ctx;
    if (!storage || cg_keeps_f32(n))
        return;
    for (int64_t i = 0; i < count; i++)
        v[i] = rt_round_to_storage(storage, (float)v[i]);
}

static void compare(const char *what, const IrHostTensor *ref, const XtcTensor *got, double sens)
{
    double maxabs;
    int64_t numel = compare_layout(what, ref, got, &maxabs);
    /* gradients through softmax cancel (p (dp - D)): graded with DESIGN.md's tolerance */
    int grad = strstr(what, "output 'grad.") != NULL;
    double rtol = grad ? 1e-3 : case_rtol;
    double tol = got->dtype == XTC_F32 ? 1e-5 + rtol * maxabs : 0;
    if (storage && got->dtype == XTC_F32) /* 16-bit storage: K rounding errors of the largest value */
        tol = UNIT[storage] * (1 + HALF_K * (grad ? 2 : 1) * maxabs) + HALF_SENS * sens;
    else if (storage)
        tol = ceil(sens);
    char note[32] = "";
    if (storage)
        snprintf(note, sizeof note, ", storage %s", STORAGE_NAME[storage]);
    /* beyond the format: infinite */
    double overflow = storage ? FORMAT_MAX[storage] * (1 - UNIT[storage]) : 0;
    int64_t i = compare_values(what, note, ref, got, numel, tol, overflow);
    if (got->dtype == XTC_F32 && i >= 0) {
        double units = fabs(value_at(got->data, XTC_F32, i) - value_at(ref->data, XTC_F32, i)) /
                       (UNIT[storage] * (maxabs > 1 ? maxabs : 1));
        if (units > worst_err[storage]) {
            worst_err[storage] = units;
            snprintf(worst_what[storage], sizeof worst_what[storage], "%.200s element %lld", what, (long long)i);
        }
    }
}

/* ---- the harness ---- */

/* Runs m at symbol values syms on random inputs against the interpreter, with the emulator's
 * threads in the given order. */
static void check_run(const IrGraph *g, XtcModule *m, const int64_t *syms, const char *name, const char *order)
{
    Binding bd;
    bind_case(&bd, g, syms);
    IrHostTensor *ref = interp_outputs(g, bind_cb, &bd, round_stored, name);
    /* 16-bit storage: the outputs' sensitivity to a rounding of the inputs (see HALF_SENS) */
    double *sens = calloc((size_t)g->noutputs + 1, sizeof *sens);
    if (storage) {
        Binding moved = bd;
        for (int i = 0; i < bd.n; i++) {
            if (bd.t[i].dtype != IR_F32)
                continue;
            int64_t numel = 1;
            for (int d = 0; d < bd.t[i].rank; d++)
                numel *= bd.t[i].shape[d];
            float *v = malloc((size_t)(numel ? numel : 1) * sizeof *v);
            for (int64_t k = 0; k < numel; k++)
                v[k] = (float)(((const float *)bd.t[i].data)[k] * (1 + ((rnd() & 1) ? UNIT[storage] : -UNIT[storage])));
            moved.t[i].data = v;
        }
        IrHostTensor *ref_moved = interp_outputs(g, bind_cb, &moved, round_stored, name);
        for (int o = 0; o < g->noutputs; o++)
            sens[o] = max_diff(&ref[o], &ref_moved[o]);
        free_outputs(g, ref_moved);
        for (int i = 0; i < bd.n; i++)
            if (bd.t[i].dtype == IR_F32)
                free(moved.t[i].data);
    }
    setenv("XTC_CUDA_EMU_ORDER", order, 1);
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s: session: %s", name, xtc_session_error(s));
    bind_session(s, &bd, NULL);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s (b=%lld n=%lld, %s): run: %s", name, (long long)syms[0],
                  (long long)syms[1], order, xtc_session_error(s));
    for (int o = 0; o < g->noutputs; o++) {
        XtcTensor t;
        ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
        char what[256];
        snprintf(what, sizeof what, "%s output '%s' (b=%lld n=%lld, threads %s)", name, g->outputs[o].name,
                 (long long)syms[0], (long long)syms[1], order);
        compare(what, &ref[o], &t, sens[o]);
    }
    free(sens);
    /* a second run reuses uploaded weights and the arena */
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: second run: %s", name, xtc_session_error(s));
    xtc_session_free(s);
    unsetenv("XTC_CUDA_EMU_ORDER");
    free_outputs(g, ref);
    bind_free(&bd);
}


/* The case at the first nsizes of SIZES, compiled for target ("cuda-emu", or "cuda" on a GPU)
 * as built and after the pass pipeline as xtc compile runs it (when it fuses anything: fused
 * elementwise programs, matmul epilogues, fused attention), against the interpreter. */
static void run_case_sizes(const OpCase *c, const char *target, int nsizes)
{
    const char *name = c->name;
    case_rtol = c->rtol;
    IrGraph *g = new_graph(name, c->build);
    XtcModule *m = compile_target(g, name, target);
    for (int k = 0; k < nsizes; k++)
        check_run(g, m, SIZES[k], name, ORDERS[k % 3]);
    xtc_module_free(m);
    PassOptions po = {.verify_each = 1};
    char err[1024], fname[128];
    IrGraph *h = harness_passes(g, target, &po, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: passes: %s", name, err);
    int fused = 0;
    for (int i = 0; i < h->nnodes; i++)
        fused += h->nodes[i]->op == IR_FUSED || h->nodes[i]->op == IR_ATTENTION || h->nodes[i]->op == IR_ATTENTION_GRAD;
    if (fused) {
        snprintf(fname, sizeof fname, "%s_fused", name);
        m = compile_target(h, fname, target);
        for (int k = 0; k < nsizes; k++)
            check_run(h, m, SIZES[k], fname, ORDERS[(k + 1) % 3]);
        xtc_module_free(m);
    }
    ir_graph_free(h);
    ir_graph_free(g);
}

static void run_case(const OpCase *c, const char *target)
{
    run_case_sizes(c, target, c->flags & OC_ONCE ? 1 : NSIZES);
}

/* the k-th CUDA case run at every size, and the k-th run once (fixed sizes) */
static const OpCase *sized_case(int k)
{
    const OpCase *c;
    for (int i = 0; (c = op_case_for(OC_CUDA, i)) != NULL; i++)
        if (!(c->flags & OC_ONCE) && k-- == 0)
            return c;
    return NULL;
}

static const OpCase *once_case(int k)
{
    const OpCase *c;
    for (int i = 0; (c = op_case_for(OC_CUDA, i)) != NULL; i++)
        if ((c->flags & OC_ONCE) && k-- == 0)
            return c;
    return NULL;
}

static int count_cases(const OpCase *(*nth)(int))
{
    int n = 0;
    while (nth(n))
        n++;
    return n;
}

/* The plan the cuda targets render for build_heads has the views: three permute steps left of
 * seven (heads_k2's split, heads_stats' merge, the entmax15 split), and the attention kernels
 * read and write through the views decided above. */
START_TEST(test_head_views)
{
    ck_assert_msg(cg_cuda_backend.caps & cg_cuda_emu_backend.caps & CG_CAP_HEAD_VIEWS, "no CG_CAP_HEAD_VIEWS");
    IrGraph *g = new_graph("heads", build_heads);
    CgPlan p, plain;
    char err[512];
    ck_assert_msg(cg_plan_build_views(g, &p, (cg_cuda_backend.caps & CG_CAP_HEAD_VIEWS) != 0, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_msg(cg_plan_build(g, &plain, err, sizeof err) == 0, "%s", err);
    int permutes = 0, natt = 0;
    unsigned views[3] = {0};
    for (int s = 0; s < p.nsteps; s++) {
        permutes += p.steps[s].node->op == IR_PERMUTE;
        if (p.steps[s].node->op == IR_ATTENTION && natt < 3)
            views[natt++] = p.kernels[p.steps[s].kernel].views;
    }
    ck_assert_int_eq(permutes, 3);
    ck_assert_int_eq(p.nsteps, plain.nsteps - 4);
    ck_assert_int_eq(natt, 3);
    ck_assert_uint_eq(views[0], CG_VIEW_Q | CG_VIEW_K | CG_VIEW_V | CG_VIEW_OUT); /* heads */
    ck_assert_uint_eq(views[1], CG_VIEW_Q | CG_VIEW_V);                           /* heads_stats */
    ck_assert_uint_eq(views[2], CG_VIEW_Q | CG_VIEW_K);                           /* heads_f32 */
    cg_plan_free(&plain);
    cg_plan_free(&p);
    ir_graph_free(g);
}
END_TEST

/* The few-row (decode) path of the bounded attention (cg_cuda_attention_decode.c) as rendered for
 * attention_bounded_cuda: of its five decode rows, the four without a mask operand take the bound
 * as each key warp's maximum (a run-time condition under causal: decode_few_keys, three keys for
 * five rows, runs the general path, which test_case_once checks), the masked one keeps the general
 * path; with f32 storage and with bf16 and fp16 storage on tensor cores alike, since the decode
 * path's probabilities stay f32. Its numbers: test_case_once (f32), test_cuda_mma's
 * test_flash_bounded (bf16 and fp16, one query row). */
START_TEST(test_decode_bounded)
{
    const OpCase *c = NULL;
    for (int i = 0; (c = once_case(i)) != NULL; i++)
        if (!strcmp(c->name, "attention_bounded_cuda"))
            break;
    ck_assert_msg(c, "no attention_bounded_cuda case");
    IrGraph *g = new_graph(c->name, c->build);
    CgPlan plan;
    char err[1024];
    ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
    for (int st = 0; st <= 2; st++) {
        CgOptions opt = {.output = "-", .dtype = STORAGE_NAME[st], .mma = st == 2 ? CG_MMA_FP16 : st ? CG_MMA_BF16 : 0};
        CuUnit u;
        ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &u, err, sizeof err) == 0, "%s", err);
        int decode = 0, bounded = 0;
        for (int k = 0; k < u.nkernels; k++) {
            if (plan.kernels[k].node->op != IR_ATTENTION || !strstr(u.kernel_text[k], "few query rows"))
                continue;
            decode++;
            bounded += strstr(u.kernel_text[k], "const float dm = bounded ? ") != NULL;
        }
        ck_assert_msg(decode == 5 && bounded == 4, "%s storage: %d decode paths, %d bounded", STORAGE_NAME[st], decode,
                      bounded);
        cg_cuda_unit_free(&u);
    }
    cg_plan_free(&plan);
    ir_graph_free(g);
}
END_TEST

/* Which values stay f32 under 16-bit storage for being sums of gradients over the batch or the
 * positions (cg_keeps_f32): T5's relative position bias gradient, its softmax gradients
 * [b, h, n, n] summed over the batch, the layers' sums added, scaled, permuted and gathered into
 * [buckets, h]; not the activations, not a sum over a constant axis (a norm's), not what mixes
 * such a sum with an activation. */
START_TEST(test_kept_f32)
{
    IrGraph *g = ir_graph_new("kept");
    IrDim b = ir_dim_sym(0), n = ir_dim_sym(1);
    IrDim s4[] = {b, ir_dim(2), n, n}, s3[] = {ir_dim(2), n, n}, sn[] = {n, n, ir_dim(2)};
    IrNode *ds0 = input(g, "ds0", IR_F32, 4, s4), *ds1 = input(g, "ds1", IR_F32, 4, s4);
    IrNode *sum0 = ir_reduce(g, IR_SUM, ds0, 0), *sum1 = ir_reduce(g, IR_SUM, ds1, 0);
    IrNode *r0 = ir_reshape(g, sum0, 3, s3), *r1 = ir_reshape(g, sum1, 3, s3);
    IrNode *scaled = ir_binary(g, IR_MUL, ir_binary(g, IR_ADD, r0, r1), ir_const(g, 8.0, IR_F32));
    IrNode *perm = ir_permute(g, scaled, (int[]){1, 2, 0});
    IrNode *bucket = ir_relpos(g, n, n, 32, 128, 0);
    IrNode *grad = ir_gather_grad(g, perm, bucket, ir_dim(32));
    IrNode *keys = ir_reduce(g, IR_SUM, ds0, 3); /* over the keys: symbolic too */
    IrDim sc[] = {b, n, ir_dim(64)};
    IrNode *act = input(g, "act", IR_F32, 3, sc);
    IrNode *feat = ir_reduce(g, IR_SUM, act, 2); /* over the features: constant */
    IrNode *shifted = ir_binary(g, IR_ADD, keys, ir_const(g, 1.0, IR_F32));
    IrNode *with_act = ir_binary(g, IR_MUL, perm, input(g, "w", IR_F32, 3, sn));
    const IrNode *kept[] = {sum0, sum1, r0, scaled, perm, grad, keys, shifted};
    const IrNode *not_kept[] = {ds0, act, feat, with_act};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        ck_assert_msg(kept[i] && cg_keeps_f32(kept[i]), "kept[%zu] (%s) is stored in 16 bits", i,
                      kept[i] ? ir_ops[kept[i]->op].name : "not built");
    for (size_t i = 0; i < sizeof not_kept / sizeof not_kept[0]; i++)
        ck_assert_msg(not_kept[i] && !cg_keeps_f32(not_kept[i]), "not_kept[%zu] (%s) stays f32", i,
                      not_kept[i] ? ir_ops[not_kept[i]->op].name : "not built");
    ir_graph_free(g);
}
END_TEST

START_TEST(test_case)
{
    run_case(sized_case(_i), "cuda-emu");
}
END_TEST

/* the cases past the sizes above (the large matmul tiles, the many-tile attention, long
 * reductions), at their fixed sizes */
START_TEST(test_case_once)
{
    run_case(once_case(_i), "cuda-emu");
}
END_TEST

/* Every case again with bf16 and with fp16 storage, forward and backward. These check the
 * kernels' 16-bit loads and stores: their matmuls run without tensor cores (--mma=off), but for
 * the one case HALF_MMA_CASE, the flash attention with every bias, mask and scale form, which
 * keeps the tensor cores --dtype implies. The emulated tensor cores are slow, and they have
 * their own suite, test_cuda_mma: every matmul form and the flash attention forward and backward
 * with 16-bit storage, and a model trained through them. */
#define HALF_MMA_CASE "attention"
START_TEST(test_case_half)
{
    int n = count_cases(sized_case);
    const OpCase *c = sized_case(_i % n);
    storage = 1 + _i / n;
    case_mma = strcmp(c->name, HALF_MMA_CASE) ? CG_MMA_OFF : CG_MMA_AUTO;
    worst_err[storage] = 0;
    run_case(c, "cuda-emu");
    fprintf(stderr, "test_cuda: %s storage%s, case %s: worst error %.2f x 2^%d x max(1, max|ref|) (%s)\n",
            STORAGE_NAME[storage], case_mma == CG_MMA_OFF ? " (--mma=off)" : "", c->name, worst_err[storage],
            storage == 1 ? -8 : -11, worst_what[storage]);
    storage = 0;
    case_mma = CG_MMA_AUTO;
}
END_TEST

/* 16-bit storage halves the device arena: the session plans it with each temp at its device
 * size (RtDeviceOps.elem_bytes: 2 bytes per element where the module stores it in 16 bits, 4 for
 * the buffers that stay f32, cg_keeps_f32) while outputs come back to the host as f32. The
 * matmuls keep nothing in f32; the training block keeps its loss and the embedding's gradient,
 * and the sums over the batch (its weights' gradients, [1, 24, 40] and the like: 18 temps of
 * weight size, not activation size, so 0.549 of f32's arena at these tiny dims); the attention case its outputs with the logsumexp column (only planned here: test_case_half
 * runs it). */
START_TEST(test_half_arena)
{
    static const BuildFn builds[] = {build_matmul, build_train_block, build_attention};
    static const char *const names[] = {"matmul_arena", "train_block_arena", "attention_arena"};
    static const int min_kept[] = {0, 2, 3};
    static const double max_ratio[] = {0.51, 0.56, 0.75};
    const int64_t syms[2] = {2, 33};
    char err[1024];
    for (int c = 0; c < 3; c++) {
        IrGraph *g0 = new_graph(names[c], builds[c]);
        PassOptions po = {.verify_each = 1};
        IrGraph *g = harness_passes(g0, "cuda-emu", &po, err, sizeof err);
        ck_assert_msg(g != NULL, "%s: passes: %s", names[c], err);
        int64_t arena[2] = {0};
        for (storage = 0; storage < 2; storage++) {
            XtcModule *m = compile_target(g, names[c], "cuda-emu");
            arena[storage] = xtc_module_arena_bytes(m, syms);
            const XtcCudaModuleV1 *cm = m->device_abi;
            int kept = 0, half_outputs = 0;
            for (int b = 0; b < m->nbufs; b++) {
                const RtBuffer *buf = &m->bufs[b];
                if (buf->kind != RT_BUF_TEMP)
                    continue;
                size_t want = buf->dtype == XTC_F32 && cm->buf_storage[b] ? 2 : xtc_dtype_size(buf->dtype);
                kept += storage && buf->dtype == XTC_F32 && !cm->buf_storage[b];
                ck_assert_msg(m->device->elem_bytes(m, b) == want, "%s, %s storage: %%%s takes %zu bytes per element "
                              "on the device, not %zu", names[c], STORAGE_NAME[storage], buf->name,
                              m->device->elem_bytes(m, b), want);
            }
            for (int o = 0; o < m->nouts; o++) {
                int b = m->outs[o].buf;
                half_outputs += m->bufs[b].kind == RT_BUF_TEMP && cm->buf_storage[b];
                if (storage && !strcmp(m->outs[o].name, "loss"))
                    ck_assert_msg(!cm->buf_storage[b] && m->device->elem_bytes(m, b) == 4, "%s: loss not in f32",
                                  names[c]);
            }
            if (storage) {
                ck_assert_msg(half_outputs > 0, "%s: no output is a 16-bit temp", names[c]);
                ck_assert_msg(kept >= min_kept[c], "%s: %d temps kept f32, expected %d", names[c], kept, min_kept[c]);
            }
            /* a session's device arena is the plan's; its outputs, 16-bit ones widened on
             * download into the host arena, match the reference */
            XtcSession *s = NULL;
            XtcSessionOptions so = {.max_batch = syms[0], .max_seq = syms[1]};
            ck_assert_msg(xtc_session_new(m, &so, &s) == XTC_OK, "%s", xtc_session_error(s));
            ck_assert_int_eq(xtc_session_peak_bytes(s), arena[storage]);
            xtc_session_free(s);
            if (storage && c < 2)
                check_run(g, m, syms, names[c], "forward");
            xtc_module_free(m);
        }
        storage = 0;
        /* half the bytes of f32, up to each temp's rounding to 64 bytes, plus the f32 buffers */
        double ratio = (double)arena[1] / (double)arena[0];
        fprintf(stderr, "test_cuda: %s: device arena at b=2 n=33: f32 %lld bytes, bf16 %lld (%.3f)\n", names[c],
                (long long)arena[0], (long long)arena[1], ratio);
        ck_assert_msg(ratio <= max_ratio[c], "%s: the bf16 device arena is %.3f of the f32 one", names[c], ratio);
        ir_graph_free(g);
        ir_graph_free(g0);
    }
}
END_TEST

/* symbolic dims that come out as 0: empty outputs launch nothing, empty sums are 0 */
/* the values of output "next" after a run: the rows of state, each 3 floats */
static void expect_rows(XtcSession *s, const float *state, int64_t rows, const char *when)
{
    XtcTensor nx, tw;
    ck_assert_msg(xtc_session_get_output(s, "next", &nx) == XTC_OK, "%s: %s", when, xtc_session_error(s));
    ck_assert_int_eq(xtc_session_get_output(s, "twice", &tw), XTC_OK);
    ck_assert_int_eq(nx.shape[0], rows);
    for (int64_t i = 0; i < rows * 3; i++) {
        ck_assert_msg(((const float *)nx.data)[i] == state[i], "%s, %s: next[%lld] %g, expected %g", STORAGE_NAME[storage],
                      when, (long long)i, ((const float *)nx.data)[i], state[i]);
        ck_assert_msg(((const float *)tw.data)[i] == 2 * state[i], "%s: twice[%lld]", when, (long long)i);
    }
}

/* xtc_session_carry on the device (emulated): the carried output becomes the input there, is not
 * uploaded again (only x crosses to the device per call), and reads back right when asked for;
 * an input set from the host after a carry is uploaded; a carry repeated without a run changes
 * nothing; one that fails for memory leaves the input unset. f32 and bf16 storage (the values
 * are exact in both). */
/* 16-bit outputs come back widened in chunks of 2^20 values on the session's threads
 * (rt_cuda.c, widen_outputs): three outputs of 1.5M, 1 and 2M values (chunks that end inside an
 * output, a tiny output between), 3 threads, bf16 and fp16 storage. Every value is compared with
 * its own storage rounding of the exact result. */
START_TEST(test_widen_outputs)
{
    const int64_t n = 1500000, n2 = 2000000;
    for (storage = 1; storage <= 2; storage++) {
        IrGraph *g = ir_graph_new("widen");
        IrDim sx[] = {ir_dim(n)}, s1[] = {ir_dim(1)}, sy[] = {ir_dim(n2)};
        IrNode *x = input(g, "x", IR_F32, 1, sx), *y = input(g, "y", IR_F32, 1, sy);
        out(g, "a", ir_binary(g, IR_ADD, ir_binary(g, IR_MUL, x, ir_const(g, 2.0, IR_F32)), ir_const(g, 1.0, IR_F32)));
        out(g, "b", ir_binary(g, IR_ADD, input(g, "t", IR_F32, 1, s1), ir_const(g, 0.5, IR_F32)));
        out(g, "c", ir_unary(g, IR_NEG, y));
        XtcModule *m = compile_target(g, "widen", "cuda-emu");
        XtcSessionOptions o = {.threads = 3};
        /* widened when read (the default), and by the run (every output copied after it) */
        for (int eager = 0; eager < 2; eager++) {
            XtcSession *s = NULL;
            if (eager)
                setenv("XTC_EAGER_OUTPUTS", "1", 1);
            ck_assert_int_eq(xtc_session_new(m, &o, &s), XTC_OK);
            unsetenv("XTC_EAGER_OUTPUTS");
            float *xv = malloc((size_t)n * sizeof *xv), *yv = malloc((size_t)n2 * sizeof *yv), tv = 3.0f;
            for (int64_t i = 0; i < n; i++)
                xv[i] = (float)((i % 255) - 127); /* exact in bf16 and fp16, as are 2x + 1 and y */
            for (int64_t i = 0; i < n2; i++)
                yv[i] = (float)(i % 251) * 0.25f;
            int64_t one = 1;
            ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 1, &n, xv), XTC_OK);
            ck_assert_int_eq(xtc_session_set_input(s, "y", XTC_F32, 1, &n2, yv), XTC_OK);
            ck_assert_int_eq(xtc_session_set_input(s, "t", XTC_F32, 1, &one, &tv), XTC_OK);
            ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
            XtcTensor a, b, c;
            ck_assert_int_eq(xtc_session_get_output(s, "a", &a), XTC_OK);
            ck_assert_int_eq(xtc_session_get_output(s, "b", &b), XTC_OK);
            ck_assert_int_eq(xtc_session_get_output(s, "c", &c), XTC_OK);
            for (int64_t i = 0; i < n; i++)
                expect_msg(((const float *)a.data)[i] == 2 * xv[i] + 1, "%s: a[%lld] = %g, expected %g", STORAGE_NAME[storage],
                              (long long)i, ((const float *)a.data)[i], 2 * xv[i] + 1);
            ck_assert_msg(((const float *)b.data)[0] == 3.5f, "%s: b = %g", STORAGE_NAME[storage], ((const float *)b.data)[0]);
            for (int64_t i = 0; i < n2; i++)
                expect_msg(((const float *)c.data)[i] == -yv[i], "%s: c[%lld] = %g, expected %g", STORAGE_NAME[storage],
                              (long long)i, ((const float *)c.data)[i], -yv[i]);
            free(xv);
            free(yv);
            xtc_session_free(s);
        }
        xtc_module_free(m);
        ir_graph_free(g);
    }
    storage = 0;
}
END_TEST

/* The host arena, where outputs come back, is registered with the driver (page-locked) while
 * the session holds it: once per session, again when it grows (the old range unregistered
 * first), and nothing stays registered after the session is freed. The emulated driver checks
 * registrations as the driver does (no overlap, only a registered start unregisters). */
static void build_pinned(IrGraph *g, IrDim b, IrDim n)
{
    (void)b;
    IrDim sx[] = {n, ir_dim(7)};
    out(g, "y", ir_binary(g, IR_MUL, input(g, "x", IR_F32, 2, sx), ir_const(g, 2.0, IR_F32)));
}

/* What a decoding call costs outside its kernels, in driver calls (rt_cuda_calls.c): the state
 * a row longer each call, carried on the device, nothing read back but at the end. After the
 * first calls a call uploads x, clears the status words, launches, downloads the status words and
 * synchronises once: no page-locking of host memory, and the arenas replanned (the device's
 * freed, synchronised, allocated) a logarithmic number of times, not at every call. */
START_TEST(test_decode_calls)
{
    setenv("XTC_CUDA_CALLS", "1", 1);
    enum { W = 64, CALLS = 40 }; /* rows of 256 bytes: each outgrows the arena's alignment */
    IrGraph *g = ir_graph_new("decode");
    IrDim n = ir_dim_sym(ir_graph_add_sym(g, "n", 64));
    IrDim ss[] = {n, ir_dim(W)}, sx[] = {ir_dim(1), ir_dim(W)};
    IrNode *next = ir_concat(g, ir_input(g, "state", IR_F32, 2, ss), ir_input(g, "x", IR_F32, 2, sx), 0);
    ir_output(g, "next", next);
    ir_output(g, "twice", ir_binary(g, IR_ADD, next, next));
    XtcModule *m = compile_target(g, "decode", "cuda-emu");
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    static float state[(CALLS + 1) * W];
    for (int i = 0; i < W; i++)
        state[i] = (float)i;
    int64_t rows = 1, sh[2] = {1, W}, xs[2] = {1, W};
    ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 2, sh, state), XTC_OK);
    uint64_t total[RT_CU_NCALLS] = {0};
    for (int t = 0; t < CALLS; t++) {
        float *x = state + rows * W;
        for (int i = 0; i < W; i++)
            x[i] = (float)(t * W + i) * 0.5f;
        RtCuCalls c0, c1;
        rt_cu_calls(&c0);
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, xs, x), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        rt_cu_calls(&c1);
        uint64_t c[RT_CU_NCALLS];
        for (int k = 0; k < RT_CU_NCALLS; k++)
            c[k] = c1.calls[k] - c0.calls[k];
        ck_assert_msg(c[RT_CU_CALL_REGISTER] == 0, "call %d: %llu registrations of host memory", t,
                      (unsigned long long)c[RT_CU_CALL_REGISTER]);
        ck_assert_msg(t == 0 || (c[RT_CU_CALL_HTOD] == 1 && c[RT_CU_CALL_DTOH] == 1 && c[RT_CU_CALL_MEMSET] == 1 &&
                                 c[RT_CU_CALL_DTOD] == 0 && c[RT_CU_CALL_SYNC] <= 1 + c[RT_CU_CALL_FREE]),
                      "call %d: %llu copies up, %llu down, %llu on the device, %llu memsets, %llu syncs", t,
                      (unsigned long long)c[RT_CU_CALL_HTOD], (unsigned long long)c[RT_CU_CALL_DTOH],
                      (unsigned long long)c[RT_CU_CALL_DTOD], (unsigned long long)c[RT_CU_CALL_MEMSET],
                      (unsigned long long)c[RT_CU_CALL_SYNC]);
        for (int k = 0; t >= 2 && k < RT_CU_NCALLS; k++)
            total[k] += c[k];
        rows++;
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
    }
    /* 38 calls growing the state from 3 rows to 41: the arena planned half as large again when
     * outgrown (4, 7, 12, 19, 30, 46 rows: 5 times), not at every call */
    ck_assert_msg(total[RT_CU_CALL_ALLOC] <= 6 && total[RT_CU_CALL_FREE] <= 6, "%d calls: %llu allocations, %llu frees",
                  CALLS - 2, (unsigned long long)total[RT_CU_CALL_ALLOC], (unsigned long long)total[RT_CU_CALL_FREE]);
    XtcTensor out;
    ck_assert_int_eq(xtc_session_get_output(s, "next", &out), XTC_OK);
    ck_assert_int_eq(out.shape[0], rows);
    for (int64_t i = 0; i < rows * W; i++)
        ck_assert_msg(((const float *)out.data)[i] == state[i], "next[%lld] %g, expected %g", (long long)i,
                      ((const float *)out.data)[i], state[i]);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
    unsetenv("XTC_CUDA_CALLS");
}
END_TEST

START_TEST(test_host_arena_registered)
{
    RtCuDriver drv;
    rt_cu_emulator(&drv);
    static char page[256];
    ck_assert_int_eq(drv.MemHostRegister(page, 128, 0), CUDA_SUCCESS);
    ck_assert_int_eq(drv.MemHostRegister(page + 64, 128, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    ck_assert_int_eq(drv.MemHostUnregister(page + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    ck_assert_int_eq(drv.MemHostUnregister(page), CUDA_SUCCESS);

    IrGraph *g = new_graph("pinned", build_pinned);
    XtcModule *m = compile_target(g, "pinned", "cuda-emu");
    int64_t r0, r;
    uint64_t b0, b;
    rt_cu_emu_registered(&r0, &b0);
    XtcSession *s = NULL, *s2 = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    rt_cu_emu_registered(&r, &b);
    /* registered once the runs have copied its size into it (cuda_host_arena), not before */
    ck_assert_msg(r == r0 && b == b0, "a new session: %lld ranges, %llu bytes registered", (long long)(r - r0),
                  (unsigned long long)(b - b0));
    static float x[250 * 7];
    for (int i = 0; i < 250 * 7; i++)
        x[i] = (float)(i % 97);
    int64_t sh[2] = {250, 7};
    for (int k = 0; k < 2; k++) { /* 7,000 bytes into an arena of 7,000 and its alignment */
        ck_assert_msg(xtc_session_set_input(s, "x", XTC_F32, 2, sh, x) == XTC_OK, "%s", xtc_session_error(s));
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        XtcTensor y;
        ck_assert_int_eq(xtc_session_get_output(s, "y", &y), XTC_OK);
        for (int64_t i = 0; i < sh[0] * 7; i++)
            ck_assert(((const float *)y.data)[i] == 2 * x[i]);
    }
    rt_cu_emu_registered(&r, &b);
    ck_assert_msg(r == r0 + 1 && b - b0 >= (uint64_t)sh[0] * 7 * 4, "n = %lld: %lld ranges, %llu bytes registered",
                  (long long)sh[0], (long long)(r - r0), (unsigned long long)(b - b0));
    /* a large arena that the runs copy little into (decoding: a token's logits a call) stays
     * unregistered: registering it would cost more than the copies through the driver's staging */
    ck_assert_int_eq(xtc_session_new(m, NULL, &s2), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s2, "x", XTC_F32, 2, sh, x), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s2), XTC_OK);
    rt_cu_emu_registered(&r, &b);
    int64_t after_big = r;
    for (int k = 0; k < 40; k++) { /* 40 runs of 3 rows: 3,360 bytes */
        int64_t small[2] = {3, 7};
        ck_assert_int_eq(xtc_session_set_input(s2, "x", XTC_F32, 2, small, x), XTC_OK);
        ck_assert_int_eq(xtc_session_run(s2), XTC_OK);
    }
    rt_cu_emu_registered(&r, &b);
    ck_assert_msg(r == after_big, "small runs registered %lld ranges", (long long)(r - after_big));
    xtc_session_free(s);
    xtc_session_free(s2);
    rt_cu_emu_registered(&r, &b);
    ck_assert_msg(r == r0 && b == b0, "after the sessions: %lld ranges, %llu bytes still registered", (long long)(r - r0),
                  (unsigned long long)(b - b0));
    xtc_module_free(m);
    /* 16-bit storage: the staging buffer of the conversions is registered, again when it grows;
     * the host arena is never copied into by the device (the outputs are widened into it) */
    storage = 1;
    m = compile_target(g, "pinned", "cuda-emu");
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    for (int k = 0; k < 2; k++) {
        int64_t hs[2] = {k ? 250 : 3, 7};
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, hs, x), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        rt_cu_emu_registered(&r, &b);
        ck_assert_msg(r == r0 + 1 && b - b0 >= (uint64_t)hs[0] * 7 * 2, "bf16, n = %lld: %lld ranges, %llu bytes",
                      (long long)hs[0], (long long)(r - r0), (unsigned long long)(b - b0));
    }
    xtc_session_free(s);
    rt_cu_emu_registered(&r, &b);
    ck_assert_msg(r == r0 && b == b0, "after the bf16 session: %lld ranges still registered", (long long)(r - r0));
    storage = 0;
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_device_carry)
{
    for (storage = 0; storage < 2; storage++) {
        IrNode *next;
        IrGraph *g = harness_carry_graph(&next);
        XtcModule *m = compile_target(g, "carry", "cuda-emu");
        XtcSession *s = NULL;
        ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
        float state[17 * 3] = {1, 2, 3};
        int64_t rows = 1, sh[2] = {1, 3}, xs[2] = {1, 3};
        ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 2, sh, state), XTC_OK);
        int in_place = 0;
        for (int t = 0; t < 6; t++) {
            float x[3] = {(float)t, t + 0.5f, -(float)t};
            uint64_t t0[3], t1[3];
            rt_cu_emu_traffic(t0);
            ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, xs, x), XTC_OK);
            ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
            rt_cu_emu_traffic(t1);
            if (t >= 2) /* the state stays on the device: only x goes up (2 bytes a value in bf16) */
                ck_assert_msg(t1[0] - t0[0] == (storage ? 6u : 12u), "call %d: %llu bytes to the device", t,
                              (unsigned long long)(t1[0] - t0[0]));
            memcpy(state + rows * 3, x, sizeof x);
            rows++;
            rt_cu_emu_traffic(t0);
            ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
            rt_cu_emu_traffic(t1);
            in_place += t1[2] == t0[2]; /* the run appended x over the state's memory: no copy */
            expect_rows(s, state, rows, "after the carry");
        }
        /* the first carry copies (the state was uploaded at its size), then the runs append in
         * place but for those that outgrow the room (a quarter more, and 256 bytes) */
        ck_assert_msg(in_place >= 4, "%s: %d carries of 6 without a copy", STORAGE_NAME[storage], in_place);
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK); /* twice: no change */
        float x[3] = {7, 8, 9};
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, xs, x), XTC_OK);
        ck_assert_int_eq(xtc_session_run(s), XTC_OK);
        memcpy(state + rows * 3, x, sizeof x);
        expect_rows(s, state, rows + 1, "carried twice");
        /* the input set from the host after a carry: its new value is uploaded */
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
        float fresh[2 * 3] = {-1, -2, -3, -4, -5, -6};
        ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 2, (int64_t[]){2, 3}, fresh), XTC_OK);
        ck_assert_int_eq(xtc_session_run(s), XTC_OK);
        float want[3 * 3] = {-1, -2, -3, -4, -5, -6, 7, 8, 9};
        expect_rows(s, want, 3, "set after the carry");
        xtc_session_free(s);
        /* a carry whose device memory cannot be allocated (the input's, uploaded at its size,
         * must grow) fails, and leaves the input unset rather than stale; the carry's other
         * allocations fail into a copy through the host or its own message */
        int device_failed = 0;
        for (long k = 0; k < 8 && !device_failed; k++) {
            ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
            ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 2, sh, state), XTC_OK);
            ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, xs, x), XTC_OK);
            ck_assert_int_eq(xtc_session_run(s), XTC_OK);
            rt_fault_fail_after(k);
            int st = xtc_session_carry(s, "next", "state");
            rt_fault_fail_after(-1);
            ck_assert_msg(st == XTC_OK || st == XTC_ERR_MEMORY, "%s", xtc_session_error(s));
            if (st == XTC_ERR_MEMORY && strstr(xtc_session_error(s), "device memory")) {
                ck_assert_int_eq(xtc_session_run(s), XTC_ERR_STATE);
                ck_assert_msg(strstr(xtc_session_error(s), "input 'state' is not set"), "%s", xtc_session_error(s));
                device_failed = 1;
            }
            xtc_session_free(s);
        }
        ck_assert_msg(device_failed, "no carry failed for device memory");
        xtc_module_free(m);
        ir_graph_free(g);
    }
    storage = 0;
    /* rows appended behind a leading dimension of 2: never written over the input (the old
     * rows of the second half would move), so the values stay right call after call */
    IrGraph *g = ir_graph_new("carry2");
    IrDim n = ir_dim_sym(ir_graph_add_sym(g, "n", 16));
    IrDim ss[] = {ir_dim(2), n, ir_dim(3)}, sx[] = {ir_dim(2), ir_dim(1), ir_dim(3)};
    out(g, "next", ir_concat(g, input(g, "state", IR_F32, 3, ss), input(g, "x", IR_F32, 3, sx), 1));
    XtcModule *m = compile_target(g, "carry2", "cuda-emu");
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    float st0[2 * 3] = {1, 2, 3, 4, 5, 6};
    ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 3, (int64_t[]){2, 1, 3}, st0), XTC_OK);
    for (int t = 0; t < 8; t++) {
        float x[2 * 3];
        for (int i = 0; i < 6; i++)
            x[i] = (float)(10 * (t + 1) + i);
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 3, (int64_t[]){2, 1, 3}, x), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
        XtcTensor nx;
        ck_assert_int_eq(xtc_session_get_output(s, "next", &nx), XTC_OK);
        ck_assert_int_eq(nx.shape[1], t + 2);
        for (int b = 0; b < 2; b++)
            for (int r = 0; r < t + 2; r++)
                for (int c = 0; c < 3; c++) {
                    float want = r == 0 ? st0[b * 3 + c] : (float)(10 * r + b * 3 + c);
                    ck_assert_msg(((const float *)nx.data)[(b * (t + 2) + r) * 3 + c] == want, "call %d: [%d, %d, %d]", t,
                                  b, r, c);
                }
    }
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_empty_sizes)
{
    static const int64_t empty[2][2] = {{2, 0}, {0, 3}};
    const OpCase *c;
    for (int i = 0; (c = sized_case(i)) != NULL; i++) {
        if (!(c->flags & OC_EMPTY))
            continue;
        char name[64];
        snprintf(name, sizeof name, "%s_empty", c->name);
        case_rtol = c->rtol;
        IrGraph *g = new_graph(name, c->build);
        XtcModule *m = compile_target(g, name, "cuda-emu");
        for (int k = 0; k < 2; k++)
            check_run(g, m, empty[k], name, "forward");
        xtc_module_free(m);
        ir_graph_free(g);
    }
}
END_TEST

/* every op has a case for CUDA: built by it, or made from it by the pass pipeline (run_case runs both) */
START_TEST(test_every_op_has_a_case)
{
    int op = op_cases_missing(OP_CASES, OP_NCASES, OC_CUDA, "cuda-emu");
    ck_assert_msg(op < 0, "op '%s' has no case for CUDA in tests/op_cases.h", op < 0 ? "" : ir_ops[op].name);
}
END_TEST

START_TEST(test_every_op_has_a_kernel)
{
    for (int op = 0; op < IR_NUM_OPS; op++)
        ck_assert_msg(cg_cuda_backend.supports((IrOp)op) || op_case_backend_exempt((IrOp)op, OC_CUDA),
                      "the cuda backend has no kernel for '%s'", ir_ops[op].name);
}
END_TEST


/* On a machine with a GPU: every case (_i % n) and its fused form on the device, through
 * libcuda.so.1, with f32, bf16 and fp16 storage (_i / n). */
START_TEST(test_gpu)
{
    int n = count_cases(sized_case);
    const OpCase *c = sized_case(_i % n);
    storage = _i / n;
    worst_err[storage] = 0;
    run_case(c, "cuda");
    if (storage == 0 && _i == 0) /* f32: the large matmul tiles, the many-tile attention, long reductions */
        for (int k = 0; once_case(k); k++)
            run_case(once_case(k), "cuda");
    if (storage)
        fprintf(stderr, "test_cuda: on the GPU, %s storage, case %s: worst error %.2f x 2^%d x max(1, max|ref|) (%s)\n",
                STORAGE_NAME[storage], c->name, worst_err[storage], storage == 1 ? -8 : -11, worst_what[storage]);
    storage = 0;
}
END_TEST

/* ---- the names the kernels declare ---- */

static int is_ident_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ident(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }

/* The next token of text at *p (an identifier or one character, comments skipped) into tok. */
static int next_token(const char **p, char *tok, size_t n)
{
    const char *s = *p;
    for (;;) {
        while (*s == ' ' || *s == '\n' || *s == '\t')
            s++;
        if (s[0] == '/' && s[1] == '*') {
            const char *e = strstr(s + 2, "*/");
            s = e ? e + 2 : s + strlen(s);
        } else if (s[0] == '/' && s[1] == '/') {
            s += strcspn(s, "\n");
        } else {
            break;
        }
    }
    if (!*s)
        return 0;
    size_t len = 1;
    if (is_ident_start(*s))
        while (is_ident(s[len]))
            len++;
    snprintf(tok, n, "%.*s", (int)len, s);
    *p = s + len;
    return 1;
}

static int is_type(const char *t)
{
    static const char *const types[] = {"int", "i64", "float", "unsigned", "u8", "xtc_fs", "double", "short", "long",
                                        "char", "uint32_t", "uint64_t", "int64_t", NULL};
    for (int i = 0; types[i]; i++)
        if (!strcmp(types[i], t))
            return 1;
    return 0;
}

/* Every name a kernel of text declares (after a type: the first declarator and those after commas
 * at the same depth) must be one cu_name_reserved knows, or a symbol of g (the kernels' parameters):
 * else a symbol of that name would be shadowed by the local. */
static void check_declared_names(const IrGraph *g, const char *text, const char *what)
{
    char tok[128], names[256][32];
    int ntok = 0;
    static char toks[1 << 16][128];
    const char *p = strstr(text, "XTC_KERNEL");
    ck_assert_msg(p != NULL, "%s: no kernel", what);
    while (ntok < (1 << 16) && next_token(&p, tok, sizeof tok))
        snprintf(toks[ntok++], sizeof toks[0], "%s", tok);
    int nnames = 0;
    for (int i = 0; i < ntok; i++) {
        if (!is_type(toks[i]))
            continue;
        int j = i + 1;
        while (j < ntok && (is_type(toks[j]) || !strcmp(toks[j], "*") || !strcmp(toks[j], "const") ||
                            !strcmp(toks[j], "__restrict__")))
            j++;
        if (j >= ntok || !is_ident_start(toks[j][0]))
            continue;
        if (nnames < 256)
            snprintf(names[nnames++], sizeof names[0], "%s", toks[j]);
        for (int k = j + 1, depth = 0; k < ntok; k++) { /* the other declarators of the declaration */
            const char *t = toks[k];
            if (strchr("([{", t[0]) && !t[1]) {
                depth++;
            } else if (strchr(")]}", t[0]) && !t[1]) {
                if (depth-- == 0)
                    break;
            } else if (depth == 0 && (!strcmp(t, ";"))) {
                break;
            } else if (depth == 0 && !strcmp(t, ",")) {
                int m = k + 1;
                while (m < ntok && !strcmp(toks[m], "*"))
                    m++;
                if (m >= ntok || is_type(toks[m]) || !strcmp(toks[m], "const"))
                    break; /* the next parameter */
                if (nnames < 256 && is_ident_start(toks[m][0]))
                    snprintf(names[nnames++], sizeof names[0], "%s", toks[m]);
            }
        }
        i = j;
    }
    for (int i = 0; i < nnames; i++) {
        int sym = 0;
        for (int s = 0; s < g->nsyms; s++)
            sym |= !strcmp(g->sym_name[s], names[i]);
        expect_msg(sym || cu_name_reserved(names[i]),
                   "%s: a kernel declares '%s', which cu_name_reserved does not know: a symbol of that name "
                   "would be shadowed", what, names[i]);
    }
    ck_assert_msg(nnames > 0, "%s: no declaration found", what);
}

/* Every kernel of every case, plain and through the pass pipeline (fused), f32 and bf16 storage
 * with tensor cores: the locals it declares are reserved names. */
START_TEST(test_declared_names_reserved)
{
    char err[1024];
    const OpCase *c;
    for (int i = 0; (c = sized_case(i)) != NULL; i++)
        for (int fused = 0; fused < 2; fused++) {
            IrGraph *g = new_graph(c->name, c->build), *h = g;
            if (fused) {
                PassOptions po = {.verify_each = 1};
                h = harness_passes(g, "cuda", &po, err, sizeof err);
                ck_assert_msg(h != NULL, "%s", err);
            }
            CgPlan plan;
            ck_assert_msg(cg_plan_build_views(h, &plan, 1, err, sizeof err) == 0, "%s", err);
            for (int st = 0; st < 2; st++) {
                CgOptions opt = {.output = "-", .dtype = st ? "bf16" : NULL};
                CuUnit u;
                ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &u, err, sizeof err) == 0, "%s", err);
                for (int k = 0; k < u.nkernels; k++)
                    check_declared_names(h, u.kernel_text[k], c->name);
                cg_cuda_unit_free(&u);
            }
            cg_plan_free(&plan);
            if (h != g)
                ir_graph_free(h);
            ir_graph_free(g);
        }
    /* and the reserved names include the numbered families */
    ck_assert(cu_name_reserved("t12") && cu_name_reserved("red3") && cu_name_reserved("c") && !cu_name_reserved("n") &&
              !cu_name_reserved("batch_size") && !cu_name_reserved("t1x"));
}
END_TEST

/* The same of the tensor-core attention (not op table rows: flash_cases.h), whose bodies are
 * kernels/flash_fwd.cuh and flash_bwd.cuh with 16-bit storage of the mma's format (every name of
 * theirs is reserved: nc, the backward's tile loop, is) and the converting kernels with f32. */
START_TEST(test_flash_names_reserved)
{
    char err[1024];
    ck_assert(cu_name_reserved("nc") && cu_name_reserved("lt") && cu_name_reserved("fb_ls") && !cu_name_reserved("b"));
    static const BuildFn flash[] = {build_flash, build_flash16, build_flash16_bounded, build_flash_grad16};
    for (size_t f = 0; f < sizeof flash / sizeof flash[0]; f++) {
        IrGraph *g = new_graph("flash", flash[f]);
        CgPlan plan;
        ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
        for (int st = 0; st <= 2; st++) {
            CgOptions opt = {.output = "-", .mma = st == 2 ? CG_MMA_FP16 : CG_MMA_BF16, .dtype = STORAGE_NAME[st]};
            CuUnit u;
            ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &u, err, sizeof err) == 0, "%s", err);
            for (int k = 0; k < u.nkernels; k++)
                check_declared_names(g, u.kernel_text[k], "flash");
            cg_cuda_unit_free(&u);
        }
        cg_plan_free(&plan);
        ir_graph_free(g);
    }
}
END_TEST

/* FlashAttention-2's preprocessing through a step's scratch buffer (CgStep.scratch): with 16-bit
 * storage of the mma's format, the CUDA backends give every attention_grad step of
 * build_flash_grad16 (kernels/flash_bwd.cuh's, all 11) an f32 scratch of q's batch dims and rows,
 * and no other step; the metadata lists it as a temp of that step alone, "<label>.scratch" (so
 * the runtime's arena places it); the kernel takes it after its operands and reads each row's
 * dlse_i - D_i from it, and the module's source has xtc_fb_pre (kernels/flash_pre.cuh), which
 * the schedule launches before it. f32 storage (the register-staged backward) and the cpu
 * backend take none. The values: test_cuda_mma's test_flash_grad16 (modules compiled by cg_compile). */
START_TEST(test_flash_scratch)
{
    IrGraph *g = harness_new_graph("flash", build_flash_grad16, 256);
    static const char *const storage_names[] = {"f32", "bf16", "fp16"};
    ck_assert_ptr_null(cg_llvm_backend.scratch);
    for (int st = 0; st <= 2; st++)
        for (int emu = 0; emu < 2; emu++) {
            const CgBackend *be = emu ? &cg_cuda_emu_backend : &cg_cuda_backend;
            CgOptions opt = {.output = "-", .mma = st == 2 ? CG_MMA_FP16 : CG_MMA_BF16, .dtype = storage_names[st]};
            CgPlan plan;
            char err[1024];
            ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
            int nbufs = plan.nbufs, added = 0;
            for (int s = 0; s < plan.nsteps; s++) {
                const IrNode *x = plan.steps[s].node;
                IrDim shape[IR_MAXRANK];
                int rank = be->scratch(&plan, s, &opt, shape, err, sizeof err);
                ck_assert_int_eq(rank, st && x->op == IR_ATTENTION_GRAD ? x->in[0]->rank - 1 : 0);
                for (int d = 0; d < rank; d++)
                    ck_assert(ir_dim_eq(shape[d], x->in[0]->shape[d]));
                if (rank > 0) {
                    ck_assert_int_eq(cg_plan_add_scratch(&plan, s, rank, shape), nbufs + added);
                    ck_assert_int_eq(cg_plan_add_scratch(&plan, s, rank, shape), -1); /* one a step */
                    added++;
                }
            }
            ck_assert_int_eq(added, st ? 11 : 0);
            char *meta = cg_plan_meta(&plan, NULL, 0);
            ck_assert_ptr_nonnull(meta);
            int found = 0;
            for (const char *p = strstr(meta, ".scratch "); p; p = strstr(p + 1, ".scratch "))
                found++;
            ck_assert_int_eq(found, added);
            for (int s = 0; s < plan.nsteps; s++) {
                const CgStep *sp = &plan.steps[s];
                if (sp->scratch < 0)
                    continue;
                char want[200], dims[96] = "[", d[32], label[32];
                const IrNode *q = sp->node->in[0];
                for (int k = 0; k + 1 < q->rank; k++)
                    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s", k ? "," : "",
                             ir_dim_str(g, q->shape[k], d, sizeof d));
                snprintf(label, sizeof label, "t%d", sp->node->id);
                snprintf(want, sizeof want, "buffer %d temp %s.scratch f32 %s] %d %d\n", sp->scratch,
                         sp->node->label ? sp->node->label : label, dims, s, s);
                ck_assert_msg(strstr(meta, want), "no '%s' in the metadata:\n%s", want, meta);
            }
            free(meta);
            CuUnit cu;
            ck_assert_msg(cg_cuda_render_unit(&plan, &opt, emu, &cu, err, sizeof err) == 0, "%s", err);
            for (int s = 0; s < plan.nsteps; s++) {
                const CgStep *sp = &plan.steps[s];
                ck_assert_int_eq(cu.geom[sp->kernel].pre[0] != 0, sp->scratch >= 0);
                if (sp->scratch >= 0) {
                    const char *text = cu.kernel_text[sp->kernel];
                    ck_assert(strstr(text, "float *__restrict__ scratch") && strstr(text, "scratch[batch * I + i]"));
                    ck_assert(!strstr(text, "dsum")); /* no D_i sums left in the backward */
                }
            }
            ck_assert_int_eq(strstr(cu.source, "XTC_KERNEL xtc_fb_pre(") != NULL, st != 0);
            ck_assert_int_eq(cu.nlib, st ? 1 : 0); /* not a training graph: no AdamW */
            cg_cuda_unit_free(&cu);
            cg_plan_free(&plan);
        }
    ir_graph_free(g);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_every_op_has_a_kernel);
    tcase_add_test(tc, test_every_op_has_a_case);
    tcase_add_test(tc, test_declared_names_reserved);
    tcase_add_test(tc, test_head_views);
    tcase_add_loop_test(tc, test_case, 0, count_cases(sized_case));
    tcase_add_loop_test(tc, test_case_once, 0, count_cases(once_case));
    tcase_add_test(tc, test_empty_sizes);
    tcase_add_test(tc, test_widen_outputs);
    suite_add_tcase(s, tc);
    TCase *host = tcase_create("host"); /* the runtime's side: CK_RUN_CASE=host runs it alone */
    tcase_set_timeout(host, 300);
    tcase_add_test(host, test_device_carry);
    tcase_add_test(host, test_host_arena_registered);
    tcase_add_test(host, test_decode_calls);
    suite_add_tcase(s, host);
    /* ctest runs it as test_cuda_half (CK_RUN_CASE=half), beside the rest (CK_EXCLUDE_TAGS=half) */
    TCase *half = tcase_create("half");
    tcase_set_tags(half, "half");
    tcase_set_timeout(half, 900);
    tcase_add_loop_test(half, test_case_half, 0, 2 * count_cases(sized_case));
    suite_add_tcase(s, half);
    char why[1200];
    if (gpu_present(why, sizeof why)) { /* on a machine with a GPU; CK_RUN_CASE=gpu runs it alone */
        TCase *gpu = tcase_create("gpu");
        tcase_set_timeout(gpu, 900);
        tcase_add_loop_test(gpu, test_gpu, 0, 3 * count_cases(sized_case));
        suite_add_tcase(s, gpu);
    } else {
        fprintf(stderr, "test_cuda: GPU runs SKIPPED (not counted): %s; the kernels were checked through the emulator\n",
                why);
    }
    TCase *kept = tcase_create("kept"); /* no compile: CK_RUN_CASE=kept runs it alone */
    tcase_add_test(kept, test_kept_f32);
    tcase_add_test(kept, test_flash_names_reserved);
    tcase_add_test(kept, test_decode_bounded);
    tcase_add_test(kept, test_flash_scratch);
    suite_add_tcase(s, kept);
    TCase *arena = tcase_create("arena"); /* CK_RUN_CASE=arena runs it alone */
    tcase_set_timeout(arena, 300);
    tcase_add_test(arena, test_half_arena);
    suite_add_tcase(s, arena);
    return s;
}

int main(void)
{
    return harness_run(suite(), "cuda");
}
