#!/usr/bin/env python3
"""Mesh benchmark, side by side in one run, MLP widths 256 and 1024, AdamW, Gloo processes on this machine started by
`accel launch` with the mesh's sizes (`--parallelism_config_*`):
- HSDP, 4 processes on dp_replicate 2 x dp_shard 2: accel's hybrid_sharded (the shard group's parameters gathered
  whole once per step, and a shard unit per Linear resharded after forward) against PyTorch's FSDP2 on the same 2-D
  mesh (`fully_shard` on the root only without resharding after forward, and on each Linear and the root);
- tensor parallelism, 2 processes on tp 2: accel's tensor_parallel (the hidden Linear layers in column/row-parallel
  pairs) against PyTorch's DTensor `parallelize_module` with the same plan; 4 processes on dp_shard 2 x tp 2: accel's
  fully_sharded_tensor_parallel (the tp slices sharded over dp_shard) against the same with FSDP2 over dp, PyTorch's
  2-D recipe (both gather each tp slice whole once per step).
Each round runs every job once, fresh, in an order that rotates. The table reports medians over rounds of ms per step,
the optimizer-state bytes per process, the bytes process 0 sends per step on each mesh dimension (a ring's share of
what one step handed to the collectives of that dimension's group), and the median of per-round ratios against each
job's PyTorch peer.

Usage: mesh_compare.py LAUNCHER BENCH_MESH_STEP PYTHON_WITH_TORCH [ROUNDS] [hsdp|tp]
"""
import os
import statistics
import sys

from launch_job import run_job

WIDTHS = {256: (200, 20), 1024: (40, 5)}  # width: (steps, warm-up steps)
HSDP = ("--nproc_per_node", "4", "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size",
        "2")
TP = ("--nproc_per_node", "2", "--parallelism_config_tp_size", "2")
TP_2D = ("--nproc_per_node", "4", "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2")
# (name, launch flags, {accel job: its PyTorch peer}, the two dimensions reported)
SETUPS = [("HSDP 2 x 2", HSDP, {"hybrid_sharded": "pytorch_hsdp_whole", "hybrid_sharded_units": "pytorch_hsdp"},
           ("dp_shard", "dp_replicate")),
          ("tp 2", TP, {"tensor_parallel": "pytorch_tp"}, ("tp", "dp")),
          ("dp_shard 2 x tp 2", TP_2D, {"fully_sharded_tensor_parallel": "pytorch_tp"}, ("tp", "dp"))]


def run_setup(launcher, bench, python, script, rounds, setup):
    label, flags, peers, (first, second) = setup
    names = [job for pair in peers.items() for job in pair]
    for width, (steps, warmup) in WIDTHS.items():
        times, figures, unsupported = {n: [] for n in names}, {}, {}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in unsupported:
                    continue
                command = ([bench, name] if name in peers else [python, script, name]) + \
                    [str(width), str(steps), str(warmup)]
                fields = run_job(launcher, command, launch_flags=flags)
                if fields[2] == "unsupported":
                    unsupported[name] = " ".join(fields[3:])
                    continue
                times[name].append(float(fields[2]))
                figures[name] = [int(float(f)) for f in fields[3:6]]
        params = 4 * (width * width + width) + width + 1
        print(f"\n{label}, width {width} ({params} parameters, {4 * params} bytes)")
        print(f"{'':>29} {'ms/step':>9} {'state B/proc':>13} {first + ' B/step':>16} {second + ' B/step':>20} "
              f"{'/peer':>7}")
        for name in names:
            if name in unsupported:
                print(f"{name:>29} unsupported here: {unsupported[name]}")
                continue
            peer = peers.get(name)
            ratio = "-"
            if peer and times[peer]:
                ratio = f"{statistics.median(a / b for a, b in zip(times[name], times[peer])):.3f}"
            state, one, two = figures[name]
            print(f"{name:>29} {statistics.median(times[name]):>9.3f} {state:>13} {one:>16} {two:>20} {ratio:>7}")


def main():
    launcher, bench, python = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    only = sys.argv[5] if len(sys.argv) > 5 else None  # "hsdp" or "tp"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mesh_step.py")
    print(f"1 thread per process, AdamW, batch 32 per process, MLP of 4 hidden layers; {rounds} rounds")
    for setup in SETUPS:
        if only is None or (only == "tp") == setup[0].endswith("tp 2"):
            run_setup(launcher, bench, python, script, rounds, setup)


if __name__ == "__main__":
    main()
