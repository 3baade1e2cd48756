/* ir_check_roundtrip.h: the IR text round trip both autodiff suites (test_autodiff.c,
 * test_autodiff_models.c) hold every differentiated graph to. */
#ifndef XTC_TEST_IR_CHECK_ROUNDTRIP_H
#define XTC_TEST_IR_CHECK_ROUNDTRIP_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* The text form of g reads back as the same text; both verify. */
static inline void check_roundtrip(const IrGraph *g)
{
    char err[1024];
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s", err);
    char *s1 = ir_print_str(g);
    ck_assert_ptr_nonnull(s1);
    IrGraph *g2 = ir_parse(s1, "autodiff.ir", err, sizeof err);
    ck_assert_msg(g2 != NULL, "%s", err);
    char *s2 = ir_print_str(g2);
    ck_assert_ptr_nonnull(s2);
    ck_assert_msg(strcmp(s1, s2) == 0, "%s: printed text differs after a round trip", g->name);
    ck_assert_int_eq(g2->nnodes, g->nnodes);
    ck_assert_int_eq(g2->noutputs, g->noutputs);
    ck_assert_msg(ir_verify(g2, err, sizeof err) == 0, "%s", err);
    free(s1);
    free(s2);
    ir_graph_free(g2);
}

#endif
