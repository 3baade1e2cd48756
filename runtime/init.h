/* init.h: fresh parameter values by the rules the lowering records for each weight (the module's
 * init records: x-transformers' initialisation, XT-SEMANTICS.md section 3), seeded and
 * reproducible. */
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

/* Fills out[numel] by the init rule (XtcInitRule, include/abi/rt_abi.h) with its parameter v.
 * Returns 0, or -1 for an unknown rule (out is then zero-filled). */
int rt_init_fill(int rule, double v, int rank, const int64_t *shape, float *out, RtRng *rng);
/* The same with the rule by its name (the IR's ir_init_name); NULL: no rule, -1. */
int rt_init_by_name(const char *rule, double v, int rank, const int64_t *shape, float *out, RtRng *rng);
/* What to tell the user about a nonzero return of rt_init_module_param. */
const char *rt_init_note(int rc);

/* Fresh values of the parameter or state buffer `name` of module m by the rule its lowering
 * recorded (the module's init records). The same return values as rt_init_fill. */
struct XtcModule;
int rt_init_module_param(const struct XtcModule *m, const char *name, int rank, const int64_t *shape, float *out,
                         RtRng *rng);
/* The i-th (from 0) tied name of parameter or buffer `name` of module m: a second state_dict name
 * that must hold the same values (encdec's decoder.net.token_emb.weight for
 * encoder.token_emb.weight), or NULL past the last. A weights file needs both names. */
const char *rt_init_tied_name(const struct XtcModule *m, const char *name, int i);

#endif
