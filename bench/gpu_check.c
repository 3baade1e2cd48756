/* gpu_check.c: the program of bench/gpu_check.sh: runs one case of a compiled module through the
 * public API (include/xtc.h, libxtc_rt.a: no LLVM) and either writes what it computed (the
 * reference, from a --target cpu module at prepare time) or compares it with such a reference
 * (a --target cuda module on the GPU).
 *
 *   gpu_check ref   MODULE.so OUT.ref MODE SHAPE SEED
 *   gpu_check check MODULE.so REF.ref MODE SHAPE SEED RTOL RTOL_GRAD
 *
 * MODE and SHAPE:
 *   fwd    BxN   one run on tokens [B, N]: every output (logits)
 *   train  BxN   one run of a --train module on tokens and targets [B, N]: loss and grad.<param>
 *                (an fp16 module's loss scale halved and the run repeated while it overflows,
 *                as a training loop does)
 *   decode PxT   a --kv-cache module: a prompt of P tokens (batch 1), then T one-token calls, each
 *                carrying cache.<l>.k/.v: the prompt's logits, each call's, and the caches after
 *                the last call
 * fwd and train run twice and check the second run (on a GPU, the replay of the CUDA graph the
 * first captured); decode's calls each capture one (a new cache length each).
 * The weights are xtc_session_init_weights(SEED) and the tokens and targets come from SEED, so
 * the CPU and the GPU runs see the same numbers. A reference keeps, per output tensor, its size,
 * its largest |value| and up to REF_SAMPLES values at an odd stride over the flat tensor (every
 * row and column position is visited; the kit stays small). check compares those values within
 * 1e-7 + RTOL max|ref| (RTOL_GRAD for grad.<param>), checks that every element of the device's
 * tensor is finite and that its largest |value| is max|ref| within the same bound, and prints
 * one line: the worst error as a fraction of its tensor's max|ref|, which tensor, the tolerance.
 * Exit status: 0 pass, 1 a tensor out of tolerance, 2 a usage, file or runtime error. */
#include "bench_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc.h"

#define REF_SAMPLES 16384
#define ATOL 1e-7

typedef struct {
    char name[128];
    int64_t numel, stride, nsamples;
    double maxabs;
    float *samples;
} Ref;

typedef struct {
    int writing;        /* ref: write to f; check: compare with refs */
    FILE *f;
    Ref *refs;
    int nrefs;
    double rtol, rtol_grad;
    double worst;       /* the largest error / tolerance */
    double worst_rel;   /* its error / max|ref| */
    char worst_name[200];
    int seen, failed;
} Sink;

static int64_t numel_of(const XtcTensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

/* One tensor the case produced, under a name unique within the case. */
static int take(Sink *k, const char *name, const XtcTensor *t)
{
    if (t->dtype != XTC_F32)
        return 0;
    const float *x = t->data;
    int64_t n = numel_of(t);
    if (k->writing) {
        int64_t stride = n <= REF_SAMPLES ? 1 : (n + REF_SAMPLES - 1) / REF_SAMPLES;
        stride += stride > 1 && stride % 2 == 0;
        int64_t ns = n ? (n - 1) / stride + 1 : 0;
        double mx = 0;
        for (int64_t i = 0; i < n; i++)
            mx = fmax(mx, fabs(x[i]));
        Ref r = {.numel = n, .stride = stride, .nsamples = ns, .maxabs = mx};
        memcpy(r.name, name, strlen(name) < sizeof r.name ? strlen(name) : sizeof r.name - 1);
        if (fwrite(&r, sizeof r - sizeof r.samples, 1, k->f) != 1)
            return 1;
        for (int64_t i = 0; i < ns; i++)
            if (fwrite(&x[i * stride], sizeof *x, 1, k->f) != 1)
                return 1;
        k->seen++;
        return 0;
    }
    const Ref *r = NULL;
    for (int i = 0; i < k->nrefs && !r; i++)
        if (!strcmp(k->refs[i].name, name))
            r = &k->refs[i];
    k->seen++;
    if (!r) {
        printf("output '%s' is not in the reference\n", name);
        k->failed = 1;
        return 0;
    }
    if (r->numel != n) {
        printf("output '%s' has %lld elements, the reference %lld\n", name, (long long)n, (long long)r->numel);
        k->failed = 1;
        return 0;
    }
    double tol = ATOL + (strncmp(name, "grad.", 5) ? k->rtol : k->rtol_grad) * r->maxabs;
    double mx = 0, err = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            printf("output '%s': element %lld is %g\n", name, (long long)i, (double)x[i]);
            k->failed = 1;
            return 0;
        }
        mx = fmax(mx, fabs(x[i]));
    }
    for (int64_t i = 0; i < r->nsamples; i++) {
        double e = fabs((double)x[i * r->stride] - (double)r->samples[i]);
        if (e > err)
            err = e, at = i * r->stride;
    }
    double e_max = fabs(mx - r->maxabs);
    if (e_max > err)
        err = e_max, at = -1;
    if (err / tol > k->worst) {
        k->worst = err / tol;
        k->worst_rel = err / fmax(r->maxabs, 1e-30);
        if (at >= 0)
            snprintf(k->worst_name, sizeof k->worst_name, "%.150s[%lld]", name, (long long)at);
        else
            snprintf(k->worst_name, sizeof k->worst_name, "%.150s (its max|x|)", name);
    }
    if (err > tol) {
        if (at >= 0)
            printf("output '%s': element %lld is %.7g, the reference %.7g (max|ref| %.4g, tolerance %.3g)\n", name,
                   (long long)at, (double)x[at], (double)r->samples[at / r->stride], r->maxabs, tol);
        else
            printf("output '%s': max|x| is %.7g, the reference's %.7g (tolerance %.3g)\n", name, mx, r->maxabs, tol);
        k->failed = 1;
    }
    return 0;
}

static int load_refs(Sink *k, const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[8];
    if (!f || fread(magic, 8, 1, f) != 1 || memcmp(magic, "XTCREF1\n", 8)) {
        fprintf(stderr, "gpu_check: %s is not a reference file\n", path);
        if (f)
            fclose(f);
        return 1;
    }
    Ref r;
    while (fread(&r, sizeof r - sizeof r.samples, 1, f) == 1) {
        Ref *more = realloc(k->refs, (size_t)(k->nrefs + 1) * sizeof *more);
        if (more)
            k->refs = more;
        r.name[sizeof r.name - 1] = 0;
        r.samples = r.nsamples >= 0 && r.nsamples <= REF_SAMPLES ? malloc((size_t)(r.nsamples + 1) * sizeof(float)) : NULL;
        if (!more || !r.samples || fread(r.samples, sizeof(float), (size_t)r.nsamples, f) != (size_t)r.nsamples) {
            fprintf(stderr, "gpu_check: %s: truncated or bad record\n", path);
            free(r.samples);
            fclose(f);
            return 1;
        }
        k->refs[k->nrefs++] = r;
    }
    fclose(f);
    return 0;
}

static int fail(XtcSession *s, const char *what)
{
    fprintf(stderr, "gpu_check: %s: %s\n", what, xtc_session_error(s));
    return 2;
}

static int64_t vocab(const XtcModule *m)
{
    XtcTensorInfo lg;
    if (xtc_module_tensor(m, XTC_OUTPUT, xtc_module_find(m, XTC_OUTPUT, "logits"), &lg) || lg.rank < 1 ||
        lg.shape[lg.rank - 1] < 1)
        return 2;
    return lg.shape[lg.rank - 1];
}

/* Every f32 output of the last run, names prefixed. */
static int take_outputs(Sink *k, const XtcModule *m, XtcSession *s, const char *prefix, const char *only)
{
    for (int i = 0; i < xtc_module_count(m, XTC_OUTPUT); i++) {
        XtcTensorInfo ti;
        XtcTensor t;
        char name[128];
        xtc_module_tensor(m, XTC_OUTPUT, i, &ti);
        if (only && strncmp(ti.name, only, strlen(only)))
            continue;
        if (xtc_session_get_output(s, ti.name, &t))
            return fail(s, ti.name);
        snprintf(name, sizeof name, "%.40s%.80s", prefix, ti.name);
        if (take(k, name, &t)) {
            fprintf(stderr, "gpu_check: cannot write the reference\n");
            return 2;
        }
    }
    return 0;
}

static int run_train(Sink *k, const XtcModule *m, XtcSession *s)
{
    int is_fp16 = xtc_module_find(m, XTC_INPUT, XTC_LOSS_SCALE_INPUT) >= 0;
    for (int tries = 0;; tries++) {
        if (xtc_session_run(s))
            return fail(s, "training run");
        XtcTensor loss;
        if (xtc_session_get_output(s, "loss", &loss))
            return fail(s, "loss");
        int finite = isfinite(*(const float *)loss.data);
        for (int i = 0; finite && i < xtc_module_count(m, XTC_OUTPUT); i++) {
            XtcTensorInfo ti;
            XtcTensor t;
            xtc_module_tensor(m, XTC_OUTPUT, i, &ti);
            if (strncmp(ti.name, "grad.", 5))
                continue;
            if (xtc_session_get_output(s, ti.name, &t))
                return fail(s, ti.name);
            const float *x = t.data;
            for (int64_t j = 0; finite && j < numel_of(&t); j++)
                finite = isfinite(x[j]);
        }
        if (finite || !is_fp16 || tries == 8)
            break;
        double sc = xtc_session_loss_scale(s);
        if (sc <= 1 || xtc_session_set_loss_scale(s, sc / 2, 0))
            break;
    }
    if (is_fp16)
        printf("loss scale %g; ", xtc_session_loss_scale(s));
    return take_outputs(k, m, s, "", NULL);
}

static int run_decode(Sink *k, const XtcModule *m, XtcSession *s, int64_t prompt, int64_t steps, int64_t V)
{
    const char *names[256], *failed = NULL;
    int nc = bench_empty_caches(s, m, names, 256, &failed);
    if (nc < 0)
        return fail(s, failed);
    if (!nc) {
        fprintf(stderr, "gpu_check: decode needs a --kv-cache module\n");
        return 2;
    }
    int64_t *tok = malloc((size_t)(prompt + steps) * sizeof *tok);
    if (!tok)
        return 2;
    for (int64_t i = 0; i < prompt + steps; i++)
        tok[i] = (int64_t)(bench_next() % (uint64_t)V);
    int64_t shape[2] = {1, prompt};
    int rc = 0;
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) || xtc_session_run(s))
        rc = fail(s, "prompt");
    if (!rc)
        rc = take_outputs(k, m, s, "prompt.", "logits");
    for (int64_t i = 0; i < steps && !rc; i++) {
        char prefix[32];
        shape[1] = 1;
        for (int c = 0; c < nc && !rc; c++)
            if (xtc_session_carry(s, names[c], names[c]))
                rc = fail(s, "carry");
        if (!rc && (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok + prompt + i) || xtc_session_run(s)))
            rc = fail(s, "one-token call");
        snprintf(prefix, sizeof prefix, "step%lld.", (long long)i);
        if (!rc)
            rc = take_outputs(k, m, s, prefix, "logits");
    }
    if (!rc)
        rc = take_outputs(k, m, s, "last.", "cache.");
    free(tok);
    return rc;
}

int main(int argc, char **argv)
{
    int writing = argc == 7 && !strcmp(argv[1], "ref");
    int checking = argc == 9 && !strcmp(argv[1], "check");
    long long B = 0, N = 0;
    const char *mode = argc > 4 ? argv[4] : "";
    if ((!writing && !checking) || (strcmp(mode, "fwd") && strcmp(mode, "train") && strcmp(mode, "decode")) ||
        sscanf(argv[5], "%lldx%lld", &B, &N) != 2 || B < 1 || N < 1) {
        fprintf(stderr, "usage: gpu_check ref   MODULE.so OUT.ref fwd|train|decode BxN|PxT SEED\n"
                        "       gpu_check check MODULE.so REF.ref fwd|train|decode BxN|PxT SEED RTOL RTOL_GRAD\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[6], NULL, 10);
    bench_rng = BENCH_RNG_START ^ (seed * 0x9E3779B97F4A7C15ull);
    Sink k = {.writing = writing, .worst_name = "-"};
    if (checking) {
        k.rtol = atof(argv[7]);
        k.rtol_grad = atof(argv[8]);
        if (!(k.rtol > 0) || !(k.rtol_grad > 0)) {
            fprintf(stderr, "gpu_check: RTOL and RTOL_GRAD must be > 0\n");
            return 2;
        }
        if (load_refs(&k, argv[3]))
            return 2;
    } else {
        k.f = fopen(argv[3], "wb");
        if (!k.f || fwrite("XTCREF1\n", 8, 1, k.f) != 1) {
            fprintf(stderr, "gpu_check: cannot write %s\n", argv[3]);
            return 2;
        }
    }
    XtcModule *m;
    XtcSession *s = NULL;
    int rc = 0;
    if (xtc_module_load(argv[2], &m)) {
        fprintf(stderr, "gpu_check: %s\n", xtc_module_error(m));
        rc = 2;
    }
    XtcSessionOptions so = {.threads = XTC_THREADS_AUTO};
    if (!rc && xtc_session_new(m, &so, &s))
        rc = fail(s, "session");
    if (!rc && xtc_session_init_weights(s, seed))
        rc = fail(s, "weights");
    int64_t V = rc ? 2 : vocab(m);
    if (!rc && !strcmp(mode, "decode")) {
        rc = run_decode(&k, m, s, B, N, V);
    } else if (!rc) {
        int64_t shape[2] = {B, N};
        int64_t *tok = malloc((size_t)(B * N) * sizeof *tok), *tgt = malloc((size_t)(B * N) * sizeof *tgt);
        if (!tok || !tgt) {
            fprintf(stderr, "gpu_check: out of memory\n");
            rc = 2;
        }
        for (int64_t i = 0; !rc && i < B * N; i++) {
            tok[i] = (int64_t)(bench_next() % (uint64_t)V);
            tgt[i] = (int64_t)(bench_next() % (uint64_t)V);
        }
        int train = !strcmp(mode, "train");
        if (!rc && (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) ||
                    (train && xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt))))
            rc = fail(s, "inputs");
        /* a run first, its outputs unread: the checked one is the binding's second, which a CUDA
         * device replays from the graph the first captured (XTC_CUDA_GRAPHS=0: launched anew) */
        if (!rc && xtc_session_run(s))
            rc = fail(s, "first run");
        if (!rc && train)
            rc = run_train(&k, m, s);
        else if (!rc && xtc_session_run(s))
            rc = fail(s, "run");
        else if (!rc)
            rc = take_outputs(&k, m, s, "", NULL);
        free(tok);
        free(tgt);
    }
    if (!rc && !k.seen) {
        fprintf(stderr, "gpu_check: the case produced no f32 output\n");
        rc = 2;
    }
    if (!rc && checking && k.seen != k.nrefs) {
        printf("%d outputs, the reference has %d\n", k.seen, k.nrefs);
        k.failed = 1;
    }
    if (!rc && checking) {
        printf("%d tensors; worst %.2e of max|ref| at %s (tolerance %.0e, grads %.0e) on %s\n", k.seen, k.worst_rel,
               k.worst_name, k.rtol, k.rtol_grad, xtc_session_device(s));
        rc = k.failed;
    }
    if (k.f && fclose(k.f) && !rc) {
        fprintf(stderr, "gpu_check: cannot write %s\n", argv[3]);
        rc = 2;
    }
    for (int i = 0; i < k.nrefs; i++)
        free(k.refs[i].samples);
    free(k.refs);
    xtc_session_free(s);
    xtc_module_free(m);
    return rc;
}
