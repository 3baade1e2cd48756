/* test_threads.c: sessions used from several threads at once (include/xtc.h: no global state;
 * a module is read-only once loaded, a session belongs to one thread at a time).
 *
 * Several threads each run a training life cycle at the same time: load a module (the same .so
 * file as other threads, a different one, or one XtcModule shared by several threads), create
 * a session (1 or 2 pool threads), load weights from safetensors, set inputs, run forward and
 * backward, take AdamW steps, run again, save a checkpoint and read it back, and read the
 * outputs. Every thread's results (losses, gradients, weights after the steps, the checkpoint's
 * bytes) must be bitwise those of the same job run alone beforehand. The jobs include an
 * emulated CUDA module (cuda-emu: the device layer of the runtime and the emulator).
 *
 * .ci/tsan.sh runs this suite under ThreadSanitizer (build-tsan/, -DXTC_SANITIZE=thread), which
 * is the point of it: any data race between sessions, in the pool or in module loading fails
 * the run. */
#include "harness.h"
#include "rt_internal.h"
#include "tiny_train.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#define B 2
#define N 6
#define STEPS 2
#define REPEAT 2

static char gpt_path[300], glu_path[300], emu_path[300], gpt_weights[300], glu_weights[300];

/* the modules and weights, in the scratch directory that harness_run makes */
static void setup(void)
{
    snprintf(gpt_path, sizeof gpt_path, "%s/gpt.so", tmpdir);
    snprintf(glu_path, sizeof glu_path, "%s/glu.so", tmpdir);
    snprintf(emu_path, sizeof emu_path, "%s/gpt_emu.so", tmpdir);
    snprintf(gpt_weights, sizeof gpt_weights, "%s/gpt.safetensors", tmpdir);
    snprintf(glu_weights, sizeof glu_weights, "%s/glu.safetensors", tmpdir);
    tiny_compile(tiny_gpt_src, gpt_path, "cpu");
    tiny_compile(tiny_glu_src, glu_path, "cpu");
    tiny_compile(tiny_gpt_src, emu_path, "cuda-emu");
    tiny_write_weights(gpt_path, gpt_weights, 1);
    tiny_write_weights(glu_path, glu_weights, 2);
}

typedef struct {
    const char *module_path, *weights_path;
    XtcModule *shared;   /* a module loaded once, used by several threads; else each loads its own */
    int threads;         /* the session's pool */
    uint64_t seed;       /* of its inputs */
    int id;
    /* results */
    uint64_t hash;       /* of every loss, gradient, weight and checkpoint byte, in order */
    float loss[STEPS + 1];
    int failed;
    char msg[600];
} Job;

/* Hashes every output of the last run (loss, logits, grad.*) into job->hash. */
static int hash_outputs(Job *j, XtcSession *s, const XtcModule *m)
{
    for (int i = 0; i < xtc_module_count(m, XTC_OUTPUT); i++) {
        XtcTensorInfo info;
        XtcTensor t;
        xtc_module_tensor(m, XTC_OUTPUT, i, &info);
        if (xtc_session_get_output(s, info.name, &t) != XTC_OK)
            return -1;
        j->hash = tiny_hash(j->hash, t.data, (size_t)tiny_numel(&t) * xtc_dtype_size(t.dtype));
    }
    return 0;
}

#define TRY(j, s, expr)                                                                                   \
    do {                                                                                                  \
        if ((expr) != XTC_OK) {                                                                           \
            snprintf((j)->msg, sizeof (j)->msg, "job %d: %s: %s", (j)->id, #expr, xtc_session_error(s)); \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)

/* The whole life cycle; results into j. Safe to run in any thread. */
static void run_job(Job *j)
{
    XtcModule *m = j->shared;
    XtcSession *s = NULL;
    j->hash = TINY_HASH_START;
    j->failed = 1;
    if (!m && xtc_module_load(j->module_path, &m) != XTC_OK) {
        snprintf(j->msg, sizeof j->msg, "job %d: loading %s: %s", j->id, j->module_path, xtc_module_error(m));
        goto fail;
    }
    XtcSessionOptions so = {.threads = j->threads};
    if (xtc_session_new(m, &so, &s) != XTC_OK) {
        snprintf(j->msg, sizeof j->msg, "job %d: session: %s", j->id, xtc_session_error(s));
        goto fail;
    }
    TRY(j, s, xtc_session_load_weights(s, j->weights_path));
    int64_t tokens[B * N], targets[B * N], shape[2] = {B, N};
    tiny_batch(tokens, targets, B, N, j->seed);
    TRY(j, s, xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens));
    TRY(j, s, xtc_session_set_input(s, "targets", XTC_I64, 2, shape, targets));
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 1e-2f;
    opt.max_grad_norm = 1.0f;
    XtcTensor t;
    for (int k = 0; k <= STEPS; k++) {
        TRY(j, s, xtc_session_run(s));
        TRY(j, s, xtc_session_get_output(s, "loss", &t));
        j->loss[k] = *(const float *)t.data;
        if (hash_outputs(j, s, m))
            goto fail;
        if (k < STEPS)
            TRY(j, s, xtc_session_step(s, &opt));
    }
    char ckpt[400];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.%d.safetensors", tmpdir, j->id);
    TRY(j, s, xtc_session_save_checkpoint(s, ckpt, NULL, NULL, 0));
    RtStFile *f = NULL;
    char err[512];
    if (rt_st_open(ckpt, &f, err, sizeof err) != 0) {
        snprintf(j->msg, sizeof j->msg, "job %d: reading %.300s: %.250s", j->id, ckpt, err);
        goto fail;
    }
    for (int i = 0; i < rt_st_count(f); i++) {
        const RtStTensor *ti = rt_st_get(f, i);
        j->hash = tiny_hash(j->hash, ti->name, strlen(ti->name));
        j->hash = tiny_hash(j->hash, ti->data, ti->nbytes);
    }
    rt_st_close(f);
    unlink(ckpt);
    j->failed = 0;
fail:
    xtc_session_free(s);
    if (!j->shared)
        xtc_module_free(m);
}

static void *thread_main(void *arg)
{
    Job *j = arg;
    Job mine = *j;
    for (int r = 0; r < REPEAT && !j->failed; r++) {
        run_job(&mine);
        if (mine.failed || mine.hash != j->hash) {
            snprintf(j->msg, sizeof j->msg, "%s", mine.failed ? mine.msg : "results differ from the job run alone");
            j->failed = 1;
        }
    }
    return NULL;
}

START_TEST(test_concurrent_sessions)
{
    XtcModule *shared = NULL;
    ck_assert_msg(xtc_module_load(gpt_path, &shared) == XTC_OK, "%s", xtc_module_error(shared));
    Job jobs[] = {
        {.module_path = gpt_path, .weights_path = gpt_weights, .threads = 1, .seed = 1},
        {.module_path = gpt_path, .weights_path = gpt_weights, .threads = 2, .seed = 2}, /* same file */
        {.module_path = glu_path, .weights_path = glu_weights, .threads = 2, .seed = 3}, /* another */
        {.module_path = glu_path, .weights_path = glu_weights, .threads = 1, .seed = 3}, /* same inputs */
        {.module_path = gpt_path, .weights_path = gpt_weights, .shared = shared, .threads = 2, .seed = 4},
        {.module_path = gpt_path, .weights_path = gpt_weights, .shared = shared, .threads = 1, .seed = 5},
        {.module_path = emu_path, .weights_path = gpt_weights, .threads = 1, .seed = 6},
    };
    int njobs = (int)(sizeof jobs / sizeof jobs[0]);
    /* alone, one after the other: the expected results */
    for (int i = 0; i < njobs; i++) {
        jobs[i].id = i;
        run_job(&jobs[i]);
        ck_assert_msg(!jobs[i].failed, "%s", jobs[i].msg);
        ck_assert_msg(jobs[i].loss[STEPS] < jobs[i].loss[0], "job %d: the steps did not lower the loss", i);
    }
    /* the same inputs through 1 and 2 pool threads give the same bits */
    ck_assert_msg(jobs[2].hash == jobs[3].hash, "glu.so: 2 pool threads differ from 1");
    /* all at once */
    pthread_t th[sizeof jobs / sizeof jobs[0]];
    for (int i = 0; i < njobs; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    for (int i = 0; i < njobs; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < njobs; i++)
        ck_assert_msg(!jobs[i].failed, "thread %d: %s", i, jobs[i].msg);
    xtc_module_free(shared);
}
END_TEST

static void *job_main(void *arg)
{
    run_job(arg);
    return NULL;
}

/* A session run from a thread with a small stack (256 KiB; the kernels' tiles take more than that)
 * succeeds with the results of a run on the main thread: the run moves to a thread with a stack
 * big enough (rt_run_module). It crashed (SIGSEGV) before. */
START_TEST(test_small_stack)
{
    for (int threads = 1; threads <= 2; threads++) {
        Job alone = {.module_path = gpt_path, .weights_path = gpt_weights, .threads = threads, .seed = 7};
        run_job(&alone);
        ck_assert_msg(!alone.failed, "%s", alone.msg);
        Job small = alone;
        small.hash = 0;
        pthread_attr_t attr;
        pthread_t t;
        ck_assert_int_eq(pthread_attr_init(&attr), 0);
        ck_assert_int_eq(pthread_attr_setstacksize(&attr, 256 << 10), 0);
        ck_assert_int_eq(pthread_create(&t, &attr, job_main, &small), 0);
        pthread_attr_destroy(&attr);
        pthread_join(t, NULL);
        ck_assert_msg(!small.failed, "on a 256 KiB stack: %s", small.msg);
        ck_assert_msg(small.hash == alone.hash, "on a 256 KiB stack: results differ from the main thread's");
    }
}
END_TEST

/* XTC_THREADS_AUTO: a thread per CPU the process may use, as the affinity mask says (taskset), not
 * per CPU of the machine. */
START_TEST(test_threads_follow_affinity)
{
    cpu_set_t all, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int n = CPU_COUNT(&all);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(gpt_path, &m) == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, &(XtcSessionOptions){.threads = XTC_THREADS_AUTO}, &s) == XTC_OK, "%s",
                  xtc_session_error(s));
    ck_assert_int_eq(xtc_session_threads(s), n > 1024 ? 1024 : n);
    xtc_session_free(s);
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK); /* 0 = 1 */
    ck_assert_int_eq(xtc_session_threads(s), 1);
    xtc_session_free(s);
    /* this process (Check runs each test in one) on one CPU: one thread */
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
    ck_assert_int_eq(rt_cpus_available(), 1);
    ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = XTC_THREADS_AUTO}, &s), XTC_OK);
    ck_assert_int_eq(xtc_session_threads(s), 1);
    xtc_session_free(s);
    ck_assert_int_eq(sched_setaffinity(0, sizeof all, &all), 0);
    ck_assert_int_eq(xtc_session_threads(NULL), 0);
    xtc_module_free(m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("concurrent sessions");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_concurrent_sessions);
    tcase_add_test(tc, test_small_stack);
    tcase_add_test(tc, test_threads_follow_affinity);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(suite(), "threads");
}
