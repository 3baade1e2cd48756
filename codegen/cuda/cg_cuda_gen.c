/* cg_cuda_gen.c: the pieces every CUDA kernel is written with: the prelude of the generated
 * source (types, macros and the device helpers shared by all kernels), kernel signatures and
 * comments, dims and shapes as C expressions over the symbols, literals, launch geometry. */
#include "cg_cuda.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cu_error(CuGen *gen, const char *fmt, ...)
{
    if (gen->err[0])
        return -1; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gen->err, sizeof gen->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Names a symbol may not take in the generated code: C, C++ and CUDA words, and the locals and
 * parameters the kernels and the host code use (test_cuda checks that every local the kernels
 * declare is here), and every name of the code of kernels/flash_fwd.cuh and flash_bwd.cuh (read
 * from their text). A symbol with such a name becomes symN_NAME. */
static const char *const reserved[] = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
    "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed",
    "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool",
    "true", "false", "new", "delete", "class", "template", "this", "namespace", "using", "operator", "typename",
    "virtual", "friend", "public", "private", "protected", "asm", "threadIdx", "blockIdx", "blockDim", "gridDim",
    "warpSize", "i64", "u8", "out", "in0", "in1", "in2", "status", "i", "j", "e", "q", "r", "o", "w", "row", "rows",
    "col", "cols", "len", "inner", "outer", "total", "rest", "acc", "base", "x", "y", "x0", "x1", "x2", "la", "lb",
    "lane", "warp", "nwarps", "loss", "count", "target", "classes", "inv", "tiles_m", "tiles_n", "tile", "batch",
    "batches", "m0", "n0", "k0", "kk", "tx", "ty", "av", "bv", "As", "Bs", "A", "B", "C", "M", "N", "K", "mat_a",
    "mat_b", "mat_c", "bufs", "syms", "api", "args", "rc", "grid", "block", "st", "start", "dist", "bucket",
    "large", "th", "src", "dst", "size", "part", "mx", "sum", "n_rows", "part_loss", "part_count", "NULL", "main",
    "size1", "size2", "size3", "size4", "size5", "i0", "i1", "i2", "i3", "i4", "i5", "tr", "tc", "ix0", "ix1",
    "ix2", "ix3", "ix4", "ix5", "tiles", "int32_t", "int64_t", "uint32_t", "uint64_t", "size_t", "kth", "above",
    "at_or_above", "masked", "active", "all", "max_and_tau", "na", "tau", "tau_r", "xs", "rho", "delta", "mean",
    "sum_sq", "rank", "I", "J", "D", "E", "OC", "GC", "qi", "probs", "lsum", "score", "dot", "m_new", "alpha",
    "pj", "nj", "ni", "ci", "ii", "jj", "acc2", "row_a", "row_b", "w1", "w2", "blk", "dq", "dk", "dv", "dsum",
    "lse", "dlse", "ds", "pij", "kb", "vb", "qb", "ob", "gb", "scale", "keep", "L", "Lout", "mm", "g", "t", "wm", "wn",
    "kp", "af", "bf", "rw", "gr", "gk", "lo", "hi", "a", "c", "d", "p", "s", "H", "Qs", "Ks", "Vs", "Ps", "dp",
    "first", "fm", "ib", "ie", "ihi", "j0", "jb", "je", "tjb", "tje", "rjb", "rje", "ks", "qs", "vs", "os", "kv",
    "qv", "vv", "psum", "rmax", "sc", "seg", "z", "sm", "Gs", "Ss", "Ls", "gv", "dl",
    "fmq", "tib", "tie", "jt0", "rr", "qtiles", "ktiles", "ra", "rb", "cur", "more", "tn", "nt", "Al", "Bl", "u", "pv",
    "Nout", "v", "oc", "mm1", "colgroups", "groups", "last", "Vt", "r0", "qf", "kd", "kc", "pa", "orow",
    "dlast", "dvec", "qw", "kw", "SW", "dbl", "dlane", "dwarp", "dblk", "sw", "c0", "cb", "ce", "dm", "pp", "ms",
    "gl", "gw", "gnw", "gc", "gc0", "gm", "ga", "gs", "gx", "gvec", "kq", "bw", "aw", "gav", "Gv", "kt",
    "slot", "gn", "ok", "vec", "pair", "Dl", "Kt", "Qt", "Gt", "gf", "kf", "vf", "dka", "dva", "h", "sh", "bounded",
    "sa", "wr", "mt", "rf", "rl", "vt", "nx", "klo", "khi", "mu", "m", "l", "scratch", "pre_rows",
    "pre_e", "pre_gc", "pre_args", "bt", "rh", "items", "plane", "R",
    "chunks", "per", "ch", "j1", "istride", "step", "a0", "a1", "jv", "ov", NULL};
/* ... and the families of numbered locals (t0, v12, red3, ix2, ...) */
static const char *const reserved_numbered[] = {"t", "v", "red", "base", "pbase", "inv", "ri", "ix", "i", "in",
                                                "size", "x", "sym", "gb", "gbv", "stride", "xv", NULL};

static int word_char(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* Whether name is an identifier of text's code (comments skipped). */
static int in_code(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = text; *p;) {
        if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else {
            /* a word: an identifier, or a number (0x1fu, 1.0f: its letters are no name) */
            size_t n = 0;
            while (word_char(p[n]))
                n++;
            if (n == len && strncmp(p, name, len) == 0 && !(*p >= '0' && *p <= '9'))
                return 1;
            p += n ? n : 1;
        }
    }
    return 0;
}

int cu_name_reserved(const char *name)
{
    for (int r = 0; reserved[r]; r++)
        if (strcmp(reserved[r], name) == 0)
            return 1;
    for (int r = 0; reserved_numbered[r]; r++) {
        size_t len = strlen(reserved_numbered[r]);
        if (strncmp(name, reserved_numbered[r], len) == 0 && name[len] && strspn(name + len, "0123456789") == strlen(name + len))
            return 1;
    }
    if (strncmp(name, "xtc_", 4) == 0 || strncmp(name, "XTC_", 4) == 0 || strncmp(name, "__", 2) == 0)
        return 1;
    /* and every name of the fixed kernel bodies in whose scope the model's macros (mask, bias
     * and score texts over the sizes) expand; flash_lib.cuh's functions see no size */
    return in_code(cg_embed_flash_fwd_cuh, name) || in_code(cg_embed_flash_bwd_cuh, name);
}

void cu_gen_init(CuGen *gen, const CgPlan *plan)
{
    memset(gen, 0, sizeof *gen);
    gen->plan = plan;
    gen->g = plan->g;
    for (int s = 0; s < gen->g->nsyms; s++) {
        const char *name = gen->g->sym_name[s];
        if (cu_name_reserved(name) || strlen(name) > 30)
            snprintf(gen->sym[s], sizeof gen->sym[s], "sym%d_%.20s", s, name);
        else
            snprintf(gen->sym[s], sizeof gen->sym[s], "%s", name);
    }
}

const char *cu_mem_type(const IrNode *x)
{
    switch (x->dtype) {
    case IR_F32: return cg_keeps_f32(x) ? "float" : "xtc_fs";
    case IR_I32: return "int";
    case IR_I64: return "i64";
    default: return "u8";
    }
}

const char *cu_out_type(const CgKernel *K)
{
    if ((K->views & CG_VIEW_SUM_B) && K->node->dtype == IR_F32 && cg_sum_keeps_f32(K->node, 0))
        return "float";
    return cu_mem_type(K->node);
}

const char *cu_val_type(IrDType t)
{
    switch (t) {
    case IR_F32: return "float";
    case IR_I64: return "i64";
    default: return "int";
    }
}

char *cu_load(const IrNode *x, const char *ptr, const char *idx, char *buf, size_t n)
{
    snprintf(buf, n, x->dtype == IR_F32 ? "xtc_ld(%s, %s)" : "%s[%s]", ptr, idx);
    return buf;
}

char *cu_store(const IrNode *x, const char *ptr, const char *idx, const char *value, char *buf, size_t n)
{
    snprintf(buf, n, x->dtype == IR_F32 ? "xtc_st(%s, %s, %s)" : "%s[%s] = %s", ptr, idx, value);
    return buf;
}

/* ---- expressions ---- */

char *cu_dim(const CuGen *gen, IrDim d, char *buf, size_t n)
{
    /* positive symbol terms, then the constant, then the negative terms: "m + n - 1", "5 - n" */
    char pos[CU_EXPR] = "", neg[CU_EXPR] = "";
    size_t lp = 0, ln = 0;
    for (int s = 0; s < IR_MAXSYM; s++) {
        int k = d.k[s];
        if (!k)
            continue;
        const char *name = s < gen->g->nsyms ? gen->sym[s] : "?";
        char term[80];
        if (abs(k) == 1)
            snprintf(term, sizeof term, "%s", name);
        else
            snprintf(term, sizeof term, "%d * %s", abs(k), name);
        if (k > 0 && lp < sizeof pos)
            lp += (size_t)snprintf(pos + lp, sizeof pos - lp, "%s%s", lp ? " + " : "", term);
        else if (k < 0 && ln < sizeof neg)
            ln += (size_t)snprintf(neg + ln, sizeof neg - ln, " - %s", term);
    }
    if (!lp)
        snprintf(buf, n, "%lld%s", (long long)d.c, neg);
    else if (d.c > 0)
        snprintf(buf, n, "%s + %lld%s", pos, (long long)d.c, neg);
    else if (d.c < 0)
        snprintf(buf, n, "%s - %lld%s", pos, -(long long)d.c, neg);
    else
        snprintf(buf, n, "%s%s", pos, neg);
    return buf;
}

char *cu_dims_prod(const CuGen *gen, const IrDim *dims, int from, int to, char *buf, size_t n)
{
    long long c = 1;
    size_t len = 0;
    buf[0] = 0;
    for (int i = from; i < to; i++) {
        if (ir_dim_is_const(dims[i])) {
            c *= (long long)dims[i].c;
            continue;
        }
        char d[CU_EXPR];
        cu_dim(gen, dims[i], d, sizeof d);
        int paren = strchr(d, ' ') != NULL; /* "n + 3", "2 * b" */
        if (len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s%s%s", len ? " * " : "", paren ? "(" : "", d,
                                    paren ? ")" : "");
    }
    if (c == 0)
        snprintf(buf, n, "0");
    else if (!len)
        snprintf(buf, n, "%lld", c);
    else if (c != 1 && len < n)
        snprintf(buf + len, n - len, " * %lld", c);
    return buf;
}

char *cu_ceil_div(const char *a, long long b, char *buf, size_t n)
{
    if (b == 1)
        snprintf(buf, n, "%s", a);
    else if (strchr(a, ' '))
        snprintf(buf, n, "((%s) + %lld) / %lld", a, b - 1, b);
    else
        snprintf(buf, n, "(%s + %lld) / %lld", a, b - 1, b);
    return buf;
}

char *cu_float(double v, char *buf, size_t n)
{
    float f = (float)v;
    if (isnan(f)) {
        snprintf(buf, n, "XTC_NAN");
        return buf;
    }
    if (isinf(f)) {
        snprintf(buf, n, f > 0 ? "XTC_INF" : "(-XTC_INF)");
        return buf;
    }
    char num[48];
    snprintf(num, sizeof num, "%.9g", (double)fabsf(f));
    int has_point = strpbrk(num, ".e") != NULL;
    snprintf(buf, n, "%s%s%sf%s", signbit(f) ? "(-" : "", num, has_point ? "" : ".0", signbit(f) ? ")" : "");
    return buf;
}

/* ---- kernels ---- */

static void type_text(const CuGen *gen, const IrNode *x, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "%s[", ir_dtype_name(x->dtype));
    for (int i = 0; i < x->rank && len < n; i++) {
        char d[64];
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", ir_dim_str(gen->g, x->shape[i], d, sizeof d));
    }
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

void cu_kernel_begin(CuKernel *k)
{
    const IrNode *x = k->node;
    FILE *f = k->f;
    char t[256];
    type_text(k->gen, x, t, sizeof t);
    fprintf(f, "/* %s: %s = %s(", k->k->fn, t, ir_ops[x->op].name);
    for (int i = 0; i < x->nin; i++) {
        type_text(k->gen, x->in[i], t, sizeof t);
        fprintf(f, "%s%s", i ? ", " : "", t);
    }
    fprintf(f, ")");
    switch (x->op) {
    case IR_SUM:
    case IR_RMAX:
    case IR_CONCAT:
    case IR_SLICE: fprintf(f, " over axis %lld", (long long)x->ia[IR_IA_AXIS]); break;
    case IR_MATMUL:
        fprintf(f, "%s%s%s", x->ia[IR_IA_TRANSPOSE_B] ? ", b transposed" : "",
                k->k->views & CG_VIEW_A_T ? ", a read transposed in place" : "",
                k->k->views & CG_VIEW_SUM_B ? ", summed over the batch" : "");
        break;
    default: break;
    }
    fprintf(f, ", %d step%s */\n", k->k->uses, k->k->uses == 1 ? "" : "s");
    /* the parameters, wrapped before 110 columns under the opening parenthesis */
    char param[96];
    int indent = k->bound_blocks ? fprintf(f, "XTC_KERNEL XTC_BOUNDS(%d, %d) %s(", k->bound_threads, k->bound_blocks, k->k->fn)
                                 : fprintf(f, "XTC_KERNEL %s(", k->k->fn);
    int col = indent;
    int scratch = k->geom.pre[0] != 0; /* the step's scratch after the operands (CuGeom.pre) */
    int nparams = 1 + x->nin + scratch + k->gen->g->nsyms + 1;
    for (int p = 0; p < nparams; p++) {
        if (p == 0)
            snprintf(param, sizeof param, "%s *__restrict__ out", x == k->k->node ? cu_out_type(k->k) : cu_mem_type(x));
        else if (p <= x->nin)
            snprintf(param, sizeof param, "const %s *__restrict__ in%d", cu_mem_type(x->in[p - 1]), p - 1);
        else if (scratch && p == x->nin + 1)
            snprintf(param, sizeof param, "float *__restrict__ scratch");
        else if (p < nparams - 1)
            snprintf(param, sizeof param, "i64 %s", k->gen->sym[p - 1 - x->nin - scratch]);
        else
            snprintf(param, sizeof param, "int *__restrict__ status");
        int len = (int)strlen(param) + (p + 1 < nparams ? 2 : 1);
        if (p > 0 && col + 1 + len > 110) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (p > 0) {
            fputc(' ', f);
            col++;
        }
        col += fprintf(f, "%s%s", param, p + 1 < nparams ? "," : ")");
    }
    fprintf(f, "\n{\n");
}

void cu_kernel_end(CuKernel *k) { fprintf(k->f, "}\n"); }

void cu_geom_items(CuKernel *k, const char *items, unsigned block)
{
    cu_ceil_div(items, block, k->geom.grid_x, sizeof k->geom.grid_x);
    k->geom.block = block;
}

void cu_geom_rows(CuKernel *k, const char *rows, unsigned block)
{
    snprintf(k->geom.grid_x, sizeof k->geom.grid_x, "%s", rows);
    k->geom.block = block;
}

/* ---- the prelude ---- */

static const char *const prelude[] = {
    " * Every kernel here is compiled twice: by NVRTC for the GPU, and as C after",
    " * xtc_cuda_emu.h, which runs it on the CPU so that the tests can check it against the",
    " * reference interpreter. So the code keeps to the C subset of CUDA C.",
    " *",
    " * A kernel takes (out, in0, ..., the symbol values, status): device pointers, the sizes",
    " * the shapes depend on, and the step's status word, set when an input is out of range.",
    " * Loops stride over the grid, so any grid size computes the whole output. */",
    "#ifndef XTC_CUDA_EMULATION",
    "typedef long long i64;",
    "typedef unsigned char u8;",
    "#define XTC_KERNEL extern \"C\" __global__ void",
    "#define XTC_INLINE static __device__ __forceinline__",
    "#define XTC_INF __int_as_float(0x7f800000)",
    "#define XTC_NAN __int_as_float(0x7fffffff)",
    "#define XTC_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)",
    "#define XTC_GLOBAL __device__",
    "#else",
    "#define XTC_BOUNDS(threads, blocks)",
    "#define XTC_GLOBAL static __thread",
    "#endif",
    "/* XTC_GLOBAL: a kernel's own global memory, where its blocks leave partial results for the",
    " * last one to finish (zero when the module loads, reset by that block). The emulator, whose",
    " * blocks run one after another on the launching thread, keeps a copy per OS thread. */",
    "",
    "/* the thread's place in the grid, and the grid's size, for grid-stride loops */",
    "XTC_INLINE i64 xtc_global_id(void) { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }",
    "XTC_INLINE i64 xtc_global_size(void) { return (i64)gridDim.x * blockDim.x; }",
    "",
    "/* four consecutive floats of shared memory at a 16-byte aligned address (XTC_ALIGN16 arrays,",
    " * offsets in multiples of 4): one 128-bit load on the GPU */",
    "#ifdef XTC_CUDA_EMULATION",
    "#define XTC_ALIGN16 __attribute__((aligned(16)))",
    "XTC_INLINE void xtc_lds4(float v[4], const float *p)",
    "{",
    "    v[0] = p[0];",
    "    v[1] = p[1];",
    "    v[2] = p[2];",
    "    v[3] = p[3];",
    "}",
    "#else",
    "#define XTC_ALIGN16 __align__(16)",
    "XTC_INLINE void xtc_lds4(float v[4], const float *p)",
    "{",
    "    const float4 q = *(const float4 *)p;",
    "    v[0] = q.x;",
    "    v[1] = q.y;",
    "    v[2] = q.z;",
    "    v[3] = q.w;",
    "}",
    "#endif",
    "/* four consecutive floats of global memory, p + i 16-byte aligned: one 128-bit load on the GPU */",
    "XTC_INLINE void xtc_ld4_f32(float v[4], const float *p, i64 i)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    for (int j = 0; j < 4; j++)",
    "        v[j] = p[i + j];",
    "#else",
    "    xtc_lds4(v, p + i);",
    "#endif",
    "}",
    "/* 16 bytes from s to d, both 16-byte aligned: one 128-bit load and store on the GPU (the",
    " * vector path of the copies) */",
    "#ifdef XTC_CUDA_EMULATION",
    "#define xtc_cp16(d, s) xtc_emu_cp16((void *)(d), (const void *)(s))",
    "#else",
    "#define xtc_cp16(d, s) (*(uint4 *)(d) = *(const uint4 *)(s))",
    "#endif",
    "XTC_INLINE void xtc_ld2_f32(float v[2], const float *p, i64 i)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    v[0] = p[i];",
    "    v[1] = p[i + 1];",
    "#else",
    "    const float2 q = *(const float2 *)(p + i);",
    "    v[0] = q.x;",
    "    v[1] = q.y;",
    "#endif",
    "}",
    "XTC_INLINE void xtc_ld8_f32(float v[8], const float *p, i64 i)",
    "{",
    "    xtc_ld4_f32(v, p, i);",
    "    xtc_ld4_f32(v + 4, p, i + 4);",
    "}",
    "/* eight floats to p + i, 16-byte aligned: two 128-bit stores on the GPU (the emulator fails a",
    " * misaligned one, as the GPU faults) */",
    "XTC_INLINE void xtc_st8_f32(float *p, i64 i, const float v[8])",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    xtc_emu_check16(p + i, \"an 8-float store\");",
    "    for (int j = 0; j < 8; j++)",
    "        p[i + j] = v[j];",
    "#else",
    "    *(float4 *)(p + i) = make_float4(v[0], v[1], v[2], v[3]);",
    "    *(float4 *)(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);",
    "#endif",
    "}",
    "",
    "/* maximum and minimum propagating NaN, like torch.maximum */",
    "XTC_INLINE float xtc_fmax(float a, float b) { return a != a || b != b ? a + b : a > b ? a : b; }",
    "XTC_INLINE float xtc_fmin(float a, float b) { return a != a || b != b ? a + b : a < b ? a : b; }",
    "",
    "/* float to integer: toward zero, saturating, NaN gives 0 (as the CPU backend) */",
    "XTC_INLINE int xtc_f2i32(float x)",
    "{",
    "    return x != x ? 0 : x >= 2147483648.0f ? 2147483647 : x <= -2147483648.0f ? -2147483647 - 1 : (int)x;",
    "}",
    "XTC_INLINE i64 xtc_f2i64(float x)",
    "{",
    "    return x != x ? 0 : x >= 9223372036854775808.0f ? 9223372036854775807LL",
    "         : x <= -9223372036854775808.0f ? -9223372036854775807LL - 1 : (i64)x;",
    "}",
    "",
    "/* integer division toward zero; a zero divisor sets the status */",
    "XTC_INLINE int xtc_div_i32(int a, int b, int *status)",
    "{",
    "    if (b == 0) {",
    "        *status = 1;",
    "        return 0;",
    "    }",
    "    return b == -1 ? (int)(0u - (unsigned)a) : a / b;",
    "}",
    "XTC_INLINE i64 xtc_div_i64(i64 a, i64 b, int *status)",
    "{",
    "    if (b == 0) {",
    "        *status = 1;",
    "        return 0;",
    "    }",
    "    return b == -1 ? (i64)(0ull - (unsigned long long)a) : a / b;",
    "}",
    "",
    "/* a comes before b in descending order: NaN first, as torch.sort and torch.topk order it */",
    "XTC_INLINE int xtc_before(float a, float b) { return (a != a && b == b) || a > b; }",
    "",
    "/* attention's probability from the row's logsumexp, exp(s - lse); a row whose every score",
    " * was masked (-FLT_MAX) has lse = -FLT_MAX + log J, which rounds to -FLT_MAX: it attends",
    " * uniformly, 1 / J */",
    "XTC_INLINE float xtc_prob(float s, float lse, i64 J) { return lse <= -3.40282347e+38f ? 1.0f / (float)J : expf(s - lse); }",
    "",
    "/* sum and maximum over a warp: a butterfly, so every lane ends with the same value */",
    "XTC_INLINE float xtc_warp_sum(float v)",
    "{",
    "    for (int o = 16; o > 0; o >>= 1)",
    "        v += __shfl_xor_sync(0xffffffffu, v, o);",
    "    return v;",
    "}",
    "XTC_INLINE float xtc_warp_max(float v)",
    "{",
    "    for (int o = 16; o > 0; o >>= 1)",
    "        v = xtc_fmax(v, __shfl_xor_sync(0xffffffffu, v, o));",
    "    return v;",
    "}",
    "",
    "/* sum and maximum over a block whose size is a multiple of 32, every thread calling: warp",
    " * results through shared memory, added in the same order by every thread */",
    "XTC_INLINE float xtc_block_sum(float v)",
    "{",
    "    __shared__ float part[32];",
    "    v = xtc_warp_sum(v);",
    "    __syncthreads(); /* part[] may still be read by the previous call */",
    "    if ((threadIdx.x & 31) == 0)",
    "        part[threadIdx.x >> 5] = v;",
    "    __syncthreads();",
    "    v = 0.0f;",
    "    for (unsigned w = 0; w < blockDim.x >> 5; w++)",
    "        v += part[w];",
    "    return v;",
    "}",
    "XTC_INLINE float xtc_block_max(float v)",
    "{",
    "    __shared__ float part[32];",
    "    v = xtc_warp_max(v);",
    "    __syncthreads();",
    "    if ((threadIdx.x & 31) == 0)",
    "        part[threadIdx.x >> 5] = v;",
    "    __syncthreads();",
    "    v = -XTC_INF;",
    "    for (unsigned w = 0; w < blockDim.x >> 5; w++)",
    "        v = xtc_fmax(v, part[w]);",
    "    return v;",
    "}",
    "",
    "/* ---- 16-bit floats and tensor cores ----",
    " * bfloat16 and IEEE half as their bits in an unsigned; two of them packed in one register, the",
    " * lower-indexed value in the low half (bf16x2, f16x2). The one set of conversions of the",
    " * generated code: the 16-bit storage (xtc_ld, xtc_st below) and the tensor-core operands use",
    " * them, and runtime/rt_half.h does the same bit for bit on the host. Float to 16 bits rounds",
    " * to nearest even, subnormals kept (NaN stays a quiet NaN, halves overflow to infinity from",
    " * 65520); 16 bits to float is exact. Written with bit operations (the emulator); on the GPU",
    " * the PTX cvt instructions do the same rounding in one instruction. */",
    "XTC_INLINE unsigned xtc_bf16_bits(float x)",
    "{",
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800",
    "    unsigned short h;",
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));",
    "    return h;",
    "#else",
    "    const unsigned u = (unsigned)__float_as_int(x);",
    "    if ((u & 0x7fffffffu) > 0x7f800000u)",
    "        return (u >> 16) | 0x40u; /* quiet NaN */",
    "    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;",
    "#endif",
    "}",
    "XTC_INLINE float xtc_bf16_float(unsigned h) { return __int_as_float((int)((h & 0xffffu) << 16)); }",
    "XTC_INLINE unsigned xtc_f16_bits(float x)",
    "{",
    "#ifdef __CUDA_ARCH__",
    "    unsigned short h;",
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));",
    "    return h;",
    "#else",
    "    unsigned u = (unsigned)__float_as_int(x);",
    "    const unsigned sign = (u >> 16) & 0x8000u;",
    "    u &= 0x7fffffffu;",
    "    if (u > 0x7f800000u) /* NaN: quiet, the payload's upper bits kept */",
    "        return sign | 0x7e00u | ((u >> 13) & 0x3ffu);",
    "    if (u >= 0x477ff000u) /* 65520 and above round to infinity */",
    "        return sign | 0x7c00u;",
    "    if (u >= 0x38800000u) /* a normal half, 2^-14 and above: exponent bias 127 -> 15 */",
    "        return sign | (u + 0xfffu + ((u >> 13) & 1u) - 0x38000000u) >> 13;",
    "    if (u < 0x33000000u) /* below 2^-25 round to zero (2^-25 itself ties to the even 0 below) */",
    "        return sign;",
    "    /* a subnormal half: the value in units of 2^-24, rounded to nearest even */",
    "    const unsigned shift = 126u - (u >> 23), m = (u & 0x7fffffu) | 0x800000u;",
    "    const unsigned rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);",
    "    const unsigned q = m >> shift;",
    "    return sign | (q + (rem > half || (rem == half && (q & 1u))));",
    "#endif",
    "}",
    "XTC_INLINE float xtc_f16_float(unsigned h)",
    "{",
    "#ifdef __CUDA_ARCH__",
    "    float f;",
    "    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"((unsigned short)h));",
    "    return f;",
    "#else",
    "    const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;",
    "    if (e == 0) { /* zero and subnormals: m 2^-24, exact */",
    "        const float v = (float)m * 5.9604644775390625e-8f;",
    "        return sign ? -v : v;",
    "    }",
    "    return __int_as_float((int)(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13));",
    "#endif",
    "}",
    "XTC_INLINE unsigned xtc_pack_bf16x2(float lo, float hi) { return xtc_bf16_bits(lo) | xtc_bf16_bits(hi) << 16; }",
    "XTC_INLINE unsigned xtc_pack_f16x2(float lo, float hi) { return xtc_f16_bits(lo) | xtc_f16_bits(hi) << 16; }",
    "",
    "/* D = A B + C on tensor cores, for a whole warp: mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32",
    " * with T = bf16 or f16: A 16 x 16, B 16 x 8, C and D 16 x 8 in f32. Every lane of the warp",
    " * calls it at the same point (convergent, as the instruction requires) with its fragments laid",
    " * out as the PTX ISA specifies; with g = lane >> 2 and t = lane % 4 a lane holds",
    " *   a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]",
    " *   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]",
    " *   c, d = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]",
    " * (pairs packed as above). The blocks are one-dimensional, so lane = threadIdx.x % 32. On sm_80",
    " * and newer this is the instruction; otherwise (the emulator) the same product from the",
    " * other lanes' fragments gathered with warp shuffles: products of 16-bit values are exact in",
    " * f32, and the sum is taken in f32 over k in order (the hardware's order of summation is",
    " * unspecified, so results may differ from it by f32 rounding). */",
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800",
    "XTC_INLINE void xtc_mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4])",
    "{",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, \"",
    "                 \"{%8, %9}, {%10, %11, %12, %13};\"",
    "                 : \"=f\"(d[0]), \"=f\"(d[1]), \"=f\"(d[2]), \"=f\"(d[3])",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]), \"f\"(c[0]),",
    "                   \"f\"(c[1]), \"f\"(c[2]), \"f\"(c[3]));",
    "}",
    "XTC_INLINE void xtc_mma_m16n8k16_f16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4])",
    "{",
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, \"",
    "                 \"{%8, %9}, {%10, %11, %12, %13};\"",
    "                 : \"=f\"(d[0]), \"=f\"(d[1]), \"=f\"(d[2]), \"=f\"(d[3])",
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]), \"f\"(c[0]),",
    "                   \"f\"(c[1]), \"f\"(c[2]), \"f\"(c[3]));",
    "}",
    "#else",
    "/* Lane (g, t) needs rows g and g+8 of A, which lanes 4g .. 4g+3 hold, and columns 2t and",
    " * 2t+1 of B, which lanes 8t .. 8t+3 and 8t+4 .. 8t+7 hold: 16 shuffles of register pairs. */",
    "XTC_INLINE void xtc_mma_m16n8k16_shfl(float d[4], const unsigned a[4], const unsigned b[2], const float c[4],",
    "                                      int f16)",
    "{",
    "    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;",
    "    const unsigned long long a01 = a[0] | (unsigned long long)a[1] << 32, a23 = a[2] | (unsigned long long)a[3] << 32;",
    "    const unsigned long long b01 = b[0] | (unsigned long long)b[1] << 32;",
    "    unsigned ra[2][8], cb[2][8]; /* rows g, g+8 of A and columns 2t, 2t+1 of B: k pairs 0..7 */",
    "#ifdef XTC_CUDA_EMULATION",
    "    /* the emulator gathers each register pair of the warp in one exchange, the warp-synchronous",
    "     * step of a shuffle (the values are read before the next exchange, as the emulator requires) */",
    "    const uint64_t *x = xtc_emu_warp_exchange(0xffffffffu, XTC_EMU_OP_SHFL, a01);",
    "    for (int s = 0; s < 4; s++) {",
    "        ra[0][s] = (unsigned)x[4 * g + s];",
    "        ra[1][s] = (unsigned)(x[4 * g + s] >> 32);",
    "    }",
    "    x = xtc_emu_warp_exchange(0xffffffffu, XTC_EMU_OP_SHFL, a23);",
    "    for (int s = 0; s < 4; s++) {",
    "        ra[0][s + 4] = (unsigned)x[4 * g + s];",
    "        ra[1][s + 4] = (unsigned)(x[4 * g + s] >> 32);",
    "    }",
    "    x = xtc_emu_warp_exchange(0xffffffffu, XTC_EMU_OP_SHFL, b01);",
    "    for (int j = 0; j < 2; j++)",
    "        for (int s = 0; s < 4; s++) {",
    "            cb[j][s] = (unsigned)x[4 * (2 * t + j) + s];",
    "            cb[j][s + 4] = (unsigned)(x[4 * (2 * t + j) + s] >> 32);",
    "        }",
    "#else",
    "    for (int s = 0; s < 4; s++) { /* lane 4g + s: k pairs s and s + 4 of rows g and g+8 */",
    "        const unsigned long long lo = __shfl_sync(0xffffffffu, a01, 4 * g + s);",
    "        const unsigned long long hi = __shfl_sync(0xffffffffu, a23, 4 * g + s);",
    "        ra[0][s] = (unsigned)lo;",
    "        ra[1][s] = (unsigned)(lo >> 32);",
    "        ra[0][s + 4] = (unsigned)hi;",
    "        ra[1][s + 4] = (unsigned)(hi >> 32);",
    "    }",
    "    for (int j = 0; j < 2; j++)",
    "        for (int s = 0; s < 4; s++) { /* lane 4 (2t + j) + s: k pairs s and s + 4 of column 2t + j */",
    "            const unsigned long long v = __shfl_sync(0xffffffffu, b01, 4 * (2 * t + j) + s);",
    "            cb[j][s] = (unsigned)v;",
    "            cb[j][s + 4] = (unsigned)(v >> 32);",
    "        }",
    "#endif",
    "    float out[4];",
    "    for (int i = 0; i < 4; i++) { /* D[g + 8 (i >> 1)][2t + (i & 1)] */",
    "        const unsigned *ar = ra[i >> 1], *bc = cb[i & 1];",
    "        float acc = c[i];",
    "        for (int p = 0; p < 8; p++) {",
    "            const unsigned x = ar[p], y = bc[p];",
    "            if (f16) {",
    "                acc += xtc_f16_float(x) * xtc_f16_float(y);",
    "                acc += xtc_f16_float(x >> 16) * xtc_f16_float(y >> 16);",
    "            } else {",
    "                acc += xtc_bf16_float(x) * xtc_bf16_float(y);",
    "                acc += xtc_bf16_float(x >> 16) * xtc_bf16_float(y >> 16);",
    "            }",
    "        }",
    "        out[i] = acc;",
    "    }",
    "    for (int i = 0; i < 4; i++)",
    "        d[i] = out[i];",
    "}",
    "XTC_INLINE void xtc_mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4])",
    "{",
    "    xtc_mma_m16n8k16_shfl(d, a, b, c, 0);",
    "}",
    "XTC_INLINE void xtc_mma_m16n8k16_f16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4])",
    "{",
    "    xtc_mma_m16n8k16_shfl(d, a, b, c, 1);",
    "}",
    "#endif",
    "",
    "/* Shared-memory fragments for the tensor cores: ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16,",
    " * for a whole warp (every lane calls it at the same point). It loads N (1, 2, 4) matrices of",
    " * 8 x 8 16-bit values; lane 8 q + r gives p, the address of row r of matrix q (16 bytes,",
    " * 16-byte aligned, in shared memory; lanes past 8 N give none that is read). With g = lane >> 2",
    " * and t = lane % 4 the lane receives d[q] = M_q[g][2t, 2t+1] (the pair packed, the lower column",
    " * in the low half), or with .trans d[q] = M_q[2t][g], M_q[2t+1][g]: the fragments of the mma",
    " * above (A from [m][k] rows, B from [n][k] rows as stored, or from [k][n] rows with .trans). */",
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800",
    "XTC_INLINE unsigned xtc_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }",
    "XTC_INLINE void xtc_ldmatrix_x4(unsigned d[4], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]), \"=r\"(d[2]), \"=r\"(d[3]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x4_trans(unsigned d[4], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]), \"=r\"(d[2]), \"=r\"(d[3]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x2(unsigned d[2], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x2_trans(unsigned d[2], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x1(unsigned d[1], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\" : \"=r\"(d[0]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x1_trans(unsigned d[1], const void *p)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\" : \"=r\"(d[0]) : \"r\"(xtc_smem_addr(p)));",
    "}",
    "/* An asynchronous copy of 16 bytes, global to shared (both 16-byte aligned):",
    " * cp.async.cg.shared.global with src-size n, 16 or 0: the bytes past n are zeros and src is not",
    " * read for them (an operand's edge). A thread's copies since its last commit form a group;",
    " * xtc_cp_async_wait(n) (n a constant) waits until at most its n latest groups are pending: the",
    " * copies of the others are then in shared memory, for every thread after a __syncthreads. */",
    "XTC_INLINE void xtc_cp_async16(void *dst, const void *src, int n)",
    "{",
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(xtc_smem_addr(dst)), \"l\"(src), \"r\"(n)",
    "                 : \"memory\");",
    "}",
    "XTC_INLINE void xtc_cp_async_commit(void) { asm volatile(\"cp.async.commit_group;\" ::: \"memory\"); }",
    "#define xtc_cp_async_wait(n) asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(n) : \"memory\")",
    "/* The same through 32-bit shared-memory addresses (xtc_sa, from xtc_sa_of and byte offsets):",
    " * kernels that compute their addresses so keep 32-bit registers where generic pointers take 64.",
    " * xtc_sts128 stores 16 bytes at a 16-byte aligned shared address. */",
    "typedef unsigned xtc_sa;",
    "XTC_INLINE xtc_sa xtc_sa_of(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }",
    "XTC_INLINE void xtc_ldmatrix_x4_sa(unsigned d[4], xtc_sa a)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]), \"=r\"(d[2]), \"=r\"(d[3]) : \"r\"(a));",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x4_trans_sa(unsigned d[4], xtc_sa a)",
    "{",
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\"",
    "                 : \"=r\"(d[0]), \"=r\"(d[1]), \"=r\"(d[2]), \"=r\"(d[3]) : \"r\"(a));",
    "}",
    "XTC_INLINE void xtc_cp_async16_sa(xtc_sa dst, const void *src, int n)",
    "{",
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(dst), \"l\"(src), \"r\"(n) : \"memory\");",
    "}",
    "XTC_INLINE void xtc_sts128(xtc_sa dst, unsigned a, unsigned b, unsigned c, unsigned d)",
    "{",
    "    asm volatile(\"st.shared.v4.u32 [%0], {%1, %2, %3, %4};\" :: \"r\"(dst), \"r\"(a), \"r\"(b), \"r\"(c), \"r\"(d)",
    "                 : \"memory\");",
    "}",
    "/* x, which the compiler cannot see through: what is derived from it (addresses) is computed where",
    " * it is used, not hoisted out of a loop into registers of its own */",
    "XTC_INLINE unsigned xtc_opaque(unsigned x)",
    "{",
    "    unsigned y;",
    "    asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(y) : \"r\"(x));",
    "    return y;",
    "}",
    "#elif defined(XTC_CUDA_EMULATION)",
    "/* The emulator: the lanes' row addresses gathered in one warp exchange (the warp-synchronous",
    " * step of a shuffle; a block's shared memory is its OS thread's, so every lane can read it),",
    " * then the lane's pairs read from them. The copies are done at once (the wait has nothing left",
    " * to wait for); the barrier that must follow the wait on the GPU is still the kernel's. */",
    "XTC_INLINE void xtc_ldmatrix_emu(unsigned *d, const void *p, int count, int trans)",
    "{",
    "    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;",
    "    const uint64_t *rows = xtc_emu_warp_exchange(0xffffffffu, XTC_EMU_OP_SHFL, (uint64_t)(uintptr_t)p);",
    "    for (int q = 0; q < count; q++) {",
    "        unsigned short lo, hi;",
    "        if (trans) {",
    "            memcpy(&lo, (const char *)(uintptr_t)rows[8 * q + 2 * t] + 2 * g, 2);",
    "            memcpy(&hi, (const char *)(uintptr_t)rows[8 * q + 2 * t + 1] + 2 * g, 2);",
    "        } else {",
    "            memcpy(&lo, (const char *)(uintptr_t)rows[8 * q + g] + 4 * t, 2);",
    "            memcpy(&hi, (const char *)(uintptr_t)rows[8 * q + g] + 4 * t + 2, 2);",
    "        }",
    "        d[q] = lo | (unsigned)hi << 16;",
    "    }",
    "}",
    "XTC_INLINE void xtc_ldmatrix_x4(unsigned d[4], const void *p) { xtc_ldmatrix_emu(d, p, 4, 0); }",
    "XTC_INLINE void xtc_ldmatrix_x4_trans(unsigned d[4], const void *p) { xtc_ldmatrix_emu(d, p, 4, 1); }",
    "XTC_INLINE void xtc_ldmatrix_x2(unsigned d[2], const void *p) { xtc_ldmatrix_emu(d, p, 2, 0); }",
    "XTC_INLINE void xtc_ldmatrix_x2_trans(unsigned d[2], const void *p) { xtc_ldmatrix_emu(d, p, 2, 1); }",
    "XTC_INLINE void xtc_ldmatrix_x1(unsigned d[1], const void *p) { xtc_ldmatrix_emu(d, p, 1, 0); }",
    "XTC_INLINE void xtc_ldmatrix_x1_trans(unsigned d[1], const void *p) { xtc_ldmatrix_emu(d, p, 1, 1); }",
    "XTC_INLINE void xtc_cp_async16(void *dst, const void *src, int n)",
    "{",
    "    memset(dst, 0, 16);",
    "    if (n > 0)",
    "        memcpy(dst, src, (size_t)(n < 16 ? n : 16));",
    "}",
    "XTC_INLINE void xtc_cp_async_commit(void) {}",
    "#define xtc_cp_async_wait(n) ((void)(n))",
    "typedef uintptr_t xtc_sa; /* the emulator's shared memory is the host's: its addresses are pointers */",
    "XTC_INLINE xtc_sa xtc_sa_of(const void *p) { return (uintptr_t)p; }",
    "XTC_INLINE void xtc_ldmatrix_x4_sa(unsigned d[4], xtc_sa a) { xtc_ldmatrix_emu(d, (const void *)a, 4, 0); }",
    "XTC_INLINE void xtc_ldmatrix_x4_trans_sa(unsigned d[4], xtc_sa a) { xtc_ldmatrix_emu(d, (const void *)a, 4, 1); }",
    "XTC_INLINE void xtc_cp_async16_sa(xtc_sa dst, const void *src, int n) { xtc_cp_async16((void *)dst, src, n); }",
    "XTC_INLINE void xtc_sts128(xtc_sa dst, unsigned a, unsigned b, unsigned c, unsigned d)",
    "{",
    "    const unsigned w[4] = {a, b, c, d};",
    "    memcpy((void *)dst, w, 16);",
    "}",
    "XTC_INLINE unsigned xtc_opaque(unsigned x) { return x; }",
    "#endif",
    NULL};

/* How floating-point tensors are stored. Kernels load with xtc_ld(p, i), which gives a float,
 * compute in float, and store with xtc_st(p, i, v), which rounds once; xtc_fs is the storage
 * type. A few buffers stay float under 16-bit storage (cg_keeps_f32), so the loads and stores
 * accept both: overloads in CUDA C++, _Generic in the emulator's C. The conversions are the
 * prelude's xtc_bf16_bits/_float and xtc_f16_bits/_float (above, shared with the tensor-core
 * matmul), which runtime/rt_half.h matches bit for bit on upload and download. */
static const char *const storage_f32[] = {
    "",
    "/* storage of floating-point tensors: f32 */",
    "typedef float xtc_fs;",
    "#define xtc_ld(p, i) ((p)[i])",
    "#define xtc_st(p, i, v) ((p)[i] = (v))",
    "/* two neighbours at once, p + i 8-byte aligned: one 64-bit store on the GPU */",
    "#ifdef XTC_CUDA_EMULATION",
    "#define xtc_st2(p, i, v0, v1) ((p)[i] = (v0), (p)[(i) + 1] = (v1))",
    "#else",
    "#define xtc_st2(p, i, v0, v1) (*(float2 *)((p) + (i)) = make_float2((v0), (v1)))",
    "#endif",
    "/* eight consecutive values from p + i as floats, p + i 16-byte aligned */",
    "#define xtc_ld8(v, p, i) xtc_ld8_f32(v, p, i)",
    "#define xtc_st8(p, i, v) xtc_st8_f32(p, i, v)",
    "/* two neighbours p[i], p[i + 1] as floats, p + i aligned to their size: one 64-bit load */",
    "#define xtc_ld2(v, p, i) xtc_ld2_f32(v, p, i)",
    NULL};

static const char *const storage_bf16[] = {
    "",
    "/* storage of floating-point tensors: bf16 (the upper half of an f32), computed in f32 */",
    "typedef unsigned short xtc_fs;",
    "XTC_INLINE float xtc_fs_to_f32(unsigned short h) { return xtc_bf16_float(h); }",
    "XTC_INLINE unsigned short xtc_f32_to_fs(float f) { return (unsigned short)xtc_bf16_bits(f); }",
    NULL};

static const char *const storage_fp16[] = {
    "",
    "/* storage of floating-point tensors: IEEE fp16, computed in f32 */",
    "typedef unsigned short xtc_fs;",
    "XTC_INLINE float xtc_fs_to_f32(unsigned short h) { return xtc_f16_float(h); }",
    "XTC_INLINE unsigned short xtc_f32_to_fs(float f) { return (unsigned short)xtc_f16_bits(f); }",
    NULL};

static const char *const storage_half_access[] = {
    "/* eight consecutive 16-bit values of global memory as floats, p + i 16-byte aligned: one",
    " * 128-bit load on the GPU */",
    "XTC_INLINE void xtc_ld8_fs(float v[8], const xtc_fs *p, i64 i)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    xtc_emu_check16(p + i, \"an 8-value load\");",
    "    for (int j = 0; j < 8; j++)",
    "        v[j] = xtc_fs_to_f32(p[i + j]);",
    "#else",
    "    const uint4 q = *(const uint4 *)(p + i);",
    "    const unsigned w[4] = {q.x, q.y, q.z, q.w};",
    "#pragma unroll",
    "    for (int j = 0; j < 4; j++) {",
    "        v[2 * j] = xtc_fs_to_f32((unsigned short)(w[j] & 0xffffu));",
    "        v[2 * j + 1] = xtc_fs_to_f32((unsigned short)(w[j] >> 16));",
    "    }",
    "#endif",
    "}",
    "/* eight floats stored to p + i as 16-bit values, p + i 16-byte aligned: one 128-bit store */",
    "XTC_INLINE void xtc_st8_fs(xtc_fs *p, i64 i, const float v[8])",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    xtc_emu_check16(p + i, \"an 8-value store\");",
    "    for (int j = 0; j < 8; j++)",
    "        p[i + j] = xtc_f32_to_fs(v[j]);",
    "#else",
    "    unsigned w[4];",
    "#pragma unroll",
    "    for (int j = 0; j < 4; j++)",
    "        w[j] = xtc_f32_to_fs(v[2 * j]) | (unsigned)xtc_f32_to_fs(v[2 * j + 1]) << 16;",
    "    *(uint4 *)(p + i) = make_uint4(w[0], w[1], w[2], w[3]);",
    "#endif",
    "}",
    "/* two neighbouring 16-bit values as floats, p + i 4-byte aligned: one 32-bit load */",
    "XTC_INLINE void xtc_ld2_fs(float v[2], const xtc_fs *p, i64 i)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    v[0] = xtc_fs_to_f32(p[i]);",
    "    v[1] = xtc_fs_to_f32(p[i + 1]);",
    "#else",
    "    const unsigned w = *(const unsigned *)(p + i);",
    "    v[0] = xtc_fs_to_f32((unsigned short)(w & 0xffffu));",
    "    v[1] = xtc_fs_to_f32((unsigned short)(w >> 16));",
    "#endif",
    "}",
    "XTC_INLINE float xtc_ld_fs(const xtc_fs *p, i64 i) { return xtc_fs_to_f32(p[i]); }",
    "XTC_INLINE void xtc_st_fs(xtc_fs *p, i64 i, float v) { p[i] = xtc_f32_to_fs(v); }",
    "XTC_INLINE float xtc_ld_f32(const float *p, i64 i) { return p[i]; }",
    "XTC_INLINE void xtc_st_f32(float *p, i64 i, float v) { p[i] = v; }",
    "/* xtc_st2: two neighbours at once, p + i aligned to their size (one 32-bit store of 16-bit",
    " * values, one 64-bit store of floats on the GPU) */",
    "XTC_INLINE void xtc_st2_fs(xtc_fs *p, i64 i, float v0, float v1)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    p[i] = xtc_f32_to_fs(v0);",
    "    p[i + 1] = xtc_f32_to_fs(v1);",
    "#else",
    "    *(unsigned *)(p + i) = xtc_f32_to_fs(v0) | (unsigned)xtc_f32_to_fs(v1) << 16;",
    "#endif",
    "}",
    "XTC_INLINE void xtc_st2_f32(float *p, i64 i, float v0, float v1)",
    "{",
    "#ifdef XTC_CUDA_EMULATION",
    "    p[i] = v0;",
    "    p[i + 1] = v1;",
    "#else",
    "    *(float2 *)(p + i) = make_float2(v0, v1);",
    "#endif",
    "}",
    "#ifdef XTC_CUDA_EMULATION",
    "#define xtc_ld(p, i) _Generic((p) + 0, float *: xtc_ld_f32, const float *: xtc_ld_f32, default: xtc_ld_fs)(p, i)",
    "#define xtc_st(p, i, v) _Generic((p) + 0, float *: xtc_st_f32, default: xtc_st_fs)(p, i, v)",
    "#define xtc_st2(p, i, v0, v1) _Generic((p) + 0, float *: xtc_st2_f32, default: xtc_st2_fs)(p, i, v0, v1)",
    "#define xtc_ld8(v, p, i) _Generic((p) + 0, float *: xtc_ld8_f32, const float *: xtc_ld8_f32, default: xtc_ld8_fs)(v, p, i)",
    "#define xtc_st8(p, i, v) _Generic((p) + 0, float *: xtc_st8_f32, default: xtc_st8_fs)(p, i, v)",
    "#define xtc_ld2(v, p, i) _Generic((p) + 0, float *: xtc_ld2_f32, const float *: xtc_ld2_f32, default: xtc_ld2_fs)(v, p, i)",
    "#else",
    "XTC_INLINE float xtc_ld(const xtc_fs *p, i64 i) { return xtc_ld_fs(p, i); }",
    "XTC_INLINE float xtc_ld(const float *p, i64 i) { return p[i]; }",
    "XTC_INLINE void xtc_st(xtc_fs *p, i64 i, float v) { xtc_st_fs(p, i, v); }",
    "XTC_INLINE void xtc_st(float *p, i64 i, float v) { p[i] = v; }",
    "XTC_INLINE void xtc_st2(xtc_fs *p, i64 i, float v0, float v1) { xtc_st2_fs(p, i, v0, v1); }",
    "XTC_INLINE void xtc_st2(float *p, i64 i, float v0, float v1) { xtc_st2_f32(p, i, v0, v1); }",
    "XTC_INLINE void xtc_ld8(float v[8], const xtc_fs *p, i64 i) { xtc_ld8_fs(v, p, i); }",
    "XTC_INLINE void xtc_ld8(float v[8], const float *p, i64 i) { xtc_ld8_f32(v, p, i); }",
    "XTC_INLINE void xtc_st8(xtc_fs *p, i64 i, const float v[8]) { xtc_st8_fs(p, i, v); }",
    "XTC_INLINE void xtc_st8(float *p, i64 i, const float v[8]) { xtc_st8_f32(p, i, v); }",
    "XTC_INLINE void xtc_ld2(float v[2], const xtc_fs *p, i64 i) { xtc_ld2_fs(v, p, i); }",
    "XTC_INLINE void xtc_ld2(float v[2], const float *p, i64 i) { xtc_ld2_f32(v, p, i); }",
    "#endif",
    NULL};

void cu_prelude(FILE *f, const IrGraph *g, int nkernels, int storage)
{
    static const char *const names[] = {"f32", "bf16", "fp16"};
    fprintf(f, "/* CUDA C generated by xtc for model \"%s\": %d kernel%s, %s storage.\n *\n",
            g->name ? g->name : "model", nkernels, nkernels == 1 ? "" : "s", names[storage]);
    for (int i = 0; prelude[i]; i++)
        fprintf(f, "%s\n", prelude[i]);
    const char *const *text = storage == 1 ? storage_bf16 : storage == 2 ? storage_fp16 : storage_f32;
    for (int i = 0; text[i]; i++)
        fprintf(f, "%s\n", text[i]);
    for (int i = 0; storage && storage_half_access[i]; i++)
        fprintf(f, "%s\n", storage_half_access[i]);
}
