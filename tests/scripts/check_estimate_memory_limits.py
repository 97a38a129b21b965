"""`accel estimate-memory --shard_units` against a hostile file (issue 56, item 4): a 300,000-character tensor name
matched by '(a|b)*' overflowed the stack in std::regex_search (SIGSEGV). Names and patterns longer than the stated
limit are refused with exit code 2 naming it; a name at the limit is still matched."""
import json
import struct
import subprocess
import sys
from pathlib import Path

from checks import check

LIMIT = 1024  # tools/accel_cli/estimate_memory.cpp: longest_shard_units_text
accel, work = sys.argv[1], Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)


def model_with_name(name):
    path = work / f"name-{len(name)}.safetensors"
    header = json.dumps({name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    return path


def estimate(model, pattern):
    result = subprocess.run([accel, "estimate-memory", str(model), "--shard_units", pattern], capture_output=True,
                            text=True, timeout=60)
    print(f"$ accel estimate-memory {model.name} --shard_units ({len(pattern)} characters): exit {result.returncode}\n"
          f"{result.stderr[:400]}", flush=True)
    return result


hostile = estimate(model_with_name("ab" * 150_000), "(a|b)*")
check(hostile.returncode == 2 and f"has a name of 300000 characters; --shard_units matches names of at most {LIMIT}"
      in hostile.stderr, f"a 300,000-character name was not refused with exit 2 naming the limit: {hostile.returncode}")
at_limit = estimate(model_with_name("ab" * (LIMIT // 2)), "(a|b)*")
check(at_limit.returncode == 0, f"a name of {LIMIT} characters was not matched: {at_limit.returncode}")
long_pattern = estimate(model_with_name("layer.0.weight"), "(" * 5000 + "a" + ")" * 5000)
check(long_pattern.returncode == 2 and f"--shard_units is 10001 characters long; at most {LIMIT} are taken"
      in long_pattern.stderr, f"a 10,001-character pattern was not refused naming the limit: {long_pattern.returncode}")
print("names and patterns beyond the limit refused, naming it; a name at the limit matched")
