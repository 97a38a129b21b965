#!/usr/bin/env python3
"""Runs `accel launch` on launch_probe and checks one behaviour (a case).

usage: check_launch.py ACCEL LAUNCH_PROBE CASE

Each `def case_NAME()` below is one CTest test, launcher.NAME (tests/CMakeLists.txt reads the names
from this file). Python standard library only.
"""
import hashlib
import hmac
import os
import re
import resource
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from checks import CheckFailed, check

ACCEL = ""
PROBE = ""
WORK = ""  # a fresh temporary directory per run
CONFIG_HOME = ""  # the launchers' XDG_CONFIG_HOME, also fresh: where each finds the user's job secret


def clean_environment(changes=None):
    """This process's environment without the settings a developer's shell may carry, with `changes` applied."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"):
        env.pop(name, None)
    env["ACCEL_CONFIG_FILE"] = ""  # no config file unless a case writes one
    env.pop("ACCEL_JOB_SECRET", None)  # the launchers of a case share the job secret of CONFIG_HOME unless it sets one
    env["XDG_CONFIG_HOME"] = CONFIG_HOME
    env.update(changes or {})
    return env


def launch(*args, env_changes=None, timeout=30):
    """Runs `accel launch ARGS...`; returns (exit code, stdout, stderr, seconds)."""
    env = clean_environment(env_changes)
    command = [ACCEL, "launch", *args]
    print("$", " ".join(command), flush=True)
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=WORK)
    seconds = time.monotonic() - start
    print(f"exit code {result.returncode} after {seconds:.2f} s")
    print("--- stdout\n" + result.stdout + "--- stderr\n" + result.stderr + "---", flush=True)
    return result.returncode, result.stdout, result.stderr, seconds


def read_variables(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def pids_written(kind, ranks):
    pids = {}
    for rank in ranks:
        path = os.path.join(WORK, f"{kind}.{rank}")
        check(os.path.exists(path), f"{path} missing: worker rank {rank} did not start")
        with open(path) as f:
            pids[rank] = int(f.read())
    return pids


def alive(pid):
    """Whether a process exists and is not a zombie (an orphan's zombie waits for init, which may never reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def check_all_gone(pids):
    deadline = time.monotonic() + 2  # a process killed just now may take a moment to disappear from /proc
    while time.monotonic() < deadline and any(alive(pid) for pid in pids.values()):
        time.sleep(0.05)
    survivors = {rank: pid for rank, pid in pids.items() if alive(pid)}
    for pid in survivors.values():
        os.kill(pid, signal.SIGKILL)  # do not leave them behind
    check(not survivors, f"processes still alive after accel launch returned: {survivors}")


def check_usage_error(args, *needles):
    code, _, err, _ = launch(*args)
    check(code == 2, f"expected exit code 2 for a usage error, got {code}")
    for needle in needles:
        check(needle in err, f"the error message does not mention {needle!r}")


# ------------------------------------------------------------------------------------------------------------------
# Environment of the workers


def case_env():
    code, _, err, _ = launch("--nproc_per_node", "3", PROBE, "env", os.path.join(WORK, "vars"))
    check(code == 0, f"expected exit code 0, got {code}")
    for rank in range(3):
        v = read_variables(os.path.join(WORK, f"vars.{rank}"))
        expected = {"RANK": rank, "WORLD_SIZE": 3, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": 3, "GROUP_RANK": 0,
                    "NODE_RANK": 0, "GROUP_WORLD_SIZE": 1, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": 3,
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "OMP_NUM_THREADS": 1, "ACCEL_RESTART_COUNT": 0,
                    "TORCHELASTIC_RESTART_COUNT": 0, "TORCHELASTIC_MAX_RESTARTS": 0}
        for name, value in expected.items():
            check(v.get(name) == str(value), f"rank {rank}: {name}={v.get(name)}, expected {value}")
    check("OMP_NUM_THREADS=1" in err, "the launcher does not say it set OMP_NUM_THREADS")


def case_env_multinode():
    # Also: --opt=value, dashes for underscores, and an OMP_NUM_THREADS of the user's kept.
    code, _, _, _ = launch("--nnodes=2", "--node-rank", "1", "--master_addr", "10.0.0.1", "--master_port=1234",
                           "--nproc_per_node", "2", "--", PROBE, "env", os.path.join(WORK, "vars"),
                           env_changes={"OMP_NUM_THREADS": "4"})
    check(code == 0, f"expected exit code 0, got {code}")
    check(sorted(os.listdir(WORK)) == ["vars.2", "vars.3"], f"expected vars.2 and vars.3, got {os.listdir(WORK)}")
    for rank, local_rank in ((2, 0), (3, 1)):
        v = read_variables(os.path.join(WORK, f"vars.{rank}"))
        expected = {"RANK": rank, "WORLD_SIZE": 4, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": 2,
                    "GROUP_RANK": 1, "NODE_RANK": 1, "GROUP_WORLD_SIZE": 2, "MASTER_ADDR": "10.0.0.1",
                    "MASTER_PORT": 1234, "OMP_NUM_THREADS": 4}
        for name, value in expected.items():
            check(v.get(name) == str(value), f"rank {rank}: {name}={v.get(name)}, expected {value}")


def case_free_port():
    code, _, _, _ = launch("--nproc_per_node", "2", "--master_port", "0", PROBE, "env", os.path.join(WORK, "vars"))
    check(code == 0, f"expected exit code 0, got {code}")
    ports = {read_variables(os.path.join(WORK, f"vars.{rank}"))["MASTER_PORT"] for rank in range(2)}
    check(len(ports) == 1, f"the workers got different ports: {ports}")
    port = int(ports.pop())
    check(0 < port < 65536, f"MASTER_PORT {port} is not a port")


def case_path_lookup():
    # The program is found on PATH, like a shell would (execvp).
    path = os.path.dirname(PROBE) + os.pathsep + os.environ.get("PATH", "")
    code, _, _, _ = launch("--nproc_per_node", "2", os.path.basename(PROBE), "exit", "0", env_changes={"PATH": path})
    check(code == 0, f"expected exit code 0, got {code}")


# ------------------------------------------------------------------------------------------------------------------
# Exit codes and shutdown


def case_all_succeed():
    code, _, err, _ = launch("--nproc_per_node", "4", PROBE, "exit", "0")
    check(code == 0, f"expected exit code 0, got {code}")
    check("worker rank" not in err, "the launcher reported a failure")


def case_worker_failure():
    code, _, err, seconds = launch("--nproc_per_node", "3", PROBE, "fail", "1", "3", WORK)
    pids = pids_written("pid", range(3))
    check(code == 3, f"expected the failing worker's exit code 3, got {code}")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check(f"worker rank 1 (pid {pids[1]}) exited with code 3; terminating the other 2 workers" in err,
          "the launcher did not report the failure as expected")
    for rank in (0, 2):
        check(os.path.exists(os.path.join(WORK, f"term.{rank}")), f"rank {rank} did not receive SIGTERM")
    check_all_gone(pids)


def case_worker_failure_sigkill():
    # Workers that ignore SIGTERM are killed when the grace period ends.
    code, _, err, seconds = launch("--nproc_per_node", "3", "--grace_period", "0.5", PROBE, "stubborn", "0", "5",
                                   WORK)
    pids = pids_written("pid", range(3))
    check(code == 5, f"expected the failing worker's exit code 5, got {code}")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check("sending SIGKILL" in err, "the launcher did not say it sent SIGKILL")
    check_all_gone(pids)


def case_worker_crash():
    code, _, err, seconds = launch("--nproc_per_node", "3", PROBE, "crash", "2", WORK)
    pids = pids_written("pid", range(3))
    check(code == 128 + signal.SIGSEGV, f"expected 128 + SIGSEGV = {128 + signal.SIGSEGV}, got {code}")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check(f"worker rank 2 (pid {pids[2]}) was killed by signal {int(signal.SIGSEGV)}" in err,
          "the launcher did not report the death by signal")
    check_all_gone(pids)


def case_process_group():
    # The SIGTERM goes to each worker's process group, so it reaches the workers' own children too.
    code, _, _, seconds = launch("--nproc_per_node", "3", PROBE, "family", "1", "3", WORK)
    check(code == 3, f"expected exit code 3, got {code}")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    workers = pids_written("pid", range(3))
    children = pids_written("child", (0, 2))
    check_all_gone({**{f"rank {r}": p for r, p in workers.items()}, **{f"child of rank {r}": p for r, p in children.items()}})


def start_launcher(command, env_changes=None, descriptors=None):
    """Starts COMMAND (an accel launch) with its stderr on a pipe, to be signalled by the caller; with `descriptors`,
    under that limit of open files."""
    print("$", " ".join(command), flush=True)

    def prepare():
        # The launcher must see the signals' default dispositions, even where this script was started with SIGINT
        # ignored (a background job of a non-interactive shell).
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        if descriptors:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=WORK, preexec_fn=prepare,
                            env=clean_environment(env_changes))


def launch_and_signal(args, signals, probe_mode="sleep"):
    """Starts `accel launch ARGS... launch_probe PROBE_MODE`, sends it `signals` (0.2 s apart) once every worker has
    started; returns (exit code, stderr, seconds, worker pids)."""
    nproc = int(args[args.index("--nproc_per_node") + 1])
    start = time.monotonic()
    launcher = start_launcher([ACCEL, "launch", *args, PROBE, probe_mode, WORK])
    try:
        while not all(os.path.exists(os.path.join(WORK, f"pid.{r}")) for r in range(nproc)):
            check(time.monotonic() - start < 20, "the workers did not start within 20 s")
            check(launcher.poll() is None, f"the launcher exited early with {launcher.returncode}")
            time.sleep(0.05)
        pids = pids_written("pid", range(nproc))
        for number in signals:
            launcher.send_signal(number)
            time.sleep(0.2)
        _, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    seconds = time.monotonic() - start
    print(f"exit code {launcher.returncode} after {seconds:.2f} s\n--- stderr\n{err}---", flush=True)
    return launcher.returncode, err, seconds, pids


def case_forward_sigterm():
    # SIGTERM sent to the launcher reaches every worker; the launcher exits with 128 + SIGTERM.
    code, err, seconds, pids = launch_and_signal(["--nproc_per_node", "2"], [signal.SIGTERM])
    check(code == 128 + signal.SIGTERM, f"expected {128 + signal.SIGTERM}, got {code}")
    check("received SIGTERM; passing it on to the 2 running workers" in err, "the launcher did not report the signal")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check_all_gone(pids)


def case_forward_sigint():
    code, err, seconds, pids = launch_and_signal(["--nproc_per_node", "3"], [signal.SIGINT])
    check(code == 128 + signal.SIGINT, f"expected {128 + signal.SIGINT}, got {code}")
    check("received SIGINT; passing it on to the 3 running workers" in err, "the launcher did not report the signal")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check_all_gone(pids)


def case_second_signal_kills():
    # Workers that ignore SIGTERM, a long grace period: a second signal kills them at once.
    code, err, seconds, pids = launch_and_signal(["--nproc_per_node", "2", "--grace_period", "50"],
                                                 [signal.SIGTERM, signal.SIGTERM], probe_mode="sleep_ignoring_sigterm")
    check(code == 128 + signal.SIGTERM, f"expected {128 + signal.SIGTERM}, got {code}")
    check("killing them now" in err, "the launcher did not report the second signal")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s (the grace period is 50 s)")
    check_all_gone(pids)


def case_launcher_killed():
    # A launcher killed outright (SIGKILL: no chance to clean up) takes its workers with it.
    code, _, _, pids = launch_and_signal(["--nproc_per_node", "2"], [signal.SIGKILL])
    check(code == -signal.SIGKILL, f"expected the launcher to die of SIGKILL, got {code}")
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    check_all_gone(pids)


# ------------------------------------------------------------------------------------------------------------------
# Restarts (the probe's flaky mode logs every start in WORK/starts and its variables in WORK/vars.RESTART.RANK)


def read_starts():
    """The workers started, in order: one dict per start with restart, rank, pid and earlier_alive (how many workers
    of earlier attempts were still alive when it started)."""
    path = os.path.join(WORK, "starts")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{name: int(value) for name, value in (field.split("=") for field in line.split())} for line in f]


def start_pid(starts, restart, rank):
    pids = [s["pid"] for s in starts if s["restart"] == restart and s["rank"] == rank]
    check(len(pids) == 1, f"expected one start of rank {rank} in attempt {restart}, got {len(pids)}")
    return pids[0]


def check_attempts(starts, attempts, nproc):
    got = sorted((s["restart"], s["rank"]) for s in starts)
    expected = [(restart, rank) for restart in range(attempts) for rank in range(nproc)]
    check(got == expected, f"expected {attempts} attempts of {nproc} workers, got the starts {got}")


def restart_lines(err):
    return [line for line in err.splitlines() if "restarting the job" in line]


def case_restart_then_succeed():
    code, _, err, _ = launch("--nproc_per_node", "2", "--max_restarts", "2", "--restart_delay", "0", PROBE, "flaky",
                             "1", "3", "1", WORK)
    check(code == 0, f"expected exit code 0 after the restart succeeded, got {code}")
    starts = read_starts()
    check_attempts(starts, 2, 2)
    failed = start_pid(starts, 0, 1)
    expected = f"accel launch: worker rank 1 (pid {failed}) exited with code 3; restarting the job (restart 1 of 2)"
    check(restart_lines(err) == [expected], f"expected the one restart line {expected!r}")
    check("giving up" not in err, "the launcher gave up although the restart succeeded")
    for restart in range(2):
        for rank in range(2):
            v = read_variables(os.path.join(WORK, f"vars.{restart}.{rank}"))
            for name, value in {"ACCEL_RESTART_COUNT": restart, "TORCHELASTIC_RESTART_COUNT": restart,
                                "TORCHELASTIC_MAX_RESTARTS": 2}.items():
                check(v.get(name) == str(value),
                      f"attempt {restart}, rank {rank}: {name}={v.get(name)}, expected {value}")


def case_restart_gives_up():
    # Also: dashes in the option names, and a delay before each restart.
    code, _, err, seconds = launch("--nproc_per_node", "2", "--max-restarts=2", "--restart-delay", "0.3", PROBE,
                                   "flaky", "0", "3", "1000", WORK)
    check(code == 3, f"expected the failing worker's exit code 3, got {code}")
    starts = read_starts()
    check_attempts(starts, 3, 2)
    lines = restart_lines(err)
    check(len(lines) == 2, f"expected two restart lines, got {len(lines)}")
    for k, line in zip((1, 2), lines):
        check(line.endswith(f"exited with code 3; restarting the job in 0.3 s (restart {k} of 2)"),
              f"unexpected restart line {line!r}")
    last = start_pid(starts, 2, 0)
    check(f"accel launch: worker rank 0 (pid {last}) exited with code 3; giving up after 2 restarts" in err,
          "the launcher did not say it gave up after the last attempt")
    check(seconds >= 0.6, f"took {seconds:.2f} s: the two restarts did not wait 0.3 s each")


def case_restart_sigkill():
    code, _, err, _ = launch("--nproc_per_node", "2", "--max_restarts", "1", "--restart_delay", "0", PROBE, "flaky",
                             "1", str(-int(signal.SIGKILL)), "1", WORK)
    check(code == 0, f"expected exit code 0 after the restart, got {code}")
    starts = read_starts()
    check_attempts(starts, 2, 2)
    killed = start_pid(starts, 0, 1)
    expected = (f"accel launch: worker rank 1 (pid {killed}) was killed by signal {int(signal.SIGKILL)} "
                f"({signal.strsignal(signal.SIGKILL)}); restarting the job (restart 1 of 1)")
    check(restart_lines(err) == [expected], f"expected the one restart line {expected!r}")


def case_restart_other_workers_stopped():
    # Every worker of the failed attempt is gone (SIGTERM, reaped) before any worker of the next one starts.
    code, _, _, _ = launch("--nproc_per_node", "3", "--max_restarts", "1", "--restart_delay", "0", PROBE, "flaky",
                           "1", "3", "1", WORK)
    check(code == 0, f"expected exit code 0 after the restart, got {code}")
    starts = read_starts()
    check_attempts(starts, 2, 3)
    for rank in (0, 2):
        check(not alive(start_pid(starts, 0, rank)), f"rank {rank} of the failed attempt is still alive")
    for start in starts:
        if start["restart"] == 1:
            check(start["earlier_alive"] == 0, f"rank {start['rank']} of the restart started while "
                                               f"{start['earlier_alive']} workers of the failed attempt were alive")


def case_restart_free_port():
    # With --master_port 0 each attempt gets a port of its own: the last attempt's may still be in TIME_WAIT.
    code, _, _, _ = launch("--nproc_per_node", "2", "--master_port", "0", "--max_restarts", "1", "--restart_delay",
                           "0", PROBE, "flaky", "0", "3", "1", WORK)
    check(code == 0, f"expected exit code 0 after the restart, got {code}")
    ports = []
    for restart in range(2):
        attempt_ports = {read_variables(os.path.join(WORK, f"vars.{restart}.{rank}"))["MASTER_PORT"]
                         for rank in range(2)}
        check(len(attempt_ports) == 1, f"the workers of attempt {restart} got different ports: {attempt_ports}")
        ports.append(attempt_ports.pop())
    # Each attempt asks the kernel for a free port; the kernel may hand out the same one again, so the two ports are
    # not required to differ, only to be real ports.
    check(all(1 <= int(port) <= 65535 for port in ports), f"not TCP ports: {ports}")


def case_no_restart_on_signal():
    code, err, seconds, pids = launch_and_signal(["--nproc_per_node", "2", "--max_restarts", "3"], [signal.SIGTERM])
    check(code == 128 + signal.SIGTERM, f"expected {128 + signal.SIGTERM}, got {code}")
    check("received SIGTERM; passing it on to the 2 running workers" in err, "the launcher did not report the signal")
    check("restart" not in err, "a signal to the launcher must not restart the job")
    check(pids_written("pid", range(2)) == pids, "the workers were started again")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")
    check_all_gone(pids)


def case_no_restart_on_signal_during_delay():
    start = time.monotonic()
    launcher = start_launcher([ACCEL, "launch", "--nproc_per_node", "2", "--max_restarts", "1", "--restart_delay", "30",
                               PROBE, "flaky", "0", "3", "1", WORK])
    err = ""
    try:
        for line in launcher.stderr:  # the workers' stderr shares the pipe; the launcher's line says it waits
            err += line
            if "restarting the job in 30 s" in line:
                launcher.send_signal(signal.SIGTERM)
                break
        launcher.wait(timeout=20)
        err += launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    seconds = time.monotonic() - start
    print(f"exit code {launcher.returncode} after {seconds:.2f} s\n--- stderr\n{err}---", flush=True)
    check(launcher.returncode == 128 + signal.SIGTERM, f"expected {128 + signal.SIGTERM}, got {launcher.returncode}")
    check("received SIGTERM before the restart; not restarting" in err, "the launcher did not report the signal")
    check(seconds < 20, f"took {seconds:.1f} s: the launcher waited out the 30 s delay")
    check_attempts(read_starts(), 1, 2)


# ------------------------------------------------------------------------------------------------------------------
# Output


def expected_hello_lines(prefix_for):
    return sorted(f"{prefix_for(r)}{text} from rank {r}" for r in range(2)
                  for text in ("hello", "second line", "partial line"))


def case_prefix_output():
    code, out, err, _ = launch("--nproc_per_node", "2", "--prefix_output", PROBE, "hello")
    check(code == 0, f"expected exit code 0, got {code}")
    check(out.endswith("\n"), "a partial last line was not ended with a newline")
    check(sorted(out.splitlines()) == expected_hello_lines(lambda r: f"[rank {r}] "),
          "stdout is not the workers' lines, each prefixed with its rank")
    err_lines = [line for line in err.splitlines() if line.startswith("[rank")]
    check(sorted(err_lines) == [f"[rank {r}] warning from rank {r}" for r in range(2)],
          "stderr does not hold the workers' prefixed stderr lines")


def case_inherited_output():
    code, out, err, _ = launch("--nproc_per_node", "2", PROBE, "hello")
    check(code == 0, f"expected exit code 0, got {code}")
    for r in range(2):
        check(f"hello from rank {r}\nsecond line from rank {r}\n" in out,
              "without --prefix_output the workers' stdout should arrive unchanged")
        check(f"warning from rank {r}\n" in err.splitlines(keepends=True),
              "without --prefix_output the workers' stderr should arrive unchanged")
    check("[rank" not in out + err, "without --prefix_output nothing should be prefixed")


# ------------------------------------------------------------------------------------------------------------------
# The launchers' keep-alive (--nnodes > 1), with the nodes' launchers on this machine. A launcher stopped with SIGSTOP
# falls silent with its connections open, as one whose machine vanished: the others must name its node within the
# heartbeat timeout, stop their workers and exit with 1.

HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT = 0.2, 1
HEARTBEAT = ["--heartbeat_interval", str(HEARTBEAT_INTERVAL), "--heartbeat_timeout", str(HEARTBEAT_TIMEOUT)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The launchers' handshake and sealed lines (tools/accel_cli/heartbeat_link.hpp), for a node this script plays.
JOB_SECRET = "the-secret-of-this-test-job-0123456789"


def keyed(secret, purpose, challenge, nonce, words=""):
    message = f"accel launch {purpose}\n{challenge}\n{nonce}\n{words}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


class PlayedNode:
    """A launcher of the job played by this script: it connects to node 0's heartbeat port, answers its challenge
    with `words` ("hello NODE NPROC" or "join ID NPROC") proved with `secret`, checks node 0's proof, then sends and
    receives sealed lines. `refused` is node 0's reason when it refused the node."""

    def __init__(self, port, words, secret=JOB_SECRET, timeout=5):
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.pending, self.sent, self.received = b"", 0, 0
        first = self.raw_line()
        check(first.startswith("challenge "), f"node 0 did not send a challenge first: {first!r}")
        challenge, nonce = first.removeprefix("challenge "), secrets.token_hex(16)
        self.send_raw(f"{words} {nonce} {keyed(secret, 'node', challenge, nonce, words)}")
        answer = self.raw_line()
        self.refused = answer.removeprefix("refused ") if answer.startswith("refused ") else None
        if self.refused is None:
            check(answer == f"welcome {keyed(secret, 'node 0', challenge, nonce)}",
                  f"node 0's welcome does not prove that it holds the job's secret: {answer!r}")
        self.key = keyed(secret, "connection", challenge, nonce)

    def raw_line(self):
        while b"\n" not in self.pending:
            chunk = self.socket.recv(4096)
            check(chunk, f"node 0 closed the connection; it had sent {self.pending!r}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def send_raw(self, line):
        self.socket.sendall(line.encode() + b"\n")

    def seal(self, direction, number, text):
        return hmac.new(self.key.encode(), f"{direction} {number}\n{text}".encode(), hashlib.sha256).hexdigest()

    def send(self, text):
        self.send_raw(f"{text} {self.seal('to node 0', self.sent, text)}")
        self.sent += 1

    def receive(self):
        """Node 0's next line but its heartbeats, its seal checked."""
        while True:
            text, seal = self.raw_line().rsplit(" ", 1)
            check(seal == self.seal("from node 0", self.received, text), f"a line of node 0's is not sealed: {text!r}")
            self.received += 1
            if text != "beat":
                return text

    def close(self):
        self.socket.close()


class PlayedMainNode:
    """Node 0's launcher played by this script on an accepted `connection`: its challenge, the other launcher's hello
    checked under JOB_SECRET; then, when the caller says, its welcome, after which that launcher's lines are sealed."""

    def __init__(self, connection):
        self.socket, self.pending, self.received = connection, b"", 0
        self.challenge = secrets.token_hex(16)
        self.socket.sendall(f"challenge {self.challenge}\n".encode())
        hello = self.raw_line()
        check(hello is not None and hello.count(" ") >= 2, f"no hello came after the challenge: {hello!r}")
        words, self.nonce, proof = hello.rsplit(" ", 2)
        check(proof == keyed(JOB_SECRET, "node", self.challenge, self.nonce, words), f"a hello not proved: {words!r}")
        self.key = keyed(JOB_SECRET, "connection", self.challenge, self.nonce)

    def raw_line(self):
        while b"\n" not in self.pending:
            chunk = self.socket.recv(4096)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def welcome(self):
        self.socket.sendall(f"welcome {keyed(JOB_SECRET, 'node 0', self.challenge, self.nonce)}\n".encode())

    def lines_until_closed(self):
        """The other launcher's sealed lines but its heartbeats, their seals checked, until it closes the connection."""
        lines = []
        while (line := self.raw_line()) is not None:
            text, seal = line.rsplit(" ", 1)
            expected = hmac.new(self.key.encode(), f"to node 0 {self.received}\n{text}".encode(), hashlib.sha256)
            check(seal == expected.hexdigest(), f"a line of node 1's is not sealed: {text!r}")
            self.received += 1
            if text != "beat":
                lines.append(text)
        return lines


def node_command(nnodes, node, master_port, heartbeat_port, flags, program):
    """`accel launch` of node `node` of `nnodes`, 2 workers running `program`."""
    return [ACCEL, "launch", "--nnodes", str(nnodes), "--node_rank", str(node), "--master_addr", "127.0.0.1",
            "--master_port", str(master_port), "--heartbeat_port", str(heartbeat_port), "--nproc_per_node", "2",
            *flags, *program]


def start_nodes(programs, heartbeat=HEARTBEAT, heartbeat_port=None, env_changes=None):
    """Starts one launcher per program, node i running programs[i] on 2 workers; returns the launchers."""
    master_port, heartbeat_port = free_port(), heartbeat_port or free_port()
    return [start_launcher(node_command(len(programs), node, master_port, heartbeat_port, heartbeat, program),
                           env_changes) for node, program in enumerate(programs)]


def sleeping_nodes(count, heartbeat=HEARTBEAT, heartbeat_port=None, env_changes=None):
    """`count` nodes of 2 sleeping workers, all started; returns the launchers and the workers' pids by rank."""
    launchers = start_nodes([[PROBE, "sleep", WORK]] * count, heartbeat, heartbeat_port, env_changes)
    start = time.monotonic()
    while not all(os.path.exists(os.path.join(WORK, f"pid.{rank}")) for rank in range(2 * count)):
        check(time.monotonic() - start < 20, "the workers did not start within 20 s")
        time.sleep(0.05)
    time.sleep(0.5)  # the launchers have met
    return launchers, pids_written("pid", range(2 * count))


def ended(launcher, what, timeout=20):
    """Waits for `launcher`; returns (exit code, stderr, seconds waited)."""
    start = time.monotonic()
    try:
        _, err = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.kill()
        _, err = launcher.communicate()
        raise CheckFailed(f"{what}: the launcher did not end within {timeout} s:\n{err}")
    seconds = time.monotonic() - start
    print(f"{what}: exit code {launcher.returncode} after {seconds:.2f} s\n--- stderr\n{err}---", flush=True)
    return launcher.returncode, err, seconds


# The earliest a silent node can be named: its last heartbeat may have left up to an interval before it was stopped,
# later than due on a loaded machine, so the timeout can run out a little before timeout - interval. Half the timeout
# still fails a launcher that names a node without waiting for it.
EARLIEST_LOSS = HEARTBEAT_TIMEOUT / 2


def check_lost(launcher, what, needles, pids, at_least=EARLIEST_LOSS, at_most=5):
    """`launcher` ends with 1 between `at_least` and `at_most` seconds on, naming the lost node; its workers are gone."""
    code, err, seconds = ended(launcher, what)
    check(code == 1, f"{what}: expected exit code 1, got {code}")
    for needle in needles:
        check(needle in err, f"{what}: the launcher's message lacks {needle!r}")
    check(at_least <= seconds < at_most, f"{what}: ended {seconds:.2f} s on, expected {at_least} to {at_most} s")
    check_all_gone(pids)


def cleanup(launchers):
    for launcher in launchers:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


ADVICE = ["The job cannot go on without it", "start the job again on every node", "resume::latest",
          "after 1.0 s without a heartbeat (--heartbeat_timeout)"]


def case_heartbeat_node_lost():
    launchers, pids = sleeping_nodes(2)
    try:
        launchers[1].send_signal(signal.SIGSTOP)
        check_lost(launchers[0], "node 0", ["node 1 (ranks 2, 3, at 127.0.0.1) is lost: its launcher has not been "
                                            "heard for ", " UTC (its machine is down", *ADVICE,
                                            "terminating this node's 2 running workers (ranks 0, 1) and exiting with 1"],
                   {rank: pids[rank] for rank in (0, 1)})
        # Running again, node 1 reads that node 0 took it for lost, and stops too.
        launchers[1].send_signal(signal.SIGCONT)
        check_lost(launchers[1], "node 1 continued", ["node 1 (ranks 2, 3, at 127.0.0.1) is lost", "(found by node 0)",
                                                      "ranks 2, 3) and exiting with 1"],
                   {rank: pids[rank] for rank in (2, 3)}, at_least=0)
    finally:
        cleanup(launchers)


def case_heartbeat_main_node_lost():
    launchers, pids = sleeping_nodes(2)
    try:
        launchers[0].send_signal(signal.SIGSTOP)
        check_lost(launchers[1], "node 1", ["node 0 (ranks 0, 1: the main node, at 127.0.0.1, which holds the job's "
                                            "store) is lost: its launcher has not been heard for ", *ADVICE,
                                            "terminating this node's 2 running workers (ranks 2, 3) and exiting with 1"],
                   {rank: pids[rank] for rank in (2, 3)})
        launchers[0].send_signal(signal.SIGCONT)
        check_lost(launchers[0], "node 0 continued", ["node 0 (ranks 0, 1: the main node", "(found by node 1)"],
                   {rank: pids[rank] for rank in (0, 1)}, at_least=0)
    finally:
        cleanup(launchers)


def case_heartbeat_lost_node_named_everywhere():
    # 3 nodes: node 0 finds node 2 lost and tells node 1, which names node 2 too.
    launchers, pids = sleeping_nodes(3)
    try:
        launchers[2].send_signal(signal.SIGSTOP)
        lost = "node 2 (ranks 4, 5, at 127.0.0.1) is lost: its launcher has not been heard for "
        check_lost(launchers[0], "node 0", [lost, *ADVICE], {rank: pids[rank] for rank in (0, 1)})
        check_lost(launchers[1], "node 1", [lost, "(found by node 0)", *ADVICE, "ranks 2, 3) and exiting with 1"],
                   {rank: pids[rank] for rank in (2, 3)}, at_least=0, at_most=2)
    finally:
        cleanup(launchers)


def case_heartbeat_launcher_killed():
    # A launcher killed outright closes its connection: its node is named at once, not after the 10 s timeout.
    launchers, pids = sleeping_nodes(2, ["--heartbeat_interval", "1", "--heartbeat_timeout", "10"])
    try:
        launchers[1].kill()
        check_lost(launchers[0], "node 0", ["node 1 (ranks 2, 3, at 127.0.0.1) is lost: its launcher's connection "
                                            "ended at ", "without a goodbye (the launcher was killed)"],
                   {rank: pids[rank] for rank in (0, 1)}, at_least=0, at_most=5)
    finally:
        cleanup(launchers)


def case_heartbeat_nodes_end_apart():
    # A node whose job has ended says goodbye: the other, still running for twice the timeout, does not take it for
    # lost.
    for programs in ([[PROBE, "exit", "0"], ["sleep", "2"]], [["sleep", "2"], [PROBE, "exit", "0"]]):
        launchers = start_nodes(programs)
        try:
            for node, launcher in enumerate(launchers):
                code, err, _ = ended(launcher, f"node {node}")
                check(code == 0 and "lost" not in err, f"node {node} exited with {code}: {err}")
        finally:
            cleanup(launchers)


def case_heartbeat_ends_before_welcome():
    # A node whose job ends between its hello and node 0's welcome waits for the welcome and says goodbye: closed
    # without one, node 0 (played here, its welcome held back until node 1's workers have ended) took it for killed.
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(20)
        flags = ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "5"]
        program = ["sh", "-c", "sleep 1; touch ended.$RANK"]  # after the hello, on a loaded machine too
        launcher = start_launcher(node_command(2, 1, free_port(), server.getsockname()[1], flags, program),
                                  {"ACCEL_JOB_SECRET": JOB_SECRET})
        try:
            connection, _ = server.accept()
            with connection:
                node = PlayedMainNode(connection)
                start = time.monotonic()
                while not all(os.path.exists(os.path.join(WORK, f"ended.{rank}")) for rank in (2, 3)):
                    check(time.monotonic() - start < 20, "node 1's workers did not end within 20 s")
                    time.sleep(0.05)
                time.sleep(0.5)  # the launcher has reaped them and is finishing
                node.welcome()
                check(node.lines_until_closed() == ["bye 0"], "node 1 closed its connection without a goodbye")
            code, err, _ = ended(launcher, "node 1")
            check(code == 0, f"node 1 exited with {code}: {err}")
        finally:
            cleanup([launcher])


def case_heartbeat_off():
    # --heartbeat_timeout 0: no keep-alive, so a silent node is waited for (here: until its workers end, 2 s on,
    # twice the timeout of the other cases).
    launchers = start_nodes([["sleep", "2"], ["sleep", "2"]], heartbeat=["--heartbeat_timeout", "0"])
    try:
        launchers[1].send_signal(signal.SIGSTOP)
        code, err, seconds = ended(launchers[0], "node 0")
        check(code == 0 and "lost" not in err and seconds > 1.5, f"node 0 exited with {code} after {seconds:.1f} s: {err}")
    finally:
        cleanup(launchers)


# ------------------------------------------------------------------------------------------------------------------
# Restarts agreed across nodes (--max_restarts with --nnodes > 1), the nodes' launchers on this machine sharing WORK:
# the probe's starts file shows every worker of every node, and whether any of an earlier attempt was still alive.

NODE_RESTARTS = [*HEARTBEAT, "--restart_delay", "0"]


def run_nodes(programs, flags, timeout=30):
    """Starts one launcher per program (2 workers each) with `flags` and waits for all; returns their (code, stderr)."""
    launchers = start_nodes(programs, flags)
    try:
        return [ended(launcher, f"node {node}", timeout)[:2] for node, launcher in enumerate(launchers)]
    finally:
        cleanup(launchers)


def attempt_ports(attempts, ranks):
    """The MASTER_PORT each attempt's workers got: one per attempt, the same on every node."""
    ports = []
    for restart in range(attempts):
        got = {read_variables(os.path.join(WORK, f"vars.{restart}.{rank}"))["MASTER_PORT"] for rank in ranks}
        check(len(got) == 1, f"the workers of attempt {restart} got different ports: {got}")
        ports.append(int(got.pop()))
    return ports


def restart_nodes_together(failing_rank):
    """Rank `failing_rank` fails in attempt 0 of 2 nodes x 2 workers: every node stops its workers, and every node
    starts attempt 1, none of whose workers starts before every worker of attempt 0 (of both nodes) is gone; the
    launchers agree on a fresh store port, and both end with 0."""
    results = run_nodes([[PROBE, "flaky", str(failing_rank), "3", "1", WORK]] * 2,
                        [*NODE_RESTARTS, "--max_restarts", "2"])
    starts = read_starts()
    check_attempts(starts, 2, 4)
    for start in starts:
        if start["restart"] == 1:
            check(start["earlier_alive"] == 0, f"rank {start['rank']} of attempt 1 started while "
                                               f"{start['earlier_alive']} workers of attempt 0 were alive")
    failed = start_pid(starts, 0, failing_rank)
    failure = f"on node {failing_rank // 2}, worker rank {failing_rank} (pid {failed}) exited with code 3"
    for node, (code, err) in enumerate(results):
        check(code == 0, f"node {node}: expected exit code 0 after the restart, got {code}")
        check(f"accel launch: {failure}; restarting the job on every node (restart 1 of 2)" in err,
              f"node {node} did not name the failure and the restart")
        check("is lost" not in err and "giving up" not in err, f"node {node} reported a loss or gave up")
    other = 1 - failing_rank // 2
    check(f"accel launch: {failure}; stopping this node's 2 running workers" in results[other][1],
          f"node {other} did not say why it stopped its workers")
    ports = attempt_ports(2, range(4))
    for restart in range(2):
        for rank in range(4):
            v = read_variables(os.path.join(WORK, f"vars.{restart}.{rank}"))
            got = (v.get("ACCEL_RESTART_COUNT"), v.get("TORCHELASTIC_MAX_RESTARTS"))
            check(got == (str(restart), "2"), f"attempt {restart}, rank {rank}: restart count and maximum {got}")
    check(ports[1] != ports[0], f"attempt 1 met on the store port of attempt 0 ({ports})")


def case_restart_nodes_worker_node_fails():
    restart_nodes_together(3)


def case_restart_nodes_main_node_fails():
    restart_nodes_together(1)


def stderr_until(launcher, needle, seconds=20):
    """What `launcher` has written to its stderr once it wrote `needle` (a failed check after `seconds`)."""
    err = ""
    deadline = time.monotonic() + seconds
    while needle not in err:
        check(time.monotonic() < deadline, f"the launcher did not write {needle!r} within {seconds} s: {err!r}")
        check(launcher.poll() is None or select.select([launcher.stderr.fileno()], [], [], 0)[0],
              f"the launcher ended with {launcher.returncode} before writing {needle!r}: {err!r}")
        if select.select([launcher.stderr.fileno()], [], [], 0.1)[0]:
            err += os.read(launcher.stderr.fileno(), 4096).decode(errors="replace")
    return err


def case_restart_nodes_hello_after_failure():
    # Node 0's workers fail before node 1's launcher has said hello (on a loaded machine a launcher's hello can come
    # after the other node's failure; node 1 is this script here, saying it once node 0 has reported the failure):
    # node 0 then sends node 1 the order to restart. Without it node 1's workers ran on and node 0 waited for them.
    heartbeat_port = free_port()
    node0 = start_launcher(node_command(2, 0, free_port(), heartbeat_port,
                                        ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "10",
                                         "--restart_delay", "0", "--max_restarts", "1"], [PROBE, "exit", "3"]),
                           env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    try:
        stderr_until(node0, "exited with code 3")
        node1 = PlayedNode(heartbeat_port, "hello 1 2")
        check(node1.refused is None, f"node 0 refused node 1: {node1.refused}")
        order = node1.receive()
        check(re.fullmatch(r"restart 0 on node 0, worker rank [01] \(pid \d+\) exited with code 3", order),
              f"node 0 did not send the late node the order to restart attempt 0: {order!r}")
        node1.close()
    finally:
        cleanup([node0])


def case_restart_nodes_after_success():
    # Node 1's workers all succeed in attempt 0 while rank 1 of node 0 fails: the job restarts as a whole, node 1's
    # workers included, and ends when every worker of attempt 1 has succeeded.
    results = run_nodes([[PROBE, "flaky", "1", "3", "1", WORK], [PROBE, "flaky", "1", "3", "0", WORK]],
                        [*NODE_RESTARTS, "--max_restarts", "1"])
    check_attempts(read_starts(), 2, 4)
    for node, (code, err) in enumerate(results):
        check(code == 0, f"node {node}: expected exit code 0 after the restart, got {code}")
        check("worker rank 1 (pid " in err and "restarting the job on every node (restart 1 of 1)" in err,
              f"node {node} did not name the restart")


def case_restart_nodes_give_up():
    # Every attempt fails on node 1: with --max_restarts 1 both launchers end after attempt 2, with the failing
    # worker's code, naming its node, its rank and the attempts; node 0 waits --restart_delay before the restart.
    started = time.monotonic()
    results = run_nodes([[PROBE, "flaky", "3", "3", "1000", WORK]] * 2,
                        [*HEARTBEAT, "--restart_delay", "1.5", "--max_restarts", "1"])
    seconds = time.monotonic() - started
    starts = read_starts()
    check_attempts(starts, 2, 4)
    last = start_pid(starts, 1, 3)
    for node, (code, err) in enumerate(results):
        check(code == 3, f"node {node}: expected the failing worker's exit code 3, got {code}")
        check(f"accel launch: on node 1, worker rank 3 (pid {last}) exited with code 3; giving up after 1 restart: "
              f"attempt 2 of 2 failed on every node" in err, f"node {node} did not give up naming the failure")
        check(len(re.findall("restarting the job on every node", err)) == 1, f"node {node}: not one restart")
    # Each attempt: the probe's start-up, the failing worker's wait for the others, SIGTERM to the rest; the delay,
    # longer than the heartbeat timeout (1 s), with the heartbeats going on (no node taken for lost).
    check(1.5 <= seconds < 10, f"took {seconds:.1f} s")
    for node, (_, err) in enumerate(results):
        check("is lost" not in err, f"node {node} took the other for lost during the delay")
    starts_1 = [s for s in read_starts() if s["restart"] == 1]
    check(all(s["earlier_alive"] == 0 for s in starts_1), f"attempt 1 started beside attempt 0's workers: {starts_1}")


def case_restart_nodes_node_lost():
    # A node lost is never restarted: node 0 names it and exits with 1, although restarts are left.
    launchers, pids = sleeping_nodes(2, [*HEARTBEAT, "--max_restarts", "2"])
    try:
        launchers[1].send_signal(signal.SIGSTOP)
        check_lost(launchers[0], "node 0", ["node 1 (ranks 2, 3, at 127.0.0.1) is lost: its launcher has not been "
                                            "heard for ", "terminating this node's 2 running workers (ranks 0, 1) and "
                                            "exiting with 1"], {rank: pids[rank] for rank in (0, 1)})
        check(pids_written("pid", range(2)) == {rank: pids[rank] for rank in (0, 1)}, "node 0 restarted its workers")
    finally:
        cleanup(launchers)


def case_restart_nodes_launcher_stopped():
    # A launcher stopped by a signal leaves the job: it does not restart, and the other node names it at once (not
    # after the heartbeat timeout) and ends with 1 rather than waiting for it to end the attempt.
    launchers, pids = sleeping_nodes(2, [*NODE_RESTARTS, "--max_restarts", "2"])
    try:
        launchers[1].send_signal(signal.SIGTERM)
        code, err, _ = ended(launchers[1], "node 1")
        check(code == 128 + signal.SIGTERM and "restart" not in err, f"node 1 exited with {code}")
        check_lost(launchers[0], "node 0", ["node 1 (ranks 2, 3, at 127.0.0.1) is lost: its launcher left the job "
                                            "(exit code 143) before the nodes had agreed that it was over"],
                   {rank: pids[rank] for rank in (0, 1)}, at_least=0, at_most=2)
    finally:
        cleanup(launchers)


# ------------------------------------------------------------------------------------------------------------------
# Elastic membership (--nnodes MIN:MAX --rdzv_backend c10d): the launcher that can listen on the endpoint hosts the
# rendezvous (node 0); the others join it and get their node ranks from it, attempt by attempt.


def elastic_flags(nnodes, port, extra=()):
    return ["--nnodes", nnodes, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job7",
            "--nproc_per_node", "2", *HEARTBEAT, "--restart_delay", "0", *extra]


def start_elastic(count, nnodes, program, extra=()):
    port = free_port()
    return [start_launcher([ACCEL, "launch", *elastic_flags(nnodes, port, extra), *program]) for _ in range(count)]


def attempt_variables(restart, ranks):
    return {rank: read_variables(os.path.join(WORK, f"vars.{restart}.{rank}")) for rank in ranks}


def check_world(variables, world, nodes):
    ports = {v["MASTER_PORT"] for v in variables.values()}
    check(len(ports) == 1, f"the workers got different ports: {ports}")
    for rank, v in variables.items():
        got = (v.get("RANK"), v.get("WORLD_SIZE"), v.get("GROUP_WORLD_SIZE"), v.get("MASTER_ADDR"),
               v.get("TORCHELASTIC_RUN_ID"))
        check(got == (str(rank), str(world), str(nodes), "127.0.0.1", "job7"), f"rank {rank}'s variables: {got}")


def case_elastic_start():
    # Two launchers, neither told its node rank: the rendezvous numbers them, and the job has 4 ranks.
    launchers = start_elastic(2, "1:2", [PROBE, "flaky", "9", "3", "0", WORK])
    try:
        for node, launcher in enumerate(launchers):
            code, err, _ = ended(launcher, f"launcher {node}")
            check(code == 0, f"launcher {node} exited with {code}")
            check("accel launch: the job starts on 2 nodes (rendezvous 'job7')" in err, f"launcher {node}'s start")
    finally:
        cleanup(launchers)
    check_attempts(read_starts(), 1, 4)
    check_world(attempt_variables(0, range(4)), 4, 2)


def case_elastic_node_lost():
    # A node lost (its launcher stopped) ends the attempt; with --nnodes 1:2 the job goes on on the other node alone,
    # as a job of 2 processes, and ends with 0. The stopped launcher, running again, learns it was taken for lost.
    launchers = start_elastic(2, "1:2", [PROBE, "flaky", "9", "3", "1", WORK], ["--max_restarts", "1"])
    try:
        start = time.monotonic()
        while len(read_starts()) < 4:
            check(time.monotonic() - start < 20, "the workers of attempt 0 did not start within 20 s")
            time.sleep(0.05)
        first = attempt_variables(0, range(4))
        check_world(first, 4, 2)
        # The host (node 0) is whichever launcher listened first: the parent of rank 0's worker.
        with open(f"/proc/{start_pid(read_starts(), 0, 0)}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        host = next(n for n in (0, 1) if launchers[n].pid == parent)
        member = 1 - host
        launchers[member].send_signal(signal.SIGSTOP)
        code, err, seconds = ended(launchers[host], "the host")
        check(code == 0, f"the host exited with {code}")
        for needle in ("node 1 (ranks 2, 3, at 127.0.0.1) is lost: its launcher has not been heard for ",
                       "restarting the job on every node (restart 1 of 1) on 1 node"):
            check(needle in err, f"the host did not say {needle!r}")
        check_world(attempt_variables(1, range(2)), 2, 1)
        check(not os.path.exists(os.path.join(WORK, "vars.1.2")), "ranks 2 and 3 ran again")
        launchers[member].send_signal(signal.SIGCONT)
        code, err, _ = ended(launchers[member], "the member, continued")
        check(code == 1 and "(found by node 0)" in err, f"the member exited with {code}")
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGCONT)
        cleanup(launchers)


def case_elastic_rejoin():
    # The job starts on the host alone (--nnodes 1:2, last call 0.3 s); a node that joins later is admitted at the
    # next restart, where the job grows to 2 nodes (4 ranks).
    port = free_port()
    flags = elastic_flags("1:2", port, ["--max_restarts", "1", "--rdzv_conf", "last_call_timeout=0.3",
                                        "--restart_delay", "2"])
    launchers = [start_launcher([ACCEL, "launch", *flags, PROBE, "flaky", "1", "3", "1", WORK])]
    try:
        time.sleep(1)
        launchers.append(start_launcher([ACCEL, "launch", *flags, PROBE, "flaky", "1", "3", "1", WORK]))
        codes = [ended(launcher, f"launcher {node}")[0] for node, launcher in enumerate(launchers)]
        check(codes == [0, 0], f"the launchers exited with {codes}")
    finally:
        cleanup(launchers)
    check_world(attempt_variables(0, range(2)), 2, 1)
    check_world(attempt_variables(1, range(4)), 4, 2)


def case_elastic_refused():
    # A launcher that joins with another --nproc_per_node is refused, naming both, and exits with 1; the host goes on.
    port = free_port()
    host = start_launcher([ACCEL, "launch", *elastic_flags("1:2", port, ["--rdzv_conf", "last_call_timeout=0.3"]),
                           PROBE, "sleep", WORK])
    try:
        start = time.monotonic()
        while not os.path.exists(os.path.join(WORK, "pid.1")):
            check(time.monotonic() - start < 20, "the host's workers did not start within 20 s")
            time.sleep(0.05)
        flags = elastic_flags("1:2", port)
        flags[flags.index("--nproc_per_node") + 1] = "1"
        code, err, _ = ended(start_launcher([ACCEL, "launch", *flags, PROBE, "exit", "0"]), "the joiner")
        check(code == 1, f"the joiner exited with {code}")
        check(f"the rendezvous at 127.0.0.1:{port} refused this node: it joined with 'job7 1', this rendezvous is "
              f"'job7 2' (--rdzv_id, --nproc_per_node)" in err, "the joiner did not say why it was refused")
        check(host.poll() is None, "the host ended")
    finally:
        cleanup([host])


def case_usage_elastic():
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "1:2", PROBE], "--nnodes 1:2", "--rdzv_backend c10d")
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "3:2", PROBE], "--nnodes", "at most MAX")
    check_usage_error(["--nproc_per_node", "1", "--rdzv_backend", "etcd", PROBE], "--rdzv_backend", "c10d", "'etcd'")
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "1:2", "--rdzv_backend", "c10d", PROBE],
                      "--rdzv_endpoint HOST:PORT")
    check_usage_error(["--nproc_per_node", "1", "--rdzv_endpoint", ":29400", PROBE], "--rdzv_endpoint", "HOST:PORT")
    check_usage_error(["--nproc_per_node", "1", "--rdzv_conf", "timeout=3", PROBE], "last_call_timeout=S")


# ------------------------------------------------------------------------------------------------------------------
# Issue 56: the launchers' port against strangers (CTest: redteam.launcher.NAME for case_redteam_NAME). Each case
# fails on the launcher before it: a stranger's line ended a job, ordered a restart, joined an elastic job or reached
# the terminal raw; a flood spun node 0; a rendezvous that never answered was waited for forever; node 0 interrupted
# left node 1's workers running.


def stranger(port, data, seconds=1.0):
    """Connects to 127.0.0.1:`port` as a process that does not hold the job's secret, sends `data`, and returns what
    it received within `seconds` (or until closed)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(data)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not select.select([connection], [], [], max(deadline - time.monotonic(), 0))[0]:
                break
            chunk = connection.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.decode(errors="replace")


def still_running(launchers, pids, seconds):
    """After `seconds`, every launcher runs and every worker is alive, their pids unchanged (none restarted)."""
    time.sleep(seconds)
    for node, launcher in enumerate(launchers):
        check(launcher.poll() is None, f"node {node}'s launcher ended with {launcher.returncode}")
    check(all(alive(pid) for pid in pids.values()), f"a worker ended: {pids}")
    check(pids_written("pid", pids) == pids, "a worker was started again")


def stopped(launchers):
    """Ends the launchers (SIGKILL) and returns their stderr."""
    errs = []
    for launcher in launchers:
        launcher.kill()
        errs.append(launcher.communicate()[1])
    print("--- stderr of each launcher\n" + "\n---\n".join(errs), flush=True)
    return errs


def connects(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except ConnectionRefusedError:
        return False


def wait_listening(launcher, port, seconds=10):
    """Waits until `launcher` (node 0) listens on 127.0.0.1:`port`."""
    deadline = time.monotonic() + seconds
    while not connects("127.0.0.1", port):
        check(time.monotonic() < deadline and launcher.poll() is None, f"node 0 did not listen within {seconds} s")
        time.sleep(0.05)


def case_redteam_stranger_hello():
    # One line from a process without the job's secret ended a 2-node job on both nodes (it took node 1's place).
    heartbeat_port = free_port()
    launchers, pids = sleeping_nodes(2, heartbeat_port=heartbeat_port)
    try:
        got = stranger(heartbeat_port, b"hello 1 1\n")
        check(got.startswith("challenge ") and "\nrefused " in got and "welcome" not in got,
              f"the stranger was not refused: {got!r}")
        still_running(launchers, pids, 2.5 * HEARTBEAT_TIMEOUT)
    finally:
        errs = stopped(launchers)
    check("refused a connection to the heartbeat port from 127.0.0.1: it did not say hello as a launcher of the job"
          in errs[0], "node 0 did not say it refused the stranger")


def case_redteam_forged_failure():
    # A stranger's "failed" made node 0 order a restart under --max_restarts (its workers stopped and started again).
    heartbeat_port = free_port()
    launchers, pids = sleeping_nodes(2, [*HEARTBEAT, "--max_restarts", "1"], heartbeat_port=heartbeat_port)
    try:
        forged = f"hello 1 2\nfailed 0 3 {int(time.time() * 1e6)} on node 1, forged\n".encode()
        got = stranger(heartbeat_port, forged)
        check("refused " in got and "welcome" not in got, f"the stranger was not refused: {got!r}")
        still_running(launchers, pids, 2.5 * HEARTBEAT_TIMEOUT)
    finally:
        errs = stopped(launchers)
    check(all("forged" not in err and "restarting" not in err for err in errs), "a launcher acted on the forgery")


def case_redteam_elastic_join():
    # Knowing the --rdzv_id was enough to join an elastic job: the stranger was admitted and given the store's port
    # and a rank ("go 0 PORT 2 1 ..."), and the host's workers started with it in the job.
    port = free_port()
    host = start_launcher([ACCEL, "launch", *elastic_flags("2:2", port), PROBE, "sleep", WORK])
    try:
        time.sleep(0.5)
        got = stranger(port, b"join job7 2\n", seconds=2)
        check("refused " in got and "welcome" not in got and "\ngo " not in got, f"the stranger joined: {got!r}")
        time.sleep(1)
        check(host.poll() is None and not os.path.exists(os.path.join(WORK, "pid.0")),
              "the host started its workers: the job formed with the stranger")
    finally:
        stopped([host])


def case_redteam_duplicate_hello():
    # A second hello for node 1 (here from a process that holds the job's secret) replaced the connected node 1,
    # whose connection node 0 closed; it is refused instead, and the job runs on.
    heartbeat_port = free_port()
    secret = {"ACCEL_JOB_SECRET": JOB_SECRET}
    launchers, pids = sleeping_nodes(2, heartbeat_port=heartbeat_port, env_changes=secret)
    try:
        time.sleep(1)  # node 1's launcher has said hello (it tries every 0.2 s from its start)
        second = PlayedNode(heartbeat_port, "hello 1 2")
        check(second.refused is not None and second.refused.startswith("node 1 is connected already, from 127.0.0.1"),
              f"the second hello for node 1 was not refused: {second.refused!r}")
        second.close()
        still_running(launchers, pids, 2.5 * HEARTBEAT_TIMEOUT)
    finally:
        errs = stopped(launchers)
    check("node 1 is connected already" in errs[0], "node 0 did not say why it refused the second hello")


def case_redteam_wrong_secret():
    # A launcher with another secret is refused, and says why (both sides name ACCEL_JOB_SECRET), never the secret.
    heartbeat_port = free_port()
    node0 = start_launcher(node_command(2, 0, free_port(), heartbeat_port, HEARTBEAT, [PROBE, "sleep", WORK]),
                           env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    try:
        node1 = start_launcher(node_command(2, 1, free_port(), heartbeat_port, HEARTBEAT, [PROBE, "sleep", WORK]),
                               env_changes={"ACCEL_JOB_SECRET": "another-secret-0123456789"})
        code, err, _ = ended(node1, "node 1")
        check(code == 1 and "refused this node: this node does not hold the job's secret: give every node's "
                            "launcher the same ACCEL_JOB_SECRET" in err, f"node 1 with another secret: {code}")
    finally:
        errs = stopped([node0])
    for text in (errs[0], err):
        check("ACCEL_JOB_SECRET" in text and JOB_SECRET not in text and "another-secret" not in text,
              f"a launcher did not name ACCEL_JOB_SECRET, or printed a secret: {text!r}")
    check("it does not hold the job's secret" in errs[0], "node 0 did not say why it refused node 1")


def case_redteam_escapes():
    # A stranger's line reached the operator's terminal raw (ANSI escapes: colours, a new window title, a cleared
    # screen); and a node's failure text is printed with its control characters escaped.
    heartbeat_port = free_port()
    node0 = start_launcher(node_command(2, 0, free_port(), heartbeat_port,
                                        ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "10",
                                         "--restart_delay", "0", "--max_restarts", "1"], [PROBE, "sleep", WORK]),
                           env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    err = ""
    try:
        wait_listening(node0, heartbeat_port)
        stranger(heartbeat_port, b"hello 7 1 \x1b[2J\x1b]0;owned\x07\n")
        stranger(heartbeat_port, b"\x1b[31mred\n")
        node1 = PlayedNode(heartbeat_port, "hello 1 2")
        node1.send(f"failed 0 3 {int(time.time() * 1e6)} worker rank 2 \x1b[31mred\x1b]0;title\x07 \u009b1m")
        check(node1.receive().startswith("restart 0 on node 1, worker rank 2 \\x1b[31mred"),
              "node 0 did not order the restart naming the failure, escaped")
        err = stderr_until(node0, "stopping this node's", seconds=10)
        node1.close()
    finally:
        err += stopped([node0])[0]
    check("\x1b" not in err and "\x07" not in err and "\u009b" not in err,
          f"a control character reached the launcher's stderr: {err!r}")
    check("on node 1, worker rank 2 \\x1b[31mred\\x1b]0;title\\x07 \\x9b1m" in err,
          "the failure was not printed with its control characters escaped")


def case_redteam_secret_not_shown():
    # ACCEL_JOB_SECRET reaches neither the workers' environment nor `accel env`'s report; without it, the user's
    # secret file is made readable by its owner alone.
    shown = os.path.join(WORK, "shown")
    code, _, err, _ = launch("--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--heartbeat_timeout",
                             "0", "--nproc_per_node", "1", "sh", "-c", f'echo "${{ACCEL_JOB_SECRET-unset}}" > {shown}',
                             env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    check(code == 0, f"the launcher exited with {code}")
    launchers, _ = sleeping_nodes(2, env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    errs = stopped(launchers)
    with open(shown) as f:
        check(f.read().strip() == "unset", "the worker saw ACCEL_JOB_SECRET")
    result = run_accel("env", env_changes={"ACCEL_JOB_SECRET": JOB_SECRET})
    check(JOB_SECRET not in result.stdout + result.stderr + err + "".join(errs), "the secret was printed")
    check("ACCEL_JOB_SECRET=(set, 38 characters, not shown)" in result.stdout, "accel env does not say it is set")
    launchers, _ = sleeping_nodes(2)
    stopped(launchers)
    path = os.path.join(CONFIG_HOME, "accel", "job_secret")
    check(os.stat(path).st_mode & 0o777 == 0o600, f"{path} is readable by others: {oct(os.stat(path).st_mode)}")
    code, _, err, _ = launch("--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--nproc_per_node",
                             "1", PROBE, "exit", "0", env_changes={"ACCEL_JOB_SECRET": "short"})
    check(code == 2 and "ACCEL_JOB_SECRET holds 5 characters: give at least 16" in err,
          f"a short ACCEL_JOB_SECRET was not refused: {code}")
    os.chmod(path, 0o644)
    code, _, err, _ = launch("--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--nproc_per_node",
                             "1", PROBE, "exit", "0")
    check(code == 2 and "no one else can read or write (chmod 600" in err, f"a readable secret file was used: {code}")


def case_redteam_listen_address():
    # Node 0 listened on every interface; now on --master_addr's address only (127.0.0.1 here: 127.0.0.2, another
    # address of this machine, is refused), or on every interface when asked.
    for flags, reachable in (([], False), (["--heartbeat_all_interfaces"], True)):
        heartbeat_port = free_port()
        node0 = start_launcher(node_command(2, 0, free_port(), heartbeat_port, [*HEARTBEAT, *flags],
                                            [PROBE, "sleep", WORK]))
        try:
            wait_listening(node0, heartbeat_port)
            connected = connects("127.0.0.2", heartbeat_port)
            check(connected == reachable, f"{flags}: the heartbeat port at 127.0.0.2 connected: {connected}")
        finally:
            stopped([node0])


def case_redteam_emfile():
    # Connections held open by the hundred under a low descriptor limit: accept() failed with EMFILE while poll()
    # said the port was ready, and node 0's launcher spun a core. Its CPU time over 3 s is now a small part of it.
    heartbeat_port = free_port()
    node0 = start_launcher(node_command(2, 0, free_port(), heartbeat_port,
                                        ["--heartbeat_interval", "1", "--heartbeat_timeout", "30"],
                                        [PROBE, "sleep", WORK]), descriptors=24)
    connections = []
    try:
        while not os.path.exists(os.path.join(WORK, "pid.1")):
            check(node0.poll() is None, f"node 0 ended with {node0.returncode}")
            time.sleep(0.05)
        for _ in range(60):  # within the port's backlog (64), which the launcher before this fix never emptied
            connections.append(socket.create_connection(("127.0.0.1", heartbeat_port), timeout=5))
        time.sleep(0.5)
        with open(f"/proc/{node0.pid}/stat") as f:
            before = sum(int(field) for field in f.read().rsplit(")", 1)[1].split()[11:13])
        time.sleep(3)
        with open(f"/proc/{node0.pid}/stat") as f:
            after = sum(int(field) for field in f.read().rsplit(")", 1)[1].split()[11:13])
        seconds = (after - before) / os.sysconf("SC_CLK_TCK")
        print(f"node 0's launcher used {seconds:.2f} s of CPU in 3 s under the flood", flush=True)
        check(seconds < 0.3, f"node 0's launcher used {seconds:.2f} s of CPU in 3 s: it spins")
        check(node0.poll() is None, f"node 0 ended with {node0.returncode}")
    finally:
        for connection in connections:
            connection.close()
        err = stopped([node0])[0]
    check("no file descriptor left (ulimit -n 24)" in err, "node 0 did not say it ran out of descriptors")


def case_redteam_join_timeout():
    # An elastic launcher whose --rdzv_endpoint does not resolve, or answers without ever speaking, waited forever
    # without a word; it says what it waits for and gives up after --rdzv_conf join_timeout, as torchrun does. A host
    # that does not gather MIN nodes within it gives up too.
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (its backlog), never speaks
    cases = [("no-such-host.invalid", "cannot resolve no-such-host.invalid"),
             ("127.0.0.1", "what answers there did not complete an accel launcher's handshake")]
    try:
        for host, why in cases:
            endpoint = f"{host}:{silent.getsockname()[1]}"
            flags = ["--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "job7",
                     "--nproc_per_node", "1", "--heartbeat_interval", "0.2", "--heartbeat_timeout", "0.5",
                     "--rdzv_conf", "join_timeout=1.5"]
            code, _, err, seconds = launch(*flags, PROBE, "exit", "0", timeout=20)
            check(code == 1 and seconds < 10, f"{host}: exit code {code} after {seconds:.1f} s")
            for needle in (f"joining the rendezvous 'job7' at {endpoint}; waiting up to 1.5 s",
                           f"the rendezvous 'job7' at {endpoint} was not reached within 1.5 s (--rdzv_conf "
                           "join_timeout): ", why):
                check(needle in err, f"{host}: the launcher did not say {needle!r}")
    finally:
        silent.close()
    port = free_port()
    code, _, err, seconds = launch(*elastic_flags("2:2", port, ["--rdzv_conf", "join_timeout=1,last_call_timeout=0.3"]),
                                   PROBE, "exit", "0", timeout=20)
    check(code == 1 and seconds < 10 and f"the rendezvous 'job7' at 127.0.0.1:{port} gathered 1 of the 2 nodes of "
                                         f"--nnodes 2:2 within 1.0 s (--rdzv_conf join_timeout)" in err,
          f"the host that gathered too few nodes: exit code {code} after {seconds:.1f} s")


def case_redteam_interrupted_node():
    # SIGINT to one node's launcher (node 0, then node 1) before the workers communicate: the other node took its
    # goodbye for the job's end and its workers ran on alone; the job now ends on every node.
    for interrupted in (0, 1):
        for name in os.listdir(WORK):
            os.remove(os.path.join(WORK, name))
        launchers, pids = sleeping_nodes(2)
        try:
            launchers[interrupted].send_signal(signal.SIGINT)
            code, _, _ = ended(launchers[interrupted], f"node {interrupted}")
            check(code == 128 + signal.SIGINT, f"node {interrupted} exited with {code}")
            other = 1 - interrupted
            check_lost(launchers[other], f"node {other}",
                       [f"node {interrupted} (ranks {2 * interrupted}, {2 * interrupted + 1}",
                        "its launcher left the job with exit code 130 (signal 2, Interrupt, stopped it)",
                        f"terminating this node's 2 running workers (ranks {2 * other}, {2 * other + 1})"],
                       {rank: pids[rank] for rank in (2 * other, 2 * other + 1)}, at_least=0, at_most=5)
        finally:
            cleanup(launchers)


# ------------------------------------------------------------------------------------------------------------------
# Command line


def case_usage_missing_value():
    check_usage_error(["--nproc_per_node"], "--nproc_per_node", "needs a value")
    check_usage_error(["--nproc_per_node", "--nnodes", "1", PROBE], "--nproc_per_node", "needs a value")


def case_usage_zero_workers():
    check_usage_error(["--nproc_per_node", "0", PROBE, "exit", "0"], "--nproc_per_node", "'0'")
    check_usage_error(["--nproc_per_node=two", PROBE, "exit", "0"], "--nproc_per_node", "'two'")


def case_usage_missing_nproc():
    check_usage_error([PROBE, "exit", "0"], "--nproc_per_node is required")


def case_usage_node_rank_out_of_range():
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "2", "--node_rank", "2", "--master_addr", "10.0.0.1",
                       PROBE], "--node_rank 2", "--nnodes 2")


def case_usage_master_addr_required():
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "2", "--node_rank", "1", PROBE], "--master_addr")


def case_usage_free_port_multinode():
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "2", "--master_addr", "10.0.0.1", "--master_port", "0",
                       PROBE], "--master_port 0", "--nnodes 1")


def case_usage_bad_port():
    check_usage_error(["--nproc_per_node", "1", "--master_port", "65536", PROBE], "--master_port", "65535")


def case_usage_no_program():
    check_usage_error(["--nproc_per_node", "2"], "no program", "usage: accel launch")
    check_usage_error(["--nproc_per_node", "2", "--"], "no program")


def case_usage_unknown_option():
    check_usage_error(["--nproc_per_node", "2", "--epochs", "3", PROBE], "'--epochs'")
    check_usage_error(["--nproc_per_node", "2", "--prefix_output=yes", PROBE], "--prefix_output takes no value")


def case_usage_restarts():
    check_usage_error(["--nproc_per_node", "1", "--max_restarts", "-1", PROBE], "--max_restarts", "0 to 1000", "'-1'")
    check_usage_error(["--nproc_per_node", "1", "--max-restarts=abc", PROBE], "--max-restarts", "'abc'")
    check_usage_error(["--nproc_per_node", "1", "--max_restarts", "1001", PROBE], "--max_restarts", "'1001'")
    check_usage_error(["--nproc_per_node", "1", "--restart_delay", "-1", PROBE], "--restart_delay", "'-1'")
    check_usage_error(["--nproc_per_node", "1", "--restart_delay", "soon", PROBE], "--restart_delay", "'soon'")


def case_usage_restarts_multinode():
    check_usage_error(["--nproc_per_node", "1", "--nnodes", "2", "--master_addr", "10.0.0.1", "--max_restarts", "1",
                       "--heartbeat_timeout", "0", PROBE], "--max_restarts with --nnodes 2",
                      "needs the launchers' heartbeat connections", "--heartbeat_timeout above 0")


def case_usage_heartbeat():
    multinode = ["--nproc_per_node", "1", "--nnodes", "2", "--master_addr", "10.0.0.1"]
    check_usage_error([*multinode, "--heartbeat_interval", "10", PROBE], "--heartbeat_interval (10 s)",
                      "at most half of --heartbeat_timeout (15 s)", "--heartbeat_timeout 0")
    check_usage_error([*multinode, "--heartbeat_timeout", "1", "--heartbeat_interval", "0", PROBE],
                      "at least 0.01 s")
    check_usage_error([*multinode, "--heartbeat_timeout", "soon", PROBE], "--heartbeat_timeout", "'soon'")
    check_usage_error([*multinode, "--heartbeat_port", "0", PROBE], "--heartbeat_port", "'0'")
    check_usage_error([*multinode, "--master_port", "65535", PROBE], "--master_port 65535", "--heartbeat_port")


def case_program_not_found():
    code, _, err, seconds = launch("--nproc_per_node", "2", "accel-no-such-program")
    check(code == 127, f"expected 127 (the worker could not exec the program), got {code}")
    check("cannot run 'accel-no-such-program'" in err, "the worker did not say it could not run the program")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")


def case_launch_help():
    code, out, _, _ = launch("--help")
    check(code == 0, f"expected exit code 0, got {code}")
    check(out.startswith("usage: accel launch --nproc_per_node N"), "accel launch --help does not print the usage")
    for option in ("--max_restarts R", "--restart_delay S", "--heartbeat_timeout S", "--heartbeat_interval S",
                   "--heartbeat_port P"):
        check(f"\n  {option} " in out, f"accel launch --help does not list {option}")


def run_accel(*args, env_changes=None, timeout=30):
    result = subprocess.run([ACCEL, *args], capture_output=True, text=True, timeout=timeout,
                            env=clean_environment(env_changes), cwd=WORK)
    print(f"$ accel {' '.join(args)}\nexit code {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n"
          f"{result.stderr}---", flush=True)
    return result


def case_cli_version():
    result = run_accel("--version")
    expected = f"accel {os.environ.get('ACCEL_EXPECTED_VERSION', '')}\n"  # the project version, set by CTest
    check(result.returncode == 0 and result.stdout == expected, f"accel --version should print {expected!r}")


def case_cli_help():
    for args in (["--help"], ["help"]):
        result = run_accel(*args)
        check(result.returncode == 0 and "launch" in result.stdout and "merge-weights" in result.stdout,
              f"accel {args[0]} should list the commands")
    result = run_accel("help", "launch")
    check(result.returncode == 0 and result.stdout.startswith("usage: accel launch"),
          "accel help launch should print launch's usage")


def case_cli_unknown_command():
    result = run_accel("lanch")
    check(result.returncode == 2, f"expected exit code 2, got {result.returncode}")
    check("unknown command 'lanch'" in result.stderr and "launch" in result.stderr,
          "the error should name the command and list the commands")
    check(run_accel().returncode == 2, "accel without a command should exit with 2")


# ------------------------------------------------------------------------------------------------------------------
# accel config, and the config file read by accel launch


def write_config(*settings):
    path = os.path.join(WORK, "config.yaml")
    result = run_accel("config", "--config_file", path, *settings)
    check(result.returncode == 0, f"accel config failed with exit code {result.returncode}")
    return path, result


def file_lines(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if not line.startswith("#")]


def case_config_writes_and_updates():
    path, result = write_config("--mixed_precision", "bf16", "--gradient-accumulation-steps=4", "--num_processes", "2")
    check(f"wrote {path}" in result.stdout, "accel config does not say which file it wrote")
    expected = ["mixed_precision: bf16", "gradient_accumulation_steps: 4", "num_processes: 2", "num_machines: 1"]
    check(file_lines(path) == expected, f"the file holds {file_lines(path)}, expected {expected}")
    write_config("--num_processes", "4", "--main_process_port", "0")  # the other settings are kept
    expected = ["mixed_precision: bf16", "gradient_accumulation_steps: 4", "num_processes: 4", "num_machines: 1",
                "main_process_port: 0"]
    check(file_lines(path) == expected, f"after the update the file holds {file_lines(path)}, expected {expected}")
    # ACCEL_CONFIG_FILE names the file when --config_file is not given.
    other = os.path.join(WORK, "sub", "other.yaml")
    result = run_accel("config", "--mixed_precision", "fp16", env_changes={"ACCEL_CONFIG_FILE": other})
    check(result.returncode == 0 and file_lines(other)[0] == "mixed_precision: fp16",
          "accel config did not write the file ACCEL_CONFIG_FILE names (creating its directory)")


def case_config_usage_errors():
    path = os.path.join(WORK, "config.yaml")
    for args, needles in ((["--mixed_precision", "bf32"], ["--mixed_precision", "no, bf16, fp16 or fp8", "'bf32'"]),
                          (["--num_processes", "0"], ["--num_processes", "'0'"]),
                          (["--mixed_precison", "bf16"], ["unknown key 'mixed_precison'", "mixed_precision"]),
                          (["--num_processes", "3", "--num_machines", "2"], ["not a multiple of num_machines 2"]),
                          (["--mixed_precision"], ["needs a value"])):
        result = run_accel("config", "--config_file", path, *args)
        check(result.returncode == 2, f"accel config {args}: expected exit code 2, got {result.returncode}")
        for needle in needles:
            check(needle in result.stderr, f"accel config {args}: the error does not mention {needle!r}")
    check(not os.path.exists(path), "a refused accel config wrote the file anyway")


def case_launch_reads_config_file():
    path, _ = write_config("--mixed_precision", "bf16", "--gradient_accumulation_steps", "4", "--num_processes", "2",
                           "--main_process_port", "0")
    code, _, _, _ = launch("--config_file", path, PROBE, "env", os.path.join(WORK, "vars"))
    check(code == 0, f"expected exit code 0, got {code}")
    check(sorted(f for f in os.listdir(WORK) if f.startswith("vars")) == ["vars.0", "vars.1"],
          "num_processes 2 in the config file should start 2 workers")
    for rank in range(2):
        v = read_variables(os.path.join(WORK, f"vars.{rank}"))
        for name, value in {"WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "bf16",
                            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4", "ACCEL_CONFIG_FILE": path}.items():
            check(v.get(name) == value, f"rank {rank}: {name}={v.get(name)}, expected {value}")
        check(v["MASTER_PORT"] != "29500", "main_process_port 0 should pick a free port")
    # The command line overrides the file, found through ACCEL_CONFIG_FILE this time.
    code, _, _, _ = launch("--nproc_per_node", "3", "--mixed_precision", "fp16", PROBE, "env",
                           os.path.join(WORK, "again"), env_changes={"ACCEL_CONFIG_FILE": path})
    check(code == 0, f"expected exit code 0, got {code}")
    v = read_variables(os.path.join(WORK, "again.2"))
    for name, value in {"WORLD_SIZE": "3", "ACCELERATE_MIXED_PRECISION": "fp16",
                        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}.items():
        check(v.get(name) == value, f"with flags: {name}={v.get(name)}, expected {value}")
    # Without a config file the workers inherit nothing of the kind.
    code, _, _, _ = launch("--nproc_per_node", "1", PROBE, "env", os.path.join(WORK, "plain"))
    v = read_variables(os.path.join(WORK, "plain.0"))
    check(v.get("ACCELERATE_MIXED_PRECISION") == "<unset>" and v.get("ACCEL_CONFIG_FILE") == "",
          "without a config file, the launcher should not set the run's variables")


def case_launch_config_precedence():
    # The command line over the launcher's environment over the file, as accel::read_run_config() in a program.
    path, _ = write_config("--mixed_precision", "bf16", "--gradient_accumulation_steps", "4", "--num_processes", "2")
    code, _, _, _ = launch("--config_file", path, PROBE, "env", os.path.join(WORK, "env"),
                           env_changes={"ACCELERATE_MIXED_PRECISION": "no"})
    check(code == 0, f"expected exit code 0, got {code}")
    v = read_variables(os.path.join(WORK, "env.0"))
    check(v.get("ACCELERATE_MIXED_PRECISION") == "no", "a variable set in the environment must win over the file")
    check(v.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS") == "4", "the file's other setting still applies")
    code, _, _, _ = launch("--config_file", path, "--mixed_precision", "fp16", PROBE, "env",
                           os.path.join(WORK, "flag"), env_changes={"ACCELERATE_MIXED_PRECISION": "no"})
    v = read_variables(os.path.join(WORK, "flag.0"))
    check(v.get("ACCELERATE_MIXED_PRECISION") == "fp16", "--mixed_precision must win over the environment")
    # num_processes counts the whole job: with --nnodes 2 on the command line, each node starts half.
    code, _, _, _ = launch("--config_file", path, "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
                           PROBE, "env", os.path.join(WORK, "node"))
    check(code == 0, f"expected exit code 0, got {code}")
    nodes = sorted(f for f in os.listdir(WORK) if f.startswith("node."))
    check(nodes == ["node.1"], f"node 1 of 2 should start 1 of the job's 2 processes (rank 1), got {nodes}")
    check(read_variables(os.path.join(WORK, "node.1")).get("WORLD_SIZE") == "2", "the job has 2 processes")
    write_config("--num_processes", "3")
    check_usage_error(["--config_file", path, "--nnodes", "2", "--master_addr", "10.0.0.1", PROBE],
                      "num_processes 3", "give --nproc_per_node")


def case_launch_config_file_errors():
    path = os.path.join(WORK, "bad.yaml")
    with open(path, "w") as f:
        f.write("# a config\nnum_processes: 2\nmixed_precision: bf32\n")
    check_usage_error(["--config_file", path, PROBE], f"{path}:3: mixed_precision must be no, bf16, fp16 or fp8, not 'bf32'")
    with open(path, "w") as f:
        f.write("num_process: 2\n")
    check_usage_error(["--config_file", path, PROBE], f"{path}:1: unknown key 'num_process'", "num_processes")
    missing = os.path.join(WORK, "missing.yaml")
    code, _, err, _ = launch(PROBE, env_changes={"ACCEL_CONFIG_FILE": missing})
    check(code == 2 and f"cannot read the config file {missing}" in err and "accel config" in err,
          "a missing ACCEL_CONFIG_FILE should be a usage error naming the file and accel config")
    check_usage_error([PROBE, "exit", "0"], "--nproc_per_node is required", "accel config --num_processes")


# ------------------------------------------------------------------------------------------------------------------
# accel env and accel test


def case_cli_merge_weights_flags():
    # Issue 56, item 14: Accelerate's --unsafe_serialization and --remove_checkpoint_dir were refused with the usage
    # line alone; they are taken (accel-selftest then reads the checkpoint: here none, or no accel-selftest), and a
    # flag refused is named.
    result = run_accel("merge-weights", "--unsafe_serialization", "--remove-checkpoint-dir", "no-checkpoint", "out")
    check(result.returncode != 2 and "usage" not in result.stderr and "option" not in result.stderr,
          "accel merge-weights refused Accelerate's flags")
    check("no checkpoint at no-checkpoint" in result.stderr or "accel-selftest" in result.stderr,
          "accel merge-weights did not hand the flags to accel-selftest")
    for flag, why in (("--safe_serialization", "unknown option '--safe_serialization'"),
                      ("--unsafe_serialization=yes", "--unsafe_serialization takes no value")):
        result = run_accel("merge-weights", flag, "checkpoint", "out")
        check(result.returncode == 2 and why in result.stderr, f"{flag} was not refused by name")


def case_cli_env():
    path, _ = write_config("--mixed_precision", "bf16")
    result = run_accel("env", env_changes={"ACCEL_CONFIG_FILE": path, "ACCELERATE_MIXED_PRECISION": "bf16"})
    check(result.returncode == 0, f"expected exit code 0, got {result.returncode}")
    facts = {}
    for line in result.stdout.splitlines():
        if ":" in line and not line.startswith(" "):
            name, value = line.split(":", 1)
            facts[name] = value.strip()
    for name in ("accel", "platform", "CPU", "LibTorch", "LibTorch CUDA", "Gloo", "CUDA driver", "CUDA runtime",
                 "NCCL", "config file", "environment"):
        check(name in facts, f"accel env does not report {name!r}")
    check(re.match(r"\d+\.\d+", facts["LibTorch"]) is not None, f"LibTorch's version is {facts['LibTorch']!r}")
    check(facts["accel"] == os.environ.get("ACCEL_EXPECTED_VERSION"), "accel env reports another version")
    check(facts["config file"] == path and "  mixed_precision: bf16" in result.stdout,
          "accel env does not show the config file and its settings")
    check("  ACCELERATE_MIXED_PRECISION=bf16" in result.stdout and "  ACCEL_CONFIG_FILE=" + path in result.stdout,
          "accel env does not list accel's environment variables")


def case_cli_test():
    result = run_accel("test", timeout=120, env_changes={"ACCELERATE_MIXED_PRECISION": "fp16"})
    check(result.returncode == 0, f"accel test failed with exit code {result.returncode}")
    lines = result.stdout.strip().splitlines()
    check(lines and lines[-1] == "accel works on this machine", "accel test does not end with its verdict")
    check(sum(line.startswith("ok: ") for line in lines) == 3, "accel test should report three checks")


def main():
    global ACCEL, PROBE, WORK
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ACCEL, PROBE, name = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    case = globals().get("case_" + name)
    if case is None:
        sys.exit(f"unknown case {name!r}")
    global CONFIG_HOME
    with tempfile.TemporaryDirectory(prefix="accel-launch-") as WORK, \
            tempfile.TemporaryDirectory(prefix="accel-launch-config-") as CONFIG_HOME:
        try:
            case()
        except CheckFailed as failure:
            print(f"FAILED: {failure}", flush=True)
            sys.exit(1)
    print("passed")


if __name__ == "__main__":
    main()
