/* init.h: fresh parameter values following x-transformers' initialisation (XT-SEMANTICS.md
 * section 3), chosen from the state_dict name and shape alone, seeded and reproducible. */
#ifndef XTC_RT_INIT_H
#define XTC_RT_INIT_H

#include <stdint.h>

typedef struct {
    uint64_t s[2];
} RtRng;

void rt_rng_seed(RtRng *r, uint64_t seed);
uint64_t rt_rng_next(RtRng *r);
double rt_rng_uniform(RtRng *r);   /* [0, 1) */
double rt_rng_normal(RtRng *r);    /* N(0, 1) */

/* Fills out[numel] for the parameter or buffer `name` of the given shape:
 *   token_emb.weight            kaiming normal, std sqrt(2 / dim)
 *   *.emb.weight, rel_pos table N(0, 1) (nn.Embedding)
 *   *.inv_freq (rotary)         1 / 10000^(2k / (2 * len))
 *   Linear weight [out, in]     U(-1/sqrt(in), 1/sqrt(in)); its bias likewise (torch default)
 *   norm weight / g             1;  norm bias  0
 *   the constants of 0.23.0: to_v_gate weight 0 and bias 1 (gate_values), head_scale_params 1,
 *   residual_scale 1, a Rezero block's g 0; GRU gating's cell and talking heads torch's default
 *   U(-1/sqrt(fan_in), ..); ViT's cls_token and pos_embedding N(0, 1)
 *   qk_norm's log-temperature *.scale [1, h, 1, 1]: -3, scale_init_value's default (returns 1:
 *   a model with scale_init_value or use_qk_norm_attn's qk_norm_attn_seq_len starts elsewhere)
 * Returns 0; 1 when the value depends on an option the name does not carry (the default is
 * used); -1 when the name matches no rule (out is then zero-filled). */
int rt_init_tensor(const char *name, int rank, const int64_t *shape, float *out, RtRng *rng);
/* What to tell the user about a nonzero return of rt_init_tensor. */
const char *rt_init_note(int rc);

/* rt_init_tensor, unless module m fixes the parameter's initial value (xtc_module_param_init):
 * then that constant. The same return values. */
struct XtcModule;
int rt_init_module_param(const struct XtcModule *m, const char *name, int rank, const int64_t *shape, float *out,
                         RtRng *rng);
/* The i-th (from 0) tied name of parameter or buffer `name` of module m: a second state_dict name
 * that must hold the same values (encdec's decoder.net.token_emb.weight for
 * encoder.token_emb.weight), or NULL past the last. A weights file needs both names. */
const char *rt_init_tied_name(const struct XtcModule *m, const char *name, int i);

#endif
