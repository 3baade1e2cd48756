/* cg_cuda.h: internals of the CUDA backend, shared by its files. The split follows tinygrad's
 * renderer / compiler / program:
 *
 *   renderer  cg_cuda_gen.c      writing CUDA C: prelude, kernel signatures, dims, literals
 *             cg_cuda_ops.c      the per-op table and the kernels of every op but those below
 *             cg_cuda_reduce.c   sum, max, softmax, cross-entropy: warp shuffles, shared memory
 *             cg_cuda_matmul.c   matrix multiplication tiled in shared memory
 *             cg_cuda_matmul_mma.c  ... on tensor cores, 16-bit operands as stored (cp.async, ldmatrix)
 *             cg_cuda_gemv.c     ... and its path for few rows (decoding), taken at run time
 *             cg_cuda_sort.c     entmax15, kth_largest: ops defined by a sort of each row
 *             cg_cuda_attention.c  the fused attention ops, forward and backward
 *             cg_cuda_attention_decode.c  the forward's path for few query rows (keys split)
 *             cg_cuda_fused.c    the fused op: elementwise chains with last-axis reductions
 *             cg_cuda_host.c     the host half of a module: schedule, launch geometry, objects
 *   compiler  cg_cuda_nvrtc.c    CUDA C -> PTX with NVRTC (dlopen'ed), NVRTC's log in errors
 *             cg_cuda.c          the backends "cuda" and "cuda-emu": render, compile, link (cc)
 *   program   runtime/rt_cuda*.c loading and launching (the Driver API or its emulation)
 *
 * Every kernel is one __global__ function per plan signature (steps of the twelve layers of a
 * model share it), taking (out, in0.., the symbol values as i64, status). The generated code is
 * the C-compatible subset of CUDA C, so the same text also compiles as C for the emulator
 * (codegen/cuda/xtc_cuda_emu.h). */
#ifndef XTC_CG_CUDA_H
#define XTC_CG_CUDA_H

#include "cg_plan.h"

#include <stdio.h>

#define CU_DEFAULT_ARCH "sm_80"
#define CU_EXPR 512 /* room for one expression over the symbols */
#define CU_NLIB 3   /* the entries of cu_lib_kernels */
/* The attention kernels' bound on the head sizes D and E, forward and gradient (past the tiled
 * kernels' shared memory, the row kernels keep a query row and per-thread sums of D/128 floats);
 * the cuda backends advertise it to the passes (CgBackend.attention_max_head). */
#define CG_CUDA_ATTENTION_MAX_HEAD 1024

typedef struct {
    const CgPlan *plan;
    const IrGraph *g;
    char sym[IR_MAXSYM][40]; /* the C identifier of each symbol (its name unless that clashes) */
    int storage;             /* floating-point tensors: 0 f32, 1 bf16, 2 fp16 (cg_dtype_parse) */
    int mma;                 /* CG_MMA_OFF, _BF16, _FP16 (resolved, never CG_MMA_AUTO): matmuls on tensor
                              * cores, operands in bf16 or fp16 */
    char err[1024];
} CuGen;

/* How the host launches a kernel: expressions over the symbols (their C identifiers). */
typedef struct {
    char grid_x[6 * CU_EXPR]; /* blocks along x, before capping at the CUDA limit; "0" launches nothing */
    char grid_y[6 * CU_EXPR]; /* blocks along y (capped at 65535); "" = 1 */
    unsigned block;           /* threads per block (x) */
    char zero[6 * CU_EXPR];   /* bytes of the output to clear before the launch; "" = none */
    /* "" or the rows of the step's scratch (CgStep.scratch; cu_flash_bwd16_fits): the kernel
     * takes it after its operands, and xtc_fb_pre (kernels/flash_pre.cuh) fills it first from
     * the step's in4 (the output gradient, pre_gc columns) and in3 (o, pre_e + 1 columns) */
    char pre[6 * CU_EXPR];
    char pre_gc[CU_EXPR];
    long long pre_e;
} CuGeom;

/* A kernel being written. */
typedef struct {
    CuGen *gen;
    const CgKernel *k;
    const IrNode *node;
    FILE *f;  /* its text */
    CuGeom geom;
    int sync; /* uses __syncthreads or warp operations (the emulator gives its threads stacks) */
    /* when bound_blocks > 0: compiled for blocks of at most bound_threads threads, at least
     * bound_blocks of them resident per SM (__launch_bounds__: caps the registers per thread) */
    int bound_threads, bound_blocks;
    int inner; /* the attention forward being written inside its decode path's kernel (cu_attention_decode) */
} CuKernel;

/* A row of the per-op table. */
typedef struct {
    /* Writes the kernel and its geometry; 0 or -1 with gen->err set. NULL: the op never becomes
     * a kernel (leaves bound by the runtime; reshape, which aliases its operand's buffer). */
    int (*emit)(CuKernel *k);
    /* Elementwise ops: the value from the operands $0 $1 $2 (loaded into locals), for f32 and
     * for integer or bool operands ($t: i32 or i64); NULL where the op has no such form. */
    const char *f32, *ints;
} CuLower;

/* One rendered module: the CUDA C of its kernels and how to launch each. */
typedef struct {
    CuGen gen;
    const CgPlan *plan;
    int emu;             /* cuda-emu: the kernels are compiled for the host */
    char arch[16];       /* "sm_80" */
    int nkernels;
    char *source;        /* the CUDA C of every kernel, prelude included */
    char **kernel_text;  /* [nkernels]: each kernel's own text */
    char **emu_call;     /* [nkernels]: the emulator's call of the kernel from cuLaunchKernel args */
    CuGeom *geom;        /* [nkernels] */
    int *sync;           /* [nkernels] */
    /* kernels of the source files under codegen/cuda/kernels appended after the plan's (the
     * runtime launches them by name: a training module's AdamW step; the schedule launches
     * xtc_fb_pre): cu_lib_kernels[lib[0..nlib)], kernel nkernels + i of the module */
    int lib[CU_NLIB];
    int nlib;
} CuUnit;

/* A kernel written as CUDA source (a file of codegen/cuda/kernels), not generated per plan. */
typedef struct {
    const char *name;     /* its entry point */
    const char *emu_call; /* the emulator's call of it from cuLaunchKernel-style args `a` */
    int sync;             /* uses __syncthreads */
} CuLibKernel;
extern const CuLibKernel cu_lib_kernels[];
enum { CU_LIB_ADAMW_NORM, CU_LIB_ADAMW_UPDATE, CU_LIB_FB_PRE };

/* cg_cuda_ops.c: the lowering of op, or NULL when the table has no entry for it. */
const CuLower *cg_cuda_lowering(IrOp op);
/* An elementwise node's value as a template over $0 $1 $2 ($t: the integer type), NULL for
 * other ops; cg_cuda_expand writes it with args for the operands. */
const char *cg_cuda_scalar(const IrNode *x);
void cg_cuda_expand(const char *tmpl, IrDType t, const char *const *args, char *buf, size_t n);
int cg_cuda_elementwise(CuKernel *k);
int cg_cuda_matmul(CuKernel *k);
/* The tiled matmul of node x (its operands in<ia>, in<ib> of the kernel); epilogue (NULL: store
 * the product) writes, at the given indent, what to do with mm = C[batch, row, col]: it sees the
 * batch indices ix0.., row, col, C (the output's matrix) and N. With parts = 2 (a GLU epilogue,
 * ir_epilogue_parts) the output is half the product's width, Nout = N / 2: each thread holds
 * the product at columns col and col + Nout side by side, mm and mm1, and C is the output's
 * matrix of row length Nout. 0, or -1 with gen->err set. */
typedef int (*CuEpilogue)(void *ctx, CuKernel *k, const char *indent);
int cg_cuda_matmul_with(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx);
/* cg_cuda_matmul_mma.c: the tensor-core kernel for operands stored in the mma's 16-bit format
 * (cg_cuda_mma16_fits), with cg_cuda_matmul_with's arguments; and the pieces of the matmul
 * kernels in cg_cuda_matmul.c it shares: the sizes and batch loop down to A, B and C; a GLU
 * split's output and product column of tile column v; the epilogue or store of one value. */
int cg_cuda_mma16_fits(const CuKernel *k, int ia, int ib);
int cg_cuda_matmul_mma16(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx);
void cu_matmul_prologue(CuKernel *k, const IrNode *x, int ia, int ib, int parts);
/* The views (CG_VIEW_A_T, CG_VIEW_SUM_B of cg_plan.h) the matmul x reads and writes through: a plain
 * matmul step's (a fused program's matmul reads no permute in place); and its count of batch
 * matrices as an expression, 1 with the batch folded into the reduction (CG_VIEW_SUM_B) */
unsigned cu_matmul_views(const CuKernel *k, const IrNode *x);
void cu_matmul_batches(const CuKernel *k, const IrNode *x, char *buf, size_t n);
void cu_matmul_split_col(const char *v, int R, char *oc, size_t on, char *col, size_t cn);
int cu_matmul_store(CuKernel *k, CuEpilogue epilogue, void *ctx, const char *value, const char *value1, const char *indent);
/* The static shared memory a block may declare (bytes): what a kernel's __shared__ arrays share. */
#define CU_SMEM_STATIC (48 * 1024)
/* cg_cuda_gemv.c: inside the matmul kernel's batch loop, the path taken when M is small (at run
 * time); nothing where M is a constant too large, or where its shared memory (B as stored) passes
 * smem, the bytes of CU_SMEM_STATIC the kernel's own arrays leave. Then, after the kernel's
 * geometry, the grid of that path (the same threads, the kernel's block size, and smem). */
int cg_cuda_gemv(CuKernel *k, const IrNode *x, int ia, int ib, int parts, CuEpilogue epilogue, void *ctx, unsigned threads,
                 int smem);
void cg_cuda_gemv_geometry(CuKernel *k, const IrNode *x, int parts, unsigned threads, int smem);
/* The statement (at indent at) loading v[0 .. 8) with the 8 values from p + idx as floats, p +
 * idx 16-byte aligned: the prelude's xtc_ld8, one 16-byte load of 16-bit storage, two of f32. */
void cu_load_vec8(CuKernel *k, const char *v, const char *p, const char *idx, const char *at);
/* value (a float expression) as an operand of a product: under --mma rounded to the tensor
 * cores' format (to nearest even), as the tensor-core kernels round their operands; an identity
 * on values stored in that format, so the text does not depend on the storage. */
void cu_mma_operand(const CuKernel *k, const char *value, char *buf, size_t n);
int cg_cuda_reduce(CuKernel *k);
int cg_cuda_softmax(CuKernel *k);
int cg_cuda_xent(CuKernel *k);
int cg_cuda_entmax15(CuKernel *k);     /* cg_cuda_sort.c */
int cg_cuda_kth_largest(CuKernel *k);
int cg_cuda_attention(CuKernel *k);    /* cg_cuda_attention.c */
int cg_cuda_attention_grad(CuKernel *k);
int cg_cuda_fused(CuKernel *k);        /* cg_cuda_fused.c */

/* ---- cg_cuda_gen.c ---- */

int cu_error(CuGen *gen, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cu_gen_init(CuGen *gen, const CgPlan *plan);
/* Whether a symbol called name must be renamed in the generated code (a word of C or CUDA, or a
 * name the kernels declare). */
int cu_name_reserved(const char *name);
/* The text that opens every generated source: types, macros and device helpers. */
void cu_prelude(FILE *f, const IrGraph *g, int nkernels, int storage);
/* The storage type of x's buffer (xtc_fs, the prelude's floating-point storage, or float where
 * cg_keeps_f32; int, i64, u8) and the type values are computed in (float, int, i64, int). */
const char *cu_mem_type(const IrNode *x);
/* ... of the buffer kernel K writes: its node's, or where its matmul writes the sum over the batch
 * (CG_VIEW_SUM_B) the sum's, which keeps f32 as gradients summed over a symbolic batch do */
const char *cu_out_type(const CgKernel *K);
const char *cu_val_type(IrDType t);
/* Element idx of pointer ptr holding values of x's dtype: "xtc_ld(ptr, idx)" for floating
 * point (loaded to float), "ptr[idx]" otherwise; and the statement storing value there
 * (xtc_st rounds to the storage format once). */
char *cu_load(const IrNode *x, const char *ptr, const char *idx, char *buf, size_t n);
char *cu_store(const IrNode *x, const char *ptr, const char *idx, const char *value, char *buf, size_t n);
/* dims as C expressions over the symbols: "n + 3", "2 * b"; products of dims [from, to) with the
 * constants folded: "b * n * 64", "1". */
char *cu_dim(const CuGen *gen, IrDim d, char *buf, size_t n);
char *cu_dims_prod(const CuGen *gen, const IrDim *dims, int from, int to, char *buf, size_t n);
/* ceil(a / b) as an expression */
char *cu_ceil_div(const char *a, long long b, char *buf, size_t n);
/* A float literal that reads back to the same float: "0.5f", "1e-05f", "-XTC_INF". */
char *cu_float(double v, char *buf, size_t n);
/* The comment and signature of k's kernel, up to and including the opening brace. */
void cu_kernel_begin(CuKernel *k);
void cu_kernel_end(CuKernel *k);
/* Geometry helpers: one thread per item in grid-stride loops / one block per row. */
void cu_geom_items(CuKernel *k, const char *items, unsigned block);
void cu_geom_rows(CuKernel *k, const char *rows, unsigned block);

/* ---- cg_cuda_host.c ---- */

/* The host C of a module: the schedule with every kernel's launch, the metadata, the sources
 * and the module objects of rt_abi.h and rt_cuda_abi.h. ptx: the PTX (NULL in an emulated
 * module, which links the emulator's table instead); xtf: the model source to embed. */
char *cg_cuda_host_source(const CuUnit *u, const char *meta, const char *ptx, const char *xtf);
/* The emulated module's entry points: includes the emulator and kernels.cu, and lists every
 * kernel with a function that calls it from cuLaunchKernel-style arguments. */
char *cg_cuda_emu_main(const CuUnit *u);

/* ---- cg_cuda.c ---- */

/* Renders the CUDA C and the host code of plan (no compiler involved). */
int cg_cuda_render_unit(const CgPlan *plan, const CgOptions *opt, int emu, CuUnit *u, char *err, size_t n);
void cg_cuda_unit_free(CuUnit *u);

/* ---- cg_cuda_nvrtc.c ---- */

/* Whether NVRTC can be loaded; else why not (the paths tried). version: "13.0". */
int cg_nvrtc_available(char *version, size_t nversion, char *why, size_t nwhy);
/* Compiles CUDA C to PTX for the architecture ("sm_80"); *ptx malloc'ed. -1 with NVRTC's log
 * (or why NVRTC could not be loaded) in err. */
int cg_nvrtc_compile(const char *source, const char *name, const char *arch, char **ptx, char *err, size_t n);

/* The texts of codegen/cuda/xtc_cuda_emu.h, include/abi/rt_abi.h and include/abi/rt_cuda_abi.h, embedded at
 * build time (CMake writes cg_cuda_embed.c): the compiled code includes them. */
extern const char cg_embed_emu_h[], cg_embed_rt_abi_h[], cg_embed_rt_cuda_abi_h[];
/* codegen/cuda/kernels/adamw.cuh (cu_lib_kernels, runtime/rt_cuda.c's device optimizer) */
extern const char cg_embed_adamw_cuh[];
/* codegen/cuda/kernels/flash_lib.cuh, flash_fwd.cuh and flash_bwd.cuh: the tensor-core
 * attention's functions and the bodies of its forward (cg_cuda_attention_mma.c) and backward
 * (cg_cuda_attention_mma_grad.c) */
extern const char cg_embed_flash_lib_cuh[], cg_embed_flash_fwd_cuh[], cg_embed_flash_bwd_cuh[], cg_embed_flash_pre_cuh[];

#endif
