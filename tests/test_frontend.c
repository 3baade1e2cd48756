/* test_frontend.c: the .xtf front end (frontend/: lexer, parser, diagnostics, option table,
 * checker, accessors). The lowering (frontend/lower.c) has its own suite.
 *
 * Covers: the corpus tests/xtf_bad/ (each NAME.xtf must produce exactly the text in NAME.expect,
 * carets included; XTC_UPDATE_EXPECT=1 rewrites the .expect files after a deliberate change);
 * valid files (several models, nested constructors, references, tuples, comments, every literal
 * kind); accessors returning the table's defaults; the option table itself against the kwarg
 * list of x-transformers 0.23.0; the diagnostics format; and robustness: truncation at every
 * byte, seeded random mutations, random bytes, deep nesting, NUL bytes, huge inputs. */
#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "options.h"
#include "xtf.h"
#include "xtf_internal.h"

#include "harness.h"

#define BAD_DIR XTC_SOURCE_DIR "/tests/xtf_bad"

/* ---- helpers ---- */

/* Parses and, when parsing succeeded, checks; returns the file, diagnostics in *d. */
static XtfFile *load(const char *src, XtfDiag *d)
{
    xtf_diag_init(d);
    XtfFile *f = xtf_parse("t.xtf", src, strlen(src), d);
    ck_assert_ptr_nonnull(f);
    if (d->nerrors == 0)
        xtf_check(f, d);
    return f;
}

/* Parses and checks a file that must be free of errors. */
static XtfFile *load_ok(const char *src)
{
    XtfDiag d;
    XtfFile *f = load(src, &d);
    ck_assert_msg(d.nerrors == 0, "unexpected diagnostics:\n%s", d.text ? d.text : "");
    xtf_diag_free(&d);
    return f;
}

/* The diagnostics of a source, as text (caller frees). */
static char *diags_of(const char *src)
{
    XtfDiag d;
    XtfFile *f = load(src, &d);
    char *text = strdup(d.text ? d.text : "");
    xtf_diag_free(&d);
    xtf_free(f);
    return text;
}

static const XtfValue *stmt_value(const XtfFile *f, const char *name)
{
    const XtfStmt *s = xtf_find(f, name);
    ck_assert_msg(s != NULL, "no statement '%s'", name);
    return s->value;
}

/* ---- the corpus of bad files ---- */

static char **bad_names;
static int nbad;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void scan_bad_dir(void)
{
    DIR *dir = opendir(BAD_DIR);
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".xtf") == 0) {
            bad_names = realloc(bad_names, (size_t)(nbad + 1) * sizeof *bad_names);
            bad_names[nbad++] = strndup(e->d_name, n - 4);
        }
    }
    closedir(dir);
    qsort(bad_names, (size_t)nbad, sizeof *bad_names, cmp_str);
}

START_TEST(corpus_size)
{
    ck_assert_msg(nbad >= 35, "only %d files in %s", nbad, BAD_DIR);
}
END_TEST

START_TEST(corpus_file)
{
    const char *name = bad_names[_i];
    char path[1024], expect_path[1024], shown[256];
    snprintf(path, sizeof path, "%s/%s.xtf", BAD_DIR, name);
    snprintf(expect_path, sizeof expect_path, "%s/%s.expect", BAD_DIR, name);
    snprintf(shown, sizeof shown, "%s.xtf", name);

    size_t len, elen;
    char *src = harness_read_file(path, &len);
    ck_assert_ptr_nonnull(src);
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse(shown, src, len, &d);
    if (d.nerrors == 0)
        xtf_check(f, &d);
    const char *got = d.text ? d.text : "";
    ck_assert_msg(d.nerrors > 0, "%s: no error reported", shown);

    const char *update = getenv("XTC_UPDATE_EXPECT");
    if (update && *update == '1') {
        FILE *fp = fopen(expect_path, "wb");
        ck_assert_ptr_nonnull(fp);
        fputs(got, fp);
        fclose(fp);
    }
    char *expect = harness_read_file(expect_path, &elen);
    ck_assert_msg(expect != NULL, "%s: missing %s.expect; got:\n%s", shown, name, got);
    ck_assert_msg(strcmp(expect, got) == 0, "%s: diagnostics differ\n--- expected\n%s--- got\n%s",
                  shown, expect, got);
    free(expect);
    free(src);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

/* ---- valid files ---- */

START_TEST(design_example)
{
    XtfFile *f = load_ok("# models/gpt.xtf\n"
                         "gpt = TransformerWrapper(\n"
                         "    num_tokens = 20000,\n"
                         "    max_seq_len = 1024,\n"
                         "    attn_layers = Decoder(dim = 512, depth = 12, heads = 8, "
                         "rotary_pos_emb = true),\n"
                         ")\n");
    ck_assert_int_eq(f->nstmts, 1);
    ck_assert_str_eq(f->stmts[0].name, "gpt");
    ck_assert_int_eq(f->stmts[0].loc.line, 2);
    ck_assert_int_eq(f->stmts[0].loc.col, 1);
    ck_assert_int_eq(f->stmts[0].loc.len, 3);
    const XtfValue *gpt = f->stmts[0].value;
    ck_assert_int_eq(gpt->kind, XV_CALL);
    ck_assert_str_eq(gpt->s, "TransformerWrapper");
    ck_assert_int_eq(gpt->nargs, 3);
    ck_assert_str_eq(gpt->args[1].key, "max_seq_len");
    ck_assert_int_eq(gpt->args[1].loc.line, 4);
    ck_assert_int_eq(gpt->args[1].loc.col, 5);
    ck_assert_int_eq(xtf_int(gpt, "num_tokens"), 20000);
    const XtfValue *dec = xtf_callv(gpt, "attn_layers");
    ck_assert_ptr_nonnull(dec);
    ck_assert_str_eq(dec->s, "Decoder");
    ck_assert_int_eq(dec->nargs, 4);
    ck_assert_int_eq(xtf_int(dec, "dim"), 512);
    ck_assert_int_eq(xtf_int(dec, "depth"), 12);
    ck_assert(xtf_bool(dec, "rotary_pos_emb"));
    ck_assert(!xtf_bool(dec, "rel_pos_bias"));
    xtf_free(f);
}
END_TEST

START_TEST(several_models_and_references)
{
    XtfFile *f = load_ok("width = 256\n"
                         "layers = Decoder(dim = width, depth = 4, ff_glu = True)\n"
                         "enc = Encoder(dim = 128, depth = 2, rel_pos_bias = true)\n"
                         "alias = layers\n"
                         "lm = TransformerWrapper(num_tokens = 256, max_seq_len = 128,\n"
                         "                        attn_layers = alias)\n"
                         "lm2 = TransformerWrapper(num_tokens = 512, max_seq_len = 64,"
                         " attn_layers = layers, tie_embedding = true)\n"
                         "bert = TransformerWrapper(num_tokens = 30000, max_seq_len = 512,"
                         " attn_layers = enc, use_pos_emb = False)\n");
    ck_assert_int_eq(f->nstmts, 7);
    const XtfValue *layers = stmt_value(f, "layers");
    ck_assert_int_eq(xtf_int(layers, "dim"), 256); /* through the reference 'width' */
    ck_assert_ptr_eq(xtf_arg(layers, "dim"), stmt_value(f, "width"));
    ck_assert_ptr_eq(xtf_callv(stmt_value(f, "lm"), "attn_layers"), layers);
    ck_assert_ptr_eq(xtf_callv(stmt_value(f, "lm2"), "attn_layers"), layers);
    ck_assert_ptr_eq(stmt_value(f, "alias")->ref, layers);
    const XtfValue *bert = stmt_value(f, "bert");
    ck_assert_str_eq(xtf_callv(bert, "attn_layers")->s, "Encoder");
    ck_assert(!xtf_bool(bert, "use_pos_emb"));
    ck_assert(xtf_bool(stmt_value(f, "lm2"), "tie_embedding"));
    ck_assert_ptr_null(xtf_find(f, "nothing"));
    ck_assert_ptr_null(xtf_find(NULL, "lm"));
    xtf_free(f);
}
END_TEST

START_TEST(literal_kinds)
{
    XtfFile *f = load_ok("# comment at the top\n"
                         "a = 42 # trailing comment\n"
                         "b = -7\n"
                         "c = 0.5\n"
                         "d = .5\n"
                         "e = 1e-5\n"
                         "g = 1_000_000\n"
                         "h = -2.5e3\n"
                         "i = 5.\n"
                         "j = 'single \\'q\\' \"d\"'\n"
                         "k = \"tab\\tnl\\nback\\\\\"\n"
                         "l = True\nm = False\nn = true\no = false\n"
                         "p = None\n"
                         "q = ()\n"
                         "r = (1,)\n"
                         "s = (1, 2.5, 'x', None, (3, 4),)\n"
                         "t = [1, 2, 3]\n"
                         "u = []\n"
                         "v = (5)\n"
                         "w = [Decoder(dim = 8, depth = 1), Encoder(dim = 8, depth = 1,),]\n"
                         "x = 9223372036854775807\n"
                         "y = 1e3\n"
                         "z = 'unicode \xc2\xb5 ok'");
    ck_assert_int_eq(f->nstmts, 25);
    ck_assert_int_eq(stmt_value(f, "a")->i, 42);
    ck_assert_int_eq(stmt_value(f, "b")->i, -7);
    ck_assert_int_eq(stmt_value(f, "b")->loc.len, 2);
    ck_assert_double_eq(stmt_value(f, "c")->f, 0.5);
    ck_assert_double_eq(stmt_value(f, "d")->f, 0.5);
    ck_assert_double_eq_tol(stmt_value(f, "e")->f, 1e-5, 1e-20);
    ck_assert_int_eq(stmt_value(f, "g")->i, 1000000);
    ck_assert_double_eq(stmt_value(f, "h")->f, -2500.0);
    ck_assert_int_eq(stmt_value(f, "i")->kind, XV_FLOAT);
    ck_assert_str_eq(stmt_value(f, "j")->s, "single 'q' \"d\"");
    ck_assert_str_eq(stmt_value(f, "k")->s, "tab\tnl\nback\\");
    ck_assert_int_eq(stmt_value(f, "l")->b, 1);
    ck_assert_int_eq(stmt_value(f, "m")->b, 0);
    ck_assert_int_eq(stmt_value(f, "n")->kind, XV_BOOL);
    ck_assert_int_eq(stmt_value(f, "n")->b, 1);
    ck_assert_int_eq(stmt_value(f, "o")->b, 0);
    ck_assert_int_eq(stmt_value(f, "p")->kind, XV_NONE);
    ck_assert_int_eq(stmt_value(f, "q")->kind, XV_TUPLE);
    ck_assert_int_eq(stmt_value(f, "q")->nitems, 0);
    ck_assert_int_eq(stmt_value(f, "r")->nitems, 1);
    const XtfValue *s = stmt_value(f, "s");
    ck_assert_int_eq(s->nitems, 5);
    ck_assert_int_eq(s->items[2]->kind, XV_STRING);
    ck_assert_int_eq(s->items[4]->nitems, 2);
    ck_assert_int_eq(s->items[4]->items[1]->i, 4);
    ck_assert_int_eq(stmt_value(f, "t")->nitems, 3);
    ck_assert_int_eq(stmt_value(f, "u")->nitems, 0);
    ck_assert_int_eq(stmt_value(f, "v")->kind, XV_INT); /* (5) is 5, as in Python */
    ck_assert_int_eq(stmt_value(f, "w")->nitems, 2);
    ck_assert_str_eq(stmt_value(f, "w")->items[1]->s, "Encoder");
    ck_assert_int_eq(stmt_value(f, "x")->i, INT64_MAX);
    ck_assert_int_eq(stmt_value(f, "y")->kind, XV_FLOAT);
    ck_assert_double_eq(stmt_value(f, "y")->f, 1000.0);
    ck_assert_str_eq(stmt_value(f, "z")->s, "unicode \xc2\xb5 ok");
    xtf_free(f);
}
END_TEST

START_TEST(empty_and_blank_files)
{
    const char *srcs[] = {"", "\n\n", "# only a comment", "   \t \r\n  # x\n", "\xef\xbb"};
    for (int i = 0; i < 4; i++) {
        XtfFile *f = load_ok(srcs[i]);
        ck_assert_int_eq(f->nstmts, 0);
        xtf_free(f);
    }
    XtfDiag d;
    XtfFile *f = load(srcs[4], &d);
    ck_assert_int_gt(d.nerrors, 0);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

/* ---- accessors ---- */

START_TEST(accessor_defaults)
{
    XtfFile *f = load_ok("dec = Decoder(dim = 64, depth = 2, ff_mult = 2, attn_dropout = 0.1)\n"
                         "gpt = TransformerWrapper(num_tokens = 256, max_seq_len = 64,"
                         " attn_layers = dec)\n"
                         "enc = Encoder(dim = 64, depth = 2, rotary_pos_emb = true,"
                         " rotary_emb_dim = 32, ff_mult = 2.5)\n");
    const XtfValue *dec = stmt_value(f, "dec"), *gpt = stmt_value(f, "gpt");
    const XtfValue *enc = stmt_value(f, "enc");
    ck_assert_int_eq(xtf_int(dec, "heads"), 8);
    ck_assert_int_eq(xtf_int(dec, "attn_dim_head"), 64);
    ck_assert_int_eq(xtf_int(dec, "rel_pos_num_buckets"), 32);
    ck_assert_int_eq(xtf_int(dec, "rel_pos_max_distance"), 128);
    ck_assert(xtf_bool(dec, "pre_norm"));
    ck_assert(!xtf_bool(dec, "ff_glu"));
    ck_assert(!xtf_bool(dec, "use_rmsnorm"));
    ck_assert_double_eq(xtf_float(dec, "ff_mult"), 2.0); /* an integer where a float goes */
    ck_assert_double_eq(xtf_float(enc, "ff_mult"), 2.5);
    ck_assert_double_eq(xtf_float(dec, "attn_dropout"), 0.1);
    ck_assert_double_eq(xtf_float(dec, "ff_dropout"), 0.0);
    ck_assert(!xtf_has(dec, "rotary_emb_dim")); /* None by default */
    ck_assert(xtf_has(enc, "rotary_emb_dim"));
    ck_assert_int_eq(xtf_int(enc, "rotary_emb_dim"), 32);
    ck_assert_ptr_null(xtf_arg(dec, "heads"));
    ck_assert_ptr_nonnull(xtf_value(dec, "heads"));
    ck_assert_int_eq(xtf_value(dec, "heads")->kind, XV_INT);
    ck_assert_double_eq(xtf_float(dec, "ff_mult"), 2.0);
    ck_assert_double_eq(xtf_float(stmt_value(f, "enc"), "attn_dropout"), 0.0);
    ck_assert(xtf_bool(gpt, "use_pos_emb"));
    ck_assert(!xtf_bool(gpt, "tie_embedding"));
    ck_assert_double_eq(xtf_float(gpt, "emb_dropout"), 0.0);
    ck_assert_int_eq(xtf_int(gpt, "max_mem_len"), 0);
    ck_assert(!xtf_has(gpt, "num_memory_tokens"));
    /* Unknown keys, NULL calls and values of other kinds are harmless. */
    ck_assert_int_eq(xtf_int(dec, "no_such_option"), 0);
    ck_assert_ptr_null(xtf_value(dec, "no_such_option"));
    ck_assert_int_eq(xtf_int(NULL, "dim"), 0);
    ck_assert_double_eq(xtf_float(NULL, "dim"), 0.0);
    ck_assert_int_eq(xtf_bool(NULL, "dim"), 0);
    ck_assert_ptr_null(xtf_callv(NULL, "attn_layers"));
    ck_assert_ptr_null(xtf_callv(dec, "dim"));
    ck_assert_ptr_null(xtf_string(dec, "dim"));
    ck_assert_ptr_null(xtf_arg(xtf_value(dec, "dim"), "dim")); /* not a call */
    xtf_free(f);
}
END_TEST

START_TEST(accessor_routed_defaults)
{
    /* XTransformer's routed keys have defaults. */
    XtfDiag d;
    XtfFile *f = load("xt = XTransformer(dim = 64, enc_num_tokens = 10, enc_max_seq_len = 8,"
                      " enc_depth = 1, dec_num_tokens = 10, dec_max_seq_len = 8, dec_depth = 2,"
                      " dec_heads = 2)\n", &d);
    ck_assert_int_eq(d.nerrors, 0);
    const XtfValue *xt = stmt_value(f, "xt");
    ck_assert_int_eq(xtf_int(xt, "enc_heads"), 8);
    ck_assert_int_eq(xtf_int(xt, "dec_heads"), 2);
    ck_assert_int_eq(xtf_int(xt, "dec_depth"), 2);
    ck_assert_int_eq(xtf_int(xt, "enc_attn_dim_head"), 64);
    ck_assert(!xtf_bool(xt, "tie_token_emb"));
    ck_assert_ptr_null(xtf_value(xt, "heads"));
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

/* ---- the option table ---- */

/* Keyword arguments of x-transformers 0.23.0 (XT-SEMANTICS.md section 2). */
static const char *const wrapper_kwargs[] = {
    "num_tokens", "max_seq_len", "attn_layers", "emb_dim", "max_mem_len", "shift_mem_down",
    "emb_dropout", "num_memory_tokens", "tie_embedding", "use_pos_emb"};
static const char *const layer_kwargs[] = {
    "dim", "depth", "heads", "use_scalenorm", "use_rmsnorm", "use_rezero", "alibi_pos_bias",
    "alibi_num_heads", "alibi_learned", "rel_pos_bias", "rel_pos_num_buckets",
    "rel_pos_max_distance", "position_infused_attn", "rotary_pos_emb", "rotary_emb_dim",
    "custom_layers", "sandwich_coef", "par_ratio", "residual_attn", "cross_residual_attn",
    "macaron", "pre_norm", "gate_residual", "scale_residual", "shift_tokens", "sandwich_norm",
    "use_qk_norm_attn", "qk_norm_attn_seq_len", "zero_init_branch_output", "cross_attend",
    "only_cross",
    /* Attention */
    "attn_dim_head", "attn_talking_heads", "attn_head_scale", "attn_collab_heads",
    "attn_collab_compression", "attn_sparse_topk", "attn_use_entmax15", "attn_num_mem_kv",
    "attn_dropout", "attn_on_attn", "attn_gate_values", "attn_zero_init_output",
    "attn_max_attend_past", "attn_qk_norm", "attn_scale_init_value",
    /* FeedForward */
    "ff_mult", "ff_glu", "ff_relu_squared", "ff_post_act_ln", "ff_dropout", "ff_zero_init_output"};
/* Supported from the start (the lowering's first milestone). */
static const char *const supported[] = {
    "TransformerWrapper.num_tokens", "TransformerWrapper.max_seq_len",
    "TransformerWrapper.attn_layers", "TransformerWrapper.tie_embedding",
    "TransformerWrapper.use_pos_emb", "TransformerWrapper.emb_dropout", "Decoder.dim",
    "Decoder.depth", "Decoder.heads", "Decoder.attn_dim_head", "Decoder.ff_mult",
    "Decoder.ff_glu", "Decoder.rotary_pos_emb", "Decoder.rotary_emb_dim", "Decoder.rel_pos_bias",
    "Decoder.rel_pos_num_buckets", "Decoder.rel_pos_max_distance", "Decoder.use_scalenorm",
    "Decoder.use_rmsnorm", "Decoder.pre_norm", "Decoder.attn_dropout", "Decoder.ff_dropout"};

static int count_visit(void *arg, const char *key, const XtfOption *o)
{
    (void)key;
    (void)o;
    ++*(int *)arg;
    return 0;
}

static int status_visit(void *arg, const char *key, const XtfOption *o)
{
    const char *ctor = strcmp(arg, "Encoder") == 0 ? "Decoder" : arg; /* same options */
    char full[160];
    snprintf(full, sizeof full, "%s.%s", ctor, key);
    int listed = 0;
    for (size_t i = 0; i < sizeof supported / sizeof *supported; i++)
        listed |= strcmp(supported[i], full) == 0;
    /* Features land over time (their rows flip to SUPPORTED); these must never regress. */
    ck_assert_msg(!listed || o->status == XTF_SUPPORTED, "%s is no longer SUPPORTED", full);
    return 0;
}

/* every option of every constructor is implemented or refused with a reason: nothing of
 * x-transformers 0.23.0 is left "not supported yet" */
static int implemented_visit(void *arg, const char *key, const XtfOption *o)
{
    ck_assert_msg(o->status != XTF_NOT_YET, "%s.%s is not supported yet", (const char *)arg, key);
    return 0;
}

START_TEST(option_table)
{
    for (size_t i = 0; i < sizeof wrapper_kwargs / sizeof *wrapper_kwargs; i++)
        ck_assert_msg(xtf_option_find(xtf_ctor_find("TransformerWrapper"), wrapper_kwargs[i]),
                      "TransformerWrapper lacks %s", wrapper_kwargs[i]);
    const char *layer_ctors[] = {"Decoder", "Encoder", "CrossAttender"};
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < sizeof layer_kwargs / sizeof *layer_kwargs; i++)
            ck_assert_msg(xtf_option_find(xtf_ctor_find(layer_ctors[c]), layer_kwargs[i]),
                          "%s lacks %s", layer_ctors[c], layer_kwargs[i]);
    /* XTransformer routes enc_X / dec_X to AttentionLayers options (not dim). */
    const XtfCtor *xt = xtf_ctor_find("XTransformer");
    ck_assert_ptr_nonnull(xtf_option_find(xt, "enc_num_tokens"));
    ck_assert_ptr_nonnull(xtf_option_find(xt, "dec_attn_talking_heads"));
    ck_assert_ptr_nonnull(xtf_option_find(xt, "enc_num_memory_tokens"));
    ck_assert_ptr_null(xtf_option_find(xt, "dec_num_memory_tokens"));
    ck_assert_ptr_null(xtf_option_find(xt, "num_tokens"));
    ck_assert_int_eq(xtf_option_find(xt, "enc_dim")->status, XTF_FORBIDDEN);

    for (int c = 0; c < XTF_C_NUM; c++) {
        const XtfCtor *ctor = &xtf_ctors[c];
        ck_assert_int_eq(ctor->id, c);
        ck_assert_ptr_eq(xtf_ctor_find(ctor->name), ctor);
        /* Unique keys, required means no default, every FORBIDDEN row says why. */
        int n = 0;
        xtf_option_each(ctor, count_visit, &n);
        for (int g = 0; ctor->groups[g]; g++)
            for (const XtfOption *o = ctor->groups[g]; o->name; o++) {
                ck_assert_ptr_eq(xtf_option_find(ctor, o->name), o);
                ck_assert(o->status != XTF_FORBIDDEN || o->why);
                ck_assert(o->type != XTF_T_LAYERS || o->accepts);
                ck_assert(!o->def || o->type == XTF_T_LAYERS || o->def->kind == XV_NONE ||
                          o->def->kind == XV_INT || o->def->kind == XV_FLOAT ||
                          o->def->kind == XV_BOOL);
            }
        ck_assert(ctor->status != XTF_FORBIDDEN || ctor->why);
        ck_assert(ctor->status != XTF_NOT_YET);
        xtf_option_each(ctor, implemented_visit, (void *)ctor->name);
        if (ctor->status == XTF_SUPPORTED)
            xtf_option_each(ctor, status_visit, (void *)ctor->name);
    }
    ck_assert_ptr_null(xtf_ctor_find("Transformer"));
    ck_assert_ptr_null(xtf_ctor_find(NULL));
    char buf[128];
    ck_assert_str_eq(xtf_option_type_name(xtf_option_find(xtf_ctor_find("TransformerWrapper"),
                                                          "attn_layers"), buf, sizeof buf),
                     "Decoder, Encoder or CrossAttender");
    ck_assert_str_eq(xtf_option_type_name(xtf_option_find(xtf_ctor_find("Decoder"),
                                                          "rotary_emb_dim"), buf, sizeof buf),
                     "an integer or None");
}
END_TEST

START_TEST(edit_distance)
{
    ck_assert_int_eq(xtf_edit_distance("depth", "depth", 3), 0);
    ck_assert_int_eq(xtf_edit_distance("detph", "depth", 3), 1); /* transposition */
    ck_assert_int_eq(xtf_edit_distance("dpeth", "depth", 3), 1);
    ck_assert_int_eq(xtf_edit_distance("rotary_pos_embb", "rotary_pos_emb", 3), 1);
    ck_assert_int_eq(xtf_edit_distance("Decoder", "decoder", 3), 0);
    ck_assert_int_eq(xtf_edit_distance("abc", "xyz", 2), 3);
    ck_assert_int_eq(xtf_edit_distance("", "ab", 5), 2);
    ck_assert_int_eq(xtf_typo_limit("dim"), 1);
    ck_assert_int_eq(xtf_typo_limit("depth"), 2);
    ck_assert_int_eq(xtf_typo_limit("rotary_pos_embb"), 5);
}
END_TEST

/* ---- diagnostics ---- */

START_TEST(diag_format)
{
    XtfDiag d;
    xtf_diag_init(&d);
    const char *src = "a = 1\n\tb\xc2\xb5 = x  # c\n";
    XtfFile *f = xtf_parse("p.xtf", src, strlen(src), &d);
    xtf_diag_free(&d); /* the parser's complaint about the µ is not what is tested here */
    xtf_diag_init(&d);
    xtf_diag_error(&d, f, (XtfLoc){2, 8, 1}, "bad %s", "x");
    xtf_diag_note(&d, f, (XtfLoc){2, 2, 3}, "here");
    xtf_diag_note(&d, f, (XtfLoc){0, 0, 0}, "no place");
    xtf_diag_error(&d, f, (XtfLoc){9, 1, 1}, "past the end");
    xtf_diag_error(&d, NULL, (XtfLoc){1, 1, 1}, "no file");
    ck_assert_str_eq(d.text, "p.xtf:2:8: error: bad x\n"
                             "\tb\xc2\xb5 = x  # c\n"
                             "\t     ^\n"
                             "p.xtf:2:2: note: here\n"
                             "\tb\xc2\xb5 = x  # c\n"
                             "\t^~\n"
                             "p.xtf: note: no place\n"
                             "p.xtf:9:1: error: past the end\n"
                             "error: no file\n");
    ck_assert_int_eq(d.nerrors, 3);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

START_TEST(diag_max_errors)
{
    XtfDiag d;
    xtf_diag_init(&d);
    d.max_errors = 2;
    const char *src = "a = $\nb = $\nc = $\nd = $\n";
    XtfFile *f = xtf_parse("m.xtf", src, strlen(src), &d);
    ck_assert_int_ge(d.nerrors, 4);
    const char *last = strstr(d.text, "too many errors\n");
    ck_assert_ptr_nonnull(last);
    ck_assert_str_eq(last, "too many errors\n");
    ck_assert_ptr_null(strstr(d.text, "m.xtf:3:"));
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

START_TEST(missing_file)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse_file("/nonexistent/dir/model.xtf", &d);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(d.nerrors, 1);
    ck_assert_str_eq(d.text, "/nonexistent/dir/model.xtf: error: cannot read file: "
                             "No such file or directory\n");
    xtf_free(f);
    xtf_diag_free(&d);

    xtf_diag_init(&d);
    f = xtf_parse_file(BAD_DIR "/chk_range_depth.xtf", &d);
    ck_assert_int_eq(d.nerrors, 0);
    ck_assert_int_eq(f->nstmts, 1);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

/* ---- robustness ---- */

static const char *valid_model =
    "# a model with most of the syntax\n"
    "width = 64\n"
    "dec = Decoder(dim = width, depth = 2, heads = 4, attn_dim_head = 32,\n"
    "              rotary_pos_emb = True, ff_glu = true, ff_mult = 2.5, attn_dropout = .1)\n"
    "gpt = TransformerWrapper(\n"
    "    num_tokens = 256, max_seq_len = 1_024,  # tokens\n"
    "    attn_layers = dec, emb_dropout = 0.0,\n"
    "    tie_embedding = False,\n"
    ")\n"
    "enc = Encoder(dim = 32, depth = 1, rel_pos_bias = true, rel_pos_num_buckets = 16)\n"
    "shape = (1, -2, [3, 'x', \"y\\n\"], None,)\n"
    "bert = TransformerWrapper(num_tokens = 30522, max_seq_len = 512, attn_layers = enc)\n";

static void parse_and_check(const char *src, size_t len)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("fuzz.xtf", src, len, &d);
    ck_assert_ptr_nonnull(f);
    if (d.nerrors == 0)
        xtf_check(f, &d);
    else
        xtf_check(f, &d); /* the checker must also survive partial trees */
    for (int i = 0; i < f->nstmts; i++) {
        const XtfValue *v = f->stmts[i].value;
        (void)xtf_int(v, "dim");
        (void)xtf_callv(v, "attn_layers");
        (void)xtf_float(xtf_callv(v, "attn_layers"), "ff_mult");
    }
    ck_assert((d.nerrors == 0) == (d.text == NULL || d.text[0] == '\0'));
    xtf_free(f);
    xtf_diag_free(&d);
}

/* A TransformerWrapper around the layers (a constructor call), checked and lowered: the graph, or
 * NULL with the messages in d (which the caller frees). */
static IrGraph *lower_layers(const char *layers, XtfDiag *d)
{
    char src[512];
    snprintf(src, sizeof src, "m = TransformerWrapper(num_tokens = 8, max_seq_len = 8, attn_layers = %s)\n", layers);
    XtfFile *f = load_ok(src);
    xtf_diag_init(d);
    IrGraph *g = xt_lower(f, NULL, NULL, d);
    xtf_free(f);
    return g;
}

/* What the lowering refuses with a message where x-transformers 0.23.0 would build another
 * model or crash: a shift_tokens tuple that is not one per layer (zip() would drop layers), more
 * shift chunks than features (split(0)). */
START_TEST(lowering_refusals)
{
    static const struct {
        const char *layers, *message;
    } cases[] = {
        {"Decoder(dim = 16, depth = 2, shift_tokens = (1, 0, 1))", "shift_tokens has 3 values for 4 layers (afaf)"},
        {"Encoder(dim = 4, depth = 1, shift_tokens = 2)", "shift_tokens 2 splits dim 4 into 5 chunks"},
        {"Decoder(dim = 16, depth = 1, attn_on_attn = true, attn_zero_init_output = true)",
         "attn_on_attn together with zero_init_output"},
        {"Decoder(dim = 16, depth = 1, attn_collab_heads = true, attn_num_mem_kv = 2)",
         "attn_collab_heads together with attn_num_mem_kv"},
        {"Decoder(dim = 16, depth = 1, heads = 2, attn_dim_head = 32, attn_collab_heads = true, rotary_pos_emb = true)",
         "less than the rotary dimension 32"},
        {"Decoder(dim = 16, depth = 1, heads = 1, attn_dim_head = 2, attn_collab_heads = true)",
         "leaves q and k no width"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        XtfDiag d;
        IrGraph *g = lower_layers(cases[i].layers, &d);
        ck_assert_msg(g == NULL, "case %zu lowered", i);
        ck_assert_msg(d.text && strstr(d.text, cases[i].message), "case %zu: expected '%s' in:\n%s", i,
                      cases[i].message, d.text ? d.text : "");
        xtf_diag_free(&d);
    }
}
END_TEST

/* The initialisation rules the lowering records (ir.h IrInit), one per weight: x-transformers
 * 0.23.0's Linear, Embedding and norm defaults, the constants it sets by hand (gate_values,
 * head_scale, scale_residual, Rezero), GRU gating's and talking heads' torch defaults, ALiBi's
 * learned slopes, rotary's inverse frequencies; zero_init_branch_output over a Linear's default;
 * qk_norm's log-temperature at -log(log2(L^2 - L)) under use_qk_norm_attn, scale_init_value
 * otherwise, -3 by default. */
START_TEST(initial_values)
{
    static const struct {
        const char *layers, *name;
        IrInitKind kind;
        double value;
    } cases[] = {
        {"Decoder(dim = 16, depth = 2, zero_init_branch_output = true)", "attn_layers.layers.3.1.net.3.bias", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 2, zero_init_branch_output = true)", "attn_layers.layers.3.1.net.0.0.bias", IR_INIT_UNIFORM, 0.25},
        {"Decoder(dim = 16, depth = 1, attn_zero_init_output = true)", "attn_layers.layers.0.1.to_out.weight", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 1, ff_zero_init_output = true)", "attn_layers.layers.1.1.net.3.weight", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 1, use_qk_norm_attn = true, qk_norm_attn_seq_len = 32)",
         "attn_layers.layers.0.1.scale", IR_INIT_CONST, -2.297994202000669},
        {"Decoder(dim = 16, depth = 1, attn_qk_norm = true, attn_scale_init_value = -1.5)",
         "attn_layers.layers.0.1.scale", IR_INIT_CONST, -1.5},
        {"Decoder(dim = 16, depth = 1, attn_qk_norm = true)", "attn_layers.layers.0.1.scale", IR_INIT_CONST, -3},
        {"Decoder(dim = 16, depth = 1)", "token_emb.weight", IR_INIT_NORMAL, 0.35355339059327379}, /* sqrt(2/16) */
        {"Decoder(dim = 16, depth = 1)", "pos_emb.emb.weight", IR_INIT_NORMAL, 1},
        {"Decoder(dim = 16, depth = 1)", "attn_layers.layers.0.1.to_q.weight", IR_INIT_UNIFORM, 0.25},
        {"Decoder(dim = 16, depth = 1)", "attn_layers.layers.0.0.0.weight", IR_INIT_CONST, 1},
        {"Decoder(dim = 16, depth = 1)", "attn_layers.layers.0.0.0.bias", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 1)", "to_logits.bias", IR_INIT_UNIFORM, 0.25},
        {"Decoder(dim = 16, depth = 1, attn_gate_values = true)", "attn_layers.layers.0.1.to_v_gate.weight", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 1, attn_gate_values = true)", "attn_layers.layers.0.1.to_v_gate.bias", IR_INIT_CONST, 1},
        {"Decoder(dim = 16, depth = 1, attn_head_scale = true)", "attn_layers.layers.0.1.head_scale_params", IR_INIT_CONST, 1},
        {"Decoder(dim = 16, depth = 1, scale_residual = true)", "attn_layers.layers.0.2.residual_scale", IR_INIT_CONST, 1},
        {"Decoder(dim = 16, depth = 1, use_rezero = true)", "attn_layers.layers.0.1.g", IR_INIT_CONST, 0},
        {"Decoder(dim = 16, depth = 1, use_scalenorm = true)", "attn_layers.layers.0.0.0.g", IR_INIT_CONST, 1},
        {"Decoder(dim = 16, depth = 1, gate_residual = true)", "attn_layers.layers.0.2.gru.bias_hh", IR_INIT_UNIFORM, 0.25},
        {"Decoder(dim = 16, depth = 1, heads = 4, attn_talking_heads = true)",
         "attn_layers.layers.0.1.pre_softmax_talking_heads.weight", IR_INIT_UNIFORM, 0.5},
        {"Decoder(dim = 16, depth = 1, attn_num_mem_kv = 2)", "attn_layers.layers.0.1.mem_k", IR_INIT_NORMAL, 1},
        {"Decoder(dim = 16, depth = 1, rotary_pos_emb = true)", "attn_layers.rotary_pos_emb.inv_freq", IR_INIT_INV_FREQ, 10000},
        {"Encoder(dim = 16, depth = 1, alibi_pos_bias = true, alibi_learned = true)",
         "attn_layers.rel_pos.learned_logslopes_future", IR_INIT_ALIBI, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        XtfDiag d;
        IrGraph *g = lower_layers(cases[i].layers, &d);
        ck_assert_msg(g != NULL, "case %zu: %s", i, d.text ? d.text : "");
        int leaves = 0;
        for (int k = 0; k < g->nnodes; k++)
            leaves += g->nodes[k]->op == IR_PARAM || g->nodes[k]->op == IR_BUFFER;
        ck_assert_int_eq(g->ninits, leaves); /* every weight has its rule */
        const IrInit *r = ir_find_init(g, ir_find_leaf(g, IR_PARAM, cases[i].name));
        if (!r)
            r = ir_find_init(g, ir_find_leaf(g, IR_BUFFER, cases[i].name));
        ck_assert_msg(r != NULL, "case %zu: no rule for %s", i, cases[i].name);
        ck_assert_msg(r->kind == cases[i].kind, "case %zu: %s starts by %s", i, cases[i].name, ir_init_name(r->kind));
        ck_assert_double_eq_tol(r->value, cases[i].value, 1e-12);
        ir_graph_free(g);
        xtf_diag_free(&d);
    }
}
END_TEST

START_TEST(valid_model_is_valid)
{
    XtfFile *f = load_ok(valid_model);
    ck_assert_int_eq(f->nstmts, 6);
    xtf_free(f);
}
END_TEST

START_TEST(truncation_at_every_byte)
{
    size_t n = strlen(valid_model);
    for (size_t cut = 0; cut <= n; cut++)
        parse_and_check(valid_model, cut);
}
END_TEST

static uint64_t rng_state;
static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

START_TEST(random_mutations)
{
    static const char alphabet[] = "()[]=,-_.'\"#\\\n\t 0123456789eExyzTrueFalseNone\x00\xff\xc3";
    size_t n = strlen(valid_model);
    char *buf = malloc(n + 64);
    rng_state = 20240611;
    for (int round = 0; round < 600; round++) {
        memcpy(buf, valid_model, n);
        size_t len = n;
        int edits = 1 + (int)(rng() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = rng() % (len + 1);
            char c = alphabet[rng() % (sizeof alphabet - 1)];
            switch (rng() % 4) {
            case 0: /* replace */
                if (at < len)
                    buf[at] = c;
                break;
            case 1: /* insert */
                if (len < n + 60) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = c;
                    len++;
                }
                break;
            case 2: /* delete */
                if (at < len) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            default: /* truncate */
                len = at;
                break;
            }
        }
        parse_and_check(buf, len);
    }
    free(buf);
}
END_TEST

START_TEST(random_bytes)
{
    char buf[512];
    rng_state = 7;
    for (int round = 0; round < 200; round++) {
        size_t len = rng() % sizeof buf;
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)(rng() & 0xff);
        parse_and_check(buf, len);
    }
}
END_TEST

START_TEST(deep_nesting)
{
    size_t depth = 100000;
    char *src = malloc(4 * depth + 16);
    strcpy(src, "x = ");
    size_t len = 4;
    for (size_t i = 0; i < depth; i++) {
        src[len++] = '(';
        src[len++] = i % 2 ? '[' : '(';
    }
    src[len] = '\0';
    char *text = diags_of(src);
    ck_assert_ptr_nonnull(strstr(text, "brackets nested too deeply"));
    free(text);

    /* Deep but within the limit: nested tuples and calls parse and check. */
    len = 4;
    for (int i = 0; i < 200; i++)
        src[len++] = '[';
    for (int i = 0; i < 200; i++)
        src[len++] = ']';
    src[len] = '\0';
    XtfFile *f = load_ok(src);
    xtf_free(f);
    free(src);

    /* 600 nested constructor calls: the checker recurses through all of them. */
    src = malloc(600 * 12 + 16);
    len = (size_t)sprintf(src, "x = ");
    for (int i = 0; i < 600; i++)
        len += (size_t)sprintf(src + len, "A(a = ");
    src[len++] = '1';
    for (int i = 0; i < 600; i++)
        src[len++] = ')';
    src[len] = '\0';
    XtfDiag d;
    f = load(src, &d);
    ck_assert_int_eq(d.nerrors, 600);
    ck_assert_ptr_nonnull(strstr(d.text, "unknown constructor 'A'"));
    xtf_free(f);
    xtf_diag_free(&d);
    free(src);
}
END_TEST

START_TEST(nul_bytes_and_long_lines)
{
    const char src[] = "a = 1\nb = \0 2\n";
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("n.xtf", src, sizeof src - 1, &d);
    ck_assert_int_eq(d.nerrors, 1);
    ck_assert_str_eq(d.text, "n.xtf:2:5: error: NUL byte in the source (byte 10); a .xtf source is text\nb =   2\n    ^\n");
    xtf_free(f);
    xtf_diag_free(&d);
    /* in a comment too: the text would end there for everything that reads it as a string */
    const char com[] = "a = 1\n# x\0y\n";
    xtf_diag_init(&d);
    f = xtf_parse("c.xtf", com, sizeof com - 1, &d);
    ck_assert_int_eq(d.nerrors, 1);
    ck_assert_ptr_nonnull(strstr(d.text, "c.xtf:2:4: error: NUL byte in the source"));
    xtf_free(f);
    xtf_diag_free(&d);

    /* A 100 kB line: the error is reported, the line is not echoed. */
    size_t n = 100000;
    char *big = malloc(n + 16);
    memcpy(big, "x = ", 4);
    memset(big + 4, ' ', n);
    memcpy(big + 4 + n, "$\n", 3);
    char *text = diags_of(big);
    ck_assert_str_eq(text, "t.xtf:1:100005: error: unexpected character '$'\n"
                           "t.xtf:1:4: error: expected a value before end of file\n");
    free(text);
    free(big);
}
END_TEST

START_TEST(many_statements)
{
    /* 20000 statements referring to the previous one: linear enough to be quick. */
    size_t cap = 20000 * 40;
    char *src = malloc(cap);
    size_t len = (size_t)sprintf(src, "s0 = Decoder(dim = 8, depth = 1)\n");
    for (int i = 1; i < 20000; i++)
        len += (size_t)sprintf(src + len, "s%d = s%d\n", i, i - 1);
    XtfFile *f = load_ok(src);
    ck_assert_int_eq(f->nstmts, 20000);
    ck_assert_ptr_eq(stmt_value(f, "s19999")->ref, f->stmts[0].value);
    xtf_free(f);
    free(src);
}
END_TEST

static Suite *frontend_suite(void)
{
    Suite *s = suite_create("frontend");
    TCase *tc = tcase_create("corpus");
    tcase_add_test(tc, corpus_size);
    if (nbad > 0)
        tcase_add_loop_test(tc, corpus_file, 0, nbad);
    suite_add_tcase(s, tc);

    tc = tcase_create("valid");
    tcase_add_test(tc, design_example);
    tcase_add_test(tc, several_models_and_references);
    tcase_add_test(tc, literal_kinds);
    tcase_add_test(tc, empty_and_blank_files);
    tcase_add_test(tc, accessor_defaults);
    tcase_add_test(tc, accessor_routed_defaults);
    tcase_add_test(tc, option_table);
    tcase_add_test(tc, edit_distance);
    suite_add_tcase(s, tc);

    tc = tcase_create("diagnostics");
    tcase_add_test(tc, diag_format);
    tcase_add_test(tc, diag_max_errors);
    tcase_add_test(tc, missing_file);
    suite_add_tcase(s, tc);

    tc = tcase_create("robustness");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, valid_model_is_valid);
    tcase_add_test(tc, lowering_refusals);
    tcase_add_test(tc, truncation_at_every_byte);
    tcase_add_test(tc, random_mutations);
    tcase_add_test(tc, random_bytes);
    tcase_add_test(tc, deep_nesting);
    tcase_add_test(tc, nul_bytes_and_long_lines);
    tcase_add_test(tc, many_statements);
    tcase_add_test(tc, initial_values);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    scan_bad_dir();
    SRunner *sr = srunner_create(frontend_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    for (int i = 0; i < nbad; i++)
        free(bad_names[i]);
    free(bad_names);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
