#!/usr/bin/env python3
"""Runs `accel launch` on launch_probe and checks one behaviour (a case).

usage: check_launch.py ACCEL LAUNCH_PROBE CASE

Each `def case_NAME()` below is one CTest test, launcher.NAME (tests/launcher/CMakeLists.txt reads the names
from this file). Python standard library only.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

ACCEL = ""
PROBE = ""
WORK = ""  # a fresh temporary directory per run


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def launch(*args, env_changes=None, timeout=30):
    """Runs `accel launch ARGS...`; returns (exit code, stdout, stderr, seconds)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.update(env_changes or {})
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
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "OMP_NUM_THREADS": 1}
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


def launch_and_signal(args, signals, probe_mode="sleep"):
    """Starts `accel launch ARGS... launch_probe PROBE_MODE`, sends it `signals` (0.2 s apart) once every worker has
    started; returns (exit code, stderr, seconds, worker pids)."""
    command = [ACCEL, "launch", *args, PROBE, probe_mode, WORK]
    print("$", " ".join(command), flush=True)
    nproc = int(args[args.index("--nproc_per_node") + 1])
    # The launcher must see the signals' default dispositions, even where this script was started with SIGINT
    # ignored (a background job of a non-interactive shell).
    restore = lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)]
    start = time.monotonic()
    launcher = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=WORK, preexec_fn=restore)
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


def case_program_not_found():
    code, _, err, seconds = launch("--nproc_per_node", "2", "accel-no-such-program")
    check(code == 127, f"expected 127 (the worker could not exec the program), got {code}")
    check("cannot run 'accel-no-such-program'" in err, "the worker did not say it could not run the program")
    check(seconds < 10, f"took {seconds:.1f} s, expected well under 10 s")


def case_launch_help():
    code, out, _, _ = launch("--help")
    check(code == 0, f"expected exit code 0, got {code}")
    check(out.startswith("usage: accel launch --nproc_per_node N"), "accel launch --help does not print the usage")


def run_accel(*args):
    result = subprocess.run([ACCEL, *args], capture_output=True, text=True, timeout=30)
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
        check(result.returncode == 0 and "launch" in result.stdout, f"accel {args[0]} should list the commands")
    result = run_accel("help", "launch")
    check(result.returncode == 0 and result.stdout.startswith("usage: accel launch"),
          "accel help launch should print launch's usage")


def case_cli_unknown_command():
    result = run_accel("lanch")
    check(result.returncode == 2, f"expected exit code 2, got {result.returncode}")
    check("unknown command 'lanch'" in result.stderr and "launch" in result.stderr,
          "the error should name the command and list the commands")
    check(run_accel().returncode == 2, "accel without a command should exit with 2")


def main():
    global ACCEL, PROBE, WORK
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ACCEL, PROBE, name = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    case = globals().get("case_" + name)
    if case is None:
        sys.exit(f"unknown case {name!r}")
    with tempfile.TemporaryDirectory(prefix="accel-launch-") as WORK:
        try:
            case()
        except CheckFailed as failure:
            print(f"FAILED: {failure}", flush=True)
            sys.exit(1)
    print("passed")


if __name__ == "__main__":
    main()
