#!/usr/bin/env python3
"""Pipeline benchmark: bench_pipeline_step (an MLP of 8 Linear(512, 512) + Tanh pairs, micro-batches of 32 rows)
through each schedule on pp = 2 Gloo processes (one thread each, so each process has a core of this 2-core machine)
against the same micro-batches through the whole model in one process. The measured bubble of a schedule is the
share of the pp processes' time not spent on the one process's work: 1 - T(1) / (pp x T(pp)); it is compared with the
schedule's formula (accel::pipeline_bubble_formula). What the formula leaves out shows as the difference: the
messages (a header and the activation or gradient, through Gloo over loopback) and, for zero bubble, the second
pass over each stage's graph that LibTorch's split backward costs. Every job runs once per round, rounds rotating
their order; the table reports medians.

Usage: pipeline_compare.py LAUNCHER BENCH_PIPELINE_STEP [ROUNDS]
Environment: PP_SHAPE=WIDTHxROWS (512x32: the layers' width, a micro-batch's rows), PP_STEPS (10) and PP_WARMUP (3)
steps per job; a larger shape gives each message more computation to hide behind.
"""
import os
import statistics
import subprocess
import sys

from launch_job import run_job

PROCESSES = 2
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1))
MICRO_BATCHES = (4, 8)
STEPS, WARMUP = os.environ.get("PP_STEPS", "10"), os.environ.get("PP_WARMUP", "3")
SHAPE = os.environ.get("PP_SHAPE", "512x32").split("x")  # width, rows


def one_process(bench, micro_batches):
    out = subprocess.run([bench, "1f1b", "1", str(micro_batches), STEPS, WARMUP, *SHAPE], capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    if out.returncode != 0:
        sys.exit(f"one-process job failed ({out.returncode})\n{out.stdout}\n{out.stderr}")
    return float(out.stdout.split()[4])


def main():
    launcher, bench = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    jobs = [("one", 1, m) for m in MICRO_BATCHES] + [(s, v, m) for s, v in SCHEDULES for m in MICRO_BATCHES]
    times, formula = {}, {}
    for r in range(rounds):
        for name, v, m in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            if name == "one":
                times.setdefault((name, m), []).append(one_process(bench, m))
                continue
            fields = run_job(launcher, [bench, name, str(v), str(m), STEPS, WARMUP, *SHAPE],
                             launch_flags=("--nproc_per_node", str(PROCESSES), "--parallelism_config_pp_size",
                                           str(PROCESSES)))
            times.setdefault((name, m), []).append(float(fields[4]))
            formula[(name, m)] = float(fields[5])
    print(f"pp = {PROCESSES}, Linear({SHAPE[0]}, {SHAPE[0]}) x 8, micro-batches of {SHAPE[1]} rows, medians of "
          f"{rounds} rounds, seconds per step")
    print("| schedule | micro-batches | pp = 2 | one process | measured bubble | formula |")
    print("|---|---|---|---|---|---|")
    for name, v in SCHEDULES:
        for m in MICRO_BATCHES:
            one = statistics.median(times[("one", m)])
            bubbles = [1 - o / (PROCESSES * t) for o, t in zip(times[("one", m)], times[(name, m)])]
            label = name if v == 1 else f"{name} (v = {v})"
            print(f"| {label} | {m} | {statistics.median(times[(name, m)]):.4f} | {one:.4f} | "
                  f"{statistics.median(bubbles):.3f} | {formula[(name, m)]:.3f} |")


if __name__ == "__main__":
    main()
