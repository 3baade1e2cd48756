/* xtf.h: the .xtf language front end: parse tree, diagnostics, option checking, and the
 * lowering of x-transformers models to the tensor IR.
 *
 *   source --xtf_parse--> XtfFile (statements of nested constructor calls)
 *          --xtf_check--> the same tree, validated against the constructor/option table
 *          --xt_lower---> IrGraph
 *
 * Every parse-tree node keeps its source location so any later stage can point at the
 * offending token with file:line:col, the line and a caret. */
#ifndef XTC_XTF_H
#define XTC_XTF_H

#include <stddef.h>
#include <stdint.h>

struct IrGraph;

typedef struct {
    int line, col; /* 1-based */
    int len;       /* length of the token, for the caret underline (>= 1) */
} XtfLoc;

typedef enum {
    XV_INT,
    XV_FLOAT,
    XV_BOOL,
    XV_STRING,
    XV_NONE,  /* None */
    XV_TUPLE, /* (a, b, ...) */
    XV_CALL,  /* Name(key = value, ...) */
    XV_REF    /* identifier naming an earlier statement (model composition) */
} XtfKind;

typedef struct XtfValue XtfValue;

typedef struct {
    const char *key;
    XtfLoc loc; /* of the key */
    XtfValue *value;
} XtfArg;

struct XtfValue {
    XtfKind kind;
    XtfLoc loc;
    int64_t i;          /* XV_INT */
    double f;           /* XV_FLOAT */
    int b;              /* XV_BOOL */
    const char *s;      /* XV_STRING contents, XV_CALL callee, XV_REF identifier */
    XtfArg *args;       /* XV_CALL */
    int nargs;
    XtfValue **items;   /* XV_TUPLE */
    int nitems;
    const XtfValue *ref; /* XV_REF: the referenced statement's value, set by xtf_check */
};

typedef struct {
    const char *name;
    XtfLoc loc;
    XtfValue *value;
} XtfStmt;

typedef struct XtfFile {
    const char *path;
    char *src;          /* owned copy of the source text */
    XtfStmt *stmts;
    int nstmts;
    void *pool;         /* allocation pool, freed by xtf_free */
    int version;        /* the x-transformers version it mirrors (versions.h: XtVersionId), set
                           by xtf_check from a first statement xtransformers = "2.26.4";
                           0 (0.23.0) without one */
} XtfFile;

/* Diagnostics accumulate as text: "file:line:col: error: msg\n<line>\n<caret>\n" each. */
typedef struct {
    char *text;
    size_t len, cap;
    int nerrors;
    int max_errors;     /* 0 = 20 */
} XtfDiag;

void xtf_diag_init(XtfDiag *d);
void xtf_diag_free(XtfDiag *d);
void xtf_diag_error(XtfDiag *d, const XtfFile *f, XtfLoc loc, const char *fmt, ...);
void xtf_diag_note(XtfDiag *d, const XtfFile *f, XtfLoc loc, const char *fmt, ...);

/* Parses source text (copied). Never NULL unless out of memory; d->nerrors tells success.
 * Recovers at statement boundaries to report several errors. */
XtfFile *xtf_parse(const char *path, const char *src, size_t len, XtfDiag *d);
/* The largest .xtf source read (models take a few KB): a larger file, pipe or device is an
 * error, found after reading at most this many bytes plus one. */
#define XTF_SOURCE_MAX (4 << 20)
/* Reads and parses a file; a read error becomes a diagnostic. A FIFO that nobody writes reads
 * as empty; a NUL byte in the text is an error at its line and column. */
XtfFile *xtf_parse_file(const char *path, XtfDiag *d);
void xtf_free(XtfFile *f);

/* Validates every constructor call against the option table (frontend/options.c): unknown
 * constructors and options (with a "did you mean" suggestion), wrong types, out-of-range values,
 * duplicate keys, options not supported yet (refused by name), missing required options,
 * references to undefined statements. Returns the number of errors added. */
int xtf_check(XtfFile *f, XtfDiag *d);

/* Option access on a checked call; absent options yield the table's default. Floats accept
 * integer values. */
const XtfValue *xtf_arg(const XtfValue *call, const char *key);   /* explicit value or NULL */
int64_t xtf_int(const XtfValue *call, const char *key);
double xtf_float(const XtfValue *call, const char *key);
int xtf_bool(const XtfValue *call, const char *key);
const XtfValue *xtf_callv(const XtfValue *call, const char *key);  /* nested call (refs resolved) */
const XtfStmt *xtf_find(const XtfFile *f, const char *name);        /* statement by name */
/* Added with the checker (frontend/access.c): the explicit value (refs resolved) or else the
 * table default, NULL when neither exists; whether that value exists and is not None; a string
 * option's contents (NULL if not a string). */
const XtfValue *xtf_value(const XtfValue *call, const char *key);
int xtf_has(const XtfValue *call, const char *key);
const char *xtf_string(const XtfValue *call, const char *key);

/* Lowering (frontend/lower.c). model: statement name, or NULL for the last statement of the
 * file. Returns NULL with diagnostics on error. */
typedef struct {
    int train;        /* add the targets input and the loss output */
    int mask;         /* add the padding mask input (bool[b, n], true = real token) */
    int src_mask;     /* XTransformer, EncoderDecoder: add the encoder's src_mask input */
    int context_mask; /* cross-attention: add the context_mask input (bool[b, m]) */
    int tgt_mask;     /* XTransformer: add the tgt_mask input */
    int embeddings;   /* also output the final-normed hidden states as "embeddings" */
    int kv_cache;     /* incremental decoding: cache.<l>.k/.v inputs and outputs, positions
                         continue after the cache (a causal Decoder only) */
    int dropout;      /* training mode: emb/attn/ff dropout where the rates are > 0, masks drawn
                         from the input dropout_seed (i64 scalar); 0 = evaluation, never drops */
} XtLowerOpts;

struct IrGraph *xt_lower(const XtfFile *f, const char *model, const XtLowerOpts *opts, XtfDiag *d);

#endif
