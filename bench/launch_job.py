"""What the comparison drivers share: one job under `accel launch` (2 processes unless told), and the figures it
printed last."""
import os
import subprocess
import sys


def run_job(launcher, command, may_fail=False, launch_flags=("--nproc_per_node", "2")):
    """The fields of the last line the job printed (process 0's figures); None for a job that failed and `may_fail`,
    else a failed job ends the driver with its output."""
    # One thread per process, OpenBLAS included; no bytecode, so that the Python jobs' imports of bench/ modules
    # leave no __pycache__ in the source tree.
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([launcher, "launch", *launch_flags, "--master_port", "0", *command],
                         env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if out.returncode == 0 and lines:
        return lines[-1].split()
    if may_fail:
        return None
    sys.exit(f"job failed ({out.returncode}): {' '.join(command)}\n{out.stdout}\n{out.stderr}")
