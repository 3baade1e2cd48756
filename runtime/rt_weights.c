/* rt_weights.c: a session's weights: set one by name (xtc_session_set_weight), initialise them all
 * from a seed (xtc_session_init_weights) and load them from a .safetensors file
 * (xtc_session_load_weights: every name checked first, everything converted, then committed). */
#include "rt_session.h"
#include "rt_quant.h"
#include "init.h"

#include <stdlib.h>
#include <string.h>

static int find_weight(const XtcModule *m, const char *name)
{
    int b = rs_find_buffer(m, RT_BUF_PARAM, name);
    return b >= 0 ? b : rs_find_buffer(m, RT_BUF_STATE, name);
}

static const RtAlias *find_alias(const XtcModule *m, const char *name)
{
    for (int i = 0; i < m->naliases; i++)
        if (strcmp(m->aliases[i].name, name) == 0)
            return &m->aliases[i];
    return NULL;
}

int xtc_session_set_weight(XtcSession *s, const char *name, int rank, const int64_t *shape, const float *data)
{
    if (!rs_ready(s, "xtc_session_set_weight"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!name || (rank > 0 && !shape) || rank < 0 || rank > XTC_MAX_RANK)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_set_weight: bad arguments");
    int b = find_weight(s->m, name);
    const RtAlias *alias = b < 0 ? find_alias(s->m, name) : NULL;
    if (alias)
        return rs_fail(s, XTC_ERR_NAME, "'%s' is tied to '%s': set that one", name, s->m->bufs[alias->buf].name);
    if (b < 0)
        return rs_fail(s, XTC_ERR_NAME, "the model has no parameter or buffer named '%s'", name);
    int st = rs_check_shape(s, &s->m->bufs[b], "weight", rank, shape);
    if (st)
        return st;
    size_t bytes = (size_t)rs_numel_of(rank, shape) * sizeof(float);
    if (s->m->bufs[b].dtype == XTC_I8) { /* an int8 weight: quantized, with its scales (rt_quant.c) */
        if (bytes && !data)
            return rs_fail(s, XTC_ERR_ARG, "weight '%s': no data", name);
        return rt_quant_set(s, b, data);
    }
    float *copy = rt_malloc(bytes ? bytes : 1);
    if (!copy)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for weight '%s'", name);
    if (bytes && !data) {
        free(copy);
        return rs_fail(s, XTC_ERR_ARG, "weight '%s': no data", name);
    }
    if (bytes)
        memcpy(copy, data, bytes);
    rs_bind_buffer(s, b, copy, rank, shape);
    return XTC_OK;
}

int xtc_session_init_weights(XtcSession *s, uint64_t seed)
{
    if (!rs_ready(s, "xtc_session_init_weights"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    /* the order of xtc init (cli/cmd_compile.c): parameters, then state buffers, each drawing
     * from one generator, so that the same seed gives the same values */
    RtRng rng;
    rt_rng_seed(&rng, seed);
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(s->m, (XtcKind)kind); i++) {
            XtcTensorInfo t;
            xtc_module_tensor(s->m, (XtcKind)kind, i, &t);
            if (s->m->bufs[s->m->by_kind[kind == XTC_PARAM ? RT_BUF_PARAM : RT_BUF_STATE][i]].qweight >= 0)
                continue; /* the scales of an int8 weight: set with it */
            int64_t n = rs_numel_of(t.rank, t.shape);
            float *data = rt_malloc((size_t)(n ? n : 1) * sizeof *data);
            if (!data)
                return rs_fail(s, XTC_ERR_MEMORY, "out of memory for weight '%s'", t.name);
            rt_init_module_param(s->m, t.name, t.rank, t.shape, data, &rng);
            int st = xtc_session_set_weight(s, t.name, t.rank, t.shape, data);
            free(data);
            if (st)
                return st;
        }
    return XTC_OK;
}

/* Appends an item to a comma-separated list, counting what does not fit. */
static void list_add(char *list, size_t n, int *count, const char *item)
{
    size_t len = strlen(list);
    if (*count < 6 && len + strlen(item) + 8 < n)
        snprintf(list + len, n - len, "%s%s", len ? ", " : "", item);
    else if (*count == 6)
        snprintf(list + len, n - len, ", ...");
    (*count)++;
}

/* int8 weights in a weights file: whether weight buffer w is there as I8 (then with its scales) */
static int file_has_i8(const RtStFile *f, const XtcModule *m, int w)
{
    const RtStTensor *t = rt_st_find(f, m->bufs[w].name);
    return t && t->dtype == RT_I8;
}

/* the file says (xtc.quant_group, written by xtc quantize) that int8 weight b was quantized in
 * other groups than the module reads */
static int quant_group_differs(const RtStFile *f, const XtcModule *m, const RtBuffer *b)
{
    const char *g = rt_st_metadata(f, "xtc.quant_group");
    char *end;
    long long v = g ? strtoll(g, &end, 10) : 0;
    if (!g || *end || v < 0)
        return 0;
    (void)m;
    return rt_quant_group_of(v, b->shape[1].c) != b->qgroup;
}

/* fresh[b] (and fresh[scales] for f32 values) of int8 weight b from the file: I8 as it is, other
 * floats quantized (rt_quant.c) */
static int load_int8(XtcSession *s, const RtStFile *f, const char *path, int b, void **fresh)
{
    const XtcModule *m = s->m;
    const RtStTensor *t = rt_st_find(f, m->bufs[b].name);
    int64_t n = rt_st_numel(t), ns = rs_numel_of(2, (int64_t[]){m->bufs[m->bufs[b].qscale].shape[0].c,
                                                                  m->bufs[m->bufs[b].qscale].shape[1].c});
    if (!(fresh[b] = rt_malloc(n ? (size_t)n : 1)))
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory loading '%s'", t->name);
    if (t->dtype == RT_I8) {
        memcpy(fresh[b], t->data, (size_t)n);
        return XTC_OK;
    }
    char msg[512];
    float *w = rt_malloc(n ? (size_t)n * sizeof *w : 1);
    if (!w || !(fresh[m->bufs[b].qscale] = rt_malloc(ns ? (size_t)ns * sizeof(float) : 1))) {
        free(w);
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory loading '%s'", t->name);
    }
    int st = XTC_OK;
    if (rt_st_to_f32(t, w, msg, sizeof msg))
        st = rs_fail(s, XTC_ERR_FORMAT, "%s: '%s': %s", path, t->name, msg);
    else if (rt_quant_fill(m, b, w, fresh[b], fresh[m->bufs[b].qscale], msg, sizeof msg))
        st = rs_fail(s, XTC_ERR_RANGE, "%s: %s", path, msg);
    free(w);
    return st;
}

int xtc_session_load_weights(XtcSession *s, const char *path)
{
    if (!rs_ready(s, "xtc_session_load_weights"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!path)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_load_weights: no path");
    const XtcModule *m = s->m;
    RtStFile *f;
    char msg[512];
    int st = rt_st_open(path, &f, msg, sizeof msg);
    if (st)
        return rs_fail(s, st == RT_ST_ENOMEM ? XTC_ERR_MEMORY : st == RT_ST_EIO ? XTC_ERR_IO : XTC_ERR_FORMAT,
                    "%s", msg);
    char missing[400] = "", extra[400] = "", wrong[600] = "";
    int nmissing = 0, nextra = 0, nwrong = 0;
    for (int k = RT_BUF_PARAM; k <= RT_BUF_STATE; k++)
        for (int i = 0; i < m->nby_kind[k]; i++) {
            const RtBuffer *b = &m->bufs[m->by_kind[k][i]];
            const RtStTensor *t = rt_st_find(f, b->name);
            char item[400];
            if (b->qweight >= 0 && !file_has_i8(f, m, b->qweight)) { /* scales: only with an I8 weight */
                const RtStTensor *wt = rt_st_find(f, m->bufs[b->qweight].name);
                int float_weight = wt && (wt->dtype == RT_F32 || wt->dtype == RT_F64 || wt->dtype == RT_F16 ||
                                          wt->dtype == RT_BF16);
                if (t && float_weight) { /* (a weight of another type is reported as such) */
                    snprintf(item, sizeof item, "'%s' is given but '%s' is not I8 (f32 weights are quantized as they "
                             "load)", b->name, m->bufs[b->qweight].name);
                    list_add(wrong, sizeof wrong, &nwrong, item);
                }
                continue;
            }
            if (!t) {
                snprintf(item, sizeof item, "'%s'", b->name);
                list_add(missing, sizeof missing, &nmissing, item);
                continue;
            }
            int ok = (t->dtype == RT_F32 || t->dtype == RT_F64 || t->dtype == RT_F16 || t->dtype == RT_BF16 ||
                      (t->dtype == RT_I8 && b->dtype == XTC_I8)) &&
                     rs_shape_problem(s, b, "weight", t->rank, t->shape, item, sizeof item) == XTC_OK;
            if (!ok) {
                char want[128], got[128];
                rs_dims_text(want, sizeof want, b);
                rs_shape_text(got, sizeof got, t->rank, t->shape);
                snprintf(item, sizeof item, "'%s' is %s %s, expected %s %s", b->name, rt_dtype_name(t->dtype), got,
                         b->dtype == XTC_I8 ? "I8 (with its scales) or f32" : "f32", want);
                list_add(wrong, sizeof wrong, &nwrong, item);
            } else if (t->dtype == RT_I8 && quant_group_differs(f, m, b)) {
                snprintf(item, sizeof item, "'%s' was quantized in groups of %s along k, the module's are of %lld", b->name,
                         rt_st_metadata(f, "xtc.quant_group"), (long long)b->qgroup);
                list_add(wrong, sizeof wrong, &nwrong, item);
            }
        }
    /* tied names: present, and holding the same values as the tensor they name again */
    for (int i = 0; i < m->naliases; i++) {
        const RtAlias *a = &m->aliases[i];
        const RtStTensor *t = rt_st_find(f, a->name), *u = rt_st_find(f, m->bufs[a->buf].name);
        char item[400];
        if (!t) {
            snprintf(item, sizeof item, "'%s' (tied to '%s')", a->name, m->bufs[a->buf].name);
            list_add(missing, sizeof missing, &nmissing, item);
        } else if (u && (t->nbytes != u->nbytes || t->dtype != u->dtype || memcmp(t->data, u->data, t->nbytes))) {
            snprintf(item, sizeof item, "'%s' is tied to '%s' but holds other values", a->name,
                     m->bufs[a->buf].name);
            list_add(wrong, sizeof wrong, &nwrong, item);
        }
    }
    for (int i = 0; i < rt_st_count(f); i++) {
        const RtStTensor *t = rt_st_get(f, i);
        const char *of = rt_optim_state_param(t->name); /* a checkpoint's optimizer state: ignored */
        int b = of ? find_weight(m, of) : -1;
        if (b >= 0 && (m->bufs[b].kind == RT_BUF_PARAM || m->bufs[b].dtype == XTC_I8)) /* (an int8 weight was one) */
            continue;
        if (find_weight(m, t->name) < 0 && !find_alias(m, t->name)) {
            char item[300];
            snprintf(item, sizeof item, "'%s'", t->name);
            list_add(extra, sizeof extra, &nextra, item);
        }
    }
    if (nmissing || nextra || nwrong) {
        size_t len = (size_t)snprintf(s->err, sizeof s->err, "%s:", path);
        if (nmissing)
            len += (size_t)snprintf(s->err + len, sizeof s->err - len, " %d missing (%s);", nmissing, missing);
        if (nwrong && len < sizeof s->err)
            len += (size_t)snprintf(s->err + len, sizeof s->err - len, " %d mis-shaped (%s);", nwrong, wrong);
        if (nextra && len < sizeof s->err)
            snprintf(s->err + len, sizeof s->err - len, " %d not in the model (%s);", nextra, extra);
        rt_st_close(f);
        return XTC_ERR_NAME;
    }
    /* convert everything first, then commit, so a failure changes nothing */
    void **fresh = rt_calloc((size_t)m->nbufs + 1, sizeof *fresh);
    if (!fresh) {
        rt_st_close(f);
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory loading %s", path);
    }
    st = XTC_OK;
    for (int k = RT_BUF_PARAM; k <= RT_BUF_STATE && !st; k++)
        for (int i = 0; i < m->nby_kind[k] && !st; i++) {
            int b = m->by_kind[k][i];
            if (m->bufs[b].qweight >= 0 && !file_has_i8(f, m, m->bufs[b].qweight))
                continue; /* computed with its weight */
            const RtStTensor *t = rt_st_find(f, m->bufs[b].name);
            if (m->bufs[b].dtype == XTC_I8)
                st = load_int8(s, f, path, b, fresh);
            else if (!(fresh[b] = rt_malloc(rt_st_numel(t) ? (size_t)rt_st_numel(t) * sizeof(float) : 1)))
                st = rs_fail(s, XTC_ERR_MEMORY, "out of memory loading '%s'", t->name);
            else if (rt_st_to_f32(t, fresh[b], msg, sizeof msg))
                st = rs_fail(s, XTC_ERR_FORMAT, "%s: '%s': %s", path, t->name, msg);
        }
    for (int b = 0; b < m->nbufs; b++) {
        if (!fresh[b])
            continue;
        if (st) {
            free(fresh[b]);
        } else {
            int64_t shape[XTC_MAX_RANK]; /* weights have constant shapes (shape_problem checked the file's) */
            for (int d = 0; d < m->bufs[b].rank; d++)
                shape[d] = m->bufs[b].shape[d].c;
            rs_bind_buffer(s, b, fresh[b], m->bufs[b].rank, shape);
        }
    }
    free(fresh);
    rt_st_close(f);
    return st;
}
