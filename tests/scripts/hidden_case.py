"""Runs one of accel_tests' hidden cases (tests/unit/test_tracking.cpp), which logs into $ACCEL_TRACKING_DIR/run/, in a
fresh WORK_DIR; shared by the checks that then read what it wrote."""
import os
import shutil
import subprocess
import time


def run_hidden_case(accel_tests, case, work_dir):
    """Returns the wall-clock times before and after the case ran, which bound every wall_time it logged."""
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    started = time.time()
    subprocess.run([accel_tests, case], check=True, env={**os.environ, "ACCEL_TRACKING_DIR": work_dir})
    return started, time.time()
