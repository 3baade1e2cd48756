/* cg_plan.c: from a verified graph to the schedule a backend renders.
 *
 * Requires: a graph that verifies.
 * Produces: a CgPlan:
 *  - one buffer per input, parameter and state buffer (all of them, used or not, so the module's
 *    interface is the model's), and one temp buffer per needed computed node;
 *  - RESHAPE makes no step: its value is its operand's buffer read with another shape (buffers
 *    are contiguous, so this is exact); nor does a head-split PERMUTE around attention that the
 *    backend reads or writes in place (cg_plan.h, CG_VIEW_*);
 *  - one step per other needed node, in the graph's (topological) order;
 *  - lifetimes: a temp lives from its step to the last step reading it (through reshapes), or to
 *    the end for outputs;
 *  - kernels deduplicated by signature, so the twelve layers of a model share their code;
 *  - index ranges for integer inputs that feed a gather (token ids) or a cross-entropy (targets,
 *    negative ones ignored), checked by the runtime when the input is set. */
#include "cg_plan.h"
#include "fused_expr.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_bound_leaf(IrOp op) { return op == IR_INPUT || op == IR_PARAM || op == IR_BUFFER; }

int cg_dims_are_one(const IrDim *dims, int from, int to)
{
    for (int i = from; i < to; i++)
        if (!ir_dim_is_one(dims[i]))
            return 0;
    return 1;
}

static void put_dim(FILE *f, IrDim d)
{
    fprintf(f, "%lld", (long long)d.c);
    for (int s = 0; s < IR_MAXSYM; s++)
        if (d.k[s])
            fprintf(f, "%+d@%d", d.k[s], s);
}

static void put_shape(FILE *f, const IrNode *n)
{
    fprintf(f, "%s[", ir_dtype_name(n->dtype));
    for (int i = 0; i < n->rank; i++) {
        if (i)
            fputc(',', f);
        put_dim(f, n->shape[i]);
    }
    fputc(']', f);
}

/* 1 when n is a table of positions: computed within a few elementwise or view steps from
 * ARANGE or RELPOS (with constants and buffers), reading no parameter and no input but scalars.
 * Such tables (rotary angles t * inv_freq, ALiBi's slope * distance) hold values that grow with
 * the position: in 16 bits an angle of 300 radians is off by up to 1 (bf16) and a bias of -500
 * by 2, which moves attention far more than rounding the activations does. They are small (a
 * row per position), so they stay f32 under 16-bit storage, as PyTorch's rotary code keeps its
 * angles in f32 under autocast. The buffers such tables read stay f32 as well (cg_keeps_f32):
 * an inverse frequency rounded to 16 bits turns every angle by a part in 2^12 (fp16) or 2^9
 * (bf16) of itself, which attention's relative angles hide but the rotated k and v that a KV
 * cache keeps do not. *seen: an ARANGE or RELPOS was found. */
static int positional(const IrNode *n, int depth, int *seen)
{
    switch (n->op) {
    case IR_ARANGE:
    case IR_RELPOS: *seen = 1; return 1;
    case IR_CONST:
    case IR_BUFFER: return 1;
    case IR_INPUT: return n->rank == 0;
    default: break;
    }
    if (depth == 0 || n->nin < 1 ||
        !(ir_ops[n->op].flags & (IR_ELEM | IR_VIEW) || n->op == IR_FUSED || n->op == IR_CONCAT))
        return 0;
    for (int i = 0; i < n->nin; i++)
        if (!positional(n->in[i], depth - 1, seen))
            return 0;
    return 1;
}

/* 1 when n is a sum over a symbolic axis (the batch, the positions) or combines such sums with
 * constants through a few elementwise or view steps: a gradient of weights shared by every
 * position, summed in the backward pass. T5's relative position bias is the case: the softmax
 * gradients of [b, h, n, n] summed over the batch (and the layers sharing the table), then
 * gathered into [buckets, h] by the buckets' sums (f32: IR_GATHER_GRAD), which cancel to a few
 * percent of their terms, so that rounding the partial sums to 16 bits shows: kept f32 they take
 * a seventh off the bf16 bias gradient's error (the rest is the softmax gradients' own rounding,
 * stored in 16 bits before the batch sum). Such sums have no batch dimension: small beside the
 * activations they reduce. *seen: a sum found. */
static int reduced_grad(const IrNode *n, int depth, int *seen)
{
    switch (n->op) {
    case IR_CONST: return 1;
    case IR_SUM: {
        if (!cg_sum_keeps_f32(n->in[0], (int)n->ia[IR_IA_AXIS]))
            return 0;
        *seen = 1;
        return 1;
    }
    default: break;
    }
    if (depth == 0 || n->nin < 1 || !(ir_ops[n->op].flags & (IR_ELEM | IR_VIEW) || n->op == IR_FUSED))
        return 0;
    for (int i = 0; i < n->nin; i++)
        if (!reduced_grad(n->in[i], depth - 1, seen))
            return 0;
    return 1;
}

int cg_sum_keeps_f32(const IrNode *x, int axis)
{
    return axis >= 0 && axis < x->rank && !ir_dim_is_const(x->shape[axis]);
}

int cg_keeps_f32(const IrNode *n)
{
    while (n->op == IR_RESHAPE)
        n = n->in[0];
    if (n->dtype != IR_F32)
        return 0;
    int seen = 0;
    if (n->op != IR_BUFFER && n->op != IR_CONST && positional(n, 8, &seen) && seen)
        return 1;
    seen = 0;
    if (n->op != IR_CONST && reduced_grad(n, 6, &seen) && seen)
        return 1;
    switch (n->op) {
    case IR_BUFFER: /* fixed tables, not trained: rotary's inverse frequencies (above), a 1.x
                     * LayerNorm's zero beta; small */
    case IR_XENT:
    case IR_GATHER_GRAD:
    case IR_ENTMAX15:
    case IR_RAND: return 1;
    case IR_INPUT: return n->rank == 0; /* a scalar: the loss scale (2^16 is past fp16's 65504) */
    case IR_ATTENTION: return n->ia[IR_IA_STATS] != 0;
    default: return 0;
    }
}

/* Everything the generated code depends on; nothing it does not (labels, names, node ids). */
static char *signature(const IrNode *n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "%s ", ir_ops[n->op].name);
    put_shape(f, n);
    fprintf(f, " ia");
    for (int i = 0; i < IR_MAXIA; i++)
        fprintf(f, " %lld", (long long)n->ia[i]);
    if (n->op == IR_FUSED) /* the program; leaves' names do not reach here */
        fprintf(f, " program %s", n->s ? n->s : "");
    fprintf(f, " f %a d ", n->f);
    put_dim(f, n->d);
    fprintf(f, " perm");
    for (int i = 0; i < IR_MAXRANK; i++)
        fprintf(f, " %d", n->perm[i]);
    for (int i = 0; i < n->nin; i++) {
        fprintf(f, " in%d ", i);
        put_shape(f, n->in[i]);
        if (cg_keeps_f32(n->in[i])) /* read as f32 under 16-bit storage */
            fprintf(f, "!");
        if (n->in[i]->op == IR_CONST) /* folded into the code (attention's scale, bias 0, mask true) */
            fprintf(f, " =%a", n->in[i]->f);
    }
    fclose(f);
    return buf;
}

static int valid_name(const char *s) { return s && *s; }

static int fail(char *err, size_t n, const char *msg, const char *arg)
{
    snprintf(err, n, msg, arg);
    return -1;
}

static int add_buffer(CgPlan *p, CgBufKind kind, const IrNode *node, const char *name)
{
    CgBuffer *b = &p->bufs[p->nbufs];
    b->kind = kind;
    b->node = node;
    b->name = name;
    b->first = b->last = -1;
    return p->nbufs++;
}

/* stored: the storage of each operand's buffer (CgPlan.storage), out_stored the result's, in the
 * signature when not 0 */
static int find_kernel(CgPlan *p, const IrNode *n, unsigned views, const int *stored, int out_stored)
{
    char *sig = signature(n);
    if (!sig)
        return -1;
    char more[24 + 4 * IR_MAXIN] = "";
    if (views) /* a kernel reading or writing through a view is another kernel */
        snprintf(more, sizeof more, " views %u", views);
    for (int k = 0; k < n->nin; k++) /* ... and one reading a 16-bit operand where others read f32 */
        if (stored[k])
            snprintf(more + strlen(more), sizeof more - strlen(more), " s%d", stored[k]);
    if (out_stored) /* ... or writing one (a KV cache; under CG_STORE_ALL the node decides: 0) */
        snprintf(more + strlen(more), sizeof more - strlen(more), " o%d", out_stored);
    if (more[0]) {
        size_t len = strlen(sig);
        char *s2 = realloc(sig, len + strlen(more) + 1);
        if (!s2) {
            free(sig);
            return -1;
        }
        sig = s2;
        memcpy(sig + len, more, strlen(more) + 1);
    }
    for (int k = 0; k < p->nkernels; k++)
        if (strcmp(p->kernels[k].sig, sig) == 0) {
            free(sig);
            p->kernels[k].uses++;
            return k;
        }
    CgKernel *k = &p->kernels[p->nkernels];
    k->node = n;
    k->sig = sig;
    k->uses = 1;
    k->views = views;
    snprintf(k->fn, sizeof k->fn, "xtc_k%d_%s", p->nkernels, ir_ops[n->op].name);
    return p->nkernels++;
}

static int is_head_split(const IrNode *n)
{
    return n->op == IR_PERMUTE && n->rank == 4 && n->perm[0] == 0 && n->perm[1] == 2 && n->perm[2] == 1 &&
           n->perm[3] == 3;
}

/* The CG_VIEW_* decisions (cg_plan.h): views[id] for attention nodes, and elide[id] for the
 * permutes that make no step. */
static void head_views(const IrGraph *g, const char *needed, unsigned *views, char *elide)
{
    int nn = g->nnodes;
    int *uses = calloc((size_t)nn + 1, sizeof *uses);
    char *other = calloc((size_t)nn + 1, 1), *output = calloc((size_t)nn + 1, 1);
    if (!uses || !other || !output)
        goto done; /* no views: still a correct plan */
    for (int o = 0; o < g->noutputs; o++)
        output[g->outputs[o].node->id] = 1;
    for (int i = 0; i < nn; i++) {
        const IrNode *x = g->nodes[i];
        if (!needed[i])
            continue;
        for (int k = 0; k < x->nin; k++) {
            uses[x->in[k]->id]++;
            if (x->op != IR_ATTENTION || k > 2)
                other[x->in[k]->id] = 1;
        }
    }
    for (int i = 0; i < nn; i++) {
        const IrNode *pm = g->nodes[i], *a = pm->in[0];
        if (!needed[i] || !is_head_split(pm))
            continue;
        if (a->op == IR_ATTENTION && a->ia[IR_IA_STATS] == 0 && uses[a->id] == 1 && !output[a->id]) {
            views[a->id] |= CG_VIEW_OUT;
            elide[i] = 1;
        } else if (!other[i] && !output[i] && uses[i] > 0 && !cg_keeps_f32(a)) {
            for (int j = i + 1; j < nn; j++)
                for (int k = 0; k < 3 && g->nodes[j]->op == IR_ATTENTION; k++)
                    if (needed[j] && g->nodes[j]->in[k] == pm)
                        views[j] |= (unsigned)CG_VIEW_Q << k;
            elide[i] = 1;
        }
    }
done:
    free(uses);
    free(other);
    free(output);
}

static int swaps_last_two(const IrNode *n)
{
    if (n->op != IR_PERMUTE || n->rank < 2)
        return 0;
    for (int d = 0; d < n->rank - 2; d++)
        if (n->perm[d] != d)
            return 0;
    return n->perm[n->rank - 2] == n->rank - 1 && n->perm[n->rank - 1] == n->rank - 2;
}

/* Whether x, of rank 3, has the batch dim of matmul mm's output (not broadcast) */
static int same_batch(const IrNode *x, const IrNode *mm)
{
    return x->rank == 3 && ir_dim_eq(x->shape[0], mm->shape[0]);
}

/* The CG_VIEW_A_T and CG_VIEW_SUM_B decisions (cg_plan.h): views[id] for matmul nodes, elide[id]
 * 1 for the permutes they read in place, 2 for the sums they write. stored: per node id, its
 * storage (a view reads the operand as the permute's value would have been stored). */
static void matmul_views(const IrGraph *g, const char *needed, const uint8_t *stored, unsigned *views, char *elide)
{
    int nn = g->nnodes;
    char *other = calloc((size_t)nn + 1, 1), *output = calloc((size_t)nn + 1, 1);
    int *uses = calloc((size_t)nn + 1, sizeof *uses), *reader = calloc((size_t)nn + 1, sizeof *reader);
    if (!other || !output || !uses || !reader)
        goto done; /* no views: still a correct plan */
    for (int o = 0; o < g->noutputs; o++)
        other[g->outputs[o].node->id] = output[g->outputs[o].node->id] = 1;
    for (int i = 0; i < nn; i++) {
        const IrNode *x = g->nodes[i];
        if (!needed[i])
            continue;
        for (int k = 0; k < x->nin; k++) { /* read other than as a plain matmul's A */
            if (x->op != IR_MATMUL || k != 0 || x->ia[IR_IA_TRANSPOSE_B] || x->in[1] == x->in[0])
                other[x->in[k]->id] = 1;
            uses[x->in[k]->id]++;
            reader[x->in[k]->id] = i;
        }
    }
    for (int i = 0; i < nn; i++) {
        const IrNode *pm = g->nodes[i];
        if (!needed[i] || elide[i] || other[i] || !swaps_last_two(pm) || pm->dtype != IR_F32 ||
            stored[pm->in[0]->id] != stored[i])
            continue;
        int used = 0;
        for (int j = i + 1; j < nn; j++) {
            const IrNode *mm = g->nodes[j], *sum = g->nodes[reader[j]];
            if (!needed[j] || mm->op != IR_MATMUL || mm->in[0] != pm)
                continue;
            views[j] |= CG_VIEW_A_T;
            used = 1;
            if (mm->rank == 3 && same_batch(pm->in[0], mm) && same_batch(mm->in[1], mm) && uses[j] == 1 && !output[j] &&
                sum->op == IR_SUM && sum->ia[IR_IA_AXIS] == 0 && !elide[sum->id]) {
                views[j] |= CG_VIEW_SUM_B;
                elide[sum->id] = 2;
            }
        }
        elide[i] = (char)used;
    }
done:
    free(other);
    free(output);
    free(uses);
    free(reader);
}

int cg_node_storage(const IrNode *n, int storage)
{
    return n->dtype == IR_F32 && !cg_keeps_f32(n) ? storage : 0;
}

/* Whether fused node n reads its operand k only as the B operand of its program's matmul. */
static int fused_reads_as_b(const IrNode *n, int k)
{
    IrFusedProgram prog;
    IrNode *steps[IR_FUSED_MAXSTEPS];
    char err[256], name[16];
    IrGraph *pg = ir_fused_graph_of(n, &prog, steps, err, sizeof err);
    if (!pg)
        return 0;
    snprintf(name, sizeof name, "x%d", k);
    int as_b = 0, other = 0;
    for (int i = 0; i < pg->nnodes; i++) {
        const IrNode *x = pg->nodes[i];
        for (int j = 0; j < x->nin; j++)
            if (x->in[j]->op == IR_INPUT && x->in[j]->s && strcmp(x->in[j]->s, name) == 0) {
                if (x->op == IR_MATMUL && j == 1 && x->in[0] != x->in[1])
                    as_b = 1;
                else
                    other = 1;
            }
    }
    for (int o = 0; o < pg->noutputs; o++)
        if (pg->outputs[o].node->op == IR_INPUT)
            other = 1;
    ir_graph_free(pg);
    return as_b && !other;
}

/* Whether x reads v only as a forward attention's k or v (operand 1 or 2). */
static int reads_as_kv(const IrNode *x, const IrNode *v)
{
    for (int j = 0; j < x->nin; j++)
        if (x->in[j] == v && !(x->op == IR_ATTENTION && (j == 1 || j == 2)))
            return 0;
    return 1;
}

/* CG_STORE_KV_CACHES: st[] set for the KV caches of a decoding graph, the pairs of an f32 input
 * (the cache carried in) read only as the first operand of a concat (its positions, then the
 * call's: the runtime appends in place where the axis allows, rt_carry.c) and that concat (an
 * output: carried out), which only attention kernels read, as k or v, in place or through
 * head-split views. Both of a pair or neither; none that cg_keeps_f32 keeps; as int8 rows, only
 * caches whose rows (the last dimension) are constant and appended whole. */
static void kv_cache_storage(const IrGraph *g, const char *needed, const char *elide, int storage, uint8_t *st)
{
    size_t nn = (size_t)g->nnodes + 1;
    char *cand = calloc(nn, 1), *output = calloc(nn, 1);
    if (!cand || !output)
        goto done; /* f32 caches: still a correct plan */
    for (int o = 0; o < g->noutputs; o++)
        output[g->outputs[o].node->id] = 1;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *c = g->nodes[i];
        if (needed[i] && output[i] && c->op == IR_CONCAT && c->dtype == IR_F32 && c->in[0]->op == IR_INPUT &&
            c->in[0]->dtype == IR_F32 && c->in[1] != c->in[0] && !cg_keeps_f32(c) && !cg_keeps_f32(c->in[0]) &&
            (storage != CG_STORE_INT8_ROWS || /* rows of a constant last dimension, appended whole */
             (c->rank >= 2 && ir_dim_is_const(c->shape[c->rank - 1]) && c->ia[IR_IA_AXIS] < c->rank - 1)))
            cand[i] = 1, cand[c->in[0]->id] = 1;
    }
    for (int i = 0; i < g->nnodes; i++) { /* a reader other than those drops the pair */
        const IrNode *x = g->nodes[i];
        if (!needed[i])
            continue;
        for (int j = 0; j < x->nin; j++) {
            const IrNode *in = x->in[j];
            int ok = 1;
            if (!cand[in->id])
                continue;
            if (in->op == IR_INPUT)
                ok = cand[x->id] && x->op == IR_CONCAT && j == 0;
            else if (x->op == IR_PERMUTE && elide[i]) /* a view: its readers read the concat */
                for (int r = i + 1; r < g->nnodes && ok; r++)
                    ok = !needed[r] || reads_as_kv(g->nodes[r], x);
            else
                ok = reads_as_kv(x, in);
            if (!ok)
                cand[in->id] = 0;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *c = g->nodes[i];
        if (cand[i] && c->op == IR_CONCAT && cand[c->in[0]->id])
            st[i] = st[c->in[0]->id] = (uint8_t)storage;
    }
done:
    free(cand);
    free(output);
}

/* Per node id: its storage under o (CgPlanOpts): CG_STORE_ALL as cg_node_storage; for
 * CG_STORE_MATMUL_WEIGHTS the parameters that every needed reader reads as a matmul's B; for
 * CG_STORE_KV_CACHES the caches (kv_cache_storage). */
static void node_storage(const IrGraph *g, const char *needed, const char *elide, const CgPlanOpts *o, uint8_t *st)
{
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        st[i] = (uint8_t)cg_node_storage(x, o->storage);
        if (o->scope != CG_STORE_ALL && !((o->scope & CG_STORE_MATMUL_WEIGHTS) && x->op == IR_PARAM))
            st[i] = 0;
    }
    if (o->scope == CG_STORE_ALL)
        return;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (!needed[i])
            continue;
        for (int j = 0; j < x->nin; j++) {
            const IrNode *in = x->in[j];
            if (!st[in->id])
                continue;
            int as_b = (x->op == IR_MATMUL && j == 1 && x->in[0] != in) || (x->op == IR_FUSED && fused_reads_as_b(x, j));
            if (!as_b)
                st[in->id] = 0;
        }
    }
    for (int o2 = 0; o2 < g->noutputs; o2++)
        st[g->outputs[o2].node->id] = 0;
    if (o->scope & CG_STORE_KV_CACHES)
        kv_cache_storage(g, needed, elide, o->kv_storage ? o->kv_storage : o->storage, st);
}

int cg_plan_build(const IrGraph *g, CgPlan *p, char *err, size_t n) { return cg_plan_build_opts(g, p, NULL, err, n); }

int cg_plan_build_views(const IrGraph *g, CgPlan *p, int views_on, char *err, size_t n)
{
    CgPlanOpts o = {.head_views = views_on};
    return cg_plan_build_opts(g, p, &o, err, n);
}

int cg_plan_build_opts(const IrGraph *g, CgPlan *p, const CgPlanOpts *opts, char *err, size_t n)
{
    static const CgPlanOpts none = {0};
    const CgPlanOpts *o = opts ? opts : &none;
    int views_on = o->head_views;
    memset(p, 0, sizeof *p);
    p->g = g;
    char msg[512];
    if (ir_verify(g, msg, sizeof msg) < 0)
        return fail(err, n, "the graph does not verify: %s", msg);
    if (g->noutputs == 0)
        return fail(err, n, "graph '%s' has no outputs", g->name);
    for (int s = 0; s < g->nsyms; s++) {
        const char *nm = g->sym_name[s];
        int ok = nm && (isalpha((unsigned char)nm[0]) || nm[0] == '_');
        for (const char *c = nm; ok && *c; c++)
            ok = isalnum((unsigned char)*c) || *c == '_';
        if (!ok)
            return fail(err, n, "symbol name '%s' is not an identifier", nm ? nm : "");
    }
    size_t nn = (size_t)g->nnodes + 1;
    char *needed = calloc(nn, 1);
    p->buf_of = malloc(nn * sizeof *p->buf_of);
    p->bufs = calloc(nn, sizeof *p->bufs);
    p->steps = calloc(nn, sizeof *p->steps);
    p->kernels = calloc(nn, sizeof *p->kernels);
    p->range_hi = calloc(nn, sizeof *p->range_hi);
    p->range_index = calloc(nn, sizeof *p->range_index);
    p->storage = calloc(nn, sizeof *p->storage);
    if (!needed || !p->buf_of || !p->bufs || !p->steps || !p->kernels || !p->range_hi || !p->range_index || !p->storage) {
        free(needed);
        cg_plan_free(p);
        return fail(err, n, "out of memory%s", "");
    }
    for (int o = 0; o < g->noutputs; o++) {
        if (!valid_name(g->outputs[o].name)) {
            free(needed);
            cg_plan_free(p);
            return fail(err, n, "output name '%s' is empty", g->outputs[o].name);
        }
        needed[g->outputs[o].node->id] = 1;
    }
    for (int i = g->nnodes - 1; i >= 0; i--)
        if (needed[i])
            for (int k = 0; k < g->nodes[i]->nin; k++)
                needed[g->nodes[i]->in[k]->id] = 1;
    unsigned *views = calloc(nn, sizeof *views);
    char *elide = calloc(nn, 1);
    if (!views || !elide) {
        free(needed);
        free(views);
        free(elide);
        cg_plan_free(p);
        return fail(err, n, "out of memory%s", "");
    }
    if (views_on)
        head_views(g, needed, views, elide);
    uint8_t *stored = calloc(nn, 1);
    if (!stored) {
        free(needed);
        free(views);
        free(elide);
        cg_plan_free(p);
        return fail(err, n, "out of memory%s", "");
    }
    if (o->storage)
        node_storage(g, needed, elide, o, stored);
    if (o->matmul_views)
        matmul_views(g, needed, stored, views, elide);

    int rc = 0;
    for (int i = 0; i < g->nnodes && rc == 0; i++) {
        const IrNode *node = g->nodes[i];
        p->buf_of[i] = -1;
        if (is_bound_leaf(node->op)) {
            if (!valid_name(node->s)) {
                rc = fail(err, n, "leaf name '%s' is empty", node->s ? node->s : "");
                break;
            }
            CgBufKind kind = node->op == IR_INPUT ? CG_BUF_INPUT : node->op == IR_PARAM ? CG_BUF_PARAM : CG_BUF_STATE;
            p->buf_of[i] = add_buffer(p, kind, node, node->s);
            p->storage[p->buf_of[i]] = stored[i];
            continue;
        }
        if (!needed[i])
            continue;
        if (node->op == IR_RESHAPE || elide[i]) {
            p->buf_of[i] = p->buf_of[node->in[0]->id];
            if (elide[i] == 2) { /* a sum its matmul writes (CG_VIEW_SUM_B): the buffer holds the sum's value */
                p->bufs[p->buf_of[i]].node = node;
                p->storage[p->buf_of[i]] = stored[i];
            }
            continue;
        }
        CgStep *st = &p->steps[p->nsteps];
        st->node = node;
        st->scratch = -1;
        const char *label = node->label && valid_name(node->label) ? node->label : NULL;
        int b = add_buffer(p, CG_BUF_TEMP, node, label);
        p->bufs[b].first = p->bufs[b].last = p->nsteps;
        p->buf_of[i] = b;
        p->storage[b] = stored[i];
        st->out = b;
        int in_storage[IR_MAXIN] = {0};
        for (int k = 0; k < IR_MAXIN; k++) {
            st->in[k] = k < node->nin ? p->buf_of[node->in[k]->id] : -1;
            if (st->in[k] >= 0 && p->bufs[st->in[k]].kind == CG_BUF_TEMP)
                p->bufs[st->in[k]].last = p->nsteps;
            if (st->in[k] >= 0)
                in_storage[k] = p->storage[st->in[k]];
        }
        st->kernel = find_kernel(p, node, views[i], in_storage, o->scope == CG_STORE_ALL ? 0 : stored[i]);
        if (st->kernel < 0) {
            rc = fail(err, n, "out of memory%s", "");
            break;
        }
        p->nsteps++;
    }
    free(needed);
    free(views);
    free(elide);
    free(stored);
    if (rc) {
        cg_plan_free(p);
        return rc;
    }
    for (int o = 0; o < g->noutputs; o++) {
        int b = p->buf_of[g->outputs[o].node->id];
        if (p->bufs[b].kind == CG_BUF_TEMP)
            p->bufs[b].last = p->nsteps;
    }
    /* token ids: an integer input feeding a gather (the table's rows) or a cross-entropy (the
     * classes, its last dim) directly or through casts, reshapes and slices (XTransformer's tgt:
     * the decoder reads tgt[:, :-1]; its values are token ids all the same) */
    for (int s = 0; s < p->nsteps; s++) {
        const IrNode *node = p->steps[s].node;
        if ((node->op != IR_GATHER && node->op != IR_XENT) || node->nin < 2 || node->in[0]->rank < 1)
            continue;
        IrDim rows = node->in[0]->shape[node->op == IR_GATHER ? 0 : node->in[0]->rank - 1];
        if (!ir_dim_is_const(rows))
            continue;
        const IrNode *idx = node->in[1];
        while ((idx->op == IR_CAST && ir_dtype_is_int(idx->in[0]->dtype)) || idx->op == IR_RESHAPE ||
               idx->op == IR_SLICE)
            idx = idx->in[0];
        if (idx->op != IR_INPUT || !ir_dtype_is_int(idx->dtype))
            continue;
        int b = p->buf_of[idx->id];
        if (b < 0)
            continue;
        if (p->range_hi[b] == 0 || rows.c < p->range_hi[b])
            p->range_hi[b] = rows.c;
        p->range_index[b] |= node->op == IR_GATHER;
    }
    return 0;
}

void cg_plan_free(CgPlan *p)
{
    if (p->kernels)
        for (int k = 0; k < p->nkernels; k++)
            free(p->kernels[k].sig);
    free(p->kernels);
    free(p->bufs);
    free(p->steps);
    free(p->buf_of);
    free(p->range_hi);
    free(p->range_index);
    free(p->storage);
    memset(p, 0, sizeof *p);
}

int cg_plan_add_scratch(CgPlan *p, int step, int rank, const IrDim *shape)
{
    if (step < 0 || step >= p->nsteps || p->steps[step].scratch >= 0 || rank < 1 || rank > IR_MAXRANK)
        return -1;
    size_t nb = (size_t)p->nbufs + 1; /* the per-buffer arrays, one entry more */
    CgBuffer *bufs = realloc(p->bufs, nb * sizeof *bufs);
    if (bufs)
        p->bufs = bufs;
    int64_t *hi = realloc(p->range_hi, nb * sizeof *hi);
    if (hi)
        p->range_hi = hi;
    uint8_t *ix = realloc(p->range_index, nb), *st = realloc(p->storage, nb);
    if (ix)
        p->range_index = ix;
    if (st)
        p->storage = st;
    if (!bufs || !hi || !ix || !st)
        return -1;
    const char *label = p->steps[step].node->label;
    int b = add_buffer(p, CG_BUF_TEMP, p->steps[step].node, valid_name(label) ? label : NULL);
    CgBuffer *buf = &p->bufs[b];
    buf->first = buf->last = step;
    buf->rank = rank;
    memcpy(buf->shape, shape, (size_t)rank * sizeof *shape);
    p->range_hi[b] = 0;
    p->range_index[b] = 0;
    p->storage[b] = 0;
    p->steps[step].scratch = b;
    return b;
}

static void meta_dims(FILE *f, const IrGraph *g, int rank, const IrDim *shape)
{
    char d[64];
    fputc('[', f);
    for (int i = 0; i < rank; i++)
        fprintf(f, "%s%s", i ? "," : "", ir_dim_str(g, shape[i], d, sizeof d));
    fputc(']', f);
}

static void meta_shape(FILE *f, const IrGraph *g, const IrNode *n) { meta_dims(f, g, n->rank, n->shape); }

/* Names go into the space-separated metadata with bytes outside '!'..'~' and '%' as %XX
 * (rt_meta.c decodes them), so any name survives, spaces and UTF-8 included. */
static void put_name(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p >= 0x7f || *p == '%')
            fprintf(f, "%%%02X", *p);
        else
            fputc(*p, f);
}

static const char *buf_kind_name(CgBufKind k)
{
    static const char *names[] = {"input", "param", "state", "temp"};
    return names[k];
}

char *cg_plan_meta(const CgPlan *p, const char *const *options, int noptions)
{
    const IrGraph *g = p->g;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "xtc-module 1\n");
    fprintf(f, "model ");
    put_name(f, valid_name(g->name) ? g->name : "model");
    fputc('\n', f);
    for (int i = 0; i + 1 < 2 * noptions; i += 2)
        if (options[i + 1] && valid_name(options[i]) && valid_name(options[i + 1])) {
            fprintf(f, "option %s ", options[i]);
            put_name(f, options[i + 1]);
            fputc('\n', f);
        }
    for (int s = 0; s < g->nsyms; s++) {
        fprintf(f, "sym %s %lld\n", g->sym_name[s], (long long)g->sym_max[s]);
        char def[128];
        if (g->sym_derived[s])
            fprintf(f, "derive %s %s %lld\n", g->sym_name[s], ir_dim_str(g, g->sym_def[s], def, sizeof def),
                    (long long)g->sym_max[s]);
    }
    for (int i = 0; i < g->nlimits; i++) {
        char def[128];
        fprintf(f, "limit %s %lld\n", ir_dim_str(g, g->limit_def[i], def, sizeof def), (long long)g->limit_max[i]);
    }
    for (int i = 0; i < p->nbufs; i++) {
        const CgBuffer *b = &p->bufs[i];
        char name[32];
        const char *nm = b->name;
        if (!nm) {
            snprintf(name, sizeof name, "t%d", b->node->id);
            nm = name;
        }
        fprintf(f, "buffer %d %s ", i, buf_kind_name(b->kind));
        put_name(f, nm);
        if (b->rank > 0) { /* a step's scratch */
            fprintf(f, ".scratch %s ", ir_dtype_name(IR_F32));
            meta_dims(f, g, b->rank, b->shape);
        } else {
            fprintf(f, " %s ", ir_dtype_name(b->node->dtype));
            meta_shape(f, g, b->node);
        }
        fprintf(f, " %d %d\n", b->first, b->last);
    }
    for (int i = 0; i < p->nbufs; i++) /* written only where a buffer is stored in 16 bits */
        if (p->storage && p->storage[i])
            fprintf(f, "storage %d %s\n", i, p->storage[i] == 1 ? "bf16" : p->storage[i] == 2 ? "fp16" : "int8");
    for (int o = 0; o < g->noutputs; o++) {
        const IrNode *node = g->outputs[o].node;
        fprintf(f, "output ");
        put_name(f, g->outputs[o].name);
        fprintf(f, " %d %s ", p->buf_of[node->id], ir_dtype_name(node->dtype));
        meta_shape(f, g, node);
        fputc('\n', f);
    }
    for (int i = 0; i < g->naliases; i++) {
        const IrAlias *a = &g->aliases[i];
        int b = a->target ? p->buf_of[a->target->id] : -1;
        if (b < 0 || !valid_name(a->name))
            continue;
        fprintf(f, "alias ");
        put_name(f, a->name);
        fprintf(f, " %d\n", b);
    }
    for (int i = 0; i < g->ninits; i++) {
        int b = p->buf_of[g->inits[i].target->id];
        if (b >= 0)
            fprintf(f, "init %d %s %a\n", b, ir_init_name(g->inits[i].kind), g->inits[i].value);
    }
    for (int i = 0; i < p->nbufs; i++)
        if (p->range_hi[i]) {
            fprintf(f, "range ");
            put_name(f, p->bufs[i].name);
            fprintf(f, " %lld %lld\n", p->range_index[i] ? 0LL : (long long)INT64_MIN, (long long)p->range_hi[i]);
        }
    for (int i = 0; i < g->nrownorms; i++) { /* inputs whose rows a bound relies on (a KV cache) */
        int b = p->buf_of[g->rownorms[i].input->id];
        if (b >= 0)
            fprintf(f, "norm %d %a\n", b, g->rownorms[i].norm);
    }
    for (int k = 0; k < p->nkernels; k++)
        fprintf(f, "kernel %d %s %s %d\n", k, p->kernels[k].fn, ir_ops[p->kernels[k].node->op].name,
                p->kernels[k].uses);
    for (int s = 0; s < p->nsteps; s++) {
        const CgStep *st = &p->steps[s];
        char label[32];
        const char *lb = st->node->label && valid_name(st->node->label) ? st->node->label : NULL;
        if (!lb) {
            snprintf(label, sizeof label, "t%d", st->node->id);
            lb = label;
        }
        fprintf(f, "step %d %d %d", s, st->kernel, st->out);
        for (int k = 0; k < IR_MAXIN; k++)
            fprintf(f, " %d", st->in[k]);
        fprintf(f, " %s ", ir_ops[st->node->op].name);
        put_name(f, lb);
        fputc('\n', f);
    }
    fprintf(f, "end\n");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- the iteration space of elementwise ops (cg_plan.h) ---- */

int cg_operand_bcast(const IrNode *out, const IrNode *x, int d)
{
    int k = d - (out->rank - x->rank);
    return k < 0 || ir_dim_is_one(x->shape[k]);
}

void cg_space_of(const IrNode *n, CgSpace *sp)
{
    memset(sp, 0, sizeof *sp);
    for (int d = 0; d < n->rank; d++) {
        if (ir_dim_is_one(n->shape[d]))
            continue; /* contributes nothing; a group may extend over it */
        int g = sp->ngroups - 1;
        int same = g >= 0;
        for (int k = 0; same && k < n->nin; k++)
            same = sp->bcast[k][g] == cg_operand_bcast(n, n->in[k], d);
        if (same) {
            sp->to[g] = d + 1;
            continue;
        }
        g = sp->ngroups++;
        sp->from[g] = d;
        sp->to[g] = d + 1;
        for (int k = 0; k < n->nin; k++)
            sp->bcast[k][g] = cg_operand_bcast(n, n->in[k], d);
    }
}
