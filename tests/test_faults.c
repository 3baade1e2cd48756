/* test_faults.c: allocation failure in the runtime is reported, never a crash or a leak.
 *
 * Every heap allocation of the runtime goes through runtime/rt_alloc.h, whose test-only hook
 * rt_fault_fail_after(n) makes allocation number n fail. Each test walks a whole life cycle
 * (load the module, create a session with a thread pool, load weights from safetensors, set the
 * inputs, run forward and backward, an AdamW step, run again, save and reload a checkpoint, read
 * outputs, free) for n = 0, 1, 2, ... until a pass makes fewer than n + 1 allocations, so that
 * every allocation of the life cycle fails once. The call that meets the failure must return
 * XTC_ERR_MEMORY (or the reader's RT_ST_ENOMEM) with a message saying "out of memory"; then the
 * injection is turned off and the same call is retried, which must succeed and leave the session
 * as if nothing had happened: the final loss and weights are bitwise those of a pass without
 * injection. Leaks after the failure paths are caught by LeakSanitizer in the sanitizer build
 * (.ci/sanitize.sh runs this suite with CK_FORK=no). The same for a decoding life cycle with
 * the KV-cache form (a prompt, then a token a call, the caches carried from call to call, on the
 * device for emulated CUDA), where an allocation that only makes a carry fall back to a copy is
 * allowed to go unreported as long as the logits and caches come out bitwise the same. */
#include "harness.h"
#include "rt_alloc.h"
#include "tiny_train.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define B 2
#define N 5

static char cpu_path[300], emu_path[300], weights_path[300];
static char cpu_kv_path[300], emu_kv_path[300], kv_weights_path[300];

/* the modules and weights, in the scratch directory that harness_run makes */
static void setup(void)
{
    snprintf(cpu_path, sizeof cpu_path, "%s/tiny.so", tmpdir);
    snprintf(emu_path, sizeof emu_path, "%s/tiny_emu.so", tmpdir);
    snprintf(weights_path, sizeof weights_path, "%s/tiny.safetensors", tmpdir);
    tiny_compile(tiny_gpt_src, cpu_path, "cpu");
    tiny_compile(tiny_gpt_src, emu_path, "cuda-emu");
    tiny_write_weights(cpu_path, weights_path, 7);
    snprintf(cpu_kv_path, sizeof cpu_kv_path, "%s/tiny_kv.so", tmpdir);
    snprintf(emu_kv_path, sizeof emu_kv_path, "%s/tiny_kv_emu.so", tmpdir);
    snprintf(kv_weights_path, sizeof kv_weights_path, "%s/tiny_kv.safetensors", tmpdir);
    tiny_compile_form(tiny_gpt_src, cpu_kv_path, "cpu", 1);
    tiny_compile_form(tiny_gpt_src, emu_kv_path, "cuda-emu", 1);
    tiny_write_weights(cpu_kv_path, kv_weights_path, 7);
}

/* What one pass of the life cycle saw. */
typedef struct {
    int failures;       /* calls that met the injected failure */
    char where[200];    /* the first of them, and its message */
    float loss[2];      /* before and after the step */
    uint64_t weights;   /* hash of the weights after the first step, reloaded from the checkpoint */
} Outcome;

static uint64_t weights_hash(XtcSession *s, const XtcModule *m)
{
    uint64_t h = TINY_HASH_START;
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++) {
        XtcTensorInfo info;
        XtcTensor t;
        xtc_module_tensor(m, XTC_PARAM, i, &info);
        expect_msg(xtc_session_get_weight(s, info.name, &t) == XTC_OK, "%s", xtc_session_error(s));
        h = tiny_hash(h, t.data, (size_t)tiny_numel(&t) * sizeof(float));
    }
    return h;
}

/* A call returned st with message msg. A failure must be the injected one, reported as such;
 * the injection is then turned off so that the retry succeeds. Returns 1 to retry. */
static int met(Outcome *p, const char *call, int st, int expect, const char *msg)
{
    if (st == XTC_OK)
        return 0;
    ck_assert_msg(st == expect, "%s: status %d (%s), expected out of memory: %s", call, st,
                  expect == XTC_ERR_MEMORY ? xtc_status_name(st) : "?", msg ? msg : "");
    ck_assert_msg(msg && strstr(msg, "out of memory"), "%s: the message does not say out of memory: '%s'", call,
                  msg ? msg : "(no object)");
    if (!p->failures++)
        snprintf(p->where, sizeof p->where, "%s", call);
    rt_fault_fail_after(-1);
    return 1;
}

/* The calls on a session: every one retried once after an injected failure. */
#define CALL(p, s, expr)                                                                          \
    do {                                                                                          \
        int st_ = (expr);                                                                         \
        if (met(p, #expr, st_, XTC_ERR_MEMORY, xtc_session_error(s))) {                           \
            st_ = (expr);                                                                         \
            ck_assert_msg(st_ == XTC_OK, "retrying %s: %s", #expr, xtc_session_error(s));         \
        }                                                                                         \
    } while (0)

/* Loads the module and creates a session on it with that many threads, each retried once. */
static XtcSession *open_session(const char *module_path, int threads, Outcome *p, XtcModule **mp)
{
    memset(p, 0, sizeof *p);
    XtcModule *m = NULL;
    int st = xtc_module_load(module_path, &m);
    if (met(p, "xtc_module_load", st, XTC_ERR_MEMORY, m ? xtc_module_error(m) : "out of memory (no module)")) {
        xtc_module_free(m);
        st = xtc_module_load(module_path, &m);
    }
    ck_assert_msg(st == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *s = NULL;
    XtcSessionOptions so = {.threads = threads};
    st = xtc_session_new(m, &so, &s);
    if (met(p, "xtc_session_new", st, XTC_ERR_MEMORY, s ? xtc_session_error(s) : "out of memory (no session)")) {
        xtc_session_free(s);
        st = xtc_session_new(m, &so, &s);
    }
    ck_assert_msg(st == XTC_OK, "%s", xtc_session_error(s));
    *mp = m;
    return s;
}

static void life_cycle(const char *module_path, int threads, Outcome *p)
{
    XtcModule *m;
    XtcSession *s = open_session(module_path, threads, p, &m);
    int st;

    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 11);
    CALL(p, s, xtc_session_load_weights(s, weights_path));
    CALL(p, s, xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens));
    CALL(p, s, xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets));
    CALL(p, s, xtc_session_set_profiling(s, 1));
    CALL(p, s, xtc_session_run(s));
    XtcTensor t;
    CALL(p, s, xtc_session_get_output(s, "loss", &t));
    p->loss[0] = *(const float *)t.data;
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 1e-2f;
    opt.max_grad_norm = 1.0f;
    CALL(p, s, xtc_session_step(s, &opt));
    CALL(p, s, xtc_session_run(s));
    CALL(p, s, xtc_session_get_output(s, "loss", &t));
    p->loss[1] = *(const float *)t.data;
    char ckpt[400];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", tmpdir);
    const char *keys[1] = {"test.step"}, *values[1] = {"1"};
    CALL(p, s, xtc_session_save_checkpoint(s, ckpt, keys, values, 1));
    uint64_t saved = weights_hash(s, m);
    /* another step, then back to the checkpoint; a failed load must change nothing */
    CALL(p, s, xtc_session_step(s, &opt));
    uint64_t before = weights_hash(s, m);
    ck_assert(before != saved);
    st = xtc_session_load_checkpoint(s, ckpt, 1);
    if (met(p, "xtc_session_load_checkpoint", st, XTC_ERR_MEMORY, xtc_session_error(s))) {
        ck_assert_msg(weights_hash(s, m) == before && xtc_session_step_count(s) == 2,
                      "a failed xtc_session_load_checkpoint changed the session");
        st = xtc_session_load_checkpoint(s, ckpt, 1);
    }
    ck_assert_msg(st == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_step_count(s), 1);
    p->weights = weights_hash(s, m);
    ck_assert(p->weights == saved);

    /* the reader on its own: its status for out of memory is RT_ST_ENOMEM */
    RtStFile *f = NULL;
    char msg[512] = "";
    st = rt_st_open(ckpt, &f, msg, sizeof msg);
    if (met(p, "rt_st_open", st, RT_ST_ENOMEM, msg))
        st = rt_st_open(ckpt, &f, msg, sizeof msg);
    ck_assert_msg(st == 0, "%s", msg);
    ck_assert_str_eq(rt_st_metadata(f, "test.step"), "1");
    rt_st_close(f);
    xtc_session_free(s);
    xtc_module_free(m);
}

/* Fails every allocation of the life cycle in turn; returns how many passes injected one. */
static long sweep(const char *module_path, int threads)
{
    Outcome ref, p;
    life_cycle(module_path, threads, &ref);
    ck_assert_int_eq(ref.failures, 0);
    ck_assert(ref.loss[1] < ref.loss[0]); /* the step did something */
    long n = 0;
    for (;; n++) {
        rt_fault_fail_after(n);
        life_cycle(module_path, threads, &p);
        long count = rt_fault_allocations();
        rt_fault_fail_after(-1);
        if (count <= n) { /* allocation n never came: every one has failed once */
            ck_assert_int_eq(p.failures, 0);
            break;
        }
        ck_assert_msg(p.failures == 1, "allocation %ld of %s failed but no call reported it", n, module_path);
        ck_assert_msg(memcmp(p.loss, ref.loss, sizeof p.loss) == 0 && p.weights == ref.weights,
                      "after recovering from allocation %ld failing in %s, the results differ", n, p.where);
    }
    fprintf(stderr, "test_faults: %s, %d thread(s): each of %ld allocations failed once, all reported\n",
            strrchr(module_path, '/') + 1, threads, n);
    return n;
}

START_TEST(test_cpu_module)
{
    ck_assert_int_gt(sweep(cpu_path, 2), 50);
}
END_TEST

START_TEST(test_emulated_cuda_module)
{
    ck_assert_int_gt(sweep(emu_path, 1), 50);
}
END_TEST

/* Decoding with carried caches: a 3-token prompt, then 4 calls of a token; p->weights is the hash
 * of every call's logits and of the caches after the last. */
static void decode_cycle(const char *module_path, Outcome *p)
{
    XtcModule *m;
    XtcSession *s = open_session(module_path, 1, p, &m);
    CALL(p, s, xtc_session_load_weights(s, kv_weights_path));
    const char *caches[8];
    int ncache = 0;
    float dummy = 0;
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo t;
        ck_assert_int_eq(xtc_module_tensor(m, XTC_INPUT, i, &t), XTC_OK);
        if (strncmp(t.name, "cache.", 6))
            continue;
        ck_assert_int_lt(ncache, 8);
        caches[ncache++] = t.name;
        CALL(p, s, xtc_session_set_input(s, t.name, XTC_F32, 4, ((int64_t[]){1, 0, t.shape[2], t.shape[3]}), &dummy));
    }
    ck_assert_int_gt(ncache, 0);
    static const int64_t tokens[7] = {3, 14, 15, 9, 2, 6, 5};
    uint64_t h = TINY_HASH_START;
    XtcTensor t;
    for (int pos = 0; pos < 7;) {
        int64_t n = pos == 0 ? 3 : 1;
        CALL(p, s, xtc_session_set_input(s, "tokens", XTC_I64, 2, ((int64_t[]){1, n}), tokens + pos));
        CALL(p, s, xtc_session_run(s));
        CALL(p, s, xtc_session_get_output(s, "logits", &t));
        h = tiny_hash(h, t.data, (size_t)tiny_numel(&t) * sizeof(float));
        for (int c = 0; c < ncache; c++)
            CALL(p, s, xtc_session_carry(s, caches[c], caches[c]));
        pos += (int)n;
    }
    for (int c = 0; c < ncache; c++) {
        CALL(p, s, xtc_session_get_output(s, caches[c], &t));
        ck_assert_int_eq(t.shape[1], 7);
        h = tiny_hash(h, t.data, (size_t)tiny_numel(&t) * sizeof(float));
    }
    p->weights = h;
    xtc_session_free(s);
    xtc_module_free(m);
}

static long sweep_decode(const char *module_path)
{
    Outcome ref, p;
    decode_cycle(module_path, &ref);
    ck_assert_int_eq(ref.failures, 0);
    long n = 0;
    for (;; n++) {
        rt_fault_fail_after(n);
        decode_cycle(module_path, &p);
        long count = rt_fault_allocations();
        rt_fault_fail_after(-1);
        if (count <= n) {
            ck_assert_int_eq(p.failures, 0);
            break;
        }
        ck_assert_msg(p.failures <= 1 && p.weights == ref.weights,
                      "allocation %ld of %s failing: %d calls failed (%s), the logits or caches %s", n, module_path,
                      p.failures, p.where, p.weights == ref.weights ? "agree" : "differ");
    }
    fprintf(stderr, "test_faults: decoding %s: each of %ld allocations failed once, no result changed\n",
            strrchr(module_path, '/') + 1, n);
    return n;
}

START_TEST(test_decode_carry)
{
    ck_assert_int_gt(sweep_decode(cpu_kv_path), 30);
    ck_assert_int_gt(sweep_decode(emu_kv_path), 30);
}
END_TEST

/* xtc_run_files (what `xtc run` runs): its one-line message says out of memory */
START_TEST(test_run_files)
{
    char in[400], out[400], err[1024];
    snprintf(in, sizeof in, "%s/in.safetensors", tmpdir);
    snprintf(out, sizeof out, "%s/out.safetensors", tmpdir);
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, 3);
    RtStWriter *w = rt_st_writer_new();
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(rt_st_writer_add(w, "tokens", RT_I64, 2, shape, tokens), 0);
    ck_assert_int_eq(rt_st_writer_add(w, "targets", RT_I64, 2, shape, targets), 0);
    ck_assert_msg(rt_st_writer_save(w, in, err, sizeof err) == 0, "%s", err);
    rt_st_writer_free(w);
    XtcRunOptions ro = {.threads = 2};
    ck_assert_msg(xtc_run_files(cpu_path, weights_path, in, out, &ro, err, sizeof err) == XTC_OK, "%s", err);
    long n = 0;
    for (;; n++) {
        rt_fault_fail_after(n);
        err[0] = 0;
        int st = xtc_run_files(cpu_path, weights_path, in, out, &ro, err, sizeof err);
        long count = rt_fault_allocations();
        rt_fault_fail_after(-1);
        if (count <= n) {
            ck_assert_msg(st == XTC_OK, "%s", err);
            break;
        }
        ck_assert_msg(st == XTC_ERR_MEMORY && strstr(err, "out of memory"),
                      "allocation %ld failing: status %s, message '%s'", n, xtc_status_name(st), err);
    }
    fprintf(stderr, "test_faults: xtc_run_files: each of %ld allocations failed once, all reported\n", n);
    ck_assert_int_gt(n, 50);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("allocation failure");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_cpu_module);
    tcase_add_test(tc, test_emulated_cuda_module);
    tcase_add_test(tc, test_run_files);
    tcase_add_test(tc, test_decode_carry);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(suite(), "faults");
}
