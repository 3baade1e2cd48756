/* tiny_train.h: what test_threads.c and test_faults.c share: compile a small .xtf model to a
 * training module (as `xtc compile --train` does: lower with the built-in loss, differentiate,
 * the pass pipeline, code generation for a target), write seeded x-transformers initial weights
 * for it to a .safetensors file, bind seeded tokens and targets, and hash results so that runs
 * can be compared bitwise. Sizes are small on purpose:
 * these tests are about the runtime's life cycle, not the arithmetic. */
#ifndef XTC_TESTS_TINY_TRAIN_H
#define XTC_TESTS_TINY_TRAIN_H

#include "init.h"
#include "safetensors.h"
#include "xtc.h"
#ifndef TINY_COMPILE_WITH_CLI
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "xtf.h"
#include "harness_drive.h"
#else
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY_VOCAB 37

/* a causal decoder, and a different one (GLU feed-forward, rotary positions, two layers) */
static const char tiny_gpt_src[] =
    "tiny = TransformerWrapper(num_tokens = 37, max_seq_len = 16,\n"
    "    attn_layers = Decoder(dim = 16, depth = 1, heads = 2))\n";
static const char tiny_glu_src[] =
    "glu = TransformerWrapper(num_tokens = 37, max_seq_len = 16,\n"
    "    attn_layers = Decoder(dim = 16, depth = 2, heads = 2, ff_glu = true, rotary_pos_emb = true))\n";

/* Compiles src at path for target ("cpu", "cuda-emu"): a training module, or with kv_cache the
 * incremental-decoding form (cache.<l>.k/.v in and out). */
#ifdef TINY_COMPILE_WITH_CLI
/* The same through the xtc command (XTC_BINARY_DIR/xtc compile -O1, src written beside path), for
 * a test whose process must not load the compiler: a process that links LLVM carries its
 * globals and heap into every fork, and LeakSanitizer scans them at each child's exit. */
static void tiny_compile_form(const char *src, const char *path, const char *target, int kv_cache)
{
    char xtf[400];
    snprintf(xtf, sizeof xtf, "%s.xtf", path);
    FILE *f = fopen(xtf, "w");
    ck_assert_msg(f && fputs(src, f) >= 0 && fclose(f) == 0, "writing %s", xtf);
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork failed");
    if (pid == 0) {
        execl(XTC_BINARY_DIR "/xtc", "xtc", "compile", xtf, kv_cache ? "--kv-cache" : "--train", "--target", target,
              "-O1", "-o", path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s compile %s --target %s: status %d",
                  XTC_BINARY_DIR "/xtc", xtf, target, status);
}
#else
static void tiny_compile_form(const char *src, const char *path, const char *target, int kv_cache)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("tiny.xtf", src, strlen(src), &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    XtLowerOpts lo = {.train = !kv_cache, .kv_cache = kv_cache};
    char err[1024];
    IrGraph *h = harness_build(f, NULL, &lo, !kv_cache, harness_target(target), HARNESS_EVERY_PASS, &d, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: %s", err, d.text ? d.text : "");
    xtf_diag_free(&d);
    CgOptions opt = {.output = path, .target = target, .opt_level = 1, .source = src, .source_name = "tiny.xtf"};
    ck_assert_msg(harness_cg(h, &opt, NULL, err, sizeof err) == 0, "compiling %s: %s", path, err);
    ir_graph_free(h);
    xtf_free(f);
}
#endif

static void tiny_compile(const char *src, const char *path, const char *target) { tiny_compile_form(src, path, target, 0); }

/* Writes x-transformers' initial values of every parameter and buffer of the module at
 * module_path to weights_path. */
static void tiny_write_weights(const char *module_path, const char *weights_path, uint64_t seed)
{
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(module_path, &m) == XTC_OK, "%s", xtc_module_error(m));
    RtStWriter *w = rt_st_writer_new();
    ck_assert_ptr_nonnull(w);
    RtRng rng;
    rt_rng_seed(&rng, seed);
    XtcKind kinds[2] = {XTC_PARAM, XTC_STATE};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < xtc_module_count(m, kinds[k]); i++) {
            XtcTensorInfo t;
            ck_assert_int_eq(xtc_module_tensor(m, kinds[k], i, &t), XTC_OK);
            int64_t n = 1;
            for (int d = 0; d < t.rank; d++)
                n *= t.shape[d];
            float *v = malloc((size_t)n * sizeof *v);
            ck_assert_ptr_nonnull(v);
            ck_assert_msg(rt_init_module_param(m, t.name, t.rank, t.shape, v, &rng) == 0, "no initialiser for %s", t.name);
            ck_assert_int_eq(rt_st_writer_add(w, t.name, RT_F32, t.rank, t.shape, v), 0);
            free(v);
        }
    char err[512];
    ck_assert_msg(rt_st_writer_save(w, weights_path, err, sizeof err) == 0, "%s", err);
    rt_st_writer_free(w);
    xtc_module_free(m);
}

/* Seeded tokens and next-token targets [b, n]: each row is a random sequence of n + 1 ids,
 * tokens its first n and targets its last n. */
static void tiny_batch(int64_t *tokens, int64_t *targets, int b, int n, uint64_t seed)
{
    RtRng rng;
    rt_rng_seed(&rng, seed);
    for (int r = 0; r < b; r++) {
        int64_t prev = (int64_t)(rt_rng_next(&rng) % TINY_VOCAB);
        for (int j = 0; j < n; j++) {
            int64_t next = (int64_t)(rt_rng_next(&rng) % TINY_VOCAB);
            tokens[r * n + j] = prev;
            targets[r * n + j] = next;
            prev = next;
        }
    }
}

/* FNV-1a of n bytes at p, continuing from h; a hash starts from TINY_HASH_START */
#define TINY_HASH_START 14695981039346656037u
static uint64_t tiny_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211u;
    return h;
}

static int64_t tiny_numel(const XtcTensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

#endif
