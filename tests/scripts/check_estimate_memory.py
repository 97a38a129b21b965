"""`accel estimate-memory` on generated safetensors files (one file, and a Hugging Face index over two): the exact
bytes it prints (--bytes) against the formulas of docs/big-models.md worked out by hand for these tensors, the same
figures from the index as from the single file, a file whose data is cut off (only the header is read), shard units
named by --shard_units, and the errors for a missing file, an unknown optimizer and a pattern that matches nothing."""
import json
import struct
import subprocess
import sys
from pathlib import Path

accel, work = sys.argv[1], Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)

# name: (dtype, shape, bytes per element)
TENSORS = {"a.weight": ("F32", [10, 3], 4), "b.bias": ("F16", [7], 2), "c.steps": ("I64", [4], 8)}


def write_safetensors(path, names, truncate=False):
    header, offset = {}, 0
    for name in names:
        dtype, shape, size = TENSORS[name]
        count = 1
        for d in shape:
            count *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + count * size]}
        offset += count * size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    data = b"\0" * (0 if truncate else offset)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def run(*args):
    return subprocess.run([accel, "estimate-memory", *args], capture_output=True, text=True, timeout=60)


# Worked by hand (AdamW: 2 state tensors per element; process 0 owns the largest slices):
#   P = 1, data_parallel: parameters 30*4 + 7*2 + 4*8 = 166; buckets (30 + 1)*4 + (7 + 1)*2 = 140;
#     state 2*(120 + 14) = 268: between steps 166 + 140 + 268 = 574; end of backward + gradients 134 = 708.
#   P = 3, zero1: parameters 166, buckets 140, state 2*(10*4 + 3*2) = 92: 398; + gradients 134: 532.
#   P = 3, zero2: parameters 166, state 92: 258; + gradient segments (10 + 1)*4 + (3 + 1)*2 = 52: 310.
#   P = 3, fully_sharded: slices 40 + 6 + 32 (the integer tensor stays whole) + state 92 = 170; at the end of
#     backward the full parameters besides (166 + 46 = 212), segments 52, state 92: 356.
#   bf16 adds the forward's 2-byte casts of the float32 weights: 60 at the end of backward.
expected = {
    ("no", "data_parallel", 1): (574, 708),
    ("no", "zero1", 3): (398, 532),
    ("no", "zero2", 3): (258, 310),
    ("no", "fully_sharded", 3): (170, 356),
    ("bf16", "data_parallel", 1): (574, 768),
    ("bf16", "fully_sharded", 3): (170, 416),
}


def figures(result):
    assert result.returncode == 0, result.stderr
    out = {}
    for line in result.stdout.splitlines():
        precision, policy, processes, rest, step = line.split()
        out[(precision, policy, int(processes))] = (int(rest), int(step))
    return out


single = work / "model.safetensors"
write_safetensors(single, list(TENSORS))
got = figures(run(str(single), "--num_processes", "1,3", "--mixed_precision", "no,bf16", "--bytes"))
for key, value in expected.items():
    assert got[key] == value, f"{key}: printed {got[key]}, expected {value}"
assert len(got) == 2 * 4 * 2, got

write_safetensors(work / "model-00001-of-00002.safetensors", ["a.weight"])
write_safetensors(work / "model-00002-of-00002.safetensors", ["b.bias", "c.steps"])
index = work / "model.safetensors.index.json"
index.write_text(json.dumps({"metadata": {"total_size": 166, "nested": [1, {"x": True}]},
                             "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                            "b.bias": "model-00002-of-00002.safetensors",
                                            "c.steps": "model-00002-of-00002.safetensors"}}))
from_index = figures(run(str(index), "--num_processes", "1,3", "--mixed_precision", "no,bf16", "--bytes"))
assert from_index == got, (from_index, got)

header_only = work / "header-only.safetensors"  # the data cut off: the command reads headers only
write_safetensors(header_only, list(TENSORS), truncate=True)
assert figures(run(str(header_only), "--num_processes", "1,3", "--mixed_precision", "no,bf16", "--bytes")) == got

table = run(str(single))
assert table.returncode == 0 and "41 parameters (37 trainable)" in table.stdout, table.stdout
rows = [l.split() for l in table.stdout.splitlines() if l.split()[:1] in (["no"], ["bf16"], ["fp16"])]
assert len(rows) == 3 * 4 * 4, table.stdout  # no, bf16, fp16 x 4 policies x 1, 2, 4, 8 processes
assert ["no", "fully_sharded", "4", "140", "B", "316", "B"] in rows, table.stdout  # P = 4: slices 8*4 + 2*2 + 32, state 2*36

missing = run(str(work / "nothing.safetensors"))
assert missing.returncode == 1 and "cannot open" in missing.stderr and "nothing.safetensors" in missing.stderr, missing
unknown = run(str(single), "--optimizer", "lion")
assert unknown.returncode == 2 and "unknown optimizer 'lion'" in unknown.stderr, unknown.stderr
# Shard units (--shard_units): two units of 20 float32 elements and a tensor of 6 outside them, P = 2, process 0:
#   slices 10*4 + 10*4 + 3*4 = 92, state 2*92 = 184: between steps 276 (as without units).
#   A step: the unit tensors' slices only (40 + 40) and the outside tensor whole beside its slice (24 + 12): 116;
#   gradient segments (10 + 1)*4 * 2 + (3 + 1)*4 = 104; state 184: 404. Plus, for a moment, 3 units whole (3*80)
#   and 5 of a unit's buckets (5 * 2*(10 + 1)*4 = 440): 1084. Without units the whole model stays gathered:
#   slices 92 + the model 184 = 276, + 104 + 184 = 564.
TENSORS.update({"layers.0.w": ("F32", [4, 5], 4), "layers.1.w": ("F32", [4, 5], 4), "head.w": ("F32", [6], 4)})
layered = work / "layered.safetensors"
write_safetensors(layered, ["layers.0.w", "layers.1.w", "head.w"])
with_units = figures(run(str(layered), "--num_processes", "2", "--mixed_precision", "no", "--shard_units",
                         r"layers\.[0-9]+", "--bytes"))
without_units = figures(run(str(layered), "--num_processes", "2", "--mixed_precision", "no", "--bytes"))
assert with_units[("no", "fully_sharded", 2)] == (276, 1084), with_units
assert without_units[("no", "fully_sharded", 2)] == (276, 564), without_units
for policy in ("data_parallel", "zero1", "zero2"):  # units are fully_sharded's alone
    assert with_units[("no", policy, 2)] == without_units[("no", policy, 2)], (policy, with_units, without_units)
unmatched = run(str(layered), "--shard_units", r"model\.layers\.[0-9]+")
assert unmatched.returncode == 2 and "matches the start of no tensor's name" in unmatched.stderr, unmatched.stderr
bad_pattern = run(str(layered), "--shard_units", "layers.[0-9")
assert bad_pattern.returncode == 2 and "is not one" in bad_pattern.stderr, bad_pattern.stderr

TENSORS["d.codes"] = ("U4", [2], 1)
odd = work / "odd-dtype.safetensors"
write_safetensors(odd, ["a.weight", "d.codes"])
refused = run(str(odd))
assert refused.returncode == 1 and "tensor d.codes has the dtype U4, which the estimate does not know" in refused.stderr, \
    refused.stderr
print("estimate-memory: exact figures, index and header-only reads, shard units, errors: ok")
