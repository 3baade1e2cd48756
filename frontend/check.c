/* check.c: xtf_check, the semantic checker of .xtf files.
 *
 * Requires: a parse tree from xtf_parse (best run only when parsing found no errors).
 * Produces: the same tree with every reference (XV_REF) resolved to the value of the earlier
 * statement it names, and a diagnostic for everything x-transformers would reject, silently
 * ignore or crash on: unknown constructors and options (with a "did you mean"), options that are
 * not supported yet (refused by name), wrong types, out-of-range values, duplicate options,
 * missing required options, duplicate or undefined statement names, and combinations that the
 * library asserts on or mishandles (use_rmsnorm with use_scalenorm, rotary_pos_emb with heads
 * narrower than 32, ...). All knowledge of option names comes from the table in options.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "options.h"
#include "xtf_internal.h"

/* Statement names to statement indices: open addressing over f->stmts, so that files with
 * very many statements stay linear. A slot holds an index or -1. */
typedef struct {
    int *slots;
    size_t mask;
} NameMap;

typedef struct {
    XtfFile *f;
    XtfDiag *d;
    int current;      /* index of the statement being checked; only earlier ones are visible */
    NameMap first;    /* name -> its first statement */
    NameMap last;     /* name -> its last statement */
    NameMap visible;  /* name -> its last statement before 'current' */
} Checker;

enum { MAX_ARGS = 1000 }; /* more options than this in one call is not a model */

/* ---- spelling ---- */

int xtf_edit_distance(const char *a, const char *b, int cap)
{
    enum { MAXN = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la > MAXN || lb > MAXN || (la > lb ? la - lb : lb - la) > (size_t)cap)
        return cap + 1;
    int prev2[MAXN + 1], prev[MAXN + 1], cur[MAXN + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        int row_min = cur[0];
        for (size_t j = 1; j <= lb; j++) {
            int ai = tolower((unsigned char)a[i - 1]), bj = tolower((unsigned char)b[j - 1]);
            int d = prev[j - 1] + (ai != bj);
            if (prev[j] + 1 < d)
                d = prev[j] + 1;
            if (cur[j - 1] + 1 < d)
                d = cur[j - 1] + 1;
            if (i > 1 && j > 1 && ai == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == bj && prev2[j - 2] + 1 < d)
                d = prev2[j - 2] + 1; /* adjacent transposition */
            cur[j] = d;
            if (d < row_min)
                row_min = d;
        }
        if (row_min > cap)
            return cap + 1;
        memcpy(prev2, prev, sizeof prev);
        memcpy(prev, cur, sizeof cur);
    }
    return prev[lb] > cap ? cap + 1 : prev[lb];
}

int xtf_typo_limit(const char *name)
{
    size_t n = strlen(name);
    if (n < 4)
        return 1;
    return n / 3 > 2 ? (int)(n / 3) : 2;
}

typedef struct {
    const char *typed;
    int limit, best;
    char name[128];
} Suggest;

static void suggest_try(Suggest *s, const char *candidate)
{
    if (strcmp(candidate, s->typed) == 0)
        return;
    int d = xtf_edit_distance(s->typed, candidate, s->limit);
    if (d <= s->limit && d < s->best) {
        s->best = d;
        snprintf(s->name, sizeof s->name, "%s", candidate);
    }
}

static int suggest_visit(void *arg, const char *key, const XtfOption *o)
{
    (void)o;
    suggest_try(arg, key);
    return 0;
}

static void suggest_init(Suggest *s, const char *typed)
{
    s->typed = typed;
    s->limit = xtf_typo_limit(typed);
    s->best = s->limit + 1;
    s->name[0] = '\0';
}

/* ---- helpers ---- */

static const XtfValue *follow(const XtfValue *v)
{
    return v && v->kind == XV_REF ? v->ref : v;
}

static const XtfArg *find_arg(const XtfValue *call, const char *key)
{
    for (int i = 0; i < call->nargs; i++)
        if (call->args[i].key && strcmp(call->args[i].key, key) == 0)
            return &call->args[i];
    return NULL;
}

static const char *with_prefix(char *buf, size_t cap, const char *prefix, const char *name)
{
    snprintf(buf, cap, "%s%s", prefix, name);
    return buf;
}

static size_t hash_name(const char *s)
{
    size_t h = 1469598103934665603u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211u;
    return h;
}

static int map_init(NameMap *m, int n)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots)
        return -1;
    memset(m->slots, 0xff, cap * sizeof *m->slots); /* all -1 */
    m->mask = cap - 1;
    return 0;
}

/* The slot for name: the one holding it, or the empty one where it would go. */
static int *map_slot(const NameMap *m, const XtfFile *f, const char *name)
{
    size_t i = hash_name(name) & m->mask;
    while (m->slots[i] >= 0 && strcmp(f->stmts[m->slots[i]].name, name) != 0)
        i = (i + 1) & m->mask;
    return &m->slots[i];
}

/* The statement a map gives for name, or NULL. */
static const XtfStmt *map_get(const NameMap *m, const XtfFile *f, const char *name)
{
    int i = *map_slot(m, f, name);
    return i >= 0 ? &f->stmts[i] : NULL;
}

/* Would another error be recorded? Messages that cost work (suggestions) skip it if not. */
static int diag_open(const Checker *C)
{
    return C->d->nerrors < (C->d->max_errors > 0 ? C->d->max_errors : 20);
}

/* What a value is, for "got ..." in messages. */
static const char *kind_name(const XtfValue *v, char *buf, size_t cap)
{
    switch (v->kind) {
    case XV_INT: return "an integer";
    case XV_FLOAT: return "a float";
    case XV_BOOL: return "a boolean";
    case XV_STRING: return "a string";
    case XV_NONE: return "None";
    case XV_TUPLE: return "a tuple";
    case XV_CALL: snprintf(buf, cap, "%s(...)", v->s); return buf;
    case XV_REF: return "a name";
    }
    return "a value";
}

/* A number as the user spelled it (from the source), or printed if that fails. */
static const char *spelling(const Checker *C, const XtfValue *v, char *buf, size_t cap)
{
    XtfLoc loc = v->loc;
    const char *s = C->f->src, *end = s + xtf_src_len(C->f);
    for (int line = 1; line < loc.line && s < end; line++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        s = nl ? nl + 1 : end;
    }
    if (loc.line >= 1 && loc.col >= 1 && loc.len >= 1 && (size_t)loc.len < cap &&
        (size_t)(end - s) >= (size_t)(loc.col - 1 + loc.len)) {
        memcpy(buf, s + loc.col - 1, (size_t)loc.len);
        buf[loc.len] = '\0';
        if (!memchr(buf, '\n', (size_t)loc.len) && strlen(buf) == (size_t)loc.len)
            return buf;
    }
    if (v->kind == XV_INT)
        snprintf(buf, cap, "%lld", (long long)v->i);
    else
        snprintf(buf, cap, "%g", v->f);
    return buf;
}

/* After an error about a value that came through a reference: say where it was defined. */
static void note_ref(Checker *C, const XtfValue *written)
{
    if (written->kind != XV_REF)
        return;
    const XtfStmt *s = map_get(&C->visible, C->f, written->s);
    if (s)
        xtf_diag_note(C->d, C->f, s->loc, "'%s' is defined here", s->name);
}

/* ---- values ---- */

static void check_value(Checker *C, XtfValue *v);

static void resolve(Checker *C, XtfValue *v)
{
    const XtfStmt *s = map_get(&C->visible, C->f, v->s);
    if (s) {
        v->ref = s->value && s->value->kind == XV_REF ? s->value->ref : s->value;
        return;
    }
    Suggest sg;
    suggest_init(&sg, v->s);
    for (int i = 0; i < C->current && diag_open(C); i++)
        suggest_try(&sg, C->f->stmts[i].name);
    if (sg.name[0])
        xtf_diag_error(C->d, C->f, v->loc, "'%s' is not defined; did you mean '%s'?", v->s,
                       sg.name);
    else
        xtf_diag_error(C->d, C->f, v->loc, "'%s' is not defined", v->s);
    const XtfStmt *self = &C->f->stmts[C->current];
    const XtfStmt *later = strcmp(self->name, v->s) == 0 ? self : map_get(&C->last, C->f, v->s);
    if (later == self)
        xtf_diag_note(C->d, C->f, later->loc, "a statement cannot refer to itself");
    else if (later)
        xtf_diag_note(C->d, C->f, later->loc,
                      "'%s' is defined here, after its use; define it first", v->s);
}

static void check_call(Checker *C, XtfValue *call);

static void check_value(Checker *C, XtfValue *v)
{
    if (!v)
        return;
    switch (v->kind) {
    case XV_REF: resolve(C, v); break;
    case XV_TUPLE:
        for (int i = 0; i < v->nitems; i++)
            check_value(C, v->items[i]);
        break;
    case XV_CALL: check_call(C, v); break;
    default: break;
    }
}

/* ---- one option's value: type and range ---- */

static int is_int(const XtfValue *r)
{
    return r && r->kind == XV_INT;
}

static int type_ok(const XtfOption *o, const XtfValue *r)
{
    if (r->kind == XV_NONE)
        return o->def && o->def->kind == XV_NONE;
    switch (o->type) {
    case XTF_T_INT: return r->kind == XV_INT;
    case XTF_T_NUMBER: return r->kind == XV_INT || r->kind == XV_FLOAT;
    case XTF_T_BOOL: return r->kind == XV_BOOL;
    case XTF_T_STRING: return r->kind == XV_STRING;
    case XTF_T_INT_TUPLE:
        if (r->kind == XV_INT)
            return 1;
        if (r->kind != XV_TUPLE)
            return 0;
        for (int i = 0; i < r->nitems; i++)
            if (!is_int(follow(r->items[i])) && follow(r->items[i]))
                return 0;
        return 1;
    case XTF_T_BLOCKS:
        if (r->kind != XV_TUPLE)
            return 0;
        for (int i = 0; i < r->nitems; i++) {
            const XtfValue *item = follow(r->items[i]);
            if (item && item->kind != XV_STRING)
                return 0;
        }
        return 1;
    case XTF_T_LAYERS: {
        if (r->kind != XV_CALL)
            return 0;
        const XtfCtor *c = xtf_ctor_find(r->s);
        return !c || c->status == XTF_FORBIDDEN || (o->accepts & XTF_C_BIT(c->id));
    }
    }
    return 0;
}

static void check_option_value(Checker *C, const XtfArg *a, const XtfOption *o)
{
    const XtfValue *r = follow(a->value);
    if (!r)
        return; /* an undefined name, already reported */
    char tbuf[128], kbuf[128], sbuf[64];
    if (!type_ok(o, r)) {
        xtf_diag_error(C->d, C->f, a->value->loc, "expected %s for '%s', got %s",
                       xtf_option_type_name(o, tbuf, sizeof tbuf), a->key,
                       kind_name(r, kbuf, sizeof kbuf));
        note_ref(C, a->value);
        return;
    }
    if (o->type == XTF_T_BLOCKS && r->kind == XV_TUPLE) {
        for (int i = 0; i < r->nitems; i++) {
            const XtfValue *item = follow(r->items[i]);
            if (item && item->kind == XV_STRING && strcmp(item->s, "a") != 0 &&
                strcmp(item->s, "c") != 0 && strcmp(item->s, "f") != 0)
                xtf_diag_error(C->d, C->f, r->items[i]->loc,
                               "a layer kind is 'a', 'c' or 'f', got '%s'", item->s);
        }
        return;
    }
    for (int i = 0; o->type == XTF_T_INT_TUPLE && r->kind == XV_TUPLE && i < r->nitems; i++) {
        const XtfValue *item = follow(r->items[i]);
        if (item && item->kind == XV_INT && (item->i > XTF_MAX_SIZE || item->i < -XTF_MAX_SIZE))
            xtf_diag_error(C->d, C->f, r->items[i]->loc, "'%s' values must be at most %d in magnitude",
                           a->key, XTF_MAX_SIZE);
    }
    if (r->kind != XV_INT && r->kind != XV_FLOAT)
        return;
    if (r->kind == XV_INT && (r->i > XTF_MAX_SIZE || r->i < -XTF_MAX_SIZE)) {
        xtf_diag_error(C->d, C->f, a->value->loc, "'%s' must be at most %d in magnitude, got %s", a->key,
                       XTF_MAX_SIZE, spelling(C, r, sbuf, sizeof sbuf));
        note_ref(C, a->value);
        return;
    }
    double x = r->kind == XV_INT ? (double)r->i : r->f;
    int ok = 1;
    const char *fmt = NULL;
    switch (o->range) {
    case XTF_R_ANY: break;
    case XTF_R_GE: ok = x >= o->bound; fmt = "'%s' must be >= %g, got %s"; break;
    case XTF_R_GT: ok = x > o->bound; fmt = "'%s' must be > %g, got %s"; break;
    case XTF_R_PROB: ok = x >= 0 && x < 1; fmt = "'%s' must be in [0, 1), got %s"; break;
    case XTF_R_UNIT: ok = x > 0 && x <= 1; fmt = "'%s' must be in (0, 1], got %s"; break;
    }
    if (ok)
        return;
    const char *got = spelling(C, r, sbuf, sizeof sbuf);
    if (o->range == XTF_R_GE || o->range == XTF_R_GT)
        xtf_diag_error(C->d, C->f, a->value->loc, fmt, a->key, o->bound, got);
    else
        xtf_diag_error(C->d, C->f, a->value->loc, fmt, a->key, got);
    note_ref(C, a->value);
}

/* ---- one constructor call ---- */

typedef struct {
    Checker *C;
    const XtfValue *call;
    const XtfCtor *ctor;
} Missing;

static int missing_visit(void *arg, const char *key, const XtfOption *o)
{
    Missing *m = arg;
    if (!o->def && o->status != XTF_FORBIDDEN && !find_arg(m->call, key))
        xtf_diag_error(m->C->d, m->C->f, m->call->loc, "%s requires option '%s'", m->ctor->name,
                       key);
    return 0;
}

static void unknown_option(Checker *C, const XtfCtor *c, const XtfArg *a)
{
    Suggest sg;
    suggest_init(&sg, a->key);
    xtf_option_each(c, suggest_visit, &sg);
    if (sg.name[0])
        xtf_diag_error(C->d, C->f, a->loc, "unknown option '%s' for %s; did you mean '%s'?",
                       a->key, c->name, sg.name);
    else
        xtf_diag_error(C->d, C->f, a->loc, "unknown option '%s' for %s", a->key, c->name);

    /* A right option in the wrong place: dim on TransformerWrapper, num_tokens on Decoder. */
    const char *owners[XTF_C_NUM];
    int n = 0;
    for (int i = 0; i < XTF_C_NUM; i++) {
        const XtfOption *o = xtf_option_find(&xtf_ctors[i], a->key);
        if (&xtf_ctors[i] != c && o && o->status != XTF_FORBIDDEN)
            owners[n++] = xtf_ctors[i].name;
    }
    char others[256], buf[160];
    size_t len = 0;
    others[0] = '\0';
    for (int i = 0; i < n; i++) {
        int w = snprintf(others + len, sizeof others - len, "%s%s",
                         i == 0 ? "" : i == n - 1 ? " and " : ", ", owners[i]);
        len += w > 0 ? (size_t)w : 0;
    }
    if (n)
        xtf_diag_note(C->d, C->f, (XtfLoc){0, 0, 0}, "'%s' is an option of %s", a->key, others);
    for (int r = 0; r < 2; r++) {
        const char *p = c->routes[r].prefix;
        if (p && xtf_option_find(c, with_prefix(buf, sizeof buf, p, a->key))) {
            xtf_diag_note(C->d, C->f, (XtfLoc){0, 0, 0},
                          "%s passes options to its encoder and decoder with the prefixes "
                          "'enc_' and 'dec_', as in 'enc_%s'", c->name, a->key);
            break;
        }
    }
}

/* An option xtc does not accept for the file's x-transformers version. */
static void wrong_version(Checker *C, const XtfArg *a, const XtfOption *o)
{
    char vs[96];
    const char *file_v = xt_versions[C->f->version].name;
    xt_version_list(xtf_option_versions(o), vs, sizeof vs);
    if (C->f->version == XT_V0_23)
        xtf_diag_error(C->d, C->f, a->loc,
                       "'%s' is not an option of x-transformers 0.23.0 (xtc takes it for %s: "
                       "state the version first, as in %s = \"%s\")",
                       a->key, vs, XT_VERSION_KEY, xt_versions[XT_V_NUM - 1].name);
    else
        xtf_diag_error(C->d, C->f, a->loc,
                       "'%s' is not supported for x-transformers %s (xtc takes it for %s)", a->key,
                       file_v, vs);
}

static void check_layers(Checker *C, const XtfValue *call, const char *prefix, int causal);

static void check_call(Checker *C, XtfValue *call)
{
    const XtfCtor *c = xtf_ctor_find(call->s);
    int before = C->d->nerrors;
    if (!c) {
        Suggest sg;
        suggest_init(&sg, call->s);
        for (int i = 0; i < XTF_C_NUM; i++)
            suggest_try(&sg, xtf_ctors[i].name);
        if (sg.name[0])
            xtf_diag_error(C->d, C->f, call->loc, "unknown constructor '%s'; did you mean '%s'?",
                           call->s, sg.name);
        else
            xtf_diag_error(C->d, C->f, call->loc, "unknown constructor '%s'", call->s);
    } else if (c->status == XTF_FORBIDDEN) {
        xtf_diag_error(C->d, C->f, call->loc, "'%s' cannot be written in .xtf; %s", c->name,
                       c->why);
    } else if (c->status == XTF_NOT_YET) {
        xtf_diag_error(C->d, C->f, call->loc, "'%s' is not supported yet", c->name);
    }
    if (!c || c->status == XTF_FORBIDDEN) {
        for (int i = 0; i < call->nargs; i++)
            check_value(C, call->args[i].value);
        return;
    }

    if (call->nargs > MAX_ARGS) {
        xtf_diag_error(C->d, C->f, call->loc, "%s is given %d options; the limit is %d", c->name,
                       call->nargs, MAX_ARGS);
        for (int i = 0; i < call->nargs; i++)
            check_value(C, call->args[i].value);
        return;
    }
    for (int i = 0; i < call->nargs; i++) {
        const XtfArg *a = &call->args[i];
        const XtfOption *o = xtf_option_find(c, a->key);
        const XtfArg *first = find_arg(call, a->key);
        int key_ok = 0;
        if (!o) {
            unknown_option(C, c, a);
        } else if (first != a) {
            xtf_diag_error(C->d, C->f, a->loc, "duplicate option '%s'", a->key);
            xtf_diag_note(C->d, C->f, first->loc, "'%s' was first given here", a->key);
        } else if (o->status == XTF_FORBIDDEN) {
            xtf_diag_error(C->d, C->f, a->loc, "'%s' cannot be set on %s: %s", a->key, c->name,
                           o->why);
        } else if (o->status == XTF_NOT_YET && c->status != XTF_NOT_YET) {
            xtf_diag_error(C->d, C->f, a->loc, "'%s' is not supported yet", a->key);
        } else if (!(xtf_option_versions(o) & XT_V_BIT(C->f->version))) {
            wrong_version(C, a, o);
        } else {
            key_ok = 1;
        }
        check_value(C, a->value);
        if (key_ok)
            check_option_value(C, a, o);
    }

    Missing m = {C, call, c};
    xtf_option_each(c, missing_visit, &m);

    if (C->d->nerrors != before)
        return; /* the combinations below assume every option is well typed */
    switch (c->id) {
    case XTF_C_DECODER: check_layers(C, call, "", 1); break;
    case XTF_C_ENCODER: check_layers(C, call, "", 0); break;
    case XTF_C_CROSS_ATTENDER: check_layers(C, call, "", xtf_bool(call, "causal")); break;
    case XTF_C_XTRANSFORMER:
        check_layers(C, call, "enc_", 0);
        check_layers(C, call, "dec_", 1);
        break;
    case XTF_C_VIT: {
        int64_t image = xtf_int(call, "image_size"), patch = xtf_int(call, "patch_size");
        if (patch > 0 && image % patch != 0)
            xtf_diag_error(C->d, C->f, find_arg(call, "image_size")->value->loc,
                           "image_size (%lld) must be a multiple of patch_size (%lld)",
                           (long long)image, (long long)patch);
        break;
    }
    default: break;
    }
}

/* ---- combinations of AttentionLayers options ---- */

/* Where to point for an option: its value if written, else the constructor. */
static XtfLoc where(const XtfValue *call, const char *key, int at_key)
{
    const XtfArg *a = find_arg(call, key);
    return a ? (at_key ? a->loc : a->value->loc) : call->loc;
}

/* Two boolean options that cannot both be true: the error goes to the one written later. */
static void exclusive(Checker *C, const XtfValue *call, const char *k1, const char *k2)
{
    if (!xtf_bool(call, k1) || !xtf_bool(call, k2))
        return;
    const XtfArg *a1 = find_arg(call, k1), *a2 = find_arg(call, k2);
    if (!a1 || !a2)
        return; /* both defaults true cannot happen; one default true is not a user error */
    const XtfArg *later = a1 > a2 ? a1 : a2, *earlier = a1 > a2 ? a2 : a1;
    xtf_diag_error(C->d, C->f, later->loc, "%s and %s are mutually exclusive", k1, k2);
    xtf_diag_note(C->d, C->f, earlier->loc, "'%s' is set here", earlier->key);
}

static void check_layers(Checker *C, const XtfValue *call, const char *prefix, int causal)
{
    char k1[96], k2[96], k3[96];
#define KEY(buf, name) with_prefix(buf, sizeof buf, prefix, name)

    exclusive(C, call, KEY(k1, "use_rmsnorm"), KEY(k2, "use_scalenorm"));
    exclusive(C, call, KEY(k1, "rel_pos_bias"), KEY(k2, "alibi_pos_bias"));

    const XtVersion *V = &xt_versions[C->f->version];
    exclusive(C, call, KEY(k1, "use_simple_rmsnorm"), KEY(k2, "use_rmsnorm"));
    exclusive(C, call, KEY(k1, "use_simple_rmsnorm"), KEY(k2, "use_scalenorm"));
    if (xtf_has(call, KEY(k1, "attn_kv_heads"))) {
        int64_t kvh = xtf_int(call, k1), heads = xtf_int(call, KEY(k2, "heads"));
        if (xtf_bool(call, KEY(k3, "attn_one_kv_head")))
            xtf_diag_error(C->d, C->f, where(call, k3, 1), "%s and %s are mutually exclusive", k1, k3);
        else if (heads % kvh != 0)
            xtf_diag_error(C->d, C->f, where(call, k1, 0), "%s (%lld) must divide %s (%lld)", k1,
                           (long long)kvh, k2, (long long)heads);
    }

    int64_t dim_head = xtf_int(call, KEY(k1, "attn_dim_head"));
    /* rotary_xpos turns rotary on (rotary_pos_emb or rotary_xpos); the checks below name
     * whichever of the two is written */
    KEY(k2, "rotary_pos_emb");
    if (!xtf_bool(call, k2) && xtf_bool(call, KEY(k3, "rotary_xpos")))
        KEY(k2, "rotary_xpos");
    if (xtf_bool(call, KEY(k3, "rotary_xpos")) && !causal)
        xtf_diag_error(C->d, C->f, where(call, k3, 1),
                       "%s needs causal attention (x-transformers: rotary xpos is not compatible "
                       "with bidirectional attention)", k3);
    if (xtf_bool(call, k2) && !V->rotary_min_dim) {
        /* 2.x: rotary_emb_dim or dim_head // 2, no floor */
        int64_t rd = xtf_has(call, KEY(k3, "rotary_emb_dim")) ? xtf_int(call, k3) : dim_head / 2;
        if (rd % 2 != 0 || rd < 2 || rd > dim_head)
            xtf_diag_error(C->d, C->f, where(call, xtf_has(call, k3) ? k3 : k1, 0),
                           "the rotary dimension (%lld: %s, or %s / 2) must be even, at least 2 and "
                           "at most %s (%lld)", (long long)rd, k3, k1, k1, (long long)dim_head);
    } else if (xtf_bool(call, k2)) {
        if (dim_head < 32) {
            xtf_diag_error(C->d, C->f, where(call, k1, 0),
                           "%s needs %s >= 32 (x-transformers fails on narrower heads), got %lld",
                           k2, k1, (long long)dim_head);
            xtf_diag_note(C->d, C->f, where(call, k2, 1), "'%s' is set here", k2);
        } else if (xtf_has(call, KEY(k3, "rotary_emb_dim"))) {
            int64_t rd = xtf_int(call, k3);
            if (rd % 2 != 0)
                xtf_diag_error(C->d, C->f, where(call, k3, 0), "%s must be even, got %lld", k3,
                               (long long)rd);
            else if (rd > dim_head)
                xtf_diag_error(C->d, C->f, where(call, k3, 0),
                               "%s (%lld) must not exceed %s (%lld)", k3, (long long)rd, k1,
                               (long long)dim_head);
        }
    }

    int64_t buckets = xtf_int(call, KEY(k1, "rel_pos_num_buckets"));
    int64_t distance = xtf_int(call, KEY(k2, "rel_pos_max_distance"));
    if (buckets > distance)
        xtf_diag_error(C->d, C->f, where(call, find_arg(call, k1) ? k1 : k2, 0),
                       "%s (%lld) must not exceed %s (%lld)", k1, (long long)buckets, k2,
                       (long long)distance);
    else if (!causal && buckets < 4 && xtf_bool(call, KEY(k3, "rel_pos_bias")))
        xtf_diag_error(C->d, C->f, where(call, k1, 0),
                       "%s must be >= 4 without causal masking (half of the buckets look "
                       "ahead, half back), got %lld", k1, (long long)buckets);

    if (xtf_bool(call, KEY(k1, "sandwich_norm")) && !xtf_bool(call, KEY(k2, "pre_norm")))
        xtf_diag_error(C->d, C->f, where(call, k1, 1), "%s needs %s = true", k1, k2);

    if (xtf_has(call, KEY(k1, "alibi_num_heads")) &&
        xtf_int(call, k1) > xtf_int(call, KEY(k2, "heads")))
        xtf_diag_error(C->d, C->f, where(call, k1, 0), "%s (%lld) must not exceed %s (%lld)", k1,
                       (long long)xtf_int(call, k1), k2, (long long)xtf_int(call, k2));

    double inner = (double)xtf_int(call, "dim") * xtf_float(call, KEY(k1, "ff_mult"));
    if (inner < 1)
        xtf_diag_error(C->d, C->f, where(call, k1, 0),
                       "%s is too small: the feed-forward width int(dim * %s) would be 0", k1, k1);
#undef KEY
}

/* ---- the file ---- */

/* xtransformers = "2.26.4": the version the file mirrors; first, so that it governs every model */
static void version_stmt(Checker *C, int i)
{
    const XtfStmt *s = &C->f->stmts[i];
    const XtfValue *v = s->value;
    int ver = v && v->kind == XV_STRING ? xt_version_find(v->s) : -1;
    if (i != 0) {
        xtf_diag_error(C->d, C->f, s->loc, "'%s' must be the first statement of the file",
                       XT_VERSION_KEY);
    } else if (ver < 0) {
        char vs[96];
        xt_version_list(XT_V_ALL, vs, sizeof vs);
        xtf_diag_error(C->d, C->f, v ? v->loc : s->loc,
                       "%s names the x-transformers version as a string: one of %s", XT_VERSION_KEY, vs);
    } else {
        C->f->version = ver;
    }
}

int xtf_check(XtfFile *f, XtfDiag *d)
{
    if (!f)
        return 0;
    Checker C;
    memset(&C, 0, sizeof C);
    C.f = f;
    C.d = d;
    int before = d->nerrors;
    if (map_init(&C.first, f->nstmts) || map_init(&C.last, f->nstmts) ||
        map_init(&C.visible, f->nstmts)) {
        xtf_diag_error(d, f, (XtfLoc){0, 0, 0}, "out of memory");
    } else {
        for (int i = 0; i < f->nstmts; i++) {
            int *slot = map_slot(&C.first, f, f->stmts[i].name);
            if (*slot < 0)
                *slot = i;
            *map_slot(&C.last, f, f->stmts[i].name) = i;
        }
        for (int i = 0; i < f->nstmts; i++) {
            C.current = i;
            if (strcmp(f->stmts[i].name, XT_VERSION_KEY) == 0) {
                version_stmt(&C, i);
                *map_slot(&C.visible, f, f->stmts[i].name) = i;
                continue;
            }
            const XtfStmt *s = &f->stmts[i];
            const XtfStmt *first = map_get(&C.first, f, s->name);
            if (strlen(s->name) > IR_MAX_NAME) /* it names the model's graph in the IR text */
                xtf_diag_error(d, f, s->loc, "the name is too long (%zu characters, at most %d)",
                               strlen(s->name), IR_MAX_NAME);
            if (first != s) {
                xtf_diag_error(d, f, s->loc, "'%s' is already defined", s->name);
                xtf_diag_note(d, f, first->loc, "'%s' was first defined here", s->name);
            }
            check_value(&C, s->value);
            *map_slot(&C.visible, f, s->name) = i;
        }
    }
    free(C.first.slots);
    free(C.last.slots);
    free(C.visible.slots);
    return d->nerrors - before;
}
