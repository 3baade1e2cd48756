/* options.c: the table of .xtf constructors and options, the keyword arguments of
 * x-transformers 0.23.0 (see ../shared/XT-SEMANTICS.md, section 2) with types, defaults, ranges
 * and what xtc supports today. It is the only place that knows option names: the checker
 * (check.c) and the accessors (access.c) read it, and the lowering asks the accessors.
 *
 * Rows say in which x-transformers versions (versions.h) xtc accepts them (.vers; none: 0.23.0
 * only): the options of 1.29.2 and 2.26.4 xtc implements, under their names there.
 *
 * Every option and constructor of 0.23.0 is SUPPORTED or FORBIDDEN (with the reason) today
 * (test_frontend checks it); NOT_YET, refused by name, is for what a later version adds before
 * xtc implements it: ship it by flipping its row to SUPPORTED. */
#include <stdio.h>
#include <string.h>

#include "options.h"

/* Defaults. REQUIRED options have none; a None default makes None a valid value. */
#define REQUIRED NULL
#define INT_(v) (&(const XtfValue){.kind = XV_INT, .i = (v)})
#define NUM_(v) (&(const XtfValue){.kind = XV_FLOAT, .f = (v)})
#define BOOL_(v) (&(const XtfValue){.kind = XV_BOOL, .b = (v)})
#define NONE_ (&(const XtfValue){.kind = XV_NONE})

/* Ranges (each sets .range and .bound, so the status follows positionally) */
#define ANY .range = XTF_R_ANY, .bound = 0
#define GE(x) .range = XTF_R_GE, .bound = (x)
#define GT(x) .range = XTF_R_GT, .bound = (x)
#define PROB .range = XTF_R_PROB, .bound = 0
#define UNIT .range = XTF_R_UNIT, .bound = 0

#define SUPPORTED XTF_SUPPORTED
#define NOT_YET XTF_NOT_YET
#define FORBIDDEN XTF_FORBIDDEN

#define INT XTF_T_INT
#define NUM XTF_T_NUMBER
#define BOOL XTF_T_BOOL
#define INTS XTF_T_INT_TUPLE
#define BLOCKS XTF_T_BLOCKS
#define LAYERS XTF_T_LAYERS

/* Versions (versions.h) in which xtc accepts an option; rows without .vers are 0.23.0's */
#define ALLV XT_V_ALL
#define NEWER XT_V_NEWER
#define V2 XT_V_BIT(XT_V2_26)

#define DEC_OR_ENC (XTF_C_BIT(XTF_C_DECODER) | XTF_C_BIT(XTF_C_ENCODER))
#define END {.name = NULL}

/* ---- TransformerWrapper(num_tokens, max_seq_len, attn_layers, ...) ---- */
static const XtfOption WRAPPER[] = {
    /* name                  type    default      range     status */
    {"num_tokens",           INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"max_seq_len",          INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"attn_layers",          LAYERS, REQUIRED,    ANY,      SUPPORTED,
     .accepts = DEC_OR_ENC | XTF_C_BIT(XTF_C_CROSS_ATTENDER), .vers = ALLV},
    {"emb_dim",              INT,    NONE_,       GE(1),    SUPPORTED},
    {"max_mem_len",          INT,    INT_(0),     GE(0),    SUPPORTED, .vers = ALLV},
    {"shift_mem_down",       INT,    INT_(0),     GE(0),    SUPPORTED, .vers = ALLV},
    {"emb_dropout",          NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    {"num_memory_tokens",    INT,    NONE_,       GE(0),    SUPPORTED, .vers = ALLV},
    {"tie_embedding",        BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"use_pos_emb",          BOOL,   BOOL_(1),    ANY,      SUPPORTED},
    {"use_abs_pos_emb",      BOOL,   BOOL_(1),    ANY,      SUPPORTED, .vers = NEWER}, /* renamed */
    END};

/* ---- AttentionLayers (through Decoder, Encoder, CrossAttender) ---- */
static const XtfOption LAYERS_DIM[] = {
    {"dim",                  INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    END};

static const XtfOption LAYERS_COMMON[] = {
    /* name                  type    default      range     status */
    {"depth",                INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"heads",                INT,    INT_(8),     GE(1),    SUPPORTED, .vers = ALLV},
    {"use_scalenorm",        BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"use_rmsnorm",          BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"use_rezero",           BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"alibi_pos_bias",       BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"alibi_num_heads",      INT,    NONE_,       GE(1),    SUPPORTED},
    {"alibi_learned",        BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"rel_pos_bias",         BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"rel_pos_num_buckets",  INT,    INT_(32),    GE(2),    SUPPORTED},
    {"rel_pos_max_distance", INT,    INT_(128),   GE(1),    SUPPORTED},
    {"position_infused_attn",BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"rotary_pos_emb",       BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"rotary_emb_dim",       INT,    NONE_,       GE(1),    SUPPORTED, .vers = ALLV},
    {"rotary_xpos",          BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"rotary_xpos_scale_base", NUM,  INT_(512),   GT(0),    SUPPORTED, .vers = NEWER},
    {"custom_layers",        BLOCKS, NONE_,       ANY,      SUPPORTED},
    {"sandwich_coef",        INT,    NONE_,       GE(1),    SUPPORTED},
    {"par_ratio",            INT,    NONE_,       GE(1),    SUPPORTED},
    {"residual_attn",        BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"cross_residual_attn",  BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"macaron",              BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"pre_norm",             BOOL,   BOOL_(1),    ANY,      SUPPORTED},
    {"gate_residual",        BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"scale_residual",       BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"shift_tokens",         INTS,   INT_(0),     ANY,      SUPPORTED},
    {"sandwich_norm",        BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"use_qk_norm_attn",     BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"qk_norm_attn_seq_len", INT,    NONE_,       GE(2),    SUPPORTED},
    {"zero_init_branch_output", BOOL, BOOL_(0),   ANY,      SUPPORTED},
    {"use_simple_rmsnorm",   BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"norm_add_unit_offset", BOOL,   BOOL_(1),    ANY,      SUPPORTED, .vers = V2},

    /* Attention(dim, heads = heads, causal = causal, **attn_kwargs) */
    {"attn_dim_head",        INT,    INT_(64),    GE(1),    SUPPORTED, .vers = ALLV},
    {"attn_talking_heads",   BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_head_scale",      BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_collab_heads",    BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_collab_compression", NUM, NUM_(0.3),   UNIT,     SUPPORTED},
    {"attn_sparse_topk",     INT,    NONE_,       GE(1),    SUPPORTED},
    {"attn_use_entmax15",    BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_num_mem_kv",      INT,    INT_(0),     GE(0),    SUPPORTED},
    {"attn_dropout",         NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    {"attn_on_attn",         BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_gate_values",     BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"attn_zero_init_output",BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"attn_max_attend_past", INT,    NONE_,       GE(1),    SUPPORTED},
    {"attn_qk_norm",         BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"attn_qk_norm_scale",   NUM,    NUM_(10.0),  GT(0),    SUPPORTED, .vers = NEWER},
    {"attn_qk_norm_groups",  INT,    INT_(1),     GE(1),    SUPPORTED, .vers = NEWER},
    {"attn_qk_norm_dim_scale", BOOL, BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"attn_scale_init_value",NUM,    NONE_,       ANY,      SUPPORTED},
    {"attn_kv_heads",        INT,    NONE_,       GE(1),    SUPPORTED, .vers = NEWER},
    {"attn_one_kv_head",     BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"attn_heads",           INT,    INT_(8),     GE(1),    FORBIDDEN,
     .why = "the layers pass their own 'heads'; set 'heads' instead"},
    {"attn_causal",          BOOL,   BOOL_(0),    ANY,      FORBIDDEN,
     .why = "Decoder attention is causal and Encoder attention is not; choose the class instead"},

    /* FeedForward(dim, **ff_kwargs) */
    {"ff_mult",              NUM,    INT_(4),     GT(0),    SUPPORTED, .vers = ALLV},
    {"ff_glu",               BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"ff_relu_squared",      BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = ALLV},
    {"ff_post_act_ln",       BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"ff_dropout",           NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    {"ff_zero_init_output",  BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"ff_swish",             BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"ff_no_bias",           BOOL,   BOOL_(0),    ANY,      SUPPORTED, .vers = NEWER},
    {"ff_dim_out",           INT,    NONE_,       GE(1),    FORBIDDEN,
     .why = "the feed-forward output is added to the residual stream, so its width is 'dim'"},
    END};

/* Decoder and Encoder: the class decides causality; cross-attention is optional. */
static const XtfOption LAYERS_SELF[] = {
    {"cross_attend",         BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"only_cross",           BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"causal",               BOOL,   BOOL_(0),    ANY,      FORBIDDEN,
     .why = "Decoder is causal and Encoder is not; choose the class instead"},
    END};

/* CrossAttender: cross-attention only, causality optional. */
static const XtfOption LAYERS_CROSS[] = {
    {"causal",               BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    {"cross_attend",         BOOL,   BOOL_(1),    ANY,      FORBIDDEN,
     .why = "CrossAttender always cross-attends"},
    {"only_cross",           BOOL,   BOOL_(1),    ANY,      FORBIDDEN,
     .why = "CrossAttender always cross-attends only"},
    END};

/* ---- ViTransformerWrapper(image_size, patch_size, attn_layers, ...) ---- */
static const XtfOption VIT[] = {
    {"image_size",           INT,    REQUIRED,    GE(1),    SUPPORTED},
    {"patch_size",           INT,    REQUIRED,    GE(1),    SUPPORTED},
    {"attn_layers",          LAYERS, REQUIRED,    ANY,      SUPPORTED,
     .accepts = XTF_C_BIT(XTF_C_ENCODER)},
    {"num_classes",          INT,    NONE_,       GE(1),    SUPPORTED},
    {"dropout",              NUM,    NUM_(0.0),   PROB,     SUPPORTED},
    {"emb_dropout",          NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    END};

/* ---- ContinuousTransformerWrapper(max_seq_len, attn_layers, ...) ---- */
static const XtfOption CONTINUOUS[] = {
    {"max_seq_len",          INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"attn_layers",          LAYERS, REQUIRED,    ANY,      SUPPORTED, .accepts = DEC_OR_ENC},
    {"dim_in",               INT,    NONE_,       GE(1),    SUPPORTED},
    {"dim_out",              INT,    NONE_,       GE(1),    SUPPORTED},
    {"emb_dim",              INT,    NONE_,       GE(1),    SUPPORTED}, /* accepted, unused */
    {"emb_dropout",          NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    {"use_pos_emb",          BOOL,   BOOL_(1),    ANY,      SUPPORTED},
    END};

/* ---- XTransformer(dim, tie_token_emb, enc_*, dec_*) ---- */
static const XtfOption XFORMER[] = {
    {"dim",                  INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"tie_token_emb",        BOOL,   BOOL_(0),    ANY,      SUPPORTED},
    END};

/* enc_* keys XTransformer hands to the encoder's TransformerWrapper; the rest go to Encoder. */
static const XtfOption XFORMER_ENC_WRAPPER[] = {
    {"num_tokens",           INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"max_seq_len",          INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"emb_dropout",          NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    {"num_memory_tokens",    INT,    NONE_,       GE(0),    SUPPORTED},
    END};

static const XtfOption XFORMER_DEC_WRAPPER[] = {
    {"num_tokens",           INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"max_seq_len",          INT,    REQUIRED,    GE(1),    SUPPORTED, .vers = ALLV},
    {"emb_dropout",          NUM,    NUM_(0.0),   PROB,     SUPPORTED, .vers = ALLV},
    END};

static const XtfOption XFORMER_FIXED[] = {
    {"dim",                  INT,    REQUIRED,    GE(1),    FORBIDDEN,
     .why = "the 'dim' of XTransformer is shared by the encoder and the decoder"},
    {"causal",               BOOL,   BOOL_(0),    ANY,      FORBIDDEN,
     .why = "the encoder is never causal and the decoder always is"},
    {"cross_attend",         BOOL,   BOOL_(0),    ANY,      FORBIDDEN,
     .why = "XTransformer sets it: the decoder cross-attends to the encoder"},
    {"only_cross",           BOOL,   BOOL_(0),    ANY,      FORBIDDEN,
     .why = "XTransformer sets it: the decoder cross-attends to the encoder"},
    END};

/* ---- EncoderDecoder(encoder, decoder): composition, xtc's own constructor ----
 * The Python pattern decoder(tokens, context = encoder(x, return_embeddings = True)) as one
 * model: the encoder's final-normed embeddings are the decoder's cross-attention context.
 * Parameters are named encoder.* and decoder.*, as attributes of a composing nn.Module. */
static const XtfOption ENCDEC[] = {
    {"encoder",              LAYERS, REQUIRED,    ANY,      SUPPORTED,
     .accepts = XTF_C_BIT(XTF_C_VIT) | XTF_C_BIT(XTF_C_TRANSFORMER_WRAPPER) |
                XTF_C_BIT(XTF_C_CONTINUOUS)},
    {"decoder",              LAYERS, REQUIRED,    ANY,      SUPPORTED,
     .accepts = XTF_C_BIT(XTF_C_TRANSFORMER_WRAPPER)},
    END};

/* ---- constructors ---- */
static const XtfOption *const G_WRAPPER[] = {WRAPPER, NULL};
static const XtfOption *const G_SELF_LAYERS[] = {LAYERS_DIM, LAYERS_COMMON, LAYERS_SELF, NULL};
static const XtfOption *const G_CROSS_LAYERS[] = {LAYERS_DIM, LAYERS_COMMON, LAYERS_CROSS, NULL};
static const XtfOption *const G_VIT[] = {VIT, NULL};
static const XtfOption *const G_CONTINUOUS[] = {CONTINUOUS, NULL};
static const XtfOption *const G_XFORMER[] = {XFORMER, NULL};
static const XtfOption *const G_XFORMER_ENC[] = {XFORMER_ENC_WRAPPER, XFORMER_FIXED, LAYERS_COMMON,
                                                 NULL};
static const XtfOption *const G_XFORMER_DEC[] = {XFORMER_DEC_WRAPPER, XFORMER_FIXED, LAYERS_COMMON,
                                                 NULL};
static const XtfOption *const G_ENCDEC[] = {ENCDEC, NULL};
static const XtfOption *const G_NONE[] = {NULL};

const XtfCtor xtf_ctors[XTF_C_NUM] = {
    [XTF_C_TRANSFORMER_WRAPPER] = {"TransformerWrapper", XTF_C_TRANSFORMER_WRAPPER, SUPPORTED,
                                   NULL, G_WRAPPER, {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_DECODER] = {"Decoder", XTF_C_DECODER, SUPPORTED, NULL, G_SELF_LAYERS,
                       {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_ENCODER] = {"Encoder", XTF_C_ENCODER, SUPPORTED, NULL, G_SELF_LAYERS,
                       {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_CROSS_ATTENDER] = {"CrossAttender", XTF_C_CROSS_ATTENDER, SUPPORTED, NULL,
                              G_CROSS_LAYERS, {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_XTRANSFORMER] = {"XTransformer", XTF_C_XTRANSFORMER, SUPPORTED, NULL, G_XFORMER,
                            {{"enc_", G_XFORMER_ENC}, {"dec_", G_XFORMER_DEC}}},
    [XTF_C_VIT] = {"ViTransformerWrapper", XTF_C_VIT, SUPPORTED, NULL, G_VIT,
                   {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_CONTINUOUS] = {"ContinuousTransformerWrapper", XTF_C_CONTINUOUS, SUPPORTED, NULL,
                          G_CONTINUOUS, {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_ENCODER_DECODER] = {"EncoderDecoder", XTF_C_ENCODER_DECODER, SUPPORTED, NULL,
                               G_ENCDEC, {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_ATTENTION_LAYERS] = {"AttentionLayers", XTF_C_ATTENTION_LAYERS, FORBIDDEN,
                                "write Decoder (causal) or Encoder (bidirectional) instead",
                                G_NONE, {{NULL, NULL}, {NULL, NULL}}},
    [XTF_C_AUTOREGRESSIVE_WRAPPER] = {"AutoregressiveWrapper", XTF_C_AUTOREGRESSIVE_WRAPPER,
                                      FORBIDDEN,
                                      "write the TransformerWrapper itself; training and sampling "
                                      "are chosen on the command line (xtc compile --train, "
                                      "xtc generate)",
                                      G_NONE, {{NULL, NULL}, {NULL, NULL}}},
};

const XtfCtor *xtf_ctor_find(const char *name)
{
    if (!name)
        return NULL;
    for (int i = 0; i < XTF_C_NUM; i++)
        if (strcmp(xtf_ctors[i].name, name) == 0)
            return &xtf_ctors[i];
    return NULL;
}

static const XtfOption *find_in(const XtfOption *const *groups, const char *key)
{
    for (int g = 0; groups && groups[g]; g++)
        for (const XtfOption *o = groups[g]; o->name; o++)
            if (strcmp(o->name, key) == 0)
                return o;
    return NULL;
}

const XtfOption *xtf_option_find(const XtfCtor *c, const char *key)
{
    if (!c || !key)
        return NULL;
    const XtfOption *o = find_in(c->groups, key);
    if (o)
        return o;
    for (int r = 0; r < 2; r++) {
        const char *p = c->routes[r].prefix;
        if (p && strncmp(key, p, strlen(p)) == 0 &&
            (o = find_in(c->routes[r].groups, key + strlen(p))))
            return o;
    }
    return NULL;
}

int xtf_option_each(const XtfCtor *c, int (*visit)(void *arg, const char *key, const XtfOption *o),
                    void *arg)
{
    char key[128];
    int rc;
    for (int g = 0; c->groups && c->groups[g]; g++)
        for (const XtfOption *o = c->groups[g]; o->name; o++)
            if ((rc = visit(arg, o->name, o)) != 0)
                return rc;
    for (int r = 0; r < 2; r++) {
        const XtfRoute *route = &c->routes[r];
        for (int g = 0; route->prefix && route->groups[g]; g++)
            for (const XtfOption *o = route->groups[g]; o->name; o++) {
                snprintf(key, sizeof key, "%s%s", route->prefix, o->name);
                if ((rc = visit(arg, key, o)) != 0)
                    return rc;
            }
    }
    return 0;
}

unsigned xtf_option_versions(const XtfOption *o)
{
    return o->vers ? o->vers : XT_V_BIT(XT_V0_23);
}

const char *xtf_option_type_name(const XtfOption *o, char *buf, size_t cap)
{
    const char *t = "a value";
    switch (o->type) {
    case XTF_T_INT: t = "an integer"; break;
    case XTF_T_NUMBER: t = "a number"; break;
    case XTF_T_BOOL: t = "a boolean"; break;
    case XTF_T_STRING: t = "a string"; break;
    case XTF_T_INT_TUPLE: t = "an integer or a tuple of integers"; break;
    case XTF_T_BLOCKS: t = "a tuple of layer kinds ('a', 'c', 'f')"; break;
    case XTF_T_LAYERS: {
        /* "Encoder", "Decoder or Encoder", "A, B or C" */
        size_t len = 0;
        int n = 0, total = 0;
        for (int i = 0; i < XTF_C_NUM; i++)
            total += (o->accepts & XTF_C_BIT(i)) != 0;
        buf[0] = '\0';
        for (int i = 0; i < XTF_C_NUM && len < cap; i++) {
            if (!(o->accepts & XTF_C_BIT(i)))
                continue;
            n++;
            int w = snprintf(buf + len, cap - len, "%s%s",
                             n == 1 ? "" : n == total ? " or " : ", ", xtf_ctors[i].name);
            len += w > 0 ? (size_t)w : 0;
        }
        return buf;
    }
    }
    int none = o->def && o->def->kind == XV_NONE;
    snprintf(buf, cap, "%s%s", t, none ? " or None" : "");
    return buf;
}
