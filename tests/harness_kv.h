/* harness_kv.h: the rounding of KV caches that the suites checking cached decoding apply to the
 * interpreter's values, so that it computes what a module with stored caches computes. */
#ifndef XTC_TEST_HARNESS_KV_H
#define XTC_TEST_HARNESS_KV_H

#include <check.h>
#include <stdint.h>

#include "rt_half.h"

/* count values rounded as --kv-dtype int8 stores them: rows of D, each D int8 values times their
 * scale (rt_half.h rt_i8_row_quantize, the runtime's and the kernels' rule) */
static inline void harness_round_rows_int8(double *v, int64_t count, int64_t D)
{
    float x[512];
    char row[512 + 4];
    ck_assert(D > 0 && D <= 512 && count % D == 0);
    for (int64_t r = 0; r < count / D; r++) {
        for (int64_t i = 0; i < D; i++)
            x[i] = (float)v[r * D + i];
        rt_i8_row_quantize(x, D, row);
        rt_i8_row_widen(row, D, x);
        for (int64_t i = 0; i < D; i++)
            v[r * D + i] = x[i];
    }
}

#endif
