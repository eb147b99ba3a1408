"""Phase 1 of the importer: an aten graph (make_fx) -> a small graph of ptc-level nodes
(`_Node`), one handler per aten op (`_HANDLERS`); what depends on neither parameters nor
inputs is computed with torch and kept as a constant.
"""
import os

import torch

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
