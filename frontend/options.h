/* options.h: the one table of .xtf constructors and their options (frontend/options.c).
 *
 * Each constructor lists its options in groups (arrays ending with a row whose name is NULL);
 * groups are shared where x-transformers shares keyword arguments: Decoder, Encoder and
 * CrossAttender take the same AttentionLayers options, with every Attention option spelled
 * attn_<name> and every FeedForward option ff_<name>, as in Python. XTransformer also routes
 * enc_<key> and dec_<key> to its encoder and decoder.
 *
 * Each option has a type, a default (none = required; a None default makes None valid), a range
 * and a status. XTF_NOT_YET options are refused by name ("'attn_talking_heads' is not supported
 * yet"); when a feature lands, flip its row to XTF_SUPPORTED, and nothing else. */
#ifndef XTC_OPTIONS_H
#define XTC_OPTIONS_H

#include <stddef.h>

#include "versions.h"
#include "xtf.h"

typedef enum {
    XTF_SUPPORTED, /* implemented by the lowering */
    XTF_NOT_YET,   /* exists in x-transformers 0.23.0, refused by name until implemented */
    XTF_FORBIDDEN  /* cannot be written here at all; the row's 'why' says what to do instead */
} XtfStatus;

typedef enum {
    XTF_T_INT,       /* an integer */
    XTF_T_NUMBER,    /* a float; an integer is accepted */
    XTF_T_BOOL,      /* true/false/True/False */
    XTF_T_STRING,    /* a string */
    XTF_T_INT_TUPLE, /* an integer or a tuple of integers (shift_tokens) */
    XTF_T_BLOCKS,    /* a tuple of layer kinds 'a', 'c', 'f' (custom_layers) */
    XTF_T_LAYERS     /* a constructor call of one of the classes in 'accepts' */
} XtfType;

typedef enum {
    XTF_R_ANY,
    XTF_R_GE,   /* >= bound */
    XTF_R_GT,   /* > bound */
    XTF_R_PROB, /* a dropout probability: [0, 1) */
    XTF_R_UNIT  /* (0, 1] */
} XtfRange;

typedef enum {
    XTF_C_TRANSFORMER_WRAPPER,
    XTF_C_DECODER,
    XTF_C_ENCODER,
    XTF_C_CROSS_ATTENDER,
    XTF_C_XTRANSFORMER,
    XTF_C_VIT,
    XTF_C_CONTINUOUS,
    XTF_C_ENCODER_DECODER,        /* xtc's composition: encoder embeddings feed a decoder */
    XTF_C_ATTENTION_LAYERS,       /* only to say: write Decoder or Encoder */
    XTF_C_AUTOREGRESSIVE_WRAPPER, /* only to say: not needed in .xtf */
    XTF_C_NUM
} XtfCtorId;

#define XTF_C_BIT(id) (1u << (id))

/* Every integer option is at most this in magnitude (checked by xtf_check), and so is every size
 * the lowering derives from two of them (heads * attn_dim_head, dim * ff_mult, an image's
 * patches), so that its int arithmetic cannot overflow and no value is silently truncated.
 * 2^24 is far beyond any real model's width, vocabulary or sequence length. */
#define XTF_MAX_SIZE (1 << 24)

typedef struct {
    const char *name;
    XtfType type;
    const XtfValue *def; /* NULL: required */
    XtfRange range;
    double bound;        /* for XTF_R_GE and XTF_R_GT */
    XtfStatus status;
    unsigned accepts;    /* XTF_T_LAYERS: XTF_C_BIT()s of the classes allowed */
    const char *why;     /* XTF_FORBIDDEN: what to do instead */
    unsigned vers;       /* XT_V_BIT()s of the x-transformers versions (versions.h) in which xtc
                            accepts it; 0 = 0.23.0 only */
} XtfOption;

/* The versions in which xtc accepts option o (its vers, 0 read as 0.23.0 only). */
unsigned xtf_option_versions(const XtfOption *o);

typedef struct {
    const char *prefix;                /* "enc_": the key minus this prefix is looked up in */
    const XtfOption *const *groups;    /* these groups (NULL-terminated) */
} XtfRoute;

typedef struct {
    const char *name;
    XtfCtorId id;
    XtfStatus status;
    const char *why;                   /* XTF_FORBIDDEN: what to write instead */
    const XtfOption *const *groups;    /* NULL-terminated list of option groups */
    XtfRoute routes[2];                /* prefix-routed options (XTransformer) */
} XtfCtor;

extern const XtfCtor xtf_ctors[XTF_C_NUM];

/* The constructor called name, or NULL. */
const XtfCtor *xtf_ctor_find(const char *name);
/* The option a key names for constructor c, routed keys (enc_depth) included; NULL if none. */
const XtfOption *xtf_option_find(const XtfCtor *c, const char *key);

/* Visits every key constructor c accepts (routed keys spelled with their prefix) until visit
 * returns non-zero; returns that value. The key is in a scratch buffer valid during the call. */
int xtf_option_each(const XtfCtor *c, int (*visit)(void *arg, const char *key, const XtfOption *o),
                    void *arg);

/* What an option expects, for messages: "an integer", "Decoder or Encoder", "a number or None". */
const char *xtf_option_type_name(const XtfOption *o, char *buf, size_t cap);

#endif
