/* kernel_text.h: the text of generated CUDA kernels as test_cuda_nvrtc compares them: a
 * kernel's own name made canonical, and the key under which near-duplicate kernels (the same body
 * under different comments or unused parameters) compile once. Included by one test file. */
#ifndef XTC_TESTS_KERNEL_TEXT_H
#define XTC_TESTS_KERNEL_TEXT_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *canonical(const char *text, const char *fn)
{
    size_t fl = strlen(fn), n = strlen(text);
    char *out = malloc(n + 64);
    size_t o = 0;
    for (const char *p = text; *p;) {
        if (strncmp(p, fn, fl) == 0 && !(p[fl] == '_' || (p[fl] >= '0' && p[fl] <= '9') ||
                                         (p[fl] >= 'a' && p[fl] <= 'z'))) {
            memcpy(out + o, "@NAME@", 6);
            o += 6;
            p += fl;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = 0;
    return out;
}

static int ident_char(char c) { return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* whether identifier id occurs in text as a word */
static int has_word(const char *text, const char *id)
{
    size_t len = strlen(id);
    for (const char *p = strstr(text, id); p; p = strstr(p + 1, id))
        if ((p == text || !ident_char(p[-1])) && !ident_char(p[len]))
            return 1;
    return 0;
}

/* What makes two kernels one program for NVRTC and ptxas, in a new string: the canonical text
 * without its comments (the header names the graph's shapes and steps), its parameters reduced to
 * those the rest of the text names, their spacing normalised. Kernels with the same body whose
 * signatures differ only in parameters the body never reads (the symbols of the graph a fused
 * kernel came from) are the same code: compiling the one with the fewest parameters compiles
 * every statement the others have, and a parameter the body needs but a signature lacks fails
 * there. *nparams: how many parameters the signature has. */
static char *same_code(const char *text, int *nparams)
{
    size_t n = strlen(text), o = 0;
    char *bare = malloc(n + 1);
    ck_assert_ptr_nonnull(bare);
    for (const char *p = text; *p;)
        if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            p = end ? end + 2 : p + strlen(p);
        } else {
            bare[o++] = *p++;
        }
    bare[o] = 0;
    *nparams = 0;
    char *open = strstr(bare, "@NAME@(");
    if (!open)
        return bare;
    open += 6;
    char *close = open;
    for (int depth = 0; *close; close++)
        if (*close == '(')
            depth++;
        else if (*close == ')' && --depth == 0)
            break;
    ck_assert_msg(*close == ')', "a kernel signature without its ')': %.200s", open);
    const char *body = close + 1;
    char *key = malloc(o + 1);
    ck_assert_ptr_nonnull(key);
    size_t k = (size_t)(open - bare) + 1;
    memcpy(key, bare, k);
    int kept = 0;
    for (char *param = open + 1; param < close;) {
        char *end = param;
        for (int depth = 0; end < close && (depth || *end != ','); end++)
            depth += (*end == '(' || *end == '[') - (*end == ')' || *end == ']');
        char *id_end = end;
        while (id_end > param && !ident_char(id_end[-1]))
            id_end--;
        char *id = id_end;
        while (id > param && ident_char(id[-1]))
            id--;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(id_end - id), id);
        if (id_end > param)
            ++*nparams;
        if (id_end > param && has_word(body, name)) { /* kept, its white space as one space */
            if (kept++)
                key[k++] = ',';
            int space = 1;
            for (char *q = param; q < end; q++) {
                int white = *q == ' ' || *q == '\n' || *q == '\t';
                if (white && !space)
                    key[k++] = ' ';
                else if (!white)
                    key[k++] = *q;
                space = white;
            }
        }
        param = end < close ? end + 1 : close;
    }
    snprintf(key + k, o + 1 - k, "%s", body);
    free(bare);
    return key;
}

#endif
