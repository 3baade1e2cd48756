/* run_checks.c: what `xtc run` checks in its files beyond what the safetensors reader and the
 * interpreter check, so that an error names the tensor the user wrote:
 *   - ids of an input that indexes an embedding (tokens, src) or a loss (targets) against the
 *     table's rows / the number of classes: "input 'tokens': id 70 at [0, 3] is out of range";
 *   - with --check-finite, NaN and infinity in the weights and inputs the model reads, and in
 *     the outputs it computed (a model can overflow on finite data); for the interpreter
 *     (xtc run model.xtf) and for compiled modules (xtc run model.so: the files, and the outputs
 *     and gradients it wrote). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* "[1, 0, 5]": the multi-index of flat element i of a row-major shape */
static void format_index(char *buf, size_t n, int rank, const int64_t *shape, int64_t i)
{
    int64_t idx[RT_ST_MAX_RANK] = {0};
    for (int d = rank - 1; d >= 0; d--) {
        if (shape[d] > 0) {
            idx[d] = i % shape[d];
            i /= shape[d];
        }
    }
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < rank && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, d ? ", " : "", idx[d]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* The ids of one input tensor must lie in [lo, hi) (negative ids pass when neg_ok: an ignored
 * target). Tensors that are not integers are left to the interpreter's dtype check. */
static int check_id_range(const RtStTensor *t, const char *path, int64_t hi, int neg_ok, const char *what)
{
    int64_t n = rt_st_numel(t);
    if (n <= 0 || t->dtype == RT_BOOL)
        return 0;
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    char err[256];
    if (!ids || rt_st_to_i64(t, ids, err, sizeof err) != 0) {
        free(ids);
        return 0; /* not an integer tensor: the interpreter names the dtype */
    }
    int rc = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((ids[i] < 0 && !neg_ok) || ids[i] >= hi) {
            char at[128];
            format_index(at, sizeof at, t->rank, t->shape, i);
            fprintf(stderr, "xtc: %s: input '%s': %s %" PRId64 " at %s is out of range [0, %" PRId64 ")%s\n",
                    path, t->name, what, ids[i], at, hi, neg_ok ? " (negative = ignored)" : "");
            rc = -1;
            break;
        }
    }
    free(ids);
    return rc;
}

int cli_check_ids(const IrGraph *g, const RtStFile *inputs, const char *path)
{
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if ((n->op != IR_GATHER && n->op != IR_XENT) || n->nin < 2 || n->in[1]->op != IR_INPUT)
            continue;
        const RtStTensor *t = rt_st_find(inputs, n->in[1]->s);
        const IrNode *table = n->in[0]; /* gather: the rows; cross-entropy: the classes, last */
        if (!t || table->rank < 1)
            continue;
        IrDim rows = n->op == IR_GATHER ? table->shape[0] : table->shape[table->rank - 1];
        if (!ir_dim_is_const(rows))
            continue;
        if (check_id_range(t, path, rows.c, n->op == IR_XENT, n->op == IR_GATHER ? "id" : "target") != 0)
            return -1;
    }
    return 0;
}

static const char *nonfinite_name(double x)
{
    return isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf";
}

/* First non-finite element of a float tensor of the file, or -1; *bad gets its value. */
static int64_t first_nonfinite(const RtStTensor *t, double *bad)
{
    if (t->dtype != RT_F32 && t->dtype != RT_F64 && t->dtype != RT_F16 && t->dtype != RT_BF16)
        return -1;
    int64_t n = rt_st_numel(t);
    if (n <= 0)
        return -1;
    if (t->dtype == RT_F64) { /* read as double: a finite F64 beyond float range is not NaN */
        for (int64_t i = 0; i < n; i++) {
            double x;
            memcpy(&x, (const char *)t->data + i * 8, sizeof x);
            if (!isfinite(x)) {
                *bad = x;
                return i;
            }
        }
        return -1;
    }
    float *v = malloc((size_t)n * sizeof *v);
    char err[256];
    int64_t at = -1;
    if (v && rt_st_to_f32(t, v, err, sizeof err) == 0) {
        for (int64_t i = 0; i < n && at < 0; i++)
            if (!isfinite(v[i])) {
                *bad = v[i];
                at = i;
            }
    }
    free(v);
    return at;
}

/* Prints where tensor t of the file at path holds NaN or infinity and returns -1; 0 when it is
 * finite (or not a float tensor). Outputs (what = "output") are named without the file, which
 * for a compiled module is a temporary one. */
static int report_nonfinite(const RtStTensor *t, const char *path, const char *what)
{
    double x = 0;
    int64_t at = first_nonfinite(t, &x);
    if (at < 0)
        return 0;
    char idx[128];
    format_index(idx, sizeof idx, t->rank, t->shape, at);
    if (!strcmp(what, "output"))
        fprintf(stderr, "xtc: output '%s' holds a non-finite value (%s at %s) although the weights and inputs are "
                        "finite (--check-finite)\n",
                t->name, nonfinite_name(x), idx);
    else
        fprintf(stderr, "xtc: %s: %s '%s' holds a non-finite value (%s at %s) (--check-finite)\n", path, what,
                t->name, nonfinite_name(x), idx);
    return -1;
}

int cli_check_finite_file(const IrGraph *g, const RtStFile *f, const char *path, int inputs)
{
    for (int i = 0; i < rt_st_count(f); i++) {
        const RtStTensor *t = rt_st_get(f, i);
        if (inputs && !ir_find_leaf(g, IR_INPUT, t->name))
            continue; /* the model does not read it */
        if (report_nonfinite(t, path, inputs ? "input" : "weight") != 0)
            return -1;
    }
    return 0;
}

int cli_check_finite_module_file(const XtcModule *m, const char *path, const char *what)
{
    RtStFile *f = NULL;
    char err[512];
    if (rt_st_open(path, &f, err, sizeof err) != 0)
        return 0; /* unreadable: the run itself reports that, with its context */
    int rc = 0;
    for (int i = 0; i < rt_st_count(f) && !rc; i++) {
        const RtStTensor *t = rt_st_get(f, i);
        if (!strcmp(what, "input") && xtc_module_find(m, XTC_INPUT, t->name) < 0)
            continue; /* not read: the run refuses it by name */
        rc = report_nonfinite(t, path, what);
    }
    rt_st_close(f);
    return rc;
}

int cli_check_finite_outputs(const IrGraph *g, const IrHostTensor *outs)
{
    for (int o = 0; o < g->noutputs; o++) {
        const IrHostTensor *h = &outs[o];
        if (h->dtype != IR_F32)
            continue;
        int64_t n = ir_host_numel(h);
        const float *v = h->data;
        for (int64_t i = 0; i < n; i++) {
            if (isfinite(v[i]))
                continue;
            char idx[128];
            format_index(idx, sizeof idx, h->rank, h->shape, i);
            fprintf(stderr, "xtc: output '%s' holds a non-finite value (%s at %s) although the weights and "
                            "inputs are finite (--check-finite)\n",
                    g->outputs[o].name, nonfinite_name(v[i]), idx);
            return -1;
        }
    }
    return 0;
}
