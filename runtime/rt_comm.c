/* rt_comm.c: data parallelism in the runtime: a session's gradients summed over ranks through the
 * caller's XtcComm (include/xtc.h), in buckets started while the backward pass still runs, and
 * rank 0's state handed to every rank (xtc_session_sync). No MPI here: the transport is a struct
 * of functions (include/xtc_mpi.h makes one from an MPI communicator).
 *
 * When is a gradient final? The schedule is a fixed list of steps and the session's step hook
 * (XtcRtApi.step_done) runs after each one, so the last step that writes or reads a grad.<param>
 * output's buffer is known from the module's metadata: after it, nothing touches that buffer. The
 * parameters are sorted by that step and cut into buckets of about XTC_COMM_BUCKET_BYTES; after
 * each step every bucket whose last gradient is final is copied (times the rank's share of the
 * batch) into the reduction buffer `red` and its sum started, and the started ones are given a
 * chance to progress. The run returns when all are complete; xtc_session_step reads `red`. */
#include "rt_session.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int first, last;  /* positions in RtComm.order */
    int ready;        /* the schedule step after which all its gradients are final (-1: from the start) */
    int64_t off, n;   /* its floats in red */
    void *req;        /* its reduction in flight, or NULL */
    int started, done;
} Bucket;

struct RtComm {
    XtcComm c;
    double share;     /* this rank's weight in the sum */
    int nparams;
    int *order;       /* [nparams] parameter indices (module order) sorted by the step finishing them */
    int *grad_out;    /* [nparams] output index of grad.<param> */
    int64_t *numel;   /* [nparams] */
    int64_t *roff;    /* [nparams] offset of the parameter's gradient in red */
    float *red;       /* the summed gradients */
    Bucket *bk;
    int nbk;
    int next;         /* the first bucket not yet started */
    int valid;        /* red holds the sums of the last run */
    int paused;       /* xtc_session_set_comm_paused: runs sum nothing */
    int overlap;      /* buckets start from the step hook (off for loss scaling: they wait for the unscale) */
    int failed;       /* a reduction failed during the run (message in err) */
    RtNccl *nccl;     /* xtc_session_set_nccl: the sums on the device, or NULL */
    int zero1;        /* xtc_session_set_zero1: each rank keeps the optimizer state of its shard */
    double during, after; /* seconds in the step hook, and waiting after the schedule */
    char err[512];
};

static void comm_free(struct RtComm *c)
{
    if (!c)
        return;
    rt_nccl_free(c->nccl);
    if (c->c.release)
        c->c.release(c->c.ctx);
    free(c->order);
    free(c->grad_out);
    free(c->numel);
    free(c->roff);
    free(c->red);
    free(c->bk);
    free(c);
}

void rt_comm_free(XtcSession *s)
{
    comm_free(s->comm);
    s->comm = NULL;
}

/* The step after which buffer b is neither written nor read (-1: no step touches it). */
static int last_touch(const XtcModule *m, int b)
{
    int last = -1;
    for (int i = 0; i < m->nsteps; i++) {
        int touches = m->steps[i].out == b;
        for (int k = 0; k < RT_MAXIN && !touches; k++)
            touches = m->steps[i].in[k] == b;
        if (touches)
            last = i;
    }
    return last;
}

static int64_t const_numel(const RtBuffer *b)
{
    int64_t n = 1;
    for (int d = 0; d < b->rank; d++)
        n *= b->shape[d].c;
    return n;
}

typedef struct {
    int ready, param;
} ReadyParam;

static int by_ready(const void *a, const void *b)
{
    const ReadyParam *x = a, *y = b;
    return x->ready != y->ready ? (x->ready < y->ready ? -1 : 1) : x->param - y->param;
}

int xtc_session_set_comm(XtcSession *s, const XtcComm *comm)
{
    if (!rs_ready(s, "xtc_session_set_comm"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (comm && (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size || !comm->allreduce_start ||
                 !comm->wait || !comm->broadcast))
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_set_comm: the communicator needs 0 <= rank < size and the "
                                       "functions allreduce_start, wait and broadcast");
    if (s->comm && s->comm->zero1) /* the other ranks' shards of the state would be lost */
        return rs_fail(s, XTC_ERR_STATE, "xtc_session_set_comm: ZeRO-1 is on: xtc_session_set_zero1(s, 0) on every "
                                         "rank first (it gathers the optimizer state)");
    const XtcModule *m = s->m;
    struct RtComm *c = NULL;
    if (comm) {
        int np = m->nby_kind[RT_BUF_PARAM];
        c = rt_calloc(1, sizeof *c);
        ReadyParam *ready = c ? rt_calloc((size_t)np + 1, sizeof *ready) : NULL;
        if (c) {
            c->c = *comm;
            c->nparams = np;
            c->share = 1.0 / comm->size;
            c->order = rt_calloc((size_t)np + 1, sizeof *c->order);
            c->grad_out = rt_calloc((size_t)np + 1, sizeof *c->grad_out);
            c->numel = rt_calloc((size_t)np + 1, sizeof *c->numel);
            c->roff = rt_calloc((size_t)np + 1, sizeof *c->roff);
            c->bk = rt_calloc((size_t)np + 1, sizeof *c->bk);
        }
        if (!c || !ready || !c->order || !c->grad_out || !c->numel || !c->roff || !c->bk) {
            free(ready);
            if (c)
                c->c.release = NULL; /* the caller keeps its communicator on failure */
            comm_free(c);
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the communicator");
        }
        for (int i = 0; i < np; i++) {
            int b = m->by_kind[RT_BUF_PARAM][i];
            char name[600];
            snprintf(name, sizeof name, "grad.%s", m->bufs[b].name);
            c->grad_out[i] = rs_find_output(m, name);
            if (c->grad_out[i] < 0) {
                free(ready);
                c->c.release = NULL;
                comm_free(c);
                return rs_fail(s, XTC_ERR_NAME, "xtc_session_set_comm: the module has no output '%s': a training "
                                                "module (xtc compile --train) computes the gradients to sum", name);
            }
            int gb = m->outs[c->grad_out[i]].buf;
            ready[i].ready = m->bufs[gb].kind == RT_BUF_TEMP ? last_touch(m, gb) : -1;
            ready[i].param = i;
            c->numel[i] = const_numel(&m->bufs[b]);
        }
        qsort(ready, (size_t)np, sizeof *ready, by_ready);
        int64_t off = 0, cap = XTC_COMM_BUCKET_BYTES / sizeof(float);
        const char *env = getenv("XTC_COMM_BUCKET_BYTES");
        if (env && atoll(env) >= (long long)sizeof(float))
            cap = atoll(env) / (long long)sizeof(float);
        for (int k = 0; k < np; k++) {
            int i = c->order[k] = ready[k].param;
            Bucket *b = c->nbk ? &c->bk[c->nbk - 1] : NULL;
            if (!b || b->n >= cap) {
                b = &c->bk[c->nbk++];
                b->first = k;
                b->off = off;
            }
            b->last = k;
            b->ready = ready[k].ready;
            b->n += c->numel[i];
            c->roff[i] = off;
            off += c->numel[i];
        }
        free(ready);
        c->red = rt_malloc((size_t)(off ? off : 1) * sizeof *c->red);
        if (!c->red) {
            c->c.release = NULL;
            comm_free(c);
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the summed gradients (%" PRId64 " floats)", off);
        }
    }
    rt_comm_free(s);
    s->comm = c;
    rs_update_hook(s);
    return XTC_OK;
}

int xtc_session_set_grad_share(XtcSession *s, double share)
{
    if (!rs_ready(s, "xtc_session_set_grad_share"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!(share > 0 && share <= 1))
        return rs_fail(s, XTC_ERR_RANGE, "xtc_session_set_grad_share: the share %g is outside (0, 1]", share);
    if (!s->comm)
        return rs_fail(s, XTC_ERR_STATE, "xtc_session_set_grad_share: no communicator (xtc_session_set_comm)");
    s->comm->share = share;
    return XTC_OK;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int xtc_session_comm_time(const XtcSession *s, double *during, double *after)
{
    if (!s || !s->m)
        return XTC_ERR_ARG;
    if (during)
        *during = s->comm ? s->comm->during : 0;
    if (after)
        *after = s->comm ? s->comm->after : 0;
    return XTC_OK;
}

int xtc_session_set_comm_paused(XtcSession *s, int paused)
{
    if (!rs_ready(s, "xtc_session_set_comm_paused"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!s->comm)
        return rs_fail(s, XTC_ERR_STATE, "xtc_session_set_comm_paused: no communicator (xtc_session_set_comm)");
    s->comm->paused = paused != 0;
    return XTC_OK;
}

/* ---- during a run ---- */

static void start_bucket(XtcSession *s, Bucket *b)
{
    struct RtComm *c = s->comm;
    b->started = 1;
    if (c->failed)
        return;
    const float w = (float)c->share;
    for (int k = b->first; k <= b->last; k++) {
        int i = c->order[k];
        const float *g = s->ptr[s->m->outs[c->grad_out[i]].buf];
        float *r = c->red + c->roff[i];
        for (int64_t j = 0; j < c->numel[i]; j++)
            r[j] = g[j] * w;
    }
    if (c->c.allreduce_start(c->c.ctx, c->red + b->off, b->n, &b->req, c->err, sizeof c->err) != 0)
        c->failed = 1;
}

/* Progress for the reductions in flight (the transport may need calls to move them on). */
static void poll_buckets(struct RtComm *c)
{
    for (int k = 0; k < c->next && c->c.test && !c->failed; k++) {
        Bucket *b = &c->bk[k];
        if (!b->req || b->done)
            continue;
        int r = c->c.test(c->c.ctx, b->req, c->err, sizeof c->err);
        if (r < 0)
            c->failed = 1;
        else if (r > 0) {
            b->done = 1;
            b->req = NULL;
        }
    }
}

/* After schedule step `step` (the session's hook). */
void rt_comm_step_done(XtcSession *s, int32_t step)
{
    struct RtComm *c = s->comm;
    if (!c || !c->overlap)
        return;
    double t0 = seconds();
    int started = 0;
    while (c->next < c->nbk && c->bk[c->next].ready <= step) {
        start_bucket(s, &c->bk[c->next++]);
        started = 1;
    }
    if (started || (step & 7) == 0)
        poll_buckets(c);
    c->during += seconds() - t0;
}

void rt_comm_begin(XtcSession *s)
{
    struct RtComm *c = s->comm;
    c->valid = 0;
    c->failed = 0;
    c->next = 0;
    for (int k = 0; k < c->nbk; k++) {
        c->bk[k].started = c->bk[k].done = 0;
        c->bk[k].req = NULL;
    }
    /* a device module does not call the hook; loss scaling unscales after the run */
    c->overlap = !s->dev && s->scaler.buf < 0 && !c->paused;
}

/* Waits for every reduction started (a failed run: they must not outlive their memory). */
static void wait_all(struct RtComm *c)
{
    for (int k = 0; k < c->next; k++) {
        Bucket *b = &c->bk[k];
        if (b->req && !b->done && c->c.wait(c->c.ctx, b->req, c->err, sizeof c->err) != 0)
            c->failed = 1;
        b->req = NULL;
        b->done = 1;
    }
}

void rt_comm_abandon(XtcSession *s)
{
    if (s->comm)
        wait_all(s->comm);
}

int rt_comm_rank(const XtcSession *s) { return s->comm ? s->comm->c.rank : -1; }

int rt_comm_set_nccl(XtcSession *s, RtNccl *nc)
{
    struct RtComm *c = s->comm;
    for (int i = 0; i < c->nparams; i++) /* the runs leave the gradients on the device */
        if (rt_session_keep_on_device(s, s->m->outs[c->grad_out[i]].buf)) {
            rt_nccl_free(nc);
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the NCCL communicator");
        }
    rt_nccl_free(c->nccl);
    c->nccl = nc;
    return XTC_OK;
}

int rt_comm_on_device(const XtcSession *s)
{
    const struct RtComm *c = s->comm;
    return c && c->nccl && !c->zero1 && c->valid;
}

/* The device's gradients, each times the rank's share, summed over the ranks in place by NCCL on
 * the session's stream (queued after the run's kernels; the step's kernels queue after them). */
static int nccl_sum(XtcSession *s, struct RtComm *c)
{
    const RtDeviceOps *ops = s->m->device;
    void *stream = NULL;
    int failed = rt_nccl_group(c->nccl, 1, c->err, sizeof c->err);
    for (int i = 0; i < c->nparams && !failed; i++) {
        int b = s->m->outs[c->grad_out[i]].buf;
        void *p = NULL;
        int r = ops->locate(s->dev, b, &p, &stream, c->err, sizeof c->err);
        if (r > 0)
            snprintf(c->err, sizeof c->err, "'%s' is not f32 on the device", s->m->outs[c->grad_out[i]].name);
        failed = r || rt_nccl_allreduce(c->nccl, p, c->numel[i], c->share, stream, c->err, sizeof c->err);
    }
    char err[sizeof c->err];
    if (rt_nccl_group(c->nccl, 0, err, sizeof err) && !failed) {
        memcpy(c->err, err, sizeof err);
        failed = 1;
    }
    return failed;
}

int rt_comm_finish(XtcSession *s)
{
    struct RtComm *c = s->comm;
    if (c->paused)
        return XTC_OK; /* valid stays 0: no step on this run */
    double t0 = seconds();
    if (c->nccl) {
        int failed = nccl_sum(s, c);
        c->after += seconds() - t0;
        if (failed)
            return rs_fail(s, XTC_ERR_IO, "summing the gradients over %d ranks with NCCL: %s", c->c.size, c->err);
        c->valid = 1;
        return XTC_OK;
    }
    /* a device module's gradients come to the host first (the runs leave them on the device) */
    for (int i = 0; i < c->nparams && c->next < c->nbk; i++) {
        const RtOutput *o = &s->m->outs[c->grad_out[i]];
        int st = rs_output_on_host(s, o->buf, o->name);
        if (st) {
            wait_all(c);
            return st;
        }
    }
    while (c->next < c->nbk)
        start_bucket(s, &c->bk[c->next++]);
    wait_all(c);
    c->after += seconds() - t0;
    if (c->failed)
        return rs_fail(s, XTC_ERR_IO, "summing the gradients over %d ranks: %s", c->c.size, c->err);
    if (s->scaler.buf >= 0) { /* overflowed anywhere: the sums are not finite on every rank */
        int64_t n = c->bk && c->nbk ? c->bk[c->nbk - 1].off + c->bk[c->nbk - 1].n : 0;
        int overflow = 0;
        for (int64_t j = 0; j < n; j++)
            overflow |= !isfinite(c->red[j]);
        s->scaler.overflow = overflow;
    }
    c->valid = 1;
    return XTC_OK;
}

const float *rt_comm_grad(XtcSession *s, int param)
{
    struct RtComm *c = s->comm;
    if (!c || !c->valid || param < 0 || param >= c->nparams)
        return NULL;
    /* NCCL summed them on the device, over the run's gradients: read back from there */
    return c->nccl ? rt_session_output(s, c->grad_out[param]) : c->red + c->roff[param];
}

/* ---- rank 0's state to every rank ---- */

static int bcast_from(XtcSession *s, void *data, int64_t bytes, int root)
{
    struct RtComm *c = s->comm;
    if (bytes > 0 && c->c.broadcast(c->c.ctx, data, bytes, root, c->err, sizeof c->err) != 0)
        return rs_fail(s, XTC_ERR_IO, "broadcasting over %d ranks: %s", c->c.size, c->err);
    return XTC_OK;
}

static int bcast(XtcSession *s, void *data, int64_t bytes) { return bcast_from(s, data, bytes, 0); }

int rt_comm_broadcast_from(XtcSession *s, void *data, int64_t bytes, int root)
{
    return bcast_from(s, data, bytes, root);
}

/* ---- ZeRO-1 ---- */

int rt_comm_size(const XtcSession *s) { return s->comm ? s->comm->c.size : 1; }

int rt_comm_shard(const XtcSession *s, int64_t total, int rank, int64_t *lo, int64_t *hi)
{
    const struct RtComm *c = s->comm;
    int size = c ? c->c.size : 1, r = rank < 0 && c ? c->c.rank : (rank < 0 ? 0 : rank);
    int64_t nblocks = (total + RT_ADAMW_BLOCK - 1) / RT_ADAMW_BLOCK;
    int64_t b0 = nblocks * r / size, b1 = nblocks * (r + 1) / size;
    *lo = b0 * RT_ADAMW_BLOCK < total ? b0 * RT_ADAMW_BLOCK : total;
    *hi = b1 * RT_ADAMW_BLOCK < total ? b1 * RT_ADAMW_BLOCK : total;
    return c && c->zero1;
}

/* Copies elements [lo, hi) of the vector of the p[] (cut at offset[]) into vec[lo, hi), or back. */
static void pieces(float *const *p, const int64_t *offset, int nparams, int64_t lo, int64_t hi, float *vec,
                   int to_vec)
{
    for (int i = 0; i < nparams; i++) {
        int64_t a = offset[i] > lo ? offset[i] : lo, b = offset[i + 1] < hi ? offset[i + 1] : hi;
        if (b <= a)
            continue;
        float *w = p[i] + (a - offset[i]);
        if (to_vec)
            memcpy(vec + a, w, (size_t)(b - a) * sizeof *vec);
        else
            memcpy(w, vec + a, (size_t)(b - a) * sizeof *vec);
    }
}

int rt_comm_gather_params(XtcSession *s, float *const *p, const int64_t *offset, int nparams)
{
    struct RtComm *c = s->comm;
    int64_t total = offset[nparams], lo, hi;
    double t0 = seconds();
    c->valid = 0; /* red is the staging buffer now: the step used the sums */
    rt_comm_shard(s, total, -1, &lo, &hi);
    pieces(p, offset, nparams, lo, hi, c->red, 1);
    int st = XTC_OK;
    for (int r = 0; r < c->c.size && !st; r++) {
        rt_comm_shard(s, total, r, &lo, &hi);
        st = bcast_from(s, c->red + lo, (hi - lo) * (int64_t)sizeof *c->red, r);
        if (!st && r != c->c.rank)
            pieces(p, offset, nparams, lo, hi, c->red, 0);
    }
    c->after += seconds() - t0;
    return st;
}

int xtc_session_set_zero1(XtcSession *s, int on)
{
    if (!rs_ready(s, "xtc_session_set_zero1"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!s->comm)
        return rs_fail(s, XTC_ERR_STATE, "xtc_session_set_zero1: no communicator (xtc_session_set_comm)");
    int st = XTC_OK;
    if (on && !s->comm->zero1)
        st = rt_optim_host_write(s); /* the host steps: the device's newer state first */
    else if (!on && s->comm->zero1)
        st = rt_optim_gather(s);
    if (!st)
        s->comm->zero1 = on != 0;
    return st;
}

int xtc_session_gather_optim(XtcSession *s)
{
    if (!rs_ready(s, "xtc_session_gather_optim"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    return s->comm && s->comm->zero1 ? rt_optim_gather(s) : XTC_OK;
}

int xtc_session_sync(XtcSession *s)
{
    if (!rs_ready(s, "xtc_session_sync"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!s->comm)
        return XTC_OK;
    const XtcModule *m = s->m;
    int st = XTC_OK;
    for (int k = RT_BUF_PARAM; k <= RT_BUF_STATE && !st; k++)
        for (int i = 0; i < m->nby_kind[k] && !st; i++) {
            int b = m->by_kind[k][i];
            float *data = rt_session_buffer(s, b, NULL);
            if (!data)
                return rs_fail(s, XTC_ERR_STATE, "xtc_session_sync: weight '%s' is not loaded", m->bufs[b].name);
            st = bcast(s, data, const_numel(&m->bufs[b]) * (int64_t)sizeof(float));
        }
    /* the optimizer: rank 0's step count (0: none yet, every rank drops its state), then m and v */
    int64_t step = xtc_session_step_count(s);
    if (!st)
        st = bcast(s, &step, sizeof step);
    if (!st)
        st = rt_optim_sync(s, step);
    double scale[2] = {s->scaler.scale, (double)s->scaler.good};
    if (!st && s->scaler.buf >= 0 && !(st = bcast(s, scale, sizeof scale))) {
        s->scaler.scale = scale[0];
        s->scaler.good = (int64_t)scale[1];
    }
    return st;
}

int rt_comm_broadcast(XtcSession *s, void *data, int64_t bytes)
{
    return bcast(s, data, bytes);
}
