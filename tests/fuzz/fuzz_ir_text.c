/* fuzz_ir_text.c: libFuzzer target for the IR text parser (ir/parse.c). The input is IR text;
 * a graph that parses must verify, and print -> parse -> print must give the same text (the
 * round trip ir.h promises). Any failure of those promises aborts, so the fuzzer reports it.
 * Built as a fuzzer with XTC_FUZZ=ON; replayed over corpus/ and regress/ by fuzz_replay.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static void internal_error(const char *what, const char *detail, const char *text)
{
    fprintf(stderr, "fuzz_ir_text: %s: %s\n", what, detail);
    if (text)
        fprintf(stderr, "---- printed ----\n%s\n", text);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = malloc(size + 1); /* ir_parse reads a C string */
    if (!src)
        return 0;
    memcpy(src, data, size);
    src[size] = 0;
    char err[512];
    IrGraph *g = ir_parse(src, "fuzz.ir", err, sizeof err);
    free(src);
    if (!g)
        return 0;
    if (ir_verify(g, err, sizeof err) != 0)
        internal_error("a parsed graph does not verify", err, NULL);
    char *text = ir_print_str(g);
    ir_graph_free(g);
    if (!text)
        return 0;
    IrGraph *g2 = ir_parse(text, "printed.ir", err, sizeof err);
    if (!g2)
        internal_error("printed text does not parse", err, text);
    char *text2 = ir_print_str(g2);
    if (text2 && strcmp(text, text2) != 0)
        internal_error("print -> parse -> print differs", text2, text);
    free(text2);
    ir_graph_free(g2);
    free(text);
    return 0;
}
