#!/usr/bin/env python3
"""Checkpoint-load benchmark (issue 33), side by side in one run: a model of 16 Linear(4096, 4096) layers (1.07 GB
of float32 weights, SGD: no optimizer state) on 4 Gloo processes, saved and loaded back. accel's fully_sharded
(a shard unit per layer) loading its sharded format and its full format (model.safetensors), each process reading
only its slices' bytes, and accel's path before issue 33 (accel_before_33: each process reads the whole
model.safetensors into memory and keeps its slices), against PyTorch's torch.distributed.checkpoint (DCP) load into
FSDP2 (fully_shard per layer).
Each round runs every job once, fresh, in an order that rotates; the files are in the page cache when loaded (each
job loads what it has just saved). The table reports medians over rounds of the slowest process's load time, the
largest resident set of any process during the load (VmHWM reset just before it), the largest just before it, what
the load added (the median of peak - before, also against 1/4 of the model's bytes), and the median of per-round
time ratios against DCP.

Usage: load_compare.py LAUNCHER BENCH_CHECKPOINT_LOAD PYTHON_WITH_TORCH [ROUNDS] [LAYERS WIDTH]
"""
import os
import shutil
import statistics
import sys
import tempfile

from launch_job import run_job

JOBS = ["accel_sharded", "accel_full", "accel_before_33", "pytorch_dcp"]
FOUR = ("--nproc_per_node", "4")


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    layers, width = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (16, 4096)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_load.py")
    model_bytes = layers * (width * width + width) * 4
    print(f"4 Gloo processes, 1 thread each, {layers} x Linear({width}, {width}): {model_bytes} bytes of weights, "
          f"1/4 = {model_bytes // 4}; {rounds} rounds")
    seconds, figures = {j: [] for j in JOBS}, {}
    for r in range(rounds):
        for job in JOBS[r % len(JOBS):] + JOBS[:r % len(JOBS)]:
            directory = tempfile.mkdtemp(prefix=f"accel_load_bench_{job}_")
            try:
                command = [bench] if job != "pytorch_dcp" else [python, script]
                fields = run_job(launcher, command + [job, directory, str(layers), str(width)], launch_flags=FOUR)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            seconds[job].append(float(fields[1]))
            figures.setdefault(job, []).append([int(float(f)) for f in fields[2:5]])
    print(f"{'':>15} {'load s':>8} {'peak B/proc':>13} {'before B/proc':>14} {'added B/proc':>13} "
          f"{'added / (1/4)':>14} {'files B':>12} {'/pytorch_dcp':>13}")
    for job in JOBS:
        peak = statistics.median(f[0] for f in figures[job])
        before = statistics.median(f[1] for f in figures[job])
        ratio = statistics.median(a / b for a, b in zip(seconds[job], seconds["pytorch_dcp"]))
        added = statistics.median(f[0] - f[1] for f in figures[job])
        print(f"{job:>15} {statistics.median(seconds[job]):>8.3f} {peak:>13.0f} {before:>14.0f} {added:>13.0f} "
              f"{added / (model_bytes / 4):>14.2f} {figures[job][-1][2]:>12} {ratio:>13.3f}")


if __name__ == "__main__":
    main()
