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
 * allowed to go unreported as long as the logits and caches come out bitwise the same.
 *
 * A pass that fails allocation n must run to its end to show that nothing changed, and an
 * emulated CUDA pass spends its time in the emulated kernels (0.13 s a training run, two runs a
 * pass, 624 allocations). A single-threaded sweep therefore forks (see sweep): one pass runs
 * without injection and, before each call, forks a child for every allocation that call makes
 * (counted in a reference pass); the child fails it and runs the pass to its end, as the pass
 * of the plain loop would, and sends its outcome back through a pipe. What comes before the
 * call runs once instead of once per allocation: the emulated training sweep took about 175 s
 * of CPU time, forked about 80 (its 346 allocations after the second run cost no emulated run). */
/* the modules are made by the xtc command: this process links the runtime only (tests/CMakeLists.txt) */
#define TINY_COMPILE_WITH_CLI
#include "harness.h"
#include "rt_alloc.h"
#include "tiny_train.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define B 2
#define N 5

/* Under AddressSanitizer each forked child's exit runs LeakSanitizer, which visits every chunk the
 * allocator holds, those in the quarantine of freed memory too: the default 256 MB of quarantined
 * small chunks, visited at each of ~1,500 exits, was most of this suite's time there. 16 MB still
 * keeps a pass's recent frees poisoned. (Read by the sanitizer runtime only; ASAN_OPTIONS adds to it.) */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}

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

/* ---- forking at the calls of a pass ---- */

enum { MAX_BOUNDS = 256 };
static struct {
    int record;             /* the reference pass: note the allocations before each call */
    int fork;               /* the forking pass (its parent): fork at each call */
    int child;              /* this process is a child: it fails an allocation, then reports */
    int pipe;               /* the child's end of its pipe */
    int nb;                 /* calls met so far in this pass */
    long at[MAX_BOUNDS + 1]; /* the reference pass: allocations made before call b; at[n] all */
    int n;
} fk;

/* What a child sends back: its outcome and how many allocations it counted after the fork. */
typedef struct {
    Outcome p;
    long count;
} Report;

static void verdict(long n, const Outcome *p);

/* Before each call of a pass. In the forking pass: one child per allocation of the call (the
 * reference pass counted them), each of which returns from here with that allocation set to fail
 * and goes on with the pass; the parent checks what each child reports, then makes the call
 * itself without injection. */
static void boundary(const char *call)
{
    if (fk.record) {
        ck_assert_int_lt(fk.nb, MAX_BOUNDS);
        fk.at[fk.nb++] = rt_fault_allocations();
        return;
    }
    if (!fk.fork)
        return;
    int b = fk.nb++;
    ck_assert_msg(b < fk.n && rt_fault_allocations() == fk.at[b],
                  "the passes differ: before %s, %ld allocations, %ld in the reference pass", call,
                  rt_fault_allocations(), b < fk.n ? fk.at[b] : -1L);
    for (long k = 0; k < fk.at[b + 1] - fk.at[b]; k++) {
        int fd[2];
        ck_assert_int_eq(pipe(fd), 0);
        fflush(NULL);
        pid_t pid = fork();
        ck_assert_msg(pid >= 0, "fork failed");
        if (pid == 0) {
            close(fd[0]);
            fk.fork = 0;
            fk.child = 1;
            fk.pipe = fd[1];
            rt_fault_fail_after(k);
            return;
        }
        close(fd[1]);
        Report r;
        ssize_t got = 0, m;
        while (got < (ssize_t)sizeof r && (m = read(fd[0], (char *)&r + got, sizeof r - (size_t)got)) > 0)
            got += m;
        close(fd[0]);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        long n = fk.at[b] + k;
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == (ssize_t)sizeof r,
                      "the pass failing allocation %ld (in or after %s) did not finish: %s %d", n, call,
                      WIFEXITED(status) ? "exit status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        ck_assert_msg(r.count > k, "allocation %ld (in or after %s) did not come in the forked pass", n, call);
        verdict(n, &r.p);
    }
}

/* The end of a child's pass: its report to the parent, and the end of the child. */
static void child_report(const Outcome *p)
{
    if (!fk.child)
        return;
    Report r = {.p = *p, .count = rt_fault_allocations()};
    rt_fault_fail_after(-1);
    ssize_t w = write(fk.pipe, &r, sizeof r);
    close(fk.pipe);
    fflush(NULL);
    exit(w == (ssize_t)sizeof r ? 0 : 3); /* exit, not _exit: LeakSanitizer checks the child */
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
        boundary(#expr);                                                                          \
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
    boundary("xtc_module_load");
    int st = xtc_module_load(module_path, &m);
    if (met(p, "xtc_module_load", st, XTC_ERR_MEMORY, m ? xtc_module_error(m) : "out of memory (no module)")) {
        xtc_module_free(m);
        st = xtc_module_load(module_path, &m);
    }
    ck_assert_msg(st == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *s = NULL;
    XtcSessionOptions so = {.threads = threads};
    boundary("xtc_session_new");
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
    boundary("xtc_session_load_checkpoint");
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
    boundary("rt_st_open");
    st = rt_st_open(ckpt, &f, msg, sizeof msg);
    if (met(p, "rt_st_open", st, RT_ST_ENOMEM, msg))
        st = rt_st_open(ckpt, &f, msg, sizeof msg);
    ck_assert_msg(st == 0, "%s", msg);
    ck_assert_str_eq(rt_st_metadata(f, "test.step"), "1");
    rt_st_close(f);
    xtc_session_free(s);
    xtc_module_free(m);
}

/* ---- the sweep: every allocation of a pass fails once ---- */

typedef void (*Cycle)(const char *module_path, int threads, Outcome *p);
static struct {
    const char *path;
    Outcome ref;  /* the pass without injection */
    int decode;   /* decoding's rule: a failure may go unreported where the results stay the same */
} sw;

/* What a pass that failed allocation n must show. */
static void verdict(long n, const Outcome *p)
{
    if (sw.decode) {
        ck_assert_msg(p->failures <= 1 && p->weights == sw.ref.weights,
                      "allocation %ld of %s failing: %d calls failed (%s), the logits or caches %s", n, sw.path,
                      p->failures, p->where, p->weights == sw.ref.weights ? "agree" : "differ");
        return;
    }
    ck_assert_msg(p->failures == 1, "allocation %ld of %s failed but no call reported it", n, sw.path);
    ck_assert_msg(memcmp(p->loss, sw.ref.loss, sizeof p->loss) == 0 && p->weights == sw.ref.weights,
                  "after recovering from allocation %ld failing in %s, the results differ", n, p->where);
}

/* Fails every allocation of the pass in turn; returns how many there are. The reference pass
 * counts the allocations before each call; a single-threaded session is swept by forking at
 * them (fork copies only the calling thread: a pool's workers would be missing in the child). */
static long sweep(Cycle cycle, const char *module_path, int threads, int decode)
{
    sw.path = module_path;
    sw.decode = decode;
    memset(&fk, 0, sizeof fk);
    fk.record = 1;
    rt_fault_fail_after(LONG_MAX); /* counts, fails nothing */
    cycle(module_path, threads, &sw.ref);
    long total = rt_fault_allocations();
    rt_fault_fail_after(-1);
    fk.record = 0;
    ck_assert_int_eq(sw.ref.failures, 0);
    Outcome p;
    if (threads == 1) {
        fk.n = fk.nb;
        fk.at[fk.n] = total;
        fk.nb = 0;
        fk.fork = 1;
        rt_fault_fail_after(LONG_MAX);
        cycle(module_path, threads, &p); /* each child fails one allocation */
        child_report(&p);                /* a child ends here */
        long count = rt_fault_allocations();
        rt_fault_fail_after(-1);
        fk.fork = 0;
        ck_assert_msg(count == total && fk.nb == fk.n, "the forking pass made %ld allocations in %d calls, the "
                      "reference pass %ld in %d", count, fk.nb, total, fk.n);
        ck_assert_int_eq(p.failures, 0);
        ck_assert(p.weights == sw.ref.weights && memcmp(p.loss, sw.ref.loss, sizeof p.loss) == 0);
        return total;
    }
    long n = 0;
    for (;; n++) {
        rt_fault_fail_after(n);
        cycle(module_path, threads, &p);
        long count = rt_fault_allocations();
        rt_fault_fail_after(-1);
        if (count <= n) { /* allocation n never came: every one has failed once */
            ck_assert_int_eq(p.failures, 0);
            break;
        }
        verdict(n, &p);
    }
    return n;
}

/* The training life cycle's sweep: the step must have done something. */
static long sweep_training(const char *module_path, int threads)
{
    long n = sweep(life_cycle, module_path, threads, 0);
    ck_assert(sw.ref.loss[1] < sw.ref.loss[0]);
    fprintf(stderr, "test_faults: %s, %d thread(s): each of %ld allocations failed once, all reported\n",
            strrchr(module_path, '/') + 1, threads, n);
    return n;
}

START_TEST(test_cpu_module)
{
    ck_assert_int_gt(sweep_training(cpu_path, 2), 50);
}
END_TEST

START_TEST(test_emulated_cuda_module)
{
    ck_assert_int_gt(sweep_training(emu_path, 1), 50);
}
END_TEST

/* Decoding with carried caches: a 3-token prompt, then 4 calls of a token; p->weights is the hash
 * of every call's logits and of the caches after the last. */
static void decode_cycle(const char *module_path, int threads, Outcome *p)
{
    XtcModule *m;
    XtcSession *s = open_session(module_path, threads, p, &m);
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
    long n = sweep(decode_cycle, module_path, 1, 1);
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
