/* fake_nccl.c: a stand-in for libnccl.so.2, test-only (test_nccl.sh, test_mpi.sh), for sessions of
 * cuda-emu modules, whose "device" memory is host memory: the entry points the runtime uses
 * (runtime/rt_nccl.c), for communicators of one rank, where an all-reduce is the rank's own data
 * times the pre-multiplied sum's factor, done at once (the emulator's streams are synchronous).
 * At ncclCommDestroy it prints on stderr how many all-reduces of how many floats it did, which
 * the tests read to see that the sums went through it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char internal[128];
} ncclUniqueId;

typedef struct {
    int nranks;
    long reduces, floats;
    float op_scale[8];
    int nops;
} FakeComm;

int ncclGetVersion(int *v)
{
    *v = 21105; /* as 2.11.5 */
    return 0;
}

int ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "fake-nccl");
    return 0;
}

int ncclCommInitRank(FakeComm **comm, int nranks, ncclUniqueId id, int rank)
{
    if (nranks != 1 || rank != 0 || strcmp(id.internal, "fake-nccl"))
        return 4; /* ncclInvalidArgument: one rank only here */
    *comm = calloc(1, sizeof **comm);
    if (!*comm)
        return 1;
    (*comm)->nranks = 1;
    return 0;
}

int ncclCommDestroy(FakeComm *c)
{
    fprintf(stderr, "fake nccl: %ld all-reduces of %ld floats\n", c->reduces, c->floats);
    free(c);
    return 0;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, FakeComm *c, void *stream)
{
    (void)stream;
    if (dtype != 7 || (op != 0 && (op < 5 || op - 5 >= c->nops)))
        return 4;
    const float *s = send;
    float *r = recv, k = op ? c->op_scale[op - 5] : 1.0f;
    for (size_t i = 0; i < count; i++)
        r[i] = op ? s[i] * k : s[i];
    c->reduces++;
    c->floats += (long)count;
    return 0;
}

int ncclRedOpCreatePreMulSum(int *op, void *scalar, int dtype, int residence, FakeComm *c)
{
    if (dtype != 7 || residence != 1 || c->nops == 8)
        return 4;
    c->op_scale[c->nops] = *(float *)scalar;
    *op = 5 + c->nops++;
    return 0;
}

int ncclRedOpDestroy(int op, FakeComm *c)
{
    (void)c;
    return op >= 5 ? 0 : 4;
}

int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }

const char *ncclGetErrorString(int r) { return r == 4 ? "invalid argument (fake)" : "error (fake)"; }
