/* ir.h: the tensor IR of xtc.
 *
 * A graph is a topologically ordered array of immutable nodes allocated from an arena owned by
 * the graph. Every node is built through one constructor, ir_node(), which infers (or checks)
 * the node's shape and dtype from the op table (ops.def) and deduplicates identical nodes, so
 * common subexpressions are shared from the start.
 *
 * Shapes may be symbolic: a dimension is an affine form c + sum k[s]*sym[s] over the graph's
 * symbols (batch "b", sequence "n", ...), bound when the graph runs. That covers n+3 (memory
 * tokens), m+n (recurrent memories), n-1 (shifted targets) without a general expression type.
 *
 * Errors while building (a shape mismatch, say) do not crash: the constructor records the first
 * message in the graph, returns NULL, and every later constructor given a NULL operand returns
 * NULL too, so a front end checks ir_graph_error() once at the end.
 */
#ifndef XTC_IR_H
#define XTC_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define IR_MAXRANK 6
#define IR_MAXIN 8 /* operands: attention_grad takes 7 (passes/fuse_attention.c) */
#define IR_MAXSYM 8
#define IR_MAXLIMIT 4 /* limits on sums of symbols per graph (IrGraph.limit_def) */
#define IR_MAXIA 4
#define IR_MAX_NAME 200 /* longest graph or value name the text form reads (ir/parse.c) */

struct IrGraph;

typedef enum {
#define X(e, name, arity, flags, attrs, infer) IR_##e,
#include "ops.def"
#undef X
    IR_NUM_OPS
} IrOp;

enum { IR_LEAF = 1, IR_ELEM = 2, IR_COMMUT = 4, IR_REDUCE = 8, IR_VIEW = 16 };

typedef struct {
    const char *name;
    int arity;
    int flags;
    const char *attrs;
} IrOpInfo;

extern const IrOpInfo ir_ops[IR_NUM_OPS];
IrOp ir_op_lookup(const char *name); /* IR_NUM_OPS if unknown */

/* Walks an ops.def attribute signature such as "i:axis d:start" (IrOpInfo.attrs), for the
 * printer and the parser: each ir_sig_next() yields one attribute's kind and name, and ik is the
 * index in ia[] of the current one when it is an i-attribute. Start with {attrs, 0, "", 0}. */
typedef struct {
    const char *p;
    char kind;
    char name[32];
    int ik;
} IrSigIter;
int ir_sig_next(IrSigIter *it); /* 0 past the last attribute */
/* Whether op takes nin operands: its arity, or 1 to IR_MAXIN where ops.def says -1 (fused). */
static inline int ir_arity_ok(int arity, int nin) { return arity < 0 ? nin >= 1 && nin <= IR_MAXIN : nin == arity; }

/* IR_I8: int8 weights (quantized matmul weights, matmul_q8 in ops.def): only a buffer leaf has it,
 * and only matmul_q8 reads it; no op computes an i8 value. */
typedef enum { IR_F32, IR_I32, IR_I64, IR_BOOL, IR_I8, IR_NUM_DTYPES } IrDType;
const char *ir_dtype_name(IrDType t);     /* "f32", "i32", "i64", "bool", "i8" */
int ir_dtype_lookup(const char *name);    /* -1 if unknown */
size_t ir_dtype_size(IrDType t);          /* storage bytes: 4, 4, 8, 1, 1 */
static inline int ir_dtype_is_int(IrDType t) { return t == IR_I32 || t == IR_I64; }

/* A dimension: c + sum_s k[s] * sym[s]. */
typedef struct {
    int64_t c;
    int8_t k[IR_MAXSYM];
} IrDim;

IrDim ir_dim(int64_t c);                 /* constant */
IrDim ir_dim_sym(int s);                 /* symbol s */
IrDim ir_dim_add(IrDim a, IrDim b);
IrDim ir_dim_sub(IrDim a, IrDim b);
IrDim ir_dim_addc(IrDim a, int64_t c);
int ir_dim_eq(IrDim a, IrDim b);
int ir_dim_is_const(IrDim a);
int ir_dim_is_one(IrDim a);
int64_t ir_dim_eval(IrDim a, const int64_t *symvals);
/* Writes "n+3", "m+n", "64"; returns buf. */
char *ir_dim_str(const struct IrGraph *g, IrDim a, char *buf, size_t n);

/* Indices into IrNode.ia[], named after the i-attributes of ops.def's signatures (an op's
 * k-th "i:" attribute is ia[k]; test_ir_text checks every name here against ops.def). */
enum {
    IR_IA_AXIS = 0,         /* the reductions, slice, concat */
    IR_IA_K = 0,            /* kth_largest */
    IR_IA_TRANSPOSE_B = 0,  /* matmul */
    IR_IA_STREAM = 0,       /* rand_like */
    IR_IA_BUCKETS = 0,      /* relpos_bucket: buckets, max_distance, causal */
    IR_IA_MAX_DISTANCE = 1,
    IR_IA_REL_CAUSAL = 2,
    IR_IA_CAUSAL = 0,       /* attention: causal, stats, window */
    IR_IA_STATS = 1,
    IR_IA_WINDOW = 2,
    IR_IA_BOUND = 3,
    IR_IA_GRAD_CAUSAL = 0,  /* attention_grad: causal, window */
    IR_IA_GRAD_WINDOW = 1,
    IR_IA_GROUP = 1,        /* matmul_q8: transpose_b (always 1), group */
};

typedef struct IrNode {
    int id;             /* index in graph->nodes, topological */
    IrOp op;
    IrDType dtype;
    int rank;
    IrDim shape[IR_MAXRANK];
    int nin;
    struct IrNode *in[IR_MAXIN];
    /* attributes, as ops.def describes them per op */
    int64_t ia[IR_MAXIA];
    double f;
    IrDim d;
    int8_t perm[IR_MAXRANK];
    const char *s;      /* input/param/buffer name (arena string) */
    const char *label;  /* printed value name without '%', unique in the graph */
} IrNode;

typedef struct {
    const char *name;
    IrNode *node;
} IrOutput;

/* A second state_dict name for a parameter or buffer (tied weights: XTransformer's
 * tie_token_emb stores one embedding under two names). Loading accepts the alias name (its
 * values must equal the target's) and autodiff writes grad.<alias> as well. */
typedef struct {
    const char *name;
    IrNode *target;
} IrAlias;

/* How a parameter or buffer starts when xtc initialises fresh weights (xtc init, xtc train):
 * the lowering records one rule per leaf, from the module that creates it (x-transformers' Linear,
 * Embedding, norms, the zero_init_* options, qk_norm's scale_init_value, ...), and the module
 * carries it to the runtime, which fills the tensor by it (runtime/init.c). Nothing at run time
 * reads it. The value is the rule's one parameter: */
typedef enum {
    IR_INIT_CONST,    /* every element = value */
    IR_INIT_NORMAL,   /* N(0, value^2) */
    IR_INIT_UNIFORM,  /* U(-value, value) */
    IR_INIT_ALIBI,    /* [.., heads, ..]: log of ALiBi's fixed slope of each head (value unused, 0) */
    IR_INIT_INV_FREQ, /* [n]: 1 / value^(k / n), rotary's inverse frequencies (value: the base) */
    IR_INIT_XPOS_SCALE, /* [n]: (2k + 0.8 n) / (2.8 n), rotary_xpos's per-pair scale (value unused) */
    IR_NUM_INITS
} IrInitKind;
const char *ir_init_name(IrInitKind k); /* "const", "normal", "uniform", "alibi", "inv_freq", "xpos_scale" */
int ir_init_lookup(const char *name);   /* -1 if unknown */

typedef struct {
    IrNode *target; /* the PARAM or BUFFER */
    IrInitKind kind;
    double value;
} IrInit;

/* A claim on an f32 input a pass relies on: every row (last axis) of its value has an L2 norm of
 * at most `norm` (cosine-sim attention reading a KV cache: the cache holds only keys the module
 * normalised, passes/attention_bound.c). The module records it and the runtime checks the rows a
 * caller binds to that input (xtc_session_set_input). */
typedef struct {
    IrNode *input;
    double norm;
} IrRowNorm;

typedef struct IrArena IrArena;

typedef struct IrGraph {
    const char *name;
    int nsyms;
    const char *sym_name[IR_MAXSYM];
    int64_t sym_max[IR_MAXSYM];   /* upper bound, 0 = unbounded; a derived symbol's cap */
    /* A derived symbol is not bound by an input but computed from earlier symbols once they are:
     * sym = min(sym_def, sym_max), or sym_def when sym_max is 0 (ir_graph_add_derived_sym). */
    int8_t sym_derived[IR_MAXSYM];
    IrDim sym_def[IR_MAXSYM];
    /* Limits: affine forms of the symbols bounded above together, where each symbol's own bound
     * is not enough (a KV cache: c+n <= max_seq_len, the positions of the cache and the call);
     * checked once the inputs bind the symbols (ir_graph_add_limit). */
    IrDim limit_def[IR_MAXLIMIT];
    int64_t limit_max[IR_MAXLIMIT];
    int nlimits;
    IrNode **nodes;
    int nnodes, cap;
    IrOutput *outputs;
    int noutputs, outcap;
    IrAlias *aliases;
    int naliases, aliascap;
    IrInit *inits;
    int ninits, initcap;
    IrRowNorm *rownorms;
    int nrownorms, rownormcap;
    IrArena *arena;
    struct IrHash *hash;
    char error[512];
    int label_seq;
} IrGraph;

IrGraph *ir_graph_new(const char *name);
void ir_graph_free(IrGraph *g);
const char *ir_graph_error(const IrGraph *g);   /* NULL if no error */
void ir_graph_set_error(IrGraph *g, const char *fmt, ...);
int ir_graph_add_sym(IrGraph *g, const char *name, int64_t max); /* returns index or existing */
int ir_graph_find_sym(const IrGraph *g, const char *name);        /* -1 if none */
/* Declares a derived symbol name = min(def, cap) (cap 0: name = def), def an affine form of the
 * symbols declared before it (Transformer-XL keeps q = min(n+p, max_mem_len) memory rows). Shapes
 * stay affine: q is a symbol like any other, evaluated after the inputs bind. Returns its index,
 * or -1 with the graph's error set (a name taken, a later symbol in def, too many symbols). */
int ir_graph_add_derived_sym(IrGraph *g, const char *name, IrDim def, int64_t cap);
/* Fills vals[s] of every derived symbol from the values of the symbols before it. */
void ir_graph_derive_syms(const IrGraph *g, int64_t *vals);
/* Declares the limit def <= max (max >= 1), def an affine form of declared symbols. Returns 0, or
 * -1 with the graph's error set (too many limits, a bad bound). */
int ir_graph_add_limit(IrGraph *g, IrDim def, int64_t max);
/* Gives dst (a graph without symbols) the symbols of src, derived ones with their definitions,
 * and its limits. */
void ir_graph_copy_syms(IrGraph *dst, const IrGraph *src);
char *ir_strdup(IrGraph *g, const char *s);                       /* arena copy */
void *ir_alloc(IrGraph *g, size_t n);                             /* arena, zeroed */

/* The one constructor. proto supplies op, operands, attributes and, for leaves, RESHAPE,
 * EXPAND, SLICE and CAST, the dtype and shape. Returns the (possibly pre-existing) node,
 * or NULL with the graph's error set. */
IrNode *ir_node(IrGraph *g, const IrNode *proto);

/* Convenience builders over ir_node. */
IrNode *ir_input(IrGraph *g, const char *name, IrDType t, int rank, const IrDim *shape);
IrNode *ir_param(IrGraph *g, const char *name, int rank, const IrDim *shape);
IrNode *ir_buffer(IrGraph *g, const char *name, int rank, const IrDim *shape);
/* an int8 weight (IR_I8), which only matmul_q8 reads */
IrNode *ir_buffer_i8(IrGraph *g, const char *name, int rank, const IrDim *shape);
IrNode *ir_const(IrGraph *g, double v, IrDType t);                  /* rank 0 */
IrNode *ir_arange(IrGraph *g, IrDim start, IrDim len, IrDType t);
IrNode *ir_relpos(IrGraph *g, IrDim nq, IrDim nk, int buckets, int max_distance, int causal);
IrNode *ir_unary(IrGraph *g, IrOp op, IrNode *x);
IrNode *ir_binary(IrGraph *g, IrOp op, IrNode *a, IrNode *b);
IrNode *ir_where(IrGraph *g, IrNode *cond, IrNode *a, IrNode *b);
IrNode *ir_cast(IrGraph *g, IrNode *x, IrDType t);
IrNode *ir_reduce(IrGraph *g, IrOp op, IrNode *x, int axis);        /* axis < 0 counts from the end */
IrNode *ir_softmax(IrGraph *g, IrNode *x);
IrNode *ir_entmax15(IrGraph *g, IrNode *x);                         /* over the last axis */
IrNode *ir_kth_largest(IrGraph *g, IrNode *x, int64_t k);           /* [.., J] -> [.., 1] */
IrNode *ir_reshape(IrGraph *g, IrNode *x, int rank, const IrDim *shape);
IrNode *ir_permute(IrGraph *g, IrNode *x, const int *perm);
IrNode *ir_slice(IrGraph *g, IrNode *x, int axis, IrDim start, IrDim len);
IrNode *ir_concat(IrGraph *g, IrNode *a, IrNode *b, int axis);
IrNode *ir_expand(IrGraph *g, IrNode *x, int rank, const IrDim *shape);
IrNode *ir_matmul(IrGraph *g, IrNode *a, IrNode *b, int transpose_b);
/* a[.., m, k] times the int8 weight w [n, k] (as a matmul with transpose_b) dequantized by
 * scale [n, ceil(k / group)]: w[j, p] stands for w[j, p] * scale[j, p / group] (ops.def) */
IrNode *ir_matmul_q8(IrGraph *g, IrNode *a, IrNode *w, IrNode *scale, int64_t group);
IrNode *ir_gather(IrGraph *g, IrNode *table, IrNode *idx);
/* src[..., D] added into a zero [rows, D] table at the rows idx[...] names: gather's gradient */
IrNode *ir_gather_grad(IrGraph *g, IrNode *src, IrNode *idx, IrDim rows);
IrNode *ir_xent(IrGraph *g, IrNode *logits, IrNode *targets);
/* f32 uniform in [0, 1) of like's shape from an integer scalar seed; stream tells sites apart */
IrNode *ir_rand(IrGraph *g, IrNode *seed, IrNode *like, int stream);
/* Fused attention (ops.def): bias NULL = none (const 0), mask NULL = none (const true); scale a
 * scalar or [.., 1, 1] f32 (ir_const for a number). */
IrNode *ir_attention(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *bias, IrNode *mask, IrNode *scale,
                     int causal, int stats);
/* ... with a window w > 0: query i also drops the keys j < i + J - I - w (max_attend_past) */
IrNode *ir_attention_window(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *bias, IrNode *mask, IrNode *scale,
                            int causal, int stats, int64_t window);
/* ... with a bound b > 0 on |q_i| |k_j| (cosine-sim attention; ops.def): needs no bias and a
 * constant scale s > 0 with b s <= IR_ATTENTION_BOUND_MAX, which the verifier checks. */
IrNode *ir_attention_bounded(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *mask, IrNode *scale, int causal,
                             int stats, int64_t window, int64_t bound);
/* The largest bound x scale the attention's bounded variant takes: its softmax subtracts
 * m = b s from every score, which lies in [-b s, b s], so the smallest exp(score - m) of a row,
 * exp(-2 b s) >= exp(-80), stays above f32's smallest normal (exp(-87.3)): no row underflows. */
#define IR_ATTENTION_BOUND_MAX 40.0
/* Grouped key/values (multi- and grouped-query attention) are implied by the shapes: with
 * q [.., H, I, D] and k, v [.., G, J, D] (G dividing H, constants), query head i reads key/value
 * head i mod G. For an attention or attention_grad node: H / G, the query heads sharing a
 * key/value head (1: not grouped). */
int64_t ir_attention_kv_group(const IrNode *n);
/* Its gradient: o = ir_attention(.., stats = 1) of the same operands; [.., I + 2J, D] = dq, dk, dv.
 * Grouped key/values (k, v [.., G, J, D]): still [.., H, I + 2J, D], key/value head g's dk and dv
 * (the sums over its query heads) in head g's rows, zeros in those of heads G..H-1, so that
 * slicing rows and then heads [0, G) gives dk, dv [.., G, J, D] (ops.def). */
IrNode *ir_attention_grad(IrGraph *g, IrNode *o, IrNode *dout);
/* A fused program (ir/fused_expr.h) over nin operands, its value broadcast to shape. */
IrNode *ir_fused(IrGraph *g, const char *program, int nin, IrNode *const *in, int rank, const IrDim *shape);

/* Gives n a readable value name (made unique with a suffix); returns n. NULL-safe. */
IrNode *ir_label(IrGraph *g, IrNode *n, const char *fmt, ...);
int ir_output(IrGraph *g, const char *name, IrNode *n);
/* Declares name as another name of the PARAM or BUFFER leaf target. */
int ir_alias(IrGraph *g, const char *name, IrNode *target);
const IrAlias *ir_find_alias(const IrGraph *g, const char *name);
/* Fresh weights of the PARAM or BUFFER p start by this rule (IrInit); a later rule for the same
 * leaf replaces the earlier one (zero_init_output over a Linear's default). */
int ir_init(IrGraph *g, IrNode *p, IrInitKind kind, double value);
const IrInit *ir_find_init(const IrGraph *g, const IrNode *p); /* NULL: no rule */
/* Claims that the rows of the f32 INPUT x have L2 norms <= norm (IrRowNorm); a second claim on x
 * keeps the smaller. ir_find_row_norm: the claim on x, 0 if none. */
int ir_row_norm(IrGraph *g, IrNode *x, double norm);
double ir_find_row_norm(const IrGraph *g, const IrNode *x);
IrNode *ir_find_leaf(const IrGraph *g, IrOp op, const char *name);

/* Shape inference for one node (ops.def's infer column); NULL or an error message. */
const char *ir_infer(IrNode *n, char *buf, size_t n_buf);

/* Verifier: types, shapes, topological order, operand counts, unique labels, output names.
 * Returns 0 when the graph is well formed, else -1 with a message naming the node. */
int ir_verify(const IrGraph *g, char *err, size_t n);

/* Text form (ir/print.c, ir/parse.c): print, parse, print gives the same text. */
void ir_print(const IrGraph *g, FILE *out);
char *ir_print_str(const IrGraph *g);   /* malloc'ed */
/* Parses the text form; NULL on error with "name:line:col: error: ..." in err. */
IrGraph *ir_parse(const char *text, const char *filename, char *err, size_t n);
/* Levenshtein distance of the first na bytes of a and b, for "did you mean" (the IR parser's op
 * names, the command line's options, --cpu names); 1000 when b is 64 bytes or longer. */
int ir_edit_distance(const char *a, size_t na, const char *b);

/* ---- reference interpreter (ir/interp.c) ---- */

/* A host tensor in its storage dtype: f32 as float, i32 as int32_t, i64 as int64_t,
 * bool as uint8_t (0 or 1). Row-major, contiguous. */
typedef struct {
    IrDType dtype;
    int rank;
    int64_t shape[IR_MAXRANK];
    void *data;
} IrHostTensor;

/* Supplies the tensor for a leaf (INPUT, PARAM or BUFFER, by node->s). Returns 0 and fills
 * *out (data stays owned by the caller), or -1 when it has none. */
typedef int (*IrBindFn)(void *ctx, const IrNode *leaf, IrHostTensor *out);

/* Runs the graph in double precision. On success returns 0 and fills outs[i] for each graph
 * output i (data malloc'ed in the output node's dtype; free with ir_host_free). On error
 * returns -1 with a message naming the input or node. Symbols are bound from the inputs'
 * shapes and checked against their bounds. */
int ir_interp(const IrGraph *g, IrBindFn bind, void *ctx, IrHostTensor *outs, char *err, size_t n);
/* The same with no rounding at the boundary, for gradient checks: the data of every f32 leaf the
 * callback supplies is double (integer and bool leaves keep their storage types), and each f32
 * output comes back as double data (outs[i].dtype stays IR_F32; the data is double *). */
int ir_interp_f64(const IrGraph *g, IrBindFn bind, void *ctx, IrHostTensor *outs, char *err, size_t n);
/* The same as ir_interp, with every f32 value a node computes (leaves included) passed through
 * round(round_ctx, node, values, count) before it is used: a reference for a backend that
 * stores values in a narrower format (16-bit storage), whose kernels round once on store. */
typedef void (*IrRoundFn)(void *ctx, const IrNode *n, double *v, int64_t count);
int ir_interp_rounded(const IrGraph *g, IrBindFn bind, void *ctx, IrRoundFn round, void *round_ctx,
                      IrHostTensor *outs, char *err, size_t n);
void ir_host_free(IrHostTensor *t);
int64_t ir_host_numel(const IrHostTensor *t);
int ir_interp_has_op(IrOp op);   /* 1 if the interpreter's op table has a row for op */

/* ---- reverse-mode autodiff (ir/autodiff.c) ---- */

typedef struct {
    const char *loss;   /* name of a scalar f32 output to differentiate (e.g. "loss"), or NULL */
    int seed_outputs;   /* when loss is NULL: for every f32 output O, add an input "grad.O" of O's
                           type (the caller's dL/dO, as PyTorch's y.backward(g)) and differentiate
                           sum(O * grad.O) */
    const char *loss_scale; /* NULL, or the name of a scalar f32 input S (IR_LOSS_SCALE_INPUT) added
                               to the graph and multiplied into the seed: the loss is seeded with S
                               instead of 1 (each grad.O by grad.O * S), so every gradient comes out
                               S times too large (dynamic loss scaling for fp16 storage; the runtime
                               divides the grad.<param> outputs by S). The forward graph must not
                               have an input of that name already */
} IrGradOpts;

/* The name the compile paths give IrGradOpts.loss_scale (for --train with --dtype fp16), which
 * the runtime recognises in a training module (include/xtc.h, XTC_LOSS_SCALE_INPUT). */
#define IR_LOSS_SCALE_INPUT "loss_scale"

/* Appends the backward graph to g and one output "grad.<param name>" per PARAM leaf (every
 * parameter, in node order; a parameter the loss does not depend on gets zeros of its shape).
 * BUFFER, INPUT and CONST leaves get no gradient; only f32 values carry one. o NULL means
 * {.loss = "loss"}. Returns 0, or -1 with a message (a missing rule names the op); after an
 * error g may hold unused backward nodes. */
int ir_autodiff(IrGraph *g, const IrGradOpts *o, char *err, size_t n);
/* The rule table: 1 if op has a gradient rule; else the reason it passes none (NULL if the
 * table has no entry for op, which ir_autodiff reports when a gradient reaches it). */
int ir_autodiff_has_rule(IrOp op);
const char *ir_autodiff_nograd(IrOp op);

#endif
