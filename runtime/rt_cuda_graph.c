/* rt_cuda_graph.c: a CUDA module's schedule captured into CUDA graphs and replayed (rt_cuda.c's
 * run), so that a run is one cuGraphLaunch instead of a launch per step.
 *
 * What a capture bakes in is what the schedule's host code decides from: the symbol values (the
 * grids, the kernels' size arguments, which path a kernel takes), the device addresses of the
 * buffers (inputs, weights, the arena's temps, outputs written over a KV cache) and the status
 * words. That is the key (rt_cu_graph_key); nothing else reaches the schedule's run function. A
 * graph is replayed only for an equal key, so a kernel's host-side choices (split-K workspaces in
 * the arena, the decode path's module-global partials) are the ones its capture made.
 *
 * A few graphs are kept (RT_CU_GRAPHS), least recently used first out. A miss captures the
 * schedule on the stream (thread-local capture mode); while a slot is free the capture is
 * instantiated into it, else the least recently used graph is updated in place with it
 * (cuGraphExecUpdate: same nodes, new arguments and grids), which is much cheaper than
 * instantiating and is what one-token decoding does: its cache length, a symbol, changes every
 * call, so every call is a miss. Passing the lengths through device memory would let one graph
 * serve every token, but the grids depend on them too (the decode attention's blocks cover the
 * cache), so every kernel would need a grid for the longest cache and a guard: not done. A
 * training step or a forward at a fixed shape replays from its second run on.
 *
 * The driver functions are optional (rt_cuda_driver.c leaves them NULL where the driver lacks
 * them; the emulator has none), unless XTC_CUDA_GRAPHS=1 is in the environment when the session
 * is created (off by default until measured and checked on hardware), while profiling (events between steps) and after a capture the driver refused, the
 * schedule is launched step by step as before. */
#include "rt_cuda.h"
#include "rt_alloc.h"

#include <stdlib.h>
#include <string.h>

void rt_cu_graphs_init(RtCuGraphs *g, const RtCuDriver *drv, int nkey)
{
    memset(g, 0, sizeof *g);
    const char *env = getenv("XTC_CUDA_GRAPHS");
    g->nkey = nkey;
    g->enabled = drv->StreamBeginCapture && drv->StreamEndCapture && drv->GraphInstantiateWithFlags &&
                 drv->GraphLaunch && drv->GraphExecDestroy && drv->GraphDestroy && env && *env && strcmp(env, "0") != 0;
}

static void drop(RtCuGraphs *g, const RtCuDriver *drv, int i)
{
    RtCuGraph *e = &g->e[i];
    if (e->exec)
        drv->GraphExecDestroy(e->exec);
    if (e->graph)
        drv->GraphDestroy(e->graph);
    free(e->key);
    memset(e, 0, sizeof *e);
}

void rt_cu_graphs_free(RtCuGraphs *g, const RtCuDriver *drv)
{
    for (int i = 0; i < RT_CU_GRAPHS; i++)
        drop(g, drv, i);
}

void rt_cu_graph_key(uint64_t *key, const int64_t *syms, void *const *dptr, int nbufs, CUdeviceptr status)
{
    for (int k = 0; k < RT_MAXSYM; k++)
        key[k] = (uint64_t)syms[k];
    for (int b = 0; b < nbufs; b++)
        key[RT_MAXSYM + b] = (uint64_t)(uintptr_t)dptr[b];
    key[RT_MAXSYM + nbufs] = (uint64_t)status;
}

int rt_cu_graph_find(const RtCuGraphs *g, const uint64_t *key)
{
    int free_slot = -1, oldest = 0;
    for (int i = 0; i < RT_CU_GRAPHS; i++) {
        const RtCuGraph *e = &g->e[i];
        if (!e->exec) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (!memcmp(e->key, key, (size_t)g->nkey * sizeof *key))
            return i;
        if (!g->e[oldest].exec || e->used < g->e[oldest].used)
            oldest = i;
    }
    return -1 - (free_slot >= 0 ? free_slot : oldest);
}

/* -1 with a message; -2 when out of memory */
static int fail(const RtCuDriver *drv, CUresult r, const char *what, char *err, size_t n)
{
    char text[200];
    rt_set_error(err, n, "%s (%s): %s", what, drv->name, rt_cu_error_text(drv, r, text, sizeof text));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -2 : -1;
}

int rt_cu_graph_run(RtCuGraphs *g, const RtCuDriver *drv, CUstream stream, const uint64_t *key,
                    int (*issue)(void *ctx), void *ctx, char *err, size_t n)
{
    if (!g->enabled)
        return 1;
    int i = rt_cu_graph_find(g, key);
    CUresult r;
    if (i >= 0) {
        g->e[i].used = ++g->clock;
        g->replays++;
        r = drv->GraphLaunch(g->e[i].exec, stream);
        return r == CUDA_SUCCESS ? 0 : fail(drv, r, "launching the schedule's CUDA graph", err, n);
    }
    int slot = -1 - i;
    RtCuGraph *e = &g->e[slot];
    if (!e->key && !(e->key = rt_malloc((size_t)g->nkey * sizeof *key))) {
        rt_set_error(err, n, "out of memory for a CUDA graph");
        return -2;
    }
    /* capture: the launches are recorded, not run; a failed one ends the capture, and the run
     * goes step by step to report it */
    if ((r = drv->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)) != CUDA_SUCCESS) {
        g->enabled = 0;
        return 1;
    }
    int bad = issue(ctx);
    CUgraph graph = NULL;
    r = drv->StreamEndCapture(stream, &graph);
    if (bad || r != CUDA_SUCCESS || !graph) {
        if (graph)
            drv->GraphDestroy(graph);
        if (!bad) /* the driver refused the capture: no graphs for this session */
            g->enabled = 0;
        return 1;
    }
    g->captures++;
    int updated = 0;
    if (e->exec && drv->GraphExecUpdate) { /* the oldest graph's nodes take the new arguments */
        CUgraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        updated = drv->GraphExecUpdate(e->exec, graph, &info) == CUDA_SUCCESS;
    }
    if (updated) {
        g->updates++;
        drv->GraphDestroy(e->graph);
        e->graph = graph;
    } else {
        if (e->exec)
            drv->GraphExecDestroy(e->exec);
        if (e->graph)
            drv->GraphDestroy(e->graph);
        e->exec = NULL;
        e->graph = graph;
        if ((r = drv->GraphInstantiateWithFlags(&e->exec, graph, 0)) != CUDA_SUCCESS) {
            e->exec = NULL;
            drop(g, drv, slot);
            g->enabled = 0;
            return 1;
        }
        g->instantiations++;
    }
    memcpy(e->key, key, (size_t)g->nkey * sizeof *key);
    e->used = ++g->clock;
    r = drv->GraphLaunch(e->exec, stream);
    return r == CUDA_SUCCESS ? 0 : fail(drv, r, "launching the schedule's CUDA graph", err, n);
}
