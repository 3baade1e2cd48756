/* codegen.h: turning a tensor-IR graph into a loadable module (model.so), the entry points the
 * command line calls.
 *
 *   IrGraph --cg_plan_build--> CgPlan (schedule, buffers, lifetimes, deduplicated kernels)
 *           --backend->render--> an in-memory unit (for the CPU: an LLVM module)
 *           --backend->compile--> the module file at opt->output
 *
 * A backend is a struct of function pointers plus capability fields (STYLE.md, practice 5);
 * shared code never asks which backend it is talking to. The module format and the ABI between
 * a module and the runtime are described in include/abi/rt_abi.h. */
#ifndef XTC_CODEGEN_H
#define XTC_CODEGEN_H

#include "ir.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *output;      /* path of the module to write (required) */
    const char *target;      /* backend name; NULL = "cpu" */
    int opt_level;           /* 0..3; the optimisation pipeline ("default<O2>" for 2) */
    const char *cpu;         /* NULL, "" or "native" = this machine; else an LLVM CPU name */
    const char *features;    /* NULL = the host's when cpu is the host, none otherwise */
    const char *source;      /* the .xtf text to embed (NULL = none) */
    const char *source_name; /* its file name, recorded among the options */
    const char *emit_llvm;   /* debugging: write the optimised LLVM IR as text to this path */
    const char *cuda_arch;   /* cuda: the GPU architecture of the PTX, "sm_80" (default), "sm_90" */
    const char *emit_cuda;   /* cuda, cuda-emu: write the generated CUDA C to this path */
    const char *dtype;       /* storage of floating-point tensors: NULL or "f32", "bf16", "fp16" (computed
                              * in f32 whatever the storage; backends with CG_CAP_HALF; the cpu,
                              * CG_CAP_HALF_WEIGHTS, stores its matmul weights in bf16) */
    int mma;                 /* CG_MMA_*: matmul operands rounded to bf16 or fp16, sums in f32 (backends with
                              * CG_CAP_MMA: tensor cores on cuda; on the cpu bf16 only, by vdpbf16ps where the
                              * CPU has AVX512_BF16, else rounded in software); 0 = CG_MMA_AUTO, which
                              * follows dtype */
    const char *weights_dtype; /* matmul weights: NULL or "f32", or "int8" (backends with CG_CAP_INT8; the
                              * graph then holds matmul_q8 nodes, passes/quantize.c): recorded among the
                              * module's options with quant_group */
    int quant_group;         /* int8 weights: the scales' group along k, 0 = one per output column */
    const char *kv_dtype;    /* cpu: storage of the KV caches of a --kv-cache graph, NULL (that of dtype),
                              * "f32", "bf16" or "int8" (rows with a scale each: CG_STORE_INT8_ROWS;
                              * CG_STORE_KV_CACHES, cg_plan.h; cg_kv_storage) */
    int parts;               /* cpu: modules the kernels are split into, compiled in parallel threads;
                              * 0 = by the number of kernels (cg_llvm.c); --emit-llvm makes one */
} CgOptions;

/* CgOptions.mma: the precision of matmul operands on tensor cores, accumulation staying f32.
 * CG_MMA_AUTO (the default, 0) follows the storage: bf16 storage -> bf16 operands, fp16 -> fp16,
 * f32 -> off (every matmul in f32), and off too where the architecture has no mma.sync
 * m16n8k16 (below sm_80). An explicit CG_MMA_BF16/FP16 is refused below sm_80 (cuda target)
 * and with the other 16-bit storage (cg_mma_resolve). */
enum { CG_MMA_AUTO, CG_MMA_OFF, CG_MMA_BF16, CG_MMA_FP16 };

/* "auto", "off", "bf16", "fp16" (also "f16") -> CG_MMA_*; -1 for anything else. */
int cg_mma_parse(const char *name);
/* "auto", "off", "bf16", "fp16"; NULL for a value that is none of CG_MMA_*. */
const char *cg_mma_name(int mma);
/* The matmul precision a compile with opt->mma gets, given the storage (cg_dtype_parse) and
 * the architecture number (80 for sm_80): CG_MMA_OFF, _BF16 or _FP16; -1 with a message when
 * the combination is refused. emu: the emulator, which runs an explicit --mma on any
 * architecture (its default follows the architecture as the GPU's does). */
int cg_mma_resolve(int mma, int storage, int arch, int emu, char *err, size_t n);

/* Filled by cg_compile when asked: what was produced and where the time went. */
typedef struct {
    int nsteps, nkernels, nbuffers;
    double plan_s, render_s, optimize_s, emit_s, link_s, total_s;
    int64_t module_bytes;
    int cached; /* the module came from the module cache (XTC_MODULE_CACHE, cg_cache.c) */
    int parts;  /* cpu: the LLVM modules it was compiled as, in parallel threads (CgOptions.parts) */
} CgStats;

/* Compiles g into opt->output. Returns 0, or -1 with a one-line message in err. Errors name the
 * node or op concerned; failures of LLVM or the linker carry their own message. */
int cg_compile(const IrGraph *g, const CgOptions *opt, CgStats *stats, char *err, size_t n);

/* ---- shared by the backends ---- */

/* Runs argv (the linker, the host C compiler) with stdout and stderr to logpath; 0 when it
 * exits with status 0, -1 when it cannot start or fails (the log then says why). */
int cg_run_program(char *const *argv, const char *logpath);

/* ---- the module cache (cg_cache.c): XTC_MODULE_CACHE=DIR keeps compiled modules by a key of
 * what they are made from; a backend's compile hashes its inputs, fetches, or builds and stores */
typedef struct {
    uint64_t a, b;
} CgHash;
int cg_cache_enabled(void);                                /* XTC_MODULE_CACHE names a directory */
void cg_hash_init(CgHash *h, const char *what);            /* what: the backend and key version */
void cg_hash_add(CgHash *h, const void *p, size_t n);
void cg_hash_str(CgHash *h, const char *s);                /* NULL hashes apart from "" */
void cg_hash_program(CgHash *h, const char *name);         /* the identity of name found on PATH */
int cg_cache_fetch(const CgHash *h, const char *output);   /* 1: a sound entry was copied to output */
void cg_cache_store(const CgHash *h, const char *module);  /* best effort; module: the file just linked */

/* ---- backends ---- */

struct CgPlan;

enum {
    CG_CAP_SYMBOLIC = 1,  /* kernels take symbol values at run time */
    CG_CAP_THREADS = 2,   /* kernels split work over the runtime's thread pool */
    CG_CAP_HOST_RUN = 4,  /* modules run on this machine (tests can execute them) */
    CG_CAP_HALF = 8,      /* stores floating-point tensors in bf16 or fp16 (CgOptions.dtype) */
    CG_CAP_CUDA = 16,     /* renders CUDA C: CgOptions.cuda_arch and emit_cuda apply */
    CG_CAP_MMA = 32,      /* matmuls can take 16-bit operands (CgOptions.mma) */
    CG_CAP_INT8 = 512,    /* lowers matmul_q8: int8 weights (CgOptions.weights_dtype) */
    CG_CAP_HEAD_VIEWS = 64, /* attention reads q, k, v through, and writes its output through, the
                             * head-split permutes around it (cg_plan_build_views) */
    CG_CAP_HALF_WEIGHTS = 128, /* --dtype bf16 stores the matmul weights in bf16, the rest in f32
                                * (CG_STORE_MATMUL_WEIGHTS, cg_plan.h); without CG_CAP_HALF */
    CG_CAP_MATMUL_VIEWS = 256, /* a matmul reads its A operand through a permute that swaps the last
                                * two dims (CG_VIEW_A_T, cg_plan.h), and writes its sum over the batch
                                * (CG_VIEW_SUM_B) */
};

/* Whether backend caps can compile storage (cg_dtype_parse); 0 with a message when not. */
int cg_storage_supported(unsigned caps, const char *backend, int storage, char *err, size_t n);

typedef struct CgBackend {
    const char *name;         /* "cpu" */
    const char *description;
    unsigned caps;            /* CG_CAP_* */
    /* Whether the backend has a lowering for op (cg_compile names the op when it has not). */
    int (*supports)(IrOp op);
    /* Builds the in-memory form of every kernel, the schedule and the metadata. */
    int (*render)(const struct CgPlan *plan, const CgOptions *opt, void **unit, char *err, size_t n);
    /* Optimises and writes the module file; fills the optimize/emit/link times. */
    int (*compile)(void *unit, const CgOptions *opt, CgStats *stats, char *err, size_t n);
    void (*release)(void *unit);
    /* Limits of the fused kernels, which the passes respect (PassTarget): the largest constant
     * head size the attention kernel and its gradient kernel take, and whether the forward
     * kernel reads grouped key/values (fewer k and v heads than q heads) without their repeat,
     * and whether the gradient kernel does (dk, dv summed over each group: ops.def). */
    int attention_max_head, attention_grad_max_head;
    int attention_kv_groups, attention_grad_kv_groups;
    /* NULL, or: the shape (rank returned, dims into shape[IR_MAXRANK]) of the f32 scratch buffer
     * step of plan gets compiled with opt (cg_plan_add_scratch: a temp its kernels alone use
     * during the step), 0 for none, -1 with a message. cg_compile asks for every step before
     * rendering; the render finds them as CgStep.scratch. */
    int (*scratch)(const struct CgPlan *plan, int step, const CgOptions *opt, IrDim *shape, char *err, size_t n);
} CgBackend;


extern const CgBackend cg_llvm_backend;
extern const CgBackend cg_cuda_backend, cg_cuda_emu_backend; /* codegen/cuda/cg_cuda.c */

/* The storage of the KV caches (CgOptions.kv_dtype) on a backend with caps, storing in storage
 * (CgOptions.dtype, cg_dtype_parse): 0 f32, 1 bf16, CG_STORE_INT8_ROWS int8; -1 with one line in
 * err for a value other than f32, bf16 or int8, or kv_dtype on a backend without
 * CG_CAP_HALF_WEIGHTS (cuda stores its caches
 * as --dtype). NULL follows the storage where the backend has CG_CAP_HALF_WEIGHTS. */
int cg_kv_storage(unsigned caps, const char *backend, int storage, const char *kv_dtype, char *err, size_t n);

/* CgOptions.dtype as a storage format: 0 = f32 (NULL, "" or "f32"), 1 = bf16, 2 = fp16; -1 with
 * a message naming the accepted values. */
int cg_dtype_parse(const char *dtype, char *err, size_t n);
/* IrGradOpts.loss_scale for a training graph to be compiled with storage dtype: fp16, whose
 * smallest normal value is 6.1e-5, gets the loss-scale input (IR_LOSS_SCALE_INPUT) that the
 * runtime manages; f32 and bf16 (f32's range) get none (NULL), nor does an unknown dtype. */
const char *cg_loss_scale_input(const char *dtype);

/* A GPU architecture for CgOptions.cuda_arch: "sm_80", "compute_80" or "80" -> 80; -1 with a
 * message when it is none of these (codegen/cuda/cg_cuda_nvrtc.c). */
int cg_cuda_arch_number(const char *arch, char *err, size_t n);

/* CgOptions.cpu and .features: 0 when LLVM accepts them (NULL, "" or "native", or a 64-bit x86 CPU
 * name LLVM 19 knows; features "+a,-b"), else -1 with one line naming the value and, for a near
 * miss, the CPU meant (LLVM itself aborts on an unknown CPU). cg_cpu_names lists the CPUs. */
int cg_cpu_check(const char *cpu, const char *features, char *err, size_t n);
const char *const *cg_cpu_names(int *n);

/* The backend of that name ("cpu"), or NULL. */
const CgBackend *cg_backend_find(const char *name);

#endif
