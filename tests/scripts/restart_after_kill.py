#!/usr/bin/env python3
"""A training job killed and restarted by `accel launch --max_restarts` ends as if it had never been interrupted.

usage: restart_after_kill.py ACCEL RESTART_TRAINING WORK_DIR

Runs restart_training (tests/programs/restart_training.cpp: 200 steps on 2 Gloo processes, a checkpoint every 20,
resuming from the newest) once without interruption, then 5 times, each in a fresh project directory, SIGKILLing
process 1 once: after 4 random steps, and during a random checkpoint save (once process 1 has printed the save's
step while the staging directory checkpoint_N.partial exists, polled every ms; a save lasts 15-25 ms). Each killed
job must be restarted once by the launcher, resume from the newest checkpoint complete at the kill (or start over
before the first), leave no staging directory behind and write the uninterrupted job's final parameters byte for
byte. ACCEL_TEST_SEED=N repeats a draw (the seed is printed). Python standard library only.
"""
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

from checks import CheckFailed, check, job_environment

TOTAL_STEPS, SAVE_EVERY = 200, 20  # as restart_training trains
JOB_TIMEOUT = 120  # seconds: a hang fails, a loaded machine does not (a job takes about 2 s alone)
STEP_LINE = re.compile(r"restart_training: rank (\d) pid (\d+) attempt (\d+) step (\d+)$")
RESUME_LINE = re.compile(r"restart_training: rank (\d) attempt (\d+) (?:resumed from (\S+) at step (\d+)|found no)")


class Job:
    """One run of `accel launch ... restart_training PROJECT OUT`, its output parsed as it comes."""

    def __init__(self, accel, program, directory, extra=()):
        self.project, self.out = os.path.join(directory, "project"), os.path.join(directory, "final.safetensors")
        self.stdout_path = os.path.join(directory, "stdout.txt")
        self.stderr_path = os.path.join(directory, "stderr.txt")
        self.steps = {}  # (attempt, rank) -> steps printed, in order
        self.pids = {}  # (attempt, rank) -> pid
        self.resumed = {}  # (attempt, rank) -> (checkpoint path or None, step)
        self.timed_out = False
        env = job_environment()
        os.makedirs(directory)
        self.command = [accel, "launch", "--nproc_per_node", "2", "--master_port", "0", "--max_restarts", "3",
                        "--restart_delay", "0", program, self.project, self.out, *extra]
        self.started = time.monotonic()
        self.stderr_file = open(self.stderr_path, "w")
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self.stderr_file, text=True,
                                        env=env)
        self.timer = threading.Timer(JOB_TIMEOUT, self.stop)
        self.timer.start()

    def stop(self):
        """Past the time limit: SIGTERM to the launcher (which passes it to the workers), then SIGKILL."""
        self.timed_out = True
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def lines(self):
        """Yields each line of stdout as it comes (after recording it) and waits for the launcher to end."""
        with open(self.stdout_path, "w") as log:
            for line in self.process.stdout:
                log.write(line)
                line = line.rstrip("\n")
                if m := STEP_LINE.search(line):
                    rank, pid, attempt, step = map(int, m.groups())
                    self.pids[(attempt, rank)] = pid
                    self.steps.setdefault((attempt, rank), []).append(step)
                elif m := RESUME_LINE.search(line):
                    step = int(m.group(4)) if m.group(3) else 0
                    self.resumed[(int(m.group(2)), int(m.group(1)))] = (m.group(3), step)
                yield line
        self.code = self.process.wait()
        self.timer.cancel()
        self.stderr_file.close()
        self.seconds = time.monotonic() - self.started
        with open(self.stderr_path) as f:
            self.stderr = f.read()

    def finish(self):
        for _ in self.lines():
            pass

    def check_ended(self, case):
        check(not self.timed_out, f"{case}: the job did not end within {JOB_TIMEOUT} s (a hang); stopped")
        check(self.code == 0, f"{case}: the launcher exited with code {self.code}, expected 0")
        check(os.path.isfile(self.out), f"{case}: the job wrote no {self.out}")

    def check_steps(self, case, attempt, first):
        for rank in (0, 1):
            got = self.steps.get((attempt, rank), [])
            check(got == list(range(first, TOTAL_STEPS + 1)),
                  f"{case}: rank {rank} on attempt {attempt} printed steps {summary(got)}, expected {first}..."
                  f"{TOTAL_STEPS} in order")


def summary(steps):
    return f"{steps[:3]}...{steps[-3:]} ({len(steps)} lines)" if len(steps) > 6 else str(steps)


def tensors(path):
    """A safetensors file's tensors by name: (dtype, shape, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    body = data[8 + length:]
    return {name: (t["dtype"], t["shape"], body[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items()}


def differences(path, reference):
    """Which tensors differ between two safetensors files, for the failure message."""
    got, expected = tensors(path), tensors(reference)
    lines = []
    for name in sorted(set(got) | set(expected)):
        if got.get(name) == expected.get(name):
            continue
        if name not in got or name not in expected or got[name][:2] != expected[name][:2]:
            lines.append(f"  {name}: missing from one file, or of another dtype or shape")
            continue
        a, b = (struct.unpack(f"<{len(t[2]) // 4}f", t[2]) for t in (got[name], expected[name]))  # F32
        diff = [abs(x - y) for x, y in zip(a, b) if x != y]
        lines.append(f"  {name}: {len(diff)} of {len(a)} elements differ, by up to {max(diff):.3g}")
    return "\n".join(lines)


def run_and_kill(job, kill, step=None, watch=None):
    """Runs `job` to its end, `kill(pid)` called on process 1 of its first attempt: by `watch`, run in a thread of its
    own, when given; else once process 1 has printed `step`."""
    if watch is not None:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        job.finish()
        watcher.join()
        return
    for line in job.lines():
        if (m := STEP_LINE.search(line)) and m.group(1) == "1" and m.group(3) == "0" and int(m.group(4)) == step:
            kill(int(m.group(2)))


def killed_job(accel, program, directory, case, step, during_save):
    """Runs the job and SIGKILLs process 1 of its first attempt once: when it has printed `step`, or, with
    `during_save`, once it is in the save of that step. Returns (job, pid killed, whether the save's staging
    directory was still there right after the kill)."""
    job = Job(accel, program, directory)
    killed = {}

    def kill(pid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid
        except ProcessLookupError:  # then the job ends without a restart, which the checks report
            print(f"{case}: process 1 (pid {pid}) had exited before the kill", flush=True)

    if during_save is not None:
        partial = os.path.join(job.project, "checkpoints", f"checkpoint_{during_save // SAVE_EVERY - 1}.partial")

        def in_save():
            # Process 0 makes the staging directory once it has stepped; process 1 may still be stepping until it
            # prints the step, after which it saves too (and the directory stays until both have written their part).
            return job.steps.get((0, 1), [0])[-1] >= during_save and os.path.isdir(partial)

        def watch():  # polls every ms: a save (~4 MB) lasts 15-25 ms here
            while job.process.poll() is None and not in_save():
                time.sleep(0.001)
            if job.process.poll() is None:
                kill(job.pids[(0, 1)])
                killed["partial_after_kill"] = os.path.isdir(partial)

        run_and_kill(job, kill, watch=watch)
    else:
        run_and_kill(job, kill, step=step)
    check("pid" in killed, f"{case}: process 1 was never killed (did the job reach that step?)")
    return job, killed["pid"], killed.get("partial_after_kill")


def check_killed_job(case, job, pid, target, reference):
    job.check_ended(case)
    # The launcher's line, even where a dying worker's unfinished line ("terminate called after ...") precedes it
    # on the stderr they share.
    restarts = [line[line.find("accel launch: "):] for line in job.stderr.splitlines() if "restarting the job" in line]
    # The cause the launcher names is the first exit it sees: process 1's SIGKILL, or, when process 0 fails on the
    # broken connection and the kernel reports that exit first (both within milliseconds), process 0's.
    killed = (f"accel launch: worker rank 1 (pid {pid}) was killed by signal {int(signal.SIGKILL)} "
              f"({signal.strsignal(signal.SIGKILL)}); restarting the job (restart 1 of 3)")
    peer = re.compile(rf"accel launch: worker rank 0 \(pid {job.pids.get((0, 0))}\) (was killed by signal|exited with "
                      rf"code) .*; restarting the job \(restart 1 of 3\)")
    check(len(restarts) == 1 and (restarts[0] == killed or peer.fullmatch(restarts[0])),
          f"{case}: expected one restart line, {killed!r} or process 0's failure, on stderr; got {restarts}")
    # The last step process 1 printed before it died; the checkpoints of the steps before it are complete, and the
    # save at that step itself may be complete (process 0 puts it in place) when it is a save's step.
    last = job.steps.get((0, 1), [0])[-1]
    check(last >= target, f"{case}: process 1's last step before the kill is {last}, before the step it was killed at")
    newest = [last // SAVE_EVERY * SAVE_EVERY, max(last - 1, 0) // SAVE_EVERY * SAVE_EVERY]
    for rank in (0, 1):
        check((1, rank) in job.resumed, f"{case}: rank {rank} did not say where the restarted job started from")
        path, step = job.resumed[(1, rank)]
        check(step in newest, f"{case}: rank {rank} resumed at step {step}; process 1 was killed after step {last}, "
                              f"so the newest complete checkpoint is that of step {' or '.join(map(str, set(newest)))}")
        if step == 0:
            check(path is None, f"{case}: rank {rank} resumed from {path} at step 0")
        else:
            name = f"checkpoint_{step // SAVE_EVERY - 1}"
            check(path is not None and os.path.basename(path) == name,
                  f"{case}: rank {rank} resumed at step {step} from {path}, expected .../{name}")
    check(job.resumed[(1, 0)] == job.resumed[(1, 1)], f"{case}: the two processes resumed from different places")
    job.check_steps(case, 1, job.resumed[(1, 0)][1] + 1)
    # A save cut short leaves its staging directory; the restarted job's save of that checkpoint takes it over.
    left = [n for n in os.listdir(os.path.join(job.project, "checkpoints")) if n.endswith(".partial")]
    check(not left, f"{case}: the staging directories {left} were left behind")
    with open(job.out, "rb") as f, open(reference, "rb") as g:
        same = f.read() == g.read()
    check(same, f"{case}: the final parameters differ from the uninterrupted job's:\n{differences(job.out, reference)}")
    resumed = job.resumed[(1, 1)]
    return f"resumed from {os.path.basename(resumed[0])} at step {resumed[1]}" if resumed[0] else "started over"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    accel, program, work = sys.argv[1:]
    seed = int(os.environ.get("ACCEL_TEST_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    save_step = SAVE_EVERY * rng.randint(1, TOTAL_STEPS // SAVE_EVERY - 1)  # the last step saves no checkpoint
    steps = sorted(rng.sample([s for s in range(1, TOTAL_STEPS) if s != save_step], 4))
    print(f"seed {seed} (ACCEL_TEST_SEED={seed} repeats this draw): process 1 killed after steps {steps} and during "
          f"the save at step {save_step}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    case = "uninterrupted job"
    try:
        job = Job(accel, program, os.path.join(work, "uninterrupted"))
        job.finish()
        job.check_ended(case)
        job.check_steps(case, 0, 1)
        check(job.resumed.get((0, 0)) == job.resumed.get((0, 1)) == (None, 0), f"{case}: it resumed from a checkpoint")
        reference = job.out
        print(f"{case}: {job.seconds:.1f} s", flush=True)
        for target, during_save in [(s, None) for s in steps] + [(save_step, save_step)]:
            case = f"kill during the save at step {target}" if during_save else f"kill at step {target}"
            directory = os.path.join(work, case.replace(" ", "_"))
            job, pid, partial = killed_job(accel, program, directory, case, target, during_save)
            if during_save:
                check(partial, f"{case}: checkpoint_{target // SAVE_EVERY - 1}.partial was gone right after the kill: "
                               f"the save was over before process 1 died")
            where = check_killed_job(case, job, pid, target, reference)
            print(f"{case}: process 1 (pid {pid}) died after step {job.steps[(0, 1)][-1]}; the job {where} and ended "
                  f"as the uninterrupted one, {job.seconds:.1f} s", flush=True)
    except CheckFailed as e:
        print(f"FAILED (seed {seed}): {e}\nlogs: {work}", flush=True)
        sys.exit(1)
    print(f"all 5 killed jobs ended as the uninterrupted one (seed {seed})")


if __name__ == "__main__":
    main()
