"""Python's json module reads accel's metrics.jsonl and config.json exactly.

Runs the hidden case "write a JSON lines file for Python" of accel_tests (tests/unit/test_tracking.cpp), which logs
into $ACCEL_TRACKING_DIR/run/, then parses every line with json.loads and compares keys (in order), values
(non-finite ones included) and steps with what the case logged.

Usage: check_jsonl.py ACCEL_TESTS WORK_DIR
"""
import json
import math
import os
import sys

from hidden_case import run_hidden_case


def same(a, b):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def check_object(what, got, expected):
    if list(got) != list(expected):
        sys.exit(f"{what}: keys {list(got)}, expected {list(expected)}")
    for key, value in expected.items():
        if not same(got[key], value):
            sys.exit(f"{what}: {key!r} is {got[key]!r}, expected {value!r}")


def main():
    accel_tests, work_dir = sys.argv[1], sys.argv[2]
    started, ended = run_hidden_case(accel_tests, "write a JSON lines file for Python", work_dir)

    with open(os.path.join(work_dir, "run", "metrics.jsonl"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines[-1] != "":
        sys.exit("metrics.jsonl does not end with a newline")
    records = [json.loads(line) for line in lines[:-1]]
    expected = [
        {"step": 0, "loss": 0.5, "lr": 0.001},
        {"step": 1, "loss": 1 / 3, "up": math.inf, "down": -math.inf, "missing": math.nan},
        {"step": 7, 'say "hi"\\\n\t': 2.5e-300, "na\u00efve": 1e300, "count": 42, "loss": 0.125},
    ]
    if len(records) != len(expected):
        sys.exit(f"{len(records)} records, expected {len(expected)}")
    for i, (record, wanted) in enumerate(zip(records, expected)):
        wall_time = record.pop("wall_time", None)
        if not isinstance(wall_time, float) or not started - 1 <= wall_time <= ended + 1:
            sys.exit(f"line {i + 1}: wall_time {wall_time!r} is not between {started} and {ended}")
        check_object(f"line {i + 1}", record, wanted)

    with open(os.path.join(work_dir, "run", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    check_object("config.json", config, {"lr": 0.01, "optimizer": "adamw", "nesterov": False, "ratio": math.nan})
    print(f"metrics.jsonl: {len(records)} records and config.json read by Python's json as logged")


if __name__ == "__main__":
    main()
