/* cmd_train.c: `xtc train`: byte-level language modelling (vocabulary 256) on any file.
 *
 * The model is compiled twice: a training module (loss and grad.<param>, xtc compile --train,
 * dropout on where the model's rates say so, seeded per step) whose gradients feed the runtime's
 * AdamW step, and a forward module with the loss for the held-out split (no dropout). Batches are random windows of the first part of the file (seeded), the held-out
 * split is its last part, evaluated on fixed windows. Checkpoints hold the weights, the
 * optimizer state and, in the metadata, everything needed to continue the same run exactly: the
 * step, the batch sampler's random state, and the data's size and hash.
 *
 * Under `mpirun -np N` (train_dist.c) every rank draws the same global batch from the same random
 * state and computes rows [B*r/N, B*(r+1)/N) of it; the runtime sums the gradients, each weighted
 * by its rank's share of the rows (rt_comm.c), so the step is that of the whole batch on one
 * process up to rounding. Losses are averaged over the ranks, validation windows are split
 * among them, and rank 0 alone prints and writes checkpoints. A stop signal on any rank reaches
 * all of them through the per-step reduction of the loss. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "rt_internal.h"
#include "init.h"
#include "rt_fileio.h"
#include "safetensors.h"
#include "train.h"

/* ---- shared with cmd_generate.c ---- */

int cli_default_threads(void)
{
    int n = rt_cpus_available(); /* the affinity mask (taskset), not every CPU of the machine */
    return n > 64 ? 64 : n;
}

static const XtfValue *model_call(const XtfFile *f, const char *model, const char **name)
{
    const XtfStmt *st = model ? xtf_find(f, model) : f->nstmts ? &f->stmts[f->nstmts - 1] : NULL;
    if (!st)
        return NULL;
    *name = st->name;
    const XtfValue *v = st->value;
    while (v && v->kind == XV_REF)
        v = v->ref;
    return v && v->kind == XV_CALL ? v : NULL;
}

int cli_check_byte_lm(const XtfFile *f, const char *model, const char *what)
{
    const char *name = model ? model : "?";
    const XtfValue *call = model_call(f, model, &name);
    if (!call) {
        fprintf(stderr, "xtc %s: %s: no model%s%s\n", what, f->path, model ? " named " : "", model ? model : "");
        return -1;
    }
    const XtfValue *layers = strcmp(call->s, "TransformerWrapper") == 0 ? xtf_callv(call, "attn_layers") : NULL;
    if (!layers || strcmp(layers->s, "Decoder") != 0) {
        fprintf(stderr, "xtc %s: %s: '%s' is a %s%s%s; byte-level language modelling needs a causal "
                        "TransformerWrapper(attn_layers = Decoder(...))\n", what, f->path, name, call->s,
                layers ? " around an " : "", layers ? layers->s : "");
        return -1;
    }
    int64_t V = xtf_int(call, "num_tokens");
    if (V < 256) {
        fprintf(stderr, "xtc %s: %s: '%s' has num_tokens = %" PRId64 "; byte-level text needs at least 256 "
                        "(one token per byte value)\n", what, f->path, name, V);
        return -1;
    }
    if (xtf_bool(layers, "cross_attend") || xtf_int(call, "max_mem_len") > 0) {
        fprintf(stderr, "xtc %s: %s: '%s' %s, which plain text does not provide\n", what, f->path, name,
                xtf_bool(layers, "cross_attend") ? "cross-attends to a context" : "carries Transformer-XL memories");
        return -1;
    }
    return 0;
}

/* ---- options ---- */

void cli_train_defaults(CliTrainOpts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 1000;
    o->batch = 16;
    o->lr = 1e-3;
    o->min_lr = 0.1;
    o->warmup = -1;
    o->cosine = 1;
    o->beta1 = 0.9;
    o->beta2 = 0.99;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->clip = 1.0;
    o->val_every = 200;
    o->val_tokens = -1; /* min(65536, the tokens trained between two validations) */
    o->val_fraction = 0.1;
    o->seed = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fmt_duration(char *buf, size_t n, double s)
{
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, n, "?");
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Shannon entropy of the byte distribution, bits per byte. */
static double unigram_bits(const unsigned char *p, size_t n)
{
    double count[256] = {0}, h = 0;
    for (size_t i = 0; i < n; i++)
        count[p[i]]++;
    for (int c = 0; c < 256; c++)
        if (count[c] > 0)
            h -= count[c] / n * log2(count[c] / n);
    return h;
}

/* XTC_TRAIN_HASHES=PREFIX (a debugging aid for the distributed tests): each rank appends "step
 * loss hash" to PREFIX.<rank> after every step, the hash (FNV-1a) over every parameter's bytes. */
static void write_hash(XtcSession *s, const XtcModule *m, int64_t step, double loss)
{
    const char *prefix = getenv("XTC_TRAIN_HASHES");
    if (!prefix || !*prefix)
        return;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < xtc_module_count(m, XTC_PARAM); i++) {
        XtcTensorInfo info;
        XtcTensor t;
        xtc_module_tensor(m, XTC_PARAM, i, &info);
        if (xtc_session_get_weight(s, info.name, &t))
            continue;
        int64_t n = 1;
        for (int d = 0; d < t.rank; d++)
            n *= t.shape[d];
        const unsigned char *p = t.data;
        for (int64_t k = 0; k < n * 4; k++)
            h = (h ^ p[k]) * 0x100000001b3ull;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", prefix, cli_dist_rank());
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%" PRId64 " %.9g %016" PRIx64 "\n", step, loss, h);
        fclose(f);
    }
}

/* ---- the run ---- */

typedef struct {
    XtcModule *train_mod, *eval_mod;  /* eval_mod may be train_mod */
    XtcSession *train, *eval;         /* eval may be train */
    int64_t V, maxlen;
    int has_seed;                     /* the training module has a dropout_seed input */
} Models;

static volatile sig_atomic_t interrupted; /* the signal that asked the run to stop, or 0 */

/* SIGINT (Ctrl-C), SIGTERM (kill, a job scheduler's time limit) and SIGHUP (the terminal closed)
 * all stop the run after the step in progress, with a checkpoint to resume from */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define NSTOP ((int)(sizeof stop_signals / sizeof stop_signals[0]))

static void on_stop_signal(int sig)
{
    interrupted = sig;
}

static const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

/* The checkpoint must be writable before any work: its directory exists and takes a new file
 * (a probe created and removed there), and the path is not a directory. */
static int check_ckpt_target(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "xtc train: --ckpt %s is a directory; name a file (such as %s/model.safetensors)\n", path,
                path);
        return -1;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096], probe[4200];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else {
        fprintf(stderr, "xtc train: --ckpt: the path is too long\n");
        return -1;
    }
    snprintf(probe, sizeof probe, "%s/.xtc-ckpt-probe.XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) {
        fprintf(stderr, "xtc train: cannot write the checkpoint %s: directory %s: %s\n", path, dir, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

static int has_grads(const XtcModule *m)
{
    for (int i = 0; i < xtc_module_count(m, XTC_OUTPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_OUTPUT, i, &t);
        if (!strncmp(t.name, "grad.", 5))
            return 1;
    }
    return 0;
}

/* The module must read tokens and targets (and at most a dropout seed) and give logits and loss. */
static int check_lm_module(const XtcModule *m, const char *path, int need_grads, int64_t *V)
{
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo t;
        xtc_module_tensor(m, XTC_INPUT, i, &t);
        if (strcmp(t.name, "tokens") && strcmp(t.name, "targets") && strcmp(t.name, "dropout_seed") &&
            strcmp(t.name, XTC_LOSS_SCALE_INPUT)) { /* the session binds the loss scale (fp16) */
            fprintf(stderr, "xtc train: %s: input '%s' is not something a text provides (inputs: tokens, "
                            "targets)\n", path, t.name);
            return -1;
        }
    }
    int lg = xtc_module_find(m, XTC_OUTPUT, "logits");
    if (xtc_module_find(m, XTC_INPUT, "targets") < 0 || xtc_module_find(m, XTC_OUTPUT, "loss") < 0 || lg < 0 ||
        (need_grads && !has_grads(m))) {
        fprintf(stderr, "xtc train: %s: not a training module (compile it with --train, or pass the .xtf)\n", path);
        return -1;
    }
    XtcTensorInfo t;
    xtc_module_tensor(m, XTC_OUTPUT, lg, &t);
    *V = t.shape[t.rank - 1];
    if (*V < 256) {
        fprintf(stderr, "xtc train: %s: the model has %" PRId64 " tokens; byte-level text needs at least 256\n",
                path, *V);
        return -1;
    }
    return 0;
}

static int64_t symbol_max(const XtcModule *m, const char *sym)
{
    for (int i = 0; i < xtc_module_num_symbols(m); i++) {
        const char *name;
        int64_t max;
        xtc_module_symbol(m, i, &name, &max);
        if (!strcmp(name, sym))
            return max;
    }
    return 0;
}

/* Compiles (or loads) the training and evaluation modules. */
static int get_models(const XtfFile *f, const char *model, const char *module_path, Models *M)
{
    XtfFile *owned = NULL;
    char name[256];
    const char *path = f ? f->path : module_path;
    if (!f) {
        XtcModule *m = cli_load_module(module_path);
        if (!m)
            return -1;
        if (has_grads(m) && xtc_module_find(m, XTC_INPUT, "dropout_seed") < 0) {
            M->train_mod = M->eval_mod = m; /* a training module without dropout: validates too */
            goto check;
        }
        owned = cli_module_xtf(m, module_path);
        snprintf(name, sizeof name, "%s", xtc_module_name(m));
        model = name;
        if (!owned) {
            xtc_module_free(m);
            return -1;
        }
        if (has_grads(m)) { /* with dropout: validation needs a module that does not drop */
            M->train_mod = m;
            fprintf(stderr, "compiling the evaluation module of %s ...\n", module_path);
            DrvJob e = {.model = model, .lower = {.train = 1}};
            M->eval_mod = cli_build_load(owned, &e);
            xtf_free(owned);
            if (!M->eval_mod)
                return -1;
            goto check;
        }
        xtc_module_free(m);
        f = owned;
    }
    if (cli_check_byte_lm(f, model, "train") != 0) {
        xtf_free(owned);
        return -1;
    }
    fprintf(stderr, "compiling %s (training and evaluation modules) ...\n", path);
    double t0 = now_s();
    DrvJob b = {.model = model, .lower = {.train = 1, .dropout = 1}, .grads = 1};
    M->train_mod = cli_build_load(f, &b);
    DrvJob e = {.model = model, .lower = {.train = 1}};
    M->eval_mod = M->train_mod ? cli_build_load(f, &e) : NULL;
    xtf_free(owned);
    if (!M->eval_mod)
        return -1;
    fprintf(stderr, "compiled in %.1f s\n", now_s() - t0);
check:
    if (check_lm_module(M->train_mod, path, 1, &M->V) != 0)
        return -1;
    M->maxlen = symbol_max(M->train_mod, "n");
    M->has_seed = xtc_module_find(M->train_mod, XTC_INPUT, "dropout_seed") >= 0;
    return 0;
}

/* eval <- train, every parameter and buffer */
static int copy_weights(XtcSession *to, XtcSession *from, const XtcModule *m)
{
    for (int kind = XTC_PARAM; kind <= XTC_STATE; kind++)
        for (int i = 0; i < xtc_module_count(m, (XtcKind)kind); i++) {
            XtcTensorInfo info;
            XtcTensor t;
            xtc_module_tensor(m, (XtcKind)kind, i, &info);
            if (xtc_session_get_weight(from, info.name, &t)) {
                fprintf(stderr, "xtc train: %s\n", xtc_session_error(from));
                return -1;
            }
            if (xtc_session_set_weight(to, info.name, t.rank, t.shape, t.data)) {
                fprintf(stderr, "xtc train: %s\n", xtc_session_error(to));
                return -1;
            }
        }
    return 0;
}

/* Runs one batch (tokens, targets of rows x seq) and returns its loss through *loss. */
static int run_batch(XtcSession *s, const int64_t *tok, const int64_t *tgt, int64_t rows, int64_t seq,
                     int seed_input, uint64_t seed, double *loss)
{
    int64_t shape[2] = {rows, seq};
    int64_t sv = (int64_t)(seed & 0x7fffffffffffffffull);
    XtcTensor t;
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok) ||
        xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt) ||
        (seed_input && xtc_session_set_input(s, "dropout_seed", XTC_I64, 0, shape, &sv)) || xtc_session_run(s) ||
        xtc_session_get_output(s, "loss", &t)) {
        fprintf(stderr, "xtc train: %s\n", xtc_session_error(s));
        return -1;
    }
    *loss = *(const float *)t.data;
    return 0;
}

/* Mean loss over fixed windows of the held-out split (each window weighs the same). */
static int validate(Models *M, const unsigned char *val, size_t nval, const CliTrainOpts *o, int64_t seq,
                    int64_t val_tokens, double *loss)
{
    if (M->eval != M->train && copy_weights(M->eval, M->train, M->eval_mod) != 0)
        return -1;
    /* the training session validating (no dropout): each rank runs its own windows, nothing summed */
    if (M->eval == M->train && cli_dist_size() > 1 && xtc_session_set_comm_paused(M->eval, 1) != XTC_OK) {
        fprintf(stderr, "xtc train: %s\n", xtc_session_error(M->eval));
        return -1;
    }
    int64_t windows = ((int64_t)nval - 1) / seq;
    if (val_tokens > 0 && windows > (val_tokens + seq - 1) / seq)
        windows = (val_tokens + seq - 1) / seq;
    int64_t rows = o->batch;
    int64_t *tok = malloc((size_t)(rows * seq) * sizeof *tok), *tgt = malloc((size_t)(rows * seq) * sizeof *tgt);
    if (!tok || !tgt) {
        free(tok);
        free(tgt);
        fprintf(stderr, "xtc train: out of memory\n");
        return -1;
    }
    double sum = 0;
    int rc = 0;
    /* this rank's windows: [first, end) */
    int64_t first = windows * cli_dist_rank() / cli_dist_size(), end = windows * (cli_dist_rank() + 1) / cli_dist_size();
    for (int64_t w = first; w < end && rc == 0; w += rows) {
        int64_t r = end - w < rows ? end - w : rows;
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < seq; j++) {
                tok[i * seq + j] = val[(w + i) * seq + j];
                tgt[i * seq + j] = val[(w + i) * seq + j + 1];
            }
        double l;
        rc = run_batch(M->eval, tok, tgt, r, seq, 0, 0, &l);
        sum += l * r;
    }
    free(tok);
    free(tgt);
    if (M->eval == M->train && cli_dist_size() > 1)
        xtc_session_set_comm_paused(M->eval, 0);
    if (rc) /* the other ranks wait in the sum: the caller ends the job */
        return rc;
    cli_dist_sum(&sum, 1);
    *loss = sum / (double)windows;
    return rc;
}

static double lr_at(const CliTrainOpts *o, int64_t step, int64_t warmup)
{
    if (step <= warmup)
        return o->lr * (double)step / (double)warmup;
    if (!o->cosine || o->steps <= warmup)
        return o->lr;
    double t = (double)(step - warmup) / (double)(o->steps - warmup);
    if (t > 1)
        t = 1;
    return o->lr * (o->min_lr + (1 - o->min_lr) * 0.5 * (1 + cos(M_PI * t)));
}

typedef struct {
    uint64_t hash, bytes;
    int64_t batch, seq;
} DataId;

/* step counts the schedule's steps; skipped those of them that loss scaling skipped (the
 * optimizer's step count is step - skipped) */
static int save_ckpt(XtcSession *s, const char *path, const RtRng *rng, const DataId *id, const CliTrainOpts *o,
                     uint64_t seed, int64_t step, int64_t skipped)
{
    char v[9][64];
    const char *keys[9] = {"xtc.train.step", "xtc.train.rng", "xtc.train.seed", "xtc.train.data_bytes",
                           "xtc.train.data_hash", "xtc.train.batch", "xtc.train.seq", "xtc.train.steps",
                           "xtc.train.skipped"};
    snprintf(v[0], sizeof v[0], "%" PRId64, step);
    snprintf(v[1], sizeof v[1], "%016" PRIx64 ":%016" PRIx64, rng->s[0], rng->s[1]);
    snprintf(v[2], sizeof v[2], "%" PRIu64, seed);
    snprintf(v[3], sizeof v[3], "%" PRIu64, id->bytes);
    snprintf(v[4], sizeof v[4], "%016" PRIx64, id->hash);
    snprintf(v[5], sizeof v[5], "%" PRId64, id->batch);
    snprintf(v[6], sizeof v[6], "%" PRId64, id->seq);
    snprintf(v[7], sizeof v[7], "%" PRId64, o->steps);
    snprintf(v[8], sizeof v[8], "%" PRId64, skipped);
    const char *vals[9];
    for (int i = 0; i < 9; i++)
        vals[i] = v[i];
    int st = xtc_session_save_checkpoint(s, path, keys, vals, 9);
    if (st != XTC_OK && st != XTC_ERR_RANGE) /* XTC_ERR_RANGE: diverged, the caller says so */
        fprintf(stderr, "xtc train: %s\n", xtc_session_error(s));
    return st;
}

/* Reads the run's state from a checkpoint's metadata (weights and optimizer are loaded apart). */
static int resume_meta(const char *path, RtRng *rng, const DataId *id, int64_t *step, int64_t *skipped,
                       const CliTrainOpts *o, uint64_t *seed)
{
    RtStFile *f;
    char err[512];
    if (rt_st_open(path, &f, err, sizeof err)) {
        fprintf(stderr, "xtc train: %s\n", err);
        return -1;
    }
    const char *st = rt_st_metadata(f, "xtc.train.step"), *r = rt_st_metadata(f, "xtc.train.rng");
    const char *bytes = rt_st_metadata(f, "xtc.train.data_bytes"), *hash = rt_st_metadata(f, "xtc.train.data_hash");
    const char *batch = rt_st_metadata(f, "xtc.train.batch"), *seq = rt_st_metadata(f, "xtc.train.seq");
    const char *skip = rt_st_metadata(f, "xtc.train.skipped"), *sd = rt_st_metadata(f, "xtc.train.seed");
    *skipped = skip ? strtoll(skip, NULL, 10) : 0;
    char *end = NULL;
    uint64_t ck_seed = sd ? strtoull(sd, &end, 10) : 0;
    int rc = -1;
    if (!st || !r || !bytes || !hash || sscanf(st, "%" SCNd64, step) != 1 ||
        sscanf(r, "%" SCNx64 ":%" SCNx64, &rng->s[0], &rng->s[1]) != 2) {
        fprintf(stderr, "xtc train: %s is not a checkpoint of xtc train (no run state in its metadata); "
                        "start from its weights with --weights\n", path);
    } else if (strtoull(bytes, NULL, 10) != id->bytes || strtoull(hash, NULL, 16) != id->hash) {
        fprintf(stderr, "xtc train: %s was trained on other data (%s bytes, hash %s); --resume continues the "
                        "same run (start from its weights with --weights instead)\n", path, bytes, hash);
    } else if (sd && (!*sd || *end)) {
        fprintf(stderr, "xtc train: %s: bad xtc.train.seed '%s' in its metadata\n", path, sd);
    } else if (sd && o->seed_given && ck_seed != o->seed) {
        fprintf(stderr, "xtc train: --seed %" PRIu64 " differs from the seed of %s (%s); --resume continues that "
                        "run with its seed (leave out --seed, or start from its weights with --weights)\n", o->seed,
                path, sd);
    } else {
        if (sd) /* the run's seed (dropout masks; the batch order is in its rng state) */
            *seed = ck_seed;
        if ((batch && strtoll(batch, NULL, 10) != id->batch) || (seq && strtoll(seq, NULL, 10) != id->seq))
            fprintf(stderr, "xtc train: note: the checkpoint was trained with --batch %s --seq %s; the run goes on "
                            "with --batch %" PRId64 " --seq %" PRId64 "\n", batch ? batch : "?", seq ? seq : "?",
                    id->batch, id->seq);
        rc = 0;
    }
    rt_st_close(f);
    return rc;
}

int cli_train_run(const XtfFile *f, const char *model, const char *module_path, const unsigned char *data,
                  size_t len, const char *data_name, const CliTrainOpts *o)
{
    Models M = {0};
    int rc = 1;
    int64_t *tok = NULL, *tgt = NULL;
    struct sigaction old_sig[NSTOP];
    int handler = 0;
    const int lead = cli_dist_rank() == 0, nranks = cli_dist_size(); /* rank 0 prints and saves */
    if (lead && o->ckpt && check_ckpt_target(o->ckpt) != 0)
        return 1;
    if (o->batch < nranks) {
        fprintf(stderr, "xtc train: --batch %" PRId64 " is fewer sequences than the %d ranks\n", o->batch, nranks);
        return 1;
    }
    /* this rank's rows of the global batch: [row0, row0 + rows) */
    const int64_t row0 = o->batch * cli_dist_rank() / nranks;
    const int64_t rows = o->batch * (cli_dist_rank() + 1) / nranks - row0;
    if (get_models(f, model, module_path, &M) != 0)
        goto done;
    int64_t seq = o->seq ? o->seq : (M.maxlen && M.maxlen < 256 ? M.maxlen : 256);
    if (seq < 1 || (M.maxlen && seq > M.maxlen)) {
        fprintf(stderr, "xtc train: --seq %" PRId64 " is outside [1, max_seq_len = %" PRId64 "]\n", seq, M.maxlen);
        goto done;
    }
    size_t nval = (size_t)((double)len * o->val_fraction), ntrain = len - nval;
    if (ntrain < (size_t)seq + 2 || nval < (size_t)seq + 1) {
        fprintf(stderr, "xtc train: %s: %zu bytes are too few for training windows of %" PRId64
                        " bytes and a held-out split (%.0f%%) of at least one window\n",
                data_name, len, seq + 1, 100 * o->val_fraction);
        goto done;
    }
    const unsigned char *val = data + ntrain;
    int threads = o->threads ? o->threads : cli_default_threads();
    XtcSessionOptions so = {.threads = threads};
    if (xtc_session_new(M.train_mod, &so, &M.train) != XTC_OK) {
        fprintf(stderr, "xtc train: %s\n", M.train ? xtc_session_error(M.train) : "out of memory");
        goto done;
    }
    M.eval = M.train;
    if (M.eval_mod != M.train_mod && xtc_session_new(M.eval_mod, &so, &M.eval) != XTC_OK) {
        fprintf(stderr, "xtc train: %s\n", M.eval ? xtc_session_error(M.eval) : "out of memory");
        goto done;
    }
    DataId id = {.hash = fnv1a(data, len), .bytes = len, .batch = o->batch, .seq = seq};
    RtRng rng;
    rt_rng_seed(&rng, o->seed ^ 0x5ca1ab1edull);
    uint64_t seed = o->seed; /* on --resume, the checkpoint's */
    int64_t start = 0, skipped = 0; /* steps skipped by loss scaling (fp16 modules) */
    if (o->resume) {
        if (resume_meta(o->resume, &rng, &id, &start, &skipped, o, &seed) != 0)
            goto done;
        if (xtc_session_load_checkpoint(M.train, o->resume, 1) != XTC_OK) {
            fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
            goto done;
        }
        if (xtc_session_step_count(M.train) + skipped != start) {
            fprintf(stderr, "xtc train: %s: optimizer state for step %" PRId64 ", run state for step %" PRId64
                            "\n", o->resume, xtc_session_step_count(M.train), start);
            goto done;
        }
    } else if (o->weights) {
        if (xtc_session_load_checkpoint(M.train, o->weights, 0) != XTC_OK) {
            fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
            goto done;
        }
    } else if (xtc_session_init_weights(M.train, o->seed) != XTC_OK) { /* the values `xtc init --seed` writes */
        fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
        goto done;
    }
    /* several ranks: one set of weights (rank 0's), gradients summed by this rank's share */
    if (cli_dist_attach(M.train) != 0)
        goto done;
    if (nranks > 1 && (xtc_session_set_grad_share(M.train, (double)rows / (double)o->batch) != XTC_OK ||
                       (o->zero1 && xtc_session_set_zero1(M.train, 1) != XTC_OK) ||
                       xtc_session_sync(M.train) != XTC_OK)) {
        fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
        goto done;
    }
    int64_t warmup = o->warmup >= 0 ? o->warmup : (o->steps / 10 < 100 ? o->steps / 10 : 100);
    int64_t last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
    /* validation: by default at most the tokens trained between two validations (of the whole
     * schedule, so that a resumed run validates as the uninterrupted one), at most 65536 */
    int64_t val_tokens = o->val_tokens;
    if (val_tokens < 0) {
        int64_t every = o->val_every > 0 && o->val_every < o->steps ? o->val_every : o->steps;
        double between = (double)every * (double)o->batch * (double)seq;
        val_tokens = between < 65536 ? (int64_t)between : 65536;
    }
    double unigram = unigram_bits(data, ntrain);
    if (lead) {
    printf("model %s: %.2fM parameters, vocabulary %" PRId64 ", %d thread%s\n", xtc_module_name(M.train_mod),
           xtc_module_param_count(M.train_mod) / 1e6, M.V, threads, threads == 1 ? "" : "s");
    printf("data  %s: %zu bytes (%zu training, %zu held out); unigram entropy %.3f bits/byte\n", data_name, len,
           ntrain, nval, unigram);
    printf("train %" PRId64 " steps of %" PRId64 " x %" PRId64 " tokens, AdamW lr %g (%s), warm-up %" PRId64
           ", weight decay %g, clip %g%s\n", o->steps, o->batch, seq, o->lr,
           o->cosine ? "cosine" : "constant", warmup, o->weight_decay, o->clip, start ? ", resumed" : "");
    if (nranks > 1)
        printf("data parallel: %d ranks, %" PRId64 " to %" PRId64 " sequences each; gradients, losses and "
               "validation averaged over the ranks%s\n", nranks, o->batch / nranks, (o->batch + nranks - 1) / nranks,
               o->zero1 ? "; optimizer state sharded (ZeRO-1)" : "");
    }
    if (start >= last) {
        if (lead)
            printf("nothing to do: the checkpoint is at step %" PRId64 "\n", start);
        rc = 0;
        goto done;
    }
    fflush(stdout);
    tok = malloc((size_t)(rows * seq) * sizeof *tok);
    tgt = malloc((size_t)(rows * seq) * sizeof *tgt);
    if (!tok || !tgt) {
        fprintf(stderr, "xtc train: out of memory\n");
        goto done;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    interrupted = 0;
    for (handler = 0; handler < NSTOP; handler++)
        if (sigaction(stop_signals[handler], &sa, &old_sig[handler]) != 0)
            break;
    int tty = isatty(2) && !o->quiet && lead;
    int64_t log_every = o->log_every > 0 ? o->log_every : (last - start) / 10 > 0 ? (last - start) / 10 : 1;
    XtcAdamW opt = {.beta1 = (float)o->beta1, .beta2 = (float)o->beta2, .eps = (float)o->eps,
                    .weight_decay = (float)o->weight_decay, .max_grad_norm = (float)o->clip};
    double t_begin = now_s(), step_time = 0, loss_sum = 0, val_loss = NAN, val_time = 0;
    int64_t saved = o->resume ? start : -1; /* the step of the last checkpoint written (-1: none) */
    int scaled = xtc_module_find(M.train_mod, XTC_INPUT, XTC_LOSS_SCALE_INPUT) >= 0;
    int64_t loss_n = 0, done_steps = 0;
    int64_t step;
    for (step = start + 1; step <= last; step++) {
        double t0 = now_s();
        /* every rank draws the whole batch (the random state stays one), keeps its rows */
        for (int64_t r = 0; r < o->batch; r++) {
            size_t off = (size_t)(rt_rng_next(&rng) % (uint64_t)(ntrain - (size_t)seq));
            for (int64_t j = 0; r >= row0 && r < row0 + rows && j < seq; j++) {
                tok[(r - row0) * seq + j] = data[off + (size_t)j];
                tgt[(r - row0) * seq + j] = data[off + (size_t)j + 1];
            }
        }
        double loss;
        /* dropout masks: a seed per step (kept below 2^53, exact in the interpreter too), and per
         * rank (rank 0's is that of one process), lest every rank drop the same units */
        uint64_t dseed = (seed * 0x9e3779b97f4a7c15ull + (uint64_t)step + 0xd1b54a32d192ed03ull * (uint64_t)cli_dist_rank()) &
                         ((1ull << 53) - 1);
        if (run_batch(M.train, tok, tgt, rows, seq, M.has_seed, dseed, &loss) != 0)
            goto done;
        /* the loss of the whole batch, and whether a rank was asked to stop */
        double part = loss * (double)rows / (double)o->batch, asked = interrupted;
        cli_dist_sum(&part, 1);
        cli_dist_max(&asked, 1);
        if (nranks > 1)
            loss = part;
        if (!isfinite(loss)) {
            fprintf(stderr, "%sxtc train: training diverged: the loss is %g at step %" PRId64 "; try a lower --lr",
                    tty ? "\n" : "", loss, step);
            if (o->ckpt && saved >= 0)
                fprintf(stderr, " (%s keeps step %" PRId64 ")", o->ckpt, saved);
            fprintf(stderr, "\n");
            goto done;
        }
        opt.lr = (float)lr_at(o, step, warmup);
        if (xtc_session_step(M.train, &opt) != XTC_OK) {
            fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
            goto done;
        }
        write_hash(M.train, M.train_mod, step, loss);
        /* several ranks stop together, at the step where one of them was asked to */
        int stop = nranks > 1 ? (int)asked : interrupted;
        skipped += xtc_session_step_skipped(M.train);
        double dt = now_s() - t0;
        step_time = done_steps ? 0.9 * step_time + 0.1 * dt : dt;
        done_steps++;
        loss_sum += loss;
        loss_n++;
        char eta[32];
        fmt_duration(eta, sizeof eta, step_time * (double)(last - step));
        double tps = (double)(o->batch * seq) / step_time;
        if (tty)
            fprintf(stderr, "\rstep %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  lr %.2e  ETA %s   ", step,
                    o->steps, loss_sum / loss_n, tps, opt.lr, eta);
        int is_val = (o->val_every > 0 && step % o->val_every == 0) || step == last;
        if (!tty && !o->quiet && lead && (step % log_every == 0 || step == last) && !is_val)
            fprintf(stderr, "step %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  ETA %s\n", step, o->steps,
                    loss_sum / loss_n, tps, eta);
        if (is_val || stop) {
            double tv = now_s();
            if (validate(&M, val, nval, o, seq, val_tokens, &val_loss) != 0)
                goto done;
            val_time += now_s() - tv;
            if (tty)
                fprintf(stderr, "\r%*s\r", 78, "");
            if (lead)
            printf("step %5" PRId64 "  train loss %.4f  val loss %.4f (%.3f bits/byte)  %.0f tok/s", step,
                   loss_sum / loss_n, val_loss, val_loss / M_LN2, tps);
            if (scaled && lead)
                printf("  loss scale %g, %" PRId64 " skipped", xtc_session_loss_scale(M.train), skipped);
            if (lead)
                printf("\n");
            fflush(stdout);
            loss_sum = 0;
            loss_n = 0;
        }
        int ckpt_now = o->ckpt && (is_val || stop || (o->ckpt_every > 0 && step % o->ckpt_every == 0));
        if (ckpt_now) {
            int st = xtc_session_gather_optim(M.train); /* ZeRO-1: the whole state on every rank */
            if (st != XTC_OK)
                fprintf(stderr, "xtc train: %s\n", xtc_session_error(M.train));
            else if (lead)
                st = save_ckpt(M.train, o->ckpt, &rng, &id, o, seed, step, skipped);
            cli_dist_bcast_int(&st); /* rank 0's outcome: every rank goes on or stops */
            if (!lead && st != XTC_OK) /* rank 0 said why */
                goto done;
            if (st == XTC_ERR_RANGE) { /* non-finite weights: the last good checkpoint stays */
                fprintf(stderr, "%sxtc train: training diverged at step %" PRId64 ": %s; ", tty ? "\n" : "", step,
                        xtc_session_error(M.train));
                if (saved >= 0)
                    fprintf(stderr, "%s keeps step %" PRId64 "; try a lower --lr\n", o->ckpt, saved);
                else
                    fprintf(stderr, "no checkpoint written; try a lower --lr\n");
                goto done;
            }
            if (st != XTC_OK)
                goto done;
            saved = step;
        }
        if (stop) {
            if (lead)
                printf("interrupted by %s after step %" PRId64 "%s%s%s\n", signal_name(stop), step,
                       nranks > 1 && !interrupted ? " (on another rank)" : "",
                       o->ckpt ? "; continue with --resume " : "", o->ckpt ? o->ckpt : "");
            rc = 128 + stop;
            goto done;
        }
    }
    char total[32], vt[32];
    fmt_duration(total, sizeof total, now_s() - t_begin - val_time);
    fmt_duration(vt, sizeof vt, val_time);
    if (lead)
    printf("done: %" PRId64 " steps in %s (and validation %s); val loss %.4f = %.3f bits/byte (unigram entropy "
           "%.3f bits/byte)%s%s\n", done_steps, total, vt, val_loss, val_loss / M_LN2, unigram, o->ckpt ? "; checkpoint " : "",
           o->ckpt ? o->ckpt : "");
    double comm_during = 0, comm_after = 0;
    xtc_session_comm_time(M.train, &comm_during, &comm_after);
    if (lead && nranks > 1 && done_steps > 0)
        printf("gradient sums: %.1f ms per step during the backward pass, %.1f ms after it, waits for slower "
               "ranks included (%.1f%% of the %.1f ms mean step)\n", 1e3 * comm_during / (double)done_steps, 1e3 * comm_after / (double)done_steps,
               100 * (comm_during + comm_after) / (now_s() - t_begin - val_time), 1e3 * (now_s() - t_begin - val_time) / (double)done_steps);
    if (scaled && lead)
        printf("loss scale %g; %" PRId64 " of the %" PRId64 " steps skipped (their fp16 gradients overflowed)\n",
               xtc_session_loss_scale(M.train), skipped, last);
    rc = 0;
done:
    while (handler > 0) {
        handler--;
        sigaction(stop_signals[handler], &old_sig[handler], NULL);
    }
    free(tok);
    free(tgt);
    if (M.eval != M.train)
        xtc_session_free(M.eval);
    xtc_session_free(M.train);
    if (M.eval_mod != M.train_mod)
        xtc_module_free(M.eval_mod);
    xtc_module_free(M.train_mod);
    return rc;
}

/* ---- the command ---- */

/* --beta1, --beta2: in [0, 1); --val-fraction: in (0, 1) */
static int opt_fraction(const char *v, void *ptr, char *err, size_t n, int open_lo)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(open_lo ? x > 0 : x >= 0) || !(x < 1)) {
        snprintf(err, n, "expected a number in %s0, 1), got '%s'", open_lo ? "(" : "[", v);
        return -1;
    }
    *(double *)ptr = x;
    return 0;
}

static int opt_beta(const char *v, void *ptr, char *err, size_t n)
{
    return opt_fraction(v, ptr, err, n, 0);
}

static int opt_val_fraction(const char *v, void *ptr, char *err, size_t n)
{
    return opt_fraction(v, ptr, err, n, 1);
}

/* --seed: remembered as given (--resume takes the checkpoint's seed and refuses another) */
static int opt_seed(const char *v, void *ptr, char *err, size_t n)
{
    CliTrainOpts *o = ptr;
    char *end;
    errno = 0;
    unsigned long long x = v && *v != '-' ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *v == '-' || *end || errno) {
        snprintf(err, n, "expected a non-negative integer, got '%s'", v ? v : "");
        return -1;
    }
    o->seed = (uint64_t)x;
    o->seed_given = 1;
    return 0;
}

static unsigned char *read_file(const char *path, size_t *len)
{
    struct stat st; /* a FIFO that nobody writes reads as empty instead of blocking */
    char why[600];
    int fd = rt_file_open_read(path, 0, &st, why, sizeof why);
    FILE *fp = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!fp) {
        if (fd >= 0)
            close(fd);
        fprintf(stderr, "xtc train: %s\n", fd >= 0 ? "out of memory" : why);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, fp)) > 0;) {
        n += k;
        if (n == cap) {
            unsigned char *nb = cap > ((size_t)1 << 40) ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(fp);
    fclose(fp);
    if (!buf || bad) {
        fprintf(stderr, "xtc train: cannot read %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int cli_train(int argc, char **argv)
{
    CliTrainOpts o;
    cli_train_defaults(&o);
    const char *path = NULL, *data_path = NULL, *model = NULL;
    const CliOpt opts[] = {
        {"--data", CLI_STR, &data_path, "FILE", .help = "the text to train on (required)"},
        {"--steps", CLI_I64, &o.steps, "N", .help = "steps of the schedule (1000)", .lo = 1},
        {"--batch", CLI_I64, &o.batch, "B", .help = "sequences per step (16)", .lo = 1},
        {"--seq", CLI_I64, &o.seq, "N", .help = "tokens per sequence (min(256, max_seq_len))", .lo = 1},
        {"--lr", CLI_DOUBLE, &o.lr, "X", .help = "peak learning rate (1e-3), after a linear warm-up of", .lo = 0},
        {"--warmup", CLI_I64, &o.warmup, "N", .help = "steps (min(100, steps/10)), then a cosine decay to", .lo = 0},
        {"--min-lr", CLI_DOUBLE, &o.min_lr, "F", .help = "F * lr at the last step (0.1)", .lo = 0},
        {"--constant-lr", CLI_LEVEL, &o.cosine, .help = "keep lr after the warm-up instead", .set = 0},
        {"--weight-decay", CLI_DOUBLE, &o.weight_decay, "X", .help = "AdamW's decoupled weight decay, all parameters (0.1)",
         .lo = 0},
        {"--beta1", CLI_FN, &o.beta1, "X", .help = "AdamW's beta1, in [0, 1) (0.9)", .fn = opt_beta},
        {"--beta2", CLI_FN, &o.beta2, "X", .help = "AdamW's beta2, in [0, 1) (0.99)", .fn = opt_beta},
        {"--eps", CLI_DOUBLE, &o.eps, "X", .help = "AdamW's epsilon (1e-8)", .lo = 1e-30},
        {"--clip", CLI_DOUBLE, &o.clip, "X", .help = "clip the global gradient norm (1.0; 0 = off)", .lo = 0},
        {"--threads", CLI_THREADS, &o.threads, "T", .help = "worker threads (the number of CPUs)"},
        {"--val-every", CLI_I64, &o.val_every, "K", .help = "validation loss every K steps (200; 0 = at the end only)",
         .lo = 0},
        {"--val-tokens", CLI_I64, &o.val_tokens, "N", .help = "tokens of the held-out split to evaluate (the tokens\n"
         "trained between two validations, at most 65536; 0 = all)", .lo = 0},
        {"--val-fraction", CLI_FN, &o.val_fraction, "F", .help = "the held-out share of the file, in (0, 1) (0.1)",
         .fn = opt_val_fraction},
        {"--ckpt", CLI_STR, &o.ckpt, "PATH", .help = "checkpoint (.safetensors: weights, optimizer state, run state),\n"
         "written atomically at every validation, on Ctrl-C and at the end"},
        {"--ckpt-every", CLI_I64, &o.ckpt_every, "K", .help = "also every K steps", .lo = 1},
        {"--resume", CLI_STR, &o.resume, "PATH", .help = "continue the run of a checkpoint exactly (same data and options)"},
        {"--weights", CLI_STR, &o.weights, "PATH", .help = "start from these weights with a fresh optimizer"},
        {"--stop-at", CLI_I64, &o.stop_at, "K", .help = "stop after step K as if interrupted (the schedule still spans --steps)",
         .lo = 1},
        {"--seed", CLI_FN, &o, "S", .help = "initialisation, batches and dropout (1; --resume: the checkpoint's)",
         .fn = opt_seed},
        {"--model", CLI_STR, &model, "NAME", .help = "which model of the .xtf file (the last)"},
        {"--log-every", CLI_I64, &o.log_every, "K", .help = "progress lines when stderr is not a terminal (steps/10)", .lo = 1},
        {"--quiet", CLI_FLAG, &o.quiet, .help = "no progress line"},
        {"--zero1", CLI_FLAG, &o.zero1, .help = "under mpirun: each rank keeps the optimizer state of its\n"
         "shard of the parameters only (ZeRO-1; the same updates)"},
    };
    const CliCmd cmd = {
        .name = "train", .usage = "model.xtf|model.so --data FILE [options]",
        .about = "Trains a byte-level language model (one token per byte, vocabulary 256) on any file:\n"
                 "random windows of its first part, validation on its last part (held out). The model is\n"
                 "a TransformerWrapper around a Decoder with num_tokens >= 256; a .so is used as is when it\n"
                 "is a training module (xtc compile --train), else recompiled from its embedded source.\n",
        .after = "Runs are deterministic for a given number of threads: --resume after --stop-at K gives the\n"
                 "losses of the uninterrupted run (it takes the checkpoint's seed). Ctrl-C, SIGTERM and SIGHUP\n"
                 "stop after the step in progress with a checkpoint (exit 128 + the signal). A step whose\n"
                 "loss or weights are not finite stops the run (exit 1); no such checkpoint is written.\n"
                 "Data parallel: mpirun -np N xtc train ... splits each batch over N processes (gradients,\n"
                 "losses and validation averaged; rank 0 prints and checkpoints; --resume takes any N).\n"
                 "A CUDA module's gradients are summed on the GPU with NCCL (libnccl.so.2, or $XTC_NCCL)\n"
                 "where every rank has it, else through host memory over MPI (said once).\n",
        .opts = opts, .nopts = CLI_NOPTS(opts), .pos = &path, .maxpos = 1, .pos_name = "model",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (!path || !data_path)
        return cli_usage_error(&cmd, !path ? "no model given" : "no --data given");
    if (o.ckpt && (cli_output_is_input("train", "--ckpt", o.ckpt, "--data", data_path) ||
                   cli_output_is_input("train", "--ckpt", o.ckpt, "the model", path)))
        return 2;
    if (o.resume && o.weights) {
        fprintf(stderr, "xtc train: --resume and --weights exclude each other\n");
        return 2;
    }
    if (cli_dist_start() != 0) /* under mpirun: MPI, this process's rank */
        return 1;
    size_t len = 0;
    unsigned char *data = read_file(data_path, &len);
    if (!data)
        return cli_dist_end(1);
    XtfFile *f = NULL;
    int rc = 1;
    if (cli_is_module_path(path) || !(f = cli_load_xtf(path))) {
        if (cli_is_module_path(path))
            rc = cli_train_run(NULL, model, path, data, len, data_path, &o);
    } else {
        rc = cli_train_run(f, model, NULL, data, len, data_path, &o);
    }
    xtf_free(f);
    free(data);
    return cli_dist_end(rc);
}
