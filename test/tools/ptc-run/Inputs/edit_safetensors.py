"""Test helper: rewrites a safetensors file (F32 tensors only).
  edit_safetensors.py IN OUT nan NAME     the first element of NAME becomes NaN
  edit_safetensors.py IN OUT nan-all NAME every element of NAME becomes NaN
  edit_safetensors.py IN OUT extra NAME   adds a [2] tensor NAME
  edit_safetensors.py IN OUT copy NAME FROM  adds NAME, a copy of tensor FROM
  edit_safetensors.py IN OUT overlap NAME    NAME's data starts 4 bytes early (into the entry before)
  edit_safetensors.py IN OUT gap NAME        4 unused bytes before NAME's data
  edit_safetensors.py IN OUT junk NAME       4 bytes after the last entry (NAME: any tensor)
  edit_safetensors.py IN OUT duplicate NAME  the header names NAME twice
  edit_safetensors.py IN OUT drop NAME       NAME and its data removed"""
import json
import struct
import sys

src, dst, what, name = sys.argv[1:5]
source = sys.argv[5] if len(sys.argv) > 5 else None
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
if what == "nan":
    begin = header[name]["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<f", float("nan"))
elif what == "nan-all":
    begin, stop = header[name]["data_offsets"]
    data[begin:stop] = struct.pack("<f", float("nan")) * ((stop - begin) // 4)
elif what == "extra":
    end = len(data)
    header[name] = {"dtype": "F32", "shape": [2], "data_offsets": [end, end + 8]}
    data += struct.pack("<2f", 1.0, 2.0)
elif what == "copy":
    begin, stop = header[source]["data_offsets"]
    end = len(data)
    header[name] = dict(header[source], data_offsets=[end, end + stop - begin])
    data += data[begin:stop]
elif what == "overlap":
    begin, stop = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin - 4, stop - 4]
elif what == "gap":
    begin = header[name]["data_offsets"][0]
    data[begin:begin] = b"\0\0\0\0"
    for e in header.values():
        if isinstance(e, dict) and "data_offsets" in e and e["data_offsets"][0] >= begin:
            e["data_offsets"] = [e["data_offsets"][0] + 4, e["data_offsets"][1] + 4]
elif what == "drop":
    begin, stop = header.pop(name)["data_offsets"]
    del data[begin:stop]
    for e in header.values():
        if isinstance(e, dict) and "data_offsets" in e and e["data_offsets"][0] >= stop:
            e["data_offsets"] = [e["data_offsets"][0] - (stop - begin), e["data_offsets"][1] - (stop - begin)]
elif what == "junk":
    data += b"junk"
text = json.dumps(header).encode()
if what == "duplicate":  # JSON objects cannot hold a key twice: write the second copy by hand
    entry = json.dumps({name: header[name]})[1:-1].encode()
    text = text[:-1] + b", " + entry + b"}"
text += b" " * ((8 - len(text) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
