/* graph.c: graph construction for the tensor IR: the arena, symbolic dims, the one node
 * constructor with deduplication (hash-consing), labels, outputs and the builder helpers. */
#include "ir.h"

#include <assert.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const IrOpInfo ir_ops[IR_NUM_OPS] = {
#define X(e, name, arity, flags, attrs, infer) [IR_##e] = {name, arity, flags, attrs},
#include "ops.def"
#undef X
};

IrOp ir_op_lookup(const char *name)
{
    for (int i = 0; i < IR_NUM_OPS; i++)
        if (strcmp(ir_ops[i].name, name) == 0)
            return (IrOp)i;
    return IR_NUM_OPS;
}

static const char *dtype_names[IR_NUM_DTYPES] = {"f32", "i32", "i64", "bool", "i8"};
static const size_t dtype_sizes[IR_NUM_DTYPES] = {4, 4, 8, 1, 1};

const char *ir_dtype_name(IrDType t) { return t < IR_NUM_DTYPES ? dtype_names[t] : "?"; }
size_t ir_dtype_size(IrDType t) { return t < IR_NUM_DTYPES ? dtype_sizes[t] : 0; }

int ir_dtype_lookup(const char *name)
{
    for (int i = 0; i < IR_NUM_DTYPES; i++)
        if (strcmp(dtype_names[i], name) == 0)
            return i;
    return -1;
}

/* ---- dims ---- */

IrDim ir_dim(int64_t c)
{
    IrDim d;
    memset(&d, 0, sizeof d);
    d.c = c;
    return d;
}

IrDim ir_dim_sym(int s)
{
    IrDim d = ir_dim(0);
    assert(s >= 0 && s < IR_MAXSYM);
    d.k[s] = 1;
    return d;
}

IrDim ir_dim_add(IrDim a, IrDim b)
{
    a.c += b.c;
    for (int s = 0; s < IR_MAXSYM; s++)
        a.k[s] = (int8_t)(a.k[s] + b.k[s]);
    return a;
}

IrDim ir_dim_sub(IrDim a, IrDim b)
{
    a.c -= b.c;
    for (int s = 0; s < IR_MAXSYM; s++)
        a.k[s] = (int8_t)(a.k[s] - b.k[s]);
    return a;
}

IrDim ir_dim_addc(IrDim a, int64_t c)
{
    a.c += c;
    return a;
}

int ir_dim_eq(IrDim a, IrDim b) { return a.c == b.c && memcmp(a.k, b.k, sizeof a.k) == 0; }

int ir_dim_is_const(IrDim a)
{
    for (int s = 0; s < IR_MAXSYM; s++)
        if (a.k[s])
            return 0;
    return 1;
}

int ir_dim_is_one(IrDim a) { return ir_dim_is_const(a) && a.c == 1; }

int64_t ir_dim_eval(IrDim a, const int64_t *symvals)
{
    int64_t v = a.c;
    for (int s = 0; s < IR_MAXSYM; s++)
        if (a.k[s])
            v += a.k[s] * symvals[s];
    return v;
}

char *ir_dim_str(const IrGraph *g, IrDim a, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int s = 0; s < IR_MAXSYM; s++) {
        int k = a.k[s];
        if (!k)
            continue;
        const char *nm = g && s < g->nsyms ? g->sym_name[s] : "?";
        const char *sign = k < 0 ? "-" : (len ? "+" : "");
        int ak = k < 0 ? -k : k;
        if (ak == 1)
            len += snprintf(buf + len, len < n ? n - len : 0, "%s%s", sign, nm);
        else
            len += snprintf(buf + len, len < n ? n - len : 0, "%s%d*%s", sign, ak, nm);
    }
    if (len == 0)
        snprintf(buf, n, "%lld", (long long)a.c);
    else if (a.c > 0)
        snprintf(buf + len, len < n ? n - len : 0, "+%lld", (long long)a.c);
    else if (a.c < 0)
        snprintf(buf + len, len < n ? n - len : 0, "%lld", (long long)a.c);
    return buf;
}

/* ---- arena ---- */

struct IrArena {
    struct IrArena *next;
    size_t used, cap;
    char data[];
};

void *ir_alloc(IrGraph *g, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    IrArena *a = g->arena;
    if (!a || a->used + n > a->cap) {
        size_t cap = n > 65536 ? n : 65536;
        IrArena *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = a;
        b->used = 0;
        b->cap = cap;
        g->arena = a = b;
    }
    void *p = a->data + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *ir_strdup(IrGraph *g, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ir_alloc(g, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* ---- hash-consing ---- */

typedef struct IrHash {
    IrNode **slot;
    size_t cap, used;
} IrHash;

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static uint64_t node_hash(const IrNode *n)
{
    uint64_t h = mix(n->op, n->dtype);
    h = mix(h, (uint64_t)n->rank);
    for (int i = 0; i < n->rank; i++) {
        h = mix(h, (uint64_t)n->shape[i].c);
        for (int s = 0; s < IR_MAXSYM; s++)
            h = mix(h, (uint64_t)(uint8_t)n->shape[i].k[s]);
    }
    for (int i = 0; i < n->nin; i++)
        h = mix(h, (uint64_t)n->in[i]->id);
    for (int i = 0; i < IR_MAXIA; i++)
        h = mix(h, (uint64_t)n->ia[i]);
    uint64_t fb;
    memcpy(&fb, &n->f, sizeof fb);
    h = mix(h, fb);
    h = mix(h, (uint64_t)n->d.c);
    for (int s = 0; s < IR_MAXSYM; s++)
        h = mix(h, (uint64_t)(uint8_t)n->d.k[s]);
    for (int i = 0; i < IR_MAXRANK; i++)
        h = mix(h, (uint64_t)(uint8_t)n->perm[i]);
    return mix(h, str_hash(n->s));
}

static int node_same(const IrNode *a, const IrNode *b)
{
    if (a->op != b->op || a->dtype != b->dtype || a->rank != b->rank || a->nin != b->nin)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (!ir_dim_eq(a->shape[i], b->shape[i]))
            return 0;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i])
            return 0;
    if (memcmp(a->ia, b->ia, sizeof a->ia) || memcmp(&a->f, &b->f, sizeof a->f) ||
        !ir_dim_eq(a->d, b->d) || memcmp(a->perm, b->perm, sizeof a->perm))
        return 0;
    if ((a->s == NULL) != (b->s == NULL) || (a->s && strcmp(a->s, b->s)))
        return 0;
    return 1;
}

static int hash_grow(IrHash *h)
{
    size_t cap = h->cap ? h->cap * 2 : 1024;
    IrNode **slot = calloc(cap, sizeof *slot);
    if (!slot)
        return -1;
    for (size_t i = 0; i < h->cap; i++) {
        IrNode *n = h->slot[i];
        if (!n)
            continue;
        size_t j = node_hash(n) & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = n;
    }
    free(h->slot);
    h->slot = slot;
    h->cap = cap;
    return 0;
}

/* ---- graph ---- */

IrGraph *ir_graph_new(const char *name)
{
    IrGraph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->hash = calloc(1, sizeof *g->hash);
    if (!g->hash) {
        free(g);
        return NULL;
    }
    g->name = ir_strdup(g, name ? name : "graph");
    return g;
}

void ir_graph_free(IrGraph *g)
{
    if (!g)
        return;
    for (IrArena *a = g->arena, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    if (g->hash)
        free(g->hash->slot);
    free(g->hash);
    free(g->nodes);
    free(g->outputs);
    free(g->aliases);
    free(g->inits);
    free(g->rownorms);
    free(g);
}

const char *ir_graph_error(const IrGraph *g) { return g->error[0] ? g->error : NULL; }

void ir_graph_set_error(IrGraph *g, const char *fmt, ...)
{
    if (g->error[0])
        return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
}

int ir_graph_find_sym(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->nsyms; i++)
        if (strcmp(g->sym_name[i], name) == 0)
            return i;
    return -1;
}

int ir_graph_add_sym(IrGraph *g, const char *name, int64_t max)
{
    int s = ir_graph_find_sym(g, name);
    if (s >= 0) {
        if (max)
            g->sym_max[s] = max;
        return s;
    }
    if (g->nsyms >= IR_MAXSYM) {
        ir_graph_set_error(g, "too many symbolic dimensions (at most %d)", IR_MAXSYM);
        return -1;
    }
    g->sym_name[g->nsyms] = ir_strdup(g, name);
    g->sym_max[g->nsyms] = max;
    return g->nsyms++;
}

int ir_graph_add_derived_sym(IrGraph *g, const char *name, IrDim def, int64_t cap)
{
    if (ir_graph_find_sym(g, name) >= 0) {
        ir_graph_set_error(g, "symbol '%s' declared twice", name);
        return -1;
    }
    if (cap < 0) {
        ir_graph_set_error(g, "derived symbol '%s': negative cap %lld", name, (long long)cap);
        return -1;
    }
    for (int s = g->nsyms; s < IR_MAXSYM; s++)
        if (def.k[s]) {
            ir_graph_set_error(g, "derived symbol '%s' may only use the symbols declared before it", name);
            return -1;
        }
    int s = ir_graph_add_sym(g, name, cap);
    if (s < 0)
        return -1;
    g->sym_derived[s] = 1;
    g->sym_def[s] = def;
    return s;
}

void ir_graph_derive_syms(const IrGraph *g, int64_t *vals)
{
    for (int s = 0; s < g->nsyms; s++)
        if (g->sym_derived[s]) {
            int64_t v = ir_dim_eval(g->sym_def[s], vals);
            vals[s] = g->sym_max[s] > 0 && v > g->sym_max[s] ? g->sym_max[s] : v;
        }
}

int ir_graph_add_limit(IrGraph *g, IrDim def, int64_t max)
{
    if (g->nlimits >= IR_MAXLIMIT) {
        ir_graph_set_error(g, "too many limits on symbols (at most %d)", IR_MAXLIMIT);
        return -1;
    }
    if (max < 1) {
        ir_graph_set_error(g, "a limit on symbols must be positive, not %lld", (long long)max);
        return -1;
    }
    for (int s = g->nsyms; s < IR_MAXSYM; s++)
        if (def.k[s]) {
            ir_graph_set_error(g, "a limit may only use declared symbols");
            return -1;
        }
    g->limit_def[g->nlimits] = def;
    g->limit_max[g->nlimits++] = max;
    return 0;
}

void ir_graph_copy_syms(IrGraph *dst, const IrGraph *src)
{
    for (int s = 0; s < src->nsyms; s++) {
        if (src->sym_derived[s])
            ir_graph_add_derived_sym(dst, src->sym_name[s], src->sym_def[s], src->sym_max[s]);
        else
            ir_graph_add_sym(dst, src->sym_name[s], src->sym_max[s]);
    }
    for (int i = 0; i < src->nlimits; i++)
        ir_graph_add_limit(dst, src->limit_def[i], src->limit_max[i]);
}

static int label_taken(const IrGraph *g, const char *label)
{
    /* Linear scan is fine at model sizes (a few thousand nodes) but labels are set once per
     * node, so use the hash of labels lazily kept in a side table if this ever shows up. */
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->label && strcmp(g->nodes[i]->label, label) == 0)
            return 1;
    return 0;
}

IrNode *ir_label(IrGraph *g, IrNode *n, const char *fmt, ...)
{
    if (!n)
        return NULL;
    char base[256], buf[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base + 1, sizeof base - 1, fmt, ap);
    va_end(ap);
    /* keep labels printable as %label (ir/print.c): [A-Za-z_][A-Za-z0-9_.]*, so that an
     * all-digit name stays free to mean a node id */
    base[0] = 'v';
    int digit_first = base[1] >= '0' && base[1] <= '9';
    for (char *c = base + 1; *c; c++)
        if (!(*c == '_' || *c == '.' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '_';
    if (!digit_first && base[1])
        memmove(base, base + 1, strlen(base + 1) + 1);
    if (n->label && strcmp(n->label, base) == 0)
        return n;
    if (n->label && n->op != IR_CONST)
        return n; /* a shared node keeps its first name */
    snprintf(buf, sizeof buf, "%s", base);
    for (int k = 1; label_taken(g, buf); k++)
        snprintf(buf, sizeof buf, "%s.%d", base, k);
    n->label = ir_strdup(g, buf);
    return n;
}

int ir_output(IrGraph *g, const char *name, IrNode *n)
{
    if (!n)
        return -1;
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->outputs[i].name, name) == 0) {
            ir_graph_set_error(g, "output '%s' defined twice", name);
            return -1;
        }
    if (g->noutputs == g->outcap) {
        int cap = g->outcap ? g->outcap * 2 : 8;
        IrOutput *o = realloc(g->outputs, cap * sizeof *o);
        if (!o)
            return -1;
        g->outputs = o;
        g->outcap = cap;
    }
    g->outputs[g->noutputs].name = ir_strdup(g, name);
    g->outputs[g->noutputs].node = n;
    g->noutputs++;
    return 0;
}

int ir_alias(IrGraph *g, const char *name, IrNode *target)
{
    if (!target)
        return -1;
    if (target->op != IR_PARAM && target->op != IR_BUFFER) {
        ir_graph_set_error(g, "alias '%s' must name a param or buffer", name);
        return -1;
    }
    if (ir_find_alias(g, name) || ir_find_leaf(g, IR_PARAM, name) || ir_find_leaf(g, IR_BUFFER, name)) {
        ir_graph_set_error(g, "alias '%s' is already a name of the graph", name);
        return -1;
    }
    if (g->naliases == g->aliascap) {
        int cap = g->aliascap ? g->aliascap * 2 : 4;
        IrAlias *a = realloc(g->aliases, cap * sizeof *a);
        if (!a) {
            ir_graph_set_error(g, "out of memory");
            return -1;
        }
        g->aliases = a;
        g->aliascap = cap;
    }
    g->aliases[g->naliases].name = ir_strdup(g, name);
    g->aliases[g->naliases].target = target;
    g->naliases++;
    return 0;
}

static const char *const init_names[IR_NUM_INITS] = {"const", "normal", "uniform", "alibi", "inv_freq", "xpos_scale"};

const char *ir_init_name(IrInitKind k) { return (unsigned)k < IR_NUM_INITS ? init_names[k] : "?"; }

int ir_init_lookup(const char *name)
{
    for (int k = 0; k < IR_NUM_INITS; k++)
        if (strcmp(init_names[k], name) == 0)
            return k;
    return -1;
}

const IrInit *ir_find_init(const IrGraph *g, const IrNode *p)
{
    for (int i = 0; i < g->ninits; i++)
        if (g->inits[i].target == p)
            return &g->inits[i];
    return NULL;
}

int ir_init(IrGraph *g, IrNode *p, IrInitKind kind, double value)
{
    if (!p)
        return -1;
    if (p->op != IR_PARAM && p->op != IR_BUFFER) {
        ir_graph_set_error(g, "init: %%%s is not a param or buffer", p->label ? p->label : "?");
        return -1;
    }
    if ((unsigned)kind >= IR_NUM_INITS || !isfinite(value)) {
        ir_graph_set_error(g, "init: bad rule for '%s'", p->s);
        return -1;
    }
    IrInit *r = (IrInit *)ir_find_init(g, p);
    if (!r) {
        if (g->ninits == g->initcap) {
            int cap = g->initcap ? g->initcap * 2 : 4;
            IrInit *a = realloc(g->inits, cap * sizeof *a);
            if (!a) {
                ir_graph_set_error(g, "out of memory");
                return -1;
            }
            g->inits = a;
            g->initcap = cap;
        }
        r = &g->inits[g->ninits++];
    }
    r->target = p;
    r->kind = kind;
    r->value = value;
    return 0;
}

double ir_find_row_norm(const IrGraph *g, const IrNode *x)
{
    for (int i = 0; i < g->nrownorms; i++)
        if (g->rownorms[i].input == x)
            return g->rownorms[i].norm;
    return 0;
}

int ir_row_norm(IrGraph *g, IrNode *x, double norm)
{
    if (!x)
        return -1;
    if (x->op != IR_INPUT || x->dtype != IR_F32 || x->rank < 1 || !(norm > 0) || !isfinite(norm)) {
        ir_graph_set_error(g, "row norm: %%%s is not an f32 input or %g is not a norm", x->label ? x->label : "?", norm);
        return -1;
    }
    for (int i = 0; i < g->nrownorms; i++)
        if (g->rownorms[i].input == x) {
            g->rownorms[i].norm = fmin(g->rownorms[i].norm, norm);
            return 0;
        }
    if (g->nrownorms == g->rownormcap) {
        int cap = g->rownormcap ? g->rownormcap * 2 : 4;
        IrRowNorm *a = realloc(g->rownorms, cap * sizeof *a);
        if (!a) {
            ir_graph_set_error(g, "out of memory");
            return -1;
        }
        g->rownorms = a;
        g->rownormcap = cap;
    }
    g->rownorms[g->nrownorms].input = x;
    g->rownorms[g->nrownorms++].norm = norm;
    return 0;
}

const IrAlias *ir_find_alias(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->naliases; i++)
        if (strcmp(g->aliases[i].name, name) == 0)
            return &g->aliases[i];
    return NULL;
}

IrNode *ir_find_leaf(const IrGraph *g, IrOp op, const char *name)
{
    for (int i = 0; i < g->nnodes; i++) {
        IrNode *n = g->nodes[i];
        if (n->op == op && n->s && strcmp(n->s, name) == 0)
            return n;
    }
    return NULL;
}

IrNode *ir_node(IrGraph *g, const IrNode *proto)
{
    if (g->error[0])
        return NULL;
    assert(proto->op < IR_NUM_OPS);
    const IrOpInfo *info = &ir_ops[proto->op];
    if (!ir_arity_ok(info->arity, proto->nin)) {
        ir_graph_set_error(g, "%s takes %d operands, got %d", info->name, info->arity < 0 ? IR_MAXIN : info->arity,
                           proto->nin);
        return NULL;
    }
    for (int i = 0; i < proto->nin; i++)
        if (!proto->in[i])
            return NULL; /* an earlier error */
    IrNode tmp = *proto;
    tmp.id = -1;
    tmp.label = NULL;
    char msg[256];
    const char *err = ir_infer(&tmp, msg, sizeof msg);
    if (err) {
        char a[64] = "", b[64] = "";
        if (tmp.nin > 0 && tmp.in[0]->label)
            snprintf(a, sizeof a, " %%%s", tmp.in[0]->label);
        if (tmp.nin > 1 && tmp.in[1]->label)
            snprintf(b, sizeof b, ", %%%s", tmp.in[1]->label);
        ir_graph_set_error(g, "%s%s%s: %s", info->name, a, b, err);
        return NULL;
    }
    /* leaves are identified by name: a second definition with another shape is an error */
    if ((info->flags & IR_LEAF) && tmp.s) {
        IrNode *old = ir_find_leaf(g, tmp.op, tmp.s);
        if (old && !node_same(old, &tmp)) {
            ir_graph_set_error(g, "%s \"%s\" declared twice with different types", info->name, tmp.s);
            return NULL;
        }
    }
    IrHash *h = g->hash;
    if (h->used * 2 >= h->cap && hash_grow(h) < 0) {
        ir_graph_set_error(g, "out of memory");
        return NULL;
    }
    size_t j = node_hash(&tmp) & (h->cap - 1);
    for (; h->slot[j]; j = (j + 1) & (h->cap - 1))
        if (node_same(h->slot[j], &tmp))
            return h->slot[j];
    IrNode *n = ir_alloc(g, sizeof *n);
    if (!n || (g->nnodes == g->cap && 0)) {
        ir_graph_set_error(g, "out of memory");
        return NULL;
    }
    *n = tmp;
    if (tmp.s)
        n->s = ir_strdup(g, tmp.s);
    if (g->nnodes == g->cap) {
        int cap = g->cap ? g->cap * 2 : 256;
        IrNode **nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes) {
            ir_graph_set_error(g, "out of memory");
            return NULL;
        }
        g->nodes = nodes;
        g->cap = cap;
    }
    n->id = g->nnodes;
    g->nodes[g->nnodes++] = n;
    h->slot[j] = n;
    h->used++;
    if (proto->label)
        ir_label(g, n, "%s", proto->label);
    return n;
}

/* ---- builder helpers ---- */

static IrNode proto_of(IrOp op)
{
    IrNode p;
    memset(&p, 0, sizeof p);
    p.op = op;
    p.nin = ir_ops[op].arity < 0 ? 0 : ir_ops[op].arity;
    return p;
}

static IrNode *leaf(IrGraph *g, IrOp op, const char *name, IrDType t, int rank, const IrDim *shape)
{
    IrNode p = proto_of(op);
    p.s = name;
    p.dtype = t;
    p.rank = rank;
    for (int i = 0; i < rank && i < IR_MAXRANK; i++)
        p.shape[i] = shape[i];
    IrNode *n = ir_node(g, &p);
    if (n && !n->label) {
        /* inputs keep their name as label; params get it too (dots are fine in labels) */
        ir_label(g, n, "%s", name);
    }
    return n;
}

IrNode *ir_input(IrGraph *g, const char *name, IrDType t, int rank, const IrDim *shape)
{
    return leaf(g, IR_INPUT, name, t, rank, shape);
}

IrNode *ir_param(IrGraph *g, const char *name, int rank, const IrDim *shape)
{
    return leaf(g, IR_PARAM, name, IR_F32, rank, shape);
}

IrNode *ir_buffer(IrGraph *g, const char *name, int rank, const IrDim *shape)
{
    return leaf(g, IR_BUFFER, name, IR_F32, rank, shape);
}

IrNode *ir_buffer_i8(IrGraph *g, const char *name, int rank, const IrDim *shape)
{
    return leaf(g, IR_BUFFER, name, IR_I8, rank, shape);
}

IrNode *ir_const(IrGraph *g, double v, IrDType t)
{
    IrNode p = proto_of(IR_CONST);
    p.f = v;
    p.dtype = t;
    return ir_node(g, &p);
}

IrNode *ir_arange(IrGraph *g, IrDim start, IrDim len, IrDType t)
{
    IrNode p = proto_of(IR_ARANGE);
    p.d = start;
    p.dtype = t;
    p.rank = 1;
    p.shape[0] = len;
    return ir_node(g, &p);
}

IrNode *ir_relpos(IrGraph *g, IrDim nq, IrDim nk, int buckets, int max_distance, int causal)
{
    IrNode p = proto_of(IR_RELPOS);
    p.ia[IR_IA_BUCKETS] = buckets;
    p.ia[IR_IA_MAX_DISTANCE] = max_distance;
    p.ia[IR_IA_REL_CAUSAL] = causal;
    p.dtype = IR_I64;
    p.rank = 2;
    p.shape[0] = nq;
    p.shape[1] = nk;
    return ir_node(g, &p);
}

IrNode *ir_unary(IrGraph *g, IrOp op, IrNode *x)
{
    IrNode p = proto_of(op);
    p.in[0] = x;
    return ir_node(g, &p);
}

IrNode *ir_binary(IrGraph *g, IrOp op, IrNode *a, IrNode *b)
{
    IrNode p = proto_of(op);
    p.in[0] = a;
    p.in[1] = b;
    return ir_node(g, &p);
}

IrNode *ir_where(IrGraph *g, IrNode *cond, IrNode *a, IrNode *b)
{
    IrNode p = proto_of(IR_WHERE);
    p.in[0] = cond;
    p.in[1] = a;
    p.in[2] = b;
    return ir_node(g, &p);
}

IrNode *ir_cast(IrGraph *g, IrNode *x, IrDType t)
{
    if (!x)
        return NULL;
    if (x->dtype == t)
        return x;
    IrNode p = proto_of(IR_CAST);
    p.in[0] = x;
    p.dtype = t;
    return ir_node(g, &p);
}

IrNode *ir_reduce(IrGraph *g, IrOp op, IrNode *x, int axis)
{
    if (!x)
        return NULL;
    IrNode p = proto_of(op);
    p.in[0] = x;
    p.ia[IR_IA_AXIS] = axis < 0 ? axis + x->rank : axis;
    return ir_node(g, &p);
}

IrNode *ir_softmax(IrGraph *g, IrNode *x) { return ir_unary(g, IR_SOFTMAX, x); }

IrNode *ir_entmax15(IrGraph *g, IrNode *x) { return ir_unary(g, IR_ENTMAX15, x); }

IrNode *ir_kth_largest(IrGraph *g, IrNode *x, int64_t k)
{
    IrNode p = proto_of(IR_KTH_LARGEST);
    p.in[0] = x;
    p.ia[IR_IA_K] = k;
    return ir_node(g, &p);
}

IrNode *ir_reshape(IrGraph *g, IrNode *x, int rank, const IrDim *shape)
{
    if (!x)
        return NULL;
    IrNode p = proto_of(IR_RESHAPE);
    p.in[0] = x;
    p.dtype = x->dtype;
    p.rank = rank;
    for (int i = 0; i < rank && i < IR_MAXRANK; i++)
        p.shape[i] = shape[i];
    if (rank == x->rank) {
        int same = 1;
        for (int i = 0; i < rank; i++)
            same &= ir_dim_eq(shape[i], x->shape[i]);
        if (same)
            return x;
    }
    return ir_node(g, &p);
}

IrNode *ir_permute(IrGraph *g, IrNode *x, const int *perm)
{
    if (!x)
        return NULL;
    IrNode p = proto_of(IR_PERMUTE);
    p.in[0] = x;
    for (int i = 0; i < x->rank; i++)
        p.perm[i] = (int8_t)perm[i];
    return ir_node(g, &p);
}

IrNode *ir_slice(IrGraph *g, IrNode *x, int axis, IrDim start, IrDim len)
{
    if (!x)
        return NULL;
    if (axis < 0)
        axis += x->rank;
    if (axis >= 0 && axis < x->rank && ir_dim_is_const(start) && start.c == 0 &&
        ir_dim_eq(len, x->shape[axis]))
        return x;
    IrNode p = proto_of(IR_SLICE);
    p.in[0] = x;
    p.ia[IR_IA_AXIS] = axis;
    p.d = start;
    p.dtype = x->dtype;
    p.rank = x->rank;
    for (int i = 0; i < x->rank; i++)
        p.shape[i] = x->shape[i];
    if (axis >= 0 && axis < x->rank)
        p.shape[axis] = len;
    return ir_node(g, &p);
}

IrNode *ir_concat(IrGraph *g, IrNode *a, IrNode *b, int axis)
{
    if (!a || !b)
        return NULL;
    IrNode p = proto_of(IR_CONCAT);
    p.in[0] = a;
    p.in[1] = b;
    p.ia[IR_IA_AXIS] = axis < 0 ? axis + a->rank : axis;
    return ir_node(g, &p);
}

IrNode *ir_expand(IrGraph *g, IrNode *x, int rank, const IrDim *shape)
{
    if (!x)
        return NULL;
    IrNode p = proto_of(IR_EXPAND);
    p.in[0] = x;
    p.dtype = x->dtype;
    p.rank = rank;
    for (int i = 0; i < rank && i < IR_MAXRANK; i++)
        p.shape[i] = shape[i];
    return ir_node(g, &p);
}

IrNode *ir_matmul(IrGraph *g, IrNode *a, IrNode *b, int transpose_b)
{
    IrNode p = proto_of(IR_MATMUL);
    p.in[0] = a;
    p.in[1] = b;
    p.ia[IR_IA_TRANSPOSE_B] = transpose_b;
    return ir_node(g, &p);
}

IrNode *ir_matmul_q8(IrGraph *g, IrNode *a, IrNode *w, IrNode *scale, int64_t group)
{
    IrNode p = proto_of(IR_MATMUL_Q8);
    p.in[0] = a;
    p.in[1] = w;
    p.in[2] = scale;
    p.ia[IR_IA_TRANSPOSE_B] = 1;
    p.ia[IR_IA_GROUP] = group;
    return ir_node(g, &p);
}

IrNode *ir_gather(IrGraph *g, IrNode *table, IrNode *idx) { return ir_binary(g, IR_GATHER, table, idx); }

IrNode *ir_gather_grad(IrGraph *g, IrNode *src, IrNode *idx, IrDim rows)
{
    IrNode p = proto_of(IR_GATHER_GRAD);
    p.in[0] = src;
    p.in[1] = idx;
    p.d = rows;
    return ir_node(g, &p);
}

IrNode *ir_xent(IrGraph *g, IrNode *logits, IrNode *targets)
{
    return ir_binary(g, IR_XENT, logits, targets);
}

IrNode *ir_rand(IrGraph *g, IrNode *seed, IrNode *like, int stream)
{
    if (!seed || !like)
        return NULL;
    IrNode p = proto_of(IR_RAND);
    p.in[0] = seed;
    p.in[1] = like;
    p.ia[IR_IA_STREAM] = stream;
    return ir_node(g, &p);
}

IrNode *ir_attention(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *bias, IrNode *mask, IrNode *scale,
                     int causal, int stats)
{
    return ir_attention_window(g, q, k, v, bias, mask, scale, causal, stats, 0);
}

static IrNode *attention_node(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *bias, IrNode *mask, IrNode *scale,
                              int causal, int stats, int64_t window, int64_t bound)
{
    IrNode p = proto_of(IR_ATTENTION);
    p.in[0] = q;
    p.in[1] = k;
    p.in[2] = v;
    p.in[3] = bias ? bias : ir_const(g, 0, IR_F32);
    p.in[4] = mask ? mask : ir_const(g, 1, IR_BOOL);
    p.in[5] = scale;
    p.ia[IR_IA_CAUSAL] = causal;
    p.ia[IR_IA_STATS] = stats;
    p.ia[IR_IA_WINDOW] = window;
    p.ia[IR_IA_BOUND] = bound;
    return ir_node(g, &p);
}

IrNode *ir_attention_window(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *bias, IrNode *mask, IrNode *scale,
                            int causal, int stats, int64_t window)
{
    return attention_node(g, q, k, v, bias, mask, scale, causal, stats, window, 0);
}

IrNode *ir_attention_bounded(IrGraph *g, IrNode *q, IrNode *k, IrNode *v, IrNode *mask, IrNode *scale, int causal,
                             int stats, int64_t window, int64_t bound)
{
    return attention_node(g, q, k, v, NULL, mask, scale, causal, stats, window, bound);
}

IrNode *ir_fused(IrGraph *g, const char *program, int nin, IrNode *const *in, int rank, const IrDim *shape)
{
    if (nin < 1 || nin > IR_MAXIN || rank < 0 || rank > IR_MAXRANK) {
        ir_graph_set_error(g, "fused: %d operands, rank %d", nin, rank);
        return NULL;
    }
    IrNode p = proto_of(IR_FUSED);
    p.nin = nin;
    for (int k = 0; k < nin; k++)
        p.in[k] = in[k];
    p.s = program;
    p.rank = rank;
    for (int d = 0; d < rank; d++)
        p.shape[d] = shape[d];
    return ir_node(g, &p);
}

int64_t ir_attention_kv_group(const IrNode *n)
{
    const IrNode *q = n->in[0], *k = n->in[1];
    int r = q->rank;
    if (r < 3 || ir_dim_eq(q->shape[r - 3], k->shape[r - 3]) || !ir_dim_is_const(q->shape[r - 3]) ||
        !ir_dim_is_const(k->shape[r - 3]) || k->shape[r - 3].c < 1)
        return 1;
    return q->shape[r - 3].c / k->shape[r - 3].c;
}

IrNode *ir_attention_grad(IrGraph *g, IrNode *o, IrNode *dout)
{
    if (!o || !dout)
        return NULL;
    if (o->op != IR_ATTENTION) {
        ir_graph_set_error(g, "attention_grad needs an attention node");
        return NULL;
    }
    IrNode p = proto_of(IR_ATTENTION_GRAD);
    p.in[0] = o->in[0];
    p.in[1] = o->in[1];
    p.in[2] = o->in[2];
    p.in[3] = o;
    p.in[4] = dout;
    p.in[5] = o->in[3];
    p.in[6] = o->in[4];
    p.in[7] = o->in[5];
    p.ia[IR_IA_GRAD_CAUSAL] = o->ia[IR_IA_CAUSAL];
    p.ia[IR_IA_GRAD_WINDOW] = o->ia[IR_IA_WINDOW];
    return ir_node(g, &p);
}
