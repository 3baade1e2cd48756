/* adamw.cuh: the AdamW step of a training module on the device (runtime/rt_cuda.c launches it
 * for xtc_session_step; runtime/rt_optim.c is the host's, and these give the same bits).
 * Appended to the kernels of every CUDA training module (codegen/cuda/cg_cuda.c), after the
 * generated prelude: compiled by NVRTC for the GPU and as C with xtc_cuda_emu.h, one text.
 *
 * The parameters are one concatenated vector of `total` values (offset[i] .. offset[i + 1] is
 * parameter i) cut into blocks of XTC_ADAMW_BLOCK, as rt_optim.c cuts it. Gradients and device
 * weights are stored per parameter as f32 (storage 0), bf16 (1) or fp16 (2); the master weights
 * and the moments are f32. The float arithmetic is written with the _rn intrinsics so that the
 * GPU compiler does not contract it into FMAs: the host's C rounds every operation. */
#define XTC_ADAMW_BLOCK 8192
#define XTC_ADAMW_LANES 8

/* value k of a stored tensor, widened as rt_half.h widens */
XTC_INLINE float xtc_adamw_ld(const void *p, int storage, long long k)
{
    if (storage == 0)
        return ((const float *)p)[k];
    unsigned int h = ((const unsigned short *)p)[k];
    if (storage == 1)
        return __int_as_float((int)(h << 16));
    unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)
        return sign ? -(float)m * 5.9604644775390625e-8f : (float)m * 5.9604644775390625e-8f;
    return __int_as_float((int)(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13));
}

/* f rounded to the storage, as rt_half.h rounds */
XTC_INLINE void xtc_adamw_st(void *p, int storage, long long k, float f)
{
    if (storage == 0) {
        ((float *)p)[k] = f;
        return;
    }
    unsigned int u = (unsigned int)__float_as_int(f), r;
    if (storage == 1) {
        if ((u & 0x7fffffffu) > 0x7f800000u)
            r = (u >> 16) | 0x40u;
        else
            r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    } else {
        unsigned int sign = (u >> 16) & 0x8000u;
        u &= 0x7fffffffu;
        if (u > 0x7f800000u) {
            r = sign | 0x7e00u | ((u >> 13) & 0x3ffu);
        } else if (u >= 0x477ff000u) {
            r = sign | 0x7c00u;
        } else if (u >= 0x38800000u) {
            r = sign | (u + 0xfffu + ((u >> 13) & 1u) - 0x38000000u) >> 13;
        } else if (u < 0x33000000u) {
            r = sign;
        } else {
            unsigned int shift = 126u - (u >> 23), m = (u & 0x7fffffu) | 0x800000u;
            unsigned int rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u), q = m >> shift;
            q += rem > half || (rem == half && (q & 1u));
            r = sign | q;
        }
    }
    ((unsigned short *)p)[k] = (unsigned short)r;
}

/* the parameter holding value `at` of the concatenated vector (offset[nparams] = total) */
XTC_INLINE int xtc_adamw_param(const long long *offset, int nparams, long long at)
{
    int lo = 0, hi = nparams - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (offset[mid + 1] <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* partial[b]: the sum of squares of the gradients in block b, as rt_optim.c's norm_piece adds
 * them (per parameter piece: eight interleaved sums, lane j the values j, j + 8, ..., then the
 * tail on lane 0, combined pairwise; the pieces added in order). Grid: one block of
 * XTC_ADAMW_LANES threads per XTC_ADAMW_BLOCK values. */
XTC_KERNEL xtc_adamw_norm(const void *const *grads, const u8 *gstorage, const i64 *offset, int nparams,
                          i64 total, double *partial)
{
    __shared__ double lane[XTC_ADAMW_LANES];
    const int j = threadIdx.x;
    for (i64 b = blockIdx.x; b * XTC_ADAMW_BLOCK < total; b += gridDim.x) {
        i64 start = b * XTC_ADAMW_BLOCK, end = start + XTC_ADAMW_BLOCK < total ? start + XTC_ADAMW_BLOCK : total;
        double part = 0;
        for (int i = xtc_adamw_param(offset, nparams, start); i < nparams && offset[i] < end; i++) {
            i64 a = start > offset[i] ? start : offset[i], e = end < offset[i + 1] ? end : offset[i + 1];
            if (e <= a)
                continue;
            i64 lo = a - offset[i], hi = e - offset[i], k = lo;
            double acc = 0;
            for (; k + XTC_ADAMW_LANES <= hi; k += XTC_ADAMW_LANES) {
                double g = (double)xtc_adamw_ld(grads[i], gstorage[i], k + j);
                acc += g * g;
            }
            if (j == 0)
                for (; k < hi; k++) {
                    double g = (double)xtc_adamw_ld(grads[i], gstorage[i], k);
                    acc += g * g;
                }
            lane[j] = acc;
            __syncthreads();
            if (j == 0)
                part += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            __syncthreads();
        }
        if (j == 0)
            partial[b] = part;
    }
}

/* One AdamW update of every value (rt_optim.c's update_piece): the master weight, the moments,
 * and the device weight rounded to its storage. */
XTC_KERNEL xtc_adamw_update(void *const *weights, const void *const *grads, const u8 *wstorage, const u8 *gstorage,
                            const i64 *offset, int nparams, i64 total, float *master, float *m, float *v, float clip,
                            float decay, float b1, float b2, float omb1, float omb2, float eps, float step_size,
                            float bc2)
{
    for (i64 at = (i64)blockIdx.x * blockDim.x + threadIdx.x; at < total; at += (i64)gridDim.x * blockDim.x) {
        int i = xtc_adamw_param(offset, nparams, at);
        i64 k = at - offset[i];
        float gk = __fmul_rn(xtc_adamw_ld(grads[i], gstorage[i], k), clip);
        float pk = __fmul_rn(master[at], decay);
        float mk = __fadd_rn(__fmul_rn(b1, m[at]), __fmul_rn(omb1, gk));
        float vk = __fadd_rn(__fmul_rn(b2, v[at]), __fmul_rn(__fmul_rn(omb2, gk), gk));
        m[at] = mk;
        v[at] = vk;
        float p = __fsub_rn(pk, __fmul_rn(step_size, __fdiv_rn(mk, __fadd_rn(__fdiv_rn(__fsqrt_rn(vk), bc2), eps))));
        master[at] = p;
        xtc_adamw_st(weights[i], wstorage[i], k, p);
    }
}
