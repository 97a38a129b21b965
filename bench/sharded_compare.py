#!/usr/bin/env python3
"""Sharded-training benchmark, side by side in one run: 2 Gloo processes on this machine, MLP widths 256 and 1024,
AdamW. accel's data_parallel, zero1, zero2 and fully_sharded (the whole model gathered at once, and a shard unit per
Linear resharded after forward) against PyTorch's DDP, DDP + ZeroRedundancyOptimizer and FSDP2 (`fully_shard` per
layer, the peer of the units, and on the whole model only, without resharding after forward, the peer of the whole
model gathered at once), where this PyTorch runs them on the CPU. Every job is a fresh 2-process run started by
`accel launch`; each round runs them in an order that rotates. The table reports medians over rounds of ms per step,
the optimizer-state bytes per process (read from the optimizer's state tensors), the bytes each of accel's processes
sends per step (a ring's share of what one step handed to collectives, counted), and the median of per-round ratios.

Usage: sharded_compare.py LAUNCHER BENCH_SHARDED_STEP PYTHON_WITH_TORCH [ROUNDS]
"""
import os
import statistics
import sys

from launch_job import run_job

WIDTHS = {256: (200, 20), 1024: (40, 5)}  # width: (steps, warm-up steps)
ACCEL = ["data_parallel", "zero1", "zero2", "fully_sharded", "fully_sharded_units"]
PYTORCH = ["pytorch_ddp", "pytorch_zero", "pytorch_fsdp2", "pytorch_fsdp2_whole"]


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_step.py")
    names = ACCEL + PYTORCH
    print(f"2 Gloo processes, 1 thread each, AdamW, batch 32 per process, MLP of 4 hidden layers; {rounds} rounds")
    for width, (steps, warmup) in WIDTHS.items():
        times, state, payload, unsupported = {n: [] for n in names}, {}, {}, {}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in unsupported:
                    continue
                command = ([bench, name] if name in ACCEL else [python, script, name]) + \
                    [str(width), str(steps), str(warmup)]
                fields = run_job(launcher, command)
                if fields[2] == "unsupported":
                    unsupported[name] = " ".join(fields[3:])
                    continue
                times[name].append(float(fields[2]))
                state[name] = int(fields[3])
                if len(fields) > 4:
                    payload[name] = int(float(fields[4]))
        params = 4 * (width * width + width) + width + 1
        print(f"\nwidth {width} ({params} parameters, {4 * params} bytes)")
        print(f"{'':>19} {'ms/step':>9} {'state B/proc':>13} {'sent B/step':>15} {'/data_parallel':>15} "
              f"{'/pytorch_zero':>14} {'/pytorch_fsdp2':>15}")
        for name in names:
            if name in unsupported:
                print(f"{name:>19} unsupported here: {unsupported[name]}")
                continue
            ratios = []
            for base in ["data_parallel", "pytorch_zero", "pytorch_fsdp2"]:
                if base in unsupported or not times[base]:
                    ratios.append("-")
                else:
                    ratios.append(f"{statistics.median(a / b for a, b in zip(times[name], times[base])):.3f}")
            print(f"{name:>19} {statistics.median(times[name]):>9.3f} {state[name]:>13} "
                  f"{payload.get(name, '-'):>15} {ratios[0]:>15} {ratios[1]:>14} {ratios[2]:>15}", flush=True)


if __name__ == "__main__":
    main()
