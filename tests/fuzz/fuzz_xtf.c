/* fuzz_xtf.c: libFuzzer target for the .xtf front end (lexer, parser, checker, lowering). The
 * input is a source file; it goes through xtf_parse and xtf_check, and a file that checks is
 * lowered: the default model (the last statement) with five option sets, and the first two
 * statements by name with the defaults. A lowered graph must verify (the front end promises
 * verified IR, so a failure is an internal error and aborts), and the default model's printed
 * text must parse back to the same text (the promise of ir/print.c and ir/parse.c).
 * Built as a fuzzer with XTC_FUZZ=ON; replayed over corpus/ and regress/ by fuzz_replay.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "xtf.h"

static const XtLowerOpts lower_opts[] = {
    {0},
    {.train = 1, .mask = 1, .dropout = 1},
    {.src_mask = 1, .context_mask = 1, .tgt_mask = 1, .embeddings = 1},
    {.kv_cache = 1},
    {.train = 1, .mask = 1, .src_mask = 1, .context_mask = 1, .tgt_mask = 1, .embeddings = 1},
};

static void internal_error(const char *what, const char *detail, const char *text)
{
    fprintf(stderr, "fuzz_xtf: %s: %s\n", what, detail);
    if (text)
        fprintf(stderr, "---- IR ----\n%s\n", text);
    abort();
}

static void check_graph(IrGraph *g, int round_trip)
{
    char err[512];
    if (ir_verify(g, err, sizeof err) != 0)
        internal_error("lowered IR does not verify", err, NULL);
    if (!round_trip)
        return;
    char *text = ir_print_str(g);
    if (!text)
        return; /* out of memory */
    IrGraph *g2 = ir_parse(text, "lowered.ir", err, sizeof err);
    if (!g2)
        internal_error("printed IR does not parse", err, text);
    char *text2 = ir_print_str(g2);
    if (text2 && strcmp(text, text2) != 0)
        internal_error("printed IR does not round-trip", text2, text);
    free(text2);
    ir_graph_free(g2);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("fuzz.xtf", (const char *)data, size, &d);
    if (f && d.nerrors == 0)
        xtf_check(f, &d);
    if (f && d.nerrors == 0) {
        /* the last statement (the default model) with every option set, then up to two named
         * statements with the defaults; the text round trip once per input (it is the slow part) */
        int nstmts = f->nstmts < 2 ? f->nstmts : 2;
        for (int s = -1; s < nstmts; s++) {
            const char *model = s < 0 ? NULL : f->stmts[s].name;
            size_t nopts = s < 0 ? sizeof lower_opts / sizeof lower_opts[0] : 1;
            for (size_t o = 0; o < nopts; o++) {
                XtfDiag ld;
                xtf_diag_init(&ld);
                IrGraph *g = xt_lower(f, model, &lower_opts[o], &ld);
                if (g && ld.nerrors == 0)
                    check_graph(g, s < 0 && o == 0);
                else if (!g && ld.nerrors == 0)
                    internal_error("xt_lower failed without a diagnostic", model ? model : "(last)", NULL);
                ir_graph_free(g);
                xtf_diag_free(&ld);
            }
        }
    }
    xtf_free(f);
    xtf_diag_free(&d);
    return 0;
}
