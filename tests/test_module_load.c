/* test_module_load.c: what xtc_module_load checks before it runs a module's code (runtime/
 * rt_loadcheck.c): a copy of a real module cut at every byte is refused as truncated (never a
 * SIGBUS in dlopen), corrupted ELF headers are refused by name, and the CPU feature check agrees
 * with LLVM about this machine and names what a module for another CPU needs. The bad-input
 * corpus (test_bad_inputs.sh) checks the same errors through the command line. */
#include "codegen.h"
#include "harness.h"
#include "harness_drive.h"
#include "ir.h"
#include "rt_internal.h"
#include "xtc.h"

#include <check.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char module_path[300];
static unsigned char *image; /* the module file */
static size_t image_size;

/* y = x * w + 1, a module with a kernel, a parameter and an input */
static void compile_to_features(const char *path, const char *cpu, const char *features)
{
    IrGraph *g = ir_graph_new("small");
    IrDim s[2] = {ir_dim_sym(ir_graph_add_sym(g, "b", 0)), ir_dim(8)}, ws[2] = {ir_dim(8), ir_dim(8)};
    IrNode *x = ir_input(g, "x", IR_F32, 2, s), *w = ir_param(g, "w", 2, ws);
    ir_output(g, "y", ir_binary(g, IR_ADD, ir_matmul(g, x, w, 0), ir_const(g, 1.0, IR_F32)));
    ck_assert_msg(!ir_graph_error(g), "%s", ir_graph_error(g));
    char err[1024];
    CgOptions opt = {.output = path, .opt_level = 1, .cpu = cpu, .features = features};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "%s", err);
    ir_graph_free(g);
}

static void compile_to(const char *path, const char *cpu) { compile_to_features(path, cpu, NULL); }

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* the module, in the scratch directory that harness_run makes */
static void setup(void)
{
    snprintf(module_path, sizeof module_path, "%s/small.so", tmpdir);
    compile_to(module_path, NULL);
    FILE *f = fopen(module_path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    image_size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    image = malloc(image_size);
    ck_assert_uint_eq(fread(image, 1, image_size, f), image_size);
    fclose(f);
}

static void teardown(void)
{
    free(image);
}

/* Loads path; returns the status, with the message in msg. */
static int load(const char *path, char *msg, size_t n)
{
    XtcModule *m = NULL;
    int st = xtc_module_load(path, &m);
    snprintf(msg, n, "%s", xtc_module_error(m));
    xtc_module_free(m);
    return st;
}

START_TEST(test_whole_module_loads)
{
    char msg[1024];
    ck_assert_msg(load(module_path, msg, sizeof msg) == XTC_OK, "%s", msg);
}
END_TEST

/* Every proper prefix of the file: a format error that says why, and no crash. */
START_TEST(test_truncated_at_every_byte)
{
    char path[400], msg[1024];
    snprintf(path, sizeof path, "%s/cut.so", tmpdir);
    int truncated = 0, not_elf = 0;
    write_file(path, image, image_size);
    for (size_t cut = image_size; cut-- > 0;) {
        ck_assert_int_eq(truncate(path, (off_t)cut), 0);
        int st = load(path, msg, sizeof msg);
        ck_assert_msg(st == XTC_ERR_FORMAT, "cut at %zu: status %d: %s", cut, st, msg);
        if (strstr(msg, "truncated: "))
            truncated++;
        else if (strstr(msg, "is not an ELF file"))
            not_elf++;
        else
            ck_abort_msg("cut at %zu: unexpected message: %s", cut, msg);
    }
    ck_assert_int_eq(not_elf, SELFMAG); /* 0..3 bytes: no magic yet */
    ck_assert_int_eq(truncated, (int)image_size - SELFMAG);
    /* the cut names where the lost part ends and the file's size */
    write_file(path, image, 1000);
    load(path, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "but the file has 1000 bytes"), "%s", msg);
}
END_TEST

/* Corrupted header fields, each refused with its reason. */
START_TEST(test_corrupted_headers)
{
    static const struct {
        const char *what, *want;
    } cases[] = { /* in the order of the switch below */
        {"class", "a 32-bit ELF file"},
        {"data", "ELF file of the other byte order"},
#if defined(__aarch64__)
        {"machine", "built for x86-64, this machine is AArch64"},
#else
        {"machine", "built for AArch64, this machine is"},
#endif
        {"type", "not a shared library"},
        {"phentsize", "malformed ELF header"},
        {"phnum", "0 program headers"},
        {"phoff", "truncated: the program headers end at byte"},
        {"segment", "truncated: segment"},
        {"memsz", "inconsistent sizes or alignment"},
    };
    char path[400], msg[1024];
    snprintf(path, sizeof path, "%s/bad.so", tmpdir);
    unsigned char *img = malloc(image_size);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(img, image, image_size);
        Elf64_Ehdr *eh = (Elf64_Ehdr *)img;
        Elf64_Phdr *ph = (Elf64_Phdr *)(img + eh->e_phoff);
        int load_seg = 0;
        while (ph[load_seg].p_type != PT_LOAD)
            load_seg++;
        switch (c) {
        case 0: eh->e_ident[EI_CLASS] = ELFCLASS32; break;
        case 1: eh->e_ident[EI_DATA] = ELFDATA2MSB; break;
        case 2: eh->e_machine = eh->e_machine == EM_AARCH64 ? EM_X86_64 : EM_AARCH64; break;
        case 3: eh->e_type = ET_EXEC; break;
        case 4: eh->e_phentsize = 40; break;
        case 5: eh->e_phnum = 0; break;
        case 6: eh->e_phoff = UINT64_MAX - 8; break;
        case 7: ph[load_seg].p_filesz = UINT64_MAX / 2; break;
        case 8: ph[load_seg].p_memsz = ph[load_seg].p_filesz - 1; break;
        }
        write_file(path, img, image_size);
        int st = load(path, msg, sizeof msg);
        ck_assert_msg(st == XTC_ERR_FORMAT && strstr(msg, cases[c].want), "%s: status %d: %s", cases[c].what, st,
                      msg);
    }
    free(img);
    /* a file that is not there, a directory */
    snprintf(path, sizeof path, "%s/none.so", tmpdir);
    ck_assert_int_eq(load(path, msg, sizeof msg), XTC_ERR_IO);
    ck_assert_msg(strstr(msg, "No such file or directory"), "%s", msg);
    ck_assert_int_eq(load(tmpdir, msg, sizeof msg), XTC_ERR_IO);
    ck_assert_msg(strstr(msg, "not a regular file"), "%s", msg);
}
END_TEST

/* The features a module for this machine requires (LLVM's host features) are all present by
 * the runtime's own check: the two agree about this CPU. */
START_TEST(test_host_requirements_present)
{
    XtcModule *m = NULL;
    ck_assert_int_eq(xtc_module_load(module_path, &m), XTC_OK);
    const char *req = strstr(xtc_module_metadata(m), "option requires ");
#if defined(__x86_64__)
    ck_assert_msg(req != NULL, "a module for this x86-64 machine records no requirement");
    req += strlen("option requires ");
    int checked = 0;
    for (const char *p = req; *p && *p != '\n';) {
        size_t len = strcspn(p, ",\n");
        int has = rt_cpu_has(p, len);
        ck_assert_msg(has != 0, "LLVM says this CPU has '%.*s', CPUID says not", (int)len, p);
        checked += has == 1;
        p += len + (p[len] == ',');
    }
    ck_assert_int_ge(checked, 5); /* sse2, ... : most are checkable */
#else
    (void)req;
#endif
    xtc_module_free(m);
}
END_TEST

#if defined(__x86_64__)
/* Features of other x86-64 CPUs, each of which some current CPU lacks: AMD's Bulldozer-only XOP,
 * FMA4 and TBM, AMD's SSE4a and CLZERO, Intel's AMX and AVX-512 extensions. Which ones this host
 * lacks depends on the host (an Intel VM may hide AMX, a Zen has no XOP), so the tests ask. */
static const char *const other_features[] = {"xop", "fma4", "tbm", "sse4a", "clzero", "amx-tile", "amx-int8",
                                             "avx512vp2intersect", "avx512fp16", "avxneconvert"};

/* The first feature of other_features the running CPU lacks, or NULL. */
static const char *lacked_feature(void)
{
    for (size_t i = 0; i < sizeof other_features / sizeof other_features[0]; i++)
        if (rt_cpu_has(other_features[i], strlen(other_features[i])) == 0)
            return other_features[i];
    return NULL;
}
#endif

START_TEST(test_feature_lists)
{
    char missing[256];
#if defined(__x86_64__)
    ck_assert_int_eq(rt_cpu_has("sse2", 4), 1);
    ck_assert_int_eq(rt_cpu_missing("+sse2,+cx8,-amx-tile,-sse4a,-xop,+no-such-feature", missing, sizeof missing), 0);
    ck_assert_str_eq(missing, "");
    const char *lacks = lacked_feature();
    if (!lacks) {
        printf("test_feature_lists: skipped the missing-feature checks: this CPU has every one of xop, fma4, "
               "tbm, sse4a, clzero, amx-tile, amx-int8, avx512vp2intersect, avx512fp16, avxneconvert\n");
        return;
    }
    char list[128];
    snprintf(list, sizeof list, "sse2,%s,cx8", lacks);
    ck_assert_int_eq(rt_cpu_missing(list, missing, sizeof missing), 1);
    ck_assert_str_eq(missing, lacks);
    /* the list is truncated to the buffer, the count is not */
    char tiny[4];
    snprintf(list, sizeof list, "%s,+%s", lacks, lacks);
    ck_assert_int_eq(rt_cpu_missing(list, tiny, sizeof tiny), 2);
    ck_assert_uint_lt(strlen(tiny), sizeof tiny);
#else
    /* off x86 no feature can be checked: nothing is reported missing */
    ck_assert_int_eq(rt_cpu_has("sse2", 4), -1);
    ck_assert_int_eq(rt_cpu_missing("+sse2,+amx-tile", missing, sizeof missing), 0);
#endif
    ck_assert_int_eq(rt_cpu_missing("", missing, sizeof missing), 0);
    ck_assert_int_eq(rt_cpu_missing(",,+,-,", missing, sizeof missing), 0);
}
END_TEST

#if defined(__x86_64__)
/* A module for a CPU with features this one lacks is refused by name, before any of its code runs:
 * the first of Sapphire Rapids (AMX: no AMD CPU, not every Intel VM), Zen 1 (SSE4a: no Intel CPU)
 * and x86-64 with a feature of other_features that this host lacks (XOP: no current CPU). */
START_TEST(test_module_for_another_cpu)
{
    static const struct {
        const char *cpu, *feature;
    } others[] = {{"sapphirerapids", "amx-tile"}, {"znver1", "sse4a"}};
    const char *cpu = NULL, *lacks = NULL, *features = NULL;
    char plus[64];
    for (size_t i = 0; i < sizeof others / sizeof others[0] && !cpu; i++)
        if (rt_cpu_has(others[i].feature, strlen(others[i].feature)) == 0)
            cpu = others[i].cpu, lacks = others[i].feature;
    if (!cpu && (lacks = lacked_feature())) {
        snprintf(plus, sizeof plus, "+%s", lacks);
        cpu = "x86-64", features = plus;
    }
    char path[400], msg[1024];
    if (cpu) {
        snprintf(path, sizeof path, "%s/%s.so", tmpdir, cpu);
        compile_to_features(path, cpu, features);
        ck_assert_int_eq(load(path, msg, sizeof msg), XTC_ERR_FORMAT);
        ck_assert_msg(strstr(msg, "compiled for CPU ") && strstr(msg, cpu) && strstr(msg, "this CPU lacks") &&
                          strstr(msg, lacks) && strstr(msg, "--cpu=generic"),
                      "%s", msg);
    } else
        printf("test_module_for_another_cpu: skipped the refusal: this CPU has every feature of other_features\n");
    /* the same graph for any x86-64 loads and runs here */
    snprintf(path, sizeof path, "%s/generic.so", tmpdir);
    compile_to(path, "generic");
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = 1}, &s), XTC_OK);
    float x[8], w[64];
    for (int i = 0; i < 64; i++)
        w[i] = i % 9 == 0; /* identity */
    for (int i = 0; i < 8; i++)
        x[i] = (float)i;
    ck_assert_int_eq(xtc_session_set_weight(s, "w", 2, (int64_t[]){8, 8}, w), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, (int64_t[]){1, 8}, x), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor y;
    ck_assert_int_eq(xtc_session_get_output(s, "y", &y), XTC_OK);
    ck_assert(((const float *)y.data)[7] == 8.0f);
    xtc_session_free(s);
    xtc_module_free(m);
}
END_TEST
#endif

/* y2 = x + 2: another module, to replace the file of the first */
static void compile_other(const char *path)
{
    IrGraph *g = ir_graph_new("other");
    IrDim s[2] = {ir_dim_sym(ir_graph_add_sym(g, "b", 0)), ir_dim(4)};
    ir_output(g, "y2", ir_binary(g, IR_ADD, ir_input(g, "x", IR_F32, 2, s), ir_const(g, 2.0, IR_F32)));
    ck_assert_msg(!ir_graph_error(g), "%s", ir_graph_error(g));
    char err[1024];
    CgOptions opt = {.output = path, .opt_level = 1};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "%s", err);
    ir_graph_free(g);
}

/* A module file replaced by another (a recompile) and loaded again in the same process is the new
 * module, whether the old one is still loaded or freed: dlopen alone returns the object it has
 * under that name. Loading the unchanged file twice still works, sharing the code. */
START_TEST(test_replaced_module)
{
    char path[400], rel[64];
    snprintf(path, sizeof path, "%s/replaced.so", tmpdir);
    compile_to(path, NULL);
    XtcModule *a = NULL, *a2 = NULL, *b = NULL, *b2 = NULL, *c = NULL;
    ck_assert_msg(xtc_module_load(path, &a) == XTC_OK, "%s", xtc_module_error(a));
    ck_assert_msg(xtc_module_load(path, &a2) == XTC_OK, "%s", xtc_module_error(a2));
    ck_assert_str_eq(xtc_module_name(a), "small");
    ck_assert_str_eq(xtc_module_name(a2), "small");
    compile_other(path);
    /* while the first is loaded */
    ck_assert_msg(xtc_module_load(path, &b) == XTC_OK, "%s", xtc_module_error(b));
    ck_assert_str_eq(xtc_module_name(b), "other");
    ck_assert_int_eq(xtc_module_find(b, XTC_OUTPUT, "y2"), 0);
    ck_assert_int_eq(xtc_module_find(a, XTC_OUTPUT, "y"), 0); /* the first is unchanged */
    ck_assert_int_eq(xtc_module_find(a, XTC_OUTPUT, "y2"), -1);
    /* and once more, by a relative name, after freeing the first */
    xtc_module_free(a);
    xtc_module_free(a2);
    compile_to(path, NULL);
    char cwd[4096];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(tmpdir), 0);
    snprintf(rel, sizeof rel, "replaced.so");
    int st = xtc_module_load(rel, &c);
    ck_assert_int_eq(chdir(cwd), 0); /* the suite may run in one process (CK_FORK=no) */
    ck_assert_msg(st == XTC_OK, "%s", xtc_module_error(c));
    ck_assert_str_eq(xtc_module_name(c), "small");
    compile_other(path);
    xtc_module_free(c);
    ck_assert_msg(xtc_module_load(path, &b2) == XTC_OK, "%s", xtc_module_error(b2));
    ck_assert_str_eq(xtc_module_name(b2), "other");
    /* both run their own code */
    XtcModule *mods[2] = {b, b2};
    for (int i = 0; i < 2; i++) {
        XtcSession *s = NULL;
        ck_assert_int_eq(xtc_session_new(mods[i], NULL, &s), XTC_OK);
        float x[4] = {1, 2, 3, 4};
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, (int64_t[]){1, 4}, x), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        XtcTensor y;
        ck_assert_int_eq(xtc_session_get_output(s, "y2", &y), XTC_OK);
        ck_assert(((const float *)y.data)[3] == 6.0f);
        xtc_session_free(s);
    }
    xtc_module_free(b);
    xtc_module_free(b2);
}
END_TEST

/* The metadata reader's limits (rt_meta.c): each refused with its reason, nothing wraps. */
/* Dimensions at run time saturate rather than wrap (a wrapped size could plan a short buffer). */
START_TEST(test_dim_eval_saturates)
{
    int64_t syms[RT_MAXSYM] = {1024, (int64_t)1 << 40};
    RtDim d = {.c = -1, .k = {2, 0}};
    ck_assert_int_eq(rt_dim_eval(&d, syms), 2047);
    d = (RtDim){.c = 0, .k = {0, (int64_t)1 << 30}};
    ck_assert_int_eq(rt_dim_eval(&d, syms), INT64_MAX);   /* the product overflows */
    d = (RtDim){.c = INT64_MAX - 5, .k = {1, 0}};
    ck_assert_int_eq(rt_dim_eval(&d, syms), INT64_MAX);   /* the sum overflows */
    d = (RtDim){.c = 0, .k = {0, -((int64_t)1 << 30)}};
    ck_assert_int_eq(rt_dim_eval(&d, syms), INT64_MIN);   /* negative: refused by the session */
    d = (RtDim){.c = INT64_MIN + 5, .k = {-1, 0}};
    ck_assert_int_eq(rt_dim_eval(&d, syms), INT64_MIN);
}
END_TEST

START_TEST(test_metadata_limits)
{
    static const struct {
        const char *records, *want;
    } cases[] = {
        {"buffer 0 param w f32 [1125899906842624,1125899906842624] -1 -1\n", "weight 'w' has more than 2^40 elements"},
        {"buffer 0 param w f32 [1099511627776,2] -1 -1\n", "weight 'w' has more than 2^40 elements"},
        {"sym n -4\n", "negative bound for symbol 'n'"},
        {"sym n 99999999999999999999\n", "number '99999999999999999999' out of range"},
        {"sym n 0\nbuffer 0 input x f32 [1125899906842624+1125899906842624] -1 -1\n", "too large"},
        {"sym n 0\nbuffer 0 input x f32 [1125899906842624*n+1125899906842624*n] -1 -1\n", "too large"},
        {"kernel 0 k matmul 2147483648\n", "index 2147483648 out of range"},
        {"buffer 0 temp t f32 [4] 0 4294967296\n", "index 4294967296 out of range"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[512];
        snprintf(text, sizeof text, "xtc-module 1\nmodel m\n%send\n", cases[c].records);
        XtcModule *m = calloc(1, sizeof *m);
        ck_assert_ptr_nonnull(m);
        ck_assert_msg(rt_meta_parse(m, text) < 0 && strstr(m->err, cases[c].want), "case %zu: %s", c, m->err);
        xtc_module_free(m);
    }
    /* at the limit: accepted, and counted */
    XtcModule *m = calloc(1, sizeof *m);
    static const XtcModuleV1 abi = {.magic = XTC_ABI_MAGIC, .version = XTC_ABI_VERSION};
    ck_assert_int_eq(rt_meta_parse(m, "xtc-module 1\nmodel m\nbuffer 0 param w f32 [1048576,1048576] -1 -1\nend\n"), 0);
    m->abi = &abi;
    ck_assert_int_eq(xtc_module_param_count(m), (int64_t)1 << 40);
    m->abi = NULL;
    xtc_module_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("module_load");
    TCase *tc = tcase_create("module_load");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_whole_module_loads);
    tcase_add_test(tc, test_truncated_at_every_byte);
    tcase_add_test(tc, test_corrupted_headers);
    tcase_add_test(tc, test_host_requirements_present);
    tcase_add_test(tc, test_feature_lists);
    tcase_add_test(tc, test_metadata_limits);
    tcase_add_test(tc, test_dim_eval_saturates);
    tcase_add_test(tc, test_replaced_module);
#if defined(__x86_64__)
    tcase_add_test(tc, test_module_for_another_cpu);
#endif
    suite_add_tcase(s, tc);
    return harness_run(s, "module-load");
}
