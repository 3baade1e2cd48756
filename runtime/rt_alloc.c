/* rt_alloc.c: the runtime's allocation wrappers and the test-only fault-injection hook (see
 * rt_alloc.h). */
#include "rt_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>

static atomic_long fault_at = -1; /* the allocation that fails, counted from the arming; -1 = off */
static atomic_long fault_count;   /* allocations since the arming */

void rt_fault_fail_after(long n)
{
    if (n < 0) { /* off; the count stays readable */
        atomic_store(&fault_at, -1);
        return;
    }
    atomic_store(&fault_count, 0);
    atomic_store(&fault_at, n);
}

long rt_fault_allocations(void) { return atomic_load(&fault_count); }

static int injected_failure(void)
{
    long at = atomic_load_explicit(&fault_at, memory_order_relaxed);
    if (at < 0)
        return 0;
    return atomic_fetch_add(&fault_count, 1) == at;
}

/* Blocks of RT_ALIGN_FROM bytes and more (weights, their bf16 copies, KV caches, inputs) start
 * on a 64-byte line: malloc gives a large block 16 bytes past a page, so that every 64-byte
 * vector load of its rows (the matrix-vector path, attention over a cache) would straddle two
 * cache lines. */
#define RT_ALIGN_FROM 4096

void *rt_malloc(size_t n)
{
    if (injected_failure())
        return NULL;
    return n >= RT_ALIGN_FROM ? aligned_alloc(64, (n + 63) / 64 * 64) : malloc(n);
}

void *rt_calloc(size_t count, size_t size) { return injected_failure() ? NULL : calloc(count, size); }

void *rt_realloc(void *p, size_t n) { return injected_failure() ? NULL : realloc(p, n); }

void *rt_aligned_alloc(size_t align, size_t n)
{
    if (injected_failure())
        return NULL;
    size_t rounded = (n + align - 1) / align * align;
    return aligned_alloc(align, rounded ? rounded : align);
}
