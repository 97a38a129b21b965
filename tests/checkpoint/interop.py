"""The Python side of the safetensors interop test, with numpy and the standard library only:
   interop.py check FILE  -- reads accel's file and checks the exact values
   interop.py write FILE  -- writes a file for accel to read"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read(path):
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
            values = np.frombuffer(raw, dtype=np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<"))
        tensors[name] = values.reshape(entry["shape"])
    return tensors


def check(path):
    t = read(path)
    assert t["fc.weight"].dtype == np.float32 and (t["fc.weight"] == np.arange(6, dtype=np.float32).reshape(2, 3) / 4).all()
    assert t["fc.bias"].dtype == np.float64 and list(t["fc.bias"]) == [-1.5, 2.25]
    assert t["steps"].dtype == np.int64 and list(t["steps"]) == [7, 8, 9]
    assert list(t["half"]) == [0.5, -2.0]
    print("accel's file read in Python: values match")


def write(path):
    # A Linear(4, 3)'s state dict, as torch.nn.Linear names it; and an int tensor besides, in another file.
    tensors = {"weight": np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5,
               "bias": np.array([1, -2, 3], dtype=np.float32)}
    names = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header, offset, body = {}, 0, b""
    for name, array in tensors.items():
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        body += raw
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + body)


if __name__ == "__main__":
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
