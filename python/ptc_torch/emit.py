"""Phase 3 of the importer: the nodes the loss needs written as ptc ops (generic MLIR syntax),
each located at the line of the module's source it came from.
"""
import json

import torch

from ptc_torch.graph import ImportError_
from ptc_torch.patterns import _topo


_ELT = {"f32": "f32", "i32": "i32", "i1": "i1"}


def _ty(shape, dtype):
    dims = "x".join(str(d) for d in shape)
    return f"tensor<{dims + 'x' if dims else ''}{_ELT[dtype]}>"


def _attr(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.17e} : f64" if v == v and abs(v) != float("inf") else None
    if isinstance(v, int):
        return f"{v} : i64"
    if isinstance(v, list):
        return "array<i64: " + ", ".join(str(int(x)) for x in v) + ">"
    raise ValueError(v)


_OPS = {"add", "sub", "mul", "div", "scale", "convert", "matmul", "layer_norm", "rms_norm",
        "softmax", "causal_attention", "embedding", "cross_entropy", "reshape", "transpose",
        "slice", "concat", "reduce_sum", "reduce_mean", "reduce_max", "broadcast", "gelu",
        "gelu_tanh", "tanh", "silu", "relu", "rsqrt", "exp", "log", "rotary", "dropout"}


def emit(root, params, inputs, module_path, model_info=None):
    """The MLIR text of the function computing `root` (the loss); `model_info` (a dict: tied
    names, buffers) becomes the module's ptc.model_info."""
    lines, names = [], {}
    args = []
    for entry in params + inputs:
        args.append(entry)
    order = _topo(root)
    arg_index = {}
    for i, entry in enumerate(args):
        arg_index[entry[0]] = i
    counter = [0]

    def loc(n):
        return f' loc("{module_path}":{n.loc}:0)' if n.loc else ""

    def ssa(n):
        if n.op == "identity":
            return ssa(n.inputs[0])
        return names[id(n)]

    for n in order:
        if n.op == "arg":
            names[id(n)] = f"%arg{arg_index[n.attrs['name']]}"
            continue
        if n.op == "identity":
            continue
        if n.op == "const":
            v = n.attrs["value"]
            dtype = "i32" if not v.is_floating_point() and v.dtype != torch.bool else \
                ("i1" if v.dtype == torch.bool else "f32")
            n.dtype = n.dtype or dtype
            flat = v.reshape(-1)
            if dtype == "f32":
                vals = [f"{float(x):.9e}" for x in flat.tolist()]
            elif dtype == "i1":
                vals = ["true" if x else "false" for x in flat.tolist()]
            else:
                vals = [str(int(x)) for x in flat.tolist()]
            name = f"%c{counter[0]}"
            counter[0] += 1
            ty = _ty(v.shape, dtype)
            body = vals[0] if len(set(vals)) == 1 else "[" + ", ".join(vals) + "]"
            if len(set(vals)) != 1 and v.dim() > 1:
                body = _nested(v, dtype)
            lines.append(f"    {name} = arith.constant dense<{body}> : {ty}")
            names[id(n)] = name
            continue
        if n.op not in _OPS:
            where = f"{module_path}:{n.loc}" if n.loc else module_path
            what = {"masked_fill": "a masked_fill that is not a causal attention mask",
                    "log_softmax": "a log_softmax that does not feed a mean nll_loss",
                    "nll": "an nll_loss that does not follow a log_softmax"}.get(n.op, n.op)
            raise ImportError_(f"{where}: aten op '{n.aten}' ({what}) has no ptc counterpart")
        name = f"%{counter[0]}"
        counter[0] += 1
        operands = ", ".join(ssa(i) for i in n.inputs)
        in_types = ", ".join(_ty(i.shape, i.dtype) for i in n.inputs)
        attrs = {k: v for k, v in n.attrs.items() if v is not None}
        if n.op == "matmul":
            attrs = {k: v for k, v in attrs.items() if v}
        text = ", ".join(f"{k} = {_attr(v)}" for k, v in attrs.items() if _attr(v) is not None)
        attr_text = f" {{{text}}}" if text else ""
        lines.append(f"    {name} = \"ptc.{n.op}\"({operands}){attr_text} : ({in_types}) -> "
                     f"{_ty(n.shape, n.dtype)}{loc(n)}")
        names[id(n)] = name
    arg_text = []
    for name, shape, dtype, kind, *init in args:
        role = "ptc.param" if kind == "param" else "ptc.input"
        attrs = f"{role} = \"{name}\""
        if init and init[0]:
            attrs = f"ptc.init = \"{init[0]}\", " + attrs
        arg_text.append(f"%arg{arg_index[name]}: {_ty(shape, dtype)} {{{attrs}}}")
    header = "module {"
    if model_info:
        text = json.dumps(model_info, sort_keys=True).replace("\\", "\\\\").replace('"', '\\"')
        header = f'module attributes {{ptc.model_info = "{text}"}} {{'
    out = [header,
           f"  func.func @train_step({', '.join(arg_text)}) -> ({_ty(root.shape, root.dtype)} "
           "{ptc.loss}) {"]
    out += lines
    out.append(f"    return {ssa(root)} : {_ty(root.shape, root.dtype)}")
    out += ["  }", "}"]
    return "\n".join(out) + "\n"



def _nested(v, dtype):
    if v.dim() == 0:
        return f"{float(v):.9e}" if dtype == "f32" else str(int(v))
    return "[" + ", ".join(_nested(x, dtype) for x in v) + "]"
