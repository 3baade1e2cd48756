/* cg_cuda_attention.h: what the attention kernels' files share (cg_cuda_attention.c, the
 * CUDA-core kernels and the helpers below; cg_cuda_attention_mma.c and
 * cg_cuda_attention_mma_grad.c, the tensor-core forward and backward). */
#ifndef XTC_CG_CUDA_ATTENTION_H
#define XTC_CG_CUDA_ATTENTION_H

#include "cg_cuda.h"

/* One attention node's sizes and its bias, mask and scale as C expressions of the batch indices
 * ix0.., the query row i and the key j (cu_att_setup). */
typedef struct {
    int r;
    int limits;         /* no mask operand and a causal or window limit: loops skip unseen keys */
    int causal;
    long long window;
    long long D, E;
    char I[CU_EXPR], J[CU_EXPR], batches[CU_EXPR];
    char bias[1100], keep[2200], scale[1024];
    char bmax[64];      /* the bounded variant (bound b, a constant scale s): b s, each row's softmax
                           maximum from the start where the kernel takes it (cg_cuda_attention.c's
                           tiled forward); "" otherwise */
} Att;

int cu_att_setup(CuKernel *k, Att *a, const IrNode *q, const IrNode *kk, const IrNode *v, const IrNode *bias,
                 const IrNode *mask, const IrNode *scale, const char *bias_in, const char *mask_in,
                 const char *scale_in, int causal, long long window);
/* jb, je: the keys query row i (in scope) visits */
void cu_att_key_range(CuKernel *k, const Att *a, const char *indent);
/* tjb, tje: the keys of the tile of rows [i0, i0 + rows), the union of its rows' ranges */
void cu_att_tile_keys(CuKernel *k, const Att *a, int rows, const char *indent);
/* fm, ib, ie: the query rows key j (in scope) gets gradient from, [0, fm) and [ib, ie) */
void cu_att_query_ranges(CuKernel *k, const Att *a, const char *indent);
/* ix0, ix1, ..: the batch dims of the flat batch index `batch` */
void cu_att_batch_indices(CuKernel *k, const IrNode *q, const char *indent);
/* The text the shared emitters write between cu_att_capture_begin (k->f into a string; 0, or -1
 * out of memory with k->f as it was) and cu_att_capture_define (k->f back, the text written
 * there as `#define head`: cu_att_define_lines) */
typedef struct {
    FILE *saved;
    char *buf;
    size_t len;
} CuAttCapture;
int cu_att_capture_begin(CuKernel *k, CuAttCapture *c);
void cu_att_capture_define(CuKernel *k, CuAttCapture *c, const char *head);
/* pointer `name` to the [rows, width] matrix of batch `batch` of operand or result x, row stride
 * `stride` (head views; k and v of grouped key/values at their own batch) */
void cu_att_operand_rows(CuKernel *k, const IrNode *x, unsigned view, const char *qual, const char *type,
                         const char *name, const char *base, const char *rows, const char *width, const char *stride);
/* I, J, batches, D, E, OC (and H with head views) */
void cu_att_forward_sizes(CuKernel *k, const Att *a, long long ocols);

/* Grouped key/values in the backward (ops.def: k and v with G heads where q has H): 1 with H and
 * G set, else 0 (H = G = 1) */
int cu_att_grad_groups(const IrNode *x, long long *H, long long *G);
enum { GR_Q = 1, GR_KV = 2 }; /* cu_att_grad_rows: the query side (qb, ob, gb, the batch indices), k and v */
/* The backward's input rows of query batch index `batch` (a variable's name): the batch indices
 * ix0.. and qb, ob, gb (GR_Q), kb, vb (GR_KV) at the key/value batch index of that query head */
void cu_att_grad_rows(CuKernel *k, unsigned which, const char *batch, const char *indent);
/* Opens the dk/dv side's loop over the query heads of the block's batch index `bt` (all H / G of
 * its group, ascending, or bt alone) as `batch`, with cu_att_grad_rows(GR_Q); the caller closes it */
void cu_att_grad_heads_begin(CuKernel *k, const char *indent);
/* With grouped key/values: rows [j0, j0 + n) (below J) of dk and dv zero where bt's head is one of
 * G..H-1, and opens the else of the heads that have key/values, which the caller closes */
void cu_att_grad_zero_rows(CuKernel *k, const char *j0, const char *n, const char *indent);

/* `indent dst = ` the 16-bit pair (p[lo] where clo, p[hi] where chi, else 0) of x's elements in
 * the mma's format: raw bits when x is stored in that format, else rounded from xtc_ld's floats
 * (cg_cuda_attention_mma_grad.c) */
void cu_att_pair(CuKernel *k, const IrNode *x, const char *indent, const char *dst, const char *p, const char *clo,
                 const char *lo, const char *chi, const char *hi);

/* Writes `#define head` with the text body as its lines (continued; the text has no // comments):
 * the model-specific parts of the kernels/flash_*.cuh bodies (cg_cuda_attention_mma.c) */
void cu_att_define_lines(FILE *f, const char *head, const char *body);

/* The tensor-core forward (cg_cuda_attention_mma.c) when the module's matmuls are on tensor
 * cores and the heads fit it: 1 written, 0 not taken (the CUDA-core kernels then), -1 error. */
int cu_attention_mma(CuKernel *k, const Att *a, int stats);
/* attention_grad on tensor cores (cg_cuda_attention_mma_grad.c), grouped key/values or not, the
 * output gradient's columns gcols: 1 written, 0 not taken (the CUDA-core kernels then: no --mma, heads over 128, or over 64
 * unless q, k, v and the output gradient are stored in the mma's format with heads multiples of
 * 8, which kernels/flash_bwd.cuh takes), -1 error. */
int cu_attention_grad_mma(CuKernel *k, const Att *a, const char *gcols);
/* Whether attention_grad x takes kernels/flash_bwd.cuh's kernel in a module of that storage and
 * resolved mma: q, k, v and the output gradient in the mma's format, o in f32, D = E a multiple
 * of 8 up to 128. That kernel reads each row's dlse_i - D_i from the step's scratch (CuGeom.pre). */
int cu_flash_bwd16_fits(int storage, int mma, const IrNode *x);

/* The forward kernel with, in front of the others' body, the path of few query rows against many
 * keys taken at run time (cg_cuda_attention_decode.c; it writes the others' kernel through
 * cg_cuda_attention): 1 written, 0 not taken (the node cannot have few rows), -1 error. */
int cu_attention_decode(CuKernel *k);

#endif
