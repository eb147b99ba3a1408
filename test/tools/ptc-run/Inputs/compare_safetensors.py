"""Test helper: compares the F32 tensors of two safetensors files.
  compare_safetensors.py A B   prints 'equal' when both hold the same names
                               with bitwise equal values, else what differs;
                               and 'finite' or how many values are not"""
import json
import struct
import sys

import numpy as np


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {name: np.frombuffer(raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]],
                                dtype=np.float32)
            for name, e in header.items() if name != "__metadata__"}


a, b = load(sys.argv[1]), load(sys.argv[2])
if a.keys() != b.keys():
    print("differ: names", sorted(a.keys() ^ b.keys()))
else:
    diff = [name for name in a if a[name].tobytes() != b[name].tobytes()]
    print("equal" if not diff else "differ: " + ", ".join(diff))
bad = sum(int((~np.isfinite(t)).sum()) for t in list(a.values()) + list(b.values()))
print("finite" if bad == 0 else f"{bad} values are not finite")
