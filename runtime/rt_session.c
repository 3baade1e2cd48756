/* rt_session.c: sessions: creation, weights, inputs, symbol binding, running a module's schedule
 * and handing out its outputs (the session half of include/xtc.h). Setting and loading weights
 * is in rt_weights.c, the memory plan in rt_arena.c, limits and carries in rt_carry.c, loss scaling in rt_scaler.c (rt_session.h).
 *
 * Memory: inputs, parameters and state buffers live in allocations of their own. Every
 * intermediate value and output lives in one arena per session, at offsets chosen from the
 * buffers' lifetimes (the schedule steps that write them first and read them last): two buffers
 * share bytes only when their lifetimes do not overlap. The plan is made for given symbol values
 * (the session's limits, or the sizes seen so far) and redone, growing the arena, when a run
 * needs more.
 *
 * A device module (m->device) runs its schedule in the device's memory: its temps are laid out
 * by the same planner in a device arena, each at its size there (RtDeviceOps.elem_bytes: 2
 * bytes per element for a CUDA module's 16-bit storage), whose offsets the device receives. The
 * host arena of such a session holds only the outputs, in f32, where the device copies them
 * back. */
#include "rt_session.h"
#include "rt_quant.h"
#include "init.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int rs_fail(XtcSession *s, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return status;
}

static int64_t sym_bound(const XtcSession *s, int sym)
{
    int64_t b = s->m->sym_max[sym];
    if (s->cap[sym] > 0 && (b == 0 || s->cap[sym] < b))
        b = s->cap[sym];
    return b;
}

/* ---- creation ---- */

int xtc_session_new(const XtcModule *m, const XtcSessionOptions *opts, XtcSession **out)
{
    if (!out)
        return XTC_ERR_ARG;
    XtcSession *s = rt_calloc(1, sizeof *s);
    *out = s;
    if (!s)
        return XTC_ERR_MEMORY;
    if (!m || !m->abi)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_new: no loaded module");
    s->m = m;
    s->scaler.buf = -1; /* until scaler_init finds the loss-scale input */
    s->targets = rs_find_buffer(m, RT_BUF_INPUT, "targets");
    XtcSessionOptions o = {0};
    if (opts)
        o = *opts;
    if (o.threads == XTC_THREADS_AUTO)
        o.threads = rt_cpus_available();
    if (o.threads < 0 || o.max_batch < 0 || o.max_seq < 0)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_new: negative option");
    if (o.threads > 1024)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_new: %d threads is too many", o.threads);
    int64_t init[RT_MAXSYM];
    for (int i = 0; i < RT_MAXSYM; i++) {
        s->syms[i] = -1;
        init[i] = 1;
    }
    for (int i = 0; i < m->nsyms; i++) {
        /* a derived symbol follows the others: the session's limits are not its own */
        s->cap[i] = m->sym_derived[i] ? 0 : m->sym_is_batch[i] ? o.max_batch : o.max_seq;
        if (s->cap[i] > 0)
            init[i] = sym_bound(s, i);
    }
    rt_derive_syms(m, init);
    size_t nb = (size_t)m->nbufs + 1;
    s->ptr = rt_calloc(nb, sizeof *s->ptr);
    s->own = rt_calloc(nb, sizeof *s->own);
    s->shape = rt_calloc(nb, sizeof *s->shape);
    s->set = rt_calloc(nb, 1);
    s->fresh = rt_calloc(nb, 1);
    if (!s->ptr || !s->own || !s->shape || !s->set || !s->fresh || rs_alloc_plan(m, &s->host) < 0 ||
        (m->device && rs_alloc_plan(m, &s->devplan) < 0))
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory creating a session");
    rs_plan_elem_sizes(m, s->host.elem, s->devplan.elem);
    int st0;
    if (rs_scaler_init(s) < 0)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory creating a session");
    if (m->device) { /* before the pool: a session whose device fails stays unusable */
        char msg[sizeof s->err];
        int st = (s->changed = rt_calloc(nb, 1)) ? m->device->open(m, &s->dev, msg, sizeof msg) : XTC_ERR_MEMORY;
        if (st)
            return rs_fail(s, st, "%s", s->changed ? msg : "out of memory creating a session");
        if (rs_lazy_outputs(s))
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory creating a session");
    }
    if ((st0 = rs_store_open(s)))
        return st0;
    s->pool = rt_pool_new(o.threads ? o.threads : 1);
    if (!s->pool) {
        char why[128] = "";
        int e = errno;
        if (e == ENOMEM)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory starting %d threads", o.threads);
        return rs_fail(s, XTC_ERR_MEMORY, "cannot start %d threads: %s", o.threads, strerror_r(e, why, sizeof why));
    }
    s->api.pool = s->pool;
    s->api.parallel_for = rt_pool_parallel_for;
    s->api.nthreads = o.threads ? o.threads : 1;
    return rs_plan_arena(s, init);
}

/* frees the n blocks of a (NULL ones too) and a itself */
static void free_each(void **a, int n)
{
    for (int i = 0; a && i < n; i++)
        free(a[i]);
    free(a);
}

void xtc_session_free(XtcSession *s)
{
    if (!s)
        return;
    int nb = s->m ? s->m->nbufs : 0; /* no module: a failed xtc_session_new */
    rt_pool_free(s->pool);
    rt_optim_free(s->optim);
    if (s->m)
        rt_comm_free(s);
    if (s->dev)
        s->m->device->close(s->dev);
    if (s->m)
        rs_store_free(s);
    free(s->changed);
    free_each(s->spare, nb);
    free(s->spare_cap);
    free(s->own_cap);
    free(s->carried);
    free(s->lazy);
    free(s->fetched);
    free(s->into);
    free(s->place);
    free_each(s->own, nb);
    free(s->ptr);
    free(s->shape);
    free(s->set);
    free(s->fresh);
    rs_free_plan(&s->host);
    rs_free_plan(&s->devplan);
    free(s->arena);
    free(s->step_s);
    free(s->unscale);
    free(s->no_targets);
    free(s->from_targets);
    free(s);
}

const char *xtc_session_error(const XtcSession *s) { return s ? s->err : "no session"; }

int64_t xtc_session_peak_bytes(const XtcSession *s)
{
    if (!s)
        return 0;
    return (int64_t)(s->devplan.elem ? s->dev_arena_bytes : s->arena_bytes);
}

const char *xtc_session_device(const XtcSession *s)
{
    if (!s || !s->m)
        return "";
    if (!s->m->device)
        return "cpu";
    return s->dev ? s->m->device->device_name(s->dev) : ""; /* the device failed to open */
}

int64_t xtc_session_symbol(const XtcSession *s, int i)
{
    if (!s || !s->m || i < 0 || i >= s->m->nsyms)
        return -1;
    return s->syms[i];
}

/* Whether the session can take a call; clears the last error, so that it describes the last
 * call that failed only until another succeeds. */
int rs_ready(XtcSession *s, const char *what)
{
    if (!s)
        return 0;
    if (!s->m || !s->pool) {
        rs_fail(s, XTC_ERR_STATE, "%s: the session was not created successfully", what);
        return 0;
    }
    s->err[0] = 0;
    return 1;
}

int rs_find_buffer(const XtcModule *m, RtBufKind kind, const char *name)
{
    for (int i = 0; i < m->nby_kind[kind]; i++) {
        int b = m->by_kind[kind][i];
        if (strcmp(m->bufs[b].name, name) == 0)
            return b;
    }
    return -1;
}

void rs_shape_text(char *buf, size_t n, int rank, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* "[1, 0, 5]": the multi-index of flat element i of a row-major shape */
static void index_text(char *buf, size_t n, int rank, const int64_t *shape, int64_t i)
{
    int64_t idx[XTC_MAX_RANK] = {0};
    for (int d = rank - 1; d >= 0; d--)
        if (shape[d] > 0) {
            idx[d] = i % shape[d];
            i /= shape[d];
        }
    rs_shape_text(buf, n, rank, idx);
}

void rs_dims_text(char *buf, size_t n, const RtBuffer *b)
{
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < b->rank && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", b->dims[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* Constant dims must match; a dim of one symbol plus a constant checks the symbol's bound.
 * Returns a status with the message in msg. */
int rs_shape_problem(const XtcSession *s, const RtBuffer *b, const char *what, int rank, const int64_t *shape,
                     char *msg, size_t n)
{
    char want[256], got[256];
    rs_dims_text(want, sizeof want, b);
    rs_shape_text(got, sizeof got, rank, shape);
    if (rank != b->rank) {
        snprintf(msg, n, "%s '%s': rank %d given, expected %d %s", what, b->name, rank, b->rank, want);
        return XTC_ERR_SHAPE;
    }
    for (int i = 0; i < rank; i++) {
        const RtDim *d = &b->shape[i];
        int nsym = 0, sym = -1;
        for (int k = 0; k < RT_MAXSYM; k++)
            if (d->k[k]) {
                nsym++;
                sym = k;
            }
        if (shape[i] < 0) {
            snprintf(msg, n, "%s '%s': negative dimension in %s", what, b->name, got);
            return XTC_ERR_SHAPE;
        }
        if (shape[i] > ((int64_t)1 << 40)) {
            snprintf(msg, n, "%s '%s': dimension %lld is too large", what, b->name, (long long)shape[i]);
            return XTC_ERR_RANGE;
        }
        if (nsym == 0 && shape[i] != d->c) {
            snprintf(msg, n, "%s '%s': shape %s given, expected %s", what, b->name, got, want);
            return XTC_ERR_SHAPE;
        }
        if (nsym == 1 && d->k[sym] == 1) {
            int64_t v = shape[i] - d->c, bound = sym_bound(s, sym);
            if (v < 0) {
                snprintf(msg, n, "%s '%s': dimension %d is %lld, below %s at %s = 0", what, b->name, i,
                         (long long)shape[i], b->dims[i], s->m->sym_name[sym]);
                return XTC_ERR_SHAPE;
            }
            if (bound > 0 && v > bound) {
                int model = s->m->sym_max[sym] == bound;
                snprintf(msg, n, "%s '%s': %s %s = %lld exceeds %s %lld", what, b->name,
                         s->m->sym_is_batch[sym] ? "batch size" : "length", s->m->sym_name[sym], (long long)v,
                         model ? "the model's maximum (max_seq_len)"
                               : (s->m->sym_is_batch[sym] ? "the session's max_batch" : "the session's max_seq"),
                         (long long)bound);
                return XTC_ERR_RANGE;
            }
        }
    }
    int64_t numel = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel) || numel > ((int64_t)1 << 40)) {
            snprintf(msg, n, "%s '%s': %s has too many elements", what, b->name, got);
            return XTC_ERR_RANGE;
        }
    return XTC_OK;
}

int rs_check_shape(XtcSession *s, const RtBuffer *b, const char *what, int rank, const int64_t *shape)
{
    char msg[sizeof s->err];
    int st = rs_shape_problem(s, b, what, rank, shape, msg, sizeof msg);
    if (st)
        memcpy(s->err, msg, sizeof msg);
    return st;
}

int64_t rs_numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

/* Takes ownership of data as the value of bound buffer b (input or weight) of that shape. */
void rs_bind_buffer(XtcSession *s, int b, void *data, int rank, const int64_t *shape)
{
    if (s->optim && s->m->bufs[b].kind == RT_BUF_PARAM)
        rt_optim_host_write(s); /* the device's newer weights first: this one replaces its own */
    free(s->own[b]);
    s->own[b] = data;
    rs_store_forget(s, b);
    if (s->own_cap)
        s->own_cap[b] = 0;
    s->set[b] = 1;
    s->fresh[b] = 1;
    if (s->changed)
        s->changed[b] = 1;
    for (int i = 0; i < rank; i++)
        s->shape[b][i] = shape[i];
    s->outputs_valid = 0;
}

/* ---- inputs ---- */

int xtc_session_set_input(XtcSession *s, const char *name, XtcDType dtype, int rank, const int64_t *shape,
                          const void *data)
{
    if (!rs_ready(s, "xtc_session_set_input"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!name || rank < 0 || rank > XTC_MAX_RANK || (rank > 0 && !shape) || (unsigned)dtype >= XTC_NUM_DTYPES)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_set_input: bad arguments");
    const XtcModule *m = s->m;
    int b = rs_find_buffer(m, RT_BUF_INPUT, name);
    if (b < 0)
        return rs_fail(s, XTC_ERR_NAME, "the model has no input named '%s'", name);
    const RtBuffer *buf = &m->bufs[b];
    int ints = (dtype == XTC_I32 || dtype == XTC_I64) && (buf->dtype == XTC_I32 || buf->dtype == XTC_I64);
    if (dtype != buf->dtype && !ints)
        return rs_fail(s, XTC_ERR_SHAPE, "input '%s': %s given, expected %s", name, xtc_dtype_name(dtype),
                    xtc_dtype_name(buf->dtype));
    int st = rs_check_shape(s, buf, "input", rank, shape);
    if (!st)
        st = rs_check_limits_early(s, b, shape);
    if (st)
        return st;
    int64_t n = rs_numel_of(rank, shape); /* checked by check_shape */
    if (n > 0 && !data)
        return rs_fail(s, XTC_ERR_ARG, "input '%s': no data", name);
    size_t esize = xtc_dtype_size(buf->dtype);
    char *copy = rt_malloc(n ? (size_t)n * esize : 1);
    if (!copy)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for input '%s'", name);
    /* integers are range-checked and converted, bools normalised, one by one; floats copied whole
     * (a loop that did nothing for them was half the time of decoding with a long KV cache) */
    for (int64_t i = 0; buf->dtype != XTC_F32 && i < n; i++) {
        if (buf->dtype == XTC_I32 || buf->dtype == XTC_I64) {
            int64_t v = dtype == XTC_I32 ? ((const int32_t *)data)[i] : ((const int64_t *)data)[i];
            if (buf->has_range && (v < buf->lo || v >= buf->hi)) {
                free(copy);
                char at[200];
                index_text(at, sizeof at, rank, shape, i);
                if (buf->lo == INT64_MIN) /* targets */
                    return rs_fail(s, XTC_ERR_RANGE, "input '%s': value %lld at %s is outside [0, %lld) (a negative "
                                "target is ignored)", name, (long long)v, at, (long long)buf->hi);
                return rs_fail(s, XTC_ERR_RANGE, "input '%s': value %lld at %s is outside [%lld, %lld)", name,
                            (long long)v, at, (long long)buf->lo, (long long)buf->hi);
            }
            if (buf->dtype == XTC_I32) {
                if (v != (int32_t)v) {
                    free(copy);
                    return rs_fail(s, XTC_ERR_RANGE, "input '%s': value %lld does not fit i32", name, (long long)v);
                }
                ((int32_t *)copy)[i] = (int32_t)v;
            } else {
                ((int64_t *)copy)[i] = v;
            }
        } else if (buf->dtype == XTC_BOOL) {
            copy[i] = ((const uint8_t *)data)[i] != 0;
        }
    }
    if (buf->dtype == XTC_F32 && n)
        memcpy(copy, data, (size_t)n * esize);
    if ((st = rs_check_row_norms(s, b, rank, shape, (const float *)copy))) /* a cache's keys: bounded */
        return free(copy), st;
    if (buf->storage && !m->device) { /* a KV cache stored in bf16 or int8 rows: rounded once, here (rt_store.c) */
        void *h = rs_store_input(m, b, (const float *)copy, n);
        free(copy);
        if (!h)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for input '%s'", name);
        copy = h;
    }
    rs_bind_buffer(s, b, copy, rank, shape);
    if (b == s->scaler.buf)
        s->scaler.by_caller = 1; /* until xtc_session_set_loss_scale */
    return XTC_OK;
}

/* Computes each derived symbol whose symbols are all known; returns how many it computed, or
 * -1 with the session's error set when one comes out negative. */
static int derive_known(XtcSession *s, int64_t *syms, int *known)
{
    const XtcModule *m = s->m;
    int count = 0;
    for (int k = 0; k < m->nsyms; k++) {
        if (!m->sym_derived[k] || known[k])
            continue;
        int ready = 1;
        for (int j = 0; j < k; j++)
            ready &= !m->sym_def[k].k[j] || known[j];
        if (!ready)
            continue;
        rt_derive_syms(m, syms); /* the symbols before k are final, so k's value is */
        if (syms[k] < 0) {
            rs_fail(s, XTC_ERR_SHAPE, "symbol %s = %lld with these inputs (derived from the others)", m->sym_name[k],
                 (long long)syms[k]);
            return -1;
        }
        known[k] = 1;
        count++;
    }
    return count;
}

/* Solves the symbols from the shapes of the bound inputs and weights (a memory buffer may carry
 * one): repeatedly take a dimension with exactly one unknown symbol (never a derived one: those
 * are computed from the others as soon as these are known), then check every dim. */
static int bind_symbols(XtcSession *s, int64_t *syms)
{
    const XtcModule *m = s->m;
    int known[RT_MAXSYM] = {0};
    for (int i = 0; i < RT_MAXSYM; i++)
        syms[i] = 0;
    for (int progress = 1; progress;) {
        int derived = derive_known(s, syms, known);
        if (derived < 0)
            return XTC_ERR_SHAPE;
        progress = derived > 0;
        for (int b = 0; b < m->nbufs; b++) {
            const RtBuffer *buf = &m->bufs[b];
            if (buf->kind == RT_BUF_TEMP || !s->set[b]) /* unset: the targets of a forward run */
                continue;
            for (int d = 0; d < buf->rank; d++) {
                const RtDim *dim = &buf->shape[d];
                int unknown = -1, nunknown = 0;
                int64_t rest = s->shape[b][d] - dim->c;
                for (int k = 0; k < m->nsyms; k++) {
                    if (!dim->k[k])
                        continue;
                    if (known[k])
                        rest -= dim->k[k] * syms[k];
                    else {
                        unknown = k;
                        nunknown++;
                    }
                }
                if (nunknown != 1 || m->sym_derived[unknown])
                    continue;
                if (rest % dim->k[unknown] != 0 || rest / dim->k[unknown] < 0)
                    return rs_fail(s, XTC_ERR_SHAPE, "'%s': dimension %d (%lld) does not fit %s for any %s",
                                buf->name, d, (long long)s->shape[b][d], buf->dims[d], m->sym_name[unknown]);
                syms[unknown] = rest / dim->k[unknown];
                known[unknown] = 1;
                progress = 1;
            }
        }
    }
    for (int k = 0; k < m->nsyms; k++)
        if (!known[k]) {
            syms[k] = 0;
            /* a symbol no input mentions: only legal if nothing uses it, checked below */
        }
    for (int b = 0; b < m->nbufs; b++) {
        const RtBuffer *buf = &m->bufs[b];
        if (buf->kind == RT_BUF_TEMP || !s->set[b])
            continue;
        for (int d = 0; d < buf->rank; d++) {
            int64_t want = rt_dim_eval(&buf->shape[d], syms);
            if (want != s->shape[b][d]) {
                char names[128] = "";
                size_t len = 0;
                for (int k = 0; k < m->nsyms && len < sizeof names; k++)
                    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s = %lld", len ? ", " : "",
                                            m->sym_name[k], (long long)syms[k]);
                return rs_fail(s, XTC_ERR_SHAPE,
                            "%s '%s': dimension %d is %lld but %s = %lld with the other inputs (%s)",
                            buf->kind == RT_BUF_INPUT ? "input" : "weight", buf->name, d, (long long)s->shape[b][d],
                            buf->dims[d], (long long)want, names);
            }
        }
    }
    for (int k = 0; k < m->nsyms; k++) {
        int64_t bound = sym_bound(s, k);
        if (bound > 0 && syms[k] > bound)
            return rs_fail(s, XTC_ERR_RANGE, "symbol %s = %lld exceeds its bound %lld", m->sym_name[k],
                        (long long)syms[k], (long long)bound);
    }
    return rs_check_limits(s, syms, NULL, -1, NULL);
}

/* Why a step of the schedule can fail, by op (the kernels report a status, not a message). */
static const struct {
    const char *op, *why;
} step_errors[] = {
    {"gather", "an index is outside [0, rows of the table)"},
    {"gather_grad", "an index is outside [0, rows of the table)"},
    {"cross_entropy", "a target is >= the number of classes"},
    {"div", "integer division by zero"},
    {"reduce_max", "maximum over an empty axis"},
    {"relpos_bucket", "a bucket is undefined for these settings"},
};

static int run_failure(XtcSession *s, int32_t r)
{
    const XtcModule *m = s->m;
    if (r < 1 || r > m->nsteps)
        return rs_fail(s, XTC_ERR_RANGE, "run failed with status %d", r);
    const RtStep *step = &m->steps[r - 1];
    const char *why = "failed";
    for (size_t i = 0; i < sizeof step_errors / sizeof step_errors[0]; i++)
        if (strcmp(step_errors[i].op, step->op) == 0)
            why = step_errors[i].why;
    /* name the model input the bad values came from, when they came straight from one */
    char from[300] = "";
    for (int k = 0; k < RT_MAXIN; k++) {
        int b = step->in[k];
        if (b >= 0 && m->bufs[b].kind == RT_BUF_INPUT && m->bufs[b].dtype != XTC_F32)
            snprintf(from, sizeof from, " (input '%s')", m->bufs[b].name);
    }
    return rs_fail(s, XTC_ERR_RANGE, "step %d (%s %%%s): %s%s", r - 1, step->op, step->label, why, from);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The hook after each schedule step: profiling, and starting the gradient sums that step
 * completes (rt_comm.c; their time is not the step's). */
static void step_done(void *ctx, int32_t step)
{
    XtcSession *s = ctx;
    if (s->step_s)
        s->step_s[step] += 1e-9 * (double)(now_ns() - s->last_ns);
    if (s->comm)
        rt_comm_step_done(s, step);
    if (s->step_s)
        s->last_ns = now_ns();
}

void rs_update_hook(XtcSession *s)
{
    s->api.step_done = s->step_s || s->comm ? step_done : NULL;
    s->api.hook_ctx = s->api.step_done ? s : NULL;
}

int rt_session_has_comm(const XtcSession *s) { return s && s->comm; }

int xtc_session_set_profiling(XtcSession *s, int on)
{
    if (!rs_ready(s, "xtc_session_set_profiling"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    free(s->step_s);
    s->step_s = NULL;
    s->profiled_runs = 0;
    if (on && !(s->step_s = rt_calloc((size_t)s->m->nsteps + 1, sizeof *s->step_s))) {
        rs_update_hook(s);
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the profile");
    }
    rs_update_hook(s);
    return XTC_OK;
}

int xtc_session_profile_steps(const XtcSession *s, double *secs, int n)
{
    if (!s || !s->m || (!secs && n > 0) || n < 0)
        return -1;
    if (!s->step_s)
        return 0;
    for (int i = 0; i < n && i < s->m->nsteps; i++)
        secs[i] = s->step_s[i];
    return s->profiled_runs;
}

typedef struct {
    int kernel;
    double s;
} KernelTime;

static int by_time_desc(const void *a, const void *b)
{
    const KernelTime *x = a, *y = b;
    return x->s < y->s ? 1 : x->s > y->s ? -1 : x->kernel - y->kernel;
}

int xtc_session_print_profile(const XtcSession *s, FILE *out)
{
    if (!s || !s->m || !out)
        return XTC_ERR_ARG;
    const XtcModule *m = s->m;
    if (!s->step_s || !s->profiled_runs) {
        fprintf(out, "no profile: call xtc_session_set_profiling(s, 1) before running\n");
        return XTC_OK;
    }
    KernelTime *kt = rt_calloc((size_t)m->nkernels + 1, sizeof *kt);
    if (!kt)
        return XTC_ERR_MEMORY;
    double total = 0;
    for (int k = 0; k < m->nkernels; k++)
        kt[k].kernel = k;
    for (int i = 0; i < m->nsteps; i++) {
        kt[m->steps[i].kernel].s += s->step_s[i];
        total += s->step_s[i];
    }
    qsort(kt, (size_t)m->nkernels, sizeof *kt, by_time_desc);
    double runs = s->profiled_runs;
    fprintf(out, "profile of %d run%s: %.3f ms per run, %d steps, %d kernels\n", s->profiled_runs,
            s->profiled_runs == 1 ? "" : "s", 1e3 * total / runs, m->nsteps, m->nkernels);
    fprintf(out, "  %10s %6s  %-14s %5s  %s\n", "ms/run", "share", "op", "steps", "kernel");
    for (int k = 0; k < m->nkernels; k++) {
        const RtKernel *K = &m->kernels[kt[k].kernel];
        fprintf(out, "  %10.3f %5.1f%%  %-14s %5d  %s\n", 1e3 * kt[k].s / runs, total > 0 ? 100 * kt[k].s / total : 0,
                K->op, K->uses, K->fn);
    }
    free(kt);
    return XTC_OK;
}


/* A device module's schedule runs on its device (rt_cuda.c), which copies the outputs back into
 * s->ptr (but those carried on the device, which it writes over their inputs where they append
 * to them). Returns as the module's run does, or -1 with the device's message set. */
static int32_t device_run(XtcSession *s, const int64_t *syms)
{
    for (int b = 0; s->into && b < s->m->nbufs; b++) { /* carried outputs appending to their input */
        s->place[b] = s->into[b] && rs_appends_to(s, b, s->into[b] - 1, syms) ? s->into[b] : 0;
        for (int e = 0; e < b && s->place[b]; e++) /* one output per input's memory */
            if (s->place[e] == s->place[b])
                s->place[b] = 0;
    }
    RtDeviceRun run = {.host = s->ptr, .changed = s->changed, .lazy = s->lazy, .place = s->place, .syms = syms,
                       .offset = s->devplan.offset, .arena_bytes = s->devplan.total, .step_s = s->step_s,
                       .pool = s->pool};
    char msg[sizeof s->err];
    int32_t r = s->m->device->run(s->dev, &run, msg, sizeof msg);
    if (r < 0)
        rs_fail(s, r == -2 ? XTC_ERR_MEMORY : XTC_ERR_IO, "%s", msg);
    else
        memset(s->changed, 0, (size_t)s->m->nbufs);
    if (s->fetched)
        memset(s->fetched, 0, (size_t)s->m->nbufs);
    return r;
}

/* ---- a training module's forward pass without targets ---- */

/* When the targets input is not set: binds targets of the shape these symbols give, all -1
 * (ignored: the loss and gradients come out of nothing and are withheld, output_withheld), and
 * notes which buffers are computed from them. */
static int bind_no_targets(XtcSession *s, const int64_t *syms)
{
    const XtcModule *m = s->m;
    int b = s->targets;
    s->targetless = b >= 0 && !s->set[b];
    if (!s->targetless)
        return XTC_OK;
    const RtBuffer *t = &m->bufs[b];
    size_t bytes = rs_buffer_bytes(t, xtc_dtype_size(t->dtype), syms);
    if (bytes == SIZE_MAX)
        return rs_fail(s, XTC_ERR_MEMORY, "input 'targets' would not fit in memory with these sizes");
    if (!s->from_targets && !(s->from_targets = rt_calloc((size_t)m->nbufs + 1, 1)))
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for a run without targets");
    if (bytes > s->no_targets_bytes || !s->no_targets) {
        free(s->no_targets);
        s->no_targets_bytes = 0;
        if (!(s->no_targets = rt_malloc(bytes ? bytes : 1)))
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for a run without targets");
        s->no_targets_bytes = bytes;
    }
    memset(s->no_targets, 0xff, bytes); /* -1 as i32 and i64 */
    for (int i = 0; i < t->rank; i++)
        s->shape[b][i] = rt_dim_eval(&t->shape[i], syms);
    s->ptr[b] = s->no_targets;
    if (s->changed)
        s->changed[b] = 1;
    memset(s->from_targets, 0, (size_t)m->nbufs);
    s->from_targets[b] = 1;
    for (int i = 0; i < m->nsteps; i++)
        for (int k = 0; k < RT_MAXIN; k++)
            if (m->steps[i].in[k] >= 0 && s->from_targets[m->steps[i].in[k]])
                s->from_targets[m->steps[i].out] = 1;
    return XTC_OK;
}

/* Whether output o of the last run is withheld: computed from targets that were not set. */
static int output_withheld(const XtcSession *s, int o)
{
    return s->targetless && s->from_targets && s->from_targets[s->m->outs[o].buf];
}

int rt_session_withheld(const XtcSession *s, int out) { return s && s->m && output_withheld(s, out); }

int rt_session_output_ready(const XtcSession *s, int out)
{
    return s && s->m && s->outputs_valid && out >= 0 && out < s->m->nouts && !output_withheld(s, out);
}

int xtc_session_run(XtcSession *s)
{
    if (!rs_ready(s, "xtc_session_run"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    const XtcModule *m = s->m;
    s->outputs_valid = 0;
    int st = rs_scaler_bind(s);
    if (st)
        return st;
    if (s->scaler.buf >= 0 && s->set[s->scaler.buf]) {
        float used = *(const float *)s->own[s->scaler.buf];
        if (!(used > 0) || !isfinite(used))
            return rs_fail(s, XTC_ERR_RANGE, "input '%s' is %g: a loss scale must be positive and finite",
                        XTC_LOSS_SCALE_INPUT, (double)used);
    }
    for (int k = RT_BUF_INPUT; k <= RT_BUF_STATE; k++)
        for (int i = 0; i < m->nby_kind[k]; i++) {
            int b = m->by_kind[k][i];
            if (!s->set[b] && b != s->targets)
                return rs_fail(s, XTC_ERR_STATE, k == RT_BUF_INPUT ? "input '%s' is not set" : "weight '%s' is not loaded",
                            m->bufs[b].name);
        }
    int64_t syms[RT_MAXSYM];
    if ((st = bind_symbols(s, syms)))
        return st;
    /* temps whose dims go negative would be a model bug (n-1 with n = 0, say) */
    for (int i = 0; i < m->nbufs; i++) {
        const RtBuffer *b = &m->bufs[i];
        if (b->kind != RT_BUF_TEMP)
            continue;
        for (int d = 0; d < b->rank; d++)
            if (rt_dim_eval(&b->shape[d], syms) < 0)
                return rs_fail(s, XTC_ERR_SHAPE, "buffer %%%s: dimension %s is negative with these inputs", b->name,
                            b->dims[d]);
    }
    if (rs_no_output_elements(m, syms)) { /* an empty batch or sequence: nothing to compute */
        for (int i = 0; i < m->nbufs; i++)
            s->ptr[i] = m->bufs[i].kind == RT_BUF_TEMP ? (void *)s->arena : s->own[i];
        memcpy(s->syms, syms, sizeof s->syms);
        memset(s->fresh, 0, (size_t)m->nbufs);
        if (s->fetched) /* nothing of this run is on the device */
            memset(s->fetched, 1, (size_t)m->nbufs);
        s->targetless = 0;
        s->stepped = 0;
        s->outputs_valid = 1;
        return XTC_OK;
    }
    if ((st = rs_check_work(s, syms)))
        return st;
    int fits = rs_plan_fits(m, &s->host, syms) && (!s->devplan.elem || rs_plan_fits(m, &s->devplan, syms));
    if (!fits || !s->arena) { /* no arena: the last plan's allocation failed */
        int64_t next[RT_MAXSYM];
        for (int k = 0; k < RT_MAXSYM; k++)
            next[k] = syms[k] > s->planned[k] ? syms[k] : s->planned[k];
        /* a symbol outgrowing its plan again (a cache a token longer each call) is planned with
         * room to grow (rs_headroom), within its bound: the arenas are replanned and reallocated (and a
         * device's freed, synchronised and allocated) a logarithmic number of times, not at
         * every call; where that plan cannot be had, the plan of these sizes. Only in a session
         * that carries outputs into inputs (decoding): elsewhere a failed allocation is reported,
         * never absorbed by a smaller plan */
        int grew = 0;
        for (int k = 0; k < m->nsyms && s->carries; k++)
            if (!m->sym_derived[k] && s->arena && s->planned[k] > 0 && syms[k] > s->planned[k]) {
                int64_t b = sym_bound(s, k), v = rs_headroom(syms[k]);
                next[k] = b > 0 && v > b ? b : v;
                grew |= next[k] > syms[k];
            }
        if (grew) {
            int64_t base[RT_MAXSYM];
            memcpy(base, next, sizeof base);
            rt_derive_syms(m, next);
            for (int k = 0; k < RT_MAXSYM; k++) /* derived symbols as large as any plan's */
                next[k] = next[k] > base[k] ? next[k] : base[k];
            if (rs_plan_arena(s, next) != XTC_OK) {
                for (int k = 0; k < RT_MAXSYM; k++)
                    next[k] = syms[k] > s->planned[k] ? syms[k] : s->planned[k];
                grew = 0;
            }
        }
        if (!grew && (st = rs_plan_arena(s, next)))
            return st;
        if (!rs_plan_fits(m, &s->host, syms) || (s->devplan.elem && !rs_plan_fits(m, &s->devplan, syms)))
            st = rs_plan_arena(s, syms); /* a shape that shrinks as a symbol grows */
        if (st)
            return st;
    }
    for (int i = 0; i < m->nbufs; i++)
        s->ptr[i] = m->bufs[i].kind == RT_BUF_TEMP ? s->arena + s->host.offset[i] : s->own[i];
    if ((st = rs_place_carried(s, syms)) || (st = bind_no_targets(s, syms)) || (st = rs_store_sync(s)))
        return st;
    memcpy(s->syms, syms, sizeof s->syms);
    if (s->comm)
        rt_comm_begin(s);
    s->last_ns = now_ns();
    int32_t r = s->dev ? device_run(s, syms) : rt_run_module(m->abi->run, s->ptr, syms, &s->api);
    if (r != 0 && s->comm)
        rt_comm_abandon(s);
    if (r == RT_RUN_NO_STACK)
        return rs_fail(s, XTC_ERR_MEMORY, "xtc_session_run: the calling thread has less than 4 MiB of stack left and "
                                       "no thread with more could be started");
    if (r < 0 && s->dev)
        return r == -2 ? XTC_ERR_MEMORY : XTC_ERR_IO; /* the device's message is set */
    if (r != 0)
        return run_failure(s, r);
    if (s->step_s)
        s->profiled_runs++;
    if ((st = rs_scaler_unscale(s))) {
        if (s->comm)
            rt_comm_abandon(s);
        return st;
    }
    if (s->comm && (st = rt_comm_finish(s)))
        return st;
    memset(s->fresh, 0, (size_t)m->nbufs);
    s->stepped = 0;
    s->outputs_valid = 1;
    return XTC_OK;
}

int xtc_session_get_output(XtcSession *s, const char *name, XtcTensor *out) { return rs_get_output(s, name, out, 1); }

int rs_get_output(XtcSession *s, const char *name, XtcTensor *out, int widen)
{
    if (!rs_ready(s, "xtc_session_get_output"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!name || !out)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_get_output: bad arguments");
    int i = rs_find_output(s->m, name);
    if (i < 0)
        return rs_fail(s, XTC_ERR_NAME, "the model has no output named '%s'", name);
    const RtOutput *o = &s->m->outs[i];
    if (!s->outputs_valid)
        return rs_fail(s, XTC_ERR_STATE, "output '%s': no successful run since the inputs changed", name);
    if (output_withheld(s, i))
        return rs_fail(s, XTC_ERR_STATE, "output '%s': the last run had no targets (input 'targets' not set): "
                    "only the outputs that do not depend on them (logits) were computed", name);
    int st = rs_output_on_host(s, o->buf, name);
    if (st)
        return st;
    memset(out, 0, sizeof *out);
    out->dtype = o->dtype;
    out->rank = o->rank;
    for (int d = 0; d < o->rank; d++)
        out->shape[d] = rt_dim_eval(&o->shape[d], s->syms);
    out->data = s->ptr[o->buf];
    if (widen && s->m->bufs[o->buf].storage && !s->dev) { /* a KV cache in bf16 or int8 rows: the API's f32 */
        out->data = rs_store_output(s, o->buf, s->ptr[o->buf], rs_numel_of(out->rank, out->shape));
        if (!out->data)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for output '%s'", name);
    }
    return XTC_OK;
}

/* ---- for the optimizer (rt_optim.c; see rt_internal.h) ---- */

void *rt_session_buffer(XtcSession *s, int buf, const int64_t **shape)
{
    if (!s || !s->own || buf < 0 || buf >= s->m->nbufs || !s->set[buf])
        return NULL;
    if (s->m->bufs[buf].kind == RT_BUF_PARAM && rt_optim_host_write(s))
        return NULL;
    if (shape)
        *shape = s->shape[buf];
    if (s->changed) /* the caller may write it (an optimizer step): a device uploads it again */
        s->changed[buf] = 1;
    return s->own[buf];
}

const void *rt_session_weight(XtcSession *s, int buf, const int64_t **shape)
{
    if (!s || !s->own || buf < 0 || buf >= s->m->nbufs || !s->set[buf])
        return NULL;
    if (s->m->bufs[buf].kind == RT_BUF_PARAM && rt_optim_pull(s))
        return NULL;
    if (shape)
        *shape = s->shape[buf];
    return s->own[buf];
}

int rt_session_device_adamw(XtcSession *s, const RtAdamW *a)
{
    if (!s->dev || !s->m->device->adamw)
        return -1;
    char msg[sizeof s->err];
    int r = s->m->device->adamw(s->dev, a, msg, sizeof msg);
    if (r < 0)
        return rs_fail(s, r == -2 ? XTC_ERR_MEMORY : XTC_ERR_IO, "the optimizer on %s: %s",
                       s->m->device->device_name(s->dev), msg);
    return r > 0 ? -1 : XTC_OK;
}

void *const *rt_session_own(XtcSession *s) { return s->own; }

int rt_session_keep_on_device(XtcSession *s, int buf)
{
    if (rs_lazy_alloc(s))
        return -1;
    s->lazy[buf] = 1;
    return 0;
}

void *rt_session_output(XtcSession *s, int out)
{
    if (!s || !s->outputs_valid || out < 0 || out >= s->m->nouts || output_withheld(s, out))
        return NULL;
    const RtOutput *o = &s->m->outs[out];
    return rs_output_on_host(s, o->buf, o->name) ? NULL : s->ptr[o->buf];
}

void rt_session_adopt(XtcSession *s, int buf, float *data)
{
    const RtBuffer *b = &s->m->bufs[buf];
    int64_t shape[XTC_MAX_RANK];
    for (int d = 0; d < b->rank; d++)
        shape[d] = b->shape[d].c;
    rs_bind_buffer(s, buf, data, b->rank, shape);
}

RtPool *rt_session_pool(XtcSession *s) { return s ? s->pool : NULL; }

const XtcModule *rt_session_module(const XtcSession *s) { return s ? s->m : NULL; }

struct RtOptim **rt_session_optim(XtcSession *s) { return &s->optim; }

uint8_t *rt_session_stepped(XtcSession *s) { return &s->stepped; }

void rt_session_begin(XtcSession *s)
{
    if (s && s->m && s->pool)
        s->err[0] = 0;
}

int rt_session_fail(XtcSession *s, int status, const char *msg)
{
    return rs_fail(s, status, "%s", msg);
}