/* rt_quant.c: int8 weights (xtc compile --weights-dtype int8; include/xtc.h, "int8 weights").
 *
 * A module compiled with int8 weights holds, for each matmul weight W [n, k], the state buffers
 * "<name>" i8 [n, k] and "<name>.scale" f32 [n, ng], ng = ceil(k / G), and reads W[j, p] as
 * q[j, p] * scale[j, p / G]; G is the module's option quant_group (0, or at least k: one group of
 * k, a scale per output row). Quantization, the one rule (the runtime's at load, xtc quantize's):
 *
 *   per row j and group g: a = max |W[j, p]| over the group's p
 *   scale[j, g] = a / 127 (as f32; 0 when a = 0)
 *   q[j, p] = round_half_even(W[j, p] / scale[j, g]), within [-127, 127] (0 when the scale is 0)
 *
 * so the largest weight of each group is exactly +-127 scale and every weight is within half a
 * step (scale / 2) of its value. Non-finite weights are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt_quant.h"
#include "rt_session.h"

int64_t rt_quant_group_of(int64_t module_group, int64_t k)
{
    return module_group > 0 && module_group < k ? module_group : (k > 0 ? k : 1);
}

int64_t rt_quantize_rows(const float *w, int64_t n, int64_t k, int64_t group, int8_t *q, float *scale)
{
    group = rt_quant_group_of(group, k);
    int64_t ng = k > 0 ? (k + group - 1) / group : 1;
    for (int64_t j = 0; j < n; j++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t p0 = g * group, p1 = p0 + group < k ? p0 + group : k;
            const float *row = w + j * k;
            float a = 0;
            for (int64_t p = p0; p < p1; p++) {
                if (!isfinite(row[p]))
                    return j * k + p;
                a = fmaxf(a, fabsf(row[p]));
            }
            float s = a / 127.0f;
            scale[j * ng + g] = s;
            for (int64_t p = p0; p < p1; p++) {
                float x = s > 0 ? nearbyintf(row[p] / s) : 0.0f;
                q[j * k + p] = (int8_t)(x > 127 ? 127 : x < -127 ? -127 : x);
            }
        }
    return -1;
}

int rt_quant_link(XtcModule *m)
{
    m->quant_group = 0;
    for (int o = 0; o < m->noptions; o++)
        if (!strcmp(m->options[o].key, "quant_group")) {
            char *end;
            long long g = strtoll(m->options[o].value, &end, 10);
            if (*end || g < 0) {
                rt_set_error(m->err, sizeof m->err, "module metadata: bad quant_group '%s'", m->options[o].value);
                return -1;
            }
            m->quant_group = g;
        }
    for (int i = 0; i < m->nbufs; i++)
        m->bufs[i].qscale = m->bufs[i].qweight = -1;
    for (int i = 0; i < m->nbufs; i++) {
        RtBuffer *b = &m->bufs[i];
        if (b->dtype != XTC_I8)
            continue;
        char name[1024];
        snprintf(name, sizeof name, "%s.scale", b->name);
        int sb = rs_find_buffer(m, RT_BUF_STATE, name);
        if (b->kind != RT_BUF_STATE || b->rank != 2 || b->shape[0].c < 0 || b->shape[1].c < 1 || sb < 0 ||
            m->bufs[sb].dtype != XTC_F32 || m->bufs[sb].rank != 2) {
            rt_set_error(m->err, sizeof m->err, "module metadata: i8 buffer '%s' is not an int8 weight [n, k] with "
                         "f32 scales '%s'", b->name, name);
            return -1;
        }
        int64_t k = b->shape[1].c, group = rt_quant_group_of(m->quant_group, k), ng = m->bufs[sb].shape[1].c;
        if (ng >= 1 && (k + group - 1) / group != ng) /* a graph of several groups (built by hand): its own */
            group = (k + ng - 1) / ng;
        for (int d = 0; d < 2; d++)
            for (int s = 0; s < RT_MAXSYM; s++)
                if (b->shape[d].k[s] || m->bufs[sb].shape[d].k[s]) {
                    rt_set_error(m->err, sizeof m->err, "module metadata: int8 weight '%s' has a symbolic shape",
                                 b->name);
                    return -1;
                }
        if (m->bufs[sb].shape[0].c != b->shape[0].c || m->bufs[sb].shape[1].c != (k + group - 1) / group) {
            rt_set_error(m->err, sizeof m->err, "module metadata: the scales '%s' do not fit weight '%s' in "
                         "groups of %lld", name, b->name, (long long)group);
            return -1;
        }
        b->qscale = sb;
        b->qgroup = group;
        m->bufs[sb].qweight = i;
    }
    return 0;
}

int rt_quant_fill(const XtcModule *m, int b, const float *w, int8_t *q, float *scale, char *err, size_t n)
{
    const RtBuffer *wb = &m->bufs[b];
    int64_t rows = wb->shape[0].c, k = wb->shape[1].c;
    int64_t bad = rt_quantize_rows(w, rows, k, wb->qgroup, q, scale);
    if (bad >= 0) {
        rt_set_error(err, n, "weight '%s' holds %g at [%lld, %lld]: only finite weights can be quantized to int8",
                     wb->name, (double)w[bad], (long long)(bad / k), (long long)(bad % k));
        return -1;
    }
    return 0;
}

int rt_quant_set(XtcSession *s, int b, const float *data)
{
    const XtcModule *m = s->m;
    const RtBuffer *wb = &m->bufs[b], *sb = &m->bufs[wb->qscale];
    int64_t wshape[2] = {wb->shape[0].c, wb->shape[1].c}, sshape[2] = {sb->shape[0].c, sb->shape[1].c};
    int8_t *q = rt_malloc((size_t)(wshape[0] * wshape[1] > 0 ? wshape[0] * wshape[1] : 1));
    float *scale = rt_malloc((size_t)(sshape[0] * sshape[1] > 0 ? sshape[0] * sshape[1] : 1) * sizeof *scale);
    if (!q || !scale) {
        free(q);
        free(scale);
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory quantizing weight '%s'", wb->name);
    }
    char msg[512];
    if (rt_quant_fill(m, b, data, q, scale, msg, sizeof msg)) {
        free(q);
        free(scale);
        return rs_fail(s, XTC_ERR_RANGE, "%s", msg);
    }
    rs_bind_buffer(s, b, q, 2, wshape);
    rs_bind_buffer(s, wb->qscale, scale, 2, sshape);
    return XTC_OK;
}

int xtc_session_set_weight_i8(XtcSession *s, const char *name, int rank, const int64_t *shape, const int8_t *data)
{
    if (!rs_ready(s, "xtc_session_set_weight_i8"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (!name || (rank > 0 && !shape) || rank < 0 || rank > XTC_MAX_RANK)
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_set_weight_i8: bad arguments");
    int b = rs_find_buffer(s->m, RT_BUF_STATE, name);
    if (b < 0 || s->m->bufs[b].dtype != XTC_I8)
        return rs_fail(s, XTC_ERR_NAME, "the model has no int8 weight named '%s'", name);
    int st = rs_check_shape(s, &s->m->bufs[b], "weight", rank, shape);
    if (st)
        return st;
    int64_t n = rs_numel_of(rank, shape);
    if (n && !data)
        return rs_fail(s, XTC_ERR_ARG, "weight '%s': no data", name);
    int8_t *copy = rt_malloc(n ? (size_t)n : 1);
    if (!copy)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for weight '%s'", name);
    if (n)
        memcpy(copy, data, (size_t)n);
    rs_bind_buffer(s, b, copy, rank, shape);
    return XTC_OK;
}
