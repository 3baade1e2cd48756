/* test_cuda_mma.c: tensor cores in the CUDA backend (CgOptions.mma, xtc compile --mma=bf16|fp16)
 * checked without a GPU, through the CUDA emulator.
 *
 *   conversions  the prelude's float <-> bf16 / fp16 bit arithmetic: every 16-bit value decodes
 *                and encodes back to itself; random floats go to the nearest 16-bit value, ties
 *                to even; the edges (overflow, subnormals, NaN) by hand.
 *   fragments    xtc_mma_m16n8k16_{bf16,f16} alone: a kernel loads A (16 x 16), B (16 x 8) and
 *                C into registers by the PTX ISA's fragment formulas (written out here apart
 *                from the emulated definition) and stores D. Integer matrices: D exact; random
 *                ones: D within the f32 bound 16 u (|C| + sum |a b|) of the product of the
 *                rounded inputs. Two warps with different data; threads forward, reversed and
 *                shuffled; lanes that skip the call are an error, as on the GPU.
 *   matmuls      every form the generator has (B transposed or not, batch dims broadcast, fused
 *                epilogues, M, N, K ragged, K below one k-step, symbolic K, empty sizes) compiled
 *                with --mma and run on random f32 inputs against the interpreter fed the matmul
 *                operands rounded to bf16 / fp16: the kernel must round exactly as the reference
 *                does, so the only difference left is its f32 summation, held to
 *                1e-5 + 2e-5 max|ref|.
 *                The same with 16-bit storage of the operands' format (--dtype bf16 / fp16,
 *                which imply these --mma): inputs rounded on upload as the reference's, each
 *                output rounded once on store, so within one unit in the last place of the
 *                16-bit value (2^-7 / 2^-10 of max|ref|).
 *   defaults     what --dtype and --mma give together (CG_MMA_AUTO, sm_75, mismatches).
 *   flash        the attention forward on tensor cores (cg_cuda_attention_mma.c): taken for heads
 *                up to 128 with --mma, not above nor without; every bias, mask, scale, causal and
 *                window form, ragged I and J (n = 1, 7, 17, 70 with J = n + 3 and n - 1), heads
 *                8 by 12, 64, 128 by 40, head-split views, the backward reading its statistics;
 *                against the interpreter on q, k, v rounded as the kernel rounds them, within
 *                the rounding of the probabilities before P V (u of max|v|; 16 u for the
 *                gradient), bf16 and fp16, f32 and 16-bit storage. The backward on tensor cores
 *                (cg_cuda_attention_mma_grad.c): taken for heads up to 64; dq, dk, dv of every
 *                mask form, limits, rows without keys, heads 8, 40 and 64 over two tiles, within
 *                16 u of max|ref| (P and dS rounded before their products), bf16 with f32 storage
 *                and fp16 with fp16 storage. With 16-bit storage of the mma's format
 *                (kernels/flash_bwd.cuh, case flash_bwd) also heads 32 and 128, bf16 and fp16,
 *                n = 130. Grouped key/values through both backward kernels (case
 *                flash_grouped): 4 query heads over 2, 8 over 2, multi-query, causal or not,
 *                bf16 and fp16, f32 and 16-bit storage, n up to 130. The graphs are
 *                flash_cases.h's build_flash*.
 *   a model      models/tiny_gpt.xtf through cuda-emu with --mma against the interpreter in f64
 *                on the unrounded weights: forward logits within 2e-2 max|ref| (bf16, 8-bit
 *                significands: about 10 units of rounding) and 4e-3 max|ref| (fp16, 11 bits:
 *                about 16), and not equal to the f32 module's logits, so the tensor-core path is
 *                the one that ran; training (loss and every gradient, backward matmuls
 *                included) in bf16 within 3e-2 of each tensor's max|ref|. The same bounds with
 *                16-bit storage too (--dtype bf16 and fp16, tensor cores by default), training
 *                in bf16 within 5e-2. Observed errors are printed; they are 2 to 7 times below
 *                these bounds (1.8 to 2.4 for bf16 storage training).
 *   loss_scale   fp16 training with dynamic loss scaling (IrGradOpts.loss_scale, the session's
 *                XTC_LOSS_SCALE_INPUT): a small decoder's gradients, divided back by the
 *                session, within 10 u of each tensor's max|ref| of the f64 interpreter's, where
 *                with the scale bound to 1 the smallest (about 1e-7) is far off; an overflowing
 *                scale skips the step and halves, good steps double it, checkpoints keep it. */
#include "cg_cuda.h"
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "rt_cuda_abi.h"
#include "rt_half.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HARNESS_SEED 0x2545F4914F6CDD1Dull
#include "harness.h"
#include "harness_drive.h"
#include "harness_bind.h"
#include "emu_lib.h"
#include "op_cases.h"
#include "flash_cases.h"

static void make_tmpdir(void) { harness_make_tmpdir("mma"); }

static const char *const ORDERS[] = {"forward", "reverse", "shuffled"};

/* The storage of floating-point tensors of the module being checked (--dtype): 0 f32, 1 bf16,
 * 2 fp16. With 16-bit storage the runtime rounds inputs and weights on upload (rt_half.h), so
 * the reference is fed the same rounded values. */
static int storage;
static const char *const STORAGE_NAME[] = {"f32", "bf16", "fp16"};

/* ---- the prelude's helpers and test kernels, compiled with the emulator ---- */

static const char kernels_source[] =
    "/* conversions, called directly */\n"
    "unsigned t_bf16_bits(float x) { return xtc_bf16_bits(x); }\n"
    "float t_bf16_float(unsigned h) { return xtc_bf16_float(h); }\n"
    "unsigned t_f16_bits(float x) { return xtc_f16_bits(x); }\n"
    "float t_f16_float(unsigned h) { return xtc_f16_float(h); }\n"
    "unsigned t_pack_bf16x2(float lo, float hi) { return xtc_pack_bf16x2(lo, hi); }\n"
    "unsigned t_pack_f16x2(float lo, float hi) { return xtc_pack_f16x2(lo, hi); }\n"
    "/* D = A B + C for each warp's matrices: A [16][16], B [16][8], C and D [16][8] row-major,\n"
    " * the fragments built by the PTX ISA's formulas for m16n8k16 */\n"
    "XTC_KERNEL mma_test(const float *A, const float *B, const float *C, float *D, int f16)\n"
    "{\n"
    "    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, groupID = lane >> 2, tig = lane % 4;\n"
    "    A += w * 256;\n"
    "    B += w * 128;\n"
    "    C += w * 128;\n"
    "    D += w * 128;\n"
    "    unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};\n"
    "    for (int i = 0; i < 8; i++) {\n"
    "        int row = (i < 2 || (i >= 4 && i < 6)) ? groupID : groupID + 8;\n"
    "        int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);\n"
    "        float v = A[row * 16 + col];\n"
    "        a[i / 2] |= (f16 ? xtc_f16_bits(v) : xtc_bf16_bits(v)) << (16 * (i & 1));\n"
    "    }\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = groupID;\n"
    "        float v = B[row * 8 + col];\n"
    "        b[i / 2] |= (f16 ? xtc_f16_bits(v) : xtc_bf16_bits(v)) << (16 * (i & 1));\n"
    "    }\n"
    "    float c[4], d[4];\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        c[i] = C[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)];\n"
    "    if (f16)\n"
    "        xtc_mma_m16n8k16_f16(d, a, b, c);\n"
    "    else\n"
    "        xtc_mma_m16n8k16_bf16(d, a, b, c);\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        D[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)] = d[i];\n"
    "}\n"
    "static void call_mma_test(void **a)\n"
    "{\n"
    "    mma_test(*(const float **)a[0], *(const float **)a[1], *(const float **)a[2], *(float **)a[3], *(int *)a[4]);\n"
    "}\n"
    "/* half the warp calls the mma: undefined on the GPU, an error in the emulator */\n"
    "XTC_KERNEL mma_divergent(float *D)\n"
    "{\n"
    "    unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};\n"
    "    float c[4] = {0, 0, 0, 0}, d[4];\n"
    "    if (threadIdx.x < 16) {\n"
    "        xtc_mma_m16n8k16_bf16(d, a, b, c);\n"
    "        D[threadIdx.x] = d[0];\n"
    "    }\n"
    "}\n"
    "static void call_mma_divergent(void **a) { mma_divergent(*(float **)a[0]); }\n"
    "/* flash_lib.cuh's tile copy: rows r0 .. r0 + 15 of p (row stride ld, below lim, `chunks` chunks of\n"
    " * 8 values) into a [16][48] tile of 6 chunks a row (the 6th is padding, left as it was), by\n"
    " * cp.async (vec) or by loads; the tile, first filled with 0xabcd, to out */\n"
    "XTC_KERNEL rows_test(const unsigned short *p, unsigned short *out, i64 ld, i64 r0, i64 lim, int chunks, int vec)\n"
    "{\n"
    "    __shared__ XTC_ALIGN16 unsigned short tile[16 * 48];\n"
    "    for (int e = threadIdx.x; e < 16 * 48; e += blockDim.x)\n"
    "        tile[e] = 0xabcd;\n"
    "    __syncthreads();\n"
    "    xtc_fa_rows(xtc_sa_of(tile), 96, p, ld, r0, lim, 16, 5, chunks, vec);\n"
    "    xtc_cp_async_commit();\n"
    "    xtc_cp_async_wait(0);\n"
    "    __syncthreads();\n"
    "    for (int e = threadIdx.x; e < 16 * 48; e += blockDim.x)\n"
    "        out[e] = tile[e];\n"
    "}\n"
    "static void call_rows_test(void **a)\n"
    "{\n"
    "    rows_test(*(const unsigned short **)a[0], *(unsigned short **)a[1], *(i64 *)a[2], *(i64 *)a[3], *(i64 *)a[4],\n"
    "              *(int *)a[5], *(int *)a[6]);\n"
    "}\n"
    "const XtcEmuKernel test_kernels[] = {{\"mma_test\", call_mma_test, 1}, {\"mma_divergent\", call_mma_divergent, 1},\n"
    "                                     {\"rows_test\", call_rows_test, 1}};\n"
    "int32_t (*const test_launch)(const XtcEmuKernel *, const XtcEmuLaunch *, void **) = xtc_emu_launch;\n"
    "void (*const test_release)(void *) = xtc_emu_release;\n";

typedef struct {
    EmuLib e; /* first: a Lib is run as its EmuLib */
    unsigned (*bf16_bits)(float), (*f16_bits)(float), (*pack_bf16x2)(float, float), (*pack_f16x2)(float, float);
    float (*bf16_float)(unsigned), (*f16_float)(unsigned);
} Lib;

/* The emulator header, the prelude every generated source starts with, the kernels above. */
static void lib_open(Lib *l)
{
    memset(l, 0, sizeof *l);
    make_tmpdir();
    char *src = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&src, &len);
    fputs("#include \"xtc_cuda_emu.h\"\n", f);
    IrGraph *g = ir_graph_new("mma_test");
    cu_prelude(f, g, 2, 0); /* the conversions and the mma are in every storage's prelude */
    ir_graph_free(g);
    fputs(cg_embed_flash_lib_cuh, f);
    fputs(kernels_source, f);
    fclose(f);
    /* as the cuda-emu modules are compiled (codegen/cuda/cg_cuda.c) */
    emu_bind(&l->e, emu_build_so("mma_test", src, "-std=gnu11 -O2 -fPIC -shared -fwrapv -fno-strict-aliasing -w"));
    free(src);
    *(void **)&l->bf16_bits = dlsym(l->e.dl, "t_bf16_bits");
    *(void **)&l->bf16_float = dlsym(l->e.dl, "t_bf16_float");
    *(void **)&l->f16_bits = dlsym(l->e.dl, "t_f16_bits");
    *(void **)&l->f16_float = dlsym(l->e.dl, "t_f16_float");
    *(void **)&l->pack_bf16x2 = dlsym(l->e.dl, "t_pack_bf16x2");
    *(void **)&l->pack_f16x2 = dlsym(l->e.dl, "t_pack_f16x2");
    ck_assert(l->bf16_bits && l->bf16_float && l->f16_bits && l->f16_float && l->pack_bf16x2 && l->pack_f16x2);
}

static void lib_close(Lib *l) { emu_close(&l->e); }

static int lib_run(Lib *l, int k, unsigned block, int order, void **args)
{
    return emu_run(&l->e, k, 1, block, order, args);
}

/* ---- conversions ---- */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x went to h: no 16-bit neighbour of h (same sign, one step either way) is nearer, and a tie
 * went to the even one. */
static void check_nearest(const char *what, float x, unsigned h, float (*dec)(unsigned), unsigned maxfinite)
{
    double v = dec(h), dx = fabs((double)x - v);
    unsigned mag = h & 0x7fffu, sign = h & 0x8000u;
    expect_msg(mag <= maxfinite, "%s(%.9g) = 0x%04x: not finite", what, (double)x, h);
    for (int s = -1; s <= 1; s += 2) {
        if ((s < 0 && mag == 0) || (s > 0 && mag == maxfinite))
            continue;
        double n = dec(sign | (mag + (unsigned)s)), dn = fabs((double)x - n);
        expect_msg(dx < dn || (dx == dn && !(h & 1u)),
                   "%s(%.9g) = 0x%04x (%.9g), but 0x%04x (%.9g) is %s", what, (double)x, h, v,
                   sign | (mag + (unsigned)s), n, dx == dn ? "as near and even" : "nearer");
    }
}

START_TEST(test_conversions)
{
    Lib l;
    lib_open(&l);
    /* every 16-bit value but NaNs decodes and encodes back to itself; NaNs stay NaN */
    for (unsigned h = 0; h < 0x10000u; h++) {
        float b = l.bf16_float(h), f = l.f16_float(h);
        if ((h & 0x7fffu) > 0x7f80u)
            expect_msg(isnan(b) && (l.bf16_bits(b) & 0x7fffu) > 0x7f80u, "bf16 0x%04x", h);
        else
            expect_msg(l.bf16_bits(b) == h, "bf16 0x%04x -> %.9g -> 0x%04x", h, (double)b, l.bf16_bits(b));
        if ((h & 0x7fffu) > 0x7c00u)
            expect_msg(isnan(f) && (l.f16_bits(f) & 0x7fffu) > 0x7c00u, "fp16 0x%04x", h);
        else
            expect_msg(l.f16_bits(f) == h, "fp16 0x%04x -> %.9g -> 0x%04x", h, (double)f, l.f16_bits(f));
    }
    /* the decodings are the values the formats define */
    ck_assert(l.bf16_float(0x3f80) == 1.0f && l.bf16_float(0xc040) == -3.0f && l.bf16_float(0x0001) == from_bits(0x10000));
    ck_assert(l.f16_float(0x3c00) == 1.0f && l.f16_float(0xc500) == -5.0f && l.f16_float(0x7bff) == 65504.0f);
    ck_assert(l.f16_float(0x0001) == ldexpf(1.0f, -24) && l.f16_float(0x03ff) == ldexpf(1023.0f, -24));
    ck_assert(l.f16_float(0x0400) == ldexpf(1.0f, -14) && isinf(l.f16_float(0xfc00)) && l.f16_float(0xfc00) < 0);
    /* random floats of every magnitude go to the nearest value */
    for (int i = 0; i < 400000; i++) {
        uint32_t u = (uint32_t)rnd();
        float x = from_bits(u);
        if (!isfinite(x))
            continue;
        if (fabsf(x) < 3.3e38f) /* bf16's largest finite value is 3.3895e38 */
            check_nearest("bf16", x, l.bf16_bits(x), l.bf16_float, 0x7f7fu);
        /* magnitudes where halves live: scale into [2^-26, 2^16] */
        float y = ldexpf(frexpf(x, &(int){0}), (int)(rnd() % 43) - 25);
        if (fabsf(y) < 65504.0f)
            check_nearest("fp16", y, l.f16_bits(y), l.f16_float, 0x7bffu);
    }
    /* ties to even, by hand */
    ck_assert_uint_eq(l.bf16_bits(1.0f + 0x1p-8f), 0x3f80); /* halfway to 0x3f81: down to even */
    ck_assert_uint_eq(l.bf16_bits(1.0f + 0x3p-8f), 0x3f82); /* halfway from 0x3f81: up to even */
    ck_assert_uint_eq(l.f16_bits(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(l.f16_bits(1.0f + 0x3p-11f), 0x3c02);
    ck_assert_uint_eq(l.f16_bits(0x1p-25f), 0x0000);        /* half the least subnormal: to 0 */
    ck_assert_uint_eq(l.f16_bits(0x3p-25f), 0x0002);        /* 1.5 least subnormals: to even 2 */
    ck_assert_uint_eq(l.f16_bits(0x3p-26f), 0x0001);        /* 0.75 of one: up to 1 */
    ck_assert_uint_eq(l.f16_bits(-0x1p-30f), 0x8000);
    /* overflow, infinities, NaN */
    ck_assert_uint_eq(l.f16_bits(65519.0f), 0x7bff);
    ck_assert_uint_eq(l.f16_bits(65520.0f), 0x7c00);
    ck_assert_uint_eq(l.f16_bits(-1e6f), 0xfc00);
    ck_assert_uint_eq(l.f16_bits(INFINITY), 0x7c00);
    ck_assert_uint_eq(l.bf16_bits(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(l.bf16_bits(-INFINITY), 0xff80);
    ck_assert(isnan(l.bf16_float(l.bf16_bits(NAN))) && isnan(l.f16_float(l.f16_bits(NAN))));
    /* packing: the first value in the low half */
    ck_assert_uint_eq(l.pack_bf16x2(1.0f, -2.0f), 0xc0003f80u);
    ck_assert_uint_eq(l.pack_f16x2(1.0f, -2.0f), 0xc0003c00u);
    lib_close(&l);
}
END_TEST

/* ---- the mma wrapper ---- */

/* D = A B + C in f64 for nw warps' matrices, A and B first rounded through the 16-bit format */
static void mma_reference(const Lib *l, int f16, int nw, const float *A, const float *B, const float *C, double *D,
                          double *bound)
{
    for (int w = 0; w < nw; w++)
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                double s = C[w * 128 + m * 8 + n], mag = fabs(s);
                for (int k = 0; k < 16; k++) {
                    float a = A[w * 256 + m * 16 + k], b = B[w * 128 + k * 8 + n];
                    double ra = f16 ? l->f16_float(l->f16_bits(a)) : l->bf16_float(l->bf16_bits(a));
                    double rb = f16 ? l->f16_float(l->f16_bits(b)) : l->bf16_float(l->bf16_bits(b));
                    s += ra * rb;
                    mag += fabs(ra * rb);
                }
                D[w * 128 + m * 8 + n] = s;
                /* 16 additions in f32 of exact products: at most 16 u of the magnitudes */
                bound[w * 128 + m * 8 + n] = 16 * 0x1p-24 * mag;
            }
}

static void run_mma(Lib *l, int f16, int nw, int order, const float *A, const float *B, const float *C, float *D)
{
    for (int i = 0; i < nw * 128; i++)
        D[i] = NAN;
    void *args[] = {&A, &B, &C, &D, &f16};
    ck_assert_msg(lib_run(l, 0, 32u * (unsigned)nw, order, args) == 0, "%s", l->e.err);
}

START_TEST(test_mma_fragments)
{
    Lib l;
    lib_open(&l);
    enum { NW = 2 };
    float A[NW * 256], B[NW * 128], C[NW * 128], D[NW * 128];
    double E[NW * 128], bound[NW * 128], T[NW * 128], tb[NW * 128];
    for (int f16 = 0; f16 < 2; f16++) {
        const char *type = f16 ? "f16" : "bf16";
        /* small integers, different in each warp and neither matrix symmetric: exact */
        for (int i = 0; i < NW * 256; i++)
            A[i] = (float)((int)(rnd() % 17) - 8);
        for (int i = 0; i < NW * 128; i++) {
            B[i] = (float)((int)(rnd() % 13) - 6);
            C[i] = (float)((int)(rnd() % 41) - 20) * 0.5f;
        }
        mma_reference(&l, f16, NW, A, B, C, E, bound);
        /* the data tells layouts apart: A transposed in each 16 x 16 gives another D */
        float At[NW * 256];
        for (int w = 0; w < NW; w++)
            for (int m = 0; m < 16; m++)
                for (int k = 0; k < 16; k++)
                    At[w * 256 + m * 16 + k] = A[w * 256 + k * 16 + m];
        mma_reference(&l, f16, NW, At, B, C, T, tb);
        int differ = 0;
        for (int i = 0; i < NW * 128; i++)
            differ += T[i] != E[i];
        ck_assert_int_gt(differ, 100);
        for (int order = 0; order < 3; order++) {
            run_mma(&l, f16, NW, order, A, B, C, D);
            for (int i = 0; i < NW * 128; i++)
                ck_assert_msg(D[i] == E[i], "%s, integers, threads %s: D[%d][%d][%d] = %.9g, expected %.9g", type,
                              ORDERS[order], i / 128, i % 128 / 8, i % 8, (double)D[i], E[i]);
        }
        /* random values: rounded to 16 bits on the way in, summed in f32 */
        for (int i = 0; i < NW * 256; i++)
            A[i] = (float)uniform(-2, 2);
        for (int i = 0; i < NW * 128; i++) {
            B[i] = (float)uniform(-2, 2);
            C[i] = (float)uniform(-4, 4);
        }
        mma_reference(&l, f16, NW, A, B, C, E, bound);
        run_mma(&l, f16, NW, XTC_EMU_SHUFFLED, A, B, C, D);
        for (int i = 0; i < NW * 128; i++)
            ck_assert_msg(fabs(D[i] - E[i]) <= bound[i], "%s, random: D[%d][%d][%d] = %.9g, expected %.9g +- %.3g", type,
                          i / 128, i % 128 / 8, i % 8, (double)D[i], E[i], bound[i]);
        /* d may be c: accumulating in place */
        memcpy(D, C, sizeof D);
        const float *pa = A, *pb = B, *pc = D;
        float *pd = D;
        void *args[] = {&pa, &pb, &pc, &pd, &f16};
        ck_assert_msg(lib_run(&l, 0, 32u * NW, XTC_EMU_FORWARD, args) == 0, "%s", l.e.err);
        for (int i = 0; i < NW * 128; i++)
            ck_assert_msg(fabs(D[i] - E[i]) <= bound[i], "%s, in place: D[%d] = %.9g, expected %.9g", type, i,
                          (double)D[i], E[i]);
    }
    /* the instruction is warp-wide: lanes that skip it are an error, not a silent wrong value */
    float *pd = D;
    void *dargs[] = {&pd};
    ck_assert_int_eq(lib_run(&l, 1, 32, XTC_EMU_FORWARD, dargs), -1);
    ck_assert_msg(strstr(l.e.err, "exited while") || strstr(l.e.err, "deadlock"), "%s", l.e.err);
    lib_close(&l);
}
END_TEST

/* ---- matmul kernels against the interpreter ---- */

#include "mma_check.h"

static const int64_t SIZES[][2] = {{1, 1}, {1, 7}, {2, 17}, {3, 33}, {1, 65}, {2, 130}, {2, 0}};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* g (after the pass pipeline when fuse, which must then hold a matmul fused with its epilogue)
 * compiled with mma, against the interpreter on the rounded operands */
static void check_graph(const Lib *l, const OpCase *c, int mma)
{
    const char *name = c->name;
    int fuse = (c->flags & OC_FUSE) != 0;
    IrGraph *built = new_graph(name, c->build), *g = built;
    Names ops; /* names in built, kept until the end */
    matmul_operands(built, &ops);
    if (fuse) {
        PassOptions po = {.verify_each = 1};
        char err[1024];
        IrGraph *h = harness_passes(g, "cuda-emu", &po, err, sizeof err);
        ck_assert_msg(h != NULL, "%s: passes: %s", name, err);
        g = h;
        int fused = 0;
        for (int i = 0; i < g->nnodes; i++)
            fused += g->nodes[i]->op == IR_FUSED;
        ck_assert_msg(fused >= 3, "%s: the pipeline fused %d matmul epilogues", name, fused);
    }
    XtcModule *m = compile_mma(g, name, mma);
    int f16 = mma == CG_MMA_FP16;
    double worst = 0;
    for (int k = 0; k < NSIZES; k++) {
        RefBinding rb;
        bind_rounded(&rb, g, SIZES[k], 1.0, l, &ops, f16);
        IrHostTensor *ref = interp_outputs(g, ref_cb, &rb, NULL, name);
        char what[256];
        for (int o = 0; storage && o < g->noutputs; o++) /* stored once, rounded once */
            for (int64_t i = 0, numel = ir_host_numel(&ref[o]); i < numel; i++) {
                float *v = &((float *)ref[o].data)[i];
                *v = rt_round_to_storage(storage, *v);
            }
        snprintf(what, sizeof what, "%s --mma=%s --dtype %s (b=%lld n=%lld)", name, cg_mma_name(mma),
                 STORAGE_NAME[storage], (long long)SIZES[k][0], (long long)SIZES[k][1]);
        XtcSession *s = run_module(m, &rb.b, what, ORDERS[k % 3]);
        /* 16-bit storage: the f32 sum may round to the neighbour of the reference's stored value,
         * one unit in the last place: 2^-7 (bf16), 2^-10 (fp16) of the value */
        worst = fmax(worst, compare_outputs(g, s, ref, what, OC_ATOL, storage ? 1.0 / (storage == 1 ? 128 : 1024) : c->rtol));
        xtc_session_free(s);
        free_outputs(g, ref);
        bind_rounded_free(&rb);
    }
    fprintf(stderr, "test_cuda_mma: %s --mma=%s --dtype %s: largest error %.2g of max|ref| (interpreter on rounded "
            "operands)\n", name, cg_mma_name(mma), STORAGE_NAME[storage], worst);
    xtc_module_free(m);
    if (g != built)
        ir_graph_free(g);
    ir_graph_free(built);
}

START_TEST(test_matmul_forms)
{
    Lib l;
    lib_open(&l);
    const OpCase *c;
    for (int k = 0; (c = op_case_for(OC_MMA, k)) != NULL; k++) {
        for (int mma = CG_MMA_BF16; mma <= CG_MMA_FP16; mma++)
            check_graph(&l, c, mma);
        /* with 16-bit storage of the same format (--dtype bf16 and fp16 imply these --mma) */
        for (storage = 1; storage <= 2; storage++)
            check_graph(&l, c, storage == 1 ? CG_MMA_BF16 : CG_MMA_FP16);
        storage = 0;
    }
    storage = 0;
    lib_close(&l);
}
END_TEST

/* The OC_MMA16 cases: the kernel for operands stored in the mma's format (cg_cuda_matmul_mma.c),
 * which only 16-bit storage of that format takes */
START_TEST(test_matmul_16bit_operands)
{
    Lib l;
    lib_open(&l);
    const OpCase *c;
    for (int k = 0; (c = op_case_for(OC_MMA16, k)) != NULL; k++)
        for (storage = 1; storage <= 2; storage++)
            check_graph(&l, c, storage == 1 ? CG_MMA_BF16 : CG_MMA_FP16);
    storage = 0;
    lib_close(&l);
}
END_TEST

/* A read transposed in place (CG_VIEW_A_T, summed over the batch too: CG_VIEW_SUM_B) by the
 * tensor-core kernel for f32 storage, which converts as it stages (cg_cuda_matmul.c's matmul_mma):
 * the matmul_at case's products (its permute that exp reads too is of unrounded operands here);
 * the 16-bit storage's kernel runs the whole case in test_matmul_16bit_operands */
static void build_at_forms(IrGraph *g, IrDim b, IrDim n) { matmul_at_forms(g, b, n); }

START_TEST(test_matmul_at_f32_storage)
{
    Lib l;
    lib_open(&l);
    static const OpCase at = {"matmul_at_forms", build_at_forms, OC_MMA, OC_EMPTY, 1e-4, ""};
    storage = 0;
    for (int mma = CG_MMA_BF16; mma <= CG_MMA_FP16; mma++)
        check_graph(&l, &at, mma);
    lib_close(&l);
}
END_TEST

/* What --dtype and --mma give together (cg_mma_resolve through the renderer): 16-bit storage
 * takes the tensor cores of its format by default, off below sm_80; an explicit --mma below
 * sm_80 (on the GPU) or of the other 16-bit format is refused, saying why. */
START_TEST(test_mma_with_dtype)
{
    IrGraph *g = new_graph("mma_forms", build_mma_forms);
    CgPlan plan;
    char err[1024];
    ck_assert_msg(cg_plan_build(g, &plan, err, sizeof err) == 0, "%s", err);
    static const struct {
        int mma;
        const char *dtype, *arch;
        int emu, want; /* want: the resolved CG_MMA_*, or -1 refused */
        const char *msg; /* in the refusal */
    } cases[] = {
        {CG_MMA_AUTO, NULL, NULL, 0, CG_MMA_OFF, NULL},
        {CG_MMA_AUTO, "f32", "sm_90", 1, CG_MMA_OFF, NULL},
        {CG_MMA_AUTO, "bf16", NULL, 0, CG_MMA_BF16, NULL},
        {CG_MMA_AUTO, "fp16", "sm_90", 0, CG_MMA_FP16, NULL},
        {CG_MMA_AUTO, "bf16", NULL, 1, CG_MMA_BF16, NULL},
        {CG_MMA_AUTO, "bf16", "sm_75", 0, CG_MMA_OFF, NULL}, /* no tensor cores to take: f32 matmul */
        {CG_MMA_AUTO, "fp16", "sm_75", 1, CG_MMA_OFF, NULL}, /* the emulator follows the GPU's default */
        {CG_MMA_OFF, "bf16", NULL, 0, CG_MMA_OFF, NULL},
        {CG_MMA_BF16, NULL, NULL, 0, CG_MMA_BF16, NULL}, /* f32 storage, bf16 operands */
        {CG_MMA_FP16, "f32", NULL, 1, CG_MMA_FP16, NULL},
        {CG_MMA_BF16, "bf16", "sm_90", 0, CG_MMA_BF16, NULL},
        {CG_MMA_BF16, "bf16", "sm_75", 1, CG_MMA_BF16, NULL}, /* explicit: the emulator has it anywhere */
        {CG_MMA_BF16, "bf16", "sm_75", 0, -1, "sm_80"},
        {CG_MMA_BF16, "fp16", NULL, 0, -1, "--mma=fp16 (the default for --dtype fp16) or --mma=off"},
        {CG_MMA_FP16, "bf16", NULL, 1, -1, "rounded a second time"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CgOptions opt = {.output = "-", .mma = cases[i].mma, .dtype = cases[i].dtype, .cuda_arch = cases[i].arch};
        CuUnit u;
        err[0] = 0;
        int rc = cg_cuda_render_unit(&plan, &opt, cases[i].emu, &u, err, sizeof err);
        if (cases[i].want < 0) {
            ck_assert_msg(rc == -1 && strstr(err, cases[i].msg), "case %zu: rc %d: %s", i, rc, err);
            continue;
        }
        ck_assert_msg(rc == 0, "case %zu: %s", i, err);
        ck_assert_msg(u.gen.mma == cases[i].want, "case %zu: mma %s, want %s", i, cg_mma_name(u.gen.mma),
                      cg_mma_name(cases[i].want));
        for (int k = 0; k < u.nkernels; k++)
            ck_assert_msg(!!strstr(u.kernel_text[k], "xtc_mma_m16n8k16_") == (cases[i].want != CG_MMA_OFF),
                          "case %zu: %s", i, u.kernel_text[k]);
        cg_cuda_unit_free(&u);
    }
    cg_plan_free(&plan);
    ir_graph_free(g);
}
END_TEST

/* The kernel text: the tensor-core form only when asked, and the f32 form unchanged otherwise. */
START_TEST(test_matmul_source)
{
    IrGraph *g = new_graph("mma_forms", build_mma_forms);
    CgPlan plan;
    char err[1024];
    ck_assert_msg(cg_plan_build(g, &plan, err, sizeof err) == 0, "%s", err);
    static const char *const want[] = {[CG_MMA_BF16] = "xtc_mma_m16n8k16_bf16(",
                                       [CG_MMA_FP16] = "xtc_mma_m16n8k16_f16("};
    for (int mma = CG_MMA_OFF; mma <= CG_MMA_FP16; mma++) {
        CgOptions opt = {.output = "-", .mma = mma};
        CuUnit u;
        ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &u, err, sizeof err) == 0, "%s", err);
        for (int k = 0; k < u.nkernels; k++) {
            const char *text = u.kernel_text[k];
            ck_assert_msg(!!strstr(text, "xtc_mma_m16n8k16_") == (mma != CG_MMA_OFF), "%s", text);
            if (want[mma])
                ck_assert_msg(strstr(text, want[mma]) && u.geom[k].block == 128, "%s", text);
        }
        cg_cuda_unit_free(&u);
    }
    /* tensor cores need sm_80; the CPU backend takes bf16 operands only */
    CgOptions old = {.output = "-", .mma = CG_MMA_BF16, .cuda_arch = "sm_75"};
    CuUnit u;
    ck_assert_int_eq(cg_cuda_render_unit(&plan, &old, 0, &u, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "sm_80") && strstr(err, "sm_75"), "%s", err);
    cg_plan_free(&plan);
    CgOptions cpu = {.output = "/nonexistent/x.so", .target = "cpu", .mma = CG_MMA_FP16};
    ck_assert_int_eq(cg_compile(g, &cpu, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "cpu") && strstr(err, "fp16"), "%s", err);
    ck_assert_int_eq(cg_mma_parse("bf16"), CG_MMA_BF16);
    ck_assert_int_eq(cg_mma_parse("fp16"), CG_MMA_FP16);
    ck_assert_int_eq(cg_mma_parse("off"), CG_MMA_OFF);
    ck_assert_int_eq(cg_mma_parse("tf32"), -1);
    ck_assert_int_eq(cg_mma_parse("auto"), CG_MMA_AUTO);
    ir_graph_free(g);
}
END_TEST

/* ---- attention on tensor cores ---- */

/* How many of g's kernels of op the renderer puts on tensor cores with --mma=mma (their comment
 * says `marker`), of `all`: each one whose head is at most max_head, none without --mma. */
static int flash_kernels(IrGraph *g, int mma, IrOp op, const char *marker, long long max_head, int *all)
{
    CgPlan plan;
    CuUnit cu;
    CgOptions opt = {.output = "-", .mma = mma};
    char err[1024];
    ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &cu, err, sizeof err) == 0, "%s", err);
    int on = *all = 0;
    for (int i = 0; i < cu.nkernels; i++) {
        const IrNode *x = plan.kernels[i].node;
        int tc = strstr(cu.kernel_text[i], marker) != NULL;
        if (x->op == op) {
            ck_assert_msg(tc == (mma != CG_MMA_OFF && x->in[0]->shape[3].c <= max_head), "%s", cu.kernel_text[i]);
            on += tc, ++*all;
        }
    }
    fprintf(stderr, "test_cuda_mma: flash: --mma=%s: %d of %d %s kernels on tensor cores\n", cg_mma_name(mma), on, *all,
            op == IR_ATTENTION ? "forward" : "backward");
    cg_cuda_unit_free(&cu);
    cg_plan_free(&plan);
    ck_assert_int_eq(on, mma == CG_MMA_OFF ? 0 : *all - 1); /* all but the one too wide */
    return on;
}

#define AS_STORED "copied as stored (cp.async, ldmatrix)" /* the comment of the kernels of operands as stored */

/* Of g's kernels of op rendered with storage st (--dtype STORAGE_NAME[st], --mma of its format,
 * bf16 for f32), how many have marker (and also, unless NULL) in their text; *all counts op's. */
static int count_attention_kernels(IrGraph *g, int st, IrOp op, const char *marker, const char *also, int *all)
{
    CgPlan plan;
    CuUnit cu;
    CgOptions opt = {.output = "-", .mma = st == 2 ? CG_MMA_FP16 : CG_MMA_BF16, .dtype = STORAGE_NAME[st]};
    char err[1024];
    ck_assert_msg(cg_plan_build_views(g, &plan, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cg_cuda_render_unit(&plan, &opt, 0, &cu, err, sizeof err) == 0, "%s", err);
    int n = *all = 0;
    for (int i = 0; i < cu.nkernels; i++)
        if (plan.kernels[i].node->op == op) {
            ++*all;
            n += strstr(cu.kernel_text[i], marker) && (!also || strstr(cu.kernel_text[i], also));
        }
    cg_cuda_unit_free(&cu);
    cg_plan_free(&plan);
    return n;
}

/* build's graph with bf16 and fp16 storage (the mma of that format) against the interpreter, at
 * n = 1, 7, 17, 70 and 130 */
static void check_flash16(BuildFn build)
{
    Lib l;
    lib_open(&l);
    static const int64_t sizes[][2] = {{1, 1}, {1, 7}, {2, 17}, {1, 70}, {1, 130}};
    for (storage = 1; storage <= 2; storage++)
        check_flash_sizes(&l, storage == 1 ? CG_MMA_BF16 : CG_MMA_FP16, build, sizes, sizeof sizes / sizeof sizes[0]);
    storage = 0;
    lib_close(&l);
}

/* The forward is the tensor-core kernel (its comment names it) for every head up to 128, and
 * the CUDA-core one above that and without --mma; then the numbers against the interpreter. */
START_TEST(test_flash_attention)
{
    IrGraph *g = new_graph("flash", build_flash);
    IrDim sw[] = {ir_dim(1), ir_dim(1), ir_dim(5), ir_dim(130)};
    IrNode *qw = input(g, "qw", IR_F32, 4, sw);
    out(g, "wide", ir_attention(g, qw, qw, qw, NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1));
    for (int mma = CG_MMA_OFF, all; mma <= CG_MMA_FP16; mma++) {
        flash_kernels(g, mma, IR_ATTENTION, "FlashAttention-2 on tensor cores", 128, &all);
        ck_assert_int_ge(all, 8);
    }
    ir_graph_free(g);
    Lib l;
    lib_open(&l);
    check_flash(&l, CG_MMA_BF16, build_flash);
    check_flash(&l, CG_MMA_FP16, build_flash);
    for (storage = 1; storage <= 2; storage++)
        check_flash(&l, storage == 1 ? CG_MMA_BF16 : CG_MMA_FP16, build_flash);
    storage = 0;
    lib_close(&l);
}
END_TEST

/* The forward of operands as stored (kernels/flash_fwd.cuh): every attention kernel of
 * build_flash16 is it with 16-bit storage of the mma's format, none with f32 storage; then the
 * numbers against the interpreter, bf16 and fp16, at the sizes of check_flash and at n = 130
 * (two query tiles of 128 rows, three stages of 64 keys, four of 32 for heads of 128). */
START_TEST(test_flash_stored)
{
    IrGraph *g = new_graph("flash", build_flash16);
    for (int st = 0, all; st <= 2; st++) {
        int stored = count_attention_kernels(g, st, IR_ATTENTION, AS_STORED, NULL, &all);
        ck_assert_int_eq(all, 13);
        ck_assert_int_eq(stored, st ? all : 0);
    }
    ir_graph_free(g);
    check_flash16(build_flash16);
}
END_TEST

/* The bounded (cosine-sim) forward of operands as stored (kernels/flash_fwd.cuh): every attention
 * kernel of build_flash16_bounded is it, with bf16 bounded (its maximum from the start) where
 * every row sees a key (J >= I under causal, checked at run time), with fp16 not (P below the
 * bound's 2^-24 would flush to zero: the general path); then the numbers against the
 * interpreter, bf16 and fp16 storage, at n = 1, 7, 17, 70 and 130. */
START_TEST(test_flash_bounded)
{
    IrGraph *g = new_graph("flash", build_flash16_bounded);
    for (int st = 1, all; st <= 2; st++) {
        int stored = count_attention_kernels(g, st, IR_ATTENTION, AS_STORED, NULL, &all);
        ck_assert_int_eq(all, 5);
        ck_assert_int_eq(stored, all);
        int bounded = count_attention_kernels(g, st, IR_ATTENTION, "#define XTC_FA_BOUNDED (J >= I)", NULL, &all) +
                      count_attention_kernels(g, st, IR_ATTENTION, "#define XTC_FA_BOUNDED (1)", NULL, &all);
        ck_assert_int_eq(bounded, st == 1 ? 5 : 0);
    }
    ir_graph_free(g);
    check_flash16(build_flash16_bounded);
}
END_TEST

/* flash_lib.cuh's tile copy both ways: by cp.async (16-byte aligned rows) and by loads (the
 * kernel's fallback for unaligned operands, here rows of 44 values starting one value in), rows
 * past lim and chunks past `chunks` zero, the padding chunk untouched, any thread order. */
START_TEST(test_flash_rows)
{
    Lib l;
    lib_open(&l);
    enum { ROWS = 40, LD = 44 };
    unsigned short src[ROWS * LD + 8], out[16 * 48];
    for (int i = 0; i < ROWS * LD + 8; i++)
        src[i] = (unsigned short)(i * 7 + 3);
    static const struct {
        int off, ld, r0, lim, chunks, vec;
    } cases[] = {{0, 40, 3, 40, 5, 1}, {0, 40, 30, 35, 4, 1}, {1, 44, 3, 40, 5, 0}, {1, 44, 30, 35, 4, 0}, {0, 40, 2, 2, 5, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const unsigned short *p = src + cases[c].off;
        int64_t ld = cases[c].ld, r0 = cases[c].r0, lim = cases[c].lim;
        int chunks = cases[c].chunks, vec = cases[c].vec;
        unsigned short *o = out;
        void *args[] = {&p, &o, &ld, &r0, &lim, &chunks, &vec};
        ck_assert_msg(lib_run(&l, 2, 128, (int)(c % 3), args) == 0, "%s", l.e.err);
        for (int r = 0; r < 16; r++)
            for (int e = 0; e < 48; e++) {
                unsigned want = e >= 40 ? 0xabcd : r0 + r < lim && e / 8 < chunks ? p[(r0 + r) * ld + e] : 0;
                ck_assert_msg(out[r * 48 + e] == want, "case %zu: row %d value %d: 0x%04x, want 0x%04x", c, r, e,
                              out[r * 48 + e], want);
            }
    }
    lib_close(&l);
}
END_TEST

/* The backward on tensor cores (cg_cuda_attention_mma_grad.c) for heads up to 64 with f32
 * storage, not above nor without --mma; then its gradients against the interpreter's, bf16 with
 * f32 storage (the converting kernel) and fp16 with fp16 storage (kernels/flash_bwd.cuh: every
 * head here is a multiple of 8; test_flash_grad16 covers it further). */
START_TEST(test_flash_grad)
{
    IrGraph *g = new_graph("flash", build_flash_grad);
    IrDim s80[] = {ir_dim(1), ir_dim(1), ir_dim(5), ir_dim(80)};
    IrNode *q80 = input(g, "q80", IR_F32, 4, s80), *a80 = ir_attention(g, q80, q80, q80, NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1);
    out(g, "wide_grad", ir_attention_grad(g, a80, input(g, "d80", IR_F32, 4, s80)));
    for (int mma = CG_MMA_OFF, all; mma <= CG_MMA_FP16; mma++) {
        flash_kernels(g, mma, IR_ATTENTION_GRAD, "FlashAttention-2 backward on tensor cores", 64, &all);
        ck_assert_int_eq(all, 8);
    }
    ir_graph_free(g);
    Lib l;
    lib_open(&l);
    check_flash(&l, CG_MMA_BF16, build_flash_grad);
    storage = 2;
    check_flash(&l, CG_MMA_FP16, build_flash_grad);
    storage = 0;
    lib_close(&l);
}
END_TEST

/* The backward of operands as stored (kernels/flash_bwd.cuh): every attention_grad kernel of
 * build_flash_grad16 is it with 16-bit storage of the mma's format, none with f32 storage; then
 * the gradients against the interpreter's, bf16 and fp16 storage, at n = 1, 7, 17, 70 (J = n + 3
 * and n - 1: one resident tile, up to 5 streamed) and 130 (three query tiles: full tiles of the
 * causal head of 64 below the diagonal). */
START_TEST(test_flash_grad16)
{
    IrGraph *g = new_graph("flash", build_flash_grad16);
    for (int st = 0, all; st <= 2; st++) {
        int stored = count_attention_kernels(g, st, IR_ATTENTION_GRAD, "backward on tensor cores: operands in", AS_STORED, &all);
        ck_assert_int_eq(all, 11);
        ck_assert_int_eq(stored, st ? all : 0);
    }
    ir_graph_free(g);
    check_flash16(build_flash_grad16);
}
END_TEST

/* Grouped key/values on the tensor-core backward (flash_cases.h's build_flash_grad_grouped*):
 * every attention_grad kernel is the converting kernel with f32 storage (heads up to 64) and
 * kernels/flash_bwd.cuh with 16-bit storage of the mma's format, each reading k and v with
 * their own heads; then dq, dk, dv against the interpreter's: bf16 and fp16 with f32 storage,
 * bf16 and fp16 storage at n = 1, 7, 17, 70 and 130 (J = n + 3, n - 1 and n: ragged tiles). */
START_TEST(test_flash_grad_grouped)
{
    IrGraph *g = new_graph("flash", build_flash_grad_grouped), *g16 = new_graph("flash", build_flash_grad_grouped16);
    for (int st = 0, all; st <= 2; st++) {
        int tc = count_attention_kernels(st ? g16 : g, st, IR_ATTENTION_GRAD, "backward on tensor cores: operands in",
                                         st ? AS_STORED : NULL, &all);
        ck_assert_int_eq(all, st ? 5 : 4);
        ck_assert_int_eq(tc, all);
    }
    ir_graph_free(g);
    ir_graph_free(g16);
    Lib l;
    lib_open(&l);
    check_flash(&l, CG_MMA_BF16, build_flash_grad_grouped);
    check_flash(&l, CG_MMA_FP16, build_flash_grad_grouped);
    lib_close(&l);
    check_flash16(build_flash_grad_grouped16);
}
END_TEST

/* Sizes named as the kernel bodies' locals: a cross-attention of t query rows over nc context
 * keys with a [t, nc] context mask (2 batches), forward and gradient, bf16 storage (both
 * kernels/flash_fwd.cuh and flash_bwd.cuh). The mask macro's text names the sizes; the backward
 * has a loop named nc around it, so cu_name_reserved must rename that size (a shadowed size reads
 * the wrong mask elements). */
START_TEST(test_flash_size_names)
{
    IrGraph *g = ir_graph_new("flash_names");
    IrDim t = ir_dim_sym(ir_graph_add_sym(g, "t", 64)), nc = ir_dim_sym(ir_graph_add_sym(g, "nc", 64));
    IrDim two = ir_dim(2), one = ir_dim(1), sq[] = {two, one, t, ir_dim(8)}, sk[] = {two, one, nc, ir_dim(8)};
    IrDim smask[] = {two, one, t, nc};
    IrNode *a = ir_attention(g, input(g, "q", IR_F32, 4, sq), input(g, "k", IR_F32, 4, sk), input(g, "v", IR_F32, 4, sk),
                             NULL, input(g, "cmask", IR_BOOL, 4, smask), ir_const(g, 0.35, IR_F32), 0, 1);
    out(g, "cross", a);
    out(g, "cross_grad", ir_attention_grad(g, a, input(g, "dout", IR_F32, 4, sq)));
    char err[1024];
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s", err);
    int all;
    ck_assert_int_eq(count_attention_kernels(g, 1, IR_ATTENTION, AS_STORED, NULL, &all), 1);
    ck_assert_int_eq(count_attention_kernels(g, 1, IR_ATTENTION_GRAD, AS_STORED, NULL, &all), 1);
    Lib l;
    lib_open(&l);
    static const int64_t sizes[][2] = {{5, 7}};
    storage = 1;
    check_flash_graph(&l, CG_MMA_BF16, g, sizes, 1);
    storage = 0;
    lib_close(&l);
    ir_graph_free(g);
}
END_TEST

/* ---- a whole model ---- */

/* The model as xtc compile [--train] --target cuda-emu builds it. */
static IrGraph *lower_model(const char *path, int train)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file(path, &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s: %s", path, d.text ? d.text : "");
    XtLowerOpts lo = {.train = train};
    char err[1024];
    IrGraph *h = harness_build(f, NULL, &lo, train, harness_target("cuda-emu"), HARNESS_EVERY_PASS, &d, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: %s %s", path, err, d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
    return h;
}

/* tiny_gpt's forward, or its loss and every gradient (train), with and without tensor cores;
 * each output tensor within rtol of its own largest value (1e-7 absolute: the smallest
 * gradients are about 1e-7). Training in fp16 is left out here (this graph is differentiated
 * without loss scaling, under which gradients below fp16's normal range, 6.1e-5, such as its
 * q/k weight gradients of about 1e-7, come out up to 60% off); the loss_scale case checks fp16
 * training with scaling on a smaller decoder. bf16 has f32's range. */
static void check_model(int train)
{
    const char *mode = train ? "loss and gradients" : "forward";
    IrGraph *g = lower_model(XTC_SOURCE_DIR "/models/tiny_gpt.xtf", train);
    /* weights of the size a trained model has (|w| < 0.1), tokens 0..10, b = 2, n = 19 */
    int64_t syms[IR_MAXSYM] = {0};
    for (int s = 0; s < g->nsyms; s++)
        syms[s] = s == 0 ? 2 : 19;
    RefBinding rb;
    bind_rounded(&rb, g, syms, 0.05, NULL, NULL, 0);
    IrHostTensor *ref = interp_outputs(g, ref_cb, &rb, NULL, NULL);
    const char *name = train ? "tiny_gpt_train" : "tiny_gpt";
    XtcModule *f32 = compile_mma(g, name, CG_MMA_OFF);
    XtcSession *s32 = run_module(f32, &rb.b, "tiny_gpt f32", "forward");
    double e32 = compare_outputs(g, s32, ref, "tiny_gpt f32", 1e-7, train ? 1e-3 : 1e-4);
    /* f32 storage with --mma: forward about 10 (bf16) and 16 (fp16) units of 16-bit rounding;
     * gradients through softmax, whose terms cancel, 15 units of bf16's. 16-bit storage (every
     * tensor between kernels rounded too) with the tensor cores --dtype implies: forward the
     * same bounds (observed 1.6 and 2 times the f32-storage errors, still 4 and 6 times below
     * them), gradients 13 units of bf16's (observed 0.021 of max|ref|, and 0.028 on another
     * draw of the data, under CK_FORK=no). rtol 0: not run (fp16 training, see above). */
    static const struct {
        int mma, storage;
        double rtol_forward, rtol_train;
    } configs[] = {
        {CG_MMA_BF16, 0, 2e-2, 3e-2},
        {CG_MMA_FP16, 0, 4e-3, 0},
        {CG_MMA_AUTO, 1, 2e-2, 5e-2}, /* --dtype bf16: --mma=bf16 by default */
        {CG_MMA_AUTO, 2, 4e-3, 0},    /* --dtype fp16: --mma=fp16 */
    };
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        double rtol = train ? configs[c].rtol_train : configs[c].rtol_forward;
        if (rtol == 0)
            continue;
        int mma = configs[c].mma;
        storage = configs[c].storage;
        char what[96];
        snprintf(what, sizeof what, "%s --dtype %s --mma=%s", name, STORAGE_NAME[storage],
                 mma == CG_MMA_AUTO ? STORAGE_NAME[storage] : cg_mma_name(mma));
        XtcModule *m = compile_mma(g, name, mma);
        XtcSession *s = run_module(m, &rb.b, what, ORDERS[c % 3]);
        double e = compare_outputs(g, s, ref, what, 1e-7, rtol);
        /* the logits differ from the f32 module's: the operands really were rounded */
        XtcTensor a, b;
        ck_assert_int_eq(xtc_session_get_output(s, "logits", &a), XTC_OK);
        ck_assert_int_eq(xtc_session_get_output(s32, "logits", &b), XTC_OK);
        int64_t numel = 1, differ = 0;
        for (int d = 0; d < a.rank; d++)
            numel *= a.shape[d];
        for (int64_t i = 0; i < numel; i++)
            differ += ((const float *)a.data)[i] != ((const float *)b.data)[i];
        ck_assert_msg(differ > numel / 2, "%s: only %lld of %lld logits differ from f32", what, (long long)differ,
                      (long long)numel);
        fprintf(stderr, "test_cuda_mma: models/tiny_gpt.xtf %s (b=2 n=19) %s: largest error %.2g of a "
                        "tensor's max|ref| (f32 module: %.2g), tolerance %.1e\n", mode, what, e, e32, rtol);
        xtc_session_free(s);
        xtc_module_free(m);
        storage = 0;
    }
    xtc_session_free(s32);
    xtc_module_free(f32);
    free_outputs(g, ref);
    bind_rounded_free(&rb);
    ir_graph_free(g);
}

START_TEST(test_model)
{
    check_model(0);
}
END_TEST

/* backward matmuls (transposed operands, gradients of the weights) on tensor cores too */
START_TEST(test_model_train)
{
    check_model(1);
}
END_TEST

/* ---- loss scaling (fp16 training; include/xtc.h, XTC_LOSS_SCALE_INPUT) ---- */

/* A small decoder, as xtc compile --train --dtype fp16 builds it: seeded by the loss-scale input. */
static IrGraph *lower_scaled(void)
{
    static const char src[] = "tiny = TransformerWrapper(num_tokens = 37, max_seq_len = 16,\n"
                              "    attn_layers = Decoder(dim = 32, depth = 1, heads = 2))\n";
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", src, strlen(src), &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    XtLowerOpts lo = {.train = 1};
    char err[1024];
    DrvTarget fp16; /* its loss scale is the loss-scale input */
    ck_assert_msg(drv_target(&fp16, &(CgOptions){.target = "cuda-emu", .dtype = "fp16"}, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(fp16.loss_scale, XTC_LOSS_SCALE_INPUT);
    IrGraph *h = harness_build(f, NULL, &lo, 1, &fp16, HARNESS_EVERY_PASS, &d, err, sizeof err);
    ck_assert_msg(h != NULL, "%s %s", err, d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
    return h;
}

/* ... at b = 2, n = 13, with fp16 storage and inputs and weights drawn in [-0.05, 0.05] */
static IrGraph *lower_scaled_bound(int64_t *syms, RefBinding *rb)
{
    IrGraph *g = lower_scaled();
    for (int k = 0; k < g->nsyms; k++)
        syms[k] = k == 0 ? 2 : 13;
    storage = 2;
    bind_rounded(rb, g, syms, 0.05, NULL, NULL, 0);
    return g;
}

/* A session of m with every leaf of bd bound but the loss scale (which the session binds). */
static XtcSession *session_unscaled_inputs(XtcModule *m, const Binding *bd)
{
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "session: %s", xtc_session_error(s));
    for (int i = 0; i < bd->n; i++)
        if (strcmp(bd->leaf[i]->s, XTC_LOSS_SCALE_INPUT) != 0)
            ck_assert_msg(bind_leaf(s, bd, i) == XTC_OK, "binding '%s': %s", bd->leaf[i]->s, xtc_session_error(s));
    return s;
}

/* max|got - ref| / max|ref| of output o */
static double rel_error(XtcSession *s, const IrGraph *g, const IrHostTensor *ref, int o, double *maxref)
{
    XtcTensor t;
    ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
    int64_t numel = ir_host_numel(&ref[o]);
    const float *a = t.data, *e = ref[o].data;
    double maxabs = 0, maxerr = 0;
    for (int64_t i = 0; i < numel; i++) {
        maxabs = fmax(maxabs, fabs(e[i]));
        maxerr = fmax(maxerr, fabs((double)a[i] - e[i]));
    }
    *maxref = maxabs;
    return maxabs > 0 ? maxerr / maxabs : maxerr;
}

/* With the session's loss scale (2^16) every gradient of an fp16 module is within fp16's
 * gradient tolerance (10 u of its tensor's max|ref|) of the f64 interpreter's on the same
 * rounded weights; bound to 1 by the caller (no scaling) the smallest gradient tensor, below
 * fp16's normal range, is far off. */
START_TEST(test_loss_scale_accuracy)
{
    ck_assert_ptr_null(cg_loss_scale_input(NULL));
    ck_assert_ptr_null(cg_loss_scale_input("f32"));
    ck_assert_ptr_null(cg_loss_scale_input("bf16"));
    ck_assert_str_eq(cg_loss_scale_input("fp16"), XTC_LOSS_SCALE_INPUT);
    int64_t syms[IR_MAXSYM] = {0};
    RefBinding rb;
    IrGraph *g = lower_scaled_bound(syms, &rb);
    const IrNode *ls = ir_find_leaf(g, IR_INPUT, XTC_LOSS_SCALE_INPUT);
    ck_assert_ptr_nonnull(ls);
    *(float *)rb.ref[bind_index(&rb.b, ls)].data = 1; /* the reference: true gradients */
    IrHostTensor *ref = interp_outputs(g, ref_cb, &rb, NULL, NULL);
    XtcModule *m = compile_mma(g, "loss_scale", CG_MMA_AUTO);
    ck_assert_int_ge(xtc_module_find(m, XTC_INPUT, XTC_LOSS_SCALE_INPUT), 0);

    XtcSession *scaled = session_unscaled_inputs(m, &rb.b);
    ck_assert_int_eq(xtc_session_run(scaled), XTC_OK);
    ck_assert(xtc_session_loss_scale(scaled) == 65536);
    XtcSession *plain = session_unscaled_inputs(m, &rb.b);
    float one = 1;
    ck_assert_int_eq(xtc_session_set_input(plain, XTC_LOSS_SCALE_INPUT, XTC_F32, 0, NULL, &one), XTC_OK);
    ck_assert_msg(xtc_session_run(plain) == XTC_OK, "%s", xtc_session_error(plain));
    ck_assert(xtc_session_loss_scale(plain) == 65536); /* the session's S; the caller's 1 won */

    const double u = 0x1p-11, tol = 10 * u;
    int smallest = -1;
    double smallest_max = INFINITY, worst = 0;
    for (int o = 0; o < g->noutputs; o++) {
        double maxref, e = rel_error(scaled, g, ref, o, &maxref);
        int grad = strncmp(g->outputs[o].name, "grad.", 5) == 0;
        double bound = grad ? tol : 5 * u + 1e-4 / fmax(maxref, 1e-30);
        ck_assert_msg(e <= bound, "output '%s' (max|ref| %.3g): relative error %.3g with loss scaling, bound %.3g",
                      g->outputs[o].name, maxref, e, bound);
        if (grad) {
            worst = fmax(worst, e);
            if (maxref > 0 && maxref < smallest_max) {
                smallest_max = maxref;
                smallest = o;
            }
        }
    }
    ck_assert_int_ge(smallest, 0);
    ck_assert_msg(smallest_max < 6.1e-5, "the smallest gradient tensor ('%s', max %.3g) is not below fp16's normal range",
                  g->outputs[smallest].name, smallest_max);
    double maxref, e_scaled = rel_error(scaled, g, ref, smallest, &maxref);
    double e_plain = rel_error(plain, g, ref, smallest, &maxref);
    fprintf(stderr, "test_cuda_mma: fp16 training, smallest gradient '%s' (max|ref| %.2g): relative error %.2g with "
                    "loss scaling (worst gradient %.2g), %.2g without; tolerance %.2g\n", g->outputs[smallest].name,
            smallest_max, e_scaled, worst, e_plain, tol);
    ck_assert_msg(e_plain > 10 * tol && e_plain > 20 * e_scaled, "without scaling '%s' is only %.3g off (scaled %.3g)",
                  g->outputs[smallest].name, e_plain, e_scaled);
    /* handing the input back: the session binds S again */
    ck_assert_int_eq(xtc_session_set_loss_scale(plain, 65536, 0), XTC_OK);
    ck_assert_int_eq(xtc_session_run(plain), XTC_OK);
    ck_assert_double_le(rel_error(plain, g, ref, smallest, &maxref), tol);
    ck_assert_int_eq(xtc_session_set_loss_scale(plain, 0.5, 0), XTC_ERR_RANGE);
    float bad = -2;
    ck_assert_int_eq(xtc_session_set_input(plain, XTC_LOSS_SCALE_INPUT, XTC_F32, 0, NULL, &bad), XTC_OK);
    ck_assert_int_eq(xtc_session_run(plain), XTC_ERR_RANGE);
    xtc_session_free(plain);
    xtc_session_free(scaled);
    xtc_module_free(m);
    free_outputs(g, ref);
    bind_rounded_free(&rb);
    ir_graph_free(g);
    storage = 0;
}
END_TEST

/* A scale so large that the fp16 gradients overflow: the step is skipped (weights, step count
 * unchanged) and S halves; with a growth interval of 2, two good steps double S; checkpoints
 * keep S and the count towards the next doubling. */
START_TEST(test_loss_scale_overflow)
{
    int64_t syms[IR_MAXSYM] = {0};
    RefBinding rb;
    IrGraph *g = lower_scaled_bound(syms, &rb);
    XtcModule *m = compile_mma(g, "loss_scale", CG_MMA_AUTO);
    XtcSession *s = session_unscaled_inputs(m, &rb.b);
    XtcAdamW opt = xtc_adamw_defaults();
    XtcTensorInfo pi;
    ck_assert_int_eq(xtc_module_tensor(m, XTC_PARAM, 0, &pi), XTC_OK);
    XtcTensor w;
    ck_assert_int_eq(xtc_session_get_weight(s, pi.name, &w), XTC_OK);
    int64_t numel = 1;
    for (int d = 0; d < w.rank; d++)
        numel *= w.shape[d];
    float *before = malloc((size_t)numel * sizeof *before);
    memcpy(before, w.data, (size_t)numel * sizeof *before);

    ck_assert_int_eq(xtc_session_set_loss_scale(s, 0x1p40, 2), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    ck_assert_int_eq(xtc_session_step(s, &opt), XTC_OK);
    ck_assert_int_eq(xtc_session_step_skipped(s), 1);
    ck_assert_int_eq(xtc_session_step_count(s), 0);
    ck_assert(xtc_session_loss_scale(s) == 0x1p39);
    ck_assert_int_eq(xtc_session_get_weight(s, pi.name, &w), XTC_OK);
    ck_assert_int_eq(memcmp(before, w.data, (size_t)numel * sizeof *before), 0);

    ck_assert_int_eq(xtc_session_set_loss_scale(s, 1024, 2), XTC_OK);
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(xtc_session_run(s), XTC_OK);
        ck_assert_int_eq(xtc_session_step(s, &opt), XTC_OK);
        ck_assert_int_eq(xtc_session_step_skipped(s), 0);
    }
    ck_assert_int_eq(xtc_session_step_count(s), 3);
    ck_assert(xtc_session_loss_scale(s) == 2048); /* doubled after two steps, one counted since */
    ck_assert_int_eq(xtc_session_get_weight(s, pi.name, &w), XTC_OK);
    ck_assert_int_ne(memcmp(before, w.data, (size_t)numel * sizeof *before), 0);

    char path[600];
    snprintf(path, sizeof path, "%s/loss_scale.ckpt.safetensors", tmpdir);
    ck_assert_msg(xtc_session_save_checkpoint(s, path, NULL, NULL, 0) == XTC_OK, "%s", xtc_session_error(s));
    XtcSession *t = session_unscaled_inputs(m, &rb.b);
    ck_assert(xtc_session_loss_scale(t) == 65536);
    ck_assert_msg(xtc_session_load_checkpoint(t, path, 1) == XTC_OK, "%s", xtc_session_error(t));
    ck_assert(xtc_session_loss_scale(t) == 2048);
    ck_assert_int_eq(xtc_session_step_count(t), 3);
    ck_assert_int_eq(xtc_session_set_loss_scale(t, 2048, 2), XTC_OK); /* restarts the count */
    ck_assert_msg(xtc_session_load_checkpoint(t, path, 1) == XTC_OK, "%s", xtc_session_error(t));
    ck_assert_int_eq(xtc_session_run(t), XTC_OK);
    ck_assert_int_eq(xtc_session_step(t, &opt), XTC_OK);
    ck_assert(xtc_session_loss_scale(t) == 4096); /* the restored count: one more good step doubles */
    xtc_session_free(t);
    unlink(path);
    free(before);
    xtc_session_free(s);
    xtc_module_free(m);
    bind_rounded_free(&rb);
    ir_graph_free(g);
    storage = 0;
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_mma");
    TCase *tc = tcase_create("mma");
    tcase_add_test(tc, test_conversions);
    tcase_add_test(tc, test_mma_fragments);
    tcase_add_test(tc, test_matmul_source);
    tcase_add_test(tc, test_mma_with_dtype);
    tcase_add_test(tc, test_matmul_forms);
    tcase_add_test(tc, test_model);
    tcase_add_test(tc, test_model_train);
    suite_add_tcase(s, tc);
    TCase *m16 = tcase_create("mma16");
    tcase_add_test(m16, test_matmul_16bit_operands);
    tcase_add_test(m16, test_matmul_at_f32_storage);
    suite_add_tcase(s, m16);
    TCase *fl = tcase_create("flash");
    tcase_add_test(fl, test_flash_attention);
    tcase_add_test(fl, test_flash_stored);
    tcase_add_test(fl, test_flash_rows);
    tcase_add_test(fl, test_flash_grad);
    suite_add_tcase(s, fl);
    TCase *fb = tcase_create("flash_bwd");
    tcase_add_test(fb, test_flash_grad16);
    tcase_add_test(fb, test_flash_bounded);
    suite_add_tcase(s, fb);
    TCase *fg = tcase_create("flash_grouped"); /* CK_RUN_CASE=flash_grouped runs it alone */
    tcase_add_test(fg, test_flash_grad_grouped);
    suite_add_tcase(s, fg);
    TCase *fn = tcase_create("flash_names"); /* CK_RUN_CASE=flash_names runs it alone */
    tcase_add_test(fn, test_flash_size_names);
    suite_add_tcase(s, fn);
    TCase *ls = tcase_create("loss_scale");
    tcase_add_test(ls, test_loss_scale_accuracy);
    tcase_add_test(ls, test_loss_scale_overflow);
    suite_add_tcase(s, ls);
    return s;
}

int main(void)
{
    return harness_run(suite(), "mma");
}
