/* xtc_cuda_emu.h: the CUDA emulator: runs xtc's generated CUDA C on the CPU, so that every CUDA
 * kernel is checked against the reference interpreter on machines without a GPU.
 *
 * A cuda-emu module compiles the very CUDA C that NVRTC compiles for the GPU, as C11 (gcc or
 * clang), after this header. The header supplies the part of CUDA the generator uses:
 *
 *   __global__ __device__ __shared__ __restrict__   qualifiers; __shared__ variables are static
 *                                                  thread-local: one copy per OS thread, and a
 *                                                  block runs entirely on one OS thread
 *   threadIdx blockIdx blockDim gridDim warpSize    the running emulated thread's coordinates
 *   __syncthreads()                                 a real barrier: the thread stops until every
 *                                                  thread of its block has arrived
 *   __shfl_sync __shfl_xor_sync __shfl_up_sync __shfl_down_sync   (3 or 4 arguments)
 *   __ballot_sync __any_sync __all_sync __syncwarp __activemask   warp-synchronous: a lane
 *                                                  waits until every lane of the mask has
 *                                                  reached the same operation, then exchanges
 *   atomicAdd atomicSub atomicExch atomicMax atomicMin atomicCAS atomicAnd atomicOr atomicXor
 *   __threadfence rsqrtf __expf __logf __fdividef __int_as_float __float_as_int __ldg ...
 *   __fadd_rn __fsub_rn __fmul_rn __fdiv_rn __fsqrt_rn   IEEE single operations that the GPU
 *                                                  compiler does not contract into FMAs: plain
 *                                                  C arithmetic here (the same bits)
 *
 * Threads are coroutines: every thread of a block has its own stack; the scheduler runs one
 * thread until it finishes or stops at a barrier or warp operation, then the next, in the order
 * the launch asks for (forward, reverse or shuffled: a kernel missing a barrier computes wrong
 * values in at least one of them). Kernels the generator marks barrier-free run as plain calls.
 * The emulator is strict where CUDA leaves behaviour undefined, and reports it as a launch error:
 * a barrier or warp operation some threads never reach (deadlock), __syncthreads after some
 * threads of the block exited, a warp operation whose mask names exited or missing lanes, lanes
 * of a warp in different warp operations, a shuffle reading a lane outside the mask.
 *
 * Context switches are a few instructions of assembly on x86-64 and ucontext elsewhere (define
 * XTC_EMU_UCONTEXT to force it). Blocks run one after another on the calling thread. */
#ifndef XTC_CUDA_EMU_H
#define XTC_CUDA_EMU_H

#define XTC_CUDA_EMULATION 1

#include "rt_cuda_abi.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- types and qualifiers ---- */

typedef long long i64;
typedef unsigned char u8;
typedef struct {
    unsigned int x, y, z;
} uint3;
typedef uint3 dim3;

#define XTC_KERNEL static void
#define XTC_INLINE static inline
#define XTC_INF INFINITY
#define XTC_NAN NAN
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ restrict
#define __shared__ static __thread
#define warpSize 32

/* ---- emulated threads and blocks ---- */

enum { XTC_EMU_RUNNABLE, XTC_EMU_AT_BARRIER, XTC_EMU_AT_WARP, XTC_EMU_DONE };
enum { XTC_EMU_OP_SYNCWARP = 1, XTC_EMU_OP_SHFL, XTC_EMU_OP_VOTE };
enum { XTC_EMU_IDX, XTC_EMU_XOR, XTC_EMU_UP, XTC_EMU_DOWN };

#define XTC_EMU_STACK (64 * 1024)  /* bytes of stack per emulated thread */
#define XTC_EMU_CANARY 256         /* bytes at the bottom of each stack checked for overflow */

#if defined(__x86_64__) && !defined(XTC_EMU_UCONTEXT)
#define XTC_EMU_ASM 1
#else
#include <ucontext.h>
#endif

typedef struct {
    uint3 idx;         /* threadIdx */
    int lane, warp;
    int state;         /* XTC_EMU_* */
    unsigned mask;     /* the warp operation it waits in: mask and kind */
    int op;
    int parity;        /* which of the two exchange buffers its next warp operation uses */
    char *stack;
#ifdef XTC_EMU_ASM
    void *sp;          /* saved stack pointer */
#else
    ucontext_t uc;
#endif
} XtcEmuThread;

/* Lanes of a warp waiting in the same warp operation (the same mask and kind). */
typedef struct {
    unsigned mask, lanes; /* the operation's mask; the lanes of it that have arrived */
    int op;
} XtcEmuGroup;

typedef struct {
    uint3 idx;         /* blockIdx */
    dim3 dim, grid;    /* blockDim, gridDim */
    const XtcEmuKernel *kernel;
    void **args;
    XtcEmuThread *threads;
    int n, live, exited, at_barrier;
    int direct;        /* barrier-free kernel: threads run as plain calls */
    uint64_t (*slots)[2][32]; /* per warp: values exchanged by warp operations, double-buffered */
    unsigned *exists, *done;  /* per warp: lanes that exist in the block, lanes that exited */
    unsigned *waiting;        /* per warp: lanes in a warp operation (state XTC_EMU_AT_WARP) */
    XtcEmuGroup (*groups)[32]; /* per warp: the warp operations lanes wait in, one per mask and kind */
    int *ngroups;
    uint64_t scratch[32];
#ifdef XTC_EMU_ASM
    void *sched_sp;
#else
    ucontext_t sched_uc;
#endif
    int failed;
    char *err;
    size_t nerr;
} XtcEmuBlock;

static __thread XtcEmuBlock *xtc_emu_block;
static __thread XtcEmuThread *xtc_emu_thread;

#define threadIdx (xtc_emu_thread->idx)
#define blockIdx (xtc_emu_block->idx)
#define blockDim (xtc_emu_block->dim)
#define gridDim (xtc_emu_block->grid)

__attribute__((format(printf, 2, 3))) static void xtc_emu_fail(XtcEmuBlock *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    b->failed = 1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(b->err, b->nerr, "kernel %s, block (%u,%u,%u): %s", b->kernel->name, b->idx.x, b->idx.y, b->idx.z,
             msg);
}

/* ---- context switches ---- */

#ifdef XTC_EMU_ASM
/* xtc_emu_swap(save, next): saves the callee-saved registers, mxcsr and the x87 control word on
 * the current stack, stores the stack pointer in *save, switches to next and restores. A new
 * thread's stack starts with a frame whose return address is xtc_emu_boot, which calls the
 * entry function left in r12. */
void xtc_emu_swap(void **save, void *next) __attribute__((visibility("hidden")));
void xtc_emu_boot(void) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".globl xtc_emu_swap\n"
        ".hidden xtc_emu_swap\n"
        ".type xtc_emu_swap,@function\n"
        "xtc_emu_swap:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $16, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 8(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 8(%rsp)\n"
        "  addq $16, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size xtc_emu_swap, .-xtc_emu_swap\n"
        ".globl xtc_emu_boot\n"
        ".hidden xtc_emu_boot\n"
        ".type xtc_emu_boot,@function\n"
        "xtc_emu_boot:\n"
        "  callq *%r12\n"
        "  ud2\n"
        ".size xtc_emu_boot, .-xtc_emu_boot\n");

static void xtc_emu_prepare(XtcEmuBlock *b, XtcEmuThread *t, void (*entry)(void))
{
    (void)b;
    uintptr_t top = ((uintptr_t)(t->stack + XTC_EMU_STACK)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 88); /* 16 + 6 registers + return address, then 16 spare */
    sp[0] = 0x1F80;                       /* mxcsr: round to nearest, exceptions masked */
    sp[1] = 0x037F;                       /* x87 control word */
    sp[2] = sp[3] = sp[4] = 0;            /* r15 r14 r13 */
    sp[5] = (uint64_t)(uintptr_t)entry;   /* r12: what xtc_emu_boot calls */
    sp[6] = sp[7] = 0;                    /* rbx rbp */
    sp[8] = (uint64_t)(uintptr_t)xtc_emu_boot;
    t->sp = sp;
}

static void xtc_emu_resume(XtcEmuBlock *b, XtcEmuThread *t) { xtc_emu_swap(&b->sched_sp, t->sp); }
static void xtc_emu_yield(XtcEmuBlock *b, XtcEmuThread *t) { xtc_emu_swap(&t->sp, b->sched_sp); }
#else
static void xtc_emu_prepare(XtcEmuBlock *b, XtcEmuThread *t, void (*entry)(void))
{
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack;
    t->uc.uc_stack.ss_size = XTC_EMU_STACK;
    t->uc.uc_link = &b->sched_uc;
    makecontext(&t->uc, entry, 0);
}

static void xtc_emu_resume(XtcEmuBlock *b, XtcEmuThread *t) { swapcontext(&b->sched_uc, &t->uc); }
static void xtc_emu_yield(XtcEmuBlock *b, XtcEmuThread *t) { swapcontext(&t->uc, &b->sched_uc); }
#endif

/* The first function of every emulated thread of a kernel with barriers. */
static void xtc_emu_entry(void)
{
    XtcEmuBlock *b = xtc_emu_block;
    b->kernel->call(b->args);
    XtcEmuThread *t = xtc_emu_thread;
    t->state = XTC_EMU_DONE;
    xtc_emu_yield(b, t); /* a finished thread is never resumed */
}

/* ---- vector accesses ---- */

/* The prelude's xtc_cp16 (a 128-bit load and store on the GPU): both addresses must be 16-byte
 * aligned, as the GPU's must, where a misaligned one faults; here it fails the launch. */
static inline void xtc_emu_cp16(void *d, const void *s)
{
    if (((uintptr_t)d | (uintptr_t)s) & 15u)
        xtc_emu_fail(xtc_emu_block, "a 16-byte copy from %p to %p: not 16-byte aligned", s, d);
    else
        memcpy(d, s, 16);
}

/* The prelude's other 16-byte accesses (xtc_ld8 of 16-bit storage, xtc_st8): p must be 16-byte
 * aligned, as on the GPU; a misaligned one fails the launch. */
static inline void xtc_emu_check16(const void *p, const char *what)
{
    if ((uintptr_t)p & 15u)
        xtc_emu_fail(xtc_emu_block, "%s at %p: not 16-byte aligned", what, p);
}

/* ---- barriers and warp operations ---- */

static inline void xtc_emu_syncthreads(void)
{
    XtcEmuBlock *b = xtc_emu_block;
    if (b->direct) {
        xtc_emu_fail(b, "__syncthreads() in a kernel generated as barrier-free");
        return;
    }
    XtcEmuThread *t = xtc_emu_thread;
    t->state = XTC_EMU_AT_BARRIER;
    b->at_barrier++;
    xtc_emu_yield(b, t);
}
#define __syncthreads() xtc_emu_syncthreads()

/* Publishes v as this lane's value and waits until every lane of mask has reached the same
 * warp operation; returns the 32 values (valid for the lanes of mask). */
static const uint64_t *xtc_emu_warp_exchange(unsigned mask, int op, uint64_t v)
{
    XtcEmuBlock *b = xtc_emu_block;
    XtcEmuThread *t = xtc_emu_thread;
    if (b->direct) {
        xtc_emu_fail(b, "warp operation in a kernel generated as barrier-free");
        for (int l = 0; l < 32; l++)
            b->scratch[l] = v;
        return b->scratch;
    }
    uint64_t *slots = b->slots[t->warp][t->parity];
    slots[t->lane] = v;
    t->parity ^= 1;
    t->mask = mask;
    t->op = op;
    t->state = XTC_EMU_AT_WARP;
    xtc_emu_yield(b, t);
    return slots;
}

static uint64_t xtc_emu_shfl(int kind, unsigned mask, uint64_t v, int arg, int width)
{
    XtcEmuBlock *b = xtc_emu_block;
    int lane = xtc_emu_thread->lane;
    const uint64_t *s = xtc_emu_warp_exchange(mask, XTC_EMU_OP_SHFL, v);
    if (width < 1 || width > 32 || (width & (width - 1))) {
        xtc_emu_fail(b, "shuffle width %d is not a power of 2 in [1, 32]", width);
        return v;
    }
    int base = lane & ~(width - 1), src = lane;
    switch (kind) {
    case XTC_EMU_IDX: src = base + (arg & (width - 1)); break;
    case XTC_EMU_XOR: src = lane ^ arg; break;
    case XTC_EMU_UP: src = lane - arg; break;
    default: src = lane + arg; break;
    }
    if (src < base || src >= base + width)
        src = lane; /* outside the lane's segment: its own value, as CUDA does */
    if (!((mask >> src) & 1u)) {
        xtc_emu_fail(b, "lane %d shuffles from lane %d, which is not in the mask 0x%08x", lane, src, mask);
        return v;
    }
    return s[src];
}

#define XTC_EMU_SHFL_TYPED(suffix, T)                                                                   \
    static inline T xtc_emu_shfl_##suffix(int kind, unsigned mask, T v, int arg, int width)             \
    {                                                                                                   \
        uint64_t u = 0;                                                                                 \
        memcpy(&u, &v, sizeof v);                                                                       \
        u = xtc_emu_shfl(kind, mask, u, arg, width);                                                    \
        memcpy(&v, &u, sizeof v);                                                                       \
        return v;                                                                                       \
    }
XTC_EMU_SHFL_TYPED(f, float)
XTC_EMU_SHFL_TYPED(d, double)
XTC_EMU_SHFL_TYPED(i, int)
XTC_EMU_SHFL_TYPED(u, unsigned int)
XTC_EMU_SHFL_TYPED(l, long)
XTC_EMU_SHFL_TYPED(ul, unsigned long)
XTC_EMU_SHFL_TYPED(ll, long long)
XTC_EMU_SHFL_TYPED(ull, unsigned long long)

#define XTC_EMU_SHFL_ANY(kind, mask, v, arg, width)                                                    \
    _Generic((v), float: xtc_emu_shfl_f, double: xtc_emu_shfl_d, int: xtc_emu_shfl_i,                  \
             unsigned int: xtc_emu_shfl_u, long: xtc_emu_shfl_l, unsigned long: xtc_emu_shfl_ul,       \
             long long: xtc_emu_shfl_ll, unsigned long long: xtc_emu_shfl_ull)(kind, mask, v, arg, width)
#define XTC_EMU_FIRST(a, ...) a
#define XTC_EMU_SECOND(a, b, ...) b
/* __shfl_*_sync(mask, var, lane_or_delta [, width = 32]) */
#define XTC_EMU_SHFL_CALL(kind, mask, v, ...)                                                           \
    XTC_EMU_SHFL_ANY(kind, mask, v, XTC_EMU_FIRST(__VA_ARGS__, 0), XTC_EMU_SECOND(__VA_ARGS__, 32, 0))
#define __shfl_sync(mask, v, ...) XTC_EMU_SHFL_CALL(XTC_EMU_IDX, mask, v, __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) XTC_EMU_SHFL_CALL(XTC_EMU_XOR, mask, v, __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) XTC_EMU_SHFL_CALL(XTC_EMU_UP, mask, v, __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) XTC_EMU_SHFL_CALL(XTC_EMU_DOWN, mask, v, __VA_ARGS__)

static inline unsigned xtc_emu_ballot(unsigned mask, int pred)
{
    const uint64_t *s = xtc_emu_warp_exchange(mask, XTC_EMU_OP_VOTE, pred != 0);
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if (((mask >> l) & 1u) && s[l])
            r |= 1u << l;
    return r;
}
#define __ballot_sync(mask, pred) xtc_emu_ballot((mask), (pred))
#define __any_sync(mask, pred) (xtc_emu_ballot((mask), (pred)) != 0)
#define __all_sync(mask, pred) (xtc_emu_ballot((mask), (pred)) == (unsigned)(mask))
#define __syncwarp(mask) ((void)xtc_emu_warp_exchange((mask), XTC_EMU_OP_SYNCWARP, 0))

static inline unsigned xtc_emu_activemask(void)
{
    XtcEmuThread *t = xtc_emu_thread;
    return xtc_emu_block->exists[t->warp] & ~xtc_emu_block->done[t->warp];
}
#define __activemask() xtc_emu_activemask()

/* ---- atomics (real ones: blocks may one day run on several OS threads) ---- */

#define XTC_EMU_ATOMIC_FLOAT(name, T, expr)                                                             \
    static inline T name(T *p, T v)                                                                     \
    {                                                                                                   \
        T old, nv;                                                                                      \
        __atomic_load(p, &old, __ATOMIC_RELAXED);                                                       \
        do {                                                                                            \
            nv = (expr);                                                                                \
        } while (!__atomic_compare_exchange(p, &old, &nv, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));      \
        return old;                                                                                     \
    }
XTC_EMU_ATOMIC_FLOAT(xtc_emu_atomic_add_f, float, old + v)
XTC_EMU_ATOMIC_FLOAT(xtc_emu_atomic_add_d, double, old + v)
XTC_EMU_ATOMIC_FLOAT(xtc_emu_atomic_exch_f, float, v)

#define XTC_EMU_ATOMIC_INT(name, T, builtin)                                                            \
    static inline T name(T *p, T v) { return builtin(p, v, __ATOMIC_SEQ_CST); }
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_add_i, int, __atomic_fetch_add)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_add_u, unsigned int, __atomic_fetch_add)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_add_ull, unsigned long long, __atomic_fetch_add)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_sub_i, int, __atomic_fetch_sub)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_sub_u, unsigned int, __atomic_fetch_sub)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_exch_i, int, __atomic_exchange_n)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_exch_u, unsigned int, __atomic_exchange_n)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_exch_ull, unsigned long long, __atomic_exchange_n)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_and_i, int, __atomic_fetch_and)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_and_u, unsigned int, __atomic_fetch_and)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_or_i, int, __atomic_fetch_or)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_or_u, unsigned int, __atomic_fetch_or)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_xor_i, int, __atomic_fetch_xor)
XTC_EMU_ATOMIC_INT(xtc_emu_atomic_xor_u, unsigned int, __atomic_fetch_xor)

#define XTC_EMU_ATOMIC_MINMAX(name, T, cmp)                                                             \
    static inline T name(T *p, T v)                                                                     \
    {                                                                                                   \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                   \
        while ((v cmp old) && !__atomic_compare_exchange_n(p, &old, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) \
            ;                                                                                           \
        return old;                                                                                     \
    }
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_max_i, int, >)
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_max_u, unsigned int, >)
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_max_ll, long long, >)
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_min_i, int, <)
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_min_u, unsigned int, <)
XTC_EMU_ATOMIC_MINMAX(xtc_emu_atomic_min_ll, long long, <)

#define XTC_EMU_ATOMIC_CAS(name, T)                                                                     \
    static inline T name(T *p, T expected, T v)                                                         \
    {                                                                                                   \
        __atomic_compare_exchange_n(p, &expected, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
        return expected;                                                                                \
    }
XTC_EMU_ATOMIC_CAS(xtc_emu_atomic_cas_i, int)
XTC_EMU_ATOMIC_CAS(xtc_emu_atomic_cas_u, unsigned int)
XTC_EMU_ATOMIC_CAS(xtc_emu_atomic_cas_ull, unsigned long long)

#define atomicAdd(p, v)                                                                                 \
    _Generic((p), float *: xtc_emu_atomic_add_f, double *: xtc_emu_atomic_add_d, int *: xtc_emu_atomic_add_i, \
             unsigned int *: xtc_emu_atomic_add_u, unsigned long long *: xtc_emu_atomic_add_ull)(p, v)
#define atomicSub(p, v) _Generic((p), int *: xtc_emu_atomic_sub_i, unsigned int *: xtc_emu_atomic_sub_u)(p, v)
#define atomicExch(p, v)                                                                                \
    _Generic((p), float *: xtc_emu_atomic_exch_f, int *: xtc_emu_atomic_exch_i, unsigned int *: xtc_emu_atomic_exch_u, \
             unsigned long long *: xtc_emu_atomic_exch_ull)(p, v)
#define atomicAnd(p, v) _Generic((p), int *: xtc_emu_atomic_and_i, unsigned int *: xtc_emu_atomic_and_u)(p, v)
#define atomicOr(p, v) _Generic((p), int *: xtc_emu_atomic_or_i, unsigned int *: xtc_emu_atomic_or_u)(p, v)
#define atomicXor(p, v) _Generic((p), int *: xtc_emu_atomic_xor_i, unsigned int *: xtc_emu_atomic_xor_u)(p, v)
#define atomicMax(p, v)                                                                                 \
    _Generic((p), int *: xtc_emu_atomic_max_i, unsigned int *: xtc_emu_atomic_max_u, long long *: xtc_emu_atomic_max_ll)(p, v)
#define atomicMin(p, v)                                                                                 \
    _Generic((p), int *: xtc_emu_atomic_min_i, unsigned int *: xtc_emu_atomic_min_u, long long *: xtc_emu_atomic_min_ll)(p, v)
#define atomicCAS(p, e, v)                                                                              \
    _Generic((p), int *: xtc_emu_atomic_cas_i, unsigned int *: xtc_emu_atomic_cas_u,                    \
             unsigned long long *: xtc_emu_atomic_cas_ull)(p, e, v)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* ---- device functions C lacks (as macros, so a libm that has one does not clash) ---- */

static inline float xtc_emu_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float xtc_emu_int_as_float(int i)
{
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
static inline int xtc_emu_float_as_int(float f)
{
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}
static inline float xtc_emu_saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
#define rsqrtf(x) xtc_emu_rsqrtf(x)
#define __int_as_float(i) xtc_emu_int_as_float(i)
#define __float_as_int(f) xtc_emu_float_as_int(f)
#define __saturatef(x) xtc_emu_saturatef(x)
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __fdividef(a, b) ((a) / (b))
#define __fmaf_rn(a, b, c) fmaf((a), (b), (c))
#define __fadd_rn(a, b) ((float)(a) + (float)(b))
#define __fsub_rn(a, b) ((float)(a) - (float)(b))
#define __fmul_rn(a, b) ((float)(a) * (float)(b))
#define __fdiv_rn(a, b) ((float)(a) / (float)(b))
#define __fsqrt_rn(a) sqrtf(a)
#define __ldg(p) (*(p))

/* ---- the launcher ---- */

/* Memory kept between launches (XtcEmuLaunch.cache): threads, stacks, warp state, order. */
typedef struct {
    int cap, stack_cap;
    XtcEmuThread *threads;
    char *stacks;
    int *order;
    uint64_t (*slots)[2][32];
    unsigned *exists, *done, *waiting;
    XtcEmuGroup (*groups)[32];
    int *ngroups;
} XtcEmuCache;

static void xtc_emu_release(void *cache)
{
    XtcEmuCache *c = cache;
    if (!c)
        return;
    free(c->threads);
    free(c->stacks);
    free(c->order);
    free(c->slots);
    free(c->exists);
    free(c->done);
    free(c->waiting);
    free(c->groups);
    free(c->ngroups);
    free(c);
}

static int xtc_emu_reserve(XtcEmuCache *c, int n, int stacks)
{
    if (n > c->cap) {
        int nw = (n + 31) / 32;
        free(c->threads);
        free(c->order);
        free(c->slots);
        free(c->exists);
        free(c->done);
        free(c->waiting);
        free(c->groups);
        free(c->ngroups);
        c->threads = calloc((size_t)n, sizeof *c->threads);
        c->order = calloc((size_t)n, sizeof *c->order);
        c->slots = calloc((size_t)nw, sizeof *c->slots);
        c->exists = calloc((size_t)nw, sizeof *c->exists);
        c->done = calloc((size_t)nw, sizeof *c->done);
        c->waiting = calloc((size_t)nw, sizeof *c->waiting);
        c->groups = calloc((size_t)nw, sizeof *c->groups);
        c->ngroups = calloc((size_t)nw, sizeof *c->ngroups);
        c->cap = c->threads && c->order && c->slots && c->exists && c->done && c->waiting && c->groups && c->ngroups
                     ? n : 0;
        if (!c->cap)
            return -1;
    }
    if (stacks && n > c->stack_cap) {
        free(c->stacks);
        c->stacks = aligned_alloc(64, (size_t)n * XTC_EMU_STACK);
        c->stack_cap = c->stacks ? n : 0;
        if (!c->stacks)
            return -1;
    }
    return 0;
}

/* The order threads are run in: forward, reverse, or a permutation drawn from the block index. */
static void xtc_emu_order(int *order, int n, int kind, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        order[i] = kind == XTC_EMU_REVERSE ? n - 1 - i : i;
    if (kind != XTC_EMU_SHUFFLED)
        return;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (int i = n - 1; i > 0; i--) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        int j = (int)(s % (uint64_t)(i + 1)), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

/* A thread of warp w reached a warp operation: release the lanes of its mask when all are in.
 * Every lane of the mask already waiting must wait in the same operation (mask and kind): the
 * waiting lanes are kept by operation (b->groups), so an arrival costs no walk over the warp. */
static void xtc_emu_warp_arrived(XtcEmuBlock *b, XtcEmuThread *t)
{
    int w = t->warp;
    unsigned mask = t->mask;
    if (!((mask >> t->lane) & 1u)) {
        xtc_emu_fail(b, "lane %d calls a warp operation with mask 0x%08x, which leaves it out", t->lane, mask);
        return;
    }
    if (mask & ~b->exists[w]) {
        xtc_emu_fail(b, "warp operation with mask 0x%08x names lanes that the block (%d threads) does not have",
                     mask, b->n);
        return;
    }
    if (mask & b->done[w]) {
        xtc_emu_fail(b, "warp operation with mask 0x%08x in warp %d, whose lanes 0x%08x have exited", mask, w,
                     mask & b->done[w]);
        return;
    }
    XtcEmuGroup *gs = b->groups[w], *g = NULL;
    for (int i = 0; i < b->ngroups[w] && !g; i++)
        if (gs[i].mask == mask && gs[i].op == t->op)
            g = &gs[i];
    unsigned others = b->waiting[w] & mask & ~(g ? g->lanes : 0u); /* waiting in another operation */
    if (others) {
        xtc_emu_fail(b, "lanes %d and %d of warp %d are in different warp operations", t->lane,
                     __builtin_ctz(others), w);
        return;
    }
    if (!g) {
        g = &gs[b->ngroups[w]++]; /* at most 32: each holds a lane */
        g->mask = mask;
        g->op = t->op;
        g->lanes = 0;
    }
    g->lanes |= 1u << t->lane;
    b->waiting[w] |= 1u << t->lane;
    if (g->lanes != mask)
        return;
    for (int l = 0; l < 32; l++)
        if ((mask >> l) & 1u)
            b->threads[w * 32 + l].state = XTC_EMU_RUNNABLE;
    b->waiting[w] &= ~mask;
    *g = gs[--b->ngroups[w]];
}

static void xtc_emu_thread_done(XtcEmuBlock *b, XtcEmuThread *t)
{
    b->live--;
    b->exited++;
    b->done[t->warp] |= 1u << t->lane;
    if (b->at_barrier) {
        xtc_emu_fail(b, "thread %d exited while %d threads wait at __syncthreads()", (int)(t - b->threads),
                     b->at_barrier);
        return;
    }
    for (unsigned waiting = b->waiting[t->warp]; waiting; waiting &= waiting - 1) {
        int l = __builtin_ctz(waiting);
        XtcEmuThread *u = &b->threads[t->warp * 32 + l];
        if ((u->mask >> t->lane) & 1u) {
            xtc_emu_fail(b, "lane %d exited while lane %d of its warp waits for it in a warp operation", t->lane,
                         l);
            return;
        }
    }
}

static void xtc_emu_barrier_arrived(XtcEmuBlock *b)
{
    if (b->at_barrier < b->live)
        return;
    if (b->exited) {
        xtc_emu_fail(b, "__syncthreads() after %d threads of the block exited", b->exited);
        return;
    }
    for (int i = 0; i < b->n; i++)
        if (b->threads[i].state == XTC_EMU_AT_BARRIER)
            b->threads[i].state = XTC_EMU_RUNNABLE;
    b->at_barrier = 0;
}

static void xtc_emu_deadlock(XtcEmuBlock *b)
{
    int warp = 0;
    for (int i = 0; i < b->n; i++)
        warp += b->threads[i].state == XTC_EMU_AT_WARP;
    xtc_emu_fail(b, "deadlock: %d threads wait at __syncthreads(), %d in warp operations, %d exited", b->at_barrier,
                 warp, b->exited);
}

static int xtc_emu_run_block(XtcEmuBlock *b, const int *order)
{
    int n = b->n;
    for (int w = 0; w < (n + 31) / 32; w++) {
        int lanes = n - 32 * w < 32 ? n - 32 * w : 32;
        b->exists[w] = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        b->done[w] = 0;
        b->waiting[w] = 0;
        b->ngroups[w] = 0;
    }
    for (int i = 0; i < n; i++) {
        XtcEmuThread *t = &b->threads[i];
        t->idx.x = (unsigned)i % b->dim.x;
        t->idx.y = (unsigned)i / b->dim.x % b->dim.y;
        t->idx.z = (unsigned)i / (b->dim.x * b->dim.y);
        t->lane = i & 31;
        t->warp = i >> 5;
        t->state = XTC_EMU_RUNNABLE;
        t->parity = 0;
    }
    b->live = n;
    b->exited = 0;
    b->at_barrier = 0;
    if (b->direct) {
        for (int o = 0; o < n && !b->failed; o++) {
            xtc_emu_thread = &b->threads[order[o]];
            b->kernel->call(b->args);
        }
        return b->failed ? -1 : 0;
    }
    for (int i = 0; i < n; i++) {
        memset(b->threads[i].stack, 0xA5, XTC_EMU_CANARY);
        xtc_emu_prepare(b, &b->threads[i], xtc_emu_entry);
    }
    while (b->live > 0 && !b->failed) {
        int ran = 0;
        for (int o = 0; o < n && !b->failed; o++) {
            XtcEmuThread *t = &b->threads[order[o]];
            if (t->state != XTC_EMU_RUNNABLE)
                continue;
            ran = 1;
            xtc_emu_thread = t;
            xtc_emu_resume(b, t);
            if (b->failed)
                break;
            switch (t->state) {
            case XTC_EMU_DONE: xtc_emu_thread_done(b, t); break;
            case XTC_EMU_AT_BARRIER: xtc_emu_barrier_arrived(b); break;
            case XTC_EMU_AT_WARP: xtc_emu_warp_arrived(b, t); break;
            default: xtc_emu_fail(b, "internal error: a thread yielded while runnable"); break;
            }
        }
        if (!ran && !b->failed)
            xtc_emu_deadlock(b);
    }
    for (int i = 0; i < n && !b->failed; i++)
        for (int k = 0; k < XTC_EMU_CANARY; k += 8) { /* a word at a time */
            uint64_t v;
            memcpy(&v, b->threads[i].stack + k, sizeof v);
            if (v != 0xA5A5A5A5A5A5A5A5ull) {
                xtc_emu_fail(b, "thread %d overflowed its %d-byte emulator stack", i, XTC_EMU_STACK);
                break;
            }
        }
    return b->failed ? -1 : 0;
}

static int32_t xtc_emu_launch(const XtcEmuKernel *k, const XtcEmuLaunch *l, void **args)
{
    XtcEmuBlock b;
    memset(&b, 0, sizeof b);
    b.kernel = k;
    b.args = args;
    b.err = l->err;
    b.nerr = l->nerr;
    b.dim.x = l->block[0];
    b.dim.y = l->block[1];
    b.dim.z = l->block[2];
    b.grid.x = l->grid[0];
    b.grid.y = l->grid[1];
    b.grid.z = l->grid[2];
    uint64_t n = (uint64_t)b.dim.x * b.dim.y * b.dim.z;
    if (n == 0 || n > 1024 || b.dim.x > 1024 || b.dim.y > 1024 || b.dim.z > 64) {
        snprintf(l->err, l->nerr, "kernel %s: bad block size %ux%ux%u (at most 1024 threads)", k->name, b.dim.x,
                 b.dim.y, b.dim.z);
        return -1;
    }
    if (b.grid.x == 0 || b.grid.y == 0 || b.grid.z == 0 || b.grid.x > 2147483647u || b.grid.y > 65535 ||
        b.grid.z > 65535) {
        snprintf(l->err, l->nerr, "kernel %s: bad grid size %ux%ux%u", k->name, b.grid.x, b.grid.y, b.grid.z);
        return -1;
    }
    b.n = (int)n;
    b.direct = !k->sync;
    XtcEmuCache *c = *l->cache;
    if (!c && !(c = *l->cache = calloc(1, sizeof *c))) {
        snprintf(l->err, l->nerr, "kernel %s: out of memory", k->name);
        return -1;
    }
    if (xtc_emu_reserve(c, b.n, !b.direct) < 0) {
        snprintf(l->err, l->nerr, "kernel %s: out of memory for %d emulated threads", k->name, b.n);
        return -1;
    }
    b.threads = c->threads;
    b.slots = c->slots;
    b.exists = c->exists;
    b.done = c->done;
    b.waiting = c->waiting;
    b.groups = c->groups;
    b.ngroups = c->ngroups;
    if (!b.direct)
        for (int i = 0; i < b.n; i++)
            b.threads[i].stack = c->stacks + (size_t)i * XTC_EMU_STACK;
    XtcEmuBlock *saved_block = xtc_emu_block;
    XtcEmuThread *saved_thread = xtc_emu_thread;
    xtc_emu_block = &b;
    int rc = 0;
    for (unsigned z = 0; z < b.grid.z && !rc; z++)
        for (unsigned y = 0; y < b.grid.y && !rc; y++)
            for (unsigned x = 0; x < b.grid.x && !rc; x++) {
                b.idx.x = x;
                b.idx.y = y;
                b.idx.z = z;
                xtc_emu_order(c->order, b.n, l->order, ((uint64_t)z * b.grid.y + y) * b.grid.x + x);
                rc = xtc_emu_run_block(&b, c->order);
            }
    xtc_emu_block = saved_block;
    xtc_emu_thread = saved_thread;
    return rc ? -1 : 0;
}

#endif
