/* rt_abi.h: the binary interface between a compiled module (model.so) and the runtime.
 *
 * A module exports exactly one symbol, `xtc_module_v1`, an XtcModuleV1. The runtime checks its
 * magic and version, parses the metadata text (format below, read by runtime/rt_meta.c and
 * written by codegen/cg_plan.c), allocates every buffer, and calls `run` once per forward pass.
 *
 * codegen builds these structs as LLVM types; it checks at compile time that its field offsets
 * agree with offsetof() here (cg_llvm.c), so this header is the one description of the layout.
 *
 * Metadata text, one record per line, fields separated by single spaces, names without spaces:
 *   xtc-module 1                            first line: format name and version
 *   model NAME
 *   option KEY VALUE                        compile options (opt, cpu, features, compiler ...);
 *                                           "requires": the CPU features (LLVM names, comma-
 *                                           separated) the code may use, which the loader checks
 *   sym NAME MAX                            symbolic dimension, MAX 0 = unbounded
 *   derive NAME DIM CAP                     the symbol NAME (declared just before) is derived:
 *                                           NAME = min(DIM, CAP) (CAP 0: NAME = DIM), DIM an
 *                                           affine form of earlier symbols, evaluated once the
 *                                           inputs bind those (Transformer-XL: q = min(n+p, 512))
 *   limit DIM MAX                           DIM, an affine form of the symbols, must not exceed
 *                                           MAX once the inputs bind them (a KV cache's c+n <=
 *                                           max_seq_len: the cache's positions and the call's)
 *   buffer ID KIND NAME DTYPE SHAPE FIRST LAST
 *       KIND input | param | state (persistent buffer from the weights file) | temp
 *       NAME the input/param name, or the node's label for temps; "<label>.scratch" for a
 *            step's scratch (a temp of FIRST = LAST = that step, which its kernels alone use:
 *            the CUDA tensor-core attention backward's rows' dlse_i - D_i; cg_plan.h)
 *       SHAPE [d0,d1,...] with each d an affine form over the symbols: 64, n, n+3, 2*b, m+n, n-1
 *       FIRST, LAST the schedule steps that write it first and read it last (temps only; -1)
 *   storage BUFFER FORMAT                   the f32 BUFFER is stored in FORMAT, bf16 or fp16 (compile
 *                                           --dtype; cg_plan.h CgPlanOpts): the kernels read (and
 *                                           write) it in 16 bits, the host API sees f32 and the
 *                                           runtime converts. A CPU module stores only weights and
 *                                           inputs so (rt_store.c keeps bf16 copies of them), and
 *                                           its KV caches (--kv-dtype) in bf16 or int8: rows of the
 *                                           constant last dimension D as D int8 values and an f32
 *                                           scale (rt_half.h rt_i8_row_quantize); a CUDA module's
 *                                           XtcCudaModuleV1.buf_storage says the same (no int8). No
 *                                           record: its dtype (every module of an earlier xtc)
 *   output NAME BUFFER DTYPE SHAPE          an output and the buffer holding it (it may alias an
 *                                           input or another buffer through a reshape)
 *   alias NAME BUFFER                       a second weights-file name of a param or state
 *                                           buffer (tied weights): it must hold the same values
 *   init BUFFER RULE VALUE                  how fresh values of that param or state buffer start
 *                                           (xtc init, xtc train): RULE one of XtcInitRule's
 *                                           names below, VALUE its parameter (%a); the lowering
 *                                           records one per weight. (A module of an earlier xtc
 *                                           writes "init BUFFER VALUE": const.)
 *   range INPUT LO HI                       integer input used as indices: values in [LO, HI);
 *                                           LO INT64_MIN: targets (negative ones are ignored)
 *   norm BUFFER NORM                        the f32 input BUFFER's rows (last axis) have L2
 *                                           norms <= NORM (%a), which a kernel relies on (cosine-
 *                                           sim attention reading a KV cache): the runtime checks
 *                                           the rows a caller binds to it
 *   kernel ID FUNCTION OP USES              one generated function, shared by USES steps
 *   step ID KERNEL OUT IN0 .. INk OP LABEL  schedule entry: 3 to XTC_ABI_MAXIN operand buffers,
 *                                           -1 for absent operands
 *   end
 */
#ifndef XTC_RT_ABI_H
#define XTC_RT_ABI_H

#include <math.h>
#include <stdint.h>

#define XTC_ABI_MAGIC 0x31435458u /* "XTC1" little-endian */
#define XTC_ABI_VERSION 1
#define XTC_ABI_SYMBOL "xtc_module_v1"
#define XTC_META_HEADER "xtc-module 1"
#define XTC_ABI_MAXIN 8 /* operands of a schedule step (the IR's IR_MAXIN; checked in codegen) */

/* The rules of "init" records (the IR's IrInitKind, by name), each with one parameter v:
 *   const v     every element v             normal v    N(0, v^2)      uniform v   U(-v, v)
 *   alibi       element h of H: log(xtc_alibi_slope(H, h)) (v unused)
 *   inv_freq v  element k of n: 1 / v^(k / n) (rotary's inverse frequencies, v the base) */
typedef enum { XTC_INIT_CONST, XTC_INIT_NORMAL, XTC_INIT_UNIFORM, XTC_INIT_ALIBI, XTC_INIT_INV_FREQ, XTC_INIT_XPOS_SCALE, XTC_NUM_INITS } XtcInitRule;
static inline const char *xtc_init_rule_name(int r)
{
    static const char *const names[XTC_NUM_INITS] = {"const", "normal", "uniform", "alibi", "inv_freq", "xpos_scale"};
    return r >= 0 && r < XTC_NUM_INITS ? names[r] : "?";
}

/* ALiBi's fixed slope of head h of `heads` (XT-SEMANTICS.md 7.4): for a power of two n,
 * start^(h+1) with start = 2^(-2^-(log2 n - 3)); otherwise the slopes of the power of two p below,
 * then every other slope of 2p. Rounded to f32 as x-transformers' tensor holds it. The lowering's
 * fixed slopes and the runtime's "alibi" rule both use this one definition. */
static inline double xtc_alibi_slope(int64_t heads, int64_t h)
{
    int64_t p2 = 1;
    while (p2 * 2 <= heads)
        p2 *= 2;
    int64_t n = h < p2 ? p2 : 2 * p2, i = h < p2 ? h : 2 * (h - p2);
    double start = pow(2.0, -pow(2.0, -(log2((double)n) - 3)));
    return (float)(start * pow(start, (double)i));
}

/* Runs fn(ctx, lo, hi) over disjoint ranges covering [0, n), possibly on several threads, and
 * returns when all are done. */
typedef void (*XtcTaskFn)(void *ctx, int64_t lo, int64_t hi);
typedef void (*XtcParallelFor)(void *pool, XtcTaskFn fn, void *ctx, int64_t n);

/* Called after each schedule step when profiling or summing gradients over ranks (NULL otherwise). */
typedef void (*XtcStepHook)(void *ctx, int32_t step);

/* What the runtime hands to a module's run function. */
typedef struct XtcRtApi {
    void *pool;
    XtcParallelFor parallel_for;
    int64_t nthreads;
    XtcStepHook step_done;
    void *hook_ctx;
} XtcRtApi;

/* bufs[i]: the memory of metadata buffer i; syms[s]: the value of symbol s.
 * Returns 0, or 1 + the index of the schedule step that failed (an index out of range). */
typedef int32_t (*XtcRunFn)(void **bufs, const int64_t *syms, const XtcRtApi *rt);

typedef struct XtcModuleV1 {
    uint32_t magic;     /* XTC_ABI_MAGIC */
    uint32_t version;   /* XTC_ABI_VERSION */
    const char *meta;   /* metadata text, NUL-terminated */
    const char *source; /* the .xtf source the module was compiled from ("" if none) */
    XtcRunFn run;
} XtcModuleV1;

#endif
