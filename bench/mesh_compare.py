#!/usr/bin/env python3
"""Mesh benchmark, side by side in one run: 4 Gloo processes on this machine on the 2 x 2 mesh (dp_replicate 2 x
dp_shard 2, started by `accel launch --parallelism_config_dp_replicate_size 2 --parallelism_config_dp_shard_size 2`),
MLP widths 256 and 1024, AdamW. accel's hybrid_sharded (the shard group's parameters gathered whole once per step, and
a shard unit per Linear resharded after forward) against PyTorch's FSDP2 on the same 2-D mesh (HSDP: `fully_shard`
on the root only without resharding after forward, and on each Linear and the root). Each round runs every job once,
fresh, in an order that rotates. The table reports medians over rounds of ms per step, the optimizer-state bytes per
process, the bytes process 0 sends per step on each mesh dimension (a ring's share of what one step handed to the
collectives of that dimension's group), and the median of per-round ratios against each job's PyTorch peer.

Usage: mesh_compare.py LAUNCHER BENCH_MESH_STEP PYTHON_WITH_TORCH [ROUNDS]
"""
import os
import statistics
import sys

from launch_job import run_job

WIDTHS = {256: (200, 20), 1024: (40, 5)}  # width: (steps, warm-up steps)
PEERS = {"hybrid_sharded": "pytorch_hsdp_whole", "hybrid_sharded_units": "pytorch_hsdp"}  # accel job: its peer
MESH = ("--nproc_per_node", "4", "--parallelism_config_dp_replicate_size", "2",
        "--parallelism_config_dp_shard_size", "2")


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mesh_step.py")
    names = [job for pair in PEERS.items() for job in pair]
    print(f"4 Gloo processes on the 2 x 2 mesh (dp_replicate x dp_shard), 1 thread each, AdamW, batch 32 per "
          f"process, MLP of 4 hidden layers; {rounds} rounds")
    for width, (steps, warmup) in WIDTHS.items():
        times, figures, unsupported = {n: [] for n in names}, {}, {}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in unsupported:
                    continue
                command = ([bench, name] if name in PEERS else [python, script, name]) + \
                    [str(width), str(steps), str(warmup)]
                fields = run_job(launcher, command, launch_flags=MESH)
                if fields[2] == "unsupported":
                    unsupported[name] = " ".join(fields[3:])
                    continue
                times[name].append(float(fields[2]))
                figures[name] = [int(float(f)) for f in fields[3:6]]
        params = 4 * (width * width + width) + width + 1
        print(f"\nwidth {width} ({params} parameters, {4 * params} bytes)")
        print(f"{'':>21} {'ms/step':>9} {'state B/proc':>13} {'dp_shard B/step':>16} {'dp_replicate B/step':>20} "
              f"{'/peer':>7}")
        for name in names:
            if name in unsupported:
                print(f"{name:>21} unsupported here: {unsupported[name]}")
                continue
            peer = PEERS.get(name)
            ratio = "-"
            if peer and times[peer]:
                ratio = f"{statistics.median(a / b for a, b in zip(times[name], times[peer])):.3f}"
            state, shard, replica = figures[name]
            print(f"{name:>21} {statistics.median(times[name]):>9.3f} {state:>13} {shard:>16} {replica:>20} "
                  f"{ratio:>7}")


if __name__ == "__main__":
    main()
