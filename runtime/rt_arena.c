/* rt_arena.c: the memory plan of a session's arenas (offsets from the buffers' lifetimes) and the
 * bounds of a call's work, checked before it runs. */
#include "rt_session.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t memory_bytes(void);

/* ---- the memory plan ---- */

typedef struct {
    int buf;
    size_t bytes;
} Item;

static int by_size_desc(const void *a, const void *b)
{
    const Item *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x->buf - y->buf;
}

/* Bytes of buffer b at these symbol values, elem bytes per element; SIZE_MAX when that does not
 * fit (an allocation of it then fails cleanly). */
size_t rs_buffer_bytes(const RtBuffer *b, size_t elem, const int64_t *syms)
{
    size_t n = elem;
    for (int i = 0; i < b->rank; i++) {
        int64_t d = rt_dim_eval(&b->shape[i], syms);
        if (i == b->rank - 1 && b->storage == RT_STORE_INT8_ROWS && elem == 1 && d > 0)
            d += 4; /* each row's scale (rt_half.h) */
        if (d <= 0)
            return 0;
        if (__builtin_mul_overflow(n, (size_t)d, &n) || n > ((size_t)1 << 50))
            return SIZE_MAX;
    }
    return n;
}

/* Greedy best-fit by decreasing size: each buffer goes at the lowest offset where it overlaps
 * no already placed buffer whose lifetime intersects its own. Fills p's offset[] and bytes[] of
 * the temps, each p->elem[b] bytes per element (one with 0 gets offset 0 and no bytes), and
 * p->total; -1 when out of memory, -2 - b when buffer b would not fit at these sizes. */
static int plan_offsets(const XtcModule *m, const int64_t *syms, ArenaPlan *p)
{
    size_t *offset = p->offset, *bytes = p->bytes;
    Item *items = rt_malloc(((size_t)m->nbufs + 1) * sizeof *items);
    int *placed = rt_malloc(((size_t)m->nbufs + 1) * sizeof *placed);
    if (!items || !placed) {
        free(items);
        free(placed);
        return -1;
    }
    int n = 0, nplaced = 0;
    for (int i = 0; i < m->nbufs; i++)
        if (m->bufs[i].kind == RT_BUF_TEMP && !p->elem[i]) {
            offset[i] = bytes[i] = 0;
        } else if (m->bufs[i].kind == RT_BUF_TEMP) {
            size_t b = rs_buffer_bytes(&m->bufs[i], p->elem[i], syms);
            if (b == SIZE_MAX) {
                free(items);
                free(placed);
                return -2 - i;
            }
            items[n].buf = i;
            items[n].bytes = (b + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
            n++;
        }
    qsort(items, (size_t)n, sizeof *items, by_size_desc);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const RtBuffer *b = &m->bufs[items[i].buf];
        size_t off = 0;
        /* retry until a pass over the conflicting buffers moves nothing */
        for (int moved = 1; moved;) {
            moved = 0;
            for (int j = 0; j < nplaced; j++) {
                int o = placed[j];
                const RtBuffer *c = &m->bufs[o];
                if (c->last < b->first || b->last < c->first)
                    continue;
                size_t lo = offset[o], hi = lo + bytes[o];
                if (off < hi && lo < off + items[i].bytes) {
                    off = hi;
                    moved = 1;
                }
            }
        }
        offset[items[i].buf] = off;
        bytes[items[i].buf] = items[i].bytes;
        placed[nplaced++] = items[i].buf;
        if (off + items[i].bytes > total)
            total = off + items[i].bytes;
    }
    free(items);
    free(placed);
    p->total = total;
    return 0;
}

/* The element sizes of m's temps: in the host arena (host) and, for a device module, in the
 * device arena (dev, else untouched). A device module's host arena holds only its outputs. */
void rs_plan_elem_sizes(const XtcModule *m, size_t *host, size_t *dev)
{
    for (int b = 0; b < m->nbufs; b++) {
        host[b] = m->device ? 0 : rs_stored_elem(m, b);
        if (m->device)
            dev[b] = m->device->elem_bytes(m, b);
    }
    for (int o = 0; o < m->nouts && m->device; o++)
        host[m->outs[o].buf] = xtc_dtype_size(m->bufs[m->outs[o].buf].dtype);
}

/* Allocates a plan's per-buffer arrays; -1 when out of memory (free_plan frees what it took). */
int rs_alloc_plan(const XtcModule *m, ArenaPlan *p)
{
    size_t nb = (size_t)m->nbufs + 1;
    p->elem = rt_calloc(nb, sizeof *p->elem);
    p->offset = rt_calloc(nb, sizeof *p->offset);
    p->bytes = rt_calloc(nb, sizeof *p->bytes);
    p->total = 0;
    return p->elem && p->offset && p->bytes ? 0 : -1;
}

void rs_free_plan(ArenaPlan *p)
{
    free(p->elem);
    free(p->offset);
    free(p->bytes);
}

/* Whether every temp at these symbol values fits in its planned bytes of plan p. */
int rs_plan_fits(const XtcModule *m, const ArenaPlan *p, const int64_t *syms)
{
    for (int i = 0; i < m->nbufs; i++)
        if (m->bufs[i].kind == RT_BUF_TEMP && rs_buffer_bytes(&m->bufs[i], p->elem[i], syms) > p->bytes[i])
            return 0;
    return 1;
}

int rs_plan_arena(XtcSession *s, const int64_t *syms)
{
    const XtcModule *m = s->m;
    /* the device's plan first: the device sizes its arena from it at every run, whereas the
     * host plan must stay the one s->arena was allocated for when its planning fails */
    int rc = s->devplan.elem ? plan_offsets(m, syms, &s->devplan) : 0;
    if (rc == 0)
        rc = plan_offsets(m, syms, &s->host);
    if (rc == -1)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory planning the arena");
    if (rc < -1)
        return rs_fail(s, XTC_ERR_MEMORY, "intermediate %%%s would not fit in memory with these sizes",
                    m->bufs[-2 - rc].name);
    if (s->devplan.total > s->dev_arena_bytes)
        s->dev_arena_bytes = s->devplan.total;
    size_t total = s->host.total;
    if (total > s->arena_bytes || !s->arena) {
        if (s->dev && s->arena)
            s->m->device->host_arena(s->dev, NULL, 0);
        free(s->arena);
        s->arena = NULL;
        s->arena_bytes = 0;
        size_t alloc = total ? total : ARENA_ALIGN;
        if (total > ((size_t)1 << 30) && total > memory_bytes()) /* as a failed allocation */
            return rs_fail(s, XTC_ERR_MEMORY, "these sizes need a %.1f GiB arena, more than this machine's memory "
                        "(%.1f GiB)", (double)total / (1 << 30), (double)memory_bytes() / (1 << 30));
        s->arena = rt_aligned_alloc(ARENA_ALIGN, alloc);
        if (!s->arena)
            return rs_fail(s, XTC_ERR_MEMORY, "out of memory allocating a %zu-byte arena", alloc);
        s->arena_bytes = total;
        if (s->dev)
            s->m->device->host_arena(s->dev, s->arena, alloc);
    }
    memcpy(s->planned, syms, sizeof s->planned);
    return XTC_OK;
}

int64_t xtc_module_arena_bytes(const XtcModule *m, const int64_t *syms)
{
    if (!m || !m->abi || !syms)
        return -1;
    int64_t v[RT_MAXSYM] = {0};
    for (int i = 0; i < m->nsyms; i++)
        v[i] = syms[i];
    rt_derive_syms(m, v);
    /* the arena the schedule runs in: a device module's device arena */
    ArenaPlan host, dev;
    int rc = rs_alloc_plan(m, &host) | rs_alloc_plan(m, &dev);
    if (rc == 0) {
        rs_plan_elem_sizes(m, host.elem, dev.elem);
        rc = plan_offsets(m, v, m->device ? &dev : &host);
    }
    size_t total = m->device ? dev.total : host.total;
    rs_free_plan(&host);
    rs_free_plan(&dev);
    return rc == 0 ? (int64_t)total : -1;
}


/* ---- bounds of a call's work ---- */

/* The memory of this machine: the bound of an arena and of a call's work (sysconf). */
static size_t memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return (size_t)1 << 50;
    return (size_t)pages * (size_t)size;
}

/* Whether every output has zero elements at these symbol values (a run would compute nothing). */
int rs_no_output_elements(const XtcModule *m, const int64_t *syms)
{
    for (int o = 0; o < m->nouts; o++)
        if (rt_numel(m->outs[o].shape, m->outs[o].rank, syms) != 0)
            return 0;
    return m->nouts > 0;
}

/* The work of a call: kernels loop over their outputs' dimensions, some of them over the
 * dimensions that are not empty when others are (a batch of 2^40 empty sequences loops 2^40
 * times). Every temp counted with its empty dimensions as 1 must fit in memory, as it would
 * have to if they were 1: XTC_ERR_RANGE naming the sizes otherwise. */
int rs_check_work(XtcSession *s, const int64_t *syms)
{
    const XtcModule *m = s->m;
    size_t limit = 0;
    for (int i = 0; i < m->nbufs; i++) {
        const RtBuffer *b = &m->bufs[i];
        if (b->kind != RT_BUF_TEMP)
            continue;
        size_t n = xtc_dtype_size(b->dtype);
        int big = 0;
        for (int d = 0; d < b->rank && !big; d++) {
            int64_t v = rt_dim_eval(&b->shape[d], syms);
            big = __builtin_mul_overflow(n, (size_t)(v > 1 ? v : 1), &n);
        }
        if (!big && n <= ((size_t)1 << 30))
            continue;
        if (!limit)
            limit = memory_bytes();
        if (!big && n <= limit)
            continue;
        char names[200] = "", dims[256];
        size_t len = 0;
        for (int k = 0; k < m->nsyms && len < sizeof names; k++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s = %lld", len ? ", " : "", m->sym_name[k],
                                    (long long)syms[k]);
        rs_dims_text(dims, sizeof dims, b);
        return rs_fail(s, XTC_ERR_RANGE, "sizes %s are too large: intermediate %%%s %s, its empty dimensions "
                    "counted as 1 (the loops over it), would exceed this machine's memory (%.1f GiB)", names, b->name,
                    dims, (double)limit / (1 << 30));
    }
    return XTC_OK;
}

