/* ir_roundtrip.c: reads IR text, parses and verifies it, prints it back (for test_models.sh). */
#include <stdio.h>
#include <stdlib.h>

#include "ir.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ir_roundtrip FILE.ir\n");
        return 2;
    }
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) {
        perror(argv[1]);
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + len, 1, cap - len - 1, fp)) > 0;) {
        len += k;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(fp);
    if (!buf)
        return 1;
    buf[len] = 0;
    char err[512];
    IrGraph *g = ir_parse(buf, argv[1], err, sizeof err);
    free(buf);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (ir_verify(g, err, sizeof err) != 0) {
        fprintf(stderr, "%s: does not verify: %s\n", argv[1], err);
        ir_graph_free(g);
        return 1;
    }
    ir_print(g, stdout);
    ir_graph_free(g);
    return 0;
}
