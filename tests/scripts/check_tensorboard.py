"""The tensorboard package reads accel's TensorBoard event file scalar for scalar.

Runs the hidden case "write a TensorBoard file for Python" of accel_tests (tests/unit/test_tracking.cpp), which logs
into $ACCEL_TRACKING_DIR/run/, then loads the run with tensorboard's EventAccumulator and compares, for every tag,
the (step, value) sequence with what the case logged (values as float32, as TensorBoard stores simple_value) and
each wall time with the run's start and end.

Usage: check_tensorboard.py ACCEL_TESTS WORK_DIR   (with the build's .venv Python, which has tensorboard)
"""
import math
import os
import struct
import sys

import tensorboard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hidden_case import run_hidden_case


def float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def logged():
    """tag -> [(step, value)], exactly as the C++ case logs them."""
    expected = {"loss": [], "lr": []}
    for step in range(50):
        expected["loss"].append((step, 1.0 / (step + 1)))
        expected["lr"].append((step, 0.001 * step))
    expected["train/accuracy"] = [(100, 0.875)]
    expected["count"] = [(100, 42.0)]
    expected["loss"] += [(100, 0.125), (101, math.inf)]
    expected["big"] = [(100, 1e30), (101, -math.inf)]
    expected["tiny"] = [(100, -2.5e-30), (101, math.nan)]
    return expected


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def main():
    accel_tests, work_dir = sys.argv[1], sys.argv[2]
    started, ended = run_hidden_case(accel_tests, "write a TensorBoard file for Python", work_dir)

    run = os.path.join(work_dir, "run")
    files = [f for f in os.listdir(run) if f.startswith("events.out.tfevents.")]
    if len(files) != 1:
        sys.exit(f"expected one event file in {run}, found {files}")
    accumulator = EventAccumulator(run, size_guidance={"scalars": 0})  # 0: keep every scalar
    accumulator.Reload()
    expected = logged()
    tags = accumulator.Tags()["scalars"]
    if sorted(tags) != sorted(expected):
        sys.exit(f"scalar tags {sorted(tags)}, expected {sorted(expected)}")
    count = 0
    for tag, wanted in expected.items():
        events = accumulator.Scalars(tag)
        got = [(e.step, e.value) for e in events]
        if len(got) != len(wanted):
            sys.exit(f"{tag}: {len(got)} scalars, expected {len(wanted)}")
        for (step, value), (wanted_step, wanted_value) in zip(got, wanted):
            if step != wanted_step or not same(value, float32(wanted_value)):
                sys.exit(f"{tag}: ({step}, {value!r}), expected ({wanted_step}, {float32(wanted_value)!r})")
        for e in events:
            if not started - 1 <= e.wall_time <= ended + 1:
                sys.exit(f"{tag}: wall_time {e.wall_time} is not between {started} and {ended}")
        count += len(got)
    print(f"tensorboard {tensorboard.__version__}'s EventAccumulator read {count} scalars in {len(expected)} tags, "
          "each step and float32 value as logged")


if __name__ == "__main__":
    main()
