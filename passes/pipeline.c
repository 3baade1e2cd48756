/* pipeline.c: the list of passes, in the order they run, and the driver that runs them with the
 * checks and dumps the options ask for (QBE's main.c: a flat list with a checker in between). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "rewrite.h"

/* The pipeline. Order matters: fold first so that simplify sees the constants it produces
 * (x * (2 - 1) -> x * 1 -> x), cse after both so the nodes they rebuild are canonical too, and
 * dce last, to sweep what the others left behind. Fusions go before dce. */
const Pass pass_pipeline[] = {
    {"fold", "constant folding of elementwise ops on constants (the interpreter's arithmetic)",
     pass_fold, 0, IR_NUM_OPS, IR_NUM_OPS},
    {"simplify", "exact identities: x*1, x+0, neg(neg x), where(c,x,x), chains of views",
     pass_simplify, 0, IR_NUM_OPS, IR_NUM_OPS},
    {"cse", "merge identical nodes; commutative operands in canonical order",
     pass_cse, 0, IR_NUM_OPS, IR_NUM_OPS},
    {"attention", "attention (+ bias, masks) and its gradient as fused ops that never store n x n",
     pass_fuse_attention, 1, IR_ATTENTION, IR_ATTENTION_GRAD},
    {"cosine_sim", "attention of l2-normalised q and k with a fixed scale: its scores' bound as the softmax maximum",
     pass_attention_bound, 1, IR_ATTENTION, IR_NUM_OPS},
    {"kv_groups", "grouped key/values (attn_kv_heads, attn_one_kv_head) read by the attention without their repeat",
     pass_kv_groups, 1, IR_ATTENTION, IR_NUM_OPS},
    {"elementwise", "chains of elementwise ops and last-axis reductions (norms, softmax) as one kernel",
     pass_fuse_elementwise, 1, IR_FUSED, IR_NUM_OPS},
    {"dce", "drop nodes no output needs (inputs, parameters and buffers stay)",
     pass_dce, 0, IR_NUM_OPS, IR_NUM_OPS},
    {NULL, NULL, NULL, 0, IR_NUM_OPS, IR_NUM_OPS},
};

int pass_count(void)
{
    int k = 0;
    while (pass_pipeline[k].name)
        k++;
    return k;
}

static const Pass *find_in(const Pass *list, const char *name)
{
    for (const Pass *p = list; name && p->name; p++)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

const Pass *pass_find(const char *name) { return find_in(pass_pipeline, name); }

static int check_name_in(const Pass *list, const char *name, char *err, size_t n)
{
    if (find_in(list, name))
        return 0;
    size_t len = (size_t)snprintf(err, n, "unknown pass '%s' (passes:", name ? name : "");
    for (const Pass *p = list; p->name && len < n; p++)
        len += (size_t)snprintf(err + len, n - len, "%s %s", p == list ? "" : ",", p->name);
    if (len < n)
        snprintf(err + len, n - len, ")");
    return -1;
}

int pass_check_name(const char *name, char *err, size_t n)
{
    return check_name_in(pass_pipeline, name, err, n);
}

void pass_list(FILE *out)
{
    for (const Pass *p = pass_pipeline; p->name; p++)
        fprintf(out, "  %-12s %s%s\n", p->name, p->summary, p->is_fusion ? " (fusion)" : "");
}

/* name is one of the comma-separated entries of list, or list is "all" */
static int in_list(const char *list, const char *name)
{
    if (!list)
        return 0;
    if (strcmp(list, "all") == 0)
        return 1;
    size_t len = strlen(name);
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ',');
        size_t k = e ? (size_t)(e - s) : strlen(s);
        if (k == len && strncmp(s, name, k) == 0)
            return 1;
        if (!e)
            break;
        s = e + 1;
    }
    return 0;
}

/* Every name the options mention must be a pass. */
static int check_options(const Pass *list, const PassOptions *o, char *err, size_t n)
{
    for (int i = 0; i < o->ndisable; i++)
        if (check_name_in(list, o->disable[i], err, n) < 0)
            return -1;
    if (o->stop_after && check_name_in(list, o->stop_after, err, n) < 0)
        return -1;
    if (o->dump_after && strcmp(o->dump_after, "all") != 0) {
        const char *s = o->dump_after;
        while (*s) {
            const char *e = strchr(s, ',');
            size_t k = e ? (size_t)(e - s) : strlen(s);
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name ? k : sizeof name - 1), s);
            if (check_name_in(list, name, err, n) < 0)
                return -1;
            if (!e)
                break;
            s = e + 1;
        }
    }
    return 0;
}

/* "" when p runs, else why not */
static const char *skipped(const PassOptions *o, const Pass *p)
{
    if (o->no_fuse && p->is_fusion)
        return "no-fuse";
    int (*supports)(IrOp) = o->target ? o->target->supports : NULL;
    if (p->is_fusion && supports && p->produces < IR_NUM_OPS && !supports(p->produces))
        return "the backend cannot lower its op";
    if (p->is_fusion && supports && p->produces_also > 0 && p->produces_also < IR_NUM_OPS &&
        !supports(p->produces_also))
        return "the backend cannot lower its op";
    for (int i = 0; i < o->ndisable; i++)
        if (strcmp(o->disable[i], p->name) == 0)
            return "disabled";
    return "";
}

/* A copy of g: the identity rewrite, so the result is always the caller's new graph. */
static IrGraph *copy_graph(IrGraph *g, char *err, size_t n)
{
    return pass_rewrite(g, NULL, NULL, NULL, err, n);
}

IrGraph *pass_run_pipeline(IrGraph *g, const PassOptions *o, char *err, size_t n)
{
    return pass_run_list(pass_pipeline, g, o, err, n);
}

IrGraph *pass_run_list(const Pass *list, IrGraph *g, const PassOptions *o, char *err, size_t n)
{
    static const PassOptions none = {0};
    if (!o)
        o = &none;
    if (check_options(list, o, err, n) < 0)
        return NULL;
    char msg[512];
    if (o->verify_each && ir_verify(g, msg, sizeof msg) < 0) {
        snprintf(err, n, "the input graph does not verify: %s", msg);
        return NULL;
    }
    IrGraph *cur = g; /* not ours until a pass has run */
    for (const Pass *p = list; p->name; p++) {
        int stop = o->stop_after && strcmp(o->stop_after, p->name) == 0;
        const char *why = skipped(o, p);
        if (!why[0]) {
            int before = cur->nnodes;
            IrGraph *next = p->run(cur, o->target, msg, sizeof msg);
            if (!next) {
                snprintf(err, n, "pass '%s': %s", p->name, msg);
                if (cur != g)
                    ir_graph_free(cur);
                return NULL;
            }
            if (cur != g)
                ir_graph_free(cur);
            cur = next;
            if (o->verify_each && ir_verify(cur, msg, sizeof msg) < 0) {
                snprintf(err, n, "after pass '%s': the graph does not verify: %s", p->name, msg);
                ir_graph_free(cur);
                return NULL;
            }
            if (o->log)
                fprintf(o->log, "pass %-12s %6d -> %6d nodes\n", p->name, before, cur->nnodes);
            if (o->dump && in_list(o->dump_after, p->name)) {
                fprintf(o->dump, "# after %s\n", p->name);
                ir_print(cur, o->dump);
            }
        } else if (o->log) {
            fprintf(o->log, "pass %-12s (skipped: %s)\n", p->name, why);
        }
        if (stop)
            break;
    }
    if (cur == g)
        cur = copy_graph(g, err, n);
    return cur;
}
