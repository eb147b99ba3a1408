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

aten = torch.ops.aten


class ImportError_(Exception):
    """An error for the user: a message that names the culprit."""


class _Node:
    """One value of the imported graph: an op of ptc (or a helper a pattern consumes), its
    inputs, attributes, static shape and element type ('f32', 'i32', 'i1')."""

    def __init__(self, op, inputs, shape, dtype, loc=None, **attrs):
        self.op, self.inputs, self.shape, self.dtype = op, list(inputs), tuple(shape), dtype
        self.loc, self.attrs = loc, attrs
        self.aten = attrs.pop("aten", None)  # the aten op it came from (for errors)

    def __repr__(self):
        return f"{self.op}{list(self.shape)}"


def _dtype(t):
    if t in (torch.float32,):
        return "f32"
    if t in (torch.int64, torch.int32):
        return "i32"
    if t == torch.bool:
        return "i1"
    raise ImportError_(f"element type {t} is not supported (float32 and integer ids are)")


def _const(value, loc=None):
    t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return _Node("const", [], t.shape, None, loc, value=t)


def _is_const(n):
    return isinstance(n, _Node) and n.op == "const"


class Importer:
    def __init__(self, module_path):
        self.module_path = os.path.abspath(module_path)
        self.loc = None
        self.dropout_streams = 0

    # ---- phase 1: aten -> nodes ------------------------------------------------------------
    def source_line(self, node):
        """The innermost frame of the user's module file in the node's stack trace."""
        trace = node.stack_trace or ""
        for line in trace.splitlines():
            line = line.strip()
            if line.startswith("File \"") and os.path.abspath(line.split("\"")[1]) == self.module_path:
                try:
                    return int(line.split("line ")[1].split(",")[0])
                except (IndexError, ValueError):
                    return None
        return None

    def fail(self, what):
        where = f"{self.module_path}:{self.loc}" if self.loc else self.module_path
        raise ImportError_(f"{where}: {what}")

    def convert(self, graph, arg_nodes):
        env = {}
        outputs = None
        for node in graph.nodes:
            self.loc = self.source_line(node)
            if node.op == "placeholder":
                env[node] = arg_nodes.pop(0)
            elif node.op == "call_function":
                env[node] = self.call(node, env)
            elif node.op == "output":
                outputs = node.args[0]
            else:
                self.fail(f"unexpected graph node {node.op} {node.target}")
        flat = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        last = flat[-1]
        return env.get(last) if isinstance(last, torch.fx.Node) else None

    def arg(self, a, env):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x, env) for x in a)
        return a

    def call(self, node, env):
        args = [self.arg(a, env) for a in node.args]
        kwargs = {k: self.arg(v, env) for k, v in node.kwargs.items()}
        target = node.target
        meta = node.meta.get("val", node.meta.get("tensor_meta"))
        if meta is None:
            # A multi-result op: its results' metadata are on the getitems that take them.
            getitem = __import__("operator").getitem
            parts = {u.args[1]: u.meta.get("tensor_meta") for u in node.users
                     if u.target is getitem}
            meta = [parts.get(i) for i in range(max(parts) + 1)] if parts else []
        if target is __import__("operator").getitem:
            seq, i = args
            if isinstance(seq, (list, tuple)):
                return seq[i]
            self.fail(f"indexing a {seq} result")
        # What depends on neither parameters nor inputs is computed now.
        leaves = [x for x in _flatten(args) + _flatten(list(kwargs.values()))
                  if isinstance(x, _Node)]
        if all(_is_const(x) for x in leaves):
            def value(x):
                if isinstance(x, _Node):
                    return x.attrs["value"]
                if isinstance(x, (list, tuple)):
                    return type(x)(value(y) for y in x)
                return x
            result = target(*value(args), **value(kwargs))
            if isinstance(result, (tuple, list)):
                return [_const(r, self.loc) for r in result]
            return _const(result, self.loc)
        handler = _HANDLERS.get(target)
        if handler is None:
            self.fail(f"aten op '{_name(target)}' is not supported by ptc-import-torch")
        out = handler(self, args, kwargs, meta)
        for n in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(n, _Node) and n.loc is None:
                n.loc = self.loc
                n.aten = n.aten or _name(target)
        return out

    def node(self, op, inputs, meta, **attrs):
        shape = tuple(meta.shape) if meta is not None else attrs.pop("shape")
        dtype = _dtype(meta.dtype) if meta is not None else attrs.pop("dtype")
        return _Node(op, inputs, shape, dtype, self.loc, **attrs)


def _flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out += _flatten(x)
        else:
            out.append(x)
    return out


def _name(target):
    return str(target).replace("aten.", "aten::").split(".default")[0]


def _norm_axis(a, rank):
    return a + rank if a < 0 else a


def _scalar(x):
    """A Python number as an f32 constant (operands are float32)."""
    return _const(torch.tensor(float(x), dtype=torch.float32))


def _binary(op):
    def handler(imp, args, kwargs, meta):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", 1)
        if not isinstance(a, _Node):
            a = _scalar(a)
            if op == "mul":
                return imp.node("scale", [b], meta, factor=float(a.attrs["value"]))
        if not isinstance(b, _Node):
            if op == "mul":
                return imp.node("scale", [a], meta, factor=float(b))
            if op == "div":
                return imp.node("scale", [a], meta, factor=1.0 / float(b))
            b = _scalar(b)
        if alpha != 1:
            b = imp.node("scale", [b], None, factor=float(alpha), shape=b.shape, dtype=b.dtype or a.dtype)
        return imp.node(op, [a, b], meta)
    return handler


def _identity(imp, args, kwargs, meta):
    return args[0]


def _unless_unchanged(op):
    """`op` of the first argument, or the argument itself where the shape stays."""
    def handler(imp, args, kwargs, meta):
        x = args[0]
        if tuple(meta.shape) == x.shape:
            return x
        return imp.node(op, [x], meta)
    return handler


_reshape = _unless_unchanged("reshape")
_expand = _unless_unchanged("broadcast")


def _to_copy(imp, args, kwargs, meta):
    x = args[0]
    if _dtype(meta.dtype) == x.dtype:
        return x
    return imp.node("convert", [x], meta)


def _transpose(imp, args, kwargs, meta):
    x, d0, d1 = args[0], args[1], args[2]
    r = len(x.shape)
    perm = list(range(r))
    d0, d1 = _norm_axis(d0, r), _norm_axis(d1, r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return imp.node("transpose", [x], meta, permutation=perm)


def _t(imp, args, kwargs, meta):
    return imp.node("transpose", [args[0]], meta, permutation=[1, 0])


def _permute(imp, args, kwargs, meta):
    x = args[0]
    perm = [_norm_axis(p, len(x.shape)) for p in args[1]]
    if perm == list(range(len(perm))):
        return x
    return imp.node("transpose", [x], meta, permutation=perm)


def _slice(imp, args, kwargs, meta):
    x = args[0]
    dim = _norm_axis(args[1] if len(args) > 1 else 0, len(x.shape))
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    step = args[4] if len(args) > 4 else 1
    if step != 1:
        imp.fail("aten op 'aten::slice' with a step other than 1 is not supported")
    if tuple(meta.shape) == x.shape:
        return x
    start = max(0, start + x.shape[dim] if start < 0 else start)
    offsets = [0] * len(x.shape)
    offsets[dim] = start
    return imp.node("slice", [x], meta, offsets=offsets)


def _split(imp, args, kwargs, meta):
    x, size = args[0], args[1]
    dim = _norm_axis(args[2] if len(args) > 2 else 0, len(x.shape))
    sizes = size if isinstance(size, (list, tuple)) else \
        [min(size, x.shape[dim] - s) for s in range(0, x.shape[dim], size)]
    out, start = [], 0
    for m, s in zip(meta, sizes):
        offsets = [0] * len(x.shape)
        offsets[dim] = start
        out.append(imp.node("slice", [x], m, offsets=offsets))
        start += s
    return out


def _cat(imp, args, kwargs, meta):
    xs = [x if isinstance(x, _Node) else _const(x) for x in args[0]]
    axis = _norm_axis(args[1] if len(args) > 1 else 0, len(meta.shape))
    return imp.node("concat", xs, meta, axis=axis)


def _addmm(imp, args, kwargs, meta):
    bias, x, w = args[0], args[1], args[2]
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        imp.fail("aten op 'aten::addmm' with beta or alpha other than 1 is not supported")
    mm = imp.node("matmul", [x, w], meta, transpose_lhs=False, transpose_rhs=False)
    return imp.node("add", [mm, bias], meta)


def _matmul(imp, args, kwargs, meta):
    return imp.node("matmul", [args[0], args[1]], meta, transpose_lhs=False, transpose_rhs=False)


def _layer_norm(imp, args, kwargs, meta):
    x, shape, w, b, eps = args[:5]
    if len(shape) != 1 or w is None:
        imp.fail("aten op 'aten::native_layer_norm' over more than the last dimension or without "
                 "a weight is not supported")
    if b is None:
        b = _const(torch.zeros(shape[0]))
    return [_Node("layer_norm", [x, w, b], x.shape, x.dtype, imp.loc, epsilon=float(eps)), None,
            None]


def _unary(op):
    def handler(imp, args, kwargs, meta):
        name = op
        if op == "gelu":
            approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            if approximate == "tanh":
                name = "gelu_tanh"  # GPT-2's GELU, nn.GELU(approximate='tanh')
            elif approximate != "none":
                imp.fail(f"aten op 'aten::gelu' with approximate='{approximate}' is not supported "
                         "('none' and 'tanh' are)")
        return imp.node(name, [args[0]], meta)
    return handler


def _softmax(imp, args, kwargs, meta):
    x = args[0]
    return imp.node("softmax", [x], meta, axis=_norm_axis(args[1], len(x.shape)))


def _log_softmax(imp, args, kwargs, meta):
    x = args[0]
    return imp.node("log_softmax", [x], meta, axis=_norm_axis(args[1], len(x.shape)))


def _nll(imp, args, kwargs, meta):
    lsm, target, weight, reduction = args[0], args[1], args[2], args[3]
    ignore_index = args[4] if len(args) > 4 else -100
    if weight is not None or reduction != 1:
        imp.fail("aten op 'aten::nll_loss_forward' with class weights or a reduction other than "
                 "the mean is not supported")
    # A negative ignore_index (torch's -100, nanoGPT's -1) never matches a token id (ptc's
    # data holds ids >= 0), so every target counts, as in PyTorch. A token id would need the
    # loss to skip those targets, which ptc's cross-entropy does not.
    if ignore_index >= 0:
        imp.fail(f"cross-entropy with ignore_index={ignore_index} (a token id) is not supported: "
                 "ptc's cross-entropy counts every target (a negative ignore_index, which no token "
                 "id matches, imports)")
    return [_Node("nll", [lsm, target], (), "f32", imp.loc), None]


def _masked_fill(imp, args, kwargs, meta):
    x, mask, value = args[0], args[1], args[2]
    return imp.node("masked_fill", [x, mask], meta, value=float(value))


def _pow(imp, args, kwargs, meta):
    """x ** e for a constant e: a small whole power as products (x^3 = x * x * x, as minGPT's
    NewGELU writes it), -0.5 as rsqrt, 1 as x."""
    x, e = args[0], args[1]
    if not isinstance(x, _Node) or isinstance(e, _Node):
        imp.fail("aten op 'aten::pow' of a tensor exponent is not supported (a constant one is)")
    if e == -0.5:
        return imp.node("rsqrt", [x], meta)
    if float(e).is_integer() and 1 <= e <= 8:
        out = x
        for _ in range(int(e) - 1):
            out = imp.node("mul", [out, x], meta)
        return out
    imp.fail(f"aten op 'aten::pow' with exponent {e} is not supported (whole exponents 1 to 8 "
             "and -0.5 are)")


# Dropout in training mode, as make_fx records it: mask = bernoulli_(empty_like(x), keep),
# mask.div_(keep), x * mask (torch 1.13), or native_dropout (torch 2) -> ptc.dropout, each with
# its own random stream (in program order). ptc draws its own masks (Philox, the same in every
# layout), so the keep probability and the scaling are PyTorch's, the masks are not.
def _empty_like(imp, args, kwargs, meta):
    return imp.node("empty_like", [args[0]], meta)


def _dropout_noise(imp, args, kwargs, meta):
    noise = args[0]
    keep = float(args[1]) if len(args) > 1 else 0.5
    if not isinstance(noise, _Node) or noise.op != "empty_like":
        imp.fail("aten op 'aten::bernoulli_' is supported as dropout's mask only")
    return imp.node("dropout_mask", [noise.inputs[0]], meta, keep=keep)


def _dropout_scale(imp, args, kwargs, meta):
    mask, keep = args[0], args[1]
    if not isinstance(mask, _Node) or mask.op != "dropout_mask" or \
            isinstance(keep, _Node) or abs(float(keep) - mask.attrs["keep"]) > 1e-12:
        imp.fail("aten op 'aten::div_' is supported as dropout's mask scaling only")
    return imp.node("dropout_scaled_mask", [mask.inputs[0]], meta, keep=mask.attrs["keep"])


def _dropout(imp, x, p, meta):
    if p <= 0.0:
        return x
    if p >= 1.0:
        imp.fail(f"dropout with p={p:g} zeroes everything; ptc takes 0 <= p < 1")
    imp.dropout_streams += 1
    return imp.node("dropout", [x], meta, p=float(p), stream=imp.dropout_streams - 1)


_binary_mul = _binary("mul")  # mul of operands that are not a dropout mask


def _mul(imp, args, kwargs, meta):
    a, b = args[0], args[1]
    for x, mask in ((a, b), (b, a)):
        if isinstance(mask, _Node) and mask.op == "dropout_scaled_mask":
            if mask.inputs[0] is not x:
                imp.fail("dropout's mask multiplies another tensor than the one it was drawn for")
            return _dropout(imp, x, 1.0 - mask.attrs["keep"], meta)
    return _binary_mul(imp, args, kwargs, meta)


def _native_dropout(imp, args, kwargs, meta):
    x, p = args[0], float(args[1])
    train = args[2] if len(args) > 2 else kwargs.get("train", True)
    return [_dropout(imp, x, p if train else 0.0, meta[0] if isinstance(meta, list) else meta),
            None]


def _reduce(op):
    def handler(imp, args, kwargs, meta):
        x = args[0]
        dims = args[1] if len(args) > 1 else list(range(len(x.shape)))
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        axes = sorted(_norm_axis(d, len(x.shape)) for d in dims)
        return imp.node(op, [x], meta, axes=axes, keep_dims=bool(keep))
    return handler


def _embedding(imp, args, kwargs, meta):
    return imp.node("embedding", [args[0], args[1]], meta)


def _neg(imp, args, kwargs, meta):
    return imp.node("scale", [args[0]], meta, factor=-1.0)


_HANDLERS = {
    aten.add.Tensor: _binary("add"), aten.sub.Tensor: _binary("sub"),
    aten.mul.Tensor: _mul, aten.div.Tensor: _binary("div"),
    aten.add.Scalar: _binary("add"), aten.mul.Scalar: _binary("mul"),
    aten.neg.default: _neg,
    aten.view.default: _reshape, aten._unsafe_view.default: _reshape,
    aten._reshape_alias.default: _reshape, aten.reshape.default: _reshape,
    aten.unsqueeze.default: _reshape, aten.squeeze.dim: _reshape,
    aten.clone.default: _identity, aten.detach.default: _identity, aten.alias.default: _identity,
    aten.lift_fresh_copy.default: _identity,
    aten._to_copy.default: _to_copy,
    aten.t.default: _t, aten.transpose.int: _transpose, aten.permute.default: _permute,
    aten.expand.default: _expand,
    aten.slice.Tensor: _slice, aten.split.Tensor: _split, aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.addmm.default: _addmm, aten.mm.default: _matmul, aten.bmm.default: _matmul,
    aten.native_layer_norm.default: _layer_norm,
    aten.gelu.default: _unary("gelu"), aten.silu.default: _unary("silu"),
    aten.relu.default: _unary("relu"), aten.rsqrt.default: _unary("rsqrt"),
    aten.exp.default: _unary("exp"), aten.log.default: _unary("log"),
    aten.tanh.default: _unary("tanh"),
    aten.empty_like.default: _empty_like, aten.bernoulli_.float: _dropout_noise,
    aten.div_.Scalar: _dropout_scale, aten.native_dropout.default: _native_dropout,
    aten._softmax.default: _softmax, aten._log_softmax.default: _log_softmax,
    aten.nll_loss_forward.default: _nll, aten.masked_fill.Scalar: _masked_fill,
    aten.pow.Tensor_Scalar: _pow,
    aten.mean.dim: _reduce("reduce_mean"), aten.sum.dim_IntList: _reduce("reduce_sum"),
    aten.amax.default: _reduce("reduce_max"),
    aten.embedding.default: _embedding,
}


# ---- phase 2: patterns -> fused ops -----------------------------------------------------------
def _users(root):
    users = {}
    order = _topo(root)
    for n in order:
        for i in n.inputs:
            users.setdefault(id(i), []).append(n)
    return users, order


def _topo(root):
    seen, order = set(), []
    stack = [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for i in reversed(n.inputs):
            if id(i) not in seen:
                stack.append((i, False))
    return order


def _replace(node, op, inputs, **attrs):
    """Rewrites `node` in place (its users keep pointing at it)."""
    node.op, node.inputs, node.attrs = op, list(inputs), attrs


def _causal(mask, s):
    """Whether a constant boolean mask of shape [..., s, s] hides exactly the future."""
    m = mask.attrs["value"]
    if m.shape[-2:] != (s, s):
        return False
    want = ~torch.ones(s, s, dtype=torch.bool).tril()
    return bool((m.to(torch.bool) == want.expand(m.shape)).all())


def _additive_causal(mask, s):
    """Whether a constant float mask [..., s, s] adds 0 up to the diagonal and a value that
    zeroes the softmax (-inf, or below -1e30) after it."""
    if not _is_const(mask) or not mask.attrs["value"].is_floating_point():
        return False
    m = mask.attrs["value"]
    if m.shape[-2:] != (s, s):
        return False
    m = m.reshape(-1, s, s)
    future = ~torch.ones(s, s, dtype=torch.bool).tril()
    return bool((m[:, ~future] == 0).all()) and bool((m[:, future] <= -1e30).all())


def _strip(n, ops=("reshape",)):
    while n.op in ops:
        n = n.inputs[0]
    return n


def _rotary_theta(cos, sin, seq, dim):
    """The theta of rotary tables cos / sin ([..., seq, dim], rotate_half layout), or None."""
    c, s = cos.attrs["value"], sin.attrs["value"]
    if c.shape[-2:] != (seq, dim) or s.shape[-2:] != (seq, dim) or seq < 2:
        return None
    c = c.reshape(-1, seq, dim)[0].double()
    s = s.reshape(-1, seq, dim)[0].double()
    angle1 = math.atan2(float(s[1, 1]), float(c[1, 1])) if dim > 2 else None
    if angle1 is None or angle1 <= 0:
        return None
    theta = angle1 ** (-dim / 2.0)
    half = dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    if (ang.cos() - c).abs().max() > 1e-4 or (ang.sin() - s).abs().max() > 1e-4:
        return None
    # Round to what the tables were computed from (10000, 500000, ...): f32 angles.
    for t in (10000.0, 500000.0, 1000000.0, 100000.0):
        if abs(theta - t) / t < 1e-3:
            return t
    return theta


def _scale_of(n):
    """(input, factor) of a chain of scales by constants, else (n, 1.0)."""
    f = 1.0
    while n.op == "scale":
        f *= n.attrs["factor"]
        n = n.inputs[0]
    return n, f


def _const_value(n):
    return float(n.attrs["value"]) if _is_const(n) and n.attrs["value"].numel() == 1 else None


def _new_gelu_input(n):
    """x when `n` is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in any order of the
    products and sums (within 1e-6 of the constants), else None."""
    for half, rest in (n.inputs, list(reversed(n.inputs))):
        x, f = _scale_of(half)
        if abs(f - 0.5) > 1e-6 or rest.op != "add":
            continue
        for one, t in (rest.inputs, list(reversed(rest.inputs))):
            if _const_value(one) != 1.0 or t.op != "tanh":
                continue
            inner, c = _scale_of(t.inputs[0])
            if abs(c - math.sqrt(2.0 / math.pi)) > 1e-6 or inner.op != "add":
                continue
            for xx, cubic in (inner.inputs, list(reversed(inner.inputs))):
                cube, k = _scale_of(cubic)
                if xx is not x or abs(k - 0.044715) > 1e-9 or cube.op != "mul":
                    continue
                sq, x3 = cube.inputs
                if x3 is x and sq.op == "mul" and sq.inputs[0] is x and sq.inputs[1] is x:
                    return x
    return None


def fuse(root, module_path=""):
    """Rewrites the patterns (phase 2) in the graph that computes `root`."""
    users, order = _users(root)

    for n in order:
        # matmul(x, transpose(W)) of a 2-D weight -> transpose_rhs.
        if n.op == "matmul" and n.inputs[1].op == "transpose" and \
                len(n.inputs[1].shape) == 2 and n.inputs[1].attrs["permutation"] == [1, 0]:
            n.inputs[1] = n.inputs[1].inputs[0]
            n.attrs["transpose_rhs"] = True

    users, order = _users(root)
    for n in order:
        # reshape(matmul(reshape(X), W^T) [+ b]) back to X's leading dims -> a matmul of X.
        if n.op != "reshape":
            continue
        inner = n.inputs[0]
        bias = None
        if inner.op == "add" and inner.inputs[0].op == "matmul" and len(inner.inputs[1].shape) == 1:
            bias, mm = inner.inputs[1], inner.inputs[0]
        elif inner.op == "matmul":
            mm = inner
        else:
            continue
        flat = mm.inputs[0]
        if flat.op != "reshape" or len(mm.shape) != 2:
            continue
        x = flat.inputs[0]
        if x.shape[:-1] != n.shape[:-1] or len(mm.inputs[1].shape) != 2:
            continue
        if len(users.get(id(mm), [])) != 1 or (bias is not None and len(users.get(id(inner), [])) != 1):
            continue
        mm3 = _Node("matmul", [x, mm.inputs[1]], n.shape, n.dtype, mm.loc, **mm.attrs)
        mm3.aten = mm.aten
        if bias is not None:
            _replace(n, "add", [mm3, bias])
        else:
            _replace(n, "matmul", mm3.inputs, **mm.attrs)

    users, order = _users(root)
    for n in order:
        # reshape(matmul(reshape(A4), reshape(B4))) with the leading two dims merged and restored
        # -> a batched matmul of A4 and B4.
        if n.op == "reshape" and n.inputs[0].op == "matmul" and len(n.shape) == 4:
            mm = n.inputs[0]
            a, b = mm.inputs
            if a.op == "reshape" and b.op == "reshape" and len(a.inputs[0].shape) == 4 and \
                    len(b.inputs[0].shape) == 4 and a.inputs[0].shape[:2] == n.shape[:2] and \
                    b.inputs[0].shape[:2] == n.shape[:2]:
                _replace(n, "matmul", [a.inputs[0], b.inputs[0]], **mm.attrs)
    users, order = _users(root)
    for n in order:
        # matmul(a, transpose(b, last two)) of batched operands -> transpose_rhs.
        if n.op == "matmul" and n.inputs[1].op == "transpose" and len(n.inputs[1].shape) >= 3:
            r = len(n.inputs[1].shape)
            if n.inputs[1].attrs["permutation"] == list(range(r - 2)) + [r - 1, r - 2]:
                n.inputs[1] = n.inputs[1].inputs[0]
                n.attrs["transpose_rhs"] = not n.attrs.get("transpose_rhs", False)

    users, order = _users(root)
    for n in order:
        # softmax(masked_fill(matmul(q, k^T) * s, causal, -inf)) @ v -> causal_attention.
        if n.op != "matmul" or len(n.shape) != 4 or n.attrs.get("transpose_rhs") or \
                n.attrs.get("transpose_lhs"):
            continue
        p, v = n.inputs
        if p.op == "dropout" and p.inputs[0].op == "softmax":
            raise ImportError_(
                f"{module_path}:{p.loc}: dropout of attention probabilities (p={p.attrs['p']:g}) "
                "is not supported: ptc's causal attention is fused, its probabilities are never a "
                "tensor; set that dropout to 0 (dropout elsewhere imports)")
        if p.op != "softmax" or p.attrs["axis"] != 3:
            continue
        m = p.inputs[0]
        seq = n.shape[2]
        if m.op == "masked_fill" and m.attrs["value"] == float("-inf") and \
                _is_const(m.inputs[1]) and _causal(m.inputs[1], seq):
            s = m.inputs[0]
        elif m.op == "add" and _additive_causal(m.inputs[1], seq):
            s = m.inputs[0]  # Hugging Face's additive mask: scores + (0 | min) above the diagonal
        else:
            continue
        scale = 1.0
        while s.op == "scale":
            scale *= s.attrs["factor"]
            s = s.inputs[0]
        if s.op != "matmul" or not s.attrs.get("transpose_rhs") or s.attrs.get("transpose_lhs"):
            continue
        q, k = s.inputs
        k, v = _unrepeat(k), _unrepeat(v)
        if k.shape != v.shape:
            continue
        _replace(n, "causal_attention", [q, k, v], scale=scale)

    users, order = _users(root)
    for n in order:
        # nll(log_softmax(reshape(L)), reshape(T)) -> cross_entropy(L, T).
        if n.op == "nll":
            lsm, t = n.inputs
            if lsm.op == "log_softmax" and lsm.attrs["axis"] == len(lsm.shape) - 1:
                logits = _strip(lsm.inputs[0])
                targets = _strip(t)
                if logits.shape[:-1] == targets.shape:
                    _replace(n, "cross_entropy", [logits, targets])
        # w * (x * rsqrt(mean(x*x, -1, keep) + eps)) -> rms_norm(x, w, eps).
        if n.op == "mul":
            for w, y in (n.inputs, reversed(n.inputs)):
                if len(w.shape) != 1 or y.op != "mul":
                    continue
                for x, r in (y.inputs, list(reversed(y.inputs))):
                    if r.op != "rsqrt" or r.inputs[0].op != "add":
                        continue
                    mean, eps = r.inputs[0].inputs
                    if not _is_const(eps) or mean.op != "reduce_mean" or \
                            mean.attrs["axes"] != [len(x.shape) - 1] or not mean.attrs["keep_dims"]:
                        continue
                    sq = mean.inputs[0]
                    if sq.op == "mul" and sq.inputs[0] is x and sq.inputs[1] is x:
                        _replace(n, "rms_norm", [x, w], epsilon=float(eps.attrs["value"]))
                        break
                if n.op == "rms_norm":
                    break
        # (0.5 x) (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> gelu_tanh(x): minGPT's NewGELU,
        # Hugging Face's gelu_new written out (one op, and the MLP is tp-split as a GELU one).
        if n.op == "mul":
            x = _new_gelu_input(n)
            if x is not None:
                _replace(n, "gelu_tanh", [x])
        # x * cos + cat(-x[..., h:], x[..., :h]) * sin -> rotary(x, theta).
        if n.op == "add" and len(n.shape) == 4:
            a, b = n.inputs
            if a.op == "mul" and b.op == "mul":
                for (xa, cos), (rh, sin) in _pairs(a, b):
                    if not (_is_const(cos) and _is_const(sin)) or rh.op != "concat":
                        continue
                    x = xa
                    if not _is_rotate_half(rh, x):
                        continue
                    theta = _rotary_theta(cos, sin, x.shape[2], x.shape[3])
                    if theta is not None:
                        _replace(n, "rotary", [x], theta=theta)
                        break
        # embedding(table, 0..T-1) -> the table's first T rows.
        if n.op == "embedding" and _is_const(n.inputs[1]):
            ids = n.inputs[1].attrs["value"]
            t = n.inputs[0]
            if ids.dim() == 1 and bool((ids == torch.arange(len(ids))).all()):
                if len(ids) == t.shape[0]:
                    _replace(n, "identity", [t])
                else:
                    _replace(n, "slice", [t], offsets=[0, 0])


def _pairs(a, b):
    """(x, cos), (rotate_half, sin) assignments of two products."""
    out = []
    for x, c in (a.inputs, list(reversed(a.inputs))):
        for r, s in (b.inputs, list(reversed(b.inputs))):
            out.append(((x, c), (r, s)))
    for x, c in (b.inputs, list(reversed(b.inputs))):
        for r, s in (a.inputs, list(reversed(a.inputs))):
            out.append(((x, c), (r, s)))
    return out


def _is_rotate_half(cat, x):
    if len(cat.inputs) != 2 or cat.attrs["axis"] != len(x.shape) - 1:
        return False
    neg, first = cat.inputs
    half = x.shape[-1] // 2
    if neg.op != "scale" or neg.attrs["factor"] != -1.0:
        return False
    second = neg.inputs[0]
    return (second.op == "slice" and second.inputs[0] is x and second.attrs["offsets"][-1] == half
            and first.op == "slice" and first.inputs[0] is x and first.attrs["offsets"][-1] == 0
            and second.shape[-1] == half and first.shape[-1] == half)


def _unrepeat(k):
    """Keys / values repeated per query head (Hugging Face's repeat_kv: [b, kv, s, d] ->
    [b, kv, 1, s, d] -> expand [b, kv, n, s, d] -> [b, kv*n, s, d]) -> the kv heads."""
    if k.op == "reshape" and k.inputs[0].op == "broadcast":
        e = k.inputs[0]
        u = e.inputs[0]
        if u.op == "reshape" and len(u.shape) == 5 and u.shape[2] == 1:
            kv = u.inputs[0]
            if len(kv.shape) == 4 and e.shape[:2] == kv.shape[:2] and e.shape[3:] == kv.shape[2:]:
                return kv
    return k


# ---- phase 3: emission ------------------------------------------------------------------------
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
