#!/usr/bin/env python3
"""Context-parallel benchmark: bench_cp_step at cp = 1 (one process: LibTorch's own attention operations) and at
cp = 2 and 4 (Gloo processes under `accel launch --parallelism_config_cp_size P`, each with both rotations), one
thread per process:
- one causal attention (2 heads of 32), forward and backward, over 1,024 to 16,384 tokens: tokens per second and
  the peak activation bytes per process (counting allocator), for each cp whose part per process is at most 4,096;
- char_lm's transformer (dim 64, 4 heads, 2 blocks) trained on one sequence of 2,048 and 4,096 tokens;
- the ring's overlap (all-to-all rotation, forward): the exchanges' share hidden behind the computation,
  (compute + exchanges - total) / exchanges.
Every job runs once per round, rounds rotating their order; the table reports medians. PyTorch's context parallelism
runs on CUDA's attention kernels only (a CPU/Gloo run fails before the first forward), so each cp is compared with
cp = 1 on the same length, measured in the same run; the processes share this machine's cores, so the tokens per
second of several processes measure what one core does of the work, and the memory is each process's.

Usage: cp_compare.py LAUNCHER BENCH_CP_STEP [ROUNDS]
"""
import os
import statistics
import subprocess
import sys

from launch_job import run_job

LENGTHS = (1024, 2048, 4096, 8192, 16384)
LARGEST_PART = 4096
MODEL_LENGTHS = (2048, 4096)


def job(launcher, bench, parts, command):
    if parts == 1:
        out = subprocess.run([bench, *command], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
        if out.returncode != 0:
            sys.exit(f"job failed ({out.returncode}): {' '.join(command)}\n{out.stdout}\n{out.stderr}")
        return out.stdout.split("\n")[-2].split()
    return run_job(launcher, [bench, *command],
                   launch_flags=("--nproc_per_node", str(parts), "--parallelism_config_cp_size", str(parts)))


def jobs():
    for length in LENGTHS:
        for parts in (1, 2, 4):
            if length // parts > LARGEST_PART:
                continue
            for rotation in (("allgather",) if parts == 1 else ("allgather", "alltoall")):
                steps = max(2, 32768 // length)
                yield ("attention", parts, length, rotation), [str(length), str(steps), "1", rotation]
    for length in MODEL_LENGTHS:
        for parts in (1, 2, 4):
            for rotation in (("allgather",) if parts == 1 else ("allgather", "alltoall")):
                yield ("model", parts, length, rotation), [str(length), "3", "1", rotation]
    for parts in (2, 4):
        yield ("overlap", parts, 4096, "alltoall"), ["4096", "4", "1", "alltoall"]


def main():
    launcher, bench = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    planned = list(jobs())
    figures = {key: [] for key, _ in planned}
    for r in range(rounds):
        order = planned[r % len(planned):] + planned[:r % len(planned)]
        for key, arguments in order:
            figures[key].append(job(launcher, bench, key[1], [key[0], *arguments]))
    print("\n| what | tokens | cp | rotation | tokens/s (median) | x cp = 1 | peak MiB per process | x cp = 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for what in ("attention", "model"):
        for key in [k for k, _ in planned if k[0] == what]:
            speed = statistics.median(float(f[4]) for f in figures[key])
            peak = statistics.median(int(f[5]) for f in figures[key])
            base = (what, 1, key[2], "allgather")
            base_speed = statistics.median(float(f[4]) for f in figures[base]) if base in figures else None
            base_peak = statistics.median(int(f[5]) for f in figures[base]) if base in figures else None
            ratio_speed = f"{speed / base_speed:.2f}" if base_speed else "-"
            ratio_peak = f"{peak / base_peak:.2f}" if base_peak else "- (cp = 1 too large)"
            print(f"| {what} | {key[2]} | {key[1]} | {key[3]} | {speed:,.0f} | {ratio_speed} | {peak / 2**20:,.1f} |"
                  f" {ratio_peak} |")
    print("\n| ring overlap (all-to-all, forward, 4,096 tokens) | cp | ms total | ms computation | ms exchanges |"
          " exchanges hidden |")
    print("|---|---|---|---|---|---|")
    for key in [k for k, _ in planned if k[0] == "overlap"]:
        columns = [statistics.median(float(f[i]) for f in figures[key]) for i in (4, 5, 6, 7)]
        print(f"| | {key[1]} | {columns[0]:.1f} | {columns[1]:.1f} | {columns[2]:.1f} | {columns[3]:.0%} |")


if __name__ == "__main__":
    main()
