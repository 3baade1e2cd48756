/* flash_lib.cuh: the functions of the tensor-core attention kernels (flash_fwd.cuh), written
 * before each such kernel (once per module: guarded) by codegen/cuda/cg_cuda_attention_mma.c.
 * On sm_80 and newer PTX instructions where one does the work; in the emulator C. */
#ifndef XTC_FA_ONCE
#define XTC_FA_ONCE
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
XTC_INLINE float xtc_fa_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* the larger, NaN if either is (xtc_fmax's semantics, one instruction) */
XTC_INLINE float xtc_fa_max(float a, float b)
{
    float y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
/* two floats rounded to 16 bits (to nearest, ties to even) as a pair: lo in the low half */
XTC_INLINE unsigned xtc_fa_pack_bf16(float lo, float hi)
{
    unsigned y;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(hi), "f"(lo));
    return y;
}
XTC_INLINE unsigned xtc_fa_pack_f16(float lo, float hi)
{
    unsigned y;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(hi), "f"(lo));
    return y;
}
/* a shared address the compiler cannot see through (the prelude's xtc_opaque) */
XTC_INLINE unsigned xtc_fa_opaque(unsigned x) { return xtc_opaque(x); }
#else
XTC_INLINE xtc_sa xtc_fa_opaque(xtc_sa x) { return x; }
XTC_INLINE float xtc_fa_exp2(float x) { return exp2f(x); }
XTC_INLINE float xtc_fa_max(float a, float b) { return xtc_fmax(a, b); }
XTC_INLINE unsigned xtc_fa_pack_bf16(float lo, float hi) { return xtc_pack_bf16x2(lo, hi); }
XTC_INLINE unsigned xtc_fa_pack_f16(float lo, float hi) { return xtc_pack_f16x2(lo, hi); }
#endif
/* Rows r0 .. r0 + rows - 1 of p (row stride ld) into shared memory at dst, rows dstride bytes
 * apart, cpad chunks of 8 values (16 bytes) a row; rows from lim on and chunks from `chunks` on
 * are zeros. The block's 128 threads copy a chunk each at a time: cp.async with vec, else loads
 * and one 16-byte store. */
XTC_INLINE void xtc_fa_rows(xtc_sa dst, int dstride, const unsigned short *p, i64 ld, i64 r0, i64 lim, int rows,
                            int cpad, int chunks, int vec)
{
#pragma unroll
    for (int n = 0; n < (rows * cpad + 127) / 128; n++) {
        const int e = (int)threadIdx.x + 128 * n, r = e / cpad, c = e % cpad;
        if (e >= rows * cpad)
            break;
        const int ok = r0 + r < lim && c < chunks;
        const unsigned short *src = p + (ok ? (r0 + r) * ld + 8 * c : 0);
        const xtc_sa d = dst + (unsigned)(r * dstride + 16 * c);
        if (vec) {
            xtc_cp_async16_sa(d, src, ok ? 16 : 0);
        } else {
            unsigned w[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                w[u] = ok ? (unsigned)src[2 * u] | (unsigned)src[2 * u + 1] << 16 : 0u;
            xtc_sts128(d, w[0], w[1], w[2], w[3]);
        }
    }
}
#endif
