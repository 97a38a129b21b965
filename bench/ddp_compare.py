#!/usr/bin/env python3
"""Data-parallel benchmark, side by side in one run: 2 Gloo processes on this machine, MLP widths 64, 256, 1024.
Compares accel's data_parallel<gloo> with PyTorch's DistributedDataParallel (PyTorch from .venv) and with two
naive accel loops (one all-reduce per parameter; one flat all-reduce after backward). Every job is a fresh
2-process run started by `accel launch`; each round runs the four in an order that rotates, and the table reports
medians over rounds plus the median of per-round ratios against PyTorch DDP (target: accel <= 1.00).

Usage: ddp_compare.py LAUNCHER BENCH_DDP_STEP PYTHON_WITH_TORCH [ROUNDS]
"""
import os
import statistics
import sys

from launch_job import run_job

WIDTHS = {64: (800, 50), 256: (300, 30), 1024: (80, 10)}  # width: (steps, warm-up steps)
ACCEL_STRATEGIES = ["accel", "per_parameter", "flat"]


def milliseconds(launcher, command):
    name, width, ms = run_job(launcher, command)
    return float(ms)


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_step.py")
    names = ["pytorch_ddp"] + ACCEL_STRATEGIES
    print(f"2 Gloo processes, 1 thread each, SGD, batch 32 per process, MLP of 4 hidden layers; {rounds} rounds")
    print(f"{'width':>6} {'params':>9} | " + " ".join(f"{n + ' ms':>18}" for n in names) +
          " | accel/DDP  per_param/DDP  flat/DDP")
    for width, (steps, warmup) in WIDTHS.items():
        times = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                if name == "pytorch_ddp":
                    command = [python, script, str(width), str(steps), str(warmup)]
                else:
                    command = [bench, name, str(width), str(steps), str(warmup)]
                times[name].append(milliseconds(launcher, command))
        ratio = {n: statistics.median(a / b for a, b in zip(times[n], times["pytorch_ddp"])) for n in ACCEL_STRATEGIES}
        params = 4 * (width * width + width) + width + 1
        print(f"{width:>6} {params:>9} | " + " ".join(f"{statistics.median(times[n]):>18.3f}" for n in names) +
              f" | {ratio['accel']:>9.3f} {ratio['per_parameter']:>13.3f} {ratio['flat']:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
