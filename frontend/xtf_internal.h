/* xtf_internal.h: what the front end's own files share and nobody else needs: the allocation
 * pool behind XtfFile, the scanner's context, and the spelling distance used for "did you mean".
 * Public declarations live in xtf.h (the tree and the API) and options.h (the option table). */
#ifndef XTC_XTF_INTERNAL_H
#define XTC_XTF_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>

#include "xtf.h"

/* ---- pool (pool.c) ----
 * Every node, string and array of one XtfFile comes from its pool and is freed at once by
 * xtf_free. Allocations are zeroed. They return NULL only when malloc fails; the pool then
 * remembers that, so the parser can report "out of memory" once. */
XtfFile *xtf_file_new(const char *path, const char *src, size_t len);
void *xtf_pool_alloc(XtfFile *f, size_t size);
char *xtf_pool_strndup(XtfFile *f, const char *s, size_t n);
size_t xtf_src_len(const XtfFile *f); /* bytes in f->src (which may hold NUL bytes) */
int xtf_pool_failed(const XtfFile *f);

/* A growable array of pointers inside the pool (old storage is simply left in the pool). */
typedef struct {
    void **items;
    int n, cap;
} XtfVec;
int xtf_vec_push(XtfFile *f, XtfVec *v, void *item); /* 0 on success, -1 out of memory */

/* ---- scanner (lexer.l) ---- */
typedef struct {
    XtfFile *file;
    XtfDiag *diag;
    int line, col;     /* position of the next character, 1-based */
    jmp_buf *fatal;    /* flex's fatal errors (out of memory) jump here instead of exit() */
} XtfLexCtx;

/* ---- spelling (check.c) ----
 * Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), capped: returns
 * any value > cap as cap + 1, so long unrelated names cost little. */
int xtf_edit_distance(const char *a, const char *b, int cap);
/* The largest distance at which a name still counts as a misspelling of a known one. */
int xtf_typo_limit(const char *name);

#endif
