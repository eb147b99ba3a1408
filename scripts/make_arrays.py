"""Safetensors helpers for ptc-run's named-array data and weights (used by the tests too):
a learnable classification dataset for `ptc-model mlp|moe` (inputs "x" [N, DIM] and
"labels" [N]; labels = argmax of a fixed random projection of x), a bf16 copy of weights,
and a comparison of two weight files or Hugging Face directories. Needs numpy.

  make_arrays.py dataset OUT N DIM CLASSES [--label-dtype I64|I32] [--drop NAME]
  make_arrays.py bf16 IN OUT        # every F32 tensor of IN as BF16
  make_arrays.py compare A B        # same tensor names and values (files or HF directories)
"""
import json
import os
import struct
import sys

import numpy as np


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, a) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = {"F32": "<f4", "BF16": "<u2", "I32": "<i4", "I64": "<i8"}[e["dtype"]]
        out[name] = (e["dtype"], np.frombuffer(data[b:end], dtype=dt).reshape(e["shape"]))
    return out


def read_any(path):
    if not os.path.isdir(path):
        return read(path)
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read(os.path.join(path, shard)))
    assert set(out) == set(index["weight_map"]), "index and shards disagree"
    return out


def main():
    cmd = sys.argv[1]
    if cmd == "dataset":
        out, n, d, c = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, d)).astype("<f4")
        labels = (x @ rng.standard_normal((d, c))).argmax(1)
        label_dtype = sys.argv[sys.argv.index("--label-dtype") + 1] if "--label-dtype" in sys.argv else "I64"
        tensors = {"x": ("F32", x),
                   "labels": (label_dtype, labels.astype("<i8" if label_dtype == "I64" else "<i4"))}
        if "--drop" in sys.argv:
            del tensors[sys.argv[sys.argv.index("--drop") + 1]]
        write(out, tensors)
    elif cmd == "bf16":
        tensors = read(sys.argv[2])
        conv = {}
        for name, (dtype, a) in tensors.items():
            u = a.astype("<f4").view("<u4")
            conv[name] = ("BF16", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2"))
        write(sys.argv[3], conv)
    elif cmd == "compare":
        a, b = read_any(sys.argv[2]), read_any(sys.argv[3])
        if set(a) != set(b):
            print("names differ:", sorted(set(a) ^ set(b)))
            return 1
        for name in a:
            if a[name][0] != b[name][0] or not np.array_equal(a[name][1], b[name][1]):
                print("tensor differs:", name)
                return 1
        print(f"identical: {len(a)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
