/* test_cuda_runtime.c: the CUDA path below the kernels, without a GPU: the 16-bit conversions
 * (the runtime's and the CUDA prelude's, against brute force), the emulator itself on
 * hand-written kernels (barriers, shuffles, votes, atomics, and the errors it reports), the
 * runtime's errors (bad indices through the status words, no CUDA driver, a driver without a
 * device), and the profile's events (emulated, and the runtime's per-step profile).
 * test_cuda checks the generated kernels against the interpreter. */

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

static void make_tmpdir(void) { harness_make_tmpdir("cuda_runtime"); }

#include "cuda_case.h"


/* ---- the conversions ---- */

static void *build_so(const char *name, const char *source, const char *extra);

/* The value nearest to x among bf16 numbers, ties to even, by brute force in double: the
 * reference rt_f32_to_bf16 (and the prelude) must agree with. */
static uint16_t bf16_nearest(float x)
{
    uint32_t u = rt_f32_bits(x);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40u);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* truncated, and one up (away from 0) */
    /* infinity, one up from the largest finite, stands for 2^128 (IEEE overflow rounding) */
    double vh = (hi & 0x7fffu) == 0x7f80u ? copysign(ldexp(1, 128), x) : (double)rt_bf16_to_f32(hi);
    double dl = fabs((double)rt_bf16_to_f32(lo) - x), dh = fabs(vh - x);
    if ((u & 0xffffu) == 0)
        return lo;
    return dh < dl || (dh == dl && (hi & 1) == 0) ? hi : lo;
}

/* The prelude's conversions (compiled as the emulator compiles kernels) against runtime/rt_half.h,
 * and rt_half.h against independent references (brute-force nearest for bf16, the compiler's
 * _Float16 for fp16): every 16-bit pattern widened and narrowed back, the midpoints between
 * neighbours (ties go to even), edge values (subnormals, the largest finite, overflow, NaN,
 * infinities, signed zeros) and random f32 bit patterns. */
START_TEST(test_half_conversions)
{
    for (int st = 1; st <= 2; st++) {
        char *src = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&src, &len);
        fprintf(f, "#include \"xtc_cuda_emu.h\"\n");
        IrGraph *empty = ir_graph_new("conversions");
        cu_prelude(f, empty, 0, st);
        ir_graph_free(empty);
        fprintf(f, "void narrow(const float *in, unsigned short *out, long n)\n{\n"
                   "    for (long i = 0; i < n; i++)\n        xtc_st(out, i, in[i]);\n}\n"
                   "void widen(const unsigned short *in, float *out, long n)\n{\n"
                   "    for (long i = 0; i < n; i++)\n        out[i] = xtc_ld(in, i);\n}\n");
        fclose(f);
        void *dl = build_so(st == 1 ? "conv_bf16" : "conv_fp16", src, "");
        free(src);
        void (*narrow)(const float *, unsigned short *, long) = (void (*)(const float *, unsigned short *, long))dlsym(dl, "narrow");
        void (*widen)(const unsigned short *, float *, long) = (void (*)(const unsigned short *, float *, long))dlsym(dl, "widen");
        ck_assert(narrow && widen);
        enum { NRAND = 200000 };
        long n = 0, cap = 65536 * 2 + NRAND + 64;
        float *x = malloc((size_t)cap * sizeof *x);
        unsigned short *h = malloc((size_t)cap * sizeof *h), *all = malloc(65536 * sizeof *all);
        float *w = malloc(65536 * sizeof *w);
        for (long i = 0; i < 65536; i++)
            all[i] = (unsigned short)i;
        widen(all, w, 65536);
        float *bulk = malloc(65536 * sizeof *bulk); /* the runtime's download path */
        rt_half_widen(st, all, bulk, 65536);
        for (long i = 0; i < 65536; i++) {
            float r = rt_half_to_f32(st, (uint16_t)i);
            ck_assert_msg(rt_f32_bits(bulk[i]) == rt_f32_bits(r), "%s 0x%04lx widens to %a in rt_half_widen, %a one by one",
                          STORAGE_NAME[st], i, bulk[i], r);
            ck_assert_msg(rt_f32_bits(w[i]) == rt_f32_bits(r) || (isnan(w[i]) && isnan(r)),
                          "%s 0x%04lx widens to %a in the prelude, %a in rt_half.h", STORAGE_NAME[st], i, w[i], r);
            if (!isnan(r)) {
                x[n++] = r;
                uint16_t next = (uint16_t)(i + 1);
                float rn = rt_half_to_f32(st, next);
                if ((i & 0x7fff) != 0x7fff && !isnan(rn) && !isinf(rn) && !isinf(r))
                    x[n++] = (float)(((double)r + rn) / 2); /* a tie */
            }
        }
        static const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f,
                                     2.98023224e-8f, 2.98023259e-8f, 5.96046448e-8f, 6.09755516e-5f, 6.10351562e-5f,
                                     3.38953139e38f, 3.40282347e38f, 1e-45f, 1.17549435e-38f};
        for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
            x[n++] = edge[i];
        x[n++] = INFINITY;
        x[n++] = -INFINITY;
        x[n++] = NAN;
        x[n++] = -NAN;
        for (int i = 0; i < NRAND; i++)
            x[n++] = rt_bits_f32((uint32_t)rnd());
        narrow(x, h, n);
        for (long i = 0; i < n; i++) {
            uint16_t r = rt_f32_to_half(st, x[i]);
            ck_assert_msg(h[i] == r, "%s: %a narrows to 0x%04x in the prelude, 0x%04x in rt_half.h",
                          STORAGE_NAME[st], x[i], h[i], r);
            if (isnan(x[i])) {
                ck_assert_msg(isnan(rt_half_to_f32(st, r)), "%s: NaN narrows to a number", STORAGE_NAME[st]);
                continue;
            }
            uint16_t want = r;
            if (st == 1) {
                want = bf16_nearest(x[i]);
            } else {
#ifdef __FLT16_MAX__
                _Float16 v = (_Float16)x[i];
                memcpy(&want, &v, sizeof want);
#endif
            }
            ck_assert_msg(r == want, "%s: %a rounds to 0x%04x, the nearest (ties to even) is 0x%04x",
                          STORAGE_NAME[st], x[i], r, want);
        }
        free(x);
        free(h);
        free(all);
        free(w);
        free(bulk);
        dlclose(dl);
    }
#ifndef __FLT16_MAX__
    fprintf(stderr, "test_cuda: this compiler has no _Float16: fp16 rounding checked against the prelude only\n");
#endif
}
END_TEST


/* ---- the emulator on hand-written kernels ---- */

/* CUDA C exercising the emulator, compiled with it like a cuda-emu module; each kernel has a
 * call function from cuLaunchKernel-style arguments and a row in test_kernels[]. */
static const char emu_test_source[] =
    "#include \"xtc_cuda_emu.h\"\n"
    "/* out[i] = in[n - 1 - i] through shared memory */\n"
    "XTC_KERNEL reverse(const float *in, float *out, int barrier)\n"
    "{\n"
    "    __shared__ float sh[256];\n"
    "    int t = threadIdx.x, n = blockDim.x;\n"
    "    sh[t] = in[blockIdx.x * n + t];\n"
    "    if (barrier)\n"
    "        __syncthreads();\n"
    "    out[blockIdx.x * n + t] = sh[n - 1 - t];\n"
    "}\n"
    "static void call_reverse(void **a) { reverse(*(const float **)a[0], *(float **)a[1], *(int *)a[2]); }\n"
    "/* warp operations: per lane, 8 results */\n"
    "XTC_KERNEL warp_ops(const int *in, int *out)\n"
    "{\n"
    "    int t = threadIdx.x, v = in[t];\n"
    "    int *o = out + 8 * t;\n"
    "    o[0] = __shfl_sync(0xffffffffu, v, 5);\n"
    "    o[1] = __shfl_sync(0xffffffffu, v, t + 3, 8);\n"
    "    o[2] = __shfl_xor_sync(0xffffffffu, v, 6);\n"
    "    o[3] = __shfl_up_sync(0xffffffffu, v, 3);\n"
    "    o[4] = __shfl_down_sync(0xffffffffu, v, 2, 16);\n"
    "    o[5] = (int)__ballot_sync(0xffffffffu, v & 1);\n"
    "    o[6] = __any_sync(0xffffffffu, v == 7) + 2 * __all_sync(0xffffffffu, v >= 0);\n"
    "    __syncwarp(0xffffffffu);\n"
    "    o[7] = (int)__float_as_int(__shfl_xor_sync(0xffffffffu, (float)v * 0.5f, 1));\n"
    "}\n"
    "static void call_warp_ops(void **a) { warp_ops(*(const int **)a[0], *(int **)a[1]); }\n"
    "/* atomics from every thread of every block */\n"
    "XTC_KERNEL atomics(float *f, int *i, unsigned long long *u)\n"
    "{\n"
    "    atomicAdd(f, 0.5f);\n"
    "    atomicAdd(&i[0], 1);\n"
    "    atomicMax(&i[1], (int)(blockIdx.x * blockDim.x + threadIdx.x));\n"
    "    atomicMin(&i[2], -(int)threadIdx.x);\n"
    "    atomicOr(&i[3], 1 << (threadIdx.x % 31));\n"
    "    int old = atomicCAS(&i[4], 0, 7);\n"
    "    atomicAdd(&i[5], old == 0);\n"
    "    atomicAdd(u, 3ull);\n"
    "}\n"
    "static void call_atomics(void **a) { atomics(*(float **)a[0], *(int **)a[1], *(unsigned long long **)a[2]); }\n"
    "/* coordinates of every thread of a 3-D grid of 3-D blocks */\n"
    "XTC_KERNEL coords(int *out)\n"
    "{\n"
    "    int bl = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;\n"
    "    int th = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;\n"
    "    int n = blockDim.x * blockDim.y * blockDim.z;\n"
    "    out[bl * n + th] = (int)(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z + 1000 * blockIdx.x +\n"
    "                              10000 * blockIdx.y + 100000 * blockIdx.z);\n"
    "}\n"
    "static void call_coords(void **a) { coords(*(int **)a[0]); }\n"
    "/* what the emulator must refuse */\n"
    "XTC_KERNEL divergent_barrier(int *x) { if (threadIdx.x < 32) __syncthreads(); x[0] = 1; }\n"
    "static void call_divergent_barrier(void **a) { divergent_barrier(*(int **)a[0]); }\n"
    "XTC_KERNEL exited_lane(int *x) { if (threadIdx.x == 3) return; x[0] = __shfl_xor_sync(0xffffffffu, 1, 1); }\n"
    "static void call_exited_lane(void **a) { exited_lane(*(int **)a[0]); }\n"
    "XTC_KERNEL outside_mask(int *x) { if (threadIdx.x < 16) x[0] = __shfl_sync(0x0000ffffu, 1, 20); }\n"
    "static void call_outside_mask(void **a) { outside_mask(*(int **)a[0]); }\n"
    "XTC_KERNEL mixed_ops(int *x) { if (threadIdx.x & 1) x[0] = __ballot_sync(0xffffffffu, 1); else x[1] = __shfl_sync(0xffffffffu, 1, 0); }\n"
    "static void call_mixed_ops(void **a) { mixed_ops(*(int **)a[0]); }\n"
    "const XtcEmuKernel test_kernels[] = {\n"
    "    {\"reverse\", call_reverse, 1}, {\"warp_ops\", call_warp_ops, 1}, {\"atomics\", call_atomics, 0},\n"
    "    {\"coords\", call_coords, 0}, {\"divergent_barrier\", call_divergent_barrier, 1},\n"
    "    {\"exited_lane\", call_exited_lane, 1}, {\"outside_mask\", call_outside_mask, 1},\n"
    "    {\"mixed_ops\", call_mixed_ops, 1}, {\"barrier_free\", call_reverse, 0},\n"
    "};\n"
    "int32_t (*const test_launch)(const XtcEmuKernel *, const XtcEmuLaunch *, void **) = xtc_emu_launch;\n"
    "void (*const test_release)(void *) = xtc_emu_release;\n";

enum { K_REVERSE, K_WARP, K_ATOMICS, K_COORDS, K_DIVERGENT, K_EXITED, K_OUTSIDE, K_MIXED, K_BARRIER_FREE };


/* Compiles source (C with the emulator header) into a shared library and loads it. */
static void *build_so(const char *name, const char *source, const char *extra)
{
    make_tmpdir();
    char flags[512];
    snprintf(flags, sizeof flags, "-std=gnu11 -O1 -fPIC -shared -w %s", extra);
    return emu_build_so(name, source, flags);
}

static void emu_open(EmuLib *e, const char *extra)
{
    emu_bind(e, build_so(extra[0] ? "emu_tests_ucontext" : "emu_tests", emu_test_source, extra));
}

static void check_emulator(const char *extra)
{
    EmuLib e;
    emu_open(&e, extra);
    /* barriers: correct in every order with the barrier, wrong in forward and reverse without */
    float in[512], outv[512];
    for (int i = 0; i < 512; i++)
        in[i] = (float)i + 0.25f;
    const float *pin = in;
    float *pout = outv;
    for (int order = 0; order < 3; order++) {
        int barrier = 1;
        void *args[] = {&pin, &pout, &barrier};
        ck_assert_msg(emu_run(&e, K_REVERSE, 2, 256, order, args) == 0, "%s", e.err);
        for (int i = 0; i < 512; i++)
            ck_assert(outv[i] == in[i / 256 * 256 + 255 - i % 256]);
    }
    for (int order = 0; order < 2; order++) {
        for (int i = 0; i < 512; i++)
            in[i] = (float)(i * (order + 3));
        int barrier = 0, wrong = 0;
        void *args[] = {&pin, &pout, &barrier};
        ck_assert_msg(emu_run(&e, K_REVERSE, 2, 256, order, args) == 0, "%s", e.err);
        for (int i = 0; i < 512; i++)
            wrong += outv[i] != in[i / 256 * 256 + 255 - i % 256];
        ck_assert_msg(wrong > 0, "a missing __syncthreads went unnoticed with threads in %s order", ORDERS[order]);
    }
    /* warp operations against their definitions */
    int iv[64], io[64 * 8];
    for (int i = 0; i < 64; i++)
        iv[i] = (int)(rnd() % 9);
    const int *piv = iv;
    int *pio = io;
    void *wargs[] = {&piv, &pio};
    ck_assert_msg(emu_run(&e, K_WARP, 1, 64, XTC_EMU_SHUFFLED, wargs) == 0, "%s", e.err);
    for (int t = 0; t < 64; t++) {
        int w = t & ~31, l = t & 31, *o = io + 8 * t;
        unsigned ballot = 0;
        int any = 0, all = 1;
        for (int k = 0; k < 32; k++) {
            ballot |= (unsigned)(iv[w + k] & 1) << k;
            any |= iv[w + k] == 7;
            all &= iv[w + k] >= 0;
        }
        ck_assert_int_eq(o[0], iv[w + 5]);
        ck_assert_int_eq(o[1], iv[w + (l & ~7) + ((l + 3) & 7)]);
        ck_assert_int_eq(o[2], iv[w + (l ^ 6)]);
        ck_assert_int_eq(o[3], iv[w + (l >= 3 ? l - 3 : l)]);
        ck_assert_int_eq(o[4], iv[w + ((l & 15) + 2 < 16 ? l + 2 : l)]);
        ck_assert_int_eq((unsigned)o[5], ballot);
        ck_assert_int_eq(o[6], any + 2 * all);
        float half = (float)iv[w + (l ^ 1)] * 0.5f;
        int bits;
        memcpy(&bits, &half, sizeof bits);
        ck_assert_int_eq(o[7], bits);
    }
    /* atomics over several blocks */
    float fsum = 0;
    int ints[6] = {0, -1, 0, 0, 0, 0};
    unsigned long long u = 0;
    float *pf = &fsum;
    int *pi = ints;
    unsigned long long *pu = &u;
    void *aargs[] = {&pf, &pi, &pu};
    ck_assert_msg(emu_run(&e, K_ATOMICS, 3, 96, XTC_EMU_FORWARD, aargs) == 0, "%s", e.err);
    ck_assert(fsum == 144.0f);
    ck_assert_int_eq(ints[0], 288);
    ck_assert_int_eq(ints[1], 287);
    ck_assert_int_eq(ints[2], -95);
    ck_assert_int_eq(ints[3], 0x7fffffff);
    ck_assert_int_eq(ints[4], 7);
    ck_assert_int_eq(ints[5], 1);
    ck_assert(u == 864);
    /* 3-D grids and blocks */
    int coords[2 * 3 * 2 * 4 * 2 * 3];
    int *pc = coords;
    void *cargs[] = {&pc};
    XtcEmuLaunch l3 = {{2, 3, 2}, {4, 2, 3}, XTC_EMU_REVERSE, &e.cache, e.err, sizeof e.err};
    ck_assert_msg(e.launch(&e.kernels[K_COORDS], &l3, cargs) == 0, "%s", e.err);
    for (int bz = 0, i = 0; bz < 2; bz++)
        for (int by = 0; by < 3; by++)
            for (int bx = 0; bx < 2; bx++)
                for (int tz = 0; tz < 3; tz++)
                    for (int ty = 0; ty < 2; ty++)
                        for (int tx = 0; tx < 4; tx++, i++)
                            ck_assert_int_eq(coords[i], tx + 10 * ty + 100 * tz + 1000 * bx + 10000 * by + 100000 * bz);
    /* what CUDA leaves undefined is an error here, with a message */
    int x[2] = {0, 0};
    int *px = x;
    void *xargs[] = {&px};
    static const struct {
        int kernel;
        unsigned block;
        const char *needle;
    } bad[] = {
        {K_DIVERGENT, 64, "exited while"},
        {K_EXITED, 32, "exited while lane"},
        {K_OUTSIDE, 32, "not in the mask"},
        {K_MIXED, 32, "different warp operations"},
        {K_REVERSE, 2048, "bad block size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void **args = bad[i].kernel == K_REVERSE ? (void *[]){&pin, &pout, &(int){1}} : xargs;
        ck_assert_int_eq(emu_run(&e, bad[i].kernel, 1, bad[i].block, XTC_EMU_FORWARD, args), -1);
        ck_assert_msg(strstr(e.err, bad[i].needle), "expected '%s' in: %s", bad[i].needle, e.err);
    }
    void *fargs[] = {&pin, &pout, &(int){1}};
    ck_assert_int_eq(emu_run(&e, K_BARRIER_FREE, 1, 64, XTC_EMU_FORWARD, fargs), -1);
    ck_assert_msg(strstr(e.err, "barrier-free"), "%s", e.err);
    XtcEmuLaunch l0 = {{0, 1, 1}, {32, 1, 1}, 0, &e.cache, e.err, sizeof e.err};
    ck_assert_int_eq(e.launch(&e.kernels[K_COORDS], &l0, cargs), -1);
    ck_assert_msg(strstr(e.err, "bad grid size"), "%s", e.err);
    emu_close(&e);
}

START_TEST(test_emulator)
{
    check_emulator("");
}
END_TEST

/* the portable context switch: ucontext */
START_TEST(test_emulator_ucontext)
{
    check_emulator("-DXTC_EMU_UCONTEXT");
}
END_TEST

/* ---- the runtime: bad values found by kernels, drivers that are missing or have no device ---- */

static void build_checked(IrGraph *g, IrDim b, IrDim n)
{
    IrDim st[] = {ir_dim(11), ir_dim(8)}, si[] = {b, n};
    IrNode *table = ir_param(g, "emb", 2, st);
    /* ids computed in the graph can only be checked while running */
    IrNode *ids = ir_binary(g, IR_ADD, input(g, "offs", IR_I64, 2, si), ir_const(g, 5, IR_I64));
    out(g, "emb", ir_gather(g, table, ids));
    out(g, "quot", ir_binary(g, IR_DIV, input(g, "num", IR_I32, 2, si), input(g, "divisor", IR_I32, 2, si)));
    IrDim sz[] = {b, n, ir_dim(6)};
    out(g, "loss", ir_xent(g, input(g, "z", IR_F32, 3, sz), ir_binary(g, IR_SUB, input(g, "tg", IR_I64, 2, si),
                                                                       ir_const(g, 1, IR_I64))));
}

static XtcSession *checked_session(XtcModule *m, const int64_t *offs, const int32_t *divisor, const int64_t *tg)
{
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s", xtc_session_error(s));
    int64_t shape[2] = {1, 3}, wshape[2] = {11, 8}, zshape[3] = {1, 3, 6};
    float w[88] = {0}, z[18] = {0};
    int32_t num[3] = {7, -7, 9};
    ck_assert_int_eq(xtc_session_set_weight(s, "emb", 2, wshape, w), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "offs", XTC_I64, 2, shape, offs), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "num", XTC_I32, 2, shape, num), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "divisor", XTC_I32, 2, shape, divisor), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "z", XTC_F32, 3, zshape, z), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "tg", XTC_I64, 2, shape, tg), XTC_OK);
    return s;
}

START_TEST(test_bad_values)
{
    IrGraph *g = new_graph("checked", build_checked);
    XtcModule *m = compile_target(g, "checked", "cuda-emu");
    static const struct {
        int64_t offs[3];
        int32_t divisor[3];
        int64_t tg[3];
        const char *needle; /* NULL: runs */
    } runs[] = {
        {{0, 1, 5}, {1, 2, -1}, {0, 1, 6}, NULL},
        {{0, 6, 1}, {1, 2, -1}, {0, 1, 6}, "gather"},
        {{0, 1, 1}, {1, 0, -1}, {0, 1, 6}, "division by zero"},
        {{0, 1, 1}, {1, 2, 3}, {0, 7, 1}, "cross_entropy"},
        {{0, -6, 1}, {1, 2, 3}, {0, 1, 1}, "gather"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        XtcSession *s = checked_session(m, runs[i].offs, runs[i].divisor, runs[i].tg);
        int st = xtc_session_run(s);
        if (!runs[i].needle) {
            ck_assert_msg(st == XTC_OK, "%s", xtc_session_error(s));
            XtcTensor t;
            ck_assert_int_eq(xtc_session_get_output(s, "quot", &t), XTC_OK);
            ck_assert(((const int32_t *)t.data)[0] == 7 && ((const int32_t *)t.data)[1] == -3 &&
                      ((const int32_t *)t.data)[2] == -9);
        } else {
            ck_assert_msg(st == XTC_ERR_RANGE, "run %zu: status %s: %s", i, xtc_status_name(st), xtc_session_error(s));
            ck_assert_msg(strstr(xtc_session_error(s), runs[i].needle), "run %zu: %s", i, xtc_session_error(s));
        }
        xtc_session_free(s);
    }
    xtc_module_free(m);
    ir_graph_free(g);
    /* relpos_bucket with an undefined bucket (max_distance = max_exact: log 1 / log 1) */
    IrGraph *h = ir_graph_new("relpos_undefined");
    int sn = ir_graph_add_sym(h, "n", 64);
    IrDim si[] = {ir_dim_sym(sn)};
    ir_output(h, "x", ir_cast(h, ir_input(h, "x", IR_I64, 1, si), IR_F32));
    ir_output(h, "r", ir_relpos(h, ir_dim_sym(sn), ir_dim_sym(sn), 8, 4, 1));
    m = compile_target(h, "relpos_undefined", "cuda-emu");
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    int64_t xs[6] = {0}, shape[1] = {6};
    ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_I64, 1, shape, xs), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_RANGE);
    ck_assert_msg(strstr(xtc_session_error(s), "relpos_bucket"), "%s", xtc_session_error(s));
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(h);
}
END_TEST

/* A stand-in for libcuda.so.1: every function the runtime looks up, cuInit answering `init`
 * (100: no device); `skip` leaves one function out. Loading it touches `marker`. */
static void build_fake_driver(const char *name, int init, const char *skip, const char *marker)
{
    static const char *const fns[] = {
        "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceGetAttribute",
        "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent", "cuStreamCreate",
        "cuStreamDestroy_v2", "cuStreamSynchronize", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8Async", "cuModuleLoadDataEx", "cuModuleUnload",
        "cuModuleGetFunction", "cuLaunchKernel", "cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventSynchronize",
        "cuEventElapsedTime", "cuGetErrorString", NULL};
    char src[8192];
    size_t len = (size_t)snprintf(src, sizeof src,
                                  "#include <stdio.h>\n"
                                  "__attribute__((constructor)) static void loaded(void) { FILE *f = fopen(\"%s\", \"w\"); "
                                  "if (f) fclose(f); }\n"
                                  "int cuInit(unsigned f) { (void)f; return %d; }\n"
                                  "int cuGetErrorString(int e, const char **s) { *s = e == 100 ? \"no CUDA-capable "
                                  "device is detected\" : \"error\"; return 0; }\n",
                                  marker, init);
    for (int i = 1; fns[i] && len < sizeof src; i++)
        if ((!skip || strcmp(skip, fns[i])) && strcmp(fns[i], "cuGetErrorString"))
            len += (size_t)snprintf(src + len, sizeof src - len, "int %s(void) { return 999; }\n", fns[i]);
    ck_assert_msg(!skip || (strcmp(skip, "cuInit") && strcmp(skip, "cuGetErrorString")), "cannot leave %s out", skip);
    dlclose(build_so(name, src, ""));
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

START_TEST(test_no_driver)
{
    char why[1200];
    if (!cg_nvrtc_available(NULL, 0, why, sizeof why)) {
        /* test_cuda_nvrtc fails for a missing toolkit; here it only means no PTX module to load */
        fprintf(stderr, "test_cuda: test_no_driver skipped: %s\n", why);
        return;
    }
    IrGraph *g = new_graph("matmul_nodriver", build_matmul);
    XtcModule *m = compile_target(g, "matmul_nodriver", "cuda");
    char fake[600], nodev[600], marker[600];
    snprintf(marker, sizeof marker, "%s/fake_driver_loaded", tmpdir);
    /* no library at all */
    snprintf(fake, sizeof fake, "%s/no_such_libcuda.so.1", tmpdir);
    setenv("XTC_LIBCUDA", fake, 1);
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_ERR_IO);
    ck_assert_msg(strstr(xtc_session_error(s), "no CUDA driver") && strstr(xtc_session_error(s), "cuda-emu"), "%s",
                  xtc_session_error(s));
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_STATE);
    xtc_session_free(s);
    /* a driver without a device */
    build_fake_driver("fake_nodevice", 100, NULL, marker);
    snprintf(nodev, sizeof nodev, "%s/fake_nodevice.so", tmpdir);
    setenv("XTC_LIBCUDA", nodev, 1);
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_ERR_IO);
    ck_assert_msg(strstr(xtc_session_error(s), "no CUDA device") &&
                      strstr(xtc_session_error(s), "no CUDA-capable device is detected"),
                  "%s", xtc_session_error(s));
    xtc_session_free(s);
    /* a driver that lacks a function */
    build_fake_driver("fake_old", 0, "cuLaunchKernel", marker);
    snprintf(fake, sizeof fake, "%s/fake_old.so", tmpdir);
    setenv("XTC_LIBCUDA", fake, 1);
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_ERR_IO);
    ck_assert_msg(strstr(xtc_session_error(s), "lacks cuLaunchKernel"), "%s", xtc_session_error(s));
    xtc_session_free(s);
    xtc_module_free(m);
    /* a CPU module never touches CUDA: its session does not load the (fake) driver */
    unlink(marker);
    setenv("XTC_LIBCUDA", nodev, 1);
    XtcModule *cpu = compile_target(g, "matmul_cpu", "cpu");
    ck_assert_int_eq(xtc_session_new(cpu, NULL, &s), XTC_OK);
    Binding bd;
    bind_case(&bd, g, SIZES[2]);
    bind_session(s, &bd, NULL);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    ck_assert_msg(!file_exists(marker), "a CPU session loaded the CUDA driver");
    bind_free(&bd);
    xtc_session_free(s);
    xtc_module_free(cpu);
    unsetenv("XTC_LIBCUDA");
    ir_graph_free(g);
}
END_TEST

/* The emulated driver's events: the host clock when the (synchronous) stream reaches them, and,
 * as with libcuda, an error for the time to an event that was never recorded. */
START_TEST(test_emulated_events)
{
    RtCuDriver drv;
    rt_cu_emulator(&drv);
    CUstream st;
    CUevent a, b;
    ck_assert_int_eq(drv.StreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventCreate(&a, 0), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventCreate(&b, 0), CUDA_SUCCESS);
    float ms = -1;
    ck_assert_int_eq(drv.EventElapsedTime(&ms, a, b), CUDA_ERROR_INVALID_HANDLE);
    ck_assert_int_eq(drv.EventRecord(a, st), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventElapsedTime(&ms, a, b), CUDA_ERROR_INVALID_HANDLE);
    const char *text = NULL;
    ck_assert_int_eq(drv.GetErrorString(CUDA_ERROR_INVALID_HANDLE, &text), CUDA_SUCCESS);
    ck_assert_str_eq(text, "invalid resource handle");
    /* some work on the stream between the two events: clearing 8 MiB of device memory */
    CUdeviceptr p;
    ck_assert_int_eq(drv.MemAlloc(&p, 8 << 20), CUDA_SUCCESS);
    ck_assert_int_eq(drv.MemsetD8Async(p, 1, 8 << 20, st), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventRecord(b, st), CUDA_SUCCESS);
    ck_assert_int_eq(drv.StreamSynchronize(st), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventSynchronize(b), CUDA_SUCCESS);
    ck_assert_int_eq(drv.EventElapsedTime(&ms, a, b), CUDA_SUCCESS);
    ck_assert_msg(ms > 0, "elapsed %g ms across a memset of 8 MiB", ms);
    float back = 1;
    ck_assert_int_eq(drv.EventElapsedTime(&back, b, a), CUDA_SUCCESS);
    ck_assert_msg(back == -ms, "elapsed b..a %g, a..b %g", back, ms);
    drv.MemFree(p);
    drv.EventDestroy(a);
    drv.EventDestroy(b);
    drv.StreamDestroy(st);
}
END_TEST

/* Profiling a CUDA module (through the emulated driver, the same launch path as a GPU's): an
 * event per step boundary fills the per-step profile; runs with profiling off record none. */
START_TEST(test_profile_events)
{
    IrGraph *g = new_graph("matmul_profile", build_matmul);
    XtcModule *m = compile_target(g, "matmul_profile", "cuda-emu");
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_str_eq(xtc_session_device(s), "the xtc CUDA emulator (CPU)");
    Binding bd;
    bind_case(&bd, g, SIZES[3]);
    bind_session(s, &bd, NULL);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK); /* uploads the weights: not profiled */
    int nsteps = xtc_module_num_steps(m);
    ck_assert_int_gt(nsteps, 1);
    double *secs = calloc((size_t)nsteps, sizeof *secs);
    ck_assert_int_eq(xtc_session_profile_steps(s, secs, nsteps), 0);
    ck_assert_int_eq(xtc_session_set_profiling(s, 1), XTC_OK);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "profiled run %d: %s", r, xtc_session_error(s));
    ck_assert_int_eq(xtc_session_profile_steps(s, secs, nsteps), 3);
    double total = 0;
    for (int i = 0; i < nsteps; i++) {
        ck_assert_msg(isfinite(secs[i]) && secs[i] >= 0, "step %d: %g s", i, secs[i]);
        total += secs[i];
    }
    ck_assert_msg(total > 0, "the events measured no time over %d steps", nsteps);
    /* the kernel of the largest matmul (65x130 by 130x7 and 70x130 ...) takes time of its own */
    int timed = 0;
    for (int i = 0; i < nsteps; i++)
        timed += secs[i] > 0;
    ck_assert_msg(timed >= nsteps / 2, "only %d of %d steps have a time", timed, nsteps);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ck_assert_int_eq(xtc_session_print_profile(s, mem), XTC_OK);
    fclose(mem);
    ck_assert_msg(strstr(text, "profile of 3 runs") && strstr(text, "matmul"), "%s", text);
    free(text);
    /* off: no profile, and the runs still work */
    ck_assert_int_eq(xtc_session_set_profiling(s, 0), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    ck_assert_int_eq(xtc_session_profile_steps(s, secs, nsteps), 0);
    free(secs);
    xtc_session_free(s);
    xtc_module_free(m);
    /* a CPU session names its device "cpu" */
    m = compile_target(g, "matmul_profile", "cpu");
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    ck_assert_str_eq(xtc_session_device(s), "cpu");
    xtc_session_free(s);
    xtc_module_free(m);
    ck_assert_str_eq(xtc_session_device(NULL), "");
    bind_free(&bd);
    ir_graph_free(g);
}
END_TEST
static Suite *suite(void)
{
    Suite *s = suite_create("cuda_runtime");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_emulator);
    tcase_add_test(tc, test_emulator_ucontext);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_no_driver);
    suite_add_tcase(s, tc);
    /* CK_RUN_CASE=profile runs these alone */
    TCase *prof = tcase_create("profile");
    tcase_set_timeout(prof, 300);
    tcase_add_test(prof, test_emulated_events);
    tcase_add_test(prof, test_profile_events);
    suite_add_tcase(s, prof);
    TCase *conv = tcase_create("conversions"); /* CK_RUN_CASE=conversions runs it alone */
    tcase_set_timeout(conv, 300);
    tcase_add_test(conv, test_half_conversions);
    suite_add_tcase(s, conv);
    return s;
}

int main(void)
{
    return harness_run(suite(), "cuda_runtime");
}
