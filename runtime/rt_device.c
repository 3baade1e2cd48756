/* rt_device.c: which device runs a loaded module. A module that exports a device's object (for
 * now only CUDA's xtc_cuda_module_v1) runs through that device's RtDeviceOps; every other module
 * runs its own native code on the CPU and never touches a device library. */
#include "rt_cuda.h"

#include <dlfcn.h>
#include <string.h>

typedef struct {
    const char *symbol;
    const RtDeviceOps *ops;
    /* checks the object the module exports; -1 with a message */
    int (*check)(const void *abi, char *err, size_t n);
} DeviceKind;

static int check_cuda(const void *abi, char *err, size_t n)
{
    const XtcCudaModuleV1 *cm = abi;
    if (cm->magic != XTC_CUDA_MAGIC) {
        rt_set_error(err, n, "bad CUDA module magic 0x%08x", cm->magic);
        return -1;
    }
    if (cm->version != XTC_CUDA_VERSION) {
        rt_set_error(err, n, "CUDA module format version %u, this runtime reads version %d (recompile it)",
                     cm->version, XTC_CUDA_VERSION);
        return -1;
    }
    if (!cm->run || cm->nkernels < 0 || (cm->nkernels && !cm->kernel_names) || (!cm->ptx && !cm->emu)) {
        rt_set_error(err, n, "malformed CUDA module (no schedule, kernels or code)");
        return -1;
    }
    if (cm->emu && (cm->emu->magic != XTC_EMU_MAGIC || cm->emu->version != XTC_EMU_VERSION ||
                    cm->emu->nkernels != cm->nkernels || !cm->emu->launch)) {
        rt_set_error(err, n, "malformed emulated CUDA module (recompile it)");
        return -1;
    }
    return 0;
}

static const DeviceKind kinds[] = {
    {XTC_CUDA_SYMBOL, &rt_cuda_device, check_cuda},
};

int rt_device_attach(XtcModule *m, const char *path)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const void *abi = dlsym(m->dl, kinds[i].symbol);
        if (!abi)
            continue;
        char msg[512];
        if (kinds[i].check(abi, msg, sizeof msg) < 0) {
            rt_set_error(m->err, sizeof m->err, "%s: %s", path, msg);
            return -1;
        }
        m->device = kinds[i].ops;
        m->device_abi = abi;
        return 0;
    }
    return 0;
}
