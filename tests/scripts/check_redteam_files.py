"""redteam.estimate_memory_*: `accel estimate-memory` on hostile files. Each must end with a clear error (exit 1,
as for a missing file) naming the file and what is wrong (the limit it passes), never a crash by a signal, a wrong
figure or memory held for what a file claims.

  nested_index      a model.safetensors.index.json whose metadata nests a million arrays deep (a recursion on it
                    overflowed the stack): refused at the depth limit, 128
  header_limit      a file whose first 8 bytes claim a header of 1 GiB (sparse: no disk): refused before a byte of it
                    is read, the tool's peak resident memory (getrusage) under 64 MiB
  element_overflow  a tensor of shape [2^32, 2^32]: its element count passes 64 bits (it printed negative figures)
  bad_escape        a header whose name holds "\\u" without four hex digits (the error said only "stoul")

Usage: check_redteam_files.py CASE ACCEL WORK_DIR
"""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path


def write_safetensors(path, header_text, data=b""):
    text = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def estimate(accel, model):
    result = subprocess.run([accel, "estimate-memory", str(model), "--bytes"], capture_output=True, text=True,
                            timeout=50)
    if result.returncode < 0:
        sys.exit(f"estimate-memory was killed by signal {-result.returncode}: {result.stderr[-500:]}")
    return result


def refused(result, *expected):
    message = result.stderr.strip()
    if result.returncode != 1 or not all(part in message for part in expected):
        sys.exit(f"expected exit 1 and an error with {expected}, got {result.returncode}: {message[-1000:]}")
    print(f"refused: {message[:300]}")


def nested_index(accel, work):
    write_safetensors(work / "model-00001-of-00001.safetensors",
                      json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), b"\0" * 8)
    depth = 1_000_000
    index = work / "model.safetensors.index.json"
    index.write_text('{"metadata": {"deep": ' + "[" * depth + "]" * depth + '}, "weight_map": {"w": '
                     '"model-00001-of-00001.safetensors"}}')
    refused(estimate(accel, index), str(index), "values nest more than 128 levels deep")


def header_limit(accel, work):
    model = work / "huge-header.safetensors"
    with open(model, "wb") as out:
        out.write(struct.pack("<Q", 1 << 30))
        out.truncate((1 << 30) + 64)  # sparse
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = estimate(accel, model)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    model.unlink()
    refused(result, str(model), "its header claims 1073741824 bytes, more than the 100000000 a header may have")
    if peak_kib > 64 * 1024:
        sys.exit(f"estimate-memory peaked at {peak_kib} KiB resident (before: {before}): it read what it refused")
    print(f"peak resident memory {peak_kib} KiB")


def element_overflow(accel, work):
    model = work / "overflow.safetensors"
    write_safetensors(model, json.dumps({"w": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}))
    refused(estimate(accel, model), str(model), "tensor w has a shape of more elements than 64 bits count")
    big = work / "big.safetensors"  # fits in 64 bits, but not in the estimate's bytes
    write_safetensors(big, json.dumps({"w": {"dtype": "F64", "shape": [1 << 31, 1 << 30], "data_offsets": [0, 0]}}))
    refused(estimate(accel, big), str(big), "tensor w has 2305843009213693952 elements")


def bad_escape(accel, work):
    model = work / "escape.safetensors"
    write_safetensors(model, '{"w\\uzzzz": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8)
    refused(estimate(accel, model), str(model), "a \\u escape is not followed by 4 hexadecimal digits")


def main():
    case, accel, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    {"nested_index": nested_index, "header_limit": header_limit, "element_overflow": element_overflow,
     "bad_escape": bad_escape}[case](accel, work)


if __name__ == "__main__":
    main()
