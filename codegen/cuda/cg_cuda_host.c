/* cg_cuda_host.c: the host half of a CUDA module, written as C and compiled with cc: the
 * schedule (one block of code per step: its buffers, its status word, its kernel's launch), each
 * kernel's launch geometry as expressions over the symbols, the embedded texts (metadata, the
 * model source, the CUDA C, the PTX) and the module objects the runtime looks up
 * (include/abi/rt_abi.h, include/abi/rt_cuda_abi.h). For cuda-emu also the emulator's entry points. */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

/* s as a C string literal, one source line per line of the literal. */
static void put_string(FILE *f, const char *s)
{
    if (!*s) {
        fprintf(f, "\"\"");
        return;
    }
    int open = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (!open) {
            fprintf(f, "\n    \"");
            open = 1;
        }
        switch (*p) {
        case '\\': fputs("\\\\", f); break;
        case '"': fputs("\\\"", f); break;
        case '?': fputs("\\?", f); break; /* no trigraphs */
        case '\t': fputs("\\t", f); break;
        case '\n':
            fputs("\\n\"", f);
            open = 0;
            break;
        default:
            if (*p < 32 || *p >= 127)
                fprintf(f, "\\%03o", *p);
            else
                fputc(*p, f);
        }
    }
    if (open)
        fputc('"', f);
}

static void sym_params(FILE *f, const CuGen *gen)
{
    for (int s = 0; s < gen->g->nsyms; s++)
        fprintf(f, ", int64_t %s", gen->sym[s]);
}

static void sym_args(FILE *f, const CuGen *gen)
{
    for (int s = 0; s < gen->g->nsyms; s++)
        fprintf(f, ", %s", gen->sym[s]);
}

static void launch_function(FILE *f, const CuUnit *u, int k)
{
    const CuGeom *g = &u->geom[k];
    const CgKernel *K = &u->plan->kernels[k];
    fprintf(f, "/* %s: %u threads per block */\n", K->fn, g->block);
    fprintf(f, "static int32_t launch_k%d(const XtcCudaApi *api, void **args", k);
    sym_params(f, &u->gen);
    fprintf(f, ")\n{\n");
    fprintf(f, "    const uint32_t grid[3] = {xtc_grid(%s, XTC_GRID_X), xtc_grid(%s, XTC_GRID_Y), 1};\n", g->grid_x,
            g->grid_y[0] ? g->grid_y : "1");
    fprintf(f, "    const uint32_t block[3] = {%u, 1, 1};\n", g->block);
    if (g->zero[0]) {
        fprintf(f, "    int32_t rc = api->zero(api->ctx, *(void **)args[0], (uint64_t)(%s));\n", g->zero);
        fprintf(f, "    if (rc)\n        return rc;\n");
    }
    fprintf(f, "    if (grid[0] == 0 || grid[1] == 0)\n        return 0;\n");
    fprintf(f, "    return api->launch(api->ctx, %d, grid, block, args);\n}\n\n", k);
}

static const char *step_label(const IrNode *n, char *buf, size_t len)
{
    if (n->label)
        return n->label;
    snprintf(buf, len, "t%d", n->id);
    return buf;
}

/* The module's kernel number of library kernel lib (CuUnit.lib), -1 when it has none. */
static int lib_kernel(const CuUnit *u, int lib)
{
    for (int i = 0; i < u->nlib; i++)
        if (u->lib[i] == lib)
            return u->nkernels + i;
    return -1;
}

/* In a step's block: xtc_fb_pre filling the step's scratch from in4 and in3 before its kernel
 * (CuGeom.pre): a warp a row, 4 rows a block */
static void pre_launch(FILE *f, const CuUnit *u, const CuGeom *g)
{
    fprintf(f, "        { /* the scratch: each query row's dlse_i - D_i (kernels/flash_pre.cuh) */\n");
    fprintf(f, "            int64_t pre_rows = %s;\n", g->pre);
    fprintf(f, "            int32_t pre_e = %lld, pre_gc = (int32_t)(%s);\n", g->pre_e, g->pre_gc);
    fprintf(f, "            void *pre_args[] = {&in4, &in3, &scratch, &pre_rows, &pre_e, &pre_gc};\n");
    fprintf(f, "            const uint32_t grid[3] = {xtc_grid((pre_rows + 3) / 4, XTC_GRID_X), 1, 1}, block[3] = {128, 1, 1};\n");
    fprintf(f, "            if (grid[0] && (rc = api->launch(api->ctx, %d, grid, block, pre_args)))\n", lib_kernel(u, CU_LIB_FB_PRE));
    fprintf(f, "                return rc;\n        }\n");
}

static void run_function(FILE *f, const CuUnit *u)
{
    const CgPlan *p = u->plan;
    const CuGen *gen = &u->gen;
    fprintf(f, "/* the schedule: one launch per step, in order, on the runtime's stream */\n");
    fprintf(f, "static int32_t xtc_cuda_run(void *const *bufs, const int64_t *syms, int32_t *status, "
               "const XtcCudaApi *api)\n{\n");
    if (gen->g->nsyms == 0)
        fprintf(f, "    (void)syms;\n");
    for (int s = 0; s < gen->g->nsyms; s++)
        fprintf(f, "    int64_t %s = syms[%d];\n", gen->sym[s], s);
    if (p->nsteps)
        fprintf(f, "    int32_t rc;\n");
    else
        fprintf(f, "    (void)bufs;\n    (void)status;\n");
    for (int s = 0; s < p->nsteps; s++) {
        const CgStep *st = &p->steps[s];
        char lb[32];
        fprintf(f, "    /* step %d: %s %%%s */\n", s, ir_ops[st->node->op].name, step_label(st->node, lb, sizeof lb));
        fprintf(f, "    if (api->step)\n        api->step(api->ctx, %d);\n", s);
        fprintf(f, "    {\n        void *out = bufs[%d]", st->out);
        for (int i = 0; i < st->node->nin; i++)
            fprintf(f, ", *in%d = bufs[%d]", i, st->in[i]);
        if (st->scratch >= 0)
            fprintf(f, ", *scratch = bufs[%d]", st->scratch);
        fprintf(f, ";\n        int32_t *st = status + %d;\n", s);
        if (st->scratch >= 0)
            pre_launch(f, u, &u->geom[st->kernel]);
        fprintf(f, "        void *args[] = {&out");
        for (int i = 0; i < st->node->nin; i++)
            fprintf(f, ", &in%d", i);
        if (st->scratch >= 0)
            fprintf(f, ", &scratch");
        for (int sy = 0; sy < gen->g->nsyms; sy++)
            fprintf(f, ", &%s", gen->sym[sy]);
        fprintf(f, ", &st};\n");
        fprintf(f, "        if ((rc = launch_k%d(api, args", st->kernel);
        sym_args(f, gen);
        fprintf(f, ")))\n            return rc;\n    }\n");
    }
    fprintf(f, "    if (api->step)\n        api->step(api->ctx, %d);\n", p->nsteps);
    fprintf(f, "    return 0;\n}\n\n");
}

char *cg_cuda_host_source(const CuUnit *u, const char *meta, const char *ptx, const char *xtf)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    const IrGraph *g = u->gen.g;
    fprintf(f, "/* Host code generated by xtc for the %s module of model \"%s\": the schedule of %d steps\n",
            u->emu ? "cuda-emu" : "cuda", g->name ? g->name : "model", u->plan->nsteps);
    fprintf(f, " * over %d kernels, their launch geometry, and the objects the runtime loads\n", u->nkernels);
    fprintf(f, " * (include/abi/rt_abi.h, include/abi/rt_cuda_abi.h). */\n");
    fprintf(f, "#include \"rt_abi.h\"\n#include \"rt_cuda_abi.h\"\n\n");
    fprintf(f, "#define XTC_GRID_X 2147483647\n#define XTC_GRID_Y 65535\n\n");
    fprintf(f, "/* blocks for n work items, capped at the CUDA limit (the kernels loop over the rest) */\n");
    fprintf(f, "static uint32_t xtc_grid(int64_t n, int64_t cap) { return n <= 0 ? 0 : n > cap ? (uint32_t)cap : "
               "(uint32_t)n; }\n\n");
    for (int k = 0; k < u->nkernels; k++)
        launch_function(f, u, k);
    run_function(f, u);

    fprintf(f, "/* a CUDA module runs through xtc_cuda_module_v1, never on the CPU */\n");
    fprintf(f, "static int32_t xtc_no_host_run(void **bufs, const int64_t *syms, const XtcRtApi *rt)\n{\n");
    fprintf(f, "    (void)bufs;\n    (void)syms;\n    (void)rt;\n    return -1;\n}\n\n");
    fprintf(f, "static const char xtc_meta[] = ");
    put_string(f, meta);
    fprintf(f, ";\n\nstatic const char xtc_xtf[] = ");
    put_string(f, xtf ? xtf : "");
    fprintf(f, ";\n\nstatic const char xtc_cuda_c[] = ");
    put_string(f, u->source);
    fprintf(f, ";\n\n");
    if (ptx) {
        fprintf(f, "static const char xtc_ptx[] = ");
        put_string(f, ptx);
        fprintf(f, ";\n\n");
    }
    int all = u->nkernels + u->nlib;
    if (all) {
        fprintf(f, "static const char *const xtc_kernel_names[] = {\n");
        for (int k = 0; k < u->nkernels; k++)
            fprintf(f, "    \"%s\",\n", u->plan->kernels[k].fn);
        for (int k = 0; k < u->nlib; k++)
            fprintf(f, "    \"%s\",\n", cu_lib_kernels[u->lib[k]].name);
        fprintf(f, "};\n\n");
    }
    /* how each buffer's floating-point values are stored on the device (--dtype) */
    fprintf(f, "static const uint8_t xtc_buf_storage[%d] = {", u->plan->nbufs + 1);
    for (int b = 0; b < u->plan->nbufs; b++) {
        const IrNode *node = u->plan->bufs[b].node;
        /* CG_STORE_ALL (cg_plan.h); a step's scratch (CgBuffer.rank) is f32 */
        int half = u->plan->bufs[b].rank > 0 ? 0 : cg_node_storage(node, u->gen.storage);
        fprintf(f, "%s%d", b ? ", " : "", half);
    }
    fprintf(f, "%s};\n\n", u->plan->nbufs ? "" : "0");
    if (u->emu)
        fprintf(f, "extern const XtcEmuModule xtc_emu_module __attribute__((visibility(\"hidden\")));\n\n");
    fprintf(f, "const XtcModuleV1 xtc_module_v1 = {XTC_ABI_MAGIC, XTC_ABI_VERSION, xtc_meta, xtc_xtf, "
               "xtc_no_host_run};\n\n");
    fprintf(f, "const XtcCudaModuleV1 xtc_cuda_module_v1 = {\n");
    fprintf(f, "    XTC_CUDA_MAGIC, XTC_CUDA_VERSION, \"%s\", %s, xtc_cuda_c,\n", u->arch, ptx ? "xtc_ptx" : "0");
    fprintf(f, "    %d, %s, xtc_cuda_run, %s,\n", all, all ? "xtc_kernel_names" : "0",
            u->emu ? "&xtc_emu_module" : "0");
    fprintf(f, "    %d, xtc_buf_storage,\n};\n", u->plan->nbufs);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

char *cg_cuda_emu_main(const CuUnit *u)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "/* The kernels of model \"%s\" compiled for the CPU with the CUDA emulator, and the table\n",
            u->gen.g->name ? u->gen.g->name : "model");
    fprintf(f, " * the emulated driver finds them in (runtime/rt_cuda_emu.c). */\n");
    fprintf(f, "#include \"xtc_cuda_emu.h\"\n#include \"kernels.cu\"\n\n");
    int all = u->nkernels + u->nlib;
    for (int k = 0; k < all; k++)
        fprintf(f, "static void xtc_emu_call_k%d(void **a)\n{\n    %s;\n}\n\n", k,
                k < u->nkernels ? u->emu_call[k] : cu_lib_kernels[u->lib[k - u->nkernels]].emu_call);
    if (all) {
        fprintf(f, "static const XtcEmuKernel xtc_emu_kernels[] = {\n");
        for (int k = 0; k < all; k++)
            fprintf(f, "    {\"%s\", xtc_emu_call_k%d, %d},\n",
                    k < u->nkernels ? u->plan->kernels[k].fn : cu_lib_kernels[u->lib[k - u->nkernels]].name, k,
                    k < u->nkernels ? u->sync[k] : cu_lib_kernels[u->lib[k - u->nkernels]].sync);
        fprintf(f, "};\n\n");
    }
    fprintf(f, "__attribute__((visibility(\"hidden\"))) const XtcEmuModule xtc_emu_module = {\n");
    fprintf(f, "    XTC_EMU_MAGIC, XTC_EMU_VERSION, %d, %s, xtc_emu_launch, xtc_emu_release,\n};\n", all,
            all ? "xtc_emu_kernels" : "0");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
