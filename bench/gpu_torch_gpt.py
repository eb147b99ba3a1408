"""PyTorch eager on the GPU, the reference of bench/gpu_check.sh: ptc's standard GPT
architecture (pre-LayerNorm blocks, exact GELU, tied embeddings, biases) at a given
size, bf16 autocast over fp32 master weights, causal scaled_dot_product_attention,
AdamW. Prints one JSON line: step seconds (median), tokens/s, MFU.

  python3 bench/gpu_torch_gpt.py --layers 24 --hidden 1024 --heads 16 --seq 1024 \
      --vocab 50257 --batch 8 --steps 10 --peak-tflops 989
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.attn_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)
        self.heads = heads

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(H, dim=2)
        q, k, v = (t.view(B, S, self.heads, H // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, S, H))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        S = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(S, device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 24), ("hidden", 1024), ("heads", 16), ("seq", 1024),
                          ("vocab", 50257), ("batch", 8), ("steps", 10), ("warmup", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=dev).manual_seed(0)
    tokens = torch.randint(0, 256, (a.batch, a.seq), device=dev, generator=g)
    targets = torch.randint(0, 256, (a.batch, a.seq), device=dev, generator=g)
    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    flops = common.model_flops(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab)
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "step_s": t,
                      "tokens_per_s": a.batch * a.seq / t,
                      "mfu": flops / t / (a.peak_tflops * 1e12), "loss": loss.item()}))


if __name__ == "__main__":
    main()
