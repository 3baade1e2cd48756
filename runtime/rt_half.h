/* rt_half.h: f32 <-> bf16 and fp16, bit for bit as the generated CUDA C converts (the prelude's
 * xtc_bf16_bits/_float and xtc_f16_bits/_float in codegen/cuda/cg_cuda_gen.c, which the 16-bit
 * storage and the tensor-core matmul share): the runtime converts inputs and weights to
 * a 16-bit module's storage on upload and outputs back on download, and the tests round their
 * random inputs with the same functions.
 *
 *   bf16: the upper 16 bits of the f32, rounded to nearest even; NaN stays a (quiet) NaN.
 *   fp16: IEEE binary16, rounded to nearest even, subnormals kept, beyond 65504 infinity. */
#ifndef XTC_RT_HALF_H
#define XTC_RT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t rt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float rt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t rt_f32_to_bf16(float f)
{
    uint32_t u = rt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float rt_bf16_to_f32(uint16_t h) { return rt_bits_f32((uint32_t)h << 16); }

static inline uint16_t rt_f32_to_fp16(float f)
{
    uint32_t u = rt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    if (u >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (u >= 0x38800000u)
        return (uint16_t)(sign | (u + 0xfffu + ((u >> 13) & 1u) - 0x38000000u) >> 13);
    if (u < 0x33000000u)
        return (uint16_t)sign;
    uint32_t shift = 126u - (u >> 23), m = (u & 0x7fffffu) | 0x800000u;
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    uint32_t q = m >> shift;
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

static inline float rt_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)
        return sign ? -(float)m * 5.9604644775390625e-8f : (float)m * 5.9604644775390625e-8f;
    return rt_bits_f32(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13);
}

/* storage: 1 bf16, 2 fp16 (XTC_CUDA_BF16, XTC_CUDA_FP16); the value f rounds to */
static inline uint16_t rt_f32_to_half(int storage, float f)
{
    return storage == 1 ? rt_f32_to_bf16(f) : rt_f32_to_fp16(f);
}

static inline float rt_half_to_f32(int storage, uint16_t h)
{
    return storage == 1 ? rt_bf16_to_f32(h) : rt_fp16_to_f32(h);
}

/* n stored values widened to f32 (downloads): bf16 is a shift the compiler vectorises */
static inline void rt_half_widen(int storage, const uint16_t *src, float *dst, size_t n)
{
    if (storage == 1) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(dst + i, &u, sizeof u);
        }
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = rt_fp16_to_f32(src[i]);
    }
}

/* KV caches stored as int8 rows (`--kv-dtype int8`, codegen/cg_plan.h CG_STORE_INT8_ROWS): each
 * row of D values (one position of one kv head) as D int8 values q followed by the f32 scale s,
 * D + 4 bytes: symmetric, s = max|x| / 127, q = x (127 / max|x|) rounded to nearest even (then
 * within [-127, 127]); a row of zeros has s = 0. The value a row stands for is q s. The same f32
 * operations as the generated concat kernel (cg_llvm_util.c cg_i8row_quantize), so that the
 * runtime (an input cache), the kernels (the appended rows) and the tests round alike. */
static inline void rt_i8_row_quantize(const float *x, int64_t D, void *row)
{
    float m = 0;
    for (int64_t i = 0; i < D; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        m = a > m ? a : m;
    }
    float inv = m == 0 ? 0 : 127.0f / m, s = m / 127.0f;
    int8_t *q = row;
    for (int64_t i = 0; i < D; i++) {
        float y = __builtin_rintf(x[i] * inv);
        y = __builtin_fmaxf(__builtin_fminf(y, 127.0f), -127.0f); /* the kernel's order: a NaN gives 127 */
        q[i] = (int8_t)y;
    }
    memcpy(q + D, &s, sizeof s);
}

/* the D values a row stands for (q s) */
static inline void rt_i8_row_widen(const void *row, int64_t D, float *x)
{
    const int8_t *q = row;
    float s;
    memcpy(&s, q + D, sizeof s);
    for (int64_t i = 0; i < D; i++)
        x[i] = (float)q[i] * s;
}

static inline float rt_round_to_storage(int storage, float f)
{
    return storage ? rt_half_to_f32(storage, rt_f32_to_half(storage, f)) : f;
}

#endif
