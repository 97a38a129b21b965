"""The Python side of the safetensors interop test, run with the build's .venv (torch 2.13, safetensors, numpy):
   interop.py check FILE   -- accel's file, read three ways with exact values: by the format (numpy and the
                              standard library), by the safetensors package, and into torch tensors
   interop.py write DIR    -- a torch.nn.Sequential's state dict (parameters and BatchNorm buffers, after a training
                              forward) saved with safetensors.torch, and a probe input with the eval output
   interop.py verify DIR   -- what accel saved back from that state dict (sharded, with an index) equals it exactly"""
import json
import os
import struct
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_by_format(path):
    """The file as the format describes it: 8-byte little-endian header length, JSON header, raw data."""
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = body[begin:end]
        if entry["dtype"] == "BF16":  # numpy has no bfloat16: widen the 16 bits to float32's high half
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=np.dtype(NUMPY_DTYPES[entry["dtype"]]).newbyteorder("<"))
        tensors[name] = values.reshape(entry["shape"])
    return tensors


def expected_tensors():
    """What tests/programs/checkpoint_tool.cpp writes, built independently with torch 2.13."""
    return {
        "fc.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
        "fc.bias": torch.tensor([-1.5, 2.25], dtype=torch.float64),
        "steps": torch.tensor([7, 8, 9], dtype=torch.int64),
        "half": torch.tensor([0.5, -2.0]).to(torch.bfloat16),
        "float16": torch.tensor([0.1, 65504.0, -0.0]).to(torch.float16),
        "int32": torch.tensor([-2**31, 2**31 - 1], dtype=torch.int32),
        "int16": torch.tensor([-32768, 32767], dtype=torch.int16),
        "int8": torch.tensor([-128, 127], dtype=torch.int8),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def same(a, b):
    """Equal dtype, shape and bits (so -0.0 and NaN payloads count)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def check(path):
    expected = expected_tensors()
    by_format = read_by_format(path)
    assert sorted(by_format) == sorted(expected), f"names {sorted(by_format)}"
    for name, tensor in expected.items():  # the format reading (bf16 widened to float32 is exact)
        widened = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        assert np.array_equal(by_format[name], widened.numpy()), f"{name}: {by_format[name]} by the format"
    loaded = load_file(path)  # the safetensors package, into torch 2.13
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert same(loaded[name], tensor), f"{name}: {loaded[name]} ({loaded[name].dtype}), expected {tensor}"
    with safe_open(path, framework="pt") as f:  # lazily, one tensor at a time, as transformers reads checkpoints
        for name in f.keys():
            assert same(f.get_tensor(name), expected[name]), name
    print(f"accel's file read by the format, by safetensors {sys.modules['safetensors'].__version__} and into "
          f"torch {torch.__version__}: {len(expected)} tensors, every dtype, values exact")


def python_model():
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model.train()
    with torch.no_grad():
        model(torch.randn(16, 4) * 3 + 1)  # moves the BatchNorm running statistics and num_batches_tracked
    return model


def write(directory):
    model = python_model()
    save_file(model.state_dict(), os.path.join(directory, "python_state.safetensors"))
    x = torch.randn(5, 4)
    with torch.no_grad():
        y = model.eval()(x)
    save_file({"x": x, "y": y}, os.path.join(directory, "python_probe.safetensors"))


def verify(directory):
    original = python_model().state_dict()
    index_path = os.path.join(directory, "roundtrip", "model.safetensors.index.json")
    weight_map = json.load(open(index_path))["weight_map"]
    saved = {}
    for shard in sorted(set(weight_map.values())):
        saved.update(load_file(os.path.join(directory, "roundtrip", shard)))
    assert sorted(saved) == sorted(original), f"names {sorted(saved)}, expected {sorted(original)}"
    for name, tensor in original.items():
        assert same(saved[name], tensor), f"{name}: {saved[name]}, expected {tensor}"
    print(f"the state dict came back from LibTorch in {len(set(weight_map.values()))} shards: "
          f"{len(original)} tensors equal bit for bit (num_batches_tracked = {int(saved['1.num_batches_tracked'])})")


if __name__ == "__main__":
    {"check": check, "write": write, "verify": verify}[sys.argv[1]](sys.argv[2])
