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

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
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

/* "...layers.<i>.1.g": the scalar a Rezero block (use_rezero) multiplies its output by; the
 * gains of ScaleNorm and RMSNorm (also .g) sit in the norms list, "...layers.<i>.0.<k>.g" */
static int is_rezero_gain(const char *name)
{
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".1.g") != 0)
        return 0;
    size_t k = n - 4; /* the digits of the layer index before ".1.g", then ".layers" */
    while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9')
        k--;
    return k < n - 4 && k >= 7 && strncmp(name + k - 7, "layers.", 7) == 0;
}

/* ALiBi's fixed slope h of `heads` (XT-SEMANTICS.md 7.4; the same rule as frontend/lower.c): for
 * a power of two n, start^(h+1) with start = 2^(-2^-(log2 n - 3)); otherwise the slopes of the
 * power of two p below, then every other slope of 2p */
static double alibi_slope(int64_t heads, int64_t h)
{
    int64_t p2 = 1;
    while (p2 * 2 <= heads)
        p2 *= 2;
    int64_t m = h < p2 ? p2 : 2 * p2, i = h < p2 ? h : 2 * (h - p2);
    double start = pow(2.0, -pow(2.0, -(log2((double)m) - 3)));
    return (float)(start * pow(start, (double)i));
}

int rt_init_module_param(const struct XtcModule *m, const char *name, int rank, const int64_t *shape, float *out,
                         RtRng *rng)
{
    double v;
    if (m && xtc_module_param_init(m, name, &v) == 1) {
        int64_t n = 1;
        for (int i = 0; i < rank; i++)
            n *= shape[i];
        fill_const(out, n, (float)v);
        return 0;
    }
    return rt_init_tensor(name, rank, shape, out, rng);
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
    return rc < 0 ? "no initialisation rule: zeros"
                  : "starts at -3, scale_init_value's default (a model setting scale_init_value or "
                    "qk_norm_attn_seq_len starts there in x-transformers)";
}

int rt_init_tensor(const char *name, int rank, const int64_t *shape, float *out, RtRng *rng)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    if ((ends_with(name, "rel_pos.learned_logslopes") || ends_with(name, "rel_pos.learned_logslopes_future")) &&
        rank == 4) { /* [1, heads, 1, 1]: the log of the fixed slopes */
        for (int64_t h = 0; h < n; h++)
            out[h] = (float)log(alibi_slope(n, h));
        return 0;
    }
    if (ends_with(name, "inv_freq") && rank == 1) {
        for (int64_t k = 0; k < n; k++)
            out[k] = (float)(1.0 / pow(10000.0, (double)(2 * k) / (double)(2 * n)));
        return 0;
    }
    if (strcmp(name, "token_emb.weight") == 0 || ends_with(name, ".token_emb.weight")) {
        double std = rank == 2 ? sqrt(2.0 / (double)shape[1]) : 1.0;
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)(std * rt_rng_normal(rng));
        return 0;
    }
    /* parameters x-transformers 0.23.0 creates with a constant, not by a module's default */
    if (ends_with(name, ".to_v_gate.weight") || is_rezero_gain(name)) { /* gate_values; use_rezero */
        fill_const(out, n, 0.0f);
        return 0;
    }
    if (ends_with(name, ".to_v_gate.bias") || ends_with(name, ".head_scale_params") ||
        ends_with(name, ".residual_scale")) {
        fill_const(out, n, 1.0f);
        return 0;
    }
    if (ends_with(name, ".scale") && rank == 4) { /* qk_norm's log-temperature: scale_init_value's default */
        fill_const(out, n, -3.0f);
        return 1;
    }
    /* nn.GRUCell(dim, dim) (gate_residual): every weight and bias U(-1/sqrt(dim), 1/sqrt(dim)) */
    if ((ends_with(name, ".gru.weight_ih") || ends_with(name, ".gru.weight_hh")) && rank == 2) {
        fill_uniform(out, n, 1.0 / sqrt((double)shape[1]), rng);
        return 0;
    }
    if ((ends_with(name, ".gru.bias_ih") || ends_with(name, ".gru.bias_hh")) && rank == 1) {
        fill_uniform(out, n, 1.0 / sqrt((double)(shape[0] / 3 > 0 ? shape[0] / 3 : 1)), rng);
        return 0;
    }
    /* talking heads: a 1x1 Conv2d(h, h) without bias, torch's default U(-1/sqrt(h), 1/sqrt(h)) */
    if (ends_with(name, "_softmax_talking_heads.weight") && rank == 4) {
        fill_uniform(out, n, 1.0 / sqrt((double)shape[1]), rng);
        return 0;
    }
    /* ViT's cls token and positions: torch.randn */
    if ((strcmp(name, "cls_token") == 0 || ends_with(name, ".cls_token") || strcmp(name, "pos_embedding") == 0 ||
         ends_with(name, ".pos_embedding"))) {
        fill_normal(out, n, 1.0, rng);
        return 0;
    }
    if (ends_with(name, "emb.weight") || ends_with(name, "relative_attention_bias.weight") ||
        ends_with(name, "memory_tokens") || ends_with(name, "mem_k") || ends_with(name, "mem_v")) {
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)rt_rng_normal(rng);
        return 0;
    }
    if (ends_with(name, ".weight") && rank == 2) { /* Linear [out, in] */
        double bound = 1.0 / sqrt((double)shape[1]);
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)((2.0 * rt_rng_uniform(rng) - 1.0) * bound);
        return 0;
    }
    if ((ends_with(name, ".weight") || ends_with(name, ".g")) && rank == 1) { /* norm gains */
        for (int64_t i = 0; i < n; i++)
            out[i] = 1.0f;
        return 0;
    }
    if (ends_with(name, ".bias") && rank == 1) {
        /* Linear biases are U(-1/sqrt(in), 1/sqrt(in)), but the fan-in is not in the name;
         * LayerNorm biases are 0. Zero is the LayerNorm rule and a sound Linear start. */
        memset(out, 0, (size_t)n * sizeof *out);
        return 0;
    }
    memset(out, 0, (size_t)n * sizeof *out);
    return -1;
}
