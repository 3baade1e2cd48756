/* xtc.h: the public C API of the xtc runtime: load a compiled model (model.so), bind weights and
 * inputs, run it, read its outputs.
 *
 *     XtcModule *mod;
 *     if (xtc_module_load("gpt.so", &mod)) { fprintf(stderr, "%s\n", xtc_module_error(mod)); ... }
 *     XtcSessionOptions opt = {.threads = 2};
 *     XtcSession *s;
 *     if (xtc_session_new(mod, &opt, &s)) { fprintf(stderr, "%s\n", xtc_session_error(s)); ... }
 *     xtc_session_load_weights(s, "gpt.safetensors");
 *     int64_t shape[2] = {batch, seq};
 *     xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens);
 *     xtc_session_run(s);
 *     XtcTensor logits;
 *     xtc_session_get_output(s, "logits", &logits);    // float [batch, seq, vocab]
 *     xtc_session_free(s);
 *     xtc_module_free(mod);
 *
 * Conventions
 *  - Every call that can fail returns an XtcStatus (0 = XTC_OK). The text of the last error is
 *    kept in the object the call was made on (xtc_module_error, xtc_session_error) until a call
 *    on it succeeds, which leaves ""; messages name the input, parameter or step concerned.
 *    Nothing here exits or aborts on bad input.
 *  - The constructors xtc_module_load and xtc_session_new hand back an object even on failure
 *    (only out-of-memory yields NULL), so the error can be read from it; free it either way.
 *  - Out of memory is XTC_ERR_MEMORY with a message saying so, and nothing leaks; a session
 *    stays usable and the same call can be retried (a failed constructor: free and call again).
 *  - No global state. A module is read-only once loaded: several threads may create sessions
 *    from one module at once. A session belongs to one thread at a time. Any number of modules
 *    and sessions may live in one process.
 *  - Tensors are row-major and contiguous. bool is one byte per element, 0 or 1.
 *
 * Shapes are symbolic: a module's dimensions are affine forms over its symbols (batch "b",
 * sequence "n", ...: "64", "n", "n+3", "m+n"). Inputs bind the symbols when the session runs;
 * batch size and sequence length change from run to run without recompiling. A symbol named "b"
 * (or "batch") is the batch size; the others are sequence-like lengths bounded by the model's
 * max_seq_len.
 *
 * Depends on libc, libm, libdl and pthreads only: link with libxtc.a -lm -ldl -lpthread, or with
 * libxtc.so; both define the xtc_* names of this header and no other global symbol. Installed
 * (cmake --install build --prefix P): cc prog.c $(pkg-config --cflags --libs xtc) links
 * libxtc.so (the loader finds it in P/lib by LD_LIBRARY_PATH or a -Wl,-rpath, unless P is a
 * system prefix), and pkg-config's xtc-static links libxtc.a into the program.
 */
#ifndef XTC_H
#define XTC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header: MAJOR.MINOR.PATCH. The library's soname carries MAJOR
 * (libxtc.so.0); CMakeLists.txt reads the number from here. */
#define XTC_VERSION "0.2.0"
/* The version of the library the program runs with ("0.2.0"): XTC_VERSION of the header it was
 * built from, which differs from the program's XTC_VERSION when another libxtc.so is loaded. */
const char *xtc_version(void);

#define XTC_MAX_RANK 8

typedef enum {
    XTC_OK = 0,
    XTC_ERR_ARG,      /* a NULL or otherwise invalid argument */
    XTC_ERR_IO,       /* a file could not be read or written, or dlopen failed */
    XTC_ERR_FORMAT,   /* not an xtc module, a module of another format version, a bad file */
    XTC_ERR_NAME,     /* no input, output or weight of that name; or one is missing/extra */
    XTC_ERR_SHAPE,    /* wrong dtype, rank or shape; symbols that do not agree */
    XTC_ERR_RANGE,    /* a value out of range: sequence too long, token id outside the vocabulary */
    XTC_ERR_MEMORY,   /* out of memory */
    XTC_ERR_STATE,    /* a call out of order: run before weights or inputs are set */
} XtcStatus;

const char *xtc_status_name(int status); /* "XTC_ERR_SHAPE", ... */

/* XTC_I8: the int8 weights of a module compiled with --weights-dtype int8 (see "int8 weights"
 * below); no input or output has it. */
typedef enum { XTC_F32, XTC_I32, XTC_I64, XTC_BOOL, XTC_I8, XTC_NUM_DTYPES } XtcDType;

const char *xtc_dtype_name(XtcDType t);  /* "f32", "i32", "i64", "bool", "i8" */
size_t xtc_dtype_size(XtcDType t);       /* 4, 4, 8, 1, 1 */

/* A tensor handed out by the runtime. The memory belongs to the session and stays valid until
 * the next xtc_session_run, xtc_session_set_input or xtc_session_free on it. */
typedef struct {
    XtcDType dtype;
    int rank;
    int64_t shape[XTC_MAX_RANK];
    const void *data;
} XtcTensor;

/* ---- modules ---- */

typedef struct XtcModule XtcModule;

/* Loads a compiled module with dlopen and checks its format version. Before dlopen the file must
 * be an ELF shared library for this machine with every segment inside it (else XTC_ERR_IO when it
 * cannot be opened, XTC_ERR_FORMAT when it is not an ELF file, is for another machine or is
 * truncated); after it, the module's metadata must parse and this CPU must have every feature the
 * module was compiled for (XTC_ERR_FORMAT naming the missing ones). These checks catch accidents:
 * a module is native code, to be loaded from trusted sources only. On failure returns a status
 * and (unless out of memory) a module whose xtc_module_error says why; free it in both cases.
 * A file replaced since it was loaded (recompiled to the same path) loads as the new module, while
 * modules loaded from the old file stay valid; the same file loaded twice shares its code. */
int xtc_module_load(const char *path, XtcModule **out);
void xtc_module_free(XtcModule *m);                 /* NULL is fine; sessions must be freed first */
const char *xtc_module_error(const XtcModule *m);   /* "" when there is none */

/* The named tensors of a module, by kind. XTC_STATE are persistent non-trainable buffers that
 * are loaded from the weights file like parameters (e.g. attn_layers.rotary_pos_emb.inv_freq). */
typedef enum { XTC_INPUT, XTC_OUTPUT, XTC_PARAM, XTC_STATE } XtcKind;

typedef struct {
    const char *name;
    XtcDType dtype;
    int rank;
    int64_t shape[XTC_MAX_RANK];   /* the size where it is constant, -1 where symbolic */
    const char *dims[XTC_MAX_RANK]; /* every dimension as text: "64", "b", "n+3" */
} XtcTensorInfo;

int xtc_module_count(const XtcModule *m, XtcKind kind);   /* 0 for a failed module */
/* Describes tensor i (0 <= i < count) of a kind. The strings belong to the module. */
int xtc_module_tensor(const XtcModule *m, XtcKind kind, int i, XtcTensorInfo *info);
/* Index of the tensor of that kind and name, or -1. */
int xtc_module_find(const XtcModule *m, XtcKind kind, const char *name);
/* 1 and *value when parameter `name` starts at one constant in fresh weights (norm gains 1,
 * x-transformers' zero_init_*: 0, qk_norm's scale_init_value, ...); 0 when it starts random (by
 * its rule: Linear U(-1/sqrt(in), ..), Embedding N(0, 1), ...; xtc_module_describe and
 * `xtc info` list every weight's rule); -1 when the module has no such parameter. */
int xtc_module_param_init(const XtcModule *m, const char *name, double *value);

/* Symbols: name and upper bound (0 = unbounded). */
int xtc_module_num_symbols(const XtcModule *m);
int xtc_module_symbol(const XtcModule *m, int i, const char **name, int64_t *max);

const char *xtc_module_name(const XtcModule *m);     /* the model's name */
const char *xtc_module_source(const XtcModule *m);   /* the embedded .xtf source, or "" */
const char *xtc_module_metadata(const XtcModule *m); /* the raw metadata text (see rt_abi.h) */
int64_t xtc_module_param_count(const XtcModule *m);  /* total elements of all XTC_PARAM */
/* Writes a readable summary: symbols, inputs, outputs, parameters, compile options, kernels
 * and schedule length. */
int xtc_module_describe(const XtcModule *m, FILE *out);

/* ---- sessions ---- */

typedef struct XtcSession XtcSession;

/* XtcSessionOptions.threads (and XtcRunOptions.threads): as many threads as CPUs this process may
 * run on (its affinity mask: taskset, cgroup cpusets), at most 1024 */
#define XTC_THREADS_AUTO (-1)

typedef struct {
    int threads;        /* worker threads including the caller's; 0 = 1; XTC_THREADS_AUTO: one per
                         * CPU this process may use (xtc_session_threads says how many). The
                         * calling thread runs kernels too, which keep tiles on the stack (up to
                         * about 1.5 MiB); a run called with less than 4 MiB of stack left moves to
                         * a thread of 8 MiB, as the pool's own threads have */
    int64_t max_batch;  /* if > 0: inputs with a larger batch are refused, and the memory for
                           this batch size is reserved at creation. 0 = grow as needed */
    int64_t max_seq;    /* likewise for sequence-like symbols (never above the model's bound) */
} XtcSessionOptions;

/* Creates a session (its thread pool and its memory arena). opts may be NULL. On failure returns
 * a status and (unless out of memory) a session holding the message; free it in both cases. */
int xtc_session_new(const XtcModule *m, const XtcSessionOptions *opts, XtcSession **out);
void xtc_session_free(XtcSession *s);               /* NULL is fine */
int xtc_session_threads(const XtcSession *s);       /* its threads, counting the caller; 0: none */
const char *xtc_session_error(const XtcSession *s); /* "" when there is none */

/* Loads every parameter and state buffer from a .safetensors file by name (the x-transformers
 * state_dict names). Tensors that are missing, extra (not in the module) or of the wrong shape
 * are errors naming them; F64, F16 and BF16 tensors are converted to f32. A tied weight stored
 * under two names (XTransformer's tie_token_emb) must be present under both with equal values.
 * A checkpoint loads too: its optimizer state ("optim.m.<param>", "optim.v.<param>" of the
 * module's parameters) is ignored. On failure no weight is changed. */
int xtc_session_load_weights(XtcSession *s, const char *path);
/* Sets one parameter or state buffer from memory (f32, copied). */
int xtc_session_set_weight(XtcSession *s, const char *name, int rank, const int64_t *shape,
                           const float *data);
/* Weights, inputs and outputs are f32 at this interface whatever a module stores in 16 bits (int8 weights: below). A CPU module
 * compiled with --dtype bf16 stores the weights of its matmuls in bf16 (the metadata's "storage"
 * records, include/abi/rt_abi.h): the session keeps every weight in f32 as given (what
 * xtc_session_get_weight returns, what xtc_session_step updates and checkpoints save: the master
 * weights of training) and, for each such weight, a bf16 copy rounded to nearest even that the
 * kernels read; the copy is made again before the next run whenever the f32 value changed (set,
 * loaded, initialised or stepped). A CUDA module keeps its 16-bit copies on the device.
 * KV caches in bf16: a CPU module compiled with --kv-cache and --kv-dtype bf16 (the default with
 * --dtype bf16; `xtc info`: option kv_dtype = bf16) stores the caches cache.<l>.k/.v, inputs and
 * outputs, in bf16 (where only attention reads them; the metadata's "storage" records name them).
 * They stay f32 at this interface: xtc_session_set_input rounds a cache the caller gives to bf16
 * (to nearest even) once, as it binds it; the run appends the call's keys and values rounded
 * the same way; xtc_session_get_output returns a cache widened to f32 (exact: every value is a
 * bf16 value), a copy made at that call; xtc_session_carry moves the bf16 values as they are
 * (no rounding, no widening, in place as described there).
 * KV caches in int8: --kv-dtype int8 (`xtc info`: option kv_dtype = int8) stores the same caches
 * as int8 rows: each row of the last dimension (one position of one kv head, dim_head values x)
 * as dim_head int8 values q and one f32 scale s, symmetric: s = max|x| / 127, q = x * (127 /
 * max|x|) rounded to nearest even, in f32 (a row of zeros: s = 0); the row stands for q * s.
 * Everything above holds with that rounding in place of bf16's: set_input quantizes a cache
 * row by row once, the run appends its rows quantized, get_output returns q * s as f32 (a row
 * read back and given again is the same row), carry moves the stored rows as they are. */

/* int8 weights. A module compiled with `xtc compile --weights-dtype int8 [--group G]` stores each
 * matmul weight W [n, k] (a Linear's: attention's q, k, v and output projections, the
 * feed-forward's, the logits head; never embeddings, norms or biases, nor a weight tied to an
 * embedding) as two state buffers: "<name>" XTC_I8 [n, k] and "<name>.scale" XTC_F32
 * [n, ceil(k / G)] (G = k without --group: one scale per output row), and multiplies by
 * W[j, p] = q[j, p] * scale[j, p / G] (products and sums in f32). The module's options say so
 * (`option weights = int8`, `option quant_group = G`, 0 for one scale per row). Weights reach
 * it three ways, all with the same result:
 *  - xtc_session_load_weights of a file from `xtc quantize` (safetensors: "<name>" I8 and
 *    "<name>.scale" F32; its metadata xtc.quant_group must name the module's G when present);
 *  - xtc_session_load_weights of the f32 file (or xtc_session_set_weight, or
 *    xtc_session_init_weights): each such weight is quantized as it is set, by the rule
 *    scale = max |W| / 127 over each group of a row, q = W / scale rounded to nearest (ties to
 *    even) within [-127, 127]; non-finite values are refused (XTC_ERR_RANGE);
 *  - xtc_session_set_weight_i8 with the int8 values, and xtc_session_set_weight on "<name>.scale".
 * A file must give a weight either as I8 with its scales or as floats without them; anything else
 * (another dtype, a missing or extra scale, a shape that does not fit) is an error naming the
 * tensor, and nothing is changed. xtc_session_get_weight hands out the XTC_I8 values and the
 * scales; xtc_session_save_checkpoint writes them as I8 and F32 (with xtc.quant_group).
 * Training modules keep f32 weights: `--train` with `--weights-dtype int8` is refused, and so are
 * int8 weights on the cuda targets (the CPU has the int8 kernels). */
int xtc_session_set_weight_i8(XtcSession *s, const char *name, int rank, const int64_t *shape, const int8_t *data);

/* Sets every parameter and state buffer to fresh values drawn reproducibly from seed, by
 * x-transformers' initialisation rules (token embeddings kaiming normal, Linear layers torch's
 * uniform, norm gains 1, rotary frequencies, the constants a model fixes such as
 * zero_init_branch_output): the values `xtc init --seed SEED` writes. A parameter no rule covers
 * starts at 0 (xtc init names it). To train from scratch without a weights file. On failure (out
 * of memory) the weights set before it keep their new values. */
int xtc_session_init_weights(XtcSession *s, uint64_t seed);

/* Binds an input (copied). The dtype must be the input's, except that integer inputs accept
 * XTC_I32 or XTC_I64 (converted) and bool inputs accept any non-zero byte as true. The rank and
 * the constant dimensions must match; symbolic dimensions bind the symbols, and a value above
 * the model's bound (sequence longer than max_seq_len) or the session's limit is XTC_ERR_RANGE.
 * So is a sum of symbols above its limit (a KV cache: cache positions c plus new tokens n above
 * max_seq_len), found when the second of the inputs giving them is set (or carried) since the
 * last run, else by the run; the message names each symbol's value and input.
 * Integer inputs used as indices (token ids: tokens, src, tgt) are checked against the table
 * size, and targets against the number of classes (negative targets are ignored, not refused):
 * XTC_ERR_RANGE, "input 'targets': value 300 at [0, 5] is outside [0, 256)".
 * A KV cache whose attention is cosine-sim (l2-normalised keys: the module decodes with the bound
 * on the scores, `norm` in its metadata) holds only keys the module wrote: a key cache given here
 * with a row (last axis) whose L2 norm is above 1.125 times that bound (rounding to a cache's
 * storage stays well within it) or not finite is XTC_ERR_RANGE naming the row, and nothing is
 * bound. */
int xtc_session_set_input(XtcSession *s, const char *name, XtcDType dtype, int rank,
                          const int64_t *shape, const void *data);

/* Runs the model on the bound inputs: checks that all inputs and weights are set and that the
 * symbols bound by the inputs agree, grows the arena if needed, then executes the schedule.
 * When no output has an element (an empty batch or sequence) nothing is computed. Sizes whose
 * arena, or whose loops (an intermediate counted with its empty dimensions as 1: 2^40 empty
 * rows), would exceed the machine's memory are refused first (XTC_ERR_MEMORY, XTC_ERR_RANGE).
 * A training module may run without its "targets" input: the outputs that do not depend on them
 * (logits) are computed, and reading the loss or a gradient is XTC_ERR_STATE. */
int xtc_session_run(XtcSession *s);

/* A view of an output after a successful run (see XtcTensor for its lifetime). A CUDA module's
 * runs leave their outputs in device memory: the first call for an output after a run copies it
 * to the host (widened to f32 where the module stores it in 16 bits), and later calls for it
 * return the same memory without copying until the next run; outputs never asked for are never
 * copied (a training step whose caller reads the loss moves 4 bytes, not the gradients; a forward
 * whose caller reads no logits moves none). The pointer stays valid until the next run, input
 * change or xtc_session_free, as for every output. XTC_EAGER_OUTPUTS=1 in the environment when
 * the session is created copies every output after each run instead. A failed copy is XTC_ERR_IO
 * (XTC_ERR_MEMORY) naming the output. */
int xtc_session_get_output(XtcSession *s, const char *name, XtcTensor *out);

/* Makes an output of the last successful run the value of an input for the next run: a state
 * the model hands to its next call, as a KV cache (cache.<l>.k out -> cache.<l>.k in). Same
 * checks as xtc_session_set_input with the output's dtype and shape. The first carry of an
 * output copies it; from then on the session writes that output outside its arena and each
 * carry hands its memory to the input without a copy (CPU modules; a CUDA module copies in device
 * memory: the input is not uploaded again; if that copy fails, the input is left unset; an output
 * appending to its input, as below, is written in place there too). An
 * output that is the input with rows appended along an axis preceded only by dimensions of size
 * 1 (a KV cache of one sequence, [1, positions, heads, dim_head]) is written in place, after the
 * input's values, while the memory has room (it grows by a quarter when not): a call then writes
 * only the new rows. The outputs stay readable until the next run or input change, unless the
 * carry replaces the memory an output of the last run is in (XTC_ERR_STATE then, until the next
 * run). Into a cosine-sim key cache (see xtc_session_set_input) only the output of its own name
 * carries (XTC_ERR_ARG otherwise). */
int xtc_session_carry(XtcSession *s, const char *output, const char *input);

/* Bytes of the session's activation arena (intermediate values and outputs; weights and inputs
 * not included): its high-water mark, planned from buffer lifetimes. For a CUDA module it is the
 * device arena, each intermediate at its size on the device (2 bytes per element where the
 * module stores it in 16 bits, --dtype bf16|fp16); the host then keeps only the outputs, in f32. */
int64_t xtc_session_peak_bytes(const XtcSession *s);
/* The arena a session would need for these symbol values (syms[i] for symbol i), planned
 * without allocating it (for a CUDA module the device arena, as above): -1 on bad arguments or
 * when the plan does not fit in memory. */
int64_t xtc_module_arena_bytes(const XtcModule *m, const int64_t *syms);
/* Value of symbol i in the last successful run (or the last binding), -1 if unbound. */
int64_t xtc_session_symbol(const XtcSession *s, int i);
/* The device the session runs on, as its driver names it ("NVIDIA H100 80GB HBM3"; for a
 * cuda-emu module "the xtc CUDA emulator (CPU)"); "cpu" for a CPU module; "" when there is no
 * session or its device failed to open. The string belongs to the session. */
const char *xtc_session_device(const XtcSession *s);

/* Profiling: while on, every run adds the time of each schedule step to per-step
 * totals (turning it on clears them). On the CPU that is the wall time of the step; on a CUDA
 * device it is the time between CUDA events recorded on the stream before and after the step's
 * launch (the device's own timer, read once the run has synchronised); the cuda-emu emulator's
 * events read the host clock, so its times are CPU times of the emulation, not GPU figures.
 * xtc_session_print_profile writes the totals per kernel, slowest first, with the op, the number
 * of steps sharing the kernel and the share of the run. */
int xtc_session_set_profiling(XtcSession *s, int on);
int xtc_session_print_profile(const XtcSession *s, FILE *out);
/* The same totals per schedule step, for tools that aggregate them (xtc bench): secs[i] for
 * i < n and i < xtc_module_num_steps. Returns the number of profiled runs (0 while profiling is
 * off), or -1 on bad arguments. */
int xtc_session_profile_steps(const XtcSession *s, double *secs, int n);

/* The schedule of a module, for profiles: kernels (a generated function shared by `uses` steps,
 * computing op) and steps (which kernel each runs and the label of the value it writes). */
int xtc_module_num_kernels(const XtcModule *m);
int xtc_module_kernel(const XtcModule *m, int k, const char **fn, const char **op, int *uses);
int xtc_module_num_steps(const XtcModule *m);
int xtc_module_step(const XtcModule *m, int i, int *kernel, const char **label);

/* ---- training (runtime/rt_optim.c) ---- */

/* A training module (xtc compile --train) has outputs "loss" and "grad.<name>" for every
 * parameter (with --dtype fp16 also the input XTC_LOSS_SCALE_INPUT, below). Where the model's
 * dropout rates (emb_dropout, attn_dropout, ff_dropout, ViT's dropout) are > 0 it drops out as
 * nn.Dropout in training mode and has the input "dropout_seed": int64, shape [] (a scalar), the
 * seed of the masks (the same seed, the same masks; `xtc train` gives seed + step). It must be
 * set like any input: a run without it fails with XTC_ERR_NAME naming it. After a successful xtc_session_run, xtc_session_step applies one AdamW step to every
 * parameter from those gradients, in native code, split over the session's threads:
 *
 *     g = grad * min(1, max_grad_norm / (||grad||_global + 1e-6))   (if max_grad_norm > 0)
 *     p = p * (1 - lr * weight_decay)                               (decoupled, every parameter)
 *     m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2;   t = t + 1
 *     p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * which is torch.optim.AdamW (amsgrad off) after torch.nn.utils.clip_grad_norm_; like PyTorch's
 * default, weight decay applies to all parameters (norm gains and biases included). The state
 * (m, v per parameter, zeros at first, and the step count t) belongs to the session and goes
 * into checkpoints. The result is independent of the number of threads. Outputs of the last run
 * stay readable after a step.
 *
 * For a CUDA training module the step runs on the device, with the same bits as on the host:
 * the weights (f32 masters beside the 16-bit copies of --dtype bf16|fp16) and the moments stay
 * there, and the gradients stay where the run left them (xtc_session_get_output of a grad.<name>
 * copies it when asked, as every output of a CUDA module). The host's copies of the
 * weights and moments are brought back only when read (xtc_session_get_weight, _get_optim, a
 * checkpoint), and weights or state the caller sets go to the device before the next step. An
 * fp16 module with loss scaling steps on the host, and so does any module when the environment
 * variable XTC_OPTIM=host is set when the session's first step is taken. */
typedef struct {
    float lr;             /* learning rate */
    float beta1, beta2;   /* moment decay rates */
    float eps;
    float weight_decay;   /* decoupled, multiplied by lr */
    float max_grad_norm;  /* clip the global gradient norm to this; 0 = no clipping */
} XtcAdamW;

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; no
 * clipping. */
XtcAdamW xtc_adamw_defaults(void);

/* Each run's gradients serve one step: a second step without a successful run between (or after
 * a run without targets) is XTC_ERR_STATE and changes nothing. */
int xtc_session_step(XtcSession *s, const XtcAdamW *opt);

/* Steps taken (t), and the global gradient norm of the last step before clipping (-1 before
 * any). */
int64_t xtc_session_step_count(const XtcSession *s);
double xtc_session_grad_norm(const XtcSession *s);

/* Dynamic loss scaling (PyTorch's GradScaler, built into the session). A training module
 * compiled with --dtype fp16 (whose smallest normal value is 6.1e-5) has one more input, the
 * scalar f32 XTC_LOSS_SCALE_INPUT: the backward pass starts from the loss's gradient S instead of
 * 1 (a module seeded by grad.<output> inputs multiplies them by S), so every gradient is computed
 * S times larger, above fp16's subnormals. f32 and bf16 modules have no such input and none of
 * this applies (xtc_session_loss_scale is 1, no step is skipped).
 *  - Before each xtc_session_run the session binds S itself, unless the caller bound the input
 *    with xtc_session_set_input: the caller's value (positive and finite, else XTC_ERR_RANGE)
 *    then wins, for every run, until xtc_session_set_loss_scale hands it back to the session.
 *  - After the run every grad.<param> output is divided by the value the run used, so callers
 *    and the optimizer see true gradients; if one of them is not finite (inf or NaN) the run
 *    has overflowed.
 *  - xtc_session_step after an overflowed run skips the update (parameters, moments and step
 *    count unchanged; xtc_session_step_skipped is 1) and halves S; after growth_interval
 *    consecutive steps taken it doubles S. S starts at 2^16, never falls below 1 (a model whose
 *    gradients overflow even then skips every step) nor rises above 2^64; growth interval 2000.
 *  - Checkpoints hold S and the steps counted towards the next doubling (metadata
 *    "xtc.loss_scale", "xtc.loss_scale.good_steps"); xtc_session_load_checkpoint with optimizer
 *    != 0 restores them when the file has them. */
#define XTC_LOSS_SCALE_INPUT "loss_scale"
/* Sets S (1 <= scale <= 2^64, else XTC_ERR_RANGE) and, if growth_interval > 0, the growth
 * interval; restarts the count of good steps; the session binds S again from the next run on,
 * over a value the caller bound. No effect on a module without loss scaling. */
int xtc_session_set_loss_scale(XtcSession *s, double scale, int64_t growth_interval);
/* S, the scale the session binds for the next run (1 for a module without loss scaling). */
double xtc_session_loss_scale(const XtcSession *s);
/* 1 if the last xtc_session_step skipped its update because the gradients overflowed. */
int xtc_session_step_skipped(const XtcSession *s);

/* A view of the current value of a parameter or state buffer (valid until the weight is set
 * again or the session is freed). */
int xtc_session_get_weight(XtcSession *s, const char *name, XtcTensor *out);

/* The optimizer state of one parameter: views of m and v (XTC_F32, the parameter's shape).
 * XTC_ERR_STATE before the first step or import. */
int xtc_session_get_optim(XtcSession *s, const char *param, XtcTensor *m, XtcTensor *v);
/* Replaces the optimizer state: the step count and, for every parameter in module order,
 * m[i] and v[i] (f32, the parameter's number of elements; copied). */
int xtc_session_set_optim(XtcSession *s, int64_t step, const float *const *m, const float *const *v);

/* Checkpoints: a .safetensors file holding every parameter and state buffer under its name
 * (tied names too: the file loads as a state_dict), and after at least one step the optimizer
 * state as "optim.m.<name>" and "optim.v.<name>" with the step count in the metadata
 * ("xtc.optim.step"). meta: nmeta extra key/value pairs for the metadata (the caller's: data
 * position, random state...). Written atomically (temporary file ".NAME.xtc-tmp.PID.RAND" beside
 * the target, fsync, rename; those a dead writer of the same target left are removed): through
 * a symlink to the file it names, keeping an existing file's mode; a character device or a FIFO
 * with a reader is written in place, a directory refused. A weight or optimizer value that is
 * not finite (NaN, infinity: a diverged run) is XTC_ERR_RANGE naming the tensor, and nothing is
 * written (the previous checkpoint stays). Files read (modules, weights) must be regular files:
 * a FIFO is refused, never waited on. */
int xtc_session_save_checkpoint(XtcSession *s, const char *path, const char *const *keys,
                                const char *const *values, int nmeta);
/* Loads a checkpoint or a plain weights file: every parameter and state buffer (strictly, as
 * xtc_session_load_weights), and with optimizer != 0 the optimizer state when the file has one
 * (all of it or none; a file without it resets the state). optim.* tensors are otherwise
 * ignored. On failure nothing changes. Read the metadata with the safetensors reader. A module
 * with int8 weights (inference only) loads the file as xtc_session_load_weights does. */
int xtc_session_load_checkpoint(XtcSession *s, const char *path, int optimizer);

/* ---- data parallelism (runtime/rt_comm.c) ----
 *
 * Several processes (ranks) train one model: each runs the same training module on its share of
 * the global batch, and xtc_session_step averages the gradients over the ranks before the AdamW
 * step, so that every rank applies the same update to the same weights. The transport is the
 * caller's: an XtcComm of the functions below. include/xtc_mpi.h makes one from an MPI
 * communicator (libxtc_mpi, built when MPI is found; this header and libxtc need no MPI).
 *
 *  - xtc_session_run, as soon as the schedule has written the last of a bucket's gradients
 *    (about XTC_COMM_BUCKET_BYTES, or the environment's XTC_COMM_BUCKET_BYTES when set, read by
 *    xtc_session_set_comm; in the order backward finishes them), copies them, each times
 *    the rank's share of the batch (xtc_session_set_grad_share, default 1/size), into a reduction
 *    buffer and starts summing that bucket over the ranks, while the backward pass goes on; the
 *    run returns once every bucket is summed. CUDA modules sum after the run, through host memory;
 *    with loss scaling (fp16) the sum also waits for the unscaled gradients, and a step is skipped
 *    on every rank when the summed gradients are not finite.
 *  - xtc_session_step then reads the summed gradients (the grad.<name> outputs stay this rank's
 *    own): the global-norm clip is over the averaged gradient of the whole batch, and the update
 *    is the same bits on every rank when the sums are (XtcComm.allreduce_start must give every
 *    rank the same bits, as MPI's reductions do).
 *  - xtc_session_sync makes every rank's parameters, state buffers, optimizer state and loss
 *    scale those of rank 0: call it once after loading or initialising the weights. */
#define XTC_COMM_BUCKET_BYTES (4 << 20)

typedef struct {
    int rank, size;   /* this process, and how many take part (0 <= rank < size) */
    void *ctx;        /* handed to every function */
    /* starts summing data[n] over the ranks, in place, and returns a handle in *req */
    int (*allreduce_start)(void *ctx, float *data, int64_t n, void **req, char *err, size_t errlen);
    /* makes progress: 1 when the reduction of req is complete (req is then released), 0 while it
     * is not; may be NULL (the reductions then progress in wait only) */
    int (*test)(void *ctx, void *req, char *err, size_t errlen);
    /* waits for req to complete and releases it */
    int (*wait)(void *ctx, void *req, char *err, size_t errlen);
    /* root's bytes[n] to every rank */
    int (*broadcast)(void *ctx, void *data, int64_t bytes, int root, char *err, size_t errlen);
    /* called once when the session lets go of the XtcComm (freed, or another comm set); may be NULL */
    void (*release)(void *ctx);
} XtcComm;

/* Attaches a communicator (copied; NULL detaches): from the next run on, gradients are summed
 * over comm->size ranks as above. Errors from its functions (returned non-zero) fail the run or
 * the step with XTC_ERR_IO and their message. A size of 1 is allowed (sums are copies). When this
 * call fails the caller keeps the communicator (release is not called). */
int xtc_session_set_comm(XtcSession *s, const XtcComm *comm);
/* The weight of this rank's gradients in the sum: its share of the global batch (rows of this
 * rank / rows of all ranks), in (0, 1]; 1/size by default. Takes effect from the next run. */
int xtc_session_set_grad_share(XtcSession *s, double share);
/* Rank 0's weights, optimizer state and loss scale to every rank (a collective: every rank calls
 * it). Without a communicator it does nothing. */
int xtc_session_sync(XtcSession *s);
/* While paused (paused != 0), runs sum nothing and need no other rank: evaluation on a training
 * session, where each rank runs its own number of batches. A step after such a run is
 * XTC_ERR_STATE. Unpause before the next training run. */
int xtc_session_set_comm_paused(XtcSession *s, int paused);
/* Seconds spent on the gradient sums since the communicator was attached: *during, in the step
 * hook while the schedule runs (copies into the buckets, starting and polling sums); *after, once
 * the schedule is done (the remaining buckets and the wait for all: what the backward pass did not
 * hide). Zeros without a communicator. */
int xtc_session_comm_time(const XtcSession *s, double *during, double *after);
/* ZeRO-1 (on != 0; a collective: every rank calls it, as every call below): each rank keeps the
 * AdamW moments (m, v) of its shard only, about 1/size of them: the parameters concatenated in
 * module order, cut into whole blocks of 8192 values, blocks [n*r/size, n*(r+1)/size) on rank r.
 * The gradients are summed over the ranks as above; every rank takes the global norm of all of
 * them (the clip is over the whole batch), updates the weights of its shard, and xtc_session_step
 * then hands every rank the other shards' updated weights (a broadcast from each owner). The
 * arithmetic is the replicated optimizer's, value for value: the same bits. The step is the host's
 * (a CUDA module's session uploads the weights). Checkpoints: xtc_session_gather_optim gives
 * every rank the whole state (until its next step, which drops the others' shards again); call it
 * on every rank before xtc_session_save_checkpoint or xtc_session_get_optim, which refuse a
 * sharded state with XTC_ERR_STATE. Loading a checkpoint (or xtc_session_set_optim) keeps this
 * rank's shard of the file's state; xtc_session_sync gives each rank its shard of rank 0's state
 * (rank 0's whole state, or the owners' shards when rank 0's is sharded). Off (on = 0) gathers
 * the state first. Needs a communicator (XTC_ERR_STATE); while it is on, attaching another
 * communicator (or none) is XTC_ERR_STATE: turn it off first. */
int xtc_session_set_zero1(XtcSession *s, int on);
/* With ZeRO-1: every rank's shard of the optimizer state to every rank (a collective); without,
 * nothing. */
int xtc_session_gather_optim(XtcSession *s);

/* NCCL (runtime/rt_nccl.c) for CUDA training modules: the gradients summed over the ranks on the
 * device, never leaving it. NCCL is not linked: libnccl.so.2, or the file the environment's
 * XTC_NCCL names, is loaded with dlopen on first use (NCCL 2.11 or later; PyTorch's wheels carry
 * one: python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' plus
 * /lib/libnccl.so.2). With an NCCL communicator, xtc_session_run queues, after the schedule on the
 * session's stream, one ncclAllReduce per gradient (in place, each rank's gradient times its share
 * of the batch: a pre-multiplied sum), so the grad.<name> outputs hold the sums (read back from
 * the device when asked), and xtc_session_step takes the device's AdamW step from them (with
 * ZeRO-1, or where the device has no step, the host's, from the sums read back); the global-norm
 * clip is of the summed gradients. Weights and optimizer state still go from rank 0 to every
 * rank through the host communicator (xtc_session_sync). */
#define XTC_NCCL_ID_BYTES 128
/* A new NCCL unique id (ncclGetUniqueId), on one rank, to send to the others: XTC_OK, or
 * XTC_ERR_IO with why in err (NCCL cannot be loaded). */
int xtc_nccl_unique_id(unsigned char id[XTC_NCCL_ID_BYTES], char *err, size_t errlen);
/* 1 when session s can sum its gradients with NCCL (a CUDA training module, f32 gradients on the
 * device, no loss scaling, and NCCL loads; a cuda-emu module only with $XTC_NCCL set), with
 * NCCL's version and file in why; else 0 with the reason in why. */
int xtc_session_nccl_usable(XtcSession *s, char *why, size_t n);
/* Creates the NCCL communicator of rank `rank` of `size` (ncclCommInitRank: a collective of every
 * rank, with the same id from xtc_nccl_unique_id) on the session's device and sums the gradients
 * with it from the next run on. Several ranks need a host communicator of the same rank and size
 * attached first (xtc_session_set_comm, xtc_session_set_mpi_nccl of include/xtc_mpi.h does both);
 * one rank alone needs none (id may then be NULL) and gets a host communicator of one rank.
 * XTC_ERR_STATE when the session cannot (xtc_session_nccl_usable's reason), XTC_ERR_IO when NCCL
 * cannot be loaded or fails. Attaching another communicator ends it. */
int xtc_session_set_nccl(XtcSession *s, int rank, int size, const unsigned char *id);

/* ---- files ---- */

typedef struct {
    int threads;      /* 0 = 1; XTC_THREADS_AUTO as in XtcSessionOptions */
} XtcRunOptions;

/* Loads module_path, weights from weights_path, every input from input_path (one tensor per
 * module input, by name; XTC_LOSS_SCALE_INPUT may be left out, the session binds it), runs once and writes every output to output_path (safetensors, with
 * dtypes F32 / I32 / I64 / BOOL). What `xtc run` does. On failure returns a status and writes a
 * one-line message into err. */
int xtc_run_files(const char *module_path, const char *weights_path, const char *input_path,
                  const char *output_path, const XtcRunOptions *opts, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
