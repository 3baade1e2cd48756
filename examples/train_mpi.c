/* train_mpi.c: data-parallel training from a user's own MPI program (include/xtc_mpi.h).
 *
 *   xtc compile model.xtf --train -o model.so
 *   xtc init model.so -o w.safetensors
 *   mpirun -np 2 ./train_mpi model.so w.safetensors STEPS
 *
 * Every rank loads the module, rank 0's weights go to all (xtc_session_sync), and each step every
 * rank runs its half of one global batch of byte tokens (the same batch on every rank, cut by
 * rank) and takes the AdamW step on the gradients averaged over the ranks. Rank 0 prints the
 * loss of the whole batch per step; every rank prints a hash of its final weights (equal on all).
 * Links with libxtc_mpi, libxtc and MPI. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "xtc_mpi.h"

#define BATCH 4
#define SEQ 16

static int fail(XtcSession *s, const char *what)
{
    fprintf(stderr, "train_mpi: %s: %s\n", what, xtc_session_error(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4 || size > BATCH) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N (N <= %d) %s train.so weights.safetensors STEPS\n", BATCH, argv[0]);
        MPI_Finalize();
        return 2;
    }
    XtcModule *mod = NULL;
    if (xtc_module_load(argv[1], &mod) != XTC_OK) {
        fprintf(stderr, "train_mpi: %s\n", xtc_module_error(mod));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    XtcSession *s = NULL;
    XtcSessionOptions so = {.threads = 1};
    if (xtc_session_new(mod, &so, &s) != XTC_OK)
        return fail(s, "session");
    if (xtc_session_load_weights(s, argv[2]) != XTC_OK)
        return fail(s, "weights");
    int row0 = BATCH * rank / size, rows = BATCH * (rank + 1) / size - row0;
    if (xtc_session_set_mpi_comm(s, MPI_COMM_WORLD) != XTC_OK ||
        xtc_session_set_grad_share(s, (double)rows / BATCH) != XTC_OK || xtc_session_sync(s) != XTC_OK)
        return fail(s, "communicator");
    XtcAdamW opt = xtc_adamw_defaults();
    opt.max_grad_norm = 1;
    int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ], shape[2] = {rows, SEQ};
    uint64_t x = 12345;
    for (int step = 1; step <= atoi(argv[3]); step++) {
        for (int i = 0; i < BATCH * SEQ + 1; i++) { /* the global batch: the same on every rank */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int byte = (int)(x >> 56);
            if (i < BATCH * SEQ)
                tok[i] = byte;
            if (i > 0)
                tgt[i - 1] = byte;
        }
        XtcTensor loss;
        if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tok + row0 * SEQ) != XTC_OK ||
            xtc_session_set_input(s, "targets", XTC_I64, 2, shape, tgt + row0 * SEQ) != XTC_OK ||
            xtc_session_run(s) != XTC_OK || xtc_session_get_output(s, "loss", &loss) != XTC_OK)
            return fail(s, "run");
        double part = *(const float *)loss.data * rows / BATCH; /* this rank's rows' share */
        MPI_Allreduce(MPI_IN_PLACE, &part, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (xtc_session_step(s, &opt) != XTC_OK)
            return fail(s, "step");
        if (rank == 0)
            printf("step %d loss %.6f\n", step, part);
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over every parameter's bytes */
    for (int i = 0; i < xtc_module_count(mod, XTC_PARAM); i++) {
        XtcTensorInfo info;
        XtcTensor t;
        xtc_module_tensor(mod, XTC_PARAM, i, &info);
        xtc_session_get_weight(s, info.name, &t);
        int64_t n = 4;
        for (int d = 0; d < t.rank; d++)
            n *= t.shape[d];
        for (int64_t k = 0; k < n; k++)
            h = (h ^ ((const unsigned char *)t.data)[k]) * 0x100000001b3ull;
    }
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d weights %016llx\n", rank, (unsigned long long)h);
    xtc_session_free(s); /* before MPI_Finalize: it frees its duplicate of the communicator */
    xtc_module_free(mod);
    MPI_Finalize();
    return 0;
}
