/* cg_plan.h: the backend-independent part of code generation: which nodes become kernel calls
 * (steps) and in which order, which buffer holds each value and for how long, which steps share
 * one generated kernel, and the metadata text the module carries (format in include/abi/rt_abi.h). */
#ifndef XTC_CG_PLAN_H
#define XTC_CG_PLAN_H

#include "codegen.h"

typedef enum { CG_BUF_INPUT, CG_BUF_PARAM, CG_BUF_STATE, CG_BUF_TEMP } CgBufKind;

typedef struct {
    CgBufKind kind;
    const IrNode *node; /* the node whose value it holds */
    const char *name;   /* leaf name, or the node's label */
    int first, last;    /* temps: the step writing it, the last step reading it (nsteps: output) */
    /* a step's scratch (CgStep.scratch) when rank > 0: f32 values of this shape, which its step
     * alone writes and reads (first = last = the step), named "<node's label>.scratch"; node is
     * the step's */
    int rank;
    IrDim shape[IR_MAXRANK];
} CgBuffer;

typedef struct {
    const IrNode *node;
    int kernel;
    int out, in[IR_MAXIN]; /* buffer ids, -1 for absent operands */
    int scratch;           /* the step's scratch buffer (a temp only its own launches use), or -1 */
} CgStep;

/* One generated function, shared by every step whose node has the same signature: op, dtypes,
 * shapes (as symbolic expressions), attributes and operand shapes. */
typedef struct {
    const IrNode *node; /* the first node of this signature: what the kernel is generated from */
    char *sig;
    char fn[64];        /* symbol name in the module */
    int uses;
    unsigned views;     /* CG_VIEW_*: operands read, or the result written, in place of a permute */
} CgKernel;

/* Head-split views (cg_plan_build_views with head_views, for the backends with CG_CAP_HEAD_VIEWS:
 * the forward attention kernels of the CPU, cg_llvm_attention.c, and of CUDA, cg_cuda_attention.c,
 * read and write through them): a permute (0, 2, 1, 3) of rank 4 between an attention op and its
 * q, k or v, or after an attention op's result, makes no step.
 *  - CG_VIEW_Q/K/V: the permute's every consumer is a forward attention reading it as q, k or v,
 *    and it is not an output, and its operand does not stay f32 under 16-bit storage
 *    (cg_keeps_f32: the attention would read that buffer as the permute's 16-bit type): the
 *    attention reads the permute's operand, [.., n, h, d], in place (row stride h d) instead
 *    of a [.., h, n, d] copy;
 *  - CG_VIEW_OUT: the attention (without the statistics column) has that permute as its only
 *    consumer and is not an output: it writes its result as the permute's value, [.., n, h, e],
 *    which the permute's consumers read as a plain buffer.
 * Every such permute is the split or merge of heads around attention (x-transformers'
 * rearrange 'b n (h d) -> b h n d' and back): four copies of an activation per layer saved. */
enum { CG_VIEW_Q = 1, CG_VIEW_K = 2, CG_VIEW_V = 4, CG_VIEW_OUT = 8, CG_VIEW_A_T = 16, CG_VIEW_SUM_B = 32 };
/* The transposed-A view (matmul_views, for the backends with CG_CAP_MATMUL_VIEWS: the CPU's
 * matmul, cg_llvm_matmul.c, and CUDA's, cg_cuda_matmul.c and cg_cuda_matmul_mma.c): a permute that
 * swaps the last two dims, [.., k, m] -> [.., m, k], makes no step when its every consumer is a
 * matmul without transpose_b reading it as A (and only as A), it is not an output and its operand
 * is stored as the permute would be (both f32 on the CPU, both 16-bit under CUDA's 16-bit
 * storage, unless the operand keeps f32): the matmul (CG_VIEW_A_T)
 * reads the operand in place, element (i, p) of a matrix at p m + i. Such permutes are the
 * gradients' transposes of the weights' gradients, dW = g^T x (autodiff's grad_matmul): one copy
 * of an activation per Linear layer saved in a training step.
 * CG_VIEW_SUM_B: such a matmul of rank 3, [b, m, n] = [b, k, m]^T x [b, k, n] with neither
 * operand broadcast, whose only reader is a sum over its batch axis (the weight's gradient summed
 * over the sequences) and which is not an output, is one product of the operands' b k rows,
 * [m, b k] x [b k, n], written as the sum's value: the sum makes no step, and the product's
 * buffer is the sum's, [1, m, n] (a b times smaller one, and no pass over it). */

typedef struct CgPlan {
    const IrGraph *g;
    CgBuffer *bufs;
    int nbufs;
    CgStep *steps;
    int nsteps;
    CgKernel *kernels;
    int nkernels;
    int *buf_of;        /* per node id: the buffer holding its value, -1 if not needed */
    /* integer inputs used as gather indices (token ids) or cross-entropy targets: valid range
     * [0, range_hi), negative values too where every use is a target (ignored) */
    int64_t *range_hi;  /* per buffer, 0 = none */
    uint8_t *range_index; /* per buffer: some use is a gather index (no negative values) */
    /* per buffer: how its values are stored (CgPlanOpts.scope below): 0 as its dtype, 1 bf16, 2 fp16
     * (the numbers of XTC_CUDA_BF16/FP16 and of the metadata's "storage" records), 3 int8 rows
     * (CG_STORE_INT8_ROWS, KV caches); NULL = all 0 */
    uint8_t *storage;
} CgPlan;

/* Which f32 buffers a module stores in 16 bits (CgPlan.storage), by one rule for every backend:
 * a buffer whose value cg_keeps_f32 does not keep in f32 may be stored in 16 bits, and a backend
 * stores in 16 bits those its kernels read and write in that form:
 *  - CG_STORE_ALL (the CUDA backends, CG_CAP_HALF): every such buffer, activations included;
 *  - CG_STORE_MATMUL_WEIGHTS (the CPU, CG_CAP_HALF_WEIGHTS): the parameters read only as the B
 *    operand of matmuls (a plain matmul's, or a fused node's matmul step's), which the CPU's
 *    matmul kernels read in bf16 directly (the packed panels, the matrix-vector path): the
 *    weights of every Linear layer; embeddings (gathered), norms' gains and biases stay f32;
 *  - CG_STORE_KV_CACHES (the CPU with --kv-dtype bf16, or --dtype bf16 by default; with or without
 *    CG_STORE_MATMUL_WEIGHTS): the KV caches of a decoding graph, each pair of an input read only
 *    as the first operand of a concat that is an output (the cache carried in, and out with the
 *    call's rows appended) and that concat, when only attention kernels read it, as k or v (in
 *    place or through a head-split view): the concat kernel writes bf16 rows, the attention
 *    widens k and v as it reads them. A pair with any other reader stays f32. With --kv-dtype
 *    int8 (CgPlanOpts.kv_storage CG_STORE_INT8_ROWS) the same pairs are stored as int8 rows
 *    with a scale each: the concat quantizes the call's rows, the attention scales its dot
 *    products and probabilities by the rows' scales.
 * The storage goes into the kernels' signatures (a kernel reading a bf16 weight is another
 * kernel) and into the metadata ("storage" records, include/abi/rt_abi.h). */
typedef struct {
    int head_views; /* the head-split views below (backends with CG_CAP_HEAD_VIEWS) */
    int matmul_views; /* the transposed-A view (backends with CG_CAP_MATMUL_VIEWS) */
    int storage;    /* 0 f32, 1 bf16, 2 fp16 (cg_dtype_parse) */
    int scope;      /* CG_STORE_ALL, or CG_STORE_MATMUL_WEIGHTS and/or CG_STORE_KV_CACHES */
    int kv_storage; /* CG_STORE_KV_CACHES: the caches' storage, 1 bf16 or CG_STORE_INT8_ROWS (0: storage) */
} CgPlanOpts;
/* The storage of KV caches under --kv-dtype int8 (CG_STORE_KV_CACHES only): each row of the
 * cache's last dimension (one position of one kv head: D values) as D int8 values followed by
 * their f32 scale, D + 4 bytes a row; symmetric, scale = max|x| / 127 and q = x (127 / max|x|)
 * rounded to nearest even (rt_half.h rt_i8_row_quantize, the one rule of the kernels, the
 * runtime and the tests); the metadata's "storage" record says int8. */
#define CG_STORE_INT8_ROWS 3
enum { CG_STORE_ALL = 0, CG_STORE_MATMUL_WEIGHTS = 1, CG_STORE_KV_CACHES = 2 };
/* The rule of CG_STORE_ALL for one value: storage for an f32 value cg_keeps_f32 does not keep, else 0. */
int cg_node_storage(const IrNode *n, int storage);

/* Builds the plan for g (which must verify). Returns 0 or -1 with a message. */
int cg_plan_build(const IrGraph *g, CgPlan *p, char *err, size_t n);
/* ... with the head-split views above when head_views (backends with CG_CAP_HEAD_VIEWS) */
int cg_plan_build_views(const IrGraph *g, CgPlan *p, int head_views, char *err, size_t n);
/* ... with views and 16-bit storage as o says (NULL: neither) */
int cg_plan_build_opts(const IrGraph *g, CgPlan *p, const CgPlanOpts *o, char *err, size_t n);
void cg_plan_free(CgPlan *p);
/* Gives step its scratch buffer (CgStep.scratch, CgBuffer.rank): f32 values of `shape`, a temp
 * that lives during the step alone, stored as f32 whatever the plan's storage. The metadata
 * lists it as an ordinary temp buffer, so the runtime's arena places it (no record of the step
 * names it: the module's schedule hands it to the step's kernels). Called by cg_compile with
 * what the backend's scratch hook asks for. Returns the buffer id, or -1 out of memory or when
 * the step has one already. */
int cg_plan_add_scratch(CgPlan *p, int step, int rank, const IrDim *shape);

/* The metadata text (malloc'ed) for the plan, with options as key/value pairs (values without
 * spaces or newlines; NULL values are skipped). */
char *cg_plan_meta(const CgPlan *p, const char *const *options, int noptions);

/* Whether n's value stays in f32 when a module stores floating-point tensors in 16 bits
 * (CgOptions.dtype): the loss (cross-entropy's scalar), gather_grad's rows (accumulated with
 * atomics, which must add in f32), attention's output when it carries the logsumexp column that
 * the backward pass exponentiates, entmax15's output (its row doubles as index scratch), and
 * rand_like's uniform numbers (dropout keeps the same elements whatever the storage), and scalar
 * inputs (the loss scale of fp16 training, 2^16 by default, is beyond fp16's 65504), tables of
 * positions (rotary angles, ALiBi distances) and the model's buffers (fixed tables such as
 * rotary's inverse frequencies, which those tables read). Reshapes follow their operand, whose
 * buffer they share. */
int cg_keeps_f32(const IrNode *n);
/* ... for a sum of x over axis: whether it keeps f32 as the sum of a gradient over a symbolic axis
 * (the batch, the positions) does; what a matmul summing its product over the batch itself
 * (CG_VIEW_SUM_B, axis 0) writes its result as */
int cg_sum_keeps_f32(const IrNode *x, int axis);

/* Whether dims [from, to) of a shape are all the constant 1 (so their product is 1 for any
 * symbol values). */
int cg_dims_are_one(const IrDim *dims, int from, int to);

/* The iteration space of an elementwise op, shared by the backends: the output's dims grouped so
 * that every operand is either contiguous or broadcast (stride 0) over each whole group. Dims of
 * static size 1 are dropped, and neighbours with the same broadcast pattern merge. */
typedef struct {
    int ngroups;
    int from[IR_MAXRANK], to[IR_MAXRANK]; /* output dims [from, to) */
    int bcast[IR_MAXIN][IR_MAXRANK];      /* operand k is broadcast over group g */
} CgSpace;

/* Whether operand x of out is broadcast over output dim d (missing there, or of size 1). */
int cg_operand_bcast(const IrNode *out, const IrNode *x, int d);
void cg_space_of(const IrNode *n, CgSpace *sp);

#endif
