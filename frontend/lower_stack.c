/* lower_stack.c: one AttentionLayers stack: its options read and checked (read_stack) and its
 * layers built in order (attention_layers; XT-SEMANTICS.md section 4). */
#include "lower.h"

int lx_stack_error(Lx *L, const XtfValue *call, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xtf_diag_error(L->d, L->f, call->loc, "%s", msg);
    return -1;
}

int lx_read_stack(Lx *L, const XtfValue *call, Stack *S)
{
    memset(S, 0, sizeof *S);
    S->call = call;
    int is_cross_attender = strcmp(call->s, "CrossAttender") == 0;
    /* a CrossAttender may be causal: it matters to its self-attention layers (custom_layers),
     * token shifting and the ALiBi class, as in 0.23.0 */
    S->causal = strcmp(call->s, "Decoder") == 0 || (is_cross_attender && xtf_bool(call, "causal"));
    S->cross_attend = xtf_bool(call, "cross_attend") || is_cross_attender;
    S->only_cross = xtf_bool(call, "only_cross") || is_cross_attender;
    S->dim = (int)xtf_int(call, "dim");
    S->depth = (int)xtf_int(call, "depth");
    S->heads = (int)xtf_int(call, "heads");
    S->dim_head = (int)xtf_int(call, "attn_dim_head");
    const XtfValue *kvh = xtf_arg(call, "attn_kv_heads");
    S->kv_heads = xtf_bool(call, "attn_one_kv_head") ? 1 : kvh && kvh->kind == XV_INT ? (int)kvh->i : S->heads;
    if (S->kv_heads < 1 || S->heads % S->kv_heads)
        return lx_stack_error(L, call, "attn_kv_heads (%d) must divide heads (%d)", S->kv_heads, S->heads);
    S->norm = xtf_bool(call, "use_rmsnorm") ? NORM_RMS : xtf_bool(call, "use_scalenorm") ? NORM_SCALE
            : xtf_bool(call, "use_simple_rmsnorm") ? NORM_SIMPLE_RMS : NORM_LAYER;
    S->unit_offset = L->V->unit_offset_option && xtf_bool(call, "norm_add_unit_offset");
    S->pre_norm = xtf_bool(call, "pre_norm");
    S->sandwich_norm = xtf_bool(call, "sandwich_norm");
    S->rezero = xtf_bool(call, "use_rezero");
    S->macaron = xtf_bool(call, "macaron");
    S->scale_residual = xtf_bool(call, "scale_residual");
    S->gate_residual = xtf_bool(call, "gate_residual");
    S->residual_attn = xtf_bool(call, "residual_attn");
    S->cross_residual_attn = xtf_bool(call, "cross_residual_attn");
    S->xpos = xtf_bool(call, "rotary_xpos");
    S->xpos_scale_base = xtf_float(call, "rotary_xpos_scale_base");
    S->rotary = xtf_bool(call, "rotary_pos_emb") || S->xpos;
    if (S->rotary) {
        const XtfValue *rd = xtf_arg(call, "rotary_emb_dim");
        int r = rd && rd->kind == XV_INT ? (int)rd->i : S->dim_head / 2;
        int floor = L->V->rotary_min_dim; /* section 7.2: silently raised to 32 (before 2.x) */
        S->rotary_dim = r < floor ? floor : r;
        if (S->rotary_dim > S->dim_head || S->rotary_dim % 2)
            return lx_stack_error(L, call, "rotary dimension %d must be even and at most attn_dim_head (%d)",
                               S->rotary_dim, S->dim_head);
    }
    S->rel_pos = xtf_bool(call, "rel_pos_bias");
    S->rel_buckets = (int)xtf_int(call, "rel_pos_num_buckets");
    S->rel_max_distance = (int)xtf_int(call, "rel_pos_max_distance");
    S->pia = xtf_bool(call, "position_infused_attn");
    if (S->pia && S->dim % 2)
        return lx_stack_error(L, call, "position_infused_attn needs an even dim, got %d", S->dim);
    S->use_qk_norm_attn = xtf_bool(call, "use_qk_norm_attn");
    S->qk_norm = xtf_bool(call, "attn_qk_norm") || S->use_qk_norm_attn;
    /* 0.23.0: use_qk_norm_attn replaces scale_init_value by -log(log2(L^2 - L)) for
     * qk_norm_attn_seq_len L, or None; None means -3 */
    const XtfValue *sv = xtf_value(call, S->use_qk_norm_attn ? "qk_norm_attn_seq_len" : "attn_scale_init_value");
    int have = sv && (sv->kind == XV_INT || sv->kind == XV_FLOAT);
    double qv = have ? xtf_float(call, S->use_qk_norm_attn ? "qk_norm_attn_seq_len" : "attn_scale_init_value") : 0;
    S->qk_scale_init = !have ? -3.0 : S->use_qk_norm_attn ? -log(log2(qv * qv - qv)) : qv;
    if (S->qk_norm && L->V->qk_norm_fixed) {
        S->qk_norm_scale = xtf_float(call, "attn_qk_norm_scale");
        S->qk_norm_groups = (int)xtf_int(call, "attn_qk_norm_groups");
        S->qk_norm_dim_scale = xtf_bool(call, "attn_qk_norm_dim_scale");
        if (S->dim_head % S->qk_norm_groups || S->dim_head / S->qk_norm_groups <= 2)
            return lx_stack_error(L, call, "attn_qk_norm_groups (%d) must divide attn_dim_head (%d) into groups wider "
                                        "than 2 (x-transformers asserts it)", S->qk_norm_groups, S->dim_head);
        if (S->qk_norm_dim_scale && !L->V->qk_dim_scale_kv && S->kv_heads != S->heads)
            return lx_stack_error(L, call, "attn_qk_norm_dim_scale with grouped key/values is not supported "
                                        "(x-transformers %s scales k per query head)", L->V->name);
    }
    int branch_zero = xtf_bool(call, "zero_init_branch_output");
    S->attn_zero_init = branch_zero || xtf_bool(call, "attn_zero_init_output");
    S->ff_zero_init = branch_zero || xtf_bool(call, "ff_zero_init_output");
    S->talking_heads = xtf_bool(call, "attn_talking_heads");
    S->on_attn = xtf_bool(call, "attn_on_attn");
    if (xtf_bool(call, "attn_collab_heads")) {
        /* 0.23.0: int(collab_compression * heads * dim_head) */
        S->collab_qk = (int)(xtf_float(call, "attn_collab_compression") * (double)(S->heads * S->dim_head));
        if (S->collab_qk < 1)
            return lx_stack_error(L, call, "attn_collab_compression leaves q and k no width (%g x %d heads x %d)",
                               xtf_float(call, "attn_collab_compression"), S->heads, S->dim_head);
        if (xtf_int(call, "attn_num_mem_kv") > 0)
            return lx_stack_error(L, call, "attn_collab_heads together with attn_num_mem_kv is not supported "
                                        "(x-transformers 0.23.0 crashes on it: one k for all heads, memory keys per head)");
        if (S->rotary && S->rotary_dim > S->collab_qk)
            return lx_stack_error(L, call, "attn_collab_heads leaves q and k %d wide, less than the rotary dimension %d "
                                        "(x-transformers 0.23.0 crashes on it)", S->collab_qk, S->rotary_dim);
    }
    if (S->on_attn && S->attn_zero_init)
        return lx_stack_error(L, call, "attn_on_attn together with zero_init_output (or zero_init_branch_output) "
                                    "is not supported (x-transformers 0.23.0 crashes on it: init_zero_ of a Sequential)");
    S->gate_values = xtf_bool(call, "attn_gate_values");
    S->head_scale = xtf_bool(call, "attn_head_scale");
    S->num_mem_kv = (int)xtf_int(call, "attn_num_mem_kv");
    S->alibi = xtf_bool(call, "alibi_pos_bias");
    const XtfValue *ah = xtf_arg(call, "alibi_num_heads");
    S->alibi_heads = ah && ah->kind == XV_INT ? (int)ah->i : S->heads;
    S->alibi_learned = xtf_bool(call, "alibi_learned") || !S->causal; /* 0.23.0's class choice */
    if (S->alibi && S->rel_pos)
        return lx_stack_error(L, call, "alibi_pos_bias and rel_pos_bias exclude each other (x-transformers "
                                    "0.23.0 asserts it)");
    if (S->alibi && S->alibi_heads > S->heads)
        return lx_stack_error(L, call, "alibi_num_heads (%d) must be at most heads (%d)", S->alibi_heads, S->heads);
    const XtfValue *topk = xtf_arg(call, "attn_sparse_topk");
    S->sparse_topk = topk && topk->kind == XV_INT ? (int)topk->i : 0;
    const XtfValue *past = xtf_arg(call, "attn_max_attend_past");
    S->max_attend_past = past && past->kind == XV_INT ? (int)past->i : 0;
    S->entmax15 = xtf_bool(call, "attn_use_entmax15");
    S->ff_glu = xtf_bool(call, "ff_glu");
    S->ff_relu_squared = xtf_bool(call, "ff_relu_squared");
    S->ff_post_act_ln = xtf_bool(call, "ff_post_act_ln");
    S->ff_swish = xtf_bool(call, "ff_swish");
    S->ff_no_bias = xtf_bool(call, "ff_no_bias");
    if (L->V->single_head_no_to_out && S->heads == 1 && S->dim_head != S->dim)
        return lx_stack_error(L, call, "with one head x-transformers %s has no to_out, so attn_dim_head (%d) must "
                                    "equal dim (%d)", L->V->name, S->dim_head, S->dim);
    S->ff_mult = xtf_float(call, "ff_mult");
    S->attn_dropout = xtf_float(call, "attn_dropout");
    S->ff_dropout = xtf_float(call, "ff_dropout");
    if (!(S->dim * S->ff_mult >= 1)) /* int(dim * ff_mult) < 1 */
        return lx_stack_error(L, call, "ff_mult %g gives an empty feed-forward layer", S->ff_mult);
    /* sizes derived from two options must fit too (options.h: XTF_MAX_SIZE) */
    if (S->dim * S->ff_mult > XTF_MAX_SIZE || (int64_t)S->heads * S->dim_head > XTF_MAX_SIZE)
        return lx_stack_error(L, call, "the layers are too wide: dim * ff_mult and heads * attn_dim_head "
                                    "must be at most %d", XTF_MAX_SIZE);

    /* the layer list (section 4) */
    const char *block = S->only_cross ? "cf" : S->cross_attend ? "acf" : "af";
    char blk[8];
    snprintf(blk, sizeof blk, "%s%s", S->macaron ? "f" : "", block);
    int k = (int)xtf_int(call, "sandwich_coef");
    int par = (int)xtf_int(call, "par_ratio");
    const XtfValue *custom = xtf_arg(call, "custom_layers");
    while (custom && custom->kind == XV_REF)
        custom = custom->ref;
    S->ntypes = 0;
    if (custom && custom->kind == XV_TUPLE) { /* custom_layers: the list as written */
        if (custom->nitems < 1 || custom->nitems >= MAX_LAYERS)
            return lx_stack_error(L, call, "custom_layers needs 1 to %d layers, got %d", MAX_LAYERS - 1,
                               custom->nitems);
        for (int i = 0; i < custom->nitems; i++) {
            const XtfValue *it = custom->items[i];
            if (it->kind != XV_STRING || strlen(it->s) != 1 || !strchr("acf", it->s[0]))
                return lx_stack_error(L, call, "custom_layers items are 'a', 'c' or 'f'");
            if (it->s[0] == 'c' && !S->cross_attend && !S->only_cross)
                return lx_stack_error(L, call, "custom_layers has a 'c' layer: set cross_attend = true "
                                            "so the model takes a context");
            S->types[S->ntypes++] = it->s[0];
        }
    } else if (par > 0) { /* par_ratio: the PAR layout (x-transformers 0.23.0) */
        int par_depth = S->depth * (int)strlen(blk);
        if (!(1 < par && par <= par_depth))
            return lx_stack_error(L, call, "par_ratio must be in (1, %d], got %d", par_depth, par);
        char nf[8];
        int nn = 0;
        for (const char *c = blk; *c; c++)
            if (*c != 'f')
                nf[nn++] = *c;
        nf[nn] = 0;
        int par_attn = par_depth / par;
        int depth_cut = par_depth * 2 / 3;
        int par_width = (depth_cut + depth_cut / par_attn) / par_attn;
        if (nn > par_width)
            return lx_stack_error(L, call, "the default block is too large for par_ratio %d", par);
        if (par_depth >= MAX_LAYERS)
            return lx_stack_error(L, call, "too many layers (%d, at most %d)", par_depth, MAX_LAYERS - 1);
        for (int r = 0; r < par_attn; r++)
            for (int w = 0; w < par_width; w++)
                S->types[S->ntypes++] = w < nn ? nf[w] : 'f';
        while (S->ntypes < par_depth)
            S->types[S->ntypes++] = 'f';
    } else {
        if (k < 0 || k > S->depth)
            return lx_stack_error(L, call, "sandwich_coef must be between 1 and depth (%d), got %d", S->depth, k);
        size_t need = (size_t)S->depth * strlen(blk) + 2u * (size_t)k;
        if (need >= MAX_LAYERS)
            return lx_stack_error(L, call, "too many layers (%zu, at most %d)", need, MAX_LAYERS - 1);
        for (int i = 0; i < k; i++)
            S->types[S->ntypes++] = 'a';
        for (int i = 0; i < S->depth - k; i++)
            for (const char *c = blk; *c; c++)
                S->types[S->ntypes++] = *c;
        for (int i = 0; i < k; i++)
            S->types[S->ntypes++] = 'f';
    }

    /* shift_tokens: one amount for every layer, or a tuple with one per layer (x-transformers
     * zips it with the layer list, so a shorter tuple would build fewer layers) */
    const XtfValue *st = xtf_arg(call, "shift_tokens");
    while (st && st->kind == XV_REF)
        st = st->ref;
    if (st && st->kind == XV_TUPLE && st->nitems != S->ntypes)
        return lx_stack_error(L, call, "shift_tokens has %d values for %d layers (%s): give one per layer, or one "
                                    "integer for all", st->nitems, S->ntypes, S->types);
    for (int i = 0; i < S->ntypes; i++) {
        const XtfValue *v = st && st->kind == XV_TUPLE ? st->items[i] : st;
        while (v && v->kind == XV_REF)
            v = v->ref;
        S->shift[i] = v && v->kind == XV_INT && v->i > 0 ? (int)v->i : 0;
        int segments = S->causal ? S->shift[i] + 1 : 2 * S->shift[i] + 1;
        if (S->shift[i] > 0 && segments > S->dim)
            return lx_stack_error(L, call, "shift_tokens %d splits dim %d into %d chunks: at most dim", S->shift[i],
                               S->dim, segments);
    }
    return 0;
}

/* The attn_layers of a wrapper call, read into *S: 0, or -1 with the error reported. */
int lx_wrapper_stack(Lx *L, const XtfValue *call, Stack *S)
{
    const XtfValue *layers = xtf_callv(call, "attn_layers");
    if (!layers)
        return lx_stack_error(L, call, "%s needs attn_layers", call->s);
    return lx_read_stack(L, layers, S) < 0 ? -1 : 0;
}

/* AttentionLayers forward (section 4) on x[b, n, dim]. hiddens/nh collect each 'a' layer's
 * input (Transformer-XL memories) when non-NULL. */
/* rotary_xpos (1.x, 2.x): q's rotary columns of position p times s^((p - c) / scale_base), k's
 * divided by it, with s[i] = (2i + 0.4 rd) / (1.4 rd) (the buffer rotary_pos_emb.scale, one per
 * pair, laid out as the angles are). x-transformers takes c = (its longest position + 1) // 2;
 * any c gives the same scores, since q_p k_j carries s^((p - j) / scale_base), so c here is half
 * the longest table this graph can build (the library's own when the sequence is max_seq_len
 * long) and stays fixed as a KV cache grows: keys cached at earlier calls keep their scale. */
static void xpos_tables(Lx *L, const Stack *S, IrNode *pos, IrDim n, Positions *P)
{
    IrGraph *g = L->g;
    int64_t longest = n.c;
    for (int s = 0; s < IR_MAXSYM; s++)
        longest += n.k[s] * g->sym_max[s];
    IrDim fs[1] = {C(S->rotary_dim / 2)}, sf[2] = {C(1), C(S->rotary_dim / 2)};
    IrNode *scale = lx_init(L, lx_paramv(L, 1, 1, fs, "attn_layers.rotary_pos_emb.scale"), IR_INIT_XPOS_SCALE, 0);
    IrNode *power = mul(L, sub(L, pos, cf(L, (double)(longest / 2))), cf(L, 1.0 / S->xpos_scale_base));
    IrNode *xs = un(L, IR_EXP, mul(L, power, ir_reshape(g, un(L, IR_LOG, scale), 2, sf))); /* [n, rd/2] */
    if (L->V->rotary_interleaved) { /* 2.x: (s_0, s_0, s_1, s_1, ...) */
        IrDim s3[3] = {n, C(S->rotary_dim / 2), C(1)}, s2[2] = {n, C(S->rotary_dim)};
        IrNode *t3 = ir_reshape(g, xs, 3, s3);
        xs = ir_reshape(g, ir_concat(g, t3, t3, -1), 2, s2);
    } else {
        xs = ir_concat(g, xs, xs, -1);
    }
    P->xpos_q = lx_lab(L, xs, "rotary.xpos_q");
    P->xpos_k = lx_lab(L, un(L, IR_RECIP, xs), "rotary.xpos_k");
}

IrNode *lx_attention_layers(Lx *L, const Stack *S, IrNode *x)
{
    IrGraph *g = L->g;
    char p[160], np[200];
    Positions P = {0};
    IrDim n = seq_of(x); /* positions cover memory (or cache) + sequence */
    if (L->mems_in && L->mems_in[0])
        n = ir_dim_add(n, seq_of(L->mems_in[0]));
    n = ir_dim_add(n, L->pos_offset);

    if (S->rel_pos) {
        IrDim ts[2] = {C(S->rel_buckets), C(S->heads)};
        P.relpos_table = lx_init(L, lx_paramv(L, 0, 2, ts, "attn_layers.rel_pos.relative_attention_bias.weight"),
                                 IR_INIT_NORMAL, 1.0); /* nn.Embedding */
    }
    if (S->alibi && S->alibi_learned) {
        /* exp of the learned log-slopes (and the future ones). 0.23.0 makes both parameters of one
         * tensor, so they share storage: its state dicts hold equal values (load_state_dict leaves
         * both with the second's), while each gets its own gradient, as here */
        IrDim ls[4] = {C(1), C(S->alibi_heads), C(1), C(1)};
        IrNode *past = lx_init(L, lx_paramv(L, 0, 4, ls, "attn_layers.rel_pos.learned_logslopes"), IR_INIT_ALIBI, 0);
        P.alibi_past = lx_per_head(L, un(L, IR_EXP, past), S->alibi_heads, S->heads);
        if (!S->causal) {
            IrNode *future = lx_paramv(L, 0, 4, ls, "attn_layers.rel_pos.learned_logslopes_future");
            lx_init(L, future, IR_INIT_ALIBI, 0);
            P.alibi_future = lx_per_head(L, un(L, IR_EXP, future), S->alibi_heads, S->heads);
        }
    } else if (S->alibi) { /* fixed slopes: constants (non-persistent buffers, not in the weights) */
        IrDim one[4] = {C(1), C(1), C(1), C(1)};
        IrNode *v = NULL;
        for (int h = 0; h < S->alibi_heads; h++) {
            IrNode *c = ir_expand(g, cf(L, xtc_alibi_slope(S->alibi_heads, h)), 4, one);
            v = v ? ir_concat(g, v, c, 1) : c;
        }
        P.alibi_past = lx_per_head(L, v, S->alibi_heads, S->heads);
    }
    if (S->rotary) { /* theta[p] = p * inv_freq, freqs = cat(theta, theta) (halves) */
        IrDim fs[1] = {C(S->rotary_dim / 2)};
        IrNode *inv = lx_init(L, lx_paramv(L, 1, 1, fs, "attn_layers.rotary_pos_emb.inv_freq"), IR_INIT_INV_FREQ, 10000);
        IrDim sp[2] = {n, C(1)}, sf[2] = {C(1), C(S->rotary_dim / 2)};
        IrNode *pos = ir_reshape(g, ir_arange(g, C(0), n, IR_F32), 2, sp);
        IrNode *theta = mul(L, pos, ir_reshape(g, inv, 2, sf)), *freqs;
        if (L->V->rotary_interleaved) { /* 2.x: (theta_0, theta_0, theta_1, theta_1, ...) */
            IrDim s3[3] = {n, C(S->rotary_dim / 2), C(1)}, s2[2] = {n, C(S->rotary_dim)};
            IrNode *t3 = ir_reshape(g, theta, 3, s3);
            freqs = ir_reshape(g, ir_concat(g, t3, t3, -1), 2, s2);
        } else {
            freqs = ir_concat(g, theta, theta, -1);
        }
        freqs = lx_lab(L, freqs, "rotary.freqs");
        P.rot_cos = lx_lab(L, un(L, IR_COS, freqs), "rotary.cos");
        P.rot_sin = lx_lab(L, un(L, IR_SIN, freqs), "rotary.sin");
        if (S->xpos)
            xpos_tables(L, S, pos, n, &P);
    }
    if (S->pia) { /* S(p) = cat(sin(p * inv_freq), cos(p * inv_freq)) */
        IrDim fs[1] = {C(S->dim / 2)};
        IrNode *inv = lx_init(L, lx_paramv(L, 1, 1, fs, "attn_layers.pia_pos_emb.inv_freq"), IR_INIT_INV_FREQ, 10000);
        IrDim sp[2] = {n, C(1)}, sf[2] = {C(1), C(S->dim / 2)};
        IrNode *pos = ir_reshape(g, ir_arange(g, C(0), n, IR_F32), 2, sp);
        IrNode *ang = mul(L, pos, ir_reshape(g, inv, 2, sf));
        P.pia = lx_lab(L, ir_concat(g, un(L, IR_SIN, ang), un(L, IR_COS, ang), -1), "pia.sinusoids");
    }

    IrNode *prev_attn = NULL, *prev_cross = NULL;
    int nattn = 0;
    for (int i = 0; i < S->ntypes; i++) {
        char t = S->types[i];
        int is_attn = t == 'a' || t == 'c';
        int qk_layer = S->use_qk_norm_attn && is_attn;
        snprintf(p, sizeof p, "attn_layers.layers.%d", i);
        IrNode *residual = x;
        if (S->pre_norm && !qk_layer) {
            snprintf(np, sizeof np, "%s.0.0", p);
            x = lx_lab(L, lx_block_norm(L, S, x, np), "layer%d.norm", i);
        }
        if (S->shift[i] > 0) /* ShiftTokens wraps the block: only 'a' and 'c' blocks see the mask */
            x = lx_lab(L, lx_shift_tokens(L, S, x, S->shift[i], t == 'f' ? NULL : L->mask), "layer%d.shifted", i);
        /* the block's keys: .1.*, under .fn. for each wrapper (Rezero, ShiftTokens, macaron's Scale) */
        snprintf(np, sizeof np, "%s.1%s%s%s", p, S->rezero ? ".fn" : "", S->shift[i] > 0 ? ".fn" : "",
                 t == 'f' && S->macaron ? ".fn" : "");
        IrNode *out;
        if (t == 'a') {
            IrNode *prev = S->residual_attn ? prev_attn : NULL;
            IrNode *mem = NULL;
            if (L->mems_in) { /* XL: this layer's memory in, its input (pre-norm) out */
                mem = L->mems_in[nattn];
                L->hiddens[nattn] = residual;
                if (L->V->xl_mem_pre_norm && S->pre_norm && !qk_layer) { /* 1.x, 2.x: normed as x is */
                    char mp[200];
                    snprintf(mp, sizeof mp, "%s.0.0", p);
                    mem = lx_lab(L, lx_block_norm(L, S, mem, mp), "layer%d.mem_norm", i);
                }
            }
            L->cur_attn = nattn++;
            out = lx_attention(L, S, x, np, i, 0, &P, &prev, mem);
            if (S->residual_attn)
                prev_attn = prev;
        } else if (t == 'c') {
            IrNode *prev = S->cross_residual_attn ? prev_cross : NULL;
            out = lx_attention(L, S, x, np, i, 1, &P, &prev, NULL);
            if (S->cross_residual_attn)
                prev_cross = prev;
        } else {
            out = lx_feed_forward(L, S, x, np, i);
            if (S->macaron)
                out = mul(L, out, cf(L, 0.5));
        }
        if (S->rezero) {
            snprintf(np, sizeof np, "%s.1", p);
            out = mul(L, out, lx_init(L, lx_param1(L, 1, np, "g"), IR_INIT_CONST, 0.0)); /* Rezero: 0 */
        }
        if (S->sandwich_norm || qk_layer) {
            snprintf(np, sizeof np, "%s.0.1", p);
            out = lx_block_norm(L, S, out, np);
        }
        snprintf(np, sizeof np, "%s.2", p);
        if (S->scale_residual)
            residual = mul(L, residual, lx_init(L, lx_param1(L, S->dim, np, "residual_scale"), IR_INIT_CONST, 1.0));
        if (S->gate_residual)
            x = lx_gru_gate(L, S, out, residual, np);
        else
            x = add(L, out, residual);
        lx_lab(L, x, "layer%d.residual", i);
        if (!S->pre_norm && i != S->ntypes - 1) {
            snprintf(np, sizeof np, "%s.0.2", p);
            x = lx_lab(L, lx_block_norm(L, S, x, np), "layer%d.post_norm", i);
        }
    }
    return x;
}

