"""PyTorch reference of ptc's standard model (nanoGPT's model.py) and its training loop.

Used by the parity test and the benchmark. Needs Debian's python3-torch (1.13, CPU)
and numpy; run with /usr/bin/python3.
"""
import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.heads = heads

    def forward(self, x, positions=None):
        B, S, H = x.shape
        q, k, v = self.c_attn(x).split(H, dim=2)
        q, k, v = (t.view(B, S, self.heads, H // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(S, S, dtype=torch.bool).tril() if positions is None \
            else document_mask(positions)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, S, H)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.c_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = SelfAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = Mlp(hidden)

    def forward(self, x, positions=None):
        x = x + self.attn(self.ln_1(x), positions)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, hidden),
            wpe=nn.Embedding(seq, hidden),
            h=nn.ModuleList([Block(hidden, heads) for _ in range(layers)]),
            ln_f=nn.LayerNorm(hidden, eps=1e-5),
        ))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            elif name.endswith(".weight") and p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets, positions=None):
        S = tokens.shape[1]
        x = self.transformer.wte(tokens) + self.transformer.wpe(
            torch.arange(S) if positions is None else positions)
        for block in self.transformer.h:
            x = block(x, positions)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def document_positions(tokens, eod):
    """Packed documents: each token's position in its document ([B, S] int64), a
    document starting at each window and after every `eod` token. Computed from
    document ids (a running count of the boundaries), not by ptc's loop."""
    B, S = tokens.shape
    starts = torch.zeros(B, S, dtype=torch.int64)
    starts[:, 1:] = (tokens[:, :-1] == eod).long()
    starts[:, 0] = 1
    doc = starts.cumsum(dim=1)  # document id per token
    index = torch.arange(S).expand(B, S)
    first = torch.full((B, int(doc.max()) + 1), S, dtype=torch.int64)
    first = first.scatter_reduce(1, doc, index, reduce="amin")
    return index - first.gather(1, doc)


def document_mask(positions):
    """The explicit [B, 1, S, S] mask: query i sees key j when both are in one
    document (equal document ids) and j <= i."""
    B, S = positions.shape
    doc = (positions == 0).long().cumsum(dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    return (same & torch.ones(S, S, dtype=torch.bool).tril())[:, None]


def batch(data, step, batch_size, seq):
    """Step k's global batch: window j starts at ((k*B + j) * S) mod (N - S - 1)."""
    span = len(data) - seq - 1
    rows = [((step * batch_size + j) * seq) % span for j in range(batch_size)]
    x = np.stack([data[s:s + seq] for s in rows]).astype(np.int64)
    y = np.stack([data[s + 1:s + seq + 1] for s in rows]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def make_optimizer(model, optimizer="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                   weight_decay=0.0, momentum=0.9, adafactor_beta1=0.0):
    """Weight decay on rank >= 2 parameters only, as ptc-optimizer does."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": other, "weight_decay": 0.0}]
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    if optimizer == "adafactor":
        import reference_adafactor
        return reference_adafactor.Adafactor(groups, lr=lr, beta1=adafactor_beta1)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def train(model, opt, data, steps, batch_size, seq, max_grad_norm=0.0, document_end=None):
    """With `document_end`, packed documents: the model takes their positions."""
    losses = []
    for step in range(steps):
        x, y = batch(data, step, batch_size, seq)
        if document_end is None:
            loss = model(x, y)
        else:
            loss = model(x, y, positions=document_positions(x, document_end))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        losses.append(loss.item())
    return losses


def state(model):
    """Parameters by ptc name (lm_head.weight is transformer.wte.weight)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if n != "lm_head.weight"}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().numpy().astype("<f4"))
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.from_numpy(
            np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"]).copy())
    return out
