/* access.c: reading options off a checked constructor call. An option the user did not write
 * yields the default from the option table (options.c), so the lowering never repeats a
 * default; references to earlier statements are followed. Every accessor is total: a NULL call,
 * an unknown option or a value of another kind gives 0 / NULL rather than a crash. */
#include <string.h>

#include "options.h"
#include "xtf_internal.h"

static const XtfValue *follow(const XtfValue *v)
{
    /* References are resolved by xtf_check to the final value; an unresolved one is NULL. */
    return v && v->kind == XV_REF ? v->ref : v;
}

const XtfValue *xtf_arg(const XtfValue *call, const char *key)
{
    if (!call || call->kind != XV_CALL || !key)
        return NULL;
    for (int i = 0; i < call->nargs; i++)
        if (call->args[i].key && strcmp(call->args[i].key, key) == 0)
            return follow(call->args[i].value);
    return NULL;
}

const XtfValue *xtf_value(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_arg(call, key);
    if (v || !call || call->kind != XV_CALL)
        return v;
    const XtfOption *o = xtf_option_find(xtf_ctor_find(call->s), key);
    return o ? o->def : NULL;
}

int xtf_has(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    return v && v->kind != XV_NONE;
}

int64_t xtf_int(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    if (!v)
        return 0;
    switch (v->kind) {
    case XV_INT: return v->i;
    case XV_BOOL: return v->b;
    case XV_FLOAT: return v->f >= -9.2e18 && v->f <= 9.2e18 ? (int64_t)v->f : 0;
    default: return 0;
    }
}

double xtf_float(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    if (!v)
        return 0;
    switch (v->kind) {
    case XV_INT: return (double)v->i;
    case XV_FLOAT: return v->f;
    case XV_BOOL: return v->b;
    default: return 0;
    }
}

int xtf_bool(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    if (!v)
        return 0;
    switch (v->kind) {
    case XV_BOOL: return v->b;
    case XV_INT: return v->i != 0;
    case XV_FLOAT: return v->f != 0;
    default: return 0;
    }
}

const char *xtf_string(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    return v && v->kind == XV_STRING ? v->s : NULL;
}

const XtfValue *xtf_callv(const XtfValue *call, const char *key)
{
    const XtfValue *v = xtf_value(call, key);
    return v && v->kind == XV_CALL ? v : NULL;
}

const XtfStmt *xtf_find(const XtfFile *f, const char *name)
{
    if (!f || !name)
        return NULL;
    /* The last definition wins, as in Python; xtf_check refuses duplicates anyway. */
    for (int i = f->nstmts - 1; i >= 0; i--)
        if (f->stmts[i].name && strcmp(f->stmts[i].name, name) == 0)
            return &f->stmts[i];
    return NULL;
}
