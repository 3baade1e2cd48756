/* flash_pre.cuh: FlashAttention-2's preprocessing for the tensor-core attention backward
 * (kernels/flash_bwd.cuh): each query row's dlse_i - D_i, D_i = dout_i . o_i, computed once
 * into the step's scratch (CgStep.scratch) before the backward kernel reads it, instead of
 * inside the backward by every block that visits the row. Appended once to a module whose
 * schedule launches it (codegen/cuda/cg_cuda.c; cg_cuda_host.c launches it in the step), after
 * the generated prelude: xtc_fs is the module's 16-bit storage.
 *
 * One warp a row r < rows (rows: batches * I, the flat batch index times I plus the row), lane
 * l summing the columns l, l + 32, .. in order and the lanes' sums added by a fixed shuffle
 * tree: the same bits on every run. dout has gc columns (e, or e + 1 with the logsumexp's
 * gradient in column e), o has e + 1 (its last the forward's logsumexp). */
XTC_KERNEL xtc_fb_pre(const xtc_fs *__restrict__ dout, const float *__restrict__ o, float *__restrict__ scratch,
                      i64 rows, int e, int gc)
{
    const int lane = threadIdx.x % 32, oc = e + 1;
    const i64 per = blockDim.x / 32;
    for (i64 r = (i64)blockIdx.x * per + threadIdx.x / 32; r < rows; r += (i64)gridDim.x * per) {
        float s = 0.0f;
        for (int c = lane; c < e; c += 32)
            s += xtc_ld(dout, r * gc + c) * xtc_ld(o, r * oc + c);
        for (int w = 16; w > 0; w >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, w);
        if (lane == 0)
            scratch[r] = (gc > e ? xtc_ld(dout, r * gc + e) : 0.0f) - s;
    }
}
