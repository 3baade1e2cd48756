/* rt_optim.c: training in the runtime: the AdamW step over a session's parameters (from the
 * grad.<name> outputs of a training module), its state, and checkpoints (weights + optimizer
 * state in one .safetensors file). The semantics are in include/xtc.h.
 *
 * The parameters are seen as one concatenated vector of `total` elements cut into fixed blocks of
 * BLOCK elements. The pool runs blocks in any order on any thread, but each block's work and the
 * order in which the per-block partial sums of the gradient norm are added do not depend on the
 * threads: a step gives the same bits with 1 or 16 threads. With a communicator (rt_comm.c) the
 * gradients read are the sums over the ranks, the same on every rank, and so is the step.
 *
 * On a device that has the step (a CUDA training module: codegen/cuda/kernels/adamw.cuh) the
 * same step runs there, with the same bits: the gradients stay on the device (later runs leave
 * them there; xtc_session_get_output copies one when asked), the device keeps f32 master
 * weights and the moments, and only the per-block sums come to the host, which adds them in
 * order as here. The host's copies of the weights and moments are brought up to date when read
 * (xtc_session_get_weight, checkpoints, xtc_session_get_optim: rt_optim_pull) and sent back
 * before the next device step when the caller changed them. Loss scaling (fp16), a communicator
 * that sums the gradients in host memory (NCCL sums them on the device: the device steps), ZeRO-1
 * and XTC_OPTIM=host keep the step on the host. */
#include "safetensors.h"
#include "rt_alloc.h"
#include "rt_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK RT_ADAMW_BLOCK

struct RtOptim {
    int nparams;
    int *buf;          /* [nparams] buffer id of each parameter, module order */
    int *grad;         /* [nparams] output index of grad.<name> */
    int64_t *offset;   /* [nparams + 1] start of each parameter in the concatenated vector */
    int64_t total;
    float *m, *v;      /* first and second moments of elements [mv_lo, mv_hi) of the vector: all
                          of them, or with ZeRO-1 this rank's shard (rt_comm_shard) */
    int64_t mv_lo, mv_hi;
    int64_t step;
    double last_norm;  /* before clipping; -1 before the first step */
    double *partial;   /* [nblocks] sums of squares, per block */
    int64_t nblocks;
    int device;        /* the step runs on the session's device: 0 not yet known, 1 yes, -1 no */
    int dev_state;     /* the device holds this optimizer's state (a PUSH was made) */
    int dev_newer;     /* ... newer than the host's (weights, m, v): pull before reading */
    int host_newer;    /* the host's changed since: push before the next device step */
};

void rt_optim_free(struct RtOptim *o)
{
    if (!o)
        return;
    free(o->buf);
    free(o->grad);
    free(o->offset);
    free(o->m);
    free(o->v);
    free(o->partial);
    free(o);
}

static int failf(XtcSession *s, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int failf(XtcSession *s, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rt_session_fail(s, status, msg);
}

static int64_t numel_of(const RtBuffer *b)
{
    int64_t n = 1;
    for (int i = 0; i < b->rank; i++)
        n *= b->shape[i].c; /* parameters have constant shapes */
    return n;
}

/* The part of the vector whose moments this rank keeps: with ZeRO-1 its shard, else all. */
static void wanted_range(const XtcSession *s, const struct RtOptim *o, int64_t *lo, int64_t *hi)
{
    if (!rt_comm_shard(s, o->total, -1, lo, hi)) {
        *lo = 0;
        *hi = o->total;
    }
}

static int is_full(const struct RtOptim *o) { return o->mv_lo == 0 && o->mv_hi == o->total; }

/* Makes m and v cover [lo, hi), keeping the values of the part both cover (zeros elsewhere). */
static int relayout(struct RtOptim *o, int64_t lo, int64_t hi)
{
    if (lo == o->mv_lo && hi == o->mv_hi)
        return 0;
    size_t n = (size_t)(hi > lo ? hi - lo : 1);
    float *m = rt_calloc(n, sizeof *m), *v = rt_calloc(n, sizeof *v);
    if (!m || !v) {
        free(m);
        free(v);
        return -1;
    }
    int64_t a = lo > o->mv_lo ? lo : o->mv_lo, b = hi < o->mv_hi ? hi : o->mv_hi;
    if (b > a) {
        memcpy(m + (a - lo), o->m + (a - o->mv_lo), (size_t)(b - a) * sizeof *m);
        memcpy(v + (a - lo), o->v + (a - o->mv_lo), (size_t)(b - a) * sizeof *v);
    }
    free(o->m);
    free(o->v);
    o->m = m;
    o->v = v;
    o->mv_lo = lo;
    o->mv_hi = hi;
    return 0;
}

/* Every rank's shard to every rank (a collective): the whole state on each. */
static int gather_state(XtcSession *s, struct RtOptim *o)
{
    if (relayout(o, 0, o->total))
        return failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer state (%" PRId64 " parameters)", o->total);
    int st = XTC_OK;
    for (int r = 0; r < rt_comm_size(s) && !st; r++) {
        int64_t lo, hi;
        rt_comm_shard(s, o->total, r, &lo, &hi);
        st = rt_comm_broadcast_from(s, o->m + lo, (hi - lo) * (int64_t)sizeof *o->m, r);
        if (!st)
            st = rt_comm_broadcast_from(s, o->v + lo, (hi - lo) * (int64_t)sizeof *o->v, r);
    }
    return st;
}

int rt_optim_gather(XtcSession *s)
{
    struct RtOptim *o = *rt_session_optim(s);
    return o && o->step > 0 ? gather_state(s, o) : XTC_OK;
}

/* The session's optimizer, created (zero state) on first use. */
static int optim_get(XtcSession *s, struct RtOptim **out)
{
    struct RtOptim **slot = rt_session_optim(s);
    if (*slot) {
        *out = *slot;
        return XTC_OK;
    }
    const XtcModule *m = rt_session_module(s);
    int np = m->nby_kind[RT_BUF_PARAM];
    struct RtOptim *o = rt_calloc(1, sizeof *o);
    if (!o)
        return failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer");
    o->nparams = np;
    o->last_norm = -1;
    const char *where = getenv("XTC_OPTIM");
    o->device = where && !strcmp(where, "host") ? -1 : 0;
    o->buf = rt_calloc((size_t)np + 1, sizeof *o->buf);
    o->grad = rt_calloc((size_t)np + 1, sizeof *o->grad);
    o->offset = rt_calloc((size_t)np + 1, sizeof *o->offset);
    if (!o->buf || !o->grad || !o->offset) {
        rt_optim_free(o);
        return failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer");
    }
    for (int i = 0; i < np; i++) {
        int b = m->by_kind[RT_BUF_PARAM][i];
        char name[600];
        snprintf(name, sizeof name, "grad.%s", m->bufs[b].name);
        o->buf[i] = b;
        o->grad[i] = xtc_module_find(m, XTC_OUTPUT, name);
        if (o->grad[i] < 0) {
            rt_optim_free(o);
            return failf(s, XTC_ERR_NAME, "the module has no output '%s': a training module (xtc compile "
                                          "--train) computes the gradients the optimizer needs", name);
        }
        o->offset[i + 1] = o->offset[i] + numel_of(&m->bufs[b]);
    }
    o->total = o->offset[np];
    o->nblocks = (o->total + BLOCK - 1) / BLOCK;
    wanted_range(s, o, &o->mv_lo, &o->mv_hi);
    size_t n = (size_t)(o->mv_hi > o->mv_lo ? o->mv_hi - o->mv_lo : 1);
    o->m = rt_calloc(n, sizeof *o->m);
    o->v = rt_calloc(n, sizeof *o->v);
    o->partial = rt_calloc((size_t)o->nblocks + 1, sizeof *o->partial);
    if (!o->m || !o->v || !o->partial) {
        rt_optim_free(o);
        return failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer state (%" PRId64 " parameters)",
                     (int64_t)n);
    }
    *slot = o;
    *out = o;
    return XTC_OK;
}

/* The RtAdamW of phase for o over the session's buffers. */
static RtAdamW device_phase(XtcSession *s, struct RtOptim *o, int phase, const int *gradbuf)
{
    return (RtAdamW){.phase = phase, .nparams = o->nparams, .param = o->buf, .grad = gradbuf, .offset = o->offset,
                     .nblocks = o->nblocks, .partial = o->partial, .m = o->m, .v = o->v,
                     .host = rt_session_own(s)};
}

int rt_optim_pull(XtcSession *s)
{
    struct RtOptim *o = *rt_session_optim(s);
    if (!o || !o->dev_newer)
        return XTC_OK;
    RtAdamW a = device_phase(s, o, RT_ADAMW_PULL, NULL);
    int st = rt_session_device_adamw(s, &a);
    if (st > 0)
        return st;
    o->dev_newer = 0;
    return XTC_OK;
}

int rt_optim_host_write(XtcSession *s)
{
    struct RtOptim *o = *rt_session_optim(s);
    int st = rt_optim_pull(s);
    if (!st && o && o->dev_state)
        o->host_newer = 1;
    return st;
}

XtcAdamW xtc_adamw_defaults(void)
{
    return (XtcAdamW){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                      .max_grad_norm = 0};
}

/* ---- the step ---- */

typedef struct {
    struct RtOptim *o;
    float **p;            /* [nparams] parameter memory */
    const float **g;      /* [nparams] gradient memory */
    float decay;          /* 1 - lr * weight_decay */
    float b1, b2, omb1, omb2, eps;
    float step_size;      /* lr / (1 - beta1^t) */
    float bc2_sqrt;       /* sqrt(1 - beta2^t) */
    float clip;           /* gradient scale */
    int clipping;
    int64_t blk0;         /* the update's first block (ZeRO-1: this rank's shard) */
} StepCtx;

/* Calls fn(ctx, param, lo, hi, at) for the pieces of each parameter inside block blk, where [lo,
 * hi) are indices in the parameter and `at` the index in the concatenated vector. */
typedef void (*PieceFn)(StepCtx *c, int param, int64_t lo, int64_t hi, int64_t at);

static void for_pieces(StepCtx *c, int64_t blk, PieceFn fn)
{
    const struct RtOptim *o = c->o;
    int64_t start = blk * BLOCK, end = start + BLOCK < o->total ? start + BLOCK : o->total;
    /* the first parameter whose range reaches past start (binary search over offsets) */
    int lo = 0, hi = o->nparams - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (o->offset[mid + 1] <= start)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int i = lo; i < o->nparams && o->offset[i] < end; i++) {
        int64_t a = start > o->offset[i] ? start : o->offset[i];
        int64_t b = end < o->offset[i + 1] ? end : o->offset[i + 1];
        if (b > a)
            fn(c, i, a - o->offset[i], b - o->offset[i], a);
    }
}

/* Sum of squares in a fixed order (eight interleaved partial sums), so it does not depend on the
 * threads. */
static void norm_piece(StepCtx *c, int param, int64_t lo, int64_t hi, int64_t at)
{
    const float *g = c->g[param];
    double acc[8] = {0};
    int64_t k = lo;
    for (; k + 8 <= hi; k += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)g[k + j] * g[k + j];
    for (; k < hi; k++)
        acc[0] += (double)g[k] * g[k];
    c->o->partial[at / BLOCK] += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void norm_task(void *ctx, int64_t lo, int64_t hi)
{
    StepCtx *c = ctx;
    for (int64_t blk = lo; blk < hi; blk++) {
        c->o->partial[blk] = 0;
        for_pieces(c, blk, norm_piece);
    }
}

static void update_piece(StepCtx *c, int param, int64_t lo, int64_t hi, int64_t at)
{
    /* the settings in locals: the stores below could otherwise alias them */
    const int64_t base = at - c->o->mv_lo - lo; /* m and v hold the vector from mv_lo on */
    float *restrict p = c->p[param], *restrict m = c->o->m + base, *restrict v = c->o->v + base;
    const float *restrict g = c->g[param];
    const float clip = c->clipping ? c->clip : 1.0f, decay = c->decay, b1 = c->b1, b2 = c->b2;
    const float omb1 = c->omb1, omb2 = c->omb2, eps = c->eps, step_size = c->step_size, bc2 = c->bc2_sqrt;
    for (int64_t k = lo; k < hi; k++) {
        float gk = g[k] * clip; /* clip is exactly 1 without clipping */
        float pk = p[k] * decay;
        float mk = b1 * m[k] + omb1 * gk;
        float vk = b2 * v[k] + omb2 * gk * gk;
        m[k] = mk;
        v[k] = vk;
        p[k] = pk - step_size * (mk / (sqrtf(vk) / bc2 + eps));
    }
}

static void update_task(void *ctx, int64_t lo, int64_t hi)
{
    StepCtx *c = ctx;
    for (int64_t blk = lo; blk < hi; blk++)
        for_pieces(c, c->blk0 + blk, update_piece);
}

/* The step's settings after the gradient norm (the host's and the device's step use them). */
static void step_settings(StepCtx *c, struct RtOptim *o, const XtcAdamW *opt, double norm)
{
    o->last_norm = norm;
    if (opt->max_grad_norm > 0) { /* torch.nn.utils.clip_grad_norm_ */
        double coef = opt->max_grad_norm / (norm + 1e-6);
        c->clipping = 1;
        c->clip = (float)(coef < 1 ? coef : 1);
    }
    o->step++;
    double t = (double)o->step;
    c->decay = (float)(1.0 - (double)opt->lr * opt->weight_decay);
    c->b1 = opt->beta1;
    c->b2 = opt->beta2;
    c->omb1 = (float)(1.0 - opt->beta1);
    c->omb2 = (float)(1.0 - opt->beta2);
    c->eps = opt->eps;
    c->step_size = (float)(opt->lr / (1.0 - pow(opt->beta1, t)));
    c->bc2_sqrt = (float)sqrt(1.0 - pow(opt->beta2, t));
}

/* The step on the session's device (see the top of the file): XTC_OK, -1 when the device has
 * none (the host steps, from now on), or a status with the session's error set. */
static int device_step(XtcSession *s, struct RtOptim *o, const XtcAdamW *opt)
{
    const XtcModule *m = rt_session_module(s);
    int *gradbuf = rt_calloc((size_t)o->nparams + 1, sizeof *gradbuf);
    if (!gradbuf)
        return failf(s, XTC_ERR_MEMORY, "out of memory for the step");
    int st = XTC_OK;
    for (int i = 0; i < o->nparams && !st; i++) {
        gradbuf[i] = m->outs[o->grad[i]].buf;
        if (!rt_session_own(s)[o->buf[i]])
            st = failf(s, XTC_ERR_STATE, "xtc_session_step: weight '%s' is not loaded", m->bufs[o->buf[i]].name);
        else if (!rt_session_output_ready(s, o->grad[i]))
            st = failf(s, XTC_ERR_STATE, "xtc_session_step: no gradients: run the model successfully%s first",
                       rt_session_withheld(s, o->grad[i]) ? " with its targets" : "");
    }
    if (!st && *rt_session_stepped(s))
        st = failf(s, XTC_ERR_STATE, "xtc_session_step: the gradients of the last run were used by a step "
                                     "already: run the model again first");
    RtAdamW a = device_phase(s, o, RT_ADAMW_PUSH, gradbuf);
    if (!st && (!o->dev_state || o->host_newer)) {
        st = rt_session_device_adamw(s, &a);
        if (st < 0) { /* no step on this device */
            o->device = -1;
            free(gradbuf);
            return -1;
        }
        o->dev_state = !st;
        o->host_newer = st != 0;
    }
    for (int i = 0; i < o->nparams && !st; i++) /* later runs leave the gradients on the device */
        if (rt_session_keep_on_device(s, gradbuf[i]))
            st = failf(s, XTC_ERR_MEMORY, "out of memory for the step");
    a.phase = RT_ADAMW_NORM;
    if (!st)
        st = rt_session_device_adamw(s, &a);
    if (st) {
        free(gradbuf);
        return st;
    }
    o->device = 1;
    double sq = 0, last_norm = o->last_norm;
    for (int64_t b = 0; b < o->nblocks; b++)
        sq += o->partial[b];
    StepCtx c = {.o = o};
    step_settings(&c, o, opt, sqrt(sq));
    a.phase = RT_ADAMW_UPDATE;
    a.clip = c.clipping ? c.clip : 1.0f;
    a.decay = c.decay;
    a.b1 = c.b1;
    a.b2 = c.b2;
    a.omb1 = c.omb1;
    a.omb2 = c.omb2;
    a.eps = c.eps;
    a.step_size = c.step_size;
    a.bc2 = c.bc2_sqrt;
    st = rt_session_device_adamw(s, &a);
    if (st) { /* the launch failed: nothing was updated */
        o->step--;
        o->last_norm = last_norm;
    } else {
        *rt_session_stepped(s) = 1;
        o->dev_newer = 1;
    }
    free(gradbuf);
    return st;
}

int xtc_session_step(XtcSession *s, const XtcAdamW *opt)
{
    if (!s)
        return XTC_ERR_ARG;
    rt_session_begin(s);
    if (!rt_session_module(s) || !rt_session_pool(s))
        return failf(s, XTC_ERR_STATE, "xtc_session_step: the session was not created successfully");
    if (!opt)
        return failf(s, XTC_ERR_ARG, "xtc_session_step: no optimizer settings");
    if (!(opt->lr >= 0) || !(opt->beta1 >= 0 && opt->beta1 < 1) || !(opt->beta2 >= 0 && opt->beta2 < 1) ||
        !(opt->eps > 0) || !(opt->weight_decay >= 0) || !(opt->max_grad_norm >= 0) || !isfinite(opt->lr))
        return failf(s, XTC_ERR_RANGE, "xtc_session_step: settings out of range (lr >= 0, 0 <= betas < 1, "
                                       "eps > 0, weight_decay >= 0, max_grad_norm >= 0)");
    struct RtOptim *o;
    int st = optim_get(s, &o);
    if (st)
        return st;
    /* the device step reads the gradients where the device left them (NCCL sums them there);
     * summed over ranks through host memory they are on the host (rt_comm_grad), and the host
     * step takes them there */
    if (o->device >= 0 && rt_session_scaler(s)->buf < 0 && (!rt_session_has_comm(s) || rt_comm_on_device(s)) &&
        (st = device_step(s, o, opt)) >= 0)
        return st;
    st = XTC_OK;
    float **p = rt_calloc((size_t)o->nparams + 1, sizeof *p);
    const float **g = rt_calloc((size_t)o->nparams + 1, sizeof *g);
    if (!p || !g) {
        free(p);
        free(g);
        return failf(s, XTC_ERR_MEMORY, "out of memory for the step");
    }
    const XtcModule *m = rt_session_module(s);
    for (int i = 0; i < o->nparams && !st; i++) {
        p[i] = rt_session_buffer(s, o->buf[i], NULL);
        /* this rank's gradients, or with a communicator those summed over the ranks (rt_comm.c) */
        g[i] = rt_session_has_comm(s) ? (rt_session_output(s, o->grad[i]) ? rt_comm_grad(s, i) : NULL)
                                      : rt_session_output(s, o->grad[i]);
        if (!p[i])
            st = failf(s, XTC_ERR_STATE, "xtc_session_step: weight '%s' is not loaded", m->bufs[o->buf[i]].name);
        else if (!g[i] && rt_session_output(s, o->grad[i]))
            st = failf(s, XTC_ERR_STATE, "xtc_session_step: the last run did not sum its gradients over the ranks "
                                         "(the communicator was paused): run again unpaused first");
        else if (!g[i])
            st = failf(s, XTC_ERR_STATE, "xtc_session_step: no gradients: run the model successfully%s first",
                       rt_session_withheld(s, o->grad[i]) ? " with its targets" : "");
    }
    if (!st && *rt_session_stepped(s))
        st = failf(s, XTC_ERR_STATE, "xtc_session_step: the gradients of the last run were used by a step "
                                     "already: run the model again first");
    if (st) {
        free(p);
        free(g);
        return st;
    }
    *rt_session_stepped(s) = 1; /* taken or skipped, the step used these gradients */
    RtScaler *sc = rt_session_scaler(s);
    if (sc->buf >= 0) {
        sc->skipped = sc->overflow;
        if (sc->overflow) { /* gradients of a too large scale: no update, a smaller scale */
            sc->scale = sc->scale / 2 >= 1 ? sc->scale / 2 : 1;
            sc->good = 0;
            free(p);
            free(g);
            return XTC_OK;
        }
        if (++sc->good >= sc->interval) {
            if (sc->scale * 2 <= 0x1p64)
                sc->scale *= 2;
            sc->good = 0;
        }
    }
    /* ZeRO-1: every rank has the summed gradients and takes the norm of all of them (the same
     * bits everywhere), updates its shard, and the shards of the weights go to every rank */
    int64_t lo, hi;
    int zero1 = rt_comm_shard(s, o->total, -1, &lo, &hi);
    if (!zero1) {
        lo = 0;
        hi = o->total;
    }
    if (relayout(o, lo, hi)) {
        free(p);
        free(g);
        return failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer state");
    }
    StepCtx c = {.o = o, .p = p, .g = g, .blk0 = lo / BLOCK};
    RtPool *pool = rt_session_pool(s);
    rt_pool_parallel_for(pool, norm_task, &c, o->nblocks);
    double sq = 0;
    for (int64_t b = 0; b < o->nblocks; b++)
        sq += o->partial[b];
    step_settings(&c, o, opt, sqrt(sq));
    rt_pool_parallel_for(pool, update_task, &c, (hi + BLOCK - 1) / BLOCK - lo / BLOCK);
    if (zero1)
        st = rt_comm_gather_params(s, p, o->offset, o->nparams);
    free(p);
    free(g);
    return st;
}

int rt_optim_sync(XtcSession *s, int64_t step)
{
    struct RtOptim **slot = rt_session_optim(s);
    if (step <= 0) { /* rank 0 has taken no step: no state anywhere */
        rt_optim_free(*slot);
        *slot = NULL;
        return XTC_OK;
    }
    struct RtOptim *o;
    int st = optim_get(s, &o);
    /* rank 0 holds all of the state (ZeRO-1 after a load, or replicated): its copy to every rank;
     * else (ZeRO-1, sharded) each shard's owner has it */
    int64_t full = is_full(o);
    if (!st)
        st = rt_comm_broadcast(s, &full, sizeof full);
    if (!st && !full)
        st = gather_state(s, o);
    else if (!st && relayout(o, 0, o->total))
        st = failf(s, XTC_ERR_MEMORY, "out of memory for the optimizer state (%" PRId64 " parameters)", o->total);
    if (!st && full)
        st = rt_comm_broadcast(s, o->m, o->total * (int64_t)sizeof *o->m);
    if (!st && full)
        st = rt_comm_broadcast(s, o->v, o->total * (int64_t)sizeof *o->v);
    if (!st)
        o->step = step;
    return st;
}

int64_t xtc_session_step_count(const XtcSession *s)
{
    struct RtOptim **slot = s ? rt_session_optim((XtcSession *)s) : NULL;
    return slot && *slot ? (*slot)->step : 0;
}

double xtc_session_grad_norm(const XtcSession *s)
{
    struct RtOptim **slot = s ? rt_session_optim((XtcSession *)s) : NULL;
    return slot && *slot ? (*slot)->last_norm : -1;
}

/* ---- state ---- */

static int find_weight(const XtcModule *m, const char *name)
{
    for (int k = RT_BUF_PARAM; k <= RT_BUF_STATE; k++)
        for (int i = 0; i < m->nby_kind[k]; i++) {
            int b = m->by_kind[k][i];
            if (strcmp(m->bufs[b].name, name) == 0)
                return b;
        }
    return -1;
}

static void view(XtcTensor *t, const RtBuffer *b, const void *data)
{
    memset(t, 0, sizeof *t);
    t->dtype = b->dtype; /* f32, or i8 (an int8 weight) */
    t->rank = b->rank;
    for (int i = 0; i < b->rank; i++)
        t->shape[i] = b->shape[i].c;
    t->data = data;
}

int xtc_session_get_weight(XtcSession *s, const char *name, XtcTensor *out)
{
    if (!s || !name || !out)
        return s ? failf(s, XTC_ERR_ARG, "xtc_session_get_weight: bad arguments") : XTC_ERR_ARG;
    rt_session_begin(s);
    const XtcModule *m = rt_session_module(s);
    if (!m)
        return failf(s, XTC_ERR_STATE, "xtc_session_get_weight: the session was not created successfully");
    int b = find_weight(m, name);
    if (b < 0)
        return failf(s, XTC_ERR_NAME, "the model has no parameter or buffer named '%s'", name);
    const void *data = rt_session_weight(s, b, NULL);
    if (!data)
        return xtc_session_error(s)[0] ? XTC_ERR_IO : failf(s, XTC_ERR_STATE, "weight '%s' is not loaded", name);
    view(out, &m->bufs[b], data);
    return XTC_OK;
}

int xtc_session_get_optim(XtcSession *s, const char *param, XtcTensor *mt, XtcTensor *vt)
{
    if (!s || !param)
        return s ? failf(s, XTC_ERR_ARG, "xtc_session_get_optim: bad arguments") : XTC_ERR_ARG;
    rt_session_begin(s);
    struct RtOptim *o = *rt_session_optim(s);
    if (!o || o->step == 0)
        return failf(s, XTC_ERR_STATE, "no optimizer state yet: no step was taken");
    if (!is_full(o))
        return failf(s, XTC_ERR_STATE, "xtc_session_get_optim: the optimizer state is sharded over the ranks "
                                       "(ZeRO-1): xtc_session_gather_optim on every rank first");
    int st = rt_optim_pull(s);
    if (st)
        return st;
    const XtcModule *m = rt_session_module(s);
    for (int i = 0; i < o->nparams; i++)
        if (strcmp(m->bufs[o->buf[i]].name, param) == 0) {
            if (mt)
                view(mt, &m->bufs[o->buf[i]], o->m + o->offset[i]);
            if (vt)
                view(vt, &m->bufs[o->buf[i]], o->v + o->offset[i]);
            return XTC_OK;
        }
    return failf(s, XTC_ERR_NAME, "the model has no parameter named '%s'", param);
}

int xtc_session_set_optim(XtcSession *s, int64_t step, const float *const *mv, const float *const *vv)
{
    if (!s || !mv || !vv || step < 0)
        return s ? failf(s, XTC_ERR_ARG, "xtc_session_set_optim: bad arguments") : XTC_ERR_ARG;
    rt_session_begin(s);
    if (!rt_session_module(s))
        return failf(s, XTC_ERR_STATE, "xtc_session_set_optim: the session was not created successfully");
    struct RtOptim *o;
    int st = optim_get(s, &o);
    if (st)
        return st;
    for (int i = 0; i < o->nparams; i++)
        if (!mv[i] || !vv[i])
            return failf(s, XTC_ERR_ARG, "xtc_session_set_optim: no state for parameter %d", i);
    if ((st = rt_optim_host_write(s)))
        return st;
    for (int i = 0; i < o->nparams; i++) { /* the part this rank keeps (ZeRO-1: its shard) */
        int64_t a = o->offset[i] > o->mv_lo ? o->offset[i] : o->mv_lo;
        int64_t b = o->offset[i + 1] < o->mv_hi ? o->offset[i + 1] : o->mv_hi;
        if (b <= a)
            continue;
        memcpy(o->m + (a - o->mv_lo), mv[i] + (a - o->offset[i]), (size_t)(b - a) * sizeof(float));
        memcpy(o->v + (a - o->mv_lo), vv[i] + (a - o->offset[i]), (size_t)(b - a) * sizeof(float));
    }
    o->step = step;
    return XTC_OK;
}

/* ---- checkpoints ---- */

/* The index of the first value of data[n] that is not finite, or -1. */
static int64_t first_nonfinite(const float *data, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(data[i]))
            return i;
    return -1;
}

const char *rt_optim_state_param(const char *name)
{
    return name && (!strncmp(name, "optim.m.", 8) || !strncmp(name, "optim.v.", 8)) ? name + 8 : NULL;
}

int xtc_session_save_checkpoint(XtcSession *s, const char *path, const char *const *keys,
                                const char *const *values, int nmeta)
{
    if (!s || !path || nmeta < 0 || (nmeta && (!keys || !values)))
        return s ? failf(s, XTC_ERR_ARG, "xtc_session_save_checkpoint: bad arguments") : XTC_ERR_ARG;
    rt_session_begin(s);
    const XtcModule *m = rt_session_module(s);
    if (!m)
        return failf(s, XTC_ERR_STATE, "xtc_session_save_checkpoint: the session was not created successfully");
    RtStWriter *w = rt_st_writer_new();
    if (!w)
        return failf(s, XTC_ERR_MEMORY, "out of memory writing %s", path);
    struct RtOptim *o = *rt_session_optim(s);
    char name[600], num[32];
    int st = rt_optim_pull(s); /* the device's weights and moments, where it stepped */
    if (!st && o && o->step > 0 && !is_full(o))
        st = failf(s, XTC_ERR_STATE, "cannot save %s: the optimizer state is sharded over the ranks (ZeRO-1): "
                   "xtc_session_gather_optim on every rank first", path);
    for (int k = RT_BUF_PARAM; k <= RT_BUF_STATE && !st; k++)
        for (int i = 0; i < m->nby_kind[k] && !st; i++) {
            int b = m->by_kind[k][i];
            const int64_t *shape;
            const void *data = rt_session_weight(s, b, &shape);
            int64_t n = 1, bad;
            for (int d = 0; data && d < m->bufs[b].rank; d++)
                n *= shape[d];
            if (!data)
                st = failf(s, XTC_ERR_STATE, "cannot save %s: weight '%s' is not loaded", path, m->bufs[b].name);
            else if (m->bufs[b].dtype == XTC_I8) /* an int8 weight (its scales are f32) */
                rt_st_writer_add(w, m->bufs[b].name, RT_I8, m->bufs[b].rank, shape, data);
            else if ((bad = first_nonfinite(data, n)) >= 0) /* a diverged run: keep the last good file */
                st = failf(s, XTC_ERR_RANGE, "not saving %s: weight '%s' holds %g at element %" PRId64
                           " (the weights are no longer finite)", path, m->bufs[b].name, ((const float *)data)[bad],
                           bad);
            else
                rt_st_writer_add(w, m->bufs[b].name, RT_F32, m->bufs[b].rank, shape, data);
        }
    for (int a = 0; a < m->naliases && !st; a++) {
        int b = m->aliases[a].buf;
        const int64_t *shape;
        const void *data = rt_session_weight(s, b, &shape);
        rt_st_writer_add(w, m->aliases[a].name, RT_F32, m->bufs[b].rank, shape, data);
    }
    for (int i = 0; o && o->step > 0 && i < o->nparams && !st; i++) {
        const RtBuffer *b = &m->bufs[o->buf[i]];
        int64_t shape[XTC_MAX_RANK];
        for (int d = 0; d < b->rank; d++)
            shape[d] = b->shape[d].c;
        int64_t n = 1, bad;
        for (int d = 0; d < b->rank; d++)
            n *= shape[d];
        if ((bad = first_nonfinite(o->m + o->offset[i], n)) >= 0 ||
            (bad = first_nonfinite(o->v + o->offset[i], n)) >= 0) {
            st = failf(s, XTC_ERR_RANGE, "not saving %s: the optimizer state of '%s' is not finite at element "
                       "%" PRId64, path, b->name, bad);
            break;
        }
        snprintf(name, sizeof name, "optim.m.%s", b->name);
        rt_st_writer_add(w, name, RT_F32, b->rank, shape, o->m + o->offset[i]);
        snprintf(name, sizeof name, "optim.v.%s", b->name);
        rt_st_writer_add(w, name, RT_F32, b->rank, shape, o->v + o->offset[i]);
    }
    if (!st) {
        rt_st_writer_meta(w, "format", "pt"); /* what safetensors' torch loader expects */
        rt_st_writer_meta(w, "xtc.model", m->name ? m->name : "");
        snprintf(num, sizeof num, "%" PRId64, o ? o->step : (int64_t)0);
        rt_st_writer_meta(w, "xtc.optim.step", num);
        for (int b = 0; b < m->nbufs; b++)
            if (m->bufs[b].qscale >= 0) { /* int8 weights: their group, as xtc quantize writes it */
                snprintf(num, sizeof num, "%" PRId64, m->quant_group);
                rt_st_writer_meta(w, "xtc.quant_group", num);
                break;
            }
        RtScaler *sc = rt_session_scaler(s);
        if (sc->buf >= 0) { /* loss scaling: S and the good steps towards doubling it */
            char scale[40], good[32];
            snprintf(scale, sizeof scale, "%.17g", sc->scale);
            snprintf(good, sizeof good, "%" PRId64, sc->good);
            rt_st_writer_meta(w, "xtc.loss_scale", scale);
            rt_st_writer_meta(w, "xtc.loss_scale.good_steps", good);
        }
        for (int i = 0; i < nmeta; i++)
            rt_st_writer_meta(w, keys[i], values[i]);
        char msg[512];
        int rc = rt_st_writer_save(w, path, msg, sizeof msg);
        if (rc)
            st = failf(s, rc == RT_ST_ENOMEM ? XTC_ERR_MEMORY : XTC_ERR_IO, "%s", msg);
    }
    rt_st_writer_free(w);
    return st;
}

/* A tensor of the file matching buffer b's constant shape, converted to f32 into a new array. */
static float *read_f32(XtcSession *s, const RtStTensor *t, const RtBuffer *b, const char *path, int *st)
{
    int same = t->rank == b->rank;
    for (int d = 0; same && d < b->rank; d++)
        same = t->shape[d] == b->shape[d].c;
    if (!same) {
        char got[160] = "", want[160] = "";
        for (int d = 0; d < t->rank; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        for (int d = 0; d < b->rank; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", d ? ", " : "", b->dims[d]);
        *st = failf(s, XTC_ERR_SHAPE, "%s: tensor '%s' has shape [%s], the model expects [%s]", path, t->name, got,
                    want);
        return NULL;
    }
    int64_t n = rt_st_numel(t);
    float *data = rt_malloc((size_t)(n ? n : 1) * sizeof *data);
    char msg[512];
    if (!data)
        *st = failf(s, XTC_ERR_MEMORY, "out of memory reading %s", path);
    else if (rt_st_to_f32(t, data, msg, sizeof msg)) {
        *st = failf(s, XTC_ERR_FORMAT, "%s: %s", path, msg);
        free(data);
        data = NULL;
    }
    return data;
}

int xtc_session_load_checkpoint(XtcSession *s, const char *path, int optimizer)
{
    if (!s || !path)
        return s ? failf(s, XTC_ERR_ARG, "xtc_session_load_checkpoint: bad arguments") : XTC_ERR_ARG;
    rt_session_begin(s);
    const XtcModule *m = rt_session_module(s);
    if (!m)
        return failf(s, XTC_ERR_STATE, "xtc_session_load_checkpoint: the session was not created successfully");
    for (int b = 0; b < m->nbufs; b++)
        if (m->bufs[b].qscale >= 0) /* int8 weights: an inference module, which has no optimizer state */
            return xtc_session_load_weights(s, path);
    RtStFile *f;
    char msg[512];
    int st = rt_st_open(path, &f, msg, sizeof msg);
    if (st)
        return failf(s, st == RT_ST_EIO ? XTC_ERR_IO : st == RT_ST_ENOMEM ? XTC_ERR_MEMORY : XTC_ERR_FORMAT, "%s",
                     msg);
    /* every tensor must be a weight, a tied name, or optimizer state of a parameter */
    int noptim = 0;
    for (int i = 0; i < rt_st_count(f) && !st; i++) {
        const char *nm = rt_st_get(f, i)->name;
        int ok = find_weight(m, nm) >= 0;
        for (int a = 0; !ok && a < m->naliases; a++)
            ok = strcmp(m->aliases[a].name, nm) == 0;
        if (!ok && rt_optim_state_param(nm)) {
            int b = find_weight(m, rt_optim_state_param(nm));
            ok = b >= 0 && m->bufs[b].kind == RT_BUF_PARAM;
            noptim += ok;
        }
        if (!ok)
            st = failf(s, XTC_ERR_NAME, "%s: tensor '%s' is not a weight of the model '%s'", path, nm, m->name);
    }
    int np = m->nby_kind[RT_BUF_PARAM], nw = np + m->nby_kind[RT_BUF_STATE];
    if (!st && optimizer && noptim && noptim != 2 * np)
        st = failf(s, XTC_ERR_NAME, "%s: optimizer state for %d of the %d parameters", path, noptim / 2, np);
    const char *step_text = rt_st_metadata(f, "xtc.optim.step");
    char *end = NULL;
    long long step = step_text ? strtoll(step_text, &end, 10) : 0;
    int with_optim = !st && optimizer && noptim > 0;
    if (with_optim && (!step_text || *end || step <= 0))
        st = failf(s, XTC_ERR_FORMAT, "%s: optimizer state without a valid xtc.optim.step", path);
    /* loss scaling's state, when the file has it (restored with the optimizer) */
    const char *scale_text = rt_st_metadata(f, "xtc.loss_scale");
    const char *good_text = rt_st_metadata(f, "xtc.loss_scale.good_steps");
    double scale = 0;
    long long good = 0;
    int with_scale = !st && optimizer && scale_text && good_text && rt_session_scaler(s)->buf >= 0;
    if (with_scale) {
        char *e1 = NULL, *e2 = NULL;
        scale = strtod(scale_text, &e1);
        good = strtoll(good_text, &e2, 10);
        if (*e1 || *e2 || !(scale >= 1 && scale <= 0x1p64) || good < 0)
            st = failf(s, XTC_ERR_FORMAT, "%s: bad loss-scale state (xtc.loss_scale %s, good steps %s)", path,
                       scale_text, good_text);
    }
    float **w = rt_calloc((size_t)nw + 1, sizeof *w), **mv = rt_calloc((size_t)np + 1, sizeof *mv),
          **vv = rt_calloc((size_t)np + 1, sizeof *vv);
    if (!w || !mv || !vv)
        st = st ? st : failf(s, XTC_ERR_MEMORY, "out of memory reading %s", path);
    for (int i = 0; i < nw && !st; i++) {
        int b = i < np ? m->by_kind[RT_BUF_PARAM][i] : m->by_kind[RT_BUF_STATE][i - np];
        const RtStTensor *t = rt_st_find(f, m->bufs[b].name);
        if (!t) {
            st = failf(s, XTC_ERR_NAME, "%s: missing tensor '%s'", path, m->bufs[b].name);
            break;
        }
        w[i] = read_f32(s, t, &m->bufs[b], path, &st);
        if (i < np && with_optim && !st) {
            char name[600];
            snprintf(name, sizeof name, "optim.m.%s", m->bufs[b].name);
            const RtStTensor *tm = rt_st_find(f, name);
            snprintf(name, sizeof name, "optim.v.%s", m->bufs[b].name);
            const RtStTensor *tv = rt_st_find(f, name);
            if (!tm || !tv)
                st = failf(s, XTC_ERR_NAME, "%s: missing optimizer state of '%s'", path, m->bufs[b].name);
            if (!st)
                mv[i] = read_f32(s, tm, &m->bufs[b], path, &st);
            if (!st)
                vv[i] = read_f32(s, tv, &m->bufs[b], path, &st);
        }
    }
    /* the optimizer's memory before anything changes: the commit below allocates nothing */
    struct RtOptim *o;
    if (!st && with_optim)
        st = optim_get(s, &o);
    /* commit: the weights, then the optimizer (reset when the file has none) */
    for (int i = 0; i < nw && !st; i++) {
        int b = i < np ? m->by_kind[RT_BUF_PARAM][i] : m->by_kind[RT_BUF_STATE][i - np];
        rt_session_adopt(s, b, w[i]);
        w[i] = NULL;
    }
    if (!st && optimizer) {
        if (with_optim) {
            st = xtc_session_set_optim(s, step, (const float *const *)mv, (const float *const *)vv);
        } else {
            struct RtOptim **slot = rt_session_optim(s);
            rt_optim_free(*slot);
            *slot = NULL;
        }
        if (!st && with_scale) {
            RtScaler *sc = rt_session_scaler(s);
            sc->scale = scale;
            sc->good = good;
        }
    }
    for (int i = 0; w && i < nw; i++)
        free(w[i]);
    for (int i = 0; mv && vv && i < np; i++) {
        free(mv[i]);
        free(vv[i]);
    }
    free(w);
    free(mv);
    free(vv);
    rt_st_close(f);
    return st;
}
