/* cg_cuda_nvrtc.c: CUDA C to PTX with NVRTC, the CUDA runtime compiler, loaded with dlopen so
 * that xtc builds and runs without the CUDA toolkit (only --target cuda needs it) and needs no
 * CUDA header: the few types and functions used are declared here.
 *
 * The library is looked for in $XTC_NVRTC (a path), the one CMake found at configure time, the
 * loader's path (libnvrtc.so, libnvrtc.so.13, .12, .11.2), $CUDA_HOME/lib64, $CUDA_PATH/lib64
 * and /usr/local/cuda/lib64. It is loaded once per process (pthread_once) and never unloaded;
 * NVRTC itself may be called from several threads. */
#include "cg_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

typedef struct {
    void *dl;
    char path[512];
    int major, minor;
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *major, int *minor);
    nvrtcResult (*CreateProgram)(nvrtcProgram *prog, const char *src, const char *name, int nheaders,
                                 const char *const *headers, const char *const *include_names);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *prog);
    nvrtcResult (*CompileProgram)(nvrtcProgram prog, int nopts, const char *const *opts);
    nvrtcResult (*GetPTXSize)(nvrtcProgram prog, size_t *size);
    nvrtcResult (*GetPTX)(nvrtcProgram prog, char *ptx);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram prog, size_t *size);
    nvrtcResult (*GetProgramLog)(nvrtcProgram prog, char *log);
} Nvrtc;

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static Nvrtc nvrtc;              /* written once, under nvrtc_once */
static char nvrtc_why[1024];     /* why it could not be loaded */

static void *find_symbol(void *dl, const char *name, int *missing)
{
    void *p = dlsym(dl, name);
    if (!p)
        *missing = 1;
    return p;
}

static int try_load(const char *path, size_t *tried_len)
{
    if (!path || !*path)
        return -1;
    if (*tried_len < sizeof nvrtc_why)
        *tried_len += (size_t)snprintf(nvrtc_why + *tried_len, sizeof nvrtc_why - *tried_len, "%s%s",
                                       *tried_len ? ", " : "", path);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        return -1;
    int missing = 0;
    Nvrtc n = {.dl = dl};
    *(void **)&n.GetErrorString = find_symbol(dl, "nvrtcGetErrorString", &missing);
    *(void **)&n.Version = find_symbol(dl, "nvrtcVersion", &missing);
    *(void **)&n.CreateProgram = find_symbol(dl, "nvrtcCreateProgram", &missing);
    *(void **)&n.DestroyProgram = find_symbol(dl, "nvrtcDestroyProgram", &missing);
    *(void **)&n.CompileProgram = find_symbol(dl, "nvrtcCompileProgram", &missing);
    *(void **)&n.GetPTXSize = find_symbol(dl, "nvrtcGetPTXSize", &missing);
    *(void **)&n.GetPTX = find_symbol(dl, "nvrtcGetPTX", &missing);
    *(void **)&n.GetProgramLogSize = find_symbol(dl, "nvrtcGetProgramLogSize", &missing);
    *(void **)&n.GetProgramLog = find_symbol(dl, "nvrtcGetProgramLog", &missing);
    if (missing || n.Version(&n.major, &n.minor) != 0) {
        dlclose(dl);
        return -1;
    }
    snprintf(n.path, sizeof n.path, "%s", path);
    nvrtc = n;
    return 0;
}

static void load_nvrtc(void)
{
    size_t tried = 0;
    char buf[2][600];
    const char *home = getenv("CUDA_HOME"), *cpath = getenv("CUDA_PATH");
    snprintf(buf[0], sizeof buf[0], "%s/lib64/libnvrtc.so", home ? home : "");
    snprintf(buf[1], sizeof buf[1], "%s/lib64/libnvrtc.so", cpath ? cpath : "");
    const char *candidates[] = {
        getenv("XTC_NVRTC"),
#ifdef XTC_NVRTC_DEFAULT
        XTC_NVRTC_DEFAULT,
#endif
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11.2",
        home ? buf[0] : NULL,
        cpath ? buf[1] : NULL,
        "/usr/local/cuda/lib64/libnvrtc.so",
    };
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++)
        if (try_load(candidates[i], &tried) == 0)
            return;
    char tried_list[sizeof nvrtc_why];
    snprintf(tried_list, sizeof tried_list, "%s", nvrtc_why);
    snprintf(nvrtc_why, sizeof nvrtc_why,
             "NVRTC (the CUDA runtime compiler, libnvrtc.so) was not found (tried %.700s): install the CUDA toolkit, "
             "or set XTC_NVRTC to the library's path",
             tried_list);
}

int cg_nvrtc_available(char *version, size_t nversion, char *why, size_t nwhy)
{
    pthread_once(&nvrtc_once, load_nvrtc);
    if (!nvrtc.dl) {
        if (why)
            snprintf(why, nwhy, "%s", nvrtc_why);
        return 0;
    }
    if (version)
        snprintf(version, nversion, "%d.%d", nvrtc.major, nvrtc.minor);
    return 1;
}

int cg_cuda_arch_number(const char *arch, char *err, size_t n)
{
    const char *p = arch ? arch : CU_DEFAULT_ARCH;
    if (strncmp(p, "sm_", 3) == 0)
        p += 3;
    else if (strncmp(p, "compute_", 8) == 0)
        p += 8;
    int v = 0, digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 4; p++, digits++)
        v = v * 10 + (*p - '0');
    if (*p == 'a' || *p == 'f') /* sm_90a, sm_100f: architecture-specific variants */
        p++;
    if (*p || digits < 2 || digits > 3 || v < 50) {
        snprintf(err, n, "unknown CUDA architecture '%s' (expected sm_XY, e.g. sm_80 or sm_90)", arch ? arch : "");
        return -1;
    }
    return v;
}

/* NVRTC's log with its error lines (and the line after each: the source) moved before its warnings,
 * in their order, so that a message cut to its first part names what failed */
static void errors_first(char *log)
{
    size_t len = strlen(log);
    char *out = malloc(len + 1);
    if (!out)
        return;
    size_t o = 0;
    for (int pass = 0; pass < 2; pass++) {
        int take_next = 0;
        for (const char *p = log; *p;) {
            const char *e = strchr(p, '\n');
            size_t l = e ? (size_t)(e - p) + 1 : strlen(p);
            int is_error = strstr(p, ": error") && strstr(p, ": error") < p + l;
            int mine = is_error || take_next;
            take_next = is_error;
            if (mine == (pass == 0)) {
                memcpy(out + o, p, l);
                o += l;
            }
            p += l;
        }
    }
    out[o] = 0;
    memcpy(log, out, o + 1);
    free(out);
}

int cg_nvrtc_compile(const char *source, const char *name, const char *arch, char **ptx, char *err, size_t n)
{
    *ptx = NULL;
    char why[sizeof nvrtc_why];
    if (!cg_nvrtc_available(NULL, 0, why, sizeof why)) {
        snprintf(err, n, "%s", why);
        return -1;
    }
    int num = cg_cuda_arch_number(arch, err, n);
    if (num < 0)
        return -1;
    char opt_arch[64];
    const char *a = arch ? arch : CU_DEFAULT_ARCH;
    const char *suffix = a + strlen(a) - 1;
    /* PTX for the virtual architecture: the driver JIT-compiles it for the device at load time */
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=compute_%d%s", num,
             *suffix == 'a' || *suffix == 'f' ? suffix : "");
    const char *opts[] = {opt_arch, "--std=c++17"};
    nvrtcProgram prog = NULL;
    nvrtcResult r = nvrtc.CreateProgram(&prog, source, name, 0, NULL, NULL);
    if (r != 0) {
        snprintf(err, n, "NVRTC (%s): nvrtcCreateProgram failed: %s", nvrtc.path, nvrtc.GetErrorString(r));
        return -1;
    }
    r = nvrtc.CompileProgram(prog, (int)(sizeof opts / sizeof opts[0]), opts);
    size_t loglen = 0;
    char *log = NULL;
    if (nvrtc.GetProgramLogSize(prog, &loglen) == 0 && loglen > 1 && (log = malloc(loglen + 1))) {
        if (nvrtc.GetProgramLog(prog, log) != 0)
            log[0] = 0;
        log[loglen] = 0;
    }
    if (r != 0) {
        if (log)
            errors_first(log);
        snprintf(err, n, "NVRTC %d.%d could not compile the CUDA C for %s (%s): %.1200s", nvrtc.major, nvrtc.minor,
                 strchr(opt_arch, '=') + 1, nvrtc.GetErrorString(r), log ? log : "(no log)");
        free(log);
        nvrtc.DestroyProgram(&prog);
        return -1;
    }
    free(log);
    size_t size = 0;
    if (nvrtc.GetPTXSize(prog, &size) != 0 || !(*ptx = malloc(size + 1)) || nvrtc.GetPTX(prog, *ptx) != 0) {
        snprintf(err, n, "NVRTC: cannot retrieve the PTX");
        free(*ptx);
        *ptx = NULL;
        nvrtc.DestroyProgram(&prog);
        return -1;
    }
    (*ptx)[size] = 0;
    nvrtc.DestroyProgram(&prog);
    return 0;
}
