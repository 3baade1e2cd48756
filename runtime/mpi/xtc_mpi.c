/* xtc_mpi.c: the XtcComm of include/xtc.h over MPI (include/xtc_mpi.h): nonblocking all-reduce
 * (MPI_Iallreduce, summing floats in place) for the gradient buckets, broadcast for the weights.
 * Built as its own library (libxtc_mpi) so that libxtc needs no MPI. */
#include "xtc_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    MPI_Comm comm; /* the session's duplicate */
} MpiCtx;

typedef struct {
    MPI_Request r;
} MpiReq;

static int mpi_failed(int rc, const char *what, char *err, size_t n)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    snprintf(err, n, "%s: %s", what, text);
    return -1;
}

static int allreduce_start(void *ctx, float *data, int64_t n, void **req, char *err, size_t errlen)
{
    MpiCtx *c = ctx;
    if (n > INT_MAX) {
        snprintf(err, errlen, "MPI_Iallreduce: %lld floats in one bucket is more than MPI counts", (long long)n);
        return -1;
    }
    MpiReq *q = malloc(sizeof *q);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = MPI_Iallreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, c->comm, &q->r);
    if (rc != MPI_SUCCESS) {
        free(q);
        return mpi_failed(rc, "MPI_Iallreduce", err, errlen);
    }
    *req = q;
    return 0;
}

static int test(void *ctx, void *req, char *err, size_t errlen)
{
    (void)ctx;
    MpiReq *q = req;
    int done = 0, rc = MPI_Test(&q->r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_failed(rc, "MPI_Test", err, errlen);
    if (done)
        free(q);
    return done;
}

static int req_wait(void *ctx, void *req, char *err, size_t errlen)
{
    (void)ctx;
    MpiReq *q = req;
    int rc = MPI_Wait(&q->r, MPI_STATUS_IGNORE);
    free(q);
    return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "MPI_Wait", err, errlen);
}

static int broadcast(void *ctx, void *data, int64_t bytes, int root, char *err, size_t errlen)
{
    MpiCtx *c = ctx;
    for (int64_t at = 0; at < bytes; at += 1 << 30) { /* MPI counts are ints */
        int64_t k = bytes - at < (1 << 30) ? bytes - at : (1 << 30);
        int rc = MPI_Bcast((char *)data + at, (int)k, MPI_BYTE, root, c->comm);
        if (rc != MPI_SUCCESS)
            return mpi_failed(rc, "MPI_Bcast", err, errlen);
    }
    return 0;
}

static void release(void *ctx)
{
    MpiCtx *c = ctx;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Comm_free(&c->comm);
    free(c);
}

int xtc_session_set_mpi_comm(XtcSession *s, MPI_Comm comm)
{
    if (!s)
        return XTC_ERR_ARG;
    int init = 0, rank = 0, size = 0;
    MPI_Initialized(&init);
    if (!init || comm == MPI_COMM_NULL) /* MPI_Init first; a communicator this process is in */
        return XTC_ERR_STATE;
    MpiCtx *c = malloc(sizeof *c);
    if (!c)
        return XTC_ERR_MEMORY;
    if (MPI_Comm_dup(comm, &c->comm) != MPI_SUCCESS) {
        free(c);
        return XTC_ERR_IO;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &rank);
    MPI_Comm_size(c->comm, &size);
    XtcComm x = {.rank = rank, .size = size, .ctx = c, .allreduce_start = allreduce_start, .test = test,
                 .wait = req_wait, .broadcast = broadcast, .release = release};
    int st = xtc_session_set_comm(s, &x);
    if (st)
        release(c);
    return st;
}

int xtc_session_set_mpi_nccl(XtcSession *s, MPI_Comm comm, int *nccl, char *why, size_t n)
{
    char msg[1024] = "";
    int one = 0;
    if (!nccl)
        nccl = &one;
    *nccl = 0;
    int st = xtc_session_set_mpi_comm(s, comm);
    if (st)
        return st;
    int rank = 0, size = 1, ok = xtc_session_nccl_usable(s, msg, sizeof msg), all = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
        all = 0, snprintf(msg, sizeof msg, "MPI_Allreduce failed");
    else if (!all && ok)
        snprintf(msg, sizeof msg, "another rank cannot use NCCL (its log says why)");
    unsigned char id[XTC_NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    int got = all && rank == 0 ? xtc_nccl_unique_id(id, msg, sizeof msg) : XTC_OK;
    if (all && (MPI_Bcast(&got, 1, MPI_INT, 0, comm) != MPI_SUCCESS || got != XTC_OK)) {
        all = 0;
        if (rank != 0)
            snprintf(msg, sizeof msg, "rank 0 could not make an NCCL id (its log says why)");
    }
    if (all && MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, comm) != MPI_SUCCESS)
        return XTC_ERR_IO;
    if (all) {
        if ((st = xtc_session_set_nccl(s, rank, size, id)) != XTC_OK)
            return st;
        *nccl = 1;
    }
    if (why && n)
        snprintf(why, n, "%s", msg);
    return XTC_OK;
}
