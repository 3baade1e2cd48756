/* cmd_version.c: `xtc version` (also `xtc --version`, `xtc -V`): the version, the commit it was
 * built from, the LLVM it generates CPU code with, and whether the CUDA path works on this
 * machine: NVRTC to compile (--target cuda) and a driver to run what it compiled. */
#include <stdio.h>

#include "cg_cuda.h"
#include "cli.h"
#include "rt_abi.h"
#include "rt_cuda.h"

/* build_info.c, written at every build by cli/build_info.cmake */
extern const char xtc_build_commit[], xtc_build_llvm[];

int cli_version(int argc, char **argv)
{
    const CliCmd cmd = {
        .name = "version", .usage = "",
        .about = "Prints the version of xtc and of its runtime library, the git commit it was built from,\n"
                 "the LLVM version of its CPU code generation, and whether the CUDA path is available\n"
                 "here: NVRTC compiles --target cuda, the driver (libcuda.so.1) runs the modules.\n",
    };
    int prc = cli_parse(&cmd, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    printf("xtc %s", XTC_VERSION);
    if (xtc_build_commit[0])
        printf(" (git %s)", xtc_build_commit);
    printf("\nlibxtc %s, module format %d\n", xtc_version(), XTC_ABI_VERSION);
    printf("LLVM %s: --target cpu\n", xtc_build_llvm[0] ? xtc_build_llvm : "?");
    char ver[32], why[1024];
    if (cg_nvrtc_available(ver, sizeof ver, why, sizeof why))
        printf("CUDA: NVRTC %s: --target cuda compiles", ver);
    else
        printf("CUDA: NVRTC not found: --target cuda does not compile here (XTC_NVRTC=path)");
    RtCuDriver d;
    int dv = 0;
    if (rt_cu_driver_load(&d, why, sizeof why) == 0 && d.DriverGetVersion(&dv) == 0)
        printf("; driver %d.%d: CUDA modules run here\n", dv / 1000, dv % 1000 / 10);
    else
        printf("; no driver (libcuda.so.1): CUDA modules do not run here\n");
    printf("cuda-emu: the CUDA path emulated on the CPU, always available\n");
    return 0;
}
