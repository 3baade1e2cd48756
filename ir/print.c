/* print.c: writes a graph in the IR text form, the one that ir/parse.c reads back.
 *
 *   graph gpt(b, n <= 1024) {
 *     %tokens = input "tokens" : i64[b, n]
 *     %emb = gather %wte, %tokens : f32[b, n, 512]
 *     %7 = const 0.125 : f32[]
 *     %pos = slice %wpe [axis=0, start=0] : f32[n, 512]
 *     output logits = %logits
 *   }
 *
 * The header lists the symbols: `n <= 1024` is a bound, `q = min(n+p, 512)` (or `q = n+p`) a
 * derived symbol (ir.h). One node per line, in topological (id) order: the value name, the op,
 * its operands and always its type. A value is named %label, or %id when the node has no
 * printable label (labels never start with a digit, see ir_label, so the two cannot collide).
 *
 * Attributes are walked generically from the op's signature in ops.def, never by a switch
 * on the op: string (s:) and float (f:) attributes print bare right after the op name
 * (`input "tokens"`, `const 0.5`), the others (i:, d:, p:) as [name=value, ...] after the
 * operands, in signature order. Floats print as the shortest of %.15g, %.16g, %.17g that
 * reads back to the same double, so print -> parse -> print is exact.
 */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} Buf;

static void put(Buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if (b->p && (size_t)k < b->cap - b->len) {
        b->len += (size_t)k;
        return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len <= (size_t)k)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)k;
}

/* [A-Za-z_][A-Za-z0-9_.]*: printed bare; anything else is quoted */
static int is_ident(const char *s)
{
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.'))
            return 0;
    return 1;
}

/* "..." with \" \\ \n \t \r and \xHH for other control bytes; bytes >= 0x80 (UTF-8) stay */
static void put_quoted(Buf *b, const char *s)
{
    put(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            put(b, "\\%c", *c);
        else if (*c == '\n')
            put(b, "\\n");
        else if (*c == '\t')
            put(b, "\\t");
        else if (*c == '\r')
            put(b, "\\r");
        else if (*c < 0x20 || *c == 0x7f)
            put(b, "\\x%02x", *c);
        else
            put(b, "%c", *c);
    }
    put(b, "\"");
}

static void put_name(Buf *b, const char *s)
{
    if (is_ident(s))
        put(b, "%s", s);
    else
        put_quoted(b, s ? s : "");
}

static void put_value(Buf *b, const IrNode *n)
{
    if (is_ident(n->label))
        put(b, "%%%s", n->label);
    else
        put(b, "%%%d", n->id);
}

static void put_dim(Buf *b, const IrGraph *g, IrDim d)
{
    char s[512];
    put(b, "%s", ir_dim_str(g, d, s, sizeof s));
}

static void put_double(Buf *b, double v)
{
    char s[64];
    if (isnan(v))
        snprintf(s, sizeof s, "nan");
    else if (isinf(v))
        snprintf(s, sizeof s, v < 0 ? "-inf" : "inf");
    else
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(s, sizeof s, "%.*g", prec, v);
            if (strtod(s, NULL) == v)
                break;
        }
    put(b, "%s", s);
}

/* the attribute-signature walk of ir.h, shared with the parser */
int ir_sig_next(IrSigIter *it)
{
    while (*it->p == ' ')
        it->p++;
    if (!*it->p)
        return 0;
    if (it->kind == 'i')
        it->ik++;
    it->kind = it->p[0];
    it->p += it->p[1] == ':' ? 2 : 1;
    size_t k = 0;
    while (*it->p && *it->p != ' ') {
        if (k + 1 < sizeof it->name)
            it->name[k++] = *it->p;
        it->p++;
    }
    it->name[k] = 0;
    return 1;
}

static void put_node(Buf *b, const IrGraph *g, const IrNode *n)
{
    const IrOpInfo *info = &ir_ops[n->op];
    put(b, "  ");
    put_value(b, n);
    put(b, " = %s", info->name);

    /* bare attributes: strings and floats */
    IrSigIter it = {info->attrs, 0, "", 0};
    while (ir_sig_next(&it)) {
        if (it.kind == 's') {
            put(b, " ");
            put_quoted(b, n->s ? n->s : "");
        } else if (it.kind == 'f') {
            put(b, " ");
            put_double(b, n->f);
        }
    }

    for (int i = 0; i < n->nin; i++) {
        put(b, i ? ", " : " ");
        put_value(b, n->in[i]);
    }

    /* keyed attributes */
    int nkeyed = 0;
    it = (IrSigIter){info->attrs, 0, "", 0};
    while (ir_sig_next(&it)) {
        if (it.kind == 's' || it.kind == 'f')
            continue;
        put(b, nkeyed++ ? ", %s=" : " [%s=", it.name);
        if (it.kind == 'i')
            put(b, "%lld", (long long)(it.ik < IR_MAXIA ? n->ia[it.ik] : 0));
        else if (it.kind == 'd')
            put_dim(b, g, n->d);
        else if (it.kind == 'p') {
            put(b, "(");
            for (int i = 0; i < n->rank; i++)
                put(b, i ? ", %d" : "%d", n->perm[i]);
            put(b, ")");
        }
    }
    if (nkeyed)
        put(b, "]");

    put(b, " : %s[", ir_dtype_name(n->dtype));
    for (int i = 0; i < n->rank; i++) {
        if (i)
            put(b, ", ");
        put_dim(b, g, n->shape[i]);
    }
    put(b, "]\n");
}

static void print_graph(Buf *b, const IrGraph *g)
{
    put(b, "graph ");
    put_name(b, g->name ? g->name : "graph");
    put(b, "(");
    for (int s = 0; s < g->nsyms; s++) {
        put(b, "%s%s", s ? ", " : "", g->sym_name[s]);
        if (g->sym_derived[s] && g->sym_max[s]) {
            put(b, " = min(");
            put_dim(b, g, g->sym_def[s]);
            put(b, ", %lld)", (long long)g->sym_max[s]);
        } else if (g->sym_derived[s]) {
            put(b, " = ");
            put_dim(b, g, g->sym_def[s]);
        } else if (g->sym_max[s]) {
            put(b, " <= %lld", (long long)g->sym_max[s]);
        }
    }
    for (int i = 0; i < g->nlimits; i++) {
        put(b, ", ");
        put_dim(b, g, g->limit_def[i]);
        put(b, " <= %lld", (long long)g->limit_max[i]);
    }
    put(b, ") {\n");
    for (int i = 0; i < g->nnodes; i++)
        put_node(b, g, g->nodes[i]);
    for (int i = 0; i < g->naliases; i++) {
        put(b, "  alias ");
        put_name(b, g->aliases[i].name);
        put(b, " = ");
        put_value(b, g->aliases[i].target);
        put(b, "\n");
    }
    for (int i = 0; i < g->ninits; i++) {
        put(b, "  init ");
        put_value(b, g->inits[i].target);
        put(b, " = ");
        if (g->inits[i].kind != IR_INIT_CONST) { /* a constant is the number alone */
            put(b, ir_init_name(g->inits[i].kind));
            put(b, " ");
        }
        put_double(b, g->inits[i].value);
        put(b, "\n");
    }
    for (int i = 0; i < g->nrownorms; i++) { /* a claim on an input's rows (IrRowNorm) */
        put(b, "  rownorm ");
        put_value(b, g->rownorms[i].input);
        put(b, " = ");
        put_double(b, g->rownorms[i].norm);
        put(b, "\n");
    }
    for (int i = 0; i < g->noutputs; i++) {
        put(b, "  output ");
        put_name(b, g->outputs[i].name);
        put(b, " = ");
        put_value(b, g->outputs[i].node);
        put(b, "\n");
    }
    put(b, "}\n");
}

char *ir_print_str(const IrGraph *g)
{
    Buf b = {0};
    print_graph(&b, g);
    if (b.oom || !b.p) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

void ir_print(const IrGraph *g, FILE *out)
{
    char *s = ir_print_str(g);
    if (s)
        fputs(s, out);
    else
        fputs("# (out of memory while printing the graph)\n", out);
    free(s);
}
