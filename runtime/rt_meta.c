/* rt_meta.c: parsing a module's metadata text (the format is described in rt_abi.h) into the
 * tables of XtcModule. The text comes from a file the user chose, so every field is checked:
 * bad records are errors with the line number, never crashes. */
#include "rt_internal.h"
#include "rt_quant.h"
#include "rt_alloc.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void rt_set_error(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

XtcDType rt_dtype_from_name(const char *name)
{
    for (int t = 0; t < XTC_NUM_DTYPES; t++)
        if (strcmp(name, xtc_dtype_name((XtcDType)t)) == 0)
            return (XtcDType)t;
    return XTC_NUM_DTYPES;
}

int64_t rt_dim_eval(const RtDim *d, const int64_t *syms)
{
    int64_t v = d->c, t;
    for (int s = 0; s < RT_MAXSYM; s++) {
        if (!d->k[s])
            continue;
        /* saturate instead of wrapping: a huge size then fails to allocate, a negative one is
         * refused, where a wrapped one could look small and plan a buffer too short */
        if (__builtin_mul_overflow(d->k[s], syms[s], &t) || __builtin_add_overflow(v, t, &v))
            return (d->k[s] < 0) != (syms[s] < 0) ? INT64_MIN : INT64_MAX;
    }
    return v;
}

void rt_derive_syms(const XtcModule *m, int64_t *syms)
{
    for (int s = 0; s < m->nsyms; s++)
        if (m->sym_derived[s]) {
            int64_t v = rt_dim_eval(&m->sym_def[s], syms);
            syms[s] = m->sym_max[s] > 0 && v > m->sym_max[s] ? m->sym_max[s] : v;
        }
}

int64_t rt_numel(const RtDim *shape, int rank, const int64_t *syms)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= rt_dim_eval(&shape[i], syms);
    return n;
}

typedef struct {
    XtcModule *m;
    int line;
    char *tok[16];
    int ntok;
    int nomem;   /* the failure was an allocation */
} Parser;

static int bad(Parser *p, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    rt_set_error(p->m->err, sizeof p->m->err, "module metadata, line %d: %s", p->line, msg);
    return -1;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Names are written with %XX for spaces, '%' and bytes outside ASCII: decoded in place. */
static char *name_field(Parser *p, char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hexval(r[1]), lo = hi >= 0 ? hexval(r[2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                bad(p, "bad escape in name '%s'", s);
                return NULL;
            }
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
    return s;
}

static int parse_int(Parser *p, const char *s, int64_t *out)
{
    char *end;
    if (!*s)
        return bad(p, "empty number%s", "");
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end)
        return bad(p, "bad number '%s'", s);
    if (errno == ERANGE)
        return bad(p, "number '%s' out of range", s);
    *out = v;
    return 0;
}

static int find_sym(const XtcModule *m, const char *name, size_t len)
{
    for (int s = 0; s < m->nsyms; s++)
        if (strlen(m->sym_name[s]) == len && strncmp(m->sym_name[s], name, len) == 0)
            return s;
    return -1;
}

/* Bound on every coefficient and constant of a dimension, and on a weight's element count:
 * far above any real model, far below where int64 arithmetic on them could overflow. */
#define DIM_LIMIT ((int64_t)1 << 50)
#define WEIGHT_LIMIT ((int64_t)1 << 40)

/* "2*b+3", "m+n", "n-1", "64" */
static int parse_dim(Parser *p, const char *s, RtDim *d)
{
    memset(d, 0, sizeof *d);
    const char *q = s;
    if (!*q)
        return bad(p, "empty dimension%s", "");
    while (*q) {
        int64_t sign = 1;
        if (*q == '+' || *q == '-') {
            sign = *q == '-' ? -1 : 1;
            q++;
        } else if (q != s) {
            return bad(p, "bad dimension '%s'", s);
        }
        int64_t coef = 1;
        if (isdigit((unsigned char)*q)) {
            coef = 0;
            while (isdigit((unsigned char)*q)) {
                coef = coef * 10 + (*q - '0');
                if (coef > DIM_LIMIT)
                    return bad(p, "dimension '%s' too large", s);
                q++;
            }
            if (*q != '*') {
                d->c += sign * coef;
                if (d->c > DIM_LIMIT || d->c < -DIM_LIMIT)
                    return bad(p, "dimension '%s' too large", s);
                continue;
            }
            q++;
        }
        const char *name = q;
        while (isalnum((unsigned char)*q) || *q == '_')
            q++;
        if (q == name || isdigit((unsigned char)*name))
            return bad(p, "bad dimension '%s'", s);
        int sym = find_sym(p->m, name, (size_t)(q - name));
        if (sym < 0)
            return bad(p, "undeclared symbol in dimension '%s'", s);
        d->k[sym] += sign * coef;
        if (d->k[sym] > DIM_LIMIT || d->k[sym] < -DIM_LIMIT)
            return bad(p, "dimension '%s' too large", s);
    }
    return 0;
}

/* "[b,n,64]" split in place; dims text pointers go into the same storage */
static int parse_shape(Parser *p, char *s, int *rank, RtDim *shape, const char **dims)
{
    size_t len = strlen(s);
    if (len < 2 || s[0] != '[' || s[len - 1] != ']')
        return bad(p, "bad shape '%s'", s);
    s[len - 1] = 0;
    s++;
    *rank = 0;
    if (!*s)
        return 0;
    for (;;) {
        char *comma = strchr(s, ',');
        if (comma)
            *comma = 0;
        if (*rank >= XTC_MAX_RANK)
            return bad(p, "rank above %s", "8");
        if (parse_dim(p, s, &shape[*rank]) < 0)
            return -1;
        dims[*rank] = s;
        (*rank)++;
        if (!comma)
            break;
        s = comma + 1;
    }
    return 0;
}

static int parse_dtype(Parser *p, const char *s, XtcDType *t)
{
    *t = rt_dtype_from_name(s);
    if (*t == XTC_NUM_DTYPES)
        return bad(p, "unknown dtype '%s'", s);
    return 0;
}

static int parse_index(Parser *p, const char *s, int lo, int hi, int *out)
{
    int64_t v = 0;
    if (parse_int(p, s, &v) < 0)
        return -1;
    if (v < lo || v >= hi)
        return bad(p, "index %s out of range", s);
    *out = (int)v;
    return 0;
}

static int need(Parser *p, int n)
{
    if (p->ntok != n)
        return bad(p, "record '%s' has the wrong number of fields", p->tok[0]);
    return 0;
}

static void *grow(void *arr, int n, size_t elem)
{
    /* capacity doubles at powers of two */
    if (n & (n - 1))
        return arr;
    int cap = n ? 2 * n : 4;
    return rt_realloc(arr, (size_t)cap * elem);
}

#define PUSH(p, arr, n)                                                                            \
    do {                                                                                           \
        void *g_ = grow((arr), (n), sizeof *(arr));                                               \
        if (!g_) {                                                                                 \
            (p)->nomem = 1;                                                                        \
            return bad((p), "out of memory%s", "");                                               \
        }                                                                                          \
        (arr) = g_;                                                                                \
        memset(&(arr)[(n)], 0, sizeof *(arr));                                                     \
    } while (0)

static int record(Parser *p)
{
    XtcModule *m = p->m;
    char **t = p->tok;
    const char *kind = t[0];
    if (strcmp(kind, "model") == 0) {
        if (need(p, 2) < 0)
            return -1;
        if (!(m->name = name_field(p, t[1])))
            return -1;
    } else if (strcmp(kind, "option") == 0) {
        if (p->ntok < 2)
            return bad(p, "option without a key%s", "");
        PUSH(p, m->options, m->noptions);
        m->options[m->noptions].key = t[1];
        m->options[m->noptions].value = p->ntok > 2 ? name_field(p, t[2]) : "";
        if (!m->options[m->noptions].value)
            return -1;
        m->noptions++;
    } else if (strcmp(kind, "sym") == 0) {
        if (need(p, 3) < 0)
            return -1;
        if (m->nsyms >= RT_MAXSYM)
            return bad(p, "too many symbols%s", "");
        if (parse_int(p, t[2], &m->sym_max[m->nsyms]) < 0)
            return -1;
        if (m->sym_max[m->nsyms] < 0)
            return bad(p, "negative bound for symbol '%s'", t[1]);
        m->sym_name[m->nsyms] = t[1];
        m->sym_is_batch[m->nsyms] = strcmp(t[1], "b") == 0 || strcmp(t[1], "batch") == 0;
        m->nsyms++;
    } else if (strcmp(kind, "derive") == 0) {
        if (need(p, 4) < 0)
            return -1;
        int s = find_sym(m, t[1], strlen(t[1]));
        if (s < 0 || m->sym_derived[s])
            return bad(p, "derive: '%s' is not a symbol declared (once) before", t[1]);
        RtDim d;
        int64_t cap;
        if (parse_dim(p, t[2], &d) < 0 || parse_int(p, t[3], &cap) < 0)
            return -1;
        for (int k = s; k < RT_MAXSYM; k++)
            if (d.k[k])
                return bad(p, "derive: '%s' may only use the symbols declared before it", t[1]);
        if (cap < 0)
            return bad(p, "derive: negative cap for '%s'", t[1]);
        m->sym_derived[s] = 1;
        m->sym_def[s] = d;
        m->sym_max[s] = cap;
    } else if (strcmp(kind, "limit") == 0) {
        if (need(p, 3) < 0)
            return -1;
        if (m->nlimits >= RT_MAXLIMIT)
            return bad(p, "too many limits%s", "");
        RtDim d;
        int64_t max;
        if (parse_dim(p, t[1], &d) < 0 || parse_int(p, t[2], &max) < 0)
            return -1;
        if (max < 1)
            return bad(p, "limit: bound %s is not positive", t[2]);
        m->limit_def[m->nlimits] = d;
        m->limit_text[m->nlimits] = t[1];
        m->limit_max[m->nlimits++] = max;
    } else if (strcmp(kind, "buffer") == 0) {
        if (need(p, 8) < 0)
            return -1;
        int id;
        if (parse_index(p, t[1], m->nbufs, m->nbufs + 1, &id) < 0)
            return -1;
        PUSH(p, m->bufs, m->nbufs);
        RtBuffer *b = &m->bufs[m->nbufs];
        static const char *kinds[] = {"input", "param", "state", "temp"};
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(t[2], kinds[i]) == 0)
                k = i;
        if (k < 0)
            return bad(p, "unknown buffer kind '%s'", t[2]);
        b->kind = (RtBufKind)k;
        if (!(b->name = name_field(p, t[3])))
            return -1;
        if (parse_dtype(p, t[4], &b->dtype) < 0 || parse_shape(p, t[5], &b->rank, b->shape, b->dims) < 0)
            return -1;
        if (parse_index(p, t[6], -1, INT_MAX, &b->first) < 0 || parse_index(p, t[7], -1, INT_MAX, &b->last) < 0)
            return -1;
        m->nbufs++;
        if (k != RT_BUF_TEMP) {
            PUSH(p, m->by_kind[k], m->nby_kind[k]);
            m->by_kind[k][m->nby_kind[k]++] = id;
        }
    } else if (strcmp(kind, "output") == 0) {
        if (need(p, 5) < 0)
            return -1;
        PUSH(p, m->outs, m->nouts);
        RtOutput *o = &m->outs[m->nouts];
        if (!(o->name = name_field(p, t[1])))
            return -1;
        if (parse_index(p, t[2], 0, m->nbufs, &o->buf) < 0 || parse_dtype(p, t[3], &o->dtype) < 0 ||
            parse_shape(p, t[4], &o->rank, o->shape, o->dims) < 0)
            return -1;
        if (o->dtype != m->bufs[o->buf].dtype)
            return bad(p, "output '%s' and its buffer differ in dtype", o->name);
        m->nouts++;
    } else if (strcmp(kind, "alias") == 0) {
        if (need(p, 3) < 0)
            return -1;
        PUSH(p, m->aliases, m->naliases);
        RtAlias *a = &m->aliases[m->naliases];
        if (!(a->name = name_field(p, t[1])) || parse_index(p, t[2], 0, m->nbufs, &a->buf) < 0)
            return -1;
        if (m->bufs[a->buf].kind != RT_BUF_PARAM && m->bufs[a->buf].kind != RT_BUF_STATE)
            return bad(p, "alias '%s' of a buffer that is not a weight", a->name);
        m->naliases++;
    } else if (strcmp(kind, "init") == 0) { /* init BUFFER RULE VALUE, or BUFFER VALUE (const) */
        int b = 0, rule = XTC_INIT_CONST;
        if ((p->ntok != 3 && need(p, 4) < 0) || parse_index(p, t[1], 0, m->nbufs, &b) < 0)
            return -1;
        const char *vt = t[2];
        if (p->ntok == 4) {
            for (rule = 0; rule < XTC_NUM_INITS && strcmp(t[2], xtc_init_rule_name(rule)) != 0; rule++)
                ;
            if (rule == XTC_NUM_INITS)
                return bad(p, "unknown init rule '%s'", t[2]);
            vt = t[3];
        }
        char *end = NULL;
        errno = 0;
        double v = strtod(vt, &end);
        if (!*vt || *end || errno || !isfinite(v))
            return bad(p, "bad initial value '%s'", vt);
        if ((m->bufs[b].kind != RT_BUF_PARAM && m->bufs[b].kind != RT_BUF_STATE) || m->bufs[b].has_init)
            return bad(p, "init of buffer %s, which is not a weight or has one already", t[1]);
        m->bufs[b].has_init = 1;
        m->bufs[b].init_rule = rule;
        m->bufs[b].init = v;
    } else if (strcmp(kind, "norm") == 0) { /* norm BUFFER NORM */
        int b = 0;
        if (need(p, 3) < 0 || parse_index(p, t[1], 0, m->nbufs, &b) < 0)
            return -1;
        char *end = NULL;
        errno = 0;
        double v = strtod(t[2], &end);
        if (!*t[2] || *end || errno || !isfinite(v) || !(v > 0))
            return bad(p, "bad row norm '%s'", t[2]);
        if (m->bufs[b].kind != RT_BUF_INPUT || m->bufs[b].dtype != XTC_F32 || m->bufs[b].rank < 1)
            return bad(p, "norm of buffer %s, which is not an f32 input", t[1]);
        m->bufs[b].row_norm = v;
    } else if (strcmp(kind, "storage") == 0) { /* storage BUFFER bf16|fp16|int8 */
        int b = 0;
        if (need(p, 3) < 0 || parse_index(p, t[1], 0, m->nbufs, &b) < 0)
            return -1;
        int st = strcmp(t[2], "bf16") == 0 ? 1 : strcmp(t[2], "fp16") == 0 ? 2 : strcmp(t[2], "int8") == 0 ? RT_STORE_INT8_ROWS : 0;
        if (!st)
            return bad(p, "unknown storage '%s'", t[2]);
        if (m->bufs[b].dtype != XTC_F32 || m->bufs[b].storage)
            return bad(p, "storage of buffer %s, which is not f32 or has one already", t[1]);
        m->bufs[b].storage = st;
    } else if (strcmp(kind, "range") == 0) {
        if (need(p, 4) < 0 || !name_field(p, t[1]))
            return -1;
        int found = 0;
        for (int i = 0; i < m->nbufs; i++) {
            RtBuffer *b = &m->bufs[i];
            if (b->kind == RT_BUF_INPUT && strcmp(b->name, t[1]) == 0) {
                if (parse_int(p, t[2], &b->lo) < 0 || parse_int(p, t[3], &b->hi) < 0)
                    return -1;
                b->has_range = 1;
                found = 1;
            }
        }
        if (!found)
            return bad(p, "range for unknown input '%s'", t[1]);
    } else if (strcmp(kind, "kernel") == 0) {
        if (need(p, 5) < 0)
            return -1;
        int id = 0, uses = 0;
        if (parse_index(p, t[1], m->nkernels, m->nkernels + 1, &id) < 0 || parse_index(p, t[4], 0, INT_MAX, &uses) < 0)
            return -1;
        PUSH(p, m->kernels, m->nkernels);
        m->kernels[m->nkernels].fn = t[2];
        m->kernels[m->nkernels].op = t[3];
        m->kernels[m->nkernels].uses = uses;
        m->nkernels++;
    } else if (strcmp(kind, "step") == 0) {
        int nin = p->ntok - 6; /* step ID KERNEL OUT IN0 .. IN(nin-1) OP LABEL */
        if (nin < 3 || nin > RT_MAXIN)
            return bad(p, "record '%s' has the wrong number of fields", p->tok[0]);
        int id;
        if (parse_index(p, t[1], m->nsteps, m->nsteps + 1, &id) < 0)
            return -1;
        PUSH(p, m->steps, m->nsteps);
        RtStep *s = &m->steps[m->nsteps];
        if (parse_index(p, t[2], 0, m->nkernels, &s->kernel) < 0 ||
            parse_index(p, t[3], 0, m->nbufs, &s->out) < 0)
            return -1;
        for (int i = 0; i < RT_MAXIN; i++)
            s->in[i] = -1;
        for (int i = 0; i < nin; i++)
            if (parse_index(p, t[4 + i], -1, m->nbufs, &s->in[i]) < 0)
                return -1;
        s->op = t[4 + nin];
        if (!(s->label = name_field(p, t[5 + nin])))
            return -1;
        m->nsteps++;
    } else {
        return bad(p, "unknown record '%s'", kind);
    }
    return 0;
}

int rt_meta_parse(XtcModule *m, const char *text)
{
    Parser p = {.m = m};
    size_t len = strlen(text);
    m->text = rt_malloc(len + 1);
    if (!m->text) {
        rt_set_error(m->err, sizeof m->err, "out of memory");
        return -2;
    }
    memcpy(m->text, text, len + 1);
    m->name = "";
    char *line = m->text;
    int ended = 0;
    while (*line && !ended) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        p.line++;
        p.ntok = 0;
        for (char *s = line; *s;) {
            while (*s == ' ')
                *s++ = 0;
            if (!*s)
                break;
            if (p.ntok == 16)
                return bad(&p, "too many fields%s", "");
            p.tok[p.ntok++] = s;
            while (*s && *s != ' ')
                s++;
        }
        if (p.line == 1) {
            if (p.ntok != 2 || strcmp(p.tok[0], "xtc-module") != 0) {
                rt_set_error(m->err, sizeof m->err, "not an xtc module (metadata header missing)");
                return -1;
            }
            if (strcmp(p.tok[1], "1") != 0) {
                rt_set_error(m->err, sizeof m->err,
                             "module metadata format version %s; this runtime reads version 1 "
                             "(recompile the model with this version of xtc)", p.tok[1]);
                return -1;
            }
        } else if (p.ntok == 1 && strcmp(p.tok[0], "end") == 0) {
            ended = 1;
        } else if (p.ntok > 0 && record(&p) < 0) {
            return p.nomem ? -2 : -1;
        }
        line = nl ? nl + 1 : line + strlen(line);
    }
    if (!ended) {
        p.line++;
        return bad(&p, "metadata truncated (no 'end')%s", "");
    }
    /* cross checks the code relies on */
    for (int i = 0; i < m->nbufs; i++) {
        RtBuffer *b = &m->bufs[i];
        if (b->kind == RT_BUF_TEMP && (b->first < 0 || b->last < b->first || b->last > m->nsteps)) {
            rt_set_error(m->err, sizeof m->err, "module metadata: buffer %d has a bad lifetime", i);
            return -1;
        }
        if ((b->kind == RT_BUF_PARAM || b->kind == RT_BUF_STATE) && b->dtype != XTC_F32 &&
            !(b->kind == RT_BUF_STATE && b->dtype == XTC_I8)) { /* int8 weights: rt_quant_link */
            rt_set_error(m->err, sizeof m->err, "module metadata: weight '%s' is not f32", b->name);
            return -1;
        }
        if (b->kind == RT_BUF_PARAM || b->kind == RT_BUF_STATE) {
            /* xtc_module_param_count multiplies the constant parts of the dimensions */
            int64_t numel = 1;
            for (int d = 0; d < b->rank; d++)
                if (__builtin_mul_overflow(numel, b->shape[d].c, &numel) || numel > WEIGHT_LIMIT ||
                    numel < -WEIGHT_LIMIT) {
                    rt_set_error(m->err, sizeof m->err,
                                 "module metadata: weight '%s' has more than 2^40 elements", b->name);
                    return -1;
                }
        }
    }
    return rt_quant_link(m);
}

void rt_meta_free(XtcModule *m)
{
    free(m->text);
    free(m->bufs);
    free(m->outs);
    for (int k = 0; k < 4; k++)
        free(m->by_kind[k]);
    free(m->kernels);
    free(m->steps);
    free(m->options);
    free(m->aliases);
}
