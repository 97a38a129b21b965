"""Python's json module reads the Chrome trace that acc.profile() writes.

Runs the hidden case "write a profiler trace for Python" of accel_tests (tests/unit/test_profiler.cpp): 3 training
steps of a 4 -> 8 -> 2 MLP on batches of 5 rows under acc.profile(record_shapes, output_trace_dir=$WORK_DIR/run).
Then parses run/profile_0.json with json.load (strict: NaN and Infinity refused) and checks its operator events.

Usage: check_profile_trace.py ACCEL_TESTS WORK_DIR
"""
import collections
import json
import os
import sys

from hidden_case import run_hidden_case


def refuse_constant(name):
    sys.exit(f"profile_0.json holds {name}, which is not JSON")


def main():
    accel_tests, work_dir = sys.argv[1], sys.argv[2]
    run_hidden_case(accel_tests, "write a profiler trace for Python", work_dir)
    with open(os.path.join(work_dir, "run", "profile_0.json"), encoding="utf-8") as f:
        trace = json.load(f, parse_constant=refuse_constant)
    events = trace["traceEvents"]
    operators = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    counts = collections.Counter(e["name"] for e in operators)
    expected = {"aten::addmm": 6, "aten::mm": 9, "aten::relu": 3, "aten::mse_loss": 3}
    for name, count in expected.items():
        if counts[name] != count:
            sys.exit(f"{counts[name]} '{name}' events, expected {count}")
    dims = sorted(e["args"]["Input Dims"] for e in operators if e["name"] == "aten::addmm")
    expected_dims = sorted(3 * [[[8], [5, 4], [4, 8], [], []], [[2], [5, 8], [8, 2], [], []]])
    if dims != expected_dims:
        sys.exit(f"aten::addmm's input shapes are {dims}, expected {expected_dims}")
    for e in operators:
        if not isinstance(e["ts"], (int, float)) or not isinstance(e["dur"], (int, float)) or e["dur"] < 0:
            sys.exit(f"event without a valid time: {e}")
    print(f"profile_0.json: {len(events)} events read by Python's json, {len(operators)} operators as trained")


if __name__ == "__main__":
    main()
