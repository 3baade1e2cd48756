/* flash_fwd.cuh: the attention forward on tensor cores (FlashAttention-2) for q, k and v stored
 * in the mma's own 16-bit format (--dtype bf16 with bf16 tensor cores, fp16 with fp16). This is
 * the kernel's body; codegen/cuda/cg_cuda_attention_mma.c writes flash_lib.cuh (its functions)
 * before the kernel, then the kernel's signature, its sizes and the model-specific parts as the
 * macros below, then this text (both embedded at build time), compiled by NVRTC for the GPU and
 * as C after xtc_cuda_emu.h by the emulator.
 *
 * In scope: I, J, batches (i64), D, E, OC (int: out has E columns, E + 1 with the logsumexp),
 * the kernel's operands, and
 *   XTC_FA_MT         16-row tiles a warp: a block of 4 warps takes XTC_FA_BR = 64 MT query rows
 *   XTC_FA_BC         keys a stage (shared memory is static: 48 KiB at most)
 *   XTC_FA_DP, _EP    D and E rounded up to 16 (the tiles hold zeros past D and E)
 *   XTC_FA_MMA        xtc_mma_m16n8k16_bf16 or _f16;  XTC_FA_PACK: the matching xtc_fa_pack_*
 *   XTC_FA_STATS      1: column E of the output is the row's logsumexp (the backward reads it)
 *   XTC_FA_TILE       statements: for `batch` in scope, the batch indices ix0.., the pointers
 *                     qb, kb, vb, ob to the [rows, width] matrices and their row strides qs, ks,
 *                     vs, os (head-split views: H width)
 *   XTC_FA_KEYS(i, lo, hi)   statement: the keys [lo, hi) query row i visits (causal and window
 *                            limits without a mask operand; else all J)
 *   XTC_FA_SCORE(x, i, j)    the score of (i, j) from the product x: scaled, biased, -FLT_MAX
 *                            where masked, exactly as the CUDA-core kernels make it
 *   XTC_FA_FULL(rf, rl, j0)  nonzero when, for the rows rf .. rl and the keys j0 .. j0 + BC - 1,
 *                            every key is in every row's range and the score is x * scale (no
 *                            mask, no bias, a constant scale): those tiles skip the element work
 *   XTC_FA_SCALE2            that scale times log2(e)
 *   XTC_FA_BOUNDED           bounded (cosine-sim) attention: nonzero (a run-time condition) when
 *                            every row's maximum is XTC_FA_BOUND (b scale log2(e), base 2) from the
 *                            start: no maximum to reduce, nothing to rescale (as the CUDA-core
 *                            tiled forward; bf16 only: fp16 would flush small P); 0 otherwise
 * The macros' texts name the sizes: cu_name_reserved (cg_cuda_gen.c) knows every name of this
 * body, so a size of such a name is written symN_NAME and no local here shadows it.
 *
 * A warp owns 16 MT query rows of the block's tile, loaded once (ldmatrix.x4) into registers as
 * mma A fragments. The keys of the tile's rows (causal and window limits bound them: tiles past
 * the diagonal are never visited) come XTC_FA_BC at a time through two stages of shared memory,
 * K [key][d] and V [key][e] as stored (rows padded by 16 bytes: the 8 rows an ldmatrix reads
 * fall in 8 different groups of 4 banks), filled by 16-byte cp.async copies while the other
 * stage is multiplied; one barrier a stage. Per stage and warp:
 *   S = Q K^T      K's B fragments by ldmatrix.x4 (two 8-key tiles a load), f32 sums;
 *   scores         in base 2: x log2(e), the scale folded in (full tiles: one multiply); in the
 *                  other tiles element by element (-inf outside the row's keys: weight 0;
 *                  -FLT_MAX where masked is kept, so that a row whose every key is masked
 *                  attends uniformly, as defined);
 *   online softmax in registers: a lane holds rows g and g + 8 of each 16 (g = lane / 4), their
 *                  maxima reduced over the row's 4 lanes with shuffles, exp2, the running sums
 *                  kept per lane and reduced once at the end;
 *   O += P V       P's accumulators are A fragments once packed to 16 bits in registers; V's B
 *                  fragments by ldmatrix.x4.trans from [key][e] (no transposed copy).
 * The output is O / l and with XTC_FA_STATS the logsumexp m ln 2 + log l (m = -FLT_MAX kept).
 * Query tiles go tile-major, the last rows first: under causal limits the longest start first.
 * The copies need 16-byte aligned rows: D and E are multiples of 8 (the generator checks), the
 * pointers are checked here (`vec`); otherwise the same tiles are filled by plain loads. */
#define XTC_FA_BR (64 * XTC_FA_MT)
#define XTC_FA_DS (XTC_FA_DP + 8) /* row strides of the K (and Q) and V tiles in 16-bit values */
#define XTC_FA_ES (XTC_FA_EP + 8)
#define XTC_FA_STAGE (XTC_FA_BC * (XTC_FA_DS + XTC_FA_ES)) /* a stage's values: K [BC][DS], then V [BC][ES] */
#define XTC_FA_QTILE (XTC_FA_BR * XTC_FA_DS)
    /* stage 0, then stage 1, where the query tile is staged first */
    __shared__ XTC_ALIGN16 unsigned short sm[XTC_FA_STAGE + (XTC_FA_QTILE > XTC_FA_STAGE ? XTC_FA_QTILE : XTC_FA_STAGE)];
    const xtc_sa sa = xtc_sa_of(sm);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4; /* the lane's fragment coordinates */
    const i64 tiles = (I + XTC_FA_BR - 1) / XTC_FA_BR;
    for (i64 tile = blockIdx.x; tile < batches * tiles; tile += gridDim.x) {
        const i64 batch = tile % batches, i0 = (tiles - 1 - tile / batches) * XTC_FA_BR;
        XTC_FA_TILE
        const int vec = (((unsigned long long)qb | (unsigned long long)kb | (unsigned long long)vb) & 15u) == 0;
        i64 tjb, tje; /* the keys of the tile's rows: its first and last rows bound them */
        {
            i64 lo, hi;
            XTC_FA_KEYS(i0, tjb, tje);
            XTC_FA_KEYS(((i0 + XTC_FA_BR < I ? i0 + XTC_FA_BR : I) - 1), lo, hi);
            tjb = lo < tjb ? lo : tjb;
            tje = hi > tje ? hi : tje;
        }
        xtc_fa_rows(sa + 2u * XTC_FA_STAGE, 2 * XTC_FA_DS, qb, qs, i0, I, XTC_FA_BR, XTC_FA_DP / 8, D / 8, vec);
        xtc_fa_rows(sa, 2 * XTC_FA_DS, kb, ks, tjb, tje, XTC_FA_BC, XTC_FA_DP / 8, D / 8, vec);
        xtc_fa_rows(sa + 2u * XTC_FA_BC * XTC_FA_DS, 2 * XTC_FA_ES, vb, vs, tjb, tje, XTC_FA_BC, XTC_FA_EP / 8, E / 8,
                    vec);
        xtc_cp_async_commit();
        xtc_cp_async_wait(0);
        __syncthreads(); /* the query tile and the first stage */
        const int wr = warp * 16 * XTC_FA_MT; /* the warp's first row in the tile */
        unsigned qf[XTC_FA_MT][XTC_FA_DP / 16][4]; /* its query rows: A fragments */
#pragma unroll
        for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
            for (int kd = 0; kd < XTC_FA_DP / 16; kd++) /* lane: row lane % 16, columns 8 (lane / 16) on */
                xtc_ldmatrix_x4_sa(qf[mt][kd], sa + 2u * (XTC_FA_STAGE + (wr + 16 * mt + lane % 16) * XTC_FA_DS +
                                                          16 * kd + 8 * (lane / 16)));
        float mx[XTC_FA_MT][2], lsum[XTC_FA_MT][2], o[XTC_FA_MT][XTC_FA_EP / 8][4]; /* base-2 maxima, sums, O */
        const int bounded = XTC_FA_BOUNDED; /* block-uniform: the shuffles below stay whole */
#pragma unroll
        for (int mt = 0; mt < XTC_FA_MT; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[mt][r] = bounded ? XTC_FA_BOUND : -XTC_INF;
                lsum[mt][r] = 0.0f;
            }
#pragma unroll
            for (int ci = 0; ci < XTC_FA_EP / 8; ci++)
#pragma unroll
                for (int u = 0; u < 4; u++)
                    o[mt][ci][u] = 0.0f;
        }
        const i64 rf = i0 + wr, rl = (rf + 16 * XTC_FA_MT < I ? rf + 16 * XTC_FA_MT : I) - 1; /* the warp's rows */
        int st = 0;
        for (i64 j0 = tjb; j0 < tje; j0 += XTC_FA_BC) {
            xtc_cp_async_wait(0);
            __syncthreads(); /* stage st arrived; the other (or the query tile) read by every warp */
            if (j0 + XTC_FA_BC < tje) { /* the next stage's copies, while this one is multiplied */
                const xtc_sa nx = sa + 2u * XTC_FA_STAGE * (st ^ 1);
                xtc_fa_rows(nx, 2 * XTC_FA_DS, kb, ks, j0 + XTC_FA_BC, tje, XTC_FA_BC, XTC_FA_DP / 8, D / 8, vec);
                xtc_fa_rows(nx + 2u * XTC_FA_BC * XTC_FA_DS, 2 * XTC_FA_ES, vb, vs, j0 + XTC_FA_BC, tje, XTC_FA_BC,
                            XTC_FA_EP / 8, E / 8, vec);
                xtc_cp_async_commit();
            }
            /* the lane's rows of this stage's K and V (the ldmatrix addresses below add constants) */
            const xtc_sa kt = xtc_fa_opaque(sa + 2u * XTC_FA_STAGE * st + 2u * ((8 * (lane / 16) + lane % 8) * XTC_FA_DS + 8 * (lane / 8 % 2)));
            const xtc_sa vt = xtc_fa_opaque(sa + 2u * XTC_FA_STAGE * st + 2u * (XTC_FA_BC * XTC_FA_DS + (8 * (lane / 8 % 2) + lane % 8) * XTC_FA_ES + 8 * (lane / 16)));
            float s[XTC_FA_MT][XTC_FA_BC / 8][4]; /* S = Q K^T: tile c holds keys 8 c .. 8 c + 7 */
#pragma unroll
            for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
                for (int c = 0; c < XTC_FA_BC / 8; c++)
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        s[mt][c][u] = 0.0f;
#pragma unroll
            for (int kd = 0; kd < XTC_FA_DP / 16; kd++)
#pragma unroll
                for (int c = 0; c < XTC_FA_BC / 16; c++) {
                    /* the B fragments of key tiles 2 c and 2 c + 1: lane's row key 8 (lane / 16) + lane % 8, d 8 (lane / 8 % 2) */
                    unsigned kf[4];
                    xtc_ldmatrix_x4_sa(kf, kt + 2u * (16 * c * XTC_FA_DS + 16 * kd));
#pragma unroll
                    for (int mt = 0; mt < XTC_FA_MT; mt++) {
                        XTC_FA_MMA(s[mt][2 * c], qf[mt][kd], kf, s[mt][2 * c]);
                        XTC_FA_MMA(s[mt][2 * c + 1], qf[mt][kd], kf + 2, s[mt][2 * c + 1]);
                    }
                }
            if (XTC_FA_FULL(rf, rl, j0)) {
#pragma unroll
                for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
                    for (int c = 0; c < XTC_FA_BC / 8; c++)
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            s[mt][c][u] *= XTC_FA_SCALE2;
            } else {
                int klo[XTC_FA_MT][2], khi[XTC_FA_MT][2]; /* each row's keys in the stage: [klo, khi) of 0 .. BC */
#pragma unroll
                for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const i64 i = rf + 16 * mt + g + 8 * r;
                        i64 lo, hi;
                        XTC_FA_KEYS(i, lo, hi);
                        lo -= j0;
                        hi -= j0;
                        klo[mt][r] = lo < 0 ? 0 : lo > XTC_FA_BC ? XTC_FA_BC : (int)lo;
                        khi[mt][r] = hi < 0 ? 0 : hi > XTC_FA_BC ? XTC_FA_BC : (int)hi;
                    }
#pragma unroll
                for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
                    for (int c = 0; c < XTC_FA_BC / 8; c++)
#pragma unroll
                        for (int u = 0; u < 4; u++) { /* row g + 8 (u / 2), key 8 c + 2 t + u % 2 */
                            const int jj = 8 * c + 2 * t + u % 2;
                            float x = -XTC_INF; /* outside the row's keys: weight 0 */
                            if (jj >= klo[mt][u / 2] && jj < khi[mt][u / 2]) {
                                const i64 i = rf + 16 * mt + g + 8 * (u / 2), j = j0 + jj;
                                x = XTC_FA_SCORE(s[mt][c][u], i, j);
                                x = x <= -3.40282347e+38f ? x : x * 1.44269504f; /* base 2; -FLT_MAX kept */
                            }
                            s[mt][c][u] = x;
                        }
            }
#pragma unroll
            for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mu = mx[mt][r], alpha = 1.0f; /* bounded: the bound, kept */
                    if (!bounded) {
                        float rmax = -XTC_INF;
#pragma unroll
                        for (int c = 0; c < XTC_FA_BC / 8; c++)
                            rmax = xtc_fa_max(rmax, xtc_fa_max(s[mt][c][2 * r], s[mt][c][2 * r + 1]));
                        for (int w = 1; w < 4; w <<= 1) /* the row's four lanes */
                            rmax = xtc_fa_max(rmax, __shfl_xor_sync(0xffffffffu, rmax, w));
                        const float m_new = xtc_fa_max(mx[mt][r], rmax);
                        mu = m_new == -XTC_INF ? 0.0f : m_new; /* no key yet: every weight 0 */
                        alpha = xtc_fa_exp2(mx[mt][r] - mu);
                        mx[mt][r] = m_new;
                    }
                    float psum = 0.0f;
#pragma unroll
                    for (int c = 0; c < XTC_FA_BC / 8; c++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const float p = xtc_fa_exp2(s[mt][c][2 * r + h] - mu);
                            s[mt][c][2 * r + h] = p;
                            psum += p;
                        }
                    lsum[mt][r] = lsum[mt][r] * alpha + psum;
                    if (!bounded) {
#pragma unroll
                        for (int ci = 0; ci < XTC_FA_EP / 8; ci++) {
                            o[mt][ci][2 * r] *= alpha;
                            o[mt][ci][2 * r + 1] *= alpha;
                        }
                    }
                }
#pragma unroll
            for (int kc = 0; kc < XTC_FA_BC / 16; kc++) { /* O += P V: keys 16 kc .. 16 kc + 15 */
                unsigned pa[XTC_FA_MT][4];
#pragma unroll
                for (int mt = 0; mt < XTC_FA_MT; mt++) {
                    pa[mt][0] = XTC_FA_PACK(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                    pa[mt][1] = XTC_FA_PACK(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                    pa[mt][2] = XTC_FA_PACK(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                    pa[mt][3] = XTC_FA_PACK(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                }
#pragma unroll
                for (int ci = 0; ci < XTC_FA_EP / 16; ci++) {
                    /* .trans: the B fragments of value columns 16 ci .. + 7 and + 8 .. + 15; lane's row
                     * key 16 kc + 8 (lane / 8 % 2) + lane % 8, column 16 ci + 8 (lane / 16) */
                    unsigned vf[4];
                    xtc_ldmatrix_x4_trans_sa(vf, vt + 2u * (16 * kc * XTC_FA_ES + 16 * ci));
#pragma unroll
                    for (int mt = 0; mt < XTC_FA_MT; mt++) {
                        XTC_FA_MMA(o[mt][2 * ci], pa[mt], vf, o[mt][2 * ci]);
                        XTC_FA_MMA(o[mt][2 * ci + 1], pa[mt], vf + 2, o[mt][2 * ci + 1]);
                    }
                }
            }
            st ^= 1;
        }
#pragma unroll
        for (int mt = 0; mt < XTC_FA_MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float l = lsum[mt][r];
                for (int w = 1; w < 4; w <<= 1) /* the row's sum over its four lanes */
                    l += __shfl_xor_sync(0xffffffffu, l, w);
                const i64 i = rf + 16 * mt + g + 8 * r;
                if (i >= I)
                    continue;
#pragma unroll
                for (int ci = 0; ci < XTC_FA_EP / 8; ci++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int col = 8 * ci + 2 * t + h;
                        if (col < E)
                            xtc_st(ob, i * os + col, J > 0 ? o[mt][ci][2 * r + h] / l : 0.0f);
                    }
#if XTC_FA_STATS
                if (t == 0) { /* the logsumexp, natural units */
                    const float m = mx[mt][r];
                    xtc_st(ob, i * os + E, J > 0 ? (m <= -3.40282347e+38f ? m : m * 0.693147181f + logf(l)) : -XTC_INF);
                }
#endif
            }
        __syncthreads(); /* every warp done with the stages before the next tile's copies */
    }
#undef XTC_FA_BR
#undef XTC_FA_DS
#undef XTC_FA_ES
#undef XTC_FA_STAGE
#undef XTC_FA_QTILE
#undef XTC_FA_MT
#undef XTC_FA_BC
#undef XTC_FA_DP
#undef XTC_FA_EP
#undef XTC_FA_MMA
#undef XTC_FA_PACK
#undef XTC_FA_STATS
#undef XTC_FA_TILE
#undef XTC_FA_KEYS
#undef XTC_FA_SCORE
#undef XTC_FA_FULL
#undef XTC_FA_SCALE2
#undef XTC_FA_BOUNDED
#undef XTC_FA_BOUND
