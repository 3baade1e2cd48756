/* rt_pool.c: the CPU thread pool of a session. Generated kernels split their work with
 * parallel_for(pool, fn, ctx, n): [0, n) is cut into contiguous chunks (a few per thread) that
 * the caller and the workers claim one at a time, and the call returns when all are done.
 *
 * Claiming rather than assigning matters on shared machines: a worker that is not running
 * (preempted by another process) claims nothing, and the caller does its share instead of
 * waiting for it. A claim is a compare-and-swap on one word holding the job's generation, its
 * number of chunks and the next chunk. Deciding from that word alone, a worker that wakes up
 * late can never claim a chunk of a finished job; and a successful claim means the job is
 * unfinished, so the caller is not rewriting fn, ctx and total for the next one.
 *
 * Kernels follow each other closely, so idle workers spin on the job word for a while (SPIN_NS)
 * before sleeping on a condition variable: waking a sleeping thread costs tens of microseconds,
 * more in a virtual machine, and a forward pass runs hundreds of kernels. */
#include "rt_internal.h"
#include "rt_alloc.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 2000000L   /* 2 ms */
#define CHUNKS_PER_THREAD 4
#define WORKER_STACK (8L << 20)  /* 8 MiB, glibc's usual default, also under `ulimit -s unlimited` */
/* What a run may take of the calling thread's stack: the kernels' tiles (at most about 1.5 MiB:
 * attention with head size 256, 1 MiB; a matmul's packed panels, 256 KiB with AVX-512), with room
 * to spare for sanitizer builds. A caller with less left runs on a thread of WORKER_STACK. */
#define RUN_STACK (4L << 20)

struct RtPool {
    int n; /* threads, counting the caller */
    pthread_t *threads;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    /* the current job; written by the caller only while no chunk of it can be claimed */
    XtcTaskFn fn;
    void *ctx;
    int64_t total;
    atomic_ullong word;     /* generation << 32 | chunks << 16 | next chunk to claim */
    atomic_llong done;      /* chunks finished */
    atomic_int sleepers;    /* workers waiting on work_cv */
    atomic_int caller_waits;
    atomic_int stop;
};

typedef struct {
    RtPool *pool;
} Worker;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static unsigned gen_of(unsigned long long w) { return (unsigned)(w >> 32); }
static int64_t chunks_of(unsigned long long w) { return (int64_t)((w >> 16) & 0xffff); }
static int64_t next_of(unsigned long long w) { return (int64_t)(w & 0xffff); }

/* Claims and runs chunks of generation gen until none is left. */
static void work_on(RtPool *p, unsigned gen)
{
    for (;;) {
        unsigned long long w = atomic_load_explicit(&p->word, memory_order_acquire);
        if (gen_of(w) != gen)
            return;
        int64_t c = next_of(w), nchunks = chunks_of(w);
        if (c >= nchunks)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->word, &w, w + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* a successful claim means this job is unfinished, so fn, ctx and total are its own */
        int64_t lo = p->total * c / nchunks, hi = p->total * (c + 1) / nchunks;
        if (hi > lo)
            p->fn(p->ctx, lo, hi);
        /* seq_cst, paired with the caller's caller_waits store then done load */
        if (atomic_fetch_add(&p->done, 1) + 1 == nchunks && atomic_load(&p->caller_waits)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg)
{
    Worker *w = arg;
    RtPool *p = w->pool;
    free(w);
    unsigned seen = gen_of(atomic_load(&p->word));
    for (;;) {
        int64_t start = now_ns();
        for (unsigned i = 1; gen_of(atomic_load_explicit(&p->word, memory_order_acquire)) == seen; i++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed))
                return NULL;
            cpu_relax();
            if ((i & 255) == 0 && now_ns() - start > SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (gen_of(atomic_load(&p->word)) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->work_cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
                break;
            }
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = gen_of(atomic_load(&p->word));
        work_on(p, seen);
    }
}

int rt_cpus_available(void)
{
    /* the affinity mask (taskset, cgroup cpusets, a batch scheduler's allocation), not the CPUs
     * the machine has: threads beyond it only take turns on the same CPUs */
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    for (size_t ncpu = 2 * CPU_SETSIZE; n == 0 && ncpu <= 65536; ncpu *= 2) { /* a larger machine */
        cpu_set_t *big = CPU_ALLOC(ncpu);
        size_t size = CPU_ALLOC_SIZE(ncpu);
        if (!big)
            break;
        int rc = sched_getaffinity(0, size, big), e = errno;
        if (rc == 0)
            n = CPU_COUNT_S(size, big);
        CPU_FREE(big);
        if (rc != 0 && e != EINVAL)
            break;
    }
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online < 1 ? 1 : online > 1024 ? 1024 : (int)online;
    }
    return n > 1024 ? 1024 : n;
}

int rt_pool_threads(const RtPool *p) { return p ? p->n : 0; }

int xtc_session_threads(const XtcSession *s) { return rt_pool_threads(rt_session_pool((XtcSession *)s)); }

/* Bytes of the calling thread's stack below the current frame (stacks grow down on every target
 * this runs on), or SIZE_MAX when unknown. The stack's bounds are looked up once per thread
 * (pthread_getattr_np reads /proc/self/maps for the main thread: 40 us) and kept in a
 * thread-local variable: they describe the thread, not any session. */
static size_t stack_left(void)
{
    static _Thread_local uintptr_t lo, size; /* lo: the lowest address; size 0: not looked up yet */
    if (!size) {
        pthread_attr_t attr;
        void *addr = NULL;
        size_t sz = 0;
        size = SIZE_MAX; /* unknown */
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            if (pthread_attr_getstack(&attr, &addr, &sz) == 0 && sz > 0)
                lo = (uintptr_t)addr, size = sz;
            pthread_attr_destroy(&attr);
        }
    }
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    if (size == SIZE_MAX || sp < lo || sp - lo > size) /* unknown, or an alternate signal stack */
        return SIZE_MAX;
    return sp - lo;
}

typedef struct {
    XtcRunFn run;
    void **bufs;
    const int64_t *syms;
    const XtcRtApi *api;
    int32_t result;
} RunCall;

static void *run_main(void *arg)
{
    RunCall *c = arg;
    c->result = c->run(c->bufs, c->syms, c->api);
    return NULL;
}

int32_t rt_run_module(XtcRunFn run, void **bufs, const int64_t *syms, const XtcRtApi *api)
{
    if (stack_left() >= (size_t)RUN_STACK)
        return run(bufs, syms, api);
    /* a small stack (a thread created with a few hundred KiB, a coroutine): the run would overflow
     * it, so it runs on a thread with the stack the pool's workers have, and this one waits */
    RunCall c = {run, bufs, syms, api, 0};
    pthread_attr_t attr;
    pthread_t t;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        rc = pthread_attr_setstacksize(&attr, WORKER_STACK);
        if (rc == 0)
            rc = pthread_create(&t, &attr, run_main, &c);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0)
        return RT_RUN_NO_STACK;
    pthread_join(t, NULL);
    return c.result;
}

RtPool *rt_pool_new(int nthreads)
{
    RtPool *p = rt_calloc(1, sizeof *p);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->n = nthreads < 1 ? 1 : nthreads > 1024 ? 1024 : nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->word, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_waits, 0);
    atomic_init(&p->stop, 0);
    if (p->n > 1) {
        p->threads = rt_calloc((size_t)p->n, sizeof *p->threads);
        if (!p->threads) {
            rt_pool_free(p);
            errno = ENOMEM;
            return NULL;
        }
        for (int i = 1; i < p->n; i++) {
            Worker *w = rt_malloc(sizeof *w);
            if (!w) {
                rt_pool_free(p);
                errno = ENOMEM;
                return NULL;
            }
            w->pool = p;
            /* an explicit stack size: the kernels keep their tiles on the stack (up to about
             * 1 MiB: attention with head size 256), whatever default the process was given */
            pthread_attr_t attr;
            int rc = pthread_attr_init(&attr);
            if (rc == 0) {
                rc = pthread_attr_setstacksize(&attr, WORKER_STACK);
                if (rc == 0)
                    rc = pthread_create(&p->threads[i], &attr, worker_main, w);
                pthread_attr_destroy(&attr);
            }
            if (rc != 0) {
                free(w);
                rt_pool_free(p);
                errno = rc;
                return NULL;
            }
            p->started = i;
        }
    }
    return p;
}

void rt_pool_free(RtPool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->started; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

void rt_pool_parallel_for(void *pool, XtcTaskFn fn, void *ctx, int64_t n)
{
    RtPool *p = pool;
    if (n <= 0)
        return;
    if (!p || p->n == 1 || n == 1) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunks = (int64_t)p->n * CHUNKS_PER_THREAD; /* < 65536: threads are capped at 1024 */
    if (n < chunks)
        chunks = n;
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    atomic_store(&p->done, 0);
    unsigned gen = gen_of(atomic_load(&p->word)) + 1;
    /* publishes the job (seq_cst) */
    atomic_store(&p->word, (unsigned long long)gen << 32 | (unsigned long long)chunks << 16);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    work_on(p, gen);
    /* what is left are chunks that running workers claimed: wait for them */
    int64_t start = now_ns();
    for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < chunks; i++) {
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - start > SPIN_NS) {
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->caller_waits, 1);
            while (atomic_load(&p->done) < chunks)
                pthread_cond_wait(&p->done_cv, &p->mu);
            atomic_store(&p->caller_waits, 0);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}
