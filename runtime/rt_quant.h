/* rt_quant.h: int8 weights (rt_quant.c: the quantization rule and where a module's int8 weights
 * and their scales are). Private to the runtime and the command line. */
#ifndef XTC_RT_QUANT_H
#define XTC_RT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "rt_internal.h"

/* The group along k of a module whose option quant_group is module_group, for a weight of k
 * columns: module_group, or k when it is 0 or at least k (one scale per output row). */
int64_t rt_quant_group_of(int64_t module_group, int64_t k);
/* Quantizes w [n, k] (f32) into q [n, k] and scale [n, ceil(k / G)], G = rt_quant_group_of(group,
 * k), by the rule of rt_quant.c. Returns -1, or the index of the first non-finite weight (then
 * q and scale are partly written). */
int64_t rt_quantize_rows(const float *w, int64_t n, int64_t k, int64_t group, int8_t *q, float *scale);
/* After the metadata is read: m->quant_group from the option, and RtBuffer.qscale/.qweight of each
 * i8 weight and its "<name>.scale" buffer, checked (shapes, kinds). 0, or -1 with m->err. */
int rt_quant_link(XtcModule *m);
/* Quantizes the f32 values w of int8 weight buffer b into q and scale (its scale buffer's
 * shape); -1 with a message naming the weight and the element when one is not finite. */
int rt_quant_fill(const XtcModule *m, int b, const float *w, int8_t *q, float *scale, char *err, size_t n);
/* xtc_session_set_weight on an int8 weight: quantizes data (f32 [n, k]) and binds the weight and
 * its scales. An XtcStatus. */
int rt_quant_set(XtcSession *s, int b, const float *data);

#endif
