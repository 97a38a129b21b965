#!/usr/bin/env python3
"""accel on one device (CUDA on a GPU machine; scripts/gpu.sh runs it there) side by side with the hand-written
LibTorch loop (step overhead) and with Hugging Face Accelerate and plain PyTorch (bench/gpu_step.py), for the tiny MLP
(fp32) and the small character transformer (fp32 and bf16), batch 32, AdamW. accel and the LibTorch loop step
LibTorch's torch::optim::AdamW (one set of kernels per parameter); "accel multi-tensor" steps
accel::multi_tensor_adamw (the same update in multi-tensor kernels), which is what Python's AdamW does by default on
CUDA, so it is the job compared with Accelerate and plain PyTorch. Every job is a fresh process that
reports the median of its rounds; each outer round runs the four jobs of a case in an order that rotates; the table
gives medians over outer rounds, ratios the median of per-round ratios.

Usage: gpu_compare.py BENCH_GPU_STEP PYTHON DEVICE [--quick]
--quick: few steps of batch 4, for scripts/gpu.sh --dry-run on the CPU (checks the plumbing, not the speed).
Prints each case's rows of the table between `TABLE` and `END TABLE` as soon as it is measured, then its
`RESULT NAME VALUE MET DETAIL` lines, one per figure with a target (MET: yes or no).
"""
import os
import statistics
import subprocess
import sys

BATCH = 32
# (model, precision, steps, warm-up steps, rounds inside a job); --quick: steps and warm-up divided.
CASES = [("mlp", "fp32", 500, 50, 3), ("transformer", "fp32", 60, 10, 3), ("transformer", "bf16", 60, 10, 3)]
JOBS = ["accel", "raw LibTorch", "accel multi-tensor", "Accelerate", "raw PyTorch"]
CPP_JOBS = {"accel": ("accel", "adamw"), "raw LibTorch": ("raw", "adamw"),
            "accel multi-tensor": ("accel", "multi_tensor_adamw")}


def command(job, bench, python, model, device, precision, batch, steps, warmup, rounds):
    sizes = [str(batch), str(steps), str(warmup), str(rounds)]
    if job in CPP_JOBS:
        loop, optimizer = CPP_JOBS[job]
        return [bench, model, loop, device, precision, optimizer, *sizes]
    loop = "accelerate" if job == "Accelerate" else "raw"
    return [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_step.py"), model, loop, device,
            precision, *sizes]


def overhead_command(bench, model, device, precision, batch, steps, warmup, rounds):
    """accel's time over the hand-written loop's, both in one process, round by round (bench_gpu_step overhead):
    steadier than the ratio of two processes' times, which the machine's state between processes sways."""
    return [bench, model, "overhead", device, precision, "adamw", str(batch), str(steps), str(warmup), str(2 * rounds)]


def run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"job failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    fields = out.stdout.strip().splitlines()[-1].split()
    if fields[0] == "overhead":
        return float(fields[5]), None  # accel / raw LibTorch
    return float(fields[5]), float(fields[6])  # ms per step, tokens per second


def measure(bench, python, device, case, outer_rounds, quick):
    model, precision, steps, warmup, rounds = case
    batch = BATCH
    if quick:
        batch, steps, warmup, rounds = 4, max(steps // 25, 2), max(warmup // 10, 1), 2
    ms = {job: [] for job in JOBS}
    tokens = {job: [] for job in JOBS}
    overheads = []
    for r in range(outer_rounds):
        for job in JOBS[r % len(JOBS):] + JOBS[:r % len(JOBS)]:
            m, t = run(command(job, bench, python, model, device, precision, batch, steps, warmup, rounds))
            ms[job].append(m)
            tokens[job].append(t)
        overheads.append(run(overhead_command(bench, model, device, precision, batch, steps, warmup, rounds))[0])
    return ms, tokens, overheads


def ratio(ms, job, baseline):
    return statistics.median(a / b for a, b in zip(ms[job], ms[baseline]))


def main():
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] != "--quick"):
        sys.exit(__doc__)
    bench, python, device = sys.argv[1:4]
    quick = len(sys.argv) == 5
    outer_rounds = 1 if quick else 2
    print(f"batch {4 if quick else BATCH}, AdamW, one thread per process, {outer_rounds} outer rounds, device {device}")
    # ACCEL_BENCH_CASES=transformer or transformer_bf16 (say): only those models or cases, for a rerun with little time.
    wanted = os.environ.get("ACCEL_BENCH_CASES", "").split(",")
    cases = [case for case in CASES if wanted == [""] or case[0] in wanted or f"{case[0]}_{case[1]}" in wanted]
    for case in cases:
        ms, tokens, overheads = measure(bench, python, device, case, outer_rounds, quick)
        name = f"{case[0]} {case[1]}"
        print("TABLE")  # each case's rows, then its RESULT lines, as soon as measured: a run stopped early keeps them
        if case is cases[0]:
            print(f"{'case':<18} {'job':<18} {'ms/step':>9} {'tokens/s':>12} {'/ accel':>8}")
        for job in JOBS:
            print(f"{name:<18} {job:<18} {statistics.median(ms[job]):>9.3f} {statistics.median(tokens[job]):>12.0f} "
                  f"{ratio(ms, job, 'accel'):>8.3f}")
        print("END TABLE")
        key = f"{case[0]}_{case[1]}"
        overhead = statistics.median(overheads)
        speedup = ratio(ms, "Accelerate", "accel multi-tensor")
        speedup_target = 1.5 if case[0] == "mlp" else 1.0
        fastest = "accel multi-tensor"
        print(f"RESULT step_overhead.{key} {overhead:.3f} {'yes' if overhead <= 1.02 else 'no'} accel / raw LibTorch "
              f"time on {device}, both with LibTorch's AdamW, in one process round by round (target <= 1.02); "
              f"between processes {ratio(ms, 'accel', 'raw LibTorch'):.3f}")
        print(f"RESULT vs_accelerate.{key} {speedup:.3f} {'yes' if speedup >= speedup_target else 'no'} Accelerate / "
              f"accel multi-tensor time on {device} (target >= {speedup_target}); accel multi-tensor "
              f"{statistics.median(ms[fastest]):.3f} ms/step, {statistics.median(tokens[fastest]):.0f} tokens/s; "
              f"Accelerate {statistics.median(ms['Accelerate']):.3f} ms/step")
        print(f"RESULT vs_accelerate_libtorch_adamw.{key} {ratio(ms, 'Accelerate', 'accel'):.3f} - Accelerate / accel "
              f"time with LibTorch's per-parameter AdamW on {device}; accel {statistics.median(ms['accel']):.3f} ms/step")
        print(f"RESULT multi_tensor_gain.{key} {ratio(ms, 'accel', 'accel multi-tensor'):.3f} - accel time with "
              f"LibTorch's AdamW / with accel::multi_tensor_adamw on {device}", flush=True)


if __name__ == "__main__":
    main()
