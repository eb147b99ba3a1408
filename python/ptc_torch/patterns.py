"""Phase 2 of the importer: patterns in the node graph -> ptc's fused ops (linear layers,
causal attention with grouped-query heads, cross-entropy, RMS norm, rotary embeddings, position
tables, GELU's tanh form, dropout), so that an imported model is as fast and as shardable as a
builder model.
"""
import math

import torch

from ptc_torch.graph import ImportError_, _Node, _is_const


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
