/* test_cuda_graph.c: the decisions of the schedule's CUDA graphs (runtime/rt_cuda_graph.c) against
 * a fake driver, since neither the emulator nor this machine can capture: which runs capture,
 * instantiate, update or replay a graph, for which keys; that a replay runs the work its capture
 * recorded for that key; the fallbacks (no graph functions, XTC_CUDA_GRAPHS=0, a launch failing
 * during the capture, a capture or an instantiation the driver refuses); that every graph the
 * driver made is destroyed.
 *
 * The fake "schedule" is a list of launches, each an integer; the fake driver records them while
 * its stream captures and otherwise "runs" them by appending them to a log, as a graph's launch
 * appends the values it recorded. */
#include "rt_cuda.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAXW 64

typedef struct {
    int n, v[MAXW];
} Work;

static int capturing, live_graphs, live_execs;
static Work recording, ran;                 /* the capture in progress; what the "device" ran */
static int refuse_capture, refuse_instantiate;
static int64_t issued;                      /* schedules issued by the host (captured or run) */

static void device_run(const Work *w)
{
    for (int i = 0; i < w->n && ran.n < MAXW; i++)
        ran.v[ran.n++] = w->v[i];
}

static CUresult fake_begin(CUstream s, int mode)
{
    (void)s;
    ck_assert_int_eq(mode, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    ck_assert(!capturing);
    capturing = 1;
    recording.n = 0;
    return CUDA_SUCCESS;
}

static CUresult fake_end(CUstream s, CUgraph *graph)
{
    (void)s;
    ck_assert(capturing);
    capturing = 0;
    if (refuse_capture) {
        *graph = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    Work *w = malloc(sizeof *w);
    *w = recording;
    live_graphs++;
    *graph = (CUgraph)(void *)w;
    return CUDA_SUCCESS;
}

static CUresult fake_instantiate(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    (void)flags;
    if (refuse_instantiate)
        return CUDA_ERROR_OUT_OF_MEMORY;
    Work *w = malloc(sizeof *w);
    *w = *(const Work *)(void *)graph;
    live_execs++;
    *exec = (CUgraphExec)(void *)w;
    return CUDA_SUCCESS;
}

/* as the driver: the same nodes (here: as many launches) take the new arguments */
static CUresult fake_update(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info)
{
    Work *e = (Work *)(void *)exec;
    const Work *g = (const Work *)(void *)graph;
    if (e->n != g->n) {
        info->result = 1;
        return CUDA_ERROR_INVALID_VALUE; /* CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE */
    }
    *e = *g;
    return CUDA_SUCCESS;
}

static CUresult fake_launch(CUgraphExec exec, CUstream s)
{
    (void)s;
    ck_assert(!capturing);
    device_run((const Work *)(void *)exec);
    return CUDA_SUCCESS;
}

static CUresult fake_exec_destroy(CUgraphExec exec)
{
    live_execs--;
    free((void *)exec);
    return CUDA_SUCCESS;
}

static CUresult fake_graph_destroy(CUgraph graph)
{
    live_graphs--;
    free((void *)graph);
    return CUDA_SUCCESS;
}

static CUresult fake_error_string(CUresult r, const char **text)
{
    (void)r;
    *text = "fake";
    return CUDA_SUCCESS;
}

static RtCuDriver fake_driver(void)
{
    RtCuDriver d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "fake");
    d.StreamBeginCapture = fake_begin;
    d.StreamEndCapture = fake_end;
    d.GraphInstantiateWithFlags = fake_instantiate;
    d.GraphExecUpdate = fake_update;
    d.GraphLaunch = fake_launch;
    d.GraphExecDestroy = fake_exec_destroy;
    d.GraphDestroy = fake_graph_destroy;
    d.GetErrorString = fake_error_string;
    return d;
}

/* The schedule of a binding: `len` launches whose values come from the key's first symbol (as a
 * kernel's size argument would); fail_at >= 0: that launch fails. */
typedef struct {
    int len, fail_at;
    const uint64_t *key;
} Sched;

static int issue(void *ctx)
{
    const Sched *s = ctx;
    issued++;
    for (int i = 0; i < s->len; i++) {
        if (i == s->fail_at)
            return 1;
        int v = (int)s->key[0] * 100 + i;
        if (capturing)
            recording.v[recording.n++] = v;
        else
            device_run(&(Work){1, {v}});
    }
    return 0;
}

#define NBUFS 3

/* a key for symbol value sym and buffer addresses base, base + 1, ... */
static void make_key(uint64_t *key, int64_t sym, uintptr_t base)
{
    int64_t syms[RT_MAXSYM] = {0};
    void *dptr[NBUFS];
    syms[0] = sym;
    for (int b = 0; b < NBUFS; b++)
        dptr[b] = (void *)(base + 256 * (uintptr_t)b);
    rt_cu_graph_key(key, syms, dptr, NBUFS, 0x5000);
}

/* runs the binding (sym, base) through g (or step by step when it says so) and checks that the
 * device ran exactly that binding's schedule; returns rt_cu_graph_run's answer */
static int run_once(RtCuGraphs *g, const RtCuDriver *d, int64_t sym, uintptr_t base, int len)
{
    uint64_t key[RT_MAXSYM + NBUFS + 1];
    make_key(key, sym, base);
    Sched s = {len, -1, key};
    char err[256] = "";
    ran.n = 0;
    int r = rt_cu_graph_run(g, d, NULL, key, issue, &s, err, sizeof err);
    ck_assert_msg(r == 0 || r == 1, "%s", err);
    if (r == 1)
        issue(&s);
    ck_assert_int_eq(ran.n, len);
    for (int i = 0; i < len; i++)
        ck_assert_int_eq(ran.v[i], (int)sym * 100 + i);
    return r;
}

static void reset(void)
{
    capturing = live_graphs = live_execs = 0;
    refuse_capture = refuse_instantiate = 0;
    issued = 0;
    setenv("XTC_CUDA_GRAPHS", "1", 1); /* graphs are opt-in */
}

/* the same binding: captured once, then replayed; a changed symbol or address is another graph */
START_TEST(test_replay)
{
    reset();
    RtCuDriver d = fake_driver();
    RtCuGraphs g;
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    ck_assert(g.enabled);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(run_once(&g, &d, 7, 0x10000, 6), 0);
    ck_assert_int_eq(issued, 1);
    ck_assert_int_eq(g.captures, 1);
    ck_assert_int_eq(g.replays, 4);
    /* another length, another address of one buffer: captured apart, the first still replays */
    ck_assert_int_eq(run_once(&g, &d, 8, 0x10000, 6), 0);
    ck_assert_int_eq(run_once(&g, &d, 7, 0x20000, 6), 0);
    ck_assert_int_eq(g.captures, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(run_once(&g, &d, 7, 0x10000, 6), 0);
        ck_assert_int_eq(run_once(&g, &d, 8, 0x10000, 6), 0);
    }
    ck_assert_int_eq(g.captures, 3);
    ck_assert_int_eq(g.instantiations, 3);
    ck_assert_int_eq(g.replays, 4 + 6);
    ck_assert_int_eq(issued, 3);
    rt_cu_graphs_free(&g, &d);
    ck_assert_int_eq(live_graphs, 0);
    ck_assert_int_eq(live_execs, 0);
}
END_TEST

/* one-token decoding: every call a new cache length. The first RT_CU_GRAPHS are instantiated,
 * then the least recently used graph is updated in place; an update the driver refuses (other
 * nodes) instantiates anew; the recent lengths still replay. */
START_TEST(test_decode_updates)
{
    reset();
    RtCuDriver d = fake_driver();
    RtCuGraphs g;
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    for (int len = 1; len <= 10; len++)
        ck_assert_int_eq(run_once(&g, &d, len, 0x10000, 5), 0);
    ck_assert_int_eq(g.captures, 10);
    ck_assert_int_eq(g.instantiations, RT_CU_GRAPHS);
    ck_assert_int_eq(g.updates, 10 - RT_CU_GRAPHS);
    ck_assert_int_eq(g.replays, 0);
    ck_assert_int_le(live_execs, RT_CU_GRAPHS);
    for (int len = 10; len > 10 - RT_CU_GRAPHS; len--) /* the last few lengths are kept */
        ck_assert_int_eq(run_once(&g, &d, len, 0x10000, 5), 0);
    ck_assert_int_eq(g.replays, RT_CU_GRAPHS);
    /* a schedule of other launches (a prompt's): the update fails, a new graph replaces the oldest */
    ck_assert_int_eq(run_once(&g, &d, 50, 0x10000, 9), 0);
    ck_assert_int_eq(g.instantiations, RT_CU_GRAPHS + 1);
    ck_assert_int_eq(g.updates, 10 - RT_CU_GRAPHS);
    ck_assert_int_eq(run_once(&g, &d, 50, 0x10000, 9), 0);
    ck_assert_int_eq(g.replays, RT_CU_GRAPHS + 1);
    ck_assert_int_eq(live_execs, RT_CU_GRAPHS);
    ck_assert_int_eq(live_graphs, RT_CU_GRAPHS);
    rt_cu_graphs_free(&g, &d);
    ck_assert_int_eq(live_graphs, 0);
    ck_assert_int_eq(live_execs, 0);
}
END_TEST

/* where graphs are not used: the run goes step by step (1), and nothing is left behind */
START_TEST(test_fallbacks)
{
    reset();
    RtCuGraphs g;
    /* the emulator (no graph functions), and a driver with them turned off by the environment */
    RtCuDriver emu;
    rt_cu_emulator(&emu);
    rt_cu_graphs_init(&g, &emu, RT_MAXSYM + NBUFS + 1);
    ck_assert(!g.enabled);
    ck_assert_int_eq(run_once(&g, &emu, 3, 0x10000, 4), 1);
    RtCuDriver d = fake_driver();
    setenv("XTC_CUDA_GRAPHS", "0", 1);
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    ck_assert_int_eq(g.enabled, 0);
    unsetenv("XTC_CUDA_GRAPHS"); /* unset: off too */
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    ck_assert_int_eq(g.enabled, 0);
    setenv("XTC_CUDA_GRAPHS", "1", 1);
    ck_assert(!g.enabled);
    ck_assert_int_eq(run_once(&g, &d, 3, 0x10000, 4), 1);
    ck_assert_int_eq(g.captures, 0);
    /* a launch failing in the capture: no graph, the step-by-step run reports it; graphs stay on */
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    uint64_t key[RT_MAXSYM + NBUFS + 1];
    make_key(key, 4, 0x10000);
    Sched bad = {4, 2, key};
    char err[256];
    ran.n = 0;
    ck_assert_int_eq(rt_cu_graph_run(&g, &d, NULL, key, issue, &bad, err, sizeof err), 1);
    ck_assert_int_eq(ran.n, 0); /* nothing ran: the caller's own run is the only one */
    ck_assert(g.enabled && !capturing);
    ck_assert_int_eq(live_graphs, 0);
    ck_assert_int_eq(run_once(&g, &d, 4, 0x10000, 4), 0);
    ck_assert_int_eq(run_once(&g, &d, 4, 0x10000, 4), 0);
    ck_assert_int_eq(g.replays, 1);
    rt_cu_graphs_free(&g, &d);
    /* the driver refuses the capture, or the instantiation: graphs off for the session */
    refuse_capture = 1;
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    ck_assert_int_eq(run_once(&g, &d, 5, 0x10000, 4), 1);
    ck_assert(!g.enabled);
    rt_cu_graphs_free(&g, &d);
    refuse_capture = 0;
    refuse_instantiate = 1;
    rt_cu_graphs_init(&g, &d, RT_MAXSYM + NBUFS + 1);
    ck_assert_int_eq(run_once(&g, &d, 5, 0x10000, 4), 1);
    ck_assert(!g.enabled);
    ck_assert_int_eq(run_once(&g, &d, 5, 0x10000, 4), 1);
    rt_cu_graphs_free(&g, &d);
    ck_assert_int_eq(live_graphs, 0);
    ck_assert_int_eq(live_execs, 0);
}
END_TEST

/* the key covers every symbol, every buffer's address and the status words */
START_TEST(test_key)
{
    uint64_t a[RT_MAXSYM + NBUFS + 1], b[RT_MAXSYM + NBUFS + 1];
    int64_t syms[RT_MAXSYM] = {0};
    void *dptr[NBUFS] = {(void *)0x100, (void *)0x200, (void *)0x300};
    rt_cu_graph_key(a, syms, dptr, NBUFS, 0x9000);
    for (int k = 0; k < RT_MAXSYM; k++) {
        syms[k] = 1;
        rt_cu_graph_key(b, syms, dptr, NBUFS, 0x9000);
        ck_assert_msg(memcmp(a, b, sizeof a) != 0, "symbol %d not in the key", k);
        syms[k] = 0;
    }
    for (int i = 0; i < NBUFS; i++) {
        dptr[i] = (void *)0x999;
        rt_cu_graph_key(b, syms, dptr, NBUFS, 0x9000);
        ck_assert_msg(memcmp(a, b, sizeof a) != 0, "buffer %d not in the key", i);
        dptr[i] = (void *)(uintptr_t)(0x100 * (i + 1));
    }
    rt_cu_graph_key(b, syms, dptr, NBUFS, 0x9100);
    ck_assert(memcmp(a, b, sizeof a) != 0);
    rt_cu_graph_key(b, syms, dptr, NBUFS, 0x9000);
    ck_assert(memcmp(a, b, sizeof a) == 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_graph");
    TCase *tc = tcase_create("graphs");
    tcase_add_test(tc, test_replay);
    tcase_add_test(tc, test_decode_updates);
    tcase_add_test(tc, test_fallbacks);
    tcase_add_test(tc, test_key);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(suite(), NULL);
}
