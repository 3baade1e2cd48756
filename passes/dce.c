/* dce.c: dead-code elimination.
 *
 * Requires: a graph that verifies.
 * Produces: the same graph without the nodes no output needs. The named leaves (inputs,
 * parameters, buffers) stay even when unused: the weights file must still load strictly, an
 * unused input is still part of the module's interface, and a parameter without a use still
 * gets its (zero) gradient. Unused constants, aranges and bucket tables go.
 * Exact: every output is computed by the very same nodes as before.
 *
 * The other passes leave the pieces of what they replaced behind (rewrite.h); this pass, last in
 * the pipeline, removes them. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "rewrite.h"

IrGraph *pass_dce(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t; /* no capability decides here */
    char *keep = pass_liveness(g, NULL);
    if (!keep) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    for (int i = 0; i < g->nnodes; i++) {
        IrOp op = g->nodes[i]->op;
        if (op == IR_INPUT || op == IR_PARAM || op == IR_BUFFER)
            keep[i] = 1;
    }
    IrGraph *out = pass_rewrite(g, NULL, NULL, keep, err, n);
    free(keep);
    return out;
}
