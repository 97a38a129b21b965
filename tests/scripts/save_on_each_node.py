#!/usr/bin/env python3
"""options::project.save_on_each_node run for real: two nodes on one machine, each with a disk of its own.

usage: save_on_each_node.py ACCEL NODE_CHECKPOINT WORK_DIR PORT

Each job is two `accel launch --nnodes 2 --node_rank K --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT`
launchers, started in two working directories (WORK_DIR/CASE/node0, .../node1) on node_checkpoint
(tests/programs/node_checkpoint.cpp), which saves into the relative directory "ckpt": a directory on each node's
"disk", as on machines that share no file system. Processes 0 and 1 are node 0's, 2 and 3 node 1's.

1. With save_on_each_node, each node's ckpt holds the shared files and its own processes' random_states files, and
   the same manifest (every process's file listed); a job of both nodes resumes from them, each node's processes
   reading their own node's copy, and ends bit for bit as an uninterrupted run.
2. Without it, node 0's ckpt holds the whole checkpoint (node 1's processes, which do not see it, send their
   random_states files to process 0) and node 1 has none; copied to node 1, it resumes bit for bit.
3. With save_on_each_node into one directory both nodes see (an absolute path), the second writer finds it locked:
   the save fails on every process, the error names save_on_each_node, and the checkpoint saved there before
   without the option is untouched and resumes bit for bit.
4. Cases 1 and 2 again with asynchronous saves (save_options::asynchronous, written in the background over the
   checkpoint's own process group): the same files, and the same resumes.
Python standard library only.
"""
import os
import re
import shutil
import subprocess
import sys
import time

from checks import CheckFailed, check, job_environment

JOB_TIMEOUT = 120  # seconds for a job: a hang fails, a loaded machine does not (a job takes about 3 s alone)
SHARED_FILES = {"accel_checksums.txt", "accel_state.bin", "model.safetensors", "optimizer.bin", "scheduler.bin"}
LINE = re.compile(r"^node_checkpoint: rank (\d) (.*)$")


def random_states(*ranks):
    return {f"random_states_{rank}.bin" for rank in ranks}


class Job:
    """Both nodes' launchers of one job, run to the end: `codes` per node, `lines` per rank."""
    count = 0

    def __init__(self, accel, program, port, case_dir, args):
        Job.count += 1
        env = job_environment()
        self.logs, launchers = [], []
        for node in (0, 1):
            cwd = os.path.join(case_dir, f"node{node}")
            os.makedirs(cwd, exist_ok=True)
            log = os.path.join(case_dir, f"job{Job.count}-{args[0]}-node{node}.log")
            self.logs.append(log)
            command = [accel, "launch", "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "2",
                       "--master_addr", "127.0.0.1", "--master_port", str(port), program, *args]
            with open(log, "w") as out:
                launchers.append(subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + JOB_TIMEOUT
        for launcher in launchers:
            try:
                launcher.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                for other in launchers:
                    other.kill()
                raise CheckFailed(f"{' '.join(args)}: the job did not end within {JOB_TIMEOUT} s; logs: {self.logs}")
        self.codes = [launcher.returncode for launcher in launchers]
        self.output = "".join(open(log).read() for log in self.logs)
        self.lines = {}
        for line in self.output.splitlines():
            if m := LINE.match(line):
                self.lines[int(m.group(1))] = m.group(2)

    def check_every_rank(self, what, expected):
        for rank in range(4):
            got = self.lines.get(rank)
            check(got is not None and expected(got),
                  f"{what}: rank {rank} printed {got!r}; launchers exited with {self.codes}; output:\n{self.output}")


def node_dir(case_dir, node):
    return os.path.join(case_dir, f"node{node}", "ckpt")


def files_of(directory):
    return set(os.listdir(directory)) if os.path.isdir(directory) else None


def manifest_rows(directory, prefix=""):
    """The lines of `directory`'s accel_checksums.txt for the files whose names start with `prefix`."""
    with open(os.path.join(directory, "accel_checksums.txt")) as f:
        lines = f.read().splitlines()
    return [line for line in lines[1:-1] if line.split(" ", 2)[2].startswith(prefix)]


def manifest_names(directory):
    return {row.split(" ", 2)[2] for row in manifest_rows(directory)}


def resume(accel, program, port, case_dir, checkpoint, what):
    job = Job(accel, program, port, case_dir, ["resume", checkpoint])
    job.check_every_rank(what, lambda line: line == "resumed bit for bit")
    check(job.codes == [0, 0], f"{what}: the launchers exited with {job.codes}")


def case_each_node(accel, program, port, work, extra=()):
    case_dir = os.path.join(work, "each_node" + "_".join(("",) + extra))
    job = Job(accel, program, port, case_dir, ["save", "ckpt", "on_each_node", *extra])
    job.check_every_rank("save with save_on_each_node", lambda line: line == "saved")
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        got = files_of(node_dir(case_dir, node))
        check(got == SHARED_FILES | random_states(*ranks),
              f"save_on_each_node: node {node}'s ckpt holds {sorted(got or [])}, expected the shared files and "
              f"random_states of processes {ranks}")
        check(not os.path.exists(node_dir(case_dir, node) + ".partial"), f"node {node}'s staging directory was left")
        check(manifest_names(node_dir(case_dir, node)) == (SHARED_FILES - {"accel_checksums.txt"}) | random_states(
            0, 1, 2, 3), f"node {node}'s manifest does not list the shared files and every process's random states")
    # The processes' files are listed alike on both nodes (their sizes and checksums are gathered from every process);
    # the shared files may differ in bytes (LibTorch's optimizer archive names each state by its tensor's address).
    rows = [manifest_rows(node_dir(case_dir, node), "random_states_") for node in (0, 1)]
    check(rows[0] == rows[1], f"the nodes' manifests list the random states differently: {rows}")
    resume(accel, program, port, case_dir, "ckpt", "resume from each node's own ckpt")
    return "each node's ckpt holds a checkpoint, and each node's processes resumed from theirs bit for bit"


def case_main_process_only(accel, program, port, work, extra=()):
    case_dir = os.path.join(work, "main_only" + "_".join(("",) + extra))
    job = Job(accel, program, port, case_dir, ["save", "ckpt", *extra])
    job.check_every_rank("save without save_on_each_node", lambda line: line == "saved")
    got = files_of(node_dir(case_dir, 0))
    check(got == SHARED_FILES | random_states(0, 1, 2, 3),
          f"without save_on_each_node, node 0's ckpt holds {sorted(got or [])}, expected the whole checkpoint")
    check(not os.path.exists(os.path.join(case_dir, "node1", "ckpt")) and
          not os.path.exists(os.path.join(case_dir, "node1", "ckpt.partial")),
          f"without save_on_each_node, node 1 has {sorted(os.listdir(os.path.join(case_dir, 'node1')))}")
    shutil.copytree(node_dir(case_dir, 0), node_dir(case_dir, 1))
    resume(accel, program, port, case_dir, "ckpt", "resume from node 0's ckpt copied to node 1")
    return "only node 0's ckpt holds a checkpoint (whole); copied to node 1, it resumed bit for bit"


def case_shared_directory(accel, program, port, work):
    case_dir = os.path.join(work, "shared")
    shared = os.path.join(case_dir, "both_nodes_see_this", "ckpt")
    job = Job(accel, program, port, case_dir, ["save", shared])
    job.check_every_rank("save into a shared directory without save_on_each_node", lambda line: line == "saved")
    with open(os.path.join(shared, "accel_checksums.txt")) as f:
        manifest = f.read()
    job = Job(accel, program, port, case_dir, ["save", shared, "on_each_node"])
    check(all(code != 0 for code in job.codes),
          f"save_on_each_node on a shared directory: the launchers exited with {job.codes}, expected failures")
    hint = ("with options::project.save_on_each_node each machine's local main process saves into the directory on "
            "its own disk: on a file system the machines share, leave it off")
    job.check_every_rank("save_on_each_node on a shared directory", lambda line: line.startswith("save failed: "))
    # The refused writer says why; every other process says which process failed and repeats its reason.
    refused = [rank for rank, line in job.lines.items() if hint in line and "another process failed" not in line]
    check(len(refused) == 1 and refused[0] in (0, 2),
          f"save_on_each_node on a shared directory: expected one writer (rank 0 or 2) to be refused naming "
          f"save_on_each_node, got ranks {refused}:\n{job.output}")
    others = [rank for rank, line in job.lines.items()
              if "another process failed while preparing" in line and f"(process {refused[0]}: " in line and hint in line]
    check(sorted(refused + others) == [0, 1, 2, 3], f"the other processes' errors:\n{job.output}")
    with open(os.path.join(shared, "accel_checksums.txt")) as f:
        check(f.read() == manifest, "the refused save changed the checkpoint")
    check(not os.path.exists(shared + ".partial"), "the refused save left its staging directory")
    resume(accel, program, port, case_dir, shared, "resume from the shared directory after the refused save")
    return f"refused on every process (rank {refused[0]} naming save_on_each_node), the checkpoint there untouched"


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    accel, program, work = (os.path.abspath(path) for path in sys.argv[1:4])  # the launchers run elsewhere
    port = sys.argv[4]
    shutil.rmtree(work, ignore_errors=True)
    try:
        cases = {"each_node": lambda: case_each_node(accel, program, port, work),
                 "main_process_only": lambda: case_main_process_only(accel, program, port, work),
                 "shared_directory": lambda: case_shared_directory(accel, program, port, work),
                 "each_node (async)": lambda: case_each_node(accel, program, port, work, ("async",)),
                 "main_process_only (async)": lambda: case_main_process_only(accel, program, port, work, ("async",))}
        for name, case in cases.items():
            started = time.monotonic()
            print(f"{name}: {case()} ({time.monotonic() - started:.1f} s)", flush=True)
    except CheckFailed as e:
        print(f"FAILED: {e}\nlogs: {work}", flush=True)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
