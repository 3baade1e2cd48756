/* rt_carry.c: limits on sums of symbols (a KV cache's c+n <= max_seq_len), limits on the row
 * norms of a cosine-sim key cache, carrying outputs into inputs (xtc_session_carry: KV caches on
 * the host and on a device) and a device module's outputs left on the device until read. */
#include "rt_session.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- limits on sums of symbols (m->limit_def: a KV cache's c+n <= max_seq_len) ---- */

/* The symbol a dimension is exactly (sym + constant), or -1. */
static int plain_sym(const XtcModule *m, const RtDim *d)
{
    int sym = -1;
    for (int k = 0; k < m->nsyms; k++)
        if (d->k[k] == 1 && sym < 0)
            sym = k;
        else if (d->k[k])
            return -1;
    return sym;
}

/* The input that gives symbol k its value in syms (one with a dimension that is k plus a
 * constant, bound to that value), for messages: "" when none. Buffer b has shape (else its
 * bound one). */
static const char *sym_source(const XtcSession *s, int k, const int64_t *syms, int b, const int64_t *shape)
{
    const XtcModule *m = s->m;
    for (int i = 0; i < m->nby_kind[RT_BUF_INPUT]; i++) {
        int ib = m->by_kind[RT_BUF_INPUT][i];
        const int64_t *sh = ib == b ? shape : s->set[ib] ? s->shape[ib] : NULL;
        for (int d = 0; sh && d < m->bufs[ib].rank; d++)
            if (plain_sym(m, &m->bufs[ib].shape[d]) == k && sh[d] - m->bufs[ib].shape[d].c == syms[k])
                return m->bufs[ib].name;
    }
    return "";
}

/* Checks the limits whose symbols are all known (known NULL: all are) at the values syms; with
 * the session's error set, XTC_ERR_RANGE naming the form, its value and each symbol's value and
 * the input it comes from. Buffer b (or -1) is being bound with shape. */
int rs_check_limits(XtcSession *s, const int64_t *syms, const int *known, int b, const int64_t *shape)
{
    const XtcModule *m = s->m;
    for (int l = 0; l < m->nlimits; l++) {
        const RtDim *d = &m->limit_def[l];
        int all = 1;
        for (int k = 0; k < m->nsyms && known; k++)
            all &= !d->k[k] || known[k];
        int64_t v = rt_dim_eval(d, syms);
        if (!all || v <= m->limit_max[l])
            continue;
        char parts[400] = "";
        size_t len = 0;
        for (int k = 0; k < m->nsyms && len < sizeof parts; k++) {
            if (!d->k[k])
                continue;
            const char *from = sym_source(s, k, syms, b, shape);
            len += (size_t)snprintf(parts + len, sizeof parts - len, "%s%s = %lld%s%s%s", len ? ", " : "",
                                    m->sym_name[k], (long long)syms[k], *from ? " (input '" : "", from,
                                    *from ? "')" : "");
        }
        return rs_fail(s, XTC_ERR_RANGE, "%s = %lld exceeds %lld (the model's max_seq_len): %s", m->limit_text[l],
                    (long long)v, (long long)m->limit_max[l], parts);
    }
    return XTC_OK;
}

/* The limits before binding input b with shape: over the symbols that b and the inputs bound
 * since the last run give (older bindings may be about to change: a new prompt of a session
 * whose cache is still the last one's). The run checks them all again. */
int rs_check_limits_early(XtcSession *s, int b, const int64_t *shape)
{
    const XtcModule *m = s->m;
    if (!m->nlimits)
        return XTC_OK;
    int64_t syms[RT_MAXSYM] = {0};
    int known[RT_MAXSYM] = {0}, conflict[RT_MAXSYM] = {0};
    for (int i = 0; i < m->nby_kind[RT_BUF_INPUT]; i++) {
        int ib = m->by_kind[RT_BUF_INPUT][i];
        const int64_t *sh = ib == b ? shape : s->fresh[ib] && s->set[ib] ? s->shape[ib] : NULL;
        for (int d = 0; sh && d < m->bufs[ib].rank; d++) {
            int k = plain_sym(m, &m->bufs[ib].shape[d]);
            int64_t v = k >= 0 ? sh[d] - m->bufs[ib].shape[d].c : 0;
            if (k < 0 || m->sym_derived[k])
                continue;
            conflict[k] |= known[k] && syms[k] != v; /* half rebound: the run decides */
            syms[k] = v;
            known[k] = 1;
        }
    }
    for (int k = 0; k < RT_MAXSYM; k++)
        known[k] &= !conflict[k];
    return rs_check_limits(s, syms, known, b, shape);
}


/* ---- row norms of inputs a bound relies on (rs_check_row_norms) ---- */

/* A bf16 row of norm 1 rounds to at most 1 + 2^-8, an int8 row with its scale max|x| / 127 to
 * about 1 + sqrt(D) / 254 (1.045 at D = 128): a cache the module wrote and the caller read back
 * stays within the slack. A row above it by a factor r adds (r - 1) b s to the scores over the
 * maximum the kernels assume: at r = 1.125, b s <= 40, exp(5) at most, no overflow. */
int rs_check_row_norms(XtcSession *s, int b, int rank, const int64_t *shape, const float *x)
{
    const RtBuffer *buf = &s->m->bufs[b];
    if (!(buf->row_norm > 0) || rank < 1)
        return XTC_OK;
    int64_t d = shape[rank - 1], rows = d ? rs_numel_of(rank, shape) / d : 0;
    double lim = buf->row_norm * RS_ROW_NORM_SLACK;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < d; j++)
            ss += (double)x[r * d + j] * x[r * d + j];
        if (!(sqrt(ss) <= lim))
            return rs_fail(s, XTC_ERR_RANGE, "input '%s': row %lld has L2 norm %g, above the %g the model's cosine-sim "
                           "attention relies on (a KV cache holds the keys it normalised)", buf->name, (long long)r,
                           sqrt(ss), buf->row_norm);
    }
    return XTC_OK;
}

/* ---- carrying outputs into inputs (KV caches) ---- */

/* the index of the output named name, or -1 */
int rs_find_output(const XtcModule *m, const char *name)
{
    for (int i = 0; i < m->nouts; i++)
        if (!strcmp(m->outs[i].name, name))
            return i;
    return -1;
}

/* whether an output of the last run lies in memory p */
static int output_in(const XtcSession *s, const void *p)
{
    for (int o = 0; p && o < s->m->nouts; o++)
        if (s->ptr[s->m->outs[o].buf] == p)
            return 1;
    return 0;
}

/* Whether output buffer ob is the concatenation of input buffer ib and more, along an axis that
 * only dimensions of size 1 precede: ib's value is then the first bytes of ob's, and a run may
 * write ob in place over ib's memory (the concat kernel skips copying its first operand onto
 * itself), as a KV cache grows by the new positions at its end. */
int rs_appends_to(const XtcSession *s, int ob, int ib, const int64_t *syms)
{
    const XtcModule *m = s->m;
    const RtStep *st = NULL;
    for (int i = 0; i < m->nsteps; i++)
        if (m->steps[i].out == ob) {
            if (st) /* written by two steps: not just the concatenation */
                return 0;
            st = &m->steps[i];
        }
    if (!st || strcmp(st->op, "concat") || st->in[0] != ib)
        return 0;
    const RtBuffer *o = &m->bufs[ob];
    for (int d = 0; d < o->rank; d++) {
        int64_t size = rt_dim_eval(&o->shape[d], syms);
        if (size != s->shape[ib][d]) /* the concat axis: all before it are 1 */
            return 1;
        if (size != 1)
            return 0;
    }
    return 1;
}

/* The outputs carried by xtc_session_carry are written to their spare memory, not the arena, so
 * that the next carry hands that memory to the input without copying (host modules); an output
 * that appends to the input it was carried into is written in place over that input's memory
 * when it has room (appends_to). */
int rs_place_carried(XtcSession *s, const int64_t *syms)
{
    if (!s->carried)
        return XTC_OK;
    for (int i = 0; i < s->m->nbufs; i++) {
        if (!s->carried[i])
            continue;
        size_t need = rs_buffer_bytes(&s->m->bufs[i], s->host.elem[i], syms);
        int ib = s->carried[i] - 1, taken = 0;
        for (int e = 0; e < i; e++) /* one output per input's memory */
            taken |= s->carried[e] && s->ptr[e] == s->own[ib];
        if (s->own[ib] && s->own_cap[ib] >= need && !taken && rs_appends_to(s, i, ib, syms)) {
            s->ptr[i] = s->own[ib];
            continue;
        }
        if (need > s->spare_cap[i]) { /* a cache grows by a row a call: room to grow (rs_headroom) */
            size_t cap = (size_t)rs_headroom((int64_t)need) + 64;
            free(s->spare[i]);
            s->spare[i] = rt_malloc(cap);
            s->spare_cap[i] = s->spare[i] ? cap : 0;
            if (!s->spare[i]) {
                const char *name = s->m->bufs[i].name;
                for (int o = 0; o < s->m->nouts; o++)
                    if (s->m->outs[o].buf == i)
                        name = s->m->outs[o].name;
                return rs_fail(s, XTC_ERR_MEMORY, "out of memory for output '%s'", name);
            }
        }
        s->ptr[i] = s->spare[i];
    }
    return XTC_OK;
}


/* The per-buffer arrays of outputs left on the device (s->lazy and its companions), allocated
 * on first use: 0, or -1 when out of memory. */
int rs_lazy_alloc(XtcSession *s)
{
    if (s->lazy)
        return 0;
    size_t nb = (size_t)s->m->nbufs + 1;
    s->lazy = rt_calloc(nb, 1);
    s->fetched = rt_calloc(nb, 1);
    s->into = rt_calloc(nb, sizeof *s->into);
    s->place = rt_calloc(nb, sizeof *s->place);
    if (!s->lazy || !s->fetched || !s->into || !s->place) {
        free(s->lazy), free(s->fetched), free(s->into), free(s->place);
        s->lazy = s->fetched = NULL;
        s->into = s->place = NULL;
        return -1;
    }
    return 0;
}

/* A device module's runs leave every output on the device: the session copies one to the host
 * when it is read (rs_output_on_host: xtc_session_get_output, the host optimizer's and the
 * communicator's gradients, the loss scaler's unscaling), so that a training step or a forward
 * whose caller reads only the loss or the last position's logits does not move the rest across
 * the bus. XTC_EAGER_OUTPUTS=1 in the environment when the session is created copies every output
 * after each run instead (for comparisons). 0, or -1 when out of memory. */
int rs_lazy_outputs(XtcSession *s)
{
    const char *eager = getenv("XTC_EAGER_OUTPUTS");
    if (eager && *eager && strcmp(eager, "0") != 0)
        return 0;
    if (rs_lazy_alloc(s))
        return -1;
    for (int o = 0; o < s->m->nouts; o++)
        if (s->m->bufs[s->m->outs[o].buf].kind == RT_BUF_TEMP)
            s->lazy[s->m->outs[o].buf] = 1;
    return 0;
}

/* The host copy of output buffer b of the last run: copied from the device first when the run
 * left it there (every output of a device module, see rs_lazy_outputs), once per run. */
int rs_output_on_host(XtcSession *s, int b, const char *name)
{
    if (!s->lazy || !s->lazy[b] || s->fetched[b])
        return XTC_OK;
    char msg[sizeof s->err];
    int r = s->m->device->fetch(s->dev, b, s->ptr[b], s->syms, s->pool, msg, sizeof msg);
    if (r < 0)
        return rs_fail(s, r == -2 ? XTC_ERR_MEMORY : XTC_ERR_IO, "output '%s': %s", name, msg);
    s->fetched[b] = 1;
    return XTC_OK;
}

/* xtc_session_carry of output oi into input ib of a device module, on the device (its carry):
 * XTC_OK, an error status, or -1 when the device cannot (then the carry copies through the host).
 * For f32 outputs of the arena into f32 inputs (no index inputs, whose values are range-checked
 * on the host), and not in fp16 training (the loss scaler reads gradient outputs on the host). */
static int device_carry(XtcSession *s, int oi, int ib)
{
    const XtcModule *m = s->m;
    const RtOutput *o = &m->outs[oi];
    const RtBuffer *in = &m->bufs[ib];
    if (!s->dev || !m->device->carry || !s->outputs_valid || m->bufs[o->buf].kind != RT_BUF_TEMP ||
        o->dtype != XTC_F32 || in->dtype != XTC_F32 || s->scaler.buf >= 0)
        return -1;
    int64_t shape[XTC_MAX_RANK];
    for (int d = 0; d < o->rank; d++)
        shape[d] = rt_dim_eval(&o->shape[d], s->syms);
    int st = rs_check_shape(s, in, "input", o->rank, shape);
    if (!st)
        st = rs_check_limits_early(s, ib, shape);
    if (st)
        return st;
    if (rs_lazy_alloc(s))
        return -1;
    int ob = o->buf;
    char msg[sizeof s->err];
    int r = m->device->carry(s->dev, ob, ib, s->syms, msg, sizeof msg);
    if (r > 0)
        return -1;
    if (r < 0) { /* the input's device copy may be gone, and its host copy is stale: unset */
        s->set[ib] = 0;
        return rs_fail(s, r == -2 ? XTC_ERR_MEMORY : XTC_ERR_IO, "carrying output '%s' into input '%s': %s", o->name,
                    in->name, msg);
    }
    /* the input's value is its device copy now (the host one is stale, and not uploaded again
     * until the input is set) */
    s->set[ib] = 1;
    s->fresh[ib] = 1;
    s->changed[ib] = 0;
    for (int d = 0; d < o->rank; d++)
        s->shape[ib][d] = shape[d];
    s->lazy[ob] = 1;
    s->into[ob] = ib + 1;
    return XTC_OK;
}

int xtc_session_carry(XtcSession *s, const char *output, const char *input)
{
    if (!rs_ready(s, "xtc_session_carry"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!output || !input)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_carry: bad arguments");
    const XtcModule *m = s->m;
    int oi = rs_find_output(m, output);
    if (oi < 0)
        return rs_fail(s, XTC_ERR_NAME, "the model has no output named '%s'", output);
    int ib = rs_find_buffer(m, RT_BUF_INPUT, input);
    if (ib < 0)
        return rs_fail(s, XTC_ERR_NAME, "the model has no input named '%s'", input);
    if (m->bufs[ib].row_norm > 0 && strcmp(output, input))
        return rs_fail(s, XTC_ERR_ARG, "input '%s' holds rows of L2 norm <= %g (cosine-sim attention relies on it): "
                       "only output '%s' carries into it", input, m->bufs[ib].row_norm, input);
    s->carries = 1; /* a decoding session: its arenas get headroom (xtc_session_run) */
    int st = device_carry(s, oi, ib);
    if (st >= 0)
        return st;
    XtcTensor t;
    st = rs_get_output(s, output, &t, 0); /* a KV cache stored in bf16 as it is (rt_store.c) */
    if (st)
        return st;
    const RtBuffer *in = &m->bufs[ib];
    int ob = m->outs[oi].buf;
    /* the output's bytes can become the input's: both f32, or both stored in bf16 */
    int same = s->dev || m->bufs[ob].storage == in->storage;
    if (t.dtype != in->dtype)
        return rs_fail(s, XTC_ERR_SHAPE, "carrying output '%s' (%s) into input '%s' (%s)", output,
                    xtc_dtype_name(t.dtype), input, xtc_dtype_name(in->dtype));
    if ((st = rs_check_shape(s, in, "input", t.rank, t.shape)) || (st = rs_check_limits_early(s, ib, t.shape)))
        return st;
    if (s->carried && s->carried[ob] == ib + 1 && s->ptr[ob] == s->own[ib]) {
        /* written in place over the input (place_carried): the input only grows */
        for (int d = 0; d < t.rank; d++)
            s->shape[ib][d] = t.shape[d];
        s->fresh[ib] = 1;
        if (s->changed)
            s->changed[ib] = 1;
        s->outputs_valid = 1;
        return XTC_OK;
    }
    if (s->carried && s->carried[ob] && s->ptr[ob] == s->spare[ob]) {
        /* the output's memory becomes the input's, the input's old memory the next spare */
        void *old = s->own[ib];
        size_t oldcap = s->own_cap[ib] ? s->own_cap[ib] : rs_stored_bytes(m, ib, in->rank, s->shape[ib]);
        size_t cap = s->spare_cap[ob];
        s->own[ib] = NULL;
        rs_bind_buffer(s, ib, s->spare[ob], t.rank, t.shape);
        s->own_cap[ib] = cap;
        s->spare[ob] = old;
        s->spare_cap[ob] = old ? oldcap : 0;
        s->outputs_valid = 1; /* the other outputs are untouched, this one is the input's value now */
        return XTC_OK;
    }
    /* the first time (or a device module, or an output that is not an activation): a copy. The
     * outputs stay readable unless one of them was in the input's memory, which this frees (the
     * same output carried twice without a run between). */
    int kept = !output_in(s, s->own[ib]);
    if (same && in->storage && !s->dev) { /* bf16 into bf16, int8 rows into int8 rows: the stored bytes */
        size_t bytes = rs_stored_bytes(m, ib, t.rank, t.shape);
        void *copy = rt_malloc(bytes ? bytes : 1);
        if (!copy)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for input '%s'", input);
        if (bytes)
            memcpy(copy, t.data, bytes);
        rs_bind_buffer(s, ib, copy, t.rank, t.shape);
    } else if ((!same && (st = rs_get_output(s, output, &t, 1))) ||
               (st = xtc_session_set_input(s, input, t.dtype, t.rank, t.shape, t.data))) {
        return st;
    }
    s->outputs_valid = kept;
    if (s->dev || m->bufs[ob].kind != RT_BUF_TEMP || !same)
        return XTC_OK;
    if (!s->carried) { /* without these the carries stay copies: still correct */
        size_t nb = (size_t)m->nbufs;
        s->carried = rt_calloc(nb, sizeof *s->carried);
        s->spare = rt_calloc(nb, sizeof *s->spare);
        s->spare_cap = rt_calloc(nb, sizeof *s->spare_cap);
        s->own_cap = rt_calloc(nb, sizeof *s->own_cap);
        if (!s->carried || !s->spare || !s->spare_cap || !s->own_cap) {
            free(s->carried), free(s->spare), free(s->spare_cap), free(s->own_cap);
            s->carried = NULL, s->spare = NULL, s->spare_cap = s->own_cap = NULL;
            return XTC_OK;
        }
    }
    s->carried[ob] = ib + 1;
    return XTC_OK;
}

