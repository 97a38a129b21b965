#!/usr/bin/env python3
"""Asynchronous checkpoints survive a process killed at any moment of a save: the newest complete one resumes bit for bit.

usage: async_kill_and_resume.py ACCEL RESTART_TRAINING WORK_DIR [KILLS]

Runs restart_training (tests/programs/restart_training.cpp) with `async`: 200 steps on 2 Gloo processes, a checkpoint
every 20 written in the background while training goes on, resuming from the newest under `accel launch
--max_restarts`. Once without interruption, then KILLS times (20 by default), each in a fresh project directory,
SIGKILLing process 1 once at a random moment of a random save: as it takes the snapshot (when it prints the save's
step), while the checkpoint is being written (once its staging directory checkpoint_N.partial exists, after a random
0-4 ms more), or a step or two later (the writing done, or being renamed). Each killed job must be restarted once,
both processes resuming from the same checkpoint, one that was complete at the kill (the save in flight, or one
before it), never one half written; leave no staging directory behind; and write the uninterrupted job's final
parameters byte for byte. ACCEL_TEST_SEED=N repeats a draw. Python standard library only.
"""
import os
import random
import re
import shutil
import signal
import sys
import time

from checks import CheckFailed, check
from restart_after_kill import SAVE_EVERY, TOTAL_STEPS, Job, differences, run_and_kill

MOMENTS = ("snapshot", "writing", "after")


def kill_job(accel, program, directory, save_step, moment, delay):
    """Runs the async job and SIGKILLs process 1 of its first attempt at `moment` of the save of `save_step`."""
    job = Job(accel, program, directory, extra=("async",))
    killed = {}
    partial = os.path.join(job.project, "checkpoints", f"checkpoint_{save_step // SAVE_EVERY - 1}.partial")
    target = save_step + (0 if moment != "after" else 1 + int(delay) % 2)

    def kill(pid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid
        except ProcessLookupError:
            pass

    def watch():  # polls every 0.2 ms for the staging directory of the save
        while job.process.poll() is None and not os.path.isdir(partial):
            time.sleep(0.0002)
        time.sleep(delay / 1000)
        if job.process.poll() is None and (0, 1) in job.pids:
            kill(job.pids[(0, 1)])

    run_and_kill(job, kill, step=target, watch=watch if moment == "writing" else None)
    check("pid" in killed, f"process 1 was never killed (did the job reach step {target}?)")
    return job


def check_resumed(case, job, reference):
    job.check_ended(case)
    restarts = [line for line in job.stderr.splitlines() if "restarting the job" in line]
    check(len(restarts) == 1, f"{case}: expected one restart, got {restarts}")
    last = job.steps.get((0, 1), [0])[-1]
    for rank in (0, 1):
        check((1, rank) in job.resumed, f"{case}: rank {rank} did not say where the restarted job started from")
    path, step = job.resumed[(1, 1)]
    check(job.resumed[(1, 0)] == job.resumed[(1, 1)], f"{case}: the two processes resumed from different places")
    # Complete at the kill: the save of the step process 1 last passed (its write may have ended), or the one
    # before it; never one past the last step.
    newest = last // SAVE_EVERY * SAVE_EVERY
    check(step in (newest, max(newest - SAVE_EVERY, 0)),
          f"{case}: resumed at step {step}, but process 1 died after step {last}: expected {newest} or the save before")
    if step:
        check(path is not None and os.path.basename(path) == f"checkpoint_{step // SAVE_EVERY - 1}",
              f"{case}: resumed at step {step} from {path}")
    job.check_steps(case, 1, step + 1)
    left = [n for n in os.listdir(os.path.join(job.project, "checkpoints")) if n.endswith(".partial")]
    check(not left, f"{case}: the staging directories {left} were left behind")
    with open(job.out, "rb") as f, open(reference, "rb") as g:
        check(f.read() == g.read(), f"{case}: the final parameters differ from the uninterrupted job's:\n"
                                    f"{differences(job.out, reference)}")
    return f"resumed from {os.path.basename(path)} at step {step}" if path else "started over"


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    accel, program, work = sys.argv[1:4]
    kills = int(sys.argv[4]) if len(sys.argv) == 5 else 20
    seed = int(os.environ.get("ACCEL_TEST_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    draws = [(SAVE_EVERY * rng.randint(1, TOTAL_STEPS // SAVE_EVERY - 2), MOMENTS[i % 3], rng.uniform(0, 4))
             for i in range(kills)]
    print(f"seed {seed} (ACCEL_TEST_SEED={seed} repeats this draw)", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    try:
        case = "uninterrupted job"
        job = Job(accel, program, os.path.join(work, "uninterrupted"), extra=("async",))
        job.finish()
        job.check_ended(case)
        job.check_steps(case, 0, 1)
        saved = sorted(os.listdir(os.path.join(job.project, "checkpoints")))
        check(saved == ["checkpoint_7", "checkpoint_8"], f"{case}: expected the last 2 of 9 checkpoints, got {saved}")
        reference = job.out
        print(f"{case}: {job.seconds:.1f} s", flush=True)
        for i, (save_step, moment, delay) in enumerate(draws):
            case = f"kill {i + 1}: {moment} of the save at step {save_step}" + \
                   (f" (+{delay:.1f} ms)" if moment == "writing" else "")
            job = kill_job(accel, program, os.path.join(work, re.sub(r"\W+", "_", case)), save_step, moment, delay)
            where = check_resumed(case, job, reference)
            print(f"{case}: process 1 died after step {job.steps[(0, 1)][-1]}; the job {where}, "
                  f"{job.seconds:.1f} s", flush=True)
    except CheckFailed as e:
        print(f"FAILED (seed {seed}): {e}\nlogs: {work}", flush=True)
        sys.exit(1)
    print(f"all {kills} killed jobs resumed from a complete checkpoint and ended as the uninterrupted one "
          f"(seed {seed})")


if __name__ == "__main__":
    main()
