"""hang.*: the flight recorder and the hang watch in a real job (tests/hang/hang_program.cpp).

    check_hang.py LAUNCHER PROGRAM SCENARIO NPROC WORK_DIR PYTHON
    check_hang.py LAUNCHER pytorch_dumps WORK_DIR

SCENARIO `sleeping`: process 1 sleeps before an all-reduce the others enter. With ACCEL_HANG_TIMEOUT=3, the job must
end within the hang timeout + 5 s of the last process reaching that point; the launcher's output names process 1
and the collective; every process's dump exists; `accel fr-trace` names process 1 as missing, and so does PyTorch's
torchfrtrace (`PYTHON -m torch.distributed.flight_recorder.fr_trace`).
SCENARIO `desync`: process 1 all-gathers where the others all-reduce: both analysers name the mismatch.
`pytorch_dumps`: accel fr-trace reads dumps written as PyTorch writes them (pickle protocol 4) and names a missing
rank and a desynchronised collective.
"""
import os
import re
import shutil
import subprocess
import sys
import time

HANG_TIMEOUT = 3


def fail(message, output=""):
    print(f"FAILED: {message}\n{output}")
    sys.exit(1)


def run_job(launcher, program, scenario, nproc, dumps):
    env = dict(os.environ, ACCEL_HANG_TIMEOUT=str(HANG_TIMEOUT), ACCEL_FLIGHT_RECORDER_DIR=dumps)
    job = subprocess.run([launcher, "launch", "--nproc_per_node", str(nproc), "--master_port", "0", program, scenario],
                         env=env, capture_output=True, text=True, timeout=90)
    ended = time.time()
    output = job.stdout + job.stderr
    print(f"accel launch exited with {job.returncode}\n{output}")
    if job.returncode == 0:
        fail("the job ended with 0, not with the hang watch's failure", output)
    reached = [float(t) for t in re.findall(r"reaches the scenario's collective at ([0-9.]+) s", output)]
    if len(reached) != nproc:
        fail(f"{len(reached)} of {nproc} processes said when they reached the collective", output)
    seconds = ended - max(reached)
    print(f"the job ended {seconds:.1f} s after the last process reached the collective")
    if seconds > HANG_TIMEOUT + 5:
        fail(f"the job took {seconds:.1f} s to end (limit: hang timeout {HANG_TIMEOUT} s + 5 s)", output)
    for rank in range(nproc):
        if not os.path.isfile(os.path.join(dumps, f"accel_trace_rank_{rank}")):
            fail(f"process {rank} wrote no flight record in {dumps}: {sorted(os.listdir(dumps))}", output)
    return output


def analyse(launcher, python, dumps):
    ours = subprocess.run([launcher, "fr-trace", dumps], capture_output=True, text=True, timeout=60)
    print(f"accel fr-trace exited with {ours.returncode}\n{ours.stdout}{ours.stderr}")
    if ours.returncode != 1:
        fail(f"accel fr-trace exited with {ours.returncode}, not 1 (a problem found)", ours.stdout + ours.stderr)
    theirs = subprocess.run([python, "-m", "torch.distributed.flight_recorder.fr_trace", dumps],
                            capture_output=True, text=True, timeout=120)
    print(f"torchfrtrace exited with {theirs.returncode}\n{theirs.stdout}{theirs.stderr}")
    if theirs.returncode != 0:
        fail("PyTorch's torchfrtrace could not read the dumps", theirs.stdout + theirs.stderr)
    return ours.stdout, theirs.stdout + theirs.stderr


def pytorch_dumps(launcher, work):
    """accel fr-trace on dumps as PyTorch writes them (pickle protocol 4: frames, memo; NCCL's names, its
    pg_config): 4 ranks, rank 3 missing from collective 5, then rank 2 desynchronised in a group of its own."""
    import pickle
    dumps = os.path.join(work, "pytorch")
    os.makedirs(dumps)

    def entry(record, group, seq, name, state):
        return {"record_id": record, "pg_id": 0, "process_group": group, "collective_seq_id": seq, "p2p_seq_id": 0,
                "op_id": seq, "profiling_name": "nccl:" + name, "time_created_ns": 1 << 60, "input_sizes": [[3, 4]],
                "input_dtypes": ["Float"], "output_sizes": [[3, 4]], "output_dtypes": ["Float"], "state": state,
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
                "timeout_ms": 600000, "is_p2p": False,
                "frames": [{"name": "train_step", "filename": "train.py", "line": 42}]}

    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "tp", "ranks": "[0, 2]"}}
    for rank in range(4):
        entries = [entry(s - 1, ("0", "default_pg"), s, "all_reduce", "completed" if s < 5 else "scheduled")
                   for s in range(1, 5 if rank == 3 else 6)]
        if rank in (0, 2):
            entries.append(entry(10, ("1", "tp"), 1, "broadcast" if rank == 2 else "all_reduce", "scheduled"))
        dump = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}
        with open(os.path.join(dumps, f"nccl_trace_rank_{rank}"), "wb") as f:
            f.write(pickle.dumps(dump, protocol=4))
    ours = subprocess.run([launcher, "fr-trace", dumps], capture_output=True, text=True, timeout=60)
    print(f"accel fr-trace exited with {ours.returncode}\n{ours.stdout}{ours.stderr}")
    expected = ["collective 5 (all_reduce) on group 0: process 3 missing; state scheduled; issued by train_step",
                "desynchronised: process 0 called all_reduce, process 2 called broadcast at sequence 1 on group 1"]
    for line in expected:
        if line not in ours.stdout:
            fail(f"accel fr-trace does not say: {line}", ours.stdout + ours.stderr)
    if ours.returncode != 1:
        fail(f"accel fr-trace exited with {ours.returncode}, not 1", ours.stdout + ours.stderr)
    print("hang.fr_trace_pytorch_dumps: accel fr-trace read PyTorch's dumps and named both problems")


def main():
    if sys.argv[2] == "pytorch_dumps":
        launcher, work = sys.argv[1], sys.argv[3]
        shutil.rmtree(work, ignore_errors=True)
        pytorch_dumps(launcher, work)
        return
    launcher, program, scenario, nproc, work, python = sys.argv[1:7]
    nproc = int(nproc)
    dumps = os.path.join(work, "dumps")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(dumps)
    output = run_job(launcher, program, scenario, nproc, dumps)
    ours, theirs = analyse(launcher, python, dumps)
    if scenario == "sleeping":
        named = re.search(r"flight records: collective (\d+) \(all_reduce\) on group default: process 1 missing", output)
        if not named:
            fail("the launcher's output does not name process 1 missing from the all-reduce", output)
        if f"collective {named.group(1)} (all_reduce) on group default: process 1 missing" not in ours:
            fail("accel fr-trace does not name process 1 missing from the all-reduce", ours)
        if "issued by reduce" not in ours:
            fail("accel fr-trace does not name the accel call (reduce) that issued the collective", ours)
        if not re.search(r"missing ranks: \{1\}", theirs):
            fail("torchfrtrace does not name rank 1 missing", theirs)
    else:
        pattern = r"process 1 called all_gather, (process 0 called all_reduce|the others all_reduce) at sequence \d+"
        if not re.search(pattern, ours):
            fail("accel fr-trace does not name process 1's all_gather against the all_reduce", ours)
        # torchfrtrace takes the first dump it lists as the reference, so the culprit it names is either process.
        if not re.search(r"Culprit rank [01]; Error type: COLLECTIVE_TYPE_MISMATCH.*all_gather", theirs):
            fail("torchfrtrace does not name the all_gather against the all_reduce", theirs)
    print(f"hang.{scenario}: the hang was named by the launcher, accel fr-trace and torchfrtrace")


if __name__ == "__main__":
    main()
