/* lower.c: lowering of checked x-transformers models (.xtf) to the tensor IR.
 *
 * Follows ../shared/XT-SEMANTICS.md (x-transformers 0.23.0) operation for operation: the
 * section numbers in comments point there. Parameters carry their exact state_dict names.
 * Everything is expressed in primitive IR ops (LayerNorm as mean/variance/rsqrt, attention as
 * matmul/softmax/where); the fusion passes recombine them.
 *
 * Symbols: "b" (batch), "n" (sequence, bounded by max_seq_len), "m" (context length, for
 * cross-attention), "s"/"t" (source/target lengths of XTransformer), "p" (Transformer-XL memory
 * rows in) and the derived "q" = min(n+p, max_mem_len) (rows out), "c" (KV cache length). Inputs
 * and outputs are named as in DESIGN.md ("Module interface"). */
#include "lower.h"

static int add_sym(Lx *L, const char *name, int64_t max, IrDim *out)
{
    int s = ir_graph_add_sym(L->g, name, max);
    if (s < 0)
        return -1;
    *out = ir_dim_sym(s);
    return 0;
}

/* TransformerWrapper forward (section 3) on tokens[b, n]; returns the final-normed hidden
 * states [b, n, dim] in *hidden and the logits. */
static IrNode *transformer_wrapper(Lx *L, const XtfValue *call, IrNode *tokens, IrNode **hidden)
{
    IrGraph *g = L->g;
    Stack S;
    if (lx_wrapper_stack(L, call, &S) < 0)
        return NULL;
    int V = (int)xtf_int(call, "num_tokens");
    int maxlen = (int)xtf_int(call, "max_seq_len");
    const XtfValue *ed = xtf_arg(call, "emb_dim");
    int emb_dim = ed && ed->kind == XV_INT ? (int)ed->i : S.dim;
    int M = (int)xtf_int(call, "num_memory_tokens");
    if (xtf_bool(call, "tie_embedding") && emb_dim != S.dim) {
        lx_stack_error(L, call, "tie_embedding needs emb_dim (%d) equal to dim (%d)", emb_dim, S.dim);
        return NULL;
    }
    IrDim es[2] = {C(V), C(emb_dim)};
    IrNode *emb_w;
    if (L->tied_emb) { /* one module under two state_dict names */
        char alias[300];
        snprintf(alias, sizeof alias, "%s%s", L->root, L->V->token_emb);
        emb_w = L->tied_emb;
        if (emb_w && !(ir_dim_eq(emb_w->shape[0], C(V)) && ir_dim_eq(emb_w->shape[1], C(emb_dim)))) {
            lx_stack_error(L, call, "tie_token_emb needs equal enc_num_tokens and dec_num_tokens");
            return NULL;
        }
        ir_alias(g, alias, emb_w);
    } else {
        emb_w = lx_init(L, lx_paramv(L, 0, 2, es, "%s", L->V->token_emb), IR_INIT_NORMAL, /* kaiming_normal_ */
                        sqrt(2.0 / emb_dim));
    }
    IrNode *x = lx_lab(L, ir_gather(g, emb_w, tokens), "token_emb");
    /* use_pos_emb (0.23.0), renamed use_abs_pos_emb later: a file can set only its own */
    if (xtf_bool(call, "use_pos_emb") && xtf_bool(call, "use_abs_pos_emb") && !(S.rotary || S.rel_pos || S.pia)) {
        IrDim ps[2] = {C(maxlen), C(emb_dim)};
        IrNode *pe = lx_init(L, lx_paramv(L, 0, 2, ps, "pos_emb.emb.weight"), IR_INIT_NORMAL, 1.0);
        IrNode *pos = ir_slice(g, pe, 0, L->pos_offset, seq_of(tokens));
        x = lx_lab(L, add(L, x, mul(L, pos, cf(L, pow((double)emb_dim, -0.5)))), "embed");
    }
    x = lx_dropout(L, x, xtf_float(call, "emb_dropout"));
    if (emb_dim != S.dim)
        x = lx_linear(L, x, "project_emb", emb_dim, S.dim, 1);
    IrNode *saved_mask = L->mask;
    if (M > 0) { /* memory tokens, prepended; the mask is padded with true */
        IrDim ms[2] = {C(M), C(S.dim)}, bs[3] = {L->B, C(M), C(S.dim)};
        IrNode *mem = lx_init(L, lx_paramv(L, 0, 2, ms, "memory_tokens"), IR_INIT_NORMAL, 1.0);
        x = ir_concat(g, ir_expand(g, mem, 3, bs), x, 1);
        if (L->mask) {
            IrDim pm[2] = {L->B, C(M)};
            L->mask = ir_concat(g, ir_expand(g, ir_const(g, 1, IR_BOOL), 2, pm), L->mask, 1);
        }
    }
    x = lx_attention_layers(L, &S, x);
    L->mask = saved_mask;
    x = lx_lab(L, lx_final_norm(L, &S, x), "final_norm");
    if (M > 0)
        x = ir_slice(g, x, 1, C(M), seq_of(tokens));
    *hidden = x;
    if (xtf_bool(call, "tie_embedding"))
        return ir_matmul(g, x, emb_w, 1);
    return lx_linear(L, x, "to_logits", S.dim, V, L->V->linear_biases);
}

static int lower_transformer_wrapper(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    const XtfValue *layers = xtf_callv(call, "attn_layers");
    IrDim n;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "n", xtf_int(call, "max_seq_len"), &n) < 0)
        return -1;
    IrDim bn[2] = {L->B, n};
    IrNode *tokens = ir_input(g, "tokens", IR_I64, 2, bn);
    if (L->opt && L->opt->mask)
        L->mask = ir_input(g, "mask", IR_BOOL, 2, bn);
    if (layers && (xtf_bool(layers, "cross_attend") || strcmp(layers->s, "CrossAttender") == 0)) {
        IrDim m;
        if (add_sym(L, "m", 0, &m) < 0)
            return -1;
        IrDim cs[3] = {L->B, m, C(xtf_int(layers, "dim"))}, cm[2] = {L->B, m};
        L->context = ir_input(g, "context", IR_F32, 3, cs);
        if (L->opt && L->opt->context_mask)
            L->context_mask = ir_input(g, "context_mask", IR_BOOL, 2, cm);
    }
    IrNode *targets = L->opt && L->opt->train ? ir_input(g, "targets", IR_I64, 2, bn) : NULL;

    /* Transformer-XL (section 10): mems.<l> in and out, one per self-attention layer */
    int K = (int)xtf_int(call, "max_mem_len"), nmem = 0;
    IrNode **mems_in = L->store[0], **hiddens = L->store[1];
    if (K > 0) {
        Stack S;
        if (!layers || lx_read_stack(L, layers, &S) < 0)
            return -1;
        if (L->mask) /* 1.x, 2.x take it (the memories' keys count as real); 0.23.0 crashes */
            return lx_stack_error(L, call, "a padding mask together with max_mem_len is not supported%s",
                                  L->V->xl_takes_mask ? " yet" : " (x-transformers 0.23.0 crashes on it)");
        IrDim pm;
        if (add_sym(L, "p", K, &pm) < 0)
            return -1;
        /* the memories out keep q = min(M+n+p, max_mem_len) rows: all of them while the recurrence
         * is younger than max_mem_len (a first segment shorter than it, say). With M memory tokens
         * each layer's input is M+n long, the tokens' rows last: the memory tokens' rows enter the
         * memories as any other (x-transformers keeps them), and the next call's keys are the
         * memories, then its own memory tokens, then its tokens */
        IrDim mn = ir_dim_add(n, C(xtf_int(call, "num_memory_tokens")));
        if (ir_graph_add_derived_sym(g, "q", ir_dim_add(mn, pm), K) < 0)
            return -1;
        IrDim ms[3] = {L->B, pm, C(S.dim)};
        char name[32];
        for (int i = 0; i < S.ntypes; i++)
            if (S.types[i] == 'a') {
                snprintf(name, sizeof name, "mems.%d", nmem);
                hiddens[nmem] = NULL;
                mems_in[nmem++] = ir_input(g, name, IR_F32, 3, ms);
            }
        /* shift_mem_down = s: layer l reads (and extends) the memories given as mems.<l + s>,
         * the list rotated as 0.23.0 does with mems[s:] + mems[:s] (so s >= the number of
         * memories leaves it as it is) */
        int s = (int)xtf_int(call, "shift_mem_down");
        if (s > 0 && s < nmem) {
            IrNode *given[MAX_LAYERS];
            memcpy(given, mems_in, sizeof *given * (size_t)nmem);
            for (int l = 0; l < nmem; l++)
                mems_in[l] = given[(l + s) % nmem];
        }
        L->mems_in = mems_in;
        L->hiddens = hiddens;
    }
    /* KV cache for incremental decoding: cache.<l>.k / .v in and out per self-attention layer */
    int ncache = 0;
    IrNode **ck = L->store[2], **cv = L->store[3], **nk = L->store[4], **nv = L->store[5];
    if (L->opt->kv_cache) {
        Stack S;
        if (!layers || lx_read_stack(L, layers, &S) < 0)
            return -1;
        if (!S.causal || strcmp(layers->s, "Decoder") != 0)
            return lx_stack_error(L, layers, "a KV cache needs a causal Decoder");
        if (S.collab_qk)
            return lx_stack_error(L, layers, "a KV cache together with attn_collab_heads is not supported yet");
        if (L->mask || K > 0 || xtf_int(call, "num_memory_tokens") > 0)
            return lx_stack_error(L, call, "a KV cache together with a mask, max_mem_len or "
                                        "num_memory_tokens is not supported yet");
        IrDim c;
        if (add_sym(L, "c", xtf_int(call, "max_seq_len"), &c) < 0)
            return -1;
        /* the call's positions follow the cache's: all of them within the position table */
        if (ir_graph_add_limit(g, ir_dim_add(c, n), xtf_int(call, "max_seq_len")) < 0)
            return -1;
        IrDim cs[4] = {L->B, c, C(S.kv_heads), C(S.dim_head)}; /* grouped: key/value heads */
        char name[48];
        for (int i = 0; i < S.ntypes; i++)
            if (S.types[i] == 'a') {
                snprintf(name, sizeof name, "cache.%d.k", ncache);
                ck[ncache] = ir_input(g, name, IR_F32, 4, cs);
                snprintf(name, sizeof name, "cache.%d.v", ncache);
                cv[ncache] = ir_input(g, name, IR_F32, 4, cs);
                nk[ncache] = nv[ncache] = NULL;
                ncache++;
            }
        L->cache_k = ck;
        L->cache_v = cv;
        L->new_k = nk;
        L->new_v = nv;
        L->pos_offset = c;
    }
    IrNode *hidden = NULL;
    IrNode *logits = transformer_wrapper(L, call, tokens, &hidden);
    if (!logits)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "logits", lx_lab(L, logits, "logits"));
    for (int l = 0; l < ncache; l++) {
        char name[48];
        snprintf(name, sizeof name, "cache.%d.k", l);
        ir_output(g, name, nk[l]);
        snprintf(name, sizeof name, "cache.%d.v", l);
        ir_output(g, name, nv[l]);
    }
    L->cache_k = L->cache_v = L->new_k = L->new_v = NULL;
    L->pos_offset = C(0);
    for (int l = 0; l < nmem; l++) { /* cat(mems, hiddens)[:, -max_mem_len:], detached */
        char name[32];
        snprintf(name, sizeof name, "mems.%d", l);
        IrNode *all = ir_concat(g, mems_in[l], hiddens[l], 1); /* [b, p+n, dim] */
        if (!all)
            break;
        IrDim q = ir_dim_sym(ir_graph_find_sym(g, "q"));
        ir_output(g, name, ir_slice(g, all, 1, ir_dim_sub(seq_of(all), q), q));
    }
    L->mems_in = L->hiddens = NULL;
    if (L->opt && L->opt->embeddings)
        ir_output(g, "embeddings", hidden);
    if (targets)
        ir_output(g, "loss", lx_lab(L, ir_xent(g, logits, targets), "loss"));
    return 0;
}

/* ContinuousTransformerWrapper body (section 10) on x[b, n, dim_in]: returns the output
 * [b, n, dim_out] and, in *emb, the final-normed embeddings [b, n, dim]. */
static IrNode *continuous_forward(Lx *L, const XtfValue *call, IrNode *x, IrNode **emb)
{
    IrGraph *g = L->g;
    Stack S;
    if (lx_wrapper_stack(L, call, &S) < 0)
        return NULL;
    int maxlen = (int)xtf_int(call, "max_seq_len");
    const XtfValue *di = xtf_arg(call, "dim_in"), *dout = xtf_arg(call, "dim_out");
    if (di && di->kind == XV_INT)
        x = lx_linear(L, x, "project_in", (int)di->i, S.dim, 1);
    if (xtf_bool(call, "use_pos_emb") && !(S.rotary || S.rel_pos || S.pia)) {
        IrDim ps[2] = {C(maxlen), C(S.dim)};
        IrNode *pe = lx_init(L, lx_paramv(L, 0, 2, ps, "pos_emb.emb.weight"), IR_INIT_NORMAL, 1.0);
        IrNode *pos = ir_slice(g, pe, 0, C(0), seq_of(x));
        x = add(L, x, mul(L, pos, cf(L, pow((double)S.dim, -0.5))));
    }
    x = lx_dropout(L, x, xtf_float(call, "emb_dropout"));
    x = lx_attention_layers(L, &S, x);
    x = *emb = lx_lab(L, lx_layer_norm(L, x, "norm", S.dim), "final_norm");
    if (dout && dout->kind == XV_INT)
        x = lx_linear(L, x, "project_out", S.dim, (int)dout->i, 1);
    return x;
}

static int continuous_dim_in(const XtfValue *call)
{
    const XtfValue *di = xtf_arg(call, "dim_in");
    return di && di->kind == XV_INT ? (int)di->i : (int)xtf_int(xtf_callv(call, "attn_layers"), "dim");
}

/* ContinuousTransformerWrapper: x[b, n, dim_in] -> output[b, n, dim_out] */
static int lower_continuous(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    IrDim n;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "n", xtf_int(call, "max_seq_len"), &n) < 0)
        return -1;
    IrDim xs[3] = {L->B, n, C(continuous_dim_in(call))}, bn[2] = {L->B, n};
    IrNode *x = ir_input(g, "x", IR_F32, 3, xs);
    if (L->opt->mask)
        L->mask = ir_input(g, "mask", IR_BOOL, 2, bn);
    IrNode *emb = NULL, *out = continuous_forward(L, call, x, &emb);
    if (!out)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "output", lx_lab(L, out, "output"));
    if (L->opt->embeddings)
        ir_output(g, "embeddings", emb);
    return 0;
}

/* ViTransformerWrapper body (section 10) on image[b, 3, H, W]: returns the logits [b, classes]
 * (NULL without num_classes) and, in *emb, the final-normed embeddings [b, patches + 1, dim]. */
static IrNode *vit_forward(Lx *L, const XtfValue *call, IrNode *image, IrNode **emb)
{
    IrGraph *g = L->g;
    Stack S;
    *emb = NULL;
    if (lx_wrapper_stack(L, call, &S) < 0)
        return NULL;
    int img = (int)xtf_int(call, "image_size"), ps = (int)xtf_int(call, "patch_size");
    if (img % ps) {
        lx_stack_error(L, call, "image_size %d is not divisible by patch_size %d", img, ps);
        return NULL;
    }
    if ((int64_t)(img / ps) * (img / ps) > XTF_MAX_SIZE || 3 * (int64_t)ps * ps > XTF_MAX_SIZE) {
        lx_stack_error(L, call, "too many or too large patches: (image_size / patch_size)^2 and "
                             "3 * patch_size^2 must be at most %d", XTF_MAX_SIZE);
        return NULL;
    }
    int hp = img / ps, np = hp * hp, pdim = 3 * ps * ps, dim = S.dim;
    /* 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' */
    IrDim s6[6] = {L->B, C(3), C(hp), C(ps), C(hp), C(ps)};
    static const int perm[6] = {0, 2, 4, 3, 5, 1};
    IrDim s3[3] = {L->B, C(np), C(pdim)};
    IrNode *x = ir_reshape(g, ir_permute(g, ir_reshape(g, image, 6, s6), perm), 3, s3);
    x = lx_lab(L, lx_linear(L, x, "patch_to_embedding", pdim, dim, 1), "patches");
    IrDim cs[3] = {C(1), C(1), C(dim)}, cb[3] = {L->B, C(1), C(dim)}, pe[3] = {C(1), C(np + 1), C(dim)};
    IrNode *cls_tok = lx_init(L, lx_paramv(L, 0, 3, cs, "cls_token"), IR_INIT_NORMAL, 1.0); /* torch.randn */
    x = ir_concat(g, ir_expand(g, cls_tok, 3, cb), x, 1);
    x = add(L, x, lx_init(L, lx_paramv(L, 0, 3, pe, "pos_embedding"), IR_INIT_NORMAL, 1.0));
    x = lx_dropout(L, x, xtf_float(call, "emb_dropout")); /* `dropout` is the mlp_head's */
    x = lx_attention_layers(L, &S, x);
    x = *emb = lx_lab(L, lx_layer_norm(L, x, "norm", dim), "final_norm");
    const XtfValue *nc = xtf_arg(call, "num_classes");
    if (!nc || nc->kind != XV_INT)
        return NULL;
    /* mlp_head = FeedForward(dim, dim_out = classes) on the cls token */
    IrDim e2[2] = {L->B, C(dim)};
    IrNode *cls = ir_reshape(g, ir_slice(g, x, 1, C(0), C(1)), 2, e2);
    IrNode *h = un(L, IR_GELU, lx_linear(L, cls, "mlp_head.net.0.0", dim, 4 * dim, 1));
    h = lx_dropout(L, h, xtf_float(call, "dropout"));
    return lx_linear(L, h, "mlp_head.net.3", 4 * dim, (int)nc->i, 1);
}

static IrNode *vit_image_input(Lx *L, const XtfValue *call)
{
    int img = (int)xtf_int(call, "image_size");
    IrDim is[4] = {L->B, C(3), C(img), C(img)};
    return ir_input(L->g, "image", IR_F32, 4, is);
}

/* ViTransformerWrapper: image[b, 3, H, W] -> logits[b, classes] (and/or embeddings) */
static int lower_vit(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    if (add_sym(L, "b", 0, &L->B) < 0)
        return -1;
    IrNode *emb = NULL, *logits = vit_forward(L, call, vit_image_input(L, call), &emb);
    if (!emb)
        return ir_graph_error(g) ? 0 : -1;
    if (logits)
        ir_output(g, "logits", lx_lab(L, logits, "logits"));
    if (L->opt->embeddings || !logits)
        ir_output(g, "embeddings", emb);
    return 0;
}

/* EncoderDecoder(encoder, decoder): the encoder's final-normed embeddings are the context of a
 * cross-attending decoder (an image captioner: ViT -> Decoder(cross_attend = true)). Inputs:
 * the encoder's (image; or src, src_mask for token and continuous encoders) and the decoder's
 * (tokens, mask, targets). Parameters: encoder.* and decoder.*. */
static int lower_encoder_decoder(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    const XtfValue *enc = xtf_callv(call, "encoder"), *dec = xtf_callv(call, "decoder");
    const XtfValue *dec_layers = xtf_callv(dec, "attn_layers");
    if (!enc || !dec || !dec_layers)
        return lx_stack_error(L, call, "EncoderDecoder needs an encoder and a decoder model");
    if (!xtf_bool(dec_layers, "cross_attend") && strcmp(dec_layers->s, "CrossAttender") != 0)
        return lx_stack_error(L, dec_layers, "the decoder of EncoderDecoder must cross-attend "
                                          "(cross_attend = true, or CrossAttender)");
    int enc_dim = (int)xtf_int(xtf_callv(enc, "attn_layers"), "dim");
    int dec_dim = (int)xtf_int(dec_layers, "dim");
    if (enc_dim != dec_dim)
        return lx_stack_error(L, call, "the encoder's dim (%d) must equal the decoder's (%d): "
                                    "cross-attention keys and values are read from dim-wide context",
                           enc_dim, dec_dim);
    if (add_sym(L, "b", 0, &L->B) < 0)
        return -1;
    IrNode *emb = NULL, *src_mask = NULL;
    L->root = "encoder.";
    L->vroot = "enc.";
    if (strcmp(enc->s, "ViTransformerWrapper") == 0) {
        vit_forward(L, enc, vit_image_input(L, enc), &emb);
    } else {
        IrDim s;
        if (add_sym(L, "s", xtf_int(enc, "max_seq_len"), &s) < 0)
            return -1;
        IrDim bs[2] = {L->B, s};
        if (L->opt->src_mask)
            src_mask = L->mask = ir_input(g, "src_mask", IR_BOOL, 2, bs);
        if (strcmp(enc->s, "ContinuousTransformerWrapper") == 0) {
            IrDim xs[3] = {L->B, s, C(continuous_dim_in(enc))};
            continuous_forward(L, enc, ir_input(g, "src", IR_F32, 3, xs), &emb);
        } else {
            transformer_wrapper(L, enc, ir_input(g, "src", IR_I64, 2, bs), &emb);
        }
    }
    if (!emb)
        return ir_graph_error(g) ? 0 : -1;
    if (L->opt->embeddings)
        ir_output(g, "embeddings", emb);
    IrDim n;
    if (add_sym(L, "n", xtf_int(dec, "max_seq_len"), &n) < 0)
        return -1;
    IrDim bn[2] = {L->B, n};
    L->root = "decoder.";
    L->vroot = "dec.";
    L->context = emb;
    L->context_mask = src_mask;
    IrNode *tokens = ir_input(g, "tokens", IR_I64, 2, bn);
    L->mask = L->opt->mask ? ir_input(g, "mask", IR_BOOL, 2, bn) : NULL;
    IrNode *targets = L->opt->train ? ir_input(g, "targets", IR_I64, 2, bn) : NULL;
    IrNode *hidden, *logits = transformer_wrapper(L, dec, tokens, &hidden);
    L->root = L->vroot = "";
    if (!logits)
        return ir_graph_error(g) ? 0 : -1;
    ir_output(g, "logits", ir_label(g, logits, "logits"));
    if (targets)
        ir_output(g, "loss", ir_label(g, ir_xent(g, logits, targets), "loss"));
    return 0;
}

/* XTransformer routes enc_* and dec_* options (section 10): builds the two calls it stands
 * for, TransformerWrapper(attn_layers = Encoder(...)) and TransformerWrapper(attn_layers =
 * Decoder(cross_attend = true, ...)), with the shared dim, so the rest of the lowering reads
 * them like any other model. The synthetic values live in *store (freed by the caller). */
typedef struct {
    XtfValue wrapper, layers, dim, cross;
    XtfArg wargs[64], largs[128];
} Routed;

static void route(const XtfValue *x, const char *prefix, const char *layers_name, int cross, Routed *r)
{
    memset(r, 0, sizeof *r);
    const XtfCtor *tw = xtf_ctor_find("TransformerWrapper");
    r->wrapper.kind = r->layers.kind = XV_CALL;
    r->wrapper.loc = r->layers.loc = x->loc;
    r->wrapper.s = "TransformerWrapper";
    r->layers.s = layers_name;
    r->wrapper.args = r->wargs;
    r->layers.args = r->largs;
    size_t plen = strlen(prefix);
    for (int i = 0; i < x->nargs; i++) {
        const char *k = x->args[i].key;
        if (!k || strncmp(k, prefix, plen) != 0)
            continue;
        XtfArg a = x->args[i];
        a.key = k + plen;
        if (xtf_option_find(tw, a.key) && r->wrapper.nargs < 63)
            r->wargs[r->wrapper.nargs++] = a;
        else if (r->layers.nargs < 126)
            r->largs[r->layers.nargs++] = a;
    }
    r->dim.kind = XV_INT;
    r->dim.i = xtf_int(x, "dim");
    r->dim.loc = x->loc;
    r->largs[r->layers.nargs++] = (XtfArg){"dim", x->loc, &r->dim};
    if (cross) {
        r->cross.kind = XV_BOOL;
        r->cross.b = 1;
        r->largs[r->layers.nargs++] = (XtfArg){"cross_attend", x->loc, &r->cross};
    }
    r->wargs[r->wrapper.nargs++] = (XtfArg){"attn_layers", x->loc, &r->layers};
}

/* XTransformer (section 10): encoder(src) feeds the cross-attending decoder(tgt[:, :-1]). */
static int lower_xtransformer(Lx *L, const XtfValue *call)
{
    IrGraph *g = L->g;
    Routed *re = malloc(sizeof *re), *rd = malloc(sizeof *rd);
    int rc = -1;
    if (!re || !rd)
        goto done;
    route(call, "enc_", "Encoder", 0, re);
    route(call, "dec_", "Decoder", 1, rd);
    const XtfValue *enc = &re->wrapper, *dec = &rd->wrapper;
    IrDim s, t;
    if (add_sym(L, "b", 0, &L->B) < 0 || add_sym(L, "s", xtf_int(enc, "max_seq_len"), &s) < 0 ||
        add_sym(L, "t", xtf_int(dec, "max_seq_len") + 1, &t) < 0)
        goto done;
    IrDim bs[2] = {L->B, s}, bt[2] = {L->B, t}, bt1[2] = {L->B, ir_dim_addc(t, -1)};
    IrNode *src = ir_input(g, "src", IR_I64, 2, bs), *tgt = ir_input(g, "tgt", IR_I64, 2, bt);
    IrNode *src_mask = L->opt->src_mask ? ir_input(g, "src_mask", IR_BOOL, 2, bs) : NULL;
    IrNode *tgt_mask = L->opt->tgt_mask ? ir_input(g, "tgt_mask", IR_BOOL, 2, bt) : NULL;
    IrNode *targets = L->opt->train ? ir_input(g, "targets", IR_I64, 2, bt1) : NULL;

    IrNode *hidden;
    L->root = "encoder.";
    L->vroot = "enc.";
    L->mask = src_mask;
    IrNode *enc_logits = transformer_wrapper(L, enc, src, &hidden);
    if (!enc_logits) {
        rc = ir_graph_error(g) ? 0 : -1;
        goto done;
    }
    /* the encoder's to_logits is in the state_dict but never used: it stays a parameter (so
     * the weights load strictly) whose gradient is zero, as in x-transformers */
    L->root = "decoder.net.";
    L->vroot = "dec.";
    L->context = hidden;
    L->context_mask = src_mask;
    IrDim t1 = ir_dim_addc(t, -1);
    L->mask = tgt_mask ? ir_slice(g, tgt_mask, 1, C(0), t1) : NULL;
    if (xtf_bool(call, "tie_token_emb"))
        L->tied_emb = ir_find_leaf(g, IR_PARAM, "encoder.token_emb.weight");
    IrNode *logits = transformer_wrapper(L, dec, ir_slice(g, tgt, 1, C(0), t1), &hidden);
    L->tied_emb = NULL;
    L->root = "";
    L->vroot = "";
    if (!logits) {
        rc = ir_graph_error(g) ? 0 : -1;
        goto done;
    }
    ir_output(g, "logits", ir_label(g, logits, "logits"));
    if (targets)
        ir_output(g, "loss", ir_label(g, ir_xent(g, logits, targets), "loss"));
    rc = 0;
done:
    free(re);
    free(rd);
    return rc;
}

IrGraph *xt_lower(const XtfFile *f, const char *model, const XtLowerOpts *opts, XtfDiag *d)
{
    const XtfStmt *st = NULL;
    XtfLoc top = {1, 1, 1};
    if (model) {
        st = xtf_find(f, model);
        if (!st) {
            xtf_diag_error(d, f, top, "no model named '%s' in this file", model);
            return NULL;
        }
    } else if (f->nstmts > 0) {
        st = &f->stmts[f->nstmts - 1];
    } else {
        xtf_diag_error(d, f, top, "the file defines no model");
        return NULL;
    }
    const XtfValue *call = st->value;
    while (call && call->kind == XV_REF)
        call = call->ref;
    if (!call || call->kind != XV_CALL) {
        xtf_diag_error(d, f, st->loc, "'%s' is not a model", st->name);
        return NULL;
    }
    IrGraph *g = ir_graph_new(st->name);
    if (!g)
        return NULL;
    static const XtLowerOpts none = {0};
    static Lx zero;
    Lx *Lp = malloc(sizeof *Lp);
    if (!Lp) {
        ir_graph_free(g);
        return NULL;
    }
    *Lp = zero;
    Lp->g = g;
    Lp->f = f;
    Lp->d = d;
    Lp->opt = opts ? opts : &none;
    Lp->V = &xt_versions[f->version >= 0 && f->version < XT_V_NUM ? f->version : 0];
    Lp->root = Lp->vroot = "";
    int rc;
    if (strcmp(call->s, "TransformerWrapper") == 0)
        rc = lower_transformer_wrapper(Lp, call);
    else if (strcmp(call->s, "ContinuousTransformerWrapper") == 0)
        rc = lower_continuous(Lp, call);
    else if (strcmp(call->s, "ViTransformerWrapper") == 0)
        rc = lower_vit(Lp, call);
    else if (strcmp(call->s, "XTransformer") == 0)
        rc = lower_xtransformer(Lp, call);
    else if (strcmp(call->s, "EncoderDecoder") == 0)
        rc = lower_encoder_decoder(Lp, call);
    else
        rc = lx_stack_error(Lp, call, "%s is not a model wrapper (TransformerWrapper, XTransformer, "
                                   "ViTransformerWrapper, ContinuousTransformerWrapper or EncoderDecoder)", call->s);
    if (rc == 0 && ir_graph_error(g)) {
        xtf_diag_error(d, f, call->loc, "internal error while lowering '%s': %s", st->name, ir_graph_error(g));
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < g->nnodes; i++) { /* every leaf with values of its own starts by a rule */
        const IrNode *n = g->nodes[i];
        if ((n->op == IR_PARAM || n->op == IR_BUFFER) && !ir_find_init(g, n)) {
            xtf_diag_error(d, f, call->loc, "internal error while lowering '%s': '%s' has no initialisation rule",
                           st->name, n->s);
            rc = -1;
        }
    }
    free(Lp);
    if (rc != 0) {
        ir_graph_free(g);
        return NULL;
    }
    return g;
}
