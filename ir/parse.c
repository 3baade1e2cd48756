/* parse.c: reads the IR text form that ir/print.c writes, for `xtc ir` round trips, pass
 * tests (IR text in, IR text out) and hand-written test graphs.
 *
 *   file    := blank* header stmt* '}' blank*
 *   header  := 'graph' NAME [ '(' [ sym { ',' sym } ] ')' ] '{'
 *   sym     := IDENT [ '<=' INT | '=' derived ] | limit
 *   limit   := dim '<=' INT                          (ir_graph_add_limit: declared symbols only)
 *   derived := dim | 'min' '(' dim ',' INT ')'    (ir_graph_add_derived_sym: earlier symbols only)
 *   stmt    := '%' VALUE '=' OP bare* [ operand { ',' operand } ] [ '[' attr { ',' attr } ']' ]
 *              ':' type
 *            | 'output' NAME '=' operand
 *            | 'rownorm' operand '=' FLOAT        (ir_row_norm: an f32 input's rows' L2 norm bound)
 *   bare    := STRING | FLOAT              (the s: and f: attributes, in signature order)
 *   attr    := IDENT '=' ( INT | dim | '(' [ INT { ',' INT } ] ')' )   (i:, d:, p:)
 *   type    := DTYPE '[' [ dim { ',' dim } ] ']'
 *   dim     := [ '+' | '-' ] term { ( '+' | '-' ) term }    term := INT [ '*' SYM ] | SYM [ '*' INT ]
 *
 * One statement per line; '#' starts a comment that runs to the end of the line. NAME is an
 * identifier ([A-Za-z_][A-Za-z0-9_.]*) or a quoted string. A VALUE is such an identifier (it
 * becomes the node's label) or all digits (an unlabeled node: it prints back as its id).
 *
 * Nodes are built through ir_node() only, so shapes are inferred and checked exactly as for
 * graphs built in C; the written type must equal the inferred one, and for the ops whose node
 * carries its own shape (leaves, reshape, expand, slice, cast) it supplies that shape. Two
 * identical lines give one node (hash-consing), the second name becoming an alias.
 *
 * Errors are "file:line:col: error: message", then the line and a caret. The parser is a
 * single forward pass over the text, without recursion, that stops at the first error.
 */
#include "ir.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum {
    NAME_MAX_LEN = IR_MAX_NAME, /* identifiers and value names */
    STR_MAX_LEN = 1024,   /* quoted strings, including the terminating NUL */
    LINE_SHOWN_MAX = 160, /* longer lines are not echoed under the message */
};

typedef struct {
    char *key;
    IrNode *node;
    int line;
} NameSlot;

typedef struct {
    const char *p;          /* cursor */
    const char *line_start; /* start of the current line */
    int line;
    const char *file;
    char *err;
    size_t nerr;
    int failed;
    IrGraph *g;
    NameSlot *names; /* value name -> node, open addressing */
    size_t ncap, nused;
} Parser;

/* ---- characters and errors ---- */

static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_name_char(int c) { return is_alpha(c) || is_digit(c) || c == '.'; }

static int perr(Parser *P, const char *at, const char *fmt, ...)
{
    if (P->failed)
        return -1;
    P->failed = 1;
    if (!P->err || P->nerr == 0)
        return -1;
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *ls = P->line_start, *le = ls;
    while (*le && *le != '\n')
        le++;
    if (at < ls)
        at = ls;
    if (at > le)
        at = le;
    int col = (int)(at - ls) + 1;
    int len = snprintf(P->err, P->nerr, "%s:%d:%d: error: %s", P->file, P->line, col, msg);
    if (len < 0 || (size_t)len >= P->nerr || le - ls > LINE_SHOWN_MAX)
        return -1;
    /* the line and a caret under the column; tabs are kept so the caret lines up */
    char shown[LINE_SHOWN_MAX + 1], caret[LINE_SHOWN_MAX + 1];
    int i;
    for (i = 0; ls + i < le; i++) {
        unsigned char c = (unsigned char)ls[i];
        shown[i] = c == '\t' ? '\t' : (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    shown[i] = 0;
    for (i = 0; i < col - 1; i++)
        caret[i] = ls[i] == '\t' ? '\t' : ' ';
    caret[i] = 0;
    snprintf(P->err + len, P->nerr - (size_t)len, "\n  %s\n  %s^", shown, caret);
    return -1;
}

/* what the cursor is looking at, for "expected X, found Y" */
static const char *describe(const char *p, char *buf, size_t n)
{
    unsigned char c = (unsigned char)*p;
    if (c == 0)
        snprintf(buf, n, "end of input");
    else if (c == '\n')
        snprintf(buf, n, "end of line");
    else if (is_name_char(c)) {
        int k = 0;
        while (k < 24 && is_name_char((unsigned char)p[k]))
            k++;
        snprintf(buf, n, "'%.*s%s'", k, p, is_name_char((unsigned char)p[k]) ? "..." : "");
    } else if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(Parser *P)
{
    for (;;) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\r')
            P->p++;
        else if (c == '#')
            while (*P->p && *P->p != '\n')
                P->p++;
        else
            return;
    }
}

static int peek(Parser *P)
{
    skip_ws(P);
    return (unsigned char)*P->p;
}

static int accept(Parser *P, char c)
{
    if (peek(P) != (unsigned char)c)
        return 0;
    P->p++;
    return 1;
}

static int expect(Parser *P, char c, const char *what)
{
    if (accept(P, c))
        return 0;
    char found[48];
    return perr(P, P->p, "expected %s, found %s", what, describe(P->p, found, sizeof found));
}

/* the end of a statement: only blanks or a comment may follow (the newline is not consumed) */
static int check_eol(Parser *P)
{
    int c = peek(P);
    if (c == '\n' || c == 0)
        return 0;
    char found[48];
    return perr(P, P->p, "expected end of line, found %s", describe(P->p, found, sizeof found));
}

static void newline(Parser *P)
{
    if (*P->p == '\n') {
        P->p++;
        P->line++;
        P->line_start = P->p;
    }
}

static void skip_blank_lines(Parser *P)
{
    while (peek(P) == '\n')
        newline(P);
}

/* ---- tokens ---- */

/* a run of [A-Za-z0-9_.] that starts with a letter or '_' */
static int read_ident(Parser *P, char *buf, size_t n, const char *what)
{
    char found[48];
    skip_ws(P);
    const char *at = P->p;
    if (!is_alpha((unsigned char)*P->p))
        return perr(P, at, "expected %s, found %s", what, describe(at, found, sizeof found));
    size_t k = 0;
    while (is_name_char((unsigned char)*P->p)) {
        if (k + 1 >= n || k >= NAME_MAX_LEN)
            return perr(P, at, "name too long (at most %d characters)", NAME_MAX_LEN);
        buf[k++] = *P->p++;
    }
    buf[k] = 0;
    return 0;
}

static int hex_value(int c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "..." with \" \\ \n \t \r \xHH; the cursor is on the opening quote */
static int read_string(Parser *P, char *buf, size_t n)
{
    const char *open = P->p++;
    size_t k = 0;
    for (;;) {
        const char *at = P->p;
        unsigned char c = (unsigned char)*P->p;
        if (c == 0 || c == '\n')
            return perr(P, open, "unterminated string");
        P->p++;
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *P->p;
            if (e == '"' || e == '\\')
                c = (unsigned char)e;
            else if (e == 'n')
                c = '\n';
            else if (e == 't')
                c = '\t';
            else if (e == 'r')
                c = '\r';
            else if (e == 'x') {
                int hi = hex_value((unsigned char)P->p[1]);
                int lo = hi < 0 ? -1 : hex_value((unsigned char)P->p[2]);
                if (lo < 0)
                    return perr(P, at, "\\x needs two hex digits");
                c = (unsigned char)(hi * 16 + lo);
                if (c == 0)
                    return perr(P, at, "\\x00 is not allowed in a string");
                P->p += 2;
            } else {
                char found[48];
                return perr(P, at, "unknown escape in string: backslash and %s",
                            describe(P->p, found, sizeof found));
            }
            P->p++;
        }
        if (k + 1 >= n)
            return perr(P, open, "string too long (at most %d bytes)", (int)n - 1);
        buf[k++] = (char)c;
    }
    buf[k] = 0;
    return 0;
}

/* an identifier or a quoted string */
static int read_name(Parser *P, char *buf, size_t n, const char *what)
{
    if (peek(P) == '"')
        return read_string(P, buf, n);
    return read_ident(P, buf, n, what);
}

/* a decimal integer with an optional '-', checked against int64 overflow */
static int read_int(Parser *P, int64_t *v, const char *what)
{
    char found[48];
    skip_ws(P);
    const char *at = P->p;
    int neg = *P->p == '-';
    if (neg)
        P->p++;
    if (!is_digit((unsigned char)*P->p))
        return perr(P, at, "expected %s, found %s", what, describe(at, found, sizeof found));
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, u = 0;
    while (is_digit((unsigned char)*P->p)) {
        unsigned d = (unsigned)(*P->p++ - '0');
        if (u > (limit - d) / 10)
            return perr(P, at, "integer out of range");
        u = u * 10 + d;
    }
    if (is_name_char((unsigned char)*P->p))
        return perr(P, at, "bad number: %s", describe(at, found, sizeof found));
    *v = neg ? (int64_t)(0 - u) : (int64_t)u;
    return 0;
}

/* a double: decimal or exponent notation, inf, -inf, nan */
static int read_float(Parser *P, double *v)
{
    char found[48], buf[64];
    skip_ws(P);
    const char *at = P->p;
    const char *s = P->p;
    if (*s == '-' || *s == '+')
        s++;
    if (is_alpha((unsigned char)*s)) {
        const char *w = s;
        while (is_name_char((unsigned char)*s))
            s++;
        if (s - w == 3 && strncmp(w, "inf", 3) == 0)
            *v = *at == '-' ? -INFINITY : INFINITY;
        else if (s - w == 3 && strncmp(w, "nan", 3) == 0)
            *v = NAN;
        else
            return perr(P, at, "expected a number, found %s", describe(at, found, sizeof found));
        P->p = s;
        return 0;
    }
    int digits = 0;
    while (is_digit((unsigned char)*s))
        s++, digits++;
    if (*s == '.')
        for (s++; is_digit((unsigned char)*s); s++)
            digits++;
    if (!digits)
        return perr(P, at, "expected a number, found %s", describe(at, found, sizeof found));
    if (*s == 'e' || *s == 'E') {
        const char *e = s + 1;
        if (*e == '-' || *e == '+')
            e++;
        if (is_digit((unsigned char)*e)) {
            while (is_digit((unsigned char)*e))
                e++;
            s = e;
        }
    }
    if (is_name_char((unsigned char)*s) || (size_t)(s - at) >= sizeof buf)
        return perr(P, at, "bad number: %s", describe(at, found, sizeof found));
    memcpy(buf, at, (size_t)(s - at));
    buf[s - at] = 0;
    errno = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end || (errno == ERANGE && isinf(d)))
        return perr(P, at, "number out of range: %s", buf);
    *v = d;
    P->p = s;
    return 0;
}

static int find_sym(Parser *P, const char *at, const char *name)
{
    int s = ir_graph_find_sym(P->g, name);
    if (s < 0)
        perr(P, at, "unknown symbol '%s' (symbols are declared in the graph header)", name);
    return s;
}

/* c + sum k*sym: "64", "n", "n+3", "m+n-8", "2*n", "-n+5" */
static int read_dim(Parser *P, IrDim *out)
{
    char found[48], name[NAME_MAX_LEN + 1];
    IrDim d = ir_dim(0);
    int k[IR_MAXSYM] = {0};
    skip_ws(P);
    const char *start = P->p;
    for (int first = 1;; first = 0) {
        int c = peek(P), sign = 1;
        if (c == '-' || c == '+') {
            sign = c == '-' ? -1 : 1;
            P->p++;
            c = peek(P);
        } else if (!first)
            break;
        const char *at = P->p;
        int64_t num = 1;
        int sym = -1;
        if (is_digit(c)) {
            if (read_int(P, &num, "a number") < 0)
                return -1;
            if (accept(P, '*')) {
                skip_ws(P);
                const char *sat = P->p;
                if (read_ident(P, name, sizeof name, "a symbol after '*'") < 0 ||
                    (sym = find_sym(P, sat, name)) < 0)
                    return -1;
            }
        } else if (is_alpha(c)) {
            if (read_ident(P, name, sizeof name, "a symbol") < 0 || (sym = find_sym(P, at, name)) < 0)
                return -1;
            if (accept(P, '*') && read_int(P, &num, "a coefficient after '*'") < 0)
                return -1;
        } else
            return perr(P, at, "expected a dimension (such as 64, n, n+3 or 2*n), found %s",
                        describe(at, found, sizeof found));
        if (sym < 0) {
            /* num >= 0 here, so -num cannot overflow */
            int64_t t = sign * num;
            if ((t > 0 && d.c > INT64_MAX - t) || (t < 0 && d.c < INT64_MIN - t))
                return perr(P, start, "dimension out of range");
            d.c += t;
        } else {
            if (num > 127 || num < -127 || (k[sym] += sign * (int)num) > 127 || k[sym] < -127)
                return perr(P, at, "coefficient of '%s' out of range (at most 127)",
                            P->g->sym_name[sym]);
        }
    }
    for (int s = 0; s < IR_MAXSYM; s++)
        d.k[s] = (int8_t)k[s];
    *out = d;
    return 0;
}

static int read_type(Parser *P, IrDType *dtype, int *rank, IrDim *shape)
{
    char name[NAME_MAX_LEN + 1];
    skip_ws(P);
    const char *at = P->p;
    if (read_ident(P, name, sizeof name, "a type such as f32[b, n]") < 0)
        return -1;
    int t = ir_dtype_lookup(name);
    if (t < 0)
        return perr(P, at, "unknown type '%s' (the types are f32, i32, i64 and bool)", name);
    *dtype = (IrDType)t;
    *rank = 0;
    if (expect(P, '[', "'[' and the shape after the type") < 0)
        return -1;
    if (accept(P, ']'))
        return 0;
    do {
        skip_ws(P);
        if (*rank == IR_MAXRANK)
            return perr(P, P->p, "more than %d dimensions", IR_MAXRANK);
        if (read_dim(P, &shape[(*rank)++]) < 0)
            return -1;
    } while (accept(P, ','));
    return expect(P, ']', "',' or ']' in the shape");
}

static void type_str(const IrGraph *g, IrDType t, int rank, const IrDim *shape, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "%s[", ir_dtype_name(t));
    for (int i = 0; i < rank && len < n; i++) {
        char d[128];
        ir_dim_str(g, shape[i], d, sizeof d);
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", d);
    }
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* ---- value names ---- */

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static NameSlot *name_find(Parser *P, const char *key)
{
    if (!P->ncap)
        return NULL;
    for (size_t j = name_hash(key) & (P->ncap - 1);; j = (j + 1) & (P->ncap - 1)) {
        if (!P->names[j].key)
            return NULL;
        if (strcmp(P->names[j].key, key) == 0)
            return &P->names[j];
    }
}

static int name_add(Parser *P, const char *key, IrNode *node, int line)
{
    if (2 * (P->nused + 1) > P->ncap) {
        size_t cap = P->ncap ? 2 * P->ncap : 256;
        NameSlot *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t i = 0; i < P->ncap; i++) {
            if (!P->names[i].key)
                continue;
            size_t j = name_hash(P->names[i].key) & (cap - 1);
            while (slots[j].key)
                j = (j + 1) & (cap - 1);
            slots[j] = P->names[i];
        }
        free(P->names);
        P->names = slots;
        P->ncap = cap;
    }
    size_t n = strlen(key) + 1;
    char *copy = malloc(n);
    if (!copy)
        return -1;
    memcpy(copy, key, n);
    size_t j = name_hash(key) & (P->ncap - 1);
    while (P->names[j].key)
        j = (j + 1) & (P->ncap - 1);
    P->names[j] = (NameSlot){copy, node, line};
    P->nused++;
    return 0;
}

static void names_free(Parser *P)
{
    for (size_t i = 0; i < P->ncap; i++)
        free(P->names[i].key);
    free(P->names);
}

static int all_digits(const char *s)
{
    for (; *s; s++)
        if (!is_digit((unsigned char)*s))
            return 0;
    return 1;
}

/* %name: an identifier-like label or a node number; *at is where the '%' stands */
static int read_value(Parser *P, char *buf, size_t n, const char **at)
{
    char found[48];
    skip_ws(P);
    *at = P->p;
    if (*P->p != '%')
        return perr(P, *at, "expected a value (%%name), found %s", describe(*at, found, sizeof found));
    P->p++;
    size_t k = 0;
    while (is_name_char((unsigned char)*P->p)) {
        if (k + 1 >= n || k >= NAME_MAX_LEN)
            return perr(P, *at, "value name too long (at most %d characters)", NAME_MAX_LEN);
        buf[k++] = *P->p++;
    }
    buf[k] = 0;
    if (k == 0)
        return perr(P, P->p, "expected a value name after '%%', found %s",
                    describe(P->p, found, sizeof found));
    if (is_digit((unsigned char)buf[0]) && !all_digits(buf))
        return perr(P, *at, "bad value name '%%%s' (a name is a letter or '_' followed by letters, "
                    "digits, '_' or '.', or a node number)", buf);
    return 0;
}

/* a defined value: returns its node or NULL with the error set */
static IrNode *use_value(Parser *P)
{
    char name[NAME_MAX_LEN + 1];
    const char *at;
    if (read_value(P, name, sizeof name, &at) < 0)
        return NULL;
    NameSlot *s = name_find(P, name);
    if (!s) {
        perr(P, at, "undefined value %%%s", name);
        return NULL;
    }
    return s->node;
}

/* ---- op signatures (ir_sig_next, print.c) ---- */

static int is_keyed(char kind) { return kind != 's' && kind != 'f'; }

/* Levenshtein distance of the first na bytes of a and b (ir.h); b under 64 bytes, else 1000 */
int ir_edit_distance(const char *a, size_t na, const char *b)
{
    size_t lb = strlen(b);
    if (lb >= 64)
        return 1000;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static int unknown_op(Parser *P, const char *at, const char *name)
{
    const char *best = NULL;
    int best_d = 3;
    size_t len = strlen(name);
    for (int i = 0; i < IR_NUM_OPS && len < 64; i++) {
        const char *op = ir_ops[i].name;
        int d = ir_edit_distance(name, strlen(name), op);
        if (len >= 3 && strncmp(op, name, len) == 0)
            d = d < 2 ? d : 2; /* a prefix: "relpos" for "relpos_bucket" */
        if (d < best_d) {
            best_d = d;
            best = op;
        }
    }
    if (best)
        return perr(P, at, "unknown op '%s'; did you mean '%s'?", name, best);
    return perr(P, at, "unknown op '%s'", name);
}

/* '(' INT, ... ')' into perm; the length must be the rank of the operand */
static int read_perm(Parser *P, IrNode *proto)
{
    skip_ws(P);
    const char *at = P->p;
    if (expect(P, '(', "'(' to start the permutation") < 0)
        return -1;
    int count = 0;
    if (!accept(P, ')')) {
        do {
            int64_t v;
            skip_ws(P);
            const char *vat = P->p;
            if (count == IR_MAXRANK)
                return perr(P, vat, "permutation longer than %d", IR_MAXRANK);
            if (read_int(P, &v, "an axis") < 0)
                return -1;
            if (v < 0 || v >= IR_MAXRANK)
                return perr(P, vat, "axis %lld out of range in the permutation", (long long)v);
            proto->perm[count++] = (int8_t)v;
        } while (accept(P, ','));
        if (expect(P, ')', "',' or ')' in the permutation") < 0)
            return -1;
    }
    if (proto->nin > 0 && count != proto->in[0]->rank)
        return perr(P, at, "permutation of %d axes for an operand of rank %d", count,
                    proto->in[0]->rank);
    return 0;
}

/* [name=value, ...]: every keyed attribute of the signature exactly once, in any order */
static int read_keyed_attrs(Parser *P, const IrOpInfo *info, IrNode *proto)
{
    int given[16] = {0}, nkeyed = 0;
    char list[160] = "";
    IrSigIter it = {info->attrs, 0, "", 0};
    while (ir_sig_next(&it))
        if (is_keyed(it.kind)) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%s", nkeyed++ ? ", " : "", it.name);
        }
    assert(nkeyed <= (int)(sizeof given / sizeof given[0]));
    skip_ws(P);
    const char *open = P->p;
    if (accept(P, '[') && !accept(P, ']')) {
        do {
            char name[NAME_MAX_LEN + 1];
            skip_ws(P);
            const char *at = P->p;
            if (read_ident(P, name, sizeof name, "an attribute name") < 0)
                return -1;
            int idx = 0, found = 0;
            it = (IrSigIter){info->attrs, 0, "", 0};
            while (!found && ir_sig_next(&it))
                if (is_keyed(it.kind) && !(found = strcmp(it.name, name) == 0))
                    idx++;
            if (!found)
                return perr(P, at, "%s has no attribute '%s' (%s%s)", info->name, name,
                            nkeyed ? "its attributes: " : "it has none", list);
            if (given[idx]++)
                return perr(P, at, "attribute '%s' given twice", name);
            if (expect(P, '=', "'=' after the attribute name") < 0)
                return -1;
            int rc = 0;
            if (it.kind == 'i') {
                int64_t v = 0;
                rc = read_int(P, &v, "an integer");
                if (it.ik < IR_MAXIA)
                    proto->ia[it.ik] = v;
            } else if (it.kind == 'd')
                rc = read_dim(P, &proto->d);
            else if (it.kind == 'p')
                rc = read_perm(P, proto);
            else
                rc = perr(P, at, "attribute kind '%c' of %s is not supported", it.kind, info->name);
            if (rc < 0)
                return -1;
        } while (accept(P, ','));
        if (expect(P, ']', "',' or ']' after the attribute") < 0)
            return -1;
    }
    it = (IrSigIter){info->attrs, 0, "", 0};
    for (int idx = 0; ir_sig_next(&it);)
        if (is_keyed(it.kind) && !given[idx++])
            return perr(P, open, "%s needs the attribute '%s' (its attributes: %s)", info->name,
                        it.name, list);
    return 0;
}

/* ---- statements ---- */

/* %name = op bare... operands [attrs] : type */
static int parse_node(Parser *P)
{
    char name[NAME_MAX_LEN + 1], opname[NAME_MAX_LEN + 1], sval[STR_MAX_LEN], found[48];
    const char *name_at;
    if (read_value(P, name, sizeof name, &name_at) < 0)
        return -1;
    NameSlot *prev = name_find(P, name);
    if (prev)
        return perr(P, name_at, "value %%%s defined twice (first on line %d)", name, prev->line);
    if (expect(P, '=', "'=' after the value name") < 0)
        return -1;
    skip_ws(P);
    const char *op_at = P->p;
    if (read_ident(P, opname, sizeof opname, "an op name") < 0)
        return -1;
    IrOp op = ir_op_lookup(opname);
    if (op == IR_NUM_OPS)
        return unknown_op(P, op_at, opname);
    const IrOpInfo *info = &ir_ops[op];
    IrNode proto;
    memset(&proto, 0, sizeof proto);
    proto.op = op;

    IrSigIter it = {info->attrs, 0, "", 0};
    while (ir_sig_next(&it)) {
        if (it.kind == 's') {
            if (peek(P) != '"')
                return perr(P, P->p, "%s takes its %s as a quoted string, found %s", info->name, it.name,
                            describe(P->p, found, sizeof found));
            if (read_string(P, sval, sizeof sval) < 0)
                return -1;
            proto.s = sval;
        } else if (it.kind == 'f' && read_float(P, &proto.f) < 0)
            return -1;
    }

    if (peek(P) == '%') {
        do {
            skip_ws(P);
            const char *at = P->p;
            IrNode *x = use_value(P);
            if (!x)
                return -1;
            if (proto.nin == IR_MAXIN || proto.nin == info->arity)
                return perr(P, at, "%s takes %d operand%s", info->name, info->arity < 0 ? IR_MAXIN : info->arity,
                            info->arity == 1 ? "" : "s");
            proto.in[proto.nin++] = x;
        } while (accept(P, ','));
    }
    if (!ir_arity_ok(info->arity, proto.nin))
        return perr(P, op_at, "%s takes %d operand%s, got %d", info->name, info->arity < 0 ? IR_MAXIN : info->arity,
                    info->arity == 1 ? "" : "s", proto.nin);
    if (read_keyed_attrs(P, info, &proto) < 0)
        return -1;

    if (expect(P, ':', "':' and the type") < 0)
        return -1;
    skip_ws(P);
    const char *type_at = P->p;
    if (read_type(P, &proto.dtype, &proto.rank, proto.shape) < 0 || check_eol(P) < 0)
        return -1;

    proto.label = all_digits(name) ? NULL : name;
    IrNode *n = ir_node(P->g, &proto);
    if (!n) {
        /* shape.c has no graph to name symbols with, so add the operand types in full */
        const char *e = ir_graph_error(P->g);
        char types[512] = "";
        size_t len = 0;
        for (int i = 0; i < proto.nin && len < sizeof types; i++) {
            char t[160];
            const IrNode *x = proto.in[i];
            type_str(P->g, x->dtype, x->rank, x->shape, t, sizeof t);
            len += (size_t)snprintf(types + len, sizeof types - len, "%s%s%s",
                                    i ? ", " : " (operands: ", t, i + 1 == proto.nin ? ")" : "");
        }
        return perr(P, op_at, "%s%s", e ? e : "out of memory", types);
    }
    int same = n->dtype == proto.dtype && n->rank == proto.rank;
    for (int i = 0; same && i < n->rank; i++)
        same = ir_dim_eq(n->shape[i], proto.shape[i]);
    if (!same) {
        char written[256], inferred[256];
        type_str(P->g, proto.dtype, proto.rank, proto.shape, written, sizeof written);
        type_str(P->g, n->dtype, n->rank, n->shape, inferred, sizeof inferred);
        return perr(P, type_at, "type mismatch: written %s, but %s gives %s", written, info->name,
                    inferred);
    }
    if (name_add(P, name, n, P->line) < 0)
        return perr(P, name_at, "out of memory");
    return 0;
}

/* output NAME = %value ('output' already read) */
static int parse_output(Parser *P)
{
    char name[STR_MAX_LEN];
    skip_ws(P);
    const char *at = P->p;
    if (read_name(P, name, sizeof name, "an output name") < 0)
        return -1;
    for (int i = 0; i < P->g->noutputs; i++)
        if (strcmp(P->g->outputs[i].name, name) == 0)
            return perr(P, at, "output '%s' defined twice", name);
    if (expect(P, '=', "'=' after the output name") < 0)
        return -1;
    IrNode *n = use_value(P);
    if (!n || check_eol(P) < 0)
        return -1;
    if (ir_output(P->g, name, n) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* alias NAME = %param ('alias' already read) */
static int parse_alias(Parser *P)
{
    char name[STR_MAX_LEN];
    skip_ws(P);
    const char *at = P->p;
    if (read_name(P, name, sizeof name, "an alias name") < 0)
        return -1;
    if (expect(P, '=', "'=' after the alias name") < 0)
        return -1;
    IrNode *n = use_value(P);
    if (!n || check_eol(P) < 0)
        return -1;
    if (ir_alias(P->g, name, n) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* init %leaf = [RULE] number ('init' already read; RULE: ir_init_name, none: const) */
static int parse_init(Parser *P)
{
    skip_ws(P);
    const char *at = P->p;
    IrNode *n = use_value(P);
    if (!n || expect(P, '=', "'=' after the parameter") < 0)
        return -1;
    skip_ws(P);
    int kind = IR_INIT_CONST;
    if (isalpha((unsigned char)*P->p)) {
        const char *w = P->p;
        char name[16];
        size_t len = 0;
        while (isalnum((unsigned char)P->p[len]) || P->p[len] == '_')
            len++;
        snprintf(name, sizeof name, "%.*s", (int)len, w);
        kind = len < sizeof name ? ir_init_lookup(name) : -1;
        if (kind < 0)
            return perr(P, w, "unknown init rule '%.*s' (const, normal, uniform, alibi, inv_freq)", (int)len, w);
        P->p += len;
    }
    double v;
    if (read_float(P, &v) < 0 || check_eol(P) < 0)
        return -1;
    if (ir_init(P->g, n, (IrInitKind)kind, v) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* rownorm %input = number ('rownorm' already read): the claim IrRowNorm */
static int parse_rownorm(Parser *P)
{
    skip_ws(P);
    const char *at = P->p;
    IrNode *n = use_value(P);
    double v;
    if (!n || expect(P, '=', "'=' after the input") < 0 || read_float(P, &v) < 0 || check_eol(P) < 0)
        return -1;
    if (ir_row_norm(P->g, n, v) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* after "name =": dim, or min(dim, cap); the symbols of dim are those declared before name */
static int parse_derived(Parser *P, const char *at, const char *name)
{
    char word[NAME_MAX_LEN + 1];
    IrDim def;
    int64_t cap = 0;
    skip_ws(P);
    const char *save = P->p;
    int is_min = 0;
    if (is_alpha(peek(P))) {
        if (read_ident(P, word, sizeof word, "a dimension") < 0)
            return -1;
        is_min = strcmp(word, "min") == 0 && peek(P) == '(';
    }
    if (!is_min) {
        P->p = save;
        if (read_dim(P, &def) < 0)
            return -1;
    } else {
        P->p++;
        if (read_dim(P, &def) < 0 || expect(P, ',', "',' and the cap after the dimension") < 0)
            return -1;
        skip_ws(P);
        const char *cat = P->p;
        if (read_int(P, &cap, "the cap") < 0)
            return -1;
        if (cap < 1)
            return perr(P, cat, "the cap of '%s' must be positive", name);
        if (expect(P, ')', "')' after the cap") < 0)
            return -1;
    }
    if (ir_graph_add_derived_sym(P->g, name, def, cap) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* a limit, DIM <= max (ir_graph_add_limit) */
static int parse_limit(Parser *P, const char *at)
{
    IrDim def;
    int64_t max;
    if (read_dim(P, &def) < 0)
        return -1;
    skip_ws(P);
    if (peek(P) != '<' || P->p[1] != '=')
        return perr(P, P->p, "expected '<=' and a bound after the limit's dimension");
    P->p += 2;
    skip_ws(P);
    if (read_int(P, &max, "the limit's bound") < 0)
        return -1;
    if (ir_graph_add_limit(P->g, def, max) < 0)
        return perr(P, at, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
    return 0;
}

/* graph NAME(sym, sym <= max, q = min(n+p, max), ..., limits: n+c <= max) { */
static int parse_header(Parser *P)
{
    char word[NAME_MAX_LEN + 1], name[STR_MAX_LEN], found[48];
    skip_blank_lines(P);
    skip_ws(P);
    const char *at = P->p;
    if (!is_alpha(peek(P)) || read_ident(P, word, sizeof word, "'graph'") < 0 ||
        strcmp(word, "graph") != 0)
        return perr(P, at, "expected 'graph NAME(symbols) {', found %s",
                    describe(at, found, sizeof found));
    if (read_name(P, name, sizeof name, "the graph's name") < 0)
        return -1;
    P->g = ir_graph_new(name);
    if (!P->g)
        return perr(P, at, "out of memory");
    if (accept(P, '(') && !accept(P, ')')) {
        do {
            skip_ws(P);
            const char *sat = P->p;
            int limit = is_digit(peek(P));
            if (!limit && read_ident(P, word, sizeof word, "a symbol name") < 0)
                return -1;
            char next = (char)peek(P);
            if (limit || next == '*' || next == '+' || next == '-' ||
                (next == '<' && ir_graph_find_sym(P->g, word) >= 0)) {
                /* a limit on declared symbols: c+n <= 128 */
                P->p = sat;
                if (parse_limit(P, sat) < 0)
                    return -1;
                continue; /* to the ',' test */
            }
            if (ir_graph_find_sym(P->g, word) >= 0)
                return perr(P, sat, "symbol '%s' declared twice", word);
            if (P->g->nsyms == IR_MAXSYM)
                return perr(P, sat, "too many symbols (at most %d)", IR_MAXSYM);
            int64_t max = 0;
            if (peek(P) == '=') {
                P->p++;
                if (parse_derived(P, sat, word) < 0)
                    return -1;
                continue; /* to the ',' test */
            }
            if (peek(P) == '<' && P->p[1] == '=') {
                P->p += 2;
                skip_ws(P);
                const char *mat = P->p;
                if (read_int(P, &max, "an upper bound") < 0)
                    return -1;
                if (max < 1)
                    return perr(P, mat, "the bound of '%s' must be positive", word);
            }
            if (ir_graph_add_sym(P->g, word, max) < 0)
                return perr(P, sat, "%s", ir_graph_error(P->g) ? ir_graph_error(P->g) : "out of memory");
        } while (accept(P, ','));
        if (expect(P, ')', "',' or ')' after the symbol") < 0)
            return -1;
    }
    if (expect(P, '{', "'{' after the graph header") < 0)
        return -1;
    return check_eol(P);
}

static int parse_graph(Parser *P)
{
    char word[NAME_MAX_LEN + 1], found[48];
    if (parse_header(P) < 0)
        return -1;
    newline(P);
    for (;;) {
        skip_blank_lines(P);
        const char *at = P->p;
        int c = (unsigned char)*P->p, rc;
        if (c == 0)
            return perr(P, at, "missing '}' at the end of the graph");
        if (c == '}') {
            P->p++;
            if (check_eol(P) < 0)
                return -1;
            break;
        }
        if (c == '%')
            rc = parse_node(P);
        else if (is_alpha(c) && read_ident(P, word, sizeof word, "a statement") == 0 &&
                 (strcmp(word, "output") == 0 || strcmp(word, "alias") == 0 || strcmp(word, "init") == 0 ||
                  strcmp(word, "rownorm") == 0))
            rc = word[0] == 'o' ? parse_output(P) : word[0] == 'a' ? parse_alias(P) : word[0] == 'r' ? parse_rownorm(P)
                                                                                     : parse_init(P);
        else
            rc = perr(P, at, "expected a node (%%name = op ...), an output or '}', found %s",
                      describe(at, found, sizeof found));
        if (rc < 0)
            return -1;
        newline(P);
    }
    newline(P);
    skip_blank_lines(P);
    if (*P->p)
        return perr(P, P->p, "unexpected %s after the end of the graph",
                    describe(P->p, found, sizeof found));
    return 0;
}

IrGraph *ir_parse(const char *text, const char *filename, char *err, size_t n)
{
    Parser P;
    memset(&P, 0, sizeof P);
    P.p = P.line_start = text ? text : "";
    P.line = 1;
    P.file = filename ? filename : "<input>";
    P.err = err;
    P.nerr = n;
    if (err && n)
        err[0] = 0;
    int rc = parse_graph(&P);
    names_free(&P);
    if (rc < 0 || P.failed) {
        ir_graph_free(P.g);
        return NULL;
    }
    return P.g;
}
