#!/usr/bin/env python3
"""Pipeline benchmark: bench_pipeline_step (an MLP of 16 Linear(2048, 2048) + Tanh pairs, micro-batches of 256 rows)
through each schedule on pp = 2 Gloo processes (one thread each, so each process has a core of this 2-core machine)
against the same micro-batches through the whole model in one process. Three bubbles per schedule:
- measured: of each step's span (the processes start its schedule together, after a barrier; it ends with the last
  process's end), the share the processes spent not computing (`accel::pipeline::last_step_timing`), averaged over
  the processes, then over the steps; the schedule's formula (accel::pipeline_bubble_formula) predicts it for stages
  of equal cost and free messages (the input requires grad, so that the first stage computes as much as the others);
- at the measured costs: the schedule's bubble, messages free, when each forward, backward (or its input part) and
  weight part costs what it did in the job (each process's mean in each step, through accel::simulate_pipeline,
  averaged over the steps): zero bubble's formula depends on the costs (ZB-H1's (p - 1)(F + B - W) idle per
  process), and every schedule's on the processes' speeds, which differ here by a few percent from job to job (a
  faster process waits for the slower one every round: at zero bubble's small bubble, as much again as the
  formula's). What remains between this and the measured bubble is what the messages cost;
- against one process: 1 - T(1) / (pp x T(pp)), everything the pp processes spend beyond the one process's work: the
  bubble, the messages (Gloo over loopback, whose threads share the cores with the computing ones, slowing the
  computation too), and, for zero bubble, what its split backward costs beyond autograd's one pass.
Every job runs once per round, rounds rotating their order; the table reports medians.

Usage: pipeline_compare.py LAUNCHER BENCH_PIPELINE_STEP [ROUNDS]
Environment: PP_SHAPE=WIDTHxROWS[xLAYERS] (2048x256x16: the layers' width, a micro-batch's rows, the Linear layers,
8 when left out), PP_STEPS (4) and PP_WARMUP (1) steps per job; a larger shape gives each message more computation to
hide behind (at 2048x256x16 a message of 2 MB, and 8 layers' forward and backward for each).
"""
import os
import statistics
import subprocess
import sys

from launch_job import run_job

PROCESSES = 2
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1))
MICRO_BATCHES = (4, 8)
STEPS, WARMUP = os.environ.get("PP_STEPS", "4"), os.environ.get("PP_WARMUP", "1")
SHAPE = os.environ.get("PP_SHAPE", "2048x256x16").split("x")  # width, rows[, layers]
LAYERS = SHAPE[2] if len(SHAPE) > 2 else "8"


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
    times, formula, measured, at_costs = {}, {}, {}, {}
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
            measured.setdefault((name, m), []).append(float(fields[6]))
            at_costs.setdefault((name, m), []).append(float(fields[7]))
    print(f"pp = {PROCESSES}, Linear({SHAPE[0]}, {SHAPE[0]}) x {LAYERS}, micro-batches of {SHAPE[1]} rows, medians of "
          f"{rounds} rounds, seconds per step")
    print("| schedule | micro-batches | pp = 2 | one process | measured bubble | formula | measured / formula | "
          "at the measured costs | measured / that (each job's) | 1 - T(1) / (2 T(2)) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, v in SCHEDULES:
        for m in MICRO_BATCHES:
            one = statistics.median(times[("one", m)])
            overall = [1 - o / (PROCESSES * t) for o, t in zip(times[("one", m)], times[(name, m)])]
            bubble = statistics.median(measured[(name, m)])
            costed = statistics.median(at_costs[(name, m)])
            # Each job's measured bubble against its own processes' costs, then the median over the rounds.
            against_costs = statistics.median(b / c for b, c in zip(measured[(name, m)], at_costs[(name, m)]))
            label = name if v == 1 else f"{name} (v = {v})"
            print(f"| {label} | {m} | {statistics.median(times[(name, m)]):.4f} | {one:.4f} | {bubble:.3f} | "
                  f"{formula[(name, m)]:.3f} | {bubble / formula[(name, m)]:.2f} | {costed:.3f} | {against_costs:.2f} | "
                  f"{statistics.median(overall):.3f} |")


if __name__ == "__main__":
    main()
