#!/usr/bin/env python3
"""The flight recorder's cost (issue 58): the 2-process data-parallel step of bench/ddp_step.cpp (accel's
data_parallel<gloo>: bucketed all-reduces, each recorded) with the recorder off (ACCEL_FLIGHT_RECORDER_ENTRIES=0)
and on (2,000 entries, the default). Each round runs both, in an order that alternates; the table gives the medians
over rounds and the median of the per-round ratios on/off (target: at most 1.01).

Usage: recorder_overhead.py LAUNCHER BENCH_DDP_STEP [ROUNDS]
"""
import os
import statistics
import sys

from launch_job import run_job

WIDTHS = {64: (800, 50), 256: (300, 30)}  # width: (steps, warm-up steps); the smaller the step, the larger the share
SETTINGS = {"off": "0", "on": "2000"}


def main():
    launcher, bench = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    print(f"flight recorder off and on: 2 Gloo processes, 1 thread each, SGD, batch 32 per process, MLP of 4 hidden "
          f"layers; {rounds} rounds")
    print(f"{'width':>6} | {'off ms':>9} {'on ms':>9} | on/off (median of per-round ratios)")
    for width, (steps, warmup) in WIDTHS.items():
        times = {name: [] for name in SETTINGS}
        for r in range(rounds):
            order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                os.environ["ACCEL_FLIGHT_RECORDER_ENTRIES"] = SETTINGS[name]
                _, _, ms = run_job(launcher, [bench, "accel", str(width), str(steps), str(warmup)])
                times[name].append(float(ms))
        ratio = statistics.median(on / off for on, off in zip(times["on"], times["off"]))
        print(f"{width:>6} | {statistics.median(times['off']):>9.3f} {statistics.median(times['on']):>9.3f} | "
              f"{ratio:.4f}", flush=True)


if __name__ == "__main__":
    main()
