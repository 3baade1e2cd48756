/* rt_scaler.c: dynamic loss scaling of fp16 training modules (see RtScaler). */
#include "rt_session.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- loss scaling (see RtScaler) ---- */

/* Finds the loss-scale input of a training module and the buffers of its grad.<param> outputs
 * (tied names share one; each is divided once). 0, or -1 when out of memory. */
int rs_scaler_init(XtcSession *s)
{
    const XtcModule *m = s->m;
    RtScaler *sc = &s->scaler;
    sc->buf = -1;
    sc->scale = 65536;
    sc->interval = 2000;
    int b = -1;
    for (int i = 0; i < m->nby_kind[RT_BUF_INPUT] && b < 0; i++) {
        int k = m->by_kind[RT_BUF_INPUT][i];
        if (strcmp(m->bufs[k].name, XTC_LOSS_SCALE_INPUT) == 0 && m->bufs[k].rank == 0 &&
            m->bufs[k].dtype == XTC_F32)
            b = k;
    }
    if (b < 0)
        return 0;
    s->unscale = rt_calloc((size_t)m->nouts + 1, sizeof *s->unscale);
    if (!s->unscale)
        return -1;
    for (int o = 0; o < m->nouts; o++) {
        int ob = m->outs[o].buf, seen = 0;
        if (strncmp(m->outs[o].name, "grad.", 5) != 0 || m->outs[o].dtype != XTC_F32 ||
            m->bufs[ob].kind != RT_BUF_TEMP)
            continue;
        for (int k = 0; k < s->nunscale; k++)
            seen |= s->unscale[k] == ob;
        if (!seen)
            s->unscale[s->nunscale++] = ob;
    }
    if (s->nunscale)
        sc->buf = b;
    return 0;
}

/* Before a run: binds S unless the caller bound the input. */
int rs_scaler_bind(XtcSession *s)
{
    RtScaler *sc = &s->scaler;
    int b = sc->buf;
    if (b < 0 || sc->by_caller)
        return XTC_OK;
    if (!s->set[b]) {
        float *v = rt_malloc(sizeof *v);
        if (!v)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory for input '%s'", XTC_LOSS_SCALE_INPUT);
        rs_bind_buffer(s, b, v, 0, NULL);
    }
    *(float *)s->own[b] = (float)sc->scale;
    if (s->changed)
        s->changed[b] = 1;
    return XTC_OK;
}

/* After a successful run: the gradients divided by the scale the run used (on the host: a
 * device module's are copied back first), and whether one of them is not finite. XTC_OK, or the
 * copy's failure with the session's error set. */
int rs_scaler_unscale(XtcSession *s)
{
    RtScaler *sc = &s->scaler;
    if (sc->buf < 0)
        return XTC_OK;
    const float used = *(const float *)s->own[sc->buf];
    int overflow = 0;
    for (int k = 0; k < s->nunscale; k++) {
        const RtBuffer *b = &s->m->bufs[s->unscale[k]];
        int st = rs_output_on_host(s, s->unscale[k], b->name);
        if (st)
            return st;
        float *g = s->ptr[s->unscale[k]];
        int64_t n = rt_numel(b->shape, b->rank, s->syms);
        for (int64_t i = 0; i < n; i++) {
            g[i] /= used;
            overflow |= !isfinite(g[i]);
        }
    }
    sc->overflow = overflow;
    return XTC_OK;
}

int xtc_session_set_loss_scale(XtcSession *s, double scale, int64_t growth_interval)
{
    if (!rs_ready(s, "xtc_session_set_loss_scale"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!(scale >= 1 && scale <= 0x1p64) || growth_interval < 0)
        return rs_fail(s, XTC_ERR_RANGE, "xtc_session_set_loss_scale: scale %g outside [1, 2^64] or a negative "
                    "growth interval", scale);
    RtScaler *sc = &s->scaler;
    sc->scale = scale;
    if (growth_interval > 0)
        sc->interval = growth_interval;
    sc->good = 0;
    sc->by_caller = 0;
    return XTC_OK;
}

double xtc_session_loss_scale(const XtcSession *s)
{
    return s && s->m && s->scaler.buf >= 0 ? s->scaler.scale : 1;
}

int xtc_session_step_skipped(const XtcSession *s) { return s && s->m ? s->scaler.skipped : 0; }

RtScaler *rt_session_scaler(XtcSession *s) { return &s->scaler; }

