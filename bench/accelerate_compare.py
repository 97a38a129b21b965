#!/usr/bin/env python3
"""accel against Hugging Face Accelerate, side by side in one run: the tiny MLP step (64 -> 64 -> 64 -> 1, AdamW,
batch 64 per process, one thread per process) on one process, and on 2 Gloo processes started by the same launcher
(`accel launch`). Jobs: bench/tiny_step.cpp (accel) and bench/accelerate_step.py (Accelerate; and the plain PyTorch
loop on one process, for reference). Every job is a fresh run; each round runs them in an order that rotates; the
table reports medians over rounds and the median of per-round ratios (target: Accelerate / accel >= 1.8 on one
process).

Usage: accelerate_compare.py LAUNCHER BENCH_TINY_STEP PYTHON [ROUNDS]
"""
import os
import statistics
import subprocess
import sys

STEPS, WARMUP = 3000, 300


def run(command, launcher=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if launcher:
        command = [launcher, "launch", "--nproc_per_node", "2", "--master_port", "0", *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"job failed ({out.returncode}): {' '.join(command)}\n{out.stdout}\n{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1].split()[2])


def compare(title, jobs, rounds, baseline):
    times = {name: [] for name in jobs}
    names = list(jobs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(jobs[name]())
    print(f"\n{title}")
    print(f"{'job':<34} {'median us/step':>15} {'min us/step':>12} {'/ accel':>9}")
    for name in names:
        ratio = statistics.median(t / a for t, a in zip(times[name], times[baseline]))
        print(f"{name:<34} {statistics.median(times[name]):>15.2f} {min(times[name]):>12.2f} {ratio:>9.3f}", flush=True)


def main():
    launcher, tiny_step, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 7
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_step.py")
    steps = [str(STEPS), str(WARMUP)]
    print(f"tiny MLP step (64-64-64-1, AdamW, batch 64 per process, 1 thread per process), {STEPS} steps after "
          f"{WARMUP}, {rounds} rounds")
    compare("one process", {
        "accel": lambda: run([tiny_step, "single", *steps]),
        "Hugging Face Accelerate": lambda: run([python, script, "accelerate", *steps]),
        "plain PyTorch (Python, no Accelerate)": lambda: run([python, script, "raw", *steps]),
    }, rounds, baseline="accel")
    compare("2 Gloo processes (accel launch)", {
        "accel (data_parallel<gloo>)": lambda: run([tiny_step, "data_parallel", *steps], launcher),
        "Hugging Face Accelerate (DDP, Gloo)": lambda: run([python, script, "accelerate", *steps], launcher),
    }, rounds, baseline="accel (data_parallel<gloo>)")


if __name__ == "__main__":
    main()
