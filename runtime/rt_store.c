/* rt_store.c: a CPU module's buffers stored in 16 bits (the metadata's "storage" records: the
 * matmul weights of `xtc compile --target cpu --dtype bf16`, cg_plan.h CG_STORE_MATMUL_WEIGHTS).
 *
 * The host API stays f32: the session keeps every weight in f32 (its own[] copy: what
 * xtc_session_set_weight and the weights file give, what the optimizer updates and checkpoints
 * save, the master weights of training) and, for each buffer the module stores in bf16, a bf16
 * copy rounded to nearest even (rt_half.h, as the CUDA runtime rounds on upload) that the kernels
 * read. The copy is made again before a run when the f32 value changed since (s->changed: set
 * wherever a weight is rebound or handed out for writing, as for a device). CUDA modules keep
 * their 16-bit copies on the device (rt_cuda.c) and do not come here.
 *
 * KV caches (`--kv-dtype bf16`, cg_plan.h CG_STORE_KV_CACHES) are stored in bf16 throughout: an
 * input cache holds its bf16 values in own[] (xtc_session_set_input rounds the caller's f32 to
 * nearest even, rs_store_input), the output cache (the input with the call's rows appended) is a
 * bf16 temp, so that xtc_session_carry hands its memory over (or appends in place) as for f32;
 * xtc_session_get_output widens a 16-bit output into half[] (rs_store_output). Caches stored
 * as int8 rows (`--kv-dtype int8`, RT_STORE_INT8_ROWS: D int8 values and an f32 scale a row,
 * rt_half.h) go the same way, quantized row by row as they are bound and widened to q s,
 * (D + 4) bytes a row of D values (rs_stored_bytes, rs_buffer_bytes). */
#include "rt_half.h"
#include "rt_session.h"

#include <stdlib.h>
#include <string.h>

int rs_store_open(XtcSession *s)
{
    const XtcModule *m = s->m;
    if (m->device)
        return XTC_OK;
    int any = 0;
    for (int b = 0; b < m->nbufs; b++)
        any |= m->bufs[b].storage != 0;
    if (!any)
        return XTC_OK;
    size_t nb = (size_t)m->nbufs + 1;
    s->half = rt_calloc(nb, sizeof *s->half);
    if (!s->changed)
        s->changed = rt_calloc(nb, 1);
    if (!s->half || !s->changed)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory creating a session");
    return XTC_OK;
}

int rs_store_sync(XtcSession *s)
{
    const XtcModule *m = s->m;
    if (!s->half)
        return XTC_OK;
    for (int b = 0; b < m->nbufs; b++) {
        const RtBuffer *buf = &m->bufs[b];
        if (!buf->storage || buf->kind == RT_BUF_TEMP || buf->kind == RT_BUF_INPUT || !s->own[b])
            continue;
        int64_t n = rs_numel_of(buf->rank, s->shape[b]);
        if (s->changed[b] || !s->half[b]) {
            uint16_t *h = s->half[b] ? s->half[b] : rt_malloc(n > 0 ? (size_t)n * 2 : 1);
            if (!h)
                return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the bf16 copy of '%s'", buf->name);
            s->half[b] = h;
            const float *src = s->own[b];
            for (int64_t i = 0; i < n; i++)
                h[i] = rt_f32_to_half(buf->storage, src[i]);
            s->changed[b] = 0;
        }
        s->ptr[b] = s->half[b];
    }
    return XTC_OK;
}

void rs_store_forget(XtcSession *s, int b)
{
    if (s->half && b >= 0 && b < s->m->nbufs) { /* rebound: its shape may differ */
        free(s->half[b]);
        s->half[b] = NULL;
    }
}

void rs_store_free(XtcSession *s)
{
    if (!s->half)
        return;
    for (int b = 0; b < s->m->nbufs; b++)
        free(s->half[b]);
    free(s->half);
    s->half = NULL;
}

void *rs_store_input(const XtcModule *m, int b, const float *src, int64_t n)
{
    if (m->bufs[b].storage == RT_STORE_INT8_ROWS) {
        const RtBuffer *buf = &m->bufs[b];
        int64_t D = buf->shape[buf->rank - 1].c, rows = n > 0 ? n / D : 0;
        char *q = rt_malloc(rows ? (size_t)(rows * (D + 4)) : 1);
        for (int64_t r = 0; q && r < rows; r++)
            rt_i8_row_quantize(src + r * D, D, q + r * (D + 4));
        return q;
    }
    uint16_t *h = rt_malloc(n > 0 ? (size_t)n * 2 : 1);
    for (int64_t i = 0; h && i < n; i++)
        h[i] = rt_f32_to_half(m->bufs[b].storage, src[i]);
    return h;
}

const float *rs_store_output(XtcSession *s, int b, const void *data, int64_t n)
{
    if (!s->half)
        return NULL;
    float *w = realloc(s->half[b], n > 0 ? (size_t)n * sizeof *w : 1);
    if (!w)
        return NULL;
    s->half[b] = w;
    const RtBuffer *buf = &s->m->bufs[b];
    if (buf->storage == RT_STORE_INT8_ROWS) {
        int64_t D = buf->shape[buf->rank - 1].c;
        for (int64_t r = 0; r < (n > 0 ? n / D : 0); r++)
            rt_i8_row_widen((const char *)data + r * (D + 4), D, w + r * D);
        return w;
    }
    rt_half_widen(buf->storage, data, w, (size_t)(n > 0 ? n : 0));
    return w;
}

size_t rs_stored_elem(const XtcModule *m, int b)
{
    if (m->device || !m->bufs[b].storage)
        return xtc_dtype_size(m->bufs[b].dtype);
    return m->bufs[b].storage == RT_STORE_INT8_ROWS ? 1 : 2; /* int8 rows: and 4 bytes a row (rs_stored_bytes) */
}

size_t rs_stored_bytes(const XtcModule *m, int b, int rank, const int64_t *shape)
{
    size_t n = (size_t)rs_numel_of(rank, shape);
    const RtBuffer *buf = &m->bufs[b];
    if (m->device || buf->storage != RT_STORE_INT8_ROWS)
        return n * rs_stored_elem(m, b);
    int64_t D = buf->shape[buf->rank - 1].c;
    return n / (size_t)D * (size_t)(D + 4);
}
