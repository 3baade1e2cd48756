/* versions.h: the x-transformers versions a .xtf file can mirror, and what differs between them
 * (frontend/versions.c holds the one table). A file states its version with a top-level
 * statement before its models:
 *
 *     xtransformers = "2.26.4"
 *
 * and without one it mirrors 0.23.0, so every older file keeps its meaning. The lowering reads
 * every per-version difference (state_dict names, biases, norms, rotary, masks) from the row of
 * the file's version; the option table (options.c) says in which versions each option exists. */
#ifndef XTC_VERSIONS_H
#define XTC_VERSIONS_H

typedef enum { XT_V0_23, XT_V1_29, XT_V2_26, XT_V_NUM } XtVersionId;

#define XT_V_BIT(v) (1u << (v))
#define XT_V_ALL ((1u << XT_V_NUM) - 1)
#define XT_V_NEWER (XT_V_BIT(XT_V1_29) | XT_V_BIT(XT_V2_26))

/* What the statement name is ("xtransformers = ..."). */
#define XT_VERSION_KEY "xtransformers"

typedef struct {
    const char *name;          /* "2.26.4"; "2.26" and "2" name it too */
    const char *commit;        /* the x-transformers commit its parity cases come from */
    /* state_dict names */
    const char *token_emb;     /* "token_emb.weight" or "token_emb.emb.weight" */
    const char *ff_net;        /* FeedForward's Sequential: "net" or "ff" */
    int ff_out_index;          /* its output Linear: net.3 or ff.2 */
    const char *final_norm;    /* "norm" (the wrapper's) or "attn_layers.final_norm" */
    /* math */
    int final_norm_follows;    /* the final norm is the stack's norm class (else always LayerNorm) */
    int layer_norm_bias;       /* 1: weight + bias; 0: gamma (+ beta buffer if ln_beta_buffer) */
    int ln_beta_buffer;        /* bias-free LayerNorm keeps a zero 'beta' buffer (1.29.2 on torch < 2.1) */
    int norm_legacy_eps;       /* RMSNorm/ScaleNorm: x / clamp(|x| d^-1/2, eps); else normalize(x) sqrt(d) */
    int unit_offset_option;    /* norm_add_unit_offset exists (stored gains are gain - 1 when on) */
    int linear_biases;         /* to_out and to_logits have biases */
    int single_head_no_to_out; /* heads == 1: no to_out (2.x) */
    int rotary_on_v;           /* rotary rotates v as well as q and k */
    int rotary_interleaved;    /* rotary pairs (2i, 2i+1), else (i, i + r/2) */
    int rotary_min_dim;        /* rotary dim floored at this (0: none) */
    int mask_queries;          /* the padding mask masks query rows too (else keys only) */
    int zero_padded_rows;      /* attention outputs are zeroed at padded query positions */
    int qk_norm_fixed;         /* qk_norm: fixed qk_norm_scale, before rotary (else 0.23.0's
                                  learned temperature, after it) */
    int qk_dim_scale_kv;       /* qk_norm_dim_scale: k scales per key/value head and the logits
                                  scale dim_head^-1/2 (2.x); else per head and qk_norm_scale */
    int gate_values_bias;      /* attn_gate_values: to_v_gate has a bias */
    int xl_mem_pre_norm;       /* Transformer-XL memories pass through the layer's pre-norm before
                                  its attention, as its input does (else they enter un-normed) */
    int xl_takes_mask;         /* a padding mask together with Transformer-XL memories runs (else
                                  the library crashes on it) */
} XtVersion;

extern const XtVersion xt_versions[XT_V_NUM];

/* The version a version string names ("2.26.4", "2.26", "2"), or -1. */
int xt_version_find(const char *s);
/* "0.23.0, 1.29.2 and 2.26.4": the names of the versions in mask. */
const char *xt_version_list(unsigned mask, char *buf, int cap);

#endif
