"""Test helper: rewrites a safetensors file (F32 tensors only).
  edit_safetensors.py IN OUT nan NAME     the first element of NAME becomes NaN
  edit_safetensors.py IN OUT extra NAME   adds a [2] tensor NAME"""
import json
import struct
import sys

src, dst, what, name = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
if what == "nan":
    begin = header[name]["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<f", float("nan"))
elif what == "extra":
    end = len(data)
    header[name] = {"dtype": "F32", "shape": [2], "data_offsets": [end, end + 8]}
    data += struct.pack("<2f", 1.0, 2.0)
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
