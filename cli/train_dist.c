/* train_dist.c: the MPI side of `mpirun -np N xtc train` (train.h): MPI is initialised only when
 * an MPI launcher started the process (its environment says so), so that a plain `xtc train`
 * never touches MPI; built without MPI (XTC_WITH_MPI off) every process is rank 0 of 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "xtc.h"

#ifdef XTC_WITH_MPI
#include "xtc_mpi.h"

static int active, rank, size = 1;

/* Open MPI, MPICH / Hydra and Slurm's PMI set these in every rank's environment. */
static int launched_by_mpi(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int cli_dist_start(void)
{
    if (active || !launched_by_mpi())
        return 0;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "xtc train: MPI_Init_thread failed\n");
        return -1;
    }
    active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return 0;
}

int cli_dist_rank(void) { return rank; }
int cli_dist_size(void) { return size; }

int cli_dist_attach(XtcSession *s)
{
    if (!active)
        return 0;
    /* a CUDA module: NCCL where every rank has it, else sums through host memory (said once) */
    int cuda = strcmp(xtc_session_device(s), "cpu") != 0, nccl = 0;
    char why[1024] = "";
    int st = cuda ? xtc_session_set_mpi_nccl(s, MPI_COMM_WORLD, &nccl, why, sizeof why)
                  : xtc_session_set_mpi_comm(s, MPI_COMM_WORLD);
    if (st)
        fprintf(stderr, "xtc train: rank %d: cannot attach MPI_COMM_WORLD to the session: %s %s\n", rank,
                xtc_status_name(st), xtc_session_error(s));
    else if (cuda && rank == 0)
        printf(nccl ? "gradient sums: on the device with %s\n"
                    : "gradient sums: through host memory over MPI, not NCCL: %s\n", why);
    return st ? -1 : 0;
}

void cli_dist_sum(double *v, int n)
{
    if (active && size > 1)
        MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

void cli_dist_max(double *v, int n)
{
    if (active && size > 1)
        MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

void cli_dist_bcast_int(int *v)
{
    if (active && size > 1)
        MPI_Bcast(v, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

int cli_dist_end(int rc)
{
    if (!active)
        return rc;
    if (rc > 0 && rc < 128 && size > 1) { /* the others may be waiting on this rank */
        fprintf(stderr, "xtc train: rank %d of %d failed (above); ending the job\n", rank, size);
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    /* every rank done (rank 0's checkpoint written) before any leaves: the launcher ends the job
     * when a rank exits non-zero (128 + a signal: a clean stop) */
    fflush(NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    active = 0;
    return rc;
}

#else

/* started by mpirun with several ranks, each would train alone and write the same checkpoint */
int cli_dist_start(void)
{
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n)
        n = getenv("PMI_SIZE");
    if (n && atoi(n) > 1) {
        fprintf(stderr, "xtc train: started as one of %s MPI ranks, but this xtc was built without MPI "
                        "(XTC_WITH_MPI=OFF; install libopenmpi-dev and rebuild)\n", n);
        return -1;
    }
    return 0;
}

int cli_dist_rank(void) { return 0; }
int cli_dist_size(void) { return 1; }
int cli_dist_attach(XtcSession *s) { (void)s; return 0; }
void cli_dist_sum(double *v, int n) { (void)v; (void)n; }
void cli_dist_max(double *v, int n) { (void)v; (void)n; }
void cli_dist_bcast_int(int *v) { (void)v; }
int cli_dist_end(int rc) { return rc; }

#endif
