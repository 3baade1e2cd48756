/* pool.c: the allocation pool of an XtfFile. A parse tree is built once, never edited node by
 * node, and dropped as a whole, so its memory is a list of large blocks freed by xtf_free. */
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xtf_internal.h"

typedef struct PoolBlock {
    struct PoolBlock *next;
    size_t used, cap;
    alignas(max_align_t) unsigned char data[];
} PoolBlock;

typedef struct {
    PoolBlock *blocks;
    size_t src_len;
    int failed;
} Pool;

enum { POOL_BLOCK = 64 * 1024 };

XtfFile *xtf_file_new(const char *path, const char *src, size_t len)
{
    XtfFile *f = calloc(1, sizeof *f);
    Pool *p = calloc(1, sizeof *p);
    if (!f || !p) {
        free(f);
        free(p);
        return NULL;
    }
    f->pool = p;
    p->src_len = len;
    f->src = xtf_pool_alloc(f, len + 1);
    f->path = xtf_pool_strndup(f, path ? path : "<input>", strlen(path ? path : "<input>"));
    if (!f->src || !f->path) {
        xtf_free(f);
        return NULL;
    }
    if (len)
        memcpy(f->src, src, len);
    f->src[len] = '\0';
    return f;
}

static PoolBlock *block_new(Pool *p, size_t cap)
{
    PoolBlock *b = malloc(sizeof *b + cap);
    if (!b) {
        p->failed = 1;
        return NULL;
    }
    b->cap = cap;
    b->used = 0;
    b->next = NULL;
    return b;
}

void *xtf_pool_alloc(XtfFile *f, size_t size)
{
    Pool *p = f->pool;
    size_t align = alignof(max_align_t);
    if (size > SIZE_MAX / 2) {
        p->failed = 1;
        return NULL;
    }
    size = size ? (size + align - 1) / align * align : align;
    PoolBlock *b;
    if (size > POOL_BLOCK / 4) {
        /* A big one-off allocation gets a block of its own, kept behind the current block so
         * that the current block goes on serving small requests. */
        if (!(b = block_new(p, size)))
            return NULL;
        if (p->blocks) {
            b->next = p->blocks->next;
            p->blocks->next = b;
        } else {
            p->blocks = b;
        }
    } else if (!p->blocks || p->blocks->cap - p->blocks->used < size) {
        if (!(b = block_new(p, POOL_BLOCK)))
            return NULL;
        b->next = p->blocks;
        p->blocks = b;
    } else {
        b = p->blocks;
    }
    void *mem = b->data + b->used;
    b->used += size;
    memset(mem, 0, size);
    return mem;
}

char *xtf_pool_strndup(XtfFile *f, const char *s, size_t n)
{
    char *c = xtf_pool_alloc(f, n + 1);
    if (!c)
        return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

size_t xtf_src_len(const XtfFile *f)
{
    return ((const Pool *)f->pool)->src_len;
}

int xtf_pool_failed(const XtfFile *f)
{
    return ((const Pool *)f->pool)->failed;
}

int xtf_vec_push(XtfFile *f, XtfVec *v, void *item)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        if (cap < v->cap || (size_t)cap > SIZE_MAX / sizeof(void *))
            return -1;
        void **items = xtf_pool_alloc(f, (size_t)cap * sizeof(void *));
        if (!items)
            return -1;
        if (v->n)
            memcpy(items, v->items, (size_t)v->n * sizeof(void *));
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = item;
    return 0;
}

void xtf_free(XtfFile *f)
{
    if (!f)
        return;
    Pool *p = f->pool;
    if (p) {
        PoolBlock *b = p->blocks;
        while (b) {
            PoolBlock *next = b->next;
            free(b);
            b = next;
        }
        free(p);
    }
    free(f);
}
