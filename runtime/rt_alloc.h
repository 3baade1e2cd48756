/* rt_alloc.h: the runtime's heap allocations, all of them through these wrappers, so that a test
 * can make any one of them fail (allocation-failure injection) and check that every API call
 * then returns XTC_ERR_MEMORY with a message, never crashes, and leaks nothing.
 *
 * Memory from these is released with free(). Not installed; users see include/xtc.h only. */
#ifndef XTC_RT_ALLOC_H
#define XTC_RT_ALLOC_H

#include <stddef.h>

void *rt_malloc(size_t n);
void *rt_calloc(size_t count, size_t size);
void *rt_realloc(void *p, size_t n);
void *rt_aligned_alloc(size_t align, size_t n); /* n is rounded up to a multiple of align */

/* Test-only fault injection (tests/test_faults.c). rt_fault_fail_after(n) with n >= 0 makes the
 * allocation n (counting from 0, from this call on, in every thread) fail once; n < 0 turns
 * injection off. rt_fault_allocations() is the number of allocations counted from the last
 * rt_fault_fail_after(n >= 0) until injection was turned off: at most n when nothing failed.
 * Process-wide on purpose: it stands for the machine running out of memory. When off, it costs
 * one relaxed atomic load per allocation. */
void rt_fault_fail_after(long n);
long rt_fault_allocations(void);

#endif
