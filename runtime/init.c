/* init.c: seeded fresh weights by x-transformers' rules (see init.h). */
#include "init.h"
#include "rt_internal.h"
#include "xtc.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rt_rng_seed(RtRng *r, uint64_t seed)
{
    r->s[0] = splitmix(&seed);
    r->s[1] = splitmix(&seed);
}

/* xoroshiro128+ */
uint64_t rt_rng_next(RtRng *r)
{
    uint64_t s0 = r->s[0], s1 = r->s[1], out = s0 + s1;
    s1 ^= s0;
    r->s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    r->s[1] = (s1 << 37) | (s1 >> 27);
    return out;
}

double rt_rng_uniform(RtRng *r) { return (double)(rt_rng_next(r) >> 11) * 0x1.0p-53; }

double rt_rng_normal(RtRng *r)
{
    double u1 = rt_rng_uniform(r), u2 = rt_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void fill_const(float *out, int64_t n, float v)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = v;
}

static void fill_uniform(float *out, int64_t n, double bound, RtRng *rng)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)((2.0 * rt_rng_uniform(rng) - 1.0) * bound);
}

static void fill_normal(float *out, int64_t n, double std, RtRng *rng)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)(std * rt_rng_normal(rng));
}

int rt_init_fill(int rule, double v, int rank, const int64_t *shape, float *out, RtRng *rng)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    switch (rule) {
    case XTC_INIT_CONST: fill_const(out, n, (float)v); return 0;
    case XTC_INIT_NORMAL: fill_normal(out, n, v, rng); return 0;
    case XTC_INIT_UNIFORM: fill_uniform(out, n, v, rng); return 0;
    case XTC_INIT_ALIBI: /* [.., heads, ..]: one slope per element */
        for (int64_t h = 0; h < n; h++)
            out[h] = (float)log(xtc_alibi_slope(n, h));
        return 0;
    case XTC_INIT_INV_FREQ:
        for (int64_t k = 0; k < n; k++)
            out[k] = (float)(1.0 / pow(v, (double)k / (double)n));
        return 0;
    case XTC_INIT_XPOS_SCALE: /* x-transformers: (arange(0, rd, 2) + 0.4 rd) / (1.4 rd), rd = 2n */
        for (int64_t k = 0; k < n; k++)
            out[k] = (float)((2.0 * (double)k + 0.8 * (double)n) / (2.8 * (double)n));
        return 0;
    }
    memset(out, 0, (size_t)n * sizeof *out);
    return -1;
}

int rt_init_by_name(const char *rule, double v, int rank, const int64_t *shape, float *out, RtRng *rng)
{
    int r = 0;
    while (rule && r < XTC_NUM_INITS && strcmp(rule, xtc_init_rule_name(r)) != 0)
        r++;
    return rt_init_fill(rule ? r : -1, v, rank, shape, out, rng);
}

int rt_init_module_param(const struct XtcModule *m, const char *name, int rank, const int64_t *shape, float *out,
                         RtRng *rng)
{
    const RtBuffer *b = NULL;
    for (int i = 0; m && i < m->nbufs && !b; i++)
        if ((m->bufs[i].kind == RT_BUF_PARAM || m->bufs[i].kind == RT_BUF_STATE) && strcmp(m->bufs[i].name, name) == 0)
            b = &m->bufs[i];
    return rt_init_fill(b && b->has_init ? b->init_rule : -1, b ? b->init : 0, rank, shape, out, rng);
}

const char *rt_init_tied_name(const struct XtcModule *m, const char *name, int i)
{
    for (int a = 0; m && a < m->naliases; a++)
        if (strcmp(m->bufs[m->aliases[a].buf].name, name) == 0 && i-- == 0)
            return m->aliases[a].name;
    return NULL;
}

const char *rt_init_note(int rc)
{
    return rc < 0 ? "the module has no initialisation rule for it (compiled by an earlier xtc?): zeros" : "";
}

