/* rt_nccl.c: NCCL for a CUDA module's session (include/xtc.h): the gradients summed over the ranks
 * on the device, in place, by ncclAllReduce on the session's stream. libnccl.so.2 (or the file
 * $XTC_NCCL names) is loaded with dlopen on first use, as the CUDA driver is
 * (rt_cuda_driver.c), so that the runtime links nothing of NCCL and a machine without it gets a
 * clear message (and the caller falls back to sums through host memory). The few types of nccl.h
 * used are declared here (their values are NCCL's ABI, stable since 2.0; the pre-multiplied sum
 * since 2.11). The library is never unloaded. */
#include "rt_session.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char internal[XTC_NCCL_ID_BYTES];
} NcclUniqueId;
typedef void *NcclComm;
enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0, NCCL_SCALAR_HOST_IMMEDIATE = 1 };

typedef struct {
    int (*GetVersion)(int *version);
    int (*GetUniqueId)(NcclUniqueId *id);
    int (*CommInitRank)(NcclComm *comm, int nranks, NcclUniqueId id, int rank);
    int (*CommDestroy)(NcclComm comm);
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, NcclComm comm, void *stream);
    const char *(*GetErrorString)(int result);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    int (*RedOpCreatePreMulSum)(int *op, void *scalar, int dtype, int residence, NcclComm comm);
    int (*RedOpDestroy)(int op, NcclComm comm);
    char path[512];
    int version;
} NcclLib;

static NcclLib lib;
static int lib_state; /* 0 not tried, 1 loaded, -1 failed (lib_err says why) */
static char lib_err[768];
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;

static void *sym(void *dl, const char *name, const char **missing)
{
    void *p = dlsym(dl, name);
    if (!p && !*missing)
        *missing = name;
    return p;
}

static int load_locked(void)
{
    const char *path = getenv("XTC_NCCL");
    if (!path || !*path)
        path = "libnccl.so.2";
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        snprintf(lib_err, sizeof lib_err, "no NCCL: cannot load %s (%s); set XTC_NCCL to the path of libnccl.so.2",
                 path, e ? e : "dlopen failed");
        return -1;
    }
    const char *missing = NULL;
    *(void **)&lib.GetVersion = sym(dl, "ncclGetVersion", &missing);
    *(void **)&lib.GetUniqueId = sym(dl, "ncclGetUniqueId", &missing);
    *(void **)&lib.CommInitRank = sym(dl, "ncclCommInitRank", &missing);
    *(void **)&lib.CommDestroy = sym(dl, "ncclCommDestroy", &missing);
    *(void **)&lib.AllReduce = sym(dl, "ncclAllReduce", &missing);
    *(void **)&lib.GetErrorString = sym(dl, "ncclGetErrorString", &missing);
    *(void **)&lib.GroupStart = sym(dl, "ncclGroupStart", &missing);
    *(void **)&lib.GroupEnd = sym(dl, "ncclGroupEnd", &missing);
    *(void **)&lib.RedOpCreatePreMulSum = sym(dl, "ncclRedOpCreatePreMulSum", &missing);
    *(void **)&lib.RedOpDestroy = sym(dl, "ncclRedOpDestroy", &missing);
    if (missing) {
        snprintf(lib_err, sizeof lib_err, "the NCCL library %s lacks %s (NCCL 2.11 or later is needed)", path,
                 missing);
        return -1;
    }
    if (lib.GetVersion(&lib.version) != NCCL_SUCCESS)
        lib.version = 0;
    snprintf(lib.path, sizeof lib.path, "%s", path);
    return 1;
}

/* NCCL loaded: 0, or -1 with why in err */
static int nccl_load(char *err, size_t n)
{
    pthread_mutex_lock(&lib_lock);
    if (!lib_state)
        lib_state = load_locked();
    int st = lib_state;
    pthread_mutex_unlock(&lib_lock);
    if (st < 0)
        rt_set_error(err, n, "%s", lib_err);
    return st < 0 ? -1 : 0;
}

static int nccl_failed(int r, const char *what, char *err, size_t n)
{
    const char *text = lib.GetErrorString ? lib.GetErrorString(r) : NULL;
    rt_set_error(err, n, "%s: NCCL error %d: %s", what, r, text ? text : "unknown");
    return -1;
}

int xtc_nccl_unique_id(unsigned char id[XTC_NCCL_ID_BYTES], char *err, size_t errlen)
{
    char msg[768];
    if (!id)
        return XTC_ERR_ARG;
    if (nccl_load(msg, sizeof msg)) {
        if (err && errlen)
            snprintf(err, errlen, "%s", msg);
        return XTC_ERR_IO;
    }
    NcclUniqueId u;
    int r = lib.GetUniqueId(&u);
    if (r != NCCL_SUCCESS) {
        nccl_failed(r, "ncclGetUniqueId", msg, sizeof msg);
        if (err && errlen)
            snprintf(err, errlen, "%s", msg);
        return XTC_ERR_IO;
    }
    memcpy(id, u.internal, XTC_NCCL_ID_BYTES);
    return XTC_OK;
}

struct RtNccl {
    NcclComm comm;
    int op;           /* the pre-multiplied sum by op_weight, when have_op */
    int have_op;
    float op_weight;
};

/* Why session s cannot sum its gradients with NCCL, in why: -1 (the module), -2 (no NCCL); 0: it can. */
static int not_usable(XtcSession *s, char *why, size_t n)
{
    const XtcModule *m = s->m;
    if (!s->dev || !m->device->locate) {
        rt_set_error(why, n, "the module is not a CUDA module (NCCL sums device memory)");
        return -1;
    }
    const char *env = getenv("XTC_NCCL");
    if (!strncmp(m->device->device_name(s->dev), "the xtc CUDA emulator", 21) && (!env || !*env)) {
        rt_set_error(why, n, "the CUDA emulator's device memory is host memory: NCCL only as $XTC_NCCL names it "
                             "(a stand-in for tests)");
        return -1;
    }
    if (s->scaler.buf >= 0) {
        rt_set_error(why, n, "the module scales its loss (fp16): its gradients are unscaled and checked on the host");
        return -1;
    }
    for (int i = 0; i < m->nby_kind[RT_BUF_PARAM]; i++) {
        char name[600];
        snprintf(name, sizeof name, "grad.%s", m->bufs[m->by_kind[RT_BUF_PARAM][i]].name);
        int o = rs_find_output(m, name);
        if (o < 0) {
            rt_set_error(why, n, "the module has no output '%s': a training module (xtc compile --train) computes "
                                 "the gradients to sum", name);
            return -1;
        }
        int b = m->outs[o].buf;
        if (m->bufs[b].dtype != XTC_F32 || m->device->elem_bytes(m, b) != sizeof(float)) {
            rt_set_error(why, n, "gradient '%s' is stored in 16 bits on the device (NCCL sums f32 here)", name);
            return -1;
        }
    }
    return nccl_load(why, n) ? -2 : 0;
}

int xtc_session_nccl_usable(XtcSession *s, char *why, size_t n)
{
    char msg[768];
    if (!s || !s->m)
        return 0;
    if (not_usable(s, msg, sizeof msg)) {
        if (why && n)
            snprintf(why, n, "%s", msg);
        return 0;
    }
    if (why && n)
        snprintf(why, n, "NCCL %d.%d.%d (%s)", lib.version / 10000, lib.version / 100 % 100, lib.version % 100,
                 lib.path);
    return 1;
}

/* the one-rank host communicator a one-rank NCCL communicator stands beside (for sync) */
static int one_allreduce(void *ctx, float *data, int64_t n, void **req, char *err, size_t errlen)
{
    (void)ctx, (void)data, (void)n, (void)err, (void)errlen;
    *req = NULL;
    return 0;
}
static int one_wait(void *ctx, void *req, char *err, size_t errlen)
{
    (void)ctx, (void)req, (void)err, (void)errlen;
    return 0;
}
static int one_bcast(void *ctx, void *data, int64_t bytes, int root, char *err, size_t errlen)
{
    (void)ctx, (void)data, (void)bytes, (void)root, (void)err, (void)errlen;
    return 0;
}

int xtc_session_set_nccl(XtcSession *s, int rank, int size, const unsigned char *id)
{
    if (!rs_ready(s, "xtc_session_set_nccl"))
        return s ? XTC_ERR_STATE : XTC_ERR_ARG;
    if (size < 1 || rank < 0 || rank >= size || (!id && size > 1))
        return rs_fail(s, XTC_ERR_ARG, "xtc_session_set_nccl: needs 0 <= rank < size, and an id for several ranks");
    char why[768];
    int have = not_usable(s, why, sizeof why);
    if (have)
        return rs_fail(s, have == -1 ? XTC_ERR_STATE : XTC_ERR_IO, "xtc_session_set_nccl: %s", why);
    int csize = s->comm ? rt_comm_size(s) : 0;
    if ((size > 1 || csize > 1) && (rt_comm_rank(s) != rank || csize != size))
        return rs_fail(s, XTC_ERR_STATE, "xtc_session_set_nccl: attach a communicator of the same %d ranks first "
                                         "(xtc_session_set_comm: rank %d of %d)", size, rank, size);
    NcclUniqueId u;
    if (id)
        memcpy(u.internal, id, XTC_NCCL_ID_BYTES);
    else if ((have = lib.GetUniqueId(&u)) != NCCL_SUCCESS) {
        nccl_failed(have, "ncclGetUniqueId", why, sizeof why);
        return rs_fail(s, XTC_ERR_IO, "xtc_session_set_nccl: %s", why);
    }
    void *p = NULL, *stream = NULL;
    if (s->m->device->locate(s->dev, -1, &p, &stream, why, sizeof why) < 0)
        return rs_fail(s, XTC_ERR_IO, "xtc_session_set_nccl: %s", why);
    struct RtNccl *nc = rt_calloc(1, sizeof *nc);
    if (!nc)
        return rs_fail(s, XTC_ERR_MEMORY, "out of memory for the NCCL communicator");
    int r = lib.CommInitRank(&nc->comm, size, u, rank);
    if (r != NCCL_SUCCESS) {
        free(nc);
        nccl_failed(r, "ncclCommInitRank", why, sizeof why);
        return rs_fail(s, XTC_ERR_IO, "xtc_session_set_nccl: %s", why);
    }
    if (size == 1 && csize != 1) { /* alone: a host communicator of one rank beside it */
        XtcComm one = {.rank = 0, .size = 1, .allreduce_start = one_allreduce, .wait = one_wait,
                       .broadcast = one_bcast};
        int st = xtc_session_set_comm(s, &one);
        if (st) {
            rt_nccl_free(nc);
            return st;
        }
    }
    return rt_comm_set_nccl(s, nc);
}

int rt_nccl_allreduce(RtNccl *nc, void *dptr, int64_t n, double weight, void *stream, char *err, size_t errlen)
{
    int op = NCCL_SUM, r;
    if (weight != 1) { /* each rank's gradient times its share of the batch, then summed */
        float w = (float)weight;
        if (nc->have_op && nc->op_weight != w) {
            lib.RedOpDestroy(nc->op, nc->comm);
            nc->have_op = 0;
        }
        if (!nc->have_op) {
            if ((r = lib.RedOpCreatePreMulSum(&nc->op, &w, NCCL_FLOAT32, NCCL_SCALAR_HOST_IMMEDIATE, nc->comm)) !=
                NCCL_SUCCESS)
                return nccl_failed(r, "ncclRedOpCreatePreMulSum", err, errlen);
            nc->have_op = 1;
            nc->op_weight = w;
        }
        op = nc->op;
    }
    if (n > 0 && (r = lib.AllReduce(dptr, dptr, (size_t)n, NCCL_FLOAT32, op, nc->comm, stream)) != NCCL_SUCCESS)
        return nccl_failed(r, "ncclAllReduce", err, errlen);
    return 0;
}

int rt_nccl_group(RtNccl *nc, int start, char *err, size_t errlen)
{
    (void)nc;
    int r = start ? lib.GroupStart() : lib.GroupEnd();
    return r == NCCL_SUCCESS ? 0 : nccl_failed(r, start ? "ncclGroupStart" : "ncclGroupEnd", err, errlen);
}

void rt_nccl_free(RtNccl *nc)
{
    if (!nc)
        return;
    if (nc->have_op)
        lib.RedOpDestroy(nc->op, nc->comm);
    lib.CommDestroy(nc->comm);
    free(nc);
}
