"""ptc-import-torch: a PyTorch module -> a ptc training model (MLIR, the `ptc` dialect).

    ptc-import-torch MODULE.py --class NAME [--kwargs JSON] --input NAME=SHAPE:DTYPE ... -o model.mlir

By default the module is built without its parameters' memory (meta parameters, their
initialization recorded: `_MetaConstruction`) and traced on fake tensors (`--trace fake`: shapes
only, seconds and little memory at any size); `--trace real` runs it on real tensors.

The module's `forward` takes the inputs in order and returns the loss, or a tuple whose last
element is the loss (nanoGPT returns `(logits, loss)`). It is traced with example inputs of the
given shapes by `make_fx` (an aten-level graph with concrete shapes), with the parameters and
buffers as the function's arguments (`functional_call`), so every parameter keeps its
`state_dict` name. Then, in three phases:

1. aten -> a small graph of ptc-level nodes (`_Node`); what depends on neither parameters nor
   inputs (position ids, a causal mask buffer, rotary tables) is computed now, with torch, and
   kept as a constant;
2. patterns -> ptc's fused ops, so that the imported model is as fast and as shardable as a
   builder model: a linear layer's flatten / matmul / unflatten -> one matmul of the 3-D
   activations; softmax(masked_fill(q k^T * s, causal mask, -inf)) v -> causal_attention
   (keys and values repeated per query head -> grouped-query attention); log_softmax + nll_loss
   -> cross_entropy; x * rsqrt(mean(x^2) + eps) * w -> rms_norm; x cos + rotate_half(x) sin with
   rotary tables -> rotary; a position table looked up at 0..T-1 -> the table; dropout's
   bernoulli mask (or torch 2's native_dropout) -> dropout;
3. what the loss needs, written as ptc ops (generic MLIR syntax), each located at the line of
   the module's source it came from. An aten op ptc has no counterpart for (or a pattern's
   leftover, such as a masked_fill that is not a causal mask) is one error naming the op and
   that line.

Inputs named `tokens` and `targets` are what ptc-run's --data windows feed; integer inputs
become i32 ids.
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import traceback

import torch
from torch.fx.experimental import proxy_tensor
from torch.nn.utils import stateless

from ptc_torch.emit import emit
from ptc_torch.graph import ImportError_, Importer, _Node, _const, _dtype
from ptc_torch.patterns import fuse


class _user_code:
    """Turns an exception raised by the user's module into one error line that names the
    module's line it came from and what the importer was doing."""

    def __init__(self, module_path, doing):
        self.module_path, self.doing = os.path.abspath(module_path), doing

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None or issubclass(kind, ImportError_) or not issubclass(kind, Exception):
            return False
        line = None
        for frame in traceback.extract_tb(tb):
            if os.path.abspath(frame.filename) == self.module_path:
                line = frame.lineno
        where = f"{self.module_path}:{line}" if line else self.module_path
        raise ImportError_(f"{where}: {kind.__name__} while {self.doing}: {value}") from None


def _initializer(p):
    """ptc's initializer for a parameter like the module's initial value: zeros, ones, or
    N(0, std) with its values' std (the exact values: --state-dict, then ptc-run --init)."""
    v = p.detach()
    if bool((v == 0).all()):
        return "zeros"
    if bool((v == 1).all()):
        return "ones"
    std = float(v.float().std()) if v.numel() > 1 else abs(float(v))
    return f"normal:{std:.6g}" if std > 0 else "zeros"


def _parse_input(spec):
    try:
        name, rest = spec.split("=", 1)
        shape, dtype = rest.split(":", 1)
        dims = tuple(int(d) for d in shape.split("x"))
        tdtype = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32,
                  "f32": torch.float32, "i64": torch.int64, "i32": torch.int32}[dtype]
        return name, dims, tdtype
    except (ValueError, KeyError):
        raise ImportError_(f"--input '{spec}': expected NAME=SHAPE:DTYPE, e.g. tokens=8x64:int64 "
                           "(dtype int64, int32 or float32)")


class _MetaConstruction:
    """Builds a module without its parameters' memory: each parameter becomes a meta tensor as
    it is registered, and what initializes it (normal_, uniform_, zero_, fill_, mul_ by a
    number, trunc_normal_: what torch.nn.init and modules' own init call) is recorded instead of
    run, so that ptc's initializer is still like the module's (`_initializer`'s spec). A
    parameter nothing initializes after its construction keeps the spec of its constructed
    values (LayerNorm's ones). Buffers are built as usual (real: the patterns read masks and
    rotary tables)."""

    def __init__(self):
        self.specs, self.pending, self.saved = {}, {}, {}

    def __enter__(self):
        construction = self
        register = torch.nn.Module.register_parameter

        def register_parameter(module, name, param):
            if param is not None and param.device.type != "meta":
                meta = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                          param.requires_grad)
                construction.pending[id(meta)] = param.detach()  # virtual until read
                param = meta
            return register(module, name, param)

        def recording(method, spec):
            original = getattr(torch.Tensor, method)

            def run(tensor, *args, **kwargs):
                if tensor.device.type != "meta":
                    return original(tensor, *args, **kwargs)
                construction.pending.pop(id(tensor), None)
                construction.specs[id(tensor)] = spec(construction.specs.get(id(tensor)), *args,
                                                      **kwargs)
                return tensor
            return original, run

        def normal(_, mean=0.0, std=1.0, **k):
            return f"normal:{float(std):.6g}" if std > 0 else "zeros"

        def uniform(_, a=0.0, b=1.0, **k):
            std = (float(b) - float(a)) / math.sqrt(12.0)
            return f"normal:{std:.6g}" if std > 0 else "zeros"

        def fill(_, value, **k):
            return "ones" if float(value) == 1.0 else "zeros"

        def mul(previous, factor, **k):
            if isinstance(factor, torch.Tensor) or previous is None:
                return previous
            if previous.startswith("normal:"):
                return f"normal:{abs(float(previous[7:]) * float(factor)):.6g}"
            return previous  # zeros stay zeros; a scaled constant keeps its spec

        patches = {"normal_": normal, "uniform_": uniform, "zero_": lambda _, **k: "zeros",
                   "fill_": fill, "mul_": mul}
        self.saved = {"register_parameter": register}
        for method, spec in patches.items():
            self.saved[method], patched = recording(method, spec)
            setattr(torch.Tensor, method, patched)
        trunc = torch.nn.init.trunc_normal_
        self.saved["trunc_normal_"] = trunc

        def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
            if tensor.device.type != "meta":
                return trunc(tensor, mean, std, a, b)
            construction.pending.pop(id(tensor), None)
            construction.specs[id(tensor)] = f"normal:{float(std):.6g}"
            return tensor
        torch.nn.init.trunc_normal_ = trunc_normal_
        torch.nn.Module.register_parameter = register_parameter
        return self

    def __exit__(self, *exc):
        torch.nn.Module.register_parameter = self.saved.pop("register_parameter")
        torch.nn.init.trunc_normal_ = self.saved.pop("trunc_normal_")
        for method, original in self.saved.items():
            setattr(torch.Tensor, method, original)
        # What nothing initialized afterwards: the constructed values say.
        for key, real in self.pending.items():
            self.specs[key] = _initializer(real)
        self.pending.clear()
        return False

    def initializer(self, p):
        return self.specs.get(id(p), "zeros")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention as its documentation defines it, in the
    primitive ops the importer's attention pattern raises to ptc's fused attention: scores scaled
    by `scale` (default 1/sqrt(head dim)), the causal mask (`is_causal`) or `attn_mask` (boolean:
    True keeps; float: added), softmax, dropout, times the values; grouped-query keys and values
    (`enable_gqa`, fewer heads) repeated per query head as Hugging Face's repeat_kv does. The
    importer installs it as F.scaled_dot_product_attention while it loads, builds and traces a
    module, on any torch: torch 1.13 has none, and torch 2 records its fused kernels (whose
    aten ops differ between versions) instead of these."""
    L, S, E = query.size(-2), key.size(-2), query.size(-1)
    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)

        def repeat(t):
            b, h, s, d = t.shape
            return t[:, :, None, :, :].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)
        key, value = repeat(key), repeat(value)
    factor = 1.0 / math.sqrt(E) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * factor
    if is_causal:
        future = ~torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        scores = scores.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, dropout_p, training=True)
    return weights @ value


class _ReferenceAttention:
    """F.scaled_dot_product_attention = scaled_dot_product_attention while in the block."""

    def __enter__(self):
        self.saved = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            del torch.nn.functional.scaled_dot_product_attention
        else:
            torch.nn.functional.scaled_dot_product_attention = self.saved
        return False


def _load_class(module_path, class_name):
    if not os.path.isfile(module_path):
        raise ImportError_(f"'{module_path}': no such file")
    spec = importlib.util.spec_from_file_location("_ptc_user_module", module_path)
    if spec is None:
        raise ImportError_(f"'{module_path}' is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(module_path)))
    with _user_code(module_path, "loading it"):
        spec.loader.exec_module(mod)
    cls = getattr(mod, class_name, None)
    if cls is None:
        raise ImportError_(f"'{module_path}' has no class '{class_name}'")
    return cls


def _construct(module_path, class_name, kwargs):
    """The module built as its class builds it (real parameters, its own initialization)."""
    cls = _load_class(module_path, class_name)
    with _user_code(module_path, f"constructing {class_name}(**kwargs)"):
        return cls(**kwargs)


def import_module(module_path, class_name, kwargs, input_specs, trace="fake"):
    """(the ptc model's MLIR text, the module) of `class_name(**kwargs)` traced with inputs
    `input_specs`; `trace` "fake" builds it without its parameters' memory (meta) and traces on
    fake tensors, "real" on real ones."""
    cls = _load_class(module_path, class_name)
    construction = None
    with _user_code(module_path, f"constructing {class_name}(**kwargs)"):
        if trace == "fake":
            with _MetaConstruction() as construction:
                model = cls(**kwargs)
        else:
            model = cls(**kwargs)
    # Training mode, as ptc trains it: a dropout with p > 0 shows in the graph (and becomes
    # ptc.dropout), instead of vanishing as it would in eval mode.
    model.train()
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    names = list(params) + list(buffers)
    example = []
    for name, dims, tdtype in input_specs:
        example.append(torch.zeros(dims, dtype=tdtype))

    # Names tied to a parameter (nanoGPT's lm_head.weight): the same argument.
    state_dict = model.state_dict(keep_vars=True)
    by_tensor = {id(p): name for name, p in params.items()}
    tied = {name: by_tensor[id(t)] for name, t in state_dict.items()
            if id(t) in by_tensor and by_tensor[id(t)] != name}

    def step(*args):
        state = dict(zip(names, args[:len(names)]))
        for alias, name in tied.items():
            state[alias] = state[name]
        return stateless.functional_call(model, state, tuple(args[len(names):]))

    original = proxy_tensor.PythonKeyTracer.__init__

    def init(self, *a, **k):
        original(self, *a, **k)
        self.record_stack_traces = True
    proxy_tensor.PythonKeyTracer.__init__ = init
    try:
        with _user_code(module_path, "tracing forward with the example inputs"):
            if trace == "fake":
                # Fake tensors: shapes and types only, no arithmetic and no memory. The
                # parameters are empty (never touched) stand-ins of the meta ones.
                stand_ins = [torch.empty(p.shape, dtype=p.dtype) for p in params.values()]
                graph = proxy_tensor.make_fx(step, tracing_mode="fake")(
                    *stand_ins, *buffers.values(), *example)
            else:
                graph = proxy_tensor.make_fx(step)(*params.values(), *buffers.values(), *example)
    finally:
        proxy_tensor.PythonKeyTracer.__init__ = original

    imp = Importer(module_path)
    arg_nodes, param_args, input_args = [], [], []
    for name, p in params.items():
        if p.dtype != torch.float32:
            raise ImportError_(f"parameter '{name}' is {p.dtype}; ptc-import-torch takes float32 "
                               "modules (mixed precision is a compile option)")
        arg_nodes.append(_Node("arg", [], p.shape, "f32", name=name))
        init = construction.initializer(p) if construction else _initializer(p)
        param_args.append((name, tuple(p.shape), "f32", "param", init))
    for name, b in buffers.items():
        arg_nodes.append(_const(b.detach().clone()))  # buffers are constants of the step
    for name, dims, tdtype in input_specs:
        dt = _dtype(tdtype)
        arg_nodes.append(_Node("arg", [], dims, dt, name=name))
        input_args.append((name, dims, dt, "input"))
    loss = imp.convert(graph.graph, arg_nodes)
    if loss is None or not isinstance(loss, _Node) or loss.shape != () or loss.dtype != "f32":
        raise ImportError_("forward must return the loss (a float32 scalar), or a tuple whose last "
                           "element is the loss")
    fuse(loss, os.path.abspath(module_path))
    # Parameters the loss does not use are still the model's (their names stay).
    # What a strict load_state_dict of the trained weights needs besides the parameters: the
    # names tied to a parameter (nanoGPT's lm_head.weight) and the buffers (ptc-run --save
    # writes the former and lists the latter: ptc_torch.load_state_dict fills them in).
    persistent = [name for name in buffers if name in state_dict]
    info = {k: v for k, v in (("tied", tied), ("buffers", persistent)) if v}
    return emit(loss, param_args, input_args, os.path.abspath(module_path), info), model


def _save_safetensors(path, tensors):
    """float32 tensors by name, as safetensors (header JSON, then the data)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="ptc-import-torch",
        description="Trace a PyTorch module into a ptc training model (MLIR).")
    ap.add_argument("module", help="the Python file defining the module")
    ap.add_argument("--class", dest="cls", required=True, help="the module's class")
    ap.add_argument("--kwargs", default="{}", help="constructor keyword arguments (JSON)")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=SHAPE:DTYPE",
                    help="forward's inputs in order, e.g. tokens=8x64:int64")
    ap.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    ap.add_argument("--state-dict", default=None, metavar="FILE.safetensors",
                    help="also write the module's initial state_dict (ptc-run --init FILE starts "
                         "from exactly those weights)")
    ap.add_argument("--trace", choices=["fake", "real"], default="fake",
                    help="fake (default): the module built without its parameters' memory and "
                         "traced on fake tensors (shapes only: seconds, little memory at any "
                         "size); real: built and run on real tensors")
    a = ap.parse_args(argv)
    try:
        try:
            kwargs = json.loads(a.kwargs)
        except json.JSONDecodeError as e:
            raise ImportError_(f"--kwargs is not JSON: {e}")
        if not a.input:
            raise ImportError_("no --input given: name forward's inputs, e.g. "
                               "--input tokens=8x64:int64 --input targets=8x64:int64")
        specs = [_parse_input(s) for s in a.input]
        with _ReferenceAttention():  # the module's loading, building and tracing see it
            text, model = import_module(a.module, a.cls, kwargs, specs, a.trace)
            if a.state_dict:
                if a.trace == "fake":
                    # The module's own initial values, on demand: built once more, for real.
                    model = _construct(a.module, a.cls, kwargs)
                _save_safetensors(a.state_dict, model.state_dict())
    except ImportError_ as e:
        print(f"ptc-import-torch: error: {e}", file=sys.stderr)
        return 1
    if a.output == "-":
        sys.stdout.write(text)
    else:
        with open(a.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
