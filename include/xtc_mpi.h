/* xtc_mpi.h: data-parallel training over MPI: attaches an MPI communicator to a session (the
 * XtcComm of include/xtc.h made from MPI calls). Link with libxtc_mpi and your MPI library
 * besides libxtc; xtc.h and libxtc themselves need no MPI.
 *
 *     MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
 *     ... xtc_session_new(mod, &opt, &s); load or initialise the weights ...
 *     xtc_session_set_mpi_comm(s, MPI_COMM_WORLD);  // every rank
 *     xtc_session_sync(s);                          // rank 0's weights everywhere
 *     for (;;) {                                    // each rank: its share of the batch
 *         xtc_session_set_input(s, "tokens", ...); xtc_session_run(s);   // gradients summed
 *         xtc_session_step(s, &adamw);                                   // the same update
 *     }
 *
 * The session duplicates the communicator (MPI_Comm_dup, so its traffic never meets the
 * caller's) and frees the duplicate when it is freed or given another communicator: free the
 * session before MPI_Finalize. xtc_session_set_mpi_comm is a collective over comm (MPI_Comm_dup).
 * MPI is called only from the thread that calls xtc_session_run, xtc_session_step and
 * xtc_session_sync; a run on a thread with less than 4 MiB of stack moves to a helper thread
 * (include/xtc.h), so initialise MPI with MPI_THREAD_SERIALIZED at least where that can happen.
 * MPI errors fail the call with XTC_ERR_IO and MPI's message (the duplicate has
 * MPI_ERRORS_RETURN); a rank that dies is the launcher's to report (mpirun ends the job).
 * xtc_session_set_mpi_comm returns XTC_ERR_STATE when MPI is not initialised or comm is
 * MPI_COMM_NULL, XTC_ERR_IO when MPI_Comm_dup fails, else what xtc_session_set_comm returns. */
#ifndef XTC_MPI_H
#define XTC_MPI_H

#include <mpi.h>

#include "xtc.h"

#ifdef __cplusplus
extern "C" {
#endif

int xtc_session_set_mpi_comm(XtcSession *s, MPI_Comm comm);
/* xtc_session_set_mpi_comm, then for a CUDA training module an NCCL communicator over the same
 * ranks (xtc_session_set_nccl), bootstrapped through comm: every rank checks that it can use
 * NCCL (xtc_session_nccl_usable), and only when all can, rank 0's ncclGetUniqueId goes to every
 * rank (MPI_Bcast) and each calls ncclCommInitRank. Otherwise the gradients are summed through
 * host memory over MPI, as with xtc_session_set_mpi_comm. *nccl: 1 when NCCL sums them (why: its
 * version and file), 0 when it does not (why: the reason, the same on every rank where the ranks
 * disagree). Returns what xtc_session_set_mpi_comm returns, or an error of ncclCommInitRank. A
 * collective over comm. */
int xtc_session_set_mpi_nccl(XtcSession *s, MPI_Comm comm, int *nccl, char *why, size_t n);

#ifdef __cplusplus
}
#endif

#endif
