/* train.h: the in-process entry points of `xtc train` (cmd_train.c) and `xtc generate`
 * (cmd_generate.c), for commands that chain them (xtc demo): byte-level language modelling on a
 * text, then sampling with a KV cache. Both print what they do (progress on stderr, results on
 * stdout) and return 0 or 1 after printing why. */
#ifndef XTC_CLI_TRAIN_H
#define XTC_CLI_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "xtf.h"

typedef struct {
    int64_t steps;          /* total steps of the schedule (default 1000) */
    int64_t stop_at;        /* stop after this step as if interrupted (0 = run to the end) */
    int64_t batch, seq;     /* sequences per step and their length (seq 0 = min(256, max_seq_len)) */
    double lr, min_lr;      /* peak learning rate; the cosine schedule's floor, as a fraction of lr */
    int64_t warmup;         /* linear warm-up steps (-1 = min(100, steps / 10)) */
    int cosine;             /* 1: cosine decay to min_lr * lr at `steps`; 0: constant after warm-up */
    double beta1, beta2, eps, weight_decay, clip;
    int threads;            /* 0 = the number of online CPUs */
    int64_t val_every;      /* validate every K steps (0 = only at the end) */
    int64_t val_tokens;     /* tokens of the held-out split to evaluate (0 = all of it; -1 = the
                             * tokens trained between two validations, at most 65536) */
    double val_fraction;    /* the held-out split: the last fraction of the text */
    int64_t log_every;      /* permanent progress lines when stderr is not a terminal (0 = auto) */
    const char *ckpt;       /* checkpoint to write (at validations, on interrupt and at the end) */
    int64_t ckpt_every;     /* also every K steps (0 = at validations) */
    const char *resume;     /* continue the run of this checkpoint */
    const char *weights;    /* start from these weights with a fresh optimizer */
    uint64_t seed;          /* --resume: the checkpoint's (another one given is refused) */
    int seed_given;         /* seed was given explicitly */
    int quiet;              /* no progress line (validation and summary lines only) */
    int zero1;              /* several ranks: each keeps the optimizer state of its shard (ZeRO-1) */
} CliTrainOpts;

void cli_train_defaults(CliTrainOpts *o);

/* Trains the model `model` of f (NULL: the last) or, when f is NULL, the compiled module at
 * module_path (a training module is used as is; another is recompiled from its embedded source)
 * on the bytes data[len] (data_name names them in messages). */
int cli_train_run(const XtfFile *f, const char *model, const char *module_path, const unsigned char *data,
                  size_t len, const char *data_name, const CliTrainOpts *o);

typedef struct {
    const char *weights;    /* checkpoint or weights file (required) */
    const char *prompt;     /* bytes; "" starts from a newline */
    int64_t tokens;         /* how many to generate (default 200) */
    double temperature;     /* 0 = greedy (default 0.8) */
    int top_k;              /* 0 = no top-k filter (default 40) */
    uint64_t seed;
    int threads;            /* 0 = 1 below 4M parameters, else the number of online CPUs */
    int no_cache;           /* recompute the whole context for every token (the reference) */
    int ids;                /* print token ids instead of text */
    int quiet;              /* no statistics line */
    int profile;            /* print the time per kernel of the one-token calls (stderr) */
} CliGenOpts;

void cli_generate_defaults(CliGenOpts *o);

/* Samples from the model `model` of f (NULL: the last) or, when f is NULL, the module at
 * module_path. */
int cli_generate_run(const XtfFile *f, const char *model, const char *module_path, const CliGenOpts *o);

/* Shared by both: whether the model is a byte-level causal language model xtc can train or
 * sample (a TransformerWrapper around a Decoder with num_tokens >= 256); prints why not. */
int cli_check_byte_lm(const XtfFile *f, const char *model, const char *what);

/* Fills out[len] with the demo's generated English-like text (cli/corpus.c), the same bytes for
 * the same seed; returns len. */
size_t cli_corpus(unsigned char *out, size_t len, uint64_t seed);

/* Data parallelism for `mpirun -np N xtc train` (train_dist.c): without MPI support, or when not
 * started by an MPI launcher, one rank of one. cli_dist_start initialises MPI when a launcher
 * started the process; cli_dist_attach gives a session the world communicator (rank 0's weights
 * then go to every rank with xtc_session_sync); cli_dist_sum / cli_dist_max reduce v[n] over the
 * ranks in place; cli_dist_bcast_int hands rank 0's value to all; cli_dist_end finalises with the
 * exit status: an error (1..127) on several ranks aborts the job (MPI_Abort) so that no rank waits
 * on one that left. */
typedef struct XtcSession XtcSession;
int cli_dist_start(void);
int cli_dist_rank(void);
int cli_dist_size(void);
int cli_dist_attach(XtcSession *s);
void cli_dist_sum(double *v, int n);
void cli_dist_max(double *v, int n);
void cli_dist_bcast_int(int *v);
int cli_dist_end(int rc);

/* The number of online CPUs (at least 1). */
int cli_default_threads(void);

#endif
