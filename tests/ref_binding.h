/* ref_binding.h: a binding with a second copy of its leaves for the interpreter, in which some
 * are rounded as a 16-bit path rounds them (the operands of the matmuls, the tensors a module
 * stores in 16 bits), so that compiled modules are checked against the interpreter fed the same
 * rounded values: only the order of the f32 sums differs. The suites (test_cpu_bf16.c,
 * test_cuda_mma.c through mma_check.h) do the rounding their paths do, on rb->ref after
 * ref_binding_copy. Included after harness_bind.h. */
#ifndef XTC_TEST_REF_BINDING_H
#define XTC_TEST_REF_BINDING_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Binding b;                         /* what the module gets */
    IrHostTensor ref[HARNESS_MAXLEAF]; /* what the interpreter gets: some leaves rounded */
} RefBinding;

/* The names of the leaves that are operands of a matmul in g (before fusion hides the matmuls
 * in fused programs; the leaves keep their names): what the 16-bit matmuls round. */
typedef struct {
    int n;
    const char *name[HARNESS_MAXLEAF];
} Names;

static inline void matmul_operands(const IrGraph *g, Names *ops)
{
    ops->n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        for (int j = 0; j < 2 && x->op == IR_MATMUL; j++) {
            const IrNode *leaf = x->in[j]->op == IR_PERMUTE ? x->in[j]->in[0] : x->in[j]; /* a transposed A */
            ck_assert_msg(leaf->op == IR_INPUT || leaf->op == IR_PARAM, "matmul operands must be leaves here");
            ck_assert_int_lt(ops->n, HARNESS_MAXLEAF);
            ops->name[ops->n++] = leaf->s;
        }
    }
}

static inline int is_named(const Names *ops, const char *name)
{
    for (int i = 0; ops && i < ops->n; i++)
        if (strcmp(ops->name[i], name) == 0)
            return 1;
    return 0;
}

/* rb->ref[i]: a copy of the bound rb->b.t[i], for the caller to round */
static inline void ref_binding_copy(RefBinding *rb)
{
    for (int i = 0; i < rb->b.n; i++) {
        const IrHostTensor *t = &rb->b.t[i];
        int64_t numel = ir_host_numel(t);
        size_t bytes = (size_t)(numel ? numel : 1) * ir_dtype_size(rb->b.leaf[i]->dtype);
        rb->ref[i] = *t;
        rb->ref[i].data = malloc(bytes);
        memcpy(rb->ref[i].data, t->data, bytes);
    }
}

/* Each element of an f32 leaf copy through round(v) */
static inline void ref_binding_round(IrHostTensor *r, float (*round)(float))
{
    int64_t numel = ir_host_numel(r);
    for (int64_t k = 0; k < numel; k++) {
        float *v = &((float *)r->data)[k];
        *v = round(*v);
    }
}

static inline void bind_rounded_free(RefBinding *rb)
{
    for (int i = 0; i < rb->b.n; i++)
        free(rb->ref[i].data);
    bind_free(&rb->b);
}

/* ir_interp's callback: the interpreter's values of a RefBinding */
static inline int ref_cb(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    RefBinding *rb = ctx;
    int i = bind_index(&rb->b, leaf);
    if (i < 0)
        return -1;
    *out = rb->ref[i];
    return 0;
}

#endif
