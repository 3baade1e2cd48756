/* diag.c: diagnostics of the .xtf front end, accumulated as text in the style of C compilers:
 *
 *   gpt.xtf:3:38: error: unknown option 'rotary_pos_embb' for Decoder; did you mean '...'?
 *       attn_layers = Decoder(dim = 512, rotary_pos_embb = true),
 *                                        ^~~~~~~~~~~~~~~
 *
 * The source line is echoed as it is; the caret line keeps its tabs so the caret lines up in any
 * terminal, and counts a UTF-8 character as one column. After max_errors errors, one line
 * "too many errors" is written and later errors (and their notes) are counted but not recorded. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtf_internal.h"

enum { DEFAULT_MAX_ERRORS = 20, MAX_ECHO = 1000 };

void xtf_diag_init(XtfDiag *d)
{
    memset(d, 0, sizeof *d);
}

void xtf_diag_free(XtfDiag *d)
{
    free(d->text);
    memset(d, 0, sizeof *d);
}

static void append(XtfDiag *d, const char *s, size_t n)
{
    if (d->len + n + 1 > d->cap) {
        size_t cap = d->cap ? d->cap : 256;
        while (cap < d->len + n + 1)
            cap *= 2;
        char *text = realloc(d->text, cap);
        if (!text)
            return; /* out of memory: the message is lost, the count is not */
        d->text = text;
        d->cap = cap;
    }
    memcpy(d->text + d->len, s, n);
    d->len += n;
    d->text[d->len] = '\0';
}

static void appendv(XtfDiag *d, const char *fmt, va_list ap)
{
    char small[512];
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(small, sizeof small, fmt, copy);
    va_end(copy);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        append(d, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big)
        return;
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    append(d, big, (size_t)n);
    free(big);
}

static void appendf(XtfDiag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    appendv(d, fmt, ap);
    va_end(ap);
}

static int is_utf8_continuation(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

/* The source line at loc, then the caret line under the token. */
static void echo_source(XtfDiag *d, const XtfFile *f, XtfLoc loc)
{
    if (!f || !f->src || loc.line < 1 || loc.col < 1)
        return;
    const char *s = f->src, *end = s + xtf_src_len(f);
    for (int line = 1; line < loc.line; line++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        if (!nl)
            return;
        s = nl + 1;
    }
    const char *eol = memchr(s, '\n', (size_t)(end - s));
    if (!eol)
        eol = end;
    if (eol > s && eol[-1] == '\r')
        eol--;
    size_t n = (size_t)(eol - s);
    if (n > MAX_ECHO)
        return;

    char buf[MAX_ECHO + 2];
    for (size_t i = 0; i < n; i++)
        buf[i] = s[i] ? s[i] : ' '; /* a NUL byte would end the text early */
    buf[n] = '\n';
    append(d, buf, n + 1);

    size_t col = (size_t)loc.col - 1, k = 0;
    for (size_t i = 0; i < col; i++) {
        if (i < n && is_utf8_continuation((unsigned char)s[i]))
            continue;
        buf[k++] = i < n && s[i] == '\t' ? '\t' : ' ';
        if (k > MAX_ECHO)
            return;
    }
    buf[k++] = '^';
    size_t stop = col + (size_t)(loc.len > 1 ? loc.len : 1);
    for (size_t i = col + 1; i < stop && i < n && k <= MAX_ECHO; i++)
        if (!is_utf8_continuation((unsigned char)s[i]))
            buf[k++] = '~';
    buf[k++] = '\n';
    append(d, buf, k);
}

static void emit(XtfDiag *d, const XtfFile *f, XtfLoc loc, const char *kind, const char *fmt,
                 va_list ap)
{
    const char *path = f && f->path ? f->path : NULL;
    if (path && loc.line > 0)
        appendf(d, "%s:%d:%d: %s: ", path, loc.line, loc.col, kind);
    else if (path)
        appendf(d, "%s: %s: ", path, kind);
    else
        appendf(d, "%s: ", kind);
    appendv(d, fmt, ap);
    append(d, "\n", 1);
    if (loc.line > 0)
        echo_source(d, f, loc);
}

static int limit(const XtfDiag *d)
{
    return d->max_errors > 0 ? d->max_errors : DEFAULT_MAX_ERRORS;
}

void xtf_diag_error(XtfDiag *d, const XtfFile *f, XtfLoc loc, const char *fmt, ...)
{
    d->nerrors++;
    if (d->nerrors > limit(d)) {
        if (d->nerrors == limit(d) + 1)
            append(d, "too many errors\n", 16);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    emit(d, f, loc, "error", fmt, ap);
    va_end(ap);
}

void xtf_diag_note(XtfDiag *d, const XtfFile *f, XtfLoc loc, const char *fmt, ...)
{
    if (d->nerrors > limit(d))
        return; /* the error it belongs to was not recorded either */
    va_list ap;
    va_start(ap, fmt);
    emit(d, f, loc, "note", fmt, ap);
    va_end(ap);
}
