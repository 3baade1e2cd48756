/* gpu.h: whether this machine can run CUDA modules on a real GPU (for the tests that run their
 * cases there as well as through the emulator). */
#ifndef XTC_TESTS_GPU_H
#define XTC_TESTS_GPU_H

#include "cg_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 when libcuda.so.1 (or $XTC_LIBCUDA) loads, reports a device and NVRTC is there; else 0 with
 * the reason in why. The driver is asked in a child process: a process that has initialised CUDA
 * cannot use it in the children it forks, and Check runs each test in one. */
static inline int gpu_present(char *why, size_t n)
{
    why[0] = 0;
    if (!cg_nvrtc_available(NULL, 0, why, n)) {
        if (!why[0])
            snprintf(why, n, "no NVRTC");
        return 0;
    }
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(why, n, "pipe failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        char msg[512] = "";
        const char *lib = getenv("XTC_LIBCUDA") ? getenv("XTC_LIBCUDA") : "libcuda.so.1";
        void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        int count = 0;
        if (!dl) {
            snprintf(msg, sizeof msg, "no CUDA driver (%s)", dlerror());
        } else {
            int (*init)(unsigned) = (int (*)(unsigned))dlsym(dl, "cuInit");
            int (*get_count)(int *) = (int (*)(int *))dlsym(dl, "cuDeviceGetCount");
            if (!init || !get_count || init(0) != 0 || get_count(&count) != 0 || count == 0)
                snprintf(msg, sizeof msg, "the CUDA driver reports no device");
        }
        ssize_t w = write(fd[1], msg, strlen(msg));
        _exit(w < 0);
    }
    close(fd[1]);
    ssize_t r = pid > 0 ? read(fd[0], why, n - 1) : -1;
    close(fd[0]);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    if (pid < 0 || r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        snprintf(why, n, "the probe of the CUDA driver failed");
    else
        why[r] = 0;
    return why[0] == 0;
}

#endif
