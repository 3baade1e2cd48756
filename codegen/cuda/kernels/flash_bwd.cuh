/* flash_bwd.cuh: the attention backward on tensor cores (FlashAttention-2) for q, k, v and the
 * output gradient stored in the mma's own 16-bit format (--dtype bf16 with bf16 tensor cores,
 * fp16 with fp16), heads D = E multiples of 8 up to 128. This is the kernel's body;
 * codegen/cuda/cg_cuda_attention_mma_grad.c writes flash_lib.cuh (its functions) before the
 * kernel, then the kernel's signature, its sizes and the model-specific parts as the macros
 * below, then this text (both embedded at build time), compiled by NVRTC for the GPU and as C
 * after xtc_cuda_emu.h by the emulator.
 *
 * In scope: I, J, batches (i64), D, E, OC, GC (int: o has E + 1 columns, the last the
 * forward's logsumexp; the output gradient E, or E + 1 with the logsumexp's gradient), the
 * kernel's operands, scratch (f32, the step's scratch: query row i of flat batch b's dlse_i -
 * D_i at b I + i, D_i = dO_i . O_i, which kernels/flash_pre.cuh's xtc_fb_pre wrote before this
 * kernel, FlashAttention-2's preprocessing), and
 *   XTC_FB_BN         rows of a streamed tile (64, 32 or 16: static shared memory, 48 KiB)
 *   XTC_FB_NST        stages of streamed tiles: 2 (copies overlap the products) or 1
 *   XTC_FB_DP         D rounded up to 16 (the tiles hold zeros past D)
 *   XTC_FB_MMA        xtc_mma_m16n8k16_bf16 or _f16;  XTC_FB_PACK: the matching xtc_fa_pack_*
 *   XTC_FB_TILE       statements: for the query batch index `batch` in scope, the batch indices
 *                     ix0.., the 16-bit pointers qb, kb, vb (row strides D, D, E; k and v at the
 *                     key/value batch index of that query head), gb (the output gradient, row
 *                     stride GC) and ob (o)
 *   XTC_FB_OUT        statement: for the block's batch index `bt`, dq, dk, dv (the [I + 2 J, D]
 *                     result's three parts)
 *   XTC_FB_HEADS, XTC_FB_HSTEP, XTC_FB_NOKV(b)  grouped key/values (k and v with G heads where
 *                     q has H, query head h reading key/value head h mod G; ops.def): H / G query
 *                     heads a key/value head, G apart in the batch index, and whether batch
 *                     index b's head is one of G..H-1 (no key/value head: its dk, dv rows are
 *                     zero); 1, 0 and 0 without groups
 *   XTC_FB_KEYS(i, lo, hi)        statement: the keys [lo, hi) query row i visits
 *   XTC_FB_QUERIES(j, fm, ib, ie) statement: the query rows key j gets gradient from, [0, fm)
 *                                 (rows that see no key) and [ib, ie)
 *   XTC_FB_PAIR(x, y, i, j, lse, dl, p, ds)  statement, for a pair (i, j) in row i's keys:
 *                     p = the probability from the product x = q_i . k_j and lse, and
 *                     ds = p (y + dl) scale (0 where masked) from y = dout_i . v_j and
 *                     dl = dlse_i - D_i, element by element exactly as the CUDA-core kernels
 *   XTC_FB_FULL(if, il, jf, jl)   nonzero when every pair of the query rows if .. il and the
 *                     keys jf .. jl is in its row's keys and its score is x * scale (no mask,
 *                     no bias, a constant scale): those tiles skip the element work
 *   XTC_FB_SCALE, XTC_FB_SCALE2   that scale, and times log2(e)
 * The macros' texts name the sizes: cu_name_reserved (cg_cuda_gen.c) knows every name of this
 * body, so a size of such a name is written symN_NAME and no local here shadows it.
 *
 * The work is split so that every output row has one writer (no atomics, the same bits on
 * every run): per batch, blocks of 4 warps take 64 query rows (their dq) or 64 keys (their dk
 * and dv), numbered tile-major, the dq tiles from the last rows on and then the dk/dv tiles
 * from the first keys on, so that under causal limits the longest blocks start first. With
 * grouped key/values a dq block reads its query head's key/value head, and a key block of head
 * g < G streams the query rows of its H / G query heads g, g + G, .. in turn, accumulating dk
 * and dv in the same registers, and writes them once; a key block of a head G..H-1 writes its
 * zero rows. A block's
 * own 64 rows (Q and dO, or K and V: the resident tiles) stay in shared memory; the other side
 * (K and V, or Q and dO) streams through XTC_FB_NST stages of XTC_FB_BN rows, copied as stored
 * by 16-byte cp.async (rows padded by 16 bytes: the 8 rows an ldmatrix reads fall in 8 different
 * groups of 4 banks). The streamed rows are those the causal and window limits leave (tiles past
 * the diagonal are never visited): for a query block the union of its rows' keys, for a key
 * block the rows that see no key and those whose limits keep one of its keys. A warp owns 16
 * resident rows; per streamed tile and warp, with A fragments of its rows by ldmatrix:
 *   X = R1 S1^T, Y = R2 S2^T   (S = Q K^T and dP = dO V^T, or their transposes for a key block)
 *                              B fragments by ldmatrix from the [row][d] tiles as stored;
 *   P, dS         in registers, from the forward's logsumexp (o's column E) and dlse_i - D_i
 *                 (the scratch's; read per row as the tile arrives: a query block once for its
 *                 rows, a key block per streamed tile into shared memory beside the logsumexp
 *                 and the row's keys); full tiles in base 2 with the scale folded in;
 *   acc1 += dS S1 (dq += dS K, or dk += dS^T Q), and for a key block acc2 += P^T dO (dv): the
 *                 accumulators of P and dS are A fragments once packed to 16 bits in registers,
 *                 S1 and S2 B fragments by ldmatrix.trans from the [row][d] tiles (no transposed
 *                 copies); P and dS are rounded to 16 bits before their products, as
 *                 FlashAttention-2 does; scores, statistics and sums are f32.
 * The copies need 16-byte aligned rows: D is a multiple of 8 (the generator checks), the
 * pointers and GC are checked here; otherwise the same tiles are filled by plain loads. */
#define XTC_FB_DS (XTC_FB_DP + 8)                /* row stride of every tile in 16-bit values */
#define XTC_FB_RES (64 * XTC_FB_DS)              /* a resident tile's values: R1, then R2 */
#define XTC_FB_STAGE (2 * XTC_FB_BN * XTC_FB_DS) /* a stage's values: S1, then S2 */
    __shared__ XTC_ALIGN16 unsigned short sm[2 * XTC_FB_RES + XTC_FB_NST * XTC_FB_STAGE];
    /* a key block's streamed query rows: logsumexp, dlse - D_i, keys [lo, hi) */
    __shared__ float fb_ls[XTC_FB_NST][XTC_FB_BN], fb_dl[XTC_FB_NST][XTC_FB_BN];
    __shared__ i64 fb_lo[XTC_FB_NST][XTC_FB_BN], fb_hi[XTC_FB_NST][XTC_FB_BN];
    const xtc_sa sa = xtc_sa_of(sm);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int lg = lane / 4, lt = lane % 4; /* the lane's fragment coordinates */
    const i64 qtiles = (I + 63) / 64, ktiles = (J + 63) / 64;
    for (i64 blk = blockIdx.x; blk < batches * (qtiles + ktiles); blk += gridDim.x) {
        const i64 bt = blk % batches, tile = blk / batches;
        const int kv = tile >= qtiles; /* dk and dv of 64 keys; else dq of 64 query rows */
        /* the resident (R) and streamed (S) operands of query batch index `batch`, and whether their
         * rows can be copied 16 bytes at a time */
#define XTC_FB_SIDES                                                                                                  \
    const xtc_fs *R1 = kv ? kb : qb, *R2 = kv ? vb : gb, *S1 = kv ? qb : kb, *S2 = kv ? gb : vb;                      \
    const i64 ld2 = kv ? E : GC, sld2 = kv ? GC : E;                                                                  \
    const int v1 = ((unsigned long long)R1 & 15u) == 0, v2 = ((unsigned long long)R2 & 15u) == 0 && ld2 % 8 == 0;     \
    const int w1 = ((unsigned long long)S1 & 15u) == 0, w2 = ((unsigned long long)S2 & 15u) == 0 && sld2 % 8 == 0;
#if XTC_FB_HEADS == 1 /* no groups: the operands' pointers first, then the outputs', as before groups (in another
                       * order GPT's kernel takes 204 or 210 registers on sm_80, not 164: 2 blocks an SM, not 3) */
        const i64 batch = bt;
        XTC_FB_TILE
        XTC_FB_SIDES
#endif
        XTC_FB_OUT
        const i64 r0 = kv ? (tile - qtiles) * 64 : (qtiles - 1 - tile) * 64, rlim = kv ? J : I; /* resident rows */
#if XTC_FB_HEADS > 1
        if (kv && XTC_FB_NOKV(bt)) { /* a query head past the key/value heads: zero dk, dv rows */
            for (i64 e = threadIdx.x; e < 64 * D; e += blockDim.x)
                if (r0 + e / D < J) {
                    xtc_st(dk, (r0 + e / D) * D + e % D, 0.0f);
                    xtc_st(dv, (r0 + e / D) * D + e % D, 0.0f);
                }
            continue;
        }
#endif
        i64 a0 = 0, e0 = 0, a1, e1; /* the streamed rows: [a0, e0), then [a1, e1) */
        if (kv) {
            i64 qfm, qib, qie, lfm, lib, lie; /* the first key's rows and the last key's */
            XTC_FB_QUERIES(r0, qfm, qib, qie);
            XTC_FB_QUERIES(((r0 + 64 < J ? r0 + 64 : J) - 1), lfm, lib, lie);
            (void)qie;
            (void)lfm;
            (void)lib;
            e0 = qfm; /* the same for every key */
            a1 = qib;
            e1 = lie;
        } else {
            i64 lo, hi;
            XTC_FB_KEYS(r0, a1, e1);
            XTC_FB_KEYS(((r0 + 64 < I ? r0 + 64 : I) - 1), lo, hi);
            a1 = lo < a1 ? lo : a1;
            e1 = hi > e1 ? hi : e1;
        }
        const int n0 = (int)((e0 - a0 + XTC_FB_BN - 1) / XTC_FB_BN);
        const int nt = n0 + (int)(e1 > a1 ? (e1 - a1 + XTC_FB_BN - 1) / XTC_FB_BN : 0);
        const i64 rw = r0 + warp * 16; /* the warp's first resident row; the lane's are rw + lg and rw + lg + 8 */
        float acc1[XTC_FB_DP / 8][4], acc2[XTC_FB_DP / 8][4]; /* dq or dk; dv: summed over a group's query heads */
#if XTC_FB_HEADS > 1
        for (int hh = 0; hh < (kv ? XTC_FB_HEADS : 1); hh++) { /* a key block: its query heads, in order */
            const i64 batch = bt + hh * XTC_FB_HSTEP;
            XTC_FB_TILE
            XTC_FB_SIDES
#else
        { /* one query head a key/value head */
            const int hh = 0;
#endif
            /* streamed tile n into stage s: its rows, and for a key block their statistics */
#define XTC_FB_FETCH(n_, s_)                                                                                          \
    do {                                                                                                              \
        const i64 fs0 = (n_) < n0 ? a0 + (i64)(n_) * XTC_FB_BN : a1 + (i64)((n_) - n0) * XTC_FB_BN;                   \
        const i64 flim = (n_) < n0 ? e0 : e1;                                                                         \
        const xtc_sa fd = sa + 2u * (2 * XTC_FB_RES + (s_) * XTC_FB_STAGE);                                           \
        xtc_fa_rows(fd, 2 * XTC_FB_DS, S1, D, fs0, flim, XTC_FB_BN, XTC_FB_DP / 8, D / 8, w1);                        \
        xtc_fa_rows(fd + 2u * XTC_FB_BN * XTC_FB_DS, 2 * XTC_FB_DS, S2, sld2, fs0, flim, XTC_FB_BN, XTC_FB_DP / 8,     \
                    E / 8, w2);                                                                                       \
        if (kv && threadIdx.x < XTC_FB_BN) { /* a lane a row */                                                      \
            const int rr = threadIdx.x;                                                                               \
            const i64 i = fs0 + rr;                                                                                   \
            i64 lo = 0, hi = 0;                                                                                       \
            if (i < flim)                                                                                             \
                XTC_FB_KEYS(i, lo, hi);                                                                               \
            fb_ls[s_][rr] = i < flim ? xtc_ld(ob, i * OC + E) : 0.0f;                                                 \
            fb_dl[s_][rr] = i < flim ? scratch[batch * I + i] : 0.0f;                                                 \
            fb_lo[s_][rr] = lo;                                                                                       \
            fb_hi[s_][rr] = hi;                                                                                       \
        }                                                                                                             \
    } while (0)
            if (hh == 0) { /* the resident rows: the same for every query head of a key block */
                xtc_fa_rows(sa, 2 * XTC_FB_DS, R1, D, r0, rlim, 64, XTC_FB_DP / 8, D / 8, v1);
                xtc_fa_rows(sa + 2u * XTC_FB_RES, 2 * XTC_FB_DS, R2, ld2, r0, rlim, 64, XTC_FB_DP / 8, E / 8, v2);
            }
            if (nt > 0)
                XTC_FB_FETCH(0, 0);
            xtc_cp_async_commit();
            float rls[2], rdl[2]; /* a query block: each of the lane's rows' logsumexp, dlse - D_i and keys */
            i64 rlo[2], rhi[2];
            if (!kv) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const i64 i = rw + lg + 8 * r;
                    i64 lo = 0, hi = 0;
                    if (i < I)
                        XTC_FB_KEYS(i, lo, hi);
                    rlo[r] = lo;
                    rhi[r] = hi;
                    rls[r] = i < I ? xtc_ld(ob, i * OC + E) : 0.0f;
                    rdl[r] = i < I ? scratch[batch * I + i] : 0.0f;
                }
            } else {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    rls[r] = rdl[r] = 0.0f;
                    rlo[r] = rhi[r] = 0;
                }
            }
            if (hh == 0) /* (zeroed here, after the copies are issued: fewer registers) */
#pragma unroll
                for (int ci = 0; ci < XTC_FB_DP / 8; ci++)
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        acc1[ci][u] = acc2[ci][u] = 0.0f;
            for (int tn = 0; tn < nt; tn++) { /* (not n: a size's name) */
                const int st = XTC_FB_NST == 2 ? tn & 1 : 0;
                const i64 s0 = tn < n0 ? a0 + (i64)tn * XTC_FB_BN : a1 + (i64)(tn - n0) * XTC_FB_BN, lim = tn < n0 ? e0 : e1;
                xtc_cp_async_wait(0);
                __syncthreads(); /* stage st (and the resident tiles) arrived; the other stage read by every warp */
                if (XTC_FB_NST == 2 && tn + 1 < nt) { /* the next tile's copies, while this one is multiplied */
                    XTC_FB_FETCH(tn + 1, XTC_FB_NST - 1 - st); /* the other stage */
                    xtc_cp_async_commit();
                }
                const xtc_sa s1 = sa + 2u * (2 * XTC_FB_RES + st * XTC_FB_STAGE), s2 = s1 + 2u * XTC_FB_BN * XTC_FB_DS;
                /* the lane's ldmatrix rows: A of the warp's resident rows (row lane % 16, column 8 (lane / 16));
                 * B of two 8-row tiles (row 8 (lane / 16) + lane % 8, column 8 (lane / 8 % 2)); B .trans (row
                 * 8 (lane / 8 % 2) + lane % 8, column 8 (lane / 16)) */
                const xtc_sa ra = xtc_fa_opaque(sa + 2u * ((warp * 16 + lane % 16) * XTC_FB_DS + 8 * (lane / 16)));
                const unsigned bo = 2u * ((8 * (lane / 16) + lane % 8) * XTC_FB_DS + 8 * (lane / 8 % 2));
                const unsigned to = 2u * ((8 * (lane / 8 % 2) + lane % 8) * XTC_FB_DS + 8 * (lane / 16));
                const xtc_sa b1 = xtc_fa_opaque(s1 + bo), b2 = xtc_fa_opaque(s2 + bo);
                float x[XTC_FB_BN / 8][4], y[XTC_FB_BN / 8][4]; /* tile nc: streamed rows 8 nc .. 8 nc + 7 */
#pragma unroll
                for (int nc = 0; nc < XTC_FB_BN / 8; nc++)
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        x[nc][u] = y[nc][u] = 0.0f;
#pragma unroll
                for (int kd = 0; kd < XTC_FB_DP / 16; kd++) {
                    unsigned f1[4], f2[4];
                    xtc_ldmatrix_x4_sa(f1, ra + 2u * (16 * kd));
                    xtc_ldmatrix_x4_sa(f2, ra + 2u * (XTC_FB_RES + 16 * kd));
#pragma unroll
                    for (int nc = 0; nc < XTC_FB_BN / 16; nc++) {
                        unsigned k1[4], k2[4];
                        xtc_ldmatrix_x4_sa(k1, b1 + 2u * (16 * nc * XTC_FB_DS + 16 * kd));
                        xtc_ldmatrix_x4_sa(k2, b2 + 2u * (16 * nc * XTC_FB_DS + 16 * kd));
                        XTC_FB_MMA(x[2 * nc], f1, k1, x[2 * nc]);
                        XTC_FB_MMA(x[2 * nc + 1], f1, k1 + 2, x[2 * nc + 1]);
                        XTC_FB_MMA(y[2 * nc], f2, k2, y[2 * nc]);
                        XTC_FB_MMA(y[2 * nc + 1], f2, k2 + 2, y[2 * nc + 1]);
                    }
                }
                /* x becomes P, y dS: element (nc, u) is resident row lg + 8 (u / 2), streamed row 8 nc + 2 lt + u % 2 */
                const i64 sl = (s0 + XTC_FB_BN < lim ? s0 + XTC_FB_BN : lim) - 1, wl = (rw + 16 < rlim ? rw + 16 : rlim) - 1;
                if (s0 + XTC_FB_BN <= lim && rw + 16 <= rlim &&
                    (kv ? XTC_FB_FULL(s0, sl, rw, wl) : XTC_FB_FULL(rw, wl, s0, sl))) {
#pragma unroll
                    for (int nc = 0; nc < XTC_FB_BN / 8; nc++)
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const int sc = 8 * nc + 2 * lt + u % 2;
                            const float lse = kv ? fb_ls[st][sc] : rls[u / 2], dl = kv ? fb_dl[st][sc] : rdl[u / 2];
                            const float p = xtc_fa_exp2(x[nc][u] * XTC_FB_SCALE2 - lse * 1.44269504f);
                            x[nc][u] = p;
                            y[nc][u] = p * (y[nc][u] + dl) * XTC_FB_SCALE;
                        }
                } else {
#pragma unroll
                    for (int nc = 0; nc < XTC_FB_BN / 8; nc++)
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const int sc = 8 * nc + 2 * lt + u % 2;
                            const i64 rr = rw + lg + 8 * (u / 2), i = kv ? s0 + sc : rr, j = kv ? rr : s0 + sc;
                            const i64 lo = kv ? fb_lo[st][sc] : rlo[u / 2], hi = kv ? fb_hi[st][sc] : rhi[u / 2];
                            float pv = 0.0f, dsv = 0.0f; /* outside the row's keys (and past I, J): no term */
                            if (j >= lo && j < hi) {
                                const float lse = kv ? fb_ls[st][sc] : rls[u / 2], dl = kv ? fb_dl[st][sc] : rdl[u / 2];
                                XTC_FB_PAIR(x[nc][u], y[nc][u], i, j, lse, dl, pv, dsv);
                            }
                            x[nc][u] = pv;
                            y[nc][u] = dsv;
                        }
                }
                const xtc_sa t1 = xtc_fa_opaque(s1 + to), t2 = xtc_fa_opaque(s2 + to);
#pragma unroll
                for (int kc = 0; kc < XTC_FB_BN / 16; kc++) { /* streamed rows 16 kc .. 16 kc + 15 */
                    unsigned da[4], pa[4];
                    da[0] = XTC_FB_PACK(y[2 * kc][0], y[2 * kc][1]);
                    da[1] = XTC_FB_PACK(y[2 * kc][2], y[2 * kc][3]);
                    da[2] = XTC_FB_PACK(y[2 * kc + 1][0], y[2 * kc + 1][1]);
                    da[3] = XTC_FB_PACK(y[2 * kc + 1][2], y[2 * kc + 1][3]);
                    pa[0] = XTC_FB_PACK(x[2 * kc][0], x[2 * kc][1]);
                    pa[1] = XTC_FB_PACK(x[2 * kc][2], x[2 * kc][3]);
                    pa[2] = XTC_FB_PACK(x[2 * kc + 1][0], x[2 * kc + 1][1]);
                    pa[3] = XTC_FB_PACK(x[2 * kc + 1][2], x[2 * kc + 1][3]);
#pragma unroll
                    for (int ci = 0; ci < XTC_FB_DP / 16; ci++) { /* columns 16 ci .. + 7 and + 8 .. + 15 */
                        unsigned sf[4];
                        xtc_ldmatrix_x4_trans_sa(sf, t1 + 2u * (16 * kc * XTC_FB_DS + 16 * ci));
                        XTC_FB_MMA(acc1[2 * ci], da, sf, acc1[2 * ci]);
                        XTC_FB_MMA(acc1[2 * ci + 1], da, sf + 2, acc1[2 * ci + 1]);
                        if (kv) {
                            xtc_ldmatrix_x4_trans_sa(sf, t2 + 2u * (16 * kc * XTC_FB_DS + 16 * ci));
                            XTC_FB_MMA(acc2[2 * ci], pa, sf, acc2[2 * ci]);
                            XTC_FB_MMA(acc2[2 * ci + 1], pa, sf + 2, acc2[2 * ci + 1]);
                        }
                    }
                }
                if (XTC_FB_NST == 1) {
                    __syncthreads(); /* every warp done with the stage before the next tile's copies */
                    if (tn + 1 < nt) {
                        XTC_FB_FETCH(tn + 1, 0);
                        xtc_cp_async_commit();
                    }
                }
            }
            xtc_cp_async_wait(0); /* (no streamed tile: the resident copies) */
            __syncthreads(); /* every warp done with the tiles before the next head's or block's copies */
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const i64 row = rw + lg + 8 * r;
            if (row >= rlim)
                continue;
#pragma unroll
            for (int ci = 0; ci < XTC_FB_DP / 8; ci++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int col = 8 * ci + 2 * lt + h;
                    if (col < D) {
                        xtc_st((kv ? dk : dq), row * D + col, acc1[ci][2 * r + h]);
                        if (kv)
                            xtc_st(dv, row * D + col, acc2[ci][2 * r + h]);
                    }
                }
        }
    }
#undef XTC_FB_FETCH
#undef XTC_FB_SIDES
#undef XTC_FB_DS
#undef XTC_FB_RES
#undef XTC_FB_STAGE
#undef XTC_FB_BN
#undef XTC_FB_NST
#undef XTC_FB_DP
#undef XTC_FB_MMA
#undef XTC_FB_PACK
#undef XTC_FB_TILE
#undef XTC_FB_OUT
#undef XTC_FB_HEADS
#undef XTC_FB_HSTEP
#undef XTC_FB_NOKV
#undef XTC_FB_KEYS
#undef XTC_FB_QUERIES
#undef XTC_FB_PAIR
#undef XTC_FB_FULL
#undef XTC_FB_SCALE
#undef XTC_FB_SCALE2
