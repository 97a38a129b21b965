#!/usr/bin/env python3
"""Communication hook benchmark, side by side in one run: 2 Gloo processes on this machine, the MLP of width 1024
(bench/support.hpp's wide_mlp: 4 hidden layers, 4.2 M parameters, 16.8 MB of float32 gradients), SGD, batch 32 per
process. For each hook (none, fp16, bf16, PowerSGD of rank 1 and 4 from the second step), accel's data_parallel with
options::comm_hook (bench/comm_hook_step.cpp) and PyTorch's DDP with the same hook (bench/comm_hook_step.py). Every
job is a fresh 2-process run started by `accel launch`; each round runs all of them in an order that rotates. The
table reports, per hook, the bytes accel hands to the gradient collectives per step (per process), median ms per step
over rounds for both, and the medians of per-round ratios: accel against PyTorch with the same hook, and accel with
the hook against accel without one. PyTorch's PowerSGD hook chains its collectives in future callbacks, which on
Gloo issue them in a different order on each process once there are several buckets: its jobs often abort
("Received data size doesn't match expected size"); the table counts those and reports the runs that finished.
HOOK_one_bucket rows put the whole model in one bucket on both sides (bucket caps of 1000 MiB), where PyTorch's
PowerSGD runs; their "no hook" is none_one_bucket.

Usage: comm_hooks_compare.py LAUNCHER BENCH_COMM_HOOK_STEP PYTHON_WITH_TORCH [ROUNDS]
"""
import math
import os
import statistics
import sys

from launch_job import run_job

HOOKS = ["none", "fp16", "bf16", "power_sgd_rank1", "power_sgd_rank4",
         "none_one_bucket", "power_sgd_rank1_one_bucket", "power_sgd_rank4_one_bucket"]
WIDTH, STEPS, WARMUP = 1024, 60, 10


def hook_figures(launcher, command, may_fail=False):
    """The figures process 0 printed after `hook width`; None for a job that failed and `may_fail`."""
    fields = run_job(launcher, command, may_fail)
    return None if fields is None else fields[2:]


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "comm_hook_step.py")
    jobs = [(side, hook) for hook in HOOKS for side in ("accel", "pytorch")]
    times = {job: [] for job in jobs}
    sent = {}
    for r in range(rounds):
        for side, hook in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            if side == "accel":
                ms, bytes_per_step = hook_figures(launcher, [bench, hook, str(WIDTH), str(STEPS), str(WARMUP)])
                sent[hook] = float(bytes_per_step)
            else:
                figures = hook_figures(launcher, [python, script, hook, str(WIDTH), str(STEPS), str(WARMUP)],
                                       may_fail=hook.startswith("power_sgd"))
                ms = figures[0] if figures else "nan"
            times[(side, hook)].append(float(ms))
    print(f"2 Gloo processes, 1 thread each, SGD, batch 32 per process, MLP width {WIDTH}; {STEPS} timed steps after "
          f"{WARMUP}; {rounds} rounds")
    print(f"{'hook':<27} {'MB sent/step':>13} {'accel ms':>10} {'PyTorch ms':>11} {'accel/PyTorch':>14} "
          f"{'accel/no hook':>14} {'PyTorch runs failed':>20}")
    for hook in HOOKS:
        accel, pytorch = times[("accel", hook)], times[("pytorch", hook)]
        finished = [(a, b) for a, b in zip(accel, pytorch) if not math.isnan(b)]
        pytorch_ms = statistics.median(b for _, b in finished) if finished else math.nan
        against_pytorch = statistics.median(a / b for a, b in finished) if finished else math.nan
        baseline = times[("accel", "none_one_bucket" if hook.endswith("_one_bucket") else "none")]
        against_none = statistics.median(a / b for a, b in zip(accel, baseline))
        print(f"{hook:<27} {sent[hook] / 1e6:>13.3f} {statistics.median(accel):>10.2f} {pytorch_ms:>11.2f} "
              f"{against_pytorch:>14.3f} {against_none:>14.3f} {len(pytorch) - len(finished):>14} of {rounds}",
              flush=True)


if __name__ == "__main__":
    main()
