"""Loads weights ptc wrote (ptc-run --save, ptc-ckpt export: a safetensors file or a Hugging Face
folder) into the PyTorch module they came from, strictly:

    import ptc_torch.weights
    ptc_torch.weights.load_state_dict(model, "trained.safetensors")

ptc saves a model's parameters under their state_dict names, and the names tied to a parameter
(nanoGPT's lm_head.weight) as tensors of their own. The module's buffers (a causal mask, rotary
tables) are no parameters and are not in the file: its metadata lists them ("ptc.buffers"), and
they are taken from the module itself, so that `strict=True` still checks every other name and
shape. Needs only torch (the safetensors format is read here)."""
import json
import os
import struct

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32}


def _read_file(path):
    """(tensors by name, metadata) of one safetensors file."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        if t["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {t['dtype']}")
        raw = bytearray(data[begin:end])
        tensors[name] = torch.frombuffer(raw, dtype=_DTYPES[t["dtype"]]).reshape(t["shape"]) \
            if raw else torch.zeros(t["shape"], dtype=_DTYPES[t["dtype"]])
    return tensors, meta


def read_weights(path):
    """(tensors by name, the buffers the file lists) of a safetensors file or a Hugging Face
    folder (model.safetensors.index.json and its shards, or model.safetensors)."""
    files = [path]
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            shards = sorted(set(json.load(open(index))["weight_map"].values()))
            files = [os.path.join(path, s) for s in shards]
        else:
            files = [os.path.join(path, "model.safetensors")]
    tensors, buffers = {}, []
    for f in files:
        t, meta = _read_file(f)
        tensors.update(t)
        buffers += [b for b in json.loads(meta.get("ptc.buffers", "[]")) if b not in buffers]
    return tensors, buffers


def load_state_dict(module, path, strict=True):
    """Loads `path` into `module` with `module.load_state_dict(..., strict)`, the buffers the
    file lists taken from the module (each must be one of its buffers)."""
    tensors, buffers = read_weights(path)
    own = dict(module.named_buffers())
    for name in buffers:
        if name not in tensors:
            if name not in own:
                raise KeyError(f"{path} lists buffer '{name}', which the module does not have")
            tensors[name] = own[name]
    return module.load_state_dict(tensors, strict=strict)
