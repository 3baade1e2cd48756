#!/usr/bin/python3
"""torch_cputime.py TORCH_GPT_PY model ARGS...: torch_gpt.py's model timings with the process's CPU time too.

Loads TORCH_GPT_PY (../shared/bench/torch_gpt.py, unchanged) as a module with ARGS as its command line, so
that it sets its threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, torch.set_num_threads) before importing
torch exactly as when run itself, builds the same model and runs the same phases, warm-ups and timed
iterations through its own timeit(); the only change is that each iteration is also timed with
time.process_time() (user + system time of every thread of the process: the work, which other processes on
a shared machine move far less than the wall clock). Run it in torch_gpt.py's tuned setting (the OpenMP
OpenBLAS on LD_LIBRARY_PATH, OPENBLAS_CORETYPE=SkylakeX; see ../shared/bench/README.md).

Prints torch_gpt.py's JSON result (as with --json), each timed phase with three more keys: "cpu_s" (the
timed iterations' CPU seconds, in order), "cpu_median_s" and "cpu_min_s".
"""
import importlib.util
import json
import statistics
import sys
import time


def main():
    if len(sys.argv) < 3 or sys.argv[2] != "model":
        sys.exit("usage: torch_cputime.py TORCH_GPT_PY model [torch_gpt.py's model options]")
    path = sys.argv[1]
    sys.argv = [path] + sys.argv[2:]
    spec = importlib.util.spec_from_file_location("torch_gpt", path)
    tg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tg)  # parses sys.argv, sets the threads' environment, imports torch
    wall_timeit = tg.timeit

    def timeit(fn, iters, warmup):
        cpu = []

        def timed():
            c0 = time.process_time()
            fn()
            cpu.append(time.process_time() - c0)

        r = wall_timeit(timed, iters, warmup)
        if len(cpu) != warmup + iters:
            sys.exit("torch_cputime.py: torch_gpt.timeit ran %d calls for %d warm-up + %d timed" %
                     (len(cpu), warmup, iters))
        cpu = cpu[warmup:]
        r.update(cpu_s=cpu, cpu_median_s=statistics.median(cpu), cpu_min_s=min(cpu))
        return r

    tg.timeit = timeit
    print(json.dumps(tg.run_model(tg.ARGS)))


if __name__ == "__main__":
    main()
